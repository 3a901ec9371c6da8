"""Compiled (Numba) kernels of PowerInfer's sparse FFN ops: MUL_MAT_SPARSE (Q4_1, Q4_0, Q8_0, F16) and AXPY (F16).

Mirrors SJTU-IPADS/PowerInfer's ggml.c like the faithful ``cpu/powerinfer.py`` does (the chunks of
``ceil(nr0 / (8 nth))`` rows claimed from one atomic counter, the skip rule ``gpu_idx[r] == 1 || idx[r] <
threshold``, AXPY's static split of the rows and private accumulators), but with ggml's AVX2 arithmetic lane for
lane instead of NumPy's: a kept row is one ``ggml_vec_dot_q4_1_q8_1`` (8 float lanes, lane u accumulating
``fma(d_x*d_y, P_u, acc_u)`` with P_u the exact integer dot of elements 4u..4u+3, then ``hsum_float_8`` + summs),
``ggml_vec_dot_q4_0_q8_0`` / ``_q8_0_q8_0`` likewise, or ``ggml_vec_dot_f16``; so a kept row has the real ggml's
MUL_MAT bits (the tests check it against libggml). The weights stay in ggml's plain row layout (PowerInfer skips
single rows; the CPU_REPACK layout interleaves 8 rows, which a per-row skip cannot use).

Entry points take raw addresses like the C kernels. ``mul_mat_sparse`` / ``axpy`` are the per-thread kernels.
In the compiled graph walk (``kernels.compute_node``) ``k_mul_mat_sparse`` / ``k_axpy`` / ``k_unary`` run the
sparse graph's MUL_MAT_SPARSE, AXPY (both with their GPU halves, ``_upscale``) and its RELU / SILU: thread 0 does
the INIT pass, then a barrier, as cpu/powerinfer.py does; ``build_node`` writes their program rows and
``set_compute_params`` the threshold (``sparse_pred_threshold``, read before every compute) and n_threads. The
standalone drivers (``SparseMatMul``, ``run_axpy``) serve tests, the benchmark and the notebook; with one thread
``SparseMatMul`` makes one compiled call (INIT + chunks). AXPY's partials are reduced in ith order, not added
racily as in PowerInfer (see cpu/powerinfer.py), and follow the compute's n_threads even when the compiled walk
runs on fewer threads, so a result never depends on the walk's thread policy.
"""
from __future__ import annotations

import threading

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ... import consts as C
from ...tensor import GGML_OP_AXPY, GGML_OP_MUL_MAT_SPARSE, Tensor, get_unary_op, nelements, row_size, type_size
from .. import powerinfer as cpu_pi
from ..common import CACHE_LINE_SIZE, as_array
from .intrinsics import (
    HAVE_AVX2,
    _cvec,
    _decl,
    _fconst8,
    _i8,
    _i32,
    _i64,
    _madd_ones,
    _maddubs,
    _ptr,
    _sign_b,
    _splat,
    _v_expf8,
    _vec,
    atomic_add,
    atomic_store,
    compiled,
    f32_to_f16,
    fmaf,
    fp16_to_fp32,
    glibc_expf,
    ld_f32,
    ld_i8,
    ld_i32,
    ld_u8,
    ld_u16,
    st_f32,
    st_u16,
)
from .program import (
    DATA,
    DST,
    NB1,
    NB2,
    NB3,
    NE0,
    NE1,
    NE2,
    NE3,
    OP,
    OP_AXPY,
    OP_MUL_MAT_SPARSE,
    OP_UNARY,
    S0,
    S1,
    S2,
    SP_AUX,
    SP_NAUX,
    SP_NTH,
    SP_THRESHOLD,
    SP_TYPE,
    SP_UPSCALE,
    SUBOP,
    SYNC_CHUNK,
    T_F16,
    T_Q4_0,
    T_Q4_1,
    T_Q8_0,
    TRW_KERNEL,
    UNARY_RELU,
    UNARY_SILU,
)
from .rowdot import mmq_layout, quantize_row_q8, vec_dot_f16
from .sync import traced, traced_barrier

F32 = np.float32
_T_Q8_1 = 9          # GGML_TYPE_Q8_1: Q4_1's vec_dot_type
CACHE_LINE = CACHE_LINE_SIZE


@compiled
def _hsum8(a):
    """hsum_float_8: (hi + lo) -> movehl -> movehdup."""
    r0 = a[4] + a[0]
    r1 = a[5] + a[1]
    r2 = a[6] + a[2]
    r3 = a[7] + a[3]
    return (r0 + r2) + (r1 + r3)


