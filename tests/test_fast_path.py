"""The fast path: the CPU_REPACK extra buffer type (ggviz/ggml/cpu/repack.py) and the compiled kernels
(ggviz/ggml/cpu/fast/), checked against ggviz's own faithful kernels.

* every op the compiled graph walk covers, at llama shapes (SmolLM2-135M: n_embd 576, 9 heads / 3 KV heads of 64,
  ffn 1536, F16 KV cache), 1 and several tokens: bit-exact with the faithful kernel, except ROPE (cos/sin in double,
  rounded once) and the MUL_MATs (float summation order), which must agree to NMSE <= 1e-10;
* MUL_MAT with repacked Q4_0 / Q4_1 / Q8_0 weights (including the tied 49152-row output matrix): NMSE <= 1e-10
  against the faithful MUL_MAT, identical results for 1 and 2 threads, and both dispatch routes (the executor's
  per-node ``ggml_cpu_extra_compute_forward`` and the compiled graph);
* the extra buffer type is used only when the weights were placed in it (``use_extra_bufts``, GGVIZ_NO_REPACK);
* the model: teacher-forced top-1 agreement with llama.cpp on the first 32 tokens of the reference run >= 0.9,
  and the step-through (faithful) path is what ``use_extra_bufts=False`` gives.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ggviz import ggml, trace
from ggviz.ggml import consts as C
from ggviz.ggml import quants as Q

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
fk = pytest.importorskip("ggviz.ggml.cpu.fast.kernels", reason="the compiled fast path needs Numba")
from ggviz.ggml.cpu.fast import compiler, intrinsics  # noqa: E402 - after the importorskip
from ggviz.ggml.cpu import traits  # noqa: E402 - after the importorskip
from ggviz.ggml.cpu import ggml_cpu, repack  # noqa: E402 - after the importorskip


F32, F16, I32, I64 = C.GGML_TYPE_F32, C.GGML_TYPE_F16, C.GGML_TYPE_I32, C.GGML_TYPE_I64
Q4_0, Q4_1, Q8_0 = C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q4_1, C.GGML_TYPE_Q8_0
MODEL = os.path.join(_ROOT, "data", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
REF_NPZ = os.path.join(_ROOT, "tests", "data", "llamacpp", "smollm2_teacher_forced_seq1.npz")


def _nmse(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    d = (b * b).sum()
    return float(((a - b) ** 2).sum() / d) if d else float(((a - b) ** 2).sum())


def _compute(gf, nth: int, fast: bool):
    plan = ggml_cpu.graph_plan(gf, nth)
    plan.extra = compiler.compile_graph(gf) if fast else None
    if fast:
        assert plan.extra is not None, "the compiled walk does not cover this graph"
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS


def _run_both(build, nth_list=(1, 2), seed=0):
    """build(ctx, rng) -> (output tensor, setter) ; returns {('faithful'|'fast', nth): output copy}."""
    out = {}
    for mode in ("faithful", "fast"):
        for nth in nth_list:
            rng = np.random.default_rng(seed)
            ctx = ggml.init(256 << 20)
            t = build(ctx, rng)
            gf = ggml.new_graph(ctx)
            ggml.build_forward_expand(gf, t)
            _compute(gf, nth, mode == "fast")
            out[(mode, nth)] = np.array(ggml.get_data(t), copy=True)
    return out


def _fill(t, a):
    ggml.get_data(t)[...] = np.asarray(a).reshape(ggml.get_data(t).shape)


def _f32(ctx, rng, *ne, scale=1.0):
    t = ggml.new_tensor(ctx, F32, len(ne), list(ne))
    _fill(t, (rng.standard_normal(int(np.prod(ne))) * scale).astype(np.float32))
    return t


def _check(out, exact=True, tol=1e-10):
    ref = out[("faithful", 1)]
    for k, v in out.items():
        if exact:
            assert np.array_equal(v.view(np.uint8), ref.view(np.uint8)), f"{k} differs from the faithful kernel"
        else:
            assert _nmse(v, ref) <= tol, f"{k}: NMSE {_nmse(v, ref):.3g}"
    # the compiled kernels give the same bits whatever the number of threads
    fast = [v for k, v in out.items() if k[0] == "fast"]
    for v in fast[1:]:
        assert np.array_equal(v.view(np.uint8), fast[0].view(np.uint8))


TOKENS = [1, 7]


# ---------------------------------------------------------------------------------------------------------------------
# element-wise / row ops
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("T", TOKENS)
def test_rms_norm_mul_fused(T):
    def build(ctx, rng):
        x = _f32(ctx, rng, 576, T)
        w = _f32(ctx, rng, 576)
        return ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-5), w)
    _check(_run_both(build))


@pytest.mark.parametrize("T", TOKENS)
def test_rms_norm_add(T):
    def build(ctx, rng):
        x = _f32(ctx, rng, 576, T)
        y = _f32(ctx, rng, 576, T)
        return ggml.add(ctx, ggml.rms_norm(ctx, x, 1e-5), y)
    _check(_run_both(build))


@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("mode,ext_factor,freq_scale", [(0, 0.0, 1.0), (2, 0.0, 1.0), (0, 1.0, 0.25)])
def test_rope(T, mode, ext_factor, freq_scale):
    """Normal and NeoX rope, and YaRN (ext_factor != 0): glibc's cosf/sinf are reproduced, so bit-exact."""
    def build(ctx, rng):
        x = _f32(ctx, rng, 64, 9, T)
        pos = ggml.new_tensor_1d(ctx, I32, T)
        _fill(pos, np.arange(37, 37 + T, dtype=np.int32) * 3)
        return ggml.rope_ext(ctx, x, pos, None, 64, mode, 8192, 100000.0, freq_scale, ext_factor, 1.0, 32.0, 1.0)
    _check(_run_both(build))


