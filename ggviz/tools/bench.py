"""ggviz bench: what a user waits for, ggviz beside llama.cpp.

    python -m ggviz bench                 # or: ggviz bench [--threads 2] [--decode 64] [--prefill 128] [--reps 3]
    ggviz bench --llama-bench -p 512 -n 128 -r 5    # llama-bench's flow instead (ggviz/tools/llama_bench.py)

**Default: what a user gets**, through each library's own llama.h API (ggviz's ``ggviz.llama``; llama.cpp's through
``llama_cpp``, llama-cpp-python, when it can be imported -- the build it found is named with its system info), the
model loaded once by each, in one process, the two libraries alternating rep by rep (ggviz, llama.cpp, ggviz ...):

* first token: create a context (n_ctx 512), decode a 4-token prompt, sample (greedy) -- each part timed, the
  context freed after (``llama_free``; ggviz hands its machinery to the next context of the same shape);
* ``--decode`` tokens generated (decode + sample), with the greedy sampler and with the common chain (top-k 40,
  top-p 0.95, min-p 0.05, temp 0.8, dist);
* a ``--prefill``-token prompt in one batch, then ``--decode`` greedy tokens: the prefill and decode rates;
* ggviz's cost of a change of batch shape (prefill -> decode, the graph not cached): a profile of the decode step
  (graph build, scheduler split, allocation, plan + compile, compute), and the same switch with the graph cached.

**Then what a newcomer meets first** (``oneshot_bench``; ``--no-oneshot`` skips it), each library in fresh Python
processes, alternating rep by rep (``ggviz/tools/oneshot_child.py`` is the process):

* the one-shot ``ggviz run -p "The capital of France is" -n 32`` (its whole process, wall) beside the same run
  through llama-cpp-python in a fresh process (the texts are compared), with a profile of both by phase (imports,
  model load, context creation, prompt, first step, the other steps);
* the first context of a loaded model (context n_ctx 512 + the 4-token prompt + the first sample);
* the first decode step after a 128-token prompt (a new batch shape) beside a steady step, twice: in a fresh
  process (load, context, the prompt, the step: the user's case, no 1-token graph built before) and in the
  process that has just run the first context (a 4-token prompt's graphs exist);
* ggviz's part of each phase that is Numba's first use in the process: the ms spent holding its compiler lock
  (its CPU target set up, then the kernels' machine code loaded from the on-disk cache) and how many dispatchers
  were loaded or compiled (counts that do not depend on the machine's load).

Both libraries use their default context parameters (flash attention: llama.cpp's default, auto = on for the CPU).

The median of the reps is printed with the ratio ggviz / llama.cpp (> 1: ggviz faster; for times, < 1). It prints;
it does not assert. ``benchmarks/bench_user.py`` runs the same code.

The older comparison with a plain NumPy forward of the same model (``ggviz bench --numpy`` before) is the script
``benchmarks/bench_numpy.py``.
"""
from __future__ import annotations

import cProfile
import importlib.util
import json
import os
import pstats
import statistics
import subprocess
import sys
import time

import numpy as np

from .. import cli, llama
from ..fetch import fetch_default_model
from ..progress import write
from . import llama_bench


# =====================================================================================================================
# what a user waits for: ggviz and llama.cpp through their llama.h APIs, alternating
# =====================================================================================================================

PROMPT4 = [504, 3575, 282, 4649]                  # "The capital of France" (SmolLM2's BPE)
COMMON = dict(top_k=40, top_p=0.95, min_p=0.05, temp=0.8, seed=1234)
N_CTX_USER = 512


class GGvizLib:
    """ggviz through ``ggviz.llama`` (llama.h's names)."""
    name = "ggviz"

    def __init__(self, path, n_threads, use_blas: bool = False):
        self.model = llama.model_load_from_file(str(path), llama.model_default_params())
        self.n_threads = n_threads
        self.use_blas = use_blas

    def new_ctx(self):
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = N_CTX_USER, N_CTX_USER, N_CTX_USER
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.use_blas = self.use_blas
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


