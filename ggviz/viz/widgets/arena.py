"""ArenaWidget: a ggml context's arena as a clickable byte map; a selected object shows its bytes decoded.

For a tensor: the 32-byte ``ggml_object`` header and the 336-byte ``ggml_tensor`` struct decoded field by field from
the arena's bytes (``tensor_header_table``: what gdb's ``p *t`` prints), hexdumps, and the first data values. For a
graph object: its arrays (nodes, leafs, use counts, hash keys, used-bitset). For a work buffer: its size and bytes.
"""
from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from ...ggml import consts as C
from ...ggml.context import OBJECT_TYPE_NAMES
from ...ggml.graph import CGraph
from ...ggml.tensor import OBJECT_DTYPE, Tensor, get_data_f32, nbytes
from ..arena import arena_map, hexdump, plot_arena, tensor_header_table
from ._base import VizWidget, fig_to_svg, frames_book, html_table, new_prefix, on_click, pre, quiet, svg_canvas


def object_header(ctx, i: int) -> dict:
    """The ``struct ggml_object`` of object ``i`` decoded from the arena's bytes."""
    o = ctx.objects[i]
    rec = ctx.mem_buffer[o.hdr_offs:o.hdr_offs + C.GGML_OBJECT_SIZE].view(OBJECT_DTYPE)[0]
    nxt = int(rec["next"])
    return {"hdr_offs": o.hdr_offs, "offs": int(rec["offs"]), "size": int(rec["size"]),
            "next": nxt, "next_offs": (nxt - ctx.base) if nxt else None,
            "type": int(rec["type"]), "type_name": OBJECT_TYPE_NAMES.get(int(rec["type"]), "?")}


