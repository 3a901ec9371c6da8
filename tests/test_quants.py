"""Differential tests of ggviz.ggml.quants and ggviz.ggml.cpu.quants against the real ggml.

* block structs: itemsize == ggml_type_size for every type;
* fp16/bf16 conversions: bit-exact (all 65536 halves, random float bit patterns);
* quantize_row_ref / quantize_chunk: bit-exact vs ggml_quantize_chunk, with and without
  an importance matrix, on data with outliers, all-zero / constant blocks, tiny and
  huge magnitudes, and NaN/inf;
* dequantize_row: bit-exact vs type_traits[t].to_float, also on random block bytes;
* CPU from_float: bit-exact vs type_traits_cpu[t].from_float of the AVX2 build;
* CPU vec_dot: within float32 summation noise of type_traits_cpu[t].vec_dot for every
  (type, vec_dot_type) pair.
"""
import time
import warnings

import numpy as np
import pytest


from ggviz.ggml import quants as Q
from ggviz.ggml.consts import TYPE_TRAITS
from ggviz.ggml.consts import (
    GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_IQ2_XS, GGML_TYPE_Q2_K,
    GGML_TYPE_Q3_K, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0,
    GGML_TYPE_Q5_1, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_Q8_1,
    GGML_TYPE_Q8_K,
)
from ggviz.ggml.cpu import quants as C
from tests.oracle import quant_lib as L

needs_oracle = pytest.mark.skipif(not L.available(), reason="libggml (oracle) not available")

WEIGHT_TYPES = [GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K]
CHUNK_TYPES = WEIGHT_TYPES + [GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_F32]
DOT_SRC0_TYPES = WEIGHT_TYPES + [GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16]
VEC_DOT_TYPES = [GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q8_1,
                 GGML_TYPE_Q8_K]
ALL_TYPES = sorted(Q.BLOCK_DTYPES)
N = 512  # two q*_K super-blocks, sixteen 32-blocks per row


def tname(t):
    return Q.type_name(t)


@pytest.fixture(autouse=True)
def _quiet():
    # inf/NaN test data makes NumPy warn; the C code just computes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def make_data(seed: int, rows: int = 8, n: int = N, special: bool = False) -> np.ndarray:
    """Rows exercising the corner cases of the quantisers."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((rows, n)).astype(np.float32)
    x[0, :256] = 0  # all-zero blocks and super-block
    x[1, r.integers(0, n, 3)] *= 60  # outliers
    x[1, 7] = -90
    x[2] = r.uniform(0, 1, n)  # all positive (min clamps to 0 in the K-quants)
    x[3] = -np.abs(x[3]) - 0.1  # all negative
    x[4, :256] *= np.float32(1e-20)  # tiny magnitudes (products underflow)
    x[4, 256:] = 0.5  # constant blocks (max == min)
    x[5] = r.standard_t(2, n)  # heavy tails
    x[6] = r.integers(-4, 5, n) * (r.uniform(0, 1, n) < 0.3)  # sparse small integers
    x[7] = np.repeat(r.standard_normal(n // 16), 16) * 3
    if special:
        x[0, 300] = np.nan
        x[2, 40] = np.inf
        x[3, 400] = -np.inf
        x[5] *= np.float32(1e17)  # x^3 overflows float32 in the weighted sums
        x[6, :256] *= np.float32(1e-30)
    return x.astype(np.float32)


def bits_equal_or_both_nan(a: np.ndarray, b: np.ndarray) -> bool:
    """float32 arrays equal bit for bit, NaNs allowed to differ in payload only."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    same = a.view(np.uint32) == b.view(np.uint32)
    return bool(np.all(same | (np.isnan(a) & np.isnan(b))))


# --------------------------------------------------------------------------------
# structs and tables
# --------------------------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("t", ALL_TYPES, ids=tname)
def test_block_dtype_size(t):
    dt = Q.BLOCK_DTYPES[t]
    assert dt.itemsize == L.type_size(t) == TYPE_TRAITS[t][2]
    assert Q.row_size(t, 1024) == L.row_size(t, 1024)