class LlamaCppLib:
    """llama.cpp through llama-cpp-python's ctypes binding of llama.h (``import llama_cpp``: ImportError if absent)."""
    name = "llama.cpp"

    def __init__(self, path, n_threads):
        self.L, self.model = llama_bench.load_llamacpp_model(path)
        L = self.L
        self.n_threads = n_threads
        self.build = f"llama-cpp-python {L.__version__} ({os.path.dirname(L.__file__)})"
        try:
            self.build += f"; system info: {L.llama_print_system_info().decode().strip()}"
        except (AttributeError, UnicodeDecodeError):
            pass

    def new_ctx(self):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = N_CTX_USER, N_CTX_USER, N_CTX_USER
        cp.n_threads = cp.n_threads_batch = self.n_threads
        return L.llama_init_from_model(self.model, cp)          # flash attention: its default (auto), as ggviz

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


def first_token(lib) -> tuple[float, float, float]:
    """(context creation, 4-token prompt, first sample) in ms; the context is freed after."""
    smpl = lib.sampler(False)
    t0 = time.perf_counter()
    ctx = lib.new_ctx()
    t1 = time.perf_counter()
    lib.decode(ctx, PROMPT4)
    t2 = time.perf_counter()
    lib.sample(smpl, ctx)
    t3 = time.perf_counter()
    lib.free(ctx, smpl)
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3


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


# the parts of a shape change, by the function that does each (cumulative time in the profile)
SHAPE_CHANGE_PARTS = [
    ("graph build (llm_graph_context)", "/llama/models/", "build"),      # the architecture's graph class
    ("scheduler split (5 passes)", "sched.py", "backend_sched_split_graph"),
    ("allocation (gallocr)", "sched.py", "backend_sched_alloc_splits"),
    ("plan + compile (ggml_graph_plan)", "ggml_cpu.py", "graph_plan"),
    ("compute (ggml_graph_compute)", "ggml_cpu.py", "graph_compute"),
]


def shape_change_profile(lib: GGvizLib, n_prompt: int, reps: int = 3) -> dict:
    """ggviz's decode step right after a ``n_prompt``-token prompt, its graph not cached (the cache is emptied
    first): wall ms (median of ``reps``), then one profiled step split into SHAPE_CHANGE_PARTS (cProfile
    cumulative ms -- the profiler's overhead inflates them, their shares are what counts); and the same step with
    the decode graph cached, and a steady decode step."""
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(200, 40000, n_prompt)]
    ctx = lib.new_ctx()

    def switch(cached: bool, prof=None) -> float:
        ctx.memory_clear()
        lib.decode(ctx, prompt)
        if not cached:
            ctx.graph_cache_clear()
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        lib.decode(ctx, [prompt[-1]])
        if prof is not None:
            prof.disable()
        return (time.perf_counter() - t0) * 1e3

    lib.decode(ctx, [prompt[0]])                 # the decode graph exists once (cached for the "cached" runs)
    uncached = statistics.median(switch(False) for _ in range(reps))
    cached = statistics.median(switch(True) for _ in range(reps))
    t0 = time.perf_counter()
    lib.decode(ctx, [prompt[1]])
    steady = (time.perf_counter() - t0) * 1e3
    prof = cProfile.Profile()
    profiled = switch(False, prof)
    st = pstats.Stats(prof).stats
    parts = []
    for label, file, func in SHAPE_CHANGE_PARTS:
        ms = sum(v[3] for (f, _, fn), v in st.items() if fn == func and file in f.replace("\\", "/")) * 1e3
        parts.append((label, ms))
    lib.free(ctx)
    return dict(n_prompt=n_prompt, uncached_ms=uncached, cached_ms=cached, steady_ms=steady, profiled_ms=profiled,
                parts=parts)