def test_rope_two_params_one_graph():
    """Two ROPEs of different params in one graph (the compiler works out a ROPE row's constants once per distinct
    op params): each row keeps its own, bit-exact with the faithful kernel."""
    def build(ctx, rng):
        x = _f32(ctx, rng, 64, 9, 3)
        pos = ggml.new_tensor_1d(ctx, I32, 3)
        _fill(pos, np.array([5, 77, 301], np.int32))
        y = ggml.rope_ext(ctx, x, pos, None, 64, 2, 8192, 100000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        return ggml.rope_ext(ctx, y, pos, None, 32, 0, 4096, 10000.0, 0.25, 1.0, 1.0, 32.0, 1.0)
    _check(_run_both(build))


@pytest.mark.parametrize("T", TOKENS)
def test_soft_max_masked(T):
    def build(ctx, rng):
        kq = _f32(ctx, rng, 256, T, 9, scale=4.0)
        mask = ggml.new_tensor_2d(ctx, F32, 256, T)
        m = np.where(np.arange(256)[None, :] <= (200 + np.arange(T))[:, None], 0.0, -np.inf).astype(np.float32)
        _fill(mask, m)
        return ggml.soft_max_ext(ctx, kq, mask, 0.125, 0.0)
    _check(_run_both(build))


@pytest.mark.parametrize("n", [1536, 1539])
def test_swiglu(n):
    def build(ctx, rng):
        a = _f32(ctx, rng, n, 3, scale=3.0)
        b = _f32(ctx, rng, n, 3)
        return ggml.swiglu_split(ctx, a, b)
    _check(_run_both(build))


def test_soft_max_tail():
    def build(ctx, rng):
        kq = _f32(ctx, rng, 67, 5, 2, scale=4.0)
        return ggml.soft_max_ext(ctx, kq, None, 0.3, 0.0)
    _check(_run_both(build))


@pytest.mark.parametrize("T", TOKENS)
def test_set_rows_f16_and_transposed(T):
    def build(ctx, rng):
        cache = ggml.new_tensor_2d(ctx, F16, 192, 512)
        _fill(cache, np.zeros(192 * 512, np.float16))
        v = _f32(ctx, rng, 192, T)
        idx = ggml.new_tensor_1d(ctx, I64, T)
        _fill(idx, np.array([5 + 3 * i for i in range(T)], np.int64))
        k = ggml.set_rows(ctx, cache, v, idx)
        # the transposed V cache: rows of one value
        vt = ggml.new_tensor_2d(ctx, F16, 512, 192)
        _fill(vt, np.zeros(192 * 512, np.float16))
        view = ggml.reshape_2d(ctx, vt, 1, 512 * 192)
        v1 = ggml.reshape_2d(ctx, ggml.cont(ctx, v), 1, 192 * T)
        ch = np.arange(192, dtype=np.int64)
        vidx = ggml.new_tensor_1d(ctx, I64, 192 * T)
        _fill(vidx, (ch[None, :] * 512 + (5 + 3 * np.arange(T))[:, None]).reshape(-1))
        s = ggml.set_rows(ctx, view, v1, vidx)
        return ggml.add(ctx, ggml.cpy(ctx, k, ggml.new_tensor_2d(ctx, F32, 192, 512)),
                        ggml.cpy(ctx, ggml.reshape_2d(ctx, s, 192, 512), ggml.new_tensor_2d(ctx, F32, 192, 512)))
    _check(_run_both(build))


@pytest.mark.parametrize("wtype", [Q8_0, Q4_0, Q4_1, F16])
def test_get_rows(wtype):
    def build(ctx, rng):
        w = ggml.new_tensor_2d(ctx, wtype, 576, 100)
        vals = rng.standard_normal((100, 576)).astype(np.float32)
        if wtype == F16:
            _fill(w, vals.astype(np.float16))
        else:
            raw = Q.quantize_row_ref(wtype, vals)
            ggml.get_data(w).reshape(-1).view(np.uint8)[:] = np.asarray(raw).reshape(-1).view(np.uint8)
        ids = ggml.new_tensor_1d(ctx, I32, 5)
        _fill(ids, np.array([3, 99, 0, 3, 42], np.int32))
        e = ggml.get_rows(ctx, w, ids)
        ids2 = ggml.new_tensor_1d(ctx, I32, 2)
        _fill(ids2, np.array([4, 1], np.int32))
        return ggml.get_rows(ctx, e, ids2)
    _check(_run_both(build))


@pytest.mark.parametrize("T", TOKENS)
def test_cont_permuted(T):
    def build(ctx, rng):
        x = _f32(ctx, rng, 64, T, 9)
        p = ggml.permute(ctx, x, 0, 2, 1, 3)
        return ggml.cont_2d(ctx, p, 64 * 9, T)
    _check(_run_both(build))


@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("which", ["kq", "kqv"])
def test_mul_mat_f16_kv(T, which):
    """kq = K^T q and kqv = V^T softmax with an F16 cache, GQA broadcast 9 -> 3 heads (src1 converted to F16)."""
    def build(ctx, rng):
        if which == "kq":
            kc = ggml.new_tensor_3d(ctx, F16, 64, 3, 256)
            _fill(kc, rng.standard_normal(64 * 3 * 256).astype(np.float16))
            k = ggml.permute(ctx, kc, 0, 2, 1, 3)                          # [64, 256, 3]
            q = ggml.permute(ctx, _f32(ctx, rng, 64, 9, T), 0, 2, 1, 3)     # [64, T, 9]
            return ggml.mul_mat(ctx, k, q)                                  # [256, T, 9]
        vt = ggml.new_tensor_3d(ctx, F16, 256, 64, 3)
        _fill(vt, rng.standard_normal(64 * 3 * 256).astype(np.float16))
        kq = _f32(ctx, rng, 256, T, 9)
        return ggml.mul_mat(ctx, vt, kq)                                    # [64, T, 9]
    _check(_run_both(build), exact=False)


# ---------------------------------------------------------------------------------------------------------------------
# repacked MUL_MAT
# ---------------------------------------------------------------------------------------------------------------------

def _weight_ctx(qtype, M, K, rng, place: bool):
    """A Q weight in a no_alloc context (data in a separate array, like the GGUF mapping), optionally placed in
    the CPU_REPACK buffer."""
    W = rng.standard_normal((M, K)).astype(np.float32) * 0.05
    raw = np.asarray(Q.quantize_row_ref(qtype, W)).reshape(-1).view(np.uint8)
    ctx_w = ggml.init(ggml.tensor_overhead() * 2, None, True)
    w = ggml.new_tensor_2d(ctx_w, qtype, K, M)
    store = ggml.init(raw.nbytes + ggml.tensor_overhead() + 256)
    holder = ggml.new_tensor_1d(store, C.GGML_TYPE_I8, raw.nbytes)
    ggml.get_data(holder).reshape(-1).view(np.uint8)[:] = raw
    w.data = holder.data
    buf = repack.place_weights([w]) if place else None
    return w, (ctx_w, store, holder, buf)


def _mm_case(qtype, M, K, T, nth, place, route, seed=1):
    rng = np.random.default_rng(seed)
    w, keep = _weight_ctx(qtype, M, K, rng, place)
    ctx = ggml.init(64 << 20)
    x = _f32(ctx, rng, K, T)
    y = ggml.mul_mat(ctx, w, x)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, y)
    plan = ggml_cpu.graph_plan(gf, nth)
    if route == "node":
        plan.extra = None                                    # executor: per-node extra_compute_forward
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS
    return np.array(ggml.get_data(y), copy=True), plan, keep


