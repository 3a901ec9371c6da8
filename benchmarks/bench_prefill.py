"""Prefill speed: a 128-token prompt in one batch, ggviz against llama.cpp, alternating in one run.

    .venv/bin/python benchmarks/bench_prefill.py [--threads 2] [--reps 5] [--n 128]

For each library (the model loaded once): a new context (n_ctx 512, n_batch = n_ubatch 512) decodes the prompt
("cold": graph build, split, allocation included), then its KV cache is cleared and the same prompt is decoded again
("warm": the steady state). The two run rep by rep in turn; the medians and the ratio ggviz / llama.cpp (> 1: ggviz
faster) are printed, with the tok/s. Run from another checkout (``python OTHER/benchmarks/bench_prefill.py``) to
measure that checkout's ggviz against the same llama.cpp: the ratios of two runs compare the two versions. It prints;
it does not assert.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ggviz import llama  # noqa: E402
from ggviz.fetch import default_model_path  # noqa: E402


def _ggviz(path, nth):
    model = llama.model_load_from_file(str(path), llama.model_default_params())

    def run(ids):
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = nth
        ctx = llama.init_from_model(model, cp)
        t0 = time.perf_counter()
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        t1 = time.perf_counter()
        ctx.memory_clear()
        t2 = time.perf_counter()
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        return t1 - t0, time.perf_counter() - t2
    return run


def _llamacpp(path, nth):
    import llama_cpp as L
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())

    def run(ids):
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = nth
        cp.flash_attn_type = 0
        ctx = L.llama_init_from_model(model, cp)
        arr = (L.llama_token * len(ids))(*ids)
        t0 = time.perf_counter()
        assert L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) == 0
        t1 = time.perf_counter()
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t2 = time.perf_counter()
        assert L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) == 0
        t3 = time.perf_counter()
        L.llama_free(ctx)
        return t1 - t0, t3 - t2
    return run, f"llama-cpp-python {L.__version__}: {L.llama_print_system_info().decode()[:120]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=128, help="prompt tokens (<= 500)")
    a = ap.parse_args(argv)
    path = default_model_path()
    ids = [(17 * i + 100) % 40000 + 200 for i in range(a.n)]
    g = _ggviz(path, a.threads)
    try:
        c, build = _llamacpp(path, a.threads)
    except ImportError:
        c, build = None, "llama.cpp: not importable"
    g(ids)                                      # the compiled kernels' first use, the graph's first build
    if c is not None:
        c(ids)
    res = {"ggviz": [], "llama.cpp": []}
    for _ in range(a.reps):
        res["ggviz"].append(g(ids))
        if c is not None:
            res["llama.cpp"].append(c(ids))
    print(f"ggviz at {ROOT}; {build}; {a.threads} threads, {a.n}-token prompt, median of {a.reps}")
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in res.items() if v}
    for i, what in enumerate(("cold (new context)", "warm (KV cleared)")):
        line = f"  prefill {what}: ggviz {a.n / med['ggviz'][i]:7.1f} tok/s"
        if "llama.cpp" in med:
            line += (f", llama.cpp {a.n / med['llama.cpp'][i]:7.1f} tok/s, "
                     f"ratio ggviz/llama.cpp x{med['llama.cpp'][i] / med['ggviz'][i]:.2f}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
