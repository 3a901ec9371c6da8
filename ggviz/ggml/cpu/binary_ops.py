"""ggml-cpu's binary-ops.cpp: ADD / SUB / MUL / DIV of non-quantized tensors (``apply_binary_op``).

Rows are split with ``get_thread_range(src0)``; src1 is broadcast (its row is ``(i03 % ne13, i02 % ne12,
i01 % ne11)`` and its elements repeat along the row); f32 / f16 / bf16 combinations go through float32, as the
C template's ``to_f32`` / ``from_f32`` do. ``ggml_compute_forward_add`` itself (quantized src0 -> ``add_q_f32``)
is in ``ops.py``, as in ops.cpp.
"""
from __future__ import annotations

import numpy as np

from .. import consts as C
from ..impl import GGML_ASSERT
from ..tensor import Tensor, nrows, type_name, type_size
from .common import ComputeParams, as_array, from_f32, kernel, row_idx, thread_range, to_f32

F32 = np.float32

# =====================================================================================================================
# element-wise binary: ADD SUB MUL DIV (binary-ops.cpp)
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


def apply_binary_op(params, dst, op):
    """apply_binary_op: rows split with get_thread_range(src0); src1's row is (i03 % ne13, i02 % ne12, i01 % ne11)
    and its elements repeat along the row (``r*ne10`` blocks when its rows are contiguous, ``i % ne10``
    otherwise: the same elements)."""
    src0, src1 = dst.src[0], dst.src[1]
    key = (src0.type, src1.type, dst.type)
    if key not in _BINARY_TYPES:
        raise NotImplementedError("binary_op: unsupported types: dst: %s, src0: %s, src1: %s"
                                  % (type_name(dst.type), type_name(src0.type), type_name(src1.type)))
    GGML_ASSERT(src0.shape == dst.shape, "GGML_ASSERT(ggml_are_same_shape(src0, dst)) failed")
    GGML_ASSERT(int(dst.nb[0]) == type_size(dst.type) and int(src0.nb[0]) == type_size(src0.type),
                "GGML_ASSERT(nb0 == sizeof(dst_t) && nb00 == sizeof(src0_t)) failed")
    ne00, ne01, ne02, ne03 = src0.shape
    ne10, ne11, ne12, ne13 = src1.shape
    ir0, ir1 = thread_range(nrows(src0), params.ith, params.nth)
    if ir0 >= ir1:
        return
    i3, i2, i1 = row_idx(ir0, ir1, ne01, ne02)
    x = to_f32(as_array(src0)[i3, i2, i1], src0.type)
    y = to_f32(as_array(src1)[i3 % ne13, i2 % ne12, i1 % ne11], src1.type)
    if ne10 != ne00:
        y = y[:, np.arange(ne00) % ne10]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = op(x, y).astype(F32)
    as_array(dst)[i3, i2, i1] = from_f32(z, dst.type)


@kernel
def forward_sub(params: ComputeParams, dst: Tensor):
    apply_binary_op(params, dst, np.subtract)


@kernel
def forward_mul(params: ComputeParams, dst: Tensor):
    apply_binary_op(params, dst, np.multiply)


@kernel
def forward_div(params: ComputeParams, dst: Tensor):
    apply_binary_op(params, dst, np.divide)





def forward_add_non_quantized(params: ComputeParams, dst: Tensor):
    apply_binary_op(params, dst, np.add)
