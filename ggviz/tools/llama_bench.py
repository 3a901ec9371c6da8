"""ggviz bench --llama-bench: llama.cpp's ``llama-bench`` flow (tools/llama-bench/llama-bench.cpp), run on ggviz.

    ggviz bench --llama-bench [-p 512] [-n 128] [-r 5] [-t 2] [-b 2048] [-ub 512] [--no-warmup] [--no-llama-cpp]

What llama-bench does, mirrored step by step:

* ``get_cmd_params_instances``: the parameter grid. For each thread count, one *pp* test per ``-p`` value (a prompt
  of n_prompt tokens, no generation) and one *tg* test per ``-n`` value (n_gen generated tokens, no prompt); a 0 is
  skipped. (llama-bench's other axes -- batch sizes, KV types, -ngl, flash attention, depth, -pg -- are one value
  each here: the defaults, or ``-b`` / ``-ub``.)
* per test: a context with ``n_ctx = n_prompt + n_gen``, ``llama_memory_clear``; a **warm-up run** (unless
  ``--no-warmup``): the whole prompt for pp, one generated token for tg -- not timed into the samples; then ``-r``
  repetitions, each ``llama_memory_clear`` then one timed run: ``t_ns`` pushed into ``samples_ns``.
* ``test_prompt``: random tokens (``std::rand() % n_vocab``, BOS first if the vocabulary adds one) decoded in batches
  of ``n_batch``; ``test_gen``: n_gen single-token decodes, each token drawn after the previous decode.
* ``avg_ts`` / ``stdev_ts``: each sample becomes ``1e9 * (n_prompt + n_gen) / t_ns`` tokens per second, then the mean
  and the sample standard deviation, computed as llama-bench's ``avg`` and ``stdev`` do.
* the markdown printer: ``| model | size | params | backend | threads | test | t/s |`` with llama-bench's widths
  and alignment, ``pp512`` / ``tg128``, ``avg ± stdev``; ``n_batch`` / ``n_ubatch`` columns when not the defaults.

std::rand() is glibc's ``random()`` (TYPE_3 additive feedback, never seeded: seed 1), reproduced by ``GlibcRand``, so
each library gets the token ids llama-bench would draw in its own process. With ``llama_cpp`` (llama-cpp-python)
importable, llama.cpp runs the same flow in the same process, alternating with ggviz repetition by repetition; each
prints its own table, then the ratios.
Departures (ggviz:): llama-bench attaches its own threadpool (``poll`` 50, ``cpu_mask``); here each library uses its
context's threads (``n_threads``; llama-cpp-python does not bind ``llama_attach_threadpool``). The warm-up's time is
kept (``warmup_ns``) to show it is left out of the figures.
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
import time
from dataclasses import dataclass, field

from .. import cli, llama
from ..fetch import fetch_default_model
from ..progress import write

DEFAULT_N_PROMPT = [512]      # cmd_params_defaults
DEFAULT_N_GEN = [128]
DEFAULT_N_BATCH = 2048
DEFAULT_N_UBATCH = 512
DEFAULT_REPS = 5


def default_threads() -> int:
    """common_cpu_get_num_math: the physical cores (Linux: distinct (package, core) pairs of the CPUs this process
    may run on); the logical CPU count where that cannot be read."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        try:
            base = f"/sys/devices/system/cpu/cpu{c}/topology/"
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            return len(cpus)
    return max(1, len(cores))


class GlibcRand:
    """glibc's ``rand()`` (= ``random()``, TYPE_3: x[i] = x[i-3] + x[i-31] mod 2^32, output x >> 1), seeded as
    ``srand(seed)`` (1: a program that never calls srand, as llama-bench)."""

    def __init__(self, seed: int = 1):
        r = [0] * 34
        r[0] = seed if seed else 1
        for i in range(1, 31):
            # 16807 * r[i-1] % (2^31 - 1), by Schrage's method as glibc (the result kept positive)
            hi, lo = divmod(r[i - 1], 127773)
            word = 16807 * lo - 2836 * hi
            r[i] = word + 2147483647 if word < 0 else word
        for i in range(31, 34):
            r[i] = r[i - 31]
        self._r = r
        for _ in range(310):          # glibc discards the first 310 outputs
            self._next()

    def _next(self) -> int:
        r = self._r
        v = (r[-31] + r[-3]) & 0xFFFFFFFF
        r.append(v)
        if len(r) > 64:
            del r[:-34]
        return v >> 1

    def __call__(self) -> int:
        return self._next()


