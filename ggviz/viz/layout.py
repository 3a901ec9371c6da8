"""The layered layout of a grouped ``ggml_cgraph`` picture: the whole decode graph in well under a second.

No ggml counterpart: ``ggml_graph_dump_dot`` leaves the layout to Graphviz. ``graph_dot.graph_to_dot_grouped``
writes the picture as statements; for a graph of many layers, all open, this module positions every vertex and
edge itself and Graphviz only draws the result.

Why: Graphviz ``dot`` lays a graph out globally (rank assignment, crossing minimisation over every rank, x placement
by network simplex); on the fully opened decode graph -- 1086 nodes, ~340 leafs, ~1700 edges, some of them
(inp_pos, the KQ mask) reaching into all 30 layers -- that takes 15-20 s even with its iteration limits turned
down. But the graph is 30 copies of one layer: llama.cpp's ``llm_build_llama`` emits the same 36 nodes for every
layer, reading the previous layer's residual stream ``l_out-(il-1)`` and the same few inputs. So the picture is
built from bands, in these phases (each a function below, run in order by ``layered_layout``):

1. ``_assign_owners``: every node has a band (``node_bands``: its layer, from the ``-<il>`` name suffix; un-named
   nodes between two nodes of one layer join it, e.g. the ``out_ids`` GET_ROWS of the last layer; other runs of
   them -- the embeddings, the output head -- are bands of their own); a leaf read by one band only (the layer's
   weights, its KV cache) belongs to it, one read by several bands (inp_pos, the KQ mask, the KV index inputs) is
   *shared*;
2. ``_fill_bands``: each band's members in a fixed order, its edges, and a *stub* for each source outside it;
3. ``_group_templates``: bands whose contents match -- same vertex shapes and labels up to the numbers in them,
   same edges -- share one *template*, the copy with the longest labels (no other copy is wider);
4. ``_lay_out_templates``: ``dot`` lays out every template (a tiny point standing for each stub), the shared
   vertices and the legend, all in one call (for the decode graph: 5 small graphs instead of one of 1400 vertices);
5. ``_stack_bands`` and ``_align_bands``: the templates are stacked top to bottom in graph order and aligned
   horizontally along the edges between neighbouring bands (the residual stream runs straight down);
6. ``_place_vertices``: every vertex at its template's position moved to its band; the shared vertices at the top
   of one lane each, left of the stack;
7. ``_route_edges``: an edge inside a band is the template's spline moved to the band; an edge from outside runs to
   its stub -- straight from the bottom row of the band just above (the residual stream), down a lane left of the
   stack from a shared leaf, or down a lane right of it otherwise -- and then along the template's spline from the
   stub. Lanes turn into a band in the free gap between two rows, so they cross edges but no vertex;
8. ``_place_legend`` and ``_pinned_picture``: every position is written into the DOT source; Graphviz only draws
   it: ``neato -n2`` keeps the positions and splines as given (0.3-0.5 s for the SVG).

Nothing is dropped or merged: every vertex and every (node, src) edge of the dot layout is in the picture, with
the same labels, colours and ids.
"""
from __future__ import annotations

import json
import re as _re
import shutil
import subprocess

import graphviz

# Graphviz settings shared by the grouped pictures (graph_dot.graph_to_dot_grouped) and the per-layer templates here
_GROUPED_GRAPH_ATTR = {"rankdir": "TB", "fontname": "Helvetica", "fontsize": "12", "nodesep": "0.25", "ranksep": "0.35"}
_GROUPED_NODE_ATTR = {"fontname": "Helvetica", "fontsize": "10", "margin": "0.08,0.04"}
_GROUPED_EDGE_ATTR = {"fontname": "Helvetica", "fontsize": "8", "color": "#616161", "arrowsize": "0.6"}


def _dot_program():
    return shutil.which("dot")


class PinnedDigraph:
    """What every picture laid out by ``layered_layout`` is an instance of: a ``graphviz.Digraph`` (made by
    ``_pinned_digraph_class``, graphviz being imported lazily) whose ``pipe``/``render`` run ``neato -n2``."""