def _make_row_dot(qtype: int):
    """ggml_vec_dot_q4_1_q8_1 / _q4_0_q8_0 / _q8_0_q8_0 (arch/x86/quants.c, AVX2) for one plain row, in LLVM IR:
    per block ``bytes_from_nibbles_32`` (low nibbles = elements 0..15, high = 16..31), ``mul_sum_us8_pairs_float``
    (maddubs + madd: lane u = exact integer dot of elements 4u..4u+3; the signed types go through
    ``psignb`` as ggml's ``mul_sum_i8_pairs_float``), ``acc = fma(d_x*d_y, xy, acc)``; then ``hsum_float_8`` and
    ``+ summs`` (Q4_1: summs += m_x*s_y, a product of two fp16 values, exact in float32).
    Arguments (int64): x (the row's blocks), nb, yq (int8 quants), yd (float32 d per block), ys (float32 s)."""
    bs = 20 if qtype == T_Q4_1 else (18 if qtype == T_Q4_0 else 34)
    qo = 4 if qtype == T_Q4_1 else 2
    _f32 = ir.FloatType()

    def gen(typingctx, x, nb, yq, yd, ys):
        def codegen(context, builder, sig, args):
            x, nb, yq, yd, ys = args
            v8f = _vec(_f32, 8)
            fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
            acc = cgutils.alloca_once_value(builder, ir.Constant(v8f, None))
            summs = cgutils.alloca_once_value(builder, ir.Constant(_f32, 0.0))
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                blk = builder.add(x, builder.mul(b, ir.Constant(_i64, bs)))
                b4 = builder.mul(b, ir.Constant(_i64, 4))
                half = ir.HalfType()
                dx = builder.fpext(builder.load(_ptr(builder, blk, half), align=1), _f32)
                dy = builder.load(_ptr(builder, builder.add(yd, b4), _f32), align=1)
                d0d1 = _splat(builder, builder.fmul(dx, dy), 8)
                if qtype == T_Q4_1:
                    mx = builder.fpext(builder.load(_ptr(builder, builder.add(blk, ir.Constant(_i64, 2)), half),
                                                    align=1), _f32)
                    sy = builder.load(_ptr(builder, builder.add(ys, b4), _f32), align=1)
                    builder.store(builder.fadd(builder.load(summs), builder.fmul(mx, sy)), summs)
                qs = builder.add(blk, ir.Constant(_i64, qo))
                if qtype == T_Q8_0:
                    qx = builder.load(_ptr(builder, qs, _vec(_i8, 32)), align=1)
                else:
                    raw = builder.load(_ptr(builder, qs, _vec(_i8, 16)), align=1)
                    m15 = _cvec(_i8, [15] * 16)
                    lo = builder.and_(raw, m15)
                    hi = builder.and_(builder.lshr(raw, _cvec(_i8, [4] * 16)), m15)
                    qx = builder.shuffle_vector(lo, hi, _cvec(_i32, list(range(32))))
                    if qtype == T_Q4_0:
                        qx = builder.sub(qx, _cvec(_i8, [8] * 32))
                qy = builder.load(_ptr(builder, builder.add(yq, builder.mul(b, ir.Constant(_i64, 32))),
                                       _vec(_i8, 32)), align=1)
                if qtype == T_Q4_1:
                    p16 = _maddubs(builder, qx, qy)
                else:
                    p16 = _maddubs(builder, _sign_b(builder, qx, qx), _sign_b(builder, qy, qx))
                xy = builder.sitofp(_madd_ones(builder, p16), v8f)
                builder.store(builder.call(fma8, [d0d1, xy, builder.load(acc)]), acc)
            a = builder.load(acc)
            e = [builder.extract_element(a, ir.Constant(_i32, k)) for k in range(8)]
            r = builder.fadd(builder.fadd(builder.fadd(e[4], e[0]), builder.fadd(e[6], e[2])),
                             builder.fadd(builder.fadd(e[5], e[1]), builder.fadd(e[7], e[3])))
            if qtype == T_Q4_1:
                r = builder.fadd(r, builder.load(summs))
            return r
        return types.float32(*([types.int64] * 5)), codegen
    gen.__name__ = f"row_dot_{qtype}"
    return intrinsic(gen)


@intrinsic
def axpy_f16_row(typingctx, w, n8, alpha, res):
    """ggml_axpy_avx_f16: res[i:i+8] = fmadd(cvtph_ps(w[i:i+8]), set1(alpha), res[i:i+8]) for n8 groups of 8."""
    def codegen(context, builder, sig, args):
        w, n8, alpha, res = args
        f32 = ir.FloatType()
        v8f = _vec(f32, 8)
        fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
        a8 = _splat(builder, alpha, 8)
        with cgutils.for_range(builder, n8) as loop:
            i = loop.index
            pw = _ptr(builder, builder.add(w, builder.mul(i, ir.Constant(_i64, 16))), _vec(ir.HalfType(), 8))
            pr = _ptr(builder, builder.add(res, builder.mul(i, ir.Constant(_i64, 32))), v8f)
            vx = builder.fpext(builder.load(pw, align=1), v8f)
            builder.store(builder.call(fma8, [vx, a8, builder.load(pr, align=1)]), pr, align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.float32, types.int64), codegen


row_dot_q4_1 = _make_row_dot(T_Q4_1)
row_dot_q4_0 = _make_row_dot(T_Q4_0)
row_dot_q8_0 = _make_row_dot(T_Q8_0)


