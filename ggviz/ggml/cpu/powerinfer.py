"""PowerInfer's sparse FFN kernels on the CPU: MUL_MAT_SPARSE and AXPY.

Mirrors SJTU-IPADS/PowerInfer's ggml.c: the global ``sparse_pred_threshold`` (llama.cpp sets it from the model's
``powerinfer.sparse_threshold``, env ``LLAMA_SPARSE_PRED_THRESHOLD`` overriding), ``ggml_compute_forward_mul_mat_sparse``
(+ the GPU half ``ggml_mul_mat_idx_upscale`` as the simulated accelerator runs it), ``ggml_compute_forward_mul_mat_axpy``
(F16 weights, ``ggml_axpy_avx_f16``) and the MUL_MAT_SPARSE / AXPY cases of ``ggml_graph_plan`` (n_tasks =
n_threads; the work buffer holds src1 converted to ``vec_dot_type``).

PowerInfer was forked from the ggml of late 2023, whose ops had an INIT pass run by one thread before the COMPUTE
pass. ggml 0.20.2 has no passes any more; here thread 0 does INIT's work, then all threads meet at a barrier.

* MUL_MAT_SPARSE. INIT: src1 -> vec_dot_type in wdata, the shared counter ``aic`` set to 0. COMPUTE: threads claim
  chunks of ``dr0 = ceil(nr0 / (8 nth))`` rows with ``atomic_fetch_add(aic, dr0)`` until the rows run out; row r of
  column j is ``0`` where ``gpu_idx[r] == 1 || idx[j][r] < threshold``, else one ``vec_dot`` in the AVX2 kernel's
  own float order (``quants.vec_dot(..., exact=True)``, also for Q4_0 / Q4_1), so a kept row has the real ggml's
  bits, which are those of ggviz's dense (repacked) MUL_MAT and of the compiled kernel (fast/sparse.py).
* AXPY (dst[:, j] = sum_r x[r, j] * down_t[r]): INIT zeroes dst and converts x to F16 (F16's vec_dot_type).
  COMPUTE: a static split of the n_ff rows, ``dr = ceil(n_ff / nth)``; a row is skipped where its F16 x is 0,
  ``gpu_idx[r] == 1`` (or gpu_idx is NULL: then PowerInfer's CPU kernel skips every row) or
  ``idx[r] < threshold``; each thread accumulates its rows into a private vector with ``_mm256_fmadd_ps`` --
  here ``vec + w * alpha`` in float32, which is the same bits because an F16 x F16 product is exact in float32 --
  then PowerInfer adds the private vector into dst **without a lock** (``res[i] += tmp[i]``): a data race, two
  threads can read the same ``res`` and one addition is lost. ggviz keeps the partial vectors in the work buffer and,
  after a barrier, reduces them in ith order (((0 + p0) + p1) + ...), which is deterministic and loses nothing.

Deviations, each because PowerInfer's code is wrong or absent there: (1) when src1 has more columns than src0 has
rows, PowerInfer splits MUL_MAT_SPARSE by columns but still shares one row counter between the column groups, so
rows claimed by one thread are never computed for the other threads' columns; ggviz always splits by rows. (2)
PowerInfer takes ``..._sparse_head`` / ``..._axpy_head`` kernels when the index has <= 1000 entries (attention-head
sparsity of its OPT models); ggviz uses the FFN kernels for every size. (3) a NULL gpu_idx in MUL_MAT_SPARSE
(PowerInfer would read through a NULL pointer) means "no row on the GPU".
"""
from __future__ import annotations

import os
import time

import numpy as np

from ... import trace
from .. import consts as C
from ..impl import GGMLError
from ..tensor import GGML_OP_AXPY, GGML_OP_MUL_MAT_SPARSE, Tensor, nelements, row_size, type_name, type_size
from . import quants as cq
from .common import CACHE_LINE_SIZE, ComputeParams, as_array, rows_bytes

F32 = np.float32


def _env_threshold() -> float:
    v = os.environ.get("LLAMA_SPARSE_PRED_THRESHOLD")
    if v is None or not v.strip():
        return 0.0
    try:
        return float(v)
    except ValueError:
        # atof would read 0.0 silently; a typo in a threshold deserves a message
        raise GGMLError(f"LLAMA_SPARSE_PRED_THRESHOLD={v!r} is not a number") from None


# ggml.c's ``float sparse_pred_threshold = 0.``: a logit threshold (0 = probability 0.5). llama.cpp's loader sets it
# from the model's KV; ggviz also reads the environment here so that a bare graph sees the override too
sparse_pred_threshold: float = _env_threshold()


