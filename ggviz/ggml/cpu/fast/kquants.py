"""The compiled (Numba) kernels of Gemma-3's quant types: Q8_0, Q5_0, Q4_K and Q6_K, bit for bit as llama.cpp's AVX2.

Mirrors, from the ggml that llama-cpp-python 0.3.36 vendors (ggml 0.25.3, ``src/ggml-cpu``):

* ``arch/x86/quants.c`` (AVX2): ``ggml_vec_dot_q8_0_q8_0``, ``ggml_vec_dot_q5_0_q8_0``, ``ggml_vec_dot_q4_K_q8_K``,
  ``ggml_vec_dot_q6_K_q8_K`` and ``quantize_row_q8_K`` (which is ``quantize_row_q8_K_ref`` on x86);
* ``arch/x86/repack.cpp`` (AVX2): ``ggml_quantize_mat_q8_K_4x8``, ``ggml_gemv_q4_K_8x8_q8_K``,
  ``ggml_gemm_q4_K_8x8_q8_K`` on repack.cpp's ``block_q4_Kx8`` / ``block_q8_Kx4`` layouts;
* ``tiled/tiled-kernel.cpp``'s AVX2 microtile for Q4_K / Q6_K (MUL_MATs of >= 8 src1 rows on weights that are
  not repacked);
* ``ggml-quants.c``: ``dequantize_row_{q8_0,q5_0,q4_K,q6_K}`` (GET_ROWS).

The SIMD kernels are written as scalar loops that keep the vector code's float order: the integer products are
summed exactly (int64 here, int16/int32 lanes there: no lane of these kernels can overflow), and every float32 lane of
the C code is a float32 variable here, updated by the same ``fmaf`` / mul / add in the same order (``hsum_float_8``
included). The faithful NumPy versions of the same arithmetic are ``cpu/quants.py`` (vec_dot, the tiled kernel) and
``cpu/repack.py`` (the q4_K_8x8 kernels); tests/test_kquants.py checks both against llama.cpp's own library.

All kernels take raw addresses (``tensor->data``-style ints), like the rest of the fast path.
"""
from __future__ import annotations

import numpy as np

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .intrinsics import (
    HAVE_AVX2,
    _cvec,
    _decl,
    _f32,
    _i8,
    _i16,
    _i32,
    _i64,
    _maddubs,
    _ptr,
    _splat,
    _vec,
    atomic_add,
    atomic_store,
    compiled,
    f32_to_f16,
    fmaf,
    fp16_to_fp32,
    ld_f32,
    ld_i8,
    ld_u8,
    ld_u16,
    rdtsc,
    st_f32,
    st_i8,
    st_u16,
)
from .program import (
    DATA,
    DST,
    MMQ_QS,
    MMQ_TYPE,
    NB1,
    NB2,
    NE0,
    NE1,
    NE2,
    S0,
    S1,
    SYNC_CHUNK,
    T_Q4_K,
    TR_CHUNK,
    TRW_KERNEL,
)
from .sync import tr_rec, traced, traced_barrier

F32 = np.float32

# block sizes in bytes (ggml-common.h)
Q8_0_SIZE, Q5_0_SIZE, Q4_K_SIZE, Q6_K_SIZE, Q8_K_SIZE = 34, 22, 144, 210, 292
Q4_KX8_SIZE, Q8_KX4_SIZE = 1152, 1168


# =================================================================================================================
# SIMD integer parts (LLVM IR, AVX2 intrinsics where the CPU has them): exact int32 lane sums, as the C computes them
# =================================================================================================================

def _madd(builder, a16, b16):
    """pmaddwd: i16 x i16, adjacent products summed to i32."""
    if HAVE_AVX2:
        fn = _decl(builder, "llvm.x86.avx2.pmadd.wd", _vec(_i32, 8), [_vec(_i16, 16), _vec(_i16, 16)])
        return builder.call(fn, [a16, b16])
    a = builder.sext(a16, _vec(_i32, 16))
    b = builder.sext(b16, _vec(_i32, 16))
    p = builder.mul(a, b)
    even = builder.shuffle_vector(p, p, _cvec(_i32, list(range(0, 16, 2))))
    odd = builder.shuffle_vector(p, p, _cvec(_i32, list(range(1, 16, 2))))
    return builder.add(even, odd)


def _ld(builder, addr, off, n=32, t=None):
    t = t or _i8
    return builder.load(_ptr(builder, builder.add(addr, ir.Constant(_i64, off)), _vec(t, n)), align=1)


def _bsplat(builder, v):
    return _cvec(_i8, [v] * 32)


def _st_i32x8(builder, addr, v):
    builder.store(v, _ptr(builder, addr, _vec(_i32, 8)), align=1)


def _q6_K_half_levels(builder, xb, j):
    """Half ``j`` (128 weights) of a block_q6_K as 4 vectors of 32 unsigned 6-bit levels: the low 4 bits from
    ql (two nibbles of 64 bytes), the high 2 from qh (4 pairs in each of 32 bytes) -- the unpack both the
    vec_dot and the tiled path do."""
    m15 = _bsplat(builder, 15)
    b1 = _ld(builder, xb, 64 * j)
    b2 = _ld(builder, xb, 64 * j + 32)
    bh = _ld(builder, xb, 128 + 32 * j)
    h0 = builder.shl(builder.and_(bh, _bsplat(builder, 3)), _bsplat(builder, 4))
    h1 = builder.shl(builder.and_(bh, _bsplat(builder, 12)), _bsplat(builder, 2))
    h2 = builder.and_(bh, _bsplat(builder, 48))
    h3 = builder.lshr(builder.and_(bh, _bsplat(builder, 192)), _bsplat(builder, 2))
    return [builder.or_(builder.and_(b1, m15), h0), builder.or_(builder.and_(b2, m15), h1),
            builder.or_(builder.and_(builder.lshr(b1, _bsplat(builder, 4)), m15), h2),
            builder.or_(builder.and_(builder.lshr(b2, _bsplat(builder, 4)), m15), h3)]


def _q6_K_sumi_ir(builder, xb, yb):
    """ggml_vec_dot_q6_K_q8_K's AVX2 integer part for one block: sumi (8 x int32, the -32 offset subtracted as
    q8sclsub), as an IR value."""
    sc8 = _ld(builder, xb, 192, 16)                                    # int8 scales[16]
    sc16 = builder.sext(sc8, _vec(_i16, 16))
    bsums = _ld(builder, yb, 260, 16, _i16)
    sub = builder.shl(_madd(builder, bsums, sc16), _cvec(_i32, [5] * 8))
    sumi = ir.Constant(_vec(_i32, 8), None)
    for j in range(2):
        qs = _q6_K_half_levels(builder, xb, j)
        ps = []
        for r in range(4):
            q8 = _ld(builder, yb, 4 + 128 * j + 32 * r)
            p16 = _maddubs(builder, qs[r], q8)
            k = 8 * j + 2 * r                                          # scales k (bytes 0..15), k+1 (16..31)
            scv = builder.shuffle_vector(sc16, sc16, _cvec(_i32, [k] * 8 + [k + 1] * 8))
            ps.append(_madd(builder, scv, p16))
        sumi = builder.add(sumi, builder.add(ps[0], ps[1]))
        sumi = builder.add(sumi, builder.add(ps[2], ps[3]))
    return builder.sub(sumi, sub)


