"""Compiled (Numba) kernels of PowerInfer's sparse FFN ops: MUL_MAT_SPARSE (Q4_1, Q4_0, Q8_0, F16) and AXPY (F16).

Mirrors SJTU-IPADS/PowerInfer's ggml.c like the faithful ``cpu/powerinfer.py`` does (the chunks of
``ceil(nr0 / (8 nth))`` rows claimed from one atomic counter, the skip rule ``gpu_idx[r] == 1 || idx[r] <
threshold``, AXPY's static split of the rows and private accumulators), but with ggml's AVX2 arithmetic lane for
lane instead of NumPy's: a kept row is one ``ggml_vec_dot_q4_1_q8_1`` (8 float lanes, lane u accumulating
``fma(d_x*d_y, P_u, acc_u)`` with P_u the exact integer dot of elements 4u..4u+3, then ``hsum_float_8`` + summs),
``ggml_vec_dot_q4_0_q8_0`` / ``_q8_0_q8_0`` likewise, or ``ggml_vec_dot_f16``; so a kept row has the real ggml's
MUL_MAT bits (the tests check it against libggml). The weights stay in ggml's plain row layout (PowerInfer skips
single rows; the CPU_REPACK layout interleaves 8 rows, which a per-row skip cannot use).

Entry points take raw addresses like the C kernels. ``mul_mat_sparse`` / ``axpy`` are the per-thread kernels
(INIT by thread 0 and a barrier are the caller's: ``run_mul_mat_sparse`` / ``run_axpy`` drive 1..n Python threads,
which release the GIL inside the compiled code). AXPY's partials are reduced in ith order, not added racily as in
PowerInfer (see cpu/powerinfer.py).
"""
from __future__ import annotations

import threading

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .intrinsics import (
    HAVE_AVX2,
    _cvec,
    _decl,
    _i8,
    _i32,
    _i64,
    _madd_ones,
    _maddubs,
    _ptr,
    _sign_b,
    _splat,
    _vec,
    atomic_add,
    compiled,
    f32_to_f16,
    fmaf,
    fp16_to_fp32,
    ld_f32,
    ld_i8,
    ld_i32,
    ld_u8,
    ld_u16,
    st_f32,
    st_u16,
)
from .kernels import mmq_layout, quantize_row_q8, vec_dot_f16
from .program import T_F16, T_Q4_0, T_Q4_1, T_Q8_0