def test_block_dtype_field_names():
    # ggml's own field names, in struct order
    assert Q.BLOCK_DTYPES[GGML_TYPE_Q4_1].names == ("d", "m", "qs")
    assert Q.BLOCK_DTYPES[GGML_TYPE_Q5_1].names == ("d", "m", "qh", "qs")
    assert Q.BLOCK_DTYPES[GGML_TYPE_Q8_1].names == ("d", "s", "qs")
    assert Q.BLOCK_DTYPES[GGML_TYPE_Q2_K].names == ("scales", "qs", "d", "dmin")
    assert Q.BLOCK_DTYPES[GGML_TYPE_Q3_K].names == ("hmask", "qs", "scales", "d")
    assert Q.BLOCK_DTYPES[GGML_TYPE_Q5_K].names == ("d", "dmin", "scales", "qh", "qs")
    assert Q.BLOCK_DTYPES[GGML_TYPE_Q6_K].names == ("ql", "qh", "scales", "d")
    assert Q.BLOCK_DTYPES[GGML_TYPE_Q8_K].names == ("d", "qs", "bsums")


@needs_oracle
def test_cpu_type_traits_table():
    for t, tr in TYPE_TRAITS.items():
        if tr is None:
            continue
        lib = L.traits_cpu(t)
        assert C.VEC_DOT_TYPE[t] == lib["vec_dot_type"], tr[0]
        assert (t in C.HAS_VEC_DOT) == bool(lib["vec_dot"]), tr[0]
        assert (t in C.HAS_FROM_FLOAT) == bool(lib["from_float"]), tr[0]
        assert C.NROWS[t] == lib["nrows"], tr[0]


def test_unsupported_types_raise():
    with pytest.raises(NotImplementedError, match="iq2_xs"):
        Q.dequantize_row(GGML_TYPE_IQ2_XS, np.zeros(74, np.uint8))
    with pytest.raises(NotImplementedError, match="iq2_xs"):
        Q.quantize_row_ref(GGML_TYPE_IQ2_XS, np.zeros(256, np.float32))
    with pytest.raises(NotImplementedError, match="iq2_xs"):
        C.vec_dot(GGML_TYPE_IQ2_XS, np.zeros((1, 74), np.uint8), np.zeros((1, 292), np.uint8))


# --------------------------------------------------------------------------------
# fp16 / bf16
# --------------------------------------------------------------------------------


