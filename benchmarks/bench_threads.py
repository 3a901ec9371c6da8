"""How much do ggviz's CPU threads buy on a mul_mat-heavy graph?  1 thread vs N threads.

    python benchmarks/bench_threads.py [--types f32 q4_1] [--threads 1 2] [--layers 8] [--cols 64] [--repeat 5]
                                       [--blas-threads 1] [--no-repack]

The graph is a chain of SmolLM2-135M-sized projections, alternately [576 -> 1536] and [1536 -> 576], applied to
``--cols`` activation columns (a prompt of that many tokens): every node is a MUL_MAT, so the time is the
threadpool's chunked mul_mat (ggml_compute_forward_mul_mat: src1 converted to the vec_dot type, then 16x16-chunks
claimed from ``current_chunk``). Each case runs on a persistent threadpool (ggml.threadpool_new), median of
``--repeat`` computes after a warm-up.

Each type is timed twice: on the faithful NumPy kernels (node by node, chunk by chunk from Python) and with the
weights in the CPU_REPACK extra buffer type, where the whole graph runs as one compiled walk per thread (ggml's
chunking and barriers, no GIL): that is how ggviz runs a model, and where the issue's ">= 1.5x with 2 threads" is
met (measured x1.8 on 2 cores). On the faithful kernels,
Python threads only run in parallel while NumPy is inside a kernel with the GIL released, so the speedup is bounded
by the share of time spent in big NumPy calls (Amdahl) -- the per-chunk Python glue runs one thread at a time. For
F32 the kernel is a BLAS sgemm, which is itself multi-threaded: ``--blas-threads`` (default 1, set through
OPENBLAS_NUM_THREADS/OMP_NUM_THREADS/MKL_NUM_THREADS before NumPy loads) keeps BLAS from using the cores the
threadpool wants; ``--blas-threads 0`` leaves BLAS alone (then "1 thread" already uses every core through BLAS).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time


def _parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="+", default=["f32", "q4_1"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--blas-threads", type=int, default=1)
    ap.add_argument("--no-repack", dest="repack", action="store_false",
                    help="do not also time the weights in the CPU_REPACK buffer type (the compiled fast path, which is "
                         "what ggviz runs models with when Numba is installed)")
    return ap.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None and ARGS.blas_threads > 0:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.blas_threads)

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggviz import ggml, trace  # noqa: E402
from ggviz.ggml import quants  # noqa: E402

N_EMBD, N_FF = 576, 1536
TYPES = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16, "q4_0": ggml.GGML_TYPE_Q4_0,
         "q4_1": ggml.GGML_TYPE_Q4_1, "q8_0": ggml.GGML_TYPE_Q8_0, "q4_k": ggml.GGML_TYPE_Q4_K,
         "q6_k": ggml.GGML_TYPE_Q6_K}


def build(type_: int, layers: int, cols: int, seed: int = 0, repack: bool = False):
    """(ctx, graph, output) of a chain of `layers` mul_mats over `cols` columns; ``repack``: the weights moved into
    the CPU_REPACK extra buffer type (ggml_backend_cpu_get_extra_buffer_types) when it takes them."""
    rng = np.random.default_rng(seed)
    mem = 0
    for i in range(layers):
        k, n = (N_EMBD, N_FF) if i % 2 == 0 else (N_FF, N_EMBD)
        mem += ggml.row_size(type_, k) * n + 4 * n * cols + 2 * ggml.tensor_overhead()
    ctx = ggml.init(mem + 4 * N_EMBD * cols + ggml.graph_overhead() + (1 << 20))
    x = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, N_EMBD, cols)
    ggml.set_name(x, "x")
    ggml.get_data(x)[...] = rng.standard_normal(ggml.get_data(x).shape, dtype=np.float32)
    cur = x
    for i in range(layers):
        k, n = (N_EMBD, N_FF) if i % 2 == 0 else (N_FF, N_EMBD)
        w = ggml.new_tensor_2d(ctx, type_, k, n)
        ggml.set_name(w, f"blk.{i}.weight")
        vals = rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)
        data = ggml.get_data(w)
        if type_ == ggml.GGML_TYPE_F32:
            data[...] = vals.reshape(data.shape)
        elif type_ == ggml.GGML_TYPE_F16:
            data[...] = vals.astype(np.float16).reshape(data.shape)
        else:
            data[...] = quants.quantize_row_ref(type_, vals).reshape(data.shape)
        cur = ggml.mul_mat(ctx, w, cur)
        ggml.set_name(cur, f"y{i}")
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, cur)
    if repack:
        from ggviz.ggml.cpu import repack as rp
        if not rp.available():
            return None
        weights = [n.src[0] for n in gf.nodes]
        ctx.keep_repack_buffer = rp.place_weights(weights)
        if ctx.keep_repack_buffer is None:
            return None
    return ctx, gf, cur


def time_computes(gf, out, thread_counts, repeat: int, tp=None):
    """n_threads -> (min seconds, median seconds, output bytes) of graph_compute on the pool tp. The thread counts
    take turns (1, 2, 1, 2, ...) so that all see the same machine load; the min is the least disturbed run."""
    plans = {}
    for n in thread_counts:
        plan = ggml.graph_plan(gf, n, tp)
        if plan.work_size:
            plan.work_data = np.zeros(plan.work_size, np.uint8)
        assert ggml.graph_compute(gf, plan) == 0          # warm-up
        plans[n] = plan
    ts = {n: [] for n in thread_counts}
    outs = {}
    for _ in range(repeat):
        for n in thread_counts:
            t0 = time.perf_counter()
            ggml.graph_compute(gf, plans[n])
            ts[n].append(time.perf_counter() - t0)
            outs[n] = ggml.get_data(out).tobytes()
    return {n: (min(ts[n]), statistics.median(ts[n]), outs[n]) for n in thread_counts}


def chunk_stats(gf, n_threads: int, tp):
    """Chunks per node and per thread of one compute (from the trace)."""
    plan = ggml.graph_plan(gf, n_threads, tp)
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    with trace.ComputeTimeline() as tl:
        ggml.graph_compute(gf, plan)
    c = tl.last
    per_thread = {ith: len(ln["chunks"]) for ith, ln in c["threads"].items()}
    busy = {ith: sum(s["t_end"] - s["t_start"] for s in ln["chunks"]) / 1e6 for ith, ln in c["threads"].items()}
    waits = {ith: sum(b["t_exit"] - b["t_enter"] for b in ln["barriers"]) / 1e6 for ith, ln in c["threads"].items()}
    first = next(iter(c["threads"].values()))["chunks"]
    return per_thread, busy, waits, (first[0]["nchunk"] if first else None)


def machine_ceiling(n_threads: int, seconds: float = 0.5, repeat: int = 5) -> float:
    """Speedup of n_threads Python threads on GIL-free work (big sgemms: NumPy releases the GIL for the whole
    call): what this machine's cores can give at best, before any Python glue (best of ``repeat``)."""
    return max(_machine_ceiling_once(n_threads, seconds) for _ in range(repeat))