LLAMA_SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536)]


@pytest.mark.parametrize("qtype", [Q4_1, Q4_0, Q8_0])
@pytest.mark.parametrize("M,K", LLAMA_SHAPES)
@pytest.mark.parametrize("T", [1, 5])
def test_repacked_mul_mat(qtype, M, K, T):
    ref, plan_ref, _ = _mm_case(qtype, M, K, T, 1, place=False, route="graph")
    assert plan_ref.extra is None
    results = []
    for nth in (1, 2):
        for route in ("graph", "node"):
            out, plan, _ = _mm_case(qtype, M, K, T, nth, place=True, route=route)
            if route == "graph":
                assert plan.extra is not None
            assert _nmse(out, ref) <= 1e-10, (nth, route, _nmse(out, ref))
            results.append(out)
    for r in results[1:]:
        assert np.array_equal(r, results[0])


def _oracle():
    try:
        from tests.oracle.ggml_lib import RealGGML, available
    except Exception:  # noqa: BLE001
        return None
    return RealGGML() if available() else None


@pytest.mark.parametrize("qtype", [Q4_1, Q4_0, Q8_0])
@pytest.mark.parametrize("M,K,T", [(576, 576, 1), (1536, 576, 3), (576, 1536, 2)])
def test_repacked_mul_mat_bitexact_with_real_ggml(qtype, M, K, T):
    """The compiled kernels do what ggml's AVX2 vec_dot does, lane for lane: same bits as the real ggml."""
    g = _oracle()
    if g is None or not intrinsics.HAVE_AVX2:
        pytest.skip("real ggml oracle (libggml-python) or AVX2 not available")
    out, plan, _ = _mm_case(qtype, M, K, T, 2, place=True, route="graph")
    assert plan.extra is not None
    rng = np.random.default_rng(1)
    W = rng.standard_normal((M, K)).astype(np.float32) * 0.05
    raw = np.asarray(Q.quantize_row_ref(qtype, W)).reshape(-1).view(np.uint8)
    X = rng.standard_normal((T, K)).astype(np.float32)
    ctx = g.init(64 << 20)
    try:
        w = g.new_tensor_2d(ctx, qtype, K, M)
        g.set_array(w, raw)
        x = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, K, T)
        g.set_array(x, X)
        y = g.mul_mat(ctx, w, x)
        gf = g.new_graph(ctx)
        g.build_forward_expand(gf, y)
        g.graph_compute(gf, 1)
        real = g.to_float(y).reshape(out.shape).copy()
    finally:
        g.free(ctx)
    assert np.array_equal(out, real)


