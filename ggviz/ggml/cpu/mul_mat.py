"""MUL_MAT on the CPU, the way ggml-cpu.c does it.

Mirrors ``ggml_compute_forward_mul_mat`` and ``ggml_compute_forward_mul_mat_one_chunk`` as built with
``GGML_USE_LLAMAFILE`` (ggml-cpu's default, llama.cpp's default CPU build):

0. If src1 is contiguous, ``llamafile_sgemm`` (tinyBLAS, ``cpu/llamafile/sgemm.py``) is offered each (i12, i13)
   matrix as it is; it takes F32 x F32 of 2+ columns. Otherwise, or if it refuses, step 1 converts src1, and after
   the barrier tinyBLAS is offered the converted matrices (F16 x F16, BF16 x BF16, Q8_0/Q4_0/Q5_0 x Q8_0: so every
   prefill MUL_MAT with such weights, and the F16 KV-cache attention, goes through it). Only what it refuses (n = 1,
   the other quant types, shapes it does not tile) reaches steps 2-3. ``mul_mat_kernel`` names the path a node takes.
1. src1 (F32 activations) is converted to src0's ``vec_dot_type`` (Q8_0 for Q4_0/Q5_0/Q8_0 weights, Q8_1 for
   Q4_1/Q5_1, Q8_K for K-quants, F16 for F16 ...) into the work buffer; thread ``ith`` converts its share of the
   *blocks of every row*, as ggml does, then all threads meet at a barrier.
2. The result ``nr0 x nr1`` (src0 rows x src1 columns) is cut into chunks (16, or 64 when one side is 1; re-chunked
   per thread when there are fewer than 4 chunks per thread); each thread starts at chunk ``ith`` and claims more
   from the pool's shared ``current_chunk`` counter.
3. Inside a chunk every dst element is one ``vec_dot`` of a src0 row with a src1 column (ggviz.ggml.cpu.quants):
   for F32 / F16 / BF16 src0 ggml_vec_dot_f32 / _f16 / _bf16 lane by lane as the AVX2+FMA build computes them, so
   the results are ggml's bits; for the quant types block-wise integer dots scaled by the block scales, which match
   ggml up to the order of the float32 additions.

ggml runs the chunk as 16x16 tiles; the tiles only change the order in which independent dot products are taken,
so ggviz computes a whole chunk's dots in one vectorised call (the column groups of a chunk that crosses several
src1 matrices together, for the float types). Each element's arithmetic is the same whatever else is computed with
it, so the results do not depend on the chunking, i.e. on the thread count.
"""
from __future__ import annotations

import time

import numpy as np

from ... import trace
from .. import consts as C
from ..context import GGMLError
from ..tensor import blck_size, is_contiguous, row_size, type_size
from . import quants as cq
from . import repack, traits
from .common import ComputeParams, tensor_bytes
from .llamafile import sgemm as llamafile

# GGML_USE_LLAMAFILE: ggml-cpu's default build (llama.cpp's too) hands MUL_MATs of 2+ columns to tinyBLAS. False
# computes as a build without it (libggml-python 0.20.2, the tests' oracle, is one): read by this faithful path at
# each compute, by the compiled path when it compiles a graph (fast/compiler.py)
USE_LLAMAFILE = True

# the names of the kernels a MUL_MAT can run on (trace events' ``kernel``, the views)
KERNEL_SGEMM = "sgemm"                  # llamafile's tinyBLAS (cpu/llamafile/sgemm.py)
KERNEL_REPACK = "repack gemm"           # the CPU_REPACK extra buffer type's forward_mul_mat (cpu/repack.py)
KERNEL_VEC_DOT = "vec_dot chunks"       # ggml_compute_forward_mul_mat_one_chunk
KERNEL_BLAS = "BLAS"                    # the BLAS backend (ggml-blas; opt-in, as llama.cpp built with GGML_BLAS)


