"""Row helpers of the compiled kernels that more than one kernel module uses: src1 rows quantized for the vec_dots
(``quantize_row_q8_0`` / ``quantize_row_q8_1`` of arch/x86/quants.c, AVX2, into ggviz's split layout) and the float
dot products ``ggml_vec_dot_f16`` / ``ggml_vec_dot_f32`` of vec.cpp.

Not a ggml source file: these lived in ``kernels.py``; they sit apart so that ``kernels.py`` (the compiled graph walk)
can call PowerInfer's kernels in ``sparse.py``, which need them too, without an import cycle.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .intrinsics import (
    HAVE_AVX2,
    compiled,
    fmaf,
    fp16_to_fp32,
    fp32_to_fp16,
    ld_f32,
    ld_u16,
    st_f32,
    st_i8,
    st_i32,
    vec_dot_f16_simd,
    vec_dot_f16_simd16,
    vec_dot_f32_simd,
)

F32 = np.float32

# =================================================================================================================
# quantization of src1 rows (quantize_row_q8_0 / quantize_row_q8_1, AVX2), split layout
# =================================================================================================================

@compiled
def _maxps(a, b):
    return a if a > b else b

@intrinsic
def q8_block(typingctx, xb, qy, out):
    """One block of 32 contiguous floats at xb -> 32 int8 quants at qy, as quantize_row_q8's loop below (the same
    selects, the same float ops, the same integers) in vector IR; returns amax / 127 (the unrounded d) and writes
    the int32 sum of the quants at ``out`` and the wrapping int32 sum of the rounded values (before the int8
    saturation: Q8_1's s) at out + 4."""
    def codegen(context, builder, sig, args):
        xb, qy, out = args
        f32, i32, i8 = ir.FloatType(), ir.IntType(32), ir.IntType(8)
        v32 = ir.VectorType(f32, 32)
        iv32 = ir.VectorType(i32, 32)

        def const(t, n, v):
            return ir.Constant(ir.VectorType(t, n), [ir.Constant(t, v)] * n)

        def fabs(v):
            name = f"llvm.fabs.v{v.type.count}f32" if isinstance(v.type, ir.VectorType) else "llvm.fabs.f32"
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type, [v.type]), name)
            return builder.call(fn, [v])

        def maxps(a, b):            # _mm256_max_ps(a, b): a if a > b else b (b where either is NaN)
            return builder.select(builder.fcmp_ordered(">", a, b), a, b)

        x = builder.load(builder.inttoptr(xb, v32.as_pointer()), align=1)
        ax = fabs(x)
        lanes = builder.shuffle_vector(ax, ax, ir.Constant(ir.VectorType(i32, 8), list(range(8))))
        for v in range(1, 4):
            nxt = builder.shuffle_vector(ax, ax, ir.Constant(ir.VectorType(i32, 8), list(range(8 * v, 8 * v + 8))))
            lanes = maxps(lanes, nxt)
        e = [builder.extract_element(lanes, ir.Constant(i32, j)) for j in range(8)]
        m0, m1, m2, m3 = maxps(e[4], e[0]), maxps(e[5], e[1]), maxps(e[6], e[2]), maxps(e[7], e[3])
        amax = maxps(maxps(m0, m2), maxps(m1, m3))
        d = builder.fdiv(amax, ir.Constant(f32, 127.0))
        idv = builder.select(builder.fcmp_unordered("!=", amax, ir.Constant(f32, 0.0)),
                             builder.fdiv(ir.Constant(f32, 127.0), amax), ir.Constant(f32, 0.0))
        vi = builder.insert_element(ir.Constant(v32, None), idv, ir.Constant(i32, 0))
        v = builder.fmul(x, builder.shuffle_vector(vi, vi, ir.Constant(ir.VectorType(i32, 32), [0] * 32)))
        # _mm256_round_ps(nearest) then _mm256_cvtps_epi32 (NaN / out of range -> INT_MIN)
        bad = builder.or_(builder.fcmp_unordered("uno", v, v),
                          builder.fcmp_ordered(">=", fabs(v), const(f32, 32, 2147483648.0)))
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v32]), "llvm.rint.v32f32")
        r = builder.select(bad, const(f32, 32, 0.0), builder.call(rint, [v]))
        iv = builder.select(bad, const(i32, 32, -2147483648), builder.fptosi(r, iv32))
        q = builder.select(builder.icmp_signed(">", iv, const(i32, 32, 127)), const(i32, 32, 127), iv)
        q = builder.select(builder.icmp_signed("<", q, const(i32, 32, -128)), const(i32, 32, -128), q)
        qp = builder.inttoptr(qy, ir.VectorType(i8, 32).as_pointer())
        builder.store(builder.trunc(q, ir.VectorType(i8, 32)), qp, align=1)

        def hadd(w):                # exact (wrapping) integer sum: any order
            n = 32
            while n > 1:
                n //= 2
                lo = builder.shuffle_vector(w, w, ir.Constant(ir.VectorType(i32, n), list(range(n))))
                hi = builder.shuffle_vector(w, w, ir.Constant(ir.VectorType(i32, n), list(range(n, 2 * n))))
                w = builder.add(lo, hi)
            return builder.extract_element(w, ir.Constant(i32, 0))
        po = builder.inttoptr(out, i32.as_pointer())
        builder.store(hadd(q), po, align=1)
        builder.store(hadd(iv), builder.gep(po, [ir.Constant(i32, 1)]), align=1)
        return d
    return types.float32(types.int64, types.int64, types.int64), codegen


