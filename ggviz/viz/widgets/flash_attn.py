"""One query row of a real FLASH_ATTN_EXT node, KV cell by KV cell: ggml's one-chunk kernel
(``ggml_compute_forward_flash_attn_ext_f16_one_chunk``), the online softmax as the CPU runs it for a decode step.

Per KV cell the mask lets in: the score ``s = vec_dot_f16(k, q_f16)·scale + mask``; if ``s > M`` the running max
moves up and the F16 accumulator VKQ and the running sum S are rescaled by ``ms = expf(Mold - M)``; otherwise the
cell's weight is ``vs = expf(s - M)``; then ``VKQ += vs·v`` (F16, one FMA per lane) and ``S = S·ms + vs``. After
the last cell the output row is ``VKQ / S``. The numbers come from ``ggviz.capture.walk_flash_attn``, which runs the
kernel's own functions; the last step equals the node's output bit for bit (``state()["matches_output"]``).

``AttnGraphsView``: the graph with flash attention beside the graph without it (``capture.capture_attn_graphs``):
node counts, one layer side by side, the tensors only one side allocates (KQ, its softmax ...) and both contexts'
compute buffers.
"""
from __future__ import annotations

import json

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from ...capture.flash_attn import attn_graph_diff, attn_memory, node_key
from ._base import VizWidget, book_payload, esc, fig_to_png, frames_book, html_table, png_img, quiet, stepper_pane

F32 = np.float32


class FlashAttnStepper(VizWidget):
    """A ``FlashAttnWalk`` (one head's query row through a real FLASH_ATTN_EXT node) with a slider over its KV
    cells: s, M, ms, vs, S and the first ``n_dims`` dims of the accumulator at each step, M and S over the cells,
    and at the last cell the result against the node's output."""

    def __init__(self, walk, step: int | None = None, n_dims: int = 4):
        self.walk = walk
        self.n_dims = int(n_dims)
        self.step = len(walk.cells) - 1
        if step is not None:
            self.goto(step)

    @property
    def n_steps(self) -> int:
        return len(self.walk.cells)

    def goto(self, step: int):
        if not 0 <= int(step) < self.n_steps:
            raise ValueError(f"step {step} out of range: the row attends to {self.n_steps} KV cells")
        self.step = int(step)
        self._changed()
        return self

    def state(self) -> dict:
        w, i = self.walk, self.step
        last = i == self.n_steps - 1
        return {"layer": w.layer, "head": w.head, "kv_head": w.kv_head, "n_kv": w.n_kv, "n_steps": self.n_steps,
                "step": i, "cell": int(w.cells[i]), "s": float(w.s[i]), "M": float(w.M[i]), "ms": float(w.ms[i]),
                "vs": float(w.vs[i]), "S": float(w.S[i]),
                "acc": [float(x) for x in w.acc[i, :self.n_dims].astype(F32)],
                "out_so_far": [float(x) for x in (w.acc[i, :self.n_dims].astype(F32) / w.S[i]).astype(F32)],
                "last": last, "result": [float(x) for x in w.result[:self.n_dims]],
                "output": [float(x) for x in w.output[:self.n_dims]], "matches_output": w.matches_output()}

    # ---- drawing ------------------------------------------------------------------------------------------------
    def rows(self) -> list:
        """The full table: one row per KV cell the kernel visits."""
        w = self.walk
        out = []
        for i, c in enumerate(w.cells):
            r = {"step": i, "KV cell": int(c), "s": f"{w.s[i]:.6g}", "M": f"{w.M[i]:.6g}",
                 "ms = expf(Mold-M)": f"{w.ms[i]:.6g}", "vs = expf(s-M)": f"{w.vs[i]:.6g}", "S": f"{w.S[i]:.6g}"}
            for d in range(self.n_dims):
                r[f"VKQ[{d}]"] = f"{float(w.acc[i, d]):.5g}"
            out.append(r)
        return out

    def figure(self):
        """M and S after each KV cell, the current step marked."""
        w = self.walk
        x = np.arange(self.n_steps)
        fig, ax = plt.subplots(figsize=(7, 2.6))
        ax.plot(x, w.M, marker="o", label="M (running max of s)")
        ax.plot(x, w.S, marker="s", label="S (running sum of expf(s - M))")
        ax.plot(x, w.s, linestyle="none", marker="x", color="#777", label="s (the cell's score)")
        ax.axvline(self.step, color="#d50000", linewidth=1)
        ax.set_xticks(x, [f"{i}\ncell {c}" for i, c in enumerate(w.cells)], fontsize=7)
        ax.set_xlabel("step (KV cell)")
        ax.legend(fontsize=7, frameon=False, loc="best")
        for s in ("top", "right"):
            ax.spines[s].set_visible(False)
        ax.set_title(f"layer {w.layer}, head {w.head} (KV head {w.kv_head}): the online softmax", fontsize=10)
        fig.tight_layout()
        return fig

    def step_html(self) -> str:
        st = self.state()
        head = (f"<p><b>step {st['step']}</b> of {st['n_steps']} (KV cell {st['cell']}): s = {st['s']:.7g}, "
                f"M = {st['M']:.7g}, ms = {st['ms']:.7g}, vs = {st['vs']:.7g}, S = {st['S']:.7g}; "
                f"VKQ[:{self.n_dims}] = {esc(', '.join(f'{x:.5g}' for x in st['acc']))}</p>")
        return head + self.verdict_html()

    def verdict_html(self) -> str:
        w = self.walk
        res = ", ".join(f"{x:.7g}" for x in w.result[:self.n_dims])
        verdict = "== the node's output, bit for bit" if w.matches_output() else "!= the node's output"
        return (f"<p>After the last cell: VKQ / S = [{esc(res)}, …] (all {w.result.shape[0]} dims) "
                f"<b>{esc(verdict)}</b>.</p>")

    def intro_html(self) -> str:
        w = self.walk
        return (f"<p>FLASH_ATTN_EXT of layer {w.layer}, head {w.head}: one query row (position {w.pos}) over "
                f"the {self.n_steps} of {w.n_kv} KV cells the mask lets in (scale {w.scale:.6g}).</p>")

    def to_html(self) -> str:
        return (self.intro_html() + png_img(fig_to_png(self.figure()), "max-width:100%") + html_table(self.rows())
                + self.verdict_html())

    # ---- the browser side (stepper.js, as DecodeStepper's) -------------------------------------------------------
    def frame(self) -> dict:
        """What the browser shows at the current step: M and S with the step marked, the step's numbers, the table."""
        return {"panel": png_img(fig_to_png(self.figure()), "max-width:100%") + self.step_html()
                + html_table(self.rows())}

    def _pane_traits(self) -> dict:
        return dict(header=self.intro_html(), label="KV cell step", n=self.n_steps, pos=self.step, play=True,
                    frame=json.dumps(self.frame()), max_width="0px")

    def _build(self):
        self._pane = stepper_pane(**self._pane_traits())
        self._pane.observe(lambda ch: ch["new"] != self.step and self.goto(ch["new"]), "pos")
        return self._pane

    def _refresh(self):
        self._pane.frame = json.dumps(self.frame())
        if self._pane.pos != self.step:
            self._pane.pos = self.step

    def book_view(self) -> dict:
        """Every step's frame: the book steps through the whole walk. Records embedded: the ``FlashAttnWalk``
        (s, M, ms, vs, S and the accumulator per KV cell), drawn per step."""
        here, frames = self.step, []
        try:
            for k in range(self.n_steps):
                self.step = k
                frames.append(json.dumps(self.frame()))
        finally:
            self.step = here
        state = dict(self._pane_traits(), frame=frames[here])
        return book_payload("stepper.js", state, [{"on": "pos", "set": "frame", "values": frames}])


