"""MUL_MAT on the faithful CPU path does not depend on the thread count, and matches real ggml.

ggml splits a MUL_MAT into chunks of rows x columns that depend on n_threads (16 x 16, or 64 when one side is 1,
re-chunked per thread when there are fewer than 4 chunks per thread), but every dst element is one ``vec_dot`` of a
src0 row and a src1 column, so the real ggml gives the same bytes for any n_threads. ggviz computes a chunk's dots
together with NumPy; for F32 / F16 / BF16 src0 it used one BLAS sgemm per chunk, whose summation order follows the
chunk's shape, so the low bits of an element changed with the thread count. ``cpu/quants.py`` now reproduces
``ggml_vec_dot_f32`` / ``_f16`` / ``_bf16`` of the AVX2+FMA build operation for operation (4 x 8 lanes, fused
multiply-adds, ``GGML_F32x8_REDUCE``, the leftover loop as gcc compiled it): bit-identical to the library, and the
same for every chunking. The quantized vec_dots sum exact integer block products and scale them block by block
element-wise (Q4_1 / Q5_1's ``summs`` now in the kernel's own sequential order instead of an sgemm), so they are
chunk-independent too; their float summation order still differs from the AVX2 kernels' 8 lanes, so against the
real ggml they agree to a few float32 ulps, not bit for bit.

Proof here:

* ``vec_dot`` for F32 / F16 / BF16 against the library's ``type_traits_cpu[t].vec_dot`` bit for bit, for every row
  length 1..140 (every leftover pattern) and on adversarial data (subnormal sums, huge / tiny magnitudes, float32
  rounding ties for the FMA, inf / NaN);
* one-node MUL_MAT graphs (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K) on shapes whose chunking differs between
  thread counts: byte-identical for n_threads 1..8, bit-identical to real ggml for F32 / F16 / BF16 (quantized: a
  tolerance);
* a miniature two-layer llama graph (RMS_NORM, MUL_MAT with Q8_0 / Q4_0 / Q4_1 / F16 / F32 weights, ROPE, F16 KV
  cache through SET_ROWS, KQ / KQV MUL_MATs on F16 views, SOFT_MAX with a mask, SWIGLU, GET_ROWS) on the faithful
  path: every node byte-identical for n_threads 1..8; every F32 / F16 MUL_MAT node bit-identical to real ggml run
  on the same inputs; the whole graph within NMSE 1e-6 of real ggml.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest


from tests.pairs import real_ggml
from ggviz import ggml as gg
from ggviz.ggml import quants as Q
from ggviz.ggml.cpu import quants as CQ
from tests import graphs
from tests.oracle import quant_lib as QL
from tests.oracle.ggml_lib import RealGGML, available, unavailable_reason
try:
    from ggviz.ggml.cpu.fast import compiler
except ImportError:      # no Numba: the compiled walk is not there
    compiler = None

needs_oracle = pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())

F32, F16, BF16 = gg.GGML_TYPE_F32, gg.GGML_TYPE_F16, gg.GGML_TYPE_BF16
Q4_0, Q4_1, Q8_0, Q4_K = gg.GGML_TYPE_Q4_0, gg.GGML_TYPE_Q4_1, gg.GGML_TYPE_Q8_0, gg.GGML_TYPE_Q4_K
THREADS = range(1, 9)

def real() -> RealGGML:
    return real_ggml()


@pytest.fixture(scope="module", autouse=True)
def _as_the_oracle_build():
    """The oracle (libggml-python 0.20.2) is built without GGML_USE_LLAMAFILE: ggviz computes as that build here
    (no tinyBLAS; llama.cpp's default build, with it, is tests/test_sgemm.py's oracle)."""
    from ggviz.ggml.cpu import mul_mat
    saved = mul_mat.USE_LLAMAFILE
    mul_mat.USE_LLAMAFILE = False
    yield
    mul_mat.USE_LLAMAFILE = saved


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _bits_equal(a, b) -> np.ndarray:
    """Elementwise: same float32 bits, or both NaN (payloads are not compared)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


