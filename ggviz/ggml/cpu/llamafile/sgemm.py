"""llamafile's tinyBLAS: ``ggml/src/ggml-cpu/llamafile/sgemm.cpp`` (``llamafile_sgemm``), built for AVX2 + FMA + F16C
(and, for the zen4 variant, the float kernel as AVX-512 builds it: ``tinyBLAS<16, __m512, ...>``, see KN_AVX512).

``ggml_compute_forward_mul_mat`` (``cpu/mul_mat.py``) calls ``llamafile_sgemm`` once per (i12, i13) matrix -- first
with src1 as it is (when src1 is contiguous), then with src1 converted to the ``vec_dot_type`` -- and falls back to
its vec_dot chunks when it answers false. It computes ``C = A^T B`` column-major: ``C[j*ldc + i]`` is the dot product
of row i of A (src0, m rows of k values or blocks, stride lda) with row j of B (src1, n rows, stride ldb).

Which types it takes (x86 AVX2): F32 x F32, F16 x F16 and BF16 x BF16 (``tinyBLAS<8, __m256, __m256, T, T, float>``),
and Q8_0 / Q4_0 / Q5_0 x Q8_0 (``tinyBLAS_Q0_AVX``; IQ4_NL too in llama.cpp, not here: ggviz has no IQ4_NL blocks);
never when ``n < 2`` ("only enable sgemm for prompt processing"). The float kernel also refuses ``k % 8 != 0`` and
``m % 4 != 0``.

What makes the bits (the part that matters for a reader comparing with vec_dot):

* float kernel: each ``C[j][i]`` is ONE 8-lane accumulator, ``acc = fmadd(A_i[l:l+8], B_j[l:l+8], acc)`` for
  l = 0, 8, ..., then ``hsum``: (high 128 bits + low), ``+ movehl``, ``+ movehdup``. ggml_vec_dot_f16 uses 4
  accumulators and another reduction: the same MUL_MAT through vec_dot gives other bits.
* Q0 kernel: per block l, lane t (bytes 4t..4t+3) holds the exact integer dot product (``maddubs`` of |a| and
  sign(b, a), ``madd`` with ones), converted to float, then ``acc = fmadd(d_A*d_B, lane, acc)`` (the scale product
  rounded to float first), and the same hsum.

For Q8_0 / Q4_0 / Q5_0 this is, operation for operation, what ggml's AVX2 ``ggml_vec_dot_{q8_0,q4_0,q5_0}_q8_0``
compute too (8 lanes of ``fmadd(d, float(maddubs/madd sums), acc)``, the same hsum), so a prefill through tinyBLAS
and a decode through vec_dot agree for these types (tests/test_sgemm.py checks it); for the float types they differ.

What only decides who computes what (never a bit): the float kernel's ``mnpack<4, RN, BM>`` tiles and its jobs
(row blocks of 4*BM times about 24 column tiles) claimed through the threadpool's ``current_chunk`` between two
barriers; the Q0 kernel's recursive ``mnpack`` (4x2 / 2x4 / 3x2 ... tiles, AVX2 with 16 vector registers) with a
static split of each tile grid into ``duty = ceil(tiles/nth)`` consecutive tiles per thread. ggviz walks the same
jobs and tiles for the same threads, and computes each job's elements together with NumPy (float lanes emulated
exactly: products are exact in float64, fused multiply-adds get one rounding via ``vec._fma_step``).
"""
from __future__ import annotations

import time

import numpy as np

from .... import trace
from ... import consts as C
from ... import quants as Q
from .. import cpu_feats
from ..vec import _fma_step, hsum8, hsum16

KN = 8                  # floats per __m256
BN = 24                 # column tiles per job (VECTOR_REGISTERS == 16 on AVX2)
# The AVX-512 build (zen4 variant): tinyBLAS<16, __m512, __m512, T, T, float>, one 16-lane accumulator per element
# and _mm512_reduce_add_ps (hsum16); VECTOR_REGISTERS 32, so mnpack<4, 6, BM> with BLOCK_SIZE<6>(n) and BN = 12.
# The tiles and jobs decide only who computes what; the lanes and the reduction make the bits.
KN_AVX512, BN_AVX512 = 16, 12
Q0_TYPES = (C.GGML_TYPE_Q8_0, C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q5_0)
FLOAT_TYPES = (C.GGML_TYPE_F32, C.GGML_TYPE_F16, C.GGML_TYPE_BF16)
_ESIZE = {C.GGML_TYPE_F32: 4, C.GGML_TYPE_F16: 2, C.GGML_TYPE_BF16: 2}
_ROW_CHUNK = 1 << 18    # elements x 8 lanes per NumPy step (keeps the float64 scratch ~ 20 MB)


