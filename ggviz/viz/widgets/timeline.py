"""One graph compute, thread by thread: which node each thread ran when, its mul_mat chunks, its barrier waits.

Drawn only from recorded events of the CPU backend (``ggml_graph_compute``):

- ``cpu.plan``: n_threads, per-node ``n_tasks`` and the work size;
- ``cpu.compute.start`` / ``cpu.compute.end``: the compute's bounds (events in between belong to it);
- ``cpu.node``: thread ``ith`` ran node ``node_n`` from ``t_start`` to ``t_end`` (every thread calls every
  computed node's kernel; threads with ``ith >= n_tasks`` return at once);
- ``cpu.chunk``: thread ``ith`` computed chunk ``chunk`` of a mul_mat (rows ``ir0`` x columns ``ir1``) from
  ``t_start`` to ``t_end`` (without those fields: from the event time ``t`` to its next chunk or the node's end);
- ``cpu.barrier``: thread ``ith`` waited in ``ggml_barrier`` from ``t_enter`` to ``t_exit`` (after every node).
"""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from .. import graph_dot as G
from ._base import VizWidget, esc, fig_to_png, html_table, png_img


def timeline_data(events, which: int = -1) -> dict:
    """Plain data of one compute (``which``: index among the recorded computes, -1 = the last).

    Times are microseconds from the compute's start. Returns ``n_threads``, ``n_tasks`` (from the plan, if
    recorded), ``nodes`` [{ith, node_n, name, op, t0, t1}], ``chunks`` [{ith, node_n, chunk, t0, t1, ir0, ir1}],
    ``barriers`` [{ith, node_n, t0, t1}] and ``t_end``.
    """
    evs = events.events if hasattr(events, "events") else list(events)
    starts = [k for k, e in enumerate(evs) if e["kind"] == "cpu.compute.start"]
    if not starts:
        raise ValueError("no cpu.compute.start event recorded: record a graph compute with ggviz.trace.Recorder")
    s = starts[which]
    e_end = next((k for k in range(s + 1, len(evs)) if evs[k]["kind"] == "cpu.compute.end"), len(evs))
    start = evs[s]
    plan = next((evs[k] for k in range(s - 1, -1, -1) if evs[k]["kind"] == "cpu.plan"
                 and evs[k].get("graph") == start.get("graph")), None)
    t_base = start["t"]
    us = 1e-3
    nodes, chunks_raw, barriers = [], [], []
    for e in evs[s + 1:e_end]:
        k = e["kind"]
        if k == "cpu.node":
            nodes.append({"ith": e["ith"], "node_n": e["node_n"], "name": e["name"], "op": e["op"],
                          "t0": (e["t_start"] - t_base) * us, "t1": (e["t_end"] - t_base) * us,
                          "fused": bool(e.get("fused"))})
        elif k == "cpu.chunk":
            chunks_raw.append(e)
        elif k == "cpu.barrier":
            barriers.append({"ith": e["ith"], "t0": (e["t_enter"] - t_base) * us, "t1": (e["t_exit"] - t_base) * us,
                             "node_n": e.get("node_n"), "where": e.get("where")})
    n_threads = start.get("n_threads") or (max((n["ith"] for n in nodes), default=0) + 1)
    # per thread, nodes in time order: a chunk belongs to the node running on its thread at its time
    by_thread = {i: sorted([n for n in nodes if n["ith"] == i], key=lambda n: n["t0"]) for i in range(n_threads)}
    t0s = {i: np.array([n["t0"] for n in lst]) for i, lst in by_thread.items()}
    t1s = {i: np.array([n["t1"] for n in lst]) for i, lst in by_thread.items()}
    chunks = []
    for e in chunks_raw:
        # a chunk event with t_start/t_end times itself; one without (emitted as the chunk starts) lasts until
        # that thread's next chunk or the end of its node
        timed = "t_start" in e and "t_end" in e
        t = ((e["t_start"] if timed else e["t"]) - t_base) * us
        lst = by_thread.get(e["ith"], [])
        j = int(np.searchsorted(t0s.get(e["ith"], np.zeros(0)), t, side="right")) - 1
        owner = lst[j] if j >= 0 else None
        t1 = (e["t_end"] - t_base) * us if timed else None
        chunks.append({"ith": e["ith"], "node_n": owner["node_n"] if owner else None, "name": e["node"],
                       "chunk": e["chunk"], "t0": t, "t1": t1, "ir0": tuple(e["ir0"]), "ir1": tuple(e["ir1"])})
    chunks.sort(key=lambda c: (c["ith"], c["t0"]))
    for k, a in enumerate(chunks):
        if a["t1"] is None:
            b = chunks[k + 1] if k + 1 < len(chunks) else None
            if b is not None and b["ith"] == a["ith"] and b["node_n"] == a["node_n"]:
                a["t1"] = b["t0"]
            else:
                own = [n for n in by_thread.get(a["ith"], []) if n["node_n"] == a["node_n"]]
                a["t1"] = own[0]["t1"] if own else a["t0"]
    for b in barriers:
        if b.get("node_n") is not None:          # the engine says which node the barrier follows (or is inside)
            continue
        lst = by_thread.get(b["ith"], [])
        j = int(np.searchsorted(t1s.get(b["ith"], np.zeros(0)), b["t0"] + 1e-9, side="right")) - 1
        b["node_n"] = lst[j]["node_n"] if j >= 0 else None
    t_end = (evs[e_end]["t"] - t_base) * us if e_end < len(evs) else max((n["t1"] for n in nodes), default=0.0)
    return {"n_threads": int(n_threads), "n_tasks": list(plan["n_tasks"]) if plan else None,
            "work_size": plan["work_size"] if plan else None, "n_nodes": start.get("n_nodes"),
            "nodes": nodes, "chunks": chunks, "barriers": barriers, "t_end": t_end}


