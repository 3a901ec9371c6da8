"""Views of a running llama model: KV cache and mask, attention per head, the sampler chain, BPE merges.

Everything is recorded from a real ``ggviz.llama`` run by ``ggviz.capture``, never recomputed:

- ``DecodeSnapshot`` (``capture.capture_inputs(ctx)``: what the context wrote into the graph's inputs just before
  each compute, and the KV cells): ``kv_cache_figure(snapshot)`` draws the cells and the mask; ``KVCacheView`` steps
  through snapshots.
- ``AttentionRecord`` (``capture.capture_attention(ctx, tokens)``: the ``kq_soft_max-<il>`` nodes copied by the eval
  callback): ``attention_figure(rec, layer)`` draws one heatmap per head; ``AttentionView`` has a layer slider.
- ``sampler_figure(chain.history)``: the candidates that survive each sampler of a chain (logits -> top-k -> ... ->
  selected token, with the random draw of ``dist``) as bar charts; ``sampler_stage_table`` / ``sampler_tables_html``
  the same as one table per stage (logit, llama.cpp's ``p``, the probability if drawn now); ``SamplerView``.
- ``bpe_table(vocab, word)`` / ``BPEView``: the merges BPE made on each word of a prompt (``Vocab.bpe_trace``);
  for a SentencePiece vocabulary (Gemma-3) ``spm_table`` / the same view: the merges by score (``Vocab.spm_session``).
"""
from __future__ import annotations


import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

from ..capture.inputs import AttentionRecord, DecodeSnapshot
from ..capture.inputs import token_label as _label
from ..capture.inputs import token_piece as _piece
from .table import Table
from .widgets._base import VizWidget, esc, fig_to_png, html_table, png_img


# ------------------------------------------------------------------------------------------------------- KV cache

def _cache_name(snap: DecodeSnapshot) -> str:
    """How a figure names the cache of ``snap``: "" for a model with one cache."""
    if not snap.cache:
        return ""
    ls = snap.layers
    which = f"layers {ls}" if len(ls) <= 4 else f"{len(ls)} layers"
    window = f", window {snap.n_swa} positions" if snap.n_swa else ""
    return f"{snap.cache} cache ({which}{window}): "


def _draw_cache(ax1, ax2, snap: DecodeSnapshot, vocab, nc: int, title: str | None):
    """The cells of one cache on ``ax1``, its KQ mask on ``ax2``."""
    nt = snap.n_tokens
    for c in range(nc):
        p = int(snap.cells_pos[c])
        ax1.add_patch(Rectangle((c, 0), 1, 1, facecolor="#a5d6a7" if p >= 0 else "#f5f5f5", edgecolor="#757575",
                                linewidth=0.6))
        ax1.text(c + 0.5, 0.5, str(p) if p >= 0 else "·", ha="center", va="center", fontsize=9)
    for c in snap.k_idxs:
        if c < nc:
            ax1.add_patch(Rectangle((c, 0), 1, 1, fill=False, edgecolor="#d50000", linewidth=2.2))
    ax1.set_xlim(0, nc)
    ax1.set_ylim(0, 1)
    ax1.set_yticks([])
    ax1.set_xticks(np.arange(nc) + 0.5)
    ax1.set_xticklabels([str(c) for c in range(nc)], fontsize=7)
    ax1.set_title(title or f"{_cache_name(snap)}KV cells 0..{nc - 1} of {snap.kv_size} (number = position stored; "
                           f"red = written by this ubatch of {nt} tokens); n_kv = {snap.n_kv} cells attended",
                  fontsize=10, loc="left")
    m = np.isfinite(snap.kq_mask[:, :nc]).astype(float)
    ax2.imshow(m, cmap=ListedColormap(["#37474f", "#c8e6c9"]), vmin=0, vmax=1, aspect="auto",
               extent=(0, nc, nt, 0))
    for r in range(nt):
        for c in range(nc):
            ax2.text(c + 0.5, r + 0.5, "0" if m[r, c] else "-∞", ha="center", va="center", fontsize=7,
                     color="#212121" if m[r, c] else "#eceff1")
    ax2.set_xticks(np.arange(nc) + 0.5)
    ax2.set_xticklabels([str(c) for c in range(nc)], fontsize=7)
    ax2.set_yticks(np.arange(nt) + 0.5)
    labels = [f"pos {int(p)}" + (f"  {_label(vocab, t)}" if vocab is not None else "")
              for p, t in zip(snap.pos, snap.tokens)]
    ax2.set_yticklabels(labels, fontsize=8)
    ax2.set_xlabel("KV cell", fontsize=9)
    if snap.cache == "SWA":
        what = f"a token sees the cells whose position is ≤ its own and > its own - {snap.n_swa}"
    else:
        what = "a token sees the cells whose position is ≤ its own"
    ax2.set_title(f"{_cache_name(snap)}kq_mask: added to KQ before softmax; {what}", fontsize=10, loc="left")


