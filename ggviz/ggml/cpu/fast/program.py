"""The compiled graph program: the layout of one row per computed node, the shared sync array and the trace log.

Not a ggml source file. ggml walks ``cgraph->nodes`` and reads each ``struct ggml_tensor`` in C; the compiled walk
cannot touch Python objects, so ``compiler.py`` copies what each kernel needs out of the tensor structs into two
arrays with one row per computed node: ``P`` (int64) and ``F`` (float64). The columns have names (below), used by
the compiler that writes them and by the kernels that read them, e.g. ``P[k, S0 + NB1]`` is ``src[0]->nb[1]`` of
program row k and ``P[k, ROPE_N_DIMS]`` the ``n_dims`` op param of a ROPE row.

NumPy only: importable without Numba (the compiled kernels read these names as compile-time constants).
"""
from __future__ import annotations

# ---------------------------------------------------------------------------------------------------------------------
# op codes (column OP)
# ---------------------------------------------------------------------------------------------------------------------

OP_NOP = 0
OP_GET_ROWS = 1
OP_RMS_NORM = 2          # SUBOP = 1: fused with the following MUL (ggml_compute_forward_rms_norm_mul_fused)
OP_BINARY = 3            # SUBOP = 0 add, 1 mul, 2 sub, 3 div
OP_ROPE = 4
OP_SET_ROWS = 5
OP_SOFT_MAX = 6
OP_CPY = 7               # DUP / CPY / CONT
OP_SWIGLU = 8
OP_MUL_MAT_F = 9         # src0 F16 / F32 (ggml_compute_forward_mul_mat with vec_dot_f16 / vec_dot_f32)
OP_MUL_MAT_Q = 10        # src0 in CPU_REPACK (the repack tensor_traits' forward_mul_mat)
OP_SCALE = 11            # gemma_ops.k_scale
OP_GEGLU = 12            # gemma_ops.k_geglu
# PowerInfer's sparse FFN (sparse.py)
OP_MUL_MAT_SPARSE = 13   # sparse.k_mul_mat_sparse (SP_UPSCALE = 1: the GPU half, mul_mat_idx_upscale)
OP_AXPY = 14             # sparse.k_axpy (SP_UPSCALE = 1: the GPU half on gpu_bucket)
OP_UNARY = 15            # sparse.k_unary: SUBOP = UNARY_RELU / UNARY_SILU (F32 rows)
OP_FLASH_ATTN = 16       # fattn.k_flash_attn_ext (F32 Q, F16 K/V, F16 mask or none; S0/S1/S2 = q/k/v)
UNARY_RELU, UNARY_SILU = 0, 1

# ---------------------------------------------------------------------------------------------------------------------
# P: int64 columns of a program row
# ---------------------------------------------------------------------------------------------------------------------

NCOL = 56                # int64 slots per program row
NFCOL = 8                # float64 slots per program row

OP = 0                   # the op code
SUBOP = 2                # OP_BINARY: which operator; OP_RMS_NORM: 1 if fused with the next MUL

# tensor descriptors: where each tensor's words start; inside one, the struct's data, ne[4] and nb[4]
DST, S0, S1, S2 = 3, 12, 21, 30
DATA, NE0, NE1, NE2, NE3, NB0, NB1, NB2, NB3 = range(9)

