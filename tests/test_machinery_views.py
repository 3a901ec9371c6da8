"""AllocatorView and SchedulerView (ggviz/viz/widgets/alloc_view.py, sched_view.py) against the engine's own records.

Headless (no browser, no Jupyter): every check compares a view's ``state()`` with what ggml-alloc / the scheduler
recorded themselves, never with numbers typed in here.

1. AllocatorView, on a small graph planned by a ``ggml_gallocr`` and on one SmolLM2 decode planned through the
   scheduler (CPU only; and with 10 layers on a simulated accelerator: two buffers): every rectangle is a
   ``galloc.last_alloc`` entry (offset, size, alloc node, free node); no two rectangles alive at the same node share
   a byte unless one hands its memory over to the other in place at that node; nothing reaches past the buffer the
   plan reserved; the records rebuilt from the ``alloc.*`` trace events equal ``last_alloc``; ``select`` lists what
   is alive; the static renders are PNGs.
2. SchedulerView, on the mini model of tests/test_sched.py (an accelerator without RMS_NORM; BLAS upgrading a
   MUL_MAT in pass 3) and on SmolLM2 decode plans with -ngl 0 / 10 / 31: the last snapshot equals
   ``sched.last_plan`` and ``backend_sched_get_tensor_cause`` node by node; the snapshots are monotone the way ggml
   is (a node keeps its backend once set, except pass 3's "3.upg" to a higher-priority backend with the same buffer
   type); the splits, their inputs and copies equal the scheduler's.
3. Both views drawn from their records (``capture.AllocRecord``, ``capture.SchedRecord``) saved to disk and loaded
   back: the same PNG, HTML and state as the live views.
"""
from __future__ import annotations

import os

import pytest
from ggviz import capture, ggml as gg, trace
from ggviz.ggml import accel, blas
from ggviz.ggml import alloc as A
from ggviz.ggml import backend as B
from ggviz.ggml.cpu import cpu_backend
from ggviz.ggml import sched as S
from ggviz.viz.widgets.alloc_view import AllocatorView, records_from_events
from ggviz.viz.widgets.sched_view import STAGES, SchedulerView
from tests.test_sched import _accel, build_mini, build_upg, place

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


