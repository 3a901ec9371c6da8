"""A GGUF file as a byte map: header, key-value pairs, tensor infos, padding, tensor data.

Everything is read from the file (``ggviz.ggml.gguf.GGUFFile.layout()`` gives the byte ranges; the tensor info
records are decoded again from their bytes here, as a hex editor would):

- ``sections(gf)``: the five parts of the file with their byte ranges and sizes;
- ``map_positions(layout)``: where each byte range goes on a *piecewise* axis: every section gets a fixed share of
  the width and, inside it, ranges get a width growing with log(size), so the 24-byte header and 60-byte tensor
  infos stay visible next to 28 MB of token embeddings (tick labels keep the real offsets);
- ``tensor_info_record(gf, name)``: the bytes of one ``gguf_tensor_info`` record, field by field;
- ``tensor_layout(gf, name)``: where the tensor's data is, its alignment, and its block layout (ggml-common.h);
- ``plot_gguf_map(gf, selected=...)``: the figure (to scale on top, piecewise below).
"""
from __future__ import annotations

import re
import struct

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ..ggml import consts as C
from ..ggml import quants
from .table import Table

_BLK = re.compile(r"blk\.(\d+)\.")

SECTION_ORDER = ["header", "kv", "tensor_info", "padding", "tensor_data"]
SECTION_NAMES = {"header": "header", "kv": "KV pairs (metadata)", "tensor_info": "tensor infos",
                 "padding": "padding", "tensor_data": "tensor data"}
SECTION_COLORS = {"header": "#ef5350", "kv": "#ffb74d", "tensor_info": "#64b5f6", "padding": "#e0e0e0",
                  "tensor_data": "#81c784"}
# tensor data coloured by ggml type (quantized types in greens/teals, floats in blues)
TYPE_COLORS = {"f32": "#90caf9", "f16": "#b3e5fc", "bf16": "#b2ebf2", "q4_0": "#a5d6a7", "q4_1": "#81c784",
               "q5_0": "#c5e1a5", "q5_1": "#aed581", "q8_0": "#4db6ac", "q2_k": "#e6ee9c", "q3_k": "#dce775",
               "q4_k": "#66bb6a", "q5_k": "#9ccc65", "q6_k": "#26a69a", "q8_k": "#80cbc4"}
# the share of the piecewise axis each section gets (renormalised over the sections present)
# the range labels under the bar, in points: the book draws the map about as wide as the page (~1 px per pt), and
# print and the book keep text at 9 px or more (issue #21)
LABEL_PT = 9.5
SECTION_SHARES = {"header": 0.07, "kv": 0.28, "tensor_info": 0.2, "padding": 0.04, "tensor_data": 0.41}


def sections(gf) -> Table:
    """One row per section of the file (header, kv, tensor_info, padding, tensor_data): start, end, size, count."""
    rows = {}
    for r in gf.layout():
        k = r["kind"]
        s = rows.setdefault(k, {"section": k, "start": r["start"], "end": r["end"], "size": 0, "count": 0})
        s["start"] = min(s["start"], r["start"])
        s["end"] = max(s["end"], r["end"])
        s["size"] += r["end"] - r["start"]
        s["count"] += 1
    out = [rows[k] for k in SECTION_ORDER if k in rows]
    return Table(out, ["section", "start", "end", "size", "count"], title=f"{gf.path}: {gf.file_size} bytes")


def map_positions(layout, shares: dict | None = None):
    """x0 and width (in [0, 1]) of each layout range on the piecewise axis, and the section spans.

    Inside a section a range's width is proportional to ``log2(1 + size)``; sections are consecutive in the file
    (padding ranges between tensor data are drawn inside the data section, where they are).
    """
    shares = dict(SECTION_SHARES if shares is None else shares)
    # a section is a maximal run of ranges; padding between data ranges belongs to the data run
    group = []
    for r in layout:
        k = r["kind"]
        g = "tensor_data" if (k == "padding" and group and group[-1] == "tensor_data") else k
        group.append(g)
    present = []
    for g in group:
        if g not in present:
            present.append(g)
    tot = sum(shares.get(g, 0.05) for g in present)
    x = 0.0
    spans = {}
    x0 = np.zeros(len(layout))
    w = np.zeros(len(layout))
    for g in present:
        idx = [i for i, gg in enumerate(group) if gg == g]
        share = shares.get(g, 0.05) / tot
        lw = np.array([np.log2(1.0 + layout[i]["end"] - layout[i]["start"]) for i in idx])
        lw = lw / lw.sum() * share if lw.sum() else np.full(len(idx), share / len(idx))
        xs = x + np.concatenate([[0.0], np.cumsum(lw)[:-1]])
        x0[idx] = xs
        w[idx] = lw
        spans[g] = (x, x + share)
        x += share
    return x0, w, spans


