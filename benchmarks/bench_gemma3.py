"""Gemma-3 270M decode and prefill rates: ggviz against llama.cpp (AVX2 llama-cpp-python), alternating in one run.

    .venv/bin/python benchmarks/bench_gemma3.py [--threads 2] [--reps 3] [--decode 32] [--prefill 32] [--no-profile]

Each library loads gemma-3-270m-q4_k_m.gguf once. Per rep, the same for both (``timed_rep``): a fresh context (n_ctx
1024, flash attention off); the ``--prefill``-token prompt in one batch (cold: ggviz compiles the context's new
prefill graph into a program here, once per context); the memory cleared and the prompt again (the prefill rate);
one decode (the first: ggviz compiles the decode graph); then ``--decode`` tokens one per ``llama_decode`` (the
decode rate). Like llama-bench's warm-up run, the two one-time costs are left out of the rates and printed beside
them (cold prefill s, first decode s). The tokens are the reference text's ids (tests/data/gemma3, 90 of them), so
no tokenizer is needed. The libraries run rep by rep in turn; the medians are printed with the ratio ggviz /
llama.cpp (> 1: ggviz faster).

Then (unless ``--no-profile``) ggviz's decode step profiled on the compiled walk (``FastGraph.set_profiling``: the
timestamp-counter ticks of thread 0 per program row), summed by op and, for MUL_MAT, by weight type, as shares of
the step, with the ms per token they come to. (llama.cpp's own per-op times are not available from its library:
compare its kernels with benchmarks/bench_kquants.py.) It prints; it does not assert. Without the model file it says
so and exits 0.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ggviz import llama  # noqa: E402

MODEL = os.path.join(ROOT, "data", "models", "gemma-3-270m-q4_k_m.gguf")
IDS = [int(x) for x in np.load(os.path.join(ROOT, "tests", "data", "gemma3", "gemma3_tf_seq1_compact.npz"))["ids"]]


def timed_rep(decode, clear, n_prefill, n_decode):
    """One rep on a fresh context, the same for both libraries: the prompt in one batch on the new context (cold:
    ggviz compiles the new graph into a program here), the memory cleared and the prompt again (the prefill rate),
    one decode (the first: ggviz compiles the decode graph), then n_decode decodes (the decode rate). Returns
    (prefill tok/s, decode tok/s, cold prefill s, first decode s). The warm-up runs mirror llama-bench's."""
    t0 = time.perf_counter()
    assert decode(IDS[:n_prefill]) == 0
    t1 = time.perf_counter()
    clear()
    t2 = time.perf_counter()
    assert decode(IDS[:n_prefill]) == 0
    t3 = time.perf_counter()
    assert decode([IDS[n_prefill]]) == 0
    t4 = time.perf_counter()
    for t in IDS[n_prefill + 1:n_prefill + 1 + n_decode]:
        assert decode([t]) == 0
    t5 = time.perf_counter()
    return n_prefill / (t3 - t2), n_decode / (t5 - t4), t1 - t0, t4 - t3


class GGviz:
    name = "ggviz"

    def __init__(self, n_threads):
        self.model = llama.model_load_from_file(MODEL, llama.model_default_params())
        self.n_threads = n_threads

    def run(self, n_prefill, n_decode):
        cp = llama.context_default_params()
        cp.n_ctx = 1024
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = llama.init_from_model(self.model, cp)
        return timed_rep(lambda toks: llama.decode(ctx, llama.batch_get_one(toks)),
                         lambda: llama.memory_clear(llama.get_memory(ctx), True), n_prefill, n_decode)


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, n_threads):
        import llama_cpp as L
        self.L = L
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(MODEL.encode(), L.llama_model_default_params())
        self.n_threads = n_threads

    def _decode(self, ctx, toks):
        L = self.L
        arr = (L.llama_token * len(toks))(*toks)
        return L.llama_decode(ctx, L.llama_batch_get_one(arr, len(toks)))

    def run(self, n_prefill, n_decode):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = 1024
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(self.model, cp)
        try:
            return timed_rep(lambda toks: self._decode(ctx, toks),
                             lambda: L.llama_memory_clear(L.llama_get_memory(ctx), True), n_prefill, n_decode)
        finally:
            L.llama_free(ctx)


TYPE_NAMES = {0: "f32", 1: "f16", 6: "q5_0", 8: "q8_0", 12: "q4_K", 14: "q6_K"}


