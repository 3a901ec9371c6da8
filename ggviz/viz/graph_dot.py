"""A ``ggml_cgraph`` as a Graphviz picture: nodes (computed tensors) as boxes, leafs (constants, inputs) as ellipses.

In the spirit of ``ggml_graph_dump_dot`` (ggml.c), drawn from the engine's own ``gf.nodes`` / ``gf.leafs`` lists:
each node is labelled with its index in ``gf->nodes`` (the order the CPU backend computes them), its name, op and
shape; each leaf with its index in ``gf->leafs``. Edges go from ``src[k]`` to the node that reads it, emitted in
node order then src slot order, and are labelled with the slot ``k`` when a node has more than one source.
"""
from __future__ import annotations

import html

from ..ggml.tensor import op_desc, type_name

# a fixed palette so the same op gets the same colour in every picture
_PALETTE = ["#e3f2fd", "#fff3e0", "#e8f5e9", "#fce4ec", "#ede7f6", "#e0f7fa", "#fffde7", "#efebe9", "#f1f8e9",
            "#e8eaf6", "#fbe9e7", "#e0f2f1", "#f3e5f5", "#fff8e1"]
_LEAF_COLOR = "#f5f5f5"


def _shape(t) -> str:
    ne = list(t.shape)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return "[" + ", ".join(str(x) for x in ne) + "]"


def _color(key: str, table: dict) -> str:
    if key not in table:
        table[key] = _PALETTE[len(table) % len(_PALETTE)]
    return table[key]


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


def graph_to_dot(gf, title: str | None = None, color_by: str | None = "op", rankdir: str = "TB"):
    """Return a ``graphviz.Digraph`` of ``gf``: one box per node, one ellipse per leaf, edges src -> dst.

    ``color_by``: "op" (one colour per op), "type" (per tensor type) or None. Graphviz ids are ``node_<i>`` and
    ``leaf_<j>`` (their indices in ``gf.nodes`` / ``gf.leafs``), so a picture can be matched back to the graph.
    """
    import graphviz

    if color_by not in ("op", "type", None):
        raise ValueError(f"color_by must be 'op', 'type' or None, got {color_by!r}")
    dot = graphviz.Digraph(name="ggml_cgraph", graph_attr={"rankdir": rankdir, "fontname": "Helvetica",
                                                           "fontsize": "11"},
                           node_attr={"fontname": "Helvetica", "fontsize": "9"},
                           edge_attr={"fontname": "Helvetica", "fontsize": "8", "color": "#616161"})
    if title:
        dot.attr(label=title, labelloc="t")
    colors: dict = {}
    ids = {}
    for j, t in enumerate(gf.leafs):
        ids[t.addr] = f"leaf_{j}"
        label = (f"<<font point-size='8'>leaf {j}</font><br/><b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        fill = _color(type_name(t.type), colors) if color_by == "type" else _LEAF_COLOR
        dot.node(f"leaf_{j}", label=label, shape="ellipse", style="filled", fillcolor=fill)
    for i, t in enumerate(gf.nodes):
        ids[t.addr] = f"node_{i}"
        op = op_desc(t)
        label = (f"<<font point-size='8'>#{i}</font> <b>{_esc(t.name or '?')}</b><br/>"
                 f"{_esc(op)}<br/>{_esc(type_name(t.type))} {_esc(_shape(t))}>")
        key = op if color_by == "op" else type_name(t.type)
        fill = _color(key, colors) if color_by else "#ffffff"
        dot.node(f"node_{i}", label=label, shape="box", style="rounded,filled", fillcolor=fill)
    n_ext = 0
    for i, t in enumerate(gf.nodes):
        srcs = [(k, s) for k, s in enumerate(t.src) if s is not None]
        for k, s in srcs:
            sid = ids.get(s.addr)
            if sid is None:    # a source outside this graph (e.g. a graph_view): draw it once, dashed
                sid = f"ext_{n_ext}"
                n_ext += 1
                ids[s.addr] = sid
                dot.node(sid, label=f"{s.name or '?'}\n{type_name(s.type)} {_shape(s)}", shape="ellipse",
                         style="dashed")
            attrs = {"label": f"src{k}"} if len(srcs) > 1 else {}
            dot.edge(sid, f"node_{i}", **attrs)
    return dot


def render(gf, path, fmt: str = "svg", title: str | None = None, color_by: str | None = "op") -> str:
    """Draw ``gf`` to ``path`` (the extension is set to ``fmt``); returns the written file's path.

    Needs Graphviz's ``dot`` program on PATH.
    """
    import os

    dot = graph_to_dot(gf, title=title, color_by=color_by)
    root, ext = os.path.splitext(str(path))
    if ext.lstrip(".") != fmt:
        root = str(path)
    out = f"{root}.{fmt}"
    data = dot.pipe(format=fmt)
    with open(out, "wb") as f:
        f.write(data)
    return out