def kv_cache_figure(snap: DecodeSnapshot, vocab=None, max_cells: int | None = None, title: str | None = None):
    """Top: the KV cells (position stored in each, the cells this ubatch writes outlined); bottom: the KQ mask,
    one row per token of the ubatch, one column per cell of the attended window n_kv (green: may attend).
    An iSWA snapshot (``snap.swa``) draws both caches, base then SWA, each with its own cells, n_kv and mask."""

    parts = [snap] + ([snap.swa] if snap.swa is not None else [])
    ncs = []
    for sn in parts:
        used = int(np.max(np.nonzero(sn.cells_pos >= 0)[0], initial=-1)) + 1
        ncs.append(max_cells or min(sn.n_kv, max(16, used + 4)))
    nt = snap.n_tokens
    ratios = []
    for _ in parts:
        ratios += [0.45, max(0.9, 0.36 * nt)]
    fig, axes = plt.subplots(2 * len(parts), 1, figsize=(min(16, max(12 if snap.cache else 0, 2.5 + 0.42 * max(ncs))),
                                                         len(parts) * (1.9 + 0.36 * nt + 0.6)),
                             gridspec_kw={"height_ratios": ratios})
    for k, (sn, nc) in enumerate(zip(parts, ncs)):
        _draw_cache(axes[2 * k], axes[2 * k + 1], sn, vocab, nc,
                    (f"{_cache_name(sn)}{title}" if sn.cache and title else title))
    fig.tight_layout()
    return fig


class KVCacheView(VizWidget):
    """Step through recorded ``DecodeSnapshot``s (prompt, then each generated token)."""

    def __init__(self, snapshots, vocab=None):
        self.snaps = list(snapshots)
        if not self.snaps:
            raise ValueError("no snapshot recorded (decode inside `with capture_inputs(ctx) as snaps:`)")
        self.vocab = vocab
        self.pos = len(self.snaps) - 1

    def goto(self, k: int):
        self.pos = int(np.clip(k, 0, len(self.snaps) - 1))
        self._changed()
        return self

    def state(self) -> dict:
        s = self.snaps[self.pos]
        return {"snapshot": self.pos, "n_snapshots": len(self.snaps), "n_tokens": s.n_tokens, "n_kv": s.n_kv,
                "tokens": s.tokens.tolist(), "pos": s.pos.tolist(), "cells_pos": s.cells_pos[:s.n_kv].tolist(),
                "written_cells": s.k_idxs.tolist(), "mask_allowed": np.isfinite(s.kq_mask).tolist(),
                "n_used": int((s.cells_pos >= 0).sum()), "cache": s.cache, "layers": list(s.layers),
                "swa": None if s.swa is None else {
                    "n_kv": s.swa.n_kv, "kv_size": s.swa.kv_size, "n_swa": s.swa.n_swa, "layers": list(s.swa.layers),
                    "cells_pos": s.swa.cells_pos[:s.swa.n_kv].tolist(), "written_cells": s.swa.k_idxs.tolist(),
                    "mask_allowed": np.isfinite(s.swa.kq_mask).tolist(), "n_used": int((s.swa.cells_pos >= 0).sum())}}

    def figure(self):
        return kv_cache_figure(self.snaps[self.pos], self.vocab)

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%")

    def _build(self):

        self._w = W.IntSlider(value=self.pos, min=0, max=len(self.snaps) - 1, description="ubatch")
        self._w.observe(lambda ch: self.goto(ch["new"]), "value")
        self._img = W.HTML()
        return W.VBox([self._w, self._img])

    def _refresh(self):
        self._img.value = self.to_html()