F32 = np.float32
_T_Q8_1 = 9          # GGML_TYPE_Q8_1: Q4_1's vec_dot_type


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
def quantize_src1(vtype, x, ne10, nr1, nb11, wdata):
    """INIT: src1's nr1 F32 rows -> vec_dot_type into wdata (Q8_0 / Q8_1 split layout as kernels.mmq_layout, or
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
def mul_mat_sparse(qtype, w, nb01, ne00, nr0, wdata, nr1, idx, idx_nb1, gid, dst, nb1, threshold, counter, nth):
    """ggml_compute_forward_mul_mat_sparse's COMPUTE pass for one thread: claim dr0 rows at a time from the
    counter (int64 at address ``counter``); gid == 0 means no gpu_idx. Returns the number of (row, column) dots
    skipped."""
    dr0 = (nr0 + 8 * nth - 1) // (8 * nth)
    nb = ne00 // 32
    o_q, o_d, o_s, o_sum, total = mmq_layout(ne00, nr1)
    acc = np.empty(8, np.float32)
    skipped = 0
    while True:
        ir010 = atomic_add(counter, dr0)
        ir011 = min(ir010 + dr0, nr0)
        for ir0 in range(ir010, ir011):
            on_gpu = gid != 0 and ld_i32(gid + ir0 * 4) == 1
            for j in range(nr1):
                out = dst + j * nb1 + ir0 * 4
                if on_gpu or ld_f32(idx + j * idx_nb1 + ir0 * 4) < threshold:
                    st_f32(out, F32(0.0))
                    skipped += 1
                    continue
                if qtype == T_F16:
                    st_f32(out, vec_dot_f16(ne00, w + ir0 * nb01, wdata + j * ne00 * 2))
                elif HAVE_AVX2:
                    yq, yd, ys = wdata + o_q + j * ne00, wdata + o_d + j * nb * 4, wdata + o_s + j * nb * 4
                    if qtype == T_Q4_1:
                        st_f32(out, row_dot_q4_1(w + ir0 * nb01, nb, yq, yd, ys))
                    elif qtype == T_Q4_0:
                        st_f32(out, row_dot_q4_0(w + ir0 * nb01, nb, yq, yd, ys))
                    else:
                        st_f32(out, row_dot_q8_0(w + ir0 * nb01, nb, yq, yd, ys))
                else:
                    st_f32(out, vec_dot_q_row(qtype, w + ir0 * nb01, nb, wdata + o_q + j * ne00,
                                              wdata + o_d + j * nb * 4, wdata + o_s + j * nb * 4, acc))
        if ir010 + dr0 >= nr0:
            break
    return skipped


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
            if (h & 0x7FFF) == 0 or gid == 0 or ld_i32(gid + r * 4) == 1 \
                    or ld_f32(idx + j * idx_nb1 + r * 4) < threshold:
                skipped += 1
                continue
            alpha = fp16_to_fp32(h)
            row = w + r * nb01
            n8 = ne00 // 8
            axpy_f16_row(row, n8, alpha, res)
            for i in range(n8 * 8, ne00):
                st_f32(res + i * 4, fmaf(fp16_to_fp32(ld_u16(row + i * 2)), alpha, ld_f32(res + i * 4)))
    return skipped



@compiled
def reduce_partials(dst, part, n, nth, ith):
    """ggviz's replacement of PowerInfer's unlocked ``res[i] += tmp[i]``: thread ith sums its share of the n
    elements over the nth partials (n floats apart), in ith order."""
    d = (n + nth - 1) // nth
    e0 = min(d * ith, n)
    e1 = min(e0 + d, n)
    for e in range(e0, e1):
        acc = F32(0.0)
        for t in range(nth):
            acc = acc + ld_f32(part + (t * n + e) * 4)
        st_f32(dst + e * 4, acc)


# ---------------------------------------------------------------------------------------------------------------------
# drivers: INIT on the calling thread, then nth threads (the compiled code releases the GIL)
# ---------------------------------------------------------------------------------------------------------------------

_VDT = {T_Q4_1: _T_Q8_1, T_Q4_0: T_Q8_0, T_Q8_0: T_Q8_0, T_F16: T_F16}


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
    a = np.ascontiguousarray(np.asarray(a), dtype=dtype)
    if shape is not None and a.shape != shape:
        raise ValueError(f"expected shape {shape}, got {a.shape}")
    return a


class SparseMatMul:
    """MUL_MAT_SPARSE on fixed weights: ``W`` as raw ggml rows (uint8 (nr0, row bytes)) of ``qtype``.

    ``__call__(x, idx, gpu_idx, threshold, nth)`` returns the (nr1, nr0) float32 result; ``prepare`` / ``run``
    split the INIT pass (src1 conversion) from the timed COMPUTE pass for the benchmark."""

    def __init__(self, qtype: int, W: np.ndarray, ne00: int):
        if qtype not in _VDT:
            raise ValueError(f"no compiled MUL_MAT_SPARSE for ggml type {qtype}")
        if ne00 % 32:
            raise ValueError("row length must be a multiple of 32")
        self.qtype, self.W, self.ne00 = qtype, np.ascontiguousarray(W), int(ne00)
        self.nr0 = self.W.shape[0]
        self.counter = np.zeros(8, np.int64)
        self._w = self.W.ctypes.data
        self._wdata: dict[int, np.ndarray] = {}      # work buffers by column count (reused between calls)

    def prepare(self, x: np.ndarray):
        x = _c(x, np.float32)
        nr1 = x.shape[0]
        vdt = _VDT[self.qtype]
        wdata = self._wdata.get(nr1)
        if wdata is None:
            size = nr1 * self.ne00 * 2 if vdt == T_F16 else mmq_layout(self.ne00, nr1)[4]
            wdata = self._wdata[nr1] = np.zeros(size + 64, np.uint8)
        quantize_src1(vdt, x.ctypes.data, self.ne00, nr1, self.ne00 * 4, wdata.ctypes.data)
        return wdata, nr1

    def run(self, prepared, idx, gpu_idx, threshold: float, nth: int = 1, out=None):
        wdata, nr1 = prepared
        idx = _c(idx, np.float32, (nr1, self.nr0))
        gid = None if gpu_idx is None else _c(gpu_idx, np.int32, (self.nr0,))
        out = np.empty((nr1, self.nr0), np.float32) if out is None else out
        self.counter[0] = 0
        args = (self.qtype, self._w, self.W.shape[1], self.ne00, self.nr0, wdata.ctypes.data, nr1,
                idx.ctypes.data, self.nr0 * 4, 0 if gid is None else gid.ctypes.data, out.ctypes.data,
                self.nr0 * 4, np.float32(threshold), self.counter.ctypes.data, nth)
        skipped = [mul_mat_sparse(*args)] if nth == 1 else _threads(lambda i: mul_mat_sparse(*args), nth)
        self.skipped = int(sum(skipped))
        return out

    def __call__(self, x, idx, gpu_idx=None, threshold: float = 0.0, nth: int = 1):
        return self.run(self.prepare(x), idx, gpu_idx, threshold, nth)


def run_axpy(Wt_f16: np.ndarray, x: np.ndarray, idx: np.ndarray, gpu_idx: np.ndarray, threshold: float = 0.0,
             nth: int = 1) -> np.ndarray:
    """AXPY on the CPU half: down_t (n_ff, ne00) F16, x (nr1, n_ff) F32 -> (nr1, ne00); gpu_idx as PowerInfer's
    CPU kernel reads it (a row is computed only where it is 0)."""
    Wt = _c(Wt_f16, np.float16)
    n_ff, ne00 = Wt.shape
    x = _c(x, np.float32)
    nr1 = x.shape[0]
    xh = np.empty((nr1, n_ff), np.uint16)
    quantize_src1(T_F16, x.ctypes.data, n_ff, nr1, n_ff * 4, xh.ctypes.data)
    idx = _c(idx, np.float32, (nr1, n_ff))
    gid = _c(gpu_idx, np.int32, (n_ff,))
    part = np.empty((nth, nr1, ne00), np.float32)
    out = np.empty((nr1, ne00), np.float32)

    def body(i):
        s = axpy(Wt.ctypes.data, ne00 * 2, ne00, n_ff, xh.ctypes.data, nr1, idx.ctypes.data, n_ff * 4,
                 gid.ctypes.data, np.float32(threshold), part[i].ctypes.data, i, nth)
        return s
    _threads(body, nth)
    # the barrier between the passes is the join of _threads; then the ith-order reduction
    _threads(lambda i: reduce_partials(out.ctypes.data, part.ctypes.data, nr1 * ne00, nth, i), nth)
    return out