F32 = gg.GGML_TYPE_F32
MODEL = os.path.join(_ROOT, "data", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PNG = b"\x89PNG\r\n\x1a\n"


# ====================================================================================================
# helpers
# ====================================================================================================

def small_graph():
    """x (input) -> rms_norm -> up (w1 x) -> + b1 -> silu -> down (w2 x) -> + x -> transpose (view) -> cont ->
    soft_max (output). Weights in their own buffer (a tallocr), activations left to the gallocr."""
    wctx = gg.init(8 * gg.tensor_overhead(), no_alloc=True)
    gctx = gg.init(1 << 20, no_alloc=True)
    n, t = 64, 8
    w1 = gg.set_name(gg.new_tensor_2d(wctx, F32, n, 4 * n), "w1.weight")
    b1 = gg.set_name(gg.new_tensor_1d(wctx, F32, 4 * n), "b1.bias")
    w2 = gg.set_name(gg.new_tensor_2d(wctx, F32, 4 * n, n), "w2.weight")
    wbuf = A.backend_alloc_ctx_tensors_from_buft(wctx, B.backend_cpu_buffer_type())
    x = gg.set_name(gg.new_tensor_2d(gctx, F32, n, t), "x")
    gg.set_input(x)
    h = gg.set_name(gg.rms_norm(gctx, x, 1e-5), "norm")
    h = gg.set_name(gg.mul_mat(gctx, w1, h), "up")
    h = gg.set_name(gg.add(gctx, h, b1), "up_b")
    h = gg.set_name(gg.silu(gctx, h), "act")
    y = gg.set_name(gg.mul_mat(gctx, w2, h), "down")
    y = gg.set_name(gg.add(gctx, y, x), "res")
    y = gg.set_name(gg.cont(gctx, gg.set_name(gg.transpose(gctx, y), "res_T")), "res_T_cont")
    out = gg.set_name(gg.soft_max(gctx, y), "probs")
    gg.set_output(out)
    gf = gg.new_graph(gctx)
    gg.build_forward_expand(gf, out)
    return gf, (wctx, gctx, wbuf)


def check_allocator_view(v: AllocatorView, galloc) -> dict:
    """The invariants of the chart, for every buffer (space) of the view. Returns {space name: state}."""
    la = galloc.last_alloc
    out = {}
    for sp in v.spaces:
        v.set_space(sp["index"])
        st = v.state()
        ids = set(sp["buffer_ids"])
        want = sorted(((r["name"], r["chunk"], r["offset"], r["alloc_size"], r["alloc_node"], r["free_node"])
                       for r in la["tensors"] if r["view_src"] is None and r["offset"] is not None
                       and r["alloc_size"] > 0 and r["buffer_id"] in ids), key=repr)
        got = sorted(((r["name"], r["chunk"], r["offset"], r["size"], r["alloc_node"], r["free_node"])
                      for r in st["rects"]), key=repr)
        assert got == want, sp["name"]
        # the reserved buffer: the plan's chunk sizes, and the buffer the gallocr really allocated
        assert st["chunk_sizes"] == la["chunk_sizes"][sp["buffer_ids"][0]]
        assert st["buffer_size"] == A.gallocr_get_buffer_size(galloc, sp["buffer_ids"][0]) or \
            st["buffer_size"] <= st["allocated_size"]
        for r in st["rects"]:
            assert r["offset"] + r["size"] <= st["chunk_sizes"][r["chunk"]], r["name"]
        assert st["max_extent"] <= st["buffer_size"]
        # no two rectangles alive at the same node share bytes, except an in-place hand-over at that node
        rs = st["rects"]
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                if a["chunk"] != b["chunk"] or a["offset"] + a["size"] <= b["offset"] or \
                        b["offset"] + b["size"] <= a["offset"]:
                    continue
                lo, hi = max(a["alloc_node"], b["alloc_node"]), min(a["end_node"], b["end_node"])
                if lo > hi:
                    continue
                handover = ((b["reused_from"] == a["name"] and a["free_node"] == b["alloc_node"] == lo == hi)
                            or (a["reused_from"] == b["name"] and b["free_node"] == a["alloc_node"] == lo == hi))
                assert handover, f"{a['name']} and {b['name']} share bytes at nodes {lo}..{hi}"
        # outputs are never freed; the peak of live bytes fits the buffer
        assert all(r["free_node"] is None for r in rs if r["output"])
        assert st["peak_live_bytes"] <= st["buffer_size"]
        out[sp["name"]] = st
    v.set_space(0)
    return out


def check_alive_listing(v: AllocatorView, node: int):
    v.select(node)
    sel = v.state()["selected"]
    alive = {r["name"] for r in sel["alive"]}
    want = {r["name"] for r in v.state()["rects"] if r["alloc_node"] <= node <= r["end_node"]}
    assert alive == want
    assert {r["name"] for r in sel["allocated"]} <= alive
    return sel


def check_png(data: bytes, path=None):
    assert data[:8] == PNG and len(data) > 5000
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)


def _load(ngl=0, devices=True, ops=None):
    if not os.path.exists(MODEL):
        pytest.skip("SmolLM2 model not downloaded")
    from ggviz import llama
    mp = llama.model_default_params()
    if devices:
        mp.devices = [accel.backend_accel_device_new("ACCEL0", supported_ops=ops)]
    mp.n_gpu_layers = ngl
    mp.use_extra_bufts = False
    model = llama.model_load_from_file(MODEL, mp)
    cp = llama.context_default_params()
    cp.n_ctx, cp.flash_attn_type = 256, llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.use_blas = True                  # the views show BLAS sharing the CPU's buffer type and taking MUL_MATs
    return llama.init_from_model(model, cp)


