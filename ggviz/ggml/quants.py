"""Block formats and reference (de)quantisation of ggml, in NumPy.

Mirrors, from ggml 0.20.2:

* ``ggml-common.h``: the block structs ``block_q4_0``, ``block_q4_1``, ``block_q5_0``,
  ``block_q5_1``, ``block_q8_0``, ``block_q8_1``, ``block_q2_K`` ... ``block_q6_K``,
  ``block_q8_K`` (as :data:`BLOCK_DTYPES`);
* ``ggml-impl.h``: ``ggml_compute_fp16_to_fp32``, ``ggml_compute_fp32_to_fp16``,
  ``ggml_compute_bf16_to_fp32``, ``ggml_compute_fp32_to_bf16``;
* ``ggml.c``: ``ggml_fp16_to_fp32_row``, ``ggml_fp32_to_fp16_row``,
  ``ggml_bf16_to_fp32_row``, ``ggml_fp32_to_bf16_row_ref``, ``ggml_quantize_chunk``,
  ``ggml_row_size``;
* ``ggml-quants.c``: ``dequantize_row_*``, ``quantize_row_*_ref``, ``quantize_q*`` with
  their imatrix variants ``quantize_row_*_impl``, and the helpers ``nearest_int``,
  ``make_qx_quants``, ``make_q3_quants``, ``make_qkx2_quants``, ``make_qkx3_quants``,
  ``make_qp_quants``, ``get_scale_min_k4``.

Everything is bit-exact with the C library (tests/test_quants.py checks it).  The C
code is written block by block; here every function works on all blocks at once,
and only the *element* loops that carry a sequential float32 state (running sums,
greedy refinements) remain Python loops, each step vectorised over all blocks.

Two facts make bit-exactness possible:

* ggml-base is compiled for baseline x86-64 without ``-ffast-math`` and without FMA,
  so every C expression is a chain of correctly rounded float32 operations, evaluated
  in source order.  We keep every intermediate float32 and keep the same association
  (``w*x*l`` is ``(w*x)*l``).
* the C loops ``float s = 0; for (...) s += a[i];`` are strictly sequential; NumPy's
  ``sum`` is pairwise, but ``np.add.accumulate`` is sequential, so :func:`_seqsum`
  uses it.
"""
from __future__ import annotations

import numpy as np

from .consts import (
    GGML_TYPE_BF16,
    GGML_TYPE_F16,
    GGML_TYPE_F32,
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
    TYPE_TRAITS,
)
from .impl import blck_size, row_size, type_name, type_size  # ggml.c's type traits, re-exported

__all__ = [
    "QK4_0", "QK4_1", "QK5_0", "QK5_1", "QK8_0", "QK8_1", "QK_K", "K_SCALE_SIZE",
    "BLOCK_DTYPES", "SUPPORTED_TYPES",
    "type_name", "blck_size", "type_size", "row_size",
    "fp16_to_fp32", "fp32_to_fp16", "bf16_to_fp32", "fp32_to_bf16",
    "as_blocks", "unpack_blocks", "decode_block",
    "dequantize_row", "quantize_row_ref", "quantize_chunk",
    "nearest_int",
]

# ---------------------------------------------------------------------------------
# ggml-common.h
# ---------------------------------------------------------------------------------

QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = QK8_1 = 32
QK_K = 256
K_SCALE_SIZE = 12

# GROUP_MAX_EPS in ggml-quants.c: below this a group counts as all-zero
GROUP_MAX_EPS = np.float32(1e-15)

_F32 = np.float32
_HALF = "<f2"  # ggml_half: IEEE binary16, stored little-endian; the view keeps the bits