# ====================================================================================================================
# 1. vec_dot against type_traits_cpu[t].vec_dot, bit for bit
# ====================================================================================================================

def _as_vdt_rows(t, x):
    return x.view(np.uint8) if t == F32 else CQ.from_float(t, x)


def _check_vec_dot(t, x, y):
    n = x.shape[1]
    xb, yb = _as_vdt_rows(t, x), _as_vdt_rows(t, y)
    ref = QL.vec_dot_cpu(t, xb, yb, n)
    got = CQ.vec_dot(t, xb, yb)
    assert got.shape == ref.shape and got.dtype == np.float32
    ok = _bits_equal(got, ref)
    assert ok.all(), f"{Q.type_name(t)} n={n}: {int((~ok).sum())} of {ok.size} differ, e.g. " \
                     f"{got[~ok][:3]} vs {ref[~ok][:3]}"


@pytest.mark.skipif(not QL.available(), reason="libggml (oracle) not available")
@pytest.mark.parametrize("t", [F32, F16, BF16], ids=Q.type_name)
def test_vec_dot_flt_bit_exact_every_length(t):
    r = np.random.default_rng(t)
    for n in list(range(1, 141)) + [256, 576, 1000]:
        x = (r.standard_normal((5, n)) * r.uniform(0.01, 100, (5, 1))).astype(np.float32)
        y = (r.standard_normal((3, n)) * r.uniform(0.01, 100, (3, 1))).astype(np.float32)
        _check_vec_dot(t, x, y)


