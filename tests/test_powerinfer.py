"""PowerInfer's sparse FFN ops (ggviz/ggml/cpu/powerinfer.py, ops.mul_mat_idx / mul_mat_idx_upscale / axpy).

Oracles: ggviz's own MUL_MAT (itself checked against the real ggml in test_oracle / test_fast_path) for
MUL_MAT_SPARSE, bit for bit on the kept rows; a float64 sum of the kept rows for AXPY; the algebra of the hybrid
split (CPU half + GPU half = everything on the CPU).
"""
from __future__ import annotations

import numpy as np
import pytest

from ggviz import ggml
from ggviz.ggml import consts as C
from ggviz.ggml import quants as Q
from ggviz.ggml.cpu import ggml_cpu, mul_mat, powerinfer

F32, F16, I32, Q4_1 = C.GGML_TYPE_F32, C.GGML_TYPE_F16, C.GGML_TYPE_I32, C.GGML_TYPE_Q4_1


@pytest.fixture(autouse=True)
def _threshold():
    old = powerinfer.set_sparse_pred_threshold(0.0)
    yield
    powerinfer.set_sparse_pred_threshold(old)


def _compute(nodes, nth):
    gf = ggml.new_graph(_CTX[-1])
    for n in nodes:
        ggml.build_forward_expand(gf, n)
    plan = ggml_cpu.graph_plan(gf, nth)
    assert plan.extra is None          # no compiled program covers these ops: the node-by-node walk runs them
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS
    return [np.array(ggml.get_data(n), copy=True) for n in nodes]


_CTX: list = []


def _ctx():
    ctx = ggml.init(96 << 20)
    _CTX.append(ctx)
    del _CTX[:-4]
    return ctx


def _tensor(ctx, type_, arr):
    arr = np.asarray(arr)
    if type_ in (Q4_1, C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q8_0):
        rows, k = arr.shape
        t = ggml.new_tensor_2d(ctx, type_, k, rows)
        raw = np.asarray(Q.quantize_row_ref(type_, arr.astype(np.float32))).reshape(-1).view(np.uint8)
        ggml.get_data(t).reshape(-1).view(np.uint8)[:] = raw
        return t
    ne = list(arr.shape[::-1])
    t = ggml.new_tensor(ctx, type_, len(ne), ne)
    ggml.get_data(t).reshape(-1)[:] = arr.reshape(-1)
    return t


def _case(rng, M=1536, K=576, T=3, p_gpu=0.2):
    W = (rng.standard_normal((M, K)) * 0.05).astype(np.float32)
    X = rng.standard_normal((T, K)).astype(np.float32)
    I = rng.standard_normal((T, M)).astype(np.float32)
    G = (rng.random(M) < p_gpu).astype(np.int32)
    return W, X, I, G


@pytest.mark.parametrize("wtype", [Q4_1, F16])
@pytest.mark.parametrize("T", [1, 4])
def test_mul_mat_sparse_equals_mul_mat_on_kept_rows(wtype, T, monkeypatch):
    # PowerInfer's ggml (Dec 2023) predates llamafile's sgemm: its dense MUL_MAT of several columns runs the vec_dot
    # chunks MUL_MAT_SPARSE mirrors. ggml-cpu's default build since hands F16 x F32 of 2+ columns to tinyBLAS
    # (another float order), so the dense reference here is the build without GGML_USE_LLAMAFILE.
    monkeypatch.setattr(mul_mat, "USE_LLAMAFILE", False)
    rng = np.random.default_rng(T)
    W, X, I, G = _case(rng, T=T)
    I[0, :7] = 0.0                                  # exactly at the threshold: kept (the rule is idx < threshold)
    results = []
    for nth in (1, 2, 3, 4):
        ctx = _ctx()
        w = _tensor(ctx, wtype, W.astype(np.float16) if wtype == F16 else W)
        x, idx, g = _tensor(ctx, F32, X), _tensor(ctx, F32, I), _tensor(ctx, I32, G)
        ys = ggml.mul_mat_idx(ctx, w, x, idx, g)
        yd = ggml.mul_mat(ctx, w, x)
        assert ggml.op_name(ys.op) == "MUL_MAT_SPARSE" and ys.op == C.GGML_OP_COUNT
        S, D = (a.reshape(T, -1) for a in _compute([ys, yd], nth))
        keep = (G[None] != 1) & ~(I < 0)
        assert 0.3 < keep.mean() < 0.5
        _assert_dense_bits(S, D, keep, w, X, nth)
        assert np.all(S[~keep] == 0) and not np.signbit(S[~keep]).any()
        results.append(S)
    for r in results[1:]:
        assert np.array_equal(r, results[0])