def _float_bit_patterns():
    r = np.random.default_rng(123)
    u = r.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC12345,
                         0x477FE000, 0x477FF000, 0x477FEFFF, 0x38800000, 0x33800000, 0x33000000,
                         0x33000001, 0x00000001, 0x3F808000, 0x3F818000, 0x3F817FFF], np.uint32)
    # values half-way between neighbouring halves and bf16s (ties to even)
    halves = np.arange(0, 0x7C00, 7, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    ties16 = (halves.view(np.uint32) + np.uint32(1 << 12)).astype(np.uint32)
    ties_bf = (u & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    return np.concatenate([u, specials, ties16, ties_bf]).view(np.float32)


@needs_oracle
def test_fp16_to_fp32_all_halves():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ref = L.fp16_to_fp32_row(h)
    assert np.array_equal(ref.view(np.uint32), Q.fp16_to_fp32(h).view(np.uint32))
    assert np.array_equal(ref.view(np.uint32), Q.dequantize_row(GGML_TYPE_F16, h.view(np.uint8)).view(np.uint32))


@needs_oracle
def test_fp32_to_fp16_and_bf16():
    x = _float_bit_patterns()
    assert np.array_equal(L.fp32_to_fp16_row(x), Q.fp32_to_fp16(x))
    assert np.array_equal(L.fp32_to_bf16_row_ref(x), Q.fp32_to_bf16(x))
    assert np.array_equal(L.fp32_to_bf16_row(x), Q.fp32_to_bf16(x))
    b = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(L.bf16_to_fp32_row(b).view(np.uint32), Q.bf16_to_fp32(b).view(np.uint32))


@needs_oracle
def test_cpu_fp32_to_fp16_nan_payloads():
    # F16C keeps NaN payloads (quietened); ggml-base does not
    x = _float_bit_patterns()[:4096 * 8].reshape(8, 4096)
    assert np.array_equal(L.from_float_cpu(GGML_TYPE_F16, x).view(np.uint16), C.cpu_fp32_to_fp16(x))


# --------------------------------------------------------------------------------
# quantisation
# --------------------------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("t", CHUNK_TYPES, ids=tname)
def test_quantize_ref_bit_exact(t, seed):
    x = make_data(seed)
    nbytes, ref = L.quantize_chunk(t, x, 0, x.shape[0], N)
    got = Q.quantize_row_ref(t, x)
    assert got.shape == (x.shape[0], Q.row_size(t, N))
    assert np.array_equal(ref, got.reshape(-1)), f"{np.sum(ref != got.reshape(-1))} bytes differ"
    n2, got2 = Q.quantize_chunk(t, x, 0, x.shape[0], N)
    assert n2 == nbytes and np.array_equal(got2, ref)


@needs_oracle
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("t", [GGML_TYPE_Q8_1, GGML_TYPE_Q8_K], ids=tname)
def test_quantize_ref_activation_types(t, special):
    # q8_1 / q8_K have no ggml_quantize_chunk case; call their exported _ref directly
    x = make_data(9, special=special)
    ref = L.quantize_row_ref_c(t, tname(t), x)
    assert np.array_equal(ref, Q.quantize_row_ref(t, x).reshape(-1))


@needs_oracle
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=tname)
def test_quantize_ref_special_values(t):
    x = make_data(7, special=True)
    _, ref = L.quantize_chunk(t, x, 0, x.shape[0], N)
    assert np.array_equal(ref, Q.quantize_row_ref(t, x).reshape(-1))


@needs_oracle
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=tname)
def test_quantize_imatrix_bit_exact(t, seed):
    x = make_data(seed + 10)
    imatrix = np.random.default_rng(seed).uniform(0.0, 3.0, N).astype(np.float32)
    imatrix[:5] = 0
    _, ref = L.quantize_chunk(t, x, 0, x.shape[0], N, imatrix)
    n, got = Q.quantize_chunk(t, x, 0, x.shape[0], N, imatrix)
    assert n == ref.size and np.array_equal(ref, got), f"{np.sum(ref != got)} bytes differ"


@needs_oracle
@pytest.mark.parametrize("t", [GGML_TYPE_Q4_1, GGML_TYPE_Q5_K, GGML_TYPE_F16], ids=tname)
def test_quantize_chunk_offset_into_dst(t):
    x = make_data(3)
    rows = x.shape[0]
    rs = Q.row_size(t, N)
    ref_dst = np.full(rows * rs, 0xAB, np.uint8)
    mine_dst = ref_dst.copy()
    ref_n, _ = L.quantize_chunk(t, x, 3 * N, 4, N, dst=ref_dst)
    my_n, out = Q.quantize_chunk(t, x, 3 * N, 4, N, dst=mine_dst)
    assert out is mine_dst and my_n == ref_n == 4 * rs
    assert np.array_equal(ref_dst, mine_dst)


def test_memmap_inputs(tmp_path):
    x = make_data(4)
    mm = np.memmap(tmp_path / "x.f32", dtype=np.float32, mode="w+", shape=x.shape)
    mm[:] = x
    q = Q.quantize_row_ref(GGML_TYPE_Q4_K, mm)
    assert type(q) is np.ndarray and np.array_equal(q, Q.quantize_row_ref(GGML_TYPE_Q4_K, x))
    qm = np.memmap(tmp_path / "q.bin", dtype=np.uint8, mode="w+", shape=q.shape)
    qm[:] = q
    y = Q.dequantize_row(GGML_TYPE_Q4_K, qm)
    assert type(y) is np.ndarray and y.dtype == np.float32
    assert np.array_equal(y, Q.dequantize_row(GGML_TYPE_Q4_K, q))


