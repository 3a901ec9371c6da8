"""One row·column product of a real MUL_MAT, lane by lane: ggml's AVX2 ``ggml_vec_dot_q4_1_q8_1``.

Mirrors arch/x86/quants.c (AVX2 branch) for the default model's Q4_1 weights, step by step, so that each step can be
shown:

1. src1's column (float32) is quantized to Q8_1 blocks, as ``quantize_row_q8_1`` does (``quants.from_float``:
   ``127/amax``, round half to even, F16C scales, ``s = d * sum(q)``);
2. per block, ``bytes_from_nibbles_32`` unpacks the weight row's 32 nibbles (low nibbles = elements 0..15, high
   nibbles = 16..31); ``_mm256_maddubs_epi16`` + ``_mm256_madd_epi16`` leave 8 int32 lanes, lane u holding the exact
   integer dot product ``P_u`` of elements 4u..4u+3;
3. per block, ``d0d1 = d_x * d_y`` (float32) and one FMA per lane: ``acc_u = fma(d0d1, P_u, acc_u)``; the mins go
   to a scalar ``summs += m_x * s_y``;
4. after the last block, ``hsum_float_8``: ((l4+l0) + (l6+l2)) + ((l5+l1) + (l7+l3)), then ``+ summs``.

The result is the same float32, bit for bit, as the MUL_MAT's output element computed by ggviz's compiled kernel
(and by llama.cpp): ``VecDotLanes.state()["matches_output"]`` compares the bits.
"""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from ...ggml import consts as C
from ...ggml import quants as Q
from ...ggml.cpu import quants as CQ
from ...ggml.cpu.libm import fma32
from ._base import VizWidget, chart_with_cursor, esc, fig_to_png, frames_book, html_table, png_img, quiet

F32 = np.float32


def _f16(h) -> np.ndarray:
    return np.asarray(h, np.float16).astype(F32)


def _bits(x) -> str:
    return f"0x{int(np.asarray(x, F32).view(np.uint32)):08x}"


def vec_dot_q4_1_q8_1_lanes(w_row: np.ndarray, y: np.ndarray) -> dict:
    """The AVX2 ``ggml_vec_dot_q4_1_q8_1`` of one Q4_1 weight row (its bytes) and one float32 column, every step
    kept: per block the weight's 4-bit levels ``qx`` (nb, 32), the column's int8 ``qy`` (nb, 32), the lanes' integer
    products ``P`` (nb, 8), ``d0d1`` (nb,), the lane accumulators after each block ``acc`` (nb, 8), ``summs`` after
    each block, the reduce tree and the result (float32)."""
    w_row = np.ascontiguousarray(np.asarray(w_row, np.uint8).reshape(-1))
    y = np.asarray(y, F32).reshape(-1)
    bx = w_row.view(Q.BLOCK_DTYPES[C.GGML_TYPE_Q4_1])
    nb = bx.shape[0]
    if y.shape[0] != nb * 32:
        raise ValueError(f"the column has {y.shape[0]} elements, the weight row {nb} blocks of 32")
    by = CQ.from_float(C.GGML_TYPE_Q8_1, y[None])[0].view(Q.BLOCK_DTYPES[C.GGML_TYPE_Q8_1])
    qs = bx["qs"].astype(np.int32)                                    # (nb, 16) bytes of nibbles
    qx = np.concatenate([qs & 15, qs >> 4], axis=1)                   # bytes_from_nibbles_32: low 16, then high 16
    qy = by["qs"].astype(np.int32)                                    # (nb, 32)
    P = (qx * qy).reshape(nb, 8, 4).sum(axis=2)                       # maddubs + madd: exact int32 per lane
    dx, mx = _f16(bx["d"]), _f16(bx["m"])
    dy, sy = _f16(by["d"]), _f16(by["s"])
    d0d1 = dx * dy                                                    # _mm256_mul_ps, float32
    acc = np.zeros((nb, 8), F32)
    summs = np.zeros(nb, F32)
    a = np.zeros(8, F32)
    s = F32(0.0)
    for b in range(nb):
        a = fma32(np.full(8, d0d1[b], F32), P[b].astype(F32), a).astype(F32)   # _mm256_fmadd_ps, one per block
        s = F32(s + F32(mx[b] * sy[b]))                                        # summs += m_x * s_y (no FMA)
        acc[b] = a
        summs[b] = s
    l = a
    pairs = [F32(l[4] + l[0]), F32(l[6] + l[2]), F32(l[5] + l[1]), F32(l[7] + l[3])]    # hi128 + lo128
    halves = [F32(pairs[0] + pairs[1]), F32(pairs[2] + pairs[3])]                     # + movehl
    hsum = F32(halves[0] + halves[1])                                                  # + movehdup
    result = F32(hsum + s)
    return {"nb": nb, "qx": qx, "qy": qy, "P": P, "dx": dx, "mx": mx, "dy": dy, "sy": sy, "d0d1": d0d1,
            "acc": acc, "summs": summs, "lanes": l.copy(), "pairs": pairs, "halves": halves, "hsum": hsum,
            "result": result, "y": y}