def _machine_ceiling_once(n_threads: int, seconds: float) -> float:
    import threading
    a = np.random.default_rng(1).standard_normal((256, 1024), dtype=np.float32)
    b = np.random.default_rng(2).standard_normal((1024, 1024), dtype=np.float32)
    t0 = time.perf_counter()
    k = 0
    while time.perf_counter() - t0 < seconds / 2:
        a @ b
        k += 1
    k = max(k, 4) * n_threads

    def work(m):
        for _ in range(m):
            a @ b
    t0 = time.perf_counter()
    work(k)
    t1 = time.perf_counter() - t0
    ths = [threading.Thread(target=work, args=(k // n_threads,)) for _ in range(n_threads)]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return t1 / (time.perf_counter() - t0)


def f32_gil_free_share(gf, t_one: float) -> float:
    """F32 only: the share of the 1-thread compute spent inside the chunks' sgemm calls (the only part that runs
    without the GIL), timed by replaying every chunk's sgemm with the chunk's shapes alone."""
    rng = np.random.default_rng(3)
    total = 0.0
    for node in gf.nodes:
        k, nr0 = node.src[0].ne[0], node.ne[0]
        nr1 = node.ne[1] * node.ne[2] * node.ne[3]
        cs = 64 if (nr0 == 1 or nr1 == 1) else 16
        x = rng.standard_normal((cs, int(k)), dtype=np.float32)
        y = rng.standard_normal((cs, int(k)), dtype=np.float32)
        n = ((nr0 + cs - 1) // cs) * ((nr1 + cs - 1) // cs)
        t0 = time.perf_counter()
        for _ in range(n):
            y @ x.T
        total += time.perf_counter() - t0
    return total / t_one


def main(args):
    print(f"numpy {np.__version__}; cores: {os.cpu_count()}; BLAS threads: "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset (BLAS decides)')}")
    print(f"graph: {args.layers} x MUL_MAT [{N_EMBD} <-> {N_FF}] x [{N_EMBD}|{N_FF} x {args.cols}]")
    n_max = max(args.threads)
    tp = ggml.threadpool_new(ggml.threadpool_params_default(n_max))
    results = {}
    try:
        cases = [(t, False) for t in args.types] + ([(t, True) for t in args.types] if args.repack else [])
        for tname, rp in cases:
            type_ = TYPES[tname]
            built = build(type_, args.layers, args.cols, repack=rp)
            if built is None:
                print(f"  {tname:5s} CPU_REPACK: not available for this type/machine")
                continue
            ctx, gf, out = built
            if rp:
                tname = tname + "+repack"
            timed = time_computes(gf, out, args.threads, args.repeat, tp)
            ref = timed[args.threads[0]][2]
            base = timed[args.threads[0]][0]
            flops = 2.0 * args.cols * N_EMBD * N_FF * args.layers
            for n, (t, t_med, o) in timed.items():
                results[(tname, n)] = t
                print(f"  {tname:12s} {n} thread{'s' if n > 1 else ' '}: {t * 1e3:8.1f} ms (median {t_med * 1e3:7.1f})"
                      f"  {flops / t / 1e9:6.2f} GFLOP/s  speedup x{base / t:4.2f}  "
                      f"{'bitwise same' if o == ref else 'DIFFERENT OUTPUT'}")
            if type_ == ggml.GGML_TYPE_F32 and not rp:
                f = f32_gil_free_share(gf, base)
                bound = 1.0 / ((1.0 - f) + f / n_max)
                print(f"        sgemm (GIL released) is {f * 100:.0f}% of the 1-thread time: Amdahl bound with "
                      f"{n_max} threads x{bound:.2f}")
            per_thread, busy, waits, nchunk = chunk_stats(gf, n_max, tp)
            if nchunk is None:
                continue            # compiled kernels: no chunk events
            print(f"        with {n_max} threads: chunks per node {nchunk}, chunks per thread {per_thread}, "
                  f"ms in chunks {{{', '.join(f'{k}: {v:.0f}' for k, v in busy.items())}}}, "
                  f"ms in barriers {{{', '.join(f'{k}: {v:.0f}' for k, v in waits.items())}}}")
            ggml.free(ctx)
    finally:
        ggml.threadpool_free(tp)
    if len(args.threads) > 1:
        n1, n2 = args.threads[0], args.threads[1]
        print(f"\nmachine ceiling: {n2} Python threads on GIL-free big sgemms run x{machine_ceiling(n2):.2f} "
              f"faster than 1 (a perfect {n2}-core machine: x{n2})")
        print(f"\nspeedup {n1} -> {n2} threads (target >= 1.5x):")
        for tname in sorted({k[0] for k in results}, key=lambda k: (k.endswith("repack"), k)):
            print(f"  {tname:12s} x{results[(tname, n1)] / results[(tname, n2)]:.2f}")
    return results


if __name__ == "__main__":
    main(ARGS)