def user_bench(path=None, n_threads: int = 2, reps: int = 3, n_gen: int = 64, n_prompt_long: int = 128,
               llama_cpp: bool = True, profile: bool = True, log=print, use_blas: bool = False) -> dict:
    """Measure and print what a user waits for (see the module docstring); returns the per-library lists."""
    path = path or fetch_default_model(quiet=True)
    libs = [GGvizLib(path, n_threads, use_blas)]
    if llama_cpp:
        try:
            libs.append(LlamaCppLib(path, n_threads))
            log(f"llama.cpp: {libs[1].build}")
        except (ImportError, OSError, RuntimeError) as e:
            log(f"llama.cpp: not available ({type(e).__name__}: {e}); ggviz alone")
    rng = np.random.default_rng(0)
    long_prompt = [int(t) for t in rng.integers(200, 40000, n_prompt_long)]
    for lib in libs:                                       # warm: kernels, caches, first allocations
        generate(lib, False, 4, PROMPT4)
        generate(lib, False, 4, long_prompt)
    keys = ("ctx_ms", "prompt_ms", "sample_ms", "ttft_ms", "greedy", "common", "prefill", "decode")
    res = {lib.name: {k: [] for k in keys} for lib in libs}
    for _ in range(reps):
        for lib in libs:
            r = res[lib.name]
            c, p, s = first_token(lib)
            r["ctx_ms"].append(c)
            r["prompt_ms"].append(p)
            r["sample_ms"].append(s)
            r["ttft_ms"].append(c + p + s)
            r["greedy"].append(generate(lib, False, n_gen, PROMPT4)[1])
            r["common"].append(generate(lib, True, n_gen, PROMPT4)[1])
            pms, dec = generate(lib, False, n_gen, long_prompt)
            r["prefill"].append(n_prompt_long / pms * 1e3)
            r["decode"].append(dec)
    rows = [("context creation, ms", "ctx_ms", True),
            ("4-token prompt, ms", "prompt_ms", True),
            ("first sample, ms", "sample_ms", True),
            ("first token (the three above), ms", "ttft_ms", True),
            (f"{n_gen} tokens greedy, tok/s", "greedy", False),
            (f"{n_gen} tokens, common chain, tok/s", "common", False),
            (f"prefill of {n_prompt_long} tokens, tok/s", "prefill", False),
            (f"decode after it ({n_gen} tokens), tok/s", "decode", False)]
    log(f"\n{n_threads} thread(s), median of {reps} alternating reps")
    log(f"{'':44s}" + "".join(f"{lib.name:>12s}" for lib in libs) + ("   ggviz/llama.cpp" if len(libs) > 1 else ""))
    for label, key, lower_better in rows:
        med = [statistics.median(res[lib.name][key]) for lib in libs]
        line = f"{label:44s}" + "".join(f"{m:12.1f}" for m in med)
        if len(med) > 1 and med[1] > 0:
            line += f"   x{med[0] / med[1]:.2f}" + (" (lower is better)" if lower_better else "")
        log(line)
    if profile:
        pr = shape_change_profile(libs[0], n_prompt_long, reps)
        res["shape_change"] = pr
        log(f"\nggviz: decode step after a {pr['n_prompt']}-token prompt (a change of batch shape)")
        log(f"  graph not cached: {pr['uncached_ms']:.1f} ms; cached: {pr['cached_ms']:.1f} ms; "
            f"a steady decode step: {pr['steady_ms']:.1f} ms")
        log(f"  profile of the uncached step ({pr['profiled_ms']:.0f} ms under cProfile, cumulative ms):")
        for label, ms in pr["parts"]:
            log(f"    {label:36s}{ms:8.1f}")
    return res


# =====================================================================================================================
# what a newcomer meets first: a one-shot run, a first context, a first step of a new shape -- fresh processes
# =====================================================================================================================

ONESHOT_PROMPT = "The capital of France is"
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oneshot_child.py")