def tensor_info_record(gf, name: str) -> Table:
    """The ``gguf_tensor_info`` record of tensor ``name``, decoded from the file's bytes.

    As written by ``gguf_write_to_buf``: name (u64 length + bytes), n_dims (u32), ne[n_dims] (i64 each),
    type (i32, ggml_type), offset (u64, from the start of the data section).
    """
    ti = gf.tensor(name)
    buf = gf.buffer()
    p = ti.info_start
    rows = []

    def take(field, fmt, n, meaning=""):
        nonlocal p
        raw = bytes(buf[p:p + n])
        val = struct.unpack(fmt, raw)[0] if fmt else raw.decode("utf-8", "replace")
        rows.append({"field": field, "file_offset": p, "size": n, "value": val, "meaning": meaning,
                     "hex": raw[:8].hex(" ") + (" …" if n > 8 else "")})
        p += n
        return val

    ln = take("name.n", "<Q", 8, "string length")
    take("name.data", None, ln, "UTF-8, no NUL")
    nd = take("n_dims", "<I", 4)
    for d in range(nd):
        take(f"ne[{d}]", "<q", 8, "elements")
    ty = take("type", "<i", 4)
    rows[-1]["meaning"] = f"GGML_TYPE_{C.TYPE_TRAITS[ty][0].upper()}"
    take("offset", "<Q", 8, f"in the data section (file offset {gf.data_offset} + offset)")
    assert p == ti.info_end, (p, ti.info_end)
    return Table(rows, ["field", "file_offset", "size", "value", "meaning", "hex"],
                 title=f"gguf_tensor_info of {name!r} at file offset {ti.info_start}")


def block_fields(type_: int) -> list:
    """The block struct of a ggml type (ggml-common.h): [(field, offset, size, C type)]."""

    dt = quants.BLOCK_DTYPES.get(type_)
    if dt is None:
        return []
    if dt.names is None:
        return [("value", 0, dt.itemsize, {2: "ggml_half", 4: "float"}.get(dt.itemsize, str(dt)))]
    out = []
    for n in dt.names:
        sub, off = dt.fields[n][:2]
        base = sub.base if sub.shape else sub
        cname = {"<f2": "ggml_half", "<f4": "float", "|u1": "uint8_t", "|i1": "int8_t", "<u2": "uint16_t",
                 "<i2": "int16_t"}.get(base.str, base.str)
        out.append((n, off, sub.itemsize, cname + (f"[{sub.shape[0]}]" if sub.shape else "")))
    return out