def accepts(m: int, n: int, k: int, Atype: int, Btype: int, Ctype: int, nth: int) -> bool:
    """Whether ``llamafile_sgemm`` would compute this call (True) or answer false, without computing anything."""
    if n < 2 or Ctype != C.GGML_TYPE_F32:
        return False
    if Atype in FLOAT_TYPES:
        return Btype == Atype and tinyblas_bm(m, k, nth, cpu_feats.variant_lanes()) > 0
    return Atype in Q0_TYPES and Btype == C.GGML_TYPE_Q8_0


def llamafile_sgemm(params, m: int, n: int, k: int, A, lda: int, B, ldb: int, Cp, ldc: int,
                    Atype: int, Btype: int, Ctype: int, trace_as=None) -> bool:
    """``llamafile_sgemm``: A, B and C are "pointers", (uint8 buffer, byte offset) pairs; lda / ldb / ldc count
    elements (blocks for the quant types), k too. Every thread of the pool calls it with the same arguments and its
    own ``params.ith``; thread ith writes its share of C. Returns False (nothing done, no barrier) where tinyBLAS
    refuses the types or shapes.

    ``trace_as``: ggviz: (node name, matrix index, number of matrices) -- when tracing, each job of the float
    kernel is a ``cpu.chunk`` event, numbered and placed so that the jobs of all of a node's matrices tile its dst
    (ne0, ne1*ne2*ne3) once, as the compiled walk records them."""
    assert m >= 0 and n >= 0 and k >= 0 and lda >= k and ldb >= k and ldc >= m
    if n < 2:           # only enable sgemm for prompt processing
        return False
    if Ctype != C.GGML_TYPE_F32:
        return False
    if Atype in FLOAT_TYPES:
        if Btype != Atype:
            return False
        return _tinyblas_matmul(params, m, n, k, A, lda, B, ldb, Cp, ldc, Atype, trace_as)
    if Atype in Q0_TYPES:
        if Btype != C.GGML_TYPE_Q8_0:
            return False
        _q0_matmul(params, m, n, k, A, lda, B, ldb, Cp, ldc, Atype)
        return True
    return False


# ---------------------------------------------------------------------------------------------------------------------
# tinyBLAS<8, __m256, __m256, T, T, float>: F32 / F16 / BF16
# ---------------------------------------------------------------------------------------------------------------------

def block_size(M: int, m: int) -> int:
    """``BLOCK_SIZE<M>(m)``."""
    nb = (m + M - 1) // M
    return m // nb if m % nb == 0 else m // nb + 1


def bloc_pos(ib: int, ibn: int, bloc_size: int) -> int:
    """``BLOC_POS``: the first ibn blocks have bloc_size, the others one less."""
    return ib * bloc_size if ib < ibn else ibn * bloc_size + (ib - ibn) * (bloc_size - 1)


def tinyblas_bm(m: int, k: int, nth: int, kn: int = KN) -> int:
    """tinyBLAS::matmul: the BM of ``mnpack<4, RN, BM>``, 0 where it returns false (``k % KN``: KN = kn floats per
    vector, 8 for __m256, 16 for __m512)."""
    if k % kn:
        return 0
    if m % 16 == 0 and m // 16 >= nth:
        return 4
    if m % 8 == 0:
        return 2
    if m % 4 == 0:
        return 1
    return 0


