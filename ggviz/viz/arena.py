"""The context arena, region by region: what ``ggml_init``'s one buffer holds after each allocation.

``ggml_new_object`` (ggml.c) appends objects to the arena: a 32-byte ``struct ggml_object`` header, then the payload,
padded to GGML_MEM_ALIGN (16). A tensor's payload is its 336-byte ``struct ggml_tensor`` followed by its data (none for
a view or in a ``no_alloc`` context); a graph's payload is ``ggml_graph_nbytes`` bytes; ``ggml_graph_compute_with_ctx``
appends the work buffer. Everything here reads the bytes and the engine's objects; nothing is recomputed by guess.

- ``arena_map(ctx)``: one row per byte region (header, struct, data, padding, graph, work buffer), contiguous.
- ``objects_table(ctx)``: one row per ``ggml_object`` (the linked list ``objects_begin -> next -> ...``).
- ``plot_arena(ctx)``: the map as a horizontal bar (matplotlib).
- ``hexdump(ctx_or_bytes, start, length)``: classic hex + ASCII dump.
- ``tensor_header_table(t)``: the 336 struct bytes decoded field by field (offset, size, value), like gdb ``p *t``.
"""
from __future__ import annotations

import struct as _struct

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PatchCollection
from matplotlib.patches import Patch, Rectangle

from ..ggml import consts as C
from ..ggml import memory
from ..ggml.graph import CGraph, _layout, graph_nbytes
from ..ggml.tensor import Tensor, nbytes, op_desc, tensor_at, type_name
from .table import Table

KIND_COLORS = {
    "object header": "#9e9e9e",
    "tensor struct": "#64b5f6",
    "tensor data": "#81c784",
    "padding": "#eeeeee",
    "graph": "#ffb74d",
    "work buffer": "#ba68c8",
    "free": "#ffffff",
}

# the labels, offsets and legend of plot_arena: the arena's SVG (about 820 points wide) prints no narrower than that
# on A4 landscape (ggviz/templates/book/print.css), so 9 pt stays 9 px or more on paper (#21; 7 pt printed at 8 px)
TEXT_PT = 9

_OBJ_NAMES = {C.GGML_OBJECT_TYPE_TENSOR: "tensor", C.GGML_OBJECT_TYPE_GRAPH: "graph",
              C.GGML_OBJECT_TYPE_WORK_BUFFER: "work_buffer"}


class Text(str):
    """A string that Jupyter shows as-is (no quotes, real newlines)."""

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))



def _ctx_desc(ctx) -> str:
    """A context in words (its repr is for debugging, not for a page)."""
    n = len(ctx.objects)
    return (f"{ctx.mem_size:,} bytes, {ctx.used_mem():,} used by {n} object{'s' if n != 1 else ''}"
            + (" (no_alloc)" if ctx.no_alloc else ""))

def _hex(v: int) -> str:
    return f"0x{v:x}"


def _arena(ctx_or_bytes) -> np.ndarray:
    if hasattr(ctx_or_bytes, "mem_buffer"):
        return ctx_or_bytes.mem_buffer
    if isinstance(ctx_or_bytes, Tensor):
        return ctx_or_bytes.raw
    if isinstance(ctx_or_bytes, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(ctx_or_bytes), dtype=np.uint8)
    a = np.asarray(ctx_or_bytes)
    return a.reshape(-1).view(np.uint8) if a.dtype != np.uint8 else a.reshape(-1)


def _tensor_data_size(t: Tensor, payload: int) -> int:
    """Bytes of the object's payload that are the tensor's own data (0 for views and no_alloc tensors)."""
    if t.view_src is not None or t.data != t.addr + C.GGML_TENSOR_SIZE:
        return 0
    return min(nbytes(t), payload - C.GGML_TENSOR_SIZE)


