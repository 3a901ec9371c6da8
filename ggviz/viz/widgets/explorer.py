"""DecodeExplorer: one real decode step, every view linked to one selection, with seed 000's call path as its spine.

The spine is the path of ``llama_decode`` in llama.cpp (``llama_context::decode`` -> ``process_ubatch`` -> the model's
``build_graph`` -> ``ggml_backend_sched_alloc_graph`` -> ``llm_graph_result::set_inputs`` ->
``ggml_backend_sched_graph_compute_async`` -> the logits copied out -> ``llama_sampler_sample``). Choose a phase, a
node or a tensor (click it in the DAG, in the buffer map or in a thread lane, or type its name) and every pane follows:

- the graph: the whole cgraph (every layer open, ``GraphView.expand_all``), node outlined, pan (drag) and zoom (wheel);
- the bytes: the compute buffer as ``ggml_gallocr`` planned it (``galloc.last_alloc``, what ``AllocatorView`` draws):
  offset x node index, the node's slot [offset, offset + size) and every other tensor that holds those bytes at
  another time (the reuse that lets a 1086-node graph fit in one buffer);
- the thread lanes: the node's spans on each thread of the recorded ``ggml_graph_compute`` (``trace.ComputeTimeline``);
- the scheduler cause: the backend ``ggml_backend_sched_split_graph`` gave it, in which pass and why (the ``SET_CAUSE``
  code, ``SchedulerView``'s replay of the ``sched.*`` events), and its split;
- the values: the node's output, copied by the eval callback (``cb_eval``) in a second run of the same step.

Everything a selection needs is computed once, in Python, when the explorer is made. The live view is one anywidget
whose JavaScript applies a selection by itself (CSS rules on the three pictures, the panes' text from a table sent
once), so it takes a few milliseconds in the browser; it then tells Python (``selected``), which draws the values.
``select()`` from Python goes the other way. ``to_html()`` is the static rendering: spine, graph window, bytes, lanes,
cause and values of the current selection. ``book_view()``: the same widget for the static book, with every node's
and leaf's values pane recorded (a small heatmap), so every pane follows a click with no kernel.
"""
from __future__ import annotations

import json
import math
import re

import anywidget
import ipywidgets as W
import numpy as np
import traitlets

from ...capture.explorer import StepRecord, capture_step, phase_spans, record_step
from ...capture.inputs import RecordedPieces, token_piece
from ...ggml import consts as C
from ...ggml.tensor import nbytes, op_desc, type_name
from ...llama import context_pool
from .. import graph_dot as G
from .. import model_views            # the module, not its names: model_views imports this package (_base)
from ._base import (VizWidget, array_png, book_payload, esc, fig_to_png, new_prefix, pane_state, png_img, svg_window,
                    template)
from .alloc_view import AllocatorView, _fmt_bytes
from .graph import GraphView, highlight_css
from .sched_view import STAGE_TITLES, STAGES, SchedulerView
from .timeline import cleanest, disturbance, timeline_data

RED = "#d50000"
SHARE = "#ef6c00"
SRC = "#1565c0"        # the selected node's sources in the graph


def lanes_window(t0: float, t1: float, t_end: float) -> tuple[float, float]:
    """The part of the compute (µs, x and width) the thread lanes show for a node that ran from t0 to t1: the node
    with three times its length (at least 150 µs) on each side, kept inside [0, t_end] so a long node near either end
    still shows its neighbours on the other side. explorer.js's ``select`` draws the same window in the browser."""
    pad = max(3 * (t1 - t0), 150.0)
    w = min(t1 - t0 + 2 * pad, t_end) if t_end > 0 else t1 - t0 + 2 * pad
    x = min(max(t0 - pad, 0.0), max(t_end - w, 0.0))
    return x, w

# ggml-backend.c's SET_CAUSE codes, in words
CAUSES = {
    "usr": "pinned by the application before the split (ggml_backend_sched_set_tensor_backend: llama.cpp's graph "
           "callback puts some nodes on a chosen backend)",
    "1.dst": "pass 1: its data is already in a buffer; the backend of that buffer",
    "1.vsrc": "pass 1: a view of a tensor already in a buffer",
    "1.inp": "pass 1: a graph input: the CPU (the last backend)",
    "1.off": "pass 1: an op on a weight, offloaded to a backend that wants it (offload_op)",
    "1.wgt": "pass 1: it reads a weight: the weight's backend",
    "2.sup": "pass 2: expanded from its neighbour's backend, which supports the op",
    "3.best": "pass 3: the backend that supports it and holds most of its inputs",
    "3.upg": "pass 3: upgraded to a higher-priority backend with the same buffer type",
    "4.vsrc": "pass 4: a view takes its source's backend",
    "4.cur": "pass 4: an unassigned source takes its consumer's backend",
    "4.cpy": "pass 5: a copy of an input, made for a split on another backend",
}

# seed 000's call path of one llama_decode
PHASES = [
    ("llama_decode", "llama_decode(ctx, batch)",
     "llama_decode → llama_context::decode: checks the batch, splits it into ubatches (llama_batch_allocr, the "
     "memory's init_batch) and, for each, calls process_ubatch."),
    ("process_ubatch", "process_ubatch(ubatch)",
     "finds KV cells for the ubatch's tokens (the memory context's apply), then builds, allocates and computes "
     "the graph of this ubatch. Selected: the first SET_ROWS, which writes this token's K into its cell."),
    ("build_graph", "model.build_graph(params)",
     "llm_build_* creates the tensors (ggml_new_tensor, ggml_mul_mat ...) in a no_alloc context and "
     "ggml_build_forward_expand orders them: a DFS over src[] (ggml_visit_parents)."),
    ("sched_alloc", "ggml_backend_sched_alloc_graph",
     "split_graph gives every node a backend (passes 1-5, SET_CAUSE) and cuts the node list into splits; "
     "ggml_gallocr_alloc_graph places every tensor in the compute buffer, reusing the bytes of tensors no "
     "later node reads. Selected: the first node written in place over its parent's bytes."),
    ("set_inputs", "res->set_inputs(&ubatch)",
     "writes the ubatch into the input tensors: token ids, positions, the KV indices, the KQ mask (its time: "
     "from the allocation to the compute's start)."),
    ("compute", "ggml_backend_sched_graph_compute_async",
     "each split on its backend: ggml_graph_compute, all threads run every node, meeting at ggml_barrier "
     "after each one. Selected: the first MUL_MAT, its rows shared out between the threads in chunks."),
    ("logits", "extract logits",
     "ggml_backend_tensor_get_async copies result_output (one row of n_vocab logits per output) into the "
     "context's logits buffer."),
    ("sample", "llama_sampler_sample",
     "the sampler chain reads the logits of the last output and picks the next token: each sampler of the chain "
     "removes candidates or reshapes their probabilities, and the last one picks."),
]

