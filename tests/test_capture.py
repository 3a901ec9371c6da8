"""ggviz.capture without a model: the eval callback copies what it is asked to and numbers it by node; records go
to disk and come back equal; anything that is not plain data is refused, naming where it is; a graph's record draws
the pictures the graph draws."""
from __future__ import annotations

import numpy as np
import pytest

from ggviz import capture, ggml
from ggviz.capture import records
from ggviz.viz import graph_dot as G
from ggviz.viz.widgets.graph import GraphView


@pytest.fixture
def graph():
    """x (F32 [4]), y = x * 2 (SCALE), z = y + x (ADD), i (I32 [3]): a computed graph of real ggml tensors."""
    ctx = ggml.init(1 << 20)
    x = ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4)
    ggml.set_name(x, "x")
    ggml.get_data(x)[...] = np.arange(4, dtype=np.float32)
    y = ggml.set_name(ggml.scale(ctx, x, 2.0), "y-0")
    z = ggml.set_name(ggml.add(ctx, y, x), "z-1")
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, z)
    ggml.graph_compute_with_ctx(ctx, gf, 1)
    i = ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_I32, 3)
    ggml.get_data(i)[...] = [7, -1, 3]
    return ctx, gf, x, y, z, i


def test_eval_callback_copies_what_it_wants_numbered_by_node(graph):
    _, gf, x, y, z, i = graph
    cb = capture.EvalCallback(lambda t: capture.layer_of(t.name) == 1)
    assert [cb(t, True) for t in gf.nodes] == [False, True]          # asked: only layer 1's node
    assert cb(z, False) is True and cb(i, False) is True
    vals = cb.number(gf)
    assert [(v.name, v.op, v.type, v.shape, v.src, v.node_n) for v in vals] == [
        ("z-1", "ADD", "f32", [4, 1, 1, 1], ["y-0", "x"], 1), ("", "NONE", "i32", [3, 1, 1, 1], [], None)]
    assert vals[0].data.dtype == np.float32 and vals[0].data.reshape(-1).tolist() == [0.0, 3.0, 6.0, 9.0]
    assert vals[1].data.dtype == np.int32 and vals[1].data.reshape(-1).tolist() == [7, -1, 3]   # ints stay ints
    z_data = ggml.get_data(z)
    z_data[...] = 0                                                  # a copy, not a view of the tensor's memory
    assert vals[0].data.reshape(-1).tolist() == [0.0, 3.0, 6.0, 9.0]
    assert capture.copy_f32(i).dtype == np.float32


def test_eval_callback_sink_and_unreadable(graph):
    _, gf, x, y, z, _ = graph
    seen = []
    cb = capture.EvalCallback(sink=lambda t, a: seen.append((t.name, a.sum())) or t.name != "y-0")
    assert cb(z, False) is True and cb(y, False) is False            # the sink's False stops the compute
    assert seen == [("z-1", 18.0), ("y-0", 12.0)] and cb.values == []

    def bad(t):
        raise NotImplementedError("no reader")
    with pytest.raises(NotImplementedError):
        capture.EvalCallback(copy=bad)(z, False)
    skip = capture.EvalCallback(copy=bad, skip_unreadable=True)
    assert skip(z, False) is True and skip.values == []


def test_records_round_trip(graph, tmp_path):
    _, gf, _, _, z, _ = graph
    cb = capture.EvalCallback()
    cb(z, False)
    cb.number(gf)
    snap = capture.DecodeSnapshot(n_tokens=2, n_kv=256, tokens=np.array([1, 2], np.int32),
                                  pos=np.array([0, 1], np.int32), kq_mask=np.array([[0, -np.inf], [0, 0]], np.float32),
                                  cells_pos=np.arange(4), cells_seq=[[0], [0]], k_idxs=np.array([0, 1]), kv_size=4,
                                  head=2, cache="base", layers=[0, 1], n_swa=0)
    snap.swa = capture.DecodeSnapshot(n_tokens=2, n_kv=2, tokens=snap.tokens, pos=snap.pos, kq_mask=snap.kq_mask,
                                      cells_pos=np.arange(2), cells_seq=[[0]], k_idxs=np.array([0]), kv_size=2,
                                      head=0, cache="SWA", n_swa=512)
    rec = {"values": cb.values, "snap": snap, "by_layer": {0: np.float32(0.5), 29: None}, "t": (1, "a", 2.5, True),
           "inf": -np.inf}
    back = records.load(records.save(rec, tmp_path / "r.npz"))
    assert back["values"][0].name == "z-1" and back["values"][0].node_n == 1
    assert np.array_equal(back["values"][0].data, cb.values[0].data) and back["values"][0].data.dtype == np.float32
    s = back["snap"]
    assert isinstance(s, capture.DecodeSnapshot) and isinstance(s.swa, capture.DecodeSnapshot) and s.swa.n_swa == 512
    assert np.array_equal(s.kq_mask, snap.kq_mask) and s.cells_seq == [[0], [0]] and s.tokens.dtype == np.int32
    assert back["by_layer"] == {0: np.float32(0.5), 29: None} and type(back["by_layer"][0]) is np.float32
    assert back["t"] == (1, "a", 2.5, True) and back["inf"] == -np.inf


