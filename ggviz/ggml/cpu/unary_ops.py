"""ggml-cpu's unary-ops.cpp: the element-wise unary ops (``apply_unary_op``).

ABS, SGN, NEG, STEP, TANH, ELU, RELU, SIGMOID, HARDSIGMOID, EXP, HARDSWISH, FLOOR, CEIL, ROUND, TRUNC (the
``GGML_OP_UNARY`` kinds ``ggml_compute_forward_unary`` of ops.cpp hands over here) and the ops SQR, SQRT, SIN, COS,
LOG. Rows are split with ``get_thread_range(src0)``; every element goes through float32 (``to_f32`` ->
op -> ``from_f32``). Not bit-exact: TANH, ELU (expm1f) and LOG use float64-rounded NumPy functions where glibc has
its own float routines (~1 % of elements may differ by 1 ulp).
"""
from __future__ import annotations

import numpy as np

from .. import consts as C
from ..impl import GGML_ASSERT
from ..tensor import Tensor, nrows, type_name
from .common import ComputeParams, as_array, from_f32, kernel, row_idx, thread_range, to_f32
from .libm import expf_vec, glibc_cosf, glibc_sinf

F32 = np.float32
F64 = np.float64

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


UNARY_FNS = {
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

OP_UNARY_FNS = {
    C.GGML_OP_SQR: lambda x: x * x,
    C.GGML_OP_SQRT: _f64(np.sqrt),      # sqrt is correctly rounded in both precisions
    C.GGML_OP_SIN: glibc_sinf,
    C.GGML_OP_COS: glibc_cosf,
    C.GGML_OP_LOG: _f64(np.log),
}

_UNARY_TYPES = {(C.GGML_TYPE_F32, C.GGML_TYPE_F32), (C.GGML_TYPE_F16, C.GGML_TYPE_F16),
                (C.GGML_TYPE_BF16, C.GGML_TYPE_BF16), (C.GGML_TYPE_BF16, C.GGML_TYPE_F32),
                (C.GGML_TYPE_F16, C.GGML_TYPE_F32)}


def apply_unary_op(params, dst, fn):
    """apply_unary_op: rows of get_thread_range(src0); y = from_f32(op(to_f32(x)))."""
    src0 = dst.src[0]
    if (src0.type, dst.type) not in _UNARY_TYPES:
        raise NotImplementedError(f"unary: unsupported types: dst: {type_name(dst.type)}, "
                                  f"src0: {type_name(src0.type)}")
    GGML_ASSERT(src0.shape == dst.shape, "GGML_ASSERT(ggml_are_same_shape(src0, dst)) failed")
    ne00, ne01, ne02, ne03 = src0.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = row_idx(ir0, ir1, ne01, ne02)
    x = to_f32(as_array(src0)[i3, i2, i1], src0.type)
    with np.errstate(all="ignore"):
        y = np.asarray(fn(x), F32)
    as_array(dst)[i3, i2, i1] = from_f32(y, dst.type)


def _make_op_unary(op):
    @kernel
    def forward(params: ComputeParams, dst: Tensor):
        apply_unary_op(params, dst, OP_UNARY_FNS[op])
    forward.__name__ = f"forward_{C.OP_NAMES[op].lower()}"
    return forward


forward_sqr = _make_op_unary(C.GGML_OP_SQR)
forward_sqrt = _make_op_unary(C.GGML_OP_SQRT)
forward_sin = _make_op_unary(C.GGML_OP_SIN)
forward_cos = _make_op_unary(C.GGML_OP_COS)
forward_log = _make_op_unary(C.GGML_OP_LOG)
