"""llamafile's tinyBLAS (``ggml/src/ggml-cpu/llamafile/sgemm.cpp``), compiled: the fast path's ``llamafile_sgemm``.

Mirrors the AVX2 + FMA + F16C build (``VECTOR_REGISTERS 16``) of the float kernel ``tinyBLAS<8, __m256, __m256,
TA, TB, float>`` for F32 x F32 and F16 x F16, the types a llama graph's F32/F16 MUL_MATs reach it with (the KV-cache
attention: src1 converted to F16 first), and the AVX-512 build's ``tinyBLAS<16, __m512, ...>`` for the zen4 variant
(16 lanes, ``_mm512_reduce_add_ps``, VECTOR_REGISTERS 32 tiles; program column MMF_LANES). The faithful NumPy
twin, with the quantized ``tinyBLAS_Q0_AVX``, is ``ggviz/ggml/cpu/llamafile/sgemm.py``; both give the same bits,
which are llama.cpp's. ``q5_0_rows`` (at the end) is tinyBLAS_Q0_AVX's tile for Gemma-3's Q5_0 weights on ggml's own
22-byte blocks, called by the CPU_REPACK MUL_MAT's chunks (fast/kernels.py ``mmq_chunk``).

What makes the bits: every output ``C[j][i]`` is ONE 8-lane accumulator, ``acc = fmadd(A[i][l:l+8], B[j][l:l+8],
acc)`` for l = 0, 8, .. k-8 (``k % 8 == 0`` or tinyBLAS refuses), then sgemm.cpp's ``hsum``: high 128 bits + low,
``movehl`` add, ``movehdup`` add. ggml's ``ggml_vec_dot_f16`` uses 4 accumulators and another reduction, which is
why a prefill through tinyBLAS differs from the same MUL_MAT done column by column with vec_dot.

What only decides who computes what (never a bit of the result): ``matmul``'s choice of ``mnpack<RM=4, RN, BM>``
(BM 4 when ``m % 16 == 0`` and there are at least nth row blocks of 16, else 2 for ``m % 8``, 1 for ``m % 4``, else
refused; RN = ``BLOCK_SIZE<3>(n)``), and ``gemm``'s jobs: row blocks of RM*BM times column blocks of about BN = 24
tiles, claimed through the threadpool's ``current_chunk`` (thread ith starts at job ith, ``chunk_set(nth)`` by
thread 0 between two barriers, a barrier at the end). Each job's columns are computed as one call of the micro-kernel
below over the job's RM*BM rows.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .intrinsics import (
    _cvec,
    _decl,
    _hsum8,
    _hsum16,
    _i8,
    _i16,
    _i32,
    _i64,
    _madd_ones,
    _maddubs,
    _ptr,
    _sign_b,
    _splat,
    _vec,
    atomic_add,
    atomic_store,
    compiled,
    rdtsc,
)
from .program import (
    DATA,
    DST,
    MMF_LANES,
    MMF_LLAMAFILE,
    MMF_TYPE,
    NB0,
    NB1,
    NB2,
    NB3,
    NE0,
    NE1,
    NE2,
    NE3,
    OP,
    OP_MUL_MAT_F,
    OP_MUL_MAT_Q,
    S0,
    S1,
    SYNC_CHUNK,
    T_F16,
    TR_CHUNK,
    TRW_KERNEL,
)
from .sync import tr_rec, traced, traced_barrier

_f32 = ir.FloatType()
KN = 8                  # floats per __m256
BN = 24                 # column tiles per job (VECTOR_REGISTERS == 16)
# the AVX-512 build (zen4 variant): tinyBLAS<16, __m512, ...>: 16 lanes, _mm512_reduce_add_ps, VECTOR_REGISTERS 32
# (mnpack<4, 6, BM>, BN 12) -- as cpu/llamafile/sgemm.py


def _make_tb_rows(is_f16: bool, w: int = 8):
    """C[r] = hsum(sum over l of fmadd(A_r[l:l+w], B[l:l+w])) for ``nrows`` rows of A (A_r = a0 + r*astride),
    one column B, k8 = k/w steps: tinyBLAS's ``gemm_bloc`` for one element, rows in a loop (the order in which
    independent elements are computed does not change them). w = 16: the AVX-512 build's __m512 lanes and
    _mm512_reduce_add_ps."""
    def gen(typingctx, a0, astride, nrows, b, k8, out):
        def codegen(context, builder, sig, args):
            a0, astride, nrows, b, k8, out = args
            v8f = _vec(_f32, w)
            es = 2 if is_f16 else 4
            fma8 = _decl(builder, f"llvm.fma.v{w}f32", v8f, [v8f, v8f, v8f])
            acc = cgutils.alloca_once(builder, v8f)

            def load(addr):
                if is_f16:      # _mm256_cvtph_ps / _mm512_cvtph_ps: exact
                    h = builder.load(_ptr(builder, addr, _vec(_i16, w)), align=1)
                    return builder.fpext(builder.bitcast(h, _vec(ir.HalfType(), w)), v8f)
                return builder.load(_ptr(builder, addr, v8f), align=1)

            with cgutils.for_range(builder, nrows) as rl:
                a = builder.add(a0, builder.mul(rl.index, astride))
                builder.store(ir.Constant(v8f, None), acc)
                with cgutils.for_range(builder, k8) as loop:
                    off = builder.mul(loop.index, ir.Constant(_i64, w * es))
                    va = load(builder.add(a, off))
                    vb = load(builder.add(b, off))
                    builder.store(builder.call(fma8, [va, vb, builder.load(acc)]), acc)
                r = (_hsum16 if w == 16 else _hsum8)(builder, builder.load(acc))
                builder.store(r, _ptr(builder, builder.add(out, builder.mul(rl.index, ir.Constant(_i64, 4))), _f32),
                              align=1)
            return context.get_dummy_value()
        return types.void(*([types.int64] * 6)), codegen
    gen.__name__ = ("tb_rows_f16" if is_f16 else "tb_rows_f32") + ("_16" if w == 16 else "")
    return intrinsic(gen)


tb_rows_f16 = _make_tb_rows(True)
tb_rows_f32 = _make_tb_rows(False)
tb_rows_f16_16 = _make_tb_rows(True, 16)
tb_rows_f32_16 = _make_tb_rows(False, 16)


@compiled
def block_size3(n, M=3):
    """``BLOCK_SIZE<M>(n)``: the RN tinyBLAS's mnpack settles on (1 .. M; M = 3 on AVX2, 6 on AVX-512)."""
    nb = (n + M - 1) // M
    return n // nb if n % nb == 0 else n // nb + 1


