"""The CPU backend's side of the quant types: from_float, vec_dot and vec_dot_type.

Mirrors, from ggml 0.20.2 ``src/ggml-cpu``:

* ``ggml-cpu.c``: ``type_traits_cpu`` (``from_float``, ``vec_dot``, ``vec_dot_type``,
  ``nrows``), ``ggml_cpu_fp32_to_fp16``, ``ggml_cpu_fp32_to_bf16``, ``ggml_cpu_fp32_to_fp32``;
* ``arch/x86/quants.c`` as built for AVX2+FMA+F16C (the oracle's build; for Gemma-3's types, ggml 0.25.3 as
  llama-cpp-python 0.3.36 vendors it, whose kernels for them are the same):
  ``quantize_row_q8_0``, ``quantize_row_q8_1``, ``quantize_row_q8_K`` and
  ``ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0``, ``ggml_vec_dot_{q4_1,q5_1}_q8_1``,
  ``ggml_vec_dot_q{2,3,4,5,6}_K_q8_K``;
* ``tiled/tiled-kernel.cpp`` (ggml 0.25.3): the AVX2 microtile's float steps for Q4_K / Q6_K (``vec_dot_tiled``);
* ``quants.c``: ``quantize_row_q4_0`` ... ``quantize_row_q6_K`` (thin wrappers of the
  ``_ref`` quantisers);
* the ``vec_dot`` entry for F32 / F16 / BF16, whose kernels (vec.cpp's ``ggml_vec_dot_f32``, ``ggml_vec_dot_f16``,
  ``ggml_vec_dot_bf16``) are in ``vec.py``.

from_float is bit-exact with the AVX2 library.  The SIMD quantisers differ from the
reference ones of ggml-quants.c in ways that show in the bits: they scale by
``127/amax`` instead of ``1/(amax/127)``, round half to even (``_mm256_round_ps``)
instead of ``roundf``'s half away from zero, saturate when packing to int8, convert
scales with F16C, and q8_1's ``s`` is ``d * sum(q)`` computed from the int32 sums.

vec_dot for F32 / F16 / BF16 is ggml_vec_dot_f32 / _f16 / _bf16 of the AVX2+FMA build
operation for operation (4 accumulators x 8 lanes, exact fused multiply-adds,
GGML_F32x8_REDUCE, the leftover loop as gcc compiled it): bit-identical to the library.
For q8_0, q5_0, q4_K and q6_K (Gemma-3's types) vec_dot is the AVX2 kernel lane for lane
(``AVX2_EXACT``; checked against the ggml that llama-cpp-python 0.3.36 vendors): 8 float32
lanes, lane l accumulating ``fmadd(d, (float) S_l, acc_l)`` where S_l is the exact int32 sum
of the block's elements whose index mod 32 is in 4l..4l+3 (sub-block scales folded in;
q6_K subtracts its -32 offset per lane as ``32*(bsums[2l]*sc[2l] + bsums[2l+1]*sc[2l+1])``,
q4_K keeps 4 more lanes for the mins), then ``hsum_float_8``: bit-identical.  That ggml
also runs MUL_MATs of >= 8 src1 rows of q4_K / q6_K through tiled.cpp (one float lane per
output: ``res = d_x*s1 [- dmin_x*s2]``, ``buf = fmadd(res, d_y, buf)``): ``vec_dot_tiled``.
For the other quant types vec_dot reproduces the AVX2 kernels' arithmetic structure: the int8
products of a block (or sub-block) are summed exactly as integers, multiplied by the
float32 block scale ``d_x*d_y``, and the blocks are summed in float32 (q4_1 / q5_1's
``summs`` in the kernel's own order).  Only the order of the float32 additions differs
from the library's 8-lane accumulators, so results agree to a few float32 ulps
(relative ~1e-7 of the sum of |terms|), not bit for bit. ``vec_dot(..., exact=True)`` also takes q4_0 / q4_1
through the lane-for-lane path (``AVX2_EXACT_ON_REQUEST``; slower; PowerInfer's MUL_MAT_SPARSE uses it).

Either way every output element is computed by a fixed sequence of operations of its
own, whatever rows and columns are computed with it: no BLAS call sums floats (the
sgemms below only add small integers, exactly), so MUL_MAT's split into per-thread
chunks cannot change a bit.

How the quant types are fast: all rows are done at once.  The integer quant levels of src0 (M rows)
and src1 (N rows) are unpacked to float32 matrices; for each block b one BLAS sgemm
gives the (N, M) matrix of exact integer block sums ``S_b = Y_b @ X_b.T`` (exact
because every partial sum stays below 2^24: the sub-block scales of the K-quants are
folded into X and the depth of each product is chosen so that this holds), then
``out += (d_y[:, b] outer d_x[:, b]) * S_b``.  Memory is O(M*n + N*n + N*M) float32
(4 bytes per weight, versus 0.5-1 byte in the packed format); time is one
(N x n) @ (n x M) sgemm split into thin pieces of depth 32..256, plus 3 passes over an
(N, M) array per block.  Use :func:`prepare` to unpack a weight matrix once when the
same src0 is multiplied many times. Where the compiled fast path is importable (Numba), raw Q4_1 and Q8_0 rows
skip all that: ``fast/blockdot.py`` runs the same float32 operations per element on the packed blocks (the same
bits, tests/test_quants.py), which is what the faithful MUL_MAT of a step-through decode spends most of its time in.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import quants as Q
from ..consts import (
    GGML_TYPE_BF16,
    GGML_TYPE_F16,
    GGML_TYPE_F32,
    GGML_TYPE_I32,
    GGML_TYPE_IQ1_M,
    GGML_TYPE_IQ1_S,
    GGML_TYPE_IQ2_S,
    GGML_TYPE_IQ2_XS,
    GGML_TYPE_IQ2_XXS,
    GGML_TYPE_IQ3_S,
    GGML_TYPE_IQ3_XXS,
    GGML_TYPE_IQ4_NL,
    GGML_TYPE_IQ4_XS,
    GGML_TYPE_MXFP4,
    GGML_TYPE_NVFP4,
    GGML_TYPE_Q1_0,
    GGML_TYPE_Q2_0,
    GGML_TYPE_Q2_K,
    GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_0,
    GGML_TYPE_Q4_1,
    GGML_TYPE_Q4_K,
    GGML_TYPE_Q5_0,
    GGML_TYPE_Q5_1,
    GGML_TYPE_Q5_K,
    GGML_TYPE_Q6_K,
    GGML_TYPE_Q8_0,
    GGML_TYPE_Q8_1,
    GGML_TYPE_Q8_K,
    GGML_TYPE_TQ1_0,
    GGML_TYPE_TQ2_0,
    TYPE_TRAITS,
)
from . import libm, vec

try:        # the block-order Q4_1 vec_dot below, compiled (the same bits): used where the fast path is importable
    from .fast import blockdot as _blockdot
except ImportError:         # no Numba, or GGVIZ_NO_NUMBA=1
    _blockdot = None
# libm.fma32, compiled where the fast path is importable (the same bits, ~10x fewer passes over the operands)
fma32 = libm.fma32 if _blockdot is None else _blockdot.fma32

__all__ = [
    "VEC_DOT_TYPE", "HAS_VEC_DOT", "HAS_FROM_FLOAT", "NROWS",
    "cpu_fp32_to_fp16", "from_float", "prepare", "PreparedRows", "vec_dot", "vec_dot_groups",
    "AVX2_EXACT", "TILED_TYPES", "TILED_MIN_BATCH", "hsum_float_8", "vec_dot_tiled",
]

_F32 = np.float32

# type_traits_cpu[].vec_dot_type.  Entries the C table leaves out (Q8_K, I32, F64, ...)
# are zero-initialised, i.e. GGML_TYPE_F32, as in C.
_VEC_DOT_TYPE_SET = {
    GGML_TYPE_F32: GGML_TYPE_F32,
    GGML_TYPE_F16: GGML_TYPE_F16,
    GGML_TYPE_BF16: GGML_TYPE_BF16,
    GGML_TYPE_Q1_0: GGML_TYPE_Q8_0,
    GGML_TYPE_Q2_0: GGML_TYPE_Q8_0,
    GGML_TYPE_Q4_0: GGML_TYPE_Q8_0,
    GGML_TYPE_Q4_1: GGML_TYPE_Q8_1,
    GGML_TYPE_Q5_0: GGML_TYPE_Q8_0,
    GGML_TYPE_Q5_1: GGML_TYPE_Q8_1,
    GGML_TYPE_Q8_0: GGML_TYPE_Q8_0,
    GGML_TYPE_Q8_1: GGML_TYPE_Q8_1,
    GGML_TYPE_MXFP4: GGML_TYPE_Q8_0,
    GGML_TYPE_NVFP4: GGML_TYPE_Q8_0,
    GGML_TYPE_Q2_K: GGML_TYPE_Q8_K,
    GGML_TYPE_Q3_K: GGML_TYPE_Q8_K,
    GGML_TYPE_Q4_K: GGML_TYPE_Q8_K,
    GGML_TYPE_Q5_K: GGML_TYPE_Q8_K,
    GGML_TYPE_Q6_K: GGML_TYPE_Q8_K,
    GGML_TYPE_IQ2_XXS: GGML_TYPE_Q8_K,
    GGML_TYPE_IQ2_XS: GGML_TYPE_Q8_K,
    GGML_TYPE_IQ3_XXS: GGML_TYPE_Q8_K,
    GGML_TYPE_IQ3_S: GGML_TYPE_Q8_K,
    GGML_TYPE_IQ2_S: GGML_TYPE_Q8_K,
    GGML_TYPE_IQ1_S: GGML_TYPE_Q8_K,
    GGML_TYPE_IQ1_M: GGML_TYPE_Q8_K,
    GGML_TYPE_IQ4_NL: GGML_TYPE_Q8_0,
    GGML_TYPE_IQ4_XS: GGML_TYPE_Q8_K,
    GGML_TYPE_TQ1_0: GGML_TYPE_Q8_K,
    GGML_TYPE_TQ2_0: GGML_TYPE_Q8_K,
}
VEC_DOT_TYPE: dict[int, int] = {t: _VEC_DOT_TYPE_SET.get(t, GGML_TYPE_F32)
                                for t, tr in TYPE_TRAITS.items() if tr is not None}

# types whose type_traits_cpu has a vec_dot / a from_float at all (C: non-NULL pointers)
HAS_VEC_DOT = frozenset(t for t in _VEC_DOT_TYPE_SET if t != GGML_TYPE_Q8_1)
HAS_FROM_FLOAT = frozenset({
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q1_0, GGML_TYPE_Q2_0,
    GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
    GGML_TYPE_Q8_1, GGML_TYPE_MXFP4, GGML_TYPE_NVFP4, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
    GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
    GGML_TYPE_Q8_K, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_I32,
})
# type_traits_cpu[].nrows: 2 only with __ARM_FEATURE_MATMUL_INT8, so 1 on x86
NROWS: dict[int, int] = {t: (1 if t in HAS_VEC_DOT or t == GGML_TYPE_Q8_1 else 0) for t in VEC_DOT_TYPE}


# ---------------------------------------------------------------------------------
# from_float
# ---------------------------------------------------------------------------------


def cpu_fp32_to_fp16(x) -> np.ndarray:
    """GGML_CPU_FP32_TO_FP16 / ggml_cpu_fp32_to_fp16 with F16C (vcvtps2ph, round to nearest even).

    Same as ggml-base's conversion except for NaN: the hardware keeps the sign and the
    top 10 payload bits and sets the quiet bit, where ggml-base returns a bare 0x7E00.
    """
    x = np.asarray(x, dtype=np.float32)
    h = Q.fp32_to_fp16(x)
    nan = np.isnan(x)
    if nan.any():
        u = x.view(np.uint32)
        hw = ((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)
        h = np.where(nan, hw.astype(np.uint16), h)
    return h


def _maxps(a, b):
    # _mm_max_ps(a, b) is "a > b ? a : b": with a NaN in either operand it returns b
    return np.where(a > b, a, b)


def _avx_absmax32(x: np.ndarray) -> np.ndarray:
    """max |x| of each 32-block (nb, 32) reduced exactly as the AVX code does (NaN-faithful)."""
    a = np.abs(x).reshape(-1, 4, 8)  # four __m256 of 8 lanes
    m = _maxps(_maxps(_maxps(a[:, 0], a[:, 1]), a[:, 2]), a[:, 3])
    m4 = _maxps(m[:, 4:], m[:, :4])  # _mm_max_ps(extract hi, cast lo)
    m2 = _maxps(m4[:, :2], m4[:, 2:])  # with _mm_movehl_ps(max4, max4)
    return _maxps(m2[:, 0], m2[:, 1])  # _mm_max_ss with _mm_movehdup_ps


def _cvtps_epi32(v: np.ndarray) -> np.ndarray:
    # _mm256_cvtps_epi32 on already rounded values: NaN / out of range -> 0x80000000
    with np.errstate(invalid="ignore"):
        ok = np.abs(v) < _F32(2147483648.0)
        return np.where(ok, np.where(ok, v, _F32(0)).astype(np.int32), np.int32(-2147483648))


def _quantize_q8_avx2(x: np.ndarray, with_sum: bool) -> np.ndarray:
    """quantize_row_q8_0 / quantize_row_q8_1 of arch/x86/quants.c (AVX2) on blocks x (nb, 32)."""
    t = GGML_TYPE_Q8_1 if with_sum else GGML_TYPE_Q8_0
    y = np.zeros(x.shape[0], Q.BLOCK_DTYPES[t])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        amax = _avx_absmax32(x)
        d = amax / _F32(127)
        idv = np.where(amax != 0, _F32(127) / amax, _F32(0))
        i32 = _cvtps_epi32(np.rint(x * idv[:, None]))  # _mm256_round_ps(_MM_ROUND_NEAREST)
    y["d"] = cpu_fp32_to_fp16(d).view(np.float16)
    # packs_epi32 then packs_epi16: signed saturation to int8
    y["qs"] = np.clip(i32, -128, 127).astype(np.int8)
    if with_sum:
        # hsum of the int32 lanes (wrapping), converted to float, times d
        s = (i32.astype(np.int64).sum(1) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
        y["s"] = cpu_fp32_to_fp16(d * s.astype(np.float32)).view(np.float16)
    return y


def from_float(t: int, x) -> np.ndarray:
    """type_traits_cpu[t].from_float on float32 rows (..., n) -> uint8 (..., row_size).

    This is what ggml's CPU mul_mat applies to src1 (with t = VEC_DOT_TYPE[src0.type]).
    Q8_0/Q8_1 follow the AVX2 kernels; Q8_K and the weight types call their ``_ref``
    quantiser; F16 uses F16C; BF16 ggml_compute_fp32_to_bf16; F32 is a copy.
    """
    if t not in HAS_FROM_FLOAT:
        raise NotImplementedError(f"type_traits_cpu[{Q.type_name(t)}].from_float is NULL")
    x = np.asarray(x, dtype=np.float32)
    lead, n = x.shape[:-1], x.shape[-1]
    x2 = np.ascontiguousarray(x.reshape(-1, n))
    if t == GGML_TYPE_F16:
        out = cpu_fp32_to_fp16(x2).view(np.uint8)
    elif t in (GGML_TYPE_Q8_0, GGML_TYPE_Q8_1):
        if n % 32:
            raise ValueError(f"row length {n} is not a multiple of 32")
        out = _quantize_q8_avx2(x2.reshape(-1, 32), t == GGML_TYPE_Q8_1).view(np.uint8)
    elif t in Q.BLOCK_DTYPES:
        # F32 copy, BF16 (same rounding as the reference), Q8_K and the weight types
        # (quantize_row_q4_0 ... q6_K just call the _ref quantisers)
        out = Q.quantize_row_ref(t, x2)
    else:
        raise NotImplementedError(f"from_float for {Q.type_name(t)} is not implemented in ggviz")
    return out.reshape(*lead, Q.row_size(t, n))


# ---------------------------------------------------------------------------------
# vec_dot
# ---------------------------------------------------------------------------------


class PreparedRows(NamedTuple):
    """Rows of one type unpacked for vec_dot (see :func:`prepare`).

    q: (rows, n) float32 integer levels, sub-block integer scales folded in;
    d: (rows, nblocks) float32 block scale; mq, md: the optional second integer
    product of the K-quants' mins (mq (rows, nblocks*k), md (rows, nblocks));
    bias: optional (rows, nblocks) float32 per-block additive term (q4_1/q5_1 m, q8_1 s).
    """
    type: int
    n: int
    q: np.ndarray
    d: np.ndarray
    mq: np.ndarray | None = None
    md: np.ndarray | None = None
    bias: np.ndarray | None = None


def _lf(a):
    return a.astype(np.float32)


def _as_rows(t: int, x) -> np.ndarray:
    """Raw bytes (rows, row_bytes) of rows given as bytes or as typed F32/F16/BF16 values."""
    a = np.asarray(x)
    if a.dtype != np.uint8:
        if t == GGML_TYPE_F32:
            a = a.astype(np.float32, copy=False)
        elif t in (GGML_TYPE_F16, GGML_TYPE_BF16) and a.dtype.kind == "f" and a.dtype != np.float16:
            # a float32 array is ambiguous here (values? bits?): make the caller convert
            raise TypeError(f"{Q.type_name(t)} rows must be given as bits (uint16/uint8)"
                            + (" or float16" if t == GGML_TYPE_F16 else "")
                            + f", not {a.dtype}; convert with from_float")
        elif t == GGML_TYPE_BF16 and a.dtype == np.float16:
            raise TypeError("bf16 rows must be given as bits (uint16/uint8), not float16")
        # typed values / bit patterns / structured blocks: reinterpret as row bytes
        a = np.ascontiguousarray(a).view(np.uint8)
    if a.ndim == 1:
        a = a[None]
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]))


def prepare(t: int, rows) -> PreparedRows:
    """Unpack rows of type t (uint8 (R, row_bytes), or typed F32/F16/BF16 (R, n)) for vec_dot."""
    raw = _as_rows(t, rows)
    R = raw.shape[0]
    if t in (GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16):
        v = Q.dequantize_row(t, raw)
        return PreparedRows(t, v.shape[1], v, np.ones((R, 0), np.float32))
    if t not in Q.BLOCK_DTYPES:
        raise NotImplementedError(f"vec_dot with {Q.type_name(t)} is not implemented in ggviz")
    blocks = Q.as_blocks(t, raw)
    nb = blocks.shape[1]
    u = Q.unpack_blocks(t, blocks.reshape(-1))
    q = u["q"]
    n = nb * Q.blck_size(t)

    def rs(a):
        return a.reshape(R, -1)

    if t in (GGML_TYPE_Q4_0, GGML_TYPE_Q5_0):
        off = 8 if t == GGML_TYPE_Q4_0 else 16  # nibble - 8 / 5-bit value - 16, as signed int8
        return PreparedRows(t, n, rs(_lf(q - off)), rs(u["d"]))
    if t in (GGML_TYPE_Q4_1, GGML_TYPE_Q5_1):
        return PreparedRows(t, n, rs(_lf(q)), rs(u["d"]), bias=rs(u["m"]))
    if t == GGML_TYPE_Q8_0:
        return PreparedRows(t, n, rs(_lf(q)), rs(u["d"]))
    if t == GGML_TYPE_Q8_1:
        return PreparedRows(t, n, rs(_lf(q)), rs(u["d"]), bias=rs(u["s"]))
    if t == GGML_TYPE_Q8_K:
        # bsums are used for the K-quants' mins exactly as the AVX2 kernels do
        bs = u["bsums"]
        return PreparedRows(t, n, rs(_lf(q)), rs(u["d"]), mq=rs(_lf(bs)))
    def fold(sc, levels, k):
        # sub-block scale * level, both small integers: exact in float32
        return _lf(levels).reshape(-1, sc.shape[1], k) * _lf(sc)[:, :, None]

    if t == GGML_TYPE_Q2_K:  # 16 sub-blocks of 16: scale 4 bits, min 4 bits
        qs = fold(u["sc"], q, 16)
        return PreparedRows(t, n, rs(qs), rs(u["d"]), mq=rs(_lf(u["mn"])), md=rs(u["dmin"]))
    if t == GGML_TYPE_Q3_K:  # 16 sub-blocks of 16, signed 6-bit scales, q in [-4, 3]
        qs = fold(u["sc"], q, 16)
        return PreparedRows(t, n, rs(qs), rs(u["d"]))
    if t in (GGML_TYPE_Q4_K, GGML_TYPE_Q5_K):  # 8 sub-blocks of 32, 6-bit scales and mins
        qs = fold(u["sc"], q, 32)
        return PreparedRows(t, n, rs(qs), rs(u["d"]), mq=rs(_lf(u["mn"])), md=rs(u["dmin"]))
    if t == GGML_TYPE_Q6_K:  # 16 sub-blocks of 16, int8 scales, q in [0, 63] (the AVX2 kernel's unsigned levels)
        # the kernel subtracts the -32 offset per lane as 32*sc*bsums, so keep sc*q and the scales apart
        qs = fold(u["sc"], q, 16)
        return PreparedRows(t, n, rs(qs), rs(u["d"]), mq=rs(_lf(u["sc"])))
    raise NotImplementedError(f"vec_dot with {Q.type_name(t)} is not implemented in ggviz")


# Depth of the integer sgemm pieces per src0 type, so that every partial sum of
# |sub-block scale * level| * |q8| (<= 128) stays <= 2^24 and float32 holds it exactly:
#   q4_0..q8_0: <= 128*128*32;  q2_K: 45*128*256;  q3_K: 128*128*256;
#   q4_K: 945*128*128;  q5_K: 1953*128*64;  q6_K: 4096*128*32 = 2^24.
_DEPTH = {
    GGML_TYPE_Q4_0: 32, GGML_TYPE_Q4_1: 32, GGML_TYPE_Q5_0: 32, GGML_TYPE_Q5_1: 32,
    GGML_TYPE_Q8_0: 32, GGML_TYPE_Q2_K: 256, GGML_TYPE_Q3_K: 256, GGML_TYPE_Q4_K: 128,
    GGML_TYPE_Q5_K: 64, GGML_TYPE_Q6_K: 32,
}


def _scaled_block_dot(X, Y, dx, dy, blk, depth, bx=None, by=None):
    """sum_b (dy[:, b] outer dx[:, b]) * (Y_b @ X_b.T): (N, M) float32.

    X (M, nb*blk), Y (N, nb*blk) hold small integers, so each Y_b @ X_b.T of depth
    <= ``depth`` is exact in float32 BLAS whatever its summation order; everything else is
    element-wise, block after block, so an element's value does not depend on M or N.
    With ``bx`` / ``by`` (M, nb) / (N, nb), also returns q4_1 / q5_1's ``summs``:
    ``float summs = 0; summs += m_x[b]*s_y[b]`` block after block (products of two fp16
    values are exact in float32), else None.
    """
    M, N, nb = X.shape[0], Y.shape[0], dx.shape[1]
    out = np.zeros((N, M), np.float32)
    coef = np.empty((N, M), np.float32)
    dxT, dyT = np.ascontiguousarray(dx.T), np.ascontiguousarray(dy.T)
    summs = None
    if bx is not None:
        summs, tmp = np.zeros((N, M), np.float32), np.empty((N, M), np.float32)
        bxT, byT = np.ascontiguousarray(bx.T), np.ascontiguousarray(by.T)
    for b in range(nb):
        s = None
        for c in range(b * blk, (b + 1) * blk, depth):
            p = Y[:, c:c + depth] @ X[:, c:c + depth].T
            s = p if s is None else s + p
        np.multiply(dyT[b][:, None], dxT[b], out=coef)   # the block's d_x*d_y, one float32 rounding
        coef *= s
        out += coef
        if summs is not None:
            np.multiply(byT[b][:, None], bxT[b], out=tmp)
            summs += tmp
    return out, summs


# ---------------------------------------------------------------------------------
# vec_dot in the AVX2 kernels' own float order (bit-identical): q8_0, q5_0, q4_K, q6_K
# ---------------------------------------------------------------------------------

# The src0 types whose vec_dot follows the AVX2 kernel lane for lane (the others use the block-wise order above)
AVX2_EXACT = frozenset({GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K})
# ... and those whose lane-for-lane order ggviz also has, used where asked (``vec_dot(..., exact=True)``: PowerInfer's
# MUL_MAT_SPARSE on plain Q4_0 / Q4_1 rows, whose dense MUL_MAT ggviz runs repacked, in the kernel's own order)
AVX2_EXACT_ON_REQUEST = AVX2_EXACT | frozenset({GGML_TYPE_Q4_0, GGML_TYPE_Q4_1})
_F64 = np.float64
_LANE_TILE = 1 << 21        # lanes * N * M elements per tile: bounds the float64 scratch to ~16 MiB a piece


def hsum_float_8(acc: np.ndarray) -> np.ndarray:
    """hsum_float_8 of arch/x86/quants.c on acc (8, ...): hi128 + lo128, + movehl, + movehdup (float32)."""
    r = acc[4:] + acc[:4]
    r = r[:2] + r[2:]
    return r[0] + r[1]


def _by_lane(q: np.ndarray, nb: int, k: int) -> np.ndarray:
    """(R, nb*blk) levels -> float64 (nb, 8, R, blk/8): per block, the elements that one int32 lane of the kernel
    sums. A 256-bit register holds 32 consecutive int8 values of a row; maddubs + madd put bytes 4l..4l+3 in
    lane l, so lane l gets the elements whose index mod 32 lies in 4l..4l+3 (k registers per block)."""
    R = q.shape[0]
    a = q.reshape(R, nb, k, 8, 4).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(a.reshape(nb, 8, R, 4 * k), dtype=_F64)


def _lane_sums(Y: np.ndarray, X: np.ndarray) -> np.ndarray:
    """(8, N, K) . (8, M, K) -> (8, N, M) exact integer lane sums (float64 holds them exactly: < 2^53)."""
    return np.matmul(Y, X.transpose(0, 2, 1))


def _avx2_tile_rows(N: int, n: int) -> int:
    """src0 rows per tile: the (8, N, rows) lane arrays and the (rows, n) float64 levels stay ~16-32 MiB."""
    return max(1, min(_LANE_TILE // (8 * max(N, 1)), _LANE_TILE // max(n, 1)))


def _vec_dot_avx2(t: int, px: PreparedRows, py: PreparedRows) -> np.ndarray:
    """x . y for every pair, as ggml_vec_dot_{q8_0,q5_0}_q8_0 / ggml_vec_dot_{q4_K,q6_K}_q8_K (AVX2) compute it."""
    M, N = px.q.shape[0], py.q.shape[0]
    out = np.empty((N, M), np.float32)
    step = _avx2_tile_rows(N, px.n)
    for m0 in range(0, M, step):
        m1 = min(M, m0 + step)
        sub = PreparedRows(*(f[m0:m1] if isinstance(f, np.ndarray) else f for f in px))
        out[:, m0:m1] = _vec_dot_avx2_tile(t, sub, py)
    return out


def _vec_dot_avx2_tile(t: int, px: PreparedRows, py: PreparedRows) -> np.ndarray:
    M, N = px.q.shape[0], py.q.shape[0]
    nb = px.d.shape[1]
    acc = np.zeros((8, N, M), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if t in (GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1):
            # acc = fmadd(d_x*d_y, (float) lane sums of the block, acc), block after block; hsum_float_8
            X, Y = _by_lane(px.q, nb, 1), _by_lane(py.q, nb, 1)
            for b in range(nb):
                d = py.d[:, b, None] * px.d[None, :, b]
                acc = fma32(d, _lane_sums(Y[b], X[b]).astype(np.float32), acc)
            if t != GGML_TYPE_Q4_1:
                return hsum_float_8(acc)
            # ggml_vec_dot_q4_1_q8_1: summs += m_x * s_y block after block (exact products), then hsum + summs
            summs = np.zeros((N, M), np.float32)
            for b in range(nb):
                summs += py.bias[:, b, None] * px.bias[None, :, b]
            return hsum_float_8(acc) + summs
        # the K-quants: 8 registers of 32 per super-block; the sub-block scales are folded into px.q
        X, Y = _by_lane(px.q, nb, 8), _by_lane(py.q, nb, 8)
        bs = py.mq.reshape(N, nb, 8, 2).astype(_F64)               # bsums (of 16) in pairs
        if t == GGML_TYPE_Q4_K:
            # mins: _mm_madd_epi16(mins, hadd(bsums)) -> 4 lanes: m[2k]*B[2k] + m[2k+1]*B[2k+1], B = sum of 32
            mins = px.mq.reshape(M, nb, 4, 2).astype(_F64)
            B = bs.sum(-1).reshape(N, nb, 4, 2)
            acc_m = np.zeros((4, N, M), np.float32)
            for b in range(nb):
                d = py.d[:, b, None] * px.d[None, :, b]             # y[i].d * FP16_TO_FP32(x[i].d)
                dmin = -(py.d[:, b, None] * px.md[None, :, b])      # -y[i].d * FP16_TO_FP32(x[i].dmin)
                prod = np.einsum("nkp,mkp->knm", B[:, b], mins[:, b])
                acc_m = fma32(dmin, prod.astype(np.float32), acc_m)
                acc = fma32(d, _lane_sums(Y[b], X[b]).astype(np.float32), acc)
            m = acc_m[:2] + acc_m[2:]                               # _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m))
            return hsum_float_8(acc) + (m[0] + m[1])                # + _mm_cvtss_f32 after _mm_add_ss(movehdup)
        if t == GGML_TYPE_Q6_K:
            # sumi (levels q in [0, 63]) minus q8sclsub = 32 * madd(bsums, scales): lane k gets pair k
            sc = px.mq.reshape(M, nb, 8, 2).astype(_F64)
            for b in range(nb):
                d = py.d[:, b, None] * px.d[None, :, b]
                s = _lane_sums(Y[b], X[b]) - 32.0 * np.einsum("nkp,mkp->knm", bs[:, b], sc[:, b])
                acc = fma32(d, s.astype(np.float32), acc)
            return hsum_float_8(acc)
    raise NotImplementedError(Q.type_name(t))


# ---------------------------------------------------------------------------------
# tiled/tiled.cpp: the K-quant MUL_MAT of batches (src1 ne[1] >= 8) that ggml 0.25.3 runs before vec_dot
# ---------------------------------------------------------------------------------

# src0 types whose tiled kernel ggviz mirrors (tiled.cpp also takes Q2_K, Q3_K, Q5_K and IQ types: those still go
# through vec_dot here, so their batched MUL_MATs are not llama.cpp's bits)
TILED_TYPES = frozenset({GGML_TYPE_Q4_K, GGML_TYPE_Q6_K})
TILED_MIN_BATCH = 8         # ggml_tiled_min_batch: src1 rows >= 8 (unless GGML_CPU_TILED_MM_FORCE=1)


def vec_dot_tiled(t: int, x, y) -> np.ndarray:
    """What tiled_run_microtile_avx2 computes for src0 rows x (type t) and q8_K rows y: float32 (N, M).

    Per super-block b the exact int32 s1 = sum sc*(q [- 32])*q8 (and, Q4_K, s2 = sum min*bsum32), then
    ``res = d_x * (float) s1``; ``res = fnmadd(dmin_x, (float) s2, res)``; ``buf = fmadd(res, d_y, buf)``, block after
    block. One float lane per output, so the tiling and the threads change no bit."""
    if t not in TILED_TYPES:
        raise NotImplementedError(f"tiled mul_mat for {Q.type_name(t)} is not mirrored")
    px = x if isinstance(x, PreparedRows) else prepare(t, x)
    py = y if isinstance(y, PreparedRows) else prepare(GGML_TYPE_Q8_K, y)
    if px.n != py.n:
        raise ValueError(f"row lengths differ: {px.n} vs {py.n}")
    N, M, nb = py.q.shape[0], px.q.shape[0], px.d.shape[1]
    buf = np.zeros((N, M), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for b in range(nb):
            sl = slice(b * 256, (b + 1) * 256)
            s1 = py.q[:, sl].astype(_F64) @ px.q[:, sl].astype(_F64).T
            bs = py.mq[:, b * 16:(b + 1) * 16].astype(_F64)
            if t == GGML_TYPE_Q6_K:     # levels 0..63 folded with the scales: the -32 offset as 32*sc*bsums
                s1 -= 32.0 * (bs @ px.mq[:, b * 16:(b + 1) * 16].astype(_F64).T)
            res = px.d[None, :, b] * s1.astype(np.float32)
            if t == GGML_TYPE_Q4_K:
                s2 = bs.reshape(N, 8, 2).sum(-1) @ px.mq[:, b * 8:(b + 1) * 8].astype(_F64).T
                res = fma32(np.broadcast_to(-px.md[None, :, b], res.shape), s2.astype(np.float32), res)
            buf = fma32(res, py.d[:, b, None], buf)
    return buf


# src0 types whose vec_dot of raw rows fast/blockdot.py computes: (src0, vec_dot_type) block bytes
_COMPILED = {GGML_TYPE_Q4_1: (20, 36), GGML_TYPE_Q8_0: (34, 34)}


def _raw_rows(a, block_bytes: int) -> bool:
    """a is raw blocks the compiled kernels can read: uint8 (rows, whole blocks), each row's bytes contiguous."""
    return (isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.ndim == 2 and a.strides[1] == 1
            and a.shape[1] % block_bytes == 0 and a.shape[0] > 0)