def arena_map(ctx, detail: bool = False, include_free: bool = False) -> Table:
    """One row per region of ``ctx``'s arena, in address order; the rows tile [0, used_mem) exactly.

    Row keys: start, end, size (bytes, offsets into mem_buffer), kind (object header / tensor struct / tensor data /
    padding / graph / work buffer / free), obj (index in the object list), name, type, ne, note.
    ``detail=True`` splits a graph object into its arrays (struct, nodes, leafs, use_counts, hash keys, bitset).
    ``include_free=True`` adds the unused tail [used_mem, mem_size).
    """
    rows = []

    otype = None

    def add(start, size, kind, obj, name="", type_="", ne=None, note=""):
        if size > 0:
            rows.append({"start": start, "end": start + size, "size": size, "kind": kind, "obj": obj, "name": name,
                         "type": type_, "ne": ne, "note": note, "object": otype if obj is not None else None})

    for i, o in enumerate(ctx.objects):
        otype = _OBJ_NAMES.get(o.type, str(o.type))
        add(o.hdr_offs, C.GGML_OBJECT_SIZE, "object header", i, note=f"ggml_object: {otype}, offs={o.offs}, "
            f"size={o.size}")
        p = o.offs
        end = o.offs + o.size
        pay = o.payload
        if o.type == C.GGML_OBJECT_TYPE_TENSOR and isinstance(pay, Tensor):
            t = pay
            tname, ne = type_name(t.type), list(t.shape)
            add(p, C.GGML_TENSOR_SIZE, "tensor struct", i, t.name, tname, ne,
                "view of " + repr(t.view_src.name) if t.view_src is not None else
                ("no data (data == NULL)" if not t.data else ""))
            p += C.GGML_TENSOR_SIZE
            d = _tensor_data_size(t, o.size)
            add(p, d, "tensor data", i, t.name, tname, ne, f"op={op_desc(t)}")
            p += d
        elif o.type == C.GGML_OBJECT_TYPE_GRAPH and isinstance(pay, CGraph):
            grads = pay.grads is not None
            gsize = graph_nbytes(pay.size, grads)
            if detail:
                lay, total, hs = _layout(pay.size, grads)
                parts = [("struct ggml_cgraph", 0)] + sorted(lay.items(), key=lambda kv: kv[1])
                ends = [off for _, off in parts[1:]] + [total]
                counts = {"nodes": pay.size, "leafs": pay.size, "use_counts": hs, "keys": hs, "grads": hs,
                          "grad_accs": hs, "used": (hs + 31) // 32}
                for (pname, off), nxt in zip(parts, ends):
                    item = {"nodes": 8, "leafs": 8, "use_counts": 4, "keys": 8, "grads": 8, "grad_accs": 8,
                            "used": 4}.get(pname)
                    used = counts[pname] * item if item else nxt - off
                    add(p + off, used, "graph", i, f"graph.{pname}", "", None,
                        f"{counts[pname]} x {item} bytes" if item else "size, n_nodes, n_leafs, pointers ...")
                    add(p + off + used, nxt - off - used, "padding", i, note="alignment")
            else:
                add(p, gsize, "graph", i, "graph", "", None,
                    f"ggml_cgraph size={pay.size} n_nodes={pay.n_nodes} n_leafs={pay.n_leafs} "
                    f"(ggml_graph_nbytes={gsize})")
            p += gsize
        elif o.type == C.GGML_OBJECT_TYPE_WORK_BUFFER:
            add(p, o.size, "work buffer", i, "work buffer", "", None, "cplan.work_data (ggml_graph_compute_with_ctx)")
            p = end
        else:
            add(p, o.size, "object", i, note="unknown payload")
            p = end
        add(p, end - p, "padding", i, note=f"to GGML_MEM_ALIGN ({C.GGML_MEM_ALIGN})")
    if include_free:
        used = ctx.used_mem()
        add(used, ctx.mem_size - used, "free", None, note="unused arena")
    return Table(rows, ["start", "end", "size", "kind", "obj", "name", "type", "ne", "note"],
                 title=f"the arena: {_ctx_desc(ctx)}", formats={"start": _hex, "end": _hex})


def objects_table(ctx) -> Table:
    """One row per ``ggml_object`` in list order: where its header and payload are, and what the payload is."""
    base = ctx.base
    rows = []
    for i, o in enumerate(ctx.objects):
        r = {"#": i, "type": _OBJ_NAMES.get(o.type, str(o.type)), "hdr_offs": o.hdr_offs, "offs": o.offs,
             "size": o.size, "next": (o.next - base) if o.next else None, "name": "", "dtype": "", "ne": None,
             "data_offs": None}
        t = o.payload
        if isinstance(t, Tensor):
            r.update(name=t.name, dtype=type_name(t.type), ne=list(t.shape))
            if t.data:
                try:
                    arr, off, _ = memory.resolve(t.data)
                    r["data_offs"] = off if arr.ctypes.data == base else f"other buffer +{off}"
                except ValueError:
                    r["data_offs"] = _hex(t.data)
        elif isinstance(t, CGraph):
            r.update(name=f"graph ({t.n_nodes} nodes, {t.n_leafs} leafs)")
        rows.append(r)
    return Table(rows, ["#", "type", "hdr_offs", "offs", "size", "next", "name", "dtype", "ne", "data_offs"],
                 title=f"the object list: {_ctx_desc(ctx)} (next = offset of the next header)")


def _display_widths(sizes, scale):
    s = np.asarray(sizes, dtype=np.float64)
    if scale == "linear":
        return s
    if scale == "log":
        return np.log2(1.0 + s)
    if scale == "sqrt":
        return np.sqrt(s)
    raise ValueError(f"scale must be 'linear', 'log' or 'sqrt', got {scale!r}")


def plot_arena(ctx, ax=None, scale: str = "linear", detail: bool = False, include_free: bool = False,
               labels: bool = True, max_labels: int = 40, title: str | None = None, gid_prefix: str | None = None,
               highlight: int | None = None, rows: list | None = None):
    """Draw the arena as a horizontal byte map: one coloured span per region, objects labelled by name.

    ``scale="linear"`` keeps widths proportional to bytes; ``"log"``/``"sqrt"`` widen small regions so 32-byte
    headers stay visible next to megabytes of data (tick labels always show real byte offsets).
    ``gid_prefix``: each region's patch gets the SVG id ``<gid_prefix>o<object index>r<region index>`` (for click
    handling); ``highlight``: an object index outlined in red.
    ``rows``: ``arena_map``'s rows of an arena recorded earlier, drawn instead of ``ctx``'s (``ctx`` may be None).
    Returns the matplotlib Axes.
    """

    if rows is None:
        rows = arena_map(ctx, detail=detail, include_free=include_free)
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 2.4))
    if not rows:
        ax.set_axis_off()
        ax.set_title(title or (f"empty arena ({ctx.mem_size} bytes)" if ctx is not None else "empty arena"))
        return ax
    w = _display_widths([r["size"] for r in rows], scale)
    x = np.concatenate([[0.0], np.cumsum(w)])
    spans = [Rectangle((x0, 0), wi, 1) for x0, wi in zip(x[:-1], w)]
    colors = [KIND_COLORS.get(r["kind"], "#cccccc") for r in rows]
    if gid_prefix is None:
        # one artist for the whole strip: a model's arena has thousands of regions, and an Axes patch each cost
        # ~2 ms apiece in add_patch's data-limit update and the draw (the limits are set below anyway)
        ax.add_collection(PatchCollection(spans, facecolors=colors, edgecolors="#424242", linewidths=0.4),
                          autolim=False)
    else:
        # a patch per region: each keeps its own SVG id for the click handling
        for k, (r, p, c) in enumerate(zip(rows, spans, colors)):
            p.set(facecolor=c, edgecolor="#424242", linewidth=0.4,
                  gid=f"{gid_prefix}o{r['obj'] if r['obj'] is not None else 'x'}r{k}")
            ax.add_artist(p)
    if highlight is not None:
        xs = [(x0, x0 + wi) for r, x0, wi in zip(rows, x[:-1], w) if r["obj"] == highlight]
        if xs:
            a, b = min(v[0] for v in xs), max(v[1] for v in xs)
            ax.add_patch(Rectangle((a, 0), b - a, 1, facecolor="none", edgecolor="#d50000", linewidth=2.5,
                                   zorder=5, clip_on=False))
            ax.add_patch(Rectangle((a, -0.09), b - a, 0.06, facecolor="#d50000", edgecolor="none", zorder=5,
                                   clip_on=False))
    total = x[-1]
    ax.set_xlim(0, total)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    # object boundaries as ticks, labelled with their real byte offsets
    obj_x, obj_off = [], []
    for r, x0 in zip(rows, x[:-1]):
        if r["kind"] == "object header":
            obj_x.append(x0)
            obj_off.append(r["start"])
    obj_x.append(total)
    obj_off.append(rows[-1]["end"])
    kept_x, kept_off = [], []
    for xi, oi in zip(obj_x, obj_off):      # drop ticks that would overprint their left neighbour
        if not kept_x or xi - kept_x[-1] >= total / 30 or xi == total:
            if kept_x and xi == total and xi - kept_x[-1] < total / 30 and len(kept_x) > 1:
                kept_x.pop()
                kept_off.pop()
            kept_x.append(xi)
            kept_off.append(oi)
    ax.set_xticks(kept_x)
    ax.set_xticklabels([str(o) for o in kept_off], fontsize=TEXT_PT, rotation=45)
    ax.set_xlabel("byte offset in mem_buffer" + ("" if scale == "linear" else f" ({scale} width scale)"))
    longest = 0
    if labels:
        spans = {}
        for r, x0, wi in zip(rows, x[:-1], w):
            if r["obj"] is None:
                continue
            a, b = spans.get(r["obj"], (x0, x0 + wi))
            spans[r["obj"]] = (min(a, x0), max(b, x0 + wi))
        names = {}
        for r in rows:
            if r["obj"] is None or r["obj"] in names:
                continue
            if r["object"] == "graph":
                names[r["obj"]] = "ggml_cgraph"
            elif r["object"] == "work_buffer":
                # the object's size: its arena_map row (none for an empty work buffer: arena_map skips 0-byte regions)
                size = next((q["size"] for q in rows if q["obj"] == r["obj"] and q["kind"] == "work buffer"), 0)
                names[r["obj"]] = f"work buffer ({size} B)"
            elif r["kind"] == "tensor struct":
                names[r["obj"]] = r["name"] or "(unnamed)"
        # the widest objects first: horizontal labels in up to 3 rows above the strip, each joined to its object by
        # a leader line; a label goes to the lowest row where it overlaps no other (rotated labels collided)
        items = sorted(spans.items(), key=lambda kv: -(kv[1][1] - kv[1][0]))[:max_labels]
        fig = ax.figure
        axis_pt = max(ax.get_position().width * fig.get_figwidth() * 72, 1.0)
        char = TEXT_PT * 0.6 / axis_pt * total                 # one TEXT_PT character in data units
        rows_used: list = [[] for _ in range(3)]
        for obj, (a, b) in items:
            text = names.get(obj, "")
            text = text if len(text) <= 26 else text[:25] + "…"
            if not text:
                continue
            xc = (a + b) / 2
            half = len(text) * char / 2 + char / 2
            xt = min(max(xc, half), total - half)
            row = next((k for k, used in enumerate(rows_used)
                        if all(xt + half < lo or xt - half > hi for lo, hi in used)), None)
            if row is None:
                continue
            rows_used[row].append((xt - half, xt + half))
            y = 1.08 + 0.22 * row
            ax.plot([xc, xc, xt], [1.0, y - 0.05, y - 0.01], color="#90a4ae", linewidth=0.6, clip_on=False)
            ax.text(xt, y, text, fontsize=TEXT_PT, ha="center", va="bottom")
            longest = max(longest, 1 + row)
    kinds = [k for k in KIND_COLORS if any(r["kind"] == k for r in rows)]
    ax.legend(handles=[Patch(facecolor=KIND_COLORS[k], edgecolor="#424242", label=k) for k in kinds],
              loc="center left", bbox_to_anchor=(1.005, 0.5), fontsize=TEXT_PT, frameon=False)
    ax.set_title(title or f"context arena: used {ctx.used_mem()} of {ctx.mem_size} bytes, {len(ctx.objects)} objects",
                 fontsize=9, pad=_label_pad(ax, longest) if labels else 6)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return ax