@pytest.mark.parametrize("qtype", [Q4_0, Q4_1, Q8_0, C.GGML_TYPE_Q5_0])
def test_compiled_repack_is_the_numpy_repack(qtype):
    """The compiled repack (fast.kernels.repack_blocks_8x4, used at model load for every weight)
    moves the same bytes as the NumPy transposes (repack.repack_blocks_numpy), for weights read-only (the mapping)
    or in memory."""
    rows, ne00 = 24, 96
    raw = np.random.default_rng(qtype).integers(0, 256, rows * Q.row_size(qtype, ne00), dtype=np.uint8)
    tr = repack._traits_for_type(qtype)
    t = ggml.new_tensor_2d(ggml.init(1 << 16, no_alloc=True), qtype, ne00, rows)
    for writeable in (True, False):
        src = raw.copy()
        src.flags.writeable = writeable
        blocks = np.ascontiguousarray(src).view(Q.BLOCK_DTYPES[qtype]).reshape(rows, ne00 // 32)
        if qtype == C.GGML_TYPE_Q5_0:
            blocks = repack.q5_0_as_q8_0(blocks)
        ref = repack.repack_blocks_numpy(tr, blocks, rows, ne00)
        got = repack.repack_blocks_compiled(tr, blocks, rows, ne00)
        for r in (got, tr.repack(t, src)):       # the kernel, and what the load uses (one of the two)
            assert np.array_equal(r.qs, ref.qs) and np.array_equal(r.d.view(np.uint8), ref.d.view(np.uint8))
        assert got.qs.dtype == ref.qs.dtype and got.d.dtype == ref.d.dtype
        assert (got.m is None) == (ref.m is None) == (qtype != Q4_1)
        if got.m is not None:
            assert np.array_equal(got.m.view(np.uint8), ref.m.view(np.uint8))


def test_quantize_row_q8_vector_block_is_the_scalar_loop():
    """rowdot.quantize_row_q8 on contiguous rows (a block at a time in vector IR, q8_block) writes the bytes of its
    scalar loop (the strided rows' path, which follows arch/x86's quantize_row_q8_0/1 lane for lane), with and
    without Q8_1's s, for blocks with NaN, infinities, zeros, ties, huge and tiny values."""
    from ggviz.ggml.cpu.fast.rowdot import mmq_layout, quantize_row_q8
    rng = np.random.default_rng(11)
    n, k = 9, 256
    x = (rng.standard_normal((n, k)) * rng.choice([1e-30, 1e-3, 1.0, 1e30], (n, 1))).astype(np.float32)
    x[1, :32] = 0.0
    x[2, 5], x[2, 40], x[2, 70] = np.nan, np.inf, -np.inf
    x[3, :32] = np.arange(32) - 15.5                     # ties after scaling
    x[4, 33] = -1e38
    strided = np.zeros((n, 2 * k), np.float32)
    strided[:, ::2] = x
    for with_sum in (False, True):
        outs = []
        for src, nb00 in ((x, 4), (strided, 8)):
            o_q, o_d, o_s, o_sum, total = mmq_layout(k, n)
            w = np.full(total, 0x55, np.uint8)
            nb = k // 32
            for r in range(n):
                quantize_row_q8(src[r].ctypes.data, nb00, k, w.ctypes.data + o_q + r * k,
                                w.ctypes.data + o_d + r * nb * 4, w.ctypes.data + o_s + r * nb * 4,
                                w.ctypes.data + o_sum + r * nb * 4, with_sum)
            outs.append(w)
        assert np.array_equal(outs[0], outs[1])


def test_q5_0_rows_tails_are_vec_dot():
    """fast/sgemm.py's q5_0_rows (tinyBLAS_Q0's 4x2 tiles on ggml's 22-byte Q5_0 blocks) gives ggml_vec_dot_q5_0_q8_0's
    bits (the faithful cpu/quants.vec_dot, itself checked against llama.cpp) for any row range and column count: the
    4-row tiles, the rows left over (a range that is not a multiple of 4) and an odd last column."""
    from ggviz.ggml.cpu import quants as CQ
    from ggviz.ggml.cpu.fast import sgemm
    from ggviz.ggml.cpu.fast.rowdot import mmq_layout
    rng = np.random.default_rng(5)
    rows, ne00, ncols, t5 = 11, 96, 5, C.GGML_TYPE_Q5_0
    nb = ne00 // 32
    raw = rng.integers(0, 256, rows * Q.row_size(t5, ne00), dtype=np.uint8)
    raw.view(Q.BLOCK_DTYPES[t5])["d"] = Q.fp32_to_fp16(rng.uniform(-0.05, 0.05, rows * nb).astype(np.float32))
    x = rng.standard_normal((ncols, ne00)).astype(np.float32)
    want = CQ.vec_dot(t5, raw.reshape(rows, -1), CQ.from_float(C.GGML_TYPE_Q8_0, x))
    o_q, o_d, _, _, total = mmq_layout(ne00, ncols)
    w = np.zeros(total, np.uint8)
    fk.mmq_quantize(x.ctypes.data, ne00, ncols, 1, ne00 * 4, ne00 * 4 * ncols, 4, w.ctypes.data, False, 0, 1)
    scratch = np.zeros(sgemm.Q5_ROWS * nb * (sgemm.Q5_UNPACKED + 4), np.uint8)
    got = np.full((ncols, rows), np.nan, np.float32)
    for r0, r1 in ((0, 4), (4, 11)):            # a full tile, then a tile and 3 rows left over
        sgemm.q5_0_rows(raw.ctypes.data, nb * sgemm.Q5_0_SIZE, r0, r1, nb, w.ctypes.data + o_q, ne00,
                        w.ctypes.data + o_d, nb * 4, ncols, got.ctypes.data, rows * 4, scratch.ctypes.data)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_repacked_output_matrix():
    """The tied Q8_0 output matrix: 49152 rows."""
    ref, _, _ = _mm_case(Q8_0, 49152, 576, 2, 1, place=False, route="graph")
    o1, _, _ = _mm_case(Q8_0, 49152, 576, 2, 1, place=True, route="graph")
    o2, _, _ = _mm_case(Q8_0, 49152, 576, 2, 2, place=True, route="graph")
    assert _nmse(o1, ref) <= 1e-10
    assert np.array_equal(o1, o2)


def test_dispatch_only_for_repacked_weights():
    rng = np.random.default_rng(3)
    w, keep = _weight_ctx(Q4_1, 64, 64, rng, place=True)
    w2, keep2 = _weight_ctx(Q4_1, 64, 64, rng, place=False)
    assert ggml.backend.backend_buft_name(ggml.backend.buffer_at(w.buffer).buft) == "CPU_REPACK"
    assert repack.tensor_traits_of(w) is not None and w.extra != 0
    assert w2.buffer == 0 and w2.extra == 0
    ctx = ggml.init(1 << 20)
    x = _f32(ctx, rng, 64, 2)
    y1 = ggml.mul_mat(ctx, w, x)
    y2 = ggml.mul_mat(ctx, w2, x)
    ext = repack.repack_buffer_type().context
    assert ext.supports_op(None, y1) and ext.get_tensor_traits(y1) is not None
    assert not ext.supports_op(None, y2) and ext.get_tensor_traits(y2) is None
    assert traits.extra_work_size(1, y1) is not None and traits.extra_work_size(1, y2) is None
    # a graph with only non-repacked weights is not compiled; one with a repacked weight is
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, y2)
    assert ggml_cpu.graph_plan(gf, 1).extra is None
    gf1 = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf1, y1)
    assert ggml_cpu.graph_plan(gf1, 1).extra is not None