def vec_dot(t: int, x, y, exact: bool = False) -> np.ndarray:
    """All row-by-row dot products of type_traits_cpu[t].vec_dot: returns float32 (N, M).

    x: M rows of src0 of type t, as uint8 (M, row_bytes) (or typed (M, n) for
    F32/F16/BF16), or a :class:`PreparedRows`; y: N rows already converted to
    VEC_DOT_TYPE[t] (e.g. by :func:`from_float`), same conventions.  out[j, i] is
    x[i] . y[j], the layout of ggml's mul_mat dst (ne0 = M).

    Formulas (per block b, S_b the exact integer dot product of the levels):
      q4_0, q5_0, q8_0 . q8_0:  sum_b d_x d_y S_b  (levels q-8, q-16, q)
      q4_1, q5_1 . q8_1:        sum_b d_x d_y S_b + sum_b m_x s_y
      q2_K . q8_K:  sum_b d_y d_x sum_j sc_j S_bj  - d_y dmin_x sum_j m_j bsums_j
      q3_K . q8_K:  sum_b d_y d_x sum_j sc_j S_bj  (levels in [-4, 3])
      q4_K, q5_K . q8_K:  as q2_K with 8 sub-blocks of 32 (mins use bsum pairs)
      q6_K . q8_K:  sum_b d_y d_x sum_j sc_j S_bj  (levels q-32; the AVX2 kernel
                    subtracts 32*sc_j*bsums_j instead, equal when bsums are consistent)
      f32/f16/bf16: ggml_vec_dot_f32 / _f16 / _bf16 as built for AVX2+FMA, operation for
                    operation (see ``vec.vec_dot_f32_simd``): bit-identical to the library.

    Every output element is computed by the same sequence of float operations whatever
    the shapes of x and y (no BLAS call whose summation order depends on the matrix
    sizes), so ggml's split of a MUL_MAT into per-thread chunks cannot change a bit.
    With ``exact``, q4_0 / q4_1 follow the AVX2 kernel lane for lane as well (bit-identical).
    """
    if t not in HAS_VEC_DOT:
        raise NotImplementedError(f"type_traits_cpu[{Q.type_name(t)}].vec_dot is NULL")
    vt = VEC_DOT_TYPE[t]
    if _blockdot is not None and t in _COMPILED:
        xb, yb = _COMPILED[t]
        if _raw_rows(x, xb) and _raw_rows(y, yb) and x.shape[1] // xb == y.shape[1] // yb:
            # fast/blockdot.py: this function's arithmetic for raw rows, element for element (the same bits):
            # Q4_1 in _scaled_block_dot's block order (or, exact, _vec_dot_avx2_tile's lane order), Q8_0 in
            # _vec_dot_avx2_tile's lane order
            out = np.empty((y.shape[0], x.shape[0]), np.float32)
            kernel = ((_blockdot.vec_dot_q4_1_q8_1_avx2 if exact else _blockdot.vec_dot_q4_1_q8_1)
                      if t == GGML_TYPE_Q4_1 else _blockdot.vec_dot_q8_0_q8_0)
            # read-only views: one compiled flavour of each kernel, whether the rows are the mapped GGUF's
            # (read-only) or made in memory (a second flavour cost ~8 s of every fresh compile)
            xr, yr = np.asarray(x).view(), np.asarray(y).view()
            xr.flags.writeable = yr.flags.writeable = False
            kernel(xr, yr, out)
            return out
    py = y if isinstance(y, PreparedRows) else prepare(vt, y)
    if py.type != vt:
        raise ValueError(f"vec_dot({Q.type_name(t)}): y is {Q.type_name(py.type)}, not {Q.type_name(vt)}")
    if (t in AVX2_EXACT or (exact and t in AVX2_EXACT_ON_REQUEST)) and not isinstance(x, PreparedRows):
        # unpack src0 a tile of rows at a time (a 262144-row output matrix would take GiBs unpacked at once)
        raw = _as_rows(t, x)
        M = raw.shape[0]
        out = np.empty((py.q.shape[0], M), np.float32)
        step = _avx2_tile_rows(py.q.shape[0], py.n)
        for m0 in range(0, M, step):
            px = prepare(t, raw[m0:m0 + step])
            if px.n != py.n:
                raise ValueError(f"row lengths differ: {px.n} vs {py.n}")
            out[:, m0:m0 + step] = _vec_dot_avx2(t, px, py)
        return out
    px = x if isinstance(x, PreparedRows) else prepare(t, x)
    if px.type != t or py.type != vt:
        raise ValueError(f"vec_dot({Q.type_name(t)}): got {Q.type_name(px.type)} . {Q.type_name(py.type)}")
    if px.n != py.n:
        raise ValueError(f"row lengths differ: {px.n} vs {py.n}")

    if t == GGML_TYPE_F32:
        return vec.tiled(vec.vec_dot_f32_simd, px.q, py.q)
    if t == GGML_TYPE_F16:
        return vec.tiled(vec.vec_dot_f16_simd, px.q, py.q)
    if t == GGML_TYPE_BF16:
        return vec.tiled(vec.vec_dot_bf16_simd, px.q, py.q)

    if t in AVX2_EXACT:
        return _vec_dot_avx2(t, px, py)
    blk = Q.blck_size(t)
    out, summs = _scaled_block_dot(px.q, py.q, px.d, py.d, blk, _DEPTH[t], px.bias, py.bias)
    if t in (GGML_TYPE_Q4_1, GGML_TYPE_Q5_1):
        # *s = hsum_float_8(acc) + summs: the kernel's own sequential summs (not an sgemm, whose summation
        # order would follow the chunk's shape), added after the blocks
        out += summs
    elif t in (GGML_TYPE_Q2_K, GGML_TYPE_Q5_K):
        nb = px.d.shape[1]
        bs = py.mq.reshape(-1, nb, 16)
        if t != GGML_TYPE_Q2_K:
            # one min per 32 values: the kernels add the bsums (of 16) in pairs
            bs = bs.reshape(-1, nb, 8, 2).sum(-1)
        k = bs.shape[2]
        # dmin = -y.d * x.dmin; the integer sum_j m_j*bsums_j is exact (<= 15*2048*16)
        out += _scaled_block_dot(px.mq, bs.reshape(-1, nb * k), px.md, -py.d, k, k)[0]
    return out