_PINNED_CLS = None


def _pinned_digraph_class():
    """A ``graphviz.Digraph`` whose positions are fixed: rendered (pipe, render, Jupyter display) by ``neato -n2``."""
    global _PINNED_CLS
    if _PINNED_CLS is None:

        class _Pinned(graphviz.Digraph, PinnedDigraph):
            """A Digraph with every node ``pos`` and edge ``pos`` given: ``neato -n2`` draws it as laid out."""

            def pipe(self, *args, **kwargs):
                kwargs.setdefault("neato_no_op", 2)
                kwargs.setdefault("engine", "neato")
                return super().pipe(*args, **kwargs)

            def render(self, *args, **kwargs):
                kwargs.setdefault("neato_no_op", 2)
                kwargs.setdefault("engine", "neato")
                return super().render(*args, **kwargs)

        _Pinned.__name__ = _Pinned.__qualname__ = "PinnedDigraph"
        _PINNED_CLS = _Pinned
    return _PINNED_CLS


def node_bands(layers) -> list:
    """Per node: its band, ``("L", il)`` for a layer's nodes, ``("x", first node)`` for a run of un-layered nodes
    that is not inside one layer (un-layered nodes between two nodes of the same layer join that layer)."""
    n = len(layers)
    prev, nxt = [None] * n, [None] * n
    last = None
    for i, il in enumerate(layers):
        last = il if il is not None else last
        prev[i] = last
    last = None
    for i in range(n - 1, -1, -1):
        last = layers[i] if layers[i] is not None else last
        nxt[i] = last
    out, run = [], None
    for i, il in enumerate(layers):
        if il is None and prev[i] is not None and prev[i] == nxt[i]:
            il = prev[i]
        if il is not None:
            out.append(("L", il))
            run = None
        else:
            run = run or ("x", i)
            out.append(run)
    return out


_NODE_LAYOUT_KEYS = ("label", "shape", "margin", "fontsize", "fontname", "width", "height", "fixedsize",
                     "peripheries")
_EDGE_LAYOUT_KEYS = ("label", "fontsize", "fontname", "weight", "minlen", "constraint", "headport", "tailport",
                     "arrowhead", "arrowtail", "dir")
_DIGITS = _re.compile(r"\d+")


def _parse_spline(pos: str):
    start = end = None
    pts = []
    for tok in pos.split(";")[0].split():
        if tok.startswith("e,"):
            end = tuple(float(v) for v in tok[2:].split(","))
        elif tok.startswith("s,"):
            start = tuple(float(v) for v in tok[2:].split(","))
        else:
            x, y = tok.split(",")[:2]
            pts.append((float(x), float(y)))
    return start, end, pts


def _fmt_spline(start, end, pts) -> str:
    out = []
    if start is not None:
        out.append(f"s,{start[0]:.2f},{start[1]:.2f}")
    if end is not None:
        out.append(f"e,{end[0]:.2f},{end[1]:.2f}")
    out += [f"{x:.2f},{y:.2f}" for x, y in pts]
    return " ".join(out)


def _polyline_bezier(pts) -> list:
    """A polyline as cubic Bézier control points (1 + 3 per segment), the form of a Graphviz edge ``pos``."""
    out = [pts[0]]
    for (ax, ay), (bx, by) in zip(pts, pts[1:]):
        out += [(ax + (bx - ax) / 3, ay + (by - ay) / 3), (ax + 2 * (bx - ax) / 3, ay + 2 * (by - ay) / 3), (bx, by)]
    return out


def _lane_offset(k: int) -> float:
    """Where lane ``k`` crosses a gap between two rows, relative to the gap's middle (rows are >= 25 pt apart)."""
    return ((k % 5) - 2) * 3.5


