"""The compiled kernels (Numba) of ggviz's fast path: ggml-cpu's SIMD kernels, compiled instead of emulated.

The faithful kernels (``cpu/ops.py``, ``cpu/mul_mat.py``) reproduce ggml-cpu's arithmetic with NumPy, one node at a
time, from Python threads. This module is the same arithmetic compiled with Numba (``@njit(cache=True, nogil=True)``,
no fastmath), for graphs whose weights sit in the CPU_REPACK extra buffer type (``cpu/repack.py``):

* MUL_MAT with repacked Q4_0 / Q4_1 / Q8_0 weights: src1 quantized to Q8_0 / Q8_1 exactly as ggml's AVX2
  ``quantize_row_q8_0/1`` does (``127/amax``, round-half-even, F16C scales, ``s`` from the int32 sums), then
  ``ggml_vec_dot_{q4_0,q8_0}_q8_0`` / ``ggml_vec_dot_q4_1_q8_1`` operation for operation: per row 8 float lanes,
  lane u accumulating ``fma(d_x*d_y, P_u, acc_u)`` where P_u is the exact integer dot product of the block's
  elements 4u..4u+3 (``maddubs`` + ``madd``), then ``hsum_float_8`` (+ ``summs`` for Q4_1). The weights are
  interleaved 8 rows at a time in 4-byte groups (like ggml's ``block_q4_0x8``), so one ``maddubs`` serves 8 rows:
  a GEMV/GEMM micro-kernel written in LLVM IR with the AVX2 intrinsics (``pmaddubsw``, ``pmaddwd``, ``psignb``;
  generic vector IR on other CPUs). Results are bit-identical to the real ggml 0.20.2 on an AVX2 machine.
* MUL_MAT with F16 / F32 src0 (the KV-cache attention): ``ggml_vec_dot_f16`` / ``ggml_vec_dot_f32`` (4 x 8 FMA
  accumulators, ``GGML_F32x8_REDUCE``), also bit-identical to ggml.
* the other ops of a llama graph, bit-identical to the faithful kernels: GET_ROWS, RMS_NORM (and the
  RMS_NORM+MUL fusion), ADD/SUB/MUL/DIV, ROPE (normal and NeoX, glibc's ``cosf``/``sinf`` reproduced), SET_ROWS,
  SOFT_MAX (``ggml_v_expf``'s AVX2 polynomial with real FMAs, glibc's ``expf`` for row tails), SWIGLU
  (``ggml_v_silu``), CPY/CONT/DUP. (NaN payloads may differ.)
* PowerInfer's sparse FFN (MUL_MAT_SPARSE, AXPY, their GPU halves, RELU / SILU): ``sparse.py``, called from
  ``compute_node``; the row helpers both use (src1 quantization, ``vec_dot_f16/f32``) live in ``rowdot.py``.
* a compiled ``ggml_graph_compute_thread``: a graph is turned once into a table of int64/float64 rows (one per
  node: opcode, tensor addresses, ne, nb, op params; ``repack.FastGraph``), and every thread of the pool walks the
  table inside one ``nogil`` call, with ggml's counter barrier (``n_barrier``/``n_barrier_passed``, real atomics;
  a waiter spins ~40 us, then sleeps on a futex) after each node and ggml's shared ``current_chunk`` counter for
  MUL_MAT. No Python runs between nodes, which is what makes a 600-node decode graph fast on two cores.

Kernels read and write tensor memory through raw addresses (``tensor->data``), exactly like the C kernels.
``HAVE_NUMBA`` is False when Numba cannot be imported (or ``GGVIZ_NO_NUMBA=1``): then nothing here is compiled,
the CPU_REPACK buffer type is not offered (as when ggml is built without GGML_USE_CPU_REPACK) and every graph runs
the faithful NumPy kernels. ``warmup()`` compiles everything (about 15-25 s the first time, then Numba's on-disk
cache loads it in a fraction of a second).
"""
from __future__ import annotations

import time

import numpy as np

from . import blockdot, fattn, gemma_ops, sparse
from .intrinsics import (
    HAVE_AVX2,
    SCALES_F16,
    atomic_add,
    atomic_store,
    binop_row,
    compiled,
    copy_bytes,
    cvt_f16_f32_row,
    cvt_f32_f16_row,
    dot_f16_rows,
    dot_f16_rows16,
    f32_to_f16,
    fmaf,
    fp16_to_fp32,
    fp32_to_fp16,
    glibc_expf,
    glibc_sincosf,
    ld_f32,
    ld_i8,
    ld_i32,
    ld_i64,
    ld_u8,
    ld_u16,
    ld_u32,
    rdtsc,
    rq_q4_0_1,
    rq_q4_0_4,
    rq_q4_1_1,
    rq_q4_1_4,
    rq_q8_0_1,
    rq_q8_0_4,
    scale_row,
    soft_max_exp8,
    soft_max_exp16,
    soft_max_prep,
    st_f32,
    st_u16,
    st_u32,
    swiglu8,
    swiglu16,
)
from .program import (
    CPY_DTYPE,
    CPY_STYPE,
    DATA,
    DST,
    ERR_GET_ROWS_INDEX,
    ERR_SET_ROWS_INDEX,
    GEMM_COLS,
    GET_ROWS_ITYPE,
    GET_ROWS_TYPE,
    MMF_LANES,
    MMF_TYPE,
    MMQ_D,
    MMQ_M,
    MMQ_QS,
    MMQ_TYPE,
    NB0,
    NB1,
    NB2,
    NB3,
    NCOL,
    NE0,
    NE1,
    NE2,
    NE3,
    NFCOL,
    OP,
    OP_BINARY,
    OP_CPY,
    OP_GEGLU,
    OP_AXPY,
    OP_GET_ROWS,
    OP_MUL_MAT_F,
    OP_MUL_MAT_Q,
    OP_MUL_MAT_SPARSE,
    OP_RMS_NORM,
    OP_ROPE,
    OP_SCALE,
    OP_SET_ROWS,
    OP_FLASH_ATTN,
    OP_SOFT_MAX,
    OP_SWIGLU,
    OP_UNARY,
    RMS_NORM_EPS,
    ROPE_CORR0,
    ROPE_CORR1,
    ROPE_EXT_FACTOR,
    ROPE_FREQ_SCALE,
    ROPE_MSCALE,
    ROPE_N_DIMS,
    ROPE_NEOX,
    ROPE_SIN_SIGN,
    ROPE_THETA_SCALE,
    S0,
    S1,
    S2,
    SET_ROWS_ITYPE,
    SET_ROWS_TYPE,
    SOFT_MAX_LANES,
    SOFT_MAX_MTYPE,
    SOFT_MAX_SCALE,
    SOFT_MAX_SLOPE,
    SUBOP,
    SWIGLU_LANES,
    SWIGLU_NC,
    SWIGLU_NROWS,
    SWIGLU_SWAPPED,
    SYNC_CHUNK,
    SYNC_TICKS,
    T_F16,
    T_F32,
    T_I32,
    T_Q4_0,
    T_Q4_1,
    T_Q8_0,
    TR_CHUNK,
    TR_NODE,
    TRW_FINAL,
    TRW_KERNEL,
    TRW_NODE,
)
from .kquants import dequantize_row as kq_dequantize_row
from .kquants import k_mul_mat_kq
from .program import T_Q4_K, T_Q5_0, T_Q6_K
from .rowdot import mmq_layout, quantize_row_q8, vec_dot_f16, vec_dot_f16_16, vec_dot_f32
from .sgemm import Q5_RAW_COLS, Q5_ROWS, Q5_UNPACKED, llamafile_mul_mat_f, q5_0_rows
from .sync import new_sync, set_error, tr_rec, traced, traced_barrier