def _rows(t, i2: int, i3: int, r0: int, r1: int, rb: int) -> np.ndarray:
    """Rows r0..r1 of matrix (i2, i3) of ``t`` as raw bytes (M, rb): zero-copy, strided by nb1."""
    arr, off = tensor_bytes(t)
    nb = t.strides
    start = off + i2 * nb[2] + i3 * nb[3] + r0 * nb[1]
    return np.ndarray(shape=(r1 - r0, rb), dtype=np.uint8, buffer=arr, offset=start, strides=(nb[1], 1))


def forward_mul_mat(params: ComputeParams, dst) -> None:
    src0, src1 = dst.src[0], dst.src[1]
    ne00, ne01, ne02, ne03 = src0.shape
    ne10, ne11, ne12, ne13 = src1.shape
    ne0, ne1, ne2, ne3 = dst.shape
    nb0, nb1, nb2, nb3 = dst.strides
    nb10, nb11, nb12, nb13 = src1.strides
    ith, nth = params.ith, params.nth

    vdt = cq.VEC_DOT_TYPE[src0.type]
    if not (ne0 == ne01 and ne1 == ne11 and ne2 == ne12 and ne3 == ne13):
        raise GGMLError(f"mul_mat: dst {dst.shape} does not match src0 {src0.shape} x src1 {src1.shape}")
    # we don't support permuted src0 or src1 (as ggml)
    if src0.nb[0] != type_size(src0.type) or nb10 != type_size(src1.type):
        raise GGMLError("mul_mat: src0/src1 must have contiguous rows (nb[0] == type size)")
    if not (nb0 == 4 and nb0 <= nb1 <= nb2 <= nb3):
        raise GGMLError("mul_mat: dst cannot be transposed or permuted")

    r2, r3 = ne12 // src0.ne[2], ne13 // src0.ne[3]
    if USE_LLAMAFILE and is_contiguous(src1):
        # src1 as it is (F32 x F32 for the float kernel; quantized src0 wants Q8_0 and answers false here)
        arr, off = tensor_bytes(src1)
        if _llamafile_all(params, dst, (arr, off), src1.strides, nb11 // type_size(src1.type), src1.type, r2, r3):
            return

    wdata = params.wdata
    row_vd = row_size(vdt, ne10)
    if src1.type != vdt:
        if src1.type != C.GGML_TYPE_F32:
            raise GGMLError(f"mul_mat: src1 must be F32 when it needs conversion to {vdt}")
        bs = blck_size(vdt)
        nbw0 = type_size(vdt)
        blk0 = (ith * ne10 // bs) // nth
        blk1 = ((ith + 1) * ne10 // bs) // nth
        if blk1 > blk0:
            arr, off = tensor_bytes(src1)
            # this thread's block range of every row of src1
            x = np.ndarray(shape=(ne13, ne12, ne11, (blk1 - blk0) * bs), dtype=np.float32, buffer=arr,
                           offset=off + blk0 * bs * nb10, strides=(nb13, nb12, nb11, nb10))
            q = cq.from_float(vdt, np.ascontiguousarray(x).reshape(-1, (blk1 - blk0) * bs))
            w = wdata[:ne13 * ne12 * ne11 * row_vd].reshape(ne13 * ne12 * ne11, row_vd)
            w[:, blk0 * nbw0:blk1 * nbw0] = q.reshape(ne13 * ne12 * ne11, -1)
    tp = params.threadpool
    if ith == 0 and tp is not None:
        # every thread starts at its own chunk ith, so the first unclaimed chunk is nth
        tp.current_chunk = nth
    params.barrier()

    if USE_LLAMAFILE and src1.type != vdt:
        # src1 converted to vec_dot_type in wdata: contiguous rows of row_vd bytes
        nbw = (row_vd, row_vd * ne11, row_vd * ne11 * ne12)
        if _llamafile_all(params, dst, (wdata, 0), (0,) + nbw, row_vd // type_size(vdt), vdt, r2, r3):
            return

    nr0 = ne0
    nr1 = ne1 * ne2 * ne3
    chunk_size = 64 if (nr0 == 1 or nr1 == 1) else 16
    nchunk0 = (nr0 + chunk_size - 1) // chunk_size
    nchunk1 = (nr1 + chunk_size - 1) // chunk_size
    if nchunk0 * nchunk1 < nth * 4:
        # poor chunking for this many threads: chunk by thread along the larger side
        nchunk0 = nth if nr0 > nr1 else 1
        nchunk1 = 1 if nr0 > nr1 else nth
    dr0 = (nr0 + nchunk0 - 1) // nchunk0
    dr1 = (nr1 + nchunk1 - 1) // nchunk1

    # ggml_compute_forward_mul_mat_tiled takes K-quant batches of >= 8 rows first (its own float order)
    tiled = (src0.type in cq.TILED_TYPES and src1.type == C.GGML_TYPE_F32 and ne11 >= cq.TILED_MIN_BATCH
             and not getattr(params, "use_ref", False))
    current_chunk = ith
    while current_chunk < nchunk0 * nchunk1:
        ith0 = current_chunk % nchunk0
        ith1 = current_chunk // nchunk0
        ir0_start = dr0 * ith0
        ir0_end = min(ir0_start + dr0, nr0)
        ir1_start = dr1 * ith1
        ir1_end = min(ir1_start + dr1, nr1)
        t0 = time.perf_counter_ns() if trace.active else 0
        _one_chunk(params, dst, src0, src1, vdt, row_vd, ir0_start, ir0_end, ir1_start, ir1_end, tiled)
        if trace.active:
            trace.emit("cpu.chunk", ith=ith, node=dst.name, chunk=current_chunk, nchunk=(nchunk0, nchunk1),
                       ir0=(ir0_start, ir0_end), ir1=(ir1_start, ir1_end), t_start=t0, t_end=time.perf_counter_ns())
        if nth >= nchunk0 * nchunk1:
            break
        current_chunk = tp.chunk_fetch_add(1) if tp is not None else current_chunk + nth


def _llamafile_all(params, dst, b_ptr, nb_b, ldb: int, btype: int, r2: int, r3: int) -> bool:
    """One ``llamafile_sgemm`` per (i12, i13) matrix of dst, as ggml_compute_forward_mul_mat's GGML_USE_LLAMAFILE
    blocks do; False at the first refusal (then ggml goes on with its own path: ``goto UseGgmlGemm``)."""
    src0 = dst.src[0]
    a_arr, a_off = tensor_bytes(src0)
    d_arr, d_off = tensor_bytes(dst)
    nb01, nb02, nb03 = src0.strides[1:]
    nb1, nb2, nb3 = dst.strides[1:]
    ne12, ne13 = dst.ne[2], dst.ne[3]
    for i13 in range(ne13):
        for i12 in range(ne12):
            if not llamafile.llamafile_sgemm(
                    params, src0.ne[1], dst.ne[1], src0.ne[0] // blck_size(src0.type),
                    (a_arr, a_off + i12 // r2 * nb02 + i13 // r3 * nb03), nb01 // type_size(src0.type),
                    (b_ptr[0], b_ptr[1] + i12 * nb_b[2] + i13 * nb_b[3]), ldb,
                    (d_arr, d_off + i12 * nb2 + i13 * nb3), nb1 // 4,
                    src0.type, btype, dst.type, trace_as=(dst.name, i13 * ne12 + i12, ne12 * ne13)):
                return False
    return True


def mul_mat_kernel(dst, nth: int = 1) -> str:
    """Which kernel ``forward_mul_mat`` runs for this node: KERNEL_SGEMM (llamafile's tinyBLAS) or KERNEL_VEC_DOT
    (the conditions of the two llamafile_sgemm calls, evaluated without computing; the thread count changes only
    tinyBLAS's tiling, never whether it takes the matrix)."""
    src0, src1 = dst.src[0], dst.src[1]
    m, n, k = src0.ne[1], dst.ne[1], src0.ne[0] // blck_size(src0.type)
    if USE_LLAMAFILE:
        if is_contiguous(src1) and llamafile.accepts(m, n, k, src0.type, src1.type, dst.type, nth):
            return KERNEL_SGEMM
        vdt = cq.VEC_DOT_TYPE[src0.type]
        if src1.type != vdt and llamafile.accepts(m, n, k, src0.type, vdt, dst.type, nth):
            return KERNEL_SGEMM
    return KERNEL_VEC_DOT


def cpu_kernel(dst, nth: int = 1) -> str:
    """The kernel the CPU backend runs for a MUL_MAT node: an extra buffer type first (as
    ``ggml_cpu_extra_compute_forward``: CPU_REPACK weights), else ``mul_mat_kernel``."""
    if repack.in_use() and any(extra.context.get_tensor_traits(dst) is not None
                               for extra in traits.get_extra_buffer_types()):
        return KERNEL_REPACK
    return mul_mat_kernel(dst, nth)


def _one_chunk(params, dst, src0, src1, vdt, row_vd, ir0_start, ir0_end, ir1_start, ir1_end, tiled=False):
    if ir0_start >= ir0_end or ir1_start >= ir1_end:
        return
    ne00, ne01, ne02, ne03 = src0.shape
    ne10, ne11, ne12, ne13 = src1.shape
    ne1 = dst.ne[1]
    nb1, nb2, nb3 = dst.strides[1:]
    r2, r3 = ne12 // ne02, ne13 // ne03
    rb0 = row_size(src0.type, ne00)
    converted = src1.type != vdt
    src1_cont = is_contiguous(src1)
    if converted:
        w_arr, w_off = params.wdata, 0
    else:
        w_arr, w_off = tensor_bytes(src1)
    d_arr, d_off = tensor_bytes(dst)

    # walk the src1 columns of the chunk, grouped by the (i12, i13) matrix they belong to
    xs, ys, outs = [], [], []
    ir1 = ir1_start
    while ir1 < ir1_end:
        i13 = ir1 // (ne12 * ne1)
        i12 = (ir1 - i13 * ne12 * ne1) // ne1
        i11 = ir1 - i13 * ne12 * ne1 - i12 * ne1
        n_cols = min(ir1_end - ir1, ne1 - i11)       # stay inside this (i12, i13) matrix
        i03, i02 = i13 // r3, i12 // r2
        x = _rows(src0, i02, i03, ir0_start, ir0_end, rb0)
        if converted or src1_cont:
            start = w_off + (i11 + i12 * ne11 + i13 * ne12 * ne11) * row_vd
            y = np.ndarray(shape=(n_cols, row_vd), dtype=np.uint8, buffer=w_arr, offset=start, strides=(row_vd, 1))
        else:
            nb = src1.strides
            y = np.ndarray(shape=(n_cols, row_vd), dtype=np.uint8, buffer=w_arr,
                           offset=w_off + i11 * nb[1] + i12 * nb[2] + i13 * nb[3], strides=(nb[1], 1))
        out = np.ndarray(shape=(n_cols, ir0_end - ir0_start), dtype=np.float32, buffer=d_arr,
                         offset=d_off + i11 * nb1 + i12 * nb2 + i13 * nb3 + ir0_start * 4, strides=(nb1, 4))
        xs.append(x)
        ys.append(y)
        outs.append(out)
        ir1 += n_cols
    # every element is one vec_dot: the groups are computed together where that is faster (F32 / F16 / BF16)
    for out, res in zip(outs, cq.vec_dot_groups(src0.type, xs, ys, tiled)):     # res: (n_cols, rows) float32
        out[...] = res
