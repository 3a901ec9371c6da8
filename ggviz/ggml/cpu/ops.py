"""ggml-cpu's ops.cpp: the forward kernels (all but MUL_MAT and the element-wise binary/unary ops), faithful to
ggml-cpu 0.20.2 on x86-64 AVX2+FMA+F16C.

Mirrors (ggml/src/ggml-cpu/):

* ops.cpp: ``ggml_compute_forward_dup`` (``dup_same_cont``, ``dup_bytes``, ``dup_flt``, ``dup_to_q``,
  ``dup_from_q``; CPY and CONT call it), ``add`` (``add_q_f32``), ``add1`` (f32, f16, bf16, q), ``sum_rows``,
  ``mean``, ``argmax``, ``argsort``, ``top_k`` (libstdc++'s sorts: ``libstdcxx.py``), ``repeat``, ``concat``,
  ``gelu``/``gelu_quick``/``gelu_erf``/``silu`` (f32, f16), ``norm``,
  ``rms_norm`` and ``rms_norm_mul_fused``, ``out_prod`` (f32, f16, q), ``scale``, ``get_rows`` (f32/i32, f16, bf16,
  q), ``set_rows``, ``soft_max`` (mask, ALiBi, sinks), ``rope`` (``ggml_rope_cache_init``, ``ggml_mrope_cache_init``,
  ``rope_yarn``, ``rotate_pairs``), the GLU family (``reglu``, ``geglu``, ``swiglu``, ``swiglu_oai``,
  ``geglu_erf``, ``geglu_quick``), ``im2col`` (f32, f16: the unrolling under ``ggml_conv_1d`` / ``ggml_conv_2d``);
* ggml.c: ``ggml_rope_yarn_corr_dims``.

Beside it: binary-ops.cpp is ``binary_ops.py``, unary-ops.cpp ``unary_ops.py``, vec.h / vec.cpp ``vec.py``, the
type conversions of common.h ``common.py``, and the glibc functions ggml's scalar code calls ``libm.py`` (ggviz's
own, shared with the compiled kernels). MUL_MAT is ``mul_mat.py`` (ggml-cpu.c).

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

import math

import numpy as np

from .. import consts as C
from .. import quants
from ..impl import GGML_ASSERT, GGMLError
from ..tensor import (
    Tensor,
    blck_size,
    get_op_params_f32,
    get_op_params_i32,
    is_contiguous,
    is_empty,
    is_quantized,
    nbytes,
    nelements,
    nrows,
    row_size,
    type_name,
    type_size,
)
from . import binary_ops, unary_ops
from . import quants as cpu_quants
from .quants import fma32        # libm's, compiled where the fast path is importable (the same bits)
from .common import (
    CACHE_LINE_SIZE_F32,
    FA_TILE_KV,
    FA_TILE_Q,
    ComputeParams,
    as_array,
    block_view,
    f16_to_f32,
    f32_to_bf16,
    f32_to_f16,
    f32_to_i32,
    flat_rows,
    from_f32,
    interleaved_rows,
    kernel,
    put_scratch,
    row_idx,
    rows_bytes,
    scratch,
    tensor_bytes,
    thread_range,
    to_f32,
)
from .libm import erff_vec, expf_vec, glibc_cosf, glibc_sinf, logf, powf
from .libstdcxx import partial_sort_positions, sort_positions
from .vec import (
    SQRT_2_INV,
    gelu_f32,
    gelu_quick_f32,
    gelu_quick_table_f16,
    gelu_table_f16,
    seq_sum_f64,
    silu_f32,
    vec_cvar_f32,
    vec_dot_f16_simd,
    vec_dot_f32_simd,
    tiled,
    vec_soft_max_f32,
    vec_sum_f32,
)

F32 = np.float32
F64 = np.float64

# quantized rows in and out of the kernels (type_traits[t].to_float / type_traits_cpu[t].from_float)

def dequantize(type_, raw):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    return np.asarray(quants.dequantize_row(type_, raw), F32).reshape(raw.shape[:-1] + (-1,))


def cpu_from_float(type_, x):
    """type_traits_cpu[type].from_float on rows of x (float32) -> dst bytes/elements."""
    if type_ == C.GGML_TYPE_F32:
        return np.asarray(x, F32)
    if type_ == C.GGML_TYPE_F16:
        return f32_to_f16(x)
    if type_ == C.GGML_TYPE_BF16:
        return f32_to_bf16(x)
    if type_ == C.GGML_TYPE_I32:
        return f32_to_i32(x)
    x = np.ascontiguousarray(x, F32)
    return np.asarray(cpu_quants.from_float(type_, x), np.uint8).reshape(x.shape[:-1] + (-1,))


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
    sv = block_view(src0) if convert is None else as_array(src0)
    vals = sv[:, :, ir0:ir1, :]
    i3 = np.arange(ne03).reshape(-1, 1, 1, 1)
    i2 = np.arange(ne02).reshape(1, -1, 1, 1)
    i1 = np.arange(ir0, ir1).reshape(1, 1, -1, 1)
    i0 = np.arange(nk00).reshape(1, 1, 1, -1)
    k = ((i3 * ne02 + i2) * ne01 + i1) * nk00 + i0
    ne0, ne1, ne2, ne3 = dst.shape
    nk0 = ne0 // blck_size(dst.type)
    if convert is None:
        dv = block_view(dst)
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
    GGML_ASSERT(is_contiguous(dst) and int(src0.nb[0]) == type_size(src0.type),
                "GGML_ASSERT(dup_to_q: not implemented) failed")
    ir0, ir1 = thread_range(ne01, params.ith, params.nth)
    if ir0 >= ir1:
        return
    rows = to_f32(as_array(src0)[:, :, ir0:ir1, :], src0.type)          # (ne03, ne02, n, ne00)
    q = cpu_from_float(dst.type, rows.reshape(-1, ne00))                 # one quantized row per src row
    rs = row_size(dst.type, ne00)
    r = ((np.arange(ne03).reshape(-1, 1, 1) * ne02 + np.arange(ne02).reshape(1, -1, 1)) * ne01
         + np.arange(ir0, ir1).reshape(1, 1, -1)).ravel()                 # flat src row index -> dst byte offset r*rs
    da, do = tensor_bytes(dst)
    idx = do + r[:, None] * rs + np.arange(rs)[None, :]
    da[idx] = q.reshape(len(r), rs)
    put_scratch(params, ne00, rows.reshape(-1, ne00)[-1])


def _dup_from_q(params, dst, src0):
    """ggml_compute_forward_dup_from_q: dequantize block by block into the f32 destination."""
    src1 = dst.src[1] if dst.src[1] is not None else dst
    qk = blck_size(src0.type)
    ne00, ne01, ne02, ne03 = src0.shape
    ne10, ne11, ne12, ne13 = src1.shape
    GGML_ASSERT(int(src1.nb[0]) == type_size(dst.type), "GGML_ASSERT(nb10 == ggml_type_size(dst->type)) failed")
    GGML_ASSERT(ne10 % qk == 0 or is_contiguous(dst), "GGML_ASSERT((ne10 % qk) == 0 || ggml_is_contiguous(dst)) failed")
    nr = nelements(src1) // qk
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    i = np.arange(ir0, ir1, dtype=np.int64) * qk
    x3 = i // (ne00 * ne01 * ne02)
    x2 = (i - x3 * ne00 * ne01 * ne02) // (ne00 * ne01)
    x1 = (i - x3 * ne00 * ne01 * ne02 - x2 * ne01 * ne00) // ne00
    x0 = i - x3 * ne00 * ne01 * ne02 - x2 * ne01 * ne00 - x1 * ne00
    blocks = block_view(src0)[x3, x2, x1, x0 // qk]
    vals = dequantize(src0.type, blocks.view(np.uint8).reshape(len(i), type_size(src0.type)))   # (n, qk)
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


@kernel
def forward_dup(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_dup (also CPY and CONT)."""
    src0 = dst.src[0]
    GGML_ASSERT(nelements(dst) == nelements(src0), "GGML_ASSERT(ggml_nelements(dst) == ggml_nelements(src0)) failed")
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
# ADD (add_q_f32 for a quantized src0), ADD1
# =====================================================================================================================