F32 = np.float32

# =================================================================================================================
# repacked MUL_MAT (tensor_traits::forward_mul_mat of repack.cpp)
# =================================================================================================================

@compiled
def mmq_quantize(src1, ne10, ne11, ne12, nb11, nb12, nb10, wdata, with_sum, ith, nth):
    """Thread ith's share of the src1 rows: rows i11 = 4*ith, 4*(ith+nth), ... in groups of 4 (ggml's
    ggml_quantize_mat_t), then the ne11 % 4 leftovers one per thread."""
    nb = ne10 // 32
    n = ne11 * ne12
    o_q, o_d, o_s, o_sum, total = mmq_layout(ne10, n)
    for i12 in range(ne12):
        full = ne11 - ne11 % 4
        i11 = ith * 4
        while i11 < full:
            for r in range(4):
                row = i12 * ne11 + i11 + r
                quantize_row_q8(src1 + (i11 + r) * nb11 + i12 * nb12, nb10, ne10,
                                wdata + o_q + row * ne10, wdata + o_d + row * nb * 4,
                                wdata + o_s + row * nb * 4, wdata + o_sum + row * nb * 4, with_sum)
            i11 += nth * 4
        i11 = full + ith
        while i11 < ne11:
            row = i12 * ne11 + i11
            quantize_row_q8(src1 + i11 * nb11 + i12 * nb12, nb10, ne10,
                            wdata + o_q + row * ne10, wdata + o_d + row * nb * 4,
                            wdata + o_s + row * nb * 4, wdata + o_sum + row * nb * 4, with_sum)
            i11 += nth

