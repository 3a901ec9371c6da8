"""ggviz's own libm: the C library functions ggml's scalar code calls, reproduced bit for bit.

Not a ggml source file: ggml calls glibc (``expf``, ``sinf``, ``cosf``, ``powf``, ``logf``, ``erff``, ``fmaf``) and
both of ggviz's kernel sets need the very same results -- the faithful NumPy kernels (``ops.py``, ``vec.py``) and the
compiled ones (``fast/``), which read the tables below. So they live here, once:

* ``powf`` / ``logf`` on scalars go through the real libm (ctypes) when it loads;
* ``fma32`` / ``fma64``: single-rounding fused multiply-adds (what vfmadd and gcc-contracted code compute);
* glibc's ``expf`` / ``sinf`` / ``cosf`` (sysdeps/ieee754/flt-32, the FMA ifunc variants) emulated in float64
  NumPy plus an exact double FMA: they work in double precision and round once to float, so the emulation is exact
  (checked in the tests against the real libm through ctypes);
* ``erff`` (float64-rounded: not glibc's own float routine, ~1 % of elements may differ by 1 ulp).
"""
from __future__ import annotations

import ctypes
import math

import numpy as np

_scipy_erf = None      # scipy.special.erf, imported on the first erf (optional: faster than math.erf element by
_scipy_tried = False   # element); SciPy's import costs a run that computes no GELU-erf ~0.2 s
F32 = np.float32
F64 = np.float64

# =====================================================================================================================
# scalar libm (ggml calls powf/logf on scalars: use the very same functions when the C library loads)
# =====================================================================================================================


def _load_libm():
    try:
        lib = _open_libm()
        for name, nargs in (("powf", 2), ("logf", 1)):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_float
            fn.argtypes = [ctypes.c_float] * nargs
        return lib
    except (OSError, AttributeError, TypeError):   # pragma: no cover - non-glibc platforms
        return None


def _open_libm() -> ctypes.CDLL:
    # glibc's soname first: ``ctypes.util.find_library`` runs ``ldconfig -p`` in a child process (~5 ms of every
    # run's imports, more in a process as big as Numba's) to find the very name it is asked for on glibc.
    try:
        return ctypes.CDLL("libm.so.6")
    except OSError:                                 # pragma: no cover - not glibc: ask the system where libm is
        from ctypes.util import find_library
        return ctypes.CDLL(find_library("m") or "libm.so.6")


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
    with np.errstate(invalid="ignore", over="ignore"):     # inf * 0 is NaN, as the instruction gives it: no warning
        p = np.asarray(a, F32).astype(F64) * np.asarray(b, F32).astype(F64)
        cc = np.asarray(c, F32).astype(F64)
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
EXP2F_TAB = np.array([
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540], dtype=np.uint64)
EXP2F_N = 32
EXP2F_SHIFT = _H("0x1.8p+52")
EXP2F_INVLN2N = _H("0x1.71547652b82fep+0") * EXP2F_N
EXP2F_C = (_H("0x1.c6af84b912394p-5") / 32 / 32 / 32, _H("0x1.ebfce50fac4f3p-3") / 32 / 32,
           _H("0x1.62e42ff0c52d6p-1") / 32)


def glibc_expf(x):
    """glibc __expf (EXP2F_TABLE_BITS = 5, !TOINT_INTRINSICS), FMA build: x*N/ln2 = k + r, 2^(k/N) from the
    table, a cubic in r. gcc fuses ``InvLn2N*xd`` into both ``+ SHIFT`` and ``- kd``."""
    x = np.asarray(x, F32)
    xd = x.astype(F64)
    with np.errstate(all="ignore"):
        kd = fma64(EXP2F_INVLN2N, xd, EXP2F_SHIFT)
        ki = np.nan_to_num(kd, nan=0.0, posinf=0.0, neginf=0.0).view(np.uint64)
        kd = kd - EXP2F_SHIFT
        r = fma64(EXP2F_INVLN2N, xd, -kd)
        t = EXP2F_TAB[(ki % np.uint64(EXP2F_N)).astype(np.intp)] + (ki << np.uint64(52 - 5))
        sc = t.view(F64)
        z = fma64(EXP2F_C[0], r, EXP2F_C[1])
        y = fma64(EXP2F_C[2], r, 1.0)
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


SC_SIGN = np.array([1.0, -1.0, -1.0, 1.0])
SC_HPI_INV = _H("0x1.45F306DC9C883p+23")
SC_HPI = _H("0x1.921FB54442D18p0")
SC_PI63 = _H("0x1.921FB54442D18p-62")
SC_TAB = {k: _H(v) for k, v in (("c0", "0x1p0"), ("c1", "-0x1.ffffffd0c621cp-2"), ("c2", "0x1.55553e1068f19p-5"),
                                ("c3", "-0x1.6c087e89a359dp-10"), ("c4", "0x1.99343027bf8c3p-16"),
                                ("s1", "-0x1.555545995a603p-3"), ("s2", "0x1.1107605230bc4p-7"),
                                ("s3", "-0x1.994eb3774cf24p-13"))}
INV_PIO4 = np.array([
    0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
    0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0,
    0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041],
    dtype=np.uint64)


def _sincosf_poly(x, x2, tab1, odd):
    """sinf_poly: the sine polynomial for even quadrants, the cosine one for odd; __sincosf_table[1] (tab1) is the
    table with the cosine coefficients negated."""
    def g(k):
        v = SC_TAB[k]
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
    res0 = (m * INV_PIO4[idx]) & np.uint64(0xFFFFFFFF)         # a uint32 product in C
    res1 = m * INV_PIO4[idx + 4]
    res2 = m * INV_PIO4[idx + 8]
    res0 = ((res2 >> np.uint64(32)) | (res0 << np.uint64(32))) + res1
    n = (res0 + (np.uint64(1) << np.uint64(61))) >> np.uint64(62)
    res0 = res0 - (n << np.uint64(62))
    return res0.view(np.int64).astype(F64) * SC_PI63, n.astype(np.int64)


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
            n = ((np.trunc(xm * SC_HPI_INV).astype(np.int64).astype(np.int32) + np.int32(0x800000)) >> 24)
            n = n.astype(np.int64)
            xr = fma64(-n.astype(F64), SC_HPI, xm)                  # x - n*hpi, fused
            out[mid] = _sincosf_poly(xr * SC_SIGN[n & 3], xr * xr, (n & 2) != 0, ((n ^ flip) & 1) == 1)
        if large.any():
            xl, n = _reduce_large(bits[large])
            q = n + (bits[large] >> np.uint32(31)).astype(np.int64)
            out[large] = _sincosf_poly(xl * SC_SIGN[q & 3], xl * xl, (q & 2) != 0, ((n ^ flip) & 1) == 1)
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


def erf_f64(x):
    global _scipy_erf, _scipy_tried
    if not _scipy_tried:
        _scipy_tried = True
        try:
            from scipy.special import erf as _scipy_erf
        except ImportError:
            _scipy_erf = None
    if _scipy_erf is not None:
        return _scipy_erf(x)
    return np.frompyfunc(math.erf, 1, 1)(x).astype(F64)


def erff_vec(x):
    """libm erff on a vector: float64 erf rounded to float32."""
    x = np.asarray(x, F32)
    return erf_f64(x.astype(F64)).astype(F32).reshape(x.shape)
