"""What does ggviz.trace cost a real decode?  No listener vs full tracing vs tracing removed from the source.

    python benchmarks/bench_trace.py [--tokens 8] [--threads 2] [--warmup 2] [--prompt "..."] [--path fast faithful]

Three ways to run the same single-token decodes of the default model (SmolLM2-135M Q4_1, ``ggviz.run.load_model``):

* **baseline** -- tracing *disabled by construction*: ggviz's source imported a second time, as the package
  ``ggviz_notrace``, through an import hook that rewrites every ``trace.active`` to the constant ``False`` (so the
  ``if trace.active:`` blocks are dropped before compiling and no call site costs anything);
* **no listener** -- the ordinary engine, nobody listening: every call site pays one ``trace.active`` test;
* **full tracing** -- a ``trace.Recorder()`` on every event kind around each decode;
* **node by node** -- no listener, but an ``abort_callback`` that never aborts: ggml checks it after every node, so
  the graph is walked node by node from Python (for comparison: the walk the compiled path avoids).

On the fast path a traced compute still runs compiled: each thread logs node spans, barrier waits and MUL_MAT chunk
claims into an array, and the executor hands the log over as one ``trace.Batch`` that recorders expand into events
only when they are read. The time to read the events back (``rec.events``) is reported separately ("read back").

Both engines live in one process, each with its model and context; the three modes take turns token by token (in
rotating order), so all see the same machine load and KV-cache growth. Reported: the median and the min per mode.
The no-listener overhead is also *counted*: the number of ``trace.active`` tests in one decode times the measured
cost of one test -- free of timing noise. Targets (the issue): full tracing <= 25 % slower than no listener, no
listener <= 3 % slower than the baseline.

Two engine paths, one child process each (``--path``): **fast** -- the default when Numba is installed: the MUL_MAT
weights sit in the CPU_REPACK buffer type and a whole graph runs compiled (ggviz/ggml/cpu/repack.py), traced or not;
**faithful** -- ``GGVIZ_NO_REPACK=1``: every compute runs the
NumPy kernels node by node, traced or not, so the ratio is the cost of the events alone.
"""
from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import timeit

ROOT = pathlib.Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------- the import hook

class _NoTrace(ast.NodeTransformer):
    """``trace.active`` -> ``False``; ``if False: body else: rest`` -> ``rest``; ``a if False else b`` -> ``b``."""

    def __init__(self):
        self.n = 0

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if (isinstance(node.ctx, ast.Load) and node.attr == "active" and isinstance(node.value, ast.Name)
                and node.value.id == "trace"):
            self.n += 1
            return ast.copy_location(ast.Constant(False), node)
        return node

    def visit_If(self, node):
        self.generic_visit(node)
        if isinstance(node.test, ast.Constant) and node.test.value is False:
            return node.orelse or ast.copy_location(ast.Pass(), node)
        return node

    def visit_IfExp(self, node):
        self.generic_visit(node)
        if isinstance(node.test, ast.Constant) and node.test.value is False:
            return node.orelse
        return node