# The block structs, field for field and in C order.  Anonymous unions such as
# ``union { struct { ggml_half d; ggml_half m; }; ggml_half2 dm; }`` are given as their
# two halves, as C code accesses them (x.d, x.m).
BLOCK_DTYPES: dict[int, np.dtype] = {
    GGML_TYPE_F32: np.dtype("<f4"),
    GGML_TYPE_F16: np.dtype(_HALF),
    GGML_TYPE_BF16: np.dtype([("bits", "<u2")]),  # struct ggml_bf16_t { uint16_t bits; }
    GGML_TYPE_Q4_0: np.dtype([("d", _HALF), ("qs", "u1", (QK4_0 // 2,))]),
    GGML_TYPE_Q4_1: np.dtype([("d", _HALF), ("m", _HALF), ("qs", "u1", (QK4_1 // 2,))]),
    GGML_TYPE_Q5_0: np.dtype([("d", _HALF), ("qh", "u1", (4,)), ("qs", "u1", (QK5_0 // 2,))]),
    GGML_TYPE_Q5_1: np.dtype([("d", _HALF), ("m", _HALF), ("qh", "u1", (4,)),
                              ("qs", "u1", (QK5_1 // 2,))]),
    GGML_TYPE_Q8_0: np.dtype([("d", _HALF), ("qs", "i1", (QK8_0,))]),
    GGML_TYPE_Q8_1: np.dtype([("d", _HALF), ("s", _HALF), ("qs", "i1", (QK8_1,))]),
    GGML_TYPE_Q2_K: np.dtype([("scales", "u1", (QK_K // 16,)), ("qs", "u1", (QK_K // 4,)),
                              ("d", _HALF), ("dmin", _HALF)]),
    GGML_TYPE_Q3_K: np.dtype([("hmask", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 4,)),
                              ("scales", "u1", (12,)), ("d", _HALF)]),
    GGML_TYPE_Q4_K: np.dtype([("d", _HALF), ("dmin", _HALF), ("scales", "u1", (K_SCALE_SIZE,)),
                              ("qs", "u1", (QK_K // 2,))]),
    GGML_TYPE_Q5_K: np.dtype([("d", _HALF), ("dmin", _HALF), ("scales", "u1", (K_SCALE_SIZE,)),
                              ("qh", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 2,))]),
    GGML_TYPE_Q6_K: np.dtype([("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)),
                              ("scales", "i1", (QK_K // 16,)), ("d", _HALF)]),
    GGML_TYPE_Q8_K: np.dtype([("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))]),
}

SUPPORTED_TYPES = tuple(BLOCK_DTYPES)


def _check_type(t: int) -> None:
    if t not in BLOCK_DTYPES:
        name = TYPE_TRAITS[t][0] if TYPE_TRAITS.get(t) else f"#{t}"
        raise NotImplementedError(f"ggml type {name} is not implemented in ggviz.ggml.quants")


for _t, _dt in BLOCK_DTYPES.items():  # the structs must have ggml's exact sizes (static_assert in C)
    assert _dt.itemsize == TYPE_TRAITS[_t][2], (_t, _dt.itemsize)

# ---------------------------------------------------------------------------------
# fp16 / bf16 (ggml-impl.h, ggml.c)
# ---------------------------------------------------------------------------------


def fp16_to_fp32(h) -> np.ndarray:
    """ggml_compute_fp16_to_fp32 / ggml_fp16_to_fp32_row on an array of fp16 (bits or float16).

    The conversion is exact; the only thing to add to NumPy's cast is that ggml's
    bit-trick (and F16C's vcvtph2ps) return NaNs quiet: a signalling NaN comes back
    with the quiet bit (bit 22) set, NumPy keeps it signalling.
    """
    h = np.asarray(h)
    if h.dtype != np.float16:
        h = h.astype(np.uint16, copy=False).view(np.float16)
    f = h.astype(np.float32)  # a fresh array, safe to patch in place
    nan = np.isnan(f)
    if nan.any():
        f.view(np.uint32)[nan] |= np.uint32(0x00400000)
    return f


def fp32_to_fp16(x) -> np.ndarray:
    """ggml_compute_fp32_to_fp16 (GGML_FP32_TO_FP16 in ggml-base): float32 -> fp16 bits (uint16).

    Round to nearest even, overflow to inf, subnormals kept: identical to NumPy's cast
    except for NaN, which ggml collapses to a quiet NaN without payload (sign | 0x7E00).
    The CPU backend's F16C conversion treats NaN differently, see
    ggviz.ggml.cpu.quants.cpu_fp32_to_fp16.
    """
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        h = np.where(nan, (x.view(np.uint32) >> 16).astype(np.uint16) & np.uint16(0x8000) | np.uint16(0x7E00), h)
    return h


def bf16_to_fp32(b) -> np.ndarray:
    """ggml_compute_bf16_to_fp32: the bf16 bits are the top half of the float32 (exact)."""
    b = np.asarray(b)
    if b.dtype.names:  # a BLOCK_DTYPES[BF16] array
        b = b["bits"]
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def fp32_to_bf16(x) -> np.ndarray:
    """ggml_compute_fp32_to_bf16 / ggml_fp32_to_bf16_row_ref: float32 -> bf16 bits (uint16).

    Round to nearest even by adding 0x7fff + lsb before truncating; NaNs are truncated
    and forced quiet (bit 6 of the bf16) rather than rounded, which could turn them into inf.
    """
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    quiet = (u >> np.uint32(16)) | np.uint32(64)
    return np.where(nan, quiet, rounded).astype(np.uint16)


# ---------------------------------------------------------------------------------
# scalar helpers of ggml-quants.c, vectorised
# ---------------------------------------------------------------------------------


def nearest_int(fval) -> np.ndarray:
    """nearest_int(): round float32 to int by adding 1.5*2^23 and reading the mantissa bits.

    For |fval| < 2^22 this is round-half-to-even; done literally so that out-of-range
    inputs give the same garbage as in C.
    """
    v = np.asarray(fval, dtype=np.float32) + _F32(12582912.0)
    i = np.asarray(v).view(np.int32)
    return (i & np.int32(0x007FFFFF)) - np.int32(0x00400000)


def _roundf(v: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero) in float32; v - trunc(v) is exact so the test is too."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= _F32(0.5), np.sign(v), _F32(0)).astype(np.float32)


def _f2i(v: np.ndarray) -> np.ndarray:
    """A C float -> int conversion (truncation) as x86 does it: NaN/out of range -> INT_MIN."""
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(v) < _F32(2147483648.0))
        i = np.trunc(np.where(bad, _F32(0), v)).astype(np.int32)
    return np.where(bad, np.int32(-2147483648), i)


def _seqsum_from_first(a: np.ndarray) -> np.ndarray:
    """``float s = a[0]; for (i = 1...) s += a[i];`` over the last axis, in float32.

    Strictly left to right, unlike np.sum (pairwise).  Short axes (the 16/32 values
    of a group) are added column by column, which is several times faster than
    np.add.accumulate along a short contiguous axis; long ones use accumulate.
    """
    a = np.asarray(a, np.float32)
    n = a.shape[-1]
    if n > 64:
        return np.add.accumulate(a, axis=-1, dtype=np.float32)[..., -1]
    s = a[..., 0].copy()
    for i in range(1, n):
        np.add(s, a[..., i], out=s)
    return s


def _seqsum(a: np.ndarray) -> np.ndarray:
    """``float s = 0; for (i...) s += a[i];`` over the last axis, in float32.

    Same as starting from a[0], except that 0 + -0 is +0: adding +0 at the end
    reproduces that (it only matters when every term is -0).
    """
    return _seqsum_from_first(a) + _F32(0)


def _first_absmax(x: np.ndarray):
    """(amax, max) of ``if (fabsf(v) > amax) { amax = fabsf(v); max = v; }`` from amax = max = 0.

    argmax picks the first of equal values, like the strict comparison in C; NaNs never
    compare greater so they are skipped; a group of zeros (of either sign) keeps the
    initial +0.
    """
    ax = np.abs(x)
    ax = np.where(np.isnan(ax), _F32(0), ax)
    idx = np.argmax(ax, axis=-1)[..., None]
    amax = np.take_along_axis(ax, idx, -1)[..., 0]
    mx = np.take_along_axis(x, idx, -1)[..., 0]
    keep = amax > 0
    return np.where(keep, amax, _F32(0)), np.where(keep, mx, _F32(0))


def _first_extreme(x: np.ndarray, largest: bool, init=None) -> np.ndarray:
    """``m = init; for (i...) if (x[i] < m) m = x[i];`` (``>`` if largest), init = x[0] if None.

    The first of equal values wins (matters for -0 vs +0) and NaNs are skipped,
    except a NaN x[0] used as the start, which then sticks.
    """
    if largest:
        idx = np.argmax(np.where(np.isnan(x), -np.inf, x), axis=-1)
    else:
        idx = np.argmin(np.where(np.isnan(x), np.inf, x), axis=-1)
    v = np.take_along_axis(x, idx[..., None], -1)[..., 0]
    if init is None:
        return np.where(np.isnan(x[..., 0]), x[..., 0], v)
    init = _F32(init)
    better = (v > init) if largest else (v < init)
    return np.where(better, v, init)


def _first_min(x: np.ndarray, init=None) -> np.ndarray:
    return _first_extreme(x, False, init)


def _first_max(x: np.ndarray, init=None) -> np.ndarray:
    return _first_extreme(x, True, init)


def _c_max_seq(a: np.ndarray, init=0.0) -> np.ndarray:
    """``m = init; for (i...) m = MAX(m, a[i]);`` with ggml's MAX(a, b) = a > b ? a : b.

    Done element by element because the macro is not a true max with NaNs: a NaN
    replaces m, and the next element replaces the NaN.
    """
    m = np.full(a.shape[:-1], init, np.float32)
    for i in range(a.shape[-1]):
        m = np.where(m > a[..., i], m, a[..., i])
    return m


def _lf(l: np.ndarray) -> np.ndarray:
    # int quant levels are converted to float in C expressions; NumPy would promote
    # int32 * float32 to float64, so convert explicitly
    return l.astype(np.float32)


def make_qx_quants(x: np.ndarray, nmax: int, rmse_type: int, qw: np.ndarray | None = None):
    """make_qx_quants for groups x (G, n): returns (scale (G,), L (G, n) int32 in [0, 2*nmax)).

    Symmetric quantisation to [-nmax, nmax-1] searching 18 scales around nmax/max and
    keeping the one with the best weighted least-squares fit.
    """
    G, n = x.shape
    amax, mx = _first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F32(-nmax) / mx
        l = nearest_int(iscale[:, None] * x)
        if rmse_type == 0:
            L = nmax + np.maximum(-nmax, np.minimum(nmax - 1, l))
            scale = _F32(1) / iscale
        else:
            return_early = rmse_type < 0
            rmse_type = abs(rmse_type)
            if qw is not None:
                w = np.broadcast_to(np.asarray(qw, np.float32), x.shape)
            elif rmse_type == 1:
                w = x * x
            elif rmse_type == 2:
                w = np.ones_like(x)
            elif rmse_type == 3:
                w = np.abs(x)
            else:
                w = np.sqrt(np.abs(x))
            l = np.maximum(-nmax, np.minimum(nmax - 1, l))
            L = l + nmax
            lf = _lf(l)
            sumlx = _seqsum(w * x * lf)
            suml2 = _seqsum(w * lf * lf)
            scale = np.where(suml2 != 0, sumlx / suml2, _F32(0))
            if return_early:
                scale = np.where(suml2 > 0, _F32(0.5) * (scale + _F32(1) / iscale), _F32(1) / iscale)
            else:
                best = scale * sumlx
                for is_ in range(-9, 10):
                    if is_ == 0:
                        continue
                    iscale = -(_F32(nmax) + _F32(0.1) * _F32(is_)) / mx
                    l = np.maximum(-nmax, np.minimum(nmax - 1, nearest_int(iscale[:, None] * x)))
                    lf = _lf(l)
                    sumlx = _seqsum(w * x * lf)
                    suml2 = _seqsum(w * lf * lf)
                    better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
                    L = np.where(better[:, None], l + nmax, L)
                    scale = np.where(better, sumlx / suml2, scale)
                    best = np.where(better, scale * sumlx, best)
    L = np.where(zero[:, None], 0, L)
    scale = np.where(zero, _F32(0), scale).astype(np.float32)
    return scale, L.astype(np.int32)


def make_q3_quants(x: np.ndarray, nmax: int, do_rmse: bool):
    """make_q3_quants for groups x (G, n): (scale (G,), L (G, n) in [0, 2*nmax)).

    With do_rmse the levels are refined greedily, element by element, for up to five
    passes; a pass that changes nothing leaves the state unchanged, so running all
    five passes for every group gives the same result as C's early ``break``.
    """
    G, n = x.shape
    amax, mx = _first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F32(-nmax) / mx
        l = np.maximum(-nmax, np.minimum(nmax - 1, nearest_int(iscale[:, None] * x)))
        if do_rmse:
            w = x * x
            wx = w * x
            L = l.copy()
            sumlx = _seqsum(wx * _lf(L))
            suml2 = _seqsum(w * _lf(L) * _lf(L))
            for _itry in range(5):
                for i in range(n):
                    wi, xi, wxi = w[:, i], x[:, i], wx[:, i]
                    Li = _lf(L[:, i])
                    slx = sumlx - wxi * Li
                    sl2 = suml2 - wi * Li * Li
                    new_l = np.maximum(-nmax, np.minimum(nmax - 1, nearest_int(xi * sl2 / slx)))
                    nlf = _lf(new_l)
                    slx2 = slx + wxi * nlf
                    sl22 = sl2 + wi * nlf * nlf
                    ok = (slx > 0) & (new_l != L[:, i]) & (sl22 > 0) & \
                         (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                    L[:, i] = np.where(ok, new_l, L[:, i])
                    sumlx = np.where(ok, slx2, sumlx)
                    suml2 = np.where(ok, sl22, suml2)
            L = L + nmax
            scale = np.where(suml2 > 0, sumlx / suml2, _F32(0))
        else:
            L = l + nmax
            scale = _F32(1) / iscale
    L = np.where(zero[:, None], 0, L)
    scale = np.where(zero, _F32(0), scale).astype(np.float32)
    return scale, L.astype(np.int32)


def _make_qkx_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad, v3):
    """make_qkx2_quants (v3=False) / make_qkx3_quants (v3=True) for groups x (G, n).

    Asymmetric quantisation x ~ scale*L - the_min with L in [0, nmax]: starts from the
    min/max fit, then tries nstep+1 scales, each solved by weighted least squares for
    (scale, min), keeping the best by weighted |error| (use_mad) or squared error.
    Note that ``min`` is updated whenever a candidate wins and the following
    candidates are built from the updated min, exactly as in C.
    Returns (scale (G,), the_min (G,), L (G, n) int32).
    """
    G, n = x.shape
    w = weights if weights is not None else x * x
    mn = _first_min(x)
    mx = _first_max(x)
    sum_w = _seqsum_from_first(w)
    sum_x = _seqsum_from_first(w * x)
    mn = np.where(mn > 0, _F32(0), mn)
    degenerate = (mx <= mn) if v3 else (mx == mn)

    def err(scale, lf, mnv):
        diff = scale[:, None] * lf + mnv[:, None] - x
        diff = np.abs(diff) if use_mad else diff * diff
        return _seqsum(w * diff)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F32(nmax) / (mx - mn)
        scale = _F32(1) / iscale
        L = np.maximum(0, np.minimum(nmax, nearest_int(iscale[:, None] * (x - mn[:, None]))))
        best = err(scale, _lf(L), mn)
        if nstep >= 1:
            for is_ in range(nstep + 1):
                iscale = (_F32(rmin) + _F32(rdelta) * _F32(is_) + _F32(nmax)) / (mx - mn)
                laux = np.maximum(0, np.minimum(nmax, nearest_int(iscale[:, None] * (x - mn[:, None]))))
                lf = _lf(laux)
                wl = w * lf
                sum_l = _seqsum(wl)
                sum_l2 = _seqsum(wl * lf)
                sum_xl = _seqsum(wl * x)
                D = sum_w * sum_l2 - sum_l * sum_l
                this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
                this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
                pos = this_min > 0
                this_min = np.where(pos, _F32(0), this_min)
                this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
                cur = err(this_scale, lf, this_min)
                better = (D > 0) & (cur < best) & ~degenerate
                L = np.where(better[:, None], laux, L)
                best = np.where(better, cur, best)
                scale = np.where(better, this_scale, scale)
                mn = np.where(better, this_min, mn)
    L = np.where(degenerate[:, None], 0, L)
    scale = np.where(degenerate, _F32(0), scale).astype(np.float32)
    return scale, (-mn).astype(np.float32), L.astype(np.int32)


def make_qkx2_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad):
    return _make_qkx_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad, v3=False)


def make_qkx3_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad):
    return _make_qkx_quants(x, nmax, weights, rmin, rdelta, nstep, use_mad, v3=True)


def make_qp_quants(x: np.ndarray, nmax: int, quant_weights: np.ndarray):
    """make_qp_quants for groups x (G, n) of non-negative values (the K-quant scales).

    Returns (scale (G,), L (G, n) int32 in [0, nmax]).  L is uint8_t in C; the wrap of
    out-of-range values is reproduced.
    """
    G, n = x.shape
    qw = np.broadcast_to(np.asarray(quant_weights, np.float32), x.shape)
    mx = _c_max_seq(x)  # max = MAX(max, x[i]) from 0
    zero = mx < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F32(nmax) / mx
        L = nearest_int(iscale[:, None] * x) & 0xFF
        scale = _F32(1) / iscale
        diff = x - scale[:, None] * _lf(L)
        best_mse = _seqsum(qw * diff * diff)
        for is_ in range(-4, 5):
            if is_ == 0:
                continue
            iscale_is = (_F32(0.1) * _F32(is_) + _F32(nmax)) / mx
            scale_is = _F32(1) / iscale_is
            l = np.minimum(nmax, nearest_int(iscale_is[:, None] * x))
            diff = x - scale_is[:, None] * _lf(l)
            mse = _seqsum(qw * diff * diff)
            better = mse < best_mse
            best_mse = np.where(better, mse, best_mse)
            iscale = np.where(better, iscale_is, iscale)
        l = np.minimum(nmax, nearest_int(iscale[:, None] * x))
        L = l & 0xFF  # stored in uint8_t, but the sums use the int
        wx = qw * x
        sumlx = _seqsum(wx * _lf(l))
        suml2 = _seqsum(qw * _lf(l) * _lf(l))
        for _itry in range(5):
            for i in range(n):
                wi, xi, wxi = qw[:, i], x[:, i], wx[:, i]
                Li = _lf(L[:, i])
                slx = sumlx - wxi * Li
                sl2 = suml2 - wi * Li * Li
                new_l = np.minimum(nmax, nearest_int(xi * sl2 / slx))
                nlf = _lf(new_l)
                slx2 = slx + wxi * nlf
                sl22 = sl2 + wi * nlf * nlf
                ok = (slx > 0) & (sl2 > 0) & (new_l != L[:, i]) & \
                     (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                L[:, i] = np.where(ok, new_l & 0xFF, L[:, i])
                sumlx = np.where(ok, slx2, sumlx)
                suml2 = np.where(ok, sl22, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, _F32(0))
    L = np.where(zero[:, None], 0, L)
    scale = np.where(zero, _F32(0), scale).astype(np.float32)
    return scale, L.astype(np.int32)


# ---------------------------------------------------------------------------------
# bit packing shared by quantisation, dequantisation, the explorer and the CPU dots
# ---------------------------------------------------------------------------------


def _get_scale_min_k4(scales: np.ndarray):
    """get_scale_min_k4 for all 8 sub-blocks: scales (nb, 12) uint8 -> (sc, m) (nb, 8) int32.

    Sub-blocks 0-3 keep 6 bits in the low bits of bytes 0-3 (scale) and 4-7 (min);
    sub-blocks 4-7 keep their low 4 bits in bytes 8-11 and their top 2 bits in the top
    bits of bytes 0-3 / 4-7.
    """
    q = scales.astype(np.int32)
    sc_lo = q[:, 0:4] & 63
    m_lo = q[:, 4:8] & 63
    sc_hi = (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)
    m_hi = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return np.concatenate([sc_lo, sc_hi], 1), np.concatenate([m_lo, m_hi], 1)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Inverse of _get_scale_min_k4 for 6-bit ls, lm (nb, 8) -> scales (nb, 12) uint8."""
    ls = ls.astype(np.int32)
    lm = lm.astype(np.int32)
    out = np.empty((ls.shape[0], 12), np.int32)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return (out & 0xFF).astype(np.uint8)


def _q3k_scales(scales: np.ndarray) -> np.ndarray:
    """The 16 signed 6-bit scales of block_q3_K: (nb, 12) uint8 -> (nb, 16) int32 in [-32, 31].

    Scale j has its low 4 bits in byte j (j < 8, low nibble) or byte j-8 (high nibble)
    and its top 2 bits in byte 8 + j%4 at bit 2*(j/4); the value is stored +32.
    """
    q = scales.astype(np.int32)
    lo = np.concatenate([q[:, 0:8] & 0xF, q[:, 0:8] >> 4], 1)
    j = np.arange(16)
    hi = (q[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return (lo | (hi << 4)) - 32


def _pack_q3k_scales(l: np.ndarray) -> np.ndarray:
    """Inverse of _q3k_scales for l (nb, 16) in [0, 63] (already +32)."""
    l = l.astype(np.int32)
    out = np.zeros((l.shape[0], 12), np.int32)
    out[:, 0:8] = (l[:, 0:8] & 0xF) | ((l[:, 8:16] & 0xF) << 4)
    h = l >> 4
    for k in range(4):  # byte 8+k holds the top bits of scales k, k+4, k+8, k+12
        out[:, 8 + k] = h[:, k] | (h[:, k + 4] << 2) | (h[:, k + 8] << 4) | (h[:, k + 12] << 6)
    return (out & 0xFF).astype(np.uint8)


def _u8(a) -> np.ndarray:
    # structured-array fields are strided views; one contiguous copy makes the bit
    # twiddling below run at memory speed
    return np.ascontiguousarray(a, dtype=np.uint8)


def _unpack_2bit_256(qs: np.ndarray) -> np.ndarray:
    """qs (nb, 64) -> uint8 (nb, 256): element 128*h + 32*j + l is bits 2j..2j+1 of qs[32*h + l]."""
    q = _u8(qs).reshape(-1, 2, 32)
    out = np.empty((q.shape[0], 2, 4, 32), np.uint8)
    for j in range(4):
        np.bitwise_and(q >> np.uint8(2 * j), np.uint8(3), out=out[:, :, j])
    return out.reshape(-1, 256)


def _bits_256(b: np.ndarray) -> np.ndarray:
    """32 bytes (nb, 32) -> uint8 (nb, 256) bits, element 32*j + l being bit j of byte l.

    The layout of q3_K's hmask and q5_K's qh.
    """
    q = _u8(b)
    out = np.empty((q.shape[0], 8, 32), np.uint8)
    for j in range(8):
        np.bitwise_and(q >> np.uint8(j), np.uint8(1), out=out[:, j])
    return out.reshape(-1, 256)


def _pack_2bit_256(L: np.ndarray) -> np.ndarray:
    q = L.reshape(-1, 2, 4, 32).astype(np.int32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64).astype(np.uint8)


def _unpack_nibbles_256(qs: np.ndarray) -> np.ndarray:
    """qs (nb, 128) -> uint8 (nb, 256): 64-element chunk j is the low nibbles of
    qs[32j:32j+32] followed by their high nibbles."""
    q = _u8(qs).reshape(-1, 4, 32)
    out = np.empty((q.shape[0], 4, 2, 32), np.uint8)
    np.bitwise_and(q, np.uint8(0xF), out=out[:, :, 0])
    np.right_shift(q, np.uint8(4), out=out[:, :, 1])
    return out.reshape(-1, 256)


def _pack_nibbles_256(L: np.ndarray) -> np.ndarray:
    q = L.reshape(-1, 4, 2, 32).astype(np.int32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def _unpack_nibbles_32(qs: np.ndarray) -> np.ndarray:
    """qs (nb, 16) -> uint8 (nb, 32): element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of qs[j-16]."""
    q = _u8(qs)
    out = np.empty((q.shape[0], 2, 16), np.uint8)
    np.bitwise_and(q, np.uint8(0xF), out=out[:, 0])
    np.right_shift(q, np.uint8(4), out=out[:, 1])
    return out.reshape(-1, 32)


def _pack_nibbles_32(L: np.ndarray) -> np.ndarray:
    L = L.astype(np.int32)
    return ((L[:, :16] & 0xF) | ((L[:, 16:] & 0xF) << 4)).astype(np.uint8)


def _qh_bits_32(qh: np.ndarray) -> np.ndarray:
    """qh (nb, 4) bytes of a little-endian uint32 -> uint8 (nb, 32) bits; bit j is element j's 5th bit."""
    return np.unpackbits(_u8(qh), axis=1, bitorder="little")


def _pack_qh_32(L: np.ndarray) -> np.ndarray:
    return np.packbits((L >> 4) & 1, axis=1, bitorder="little").astype(np.uint8)


def _unpack_q6k(ql: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """block_q6_K quants, uint8 (nb, 256) in [0, 63] (subtract 32 for the signed value).

    Element 128*h + 32*k + l: low 4 bits from ql[64*h + 32*(k%2) + l] (low nibble for
    k < 2, high nibble for k >= 2), high 2 bits from qh[32*h + l] at bit 2*k.
    """
    ql = _u8(ql).reshape(-1, 2, 2, 32)  # (nb, h, k%2, l)
    qh = _u8(qh).reshape(-1, 2, 32)
    out = np.empty((ql.shape[0], 2, 4, 32), np.uint8)
    np.bitwise_and(ql, np.uint8(0xF), out=out[:, :, 0:2])
    np.right_shift(ql, np.uint8(4), out=out[:, :, 2:4])
    for k in range(4):
        out[:, :, k] |= ((qh >> np.uint8(2 * k)) & np.uint8(3)) << np.uint8(4)
    return out.reshape(-1, 256)


def _pack_q6k(L: np.ndarray):
    q = L.reshape(-1, 2, 4, 32).astype(np.int32)
    lo = q & 0xF
    ql = np.stack([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], 2)
    hi = q >> 4
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    return ql.reshape(-1, 128).astype(np.uint8), qh.reshape(-1, 64).astype(np.uint8)


# ---------------------------------------------------------------------------------
# views and unpacking
# ---------------------------------------------------------------------------------


def _as_bytes(raw) -> np.ndarray:
    raw = np.ascontiguousarray(np.asarray(raw))
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    return raw


def as_blocks(t: int, raw) -> np.ndarray:
    """View raw row bytes (..., nbytes) as an array (..., nblocks) of BLOCK_DTYPES[t] (no copy)."""
    _check_type(t)
    raw = _as_bytes(raw)
    ts = type_size(t)
    if raw.ndim == 0 or raw.shape[-1] % ts:
        raise ValueError(f"{type_name(t)}: last axis ({raw.shape[-1:]}) is not a multiple of {ts} bytes")
    return raw.view(BLOCK_DTYPES[t])


def unpack_blocks(t: int, blocks: np.ndarray) -> dict:
    """Decode a flat array (nb,) of BLOCK_DTYPES[t] into integer quants and float32 scales.

    Returns a dict whose ``q`` (nb, QK) int16 holds the *stored* quant levels
    (unsigned where the format is unsigned: q4_0 in [0, 15] represents q-8), plus the
    per-block scales as float32 (``d``, ``m``/``dmin``/``s``) and the integer
    sub-block scales (``sc``) and mins (``mn``) of the K-quants.  Shared by
    dequantisation, the block explorer and the CPU dot products.
    """
    b = blocks.reshape(-1)
    out: dict = {}
    if t in (GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
             GGML_TYPE_Q8_0, GGML_TYPE_Q8_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
             GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K):
        out["d"] = fp16_to_fp32(b["d"].view(np.uint16))
    if t in (GGML_TYPE_Q4_1, GGML_TYPE_Q5_1):
        out["m"] = fp16_to_fp32(b["m"].view(np.uint16))
    if t in (GGML_TYPE_Q2_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K):
        out["dmin"] = fp16_to_fp32(b["dmin"].view(np.uint16))

    if t in (GGML_TYPE_Q4_0, GGML_TYPE_Q4_1):
        q = _unpack_nibbles_32(b["qs"])
    elif t in (GGML_TYPE_Q5_0, GGML_TYPE_Q5_1):
        q = _unpack_nibbles_32(b["qs"])
        q |= _qh_bits_32(b["qh"]) << np.uint8(4)
    elif t in (GGML_TYPE_Q8_0, GGML_TYPE_Q8_1):
        q = b["qs"]
        if t == GGML_TYPE_Q8_1:
            out["s"] = fp16_to_fp32(b["s"].view(np.uint16))
    elif t == GGML_TYPE_Q2_K:
        sc = b["scales"].astype(np.int32)
        out["sc"], out["mn"] = sc & 0xF, sc >> 4
        q = _unpack_2bit_256(b["qs"])
    elif t == GGML_TYPE_Q3_K:
        out["sc"] = _q3k_scales(b["scales"])
        # high bit of element 32*j + l is bit j of hmask[l]; a *clear* bit subtracts 4
        hbit = _bits_256(b["hmask"])
        out["hbit"] = hbit
        q = _unpack_2bit_256(b["qs"]).astype(np.int16)
        q -= (np.int16(4) - (hbit.astype(np.int16) << 2))  # signed, in [-4, 3]
    elif t in (GGML_TYPE_Q4_K, GGML_TYPE_Q5_K):
        out["sc"], out["mn"] = _get_scale_min_k4(b["scales"])
        q = _unpack_nibbles_256(b["qs"])
        if t == GGML_TYPE_Q5_K:
            q |= _bits_256(b["qh"]) << np.uint8(4)  # the 5th bit of element 32*s + l is bit s of qh[l]
    elif t == GGML_TYPE_Q6_K:
        out["sc"] = b["scales"].astype(np.int32)
        q = _unpack_q6k(b["ql"], b["qh"])  # stored in [0, 63], value is q - 32
    elif t == GGML_TYPE_Q8_K:
        out["d"] = b["d"].astype(np.float32)
        q = b["qs"]
        out["bsums"] = b["bsums"].astype(np.int32)
    else:
        raise NotImplementedError(f"unpack_blocks: {type_name(t)}")
    out["q"] = q.astype(np.int16)
    return out


# ---------------------------------------------------------------------------------
# dequantisation (dequantize_row_*, ggml_fp16_to_fp32_row, ggml_bf16_to_fp32_row)
# ---------------------------------------------------------------------------------


def _dequant_blocks(t: int, blocks: np.ndarray) -> np.ndarray:
    """(nb,) blocks -> (nb, QK) float32, with the C expressions' exact float32 association."""
    u = unpack_blocks(t, blocks)
    q = u["q"]
    if t in (GGML_TYPE_Q4_0, GGML_TYPE_Q5_0):  # y = (q - 8|16) * d
        off = 8 if t == GGML_TYPE_Q4_0 else 16
        return _lf(q - off) * u["d"][:, None]
    if t in (GGML_TYPE_Q4_1, GGML_TYPE_Q5_1):  # y = q*d + m
        return _lf(q) * u["d"][:, None] + u["m"][:, None]
    if t in (GGML_TYPE_Q8_0, GGML_TYPE_Q8_K):  # y = q*d
        return _lf(q) * u["d"][:, None]
    if t == GGML_TYPE_Q8_1:  # no dequantize_row_q8_1 in ggml; the natural q*d
        return _lf(q) * u["d"][:, None]
    if t == GGML_TYPE_Q2_K:  # dl = d*sc, ml = dmin*m, y = dl*q - ml (per 16)
        dl = u["d"][:, None] * _lf(u["sc"])
        ml = u["dmin"][:, None] * _lf(u["mn"])
        y = dl[:, :, None] * _lf(q).reshape(-1, 16, 16) - ml[:, :, None]
        return y.reshape(-1, 256)
    if t == GGML_TYPE_Q3_K:  # dl = d*(sc-32); y = dl*q
        dl = u["d"][:, None] * _lf(u["sc"])
        return (dl[:, :, None] * _lf(q).reshape(-1, 16, 16)).reshape(-1, 256)
    if t in (GGML_TYPE_Q4_K, GGML_TYPE_Q5_K):  # d1 = d*sc, m1 = dmin*m, y = d1*q - m1 (per 32)
        d1 = u["d"][:, None] * _lf(u["sc"])
        m1 = u["dmin"][:, None] * _lf(u["mn"])
        y = d1[:, :, None] * _lf(q).reshape(-1, 8, 32) - m1[:, :, None]
        return y.reshape(-1, 256)
    if t == GGML_TYPE_Q6_K:  # y = d * sc * (q-32), i.e. (d*sc)*q
        ds = u["d"][:, None] * _lf(u["sc"])
        return (ds[:, :, None] * _lf(q - 32).reshape(-1, 16, 16)).reshape(-1, 256)
    raise NotImplementedError(f"dequantize: {type_name(t)}")


def dequantize_row(t: int, raw) -> np.ndarray:
    """to_float of type t (dequantize_row_* / fp16 / bf16): uint8 (..., nbytes) -> float32 (..., n).

    Any array is reinterpreted as its bytes along the last axis, so float16 arrays work
    for F16 and uint16 bit arrays for BF16.
    """
    _check_type(t)
    raw = _as_bytes(raw)
    lead = raw.shape[:-1]
    if t == GGML_TYPE_F32:
        return raw.view(np.float32).copy()
    if t == GGML_TYPE_F16:
        return fp16_to_fp32(raw.view(np.uint16))
    if t == GGML_TYPE_BF16:
        return bf16_to_fp32(raw.view(np.uint16))
    blocks = as_blocks(t, raw)
    nb = blocks.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN scales just propagate
        y = _dequant_blocks(t, blocks.reshape(-1))
    return y.astype(np.float32, copy=False).reshape(*lead, nb * blck_size(t))


# ---------------------------------------------------------------------------------
# reference quantisation (quantize_row_*_ref) and imatrix variants (quantize_row_*_impl)
# ---------------------------------------------------------------------------------


def _new_blocks(t: int, nb: int) -> np.ndarray:
    return np.zeros(nb, BLOCK_DTYPES[t])


def _set_half(blocks, field, v):
    blocks[field] = fp32_to_fp16(v).view(np.float16)


def _q_legacy_ref(t: int, x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_0/q4_1/q5_0/q5_1/q8_0/q8_1_ref on blocks x (nb, 32)."""
    nb = x.shape[0]
    y = _new_blocks(t, nb)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if t in (GGML_TYPE_Q4_0, GGML_TYPE_Q5_0):
            # d = max / -8 (or -16), max being the signed value of largest magnitude,
            # so that value maps exactly to level 0
            _, mx = _first_absmax(x)
            half = 8 if t == GGML_TYPE_Q4_0 else 16
            d = mx / _F32(-half)
            idv = np.where(d != 0, _F32(1) / d, _F32(0))
            # (int8_t)(x*id + 8.5f) truncates; MIN(15|31, .) clips the top
            xi = _f2i(x * idv[:, None] + _F32(half + 0.5)).astype(np.int8).astype(np.int32)
            L = np.minimum(2 * half - 1, xi) & 0xFF
            _set_half(y, "d", d)
        elif t in (GGML_TYPE_Q4_1, GGML_TYPE_Q5_1):
            mn = _first_min(x, init=np.finfo(np.float32).max)
            mx = _first_max(x, init=-np.finfo(np.float32).max)
            nmax = 15 if t == GGML_TYPE_Q4_1 else 31
            d = (mx - mn) / _F32(nmax)
            idv = np.where(d != 0, _F32(1) / d, _F32(0))
            v = (x - mn[:, None]) * idv[:, None] + _F32(0.5)
            if t == GGML_TYPE_Q4_1:
                L = np.minimum(15, _f2i(v).astype(np.int8).astype(np.int32)) & 0xFF
            else:
                L = _f2i(v) & 0xFF  # (uint8_t) cast, no clamp in q5_1_ref
            _set_half(y, "d", d)
            _set_half(y, "m", mn)
        else:  # Q8_0 / Q8_1: d = amax/127, q = roundf(x/d)
            amax = _c_max_seq(np.abs(x))  # amax = MAX(amax, fabsf(v))
            d = amax / _F32(127)
            idv = np.where(d != 0, _F32(1) / d, _F32(0))
            q = _f2i(_roundf(x * idv[:, None])).astype(np.int8)
            y["qs"] = q
            _set_half(y, "d", d)
            if t == GGML_TYPE_Q8_1:
                s = np.sum(q.astype(np.int32), axis=1)
                _set_half(y, "s", _lf(s) * d)
            return y
    if t in (GGML_TYPE_Q4_0, GGML_TYPE_Q4_1):
        # q4_0/q4_1_ref store xi0 | xi1 << 4 without masking (levels are <= 15 anyway)
        y["qs"] = ((L[:, :16] | (L[:, 16:] << 4)) & 0xFF).astype(np.uint8)
    else:
        y["qs"] = _pack_nibbles_32(L)
        y["qh"] = _pack_qh_32(L)
    return y


def _q_legacy_impl(t: int, x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """quantize_row_q4_0/q4_1/q5_0/q5_1_impl with an importance matrix; x is (rows, n)."""
    rows, n = x.shape
    sigma2 = _seqsum(x * x) / _F32(n)  # one sigma2 per row
    xb = x.reshape(rows, -1, 32)
    qwb = np.broadcast_to(np.asarray(qw, np.float32).reshape(1, -1, 32), xb.shape)
    weight = (qwb * np.sqrt(sigma2[:, None, None] + xb * xb)).reshape(-1, 32)
    xb = xb.reshape(-1, 32)
    y = _new_blocks(t, xb.shape[0])
    if t in (GGML_TYPE_Q4_0, GGML_TYPE_Q5_0):
        d, L = make_qx_quants(xb, 8 if t == GGML_TYPE_Q4_0 else 16, 1, weight)
        _set_half(y, "d", d)
    else:
        d, mn, L = make_qkx3_quants(xb, 15 if t == GGML_TYPE_Q4_1 else 31, weight, -0.9, 0.05, 36, False)
        _set_half(y, "d", d)
        _set_half(y, "m", -mn)
    y["qs"] = _pack_nibbles_32(L)
    if t in (GGML_TYPE_Q5_0, GGML_TYPE_Q5_1):
        y["qh"] = _pack_qh_32(L)
    return y


def _requant(x, d_eff, dm_eff, L, lo, hi, shift):
    """The final pass of the K-quants: L = clamp(nearest_int((x + dm)/d)) + shift where d != 0.

    Groups whose effective scale is 0 keep the levels found earlier (C ``continue``s).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        v = x if dm_eff is None else x + dm_eff[..., None]
        l = np.maximum(lo, np.minimum(hi, nearest_int(v / d_eff[..., None]))) + shift
    return np.where((d_eff != 0)[..., None], l, L)


def _q2_K(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    nb = x.shape[0]
    y = _new_blocks(GGML_TYPE_Q2_K, nb)
    xg = x.reshape(-1, 16)
    if qw is None:  # quantize_row_q2_K_ref
        scales, mins, L = make_qkx2_quants(xg, 3, np.abs(xg), -0.5, 0.1, 15, True)
        scales = scales.reshape(nb, 16)
        mins = mins.reshape(nb, 16)
        max_scale = np.max(np.fmax(scales, _F32(0)), axis=1)
        max_min = np.max(np.fmax(mins, _F32(0)), axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ls = nearest_int((_F32(15) / max_scale)[:, None] * scales)
            lm = nearest_int((_F32(15) / max_min)[:, None] * mins)
        ls = np.where((max_scale > 0)[:, None], ls, 0)
        lm = np.where((max_min > 0)[:, None], lm, 0)
        sc = ((ls & 0xFF) | (lm << 4)) & 0xFF  # uint8 stores of ints wrap
        d16 = fp32_to_fp16(np.where(max_scale > 0, max_scale / _F32(15), _F32(0)))
        m16 = fp32_to_fp16(np.where(max_min > 0, max_min / _F32(15), _F32(0)))
    else:  # quantize_row_q2_K_impl
        xb = x.reshape(nb, 256)
        sigma2 = _seqsum(xb * xb) / _F32(256)
        weight = (qw * np.sqrt(sigma2[:, None] + xb * xb)).reshape(-1, 16)
        sw = _seqsum(weight).reshape(nb, 16)
        scales, mins, L = make_qkx3_quants(xg, 3, weight, -0.9, 0.05, 36, False)
        dm, Ls = make_qp_quants(scales.reshape(nb, 16), 15, sw)
        mm, Lm = make_qp_quants(mins.reshape(nb, 16), 15, sw)
        sc = (Ls | (Lm << 4)) & 0xFF
        d16, m16 = fp32_to_fp16(dm), fp32_to_fp16(mm)
    y["d"] = d16.view(np.float16)
    y["dmin"] = m16.view(np.float16)
    y["scales"] = sc.astype(np.uint8)
    d_eff = fp16_to_fp32(d16)[:, None] * _lf(sc & 0xF)
    dm_eff = fp16_to_fp32(m16)[:, None] * _lf(sc >> 4)
    L = _requant(x.reshape(nb, 16, 16), d_eff, dm_eff, L.reshape(nb, 16, 16), 0, 3, 0)
    y["qs"] = _pack_2bit_256(L.reshape(nb, 256))
    return y


def _q3_K(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    nb = x.shape[0]
    y = _new_blocks(GGML_TYPE_Q3_K, nb)
    xg = x.reshape(-1, 16)
    if qw is None:  # quantize_row_q3_K_ref
        scales, L = make_q3_quants(xg, 4, True)
        scales = scales.reshape(nb, 16)
        _, max_scale = _first_absmax(scales)
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = _F32(-32) / max_scale
            l = nearest_int(iscale[:, None] * scales).astype(np.int8).astype(np.int32)  # int8_t l
        l = np.maximum(-32, np.minimum(31, l)) + 32
        has = max_scale != 0
        sc = np.where(has[:, None], _pack_q3k_scales(l), np.uint8(0))
        with np.errstate(divide="ignore"):
            d16 = fp32_to_fp16(np.where(has, _F32(1) / iscale, _F32(0)))
    else:  # quantize_row_q3_K_impl
        xb = x.reshape(nb, 256)
        sigma2 = _F32(2) * _seqsum(xb * xb) / _F32(256)
        weight = (qw * np.sqrt(sigma2[:, None] + xb * xb)).reshape(-1, 16)
        sw = _seqsum(weight).reshape(nb, 16)
        scales, L = make_qx_quants(xg, 4, 1, weight)
        d_block, Ls = make_qx_quants(scales.reshape(nb, 16), 32, 1, sw)
        sc = _pack_q3k_scales(Ls)
        d16 = fp32_to_fp16(d_block)
    y["scales"] = sc
    y["d"] = d16.view(np.float16)
    d_eff = fp16_to_fp32(d16)[:, None] * _lf(_q3k_scales(sc))
    L = _requant(x.reshape(nb, 16, 16), d_eff, None, L.reshape(nb, 16, 16), -4, 3, 4).reshape(nb, 256)
    # the high bit of the 3-bit level goes to hmask (bit j/32 of byte j%32), the rest to qs
    high = (L > 3).astype(np.uint8)
    y["hmask"] = np.packbits(high.reshape(nb, 8, 32).transpose(0, 2, 1), axis=2,
                             bitorder="little").reshape(nb, 32)
    y["qs"] = _pack_2bit_256(np.where(L > 3, L - 4, L))
    return y


def _q45_K(t: int, x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    nb = x.shape[0]
    nmax = 15 if t == GGML_TYPE_Q4_K else 31
    y = _new_blocks(t, nb)
    xg = x.reshape(-1, 32)
    if qw is None:  # quantize_row_q4_K_ref / q5_K_ref
        sum_x2 = _seqsum(xg * xg)
        av_x = np.sqrt(sum_x2 / _F32(32))
        weights = av_x[:, None] + np.abs(xg)
        if t == GGML_TYPE_Q4_K:
            scales, mins, L = make_qkx2_quants(xg, 15, weights, -1.0, 0.1, 20, False)
        else:
            scales, mins, L = make_qkx2_quants(xg, 31, weights, -0.5, 0.1, 15, False)
        scales = scales.reshape(nb, 8)
        mins = mins.reshape(nb, 8)
        max_scale = np.max(np.fmax(scales, _F32(0)), axis=1)
        max_min = np.max(np.fmax(mins, _F32(0)), axis=1)
        with np.errstate(divide="ignore"):
            inv_scale = np.where(max_scale > 0, _F32(63) / max_scale, _F32(0))
            inv_min = np.where(max_min > 0, _F32(63) / max_min, _F32(0))
        ls = np.minimum(63, nearest_int(inv_scale[:, None] * scales) & 0xFF)  # uint8_t, then MIN
        lm = np.minimum(63, nearest_int(inv_min[:, None] * mins) & 0xFF)
        d16 = fp32_to_fp16(max_scale / _F32(63))
        m16 = fp32_to_fp16(max_min / _F32(63))
    else:  # quantize_row_q4_K_impl / q5_K_impl
        xb = x.reshape(nb, 256)
        sigma2 = _F32(2) * _seqsum(xb * xb) / _F32(256)
        weights = (qw * np.sqrt(sigma2[:, None] + xb * xb)).reshape(-1, 32)
        sw = _seqsum(weights).reshape(nb, 8)
        scales, mins, L = make_qkx3_quants(xg, nmax, weights, -0.9, 0.05, 36, False)
        d_block, ls = make_qp_quants(scales.reshape(nb, 8), 63, sw)
        m_block, lm = make_qp_quants(mins.reshape(nb, 8), 63, sw)
        if t == GGML_TYPE_Q5_K:  # only the q5_K impl clamps again (a no-op: L <= nmax = 63)
            ls, lm = np.minimum(63, ls), np.minimum(63, lm)
        d16, m16 = fp32_to_fp16(d_block), fp32_to_fp16(m_block)
    sc = _pack_scale_min_k4(ls, lm)
    y["scales"] = sc
    y["d"] = d16.view(np.float16)
    y["dmin"] = m16.view(np.float16)
    s6, m6 = _get_scale_min_k4(sc)
    d_eff = fp16_to_fp32(d16)[:, None] * _lf(s6)
    dm_eff = fp16_to_fp32(m16)[:, None] * _lf(m6)
    L = _requant(x.reshape(nb, 8, 32), d_eff, dm_eff, L.reshape(nb, 8, 32), 0, nmax, 0).reshape(nb, 256)
    if t == GGML_TYPE_Q4_K:
        y["qs"] = _pack_nibbles_256(L)
    else:
        y["qs"] = _pack_nibbles_256(L & 0xF)
        # bit s of qh[l] is the 5th bit of element 32*s + l
        y["qh"] = np.packbits((L >> 4).reshape(nb, 8, 32).transpose(0, 2, 1).astype(np.uint8),
                              axis=2, bitorder="little").reshape(nb, 32)
    return y


def _q6_K(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    nb = x.shape[0]
    y = _new_blocks(GGML_TYPE_Q6_K, nb)
    xg = x.reshape(-1, 16)
    if qw is None:
        scales, L = make_qx_quants(xg, 32, 1, None)
    else:  # quantize_row_q6_K_impl passes the imatrix straight through as weights
        qwg = qw.reshape(-1, 16)
        scales, L = make_qx_quants(xg, 32, 1, qwg)
    scales = scales.reshape(nb, 16)
    max_abs, max_scale = _first_absmax(scales)
    zero = max_abs < GROUP_MAX_EPS  # such blocks are memset to 0 in C
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _F32(-128) / max_scale
        d16 = fp32_to_fp16(_F32(1) / iscale)
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)  # int -> int8_t
    d16 = np.where(zero, np.uint16(0), d16)
    sc = np.where(zero[:, None], np.int8(0), sc)
    y["d"] = d16.view(np.float16)
    y["scales"] = sc
    d_eff = fp16_to_fp32(d16)[:, None] * _lf(sc)
    L = _requant(x.reshape(nb, 16, 16), d_eff, None, L.reshape(nb, 16, 16), -32, 31, 32).reshape(nb, 256)
    ql, qh = _pack_q6k(L)
    y["ql"] = np.where(zero[:, None], np.uint8(0), ql)
    y["qh"] = np.where(zero[:, None], np.uint8(0), qh)
    return y


def _q8_K(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K_ref: d = max/-127 with max the signed extreme, q = nearest_int(x/d)."""
    nb = x.shape[0]
    y = _new_blocks(GGML_TYPE_Q8_K, nb)
    amax, mx = _first_absmax(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _F32(-127) / mx
        q = np.minimum(127, nearest_int(iscale[:, None] * x)).astype(np.int8)
        d = _F32(1) / iscale
    zero = amax == 0
    # C leaves bsums untouched for an all-zero block (they keep whatever the buffer held);
    # here the buffer is fresh, so they are 0
    q = np.where(zero[:, None], np.int8(0), q)
    y["qs"] = q
    y["bsums"] = np.where(zero[:, None], 0, q.astype(np.int32).reshape(nb, 16, 16).sum(-1)).astype(np.int16)
    y["d"] = np.where(zero, _F32(0), d)
    return y


# Rows are quantised in slices of about this many values: the searches of the K-quants
# make a few dozen temporaries the size of their input, and slices that fit in cache
# are both lighter on memory and faster than whole tensors.
_SLICE_VALUES = 1 << 16


def _quantize_blocks(t: int, x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """Quantise rows x (rows, n) -> (rows, nblocks) blocks; qw: imatrix (n,) or None."""
    rows, n = x.shape
    bs = blck_size(t)
    if n % bs:
        raise ValueError(f"{type_name(t)}: row length {n} is not a multiple of {bs}")
    if qw is not None:
        qw = np.asarray(qw, np.float32).reshape(-1)
        if qw.shape[0] != n:
            raise ValueError(f"imatrix has {qw.shape[0]} values, rows have {n}")
    out = np.empty((rows, n // bs), BLOCK_DTYPES[t])
    step = max(1, _SLICE_VALUES // n)
    for r0 in range(0, rows, step):
        out[r0:r0 + step] = _quantize_rows(t, x[r0:r0 + step], qw)
    return out


def _quantize_rows(t: int, x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    rows, n = x.shape
    bs = blck_size(t)
    xb = x.reshape(-1, bs)
    qwb = None
    if qw is not None:
        # the *_impl routines run row by row with the same imatrix: block i of a row
        # uses qw[bs*i : bs*(i+1)]
        qwb = np.broadcast_to(qw.reshape(1, -1, bs), (rows, n // bs, bs)).reshape(-1, bs)
    if t in (GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1):
        y = _q_legacy_ref(t, xb) if qw is None else _q_legacy_impl(t, x, qw)
    elif t in (GGML_TYPE_Q8_0, GGML_TYPE_Q8_1):
        y = _q_legacy_ref(t, xb)  # quantize_q8_0 ignores the imatrix
    elif t == GGML_TYPE_Q2_K:
        y = _q2_K(xb, qwb)
    elif t == GGML_TYPE_Q3_K:
        y = _q3_K(xb, qwb)
    elif t in (GGML_TYPE_Q4_K, GGML_TYPE_Q5_K):
        y = _q45_K(t, xb, qwb)
    elif t == GGML_TYPE_Q6_K:
        y = _q6_K(xb, qwb)
    elif t == GGML_TYPE_Q8_K:
        y = _q8_K(xb)
    else:
        raise NotImplementedError(f"quantize: {type_name(t)}")
    return y.reshape(rows, n // bs)


def quantize_row_ref(t: int, x, imatrix=None) -> np.ndarray:
    """quantize_row_<t>_ref (or, given an imatrix (n,), quantize_row_<t>_impl) on float32 (..., n).

    Returns uint8 (..., row_size(t, n)).  F32/F16/BF16 give the raw bytes of
    the values (fp16 via ggml_fp32_to_fp16_row, bf16 via ggml_fp32_to_bf16_row_ref).
    """
    _check_type(t)
    x = np.asarray(x, dtype=np.float32)
    lead, n = x.shape[:-1], x.shape[-1]
    x2 = np.ascontiguousarray(x.reshape(-1, n))
    if t == GGML_TYPE_F32:
        out = x2.view(np.uint8).copy()
    elif t == GGML_TYPE_F16:
        out = fp32_to_fp16(x2).view(np.uint8)
    elif t == GGML_TYPE_BF16:
        out = fp32_to_bf16(x2).view(np.uint8)
    else:
        out = _quantize_blocks(t, x2, imatrix).view(np.uint8)
    return out.reshape(*lead, row_size(t, n))


def quantize_chunk(t: int, src, start: int, nrows: int, n_per_row: int, imatrix=None, dst=None):
    """ggml_quantize_chunk: quantise rows [start/n_per_row, +nrows) of src into dst.

    src is read flat, from element ``start`` (a multiple of n_per_row and of the block
    size).  With dst given (any array, read as bytes) the rows are written at byte
    offset start_row*row_size as in C; without, a fresh uint8 array of exactly
    nrows*row_size bytes is returned.  Returns (bytes written, dst).

    Which C routine runs: the *_ref quantiser when imatrix is None, the *_impl one
    otherwise (Q8_0 ignores the imatrix); fp16 via ggml_fp32_to_fp16_row, bf16 via
    ggml_fp32_to_bf16_row_ref, f32 copied.
    """
    _check_type(t)
    if t in (GGML_TYPE_Q8_1, GGML_TYPE_Q8_K):
        raise NotImplementedError(f"ggml_quantize_chunk does not handle {type_name(t)}")
    if start % blck_size(t) or start % n_per_row:
        raise ValueError("start must be a multiple of the block size and of n_per_row")
    src = np.asarray(src, dtype=np.float32).reshape(-1)
    x = src[start:start + nrows * n_per_row].reshape(nrows, n_per_row)
    rs = row_size(t, n_per_row)
    q = quantize_row_ref(t, x, imatrix).reshape(-1)
    if dst is None:
        return q.size, q
    buf = dst.reshape(-1).view(np.uint8)
    off = (start // n_per_row) * rs
    buf[off:off + q.size] = q
    return q.size, dst


# ---------------------------------------------------------------------------------
# the block explorer
# ---------------------------------------------------------------------------------


def decode_block(t: int, raw) -> dict:
    """Decode the bytes of one block of type t for display.

    Returns the struct fields under their C names (``d`` etc. as Python floats,
    arrays as NumPy arrays of the stored integers), the decoded integer levels
    ``quants`` (signed where the format subtracts an offset), for the K-quants the
    effective sub-block ``sub_scales``/``sub_mins`` (integer) and their float values
    ``sub_d``/``sub_m``, and ``values``: the dequantised float32 values.
    """
    _check_type(t)
    raw = _as_bytes(raw).reshape(-1)
    ts = type_size(t)
    if raw.size != ts:
        raise ValueError(f"a {type_name(t)} block is {ts} bytes, got {raw.size}")
    b = raw.view(BLOCK_DTYPES[t])
    out: dict = {"type": type_name(t), "block_size": blck_size(t), "type_size": ts}
    if b.dtype.names is None:  # F32 / F16
        out["value"] = float(dequantize_row(t, raw)[0])
        out["values"] = dequantize_row(t, raw)
        return out
    for name in b.dtype.names:
        v = b[name][0]
        if name in ("d", "m", "s", "dmin"):
            v = float(fp16_to_fp32(np.asarray(v).view(np.uint16))) if b.dtype[name] == np.float16 else float(v)
        elif isinstance(v, np.ndarray):
            v = v.copy()
        else:
            v = v.item()
        out[name] = v
    if t == GGML_TYPE_BF16:
        out["values"] = dequantize_row(t, raw)
        return out
    u = unpack_blocks(t, b)
    q = u["q"][0]
    offs = {GGML_TYPE_Q4_0: 8, GGML_TYPE_Q5_0: 16, GGML_TYPE_Q6_K: 32}
    out["quants"] = q - offs.get(t, 0)
    if "sc" in u:
        out["sub_scales"] = u["sc"][0]
        out["sub_d"] = (u["d"][0] * _lf(u["sc"][0])).astype(np.float32)
    if "mn" in u:
        out["sub_mins"] = u["mn"][0]
        out["sub_m"] = (u["dmin"][0] * _lf(u["mn"][0])).astype(np.float32)
    out["values"] = _dequant_blocks(t, b)[0]
    return out