@compiled
def vec_dot_q_row(qtype, x, nb, yq, yd, ys, acc):
    """One row of src0 (plain block layout at address x, nb blocks) . one quantized src1 row (split layout:
    int8 quants at yq, float32 d at yd, float32 s at ys), as ggml's AVX2 vec_dot for q4_1/q4_0/q8_0: 8 float
    lanes, lane u = fma(d_x*d_y, exact integer dot of elements 4u..4u+3, lane u), then hsum_float_8 (+ summs)."""
    for u in range(8):
        acc[u] = F32(0.0)
    summs = F32(0.0)
    bs = 20 if qtype == T_Q4_1 else (18 if qtype == T_Q4_0 else 34)
    qo = 4 if qtype == T_Q4_1 else 2
    off = 8 if qtype == T_Q4_0 else 0
    for b in range(nb):
        blk = x + b * bs
        d0d1 = fp16_to_fp32(ld_u16(blk)) * ld_f32(yd + b * 4)
        if qtype == T_Q4_1:
            summs = summs + fp16_to_fp32(ld_u16(blk + 2)) * ld_f32(ys + b * 4)
        qs = blk + qo
        yb = yq + b * 32
        if qtype == T_Q8_0:
            for u in range(8):
                p = np.int32(0)
                for e in range(4 * u, 4 * u + 4):
                    p += np.int32(ld_i8(qs + e)) * np.int32(ld_i8(yb + e))
                acc[u] = fmaf(d0d1, F32(p), acc[u])
        else:
            # bytes_from_nibbles_32: low nibbles are elements 0..15 (lanes 0-3), high nibbles 16..31 (lanes 4-7)
            for u in range(4):
                lo = np.int32(0)
                hi = np.int32(0)
                for e in range(4 * u, 4 * u + 4):
                    byte = np.int32(ld_u8(qs + e))
                    lo += ((byte & 15) - off) * np.int32(ld_i8(yb + e))
                    hi += ((byte >> 4) - off) * np.int32(ld_i8(yb + 16 + e))
                acc[u] = fmaf(d0d1, F32(lo), acc[u])
                acc[u + 4] = fmaf(d0d1, F32(hi), acc[u + 4])
    return _hsum8(acc) + summs


@compiled
def vdt_of(qtype):
    """type_traits_cpu[qtype].vec_dot_type: Q4_1 -> Q8_1, Q4_0 / Q8_0 -> Q8_0, F16 -> F16."""
    if qtype == T_Q4_1:
        return _T_Q8_1
    if qtype == T_F16:
        return T_F16
    return T_Q8_0


@compiled
def src1_size(qtype, ne10, nr1):
    """Bytes of the work buffer the INIT pass fills (the split layout of rowdot.mmq_layout, or F16 rows)."""
    if qtype == T_F16:
        return nr1 * ne10 * 2
    return mmq_layout(ne10, nr1)[4]


@compiled
def quantize_src1(vtype, x, ne10, nr1, nb11, wdata):
    """INIT: src1's nr1 F32 rows -> vec_dot_type into wdata (Q8_0 / Q8_1 split layout as rowdot.mmq_layout, or
    F16 rows)."""
    if vtype == T_F16:
        for j in range(nr1):
            for i in range(ne10):
                st_u16(wdata + (j * ne10 + i) * 2, f32_to_f16(ld_f32(x + j * nb11 + i * 4)))
        return
    nb = ne10 // 32
    o_q, o_d, o_s, o_sum, total = mmq_layout(ne10, nr1)
    for j in range(nr1):
        quantize_row_q8(x + j * nb11, 4, ne10, wdata + o_q + j * ne10, wdata + o_d + j * nb * 4,
                        wdata + o_s + j * nb * 4, wdata + o_sum + j * nb * 4, vtype == _T_Q8_1)


@compiled
def row_dot(qtype, row, ne00, nb, yq, yd, ys):
    """One kept row: ggml's vec_dot of src0's row (plain layout) with src1's converted column (yq: the int8 quants
    or the F16 row; yd / ys: its per-block d and s)."""
    if qtype == T_F16:
        return vec_dot_f16(ne00, row, yq)
    if HAVE_AVX2:
        if qtype == T_Q4_1:
            return row_dot_q4_1(row, nb, yq, yd, ys)
        if qtype == T_Q4_0:
            return row_dot_q4_0(row, nb, yq, yd, ys)
        return row_dot_q8_0(row, nb, yq, yd, ys)
    return vec_dot_q_row(qtype, row, nb, yq, yd, ys, np.empty(8, np.float32))


@compiled
def mul_mat_sparse(qtype, w, nb01, ne00, nr0, wdata, nr1, idx, idx_nb1, gid, dst, nb1, threshold, counter, nth):
    """ggml_compute_forward_mul_mat_sparse's COMPUTE pass for one thread: claim dr0 rows at a time from the
    counter (int64 at address ``counter``); gid == 0 means no gpu_idx. Returns the number of (row, column) dots
    skipped."""
    dr0 = (nr0 + 8 * nth - 1) // (8 * nth)
    nb = ne00 // 32
    o_q, o_d, o_s, o_sum, total = mmq_layout(ne00, nr1)
    skipped = 0
    kept = np.empty(dr0 if nr1 == 1 else 0, np.int64)
    while True:
        ir010 = atomic_add(counter, dr0)
        ir011 = min(ir010 + dr0, nr0)
        if nr1 == 1:
            # one column (a decode): the chunk's rows are zeroed, the kept ones listed without a branch per row
            # (a row kept or not is a coin flip the branch predictor loses), then computed: the same values
            n = 0
            for ir0 in range(ir010, ir011):
                st_f32(dst + ir0 * 4, F32(0.0))
                keep = not (ld_f32(idx + ir0 * 4) < threshold)
                if gid != 0:
                    keep = keep & (ld_i32(gid + ir0 * 4) != 1)
                kept[n] = ir0
                n += np.int64(keep)
            skipped += max(ir011 - ir010, 0) - n
            for i in range(n):
                ir0 = kept[i]
                st_f32(dst + ir0 * 4, row_dot(qtype, w + ir0 * nb01, ne00, nb, wdata + o_q, wdata + o_d,
                                              wdata + o_s))
            if ir010 + dr0 >= nr0:
                break
            continue
        for ir0 in range(ir010, ir011):
            on_gpu = gid != 0 and ld_i32(gid + ir0 * 4) == 1
            row = w + ir0 * nb01
            for j in range(nr1):
                out = dst + j * nb1 + ir0 * 4
                if on_gpu or ld_f32(idx + j * idx_nb1 + ir0 * 4) < threshold:
                    st_f32(out, F32(0.0))
                    skipped += 1
                    continue
                if qtype == T_F16:
                    st_f32(out, vec_dot_f16(ne00, row, wdata + j * ne00 * 2))
                else:
                    st_f32(out, row_dot(qtype, row, ne00, nb, wdata + o_q + j * ne00, wdata + o_d + j * nb * 4,
                                        wdata + o_s + j * nb * 4))
        if ir010 + dr0 >= nr0:
            break
    return skipped