class _NoTraceLoader(importlib.machinery.SourceFileLoader):
    stripped = 0

    def get_code(self, fullname):            # never the cached .pyc: always our rewritten source
        path = self.get_filename(fullname)
        tree = ast.parse(self.get_data(path), path)
        tr = _NoTrace()
        tree = ast.fix_missing_locations(tr.visit(tree))
        _NoTraceLoader.stripped += tr.n
        return compile(tree, path, "exec", dont_inherit=True)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Imports ggviz's source a second time as the package ``ggviz_notrace``, through _NoTraceLoader: the same
    engine with every trace call site removed, side by side with the ordinary one in the same process (so both are
    timed under the same machine load). ggviz's engine modules import each other relatively, so the copy is
    self-contained."""

    ALIAS = "ggviz_notrace"

    def find_spec(self, name, path, target=None):
        if name != self.ALIAS and not name.startswith(self.ALIAS + "."):
            return None
        rel = name.split(".")[1:]
        base = ROOT / "ggviz" / pathlib.Path(*rel) if rel else ROOT / "ggviz"
        if (base / "__init__.py").exists():
            origin = base / "__init__.py"
            return importlib.util.spec_from_file_location(name, origin, loader=_NoTraceLoader(name, str(origin)),
                                                          submodule_search_locations=[str(base)])
        origin = base.with_suffix(".py")
        if origin.exists():
            return importlib.util.spec_from_file_location(name, origin, loader=_NoTraceLoader(name, str(origin)))
        return None


# --------------------------------------------------------------------------------------------- the child side

def _child(args) -> dict:
    sys.path.insert(0, str(ROOT))
    sys.meta_path.insert(0, _AliasFinder())
    import types

    import ggviz_notrace.llama as llama_nt
    import ggviz_notrace.run as run_nt
    from ggviz import llama, trace
    from ggviz.run import load_model

    def setup(llama_mod, load):
        model = load()
        cp = llama_mod.context_default_params()
        cp.n_ctx = 512
        cp.n_threads = cp.n_threads_batch = args.threads
        ctx = llama_mod.init_from_model(model, cp)
        ids = llama_mod.tokenize(llama_mod.model_get_vocab(model), args.prompt, add_special=True,
                                 parse_special=True)
        if llama_mod.decode(ctx, llama_mod.batch_get_one(ids)) != 0:
            raise RuntimeError("prompt decode failed")
        return ctx, ids[-1]

    ctx, tok = setup(llama, load_model)
    ctx_nt, tok_nt = setup(llama_nt, run_nt.load_model)

    def one(mode):
        if mode == "baseline":
            t0 = time.perf_counter()
            st = llama_nt.decode(ctx_nt, llama_nt.batch_get_one([tok_nt]))
            return time.perf_counter() - t0, st, 0, 0.0
        rec = trace.Recorder() if mode == "traced" else None
        if rec is not None:
            trace.listen(rec)
        if mode == "nodewise":
            # an abort callback (that never aborts) is checked after every node: no whole-graph compiled run
            ctx.cparams.abort_callback = _never
        t0 = time.perf_counter()
        st = llama.decode(ctx, llama.batch_get_one([tok]))
        dt = time.perf_counter() - t0
        ctx.cparams.abort_callback = None
        if rec is None:
            return dt, st, 0, 0.0
        trace.unlisten(rec)
        t1 = time.perf_counter()
        n = len(rec.events)           # expands the batches of compiled computes
        return dt, st, n, time.perf_counter() - t1

    modes = ["plain", "traced", "baseline", "nodewise"]
    out = dict(plain=[], traced=[], baseline=[], nodewise=[], events=[], read=[], stripped=_NoTraceLoader.stripped)
    for i in range(args.warmup + args.tokens):
        k = i % len(modes)
        for mode in modes[k:] + modes[:k]:          # rotate the order: no mode always runs first
            dt, st, n_ev, t_read = one(mode)
            if st != 0:
                raise RuntimeError(f"decode failed ({mode}: {st})")
            if i >= args.warmup:
                out[mode].append(dt)
                if mode == "traced":
                    out["events"].append(n_ev)
                    out["read"].append(t_read)

    # count the trace.active tests of one untraced decode
    class _Counting(types.ModuleType):
        reads = 0

        @property
        def active(self):
            type(self).reads += 1
            return self.__dict__["active"]
    cls = trace.__class__
    trace.__class__ = _Counting
    try:
        llama.decode(ctx, llama.batch_get_one([tok]))
    finally:
        trace.__class__ = cls
    out["checks_per_decode"] = _Counting.reads
    return out


def _never(data) -> bool:
    return False


def _run_child(args, path: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--tokens", str(args.tokens), "--threads", str(args.threads),
           "--prompt", args.prompt, "--warmup", str(args.warmup)]
    env = dict(os.environ)
    if path == "faithful":
        env["GGVIZ_NO_REPACK"] = "1"
    else:
        env.pop("GGVIZ_NO_REPACK", None)
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), env=env)
    if r.returncode != 0:
        raise RuntimeError(f"child ({path}) failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check_cost_ns() -> float:
    """Nanoseconds of one ``if trace.active:`` test with nobody listening."""
    sys.path.insert(0, str(ROOT))
    from ggviz import trace
    n = 2_000_000
    g = {"trace": trace}
    t_test = min(timeit.repeat("if trace.active: pass", globals=g, number=n, repeat=5))
    t_none = min(timeit.repeat("pass", globals=g, number=n, repeat=5))
    return max(t_test - t_none, 0.0) / n * 1e9


def measure(args, path: str) -> dict:
    r = _run_child(args, path)
    base, plain, traced, nodew = r["baseline"], r["plain"], r["traced"], r["nodewise"]
    med = statistics.median
    m_base, m_plain, m_traced, m_node = med(base), med(plain), med(traced), med(nodew)
    per_check = _check_cost_ns()
    checks = r["checks_per_decode"]
    est = checks * per_check * 1e-9
    print(f"\n[{path} path{' (GGVIZ_NO_REPACK=1)' if path == 'faithful' else ''}]   median (min) ms per token")
    print(f"  baseline (trace.active -> False at {r['stripped']} call sites): {m_base * 1e3:9.1f} "
          f"({min(base) * 1e3:.1f})")
    print(f"  no listener:                 {m_plain * 1e3:9.1f} ({min(plain) * 1e3:.1f})   "
          f"x{m_plain / m_base:.3f} vs baseline (min: x{min(plain) / min(base):.3f}; target <= 1.03)")
    print(f"  full tracing (Recorder):     {m_traced * 1e3:9.1f} ({min(traced) * 1e3:.1f})   "
          f"x{m_traced / m_plain:.3f} vs no listener (min: x{min(traced) / min(plain):.3f}; target <= 1.25); "
          f"{med(r['events']):.0f} events/token")
    print(f"  read back (rec.events after each traced decode, not in the decode time): {med(r['read']) * 1e3:.1f} ms")
    print(f"  node by node, no listener:   {m_node * 1e3:9.1f} ({min(nodew) * 1e3:.1f})   "
          f"(an abort_callback that never aborts: ggml calls it after every node, so no compiled walk)")
    print(f"  no-listener cost, counted: {checks} trace.active tests/decode x {per_check:.1f} ns = {est * 1e6:.0f} us "
          f"= {est / min(base) * 100:.3f} % of the fastest baseline decode")
    spread = (lambda xs: (max(xs) - min(xs)) / med(xs) * 100)
    print(f"  (spread (max-min)/median: baseline {spread(base):.0f} %, no listener {spread(plain):.0f} %, "
          f"traced {spread(traced):.0f} %)")
    return dict(baseline=m_base, plain=m_plain, traced=m_traced, nodewise=m_node, checks=checks,
                per_check_ns=per_check,
                events=med(r["events"]))


def main(args):
    print(f"decode of 1 token after a {len(args.prompt)}-char prompt, {args.threads} thread(s), {args.tokens} timed "
          f"tokens per mode after {args.warmup} warm-up, modes interleaved; cores: {os.cpu_count()}")
    return {path: measure(args, path) for path in args.path}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=6, help="decodes per mode and round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--warmup", type=int, default=2, help="untimed decodes per mode first")
    ap.add_argument("--path", nargs="+", choices=["fast", "faithful"], default=["fast", "faithful"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a)))
    else:
        main(a)
