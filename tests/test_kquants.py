"""Gemma-3's quant kernels (Q8_0, Q5_0, Q4_K, Q6_K; Q4_K repacked to block_q4_Kx8) bit for bit against llama.cpp.

The oracle is the ggml that the installed llama_cpp ships (llama-cpp-python 0.3.36, ggml 0.25.3, the AVX2 build),
run in a child process (tests/oracle/llamacpp_cpu.py). All oracle jobs of this module go through one child.
Covered, each for the faithful NumPy kernels (cpu/quants.py, cpu/repack.py, the faithful MUL_MAT) and the compiled
ones (cpu/fast/kquants.py):

* vec_dot of each type on random rows (with zero / outlier blocks) and on real rows of gemma-3-270m's tensors;
* src1 quantization to Q8_K (quantize_row_q8_K, ggml_quantize_mat_q8_K_4x8), byte for byte;
* the Q4_K -> block_q4_Kx8 repack, byte for byte with what the CPU_REPACK buffer holds;
* MUL_MAT through CPU_REPACK (gemv / gemm, 1..9 src1 rows) with 1, 2, 3 threads;
* MUL_MAT with the weights in ggviz's CPU_REPACK buffer (Q4_K, Q5_0, Q6_K), compiled graph and per node;
* MUL_MAT on plain buffers (vec_dot, llamafile, and tiled.cpp for >= 8 rows) through ggviz's faithful graph
  compute with 1, 2, 3 threads;
* dequantize_row and GET_ROWS (faithful executor and compiled graph).
The Gemma tests skip when data/models/gemma-3-270m-q4_k_m.gguf is absent.
"""
import os

import numpy as np
import pytest

from ggviz import ggml as G
from ggviz.ggml import quants as Q
from ggviz.ggml.consts import (GGML_TYPE_F32, GGML_TYPE_I8, GGML_TYPE_I32, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0,
                               GGML_TYPE_Q8_K)
from ggviz.ggml.cpu import quants as CQ
from ggviz.ggml.cpu import repack as R
from tests.oracle import llamacpp_cpu as O

try:
    from ggviz.ggml.cpu.fast import kquants as K
except ImportError:          # no Numba: only the faithful kernels are checked
    K = None

pytestmark = pytest.mark.skipif(not O.available(), reason="llama_cpp's libggml (the oracle) is not installed")

TYPES = [GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K]
KCODE = {GGML_TYPE_Q8_0: 8, GGML_TYPE_Q5_0: 6, GGML_TYPE_Q4_K: 12, GGML_TYPE_Q6_K: 14}
GEMMA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "models",
                     "gemma-3-270m-q4_k_m.gguf")
N_EL, M_ROWS = 512, 24
NS_REPACK = [1, 2, 3, 4, 5, 8, 9]
NS_PLAIN = [1, 7, 8, 13]


def _rows(seed, m, n):
    r = np.random.default_rng(seed)
    x = (r.standard_normal((m, n)) * r.uniform(0.01, 10, (m, 1))).astype(np.float32)
    x[0, :256] = 0                     # an all-zero super-block
    x[m - 1, 7] = 300.0                # an outlier
    return x


def _quant(t, x):
    return np.ascontiguousarray(Q.quantize_row_ref(t, x).reshape(x.shape[0], -1))


def _gemma_rows():
    """A few real rows of each type from gemma-3-270m (name -> (type, bytes (rows, rb), n))."""
    from ggviz.ggml.gguf import GGUFFile
    g = GGUFFile(GEMMA)
    out = {}
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.1.ffn_down.weight",
                 "blk.0.attn_output.weight", "blk.3.attn_v.weight"):
        ti = g.tensor(name)
        n, rows = int(ti.ne[0]), int(ti.ne[1])
        raw = np.asarray(g.tensor_data(name)).reshape(rows, -1)
        pick = np.random.default_rng(len(name)).choice(rows, 16, replace=False)
        pick.sort()
        out[name] = (int(ti.type), np.ascontiguousarray(raw[pick]), n)
    return out