def _label_pad(ax, n_rows: int) -> float:
    """The title's pad (points) above ``n_rows`` rows of labels (rows at 1.08 + 0.22 k in axes units)."""
    if n_rows == 0:
        return 6.0
    h_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    return (0.08 + 0.22 * (n_rows - 1)) * h_pt + 16.0


def hexdump(ctx_or_bytes, start: int = 0, length: int | None = None, width: int = 16) -> Text:
    """Hex + ASCII dump of ``length`` bytes from ``start`` (offsets shown relative to the buffer's first byte).

    Accepts a context (its arena), a Tensor (its 336 struct bytes), bytes, or a NumPy array.
    """
    buf = _arena(ctx_or_bytes)
    if length is None:
        length = (ctx_or_bytes.used_mem() if hasattr(ctx_or_bytes, "used_mem") else buf.size) - start
    end = min(buf.size, start + max(0, length))
    lines = []
    for row in range(start - start % width, end, width):
        cells, text = [], []
        for j in range(row, row + width):
            if start <= j < end:
                b = int(buf[j])
                cells.append(f"{b:02x}")
                text.append(chr(b) if 32 <= b < 127 else ".")
            else:
                cells.append("  ")
                text.append(" ")
            if (j - row) % 8 == 7 and j - row != width - 1:
                cells.append("")
        lines.append(f"{row:08x}  {' '.join(cells)}  |{''.join(text)}|")
    return Text("\n".join(lines))


