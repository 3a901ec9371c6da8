"""The building blocks of the compiled kernels: raw memory, atomics, FMA and bit casts as LLVM intrinsics, the SIMD
micro-kernels written in LLVM IR, and the bit-exact scalar helpers (fp16 conversions, ggml_v_expf, glibc's expf and
sincosf).

Not a ggml source file: what ggml-cpu gets from C, immintrin.h and libm, made available to Numba-compiled code.
The micro-kernels use the AVX2 intrinsics (``pmaddubsw``, ``pmaddwd``, ``psignb``, ``vcvtph2ps``) where the CPU has
them (``HAVE_AVX2``) and generic vector IR elsewhere. Everything is compiled with ``compiled`` (``@njit(cache=True,
nogil=True)``, no fastmath): Numba's on-disk cache makes a second process load the kernels in a fraction of a second.
"""
from __future__ import annotations

import platform

import llvmlite.binding as _llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..libm import (
    EXP2F_C,
    EXP2F_INVLN2N,
    EXP2F_SHIFT,
    EXP2F_TAB,
    INV_PIO4,
    SC_HPI,
    SC_HPI_INV,
    SC_PI63,
    SC_SIGN,
    SC_TAB,
)
from ..vec import EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_P0, EXP_P1, EXP_P2, EXP_P3, EXP_P4, EXP_R
from . import cached_without_registries
from .program import GEMM_COLS, T_Q4_0, T_Q4_1, T_Q8_0

F32 = np.float32

IS_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
try:
    _feats = _llvm.get_host_cpu_features()
    HAVE_AVX2 = IS_X86 and bool(_feats.get("avx2", False)) and bool(_feats.get("fma", False)) \
        and bool(_feats.get("f16c", False))
except RuntimeError:       # llvmlite cannot tell the host's features: take the generic vector code
    HAVE_AVX2 = False
# repacked block scales are kept as fp16 (converted in the kernels, vcvtph2ps) where the CPU does that in hardware
SCALES_F16 = HAVE_AVX2 or platform.machine().lower() in ("aarch64", "arm64")

_JIT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False)


def compiled(fn=None, **kw):
    """``@njit`` with ggviz's options (cached on disk, releases the GIL, no fastmath: every float op as written);
    its cached machine code loads without Numba's compiler registries (``fast.cached_without_registries``)."""
    opts = dict(_JIT)
    opts.update(kw)
    if fn is None:
        return lambda f: cached_without_registries(njit(**opts)(f))
    return cached_without_registries(njit(**opts)(fn))


# =================================================================================================================
# intrinsics: raw memory, atomics, FMA, bit casts
# =================================================================================================================
_i1, _i8, _i16, _i32, _i64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_f32, _f64 = ir.FloatType(), ir.DoubleType()

def _vec(t, n):
    return ir.VectorType(t, n)

def _cvec(t, vals):
    return ir.Constant(_vec(t, len(vals)), [ir.Constant(t, v) for v in vals])

def _decl(builder, name, ret, args):
    mod = builder.module
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret, args), name=name)
    return fn

def _ptr(builder, addr, ty):
    return builder.inttoptr(addr, ir.PointerType(ty))

def _splat(builder, v, n):
    t = _vec(v.type, n)
    return builder.shuffle_vector(builder.insert_element(ir.Constant(t, None), v, ir.Constant(_i32, 0)),
                                  ir.Constant(t, None), _cvec(_i32, [0] * n))

def _make_load(nbty, llty):
    @intrinsic
    def _ld(typingctx, addr):
        def codegen(context, builder, sig, args):
            return builder.load(_ptr(builder, args[0], llty), align=1)
        return nbty(types.int64), codegen
    return _ld

def _make_store(nbty, llty):
    @intrinsic
    def _st(typingctx, addr, val):
        def codegen(context, builder, sig, args):
            builder.store(args[1], _ptr(builder, args[0], llty), align=1)
            return context.get_dummy_value()
        return types.void(types.int64, nbty), codegen
    return _st

ld_f32 = _make_load(types.float32, _f32)
ld_f64 = _make_load(types.float64, _f64)
ld_i8 = _make_load(types.int8, _i8)
ld_u8 = _make_load(types.uint8, _i8)
ld_u16 = _make_load(types.uint16, _i16)
ld_i32 = _make_load(types.int32, _i32)
ld_u32 = _make_load(types.uint32, _i32)
ld_i64 = _make_load(types.int64, _i64)
st_f32 = _make_store(types.float32, _f32)
st_i8 = _make_store(types.int8, _i8)
st_u16 = _make_store(types.uint16, _i16)
st_i32 = _make_store(types.int32, _i32)
st_u32 = _make_store(types.uint32, _i32)
st_i64 = _make_store(types.int64, _i64)

@intrinsic
def atomic_add(typingctx, addr, val):
    """atomic_fetch_add (seq_cst) on the int64 at ``addr``: returns the old value."""
    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _ptr(builder, args[0], _i64), args[1], "seq_cst")
    return types.int64(types.int64, types.int64), codegen

@intrinsic
def atomic_load(typingctx, addr):
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_ptr(builder, args[0], _i64), "seq_cst", 8)
    return types.int64(types.int64), codegen

@intrinsic
def atomic_store(typingctx, addr, val):
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[1], _ptr(builder, args[0], _i64), "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64), codegen

@intrinsic
def cpu_relax(typingctx):
    """ggml_thread_cpu_relax: ``pause`` on x86, nothing elsewhere."""
    def codegen(context, builder, sig, args):
        if IS_X86:
            builder.call(_decl(builder, "llvm.x86.sse2.pause", ir.VoidType(), []), [])
        return context.get_dummy_value()
    return types.void(), codegen

_HAVE_SCHED_YIELD = platform.system() in ("Linux", "Darwin")
_FUTEX_SYSCALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower()) \
    if platform.system() == "Linux" else None

@intrinsic
def sched_yield(typingctx):
    """sched_yield(2) where the C library has it; cpu_relax elsewhere."""
    def codegen(context, builder, sig, args):
        if _HAVE_SCHED_YIELD:
            builder.call(_decl(builder, "sched_yield", _i32, []), [])
        elif IS_X86:
            builder.call(_decl(builder, "llvm.x86.sse2.pause", ir.VoidType(), []), [])
        return context.get_dummy_value()
    return types.void(), codegen

HAVE_FUTEX = _FUTEX_SYSCALL is not None

@intrinsic
def futex_wait(typingctx, addr, expected, timeout):
    """futex(addr, FUTEX_WAIT_PRIVATE, expected, timeout): sleep while the 32-bit word at addr equals expected
    (at most the struct timespec at ``timeout``)."""
    def codegen(context, builder, sig, args):
        if HAVE_FUTEX:
            fnty = ir.FunctionType(_i64, [_i64], var_arg=True)
            fn = builder.module.globals.get("syscall")
            if fn is None:
                fn = ir.Function(builder.module, fnty, name="syscall")
            exp32 = builder.trunc(args[1], _i32)
            builder.call(fn, [ir.Constant(_i64, _FUTEX_SYSCALL), args[0], ir.Constant(_i32, 128),
                              exp32, args[2], ir.Constant(_i64, 0), ir.Constant(_i32, 0)])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen

@intrinsic
def futex_wake(typingctx, addr):
    """futex(addr, FUTEX_WAKE_PRIVATE, INT_MAX)."""
    def codegen(context, builder, sig, args):
        if HAVE_FUTEX:
            fnty = ir.FunctionType(_i64, [_i64], var_arg=True)
            fn = builder.module.globals.get("syscall")
            if fn is None:
                fn = ir.Function(builder.module, fnty, name="syscall")
            builder.call(fn, [ir.Constant(_i64, _FUTEX_SYSCALL), args[0], ir.Constant(_i32, 129),
                              ir.Constant(_i32, 0x7FFFFFFF), ir.Constant(_i64, 0), ir.Constant(_i64, 0),
                              ir.Constant(_i32, 0)])
        return context.get_dummy_value()
    return types.void(types.int64), codegen

@intrinsic
def rdtsc(typingctx):
    def codegen(context, builder, sig, args):
        if IS_X86:
            fn = _decl(builder, "llvm.x86.rdtsc", _i64, [])
            return builder.call(fn, [])
        fn = _decl(builder, "llvm.readcyclecounter", _i64, [])
        return builder.call(fn, [])
    return types.int64(), codegen

@intrinsic
def fmaf(typingctx, a, b, c):
    """fmaf: one rounding (vfmadd on FMA hardware)."""
    def codegen(context, builder, sig, args):
        fn = _decl(builder, "llvm.fma.f32", _f32, [_f32, _f32, _f32])
        return builder.call(fn, list(args))
    return types.float32(types.float32, types.float32, types.float32), codegen

@intrinsic
def fma(typingctx, a, b, c):
    def codegen(context, builder, sig, args):
        fn = _decl(builder, "llvm.fma.f64", _f64, [_f64, _f64, _f64])
        return builder.call(fn, list(args))
    return types.float64(types.float64, types.float64, types.float64), codegen

@intrinsic
def f32_bits(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _i32)
    return types.uint32(types.float32), codegen

@intrinsic
def bits_f32(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _f32)
    return types.float32(types.uint32), codegen

@intrinsic
def f64_bits(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _i64)
    return types.uint64(types.float64), codegen

@intrinsic
def bits_f64(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _f64)
    return types.float64(types.uint64), codegen


# =================================================================================================================
# SIMD micro-kernels (LLVM IR). All take raw addresses.
# =================================================================================================================

def _maddubs(builder, a_u8, b_s8):
    """pmaddubsw: u8 x s8 -> pairs summed to i16 with signed saturation."""
    if HAVE_AVX2:
        fn = _decl(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_i16, 16), [_vec(_i8, 32), _vec(_i8, 32)])
        return builder.call(fn, [a_u8, b_s8])
    even = _cvec(_i32, list(range(0, 32, 2)))
    odd = _cvec(_i32, list(range(1, 32, 2)))
    ae = builder.zext(builder.shuffle_vector(a_u8, a_u8, even), _vec(_i32, 16))
    ao = builder.zext(builder.shuffle_vector(a_u8, a_u8, odd), _vec(_i32, 16))
    be = builder.sext(builder.shuffle_vector(b_s8, b_s8, even), _vec(_i32, 16))
    bo = builder.sext(builder.shuffle_vector(b_s8, b_s8, odd), _vec(_i32, 16))
    s = builder.add(builder.mul(ae, be), builder.mul(ao, bo))
    lo = _splat(builder, ir.Constant(_i32, -32768), 16)
    hi = _splat(builder, ir.Constant(_i32, 32767), 16)
    s = builder.select(builder.icmp_signed("<", s, lo), lo, s)
    s = builder.select(builder.icmp_signed(">", s, hi), hi, s)
    return builder.trunc(s, _vec(_i16, 16))

def _madd_ones(builder, v16):
    """pmaddwd(v, 1): adjacent i16 pairs summed to i32."""
    if HAVE_AVX2:
        fn = _decl(builder, "llvm.x86.avx2.pmadd.wd", _vec(_i32, 8), [_vec(_i16, 16), _vec(_i16, 16)])
        return builder.call(fn, [v16, _cvec(_i16, [1] * 16)])
    even = builder.sext(builder.shuffle_vector(v16, v16, _cvec(_i32, list(range(0, 16, 2)))), _vec(_i32, 8))
    odd = builder.sext(builder.shuffle_vector(v16, v16, _cvec(_i32, list(range(1, 16, 2)))), _vec(_i32, 8))
    return builder.add(even, odd)

def _sign_b(builder, a, b):
    """psignb(a, b): a negated where b < 0, zeroed where b == 0."""
    if HAVE_AVX2:
        fn = _decl(builder, "llvm.x86.avx2.psign.b", _vec(_i8, 32), [_vec(_i8, 32), _vec(_i8, 32)])
        return builder.call(fn, [a, b])
    zero = ir.Constant(_vec(_i8, 32), None)
    neg = builder.sub(zero, a)
    r = builder.select(builder.icmp_signed("<", b, zero), neg, a)
    return builder.select(builder.icmp_signed("==", b, zero), zero, r)

def _bcast4(builder, addr):
    """The 4 bytes at addr repeated 8 times (vpbroadcastd)."""
    v = builder.load(_ptr(builder, addr, _i32), align=1)
    return builder.bitcast(_splat(builder, v, 8), _vec(_i8, 32))

def _load_scales8(builder, base, b):
    """The 8 rows' scales of block b: fp16 (converted exactly) or float32, as repacked."""
    v8f = _vec(_f32, 8)
    if SCALES_F16:
        p = _ptr(builder, builder.add(base, builder.mul(b, ir.Constant(_i64, 16))), _vec(_i16, 8))
        return builder.fpext(builder.bitcast(builder.load(p, align=1), _vec(ir.HalfType(), 8)), v8f)
    return builder.load(_ptr(builder, builder.add(base, builder.mul(b, ir.Constant(_i64, 32))), v8f), align=1)