# --------------------------------------------------------------------------------
# dequantisation
# --------------------------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("t", ALL_TYPES, ids=tname)
def test_dequantize_bit_exact(t):
    x = make_data(5)
    raw = Q.quantize_row_ref(t, x)
    got = Q.dequantize_row(t, raw)
    assert got.dtype == np.float32 and got.shape == x.shape
    if t == GGML_TYPE_Q8_1:  # ggml has no dequantize_row_q8_1; the obvious q*d
        blocks = raw.view(Q.BLOCK_DTYPES[t])
        want = blocks["qs"].astype(np.float32) * Q.fp16_to_fp32(blocks["d"].view(np.uint16))[..., None]
        assert np.array_equal(got, want.reshape(x.shape))
        return

    def ref_to_float(raw, n):
        if t == GGML_TYPE_Q8_K:  # not in type_traits, but exported
            return L.dequantize_row_c("q8_K", raw, n)
        if t == GGML_TYPE_F32:  # to_float is NULL: the bytes are the floats
            return np.ascontiguousarray(raw).view(np.float32).reshape(-1)
        return L.to_float(t, raw, n)

    ref = ref_to_float(raw, x.size).reshape(x.shape)
    assert np.array_equal(ref.view(np.uint32), got.view(np.uint32))
    # arbitrary bytes: every bit pattern of scales and quants (NaN/inf scales included)
    rnd = np.random.default_rng(t).integers(0, 256, (4, Q.row_size(t, N)), dtype=np.uint8)
    assert bits_equal_or_both_nan(ref_to_float(rnd, 4 * N).reshape(4, N), Q.dequantize_row(t, rnd))


@pytest.mark.parametrize("t", [t for t in ALL_TYPES if Q.blck_size(t) > 1], ids=tname)
def test_decode_block(t):
    x = make_data(6)[1:2, : Q.blck_size(t) * 2]
    raw = Q.quantize_row_ref(t, x)[0]
    ts = Q.type_size(t)
    info = Q.decode_block(t, raw[ts:2 * ts])
    deq = Q.dequantize_row(t, raw)[Q.blck_size(t):]
    assert np.array_equal(info["values"], deq)
    for name in Q.BLOCK_DTYPES[t].names:
        assert name in info
    assert isinstance(info["d"], float)
    b = raw[ts:2 * ts].view(Q.BLOCK_DTYPES[t])[0]
    if "sub_d" in info:  # the K-quants' values are sub_d * level (- sub_m)
        k = Q.blck_size(t) // len(info["sub_d"])
        lev = info["quants"].reshape(-1, k).astype(np.float32)
        v = info["sub_d"][:, None] * lev
        if "sub_m" in info:
            v = v - info["sub_m"][:, None]
        assert np.array_equal(v.reshape(-1), info["values"])
    else:
        assert np.array_equal(info["qs"], b["qs"])


# --------------------------------------------------------------------------------
# CPU backend: from_float and vec_dot
# --------------------------------------------------------------------------------


@needs_oracle
@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("t", VEC_DOT_TYPES + WEIGHT_TYPES, ids=tname)
def test_cpu_from_float_bit_exact(t, special):
    x = make_data(8, special=special)
    x[1, :32] = np.arange(32, dtype=np.float32) * np.float32(0.5) - 8  # .5 ties: rint vs roundf
    ref = L.from_float_cpu(t, x)
    got = C.from_float(t, x)
    assert np.array_equal(ref, got), f"{np.sum(ref != got)} bytes differ"


@needs_oracle
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("t", DOT_SRC0_TYPES, ids=tname)
def test_cpu_vec_dot(t, seed):
    vt = C.VEC_DOT_TYPE[t]
    r = np.random.default_rng(seed)
    w = make_data(seed)[[0, 1, 3, 5, 7, 4]]  # 6 weight rows incl. zero / outlier / tiny blocks
    a = (r.standard_normal((4, N)) * r.uniform(0.1, 10, (4, 1))).astype(np.float32)
    a[0, :256] = 0
    wq = L.quantize_chunk(t, w, 0, w.shape[0], N)[1].reshape(w.shape[0], -1)
    aq = L.from_float_cpu(vt, a)
    ref = L.vec_dot_cpu(t, wq, aq, N)
    got = C.vec_dot(t, wq, aq)
    assert got.shape == (4, 6) and got.dtype == np.float32
    # float32 summation-order noise only: relative 1e-5 of the row's magnitude
    scale = np.abs(ref).max(axis=1, keepdims=True) + np.float32(1e-30)
    assert np.all(np.abs(got - ref) <= 1e-5 * (np.abs(ref) + scale)), np.abs(got - ref).max()
    # a prepared src0 gives the same numbers
    assert np.array_equal(C.vec_dot(t, C.prepare(t, wq), aq), got)