def vec_dot_groups(t: int, xs, ys, tiled: bool = False) -> list:
    """``[vec_dot(t, x, y) for x, y in zip(xs, ys)]``: the same numbers, computed faster.

    MUL_MAT's chunks cut a group of src1 columns out of every (i12, i13) matrix they cross --
    in a decode step's attention one column per head.  For F32 / F16 / BF16 groups of raw
    rows with equal src0 row counts are stacked (src1 groups padded with zero rows) and go
    through the batched ``vec_dot_*_simd`` at once; every element's arithmetic is its own,
    so the padding and the batching change no bit.  Other types: one call per group.
    """
    xs, ys = list(xs), list(ys)
    if tiled:       # the whole MUL_MAT goes through tiled.cpp (see ``TILED_TYPES``): its own float order
        return [vec_dot_tiled(t, x, y) for x, y in zip(xs, ys)]
    if (t not in (GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16) or len(xs) < 2
            or any(not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 2 for a in xs + ys)
            or len({x.shape for x in xs}) != 1 or len({y.shape[1] for y in ys}) != 1):
        return [vec_dot(t, x, y) for x, y in zip(xs, ys)]
    G, M = len(xs), xs[0].shape[0]
    ns = [y.shape[0] for y in ys]
    nmax = max(ns)
    if G * nmax * M * vec.LANES > vec.TILE_LANES:
        h = G // 2
        return vec_dot_groups(t, xs[:h], ys[:h]) + vec_dot_groups(t, xs[h:], ys[h:])
    px = prepare(t, np.concatenate(xs))
    yb = np.zeros((G, nmax, ys[0].shape[1]), np.uint8)      # zero bytes: 0.0 in F32 / F16 / BF16
    for g, y in enumerate(ys):
        yb[g, :ns[g]] = y
    py = prepare(t, yb.reshape(G * nmax, -1))
    if px.n != py.n:
        raise ValueError(f"row lengths differ: {px.n} vs {py.n}")
    fn = {GGML_TYPE_F32: vec.vec_dot_f32_simd, GGML_TYPE_F16: vec.vec_dot_f16_simd,
          GGML_TYPE_BF16: vec.vec_dot_bf16_simd}[t]
    out = fn(px.q.reshape(G, M, -1), py.q.reshape(G, nmax, -1))
    return [out[g, :ns[g]] for g in range(G)]