def _make_rq_kernel(qtype: int, ncols: int):
    """The repacked GEMM micro-kernel: 8 rows (one interleaved group) x ``ncols`` src1 columns, all blocks.

    Arguments (int64): dst, dst column stride (bytes), group quants, group scales d, group mins m (Q4_1),
    nb (blocks per row), yq, yd, ys, ysum (the quantized src1 columns: int8 quants, float32 d, float32 s,
    int32 block sums), y column strides (bytes) for quants and for the per-block arrays.

    This is ggml_vec_dot_{q4_0,q8_0}_q8_0 / ggml_vec_dot_q4_1_q8_1 (arch/x86/quants.c, AVX2) for 8 rows at once,
    operation for operation: ggml keeps 8 float lanes per row, lane u summing ``d_x*d_y * P_u`` with one FMA per
    block, where P_u is the exact integer dot product of the block's elements 4u..4u+3 (``maddubs`` + ``madd``,
    or ``dpbusd``); then ``hsum_float_8`` (((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3))) and, for Q4_1, ``+ summs``
    (``summs += m_x*s_y`` per block). Here the 4-byte groups of 8 rows are side by side, so chunk u of the
    block gives P_u for all 8 rows in one vector: accumulator u holds lane u of the 8 rows.
    """
    def gen(typingctx, dst, dcs, xq, xd, xm, nb, yq, yd, ys, ysum, yqs, yds):
        sig = types.void(*([types.int64] * 12))

        def codegen(context, builder, sig, args):
            dst, dcs, xq, xd, xm, nb, yq, yd, ys, ysum, yqs, yds = args
            v8f = _vec(_f32, 8)
            fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(v8f, None)) for _ in range(8)]
                   for _ in range(ncols)]
            summ = [cgutils.alloca_once_value(builder, ir.Constant(v8f, None)) for _ in range(ncols)]
            mask = _cvec(_i8, [15] * 32)
            eight = _cvec(_i8, [8] * 32)
            gbytes = 128 if qtype in (T_Q4_0, T_Q4_1) else 256
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                xb = builder.add(xq, builder.mul(b, ir.Constant(_i64, gbytes)))
                # chunk u (elements 4u..4u+3) of this block, 8 rows x 4 bytes
                chunks = []
                if qtype in (T_Q4_0, T_Q4_1):
                    raw = [builder.load(_ptr(builder, builder.add(xb, ir.Constant(_i64, 32 * cc)),
                                             _vec(_i8, 32)), align=1) for cc in range(4)]
                    chunks = [builder.and_(v, mask) for v in raw] + \
                             [builder.and_(builder.lshr(v, _cvec(_i8, [4] * 32)), mask) for v in raw]
                    if qtype == T_Q4_0:
                        chunks = [builder.sub(v, eight) for v in chunks]
                else:
                    chunks = [builder.load(_ptr(builder, builder.add(xb, ir.Constant(_i64, 32 * c)),
                                               _vec(_i8, 32)), align=1) for c in range(8)]
                signed = qtype != T_Q4_1
                if signed:
                    absx = [_sign_b(builder, v, v) for v in chunks]
                boff4 = builder.mul(b, ir.Constant(_i64, 4))
                dx = _load_scales8(builder, xd, b)
                if qtype == T_Q4_1:
                    mx = _load_scales8(builder, xm, b)
                for c in range(ncols):
                    ycol = builder.add(builder.add(yq, builder.mul(ir.Constant(_i64, c), yqs)),
                                       builder.mul(b, ir.Constant(_i64, 32)))
                    pcol = builder.add(builder.mul(ir.Constant(_i64, c), yds), boff4)
                    dyb = builder.load(_ptr(builder, builder.add(yd, pcol), _f32), align=1)
                    d0d1 = builder.fmul(dx, _splat(builder, dyb, 8))
                    for u in range(8):
                        yb = _bcast4(builder, builder.add(ycol, ir.Constant(_i64, 4 * u)))
                        if signed:
                            p16 = _maddubs(builder, absx[u], _sign_b(builder, yb, chunks[u]))
                        else:
                            p16 = _maddubs(builder, chunks[u], yb)
                        xy = builder.sitofp(_madd_ones(builder, p16), v8f)
                        builder.store(builder.call(fma8, [d0d1, xy, builder.load(acc[c][u])]), acc[c][u])
                    if qtype == T_Q4_1:
                        syb = builder.load(_ptr(builder, builder.add(ys, pcol), _f32), align=1)
                        builder.store(builder.fadd(builder.load(summ[c]),
                                                   builder.fmul(mx, _splat(builder, syb, 8))), summ[c])
            for c in range(ncols):
                a = [builder.load(acc[c][u]) for u in range(8)]
                r = builder.fadd(builder.fadd(builder.fadd(a[4], a[0]), builder.fadd(a[6], a[2])),
                                 builder.fadd(builder.fadd(a[5], a[1]), builder.fadd(a[7], a[3])))
                if qtype == T_Q4_1:
                    r = builder.fadd(r, builder.load(summ[c]))
                pd = builder.add(dst, builder.mul(ir.Constant(_i64, c), dcs))
                builder.store(r, _ptr(builder, pd, v8f), align=1)
            return context.get_dummy_value()
        return sig, codegen
    gen.__name__ = f"rq_{qtype}_{ncols}"
    return intrinsic(gen)

rq_q4_0_1 = _make_rq_kernel(T_Q4_0, 1)
rq_q4_0_4 = _make_rq_kernel(T_Q4_0, GEMM_COLS)
rq_q4_1_1 = _make_rq_kernel(T_Q4_1, 1)
rq_q4_1_4 = _make_rq_kernel(T_Q4_1, GEMM_COLS)
rq_q8_0_1 = _make_rq_kernel(T_Q8_0, 1)
rq_q8_0_4 = _make_rq_kernel(T_Q8_0, GEMM_COLS)

def _reduce_f32x8(builder, xs):
    """GGML_F32x8_REDUCE on 4 accumulators: pairwise adds, then the 128-bit halves, then two hadds."""
    x = list(xs)
    off = len(x) // 2
    while off > 0:
        for i in range(off):
            x[i] = builder.fadd(x[i], x[off + i])
        off //= 2
    v = x[0]
    lo = builder.shuffle_vector(v, v, _cvec(_i32, [0, 1, 2, 3]))
    hi = builder.shuffle_vector(v, v, _cvec(_i32, [4, 5, 6, 7]))
    t0 = builder.fadd(lo, hi)
    e = lambda vv, k: builder.extract_element(vv, ir.Constant(_i32, k))  # noqa: E731
    # _mm_hadd_ps(t0, t0) = [t0_0+t0_1, t0_2+t0_3, ...]; hadd again: (t0_0+t0_1) + (t0_2+t0_3)
    return builder.fadd(builder.fadd(e(t0, 0), e(t0, 1)), builder.fadd(e(t0, 2), e(t0, 3)))

def _reduce_f32x16(builder, xs):
    """GGML_F32x16_REDUCE (AVX-512) on 4 accumulators: the same pairwise adds, then _mm512_reduce_add_ps."""
    x = list(xs)
    off = len(x) // 2
    while off > 0:
        for i in range(off):
            x[i] = builder.fadd(x[i], x[off + i])
        off //= 2
    return _hsum16(builder, x[0])

def _make_vec_dot_flt(is_f16: bool, w: int = 8):
    """ggml_vec_dot_f16 / ggml_vec_dot_f32 (AVX2: GGML_F32_STEP 32 = 4 accumulators of 8 lanes, FMA; w = 16, the
    AVX-512 build: GGML_F16_STEP 64 = 4 accumulators of 16 lanes), n % (4w) leftovers done by the caller. Returns
    the float32 reduce of the 4 accumulators (GGML_F32x8_REDUCE / GGML_F32x16_REDUCE)."""
    def gen(typingctx, x, y, n32):
        def codegen(context, builder, sig, args):
            x, y, n32 = args
            v8f = _vec(_f32, w)
            es = 2 if is_f16 else 4
            acc = [cgutils.alloca_once_value(builder, ir.Constant(v8f, None)) for _ in range(4)]
            fma8 = _decl(builder, f"llvm.fma.v{w}f32", v8f, [v8f, v8f, v8f])
            with cgutils.for_range(builder, n32) as loop:
                base = builder.mul(loop.index, ir.Constant(_i64, 4 * w * es))
                for j in range(4):
                    off = builder.add(base, ir.Constant(_i64, w * es * j))
                    if is_f16:
                        vx = builder.fpext(builder.bitcast(builder.load(
                            _ptr(builder, builder.add(x, off), _vec(_i16, w)), align=1), _vec(ir.HalfType(), w)), v8f)
                        vy = builder.fpext(builder.bitcast(builder.load(
                            _ptr(builder, builder.add(y, off), _vec(_i16, w)), align=1), _vec(ir.HalfType(), w)), v8f)
                    else:
                        vx = builder.load(_ptr(builder, builder.add(x, off), v8f), align=1)
                        vy = builder.load(_ptr(builder, builder.add(y, off), v8f), align=1)
                    builder.store(builder.call(fma8, [vx, vy, builder.load(acc[j])]), acc[j])
            red = _reduce_f32x16 if w == 16 else _reduce_f32x8
            return red(builder, [builder.load(a) for a in acc])
        return types.float32(types.int64, types.int64, types.int64), codegen
    gen.__name__ = ("vec_dot_f16_simd" if is_f16 else "vec_dot_f32_simd") + ("16" if w == 16 else "")
    return intrinsic(gen)