def tensor_layout(gf, name: str) -> dict:
    """Where tensor ``name``'s data is and how it is laid out: offsets, alignment, blocks, rows."""
    ti = gf.tensor(name)
    tr = C.TYPE_TRAITS[ti.type]
    tname, blck, tsize = tr[0], tr[1], tr[2]
    ne0 = ti.ne[0]
    n_el = ti.nelements
    row = tsize * ne0 // blck
    return {"name": ti.name, "type": tname, "ne": list(ti.ne), "offset": ti.offset, "file_offset": ti.file_offset,
            "nbytes": ti.nbytes, "alignment": gf.alignment, "offset_aligned": ti.offset % gf.alignment == 0,
            "offset_div_alignment": ti.offset / gf.alignment, "blck_size": blck, "type_size": tsize,
            "bits_per_weight": 8.0 * tsize / blck, "n_blocks": n_el // blck, "blocks_per_row": ne0 // blck,
            "row_size": row, "n_rows": n_el // ne0 if ne0 else 0, "block_fields": block_fields(ti.type)}


def _fmt_size(n: int) -> str:
    for unit, k in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def plot_gguf_map(gf, selected: str | None = None, fig=None, gid_prefix: str = "", label_kv: int = 6,
                  label_tensors: int = 10, sel_labels=()):
    """The file as two bars: to scale (top), and piecewise-log with every range drawn (bottom).

    ``selected``: a tensor name (its info record and its data are outlined in red) or ``"kv:<key>"``.
    Each range's patch has gid ``gid_prefix + "r<index in layout>"`` (for click handling in SVG).
    ``sel_labels``: ranges whose red selection label is drawn too, each as the SVG group ``gid_prefix +
    "lab<index>"`` (its leader line ``"labl<index>"``), for a page to hide and show by CSS (the book's map is drawn
    once, with no selection: its frames' CSS shows the selected range's label).
    Returns the Figure.
    """

    lay = gf.layout()
    secs = sections(gf)
    if fig is None:
        fig = plt.figure(figsize=(14, 6.4))
    ax1, ax2 = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1, 1.6], "hspace": 1.0})
    _draw_to_scale(ax1, gf, secs)
    # ---- bottom: piecewise
    x0, w, spans = map_positions(lay)
    groups = _layer_groups(lay, x0, w)
    sel_idx = _draw_ranges(ax2, lay, x0, w, selected, gid_prefix)
    _draw_layer_groups(ax2, groups)
    for i in sel_idx:
        ax2.add_patch(Rectangle((x0[i], -0.06), max(w[i], 0.002), 1.12, facecolor="#d50000", alpha=0.35,
                                edgecolor="#d50000", linewidth=2.0, zorder=5))
        ax2.plot([x0[i] + w[i] / 2], [1.1], marker="v", color="#d50000", markersize=11, zorder=6, clip_on=False)
    ax2.set_xlim(0, 1)
    ax2.set_ylim(-0.1, 1.1)
    ax2.set_yticks([])
    ax2.set_xticks([])
    _draw_section_marks(ax2, lay, x0, spans, gf.file_size)
    # labels under the bar: the biggest KVs and tensors, and the selection
    kv_idx = sorted([i for i, r in enumerate(lay) if r["kind"] == "kv"],
                    key=lambda i: -(lay[i]["end"] - lay[i]["start"]))
    td_idx = sorted([i for i, r in enumerate(lay) if r["kind"] == "tensor_data"],
                    key=lambda i: -(lay[i]["end"] - lay[i]["start"]))
    lab = sorted(set(kv_idx[:label_kv] + td_idx[:label_tensors] + sel_idx))
    _draw_range_labels(ax2, fig, lay, x0, w, lab, sel_idx)
    for i in sel_labels:
        _draw_sel_label(ax2, fig, lay, x0, w, i, gid_prefix)
    al = gf.alignment
    ax2.set_title(f"every byte range ({len(lay)}: 1 header, {gf.n_kv} KV pairs, {gf.n_tensors} tensor infos, "
                  f"{gf.n_tensors} tensor data) on a piecewise axis: each section gets a fixed share, each range a "
                  f"width ∝ log(bytes)\ndata section at offset {gf.data_offset} = {gf.data_offset // al} × {al} "
                  f"(general.alignment = {al}); every tensor's offset is a multiple of {al}; small numbers: start "
                  f"offsets", fontsize=10,
                  loc="left", pad=44)
    for sp in ("top", "right", "left", "bottom"):
        ax2.spines[sp].set_visible(False)
    types = sorted({r["type"] for r in lay if r["kind"] == "tensor_data"})
    handles = [Patch(facecolor=SECTION_COLORS[k], edgecolor="#424242", label=SECTION_NAMES[k])
               for k in SECTION_ORDER if k != "tensor_data" and any(s["section"] == k for s in secs)]
    handles += [Patch(facecolor=TYPE_COLORS.get(t, SECTION_COLORS["tensor_data"]), edgecolor="#424242",
                      label=f"data: {t}") for t in types]
    ax2.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9.5, frameon=False)
    return fig


