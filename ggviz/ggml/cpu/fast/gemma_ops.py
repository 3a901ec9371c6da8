"""Compiled kernels for the ops Gemma-3's graph adds to llama's: SCALE and GEGLU (fast path).

Not a ggml source file: like ``kernels.py`` it compiles ggml-cpu's kernels (``ggml_compute_forward_scale_f32``,
``ggml_compute_forward_geglu_f32`` in ggml-cpu/ops.cpp, ``ggml_vec_scale_f32`` / ``ggml_vec_mad1_f32`` /
``ggml_vec_geglu_f32`` in vec.h) operation for operation, bit-identical to the faithful kernels (``cpu/ops.py``):

* SCALE: rows split over the threads; ``b == 0``: copy then ``y *= s`` (one rounding per element, whatever the SIMD
  width); else ``y = fma(x, s, b)`` (``_mm256_fmadd_ps`` in the body, a contracted FMA in the tail).
* GEGLU (GGML_GELU_FP16, as ggml-cpu is built): per element ``x <= -10 -> 0``, ``x >= 10 -> x*g``, else
  ``ggml_table_gelu_f16[fp16(x)] * g`` -- the same 65536-entry table the faithful path builds (``vec.gelu_table_f16``),
  whose address travels in the program row. Split (two sources) and fused (one source, halves, ``swapped``).

``build_scale`` / ``build_geglu`` fill a program row (columns in ``program.py``) and return False for a node they
do not take (then the graph runs node by node). ``compiler.py`` / ``kernels.py`` only dispatch here.
"""
from __future__ import annotations

import functools

import numpy as np

from ... import consts as C
from ...tensor import get_glu_op, get_op_params_f32, get_op_params_i32, is_contiguous, nrows
from ..vec import gelu_table_f16
from .intrinsics import compiled, copy_bytes, f32_to_f16, fmaf, fp16_to_fp32, ld_f32, ld_u16, st_f32
from .program import (
    DATA,
    DST,
    GEGLU_NC,
    GEGLU_NROWS,
    GEGLU_SWAPPED,
    GEGLU_TABLE,
    NB1,
    OP,
    OP_GEGLU,
    OP_SCALE,
    S0,
    S1,
    SCALE_B,
    SCALE_NC,
    SCALE_NROWS,
    SCALE_S,
)

F32 = np.float32
GGML_TYPE_F32 = C.GGML_TYPE_F32


@functools.lru_cache(maxsize=None)
def _gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16 as uint16 words, built by the first GEGLU a program holds (~3 ms, which a model
    without GEGLU -- SmolLM2 -- never paid at import); cached, so it lives as long as the process does (program rows
    hold its address)."""
    return np.ascontiguousarray(gelu_table_f16().view(np.uint16))


@compiled
def _rows(n, ith, nth):
    dr = (n + nth - 1) // nth
    ir0 = dr * ith
    return ir0, max(ir0, min(ir0 + dr, n))


@compiled
def k_scale(P, F, k, ith, nth, sync, wdata):
    src0, dst = P[k, S0 + DATA], P[k, DST + DATA]
    nc, nr = P[k, SCALE_NC], P[k, SCALE_NROWS]
    nb01, nb1 = P[k, S0 + NB1], P[k, DST + NB1]
    s = F32(F[k, SCALE_S])
    b = F32(F[k, SCALE_B])
    ir0, ir1 = _rows(nr, ith, nth)
    for i1 in range(ir0, ir1):
        x = src0 + i1 * nb01
        d = dst + i1 * nb1
        if b == F32(0.0):
            if d != x:
                copy_bytes(d, x, 4 * nc)
            for i in range(nc):
                st_f32(d + 4 * i, ld_f32(d + 4 * i) * s)
        else:
            for i in range(nc):
                st_f32(d + 4 * i, fmaf(ld_f32(x + 4 * i), s, b))


@compiled
def k_geglu(P, F, k, ith, nth, sync, wdata):
    src0, src1, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA]
    nc, nr = P[k, GEGLU_NC], P[k, GEGLU_NROWS]
    swapped = P[k, GEGLU_SWAPPED]
    tab = P[k, GEGLU_TABLE]
    nb01, nb11, nb1 = P[k, S0 + NB1], P[k, S1 + NB1], P[k, DST + NB1]
    ir0, ir1 = _rows(nr, ith, nth)
    for i1 in range(ir0, ir1):
        if src1 != 0:
            xr = src0 + i1 * nb01
            gr = src1 + i1 * nb11
        elif swapped:
            xr = src0 + i1 * nb01 + 4 * nc
            gr = src0 + i1 * nb01
        else:
            xr = src0 + i1 * nb01
            gr = src0 + i1 * nb01 + 4 * nc
        d = dst + i1 * nb1
        for i in range(nc):
            xv = ld_f32(xr + 4 * i)
            if xv <= F32(-10.0):
                y = F32(0.0)
            elif xv >= F32(10.0):
                y = xv * ld_f32(gr + 4 * i)
            else:
                y = fp16_to_fp32(ld_u16(tab + 2 * np.int64(f32_to_f16(xv)))) * ld_f32(gr + 4 * i)
            st_f32(d + 4 * i, y)


def build_scale(P, F, k, node) -> bool:
    s0 = node.src[0]
    if not (s0.type == GGML_TYPE_F32 and node.type == GGML_TYPE_F32 and is_contiguous(s0) and is_contiguous(node)
            and s0.shape == node.shape):
        return False
    P[k, OP] = OP_SCALE
    P[k, SCALE_NC] = int(s0.ne[0])
    P[k, SCALE_NROWS] = nrows(s0)
    F[k, SCALE_S] = float(get_op_params_f32(node, 0))
    F[k, SCALE_B] = float(get_op_params_f32(node, 1))
    return True


def build_geglu(P, F, k, node) -> bool:
    s0, s1 = node.src[0], node.src[1]
    if get_glu_op(node) != C.GGML_GLU_OP_GEGLU or s0.type != GGML_TYPE_F32 or node.type != GGML_TYPE_F32:
        return False
    if int(s0.nb[0]) != 4 or int(node.nb[0]) != 4:
        return False
    if s1 is not None and (s1.type != GGML_TYPE_F32 or int(s1.nb[0]) != 4):
        return False
    P[k, OP] = OP_GEGLU
    P[k, GEGLU_NC] = int(s0.ne[0]) if s1 is not None else int(s0.ne[0]) // 2
    P[k, GEGLU_SWAPPED] = get_op_params_i32(node, 1)
    P[k, GEGLU_NROWS] = nrows(s0)
    P[k, GEGLU_TABLE] = _gelu_table().ctypes.data
    if s1 is None:
        P[k, S1 + DATA] = 0
    return True