@dataclass
class Instance:
    """cmd_params_instance: one test of the grid (only the axes ggviz varies)."""
    n_prompt: int
    n_gen: int
    n_threads: int
    n_batch: int = DEFAULT_N_BATCH
    n_ubatch: int = DEFAULT_N_UBATCH

    @property
    def name(self) -> str:
        """The markdown printer's ``test`` column."""
        if self.n_prompt > 0 and self.n_gen == 0:
            return f"pp{self.n_prompt}"
        if self.n_gen > 0 and self.n_prompt == 0:
            return f"tg{self.n_gen}"
        return f"pp{self.n_prompt}+tg{self.n_gen}"


def get_cmd_params_instances(n_prompt, n_gen, n_threads, n_batch=DEFAULT_N_BATCH,
                             n_ubatch=DEFAULT_N_UBATCH) -> list[Instance]:
    """The grid in llama-bench's order: per thread count, the pp tests, then the tg tests (0s skipped)."""
    out = []
    for nt in n_threads:
        out += [Instance(p, 0, nt, n_batch, n_ubatch) for p in n_prompt if p != 0]
        out += [Instance(0, g, nt, n_batch, n_ubatch) for g in n_gen if g != 0]
    return out


def avg(v):
    """llama-bench's ``avg``: the sum over the count (0 for none)."""
    return sum(v) / len(v) if v else 0.0


def stdev(v):
    """llama-bench's ``stdev``: the sample standard deviation from the sum of squares (0 for fewer than 2)."""
    if len(v) <= 1:
        return 0.0
    n, mean = len(v), avg(v)
    sq_sum = sum(x * x for x in v)
    return math.sqrt(max(0.0, sq_sum / (n - 1) - mean * mean * n / (n - 1)))


@dataclass
class Test:
    """struct test: one instance's results for one library."""
    inst: Instance
    library: str
    model_type: str
    model_size: int
    model_n_params: int
    samples_ns: list = field(default_factory=list)
    warmup_ns: list = field(default_factory=list)        # ggviz: kept to show what is left out

    def get_ts(self) -> list:
        n_tokens = self.inst.n_prompt + self.inst.n_gen
        return [1e9 * n_tokens / t for t in self.samples_ns]

    def avg_ns(self):
        return avg(self.samples_ns)

    def stdev_ns(self):
        return stdev(self.samples_ns)

    def avg_ts(self):
        return avg(self.get_ts())

    def stdev_ts(self):
        return stdev(self.get_ts())


# ---- the two libraries, through their llama.h APIs

class GGvizRunner:
    name = "ggviz"

    def __init__(self, path=None, model=None):
        """From a GGUF path, or a model already loaded (``model=``: a notebook's)."""
        self.model = model if model is not None else llama.model_load_from_file(str(path),
                                                                                 llama.model_default_params())
        self.vocab = llama.model_get_vocab(self.model)
        self.build = f"ggviz {_ggviz_version()}"

    def desc(self):
        return llama.model_desc(self.model), llama.model_size(self.model), llama.model_n_params(self.model)

    def add_bos(self) -> bool:
        return bool(self.vocab.add_bos)

    def bos(self) -> int:
        return llama.vocab_bos(self.vocab)

    def n_vocab(self) -> int:
        return llama.vocab_n_tokens(self.vocab)

    def new_ctx(self, inst: Instance):
        cp = llama.context_default_params()           # to_llama_cparams
        cp.n_ctx = inst.n_prompt + inst.n_gen
        cp.n_batch, cp.n_ubatch = inst.n_batch, inst.n_ubatch
        cp.n_threads = cp.n_threads_batch = inst.n_threads
        return llama.init_from_model(self.model, cp)

    def set_n_threads(self, ctx, n):
        llama.set_n_threads(ctx, n, n)

    def memory_clear(self, ctx):
        llama.memory_clear(llama.get_memory(ctx), False)

    def decode(self, ctx, tokens) -> int:
        return llama.decode(ctx, llama.batch_get_one(list(tokens)))

    def free(self, ctx):
        llama.free(ctx)