def _run_dot_json(sources: list) -> list:
    """Lay out several graphs with one ``dot -Tjson0`` call; their JSON documents, in order."""

    exe = _dot_program()
    if exe is None:
        raise graphviz.ExecutableNotFound(["dot"])
    res = subprocess.run([exe, "-Tjson0"], input="\n".join(sources).encode("utf-8"), capture_output=True)
    if res.returncode != 0:
        raise RuntimeError(f"dot failed laying out the layer templates: {res.stderr.decode(errors='replace')}")
    text = res.stdout.decode("utf-8")
    dec = json.JSONDecoder()
    docs, k = [], 0
    while True:
        while k < len(text) and text[k].isspace():
            k += 1
        if k >= len(text):
            break
        doc, k = dec.raw_decode(text, k)
        docs.append(doc)
    if len(docs) != len(sources):
        raise RuntimeError(f"dot returned {len(docs)} layouts for {len(sources)} graphs")
    return docs


class _Template:
    """One ``dot`` layout: vertex boxes ``{name: (x, y, w, h)}`` in points (y up), edge splines by id, bb."""

    def __init__(self, doc):
        self.bb = tuple(float(v) for v in doc["bb"].split(","))
        self.v = {}
        self.clusters = {}
        for o in doc.get("objects", []):
            if "pos" in o:
                x, y = (float(a) for a in o["pos"].split(",")[:2])
                self.v[o["name"]] = (x, y, float(o["width"]) * 72.0, float(o["height"]) * 72.0)
            elif "bb" in o:
                self.clusters[o["name"]] = o
        self.e = {}
        for e in doc.get("edges", []):
            if "id" in e and "pos" in e:
                lp = tuple(float(a) for a in e["lp"].split(",")) if "lp" in e else None
                self.e[e["id"]] = (*_parse_spline(e["pos"]), lp)
        ys = [(y, h) for n, (x, y, w, h) in self.v.items() if n.startswith("v")]
        self.bottom_y = min((y for y, h in ys), default=self.bb[1])
        self._rows = ys + [(y, h) for n, (x, y, w, h) in self.v.items() if n.startswith("s")]

    def gap_above(self, y, h):
        """A y in the free gap between the row at ``y`` and the row above it (None: that is the top row)."""
        above = [yy - hh / 2 for yy, hh in self._rows if yy > y + 1.0]
        if not above:
            return None
        row_top = max([yy + hh / 2 for yy, hh in self._rows if abs(yy - y) <= 1.0] + [y + h / 2])
        return (row_top + min(above)) / 2

    def gap_below(self, y, h):
        """A y in the free gap between the row at ``y`` and the row below it (None: that is the bottom row)."""
        below = [yy + hh / 2 for yy, hh in self._rows if yy < y - 1.0]
        if not below:
            return None
        row_bottom = min([yy - hh / 2 for yy, hh in self._rows if abs(yy - y) <= 1.0] + [y - h / 2])
        return (row_bottom + max(below)) / 2




# ------------------------------------------------------------------------------------------------------------------
# The phases. ``_Bands`` carries what each phase adds, so a phase reads as a function of the ones before it.

class _Bands:
    """The picture cut into bands: vertices and edges as given, and what each phase of ``layered_layout`` adds."""

    def __init__(self, stmts, band_of: dict):
        self.verts = {st[1]: st[2] for st in stmts if st[0] == "node"}
        self.edges = [(st[1], st[2], st[3]) for st in stmts if st[0] == "edge"]
        self.band_of = band_of
        self.order = list(dict.fromkeys(band_of.values()))      # the bands in graph order, top to bottom
        self.bidx = {b: k for k, b in enumerate(self.order)}

    def template(self, b):
        """The laid-out template band ``b`` is a copy of."""
        return self.temps[self.group_of[b]]

    def sref(self, b, v):
        """Source ``v`` of an edge into band ``b``, as the band sees it: a member (``v``) or a stub (``s``)."""
        return ("v", self.local[b][v]) if v in self.local[b] else ("s", self.stub_idx[b][v])


def _assign_owners(L: _Bands) -> None:
    """Phase 1: the band that owns each vertex. A node's band is given; a leaf read by one band belongs to it (the
    layer's weights, its KV cache), one read by nobody to the first band; one read by several bands is *shared*: it
    gets a lane of its own, since no band can hold it without edges climbing over others."""
    readers: dict = {}
    for s, d, _a in L.edges:
        readers.setdefault(s, set()).add(L.band_of[d])
    L.readers = readers
    L.owner = dict(L.band_of)
    L.shared = []
    for v in L.verts:
        if v in L.band_of:
            continue
        rb = readers.get(v, ())
        if len(rb) == 1:
            L.owner[v] = next(iter(rb))
        elif not rb:
            L.owner[v] = L.order[0]
        else:
            L.shared.append(v)