@intrinsic
def cvt_f32_f16_row(typingctx, src, n, dst):
    """src (contiguous float32) -> dst (fp16 bits), round to nearest even: vcvtps2ph (F16C only)."""
    def codegen(context, builder, sig, args):
        src, n, dst = args
        v8f, v8h = _vec(_f32, 8), _vec(ir.HalfType(), 8)
        n8 = builder.sdiv(n, ir.Constant(_i64, 8))
        with cgutils.for_range(builder, n8) as loop:
            o4 = builder.mul(loop.index, ir.Constant(_i64, 32))
            o2 = builder.mul(loop.index, ir.Constant(_i64, 16))
            v = builder.load(_ptr(builder, builder.add(src, o4), v8f), align=1)
            h = builder.bitcast(builder.fptrunc(v, v8h), _vec(_i16, 8))
            builder.store(h, _ptr(builder, builder.add(dst, o2), _vec(_i16, 8)), align=1)
        with cgutils.for_range_slice(builder, builder.mul(n8, ir.Constant(_i64, 8)), n, ir.Constant(_i64, 1)) as (i, _):
            v = builder.load(_ptr(builder, builder.add(src, builder.mul(i, ir.Constant(_i64, 4))), _f32), align=1)
            h = builder.bitcast(builder.fptrunc(v, ir.HalfType()), _i16)
            builder.store(h, _ptr(builder, builder.add(dst, builder.mul(i, ir.Constant(_i64, 2))), _i16), align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen

@intrinsic
def cvt_f16_f32_row(typingctx, src, n8, dst):
    """8*n8 fp16 values -> float32 (exact, vcvtph2ps)."""
    def codegen(context, builder, sig, args):
        src, n8, dst = args
        v8f = _vec(_f32, 8)
        with cgutils.for_range(builder, n8) as loop:
            o4 = builder.mul(loop.index, ir.Constant(_i64, 32))
            o2 = builder.mul(loop.index, ir.Constant(_i64, 16))
            h = builder.load(_ptr(builder, builder.add(src, o2), _vec(_i16, 8)), align=1)
            v = builder.fpext(builder.bitcast(h, _vec(ir.HalfType(), 8)), v8f)
            builder.store(v, _ptr(builder, builder.add(dst, o4), v8f), align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen

def _make_dot_f16_rows(w: int):
    """ggml_vec_dot_f16 of ``nrows`` fp16 rows (x0 + r*xstride) with one row y already widened to float32
    (widening is exact, so this is the same arithmetic as ggml's): 4 accumulators of w lanes (8 AVX2, 16 AVX-512),
    one FMA per w values, GGML_F32x8_REDUCE / GGML_F32x16_REDUCE; out[r] = the float result (n a multiple of 4w,
    n32 = n / 4w steps)."""
    def gen(typingctx, x0, xstride, nrows, y, n32, out):
        def codegen(context, builder, sig, args):
            x0, xstride, nrows, y, n32, out = args
            v8f = _vec(_f32, w)
            fma8 = _decl(builder, f"llvm.fma.v{w}f32", v8f, [v8f, v8f, v8f])
            acc = [cgutils.alloca_once(builder, v8f) for _ in range(4)]
            with cgutils.for_range(builder, nrows) as rl:
                x = builder.add(x0, builder.mul(rl.index, xstride))
                for a in acc:
                    builder.store(ir.Constant(v8f, None), a)
                with cgutils.for_range(builder, n32) as loop:
                    bx = builder.mul(loop.index, ir.Constant(_i64, 8 * w))
                    by = builder.mul(loop.index, ir.Constant(_i64, 16 * w))
                    for j in range(4):
                        vx = builder.fpext(builder.bitcast(builder.load(
                            _ptr(builder, builder.add(x, builder.add(bx, ir.Constant(_i64, 2 * w * j))),
                                 _vec(_i16, w)), align=1), _vec(ir.HalfType(), w)), v8f)
                        vy = builder.load(_ptr(builder, builder.add(y, builder.add(by, ir.Constant(_i64, 4 * w * j))),
                                               v8f), align=1)
                        builder.store(builder.call(fma8, [vx, vy, builder.load(acc[j])]), acc[j])
                red = _reduce_f32x16 if w == 16 else _reduce_f32x8
                r = red(builder, [builder.load(a) for a in acc])
                builder.store(r, _ptr(builder, builder.add(out, builder.mul(rl.index, ir.Constant(_i64, 4))), _f32),
                              align=1)
            return context.get_dummy_value()
        return types.void(*([types.int64] * 6)), codegen
    gen.__name__ = "dot_f16_rows" + ("16" if w == 16 else "")
    return intrinsic(gen)

dot_f16_rows = _make_dot_f16_rows(8)
dot_f16_rows16 = _make_dot_f16_rows(16)

def _f16_row_op(fma: bool):
    """ggml_vec_mad_f16 (fma) / ggml_vec_scale_f16 on 8*n8 fp16 values at y, F16C: each lane widened (vcvtph2ps),
    ``y*v`` or ``fma(x, v, y)`` in float, rounded back to fp16 (vcvtps2ph, nearest even) -- the same arithmetic as
    the scalar loop, lane for lane."""
    def gen(typingctx, y, x, v, n8):
        def codegen(context, builder, sig, args):
            y, x, v, n8 = args
            v8f, v8h, v8s = _vec(_f32, 8), _vec(ir.HalfType(), 8), _vec(_i16, 8)
            fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
            vv = _splat(builder, v, 8)
            with cgutils.for_range(builder, n8) as loop:
                o = builder.mul(loop.index, ir.Constant(_i64, 16))
                py = _ptr(builder, builder.add(y, o), v8s)
                fy = builder.fpext(builder.bitcast(builder.load(py, align=1), v8h), v8f)
                if fma:
                    fx = builder.fpext(builder.bitcast(builder.load(
                        _ptr(builder, builder.add(x, o), v8s), align=1), v8h), v8f)
                    r = builder.call(fma8, [fx, vv, fy])
                else:
                    r = builder.fmul(fy, vv)
                builder.store(builder.bitcast(builder.fptrunc(r, v8h), v8s), py, align=1)
            return context.get_dummy_value()
        return types.void(types.int64, types.int64, types.float32, types.int64), codegen
    gen.__name__ = "mad_f16_row" if fma else "scale_f16_row"
    return intrinsic(gen)

mad_f16_row = _f16_row_op(True)        # (y, x, v, n8): y = fp16(fma(x, v, y))
scale_f16_row = _f16_row_op(False)     # (y, 0, v, n8): y = fp16(y*v)

@intrinsic
def kq_cells64(typingctx, out, kt, q, n):
    """The K·Q of one query row against a KV tile of 64 cells packed transposed as float32 (kt: n rows of 64 cells,
    dim d's row at kt + 256*d, as ggml's tiled flash attention packs K_f32): out[c] = the FMA chain over d = 0..n-1
    of kt[d][c] * q[d] from 0 (simd_gemm's order), 8 vectors of 8 cells side by side in registers."""
    def codegen(context, builder, sig, args):
        out, kt, q, n = args
        v8f = _vec(_f32, 8)
        fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
        accs = [cgutils.alloca_once_value(builder, ir.Constant(v8f, None)) for _ in range(8)]
        with cgutils.for_range(builder, n) as loop:
            qv = _splat(builder, builder.load(_ptr(builder, builder.add(q, builder.mul(loop.index, ir.Constant(
                _i64, 4))), _f32), align=1), 8)
            row = builder.add(kt, builder.mul(loop.index, ir.Constant(_i64, 256)))
            for j in range(8):
                kv = builder.load(_ptr(builder, builder.add(row, ir.Constant(_i64, 32 * j)), v8f), align=1)
                builder.store(builder.call(fma8, [kv, qv, builder.load(accs[j])]), accs[j])
        for j in range(8):
            builder.store(builder.load(accs[j]), _ptr(builder, builder.add(out, ir.Constant(_i64, 32 * j)), v8f),
                          align=1)
        return context.get_dummy_value()
    return types.void(*([types.int64] * 4)), codegen

@intrinsic
def sv_cells_f16(typingctx, y, v0, stride, w, n, n8):
    """softmax·V of one query row over n cells: y[i] = the FMA chain over c = 0..n-1 of fp16 v[c][i] widened
    (row c at v0 + c*stride) times w[c], onto y[i] (simd_gemm's order: cell after cell), for i < 8*n8; 32 dims
    at a time kept in registers over all the cells (then 8 at a time for the rest)."""
    def codegen(context, builder, sig, args):
        y, v0, stride, w, n, n8 = args
        v8f, v8h, v8s = _vec(_f32, 8), _vec(ir.HalfType(), 8), _vec(_i16, 8)
        fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])

        def blocks(first, count, width):
            # dims [8*first + 32*b ...) in groups of `width` vectors, b = 0..count-1
            with cgutils.for_range(builder, count) as blk:
                d0 = builder.add(builder.mul(blk.index, ir.Constant(_i64, width)), first)
                pys = [_ptr(builder, builder.add(y, builder.mul(builder.add(d0, ir.Constant(_i64, j)),
                                                                ir.Constant(_i64, 32))), v8f) for j in range(width)]
                accs = [cgutils.alloca_once_value(builder, builder.load(py, align=1)) for py in pys]
                xoff = builder.mul(d0, ir.Constant(_i64, 16))
                with cgutils.for_range(builder, n) as cell:
                    wv = _splat(builder, builder.load(_ptr(builder, builder.add(w, builder.mul(
                        cell.index, ir.Constant(_i64, 4))), _f32), align=1), 8)
                    row = builder.add(builder.add(v0, builder.mul(cell.index, stride)), xoff)
                    for j in range(width):
                        fx = builder.fpext(builder.bitcast(builder.load(_ptr(builder, builder.add(
                            row, ir.Constant(_i64, 16 * j)), v8s), align=1), v8h), v8f)
                        builder.store(builder.call(fma8, [fx, wv, builder.load(accs[j])]), accs[j])
                for j in range(width):
                    builder.store(builder.load(accs[j]), pys[j], align=1)
        n32 = builder.sdiv(n8, ir.Constant(_i64, 4))
        blocks(ir.Constant(_i64, 0), n32, 4)
        blocks(builder.mul(n32, ir.Constant(_i64, 4)), builder.sub(n8, builder.mul(n32, ir.Constant(_i64, 4))), 1)
        return context.get_dummy_value()
    return types.void(*([types.int64] * 3), types.int64, types.int64, types.int64), codegen

