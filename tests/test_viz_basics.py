"""ggviz.viz: the arena map, header table, strides, DOT export (the demo's tests are in tests/test_demo.py)."""
import pathlib
import re
import shutil

import numpy as np
import pytest

from ggviz import ggml, viz
from ggviz.ggml import quants


def _mixed_context():
    """A context holding every kind of object: tensors (F32, Q4_0, I32), views, a graph, a work buffer."""
    ctx = ggml.init(1 << 20)
    a = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 5, 3), "a")       # 60 bytes: padded
    b = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 5, 3), "b")
    q = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_Q4_0, 64, 3), "q")     # 108 bytes
    ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_I32, 3), "ids")
    ggml.get_data(a)[...] = np.arange(15, dtype=np.float32).reshape(3, 5)
    ggml.get_data(b)[...] = 1.0
    p = ggml.permute(ctx, a, 1, 0, 2, 3)
    v = ggml.view_2d(ctx, a, 2, 3, a.nb[1], 8)
    s = ggml.add(ctx, a, b)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, s)
    ggml.graph_compute_with_ctx(ctx, gf, 1)
    return ctx, dict(a=a, b=b, q=q, p=p, v=v, s=s, gf=gf)


def _check_tiling(rows, used):
    assert rows[0]["start"] == 0
    for r0, r1 in zip(rows, rows[1:]):
        assert r0["end"] == r1["start"], (r0, r1)
    for r in rows:
        assert r["size"] == r["end"] - r["start"] > 0
    assert rows[-1]["end"] == used
    assert sum(r["size"] for r in rows) == used


def test_arena_map_tiles_used_mem_exactly():
    ctx, t = _mixed_context()
    used = ggml.used_mem(ctx)
    for detail in (False, True):
        _check_tiling(viz.arena_map(ctx, detail=detail), used)
    rows = viz.arena_map(ctx)
    kinds = {r["kind"] for r in rows}
    assert {"object header", "tensor struct", "tensor data", "padding", "graph"} <= kinds
    assert sum(r["kind"] == "object header" for r in rows) == len(ctx.objects)
    # data regions sit where the tensors' data pointers say, with nbytes each
    for name in ("a", "b", "q"):
        tt = t[name]
        (d,) = [r for r in rows if r["kind"] == "tensor data" and r["name"] == name]
        assert d["start"] == tt.data - ctx.base and d["size"] == ggml.nbytes(tt)
    # views have a struct and no data
    assert not [r for r in rows if r["kind"] == "tensor data" and r["name"] == t["p"].name]
    # a padded tensor: 336 + 60 -> 400 bytes of payload, 4 of them padding
    a_obj = next(i for i, o in enumerate(ctx.objects) if o.payload is t["a"])
    assert [r["size"] for r in rows if r["obj"] == a_obj] == [32, 336, 60, 4]
    free = viz.arena_map(ctx, include_free=True)[-1]
    assert free["kind"] == "free" and free["end"] == ctx.mem_size


def test_arena_map_work_buffer_and_no_alloc():
    ctx = ggml.init(1 << 20)
    w = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_Q4_0, 64, 2)
    ggml.set_data(w, np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64))
    x = ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 64)
    ggml.get_data(x)[...] = 1.0
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, ggml.mul_mat(ctx, w, x))
    work = ggml.graph_plan(gf, 1).work_size
    assert work > 0
    ggml.graph_compute_with_ctx(ctx, gf, 1)
    rows = viz.arena_map(ctx)
    _check_tiling(rows, ggml.used_mem(ctx))
    wb = [r for r in rows if r["kind"] == "work buffer"]
    assert len(wb) == 1 and wb[0]["size"] == ggml.GGML_PAD(work, ggml.GGML_MEM_ALIGN)

    meta = ggml.init(3 * ggml.tensor_overhead(), no_alloc=True)
    for _ in range(3):
        ggml.new_tensor_2d(meta, ggml.GGML_TYPE_Q4_1, 576, 1536)
    rows = viz.arena_map(meta)
    _check_tiling(rows, ggml.used_mem(meta))
    assert [r["kind"] for r in rows] == ["object header", "tensor struct"] * 3


def test_objects_table_follows_the_list():
    ctx, _ = _mixed_context()
    tab = viz.objects_table(ctx)
    assert len(tab) == len(ctx.objects)
    for r0, r1 in zip(tab, tab[1:]):
        assert r0["next"] == r1["hdr_offs"]
    assert tab[-1]["next"] is None
    assert "graph" in str(tab)


