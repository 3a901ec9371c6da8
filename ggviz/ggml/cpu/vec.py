"""ggml-cpu's vec.h / vec.cpp: the row primitives the kernels are built from, AVX2 branch (the haswell variant), and
the AVX-512 branch where it computes other bits (the zen4 variant, ``cpu_feats.variant_lanes() == 16``:
``ggml_v_expf`` with ``vscalefps``, 16-lane softmax / SiLU / cvar blocks with ``_mm512_reduce_add_ps``, and
``ggml_vec_dot_f16`` with 4 x 16 lanes and ``GGML_F32x16_REDUCE``).

Mirrors ``ggml_vec_dot_f32`` / ``ggml_vec_dot_f16`` / ``ggml_vec_dot_bf16`` (the AVX2 4 x 8 FMA lanes and
``GGML_F32x8_REDUCE``, emulated exactly: see the section below), ``ggml_v_expf`` / ``ggml_v_silu`` (emulated
instruction by instruction, 8 lanes; a row's ``n % 8`` tail takes libm's ``expf`` like the C tail loop),
``ggml_vec_silu_f32``, ``ggml_vec_sum_f32`` (a sequential
``ggml_float`` sum), ``ggml_vec_soft_max_f32``, ``ggml_vec_cvar_f32``, ``ggml_gelu_f32`` / ``ggml_vec_gelu_f32``
with GGML_GELU_FP16 (the fp16 lookup tables that ``ggml_cpu_init`` fills: ``ggml_table_gelu_f16``,
``ggml_table_gelu_quick_f16``) and the AVX2 horizontal sum. The ``EXP_*`` constants are ``ggml_v_expf``'s; the
compiled kernels (``fast/``) read them from here.
"""
from __future__ import annotations

import functools

import numpy as np

from . import cpu_feats
from .common import f32_to_f16
from .libm import expf_vec, fma32

F32 = np.float32
F64 = np.float64
_F32 = F32

def _hexf(s: str) -> np.float32:
    return F32(float.fromhex(s))


EXP_R = _hexf("0x1.8p23")
EXP_LOG2E = _hexf("0x1.715476p+0")
EXP_LN2_HI = _hexf("0x1.62e4p-1")
EXP_LN2_LO = _hexf("0x1.7f7d1cp-20")
EXP_P0, EXP_P1 = _hexf("0x1.0e4020p-7"), _hexf("0x1.573e2ep-5")
EXP_P2, EXP_P3 = _hexf("0x1.555e66p-3"), _hexf("0x1.fffdb6p-2")
EXP_P4 = _hexf("0x1.ffffecp-1")


def v_expf(x):
    """ggml_v_expf, the ``__AVX2__ && __FMA__`` branch of vec.h, lane by lane (bit-exact).

    n = round(x/ln2) via the 1.5*2^23 trick, b = x - n*ln2 in two FMA steps, a degree-5 polynomial j ~ e^b - 1, and
    2^n assembled in the exponent bits (k); |n| > 126 takes the two-factor scaling path (s1, s2), |n| > 192
    saturates to inf or 0.
    """
    x = np.asarray(x, F32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        z = fma32(x, EXP_LOG2E, EXP_R)
        n = z - EXP_R
        b = fma32(-n, EXP_LN2_LO, fma32(-n, EXP_LN2_HI, x))
        e = z.view(np.uint32) << np.uint32(23)
        k = (e + np.uint32(0x3F800000)).view(F32)
        an = np.abs(n)
        c = an > 126
        u = b * b
        j = fma32(fma32(fma32(EXP_P0, b, EXP_P1), u, fma32(EXP_P2, b, EXP_P3)), u, EXP_P4 * b)
        res = fma32(j, k, k)
        if np.any(c):
            g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0))
            s1 = (g + np.uint32(0x7F000000)).view(F32)
            s2 = (e - g).view(F32)
            d = an > 192
            res = np.where(d, s1 * s1, np.where(c, fma32(s2, j, s2) * s1, res))
    return res