@pytest.fixture(scope="module")
def oracle():
    """Every oracle job of this module, run in one child process: {key: result}."""
    jobs, keys, data = [], [], {}

    def add(key, **job):
        keys.append(key)
        jobs.append(job)

    for seed in (0, 1):
        for t in TYPES:
            w = _quant(t, _rows(seed, 12, N_EL))
            x = _rows(100 + seed, 5, N_EL)
            y = CQ.from_float(CQ.VEC_DOT_TYPE[t], x)
            data[("vd", seed, t)] = (w, y)
            add(("vd", seed, t), op="vec_dot", type=t, x=w, y=y, n=N_EL)
            add(("ff", seed, t), op="from_float", type=CQ.VEC_DOT_TYPE[t], x=x)
            data[("ff", seed, t)] = x
            add(("tf", seed, t), op="to_float", type=t, x=w, n=w.shape[0] * N_EL)
            data[("tf", seed, t)] = w
    # quantize_mat: random rows, plus a block whose largest magnitude is reached by -M first and then +M
    xm = _rows(7, 4, N_EL)
    xm[2, 300], xm[2, 400] = -500.0, 500.0
    data["qmat"] = xm
    add("qmat", op="quantize_mat_q8_K_4x8", x=xm)
    wk = _quant(GGML_TYPE_Q4_K, _rows(3, M_ROWS, N_EL))
    data["wk"] = wk
    for N in NS_REPACK:
        x = _rows(200 + N, N, N_EL)
        data[("rp", N)] = x
        add(("rp", N), op="mul_mat", type=GGML_TYPE_Q4_K, w=wk, x=x, n_threads=1 + N % 3, repack=True)
    for t in TYPES:
        w = _quant(t, _rows(4, M_ROWS + 16, N_EL))
        for N in NS_PLAIN:
            x = _rows(300 + N, N, N_EL)
            data[("mm", t, N)] = (w, x)
            add(("mm", t, N), op="mul_mat", type=t, w=w, x=x, n_threads=2, repack=False)
    for t in (GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K):
        w = _quant(t, _rows(5, 64, N_EL))
        for N in (1, 5, 9, 33):
            x = _rows(400 + N, N, N_EL)
            data[("cr", t, N)] = (w, x)
            add(("cr", t, N), op="mul_mat", type=t, w=w, x=x, n_threads=3, repack=t == GGML_TYPE_Q4_K)
    if os.path.exists(GEMMA):
        from ggviz.ggml.gguf import GGUFFile
        g = GGUFFile(GEMMA)
        for name in ("blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.1.ffn_down.weight",
                     "blk.0.attn_q.weight", "blk.3.attn_v.weight"):
            ti = g.tensor(name)
            t, n, rows = int(ti.type), int(ti.ne[0]), int(ti.ne[1])
            w = np.ascontiguousarray(np.asarray(g.tensor_data(name)).reshape(rows, -1))
            for N in (1, 9):
                x = _rows(500 + N, N, n)
                data[("gt", name, N)] = (t, w, x)
                add(("gt", name, N), op="mul_mat", type=t, w=w, x=x, n_threads=2, repack=t == GGML_TYPE_Q4_K)
        gr = _gemma_rows()
        for name, (t, raw, n) in gr.items():
            x = _rows(9, 3, n)
            y = CQ.from_float(CQ.VEC_DOT_TYPE[t], x)
            data[("gm", name)] = (t, raw, y, n)
            add(("gm", name), op="vec_dot", type=t, x=raw, y=y, n=n)
    res = O.run(jobs)
    return {k: (r, data.get(k)) for k, r in zip(keys, res)} | {"wk": (None, wk)}


def _compiled_vec_dot(code, n, w, y):
    out = np.zeros((y.shape[0], w.shape[0]), np.float32)
    K.vec_dot_rows(code, n, w.ctypes.data, w.shape[1], w.shape[0], y.ctypes.data, y.shape[1], y.shape[0], out)
    return out


def _ne(a, b):
    return f"{np.sum(a != b)} of {a.size} differ, max |d| {np.max(np.abs(a.astype(np.float64) - b)):.3g}"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("t", TYPES, ids=Q.type_name)