def plan_decode(ctx, n_tokens=1):
    """llama_context's graph step (reset, build with the norm pins, ggml_backend_sched_alloc_graph) recorded."""
    with trace.recording(SchedulerView.KINDS + ("alloc.alloc", "alloc.reuse", "alloc.free", "alloc.view",
                                                "alloc.reserve")) as rec:
        S.backend_sched_reset(ctx.sched)
        res = ctx.build_graph(n_tokens, 1, 256)
        assert S.backend_sched_alloc_graph(ctx.sched, res.gf)
    return res, rec


def check_scheduler_view(sv: SchedulerView, sched, graph):
    st = sv.state()
    plan = sched.last_plan
    # the final snapshot is the scheduler's own record, node by node (and leaf by leaf)
    assert [(a["backend"], a["cause"]) for a in sv.assignment("5")] == \
        [(n["backend"], n["cause"]) for n in plan["nodes"]]
    for a, t in zip(sv.assignment("5"), graph.nodes):
        assert a["cause"] == S.backend_sched_get_tensor_cause(sched, t)
        tb = S.backend_sched_get_tensor_backend(sched, t)
        assert a["backend"] == (B.backend_name(tb) if tb is not None else None)
    assert [(x["backend"], x["cause"]) for x in sv.leaf_assignment("5")] == \
        [(x["backend"], x["cause"]) for x in plan["leafs"]]
    # monotone the way ggml is: once set, a backend only changes by pass 3's upgrade
    prio_buft = sched.bufts
    for kind, snaps in (("node", [sv.snapshots[s]["backend"] for s in STAGES]),
                        ("leaf", [sv.snapshots[s]["leaf_backend"] for s in STAGES])):
        for i in range(len(snaps[0])):
            for k in range(1, len(STAGES)):
                before, after = snaps[k - 1][i], snaps[k][i]
                if before == -1 or before == after:
                    continue
                cause = sv.snapshots[STAGES[k]]["cause" if kind == "node" else "leaf_cause"][i]
                assert STAGES[k] == "3" and cause == "3.upg", (kind, i, STAGES[k], before, after, cause)
                assert after < before and prio_buft[after] is prio_buft[before]
    # the splits and copies
    assert st["n_splits"] == S.backend_sched_get_n_splits(sched) == plan["n_splits"]
    assert [(s["backend"], s["i_start"], s["i_end"], [(x["name"], x["copy"]) for x in s["inputs"]])
            for s in st["splits"]] == \
        [(s["backend"], s["i_start"], s["i_end"], [(x["name"], x["copy"]) for x in s["inputs"]])
         for s in plan["splits"]]
    assert st["n_inputs"] == plan["n_inputs"]
    assert st["copies_per_backend"] == plan["copies_per_backend"]
    for s in st["splits"]:
        for x in s["inputs"]:
            assert x["copy"] == f"{s['backend']}#{x['name']}#0"
    return st


# ====================================================================================================
# 1. AllocatorView
# ====================================================================================================

def test_allocator_view_small_graph(tmp_path):
    gf, keep = small_graph()
    no_reuse = A.backend_alloc_ctx_tensors_from_buft_size(keep[1], B.backend_cpu_buffer_type())
    galloc = A.gallocr_new(B.backend_cpu_buffer_type())
    with trace.recording(["alloc.alloc", "alloc.reuse", "alloc.free", "alloc.view", "alloc.reserve"]) as rec:
        assert A.gallocr_reserve(galloc, gf)
    assert A.gallocr_alloc_graph(galloc, gf)
    v = AllocatorView(galloc, gf)
    st = check_allocator_view(v, galloc)["CPU"]
    # reuse: the plan needs less than every tensor in its own slot (what a tallocr over the context would take)
    assert st["buffer_size"] < st["sum_sizes"] <= no_reuse
    assert st["n_reused"] >= 3 and st["never_freed"] == ["probs"] and st["n_outputs"] == 1
    # the one view (transpose) sits on its source
    (view,) = [x for x in st["views"] if x["name"] == "res_T"]
    assert view["view_src"] == "res" and v._by_id[view["src_id"]]["name"] == "res"
    # the records rebuilt from the events are last_alloc's
    keys = ("name", "buffer_id", "chunk", "offset", "size", "alloc_size", "alloc_node", "free_node", "reused_from",
            "reused_by", "view_src", "extra_freed")
    ev = {r["addr"]: r for r in records_from_events(rec)}
    la = {r["addr"]: r for r in galloc.last_alloc["tensors"]}
    assert ev.keys() == la.keys()
    for k in la:
        assert {f: ev[k][f] for f in keys} == {f: la[k][f] for f in keys}, la[k]["name"]
    # the same view built from the plan alone
    assert AllocatorView(plan=galloc.last_alloc).state()["rects"] == st["rects"]
    # select: node 4 (down) allocates, frees act; node 5 (res) takes down's bytes in place
    sel = check_alive_listing(v, 4)
    assert [r["name"] for r in sel["allocated"]] == ["down"] and [r["name"] for r in sel["freed"]] == ["act"]
    sel = check_alive_listing(v, 5)
    assert sel["handed_over"][0]["name"] == "down" and sel["handed_over"][0]["to"] == "res"
    v.select("res_T_cont")
    assert v.state()["selected"]["node"] == 7
    check_png(v.png(), tmp_path / "alloc_small.png")
    assert "<img" in v.to_html() and "alive at this node" in v.to_html()


