"""The layered layout of the Graph DAG view (``ggviz.viz.layout.layered_layout``): the whole decode graph, every node, leaf
and edge, laid out layer by layer -- checked on a small synthetic layered graph and on the real decode graph."""
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from ggviz import ggml
from ggviz.viz import graph_dot as G
from ggviz.viz import layout

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot program is not installed")

_NODE = re.compile(r'^\t(\w+) \[(.*)\]$', re.M)
_EDGE = re.compile(r'^\t(\w+) -> (\w+)(?: \[(.*)\])?$', re.M)
_POS = re.compile(r'(?<=[\s\[])(pos|lp|bb|width|height)=("[^"]*"|[\d.]+) ?')


def _layered_graph(n_layer: int = 6):
    """embd -> n_layer identical layers (a shared input ``inp_pos`` read by each, a source read twice by one node,
    the residual from the layer above read twice) -> result; layer 4 adds a skip from layer 1's output."""
    ctx = ggml.init(16 << 20)
    F32 = ggml.GGML_TYPE_F32
    tok = ggml.set_name(ggml.new_tensor_1d(ctx, F32, 8), "inp_tokens")
    pos = ggml.set_name(ggml.new_tensor_1d(ctx, F32, 8), "inp_pos")
    x = ggml.set_name(ggml.scale(ctx, tok, 1.0), "embd")
    outs = []
    for il in range(n_layer):
        w = ggml.set_name(ggml.new_tensor_1d(ctx, F32, 8), f"blk.{il}.w")
        a = ggml.set_name(ggml.mul(ctx, x, w), f"a-{il}")
        sq = ggml.set_name(ggml.mul(ctx, a, a), f"sq-{il}")
        b = ggml.set_name(ggml.add(ctx, sq, pos), f"b-{il}")
        x = ggml.set_name(ggml.add(ctx, b, x), f"out-{il}")
        if il == 4:
            x = ggml.set_name(ggml.add(ctx, x, outs[1]), f"skip-{il}")
        outs.append(x)
    r = ggml.set_name(ggml.scale(ctx, x, 2.0), "result")
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, r)
    return gf


def _strip_layout(body):
    return [_POS.sub("", line).replace(" []", "").replace(" ]", "]") for line in body]


def _spline(pos):
    start, end, pts = layout._parse_spline(pos)
    return end, pts


