"""Flash attention on (both libraries' default context params): decode and a 128-token prefill, ggviz against
llama.cpp, alternating in one run.

    .venv/bin/python benchmarks/bench_flash_attn.py [--threads 2] [--reps 5] [--n 128] [--gen 32] [--model PATH]

For each library (the model loaded once), each rep: a new context (n_ctx 512, n_batch = n_ubatch 512,
``flash_attn_type`` left at AUTO, which both resolve to FLASH_ATTN_EXT on the CPU) prefills the prompt in one batch
(timed: "prefill"), then decodes ``--gen`` tokens one per llama_decode (timed: "decode"). The two libraries run rep by
rep in turn; the medians and the ratio ggviz / llama.cpp (> 1: ggviz faster) are printed. It prints; it does not
assert.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from ggviz import llama  # noqa: E402
from ggviz.fetch import default_model_path  # noqa: E402


def _ggviz(path, nth):
    model = llama.model_load_from_file(str(path), llama.model_default_params())

    def run(ids, n_gen):
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = nth
        ctx = llama.init_from_model(model, cp)
        assert ctx.flash_attn
        t0 = time.perf_counter()
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        t1 = time.perf_counter()
        tok = int(np.argmax(llama.get_logits_ith(ctx, -1)))
        for _ in range(n_gen):
            assert llama.decode(ctx, llama.batch_get_one([tok])) == 0
            tok = int(np.argmax(llama.get_logits_ith(ctx, -1)))
        t2 = time.perf_counter()
        llama.free(ctx)
        return t1 - t0, t2 - t1
    return run


def _llamacpp(path, nth):
    import llama_cpp as L
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

    def dec(ctx, toks):
        arr = (L.llama_token * len(toks))(*toks)
        assert L.llama_decode(ctx, L.llama_batch_get_one(arr, len(toks))) == 0
        return int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(nv,))))

    def run(ids, n_gen):
        cp = L.llama_context_default_params()          # flash_attn_type: AUTO, its default
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = nth
        ctx = L.llama_init_from_model(model, cp)
        t0 = time.perf_counter()
        tok = dec(ctx, ids)
        t1 = time.perf_counter()
        for _ in range(n_gen):
            tok = dec(ctx, [tok])
        t2 = time.perf_counter()
        L.llama_free(ctx)
        return t1 - t0, t2 - t1
    return run, f"llama-cpp-python {L.__version__}: {L.llama_print_system_info().decode()[:120]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=128, help="prompt tokens (<= 400)")
    ap.add_argument("--gen", type=int, default=32, help="tokens decoded one by one after the prompt")
    ap.add_argument("--model", default=None, help="GGUF path (default: SmolLM2)")
    a = ap.parse_args(argv)
    path = a.model or default_model_path()
    ids = [(17 * i + 100) % 40000 + 200 for i in range(a.n)]
    g = _ggviz(path, a.threads)
    try:
        c, build = _llamacpp(path, a.threads)
    except ImportError:
        c, build = None, "llama.cpp: not importable"
    g(ids, 2)                                   # the compiled kernels' first use, the graphs' first builds
    if c is not None:
        c(ids, 2)
    res = {"ggviz": [], "llama.cpp": []}
    for _ in range(a.reps):
        res["ggviz"].append(g(ids, a.gen))
        if c is not None:
            res["llama.cpp"].append(c(ids, a.gen))
    print(f"ggviz at {ROOT}; {build}; flash attention on (default params); {a.threads} threads, "
          f"{a.n}-token prompt, {a.gen} decoded tokens, median of {a.reps}")
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in res.items() if v}
    for i, (what, n) in enumerate((("prefill", a.n), ("decode", a.gen))):
        line = f"  {what}: ggviz {n / med['ggviz'][i]:7.1f} tok/s"
        if "llama.cpp" in med:
            line += (f", llama.cpp {n / med['llama.cpp'][i]:7.1f} tok/s, "
                     f"ratio ggviz/llama.cpp x{med['llama.cpp'][i] / med['ggviz'][i]:.2f}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