# ------------------------------------------------------------------------------------------------------ attention

def attention_figure(rec: AttentionRecord, layer: int, heads=None, cols: int = 3):
    """One heatmap per head of layer ``layer``: rows = query tokens, columns = the KV cells that hold a token
    (labelled with that token), colour = softmax weight."""

    a = rec.layers[layer]
    n_head = a.shape[0]
    heads = list(range(n_head)) if heads is None else list(heads)
    used = np.nonzero(rec.cells_pos >= 0)[0] if rec.cells_pos is not None else np.arange(a.shape[2])
    nc = int(used.max()) + 1 if len(used) else a.shape[2]
    rows = -(-len(heads) // cols)
    nt = a.shape[1]
    cell_piece = {}
    for p, piece in zip(rec.pos, rec.pieces):
        for c in np.nonzero(rec.cells_pos == p)[0]:
            cell_piece[int(c)] = piece
    fig, axs = plt.subplots(rows, cols, figsize=(4.6 * cols, 0.8 + rows * (2.0 + 0.36 * max(nt, 4))), squeeze=False,
                            constrained_layout=True)
    for k, ax in enumerate(axs.flat):
        if k >= len(heads):
            ax.set_axis_off()
            continue
        h = heads[k]
        im = ax.imshow(a[h, :, :nc], cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set_title(f"head {h}", fontsize=10)
        ax.set_yticks(range(nt))
        ax.set_yticklabels(rec.pieces[-nt:] if len(rec.pieces) >= nt else range(nt), fontsize=8)
        ax.set_xticks(range(nc))
        ax.set_xticklabels([cell_piece.get(c, str(c)) for c in range(nc)], rotation=60, ha="right", fontsize=8)
        if nt * nc <= 120:
            for r in range(nt):
                for c in range(nc):
                    v = a[h, r, c]
                    if v >= 0.005:
                        ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=6.5,
                                color="white" if v < 0.6 else "black")
    fig.colorbar(im, ax=axs, shrink=0.6, label="attention weight (softmax of masked KQ)")
    fig.suptitle(f"layer {layer}: kq_soft_max-{layer}, {n_head} heads (rows: query token, columns: KV cell "
                 f"holding that key)", fontsize=11)
    return fig


class AttentionView(VizWidget):
    """Attention weights per head, one layer at a time (``select(layer, head=None)``)."""

    def __init__(self, rec: AttentionRecord, layer: int | None = None):
        if not rec.layers:
            raise ValueError("the record holds no layer")
        self.rec = rec
        self.layer = min(rec.layers) if layer is None else int(layer)
        self.head = None

    def select(self, layer: int, head: int | None = None):
        if int(layer) not in self.rec.layers:
            raise KeyError(f"layer {layer} was not recorded")
        self.layer, self.head = int(layer), head
        self._changed()
        return self

    def state(self) -> dict:
        a = self.rec.layers[self.layer]
        return {"layer": self.layer, "head": self.head, "n_head": a.shape[0], "n_tokens": a.shape[1],
                "n_kv": a.shape[2], "tokens": self.rec.tokens, "pieces": self.rec.pieces,
                "weights": (a if self.head is None else a[self.head]).tolist(),
                "row_sums": a.sum(axis=-1).tolist()}

    def figure(self):
        return attention_figure(self.rec, self.layer, None if self.head is None else [self.head],
                                cols=3 if self.head is None else 1)

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%")

    def _build(self):

        ls = sorted(self.rec.layers)
        self._w_l = W.SelectionSlider(options=ls, value=self.layer, description="layer", continuous_update=False)
        n_head = self.rec.layers[self.layer].shape[0]
        self._w_h = W.Dropdown(options=[("all heads", -1)] + [(f"head {h}", h) for h in range(n_head)], value=-1,
                               description="head")
        self._w_l.observe(lambda ch: self.select(ch["new"], self.head), "value")
        self._w_h.observe(lambda ch: self.select(self.layer, None if ch["new"] < 0 else ch["new"]), "value")
        self._img = W.HTML()
        return W.VBox([W.HBox([self._w_l, self._w_h]), self._img])

    def _refresh(self):
        self._img.value = self.to_html()


# ------------------------------------------------------------------------------------------------------- sampling

def _stage_cands(h: dict) -> list:
    """The candidates an entry of ``SamplerChain.history`` kept (older histories: ``top`` = [(id, logit)])."""
    if "cands" in h:
        return list(h["cands"])
    return [{"id": t, "logit": v, "p": None, "prob": None} for t, v in h.get("top", [])]


def _stage_title(h: dict, n_vocab=None) -> str:
    params = h.get("params") or {}
    ps = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
    name = "candidates in" if h["step"] == "logits" else f"after {h['step']}" + (f" ({ps})" if ps else "")
    of = f" of {n_vocab}" if n_vocab else ""
    surv = f"{h['n']}{of} candidates" + ("" if h["step"] == "logits" else " survive")
    if h.get("n_finite") is not None and h["n_finite"] != h["n"]:
        surv += f" ({h['n_finite']} with a finite logit)"
    return f"{name}\n{surv}"


def _draw_text(h: dict) -> str:
    d = h.get("draw")
    if not d:
        return ""
    # llama.cpp's dist walks the candidate array in its current order: by logit after a sorting sampler (top-k ...),
    # in token-id order otherwise; the running sum is over that order
    where = (f"at rank {d['rank']}" if d.get("sorted", True) or "index" not in d
             else f"at array position {d['index']} (token-id order; rank {d['rank']} by logit)")
    return (f"draw u = {d['u']:.4f}: the target u·Σp = {d['target']:.4f} is reached {where} "
            f"(cumulative p {d['cum_before']:.4f} → {d['cum_at']:.4f})")


def sampler_figure(history, vocab=None, title: str | None = None, show: int = 12):
    """The sampler chain as one grid: a row per candidate (the best ``show`` by logit as they came in, and the
    selected token), a column per entry of ``SamplerChain.history`` (logits, then each sampler). A cell holds the
    probability the candidate would have if the chain drew now (softmax over that stage's survivors; colour bar);
    a red ✗ marks the stage that removed it, grey the stages after. Column heads say how many candidates survive
    and how many the stage removed; the selected token is outlined in red, and the random draw of ``dist`` is
    written under the grid. (Six bar charts of the same candidates looked alike: the grid shows what changed.)"""

    hist = list(history)
    if not hist:
        raise ValueError("empty sampler history: sample a token first (llama.sampler_sample)")
    sel = next((h.get("selected") for h in reversed(hist) if h.get("selected") is not None), None)
    n_vocab = hist[0]["n"] if hist[0].get("step") == "logits" else None
    first = _stage_cands(hist[0])
    order = {c["id"]: r for r, c in enumerate(first)}         # rank by logit as the candidates came in
    # rows: the best candidates, and the ones on each side of every cut a stage made (what it removed), as far as
    # the history recorded them; in rank order
    ranks = set(range(min(show, len(first))))
    for j in range(1, len(hist)):
        cut = hist[j]["n"]
        if cut < hist[j - 1]["n"]:
            ranks |= {r for r in (cut - 1, cut, cut + 1) if 0 <= r < len(first)}
    ids = [first[r]["id"] for r in sorted(ranks)]
    if sel is not None and sel not in ids:
        ids.append(sel)
    S, R = len(hist), len(ids)
    prob = np.full((R, S), np.nan)
    state = np.zeros((R, S), np.int8)          # 0 kept (recorded), 1 removed by this stage, 2 removed earlier, 3 kept
    for j, h in enumerate(hist):
        by = {c["id"]: c for c in _stage_cands(h)}
        for r, t in enumerate(ids):
            if t in by:
                pr = by[t].get("prob")
                prob[r, j] = np.nan if pr is None else pr
            elif order.get(t, 1 << 30) < h["n"] and (j == 0 or state[r, j - 1] in (0, 3)):
                # the filters keep the best by logit (temp keeps the order): ranked inside the survivors, but
                # beyond the history's best history_k
                state[r, j] = 3
            else:
                state[r, j] = 2 if j > 0 and state[r, j - 1] in (1, 2) else 1
    fig, ax = plt.subplots(figsize=(2.4 + 1.55 * S, 1.6 + 0.36 * R))
    fin = prob[np.isfinite(prob)]
    vmax = float(fin.max()) if fin.size else 1.0
    im = ax.imshow(np.ma.masked_invalid(prob), cmap="Blues", vmin=0.0, vmax=vmax, aspect="auto",
                   interpolation="nearest")
    cb = fig.colorbar(im, ax=ax, fraction=0.035, pad=0.02)
    cb.set_label("probability if drawn now (softmax over the stage's survivors)", fontsize=8)
    cb.ax.tick_params(labelsize=7)
    for r in range(R):
        for j in range(S):
            st = state[r, j]
            if st == 1:
                ax.add_patch(Rectangle((j - 0.5, r - 0.5), 1, 1, facecolor="#ffebee", edgecolor="none"))
                ax.text(j, r, "✗ removed", ha="center", va="center", fontsize=7.5, color="#c62828")
            elif st == 2:
                ax.add_patch(Rectangle((j - 0.5, r - 0.5), 1, 1, facecolor="#eeeeee", edgecolor="none"))
            elif st == 3:
                ax.text(j, r, "kept", ha="center", va="center", fontsize=7, color="#546e7a")
            elif np.isfinite(prob[r, j]):
                v = prob[r, j]
                ax.text(j, r, f"{v:.3f}", ha="center", va="center", fontsize=7.5,
                        color="white" if v > 0.6 * vmax else "#212121")
    heads = []
    for j, h in enumerate(hist):
        params = h.get("params") or {}
        ps = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
        if h["step"] == "logits":
            heads.append(f"logits\n{h['n']}" + (f" of {n_vocab}" if n_vocab else "") + " in")
        else:
            gone = hist[j - 1]["n"] - h["n"] if j else 0
            heads.append(f"{h['step']}" + (f"\n{ps}" if ps else "") + f"\n{h['n']} kept"
                         + (f", −{gone}" if gone else ", none removed"))
    ax.set_xticks(range(S))
    ax.set_xticklabels(heads, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(R))
    ax.set_yticklabels([(f"#{order[t]}  " if t in order else "") + (_label(vocab, t) if vocab is not None else str(t))
                        + f"  ({t})" for t in ids], fontsize=8)
    for lab, t in zip(ax.get_yticklabels(), ids):
        if t == sel:
            lab.set_color("#d50000")
            lab.set_fontweight("bold")
    if sel is not None:
        r = ids.index(sel)
        ax.add_patch(Rectangle((-0.5, r - 0.5), S, 1, facecolor="none", edgecolor="#d50000", linewidth=2.0))
    ax.set_xticks(np.arange(-0.5, S, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, R, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    more = (hist[0]["n"] - len(ids)) if hist[0]["n"] > len(ids) else 0
    notes = ["rows (#rank by logit as they came in): the best candidates and those on each side of a stage's cut"
             + (f"; {more} more not shown" if more else "")]
    dt = next((_draw_text(h) for h in hist if _draw_text(h)), "")
    if dt:
        notes.append(dt)
    ax.set_xlabel("\n".join(notes), fontsize=8)
    ax.set_title(title or ("sampler chain: what each stage kept and removed" +
                           (f" → selected {_label(vocab, sel) if vocab is not None else sel} ({sel})"
                            if sel is not None else "")), fontsize=11, pad=12)
    fig.tight_layout()
    return fig


def sampler_stage_table(h: dict, vocab=None) -> Table:
    """One stage of ``SamplerChain.history`` as a table: the kept survivors, best logit first, with the logit and
    ``p`` as the candidate array holds them after the stage, the probability if drawn now, and its running sum."""
    rows = []
    cum = 0.0
    for r, c in enumerate(_stage_cands(h)):
        pr = c.get("prob")
        cum = cum + pr if pr is not None else None
        rows.append({"rank": r, "id": c["id"], "piece": _piece(vocab, c["id"]) if vocab is not None else "",
                     "logit": c["logit"], "p (array)": c.get("p") if h.get("p_valid") else None,
                     "prob if drawn now": pr, "cum prob": cum,
                     "": "◀ selected" if c["id"] == h.get("selected") else ""})
    title = _stage_title(h).replace("\n", ": ")
    kept = len(rows)
    if kept < h["n"]:
        title += f" (the best {kept} shown)"
    dt = _draw_text(h)
    if dt:
        title += "; " + dt
    return Table(rows, ["rank", "id", "piece", "logit", "p (array)", "prob if drawn now", "cum prob", ""],
                 title=title)


def sampler_tables_html(history, vocab=None) -> str:
    """Every stage of ``SamplerChain.history`` as an HTML table (``sampler_stage_table``)."""
    return "".join(html_table(sampler_stage_table(h, vocab)) + "<br/>" for h in history)


class SamplerView(VizWidget):
    """The chain's last run (``SamplerChain.history``): logits → each sampler → chosen token, as bar charts and one
    table per stage. ``select(k)`` picks the stage whose table ``stage_html`` shows; ``state()`` is the history
    with the token pieces."""

    def __init__(self, chain_or_history, vocab=None):
        self.history = [dict(h) for h in getattr(chain_or_history, "history", chain_or_history)]
        self.vocab = vocab
        self.stage = len(self.history) - 1

    def select(self, k: int):
        if not -len(self.history) <= k < len(self.history):
            raise IndexError(f"stage {k} out of range ({len(self.history)} stages)")
        self.stage = k % len(self.history)
        self._changed()
        return self

    def state(self) -> dict:
        sel = next((h.get("selected") for h in reversed(self.history) if h.get("selected") is not None), None)
        piece = (lambda t: _piece(self.vocab, t)) if self.vocab is not None else (lambda t: None)
        stages = [{"step": h["step"], "params": dict(h.get("params") or {}), "n": h["n"],
                   "n_finite": h.get("n_finite"), "p_valid": h.get("p_valid"), "selected": h.get("selected"),
                   "draw": h.get("draw"), "cands": [dict(c, piece=piece(c["id"])) for c in _stage_cands(h)]}
                  for h in self.history]
        return {"steps": [h["step"] for h in self.history], "n": [h["n"] for h in self.history],
                "top": [h["top"] for h in self.history], "selected": sel,
                "selected_piece": _piece(self.vocab, sel) if (self.vocab is not None and sel is not None) else None,
                "stage": self.stage, "stages": stages}

    def figure(self):
        return sampler_figure(self.history, self.vocab)

    def stage_html(self, k: int | None = None) -> str:
        return html_table(sampler_stage_table(self.history[self.stage if k is None else k], self.vocab))

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + sampler_tables_html(self.history, self.vocab)

    def _build(self):

        self._img = W.HTML()
        self._w = W.Dropdown(options=[(f"{k}: {h['step']}", k) for k, h in enumerate(self.history)],
                             value=self.stage, description="stage")
        self._w.observe(lambda ch: self.select(ch["new"]), "value")
        self._tab = W.HTML()
        return W.VBox([self._img, self._w, self._tab])

    def _refresh(self):
        if not self._img.value:
            self._img.value = png_img(fig_to_png(self.figure()), "max-width:100%")
        self._w.value = self.stage
        self._tab.value = self.stage_html()


# ------------------------------------------------------------------------------------------------------------ BPE

def bpe_table(vocab, word: str) -> Table:
    """The merges BPE performs on one pre-tokenized ``word`` (``Vocab.bpe_trace``), one row per merge."""
    tr = vocab.bpe_trace(word)
    rows = [{"step": m.step, "rank": m.rank, "merge": f"{m.left!r} + {m.right!r}", "merged": m.merged,
             "at": m.index, "symbols": " ".join(m.symbols)} for m in tr]
    return Table(rows, ["step", "rank", "merge", "merged", "at", "symbols"],
                 title=f"BPE of {word!r}: {len(rows)} merges (rank = line in tokenizer.ggml.merges)")


def _bytes_text(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


def spm_table(vocab, unit) -> Table:
    """The merges SentencePiece (``llm_tokenizer_spm_session``) performs on one fragment, one row per merge: the
    pair whose merged text is the token of highest score goes first (no merge list: the scores decide)."""
    tr = vocab.spm_trace_unit(unit)
    rows = [{"step": m.step, "score": round(float(m.score), 4), "merge": f"{_bytes_text(m.left)!r} + "
             f"{_bytes_text(m.right)!r}", "merged": _bytes_text(m.merged), "token": m.token,
             "symbols": " ".join(_bytes_text(x) for x in m.symbols)} for m in tr]
    return Table(rows, ["step", "score", "merge", "merged", "token", "symbols"],
                 title=f"SPM of {unit.encoded!r}: {len(rows)} merges (score = tokenizer.ggml.scores of the merged "
                       f"token; highest first)")


def merge_table(vocab, unit) -> Table:
    """The tokenizer's merges on one unit of ``vocab.tokenize_words``: BPE's (by rank) or SPM's (by score)."""
    if getattr(vocab, "type", "BPE") == "SPM":
        return spm_table(vocab, unit)
    return bpe_table(vocab, unit.text)


class BPEView(VizWidget):
    """A prompt split into words (pre-tokenizer) and each word's merges; ``select(k)`` picks word ``k``."""

    def __init__(self, vocab, text: str, add_special: bool = True, parse_special: bool = True):
        self.vocab = vocab
        self.text = text
        self.units = vocab.tokenize_words(text, add_special=add_special, parse_special=parse_special)
        self.words = [k for k, u in enumerate(self.units) if not u.special]
        self.sel = self.words[0] if self.words else 0

    def select(self, k: int):
        if not 0 <= k < len(self.units):
            raise IndexError(f"unit {k} out of range ({len(self.units)})")
        self.sel = int(k)
        self._changed()
        return self

    def state(self) -> dict:
        u = self.units[self.sel]
        merges = [] if u.special else [dict(r) for r in merge_table(self.vocab, u)]
        return {"tokenizer": getattr(self.vocab, "type", "BPE"), "units": [{"text": x.text, "encoded": x.encoded, "ids": list(x.ids), "special": x.special}
                          for x in self.units], "selected": self.sel, "word": u.text, "merges": merges,
                "ids": list(u.ids), "pieces": [_piece(self.vocab, t) for t in u.ids],
                "all_ids": [t for x in self.units for t in x.ids]}

    def words_html(self) -> str:
        chips = []
        for k, u in enumerate(self.units):
            bg = "#ffe082" if k == self.sel else ("#e0e0e0" if u.special else "#e3f2fd")
            toks = " | ".join(esc(_piece(self.vocab, t)) for t in u.ids)
            chips.append(f"<span style='display:inline-block;margin:2px;padding:3px 6px;background:{bg};"
                         f"border:1px solid #90a4ae;border-radius:4px;font-family:monospace'>{esc(repr(u.text))}"
                         f"<br/><span style='font-size:10px'>{toks} = {list(u.ids)}</span></span>")
        return "<div>" + "".join(chips) + "</div>"

    def to_html(self) -> str:
        st = self.state()
        u = self.units[self.sel]
        kind = st["tokenizer"]
        tab = (html_table(merge_table(self.vocab, u)) if not u.special
               else f"<i>special token: no {kind}</i>")
        return self.words_html() + tab

    def _build(self):

        self._w = W.Dropdown(options=[(repr(self.units[k].text), k) for k in range(len(self.units))],
                             value=self.sel, description="word")
        self._w.observe(lambda ch: self.select(ch["new"]), "value")
        self._html = W.HTML()
        return W.VBox([self._w, self._html])

    def _refresh(self):
        self._html.value = self.to_html()