@compiled
def quantize_row_q8(x, nb00, k, qy, dy, sy, ysum, with_sum):
    """One row of k floats at ``x`` (element stride nb00) -> int8 quants at qy, per block float32 d (the F16C-
    rounded scale), s (Q8_1: F16C(d*sum)), and the int32 sum of the int8 quants."""
    nb = k // 32
    if nb00 == 4:                   # contiguous: a block at a time in vector IR (q8_block), the same bits
        sums = np.empty(2, np.int32)
        ps = sums.ctypes.data
        for ib in range(nb):
            d = q8_block(x + ib * 128, qy + ib * 32, ps)
            st_f32(dy + ib * 4, fp16_to_fp32(fp32_to_fp16(d)))
            st_i32(ysum + ib * 4, sums[0])
            if with_sum:
                st_f32(sy + ib * 4, fp16_to_fp32(fp32_to_fp16(d * F32(sums[1]))))
            else:
                st_f32(sy + ib * 4, F32(0.0))
        return
    lanes = np.empty(8, np.float32)
    for ib in range(nb):
        xb = x + ib * 32 * nb00
        # max |x|: four 8-lane vectors, _mm256_max_ps in order, then 4 / 2 / 1 lanes
        for l in range(8):
            lanes[l] = abs(ld_f32(xb + l * nb00))
        for v in range(1, 4):
            for l in range(8):
                lanes[l] = _maxps(lanes[l], abs(ld_f32(xb + (8 * v + l) * nb00)))
        m0 = _maxps(lanes[4], lanes[0])
        m1 = _maxps(lanes[5], lanes[1])
        m2 = _maxps(lanes[6], lanes[2])
        m3 = _maxps(lanes[7], lanes[3])
        amax = _maxps(_maxps(m0, m2), _maxps(m1, m3))
        d = amax / F32(127.0)
        idv = F32(127.0) / amax if amax != F32(0.0) else F32(0.0)
        isum = np.int64(0)
        qsum = np.int32(0)
        for j in range(32):
            v = ld_f32(xb + j * nb00) * idv
            # _mm256_round_ps(nearest) then _mm256_cvtps_epi32 (NaN / out of range -> INT_MIN)
            if v != v or abs(v) >= F32(2147483648.0):
                iv = np.int64(-2147483648)
            else:
                iv = np.int64(np.rint(v))
            isum += iv
            q = iv
            if q > 127:
                q = 127
            elif q < -128:
                q = -128
            st_i8(qy + ib * 32 + j, np.int8(q))
            qsum += np.int32(q)
        dh = fp32_to_fp16(d)
        st_f32(dy + ib * 4, fp16_to_fp32(dh))
        st_i32(ysum + ib * 4, qsum)
        if with_sum:
            # hsum of the int32 lanes wraps like the SIMD adds
            s32 = np.int32(isum)
            st_f32(sy + ib * 4, fp16_to_fp32(fp32_to_fp16(d * F32(s32))))
        else:
            st_f32(sy + ib * 4, F32(0.0))

