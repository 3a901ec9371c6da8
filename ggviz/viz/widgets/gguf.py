"""GGUFMapWidget: a GGUF file as a clickable byte map; a selected tensor shows its info record, data and blocks."""
from __future__ import annotations

import struct

import ipywidgets as W
import numpy as np

from ...ggml import consts as C
from ...ggml import quants
from ...ggml.gguf import GGUFFile, load_gguf
from .. import gguf_map as M
from ..arena import hexdump
from ._base import VizWidget, esc, fig_to_svg, frames_book, html_table, new_prefix, on_click, pre, quiet, svg_canvas


def _short(v, n: int = 8):
    if isinstance(v, (list, tuple, np.ndarray)):
        v = list(v)
        head = ", ".join(repr(x) for x in v[:n])
        return f"[{head}{', …' if len(v) > n else ''}] ({len(v)} items)"
    s = repr(v)
    return s if len(s) <= 200 else s[:199] + "…"


class GGUFMapWidget(VizWidget):
    """A GGUF file (path or ``GGUFFile``) as a byte map. ``select(name)`` / a click picks a tensor (or a KV pair,
    the header); ``state()["selected"]`` is what the info panel shows."""

    def __init__(self, gguf, selected: str | None = None):

        self.gf = gguf if isinstance(gguf, GGUFFile) else load_gguf(gguf)
        self.layout = self.gf.layout()
        self.prefix = new_prefix("gguf")
        self.selected: dict | None = None
        self._svg_cache: dict = {}
        if selected is not None:
            self.select(selected)

    # ---------------------------------------------------------------- selection
    def select(self, name: str):
        """Select a tensor by name, a KV pair by ``"kv:<key>"``, or ``"header"``."""
        if name == "header":
            return self.select_range(0)
        for i, r in enumerate(self.layout):
            if (name.startswith("kv:") and r["kind"] == "kv" and r["key"] == name[3:]) or \
                    (r["kind"] == "tensor_info" and r["name"] == name):
                return self.select_range(i)
        raise KeyError(f"{self.gf.path}: no tensor or KV {name!r}")

    def select_range(self, i: int):
        """Select layout range ``i`` (what a click on it does)."""
        r = self.layout[int(i)]
        k = r["kind"]
        if k in ("tensor_info", "tensor_data"):
            self.selected = self._tensor(r["name"])
        elif k == "kv":
            self.selected = self._kv(r["key"])
        elif k == "header":
            self.selected = self._header()
        else:
            self.selected = {"kind": k, "start": r["start"], "end": r["end"], "label": r["label"],
                             "size": r["end"] - r["start"]}
        self._changed()
        return self

    def _header(self) -> dict:
        b = bytes(self.gf.buffer()[:24])
        magic, version, n_t, n_kv = struct.unpack("<4sIQQ", b)
        return {"kind": "header", "start": 0, "end": 24, "fields": [
            {"field": "magic", "file_offset": 0, "size": 4, "value": magic.decode("ascii", "replace")},
            {"field": "version", "file_offset": 4, "size": 4, "value": version},
            {"field": "n_tensors", "file_offset": 8, "size": 8, "value": n_t},
            {"field": "n_kv", "file_offset": 16, "size": 8, "value": n_kv}], "hexdump": hexdump(b)}

    def _kv(self, key: str) -> dict:
        k = self.gf._kv_by_key[key]
        return {"kind": "kv", "key": key, "type": k.type_name, "count": k.count, "start": k.start, "end": k.end,
                "size": k.end - k.start, "value_start": k.value_start, "value": _short(self.gf.kv[key]),
                "hexdump": hexdump(bytes(self.gf.buffer()[k.start:min(k.end, k.start + 96)]))}

    def _tensor(self, name: str) -> dict:

        gf = self.gf
        ti = gf.tensor(name)
        lay = M.tensor_layout(gf, name)
        rec = M.tensor_info_record(gf, name)
        d = {"kind": "tensor", "name": name, "type": lay["type"], "ne": lay["ne"], "offset": ti.offset,
             "file_offset": ti.file_offset, "nbytes": ti.nbytes, "alignment": gf.alignment,
             "info_start": ti.info_start, "info_end": ti.info_end, "layout": lay,
             "info_record": [dict(r) for r in rec]}
        raw = gf.tensor_data(name)
        ts = lay["type_size"]
        first = np.asarray(raw[:ts])
        if ti.type in quants.BLOCK_DTYPES and C.TYPE_TRAITS[ti.type][3]:
            blk = quants.decode_block(ti.type, first)
            d["first_block"] = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in blk.items()}
        else:
            d["first_values"] = quants.dequantize_row(ti.type, np.asarray(raw[:min(ti.nbytes, 8 * ts)])).tolist()
        d["hexdump"] = hexdump(bytes(raw[:min(ti.nbytes, 64)]))
        return d

    # ---------------------------------------------------------------- state / rendering
    def state(self) -> dict:
        return {"path": self.gf.path, "file_size": self.gf.file_size, "alignment": self.gf.alignment,
                "data_offset": self.gf.data_offset,
                "regions": [{"kind": r["kind"], "start": r["start"], "end": r["end"], "label": r["label"]}
                            for r in self.layout],
                "sections": [dict(s) for s in M.sections(self.gf)], "selected": self.selected}

    def _sel_name(self):
        s = self.selected
        if s is None:
            return None
        return s["name"] if s["kind"] == "tensor" else (f"kv:{s['key']}" if s["kind"] == "kv" else None)

    def figure(self):
        return M.plot_gguf_map(self.gf, selected=self._sel_name(), gid_prefix=self.prefix)

    def svg(self) -> str:
        key = self._sel_name()
        if key not in self._svg_cache:
            self._svg_cache[key] = fig_to_svg(self.figure())
        return self._svg_cache[key]

    def info_html(self) -> str:
        s = self.selected
        if s is None:
            return "<i>click a range of the lower bar (or pick a tensor) to see what its bytes are</i>"
        if s["kind"] == "header":
            return html_table(s["fields"], title="GGUF header (24 bytes)") + pre(s["hexdump"])
        if s["kind"] == "kv":
            rows = [{"field": k, "value": s[k]} for k in ("key", "type", "count", "start", "value_start", "end",
                                                           "size", "value")]
            return html_table(rows, title=f"KV pair {s['key']!r}") + pre(s["hexdump"])
        if s["kind"] != "tensor":
            return html_table([{"field": k, "value": v} for k, v in s.items()])
        lay = s["layout"]
        info = [{"field": "name", "value": s["name"]}, {"field": "type", "value": s["type"]},
                {"field": "ne", "value": s["ne"]},
                {"field": "offset (in data section)", "value": s["offset"]},
                {"field": "file offset",
                 "value": f"{s['file_offset']} = data_offset {self.gf.data_offset} + {s['offset']}"},
                {"field": "nbytes", "value": s["nbytes"]},
                {"field": "alignment", "value": f"offset / {lay['alignment']} = {lay['offset_div_alignment']:g} "
                                                f"({'aligned' if lay['offset_aligned'] else 'NOT aligned'})"},
                {"field": "blocks", "value": f"{lay['n_blocks']} blocks of {lay['blck_size']} elements, "
                                             f"{lay['type_size']} bytes each "
                                             f"({lay['bits_per_weight']:.2f} bits/weight)"},
                {"field": "rows", "value": f"{lay['n_rows']} rows of {lay['row_size']} bytes "
                                           f"({lay['blocks_per_row']} blocks)"}]
        blk = [{"field": f, "offset": o, "size": n, "C type": c} for f, o, n, c in lay["block_fields"]]
        parts = [html_table(info, title=f"tensor {s['name']!r}"),
                 html_table(blk, title=f"block layout ({lay['type']}, ggml-common.h)"),
                 html_table(s["info_record"], ["field", "file_offset", "size", "value", "meaning", "hex"],
                            title=f"its gguf_tensor_info record, bytes {s['info_start']}..{s['info_end']}")]
        if "first_block" in s:
            fb = s["first_block"]
            parts.append(html_table([{"field": k, "value": v} for k, v in fb.items()
                                     if k not in ("type", "block_size", "type_size")],
                                    title="its first block, decoded"))
        else:
            parts.append(f"<b>first values</b>: <code>{esc(np.round(s['first_values'], 5).tolist())}</code>")
        parts.append(pre(s["hexdump"]))
        return "".join(parts)

    def to_html(self) -> str:
        return f"<div>{self.svg()}</div><div>{self.info_html()}</div>"

    def book_view(self) -> dict:
        """The map drawn once, the selection outlined by CSS (a tensor: its info record and its data); every tensor's,
        KV pair's and the header's decoded bytes recorded: pick one in the list or click its range in the map."""
        sel = self.selected
        cur = self._sel_name() or ("header" if sel is not None and sel["kind"] == "header" else "header")
        # every layer's tensors are laid out the same way: layer 0's (and those of no layer) are recorded, which keeps
        # the page light (272 tensors would be 2.8 MB of tables)
        tensors = [t.name for t in self.gf.tensors if not t.name.startswith("blk.") or t.name.startswith("blk.0.")
                   or t.name == cur]
        names = ["header"] + [f"kv:{r['key']}" for r in self.layout if r["kind"] == "kv"] + tensors
        n_other = len(self.gf.tensors) - len(tensors)
        ranges: dict = {}
        clickmap = {}
        for i, r in enumerate(self.layout):
            v = ("header" if r["kind"] == "header" else f"kv:{r['key']}" if r["kind"] == "kv" else
                 r["name"] if r["kind"] in ("tensor_info", "tensor_data") else None)
            if v in names:
                ranges.setdefault(v, []).append(i)
                clickmap[f"r{i}"] = v
        rule = "{ stroke: #d50000 !important; stroke-width: 2.5px !important; }"
        # the selection's red labels, drawn hidden: each frame's CSS shows its own (the live map draws them in place)
        hide = f"[id^='{self.prefix}lab'] {{ display: none; }} "
        labels = sorted(i for v in ranges.values() for i in v)
        try:
            with quiet(self):
                self.selected = None
                picture = fig_to_svg(M.plot_gguf_map(self.gf, gid_prefix=self.prefix, sel_labels=labels)).replace(
                    "<svg ", "<svg style='max-width:100%;height:auto' ", 1)

                def frame(key):
                    self.select(key[0])
                    mine = ranges.get(key[0], [])
                    show = ", ".join(f"#{self.prefix}lab{i}, #{self.prefix}labl{i}" for i in mine)
                    return {"picture": picture, "info": self.info_html(),
                            "css": hide + (f"{show} {{ display: inline !important; }} " if mine else "")
                            + ", ".join(f"#{self.prefix}r{i} path" for i in mine) + " " + rule}

                return frames_book([{"name": "pick", "label": "tensor / KV", "kind": "select", "value": cur,
                                     "options": [[n, n] for n in names]}], [(n,) for n in names], frame,
                                   prefix=self.prefix, clickmap=clickmap,
                                   note="" if not n_other else
                                   f"recorded: the header, the KV pairs and the tensors of layer 0 and of no layer "
                                   f"(the other {n_other} repeat layer 0's layout; run the notebook for them)")
        finally:
            self.selected = sel

    def _build(self):

        self._canvas = svg_canvas(prefix=self.prefix, max_height="520px", fit_width=True)
        on_click(self._canvas, lambda key: self.select_range(int(key[1:])) if key.startswith("r") else None)
        names = [t.name for t in self.gf.tensors]
        self._w_pick = W.Dropdown(options=["(none)"] + names, description="tensor", layout=W.Layout(width="420px"))
        self._w_pick.observe(lambda ch: ch["new"] != "(none)" and self.select(ch["new"]), "value")
        self._w_info = W.HTML()
        return W.VBox([self._w_pick, self._canvas, self._w_info])

    def _refresh(self):
        self._canvas.svg = self.svg()
        self._w_info.value = self.info_html()
        s = self.selected
        if s is not None and s["kind"] == "tensor" and self._w_pick.value != s["name"]:
            self._w_pick.value = s["name"]