# ---- struct ggml_tensor, field by field (offsets as gcc lays it out on x86-64; see ggml.h)
_FIELDS = [("type", 0, 4, "<i"), ("(hole)", 4, 4, None), ("buffer", 8, 8, "<Q")]
_FIELDS += [(f"ne[{i}]", 16 + 8 * i, 8, "<q") for i in range(4)]
_FIELDS += [(f"nb[{i}]", 48 + 8 * i, 8, "<Q") for i in range(4)]
_FIELDS += [("op", 80, 4, "<i"), ("op_params", 84, 64, "<16i"), ("flags", 148, 4, "<i")]
_FIELDS += [(f"src[{i}]", 152 + 8 * i, 8, "<Q") for i in range(C.GGML_MAX_SRC)]
_FIELDS += [("view_src", 232, 8, "<Q"), ("view_offs", 240, 8, "<Q"), ("data", 248, 8, "<Q"),
            ("name", 256, 64, "64s"), ("extra", 320, 8, "<Q"), ("padding", 328, 8, None)]
assert sum(f[2] for f in _FIELDS) == C.GGML_TENSOR_SIZE


def _pointer_meaning(addr: int) -> str:
    if not addr:
        return "NULL"
    try:
        t = tensor_at(addr)
        return f"-> tensor {t.name!r}"
    except ValueError:
        pass
    try:
        _, off, label = memory.resolve(addr)
        return f"-> {label} + {off}"
    except ValueError:
        return "-> (outside ggviz buffers)"