@compiled
def mul_mat_sparse_1(qtype, w, nb01, ne00, nr0, x, nb11, nr1, wdata, idx, idx_nb1, gid, dst, nb1, threshold,
                     counter):
    """INIT + COMPUTE on one thread in one compiled call (what the graph walk does with nth = 1; the standalone
    ``SparseMatMul`` calls it so that a decode-sized call pays one entry into compiled code, not several)."""
    quantize_src1(vdt_of(qtype), x, ne00, nr1, nb11, wdata)
    atomic_store(counter, 0)
    return mul_mat_sparse(qtype, w, nb01, ne00, nr0, wdata, nr1, idx, idx_nb1, gid, dst, nb1, threshold, counter, 1)


@compiled
def mul_mat_sparse_call(qtype, W, x, wdata, idx, gid, has_gid, out, threshold, counter):
    """``mul_mat_sparse_1`` on arrays: the one entry ``SparseMatMul`` makes per one-thread call. Numba unboxes an
    array in a fraction of the time NumPy's ``.ctypes.data`` takes in Python, which was most of a decode-sized
    call's fixed cost (~16 us of a ~85 us dense row pass)."""
    nr0, ne00, nr1 = W.shape[0], x.shape[1], x.shape[0]
    return mul_mat_sparse_1(qtype, W.ctypes.data, W.shape[1], ne00, nr0, x.ctypes.data, ne00 * 4, nr1,
                            wdata.ctypes.data, idx.ctypes.data, nr0 * 4, gid.ctypes.data if has_gid else 0,
                            out.ctypes.data, nr0 * 4, threshold, counter.ctypes.data)


@compiled
def mul_mat_upscale(qtype, w, nb01, ne00, bucket, n_hot, nr0, wdata, nr1, idx, idx_nb1, dst, nb1, threshold):
    """The GPU half (ggml_mul_mat_idx_upscale as the simulated accelerator runs it, one thread): dst is zeroed
    (CUDA's dst is), then row ``bucket[i]`` of each column is src0's row i . src1 where the predictor keeps it."""
    nb = ne00 // 32
    o_q, o_d, o_s, o_sum, total = mmq_layout(ne00, nr1)
    for j in range(nr1):
        for r in range(nr0):
            st_f32(dst + j * nb1 + r * 4, F32(0.0))
    for i in range(n_hot):
        r = np.int64(ld_i32(bucket + i * 4))
        row = w + i * nb01
        for j in range(nr1):
            if ld_f32(idx + j * idx_nb1 + r * 4) < threshold:
                continue
            if qtype == T_F16:
                v = vec_dot_f16(ne00, row, wdata + j * ne00 * 2)
            else:
                v = row_dot(qtype, row, ne00, nb, wdata + o_q + j * ne00, wdata + o_d + j * nb * 4,
                            wdata + o_s + j * nb * 4)
            st_f32(dst + j * nb1 + r * 4, v)


@compiled
def _axpy_row(row, ne00, alpha, res):
    """ggml_axpy_avx_f16 on one row: res += F16 row * alpha (an FMA per element, the tail as the C loop)."""
    n8 = ne00 // 8
    axpy_f16_row(row, n8, alpha, res)
    for i in range(n8 * 8, ne00):
        st_f32(res + i * 4, fmaf(fp16_to_fp32(ld_u16(row + i * 2)), alpha, ld_f32(res + i * 4)))


@compiled
def axpy(w, nb01, ne00, n_ff, xh, nr1, idx, idx_nb1, gid, threshold, part, ith, nth):
    """ggml_compute_forward_mul_mat_axpy's COMPUTE pass for thread ith: rows [dr*ith, dr*ith + dr) of down_t (F16
    rows at w), x already F16 (xh, nr1 rows of n_ff), accumulated into this thread's partial (float32, nr1 x ne00
    at ``part``) with ggml_axpy_avx_f16's FMA. Returns the rows skipped."""
    dr = (n_ff + nth - 1) // nth
    r0 = min(dr * ith, n_ff)
    r1 = min(r0 + dr, n_ff)
    skipped = 0
    for j in range(nr1):
        res = part + j * ne00 * 4
        for i in range(ne00):
            st_f32(res + i * 4, F32(0.0))
        for r in range(r0, r1):
            h = ld_u16(xh + (j * n_ff + r) * 2)
            # PowerInfer: `if (!gpu_idx || gpu_idx[ir1] == 1) continue;`
            if (h & 0x7FFF) == 0 or gid == 0 or ld_i32(gid + r * 4) == 1 \
                    or ld_f32(idx + j * idx_nb1 + r * 4) < threshold:
                skipped += 1
                continue
            _axpy_row(w + r * nb01, ne00, fp16_to_fp32(h), res)
    return skipped