def _fill_bands(L: _Bands) -> None:
    """Phase 2: per band, its members (nodes in graph order, then its leafs by first use: the same order in every
    copy of a layer, so copies compare equal), its edges (by destination) and its stubs (sources from outside)."""
    order, edges, owner = L.order, L.edges, L.owner
    members = {b: [] for b in order}
    for v in L.verts:
        if v in L.band_of:
            members[L.band_of[v]].append(v)
    band_edges = {b: [] for b in order}
    for j, (s, d, a) in enumerate(edges):
        band_edges[L.band_of[d]].append(j)
    stubs = {b: [] for b in order}
    for b in order:
        mem = members[b]
        seen = set(mem)
        for j in band_edges[b]:
            s = edges[j][0]
            if s not in seen and owner.get(s) == b:
                mem.append(s)
                seen.add(s)
        st_seen = set()
        for j in band_edges[b]:
            s = edges[j][0]
            if s not in seen and s not in st_seen:
                stubs[b].append(s)
                st_seen.add(s)
    for v in L.verts:                                   # owned vertices nobody reads
        if v not in L.band_of and v not in L.shared and not L.readers.get(v):
            members[owner[v]].append(v)
    L.members, L.band_edges, L.stubs = members, band_edges, stubs
    L.local = {b: {v: k for k, v in enumerate(members[b])} for b in order}
    L.stub_idx = {b: {v: k for k, v in enumerate(stubs[b])} for b in order}
    L.edge_local = {}
    for b in order:
        for k, j in enumerate(band_edges[b]):
            L.edge_local[j] = k


def _signature(L: _Bands, b):
    """What a band's layout depends on: its vertices' shapes and labels with the numbers blanked out (layer 3's
    ``Qcur-3`` and layer 4's ``Qcur-4`` are the same box), its edges by local index and their layout attributes."""
    verts, edges = L.verts, L.edges
    vs = tuple((verts[v].get("shape"), _DIGITS.sub("0", verts[v].get("label", v)),
                tuple(verts[v].get(k) for k in _NODE_LAYOUT_KEYS[2:])) for v in L.members[b])
    es = tuple((L.sref(b, edges[j][0]), L.local[b][edges[j][1]],
                tuple((k, _DIGITS.sub("0", str(edges[j][2][k]))) for k in _EDGE_LAYOUT_KEYS
                      if k in edges[j][2])) for j in L.band_edges[b])
    return vs, len(L.stubs[b]), es


def _group_templates(L: _Bands) -> None:
    """Phase 3: bands with one signature share a template (``dot`` lays out one copy: the 30 layers are 1-3 runs)."""
    groups: dict = {}
    for b in L.order:
        groups.setdefault(_signature(L, b), []).append(b)
    L.groups = list(groups.values())
    L.group_of, L.reps = {}, []
    for g, bs in enumerate(L.groups):
        # the copy with the longest labels is laid out: every other copy fits in its boxes
        rep = max(reversed(bs), key=lambda b: sum(len(L.verts[v].get("label", "")) for v in L.members[b]))
        L.reps.append(rep)
        for b in bs:
            L.group_of[b] = g


def _layout_attrs(a, keys):
    return {k: str(a[k]) for k in keys if k in a}