@intrinsic
def f16_to_f32_hw(typingctx, h):
    """vcvtph2ps on one value (F16C; exact, NaNs quieted: the values of fp16_to_fp32)."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), _f32)
    return types.float32(types.uint16), codegen

@intrinsic
def f32_to_f16_hw(typingctx, x):
    """vcvtps2ph on one value (F16C: round to nearest even, hardware NaN handling)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), _i16)
    return types.uint16(types.float32), codegen

@intrinsic
def copy_bytes(typingctx, dst, src, n):
    """memcpy (llvm.memcpy, non-overlapping)."""
    def codegen(context, builder, sig, args):
        dst, src, n = args
        i8p = ir.PointerType(_i8)
        cgutils.memcpy(builder, builder.inttoptr(dst, i8p), builder.inttoptr(src, i8p), n)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen

@intrinsic
def binop_row(typingctx, a, b, d, n, op):
    """d = a op b on n contiguous float32 (op: 0 add, 1 mul, 2 sub, 3 div), 8 lanes at a time."""
    def codegen(context, builder, sig, args):
        a, b, d, n, op = args
        v8f = _vec(_f32, 8)
        n8 = builder.sdiv(n, ir.Constant(_i64, 8))

        def apply(x, y):
            r_add, r_mul = builder.fadd(x, y), builder.fmul(x, y)
            r_sub, r_div = builder.fsub(x, y), builder.fdiv(x, y)
            r = builder.select(builder.icmp_signed("==", op, ir.Constant(_i64, 0)), r_add, r_mul)
            r = builder.select(builder.icmp_signed("==", op, ir.Constant(_i64, 2)), r_sub, r)
            return builder.select(builder.icmp_signed("==", op, ir.Constant(_i64, 3)), r_div, r)
        with cgutils.for_range(builder, n8) as loop:
            o = builder.mul(loop.index, ir.Constant(_i64, 32))
            x = builder.load(_ptr(builder, builder.add(a, o), v8f), align=1)
            y = builder.load(_ptr(builder, builder.add(b, o), v8f), align=1)
            builder.store(apply(x, y), _ptr(builder, builder.add(d, o), v8f), align=1)
        with cgutils.for_range_slice(builder, builder.mul(n8, ir.Constant(_i64, 8)), n, ir.Constant(_i64, 1)) as (i, _):
            o = builder.mul(i, ir.Constant(_i64, 4))
            x = builder.load(_ptr(builder, builder.add(a, o), _f32), align=1)
            y = builder.load(_ptr(builder, builder.add(b, o), _f32), align=1)
            builder.store(apply(x, y), _ptr(builder, builder.add(d, o), _f32), align=1)
        return context.get_dummy_value()
    return types.void(*([types.int64] * 5)), codegen

vec_dot_f16_simd = _make_vec_dot_flt(True)
vec_dot_f16_simd16 = _make_vec_dot_flt(True, 16)
vec_dot_f32_simd = _make_vec_dot_flt(False)


# =================================================================================================================
# scalar helpers (bit-exact)
# =================================================================================================================

_U32 = np.uint32

@compiled
def fp16_to_fp32(h):
    """ggml_compute_fp16_to_fp32 (the bit trick; NaNs come back quiet like vcvtph2ps). Every uint32 result is
    wrapped explicitly (Numba widens uint32 arithmetic to 64 bits)."""
    w = _U32(_U32(h) << _U32(16))
    sign = _U32(w & _U32(0x80000000))
    two_w = _U32(w + w)
    normalized = bits_f32(_U32(_U32(two_w >> _U32(4)) + _U32(0x70000000))) * F32(1.925929944387236e-34)
    denorm = bits_f32(_U32(_U32(two_w >> _U32(17)) | _U32(0x3F000000))) - F32(0.5)
    if two_w < _U32(1 << 27):
        r = _U32(sign | f32_bits(denorm))
    else:
        r = _U32(sign | f32_bits(normalized))
    return bits_f32(r)