def load_llamacpp_model(path):
    """llama-cpp-python's binding and a llama_model loaded from ``path`` (ImportError if it is not installed)."""
    try:     # optional (loaded only here: its libggml must not meet another ggml in the process first)
        import llama_cpp as L
    except ImportError as e:
        raise ImportError(f"llama-cpp-python is not installed ({e})") from e
    try:     # llama-cpp-python's log callback: errors only (as its Llama(verbose=False))
        from llama_cpp import _logger
        _logger.set_verbose(False)
    except (ImportError, AttributeError):
        pass
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return L, model


class LlamaCppRunner:
    name = "llama.cpp"

    def __init__(self, path):
        self.L, self.model = load_llamacpp_model(path)
        self.vocab = self.L.llama_model_get_vocab(self.model)
        self.build = f"llama-cpp-python {self.L.__version__}"

    def desc(self):
        buf = ctypes.create_string_buffer(128)
        self.L.llama_model_desc(self.model, buf, 128)
        return (buf.value.decode(), int(self.L.llama_model_size(self.model)),
                int(self.L.llama_model_n_params(self.model)))

    def add_bos(self) -> bool:
        return bool(self.L.llama_vocab_get_add_bos(self.vocab))

    def bos(self) -> int:
        return int(self.L.llama_vocab_bos(self.vocab))

    def n_vocab(self) -> int:
        return int(self.L.llama_vocab_n_tokens(self.vocab))

    def new_ctx(self, inst: Instance):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = inst.n_prompt + inst.n_gen
        cp.n_batch, cp.n_ubatch = inst.n_batch, inst.n_ubatch
        cp.n_threads = cp.n_threads_batch = inst.n_threads
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp could not create the context")
        return ctx

    def set_n_threads(self, ctx, n):
        self.L.llama_set_n_threads(ctx, n, n)

    def memory_clear(self, ctx):
        self.L.llama_memory_clear(self.L.llama_get_memory(ctx), False)

    def decode(self, ctx, tokens) -> int:
        arr = (self.L.llama_token * len(tokens))(*tokens)
        res = self.L.llama_decode(ctx, self.L.llama_batch_get_one(arr, len(tokens)))
        self.L.llama_synchronize(ctx)
        return res

    def free(self, ctx):
        self.L.llama_free(ctx)


def _ggviz_version() -> str:
    try:
        from importlib.metadata import version
        return version("ggviz")
    except Exception:       # noqa: BLE001 -- a checkout without an installed distribution
        return "(checkout)"


def test_prompt(lib, ctx, n_prompt: int, n_batch: int, n_threads: int, rand) -> None:
    """llama-bench's test_prompt: n_prompt random tokens in batches of n_batch (BOS first if the vocab adds it)."""
    lib.set_n_threads(ctx, n_threads)
    n_vocab = lib.n_vocab()
    n_processed = 0
    while n_processed < n_prompt:
        n_tokens = min(n_prompt - n_processed, n_batch)
        first = lib.bos() if n_processed == 0 and lib.add_bos() else rand() % n_vocab
        tokens = [first] + [rand() % n_vocab for _ in range(1, n_tokens)]
        res = lib.decode(ctx, tokens)
        if res != 0:
            raise RuntimeError(f"{lib.name}: failed to decode prompt batch, res = {res}")
        n_processed += n_tokens


def test_gen(lib, ctx, n_gen: int, n_threads: int, rand) -> None:
    """llama-bench's test_gen: n_gen single-token decodes (BOS first if the vocab adds it, then random tokens)."""
    lib.set_n_threads(ctx, n_threads)
    n_vocab = lib.n_vocab()
    token = lib.bos() if lib.add_bos() else rand() % n_vocab
    for _ in range(n_gen):
        res = lib.decode(ctx, [token])
        if res != 0:
            raise RuntimeError(f"{lib.name}: failed to decode generation batch, res = {res}")
        token = rand() % n_vocab