def test_vec_dot_bitwise(oracle, t, seed):
    ref, (w, y) = oracle[("vd", seed, t)]
    got = CQ.vec_dot(t, w, y)
    assert np.array_equal(got, ref), _ne(got, ref)
    if K is not None:
        c = _compiled_vec_dot(KCODE[t], N_EL, w, y)
        assert np.array_equal(c, ref), _ne(c, ref)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("t", TYPES, ids=Q.type_name)
def test_src1_quantization_bitwise(oracle, t, seed):
    ref, x = oracle[("ff", seed, t)]
    vt = CQ.VEC_DOT_TYPE[t]
    assert np.array_equal(CQ.from_float(vt, x), ref)
    if K is not None and vt == GGML_TYPE_Q8_0:
        got = np.zeros_like(ref)
        for i in range(x.shape[0]):
            K.quantize_row_q8_0(x[i].ctypes.data, got[i].ctypes.data, N_EL)
        assert np.array_equal(got, ref)
    if K is not None and vt == GGML_TYPE_Q8_K:
        got = np.zeros_like(ref)
        for i in range(x.shape[0]):
            K.quantize_row_q8_K(x[i].ctypes.data, got[i].ctypes.data, N_EL)
        assert np.array_equal(got, ref)


def test_quantize_mat_q8_K_4x8_bitwise(oracle):
    ref, x = oracle["qmat"]
    assert np.array_equal(R.quantize_mat_q8_K_4x8(x).view(np.uint8), ref)
    # the tie block: the AVX2 code's scale sign differs from quantize_row_q8_K_ref's there
    d_ref = Q.quantize_row_ref(GGML_TYPE_Q8_K, x[2:3]).view(Q.BLOCK_DTYPES[GGML_TYPE_Q8_K])["d"].reshape(-1)[1]
    d_avx = ref.view(R.Q8_KX4_DTYPE)[1]["d"][2]
    assert d_avx == -d_ref and d_avx < 0
    if K is not None:
        got = np.zeros_like(ref)
        K.quantize_mat_q8_K_4x8(x.ctypes.data, 4 * N_EL, got.ctypes.data, N_EL)
        assert np.array_equal(got, ref)


def test_repack_q4_K_layout(oracle):
    res, _ = oracle[("rp", 1)]
    wk = oracle["wk"][1]
    rp = R.repack_q4_K_to_q4_K_8_bl(wk.view(Q.BLOCK_DTYPES[GGML_TYPE_Q4_K]).reshape(M_ROWS, -1))
    assert rp.dtype.itemsize == 8 * 144
    assert np.array_equal(rp.view(np.uint8), res["repacked"])
    with pytest.raises(ValueError, match="multiple of 8"):
        R.repack_q4_K_to_q4_K_8_bl(wk[:12].view(Q.BLOCK_DTYPES[GGML_TYPE_Q4_K]).reshape(12, -1))