def _lay_out_templates(L: _Bands, graph_attr: dict, legend_spec) -> None:
    """Phase 4: one ``dot`` call for every template (vertices ``v<k>``, stubs ``s<k>`` as points, edges ``e<k>``),
    plus an auxiliary graph of the shared vertices and the legend, only to learn their sizes."""
    tattr = {k: v for k, v in graph_attr.items() if k not in ("label", "labelloc")}
    sources = []
    for rep in L.reps:
        g = graphviz.Digraph(name="template", graph_attr=tattr, node_attr=_GROUPED_NODE_ATTR,
                             edge_attr=_GROUPED_EDGE_ATTR)
        for k, v in enumerate(L.members[rep]):
            g.node(f"v{k}", **_layout_attrs(L.verts[v], _NODE_LAYOUT_KEYS))
        for k in range(len(L.stubs[rep])):
            g.node(f"s{k}", label="", shape="point", width="0.05", height="0.05")
        for k, j in enumerate(L.band_edges[rep]):
            s, d, a = L.edges[j]
            ss = f"v{L.local[rep][s]}" if s in L.local[rep] else f"s{L.stub_idx[rep][s]}"
            g.edge(ss, f"v{L.local[rep][d]}", id=f"e{k}", **_layout_attrs(a, _EDGE_LAYOUT_KEYS))
        sources.append(g.source)
    aux = graphviz.Digraph(name="aux", graph_attr=tattr, node_attr=_GROUPED_NODE_ATTR, edge_attr=_GROUPED_EDGE_ATTR)
    for k, v in enumerate(L.shared):
        aux.node(f"v{k}", **_layout_attrs(L.verts[v], _NODE_LAYOUT_KEYS))
    if legend_spec is not None:
        with aux.subgraph(name="cluster_legend") as lg:
            lg.attr(**legend_spec[0])
            lg.node("legend", **legend_spec[1])
    sources.append(aux.source)
    docs = _run_dot_json(sources)
    L.temps = [_Template(d) for d in docs[:-1]]
    L.auxt = _Template(docs[-1])


def _stack_bands(L: _Bands, band_gap: float) -> None:
    """Phase 5a: each band's vertical offset, stacked top to bottom in graph order (y up: band 0's top at 0)."""
    L.dy, top = {}, 0.0
    for b in L.order:
        x0, y0, x1, y1 = L.template(b).bb
        L.dy[b] = top - y1
        top -= (y1 - y0) + band_gap


def _align_to(L: _Bands, b, a) -> float:
    """The x offset of band ``b`` that lines it up with the placed band ``a``: along an edge from ``a`` into ``b``
    (its stub in ``b`` right under the source), else along one from ``b`` into ``a``, else centre on centre."""
    dx, T = L.dx, L.template
    for j in L.band_edges[b]:
        s = L.edges[j][0]
        if s in L.local[a] and s in L.stub_idx[b]:
            return T(a).v[f"v{L.local[a][s]}"][0] + dx[a] - T(b).v[f"s{L.stub_idx[b][s]}"][0]
    for j in L.band_edges[a]:
        s = L.edges[j][0]
        if s in L.local[b] and s in L.stub_idx[a]:
            return T(a).v[f"s{L.stub_idx[a][s]}"][0] + dx[a] - T(b).v[f"v{L.local[b][s]}"][0]
    ta, tb = T(a).bb, T(b).bb
    return (ta[0] + ta[2]) / 2 + dx[a] - (tb[0] + tb[2]) / 2


def _align_bands(L: _Bands) -> None:
    """Phase 5b: each band's horizontal offset. The biggest group (the repeated layer) stays put, so the residual
    stream runs straight down through it; the others line up with a placed neighbour."""
    order = L.order
    L.dx = {}
    main = max(L.groups, key=len)
    if len(main) == 1:
        main = [order[0]]
    for b in main:
        L.dx[b] = 0.0
    while len(L.dx) < len(order):
        progress = False
        for k, b in enumerate(order):
            if b in L.dx:
                continue
            for a in ([order[k - 1]] if k > 0 else []) + ([order[k + 1]] if k + 1 < len(order) else []):
                if a in L.dx:
                    L.dx[b] = _align_to(L, b, a)
                    progress = True
                    break
        if not progress:                                # cannot happen for a chain; keep going regardless
            L.dx[next(b for b in order if b not in L.dx)] = 0.0