def _check_picture(gf, dot, info, prefix="", legend=False):
    """Every vertex and edge of the dot-laid-out picture is in the layered one, same attributes; positions are
    given for everything; boxes do not overlap; every edge runs from its source to its target; layer il lies
    above layer il+1."""
    assert info["layout"] == "layers" and type(dot).__name__ == "PinnedDigraph"
    ref, ref_info = G.graph_to_dot_grouped(gf, collapse=(), layout="dot", id_prefix=prefix, legend=legend)
    assert ref_info["layout"] == "dot"
    # the same statements in the same order, with the same labels/colours/ids: only positions and sizes added
    assert _strip_layout(dot.body) == list(ref.body)
    src = dot.source
    nodes = {m.group(1): m.group(2) for m in _NODE.finditer(src)}
    edges = [(m.group(1), m.group(2), m.group(3) or "") for m in _EDGE.finditer(src)]
    want_nodes = {f"n{i}" for i in range(gf.n_nodes)} | {v for v in info["vertex_of_leaf"] if v is not None}
    assert want_nodes <= set(nodes)
    n_pairs = sum(1 for t in gf.nodes for s in t.src if s is not None)
    assert len(edges) == info["n_edges"] == n_pairs
    # positions: every vertex, every edge
    box = {}
    for v, attrs in nodes.items():
        if v in ("graph", "node", "edge"):
            continue
        m = re.search(r'pos="([-\d.]+),([-\d.]+)"', attrs)
        assert m, v
        w = float(re.search(r'width=([\d.]+)', attrs).group(1)) * 72
        h = float(re.search(r'height=([\d.]+)', attrs).group(1)) * 72
        box[v] = (float(m.group(1)), float(m.group(2)), w, h)
    assert set(box) == set(info["positions"])
    # no two vertices overlap
    names = sorted(box)
    arr = np.array([box[v] for v in names])
    x0, x1 = arr[:, 0] - arr[:, 2] / 2, arr[:, 0] + arr[:, 2] / 2
    y0, y1 = arr[:, 1] - arr[:, 3] / 2, arr[:, 1] + arr[:, 3] / 2
    ov = ((np.minimum(x1[:, None], x1[None]) - np.maximum(x0[:, None], x0[None]) > 0.5)
          & (np.minimum(y1[:, None], y1[None]) - np.maximum(y0[:, None], y0[None]) > 0.5))
    np.fill_diagonal(ov, False)
    assert not ov.any(), [(names[i], names[j]) for i, j in zip(*np.nonzero(ov))][:5]
    # each edge: a spline (1 + 3k points) from its source's border to its target's border
    for s, d, attrs in edges:
        m = re.search(r'pos="([^"]+)"', attrs)
        assert m, (s, d)
        end, pts = _spline(m.group(1))
        assert len(pts) >= 4 and (len(pts) - 1) % 3 == 0, (s, d)
        for (v, p) in ((s, pts[0]), (d, end)):
            x, y, w, h = box[v]
            assert abs(p[0] - x) <= w / 2 + 3 and abs(p[1] - y) <= h / 2 + 3, (s, d, v, p, box[v])
    # layer il above layer il+1 (Graphviz's y grows upwards)
    layers = G.node_layers(gf)
    ys: dict = {}
    for i, il in enumerate(layers):
        if il is not None:
            ys.setdefault(il, []).append(box[f"n{i}"][1])
    ls = sorted(ys)
    for a, b in zip(ls, ls[1:]):
        assert min(ys[a]) > max(ys[b]), (a, b)
    return box, edges


# ------------------------------------------------------------------------------------------------- synthetic

@needs_dot
def test_layered_layout_small_graph():
    gf = _layered_graph()
    assert G.node_layers(gf).count(None) == 2                      # embd, result
    dot, info = G.graph_to_dot_grouped(gf, collapse=(), layout="layers", legend=True, title="t")
    box, edges = _check_picture(gf, dot, info, legend=True)
    # bands: embd, the 6 layers, result; layers 0-3 and 5 share one template, layer 4 (the skip) has its own
    assert info["bands"] == 8 and info["templates"] == 4
    assert info["band_order"][0] == ("x", 0) and info["band_order"][1:7] == [("L", il) for il in range(6)]
    # inp_pos is read by every layer: drawn once, in a lane left of every band
    j = [t.name for t in gf.leafs].index("inp_pos")
    v = info["vertex_of_leaf"][j]
    assert info["band_of_vertex"][v] is None
    x_band = min(b[0] - b[2] / 2 for k, b in box.items() if info["band_of_vertex"].get(k) is not None)
    assert box[v][0] + box[v][2] / 2 < x_band
    # the skip (out-1 -> skip-4) goes down a lane right of every band
    names = [t.name for t in gf.nodes]
    s, d = f"n{names.index('out-1')}", f"n{names.index('skip-4')}"
    (attrs,) = [a for ss, dd, a in edges if (ss, dd) == (s, d)]
    x_right = max(b[0] + b[2] / 2 for b in box.values())
    assert max(p[0] for p in _spline(re.search(r'pos="([^"]+)"', attrs).group(1))[1]) > x_right
    # small graph: the edges keep their src labels, placed by the template
    assert sum('label=src' in a and 'lp=' in a for _s, _d, a in edges) == sum(
        1 for t in gf.nodes if sum(s is not None for s in t.src) > 1 for s in t.src if s is not None)
    # the legend cluster is placed (bb given), right of everything
    assert re.search(r'subgraph cluster_legend \{\s*bb="([-\d.]+)', dot.source)
    # Graphviz draws it as laid out: neato -n2 (the Python object) and plain ``dot`` (layout=nop2 in the source)
    svg = dot.pipe(format="svg").decode()
    assert svg.count('class="node"') == len(box) + 1 and svg.count('class="edge"') == len(edges)   # + legend
    out = subprocess.run(["dot", "-Tsvg"], input=dot.source.encode(), capture_output=True, check=True).stdout
    assert out.decode() == svg
    # auto: a picture this small stays with dot; no layer structure, or some layer folded: dot
    assert G.graph_to_dot_grouped(gf, collapse=())[1]["layout"] == "dot"
    assert G.graph_to_dot_grouped(gf, collapse=[2], layout="auto")[1]["layout"] == "dot"
    with pytest.raises(ValueError, match="layers"):
        G.graph_to_dot_grouped(gf, collapse=[2], layout="layers")
    with pytest.raises(ValueError):
        G.graph_to_dot_grouped(gf, layout="nope")