class VecDotLanes(VizWidget):
    """One output element of a real MUL_MAT (``capture_mul_mat``'s), as ggml's AVX2 vec_dot computes it: the Q8_1
    blocks, the 8 lanes, the FMA order over the blocks, the horizontal reduce, and the bits of the output."""

    def __init__(self, captured: dict, row: int = 0, block: int = 0, column: int = 0):
        self.cap = captured
        self.column = int(column)
        self.block = int(block)
        self.row = 0
        self.select_row(row)

    def select_row(self, row: int):
        n = self.cap["w_rows"].shape[0]
        if not 0 <= int(row) < n:
            raise ValueError(f"row {row} out of range: {self.cap['weight']} has {n} rows")
        self.row = int(row)
        self.lanes = vec_dot_q4_1_q8_1_lanes(self.cap["w_rows"][self.row], self.cap["y"][self.column])
        self.block = min(self.block, self.lanes["nb"] - 1)
        self._changed()
        return self

    def select_block(self, block: int):
        if not 0 <= int(block) < self.lanes["nb"]:
            raise ValueError(f"block {block} out of range: the row has {self.lanes['nb']} blocks")
        self.block = int(block)
        self._changed()
        return self

    def output_value(self) -> np.float32:
        return F32(self.cap["out"][self.column][self.row])

    def state(self) -> dict:
        L = self.lanes
        b = self.block
        out = self.output_value()
        return {"node": self.cap["node"], "weight": self.cap["weight"], "src1": self.cap["src1_name"],
                "row": self.row, "column": self.column, "n_blocks": L["nb"], "block": b,
                "P": L["P"][b].tolist(), "d0d1": float(L["d0d1"][b]), "acc_after_block": L["acc"][b].tolist(),
                "lanes": L["lanes"].tolist(), "pairs": [float(x) for x in L["pairs"]],
                "halves": [float(x) for x in L["halves"]], "hsum": float(L["hsum"]),
                "summs": float(L["summs"][-1]), "result": float(L["result"]), "result_bits": _bits(L["result"]),
                "output": float(out), "output_bits": _bits(out),
                "matches_output": bool(np.asarray(L["result"], F32).view(np.uint32) == np.asarray(out, F32).view(
                    np.uint32))}

    # ---- drawing ------------------------------------------------------------------------------------------------
    def figure(self, mark: bool = True):
        """Left: the lanes' integer products P_u per block (8 lanes x nb blocks); right: the lane accumulators after
        each block (the FMA order), the selected block outlined (``mark``; the book marks it over the drawing)."""
        L = self.lanes
        nb = L["nb"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw={"width_ratios": [1, 1]})
        vm = max(1, int(np.abs(L["P"]).max()))
        im = a1.imshow(L["P"].T, aspect="auto", cmap="RdBu_r", vmin=-vm, vmax=vm, interpolation="nearest")
        fig.colorbar(im, ax=a1, label="P_u (exact int32)", fraction=0.05)
        a1.set_xlabel("block (32 elements each)")
        a1.set_ylabel("lane u (elements 4u..4u+3)")
        a1.set_yticks(range(8))
        a1.set_title("maddubs + madd: 8 integer lanes per block", fontsize=10)
        if mark:
            a1.add_patch(plt.Rectangle((self.block - 0.5, -0.5), 1, 8, fill=False, edgecolor="#d50000", linewidth=2))
        for u in range(8):
            a2.plot(range(nb), L["acc"][:, u], marker=".", linewidth=1, label=f"lane {u}")
        if mark:
            a2.axvline(self.block, color="#d50000", linewidth=1)
        a2.xaxis.set_major_locator(MaxNLocator(integer=True))
        a2.set_xlabel("block (one FMA per lane per block, in order)")
        a2.set_ylabel("acc_u")
        a2.set_title("acc_u = fma(d_x·d_y, P_u, acc_u)", fontsize=10)
        a2.legend(fontsize=7, ncol=2, loc="best", frameon=False)
        for ax in (a2,):
            for s in ("top", "right"):
                ax.spines[s].set_visible(False)
        fig.suptitle(f"{self.cap['node']} = mul_mat({self.cap['weight']}, {self.cap['src1_name']}): output row "
                     f"{self.row}, column {self.column}", fontsize=11)
        fig.tight_layout()
        return fig

    def block_html(self) -> str:
        """The selected block: the 32 weight levels and the 32 Q8_1 quants, grouped in the 8 lanes of 4."""
        L = self.lanes
        b = self.block
        rows = []
        for u in range(8):
            sl = slice(4 * u, 4 * u + 4)
            rows.append({"lane": u, "elements": f"{4 * u}..{4 * u + 3}",
                         "q_x (4-bit)": " ".join(f"{v:2d}" for v in L["qx"][b, sl]),
                         "q_y (int8)": " ".join(f"{v:4d}" for v in L["qy"][b, sl]), "P_u": int(L["P"][b, u]),
                         "acc_u before": f"{(L['acc'][b - 1, u] if b else F32(0)):.6g}",
                         "acc_u after": f"{L['acc'][b, u]:.6g}"})
        head = (f"<p><b>block {b}</b> of {L['nb']}: d_x = {L['dx'][b]:.6g}, m_x = {L['mx'][b]:.6g} (Q4_1 weight); "
                f"d_y = {L['dy'][b]:.6g}, s_y = {L['sy'][b]:.6g} (Q8_1 column); d0d1 = d_x·d_y = "
                f"{L['d0d1'][b]:.6g}; summs += m_x·s_y → {L['summs'][b]:.6g}</p>")
        return head + html_table(rows)

    def reduce_html(self) -> str:
        """hsum_float_8 as a tree, then + summs, then the output element's bits."""
        st = self.state()
        ln = st["lanes"]
        p, h = st["pairs"], st["halves"]
        ok = st["matches_output"]
        cell = "style='border:1px solid #90a4ae;padding:2px 6px;font-family:monospace;text-align:center'"
        row = lambda items, span=1: "<tr>" + "".join(f"<td {cell} colspan={span}>{esc(x)}</td>"  # noqa: E731
                                                      for x in items) + "</tr>"
        tbl = ("<table style='border-collapse:collapse;margin:4px 0'>"
               + row([f"l{u} = {ln[u]:.6g}" for u in (4, 0, 6, 2, 5, 1, 7, 3)])
               + row(["l4+l0 = %.6g" % p[0], "l6+l2 = %.6g" % p[1], "l5+l1 = %.6g" % p[2], "l7+l3 = %.6g" % p[3]],
                     2)
               + row(["(l4+l0)+(l6+l2) = %.6g" % h[0], "(l5+l1)+(l7+l3) = %.6g" % h[1]], 4)
               + row([f"hsum_float_8 = {st['hsum']:.7g}"], 8)
               + row([f"+ summs ({st['summs']:.7g}) = {st['result']:.9g}  bits {st['result_bits']}"], 8)
               + "</table>")
        verdict = (f"<p>MUL_MAT output [{st['column']}, {st['row']}] = {st['output']:.9g}, bits "
                   f"{st['output_bits']}: <b>{'the same bits' if ok else 'DIFFERENT bits'}</b>.</p>")
        return "<p><b>The horizontal reduce</b> (hsum_float_8: the 128-bit halves, then movehl, then movehdup)</p>" + \
            tbl + verdict

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + self.block_html() + self.reduce_html()

    def book_rows(self) -> list:
        """The output rows a book recording holds: the current one and the first three (each row is another
        drawing)."""
        return sorted({self.row, *range(min(3, self.cap["w_rows"].shape[0]))})

    def book_view(self) -> dict:
        """Each of ``book_rows`` drawn once with no block marked, every block of it recorded: the page marks the
        block over both charts, and shows its lanes (info) and the row's reduce (detail)."""
        row, block = self.row, self.block
        rows = self.book_rows()
        charts = {}

        def frame(key):
            if self.row != int(key[0]):
                self.select_row(int(key[0]))
            b = min(int(key[1]), self.lanes["nb"] - 1)
            self.block = b
            if self.row not in charts:
                fig = self.figure(mark=False)
                a1, a2 = fig.axes[0], fig.axes[1]              # (the colorbar's axes come after the two)
                lo2, hi2 = a2.get_ylim()
                img, box = chart_with_cursor(fig, a1)
                charts[self.row] = (img, box, a1, a2, lo2, hi2)
            img, box, a1, a2, lo2, hi2 = charts[self.row]
            return {"picture": img,
                    "cursor": [box(b - 0.5, b + 0.5, -0.5, 7.5, a1), box(b - 0.1, b + 0.1, lo2, hi2, a2)],
                    "info": self.block_html(), "detail": self.reduce_html()}

        with quiet(self):
            try:
                return frames_book(
                    [{"name": "row", "label": "output row", "kind": "select", "value": row,
                      "options": [[str(r), r] for r in rows]},
                     {"name": "block", "label": "block", "kind": "range", "min": 0, "max": self.lanes["nb"] - 1,
                      "value": block}],
                    [(r, b) for r in rows for b in range(self.lanes["nb"])], frame,
                    note=f"recorded for output rows {', '.join(map(str, rows))} of {self.cap['w_rows'].shape[0]}: "
                         f"another row is another computation, which needs a kernel (run the notebook)")
            finally:
                self.select_row(row)
                self.block = block

    def _build(self):
        n = self.cap["w_rows"].shape[0]
        self._w_row = W.BoundedIntText(value=self.row, min=0, max=n - 1, description="output row",
                                       layout=W.Layout(width="200px"))
        self._w_block = W.IntSlider(value=self.block, min=0, max=self.lanes["nb"] - 1, description="block",
                                    continuous_update=False)
        self._w_row.observe(lambda ch: self.select_row(ch["new"]), "value")
        self._w_block.observe(lambda ch: self.select_block(ch["new"]), "value")
        self._w_img = W.HTML()
        self._w_block_html = W.HTML()
        self._w_reduce = W.HTML()
        return W.VBox([W.HBox([self._w_row, self._w_block]), self._w_img, self._w_block_html, self._w_reduce])

    def _refresh(self):
        self._w_row.value = self.row
        self._w_block.value = self.block
        self._w_img.value = png_img(fig_to_png(self.figure()), "max-width:100%")
        self._w_block_html.value = self.block_html()
        self._w_reduce.value = self.reduce_html()