def test_no_repack_env():
    code = ("import os; os.environ['GGVIZ_NO_REPACK']='1'\n"
            "from ggviz.ggml.cpu import traits\n"
            "assert traits.get_extra_buffer_types() == []\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=_ROOT))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_numba_blas_probe_deferred():
    """Numba's CPU target set up by a ggviz kernel does not import scipy.linalg (its BLAS probe is deferred,
    fast/__init__.py), and a jitted np.dot / @ afterwards still gets Numba's BLAS path (the real check runs then)."""
    code = ("import sys, numpy as np, numba\n"
            "from ggviz.ggml.cpu.fast import kernels as fk\n"
            "fk.mmq_layout(576, 1)\n"                       # a cached kernel: Numba's CPU target is set up
            "import numba.np.arraymath as am\n"
            "assert am._HAVE_BLAS is True, am._HAVE_BLAS\n"
            "assert 'scipy.linalg' not in sys.modules\n"
            "f = numba.njit(lambda a, b: (np.dot(a, b), a @ b))\n"
            "a = np.arange(12.0).reshape(3, 4); b = np.arange(8.0).reshape(4, 2)\n"
            "d, m = f(a, b)\n"
            "assert (d == a @ b).all() and (m == a @ b).all()\n"
            "assert 'scipy.linalg.cython_blas' in sys.modules\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=_ROOT))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_cached_kernel_loads_without_numba_registries():
    """A fresh process loads a cached ggviz kernel without Numba's compiler registries (fast.cached_without_registries:
    Numba's implementation modules, e.g. numba.np.arraymath, stay unimported) and, where fast._cache_format_with_symbols
    applies, without parsing its LLVM bitcode (the library's defined names come from the entry; the bitcode stays
    bytes) and without compiling NRT's LLVM helpers (fast._nrt_c_symbols); the kernel gives what it gives in this
    process; a function compiled afterwards in that process that calls the loaded kernel links its bitcode (parsed
    then) and gives the same; and a function compiled afterwards still finds Numba's implementations (Numba's compiler
    refreshes its contexts before it types anything)."""
    from ggviz.ggml.cpu import fast
    from ggviz.ggml.cpu.fast import kernels as fk
    code = ("import sys, numpy as np, numba\n"
            "from ggviz.ggml.cpu.fast import kernels as fk\n"
            "r = fk.mmq_layout(576, 3)\n"
            "hits = sum(fk.mmq_layout._cache_hits.values())\n"
            "print('hits', hits, 'arraymath', 'numba.np.arraymath' in sys.modules)\n"
            "print('nrt', numba.core.runtime.rtsys._init)\n"
            "lib = fk.mmq_layout.overloads[fk.mmq_layout.signatures[0]].library\n"
            "print('lib', type(lib).__name__, getattr(lib, '_shared_bitcode', None) is not None,"
            " lib._shared_module is None, lib.get_pointer_to_function("
            "fk.mmq_layout.overloads[fk.mmq_layout.signatures[0]].fndesc.llvm_cpython_wrapper_name) != 0)\n"
            "g = numba.njit(lambda n, m: fk.mmq_layout(n, m))\n"      # links mmq_layout's library into g's
            "assert g(576, 3) == r, (g(576, 3), r)\n"
            "print('linked', getattr(lib, '_shared_bitcode', None) is None, lib._shared_module is not None)\n"
            "f = numba.njit(lambda a: np.cumsum(a).sum())\n"         # lowered by numba.np.arraymath
            "assert f(np.arange(5.0)) == 20.0\n"
            "assert 'numba.np.arraymath' in sys.modules\n"
            "print('layout', *r)")
    env = dict(os.environ, PYTHONPATH=_ROOT)
    for _ in range(2):          # the first process writes the kernel to Numba's cache if it was not there
        r = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    if lines["hits"].startswith("0 "):
        pytest.skip("Numba's cache is not writable here: every process compiles the kernel")
    assert lines["hits"].endswith("arraymath False"), lines
    assert lines["layout"] == " ".join(str(x) for x in fk.mmq_layout(576, 3))
    assert lines["linked"] == "True True", lines
    # NRT's LLVM helpers not compiled by a load (fast._nrt_c_symbols), where that applies
    assert lines["nrt"] == str(fast._nrt_c_symbols is None), lines
    if fast._CacheFormatWithSymbols is not None:
        # loaded in ggviz's format: the bitcode kept as bytes, not parsed; the entry point found by its name
        assert lines["lib"] == "_LinkOnDemandLibrary True True True", lines
    else:
        assert lines["lib"].startswith("JITCodeLibrary "), lines


_CACHE_FORMAT_MODULE = """
import os
import numpy as np
from numba import njit
from ggviz.ggml.cpu.fast import cached_without_registries


def _loader(dispatcher):
    return cached_without_registries(dispatcher) if os.environ["NBFMT"] == "ours" else dispatcher


@_loader
@njit(cache=True)
def helper(x, k):
    return np.float32(x) * np.float32(k) + np.float32(0.1)


@_loader
@njit(cache=True)
def kernel(a, k):
    s = np.float32(0.0)
    for x in a:
        s = np.float32(s + helper(x, k))
    return s


@_loader
@njit(cache=True)
def table(n, k):
    out = np.empty(n, np.float32)       # NRT_MemInfo_alloc_aligned; returned through NRT_adapt_ndarray_to_python
    for i in range(n):
        out[i] = helper(i, k)
    return out
"""


def test_cache_format_with_symbols_round_trip(tmp_path):
    """ggviz's cache entries (fast._cache_format_with_symbols) next to Numba's own, fresh processes sharing one cache
    directory: an entry in Numba's format is not read by ggviz's loader (its index key differs: the function is
    compiled again) nor ggviz's by Numba's; each then loads its own; a loaded kernel's bits are the compiled kernel's,
    its entry point is found, a loaded kernel allocates and returns an array before Numba's runtime has compiled its
    LLVM helpers (fast._nrt_c_symbols), and a function compiled later that calls the loaded helper links it and gives
    the same bits. A source edit still recompiles (Numba's stamp)."""
    from ggviz.ggml.cpu import fast
    if fast._CacheFormatWithSymbols is None:
        pytest.skip("this Numba's internals differ: ggviz's cache format is not used")
    mod = tmp_path / "nbfmt.py"
    mod.write_text(_CACHE_FORMAT_MODULE)
    code = ("import sys, numpy as np, numba\n"
            "import nbfmt\n"
            "h, k = nbfmt.helper, nbfmt.kernel\n"
            "a = np.linspace(-3, 5, 1001).astype(np.float32)\n"
            "s = k(a, 0.37)\n"
            "lib = k.overloads[k.signatures[0]].library\n"
            "print('k', sum(k._cache_hits.values()), sum(k._cache_misses.values()), type(lib).__name__,"
            " float(s).hex())\n"
            "t = nbfmt.table(1000, 0.37)\n"                          # NRT's C functions from loaded code
            "print('t', sum(nbfmt.table._cache_hits.values()), np.float32(t.sum()).tobytes().hex(),"
            " numba.core.runtime.rtsys._init)\n"
            "hv = h(2.5, 0.37)\n"
            "g = numba.njit(lambda x, kk: h(x, kk))\n"               # links the (maybe loaded) helper's library
            "print('h', sum(h._cache_hits.values()), type(h.overloads[h.signatures[0]].library).__name__,"
            " float(hv).hex(), float(g(2.5, 0.37)).hex())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), _ROOT]),
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run(which):
        r = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True,
                           env=dict(env, NBFMT=which))
        assert r.returncode == 0, r.stderr
        return {ln.split(" ", 1)[0]: ln.split(" ")[1:] for ln in r.stdout.splitlines()}

    numba1 = run("numba")              # compiles, writes Numba's entries
    ours1 = run("ours")                # must not load Numba's entries: compiles, writes ggviz's
    ours2 = run("ours")                # loads ggviz's
    numba2 = run("numba")              # loads Numba's own, untouched by ggviz's
    assert numba1["k"][:3] == ["0", "1", "JITCodeLibrary"], numba1
    assert ours1["k"][:3] == ["0", "1", "JITCodeLibrary"], ours1
    assert ours2["k"][:3] == ["1", "0", "_LinkOnDemandLibrary"], ours2
    assert numba2["k"][:3] == ["1", "0", "JITCodeLibrary"], numba2
    assert ours2["h"][:2] == ["1", "_LinkOnDemandLibrary"], ours2
    # loading needs NRT's C functions only: its LLVM helpers are compiled when something is compiled
    assert ours2["t"][0] == "1" and ours2["t"][2] == str(fast._nrt_c_symbols is None), ours2
    assert len({r["t"][1] for r in (numba1, ours1, ours2, numba2)}) == 1
    # the same bits everywhere: the kernel's sum, the helper called from Python and from a function compiled later
    assert len({r["k"][3] for r in (numba1, ours1, ours2, numba2)}) == 1
    assert len({x for r in (numba1, ours1, ours2, numba2) for x in r["h"][2:]}) == 1
    # an edited source is compiled again (Numba's source stamp), in ggviz's format as in Numba's
    mod.write_text(_CACHE_FORMAT_MODULE.replace("np.float32(0.1)", "np.float32(0.2)"))
    st = mod.stat()
    os.utime(mod, (st.st_atime, st.st_mtime + 2))
    ours3 = run("ours")
    assert ours3["k"][:3] == ["0", "1", "JITCodeLibrary"], ours3
    assert ours3["k"][3] != ours2["k"][3]


def test_cache_format_guard_takes_numbas_path(monkeypatch, tmp_path):
    """Where Numba's loader or its runtime's initialize does anything else than the ones ggviz mirrors (its code
    refers to other names), ggviz's cache format and NRT shortcut are not used: entries and loads are Numba's own
    (kind 'object', the bitcode parsed, rtsys.initialize) -- in this process, and in a fresh one whose Numba differs,
    where a kernel still compiles, is cached, loads from the cache and gives the same."""
    from numba.core import codegen
    from ggviz.ggml.cpu import fast
    if fast._CacheFormatWithSymbols is None:
        pytest.skip("this Numba's internals differ already")
    real = codegen.CPUCodeLibrary._unserialize.__func__

    def changed(cls, cg, state):
        print("something new")
        return real(cls, cg, state)
    monkeypatch.setattr(codegen.CPUCodeLibrary, "_unserialize", classmethod(changed))
    assert fast._cache_format_with_symbols() == (None, None)
    monkeypatch.setattr(codegen.CPUCodeLibrary, "_unserialize", classmethod(real))
    assert fast._cache_format_with_symbols()[0] is not None
    assert fast._nrt_c_symbols_registrar() is not None

    code = ("import sys\n"
            "from numba.core import codegen\n"
            "from numba.core.runtime import rtsys\n"
            "real = codegen.CPUCodeLibrary._unserialize.__func__\n"
            "def changed(cls, cg, state):\n"
            "    return real(cls, cg, state)\n"
            "codegen.CPUCodeLibrary._unserialize = classmethod(changed)\n"
            "real_init = type(rtsys).initialize\n"
            "def initialize(self, ctx):\n"
            "    return real_init(self, ctx)\n"
            "type(rtsys).initialize = initialize\n"
            "from ggviz.ggml.cpu import fast\n"
            "from ggviz.ggml.cpu.fast import rowdot\n"
            "assert fast._CacheFormatWithSymbols is None and fast._nrt_c_symbols is None\n"
            "r = rowdot.mmq_layout(576, 3)\n"
            "d = rowdot.mmq_layout\n"
            "print(sum(d._cache_hits.values()), type(d.overloads[d.signatures[0]].library).__name__,"
            " type(d._cache._impl).__name__, rtsys._init, 'numba.np.arraymath' in sys.modules, *r)\n")
    env = dict(os.environ, PYTHONPATH=_ROOT, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    outs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.split())
    from ggviz.ggml.cpu.fast import rowdot
    assert outs[0][:4] == ["0", "JITCodeLibrary", "CompileResultCacheImpl", "True"], outs
    assert outs[1][:5] == ["1", "JITCodeLibrary", "CompileResultCacheImpl", "True", "False"], outs
    assert outs[0][5:] == outs[1][5:] == [str(x) for x in rowdot.mmq_layout(576, 3)]

# ---------------------------------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ref_npz():
    if not os.path.exists(REF_NPZ):
        src = "/work/shared/reference/llamacpp/smollm2_teacher_forced_seq1.npz"
        if os.path.exists(src):
            os.makedirs(os.path.dirname(REF_NPZ), exist_ok=True)
            import shutil
            shutil.copy(src, REF_NPZ)
    if not os.path.exists(REF_NPZ) or not os.path.exists(MODEL):
        pytest.skip("model or llama.cpp reference not available")
    return np.load(REF_NPZ)


def _buft_name(t):
    from ggviz.ggml import backend as B
    return B.backend_buft_name(B.buffer_at(t.buffer).buft) if t.buffer else None


def test_model_weights_placement():
    if not os.path.exists(MODEL):
        pytest.skip("model not fetched")
    from ggviz.llama.model import model_default_params, model_load_from_file
    mp = model_default_params()
    assert mp.use_extra_bufts is True
    m = model_load_from_file(MODEL, mp)
    assert isinstance(m.layers[0].wq.py_extra, repack.RepackedWeight)
    assert isinstance(m.output.py_extra, repack.RepackedWeight)
    assert _buft_name(m.layers[0].ffn_down) == "CPU_REPACK"
    assert _buft_name(m.output_norm) != "CPU_REPACK"          # norms stay in the mapping
    mp.use_extra_bufts = False
    m2 = model_load_from_file(MODEL, mp)
    assert m2.layers[0].wq.py_extra is None and m2.layers[0].wq.extra == 0
    assert _buft_name(m2.layers[0].wq) != "CPU_REPACK"


@pytest.mark.parametrize("nth", [2])
def test_teacher_forced_fast_path(ref_npz, nth, monkeypatch):
    from ggviz.llama.batch import batch_add, batch_init
    from ggviz.llama.context import context_default_params, init_from_model
    from ggviz.llama.model import model_load_from_file
    m = model_load_from_file(MODEL)
    p = context_default_params()
    p.n_ctx = 512
    p.n_threads = p.n_threads_batch = nth
    ctx = init_from_model(m, p)
    ids = ref_npz["ids"][:32]
    ref = ref_npz["logits"][:32].astype(np.float64)
    b = batch_init(len(ids))
    for i, t in enumerate(ids):
        batch_add(b, int(t), i, [0], True)
    compiled = []
    plan_graph = compiler.plan_graph

    def spy(cgraph, n_threads):
        fg = plan_graph(cgraph, n_threads)
        compiled.append(fg is not None)
        return fg
    monkeypatch.setattr(compiler, "plan_graph", spy)
    assert ctx.decode(b) == 0
    lg = ctx.get_logits().astype(np.float64)
    top1 = float((lg.argmax(-1) == ref.argmax(-1)).mean())

    def lsm(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    lp, lq = lsm(ref), lsm(lg)
    kl = float((np.exp(lp) * (lp - lq)).sum(-1).mean())
    assert top1 >= 0.9, top1
    assert kl <= 0.01, kl
    # the graph went through the compiled walk
    assert compiled and all(compiled)


def test_a_new_program_starts_on_one_thread_after_a_compute_showed_the_cores_taken(monkeypatch):
    """The thread policy's view of the machine (compiler._last_compute: the last compute's wall time and each
    thread's CPU time): when even its busiest thread ran under 1 - CONTENDED (75 %) of it, the next new program
    starts on one thread (not one a trace listener records: the views show ggml's walk on all threads); one thread
    running nearly all the time (one-time costs, uneven work) is no sign, nor a compute older than PROBE_NS, nor one
    shorter than MIN_SAMPLE_NS. Values are not in question (ggml's partitions give the same bits on any thread
    count)."""
    import time
    P, F = np.zeros((0, 56), np.int64), np.zeros((0, 8), np.float64)
    monkeypatch.setattr(compiler, "_idle_mark", [0, 0, 0])
    monkeypatch.setattr(compiler, "_start_mark", [0, -1, 0])           # (the CPUs' idle time: not known)

    def starts(wall, cpu, age=0):
        monkeypatch.setattr(compiler, "_last_compute", [time.perf_counter_ns() - age, wall, cpu, None, None])
        return compiler.FastGraph(P, F, [], [], 0).n_next

    monkeypatch.setattr(compiler, "_last_compute", [0, 0, [], None, None])
    assert compiler.FastGraph(P, F, [], [], 0).n_next > 1           # nothing computed yet
    assert starts(10_000_000, [7_300_000, 9_800_000]) > 1           # uneven work: thread 1 ran 98 %
    assert starts(10_000_000, [9_900_000, 1_000_000]) > 1           # one-time costs in thread 0
    assert starts(10_000_000, [5_600_000, 4_500_000]) == 1          # every thread off its core a quarter+
    assert starts(10_000_000, [5_600_000, None]) == 1               # (a thread that sat this one out)
    assert starts(10_000_000, [6_000_000]) == 1                     # one thread alone, off its core
    assert starts(10_000_000, [5_600_000, 4_500_000], age=compiler.FastGraph.PROBE_NS) > 1   # too old
    assert starts(compiler.MIN_SAMPLE_NS // 2, [5_000, 4_000]) > 1  # too short to tell
    monkeypatch.setattr(compiler, "_last_compute",
                        [time.perf_counter_ns(), 10_000_000, [5_600_000, 4_500_000], None, None])
    with trace.recording(("cpu.plan",)):                            # not a program a listener records
        assert compiler.FastGraph(P, F, [], [], 0).n_next > 1


def _policy_graph():
    P, F = np.zeros((0, 56), np.int64), np.zeros((0, 8), np.float64)
    return compiler.FastGraph(P, F, [], [], 0)


def _policy_compute(fg, n_max, wall_ns, slept_frac=0.0, cpu=None):
    """One compute as compiler.FastGraph.compute_thread's thread 0 ends it (no walk: the policy's inputs only)."""
    import time
    from ggviz.ggml.cpu.fast.program import SYNC_SLEEP_TICKS
    fg.begin_compute(n_max)
    n_use = fg.n_use_now
    fg.sync[SYNC_SLEEP_TICKS] = int(slept_frac * 1000 * (n_use - 1))
    fg._choose_threads(n_max, n_use, wall_ns, 1000)
    compiler._last_compute[:] = [time.perf_counter_ns(), wall_ns, cpu or [wall_ns] * n_use, fg.serial,
                                 (fg.n_single, fg.single_ns, fg.probe_every, fg.probe_ns)
                                 if n_use < n_max and fg.n_next == 1 else None]
    return n_use


def test_a_program_continues_the_one_thread_mode_of_the_program_before_it(monkeypatch):
    """A compute the policy ran on one thread of two says nothing of contention by its CPU time (one thread alone
    looks uncontended); its program's mode does. The next program -- a new one, or one that comes back, as the
    decode program after a prompt -- continues that mode and its probe schedule, and forgets its own wall times on
    all threads (from before the load came). Decisions only: the inputs are the ones compute_thread gives."""
    if compiler.N_CPUS < 2:
        pytest.skip("one CPU: the policy has nothing to choose")
    monkeypatch.setattr(compiler, "_last_compute", [0, 0, [], None, None])
    monkeypatch.setattr(compiler, "_idle_mark", [0, 0, 0])
    monkeypatch.setattr(compiler, "_read_idle", lambda: [1, -1, 0])     # the other cores: not known
    monkeypatch.setattr(compiler, "_start_mark", [0, -1, 0])
    decode = _policy_graph()
    assert [_policy_compute(decode, 2, 5_000_000) for _ in range(3)] == [2, 2, 2]    # quiet: all threads
    prompt = _policy_graph()
    assert prompt.n_next > 1
    assert _policy_compute(prompt, 2, 60_000_000, cpu=[40_000_000, 38_000_000]) == 2  # the cores were taken meanwhile
    # the decode program comes back: one thread, though its own wall on two threads (5 ms) was the faster
    assert _policy_compute(decode, 2, 7_000_000) == 1
    assert _policy_compute(decode, 2, 7_000_000) == 1
    # ... on one thread now: a new program continues that, and its probe schedule
    step = _policy_graph()
    assert step.n_next == 1 and step.n_single == decode.n_single == 2
    assert step.single_ns == decode.single_ns and step.probe_every == decode.probe_every
    n = [_policy_compute(step, 2, 7_000_000) for _ in range(compiler.FastGraph.PROBE_EVERY - 2)]
    assert n == [1] * (compiler.FastGraph.PROBE_EVERY - 2)
    assert step.n_next == 2 and step.probing       # the schedule's probe, after the 16th single compute of the two
    # the probe loses (contended, slower than one thread): one thread again, the next probe twice as far
    assert _policy_compute(step, 2, 40_000_000, slept_frac=0.9) == 2
    assert step.n_next == 1 and step.probe_every == 2 * compiler.FastGraph.PROBE_EVERY
    # after another program's uncontended compute on all threads it runs on all threads again
    free = _policy_graph()
    compiler._last_compute[:] = [compiler.time.perf_counter_ns(), 5_000_000, [4_900_000, 4_000_000], free.serial, None]
    assert _policy_compute(step, 2, 6_000_000) == 2
    # under a trace listener, the views show ggml's walk on all threads: nothing adopted
    step.n_next = 1 << 30
    compiler._last_compute[:] = [compiler.time.perf_counter_ns(), 9_000_000, [5_000_000, 5_000_000], free.serial, None]
    with trace.recording(("cpu.plan",)):
        step.begin_compute(2)
    assert step.n_use_now == 2


def test_one_thread_mode_tries_all_threads_when_the_other_cores_go_idle(monkeypatch):
    """While on one thread, the policy reads the CPUs' idle time (/proc/stat) and its own CPU time over windows of
    IDLE_WINDOW_NS or more: room for the other threads 75 % of a window or more (idle + own CPU - the window) -> a
    probe on all threads now, not at the schedule's; the other cores busy, an unreadable /proc/stat or a window not
    yet full -> no change."""
    if compiler.N_CPUS < 2:
        pytest.skip("one CPU: the policy has nothing to choose")
    clock = {"t": 10**12, "idle": 5000, "cpu": 0}
    tick_ns = 1_000_000_000 // compiler._CLK_TCK
    monkeypatch.setattr(compiler, "_read_idle", lambda: [clock["t"], clock["idle"], clock["cpu"]])
    monkeypatch.setattr(compiler, "_idle_mark", [0, 0, 0])
    monkeypatch.setattr(compiler, "_start_mark", [0, -1, 0])
    monkeypatch.setattr(compiler, "_last_compute", [0, 0, [], None, None])
    fg = _policy_graph()
    _policy_compute(fg, 2, 5_000_000)
    _policy_compute(fg, 2, 40_000_000, slept_frac=0.9)              # contended: one thread from now on
    assert fg.n_next == 1 and compiler._idle_mark == [clock["t"], 5000, 0]

    def single_step(idle_ns, dt=10_000_000, own=10_000_000):
        clock["t"] += dt
        clock["idle"] += idle_ns // tick_ns
        clock["cpu"] += own
        return _policy_compute(fg, 2, 7_000_000)

    # the other core busy (another process): 10 % idle, windows (40 ms) judged: no probe
    assert [single_step(1_000_000) for _ in range(4)] == [1] * 4
    # this process idle too (a pause between steps), the other core still busy: the idle time is its own, no probe
    assert [single_step(10_000_000, own=0) for _ in range(4)] == [1] * 4
    assert fg.n_next == 1
    # the other core goes idle: a probe on all threads when the next window is judged, before the schedule's (16)
    n = [single_step(10_000_000) for _ in range(6)]
    assert n == [1, 1, 1, 1, 2, 2] and fg.n_single < compiler.FastGraph.PROBE_EVERY
    # the idle time unreadable: the schedule alone decides
    fg2 = _policy_graph()
    _policy_compute(fg2, 2, 5_000_000)
    _policy_compute(fg2, 2, 40_000_000, slept_frac=0.9)
    assert fg2.n_next == 1
    clock["idle"] = -1
    for _ in range(5):
        clock["t"] += 20_000_000
        assert _policy_compute(fg2, 2, 7_000_000) == 1


def test_the_first_compute_of_a_process_reads_the_other_cores(monkeypatch):
    """Before any compute, the policy knows the CPUs' idle time and its own CPU time since the engine was imported
    (the process ran on one thread): no room for another thread (under 75 % of a core) -> the first program starts
    on one thread; room, not known, or a span under IDLE_WINDOW_NS -> all threads, as ggml."""
    tick_ns = 1_000_000_000 // compiler._CLK_TCK
    t0 = 10**12
    monkeypatch.setattr(compiler, "_last_compute", [0, 0, [], None, None])
    monkeypatch.setattr(compiler, "_idle_mark", [0, 0, 0])

    def starts(span_ns, idle_ns, own_ns=None, start_idle=1000):
        own_ns = span_ns if own_ns is None else own_ns
        monkeypatch.setattr(compiler, "_start_mark", [t0, start_idle, 0])
        monkeypatch.setattr(compiler, "_read_idle", lambda: [t0 + span_ns, start_idle + idle_ns // tick_ns, own_ns])
        return _policy_graph().n_next

    assert starts(1_000_000_000, 950_000_000) > 1                  # quiet: the other core idle 95 %
    assert starts(1_000_000_000, 100_000_000) == 1                 # another process held it 90 %
    assert compiler._idle_mark == [t0 + 1_000_000_000, 1000 + 100_000_000 // tick_ns, 1_000_000_000]
    assert starts(1_000_000_000, 1_000_000_000, own_ns=0) == 1     # idle: this process's core, waiting on input
    assert starts(compiler.IDLE_WINDOW_NS // 2, 0) > 1             # too short a span to tell
    assert starts(1_000_000_000, 0, start_idle=-1) > 1             # /proc/stat unreadable
    with trace.recording(("cpu.plan",)):                            # not a program a listener records
        assert starts(1_000_000_000, 100_000_000) > 1