@compiled
def axpy_call(Wt, x, xh, idx, gid, threshold, part, out):
    """AXPY on one thread in one compiled call (``run_axpy`` with nth = 1): INIT (x -> F16), the rows, and the
    reduction of the one partial (0 + p0, as the faithful kernel's). Returns the rows skipped."""
    n_ff, ne00, nr1 = Wt.shape[0], Wt.shape[1], x.shape[0]
    quantize_src1(T_F16, x.ctypes.data, n_ff, nr1, n_ff * 4, xh.ctypes.data)
    s = axpy(Wt.ctypes.data, ne00 * 2, ne00, n_ff, xh.ctypes.data, nr1, idx.ctypes.data, n_ff * 4,
             gid.ctypes.data, threshold, part.ctypes.data, 0, 1)
    reduce_partials(out.ctypes.data, part.ctypes.data, nr1 * ne00, 1, 0, 1)
    return s


@compiled
def axpy_upscale(w, nb01, ne00, n_ff, bucket, n_hot, xh, nr1, idx, idx_nb1, dst, threshold):
    """AXPY's GPU half (one thread): src0 holds the hot rows, row i is neuron bucket[i]; dst (zeroed by INIT) gets
    the kept rows added in bucket order."""
    for j in range(nr1):
        res = dst + j * ne00 * 4
        for i in range(n_hot):
            r = np.int64(ld_i32(bucket + i * 4))
            h = ld_u16(xh + (j * n_ff + r) * 2)
            if (h & 0x7FFF) == 0 or ld_f32(idx + j * idx_nb1 + r * 4) < threshold:
                continue
            _axpy_row(w + i * nb01, ne00, fp16_to_fp32(h), res)


@compiled
def reduce_partials(dst, part, n, n_part, ith, nth):
    """ggviz's replacement of PowerInfer's unlocked ``res[i] += tmp[i]``: thread ith of nth sums its share of the
    n elements over the n_part partials (n floats apart), in partial order: ((0 + p0) + p1) + ..."""
    d = (n + nth - 1) // nth
    e0 = min(d * ith, n)
    e1 = min(e0 + d, n)
    for e in range(e0, e1):
        acc = F32(0.0)
        for t in range(n_part):
            acc = acc + ld_f32(part + (t * n + e) * 4)
        st_f32(dst + e * 4, acc)