def test_mul_mat_sparse_threshold_global_and_no_gpu_idx():
    rng = np.random.default_rng(5)
    W, X, I, _ = _case(rng, M=512, T=2)
    for thr in (-1.0, 0.5, -np.inf):
        powerinfer.set_sparse_pred_threshold(thr)
        ctx = _ctx()
        w, x, idx = _tensor(ctx, Q4_1, W), _tensor(ctx, F32, X), _tensor(ctx, F32, I)
        ys = ggml.mul_mat_idx(ctx, w, x, idx, None)
        assert ggml.get_op_params_i32(ys, 0) == 1          # PowerInfer's op_params[0] = gpu_idx ? 0 : 1
        S, D = (a.reshape(2, -1) for a in _compute([ys, ggml.mul_mat(ctx, w, x)], 2))
        keep = ~(I < thr)
        _assert_dense_bits(S, D, keep, w, X, thr)
        assert np.all(S[~keep] == 0)
        assert keep.all() == (thr == -np.inf)


def _assert_dense_bits(S, D, keep, w, X, what):
    """Kept rows of MUL_MAT_SPARSE have dense MUL_MAT's bits. F16: ggviz's MUL_MAT (vec_dot_f16, bit-identical to
    ggml). Q4_0 / Q4_1: MUL_MAT_SPARSE follows the AVX2 kernel lane for lane (quants.vec_dot(exact=True), as ggviz's
    repacked dense MUL_MAT does); ggviz's MUL_MAT on plain Q4 rows keeps another float order (a few ulps: quants.py),
    so the bits are checked against the real ggml where libggml-python is there, and the plain MUL_MAT to 1e-6."""
    if w.type == F16:
        assert np.array_equal(S[keep], D[keep]), what
        return
    assert np.abs(S[keep] - D[keep]).max() <= 1e-6 * np.abs(D[keep]).max(), what
    g = _oracle()
    if g is None:
        return
    raw = np.asarray(ggml.get_data(w)).reshape(-1).view(np.uint8)
    ctx = g.init(64 << 20)
    try:
        wr = g.new_tensor_2d(ctx, w.type, int(w.ne[0]), int(w.ne[1]))
        g.set_array(wr, raw)
        xr = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, X.shape[1], X.shape[0])
        g.set_array(xr, X)
        y = g.mul_mat(ctx, wr, xr)
        gf = g.new_graph(ctx)
        g.build_forward_expand(gf, y)
        g.graph_compute(gf, 1)
        real = g.to_float(y).reshape(X.shape[0], -1).copy()
    finally:
        g.free(ctx)
    assert np.array_equal(S[keep], real[keep]), what


def _axpy_ref(Wt16, X, I, G, thr):
    """float64 sum of the kept rows: x rounded to F16 as the kernel does, skip x == 0 / on GPU / idx < thr."""
    xh = X.astype(np.float16).astype(np.float64)
    keep = (xh != 0) & (G[None] == 0) & ~(I < thr)
    return (np.where(keep, xh, 0.0) @ Wt16.astype(np.float64)), keep