def test_cpu_vec_dot_typed_inputs():
    r = np.random.default_rng(0)
    a = r.standard_normal((3, 64)).astype(np.float32)
    b = r.standard_normal((2, 64)).astype(np.float32)
    f32 = C.vec_dot(GGML_TYPE_F32, a, b)
    assert np.allclose(f32, b @ a.T, rtol=1e-6)
    f16 = C.vec_dot(GGML_TYPE_F16, a.astype(np.float16), b.astype(np.float16))
    assert np.allclose(f16, b.astype(np.float16).astype(np.float32) @ a.astype(np.float16).astype(np.float32).T)
    bf = C.vec_dot(GGML_TYPE_BF16, Q.fp32_to_bf16(a), C.from_float(GGML_TYPE_BF16, b))
    assert np.allclose(bf, Q.bf16_to_fp32(Q.fp32_to_bf16(b)) @ Q.bf16_to_fp32(Q.fp32_to_bf16(a)).T, rtol=1e-6)


def test_cpu_vec_dot_speed():
    # llama-sized: a 1536 x 576 q4_1 matrix (SmolLM2 FFN) times 1 and 128 columns
    r = np.random.default_rng(0)
    w = Q.quantize_row_ref(GGML_TYPE_Q4_1, r.standard_normal((1536, 576)).astype(np.float32))
    y = C.from_float(GGML_TYPE_Q8_1, r.standard_normal((128, 576)).astype(np.float32))
    C.vec_dot(GGML_TYPE_Q4_1, w, y[:1])
    t0 = time.perf_counter()
    out = C.vec_dot(GGML_TYPE_Q4_1, w, y)
    dt = time.perf_counter() - t0
    assert out.shape == (128, 1536)
    assert dt < 2.0, f"vec_dot took {dt:.2f} s"
    # and it is the product of the dequantised rows, up to the fp16 rounding of q8_1's s
    ref = Q.dequantize_row(GGML_TYPE_Q8_1, y[:2]) @ Q.dequantize_row(GGML_TYPE_Q4_1, w).T
    assert np.abs(out[:2] - ref).max() < 1e-2 * np.abs(ref).max()


@pytest.mark.parametrize("t", WEIGHT_TYPES + [GGML_TYPE_BF16], ids=tname)
def test_agrees_with_gguf_py_dequantize(t):
    # gguf-py's NumPy dequantisers agree bit for bit on ordinary data (it has no
    # K-quant quantisers, hence ggviz's own)
    gguf = pytest.importorskip("gguf")
    raw = Q.quantize_row_ref(t, make_data(11))
    g = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t)).astype(np.float32)
    assert np.array_equal(g.view(np.uint32), Q.dequantize_row(t, raw).view(np.uint32))



def _numpy_and_compiled(t, w, y, monkeypatch, exact=False):
    """C.vec_dot(t) of raw rows by the compiled kernel (fast/blockdot.py) and by the NumPy one."""
    fast = C.vec_dot(t, w, y, exact=exact)
    with monkeypatch.context() as m:
        m.setattr(C, "_blockdot", None)
        ref = C.vec_dot(t, w, y, exact=exact)
    return fast, ref


