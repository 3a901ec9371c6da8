"""Gemma-3 270M decode and prefill rates: ggviz against llama.cpp (AVX2 llama-cpp-python), alternating in one run.

    .venv/bin/python benchmarks/bench_gemma3.py [--threads 2] [--reps 2] [--decode 8] [--prefill 32]

Each library loads gemma-3-270m-q4_k_m.gguf once. Per rep: a fresh context (n_ctx 1024, flash attention off), a
``--prefill``-token prompt in one batch (the prefill rate), then ``--decode`` tokens one per ``llama_decode`` (the
decode rate); the tokens are the reference text's ids (tests/data/gemma3), so no tokenizer is needed. The libraries
run rep by rep in turn; the medians are printed with the ratio ggviz / llama.cpp (> 1: ggviz faster). It prints; it
does not assert. Without the model file it says so and exits 0.
"""
from __future__ import annotations

import argparse
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
        t0 = time.perf_counter()
        assert llama.decode(ctx, llama.batch_get_one(IDS[:n_prefill])) == 0
        t1 = time.perf_counter()
        for t in IDS[n_prefill:n_prefill + n_decode]:
            assert llama.decode(ctx, llama.batch_get_one([t])) == 0
        t2 = time.perf_counter()
        return n_prefill / (t1 - t0), n_decode / (t2 - t1)


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
        assert L.llama_decode(ctx, L.llama_batch_get_one(arr, len(toks))) == 0

    def run(self, n_prefill, n_decode):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = 1024
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(self.model, cp)
        try:
            t0 = time.perf_counter()
            self._decode(ctx, IDS[:n_prefill])
            t1 = time.perf_counter()
            for t in IDS[n_prefill:n_prefill + n_decode]:
                self._decode(ctx, [t])
            t2 = time.perf_counter()
        finally:
            L.llama_free(ctx)
        return n_prefill / (t1 - t0), n_decode / (t2 - t1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=32)
    a = ap.parse_args(argv)
    if not os.path.exists(MODEL):
        print(f"{MODEL} is absent (ggviz fetch gemma3-270m): nothing to measure")
        return 0
    if a.prefill + a.decode > len(IDS):
        print(f"--prefill + --decode must be <= {len(IDS)}")
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
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in res.items()}
    print(f"Gemma-3 270M Q4_K_M, {a.threads} threads, median of {a.reps} alternating reps")
    print(f"{'':12s} {'prefill tok/s':>14s} {'decode tok/s':>13s}")
    for k, (pp, tg) in med.items():
        print(f"{k:12s} {pp:14.2f} {tg:13.2f}")
    if len(med) == 2:
        (pg, tgg), (pl, tgl) = med["ggviz"], med["llama.cpp"]
        print(f"{'ggviz/llama':12s} {pg / pl:14.3f} {tgg / tgl:13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
