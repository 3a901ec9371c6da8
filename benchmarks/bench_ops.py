"""Op throughput of ggviz's CPU backend next to the real ggml (libggml-python), on SmolLM2-135M shapes.

    python benchmarks/bench_ops.py [--threads 1 2] [--budget 0.5] [--quick] [--no-real]

Each case builds a one-node graph in both libraries from the *same bytes* (quantized weights are quantized once by
ggviz and copied into both), plans it, then times ``graph_compute`` alone (median of repeats within the per-case time
budget). Real ggml runs on a persistent ``ggml_threadpool`` (as in llama.cpp). mul_mat FLOPs are 2*K*N*cols; for
the other ops the table shows time only. F32 / F16 mul_mat reproduce ggml_vec_dot_f32 / _f16 lane by lane (max rel
diff 0: bit-identical), which costs more than an sgemm would; the quantized ones agree to float32 noise. A script,
not a test: ggviz is a teaching re-implementation in NumPy and is expected to be much slower than ggml's SIMD C.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggviz import ggml  # noqa: E402
from ggviz.ggml import quants  # noqa: E402

try:
    from tests.oracle.ggml_lib import RealGGML, available, unavailable_reason  # noqa: E402
except Exception as e:  # noqa: BLE001
    RealGGML, available = None, (lambda: False)
    unavailable_reason = (lambda e=e: f"tests/oracle/ggml_lib.py not importable: {e}")

N_EMBD, N_FF, N_VOCAB, N_HEAD, N_HEAD_KV, HEAD_DIM, N_KV = 576, 1536, 49152, 9, 3, 64, 256


def _weights(type_, k, n, rng):
    """(raw bytes (n, row_size) for quantized types | float32 / float16 (n, k)) for a [k, n] weight."""
    if type_ == ggml.GGML_TYPE_F32:
        return rng.standard_normal((n, k), dtype=np.float32) * 0.05
    if type_ == ggml.GGML_TYPE_F16:
        return (rng.standard_normal((n, k), dtype=np.float32) * 0.05).astype(np.float16)
    base = rng.standard_normal((min(n, 256), k), dtype=np.float32) * 0.05
    raw = quants.quantize_row_ref(type_, base)                    # (rows, row_size) uint8
    reps = -(-n // raw.shape[0])
    return np.ascontiguousarray(np.tile(raw, (reps, 1))[:n])


def _time(fn, budget):
    fn()                                            # warm-up (lazy imports, caches)
    ts = []
    t_end = time.perf_counter() + budget
    while len(ts) < 3 or (time.perf_counter() < t_end and len(ts) < 50):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


class Case:
    """One op on given inputs: build(lib) returns (ctx, graph) for ggviz ('v') or real ggml ('r')."""

    def __init__(self, label, flops, inputs, build):
        self.label, self.flops, self.inputs, self.build = label, flops, inputs, build


def _new(lib, g, ctx, type_, ne):
    if lib == "v":
        return ggml.new_tensor(ctx, type_, len(ne), list(ne))
    return g.new_tensor(ctx, type_, len(ne), list(ne) + [1] * (4 - len(ne)))


def _fill(lib, g, t, arr):
    if lib == "v":
        dst = ggml.get_data(t)
        dst.reshape(-1).view(np.uint8)[:] = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    else:
        g.set_array(t, arr)


def mul_mat_case(type_, k, n, cols, rng):
    w = _weights(type_, k, n, rng)
    x = rng.standard_normal((cols, k), dtype=np.float32)

    def build(lib, g):
        mem = 64 * 1024 * 1024 + w.nbytes + x.nbytes * 2 + n * cols * 4
        ctx = ggml.init(mem) if lib == "v" else g.init(mem)
        a = _new(lib, g, ctx, type_, (k, n))
        b = _new(lib, g, ctx, ggml.GGML_TYPE_F32, (k, cols))
        _fill(lib, g, a, w)
        _fill(lib, g, b, x)
        op = (ggml if lib == "v" else g).mul_mat(ctx, a, b)
        return ctx, op

    tn = ggml.type_name(type_).upper()
    return Case(f"mul_mat {tn} {k}x{n} x {cols} col{'s' if cols > 1 else ''}", 2.0 * k * n * cols, None, build)


def kq_case(n_tokens, rng):
    """The attention scores of one layer without flash attention: F16 K cache [HEAD_DIM, N_KV, N_HEAD_KV] times
    the queries [HEAD_DIM, n_tokens, N_HEAD] (GQA: each K head serves N_HEAD / N_HEAD_KV query heads)."""
    k = (rng.standard_normal((N_HEAD_KV, N_KV, HEAD_DIM), dtype=np.float32)).astype(np.float16)
    q = rng.standard_normal((N_HEAD, n_tokens, HEAD_DIM), dtype=np.float32)

    def build(lib, g):
        ctx = ggml.init(32 << 20) if lib == "v" else g.init(32 << 20)
        a = _new(lib, g, ctx, ggml.GGML_TYPE_F16, (HEAD_DIM, N_KV, N_HEAD_KV))
        b = _new(lib, g, ctx, ggml.GGML_TYPE_F32, (HEAD_DIM, n_tokens, N_HEAD))
        _fill(lib, g, a, k)
        _fill(lib, g, b, q)
        return ctx, (ggml if lib == "v" else g).mul_mat(ctx, a, b)

    return Case(f"mul_mat kq F16 [{HEAD_DIM}, {N_KV}, {N_HEAD_KV}] x {n_tokens}", 2.0 * HEAD_DIM * N_KV * n_tokens
                * N_HEAD, None, build)


def rms_norm_case(n_tokens, rng):
    x = rng.standard_normal((n_tokens, N_EMBD), dtype=np.float32)

    def build(lib, g):
        ctx = ggml.init(16 << 20) if lib == "v" else g.init(16 << 20)
        a = _new(lib, g, ctx, ggml.GGML_TYPE_F32, (N_EMBD, n_tokens))
        _fill(lib, g, a, x)
        return ctx, (ggml if lib == "v" else g).rms_norm(ctx, a, 1e-5)

    return Case(f"rms_norm [{N_EMBD}, {n_tokens}]", None, None, build)


def soft_max_case(n_tokens, rng):
    x = rng.standard_normal((N_HEAD, n_tokens, N_KV), dtype=np.float32)
    mask = np.zeros((n_tokens, N_KV), dtype=np.float32)
    mask[:, N_KV // 2:] = -np.inf

    def build(lib, g):
        ctx = ggml.init(32 << 20) if lib == "v" else g.init(32 << 20)
        a = _new(lib, g, ctx, ggml.GGML_TYPE_F32, (N_KV, n_tokens, N_HEAD))
        m = _new(lib, g, ctx, ggml.GGML_TYPE_F32, (N_KV, n_tokens))
        _fill(lib, g, a, x)
        _fill(lib, g, m, mask)
        return ctx, (ggml if lib == "v" else g).soft_max_ext(ctx, a, m, 0.125, 0.0)

    return Case(f"soft_max_ext [{N_KV}, {n_tokens}, {N_HEAD}] + mask", None, None, build)


def rope_case(n_tokens, rng):
    x = rng.standard_normal((n_tokens, N_HEAD, HEAD_DIM), dtype=np.float32)
    pos = np.arange(n_tokens, dtype=np.int32)

    def build(lib, g):
        ctx = ggml.init(16 << 20) if lib == "v" else g.init(16 << 20)
        a = _new(lib, g, ctx, ggml.GGML_TYPE_F32, (HEAD_DIM, N_HEAD, n_tokens))
        p = _new(lib, g, ctx, ggml.GGML_TYPE_I32, (n_tokens,))
        _fill(lib, g, a, x)
        _fill(lib, g, p, pos)
        return ctx, (ggml if lib == "v" else g).rope_ext(ctx, a, p, None, HEAD_DIM, 0, 8192, 100000.0, 1.0, 0.0, 1.0,
                                                          32.0, 1.0)

    return Case(f"rope_ext NORMAL [{HEAD_DIM}, {N_HEAD}, {n_tokens}]", None, None, build)


def run_ggviz(case, n_threads, budget):
    ctx, op = case.build("v", None)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, op)
    plan = ggml.graph_plan(gf, n_threads)
    plan.work_data = np.zeros(max(plan.work_size, 1), dtype=np.uint8)
    t = _time(lambda: ggml.graph_compute(gf, plan), budget)
    out = ggml.get_data(op).copy()
    ggml.free(ctx)
    return t, out


_TP_PARAMS = {}


def _real_threadpool(g, n_threads):
    """A persistent ggml_threadpool, as llama.cpp keeps one (without it every compute starts new threads)."""
    buf = np.zeros(4096, dtype=np.uint8)          # struct ggml_threadpool_params (~528 bytes), over-allocated
    g.threadpool_params_init(buf.ctypes.data, n_threads)
    _TP_PARAMS[n_threads] = buf
    return g.threadpool_new(buf.ctypes.data)


def run_real(g, case, n_threads, budget):
    ctx, op = case.build("r", g)
    gf = g.new_graph(ctx)
    g.build_forward_expand(gf, op)
    tp = _real_threadpool(g, n_threads)
    try:
        t = _time(lambda: g.graph_compute(gf, n_threads, tp), budget)
    finally:
        g.threadpool_free(tp)
    out = g.get_array(op)
    g.free(ctx)
    return t, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of repeats per case and library")
    ap.add_argument("--quick", action="store_true", help="skip the 49152-row Q8_0 x 128 case")
    ap.add_argument("--no-real", action="store_true", help="ggviz only")
    args = ap.parse_args(argv)

    g = None
    if not args.no_real:
        if available():
            g = RealGGML()
        else:
            print(f"(real ggml unavailable: {unavailable_reason()}; timing ggviz only)")
    rng = np.random.default_rng(0)
    cases = []
    for cols in (1, 128):
        cases += [mul_mat_case(ggml.GGML_TYPE_Q4_1, N_EMBD, N_FF, cols, rng),
                  mul_mat_case(ggml.GGML_TYPE_Q4_1, N_FF, N_EMBD, cols, rng)]
        if not (args.quick and cols > 1):
            cases.append(mul_mat_case(ggml.GGML_TYPE_Q8_0, N_EMBD, N_VOCAB, cols, rng))
        cases.append(mul_mat_case(ggml.GGML_TYPE_F32, N_EMBD, N_EMBD, cols, rng))
        cases.append(mul_mat_case(ggml.GGML_TYPE_F16, N_EMBD, N_EMBD, cols, rng))
        cases.append(kq_case(cols, rng))
    for nt in (1, 128):
        cases += [rms_norm_case(nt, rng), soft_max_case(nt, rng), rope_case(nt, rng)]

    hdr = f"{'op':44s} {'thr':>3s} {'ggviz ms':>10s} {'GFLOP/s':>8s}"
    if g is not None:
        hdr += f" {'ggml ms':>9s} {'GFLOP/s':>8s} {'ggviz/ggml':>10s} {'max rel diff':>12s}"
    print(hdr)
    print("-" * len(hdr))
    for case in cases:
        for nt in args.threads:
            tv, ov = run_ggviz(case, nt, args.budget)
            line = f"{case.label:44s} {nt:3d} {tv * 1e3:10.3f} "
            line += f"{case.flops / tv / 1e9:8.2f}" if case.flops else f"{'':8s}"
            if g is not None:
                tr, orl = run_real(g, case, nt, args.budget)
                ov = ov.reshape(orl.shape)
                fin = np.isfinite(orl)
                diff = np.abs(ov[fin] - orl[fin]).max() / max(np.abs(orl[fin]).max(), 1e-30) if fin.any() else 0.0
                line += f" {tr * 1e3:9.3f} "
                line += f"{case.flops / tr / 1e9:8.2f}" if case.flops else f"{'':8s}"
                line += f" {tv / tr:9.1f}x {diff:12.2e}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
