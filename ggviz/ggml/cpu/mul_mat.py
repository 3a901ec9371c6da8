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
from .common import CACHE_LINE_SIZE, ComputeParams, tensor_bytes
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


def _src1_to_vec_dot_type(params, src1, vdt, op: str) -> None:
    """src1 converted to vec_dot_type into the start of the work buffer, this thread's share of blocks of every
    row (mul_mat and mul_mat_id convert alike; ggml-cpu.c writes the loop in each)."""
    if src1.type == vdt:
        return
    if src1.type != C.GGML_TYPE_F32:
        raise GGMLError(f"{op}: src1 must be F32 when it needs conversion to {vdt}")
    ith, nth = params.ith, params.nth
    ne10, ne11, ne12, ne13 = src1.shape
    nb10, nb11, nb12, nb13 = src1.strides
    bs = blck_size(vdt)
    nbw0 = type_size(vdt)
    row_vd = row_size(vdt, ne10)
    blk0 = (ith * ne10 // bs) // nth
    blk1 = ((ith + 1) * ne10 // bs) // nth
    if blk1 > blk0:
        arr, off = tensor_bytes(src1)
        # this thread's block range of every row of src1
        x = np.ndarray(shape=(ne13, ne12, ne11, (blk1 - blk0) * bs), dtype=np.float32, buffer=arr,
                       offset=off + blk0 * bs * nb10, strides=(nb13, nb12, nb11, nb10))
        q = cq.from_float(vdt, np.ascontiguousarray(x).reshape(-1, (blk1 - blk0) * bs))
        w = params.wdata[:ne13 * ne12 * ne11 * row_vd].reshape(ne13 * ne12 * ne11, row_vd)
        w[:, blk0 * nbw0:blk1 * nbw0] = q.reshape(ne13 * ne12 * ne11, -1)


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
    _src1_to_vec_dot_type(params, src1, vdt, "mul_mat")
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


# ---------------------------------------------------------------------------------------------------------------
# MUL_MAT_ID: ggml_compute_forward_mul_mat_id (expert routing)
# ---------------------------------------------------------------------------------------------------------------

MMID_ROW_BYTES = 8          # struct mmid_row_mapping {int32_t i1; int32_t i2;}


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def mul_mat_id_wdata_layout(dst) -> dict:
    """Where ggml_compute_forward_mul_mat_id puts its parts in the work buffer (byte offsets from wdata, each
    aligned as its ``incr_ptr_aligned``): src1 converted to vec_dot_type (if it must be), ``matrix_row_counts``
    [n_as] int64, ``matrix_rows`` [n_as][n_ids * n_tokens] mmid_row_mapping, one cache line of ``current_chunk``
    per expert. ggviz: tiled.cpp's per-thread scratch, reserved last, is not laid out (ggviz's tiled arithmetic
    needs none; it is 0 bytes for every type but Q4_K / Q6_K)."""
    src0, src1, ids = dst.src[0], dst.src[1], dst.src[2]
    vdt = cq.VEC_DOT_TYPE[src0.type]
    n_as = int(src0.ne[2])
    off = 0
    conv = 0
    if src1.type != vdt:
        conv = row_size(vdt, int(np.prod(src1.shape)))
        off = conv
    counts = _pad(off, 8)
    rows = _pad(counts + n_as * 8, 8)
    chunks = _pad(rows + n_as * int(ids.ne[0]) * int(ids.ne[1]) * MMID_ROW_BYTES, CACHE_LINE_SIZE)
    return {"src1": (0, conv), "counts": counts, "rows": rows, "chunks": chunks,
            "end": chunks + CACHE_LINE_SIZE * n_as}


def mul_mat_id_work_size(node) -> int:
    """ggml_graph_plan's GGML_OP_MUL_MAT_ID case: each part plus the alignment slack it may need."""
    src0, src1, ids = node.src[0], node.src[1], node.src[2]
    vdt = cq.VEC_DOT_TYPE[src0.type]
    n_as = int(src0.ne[2])
    cur = 0
    if src1.type != vdt:
        cur += row_size(vdt, int(np.prod(src1.shape))) + 8
    cur += n_as * 8 + 8                                                  # matrix_row_counts
    cur += n_as * int(ids.ne[0]) * int(ids.ne[1]) * MMID_ROW_BYTES + 8   # matrix_rows
    cur += CACHE_LINE_SIZE * n_as + CACHE_LINE_SIZE                      # atomic_current_chunk
    return cur


def mul_mat_id_row_mapping(ids, n_as: int) -> tuple[np.ndarray, np.ndarray]:
    """The grouping thread 0 does before the barrier: for each expert, the (i1, i2) = (slot in the token's expert
    list, token) pairs routed to it, in the order ggml appends them (token by token, slot by slot). Returns
    ``counts`` [n_as] int64 and ``rows`` [n_as, n_ids * n_tokens, 2] int32 (only the first counts[e] of row e are
    set; the rest is zero here, whatever the work buffer held in ggml). An id outside 0..n_as-1 is a GGMLError
    (ggml only asserts it in a debug build and then reads out of bounds)."""
    n_ids, n_tok = int(ids.ne[0]), int(ids.ne[1])
    arr, off = tensor_bytes(ids)
    nb0, nb1 = int(ids.nb[0]), int(ids.nb[1])
    idv = np.ndarray(shape=(n_tok, n_ids), dtype=np.int32, buffer=arr, offset=off, strides=(nb1, nb0))
    bad = (idv < 0) | (idv >= n_as)
    if bad.any():
        t, k = (int(v) for v in np.argwhere(bad)[0])
        raise GGMLError(f"mul_mat_id: ids[{k}, {t}] = {int(idv[t, k])} is not an expert (the matrices are 0.."
                        f"{n_as - 1})")
    counts = np.zeros(n_as, np.int64)
    rows = np.zeros((n_as, n_ids * n_tok, 2), np.int32)
    for iid1 in range(n_tok):
        for i in range(n_ids):
            e = int(idv[iid1, i])
            rows[e, counts[e]] = (i, iid1)
            counts[e] += 1
    return counts, rows


def forward_mul_mat_id(params: ComputeParams, dst) -> None:
    """ggml_compute_forward_mul_mat_id: src1 converted to vec_dot_type (each thread its share of the blocks of
    every row, as MUL_MAT), thread 0 groups the (slot, token) pairs by expert into the work buffer, each thread
    resets the chunk counters of the experts ith, ith + nth, ...; after the barrier every thread walks the experts
    in order, and for each expert with rows claims chunks of (expert rows x routed columns) from that expert's own
    counter. A routed column (i1, i2) reads src1 row ``i1 % ne11`` of token i2 and writes dst[:, i1, i2]."""
    src0, src1, ids = dst.src[0], dst.src[1], dst.src[2]
    ne00, ne01, ne02, _ = src0.shape
    ne10, ne11, ne12, ne13 = src1.shape
    nb10, nb11, nb12, nb13 = src1.strides
    nb0, nb1, nb2, nb3 = dst.strides
    ith, nth = params.ith, params.nth
    vdt = cq.VEC_DOT_TYPE[src0.type]
    if src0.nb[0] != type_size(src0.type) or nb10 != type_size(src1.type):
        raise GGMLError("mul_mat_id: src0/src1 must have contiguous rows (nb[0] == type size)")
    if not (nb0 == 4 and nb0 <= nb1 <= nb2 <= nb3):
        raise GGMLError("mul_mat_id: dst cannot be transposed or permuted")
    n_as = int(ne02)
    n_ids, n_tok = int(ids.ne[0]), int(ids.ne[1])
    lay = mul_mat_id_wdata_layout(dst)
    wdata = params.wdata
    if wdata.nbytes < lay["end"]:
        raise GGMLError(f"mul_mat_id: the work buffer holds {wdata.nbytes} bytes, the op needs {lay['end']}")
    counts = wdata[lay["counts"]:lay["counts"] + n_as * 8].view(np.int64)
    rows = wdata[lay["rows"]:lay["rows"] + n_as * n_ids * n_tok * MMID_ROW_BYTES].view(np.int32).reshape(
        n_as, n_ids * n_tok, 2)
    chunk_ctr = wdata[lay["chunks"]:lay["end"]].view(np.int32).reshape(n_as, CACHE_LINE_SIZE // 4)

    row_vd = row_size(vdt, ne10)
    _src1_to_vec_dot_type(params, src1, vdt, "mul_mat_id")
    if ith == 0:
        c, r = mul_mat_id_row_mapping(ids, n_as)
        counts[:] = c
        for e in range(n_as):
            rows[e, :c[e]] = r[e, :c[e]]
        if trace.active:
            trace.emit("cpu.mul_mat_id_rows", node=dst.name, counts=c.tolist(),
                       rows=[r[e, :c[e]].tolist() for e in range(n_as)])
    for cur_a in range(ith, n_as, nth):
        chunk_ctr[cur_a, 0] = nth
    params.barrier()

    tp = params.threadpool
    lock = getattr(tp, "_chunk_lock", None)
    converted = src1.type != vdt
    src1_cont = is_contiguous(src1)
    if converted:
        w_arr, w_off = wdata, 0
    else:
        w_arr, w_off = tensor_bytes(src1)
    d_arr, d_off = tensor_bytes(dst)
    a_arr, a_off = tensor_bytes(src0)
    rb0 = row_size(src0.type, ne00)
    for cur_a in range(n_as):
        cne1 = int(counts[cur_a])
        if cne1 == 0:
            continue
        # tiled.cpp takes an expert with >= 8 routed rows of a K-quant (its own float order; ggviz: the chunks
        # below still split the work, tiled.cpp's own split between threads is not mirrored -- the bits are)
        tiled = (src0.type in cq.TILED_TYPES and src1.type == C.GGML_TYPE_F32 and cne1 >= cq.TILED_MIN_BATCH
                 and not params.use_ref)
        nr0, nr1 = int(ne01), cne1
        chunk_size = 64 if (nr0 == 1 or nr1 == 1) else 16
        nchunk0 = (nr0 + chunk_size - 1) // chunk_size
        nchunk1 = (nr1 + chunk_size - 1) // chunk_size
        if nchunk0 * nchunk1 < nth * 4:      # (ggml also does this on a NUMA system; ggviz knows none)
            nchunk0 = nth if nr0 > nr1 else 1
            nchunk1 = 1 if nr0 > nr1 else nth
        dr0 = (nr0 + nchunk0 - 1) // nchunk0
        dr1 = (nr1 + nchunk1 - 1) // nchunk1
        current_chunk = ith
        while current_chunk < nchunk0 * nchunk1:
            ith0, ith1 = current_chunk % nchunk0, current_chunk // nchunk0
            ir0_start, ir1_start = dr0 * ith0, dr1 * ith1
            ir0_end, ir1_end = min(ir0_start + dr0, nr0), min(ir1_start + dr1, nr1)
            t0 = time.perf_counter_ns() if trace.active else 0
            if ir0_start < ir0_end and ir1_start < ir1_end:
                mapped = rows[cur_a, ir1_start:ir1_end]            # (i1, i2): slot, token
                i1s, i2s = mapped[:, 0].astype(np.int64), mapped[:, 1].astype(np.int64)
                i11s = i1s % ne11
                # as ggml: converted or contiguous src1 is indexed as packed rows, else through src1's strides
                if converted or src1_cont:
                    col_off = w_off + (i11s + i2s * ne11) * row_vd
                else:
                    col_off = w_off + i11s * nb11 + i2s * nb12
                y = np.stack([np.frombuffer(w_arr, np.uint8, row_vd, int(o)) for o in col_off])
                x = np.ndarray(shape=(ir0_end - ir0_start, rb0), dtype=np.uint8, buffer=a_arr,
                               offset=a_off + cur_a * src0.nb[2] + ir0_start * src0.nb[1], strides=(src0.nb[1], 1))
                res = cq.vec_dot_groups(src0.type, [x], [y], tiled)[0]     # (columns, rows) float32
                for k in range(len(mapped)):
                    out = np.ndarray(shape=(ir0_end - ir0_start,), dtype=np.float32, buffer=d_arr,
                                     offset=d_off + int(i1s[k]) * nb1 + int(i2s[k]) * nb2 + ir0_start * 4)
                    out[...] = res[k]
            if trace.active:
                trace.emit("cpu.chunk", ith=ith, node=dst.name, chunk=current_chunk, nchunk=(nchunk0, nchunk1),
                           ir0=(ir0_start, ir0_end), ir1=(ir1_start, ir1_end), expert=cur_a, t_start=t0,
                           t_end=time.perf_counter_ns())
            if nth >= nchunk0 * nchunk1:
                break
            if lock is not None:
                with lock:       # atomic_fetch_add on this expert's counter
                    current_chunk = int(chunk_ctr[cur_a, 0])
                    chunk_ctr[cur_a, 0] = current_chunk + 1
            else:
                current_chunk += nth