@pytest.mark.skipif(not QL.available(), reason="libggml (oracle) not available")
@pytest.mark.parametrize("t", [F32, F16, BF16], ids=Q.type_name)
@pytest.mark.parametrize("kind", ["subnormal", "wide", "ties", "midpoints", "special"])
def test_vec_dot_flt_bit_exact_hard_data(t, kind):
    r = np.random.default_rng(["subnormal", "wide", "ties", "midpoints", "special"].index(kind))
    for _ in range(12):
        n = int(r.integers(1, 200))
        if kind == "subnormal":    # products and sums in float32's subnormal range (bf16: inexact products)
            x = (r.standard_normal((6, n)) * 1e-20).astype(np.float32)
            y = (r.standard_normal((4, n)) * 1e-20).astype(np.float32)
        elif kind == "wide":       # magnitudes 1e-15 .. 1e15 in one row
            x = (r.standard_normal((6, n)) * 10.0 ** r.uniform(-15, 15, (6, n))).astype(np.float32)
            y = (r.standard_normal((4, n)) * 10.0 ** r.uniform(-15, 15, (4, n))).astype(np.float32)
        elif kind == "ties":       # short significands: exact sums, ties
            x = (r.integers(-8, 8, (6, n)) * 0.5).astype(np.float32)
            y = (r.integers(-2 ** 12, 2 ** 12, (4, n)) * 2.0 ** r.integers(-3, 12, (4, n))).astype(np.float32)
        elif kind == "midpoints":  # full 24-bit significands times short ones: FMA double-rounding candidates
            x = ((r.integers(2 ** 23, 2 ** 24, (6, n)) | 1) * 2.0 ** -23).astype(np.float32)
            y = (r.integers(1, 2 ** 8, (4, n)) * 2.0 ** r.integers(-30, -20, (4, n))).astype(np.float32)
            x[:, ::3] *= -1
        else:                      # inf, NaN, overflow
            x = r.standard_normal((6, n)).astype(np.float32)
            y = r.standard_normal((4, n)).astype(np.float32)
            x[0, 0] = np.inf
            x[1, n // 2] = np.nan
            y[2, -1] = 3e38
            x[3, :] = 3e38
        _check_vec_dot(t, x, y)


@pytest.mark.skipif(not QL.available(), reason="libggml (oracle) not available")
def test_fma_double_rounding_case():
    """A lane whose float64 sum lands exactly on a float32 midpoint: acc = 2^-80, then fmaf(a, a, acc) with
    a = 1 + 2^-12: exact 1 + 2^-11 + 2^-24 + 2^-80 rounds up to 1 + 2^-11 + 2^-23 (vfmadd, one rounding), while
    float64 first drops 2^-80 and the tie then rounds to even, 1 + 2^-11."""
    n = 64
    x = np.zeros((1, n), np.float32)
    y = np.zeros((1, n), np.float32)
    x[0, 5] = y[0, 5] = np.float32(2.0 ** -40)             # step 0, lane 5: acc = 2^-80
    x[0, 37] = y[0, 37] = np.float32(1 + 2.0 ** -12)       # step 1, lane 5
    naive = np.float32(np.float64(x[0, 37]) * np.float64(y[0, 37]) + 2.0 ** -80)
    assert naive == np.float32(1 + 2.0 ** -11)
    want = np.float32(1 + 2.0 ** -11 + 2.0 ** -23)
    assert CQ.vec_dot(F32, x, y)[0, 0] == want
    assert QL.vec_dot_cpu(F32, x.view(np.uint8), y.view(np.uint8), n)[0, 0] == want


# ====================================================================================================================
# 2. one-node MUL_MAT graphs, n_threads 1..8, and real ggml
# ====================================================================================================================

def _chunking(nr0, nr1, nth):
    """(dr0, dr1) of ggml_compute_forward_mul_mat for nth threads."""
    cs = 64 if (nr0 == 1 or nr1 == 1) else 16
    nc0, nc1 = -(-nr0 // cs), -(-nr1 // cs)
    if nc0 * nc1 < nth * 4:
        nc0, nc1 = (nth, 1) if nr0 > nr1 else (1, nth)
    return -(-nr0 // nc0), -(-nr1 // nc1)


def _mm_graph(G, ctx, t0, K, M, N, b2, r2):
    a = G.new_tensor_4d(ctx, t0, K, M, b2, 1)
    b = G.new_tensor_4d(ctx, F32, K, N, b2 * r2, 1)
    c = G.mul_mat(ctx, a, b)
    gf = G.new_graph(ctx)
    G.build_forward_expand(gf, c)
    return a, b, c, gf


def _mm_data(t0, K, M, N, b2, r2, seed):
    r = np.random.default_rng(seed)
    A = (r.standard_normal((b2, M, K)) * r.uniform(0.1, 3, (b2, M, 1))).astype(np.float32)
    B = r.standard_normal((b2 * r2, N, K)).astype(np.float32)
    if t0 == F16:
        A = A.astype(np.float16)
    elif t0 == BF16:
        A = Q.fp32_to_bf16(A)                              # bits: no conversion on either side
    elif t0 != F32:
        A = Q.quantize_row_ref(t0, A.reshape(-1, K))       # the same bytes go into both engines
    return A, B


def _run_mm(G, t0, K, M, N, b2, r2, A, B, n_threads):
    ctx = G.init(64 << 20)
    try:
        a, b, c, gf = _mm_graph(G, ctx, t0, K, M, N, b2, r2)
        graphs.set_values(G, a, A)
        graphs.set_values(G, b, B)
        if not graphs.is_oracle(G):
            assert G.graph_plan(gf, n_threads).extra is None          # the faithful kernels, not the fast path
        assert G.graph_compute_with_ctx(ctx, gf, n_threads) == 0
        return np.array(graphs.to_float(G, c))
    finally:
        G.free(ctx)


# (K, ne01, ne11, batch, broadcast): K with a leftover tail (100 = 3*32 + 4, 70: 4 + 2 FMA leftovers, 99: 3 FMA
# leftovers), row / column counts whose chunking differs with the thread count
FLT_SHAPES = [(64, 576, 1, 1, 1), (576, 49, 6, 1, 1), (100, 1536, 32, 1, 1), (100, 49, 1, 1, 1),
              (64, 1536, 1, 1, 1), (576, 576, 32, 1, 1), (70, 49, 6, 1, 1), (99, 200, 3, 1, 1),
              (64, 40, 7, 2, 2), (40, 64, 7, 4, 1)]
QUANT_SHAPES = [(64, 576, 1, 1, 1), (576, 49, 6, 1, 1), (256, 1536, 32, 1, 1), (512, 100, 17, 1, 1)]


def _shape_id(s):
    K, M, N, b2, r2 = s
    return f"K{K}-M{M}-N{N}" + (f"-b{b2}x{r2}" if b2 * r2 > 1 else "")


def test_shapes_really_chunk_differently():
    # all but the 1536 x 32 and 576 x 32 outputs get chunk boundaries that move with the thread count; those keep
    # 16 x 16 chunks for 1..8 threads (>= 4 chunks per thread): only which thread computes which chunk changes
    fixed = [s for s in FLT_SHAPES + QUANT_SHAPES
             if len({_chunking(s[1], s[2] * s[3] * s[4], n) for n in THREADS}) == 1]
    assert fixed == [(100, 1536, 32, 1, 1), (576, 576, 32, 1, 1), (256, 1536, 32, 1, 1)]


@needs_oracle
@pytest.mark.parametrize("shape", FLT_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("t0", [F32, F16, BF16], ids=Q.type_name)
def test_mul_mat_flt_threads_and_ggml_bitwise(t0, shape):
    K, M, N, b2, r2 = shape
    A, B = _mm_data(t0, K, M, N, b2, r2, seed=K * 7 + M + N)
    ref = _run_mm(real(), t0, K, M, N, b2, r2, A, B, 1)
    for n in (2, 5, 8):          # the oracle itself is thread-count independent
        assert _run_mm(real(), t0, K, M, N, b2, r2, A, B, n).tobytes() == ref.tobytes()
    for n in THREADS:
        got = _run_mm(gg, t0, K, M, N, b2, r2, A, B, n)
        ok = _bits_equal(got, ref)
        assert ok.all(), f"{n} threads: {int((~ok).sum())} of {ok.size} elements differ from ggml"


def _run_mm_compiled(t0, K, M, N, b2, r2, A, B, n_threads):
    """The same graph through the compiled walk (ggviz's fast path: fast.kernels' vec_dot_f16 / vec_dot_f32)."""
    from ggviz.ggml.cpu import ggml_cpu
    ctx = gg.init(64 << 20)
    try:
        a, b, c, gf = _mm_graph(gg, ctx, t0, K, M, N, b2, r2)
        graphs.set_values(gg, a, A)
        graphs.set_values(gg, b, B)
        plan = ggml_cpu.graph_plan(gf, n_threads)
        plan.extra = compiler.compile_graph(gf)
        assert plan.extra is not None
        if plan.work_size:
            plan.work_data = np.zeros(plan.work_size, np.uint8)
        assert ggml_cpu.graph_compute(gf, plan) == 0
        return np.array(graphs.to_float(gg, c))
    finally:
        gg.free(ctx)


@needs_oracle
@pytest.mark.skipif(compiler is None, reason="numba unavailable")
@pytest.mark.parametrize("shape", FLT_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("t0", [F32, F16], ids=Q.type_name)
def test_mul_mat_flt_compiled_bitwise(t0, shape):
    """The fast path's F32/F16 MUL_MAT (the KV-cache attention of a decode) is ggml's bits too, for 1, 2 and 4
    threads -- including the F32 leftover tail (8/4-wide multiplies added in order, then FMAs)."""
    K, M, N, b2, r2 = shape
    A, B = _mm_data(t0, K, M, N, b2, r2, seed=K * 7 + M + N)
    ref = _run_mm(real(), t0, K, M, N, b2, r2, A, B, 1)
    for n in (1, 2, 4):
        got = _run_mm_compiled(t0, K, M, N, b2, r2, A, B, n)
        ok = _bits_equal(got, ref)
        assert ok.all(), f"{n} threads: {int((~ok).sum())} of {ok.size} elements differ from ggml"


@needs_oracle
@pytest.mark.parametrize("shape", QUANT_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("t0", [Q4_0, Q4_1, Q8_0, Q4_K], ids=Q.type_name)
def test_mul_mat_quant_threads_bitwise(t0, shape):
    K, M, N, b2, r2 = shape
    if K % Q.blck_size(t0):
        pytest.skip("row length not a multiple of the block size")
    A, B = _mm_data(t0, K, M, N, b2, r2, seed=K + M + N)
    one = _run_mm(gg, t0, K, M, N, b2, r2, A, B, 1)
    for n in THREADS:
        assert _run_mm(gg, t0, K, M, N, b2, r2, A, B, n).tobytes() == one.tobytes(), f"{n} threads"
    # against ggml: the same integer block sums and scales, another float32 summation order (8 AVX2 lanes)
    ref = _run_mm(real(), t0, K, M, N, b2, r2, A, B, 4)
    scale = np.abs(ref).max(axis=-1, keepdims=True)
    assert np.all(np.abs(one - ref) <= 4e-6 * scale), float((np.abs(one - ref) / scale).max())


# ====================================================================================================================
# 3. a miniature llama graph on the faithful path
# ====================================================================================================================

class HP:
    n_embd, n_head, n_head_kv, hd = 128, 4, 2, 32
    n_ff = 360                    # ffn_down has K = 360: an F16 / F32 leftover tail of 8
    n_vocab = 200
    n_tokens, n_past, kv_size = 7, 5, 40     # KQV: K = n_kv = 40, a tail of 8
    eps = 1e-5
    out_ids = (4, 6)
    rope = ((0, 10000.0), (2, 500000.0))     # layer 0 NORMAL, layer 1 NEOX
    # weight types per layer: every MUL_MAT src0 type the faithful path has
    types = ({"attn_q": "Q8_0", "attn_k": "Q4_1", "attn_v": "F16", "attn_output": "F32",
              "ffn_gate": "Q4_0", "ffn_up": "Q4_1", "ffn_down": "F16"},
             {"attn_q": "F32", "attn_k": "Q8_0", "attn_v": "Q4_1", "attn_output": "F16",
              "ffn_gate": "F16", "ffn_up": "Q8_0", "ffn_down": "F32"})


def _llama_inputs(hp=HP):
    T = hp.n_tokens
    pos = np.arange(hp.n_past, hp.n_past + T, dtype=np.int32)
    cells = pos.astype(np.int64)
    n_embd_v_gqa = hp.hd * hp.n_head_kv
    j = np.arange(n_embd_v_gqa, dtype=np.int64)
    v_idxs = (j[None, :] * hp.kv_size + cells[:, None]).reshape(-1)
    rows = -(-T // 8) * 8
    mask = np.full((rows, hp.kv_size), -np.inf, dtype=np.float16)
    for i in range(T):
        mask[i, :pos[i] + 1] = 0.0
    tokens = np.array([(11 * i + 5) % hp.n_vocab for i in range(T)], dtype=np.int32)
    return {"inp_tokens": tokens, "inp_pos": pos, "k_idxs": cells, "v_idxs": v_idxs, "KQ_mask": mask,
            "inp_out_ids": np.array(hp.out_ids, dtype=np.int32)}


def build_mixed_llama(G, ctx, hp=HP):
    """llm_build_llama in miniature (see tests/graphs.build_llama_block), with mixed weight types."""
    T_ = lambda name: getattr(G, "GGML_TYPE_" + name)  # noqa: E731
    Ft32, Ft16, I32, I64 = T_("F32"), T_("F16"), T_("I32"), T_("I64")
    n_embd, hd, n_head, n_head_kv = hp.n_embd, hp.hd, hp.n_head, hp.n_head_kv
    n_embd_gqa = hd * n_head_kv
    T, kv_size = hp.n_tokens, hp.kv_size

    def named(t, name):
        G.set_name(t, name)
        return t

    tok_embd = named(G.new_tensor_2d(ctx, T_("Q8_0"), n_embd, hp.n_vocab), "token_embd.weight")
    output_norm = named(G.new_tensor_1d(ctx, Ft32, n_embd), "output_norm.weight")
    output = named(G.new_tensor_2d(ctx, Ft32, n_embd, hp.n_vocab), "output.weight")
    layers = []
    for il, types in enumerate(hp.types):
        L = {}
        for key, a, b in (("attn_norm", n_embd, None), ("attn_q", n_embd, n_embd), ("attn_k", n_embd, n_embd_gqa),
                          ("attn_v", n_embd, n_embd_gqa), ("attn_output", n_embd, n_embd), ("ffn_norm", n_embd, None),
                          ("ffn_gate", n_embd, hp.n_ff), ("ffn_down", hp.n_ff, n_embd), ("ffn_up", n_embd, hp.n_ff)):
            t = G.new_tensor_1d(ctx, Ft32, a) if b is None else G.new_tensor_2d(ctx, T_(types[key]), a, b)
            L[key] = named(t, "blk.%d.%s.weight" % (il, key))
        L["k"] = named(G.new_tensor_3d(ctx, Ft16, n_embd_gqa, kv_size, 1), "cache_k_l%d" % il)
        L["v"] = named(G.new_tensor_3d(ctx, Ft16, n_embd_gqa, kv_size, 1), "cache_v_l%d" % il)
        layers.append(L)

    gf = G.new_graph_custom(ctx, 512, False)
    inp_tokens = named(G.new_tensor_1d(ctx, I32, T), "inp_tokens")
    G.set_input(inp_tokens)
    inpL = named(G.get_rows(ctx, tok_embd, inp_tokens), "inp_embd")
    inp_pos = named(G.new_tensor_1d(ctx, I32, T), "inp_pos")
    G.set_input(inp_pos)
    k_idxs = named(G.new_tensor_1d(ctx, I64, T), "k_idxs")
    G.set_input(k_idxs)
    v_idxs = named(G.new_tensor_1d(ctx, I64, T * n_embd_gqa), "v_idxs")
    G.set_input(v_idxs)
    kq_mask = named(G.new_tensor_4d(ctx, Ft16, kv_size, -(-T // 8) * 8, 1, 1), "KQ_mask")
    G.set_input(kq_mask)
    inp_out_ids = named(G.new_tensor_1d(ctx, I32, len(hp.out_ids)), "inp_out_ids")
    G.set_input(inp_out_ids)

    for il, L in enumerate(layers):
        inpSA = inpL
        cur = G.mul(ctx, G.rms_norm(ctx, inpL, hp.eps), L["attn_norm"])
        Qc = G.reshape_3d(ctx, G.mul_mat(ctx, L["attn_q"], cur), hd, n_head, T)
        Kc = G.reshape_3d(ctx, G.mul_mat(ctx, L["attn_k"], cur), hd, n_head_kv, T)
        Vc = G.reshape_3d(ctx, G.mul_mat(ctx, L["attn_v"], cur), hd, n_head_kv, T)
        mode, freq_base = hp.rope[il]
        Qc = G.rope_ext(ctx, Qc, inp_pos, None, hd, mode, 4096, freq_base, 1.0, 0.0, 1.0, 32.0, 1.0)
        Kc = G.rope_ext(ctx, Kc, inp_pos, None, hd, mode, 4096, freq_base, 1.0, 0.0, 1.0, 32.0, 1.0)
        for t in (Qc, Kc, Vc):
            G.build_forward_expand(gf, t)
        k_cur = G.view_2d(ctx, Kc, n_embd_gqa, T, graphs.nb(G, Kc)[2], 0)
        G.build_forward_expand(gf, G.set_rows(ctx, L["k"], k_cur, k_idxs))
        v_cur = G.reshape_2d(ctx, G.view_2d(ctx, Vc, n_embd_gqa, T, graphs.nb(G, Vc)[2], 0), 1, n_embd_gqa * T)
        v_view = G.reshape_2d(ctx, L["v"], 1, n_embd_gqa * kv_size)
        G.build_forward_expand(gf, G.set_rows(ctx, v_view, v_cur, v_idxs))
        k = G.view_4d(ctx, L["k"], hd, n_head_kv, kv_size, 1, G.row_size(Ft16, hd), G.row_size(Ft16, n_embd_gqa),
                      G.row_size(Ft16, n_embd_gqa * kv_size), 0)
        v = G.view_4d(ctx, L["v"], kv_size, n_head_kv, hd, 1, G.row_size(Ft16, kv_size * hd),
                      G.row_size(Ft16, kv_size), G.row_size(Ft16, kv_size * n_embd_gqa), 0)
        qn, qb = graphs.ne(G, Qc), graphs.nb(G, Qc)
        q = G.permute(ctx, G.view_4d(ctx, Qc, qn[0], qn[1], qn[2], 1, qb[1], qb[2], qb[3], 0), 0, 2, 1, 3)
        k = G.permute(ctx, k, 0, 2, 1, 3)
        v = G.permute(ctx, v, 0, 2, 1, 3)
        kq = named(G.mul_mat(ctx, k, q), "kq-%d" % il)
        kq = G.soft_max_ext(ctx, kq, kq_mask, 1.0 / math.sqrt(hd), 0.0)
        kqv = named(G.mul_mat(ctx, v, kq), "kqv-%d" % il)
        cur = G.permute(ctx, kqv, 0, 2, 1, 3)
        cur = G.cont_2d(ctx, cur, graphs.ne(G, cur)[0] * n_head, T)
        cur = G.mul_mat(ctx, L["attn_output"], cur)
        if il == len(layers) - 1:
            cur = G.get_rows(ctx, cur, inp_out_ids)
            inpSA = G.get_rows(ctx, inpSA, inp_out_ids)
        ffn_inp = G.add(ctx, cur, inpSA)
        cur = G.mul(ctx, G.rms_norm(ctx, ffn_inp, hp.eps), L["ffn_norm"])
        up = G.mul_mat(ctx, L["ffn_up"], cur)
        gate = G.mul_mat(ctx, L["ffn_gate"], cur)
        cur = G.swiglu_split(ctx, gate, up)
        cur = G.mul_mat(ctx, L["ffn_down"], cur)
        inpL = G.add(ctx, cur, ffn_inp)

    cur = G.mul(ctx, G.rms_norm(ctx, inpL, hp.eps), output_norm)
    cur = named(G.mul_mat(ctx, output, cur), "result_output")
    G.build_forward_expand(gf, cur)
    return dict(gf=gf, out=cur, inputs=_llama_inputs(hp))


_MM = gg.GGML_OP_MUL_MAT
_SENTINEL = np.float32(-1234.5)     # no RMS_NORM output has this value


def _compute_llama(G, n_threads, raw=None):
    """Build, fill (quantized leaves: ``raw`` bytes when given) and compute; per node (op, name, src types,
    float32 values, raw bytes) and the bytes written into quantized leaves."""
    ctx = G.init(32 << 20)
    try:
        b = build_mixed_llama(G, ctx)
        written = graphs.fill_leaves(G, b["gf"], b["inputs"], seed=3, raw=raw)
        # ggml-cpu fuses each RMS_NORM into the MUL after it (ggml_cpu_try_fuse_ops) and never writes the
        # RMS_NORM's own buffer: what it holds is whatever the allocation held (real ggml: malloc'd memory, zero
        # pages in a fresh process but old heap bytes after earlier tests freed large blocks). A sentinel written
        # into every RMS_NORM output first makes the comparison check that both engines fuse the same nodes.
        for t in graphs.graph_nodes(G, b["gf"]):
            op = G.tensor_info(t)["op"] if graphs.is_oracle(G) else t.op
            if op == G.GGML_OP_RMS_NORM:
                graphs.set_values(G, t, np.full(int(np.prod(graphs.ne(G, t))), _SENTINEL, dtype=np.float32))
        if not graphs.is_oracle(G):
            assert G.graph_plan(b["gf"], n_threads).extra is None      # the faithful kernels
        assert G.graph_compute_with_ctx(ctx, b["gf"], n_threads) == 0
        out = []
        for t in graphs.graph_nodes(G, b["gf"]):
            if graphs.is_oracle(G):
                s = G.tensor_info(t)
                op, name = s["op"], s["name"]
                srcs = []
            else:
                op, name = t.op, t.name
                srcs = [(s.type, s.shape, np.array(graphs.to_float(G, s)), graphs.raw_bytes(G, s))
                        for s in t.src[:2]] if t.op == _MM else []
            out.append((op, name, srcs, np.array(graphs.to_float(G, t)), graphs.raw_bytes(G, t)))
        return out, written
    finally:
        G.free(ctx)


@pytest.fixture(scope="module")
def llama_runs():
    if not available():
        pytest.skip("real ggml oracle: " + unavailable_reason())
    ref, written = _compute_llama(real(), 1)
    runs = {n: _compute_llama(gg, n, raw=written)[0] for n in THREADS}
    return ref, runs


def test_llama_faithful_threads_bitwise(llama_runs):
    _, runs = llama_runs
    one = runs[1]
    assert sum(1 for node in one if node[0] == _MM) == 19     # 2 x (7 weights + KQ + KQV) + output
    for n in THREADS:
        bad = [node[1] for node, other in zip(one, runs[n]) if node[4] != other[4]]
        assert not bad, f"ggviz nodes differ between 1 and {n} threads: {bad}"


def test_llama_faithful_matches_ggml(llama_runs):
    ref, runs = llama_runs
    got = runs[1]
    assert [n[1] for n in got] == [n[1] for n in ref]
    # the RMS_NORMs both engines fused into their MUL (outputs never written: the sentinel is still there), by
    # hand: each layer's attention and FFN norms and the output norm
    fused = [[name for _, name, _, v, _ in run if v.size and np.all(v == _SENTINEL)] for run in (ref, got)]
    assert fused[0] == fused[1] and len(fused[0]) == 2 * len(HP.types) + 1, fused
    bad = []
    for (op, name, _, r, _), (_, _, _, v, _) in zip(ref, got):
        fin = np.isfinite(r)
        assert np.array_equal(fin, np.isfinite(v)), name
        den = float(np.sum(r[fin].astype(np.float64) ** 2))
        e = float(np.sum((v[fin].astype(np.float64) - r[fin]) ** 2)) / den if den else 0.0
        if not e <= 1e-6:
            bad.append((name, e))
    assert not bad, bad


def _oracle_mul_mat(t0, shape0, x_raw, shape1, y):
    """One MUL_MAT in real ggml on contiguous copies of the inputs (a row's values, not its strides, decide the
    dot products)."""
    g = real()
    ctx = g.init(32 << 20)
    try:
        a = g.new_tensor_4d(ctx, t0, *shape0)
        b = g.new_tensor_4d(ctx, F32, *shape1)
        if t0 == F16:
            g.set_array(a, np.frombuffer(x_raw, np.float16))
        elif t0 == F32:
            g.set_array(a, np.frombuffer(x_raw, np.float32))
        else:
            g.set_array(a, np.frombuffer(x_raw, np.uint8))
        g.set_array(b, y)
        c = g.mul_mat(ctx, a, b)
        gf = g.new_graph(ctx)
        g.build_forward_expand(gf, c)
        assert g.graph_compute_with_ctx(ctx, gf, 3) == 0
        return g.to_float(c)
    finally:
        g.free(ctx)


def test_llama_mul_mat_nodes_vs_ggml_on_same_inputs(llama_runs):
    """Every MUL_MAT node of the ggviz graph, recomputed by real ggml from ggviz's own inputs: F32 / F16 src0
    (weights, and the KQ / KQV products on permuted F16 views of the KV cache) bit for bit; quantized src0 within
    float32 summation noise."""
    _, runs = llama_runs
    kinds = set()
    for op, name, srcs, v, _ in runs[1]:
        if op != _MM:
            continue
        (t0, sh0, _, raw0), (t1, sh1, y, _) = srcs
        assert t1 == F32
        r = _oracle_mul_mat(t0, sh0, raw0, sh1, y)
        kinds.add(Q.type_name(t0))
        if t0 in (F32, F16):
            ok = _bits_equal(v, r)
            assert ok.all(), f"{name} ({Q.type_name(t0)}): {int((~ok).sum())} of {ok.size} differ from ggml"
        else:
            scale = np.abs(r).max(axis=-1, keepdims=True)
            assert np.all(np.abs(v - r) <= 4e-6 * scale), (name, float((np.abs(v - r) / scale).max()))
    assert kinds == {"f32", "f16", "q8_0", "q4_0", "q4_1"}