def _same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_compiled_q4_1_q8_0_vec_dot_is_the_numpy_bits(monkeypatch):
    """The faithful MUL_MAT's Q4_1 . Q8_1 and Q8_0 . Q8_0 vec_dots run compiled where Numba is there: they must be
    the NumPy kernels' float32 arithmetic bit for bit (Q4_1 in block order and, ``exact`` as PowerInfer's sparse
    kernels ask, in the AVX2 lane order; Q8_0 in the AVX2 lane order), on the
    default model's real weight rows (layer 0's ffn_up, ffn_down's 48 blocks a row, token_embd (Q8_0, the output
    matrix), read through a row stride as MUL_MAT reads them) and on random blocks with the edge values (fp16
    inf / NaN / subnormal / 65504 scales, nibbles 0 and 15, q8 -128 and 127)."""
    if C._blockdot is None:
        pytest.skip("no compiled kernels (Numba missing or GGVIZ_NO_NUMBA=1)")
    from ggviz.ggml.gguf import load_gguf
    from tests.conftest import MODEL
    path = MODEL
    if not path.exists():
        from ggviz.fetch import fetch_default_model
        path = fetch_default_model(quiet=True)
    gf = load_gguf(path)
    r = np.random.default_rng(5)
    checked = 0
    for name, t in (("blk.0.ffn_up.weight", GGML_TYPE_Q4_1), ("blk.0.ffn_down.weight", GGML_TYPE_Q4_1),
                    ("token_embd.weight", GGML_TYPE_Q8_0)):
        info = gf.tensor(name)
        assert info.type == t
        rows = gf.tensor_data(name).reshape(info.ne[1], -1)
        w = rows[::7][:40]                                      # a strided view: row stride 7 rows' bytes
        y = C.from_float(C.VEC_DOT_TYPE[t], (r.standard_normal((5, info.ne[0])) * 3).astype(np.float32))
        for exact in (False, True) if t == GGML_TYPE_Q4_1 else (False,):
            fast, ref = _numpy_and_compiled(t, w, y, monkeypatch, exact)
            assert ref.shape == (5, 40) and np.isfinite(ref).all()
            assert _same_bits(fast, ref)
            checked += fast.size
    # random blocks, then edge values written into the scales and levels
    M, Nc, nb = 24, 6, 9
    edge = np.array([np.inf, -np.inf, np.nan, 65504.0, -65504.0, 6e-8, -6e-8, 0.0, -0.0, 1e-4], np.float16)
    for t, (xb, yb, qo) in ((GGML_TYPE_Q4_1, (20, 36, 4)), (GGML_TYPE_Q8_0, (34, 34, 2))):
        w = r.integers(0, 256, (M, nb * xb), dtype=np.uint8)
        y = r.integers(0, 256, (Nc, nb * yb), dtype=np.uint8)
        wb, ybk = w.reshape(M, nb, xb), y.reshape(Nc, nb, yb)
        half = (r.standard_normal((M + Nc, nb, qo // 2)) * 0.05).astype(np.float16)
        wb[:, :, :qo] = half[:M].view(np.uint8).reshape(M, nb, qo)
        ybk[:, :, :qo] = half[M:].view(np.uint8).reshape(Nc, nb, qo)
        for i, v in enumerate(edge):
            wb[i, i % nb, :2] = np.array([v]).view(np.uint8)                    # d
            wb[i + 10, (i + 3) % nb, qo - 2:qo] = np.array([v]).view(np.uint8)  # m (Q4_1), d (Q8_0)
        ybk[0, 1, :2] = np.array([np.float16(65504.0)]).view(np.uint8)
        ybk[1, 2, qo - 2:qo] = np.array([np.float16(np.inf)]).view(np.uint8)
        ybk[2, 0, :2] = np.array([np.float16(6e-8)]).view(np.uint8)
        wb[20, :, qo:] = 0xFF                                   # all nibbles 15 (Q4_1), -1 (Q8_0)
        wb[21, :, qo:] = 0x00
        wb[22, :, qo:] = 0x80                                   # -128 (Q8_0)
        ybk[3, :, qo:] = np.uint8(0x80)                         # q8 -128
        ybk[4, :, qo:] = np.uint8(0x7F)                         # q8 127
        for exact in (False, True) if t == GGML_TYPE_Q4_1 else (False,):
            fast, ref = _numpy_and_compiled(t, w, y, monkeypatch, exact)
            assert np.isnan(ref).any() and np.isinf(ref).any()      # the edge values reached the results
            assert _same_bits(fast, ref)
            checked += fast.size
    assert checked == 5 * 5 * 40 + 3 * Nc * M
