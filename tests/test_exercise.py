"""Predict, then reveal: every exercise of notebooks 01-06 computes its answer from a real run, accepts the right
answer (typed as a learner would) and rejects a wrong one; the static rendering keeps the answer folded."""
from __future__ import annotations

import re

import numpy as np
import pytest

from ggviz import ggml, llama, trace
from ggviz.capture import decode_graph, decode_step
from ggviz.ggml import accel, backend
from ggviz.ggml import sched as S
from ggviz.viz.widgets import Exercise
from ggviz.viz.widgets import exercise as ex
from ggviz.viz.widgets.sched_view import SchedulerView
from ggviz.viz.widgets.timeline import timeline_data

F32, Q4_0 = ggml.GGML_TYPE_F32, ggml.GGML_TYPE_Q4_0


def _right_and_wrong(e: Exercise, right: str, wrong: str):
    assert e.check(right), (e.question, right, e.answer)
    assert not e.check(wrong), (e.question, wrong, e.answer)
    assert e.state()["attempts"] == 2 and e.state()["last_correct"] is False
    assert e.state()["answer"] is None                        # not shown before reveal
    assert e.reveal().state()["answer"] == e.answer


def test_exercise_widget_checks_reveals_and_folds():
    e = Exercise("How many?", np.int64(7), explain="because", unit="bytes")
    assert e.answer == 7 and isinstance(e.answer, int)
    assert e.is_correct("7") and e.is_correct(" 7 bytes") and e.is_correct(7) and not e.is_correct("7.5")
    assert not e.is_correct("") and not e.is_correct("7 8")
    html = e.to_html()
    assert "<details" in html and "How many?" in html
    assert html.index("<summary>") < html.index("Answer:")   # the answer sits inside the folded part
    e.widget
    e._w_in.value = "6"
    e._w_check.click()
    assert "not quite" in e._w_fb.value and "Answer" not in e._w_fb.value
    e._w_reveal.click()
    assert "Answer" in e._w_fb.value and "7 bytes" in e._w_fb.value
    f = Exercise("ratio?", 2.5, rel_tol=0.1)
    assert f.is_correct("2.6") and not f.is_correct("3")
    c = Exercise("which?", "BLAS", choices=["CPU", "BLAS"])
    assert c.is_correct("blas") and not c.is_correct("CPU")
    with pytest.raises(ValueError, match="not one of the choices"):
        Exercise("which?", "GPU", choices=["CPU", "BLAS"])
    with pytest.raises(ValueError, match="needs the value"):
        Exercise("q", None)


def test_nb01_nb02_tensor_exercises():
    ctx = ggml.init(1 << 20)
    a = ggml.new_tensor_2d(ctx, F32, 2, 3)
    e = ex.permute_nb(a)
    assert e.answer == (8, 4, 24, 24)                        # by hand: nb[0] and nb[1] swap places
    _right_and_wrong(e, "[8, 4, 24, 24]", "4 8 24 24")
    c = ggml.new_tensor_2d(ctx, Q4_0, 64, 3)
    assert ex.permute_nb(c, (0, 2, 1, 3)).answer == tuple(int(c.nb[i]) for i in (0, 2, 1, 3))
    used = ggml.used_mem(ctx)
    e = ex.tensor_cost(F32, (3, 5))
    assert e.answer == ggml.GGML_OBJECT_SIZE + ggml.GGML_PAD(ggml.GGML_TENSOR_SIZE + 60, ggml.GGML_MEM_ALIGN)
    _right_and_wrong(e, str(e.answer), str(60))
    e = ex.view_cost(a)
    assert e.answer == ggml.GGML_OBJECT_SIZE + ggml.GGML_TENSOR_SIZE
    _right_and_wrong(e, f"{e.answer} bytes", str(e.answer + ggml.nbytes(a)))
    assert ggml.used_mem(ctx) == used                        # the questions leave the learner's context as it was