def set_sparse_pred_threshold(value: float) -> float:
    """Set the global threshold (llama.cpp writes ``sparse_pred_threshold = hparams.sparse_pred_threshold``);
    returns the previous value."""
    global sparse_pred_threshold
    v = float(value)
    if np.isnan(v):
        raise GGMLError("sparse_pred_threshold must not be NaN")
    old, sparse_pred_threshold = sparse_pred_threshold, v
    return old


def _i32(t: Tensor | None) -> np.ndarray | None:
    return None if t is None else as_array(t).reshape(-1)


def _idx_rows(t: Tensor, n: int) -> np.ndarray:
    """The predictor's output as (n_columns, n) float32 rows (PowerInfer indexes it with ne[0]*4-byte rows)."""
    a = as_array(t)
    if int(t.ne[0]) != n:
        raise GGMLError(f"sparse index {t.name!r} has {t.ne[0]} entries per column, need {n}")
    return a.reshape(-1, n)


def _convert_src1(params: ComputeParams, src1: Tensor, vdt: int) -> tuple[np.ndarray, int]:
    """INIT: src1's columns as (nr1, row_vd) bytes of vec_dot_type, converted into wdata by thread 0."""
    ne10 = int(src1.ne[0])
    nr1 = int(src1.ne[1] * src1.ne[2] * src1.ne[3])
    row_vd = row_size(vdt, ne10)
    if src1.type == vdt:
        return np.ascontiguousarray(rows_bytes(src1).reshape(nr1, row_vd)), row_vd
    if src1.type != C.GGML_TYPE_F32:
        raise GGMLError(f"src1 must be F32 when it needs conversion to {type_name(vdt)}")
    if params.wdata.nbytes < nr1 * row_vd:
        raise GGMLError(f"work buffer too small: {params.wdata.nbytes} < {nr1 * row_vd} bytes")
    w = params.wdata[:nr1 * row_vd].reshape(nr1, row_vd)
    if params.ith == 0:
        x = as_array(src1).reshape(nr1, ne10)
        w[...] = cq.from_float(vdt, np.ascontiguousarray(x))
    return w, row_vd


def _check_common(dst: Tensor, what: str):
    src0, src1 = dst.src[0], dst.src[1]
    if dst.src[2] is None:
        raise GGMLError(f"{what}: the sparsity index (src[2]) is required")
    if src0.nb[0] != type_size(src0.type) or src1.nb[0] != 4:
        raise GGMLError(f"{what}: src0/src1 must have contiguous rows (nb[0] == type size)")
    if not (dst.nb[0] == 4 and dst.nb[0] <= dst.nb[1] <= dst.nb[2] <= dst.nb[3]):
        raise GGMLError(f"{what}: dst cannot be transposed or permuted")
    if int(src0.ne[2]) != 1 or int(src0.ne[3]) != 1:
        raise GGMLError(f"{what}: ggviz takes a 2-D weight (an FFN matrix), got ne={list(src0.shape)}")


def is_upscale(dst: Tensor) -> bool:
    """The GPU half (``ggml_mul_mat_idx_upscale`` / ``ggml_axpy`` on gpu_bucket): ggviz's op_params[1]."""
    return int(dst.op_params[1]) == 1


