"""SchedulerView: how ``ggml_backend_sched_split_graph`` assigned a graph's nodes to backends, pass by pass.

Drawn from a ``capture.SchedRecord`` (``ggviz/capture/plans.py``): the scheduler's recorded trace events
(``ggviz.trace``), replayed in order by ``capture_sched``:

- ``sched.pass``: a pass begins ("1", "2.1" .. "2.4", "3", "4", "5");
- ``sched.assign``: ``SET_CAUSE`` -- tensor (address, name), backend, cause, and the pass it happened in ("usr":
  ``ggml_backend_sched_set_tensor_backend`` before the split);
- ``sched.split`` / ``sched.copy`` (phase "split"): pass 5's splits (backend, node range, inputs) and the copies it
  made of each input in the split backend's memory ("ACCEL0#norm-0#0").

Replaying the assign events between two pass events gives the assignment after every pass: a row per pass, a
column per node, coloured by backend (saturated where that pass set it, pale where it was set earlier, grey while
unassigned). In ggml only two rules touch a node that already has a backend: pass 3's upgrade ("3.upg", to a
higher-priority backend with the same buffer type) and, within pass 3, "3.best" revising its own choice; everything
else fills unassigned nodes only. The final row is checked against the scheduler's own record
(``sched.last_plan``, ``backend_sched_get_tensor_cause``).

``step_pass()`` / ``goto_pass(name)`` move through the passes, ``select_split(i)`` lists a split's inputs and their
copies, and its nodes -- each MUL_MAT with the kernel it runs on its backend: "sgemm" (llamafile's tinyBLAS, what
llama.cpp's default CPU build gives a prefill), "repack gemm" (weights in CPU_REPACK), "vec_dot chunks" (ggml's own
loop: decode, and the types tinyBLAS refuses) or "BLAS" (the BLAS backend, only when asked for: ``use_blas`` /
``--blas``, as llama.cpp built with GGML_BLAS).
"""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ...capture.plans import SCHED_KINDS as KINDS, STAGES, SchedRecord, capture_sched, record_sched_split
from ._base import VizWidget, chart_with_cursor, esc, fig_to_png, frames_book, html_table, png_img, quiet

STAGE_TITLES = {
    "usr": "before pass 1: the user's pins (ggml_backend_sched_set_tensor_backend, cause \"usr\")",
    "1": "pass 1: tensors already in a buffer (weights, KV cache) -> a backend that can use it; graph inputs -> "
         "the CPU; ops reading a weight -> the weight's backend",
    "2.1": "pass 2.1: expand non-CPU backends down the node list (\"2.sup\" where the backend supports the op)",
    "2.2": "pass 2.2: expand non-CPU backends up",
    "2.3": "pass 2.3: expand any backend down",
    "2.4": "pass 2.4: expand any backend up",
    "3": "pass 3: upgrade to a higher-priority backend with the same buffer type (\"3.upg\"); the rest to the "
         "backend supporting most of its inputs (\"3.best\")",
    "4": "pass 4: views take their source's backend (\"4.vsrc\"), unassigned sources their consumer's (\"4.cur\")",
    "5": "pass 5: consecutive nodes on one backend form a split; inputs on an incompatible backend are copied "
         "(\"4.cpy\")",
}
STAGE_SHORT = {"usr": "usr pins", "1": "pass 1", "2.1": "2.1 gpu ↓", "2.2": "2.2 gpu ↑", "2.3": "2.3 any ↓",
               "2.4": "2.4 any ↑", "3": "pass 3", "4": "pass 4", "5": "pass 5"}

_FIXED = {"CPU": "#78909c", "BLAS": "#ffa726"}
_PALETTE = ["#43a047", "#1e88e5", "#8e24aa", "#00897b", "#e53935", "#6d4c41"]
_UNASSIGNED = "#eeeeee"