def llama_cpp_python() -> tuple[str, dict] | None:
    """(interpreter, environment) of a fresh process that imports llama_cpp: this interpreter when this process can
    import it (its package directory first on PYTHONPATH); None when it cannot."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    site = os.path.dirname(list(spec.submodule_search_locations)[0])
    return sys.executable, {"PYTHONPATH": site}


def _child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    # a user's installed package has its bytecode written once (pip does it); a sandbox's PYTHONDONTWRITEBYTECODE
    # would make every fresh process compile ggviz's ~100 modules again, which no user's run does
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if extra:
        env.update(extra)
    return env


def _run_child(argv: list, env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = (time.perf_counter() - t0) * 1e3
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} ... failed ({p.returncode}): {p.stderr.strip()[-800:]}")
    return wall, p.stdout


def oneshot_bench(path=None, n_threads: int = 2, reps: int = 3, n_predict: int = 32, prompt: str = ONESHOT_PROMPT,
                  llama_cpp: bool = True, log=print) -> dict:
    """The one-shot run, the first context and the first step of a new shape, each library in fresh processes,
    alternating (see the module docstring). Returns {library: {figure: [ms per rep]}}."""
    path = str(path or fetch_default_model(quiet=True))
    ours = (sys.executable, {"PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))})
    libs = [("ggviz", ours)]
    theirs = llama_cpp_python() if llama_cpp else None
    if theirs is not None:
        libs.append(("llama.cpp", theirs))
    elif llama_cpp:
        log("llama.cpp: llama-cpp-python not importable; ggviz alone")
    args = [path, str(n_threads), str(n_predict), prompt]
    res = {name: {} for name, _ in libs}
    texts = {}

    def one(name, py, env, warm=False):
        r = res[name]
        if name == "ggviz":       # the command itself, then the same run in phases
            wall, out = _run_child([py, "-m", "ggviz", "run", "-m", path, "-p", prompt, "-n", str(n_predict),
                                    "-t", str(n_threads)], _child_env(env))
            texts.setdefault(name, set()).add(out[:-2] if out.endswith("\n\n") else out)
        wall_c, out_c = _run_child([py, _CHILD, name, *args, "oneshot"], _child_env(env))
        d = json.loads(out_c.strip().splitlines()[-1])
        if name != "ggviz":
            wall = wall_c
            texts.setdefault(name, set()).add(d["text"])
        _, out_f = _run_child([py, _CHILD, name, *args, "first_ctx,shape"], _child_env(env))
        d.update({k: v for k, v in json.loads(out_f.strip().splitlines()[-1]).items() if k.startswith(("fc_", "first_", "shape_", "numba_fc_"))})
        # the user's case: a fresh process whose first graphs are the 128-token prompt's, then the first decode step
        # (no other context decoded before: nothing of a 1-token graph exists yet)
        _, out_s = _run_child([py, _CHILD, name, *args, "shape"], _child_env(env))
        d.update({"fresh_" + k: v for k, v in json.loads(out_s.strip().splitlines()[-1]).items() if k.startswith("shape_")})
        if warm:
            return
        r.setdefault("wall_ms", []).append(wall)
        r.setdefault("startup_ms", []).append(wall_c - d["oneshot_ms"])
        for k, v in d.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                r.setdefault(k, []).append(v)

    for name, (py, env) in libs:           # warm: bytecode written, kernels' caches and the file in the page cache
        one(name, py, env, warm=True)
    for _ in range(reps):
        for name, (py, env) in libs:
            one(name, py, env)
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    same = len(set().union(*texts.values())) == 1
    log(f"\nfresh processes, {n_threads} thread(s), median of {reps} alternating reps (load average {load})")
    log(f"one-shot `ggviz run -p {prompt!r} -n {n_predict}`: the same text from both: "
        f"{'yes' if same else 'NO: ' + repr(texts)}")
    rows = [("one-shot process, wall", "wall_ms"),
            ("  interpreter start-up", "startup_ms"),
            ("  imports", "imports_ms"),
            ("  model load", "load_ms"),
            ("  context creation (n_ctx 2048)", "ctx_ms"),
            ("  prompt", "prompt_ms"),
            ("  first step (sample + decode)", "first_step_ms"),
            (f"  the other {n_predict - 1} steps", "rest_ms"),
            ("  (a steady step)", "steady_step_ms"),
            ("first context of a loaded model", "first_ctx_ms"),
            ("  context creation (n_ctx 512)", "fc_ctx_ms"),
            ("  4-token prompt", "fc_prompt_ms"),
            ("  first sample", "fc_sample_ms"),
            ("fresh process: decode step after a 128-token prompt", "fresh_shape_first_ms"),
            ("  a steady decode step after it", "fresh_shape_steady_ms"),
            ("after a first context: step after a 128-token prompt", "shape_first_ms"),
            ("  a steady decode step after it", "shape_steady_ms")]
    names = [name for name, _ in libs]
    log(f"{'ms':54s}" + "".join(f"{n:>12s}" for n in names) + ("   ggviz/llama.cpp" if len(names) > 1 else ""))
    for label, key in rows:
        med = [statistics.median(res[n][key]) for n in names]
        line = f"{label:54s}" + "".join(f"{m:12.1f}" for m in med)
        if len(med) > 1 and med[1] > 0:
            line += f"   x{med[0] / med[1]:.2f}"
        log(line)
    if "numba_prompt_loaded" in res["ggviz"]:
        # what of each phase is Numba's first use in the process (counts: independent of the machine's load)
        r = res["ggviz"]
        log("ggviz, Numba's first use by phase (median): ms holding its compiler lock (its CPU target set up, then "
            "machine code loaded from its cache or compiled), dispatchers loaded from the cache / compiled")
        for label, ph, total in [("one-shot: model load", "load", "load_ms"),
                                 ("one-shot: context creation", "ctx", "ctx_ms"),
                                 ("one-shot: prompt", "prompt", "prompt_ms"),
                                 ("one-shot: the generation steps", "steps", "steps_ms"),
                                 ("first context (2nd process): context", "fc_ctx", "fc_ctx_ms"),
                                 ("first context (2nd process): 4-token prompt", "fc_prompt", "fc_prompt_ms")]:
            lock = statistics.median(r[f"numba_{ph}_lock_ms"])
            log(f"  {label:44s}{lock:8.1f} ms of {statistics.median(r[total]):8.1f}   "
                f"loaded {int(statistics.median(r[f'numba_{ph}_loaded']))}, "
                f"compiled {int(statistics.median(r[f'numba_{ph}_compiled']))}")
    for n in names:
        r = res[n]
        for where, p in [("fresh process", "fresh_"), ("after a first context", "")]:
            log(f"{n}, {where}: first decode step after the 128-token prompt / a steady step: "
                f"x{statistics.median(r[p + 'shape_first_ms']) / statistics.median(r[p + 'shape_steady_ms']):.2f}")
    return res


def user_main(argv=None, prog: str = "ggviz bench") -> int:
    """benchmarks/bench_user.py's entry (its own option names)."""
    ap = cli.ArgumentParser(prog=prog, description="what a user waits for: ggviz and llama.cpp alternating")
    ap.add_argument("--threads", type=cli.int_arg(1, 512), default=2)
    ap.add_argument("--reps", type=cli.int_arg(1), default=3)
    ap.add_argument("--gen", type=cli.int_arg(1), default=64)
    ap.add_argument("--prompt-long", type=cli.int_arg(2), default=128)
    ap.add_argument("--model", default=None, type=cli.model_file)
    ap.add_argument("--no-profile", action="store_true", help="skip the shape-change profile")
    a = ap.parse_args(argv)
    user_bench(a.model, a.threads, a.reps, a.gen, a.prompt_long, profile=not a.no_profile)
    return 0