def forward_mul_mat_sparse(params: ComputeParams, dst: Tensor) -> None:
    """ggml_compute_forward_mul_mat_sparse (and, with op_params[1] = 1, the upscale kernel of the GPU half)."""
    src0, src1 = dst.src[0], dst.src[1]
    _check_common(dst, "mul_mat_sparse")
    ith, nth = params.ith, params.nth
    vdt = cq.VEC_DOT_TYPE[src0.type]
    upscale = is_upscale(dst)
    nr0 = int(dst.ne[0])                      # n_ff rows of the result
    nr1 = int(dst.ne[1] * dst.ne[2] * dst.ne[3])
    idx = _idx_rows(dst.src[2], nr0)
    aux = _i32(dst.src[3])
    threshold = F32(sparse_pred_threshold)
    if upscale:
        if aux is None or len(aux) != int(src0.ne[1]):
            raise GGMLError("mul_mat_idx_upscale: gpu_bucket must have one entry per row of src0")
        if len(aux) and (aux.min() < 0 or aux.max() >= nr0):
            raise GGMLError(f"mul_mat_idx_upscale: gpu_bucket holds a row outside [0, {nr0})")
    elif int(src0.ne[1]) != nr0 or int(src1.ne[1] * src1.ne[2] * src1.ne[3]) != nr1:
        raise GGMLError(f"mul_mat_sparse: dst {dst.shape} does not match src0 {src0.shape} x src1 {src1.shape}")

    # ---- INIT (thread 0): src1 -> vec_dot_type, aic = 0
    y, _ = _convert_src1(params, src1, vdt)
    tp = params.threadpool
    if ith == 0 and tp is not None:
        tp.chunk_set(0)
    params.barrier()

    W = rows_bytes(src0)[0, 0]                # (src0 rows, row bytes)
    out = as_array(dst).reshape(nr1, nr0)
    if upscale:
        # the GPU half, one thread ({ith 0, nth 1} in the hybrid executor): rows not in the bucket stay 0 (CUDA's
        # dst is zeroed first), a bucket row the predictor drops returns without writing
        if ith != 0:
            return
        out[...] = 0
        if len(aux):
            keep = ~(idx[:, aux] < threshold)              # (nr1, n_hot)
            rows = np.flatnonzero(keep.any(0))
            if len(rows):
                vals = cq.vec_dot(src0.type, W[rows], y, exact=True)   # (nr1, len(rows))
                out[:, aux[rows]] = np.where(keep[:, rows], vals, F32(0))
        return

    # ---- COMPUTE: chunks of dr0 rows from the shared counter
    dr0 = (nr0 + 8 * nth - 1) // (8 * nth)
    n_chunk = 0
    while True:
        ir010 = tp.chunk_fetch_add(dr0) if tp is not None else n_chunk * dr0
        ir011 = min(ir010 + dr0, nr0)
        if ir010 < ir011:
            t0 = time.perf_counter_ns() if trace.active else 0
            skip = idx[:, ir010:ir011] < threshold                       # (nr1, rows)
            if aux is not None:
                skip = skip | (aux[ir010:ir011] == 1)[None, :]
            rows = np.flatnonzero(~skip.all(0))
            out[:, ir010:ir011] = 0
            if len(rows):
                vals = cq.vec_dot(src0.type, W[ir010 + rows], y, exact=True)   # (nr1, len(rows))
                out[:, ir010 + rows] = np.where(skip[:, rows], F32(0), vals)
            if trace.active:
                trace.emit("cpu.chunk", ith=ith, node=dst.name, chunk=ir010 // dr0, nchunk=((nr0 + dr0 - 1) // dr0, 1),
                           ir0=(ir010, ir011), ir1=(0, nr1), t_start=t0, t_end=time.perf_counter_ns(),
                           skipped=int(skip.sum()))
        n_chunk += 1
        if ir010 + dr0 >= nr0:
            break


def axpy_work_size(node: Tensor, n_tasks: int) -> int:
    """AXPY's work buffer: PowerInfer's (src1 as F16) plus, ggviz's, one partial dst per thread for the reduction."""
    vdt = cq.VEC_DOT_TYPE[node.src[0].type]
    conv = row_size(vdt, nelements(node.src[1])) if node.src[1].type != vdt else 0
    conv = (conv + CACHE_LINE_SIZE - 1) // CACHE_LINE_SIZE * CACHE_LINE_SIZE
    return conv + n_tasks * nelements(node) * 4


def mul_mat_sparse_work_size(node: Tensor) -> int:
    vdt = cq.VEC_DOT_TYPE[node.src[0].type]
    return row_size(vdt, nelements(node.src[1])) if node.src[1].type != vdt else 0