@pytest.mark.parametrize("T", [1, 3])
def test_axpy_sum_of_kept_rows(T):
    rng = np.random.default_rng(10 + T)
    M, K = 1536, 576
    Wt = (rng.standard_normal((M, K)) * 0.05).astype(np.float16)       # down_t: one row per neuron
    X = np.maximum(rng.standard_normal((T, M)), 0).astype(np.float32)  # ReLU-like: many exact zeros
    I = rng.standard_normal((T, M)).astype(np.float32)
    G = (rng.random(M) < 0.25).astype(np.int32)
    ref, keep = _axpy_ref(Wt, X, I, G, 0.0)
    assert 0.1 < keep.mean() < 0.3
    for nth in (1, 2, 3, 4):
        outs = []
        for _ in range(2):
            ctx = _ctx()
            a, b, idx, g = _tensor(ctx, F16, Wt), _tensor(ctx, F32, X), _tensor(ctx, F32, I), _tensor(ctx, I32, G)
            y = ggml.axpy(ctx, a, b, idx, g)
            assert ggml.op_name(y.op) == "AXPY" and list(y.shape) == [K, T, 1, 1]
            outs.append(_compute([y], nth)[0].reshape(T, K))
        assert np.array_equal(outs[0], outs[1])        # ith-order reduction: no race, same bits every run
        err = np.abs(outs[0] - ref).max() / np.abs(ref).max()
        assert err <= 1e-6, (nth, err)


def test_hybrid_halves_add_up_to_the_all_cpu_result():
    """CPU half (gpu_idx) + GPU half (hot rows, gpu_bucket) == the whole computed on the CPU."""
    rng = np.random.default_rng(3)
    M, K, T = 1536, 576, 2
    W, X, I, G = _case(rng, M=M, K=K, T=T, p_gpu=0.3)
    bucket = np.flatnonzero(G == 1).astype(np.int32)
    Wt = (rng.standard_normal((M, K)) * 0.05).astype(np.float16)
    H = np.maximum(rng.standard_normal((T, M)), 0).astype(np.float32)
    ctx = _ctx()
    w, w_hot = _tensor(ctx, Q4_1, W), _tensor(ctx, Q4_1, W[bucket])
    x, idx, g, gb = _tensor(ctx, F32, X), _tensor(ctx, F32, I), _tensor(ctx, I32, G), _tensor(ctx, I32, bucket)
    g0 = _tensor(ctx, I32, np.zeros(M, np.int32))
    cpu = ggml.mul_mat_idx(ctx, w, x, idx, g)
    gpu = ggml.mul_mat_idx_upscale(ctx, w_hot, x, idx, gb, M)
    merged = ggml.add(ctx, cpu, gpu)
    whole = ggml.mul_mat_idx(ctx, w, x, idx, g0)
    a, a_hot, h = _tensor(ctx, F16, Wt), _tensor(ctx, F16, Wt[bucket]), _tensor(ctx, F32, H)
    d_cpu = ggml.axpy(ctx, a, h, idx, g)
    d_gpu = ggml.axpy(ctx, a_hot, h, idx, gb, bucket=True)
    d_merged = ggml.add(ctx, d_cpu, d_gpu)
    d_whole = ggml.axpy(ctx, a, h, idx, g0)
    r = _compute([merged, whole, d_merged, d_whole, gpu, cpu], 2)
    assert np.array_equal(r[0], r[1])                  # disjoint rows, each exactly once: bit for bit
    assert np.any(r[4]) and np.any(r[5])
    err = np.abs(r[2] - r[3]).max() / np.abs(r[3]).max()
    assert err <= 1e-6                                 # two partial sums instead of one: rounding only


