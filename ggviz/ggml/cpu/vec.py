"""ggml-cpu's vec.h / vec.cpp: the row primitives the kernels are built from, AVX2 branch.

Mirrors ``ggml_v_expf`` / ``ggml_v_silu`` (emulated instruction by instruction, 8 lanes; a row's ``n % 8`` tail
takes libm's ``expf`` like the C tail loop), ``ggml_vec_silu_f32``, ``ggml_vec_sum_f32`` (a sequential
``ggml_float`` sum), ``ggml_vec_soft_max_f32``, ``ggml_vec_cvar_f32``, ``ggml_gelu_f32`` / ``ggml_vec_gelu_f32``
with GGML_GELU_FP16 (the fp16 lookup tables that ``ggml_cpu_init`` fills: ``ggml_table_gelu_f16``,
``ggml_table_gelu_quick_f16``) and the AVX2 horizontal sum. The ``EXP_*`` constants are ``ggml_v_expf``'s; the
compiled kernels (``fast/``) read them from here.
"""
from __future__ import annotations

import functools

import numpy as np

from .common import f32_to_f16
from .libm import expf_vec, fma32

F32 = np.float32
F64 = np.float64

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


def simd_cols(n: int, width: int = 8) -> int:
    """How many leading elements of an n-long row the AVX2 loop ``for (; i + 7 < n; i += 8)`` covers."""
    return (n // width) * width


def silu_f32(x):
    """ggml_vec_silu_f32 on rows (last axis): ggml_v_silu on 8-lane blocks, ggml_silu_f32 (libm expf) on the tail."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = simd_cols(n)
    y = np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if m:
            xs = x[..., :m]
            y[..., :m] = xs / (F32(1) + v_expf(F32(0) - xs))
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


def vec_soft_max_f32(x, mx):
    """ggml_vec_soft_max_f32 (AVX2 branch): y = exp(x - max); returns (y, ggml_float sum)."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = simd_cols(n)
    d = x - mx[..., None]
    y = np.empty_like(x)
    parts = []
    if m:
        y[..., :m] = v_expf(d[..., :m])
        parts.append(hsum8(y[..., :m].reshape(x.shape[:-1] + (m // 8, 8))).astype(F64))
    if m < n:
        y[..., m:] = expf_vec(d[..., m:])
        parts.append(y[..., m:].astype(F64))
    s = seq_sum_f64(np.concatenate(parts, axis=-1)) if parts else np.zeros(x.shape[:-1], F64)
    return y, s


def vec_cvar_f32(x, mean):
    """ggml_vec_cvar_f32 (AVX2 branch): y = x - mean; returns (y, ggml_float sum(y^2)/n)."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = simd_cols(n)
    y = x - mean[..., None]
    sq = y * y
    parts = []
    if m:
        parts.append(hsum8(sq[..., :m].reshape(x.shape[:-1] + (m // 8, 8))).astype(F64))
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
