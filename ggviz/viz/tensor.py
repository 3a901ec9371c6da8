"""Tensors as memory: ``ne``/``nb`` strides, element addresses, and one quantized block byte by byte.

- ``strides_table(t)``: per dimension, ``ne[i]`` (elements) and ``nb[i]`` (bytes to step one index), as in ggml.h.
- ``element_offset(t, i0, i1, i2, i3)``: the byte offset of an element from ``t->data``: ``i0*nb0 + i1*nb1 + i2*nb2
  + i3*nb3`` (for block-quantized types, of the block holding element ``i0``: ``(i0/blck)*nb0``). This is the
  address arithmetic of ggml's kernels (``(char *) t->data + i1*nb1 + ...``).
- ``q4_0_block_figure(raw)``: the 18 bytes of a ``block_q4_0`` (ggml-common.h) and the 32 values they encode.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from ..ggml import consts as C
from ..ggml import quants
from ..ggml.tensor import Tensor, blck_size, is_contiguous, is_permuted, is_transposed, type_name, type_size
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
