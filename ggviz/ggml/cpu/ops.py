"""The CPU backend's forward kernels (everything but MUL_MAT), faithful to ggml-cpu 0.20.2 on x86-64 AVX2+FMA+F16C.

Mirrors (ggml/src/ggml-cpu/):

* ops.cpp: ``ggml_compute_forward_dup`` (``dup_same_cont``, ``dup_bytes``, ``dup_flt``, ``dup_to_q``,
  ``dup_from_q``; CPY and CONT call it), ``add`` (``add_q_f32``), ``add1`` (f32, f16, bf16, q), ``sum_rows``,
  ``mean``, ``argmax``, ``repeat``, ``concat``, ``gelu``/``gelu_quick``/``gelu_erf``/``silu`` (f32, f16), ``norm``,
  ``rms_norm`` and ``rms_norm_mul_fused``, ``out_prod`` (f32, f16, q), ``scale``, ``get_rows`` (f32/i32, f16, bf16,
  q), ``set_rows``, ``soft_max`` (mask, ALiBi, sinks), ``rope`` (``ggml_rope_cache_init``, ``ggml_mrope_cache_init``,
  ``rope_yarn``, ``rotate_pairs``), the GLU family (``reglu``, ``geglu``, ``swiglu``, ``swiglu_oai``,
  ``geglu_erf``, ``geglu_quick``);
* binary-ops.cpp: ``apply_binary_op`` (ADD/SUB/MUL/DIV with src1 broadcast, f32/f16/bf16 combinations);
* unary-ops.cpp: ``apply_unary_op`` (ABS ... TRUNC, SQR, SQRT, SIN, COS, LOG);
* vec.h / vec.cpp: ``ggml_vec_sum_f32``, ``ggml_vec_max_f32``, ``ggml_vec_argmax_f32``, ``ggml_vec_scale_f32``,
  ``ggml_vec_mad1_f32``, ``ggml_vec_mad_f32(_unroll)``, ``ggml_vec_cvar_f32``, ``ggml_vec_soft_max_f32``,
  ``ggml_vec_silu_f32``, ``ggml_vec_swiglu_f32``, ``ggml_vec_gelu_f32`` (GGML_GELU_FP16: the fp16 lookup table),
  ``ggml_v_expf`` / ``ggml_v_silu`` (the AVX2 branch, emulated instruction by instruction);
* ggml-cpu.c: ``ggml_cpu_init``'s ``ggml_table_gelu_f16`` / ``ggml_table_gelu_quick_f16``;
* ggml.c: ``ggml_rope_yarn_corr_dims``.

Kernel contract (see ``common.py``): ``forward_<op>(params, dst)`` runs on every thread; each computes exactly the
share ggml's thread ``ith`` computes (the ``dr`` row split, or the ``i01 = ith; i01 += nth`` interleave that
norm/rms_norm/soft_max use, or ``ith == 0`` only) and writes the per-thread scratch in ``params.wdata`` where ggml
does. ``FORWARD`` maps ``GGML_OP_*`` to kernels.

Numerics. Rows are processed with NumPy, but every operation is the one the C code performs, in its precision and
its order: float32 arithmetic where C uses ``float``; ``ggml_float`` (double) sequential accumulations done with
``np.cumsum`` (a sequential add, unlike ``np.sum``'s pairwise one); fused multiply-adds where the binary has them
(AVX2 intrinsics, and the ``a*b + c`` expressions gcc contracts under its default ``-ffp-contract=fast`` with
``-mfma``; gcc fuses the *first* product of ``a*b + c*d``) through ``fma32``, an exact single-rounding FMA; the
AVX2 ``ggml_v_expf`` reproduced bit for bit including its 8-lane blocking (a row's ``n % 8`` tail takes libm's
``expf`` like the C tail loop); and glibc's ``expf``/``sinf``/``cosf`` (what ggml's scalar code calls) emulated
bit for bit (``glibc_expf``, ``glibc_sinf``, ``glibc_cosf``). With that, every op the tests cover matches the real
ggml byte for byte. Not bit-exact (float64-rounded instead of glibc's own float routine, so ~1% of elements may
differ by 1 ulp): the TANH, ELU/EXPM1, SOFTPLUS, LOG and GELU_ERF/GEGLU_ERF ops (tanhf, expm1f, logf, erff).
Scalars (powf/logf for ALiBi slopes, theta_scale, YaRN dims) go through the real libm via ctypes when it loads.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numpy as np

from .. import consts as C
from ..tensor import (Tensor, blck_size, get_op_params_f32, get_op_params_i32, is_contiguous, is_empty,
                      is_quantized, nelements, nrows, row_size, type_name, type_size)
from .common import CACHE_LINE_SIZE_F32, ComputeParams, as_array, rows_bytes, tensor_bytes, thread_range

F32 = np.float32
F64 = np.float64

# =====================================================================================================================
# scalar libm (ggml calls powf/logf on scalars: use the very same functions when the C library loads)
# =====================================================================================================================


def _load_libm():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for name, nargs in (("powf", 2), ("logf", 1)):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_float
            fn.argtypes = [ctypes.c_float] * nargs
        return lib
    except (OSError, AttributeError, TypeError):   # pragma: no cover - non-glibc platforms
        return None


_libm = _load_libm()


def powf(x, y) -> np.float32:
    if _libm is not None:
        return F32(_libm.powf(float(x), float(y)))
    return F32(np.power(F64(F32(x)), F64(F32(y))))


def logf(x) -> np.float32:
    if _libm is not None:
        return F32(_libm.logf(float(x)))
    with np.errstate(all="ignore"):
        return F32(np.log(F64(F32(x))))


# =====================================================================================================================
# float32 building blocks
# =====================================================================================================================


def fma32(a, b, c):
    """Single-rounding float32 fused multiply-add ``a*b + c`` (what vfmadd / gcc-contracted code computes).

    a*b is exact in float64 (24+24 < 53 bits), so s = fl64(a*b + c) carries one rounding, and rounding s again to
    float32 is wrong only when s lands exactly on a float32 rounding midpoint while the exact sum is not (or in the
    float32 subnormal range). Those few lanes get the exact error e (TwoSum) and s is nudged one float64 ulp toward
    it (round-to-odd), which makes the second rounding correct (Boldo & Melquiond).
    """
    p = np.asarray(a, F32).astype(F64) * np.asarray(b, F32).astype(F64)
    cc = np.asarray(c, F32).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.asarray(p + cc, dtype=F64)
        bits = s.view(np.int64)
        risky = ((bits & 0x1FFFFFFF) == 0x10000000) | (np.abs(s) < 2.0 ** -125)
        if np.any(risky):
            p, cc = np.broadcast_to(p, s.shape), np.broadcast_to(cc, s.shape)
            idx = np.nonzero(risky)
            pr, cr, sr = p[idx], cc[idx], s[idx]
            bv = sr - pr
            e = (pr - (sr - bv)) + (cr - bv)
            rb = sr.view(np.int64)
            fix = (e != 0) & np.isfinite(sr) & ((rb & 1) == 0)
            rb += np.where(fix, np.where((e > 0) == (sr > 0), 1, -1), 0)
            s = s.copy()
            s[idx] = sr
        return s.astype(F32)


def f32_to_f16(x):
    """GGML_CPU_FP32_TO_FP16 on F16C: vcvtps2ph with round-to-nearest-even (NumPy's cast rounds the same way)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, F32).astype(np.float16)


def f16_to_f32(h):
    return np.asarray(h).astype(F32)


def f32_to_bf16(x):
    """ggml_compute_fp32_to_bf16: round to nearest even on the bits; NaNs are quieted (| 64)."""
    u = np.asarray(x, F32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    if np.any(nan):
        r = np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)
    return r


def bf16_to_f32(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(F32)


def f32_to_i32(x):
    """C's float -> int32_t cast as x86 does it (cvttss2si): truncation; NaN/out of range -> INT32_MIN."""
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(x) & (x >= -2147483648.0) & (x < 2147483648.0)
        r = np.trunc(np.where(ok, x, 0)).astype(np.int32)
    return np.where(ok, r, np.int32(-2**31))


def to_f32(a, type_):
    """type_conversion_table<T>::to_f32 on an array of ``type_`` elements (BF16 given as uint16 bits)."""
    if type_ == C.GGML_TYPE_F32:
        return np.asarray(a, F32)
    if type_ == C.GGML_TYPE_F16:
        return f16_to_f32(a)
    if type_ == C.GGML_TYPE_BF16:
        return bf16_to_f32(a)
    if type_ == C.GGML_TYPE_I32:
        return np.asarray(a).astype(F32)
    raise NotImplementedError(f"no float conversion from {type_name(type_)}")


def from_f32(v, type_):
    """type_conversion_table<T>::from_f32."""
    if type_ == C.GGML_TYPE_F32:
        return np.asarray(v, F32)
    if type_ == C.GGML_TYPE_F16:
        return f32_to_f16(v)
    if type_ == C.GGML_TYPE_BF16:
        return f32_to_bf16(v)
    if type_ == C.GGML_TYPE_I32:
        return f32_to_i32(v)
    raise NotImplementedError(f"no float conversion to {type_name(type_)}")


def expf_vec(x):
    """libm expf on a vector: glibc's algorithm, emulated bit for bit (see ``glibc_expf``)."""
    return glibc_expf(x)


# ---- glibc's expf / sinf / cosf (sysdeps/ieee754/flt-32: e_expf.c, s_sinf.c, s_cosf.c, s_sincosf.h,
# sincosf_poly.h), as the x86-64 ifunc picks them on an FMA machine (the *-fma variants: the same C compiled with
# -mfma, so gcc fuses ``a + b*c`` into FMAs). They work in double precision and round once to float, so emulating
# them with float64 NumPy plus an exact double FMA reproduces libm bit for bit (checked in the tests against the
# real libm through ctypes). ggml calls these from its scalar loops (row tails of SILU/SWIGLU/SOFT_MAX, ROPE's
# cosf/sinf, sigmoid, ...).

def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_prod(a, b):
    """Dekker/Veltkamp: a*b = p + e exactly (no FMA needed)."""
    p = a * b
    ca = 134217729.0 * a
    ah = ca - (ca - a)
    al = a - ah
    cb = 134217729.0 * b
    bh = cb - (cb - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def fma64(a, b, c):
    """Correctly rounded double FMA (Boldo & Melquiond: exact product, TwoSum, one round-to-odd addition)."""
    a = np.asarray(a, F64)
    b = np.asarray(b, F64)
    c = np.asarray(c, F64)
    with np.errstate(all="ignore"):
        uh, ul = _two_prod(a, b)
        th, tl = _two_sum(c, uh)
        v, e = _two_sum(tl, ul)
        v = np.array(v, dtype=F64, copy=True)
        bits = v.view(np.int64)
        bits += np.where((e != 0) & np.isfinite(v) & ((bits & 1) == 0), np.where((e > 0) == (v > 0), 1, -1), 0)
        r = th + v
        special = ~np.isfinite(uh) | ~np.isfinite(r)
        if np.any(special):
            r = np.where(special, a * b + c, r)
    return r


_H = float.fromhex
_EXP2F_TAB = np.array([
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540], dtype=np.uint64)
_EXP2F_N = 32
_EXP2F_SHIFT = _H("0x1.8p+52")
_EXP2F_INVLN2N = _H("0x1.71547652b82fep+0") * _EXP2F_N
_EXP2F_C = (_H("0x1.c6af84b912394p-5") / 32 / 32 / 32, _H("0x1.ebfce50fac4f3p-3") / 32 / 32,
            _H("0x1.62e42ff0c52d6p-1") / 32)


def glibc_expf(x):
    """glibc __expf (EXP2F_TABLE_BITS = 5, !TOINT_INTRINSICS), FMA build: x*N/ln2 = k + r, 2^(k/N) from the
    table, a cubic in r. gcc fuses ``InvLn2N*xd`` into both ``+ SHIFT`` and ``- kd``."""
    x = np.asarray(x, F32)
    xd = x.astype(F64)
    with np.errstate(all="ignore"):
        kd = fma64(_EXP2F_INVLN2N, xd, _EXP2F_SHIFT)
        ki = np.nan_to_num(kd, nan=0.0, posinf=0.0, neginf=0.0).view(np.uint64)
        kd = kd - _EXP2F_SHIFT
        r = fma64(_EXP2F_INVLN2N, xd, -kd)
        t = _EXP2F_TAB[(ki % np.uint64(_EXP2F_N)).astype(np.intp)] + (ki << np.uint64(52 - 5))
        sc = t.view(F64)
        z = fma64(_EXP2F_C[0], r, _EXP2F_C[1])
        y = fma64(_EXP2F_C[2], r, 1.0)
        y = fma64(z, r * r, y)
        out = np.asarray((y * sc).astype(F32))
        bits = x.view(np.uint32)
        abstop = (bits >> np.uint32(20)) & np.uint32(0x7FF)
        big = abstop >= np.uint32(0x42B)                          # top12(88.0f): |x| >= 88, inf, nan
        if np.any(big):
            out = np.where(big & (x > F32(_H("0x1.62e42ep6"))), F32(np.inf), out)          # __math_oflowf
            out = np.where(big & (x < F32(-_H("0x1.9d1d9ep6"))), F32(_H("0x1p-149")), out)  # __math_may_uflowf
            out = np.where(big & (x < F32(-_H("0x1.9fe368p6"))), F32(0), out)               # __math_uflowf
            out = np.where(big & (abstop >= np.uint32(0x7F8)), x + x, out)                  # nan, +inf
            out = np.where(bits == np.uint32(0xFF800000), F32(0), out)                      # -inf
    return out.astype(F32)


_SC_SIGN = np.array([1.0, -1.0, -1.0, 1.0])
_SC_HPI_INV = _H("0x1.45F306DC9C883p+23")
_SC_HPI = _H("0x1.921FB54442D18p0")
_SC_PI63 = _H("0x1.921FB54442D18p-62")
_SC_TAB = {k: _H(v) for k, v in (("c0", "0x1p0"), ("c1", "-0x1.ffffffd0c621cp-2"), ("c2", "0x1.55553e1068f19p-5"),
                                  ("c3", "-0x1.6c087e89a359dp-10"), ("c4", "0x1.99343027bf8c3p-16"),
                                  ("s1", "-0x1.555545995a603p-3"), ("s2", "0x1.1107605230bc4p-7"),
                                  ("s3", "-0x1.994eb3774cf24p-13"))}
_INV_PIO4 = np.array([
    0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
    0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0,
    0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041],
    dtype=np.uint64)


def _sincosf_poly(x, x2, tab1, odd):
    """sinf_poly: the sine polynomial for even quadrants, the cosine one for odd; __sincosf_table[1] (tab1) is the
    table with the cosine coefficients negated."""
    def g(k):
        v = _SC_TAB[k]
        return np.where(tab1, -v, v) if k[0] == "c" else v
    x3 = x * x2
    s1 = fma64(x2, g("s3"), g("s2"))
    sin_r = fma64(x3 * x2, s1, fma64(x3, g("s1"), x))
    x4 = x2 * x2
    c2 = fma64(x2, g("c4"), g("c3"))
    c = fma64(x4, g("c2"), fma64(x2, g("c1"), g("c0")))
    cos_r = fma64(x4 * x2, c2, c)
    return np.where(odd, cos_r, sin_r).astype(F32)


def _reduce_large(xi):
    """reduce_large: |x| >= 120 reduced with 4/pi to 192 bits in 32x96-bit integer arithmetic."""
    xi = xi.astype(np.uint64)
    idx = ((xi >> np.uint64(26)) & np.uint64(15)).astype(np.intp)
    m = ((xi & np.uint64(0xFFFFFF)) | np.uint64(0x800000)) << ((xi >> np.uint64(23)) & np.uint64(7))
    res0 = (m * _INV_PIO4[idx]) & np.uint64(0xFFFFFFFF)         # a uint32 product in C
    res1 = m * _INV_PIO4[idx + 4]
    res2 = m * _INV_PIO4[idx + 8]
    res0 = ((res2 >> np.uint64(32)) | (res0 << np.uint64(32))) + res1
    n = (res0 + (np.uint64(1) << np.uint64(61))) >> np.uint64(62)
    res0 = res0 - (n << np.uint64(62))
    return res0.view(np.int64).astype(F64) * _SC_PI63, n.astype(np.int64)


def _glibc_sincosf(y, want_cos: bool):
    y = np.asarray(y, F32)
    shape = y.shape
    y = y.ravel()
    bits = y.view(np.uint32)
    at = (bits >> np.uint32(20)) & np.uint32(0x7FF)
    x = y.astype(F64)
    out = np.empty(y.shape, F32)
    flip = 1 if want_cos else 0
    with np.errstate(all="ignore"):
        small = at < np.uint32(0x3F4)                 # abstop12(pio4): pio4 converted to float
        tiny = at < np.uint32(0x398)                  # abstop12(0x1p-12f)
        mid = ~small & (at < np.uint32(0x42F))        # abstop12(120.0f)
        large = ~small & ~mid & (at < np.uint32(0x7F8))
        other = ~small & ~mid & ~large                # inf, nan -> __math_invalidf
        if small.any():
            xs = x[small]
            r = _sincosf_poly(xs, xs * xs, False, bool(want_cos))
            out[small] = np.where(tiny[small], F32(1) if want_cos else y[small], r)
        if mid.any():
            xm = x[mid]
            n = ((np.trunc(xm * _SC_HPI_INV).astype(np.int64).astype(np.int32) + np.int32(0x800000)) >> 24)
            n = n.astype(np.int64)
            xr = fma64(-n.astype(F64), _SC_HPI, xm)                  # x - n*hpi, fused
            out[mid] = _sincosf_poly(xr * _SC_SIGN[n & 3], xr * xr, (n & 2) != 0, ((n ^ flip) & 1) == 1)
        if large.any():
            xl, n = _reduce_large(bits[large])
            q = n + (bits[large] >> np.uint32(31)).astype(np.int64)
            out[large] = _sincosf_poly(xl * _SC_SIGN[q & 3], xl * xl, (q & 2) != 0, ((n ^ flip) & 1) == 1)
        if other.any():
            yo = y[other]
            out[other] = (yo - yo) / (yo - yo)
    return out.reshape(shape)


def glibc_sinf(x):
    """glibc __sinf (FMA build), vectorised."""
    return _glibc_sincosf(x, False)


def glibc_cosf(x):
    """glibc __cosf (FMA build), vectorised."""
    return _glibc_sincosf(x, True)


def _hexf(s: str) -> np.float32:
    return F32(float.fromhex(s))


_EXP_R = _hexf("0x1.8p23")
_EXP_LOG2E = _hexf("0x1.715476p+0")
_EXP_LN2_HI = _hexf("0x1.62e4p-1")
_EXP_LN2_LO = _hexf("0x1.7f7d1cp-20")
_EXP_P0, _EXP_P1 = _hexf("0x1.0e4020p-7"), _hexf("0x1.573e2ep-5")
_EXP_P2, _EXP_P3 = _hexf("0x1.555e66p-3"), _hexf("0x1.fffdb6p-2")
_EXP_P4 = _hexf("0x1.ffffecp-1")


def v_expf(x):
    """ggml_v_expf, the ``__AVX2__ && __FMA__`` branch of vec.h, lane by lane (bit-exact).

    n = round(x/ln2) via the 1.5*2^23 trick, b = x - n*ln2 in two FMA steps, a degree-5 polynomial j ~ e^b - 1, and
    2^n assembled in the exponent bits (k); |n| > 126 takes the two-factor scaling path (s1, s2), |n| > 192
    saturates to inf or 0.
    """
    x = np.asarray(x, F32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        z = fma32(x, _EXP_LOG2E, _EXP_R)
        n = z - _EXP_R
        b = fma32(-n, _EXP_LN2_LO, fma32(-n, _EXP_LN2_HI, x))
        e = z.view(np.uint32) << np.uint32(23)
        k = (e + np.uint32(0x3F800000)).view(F32)
        an = np.abs(n)
        c = an > 126
        u = b * b
        j = fma32(fma32(fma32(_EXP_P0, b, _EXP_P1), u, fma32(_EXP_P2, b, _EXP_P3)), u, _EXP_P4 * b)
        res = fma32(j, k, k)
        if np.any(c):
            g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0))
            s1 = (g + np.uint32(0x7F000000)).view(F32)
            s2 = (e - g).view(F32)
            d = an > 192
            res = np.where(d, s1 * s1, np.where(c, fma32(s2, j, s2) * s1, res))
    return res


def _simd_cols(n: int, width: int = 8) -> int:
    """How many leading elements of an n-long row the AVX2 loop ``for (; i + 7 < n; i += 8)`` covers."""
    return (n // width) * width


def silu_f32(x):
    """ggml_vec_silu_f32 on rows (last axis): ggml_v_silu on 8-lane blocks, ggml_silu_f32 (libm expf) on the tail."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = _simd_cols(n)
    y = np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if m:
            xs = x[..., :m]
            y[..., :m] = xs / (F32(1) + v_expf(F32(0) - xs))
        if m < n:
            xt = x[..., m:]
            y[..., m:] = xt / (F32(1) + expf_vec(-xt))
    return y


def _hsum8(v):
    """The AVX2 horizontal sum of vec.cpp: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) in float32, per 8-lane block."""
    a = v[..., 4:8] + v[..., 0:4]
    b0 = a[..., 0] + a[..., 2]
    b1 = a[..., 1] + a[..., 3]
    return b0 + b1


def _seq_sum_f64(parts):
    """``ggml_float sum = 0; for (...) sum += (ggml_float) part;`` : a sequential double sum over the last axis."""
    parts = np.asarray(parts, F64)
    if parts.shape[-1] == 0:
        return np.zeros(parts.shape[:-1], F64)
    return np.cumsum(parts, axis=-1)[..., -1]


def vec_sum_f32(x):
    """ggml_vec_sum_f32: sum in ggml_float (double), sequential, returned as float."""
    return _seq_sum_f64(np.asarray(x, F32).astype(F64)).astype(F32)


def vec_soft_max_f32(x, mx):
    """ggml_vec_soft_max_f32 (AVX2 branch): y = exp(x - max); returns (y, ggml_float sum)."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = _simd_cols(n)
    d = x - mx[..., None]
    y = np.empty_like(x)
    parts = []
    if m:
        y[..., :m] = v_expf(d[..., :m])
        parts.append(_hsum8(y[..., :m].reshape(x.shape[:-1] + (m // 8, 8))).astype(F64))
    if m < n:
        y[..., m:] = expf_vec(d[..., m:])
        parts.append(y[..., m:].astype(F64))
    s = _seq_sum_f64(np.concatenate(parts, axis=-1)) if parts else np.zeros(x.shape[:-1], F64)
    return y, s


def vec_cvar_f32(x, mean):
    """ggml_vec_cvar_f32 (AVX2 branch): y = x - mean; returns (y, ggml_float sum(y^2)/n)."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    m = _simd_cols(n)
    y = x - mean[..., None]
    sq = y * y
    parts = []
    if m:
        parts.append(_hsum8(sq[..., :m].reshape(x.shape[:-1] + (m // 8, 8))).astype(F64))
    if m < n:
        parts.append(sq[..., m:].astype(F64))
    s = _seq_sum_f64(np.concatenate(parts, axis=-1)) if parts else np.zeros(x.shape[:-1], F64)
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


def _erf_f64(x):
    try:
        from scipy.special import erf    # noqa: PLC0415 - optional
        return erf(x)
    except ImportError:
        return np.frompyfunc(math.erf, 1, 1)(x).astype(F64)


def erff_vec(x):
    """libm erff on a vector: float64 erf rounded to float32."""
    x = np.asarray(x, F32)
    return _erf_f64(x.astype(F64)).astype(F32).reshape(x.shape)


# =====================================================================================================================
# tensor plumbing
# =====================================================================================================================


def _block_view(t: Tensor) -> np.ndarray:
    """(ne3, ne2, ne1, ne0/blck) view whose elements are the tensor's blocks as raw bytes (void dtype).

    For element types a block is one element; this is how dup_bytes / concat_any see any type.
    """
    ts, bs = type_size(t.type), blck_size(t.type)
    ne, nb = t.shape, t.strides
    shape = (ne[3], ne[2], ne[1], ne[0] // bs)
    dt = np.dtype((np.void, ts))
    if min(shape) == 0:
        return np.zeros(shape, dt)
    arr, off = tensor_bytes(t)
    return np.ndarray(shape=shape, dtype=dt, buffer=arr, offset=off, strides=(nb[3], nb[2], nb[1], nb[0]))


def _flat_rows(t: Tensor, nr: int, ne0: int, dtype=None) -> np.ndarray:
    """(nr, ne0) view of a tensor whose rows are ``i*nb[1]`` apart (what GLU/SCALE index as ``i1*nb1``)."""
    from ..tensor import NP_DTYPES
    dt = np.dtype(dtype) if dtype is not None else np.dtype(NP_DTYPES[t.type])
    arr, off = tensor_bytes(t)
    return np.ndarray(shape=(nr, ne0), dtype=dt, buffer=arr, offset=off, strides=(int(t.nb[1]), int(t.nb[0])))


def _row_idx(ir0: int, ir1: int, ne1: int, ne2: int):
    """ir -> (i3, i2, i1) exactly as the kernels decompose a flat row index."""
    r = np.arange(ir0, ir1, dtype=np.int64)
    i3 = r // (ne2 * ne1)
    i2 = (r - i3 * ne2 * ne1) // ne1
    i1 = r - i3 * ne2 * ne1 - i2 * ne1
    return i3, i2, i1


def _interleaved_rows(ne1: int, ne2: int, ne3: int, ith: int, nth: int):
    """Rows of ``for i03, for i02, for (i01 = ith; i01 < ne01; i01 += nth)`` (norm, rms_norm, soft_max)."""
    i1s = np.arange(ith, ne1, nth, dtype=np.int64)
    if i1s.size == 0:
        return None
    i3, i2, i1 = np.meshgrid(np.arange(ne3), np.arange(ne2), i1s, indexing="ij")
    return i3.ravel(), i2.ravel(), i1.ravel()


def _scratch(params: ComputeParams, ne0: int):
    """``(float *) params->wdata + (ne0 + CACHE_LINE_SIZE_F32)*ith``: this thread's float scratch row (or None)."""
    start = (ne0 + CACHE_LINE_SIZE_F32) * params.ith * 4
    w = params.wdata
    if w is None or w.nbytes < start + ne0 * 4:
        return None
    return w[start:start + ne0 * 4].view(F32)


def _put_scratch(params: ComputeParams, ne0: int, row):
    """Leave in the scratch row what ggml leaves there: the last row the thread staged."""
    s = _scratch(params, ne0)
    if s is not None and row is not None:
        s[:] = np.asarray(row, F32).ravel()[:ne0]


def _dequantize(type_, raw):
    from .. import quants
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    return np.asarray(quants.dequantize_row(type_, raw), F32).reshape(raw.shape[:-1] + (-1,))


def _cpu_from_float(type_, x):
    """type_traits_cpu[type].from_float on rows of x (float32) -> dst bytes/elements."""
    if type_ == C.GGML_TYPE_F32:
        return np.asarray(x, F32)
    if type_ == C.GGML_TYPE_F16:
        return f32_to_f16(x)
    if type_ == C.GGML_TYPE_BF16:
        return f32_to_bf16(x)
    if type_ == C.GGML_TYPE_I32:
        return f32_to_i32(x)
    from . import quants as cpu_quants
    x = np.ascontiguousarray(x, F32)
    return np.asarray(cpu_quants.from_float(type_, x), np.uint8).reshape(x.shape[:-1] + (-1,))


def _assert(cond, msg):
    if not cond:
        raise AssertionError(f"GGML_ASSERT({msg}) failed")


def _kernel(fn):
    """ggml_compute_forward's early return: nothing to do for GGML_OP_NONE or an empty tensor."""
    @functools.wraps(fn)
    def run(params: ComputeParams, dst: Tensor, *args):
        if dst.op == C.GGML_OP_NONE or is_empty(dst):
            return
        return fn(params, dst, *args)
    return run


# =====================================================================================================================
# DUP / CPY / CONT
# =====================================================================================================================


def _dup_same_cont(params, dst, src0):
    """ggml_compute_forward_dup_same_cont: both contiguous, same type: memcpy of this thread's blocks."""
    ts = type_size(src0.type)
    nk = nelements(src0) // blck_size(src0.type)
    k0, k1 = thread_range(nk, params.ith, params.nth)
    if k0 < k1:
        sa, so = tensor_bytes(src0)
        da, do = tensor_bytes(dst)
        da[do + k0 * ts:do + k1 * ts] = sa[so + k0 * ts:so + k1 * ts]


def _dup_flat(params, dst, src0, convert):
    """The row loops of dup_bytes / dup_flt: src0 rows i01 in [ir0, ir1) (of every i02, i03) go to the dst elements
    with the same flat (row-major) index. Covers the same-shape row copy, the contiguous-dst copy and the general
    "dst counters" walk, which all realise that mapping. ``convert`` maps a src block array to dst values."""
    ne00, ne01, ne02, ne03 = src0.shape
    nk00 = ne00 // blck_size(src0.type)
    ir0, ir1 = thread_range(ne01, params.ith, params.nth)
    if ir0 >= ir1:
        return
    sv = _block_view(src0) if convert is None else as_array(src0)
    vals = sv[:, :, ir0:ir1, :]
    i3 = np.arange(ne03).reshape(-1, 1, 1, 1)
    i2 = np.arange(ne02).reshape(1, -1, 1, 1)
    i1 = np.arange(ir0, ir1).reshape(1, 1, -1, 1)
    i0 = np.arange(nk00).reshape(1, 1, 1, -1)
    k = ((i3 * ne02 + i2) * ne01 + i1) * nk00 + i0
    ne0, ne1, ne2, ne3 = dst.shape
    nk0 = ne0 // blck_size(dst.type)
    if convert is None:
        dv = _block_view(dst)
        out = vals
    else:
        dv = as_array(dst)
        out = convert(vals)
    if is_contiguous(dst):
        dv.reshape(-1)[k.ravel()] = out.reshape(-1)
    else:
        d3, d2, d1, d0 = np.unravel_index(k.ravel(), (ne3, ne2, ne1, nk0))
        dv[d3, d2, d1, d0] = out.reshape(-1)


def _dup_to_q(params, dst, src0):
    """ggml_compute_forward_dup_to_q: src rows -> f32 scratch -> type_traits_cpu[dst].from_float."""
    ne00, ne01, ne02, ne03 = src0.shape
    _assert(is_contiguous(dst) and int(src0.nb[0]) == type_size(src0.type), "dup_to_q: not implemented")
    ir0, ir1 = thread_range(ne01, params.ith, params.nth)
    if ir0 >= ir1:
        return
    rows = to_f32(as_array(src0)[:, :, ir0:ir1, :], src0.type)          # (ne03, ne02, n, ne00)
    q = _cpu_from_float(dst.type, rows.reshape(-1, ne00))                 # one quantized row per src row
    rs = row_size(dst.type, ne00)
    r = ((np.arange(ne03).reshape(-1, 1, 1) * ne02 + np.arange(ne02).reshape(1, -1, 1)) * ne01
         + np.arange(ir0, ir1).reshape(1, 1, -1)).ravel()                 # flat src row index -> dst byte offset r*rs
    da, do = tensor_bytes(dst)
    idx = do + r[:, None] * rs + np.arange(rs)[None, :]
    da[idx] = q.reshape(len(r), rs)
    _put_scratch(params, ne00, rows.reshape(-1, ne00)[-1])


def _dup_from_q(params, dst, src0):
    """ggml_compute_forward_dup_from_q: dequantize block by block into the f32 destination."""
    src1 = dst.src[1] if dst.src[1] is not None else dst
    qk = blck_size(src0.type)
    ne00, ne01, ne02, ne03 = src0.shape
    ne10, ne11, ne12, ne13 = src1.shape
    _assert(int(src1.nb[0]) == type_size(dst.type), "nb10 == ggml_type_size(dst->type)")
    _assert(ne10 % qk == 0 or is_contiguous(dst), "(ne10 % qk) == 0 || ggml_is_contiguous(dst)")
    nr = nelements(src1) // qk
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    i = np.arange(ir0, ir1, dtype=np.int64) * qk
    x3 = i // (ne00 * ne01 * ne02)
    x2 = (i - x3 * ne00 * ne01 * ne02) // (ne00 * ne01)
    x1 = (i - x3 * ne00 * ne01 * ne02 - x2 * ne01 * ne00) // ne00
    x0 = i - x3 * ne00 * ne01 * ne02 - x2 * ne01 * ne00 - x1 * ne00
    blocks = _block_view(src0)[x3, x2, x1, x0 // qk]
    vals = _dequantize(src0.type, blocks.view(np.uint8).reshape(len(i), type_size(src0.type)))   # (n, qk)
    # the qk floats land contiguously from dst_offset (nb10 == 4), computed with src1's strides
    y3 = i // (ne10 * ne11 * ne12)
    y2 = (i - y3 * ne10 * ne11 * ne12) // (ne10 * ne11)
    y1 = (i - y3 * ne10 * ne11 * ne12 - y2 * ne10 * ne11) // ne10
    y0 = i - y3 * ne10 * ne11 * ne12 - y2 * ne10 * ne11 - y1 * ne10
    nb = [int(x) for x in src1.nb]
    off = y0 * nb[0] + y1 * nb[1] + y2 * nb[2] + y3 * nb[3]
    da, do = tensor_bytes(dst)
    byte_idx = do + off[:, None] + np.arange(qk * 4)[None, :]
    da[byte_idx.ravel()] = vals.astype(F32).view(np.uint8).ravel()


_FLT_TYPES = (C.GGML_TYPE_F32, C.GGML_TYPE_F16, C.GGML_TYPE_BF16)


@_kernel
def forward_dup(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_dup (also CPY and CONT)."""
    src0 = dst.src[0]
    _assert(nelements(dst) == nelements(src0), "ggml_nelements(dst) == ggml_nelements(src0)")
    st, dt = src0.type, dst.type
    if st == dt:
        # dup_bytes
        if is_contiguous(src0) and is_contiguous(dst):
            _dup_same_cont(params, dst, src0)
        else:
            _dup_flat(params, dst, src0, None)
        return
    if st in _FLT_TYPES and (dt in _FLT_TYPES or (st == C.GGML_TYPE_F32 and dt == C.GGML_TYPE_I32)):
        _dup_flat(params, dst, src0, lambda v: from_f32(to_f32(v, st), dt))
        return
    if st == C.GGML_TYPE_I32 and dt == C.GGML_TYPE_F32:
        _dup_flat(params, dst, src0, lambda v: to_f32(v, st))
        return
    if st in _FLT_TYPES and is_quantized(dt):
        _dup_to_q(params, dst, src0)
        return
    if is_quantized(st) and dt == C.GGML_TYPE_F32:
        _dup_from_q(params, dst, src0)
        return
    raise NotImplementedError(f"ggml_compute_forward_dup: {type_name(st)} -> {type_name(dt)} not implemented")


forward_cpy = forward_dup
forward_cont = forward_dup


# =====================================================================================================================
# element-wise binary: ADD SUB MUL DIV (binary-ops.cpp), ADD1
# =====================================================================================================================

_BINOPS = {
    C.GGML_OP_ADD: np.add, C.GGML_OP_SUB: np.subtract, C.GGML_OP_MUL: np.multiply, C.GGML_OP_DIV: np.divide,
}

_BINARY_TYPES = {
    (C.GGML_TYPE_F32, C.GGML_TYPE_F32, C.GGML_TYPE_F32), (C.GGML_TYPE_F16, C.GGML_TYPE_F16, C.GGML_TYPE_F16),
    (C.GGML_TYPE_BF16, C.GGML_TYPE_BF16, C.GGML_TYPE_BF16), (C.GGML_TYPE_BF16, C.GGML_TYPE_F32, C.GGML_TYPE_BF16),
    (C.GGML_TYPE_BF16, C.GGML_TYPE_F32, C.GGML_TYPE_F32), (C.GGML_TYPE_F16, C.GGML_TYPE_F32, C.GGML_TYPE_F16),
    (C.GGML_TYPE_F16, C.GGML_TYPE_F32, C.GGML_TYPE_F32),
}


def _apply_binary_op(params, dst, op):
    """apply_binary_op: rows split with get_thread_range(src0); src1's row is (i03 % ne13, i02 % ne12, i01 % ne11)
    and its elements repeat along the row (``r*ne10`` blocks when its rows are contiguous, ``i % ne10``
    otherwise: the same elements)."""
    src0, src1 = dst.src[0], dst.src[1]
    key = (src0.type, src1.type, dst.type)
    if key not in _BINARY_TYPES:
        raise NotImplementedError("binary_op: unsupported types: dst: %s, src0: %s, src1: %s"
                                  % (type_name(dst.type), type_name(src0.type), type_name(src1.type)))
    _assert(src0.shape == dst.shape, "ggml_are_same_shape(src0, dst)")
    _assert(int(dst.nb[0]) == type_size(dst.type) and int(src0.nb[0]) == type_size(src0.type),
            "nb0 == sizeof(dst_t) && nb00 == sizeof(src0_t)")
    ne00, ne01, ne02, ne03 = src0.shape
    ne10, ne11, ne12, ne13 = src1.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = _row_idx(ir0, ir1, ne01, ne02)
    x = to_f32(as_array(src0)[i3, i2, i1], src0.type)
    y = to_f32(as_array(src1)[i3 % ne13, i2 % ne12, i1 % ne11], src1.type)
    if ne10 != ne00:
        y = y[:, np.arange(ne00) % ne10]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = op(x, y).astype(F32)
    as_array(dst)[i3, i2, i1] = from_f32(z, dst.type)


def _add_q_f32(params, dst):
    """ggml_compute_forward_add_q_f32: dequantize src0 row, += src1 row (same shape), from_float into dst."""
    src0, src1 = dst.src[0], dst.src[1]
    _assert(src0.shape == src1.shape == dst.shape, "same shapes")
    _assert(src1.type == C.GGML_TYPE_F32, "src1->type == GGML_TYPE_F32")
    ne00, ne01, ne02, ne03 = src0.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = _row_idx(ir0, ir1, ne01, ne02)
    w = _dequantize(src0.type, rows_bytes(src0)[i3, i2, i1]) + as_array(src1)[i3, i2, i1]
    _store_rows(dst, i3, i2, i1, _cpu_from_float(dst.type, w))
    _put_scratch(params, ne00, w[-1])


def _store_rows(t, i3, i2, i1, vals):
    """Write whole rows (element values, or quantized row bytes) at (i3, i2, i1)."""
    if is_quantized(t.type):
        rows_bytes(t)[i3, i2, i1] = vals
    else:
        as_array(t)[i3, i2, i1] = vals


@_kernel
def forward_add(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_add: f32/f16/bf16 -> binary op; quantized src0 -> add_q_f32."""
    if is_quantized(dst.src[0].type):
        _add_q_f32(params, dst)
    else:
        _apply_binary_op(params, dst, np.add)


@_kernel
def forward_sub(params: ComputeParams, dst: Tensor):
    _apply_binary_op(params, dst, np.subtract)


@_kernel
def forward_mul(params: ComputeParams, dst: Tensor):
    _apply_binary_op(params, dst, np.multiply)


@_kernel
def forward_div(params: ComputeParams, dst: Tensor):
    _apply_binary_op(params, dst, np.divide)


@_kernel
def forward_add1(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_add1: z = x + v (v the scalar src1), rows split with dr."""
    src0, src1 = dst.src[0], dst.src[1]
    ne00, ne01, ne02, ne03 = src0.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = _row_idx(ir0, ir1, ne01, ne02)
    v = to_f32(as_array(src1).reshape(-1)[:1], src1.type)[0]
    if is_quantized(src0.type):
        # add1_q_f32: dequantize, ggml_vec_acc1_f32, quantize back with the *src0* type's from_float.
        _assert(dst.type == src0.type and src1.type == C.GGML_TYPE_F32, "add1_q types")
        w = _dequantize(src0.type, rows_bytes(src0)[i3, i2, i1]) + v
        q = _cpu_from_float(src0.type, w)
        # ggml writes the row at i1*nb1 + i2*nb2 + i3*nb0 (sic: nb0, not nb3) - reproduced
        nb = [int(x) for x in dst.nb]
        rb = row_size(dst.type, int(dst.ne[0]))
        da, do = tensor_bytes(dst)
        off = i1 * nb[1] + i2 * nb[2] + i3 * nb[0]
        da[(do + off[:, None] + np.arange(rb)[None, :]).ravel()] = q.reshape(-1)
        _put_scratch(params, ne00, w[-1])
        return
    if src0.type not in _FLT_TYPES or src1.type not in (C.GGML_TYPE_F32, src0.type):
        raise NotImplementedError("add1: unsupported types")
    x = to_f32(as_array(src0)[i3, i2, i1], src0.type)
    as_array(dst)[i3, i2, i1] = from_f32(x + v, dst.type)


# =====================================================================================================================
# unary element-wise (unary-ops.cpp apply_unary_op) and the ops.cpp activations
# =====================================================================================================================


def _u_sgn(x):
    return np.where(x > 0, F32(1), np.where(x < 0, F32(-1), F32(0)))


def _u_elu(x):
    with np.errstate(all="ignore"):
        return np.where(x > 0, x, np.expm1(x.astype(F64)).astype(F32))


def _f64(fn):
    def run(x):
        with np.errstate(all="ignore"):
            return fn(x.astype(F64)).astype(F32)
    return run


def _u_sigmoid(x):
    with np.errstate(all="ignore"):
        return F32(1) / (F32(1) + expf_vec(-x))


def _u_hardsigmoid(x):
    return np.minimum(F32(1), np.maximum(F32(0), (x + F32(3)) / F32(6)))


def _u_softplus(x):
    with np.errstate(all="ignore"):
        return np.where(x > F32(20), x, _f64(np.log)(F32(1) + expf_vec(x)))


def _u_round(x):
    # roundf: half away from zero
    return (np.sign(x) * np.floor(np.abs(x) + F32(0.5))).astype(F32)


_UNARY_FNS = {
    C.GGML_UNARY_OP_ABS: np.abs,
    C.GGML_UNARY_OP_SGN: _u_sgn,
    C.GGML_UNARY_OP_NEG: np.negative,
    C.GGML_UNARY_OP_STEP: lambda x: np.where(x > 0, F32(1), F32(0)),
    C.GGML_UNARY_OP_TANH: _f64(np.tanh),
    C.GGML_UNARY_OP_ELU: _u_elu,
    C.GGML_UNARY_OP_RELU: lambda x: np.where(x > 0, x, F32(0)),
    C.GGML_UNARY_OP_SIGMOID: _u_sigmoid,
    C.GGML_UNARY_OP_HARDSIGMOID: _u_hardsigmoid,
    C.GGML_UNARY_OP_HARDSWISH: lambda x: x * _u_hardsigmoid(x),
    C.GGML_UNARY_OP_EXP: expf_vec,
    C.GGML_UNARY_OP_EXPM1: lambda x: expf_vec(x) - F32(1),
    C.GGML_UNARY_OP_SOFTPLUS: _u_softplus,
    C.GGML_UNARY_OP_FLOOR: np.floor,
    C.GGML_UNARY_OP_CEIL: np.ceil,
    C.GGML_UNARY_OP_ROUND: _u_round,
    C.GGML_UNARY_OP_TRUNC: np.trunc,
}

_OP_UNARY_FNS = {
    C.GGML_OP_SQR: lambda x: x * x,
    C.GGML_OP_SQRT: _f64(np.sqrt),      # sqrt is correctly rounded in both precisions
    C.GGML_OP_SIN: glibc_sinf,
    C.GGML_OP_COS: glibc_cosf,
    C.GGML_OP_LOG: _f64(np.log),
}

_UNARY_TYPES = {(C.GGML_TYPE_F32, C.GGML_TYPE_F32), (C.GGML_TYPE_F16, C.GGML_TYPE_F16),
                (C.GGML_TYPE_BF16, C.GGML_TYPE_BF16), (C.GGML_TYPE_BF16, C.GGML_TYPE_F32),
                (C.GGML_TYPE_F16, C.GGML_TYPE_F32)}


def _apply_unary_op(params, dst, fn):
    """apply_unary_op: rows of get_thread_range(src0); y = from_f32(op(to_f32(x)))."""
    src0 = dst.src[0]
    if (src0.type, dst.type) not in _UNARY_TYPES:
        raise NotImplementedError(f"unary: unsupported types: dst: {type_name(dst.type)}, "
                                  f"src0: {type_name(src0.type)}")
    _assert(src0.shape == dst.shape, "ggml_are_same_shape(src0, dst)")
    ne00, ne01, ne02, ne03 = src0.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = _row_idx(ir0, ir1, ne01, ne02)
    x = to_f32(as_array(src0)[i3, i2, i1], src0.type)
    with np.errstate(all="ignore"):
        y = np.asarray(fn(x), F32)
    as_array(dst)[i3, i2, i1] = from_f32(y, dst.type)


def _rows_activation(params, dst, f32_fn, f16_fn):
    """The ops.cpp activation kernels (gelu/silu/...): rows split with dr; f32 rows or f16 rows."""
    src0 = dst.src[0]
    ne00, ne01, ne02, ne03 = src0.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = _row_idx(ir0, ir1, ne01, ne02)
    x = as_array(src0)[i3, i2, i1]
    if src0.type == C.GGML_TYPE_F32:
        as_array(dst)[i3, i2, i1] = f32_fn(x)
    elif src0.type == C.GGML_TYPE_F16:
        as_array(dst)[i3, i2, i1] = f16_fn(x)
    else:
        raise NotImplementedError(f"activation on {type_name(src0.type)}")


def _gelu_f16(x):
    return gelu_table_f16()[np.asarray(x, np.float16).view(np.uint16)]


def _gelu_quick_f16(x):
    return gelu_quick_table_f16()[np.asarray(x, np.float16).view(np.uint16)]


def _gelu_erf_f32(x):
    x = np.asarray(x, F32)
    return (F32(0.5) * x) * (F32(1) + erff_vec(x * SQRT_2_INV))


def _silu_f16(x):
    v = f16_to_f32(x)
    with np.errstate(all="ignore"):
        return f32_to_f16(v / (F32(1) + expf_vec(-v)))


@_kernel
def forward_unary(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_unary: dispatch on ggml_get_unary_op(dst)."""
    uop = get_op_params_i32(dst, 0)
    if uop == C.GGML_UNARY_OP_GELU:
        _rows_activation(params, dst, gelu_f32, _gelu_f16)
    elif uop == C.GGML_UNARY_OP_GELU_QUICK:
        _rows_activation(params, dst, gelu_quick_f32, _gelu_quick_f16)
    elif uop == C.GGML_UNARY_OP_GELU_ERF:
        _rows_activation(params, dst, _gelu_erf_f32, lambda x: f32_to_f16(_gelu_erf_f32(f16_to_f32(x))))
    elif uop == C.GGML_UNARY_OP_SILU:
        _rows_activation(params, dst, silu_f32, _silu_f16)
    elif uop in _UNARY_FNS:
        _apply_unary_op(params, dst, _UNARY_FNS[uop])
    else:
        raise NotImplementedError(f"unary op {uop} not implemented")


def _make_op_unary(op):
    @_kernel
    def forward(params: ComputeParams, dst: Tensor):
        _apply_unary_op(params, dst, _OP_UNARY_FNS[op])
    forward.__name__ = f"forward_{C.OP_NAMES[op].lower()}"
    return forward


forward_sqr = _make_op_unary(C.GGML_OP_SQR)
forward_sqrt = _make_op_unary(C.GGML_OP_SQRT)
forward_sin = _make_op_unary(C.GGML_OP_SIN)
forward_cos = _make_op_unary(C.GGML_OP_COS)
forward_log = _make_op_unary(C.GGML_OP_LOG)


# =====================================================================================================================
# GLU
# =====================================================================================================================


def _swiglu_f32(x, g):
    """ggml_vec_swiglu_f32: v_silu(x)*g on 8-lane blocks, ggml_silu_f32(x)*g on the tail."""
    return silu_f32(x) * g


def _geglu_f32(x, g):
    """ggml_vec_geglu_f32 with GGML_GELU_FP16."""
    t = gelu_table_f16()[f32_to_f16(x).view(np.uint16)].astype(F32) * g
    return np.where(x <= F32(-10), F32(0), np.where(x >= F32(10), x * g, t)).astype(F32)


def _glu_f16(f32_fn):
    return lambda x, g: f32_to_f16(f32_fn(f16_to_f32(x), f16_to_f32(g)))


def _swiglu_f16(x, g):
    xi, gi = f16_to_f32(x), f16_to_f32(g)
    with np.errstate(all="ignore"):
        return f32_to_f16((xi / (F32(1) + expf_vec(-xi))) * gi)


def _geglu_f16(x, g):
    t = gelu_table_f16()[np.asarray(x, np.float16).view(np.uint16)].astype(F32)
    return f32_to_f16(t * f16_to_f32(g))


def _geglu_quick_f16(x, g):
    t = gelu_quick_table_f16()[np.asarray(x, np.float16).view(np.uint16)].astype(F32)
    return f32_to_f16(t * f16_to_f32(g))


def _reglu_f32(x, g):
    return np.where(x > 0, x * g, F32(0)).astype(F32)


def _reglu_f16(x, g):
    v = f16_to_f32(x)
    return f32_to_f16(np.where(v > 0, v * f16_to_f32(g), F32(0)))


def _geglu_erf_f32(x, g):
    return _gelu_erf_f32(x) * g


def _geglu_quick_f32(x, g):
    return gelu_quick_f32(x) * g


_GLU_FNS = {
    C.GGML_GLU_OP_REGLU: (_reglu_f32, _reglu_f16),
    C.GGML_GLU_OP_GEGLU: (_geglu_f32, _geglu_f16),
    C.GGML_GLU_OP_SWIGLU: (_swiglu_f32, _swiglu_f16),
    C.GGML_GLU_OP_GEGLU_ERF: (_geglu_erf_f32, _glu_f16(lambda x, g: (F32(0.5) * x) * (F32(1) + erff_vec(
        x * SQRT_2_INV)) * g)),
    C.GGML_GLU_OP_GEGLU_QUICK: (_geglu_quick_f32, _geglu_quick_f16),
}


@_kernel
def forward_glu(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_glu: rows (flat, ``i1*nb1``) split with dr; one src split in halves (swapped picks which
    half is the activation input) or two srcs."""
    src0, src1 = dst.src[0], dst.src[1]
    gop = get_op_params_i32(dst, 0)
    swapped = get_op_params_i32(dst, 1)
    if src1 is not None:
        _assert(src0.type == src1.type, "src0->type == src1->type")
    nc = int(src0.ne[0]) if src1 is not None else int(src0.ne[0]) // 2
    nr = nrows(src0)
    _assert(int(dst.ne[0]) == nc and nrows(dst) == nr, "dst shape")
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    a = _flat_rows(src0, nr, int(src0.ne[0]))[ir0:ir1]
    if src1 is None:
        x = a[:, nc:2 * nc] if swapped else a[:, :nc]
        g = a[:, :nc] if swapped else a[:, nc:2 * nc]
    else:
        x, g = a, _flat_rows(src1, nr, nc)[ir0:ir1]
    out = _flat_rows(dst, nr, nc)
    if gop == C.GGML_GLU_OP_SWIGLU_OAI:
        _assert(src0.type == C.GGML_TYPE_F32, "swiglu_oai: f32 only")
        alpha, limit = F32(get_op_params_f32(dst, 2)), F32(get_op_params_f32(dst, 3))
        xx = np.minimum(x, limit)
        yy = np.clip(g, -limit, limit)
        with np.errstate(all="ignore"):
            out_glu = xx / (F32(1) + expf_vec(alpha * (-xx)))
        out[ir0:ir1] = out_glu * (yy + F32(1))
        return
    if gop not in _GLU_FNS:
        raise NotImplementedError(f"glu op {gop} not implemented")
    f32_fn, f16_fn = _GLU_FNS[gop]
    if src0.type == C.GGML_TYPE_F32:
        with np.errstate(all="ignore"):
            out[ir0:ir1] = f32_fn(np.asarray(x, F32), np.asarray(g, F32))
    elif src0.type == C.GGML_TYPE_F16:
        out[ir0:ir1] = f16_fn(x, g)
    else:
        raise NotImplementedError(f"glu on {type_name(src0.type)}")


# =====================================================================================================================
# SCALE
# =====================================================================================================================


@_kernel
def forward_scale(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_scale_f32: b == 0 -> memcpy + ggml_vec_scale_f32 (y *= s); else ggml_vec_mad1_f32
    (y = x*s + b, one FMA per element: _mm256_fmadd_ps in the 32-wide body, contracted in the tail)."""
    src0 = dst.src[0]
    _assert(src0.type == C.GGML_TYPE_F32, "scale: f32 only")
    _assert(is_contiguous(src0) and is_contiguous(dst) and src0.shape == dst.shape, "contiguous, same shape")
    s = F32(get_op_params_f32(dst, 0))
    b = F32(get_op_params_f32(dst, 1))
    nc, nr = int(src0.ne[0]), nrows(src0)
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    x = _flat_rows(src0, nr, nc, F32)[ir0:ir1]
    out = _flat_rows(dst, nr, nc, F32)
    if b == 0:
        out[ir0:ir1] = x * s
    else:
        out[ir0:ir1] = fma32(x, s, b)


# =====================================================================================================================
# reductions: SUM_ROWS MEAN ARGMAX
# =====================================================================================================================


@_kernel
def forward_sum_rows(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_sum_rows_f32 (thread 0 only): ggml_vec_sum_f32 per row (double accumulator)."""
    if params.ith != 0:
        return
    src0 = dst.src[0]
    _assert(src0.type == C.GGML_TYPE_F32, "sum_rows: f32 only")
    _assert(int(src0.nb[0]) == 4 and int(dst.nb[0]) == 4, "nb0 == sizeof(float)")
    as_array(dst)[..., 0] = vec_sum_f32(as_array(src0))


@_kernel
def forward_mean(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_mean_f32 (thread 0 only): ggml_vec_sum_f32, then ``/= (float) ne00``."""
    if params.ith != 0:
        return
    src0 = dst.src[0]
    _assert(src0.type == C.GGML_TYPE_F32, "mean: f32 only")
    as_array(dst)[..., 0] = vec_sum_f32(as_array(src0)) / F32(int(src0.ne[0]))


@_kernel
def forward_argmax(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_argmax_f32 (thread 0 only): ggml_vec_argmax_f32 keeps the *last* index where the running
    max equals the element, i.e. the last occurrence of the row maximum."""
    if params.ith != 0:
        return
    src0 = dst.src[0]
    _assert(src0.type == C.GGML_TYPE_F32, "argmax: f32 only")
    ne00 = int(src0.ne[0])
    x = as_array(src0)[0, 0]                                 # (ne01, ne00); ggml_argmax asserts a matrix
    with np.errstate(invalid="ignore"):
        m = np.max(x, axis=-1, keepdims=True)
        last = ne00 - 1 - np.argmax((x == m)[:, ::-1], axis=-1)
    for r in np.nonzero(np.isnan(x).any(axis=-1))[0]:
        last[r] = _argmax_c(x[r])                            # NaN rows: MAX(a, b) is a ?: that NaN resets
    as_array(dst)[0, 0, 0, :] = last.astype(np.int32)      # dst_ = dst->data + i1*nb0 (a vector)


def _argmax_c(row) -> int:
    """ggml_vec_argmax_f32 verbatim, for the rare rows holding NaNs."""
    mx, idx = F32(-np.inf), 0
    for i, v in enumerate(row):
        mx = mx if mx > v else v
        if mx == v:
            idx = i
    return idx


# =====================================================================================================================
# REPEAT CONCAT
# =====================================================================================================================


@_kernel
def forward_repeat(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_repeat_f32/_f16 (thread 0 only): tile src0 over dst (bit copies)."""
    if params.ith != 0:
        return
    src0 = dst.src[0]
    ts = type_size(src0.type)
    if src0.type not in (C.GGML_TYPE_F32, C.GGML_TYPE_I32, C.GGML_TYPE_F16, C.GGML_TYPE_BF16, C.GGML_TYPE_I16):
        raise NotImplementedError(f"repeat on {type_name(src0.type)}")
    _assert(int(dst.nb[0]) == ts and int(src0.nb[0]) == ts, "nb0 == nb00 == sizeof(type)")
    bits = np.uint32 if ts == 4 else np.uint16
    reps = tuple(int(d) // int(s) for d, s in zip(dst.shape[::-1], src0.shape[::-1]))
    as_array(dst, bits)[...] = np.tile(as_array(src0, bits), reps)


@_kernel
def forward_concat(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_concat: thread ith fills dst planes i2 = ith, ith+nth, ...; an element comes from src0
    when its index is inside src0 along ``dim``, else from src1 shifted by src0->ne[dim] (blocks for quantized)."""
    src0, src1 = dst.src[0], dst.src[1]
    dim = get_op_params_i32(dst, 0)
    _assert(0 <= dim < 4, "dim >= 0 && dim < 4")
    ne2 = int(dst.ne[2])
    i2s = np.arange(params.ith, ne2, params.nth)
    if i2s.size == 0:
        return
    a, b, d = _block_view(src0), _block_view(src1), _block_view(dst)
    ax = 3 - dim                                               # NumPy axis of ggml dim
    if dim == 2:
        ne02 = int(src0.ne[2])
        s0 = i2s[i2s < ne02]
        s1 = i2s[i2s >= ne02]
        if s0.size:
            d[:, s0] = a[:, s0]
        if s1.size:
            d[:, s1] = b[:, s1 - ne02]
    else:
        d[:, i2s] = np.concatenate([a[:, i2s], b[:, i2s]], axis=ax)


# =====================================================================================================================
# NORM RMS_NORM (+ fused MUL)
# =====================================================================================================================


@_kernel
def forward_norm(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_norm_f32: rows i01 = ith, ith+nth, ... of every (i02, i03).

    Contiguous rows: mean = (float)ggml_vec_sum_f32 / ne00; ggml_vec_cvar_f32 centres y and returns the variance
    (AVX2 8-lane partial sums added into a double); scale = 1.0f/sqrtf(variance + eps); ggml_vec_scale_f32.
    Strided rows: the scalar float loops of the else branch.
    """
    src0 = dst.src[0]
    _assert(src0.type == C.GGML_TYPE_F32, "norm: f32 only")
    _assert(src0.shape == dst.shape, "ggml_are_same_shape(src0, dst)")
    eps = F32(get_op_params_f32(dst, 0))
    _assert(eps >= 0, "eps >= 0.0f")
    ne00, ne01, ne02, ne03 = src0.shape
    rows = _interleaved_rows(ne01, ne02, ne03, params.ith, params.nth)
    if rows is None:
        return
    i3, i2, i1 = rows
    x = as_array(src0)[i3, i2, i1]
    if int(src0.nb[0]) == 4 and int(dst.nb[0]) == 4:
        mean = vec_sum_f32(x) / F32(ne00)
        y, var = vec_cvar_f32(x, mean)
        variance = var.astype(F32)
    else:
        # float sum += x; variance += v*v (gcc contracts to an FMA); variance /= ne00
        s = np.cumsum(x, axis=-1, dtype=F32)[:, -1] if ne00 else np.zeros(len(i1), F32)
        mean = s / F32(ne00)
        y = x - mean[:, None]
        variance = np.zeros(len(i1), F32)
        for k in range(ne00):        # a sequential FMA chain: no NumPy reduction has this rounding
            variance = fma32(y[:, k], y[:, k], variance)
        variance = variance / F32(ne00)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = F32(1) / np.sqrt(variance + eps)
    as_array(dst)[i3, i2, i1] = y * scale[:, None]


def _rms_norm_rows(params, rms_node):
    src0 = rms_node.src[0]
    _assert(src0.type == C.GGML_TYPE_F32, "rms_norm: f32 only")
    _assert(int(src0.nb[0]) == 4, "src0->nb[0] == sizeof(float)")
    eps = F32(get_op_params_f32(rms_node, 0))
    _assert(eps >= 0, "eps >= 0.0f")
    ne00, ne01, ne02, ne03 = src0.shape
    rows = _interleaved_rows(ne01, ne02, ne03, params.ith, params.nth)
    if rows is None:
        return None
    i3, i2, i1 = rows
    x = as_array(src0)[i3, i2, i1]
    # ggml_float sum += (ggml_float)(x*x): float square, double sequential sum; mean = (float)(sum/ne00)
    mean = (_seq_sum_f64((x * x).astype(F64)) / ne00).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = F32(1) / np.sqrt(mean + eps)
    return i3, i2, i1, x, scale


@_kernel
def forward_rms_norm(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_rms_norm_f32: rows i01 = ith, ith+nth, ...; scale = 1.0f/sqrtf(mean + eps);
    y = memcpy(x) then ggml_vec_scale_f32."""
    _assert(dst.src[0].shape == dst.shape, "ggml_are_same_shape(src0, dst)")
    r = _rms_norm_rows(params, dst)
    if r is None:
        return
    i3, i2, i1, x, scale = r
    as_array(dst)[i3, i2, i1] = x * scale[:, None]


def forward_rms_norm_mul_fused(params: ComputeParams, rms_node: Tensor, mul_node: Tensor):
    """ggml_compute_forward_rms_norm_mul_fused: ``y[i] = x[i] * scale * w[i]`` written straight into the MUL node;
    w is the MUL's other operand, broadcast by (i01 % ne11, i02 % ne12, i03 % ne13). The RMS_NORM node's own
    buffer is never written (as in ggml)."""
    _assert(mul_node is not None, "dst_mul != nullptr")
    a0, a1 = mul_node.src[0], mul_node.src[1]
    _assert((a0 is not None and a0.addr == rms_node.addr) or (a1 is not None and a1.addr == rms_node.addr),
            "dst_mul->src[0] == dst_rms_norm || dst_mul->src[1] == dst_rms_norm")
    if is_empty(mul_node):
        return
    w_t = a1 if (a0 is not None and a0.addr == rms_node.addr) else a0
    _assert(rms_node.src[0].shape == mul_node.shape, "ggml_are_same_shape(src0, dst)")
    r = _rms_norm_rows(params, rms_node)
    if r is None:
        return
    i3, i2, i1, x, scale = r
    ne10, ne11, ne12, ne13 = w_t.shape
    w = as_array(w_t)[i3 % ne13, i2 % ne12, i1 % ne11][:, :int(rms_node.ne[0])]
    as_array(mul_node)[i3, i2, i1] = (x * scale[:, None]) * w


# =====================================================================================================================
# SOFT_MAX
# =====================================================================================================================


def alibi_slopes(n_head: int, max_bias: float, heads) -> np.ndarray:
    """The ALiBi slope of each head h, as soft_max computes it (m0/m1 with powf, then powf(m, ...))."""
    max_bias = F32(max_bias)
    if not max_bias > 0:
        return np.ones(len(heads), F32)
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = powf(2.0, F32(-max_bias) / F32(n_head_log2))
    m1 = powf(2.0, F32(-(max_bias / F32(2))) / F32(n_head_log2))
    out = np.empty(len(heads), F32)
    cache = {}
    for j, h in enumerate(heads):
        h = int(h)
        if h not in cache:
            cache[h] = powf(m0, h + 1) if h < n_head_log2 else powf(m1, 2 * (h - n_head_log2) + 1)
        out[j] = cache[h]
    return out


@_kernel
def forward_soft_max(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_soft_max_f32: rows i01 = ith, ith+nth, ... of every (i02, i03).

    wp = x*scale (+ slope*mask, one FMA per element as gcc contracts ``wp[i] += slope*m[i]``) in the thread's
    scratch row; max (with the sink, if any); ggml_vec_soft_max_f32 (AVX2 ggml_v_expf blocks + libm tail, double
    sum); sum += expf(sink - max); dp *= (float)(1.0/sum).
    """
    src0, src1, src2 = dst.src[0], dst.src[1], dst.src[2]
    _assert(src0.type == C.GGML_TYPE_F32, "soft_max: f32 only")
    scale = F32(get_op_params_f32(dst, 0))
    max_bias = F32(get_op_params_f32(dst, 1))
    ne00, ne01, ne02, ne03 = src0.shape
    rows = _interleaved_rows(ne01, ne02, ne03, params.ith, params.nth)
    if rows is None:
        return
    i3, i2, i1 = rows
    wp = as_array(src0)[i3, i2, i1] * scale
    slope = alibi_slopes(ne02, max_bias, i2)
    if src1 is not None:
        ne12, ne13 = int(src1.ne[2]), int(src1.ne[3])
        m = to_f32(as_array(src1)[i3 % ne13, i2 % ne12, i1], src1.type)
        wp = fma32(slope[:, None], m, wp)
    with np.errstate(invalid="ignore"):
        mx = np.max(wp, axis=-1) if ne00 else np.full(len(i1), -np.inf, F32)
    sk = None
    if src2 is not None:
        sk = as_array(src2).reshape(-1)[i2].astype(F32)
        mx = np.where(mx > sk, mx, sk).astype(F32)     # MAX(max, sk[i02])
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        y, s = vec_soft_max_f32(wp, mx)
        if sk is not None:
            s = s + expf_vec(sk - mx).astype(F64)
        inv = (1.0 / s).astype(F32)
    as_array(dst)[i3, i2, i1] = y * inv[:, None]
    _put_scratch(params, ne00, wp[-1])


# =====================================================================================================================
# ROPE
# =====================================================================================================================


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float):
    """ggml_rope_yarn_corr_dims (ggml.c), in float like the C code."""
    def corr_dim(n_rot):
        with np.errstate(all="ignore"):
            den = F32(F32(F32(n_rot) * F32(2)) * F32(math.pi))
            return F32(F32(F32(n_dims) * logf(F32(F32(n_ctx_orig) / den))) / F32(F32(2) * logf(freq_base)))
    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    # MAX(0, start) and MIN(n_dims - 1, end) are ?: macros: a NaN (e.g. n_ctx_orig == 0) passes through
    lo = F32(0) if F32(0) > start else F32(start)
    hi = F32(n_dims - 1) if F32(n_dims - 1) < end else F32(end)
    return lo, hi


def _rope_cache(thetas, freq_scale, ff, corr_dims, ext_factor, mscale, sin_sign):
    """rope_yarn for a matrix of base thetas (rows: positions, columns: i0/2): returns (cos, sin) float32."""
    with np.errstate(all="ignore"):
        theta_extrap = thetas / ff
        theta_interp = freq_scale * theta_extrap
        theta = theta_interp
        if ext_factor != 0:
            i0h = np.arange(thetas.shape[-1], dtype=np.int64)        # i0/2
            low, high = corr_dims
            y = (i0h.astype(F32) - low) / max(F32(0.001), F32(high - low))
            ramp = F32(1) - np.minimum(F32(1), np.maximum(F32(0), y))
            ramp_mix = ramp * ext_factor
            # theta_interp*(1 - ramp_mix) + theta_extrap*ramp_mix: gcc fuses the first product into the add
            theta = fma32(theta_interp, F32(1) - ramp_mix, theta_extrap * ramp_mix)
            mscale = F32(mscale * fma32(F32(0.1), logf(F32(1) / freq_scale), F32(1)))
        cos = glibc_cosf(theta) * mscale
        sin = glibc_sinf(theta) * mscale
    return cos, sin * sin_sign


def _seq_powers(bases, theta_scale, n):
    """theta = base; for each column: use theta, then theta *= theta_scale (sequential float products)."""
    a = np.empty((len(bases), n), F32)
    a[:, 0] = bases
    a[:, 1:] = theta_scale
    with np.errstate(over="ignore", under="ignore"):
        return np.multiply.accumulate(a, axis=1, dtype=F32)


def _mrope_thetas(pos4, sections, is_imrope, indep_sects, theta_scale, nh):
    """ggml_mrope_cache_init's choice of theta per column (with the per-section resets of vision rope)."""
    s0, s1, s2, s3 = (int(v) for v in sections)
    sect_dims = s0 + s1 + s2 + s3
    sec_w = s1 + s0
    sec_e = s2 + sec_w
    j = np.arange(nh)
    sector = j % sect_dims
    # steps since the last reset of each theta (no resets unless indep_sects)
    steps = []
    for start in (0, s0, sec_w, sec_e):
        if indep_sects:
            is_reset = sector == start
            last = np.maximum.accumulate(np.where(is_reset, j, -1))
            steps.append(np.where(last >= 0, j - last, j))
        else:
            steps.append(j)
    acc = [_seq_powers(pos4[:, q].astype(F32), theta_scale, nh) for q in range(4)]   # t, h, w, e
    th = [np.take_along_axis(acc[q], np.broadcast_to(steps[q], acc[q].shape), axis=1) for q in range(4)]
    theta = th[0].copy()
    if is_imrope:
        sel_h = (sector % 3 == 1) & (sector < 3 * s1)
        sel_w = (sector % 3 == 2) & (sector < 3 * s2)
        sel_t = (sector % 3 == 0) & (sector < 3 * s0)
        theta = np.where(sel_h, th[1], np.where(sel_w, th[2], np.where(sel_t, th[0], th[3])))
    else:
        theta = np.where((sector >= s0) & (sector < sec_w), th[1], theta)
        theta = np.where((sector >= sec_w) & (sector < sec_w + s2), th[2], theta)
        theta = np.where(sector >= sec_w + s2, th[3], theta)
    return theta.astype(F32)


def _rope(params, dst, forward: bool):
    src0, src1, src2 = dst.src[0], dst.src[1], dst.src[2]
    _assert(src0.type in (C.GGML_TYPE_F32, C.GGML_TYPE_F16), "src0 F32 or F16")
    _assert(src1.type == C.GGML_TYPE_I32, "src1->type == GGML_TYPE_I32")
    n_dims = get_op_params_i32(dst, 1)
    mode = get_op_params_i32(dst, 2)
    n_ctx_orig = get_op_params_i32(dst, 4)
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (
        F32(get_op_params_f32(dst, i)) for i in range(5, 11))
    sections = [get_op_params_i32(dst, i) for i in range(11, 15)]
    ne0, ne1, ne2, ne3 = dst.shape
    ts = type_size(src0.type)
    _assert(int(dst.nb[0]) == int(src0.nb[0]) == ts, "nb0 == nb00 == sizeof(T)")
    _assert(n_dims <= ne0 and n_dims % 2 == 0, "n_dims <= ne0 && n_dims % 2 == 0")
    nr = nrows(dst)
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    theta_scale = powf(freq_base, F32(-2.0) / F32(n_dims))
    corr_dims = rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    is_imrope = mode == C.GGML_ROPE_TYPE_IMROPE
    mrope_used = bool(mode & C.GGML_ROPE_TYPE_MROPE)
    is_vision = mode == C.GGML_ROPE_TYPE_VISION
    if mrope_used:
        _assert(sections[0] > 0 or sections[1] > 0 or sections[2] > 0, "mrope sections")
        _assert(sum(sections) <= ne0, "sect_dims <= ne0")
    if is_vision:
        _assert(n_dims == ne0 // 2, "n_dims == ne0/2")
    nh = (ne0 + 1) // 2                      # cache entries: i0 = 0, 2, ..., < ne0
    ff = np.ones(nh, F32)
    if src2 is not None:
        _assert(src2.type == C.GGML_TYPE_F32 and int(src2.ne[0]) >= n_dims // 2, "freq factors")
        fv = as_array(src2).reshape(-1)
        k = min(nh, fv.size)
        ff[:k] = fv[:k]                       # ggml reads freq_factors[i0/2] for every i0 < ne0
    sin_sign = F32(1.0 if forward else -1.0)
    pos = as_array(src1).reshape(-1)
    i3, i2, i1 = _row_idx(ir0, ir1, ne1, ne2)
    # one cache per position i2 the thread meets (ggml recomputes it whenever i2 changes)
    uniq, inv = np.unique(i2, return_inverse=True)
    if not mrope_used:
        thetas = _seq_powers(pos[uniq].astype(F32), theta_scale, nh)
    else:
        pos4 = np.stack([pos[uniq + q * ne2] for q in range(4)], axis=1)
        thetas = _mrope_thetas(pos4, sections, is_imrope, is_vision, theta_scale, nh)
    cos, sin = _rope_cache(thetas, freq_scale, ff, corr_dims, ext_factor, attn_factor, sin_sign)
    cos, sin = cos[inv], sin[inv]            # (rows, nh)
    x = to_f32(as_array(src0)[i3, i2, i1], src0.type)
    out = x.copy()                           # channels >= n_dims are copied from src (bit-exact in T)
    if mode == C.GGML_ROPE_TYPE_NORMAL:
        n, n_off, scale = n_dims, 1, 1
    elif mode in (C.GGML_ROPE_TYPE_NEOX, C.GGML_ROPE_TYPE_MROPE, C.GGML_ROPE_TYPE_IMROPE):
        n, n_off, scale = n_dims, n_dims // 2, 2
    elif is_vision:
        n, n_off, scale = ne0, n_dims, 2
    else:
        raise NotImplementedError("rope type not supported")
    i0 = np.arange(0, n, 2)
    ic = i0 // scale
    c, s = cos[:, i0 // 2], sin[:, i0 // 2]
    x0, x1 = x[:, ic], x[:, ic + n_off]
    # x0*cos - x1*sin and x0*sin + x1*cos: gcc fuses the first product of each into the add/sub
    out[:, ic] = fma32(x0, c, -(x1 * s))
    out[:, ic + n_off] = fma32(x0, s, x1 * c)
    dv = as_array(dst)
    if src0.type == C.GGML_TYPE_F32:
        dv[i3, i2, i1] = out
    else:
        res = f32_to_f16(out)
        if not is_vision and n_dims < ne0:
            res[:, n_dims:] = as_array(src0)[i3, i2, i1][:, n_dims:]
        dv[i3, i2, i1] = res
    # the scratch holds the cache of the last position this thread used: cos/sin interleaved
    last = np.empty(2 * nh, F32)
    last[0::2], last[1::2] = cos[-1], sin[-1]
    _put_scratch(params, ne0, last[:ne0])


@_kernel
def forward_rope(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_rope (rope_flt<float|ggml_fp16_t>, forward): rows of the flattened (i3, i2, i1) split
    with dr; per position the cache theta_i = p*theta_scale^i (sequential float products), divided by the freq
    factor, YaRN-mixed (rope_yarn), cos/sin times mscale; then rotate_pairs (NORMAL: adjacent pairs; NEOX/MROPE:
    halves n_dims/2 apart; VISION: n_dims apart over the whole row); channels past n_dims are copied."""
    _rope(params, dst, True)


@_kernel
def forward_rope_back(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_rope_back: the same with sin_sign = -1."""
    _rope(params, dst, False)


# =====================================================================================================================
# GET_ROWS SET_ROWS
# =====================================================================================================================


@_kernel
def forward_get_rows(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_get_rows: index i (of nelements(src1), split with dr) -> (i10, i11, i12); row
    src0[i12, i11, src1[i12, i11, i10]] converted to f32 (dequantized, fp16/bf16 widened, or copied) into
    dst[i12, i11, i10]."""
    src0, src1 = dst.src[0], dst.src[1]
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    ne10, ne11, ne12 = int(src1.ne[0]), int(src1.ne[1]), int(src1.ne[2])
    nr = nelements(src1)
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    i = np.arange(ir0, ir1, dtype=np.int64)
    i12 = i // (ne11 * ne10)
    i11 = (i - i12 * ne11 * ne10) // ne10
    i10 = i - i12 * ne11 * ne10 - i11 * ne10
    i01 = as_array(src1)[0, i12, i11, i10].astype(np.int64)
    bad = (i01 < 0) | (i01 >= ne01)
    if np.any(bad):
        raise AssertionError(f"GGML_ASSERT(i01 >= 0 && i01 < ne01) failed (index {int(i01[bad][0])}, ne01 {ne01})")
    if is_quantized(src0.type):
        vals = _dequantize(src0.type, rows_bytes(src0)[i12, i11, i01])
    elif src0.type in (C.GGML_TYPE_F16, C.GGML_TYPE_BF16):
        vals = to_f32(as_array(src0)[i12, i11, i01], src0.type)
    elif src0.type in (C.GGML_TYPE_F32, C.GGML_TYPE_I32):
        # ggml_vec_cpy_f32: a bit copy (I32 rows come back as I32)
        vals = as_array(src0, np.uint32)[i12, i11, i01]
        as_array(dst, np.uint32)[i12, i11, i10] = vals
        return
    else:
        raise NotImplementedError(f"get_rows from {type_name(src0.type)}")
    as_array(dst)[i12, i11, i10] = vals[:, :ne00]


@_kernel
def forward_set_rows(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_set_rows: for every (i03, i02), rows i of src0 in the thread's dr share of ne01 go to
    dst row src1[i03 % ne12, i02 % ne11, i] through type_traits_cpu[dst->type].from_float (F16 -> F16 is a memcpy;
    other F16 sources are widened into the scratch row first)."""
    src0, src1 = dst.src[0], dst.src[1]
    _assert(src0.type in (C.GGML_TYPE_F32, C.GGML_TYPE_F16), "src0 F32 or F16")
    _assert(src1.type in (C.GGML_TYPE_I32, C.GGML_TYPE_I64), "src1 I32 or I64")
    ne00, ne01, ne02, ne03 = src0.shape
    ne10, ne11, ne12 = int(src1.ne[0]), int(src1.ne[1]), int(src1.ne[2])
    ne1 = int(dst.ne[1])
    ir0, ir1 = thread_range(ne01, params.ith, params.nth)
    if ir0 >= ir1:
        return
    i03, i02, ii = (a.ravel() for a in np.meshgrid(np.arange(ne03), np.arange(ne02), np.arange(ir0, ir1),
                                                   indexing="ij"))
    i1 = as_array(src1)[0, i03 % ne12, i02 % ne11, ii].astype(np.int64)
    bad = (i1 < 0) | (i1 >= ne1)
    if np.any(bad):
        raise AssertionError(f"GGML_ASSERT(i1 >= 0 && i1 < ne1) failed (index {int(i1[bad][0])}, ne1 {ne1})")
    rows = as_array(src0)[i03, i02, ii]
    if src0.type == C.GGML_TYPE_F16 and dst.type == C.GGML_TYPE_F16:
        as_array(dst)[i03, i02, i1] = rows
        return
    x = to_f32(rows, src0.type)
    # a sequential loop: with repeated indices the last row written wins (NumPy's assignment keeps the last too)
    _store_rows(dst, i03, i02, i1, _cpu_from_float(dst.type, x))
    if src0.type == C.GGML_TYPE_F16:
        _put_scratch(params, ne00, x[-1])


# =====================================================================================================================
# OUT_PROD
# =====================================================================================================================


@_kernel
def forward_out_prod(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_out_prod: thread 0 zeroes dst, barrier, then rows (i1, i2, i3) of dst split with dr get
    ``d += src0[i03, i02, i01, :] * src1[i13, i12, i01, i1]`` for i01 = 0, 1, ... in order, one FMA per element
    (ggml_vec_mad_f32_unroll / ggml_vec_mad_f32). F16/quantized src0 rows are widened into the scratch row first.
    """
    src0, src1 = dst.src[0], dst.src[1]
    _assert(dst.type == C.GGML_TYPE_F32 and src1.type == C.GGML_TYPE_F32, "dst, src1 F32")
    ne00, ne01, ne02, ne03 = src0.shape
    ne0, ne1, ne2, ne3 = dst.shape
    _assert(ne0 == ne00 and ne1 == int(src1.ne[0]) and ne2 == int(src1.ne[2]) and ne3 == int(src1.ne[3]),
            "out_prod shapes")
    _assert(int(dst.nb[0]) == 4, "nb0 == sizeof(float)")
    if src0.type != C.GGML_TYPE_F32:
        _assert(ne02 == ne2 and ne03 == ne3, "ne02 == ne12 && ne03 == ne13")
    if params.ith == 0:
        # ggml_vec_set_f32(ne0*ne1*ne2*ne3, dst->data, 0): a contiguous run of floats from dst->data
        da, do = tensor_bytes(dst)
        da[do:do + ne0 * ne1 * ne2 * ne3 * 4] = 0
    params.barrier()
    nr = ne1 * ne2 * ne3
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = _row_idx(ir0, ir1, ne1, ne2)
    i02 = i2 // (ne2 // ne02)
    i03 = i3 // (ne3 // ne03)
    s1 = as_array(src1)                                      # (ne13, ne12, ne11, ne10)
    if is_quantized(src0.type):
        rb = rows_bytes(src0)
        a_rows = lambda i01: _dequantize(src0.type, rb[i03, i02, i01])        # noqa: E731
    else:
        s0 = as_array(src0)
        a_rows = lambda i01: to_f32(s0[i03, i02, i01], src0.type)           # noqa: E731
    acc = np.zeros((len(i1), ne0), F32)
    last = None
    for i01 in range(ne01):                  # the i01 order is the FMA chain's order: it cannot be reassociated
        a = a_rows(i01)
        acc = fma32(a, s1[i3, i2, i01, i1][:, None], acc)
        last = a
    as_array(dst)[i3, i2, i1] = acc
    if src0.type != C.GGML_TYPE_F32 and last is not None:
        _put_scratch(params, ne0, last[-1])


# =====================================================================================================================
# no-ops and the dispatch table
# =====================================================================================================================


def forward_nop(params: ComputeParams, dst: Tensor):
    """NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE: views of existing data; ggml computes nothing."""
    return None


FORWARD = {
    C.GGML_OP_NONE: forward_nop,
    C.GGML_OP_RESHAPE: forward_nop,
    C.GGML_OP_VIEW: forward_nop,
    C.GGML_OP_PERMUTE: forward_nop,
    C.GGML_OP_TRANSPOSE: forward_nop,
    C.GGML_OP_DUP: forward_dup,
    C.GGML_OP_CPY: forward_cpy,
    C.GGML_OP_CONT: forward_cont,
    C.GGML_OP_ADD: forward_add,
    C.GGML_OP_SUB: forward_sub,
    C.GGML_OP_MUL: forward_mul,
    C.GGML_OP_DIV: forward_div,
    C.GGML_OP_ADD1: forward_add1,
    C.GGML_OP_SCALE: forward_scale,
    C.GGML_OP_SQR: forward_sqr,
    C.GGML_OP_SQRT: forward_sqrt,
    C.GGML_OP_SIN: forward_sin,
    C.GGML_OP_COS: forward_cos,
    C.GGML_OP_LOG: forward_log,
    C.GGML_OP_SUM_ROWS: forward_sum_rows,
    C.GGML_OP_MEAN: forward_mean,
    C.GGML_OP_ARGMAX: forward_argmax,
    C.GGML_OP_REPEAT: forward_repeat,
    C.GGML_OP_CONCAT: forward_concat,
    C.GGML_OP_NORM: forward_norm,
    C.GGML_OP_RMS_NORM: forward_rms_norm,
    C.GGML_OP_SOFT_MAX: forward_soft_max,
    C.GGML_OP_ROPE: forward_rope,
    C.GGML_OP_ROPE_BACK: forward_rope_back,
    C.GGML_OP_UNARY: forward_unary,
    C.GGML_OP_GLU: forward_glu,
    C.GGML_OP_GET_ROWS: forward_get_rows,
    C.GGML_OP_SET_ROWS: forward_set_rows,
    C.GGML_OP_OUT_PROD: forward_out_prod,
}