def v_expf_avx512(x):
    """ggml_v_expf, the ``__AVX512F__ && __AVX512DQ__`` branch of vec.h (the AVX-512 variants), lane by lane.

    The same n and b as the AVX2 branch, but the polynomial includes the 1 (``fmadd(P4, b, 1)`` instead of
    ``P4*b``) and 2^n is applied by ``vscalefps``: one correctly rounded j*2^n (subnormals included) instead of
    AVX2's ``fma(j, k, k)`` with k = 2^n built in the exponent bits. |n| > 192 gives inf (n > 0) or 0.
    """
    x = np.asarray(x, F32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        z = fma32(x, EXP_LOG2E, EXP_R)
        n = z - EXP_R
        b = fma32(-n, EXP_LN2_LO, fma32(-n, EXP_LN2_HI, x))
        d = np.abs(n) > 192
        u = b * b
        j = fma32(fma32(fma32(EXP_P0, b, EXP_P1), u, fma32(EXP_P2, b, EXP_P3)), u, fma32(EXP_P4, b, F32(1)))
        # vscalefps: j*2^floor(n) rounded once; exact in float64 (|n| <= 192), then one rounding to float32
        ni = np.where(d | np.isnan(n), F32(0), n).astype(np.int32)
        res = np.ldexp(j.astype(F64), ni).astype(F32)
        if np.any(d):
            res = np.where(d, np.where(n <= 0, F32(0), F32(np.inf)), res)
    return res


def simd_cols(n: int, width: int = 8) -> int:
    """How many leading elements of an n-long row the SIMD loop ``for (; i + width-1 < n; i += width)`` covers."""
    return (n // width) * width


def _v_expf_lanes(lanes: int):
    return v_expf_avx512 if lanes == 16 else v_expf


def silu_f32(x, lanes: int | None = None):
    """ggml_vec_silu_f32 on rows (last axis): ggml_v_silu on blocks of ``lanes`` (the variant's: 8 with AVX2, 16
    with AVX-512), ggml_silu_f32 (libm expf) on the tail."""
    lanes = lanes or cpu_feats.variant_lanes()
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = simd_cols(n, lanes)
    y = np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if m:
            xs = x[..., :m]
            y[..., :m] = xs / (F32(1) + _v_expf_lanes(lanes)(F32(0) - xs))
        if m < n:
            xt = x[..., m:]
            y[..., m:] = xt / (F32(1) + expf_vec(-xt))
    return y


def hsum8(v):
    """The AVX2 horizontal sum of vec.cpp: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) in float32, per 8-lane block."""
    a = v[..., 4:8] + v[..., 0:4]
    b0 = a[..., 0] + a[..., 2]
    b1 = a[..., 1] + a[..., 3]
    return b0 + b1


def seq_sum_f64(parts):
    """``ggml_float sum = 0; for (...) sum += (ggml_float) part;`` : a sequential double sum over the last axis."""
    parts = np.asarray(parts, F64)
    if parts.shape[-1] == 0:
        return np.zeros(parts.shape[:-1], F64)
    return np.cumsum(parts, axis=-1)[..., -1]


def vec_sum_f32(x):
    """ggml_vec_sum_f32: sum in ggml_float (double), sequential, returned as float."""
    return seq_sum_f64(np.asarray(x, F32).astype(F64)).astype(F32)


def hsum16(v):
    """``_mm512_reduce_add_ps`` per 16-lane block: halves added pairwise (lane i + lane i+8, then i + i+4, i + i+2,
    i + i+1), the tree gcc's and clang's headers both expand it to."""
    a = v[..., 0:8] + v[..., 8:16]
    b = a[..., 0:4] + a[..., 4:8]
    c = b[..., 0:2] + b[..., 2:4]
    return c[..., 0] + c[..., 1]


def vec_soft_max_f32(x, mx, lanes: int | None = None):
    """ggml_vec_soft_max_f32: y = exp(x - max); returns (y, ggml_float sum). The variant's SIMD branch: AVX2 takes
    8-lane ggml_v_expf blocks, each's float horizontal sum (hsum8) added to the double sum; AVX-512 16-lane blocks
    (v_expf_avx512, hsum16); the ``n % lanes`` tail takes libm's expf."""
    lanes = lanes or cpu_feats.variant_lanes()
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = simd_cols(n, lanes)
    d = x - mx[..., None]
    y = np.empty_like(x)
    parts = []
    if m:
        y[..., :m] = _v_expf_lanes(lanes)(d[..., :m])
        hsum = hsum16 if lanes == 16 else hsum8
        parts.append(hsum(y[..., :m].reshape(x.shape[:-1] + (m // lanes, lanes))).astype(F64))
    if m < n:
        y[..., m:] = expf_vec(d[..., m:])
        parts.append(y[..., m:].astype(F64))
    s = seq_sum_f64(np.concatenate(parts, axis=-1)) if parts else np.zeros(x.shape[:-1], F64)
    return y, s


def vec_cvar_f32(x, mean, lanes: int | None = None):
    """ggml_vec_cvar_f32: y = x - mean; returns (y, ggml_float sum(y^2)/n); per block of the variant's lanes a
    float horizontal sum (hsum8 for AVX2; AVX-512's ``_mm512_reduce_add_ps``, hsum16) added to the double sum."""
    lanes = lanes or cpu_feats.variant_lanes()
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = simd_cols(n, lanes)
    y = x - mean[..., None]
    sq = y * y
    parts = []
    if m:
        hsum = hsum16 if lanes == 16 else hsum8
        parts.append(hsum(sq[..., :m].reshape(x.shape[:-1] + (m // lanes, lanes))).astype(F64))
    if m < n:
        parts.append(sq[..., m:].astype(F64))
    s = seq_sum_f64(np.concatenate(parts, axis=-1)) if parts else np.zeros(x.shape[:-1], F64)
    return y, s / n


# ---- GGML_GELU_FP16 / GGML_GELU_QUICK_FP16 lookup tables (ggml_cpu_init)

GELU_COEF_A = F32(0.044715)
GELU_QUICK_COEF = F32(-1.702)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
SQRT_2_INV = F32(0.70710678118654752440084436210484)


@functools.lru_cache(maxsize=None)
def gelu_table_f16() -> np.ndarray:
    """ggml_table_gelu_f16[65536]: GGML_CPU_FP32_TO_FP16(ggml_gelu_f32(f)) for every fp16 bit pattern.

    ggml_gelu_f32 = 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x))); gcc contracts
    ``1.0f + (GELU_COEF_A*x)*x`` into an FMA. With that, this table equals the real one bit for bit (checked in the
    tests against the oracle's exported ``ggml_table_gelu_f16``).
    """
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
    with np.errstate(all="ignore"):
        inner = fma32(GELU_COEF_A * x, x, F32(1))
        arg = (SQRT_2_OVER_PI * x) * inner
        t = np.tanh(arg.astype(F64)).astype(F32)
        r = (F32(0.5) * x) * (F32(1) + t)
    return f32_to_f16(r)


@functools.lru_cache(maxsize=None)
def gelu_quick_table_f16() -> np.ndarray:
    """ggml_table_gelu_quick_f16: x*(1.0f/(1.0f + expf(GELU_QUICK_COEF*x))) rounded to fp16."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
    with np.errstate(all="ignore"):
        r = x * (F32(1) / (F32(1) + expf_vec(GELU_QUICK_COEF * x)))
    return f32_to_f16(r)


def gelu_f32(x):
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: x <= -10 -> 0, x >= 10 -> x, else table[fp16(x)]."""
    x = np.asarray(x, F32)
    tab = gelu_table_f16()
    y = tab[f32_to_f16(x).view(np.uint16)].astype(F32)
    y = np.where(x <= F32(-10), F32(0), np.where(x >= F32(10), x, y))
    return y.astype(F32)


def gelu_quick_f32(x):
    """ggml_vec_gelu_quick_f32 with GGML_GELU_QUICK_FP16: table[fp16(x)] (no range clamp)."""
    return gelu_quick_table_f16()[f32_to_f16(x).view(np.uint16)].astype(F32)


# ---------------------------------------------------------------------------------
# ggml_vec_dot_f32 / ggml_vec_dot_f16 / ggml_vec_dot_bf16 (vec.cpp, AVX2 + FMA + F16C)
# ---------------------------------------------------------------------------------
#
# The AVX mapping of simd-mappings.h: GGML_F32_STEP = GGML_F16_STEP = 32, EPR = 8, so
# GGML_F32_ARR = 4 accumulators of 8 float lanes.  Element k < (n & ~31) of a row goes to
# lane e = k % 32 (accumulator e // 8, lane e % 8).  Here a (32, N, M) float32 array holds
# lane e of every (src1 row, src0 row) pair in plane e, and the loop runs over the n/32
# steps only; every element gets the library's arithmetic in the library's order, so the
# result does not depend on how many rows and columns are computed together (ggml's
# per-thread chunks), unlike a BLAS sgemm whose summation order follows the shapes.

_F64 = np.float64
LANES = 32                     # GGML_F32_STEP: 4 __m256 accumulators x 8 lanes
TILE_LANES = 1 << 16          # 32 x N x M lanes per tile: each float64 scratch 512 KiB
_MID = np.int64(0x10000000)     # a float32 rounding midpoint, seen in a float64's low 29 bits
_LOW29 = np.int64(0x1FFFFFFF)
_SUBNORMAL32 = 2.0 ** -125      # below this float32's rounding point moves up (subnormals)


def _quantum(a: np.ndarray) -> float:
    """A power of two dividing every value of the float32 array a (exact for normal numbers,
    2^-149 with NaN/inf/subnormals around, 1.0 for an all-zero array)."""
    with np.errstate(invalid="ignore"):
        m = np.min(np.abs(a), initial=np.inf, where=a != 0)
    if m == np.inf:
        return 1.0 if a.size == 0 or not np.isinf(a).any() else 2.0 ** -149
    if not np.isfinite(m):
        return 2.0 ** -149
    return max(2.0 ** (int(np.frexp(m)[1]) - 24), 2.0 ** -149)


def _reduce_f32x8(acc: np.ndarray) -> np.ndarray:
    """GGML_F32x8_REDUCE of the 4 accumulators (planes 8j..8j+7 of acc (32, ...)):
    sum[0] += sum[2], sum[1] += sum[3], sum[0] += sum[1]; t0 = low half + high half;
    two _mm_hadd_ps: (t0_0 + t0_1) + (t0_2 + t0_3).  float32 throughout."""
    a = acc.reshape((2, 2, 8) + acc.shape[1:])
    v = a[0] + a[1]                     # sum0 + sum2, sum1 + sum3
    v = v[0] + v[1]                     # (sum0 + sum2) + (sum1 + sum3)
    t0 = v[:4] + v[4:]                  # _mm_add_ps(low 128 bits, high 128 bits)
    h = t0[0::2] + t0[1::2]             # _mm_hadd_ps(t0, t0): t0_0 + t0_1, t0_2 + t0_3
    return h[0] + h[1]                  # _mm_hadd_ps again, lane 0


def _reduce_f32x16(acc: np.ndarray) -> np.ndarray:
    """GGML_F32x16_REDUCE (AVX-512) of the 4 accumulators (planes 16j..16j+15 of acc (64, ...)): the same
    pairwise adds, sum[0] += sum[2], sum[1] += sum[3], sum[0] += sum[1], then ``_mm512_reduce_add_ps`` (lanes
    i + i+8, i + i+4, i + i+2, i + i+1).  float32 throughout."""
    a = acc.reshape((2, 2, 16) + acc.shape[1:])
    v = a[0] + a[1]
    v = v[0] + v[1]
    v = v[:8] + v[8:]
    v = v[:4] + v[4:]
    v = v[:2] + v[2:]
    return v[0] + v[1]


def _reduce_bf16(acc: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_bf16's AVX2 reduction: c1 = (c1 + c3) + (c2 + c4); g = high + low;
    g += movehl(g); g0 + g1, i.e. (g0 + g2) + (g1 + g3).  float32 throughout."""
    a = acc.reshape((2, 2, 8) + acc.shape[1:])
    c = a[0] + a[1]
    c = c[0] + c[1]
    g = c[4:] + c[:4]
    h = g[:2] + g[2:]                   # g + _mm_movehl_ps(g, g)
    return h[0] + h[1]                  # _mm_add_ss(g, _mm_movehdup_ps(g))


def _fma_step(acc, p, s, low, risky, tiny):
    """One step of ``acc = fmaf(x, y, acc)`` given p = x*y exactly in float64, in place on float32 acc (scratch:
    s float64, low int64, risky bool, all acc's shape; the caller silences invalid/overflow warnings).

    s = fl64(p + acc) carries one rounding; rounding it again to float32 is wrong only when s lands exactly on a
    float32 rounding midpoint while the exact sum does not (about one lane in 10^5), or in the float32 subnormal
    range (looked at only when ``tiny``).  Those lanes get the exact error e (TwoSum) and s moves one float64 ulp
    toward it (round to odd, Boldo & Melquiond), which makes the second rounding correct."""
    np.add(p, acc, out=s)
    np.bitwise_and(s.view(np.int64), _LOW29, out=low)
    np.equal(low, _MID, out=risky)
    if tiny:
        risky |= np.abs(s) < _SUBNORMAL32
    if risky.any():
        idx = np.nonzero(risky)
        pr, cr, sr = p[idx], acc[idx].astype(_F64), s[idx]
        bv = sr - pr
        e = (pr - (sr - bv)) + (cr - bv)
        rb = sr.view(np.int64)
        fix = (e != 0) & np.isfinite(sr) & ((rb & 1) == 0)
        rb += np.where(fix, np.where((e > 0) == (sr > 0), 1, -1), 0)
        s[idx] = sr
    np.copyto(acc, s, casting="same_kind")


def _lanes_first(a: np.ndarray, n32: int, dtype) -> np.ndarray:
    """(n32, ..., rows): the first n32 elements of every row, element-major (step i, lane e at [32*i + e])."""
    b = a[..., :n32]
    b = b.T if b.ndim == 2 else b.transpose((b.ndim - 1,) + tuple(range(b.ndim - 1)))
    return np.ascontiguousarray(b, dtype=dtype)


def _outer(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(..., N) x (..., M) -> (..., N, M) products."""
    return y[..., :, None] * x[..., None, :]


def _fma_lanes(x: np.ndarray, y: np.ndarray, n32: int) -> np.ndarray:
    """The (32, ..., N, M) float32 lanes after ``acc = fmaf(x, y, acc)`` over the n32/32 steps, from 0."""
    shape = (LANES,) + np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (y.shape[-2], x.shape[-2])
    # sums can reach float32's subnormal range only if the values' quanta allow it
    tiny = _quantum(x[..., :n32]) * _quantum(y[..., :n32]) < _SUBNORMAL32
    xt = _lanes_first(x, n32, _F64)[..., None, :]
    yt = _lanes_first(y, n32, _F64)[..., :, None]
    acc = np.zeros(shape, _F32)
    p = np.empty(shape, _F64)                   # products of two float32: exact in float64
    s = np.empty_like(p)
    low = np.empty(p.shape, np.int64)
    risky = np.empty(p.shape, np.bool_)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(0, n32, LANES):
            np.multiply(yt[i:i + LANES], xt[i:i + LANES], out=p)
            _fma_step(acc, p, s, low, risky, tiny)
    return acc


def _dot_operands(x, y, step: int = LANES):
    """(x, y as float32, row length n, the [..., cols of y, rows of x] result shape, n rounded down to step)."""
    x = np.asarray(x, _F32)
    y = np.asarray(y, _F32)
    n = x.shape[-1]
    shape = np.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (y.shape[-2], x.shape[-2])
    return x, y, n, shape, n & ~(step - 1)


def vec_dot_f32_simd(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 (AVX2+FMA) of every row of x (..., M, n) with every row of y (..., N, n): (..., N, M)
    float32 (leading dimensions batched: matrix g of x with matrix g of y).

    As compiled in the library (checked against its disassembly)::

        float sumf;  __m256 sum[4] = 0;
        for (i = 0; i < np; i += 32) for (j < 4) sum[j] = fmadd(x[i+8j..], y[i+8j..], sum[j]);
        GGML_F32_VEC_REDUCE(sumf, sum);                      // float
        for (i = np; i < n; ++i) sumf += x[i]*y[i];          // np = n & ~31

    gcc auto-vectorises the leftover loop: while 8 (then 4) leftovers remain, the products
    are rounded to float (vmulps) and added one by one (vaddss); the last ``(n - np) % 4``
    go through a contracted ``vfmadd231ss``, a fused multiply-add.
    """
    x, y, n, shape, n32 = _dot_operands(x, y)
    with np.errstate(over="ignore", invalid="ignore"):
        if n32:
            sumf = _reduce_f32x8(_fma_lanes(x, y, n32))
        else:
            sumf = np.zeros(shape, _F32)
        r = n - n32
        for k in range(n32, n - r % 4):                    # vmulps + vaddss, in order
            sumf += _outer(y[..., k], x[..., k])
        if r % 4:
            p, s = np.empty(shape, _F64), np.empty(shape, _F64)
            low, risky = np.empty(shape, np.int64), np.empty(shape, np.bool_)
            for k in range(n - r % 4, n):                  # vfmadd231ss
                np.multiply(y[..., k, None].astype(_F64), x[..., k][..., None, :].astype(_F64), out=p)
                _fma_step(sumf, p, s, low, risky, True)
    return sumf


def _vec_dot_exact_products(x, y, reduce, may_underflow, step: int = LANES):
    """ggml_vec_dot_f16 / _bf16 on values already widened to float32.

    The main loop's lanes are ``fmadd(x, y, acc)`` (bf16: gcc contracts its mul + add).  A
    product of two fp16 (11-bit significands, >= 2^-48) is always exact in float32, so the
    FMA is a float32 add of the product.  A bf16 product can fall below float32's normal
    range and lose bits there: then (``may_underflow``) the FMA is emulated in full (``step`` 32 only).
    ``step``: the elements of one loop iteration (GGML_F16_STEP: 32 on AVX2, 64 on AVX-512)."""
    x, y, n, shape, n32 = _dot_operands(x, y, step)
    with np.errstate(over="ignore", invalid="ignore"):
        if n32:
            if may_underflow and _quantum(x[..., :n32]) * _quantum(y[..., :n32]) < 2.0 ** -149:
                acc = _fma_lanes(x, y, n32)
            else:
                xt = _lanes_first(x, n32, _F32)[..., None, :]
                yt = _lanes_first(y, n32, _F32)[..., :, None]
                acc = yt[:step] * xt[:step]             # 0 + p: exact
                p = np.empty_like(acc)
                for i in range(step, n32, step):
                    np.multiply(yt[i:i + step], xt[i:i + step], out=p)
                    acc += p
            sumf = reduce(acc)
            if n32 == n:
                return sumf                        # float -> double -> float: unchanged
            sumf = sumf.astype(_F64)
        else:
            sumf = np.zeros(shape, _F64)
        # ggml_float (double) leftovers: sumf += (ggml_float)(x[i]*y[i])
        for k in range(n32, n):
            sumf += _outer(y[..., k], x[..., k])
        return sumf.astype(_F32)


def vec_dot_f16_simd(x: np.ndarray, y: np.ndarray, lanes: int | None = None) -> np.ndarray:
    """ggml_vec_dot_f16 (AVX2+F16C) of fp16 rows given as exact float32 values: (N, M) float32.

    ``ggml_float sumf``; 4 accumulators of 8 float lanes fed by vcvtph2ps + vfmadd231ps;
    GGML_F32x8_REDUCE into float, widened to double; the ``n % 32`` leftovers added in
    double (products exact in float); the double rounded to float at the end.
    The AVX-512 build (``lanes`` 16, the zen4 variant): 4 accumulators of 16 lanes, GGML_F32x16_REDUCE, the
    ``n % 64`` leftovers in double.
    """
    if (lanes or cpu_feats.variant_lanes()) == 16:
        return _vec_dot_exact_products(x, y, _reduce_f32x16, False, 64)
    return _vec_dot_exact_products(x, y, _reduce_f32x8, False)


def vec_dot_bf16_simd(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_bf16 (AVX2 branch) of bf16 rows given as exact float32 values: (N, M) float32.

    4 accumulators c1..c4 of 8 lanes (mul + add, contracted to an FMA), its own horizontal sum
    (:func:`_reduce_bf16`) added to a ``ggml_float`` 0, double leftovers, rounded to float.
    """
    return _vec_dot_exact_products(x, y, _reduce_bf16, True)


def tiled(fn, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """fn(x, y) -> (N, M) evaluated on tiles of rows of x and y that keep the (N, M, 32)
    scratch small; the results do not depend on the tiling (all arithmetic is per element)."""
    M, N = x.shape[0], y.shape[0]
    if N * M * LANES <= TILE_LANES:
        return fn(x, y)
    out = np.empty((N, M), _F32)
    tm = min(M, max(1, TILE_LANES // LANES))
    tn = max(1, TILE_LANES // (LANES * tm))
    for j in range(0, N, tn):
        for i in range(0, M, tm):
            out[j:j + tn, i:i + tm] = fn(x[i:i + tm], y[j:j + tn])
    return out