def test_node_bands():
    L = None
    assert layout.node_bands([L, 0, 0, L, 0, 1, L, L, 2, L]) == [
        ("x", 0), ("L", 0), ("L", 0), ("L", 0), ("L", 0), ("L", 1), ("x", 6), ("x", 6), ("L", 2), ("x", 9)]


def test_polyline_bezier():
    pts = layout._polyline_bezier([(0, 0), (0, 3), (6, 3)])
    assert len(pts) == 7 and pts[0] == (0, 0) and pts[3] == (0, 3) and pts[6] == (6, 3)
    assert pts[1] == (0, 1) and pts[5] == (4, 3)


# ------------------------------------------------------------------------------------------- the decode graph

@pytest.fixture(scope="module")
def decode():
    if not MODEL.exists():
        pytest.skip("SmolLM2 model not downloaded")
    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot program is not installed")
    from ggviz.capture import decode_graph
    return decode_graph()


def _svg_node_centers(svg):
    out = {}
    for m in re.finditer(r'<g id="([^"]+)" class="node">(.*?)</g>', svg, re.S):
        body = m.group(2)
        nums = []
        for pts in re.findall(r'\s(?:points|d)="([^"]+)"', body):
            nums += [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", pts)]
        e = re.search(r'<ellipse[^>]*cx="([-\d.]+)" cy="([-\d.]+)"', body)
        if e:
            out[m.group(1)] = (float(e.group(1)), float(e.group(2)))
        elif nums:
            xs, ys = nums[0::2], nums[1::2]
            out[m.group(1)] = ((min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2)
    return out


def test_full_decode_dag(decode):
    gf = decode.gf
    assert gf.n_nodes == 1086
    dot, info = G.graph_to_dot_grouped(gf, collapse=(), legend=True, id_prefix="d-")
    assert info["layout"] == "layers"
    # 30 layers from 2 layouts (layers 0-28 are copies; 29 reads out_ids), the embeddings and the output head
    assert info["bands"] == 32 and info["band_order"][1:31] == [("L", il) for il in range(30)]
    assert info["templates"] <= 5
    box, edges = _check_picture(gf, dot, info, prefix="d-", legend=True)
    svg = dot.pipe(format="svg").decode().replace("&#45;", "-")
    # every node and leaf in the SVG, once; every (node, src) pair an edge
    ids = re.findall(r'<g id="([^"]+)" class="node">', svg)
    want = {f"d-n{i}" for i in range(gf.n_nodes)} | {f"d-{v}" for v in info["vertex_of_leaf"] if v is not None}
    assert len(ids) == len(set(ids)) and want <= set(ids)
    assert sum(v is not None for v in info["vertex_of_leaf"]) == gf.n_leafs
    assert svg.count('class="edge"') == sum(1 for t in gf.nodes for s in t.src if s is not None) == len(edges)
    # labels in the SVG: the node's index, name and op
    for i in (0, 23, 500, 1085):
        t = gf.nodes[i]
        m = re.search(r'<g id="d-n%d" class="node">(.*?)</g>' % i, svg, re.S)
        assert f">#{i}<" in m.group(1) and f">{G._esc(t.name)}<" in m.group(1)
    # drawn where laid out, layer by layer: in the SVG (y down) layer il's band is above layer il+1's
    centers = _svg_node_centers(svg)
    layers = G.node_layers(gf)
    band: dict = {}
    for i, il in enumerate(layers):
        if il is not None:
            band.setdefault(il, []).append(centers[f"d-n{i}"][1])
    for il in range(29):
        assert max(band[il]) < min(band[il + 1])
    # the copies of a layer are laid out alike: layer 3 is layer 2 moved down
    l2 = [i for i, il in enumerate(layers) if il == 2]
    l3 = [i for i, il in enumerate(layers) if il == 3]
    d = {(round(box[f"n{b}"][0] - box[f"n{a}"][0], 1), round(box[f"n{b}"][1] - box[f"n{a}"][1], 1))
         for a, b in zip(l2, l3)}
    assert len(d) == 1 and next(iter(d))[0] == 0.0


def test_prefill_graph_uses_the_layered_layout(decode):
    from ggviz.capture import new_context
    _model, ctx = new_context(n_ctx=256, threads=1)
    gf = ctx.build_graph(7, 7, 256).gf
    dot, info = G.graph_to_dot_grouped(gf, collapse=())
    _check_picture(gf, dot, info)


def test_graph_view_expand_all(decode):
    from ggviz.viz.widgets import GraphView

    gv = GraphView(decode.gf)
    assert gv.layout()[1]["layout"] == "dot"                       # folded: 30 boxes, dot
    gv.expand_all()
    st = gv.state()
    assert st["open"] == list(range(30)) and st["n_nodes_drawn"] == 1086 and st["n_edges"] == 1721
    assert gv.layout()[1]["layout"] == "layers"
    i = [t.name for t in decode.gf.nodes].index("kq_soft_max-7")
    gv.select(i)
    assert gv.state()["selected"]["vertex"] == f"n{i}" and f"#{gv.prefix}n{i} path" in gv.css()
    assert gv.svg().startswith("<svg") and f'id="{gv.prefix}n{i}"' in gv.svg().replace("&#45;", "-")
    png = gv.png(dpi=8)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_full_graph(decode, tmp_path, monkeypatch):
    from ggviz.tools import export

    p = export.write_graph(tmp_path / "g.dot", decode.gf, full=True)
    src = p.read_text()
    assert "layout=nop2" in src and src.count("pos=") >= 1086 + 1721
    p = export.write_graph(tmp_path / "g.svg", decode.gf, full=True)
    assert p.read_text().count('class="node"') >= 1086 + decode.gf.n_leafs
    # without Graphviz the DOT source is still written (no positions: nothing can lay the templates out)
    monkeypatch.setattr(G, "_dot_program", lambda: None)
    src = export.graph_dot(decode.gf, full=True).source
    assert " pos=" not in src and "mclimit" in src


def test_fold_runs_of_identical_layers():
    """``fold=True``: consecutive collapsed layers with the same nodes (op, type, shape) are one box ``L<first>``;
    a layer that differs (layer 4's extra skip ADD) keeps its own box; the line describing the picture counts them."""
    gf = _layered_graph(6)
    dot, info = G.graph_to_dot_grouped(gf, collapse=[1, 2, 3, 4, 5], fold=True, layout="dot")
    assert info["folds"] == {1: [1, 2, 3]} and info["boxes"] == {1: 4, 2: 4, 3: 4, 4: 5, 5: 4}
    layers = info["layers"]
    assert {info["vertex_of_node"][i] for i, il in enumerate(layers) if il in (1, 2, 3)} == {"L1"}
    src = dot.source
    assert "layers 1–3: 3 identical × 4 nodes = 12" in src and "layer 4 (5 nodes)" in src and "L2 [" not in src
    assert info["n_nodes_drawn"] == 2 + 4 + 3          # outside, layer 0's nodes, three boxes
    assert G.describe_picture(info, "; ") == (
        "layer 0 open: 4 nodes; layers 1–3 in one box: 3 identical layers × 4 nodes = 12; layer 4 in its own box: "
        "5 nodes; layer 5 in its own box: 4 nodes; outside the layers (embedding, output head): 2 nodes; "
        "in all: 27 nodes")
    assert G.graph_to_dot_grouped(gf, collapse=[1, 2, 3, 4, 5], layout="dot")[1]["folds"] == {}