def _flags_meaning(v: int) -> str:
    names = [n for n, bit in (("INPUT", C.GGML_TENSOR_FLAG_INPUT), ("OUTPUT", C.GGML_TENSOR_FLAG_OUTPUT),
                              ("PARAM", C.GGML_TENSOR_FLAG_PARAM), ("LOSS", C.GGML_TENSOR_FLAG_LOSS),
                              ("COMPUTE", getattr(C, "GGML_TENSOR_FLAG_COMPUTE", 0))) if bit and v & bit]
    return "|".join(names)


def tensor_header_table(t: Tensor, raw: bytes | None = None) -> Table:
    """The tensor's 336 header bytes decoded field by field: field, offset, size, value, meaning, hex.

    Values come from the bytes (``struct.unpack``), not from Python attributes, so the table shows what a debugger
    would. ``raw`` may be given instead (336 bytes, e.g. a slice of ``get_mem_buffer(ctx)``); pointers are then
    still explained through the live registry.
    """
    b = bytes(t.raw) if raw is None else bytes(raw)
    if len(b) != C.GGML_TENSOR_SIZE:
        raise ValueError(f"a ggml_tensor header is {C.GGML_TENSOR_SIZE} bytes, got {len(b)}")
    base = None
    if isinstance(t, Tensor) and t.ctx is not None and hasattr(t.ctx, "base"):
        base = t.addr - t.ctx.base
    rows = []
    for name, off, size, fmt in _FIELDS:
        chunk = b[off:off + size]
        if fmt is None:
            value, meaning = None, "alignment padding" if name == "(hole)" else "char padding[8]"
        elif name == "op_params":
            value = list(_struct.unpack(fmt, chunk))
            meaning = "all zero" if not any(value) else "int32 x16 (op-specific)"
        elif name == "name":
            value = chunk.split(b"\0", 1)[0].decode("utf-8", "replace")
            meaning = f"{len(value)} chars + NUL"
        else:
            value = _struct.unpack(fmt, chunk)[0]
            if name == "type":
                meaning = f"GGML_TYPE_{type_name(value).upper()}"
            elif name == "op":
                meaning = f"GGML_OP_{C.OP_NAMES[value] if 0 <= value < len(C.OP_NAMES) else '?'}"
            elif name == "flags":
                meaning = _flags_meaning(value)
            elif name.startswith("ne["):
                meaning = "elements"
            elif name.startswith("nb["):
                meaning = "bytes"
            elif name == "view_offs":
                meaning = "bytes into view_src's data"
            elif name in ("buffer", "view_src", "data", "extra") or name.startswith("src["):
                meaning = _pointer_meaning(value)
            else:
                meaning = ""
        hexs = chunk[:8].hex(" ") + (" …" if size > 8 else "")
        rows.append({"field": name, "offset": off, "size": size, "value": value, "meaning": meaning, "hex": hexs})
    title = f"struct ggml_tensor {t.name!r}" + (f" at arena offset {base}" if base is not None else "")
    return Table(rows, ["field", "offset", "size", "value", "meaning", "hex"], title=title,
                 formats={"value": lambda v: _hex(v) if isinstance(v, int) and v > 0xFFFFFFFF else _fmt_val(v)})


def _fmt_val(v):
    if isinstance(v, list):
        if not any(v):
            return "{0 x %d}" % len(v)
        return "[" + ", ".join(str(x) for x in v) + "]"
    if isinstance(v, str):
        return repr(v)
    return str(v)