@compiled
def mmq_layout(ne10, nrows_y):
    """Byte offsets in the work buffer of the quantized src1: quants, d, s, sums; and the total size."""
    nb = ne10 // 32
    o_q = 0
    o_d = (nrows_y * ne10 + 63) // 64 * 64
    o_s = o_d + (nrows_y * nb * 4 + 63) // 64 * 64
    o_sum = o_s + (nrows_y * nb * 4 + 63) // 64 * 64
    total = o_sum + (nrows_y * nb * 4 + 63) // 64 * 64
    return o_q, o_d, o_s, o_sum, total

# =================================================================================================================
# ggml_vec_dot_f16 / ggml_vec_dot_f32 (vec.cpp, AVX2: 4 x 8 FMA lanes)
# =================================================================================================================

@compiled
def vec_dot_f16(n, x, y):
    n32 = n // 32
    if HAVE_AVX2:
        sumf = np.float64(vec_dot_f16_simd(x, y, n32))
    else:
        acc = np.zeros(32, np.float32)
        for i in range(n32):
            for j in range(32):
                acc[j] = acc[j] + fp16_to_fp32(ld_u16(x + 2 * (32 * i + j))) * fp16_to_fp32(ld_u16(y + 2 * (32 * i + j)))
        for j in range(16):
            acc[j] = acc[j] + acc[j + 16]
        for j in range(8):
            acc[j] = acc[j] + acc[j + 8]
        t0 = np.empty(4, np.float32)
        for j in range(4):
            t0[j] = acc[j] + acc[j + 4]
        sumf = np.float64((t0[0] + t0[1]) + (t0[2] + t0[3]))
    for i in range(n32 * 32, n):
        sumf += np.float64(fp16_to_fp32(ld_u16(x + 2 * i)) * fp16_to_fp32(ld_u16(y + 2 * i)))
    return F32(sumf)

@compiled
def vec_dot_f16_16(n, x, y):
    """ggml_vec_dot_f16 as the AVX-512 build computes it (zen4 variant): GGML_F16_STEP 64 = 4 accumulators of 16
    lanes, GGML_F32x16_REDUCE (x0+x2, x1+x3, their sum, _mm512_reduce_add_ps), the n % 64 leftovers in double."""
    n64 = n // 64
    if HAVE_AVX2:
        sumf = np.float64(vec_dot_f16_simd16(x, y, n64))
    else:
        acc = np.zeros(64, np.float32)
        for i in range(n64):
            for j in range(64):
                acc[j] = acc[j] + fp16_to_fp32(ld_u16(x + 2 * (64 * i + j))) * fp16_to_fp32(ld_u16(y + 2 * (64 * i + j)))
        for j in range(32):
            acc[j] = acc[j] + acc[j + 32]
        for j in range(16):
            acc[j] = acc[j] + acc[j + 16]
        for w in (8, 4, 2, 1):
            for j in range(w):
                acc[j] = acc[j] + acc[j + w]
        sumf = np.float64(acc[0])
    for i in range(n64 * 64, n):
        sumf += np.float64(fp16_to_fp32(ld_u16(x + 2 * i)) * fp16_to_fp32(ld_u16(y + 2 * i)))
    return F32(sumf)

@compiled
def vec_dot_f32(n, x, y):
    n32 = n // 32
    if HAVE_AVX2:
        sumf = vec_dot_f32_simd(x, y, n32)
    else:
        acc = np.zeros(32, np.float32)
        for i in range(n32):
            for j in range(32):
                acc[j] = fmaf(ld_f32(x + 4 * (32 * i + j)), ld_f32(y + 4 * (32 * i + j)), acc[j])
        for j in range(16):
            acc[j] = acc[j] + acc[j + 16]
        for j in range(8):
            acc[j] = acc[j] + acc[j + 8]
        t0 = np.empty(4, np.float32)
        for j in range(4):
            t0[j] = acc[j] + acc[j + 4]
        sumf = (t0[0] + t0[1]) + (t0[2] + t0[3])
    # the leftover loop as the compiler emits it for ggml's scalar tail: 8- and 4-wide multiplies added in order,
    # then a fused multiply-add for the last (n % 32) % 4 elements
    r = n - n32 * 32
    for i in range(n32 * 32, n - r % 4):
        sumf += ld_f32(x + 4 * i) * ld_f32(y + 4 * i)
    for i in range(n - r % 4, n):
        sumf = fmaf(ld_f32(x + 4 * i), ld_f32(y + 4 * i), sumf)
    return sumf
