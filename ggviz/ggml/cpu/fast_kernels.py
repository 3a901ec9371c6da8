"""Compiled CPU kernels (Numba) for ggviz's fast path: ggml-cpu's SIMD kernels, compiled instead of emulated.

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

import os
import platform
import time

import numpy as np

HAVE_NUMBA = False
NUMBA_ERROR = None
if os.environ.get("GGVIZ_NO_NUMBA", "") not in ("", "0"):
    NUMBA_ERROR = "disabled by GGVIZ_NO_NUMBA"
else:
    try:
        from numba import njit, types
        from numba.core import cgutils
        from numba.extending import intrinsic
        from llvmlite import ir
        import llvmlite.binding as _llvm
        HAVE_NUMBA = True
    except Exception as _exc:  # noqa: BLE001 - any import problem means "no compiled kernels"
        NUMBA_ERROR = f"{type(_exc).__name__}: {_exc}"

F32 = np.float32

# ---------------------------------------------------------------------------------------------------------------------
# op codes and the layout of a program row
# ---------------------------------------------------------------------------------------------------------------------

OP_NOP = 0
OP_GET_ROWS = 1
OP_RMS_NORM = 2          # P[2] = 1: fused with the following MUL (ggml_compute_forward_rms_norm_mul_fused)
OP_BINARY = 3            # P[2] = 0 add, 1 mul, 2 sub, 3 div
OP_ROPE = 4
OP_SET_ROWS = 5
OP_SOFT_MAX = 6
OP_CPY = 7               # DUP / CPY / CONT
OP_SWIGLU = 8
OP_MUL_MAT_F = 9         # src0 F16 / F32 (ggml_compute_forward_mul_mat with vec_dot_f16 / vec_dot_f32)
OP_MUL_MAT_Q = 10        # src0 in CPU_REPACK (the repack tensor_traits' forward_mul_mat)

NCOL = 56                # int64 slots per program row
NFCOL = 8                # float64 slots per program row
DST, S0, S1, S2 = 3, 12, 21, 30     # tensor descriptors: addr, ne0..ne3, nb0..nb3
X = 39                   # op-specific extras: X .. NCOL-1

# type codes used inside kernels (ggml_type values)
T_F32, T_F16, T_Q4_0, T_Q4_1, T_Q8_0, T_I32, T_I64 = 0, 1, 2, 3, 8, 26, 27

# sync array (int64): each counter on its own cache line
SYNC_N_BARRIER = 0
SYNC_BARRIER_PASSED = 8
SYNC_CHUNK = 16
SYNC_ERROR = 24          # first error code (0 = none), SYNC_ERROR+1: node index
SYNC_SLEEPERS = 32       # threads asleep in a barrier (futex)
SYNC_TIMESPEC = 36       # struct timespec {0, 100 ms}: the longest single futex sleep
SYNC_SLEEP_TICKS = 38    # timestamp ticks the threads of this compute spent asleep in barriers (after the spin)
SYNC_TRACE = 40          # address of the trace log (0: nobody listens, nothing is recorded), SYNC_TRACE+1: its
                         # capacity in records per thread
SYNC_LEN = 48
BARRIER_MAX_SLEEPS = 3000                # 100 ms sleeps: a barrier gives up after about 5 minutes

# the trace log (see ``tr_rec``): per thread, one int64 count then ``cap`` records of TR_REC int64s:
# [kind, row, a, b, c, d, e, f, t0, t1] with t0/t1 timestamp-counter ticks
TR_REC = 10
TR_NODE = 1              # a program row computed: a = 0
TR_BARRIER = 2           # a barrier: a = where (TRW_*), b = n_barrier_passed on entry (ggml's barrier sequence number)
TR_CHUNK = 3             # a MUL_MAT chunk: a = chunk, b/c = ir0 range, d/e = ir1 range, f = nchunk0 << 32 | nchunk1
TRW_NODE, TRW_FINAL, TRW_KERNEL = 0, 1, 2

ERR_GET_ROWS_INDEX = 1
ERR_SET_ROWS_INDEX = 2
ERR_BARRIER_TIMEOUT = 3
# compile-time constants (Numba's cache does not key on global values: no environment overrides here)
GEMM_COLS = 4            # src1 columns per GEMM micro-kernel call
SPIN_CYCLES = 100000     # timestamp-counter ticks a barrier spins (~40 us) before sleeping

IS_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
HAVE_AVX2 = False
if HAVE_NUMBA:
    try:
        _feats = _llvm.get_host_cpu_features()
        HAVE_AVX2 = IS_X86 and bool(_feats.get("avx2", False)) and bool(_feats.get("fma", False)) \
            and bool(_feats.get("f16c", False))
    except Exception:  # noqa: BLE001
        HAVE_AVX2 = False
# repacked block scales are kept as fp16 (converted in the kernels, vcvtph2ps) where the CPU does that in hardware
SCALES_F16 = HAVE_AVX2 or platform.machine().lower() in ("aarch64", "arm64")

_JIT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy", boundscheck=False)


def _njit(fn=None, **kw):
    opts = dict(_JIT)
    opts.update(kw)
    if fn is None:
        return lambda f: njit(**opts)(f)
    return njit(**opts)(fn)


if HAVE_NUMBA:
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
    def _rdtsc(typingctx):
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

    def _abs_b(builder, a):
        zero = ir.Constant(_vec(_i8, 32), None)
        return builder.select(builder.icmp_signed("<", a, zero), builder.sub(zero, a), a)

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

    def _make_vec_dot_flt(is_f16: bool):
        """ggml_vec_dot_f16 / ggml_vec_dot_f32 (AVX2: GGML_F32_STEP 32 = 4 accumulators of 8 lanes, FMA), n % 32
        leftovers done by the caller. Returns the float32 reduce of the 4 accumulators."""
        def gen(typingctx, x, y, n32):
            def codegen(context, builder, sig, args):
                x, y, n32 = args
                v8f = _vec(_f32, 8)
                es = 2 if is_f16 else 4
                acc = [cgutils.alloca_once_value(builder, ir.Constant(v8f, None)) for _ in range(4)]
                fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
                with cgutils.for_range(builder, n32) as loop:
                    base = builder.mul(loop.index, ir.Constant(_i64, 32 * es))
                    for j in range(4):
                        off = builder.add(base, ir.Constant(_i64, 8 * es * j))
                        if is_f16:
                            vx = builder.fpext(builder.bitcast(builder.load(
                                _ptr(builder, builder.add(x, off), _vec(_i16, 8)), align=1), _vec(ir.HalfType(), 8)), v8f)
                            vy = builder.fpext(builder.bitcast(builder.load(
                                _ptr(builder, builder.add(y, off), _vec(_i16, 8)), align=1), _vec(ir.HalfType(), 8)), v8f)
                        else:
                            vx = builder.load(_ptr(builder, builder.add(x, off), v8f), align=1)
                            vy = builder.load(_ptr(builder, builder.add(y, off), v8f), align=1)
                        builder.store(builder.call(fma8, [vx, vy, builder.load(acc[j])]), acc[j])
                return _reduce_f32x8(builder, [builder.load(a) for a in acc])
            return types.float32(types.int64, types.int64, types.int64), codegen
        gen.__name__ = "vec_dot_f16_simd" if is_f16 else "vec_dot_f32_simd"
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

    @intrinsic
    def dot_f16_rows(typingctx, x0, xstride, nrows, y, n32, out):
        """ggml_vec_dot_f16 of ``nrows`` fp16 rows (x0 + r*xstride) with one row y already widened to float32
        (widening is exact, so this is the same arithmetic as ggml's): 4 accumulators of 8 lanes, one FMA per 8
        values, GGML_F32x8_REDUCE; out[r] = the float result (n a multiple of 32)."""
        def codegen(context, builder, sig, args):
            x0, xstride, nrows, y, n32, out = args
            v8f = _vec(_f32, 8)
            fma8 = _decl(builder, "llvm.fma.v8f32", v8f, [v8f, v8f, v8f])
            acc = [cgutils.alloca_once(builder, v8f) for _ in range(4)]
            with cgutils.for_range(builder, nrows) as rl:
                x = builder.add(x0, builder.mul(rl.index, xstride))
                for a in acc:
                    builder.store(ir.Constant(v8f, None), a)
                with cgutils.for_range(builder, n32) as loop:
                    bx = builder.mul(loop.index, ir.Constant(_i64, 64))
                    by = builder.mul(loop.index, ir.Constant(_i64, 128))
                    for j in range(4):
                        vx = builder.fpext(builder.bitcast(builder.load(
                            _ptr(builder, builder.add(x, builder.add(bx, ir.Constant(_i64, 16 * j))), _vec(_i16, 8)),
                            align=1), _vec(ir.HalfType(), 8)), v8f)
                        vy = builder.load(_ptr(builder, builder.add(y, builder.add(by, ir.Constant(_i64, 32 * j))),
                                               v8f), align=1)
                        builder.store(builder.call(fma8, [vx, vy, builder.load(acc[j])]), acc[j])
                r = _reduce_f32x8(builder, [builder.load(a) for a in acc])
                builder.store(r, _ptr(builder, builder.add(out, builder.mul(rl.index, ir.Constant(_i64, 4))), _f32),
                              align=1)
            return context.get_dummy_value()
        return types.void(*([types.int64] * 6)), codegen

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

    _vec_dot_f16_simd = _make_vec_dot_flt(True)
    _vec_dot_f32_simd = _make_vec_dot_flt(False)

    # =================================================================================================================
    # scalar helpers (bit-exact)
    # =================================================================================================================

    _U32 = np.uint32

    @_njit
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

    @_njit
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

    @_njit(inline="always")
    def f32_to_f16(f):
        """F16C conversion: the instruction where there is one, the exact bit trick elsewhere."""
        if HAVE_AVX2:
            return f32_to_f16_hw(f)
        return fp32_to_fp16(f)

    from .ops import (_EXP_LN2_HI, _EXP_LN2_LO, _EXP_LOG2E, _EXP_P0, _EXP_P1, _EXP_P2, _EXP_P3, _EXP_P4, _EXP_R,
                      _EXP2F_C, _EXP2F_INVLN2N, _EXP2F_SHIFT, _EXP2F_TAB)
    _E_R, _E_LOG2E, _E_HI, _E_LO = F32(_EXP_R), F32(_EXP_LOG2E), F32(_EXP_LN2_HI), F32(_EXP_LN2_LO)
    _E_P0, _E_P1, _E_P2, _E_P3, _E_P4 = F32(_EXP_P0), F32(_EXP_P1), F32(_EXP_P2), F32(_EXP_P3), F32(_EXP_P4)
    _X_TAB = np.asarray(_EXP2F_TAB, np.uint64)
    _X_SHIFT, _X_INVLN2N = float(_EXP2F_SHIFT), float(_EXP2F_INVLN2N)
    _X_C0, _X_C1, _X_C2 = float(_EXP2F_C[0]), float(_EXP2F_C[1]), float(_EXP2F_C[2])

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

    @_njit(inline="always")
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

    @_njit
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

    from .ops import _INV_PIO4, _SC_HPI, _SC_HPI_INV, _SC_PI63, _SC_SIGN, _SC_TAB
    _SCT = np.array([_SC_TAB[k] for k in ("c0", "c1", "c2", "c3", "c4", "s1", "s2", "s3")], np.float64)
    _SCS = np.asarray(_SC_SIGN, np.float64)
    _PIO4T = np.asarray(_INV_PIO4, np.uint64)
    _HPI_INV, _HPI, _PI63 = float(_SC_HPI_INV), float(_SC_HPI), float(_SC_PI63)
    _U64 = np.uint64

    @_njit
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

    @_njit
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

    # =================================================================================================================
    # barrier and chunk counter (ggml_barrier, ggml_threadpool_chunk_set/add)
    # =================================================================================================================

    @_njit
    def _set_error(sync, code, k):
        if atomic_load(sync + 8 * SYNC_ERROR) == 0:
            atomic_store(sync + 8 * (SYNC_ERROR + 1), k)
            atomic_store(sync + 8 * SYNC_ERROR, code)

    @_njit
    def tr_rec(sync, ith, kind, k, a, b, c, d, e, f, t0, t1):
        """Append one record to thread ith's part of the trace log (if there is one, and while it has room: a
        full log counts the record and drops it). Each thread writes only its own part: no atomics needed."""
        log = ld_i64(sync + 8 * SYNC_TRACE)
        if log == 0:
            return
        cap = ld_i64(sync + 8 * (SYNC_TRACE + 1))
        base = log + 8 * ith * (1 + cap * TR_REC)
        n = ld_i64(base)
        st_i64(base, n + 1)
        if n >= cap:
            return
        r = base + 8 + 8 * TR_REC * n
        st_i64(r, kind)
        st_i64(r + 8, k)
        st_i64(r + 16, a)
        st_i64(r + 24, b)
        st_i64(r + 32, c)
        st_i64(r + 40, d)
        st_i64(r + 48, e)
        st_i64(r + 56, f)
        st_i64(r + 64, t0)
        st_i64(r + 72, t1)

    @_njit
    def traced(sync):
        return ld_i64(sync + 8 * SYNC_TRACE) != 0

    @_njit
    def traced_barrier(sync, nth, ith, k, where, tr):
        """barrier(), recorded in the trace log when ``tr``."""
        if not tr or nth == 1:
            barrier(sync, nth)
            return
        seq = atomic_load(sync + 8 * SYNC_BARRIER_PASSED)
        t0 = _rdtsc()
        barrier(sync, nth)
        tr_rec(sync, ith, TR_BARRIER, k, where, seq, 0, 0, 0, 0, t0, _rdtsc())

    @_njit
    def barrier(sync, nth):
        """ggml_barrier: the last thread in bumps n_barrier_passed; the others spin on it (pause), and after
        SPIN_CYCLES go to sleep on it (futex; sched_yield where there is none), so that an oversubscribed machine
        does not burn the core the late thread needs."""
        if nth == 1:
            return
        p_passed = sync + 8 * SYNC_BARRIER_PASSED
        p_sleepers = sync + 8 * SYNC_SLEEPERS
        n_passed = atomic_load(p_passed)
        if atomic_add(sync + 8 * SYNC_N_BARRIER, 1) == nth - 1:
            # last thread in
            atomic_store(sync + 8 * SYNC_N_BARRIER, 0)
            atomic_add(p_passed, 1)
            if atomic_load(p_sleepers) > 0:
                futex_wake(p_passed)
            return
        t0 = _rdtsc()
        n_sleeps = 0
        while atomic_load(p_passed) == n_passed:
            if _rdtsc() - t0 < SPIN_CYCLES:
                cpu_relax()
            elif HAVE_FUTEX:
                atomic_add(p_sleepers, 1)
                t1 = _rdtsc()
                if atomic_load(p_passed) == n_passed:
                    futex_wait(p_passed, n_passed, sync + 8 * SYNC_TIMESPEC)    # 100 ms at most
                atomic_add(sync + 8 * SYNC_SLEEP_TICKS, _rdtsc() - t1)          # time asleep (contention)
                atomic_add(p_sleepers, -1)
                n_sleeps += 1
                if n_sleeps > BARRIER_MAX_SLEEPS:
                    # a thread never came (it failed before reaching the compiled walk): give up, report it
                    _set_error(sync, ERR_BARRIER_TIMEOUT, -1)
                    return
            else:
                t1 = _rdtsc()
                sched_yield()
                atomic_add(sync + 8 * SYNC_SLEEP_TICKS, _rdtsc() - t1)


    # =================================================================================================================
    # quantization of src1 rows (quantize_row_q8_0 / quantize_row_q8_1, AVX2), split layout
    # =================================================================================================================

    @_njit
    def _maxps(a, b):
        return a if a > b else b

    @_njit
    def quantize_row_q8(x, nb00, k, qy, dy, sy, ysum, with_sum):
        """One row of k floats at ``x`` (element stride nb00) -> int8 quants at qy, per block float32 d (the F16C-
        rounded scale), s (Q8_1: F16C(d*sum)), and the int32 sum of the int8 quants."""
        nb = k // 32
        lanes = np.empty(8, np.float32)
        for ib in range(nb):
            xb = x + ib * 32 * nb00
            # max |x|: four 8-lane vectors, _mm256_max_ps in order, then 4 / 2 / 1 lanes
            for l in range(8):
                lanes[l] = abs(ld_f32(xb + l * nb00))
            for v in range(1, 4):
                for l in range(8):
                    lanes[l] = _maxps(lanes[l], abs(ld_f32(xb + (8 * v + l) * nb00)))
            m0 = _maxps(lanes[4], lanes[0])
            m1 = _maxps(lanes[5], lanes[1])
            m2 = _maxps(lanes[6], lanes[2])
            m3 = _maxps(lanes[7], lanes[3])
            amax = _maxps(_maxps(m0, m2), _maxps(m1, m3))
            d = amax / F32(127.0)
            idv = F32(127.0) / amax if amax != F32(0.0) else F32(0.0)
            isum = np.int64(0)
            qsum = np.int32(0)
            for j in range(32):
                v = ld_f32(xb + j * nb00) * idv
                # _mm256_round_ps(nearest) then _mm256_cvtps_epi32 (NaN / out of range -> INT_MIN)
                if v != v or abs(v) >= F32(2147483648.0):
                    iv = np.int64(-2147483648)
                else:
                    iv = np.int64(np.rint(v))
                isum += iv
                q = iv
                if q > 127:
                    q = 127
                elif q < -128:
                    q = -128
                st_i8(qy + ib * 32 + j, np.int8(q))
                qsum += np.int32(q)
            dh = fp32_to_fp16(d)
            st_f32(dy + ib * 4, fp16_to_fp32(dh))
            st_i32(ysum + ib * 4, qsum)
            if with_sum:
                # hsum of the int32 lanes wraps like the SIMD adds
                s32 = np.int32(isum)
                st_f32(sy + ib * 4, fp16_to_fp32(fp32_to_fp16(d * F32(s32))))
            else:
                st_f32(sy + ib * 4, F32(0.0))

    # =================================================================================================================
    # repacked MUL_MAT (tensor_traits::forward_mul_mat of repack.cpp)
    # =================================================================================================================

    @_njit
    def mmq_layout(ne10, nrows_y):
        """Byte offsets in the work buffer of the quantized src1: quants, d, s, sums; and the total size."""
        nb = ne10 // 32
        o_q = 0
        o_d = (nrows_y * ne10 + 63) // 64 * 64
        o_s = o_d + (nrows_y * nb * 4 + 63) // 64 * 64
        o_sum = o_s + (nrows_y * nb * 4 + 63) // 64 * 64
        total = o_sum + (nrows_y * nb * 4 + 63) // 64 * 64
        return o_q, o_d, o_s, o_sum, total

    @_njit
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

    @_njit
    def mmq_chunk(qtype, xq, xd, xm, ne00, r0, r1, dst, nb1, nb2, i12, ne11, ne10, wdata, ntot):
        """Rows [r0, r1) (multiples of 8) of src0 times every column of plane i12 of the quantized src1."""
        nb = ne00 // 32
        o_q, o_d, o_s, o_sum, total = mmq_layout(ne10, ntot)
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

    @_njit
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

    @_njit
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

    @_njit
    def k_mul_mat_q(P, F, k, ith, nth, sync, wdata):
        qtype = P[k, X]
        xq, xd, xm = P[k, X + 1], P[k, X + 2], P[k, X + 3]
        ne00, ne01 = P[k, S0 + 1], P[k, S0 + 2]
        src1 = P[k, S1]
        ne10, ne11, ne12 = P[k, S1 + 1], P[k, S1 + 2], P[k, S1 + 3]
        nb10, nb11, nb12 = P[k, S1 + 5], P[k, S1 + 6], P[k, S1 + 7]
        dst = P[k, DST]
        nb1, nb2 = P[k, DST + 6], P[k, DST + 7]
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
                t0 = _rdtsc() if tr else 0
                mmq_chunk(qtype, xq, xd, xm, ne00, s, e, dst, nb1, nb2, current // nchunk0, ne11, ne10, wdata,
                          ne11 * ne12)
                if tr:
                    i12 = current // nchunk0
                    tr_rec(sync, ith, TR_CHUNK, k, current, s, e, i12 * ne11, (i12 + 1) * ne11,
                           (nchunk0 << 32) | nchunk1, t0, _rdtsc())
            current = atomic_add(sync + 8 * SYNC_CHUNK, 1)

    # =================================================================================================================
    # MUL_MAT with F16 / F32 src0 (ggml_compute_forward_mul_mat + vec_dot_f16 / vec_dot_f32)
    # =================================================================================================================

    @_njit
    def vec_dot_f16(n, x, y):
        n32 = n // 32
        if HAVE_AVX2:
            sumf = np.float64(_vec_dot_f16_simd(x, y, n32))
        else:
            acc = np.zeros(32, np.float32)
            for i in range(n32):
                for j in range(32):
                    acc[j] = acc[j] + fp16_to_fp32(ld_u16(x + 2 * (32 * i + j))) * fp16_to_fp32(ld_u16(y + 2 * (32 * i + j)))
            for j in range(16):
                acc[j] = acc[j] + acc[j + 16]
            for j in range(8):
                acc[j] = acc[j] + acc[j + 8]
            t0 = np.empty(4, np.float32)
            for j in range(4):
                t0[j] = acc[j] + acc[j + 4]
            sumf = np.float64((t0[0] + t0[1]) + (t0[2] + t0[3]))
        for i in range(n32 * 32, n):
            sumf += np.float64(fp16_to_fp32(ld_u16(x + 2 * i)) * fp16_to_fp32(ld_u16(y + 2 * i)))
        return F32(sumf)

    @_njit
    def vec_dot_f32(n, x, y):
        n32 = n // 32
        if HAVE_AVX2:
            sumf = _vec_dot_f32_simd(x, y, n32)
        else:
            acc = np.zeros(32, np.float32)
            for i in range(n32):
                for j in range(32):
                    acc[j] = fmaf(ld_f32(x + 4 * (32 * i + j)), ld_f32(y + 4 * (32 * i + j)), acc[j])
            for j in range(16):
                acc[j] = acc[j] + acc[j + 16]
            for j in range(8):
                acc[j] = acc[j] + acc[j + 8]
            t0 = np.empty(4, np.float32)
            for j in range(4):
                t0[j] = acc[j] + acc[j + 4]
            sumf = (t0[0] + t0[1]) + (t0[2] + t0[3])
        # the leftover loop as the compiler emits it for ggml's scalar tail: 8- and 4-wide multiplies added in order,
        # then a fused multiply-add for the last (n % 32) % 4 elements
        r = n - n32 * 32
        for i in range(n32 * 32, n - r % 4):
            sumf += ld_f32(x + 4 * i) * ld_f32(y + 4 * i)
        for i in range(n - r % 4, n):
            sumf = fmaf(ld_f32(x + 4 * i), ld_f32(y + 4 * i), sumf)
        return sumf

    @_njit
    def k_mul_mat_f(P, F, k, ith, nth, sync, wdata):
        t0 = P[k, X]
        src0, src1, dst = P[k, S0], P[k, S1], P[k, DST]
        ne00, ne02, ne03 = P[k, S0 + 1], P[k, S0 + 3], P[k, S0 + 4]
        nb01, nb02, nb03 = P[k, S0 + 6], P[k, S0 + 7], P[k, S0 + 8]
        ne10, ne11, ne12, ne13 = P[k, S1 + 1], P[k, S1 + 2], P[k, S1 + 3], P[k, S1 + 4]
        nb10, nb11, nb12, nb13 = P[k, S1 + 5], P[k, S1 + 6], P[k, S1 + 7], P[k, S1 + 8]
        ne0, ne1 = P[k, DST + 1], P[k, DST + 2]
        nb1, nb2, nb3 = P[k, DST + 6], P[k, DST + 7], P[k, DST + 8]
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
        fast_f16 = HAVE_AVX2 and ne00 % 32 == 0
        yf = np.empty(ne00 if fast_f16 else 0, np.float32)
        current = ith
        while current < nchunk0 * nchunk1:
            ith0 = current % nchunk0
            ith1 = current // nchunk0
            ir0s = dr0 * ith0
            ir0e = min(ir0s + dr0, nr0)
            ir1s = dr1 * ith1
            ir1e = min(ir1s + dr1, nr1)
            tc = _rdtsc() if tr else 0
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
                    dot_f16_rows(src0 + ir0s * nb01 + i02 * nb02 + i03 * nb03, nb01, ir0e - ir0s,
                                 yf.ctypes.data, ne00 // 32, dr + ir0s * 4)
                    continue
                for ir0 in range(ir0s, ir0e):
                    xr = src0 + ir0 * nb01 + i02 * nb02 + i03 * nb03
                    if converted:
                        v = vec_dot_f16(ne00, xr, yr)
                    else:
                        v = vec_dot_f32(ne00, xr, yr)
                    st_f32(dr + ir0 * 4, v)
            if tr:
                tr_rec(sync, ith, TR_CHUNK, k, current, ir0s, ir0e, ir1s, ir1e, (nchunk0 << 32) | nchunk1,
                       tc, _rdtsc())
            if nth >= nchunk0 * nchunk1:
                break
            current = atomic_add(sync + 8 * SYNC_CHUNK, 1)

    # =================================================================================================================
    # element-wise and row ops
    # =================================================================================================================

    @_njit
    def _thread_range(n, ith, nth):
        dr = (n + nth - 1) // nth
        ir0 = dr * ith
        ir1 = min(ir0 + dr, n)
        return ir0, max(ir0, ir1)

    @_njit
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

    @_njit
    def k_get_rows(P, F, k, ith, nth, sync, wdata):
        t0 = P[k, X]
        ti = P[k, X + 1]
        src0, src1, dst = P[k, S0], P[k, S1], P[k, DST]
        ne00, ne01 = P[k, S0 + 1], P[k, S0 + 2]
        nb01, nb02, nb03 = P[k, S0 + 6], P[k, S0 + 7], P[k, S0 + 8]
        ne10, ne11, ne12 = P[k, S1 + 1], P[k, S1 + 2], P[k, S1 + 3]
        nb10, nb11, nb12 = P[k, S1 + 5], P[k, S1 + 6], P[k, S1 + 7]
        nb1, nb2, nb3 = P[k, DST + 6], P[k, DST + 7], P[k, DST + 8]
        nr = ne10 * ne11 * ne12
        ir0, ir1 = _thread_range(nr, ith, nth)
        for i in range(ir0, ir1):
            i12 = i // (ne11 * ne10)
            i11 = (i - i12 * ne11 * ne10) // ne10
            i10 = i - i12 * ne11 * ne10 - i11 * ne10
            ia = src1 + i10 * nb10 + i11 * nb11 + i12 * nb12
            i01 = np.int64(ld_i32(ia)) if ti == T_I32 else ld_i64(ia)
            if i01 < 0 or i01 >= ne01:
                _set_error(sync, ERR_GET_ROWS_INDEX, k)
                continue
            xr = src0 + i01 * nb01 + i11 * nb02 + i12 * nb03
            yr = dst + i10 * nb1 + i11 * nb2 + i12 * nb3
            if t0 == T_F32:
                for j in range(ne00):
                    st_u32(yr + 4 * j, ld_u32(xr + 4 * j))
            else:
                for j in range(ne00):
                    st_f32(yr + 4 * j, _row_to_f32(t0, xr, j, ne00))

    @_njit
    def k_rms_norm(P, F, k, ith, nth, sync, wdata):
        fused = P[k, 2]
        src0, dst = P[k, S0], P[k, DST]
        ne00, ne01, ne02, ne03 = P[k, S0 + 1], P[k, S0 + 2], P[k, S0 + 3], P[k, S0 + 4]
        nb01, nb02, nb03 = P[k, S0 + 6], P[k, S0 + 7], P[k, S0 + 8]
        nb1, nb2, nb3 = P[k, DST + 6], P[k, DST + 7], P[k, DST + 8]
        w = P[k, S1]
        ne11, ne12, ne13 = P[k, S1 + 2], P[k, S1 + 3], P[k, S1 + 4]
        nb11, nb12, nb13 = P[k, S1 + 6], P[k, S1 + 7], P[k, S1 + 8]
        eps = F32(F[k, 0])
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

    @_njit
    def k_binary(P, F, k, ith, nth, sync, wdata):
        op = P[k, 2]
        src0, src1, dst = P[k, S0], P[k, S1], P[k, DST]
        ne00, ne01, ne02, ne03 = P[k, S0 + 1], P[k, S0 + 2], P[k, S0 + 3], P[k, S0 + 4]
        nb01, nb02, nb03 = P[k, S0 + 6], P[k, S0 + 7], P[k, S0 + 8]
        ne10, ne11, ne12, ne13 = P[k, S1 + 1], P[k, S1 + 2], P[k, S1 + 3], P[k, S1 + 4]
        nb10, nb11, nb12, nb13 = P[k, S1 + 5], P[k, S1 + 6], P[k, S1 + 7], P[k, S1 + 8]
        nb0, nb1, nb2, nb3 = P[k, DST + 5], P[k, DST + 6], P[k, DST + 7], P[k, DST + 8]
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

    @_njit
    def k_rope(P, F, k, ith, nth, sync, wdata):
        src0, pos, dst, ff = P[k, S0], P[k, S1], P[k, DST], P[k, S2]
        ne0, ne1, ne2, ne3 = P[k, DST + 1], P[k, DST + 2], P[k, DST + 3], P[k, DST + 4]
        nb01, nb02, nb03 = P[k, S0 + 6], P[k, S0 + 7], P[k, S0 + 8]
        nb1, nb2, nb3 = P[k, DST + 6], P[k, DST + 7], P[k, DST + 8]
        n_dims = P[k, X]
        neox = P[k, X + 1]
        freq_scale = F32(F[k, 0])
        ext_factor = F32(F[k, 1])
        attn_factor = F32(F[k, 2])
        theta_scale = F32(F[k, 3])
        corr0 = F32(F[k, 4])
        corr1 = F32(F[k, 5])
        sin_sign = F32(F[k, 6])
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

    @_njit
    def k_set_rows(P, F, k, ith, nth, sync, wdata):
        tdst = P[k, X]
        ti = P[k, X + 1]
        src0, src1, dst = P[k, S0], P[k, S1], P[k, DST]
        ne00, ne01, ne02, ne03 = P[k, S0 + 1], P[k, S0 + 2], P[k, S0 + 3], P[k, S0 + 4]
        nb00, nb01, nb02, nb03 = P[k, S0 + 5], P[k, S0 + 6], P[k, S0 + 7], P[k, S0 + 8]
        ne11, ne12 = P[k, S1 + 2], P[k, S1 + 3]
        nb10, nb11, nb12 = P[k, S1 + 5], P[k, S1 + 6], P[k, S1 + 7]
        ne1 = P[k, DST + 2]
        nb0, nb1, nb2, nb3 = P[k, DST + 5], P[k, DST + 6], P[k, DST + 7], P[k, DST + 8]
        ir0, ir1 = _thread_range(ne01, ith, nth)
        for i03 in range(ne03):
            for i02 in range(ne02):
                for i in range(ir0, ir1):
                    ia = src1 + i * nb10 + (i02 % ne11) * nb11 + (i03 % ne12) * nb12
                    i1 = np.int64(ld_i32(ia)) if ti == T_I32 else ld_i64(ia)
                    if i1 < 0 or i1 >= ne1:
                        _set_error(sync, ERR_SET_ROWS_INDEX, k)
                        continue
                    x = src0 + i * nb01 + i02 * nb02 + i03 * nb03
                    d = dst + i1 * nb1 + i02 * nb2 + i03 * nb3
                    if tdst == T_F16:
                        for j in range(ne00):
                            st_u16(d + j * nb0, f32_to_f16(ld_f32(x + j * nb00)))
                    else:
                        for j in range(ne00):
                            st_u32(d + j * nb0, ld_u32(x + j * nb00))

    @_njit
    def k_soft_max(P, F, k, ith, nth, sync, wdata):
        src0, mask, dst = P[k, S0], P[k, S1], P[k, DST]
        tmask = P[k, X]
        ne00, ne01, ne02, ne03 = P[k, S0 + 1], P[k, S0 + 2], P[k, S0 + 3], P[k, S0 + 4]
        nb01, nb02, nb03 = P[k, S0 + 6], P[k, S0 + 7], P[k, S0 + 8]
        ne12, ne13 = P[k, S1 + 3], P[k, S1 + 4]
        nb11, nb12, nb13 = P[k, S1 + 6], P[k, S1 + 7], P[k, S1 + 8]
        nb1, nb2, nb3 = P[k, DST + 6], P[k, DST + 7], P[k, DST + 8]
        scale = F32(F[k, 0])
        slope = F32(F[k, 1])
        wp = np.empty(ne00, np.float32)
        m8 = (ne00 // 8) * 8
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
                    # ggml_vec_soft_max_f32: 8-lane v_expf, float hsum per 8 lanes, double sum; libm expf tail
                    s = soft_max_exp8(wp.ctypes.data, dp, m8 // 8, mx)
                    for i in range(m8, ne00):
                        v = glibc_expf(wp[i] - mx)
                        st_f32(dp + 4 * i, v)
                        s += np.float64(v)
                    scale_row(dp, ne00, F32(1.0 / s))

    @_njit
    def k_swiglu(P, F, k, ith, nth, sync, wdata):
        src0, src1, dst = P[k, S0], P[k, S1], P[k, DST]
        nc = P[k, X]
        swapped = P[k, X + 1]
        nr = P[k, X + 2]
        nb01 = P[k, S0 + 6]
        nb11 = P[k, S1 + 6]
        nb1 = P[k, DST + 6]
        ir0, ir1 = _thread_range(nr, ith, nth)
        m8 = (nc // 8) * 8
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
            swiglu8(xr, gr, d, m8 // 8)
            for i in range(m8, nc):
                xv = ld_f32(xr + 4 * i)
                st_f32(d + 4 * i, (xv / (F32(1.0) + glibc_expf(-xv))) * ld_f32(gr + 4 * i))

    @_njit
    def k_cpy(P, F, k, ith, nth, sync, wdata):
        """dup_bytes / dup_flt: src rows [ir0, ir1) of every (i02, i03) go to the dst elements with the same flat
        index; F32->F16 converts with F16C rounding."""
        tsrc = P[k, X]
        tdst = P[k, X + 1]
        src0, dst = P[k, S0], P[k, DST]
        ne00, ne01, ne02, ne03 = P[k, S0 + 1], P[k, S0 + 2], P[k, S0 + 3], P[k, S0 + 4]
        nb00, nb01, nb02, nb03 = P[k, S0 + 5], P[k, S0 + 6], P[k, S0 + 7], P[k, S0 + 8]
        ne0, ne1, ne2 = P[k, DST + 1], P[k, DST + 2], P[k, DST + 3]
        nb0, nb1, nb2, nb3 = P[k, DST + 5], P[k, DST + 6], P[k, DST + 7], P[k, DST + 8]
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

    @_njit
    def compute_node(P, F, k, ith, nth, sync, wdata):
        op = P[k, 0]
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

    @_njit
    def graph_compute_thread(P, F, wdata, sync, ith, nth, k0, k1, timings):
        """Every thread walks nodes k0..k1-1 of the program; a barrier after each node (not after the last).
        The work-buffer address is patched into the rows that use it (column X+4 / X+1) by the caller."""
        t = np.int64(0)
        tr = traced(sync)
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

    @_njit
    def time_ns():
        """Cycle counter (for per-node profiles only)."""
        return _rdtsc()


def new_sync() -> np.ndarray:
    """The shared counters of one compiled graph (barrier, chunk, error, futex timeout)."""
    sync = np.zeros(SYNC_LEN, np.int64)
    sync[SYNC_TIMESPEC] = 0
    sync[SYNC_TIMESPEC + 1] = 100_000_000
    return sync


def warmup() -> float:
    """Compile (or load from Numba's cache) every kernel; returns the seconds it took."""
    if not HAVE_NUMBA:
        return 0.0
    t0 = time.perf_counter()
    P = np.zeros((1, NCOL), np.int64)
    Fa = np.zeros((1, NFCOL), np.float64)
    sync = new_sync()
    graph_compute_thread(P, Fa, 0, sync.ctypes.data, 0, 1, 0, 1, np.zeros(0, np.int64))
    x = np.zeros(64, np.float32)
    w = np.zeros(256, np.uint8)
    mmq_quantize(x.ctypes.data, 32, 1, 1, 128, 128, 4, w.ctypes.data, True, 0, 1)
    return time.perf_counter() - t0