def _place_vertices(L: _Bands) -> None:
    """Phase 6: ``L.pos`` {vertex: (x, y, w, h)}: members at their template's place moved to their band; each shared
    vertex at the top of its own lane, the lanes left of the stack (``L.lane_x``, ``L.lane_dy``)."""
    pos: dict = {}
    for b in L.order:
        t = L.template(b)
        for v, k in L.local[b].items():
            x, y, w, h = t.v[f"v{k}"]
            pos[v] = (x + L.dx[b], y + L.dy[b], w, h)
    L.xmin = min(L.template(b).bb[0] + L.dx[b] for b in L.order)
    L.xmax = max(L.template(b).bb[2] + L.dx[b] for b in L.order)
    auxt = L.auxt
    lane_w = max((auxt.v[f"v{k}"][2] for k in range(len(L.shared))), default=0.0) + 16.0
    L.lane_x, L.lane_dy = {}, {}
    for k, v in enumerate(L.shared):
        L.lane_dy[v] = _lane_offset(k)
        _x, _y, w, h = auxt.v[f"v{k}"]
        L.lane_x[v] = L.xmin - 24.0 - lane_w * k - lane_w / 2
        pos[v] = (L.lane_x[v], 10.0 + h / 2, w, h)
    L.pos = pos


def _route_from_outside(L: _Bands, s, b, t, p0, band_gap: float) -> list:
    """The polyline from source ``s`` (outside band ``b``) down to the stub point ``p0`` where the template's spline
    begins. It turns into band ``b`` in the gap above the stub's row, so it crosses edges but no vertex."""
    _sx, sy, _sw, sh = t.v[f"s{L.stub_idx[b][s]}"]
    gy = t.gap_above(sy, sh)
    gy = (t.bb[3] + band_gap / 2) if gy is None else gy
    gy += L.dy[b]
    x, y, w, h = L.pos[s]
    if s in L.lane_x:                                   # a shared vertex: down its own lane, left of the stack
        gy += L.lane_dy[s]                              # lanes entering one gap do not overlap
        return [(x, y - h / 2), (x, gy), (p0[0], gy), p0]
    a_band = L.owner[s]
    ta = L.template(a_band)
    k_s = L.local[a_band][s]
    at_bottom = ta.v[f"v{k_s}"][1] <= ta.bottom_y + 1.0
    if L.bidx[a_band] + 1 == L.bidx[b] and at_bottom:
        return [(x, y - h / 2), p0]                     # the row just above: straight down
    # anything else (a skip over bands, or from inside a band): out below its row, down a lane right of the stack
    if s not in L.right_lane:
        L.right_lane[s] = len(L.right_lane)
    rx = L.xmax + 24.0 + 10.0 * L.right_lane[s]
    ty_, th = ta.v[f"v{k_s}"][1], ta.v[f"v{k_s}"][3]
    gb = ta.gap_below(ty_, th)
    gb = (ta.bb[1] - band_gap / 2) if gb is None else gb
    gb += L.dy[a_band] + _lane_offset(L.right_lane[s])
    gy += _lane_offset(L.right_lane[s])
    return [(x, y - h / 2), (x, gb), (rx, gb), (rx, gy), (p0[0], gy), p0]


def _route_edges(L: _Bands, band_gap: float) -> list:
    """Phase 7: each edge's ``pos`` (and ``lp``, its label's place): the template's spline moved to the band,
    preceded by the route from outside when the source is not in the band. In ``edges`` order."""
    L.right_lane = {}
    epos = []
    for j, (s, d, a) in enumerate(L.edges):
        b = L.band_of[d]
        t = L.template(b)
        start, end, pts, lp = t.e[f"e{L.edge_local[j]}"]
        mv = (lambda p, b=b: (p[0] + L.dx[b], p[1] + L.dy[b]))
        pts = [mv(p) for p in pts]
        start = mv(start) if start is not None else None
        end = mv(end) if end is not None else None
        lp = mv(lp) if lp is not None else None
        if s not in L.local[b]:
            route = _route_from_outside(L, s, b, t, pts[0], band_gap)
            pts = _polyline_bezier(route)[:-1] + pts
        attrs = {"pos": _fmt_spline(start, end, pts)}
        if lp is not None:
            attrs["lp"] = f"{lp[0]:.2f},{lp[1]:.2f}"
        epos.append(attrs)
    return epos