def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--llama-bench" in argv:        # llama-bench's flow, with its own options (ggviz/tools/llama_bench.py)
        argv.remove("--llama-bench")
        return llama_bench.main(argv)
    ap = cli.ArgumentParser(prog="ggviz bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", action="store_true",
                    help="llama-bench's flow instead: pp/tg tests, warm-up, repetitions, avg ± stddev t/s "
                         "(its options: ggviz bench --llama-bench --help)")
    ap.add_argument("--model", default=None, type=cli.model_file,
                    help=cli.MODEL_HELP)
    ap.add_argument("--threads", default=[2], type=cli.thread_list, help="comma-separated thread counts (default 2)")
    ap.add_argument("--decode", type=cli.int_arg(1), default=64, help="tokens generated per measurement (default 64)")
    ap.add_argument("--prefill", type=cli.int_arg(1), default=128, help="prompt length for the prefill measurement")
    ap.add_argument("--reps", type=cli.int_arg(1), default=3, help="repetitions per measurement (the median is reported)")
    ap.add_argument("--blas", action="store_true",
                    help="add the BLAS backend (NumPy's BLAS takes large prompt MUL_MATs), as llama.cpp built with "
                         "GGML_BLAS; default: llama.cpp's default CPU build (tinyBLAS sgemm / vec_dot)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even if importable")
    ap.add_argument("--no-profile", action="store_true", help="skip the profile of a change of batch shape")
    ap.add_argument("--no-oneshot", action="store_true",
                    help="skip the one-shot run, first context and new-shape figures (fresh processes)")
    ap.add_argument("--oneshot-only", action="store_true", help="only those")
    args = ap.parse_args(argv)
    for nt in args.threads:
        if not args.oneshot_only:
            user_bench(args.model, nt, args.reps, args.decode, args.prefill, llama_cpp=not args.no_llama_cpp,
                       profile=not args.no_profile, log=write, use_blas=args.blas)
        if not args.no_oneshot:
            oneshot_bench(args.model, nt, args.reps, llama_cpp=not args.no_llama_cpp, log=write)
    return 0


if __name__ == "__main__":
    sys.exit(cli.command_main("bench"))