@intrinsic
def q6_K_sumi(typingctx, xb, yb, out):
    """ggml_vec_dot_q6_K_q8_K's AVX2 integer part for one block: sumi (8 x int32) stored at out."""
    def codegen(context, builder, sig, args):
        xb, yb, out = args
        _st_i32x8(builder, out, _q6_K_sumi_ir(builder, xb, yb))
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


def _q6_K_levels_sumi_ir(builder, u, scv, yb, q8s):
    """One row's 8 int32 lanes of ``q6_K_levels_sumi`` with the scales pre-expanded: scv = per 32-element group g
    the 16 int16 lanes [sc[2g]] * 8 + [sc[2g + 1]] * 8 (8 groups, 256 bytes); q8s = the block's 8 loaded q8 groups."""
    sc16 = builder.load(_ptr(builder, builder.add(scv, ir.Constant(_i64, 256)), _vec(_i16, 16)), align=1)
    bsums = _ld(builder, yb, 260, 16, _i16)
    sumi = builder.sub(ir.Constant(_vec(_i32, 8), None),
                       builder.shl(_madd(builder, bsums, sc16), _cvec(_i32, [5] * 8)))
    for g in range(8):
        p16 = _maddubs(builder, _ld(builder, u, 32 * g), q8s[g])
        sumi = builder.add(sumi, _madd(builder, _ld(builder, scv, 32 * g, 16, _i16), p16))
    return sumi


def _hsum_rows_ir(builder, vs):
    """8 vectors of 8 int32 -> one vector of their 8 sums (exact: integers), by pairwise shuffles."""
    def pair(a, b, lo, hi):
        return builder.add(builder.shuffle_vector(a, b, _cvec(_i32, lo)), builder.shuffle_vector(a, b, _cvec(_i32, hi)))
    w = [pair(vs[2 * i], vs[2 * i + 1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]) for i in range(4)]
    x = [pair(w[2 * i], w[2 * i + 1], [0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]) for i in range(2)]
    return pair(x[0], x[1], [0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13, 15])