def plot_timeline(data: dict, node_range=None, highlight: int | None = None, ax=None, title: str | None = None):
    """Gantt chart: one row per thread; node bars coloured by op (labelled when wide enough), mul_mat chunks as
    ticks under them, barrier waits hatched grey. ``node_range=(a, b)``: only nodes a..b-1 (and the time they
    span). Returns the Figure."""

    nodes = data["nodes"]
    if node_range is not None:
        a, b = node_range
        nodes = [n for n in nodes if a <= n["node_n"] < b]
    if not nodes:
        raise ValueError("no computed node in that range")
    t_lo = min(n["t0"] for n in nodes)
    t_hi = max(n["t1"] for n in nodes)
    sel = {n["node_n"] for n in nodes}
    chunks = [c for c in data["chunks"] if c["node_n"] in sel]
    barriers = [b for b in data["barriers"] if b["t1"] >= t_lo and b["t0"] <= t_hi]
    nt = data["n_threads"]
    if ax is None:
        fig, ax = plt.subplots(figsize=(13, 1.2 + 1.0 * nt))
    else:
        fig = ax.figure
    H = 0.55
    ops_seen: dict = {}
    span = t_hi - t_lo or 1.0
    minw = span * 1e-4
    # one broken_barh per (thread, colour): thousands of spans draw fast as a few collections
    groups: dict = {}
    for n in nodes:
        c = G.op_color(n["op"])
        ops_seen[n["op"]] = c
        groups.setdefault((n["ith"], c), []).append((n["t0"], max(n["t1"] - n["t0"], minw)))
    for (ith, c), xr in groups.items():
        ax.broken_barh(xr, (ith - H / 2, H), facecolors=c, edgecolors="#424242", linewidth=0.4, zorder=2)
    for n in nodes:
        w = max(n["t1"] - n["t0"], minw)
        if highlight is not None and n["node_n"] == highlight:
            ax.add_patch(Rectangle((n["t0"], n["ith"] - H / 2), w, H, facecolor="none", edgecolor="#d50000",
                                   linewidth=2.5, zorder=3))
        label = f"#{n['node_n']} {n['name']}"
        if w > span * 0.0062 * (len(label) + 1):          # ~ the text's width at 7.5 pt on a 10-inch axis
            ax.text(n["t0"] + w / 2, n["ith"] + 0.02, label, ha="center", va="center", fontsize=7.5, clip_on=True,
                    zorder=4)
    cg: dict = {}
    for c in chunks:
        shade = "#1565c0" if c["chunk"] % 2 == 0 else "#64b5f6"
        cg.setdefault((c["ith"], shade), []).append((c["t0"], max(c["t1"] - c["t0"], minw)))
    for (ith, shade), xr in cg.items():
        ax.broken_barh(xr, (ith - H / 2 - 0.13, 0.11), facecolors=shade, edgecolors="none", zorder=2)
    bg: dict = {}
    for b in barriers:
        t0, t1 = max(b["t0"], t_lo), min(b["t1"], t_hi)
        bg.setdefault(b["ith"], []).append((t0, max(t1 - t0, minw)))
    for ith, xr in bg.items():
        ax.broken_barh(xr, (ith + H / 2 + 0.03, 0.12), facecolors="#9e9e9e", edgecolors="#616161", hatch="////",
                       linewidth=0.3, zorder=2)
    if highlight is not None:
        hn = [n for n in nodes if n["node_n"] == highlight]
        if hn:
            ax.axvspan(min(n["t0"] for n in hn), max(n["t1"] for n in hn), color="#ffcdd2", alpha=0.35, zorder=0)
    ax.set_xlim(t_lo - span * 0.01, t_hi + span * 0.01)
    ax.set_ylim(nt - 0.35, -0.65)
    ax.set_yticks(range(nt))
    ax.set_yticklabels([f"thread {i}" for i in range(nt)], fontsize=10)
    ax.set_xlabel("time since ggml_graph_compute started (µs)", fontsize=10)
    ax.tick_params(axis="x", labelsize=9)
    handles = [Patch(facecolor=c, edgecolor="#424242", label=op) for op, c in ops_seen.items()]
    handles += [Patch(facecolor="#1565c0", label="mul_mat chunk (alternating shades)"),
                Patch(facecolor="#9e9e9e", hatch="////", edgecolor="#616161", label="waiting in ggml_barrier")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    rng = f"nodes {min(sel)}–{max(sel)}" if node_range is not None else f"all {len(sel)} computed nodes"
    ax.set_title(title or f"graph compute on {nt} threads: {rng}", fontsize=11)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    fig.tight_layout()
    return fig


class ThreadTimeline(VizWidget):
    """Per-thread Gantt of one recorded graph compute; a node slider highlights one node and lists its chunks."""

    def __init__(self, events, which: int = -1, window: int = 40):
        self.data = timeline_data(events, which)
        self.computed = sorted({n["node_n"] for n in self.data["nodes"]})
        if not self.computed:
            raise ValueError("the recorded compute ran no node")
        self.window = window
        self.node = self.computed[0]
        self.range = (self.computed[0], self.computed[min(len(self.computed), window) - 1] + 1)

    def select(self, node_n: int):
        """Highlight node ``node_n`` (the window moves to contain it)."""
        node_n = int(node_n)
        if node_n not in self.computed:
            later = [x for x in self.computed if x >= node_n]
            node_n = later[0] if later else self.computed[-1]
        self.node = node_n
        a, b = self.range
        if not a <= node_n < b:
            k = self.computed.index(node_n)
            lo = max(0, k - self.window // 4)
            hi = min(len(self.computed), lo + self.window)
            self.range = (self.computed[lo], self.computed[hi - 1] + 1)
        self._changed()
        return self

    def set_range(self, a: int, b: int):
        self.range = (int(a), int(b))
        self._changed()

    def node_info(self, node_n: int | None = None) -> dict:
        n = self.node if node_n is None else node_n
        runs = [x for x in self.data["nodes"] if x["node_n"] == n]
        ch = [c for c in self.data["chunks"] if c["node_n"] == n]
        bar = [b for b in self.data["barriers"] if b["node_n"] == n]
        per = []
        for r in sorted(runs, key=lambda r: r["ith"]):
            mine = [c for c in ch if c["ith"] == r["ith"]]
            wait = [b for b in bar if b["ith"] == r["ith"]]
            per.append({"thread": r["ith"], "start_us": round(r["t0"], 1), "time_us": round(r["t1"] - r["t0"], 1),
                        "chunks": [c["chunk"] for c in mine],
                        "rows": [f"{c['ir0'][0]}-{c['ir0'][1]}" for c in mine],
                        "barrier_wait_us": round(sum(b["t1"] - b["t0"] for b in wait), 1)})
        return {"node_n": n, "name": runs[0]["name"] if runs else None, "op": runs[0]["op"] if runs else None,
                "n_tasks": self.data["n_tasks"][n] if self.data["n_tasks"] else None, "threads": per,
                "n_chunks": len(ch)}

    def state(self) -> dict:
        d = self.data
        return {"n_threads": d["n_threads"], "n_computed": len(self.computed), "range": self.range,
                "node": self.node_info(), "total_us": d["t_end"],
                "barrier_wait_us": {i: sum(b["t1"] - b["t0"] for b in d["barriers"] if b["ith"] == i)
                                    for i in range(d["n_threads"])},
                "n_chunks": len(d["chunks"])}

    def figure(self, node_range=None, highlight="current"):
        hl = self.node if highlight == "current" else highlight
        return plot_timeline(self.data, node_range=self.range if node_range is None else node_range, highlight=hl)

    def info_html(self) -> str:
        ni = self.node_info()
        head = (f"<b>node #{ni['node_n']} {esc(ni['name'])}</b> ({esc(ni['op'])}), n_tasks = {ni['n_tasks']}, "
                f"{ni['n_chunks']} chunks")
        return head + html_table(ni["threads"], ["thread", "start_us", "time_us", "chunks", "rows",
                                                 "barrier_wait_us"])

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + self.info_html()

    def _build(self):

        self._w_node = W.SelectionSlider(options=self.computed, value=self.node, description="node",
                                         continuous_update=False, layout=W.Layout(width="700px"))
        self._w_node.observe(lambda ch: None if getattr(self, "_syncing", False) else self.select(ch["new"]),
                             "value")
        self._w_img = W.HTML()
        self._w_info = W.HTML()
        return W.VBox([self._w_node, self._w_img, self._w_info])

    def _refresh(self):
        if self._w_node.value != self.node:
            self._syncing = True
            try:
                self._w_node.value = self.node
            finally:
                self._syncing = False
        self._w_img.value = png_img(fig_to_png(self.figure()), "max-width:100%")
        self._w_info.value = self.info_html()