def _add_q_f32(params, dst):
    """ggml_compute_forward_add_q_f32: dequantize src0 row, += src1 row (same shape), from_float into dst."""
    src0, src1 = dst.src[0], dst.src[1]
    GGML_ASSERT(src0.shape == src1.shape == dst.shape, "GGML_ASSERT(same shapes) failed")
    GGML_ASSERT(src1.type == C.GGML_TYPE_F32, "GGML_ASSERT(src1->type == GGML_TYPE_F32) failed")
    ne00, ne01, ne02, ne03 = src0.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = row_idx(ir0, ir1, ne01, ne02)
    w = dequantize(src0.type, rows_bytes(src0)[i3, i2, i1]) + as_array(src1)[i3, i2, i1]
    _store_rows(dst, i3, i2, i1, cpu_from_float(dst.type, w))
    put_scratch(params, ne00, w[-1])


def _store_rows(t, i3, i2, i1, vals):
    """Write whole rows (element values, or quantized row bytes) at (i3, i2, i1)."""
    if is_quantized(t.type):
        rows_bytes(t)[i3, i2, i1] = vals
    else:
        as_array(t)[i3, i2, i1] = vals


@kernel
def forward_add(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_add: f32/f16/bf16 -> binary_ops' add_non_quantized; quantized src0 -> add_q_f32."""
    if is_quantized(dst.src[0].type):
        _add_q_f32(params, dst)
    else:
        binary_ops.forward_add_non_quantized(params, dst)


@kernel
def forward_add1(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_add1: z = x + v (v the scalar src1), rows split with dr."""
    src0, src1 = dst.src[0], dst.src[1]
    ne00, ne01, ne02, ne03 = src0.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = row_idx(ir0, ir1, ne01, ne02)
    v = to_f32(as_array(src1).reshape(-1)[:1], src1.type)[0]
    if is_quantized(src0.type):
        # add1_q_f32: dequantize, ggml_vec_acc1_f32, quantize back with the *src0* type's from_float.
        GGML_ASSERT(dst.type == src0.type and src1.type == C.GGML_TYPE_F32, "GGML_ASSERT(add1_q types) failed")
        w = dequantize(src0.type, rows_bytes(src0)[i3, i2, i1]) + v
        q = cpu_from_float(src0.type, w)
        # ggml writes the row at i1*nb1 + i2*nb2 + i3*nb0 (sic: nb0, not nb3) - reproduced
        nb = [int(x) for x in dst.nb]
        rb = row_size(dst.type, int(dst.ne[0]))
        da, do = tensor_bytes(dst)
        off = i1 * nb[1] + i2 * nb[2] + i3 * nb[0]
        da[(do + off[:, None] + np.arange(rb)[None, :]).ravel()] = q.reshape(-1)
        put_scratch(params, ne00, w[-1])
        return
    if src0.type not in _FLT_TYPES or src1.type not in (C.GGML_TYPE_F32, src0.type):
        raise NotImplementedError("add1: unsupported types")
    x = to_f32(as_array(src0)[i3, i2, i1], src0.type)
    as_array(dst)[i3, i2, i1] = from_f32(x + v, dst.type)


# =====================================================================================================================
# UNARY: the activations of ops.cpp (gelu, silu, ...); the rest is unary_ops.py
# =====================================================================================================================

def _rows_activation(params, dst, f32_fn, f16_fn):
    """The ops.cpp activation kernels (gelu/silu/...): rows split with dr; f32 rows or f16 rows."""
    src0 = dst.src[0]
    ne00, ne01, ne02, ne03 = src0.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = row_idx(ir0, ir1, ne01, ne02)
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


@kernel
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
    elif uop in unary_ops.UNARY_FNS:
        unary_ops.apply_unary_op(params, dst, unary_ops.UNARY_FNS[uop])
    else:
        raise NotImplementedError(f"unary op {uop} not implemented")





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


@kernel
def forward_glu(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_glu: rows (flat, ``i1*nb1``) split with dr; one src split in halves (swapped picks which
    half is the activation input) or two srcs."""
    src0, src1 = dst.src[0], dst.src[1]
    gop = get_op_params_i32(dst, 0)
    swapped = get_op_params_i32(dst, 1)
    if src1 is not None:
        GGML_ASSERT(src0.type == src1.type, "GGML_ASSERT(src0->type == src1->type) failed")
    nc = int(src0.ne[0]) if src1 is not None else int(src0.ne[0]) // 2
    nr = nrows(src0)
    GGML_ASSERT(int(dst.ne[0]) == nc and nrows(dst) == nr, "GGML_ASSERT(dst shape) failed")
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    a = flat_rows(src0, nr, int(src0.ne[0]))[ir0:ir1]
    if src1 is None:
        x = a[:, nc:2 * nc] if swapped else a[:, :nc]
        g = a[:, :nc] if swapped else a[:, nc:2 * nc]
    else:
        x, g = a, flat_rows(src1, nr, nc)[ir0:ir1]
    out = flat_rows(dst, nr, nc)
    if gop == C.GGML_GLU_OP_SWIGLU_OAI:
        GGML_ASSERT(src0.type == C.GGML_TYPE_F32, "GGML_ASSERT(swiglu_oai: f32 only) failed")
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


@kernel
def forward_scale(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_scale_f32: b == 0 -> memcpy + ggml_vec_scale_f32 (y *= s); else ggml_vec_mad1_f32
    (y = x*s + b, one FMA per element: _mm256_fmadd_ps in the 32-wide body, contracted in the tail)."""
    src0 = dst.src[0]
    GGML_ASSERT(src0.type == C.GGML_TYPE_F32, "GGML_ASSERT(scale: f32 only) failed")
    GGML_ASSERT(is_contiguous(src0) and is_contiguous(dst) and src0.shape == dst.shape,
                "GGML_ASSERT(contiguous, same shape) failed")
    s = F32(get_op_params_f32(dst, 0))
    b = F32(get_op_params_f32(dst, 1))
    nc, nr = int(src0.ne[0]), nrows(src0)
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    x = flat_rows(src0, nr, nc, F32)[ir0:ir1]
    out = flat_rows(dst, nr, nc, F32)
    if b == 0:
        out[ir0:ir1] = x * s
    else:
        out[ir0:ir1] = fma32(x, s, b)


# =====================================================================================================================
# reductions: SUM_ROWS MEAN ARGMAX
# =====================================================================================================================


@kernel
def forward_sum_rows(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_sum_rows_f32 (thread 0 only): ggml_vec_sum_f32 per row (double accumulator)."""
    if params.ith != 0:
        return
    src0 = dst.src[0]
    GGML_ASSERT(src0.type == C.GGML_TYPE_F32, "GGML_ASSERT(sum_rows: f32 only) failed")
    GGML_ASSERT(int(src0.nb[0]) == 4 and int(dst.nb[0]) == 4, "GGML_ASSERT(nb0 == sizeof(float)) failed")
    as_array(dst)[..., 0] = vec_sum_f32(as_array(src0))


@kernel
def forward_mean(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_mean_f32 (thread 0 only): ggml_vec_sum_f32, then ``/= (float) ne00``."""
    if params.ith != 0:
        return
    src0 = dst.src[0]
    GGML_ASSERT(src0.type == C.GGML_TYPE_F32, "GGML_ASSERT(mean: f32 only) failed")
    as_array(dst)[..., 0] = vec_sum_f32(as_array(src0)) / F32(int(src0.ne[0]))


@kernel
def forward_argmax(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_argmax_f32 (thread 0 only): ggml_vec_argmax_f32 keeps the *last* index where the running
    max equals the element, i.e. the last occurrence of the row maximum."""
    if params.ith != 0:
        return
    src0 = dst.src[0]
    GGML_ASSERT(src0.type == C.GGML_TYPE_F32, "GGML_ASSERT(argmax: f32 only) failed")
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
# ARGSORT TOP_K (the row interleave; libstdc++'s sorts: libstdcxx.py)
# =====================================================================================================================


def _sort_rows(op: str, dst: Tensor):
    """(src rows, dst rows) as ggml's sort kernels address them: row i of the flattened tensor at ``i*nb01`` (src,
    read as contiguous floats) and ``i*nb1`` (dst, int32)."""
    src0 = dst.src[0]
    if src0.type != C.GGML_TYPE_F32:
        raise GGMLError(f"{op}: ggml's CPU kernel sorts F32 rows only, src0 is {type_name(src0.type)}")
    GGML_ASSERT(int(dst.nb[0]) == 4, "GGML_ASSERT(nb0 == sizeof(float)) failed")
    nr, ne00 = nrows(src0), int(src0.ne[0])
    arr, off = tensor_bytes(src0)
    x = np.ndarray(shape=(nr, ne00), dtype=F32, buffer=arr, offset=off, strides=(int(src0.nb[1]), 4))
    return x, flat_rows(dst, nr, int(dst.ne[0]), np.int32)


@kernel
def forward_argsort(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_argsort_f32: thread ith takes rows ith, ith + nth, ...; each dst row is 0..ne0-1, then
    ``std::sort`` by the row's values (``<`` for GGML_SORT_ORDER_ASC, ``>`` for DESC). Equal values keep the order
    libstdc++'s introsort leaves, as in ggml."""
    x, d = _sort_rows("argsort", dst)
    order = get_op_params_i32(dst, 0)
    if order not in (C.GGML_SORT_ORDER_ASC, C.GGML_SORT_ORDER_DESC):
        raise GGMLError(f"argsort: invalid sort order {order} (op_params[0])")     # GGML_ABORT in ggml
    for i in range(params.ith, x.shape[0], params.nth):
        d[i] = sort_positions(-x[i] if order == C.GGML_SORT_ORDER_ASC else x[i])   # ASC: the same walk on -x


@kernel
def forward_top_k(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_top_k_f32: per row (the ith, ith + nth interleave), the positions 0..ne00-1 in this
    thread's int32 scratch (``wdata + (ne00 + CACHE_LINE_SIZE_F32)*ith``), ``std::partial_sort`` of its first top_k =
    ne0 by ``>``, those copied to dst, and then dst's first two swapped ("the order is not important")."""
    x, d = _sort_rows("top_k", dst)
    ne00, top_k = x.shape[1], int(dst.ne[0])
    tmp = scratch(params, ne00)
    if tmp is None:
        raise GGMLError(f"top_k: the work buffer holds {params.wsize} bytes, thread {params.ith} needs "
                        f"{(ne00 + CACHE_LINE_SIZE_F32) * params.ith * 4 + ne00 * 4} (ggml_graph_plan's size)")
    tmp = tmp.view(np.int32)
    for i in range(params.ith, x.shape[0], params.nth):
        tmp[:] = partial_sort_positions(x[i], top_k)
        d[i] = tmp[:top_k]
        if top_k > 1:
            d[i, 0], d[i, 1] = tmp[1], tmp[0]


# =====================================================================================================================
# REPEAT CONCAT
# =====================================================================================================================


@kernel
def forward_repeat(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_repeat_f32/_f16 (thread 0 only): tile src0 over dst (bit copies)."""
    if params.ith != 0:
        return
    src0 = dst.src[0]
    ts = type_size(src0.type)
    if src0.type not in (C.GGML_TYPE_F32, C.GGML_TYPE_I32, C.GGML_TYPE_F16, C.GGML_TYPE_BF16, C.GGML_TYPE_I16):
        raise NotImplementedError(f"repeat on {type_name(src0.type)}")
    GGML_ASSERT(int(dst.nb[0]) == ts and int(src0.nb[0]) == ts, "GGML_ASSERT(nb0 == nb00 == sizeof(type)) failed")
    bits = np.uint32 if ts == 4 else np.uint16
    reps = tuple(int(d) // int(s) for d, s in zip(dst.shape[::-1], src0.shape[::-1]))
    as_array(dst, bits)[...] = np.tile(as_array(src0, bits), reps)


@kernel
def forward_concat(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_concat: thread ith fills dst planes i2 = ith, ith+nth, ...; an element comes from src0
    when its index is inside src0 along ``dim``, else from src1 shifted by src0->ne[dim] (blocks for quantized)."""
    src0, src1 = dst.src[0], dst.src[1]
    dim = get_op_params_i32(dst, 0)
    GGML_ASSERT(0 <= dim < 4, "GGML_ASSERT(dim >= 0 && dim < 4) failed")
    ne2 = int(dst.ne[2])
    i2s = np.arange(params.ith, ne2, params.nth)
    if i2s.size == 0:
        return
    a, b, d = block_view(src0), block_view(src1), block_view(dst)
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


@kernel
def forward_norm(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_norm_f32: rows i01 = ith, ith+nth, ... of every (i02, i03).

    Contiguous rows: mean = (float)ggml_vec_sum_f32 / ne00; ggml_vec_cvar_f32 centres y and returns the variance
    (AVX2 8-lane partial sums added into a double); scale = 1.0f/sqrtf(variance + eps); ggml_vec_scale_f32.
    Strided rows: the scalar float loops of the else branch.
    """
    src0 = dst.src[0]
    GGML_ASSERT(src0.type == C.GGML_TYPE_F32, "GGML_ASSERT(norm: f32 only) failed")
    GGML_ASSERT(src0.shape == dst.shape, "GGML_ASSERT(ggml_are_same_shape(src0, dst)) failed")
    eps = F32(get_op_params_f32(dst, 0))
    GGML_ASSERT(eps >= 0, "GGML_ASSERT(eps >= 0.0f) failed")
    ne00, ne01, ne02, ne03 = src0.shape
    rows = interleaved_rows(ne01, ne02, ne03, params.ith, params.nth)
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
    GGML_ASSERT(src0.type == C.GGML_TYPE_F32, "GGML_ASSERT(rms_norm: f32 only) failed")
    GGML_ASSERT(int(src0.nb[0]) == 4, "GGML_ASSERT(src0->nb[0] == sizeof(float)) failed")
    eps = F32(get_op_params_f32(rms_node, 0))
    GGML_ASSERT(eps >= 0, "GGML_ASSERT(eps >= 0.0f) failed")
    ne00, ne01, ne02, ne03 = src0.shape
    rows = interleaved_rows(ne01, ne02, ne03, params.ith, params.nth)
    if rows is None:
        return None
    i3, i2, i1 = rows
    x = as_array(src0)[i3, i2, i1]
    # ggml_float sum += (ggml_float)(x*x): float square, double sequential sum; mean = (float)(sum/ne00)
    mean = (seq_sum_f64((x * x).astype(F64)) / ne00).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = F32(1) / np.sqrt(mean + eps)
    return i3, i2, i1, x, scale


@kernel
def forward_rms_norm(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_rms_norm_f32: rows i01 = ith, ith+nth, ...; scale = 1.0f/sqrtf(mean + eps);
    y = memcpy(x) then ggml_vec_scale_f32."""
    GGML_ASSERT(dst.src[0].shape == dst.shape, "GGML_ASSERT(ggml_are_same_shape(src0, dst)) failed")
    r = _rms_norm_rows(params, dst)
    if r is None:
        return
    i3, i2, i1, x, scale = r
    as_array(dst)[i3, i2, i1] = x * scale[:, None]


def can_fuse_rms_norm_mul(cgraph, i: int) -> Tensor | None:
    """ggml-cpu.c's fusion test (ggml_cpu_try_fuse_ops): ggml_can_fuse(RMS_NORM, MUL) plus the MUL's operand
    checks. Here, beside the fused kernel, because both executors need it: the faithful one (``ggml_cpu.py``) and the
    compiled one (``fast/compiler.py``), which ``ggml_cpu.py`` imports."""
    if i + 1 >= cgraph.n_nodes or cgraph.use_counts is None:
        return None
    node, mul_node = cgraph.nodes[i], cgraph.nodes[i + 1]
    # ggml_can_fuse_ext: ops match, both are computed, the first has exactly one use (ggml_node_has_n_uses:
    # and is neither a view nor an output), the second reads the first and has its shape
    if mul_node.op != C.GGML_OP_MUL:
        return None
    if not (node.flags & C.GGML_TENSOR_FLAG_COMPUTE) or not (mul_node.flags & C.GGML_TENSOR_FLAG_COMPUTE):
        return None
    if cgraph.use_count(node) != 1 or node.view_src is not None or (node.flags & C.GGML_TENSOR_FLAG_OUTPUT):
        return None
    a0, a1 = mul_node.src[0], mul_node.src[1]
    if not ((a0 is not None and a0.addr == node.addr) or (a1 is not None and a1.addr == node.addr)):
        return None
    if mul_node.shape != node.shape:
        return None
    w = a1 if (a0 is not None and a0.addr == node.addr) else a0
    if (node.src[0].type == C.GGML_TYPE_F32 and mul_node.type == C.GGML_TYPE_F32 and w.type == C.GGML_TYPE_F32
            and w.ne[0] == node.ne[0] and w.nb[0] == 4):
        return mul_node
    return None


def forward_rms_norm_mul_fused(params: ComputeParams, rms_node: Tensor, mul_node: Tensor):
    """ggml_compute_forward_rms_norm_mul_fused: ``y[i] = x[i] * scale * w[i]`` written straight into the MUL node;
    w is the MUL's other operand, broadcast by (i01 % ne11, i02 % ne12, i03 % ne13). The RMS_NORM node's own
    buffer is never written (as in ggml)."""
    GGML_ASSERT(mul_node is not None, "GGML_ASSERT(dst_mul != nullptr) failed")
    a0, a1 = mul_node.src[0], mul_node.src[1]
    GGML_ASSERT((a0 is not None and a0.addr == rms_node.addr) or (a1 is not None and a1.addr == rms_node.addr),
                "GGML_ASSERT(dst_mul->src[0] == dst_rms_norm || dst_mul->src[1] == dst_rms_norm) failed")
    if is_empty(mul_node):
        return
    w_t = a1 if (a0 is not None and a0.addr == rms_node.addr) else a0
    GGML_ASSERT(rms_node.src[0].shape == mul_node.shape, "GGML_ASSERT(ggml_are_same_shape(src0, dst)) failed")
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


@kernel
def forward_soft_max(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_soft_max_f32: rows i01 = ith, ith+nth, ... of every (i02, i03).

    wp = x*scale (+ slope*mask, one FMA per element as gcc contracts ``wp[i] += slope*m[i]``) in the thread's
    scratch row; max (with the sink, if any); ggml_vec_soft_max_f32 (AVX2 ggml_v_expf blocks + libm tail, double
    sum); sum += expf(sink - max); dp *= (float)(1.0/sum).
    """
    src0, src1, src2 = dst.src[0], dst.src[1], dst.src[2]
    GGML_ASSERT(src0.type == C.GGML_TYPE_F32, "GGML_ASSERT(soft_max: f32 only) failed")
    scale = F32(get_op_params_f32(dst, 0))
    max_bias = F32(get_op_params_f32(dst, 1))
    ne00, ne01, ne02, ne03 = src0.shape
    rows = interleaved_rows(ne01, ne02, ne03, params.ith, params.nth)
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
    put_scratch(params, ne00, wp[-1])


# =====================================================================================================================
# FLASH_ATTN_EXT
# =====================================================================================================================
#
# ggml_compute_forward_flash_attn_ext_f16 picks one of three kernels per node:
#   * split-KV (one query row, n_kv >= 512, K/V F16 or F32): the KV cells are cut into one chunk per thread; every
#     thread runs the one-chunk kernel on its cells for every head and leaves (M, S, VKQ) partials in wdata; after a
#     barrier each thread merges the partials of heads ith, ith+nth, ...;
#   * tiled (>= GGML_FA_TILE_Q query rows, K/V F16 or F32): 64 query rows x 64 KV cells at a time, K and V widened
#     to float, K·Q and softmax·V as simd_gemm (sequential FMA chains), the softmax of a tile with ggml_v_expf;
#   * one-chunk (everything else, e.g. a decode step): per query row, Q rounded to K's vec_dot_type, one
#     ggml_vec_dot_f16 per KV cell, the online softmax with an F16 VKQ accumulator (ggml_vec_mad_f16 /
#     ggml_vec_scale_f16: float math, rounded to fp16 after every step).
# A query row's result depends only on the kernel, never on the chunk or tile it was computed in (every row's
# arithmetic is its own), except in the split-KV kernel, whose merge depends on the number of threads.

# The one-chunk kernel's ``S = S*ms + vs``: gcc contracts it into one FMA in llama-cpp-python 0.3.36's AVX2 build
# (measured: SmolLM2's decode logits equal llama.cpp's only so, tests/test_flash_attn_llamacpp.py), while
# libggml-python 0.20.2's build keeps a product and an add (its differential test sets this False).
FA_S_FMA = True
# The split-KV merge's ``VKQ_final[d]*scale_old + VKQ_chunk[d]*scale_new``: 0 = two products and an add, 1 = the first
# product fused, 2 = the second fused. 1 as libggml-python 0.20.2 computes it; llama.cpp's build not yet measured
# (it runs only over >= 512 KV cells).
FA_REDUCE_FMA = 1


def _fa_setup(dst):
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    GGML_ASSERT(int(dst.ne[0]) == int(v.ne[0]) and int(dst.ne[2]) == int(q.ne[1]),
                "GGML_ASSERT(ne0 == DV && ne2 == N) failed")
    GGML_ASSERT(int(q.nb[0]) == type_size(q.type) and int(k.nb[0]) == type_size(k.type)
                and int(v.nb[0]) == type_size(v.type), "flash_attn_ext: input rows must be contiguous")
    GGML_ASSERT(int(q.ne[0]) == int(k.ne[0]), "GGML_ASSERT(neq0 == DK) failed")
    GGML_ASSERT(int(dst.nb[0]) == 4 and dst.nb[0] <= dst.nb[1] <= dst.nb[2] <= dst.nb[3],
                "flash_attn_ext: dst cannot be transposed or permuted")
    GGML_ASSERT(q.type == C.GGML_TYPE_F32, "flash_attn_ext: ggviz's kernel takes F32 Q")
    GGML_ASSERT(k.type in (C.GGML_TYPE_F16, C.GGML_TYPE_F32) and v.type in (C.GGML_TYPE_F16, C.GGML_TYPE_F32),
                f"flash_attn_ext: ggviz's kernel takes F16 or F32 K/V, got {type_name(k.type)}/{type_name(v.type)}")
    scale = F32(get_op_params_f32(dst, 0))
    max_bias = F32(get_op_params_f32(dst, 1))
    softcap = F32(get_op_params_f32(dst, 2))
    if softcap != 0:
        scale = F32(scale / softcap)
    return q, k, v, scale, max_bias, softcap


def _fa_head(dst, iq3: int, iq2: int, i1):
    """Q rows i1 of head (iq2, iq3), K and V of its KV head (GQA: iq2 / (neq2/nek2)) as float32, and the mask rows
    times the head's ALiBi slope (float32, -inf where masked; 0 without a mask)."""
    q, k, v, mask = dst.src[0], dst.src[1], dst.src[2], dst.src[3]
    ik2, ik3 = iq2 // (int(q.ne[2]) // int(k.ne[2])), iq3 // (int(q.ne[3]) // int(k.ne[3]))
    iv2, iv3 = iq2 // (int(q.ne[2]) // int(v.ne[2])), iq3 // (int(q.ne[3]) // int(v.ne[3]))
    qr = as_array(q)[iq3, iq2, i1]
    kr = as_array(k)[ik3, ik2].astype(F32)
    vr = as_array(v)[iv3, iv2].astype(F32)
    slope = alibi_slopes(int(q.ne[2]), get_op_params_f32(dst, 1), [iq2])[0]
    if mask is not None:
        m = as_array(mask)[iq3 % int(mask.ne[3]), iq2 % int(mask.ne[2])][i1, :int(k.ne[1])].astype(F32)
        mv = slope * m if slope != 1 else m
    else:
        mv = np.zeros((len(i1), int(k.ne[1])), F32)
    return qr, kr, vr, mv


def _softcap(s, softcap):
    # tanhf: float64 tanh rounded to float (not glibc's tanhf bit for bit; no model ggviz runs has a softcap)
    return (softcap * np.tanh(s.astype(F64)).astype(F32)).astype(F32)


def _fa_one_chunk(dst, iq3: int, iq2: int, i1, ic0: int, ic1: int):
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for query rows i1 of one head over KV cells [ic0, ic1):
    returns (M, S, VKQ32) before the division by S (and before the sinks)."""
    q, k, v, scale, max_bias, softcap = _fa_setup(dst)
    qr, kr, vr, mv = _fa_head(dst, iq3, iq2, i1)
    n = len(i1)
    DV = int(v.ne[0])
    s_all = fa_scores(kr[ic0:ic1], qr, k.type == C.GGML_TYPE_F16, scale, softcap, mv[:, ic0:ic1])
    M = np.full(n, -np.inf, F32)
    S = np.zeros(n, F32)
    f16_acc = v.type == C.GGML_TYPE_F16
    acc = np.zeros((n, DV), np.float16 if f16_acc else F32)
    live = np.flatnonzero(np.any(mv[:, ic0:ic1] != -np.inf, axis=0))
    for j in live:
        fa_online_step(M, S, acc, s_all[:, j], vr[ic0 + j], mv[:, ic0 + j] != -np.inf)
    return M, S, acc.astype(F32)


def fa_scores(kr, qr, k_f16: bool, scale, softcap, mv):
    """The one-chunk kernel's scores of query rows ``qr`` (n, DK) against KV cells ``kr`` (n_kv, DK, float32):
    Q converted to K's vec_dot_type (F16: vcvtps2ph, round to nearest even), one vec_dot per KV cell, times
    ``scale``, the softcap, plus the mask rows ``mv`` (n, n_kv). Returns (n, n_kv) float32."""
    if k_f16:
        s_all = tiled(vec_dot_f16_simd, kr, f32_to_f16(qr).astype(F32))
    else:
        s_all = tiled(vec_dot_f32_simd, kr, qr)
    with np.errstate(over="ignore", invalid="ignore"):
        s_all = s_all * scale
        if softcap != 0:
            s_all = _softcap(s_all, softcap)
        return s_all + mv


def fa_online_step(M, S, acc, sc, v_row, act):
    """One KV cell of the one-chunk kernel's online softmax, for the rows ``act`` (bool, n) whose mask lets the cell
    in: M (running max), S (running sum) and acc (the VKQ accumulator, float16 for F16 V, float32 otherwise) are
    updated in place from the cell's scores ``sc`` (n,) and V row ``v_row`` (DV,). Returns (ms, vs): the rescale
    expf(Mold - M) and the cell's weight expf(s - M) (1 where not computed, as in the C code)."""
    n = len(M)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        new = act & (sc > M)
        old = act & ~new
        ms = np.ones(n, F32)
        vs = np.ones(n, F32)
        if new.any():
            ms[new] = expf_vec(M[new] - sc[new])
            M[new] = sc[new]
            # ggml_vec_scale_f16 / _f32: V = V*expf(Mold - M)
            acc[new] = (acc[new].astype(F32) * ms[new, None]).astype(acc.dtype)
        if old.any():
            vs[old] = expf_vec(sc[old] - M[old])
        # ggml_vec_mad_f16 / _f32: V += v*vs, one FMA per lane (F16: widened, fused, rounded back to fp16)
        a = acc[act].astype(F32)
        acc[act] = fma32(v_row[None, :], vs[act, None], a).astype(acc.dtype)
        S[act] = fma32(S[act], ms[act], vs[act]) if FA_S_FMA else S[act] * ms[act] + vs[act]
    return ms, vs


def _fa_finish(dst, iq2: int, M, S, vkq, sinks: bool):
    """The sinks (first KV chunk only), then V /= S (ggml_vec_scale_f32 by 1/S, 0 when S == 0)."""
    sk = dst.src[4]
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        if sinks and sk is not None:
            s = F32(as_array(sk).reshape(-1)[iq2])
            up = s > M
            ms = np.where(up, expf_vec(M - s), F32(1)).astype(F32)
            vs = np.where(up, F32(1), expf_vec(s - M)).astype(F32)
            vkq = np.where(up[:, None], vkq * ms[:, None], vkq).astype(F32)
            S = (fma32(S, ms, vs) if FA_S_FMA else S * ms + vs).astype(F32)
    return fa_divide(S, vkq)


def fa_divide(S, vkq):
    """The kernel's last step: VKQ (float32, n x DV) scaled by 1/S (ggml_vec_scale_f32; 0 where S == 0)."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        s_inv = np.where(S == 0, F32(0), F32(1) / np.where(S == 0, F32(1), S)).astype(F32)
    return (vkq * s_inv[:, None]).astype(F32)


def _fa_tiled(dst, iq3: int, iq2: int, i1):
    """ggml_compute_forward_flash_attn_ext_tiled for query rows i1 of one head (a row's bits do not depend on the
    tile it shares with other rows: skipping a KV tile whose cells are all masked for every row of the tile is the
    same as skipping it row by row)."""
    q, k, v, scale, max_bias, softcap = _fa_setup(dst)
    qr, kr, vr, mv = _fa_head(dst, iq3, iq2, i1)
    n, nek1 = len(i1), int(k.ne[1])
    DK, DV, T = int(k.ne[0]), int(v.ne[0]), FA_TILE_KV
    M = np.full(n, -np.inf, F32)
    S = np.zeros(n, F32)
    vkq = np.zeros((n, DV), F32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for ic in range(0, nek1, T):
            kv = min(T, nek1 - ic)
            m = np.full((n, T), -np.inf, F32)
            m[:, :kv] = mv[:, ic:ic + kv]
            if dst.src[3] is not None and not np.any(m != -np.inf):
                continue
            kt = np.zeros((T, DK), F32)
            kt[:kv] = kr[ic:ic + kv]
            # simd_gemm: KQ[q, c] = fma chain over dk in order, from 0 (the memset KQ)
            kq = np.zeros((n, T), F32)
            for d in range(DK):
                kq = fma32(kt[None, :, d], qr[:, d, None], kq)
            kq = kq * scale
            if softcap != 0:
                kq = _softcap(kq, softcap)
            kq[:, kv:] = -np.inf
            if dst.src[3] is not None:
                kq = kq + m
            tmax = np.max(kq, axis=1)
            live = tmax != -np.inf
            mnew = np.maximum(M, tmax)
            up = live & (mnew > M)
            if up.any():
                ms = expf_vec(M[up] - mnew[up])
                vkq[up] = vkq[up] * ms[:, None]
                S[up] = S[up] * ms
            M = np.where(live, mnew, M).astype(F32)
            # ggml_vec_soft_max_f32 over the 64 cells (8-lane ggml_v_expf blocks, double sum), added to float S
            y, ssum = vec_soft_max_f32(kq, M)
            S = np.where(live, (S.astype(F64) + ssum).astype(F32), S).astype(F32)
            y[~live] = 0
            vt = np.zeros((T, DV), F32)
            vt[:kv] = vr[ic:ic + kv]
            # simd_gemm: VKQ[q, d] += softmax[q, c] * V[c, d], an fma chain over c in order
            for c in range(T):
                vkq = fma32(vt[None, c, :], y[:, c, None], vkq)
    return M, S, vkq


def _fa_split_kv(params, dst):
    """The split-KV decode kernel: KV chunk ith for every head into wdata's partials, a barrier, then the merge of
    heads ith, ith+nth, ... (ggml_flash_attn_ext_reduce_partials)."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    ith, nth = params.ith, params.nth
    DK, DV, nek1, neq2 = int(k.ne[0]), int(v.ne[0]), int(k.ne[1]), int(q.ne[2])
    chunk = (nek1 + nth - 1) // nth
    base = nth * (DK + 2 * DV + CACHE_LINE_SIZE_F32)
    psize = 2 + DV
    w = params.wdata.view(F32)
    parts = w[base:base + neq2 * nth * psize].reshape(neq2, nth, psize)
    ic0, ic1 = ith * chunk, min(ith * chunk + chunk, nek1)
    i1 = np.zeros(1, np.int64)
    for h in range(neq2):
        if ic0 < nek1:
            M, S, vkq = _fa_one_chunk(dst, 0, h, i1, ic0, ic1)
            if ic0 == 0 and dst.src[4] is not None:
                M, S, vkq = _fa_sinks_partial(dst, h, M, S, vkq)
            parts[h, ith, 0], parts[h, ith, 1], parts[h, ith, 2:] = M[0], S[0], vkq[0]
        else:
            parts[h, ith, 0], parts[h, ith, 1] = -np.inf, 0.0
    params.barrier()
    out = as_array(dst)
    for h in range(ith, neq2, nth):
        Mf, Sf = F32(-np.inf), F32(0)
        acc = np.zeros(DV, F32)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            for c in range(nth):
                if c * chunk >= nek1:
                    continue
                Mc, Sc, vc = F32(parts[h, c, 0]), F32(parts[h, c, 1]), parts[h, c, 2:].astype(F32)
                if Sc == 0:
                    continue
                Mn = F32(max(Mf, Mc))
                so, sn = expf_vec(F32(Mf - Mn)), expf_vec(F32(Mc - Mn))
                acc = _fa_merge(acc, so, vc, sn)
                Sf = F32(_fa_merge(np.atleast_1d(Sf), so, np.atleast_1d(Sc), sn)[0])
                Mf = Mn
            if Sf != 0:
                acc = (acc * (F32(1) / Sf)).astype(F32)
        out[0, 0, h] = acc


def _fa_merge(a, sa, b, sb):
    sa, sb = F32(sa), F32(sb)
    if FA_REDUCE_FMA == 1:
        return fma32(a, sa, (b * sb).astype(F32))
    if FA_REDUCE_FMA == 2:
        return fma32(b, sb, (a * sa).astype(F32))
    return ((a * sa).astype(F32) + (b * sb).astype(F32)).astype(F32)


def _fa_sinks_partial(dst, h, M, S, vkq):
    s = F32(as_array(dst.src[4]).reshape(-1)[h])
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        up = s > M
        ms = np.where(up, expf_vec(M - s), F32(1)).astype(F32)
        vs = np.where(up, F32(1), expf_vec(s - M)).astype(F32)
        vkq = np.where(up[:, None], vkq * ms[:, None], vkq).astype(F32)
        M = np.where(up, s, M).astype(F32)
        S = (fma32(S, ms, vs) if FA_S_FMA else S * ms + vs).astype(F32)
    return M, S, vkq


def fa_kernel(dst, nth: int = 1, use_ref: bool = False) -> str:
    """Which of the three kernels ggml_compute_forward_flash_attn_ext_f16 runs for this node."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    kv_ok = k.type in (C.GGML_TYPE_F32, C.GGML_TYPE_F16) and k.type == v.type and q.type == C.GGML_TYPE_F32
    if not use_ref and int(q.ne[1]) == 1 and int(q.ne[3]) == 1 and kv_ok and int(k.ne[1]) >= 512:
        return "split_kv"
    if not use_ref and kv_ok and int(q.ne[1]) >= FA_TILE_Q:
        return "tiled"
    return "one_chunk"


@kernel
def forward_flash_attn_ext(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_flash_attn_ext: precision DEFAULT or F32 (F32 accumulators either way), then
    ggml_compute_forward_flash_attn_ext_f16's choice of kernel and its split of the query rows into chunks
    (4 per thread, claimed from the pool's counter)."""
    prec = get_op_params_i32(dst, 3)
    GGML_ASSERT(prec in (C.GGML_PREC_DEFAULT, C.GGML_PREC_F32),
                f"flash_attn_ext: GGML_ABORT: precision {prec} (only GGML_PREC_DEFAULT / GGML_PREC_F32)")
    _fa_setup(dst)
    ith, nth = params.ith, params.nth
    which = fa_kernel(dst, nth, getattr(params, "use_ref", False))
    if which == "split_kv":
        _fa_split_kv(params, dst)
        return
    q = dst.src[0]
    neq1, neq2, neq3 = int(q.ne[1]), int(q.ne[2]), int(q.ne[3])
    nr = neq1 * neq2 * neq3
    nth4 = nth * 4
    chunk_size = (nr + nth4 - 1) // nth4
    nchunk = (nr + chunk_size - 1) // chunk_size
    if nth == 1 or nchunk < nth:
        nchunk = nth
    tp = params.threadpool
    if ith == 0 and tp is not None:
        tp.chunk_set(nth)
    params.barrier()
    dr = (nr + nchunk - 1) // nchunk
    out = as_array(dst)
    current = ith
    while current < nchunk:
        ir0, ir1 = dr * current, min(dr * current + dr, nr)
        if ir0 < ir1:
            i3, i2, i1 = row_idx(ir0, ir1, neq1, neq2)
            for h3, h2 in sorted(set(zip(i3.tolist(), i2.tolist()))):
                rows = i1[(i3 == h3) & (i2 == h2)]
                if which == "tiled":
                    M, S, vkq = _fa_tiled(dst, h3, h2, rows)
                else:
                    M, S, vkq = _fa_one_chunk(dst, h3, h2, rows, 0, int(dst.src[1].ne[1]))
                out[h3, rows, h2] = _fa_finish(dst, h2, M, S, vkq, True)
        current = tp.chunk_add(1) if tp is not None else current + nth


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
    GGML_ASSERT(src0.type in (C.GGML_TYPE_F32, C.GGML_TYPE_F16), "GGML_ASSERT(src0 F32 or F16) failed")
    GGML_ASSERT(src1.type == C.GGML_TYPE_I32, "GGML_ASSERT(src1->type == GGML_TYPE_I32) failed")
    n_dims = get_op_params_i32(dst, 1)
    mode = get_op_params_i32(dst, 2)
    n_ctx_orig = get_op_params_i32(dst, 4)
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (
        F32(get_op_params_f32(dst, i)) for i in range(5, 11))
    sections = [get_op_params_i32(dst, i) for i in range(11, 15)]
    ne0, ne1, ne2, ne3 = dst.shape
    ts = type_size(src0.type)
    GGML_ASSERT(int(dst.nb[0]) == int(src0.nb[0]) == ts, "GGML_ASSERT(nb0 == nb00 == sizeof(T)) failed")
    GGML_ASSERT(n_dims <= ne0 and n_dims % 2 == 0, "GGML_ASSERT(n_dims <= ne0 && n_dims % 2 == 0) failed")
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
        GGML_ASSERT(sections[0] > 0 or sections[1] > 0 or sections[2] > 0, "GGML_ASSERT(mrope sections) failed")
        GGML_ASSERT(sum(sections) <= ne0, "GGML_ASSERT(sect_dims <= ne0) failed")
    if is_vision:
        GGML_ASSERT(n_dims == ne0 // 2, "GGML_ASSERT(n_dims == ne0/2) failed")
    nh = (ne0 + 1) // 2                      # cache entries: i0 = 0, 2, ..., < ne0
    ff = np.ones(nh, F32)
    if src2 is not None:
        GGML_ASSERT(src2.type == C.GGML_TYPE_F32 and int(src2.ne[0]) >= n_dims // 2, "GGML_ASSERT(freq factors) failed")
        fv = as_array(src2).reshape(-1)
        k = min(nh, fv.size)
        ff[:k] = fv[:k]                       # ggml reads freq_factors[i0/2] for every i0 < ne0
    sin_sign = F32(1.0 if forward else -1.0)
    pos = as_array(src1).reshape(-1)
    i3, i2, i1 = row_idx(ir0, ir1, ne1, ne2)
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
    put_scratch(params, ne0, last[:ne0])


@kernel
def forward_rope(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_rope (rope_flt<float|ggml_fp16_t>, forward): rows of the flattened (i3, i2, i1) split
    with dr; per position the cache theta_i = p*theta_scale^i (sequential float products), divided by the freq
    factor, YaRN-mixed (rope_yarn), cos/sin times mscale; then rotate_pairs (NORMAL: adjacent pairs; NEOX/MROPE:
    halves n_dims/2 apart; VISION: n_dims apart over the whole row); channels past n_dims are copied."""
    _rope(params, dst, True)


@kernel
def forward_rope_back(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_rope_back: the same with sin_sign = -1."""
    _rope(params, dst, False)


# =====================================================================================================================
# IM2COL
# =====================================================================================================================


@kernel
def forward_im2col(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_im2col (its _f32 and _f16 kernels): for every output pixel (n, oh, ow), the row of
    dst at (n*OH*OW + oh*OW + ow) * IC*KH*KW gets, channel by channel, the KH x KW input values under the kernel:
    input (ih, iw) = (oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0), 0 outside the image. Threads split the input
    channels: thread ith fills the channels ith, ith + nth, ... of every row. F32 -> F32 and F16 -> F16 are copies;
    F32 -> F16 rounds as GGML_CPU_FP32_TO_FP16 (F16C)."""
    src0, src1 = dst.src[0], dst.src[1]
    if dst.type == C.GGML_TYPE_F16:
        GGML_ASSERT(src1.type in (C.GGML_TYPE_F16, C.GGML_TYPE_F32),
                    f"GGML_ASSERT(src1->type == GGML_TYPE_F16 || src1->type == GGML_TYPE_F32) failed "
                    f"(src1 is {type_name(src1.type)})")
    elif dst.type == C.GGML_TYPE_F32:
        GGML_ASSERT(src1.type == C.GGML_TYPE_F32,
                    f"GGML_ASSERT(src1->type == GGML_TYPE_F32) failed (src1 is {type_name(src1.type)})")
    else:
        GGML_ASSERT(False, f"ggml_compute_forward_im2col: fatal error: no kernel for a {type_name(dst.type)} "
                    "result (F16 or F32)")
    s0, s1, p0, p1, d0, d1, is_2d = (get_op_params_i32(dst, i) for i in range(7))
    is_2d = is_2d == 1
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    ne10, ne11, ne12, ne13 = (int(x) for x in src1.ne)
    nb10, nb11, nb12, nb13 = (int(x) for x in src1.nb)
    N, IC = (ne13, ne12) if is_2d else (ne12, ne11)
    IH, IW = (ne11 if is_2d else 1), ne10
    KH, KW = (ne01 if is_2d else 1), ne00
    OH, OW = (int(dst.ne[2]) if is_2d else 1), int(dst.ne[1])
    ofs0, ofs1 = (nb13, nb12) if is_2d else (nb12, nb11)
    es = type_size(src1.type)
    GGML_ASSERT(nb10 == es, f"GGML_ASSERT(nb10 == {es}) failed")
    iic = np.arange(params.ith, IC, params.nth)
    if iic.size == 0 or N == 0:
        return
    # C reads the channel's pixel (ih, iw) at element ih*IW + iw from the channel's start, whatever nb11 says;
    # ggviz: that reach must stay inside src1's bytes (C would read past them)
    reach = (N - 1) * ofs0 + (IC - 1) * ofs1 + IH * IW * es
    GGML_ASSERT(reach <= nbytes(src1), f"ggviz: im2col would read {reach} bytes of src1, which has {nbytes(src1)} "
                "(rows are read IW elements apart: nb11 must be ne10*nb10)")
    ih = np.arange(OH)[:, None] * s1 + np.arange(KH)[None, :] * d1 - p1          # (OH, KH)
    iw = np.arange(OW)[:, None] * s0 + np.arange(KW)[None, :] * d0 - p0          # (OW, KW)
    inside = ((ih >= 0) & (ih < IH))[:, None, :, None] & ((iw >= 0) & (iw < IW))[None, :, None, :]
    bits = np.uint32 if es == 4 else np.uint16
    out_bits = np.uint32 if dst.type == C.GGML_TYPE_F32 else np.uint16
    if IH * IW > 0:
        arr, off = tensor_bytes(src1)
        img = np.ndarray((N, IC, IH * IW), dtype=bits, buffer=arr, offset=off, strides=(ofs0, ofs1, es))
        at = (np.clip(ih, 0, IH - 1) * IW)[:, None, :, None] + np.clip(iw, 0, IW - 1)[None, :, None, :]
        v = img[:, iic][:, :, at]                                                  # (N, nic, OH, OW, KH, KW)
        if bits is not out_bits:                                                   # F32 -> F16
            v = f32_to_f16(v.view(F32)).view(np.uint16)
        v = np.where(inside, v, out_bits(0))
    else:
        v = np.zeros((N, iic.size, OH, OW, KH, KW), out_bits)
    darr, doff = tensor_bytes(dst)
    out = np.ndarray((N, OH, OW, IC, KH * KW), dtype=out_bits, buffer=darr, offset=doff)
    out[:, :, :, iic, :] = np.moveaxis(v, 1, 3).reshape(N, OH, OW, iic.size, KH * KW)


# =====================================================================================================================
# GET_ROWS SET_ROWS
# =====================================================================================================================


@kernel
def forward_get_rows(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_get_rows: index i (of nelements(src1), split with dr) -> (i10, i11, i12); row
    src0[i12, i11, src1[i12, i11, i10]] converted to f32 (dequantized, fp16/bf16 widened, or copied) into
    dst[i12, i11, i10]."""
    src0, src1 = dst.src[0], dst.src[1]
    ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
    ne10, ne11 = int(src1.ne[0]), int(src1.ne[1])
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
        vals = dequantize(src0.type, rows_bytes(src0)[i12, i11, i01])
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


@kernel
def forward_set_rows(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_set_rows: for every (i03, i02), rows i of src0 in the thread's dr share of ne01 go to
    dst row src1[i03 % ne12, i02 % ne11, i] through type_traits_cpu[dst->type].from_float (F16 -> F16 is a memcpy;
    other F16 sources are widened into the scratch row first)."""
    src0, src1 = dst.src[0], dst.src[1]
    GGML_ASSERT(src0.type in (C.GGML_TYPE_F32, C.GGML_TYPE_F16), "GGML_ASSERT(src0 F32 or F16) failed")
    GGML_ASSERT(src1.type in (C.GGML_TYPE_I32, C.GGML_TYPE_I64), "GGML_ASSERT(src1 I32 or I64) failed")
    ne00, ne01, ne02, ne03 = src0.shape
    ne11, ne12 = int(src1.ne[1]), int(src1.ne[2])
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
    _store_rows(dst, i03, i02, i1, cpu_from_float(dst.type, x))
    if src0.type == C.GGML_TYPE_F16:
        put_scratch(params, ne00, x[-1])


# =====================================================================================================================
# OUT_PROD
# =====================================================================================================================


@kernel
def forward_out_prod(params: ComputeParams, dst: Tensor):
    """ggml_compute_forward_out_prod: thread 0 zeroes dst, barrier, then rows (i1, i2, i3) of dst split with dr get
    ``d += src0[i03, i02, i01, :] * src1[i13, i12, i01, i1]`` for i01 = 0, 1, ... in order, one FMA per element
    (ggml_vec_mad_f32_unroll / ggml_vec_mad_f32). F16/quantized src0 rows are widened into the scratch row first.
    """
    src0, src1 = dst.src[0], dst.src[1]
    GGML_ASSERT(dst.type == C.GGML_TYPE_F32 and src1.type == C.GGML_TYPE_F32, "GGML_ASSERT(dst, src1 F32) failed")
    ne00, ne01, ne02, ne03 = src0.shape
    ne0, ne1, ne2, ne3 = dst.shape
    GGML_ASSERT(ne0 == ne00 and ne1 == int(src1.ne[0]) and ne2 == int(src1.ne[2]) and ne3 == int(src1.ne[3]),
                "GGML_ASSERT(out_prod shapes) failed")
    GGML_ASSERT(int(dst.nb[0]) == 4, "GGML_ASSERT(nb0 == sizeof(float)) failed")
    if src0.type != C.GGML_TYPE_F32:
        GGML_ASSERT(ne02 == ne2 and ne03 == ne3, "GGML_ASSERT(ne02 == ne12 && ne03 == ne13) failed")
    if params.ith == 0:
        # ggml_vec_set_f32(ne0*ne1*ne2*ne3, dst->data, 0): a contiguous run of floats from dst->data
        da, do = tensor_bytes(dst)
        da[do:do + ne0 * ne1 * ne2 * ne3 * 4] = 0
    params.barrier()
    nr = ne1 * ne2 * ne3
    ir0, ir1 = thread_range(nr, params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = row_idx(ir0, ir1, ne1, ne2)
    i02 = i2 // (ne2 // ne02)
    i03 = i3 // (ne3 // ne03)
    s1 = as_array(src1)                                      # (ne13, ne12, ne11, ne10)
    if is_quantized(src0.type):
        rb = rows_bytes(src0)
        a_rows = lambda i01: dequantize(src0.type, rb[i03, i02, i01])        # noqa: E731
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
        put_scratch(params, ne0, last[-1])


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
    C.GGML_OP_SUB: binary_ops.forward_sub,
    C.GGML_OP_MUL: binary_ops.forward_mul,
    C.GGML_OP_DIV: binary_ops.forward_div,
    C.GGML_OP_ADD1: forward_add1,
    C.GGML_OP_SCALE: forward_scale,
    C.GGML_OP_SQR: unary_ops.forward_sqr,
    C.GGML_OP_SQRT: unary_ops.forward_sqrt,
    C.GGML_OP_SIN: unary_ops.forward_sin,
    C.GGML_OP_COS: unary_ops.forward_cos,
    C.GGML_OP_LOG: unary_ops.forward_log,
    C.GGML_OP_SUM_ROWS: forward_sum_rows,
    C.GGML_OP_MEAN: forward_mean,
    C.GGML_OP_ARGMAX: forward_argmax,
    C.GGML_OP_ARGSORT: forward_argsort,
    C.GGML_OP_TOP_K: forward_top_k,
    C.GGML_OP_REPEAT: forward_repeat,
    C.GGML_OP_CONCAT: forward_concat,
    C.GGML_OP_NORM: forward_norm,
    C.GGML_OP_RMS_NORM: forward_rms_norm,
    C.GGML_OP_SOFT_MAX: forward_soft_max,
    C.GGML_OP_FLASH_ATTN_EXT: forward_flash_attn_ext,
    C.GGML_OP_ROPE: forward_rope,
    C.GGML_OP_ROPE_BACK: forward_rope_back,
    C.GGML_OP_IM2COL: forward_im2col,
    C.GGML_OP_UNARY: forward_unary,
    C.GGML_OP_GLU: forward_glu,
    C.GGML_OP_GET_ROWS: forward_get_rows,
    C.GGML_OP_SET_ROWS: forward_set_rows,
    C.GGML_OP_OUT_PROD: forward_out_prod,
}