@intrinsic
def q6_K_unpack(typingctx, xb, u, scv):
    """tiled_unpack_src0 for one block_q6_K: its 256 unsigned 6-bit levels (element order) stored at u, its 16
    scales widened to int16 and expanded per 32-element group at scv (the layout ``_q6_K_levels_sumi_ir`` reads)."""
    def codegen(context, builder, sig, args):
        xb, u, scv = args
        for j in range(2):
            qs = _q6_K_half_levels(builder, xb, j)
            for r in range(4):
                builder.store(qs[r], _ptr(builder, builder.add(u, ir.Constant(_i64, 128 * j + 32 * r)),
                                          _vec(_i8, 32)), align=1)
        sc16 = builder.sext(_ld(builder, xb, 192, 16), _vec(_i16, 16))
        builder.store(sc16, _ptr(builder, builder.add(scv, ir.Constant(_i64, 256)), _vec(_i16, 16)), align=1)
        for g in range(8):
            v = builder.shuffle_vector(sc16, sc16, _cvec(_i32, [2 * g] * 8 + [2 * g + 1] * 8))
            builder.store(v, _ptr(builder, builder.add(scv, ir.Constant(_i64, 32 * g)), _vec(_i16, 16)), align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def q6_K_levels_acc8(typingctx, u, scv, yb, dx, acc):
    """One Q6_K block of 8 src0 rows (unpacked: levels u at a 256-byte row stride, scales pre-expanded at scv with
    a 288-byte row stride, see ``_q6_K_levels_sumi_ir``; their d at dx, 8 float32) against one Q8_K block yb: per
    row r ``acc[r] = fmadd(dx[r] * (float) s1_r, y->d, acc[r])`` -- ``_tiled_dot``'s float steps, 8 rows in the 8
    float lanes (s1_r the same exact integer)."""
    def codegen(context, builder, sig, args):
        u, scv, yb, dx, acc = args
        v8f = _vec(_f32, 8)
        q8s = [_ld(builder, yb, 4 + 32 * g) for g in range(8)]
        rows = [_q6_K_levels_sumi_ir(builder, builder.add(u, ir.Constant(_i64, 256 * r)),
                                     builder.add(scv, ir.Constant(_i64, 288 * r)), yb, q8s) for r in range(8)]
        s1 = builder.sitofp(_hsum_rows_ir(builder, rows), v8f)
        res = builder.fmul(builder.load(_ptr(builder, dx, v8f), align=1), s1)
        dy = builder.load(_ptr(builder, yb, _f32), align=1)
        fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
        pa = _ptr(builder, acc, v8f)
        builder.store(builder.call(fma8, [res, _splat(builder, dy, 8), builder.load(pa, align=1)]), pa, align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def q6_K_levels_sumi(typingctx, u, scv, yb):
    """``q6_K_levels_acc8``'s integer part for one row: s1 (int64)."""
    def codegen(context, builder, sig, args):
        u, scv, yb = args
        q8s = [_ld(builder, yb, 4 + 32 * g) for g in range(8)]
        sumi = _q6_K_levels_sumi_ir(builder, u, scv, yb, q8s)
        t = builder.sext(builder.extract_element(sumi, ir.Constant(_i32, 0)), _i64)
        for ln in range(1, 8):
            t = builder.add(t, builder.sext(builder.extract_element(sumi, ir.Constant(_i32, ln)), _i64))
        return t
    return types.int64(types.int64, types.int64, types.int64), codegen


@intrinsic
def q6_K_block_acc(typingctx, xb, yb, acc):
    """One block of ggml_vec_dot_q6_K_q8_K (AVX2), the float part included: ``acc = fmadd(d, (float) sumi, acc)``
    on the 8 float32 lanes at acc, d = y->d * fp16(x->d) (one float32 product, as the C)."""
    def codegen(context, builder, sig, args):
        xb, yb, acc = args
        v8f = _vec(_f32, 8)
        sumi = _q6_K_sumi_ir(builder, xb, yb)
        dy = builder.load(_ptr(builder, yb, _f32), align=1)
        hx = builder.load(_ptr(builder, builder.add(xb, ir.Constant(_i64, 208)), _i16), align=1)
        dx = builder.fpext(builder.bitcast(hx, ir.HalfType()), _f32)
        d = builder.fmul(dy, dx)
        fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
        pa = _ptr(builder, acc, v8f)
        a = builder.load(pa, align=1)
        builder.store(builder.call(fma8, [_splat(builder, d, 8), builder.sitofp(sumi, v8f), a]), pa, align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def q4_K_sumi(typingctx, xb, yb, sc, out):
    """ggml_vec_dot_q4_K_q8_K's AVX2 integer part for one block: sumi (8 x int32) stored at out; sc: the 8 decoded
    6-bit scales as int16 (address)."""
    def codegen(context, builder, sig, args):
        xb, yb, sc, out = args
        sc16 = builder.load(_ptr(builder, sc, _vec(_i16, 8)), align=1)
        sumi = ir.Constant(_vec(_i32, 8), None)
        m4 = _bsplat(builder, 15)
        for j in range(4):
            bits = _ld(builder, xb, 16 + 32 * j)
            lo = builder.and_(bits, m4)
            hi = builder.and_(builder.lshr(bits, _bsplat(builder, 4)), m4)
            sl = builder.shuffle_vector(sc16, sc16, _cvec(_i32, [2 * j] * 16))
            sh = builder.shuffle_vector(sc16, sc16, _cvec(_i32, [2 * j + 1] * 16))
            pl = _madd(builder, sl, _maddubs(builder, lo, _ld(builder, yb, 4 + 64 * j)))
            ph = _madd(builder, sh, _maddubs(builder, hi, _ld(builder, yb, 4 + 64 * j + 32)))
            sumi = builder.add(sumi, builder.add(pl, ph))
        _st_i32x8(builder, out, sumi)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64, types.int64), codegen


def _q4_Kx8_dots_ir(builder, xb, q8, gstride):
    """The 64 exact int32 dot products of one block_q4_Kx8 at xb with one q8_K row, as 8 IR vectors: vector s lane r
    = sum over the 32 elements of sub-block s of row r's 4-bit level times the q8 value. The q8 values come in
    groups of 8 elements, group g at q8 + g*gstride (8 for a block_q8_K, 32 for a row of block_q8_Kx4)."""
    res = [None] * 8
    m4 = _bsplat(builder, 15)
    ones = _cvec(_i16, [1] * 16)
    for j in range(4):                       # sub-blocks 2j (low nibbles) and 2j+1 (high nibbles)
        acc = {}
        for c in range(4):                   # 64-byte chunk 4j + c: rows 0..7 x 8 bytes (Q4_K bytes 8c'..)
            for half in range(2):            # rows 0-3, rows 4-7
                v = _ld(builder, xb, 128 + 64 * (4 * j + c) + 32 * half)
                for nib in range(2):
                    q = builder.and_(v, m4) if nib == 0 else builder.and_(builder.lshr(v, _bsplat(builder, 4)), m4)
                    g = 8 * j + 4 * nib + c   # the 8 q8 values: elements 64j + 32*nib + 8c ..
                    ya = builder.add(q8, builder.mul(ir.Constant(_i64, g), gstride))
                    y8 = builder.load(_ptr(builder, ya, _vec(_i8, 8)), align=1)
                    y32 = builder.shuffle_vector(y8, y8, _cvec(_i32, list(range(8)) * 4))
                    p = _madd(builder, _maddubs(builder, q, y32), ones)   # 4 rows x 2 partial sums
                    key = (nib, half)
                    acc[key] = p if key not in acc else builder.add(acc[key], p)
        for nib in range(2):
            r4 = []
            for half in range(2):
                p = acc[(nib, half)]
                ev = builder.shuffle_vector(p, p, _cvec(_i32, [0, 2, 4, 6]))
                od = builder.shuffle_vector(p, p, _cvec(_i32, [1, 3, 5, 7]))
                r4.append(builder.add(ev, od))
            res[2 * j + nib] = builder.shuffle_vector(r4[0], r4[1], _cvec(_i32, list(range(8))))
    return res


def _kx8_scales_ir(builder, xb):
    """The 8 rows' 6-bit scales and mins of the 8 sub-blocks of a block_q4_Kx8, as 2 x 8 IR vectors (<8 x i32>,
    lane = row): sub-block s's 12 bytes at xb + 32 + 12*s pack the 8 rows as a Q4_K packs its 8 sub-blocks,
    unpacked with the kernels' kmask trick, for the 8 sub-blocks at once (lane s of u0 / u1 / u2)."""
    v8 = _vec(_i32, 8)
    raw = builder.load(_ptr(builder, builder.add(xb, ir.Constant(_i64, 32)), _vec(_i32, 24)), align=1)
    u0, u1, u2 = (builder.shuffle_vector(raw, raw, _cvec(_i32, list(range(o, 24, 3)))) for o in range(3))
    k1, k2, k3 = _cvec(_i32, [0x3F3F3F3F] * 8), _cvec(_i32, [0x0F0F0F0F] * 8), _cvec(_i32, [0x03030303] * 8)
    c4, c6 = _cvec(_i32, [4] * 8), _cvec(_i32, [6] * 8)
    u3 = builder.or_(builder.and_(builder.lshr(u2, c4), k2), builder.shl(builder.and_(builder.lshr(u1, c6), k3), c4))
    u1n = builder.or_(builder.and_(u2, k2), builder.shl(builder.and_(builder.lshr(u0, c6), k3), c4))
    u2n = builder.and_(u1, k1)
    u0n = builder.and_(u0, k1)
    b32 = _vec(_i8, 32)
    sca, scb, mna, mnb = (builder.bitcast(u, b32) for u in (u0n, u1n, u2n, u3))
    sc, mn = [], []
    for s_ in range(8):
        idx = _cvec(_i32, [4 * s_ + i for i in range(4)] + [32 + 4 * s_ + i for i in range(4)])
        sc.append(builder.zext(builder.shuffle_vector(sca, scb, idx), v8))
        mn.append(builder.zext(builder.shuffle_vector(mna, mnb, idx), v8))
    return sc, mn


@intrinsic
def q4_Kx8_gemv_block(typingctx, xb, yb, acc, accm):
    """One super-block of ggml_gemv_q4_K_8x8_q8_K (AVX2) for the 8 rows of the block_q4_Kx8 at xb and the block_q8_K
    at yb: isum / imin (exact int32 sums over the 8 sub-blocks of scale * dot and min * bsum pair), then per row
    ``acc = fmadd((float) isum, d_x*d_y, acc)``, ``accm = fmadd((float) imin, dmin_x*d_y, accm)`` on the 8 float32
    lanes at acc / accm."""
    def codegen(context, builder, sig, args):
        xb, yb, acc, accm = args
        v8f, v8 = _vec(_f32, 8), _vec(_i32, 8)
        dots = _q4_Kx8_dots_ir(builder, xb, builder.add(yb, ir.Constant(_i64, 4)), ir.Constant(_i64, 8))
        sc, mn = _kx8_scales_ir(builder, xb)
        bs = builder.sext(_ld(builder, yb, 260, 16, _i16), _vec(_i32, 16))
        b32 = builder.add(builder.shuffle_vector(bs, bs, _cvec(_i32, list(range(0, 16, 2)))),
                          builder.shuffle_vector(bs, bs, _cvec(_i32, list(range(1, 16, 2)))))
        isum = ir.Constant(v8, None)
        imin = ir.Constant(v8, None)
        for s_ in range(8):
            isum = builder.add(isum, builder.mul(sc[s_], dots[s_]))
            bsp = builder.shuffle_vector(b32, b32, _cvec(_i32, [s_] * 8))
            imin = builder.add(imin, builder.mul(mn[s_], bsp))
        h = builder.load(_ptr(builder, xb, _vec(_i16, 16)), align=1)
        dd = builder.fpext(builder.bitcast(h, _vec(ir.HalfType(), 16)), _vec(_f32, 16))
        dx = builder.shuffle_vector(dd, dd, _cvec(_i32, list(range(8))))
        dm = builder.shuffle_vector(dd, dd, _cvec(_i32, list(range(8, 16))))
        dy = _splat(builder, builder.load(_ptr(builder, yb, _f32), align=1), 8)
        fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
        pa, pm = _ptr(builder, acc, v8f), _ptr(builder, accm, v8f)
        builder.store(builder.call(fma8, [builder.sitofp(isum, v8f), builder.fmul(dx, dy), builder.load(pa, align=1)]),
                      pa, align=1)
        builder.store(builder.call(fma8, [builder.sitofp(imin, v8f), builder.fmul(dm, dy), builder.load(pm, align=1)]),
                      pm, align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64, types.int64), codegen


@compiled(inline="always")
def _hsum_float_8(a0, a1, a2, a3, a4, a5, a6, a7):
    # hsum_float_8: hi128 + lo128, then + movehl, then + movehdup
    r0, r1, r2, r3 = a4 + a0, a5 + a1, a6 + a2, a7 + a3
    return (r0 + r2) + (r1 + r3)


@compiled
def _hsum8(acc):
    return _hsum_float_8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7])