# op-specific extras, from X on (X .. NCOL-1)
X = 39
MMQ_TYPE, MMQ_QS, MMQ_D, MMQ_M = X, X + 1, X + 2, X + 3     # OP_MUL_MAT_Q: src0 type, repacked quants/scales/mins
MMF_TYPE = X                                                # OP_MUL_MAT_F: src0 type (F16 / F32)
MMF_LLAMAFILE = X + 1                                       # OP_MUL_MAT_F: 1 = GGML_USE_LLAMAFILE (tinyBLAS)
MMF_LANES = X + 2                                           # OP_MUL_MAT_F: tinyBLAS's KN (8 AVX2, 16 AVX-512)
GET_ROWS_TYPE, GET_ROWS_ITYPE = X, X + 1                    # OP_GET_ROWS: src0 type, index type (I32 / I64)
SET_ROWS_TYPE, SET_ROWS_ITYPE = X, X + 1                    # OP_SET_ROWS: dst type, index type
SOFT_MAX_MTYPE = X                                          # OP_SOFT_MAX: mask type (F32 / F16), 0 without mask
SOFT_MAX_LANES = X + 1                                      # OP_SOFT_MAX: ggml_v_expf's lanes (8 AVX2, 16 AVX-512)
CPY_STYPE, CPY_DTYPE = X, X + 1                             # OP_CPY: src and dst types
SWIGLU_NC, SWIGLU_SWAPPED, SWIGLU_NROWS = X, X + 1, X + 2   # OP_SWIGLU: row length, op param 1, rows
SWIGLU_LANES = X + 3                                        # OP_SWIGLU: ggml_v_silu's lanes (8 AVX2, 16 AVX-512)
ROPE_N_DIMS, ROPE_NEOX = X, X + 1                           # OP_ROPE: rotated dims, 1 for NeoX mode
SCALE_NC, SCALE_NROWS = X, X + 1                            # OP_SCALE: row length, rows
GEGLU_NC, GEGLU_SWAPPED, GEGLU_NROWS, GEGLU_TABLE = X, X + 1, X + 2, X + 3   # OP_GEGLU: + the GELU table address
# OP_MUL_MAT_SPARSE / OP_AXPY: src0 type, src[3] (gpu_idx, or gpu_bucket in the GPU half; 0 = NULL) and its length,
# 1 for the GPU half, and SP_NTH: the compute's n_threads (written before each compute: AXPY's static split and
# its partials follow ggml's nth, not the threads the compiled walk happens to use)
SP_TYPE, SP_AUX, SP_NAUX, SP_UPSCALE, SP_NTH = X, X + 1, X + 2, X + 3, X + 4
# OP_FLASH_ATTN: the mask (src[3]: data, 0 = none, ne[2..3], nb[1..3])
FA_MASK, FA_MNE2, FA_MNE3, FA_MNB1, FA_MNB2, FA_MNB3 = X, X + 1, X + 2, X + 3, X + 4, X + 5
FA_SFMA = X + 6          # OP_FLASH_ATTN: 1 if ``S = S*ms + vs`` is one FMA (cpu/ops.py's FA_S_FMA)
FA_SPLIT = X + 7         # OP_FLASH_ATTN: 1 for the split-KV kernel (one query row over >= 512 cells)
FA_NTH = X + 8           # OP_FLASH_ATTN: the compute's n_threads (the split-KV chunks follow ggml's nth), per compute
FA_LANES = X + 9         # OP_FLASH_ATTN: the tiled kernel's ggml_vec_soft_max_f32 lanes (8 AVX2, 16 AVX-512)

# ---------------------------------------------------------------------------------------------------------------------
# F: float64 columns of a program row
# ---------------------------------------------------------------------------------------------------------------------

RMS_NORM_EPS = 0
SOFT_MAX_SCALE, SOFT_MAX_SLOPE = 0, 1
SCALE_S, SCALE_B = 0, 1
FA_SCALE = 0             # OP_FLASH_ATTN: the scale op param
SP_THRESHOLD = 0         # OP_MUL_MAT_SPARSE / OP_AXPY: ggml.c's sparse_pred_threshold, written before each compute
(ROPE_FREQ_SCALE, ROPE_EXT_FACTOR, ROPE_MSCALE, ROPE_THETA_SCALE, ROPE_CORR0, ROPE_CORR1,
 ROPE_SIN_SIGN) = range(7)

# type codes used inside kernels (ggml_type values)
T_F32, T_F16, T_Q4_0, T_Q4_1, T_Q8_0, T_I32, T_I64 = 0, 1, 2, 3, 8, 26, 27
T_Q5_0, T_Q4_K, T_Q6_K = 6, 12, 14       # Gemma-3's weights: MUL_MAT in kquants.py (k_mul_mat_kq)

# ---------------------------------------------------------------------------------------------------------------------
# the sync array (int64) a compiled graph's threads share: each counter on its own cache line
# ---------------------------------------------------------------------------------------------------------------------

SYNC_N_BARRIER = 0
SYNC_BARRIER_PASSED = 8
SYNC_CHUNK = 16
SYNC_ERROR = 24          # first error code (0 = none), SYNC_ERROR+1: node index
SYNC_SLEEPERS = 32       # threads asleep in a barrier (futex)
SYNC_TIMESPEC = 36       # struct timespec {0, 100 ms}: the longest single futex sleep
SYNC_SLEEP_TICKS = 38    # timestamp ticks the threads of this compute spent asleep in barriers (after the spin)
SYNC_TRACE = 40          # address of the trace log (0: nobody listens, nothing is recorded), SYNC_TRACE+1: its
                         # capacity in records per thread
SYNC_TICKS = 44          # timestamp ticks when thread 0 entered the compiled walk, SYNC_TICKS+1: when it left it (the
                         # thread policy's clock, read after the compute: compiler.FastGraph.compute_thread)
SYNC_LEN = 48
BARRIER_MAX_SLEEPS = 3000                # 100 ms sleeps: a barrier gives up after about 5 minutes

# the trace log (see ``sync.tr_rec``): per thread, one int64 count then ``cap`` records of TR_REC int64s:
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
