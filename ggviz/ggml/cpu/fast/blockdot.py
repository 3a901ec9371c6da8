"""The faithful path's Q4_1 x Q8_1 and Q8_0 x Q8_0 vec_dots, compiled: ``cpu/quants.py``'s arithmetic, in Numba.

Not a ggml source file. ``cpu/quants.vec_dot`` computes a Q4_1 . Q8_1 dot product (``ggml_vec_dot_q4_1_q8_1``) in
block order, not the AVX2 kernel's 8-lane order (the repacked path, ``cpu/repack.py``, has that one): per block b
the exact integer sum S_b of the levels' products, then, in float32,

    acc += (d_y[b] * d_x[b]) * (float) S_b        block after block, from acc = 0
    summs += s_y[b] * m_x[b]                      block after block, from summs = 0
    result = acc + summs

and Q8_0 . Q8_0 (``ggml_vec_dot_q8_0_q8_0``) lane for lane as the AVX2 kernel (``_vec_dot_avx2_tile``): 8 lanes,
``acc_l = fma(d_y*d_x, (float) S_l, acc_l)`` block after block, then ``hsum_float_8``; and Q4_1 . Q8_1 in that lane
order too (plus the ``m_x * s_y`` sum) where ``vec_dot(..., exact=True)`` asks for it: PowerInfer's sparse kernels.

The kernels below are those sequences of float32 operations, element for element (each product and sum rounded to
float32 as NumPy rounds it, one rounding per FMA as ``libm.fma32``; no reassociation: ``compiled`` has no fastmath),
so their results are the NumPy kernels' bits (tests/test_quants.py compares them); they read the packed blocks
directly instead of unpacking the rows to float32 matrices first. ``cpu/quants.vec_dot`` uses them for raw rows when
this package is importable: the faithful MUL_MAT of the step-through views (the weights in host memory,
``use_extra_bufts=False``), ~10-30x faster per call than the NumPy kernels.
"""
from __future__ import annotations

import numpy as np

from .intrinsics import F32, compiled, fmaf, fp16_to_fp32

QK = 32                 # elements per block (QK4_1 == QK8_1)
Q4_1_BYTES = 20         # block_q4_1: ggml_half d, ggml_half m, uint8_t qs[16]
Q8_1_BYTES = 36         # block_q8_1: ggml_half d, ggml_half s, int8_t qs[32]
Q8_0_BYTES = 34         # block_q8_0: ggml_half d, int8_t qs[32]


@compiled
def _half(row, off):
    """The little-endian ggml_half at row[off:off + 2] as float32 (exact)."""
    return fp16_to_fp32(np.uint16(np.uint16(row[off]) | np.uint16(np.uint16(row[off + 1]) << np.uint16(8))))


@compiled
def _q8_1_blocks(y, nb):
    """Q8_1 rows y (N, nb*36) uint8 -> their int8 levels as int32 (N, nb*32) and the float32 d, s of every block."""
    N = y.shape[0]
    yq = np.empty((N, nb * QK), np.int32)
    yd = np.empty((N, nb), np.float32)
    ys = np.empty((N, nb), np.float32)
    for j in range(N):
        for b in range(nb):
            o = b * Q8_1_BYTES
            yd[j, b] = _half(y[j], o)
            ys[j, b] = _half(y[j], o + 2)
            for k in range(QK):
                v = np.int32(y[j, o + 4 + k])
                yq[j, b * QK + k] = v - 256 if v >= 128 else v
    return yq, yd, ys


@compiled
def _q4_1_blocks(row, nb, xq, xd, xm):
    """One Q4_1 row (nb*20 bytes) -> its levels 0..15 in element order into xq (nb*32), d and m into xd, xm:
    element k of a block is the low nibble of qs[k], element k + 16 its high nibble."""
    for b in range(nb):
        o = b * Q4_1_BYTES
        xd[b] = _half(row, o)
        xm[b] = _half(row, o + 2)
        for k in range(16):
            v = np.int32(row[o + 4 + k])
            xq[b * QK + k] = v & 15
            xq[b * QK + 16 + k] = v >> 4


@compiled
def _block_lanes(acc, d, xq, yq, j, b):
    """One block of the AVX2 kernels: ``acc_l = fma(d, (float) S_l, acc_l)`` for the 8 int32 lanes (maddubs + madd
    put the products of elements 4l..4l+3 of the block in lane l; S_l is exact)."""
    for lane in range(8):
        k0 = b * QK + 4 * lane
        s = (xq[k0] * yq[j, k0] + xq[k0 + 1] * yq[j, k0 + 1] + xq[k0 + 2] * yq[j, k0 + 2]
             + xq[k0 + 3] * yq[j, k0 + 3])
        acc[lane] = fmaf(d, F32(s), acc[lane])


@compiled
def _hsum_float_8(acc):
    """hsum_float_8: ``(acc_4 + acc_0) + (acc_6 + acc_2)``, ``(acc_5 + acc_1) + (acc_7 + acc_3)``, their sum."""
    lo = F32(F32(acc[4] + acc[0]) + F32(acc[6] + acc[2]))
    hi = F32(F32(acc[5] + acc[1]) + F32(acc[7] + acc[3]))
    return F32(lo + hi)