def _place_legend(L: _Bands, legend_spec):
    """Phase 8a: the legend cluster's ``bb``/``lp`` and its node's ``pos``: right of everything (the stack and the
    right lanes), its top level with the shared vertices'. None without a legend."""
    if legend_spec is None:
        return None
    cl = L.auxt.clusters.get("cluster_legend")
    if cl is None:
        return None
    cx0, cy0, cx1, cy1 = (float(v) for v in cl["bb"].split(","))
    ldx = L.xmax + 24.0 + 10.0 * len(L.right_lane) + 16.0 - cx0
    ldy = 10.0 + max((p[3] for v, p in L.pos.items() if v in L.lane_x), default=0.0) - cy1
    lx, ly = L.auxt.v["legend"][:2]
    lpx, lpy = (float(v) for v in cl["lp"].split(","))
    return {"bb": f"{cx0 + ldx:.2f},{cy0 + ldy:.2f},{cx1 + ldx:.2f},{cy1 + ldy:.2f}",
            "lp": f"{lpx + ldx:.2f},{lpy + ldy:.2f}", "pos": f"{lx + ldx:.2f},{ly + ldy:.2f}"}


def _pinned_picture(stmts, graph_attr: dict, pos: dict, epos: list, legend_spec, legend_at):
    """Phase 8b: the statements again, in their order, every one with its position: a ``PinnedDigraph`` drawn by
    neato -n2 (``layout=nop2`` for a plain ``dot`` run)."""
    gattr = dict(graph_attr, layout="nop2")
    dot = _pinned_digraph_class()(name="ggml_cgraph", graph_attr=gattr, node_attr=_GROUPED_NODE_ATTR,
                                  edge_attr=_GROUPED_EDGE_ATTR,
                                  comment="laid out by ggviz.viz.graph_dot.layered_layout: positions are fixed, "
                                          "render with neato -n2 (or -Knop2)")
    k_edge = 0
    for st in stmts:
        if st[0] == "node":
            # the template's box sizes for every copy (it has the longest labels): the copies of a layer look
            # alike, and the template's splines end exactly on their borders
            x, y, w, h = pos[st[1]]
            dot.node(st[1], **st[2], pos=f"{x:.2f},{y:.2f}", width=f"{w / 72:.4f}", height=f"{h / 72:.4f}")
        else:
            dot.edge(st[1], st[2], **st[3], **epos[k_edge])
            k_edge += 1
    if legend_spec is not None and legend_at is not None:
        with dot.subgraph(name="cluster_legend") as lg:
            lg.attr(**legend_spec[0], bb=legend_at["bb"], lp=legend_at["lp"])
            lg.node("legend", **legend_spec[1], pos=legend_at["pos"])
    return dot


def layered_layout(stmts, band_of: dict, graph_attr: dict, legend_spec=None, band_gap: float = 18.0):
    """Position every vertex and edge of a picture of a layered graph (see the module docstring); returns
    ``(PinnedDigraph, info)``.

    ``stmts``: the picture, ``("node", name, attrs)`` / ``("edge", src, dst, attrs)``; ``band_of``: {vertex name of
    a node: its band key}, in graph order (every other vertex is placed by its readers); ``legend_spec``:
    (cluster attrs, legend node attrs) or None.
    """
    L = _Bands(stmts, band_of)
    _assign_owners(L)
    _fill_bands(L)
    _group_templates(L)
    _lay_out_templates(L, graph_attr, legend_spec)
    _stack_bands(L, band_gap)
    _align_bands(L)
    _place_vertices(L)
    epos = _route_edges(L, band_gap)
    legend_at = _place_legend(L, legend_spec)
    dot = _pinned_picture(stmts, graph_attr, L.pos, epos, legend_spec, legend_at)
    info = {"bands": len(L.order), "templates": len(L.reps), "band_of_vertex": {v: L.owner.get(v) for v in L.verts},
            "band_order": L.order, "positions": dict(L.pos)}
    return dot, info
