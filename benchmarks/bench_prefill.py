"""Prefill speed: a 128-token prompt in one batch, ggviz against llama.cpp, alternating in one run.

    .venv/bin/python benchmarks/bench_prefill.py [--threads 2] [--reps 5] [--n 128] [--model gemma3-270m]
                                                 [--flash-attn off|on|auto] [--profile] [--no-llama]

For each library (the model loaded once): a new context (n_ctx 512, n_batch = n_ubatch 512, the same
flash_attn_type for both: auto, llama.cpp's default, unless ``--flash-attn`` says otherwise) decodes the prompt
("cold": graph build, split, allocation included), then its KV cache is cleared and the same prompt is decoded again
("warm": the steady state). The two run rep by rep in turn; the medians and the ratio ggviz / llama.cpp (> 1: ggviz
faster) are printed, with the tok/s. Run from another checkout (``python OTHER/benchmarks/bench_prefill.py``) to
measure that checkout's ggviz against the same llama.cpp: the ratios of two runs compare the two versions. It prints;
it does not assert.

``--profile`` then prints where ggviz's cold prefill goes (graph build, scheduler split + allocation, compiled
program build, compute: ``cold_parts``) and where its warm prefill goes: the compiled walk's per-row
timestamp-counter ticks of thread 0 (``FastGraph.set_profiling``; a row's time includes its wait in the barrier after it, so a row whose work
is badly split shows as long), summed by op and, for MUL_MAT, by weight type and shape, beside the wall time of the
whole ``llama_decode`` (the rest is Python around the walk). The compiled walk's one-thread fallback under
contention is switched off for it, so ``--threads 2`` profiles two threads. The main table says how many threads
ggviz's warm prefills really ran on (FastGraph's fallback drops a contended graph to one thread).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ggviz import llama  # noqa: E402
from ggviz.fetch import default_model_path, model_path  # noqa: E402


FA = {"off": 0, "on": 1, "auto": -1}       # llama_flash_attn_type


def _ggviz(path, nth, fa):
    model = llama.model_load_from_file(str(path), llama.model_default_params())
    from ggviz.ggml.cpu.fast import compiler
    plan_graph = compiler.plan_graph
    last = []                                   # the compiled program of the graph computed last

    def spy(cgraph, n):
        last[:] = [plan_graph(cgraph, n)]
        return last[0]
    compiler.plan_graph = spy

    def run(ids):
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = nth
        cp.flash_attn_type = fa
        ctx = llama.init_from_model(model, cp)
        t0 = time.perf_counter()
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        t1 = time.perf_counter()
        ctx.memory_clear()
        t2 = time.perf_counter()
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        t3 = time.perf_counter()
        fg = last[0] if last else None
        used.append(fg.n_use_now if fg is not None else None)
        return t1 - t0, t3 - t2
    used = []                                   # threads the warm prefill's compiled walk ran on, per rep
    run.used = used
    return run


def _llamacpp(path, nth, fa):
    import llama_cpp as L
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())

    def run(ids):
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = nth
        cp.flash_attn_type = fa
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


TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 8: "q8_0", 12: "q4_K", 14: "q6_K"}


def profile(path, nth, ids, fa, reps=5):
    """ggviz's warm prefill per op (thread 0's ticks of the compiled walk), mean of ``reps`` computes."""
    import collections

    import numpy as np

    from ggviz.ggml.cpu.fast import compiler
    from ggviz.ggml.cpu.fast.kernels import time_ns
    from ggviz.ggml.cpu.fast.program import MMQ_TYPE, OP, OP_MUL_MAT_Q, S0, NE0, NE1, S1
    c0, w0 = time_ns(), time.perf_counter()           # the timestamp counter's rate (ticks per second)
    time.sleep(0.1)
    rate = (time_ns() - c0) / (time.perf_counter() - w0)
    model = llama.model_load_from_file(str(path), llama.model_default_params())
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
    cp.n_threads = cp.n_threads_batch = nth
    cp.flash_attn_type = fa
    ctx = llama.init_from_model(model, cp)
    seen = []
    plan_graph = compiler.plan_graph
    compiler.plan_graph = lambda cgraph, n: seen.append(plan_graph(cgraph, n)) or seen[-1]
    try:
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
    finally:
        compiler.plan_graph = plan_graph
    fg = seen[-1] if seen else None
    if fg is None:
        print("the prefill graph did not take the compiled walk: no profile")
        return
    cold = cold_parts(model, cp, ids)
    fg.CONTENDED = float("inf")                       # profile nth threads, whatever the machine's load
    fg.n_next = 1 << 30
    fg.set_profiling(True)
    wall = 0.0
    for _ in range(reps):
        ctx.memory_clear()
        t0 = time.perf_counter()
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        wall += time.perf_counter() - t0
    ticks = fg.timings.astype(np.float64) / reps / rate * 1e3          # ms per compute
    fg.set_profiling(False)
    groups = collections.Counter()
    count = collections.Counter()
    for k in range(len(fg)):
        op = fg.meta[k][1].split()[0] if fg.meta[k][1] else "?"
        if op == "MUL_MAT":
            if fg.P[k, OP] == OP_MUL_MAT_Q:
                op += (f" {TYPE_NAMES.get(int(fg.P[k, MMQ_TYPE]), str(int(fg.P[k, MMQ_TYPE])))} "
                       f"{int(fg.P[k, S0 + NE0])}x{int(fg.P[k, S0 + NE1])} by {int(fg.P[k, S1 + NE1])}")
            else:
                op += " f16/f32 (KQ, KQV)"
        groups[op] += ticks[k]
        count[op] += 1
    total = ticks.sum()
    print(f"\nggviz warm prefill of {len(ids)} tokens, {nth} thread(s), {len(fg)} program rows, mean of {reps}: "
          f"{wall / reps * 1e3:.1f} ms per llama_decode, of which the compiled walk (thread 0) {total:.1f} ms")
    print(f"{'op':44s} {'rows':>5s} {'share':>7s} {'ms':>8s}")
    for op, v in groups.most_common():
        print(f"{op:44s} {count[op]:5d} {v / total * 100:6.2f}% {v:8.2f}")
    whole = cold.pop("llama_decode")
    print(f"\nggviz cold prefill (the first llama_decode of a second new context): {whole * 1e3:.1f} ms, of which")
    for what, v in cold.items():
        print(f"  {what:58s} {v * 1e3:8.1f} ms")
    print(f"  {'the rest (ubatch split, KV cache slots, inputs, outputs)':58s} "
          f"{(whole - sum(cold.values())) * 1e3:8.1f} ms")


def cold_parts(model, cp, ids):
    """Where a new context's first prefill goes: a second context of the same params (the process's first-use
    costs already paid, as in the main table's cold column) decodes ``ids`` once with its graph build, scheduler
    split + allocation, compiled program build and the compute (ggml_graph_plan and the walk) timed apart."""
    from ggviz.ggml.cpu.fast import compiler
    from ggviz.llama import context as lc
    parts = {"graph build (build_graph / _derive_graph)": 0.0,
             "scheduler split + allocation (_allocate)": 0.0,
             "compiled program build (fast plan_graph)": 0.0,
             "compute (graph_plan, the walk; less the program build)": 0.0}
    keys = list(parts)
    saved = []

    def wrap(owner, name, key):
        f = getattr(owner, name)
        saved.append((owner, name, f))

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                parts[key] += time.perf_counter() - t
                if name == "plan_graph":        # inside _compute: not compute time
                    parts[keys[3]] -= time.perf_counter() - t
        setattr(owner, name, timed)

    ctx = llama.init_from_model(model, cp)      # its reserve's graph builds are not the decode's
    wrap(lc.LlamaContext, "build_graph", keys[0])
    wrap(lc.LlamaContext, "_derive_graph", keys[0])
    wrap(lc.LlamaContext, "_allocate", keys[1])
    wrap(lc.LlamaContext, "_compute", keys[3])
    wrap(compiler, "plan_graph", keys[2])
    try:
        t0 = time.perf_counter()
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        parts["llama_decode"] = time.perf_counter() - t0
    finally:
        for owner, name, f in reversed(saved):
            setattr(owner, name, f)
    return parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=128, help="prompt tokens (<= 500)")
    ap.add_argument("--model", default=None, help="a registry name (ggviz fetch --list) or a GGUF path; "
                    "default: the default model")
    ap.add_argument("--flash-attn", choices=sorted(FA), default="auto",
                    help="flash_attn_type of both libraries' contexts (default auto: what a user gets)")
    ap.add_argument("--profile", action="store_true", help="then ggviz's warm prefill per op (see above)")
    ap.add_argument("--no-llama", action="store_true", help="ggviz only (with --profile: the profile only)")
    a = ap.parse_args(argv)
    path = default_model_path() if a.model is None else (
        pathlib.Path(a.model) if a.model.endswith(".gguf") else model_path(a.model))
    if not path.exists():
        print(f"{path} is absent (ggviz fetch): nothing to measure")
        return 0
    ids = [(17 * i + 100) % 40000 + 200 for i in range(a.n)]
    if a.no_llama and a.profile:
        profile(path, a.threads, ids, FA[a.flash_attn])
        return 0
    g = _ggviz(path, a.threads, FA[a.flash_attn])
    try:
        if a.no_llama:
            raise ImportError
        c, build = _llamacpp(path, a.threads, FA[a.flash_attn])
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
    print(f"ggviz at {ROOT}; {path.name}; {build}; {a.threads} threads, {a.n}-token prompt, "
          f"flash attention {a.flash_attn}, median of {a.reps}")
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in res.items() if v}
    for i, what in enumerate(("cold (new context)", "warm (KV cleared)")):
        line = f"  prefill {what}: ggviz {a.n / med['ggviz'][i]:7.1f} tok/s"
        if "llama.cpp" in med:
            line += (f", llama.cpp {a.n / med['llama.cpp'][i]:7.1f} tok/s, "
                     f"ratio ggviz/llama.cpp x{med['llama.cpp'][i] / med['ggviz'][i]:.2f}")
        print(line)
    used = g.used[-a.reps:]
    line = f"  ggviz's warm prefill ran its compiled walk on {'/'.join(str(u) for u in used)} thread(s) in the {a.reps} reps"
    if any(u is not None and u < a.threads for u in used):
        line += f" (fewer than {a.threads}: its one-thread fallback judged the machine contended)"
    print(line)
    if a.profile:
        profile(path, a.threads, ids, FA[a.flash_attn])
    return 0


if __name__ == "__main__":
    sys.exit(main())