def tinyblas_jobs(m: int, n: int, bm: int, kn: int = KN):
    """The ``gemm<RM=4, RN, BM>`` job grid: (RN, number of jobs, job -> (ii, ii_end, jj0, jj2)); kn 16 (AVX-512,
    VECTOR_REGISTERS 32): mnpack<4, 6, BM> and BN = 12 column tiles per job."""
    RM = 4
    bn = BN_AVX512 if kn == KN_AVX512 else BN
    RN = block_size(6 if kn == KN_AVX512 else 3, n)       # mnpack<4, 3 or 6, BM> walks RN down to SIZE_N
    ytiles = m // (RM * bm)
    xtiles = (n + RN - 1) // RN
    jj_rn = xtiles - (xtiles * RN - n)
    nb_bn = 1 if xtiles < bn else (xtiles + bn // 2) // bn
    size_bn = xtiles // nb_bn if xtiles % nb_bn == 0 else xtiles // nb_bn + 1
    jj_bn = nb_bn - (nb_bn * size_bn - xtiles)
    assert jj_bn * size_bn + (nb_bn - jj_bn) * (size_bn - 1) == xtiles

    def job_box(job: int):
        ii = (job % ytiles) * RM * bm
        jb = job // ytiles
        jr0, jrn = bloc_pos(jb, jj_bn, size_bn), bloc_pos(jb + 1, jj_bn, size_bn)
        return ii, ii + RM * bm, bloc_pos(jr0, jj_rn, RN), bloc_pos(jrn, jj_rn, RN)
    return RN, ytiles * nb_bn, job_box


def _float_rows(ptr, ld: int, r0: int, r1: int, k: int, t: int) -> np.ndarray:
    """Rows r0..r1 of a float matrix (element stride ld) as exact float32 values (r1-r0, k)."""
    buf, off = ptr
    es = _ESIZE[t]
    raw = np.ndarray((r1 - r0, k * es), np.uint8, buffer=buf, offset=off + r0 * ld * es, strides=(ld * es, 1))
    if t == C.GGML_TYPE_F32:
        return np.ascontiguousarray(raw).view(np.float32)
    bits = np.ascontiguousarray(raw).view(np.uint16)
    return Q.fp16_to_fp32(bits) if t == C.GGML_TYPE_F16 else Q.bf16_to_fp32(bits)


def tinyblas_lanes(a: np.ndarray, b: np.ndarray, kn: int = KN) -> np.ndarray:
    """``gemm_bloc``'s arithmetic for every (column j of b, row i of a): (N, M) float32 =
    hsum(acc), acc = fmadd(a_i[l:l+kn], b_j[l:l+kn], acc) over l in steps of kn (8 lanes and sgemm.cpp's __m256
    hsum; 16 lanes and _mm512_reduce_add_ps in the AVX-512 build)."""
    M, N, k = a.shape[0], b.shape[0], a.shape[1]
    out = np.empty((N, M), np.float32)
    a64 = a.astype(np.float64).reshape(M, k // kn, kn)
    b64 = b.astype(np.float64).reshape(N, k // kn, kn)
    step = max(1, _ROW_CHUNK // max(1, M * kn))
    for j0 in range(0, N, step):
        bj = b64[j0:j0 + step]
        shape = (bj.shape[0], M, kn)
        acc = np.zeros(shape, np.float32)
        p, s = np.empty(shape, np.float64), np.empty(shape, np.float64)
        low, risky = np.empty(shape, np.int64), np.empty(shape, np.bool_)
        with np.errstate(invalid="ignore", over="ignore"):
            for l in range(k // kn):
                np.multiply(bj[:, None, l, :], a64[None, :, l, :], out=p)       # exact: 24+24 bits < 53
                _fma_step(acc, p, s, low, risky, True)
        out[j0:j0 + step] = hsum16(acc) if kn == KN_AVX512 else hsum8(acc)
    return out


def _store(Cp, ldc: int, i0: int, j0: int, vals: np.ndarray) -> None:
    """C[j*ldc + i] = vals[j - j0, i - i0] (vals (N, M) float32)."""
    buf, off = Cp
    N, M = vals.shape
    out = np.ndarray((N, M), np.float32, buffer=buf, offset=off + (j0 * ldc + i0) * 4, strides=(ldc * 4, 4))
    out[...] = vals


def _tinyblas_matmul(params, m, n, k, A, lda, B, ldb, Cp, ldc, t, trace_as=None) -> bool:
    kn = cpu_feats.variant_lanes()
    bm = tinyblas_bm(m, k, params.nth, kn)
    if bm == 0:
        return False
    _, nb_job, job_box = tinyblas_jobs(m, n, bm, kn)
    ytiles = m // (4 * bm)
    tp = params.threadpool
    if params.ith == 0 and tp is not None:
        tp.current_chunk = params.nth       # ggml_threadpool_chunk_set: every thread starts at job ith
    params.barrier()
    job = params.ith
    while job < nb_job:
        i0, i1, j0, j2 = job_box(job)
        t0 = time.perf_counter_ns() if trace.active else 0
        if j2 > j0:
            vals = tinyblas_lanes(_float_rows(A, lda, i0, i1, k, t), _float_rows(B, ldb, j0, j2, k, t), kn)
            _store(Cp, ldc, i0, j0, vals)
        if trace.active and trace_as is not None:
            name, mat, mats = trace_as
            trace.emit("cpu.chunk", ith=params.ith, node=name, chunk=int(mat * nb_job + job),
                       nchunk=(int(ytiles), int(nb_job // ytiles * mats)), ir0=(int(i0), int(i1)),
                       ir1=(int(mat * n + j0), int(mat * n + j2)),
                       t_start=t0, t_end=time.perf_counter_ns(), kernel="sgemm")
        job = tp.chunk_fetch_add(1) if tp is not None else job + params.nth
    params.barrier()
    return True


# ---------------------------------------------------------------------------------------------------------------------
# tinyBLAS_Q0_AVX: Q8_0 / Q4_0 / Q5_0 x Q8_0
# ---------------------------------------------------------------------------------------------------------------------

# AVX2 with 16 vector registers: (min(m-m0, 4), min(n-n0, 4)) -> the tile (mc, nc) mnpack computes
_Q0_TILE = {(4, 4): (4, 2), (4, 3): (4, 2), (4, 2): (4, 2), (3, 4): (2, 4), (2, 4): (2, 4), (3, 3): (3, 2),
            (3, 2): (3, 2), (2, 3): (2, 3), (4, 1): (4, 1), (2, 2): (2, 2), (1, 4): (1, 4), (3, 1): (3, 1),
            (1, 3): (1, 3), (2, 1): (2, 1), (1, 2): (1, 2), (1, 1): (1, 1)}


def q0_regions(m: int, n: int):
    """tinyBLAS_Q0_AVX::mnpack's recursion, flattened: the (m0, m, n0, n, RM, RN) tile grids, in call order."""
    out = []

    def rec(m0, m_, n0, n_):
        key = (min(m_ - m0, 4), min(n_ - n0, 4))
        if key not in _Q0_TILE:
            return
        mc, nc = _Q0_TILE[key]
        out.append((m0, m_, n0, n_, mc, nc))
        mp = m0 + (m_ - m0) // mc * mc
        np_ = n0 + (n_ - n0) // nc * nc
        rec(mp, m_, n0, np_)
        rec(m0, m_, np_, n_)
    rec(0, m, 0, n)
    return out


def q0_thread_tiles(m0, m, n0, n, RM, RN, ith, nth):
    """``gemm<RM, RN>`` / ``gemm4xN`` / ``gemmMx4``'s static split: thread ith's tiles [start, end) of the grid,
    as up to three rectangles (i0, i1, j0, j1) (tiles run along n first)."""
    ytiles, xtiles = (m - m0) // RM, (n - n0) // RN
    tiles = xtiles * ytiles
    if tiles == 0:
        return []
    duty = (tiles + nth - 1) // nth
    start, end = duty * ith, min(duty * ith + duty, tiles)
    rects = []
    job = start
    while job < end:
        ty, tx = divmod(job, xtiles)
        tx_end = xtiles if end - job >= xtiles - tx else tx + (end - job)
        if tx == 0 and tx_end == xtiles and end - job >= 2 * xtiles:
            full = (end - job) // xtiles               # whole tile rows at once
            rects.append((m0 + ty * RM, m0 + (ty + full) * RM, n0, n0 + xtiles * RN))
            job += full * xtiles
            continue
        rects.append((m0 + ty * RM, m0 + (ty + 1) * RM, n0 + tx * RN, n0 + tx_end * RN))
        job += tx_end - tx
    return rects


def _q0_blocks(ptr, ld: int, r0: int, r1: int, k: int, t: int):
    """Rows r0..r1 of a block matrix: (int8 values (R, k, 32) as the kernel's ``load`` gives them, float32 scales)."""
    buf, off = ptr
    bs = Q.BLOCK_DTYPES[t].itemsize
    raw = np.ndarray((r1 - r0, k * bs), np.uint8, buffer=buf, offset=off + r0 * ld * bs, strides=(ld * bs, 1))
    u = Q.unpack_blocks(t, np.ascontiguousarray(raw).view(Q.BLOCK_DTYPES[t]).reshape(-1))
    q = u["q"]
    if t == C.GGML_TYPE_Q4_0:
        q = q - 8                   # _mm256_sub_epi8(denibble(qs), 8)
    elif t == C.GGML_TYPE_Q5_0:
        q = q - 16                  # denibble | bittobyte: 0xF0 where the 5th bit is clear
    return q.astype(np.int16).reshape(r1 - r0, k, 32), u["d"].reshape(r1 - r0, k)


def _updot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``updot(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))`` for int8 values a (.., 32), b (.., 32):
    8 int32 lanes, pmaddubsw's int16 saturation included (it only bites for a = b = -128)."""
    u = np.abs(a)                                              # |a| as unsigned (-128 -> 128)
    s = np.where(a < 0, -b, np.where(a == 0, 0, b))
    s = np.where(s == 128, -128, s)                            # psignb wraps -(-128)
    prod = u.astype(np.int32) * s
    pair = np.clip(prod[..., 0::2] + prod[..., 1::2], -32768, 32767)
    return pair[..., 0::2] + pair[..., 1::2]                   # pmaddwd with ones


def _lanes_by_matmul(a, qb) -> np.ndarray:
    """The same 8 lanes per block as ``_updot`` where no lane saturates (no a = b = -128 pair): exact integer dot
    products of 4 bytes, by one float32 matmul per (block, lane) -- exact, the sums stay far below 2^24.
    a: src0's values as (k*8, 4, M) float32; returns (k, 8, N, M) float32."""
    k8, M = a.shape[0], a.shape[2]
    N = qb.shape[0]
    b = qb.reshape(N, k8, 4).transpose(1, 0, 2).astype(np.float32)             # (k*8, N, 4)
    return np.matmul(b, a).reshape(k8 // KN, KN, N, M)


def q0_lanes(qa, da, qb, db) -> np.ndarray:
    """The Q0 kernels' arithmetic for every (column j, row i): (N, M) float32."""
    M, N, k = qa.shape[0], qb.shape[0], qa.shape[1]
    out = np.empty((N, M), np.float32)
    saturates = bool((qa == -128).any() and (qb == -128).any())
    a = None if saturates else qa.reshape(M, k * KN, 4).transpose(1, 2, 0).astype(np.float32)     # (k*8, 4, M)
    step = max(1, _ROW_CHUNK // max(1, M * KN))
    for j0 in range(0, N, step):
        qbj, dbj = qb[j0:j0 + step], db[j0:j0 + step]
        shape = (qbj.shape[0], M, KN)
        acc = np.zeros(shape, np.float32)
        p, s = np.empty(shape, np.float64), np.empty(shape, np.float64)
        low, risky = np.empty(shape, np.int64), np.empty(shape, np.bool_)
        fast = None if saturates else _lanes_by_matmul(a, qbj)
        with np.errstate(invalid="ignore", over="ignore"):
            for l in range(k):
                if fast is not None:
                    lanes = fast[l].transpose(1, 2, 0)                              # (N, M, 8)
                else:
                    lanes = _updot(qa[None, :, l, :], qbj[:, None, l, :])           # (N, M, 8) int32
                scale = (dbj[:, None, l] * da[None, :, l]).astype(np.float32)       # unhalf(A.d) * unhalf(B.d)
                np.multiply(scale.astype(np.float64)[..., None], lanes, out=p)      # exact
                _fma_step(acc, p, s, low, risky, True)
        out[j0:j0 + step] = hsum8(acc)
    return out


def _q0_matmul(params, m, n, k, A, lda, B, ldb, Cp, ldc, t) -> None:
    """tinyBLAS_Q0_AVX::matmul: no barrier, no shared counter (each grid split statically among the threads)."""
    for rm0, rm, rn0, rn, RM, RN in q0_regions(m, n):
        for i0, i1, j0, j1 in q0_thread_tiles(rm0, rm, rn0, rn, RM, RN, params.ith, params.nth):
            qa, da = _q0_blocks(A, lda, i0, i1, k, t)
            qb, db = _q0_blocks(B, ldb, j0, j1, k, C.GGML_TYPE_Q8_0)
            _store(Cp, ldc, i0, j0, q0_lanes(qa, da, qb, db))