def test_nb03_graph_exercises(model):
    ctx = ggml.init(1 << 20)
    x = ggml.set_name(ggml.new_tensor_1d(ctx, F32, 4), "x")
    W = ggml.set_name(ggml.new_tensor_2d(ctx, F32, 4, 4), "W")
    b = ggml.set_name(ggml.new_tensor_1d(ctx, F32, 4), "b")
    u = ggml.mul_mat(ctx, W, x)
    out = ggml.add(ctx, ggml.add(ctx, ggml.mul(ctx, u, u), b), u)
    e = ex.graph_counts(out)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, out)
    assert e.answer == (gf.n_nodes, gf.n_leafs) == (4, 3)
    _right_and_wrong(e, "4 nodes, 3 leafs", "6, 3")
    gfd = decode_graph(model).gf
    e = ex.layer_node_count(gfd, 0)
    assert e.answer == sum(1 for t in gfd.nodes if re.search(r"(-0|_l0)\b", t.name)) > 20    # Qcur-0 (view), cache_k_l0
    _right_and_wrong(e, str(e.answer), str(e.answer + 1))


def test_nb04_gallocr_exercise():
    gctx = ggml.init(1 << 20, no_alloc=True)
    x = ggml.new_tensor_2d(gctx, F32, 64, 8)
    w = ggml.new_tensor_2d(gctx, F32, 64, 256)
    h = ggml.silu(gctx, ggml.mul_mat(gctx, w, ggml.rms_norm(gctx, x, 1e-5)))
    gf = ggml.new_graph(gctx)
    ggml.build_forward_expand(gf, ggml.soft_max(gctx, h))
    e = ex.gallocr_size_kib(gf, backend.backend_cpu_buffer_type())
    assert all(t.data is None or t.data == 0 for t in gf.nodes)      # planning touched no tensor
    everything = list(gf.nodes) + list(gf.leafs)
    # at least the largest tensor (the weight), less than every tensor side by side (reuse saves some)
    assert ggml.nbytes(w) <= e.answer * 1024 < sum(ggml.nbytes(t) for t in everything)
    _right_and_wrong(e, f"{e.answer * 1.05:.2f}", f"{e.answer * 1.5:.2f}")


def test_nb05_splits_exercise(model):
    gpu = accel.backend_accel_device_new("ACCEL0")
    mp = llama.model_default_params()
    mp.devices, mp.n_gpu_layers, mp.use_extra_bufts = [gpu], 10, False
    m = llama.model_load_from_file(model.path, mp)
    cp = llama.context_default_params()
    cp.n_ctx, cp.flash_attn_type = 256, 0
    c = llama.init_from_model(m, cp)
    with trace.recording(SchedulerView.KINDS) as rec:
        S.backend_sched_reset(c.sched)
        res = c.build_graph(1, 1, 256)
        assert S.backend_sched_alloc_graph(c.sched, res.gf)
    e = ex.n_splits(SchedulerView(c.sched, res.gf, rec), 10)
    assert e.answer == S.backend_sched_get_n_splits(c.sched) > 1
    _right_and_wrong(e, str(e.answer), str(e.answer + 1))


def test_nb06_thread_exercises(model):
    step = decode_step("The ggml library is", threads=2, model=model)
    d = timeline_data(step.events)
    e = ex.chunk_thread(d, "ffn_up-0", 1)
    chunks = [c for c in d["chunks"] if c["name"] == "ffn_up-0" and c["chunk"] == 1]
    assert e.answer == chunks[0]["ith"] in (0, 1)
    _right_and_wrong(e, f"thread {e.answer}", str(1 - e.answer))
    with pytest.raises(ValueError, match="computed 0 times"):
        ex.chunk_thread(d, "ffn_up-0", 10_000)
    gf = step.graph.gf
    reshape = next(t for t in gf.nodes if ggml.op_desc(t).startswith("RESHAPE"))
    e = ex.n_tasks(reshape, 4)
    assert e.answer == 1
    _right_and_wrong(e, "1", "4")
    mm = next(t for t in gf.nodes if t.op == ggml.GGML_OP_MUL_MAT)
    assert ex.n_tasks(mm, 4).answer == 4


def test_exercise_kinds_are_labelled_and_checked():
    kinds = {k: Exercise("q?", 3, kind=k) for k in ("predict", "rerun", "why")}
    for k, e in kinds.items():
        html = e.to_html()
        assert f"data-kind='{k}'" in html and e.state()["kind"] == k
        assert html.index("<details") < html.index("class='ggv-answer'") < html.index("Answer:")
    assert "Change, predict, rerun." in kinds["rerun"].to_html() and "<b>Explain.</b>" in kinds["why"].to_html()
    with pytest.raises(ValueError, match="kind 'guess'"):
        Exercise("q?", 3, kind="guess")