def test_bad_input_is_refused_and_leaves_context_alone():
    ctx = _ctx()
    w = ggml.new_tensor_2d(ctx, Q4_1, 64, 128)
    x = ggml.new_tensor_2d(ctx, F32, 64, 2)
    idx_bad = ggml.new_tensor_2d(ctx, F32, 100, 2)
    g16 = ggml.new_tensor_1d(ctx, F16, 128)
    with pytest.raises(ggml.GGMLError, match="sparse_idx must be"):
        ggml.mul_mat_idx(ctx, w, x, idx_bad, None)
    idx = ggml.new_tensor_2d(ctx, F32, 128, 2)
    with pytest.raises(ggml.GGMLError, match="I32"):
        ggml.mul_mat_idx(ctx, w, x, idx, g16)
    a_bad = ggml.new_tensor_2d(ctx, F16, 64, 100)
    h = ggml.new_tensor_2d(ctx, F32, 128, 2)
    n = ctx.n_objects
    with pytest.raises(ggml.GGMLError, match="one row per element"):
        ggml.axpy(ctx, a_bad, h, idx, None)
    assert ctx.n_objects == n                         # a refused call adds nothing
    with pytest.raises(ggml.GGMLError, match="NaN"):
        powerinfer.set_sparse_pred_threshold(float("nan"))


# ---------------------------------------------------------------- the compiled kernels (ggviz/ggml/cpu/fast/sparse.py)

def _oracle():
    try:
        from tests.oracle.ggml_lib import RealGGML, available
    except Exception:  # noqa: BLE001
        return None
    return RealGGML() if available() else None


@pytest.mark.parametrize("wtype", [Q4_1, C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q8_0, F16])
def test_compiled_mul_mat_sparse_has_real_ggml_bits_on_kept_rows(wtype):
    sparse = pytest.importorskip("ggviz.ggml.cpu.fast.sparse", reason="the compiled kernels need Numba")
    from ggviz.ggml.cpu.fast import intrinsics
    g = _oracle()
    if g is None or not intrinsics.HAVE_AVX2:
        pytest.skip("real ggml oracle (libggml-python) or AVX2 not available")
    rng = np.random.default_rng(int(wtype))
    M, K, T = 1536, 576, 3
    W, X, I, G = _case(rng, M=M, K=K, T=T)
    if wtype == F16:
        raw = W.astype(np.float16).view(np.uint8).reshape(M, -1)
    else:
        raw = np.asarray(Q.quantize_row_ref(wtype, W)).reshape(-1).view(np.uint8).reshape(M, -1)
    ctx = g.init(64 << 20)
    try:
        w = g.new_tensor_2d(ctx, wtype, K, M)
        g.set_array(w, raw.reshape(-1).view(np.float16) if wtype == F16 else raw.reshape(-1))
        x = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, K, T)
        g.set_array(x, X)
        y = g.mul_mat(ctx, w, x)
        gf = g.new_graph(ctx)
        g.build_forward_expand(gf, y)
        g.graph_compute(gf, 1)
        real = g.to_float(y).reshape(T, M).copy()
    finally:
        g.free(ctx)
    keep = (G[None] != 1) & ~(I < 0)
    mm = sparse.SparseMatMul(wtype, raw, K)
    for nth in (1, 2, 3, 4):
        S = mm(X, I, G, 0.0, nth)
        assert np.array_equal(S[keep], real[keep]), nth
        assert np.all(S[~keep] == 0) and mm.skipped == int((~keep).sum())
        # one column (a decode: the kernel lists the kept rows first), with and without gpu_idx
        for j in range(T):
            for g_ in (G, None):
                kj = ~(I[j] < 0) & ((G != 1) if g_ is not None else True)
                S1 = mm(X[j:j + 1], I[j:j + 1], g_, 0.0, nth)[0]
                assert np.array_equal(S1[kj], real[j, kj]) and np.all(S1[~kj] == 0), (nth, j)
                assert mm.skipped == int((~kj).sum()) and not np.signbit(S1[~kj]).any()


