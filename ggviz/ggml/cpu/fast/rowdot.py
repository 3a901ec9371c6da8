"""Row helpers of the compiled kernels that more than one kernel module uses: src1 rows quantized for the vec_dots
(``quantize_row_q8_0`` / ``quantize_row_q8_1`` of arch/x86/quants.c, AVX2, into ggviz's split layout) and the float
dot products ``ggml_vec_dot_f16`` / ``ggml_vec_dot_f32`` of vec.cpp.

Not a ggml source file: these lived in ``kernels.py``; they sit apart so that ``kernels.py`` (the compiled graph walk)
can call PowerInfer's kernels in ``sparse.py``, which need them too, without an import cycle.
"""
from __future__ import annotations

import numpy as np

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

@compiled
def quantize_row_q8(x, nb00, k, qy, dy, sy, ysum, with_sum):
    """One row of k floats at ``x`` (element stride nb00) -> int8 quants at qy, per block float32 d (the F16C-
    rounded scale), s (Q8_1: F16C(d*sum)), and the int32 sum of the int8 quants."""
    nb = k // 32
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
