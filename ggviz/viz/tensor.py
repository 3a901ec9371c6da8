"""Tensors as memory: ``ne``/``nb`` strides, element addresses, and one quantized block byte by byte.

- ``strides_table(t)``: per dimension, ``ne[i]`` (elements) and ``nb[i]`` (bytes to step one index), as in ggml.h.
- ``element_offset(t, i0, i1, i2, i3)``: the byte offset of an element from ``t->data``: ``i0*nb0 + i1*nb1 + i2*nb2
  + i3*nb3`` (for block-quantized types, of the block holding element ``i0``: ``(i0/blck)*nb0``). This is the
  address arithmetic of ggml's kernels (``(char *) t->data + i1*nb1 + ...``).
- ``q4_0_block_figure(raw)``: the 18 bytes of a ``block_q4_0`` (ggml-common.h) and the 32 values they encode.
- ``im2col_figure(col)``: a computed ``ggml_im2col`` of one image beside its input: which pixel went to which column.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from ..ggml import consts as C
from ..ggml import quants
from ..ggml.tensor import (
    Tensor,
    blck_size,
    get_data_f32,
    get_op_params_i32,
    is_contiguous,
    is_permuted,
    is_transposed,
    type_name,
    type_size,
)
from .table import Table


def strides_table(t: Tensor) -> Table:
    """One row per dimension: ne, nb, nb in elements (or blocks), and what stepping that index does."""
    ts, bs = type_size(t.type), blck_size(t.type)

    def unit(n):
        one, many = ("element", "elements") if bs == 1 else (f"block of {bs}", f"blocks of {bs}")
        return one if n == 1 else many

    rows = []
    for i in range(C.GGML_MAX_DIMS):
        ne, nb = int(t.ne[i]), int(t.nb[i])
        rows.append({"dim": i, "ne": ne, "nb": nb, "nb / type_size": nb / ts if nb % ts else nb // ts,
                     "meaning": f"i{i} + 1 moves {nb} bytes"
                     + (f" ({nb // ts} {unit(nb // ts)})" if nb % ts == 0 else "")})
    shape = "contiguous" if is_contiguous(t) else ("transposed" if is_transposed(t) else
                                                   ("permuted" if is_permuted(t) else "strided"))
    return Table(rows, ["dim", "ne", "nb", "nb / type_size", "meaning"],
                 title=f"{t.name or '(unnamed)'}: {type_name(t.type)}, type_size={ts}, blck_size={bs}, {shape}")


def element_offset(t: Tensor, i0: int = 0, i1: int = 0, i2: int = 0, i3: int = 0) -> int:
    """Byte offset from ``t->data`` of element (i0, i1, i2, i3): sum of index x stride.

    For quantized types the offset is that of the block containing element ``i0`` (blocks are the smallest
    addressable unit). Indices are checked against ``ne``.
    """
    idx = (i0, i1, i2, i3)
    for d, (i, n) in enumerate(zip(idx, t.shape)):
        if not 0 <= i < n:
            raise IndexError(f"index i{d}={i} out of range for ne[{d}]={n} of {t.name!r}")
    nb = t.strides
    return (i0 // blck_size(t.type)) * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]


def q4_0_block_figure(raw_block, x=None, fig=None):
    """Draw one ``block_q4_0``: 2 bytes of fp16 scale ``d`` and 16 bytes of packed 4-bit quants.

    Byte ``2 + j`` holds element ``j`` in its low nibble and element ``j + 16`` in its high nibble; element value =
    ``(nibble - 8) * d`` (``dequantize_row_q4_0``). If ``x`` (the 32 original floats) is given, the lower panel also
    shows them and the quantization error. Returns the matplotlib Figure.
    """


    raw = np.frombuffer(bytes(np.asarray(raw_block, dtype=np.uint8).reshape(-1)), dtype=np.uint8)
    blk = quants.decode_block(C.GGML_TYPE_Q4_0, raw)
    d, qs, q, vals = blk["d"], np.asarray(blk["qs"]), np.asarray(blk["quants"]), np.asarray(blk["values"])
    if fig is None:
        fig = plt.figure(figsize=(12, 5.2))
    ax1, ax2 = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1.1, 2]})

    # ---- top: the 18 bytes
    ax1.add_patch(Rectangle((0, 0), 2, 1, facecolor="#ffcc80", edgecolor="k"))
    ax1.text(1, 0.62, f"d (fp16)\n{raw[0]:02x} {raw[1]:02x}", ha="center", va="center", fontsize=8)
    ax1.text(1, 0.18, f"= {d:.6g}", ha="center", va="center", fontsize=8)
    for j in range(16):
        x0 = 2 + j
        ax1.add_patch(Rectangle((x0, 0.5), 1, 0.5, facecolor="#bbdefb", edgecolor="k", linewidth=0.6))
        ax1.add_patch(Rectangle((x0, 0), 1, 0.5, facecolor="#c8e6c9", edgecolor="k", linewidth=0.6))
        b = int(qs[j])
        ax1.text(x0 + 0.5, 0.75, f"hi {b >> 4:x}\n→x{j + 16}", ha="center", va="center", fontsize=6.5)
        ax1.text(x0 + 0.5, 0.25, f"lo {b & 15:x}\n→x{j}", ha="center", va="center", fontsize=6.5)
        ax1.text(x0 + 0.5, 1.08, f"{b:02x}", ha="center", va="bottom", fontsize=7, family="monospace")
    ax1.set_xlim(0, 18)
    ax1.set_ylim(0, 1.35)
    ax1.set_xticks(np.arange(18) + 0.5)
    ax1.set_xticklabels([str(i) for i in range(18)], fontsize=7)
    ax1.set_xlabel("byte of block_q4_0 (sizeof = 18): d, then qs[16]", fontsize=8)
    ax1.set_yticks([])
    for s in ("top", "right", "left"):
        ax1.spines[s].set_visible(False)
    ax1.set_title(f"block_q4_0: 32 values in 18 bytes = {18 * 8 / 32:.1f} bits per value", fontsize=10)

    # ---- bottom: the 32 decoded values
    idx = np.arange(32)
    ax2.bar(idx, vals, color=["#c8e6c9" if i < 16 else "#bbdefb" for i in idx], edgecolor="#424242",
            linewidth=0.5, label="decoded (q - 8) * d (green: x0–x15 from the low nibbles, blue: the high)")
    xv = None if x is None else np.asarray(x, dtype=np.float32).reshape(-1)
    for i in idx:
        # the label goes beyond both the bar's end and the original value's dot, so neither hides it
        up = vals[i] >= 0
        y = vals[i] if xv is None else (max(vals[i], xv[i]) if up else min(vals[i], xv[i]))
        ax2.annotate(f"{int(q[i])}", (i, y), xytext=(0, 3 if up else -3), textcoords="offset points",
                     ha="center", va="bottom" if up else "top", fontsize=7)
    ax2.margins(y=0.15)
    if xv is not None:
        ax2.plot(idx, xv, "o", color="#d32f2f", markersize=3.5, label="original x")
        err = np.abs(xv - vals)
        ax2.set_title(f"max |error| = {err.max():.4g}, mean |error| = {err.mean():.4g} (d/2 = {d / 2:.4g})",
                      fontsize=9)
    ax2.axhline(0, color="k", linewidth=0.5)
    ax2.set_xticks(idx)
    ax2.set_xticklabels([str(i) for i in idx], fontsize=6.5)
    ax2.set_xlabel("element (labels on bars: signed quant q - 8)", fontsize=8)
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)   # off the bars
    fig.tight_layout()
    return fig


def im2col_figure(col: Tensor, oh: int = 0, ow: int = 0, fig=None):
    """A computed 2-D ``ggml_im2col`` (F32 or F16) of one image (N = 1) whose pixels hold small integer labels: left,
    the image's channels with the kernel's window at output pixel (``oh``, ``ow``); right, the result, one row per
    output pixel (oh, ow) and one column per (channel, kh, kw), each cell the value copied there ("·" on white: the
    padding, where the kernel writes 0). Everything drawn is read from ``col`` (its values, op_params and sources)."""
    img_t, ker = col.src[1], col.src[0]
    s0, s1, p0, p1, d0, d1 = (get_op_params_i32(col, i) for i in range(6))
    KW, KH, IC = int(ker.ne[0]), int(ker.ne[1]), int(ker.ne[2])
    IW, IH = int(img_t.ne[0]), int(img_t.ne[1])
    OW, OH = int(col.ne[1]), int(col.ne[2])
    img = _values(img_t).reshape(-1, IC, IH, IW)[0]
    m = _values(col).reshape(-1, OH * OW, IC * KH * KW)[0]
    tint = ["#bbdefb", "#ffe0b2", "#c8e6c9", "#f8bbd0"]
    fig = fig or plt.figure(figsize=(12.5, 0.32 * OH * OW + 1.6))
    gs = fig.add_gridspec(1, 2, width_ratios=[1.05 * IC * IW / IH, IC * KH * KW / 4.5])
    ax0, ax1 = fig.add_subplot(gs[0]), fig.add_subplot(gs[1])
    for c in range(IC):                               # the channels side by side, a gap of one pixel between
        x0 = c * (IW + 1)
        for h in range(IH):
            for w in range(IW):
                ax0.add_patch(Rectangle((x0 + w, h), 1, 1, facecolor=tint[c % 4], edgecolor="white"))
                ax0.text(x0 + w + 0.5, h + 0.5, f"{img[c, h, w]:g}", ha="center", va="center", fontsize=8)
        for kh in range(KH):                          # the window of output pixel (oh, ow)
            for kw in range(KW):
                ih, iw = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
                ax0.add_patch(Rectangle((x0 + iw, ih), 1, 1, fill=False, edgecolor="#c62828", linewidth=2,
                                        clip_on=False))
        ax0.text(x0 + IW / 2, -0.4 - max(p1, 0), f"channel {c}", ha="center", va="bottom", fontsize=9)
    ax0.set_xlim(-0.5 - p0, IC * (IW + 1) - 0.5 + p0)
    ax0.set_ylim(IH + 0.5 + p1, -1.4 - p1)
    ax0.set_aspect("equal")
    ax0.axis("off")
    ax0.set_title(f"input b: ne = {list(img_t.shape)}; red: the kernel's window for output ({oh}, {ow})",
                  fontsize=9)
    for r in range(OH * OW):
        for j in range(IC * KH * KW):
            c, kh, kw = j // (KH * KW), (j % (KH * KW)) // KW, j % KW
            ih, iw = (r // OW) * s1 + kh * d1 - p1, (r % OW) * s0 + kw * d0 - p0
            inside = 0 <= ih < IH and 0 <= iw < IW          # outside: the padding, a 0 the kernel writes
            sel = r == oh * OW + ow
            ax1.add_patch(Rectangle((j, r), 1, 1, facecolor=tint[c % 4] if inside else "white",
                                    edgecolor="#c62828" if sel else "white", linewidth=1.5 if sel else 0.5))
            ax1.text(j + 0.5, r + 0.5, f"{m[r, j]:g}" if inside else "·", ha="center", va="center", fontsize=8)
    ax1.set_xlim(0, IC * KH * KW)
    ax1.set_ylim(OH * OW, 0)
    ax1.set_yticks(np.arange(OH * OW) + 0.5)
    ax1.set_yticklabels([f"({r // OW}, {r % OW})" for r in range(OH * OW)], fontsize=8)
    ax1.set_xticks(np.arange(IC * KH * KW) + 0.5)
    ax1.set_xticklabels([f"{(j % (KH * KW)) // KW},{j % KW}" for j in range(IC * KH * KW)], fontsize=8)
    ax1.tick_params(length=0)
    for sp in ax1.spines.values():
        sp.set_visible(False)
    ax1.set_ylabel("row = output pixel (oh, ow)", fontsize=9)
    ax1.set_xlabel("column = (kh, kw) within channel " + ", then ".join(str(c) for c in range(IC)), fontsize=9)
    def pair(x, y):
        return f"{x}" if x == y else f"({x}, {y})"
    ax1.set_title(f"ggml_im2col(a, b, s={pair(s0, s1)}, p={pair(p0, p1)}, d={pair(d0, d1)}): ne = {list(col.shape)} "
                  f"({type_name(col.type)}), {OH * OW} rows × {IC * KH * KW} columns", fontsize=9)
    fig.tight_layout()
    return fig


def _values(t: Tensor) -> np.ndarray:
    """A contiguous F32 or F16 tensor's values as float32, in memory order."""
    return np.asarray(get_data_f32(t), dtype=np.float32).reshape(-1)