_TAG_BG = {"removed": "#fde0dc", "added": "#dcf5e3", "moved": "#eef0f7", "same": ""}
_MIB = 1024.0 * 1024.0


def _ne(ne) -> str:
    return "[" + ", ".join(str(int(x)) for x in ne) + "]"


class AttnGraphsView(VizWidget):
    """A ``capture.AttnGraphs`` record (one model's graphs with flash attention and without): the node counts and
    compute buffers of both contexts, the whole graph's op counts that change, one layer of each graph side by side
    (nodes only without flash attention in red, only with it in green, the same node at another place in grey), and
    the tensors the layer allocates on one side only, with their bytes in the decode graph and in the reserve graph
    that sizes the compute buffer. ``show("decode" | "reserve")`` picks the graph the layer table lists."""

    def __init__(self, rec, graph: str = "decode"):
        self.rec = rec
        self.memory = attn_memory(rec)
        self.graph = "decode"
        self.show(graph)

    def show(self, graph: str):
        if graph not in ("decode", "reserve"):
            raise ValueError(f"graph must be 'decode' or 'reserve', not {graph!r}")
        self.graph = graph
        self._changed()
        return self

    def diff(self) -> list:
        return attn_graph_diff(self.rec, pp=self.graph == "reserve")

    def state(self) -> dict:
        r = self.rec
        d = self.diff()
        ops = sorted(set(r.ops["fa"]) | set(r.ops["no_fa"]))
        return {"model": r.model, "n_ctx": r.n_ctx, "n_kv": r.n_kv, "n_tokens_pp": r.n_tokens_pp, "layer": r.layer,
                "graph": self.graph, "n_nodes": dict(r.n_nodes),
                "ops_delta": {o: r.ops["fa"].get(o, 0) - r.ops["no_fa"].get(o, 0) for o in ops
                              if r.ops["fa"].get(o, 0) != r.ops["no_fa"].get(o, 0)},
                "removed": [node_key(x["no_fa"]) for x in d if x["tag"] == "removed"],
                "added": [node_key(x["fa"]) for x in d if x["tag"] == "added"],
                "moved": sum(x["tag"] == "moved" for x in d) // 2,
                "memory": self.memory,
                "layer_bytes_pp": {"removed": sum(x["bytes_pp"] for x in self.memory["removed"]),
                                   "added": sum(x["bytes_pp"] for x in self.memory["added"])},
                "compute_buffer": {k: sum(v.values()) for k, v in r.compute_buffer.items()}}

    # ---- drawing ------------------------------------------------------------------------------------------------
    def summary_rows(self) -> list:
        r, st = self.rec, self.state()
        out = []
        for side, label in (("no_fa", "flash_attn_type = 0 (off)"), ("fa", "AUTO -> on (llama.cpp's default)")):
            out.append({"context": label, "decode graph nodes": r.n_nodes[side],
                        "compute buffer (MiB, from the reserve)": f"{st['compute_buffer'][side] / _MIB:.2f}"})
        return out

    def layer_table_html(self) -> str:
        head = "".join(f"<th style='text-align:left;padding:1px 6px'>{esc(c)}</th>"
                       for c in ("#", "op", "name", "ne", "", "#", "op", "name", "ne"))
        body = []
        for x in self.diff():
            cells = []
            for side in ("no_fa", "fa"):
                n = x[side]
                vals = ("", "", "", "") if n is None else (n["n"], n["op"], n["name"], _ne(n["ne"]))
                cells += [f"<td style='font-family:monospace;padding:1px 6px'>{esc(v)}</td>" for v in vals]
                if side == "no_fa":
                    cells.append(f"<td style='padding:1px 6px;color:#555'>{esc(x['tag'])}</td>")
            body.append(f"<tr style='background:{_TAG_BG[x['tag']]}'>" + "".join(cells) + "</tr>")
        r = self.rec
        cap = (f"layer {r.layer}, {'decode' if self.graph == 'decode' else 'pp reserve'} graph: without flash "
               f"attention (left) and with it (right)")
        return (f"<table style='border-collapse:collapse'><caption style='text-align:left'><b>{esc(cap)}</b>"
                f"</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")

    def memory_rows(self) -> list:
        out = []
        for tag in ("removed", "added"):
            for m in self.memory[tag]:
                out.append({"": "only without FA" if tag == "removed" else "only with FA", "op": m["op"],
                            "name": m["name"], "ne (decode)": _ne(m["ne"]), "bytes (decode)": m["bytes"],
                            "ne (pp reserve)": _ne(m["ne_pp"]), "MiB (pp reserve)": f"{m['bytes_pp'] / _MIB:.4g}"})
        return out

    def to_html(self) -> str:
        r, st = self.rec, self.state()
        nl = r.n_layer
        net = (r.n_nodes["no_fa"] - r.n_nodes["fa"])
        ops = ", ".join(f"{o} {d:+d}" for o, d in st["ops_delta"].items())
        intro = (f"<p>{esc(r.model)}, n_ctx {r.n_ctx}: the decode graph (1 token over {r.n_kv} cells) has "
                 f"{r.n_nodes['no_fa']} nodes without flash attention and {r.n_nodes['fa']} with it: "
                 f"{net} fewer, {net // nl if nl else 0} per layer over {nl} layers (ops, whole graph: {esc(ops)})."
                 f"</p>")
        lb = st["layer_bytes_pp"]
        cb = st["compute_buffer"]
        mem = (f"<p>Per layer, at the reserve's shape ({r.n_tokens_pp} tokens over {r.n_kv} cells), the tensors "
               f"only the graph without flash attention allocates hold {lb['removed'] / _MIB:.4g} MiB, those only "
               f"the graph with it allocates {lb['added'] / _MIB:.4g} MiB. The compute buffers the two reserves "
               f"sized: {cb['no_fa'] / _MIB:.2f} MiB without, {cb['fa'] / _MIB:.2f} MiB with (the allocator reuses "
               f"memory: the buffer is the peak of the live tensors, not their sum).</p>")
        return (intro + html_table(self.summary_rows()) + self.layer_table_html() + mem
                + html_table(self.memory_rows(), title="the tensors one side allocates and the other does not"))

    def book_view(self) -> dict:
        """Both graphs' tables recorded (HTML): the decode / pp reserve toggle works in the page."""
        graph = self.graph

        def frame(key):
            self.graph = key[0]
            return {"info": self.to_html()}

        try:
            with quiet(self):
                return frames_book([{"name": "graph", "label": "", "kind": "toggle", "value": graph,
                                     "options": [["decode graph", "decode"], ["pp reserve graph", "reserve"]]}],
                                   [("decode",), ("reserve",)], frame)
        finally:
            self.graph = graph

    def _build(self):
        self._w_graph = W.ToggleButtons(options=[("decode graph", "decode"), ("pp reserve graph", "reserve")],
                                        value=self.graph)
        self._w_graph.observe(lambda ch: self.show(ch["new"]), "value")
        self._w_html = W.HTML(self.to_html())
        return W.VBox([self._w_graph, self._w_html])

    def _refresh(self):
        self._w_graph.value = self.graph
        self._w_html.value = self.to_html()