@compiled
def mmq_chunk(qtype, xq, xd, xm, ne00, r0, r1, dst, nb1, nb2, i12, ne11, ne10, wdata, ntot, x0, xrs):
    """Rows [r0, r1) (multiples of 8) of src0 times every column of plane i12 of the quantized src1. Q5_0: from
    Q5_RAW_COLS columns on, ggml's own blocks (x0: src0->data, xrs: nb01) through tinyBLAS_Q0's tiles (sgemm.py),
    which unpack a row tile once for all the columns; fewer columns take the repacked Q8_0 layout (xq, xd)."""
    nb = ne00 // 32
    o_q, o_d, o_s, o_sum, total = mmq_layout(ne10, ntot)
    if qtype == T_Q5_0:
        if ne11 >= Q5_RAW_COLS:
            scratch = np.empty(Q5_ROWS * nb * (Q5_UNPACKED + 4), np.uint8)
            row = i12 * ne11
            q5_0_rows(x0, xrs, r0, r1, nb, wdata + o_q + row * ne10, ne10, wdata + o_d + row * nb * 4,
                      nb * 4, ne11, dst + i12 * nb2, nb1, scratch.ctypes.data)
            return
        qtype = T_Q8_0          # expanded to Q8_0 (levels q - 16): ggml_vec_dot_q5_0_q8_0's arithmetic
    gq = nb * (128 if qtype != T_Q8_0 else 256)
    gd = nb * (16 if SCALES_F16 else 32)
    yqs = ne10
    yds = nb * 4
    for g in range(r0 // 8, r1 // 8):
        pq = xq + g * gq
        pd = xd + g * gd
        pm = xm + g * gd
        c = 0
        while c < ne11:
            row = i12 * ne11 + c
            yq = wdata + o_q + row * ne10
            yd = wdata + o_d + row * yds
            ys = wdata + o_s + row * yds
            ysm = wdata + o_sum + row * yds
            out = dst + c * nb1 + i12 * nb2 + g * 32
            if c + GEMM_COLS <= ne11:
                if qtype == T_Q4_1:
                    rq_q4_1_4(out, nb1, pq, pd, pm, nb, yq, yd, ys, ysm, yqs, yds)
                elif qtype == T_Q4_0:
                    rq_q4_0_4(out, nb1, pq, pd, pm, nb, yq, yd, ys, ysm, yqs, yds)
                else:
                    rq_q8_0_4(out, nb1, pq, pd, pm, nb, yq, yd, ys, ysm, yqs, yds)
                c += GEMM_COLS
            else:
                if qtype == T_Q4_1:
                    rq_q4_1_1(out, nb1, pq, pd, pm, nb, yq, yd, ys, ysm, yqs, yds)
                elif qtype == T_Q4_0:
                    rq_q4_0_1(out, nb1, pq, pd, pm, nb, yq, yd, ys, ysm, yqs, yds)
                else:
                    rq_q8_0_1(out, nb1, pq, pd, pm, nb, yq, yd, ys, ysm, yqs, yds)
                c += 1

@compiled
def mmq_nchunk(nr0, nth):
    """repack.cpp's chunking of src0 rows: 4 chunks per thread, at least NB_COLS (8) rows each."""
    nth_scaled = nth * 4
    chunk_size0 = (nr0 + nth_scaled - 1) // nth_scaled
    nchunk0 = (nr0 + chunk_size0 - 1) // chunk_size0
    min_chunk = 8
    if nchunk0 > 0 and (nr0 // nchunk0) < min_chunk and nr0 >= min_chunk:
        nchunk0 = (nr0 + min_chunk - 1) // min_chunk
    dr0 = (nr0 + nchunk0 - 1) // nchunk0
    if nth == 1 or (nchunk0 < nth and (nr0 + nth - 1) // nth >= min_chunk):
        nchunk0 = nth
        dr0 = (nr0 + nchunk0 - 1) // nchunk0
    max_nchunk = (nr0 + min_chunk - 1) // min_chunk
    if nchunk0 > max_nchunk:
        nchunk0 = max_nchunk
    return nchunk0, dr0

@compiled
def mmq_chunk_rows(current_chunk, nchunk0, dr0, nr0):
    ith0 = current_chunk % nchunk0
    s = dr0 * ith0
    e = min(s + dr0, nr0)
    if s % 8:
        s = s + 8 - s % 8
    if e % 8:
        e = e + 8 - e % 8
    e = min(e, nr0)
    return s, e

@compiled
def k_mul_mat_q(P, F, k, ith, nth, sync, wdata):
    qtype = P[k, MMQ_TYPE]
    if qtype == T_Q4_K or qtype == T_Q6_K:      # Gemma-3's K-quant weights: kquants.py
        k_mul_mat_kq(P, k, ith, nth, sync, wdata)
        return
    xq, xd, xm = P[k, MMQ_QS], P[k, MMQ_D], P[k, MMQ_M]
    ne00, ne01 = P[k, S0 + NE0], P[k, S0 + NE1]
    src1 = P[k, S1 + DATA]
    ne10, ne11, ne12 = P[k, S1 + NE0], P[k, S1 + NE1], P[k, S1 + NE2]
    nb10, nb11, nb12 = P[k, S1 + NB0], P[k, S1 + NB1], P[k, S1 + NB2]
    dst = P[k, DST + DATA]
    nb1, nb2 = P[k, DST + NB1], P[k, DST + NB2]
    mmq_quantize(src1, ne10, ne11, ne12, nb11, nb12, nb10, wdata, qtype == T_Q4_1, ith, nth)
    nchunk0, dr0 = mmq_nchunk(ne01, nth)
    nchunk1 = ne12
    if ith == 0:
        atomic_store(sync + 8 * SYNC_CHUNK, nth)
    tr = traced(sync)
    traced_barrier(sync, nth, ith, k, TRW_KERNEL, tr)
    current = ith
    while current < nchunk0 * nchunk1:
        s, e = mmq_chunk_rows(current, nchunk0, dr0, ne01)
        if s < e:
            t0 = rdtsc() if tr else 0
            mmq_chunk(qtype, xq, xd, xm, ne00, s, e, dst, nb1, nb2, current // nchunk0, ne11, ne10, wdata,
                      ne11 * ne12, P[k, S0 + DATA], P[k, S0 + NB1])
            if tr:
                i12 = current // nchunk0
                tr_rec(sync, ith, TR_CHUNK, k, current, s, e, i12 * ne11, (i12 + 1) * ne11,
                       (nchunk0 << 32) | nchunk1, t0, rdtsc())
        current = atomic_add(sync + 8 * SYNC_CHUNK, 1)

# =================================================================================================================
# MUL_MAT with F16 / F32 src0 (ggml_compute_forward_mul_mat + vec_dot_f16 / vec_dot_f32)
# =================================================================================================================

@compiled
def k_mul_mat_f(P, F, k, ith, nth, sync, wdata):
    t0 = P[k, MMF_TYPE]
    src0, src1, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA]
    ne00, ne02, ne03 = P[k, S0 + NE0], P[k, S0 + NE2], P[k, S0 + NE3]
    nb01, nb02, nb03 = P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    ne10, ne11, ne12, ne13 = P[k, S1 + NE0], P[k, S1 + NE1], P[k, S1 + NE2], P[k, S1 + NE3]
    nb10, nb11, nb12, nb13 = P[k, S1 + NB0], P[k, S1 + NB1], P[k, S1 + NB2], P[k, S1 + NB3]
    ne0, ne1 = P[k, DST + NE0], P[k, DST + NE1]
    nb1, nb2, nb3 = P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    if llamafile_mul_mat_f(P, k, ith, nth, sync, wdata, False):     # GGML_USE_LLAMAFILE, src1 as it is
        return
    es = 2 if t0 == T_F16 else 4
    row_vd = ne10 * es
    converted = t0 == T_F16
    if converted:
        # src1 -> F16 in wdata: thread ith converts its share of every row
        blk0 = (ith * ne10) // nth
        blk1 = ((ith + 1) * ne10) // nth
        for i13 in range(ne13):
            for i12 in range(ne12):
                for i11 in range(ne11):
                    xr = src1 + i11 * nb11 + i12 * nb12 + i13 * nb13
                    wr = wdata + ((i13 * ne12 + i12) * ne11 + i11) * row_vd
                    if HAVE_AVX2 and nb10 == 4:
                        cvt_f32_f16_row(xr + blk0 * 4, blk1 - blk0, wr + 2 * blk0)
                    else:
                        for i in range(blk0, blk1):
                            st_u16(wr + 2 * i, fp32_to_fp16(ld_f32(xr + i * nb10)))
    if ith == 0:
        atomic_store(sync + 8 * SYNC_CHUNK, nth)
    tr = traced(sync)
    traced_barrier(sync, nth, ith, k, TRW_KERNEL, tr)
    if converted and llamafile_mul_mat_f(P, k, ith, nth, sync, wdata, True):     # GGML_USE_LLAMAFILE, src1 as F16
        return
    nr0 = ne0
    nr1 = ne1 * ne12 * ne13
    chunk_size = 64 if (nr0 == 1 or nr1 == 1) else 16
    nchunk0 = (nr0 + chunk_size - 1) // chunk_size
    nchunk1 = (nr1 + chunk_size - 1) // chunk_size
    if nchunk0 * nchunk1 < nth * 4:
        nchunk0 = nth if nr0 > nr1 else 1
        nchunk1 = 1 if nr0 > nr1 else nth
    dr0 = (nr0 + nchunk0 - 1) // nchunk0
    dr1 = (nr1 + nchunk1 - 1) // nchunk1
    r2 = ne12 // ne02
    r3 = ne13 // ne03
    lanes = P[k, MMF_LANES]                 # vec_dot_f16's lanes per accumulator: 8 (AVX2), 16 (AVX-512)
    fast_f16 = HAVE_AVX2 and ne00 % (4 * lanes) == 0
    yf = np.empty(ne00 if fast_f16 else 0, np.float32)
    current = ith
    while current < nchunk0 * nchunk1:
        ith0 = current % nchunk0
        ith1 = current // nchunk0
        ir0s = dr0 * ith0
        ir0e = min(ir0s + dr0, nr0)
        ir1s = dr1 * ith1
        ir1e = min(ir1s + dr1, nr1)
        tc = rdtsc() if tr else 0
        for ir1 in range(ir1s, ir1e):
            i13 = ir1 // (ne12 * ne1)
            i12 = (ir1 - i13 * ne12 * ne1) // ne1
            i11 = ir1 - i13 * ne12 * ne1 - i12 * ne1
            i03 = i13 // r3
            i02 = i12 // r2
            if converted:
                yr = wdata + (i11 + i12 * ne11 + i13 * ne12 * ne11) * row_vd
            else:
                yr = src1 + i11 * nb11 + i12 * nb12 + i13 * nb13
            dr = dst + i11 * nb1 + i12 * nb2 + i13 * nb3
            if converted and fast_f16:
                # widen this column once, then the chunk's rows in one call
                cvt_f16_f32_row(yr, ne00 // 8, yf.ctypes.data)
                if lanes == 16:
                    dot_f16_rows16(src0 + ir0s * nb01 + i02 * nb02 + i03 * nb03, nb01, ir0e - ir0s,
                                   yf.ctypes.data, ne00 // 64, dr + ir0s * 4)
                else:
                    dot_f16_rows(src0 + ir0s * nb01 + i02 * nb02 + i03 * nb03, nb01, ir0e - ir0s,
                                 yf.ctypes.data, ne00 // 32, dr + ir0s * 4)
                continue
            for ir0 in range(ir0s, ir0e):
                xr = src0 + ir0 * nb01 + i02 * nb02 + i03 * nb03
                if converted and lanes == 16:
                    v = vec_dot_f16_16(ne00, xr, yr)
                elif converted:
                    v = vec_dot_f16(ne00, xr, yr)
                else:
                    v = vec_dot_f32(ne00, xr, yr)
                st_f32(dr + ir0 * 4, v)
        if tr:
            tr_rec(sync, ith, TR_CHUNK, k, current, ir0s, ir0e, ir1s, ir1e, (nchunk0 << 32) | nchunk1,
                   tc, rdtsc())
        if nth >= nchunk0 * nchunk1:
            break
        current = atomic_add(sync + 8 * SYNC_CHUNK, 1)

# =================================================================================================================
# element-wise and row ops
# =================================================================================================================

@compiled
def _thread_range(n, ith, nth):
    dr = (n + nth - 1) // nth
    ir0 = dr * ith
    ir1 = min(ir0 + dr, n)
    return ir0, max(ir0, ir1)

@compiled
def _row_to_f32(t, src, j, ne00):
    """Element j of a row of type t, as float (dequantizing)."""
    if t == T_F32:
        return ld_f32(src + 4 * j)
    if t == T_F16:
        return fp16_to_fp32(ld_u16(src + 2 * j))
    ib = j // 32
    jj = j % 32
    if t == T_Q8_0:
        blk = src + ib * 34
        return F32(ld_i8(blk + 2 + jj)) * fp16_to_fp32(ld_u16(blk))
    if t == T_Q4_0:
        blk = src + ib * 18
        b = np.int32(ld_u8(blk + 2 + (jj % 16)))
        q = (b & 15) if jj < 16 else (b >> 4)
        return F32(q - 8) * fp16_to_fp32(ld_u16(blk))
    # Q4_1
    blk = src + ib * 20
    b = np.int32(ld_u8(blk + 4 + (jj % 16)))
    q = (b & 15) if jj < 16 else (b >> 4)
    return F32(q) * fp16_to_fp32(ld_u16(blk)) + fp16_to_fp32(ld_u16(blk + 2))

@compiled
def k_get_rows(P, F, k, ith, nth, sync, wdata):
    t0 = P[k, GET_ROWS_TYPE]
    ti = P[k, GET_ROWS_ITYPE]
    src0, src1, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA]
    ne00, ne01 = P[k, S0 + NE0], P[k, S0 + NE1]
    nb01, nb02, nb03 = P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    ne10, ne11, ne12 = P[k, S1 + NE0], P[k, S1 + NE1], P[k, S1 + NE2]
    nb10, nb11, nb12 = P[k, S1 + NB0], P[k, S1 + NB1], P[k, S1 + NB2]
    nb1, nb2, nb3 = P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    nr = ne10 * ne11 * ne12
    ir0, ir1 = _thread_range(nr, ith, nth)
    for i in range(ir0, ir1):
        i12 = i // (ne11 * ne10)
        i11 = (i - i12 * ne11 * ne10) // ne10
        i10 = i - i12 * ne11 * ne10 - i11 * ne10
        ia = src1 + i10 * nb10 + i11 * nb11 + i12 * nb12
        i01 = np.int64(ld_i32(ia)) if ti == T_I32 else ld_i64(ia)
        if i01 < 0 or i01 >= ne01:
            set_error(sync, ERR_GET_ROWS_INDEX, k)
            continue
        xr = src0 + i01 * nb01 + i11 * nb02 + i12 * nb03
        yr = dst + i10 * nb1 + i11 * nb2 + i12 * nb3
        if t0 == T_F32:
            for j in range(ne00):
                st_u32(yr + 4 * j, ld_u32(xr + 4 * j))
        elif t0 == T_Q5_0 or t0 == T_Q4_K or t0 == T_Q6_K:         # Gemma-3's types: kquants.py
            kq_dequantize_row(t0, xr, yr, ne00)
        else:
            for j in range(ne00):
                st_f32(yr + 4 * j, _row_to_f32(t0, xr, j, ne00))

@compiled
def k_rms_norm(P, F, k, ith, nth, sync, wdata):
    fused = P[k, SUBOP]
    src0, dst = P[k, S0 + DATA], P[k, DST + DATA]
    ne00, ne01, ne02, ne03 = P[k, S0 + NE0], P[k, S0 + NE1], P[k, S0 + NE2], P[k, S0 + NE3]
    nb01, nb02, nb03 = P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    nb1, nb2, nb3 = P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    w = P[k, S1 + DATA]
    ne11, ne12, ne13 = P[k, S1 + NE1], P[k, S1 + NE2], P[k, S1 + NE3]
    nb11, nb12, nb13 = P[k, S1 + NB1], P[k, S1 + NB2], P[k, S1 + NB3]
    eps = F32(F[k, RMS_NORM_EPS])
    for i03 in range(ne03):
        for i02 in range(ne02):
            for i01 in range(ith, ne01, nth):
                x = src0 + i01 * nb01 + i02 * nb02 + i03 * nb03
                s = np.float64(0.0)
                for i in range(ne00):
                    v = ld_f32(x + 4 * i)
                    s += np.float64(v * v)
                mean = F32(s / ne00)
                scale = F32(1.0) / np.sqrt(mean + eps)
                y = dst + i01 * nb1 + i02 * nb2 + i03 * nb3
                if fused:
                    wr = w + (i01 % ne11) * nb11 + (i02 % ne12) * nb12 + (i03 % ne13) * nb13
                    for i in range(ne00):
                        st_f32(y + 4 * i, (ld_f32(x + 4 * i) * scale) * ld_f32(wr + 4 * i))
                else:
                    for i in range(ne00):
                        st_f32(y + 4 * i, ld_f32(x + 4 * i) * scale)

@compiled
def k_binary(P, F, k, ith, nth, sync, wdata):
    op = P[k, SUBOP]
    src0, src1, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA]
    ne00, ne01, ne02, ne03 = P[k, S0 + NE0], P[k, S0 + NE1], P[k, S0 + NE2], P[k, S0 + NE3]
    nb01, nb02, nb03 = P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    ne10, ne11, ne12, ne13 = P[k, S1 + NE0], P[k, S1 + NE1], P[k, S1 + NE2], P[k, S1 + NE3]
    nb10, nb11, nb12, nb13 = P[k, S1 + NB0], P[k, S1 + NB1], P[k, S1 + NB2], P[k, S1 + NB3]
    nb0, nb1, nb2, nb3 = P[k, DST + NB0], P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    nr = ne01 * ne02 * ne03
    ir0, ir1 = _thread_range(nr, ith, nth)
    for irow in range(ir0, ir1):
        i03 = irow // (ne02 * ne01)
        i02 = (irow - i03 * ne02 * ne01) // ne01
        i01 = irow - i03 * ne02 * ne01 - i02 * ne01
        x = src0 + i01 * nb01 + i02 * nb02 + i03 * nb03
        yb = src1 + (i01 % ne11) * nb11 + (i02 % ne12) * nb12 + (i03 % ne13) * nb13
        d = dst + i01 * nb1 + i02 * nb2 + i03 * nb3
        if ne10 == ne00 and nb10 == 4 and nb0 == 4:
            binop_row(x, yb, d, ne00, op)
            continue
        for i in range(ne00):
            a = ld_f32(x + 4 * i)
            b = ld_f32(yb + (i % ne10) * nb10)
            if op == 0:
                r = a + b
            elif op == 1:
                r = a * b
            elif op == 2:
                r = a - b
            else:
                r = a / b
            st_f32(d + 4 * i, r)

@compiled
def k_rope(P, F, k, ith, nth, sync, wdata):
    src0, pos, dst, ff = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA], P[k, S2 + DATA]
    ne0, ne1, ne2, ne3 = P[k, DST + NE0], P[k, DST + NE1], P[k, DST + NE2], P[k, DST + NE3]
    nb01, nb02, nb03 = P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    nb1, nb2, nb3 = P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    n_dims = P[k, ROPE_N_DIMS]
    neox = P[k, ROPE_NEOX]
    freq_scale = F32(F[k, ROPE_FREQ_SCALE])
    ext_factor = F32(F[k, ROPE_EXT_FACTOR])
    attn_factor = F32(F[k, ROPE_MSCALE])
    theta_scale = F32(F[k, ROPE_THETA_SCALE])
    corr0 = F32(F[k, ROPE_CORR0])
    corr1 = F32(F[k, ROPE_CORR1])
    sin_sign = F32(F[k, ROPE_SIN_SIGN])
    nh = (ne0 + 1) // 2
    cache = np.empty(2 * nh, np.float32)
    nr = ne1 * ne2 * ne3
    ir0, ir1 = _thread_range(nr, ith, nth)
    last_i2 = -1
    mscale = attn_factor       # (the caller folded YaRN's 1 + 0.1*logf(1/freq_scale) in already)
    for irow in range(ir0, ir1):
        i3 = irow // (ne2 * ne1)
        i2 = (irow - i3 * ne2 * ne1) // ne1
        i1 = irow - i3 * ne2 * ne1 - i2 * ne1
        if i2 != last_i2:
            last_i2 = i2
            theta_base = F32(ld_i32(pos + 4 * i2))
            for h in range(nh):
                f = ld_f32(ff + 4 * h) if ff != 0 else F32(1.0)
                theta_extrap = theta_base / f
                theta_interp = freq_scale * theta_extrap
                theta = theta_interp
                if ext_factor != F32(0.0):
                    y = (F32(h) - corr0) / max(F32(0.001), corr1 - corr0)
                    ramp = F32(1.0) - min(F32(1.0), max(F32(0.0), y))
                    ramp_mix = ramp * ext_factor
                    theta = fmaf(theta_interp, F32(1.0) - ramp_mix, theta_extrap * ramp_mix)
                cache[2 * h] = glibc_sincosf(theta, True) * mscale
                cache[2 * h + 1] = glibc_sincosf(theta, False) * mscale * sin_sign
                theta_base = theta_base * theta_scale
        x = src0 + i1 * nb01 + i2 * nb02 + i3 * nb03
        d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3
        if neox:
            half = n_dims // 2
            for i0 in range(0, n_dims, 2):
                ic = i0 // 2
                c = cache[i0]
                s = cache[i0 + 1]
                x0 = ld_f32(x + 4 * ic)
                x1 = ld_f32(x + 4 * (ic + half))
                st_f32(d + 4 * ic, fmaf(x0, c, -(x1 * s)))
                st_f32(d + 4 * (ic + half), fmaf(x0, s, x1 * c))
        else:
            for i0 in range(0, n_dims, 2):
                c = cache[i0]
                s = cache[i0 + 1]
                x0 = ld_f32(x + 4 * i0)
                x1 = ld_f32(x + 4 * (i0 + 1))
                st_f32(d + 4 * i0, fmaf(x0, c, -(x1 * s)))
                st_f32(d + 4 * (i0 + 1), fmaf(x0, s, x1 * c))
        for i0 in range(n_dims, ne0):
            st_u32(d + 4 * i0, ld_u32(x + 4 * i0))

@compiled
def k_set_rows(P, F, k, ith, nth, sync, wdata):
    tdst = P[k, SET_ROWS_TYPE]
    ti = P[k, SET_ROWS_ITYPE]
    src0, src1, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA]
    ne00, ne01, ne02, ne03 = P[k, S0 + NE0], P[k, S0 + NE1], P[k, S0 + NE2], P[k, S0 + NE3]
    nb00, nb01, nb02, nb03 = P[k, S0 + NB0], P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    ne11, ne12 = P[k, S1 + NE1], P[k, S1 + NE2]
    nb10, nb11, nb12 = P[k, S1 + NB0], P[k, S1 + NB1], P[k, S1 + NB2]
    ne1 = P[k, DST + NE1]
    nb0, nb1, nb2, nb3 = P[k, DST + NB0], P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    ir0, ir1 = _thread_range(ne01, ith, nth)
    for i03 in range(ne03):
        for i02 in range(ne02):
            for i in range(ir0, ir1):
                ia = src1 + i * nb10 + (i02 % ne11) * nb11 + (i03 % ne12) * nb12
                i1 = np.int64(ld_i32(ia)) if ti == T_I32 else ld_i64(ia)
                if i1 < 0 or i1 >= ne1:
                    set_error(sync, ERR_SET_ROWS_INDEX, k)
                    continue
                x = src0 + i * nb01 + i02 * nb02 + i03 * nb03
                d = dst + i1 * nb1 + i02 * nb2 + i03 * nb3
                if tdst == T_F16:
                    for j in range(ne00):
                        st_u16(d + j * nb0, f32_to_f16(ld_f32(x + j * nb00)))
                else:
                    for j in range(ne00):
                        st_u32(d + j * nb0, ld_u32(x + j * nb00))

@compiled
def k_soft_max(P, F, k, ith, nth, sync, wdata):
    src0, mask, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA]
    tmask = P[k, SOFT_MAX_MTYPE]
    ne00, ne01, ne02, ne03 = P[k, S0 + NE0], P[k, S0 + NE1], P[k, S0 + NE2], P[k, S0 + NE3]
    nb01, nb02, nb03 = P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    ne12, ne13 = P[k, S1 + NE2], P[k, S1 + NE3]
    nb11, nb12, nb13 = P[k, S1 + NB1], P[k, S1 + NB2], P[k, S1 + NB3]
    nb1, nb2, nb3 = P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    scale = F32(F[k, SOFT_MAX_SCALE])
    slope = F32(F[k, SOFT_MAX_SLOPE])
    wp = np.empty(ne00, np.float32)
    lanes = P[k, SOFT_MAX_LANES]
    m8 = (ne00 // lanes) * lanes
    for i03 in range(ne03):
        for i02 in range(ne02):
            for i01 in range(ith, ne01, nth):
                sp = src0 + i01 * nb01 + i02 * nb02 + i03 * nb03
                dp = dst + i01 * nb1 + i02 * nb2 + i03 * nb3
                mp = 0
                if mask != 0:
                    mp = mask + i01 * nb11 + (i02 % ne12) * nb12 + (i03 % ne13) * nb13
                if mask == 0 or tmask == T_F32:
                    mx = soft_max_prep(sp, mp, wp.ctypes.data, ne00, scale, slope)
                else:
                    for i in range(ne00):
                        wp[i] = ld_f32(sp + 4 * i) * scale
                    for i in range(ne00):
                        wp[i] = fmaf(slope, fp16_to_fp32(ld_u16(mp + 2 * i)), wp[i])
                    mx = F32(-np.inf)
                    for i in range(ne00):
                        v = wp[i]
                        mx = mx if mx > v else v
                # ggml_vec_soft_max_f32: v_expf on the variant's lanes (8 AVX2, 16 AVX-512), a float horizontal sum
                # per block, double sum; libm expf tail
                if lanes == 16:
                    s = soft_max_exp16(wp.ctypes.data, dp, m8 // 16, mx)
                else:
                    s = soft_max_exp8(wp.ctypes.data, dp, m8 // 8, mx)
                for i in range(m8, ne00):
                    v = glibc_expf(wp[i] - mx)
                    st_f32(dp + 4 * i, v)
                    s += np.float64(v)
                scale_row(dp, ne00, F32(1.0 / s))

@compiled
def k_swiglu(P, F, k, ith, nth, sync, wdata):
    src0, src1, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA]
    nc = P[k, SWIGLU_NC]
    swapped = P[k, SWIGLU_SWAPPED]
    nr = P[k, SWIGLU_NROWS]
    nb01 = P[k, S0 + NB1]
    nb11 = P[k, S1 + NB1]
    nb1 = P[k, DST + NB1]
    ir0, ir1 = _thread_range(nr, ith, nth)
    lanes = P[k, SWIGLU_LANES]
    m8 = (nc // lanes) * lanes
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
        if lanes == 16:
            swiglu16(xr, gr, d, m8 // 16)
        else:
            swiglu8(xr, gr, d, m8 // 8)
        for i in range(m8, nc):
            xv = ld_f32(xr + 4 * i)
            st_f32(d + 4 * i, (xv / (F32(1.0) + glibc_expf(-xv))) * ld_f32(gr + 4 * i))

@compiled
def k_cpy(P, F, k, ith, nth, sync, wdata):
    """dup_bytes / dup_flt: src rows [ir0, ir1) of every (i02, i03) go to the dst elements with the same flat
    index; F32->F16 converts with F16C rounding."""
    tsrc = P[k, CPY_STYPE]
    tdst = P[k, CPY_DTYPE]
    src0, dst = P[k, S0 + DATA], P[k, DST + DATA]
    ne00, ne01, ne02, ne03 = P[k, S0 + NE0], P[k, S0 + NE1], P[k, S0 + NE2], P[k, S0 + NE3]
    nb00, nb01, nb02, nb03 = P[k, S0 + NB0], P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    ne0, ne1, ne2 = P[k, DST + NE0], P[k, DST + NE1], P[k, DST + NE2]
    nb0, nb1, nb2, nb3 = P[k, DST + NB0], P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    ir0, ir1 = _thread_range(ne01, ith, nth)
    esd = 2 if tdst == T_F16 else 4
    ess = 2 if tsrc == T_F16 else 4
    dst_cont = nb0 == esd and nb1 == ne0 * esd and nb2 == ne1 * nb1 and nb3 == ne2 * nb2
    for i03 in range(ne03):
        for i02 in range(ne02):
            for i01 in range(ir0, ir1):
                base = ((i03 * ne02 + i02) * ne01 + i01) * ne00
                x = src0 + i01 * nb01 + i02 * nb02 + i03 * nb03
                if dst_cont:
                    # the row goes to consecutive dst elements
                    d = dst + base * esd
                    if tsrc == tdst and nb00 == ess:
                        copy_bytes(d, x, ne00 * ess)
                    elif tsrc == tdst and ess == 4:
                        for i00 in range(ne00):
                            st_u32(d + 4 * i00, ld_u32(x + i00 * nb00))
                    elif tsrc == tdst:
                        for i00 in range(ne00):
                            st_u16(d + 2 * i00, ld_u16(x + i00 * nb00))
                    elif tdst == T_F16:
                        for i00 in range(ne00):
                            st_u16(d + 2 * i00, f32_to_f16(ld_f32(x + i00 * nb00)))
                    else:
                        for i00 in range(ne00):
                            st_f32(d + 4 * i00, fp16_to_fp32(ld_u16(x + i00 * nb00)))
                    continue
                for i00 in range(ne00):
                    f = base + i00
                    j0 = f % ne0
                    r = f // ne0
                    j1 = r % ne1
                    r = r // ne1
                    j2 = r % ne2
                    j3 = r // ne2
                    d = dst + j0 * nb0 + j1 * nb1 + j2 * nb2 + j3 * nb3
                    s = x + i00 * nb00
                    if tsrc == tdst:
                        if tsrc == T_F16:
                            st_u16(d, ld_u16(s))
                        else:
                            st_u32(d, ld_u32(s))
                    elif tdst == T_F16:
                        st_u16(d, f32_to_f16(ld_f32(s)))
                    else:
                        st_f32(d, fp16_to_fp32(ld_u16(s)))


# =================================================================================================================
# the compiled ggml_graph_compute_thread
# =================================================================================================================

@compiled
def compute_node(P, F, k, ith, nth, sync, wdata):
    op = P[k, OP]
    if op == OP_MUL_MAT_Q:
        k_mul_mat_q(P, F, k, ith, nth, sync, wdata)
    elif op == OP_RMS_NORM:
        k_rms_norm(P, F, k, ith, nth, sync, wdata)
    elif op == OP_BINARY:
        k_binary(P, F, k, ith, nth, sync, wdata)
    elif op == OP_ROPE:
        k_rope(P, F, k, ith, nth, sync, wdata)
    elif op == OP_MUL_MAT_F:
        k_mul_mat_f(P, F, k, ith, nth, sync, wdata)
    elif op == OP_SOFT_MAX:
        k_soft_max(P, F, k, ith, nth, sync, wdata)
    elif op == OP_SET_ROWS:
        k_set_rows(P, F, k, ith, nth, sync, wdata)
    elif op == OP_CPY:
        k_cpy(P, F, k, ith, nth, sync, wdata)
    elif op == OP_SWIGLU:
        k_swiglu(P, F, k, ith, nth, sync, wdata)
    elif op == OP_GET_ROWS:
        k_get_rows(P, F, k, ith, nth, sync, wdata)
    elif op == OP_SCALE:
        gemma_ops.k_scale(P, F, k, ith, nth, sync, wdata)
    elif op == OP_GEGLU:
        gemma_ops.k_geglu(P, F, k, ith, nth, sync, wdata)
    # PowerInfer's sparse FFN (sparse.py)
    elif op == OP_MUL_MAT_SPARSE:
        sparse.k_mul_mat_sparse(P, F, k, ith, nth, sync, wdata)
    elif op == OP_AXPY:
        sparse.k_axpy(P, F, k, ith, nth, sync, wdata)
    elif op == OP_UNARY:
        sparse.k_unary(P, F, k, ith, nth, sync, wdata)
    elif op == OP_FLASH_ATTN:
        fattn.k_flash_attn_ext(P, F, k, ith, nth, sync, wdata)

@compiled
def graph_compute_thread(P, F, wdata, sync, ith, nth, k0, k1, timings):
    """Every thread walks nodes k0..k1-1 of the program; a barrier after each node (not after the last).
    The work-buffer address is patched into the rows that use it (column X+4 / X+1) by the caller."""
    t = np.int64(0)
    tr = traced(sync)
    if ith == 0:
        atomic_store(sync + 8 * SYNC_TICKS, rdtsc())
    for k in range(k0, k1):
        if (timings.shape[0] > 0 and ith == 0) or tr:
            t = time_ns()
        compute_node(P, F, k, ith, nth, sync, wdata)
        if tr:
            t1 = time_ns()
            tr_rec(sync, ith, TR_NODE, k, 0, 0, 0, 0, 0, 0, t, t1)
        if k + 1 < k1:
            traced_barrier(sync, nth, ith, k, TRW_NODE, tr)
        if timings.shape[0] > 0 and ith == 0:
            timings[k] += time_ns() - t
    traced_barrier(sync, nth, ith, k1, TRW_FINAL, tr)
    if ith == 0:
        atomic_store(sync + 8 * (SYNC_TICKS + 1), rdtsc())

@compiled
def time_ns():
    """Cycle counter (for per-node profiles only)."""
    return rdtsc()


@compiled
def repack_blocks_8x4(raw, rows, row_bytes, nb, bsize, qs_off, n_words, d_off, m_off, qs, d, m):
    """CPU_REPACK's repack of 8-row groups (``repack.repack_blocks``: q4_0_8x4 / q4_1_8x4 / q8_0_8x4), compiled: the
    weight rows at address ``raw`` (``rows`` rows of ``row_bytes`` = nb * bsize bytes: ggml blocks of ``bsize``
    bytes, quants at ``qs_off``, fp16 d at ``d_off``, fp16 m at ``m_off`` or -1) -> ``qs`` (rows / 8, nb, n_words,
    8) uint32: 4 quant bytes per row and step, the 8 rows side by side; ``d`` / ``m`` (rows / 8, nb, 8) uint16: the
    blocks' fp16 bits. The same bytes the NumPy transposes move, in one pass: model load's largest part otherwise.
    The rows come as an address and are read a little-endian word at a time: written over a uint8 array, the byte
    gathers made LLVM emit 340 KB of vector code per array flavour (read-only mapped GGUF, writable), ~35 s of the
    kernels' compile and ~0.2 s of every model load's first use."""
    for g in range(rows // 8):
        for r in range(8):
            row = raw + (g * 8 + r) * row_bytes
            for b in range(nb):
                o = row + b * bsize
                for w in range(n_words):
                    qs[g, b, w, r] = ld_u32(o + qs_off + 4 * w)
                d[g, b, r] = ld_u16(o + d_off)
                if m_off >= 0:
                    m[g, b, r] = ld_u16(o + m_off)


def warmup() -> float:
    """Compile (or load from Numba's cache) every kernel; returns the seconds it took."""
    t0 = time.perf_counter()
    P = np.zeros((1, NCOL), np.int64)
    Fa = np.zeros((1, NFCOL), np.float64)
    sync = new_sync()
    graph_compute_thread(P, Fa, 0, sync.ctypes.data, 0, 1, 0, 1, np.zeros(0, np.int64))
    x = np.zeros(64, np.float32)
    w = np.zeros(256, np.uint8)
    mmq_quantize(x.ctypes.data, 32, 1, 1, 128, 128, 4, w.ctypes.data, True, 0, 1)
    # the entry points the CPU_REPACK traits call node by node (repack.py; e.g. under an eval callback), with the
    # argument types they get there: Python ints, and a chunk of no rows (nothing is read or written)
    mmq_layout(32, 1)
    mmq_chunk_rows(0, 1, 8, 8)
    mmq_nchunk(8, 1)
    mmq_chunk(T_Q4_1, 0, 0, 0, 32, 0, 0, 0, 0, 0, 0, 1, 32, 0, 1, 0, 0)
    # CPU_REPACK's repack at model load (repack.py), on one group of 8 empty rows (read by address: the mapped GGUF's
    # read-only rows and rows made in memory alike)
    z16 = np.zeros((1, 1, 8), np.uint16)
    raw = np.zeros((8, 20), np.uint8)
    repack_blocks_8x4(raw.ctypes.data, 8, 20, 1, 20, 4, 4, 0, 2, np.zeros((1, 1, 4, 8), np.uint32), z16, z16)
    # the faithful MUL_MAT's vec_dots of raw rows (cpu/quants.vec_dot), on one zero block: it hands them read-only
    # views of both operands
    out = np.zeros((1, 1), np.float32)
    for xb, yb, fn in ((20, 36, blockdot.vec_dot_q4_1_q8_1), (20, 36, blockdot.vec_dot_q4_1_q8_1_avx2),
                       (34, 34, blockdot.vec_dot_q8_0_q8_0)):
        x, y = np.zeros((1, xb), np.uint8), np.zeros((1, yb), np.uint8)
        x.flags.writeable = y.flags.writeable = False
        fn(x, y, out)
    blockdot.fma32(np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(1, np.float32))  # the faithful FMAs
    return time.perf_counter() - t0