# The phases of ``plot_gguf_map``, in the order they draw.

def _draw_to_scale(ax1, gf, secs):
    """The top bar: the sections to scale, so the reader sees the file is almost all tensor data; the small
    sections are named in the title (they are a sliver)."""
    size = gf.file_size
    for s in secs:
        ax1.add_patch(Rectangle((s["start"] / size, 0), s["size"] / size, 1, facecolor=SECTION_COLORS[s["section"]],
                                edgecolor="#424242", linewidth=0.5))
    ax1.set_xlim(0, 1)
    ax1.set_ylim(0, 1)
    ax1.set_yticks([])
    ax1.set_xticks(np.linspace(0, 1, 6))
    ax1.set_xticklabels([_fmt_size(int(round(v * size))) for v in np.linspace(0, 1, 6)], fontsize=9.5)
    small = [s for s in secs if s["size"] / size <= 0.04]
    data_pct = 100 * sum(s["size"] for s in secs if s["section"] == "tensor_data") / size
    ax1.set_title(f"{gf.path.rsplit('/', 1)[-1]}: {_fmt_size(size)} drawn to scale — tensor data is {data_pct:.1f}% "
                  f"of the file\n" + ", ".join(f"{SECTION_NAMES[s['section']]} {_fmt_size(s['size'])}" for s in small)
                  + " are the thin sliver at the left edge", fontsize=10.5, loc="left")
    for s in secs:
        if s["size"] / size > 0.04:
            ax1.text((s["start"] + s["size"] / 2) / size, 0.5, f"{SECTION_NAMES[s['section']]}\n{_fmt_size(s['size'])}",
                     ha="center", va="center", fontsize=10)
    for sp in ("top", "right", "left"):
        ax1.spines[sp].set_visible(False)


def _layer_groups(lay, x0, w) -> dict:
    """{(kind, layer): (x from, x to)}: the 272 tensor infos / data ranges would draw as a barcode of thin stripes,
    so inside a layer's group of tensors (blk.N.*) they get no edges and no alternating shades; each group is
    outlined and numbered instead."""
    groups: dict = {}
    for i, r in enumerate(lay):
        m = _BLK.match(r.get("name") or "") if r["kind"] in ("tensor_info", "tensor_data") else None
        if m:
            a, b = groups.get((r["kind"], int(m.group(1))), (x0[i], x0[i] + w[i]))
            groups[(r["kind"], int(m.group(1)))] = (min(a, x0[i]), max(b, x0[i] + w[i]))
    return groups


def _draw_ranges(ax2, lay, x0, w, selected, gid_prefix: str) -> list:
    """Every byte range on the piecewise bar (gid ``gid_prefix + r<i>``, for clicks); returns the selected ones."""
    sel_idx = []
    for i, r in enumerate(lay):
        k = r["kind"]
        fc = TYPE_COLORS.get(r.get("type", ""), SECTION_COLORS[k]) if k == "tensor_data" else SECTION_COLORS[k]
        grouped = k in ("tensor_info", "tensor_data") and _BLK.match(r.get("name") or "")
        if w[i] < 0.004 and i % 2 and not grouped:     # dense sections: alternate shades instead of edges
            fc = tuple(0.72 * np.asarray(matplotlib.colors.to_rgb(fc)) + 0.28)
        is_sel = selected is not None and (r.get("name") == selected or (k == "kv" and selected == f"kv:{r['key']}"))
        if is_sel:
            sel_idx.append(i)
        p = Rectangle((x0[i], 0), w[i], 1, facecolor=fc,
                      edgecolor="#424242" if w[i] >= 0.004 and not grouped else "none", linewidth=0.3)
        p.set_gid(f"{gid_prefix}r{i}")
        ax2.add_patch(p)
    return sel_idx