@compiled
def fp32_to_fp16(f):
    """F16C vcvtps2ph (round to nearest even); NaN keeps sign and top payload bits, quiet (like the hardware)."""
    w = f32_bits(f)
    if _U32(w & _U32(0x7FFFFFFF)) > _U32(0x7F800000):
        return np.uint16(_U32(_U32(_U32(w >> _U32(16)) & _U32(0x8000)) | _U32(0x7E00)
                              | _U32(_U32(w >> _U32(13)) & _U32(0x3FF))))
    base = (abs(f) * F32(5.192296858534828e+33)) * F32(7.703719777548943e-34)
    shl1_w = _U32(w + w)
    sign = _U32(w & _U32(0x80000000))
    bias = _U32(shl1_w & _U32(0xFF000000))
    if bias < _U32(0x71000000):
        bias = _U32(0x71000000)
    base = bits_f32(_U32(_U32(bias >> _U32(1)) + _U32(0x07800000))) + base
    bits = f32_bits(base)
    exp_bits = _U32(_U32(bits >> _U32(13)) & _U32(0x00007C00))
    mantissa_bits = _U32(bits & _U32(0x00000FFF))
    nonsign = _U32(exp_bits + mantissa_bits)
    if shl1_w > _U32(0xFF000000):
        nonsign = _U32(0x7E00)
    return np.uint16(_U32(_U32(sign >> _U32(16)) | nonsign))

@compiled(inline="always")
def f32_to_f16(f):
    """F16C conversion: the instruction where there is one, the exact bit trick elsewhere."""
    if HAVE_AVX2:
        return f32_to_f16_hw(f)
    return fp32_to_fp16(f)

_E_R, _E_LOG2E, _E_HI, _E_LO = F32(EXP_R), F32(EXP_LOG2E), F32(EXP_LN2_HI), F32(EXP_LN2_LO)
_E_P0, _E_P1, _E_P2, _E_P3, _E_P4 = F32(EXP_P0), F32(EXP_P1), F32(EXP_P2), F32(EXP_P3), F32(EXP_P4)
_X_TAB = np.asarray(EXP2F_TAB, np.uint64)
_X_SHIFT, _X_INVLN2N = float(EXP2F_SHIFT), float(EXP2F_INVLN2N)
_X_C0, _X_C1, _X_C2 = float(EXP2F_C[0]), float(EXP2F_C[1]), float(EXP2F_C[2])

def _fconst8(v):
    return _splat_const(_f32, float(v))

def _splat_const(t, v):
    return ir.Constant(_vec(t, 8), [ir.Constant(t, v)] * 8)

def _v_expf8(builder, x):
    """ggml_v_expf (AVX2+FMA) on an <8 x float>, lane for lane."""
    v8f, v8i = _vec(_f32, 8), _vec(_i32, 8)
    fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
    f = lambda a, b, c: builder.call(fma8, [a, b, c])  # noqa: E731
    C = lambda v: _fconst8(v)  # noqa: E731
    r = C(float(_E_R))
    z = f(x, C(float(_E_LOG2E)), r)
    n = builder.fsub(z, r)
    nn = builder.fneg(n)
    b = f(nn, C(float(_E_LO)), f(nn, C(float(_E_HI)), x))
    e = builder.shl(builder.bitcast(z, v8i), _splat_const(_i32, 23))
    k = builder.bitcast(builder.add(e, _splat_const(_i32, 0x3F800000)), v8f)
    an = builder.bitcast(builder.and_(builder.bitcast(n, v8i), _splat_const(_i32, 0x7FFFFFFF)), v8f)
    c = builder.fcmp_ordered(">", an, C(126.0))
    u = builder.fmul(b, b)
    j = f(f(f(C(float(_E_P0)), b, C(float(_E_P1))), u, f(C(float(_E_P2)), b, C(float(_E_P3)))), u,
          builder.fmul(C(float(_E_P4)), b))
    fast = f(j, k, k)
    le0 = builder.fcmp_ordered("<=", n, C(0.0))
    g = builder.select(le0, _splat_const(_i32, -0x7E000000), _splat_const(_i32, 0))     # 0x82000000
    s1 = builder.bitcast(builder.add(g, _splat_const(_i32, 0x7F000000)), v8f)
    s2 = builder.bitcast(builder.sub(e, g), v8f)
    d = builder.fcmp_ordered(">", an, C(192.0))
    slow = builder.select(d, builder.fmul(s1, s1), builder.fmul(f(s2, j, s2), s1))
    return builder.select(c, slow, fast)

def _hsum8(builder, v):
    """((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)) in float32 (the AVX2 horizontal sum of vec.h)."""
    e = lambda vv, i: builder.extract_element(vv, ir.Constant(_i32, i))  # noqa: E731
    a = builder.fadd(builder.shuffle_vector(v, v, _cvec(_i32, [4, 5, 6, 7])),
                     builder.shuffle_vector(v, v, _cvec(_i32, [0, 1, 2, 3])))
    return builder.fadd(builder.fadd(e(a, 0), e(a, 2)), builder.fadd(e(a, 1), e(a, 3)))

@intrinsic
def soft_max_exp8(typingctx, src, dst, n8, mx):
    """The 8-lane part of ggml_vec_soft_max_f32: dst = v_expf(src - max) for n8 blocks of 8; returns the
    ggml_float sum of the blocks' float horizontal sums, in block order."""
    def codegen(context, builder, sig, args):
        src, dst, n8, mx = args
        v8f = _vec(_f32, 8)
        acc = cgutils.alloca_once_value(builder, ir.Constant(_f64, 0.0))
        mxv = _splat(builder, mx, 8)
        with cgutils.for_range(builder, n8) as loop:
            off = builder.mul(loop.index, ir.Constant(_i64, 32))
            x = builder.load(_ptr(builder, builder.add(src, off), v8f), align=1)
            y = _v_expf8(builder, builder.fsub(x, mxv))
            builder.store(y, _ptr(builder, builder.add(dst, off), v8f), align=1)
            builder.store(builder.fadd(builder.load(acc), builder.fpext(_hsum8(builder, y), _f64)), acc)
        return builder.load(acc)
    return types.float64(types.int64, types.int64, types.int64, types.float32), codegen