def test_allocator_view_smollm2_decode(tmp_path):
    ctx = _load(0, devices=False)
    # the context reserved the worst case (a 256-token pp graph) at creation, and a decode graph fits in that plan
    # (ggml_gallocr_alloc_graph does not re-plan it); to draw the decode graph's own plan, give it a scheduler that
    # has not reserved anything yet
    from ggviz.llama.graph import graph_max_nodes
    ctx.sched = S.backend_sched_new(ctx.backends, ctx.backend_buft, len(ctx.backends), graph_max_nodes(ctx.model),
                                    False, True)
    res, rec = plan_decode(ctx)
    galloc = ctx.sched.galloc
    v = AllocatorView(galloc, ctx.sched.graph)
    assert len(v.spaces) == 1 and v.spaces[0]["buffer_ids"] == [0, 1]      # BLAS and CPU share the CPU buffer type
    st = check_allocator_view(v, galloc)["CPU"]
    # never freed: the logits (a graph output) and inp_embd, the vector-embeddings input no node reads (llama.cpp's
    # build_inp_embd puts it in the graph through ggml_build_forward_select; it takes memory in the compute buffer)
    assert st["n_reused"] > 100 and st["never_freed"] == ["inp_embd", "result_output"]
    assert st["collapsed"] and st["n_external_views"] > 0               # tiny inputs; KV-cache views
    assert st["buffer_size"] == S.backend_sched_get_buffer_size(ctx.sched, ctx.backends[-1]) + \
        S.backend_sched_get_buffer_size(ctx.sched, ctx.backends[0])
    # records from the events of the scheduler's reserve
    ev = {r["addr"]: r for r in records_from_events(rec, id(galloc))}
    for r in galloc.last_alloc["tensors"]:
        e = ev[r["addr"]]
        assert (e["offset"], e["alloc_node"], e["free_node"], e["reused_from"]) == \
            (r["offset"], r["alloc_node"], r["free_node"], r["reused_from"]), r["name"]
    check_alive_listing(v, 30)
    check_png(v.png(), tmp_path / "alloc_decode.png")
    v.set_range(0, 40)
    check_png(v.png(), tmp_path / "alloc_decode_layer0.png")