@compiled(inline="always")
def _q5_0_level(x, j):
    # x: block_q5_0 {d, qh[4], qs[16]}; element j < 16: low nibble of qs[j], >= 16: high nibble of qs[j-16];
    # the 5th bit is bit j of qh; the AVX2 kernel's signed byte is the 5-bit value - 16
    qh = np.int64(ld_u8(x + 2)) | (np.int64(ld_u8(x + 3)) << 8) | (np.int64(ld_u8(x + 4)) << 16) \
        | (np.int64(ld_u8(x + 5)) << 24)
    b = np.int64(ld_u8(x + 6 + (j & 15)))
    v = (b & 0xF) if j < 16 else (b >> 4)
    return (v | (((qh >> j) & 1) << 4)) - 16


@compiled
def vec_dot_q8_0_q8_0(n, x, y, is_q5_0):
    """ggml_vec_dot_q8_0_q8_0 / ggml_vec_dot_q5_0_q8_0 (AVX2) of one row pair: 8 lanes ``acc = fmadd(d_x*d_y,
    (float) lane sum, acc)``, lane l summing elements 4l..4l+3 of each block; hsum_float_8. (llamafile's
    tinyBLAS_Q0_AVX, which llama.cpp runs for these types, has the same per-element arithmetic.)"""
    nb = n // 32
    bx = Q5_0_SIZE if is_q5_0 else Q8_0_SIZE
    acc = np.zeros(8, np.float32)
    for ib in range(nb):
        xb = x + ib * bx
        yb = y + ib * Q8_0_SIZE
        d = fp16_to_fp32(ld_u16(xb)) * fp16_to_fp32(ld_u16(yb))
        for ln in range(8):
            p = np.int64(0)
            for e in range(4 * ln, 4 * ln + 4):
                xv = _q5_0_level(xb, e) if is_q5_0 else np.int64(ld_i8(xb + 2 + e))
                p += xv * np.int64(ld_i8(yb + 2 + e))
            acc[ln] = fmaf(d, F32(p), acc[ln])
    return _hsum8(acc)


@compiled(inline="always")
def _scale_min_k4(j, q):
    # get_scale_min_k4 on the 12 scale bytes at address q
    if j < 4:
        return np.int64(ld_u8(q + j)) & 63, np.int64(ld_u8(q + j + 4)) & 63
    d = (np.int64(ld_u8(q + j + 4)) & 0xF) | ((np.int64(ld_u8(q + j - 4)) >> 6) << 4)
    m = (np.int64(ld_u8(q + j + 4)) >> 4) | ((np.int64(ld_u8(q + j)) >> 6) << 4)
    return d, m


@compiled
def vec_dot_q4_K_q8_K(n, x, y):
    """ggml_vec_dot_q4_K_q8_K (AVX2) of one row pair."""
    nb = n // 256
    acc = np.zeros(8, np.float32)
    accm = np.zeros(4, np.float32)
    sumi = np.zeros(8, np.int32)
    sc = np.zeros(8, np.int16)
    for i in range(nb):
        xb = x + i * Q4_K_SIZE
        yb = y + i * Q8_K_SIZE
        yd = ld_f32(yb)
        d = yd * fp16_to_fp32(ld_u16(xb))
        dmin = -yd * fp16_to_fp32(ld_u16(xb + 2))
        # mins . bsums of 32 (hadd of the 16 bsums), 4 lanes of 2 products
        for k in range(4):
            p = np.int64(0)
            for h in range(2):
                s = 2 * k + h
                m = _scale_min_k4(s, xb + 4)[1]
                bs = _s16(np.int64(ld_u16(yb + 260 + 4 * s))) + _s16(np.int64(ld_u16(yb + 262 + 4 * s)))
                p += m * bs
            accm[k] = fmaf(dmin, F32(p), accm[k])
        for j in range(8):
            sc[j] = _scale_min_k4(j, xb + 4)[0]
        q4_K_sumi(xb, yb, sc.ctypes.data, sumi.ctypes.data)
        for ln in range(8):
            acc[ln] = fmaf(d, F32(sumi[ln]), acc[ln])
    m2a = accm[0] + accm[2]
    m2b = accm[1] + accm[3]
    return _hsum8(acc) + (m2a + m2b)


@compiled(inline="always")
def _s16(v):
    return v - 65536 if v >= 32768 else v


@compiled(inline="always")
def _q6_level(xb, e):
    # block_q6_K {ql[128], qh[64], scales[16], d}: the unsigned 6-bit level (0..63) of element e
    j, r, l = e >> 7, (e >> 5) & 3, e & 31
    ql = np.int64(ld_u8(xb + 64 * j + l + (32 if (r & 1) else 0)))
    qh = np.int64(ld_u8(xb + 128 + 32 * j + l))
    lo = (ql >> 4) if r >= 2 else (ql & 0xF)
    return lo | (((qh >> (2 * r)) & 3) << 4)


@compiled
def _vec_dot_q6_K(n, x, y, acc, sumi):
    nb = n // 256
    for ln in range(8):
        acc[ln] = F32(0.0)
    for i in range(nb):
        xb = x + i * Q6_K_SIZE
        yb = y + i * Q8_K_SIZE
        q6_K_block_acc(xb, yb, acc.ctypes.data)
    return _hsum8(acc)


@compiled
def vec_dot_q6_K_q8_K(n, x, y):
    """ggml_vec_dot_q6_K_q8_K (AVX2) of one row pair: unsigned levels, the -32 offset as lane k's
    32*(bsums[2k]*sc[2k] + bsums[2k+1]*sc[2k+1])."""
    return _vec_dot_q6_K(n, x, y, np.zeros(8, np.float32), np.zeros(8, np.int32))


# =================================================================================================================
# src1 quantization to Q8_K
# =================================================================================================================