def forward_axpy(params: ComputeParams, dst: Tensor) -> None:
    """ggml_compute_forward_mul_mat_axpy (F16 down_t), and with op_params[1] = 1 the GPU half on gpu_bucket."""
    src0, src1 = dst.src[0], dst.src[1]
    _check_common(dst, "axpy")
    if src0.type != C.GGML_TYPE_F16:
        raise GGMLError(f"axpy: ggviz mirrors PowerInfer's F16 kernel; down_t is {type_name(src0.type)}")
    ith, nth = params.ith, params.nth
    ne00 = int(src0.ne[0])
    n_ff = int(src1.ne[0])
    nr1 = int(src1.ne[1] * src1.ne[2] * src1.ne[3])
    idx = _idx_rows(dst.src[2], n_ff)
    aux = _i32(dst.src[3])
    threshold = F32(sparse_pred_threshold)
    upscale = is_upscale(dst)
    out = as_array(dst).reshape(nr1, ne00)

    # ---- INIT (thread 0): dst = 0, x -> F16, aic = 0
    xh, row_vd = _convert_src1(params, src1, C.GGML_TYPE_F16)
    xh = xh.view(np.float16).reshape(nr1, n_ff)
    if ith == 0:
        out[...] = 0
        if params.threadpool is not None:
            params.threadpool.chunk_set(0)
    params.barrier()

    W = as_array(src0).reshape(-1, ne00)                 # F16 rows of down_t
    if upscale:
        # the GPU half: a holds the hot rows, row i is neuron aux[i]; one thread, rows summed in bucket order
        # (CUDA adds them with atomicAdd in whatever order the blocks finish)
        if ith != 0:
            return
        if aux is None or len(aux) != W.shape[0]:
            raise GGMLError("axpy: gpu_bucket must have one entry per row of src0")
        for j in range(nr1):
            xj = xh[j, aux]
            keep = np.flatnonzero((xj != 0) & ~(idx[j, aux] < threshold))
            if len(keep):
                out[j] = _axpy_rows(W[keep], xj[keep])
        return

    conv = 0 if src1.type == C.GGML_TYPE_F16 else nr1 * row_vd
    conv = (conv + CACHE_LINE_SIZE - 1) // CACHE_LINE_SIZE * CACHE_LINE_SIZE
    need = conv + nth * nr1 * ne00 * 4
    if params.wdata.nbytes < need:
        raise GGMLError(f"axpy: work buffer too small: {params.wdata.nbytes} < {need} bytes")
    partials = params.wdata[conv:need].view(F32).reshape(nth, nr1, ne00)
    dr = (W.shape[0] + nth - 1) // nth
    r0, r1 = min(dr * ith, W.shape[0]), min(dr * ith + dr, W.shape[0])
    t0 = time.perf_counter_ns() if trace.active else 0
    skipped = 0
    for j in range(nr1):
        xj = xh[j, r0:r1]
        # PowerInfer: `if (!gpu_idx || gpu_idx[ir1] == 1) continue;` -- the CPU kernel computes only rows whose
        # gpu_idx entry is 0 (a NULL gpu_idx takes the _head kernel in PowerInfer; ggviz skips all rows as written)
        on_cpu = (aux[r0:r1] == 0) if aux is not None else np.zeros(r1 - r0, bool)
        keep = np.flatnonzero((xj != 0) & on_cpu & ~(idx[j, r0:r1] < threshold))
        skipped += (r1 - r0) - len(keep)
        partials[ith, j] = _axpy_rows(W[r0 + keep], xj[keep]) if len(keep) else 0
    if trace.active:
        trace.emit("cpu.chunk", ith=ith, node=dst.name, chunk=ith, nchunk=(nth, 1), ir0=(r0, r1), ir1=(0, nr1),
                   t_start=t0, t_end=time.perf_counter_ns(), skipped=skipped)
    # PowerInfer: every thread now does `res[i] += tmp[i]` into dst with no lock or barrier -- a data race.
    # ggviz: all partials written, then each thread sums its share of dst's elements over the partials in ith order
    params.barrier()
    flat = out.reshape(-1)
    e0, e1 = _share(flat.size, ith, nth)
    if e1 > e0:
        acc = flat[e0:e1]
        for t in range(nth):
            acc += partials[t].reshape(-1)[e0:e1]


def _share(n: int, ith: int, nth: int) -> tuple[int, int]:
    d = (n + nth - 1) // nth
    return min(d * ith, n), min(d * ith + d, n)


def _axpy_rows(w_f16: np.ndarray, x_f16: np.ndarray) -> np.ndarray:
    """sum_r x[r] * w[r] accumulated row after row in float32 (ggml_axpy_avx_f16's fmadd per row: exact here,
    since the product of two F16 values fits float32's mantissa, so a * b + c rounds once like the FMA)."""
    prod = w_f16.astype(F32) * x_f16.astype(F32)[:, None]
    # one row after the other, in row order, as the C loop does (a NumPy reduction might pair them up)
    acc = np.zeros(prod.shape[1], F32)
    for r in range(prod.shape[0]):
        acc += prod[r]
    return acc


FORWARD = {
    GGML_OP_MUL_MAT_SPARSE: forward_mul_mat_sparse,
    GGML_OP_AXPY: forward_axpy,
}


def work_size(node: Tensor, n_tasks: int) -> int | None:
    """ggml_graph_plan's cases for PowerInfer's ops (None for other ops)."""
    if node.op == GGML_OP_MUL_MAT_SPARSE:
        return mul_mat_sparse_work_size(node)
    if node.op == GGML_OP_AXPY:
        return axpy_work_size(node, n_tasks)
    return None