def test_records_refuse_what_is_not_plain_data(graph, tmp_path):
    ctx, _, x, _, _, _ = graph
    path = tmp_path / "r.npz"
    with pytest.raises(TypeError, match=r"record\[1\]\.src.*Tensor is not plain data"):
        records.save([0, capture.NodeValue("x", "NONE", "f32", [4], x, np.zeros(4))], path)
    with pytest.raises(TypeError, match="object array"):
        records.save({"a": np.array([None, 1])}, path)
    with pytest.raises(TypeError, match="dict key"):
        records.save({(1, 2): 0}, path)
    assert not path.exists()                                          # nothing written
    np.savez(path, x=np.zeros(2))
    with pytest.raises(ValueError, match="not a ggviz record"):
        records.load(path)


def test_graph_record_draws_the_same_picture(tmp_path):
    """A graph recorded (``capture_graph``), saved and loaded back, read as a cgraph: the same tensors (names, ops
    with their op_params -- a UNARY node's function --, types, shapes, strides, source slots, view sources) and the
    same pictures, byte for byte, as the live graph; a graph view's source from outside it is kept as a tensor."""
    ctx = ggml.init(1 << 20)
    x = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 4, 2), "x")
    w = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F16, 4), "blk.0.w")
    a = ggml.set_name(ggml.silu(ctx, ggml.mul(ctx, x, w)), "a-0")
    v = ggml.set_name(ggml.view_1d(ctx, a, 4, 16), "a-0 (view)")
    b = ggml.set_name(ggml.add(ctx, ggml.reshape_2d(ctx, v, 2, 2), ggml.reshape_2d(ctx, v, 2, 2)), "b-1")
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, b)
    part = ggml.graph_view(gf, 2, gf.n_nodes)             # its first node reads a tensor of the nodes left out
    for g in (gf, part):
        rec = capture.load(capture.save(capture.capture_graph(g), tmp_path / "graph.npz"))
        assert isinstance(rec, capture.GraphRecord)
        rg = rec.cgraph()
        assert (rg.n_nodes, rg.n_leafs) == (g.n_nodes, g.n_leafs)
        for t, r in zip(list(g.nodes) + list(g.leafs), rg.nodes + rg.leafs):
            assert (r.name, r.op, r.type, r.shape, r.strides, r.view_offs, r.addr, r.data) == (
                t.name, t.op, t.type, t.shape, t.strides, t.view_offs, t.addr, t.data)
            assert ggml.op_desc(r) == ggml.op_desc(t) and np.array_equal(r.op_params, t.op_params)
            assert [s and (s.name, s.addr) for s in r.src] == [s and (s.name, s.addr) for s in t.src]
            assert (r.view_src and r.view_src.name) == (t.view_src and t.view_src.name)
        for kw in ({}, {"collapse": "all", "legend": True}, {"highlight": [1], "color_by": "type"}):
            assert G.graph_to_dot_grouped(rg, **kw)[0].source == G.graph_to_dot_grouped(g, **kw)[0].source
        assert G.graph_to_dot(rg).source == G.graph_to_dot(g).source
        live, back = GraphView(g), GraphView(rec)
        assert back.svg().replace(back.prefix[:-1], live.prefix[:-1]) == live.svg()   # (each view numbers its ids)
    assert "silu" in G.graph_to_dot(gf).source.lower() and "x0" in G.graph_to_dot_grouped(part)[0].source