def backend_colors(names) -> dict:
    """A colour per backend name: CPU blue-grey, BLAS orange, the others (accelerators) from a palette."""
    out, k = {}, 0
    for n in names:
        if n in _FIXED:
            out[n] = _FIXED[n]
        else:
            out[n] = _PALETTE[k % len(_PALETTE)]
            k += 1
    return out


def _pale(hexcol: str, f: float = 0.62) -> tuple:
    h = hexcol.lstrip("#")
    rgb = np.array([int(h[i:i + 2], 16) for i in (0, 2, 4)]) / 255.0
    return tuple(rgb + (1.0 - rgb) * f)


def _rgb(hexcol: str) -> tuple:
    h = hexcol.lstrip("#")
    return tuple(int(h[i:i + 2], 16) / 255.0 for i in (0, 2, 4))



def _words(d: dict) -> str:
    """{"a": 1, "b": 2} as "a 1, b 2" (a dict's repr is not for a page)."""
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"

class SchedulerView(VizWidget):
    """The backend assignment of one ``backend_sched_split_graph``, after every pass, and its splits and copies.

    ``record``: a ``capture.SchedRecord`` (what the view draws, and all it reads) -- or, as a convenience, a live
    scheduler, captured first with ``capture_sched(sched, graph, events, which)``: ``sched``: the scheduler; ``graph``: the graph that was split (its nodes, in order, are the columns);
    ``events``: a ``trace.Recorder`` (or list of events) that recorded ``KINDS`` while the graph was split --
    including any ``backend_sched_set_tensor_backend`` calls made for it; ``which``: which split of ``sched`` in the
    recording (-1: the last); ``stage``: the pass shown first (default: the last, "5").

    ``SchedulerView.capture(sched, graph, setup=None)`` records ``backend_sched_alloc_graph`` for you.
    """

    KINDS = KINDS

    def __init__(self, record, graph=None, events=None, which: int = -1, stage: str = "5",
                 max_height: str = "700px"):
        if not isinstance(record, SchedRecord):          # a live scheduler: capture its split first
            record = capture_sched(record, graph, events, which)
        self.record = rec = record
        # what the drawing reads: the record's fields, nothing of the scheduler or the graph
        self.backends, self.bufts = rec.backends, rec.bufts
        self.colors = backend_colors(self.backends)
        self.max_height = max_height
        self.n_nodes = rec.n_nodes
        self.node_names, self.node_ops, self.view_op = rec.node_names, rec.node_ops, rec.view_op
        self.leaf_names = rec.leaf_names
        self.snapshots, self.events_by_stage, self.splits = rec.snapshots, rec.events_by_stage, rec.splits
        self.graph_inputs = rec.graph_inputs
        self.which, self.n_recorded, self.is_last = rec.which, rec.n_recorded, rec.is_last
        self.reused = bool(getattr(rec, "reused", False))      # the split a reused graph kept (records before: no)
        self.stage = stage if stage in STAGES else "5"
        self.split_sel: int | None = None

    # ------------------------------------------------------------------------------------------------ capture
    @classmethod
    def capture(cls, sched, graph, setup=None, **kw):
        """Record ``ggml_backend_sched_alloc_graph(sched, graph)`` (``setup()`` runs first, inside the recording:
        e.g. ``backend_sched_set_tensor_backend`` pins) and view it."""
        which = kw.pop("which", -1)
        return cls(record_sched_split(sched, graph, setup, which), **kw)

    # ------------------------------------------------------------------------------------------------ actions
    def goto_pass(self, stage: str):
        stage = str(stage)
        if stage not in STAGES:
            raise KeyError(f"no pass {stage!r}: one of {STAGES}")
        self.stage = stage
        self._changed()
        return self

    def step_pass(self, n: int = 1):
        """The next pass (``n`` = -1: the previous one); after the last it starts again from the pins."""
        k = (STAGES.index(self.stage) + n) % len(STAGES)
        return self.goto_pass(STAGES[k])

    def select_split(self, i: int | None):
        if i is not None and not 0 <= int(i) < len(self.splits):
            raise IndexError(f"split {i} out of range ({len(self.splits)} splits)")
        self.split_sel = None if i is None else int(i)
        self._changed()
        return self

    # ------------------------------------------------------------------------------------------------ plain data
    def _name(self, bid: int):
        return self.backends[bid] if 0 <= bid < len(self.backends) else None

    def assignment(self, stage: str | None = None) -> list[dict]:
        st = self.stage if stage is None else stage
        snap = self.snapshots[st]
        prev = self.snapshots[STAGES[STAGES.index(st) - 1]] if st != "usr" else None
        out = []
        for i in range(self.n_nodes):
            b, c = snap["backend"][i], snap["cause"][i]
            changed = (prev is None and (b != -1 or c)) or (prev is not None and (b, c) != (prev["backend"][i],
                                                                                          prev["cause"][i]))
            out.append(dict(index=i, name=self.node_names[i], op=self.node_ops[i], backend=self._name(b),
                            backend_id=b, cause=c, changed=bool(changed), view_op=self.view_op[i]))
        return out

    def kernel(self, i: int) -> str:
        """The kernel MUL_MAT node i runs on its final backend; "" for other nodes and devices."""
        return self.record.kernels[i] if 0 <= i < self.n_nodes else ""

    def mul_mat_kernels(self) -> dict:
        """How many MUL_MATs run on each kernel (final assignment)."""
        out: dict = {}
        for i in self.record.mul_mats:
            k = self.kernel(i) or "(device)"
            out[k] = out.get(k, 0) + 1
        return out

    def leaf_assignment(self, stage: str | None = None) -> list[dict]:
        snap = self.snapshots[self.stage if stage is None else stage]
        return [dict(name=n, backend=self._name(snap["leaf_backend"][j]), backend_id=snap["leaf_backend"][j],
                     cause=snap["leaf_cause"][j]) for j, n in enumerate(self.leaf_names)]

    def split_info(self, i: int | None = None) -> dict | None:
        i = self.split_sel if i is None else i
        if i is None:
            return None
        s = self.splits[i]
        nodes = [dict(index=j, name=self.node_names[j], op=self.node_ops[j], kernel=self.kernel(j))
                 for j in range(s["i_start"], s["i_end"]) if not self.view_op[j]]
        return dict(s, nodes=nodes, n_compute_nodes=len(nodes),
                    copied_bytes=sum(x["nbytes"] or 0 for x in s["inputs"]))

    def state(self) -> dict:
        asg = self.assignment()
        counts: dict = {}
        for r in asg:
            counts[r["backend"]] = counts.get(r["backend"], 0) + 1
        changes = [r for r in asg if r["changed"]]
        cause_counts: dict = {}
        for r in changes:
            cause_counts[r["cause"]] = cause_counts.get(r["cause"], 0) + 1
        copies_per_backend = {n: 0 for n in self.backends}
        for s in self.splits:
            copies_per_backend[s["backend"]] += sum(len(x["copies"]) for x in s["inputs"])
        return {"backends": list(self.backends), "bufts": list(self.bufts), "n_nodes": self.n_nodes,
                "stages": list(STAGES), "stage": self.stage, "stage_title": STAGE_TITLES[self.stage],
                "assignment": asg, "changed": [r["index"] for r in changes], "counts": counts,
                "cause_counts": cause_counts, "n_unassigned": counts.get(None, 0),
                "snapshots": {st: list(self.snapshots[st]["backend"]) for st in STAGES},
                "leafs": self.leaf_assignment(),
                "splits": [dict(s) for s in self.splits], "n_splits": len(self.splits),
                "n_inputs": sum(len(s["inputs"]) for s in self.splits),
                "n_copies": sum(len(x["copies"]) for s in self.splits for x in s["inputs"]),
                "copies_per_backend": copies_per_backend, "graph_inputs": list(self.graph_inputs),
                "selected_split": self.split_sel, "split": self.split_info(), "which": self.which,
                "mul_mat_kernels": self.mul_mat_kernels(),
                "is_last_split_of_sched": self.is_last, "reused": self.reused}

    # ------------------------------------------------------------------------------------------------ drawing
    def figure(self):
        """The passes as a grid (a row per pass, a column per node, coloured by backend) above pass 5's splits;
        up to the current stage (``goto_pass``); with many splits a third panel zooms on the selected one."""
        n = self.n_nodes
        rows = STAGES[:-1]
        k_cur = STAGES.index(self.stage)
        small = n <= 40
        img = self._pass_image(rows, k_cur)
        h_grid = 0.42 * len(rows) + (0.8 if small else 0.2)
        # hundreds of short splits (BLAS/CPU alternating on a prompt) are a barcode at full width: then a third
        # panel zooms on a window of ZOOM_SPLITS splits around the selected one, each labelled
        zoom = self.stage == "5" and not small and len(self.splits) > self.ZOOM_SPLITS
        if zoom:
            fig = plt.figure(figsize=(13, h_grid + 4.6))
            gs = fig.add_gridspec(3, 1, height_ratios=[h_grid, 1.3, 1.5], hspace=0.55)
            ax = fig.add_subplot(gs[0])
            axs = fig.add_subplot(gs[1], sharex=ax)
            self._draw_split_zoom(fig.add_subplot(gs[2]))
        else:
            fig, (ax, axs) = plt.subplots(2, 1, figsize=(13, h_grid + 2.6), sharex=True,
                                          gridspec_kw=dict(height_ratios=[h_grid, 1.3], hspace=0.3))
        self._draw_passes(ax, img, rows, k_cur, small)
        if self.stage == "5":
            self._draw_splits(axs, small)
        else:
            axs.text(n / 2, 0.5, "splits: after pass 5", ha="center", va="center", fontsize=10, color="#9e9e9e")
        self._finish_split_axes(axs, small)
        handles = [Patch(facecolor=self.colors[b], label=f"{b} (buffer type {bt})")
                   for b, bt in zip(self.backends, self.bufts)]
        handles += [Patch(facecolor=_pale("#78909c"), label="pale: set by an earlier pass"),
                    Patch(facecolor=_UNASSIGNED, label="unassigned")]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9.5, frameon=False)
        fig.subplots_adjust(left=0.08, right=0.78, top=0.92, bottom=0.22 if small else 0.1)
        return fig

    # The phases of ``figure``, in the order they draw.

    def _pass_image(self, rows, k_cur) -> np.ndarray:
        """The grid as an RGB image: saturated where that pass set the node's backend, pale where an earlier pass
        did, light grey while unassigned, white for the passes not run yet."""
        img = np.ones((len(rows), self.n_nodes, 3))
        for r, st in enumerate(rows):
            if r > k_cur:
                continue
            asg = self.assignment(st)
            for a in asg:
                if a["backend"] is None:
                    img[r, a["index"]] = _rgb(_UNASSIGNED)
                else:
                    col = self.colors[a["backend"]]
                    img[r, a["index"]] = _rgb(col) if a["changed"] else _pale(col)
        return img

    def _draw_passes(self, ax, img, rows, k_cur, small: bool):
        """The grid panel: the image, each pass's causes written in (a small graph) or its changes drawn as lines
        at least a pixel wide (a big one), the current pass outlined."""
        n = self.n_nodes
        ax.imshow(img, aspect="auto", interpolation="nearest", extent=(-0.5, n - 0.5, len(rows) - 0.5, -0.5))
        if small:
            for x in range(n + 1):
                ax.axvline(x - 0.5, color="white", linewidth=1.2)
            for r, st in enumerate(rows):
                if r > k_cur:
                    continue
                for a in self.assignment(st):
                    if a["changed"] and a["cause"]:
                        ax.text(a["index"], r, a["cause"], ha="center", va="center", fontsize=9,
                                color="black" if a["backend"] else "#616161")
        elif n > 150:
            # one node is under a pixel wide: draw what each pass set as lines at least a pixel wide
            for r, st in enumerate(rows):
                if r > k_cur:
                    continue
                by_col: dict = {}
                for a in self.assignment(st):
                    if a["changed"] and a["backend"] is not None:
                        by_col.setdefault(self.colors[a["backend"]], []).append(a["index"])
                for col, xs in by_col.items():
                    ax.vlines(xs, r - 0.45, r + 0.45, colors=col, linewidth=1.1, zorder=2)
        for r in range(len(rows) + 1):
            ax.axhline(r - 0.5, color="white", linewidth=1.5)
        if k_cur < len(rows):
            ax.add_patch(Rectangle((-0.5, k_cur - 0.5), n, 1, fill=False, edgecolor="#d50000", linewidth=2.2,
                                   zorder=5))
        for r in range(k_cur + 1, len(rows)):
            ax.text(n / 2, r, "not run yet", ha="center", va="center", fontsize=9, color="#9e9e9e")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([STAGE_SHORT[s] for s in rows], fontsize=10)
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_title(f"ggml_backend_sched_split_graph: {n} nodes on {', '.join(self.backends)} "
                     f"(priority left to right) — after {STAGE_SHORT[self.stage]}", fontsize=12)

    def _draw_splits(self, axs, small: bool):
        """Pass 5's splits as bars in their backend's colour (the selected one outlined), an arrow at each split
        that copies inputs in (how many; their copies' names under a small graph)."""
        n = self.n_nodes
        min_w = 0 if small else n * 0.0035           # a one-node split stays visible (~3 px)
        last_lab = -1e9
        for s in self.splits:
            col = self.colors.get(s["backend"], "#bdbdbd")
            sel = self.split_sel == s["index"]
            w = max(s["n_nodes"], min_w)
            axs.add_patch(Rectangle((s["i_start"] - 0.5, 0.1), w, 0.8, facecolor=col,
                                    edgecolor="#d50000" if sel else ("white" if small else "none"),
                                    linewidth=2.5 if sel else 1.0,
                                    zorder=4 if sel else (3 if s["n_nodes"] < min_w else 2)))
            label = f"#{s['index']} {s['backend']}"
            if s["n_nodes"] / n * 9.5 > 0.085 * len(label):
                axs.text(s["i_start"] - 0.5 + s["n_nodes"] / 2, 0.5, label, ha="center", va="center",
                         fontsize=10 if small else 8.5, zorder=5)
            if s["inputs"]:
                x = s["i_start"] - 0.5
                lab = f"{len(s['inputs'])}" if small or x - last_lab > n * 0.03 else ""
                if lab:
                    last_lab = x
                axs.annotate(lab, xy=(x, 0.9), xytext=(x, 1.35), ha="center", fontsize=9,
                             arrowprops=dict(arrowstyle="-|>", color="#d84315", lw=1.2), color="#d84315",
                             zorder=5)
        if small:
            for s in self.splits:
                if s["inputs"]:
                    txt = "\n".join(f"{x['copy']}" for x in s["inputs"])
                    axs.text(s["i_start"] - 0.4, -0.05, txt, ha="left", va="top", fontsize=8.5, color="#bf360c")
        n_in = sum(len(s["inputs"]) for s in self.splits)
        gi = ", ".join(self.graph_inputs[:4]) + (f" … ({len(self.graph_inputs)})" if len(self.graph_inputs) > 4
                                                   else "")
        axs.set_title(f"pass 5: {len(self.splits)} splits; arrows: inputs copied into the split's backend "
                      f"({n_in} in all)\ngraph inputs (\"1.inp\", on the CPU): {gi or 'none'}", fontsize=10.5,
                      loc="left")

    def _finish_split_axes(self, axs, small: bool):
        """Views (skipped by passes 2 and 3) as grey ticks under the splits; node names on the x axis when few."""
        n = self.n_nodes
        vx = [i for i in range(n) if self.view_op[i]]
        if vx:
            axs.scatter(vx, [0.02] * len(vx), marker="|", s=30 if small else 6, color="#9e9e9e", zorder=1)
        axs.set_ylim(-0.9 if small else 0, 1.9)
        axs.set_yticks([])
        for sp in ("top", "right", "left"):
            axs.spines[sp].set_visible(False)
        if small:
            axs.set_xticks(range(n))
            axs.set_xticklabels([f"{i} {self.node_names[i][:20]}" for i in range(n)], rotation=45, ha="right",
                                fontsize=9.5)
        else:
            axs.set_xlabel("node index (graph order; grey ticks: view ops, skipped by passes 2 and 3)", fontsize=10.5)
        axs.tick_params(labelsize=10)

    ZOOM_SPLITS = 40

    def _draw_split_zoom(self, az):
        """The splits around the selected one (or the first ones), wide enough to read: backend, nodes, inputs."""
        k = self.split_sel if self.split_sel is not None else 0
        n_win = 14
        lo = max(0, min(k - n_win // 3, len(self.splits) - n_win))
        win = self.splits[lo:lo + n_win]
        x = 0.0
        for s in win:
            col = self.colors.get(s["backend"], "#bdbdbd")
            sel = self.split_sel == s["index"]
            az.add_patch(Rectangle((x, 0.1), 1, 0.8, facecolor=col, edgecolor="#d50000" if sel else "white",
                                   linewidth=2.5 if sel else 1.0))
            first = self.node_names[s["i_start"]][:14] if s["i_start"] < len(self.node_names) else ""
            az.text(x + 0.5, 0.62, f"#{s['index']} {s['backend']}", ha="center", va="center", fontsize=7)
            az.text(x + 0.5, 0.34, f"{s['n_nodes']} node{'s' if s['n_nodes'] != 1 else ''}\n{first}", ha="center",
                    va="center", fontsize=6.5, color="#37474f")
            if s["inputs"]:
                az.annotate(f"{len(s['inputs'])}", xy=(x, 0.9), xytext=(x, 1.3), ha="center", fontsize=8,
                            color="#d84315", arrowprops=dict(arrowstyle="-|>", color="#d84315", lw=1.0))
            x += 1
        az.set_xlim(0, max(x, 1))
        az.set_ylim(0, 1.6)
        az.set_yticks([])
        az.set_xticks([])
        for sp in ("top", "right", "left", "bottom"):
            az.spines[sp].set_visible(False)
        by = {}
        for s in self.splits:
            by[s["backend"]] = by.get(s["backend"], 0) + 1
        az.set_title(f"zoom: splits #{win[0]['index']}–#{win[-1]['index']} of {len(self.splits)} (each drawn the same "
                     f"width; {', '.join(f'{b}: {c}' for b, c in by.items())}); select a split to move the window",
                     fontsize=10, loc="left")

    def png(self, dpi: int = 100) -> bytes:
        return fig_to_png(self.figure(), dpi=dpi)

    def info_html(self, max_rows: int = 60) -> str:
        st = self.state()
        parts = [f"<b>{esc(STAGE_SHORT[self.stage])}</b>: {esc(st['stage_title'])}<br/>"
                 f"nodes per backend: {esc(_words({(k or 'unassigned'): v for k, v in st['counts'].items()}))}"]
        if self.reused:
            parts.insert(0, "<i>The recorded step reused the previous decode's graph (same shapes: llama.cpp's graph "
                            "reuse), so it split nothing: this is the split it computed with, made by that decode."
                            "</i><br/>")
        if self.stage != "5":
            ch = [r for r in st["assignment"] if r["changed"]]
            leafs = [dict(e) for e in self.events_by_stage.get(self.stage, []) if e["leaf"]]
            parts.append(f"<br/>{len(ch)} nodes set in this pass, causes: {esc(_words(st['cause_counts']))}")
            if 0 < len(ch) <= 20:
                parts.append(html_table(ch, ["index", "name", "op", "backend", "cause"], max_rows=max_rows,
                                        title="nodes assigned by this pass"))
            elif ch:                      # hundreds of rows: summed up by what was decided, with the first and last
                by: dict = {}
                for r in ch:
                    g = by.setdefault((r["backend"], r["cause"], r["op"]), {
                        "backend": r["backend"], "cause": r["cause"], "op": r["op"], "nodes": 0, "first": r["name"]})
                    g["nodes"] += 1
                    g["last"] = r["name"]
                parts.append(html_table(sorted(by.values(), key=lambda g: -g["nodes"]),
                                        ["backend", "cause", "op", "nodes", "first", "last"], max_rows=max_rows,
                                        title=f"the {len(ch)} nodes assigned by this pass, by backend, cause and op"))
            if leafs:
                parts.append(html_table(leafs, ["name", "backend", "cause"], max_rows=max_rows // 2,
                                        title="leafs assigned by this pass (weights, KV cache, inputs)"))
        else:
            rows = [dict(split=s["index"], backend=s["backend"], nodes=f"[{s['i_start']}, {s['i_end']})",
                         n_nodes=s["n_nodes"], inputs=", ".join(f"{x['name']} → {x['copy']}" for x in s["inputs"]))
                    for s in self.splits]
            parts.append(f"<br/>{st['n_splits']} splits, {st['n_inputs']} inputs copied "
                         f"(copies per backend: {esc(_words(st['copies_per_backend']))}); graph inputs: "
                         f"{esc(', '.join(st['graph_inputs']))}")
            parts.append(html_table(rows, ["split", "backend", "nodes", "n_nodes", "inputs"], max_rows=max_rows,
                                    title="splits (ggml_backend_sched_split)"))
            if st["mul_mat_kernels"]:
                parts.append(f"MUL_MAT kernels: {esc(_words(st['mul_mat_kernels']))}")
        parts.append(self.split_html(st["split"], max_rows))
        return "".join(parts)

    def split_html(self, si: dict | None, max_rows: int = 60) -> str:
        """The selected split's part of ``info_html``: its inputs copied in and its nodes."""
        parts = []
        if si is not None:
            parts.append(f"<h4 style='margin:6px 0 2px'>split #{si['index']} on {esc(si['backend'])}: nodes "
                         f"[{si['i_start']}, {si['i_end']}), {si['n_compute_nodes']} computed, "
                         f"{len(si['inputs'])} inputs ({si['copied_bytes']} bytes copied per run)</h4>")
            if si["inputs"]:
                parts.append(html_table(si["inputs"], ["name", "from_backend", "copy", "nbytes", "consumer"],
                                        title="inputs copied into the split's backend before it runs "
                                              "(ggml_backend_sched_compute_splits)"))
            # the split's nodes summed up by op and kernel (a list of its hundreds of nodes teaches nothing)
            if len(si["nodes"]) <= 20:
                parts.append(html_table(si["nodes"], ["index", "name", "op", "kernel"], max_rows=max_rows,
                                        title="its nodes (kernel: what a MUL_MAT runs on this backend)"))
                return "".join(parts)
            by_op: dict = {}
            for nd in si["nodes"]:
                r = by_op.setdefault((nd["op"], nd.get("kernel") or ""), {"op": nd["op"], "kernel": nd.get("kernel")
                                                                           or "", "nodes": 0, "first": nd["name"]})
                r["nodes"] += 1
                r["last"] = nd["name"]
            parts.append(html_table(sorted(by_op.values(), key=lambda r: -r["nodes"]),
                                    ["op", "nodes", "kernel", "first", "last"], max_rows=max_rows,
                                    title=f"its {len(si['nodes'])} nodes by op (kernel: what a MUL_MAT runs on this "
                                          "backend)"))
        return "".join(parts)

    def to_html(self) -> str:
        return png_img(self.png(), "max-width:100%") + self.info_html()

    def book_view(self) -> dict:
        """The last pass's picture drawn once (every pass's row, the splits), the pass shown marked on its row and
        the selected split on its bar in the page; every pass's table and every split's recorded."""
        stage, split = self.stage, self.split_sel
        rows = STAGES[:-1]
        try:
            with quiet(self):
                self.stage, self.split_sel = "5", None
                fig = self.figure()
                ax, axs = fig.axes[0], fig.axes[1]
                img, box = chart_with_cursor(fig, ax)
                infos = {}
                for st in STAGES:
                    self.stage = st
                    infos[st] = self.info_html()
                splits = {-1: ""}
                for s in self.splits:
                    self.split_sel = s["index"]
                    splits[s["index"]] = self.split_html(self.split_info())

                def frame(key):
                    st, sp = key
                    cur = []
                    if st in rows:
                        k = rows.index(st)
                        cur.append(box(-0.5, self.n_nodes - 0.5, k - 0.5, k + 0.5, ax))
                    if sp >= 0:
                        s = self.splits[sp]
                        cur.append(box(s["i_start"] - 0.5, s["i_end"] - 0.5, 0.1, 0.9, axs))
                    return {"picture": img, "cursor": cur, "info": infos[st], "detail": splits[sp]}

                return frames_book(
                    [{"name": "stage", "label": "after", "kind": "toggle", "value": stage,
                      "options": [[STAGE_SHORT[x], x] for x in STAGES]},
                     {"name": "split", "label": "split", "kind": "select", "value": -1 if split is None else split,
                      "options": [["(none)", -1]] + [[f"#{s['index']} {s['backend']} [{s['i_start']}, {s['i_end']}) "
                                                      f"{len(s['inputs'])} inputs", s["index"]] for s in self.splits]}],
                    [(st, sp) for st in STAGES for sp in splits], frame,
                    note="the picture shows the split after every pass (pass 5); the marked row is the pass whose "
                         "assignments are listed under it" + ("" if len(self.splits) <= self.ZOOM_SPLITS else
                                                               "; the zoom panel stays on the first splits here"))
        finally:
            self.stage, self.split_sel = stage, split

    def _build(self):

        self._w_prev = W.Button(description="◀ pass", layout=W.Layout(width="90px"))
        self._w_next = W.Button(description="pass ▶", layout=W.Layout(width="90px"))
        self._w_prev.on_click(lambda _: self.step_pass(-1))
        self._w_next.on_click(lambda _: self.step_pass(1))
        self._w_stage = W.Dropdown(options=[(STAGE_SHORT[s], s) for s in STAGES], value=self.stage,
                                   description="after", layout=W.Layout(width="220px"))
        self._w_stage.observe(lambda ch: self.goto_pass(ch["new"]), "value")
        opts = [("(none)", -1)] + [(f"#{s['index']} {s['backend']} [{s['i_start']}, {s['i_end']}) "
                                    f"{len(s['inputs'])} inputs", s["index"]) for s in self.splits]
        self._w_split = W.Dropdown(options=opts, value=-1, description="split", layout=W.Layout(width="380px"))
        self._w_split.observe(lambda ch: self.select_split(None if ch["new"] < 0 else ch["new"]), "value")
        self._w_img = W.HTML()
        self._w_info = W.HTML(layout=W.Layout(max_height=self.max_height, overflow="auto"))
        return W.VBox([W.HBox([self._w_prev, self._w_next, self._w_stage, self._w_split]), self._w_img,
                       self._w_info])

    def _refresh(self):
        if self._w_stage.value != self.stage:
            self._w_stage.value = self.stage
        want = -1 if self.split_sel is None else self.split_sel
        if self._w_split.value != want:
            self._w_split.value = want
        self._w_img.value = png_img(self.png(), "max-width:100%")
        self._w_info.value = self.info_html()
