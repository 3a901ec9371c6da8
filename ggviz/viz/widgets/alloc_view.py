"""AllocatorView: one graph allocation of ggml-alloc (``ggml_gallocr``) as an offset x node-index chart.

Drawn from a ``capture.AllocRecord`` (``ggviz/capture/plans.py``): the allocator's own plain-data record of its
last plan, ``galloc.last_alloc`` (or the same records rebuilt
from the recorded ``alloc.*`` trace events, ``records_from_events``): per tensor the buffer id, chunk, offset and
size, the node index at which it was allocated (``alloc_node``; -1 for leafs and graph inputs, placed before node 0
runs) and freed (``free_node``; None: never freed), the parent whose memory it took over in place (``reused_from``),
and for a view the tensor it looks into (``view_src``).

- every planned tensor is a rectangle spanning [offset, offset + size) x [alloc node, free node]: the bytes it holds
  while it is alive (``ggml_gallocr_allocate_node`` ... ``ggml_gallocr_free_node``);
- in-place reuse (``ggml_op_can_inplace``: the node writes its result over a dying parent) is a hand-over: the
  parent's rectangle ends and the child's begins at the same node and offset, marked with an arrow;
- views own no bytes (``ggml_gallocr_allocate_node`` skips them, ``ggml_backend_view_init`` points them into their
  source): drawn as small diamonds in their source's colour at the node that creates them;
- graph outputs (``GGML_TENSOR_FLAG_OUTPUT``) are never freed (``ggml_gallocr_free_node`` returns early): outlined
  in red up to the last node;
- the dashed line is the buffer the plan needs (``dyn_tallocr`` max size = ``ggml_gallocr_get_buffer_size`` after a
  reserve); tensors too small to see (below ``tiny_frac`` of it) are left out of the chart and counted in the band
  under it, which shows the bytes alive at every node.

``select(node)`` lists what is alive at that node, what it allocates, frees and hands over.
"""
from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ...capture.plans import AllocRecord, capture_alloc
from ...ggml.tensor import op_name
from .. import graph_dot as G
from ._base import VizWidget, chart_with_cursor, esc, fig_to_png, frames_book, html_table, png_img, quiet

_REUSE = "#ef6c00"     # hand-over arrows and the edge of a tensor that took over its parent's memory
_OUTPUT = "#c62828"    # outputs: never freed
_INPUT = "#2e7d32"     # graph inputs / leafs planned by the allocator


def _fmt_bytes(n) -> str:
    if n is None:
        return ""
    n = int(n)
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / 1024:.1f} KiB"
    return f"{n} B"


def records_from_events(events, galloc_id=None) -> list[dict]:
    """The tensor records of one graph plan rebuilt from recorded ``alloc.alloc`` / ``alloc.reuse`` /
    ``alloc.free`` / ``alloc.view`` events (the last plan of ``galloc_id``, default: of the last galloc that
    emitted ``alloc.reserve``). Same fields as ``galloc.last_alloc["tensors"]`` that the events carry."""
    evs = events.events if hasattr(events, "events") else list(events)
    reserves = [k for k, e in enumerate(evs) if e["kind"] == "alloc.reserve"
                and (galloc_id is None or e["galloc"] == galloc_id)]
    if not reserves:
        raise ValueError("no alloc.reserve event recorded: record the allocation with ggviz.trace.Recorder")
    end = reserves[-1]
    gid = evs[end]["galloc"]
    prev = [k for k in reserves if k < end and evs[k]["galloc"] == gid]
    start = prev[-1] + 1 if prev else 0
    recs: dict[int, dict] = {}

    def rec(e):
        r = recs.get(e["addr"])
        if r is None:
            r = dict(name=e["name"], addr=e["addr"], phase=e["phase"], buffer_id=None, chunk=None, offset=None,
                     size=0, alloc_size=0, alloc_node=None, free_node=None, reused_from=None, reused_by=None,
                     view_src=None, extra_freed=0)
            recs[e["addr"]] = r
        return r

    for e in evs[start:end]:
        if e.get("galloc") != gid:
            continue
        k = e["kind"]
        if k == "alloc.alloc":
            rec(e).update(buffer_id=e["buffer_id"], chunk=e["chunk"], offset=e["offset"], size=e["size"],
                          alloc_size=e["alloc_size"], alloc_node=e["node"])
        elif k == "alloc.reuse":
            r = rec(e)
            p = recs.get(e["parent_addr"])
            r.update(buffer_id=e["buffer_id"], chunk=e["chunk"], offset=e["offset"], size=e["size"],
                     alloc_node=e["node"], reused_from=e["parent"],
                     alloc_size=p["alloc_size"] if p is not None else e["size"])
            if p is not None:
                p.update(reused_by=e["name"], free_node=e["node"])
        elif k == "alloc.free":
            r = rec(e)
            if e["extra"]:
                # the tail of a larger parent taken over in place: the child keeps only its own (padded) size
                r["extra_freed"] += e["size"]
                r["alloc_size"] -= e["size"]
            else:
                r["free_node"] = e["node"]
        elif k == "alloc.view":
            if e["addr"] not in recs:
                src = recs.get(e["view_src_addr"])
                rec(e).update(view_src=e["view_src"], chunk=e["chunk"], offset=e["offset"], alloc_node=e["node"],
                              buffer_id=src["buffer_id"] if src is not None else None)
    return list(recs.values())