def _draw_layer_groups(ax2, groups: dict):
    for (k, il), (a, b) in groups.items():
        ax2.add_patch(Rectangle((a, 0), b - a, 1, facecolor="none", edgecolor="#263238", linewidth=0.7, zorder=3))
        if il % 5 == 0 or b - a > 0.02:
            ax2.text((a + b) / 2, 0.5, str(il), ha="center", va="center", fontsize=9.5, color="#263238", zorder=4,
                     rotation=90 if b - a < 0.012 else 0)
    if groups:
        ax2.text(1.0, -0.05, "boxes: the tensors of one layer (blk.N); the file orders them by name: blk.0, blk.1, "
                 "blk.10 … blk.19, blk.2, …", ha="right", va="top", fontsize=9.5, color="#546e7a", style="italic")


def _draw_section_marks(ax2, lay, x0, spans, size: int):
    """Section names and their real start offsets above the piecewise bar (its x axis is not to scale)."""
    for g, (a, b) in spans.items():
        first = min(i for i, r in enumerate(lay) if abs(x0[i] - a) < 1e-12)
        ax2.text((a + b) / 2, 1.36, f"{SECTION_NAMES.get(g, g)}", ha="center", va="bottom", fontsize=10.5,
                 fontweight="bold", color="#37474f")
        ax2.text(a + 0.002, 1.13, f"{lay[first]['start']}", ha="left", va="bottom", fontsize=9.5, color="#37474f")
        ax2.plot([a, a], [0, 1.3], color="#37474f", linewidth=1.4, clip_on=False)
    ax2.text(1.0, 1.13, f"{size}", ha="right", va="bottom", fontsize=9.5, color="#37474f")


def _label_text(r) -> str:
    txt = (r.get("key") or r.get("name") or r["label"])
    txt = txt if len(txt) <= 30 else txt[:29] + "…"
    return txt + f" ({_fmt_size(r['end'] - r['start'])})"


def _label_place(fig, xc, txt):
    """(x of the label's centre, half its width) in axis fractions: centred under its range, kept inside the axis."""
    char_w = LABEL_PT * 0.6 / (fig.get_figwidth() * 72 * 0.8)           # one LABEL_PT character, as a fraction of the axis
    half = len(txt) * char_w / 2 + 0.004
    return min(max(xc, half), 1 - half), half


def _draw_sel_label(ax2, fig, lay, x0, w, i, gid_prefix):
    """Range ``i``'s selection label where the live map puts it (the first row: the selection is placed first),
    on white so that it covers the labels drawn there; grouped under ids for CSS to show (see plot_gguf_map)."""
    xc = x0[i] + w[i] / 2
    txt = _label_text(lay[i])
    xt, _ = _label_place(fig, xc, txt)
    y = -0.16
    ln, = ax2.plot([xc, xc, xt], [0, y + 0.08, y + 0.02], color="#d50000", linewidth=0.6, clip_on=False, zorder=7)
    ln.set_gid(f"{gid_prefix}labl{i}")
    ax2.text(xt, y, txt, ha="center", va="top", fontsize=LABEL_PT, color="#d50000", fontweight="bold", zorder=7,
             gid=f"{gid_prefix}lab{i}", bbox=dict(facecolor="white", edgecolor="none", pad=1.0))


def _draw_range_labels(ax2, fig, lay, x0, w, lab, sel_idx):
    """Horizontal labels in rows under the bar, each joined to its range by a leader line; a label goes to the
    first row where it overlaps no other (widths estimated from the text length), none left if all rows are full."""
    rows: list = [[] for _ in range(4)]
    for i in sorted(lab, key=lambda i: (i not in sel_idx, i)):      # the selection first, then left to right
        xc = x0[i] + w[i] / 2
        txt = _label_text(lay[i])
        xt, half = _label_place(fig, xc, txt)
        row = next((k for k, used in enumerate(rows) if all(xt + half < a or xt - half > b for a, b in used)), None)
        if row is None:
            continue
        rows[row].append((xt - half, xt + half))
        y = -0.16 - 0.2 * row
        sel = i in sel_idx
        ax2.plot([xc, xc, xt], [0, y + 0.08, y + 0.02], color="#d50000" if sel else "#90a4ae", linewidth=0.6,
                 clip_on=False)
        ax2.text(xt, y, txt, ha="center", va="top", fontsize=LABEL_PT, color="#d50000" if sel else "#212121",
                 fontweight="bold" if sel else "normal")