@compiled
def bloc_pos(ib, ibn, bloc_size):
    """``BLOC_POS``: the first ib blocks of ``bloc_size``, the rest one smaller."""
    return ib * bloc_size if ib < ibn else ibn * bloc_size + (ib - ibn) * (bloc_size - 1)


@compiled
def tinyblas_bm(m, k, nth, kn=KN):
    """tinyBLAS::matmul's choice of BM (row tiles of RM = 4 per job), 0 when it refuses (returns false)."""
    if k % kn != 0:
        return 0
    if m % 16 == 0 and m // 16 >= nth:
        return 4
    if m % 8 == 0:
        return 2
    if m % 4 == 0:
        return 1
    return 0


@compiled
def tinyblas_f(is_f16, ith, nth, sync, kk, k, a, lda, b, ldb, c, ldc, m, n, tr, mat, mats, kn):
    """``tinyBLAS<8, __m256, __m256, T, T, float>::matmul(m, n)`` for one matrix (element strides lda/ldb/ldc of
    2-byte F16 or 4-byte F32 values); returns False, before any barrier, where tinyBLAS refuses.
    The trace records job j of matrix ``mat`` (of ``mats``) as chunk mat*nb_job + j of a (ytiles, nb_bn*mats) grid,
    its columns offset by mat*n: the chunks of all the node's matrices tile dst (ne0, ne1*ne2*ne3) once."""
    bm = tinyblas_bm(m, k, nth, kn)
    if bm == 0:
        return False
    es = 2 if is_f16 else 4
    RM = 4
    RN = block_size3(n, 6 if kn == 16 else 3)
    bn = 12 if kn == 16 else BN
    ytiles = m // (RM * bm)
    xtiles = (n + RN - 1) // RN
    jj_rn = xtiles - (xtiles * RN - n)
    nb_bn = 1 if xtiles < bn else (xtiles + bn // 2) // bn
    size_bn = xtiles // nb_bn if xtiles % nb_bn == 0 else xtiles // nb_bn + 1
    jj_bn = nb_bn - (nb_bn * size_bn - xtiles)
    nb_job = ytiles * nb_bn
    if ith == 0:
        atomic_store(sync + 8 * SYNC_CHUNK, nth)
    traced_barrier(sync, nth, ith, kk, TRW_KERNEL, tr)
    job = ith
    while job < nb_job:
        t0 = rdtsc() if tr else 0
        ii = (job % ytiles) * RM * bm
        jb = job // ytiles
        jr0 = bloc_pos(jb, jj_bn, size_bn)
        jrn = bloc_pos(jb + 1, jj_bn, size_bn)
        jj0 = bloc_pos(jr0, jj_rn, RN)
        jj2 = bloc_pos(jrn, jj_rn, RN)
        for jj in range(jj0, jj2):
            ar, br, cr = a + ii * lda * es, b + jj * ldb * es, c + (jj * ldc + ii) * 4
            if kn == 16:
                if is_f16:
                    tb_rows_f16_16(ar, lda * es, RM * bm, br, k // 16, cr)
                else:
                    tb_rows_f32_16(ar, lda * es, RM * bm, br, k // 16, cr)
            elif is_f16:
                tb_rows_f16(ar, lda * es, RM * bm, br, k // KN, cr)
            else:
                tb_rows_f32(ar, lda * es, RM * bm, br, k // KN, cr)
        if tr:
            tr_rec(sync, ith, TR_CHUNK, kk, mat * nb_job + job, ii, ii + RM * bm, mat * n + jj0, mat * n + jj2,
                   (ytiles << 32) | (nb_bn * mats), t0, rdtsc())
        job = atomic_add(sync + 8 * SYNC_CHUNK, 1)
    traced_barrier(sync, nth, ith, kk, TRW_KERNEL, tr)
    return True


@compiled
def is_contiguous_f32(ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3):
    """``ggml_is_contiguous`` of an F32 tensor (dimensions of size 1 are skipped)."""
    if ne0 != 1 and nb0 != 4:
        return False
    nxt = 4 * ne0
    if ne1 != 1:
        if nb1 != nxt:
            return False
        nxt *= ne1
    if ne2 != 1:
        if nb2 != nxt:
            return False
        nxt *= ne2
    if ne3 != 1 and nb3 != nxt:
        return False
    return True


@compiled
def llamafile_mul_mat_f(P, k, ith, nth, sync, wdata, converted):
    """The two ``#if GGML_USE_LLAMAFILE`` blocks of ``ggml_compute_forward_mul_mat`` for an OP_MUL_MAT_F row:
    ``converted`` False: before src1's conversion (src1 contiguous, Atype F32 / Btype F32); True: after it (src1
    as F16 rows in wdata). Calls llamafile_sgemm per (i12, i13) matrix; False (nothing done) where it refuses."""
    if P[k, MMF_LLAMAFILE] == 0:
        return False        # compiled from a graph with mul_mat.USE_LLAMAFILE off (a build without llamafile)
    t0 = P[k, MMF_TYPE]
    is_f16 = t0 == T_F16
    if converted != is_f16:
        return False        # F16 src0 with F32 src1 is refused (x86), F32 src0 needs no conversion
    src0, src1, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, DST + DATA]
    ne00, ne01, ne02, ne03 = P[k, S0 + NE0], P[k, S0 + NE1], P[k, S0 + NE2], P[k, S0 + NE3]
    nb01, nb02, nb03 = P[k, S0 + NB1], P[k, S0 + NB2], P[k, S0 + NB3]
    ne10, ne11, ne12, ne13 = P[k, S1 + NE0], P[k, S1 + NE1], P[k, S1 + NE2], P[k, S1 + NE3]
    nb10, nb11, nb12, nb13 = P[k, S1 + NB0], P[k, S1 + NB1], P[k, S1 + NB2], P[k, S1 + NB3]
    nb1, nb2, nb3 = P[k, DST + NB1], P[k, DST + NB2], P[k, DST + NB3]
    if not converted and not is_contiguous_f32(ne10, ne11, ne12, ne13, nb10, nb11, nb12, nb13):
        return False
    if ne11 < 2:
        return False        # "only enable sgemm for prompt processing"
    es = 2 if is_f16 else 4
    r2, r3 = ne12 // ne02, ne13 // ne03
    tr = traced(sync)
    for i13 in range(ne13):
        for i12 in range(ne12):
            a = src0 + (i12 // r2) * nb02 + (i13 // r3) * nb03
            if converted:
                b = wdata + (i12 * ne11 + i13 * ne12 * ne11) * ne10 * 2
                ldb = ne10
            else:
                b = src1 + i12 * nb12 + i13 * nb13
                ldb = nb11 // 4
            if not tinyblas_f(is_f16, ith, nth, sync, k, ne00, a, nb01 // es, b, ldb, dst + i12 * nb2 + i13 * nb3,
                              nb1 // 4, ne01, ne11, tr, i13 * ne12 + i12, ne12 * ne13, P[k, MMF_LANES]):
                return False
    return True


def row_kernel(P, k) -> str | None:
    """The kernel a MUL_MAT program row runs (for its trace events): "repack gemm", "sgemm" (where
    ``llamafile_mul_mat_f`` takes it) or "vec_dot chunks"; None for other ops."""
    op = P[k, OP]
    if op == OP_MUL_MAT_Q:
        return "repack gemm"
    if op != OP_MUL_MAT_F:
        return None
    m, n, kk = int(P[k, S0 + NE1]), int(P[k, S1 + NE1]), int(P[k, S0 + NE0])
    if P[k, MMF_LLAMAFILE] and n >= 2 and tinyblas_bm(m, kk, 1, int(P[k, MMF_LANES])) > 0:
        if P[k, MMF_TYPE] == T_F16 or is_contiguous_f32(*(int(P[k, S1 + c]) for c in (NE0, NE1, NE2, NE3, NB0, NB1,
                                                                                         NB2, NB3))):
            return "sgemm"
    return "vec_dot chunks"


# =================================================================================================================
# tinyBLAS_Q0_AVX for Q5_0 x Q8_0 on ggml's own 22-byte blocks
# =================================================================================================================
# What makes the bits (the same as ggml_vec_dot_q5_0_q8_0's, AVX2): every output C[j][i] is ONE 8-lane accumulator,
# lane u += d_a*d_b * P_u with one FMA per block, P_u the exact integer dot product of the block's elements
# 4u..4u+3 (updot: maddubs(|a|, sign(b, a)) then madd with ones; |a| <= 16 and |b| <= 127 cannot saturate), then
# sgemm.cpp's hsum. Here a row tile's blocks are unpacked once (tinyBLAS_Q0_AVX::load(block_q5_0): the nibbles OR
# the 5th bit as 0x10, minus 16; and sign(a, a)) into a small scratch that stays in L1, so the 5th bit is unpacked
# once per row tile, not once per tile of columns: which rows and columns a call covers never changes a bit.
Q5_0_SIZE = 22          # sizeof(block_q5_0): fp16 d, 4 bytes qh, 16 bytes qs
Q5_UNPACKED = 64        # per block in the scratch: the 32 levels a (int8), then |a|


def _q5_0_levels(builder, blk):
    """tinyBLAS_Q0_AVX::load(const block_q5_0 *): the block at address blk -> its 32 int8 levels q - 16 (the nibbles,
    OR the 5th bit as 0x10, minus 16; element j < 16 the low nibble of qs[j], j >= 16 the high nibble of qs[j - 16])
    and its d as float32 (exact)."""
    v32 = _vec(_i8, 32)
    zero = ir.Constant(v32, None)
    h = builder.load(_ptr(builder, blk, ir.IntType(16)), align=1)
    d = builder.fpext(builder.bitcast(h, ir.HalfType()), _f32)
    qh = builder.load(_ptr(builder, builder.add(blk, ir.Constant(_i64, 2)), _vec(_i8, 4)), align=1)
    qs = builder.load(_ptr(builder, builder.add(blk, ir.Constant(_i64, 6)), _vec(_i8, 16)), align=1)
    nib = builder.and_(builder.lshr(builder.shuffle_vector(qs, qs, _cvec(_i32, list(range(16)) * 2)),
                                    _cvec(_i8, [0] * 16 + [4] * 16)), _cvec(_i8, [15] * 32))
    # bit j of qh -> 0x10 (bytes_from_bits_32)
    hb = builder.and_(builder.shuffle_vector(qh, qh, _cvec(_i32, [j // 8 for j in range(32)])),
                      _cvec(_i8, [1 << (j % 8) for j in range(32)]))
    h5 = builder.select(builder.icmp_unsigned("!=", hb, zero), _cvec(_i8, [16] * 32), zero)
    return builder.sub(builder.or_(nib, h5), _cvec(_i8, [16] * 32)), d


@intrinsic
def q5_0_unpack_rows(typingctx, x, xrs, nrows, nb, scratch, sd):
    """Rows x + r*xrs (r < nrows) of nb block_q5_0 each -> scratch + (r*nb + b)*64: the int8 levels q - 16 of block
    b, then their absolute values (``_mm256_sign_epi8(a, a)``); sd + (r*nb + b)*4: the block's d as float32 (exact)."""
    def codegen(context, builder, sig, args):
        x, xrs, nrows, nb, scratch, sd = args
        v32 = _vec(_i8, 32)
        with cgutils.for_range(builder, nrows) as rl:
            row = builder.add(x, builder.mul(rl.index, xrs))
            with cgutils.for_range(builder, nb) as bl:
                i = builder.add(builder.mul(rl.index, nb), bl.index)
                a, d = _q5_0_levels(builder, builder.add(row, builder.mul(bl.index, ir.Constant(_i64, Q5_0_SIZE))))
                builder.store(d, _ptr(builder, builder.add(sd, builder.mul(i, ir.Constant(_i64, 4))), _f32),
                              align=1)
                dst = builder.add(scratch, builder.mul(i, ir.Constant(_i64, Q5_UNPACKED)))
                builder.store(a, _ptr(builder, dst, v32), align=1)
                builder.store(_sign_b(builder, a, a), _ptr(builder, builder.add(dst, ir.Constant(_i64, 32)), v32),
                              align=1)
        return context.get_dummy_value()
    return types.void(*([types.int64] * 6)), codegen


def _make_q0_tile(rm: int, rn: int):
    """C[j][i] for rm unpacked rows (scratch of ``q5_0_unpack_rows``) x rn Q8_0 columns (ggviz's split layout:
    int8 quants at yq + j*yqs, float32 d at yd + j*yds), all nb blocks: tinyBLAS_Q0_AVX's gemm<RM, RN> tile."""
    def gen(typingctx, a, ad, nb, yq, yqs, yd, yds, c, ldc):
        def codegen(context, builder, sig, args):
            a, ad, nb, yq, yqs, yd, yds, c, ldc = args
            v8f, v32 = _vec(_f32, 8), _vec(_i8, 32)
            fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(v8f, None)) for _ in range(rm)] for _ in range(rn)]
            rstride = builder.mul(nb, ir.Constant(_i64, Q5_UNPACKED))
            dstride = builder.mul(nb, ir.Constant(_i64, 4))
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                bq = [builder.load(_ptr(builder, builder.add(builder.add(yq, builder.mul(ir.Constant(_i64, j), yqs)),
                                                             builder.mul(b, ir.Constant(_i64, 32))), v32), align=1)
                      for j in range(rn)]
                bd = [builder.load(_ptr(builder, builder.add(builder.add(yd, builder.mul(ir.Constant(_i64, j), yds)),
                                                             builder.mul(b, ir.Constant(_i64, 4))), _f32), align=1)
                      for j in range(rn)]
                for i in range(rm):
                    ai = builder.add(builder.add(a, builder.mul(ir.Constant(_i64, i), rstride)),
                                     builder.mul(b, ir.Constant(_i64, Q5_UNPACKED)))
                    av = builder.load(_ptr(builder, ai, v32), align=1)
                    aa = builder.load(_ptr(builder, builder.add(ai, ir.Constant(_i64, 32)), v32), align=1)
                    da = builder.load(_ptr(builder, builder.add(builder.add(ad, builder.mul(ir.Constant(_i64, i),
                                                                                            dstride)),
                                                                builder.mul(b, ir.Constant(_i64, 4))), _f32), align=1)
                    for j in range(rn):
                        p = builder.sitofp(_madd_ones(builder, _maddubs(builder, aa, _sign_b(builder, bq[j], av))),
                                           v8f)
                        d = _splat(builder, builder.fmul(da, bd[j]), 8)
                        builder.store(builder.call(fma8, [d, p, builder.load(acc[j][i])]), acc[j][i])
            for j in range(rn):
                for i in range(rm):
                    r = _hsum8(builder, builder.load(acc[j][i]))
                    off = builder.add(builder.mul(ir.Constant(_i64, j), ldc), ir.Constant(_i64, 4 * i))
                    builder.store(r, _ptr(builder, builder.add(c, off), _f32), align=1)
            return context.get_dummy_value()
        return types.void(*([types.int64] * 9)), codegen
    gen.__name__ = f"q0_tile_{rm}x{rn}"
    return intrinsic(gen)


q0_tile_4x2 = _make_q0_tile(4, 2)
q0_tile_4x1 = _make_q0_tile(4, 1)
q0_tile_1x2 = _make_q0_tile(1, 2)
q0_tile_1x1 = _make_q0_tile(1, 1)
Q5_ROWS = 4             # rows unpacked (and computed) together
# from this many src1 columns on (a prompt), Q5_0's MUL_MAT reads ggml's blocks here; below, the unpack would not
# pay for itself and the CPU_REPACK's Q8_0 expansion is faster (a decode's GEMV: ~1.8x)
Q5_RAW_COLS = 32


@compiled
def q5_0_rows(x, xrs, r0, r1, nb, yq, yqs, yd, yds, ncols, c, ldc, scratch):
    """C[j][i] = row i of the Q5_0 matrix x (row stride xrs bytes) . column j of the Q8_0 src1 (split layout), for
    rows [r0, r1) and columns [0, ncols): c + j*ldc + i*4. ``scratch``: Q5_ROWS*nb*68 bytes."""
    sd = scratch + Q5_ROWS * nb * Q5_UNPACKED
    i = r0
    while i < r1:
        rm = min(Q5_ROWS, r1 - i)
        q5_0_unpack_rows(x + i * xrs, xrs, rm, nb, scratch, sd)
        ci = c + i * 4
        if rm == Q5_ROWS:
            j = 0
            while j + 2 <= ncols:
                q0_tile_4x2(scratch, sd, nb, yq + j * yqs, yqs, yd + j * yds, yds, ci + j * ldc, ldc)
                j += 2
            if j < ncols:
                q0_tile_4x1(scratch, sd, nb, yq + j * yqs, yqs, yd + j * yds, yds, ci + j * ldc, ldc)
        else:
            for r in range(rm):
                a, ad = scratch + r * nb * Q5_UNPACKED, sd + r * nb * 4
                j = 0
                while j + 2 <= ncols:
                    q0_tile_1x2(a, ad, nb, yq + j * yqs, yqs, yd + j * yds, yds, ci + r * 4 + j * ldc, ldc)
                    j += 2
                if j < ncols:
                    q0_tile_1x1(a, ad, nb, yq + j * yqs, yqs, yd + j * yds, yds, ci + r * 4 + j * ldc, ldc)
        i += rm