@compiled
def vec_dot_q8_0_q8_0(x, y, out):
    """out[j, i] = x[i] . y[j] for Q8_0 rows x (M, nb*34) uint8 and Q8_0 rows y (N, nb*34) uint8, float32 (N, M),
    as ``cpu/quants._vec_dot_avx2_tile`` computes ggml_vec_dot_q8_0_q8_0 (AVX2) lane for lane: per block
    ``acc_l = fma(d_y*d_x, (float) S_l, acc_l)`` with S_l the exact sum of the products of elements 4l..4l+3,
    then hsum_float_8 (``(acc_4 + acc_0) + (acc_6 + acc_2)``, ``(acc_5 + acc_1) + (acc_7 + acc_3)``, their sum)."""
    M, N = x.shape[0], y.shape[0]
    nb = x.shape[1] // Q8_0_BYTES
    yq = np.empty((N, nb * QK), np.int32)
    yd = np.empty((N, nb), np.float32)
    for j in range(N):
        for b in range(nb):
            o = b * Q8_0_BYTES
            yd[j, b] = _half(y[j], o)
            for k in range(QK):
                v = np.int32(y[j, o + 2 + k])
                yq[j, b * QK + k] = v - 256 if v >= 128 else v
    xq = np.empty(nb * QK, np.int32)
    xd = np.empty(nb, np.float32)
    acc = np.empty(8, np.float32)
    for i in range(M):
        row = x[i]
        for b in range(nb):
            o = b * Q8_0_BYTES
            xd[b] = _half(row, o)
            for k in range(QK):
                v = np.int32(row[o + 2 + k])
                xq[b * QK + k] = v - 256 if v >= 128 else v
        for j in range(N):
            acc[:] = F32(0.0)
            for b in range(nb):
                d = F32(yd[j, b] * xd[b])
                _block_lanes(acc, d, xq, yq, j, b)
            out[j, i] = _hsum_float_8(acc)


@compiled
def _vec_dot_q4_1(x, y, out, avx2_lanes):
    """The two Q4_1 . Q8_1 orders (below) over the same unpacked blocks."""
    M, N = x.shape[0], y.shape[0]
    nb = x.shape[1] // Q4_1_BYTES
    # src1's blocks once: int8 levels and the float32 d, s of every block
    yq, yd, ys = _q8_1_blocks(y, nb)
    xq = np.empty(nb * QK, np.int32)
    xd = np.empty(nb, np.float32)
    xm = np.empty(nb, np.float32)
    lanes = np.empty(8, np.float32)
    for i in range(M):
        _q4_1_blocks(x[i], nb, xq, xd, xm)
        for j in range(N):
            summs = F32(0.0)
            if avx2_lanes:
                lanes[:] = F32(0.0)
                for b in range(nb):
                    summs = F32(summs + F32(xm[b] * ys[j, b]))
                    _block_lanes(lanes, F32(yd[j, b] * xd[b]), xq, yq, j, b)
                out[j, i] = F32(_hsum_float_8(lanes) + summs)
                continue
            acc = F32(0.0)
            for b in range(nb):
                s = np.int32(0)
                for k in range(b * QK, (b + 1) * QK):
                    s += xq[k] * yq[j, k]
                coef = F32(yd[j, b] * xd[b])            # one float32 rounding (exact for two fp16 values)
                acc = F32(acc + F32(coef * F32(s)))     # |S_b| <= 15*128*32 < 2^24: exact in float32
            for b in range(nb):
                summs = F32(summs + F32(ys[j, b] * xm[b]))
            out[j, i] = F32(acc + summs)


@compiled
def vec_dot_q4_1_q8_1(x, y, out):
    """out[j, i] = x[i] . y[j] for Q4_1 rows x (M, nb*20) uint8 and Q8_1 rows y (N, nb*36) uint8, float32 (N, M),
    in the block order of ``cpu/quants._scaled_block_dot`` (see the module docstring)."""
    _vec_dot_q4_1(x, y, out, False)


@compiled
def vec_dot_q4_1_q8_1_avx2(x, y, out):
    """out[j, i] = x[i] . y[j] for Q4_1 rows x (M, nb*20) uint8 and Q8_1 rows y (N, nb*36) uint8, float32 (N, M),
    as ``cpu/quants._vec_dot_avx2_tile`` computes ggml_vec_dot_q4_1_q8_1 (AVX2) lane for lane (``vec_dot(...,
    exact=True)``: PowerInfer's sparse kernels): ``bytes_from_nibbles_32`` puts the low nibbles of qs[0..15] in bytes
    0..15 and the high ones in bytes 16..31 (elements 0..31 in order), so lane l sums elements 4l..4l+3 as for Q8_0;
    per block ``acc_l = fma(d_x*d_y, (float) S_l, acc_l)`` and ``summs += m_x * s_y`` (a product of two fp16 values,
    exact in float32), then ``hsum_float_8(acc) + summs``."""
    _vec_dot_q4_1(x, y, out, True)


@compiled
def _fma32_flat(a, b, c, out):
    for i in range(out.size):
        out[i] = fmaf(a[i], b[i], c[i])


def fma32(a, b, c) -> np.ndarray:
    """``libm.fma32`` compiled: the single-rounding float32 ``a*b + c`` of the broadcast operands, by the FMA
    instruction (llvm.fma.f32) -- the same bits (tests/test_cpu_ops.py), one pass instead of ~10 NumPy passes and a
    round-to-odd fix-up. The faithful kernels call it block after block (``cpu/quants._vec_dot_avx2_tile``,
    ``cpu/ops.py``'s FMA sites): there the NumPy emulation was ~45 % of a PowerInfer hybrid step's CPU time."""
    a, b, c = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32), np.asarray(c, F32))
    out = np.empty(a.shape, F32)
    if out.size:
        _fma32_flat(np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1),
                    np.ascontiguousarray(c).reshape(-1), out.reshape(-1))
    return out