def test_allocator_view_two_buffers(tmp_path):
    ctx = _load(10)
    res, rec = plan_decode(ctx)
    v = AllocatorView(ctx.sched.galloc, ctx.sched.graph)
    assert [s["name"] for s in v.spaces] == ["ACCEL0", "CPU"]
    sts = check_allocator_view(v, ctx.sched.galloc)
    # the accelerator's buffer holds the copies of the graph inputs
    assert any(r["name"].startswith("ACCEL0#") for r in sts["ACCEL0"]["rects"])
    assert not any(r["name"].startswith("ACCEL0#") for r in sts["CPU"]["rects"])
    # 3. the records the two views draw, saved to disk and loaded back (the context gone): the same views
    sv = SchedulerView(ctx.sched, res.gf, rec)
    saved_a, saved_s = capture.save(v.record, tmp_path / "alloc.npz"), capture.save(sv.record, tmp_path / "sched.npz")
    pngs = {"alloc": v.set_space(1).png(), "sched": sv.select_split(1).goto_pass("2.2").png()}
    html = {"alloc": v.select(30).to_html(), "sched": sv.to_html()}
    states = {"alloc": v.state(), "sched": sv.state()}
    del ctx, res, rec
    v2 = AllocatorView(capture.load(saved_a)).set_space(1)
    sv2 = SchedulerView(capture.load(saved_s)).select_split(1).goto_pass("2.2")
    assert (v2.png(), sv2.png()) == (pngs["alloc"], pngs["sched"])
    assert (v2.select(30).to_html(), sv2.to_html()) == (html["alloc"], html["sched"])
    assert (v2.state(), sv2.state()) == (states["alloc"], states["sched"])


# ====================================================================================================
# 2. SchedulerView
# ====================================================================================================

def test_scheduler_view_accel_without_rms_norm(tmp_path):
    dev, acc = _accel(accel.DEFAULT_SUPPORTED_OPS - {gg.GGML_OP_RMS_NORM})
    ns = build_mini()
    for il in range(2):
        place(ns, il, B.backend_dev_buffer_type(dev))
    sched = S.backend_sched_new([acc, cpu_backend.backend_cpu_init()], None, 2, 256, False, True)
    sv = SchedulerView.capture(sched, ns.gf)
    st = check_scheduler_view(sv, sched, ns.gf)
    # pass by pass (the derivation in tests/test_sched.py::test_accel_without_rms_norm_splits_around_every_rms_norm)
    names = sv.node_names

    def at(stage):
        return {names[i]: (a["backend"], a["cause"]) for i, a in enumerate(sv.assignment(stage))}

    assert at("1")["h-0"] == ("ACCEL0", "1.wgt0") and at("1")["out-0"] == (None, "")
    assert at("2.1")["out-0"] == ("ACCEL0", "2.sup") and at("2.4")["norm-1"] == (None, "")
    assert at("3")["norm-0"] == at("3")["norm-1"] == ("CPU", "3.best")
    sv.goto_pass("2.1")
    assert sv.state()["changed"] == [names.index("out-0"), names.index("out-1")]
    leafs = {x["name"]: (x["backend"], x["cause"]) for x in sv.leaf_assignment("1")}
    assert leafs["x"] == ("CPU", "1.inp") and leafs["blk.0.w.weight"] == ("ACCEL0", "1.dst")
    assert st["graph_inputs"] == ["x"]
    assert [[x["copy"] for x in s["inputs"]] for s in st["splits"]] == \
        [[], ["ACCEL0#norm-0#0", "ACCEL0#x#0"], ["CPU#out-0#0"], ["ACCEL0#norm-1#0"]]
    # stepping wraps around; the split selection lists its inputs
    sv.goto_pass("5").step_pass()
    assert sv.stage == "usr"
    sv.step_pass(-1).select_split(1)
    si = sv.state()["split"]
    assert si["backend"] == "ACCEL0" and [x["from_backend"] for x in si["inputs"]] == ["CPU", "CPU"]
    assert si["copied_bytes"] == 2 * gg.nbytes(ns.nodes["norm-0"])
    check_png(sv.png(), tmp_path / "sched_small.png")
    sv.goto_pass("2.2")
    check_png(sv.png())
    assert "<img" in sv.to_html() and "nodes assigned by this pass" not in sv.to_html()   # 2.2 changes nothing