class ArenaWidget(VizWidget):
    """A context's arena (``ggml_init``'s buffer): objects, tensor structs, data, padding, graphs, work buffers.

    ``select(i | name | tensor)`` picks an object; ``state()["selected"]`` holds the decoded header fields
    (``header``: rows of ``tensor_header_table``, ``struct``: ``t.struct()``) and the raw bytes shown.
    """

    def __init__(self, ctx, scale: str = "sqrt", detail: bool = True, max_labels: int = 30):
        self.ctx = ctx
        self.scale = scale
        self.detail = detail
        self.max_labels = max_labels
        self.prefix = new_prefix("arena")
        self.sel: int | None = None
        self._svg_cache: dict = {}

    def _index_of(self, what) -> int:
        if isinstance(what, (int, np.integer)):
            i = int(what)
            if not 0 <= i < len(self.ctx.objects):
                raise IndexError(f"object {i} out of range ({len(self.ctx.objects)} objects)")
            return i
        for i, o in enumerate(self.ctx.objects):
            p = o.payload
            if isinstance(what, Tensor) and isinstance(p, Tensor) and p.addr == what.addr:
                return i
            if isinstance(what, str) and isinstance(p, Tensor) and p.name == what:
                return i
            if isinstance(what, CGraph) and p is what:
                return i
        raise KeyError(f"no object {what!r} in {self.ctx!r}")

    def select(self, what):
        """Select an object by index, tensor name, Tensor or CGraph."""
        self.sel = self._index_of(what)
        self._changed()
        return self

    def selected(self) -> dict | None:
        if self.sel is None:
            return None
        ctx, i = self.ctx, self.sel
        o = ctx.objects[i]
        d = {"index": i, "object": object_header(ctx, i),
             "object_hexdump": hexdump(ctx, o.hdr_offs, C.GGML_OBJECT_SIZE),
             "regions": [dict(r) for r in arena_map(ctx, detail=True) if r["obj"] == i]}
        p = o.payload
        if isinstance(p, Tensor):
            d["kind"] = "tensor"
            d["name"] = p.name
            d["header"] = [dict(r) for r in tensor_header_table(p)]
            d["struct"] = p.struct()
            d["struct_hexdump"] = hexdump(ctx, o.offs, C.GGML_TENSOR_SIZE)
            if p.data:
                n = nbytes(p)
                try:
                    d["data_offset"] = p.data - ctx.base if 0 <= p.data - ctx.base < ctx.mem_size else None
                    vals = get_data_f32(p).reshape(-1)
                    d["values"] = vals[:16].tolist()
                    d["n_values"] = int(vals.size)
                    from ...ggml import memory
                    arr, off, label = memory.resolve(p.data, n)
                    d["data_where"] = f"{label} + {off}"
                    d["data_hexdump"] = hexdump(arr[off:off + min(n, 64)])
                except ValueError as e:                   # data in no registered buffer
                    d["data_where"] = str(e)
            else:
                d["data_where"] = "data == NULL (no_alloc context: the allocator gives it memory later)"
        elif isinstance(p, CGraph):
            d["kind"] = "graph"
            d["name"] = "ggml_cgraph"
            d["graph"] = {"size": p.size, "n_nodes": p.n_nodes, "n_leafs": p.n_leafs,
                          "hash_size": p.visited_hash_set.size}
            d["struct_hexdump"] = hexdump(ctx, o.offs, 96)
        else:
            d["kind"] = "work_buffer"
            d["name"] = "work buffer"
            d["struct_hexdump"] = hexdump(ctx, o.offs, min(o.size, 64))
        return d

    def state(self) -> dict:
        ctx = self.ctx
        return {"mem_size": ctx.mem_size, "used_mem": ctx.used_mem(), "n_objects": len(ctx.objects),
                "regions": [dict(r) for r in arena_map(ctx, detail=self.detail)], "selected": self.selected()}

    def figure(self):

        fig, ax = plt.subplots(figsize=(13, 2.8))
        plot_arena(self.ctx, ax=ax, scale=self.scale, detail=self.detail, max_labels=self.max_labels,
                   gid_prefix=self.prefix, highlight=self.sel)
        return fig

    def svg(self) -> str:
        key = (self.sel, self.ctx.used_mem())
        if key not in self._svg_cache:
            self._svg_cache[key] = fig_to_svg(self.figure())
        return self._svg_cache[key]

    def info_html(self) -> str:
        d = self.selected()
        if d is None:
            return "<i>click an object in the map (or pick one) to decode its bytes</i>"
        oh = d["object"]
        parts = [html_table([{"field": k, "value": v} for k, v in oh.items()],
                            title=f"struct ggml_object #{d['index']} at arena offset {oh['hdr_offs']} (32 bytes)"),
                 pre(d["object_hexdump"])]
        if d["kind"] == "tensor":
            parts.append(html_table(tensor_header_table(self.ctx.objects[d["index"]].payload)))
            parts.append(pre(d["struct_hexdump"]))
            parts.append(f"<b>data</b>: {d.get('data_where')}")
            if "values" in d:
                parts.append(f"<br/><b>first values</b> ({d['n_values']} in all): <code>"
                             f"{np.round(np.asarray(d['values']), 5).tolist()}</code>")
                parts.append(pre(d["data_hexdump"]))
        elif d["kind"] == "graph":
            parts.append(html_table([{"field": k, "value": v} for k, v in d["graph"].items()], title="ggml_cgraph"))
            parts.append(html_table(d["regions"], ["start", "end", "size", "kind", "name", "note"],
                                    title="its arrays in the arena"))
            parts.append(pre(d["struct_hexdump"]))
        else:
            parts.append(pre(d["struct_hexdump"]))
        return "".join(parts)

    def to_html(self) -> str:
        return f"<div>{self.svg()}</div><div>{self.info_html()}</div>"

    def book_view(self) -> dict:
        """The map drawn once, the selected object outlined by CSS; every object's decoded bytes recorded (HTML):
        pick an object in the list or click it in the map."""
        sel = self.sel
        n = len(self.ctx.objects)
        clickmap = {}
        for k, r in enumerate(arena_map(self.ctx, detail=self.detail)):
            if r["obj"] is not None:
                clickmap[f"o{r['obj']}r{k}"] = int(r["obj"])
        opts = []
        for i, o in enumerate(self.ctx.objects):
            p = o.payload
            opts.append([f"#{i} " + ((p.name or "(unnamed)") if isinstance(p, Tensor) else
                                     OBJECT_TYPE_NAMES.get(o.type, "?")), i])
        rule = "{ stroke: #d50000 !important; stroke-width: 3px !important; }"
        try:
            self.sel = None
            picture = f"<div style='max-width:100%'>{self.svg()}</div>".replace("<svg ", "<svg style='max-width:100%;"
                                                                                 "height:auto' ", 1)

            def frame(key):
                self.sel = key[0]
                return {"picture": picture, "info": self.info_html(),
                        "css": f"[id^='{self.prefix}o{key[0]}r'] path {rule}"}

            with quiet(self):
                return frames_book([{"name": "object", "label": "object", "kind": "select", "options": opts,
                                     "value": sel if sel is not None else 0}], [(i,) for i in range(n)], frame,
                                   prefix=self.prefix, clickmap=clickmap)
        finally:
            self.sel = sel

    def _build(self):

        self._canvas = svg_canvas(prefix=self.prefix, max_height="420px", fit_width=True)

        def clicked(key):
            if key.startswith("o") and not key.startswith("ox"):
                self.select(int(key[1:key.index("r")]))

        on_click(self._canvas, clicked)
        opts = []
        for i, o in enumerate(self.ctx.objects):
            p = o.payload
            label = (p.name or "(unnamed)") if isinstance(p, Tensor) else OBJECT_TYPE_NAMES.get(o.type, "?")
            opts.append((f"#{i} {label}", i))
        self._w_pick = W.Dropdown(options=[("(none)", -1)] + opts, description="object",
                                  layout=W.Layout(width="420px"))
        self._w_pick.observe(lambda ch: ch["new"] >= 0 and self.select(ch["new"]), "value")
        self._w_info = W.HTML()
        return W.VBox([self._w_pick, self._canvas, self._w_info])

    def _refresh(self):
        self._canvas.svg = self.svg()
        self._w_info.value = self.info_html()
        if self.sel is not None and self._w_pick.value != self.sel:
            self._w_pick.value = self.sel