@intrinsic
def silu8(typingctx, x, dst, n8):
    """The 8-lane part of ggml_vec_silu_f32: dst = x / (1 + ggml_v_expf(0 - x))."""
    def codegen(context, builder, sig, args):
        x, dst, n8 = args
        v8f = _vec(ir.FloatType(), 8)
        with cgutils.for_range(builder, n8) as loop:
            off = builder.mul(loop.index, ir.Constant(_i64, 32))
            xv = builder.load(_ptr(builder, builder.add(x, off), v8f), align=1)
            ex = _v_expf8(builder, builder.fsub(_fconst8(0.0), xv))
            builder.store(builder.fdiv(xv, builder.fadd(_fconst8(1.0), ex)),
                          _ptr(builder, builder.add(dst, off), v8f), align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


# ---------------------------------------------------------------------------------------------------------------------
# the compiled graph walk's kernels (kernels.compute_node calls them; compiler.py builds their program rows)
# ---------------------------------------------------------------------------------------------------------------------

@compiled
def k_mul_mat_sparse(P, F, k, ith, nth, sync, wdata):
    """MUL_MAT_SPARSE as cpu/powerinfer.py's forward_mul_mat_sparse: INIT (thread 0: src1 -> vec_dot_type, the
    chunk counter to 0), a barrier, then the chunks (or, for the GPU half, thread 0 alone)."""
    qtype = P[k, SP_TYPE]
    w, nb01, ne00 = P[k, S0 + DATA], P[k, S0 + NB1], P[k, S0 + NE0]
    x, nb11 = P[k, S1 + DATA], P[k, S1 + NB1]
    idx, idx_nb1 = P[k, S2 + DATA], P[k, S2 + NB1]
    dst, nb1 = P[k, DST + DATA], P[k, DST + NB1]
    nr0, nr1 = P[k, DST + NE0], P[k, DST + NE1]
    aux = P[k, SP_AUX]
    threshold = F32(F[k, SP_THRESHOLD])
    tr = traced(sync)
    if ith == 0:
        quantize_src1(vdt_of(qtype), x, ne00, nr1, nb11, wdata)
        atomic_store(sync + 8 * SYNC_CHUNK, 0)
    traced_barrier(sync, nth, ith, k, TRW_KERNEL, tr)
    if P[k, SP_UPSCALE] == 1:
        if ith == 0:
            mul_mat_upscale(qtype, w, nb01, ne00, aux, P[k, SP_NAUX], nr0, wdata, nr1, idx, idx_nb1, dst, nb1,
                            threshold)
        return
    mul_mat_sparse(qtype, w, nb01, ne00, nr0, wdata, nr1, idx, idx_nb1, aux, dst, nb1, threshold,
                   sync + 8 * SYNC_CHUNK, nth)


@compiled
def k_axpy(P, F, k, ith, nth, sync, wdata):
    """AXPY as cpu/powerinfer.py's forward_axpy: INIT (thread 0: x -> F16 in the work buffer, dst = 0), a barrier;
    the static split of the rows over SP_NTH partials (the compute's n_threads: if the compiled walk runs on fewer
    threads, each takes several partials, so the sums are the same), a barrier, the ith-order reduction."""
    w, nb01, ne00 = P[k, S0 + DATA], P[k, S0 + NB1], P[k, S0 + NE0]
    x, n_ff, nr1, nb11 = P[k, S1 + DATA], P[k, S1 + NE0], P[k, S1 + NE1], P[k, S1 + NB1]
    idx, idx_nb1 = P[k, S2 + DATA], P[k, S2 + NB1]
    dst = P[k, DST + DATA]
    aux = P[k, SP_AUX]
    threshold = F32(F[k, SP_THRESHOLD])
    n_part = max(P[k, SP_NTH], nth)
    tr = traced(sync)
    if ith == 0:
        quantize_src1(T_F16, x, n_ff, nr1, nb11, wdata)
        for i in range(nr1 * ne00):
            st_f32(dst + i * 4, F32(0.0))
    traced_barrier(sync, nth, ith, k, TRW_KERNEL, tr)
    if P[k, SP_UPSCALE] == 1:
        if ith == 0:
            axpy_upscale(w, nb01, ne00, n_ff, aux, P[k, SP_NAUX], wdata, nr1, idx, idx_nb1, dst, threshold)
        return
    part = wdata + (nr1 * n_ff * 2 + CACHE_LINE - 1) // CACHE_LINE * CACHE_LINE
    t = ith
    while t < n_part:
        axpy(w, nb01, ne00, n_ff, wdata, nr1, idx, idx_nb1, aux, threshold, part + t * nr1 * ne00 * 4, t, n_part)
        t += nth
    traced_barrier(sync, nth, ith, k, TRW_KERNEL, tr)
    reduce_partials(dst, part, nr1 * ne00, n_part, ith, nth)


@compiled
def k_unary(P, F, k, ith, nth, sync, wdata):
    """RELU (``x > 0 ? x : 0``) and SILU (ggml_vec_silu_f32: ggml_v_silu on 8 lanes, libm expf on the tail) on F32
    rows, the rows split as ggml's get_thread_range."""
    sub = P[k, SUBOP]
    src0, dst = P[k, S0 + DATA], P[k, DST + DATA]
    ne00, ne01, ne02, ne03 = P[k, S0 + NE0], P[k, S0 + NE1], P[k, S0 + NE2], P[k, S0 + NE3]
    nb01, nb02, nb03 = P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    nb1, nb2, nb3 = P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    nr = ne01 * ne02 * ne03
    dr = (nr + nth - 1) // nth
    ir0 = min(dr * ith, nr)
    ir1 = min(ir0 + dr, nr)
    m8 = (ne00 // 8) * 8
    for irow in range(ir0, ir1):
        i3 = irow // (ne02 * ne01)
        i2 = (irow - i3 * ne02 * ne01) // ne01
        i1 = irow - i3 * ne02 * ne01 - i2 * ne01
        xr = src0 + i1 * nb01 + i2 * nb02 + i3 * nb03
        d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3
        if sub == UNARY_RELU:
            for i in range(ne00):
                v = ld_f32(xr + 4 * i)
                st_f32(d + 4 * i, v if v > F32(0.0) else F32(0.0))
        else:
            silu8(xr, d, m8 // 8)
            for i in range(m8, ne00):
                v = ld_f32(xr + 4 * i)
                st_f32(d + 4 * i, v / (F32(1.0) + glibc_expf(-v)))


# ---------------------------------------------------------------------------------------------------------------------
# the compiler's side: a program row per node (called by compiler._build), the per-compute parameters
# ---------------------------------------------------------------------------------------------------------------------

_VDT = {T_Q4_1: _T_Q8_1, T_Q4_0: T_Q8_0, T_Q8_0: T_Q8_0, T_F16: T_F16}
_UNARY = {C.GGML_UNARY_OP_RELU: UNARY_RELU, C.GGML_UNARY_OP_SILU: UNARY_SILU}


def _plain_2d(t: Tensor) -> bool:
    """F32, one matrix (ne2 = ne3 = 1), contiguous elements: the kernels address row j at data + j * nb[1]."""
    return (t is not None and t.type == C.GGML_TYPE_F32 and int(t.nb[0]) == 4 and int(t.ne[2]) == 1
            and int(t.ne[3]) == 1 and bool(t.data))


def build_node(P, F, k: int, node: Tensor) -> bool:
    """Fill program row k for a MUL_MAT_SPARSE / AXPY / RELU / SILU node (the descriptors DST, S0..S2 are the
    compiler's); False when the compiled kernels do not cover it (the node-by-node walk then runs the faithful
    kernel, which also reports what is wrong with a bad node)."""
    op = node.op
    s0, s1, s2, s3 = node.src[0], node.src[1], node.src[2], node.src[3]
    if op == C.GGML_OP_UNARY:
        uop = get_unary_op(node)
        if uop not in _UNARY or s0 is None or s0.type != C.GGML_TYPE_F32 or node.type != C.GGML_TYPE_F32:
            return False
        if int(s0.nb[0]) != 4 or int(node.nb[0]) != 4 or s0.shape != node.shape:
            return False
        P[k, OP] = OP_UNARY
        P[k, SUBOP] = _UNARY[uop]
        return True
    if op not in (GGML_OP_MUL_MAT_SPARSE, GGML_OP_AXPY):
        return False
    if s0 is None or not (_plain_2d(s1) and _plain_2d(s2) and _plain_2d(node)):
        return False
    if int(s0.ne[2]) != 1 or int(s0.ne[3]) != 1 or int(s0.nb[0]) != type_size(s0.type) or not s0.data:
        return False
    upscale = int(node.op_params[1]) == 1
    nr1 = int(s1.ne[1])
    if int(node.ne[1]) != nr1 or int(s2.ne[1]) != nr1:
        return False
    if op == GGML_OP_MUL_MAT_SPARSE:
        n_rows = int(node.ne[0])                  # n_ff: the entries of idx / gpu_idx
        if s0.type not in _VDT or int(s0.ne[0]) % 32 or int(s1.ne[0]) != int(s0.ne[0]):
            return False
        if int(node.nb[1]) != n_rows * 4 or int(node.ne[0]) != n_rows:
            return False
        if not upscale and int(s0.ne[1]) != n_rows:
            return False
    else:
        n_rows = int(s1.ne[0])
        if s0.type != C.GGML_TYPE_F16 or int(node.ne[0]) != int(s0.ne[0]) or int(node.nb[1]) != int(s0.ne[0]) * 4:
            return False
        if not upscale and int(s0.ne[1]) != n_rows:
            return False
    if int(s2.ne[0]) != n_rows:
        return False
    n_aux = 0
    if s3 is not None:
        if s3.type != C.GGML_TYPE_I32 or int(s3.nb[0]) != 4 or not s3.data or nelements(s3) != int(s3.ne[0]):
            return False
        n_aux = int(s3.ne[0])
        want = int(s0.ne[1]) if upscale else n_rows
        if n_aux != want:
            return False
        if upscale and n_aux:
            # gpu_bucket names rows of the result: checked once here (the weights' index does not change between
            # computes); a bad one leaves the node to the faithful kernel, which says what is wrong
            b = np.asarray(as_array(s3)).reshape(-1)
            if b.min() < 0 or b.max() >= n_rows:
                return False
    elif upscale:
        return False
    P[k, OP] = OP_MUL_MAT_SPARSE if op == GGML_OP_MUL_MAT_SPARSE else OP_AXPY
    P[k, SP_TYPE] = s0.type
    P[k, SP_AUX] = int(s3.data) if s3 is not None else 0
    P[k, SP_NAUX] = n_aux
    P[k, SP_UPSCALE] = 1 if upscale else 0
    P[k, SP_NTH] = 1
    F[k, SP_THRESHOLD] = float(F32(cpu_pi.sparse_pred_threshold))
    return True


def work_size(node: Tensor) -> tuple[int, int]:
    """The work buffer the compiled kernel uses, as (bytes, bytes more per thread of the compute): MUL_MAT_SPARSE's
    split Q8 layout (larger than the block_q8_1 rows ggml_graph_plan counts for the faithful kernel); AXPY's F16 x
    and one partial per thread, the faithful kernel's layout."""
    s0, s1 = node.src[0], node.src[1]
    if node.op == GGML_OP_MUL_MAT_SPARSE:
        return int(src1_size(int(s0.type), int(s0.ne[0]), int(s1.ne[1]))), 0
    if node.op == GGML_OP_AXPY:
        conv = (nelements(s1) * 2 + CACHE_LINE - 1) // CACHE_LINE * CACHE_LINE
        return conv, nelements(node) * 4
    return 0, 0


def set_compute_params(P, F, rows: np.ndarray, n_threads: int) -> None:
    """Before each compute (FastGraph.begin_compute): ggml.c's global ``sparse_pred_threshold`` as it is now (the
    faithful kernels read it when they run; a cached program must not keep an old one) and the compute's
    n_threads (AXPY's partition)."""
    if len(rows):
        F[rows, SP_THRESHOLD] = float(F32(cpu_pi.sparse_pred_threshold))
        P[rows, SP_NTH] = int(n_threads)


# ---------------------------------------------------------------------------------------------------------------------
# standalone drivers (tests, benchmark, notebook): INIT on the calling thread, then nth threads (the compiled code
# releases the GIL)
# ---------------------------------------------------------------------------------------------------------------------

def _threads(fn, nth):
    if nth == 1:
        return [fn(0)]
    out = [None] * nth
    errs = []

    def body(i):
        try:
            out[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errs.append(exc)
    ts = [threading.Thread(target=body, args=(i,)) for i in range(1, nth)]
    for t in ts:
        t.start()
    body(0)
    for t in ts:
        t.join()
    if errs:
        raise errs[0]
    return out


def _c(a: np.ndarray, dtype, shape=None) -> np.ndarray:
    if not (type(a) is np.ndarray and a.dtype == dtype and a.flags.c_contiguous):
        a = np.ascontiguousarray(np.asarray(a), dtype=dtype)
    if shape is not None and a.shape != shape:
        raise ValueError(f"expected shape {shape}, got {a.shape}")
    return a


class SparseMatMul:
    """MUL_MAT_SPARSE on fixed weights: ``W`` as raw ggml rows (uint8 (nr0, row bytes)) of ``qtype``.

    ``__call__(x, idx, gpu_idx, threshold, nth, out=None)`` returns the (nr1, nr0) float32 result (into ``out``
    when given); with one thread that is one compiled call (INIT + chunks) on work buffers kept between calls.
    ``prepare`` / ``run`` split the INIT pass (src1 conversion) from the COMPUTE pass."""

    def __init__(self, qtype: int, W: np.ndarray, ne00: int):
        if qtype not in _VDT:
            raise ValueError(f"no compiled MUL_MAT_SPARSE for ggml type {qtype}")
        if ne00 % 32:
            raise ValueError("row length must be a multiple of 32")
        self.qtype, self.W, self.ne00 = qtype, np.ascontiguousarray(W), int(ne00)
        if self.W.ndim != 2 or self.W.dtype != np.uint8 or self.W.shape[1] != row_size(qtype, self.ne00):
            raise ValueError(f"W must be uint8 rows of {row_size(qtype, self.ne00)} bytes, got {self.W.dtype} "
                             f"{self.W.shape}")
        self.nr0 = self.W.shape[0]
        self.counter = np.zeros(8, np.int64)
        self._w = self.W.ctypes.data
        self._cnt = self.counter.ctypes.data
        self._wdata: dict[int, np.ndarray] = {}      # work buffers by column count (reused between calls)
        self._no_gid = np.zeros(1, np.int32)
        self.skipped = 0

    def _work(self, nr1: int) -> np.ndarray:
        wdata = self._wdata.get(nr1)
        if wdata is None:
            wdata = self._wdata[nr1] = np.zeros(int(src1_size(self.qtype, self.ne00, nr1)) + 64, np.uint8)
        return wdata

    def _x(self, x) -> np.ndarray:
        x = _c(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.ne00:
            raise ValueError(f"x must be (columns, {self.ne00}) float32, got {x.shape}")
        return x

    def prepare(self, x: np.ndarray):
        x = self._x(x)
        nr1 = x.shape[0]
        wdata = self._work(nr1)
        quantize_src1(_VDT[self.qtype], x.ctypes.data, self.ne00, nr1, self.ne00 * 4, wdata.ctypes.data)
        return wdata, nr1

    def _args(self, nr1, idx, gpu_idx, out):
        idx = _c(idx, np.float32, (nr1, self.nr0))
        gid = None if gpu_idx is None else _c(gpu_idx, np.int32, (self.nr0,))
        if out is None:
            out = np.empty((nr1, self.nr0), np.float32)
        elif not (type(out) is np.ndarray and out.dtype == np.float32 and out.flags.c_contiguous
                  and out.shape == (nr1, self.nr0)):
            raise ValueError(f"out must be a C-contiguous float32 array of shape {(nr1, self.nr0)}")
        return idx, gid, out

    def run(self, prepared, idx, gpu_idx, threshold: float, nth: int = 1, out=None):
        wdata, nr1 = prepared
        idx, gid, out = self._args(nr1, idx, gpu_idx, out)
        self.counter[0] = 0
        args = (self.qtype, self._w, self.W.shape[1], self.ne00, self.nr0, wdata.ctypes.data, nr1,
                idx.ctypes.data, self.nr0 * 4, 0 if gid is None else gid.ctypes.data, out.ctypes.data,
                self.nr0 * 4, F32(threshold), self._cnt, nth)
        skipped = [mul_mat_sparse(*args)] if nth == 1 else _threads(lambda i: mul_mat_sparse(*args), nth)
        self.skipped = int(sum(skipped))
        return out

    def __call__(self, x, idx, gpu_idx=None, threshold: float = 0.0, nth: int = 1, out=None):
        if nth != 1:
            return self.run(self.prepare(x), idx, gpu_idx, threshold, nth, out)
        x = self._x(x)
        nr1 = x.shape[0]
        wdata = self._work(nr1)
        idx, gid, out = self._args(nr1, idx, gpu_idx, out)
        self.skipped = mul_mat_sparse_call(self.qtype, self.W, x, wdata, idx, self._no_gid if gid is None else gid,
                                           gid is not None, out, F32(threshold), self.counter)
        return out


def run_axpy(Wt_f16: np.ndarray, x: np.ndarray, idx: np.ndarray, gpu_idx: np.ndarray, threshold: float = 0.0,
             nth: int = 1) -> np.ndarray:
    """AXPY on the CPU half: down_t (n_ff, ne00) F16, x (nr1, n_ff) F32 -> (nr1, ne00); gpu_idx as PowerInfer's
    CPU kernel reads it (a row is computed only where it is 0)."""
    Wt = _c(Wt_f16, np.float16)
    n_ff, ne00 = Wt.shape
    x = _c(x, np.float32)
    nr1 = x.shape[0]
    if x.ndim != 2 or x.shape[1] != n_ff:
        raise ValueError(f"x must be (columns, {n_ff}) float32, got {x.shape}")
    xh = np.empty((nr1, n_ff), np.uint16)
    idx = _c(idx, np.float32, (nr1, n_ff))
    gid = _c(gpu_idx, np.int32, (n_ff,))
    part = np.empty((nth, nr1, ne00), np.float32)
    out = np.empty((nr1, ne00), np.float32)
    if nth == 1:
        axpy_call(Wt.view(np.uint16), x, xh, idx, gid, F32(threshold), part, out)   # (Numba has no float16)
        return out
    quantize_src1(T_F16, x.ctypes.data, n_ff, nr1, n_ff * 4, xh.ctypes.data)

    def body(i):
        s = axpy(Wt.ctypes.data, ne00 * 2, ne00, n_ff, xh.ctypes.data, nr1, idx.ctypes.data, n_ff * 4,
                 gid.ctypes.data, F32(threshold), part[i].ctypes.data, i, nth)
        return s
    _threads(body, nth)
    # the barrier between the passes is the join of _threads; then the ith-order reduction
    _threads(lambda i: reduce_partials(out.ctypes.data, part.ctypes.data, nr1 * ne00, nth, i, nth), nth)
    return out
