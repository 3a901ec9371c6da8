"""One query row of a real FLASH_ATTN_EXT node, KV cell by KV cell: ggml's one-chunk kernel
(``ggml_compute_forward_flash_attn_ext_f16_one_chunk``), the online softmax as the CPU runs it for a decode step.

Per KV cell the mask lets in: the score ``s = vec_dot_f16(k, q_f16)·scale + mask``; if ``s > M`` the running max
moves up and the F16 accumulator VKQ and the running sum S are rescaled by ``ms = expf(Mold - M)``; otherwise the
cell's weight is ``vs = expf(s - M)``; then ``VKQ += vs·v`` (F16, one FMA per lane) and ``S = S·ms + vs``. After
the last cell the output row is ``VKQ / S``. The numbers come from ``ggviz.capture.walk_flash_attn``, which runs the
kernel's own functions; the last step equals the node's output bit for bit (``state()["matches_output"]``).
"""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np

from ._base import VizWidget, book_payload, esc, fig_to_png, html_table, png_img, stepper_pane

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