def _v_expf16(builder, x):
    """ggml_v_expf (AVX512F+DQ) on a <16 x float>, lane for lane: the polynomial with its 1, then vscalefps
    (j*2^n rounded once, subnormals included) as j widened to double times 2^n built in double's exponent bits (exact
    for |n| <= 192), rounded to float once; |n| > 192: inf for n > 0, 0 otherwise."""
    v16f, v16i, v16d = _vec(_f32, 16), _vec(_i32, 16), _vec(_f64, 16)
    fma16 = _decl(builder, "llvm.fma.v16f32", v16f, [v16f, v16f, v16f])
    f = lambda a, b, c: builder.call(fma16, [a, b, c])  # noqa: E731
    C = lambda v: _splat_const16(_f32, float(v))  # noqa: E731
    r = C(float(_E_R))
    z = f(x, C(float(_E_LOG2E)), r)
    n = builder.fsub(z, r)
    nn = builder.fneg(n)
    b = f(nn, C(float(_E_LO)), f(nn, C(float(_E_HI)), x))
    an = builder.bitcast(builder.and_(builder.bitcast(n, v16i), _splat_const16(_i32, 0x7FFFFFFF)), v16f)
    d = builder.fcmp_ordered(">", an, C(192.0))
    u = builder.fmul(b, b)
    j = f(f(f(C(float(_E_P0)), b, C(float(_E_P1))), u, f(C(float(_E_P2)), b, C(float(_E_P3)))), u,
          f(C(float(_E_P4)), b, C(1.0)))
    bad = builder.or_(d, builder.fcmp_unordered("uno", n, n))
    ni = builder.fptosi(builder.select(bad, C(0.0), n), _vec(_i64, 16))
    pw = builder.bitcast(builder.shl(builder.add(ni, _splat_const16(_i64, 1023)), _splat_const16(_i64, 52)), v16d)
    res = builder.fptrunc(builder.fmul(builder.fpext(j, v16d), pw), v16f)
    alt = builder.select(builder.fcmp_ordered("<=", n, C(0.0)), C(0.0), C(float("inf")))
    return builder.select(d, alt, res)

def _splat_const16(t, v):
    return ir.Constant(_vec(t, 16), [ir.Constant(t, v)] * 16)

def _hsum16(builder, v):
    """_mm512_reduce_add_ps: lanes i + i+8, then i + i+4, i + i+2, i + i+1 (the halving tree)."""
    a = builder.fadd(builder.shuffle_vector(v, v, _cvec(_i32, list(range(8)))),
                     builder.shuffle_vector(v, v, _cvec(_i32, list(range(8, 16)))))
    b = builder.fadd(builder.shuffle_vector(a, a, _cvec(_i32, [0, 1, 2, 3])),
                     builder.shuffle_vector(a, a, _cvec(_i32, [4, 5, 6, 7])))
    e = lambda vv, i: builder.extract_element(vv, ir.Constant(_i32, i))  # noqa: E731
    return builder.fadd(builder.fadd(e(b, 0), e(b, 2)), builder.fadd(e(b, 1), e(b, 3)))

@intrinsic
def soft_max_exp16(typingctx, src, dst, n16, mx):
    """The 16-lane part of ggml_vec_soft_max_f32 in an AVX-512 build: dst = v_expf(src - max) for n16 blocks of 16;
    returns the ggml_float sum of the blocks' ``_mm512_reduce_add_ps``, in block order."""
    def codegen(context, builder, sig, args):
        src, dst, n16, mx = args
        v16f = _vec(_f32, 16)
        acc = cgutils.alloca_once_value(builder, ir.Constant(_f64, 0.0))
        mxv = _splat(builder, mx, 16)
        with cgutils.for_range(builder, n16) as loop:
            off = builder.mul(loop.index, ir.Constant(_i64, 64))
            x = builder.load(_ptr(builder, builder.add(src, off), v16f), align=1)
            y = _v_expf16(builder, builder.fsub(x, mxv))
            builder.store(y, _ptr(builder, builder.add(dst, off), v16f), align=1)
            builder.store(builder.fadd(builder.load(acc), builder.fpext(_hsum16(builder, y), _f64)), acc)
        return builder.load(acc)
    return types.float64(types.int64, types.int64, types.int64, types.float32), codegen

@intrinsic
def swiglu16(typingctx, x, g, dst, n16):
    """The 16-lane part of ggml_vec_swiglu_f32 in an AVX-512 build: dst = (x / (1 + v_expf(0 - x))) * g."""
    def codegen(context, builder, sig, args):
        x, g, dst, n16 = args
        v16f = _vec(_f32, 16)
        with cgutils.for_range(builder, n16) as loop:
            off = builder.mul(loop.index, ir.Constant(_i64, 64))
            xv = builder.load(_ptr(builder, builder.add(x, off), v16f), align=1)
            gv = builder.load(_ptr(builder, builder.add(g, off), v16f), align=1)
            ex = _v_expf16(builder, builder.fsub(_splat_const16(_f32, 0.0), xv))
            silu = builder.fdiv(xv, builder.fadd(_splat_const16(_f32, 1.0), ex))
            builder.store(builder.fmul(silu, gv), _ptr(builder, builder.add(dst, off), v16f), align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64, types.int64), codegen

@intrinsic
def soft_max_prep(typingctx, src, mask, wp, n, scale, slope):
    """wp = src*scale (+ fma(slope, mask, wp) when mask != 0, float32 mask) and its max (MAX(a, b) = a > b ?
    a : b, in 8 lanes then across: the same value as ggml's sequential max for finite inputs)."""
    def codegen(context, builder, sig, args):
        src, mask, wp, n, scale, slope = args
        v8f = _vec(_f32, 8)
        fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
        fma1 = _decl(builder, "llvm.fma.f32", _f32, [_f32, _f32, _f32])
        has_mask = builder.icmp_signed("!=", mask, ir.Constant(_i64, 0))
        ninf = float("-inf")
        mx8 = cgutils.alloca_once_value(builder, _fconst8(ninf))
        mx1 = cgutils.alloca_once_value(builder, ir.Constant(_f32, ninf))
        sc8, sl8 = _splat(builder, scale, 8), _splat(builder, slope, 8)
        n8 = builder.sdiv(n, ir.Constant(_i64, 8))
        with cgutils.for_range(builder, n8) as loop:
            o = builder.mul(loop.index, ir.Constant(_i64, 32))
            v = builder.fmul(builder.load(_ptr(builder, builder.add(src, o), v8f), align=1), sc8)
            m = builder.load(_ptr(builder, builder.select(has_mask, builder.add(mask, o), builder.add(src, o)),
                                  v8f), align=1)
            vm = builder.call(fma8, [sl8, m, v])
            v = builder.select(has_mask, vm, v)
            builder.store(v, _ptr(builder, builder.add(wp, o), v8f), align=1)
            cur = builder.load(mx8)
            builder.store(builder.select(builder.fcmp_ordered(">", cur, v), cur, v), mx8)
        with cgutils.for_range_slice(builder, builder.mul(n8, ir.Constant(_i64, 8)), n, ir.Constant(_i64, 1)) as (i, _):
            o = builder.mul(i, ir.Constant(_i64, 4))
            v = builder.fmul(builder.load(_ptr(builder, builder.add(src, o), _f32), align=1), scale)
            m = builder.load(_ptr(builder, builder.select(has_mask, builder.add(mask, o), builder.add(src, o)),
                                  _f32), align=1)
            v = builder.select(has_mask, builder.call(fma1, [slope, m, v]), v)
            builder.store(v, _ptr(builder, builder.add(wp, o), _f32), align=1)
            cur = builder.load(mx1)
            builder.store(builder.select(builder.fcmp_ordered(">", cur, v), cur, v), mx1)
        r = builder.load(mx1)
        v8 = builder.load(mx8)
        for l in range(8):
            e = builder.extract_element(v8, ir.Constant(_i32, l))
            r = builder.select(builder.fcmp_ordered(">", r, e), r, e)
        return r
    return types.float32(types.int64, types.int64, types.int64, types.int64, types.float32, types.float32), codegen