@pytest.mark.parametrize("N", NS_REPACK)
def test_repacked_mul_mat_bitwise(oracle, N):
    """gemm for the groups of 4 src1 rows, gemv for the rest; the compiled driver split in column ranges
    (as threads split it) gives the same bits."""
    res, x = oracle[("rp", N)]
    ref = res["out"]
    wk = oracle["wk"][1]
    got = R.mul_mat_q4_K_8x8(wk, x)
    assert np.array_equal(got, ref), _ne(got, ref)
    if K is not None:
        rp = R.repack_q4_K_to_q4_K_8_bl(wk.view(Q.BLOCK_DTYPES[GGML_TYPE_Q4_K]).reshape(M_ROWS, -1))
        wd = np.zeros((N // 4 + 1) * 2 * K.Q8_KX4_SIZE, np.uint8)
        for parts in ([(0, M_ROWS)], [(0, 8), (8, 24)], [(0, 8), (8, 16), (16, 24)]):
            out = np.zeros((N, M_ROWS), np.float32)
            for c0, c1 in parts:
                K.mul_mat_q4_K_8x8(N_EL, rp.ctypes.data, M_ROWS, x.ctypes.data, N, wd.ctypes.data,
                                   out.ctypes.data, c0, c1)
            assert np.array_equal(out, ref), _ne(out, ref)


def _ggviz_mul_mat(t, w, x, n_threads):
    M, (N, n) = w.shape[0], x.shape
    ctx = G.init(16 << 20)
    tw = G.new_tensor_2d(ctx, t, n, M)
    tx = G.new_tensor_2d(ctx, GGML_TYPE_F32, n, N)
    G.set_data(tw, w.reshape(-1))
    G.set_data(tx, x)
    y = G.mul_mat(ctx, tw, tx)
    gf = G.new_graph(ctx)
    G.build_forward_expand(gf, y)
    assert G.graph_compute_with_ctx(ctx, gf, n_threads) == 0
    return np.array(G.get_data_f32(y)).reshape(N, M)


@pytest.mark.parametrize("N", NS_PLAIN)
@pytest.mark.parametrize("t", TYPES, ids=Q.type_name)
def test_plain_mul_mat_bitwise(oracle, t, N):
    """Weights on a plain CPU buffer: vec_dot (and llamafile's tinyBLAS for Q8_0/Q5_0, same arithmetic); from 8
    src1 rows on, Q4_K/Q6_K go through tiled.cpp. ggviz's faithful MUL_MAT with 1, 2, 3 threads."""
    res, (w, x) = oracle[("mm", t, N)]
    ref = res["out"]
    for nth in (1, 2, 3):
        got = _ggviz_mul_mat(t, w, x, nth)
        assert np.array_equal(got, ref), f"{nth} threads: " + _ne(got, ref)
    if K is not None and t in CQ.TILED_TYPES and N >= CQ.TILED_MIN_BATCH:
        y = CQ.from_float(GGML_TYPE_Q8_K, x)
        c = _compiled_vec_dot(KCODE[t] + 100, N_EL, w, y)
        assert np.array_equal(c, ref), _ne(c, ref)


def _placed_mul_mat(t, w, x, nth, route):
    """MUL_MAT with the weight placed in ggviz's CPU_REPACK buffer: ``route`` "graph" (the compiled graph program)
    or "node" (the executor's per-node extra_compute_forward)."""
    from ggviz.ggml.cpu import ggml_cpu
    M, (N, n) = w.shape[0], x.shape
    ctx_w = G.init(G.tensor_overhead() * 2, None, True)
    tw = G.new_tensor_2d(ctx_w, t, n, M)
    store = G.init(w.nbytes + G.tensor_overhead() + 256)
    holder = G.new_tensor_1d(store, GGML_TYPE_I8, w.nbytes)
    G.get_data(holder).reshape(-1).view(np.uint8)[:] = w.reshape(-1)
    tw.data = holder.data
    buf = R.place_weights([tw])
    assert buf is not None and R.tensor_traits_of(tw) is not None
    ctx = G.init(16 << 20)
    tx = G.new_tensor_2d(ctx, GGML_TYPE_F32, n, N)
    G.set_data(tx, x)
    y = G.mul_mat(ctx, tw, tx)
    gf = G.new_graph(ctx)
    G.build_forward_expand(gf, y)
    plan = ggml_cpu.graph_plan(gf, nth)
    if route == "node":
        plan.extra = None
    else:
        assert plan.extra is not None, "the compiled graph does not take this MUL_MAT"
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    assert ggml_cpu.graph_compute(gf, plan) == 0
    out = np.array(G.get_data_f32(y)).reshape(N, M)
    del buf, holder, store, ctx_w
    return out


@pytest.mark.skipif(K is None or not R.available(), reason="no compiled fast path (Numba) / CPU_REPACK disabled")
@pytest.mark.parametrize("N", [1, 5, 9, 33])
@pytest.mark.parametrize("t", [GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q6_K], ids=Q.type_name)
def test_cpu_repack_mul_mat_bitwise(oracle, t, N):
    """Weights in ggviz's CPU_REPACK: Q4_K as block_q4_Kx8 (llama.cpp repacks it too: compared with its CPU_REPACK
    MUL_MAT), Q5_0 expanded to the Q8_0 layout (1-9 columns) or read as ggml's rows by tinyBLAS_Q0's tiles (33) and
    Q6_K as rows (llama.cpp does not repack them: compared with its plain MUL_MAT). Both routes, 1 and 3 threads."""
    res, (w, x) = oracle[("cr", t, N)]
    ref = res["out"]
    for nth in (1, 3):
        for route in ("graph", "node"):
            got = _placed_mul_mat(t, w, x, nth, route)
            assert np.array_equal(got, ref), f"{route}, {nth} threads: " + _ne(got, ref)


@pytest.mark.parametrize("t", TYPES, ids=Q.type_name)
def test_dequantize_row_bitwise(oracle, t):
    ref, w = oracle[("tf", 0, t)]
    assert np.array_equal(Q.dequantize_row(t, w).reshape(-1), ref)
    if K is not None:
        got = np.zeros_like(ref)
        K.dequantize_row(KCODE[t], w.ctypes.data, got.ctypes.data, ref.size)
        assert np.array_equal(got, ref)


@pytest.mark.skipif(K is None, reason="no compiled fast path (Numba)")
@pytest.mark.parametrize("t", TYPES, ids=Q.type_name)
def test_get_rows_compiled_bitwise(oracle, t):
    """GET_ROWS through the compiled graph program (and the faithful executor) == llama.cpp's to_float rows."""
    from ggviz.ggml.cpu import ggml_cpu
    from ggviz.ggml.cpu.fast import compiler
    ref, w = oracle[("tf", 0, t)]
    ref = ref.reshape(w.shape[0], N_EL)
    ids = np.array([3, 0, 11, 3, 7], np.int32)
    outs = []
    for fast in (False, True):
        ctx = G.init(8 << 20)
        tw = G.new_tensor_2d(ctx, t, N_EL, w.shape[0])
        G.set_data(tw, w.reshape(-1))
        ti = G.new_tensor_1d(ctx, GGML_TYPE_I32, ids.size)
        G.set_data(ti, ids)
        y = G.get_rows(ctx, tw, ti)
        gf = G.new_graph(ctx)
        G.build_forward_expand(gf, y)
        plan = ggml_cpu.graph_plan(gf, 2)
        plan.extra = compiler.compile_graph(gf) if fast else None
        assert (plan.extra is not None) == fast
        if plan.work_size:
            plan.work_data = np.zeros(plan.work_size, np.uint8)
        assert ggml_cpu.graph_compute(gf, plan) == 0
        outs.append(np.array(G.get_data_f32(y)).reshape(ids.size, N_EL))
    for o in outs:
        assert np.array_equal(o, ref[ids])


@pytest.mark.skipif(not os.path.exists(GEMMA), reason="gemma-3-270m-q4_k_m.gguf not in data/models (ggviz fetch)")
def test_gemma_rows_bitwise(oracle):
    """Real rows of token_embd (Q8_0), attn_q (Q5_0), ffn_down (Q6_K and Q4_K), attn_output (Q4_K), attn_v (Q8_0)."""
    names = [k[1] for k in oracle if isinstance(k, tuple) and k[0] == "gm"]
    assert len(names) == 6
    seen = set()
    for name in names:
        ref, (t, raw, y, n) = oracle[("gm", name)]
        seen.add(t)
        got = CQ.vec_dot(t, raw, y)
        assert np.array_equal(got, ref), name + ": " + _ne(got, ref)
        if K is not None:
            c = _compiled_vec_dot(KCODE[t], n, raw, y)
            assert np.array_equal(c, ref), name + " (compiled): " + _ne(c, ref)
    assert seen == set(TYPES)


@pytest.mark.skipif(not os.path.exists(GEMMA), reason="gemma-3-270m-q4_k_m.gguf not in data/models (ggviz fetch)")
@pytest.mark.skipif(K is None or not R.available(), reason="no compiled fast path (Numba) / CPU_REPACK disabled")
def test_gemma_tensors_cpu_repack_bitwise(oracle):
    """Whole real tensors (attn_output Q4_K, ffn_down Q6_K and Q4_K, attn_q Q5_0, attn_v Q8_0) in ggviz's CPU_REPACK
    through the compiled graph, 1 and 9 src1 rows, == llama.cpp's MUL_MAT with its default buffer placement."""
    keys = [k for k in oracle if isinstance(k, tuple) and k[0] == "gt"]
    assert len(keys) == 10
    for key in keys:
        res, (t, w, x) = oracle[key]
        got = _placed_mul_mat(t, w, x, 2, "graph")
        assert np.array_equal(got, res["out"]), f"{key[1]} x {key[2]}: " + _ne(got, res["out"])