def profile(model, n_threads, n_prefill, n_steps=8):
    """ggviz's decode step per op (thread 0's ticks), averaged over n_steps decodes after an n_prefill prompt."""
    from ggviz.ggml.cpu.fast import compiler
    from ggviz.ggml.cpu.fast.kernels import time_ns
    from ggviz.ggml.cpu.fast.program import MMQ_TYPE, OP, OP_MUL_MAT_Q
    c0, w0 = time_ns(), time.perf_counter()           # the timestamp counter's rate (ticks per second)
    time.sleep(0.1)
    rate = (time_ns() - c0) / (time.perf_counter() - w0)
    cp = llama.context_default_params()
    cp.n_ctx = 1024
    cp.n_threads = cp.n_threads_batch = n_threads
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama.init_from_model(model, cp)
    assert llama.decode(ctx, llama.batch_get_one(IDS[:n_prefill])) == 0
    seen = []                                         # the program the executor gets for the decode graph
    plan_graph = compiler.plan_graph
    compiler.plan_graph = lambda cgraph, n: seen.append(plan_graph(cgraph, n)) or seen[-1]
    try:
        assert llama.decode(ctx, llama.batch_get_one([IDS[n_prefill]])) == 0
    finally:
        compiler.plan_graph = plan_graph
    fg = seen[-1] if seen else None
    if fg is None:
        print("the decode graph did not take the compiled walk: no profile")
        return
    fg.set_profiling(True)
    t0 = time.perf_counter()
    for t in IDS[n_prefill + 1:n_prefill + 1 + n_steps]:
        assert llama.decode(ctx, llama.batch_get_one([t])) == 0
    wall = (time.perf_counter() - t0) / n_steps
    ticks = fg.timings.astype(np.float64)
    fg.set_profiling(False)
    total = ticks.sum()
    groups = collections.Counter()
    for k in range(len(fg)):
        op = fg.meta[k][1].split()[0] if fg.meta[k][1] else "?"
        if op == "MUL_MAT":
            if fg.P[k, OP] == OP_MUL_MAT_Q:
                op += " " + TYPE_NAMES.get(int(fg.P[k, MMQ_TYPE]), str(int(fg.P[k, MMQ_TYPE])))
            else:
                op += " f16/f32 (KQ, KQV)"
            if fg.names[k] == "result_output":
                op += " (output, 262144 rows)"
        groups[op] += ticks[k]
    walk = total / n_steps / rate
    print(f"\nggviz decode step, {n_threads} thread(s), {len(fg)} program rows, mean of {n_steps} steps: "
          f"{wall * 1e3:.2f} ms per token, of which the compiled walk (thread 0) {walk * 1e3:.2f} ms")
    print(f"{'op':38s} {'share':>7s} {'ms/token':>9s}")
    for op, v in groups.most_common():
        print(f"{op:38s} {v / total * 100:6.2f}% {v / n_steps / rate * 1e3:9.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=32)
    ap.add_argument("--no-profile", action="store_true", help="skip the per-op profile of ggviz's decode step")
    a = ap.parse_args(argv)
    if not os.path.exists(MODEL):
        print(f"{MODEL} is absent (ggviz fetch gemma3-270m): nothing to measure")
        return 0
    if a.prefill + 1 + a.decode > len(IDS):
        print(f"--prefill + --decode must be < {len(IDS)}")
        return 2
    libs = [GGviz(a.threads)]
    try:
        libs.append(LlamaCpp(a.threads))
        os.environ.setdefault("LLAMA_LOG_LEVEL", "0")
    except ImportError:
        print("llama_cpp not importable: ggviz's figures only")
    res = {lib.name: [] for lib in libs}
    for _ in range(a.reps):
        for lib in libs:
            res[lib.name].append(lib.run(a.prefill, a.decode))
    med = {k: [statistics.median(r[i] for r in v) for i in range(4)] for k, v in res.items()}
    print(f"Gemma-3 270M Q4_K_M, {a.threads} threads, median of {a.reps} alternating reps, prompt {a.prefill} tokens, "
          f"{a.decode} decodes")
    print(f"{'':12s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'cold prefill s':>15s} {'first decode s':>15s}")
    for k, (pp, tg, c0, c1) in med.items():
        print(f"{k:12s} {pp:14.2f} {tg:13.2f} {c0:15.3f} {c1:15.3f}")
    if len(med) == 2:
        g, ll = med["ggviz"], med["llama.cpp"]
        print(f"{'ggviz/llama':12s} {g[0] / ll[0]:14.3f} {g[1] / ll[1]:13.3f}   (rates: > 1 = ggviz faster)")
    if not a.no_profile and a.prefill + 9 <= len(IDS):
        profile(libs[0].model, a.threads, a.prefill)
    return 0


if __name__ == "__main__":
    sys.exit(main())