@intrinsic
def scale_row(typingctx, d, n, v):
    """ggml_vec_scale_f32: d[i] *= v."""
    def codegen(context, builder, sig, args):
        d, n, v = args
        v8f = _vec(_f32, 8)
        v8 = _splat(builder, v, 8)
        n8 = builder.sdiv(n, ir.Constant(_i64, 8))
        with cgutils.for_range(builder, n8) as loop:
            p = _ptr(builder, builder.add(d, builder.mul(loop.index, ir.Constant(_i64, 32))), v8f)
            builder.store(builder.fmul(builder.load(p, align=1), v8), p, align=1)
        with cgutils.for_range_slice(builder, builder.mul(n8, ir.Constant(_i64, 8)), n, ir.Constant(_i64, 1)) as (i, _):
            p = _ptr(builder, builder.add(d, builder.mul(i, ir.Constant(_i64, 4))), _f32)
            builder.store(builder.fmul(builder.load(p, align=1), v), p, align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.float32), codegen

@intrinsic
def swiglu8(typingctx, x, g, dst, n8):
    """The 8-lane part of ggml_vec_swiglu_f32: dst = (x / (1 + v_expf(0 - x))) * g."""
    def codegen(context, builder, sig, args):
        x, g, dst, n8 = args
        v8f = _vec(_f32, 8)
        with cgutils.for_range(builder, n8) as loop:
            off = builder.mul(loop.index, ir.Constant(_i64, 32))
            xv = builder.load(_ptr(builder, builder.add(x, off), v8f), align=1)
            gv = builder.load(_ptr(builder, builder.add(g, off), v8f), align=1)
            ex = _v_expf8(builder, builder.fsub(_fconst8(0.0), xv))
            silu = builder.fdiv(xv, builder.fadd(_fconst8(1.0), ex))
            builder.store(builder.fmul(silu, gv), _ptr(builder, builder.add(dst, off), v8f), align=1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64, types.int64), codegen

@compiled(inline="always")
def v_expf(x):
    """One lane of ggml_v_expf (AVX2+FMA branch of vec.h), bit-exact."""
    z = fmaf(x, _E_LOG2E, _E_R)
    n = z - _E_R
    b = fmaf(-n, _E_LO, fmaf(-n, _E_HI, x))
    e = _U32(f32_bits(z) << _U32(23))
    k = bits_f32(_U32(e + _U32(0x3F800000)))
    u = b * b
    j = fmaf(fmaf(fmaf(_E_P0, b, _E_P1), u, fmaf(_E_P2, b, _E_P3)), u, _E_P4 * b)
    if not (abs(n) > F32(126)):
        return fmaf(j, k, k)
    g = _U32(0x82000000) if n <= F32(0) else _U32(0)
    s1 = bits_f32(_U32(g + _U32(0x7F000000)))
    s2 = bits_f32(_U32(e - g))
    if abs(n) > F32(192):
        return s1 * s1
    return fmaf(s2, j, s2) * s1

@compiled
def glibc_expf(x):
    """glibc __expf (the FMA build), bit-exact: what ggml's scalar tails call."""
    bits = f32_bits(x)
    abstop = _U32(_U32(bits >> _U32(20)) & _U32(0x7FF))
    if abstop >= np.uint32(0x42B):
        if bits == np.uint32(0xFF800000):
            return F32(0.0)
        if abstop >= np.uint32(0x7F8):
            return x + x
        if x > F32(88.72283172607422):
            return F32(np.inf)
        if x < F32(-103.97207641601562):
            return F32(0.0)
        if x < F32(-103.27892303466797):
            return F32(1.401298464324817e-45)
    xd = np.float64(x)
    kd = fma(_X_INVLN2N, xd, _X_SHIFT)
    ki = f64_bits(kd)
    kd = kd - _X_SHIFT
    r = fma(_X_INVLN2N, xd, -kd)
    t = np.uint64(_X_TAB[ki % np.uint64(32)] + np.uint64(ki << np.uint64(47)))
    s = bits_f64(t)
    z = fma(_X_C0, r, _X_C1)
    y = fma(_X_C2, r, 1.0)
    y = fma(z, r * r, y)
    return F32(y * s)

_SCT = np.array([SC_TAB[k] for k in ("c0", "c1", "c2", "c3", "c4", "s1", "s2", "s3")], np.float64)
_SCS = np.asarray(SC_SIGN, np.float64)
_PIO4T = np.asarray(INV_PIO4, np.uint64)
_HPI_INV, _HPI, _PI63 = float(SC_HPI_INV), float(SC_HPI), float(SC_PI63)
_U64 = np.uint64

@compiled
def _sincosf_poly(x, x2, tab1, odd):
    """sinf_poly of glibc's s_sincosf.h (tab1: the table whose cosine coefficients are negated)."""
    if odd:
        sg = -1.0 if tab1 else 1.0
        x4 = x2 * x2
        c2 = fma(x2, sg * _SCT[4], sg * _SCT[3])
        c = fma(x4, sg * _SCT[2], fma(x2, sg * _SCT[1], sg * _SCT[0]))
        return F32(fma(x4 * x2, c2, c))
    x3 = x * x2
    s1 = fma(x2, _SCT[7], _SCT[6])
    return F32(fma(x3 * x2, s1, fma(x3, _SCT[5], x)))

@compiled
def glibc_sincosf(y, want_cos):
    """glibc __sinf / __cosf (the FMA build, sysdeps/ieee754/flt-32), bit-exact: ROPE's cosf/sinf."""
    bits = f32_bits(y)
    at = _U32(_U32(bits >> _U32(20)) & _U32(0x7FF))
    x = np.float64(y)
    flip = 1 if want_cos else 0
    if at < _U32(0x3F4):
        if at < _U32(0x398):
            return F32(1.0) if want_cos else y
        return _sincosf_poly(x, x * x, False, want_cos)
    if at < _U32(0x42F):
        n32 = np.int32(np.int64(x * _HPI_INV))
        n = np.int64(np.int32(n32 + np.int32(0x800000)) >> np.int32(24))
        xr = fma(-np.float64(n), _HPI, x)
        return _sincosf_poly(xr * _SCS[n & 3], xr * xr, (n & 2) != 0, ((n ^ flip) & 1) == 1)
    if at < _U32(0x7F8):
        xi = _U64(bits)
        idx = np.int64((xi >> _U64(26)) & _U64(15))
        m = _U64(_U64((xi & _U64(0xFFFFFF)) | _U64(0x800000)) << ((xi >> _U64(23)) & _U64(7)))
        res0 = _U64(_U64(m * _PIO4T[idx]) & _U64(0xFFFFFFFF))
        res1 = _U64(m * _PIO4T[idx + 4])
        res2 = _U64(m * _PIO4T[idx + 8])
        res0 = _U64(_U64(_U64(res2 >> _U64(32)) | _U64(res0 << _U64(32))) + res1)
        nn = _U64(_U64(res0 + _U64(1 << 61)) >> _U64(62))
        res0 = _U64(res0 - _U64(nn << _U64(62)))
        xl = np.float64(np.int64(res0)) * _PI63
        n = np.int64(nn)
        q = n + np.int64(bits >> _U32(31))
        return _sincosf_poly(xl * _SCS[q & 3], xl * xl, (q & 2) != 0, ((n ^ flip) & 1) == 1)
    return (y - y) / (y - y)
