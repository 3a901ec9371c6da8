"""MUL_MAT_ID (expert routing) against the real ggml 0.20.2 (libggml-python through ctypes).

``ggml_mul_mat_id(ctx, as, b, ids)``: the result's shape and sources as ggml builds them, the planner's work size
(ggml_graph_plan's MUL_MAT_ID case) and the values, bit for bit, for F32 and Q8_0 experts (src1 converted to Q8_0
in the work buffer), with 1 and 3 threads, with b broadcast (one row per token) and with one row per used expert.
Q4_K experts with >= 8 routed rows take tiled.cpp's arithmetic: checked equal, bit for bit, to ggviz's MUL_MAT
(whose Q4_K bits tests/test_kquants.py checks against llama.cpp) on the columns each expert received. The row
mapping thread 0 builds (ggml's ``matrix_row_counts`` / ``matrix_rows``) is checked against a hand-worked routing.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggviz import ggml as gg
from ggviz import trace
from ggviz.ggml import quants as Q
from ggviz.ggml.cpu import mul_mat
from tests import graphs
from tests.oracle.ggml_lib import available, unavailable_reason
from tests.pairs import real_ggml

F32, I32, Q8_0, Q4_K = gg.GGML_TYPE_F32, gg.GGML_TYPE_I32, gg.GGML_TYPE_Q8_0, gg.GGML_TYPE_Q4_K


@pytest.fixture(autouse=True)
def _as_the_oracle_build(monkeypatch):
    # libggml-python 0.20.2 is built without GGML_USE_LLAMAFILE (MUL_MAT_ID never takes tinyBLAS anyway)
    monkeypatch.setattr(mul_mat, "USE_LLAMAFILE", False)


def _routing(rng, n_expert, n_used, n_tokens):
    """Top-k style ids: n_used distinct experts per token."""
    return np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n_tokens)]).astype(np.int32)


def _run(L, t, K, M, E, nb, ids, A, B, n_threads):
    """MUL_MAT_ID of experts A [E, M, K] (raw bytes for a quant type) and activations B [T, nb, K]."""
    n_used, T = ids.shape[1], ids.shape[0]
    ctx = L.init(32 << 20)
    try:
        a = L.new_tensor_3d(ctx, t, K, M, E)
        b = L.new_tensor_3d(ctx, F32, K, nb, T)
        i = L.new_tensor_2d(ctx, I32, n_used, T)
        graphs.set_values(L, a, A)
        graphs.set_values(L, b, B)
        graphs.set_values(L, i, ids.reshape(-1))
        c = L.mul_mat_id(ctx, a, b, i)
        info = (list(graphs.ne(L, c)), graphs.tensor_info(L, c, 0)["op"])
        gf = L.new_graph(ctx)
        L.build_forward_expand(gf, c)
        ws = L.graph_plan(gf, 3)
        ws = ws["work_size"] if isinstance(ws, dict) else ws.work_size
        if graphs.is_oracle(L):
            assert L.graph_compute(gf, n_threads) == 0
        else:
            assert L.graph_compute_with_ctx(ctx, gf, n_threads) == 0
        return np.array(graphs.to_float(L, c)).reshape(T, n_used, M), info, ws
    finally:
        L.free(ctx)


needs_oracle = pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())


@needs_oracle
@pytest.mark.parametrize("t", [F32, Q8_0], ids=["f32", "q8_0"])
@pytest.mark.parametrize("K,M,E,nb,n_used,T", [(64, 40, 4, 1, 2, 19), (96, 70, 6, 2, 2, 3)])
def test_mul_mat_id_bitwise_with_ggml(t, K, M, E, nb, n_used, T):
    g = real_ggml()
    rng = np.random.default_rng(K + M + E)
    ids = _routing(rng, E, n_used, T)
    A = rng.standard_normal(E * M * K).astype(np.float32)
    B = rng.standard_normal(T * nb * K).astype(np.float32)
    if t != F32:     # the experts quantized once, by ggml: both sides read the same blocks
        ctx = g.init(8 << 20)
        qa = g.new_tensor_3d(ctx, t, K, M, E)
        g.set_array(qa, A)
        A = g.get_array(qa).copy()
        g.free(ctx)
    ref, rinfo, rws = _run(g, t, K, M, E, nb, ids, A, B, 2)
    for n in (1, 3):
        got, info, ws = _run(gg, t, K, M, E, nb, ids, A, B, n)
        assert info == rinfo and info[0] == [M, n_used, T, 1]
        assert ws == rws, "ggml_graph_plan's work size"
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), \
            f"{n} threads: {int((got != ref).sum())} of {got.size} differ, max {float(np.abs(got - ref).max())}"
    # and what the op means: column (e, t) is expert ids[t, e]'s matrix times b's row e % nb of token t
    if t == F32:
        W = A.reshape(E, M, K).astype(np.float64)
        X = B.reshape(T, nb, K).astype(np.float64)
        want = np.stack([[W[ids[tk, e]] @ X[tk, e % nb] for e in range(n_used)] for tk in range(T)])
        assert np.allclose(ref, want, rtol=1e-4, atol=1e-4)


def test_mul_mat_id_tiled_q4_K_equals_mul_mat_and_row_mapping():
    """Expert 1 gets 9 rows (tiled.cpp's arithmetic), the others fewer; each expert's columns equal a MUL_MAT of
    its matrix by the rows routed to it, bit for bit. The row mapping is ggml's, token by token, slot by slot."""
    K, M, E, T = 256, 24, 3, 10
    ids = np.array([[1, 0]] * 5 + [[1, 2]] * 4 + [[0, 1]], np.int32)       # expert 1 on every token
    rng = np.random.default_rng(7)
    A = np.asarray(Q.quantize_row_ref(Q4_K, rng.standard_normal(E * M * K).astype(np.float32))).view(np.uint8)
    B = rng.standard_normal(T * K).astype(np.float32)
    with trace.recording(kinds={"cpu.mul_mat_id_rows"}) as rec:
        got, _, _ = _run(gg, Q4_K, K, M, E, 1, ids, A, B, 3)
    (ev,) = rec.events
    assert ev["counts"] == [6, 10, 4]
    # expert 1: slot 0 of tokens 0..8, then slot 1 of token 9; expert 2: slot 1 of tokens 5..8
    assert ev["rows"][1] == [[0, tk] for tk in range(9)] + [[1, 9]]
    assert ev["rows"][2] == [[1, tk] for tk in range(5, 9)]
    rb = A.size // E
    for e in range(E):
        toks = [tk for tk in range(T) if e in ids[tk]]
        ctx = gg.init(8 << 20)
        w = gg.new_tensor_2d(ctx, Q4_K, K, M)
        x = gg.new_tensor_2d(ctx, F32, K, len(toks))
        gg.set_data(w, A[e * rb:(e + 1) * rb])
        gg.set_data(x, B.reshape(T, K)[toks])
        y = gg.mul_mat(ctx, w, x)
        gf = gg.new_graph(ctx)
        gg.build_forward_expand(gf, y)
        assert gg.graph_compute_with_ctx(ctx, gf, 2) == 0
        ref = np.array(gg.get_data_f32(y)).reshape(len(toks), M)
        gg.free(ctx)
        mine = np.stack([got[tk, list(ids[tk]).index(e)] for tk in toks])
        assert np.array_equal(mine.view(np.uint32), ref.view(np.uint32)), f"expert {e}"


def test_mul_mat_id_bad_input():
    ctx = gg.init(4 << 20)
    a = gg.new_tensor_3d(ctx, F32, 8, 4, 3)
    b = gg.new_tensor_3d(ctx, F32, 8, 1, 2)
    with pytest.raises(gg.GGMLError, match="ids must be I32"):
        gg.mul_mat_id(ctx, a, b, gg.new_tensor_2d(ctx, F32, 2, 2))
    with pytest.raises(gg.GGMLError, match="one expert list per token"):
        gg.mul_mat_id(ctx, a, b, gg.new_tensor_2d(ctx, I32, 2, 3))
    ids = gg.new_tensor_2d(ctx, I32, 2, 2)
    gg.set_data(ids, np.array([0, 1, 2, 3], np.int32))          # 3 is not an expert
    gg.get_data(a)[...] = 1.0
    gg.get_data(b)[...] = 1.0
    c = gg.mul_mat_id(ctx, a, b, ids)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, c)
    with pytest.raises(gg.GGMLError, match=r"ids\[1, 1\] = 3 is not an expert"):
        gg.graph_compute_with_ctx(ctx, gf, 2)
    gg.free(ctx)
