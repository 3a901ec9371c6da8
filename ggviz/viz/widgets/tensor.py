"""Tensors as bytes: element index -> byte offset (with views sharing their source's bytes), and quantized blocks.

- ``TensorExplorer(t, views=[...])``: ``ne``/``nb``, the byte offset of element (i0, i1, i2, i3)
  (``i0*nb0 + i1*nb1 + i2*nb2 + i3*nb3``), and for a view/permute/transpose the bytes of its *source* that it
  reads: a view owns no data, it is another walk over the same bytes.
- ``QuantBlockExplorer(t)``: one block of a quantized tensor of the model: its bytes, the fields they hold (scales,
  mins, packed quants, per ggml-common.h) and the values they decode to (``dequantize_row_*``). Types the file does
  not contain (the default model is Q4_1/Q8_0) are shown on the same real weights, re-quantized with ggml's
  reference quantizer (``quantize_row_*_ref``), and the state says so.
"""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ...ggml import consts as C
from ...ggml import memory, quants
from ...ggml.tensor import Tensor, blck_size, get_data, get_data_f32, is_contiguous, nbytes, type_name, type_size
from ..gguf_map import block_fields
from ..tensor import element_offset, strides_table
from ._base import VizWidget, esc, fig_to_png, frames_book, html_table, png_img, quiet

EXPLORER_TYPES = [C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q4_1, C.GGML_TYPE_Q8_0, C.GGML_TYPE_Q4_K, C.GGML_TYPE_Q6_K]
FIELD_COLORS = {"d": "#ffcc80", "m": "#ffab91", "dmin": "#ffab91", "scales": "#ce93d8", "qs": "#a5d6a7",
                "qh": "#90caf9", "ql": "#c5e1a5", "s": "#ffab91", "hmask": "#90caf9", "bsums": "#b0bec5",
                "value": "#e0e0e0", "bits": "#e0e0e0"}


def view_byte_offsets(t: Tensor) -> np.ndarray:
    """Byte offsets, from the start of the *source's* data, of every element of ``t`` (shape ne3, ne2, ne1, ne0).

    For a tensor that is not a view the source is itself (offsets from ``t->data``). Element types only.
    """
    if blck_size(t.type) != 1:
        raise ValueError("view_byte_offsets: element types only (a quantized view addresses whole blocks)")
    ne, nb = t.shape, t.strides
    idx = np.ix_(*(np.arange(n, dtype=np.int64) for n in ne[::-1]))
    off = sum(i * s for i, s in zip(idx, nb[::-1]))
    base = t.view_offs if t.view_src is not None else 0
    return np.broadcast_to(off + base, ne[::-1])