@compiled
def quantize_row_q8_K(x, y, k):
    """quantize_row_q8_K (= quantize_row_q8_K_ref on x86): float32 row at x -> block_q8_K at y. An all-zero block
    gets zero bsums too (the reference leaves them as they were)."""
    for i in range(k // 256):
        xb = x + 4 * 256 * i
        yb = y + Q8_K_SIZE * i
        amax = F32(0.0)
        mx = F32(0.0)
        for j in range(256):
            v = ld_f32(xb + 4 * j)
            if abs(v) > amax:
                amax = abs(v)
                mx = v
        if amax == F32(0.0):
            st_f32(yb, F32(0.0))
            for j in range(256 + 32):
                st_i8(yb + 4 + j, np.int8(0))
            continue
        iscale = F32(-127.0) / mx
        for g in range(16):
            s = np.int64(0)
            for j in range(16 * g, 16 * g + 16):
                v = np.int64(np.rint(iscale * ld_f32(xb + 4 * j)))      # nearest_int: round half to even
                if v > 127:
                    v = 127
                st_i8(yb + 4 + j, np.int8(v))
                s += v
            st_u16(yb + 260 + 2 * g, np.uint16(s & 0xFFFF))
        st_f32(yb, F32(1.0) / iscale)


@intrinsic
def q8_K_absmax_pos(typingctx, xb):
    """The 256 floats at xb: amax = the largest |x| that compares greater (NaNs never do; 0 when none), as the
    running ``a if a > amax else amax`` (any order gives the same value), and whether some x == +amax: returns
    amax, negated when no x equals +amax (-0.0 for an all-zero block: the caller tests amax != 0 first)."""
    def codegen(context, builder, sig, args):
        (xb,) = args
        v8f = _vec(_f32, 8)
        fabs = _decl(builder, "llvm.fabs.v8f32", v8f, [v8f])
        xs = [builder.load(_ptr(builder, builder.add(xb, ir.Constant(_i64, 32 * c)), v8f), align=1) for c in range(32)]
        m = ir.Constant(v8f, None)
        for x in xs:
            a = builder.call(fabs, [x])
            m = builder.select(builder.fcmp_ordered(">", a, m), a, m)
        amax = ir.Constant(_f32, 0.0)
        for j in range(8):
            e = builder.extract_element(m, ir.Constant(_i32, j))
            amax = builder.select(builder.fcmp_ordered(">", e, amax), e, amax)
        sp = _splat(builder, amax, 8)
        hit = builder.fcmp_ordered("==", xs[0], sp)
        for x in xs[1:]:
            hit = builder.or_(hit, builder.fcmp_ordered("==", x, sp))
        bits = builder.bitcast(builder.zext(hit, _vec(_i8, 8)), _i64)
        return builder.select(builder.icmp_unsigned("!=", bits, ir.Constant(_i64, 0)), amax, builder.fneg(amax))
    return types.float32(types.int64), codegen


@intrinsic
def q8_K_quant32(typingctx, x, iscale, q, qstride):
    """32 floats at x -> int8 ``rint(x*iscale)`` (NaN -> -128, else clamped to [-128, 127] as floats), stored as
    four 8-byte runs at q, q + qstride, ...; returns the two int32 sums of 16 as (s0 & 0xFFFFFFFF) | s1 << 32."""
    def codegen(context, builder, sig, args):
        x, iscale, q, qstride = args
        v32f = _vec(_f32, 32)
        rint = _decl(builder, "llvm.rint.v32f32", v32f, [v32f])
        v = builder.call(rint, [builder.fmul(builder.load(_ptr(builder, x, v32f), align=1),
                                             _splat(builder, iscale, 32))])
        lo, hi = _splat(builder, ir.Constant(_f32, -128.0), 32), _splat(builder, ir.Constant(_f32, 127.0), 32)
        c = builder.select(builder.fcmp_ordered(">", v, lo), v, lo)       # max(v, -128): v unless v <= -128
        c = builder.select(builder.fcmp_ordered("<", c, hi), c, hi)       # min(c, 127)
        c = builder.select(builder.fcmp_unordered("uno", v, v), lo, c)     # NaN -> -128
        qi = builder.fptosi(c, _vec(_i32, 32))
        q8 = builder.trunc(qi, _vec(_i8, 32))
        for t in range(4):
            part = builder.shuffle_vector(q8, q8, _cvec(_i32, list(range(8 * t, 8 * t + 8))))
            builder.store(part, _ptr(builder, builder.add(q, builder.mul(ir.Constant(_i64, t), qstride)),
                                     _vec(_i8, 8)), align=1)
        sums = []
        for h in range(2):
            w = builder.shuffle_vector(qi, qi, _cvec(_i32, list(range(16 * h, 16 * h + 16))))
            n = 16
            while n > 1:
                n //= 2
                w = builder.add(builder.shuffle_vector(w, w, _cvec(_i32, list(range(n)))),
                                builder.shuffle_vector(w, w, _cvec(_i32, list(range(n, 2 * n)))))
            sums.append(builder.zext(builder.extract_element(w, ir.Constant(_i32, 0)), _i64))
        return builder.or_(sums[0], builder.shl(sums[1], ir.Constant(_i64, 32)))
    return types.int64(types.int64, types.float32, types.int64, types.int64), codegen


@compiled
def quantize_mat_q8_K_4x8(x, row_stride, y, k):
    """ggml_quantize_mat_q8_K_4x8 (AVX2): 4 float32 rows (x, x + row_stride bytes, ...) -> block_q8_Kx4 at y.
    The scale is -127/amax when some value equals +amax, else 127/amax (the AVX2 code's sign test). A super-block
    of a row at a time in vector IR (q8_K_absmax_pos, q8_K_quant32): the same compares, products and roundings as
    the scalar loops they replace, whatever the order."""
    for i in range(k // 256):
        yb = y + Q8_KX4_SIZE * i
        for r in range(4):
            xb = x + r * row_stride + 4 * 256 * i
            am = q8_K_absmax_pos(xb)
            amax = abs(am)
            if amax != F32(0.0):
                iscale = (F32(-127.0) if am > F32(0.0) else F32(127.0)) / amax
                st_f32(yb + 4 * r, F32(1.0) / iscale)
            else:
                iscale = F32(0.0)
                st_f32(yb + 4 * r, F32(0.0))
            for j0 in range(0, 256, 32):
                s2 = q8_K_quant32(xb + 4 * j0, iscale, yb + 16 + 32 * (j0 >> 3) + 8 * r, 32)
                for h in range(2):
                    g = j0 // 16 + h
                    s = (s2 >> (32 * h)) & 0xFFFF
                    st_u16(yb + 16 + 1024 + 2 * (16 * (g >> 2) + 4 * r + (g & 3)), np.uint16(s))


@intrinsic
def q4_Kx8_gemm_block(typingctx, xb, yb, acc, accm):
    """One super-block of ggml_gemm_q4_K_8x8_q8_K (AVX2): the 8 rows of the block_q4_Kx8 at xb times the 4 rows of
    the block_q8_Kx4 at yb. For q8 row rr and each pair of sub-blocks (2sb, 2sb+1): the exact int32 ``sc*dot +
    sc*dot`` and ``mn*bsum + mn*bsum``, then ``acc = fmadd((float) isum, d_x*d_y, acc)``, ``accm = fmadd((float)
    imin, dmin_x*d_y, accm)`` on the 8 float32 lanes at acc + 32*rr / accm + 32*rr (4 of each per super-block)."""
    def codegen(context, builder, sig, args):
        xb, yb, acc, accm = args
        v8f = _vec(_f32, 8)
        fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
        sc, mn = _kx8_scales_ir(builder, xb)
        h = builder.load(_ptr(builder, xb, _vec(_i16, 16)), align=1)
        dd = builder.fpext(builder.bitcast(h, _vec(ir.HalfType(), 16)), _vec(_f32, 16))
        dx = builder.shuffle_vector(dd, dd, _cvec(_i32, list(range(8))))
        dm = builder.shuffle_vector(dd, dd, _cvec(_i32, list(range(8, 16))))
        bs = builder.sext(_ld(builder, yb, 1040, 64, _i16), _vec(_i32, 64))
        for rr in range(4):
            dots = _q4_Kx8_dots_ir(builder, xb, builder.add(yb, ir.Constant(_i64, 16 + 8 * rr)), ir.Constant(_i64, 32))
            # bsums of sub-block k of row rr: the int16 pair at 16*(k >> 1) + 4*rr + 2*(k & 1) (block_q8_Kx4)
            ia = [16 * (k >> 1) + 4 * rr + 2 * (k & 1) for k in range(8)]
            b32 = builder.add(builder.shuffle_vector(bs, bs, _cvec(_i32, ia)),
                              builder.shuffle_vector(bs, bs, _cvec(_i32, [i + 1 for i in ia])))
            dy = _splat(builder, builder.load(_ptr(builder, builder.add(yb, ir.Constant(_i64, 4 * rr)), _f32),
                                              align=1), 8)
            ds, dms = builder.fmul(dx, dy), builder.fmul(dm, dy)
            pa = _ptr(builder, builder.add(acc, ir.Constant(_i64, 32 * rr)), v8f)
            pm = _ptr(builder, builder.add(accm, ir.Constant(_i64, 32 * rr)), v8f)
            a, am = builder.load(pa, align=1), builder.load(pm, align=1)
            for sb in range(4):
                k0, k1 = 2 * sb, 2 * sb + 1
                isum = builder.add(builder.mul(sc[k0], dots[k0]), builder.mul(sc[k1], dots[k1]))
                bk0 = builder.shuffle_vector(b32, b32, _cvec(_i32, [k0] * 8))
                bk1 = builder.shuffle_vector(b32, b32, _cvec(_i32, [k1] * 8))
                imin = builder.add(builder.mul(mn[k0], bk0), builder.mul(mn[k1], bk1))
                a = builder.call(fma8, [builder.sitofp(isum, v8f), ds, a])
                am = builder.call(fma8, [builder.sitofp(imin, v8f), dms, am])
            builder.store(a, pa, align=1)
            builder.store(am, pm, align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64, types.int64), codegen


# =================================================================================================================
# q4_K_8x8_q8_K: gemv / gemm on block_q4_Kx8
# =================================================================================================================

@compiled
def gemv_q4_K_8x8_q8_K(n, s, vx, vy, nc):
    """ggml_gemv_q4_K_8x8_q8_K (AVX2) for one q8_K row at vy: s[0..nc) (nc % 8 == 0) from the block_q4_Kx8 groups
    at vx. Per column and super-block: the int32 sums over the 8 sub-blocks (|sum| < 2^31: 8 * 63 * 32*15*128),
    one fmadd each for scales and mins."""
    nb = n // 256
    acc = np.zeros(8, np.float32)
    accm = np.zeros(8, np.float32)
    pa, pm = acc.ctypes.data, accm.ctypes.data
    for g in range(nc // 8):
        for r in range(8):
            acc[r] = F32(0.0)
            accm[r] = F32(0.0)
        for b in range(nb):
            q4_Kx8_gemv_block(vx + (g * nb + b) * Q4_KX8_SIZE, vy + b * Q8_K_SIZE, pa, pm)
        for r in range(8):
            st_f32(s + 4 * (8 * g + r), acc[r] - accm[r])


@compiled
def gemm_q4_K_8x8_q8_K(n, s, bs, vx, vy, nr, nc):
    """ggml_gemm_q4_K_8x8_q8_K (AVX2): nr (% 4 == 0) rows of block_q8_Kx4 at vy times the block_q4_Kx8 groups at
    vx -> s (row stride bs floats). Per output the float accumulation is per pair of sub-blocks (4 fmadds per
    super-block for the scales, 4 for the mins)."""
    nb = n // 256
    acc = np.zeros(32, np.float32)
    accm = np.zeros(32, np.float32)
    pa, pm = acc.ctypes.data, accm.ctypes.data
    for y4 in range(nr // 4):
        for g in range(nc // 8):
            for i in range(32):
                acc[i] = F32(0.0)
                accm[i] = F32(0.0)
            for b in range(nb):
                q4_Kx8_gemm_block(vx + (g * nb + b) * Q4_KX8_SIZE, vy + (y4 * nb + b) * Q8_KX4_SIZE, pa, pm)
            for rr in range(4):
                for r in range(8):
                    st_f32(s + 4 * ((4 * y4 + rr) * bs + 8 * g + r), acc[8 * rr + r] - accm[8 * rr + r])


# =================================================================================================================
# tiled.cpp's microtile (Q4_K / Q6_K weights not repacked, src1 rows >= 8)
# =================================================================================================================

@compiled
def _tiled_dot(n, x, y, is_q6, sumi, sc):
    """One output of tiled_run_microtile_avx2: per super-block ``res = d_x * (float) s1`` (Q4_K: ``res =
    fnmadd(dmin_x, (float) s2, res)``), ``buf = fmadd(res, d_y, buf)``. s1 / s2 are exact integers (the sum of the
    vec_dot kernel's int32 lanes is the same integer). Scratch: sumi int32[8], sc int16[8]."""
    nb = n // 256
    buf = F32(0.0)
    for i in range(nb):
        yb = y + i * Q8_K_SIZE
        s1 = np.int64(0)
        if is_q6:
            xb = x + i * Q6_K_SIZE
            q6_K_sumi(xb, yb, sumi.ctypes.data)
            for ln in range(8):
                s1 += np.int64(sumi[ln])
            res = fp16_to_fp32(ld_u16(xb + 208)) * F32(s1)
        else:
            xb = x + i * Q4_K_SIZE
            s2 = np.int64(0)
            for sbk in range(8):
                scv, mnv = _scale_min_k4(sbk, xb + 4)
                sc[sbk] = scv
                s2 += mnv * (_s16(np.int64(ld_u16(yb + 260 + 4 * sbk))) + _s16(np.int64(ld_u16(yb + 262 + 4 * sbk))))
            q4_K_sumi(xb, yb, sc.ctypes.data, sumi.ctypes.data)
            for ln in range(8):
                s1 += np.int64(sumi[ln])
            res = fp16_to_fp32(ld_u16(xb)) * F32(s1)
            res = fmaf(-fp16_to_fp32(ld_u16(xb + 2)), F32(s2), res)
        buf = fmaf(res, ld_f32(yb), buf)
    return buf


@compiled
def tiled_q6_K_chunk(ne00, xq, r0, r1, y, rs, ne11, dst, nb1):
    """Rows [r0, r1) of a Q6_K src0 (rows at xq) times the ne11 Q8_K rows at y (row size rs) into dst (row stride
    nb1 bytes), as tiled.cpp's driver: per 256-element slab the chunk's src0 blocks are unpacked once (levels,
    scales, d) and every src1 row is swept over them, 8 src0 rows at a time (the microtile). Each output gets
    ``_tiled_dot``'s float steps in its order (the slabs in increasing order, s1 the same exact integer), so the bits
    are those of ``_tiled_dot``; the unpacking is no longer repeated for every src1 row."""
    nb = ne00 // 256
    bx = nb * Q6_K_SIZE
    nr = r1 - r0
    if nr <= 0:
        return
    n8 = nr - nr % 8
    u = np.empty(nr * 256, np.uint8)
    scv = np.empty(nr * 144, np.int16)        # per row: 8 groups x 16 lanes, then the 16 scales (288 bytes)
    dx = np.empty(nr, np.float32)
    acc = np.zeros(ne11 * nr, np.float32)
    up, sp, dp, ap = u.ctypes.data, scv.ctypes.data, dx.ctypes.data, acc.ctypes.data
    for i in range(nb):
        for rr in range(nr):
            xb = xq + (r0 + rr) * bx + i * Q6_K_SIZE
            dx[rr] = fp16_to_fp32(ld_u16(xb + 208))
            q6_K_unpack(xb, up + 256 * rr, sp + 288 * rr)
        for c in range(ne11):
            yb = y + c * rs + i * Q8_K_SIZE
            for rr in range(0, n8, 8):
                q6_K_levels_acc8(up + 256 * rr, sp + 288 * rr, yb, dp + 4 * rr, ap + 4 * (c * nr + rr))
            if n8 < nr:
                dy = ld_f32(yb)
                for rr in range(n8, nr):
                    res = dx[rr] * F32(q6_K_levels_sumi(up + 256 * rr, sp + 288 * rr, yb))
                    acc[c * nr + rr] = fmaf(res, dy, acc[c * nr + rr])
    for c in range(ne11):
        for rr in range(nr):
            st_f32(dst + c * nb1 + 4 * (r0 + rr), acc[c * nr + rr])


@compiled
def tiled_dot_q_K(n, x, y, is_q6):
    """One output of tiled_run_microtile_avx2 (see ``_tiled_dot``)."""
    return _tiled_dot(n, x, y, is_q6, np.zeros(8, np.int32), np.zeros(8, np.int16))


# =================================================================================================================
# dequantize_row_* (GET_ROWS)
# =================================================================================================================

@compiled
def dequantize_row(t, x, y, k):
    """dequantize_row_q8_0 (t=8), _q5_0 (6), _q4_K (12), _q6_K (14) of ggml-quants.c: k values at x -> float32 at y,
    with the C expressions' float association (q*d; (q-16)*d; (d*sc)*q - dmin*m; (d*sc)*(q-32))."""
    if t == 8:
        for i in range(k // 32):
            xb = x + i * Q8_0_SIZE
            d = fp16_to_fp32(ld_u16(xb))
            for j in range(32):
                st_f32(y + 4 * (32 * i + j), F32(ld_i8(xb + 2 + j)) * d)
    elif t == 6:
        for i in range(k // 32):
            xb = x + i * Q5_0_SIZE
            d = fp16_to_fp32(ld_u16(xb))
            for j in range(32):
                st_f32(y + 4 * (32 * i + j), F32(_q5_0_level(xb, j)) * d)
    elif t == 12:
        for i in range(k // 256):
            xb = x + i * Q4_K_SIZE
            d = fp16_to_fp32(ld_u16(xb))
            dmin = fp16_to_fp32(ld_u16(xb + 2))
            for sbk in range(8):
                sc, mn = _scale_min_k4(sbk, xb + 4)
                d1 = d * F32(sc)
                m1 = dmin * F32(mn)
                for l in range(32):
                    q = np.int64(ld_u8(xb + 16 + 32 * (sbk >> 1) + l))
                    q = (q >> 4) if (sbk & 1) else (q & 0xF)
                    st_f32(y + 4 * (256 * i + 32 * sbk + l), d1 * F32(q) - m1)
    elif t == 14:
        for i in range(k // 256):
            xb = x + i * Q6_K_SIZE
            d = fp16_to_fp32(ld_u16(xb + 208))
            for e in range(256):
                ds = d * F32(ld_i8(xb + 192 + (e >> 4)))
                st_f32(y + 4 * (256 * i + e), ds * F32(_q6_level(xb, e) - 32))


# =================================================================================================================
# drivers over rows (what the tests and the benchmark call; the graph program would call the kernels per chunk)
# =================================================================================================================

@compiled
def vec_dot_rows(t, n, x, nbx, mrows, y, nby, nrows, out):
    """out[j, i] = vec_dot(x row i, y row j) for type t (8 Q8_0, 6 Q5_0: y Q8_0; 12 Q4_K, 14 Q6_K: y Q8_K;
    112 / 114: Q4_K / Q6_K through the tiled microtile)."""
    for j in range(nrows):
        for i in range(mrows):
            xi, yj = x + i * nbx, y + j * nby
            if t == 8 or t == 6:
                v = vec_dot_q8_0_q8_0(n, xi, yj, t == 6)
            elif t == 12:
                v = vec_dot_q4_K_q8_K(n, xi, yj)
            elif t == 14:
                v = vec_dot_q6_K_q8_K(n, xi, yj)
            else:
                v = tiled_dot_q_K(n, xi, yj, t == 114)
            out[j, i] = v


@compiled
def mul_mat_q4_K_8x8(n, vx, nc, x, nrows, wdata, out, c0, c1):
    """tensor_traits<block_q4_K, 8, 8, Q8_K>::forward_mul_mat for one plane and the column range [c0, c1) (multiples
    of 8): src1 rows x (float32, n each) quantized into wdata (groups of 4 by quantize_mat_q8_K_4x8, the rest by
    quantize_row_q8_K), then gemm for the groups and gemv for the rest, into out (nrows, nc) float32."""
    n4 = nrows - nrows % 4
    nb = n // 256
    for i in range(0, n4, 4):
        quantize_mat_q8_K_4x8(x + 4 * n * i, 4 * n, wdata + (i // 4) * nb * Q8_KX4_SIZE, n)
    tail = wdata + (n4 // 4) * nb * Q8_KX4_SIZE
    for i in range(n4, nrows):
        quantize_row_q8_K(x + 4 * n * i, tail + (i - n4) * nb * Q8_K_SIZE, n)
    vx0 = vx + (c0 // 8) * nb * Q4_KX8_SIZE
    if n4 > 0:
        gemm_q4_K_8x8_q8_K(n, out + 4 * c0, nc, vx0, wdata, n4, c1 - c0)
    for i in range(n4, nrows):
        gemv_q4_K_8x8_q8_K(n, out + 4 * (i * nc + c0), vx0, tail + (i - n4) * nb * Q8_K_SIZE, c1 - c0)


# =================================================================================================================
# MUL_MAT with these weights in CPU_REPACK: src1 quantization share, one chunk, and the program's kernel
# =================================================================================================================
# The work buffer holds src1 in ggml's layout for the vec-dot type: row i11 of plane i12 at
# (i12*ne11 + i11) * row_size; for Q4_K groups of 4 rows as one block_q8_Kx4 run (the same bytes per 4 rows).

@compiled
def _vd_row_size(qtype, ne10):
    return (ne10 // 256) * Q8_K_SIZE        # Q4_K and Q6_K both take Q8_K


@compiled
def kq_work_size(qtype, ne10, nrows):
    """Bytes of the quantized src1 (nrows rows of ne10)."""
    return nrows * _vd_row_size(qtype, ne10)


@compiled
def quantize_row_q8_0(x, y, k):
    """quantize_row_q8_0 (AVX2): 127/amax, round half to even, F16C scale -> block_q8_0 at y."""
    lanes = np.empty(8, np.float32)
    for ib in range(k // 32):
        xb = x + 4 * 32 * ib
        yb = y + Q8_0_SIZE * ib
        for ln in range(8):
            lanes[ln] = abs(ld_f32(xb + 4 * ln))
        for v in range(1, 4):
            for ln in range(8):
                a = abs(ld_f32(xb + 4 * (8 * v + ln)))
                lanes[ln] = lanes[ln] if lanes[ln] > a else a
        m0 = lanes[4] if lanes[4] > lanes[0] else lanes[0]
        m1 = lanes[5] if lanes[5] > lanes[1] else lanes[1]
        m2 = lanes[6] if lanes[6] > lanes[2] else lanes[2]
        m3 = lanes[7] if lanes[7] > lanes[3] else lanes[3]
        a02 = m0 if m0 > m2 else m2
        a13 = m1 if m1 > m3 else m3
        amax = a02 if a02 > a13 else a13
        d = amax / F32(127.0)
        idv = F32(127.0) / amax if amax != F32(0.0) else F32(0.0)
        st_u16(yb, f32_to_f16(d))
        for j in range(32):
            v = ld_f32(xb + 4 * j) * idv
            if v != v or abs(v) >= F32(2147483648.0):
                q = np.int64(-128)
            else:
                q = min(max(np.int64(np.rint(v)), np.int64(-128)), np.int64(127))
            st_i8(yb + 2 + j, np.int8(q))


@compiled
def kq_quantize(qtype, src1, ne10, ne11, ne12, nb11, nb12, wdata, ith, nth):
    """Thread ith's share of src1 -> Q8_K: Q4_K as repack.cpp's forward_mul_mat (rows 4*ith, step 4*nth, through
    quantize_mat_q8_K_4x8, then the ne11 % 4 leftovers one per thread); Q6_K row by row (ggml splits each row's
    blocks over the threads instead: every block is quantized alone, so the bytes agree)."""
    rs = _vd_row_size(qtype, ne10)
    for i12 in range(ne12):
        base = wdata + i12 * ne11 * rs
        full = ne11 - ne11 % 4 if qtype == T_Q4_K else 0
        i11 = ith * 4
        while i11 < full:
            quantize_mat_q8_K_4x8(src1 + i11 * nb11 + i12 * nb12, nb11, base + i11 * rs, ne10)
            i11 += nth * 4
        i11 = full + ith
        while i11 < ne11:
            quantize_row_q8_K(src1 + i11 * nb11 + i12 * nb12, base + i11 * rs, ne10)
            i11 += nth


@compiled
def kq_chunk(qtype, xq, ne00, r0, r1, dst, nb1, nb2, i12, ne11, ne10, wdata):
    """Rows [r0, r1) of src0 (multiples of 8 for Q4_K) times every row of plane i12 of the quantized src1.
    Q4_K: forward_mul_mat_one_chunk (gemm for the groups of 4, gemv for the rest);
    Q6_K: vec_dot, or tiled.cpp's microtile when src1 has >= 8 rows (Q5_0 weights: sgemm.q5_0_rows)."""
    rs = _vd_row_size(qtype, ne10)
    y0 = wdata + i12 * ne11 * rs
    d0 = dst + i12 * nb2
    if qtype == T_Q4_K:
        nb = ne00 // 256
        vx = xq + (r0 // 8) * nb * Q4_KX8_SIZE
        n4 = ne11 - ne11 % 4
        if n4 > 0:
            gemm_q4_K_8x8_q8_K(ne00, d0 + 4 * r0, nb1 // 4, vx, y0, n4, r1 - r0)
        for i in range(n4, ne11):
            gemv_q4_K_8x8_q8_K(ne00, d0 + i * nb1 + 4 * r0, vx, y0 + i * rs, r1 - r0)
        return
    if ne11 >= 8:                               # tiled.cpp's batch path (ggml_tiled_min_batch)
        tiled_q6_K_chunk(ne00, xq, r0, r1, y0, rs, ne11, d0, nb1)
        return
    bx = (ne00 // 256) * Q6_K_SIZE
    acc = np.zeros(8, np.float32)
    sumi = np.zeros(8, np.int32)
    for c in range(ne11):
        yc = y0 + c * rs
        for r in range(r0, r1):
            st_f32(d0 + c * nb1 + 4 * r, _vec_dot_q6_K(ne00, xq + r * bx, yc, acc, sumi))


@compiled
def k_mul_mat_kq(P, k, ith, nth, sync, wdata):
    """The program's MUL_MAT row for Q4_K / Q6_K weights in CPU_REPACK (kernels.k_mul_mat_q hands it over):
    quantize, barrier, then repack.cpp's chunking of src0 rows (chunks claimed from the shared counter)."""
    qtype = P[k, MMQ_TYPE]
    xq = P[k, MMQ_QS]
    ne00, ne01 = P[k, S0 + NE0], P[k, S0 + NE1]
    src1 = P[k, S1 + DATA]
    ne10, ne11, ne12 = P[k, S1 + NE0], P[k, S1 + NE1], P[k, S1 + NE2]
    nb11, nb12 = P[k, S1 + NB1], P[k, S1 + NB2]
    dst = P[k, DST + DATA]
    nb1, nb2 = P[k, DST + NB1], P[k, DST + NB2]
    kq_quantize(qtype, src1, ne10, ne11, ne12, nb11, nb12, wdata, ith, nth)
    nchunk0, dr0 = kq_nchunk(ne01, nth)
    nchunk1 = ne12
    if ith == 0:
        atomic_store(sync + 8 * SYNC_CHUNK, nth)
    tr = traced(sync)
    traced_barrier(sync, nth, ith, k, TRW_KERNEL, tr)
    current = ith
    while current < nchunk0 * nchunk1:
        s, e = kq_chunk_rows(current, nchunk0, dr0, ne01)
        if s < e:
            t0 = rdtsc() if tr else 0
            kq_chunk(qtype, xq, ne00, s, e, dst, nb1, nb2, current // nchunk0, ne11, ne10, wdata)
            if tr:
                i12 = current // nchunk0
                tr_rec(sync, ith, TR_CHUNK, k, current, s, e, i12 * ne11, (i12 + 1) * ne11,
                       (nchunk0 << 32) | nchunk1, t0, rdtsc())
        current = atomic_add(sync + 8 * SYNC_CHUNK, 1)


@compiled
def kq_nchunk(nr0, nth):
    """repack.cpp's forward_mul_mat chunking of src0 rows: 4 chunks per thread, at least NB_COLS (8) rows each."""
    nth_scaled = nth * 4
    chunk_size0 = (nr0 + nth_scaled - 1) // nth_scaled
    nchunk0 = (nr0 + chunk_size0 - 1) // chunk_size0
    if nchunk0 > 0 and (nr0 // nchunk0) < 8 and nr0 >= 8:
        nchunk0 = (nr0 + 7) // 8
    dr0 = (nr0 + nchunk0 - 1) // nchunk0
    if nth == 1 or (nchunk0 < nth and (nr0 + nth - 1) // nth >= 8):
        nchunk0 = nth
        dr0 = (nr0 + nchunk0 - 1) // nchunk0
    max_nchunk = (nr0 + 7) // 8
    if nchunk0 > max_nchunk:
        nchunk0 = max_nchunk
    return nchunk0, dr0


@compiled
def kq_chunk_rows(current_chunk, nchunk0, dr0, nr0):
    """Chunk -> its src0 rows, both ends rounded up to a multiple of 8 (forward_mul_mat's NB_COLS alignment)."""
    s = dr0 * (current_chunk % nchunk0)
    e = min(s + dr0, nr0)
    if s % 8:
        s = s + 8 - s % 8
    if e % 8:
        e = e + 8 - e % 8
    return s, min(e, nr0)