def test_compiled_axpy_matches_the_faithful_kernel_bit_for_bit():
    sparse = pytest.importorskip("ggviz.ggml.cpu.fast.sparse", reason="the compiled kernels need Numba")
    rng = np.random.default_rng(21)
    M, K, T = 1536, 576, 2
    Wt = (rng.standard_normal((M, K)) * 0.05).astype(np.float16)
    X = np.maximum(rng.standard_normal((T, M)), 0).astype(np.float32)
    I = rng.standard_normal((T, M)).astype(np.float32)
    G = (rng.random(M) < 0.25).astype(np.int32)
    ref, _ = _axpy_ref(Wt, X, I, G, 0.0)
    for nth in (1, 2, 3, 4):
        ctx = _ctx()
        y = ggml.axpy(ctx, _tensor(ctx, F16, Wt), _tensor(ctx, F32, X), _tensor(ctx, F32, I), _tensor(ctx, I32, G))
        faithful = _compute([y], nth)[0].reshape(T, K)
        fast = sparse.run_axpy(Wt, X, I, G, 0.0, nth)
        assert np.array_equal(fast, faithful), nth
        assert np.abs(fast - ref).max() / np.abs(ref).max() <= 1e-6


# ---------------------------------------------------------------- the hybrid executor (ggviz/ggml/cpu/hybrid.py)

def _hybrid_ffn(rng, n_layer=2, M=1536, K=576, T=2, p_gpu=0.3, wtype=Q4_1):
    """n_layer chained sparse FFNs (llm_build_ffn_sparse's shape: predictor, up/gate CPU + GPU halves merged,
    SiLU, MUL, AXPY CPU + GPU merged), random weights."""
    ctx = _ctx()
    cur = _tensor(ctx, F32, rng.standard_normal((T, K)).astype(np.float32))
    names = []
    for il in range(n_layer):
        G = (rng.random(M) < p_gpu).astype(np.int32)
        bucket = np.flatnonzero(G).astype(np.int32)
        g, gb = _tensor(ctx, I32, G), _tensor(ctx, I32, bucket)
        fc1 = _tensor(ctx, F32, (rng.standard_normal((128, K)) * 0.05).astype(np.float32))
        fc2 = _tensor(ctx, F32, (rng.standard_normal((M, 128)) * 0.3).astype(np.float32))
        idx = ggml.mul_mat(ctx, fc2, ggml.relu(ctx, ggml.mul_mat(ctx, fc1, cur)))
        ggml.format_name(idx, "mlp_pre_out-%d", il)
        outs = {}
        for name in ("up", "gate"):
            W = (rng.standard_normal((M, K)) * 0.05).astype(np.float32)
            if wtype == F16:
                W = W.astype(np.float16)
            c = ggml.mul_mat_idx(ctx, _tensor(ctx, wtype, W), cur, idx, g)
            ggml.format_name(c, f"ffn_{name}_sparse-%d", il)
            u = ggml.mul_mat_idx_upscale(ctx, _tensor(ctx, wtype, W[bucket]), cur, idx, gb, M)
            ggml.format_name(u, f"ffn_{name}_sparse_gpu-%d", il)
            outs[name] = ggml.add(ctx, c, u)
        x = ggml.mul(ctx, ggml.silu(ctx, outs["gate"]), outs["up"])
        Wt = (rng.standard_normal((M, K)) * 0.05).astype(np.float16)
        d = ggml.axpy(ctx, _tensor(ctx, F16, Wt), x, idx, g)
        ggml.format_name(d, "ffn_down_sparse-%d", il)
        dg = ggml.axpy(ctx, _tensor(ctx, F16, Wt[bucket]), x, idx, gb, bucket=True)
        ggml.format_name(dg, "ffn_down_sparse_gpu-%d", il)
        cur = ggml.add(ctx, cur, ggml.add(ctx, d, dg))
        names.append(il)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, cur)
    return gf, cur


def _overlaps(recs) -> int:
    """GPU nodes whose time span intersects that of a CPU node of the same layer."""
    gpu = [r for r in recs if r.lane == "gpu"]
    cpu = [r for r in recs if r.lane == "cpu" and r.t_end > r.t_start]
    return sum(1 for g in gpu for c in cpu if g.name[-2:] == c.name[-2:] and g.t_start < c.t_end
               and c.t_start < g.t_end)