def test_scheduler_view_user_pin_and_pass3_upgrade():
    # a user pin ("usr") before pass 1
    dev, acc = _accel()
    blas_b, cpu = blas.backend_blas_init(), cpu_backend.backend_cpu_init()
    ns = build_mini()
    place(ns, 0, B.backend_cpu_buffer_type())
    place(ns, 1, B.backend_dev_buffer_type(dev))
    sched = S.backend_sched_new([acc, blas_b, cpu], None, 3, 256, False, True)
    sv = SchedulerView.capture(sched, ns.gf,
                               setup=lambda: S.backend_sched_set_tensor_backend(sched, ns.nodes["norm-1"], cpu))
    check_scheduler_view(sv, sched, ns.gf)
    assert [(a["name"], a["cause"]) for a in sv.assignment("usr") if a["backend"]] == [("norm-1", "usr")]
    # BLAS takes a MUL_MAT by upgrading it in pass 3: the one allowed change of an assigned node
    ns2 = build_upg(B.GGML_BACKEND_BUFFER_USAGE_ANY)
    sched2 = S.backend_sched_new([blas.backend_blas_init(), cpu_backend.backend_cpu_init()], None, 2, 64, False, True)
    sv2 = SchedulerView.capture(sched2, ns2.gf)
    check_scheduler_view(sv2, sched2, ns2.gf)
    h = sv2.node_names.index("h")
    assert [sv2.snapshots[s]["backend"][h] for s in ("2.2", "2.3", "3")] == [-1, 1, 0]
    assert sv2.snapshots["3"]["cause"][h] == "3.upg"
    assert sv2.state()["n_splits"] == 3 and sv2.state()["n_inputs"] == 0       # one buffer type: no copies


@pytest.mark.parametrize("ngl,n_splits,n_inputs", [(0, 1, 0), (10, 3, 8), (31, 2, 6)])
def test_scheduler_view_smollm2(tmp_path, ngl, n_splits, n_inputs):
    ctx = _load(ngl)
    res, rec = plan_decode(ctx)
    sv = SchedulerView(ctx.sched, res.gf, rec)
    st = check_scheduler_view(sv, ctx.sched, res.gf)
    assert (st["n_splits"], st["n_inputs"]) == (n_splits, n_inputs)
    # llama.cpp pins every layer's norms (attention and FFN: both are "norm" when the callback names them) to the
    # layer's device for a one-token batch: the RMS_NORMs of the 30 layers, not the output norm
    pinned = [a for a in sv.assignment("usr") if a["cause"] == "usr"]
    assert len(pinned) == 60 and {a["op"] for a in pinned} == {"RMS_NORM"}
    if ngl == 10:
        sv.select_split(1)
        assert sv.state()["split"]["backend"] == "ACCEL0"
        check_png(sv.png(), tmp_path / "sched_ngl10.png")


def test_widgets_follow_the_state():
    """The ipywidgets views (built headless) drive the same actions as the methods."""
    pytest.importorskip("ipywidgets")
    gf, keep = small_graph()
    galloc = A.gallocr_new(B.backend_cpu_buffer_type())
    assert A.gallocr_alloc_graph(galloc, gf)
    v = AllocatorView(galloc, gf)
    w = v.widget
    v._w_node.value = 3
    assert v.node == 3 and "node 3: act" in v._w_info.value and "<img" in v._w_img.value
    v._w_range.value = (2, 6)
    assert v.node_range == (2, 6)
    v.select(8)                                     # outside the window: the window moves, the slider follows
    assert v.node_range[0] <= 8 <= v.node_range[1] and v._w_node.value == 8
    assert w is v.widget

    dev, acc = _accel(accel.DEFAULT_SUPPORTED_OPS - {gg.GGML_OP_RMS_NORM})
    ns = build_mini()
    for il in range(2):
        place(ns, il, B.backend_dev_buffer_type(dev))
    sched = S.backend_sched_new([acc, cpu_backend.backend_cpu_init()], None, 2, 256, False, True)
    sv = SchedulerView.capture(sched, ns.gf, stage="usr")
    sv.widget
    sv._w_next.click()
    assert sv.stage == "1" and sv._w_stage.value == "1" and "1.wgt0" in sv._w_info.value
    sv._w_stage.value = "5"
    sv._w_split.value = 2
    assert sv.split_sel == 2 and "CPU#out-0#0" in sv._w_info.value
    sv._w_prev.click()
    assert sv.stage == "4"
