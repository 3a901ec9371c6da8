"""What a user waits for: ggviz against llama.cpp, through each library's own llama.h API, alternating in one run.

    .venv/bin/python benchmarks/bench_user.py [--threads 2] [--reps 3] [--gen 64] [--prompt-long 128]

Measured for each library, the model already loaded (each library loads it once, outside the timings):

* time to first token: create a context (n_ctx 512), decode a 4-token prompt, sample the first token (greedy);
* 64 generated tokens, each decoded and sampled: with the greedy sampler, and with the common chain (top-k 40,
  top-p 0.95, min-p 0.05, temp 0.8, dist);
* a 128-token prompt in one batch, then 64 generated tokens (greedy): the prefill and decode rates.

The two libraries run rep by rep in turn (ggviz, llama.cpp, ggviz, ...) so that the machine's state is shared; the
median of the reps is printed with the ratio ggviz / llama.cpp (> 1: ggviz faster; for the first-token time, < 1).
llama.cpp is llama-cpp-python (``import llama_cpp``): the build it found is named; without it only ggviz's figures are
printed. It prints; it does not assert.
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
from ggviz.fetch import default_model_path  # noqa: E402

PROMPT4 = [504, 3575, 282, 4649]                  # "The capital of France" (SmolLM2's BPE)
COMMON = dict(top_k=40, top_p=0.95, min_p=0.05, temp=0.8, seed=1234)


class GGviz:
    name = "ggviz"

    def __init__(self, path, n_threads):
        self.model = llama.model_load_from_file(str(path), llama.model_default_params())
        self.n_threads = n_threads

    def new_ctx(self):
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = self.n_threads
        return llama.init_from_model(self.model, cp)

    def sampler(self, common: bool):
        ch = llama.sampler_chain_init()
        if common:
            for s in (llama.sampler_init_top_k(COMMON["top_k"]), llama.sampler_init_top_p(COMMON["top_p"], 1),
                      llama.sampler_init_min_p(COMMON["min_p"], 1), llama.sampler_init_temp(COMMON["temp"]),
                      llama.sampler_init_dist(COMMON["seed"])):
                llama.sampler_chain_add(ch, s)
        else:
            llama.sampler_chain_add(ch, llama.sampler_init_greedy())
        return ch

    def decode(self, ctx, toks):
        assert llama.decode(ctx, llama.batch_get_one(toks)) == 0

    def sample(self, smpl, ctx):
        return llama.sampler_sample(smpl, ctx, -1)

    def free(self, ctx, smpl=None):
        llama.free(ctx)


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path, n_threads):
        import llama_cpp as L
        self.L = L
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
        self.n_threads = n_threads
        self.build = f"llama-cpp-python {L.__version__} ({os.path.dirname(L.__file__)})"
        try:
            self.build += f"; system info: {L.llama_print_system_info().decode()[:160]}"
        except (AttributeError, UnicodeDecodeError):
            pass

    def new_ctx(self):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = 0
        return L.llama_init_from_model(self.model, cp)

    def sampler(self, common: bool):
        L = self.L
        ch = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if common:
            for s in (L.llama_sampler_init_top_k(COMMON["top_k"]), L.llama_sampler_init_top_p(COMMON["top_p"], 1),
                      L.llama_sampler_init_min_p(COMMON["min_p"], 1), L.llama_sampler_init_temp(COMMON["temp"]),
                      L.llama_sampler_init_dist(COMMON["seed"])):
                L.llama_sampler_chain_add(ch, s)
        else:
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_greedy())
        return ch

    def decode(self, ctx, toks):
        arr = (self.L.llama_token * len(toks))(*toks)
        assert self.L.llama_decode(ctx, self.L.llama_batch_get_one(arr, len(toks))) == 0

    def sample(self, smpl, ctx):
        return int(self.L.llama_sampler_sample(smpl, ctx, -1))

    def free(self, ctx, smpl=None):
        if smpl is not None:
            self.L.llama_sampler_free(smpl)
        self.L.llama_free(ctx)


def first_token(lib) -> float:
    smpl = lib.sampler(False)
    t0 = time.perf_counter()
    ctx = lib.new_ctx()
    lib.decode(ctx, PROMPT4)
    lib.sample(smpl, ctx)
    dt = time.perf_counter() - t0
    lib.free(ctx, smpl)
    return dt * 1e3


def generate(lib, common: bool, n_gen: int, prompt) -> tuple[float, float]:
    """(prompt ms, generation tok/s) for a prompt then ``n_gen`` decode+sample steps."""
    smpl = lib.sampler(common)
    ctx = lib.new_ctx()
    t0 = time.perf_counter()
    lib.decode(ctx, prompt)
    tok = lib.sample(smpl, ctx)
    t1 = time.perf_counter()
    for _ in range(n_gen):
        lib.decode(ctx, [tok])
        tok = lib.sample(smpl, ctx)
    t2 = time.perf_counter()
    lib.free(ctx, smpl)
    return (t1 - t0) * 1e3, n_gen / (t2 - t1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--prompt-long", type=int, default=128)
    ap.add_argument("--model", default=None)
    a = ap.parse_args(argv)
    path = a.model or default_model_path()
    libs = [GGviz(path, a.threads)]
    try:
        libs.append(LlamaCpp(path, a.threads))
        print(f"llama.cpp: {libs[1].build}")
    except ImportError as e:
        print(f"llama.cpp: not importable ({e}); ggviz alone")
    rng = np.random.default_rng(0)
    long_prompt = [int(t) for t in rng.integers(200, 40000, a.prompt_long)]
    for lib in libs:                                       # warm: kernels, caches, first allocations
        generate(lib, False, 4, PROMPT4)
    res = {lib.name: {k: [] for k in ("ttft_ms", "greedy", "common", "prefill", "decode")} for lib in libs}
    for _ in range(a.reps):
        for lib in libs:
            r = res[lib.name]
            r["ttft_ms"].append(first_token(lib))
            r["greedy"].append(generate(lib, False, a.gen, PROMPT4)[1])
            r["common"].append(generate(lib, True, a.gen, PROMPT4)[1])
            pms, dec = generate(lib, False, a.gen, long_prompt)
            r["prefill"].append(a.prompt_long / pms * 1e3)
            r["decode"].append(dec)
    rows = [("first token (ctx + 4-token prompt + sample), ms", "ttft_ms", True),
            (f"{a.gen} tokens greedy, tok/s", "greedy", False),
            (f"{a.gen} tokens, common chain, tok/s", "common", False),
            (f"prefill of {a.prompt_long} tokens, tok/s", "prefill", False),
            (f"decode after it ({a.gen} tokens), tok/s", "decode", False)]
    print(f"\n{a.threads} thread(s), median of {a.reps} alternating reps")
    head = f"{'':52s}" + "".join(f"{lib.name:>12s}" for lib in libs) + ("   ggviz/llama.cpp" if len(libs) > 1 else "")
    print(head)
    for label, key, lower_better in rows:
        med = [statistics.median(res[lib.name][key]) for lib in libs]
        line = f"{label:52s}" + "".join(f"{m:12.1f}" for m in med)
        if len(med) > 1:
            line += f"   x{med[0] / med[1]:.2f}" + (" (lower is better)" if lower_better else "")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