def inv_mid(fwd, y0, y1):
    """The data value drawn halfway between y0 and y1 on an axis with forward scale ``fwd`` (piecewise linear)."""
    u = (float(fwd(y0)) + float(fwd(y1))) / 2
    lo, hi = y0, y1
    for _ in range(40):                    # bisection: fwd is monotone
        m = (lo + hi) / 2
        if float(fwd(m)) < u:
            lo = m
        else:
            hi = m
    return (lo + hi) / 2


def _break_scale(brk, hi):
    """The forward and inverse functions of a broken offset axis: [0, brk] -> [0, 0.75] to scale, [brk, hi] ->
    [0.75, 1] (a decode's logits would otherwise squash every other tensor into a sliver)."""
    def fwd(y):
        y = np.asarray(y, dtype=float)
        return np.where(y <= brk, y * (0.75 / brk), 0.75 + (y - brk) * (0.25 / max(hi - brk, 1e-9)))

    def inv(u):
        u = np.asarray(u, dtype=float)
        return np.where(u <= 0.75, u * (brk / 0.75), brk + (u - 0.75) * (max(hi - brk, 1e-9) / 0.25))
    return fwd, inv


@dataclass
class _Window:
    """What ``AllocatorView.figure``'s phases share: the node range [a, b], the offset axis (``top``, the break
    ``ybrk`` or None, its forward function ``fwd``), the unit (``kib``: 1024 or 1), the plan's size and the tiny
    threshold."""
    a: int
    b: int
    n_shown: int
    top: float
    ybrk: float | None
    kib: float
    unit: str
    size: int
    thr: int
    fwd: object