def _one_run(lib, ctx, inst: Instance, rand, warmup: bool) -> int:
    """One timed run (the body of llama-bench's repetition loop, or its warm-up): ns."""
    t_start = time.perf_counter_ns()
    if warmup:
        if inst.n_prompt > 0:
            test_prompt(lib, ctx, inst.n_prompt, inst.n_batch, inst.n_threads, rand)
        if inst.n_gen > 0:
            test_gen(lib, ctx, 1, inst.n_threads, rand)
    else:
        if inst.n_prompt > 0:
            test_prompt(lib, ctx, inst.n_prompt, inst.n_batch, inst.n_threads, rand)
        if inst.n_gen > 0:
            test_gen(lib, ctx, inst.n_gen, inst.n_threads, rand)
    return time.perf_counter_ns() - t_start


def run_bench(libs, instances, reps: int = DEFAULT_REPS, no_warmup: bool = False, log=None) -> list[list[Test]]:
    """Every instance on every library (llama-bench's main loop), the libraries alternating within a test: each
    creates its context and runs its warm-up, then repetition i runs on each library in turn. Returns, per
    instance, one Test per library."""
    rands = {lib.name: GlibcRand(1) for lib in libs}          # each library as its own llama-bench process
    out = []
    for k, inst in enumerate(instances):
        if log is not None:
            log(f"benchmark {k + 1}/{len(instances)}: {inst.name}, {inst.n_threads} thread(s)")
        ctxs, tests = [], []
        try:
            for lib in libs:
                ctx = lib.new_ctx(inst)
                ctxs.append(ctx)
                tests.append(Test(inst, lib.name, *lib.desc()))
                lib.memory_clear(ctx)
                if not no_warmup:
                    tests[-1].warmup_ns.append(_one_run(lib, ctx, inst, rands[lib.name], warmup=True))
            for _ in range(reps):
                for lib, ctx, t in zip(libs, ctxs, tests):
                    lib.memory_clear(ctx)
                    t.samples_ns.append(_one_run(lib, ctx, inst, rands[lib.name], warmup=False))
        finally:
            for lib, ctx in zip(libs, ctxs):
                lib.free(ctx)
        out.append(tests)
    return out


# ---- the markdown printer

_WIDTH = {"model": -30, "size": 10, "params": 10, "backend": -10, "n_threads": 7, "n_batch": 7, "n_ubatch": 8,
          "test": 15, "t/s": 20}
_DISPLAY = {"n_threads": "threads"}


def markdown_fields(n_batch: int = DEFAULT_N_BATCH, n_ubatch: int = DEFAULT_N_UBATCH) -> list[str]:
    """markdown_printer::print_header's choice for a CPU backend: n_threads always, n_batch / n_ubatch when not the
    defaults."""
    f = ["model", "size", "params", "backend", "n_threads"]
    if n_batch != DEFAULT_N_BATCH:
        f.append("n_batch")
    if n_ubatch != DEFAULT_N_UBATCH:
        f.append("n_ubatch")
    return f + ["test", "t/s"]


def _cell(value: str, width: int) -> str:
    return f" {value:<{-width}} |" if width < 0 else f" {value:>{width}} |"


def markdown_header(fields) -> list[str]:
    head = "|" + "".join(_cell(_DISPLAY.get(f, f), _WIDTH[f]) for f in fields)
    rule = "|" + "".join(f" {'-' * (abs(_WIDTH[f]) - 1)}{':' if _WIDTH[f] > 0 else '-'} |" for f in fields)
    return [head, rule]


def markdown_row(t: Test, fields) -> str:
    vals = {"model": t.model_type,
            "size": (f"{t.model_size / 1024 / 1024:.2f} MiB" if t.model_size < 1024 ** 3
                     else f"{t.model_size / 1024 ** 3:.2f} GiB"),
            "params": (f"{t.model_n_params / 1e6:.2f} M" if t.model_n_params < 1e9
                       else f"{t.model_n_params / 1e9:.2f} B"),
            "backend": "CPU", "n_threads": str(t.inst.n_threads), "n_batch": str(t.inst.n_batch),
            "n_ubatch": str(t.inst.n_ubatch), "test": t.inst.name,
            "t/s": f"{t.avg_ts():.2f} ± {t.stdev_ts():.2f}"}
    return "|" + "".join(_cell(vals[f], _WIDTH[f]) for f in fields)