def test_hybrid_executor_equals_cpu_run_and_respects_dependencies():
    from ggviz.ggml.cpu import hybrid
    gf, out = _hybrid_ffn(np.random.default_rng(7))
    on_gpu = lambda n: n.name.endswith(("_gpu-0", "_gpu-1"))  # noqa: E731 - PowerInfer: backend == GPU
    # the CPU-only run with 2 threads: the hybrid run's CPU kernels get nth = 3 - 1 = 2 as well
    plan = ggml_cpu.graph_plan(gf, 2)
    plan.work_data = np.zeros(plan.work_size, np.uint8) if plan.work_size else None
    assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS
    ref = np.array(ggml.get_data(out), copy=True)
    # the overlap below depends on how the interpreter lock is handed between the threads (the kernels release
    # it inside NumPy): up to 10 runs (~50 ms each), each of which must give the same bits and respect the
    # dependencies. Three were not always enough with both cores busy (a fresh-clone CI run, two pytest workers)
    for attempt in range(10):
        ggml.get_data(out)[...] = np.nan
        recs = hybrid.graph_compute_hybrid(gf, 3, on_gpu)
        assert np.array_equal(np.array(ggml.get_data(out)), ref)
        if _overlaps(recs):
            break
    assert len(recs) == gf.n_nodes
    by_n = {r.node_n: r for r in recs}
    gpu = [r for r in recs if r.lane == "gpu"]
    assert len(gpu) == 6 and all(r.name.endswith(("_gpu-0", "_gpu-1")) for r in gpu)
    for r in recs:
        for k in r.srcs:        # no node starts before its sources finished
            assert r.t_start >= by_n[k].t_end, (r.name, by_n[k].name)
    assert _overlaps(recs) >= 1
    with pytest.raises(ggml.GGMLError, match="at least 2 threads"):
        hybrid.graph_compute_hybrid(gf, 1, on_gpu)


@pytest.mark.parametrize("lane", ["cpu", "gpu"])
def test_hybrid_executor_hands_a_kernel_error_to_the_caller(lane):
    """A kernel failing in a CPU thread or in the GPU thread stops the others (no hang) and reaches the caller."""
    from ggviz.ggml.cpu import hybrid
    ctx = _ctx()
    a = ggml.new_tensor_2d(ctx, F32, 64, 128)            # AXPY mirrors PowerInfer's F16 kernel only
    b = _tensor(ctx, F32, np.ones((2, 128), np.float32))
    idx = _tensor(ctx, F32, np.zeros((2, 128), np.float32))
    g = _tensor(ctx, I32, np.zeros(128, np.int32))
    y = ggml.axpy(ctx, a, b, idx, g)
    z = ggml.add(ctx, y, y)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, z)
    with pytest.raises(ggml.GGMLError, match="F16"):
        hybrid.graph_compute_hybrid(gf, 3, lambda n: lane == "gpu" and n.addr == y.addr)


# ---------------------------------------------------------------- the sparse graph on the compiled walk (fast/)

def _walk(gf, nth, compiled, n_next=None):
    """graph_compute on the node-by-node walk (faithful kernels) or the compiled walk; every node's data after."""
    from ggviz.ggml.cpu.fast import compiler
    plan = ggml_cpu.graph_plan(gf, nth)
    if compiled:
        plan.extra = compiler.compile_graph(gf)
        assert plan.extra is not None, "the compiled walk does not cover the sparse FFN graph"
        plan.work_size = max(plan.work_size, plan.extra.work_size)
        if n_next is not None:
            compiler._last_compute[:] = [0, 0, [], None, None]   # (no compute before it to take a mode from)
            plan.extra.n_next = n_next
    plan.work_data = np.zeros(plan.work_size, np.uint8) if plan.work_size else None
    assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS
    return {n.name: np.array(ggml.get_data(n), copy=True) for n in gf.nodes}, plan