def test_header_table_matches_tensor_fields():
    ctx, t = _mixed_context()
    for name in ("a", "q", "p", "v", "s"):
        tt = t[name]
        tab = viz.tensor_header_table(tt)
        assert sum(r["size"] for r in tab) == 336
        assert [r["offset"] for r in tab] == sorted(r["offset"] for r in tab)
        f = {r["field"]: r["value"] for r in tab}
        st = tt.struct()
        assert f["type"] == tt.type == st["type"]
        assert [f[f"ne[{i}]"] for i in range(4)] == list(tt.shape)
        assert [f[f"nb[{i}]"] for i in range(4)] == list(tt.strides)
        assert f["op"] == tt.op and f["flags"] == tt.flags
        assert f["op_params"] == [int(x) for x in tt.op_params]
        assert [f[f"src[{i}]"] for i in range(10)] == [s.addr if s is not None else 0 for s in tt.src]
        assert f["view_src"] == (tt.view_src.addr if tt.view_src is not None else 0)
        assert f["view_offs"] == tt.view_offs and f["data"] == tt.data and f["name"] == tt.name
        assert f["buffer"] == tt.buffer and f["extra"] == tt.extra
        # the same table decoded from the arena's bytes
        o = next(o for o in ctx.objects if o.payload is tt)
        raw = ggml.get_mem_buffer(ctx)[o.offs:o.offs + 336]
        assert [r["value"] for r in viz.tensor_header_table(tt, raw=raw)] == [r["value"] for r in tab]
    tab = viz.tensor_header_table(t["s"])
    meaning = {r["field"]: r["meaning"] for r in tab}
    assert meaning["op"] == "GGML_OP_ADD" and meaning["src[0]"] == "-> tensor 'a'"
    assert meaning["type"] == "GGML_TYPE_F32"


def test_element_offset_is_address_difference():
    ctx = ggml.init(1 << 20)
    a = ggml.new_tensor_3d(ctx, ggml.GGML_TYPE_F32, 4, 3, 2)
    ggml.get_data(a)[...] = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    views = [a, ggml.permute(ctx, a, 2, 0, 1, 3), ggml.transpose(ctx, a),
             ggml.view_2d(ctx, a, 2, 3, a.nb[1], 4), ggml.view_3d(ctx, a, 3, 2, 2, a.nb[1], a.nb[2], 4),
             ggml.reshape_2d(ctx, a, 6, 4)]
    for t in views:
        arr = ggml.get_data(t)
        base = t.data
        ne = t.shape
        for i3 in range(ne[3]):
            for i2 in range(ne[2]):
                for i1 in range(ne[1]):
                    for i0 in range(ne[0]):
                        addr = arr[i3, i2, i1, i0:].ctypes.data
                        assert viz.element_offset(t, i0, i1, i2, i3) == addr - base
    with pytest.raises(IndexError):
        viz.element_offset(a, 4, 0)
    q = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_Q4_0, 64, 3)
    assert viz.element_offset(q, 33, 2) == 1 * 18 + 2 * 36
    tab = viz.strides_table(q)
    assert [r["nb"] for r in tab] == [18, 36, 108, 108]


def _dot_parse(src):
    nodes = re.findall(r"^\s*((?:node|leaf)_\d+) \[", src, re.M)
    edges = re.findall(r"^\s*(\w+) -> (\w+)", src, re.M)
    return nodes, edges


def test_graph_to_dot_nodes_and_edges():
    ctx = ggml.init(1 << 20)
    x = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 8), "x")
    w = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 8, 4), "w")
    y = ggml.mul_mat(ctx, w, x)
    z = ggml.add(ctx, ggml.scale(ctx, y, 2.0), y)      # y used twice
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, z)
    dot = viz.graph_to_dot(gf, title="t")
    nodes, edges = _dot_parse(dot.source)
    assert len(nodes) == gf.n_nodes + gf.n_leafs == len(set(nodes))
    ids = {t.addr: f"leaf_{j}" for j, t in enumerate(gf.leafs)}
    ids.update({t.addr: f"node_{i}" for i, t in enumerate(gf.nodes)})
    expected = [(ids[s.addr], f"node_{i}") for i, t in enumerate(gf.nodes) for s in t.src if s is not None]
    assert edges == expected
    assert ("node_0", "node_1") in edges and ("node_0", "node_2") in edges
    for color_by in ("type", None):
        assert _dot_parse(viz.graph_to_dot(gf, color_by=color_by).source) == (nodes, edges)
    with pytest.raises(ValueError):
        viz.graph_to_dot(gf, color_by="nope")


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot program is not installed")
def test_render_svg(tmp_path):
    ctx, t = _mixed_context()
    out = viz.render(t["gf"], tmp_path / "g.svg")
    assert out == str(tmp_path / "g.svg")
    assert "<svg" in pathlib.Path(out).read_text()


def test_hexdump_and_plots(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx, _ = _mixed_context()
    hd = viz.hexdump(ctx, 0, 40).splitlines()
    assert len(hd) == 3 and hd[0].startswith("00000000  20 00 00 00")      # first header: offs = 32
    assert hd[2].startswith("00000020")
    short = viz.hexdump(b"ABC")
    assert short.startswith("00000000  41 42 43 ") and short.endswith("|ABC             |")
    assert len(short) == len(hd[0])                     # a partial line keeps the columns aligned
    for scale in ("linear", "log", "sqrt"):
        ax = viz.plot_arena(ctx, scale=scale, detail=True)
        assert ax.get_xlim()[1] > 0
        plt.close(ax.figure)
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    raw = quants.quantize_row_ref(ggml.GGML_TYPE_Q4_0, x)
    fig = viz.q4_0_block_figure(raw, x)
    assert len(fig.axes) == 2
    fig.savefig(tmp_path / "q.png")
    plt.close(fig)