def markdown_table(tests: list[Test], build: str, n_batch=DEFAULT_N_BATCH, n_ubatch=DEFAULT_N_UBATCH) -> str:
    fields = markdown_fields(n_batch, n_ubatch)
    lines = markdown_header(fields) + [markdown_row(t, fields) for t in tests]
    return "\n".join(lines + ["", f"build: {build}"])


def llama_bench(path=None, n_prompt=None, n_gen=None, n_threads=None, reps: int = DEFAULT_REPS,
                n_batch: int = DEFAULT_N_BATCH, n_ubatch: int = DEFAULT_N_UBATCH, no_warmup: bool = False,
                llama_cpp: bool = True, log=print, progress: bool = False) -> dict:
    """Run the flow and print each library's markdown table, then the ratios. Returns {"libs": [names],
    "builds": {name: build}, "tests": [[Test per library] per instance], "tables": {name: markdown}}."""
    path = path or fetch_default_model(quiet=True)
    libs = [GGvizRunner(path)]
    if llama_cpp:
        try:
            libs.append(LlamaCppRunner(path))
        except (ImportError, OSError, RuntimeError) as e:
            log(f"llama.cpp: not available ({type(e).__name__}: {e}); ggviz alone")
    instances = get_cmd_params_instances(n_prompt or DEFAULT_N_PROMPT, n_gen or DEFAULT_N_GEN,
                                         n_threads or [default_threads()], n_batch, n_ubatch)
    results = run_bench(libs, instances, reps, no_warmup, log=log if progress else None)
    tables = {}
    for j, lib in enumerate(libs):
        tables[lib.name] = markdown_table([r[j] for r in results], lib.build, n_batch, n_ubatch)
        log(f"\n{lib.name}:\n{tables[lib.name]}")
    if len(libs) > 1:
        log("\nggviz / llama.cpp (t/s, alternating repetitions):")
        for r in results:
            log(f"  {r[0].inst.name} @ {r[0].inst.n_threads} thread(s): x{r[0].avg_ts() / r[1].avg_ts():.2f}")
    return {"libs": [lib.name for lib in libs], "builds": {lib.name: lib.build for lib in libs}, "tests": results,
            "tables": tables}


def _count_list(text: str) -> list[int]:
    """An argparse type: comma-separated token counts (0 allowed: llama-bench skips that test)."""
    counts = [cli.int_arg(0)(t.strip()) for t in text.split(",") if t.strip()]
    if not counts:
        raise cli.argparse.ArgumentTypeError(f"{text!r} names no token count (e.g. 512 or 128,256)")
    return counts


def main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="ggviz bench --llama-bench",
                            description="llama-bench's flow on ggviz (pp / tg tests, warm-up, repetitions, avg ± "
                                        "stddev t/s), llama.cpp alternating when llama-cpp-python is importable")
    ap.add_argument("-m", "--model", default=None, type=cli.model_file, help=cli.MODEL_HELP)
    ap.add_argument("-p", "--n-prompt", default=DEFAULT_N_PROMPT, type=_count_list,
                    help="comma-separated prompt lengths (default 512)")
    ap.add_argument("-n", "--n-gen", default=DEFAULT_N_GEN, type=_count_list,
                    help="comma-separated generation lengths (default 128)")
    ap.add_argument("-t", "--threads", default=None, type=cli.thread_list,
                    help="comma-separated thread counts (default: the physical cores)")
    ap.add_argument("-r", "--repetitions", default=DEFAULT_REPS, type=cli.int_arg(1),
                    help="times to repeat each test (default 5)")
    ap.add_argument("-b", "--batch-size", default=DEFAULT_N_BATCH, type=cli.int_arg(1))
    ap.add_argument("-ub", "--ubatch-size", default=DEFAULT_N_UBATCH, type=cli.int_arg(1))
    ap.add_argument("--no-warmup", action="store_true", help="skip the warm-up runs before benchmarking")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even if importable")
    ap.add_argument("--progress", action="store_true", help="print each benchmark as it starts")
    a = ap.parse_args(argv)
    llama_bench(a.model, a.n_prompt, a.n_gen, a.threads, a.repetitions, a.batch_size, a.ubatch_size,
                a.no_warmup, llama_cpp=not a.no_llama_cpp, log=write, progress=a.progress)
    return 0


if __name__ == "__main__":
    sys.exit(main())