@pytest.mark.parametrize("wtype", [Q4_1, C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q8_0, F16])
def test_compiled_walk_equals_the_faithful_kernels_on_the_sparse_ffn(wtype):
    """llm_build_ffn_sparse's nodes (predictor MUL_MAT + RELU, MUL_MAT_SPARSE and its _upscale GPU half, SILU, MUL,
    AXPY and its bucket half, the merges) compiled: every node bit for bit the node-by-node walk's, 1 and 2
    threads, 1 and 3 columns, thresholds -inf / -1 / 0."""
    pytest.importorskip("ggviz.ggml.cpu.fast.sparse", reason="the compiled walk needs Numba")
    for thr in (-np.inf, -1.0, 0.0):
        powerinfer.set_sparse_pred_threshold(thr)
        for nth, T in ((1, 1), (2, 1), (1, 3), (2, 3)):       # one column (a decode) and a small batch
            gf, _ = _hybrid_ffn(np.random.default_rng(int(wtype)), n_layer=1, M=512, K=256, T=T, wtype=wtype)
            ref, _ = _walk(gf, nth, False)
            gf, _ = _hybrid_ffn(np.random.default_rng(int(wtype)), n_layer=1, M=512, K=256, T=T, wtype=wtype)
            got, plan = _walk(gf, nth, True)
            ops = {ggml.op_desc(n) for n in gf.nodes}
            assert {"MUL_MAT_SPARSE", "AXPY", "RELU", "SILU"} <= ops
            for name, a in ref.items():
                assert np.array_equal(got[name], a, equal_nan=True), (thr, nth, T, name)
            skipped = ref["ffn_up_sparse-0"] == 0
            assert skipped.mean() > (0.25 if thr == 0.0 else 0.05) or thr == -np.inf


def test_compiled_walk_reads_the_threshold_at_compute_time_and_keeps_ggml_nth():
    """A compiled program is reused between computes (llama.cpp reuses graphs): a new sparse_pred_threshold must
    take effect at the next compute. And AXPY's partials follow the compute's n_threads even when the walk's thread
    policy runs it on one thread (ggviz's choice), so the bits do not depend on the policy."""
    pytest.importorskip("ggviz.ggml.cpu.fast.sparse", reason="the compiled walk needs Numba")
    from ggviz.ggml.cpu.fast import compiler
    gf, out = _hybrid_ffn(np.random.default_rng(3), n_layer=1, M=512, K=256, T=2)
    refs = {}
    for thr in (0.0, -1.0):
        powerinfer.set_sparse_pred_threshold(thr)
        refs[thr] = _walk(gf, 2, False)[0][out.name]
    assert not np.array_equal(refs[0.0], refs[-1.0])
    plan = ggml_cpu.graph_plan(gf, 2)
    plan.extra = compiler.compile_graph(gf)
    plan.work_size = max(plan.work_size, plan.extra.work_size)
    plan.work_data = np.zeros(plan.work_size, np.uint8)
    for thr in (0.0, -1.0, 0.0):
        powerinfer.set_sparse_pred_threshold(thr)
        compiler._last_compute[:] = [0, 0, [], None, None]   # (no compute before it to take a mode from)
        plan.extra.n_next = 1                   # the thread policy's "one thread": still 2 partials, same sums
        assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS
        assert plan.extra.n_use_now == 1
        assert np.array_equal(np.asarray(ggml.get_data(out)), refs[thr]), thr
    # a work buffer smaller than the compiled layout needs is refused with a message, not overrun
    plan.work_data = np.zeros(plan.work_size // 4, np.uint8)
    plan.work_size //= 4
    with pytest.raises(ggml.GGMLError, match="work buffer"):
        ggml_cpu.graph_compute(gf, plan)