class AllocatorView(VizWidget):
    """The last graph plan of a ``ggml_gallocr`` as an offset x node-index chart.

    Draws a ``capture.AllocRecord`` (``record=``, or as the first argument), and reads nothing else; given a live
    allocator instead it captures it first (``capture_alloc(galloc, graph, plan)``): ``galloc``: the allocator (``sched.galloc`` for a scheduler); ``graph``: the graph it planned (for a scheduler
    ``sched.graph``, the split graph with its input copies), used for node names and to find each view's source;
    ``plan``: a ``last_alloc`` dict instead of ``galloc``; ``space``: which buffer to draw (index into
    ``state()["spaces"]``, buffers of the same buffer type share one allocator and are one space);
    ``node_range``: (first, last) node to draw; ``tiny_frac``: tensors smaller than this fraction of the buffer go
    into the band instead of the chart; ``y_break``: "auto" (break the offset axis when a few huge tensors, such
    as a decode's logits, would flatten everything else) or "off".
    """

    def __init__(self, galloc=None, graph=None, plan=None, space: int = 0, node_range=None, tiny_frac: float = 0.004,
                 title: str | None = None, y_break: str = "auto", record: AllocRecord | None = None):
        if isinstance(galloc, AllocRecord):
            galloc, record = None, galloc
        if record is None:                       # a live allocator (or a bare plan): capture it first
            record = capture_alloc(galloc, graph, plan)
        self.record = record
        # what the drawing reads: the record's fields, nothing of the allocator or the graph
        self.plan = plan = record.plan
        self.title = title
        self.tiny_frac = float(tiny_frac)
        self.y_break = y_break
        self.n_nodes = int(plan["n_nodes"])
        n_buf = len(plan["chunk_sizes"])
        # buffer ids that share one dyn_tallocr (same buffer type) are one address space
        owner = list(record.buffer_owner)
        names = record.buffer_names
        self.allocated_sizes = list(record.allocated_sizes)
        self.spaces = []
        for i in range(n_buf):
            if owner[i] == i:
                self.spaces.append(dict(index=len(self.spaces), buffer_ids=[i], name=names[i],
                                        chunk_sizes=list(plan["chunk_sizes"][i]),
                                        allocated=self.allocated_sizes[i]))
            else:
                sp = next(s for s in self.spaces if owner[i] in s["buffer_ids"])
                sp["buffer_ids"].append(i)
        self._owner = owner
        # node names and ops of the graph; each view's source (by address)
        self.node_names = list(record.node_names)
        self.node_ops = list(record.node_ops)
        self._vsrc_addr = {a: b for a, b in record.view_srcs}
        self._build_items()
        self.space = 0
        self.set_space(space, _quiet=True)
        self.node_range = None
        if node_range is not None:
            self.set_range(*node_range, _quiet=True)
        self.node = None

    # ---------------------------------------------------------------------------------------------- plain data
    def _build_items(self):
        recs = self.plan["tensors"]
        last = self.n_nodes - 1
        by_addr = {r["addr"]: r for r in recs}
        items = []
        for k, r in enumerate(recs):
            if r["view_src"] is not None or r["offset"] is None or r["alloc_size"] <= 0:
                continue
            end = r["free_node"] if r["free_node"] is not None else last
            items.append(dict(id=k, name=r["name"], addr=r["addr"], op=op_name(r["op"]) if "op" in r else None,
                              phase=r["phase"], space=self._owner[r["buffer_id"]], buffer_id=r["buffer_id"],
                              chunk=r["chunk"], offset=r["offset"], size=r["size"], alloc_size=r["alloc_size"],
                              alloc_node=r["alloc_node"], free_node=r["free_node"], end_node=end,
                              reused_from=r["reused_from"], reused_by=r["reused_by"],
                              output=bool(r.get("output")), input=bool(r.get("input")),
                              never_freed=r["free_node"] is None, extra_freed=r.get("extra_freed", 0),
                              reused_from_id=None, reused_by_id=None))
            if 0 <= (r["alloc_node"] or 0) < self.n_nodes and r["phase"] == "nodes" and self.node_ops[r["alloc_node"]]:
                if self.node_names[r["alloc_node"]] == r["name"]:
                    items[-1]["op"] = self.node_ops[r["alloc_node"]]
        # resolve the hand-overs: the parent has the child's name as reused_by, frees at the child's alloc node, at
        # the same chunk and offset
        for c in items:
            if c["reused_from"] is None:
                continue
            for p in items:
                if (p["reused_by"] == c["name"] and p["name"] == c["reused_from"] and p["free_node"] == c["alloc_node"]
                        and p["space"] == c["space"] and p["chunk"] == c["chunk"] and p["offset"] == c["offset"]):
                    c["reused_from_id"], p["reused_by_id"] = p["id"], c["id"]
                    break
        self.items = items
        by_id = {it["id"]: it for it in items}
        # views: drawn on their source (found by address from the graph, else by name, offset and liveness)
        views = []
        for k, r in enumerate(recs):
            if r["view_src"] is None:
                continue
            v = dict(id=k, name=r["name"], view_src=r["view_src"], node=r["alloc_node"], chunk=r["chunk"],
                     offset=r["offset"], external=r["offset"] is None, src_id=None, space=None)
            if not v["external"]:
                src = None
                sa = self._vsrc_addr.get(r["addr"])
                if sa is not None and sa in by_addr:
                    src = next((it for it in items if it["addr"] == sa), None)
                if src is None:
                    cands = [it for it in items if it["name"] == r["view_src"] and it["chunk"] == r["chunk"]
                             and it["offset"] <= r["offset"] < it["offset"] + it["alloc_size"]
                             and (it["alloc_node"] is None or it["alloc_node"] <= (r["alloc_node"] or 0))]
                    cands.sort(key=lambda it: it["alloc_node"] if it["alloc_node"] is not None else -2)
                    src = cands[-1] if cands else None
                if src is not None:
                    v["src_id"], v["space"] = src["id"], src["space"]
            views.append(v)
        self.views = views
        self._by_id = by_id

    def set_space(self, space: int, _quiet=False):
        if not 0 <= space < len(self.spaces):
            raise IndexError(f"space {space} out of range ({len(self.spaces)} buffers)")
        self.space = int(space)
        if not _quiet:
            self._changed()
        return self

    def set_range(self, first: int | None, last: int | None = None, _quiet=False):
        """Draw only nodes first..last (None: the whole graph)."""
        if first is None:
            self.node_range = None
        else:
            last = self.n_nodes - 1 if last is None else last
            self.node_range = (max(-1, int(first)), min(self.n_nodes - 1, int(last)))
        if not _quiet:
            self._changed()
        return self

    def select(self, node: int | str | None):
        """Select a node (index, or the name of a graph node): ``state()["selected"]`` lists what is alive there."""
        if isinstance(node, str):
            if node not in self.node_names:
                raise KeyError(f"no node named {node!r}")
            node = self.node_names.index(node)
        if node is not None and not -1 <= int(node) < self.n_nodes:
            raise IndexError(f"node {node} out of range (-1 .. {self.n_nodes - 1})")
        self.node = None if node is None else int(node)
        if self.node is not None and self.node_range is not None:
            a, b = self.node_range
            if not a <= self.node <= b:
                w = b - a
                a = max(-1, self.node - w // 2)
                self.node_range = (a, min(self.n_nodes - 1, a + w))
        self._changed()
        return self

    def space_items(self, space=None) -> list[dict]:
        sp = self.space if space is None else space
        return [it for it in self.items if it["space"] == sp]

    def space_size(self, space=None) -> int:
        sp = self.spaces[self.space if space is None else space]
        return int(sum(sp["chunk_sizes"]))

    def tiny_threshold(self, space=None) -> int:
        return int(self.tiny_frac * max(self.space_size(space), 1))

    def alive_at(self, node: int, space=None) -> list[dict]:
        return [it for it in self.space_items(space) if it["alloc_node"] <= node <= it["end_node"]]

    def live_bytes(self, space=None) -> np.ndarray:
        """Bytes alive at each node -1 .. n_nodes-1 (index 0 is node -1); a hand-over counts the bytes once."""
        return self._accumulate(self.space_items(space))

    def _accumulate(self, items, count: bool = False) -> np.ndarray:
        lb = np.zeros(self.n_nodes + 1, np.int64)
        for it in items:
            e = it["end_node"]
            if it["reused_by_id"] is not None:
                e -= 1                      # the child holds these bytes from the hand-over node on
            lb[it["alloc_node"] + 1:e + 2] += 1 if count else it["alloc_size"]
        return lb

    def node_info(self, node: int | None = None) -> dict | None:
        n = self.node if node is None else node
        if n is None:
            return None
        sp = self.space
        alive = self.alive_at(n)
        allocated = [it for it in alive if it["alloc_node"] == n]
        freed = [it for it in self.space_items() if it["free_node"] == n and it["reused_by_id"] is None]
        handed = [it for it in self.space_items() if it["free_node"] == n and it["reused_by_id"] is not None]
        views = [v for v in self.views if v["node"] == n]

        def row(it):
            return dict(name=it["name"], op=it["op"], offset=it["offset"], size=it["alloc_size"],
                        alloc_node=it["alloc_node"], free_node=it["free_node"], reused_from=it["reused_from"],
                        reused_by=it["reused_by"], output=it["output"])

        return dict(node=n, name=self.node_names[n] if n >= 0 else "(leafs and graph inputs)",
                    op=self.node_ops[n] if n >= 0 else None, space=sp,
                    alive=[row(it) for it in sorted(alive, key=lambda it: it["offset"])],
                    allocated=[row(it) for it in allocated], freed=[row(it) for it in freed],
                    handed_over=[dict(row(it), to=it["reused_by"]) for it in handed],
                    views=[dict(name=v["name"], view_src=v["view_src"], offset=v["offset"],
                                external=v["external"]) for v in views],
                    alive_bytes=int(self.live_bytes()[n + 1]))

    def rects(self, space=None) -> list[dict]:
        """The rectangles of the chart (before collapsing tiny ones): one per planned tensor of the buffer."""
        return [dict(name=it["name"], chunk=it["chunk"], offset=it["offset"], size=it["alloc_size"],
                     alloc_node=it["alloc_node"], free_node=it["free_node"], end_node=it["end_node"],
                     reused_from=it["reused_from"], output=it["output"], tiny=it["alloc_size"] < self.tiny_threshold(space))
                for it in self.space_items(space)]

    def state(self) -> dict:
        sp = self.spaces[self.space]
        items = self.space_items()
        thr = self.tiny_threshold()
        lb = self.live_bytes()
        return {"n_nodes": self.n_nodes, "n_leafs": self.plan.get("n_leafs"),
                "spaces": [dict(s) for s in self.spaces], "space": self.space,
                "buffer": sp["name"], "chunk_sizes": list(sp["chunk_sizes"]), "buffer_size": self.space_size(),
                "allocated_size": sp["allocated"],
                "rects": self.rects(), "n_rects": len(items),
                "n_reused": sum(1 for it in items if it["reused_from"] is not None),
                "n_outputs": sum(1 for it in items if it["output"]),
                "never_freed": [it["name"] for it in items if it["never_freed"]],
                "views": [dict(v) for v in self.views if v["space"] in (None, self.space)],
                "n_views": sum(1 for v in self.views if v["space"] == self.space),
                "n_external_views": sum(1 for v in self.views if v["external"]),
                "tiny_threshold": thr, "collapsed": [it["name"] for it in items if it["alloc_size"] < thr],
                "sum_sizes": int(sum(it["alloc_size"] for it in items)),
                "peak_live_bytes": int(lb.max()) if len(lb) else 0,
                "max_extent": max((it["offset"] + it["alloc_size"] for it in items), default=0),
                "node_range": self.node_range, "selected": self.node_info(),
                "reallocated": list(self.plan.get("reallocated", []))}

    # ---------------------------------------------------------------------------------------------- drawing
    def _ybase(self, chunk: int) -> int:
        return int(sum(self.spaces[self.space]["chunk_sizes"][:chunk]))

    def _yscale(self, items, live, a: int, b: int):
        """How the offset axis is drawn: (top, y_break or None). With the whole graph shown and a few huge tensors
        (the logits of a decode) dwarfing everything else, the axis is broken: its lower 3/4 shows [0, y_break]
        to scale, the upper 1/4 the rest. With a node range, the axis fits the tensors alive in it."""
        size = self.space_size()
        ext = [self._ybase(it["chunk"]) + it["offset"] + it["alloc_size"] for it in items]
        if self.node_range is not None:
            top = max([e for it, e in zip(items, ext) if it["alloc_node"] <= b and it["end_node"] >= a] or [size])
            return top * 1.08, None
        top = max([size] + ext) * 1.07
        big = [it["alloc_size"] > 0.25 * size for it in items]
        rest = max([e for e, bg in zip(ext, big) if not bg] or [0])
        if any(big) and 0 < rest < 0.4 * size and self.y_break != "off":
            return top, rest * 1.12
        return top, None

    def figure(self, highlight="current"):
        """The chart (a matplotlib Figure): tensors as rectangles above, the bytes alive per node in a band below,
        both over the node range; ``highlight``: a node to mark (default: the selected one)."""
        hl = self.node if highlight == "current" else highlight
        items = self.space_items()
        w = self._window(items)
        shown = [it for it in items if it["alloc_node"] <= w.b and it["end_node"] >= w.a]
        big = [it for it in shown if it["alloc_size"] >= w.thr]
        fig, (ax, axb) = plt.subplots(2, 1, figsize=(13, 7.2), sharex=True,
                                      gridspec_kw=dict(height_ratios=[5, 1.15], hspace=0.08))
        if w.ybrk is not None:
            ax.set_yscale("function", functions=_break_scale(w.ybrk / w.kib, w.top / w.kib))
        xs = self._draw_tensors(ax, big, w)
        self._draw_handovers(ax, big, xs, w)
        self._draw_views(ax, w)
        self._draw_labels(ax, big, xs, w)
        self._draw_buffer_lines(ax, w)
        ax.set_ylim(0, w.top / w.kib)
        ax.set_xlim(w.a - 0.5, w.b + 0.5)
        ax.set_ylabel(f"offset in the buffer ({w.unit})", fontsize=11)
        ax.tick_params(labelsize=10)
        if hl is not None and w.a <= hl <= w.b:
            for axx in (ax, axb):
                axx.axvspan(hl - 0.5, hl + 0.5, facecolor="#fff176", alpha=0.35, edgecolor="#f9a825",
                            linewidth=1.5, zorder=4.5)
        self._draw_legend(ax, big, items, w)
        self._draw_band(axb, items, w)
        self._finish_axes(fig, ax, axb, w)
        return fig

    # The phases of ``figure``, in the order they draw (matplotlib keeps that order for artists of one zorder).

    def _window(self, items) -> _Window:
        """The node range and offset axis of the picture: the whole graph, or ``node_range``; bytes or KiB."""
        a, b = self.node_range if self.node_range is not None else (-1, self.n_nodes - 1)
        top, ybrk = self._yscale(items, self.live_bytes(), a, b)
        kib = 1024.0 if top >= 8192 else 1.0
        if ybrk is not None:
            fwd, _inv = _break_scale(ybrk / kib, top / kib)
        else:
            def fwd(y):
                return np.asarray(y, dtype=float) / (top / kib)
        return _Window(a=a, b=b, n_shown=b - a + 1, top=top, ybrk=ybrk, kib=kib, unit="KiB" if kib > 1 else "bytes",
                       size=self.space_size(), thr=self.tiny_threshold(), fwd=fwd)

    def _ymid(self, w: _Window, y0, y1) -> float:
        """Where the middle of [y0, y1] is drawn (on a broken axis, not the data midpoint)."""
        return float(inv_mid(w.fwd, y0, y1)) if w.ybrk is not None else (y0 + y1) / 2

    def _draw_tensors(self, ax, big, w: _Window) -> dict:
        """Each tensor's rectangle, [alloc node, free node] x [offset, offset + size), in one PolyCollection (the
        decode plan has ~1,000); the edge colour says what is special about it. Returns {id: (x0, x1, y0, y1)}."""
        polys, faces, edges, lws = [], [], [], []
        xs = {}
        for it in big:
            x0 = it["alloc_node"] - 0.5
            x1 = it["end_node"] + 0.5
            if it["reused_from_id"] is not None:
                x0 = it["alloc_node"]          # the hand-over: the parent reads, the child writes, at this node
            if it["reused_by_id"] is not None:
                x1 = it["end_node"]
            if it["never_freed"]:
                x1 = self.n_nodes - 0.5
            y0 = (self._ybase(it["chunk"]) + it["offset"]) / w.kib
            y1 = y0 + it["alloc_size"] / w.kib
            xs[it["id"]] = (x0, x1, y0, y1)
            polys.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
            faces.append(G.op_color(it["op"] or "NONE") if it["phase"] == "nodes" else "#c8e6c9")
            if it["output"]:
                edges.append(_OUTPUT)
                lws.append(2.4)
            elif it["reused_from_id"] is not None:
                edges.append(_REUSE)
                lws.append(1.3)
            elif it["phase"] != "nodes":
                edges.append(_INPUT)
                lws.append(1.2)
            else:
                edges.append("#37474f")
                lws.append(0.5)
        ax.add_collection(PolyCollection(polys, facecolors=faces, edgecolors=edges, linewidths=lws, zorder=2))
        return xs

    def _draw_handovers(self, ax, big, xs, w: _Window):
        """An arrow where a node writes its result over a dying parent (ggml_op_can_inplace)."""
        hx, hy = [], []
        for it in big:
            if it["reused_from_id"] is not None and w.a <= it["alloc_node"] <= w.b:
                x0, x1, y0, y1 = xs[it["id"]]
                hx.append(x0)
                hy.append(self._ymid(w, y0, y1))
        if hx:
            ax.scatter(hx, hy, marker=">", s=36 if w.n_shown > 120 else 70, color=_REUSE, edgecolors="white",
                       linewidths=0.5, zorder=4)

    def _draw_views(self, ax, w: _Window):
        """Views own no bytes: a diamond on their source, at the node that creates them."""
        kib = w.kib
        vx, vy = [], []
        for v in self.views:
            if v["space"] != self.space or v["src_id"] is None or v["src_id"] not in self._by_id:
                continue
            src = self._by_id[v["src_id"]]
            if src["alloc_size"] < w.thr or not w.a <= v["node"] <= w.b:
                continue
            y0 = (self._ybase(v["chunk"]) + v["offset"]) / kib
            ys = (self._ybase(src["chunk"]) + src["offset"] + src["alloc_size"]) / kib
            vx.append(v["node"])
            vy.append(y0 + min(ys - y0, w.top / kib * 0.02) / 2)
        if vx:
            ax.scatter(vx, vy, marker="D", s=14 if w.n_shown > 120 else 30, facecolors="white",
                       edgecolors="#455a64", linewidths=0.8, zorder=3)

    def _draw_labels(self, ax, big, xs, w: _Window):
        """Names inside the rectangles where they fit (width in inches at ~9.5 in of axis, height at ~5 in)."""
        u_top = float(w.fwd(w.top / w.kib))
        for it in big:
            x0, x1, y0, y1 = xs[it["id"]]
            vis0, vis1 = max(x0, w.a - 0.5), min(x1, w.b + 0.5)
            w_in = (vis1 - vis0) / max(w.n_shown, 1) * 9.5
            h_in = float(w.fwd(y1) - w.fwd(y0)) / u_top * 5.0
            label = it["name"]
            if w_in > 0.075 * len(label) + 0.05 and h_in > 0.17:
                ax.text((vis0 + vis1) / 2, self._ymid(w, y0, y1), label, ha="center", va="center", fontsize=9,
                        clip_on=True, zorder=5)

    def _draw_buffer_lines(self, ax, w: _Window):
        """The buffer the plan needs (dashed, per chunk), the one allocated when bigger (dotted), the axis break."""
        sp, kib, size, top = self.spaces[self.space], w.kib, w.size, w.top
        y_chunk = 0
        for cs in sp["chunk_sizes"]:
            y_chunk += cs
            if y_chunk <= top:
                ax.axhline(y_chunk / kib, color="#212121", linestyle="--", linewidth=1.4, zorder=3)
        note = (f"buffer needed by this plan: {_fmt_bytes(size)}"
                + (f" in {len(sp['chunk_sizes'])} chunks" if len(sp["chunk_sizes"]) > 1 else ""))
        if size <= top:
            ax.text(w.a - 0.5 + w.n_shown * 0.005, size / kib, " " + note, va="bottom", ha="left", fontsize=10,
                    zorder=6)
        else:
            ax.text(0.005, 0.985, note + " (above this window)", transform=ax.transAxes, va="top", ha="left",
                    fontsize=10, zorder=6)
        if sp["allocated"] and sp["allocated"] > size and sp["allocated"] <= top:
            ax.axhline(sp["allocated"] / kib, color="#757575", linestyle=":", linewidth=1.2)
            ax.text(w.b + 0.5, sp["allocated"] / kib, f"allocated buffer: {_fmt_bytes(sp['allocated'])} ",
                    va="bottom", ha="right", fontsize=9, color="#616161")
        if w.ybrk is not None:
            ax.axhline(w.ybrk / kib, color="#9e9e9e", linestyle=(0, (1, 3)), linewidth=1.0, zorder=1)
            ax.text(w.b + 0.5, w.ybrk / kib, f"axis break: to scale below {_fmt_bytes(w.ybrk)}, compressed above ",
                    va="bottom", ha="right", fontsize=9, color="#616161", zorder=6)
            lo = np.linspace(0, w.ybrk / kib, 5)[:-1]
            ax.set_yticks(list(lo) + [w.ybrk / kib, size / kib])
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0f}" if v >= 10 else f"{v:.1f}"))

    def _draw_legend(self, ax, big, items, w: _Window):
        """The legend (what the edges and marks mean, then up to 14 ops in order of first appearance) and title."""
        sp = self.spaces[self.space]
        handles = [Patch(facecolor="#c8e6c9", edgecolor=_INPUT, label="leaf / graph input (before node 0)"),
                   Patch(facecolor="#eeeeee", edgecolor=_OUTPUT, linewidth=2.4, label="output: never freed"),
                   Patch(facecolor="#eeeeee", edgecolor=_REUSE, linewidth=1.3, label="took over its parent in place"),
                   Line2D([], [], marker=">", color=_REUSE, linestyle="", markersize=8, label="in-place hand-over"),
                   Line2D([], [], marker="D", color="#455a64", markerfacecolor="white", linestyle="", markersize=6,
                          label="view (no bytes of its own)")]
        ops_seen = []
        for it in big:
            if it["phase"] == "nodes" and it["op"] and it["op"] not in ops_seen:
                ops_seen.append(it["op"])
        handles += [Patch(facecolor=G.op_color(o), edgecolor="#37474f", label=o) for o in ops_seen[:14]]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9, frameon=False)
        rng = f", nodes {w.a}..{w.b}" if self.node_range is not None else ""
        title = self.title or (f"ggml_gallocr plan: {sp['name']} buffer, {len(items)} tensors over "
                               f"{self.n_nodes} nodes{rng}")
        ax.set_title(title, fontsize=12, pad=16)

    def _draw_band(self, axb, items, w: _Window):
        """The band under the chart: bytes alive per node, and the share of the tiny tensors left out above (so no
        byte of the plan goes unshown)."""
        kib, size, a, b = w.kib, w.size, w.a, w.b
        lb = self.live_bytes()
        xs_all = np.arange(-1, self.n_nodes)
        tiny_items = [it for it in items if it["alloc_size"] < w.thr]
        axb.fill_between(xs_all, lb / kib, step="mid", color="#90caf9", label="bytes alive (all tensors)")
        if tiny_items:
            axb.fill_between(xs_all, self._accumulate(tiny_items) / kib, step="mid", color="#1565c0",
                             label=f"of which {len(tiny_items)} tiny tensors (< {_fmt_bytes(w.thr)}), not drawn above")
        win = lb[a + 1:b + 2]
        hi_b = max(int(win.max()) if len(win) else 0, 1)
        if self.node_range is None or size <= hi_b * 1.5:
            axb.axhline(size / kib, color="#212121", linestyle="--", linewidth=1.2)
            hi_b = max(hi_b, size)
        if w.ybrk is not None:
            axb.set_yscale("function", functions=_break_scale(w.ybrk / kib, w.top / kib))
            axb.set_yticks([0, w.ybrk / kib, size / kib])
            axb.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0f}"))
            axb.set_ylim(0, w.top / kib)
        else:
            axb.set_ylim(0, hi_b / kib * 1.2)
        axb.set_ylabel(f"alive ({w.unit})", fontsize=10)
        axb.set_xlabel("node index (execution order; -1 = leafs and inputs, placed before node 0)", fontsize=11)
        axb.tick_params(labelsize=10)
        axb.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9, frameon=False)

    def _finish_axes(self, fig, ax, axb, w: _Window):
        """Open frames; with 48 nodes or fewer, every node named on the x axis."""
        for s in ("top", "right"):
            ax.spines[s].set_visible(False)
            axb.spines[s].set_visible(False)
        if w.n_shown <= 48 and any(self.node_names):
            ticks = list(range(w.a, w.b + 1))
            axb.set_xticks(ticks)
            axb.set_xticklabels([f"{i} {(self.node_names[i] or '')[:22]}" if i >= 0 else "-1 (leafs, inputs)"
                                 for i in ticks], rotation=60, ha="right", fontsize=9 if w.n_shown <= 24 else 8)
        fig.subplots_adjust(left=0.07, right=0.74, top=0.93, bottom=0.12 if w.n_shown > 48 else 0.25)

    def png(self, dpi: int = 100) -> bytes:
        return fig_to_png(self.figure(), dpi=dpi)

    def info_html(self) -> str:
        st = self.state()
        sp = self.spaces[self.space]
        head = (f"<b>{esc(sp['name'])} buffer</b> (buffer ids {sp['buffer_ids']}): plan needs "
                f"<b>{_fmt_bytes(st['buffer_size'])}</b>"
                + (f", allocated {_fmt_bytes(st['allocated_size'])}" if st["allocated_size"] is not None else "")
                + f"; {st['n_rects']} tensors placed ({_fmt_bytes(st['sum_sizes'])} if each kept its own bytes), "
                  f"{st['n_reused']} in place over a parent, {st['n_views']} views, peak alive "
                  f"{_fmt_bytes(st['peak_live_bytes'])}")
        ni = st["selected"]
        if ni is None:
            return head + "<br/><i>select a node to list what is alive there</i>"
        cols = ["name", "op", "offset", "size", "alloc_node", "free_node", "reused_from", "reused_by", "output"]
        parts = [head, f"<h4 style='margin:6px 0 2px'>node {ni['node']}: {esc(ni['name'])}"
                       f"{' (' + esc(ni['op']) + ')' if ni['op'] else ''}: {len(ni['alive'])} tensors alive, "
                       f"{_fmt_bytes(ni['alive_bytes'])}</h4>"]
        if ni["allocated"]:
            parts.append(html_table(ni["allocated"], cols, title="allocated here (ggml_gallocr_allocate_node)"))
        if ni["handed_over"]:
            parts.append(html_table(ni["handed_over"], ["name", "offset", "size", "to"],
                                    title="handed over in place (the node writes over this parent)"))
        if ni["freed"]:
            parts.append(html_table(ni["freed"], cols, title="freed after this node (ggml_gallocr_free_node)"))
        if ni["views"]:
            parts.append(html_table(ni["views"], ["name", "view_src", "offset", "external"],
                                    title="views created here (no bytes of their own)"))
        parts.append(html_table(ni["alive"], cols, title="alive at this node", max_rows=80))
        return "".join(parts)

    def to_html(self) -> str:
        return png_img(self.png(), "max-width:100%") + self.info_html()

    def book_view(self) -> dict:
        """The chart drawn once per buffer (no node marked), the selected node's column marked over it in the page;
        every node's table (what is allocated, handed over, freed, alive there) recorded as HTML. The node range
        shown is this page's: another range is another drawing, which needs a kernel."""
        a, b = self.node_range if self.node_range is not None else (-1, self.n_nodes - 1)
        saved = self.space, self.node
        pics = {}
        try:
            with quiet(self):
                for sp in range(len(self.spaces)):
                    self.space = sp
                    fig = self.figure(highlight=None)
                    pics[sp] = chart_with_cursor(fig, fig.axes[0], fig.axes[1])

                def frame(key):
                    sp, node = key
                    self.space, self.node = sp, node
                    img, box = pics[sp]
                    return {"picture": img, "cursor": [box(node - 0.5, node + 0.5)], "info": self.info_html()}

                ctrls = [{"name": "node", "label": "node", "kind": "range", "min": a, "max": b, "width": 480,
                          "value": self.node if self.node is not None and a <= self.node <= b else a}]
                if len(self.spaces) > 1:
                    ctrls.append({"name": "space", "label": "buffer", "kind": "select", "value": self.space,
                                  "options": [[f"{s['name']} (buffer ids {s['buffer_ids']})", s["index"]]
                                              for s in self.spaces]})
                keys = [(sp, n) for sp in range(len(self.spaces)) for n in range(a, b + 1)]
                return frames_book(ctrls, [(n, sp) if len(self.spaces) > 1 else (n,) for sp, n in keys],
                                   lambda k: frame((k[1] if len(k) > 1 else 0, k[0])),
                                   note="" if self.node_range is None else
                                   f"nodes {a} … {b} shown: another range is another drawing, which needs a kernel "
                                   f"(run the notebook and move the range slider)")
        finally:
            self.space, self.node = saved

    def _build(self):

        self._w_node = W.IntSlider(value=self.node if self.node is not None else -1, min=-1, max=self.n_nodes - 1,
                                   description="node", continuous_update=False, layout=W.Layout(width="700px"))
        self._w_node.observe(lambda ch: self.select(ch["new"]), "value")
        a, b = self.node_range if self.node_range is not None else (-1, self.n_nodes - 1)
        self._w_range = W.IntRangeSlider(value=(a, b), min=-1, max=self.n_nodes - 1, description="nodes shown",
                                         continuous_update=False, layout=W.Layout(width="700px"))
        self._w_range.observe(lambda ch: self.set_range(*ch["new"]), "value")
        ctrls = [self._w_node, self._w_range]
        if len(self.spaces) > 1:
            self._w_space = W.Dropdown(options=[(f"{s['name']} (buffer ids {s['buffer_ids']})", s["index"])
                                                for s in self.spaces], value=self.space, description="buffer")
            self._w_space.observe(lambda ch: self.set_space(ch["new"]), "value")
            ctrls.append(self._w_space)
        self._w_img = W.HTML()
        self._w_info = W.HTML()
        return W.VBox(ctrls + [self._w_img, self._w_info])

    def _refresh(self):
        if self.node is not None and self._w_node.value != self.node:
            self._w_node.value = self.node
        a, b = self.node_range if self.node_range is not None else (-1, self.n_nodes - 1)
        if tuple(self._w_range.value) != (a, b):
            self._w_range.value = (a, b)
        self._w_img.value = png_img(self.png(), "max-width:100%")
        self._w_info.value = self.info_html()