def _cleanest(step, again):
    """``record_step``'s choice of the step to draw: when a busy machine took a core during the recorded compute,
    record the step again (up to 3 times) and keep the cleanest; the lanes' note says how clean the one kept is."""
    if disturbance(timeline_data(step.events))["clean"]:
        return step

    def fresh():
        context_pool.context_pool_clear()      # a fresh context: ggviz's thread policy starts from all threads
        return again()

    best = cleanest(fresh, tries=3)[0]
    return best if disturbance(timeline_data(best.events))["both_share"] >= \
        disturbance(timeline_data(step.events))["both_share"] else step


def _rows(a: np.ndarray, width: int = 64):
    """A tensor's values as a 2-D picture: rows x ne0, a single row folded into rows of ``width`` (a [1, 49152] row
    drawn as one pixel high says nothing)."""
    a = np.asarray(a, dtype=np.float32)
    r = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
    folded = False
    if r.shape[0] <= 2 and r.shape[1] > 2 * width:
        flat = r.reshape(-1)
        n = math.ceil(flat.size / width)
        pad = np.full(n * width, np.nan, dtype=np.float32)
        pad[:flat.size] = flat
        r, folded = pad.reshape(n, width), True
    return r, folded


class DecodeExplorer(VizWidget):
    """A recorded decode step with linked views. ``DecodeExplorer.record(prompt, threads)`` runs one.

    ``step``: a ``capture.StepRecord`` (``capture.record_step``: what every pane draws, and all they read; one loaded
    from disk draws the same) -- or a ``capture.DecodeStep`` recorded with ``record=True``, captured first
    (``capture.capture_step(step, values, sampled)``); ``values``: {node index: the node's output array} (None: no
    values pane). ``record`` is the ``StepRecord`` drawn; ``step`` / ``sched`` the live step and scheduler it was
    captured from (None for a record from disk).
    """

    def __init__(self, step, values: dict | None = None, sampled: int | None = None, max_height: str = "520px"):
        if isinstance(step, StepRecord):
            rec, self.step, self.sched = step, None, None
        else:
            rec, self.step, self.sched = capture_step(step, values, sampled), step, step.ctx.sched
        self.record = rec
        # what the panes draw: the record's fields, nothing of the engine
        self.gf = gf = rec.graph.cgraph()
        self.values = rec.values
        self.max_height = max_height
        self.n_nodes = gf.n_nodes
        self.prefix = new_prefix("ex")
        self.node_names = [t.name for t in gf.nodes]
        self.leaf_names = [t.name for t in gf.leafs]
        self.sampled = rec.sampled
        # the "sample" phase: the sampler chain on this step's logits, stage by stage (SamplerView's grid and tables),
        # its tokens labelled from the pieces the record holds
        ch = rec.chain or {}
        self.chain_token, self.chain_history = ch.get("token"), ch.get("history") or []
        self._pieces = RecordedPieces(ch.get("pieces") or {})
        self._sampler_html = None
        self.reused = rec.reused      # the next step's phases (the graph reused; None: not recorded)
        # ---- the scheduler: backend and cause per node, the pass that set it, the split
        self.sv = SchedulerView(rec.sched)
        fin = self.sv.assignment("5")
        self._cause = []
        for i in range(self.n_nodes):
            st = next((s for s in reversed(STAGES) if self.sv.snapshots[s]["cause"][i] == fin[i]["cause"]
                       and (s == "usr" or self.sv.snapshots[STAGES[STAGES.index(s) - 1]]["cause"][i]
                            != fin[i]["cause"])), None)
            split = next((s["index"] for s in self.sv.splits if s["i_start"] <= i < s["i_end"]), None)
            self._cause.append(dict(backend=fin[i]["backend"], cause=fin[i]["cause"], stage=st, split=split))
        self._leaf_cause = self.sv.leaf_assignment("5")
        # ---- the allocator's plan (of the compute buffer); the plan's records are per node index and name
        self.av = AllocatorView(rec.alloc)
        plan = self.av.plan
        self.items = self.av.items
        node_item: dict[int, dict] = {}
        leaf_item: dict[str, dict] = {}
        for it in self.items:
            if it["phase"] == "nodes" and 0 <= it["alloc_node"] < self.n_nodes \
                    and self.node_names[it["alloc_node"]] == it["name"]:
                node_item[it["alloc_node"]] = it
            elif it["phase"] != "nodes":
                leaf_item[it["name"]] = it
        self._node_item, self._leaf_item = node_item, leaf_item
        # whose plan is it? ggml_gallocr_alloc_graph re-plans only when the graph does not fit the last plan
        # (ggml_gallocr_needs_realloc); otherwise every tensor keeps the slot the last reserve gave it -- in llama.cpp
        # the worst-case ubatch of llama_context's graph_reserve, so a 1-token step sits in slots sized for it
        replanned = any(e["kind"] == "alloc.reserve" for e in rec.events)
        self.plan_tokens = None if replanned else rec.reserve_tokens
        if replanned:
            self.plan_note = "planned for this step's graph (ggml_gallocr re-planned it)"
        elif self.plan_tokens is not None:
            self.plan_note = (f"planned for the reserve graph of {self.plan_tokens} tokens (llama_context::"
                              f"graph_reserve, the worst case): this step's graph fits in that plan, so "
                              f"ggml_gallocr_alloc_graph kept it and each slot is sized for {self.plan_tokens} "
                              f"tokens")
        else:
            self.plan_note = "planned by the allocator's last reserve"
        view_rec = {}
        for r in plan["tensors"]:
            if r["view_src"] is not None and r["phase"] == "nodes" and r["alloc_node"] is not None:
                view_rec[r["alloc_node"]] = r
        self._view_rec = view_rec
        # ---- the thread lanes of the recorded compute
        self.compute = rec.compute
        self._spans: dict[int, list] = {}
        starts = [e for e in rec.events if e["kind"] == "cpu.compute.start"]
        self.compiled = bool(starts and starts[-1].get("compiled"))
        if self.compute is not None:
            self._t0 = min([self.compute["t_start"]] + [s["t_start"] for ln in self.compute["threads"].values()
                                                      for s in ln["nodes"]])
            self._t1 = max([self.compute["t_end"] or 0] + [b["t_exit"] for ln in self.compute["threads"].values()
                                                          for b in ln["barriers"]])
            for ith, ln in self.compute["threads"].items():
                for s in ln["nodes"]:
                    self._spans.setdefault(s["node_n"], []).append(
                        dict(ith=ith, t0=(s["t_start"] - self._t0) / 1e3, t1=(s["t_end"] - self._t0) / 1e3))
                for ch in ln["chunks"]:
                    if ch["node_n"] is not None:
                        self._spans.setdefault(ch["node_n"], [])
        # ---- the graph, every layer open
        self.graph = GraphView(gf, max_height=max_height)
        self.graph.expand_all()
        self._gsvg, self._ginfo = self.graph.layout()
        # the step's input leafs as llm_graph_result::set_inputs wrote them (copied just before the compute)
        self.leaf_values: dict[int, np.ndarray] = rec.leaf_values
        self.kind, self.index = None, None          # the selection: ("node" | "leaf", index)
        self.phase = None
        self._nodes_json = None

    # ============================================================================================== recording
    @classmethod
    def record(cls, prompt: str | None = None, threads: int = 2, model=None, n_ctx: int = 256, values: bool = True,
               **kw):
        """Decode ``prompt`` and then one token, recording the trace; then (``values``) the same step in a second
        context with the eval callback copying every node's output (the values pane): ``capture.record_step``. Both
        runs must pick the same token."""
        rec, step = record_step(prompt, threads, model, n_ctx, values, choose=_cleanest if threads > 1 else None)
        self = cls(rec, **kw)
        self.step, self.sched = step, step.ctx.sched         # the live run, for a look at the engine behind it
        return self

    # ============================================================================================== plain data
    def _resolve(self, name_or_index, kind: str):
        names = self.node_names if kind == "node" else self.leaf_names
        if isinstance(name_or_index, str):
            if name_or_index not in names:
                other = self.leaf_names if kind == "node" else self.node_names
                hint = f" (it is a {'leaf' if kind == 'node' else 'node'})" if name_or_index in other else ""
                raise KeyError(f"no {kind} named {name_or_index!r} in the decode graph{hint}")
            return names.index(name_or_index)
        i = int(name_or_index)
        if not 0 <= i < len(names):
            raise IndexError(f"{kind} {i} out of range (0 .. {len(names) - 1})")
        return i

    def tensor(self, kind: str, i: int):
        return self.gf.nodes[i] if kind == "node" else self.gf.leafs[i]

    def bytes_of(self, i: int, kind: str = "node") -> dict:
        """Where tensor ``i``'s bytes are: the buffer and offset its data pointer is at (``memory.resolve``), its
        slot in the allocator's plan, and the other tensors of the plan whose slots overlap those bytes."""
        t = self.tensor(kind, i)
        out = dict(name=t.name, nbytes=int(nbytes(t)), buffer=None, offset=None, planned=False, item=None,
                   view_of=None, sharers=[], in_compute_buffer=False, reused_from=None)
        where = (self.record.node_bytes if kind == "node" else self.record.leaf_bytes)[i]
        if where is not None:
            out.update(buffer=where[0], offset=where[1])
        it = self._node_item.get(i) if kind == "node" else self._leaf_item.get(t.name)
        if kind == "node" and i in self._view_rec:
            out["view_of"] = self._view_rec[i]["view_src"]
        if t.view_src is not None:
            out["view_of"] = t.view_src.name
            vs = t.view_src
            base = next((k for k, n in enumerate(self.gf.nodes) if n is vs), None)
            if base is not None:
                it = self._node_item.get(base)
        if it is not None:
            lo, hi = it["offset"], it["offset"] + it["alloc_size"]
            out.update(planned=True, item=it["id"], slot=(lo, hi), alloc_node=it["alloc_node"],
                       free_node=it["free_node"], space=it["space"], in_compute_buffer=True,
                       reused_from=it["reused_from"] if it["name"] == t.name else None)
            out["sharers"] = [dict(id=o["id"], name=o["name"], offset=o["offset"], size=o["alloc_size"],
                                   alloc_node=o["alloc_node"], end_node=o["end_node"])
                              for o in self.items if o["id"] != it["id"] and o["space"] == it["space"]
                              and o["chunk"] == it["chunk"] and o["offset"] < hi and o["offset"] + o["alloc_size"] > lo]
        return out

    def lanes_of(self, i: int) -> list[dict]:
        """Node ``i``'s spans on each thread of the recorded compute (µs from its start)."""
        return [dict(s) for s in self._spans.get(i, [])]

    def cause_of(self, i: int, kind: str = "node") -> dict:
        if kind == "leaf":
            la = self._leaf_cause[i]
            return dict(backend=la["backend"], cause=la["cause"], stage=None, split=None,
                        why=CAUSES.get(la["cause"].rstrip("0123456789") if la["cause"] else "", ""))
        c = dict(self._cause[i])
        code = c["cause"] or ""
        c["why"] = CAUSES.get(code.rstrip("0123456789") if code.startswith("1.wgt") else code, "")
        c["stage_title"] = STAGE_TITLES.get(c["stage"], "") if c["stage"] else ""
        return c

    def select(self, what, kind: str = "node"):
        """Select a node (index or name) or, with ``kind="leaf"``, a leaf; a name that is not a node is looked up
        among the leafs. Every pane follows."""
        if isinstance(what, str) and kind == "node" and what not in self.node_names and what in self.leaf_names:
            kind = "leaf"
        if kind not in ("node", "leaf"):
            raise ValueError(f"kind must be 'node' or 'leaf', not {kind!r}")
        i = self._resolve(what, kind)
        self.kind, self.index = kind, i
        self._push()
        return self

    def select_phase(self, key: str):
        """Select a phase of the spine (``PHASES``): its text, and the tensor it is about, if any."""
        keys = [p[0] for p in PHASES]
        if key not in keys:
            raise KeyError(f"no phase {key!r}: one of {keys}")
        self.phase = key
        tgt = self._phase_target(key)
        if tgt is not None:
            self.kind, self.index = tgt
        self._push()
        return self

    def _phase_target(self, key):
        if key == "set_inputs":
            for n in ("inp_tokens", "inp_embd", "inp_pos"):
                if n in self.leaf_names:
                    return ("leaf", self.leaf_names.index(n))
        if key in ("logits", "sample") and "result_output" in self.node_names:
            return ("node", self.node_names.index("result_output"))
        if key == "build_graph":
            return ("node", 0)
        # the first node that shows what the phase decided: the ubatch's KV cell written (SET_ROWS into the cache),
        # a tensor placed in place over its dying parent (gallocr's reuse), a MUL_MAT every thread works on
        first = None
        if key == "process_ubatch":
            first = next((i for i, t in enumerate(self.gf.nodes) if t.op == C.GGML_OP_SET_ROWS), None)
        elif key == "sched_alloc":
            first = next((i for i in sorted(self._node_item) if self._node_item[i]["reused_from"] is not None), None)
        elif key == "compute":
            first = next((i for i, t in enumerate(self.gf.nodes) if t.op == C.GGML_OP_MUL_MAT
                          and len(self._spans.get(i, ())) > 1), None)
        return ("node", first) if first is not None else None

    def state(self) -> dict:
        st = {"n_nodes": self.n_nodes, "n_leafs": self.gf.n_leafs, "phase": self.phase, "selected": None,
              "graph_highlight": None, "bytes": None, "lanes": None, "cause": None, "values": None}
        if self.index is None:
            return st
        k, i = self.kind, self.index
        t = self.tensor(k, i)
        vert = self._ginfo["vertex_of_node"][i] if k == "node" else self._ginfo["vertex_of_leaf"][i]
        st.update(selected=dict(kind=k, index=i, name=t.name, op=op_desc(t), type=type_name(t.type),
                                ne=[int(x) for x in t.shape]),
                  graph_highlight=vert, bytes=self.bytes_of(i, k),
                  lanes=self.lanes_of(i) if k == "node" else [], cause=self.cause_of(i, k))
        v = self.values.get(i) if k == "node" else self.leaf_values.get(i)
        if v is not None:
            f = v[np.isfinite(v)]
            st["values"] = dict(shape=list(v.shape), n=int(v.size), min=float(f.min()) if f.size else None,
                                max=float(f.max()) if f.size else None, first=[float(x) for x in v.reshape(-1)[:8]])
        return st

    # ============================================================================================== pictures
    def mem_svg(self, prefix: str | None = None, width: int = 900, height: int = 300, zoom: bool = False) -> str:
        """The compute buffer's plan as SVG: x = node index (-1: leafs / inputs), y = offset (broken above the
        tensors smaller than a quarter of the buffer: the logits would squash everything else). Every slot is a
        ``<rect id="{prefix}m{item}">``; each has a hidden byte band ``{prefix}b{item}`` and each node a hidden
        column ``{prefix}x{node}`` that the selection's CSS shows. ``zoom``: the same slots without text, one user
        unit per node (x = node + 1) and ``preserveAspectRatio="none"``, so that a viewBox shows a few nodes."""
        p = self.prefix if prefix is None else prefix
        sp = self.items[0]["space"] if self.items else 0
        items = [it for it in self.items if it["space"] == sp]
        size = max([self.av.space_size(sp)] + [it["offset"] + it["alloc_size"] for it in items])
        big = [it["alloc_size"] > 0.25 * size for it in items]
        rest = max([it["offset"] + it["alloc_size"] for it, b in zip(items, big) if not b] or [size])
        brk = rest * 1.05 if any(big) and rest < 0.4 * size else None
        L, R, T, B = 70, 10, 8, 26
        w, h = width - L - R, height - T - B
        n = self.n_nodes + 1
        if zoom:
            L, R, T, B, w, h = 0, 0, 0, 0, n, height

        def X(node):
            return L + (node + 1) * w / n

        def Y(off):
            if brk is None:
                u = off / size
            else:
                u = 0.8 * off / brk if off <= brk else 0.8 + 0.2 * (off - brk) / max(size - brk, 1)
            return T + h - u * h

        if zoom:
            out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                   f'viewBox="0 0 {n} {height}" preserveAspectRatio="none" data-n="{n}">',
                   f'<rect x="0" y="0" width="{n}" height="{height}" fill="#fafafa"/>']
        else:
            out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                   f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="10">',
                   f'<rect x="{L}" y="{T}" width="{w}" height="{h}" fill="#fafafa" stroke="#bbb"/>']
        ve = ' vector-effect="non-scaling-stroke"' if zoom else ""
        for it in items:
            x0, x1 = X(it["alloc_node"] - 0.5), X(it["end_node"] + 0.5)
            y0, y1 = Y(it["offset"] + it["alloc_size"]), Y(it["offset"])
            out.append(f'<rect id="{p}b{it["id"]}" class="{p}band" x="{L}" y="{y0:.2f}" width="{w}" '
                       f'height="{max(y1 - y0, 1.5):.2f}" fill="{RED}" opacity="0.12" style="display:none"/>')
        for it in items:
            x0, x1 = X(it["alloc_node"] - 0.5), X(it["end_node"] + 0.5)
            y0, y1 = Y(it["offset"] + it["alloc_size"]), Y(it["offset"])
            col = G.op_color(it["op"] or "NONE") if it["phase"] == "nodes" else "#c8e6c9"
            out.append(f'<rect id="{p}m{it["id"]}" x="{x0:.2f}" y="{y0:.2f}" width="{max(x1 - x0, 1.0):.2f}" '
                       f'height="{max(y1 - y0, 1.0):.2f}" fill="{col}" stroke="#455a64" stroke-width="0.3"{ve}>'
                       f'<title>{esc(it["name"])}: offset {it["offset"]}, {_fmt_bytes(it["alloc_size"])}, '
                       f'nodes {it["alloc_node"]}..{it["end_node"]}</title></rect>')
        for i in range(self.n_nodes):
            out.append(f'<line id="{p}x{i}" x1="{X(i):.2f}" x2="{X(i):.2f}" y1="{T}" y2="{T + h}" stroke="{RED}" '
                       f'stroke-width="1.5" style="display:none"{ve}/>')
        if zoom:
            return "".join(out) + "</svg>"
        if brk is not None:
            out.append(f'<line x1="{L}" x2="{L + w}" y1="{Y(brk):.1f}" y2="{Y(brk):.1f}" stroke="#999" '
                       f'stroke-dasharray="2 3"/><text x="{L + w - 4}" y="{Y(brk) - 3:.1f}" text-anchor="end" '
                       f'fill="#666">axis break: to scale below {_fmt_bytes(brk)}</text>')
        for off in (0, brk if brk else size / 2, size):
            out.append(f'<text x="{L - 4}" y="{Y(off) + 3:.1f}" text-anchor="end">{_fmt_bytes(off)}</text>')
        for node in range(0, self.n_nodes, 100):
            out.append(f'<text x="{X(node):.1f}" y="{T + h + 12}" text-anchor="middle">{node}</text>')
        out.append(f'<text x="{L + w / 2}" y="{height - 2}" text-anchor="middle">node index (the plan of '
                   f'ggml_gallocr: each tensor\'s slot from the node that allocates it to the one after which it '
                   f'is freed)</text></svg>')
        return "".join(out)

    def lanes_svg(self, prefix: str | None = None, width: int = 900, lane_h: int = 26) -> str:
        """The recorded compute's thread lanes as SVG, x = time: node spans (``class="{prefix}s{node}"``) coloured by
        op, barrier waits grey. Drawn with ``preserveAspectRatio="none"`` so a viewBox zooms the time axis only."""
        p = self.prefix if prefix is None else prefix
        if self.compute is None:
            return "<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'></svg>"
        n_th = len(self.compute["threads"])
        T = (self._t1 - self._t0) / 1e3          # µs
        H = n_th * lane_h
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" viewBox="0 0 {T:.3f} {H}" '
               f'preserveAspectRatio="none" data-t-end="{T:.3f}">']
        ops = {i: t.op for i, t in enumerate(self.gf.nodes)}
        for row, (ith, ln) in enumerate(self.compute["threads"].items()):
            y = row * lane_h
            out.append(f'<rect x="0" y="{y}" width="{T:.3f}" height="{lane_h - 2}" fill="#f5f5f5"/>')
            for b in ln["barriers"]:
                out.append(f'<rect x="{(b["t_enter"] - self._t0) / 1e3:.3f}" y="{y + 6}" '
                           f'width="{max(b["t_exit"] - b["t_enter"], 0) / 1e3:.3f}" height="{lane_h - 14}" '
                           f'fill="#bdbdbd"/>')
            for s in ln["nodes"]:
                i = s["node_n"]
                col = G.op_color(op_desc(self.gf.nodes[i]) if ops.get(i) is not None else "NONE")
                out.append(f'<rect class="{p}s{i} {p}span" x="{(s["t_start"] - self._t0) / 1e3:.3f}" y="{y + 1}" '
                           f'width="{max(s["t_end"] - s["t_start"], 0) / 1e3:.3f}" height="{lane_h - 4}" '
                           f'fill="{col}" vector-effect="non-scaling-stroke"><title>#{i} {esc(s["name"])} '
                           f'(thread {ith}): {(s["t_end"] - s["t_start"]) / 1e3:.1f} µs</title></rect>')
        out.append("</svg>")
        return "".join(out)

    def src_vertices(self, kind, i) -> list[str]:
        """The graph vertices of tensor ``i``'s sources (``src[]``): nodes or leafs of the graph."""
        if kind != "node":
            return []
        if not hasattr(self, "_ix"):
            self._ix = ({t.addr: j for j, t in enumerate(self.gf.nodes)}, {t.addr: j for j, t in enumerate(self.gf.leafs)})
        out = []
        for src in self.gf.nodes[i].src:
            if src is None:
                continue
            j = self._ix[0].get(src.addr)
            v = self._ginfo["vertex_of_node"][j] if j is not None else None
            if j is None and src.addr in self._ix[1]:
                v = self._ginfo["vertex_of_leaf"][self._ix[1][src.addr]]
            if v and v not in out:
                out.append(v)
        return out

    def css_for(self, kind, i, prefix: str | None = None, gprefix: str | None = None) -> str:
        """The CSS of one selection (what the browser applies by itself, from ``nodes_json``)."""
        if i is None:
            return ""
        p = self.prefix if prefix is None else prefix
        gp = self.graph.prefix if gprefix is None else gprefix
        vert = self._ginfo["vertex_of_node"][i] if kind == "node" else self._ginfo["vertex_of_leaf"][i]
        css = []
        srcs = self.src_vertices(kind, i)
        if srcs:                                     # what the node reads: its src[] outlined in blue
            css.append(highlight_css(gp, srcs, f"stroke: {SRC} !important; stroke-width: 4px !important;"))
        if vert:
            css.append(highlight_css(gp, [vert]))
        b = self.bytes_of(i, kind)
        if b["item"] is not None:
            css.append(f"#{p}m{b['item']} {{ stroke: {RED} !important; stroke-width: 2.5px !important; }}")
            css.append(f"#{p}b{b['item']} {{ display: inline !important; }}")
            if b["sharers"]:
                css.append(", ".join(f"#{p}m{o['id']}" for o in b["sharers"])
                           + f" {{ stroke: {SHARE} !important; stroke-width: 1.5px !important; }}")
        if kind == "node":
            css.append(f"#{p}x{i} {{ display: inline !important; }}")
            css.append(f".{p}s{i} {{ fill: {RED} !important; stroke: {RED} !important; stroke-width: 3px !important; }}")
        return "\n".join(css)

    # ---- the panes' text
    def _bytes_html(self, kind, i) -> str:
        b = self.bytes_of(i, kind)
        where = (f"{esc(b['buffer'])} + {b['offset']:,}" if b["offset"] is not None else esc(b["buffer"] or "no data"))
        s = f"<b>{esc(b['name'])}</b>: {b['nbytes']:,} bytes at {where}"
        if b["view_of"]:
            s += f"<br/>a view of <b>{esc(b['view_of'])}</b>: no bytes of its own (ggml_backend_view_init)"
        if b["reused_from"]:
            s += (f"<br/>written <b>in place</b> over its parent <b>{esc(b['reused_from'])}</b>, whose last reader it "
                  f"is (ggml_gallocr_allocate_node, ggml_op_can_inplace)")
        if b["planned"]:
            lo, hi = b["slot"]
            # (which plan the slot is from is said once, at the top of the pane: plan_note)
            s += (f"<br/>slot in the compute buffer: [{lo:,}, {hi:,}) = {_fmt_bytes(hi - lo)}, from node "
                  f"{b['alloc_node']} to {'the end (never freed)' if b['free_node'] is None else b['free_node']}"
                  f"<br/><span style='color:{SHARE}'>the same bytes, at other times</span>: {len(b['sharers'])} "
                  f"tensors")
            if b["sharers"]:
                s += ": " + ", ".join(f"{esc(o['name'])} ({o['alloc_node']}..{o['end_node']})"
                                      for o in b["sharers"][:12]) + (" …" if len(b["sharers"]) > 12 else "")
        elif b["buffer"] and not b["view_of"]:
            s += "<br/>not placed by the graph allocator (a weight, the KV cache, or a view into one)"
        return s

    def lanes_note(self) -> str:
        """Which path of the CPU backend ran the recorded compute (the lanes mean different things), and how much
        the machine disturbed it (``timeline.disturbance``)."""
        if self.compiled:
            note = ("recorded from the compiled path (ggviz/ggml/cpu/fast): the threads can run at the same time, "
                    "as in ggml")
            try:
                note += "; this recording: " + disturbance(timeline_data(self.record.events))["note"]
            except ValueError:          # no compute recorded
                pass
            return note
        return ("recorded from the faithful NumPy path: Python's GIL lets one thread run at a time, so a thread's "
                "wait is often the other one holding the GIL, not ggml's barrier")

    def _lanes_html(self, kind, i) -> str:
        if kind != "node":
            return "a leaf: no kernel runs for it (its data is set before the compute)"
        sp = self.lanes_of(i)
        if not sp:
            return "no span recorded (a view / no-op node: ggml_graph_compute skips it)"
        return "; ".join(f"thread {s['ith']}: {s['t0']:.1f} – {s['t1']:.1f} µs ({s['t1'] - s['t0']:.1f} µs)"
                         for s in sp)

    def _cause_html(self, kind, i) -> str:
        c = self.cause_of(i, kind)
        s = f"backend <b>{esc(c['backend'])}</b>, cause <code>{esc(c['cause'])}</code>: {esc(c['why'])}"
        if kind == "node":
            if c.get("stage"):
                s += f"<br/>set in {esc(c['stage_title'])}"
            if c["split"] is not None:
                sp = self.sv.splits[c["split"]]
                s += (f"<br/>split {c['split']} of {len(self.sv.splits)}: nodes {sp['i_start']}..{sp['i_end'] - 1} "
                      f"on {esc(sp['backend'])}, {len(sp['inputs'])} inputs copied")
        return s

    def _info_html(self, kind, i) -> str:
        t = self.tensor(kind, i)
        return (f"<b>{kind} {i}</b> <code>{esc(t.name)}</code> {esc(op_desc(t))} {esc(type_name(t.type))} "
                f"ne={[int(x) for x in t.shape]}"
                + (f" layer {G.layer_of(t.name)}" if G.layer_of(t.name) is not None else ""))

    def values_html(self, small: bool = False) -> str:
        """The values pane of the selection; ``small``: the static book's (the first 8 x 128 of the rows drawn,
        64 colours: it records one per node)."""
        if self.index is None:
            return "<i>select a node</i>"
        if self.kind != "node" and self.index not in self.leaf_values:
            return ("<i>a leaf: no values shown (a weight or the KV cache; the eval callback sees nodes, and only "
                    "the step's inputs are copied)</i>")
        v = self.values.get(self.index) if self.kind == "node" else self.leaf_values[self.index].astype(np.float32)
        if v is None:
            return ("<i>no values: the eval callback is not called for this node (a view or a no-op reads its "
                    "source's bytes)</i>" if self.values else "<i>no values recorded</i>")
        r, folded = _rows(v, 64 if v.size <= 4096 else 256)
        full = r.shape
        r = r[:8, :128] if small else r[:96, :1024]
        scale = max(1, min(8, 512 // max(r.shape[1], 1)))
        ys = max(1, min(12, 240 // max(r.shape[0], 1)))          # a few rows (heads) stay tall enough to see
        f = v[np.isfinite(v)]
        head = (f"shape (C order) {list(v.shape)}, {v.size:,} values; min {f.min():.4g}, max {f.max():.4g}, "
                f"mean {f.mean():.4g}" if f.size else f"shape {list(v.shape)}: no finite value")
        first = np.array2string(v.reshape(-1)[:8], precision=4, separator=", ")
        name = self.node_names[self.index] if self.kind == "node" else self.leaf_names[self.index]
        note = f"<br/>(one row folded into rows of {full[1]})" if folded else ""
        if small and r.shape != full:
            note += f"<br/>(the first {r.shape[0]}×{r.shape[1]} of {full[0]}×{full[1]} drawn)"
        if self.kind != "node":
            note += "<br/>(written by set_inputs, copied just before the compute)"
        return (f"<div style='font-size:12px'><b>{esc(name)}</b> ({self.kind} {self.index}): {esc(head)}<br/>"
                f"first values: "
                f"<code>{esc(first)}</code><br/>"
                f"{self._values_img(r, scale, ys, small)}{note}</div>")

    @staticmethod
    def _values_img(r, scale, ys, small):
        if not small:
            return png_img(array_png(r, scale=scale, yscale=ys), 'image-rendering:pixelated')
        return png_img(array_png(r, levels=64), f"width:{r.shape[1] * scale}px;height:{r.shape[0] * ys}px;"
                                                "image-rendering:pixelated")

    def nodes_json(self) -> str:
        """Per node and leaf, what a selection shows: the ids the CSS names and the panes' HTML (sent to the browser
        once)."""
        if self._nodes_json is None:
            out = {}
            for kind, n, key in (("node", self.n_nodes, "n"), ("leaf", self.gf.n_leafs, "l")):
                for i in range(n):
                    t = self.tensor(kind, i)
                    vert = self._ginfo["vertex_of_node"][i] if kind == "node" else self._ginfo["vertex_of_leaf"][i]
                    lanes = self.lanes_of(i) if kind == "node" else []
                    b = self.bytes_of(i, kind)
                    # the browser writes the selection's CSS from these (what css_for writes): the vertex, the slot,
                    # the slots that share its bytes, the node's column and lane spans
                    out[f"{key}{i}"] = dict(name=t.name, v=vert, item=b["item"], sh=[o["id"] for o in b["sharers"]],
                                            src=self.src_vertices(kind, i),
                                            info=self._info_html(kind, i), bytes=self._bytes_html(kind, i),
                                            lanes=self._lanes_html(kind, i), cause=self._cause_html(kind, i),
                                            t=[min(s["t0"] for s in lanes), max(s["t1"] for s in lanes)]
                                            if lanes else None)
            self._nodes_json = json.dumps(out)
        return self._nodes_json

    def phases(self) -> list[dict]:
        """The spine: each phase's function, text, the time it took in this run (from the trace events) and the
        tensor it selects; with ``reused`` (``reused_step``), the time the same phase took in the next step, which
        reused the graph."""
        spans = phase_spans(self.record.events)
        nxt = getattr(self, "reused", None)
        out = []
        for key, fn, text in PHASES:
            s = spans.get(key)
            extra = ""
            if key == "llama_decode":
                extra = f" This step: 1 token ({self.record.token}) at position {self.record.pos}, " \
                        f"{self.record.t_decode_ms:.1f} ms in all."
            elif key == "build_graph":
                extra = f" {self.n_nodes} nodes, {self.gf.n_leafs} leafs."
            elif key == "sched_alloc":
                extra = (f" {len(self.sv.splits)} split(s) on {', '.join(sorted({s['backend'] for s in self.sv.splits}))}"
                         f"; compute buffer {_fmt_bytes(self.av.space_size(0))}.")
                if getattr(self.sv, "reused", False):
                    extra += (" This step reused the previous decode's graph (same shapes: llama.cpp's graph reuse), "
                              "so it neither split nor allocated: shown is the split it computed with, the last one "
                              "made (by the prompt's decode).")
            elif key == "compute" and self.compute is not None:
                extra = f" {len(self.compute['threads'])} threads, {(self._t1 - self._t0) / 1e6:.2f} ms."
            elif key == "sample" and self.chain_history:
                piece = lambda t: repr(self._piece(t))  # noqa: E731
                extra = (f" Below: llama-cli's default chain ({' → '.join(h['step'] for h in self.chain_history[1:])})"
                         f" on this step's logits; it picked token {self.chain_token} {piece(self.chain_token)}."
                         + (f" (This recording itself continues greedily: the argmax, token {self.sampled} "
                            f"{piece(self.sampled)}.)" if self.sampled is not None else ""))
            tgt = self._phase_target(key)
            if nxt is not None and key in ("build_graph", "sched_alloc", "set_inputs", "compute"):
                extra += (f" The next step, which reused the graph: {nxt['ms'][key]:.1f} ms."
                          if nxt["ms"].get(key) is not None else " The next step, which reused the graph: skipped.")
            ms = (s[1] - s[0]) / 1e6 if s else (self.record.t_decode_ms if key == "llama_decode"
                                                 else None)
            out.append(dict(key=key, fn=fn, text=text + extra, ms=ms,
                            ms_next=(nxt["total_ms"] if key == "llama_decode" else nxt["ms"].get(key, 0.0))
                            if nxt is not None and key in ("llama_decode", "build_graph", "sched_alloc", "set_inputs",
                                                           "compute") else None,
                            select=(("n" if tgt[0] == "node" else "l") + str(tgt[1])) if tgt else "",
                            html=self.sampler_html() if key == "sample" else ""))
        return out

    def timing_note(self) -> str:
        """What the times on the spine are: Python's cost for this step, and the step llama.cpp (and ggviz) runs for
        every later token, which reuses the graph."""
        s = ("Times: this step in ggviz. Building the graph, splitting and allocating it run as interpreted Python "
             "here (llama.cpp does them in C, in a fraction of a millisecond); the compute runs compiled kernels.")
        nxt = self.reused
        if nxt is not None and nxt["reused"]:
            ms = nxt["ms"]
            s += (f" Green: the next token's step, which reused the graph (llm_graph_result::can_reuse, as llama.cpp "
                  f"does for every step of the same shape): no graph built, none allocated"
                  f"{'' if ms.get('sched_alloc') is None else ' (scheduler ' + format(ms['sched_alloc'], '.1f') + ' ms)'}"
                  f", compute {ms.get('compute', 0.0):.1f} ms of {nxt['total_ms']:.1f} ms in all.")
        return s

    def _piece(self, tok):
        return token_piece(self._pieces, tok)

    def sampler_html(self) -> str:
        """The "sample" phase's pane: the chain's stages as SamplerView draws them (grid of candidates x stages,
        then the chosen token's stage table)."""
        if not self.chain_history:
            return ""
        if self._sampler_html is None:
            sv = model_views.SamplerView(self.chain_history, self._pieces)
            self._sampler_html = (png_img(fig_to_png(sv.figure()), "max-width:100%")
                                  + "<div style='font-size:12px'>the last stage, its candidates:</div>"
                                  + sv.stage_html())
        return self._sampler_html

    # ============================================================================================== static
    def to_html(self) -> str:
        p = new_prefix("exs")
        k, i = self.kind, self.index
        boxes = []
        for ph in self.phases():
            on = "#ffcdd2" if ph["key"] == self.phase else "#eceff1"
            ms = f" <small>{ph['ms']:.1f} ms</small>" if ph["ms"] else ""
            if ph.get("ms_next") is not None:
                ms += f" <small style='color:#2e7d32'>· next {ph['ms_next']:.1f}</small>"
            boxes.append(f"<span title='{esc(ph['text'])}' style='display:inline-block;padding:3px 7px;margin:2px;"
                         f"border-radius:4px;font-size:12px;border:1px solid #90a4ae;background:{on}'>"
                         f"{esc(ph['fn'])}{ms}</span>")
        spine = " → ".join(boxes) + f"<div style='font-size:11px;color:#546e7a'>{esc(self.timing_note())}</div>"
        if self.phase == "sample":
            spine += self.sampler_html()
        gv = GraphView(self.gf, max_open=1)
        if i is not None:
            gv.select(i, kind=k)
            g_svg = gv.svg()
            vert = gv.vertex(i, k)
            g_svg = svg_window(g_svg, gv.prefix + vert, 500, 320) if vert else g_svg
        else:
            g_svg = gv.svg()
        css = [gv.css()]
        if i is not None:
            css.append(self.css_for(k, i, prefix=p, gprefix=gv.prefix))
        memz = ""
        if i is not None:
            css.append(re.sub(r"#" + re.escape(p) + r"([mbx]\d+)", lambda m: f"#{p}z{m.group(1)}",
                              self.css_for(k, i, prefix=p, gprefix=gv.prefix)))
            a = min(max((i + 1 if k == "node" else 0) - 40, 0), self.n_nodes + 1 - 80)
            memz = self.mem_svg(prefix=p + "z", height=200, zoom=True).replace(
                f'viewBox="0 0 {self.n_nodes + 1} 200"', f'viewBox="{a} 0 80 200"', 1)
            memz = (f"<div style='font-size:12px;margin-top:4px'>zoomed: nodes {a - 1} .. {a + 78}</div>"
                    f"<div style='width:900px'>{memz}</div>")
        lanes = self.lanes_svg(prefix=p)
        if k == "node" and self.lanes_of(i):
            t0 = min(s["t0"] for s in self.lanes_of(i))
            t1 = max(s["t1"] for s in self.lanes_of(i))
            x, w = lanes_window(t0, t1, float(re.search(r'data-t-end="([0-9.]+)"', lanes).group(1)))
            lanes = lanes.replace('viewBox="0 0 ', 'data-full="', 1)
            lanes = lanes.replace("<svg ", f'<svg viewBox="{x:.3f} 0 {w:.3f} {len(self.compute["threads"]) * 26}" ', 1)
        sel = self._info_html(k, i) if i is not None else "<i>nothing selected</i>"

        def pane(title, body):
            return (f"<div style='margin:6px 0'><div style='font-weight:bold;font-size:13px'>{title}</div>"
                    f"<div style='font-size:12px'>{body}</div></div>")

        return (f"<div class='ggv-explorer-static'><style>{''.join(css)}</style>"
                f"<div style='font-size:12px'>{spine}</div><div style='font-size:13px;margin:4px 0'>{sel}</div>"
                f"<div style='display:flex;gap:10px;align-items:flex-start'>"
                f"<div style='overflow:auto;max-height:440px;border:1px solid #ddd'>{g_svg}</div>"
                f"<div style='max-width:560px'>"
                + pane("scheduler", self._cause_html(k, i) if i is not None else "")
                + pane("values", self.values_html()) + "</div></div>"
                + pane("bytes (the compute buffer)", esc(self.plan_note) + "<br/>"
                       + (self._bytes_html(k, i) if i is not None else "")
                       + "<br/>" + self.mem_svg(prefix=p) + memz)
                + pane("thread lanes (zoomed on the node)", esc(self.lanes_note()) + "<br/>"
                       + (self._lanes_html(k, i) if i is not None else "")
                       + f"<br/><div style='width:900px'>{lanes}</div>")
                + "</div>")

    # ============================================================================================== live
    def _build(self):
        phases = self.phases()
        self._pane = ExplorerPane(graph_svg=self._gsvg, mem_svg=self.mem_svg(),
                                  memz_svg=self.mem_svg(prefix=self.prefix + "z", height=200, zoom=True),
                                  lanes_svg=self.lanes_svg(), lanes_note=self.lanes_note(),
                                  plan_note=self.plan_note, timing_note=self.timing_note(),
                         nodes=self.nodes_json(), phases=json.dumps(phases), prefix=self.prefix,
                         gprefix=self.graph.prefix, max_height=self.max_height,
                         n_threads=len(self.compute["threads"]) if self.compute else 0)
        self._pane.observe(self._from_browser, ["selected", "phase"])
        box = W.VBox([self._pane])
        box.add_class("ggv-explorer")
        return box

    def book_view(self) -> dict:
        """The live widget's traits, plus every node's and leaf's values pane (small heatmaps): the book's explorer
        follows a click, a search or a phase in all its panes. Records embedded: the per-node table the live page
        gets (``nodes_json``: vertex, slot, sharers, sources, cause, bytes and lanes text) and the values copied by
        the eval callback (``values``), one pane per node and leaf."""
        self.widget
        state = pane_state(self._pane)
        here = self.kind, self.index
        panes = {}
        try:
            for kind, n, key in (("node", self.n_nodes, "n"), ("leaf", self.gf.n_leafs, "l")):
                for i in range(n):
                    self.kind, self.index = kind, i
                    panes[f"{key}{i}"] = self.values_html(small=True)
        finally:
            self.kind, self.index = here
        state["values_html"] = self.values_html(small=True)
        return book_payload("explorer.js", state, [{"on": "selected", "set": "values_html", "values": panes}],
                            css="explorer.css")

    def _from_browser(self, ch):
        key = self._pane.selected
        if ch["name"] == "phase":
            self.phase = self._pane.phase or None
        if key and key[0] in "nl" and key[1:].isdigit():            # anything else is not a selection: ignored
            kind = "node" if key[0] == "n" else "leaf"
            if int(key[1:]) < (self.n_nodes if kind == "node" else self.gf.n_leafs):
                self.kind, self.index = kind, int(key[1:])
        self._pane.values_html = self.values_html()

    def _push(self):
        if self._widget is None:
            return
        key = ("n" if self.kind == "node" else "l") + str(self.index) if self.index is not None else ""
        if self._pane.phase != (self.phase or ""):
            self._pane.phase = self.phase or ""
        if self._pane.selected != key:
            self._pane.selected = key
        self._pane.values_html = self.values_html()

    def _refresh(self):
        self._push()


class ExplorerPane(anywidget.AnyWidget):
    """The explorer's browser side: the three pictures, the per-node table, the selection (both ways)."""
    _esm = template("explorer.js")
    _css = template("explorer.css")
    graph_svg = traitlets.Unicode("").tag(sync=True)
    mem_svg = traitlets.Unicode("").tag(sync=True)
    memz_svg = traitlets.Unicode("").tag(sync=True)
    lanes_svg = traitlets.Unicode("").tag(sync=True)
    lanes_note = traitlets.Unicode("").tag(sync=True)
    plan_note = traitlets.Unicode("").tag(sync=True)
    timing_note = traitlets.Unicode("").tag(sync=True)
    nodes = traitlets.Unicode("{}").tag(sync=True)
    phases = traitlets.Unicode("[]").tag(sync=True)
    prefix = traitlets.Unicode("").tag(sync=True)
    gprefix = traitlets.Unicode("").tag(sync=True)
    max_height = traitlets.Unicode("520px").tag(sync=True)
    n_threads = traitlets.Int(0).tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    phase = traitlets.Unicode("").tag(sync=True)
    values_html = traitlets.Unicode("").tag(sync=True)
