"""PowerInfer on SmolLM2: the offline pipeline (ggviz/powerinfer/), the PWRI model and its sparse FFN graph
(ggviz/llama/powerinfer.py), the solver.

A tiny build (64 training tokens, 1 epoch) makes a real PWRI file in seconds; its predictor is poor, so the model
checks use threshold -inf (every row kept: the sparse graph must then agree with the dense one) and the graph's
structure. Oracles: the dense model (itself checked against llama.cpp in test_llama), the GGUF bytes, the solver's
constraints and PowerInfer's ILP solved by scipy's MILP (HiGHS).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from ggviz import ggml, llama
from ggviz.ggml import quants as Q
from ggviz.ggml.cpu import powerinfer as cpu_pi
from ggviz.ggml.cpu import quants as cq
from ggviz.powerinfer import pipeline, solver

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="needs data/models/SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("pinfer")
    old = cpu_pi.sparse_pred_threshold
    # the recording is saved too: test_build_reuses_a_saved_recording builds again from it (one decode less)
    r = pipeline.build(out, MODEL, tokens=64, heldout=32, seq_len=96, epochs=1, threshold=0.25,
                       vram_budget_gib=0.1, quiet=True, recording=out / "rec")
    yield r
    cpu_pi.set_sparse_pred_threshold(old)


@pytest.fixture(scope="module")
def models(built):
    sparse = llama.model_load_from_file(str(built.model_path))
    dense = llama.model_load_from_file(str(MODEL))
    yield sparse, dense
    llama.model_free(sparse)
    llama.model_free(dense)


def test_build_writes_a_pwri_file_with_the_predictor(built):
    p = built.model_path
    assert p.read_bytes()[:4] == b"PWRI"
    assert len(list((p.parent / "activation").glob("activation_*.npy"))) == 30
    counts = np.load(p.parent / "activation" / "activation_3.npy")
    assert counts.shape == (1536,) and counts.sum() > 0
    m = json.loads((p.parent / "metrics.json").read_text())
    assert m["tokens"] == 64 and len(m["layers"]) == 30
    assert all(0.0 <= layer["recall@-1.0"] <= 1.0 for layer in m["layers"])


def test_pwri_model_loads_sparse(models, built):
    sparse, dense = models
    assert dense.sparse is None and sparse.sparse is not None
    assert sparse.sparse.sparse_pred_threshold == pytest.approx(0.25)      # the KV written by the build
    assert cpu_pi.sparse_pred_threshold == pytest.approx(0.25)
    sl = sparse.sparse.layers[0]
    assert list(sl.mlp_pre_w1.shape[:2]) == [576, 128] and list(sl.mlp_pre_w2.shape[:2]) == [128, 1536]
    assert list(sl.ffn_down_t.shape[:2]) == [576, 1536] and sl.ffn_down_t.type == ggml.GGML_TYPE_F16
    assert int(np.asarray(ggml.get_data(sl.gpu_idx)).sum()) == 0 and int(sl.gpu_bucket.ne[0]) == 0
    # ffn_down_t is ffn_down transposed (dequantized, F16)
    dt = np.asarray(ggml.get_data(sl.ffn_down_t)).reshape(1536, 576)
    assert np.array_equal(dt, pipeline.down_t_f16(dense, 0))


def test_env_overrides_the_threshold(built):
    code = ("from ggviz import llama; from ggviz.ggml.cpu import powerinfer as p; "
            f"m = llama.model_load_from_file({str(built.model_path)!r}); "
            "print(m.sparse.sparse_pred_threshold, p.sparse_pred_threshold)")
    env = dict(os.environ, LLAMA_SPARSE_PRED_THRESHOLD="-1.5", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["-1.5", "-1.5"]


def _logits(model, ids, threads=2):
    ctx = pipeline._ctx(model, len(ids), threads)
    names = []

    def cb(t, ask):
        if ask:
            names.append((t.name, ggml.op_desc(t)))
            return False
        return True
    try:
        assert llama.decode(ctx, pipeline._batch_all_logits(ids)) == 0
        L = np.array(llama.get_logits(ctx), np.float64).reshape(len(ids), -1)
        ctx.cparams.cb_eval = cb
        llama.memory_clear(llama.get_memory(ctx), True)
        llama.decode(ctx, pipeline._batch_all_logits(ids[:2]))
    finally:
        llama.free(ctx)
    return L, names


def _kl_top1(Ld, Ls):
    def lsm(L):
        L = L - L.max(1, keepdims=True)
        return L - np.log(np.exp(L).sum(1, keepdims=True))
    pd, ps = lsm(Ld), lsm(Ls)
    return float((np.exp(pd) * (pd - ps)).sum(1).mean()), float((Ld.argmax(1) == Ls.argmax(1)).mean())


def test_sparse_graph_at_threshold_minus_inf_agrees_with_dense(models):
    sparse, dense = models
    # 96 tokens: at -inf the sparse model's up/gate rows carry the dense (repacked) MUL_MAT's bits, so what is left
    # is the F16 down projection, whose own noise floor against the Q4_1 x Q8_1 down is a top-1 of ~0.92-0.95
    # (measured on 48 / 96 tokens: 0.917 / 0.948); on 48 tokens one token decides the 0.9 below (0.896 measured)
    ids = pipeline.corpus_tokens(dense.vocab, 96)
    old = cpu_pi.set_sparse_pred_threshold(-np.inf)
    try:
        Ls, names = _logits(sparse, ids)
    finally:
        cpu_pi.set_sparse_pred_threshold(old)
    Ld, dense_names = _logits(dense, ids)
    kl, top1 = _kl_top1(Ld, Ls)
    # every row kept: only the F16 rounding of down_t and of AXPY's input differ from the dense Q4_1 x Q8_1 down
    assert kl <= 0.02 and top1 >= 0.9, (kl, top1)
    # The noise floor the issue's "KL <= 1e-3 at -inf" is below: the dense model itself, with layer 0's FFN output
    # moved by one ulp (np.nextafter on every value) and nothing else, moves its logits by more than 1e-3 (0.0038 on
    # these 96 tokens; every later MUL_MAT rounds its input to Q8_1 steps). The sparse model at -inf differs from
    # dense at that scale (measured 0.0044), far from what a wrong kernel gives (threshold -1 already costs ~0.02).
    ctx = pipeline._ctx(dense, len(ids), 2)

    def nudge(t, ask):
        if ask:
            return t.name == "ffn_out-0"
        a = ggml.get_data(t)
        a[...] = np.nextafter(a, np.float32(np.inf))
        return True
    ctx.cparams.cb_eval = nudge
    try:
        assert llama.decode(ctx, pipeline._batch_all_logits(ids)) == 0
        Ln = np.array(llama.get_logits(ctx), np.float64).reshape(len(ids), -1)
    finally:
        llama.free(ctx)
    kl_ulp, _ = _kl_top1(Ld, Ln)
    assert kl_ulp > 1e-3, kl_ulp
    assert kl <= 2.5 * kl_ulp, (kl, kl_ulp)
    # the graph: llm_build_ffn_sparse's nodes, named "<name>-<il>", in place of the dense FFN
    got = dict(names)
    for il in (0, 29):
        assert got[f"mlp_pre_hidden-{il}"] == "MUL_MAT" and got[f"mlp_pre_relu-{il}"] == "RELU"
        assert got[f"mlp_pre_out-{il}"] == "MUL_MAT"
        assert got[f"ffn_up_sparse-{il}"] == "MUL_MAT_SPARSE" and got[f"ffn_gate_sparse-{il}"] == "MUL_MAT_SPARSE"
        assert got[f"ffn_gate_act-{il}"] == "SILU" and got[f"ffn_gate_par-{il}"] == "MUL"
        assert f"ffn_swiglu-{il}" not in got
    assert sum(op == "AXPY" for _, op in names) == 30
    assert "ffn_swiglu-0" in dict(dense_names)


def test_compiled_walk_decodes_the_sparse_model_like_the_faithful_kernels(models, monkeypatch):
    """The whole PWRI model's decode on the compiled walk (its program covers every node of the sparse graph) has
    the bits of the node-by-node walk with the faithful NumPy kernels: 2 threads, threshold 0 (rows skipped, AXPY's
    partials reduced in ith order). The other thresholds and thread counts: test_powerinfer.py, node by node."""
    pytest.importorskip("ggviz.ggml.cpu.fast.sparse", reason="the compiled walk needs Numba")
    from ggviz.ggml.cpu import ggml_cpu
    from ggviz.ggml.cpu.fast import compiler
    sparse, _ = models
    ids = pipeline.corpus_tokens(sparse.vocab, 3)
    programs = []
    plan_graph = compiler.plan_graph

    def spy(cgraph, n_threads):
        fg = plan_graph(cgraph, n_threads)
        programs.append((fg, {ggml.op_desc(n) for n in cgraph.nodes}))
        return fg

    def run():
        ctx = pipeline._ctx(sparse, 4, 2)
        try:
            assert llama.decode(ctx, pipeline._batch_all_logits(ids)) == 0
            return np.array(llama.get_logits(ctx), np.float32)
        finally:
            llama.free(ctx)
    old = cpu_pi.set_sparse_pred_threshold(0.0)
    try:
        monkeypatch.setattr(compiler, "plan_graph", spy)
        fast = run()
        assert programs and all(fg is not None for fg, ops in programs if "MUL_MAT_SPARSE" in ops)
        assert any("AXPY" in ops for _, ops in programs)
        monkeypatch.setattr(ggml_cpu, "fast", None)           # no compiled program: the faithful kernels
        faithful = run()
    finally:
        cpu_pi.set_sparse_pred_threshold(old)
    assert np.array_equal(fast, faithful)


def test_eval_callback_segments_of_the_sparse_graph_run_compiled_with_the_same_bits(models, monkeypatch):
    """An eval callback cuts the graph into node ranges (ggml_backend_sched_compute_splits); in a PWRI graph most
    ranges hold no repacked MUL_MAT (sparse kernels, predictor), yet they run compiled because the graph they were
    cut from does (compiler._has_repacked_mul_mat asks the view's root). The logits equal the callback-free run's."""
    pytest.importorskip("ggviz.ggml.cpu.fast.sparse", reason="the compiled walk needs Numba")
    from ggviz.ggml.cpu.fast import compiler
    sparse, _ = models
    ids = pipeline.corpus_tokens(sparse.vocab, 4)
    old = cpu_pi.set_sparse_pred_threshold(0.0)
    try:
        plain, _ = _logits(sparse, ids)
        seen = []
        plan_graph = compiler.plan_graph

        def spy(cgraph, n_threads):
            fg = plan_graph(cgraph, n_threads)
            seen.append((fg is not None, {n.op for n in cgraph.nodes}))
            return fg
        monkeypatch.setattr(compiler, "plan_graph", spy)
        ctx = pipeline._ctx(sparse, len(ids), 2)
        ctx.cparams.cb_eval = lambda t, ask: (t.name.startswith(("mlp_pre_out-", "ffn_out-")) if ask else True)
        try:
            assert llama.decode(ctx, pipeline._batch_all_logits(ids)) == 0
            cut = np.array(llama.get_logits(ctx), np.float64).reshape(len(ids), -1)
        finally:
            llama.free(ctx)
    finally:
        cpu_pi.set_sparse_pred_threshold(old)
    assert np.array_equal(cut, plain)
    sparse_ranges = [ok for ok, ops in seen if ops & {ggml.GGML_OP_MUL_MAT_SPARSE, ggml.GGML_OP_AXPY}]
    assert len(sparse_ranges) >= 30 and all(sparse_ranges)
    assert len(seen) > 60 and all(ok for ok, _ in seen)


def test_sparse_graph_skips_rows_by_the_predictor(models):
    """At a threshold the predictor output crosses, the sparse FFN's up rows are exactly 0 where idx < threshold."""
    sparse, _ = models
    ids = pipeline.corpus_tokens(sparse.vocab, 8)
    got = {}

    def cb(t, ask):
        if ask:
            return t.name in ("mlp_pre_out-2", "ffn_up_sparse-2")
        got[t.name] = np.array(ggml.get_data(t), np.float32).reshape(len(ids), -1)
        return True
    old = cpu_pi.set_sparse_pred_threshold(0.0)
    ctx = pipeline._ctx(sparse, 16, 1)
    ctx.cparams.cb_eval = cb
    try:
        assert llama.decode(ctx, pipeline._batch_all_logits(ids)) == 0
    finally:
        llama.free(ctx)
        cpu_pi.set_sparse_pred_threshold(old)
    idx, up = got["mlp_pre_out-2"], got["ffn_up_sparse-2"]
    drop = idx < 0
    assert 0.01 < drop.mean() < 0.99
    assert np.all(up[drop] == 0) and np.count_nonzero(up[~drop]) >= 0.99 * (~drop).sum()


# ---------------------------------------------------------------- the solver

def test_solver_constraints_and_gpuidx_file(built, tmp_path):
    counts = np.stack([np.load(built.model_path.parent / "activation" / f"activation_{i}.npy") for i in range(30)])
    m = json.loads((built.model_path.parent / "metrics.json").read_text())
    steps = [s[0] for s in m["offload_steps"]]
    assert steps == ["attention", "predictor", "ffn_norm", "output", "kv_cache"]
    assert m["neuron_bytes"] == m["vram_budget"] - sum(s[1] for s in m["offload_steps"]) > 0
    cap = solver.neuron_cap(m["neuron_bytes"], llama.model_load_from_file(str(MODEL)).layers[0].ffn_up)
    assert cap == m["neuron_cap"] == int(np.floor(m["neuron_bytes"] / (960 * 4.5))) * 4
    solved = solver.solve_gpu_split(counts, cap)
    assert solved == m["hot_per_layer"]
    assert all(k % 256 == 0 for k in solved) and 0 < sum(solved) <= cap
    gi = solver.read_gpuidx(built.gpuidx_path)
    assert [int(g.sum()) for g in gi] == solved
    for g, c, k in zip(gi, counts, solved):
        if k:        # the hot neurons are the layer's most active
            assert c[g == 1].min() >= c[g == 0].max()
    # the greedy optimum is the ILP's
    rng = np.random.default_rng(0)
    toy = rng.integers(0, 1000, (5, 1024)).astype(np.float64)
    toy[2] *= 3
    s = solver.solve_gpu_split(toy, 2560)
    vals = -np.sort(-toy, 1).reshape(5, 4, 256).sum(2)
    best = sorted(vals.reshape(-1), reverse=True)[:10]
    assert sum(s) == 2560
    assert sum(vals[i, :k // 256].sum() for i, k in enumerate(s)) == pytest.approx(sum(best))
    # the real ILP: PowerInfer's formulation (powerinfer-py/solver.py) solved by HiGHS, on the toy and on the
    # build's own activation counts
    for cnt, capacity in ((toy, 2560), (counts, cap), (counts, 2048)):
        k_ilp, obj = _powerinfer_ilp(cnt, capacity)
        k_greedy = solver.solve_gpu_split(cnt, capacity)
        v = -np.sort(-np.asarray(cnt, np.float64), 1).reshape(len(cnt), -1, 256).sum(2)
        assert sum(v[i, :k // 256].sum() for i, k in enumerate(k_greedy)) == pytest.approx(obj, rel=1e-12)
        assert sum(k_ilp) == sum(k_greedy) <= capacity


def _powerinfer_ilp(counts, capacity, batch=256, threshold=0):
    """solve_gpu_split of powerinfer-py/solver.py as scipy MILP: per layer the sorted counts summed in buckets of
    ``batch`` (x: one variable per bucket, y: one per layer), minimise -sum(value * x) subject to (1) sum(x) <=
    capacity / batch, (2) -sum_j x_ij + threshold/batch * y_i <= 0, (3) sum_j x_ij - 1e6 * y_i <= 0, every variable
    an integer (cvxopt's ``ilp(c, G, h, None, None, B=set(), I=all)``; bounded 0..1 here, the buckets being taken
    or not). Returns (hot neurons per layer, covered activations)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    vals = -np.sort(-np.asarray(counts, np.float64), 1).reshape(len(counts), -1, batch).sum(2)
    n_layer, nb = vals.shape
    nx = n_layer * nb
    c = np.concatenate([-vals.reshape(-1), np.zeros(n_layer)])
    rows, ub = [np.concatenate([np.ones(nx), np.zeros(n_layer)])], [int(capacity) // batch]
    for i in range(n_layer):
        r = np.zeros(nx + n_layer)
        r[i * nb:(i + 1) * nb] = -1
        r[nx + i] = threshold // batch
        rows.append(r)
        ub.append(0)
    for i in range(n_layer):
        r = np.zeros(nx + n_layer)
        r[i * nb:(i + 1) * nb] = 1
        r[nx + i] = -1000000
        rows.append(r)
        ub.append(0)
    res = milp(c, constraints=LinearConstraint(np.array(rows), -np.inf, np.array(ub, np.float64)),
               integrality=np.ones(nx + n_layer), bounds=Bounds(0, 1))
    assert res.success, res.message
    x = np.round(res.x[:nx]).reshape(n_layer, nb)
    return [int(k) * batch for k in x.sum(1)], -float(res.fun)


def test_cli_refuses_bad_arguments():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "ggviz", "powerinfer", "build", "--out", "/tmp/x", "--tokens", "3"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--tokens" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "ggviz", "powerinfer", "build", "--out", "/tmp/x", "--pos-weight", "0"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--pos-weight" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2


def test_threshold_minus_inf_like_for_like_dense_reference(built):
    """The honest -inf comparison: the dense graph with the PWRI file's F16 down weights (pipeline.use_f16_down),
    both models as loaded by default (attention and the dense up/gate repacked, the compiled walk) and 8 tokens
    (fewer than BLAS's 32: every MUL_MAT on the CPU). MUL_MAT_SPARSE keeps ggml's AVX2 float order, which is the
    repacked MUL_MAT's: the FFN input of layer 0 is identical, SiLU x up equals the fused SWIGLU to the bit, and the
    down projection differs only in the order of its float32 sums (AXPY row after row vs the F16 MUL_MAT).
    The logits still differ by a mean KL of ~2.5e-3 (measured: 0.0025, top-1 6 of 8): every later MUL_MAT rounds
    its input to Q8_1 blocks (steps of 1/127 of a block's max), so a 1e-7 difference that moves one value across a
    rounding boundary becomes a 0.4 % jump, and 30 layers compound them. The issue's KL <= 1e-3 at -inf is below
    this noise floor; what can be held exactly is the layer-local agreement."""
    sparse = llama.model_load_from_file(str(built.model_path))
    dense16 = llama.model_load_from_file(str(MODEL))
    keep = pipeline.use_f16_down(dense16)
    assert dense16.layers[0].ffn_down.type == ggml.GGML_TYPE_F16 and list(dense16.layers[0].ffn_down.shape)[:2] == [1536, 576]
    ids = pipeline.corpus_tokens(sparse.vocab, 8)

    def capture(model):
        got = {}

        def cb(t, ask):
            if ask:
                return t.name in ("ffn_gate_par-0", "ffn_swiglu-0", "ffn_out-0")
            got[t.name] = np.array(ggml.get_data(t), np.float32)
            return True
        ctx = pipeline._ctx(model, 16, 2)
        ctx.cparams.cb_eval = cb
        try:
            assert llama.decode(ctx, pipeline._batch_all_logits(ids)) == 0
            got["logits"] = np.array(llama.get_logits(ctx), np.float64).reshape(len(ids), -1)
        finally:
            llama.free(ctx)
        return got
    old = cpu_pi.set_sparse_pred_threshold(-np.inf)
    try:
        a = capture(sparse)
    finally:
        cpu_pi.set_sparse_pred_threshold(old)
    b = capture(dense16)
    assert np.array_equal(a["ffn_gate_par-0"], b["ffn_swiglu-0"])
    d = np.abs(a["ffn_out-0"] - b["ffn_out-0"]).max() / np.abs(b["ffn_out-0"]).max()
    assert 0 <= d <= 1e-6, d
    kl, top1 = _kl_top1(b["logits"], a["logits"])
    assert kl <= 0.01 and top1 >= 0.5, (kl, top1)
    del keep
    llama.model_free(sparse)
    llama.model_free(dense16)


def test_recording_round_trip_and_training_learns_a_known_rule(tmp_path):
    """save/load_recording keep every array; train_layer on a rule it can represent (active = relu(x A) B > 0,
    labels packed as Recording.active) reaches a held-out recall and accuracy far above chance."""
    rng = np.random.default_rng(3)
    n, d, n_ff = 3000, 32, 64
    A, Bm = rng.standard_normal((d, 16)).astype(np.float32), rng.standard_normal((16, n_ff)).astype(np.float32)
    x = rng.standard_normal((n, d)).astype(np.float16)
    y = (np.maximum(x.astype(np.float32) @ A, 0) @ Bm - 1.0) > 0
    rec = pipeline.Recording(x=[x], active=[np.packbits(y, axis=1)], act_threshold=np.array([0.5], np.float32),
                             counts=y.sum(0)[None].astype(np.int64), n_tokens=n, seconds=1.0)
    pipeline.save_recording(rec, tmp_path / "rec")
    back = pipeline.load_recording(tmp_path / "rec")
    assert back.n_tokens == n and np.array_equal(back.x[0], x) and np.array_equal(back.counts, rec.counts)
    assert type(back.x[0]) is np.ndarray                                  # read into memory, not a memmap
    assert np.array_equal(pipeline.unpack_active(back.active[0], n_ff), y)
    p = pipeline.train_layer(back.x[0][:2500], back.active[0][:2500], n_ff, hidden=32, epochs=40, batch=128, lr=5e-3, seed=0)
    assert p.w1.dtype == np.float32 and p.w2.dtype == np.float32 and p.loss[-1] < p.loss[0]
    recall, skipped = pipeline.recall_sparsity(p, x[2500:], y[2500:], 0.0)
    acc = float(((p.logits(x[2500:]) >= 0) == y[2500:]).mean())
    assert recall >= 0.9 and acc >= 0.85 and skipped > 0.2, (recall, acc, skipped, y.mean())


def test_sparse_down_projection_is_closer_to_exact_than_the_dense_one(models):
    """Why threshold -inf is not bit-equal to dense: the dense down projection quantizes its input to Q8_1 (llama.cpp's
    vec_dot_type for Q4_1), PowerInfer's AXPY rounds it to F16. Against the float64 product with the dequantized
    Q4_1 weights, AXPY's error is far smaller."""
    sparse, dense = models
    ids = pipeline.corpus_tokens(sparse.vocab, 8)
    got = {}

    def cb(t, ask):
        if ask:
            return t.name in ("ffn_gate_par-3", "ffn_out-3")
        got[t.name] = np.array(ggml.get_data(t), np.float32).reshape(len(ids), -1)
        return True
    old = cpu_pi.set_sparse_pred_threshold(-np.inf)
    ctx = pipeline._ctx(sparse, 16, 1)
    ctx.cparams.cb_eval = cb
    try:
        assert llama.decode(ctx, pipeline._batch_all_logits(ids)) == 0
    finally:
        llama.free(ctx)
        cpu_pi.set_sparse_pred_threshold(old)
    x, out = got["ffn_gate_par-3"], got["ffn_out-3"]
    t = dense.layers[3].ffn_down
    raw = np.asarray(ggml.get_data(t)).reshape(-1).view(np.uint8).reshape(576, -1)
    exact = x.astype(np.float64) @ np.asarray(Q.dequantize_row(t.type, raw), np.float64).reshape(576, 1536).T
    dense_q8 = cq.vec_dot(t.type, raw, cq.from_float(ggml.GGML_TYPE_Q8_1, x))

    def rel(a):
        return float(np.linalg.norm(a - exact) / np.linalg.norm(exact))
    assert rel(out) < 1e-3 and rel(dense_q8) > 5 * rel(out), (rel(out), rel(dense_q8))


def test_vram_budget_loads_the_ffn_split(built, models):
    """--vram-budget: <model>.generated.gpuidx is read, each layer's hot rows get *_gpu copies and the graph their
    GPU halves; in the first layer with hot rows (identical inputs) the merged up projection is the CPU-only one to the bit and the merged
    down projection equal up to the split of AXPY's sum."""
    from ggviz.llama import powerinfer as lp
    mp = llama.model_default_params()
    mp.vram_budget_gb = 0.1
    split = llama.model_load_from_file(str(built.model_path), mp)
    cpu_only, _ = models
    gi = solver.read_gpuidx(built.gpuidx_path)
    il = next(i for i, g in enumerate(gi) if g.any())     # the first layer with hot rows: same inputs as CPU-only
    sl, ly = split.sparse.layers[il], split.layers[il]
    hot = np.flatnonzero(gi[il])
    assert len(hot) % 256 == 0 and len(hot) > 0
    assert np.array_equal(np.flatnonzero(np.asarray(ggml.get_data(sl.gpu_idx))), hot)
    rb = ggml.row_size(ly.ffn_up.type, 576)
    up_rows = np.asarray(ggml.get_data(ly.ffn_up)).reshape(-1).view(np.uint8).reshape(1536, rb)[hot]
    assert np.array_equal(np.asarray(ggml.get_data(sl.ffn_up_gpu)).reshape(-1).view(np.uint8), up_rows.reshape(-1))
    plan = lp.offload_plan(split, int(0.25 * (1 << 30)))
    assert [s[0] for s in plan["steps"]] == ["attention", "predictor", "ffn_norm", "output", "kv_cache"]
    assert plan["neuron_bytes"] == int(0.25 * (1 << 30)) - sum(s[1] for s in plan["steps"])
    assert lp.offload_plan(split, 1 << 20)["neuron_bytes"] == 0        # attention does not fit: no FFN split
    ids = pipeline.corpus_tokens(split.vocab, 4)

    def capture(model):
        got = {}

        def cb(t, ask):
            if ask:
                return t.name.endswith(f"-{il}") and t.name.startswith(("ffn_up_sparse", "ffn_out"))
            got[t.name] = np.array(ggml.get_data(t), np.float32)
            return True
        ctx = pipeline._ctx(model, 16, 2)
        ctx.cparams.cb_eval = cb
        try:
            assert llama.decode(ctx, pipeline._batch_all_logits(ids)) == 0
        finally:
            llama.free(ctx)
        return got
    old = cpu_pi.set_sparse_pred_threshold(-1.0)
    try:
        a, b = capture(split), capture(cpu_only)
    finally:
        cpu_pi.set_sparse_pred_threshold(old)
    assert f"ffn_up_sparse_gpu-{il}" in a and f"ffn_up_sparse_gpu-{il}" not in b
    assert np.array_equal(a[f"ffn_up_sparse_merged-{il}"], b[f"ffn_up_sparse-{il}"])
    assert np.abs(a[f"ffn_out-{il}"] - b[f"ffn_out-{il}"]).max() <= 1e-5 * np.abs(b[f"ffn_out-{il}"]).max()
    llama.model_free(split)


def test_build_reuses_a_saved_recording(built, tmp_path):
    """--recording: the first build (the ``built`` fixture) saved what it decoded, a smaller build reuses it (no
    decode) and its activation counts are those of the tokens it used (the packed bits of the first tokens + heldout
    rows), not the file's."""
    rec_dir = built.model_path.parent / "rec"
    rec = pipeline.load_recording(rec_dir)
    assert rec.n_tokens == 96 and rec.x[0].shape == (96, 576) and rec.active[0].shape == (96, 1536 // 8)
    r = pipeline.build(tmp_path / "b", MODEL, tokens=32, heldout=16, seq_len=64, epochs=1, quiet=True,
                       recording=rec_dir)
    assert r.metrics["record_s"] == pytest.approx(rec.seconds, abs=0.1)      # the saved recording's time: reused
    counts = np.load(tmp_path / "b" / "activation" / "activation_3.npy")
    assert np.array_equal(counts, pipeline.unpack_active(rec.active[3][:48], 1536).sum(0))
    assert counts.sum() < rec.counts[3].sum()