class TensorExplorer(VizWidget):
    """Element index -> byte offset for a tensor and its views; the source bytes a view touches.

    ``t``: the tensor shown first; ``views``: more tensors (views of the same source) offered in the widget.
    """

    def __init__(self, t: Tensor, views=(), max_cells: int = 24):
        self.tensors = [t] + [v for v in views if v is not t]
        src = t.view_src if t.view_src is not None else t
        if src not in self.tensors:
            self.tensors.insert(0, src)
        self.cur = self.tensors.index(t)
        self.index = [0, 0, 0, 0]
        self.max_cells = max_cells

    @property
    def t(self) -> Tensor:
        return self.tensors[self.cur]

    @property
    def source(self) -> Tensor:
        t = self.t
        return t.view_src if t.view_src is not None else t

    def show(self, which):
        """Switch to another of the tensors (index, name or Tensor); the index is clipped to its shape."""
        if isinstance(which, Tensor):
            which = self.tensors.index(which)
        elif isinstance(which, str):
            which = [x.name for x in self.tensors].index(which)
        self.cur = int(which)
        self.index = [min(i, n - 1) for i, n in zip(self.index, self.t.shape)]
        self._changed()
        return self

    def select(self, i0: int = 0, i1: int = 0, i2: int = 0, i3: int = 0):
        """Point at element (i0, i1, i2, i3) of the current tensor."""
        idx = [int(i0), int(i1), int(i2), int(i3)]
        for d, (i, n) in enumerate(zip(idx, self.t.shape)):
            if not 0 <= i < n:
                raise IndexError(f"i{d}={i} out of range for ne[{d}]={n}")
        self.index = idx
        self._changed()
        return self

    def touched(self) -> np.ndarray:
        """Boolean mask over the source's bytes: those the current tensor's elements cover."""
        src, t = self.source, self.t
        mask = np.zeros(nbytes(src), dtype=bool)
        if blck_size(t.type) == 1:
            off = view_byte_offsets(t).reshape(-1)
            ts = type_size(t.type)
            for k in range(ts):
                mask[off + k] = True
        else:
            base = t.view_offs if t.view_src is not None else 0
            mask[base:base + nbytes(t)] = True
        return mask

    def state(self) -> dict:
        t, src = self.t, self.source
        i0, i1, i2, i3 = self.index
        off = element_offset(t, i0, i1, i2, i3)
        base = t.view_offs if t.view_src is not None else 0
        st = {"name": t.name, "type": type_name(t.type), "ne": list(t.shape), "nb": list(t.strides),
              "strides": [dict(r) for r in strides_table(t)], "is_view": t.view_src is not None,
              "contiguous": is_contiguous(t), "source": src.name, "view_offs": t.view_offs,
              "index": list(self.index), "offset": off, "source_offset": base + off,
              "formula": f"{i0}*{t.nb[0]} + {i1}*{t.nb[1]} + {i2}*{t.nb[2]} + {i3}*{t.nb[3]} = {off}",
              "value": None, "n_touched_bytes": int(self.touched().sum()), "source_nbytes": nbytes(src)}
        if t.data and blck_size(t.type) == 1:
            st["value"] = float(get_data_f32(t)[i3, i2, i1, i0])
            # the bytes at that offset of the source's data (what the kernel's pointer arithmetic reads)
            arr, off, _ = memory.resolve(src.data + st["source_offset"], type_size(t.type))
            st["bytes"] = bytes(arr[off:off + type_size(t.type)]).hex(" ")
        return st

    def figure(self):
        """Left: the tensor's elements by index (i1 rows x i0 columns, the current one red); right: the source's
        data in memory order (one cell per element, one row per nb[1]), the cells this tensor reads shaded."""

        t, src = self.t, self.source
        st = self.state()
        i0, i1, i2, i3 = self.index
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1, 1.25]})
        mc = self.max_cells
        # ---- left: logical view, slice (i2, i3)
        n0, n1 = min(t.shape[0], mc), min(t.shape[1], mc)
        vals = get_data_f32(t)[i3, i2, :n1, :n0] if t.data and blck_size(t.type) == 1 else np.zeros((n1, n0))
        ax1.imshow(vals, cmap="Blues", aspect="auto", alpha=0.55, extent=(-0.5, n0 - 0.5, n1 - 0.5, -0.5))
        if n0 * n1 <= 144:
            for a in range(n1):
                for b in range(n0):
                    ax1.text(b, a, f"{vals[a, b]:.3g}", ha="center", va="center", fontsize=8)
        if i0 < n0 and i1 < n1:
            ax1.add_patch(Rectangle((i0 - 0.5, i1 - 0.5), 1, 1, fill=False, edgecolor="#d50000", linewidth=3))
        ax1.set_xlabel("i0 (ne[0] = %d)" % t.shape[0], fontsize=10)
        ax1.set_ylabel("i1 (ne[1] = %d)" % t.shape[1], fontsize=10)
        ax1.set_title(f"{t.name!r} {type_name(t.type)} ne={list(t.shape)} nb={list(t.strides)}\n"
                      f"slice i2={i2}, i3={i3}; element {tuple(self.index)} at byte {st['offset']} "
                      f"from t->data", fontsize=10)
        ax1.set_xticks(range(n0))
        ax1.set_yticks(range(n1))
        ax1.tick_params(labelsize=7)
        # ---- right: the source's bytes, element cells in memory order
        ts = type_size(src.type)
        per_row = src.shape[0] if blck_size(src.type) == 1 else max(1, src.strides[1] // ts)
        n_cells = nbytes(src) // ts
        rows = -(-n_cells // per_row)
        shown_rows = min(rows, mc)
        shown_cols = min(per_row, 2 * mc)
        mask = self.touched().reshape(-1)[:n_cells * ts].reshape(n_cells, ts).any(axis=1)
        grid = np.zeros((shown_rows, shown_cols))
        for r in range(shown_rows):
            seg = mask[r * per_row:r * per_row + shown_cols]
            grid[r, :len(seg)] = seg
        ax2.imshow(grid, cmap="Greens", vmin=0, vmax=1.6, aspect="auto",
                   extent=(-0.5, shown_cols - 0.5, shown_rows - 0.5, -0.5))
        for k in range(shown_cols + 1):
            ax2.axvline(k - 0.5, color="white", linewidth=1.0)
        for k in range(shown_rows + 1):
            ax2.axhline(k - 0.5, color="white", linewidth=1.0)
        if shown_rows * shown_cols <= 200 and src.data and blck_size(src.type) == 1 and is_contiguous(src):
            flat = get_data_f32(src).reshape(-1)
            for r in range(shown_rows):
                for c in range(shown_cols):
                    k = r * per_row + c
                    if k < flat.size:
                        ax2.text(c, r, f"{flat[k]:.3g}\n@{k * ts}", ha="center", va="center", fontsize=7.5)
        cell = st["source_offset"] // ts
        cr, cc = divmod(cell, per_row)
        if cr < shown_rows and cc < shown_cols:
            ax2.add_patch(Rectangle((cc - 0.5, cr - 0.5), 1, 1, fill=False, edgecolor="#d50000", linewidth=3))
        ax2.set_yticks(range(shown_rows))
        ax2.set_yticklabels([f"+{r * per_row * ts}" for r in range(shown_rows)], fontsize=7)
        ax2.set_xticks(range(0, shown_cols, max(1, shown_cols // 16)))
        ax2.tick_params(axis="x", labelsize=7)
        ax2.set_xlabel(f"element within a row of the source ({per_row} × {ts} bytes per row)", fontsize=10)
        ax2.set_ylabel("byte offset of the row in the source's data", fontsize=9)
        what = ("its own bytes" if t.view_src is None else
                f"view of {src.name!r} at view_offs={t.view_offs}: it reads the shaded bytes")
        ax2.set_title(f"memory of {src.name!r} ({nbytes(src)} bytes): {what}\n"
                      f"{st['n_touched_bytes']} bytes touched; red = element {tuple(self.index)} at source byte "
                      f"{st['source_offset']}", fontsize=10)
        fig.tight_layout()
        return fig

    def info_html(self) -> str:
        st = self.state()
        rows = [{"field": "offset", "value": st["formula"]},
                {"field": "source byte", "value": f"view_offs {st['view_offs']} + {st['offset']} = "
                                                  f"{st['source_offset']}" if st["is_view"] else st["offset"]},
                {"field": "bytes there", "value": st.get("bytes")}, {"field": "value", "value": st["value"]}]
        return html_table(strides_table(self.t)) + html_table(rows)

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + self.info_html()

    # ---- the static book: the same two pictures as HTML grids (ms a frame, no matplotlib), every index recorded
    BOOK_MAX_FRAMES = 600

    def grids_html(self) -> str:
        """``figure``'s two panels as HTML tables (the book's frames): the tensor's elements by index, the current
        one outlined red; the source's data in memory order, the bytes this tensor reads shaded green."""
        t, src = self.t, self.source
        st = self.state()
        i0, i1, i2, i3 = self.index
        mc = self.max_cells
        td = ("<td style='border:1px solid #fff;padding:1px 4px;text-align:center;font:11px monospace;"
              "background:{bg};{ol}'>{v}</td>")
        red = "outline:3px solid #d50000;outline-offset:-3px"
        n0, n1 = min(t.shape[0], mc), min(t.shape[1], mc)
        has = t.data and blck_size(t.type) == 1
        vals = get_data_f32(t)[i3, i2, :n1, :n0] if has else np.zeros((n1, n0))
        th = "<th style='font:10px sans-serif;color:#546e7a;padding:0 3px'>{}</th>"
        left = ["<table style='border-collapse:collapse'><tr><th></th>"
                + "".join(th.format(f"i0={b}") for b in range(n0)) + "</tr>"]
        for a in range(n1):
            left.append("<tr>" + th.format(f"i1={a}") + "".join(
                td.format(bg="#d6e6f5", ol=red if (a, b) == (i1, i0) else "", v=f"{vals[a, b]:.3g}" if has else "")
                for b in range(n0)) + "</tr>")
        left.append("</table>")
        ts = type_size(src.type)
        per_row = src.shape[0] if blck_size(src.type) == 1 else max(1, src.strides[1] // ts)
        n_cells = nbytes(src) // ts
        rows = -(-n_cells // per_row)
        shown_rows, shown_cols = min(rows, mc), min(per_row, 2 * mc)
        mask = self._touched_cells()
        flat = (get_data_f32(src).reshape(-1) if src.data and blck_size(src.type) == 1 and is_contiguous(src)
                else None)
        cell = st["source_offset"] // ts
        right = ["<table style='border-collapse:collapse'>"]
        for r in range(shown_rows):
            cells = []
            for c in range(shown_cols):
                k = r * per_row + c
                if k >= n_cells:
                    cells.append("<td></td>")
                    continue
                v = (f"{flat[k]:.3g}<br/><span style='font-size:9px;color:#546e7a'>@{k * ts}</span>"
                     if flat is not None and k < flat.size else "")
                cells.append(td.format(bg="#81c784" if mask[k] else "#eceff1", ol=red if k == cell else "", v=v))
            right.append("<tr>" + th.format(f"+{r * per_row * ts}") + "".join(cells) + "</tr>")
        right.append("</table>")
        what = ("its own bytes" if t.view_src is None else
                f"view of {src.name!r} at view_offs={t.view_offs}: it reads the shaded bytes")
        cap = "<div style='font:12px sans-serif;margin:2px 0 4px 0;max-width:{}px'>{}</div>"
        return ("<div style='display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap'><div>"
                + cap.format(420, esc(f"{t.name!r} {type_name(t.type)} ne={list(t.shape)} nb={list(t.strides)}; "
                                      f"slice i2={i2}, i3={i3}; element {tuple(self.index)} at byte "
                                      f"{st['offset']} from t->data"))
                + "".join(left) + "</div><div>"
                + cap.format(560, esc(f"memory of {src.name!r} ({nbytes(src)} bytes): {what}; "
                                      f"{st['n_touched_bytes']} bytes touched; red = element {tuple(self.index)} at "
                                      f"source byte {st['source_offset']}; one row per {per_row} × {ts} bytes"))
                + "".join(right) + "</div></div>")

    def _touched_cells(self):
        src = self.source
        ts = type_size(src.type)
        n_cells = nbytes(src) // ts
        return self.touched().reshape(-1)[:n_cells * ts].reshape(n_cells, ts).any(axis=1)

    def book_view(self) -> dict:
        """Every index of every tensor of the explorer recorded (the grids and the offset table: HTML), stepped by a
        tensor list and one slider per dimension in the page."""
        dims = [d for d in range(4) if any(x.shape[d] > 1 for x in self.tensors)] or [0]
        keys = []
        for k, x in enumerate(self.tensors):
            for idx in np.ndindex(*[x.shape[d] for d in dims]):
                keys.append((k, *idx))
        keys = keys[:self.BOOK_MAX_FRAMES]
        cur, index = self.cur, list(self.index)

        def frame(key):
            self.cur = key[0]
            ix = [0, 0, 0, 0]
            for d, i in zip(dims, key[1:]):
                ix[d] = int(i)
            self.index = ix
            return {"picture": self.grids_html(), "info": self.info_html()}

        try:
            with quiet(self):
                rec = frames_book(
                    [{"name": "tensor", "label": "tensor", "kind": "select", "value": cur,
                      "options": [[f"{x.name or '(unnamed)'} ne={list(x.shape)}", k]
                                  for k, x in enumerate(self.tensors)]}]
                    + [{"name": f"i{d}", "label": f"i{d}", "kind": "range", "min": 0, "value": index[d], "dep": "tensor",
                        "max": {str(k): max(0, x.shape[d] - 1) for k, x in enumerate(self.tensors)}} for d in dims],
                    keys, frame,
                    note="" if len(keys) < self.BOOK_MAX_FRAMES else
                    f"the book recorded the first {self.BOOK_MAX_FRAMES} indices; run the notebook for the others")
        finally:
            self.cur, self.index = cur, index
        return rec

    def _build(self):

        self._w_pick = W.Dropdown(options=[(f"{x.name or '(unnamed)'} ne={list(x.shape)}", k)
                                           for k, x in enumerate(self.tensors)], value=self.cur,
                                  description="tensor", layout=W.Layout(width="460px"))
        self._w_pick.observe(lambda ch: self.show(ch["new"]), "value")
        self._w_idx = [W.IntSlider(min=0, max=max(0, n - 1), description=f"i{d}", continuous_update=False)
                       for d, n in enumerate(self.t.shape)]
        for s in self._w_idx:
            s.observe(lambda ch: self._from_sliders(), "value")
        self._w_img = W.HTML()
        self._w_info = W.HTML()
        return W.VBox([self._w_pick, W.HBox(self._w_idx[:2]), W.HBox(self._w_idx[2:]), self._w_img, self._w_info])

    def _from_sliders(self):
        if getattr(self, "_syncing", False):
            return
        self.select(*[s.value for s in self._w_idx])

    def _refresh(self):
        self._syncing = True
        try:
            for s, n, i in zip(self._w_idx, self.t.shape, self.index):
                s.max = max(0, n - 1)
                s.value = i
        finally:
            self._syncing = False
        self._w_img.value = png_img(fig_to_png(self.figure()), "max-width:100%")
        self._w_info.value = self.info_html()


# ------------------------------------------------------------------------------------------------------------------

class QuantBlockExplorer(VizWidget):
    """One quantized block of a real tensor: bytes -> fields (scales, mins, quants) -> values.

    ``t``: a tensor with data (e.g. ``model.tensors["blk.0.attn_q.weight"]``); ``type``: the block format to show
    (default: the tensor's own). If it differs from the tensor's type, the tensor's row is dequantized and
    re-quantized to it with ggml's reference quantizer (``requantized`` in the state).
    """

    def __init__(self, t: Tensor, type: int | None = None, row: int = 0, block: int = 0):
        self.t = t
        self.type = int(t.type if type is None else type)
        self._check(self.type)
        self.row = 0
        self.block = 0
        self._row_cache: dict = {}
        self.select(row, block)

    def _check(self, type_):
        if type_ not in EXPLORER_TYPES and type_ not in quants.BLOCK_DTYPES:
            raise ValueError(f"type {type_name(type_)} has no block format in ggviz.ggml.quants")
        ne0 = int(self.t.ne[0])
        if ne0 % blck_size(type_):
            raise ValueError(f"{self.t.name!r} has rows of {ne0} values, not a multiple of the {type_name(type_)} "
                             f"block size {blck_size(type_)} (llama-quantize falls back to another type for such "
                             f"tensors); pick a tensor with longer rows, e.g. ffn_down (1536)")

    def compatible_types(self) -> list:
        """The explorer's formats whose block size divides this tensor's rows."""
        return [x for x in EXPLORER_TYPES if int(self.t.ne[0]) % blck_size(x) == 0]

    @property
    def n_rows(self) -> int:
        return int(self.t.ne[1] * self.t.ne[2] * self.t.ne[3])

    @property
    def blocks_per_row(self) -> int:
        return int(self.t.ne[0]) // blck_size(self.type)

    @property
    def requantized(self) -> bool:
        return self.type != self.t.type

    def _row_floats(self, row: int) -> np.ndarray:
        """Row ``row`` of the tensor as float32 (dequantized from its own bytes)."""
        raw = get_data(self.t)
        r = raw.reshape(-1, raw.shape[-1])[row]
        return quants.dequantize_row(self.t.type, np.ascontiguousarray(r)) if self.t.type in quants.BLOCK_DTYPES \
            else np.asarray(r, dtype=np.float32)

    def _row_bytes(self, row: int) -> np.ndarray:
        key = (self.type, row)
        if key not in self._row_cache:
            if not self.requantized:
                raw = get_data(self.t)
                self._row_cache[key] = np.ascontiguousarray(raw.reshape(-1, raw.shape[-1])[row])
            else:
                self._row_cache[key] = quants.quantize_row_ref(self.type, self._row_floats(row)).reshape(-1)
        return self._row_cache[key]

    def set_type(self, type_: int):
        self._check(int(type_))
        self.type = int(type_)
        self.block = min(self.block, self.blocks_per_row - 1)
        self._changed()
        return self

    def select(self, row: int = 0, block: int = 0):
        row, block = int(row), int(block)
        if not 0 <= row < self.n_rows:
            raise IndexError(f"row {row} out of range ({self.n_rows} rows)")
        if not 0 <= block < self.blocks_per_row:
            raise IndexError(f"block {block} out of range ({self.blocks_per_row} blocks per row)")
        self.row, self.block = row, block
        self._changed()
        return self

    def block_bytes(self) -> np.ndarray:
        ts = type_size(self.type)
        return self._row_bytes(self.row)[self.block * ts:(self.block + 1) * ts]

    def state(self) -> dict:
        raw = self.block_bytes()
        dec = quants.decode_block(self.type, raw)
        bs = blck_size(self.type)
        orig = self._row_floats(self.row)[self.block * bs:(self.block + 1) * bs]
        fields = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in dec.items()
                  if k not in ("values", "quants", "sub_scales", "sub_mins", "sub_d", "sub_m", "type", "block_size",
                               "type_size")}
        st = {"tensor": self.t.name, "tensor_type": type_name(self.t.type), "type": type_name(self.type),
              "requantized": self.requantized, "row": self.row, "block": self.block,
              "blocks_per_row": self.blocks_per_row, "block_size": bs, "type_size": type_size(self.type),
              "first_element": self.block * bs, "row_byte_offset": self.block * type_size(self.type),
              "bytes": raw.tolist(), "fields": fields, "field_layout": block_fields(self.type),
              "quants": np.asarray(dec.get("quants", [])).tolist(), "values": np.asarray(dec["values"]).tolist(),
              "source_values": orig.tolist(),
              "source": (f"bytes of {self.t.name!r} in the file ({type_name(self.t.type)})" if not self.requantized
                         else f"{self.t.name!r} row {self.row} dequantized from {type_name(self.t.type)}, "
                              f"re-quantized to {type_name(self.type)} with quantize_row_{type_name(self.type)}_ref")}
        for k in ("sub_scales", "sub_mins", "sub_d", "sub_m"):
            if k in dec:
                st[k] = np.asarray(dec[k]).tolist()
        return st

    def figure(self):
        """Top: the block's bytes coloured by struct field; middle: scales/mins (K-quants: per sub-block);
        bottom: the decoded values (bars) with the quant levels, and the source values (dots)."""

        st = self.state()
        raw = np.asarray(st["bytes"], dtype=np.uint8)
        lay = st["field_layout"]
        n = raw.size
        cols = n if n <= 40 else 36
        rows = -(-n // cols)
        kq = "sub_d" in st
        fig = plt.figure(figsize=(14, 3.2 + 0.42 * rows + (2.2 if kq else 0)))
        hr = [0.55 * rows + 0.4] + ([1.6] if kq else []) + [2.6]
        axs = fig.subplots(len(hr), 1, gridspec_kw={"height_ratios": hr})
        ax_b, ax_v = axs[0], axs[-1]
        owner = np.empty(n, dtype=object)
        for f, o, s, _c in lay:
            owner[o:o + s] = f
        for k in range(n):
            r, c = divmod(k, cols)
            ax_b.add_patch(Rectangle((c, rows - 1 - r), 1, 1, facecolor=FIELD_COLORS.get(owner[k], "#eeeeee"),
                                     edgecolor="#616161", linewidth=0.4))
            ax_b.text(c + 0.5, rows - 1 - r + 0.5, f"{raw[k]:02x}", ha="center", va="center", fontsize=7.5,
                      family="monospace")
        ax_b.set_xlim(0, cols)
        ax_b.set_ylim(0, rows)
        ax_b.set_axis_off()
        ax_b.legend(handles=[Patch(facecolor=FIELD_COLORS.get(f, "#eee"), edgecolor="#616161",
                                   label=f"{f}: {c}, bytes {o}..{o + s - 1}") for f, o, s, c in lay],
                    loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8.5, frameon=False)
        fld = st["fields"]
        summary = ", ".join(f"{k} = {v:.6g}" for k, v in fld.items() if isinstance(v, float))
        ax_b.set_title(f"{st['type']} block {st['block']} of row {st['row']} of {st['tensor']!r}: {n} bytes for "
                       f"{st['block_size']} values = {8 * n / st['block_size']:.2f} bits/value;  {summary}\n"
                       f"source: {st['source']}", fontsize=10, loc="left")
        if kq:
            ax_s = axs[1]
            nsub = len(st["sub_d"])
            x = np.arange(nsub)
            ax_s.bar(x - 0.2, st["sub_d"], width=0.4, color="#ce93d8", edgecolor="#424242", label="scale d·sc")
            if "sub_m" in st:
                ax_s.bar(x + 0.2, st["sub_m"], width=0.4, color="#ffab91", edgecolor="#424242", label="min dmin·m")
            for i in x:
                lab = f"{st['sub_scales'][i]}" + (f"/{st['sub_mins'][i]}" if "sub_mins" in st else "")
                ax_s.text(i, max(st["sub_d"][i], st["sub_m"][i] if "sub_m" in st else 0), lab, ha="center",
                          va="bottom", fontsize=7.5)
            ax_s.set_xticks(x)
            ax_s.tick_params(labelsize=8)
            ax_s.set_xlabel(f"sub-block ({st['block_size'] // nsub} values each); labels: integer scale"
                            + ("/min" if "sub_mins" in st else ""), fontsize=9)
            ax_s.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
            ax_s.axhline(0, color="k", linewidth=0.5)
        vals = np.asarray(st["values"])
        q = np.asarray(st["quants"])
        idx = np.arange(vals.size)
        ax_v.bar(idx, vals, color="#a5d6a7", edgecolor="#424242", linewidth=0.3 if vals.size > 64 else 0.6,
                 label="decoded value")
        ax_v.plot(idx, st["source_values"], "o", color="#d32f2f", markersize=2.5 if vals.size > 64 else 4,
                  label="source value (" + ("before re-quantization" if st["requantized"] else "= decoded") + ")")
        if vals.size <= 64:
            for i in idx:
                ax_v.text(i, vals[i], f"{int(q[i])}", ha="center", va="bottom" if vals[i] >= 0 else "top",
                          fontsize=7)
        else:
            sub = st["block_size"] // len(st["sub_d"]) if kq else 32
            for b in range(sub, vals.size, sub):
                ax_v.axvline(b - 0.5, color="#9e9e9e", linewidth=0.6)
        ax_v.axhline(0, color="k", linewidth=0.5)
        ax_v.set_xlim(-0.8, vals.size - 0.2)
        ax_v.set_xlabel("element of the block" + (" (labels: quant level)" if vals.size <= 64 else
                                                  " (grey lines: sub-blocks)"), fontsize=9)
        ax_v.tick_params(labelsize=8)
        err = np.abs(vals - np.asarray(st["source_values"]))
        ax_v.set_title(f"values: max |decoded − source| = {err.max():.3g}", fontsize=10, loc="left")
        ax_v.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
        fig.tight_layout()
        return fig

    # ---- the static book: ``figure`` as HTML + a small SVG (no matplotlib: ms a frame), every block recorded
    BOOK_MAX_FRAMES = 400

    def block_html(self) -> str:
        """``figure``'s panels for the book: the block's bytes coloured by field (with the legend), the K-quants'
        sub-block scales, and the decoded values (bars, quant level on each) against the source values (red dots)."""
        st = self.state()
        raw = st["bytes"]
        n = len(raw)
        owner = [""] * n
        for f, o, sz, _c in st["field_layout"]:
            owner[o:o + sz] = [f] * sz
        cols = n if n <= 40 else 36
        cells = "".join(
            ("<tr>" if k % cols == 0 else "")
            + f"<td style='border:1px solid #616161;padding:1px 3px;font:11px monospace;"
              f"background:{FIELD_COLORS.get(owner[k], '#eeeeee')}' title='byte {k}: {esc(owner[k])}'>{raw[k]:02x}</td>"
            + ("</tr>" if k % cols == cols - 1 or k == n - 1 else "") for k in range(n))
        legend = "".join(f"<div><span style='display:inline-block;width:12px;height:10px;border:1px solid #616161;"
                         f"background:{FIELD_COLORS.get(f, '#eee')}'></span> {esc(f)}: {esc(c)}, bytes {o}..{o + sz - 1}"
                         f"</div>" for f, o, sz, c in st["field_layout"])
        summary = ", ".join(f"{k} = {v:.6g}" for k, v in st["fields"].items() if isinstance(v, float))
        head = (f"<div style='font:12px sans-serif;margin:2px 0'><b>{esc(st['type'])} block {st['block']} of row "
                f"{st['row']} of {esc(repr(st['tensor']))}</b>: {n} bytes for {st['block_size']} values = "
                f"{8 * n / st['block_size']:.2f} bits/value; {esc(summary)}<br/>source: {esc(st['source'])}</div>")
        sub = ""
        if "sub_d" in st:
            rows = [{"sub-block": i, "integer scale": st["sub_scales"][i], "scale d·sc": st["sub_d"][i]}
                    | ({"integer min": st["sub_mins"][i], "min dmin·m": st["sub_m"][i]} if "sub_m" in st else {})
                    for i in range(len(st["sub_d"]))]
            sub = html_table(rows, title=f"sub-blocks ({st['block_size'] // len(st['sub_d'])} values each)")
        return (head + "<div style='display:flex;gap:16px;align-items:flex-start;font:11px sans-serif'>"
                f"<table style='border-collapse:collapse'>{cells}</table><div>{legend}</div></div>" + sub
                + values_svg(st["values"], st["source_values"], st["quants"], st["requantized"]))

    def book_view(self) -> dict:
        """Every block of every row in every format the explorer offers (up to ``BOOK_MAX_FRAMES``), recorded as
        HTML; a format list, a row slider and a block slider in the page."""
        types = self.compatible_types()
        if self.type not in types:
            types.insert(0, self.type)
        keys = [(ty, r, b) for ty in types for r in range(self.n_rows)
                for b in range(int(self.t.ne[0]) // blck_size(ty))]
        full = len(keys) <= self.BOOK_MAX_FRAMES
        if not full:            # the current format whole (as far as it goes), then the others' current row
            keys = ([k for k in keys if k[0] == self.type][:self.BOOK_MAX_FRAMES]
                    + [k for k in keys if k[0] != self.type and k[1] == self.row])
        saved = self.type, self.row, self.block

        def frame(key):
            self.type, self.row, self.block = key
            return {"picture": self.block_html(), "info": html_table(
                [{"field": k, "value": v} for k, v in self.state()["fields"].items()], title="fields")}

        try:
            with quiet(self):
                rec = frames_book(
                    [{"name": "type", "label": "format", "kind": "select", "value": self.type,
                      "options": [[type_name(x), x] for x in types]},
                     {"name": "row", "label": "row", "kind": "range", "min": 0, "max": self.n_rows - 1,
                      "value": self.row},
                     {"name": "block", "label": "block", "kind": "range", "min": 0, "value": self.block, "dep": "type",
                      "max": {str(x): int(self.t.ne[0]) // blck_size(x) - 1 for x in types}}],
                    keys, frame, note="" if full else
                    f"the book recorded {len(keys)} of the blocks (this format's first ones; the other formats at "
                    f"row {self.row}); run the notebook for the others")
        finally:
            self.type, self.row, self.block = saved
        return rec

    def to_html(self) -> str:
        st = self.state()
        return png_img(fig_to_png(self.figure()), "max-width:100%") + html_table(
            [{"field": k, "value": v} for k, v in st["fields"].items()], title="fields")

    def _build(self):

        opts = [(type_name(x), x) for x in self.compatible_types()]
        if self.type not in EXPLORER_TYPES:
            opts.insert(0, (type_name(self.type), self.type))
        self._w_type = W.Dropdown(options=opts, value=self.type, description="format")
        self._w_type.observe(lambda ch: self.set_type(ch["new"]), "value")
        self._w_row = W.BoundedIntText(value=self.row, min=0, max=self.n_rows - 1, description="row")
        self._w_blk = W.IntSlider(value=self.block, min=0, max=self.blocks_per_row - 1, description="block",
                                  continuous_update=False)
        self._w_row.observe(lambda ch: self.select(ch["new"], self.block), "value")
        self._w_blk.observe(lambda ch: self.select(self.row, ch["new"]), "value")
        self._w_img = W.HTML()
        return W.VBox([W.HBox([self._w_type, self._w_row, self._w_blk]), self._w_img])

    def _refresh(self):
        self._w_blk.max = self.blocks_per_row - 1
        if self._w_blk.value != self.block:
            self._w_blk.value = self.block
        if self._w_row.value != self.row:
            self._w_row.value = self.row
        self._w_img.value = png_img(fig_to_png(self.figure()), "max-width:100%")


def values_svg(values, source, quants_, requantized: bool, width: int = 760, height: int = 190) -> str:
    """The decoded values of a block as bars (labelled with their quant level when there are 64 or fewer) and the
    source values as red dots: ``QuantBlockExplorer.figure``'s bottom panel, drawn as SVG text (the book's frames)."""
    v = np.asarray(values, dtype=np.float64)
    src = np.asarray(source, dtype=np.float64)
    n = v.size
    m = float(max(np.abs(v).max(), np.abs(src).max())) or 1.0
    top, bot, left = 30, 16, 46
    h = height - top - bot
    y = lambda x: top + h / 2 - x / m * (h / 2 - 8)          # noqa: E731
    bw = (width - left - 10) / n
    err = float(np.abs(v - src).max())
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           f"style='font:10px sans-serif;display:block'>",
           f"<text x='{left}' y='12'>values: max |decoded − source| = {err:.3g}; bars: decoded value, red dots: "
           f"source value ({'before re-quantization' if requantized else '= decoded'})"
           + ("; labels: quant level" if n <= 64 else "") + "</text>",
           f"<line x1='{left}' x2='{width - 10}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#000' stroke-width='0.6'/>"]
    for t in (-m, 0.0, m):
        out.append(f"<text x='{left - 4}' y='{y(t) + 3:.1f}' text-anchor='end'>{t:.3g}</text>")
    for i in range(n):
        x0, y0 = left + i * bw, y(v[i])
        out.append(f"<rect x='{x0 + 0.1 * bw:.1f}' y='{min(y0, y(0)):.1f}' width='{0.8 * bw:.1f}' "
                   f"height='{abs(y0 - y(0)):.1f}' fill='#a5d6a7' stroke='#424242' stroke-width='0.4'/>"
                   f"<circle cx='{x0 + bw / 2:.1f}' cy='{y(src[i]):.1f}' r='{2.5 if n > 64 else 3}' fill='#d32f2f'/>")
        if n <= 64 and len(quants_) == n:
            ty = y0 - 3 if v[i] >= 0 else y0 + 11
            out.append(f"<text x='{x0 + bw / 2:.1f}' y='{ty:.1f}' text-anchor='middle' font-size='9'>"
                       f"{int(quants_[i])}</text>")
    out.append(f"<text x='{left}' y='{height - 3}'>element of the block (0 … {n - 1})</text></svg>")
    return "".join(out)
