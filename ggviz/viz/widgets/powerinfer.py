"""PowerInfer's machinery as views of one real run: predictor vs truth, hot/cold neurons, skipped rows, the hybrid
timeline, what the sparsity costs and saves.

Not a C file: the views of ggviz's PowerInfer mirror (``ggviz.llama.powerinfer``: the PWRI model and
``llm_build_ffn_sparse``; ``ggviz.ggml.cpu.powerinfer``: MUL_MAT_SPARSE / AXPY; ``ggviz.ggml.cpu.hybrid``:
``ggml_graph_compute_thread_hybrid``). Everything shown is read from the engine's own records:

- ``SparseRun`` (``ggviz.capture.sparse.capture_sparse_run``): one llama_decode of a PWRI model, per layer the
  predictor's logits, the true activation ``silu(gate)·up``, the CPU half of the up projection, the FFN's inputs and
  output, and the layer's ``gpu_idx``, copied by the eval callback.
- ``PredictorView``: predictor logit vs |silu(g)·u| per layer; recall / rows skipped at a threshold.
- ``HotColdView``: activation counts sorted, the rows the solver put on the device, the hottest-quarter share.
- ``SkippedRowsView``: which rows each MUL_MAT_SPARSE skipped, per layer and token (sparse_idx < threshold, and the
  device's rows).
- ``HybridTimelineView``: ``graph_compute_hybrid``'s records (or ``hybrid.node`` trace events) as a device lane and
  a CPU lane, the waits on ``is_finish`` drawn; ``capture.hybrid_ffn_run`` makes such records from real layers.
- ``SparseCostView``: dense vs sparse FLOPs and weight bytes per token, the bytes crossing to the device, measured
  kernel times; says what the speed-up is and is not on a SwiGLU model.
"""
from __future__ import annotations


import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from ... import ggml
from ...capture.sparse import COMPUTED, ON_DEVICE, SKIPPED, SparseRun
from ._base import VizWidget, chart_with_cursor, esc, fig_to_png, frames_book, html_table, png_img, quiet

F32 = np.float32

# PowerInfer's own figure for its ReLU models (the paper's power-law observation), drawn for contrast: not measured
POWERINFER_HOT_FRACTION = 0.20
POWERINFER_HOT_SHARE = 0.80

LANE_GPU = "device (thread 0)"
LANE_CPU = "CPU (threads 1…N−1)"

_ROW_COLOURS = ListedColormap(["#e0e0e0", "#1f77b4", "#2ca02c"])


# ---------------------------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------------------------

def _check_layer(il, n_layer) -> int:
    il = int(il)
    if not 0 <= il < n_layer:
        raise ValueError(f"layer {il} is out of range [0, {n_layer})")
    return il


def book_layers(layers, current) -> list:
    """The layers a book recording of a per-layer view holds: the first, the middle one, the last and the current one
    (each layer is another drawing: all of them would weigh a page down and slow the book's build)."""
    layers = sorted(layers)
    pick = {layers[0], layers[len(layers) // 2], layers[-1]}
    if current is not None:
        pick.add(current)
    return sorted(pick)


def _layers_note(shown, every, what: str = "another layer") -> str:
    """The note of a book recording holding layers ``shown`` of ``every``: none when it holds them all."""
    if set(shown) >= set(every):
        return ""
    return (f"recorded for layers {', '.join(map(str, shown))}: {what} is another drawing, which needs a kernel (run "
            f"the notebook and move the slider)")


def _check_threshold(thr) -> float:
    thr = float(thr)
    if np.isnan(thr):
        raise ValueError("the threshold must not be NaN")
    return thr


# ---------------------------------------------------------------------------------------------------------------------
# 1. predictor vs truth
# ---------------------------------------------------------------------------------------------------------------------

class PredictorView(VizWidget):
    """Per layer, one dot per (token, neuron): the predictor's logit against |silu(gate)·up|. A neuron is "active"
    when its magnitude is above ``act_threshold[layer]`` (the build's definition: the layer's median); the predictor
    keeps it when ``logit >= threshold`` (MUL_MAT_SPARSE skips ``idx < threshold``)."""

    def __init__(self, run: SparseRun, act_threshold=None, layer: int = 0, threshold: float = 0.0):
        if run.threshold != -np.inf:
            # at a finite threshold a skipped neuron's gate row is 0, so silu(0)·up = 0: it would look inactive
            # because it was skipped, and the recall would be 1 by construction
            raise ValueError(f"PredictorView needs a run at threshold -inf (nothing skipped), got {run.threshold:g}: "
                             f"a skipped neuron's activation is 0 by construction")
        self.run = run
        if act_threshold is None:      # the build's rule on this run: each layer's median magnitude
            act_threshold = [float(np.median(np.abs(a))) for a in run.act]
        self.act_threshold = np.asarray(act_threshold, np.float64)
        if self.act_threshold.shape != (run.n_layer,):
            raise ValueError(f"act_threshold: need {run.n_layer} values, got shape {self.act_threshold.shape}")
        self.layer = _check_layer(layer, run.n_layer)
        self.threshold = _check_threshold(threshold)

    def select(self, layer=None, threshold=None):
        lay = self.layer if layer is None else _check_layer(layer, self.run.n_layer)
        thr = self.threshold if threshold is None else _check_threshold(threshold)
        self.layer, self.threshold = lay, thr
        self._changed()
        return self

    def confusion(self, il: int, threshold: float | None = None) -> dict:
        thr = self.threshold if threshold is None else threshold
        active = np.abs(self.run.act[il]) > self.act_threshold[il]
        kept = ~(self.run.idx[il] < thr)
        tp, fn = int((kept & active).sum()), int((~kept & active).sum())
        fp, tn = int((kept & ~active).sum()), int((~kept & ~active).sum())
        return {"layer": il, "kept_active": tp, "missed_active": fn, "kept_inactive": fp, "skipped_inactive": tn,
                "recall": tp / max(tp + fn, 1), "skipped": (fn + tn) / max(tp + fn + fp + tn, 1)}

    def state(self) -> dict:
        per = [self.confusion(il) for il in range(self.run.n_layer)]
        return {"layer": self.layer, "threshold": self.threshold, "n_tokens": self.run.n_tokens,
                "current": per[self.layer], "recall": [p["recall"] for p in per],
                "skipped": [p["skipped"] for p in per],
                "mean_recall": float(np.mean([p["recall"] for p in per])),
                "mean_skipped": float(np.mean([p["skipped"] for p in per]))}

    def figure(self):
        st = self.state()
        il, thr = self.layer, self.threshold
        logit = self.run.idx[il].reshape(-1).astype(np.float64)
        mag = np.abs(self.run.act[il].reshape(-1)).astype(np.float64)
        active = mag > self.act_threshold[il]
        kept = ~(logit < thr)
        step = max(1, logit.size // 6000)           # a readable cloud, the same every time
        fig, ax = plt.subplots(1, 2, figsize=(11.5, 3.8), gridspec_kw={"width_ratios": [1.1, 1]})
        for sel, col, lab in ((kept & active, "tab:blue", "active, kept"),
                              (~kept & active, "tab:red", "active, SKIPPED (a miss)"),
                              (kept & ~active, "tab:orange", "inactive, kept (wasted row)"),
                              (~kept & ~active, "#9e9e9e", "inactive, skipped")):
            s = sel[::step]
            ax[0].scatter(logit[::step][s], np.maximum(mag[::step][s], 1e-6), s=3, alpha=0.5, color=col,
                          label=f"{lab}: {int(sel.sum())}")
        ax[0].axvline(thr, color="k", lw=1)
        ax[0].axhline(self.act_threshold[il], color="k", lw=0.8, ls=":")
        ax[0].set_yscale("log")
        ax[0].set_xlabel(f"predictor logit (mlp_pre_out-{il}); threshold {thr:g}")
        ax[0].set_ylabel("|silu(gate)·up|  (dotted: 'active')")
        c = st["current"]
        ax[0].set_title(f"layer {il}: recall {c['recall']:.3f}, rows skipped {c['skipped']:.1%}", fontsize=10)
        ax[0].legend(fontsize=7, markerscale=3, loc="lower right")
        x = np.arange(self.run.n_layer)
        ax[1].bar(x - 0.2, st["recall"], 0.4, label="recall of active neurons", color="tab:blue")
        ax[1].bar(x + 0.2, st["skipped"], 0.4, label="rows skipped", color="#9e9e9e")
        ax[1].axvspan(il - 0.5, il + 0.5, color="gold", alpha=0.3)
        ax[1].set_ylim(0, 1.05)
        ax[1].set_xlabel("layer")
        ax[1].set_title(f"all layers at threshold {thr:g}: mean recall {st['mean_recall']:.3f}, "
                        f"mean skipped {st['mean_skipped']:.1%}", fontsize=10)
        ax[1].legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        return fig

    def summary_html(self) -> str:
        c = self.state()["current"]
        return html_table([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()}],
                          title=f"layer {self.layer}, threshold {self.threshold:g}, {self.run.n_tokens} tokens")

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + self.summary_html()

    BOOK_THRESHOLDS = (-1.0, 0.0, 1.0)

    def book_view(self) -> dict:
        """The lesson's thresholds recorded (−1, 0, 1 and the current one) at this layer: the page switches between
        those drawings; another layer or threshold is another drawing, which needs a kernel (the view says so)."""
        thr = self.threshold
        ths = sorted({*self.BOOK_THRESHOLDS, float(thr)})

        def frame(key):
            self.threshold = float(key[0])
            return {"picture": png_img(fig_to_png(self.figure()), "max-width:100%"), "info": self.summary_html()}

        try:
            with quiet(self):
                return frames_book(
                    [{"name": "threshold", "label": "threshold", "kind": "toggle", "value": f"{float(thr):g}",
                      "options": [[f"{t:g}", f"{t:g}"] for t in ths]}], [(f"{t:g}",) for t in ths], frame,
                    note=f"recorded at layer {self.layer} for thresholds {', '.join(f'{t:g}' for t in ths)}: another "
                         f"layer or threshold is another drawing, which needs a kernel (run the notebook and move "
                         f"the sliders)")
        finally:
            self.threshold = thr

    def _build(self):
        self._w_layer = W.IntSlider(value=self.layer, min=0, max=self.run.n_layer - 1, description="layer",
                                    continuous_update=False)
        self._w_thr = W.FloatSlider(value=min(max(self.threshold, -3.0), 2.0), min=-3.0, max=2.0, step=0.25, description="threshold",
                                    continuous_update=False)
        self._w_layer.observe(lambda ch: self._in_refresh or self.select(layer=ch["new"]), "value")
        self._w_thr.observe(lambda ch: self._in_refresh or self.select(threshold=ch["new"]), "value")
        self._w_img, self._w_tab = W.HTML(), W.HTML()
        return W.VBox([W.HBox([self._w_layer, self._w_thr]), self._w_img, self._w_tab])

    def _refresh(self):
        self._w_layer.value = self.layer
        self._w_thr.value = min(max(self.threshold, self._w_thr.min), self._w_thr.max)
        self._w_img.value = png_img(fig_to_png(self.figure()), "max-width:100%")
        self._w_tab.value = self.summary_html()


# ---------------------------------------------------------------------------------------------------------------------
# 2. hot and cold neurons
# ---------------------------------------------------------------------------------------------------------------------

class HotColdView(VizWidget):
    """The build's per-neuron activation counts (``activation/activation_N.npy``, PowerInfer's ``activation_N.pt``),
    sorted hottest first, and what the solver put on the device (``gpu_idx``: per layer the k hottest)."""

    def __init__(self, counts, gpu_idx=None, layer: int = 0, top: float = 0.25):
        self.counts = np.asarray(counts, np.int64)
        if self.counts.ndim != 2:
            raise ValueError(f"counts: need (n_layer, n_ff), got shape {self.counts.shape}")
        n_layer, n_ff = self.counts.shape
        self.gpu_idx = (np.zeros((n_layer, n_ff), np.int32) if gpu_idx is None
                        else np.stack([np.asarray(g, np.int32).reshape(-1) for g in gpu_idx]))
        if self.gpu_idx.shape != self.counts.shape:
            raise ValueError(f"gpu_idx: need shape {self.counts.shape}, got {self.gpu_idx.shape}")
        if not 0 < top < 1:
            raise ValueError("top must be a fraction in (0, 1)")
        self.top = float(top)
        self.layer = _check_layer(layer, n_layer)

    def select(self, layer):
        self.layer = _check_layer(layer, self.counts.shape[0])
        self._changed()
        return self

    def state(self) -> dict:
        c = self.counts.astype(np.float64)
        n_layer, n_ff = c.shape
        srt = -np.sort(-c, axis=1)
        tot = c.sum(1)
        k = int(round(self.top * n_ff))
        top_share = srt[:, :k].sum(1) / np.maximum(tot, 1)
        on_dev = self.gpu_idx == 1
        dev_share = (c * on_dev).sum(1) / np.maximum(tot, 1)
        return {"layer": self.layer, "top": self.top, "totals": [int(v) for v in self.counts.sum(1)],
                "top_share": [float(v) for v in top_share], "mean_top_share": float(top_share.mean()),
                "n_on_device": [int(v) for v in on_dev.sum(1)], "device_share": [float(v) for v in dev_share],
                "device_share_all": float((c * on_dev).sum() / max(c.sum(), 1)),
                "sorted_counts": [int(v) for v in srt[self.layer]]}

    def figure(self):
        st = self.state()
        n_layer, n_ff = self.counts.shape
        il = self.layer
        srt = -np.sort(-self.counts, axis=1)
        fig, ax = plt.subplots(1, 2, figsize=(11.5, 4.0))
        im = ax[0].imshow(srt, aspect="auto", cmap="magma", interpolation="nearest")
        fig.colorbar(im, ax=ax[0], label="tokens in which the neuron was active")
        # the solver's gpu_idx takes each layer's k hottest neurons: in sorted order the first k columns
        for ly, k in enumerate(st["n_on_device"]):
            if k:        # a green tick where the layer's device rows end
                ax[0].plot([k - 0.5, k - 0.5], [ly - 0.45, ly + 0.45], color="#2ca02c", lw=2.5)
        ax[0].axhline(il, color="gold", lw=0.8, ls="--")
        ax[0].set_xlabel("neurons, hottest first (left of the green tick: rows on the device)")
        ax[0].set_ylabel("layer")
        ax[0].set_title("activation counts, per layer sorted hot → cold", fontsize=10)
        cs = srt[il].astype(np.float64)
        cum = np.concatenate([[0.0], np.cumsum(cs) / max(cs.sum(), 1.0)])
        xs = np.arange(n_ff + 1) / n_ff
        ax[1].plot(xs, cum, color="tab:purple", label=f"layer {il} (this build)")
        ax[1].plot([0, 1], [0, 1], "k:", lw=1, label="all neurons equally hot")
        share = st["top_share"][il]
        ax[1].plot([self.top], [share], "o", color="tab:purple")
        ax[1].annotate(f"hottest {self.top:.0%} carry {share:.0%}", (self.top, share), xytext=(8, -14),
                       textcoords="offset points", fontsize=8)
        ax[1].plot([POWERINFER_HOT_FRACTION], [POWERINFER_HOT_SHARE], "s", color="tab:red")
        ax[1].annotate("PowerInfer's figure for its ReLU models:\n~20 % of neurons carry most activations\n"
                       "(from its paper, not measured here)", (POWERINFER_HOT_FRACTION, POWERINFER_HOT_SHARE),
                       xytext=(10, -4), textcoords="offset points", fontsize=7, color="tab:red")
        k = st["n_on_device"][il]
        if k:
            ax[1].axvline(k / n_ff, color="#2ca02c", lw=1)
            ax[1].text(k / n_ff, 0.97, f" on the device: {k} rows, {st['device_share'][il]:.0%} of activations",
                       fontsize=7, color="#2ca02c", va="top")
        ax[1].set_xlabel("hottest fraction of neurons")
        ax[1].set_ylabel("fraction of activations")
        ax[1].legend(fontsize=7, loc="lower right")
        ax[1].set_title(f"layer {il}; mean over layers: hottest {self.top:.0%} carry {st['mean_top_share']:.0%}",
                        fontsize=10)
        fig.tight_layout()
        return fig

    def summary_html(self) -> str:
        st = self.state()
        il = self.layer
        return (f"<p>Layer {il}: {st['totals'][il]:,} activations counted; the hottest {self.top:.0%} of neurons "
                f"carry <b>{st['top_share'][il]:.0%}</b> (mean over layers {st['mean_top_share']:.0%}). "
                f"On the device: {st['n_on_device'][il]} rows of this layer, {sum(st['n_on_device']):,} in all, "
                f"holding {st['device_share_all']:.0%} of all activations. For contrast, PowerInfer's figure for its "
                f"ReLU models (from its paper, not measured here): about {POWERINFER_HOT_FRACTION:.0%} of the neurons "
                f"carry most of the activations.</p>")

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + self.summary_html()

    def book_view(self) -> dict:
        """A few layers recorded (``book_layers``): the page switches between their drawings and summaries."""
        layer = self.layer
        shown = book_layers(range(self.counts.shape[0]), layer)

        def frame(key):
            self.layer = int(key[0])
            return {"picture": png_img(fig_to_png(self.figure()), "max-width:100%"), "info": self.summary_html()}

        try:
            with quiet(self):
                return frames_book([{"name": "layer", "label": "layer", "kind": "select", "value": layer,
                                     "options": [[str(x), x] for x in shown]}], [(x,) for x in shown], frame,
                                   note=_layers_note(shown, range(self.counts.shape[0])))
        finally:
            self.layer = layer

    def _build(self):
        self._w_layer = W.IntSlider(value=self.layer, min=0, max=self.counts.shape[0] - 1, description="layer",
                                    continuous_update=False)
        self._w_layer.observe(lambda ch: self._in_refresh or self.select(ch["new"]), "value")
        self._w_img, self._w_txt = W.HTML(), W.HTML()
        return W.VBox([self._w_layer, self._w_img, self._w_txt])

    def _refresh(self):
        self._w_layer.value = self.layer
        self._w_img.value = png_img(fig_to_png(self.figure()), "max-width:100%")
        self._w_txt.value = self.summary_html()


# ---------------------------------------------------------------------------------------------------------------------
# 3. the rows each MUL_MAT_SPARSE skipped
# ---------------------------------------------------------------------------------------------------------------------

class SkippedRowsView(VizWidget):
    """Per layer, token x neuron: the rows ``ffn_up_sparse-N`` / ``ffn_gate_sparse-N`` (MUL_MAT_SPARSE) skipped on the
    CPU (``sparse_idx < threshold``), computed, or left to the device (``gpu_idx == 1``). AXPY skips the same rows:
    a skipped gate row gives silu(0)·up = 0, and AXPY skips x[r] == 0."""

    def __init__(self, run: SparseRun, layer: int = 0, token: int = 0):
        self.run = run
        self.layer = _check_layer(layer, run.n_layer)
        self.token = self._check_token(token)

    def _check_token(self, t) -> int:
        t = int(t)
        if not 0 <= t < self.run.n_tokens:
            raise ValueError(f"token {t} is out of range [0, {self.run.n_tokens})")
        return t

    def select(self, layer=None, token=None):
        lay = self.layer if layer is None else _check_layer(layer, self.run.n_layer)
        tok = self.token if token is None else self._check_token(token)
        self.layer, self.token = lay, tok
        self._changed()
        return self

    def counts(self, il: int) -> dict:
        cls = self.run.row_class(il)
        return {"layer": il, "skipped": [int(v) for v in (cls == SKIPPED).sum(1)],
                "computed": [int(v) for v in (cls == COMPUTED).sum(1)],
                "on_device": [int(v) for v in (cls == ON_DEVICE).sum(1)]}

    def state(self) -> dict:
        per = [self.counts(il) for il in range(self.run.n_layer)]
        cls = self.run.row_class(self.layer)[self.token]
        n = self.run.n_tokens * self.run.n_ff
        return {"layer": self.layer, "token": self.token, "threshold": self.run.threshold,
                "token_id": self.run.ids[self.token], "current": per[self.layer],
                "skipped_rows": [int(r) for r in np.flatnonzero(cls == SKIPPED)],
                "skipped_fraction": [sum(p["skipped"]) / n for p in per],
                "device_fraction": [sum(p["on_device"]) / n for p in per],
                "mean_skipped_fraction": float(np.mean([sum(p["skipped"]) / n for p in per]))}

    def figure(self, token_line: bool = True):
        st = self.state()
        il = self.layer
        cls = self.run.row_class(il)
        fig, ax = plt.subplots(2, 1, figsize=(11.5, 4.6), gridspec_kw={"height_ratios": [1.3, 1]})
        ax[0].imshow(cls, aspect="auto", cmap=_ROW_COLOURS, vmin=0, vmax=2, interpolation="nearest")
        if token_line:
            ax[0].axhline(self.token, color="gold", lw=0.8)
        ax[0].set_ylabel("token")
        ax[0].set_xlabel(f"row (neuron) of ffn_up / ffn_gate, layer {il}")
        c = st["current"]
        tot = self.run.n_tokens * self.run.n_ff
        ax[0].set_title(f"MUL_MAT_SPARSE, layer {il}, threshold {self.run.threshold:g}: grey skipped "
                        f"{sum(c['skipped']) / tot:.1%}, blue computed on the CPU {sum(c['computed']) / tot:.1%},\n"
                        f"green on the device {sum(c['on_device']) / tot:.1%} (of which "
                        f"{((self.run.idx[il] < self.run.threshold) & (cls == ON_DEVICE)).sum() / tot:.1%} below the "
                        f"threshold: the device's half skips those)", fontsize=9)
        x = np.arange(self.run.n_layer)
        sk, dv = np.array(st["skipped_fraction"]), np.array(st["device_fraction"])
        ax[1].bar(x, sk, color="#9e9e9e", label="skipped (idx < threshold)")
        ax[1].bar(x, 1 - sk - dv, bottom=sk, color="#1f77b4", label="computed on the CPU")
        ax[1].bar(x, dv, bottom=1 - dv, color="#2ca02c", label="on the device")
        ax[1].axvspan(il - 0.5, il + 0.5, color="gold", alpha=0.35)
        ax[1].set_xlabel("layer")
        ax[1].set_ylabel("share of rows")
        ax[1].set_xlim(-0.5, self.run.n_layer - 0.5)
        ax[1].legend(fontsize=7, ncol=3, loc="lower left")
        fig.tight_layout()
        return fig

    def token_html(self) -> str:
        st = self.state()
        rows = st["skipped_rows"]
        shown = ", ".join(str(r) for r in rows[:60]) + (" …" if len(rows) > 60 else "")
        return (f"<p>Token {self.token} (id {st['token_id']}), layer {self.layer}: MUL_MAT_SPARSE skipped "
                f"<b>{len(rows)}</b> of {self.run.n_ff} rows (its output there is an exact 0, no dot product "
                f"computed): {esc(shown)}</p>")

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + self.token_html()

    def book_view(self) -> dict:
        """A few layers recorded (``book_layers``), each drawn once with no token marked; every token of those layers
        recorded: the page marks the token's row over the drawing and lists its skipped rows."""
        layer, token = self.layer, self.token
        shown = book_layers(range(self.run.n_layer), layer)
        charts = {}

        def frame(key):
            self.layer, self.token = int(key[0]), int(key[1])
            if self.layer not in charts:
                fig = self.figure(token_line=False)
                charts[self.layer] = chart_with_cursor(fig, fig.axes[0])
            img, box = charts[self.layer]
            return {"picture": img, "info": self.token_html(),
                    "cursor": [box(-0.5, self.run.n_ff - 0.5, self.token - 0.5, self.token + 0.5)]}

        try:
            with quiet(self):
                return frames_book([{"name": "layer", "label": "layer", "kind": "select", "value": layer,
                                     "options": [[str(x), x] for x in shown]},
                                    {"name": "token", "label": "token", "kind": "range", "min": 0,
                                     "max": self.run.n_tokens - 1, "value": token}],
                                   [(x, t) for x in shown for t in range(self.run.n_tokens)], frame,
                                   note=_layers_note(shown, range(self.run.n_layer)))
        finally:
            self.layer, self.token = layer, token

    def _build(self):
        self._w_layer = W.IntSlider(value=self.layer, min=0, max=self.run.n_layer - 1, description="layer",
                                    continuous_update=False)
        self._w_tok = W.IntSlider(value=self.token, min=0, max=self.run.n_tokens - 1, description="token",
                                  continuous_update=False)
        self._w_layer.observe(lambda ch: self._in_refresh or self.select(layer=ch["new"]), "value")
        self._w_tok.observe(lambda ch: self._in_refresh or self.select(token=ch["new"]), "value")
        self._w_img, self._w_txt = W.HTML(), W.HTML()
        return W.VBox([W.HBox([self._w_layer, self._w_tok]), self._w_img, self._w_txt])

    def _refresh(self):
        self._w_layer.value, self._w_tok.value = self.layer, self.token
        self._w_img.value = png_img(fig_to_png(self.figure()), "max-width:100%")
        self._w_txt.value = self.token_html()


# ---------------------------------------------------------------------------------------------------------------------
# 4. the hybrid timeline
# ---------------------------------------------------------------------------------------------------------------------

def _layer_of(name: str):
    head, _, tail = name.rpartition("-")
    return int(tail) if head and tail.isdigit() else None


class HybridTimelineView(VizWidget):
    """``graph_compute_hybrid``'s records (``HybridRecord`` objects, or the dicts of ``hybrid.node`` trace events) as
    lanes: thread 0 driving the device, then one lane per CPU thread (each CPU node is computed by threads 1..nth
    together, each its ``ith - 1`` share: the records' ``threads`` spans; records without them are drawn as one CPU
    lane). A thin red bar is a wait on ``is_finish``; an arrow joins a source's end to the device node
    that waited for it. ``layer`` zooms onto one layer's nodes (None: all)."""

    def __init__(self, records, n_threads: int | None = None, layer=None, min_wait_us: float = 50.0):
        recs = [r if isinstance(r, dict) else dict(vars(r)) for r in records]
        if not recs:
            raise ValueError("HybridTimelineView: no records")
        for r in recs:
            if r.get("lane") not in ("gpu", "cpu"):
                raise ValueError(f"HybridTimelineView: record {r.get('name')!r} has lane {r.get('lane')!r}, "
                                 f"expected 'gpu' or 'cpu'")
            r.setdefault("srcs", [])
        self.records = sorted(recs, key=lambda r: r["node_n"])
        self.t0 = min(r["t_wait"] for r in self.records)
        self.n_threads = n_threads
        self.min_wait_us = float(min_wait_us)
        self.layers = sorted({lay for r in self.records if (lay := _layer_of(r["name"])) is not None})
        self.layer = self._check(layer)

    def _check(self, layer):
        if layer is None:
            return None
        if int(layer) not in self.layers:
            raise ValueError(f"layer {layer} has no records (layers: {self.layers})")
        return int(layer)

    def select(self, layer):
        self.layer = self._check(layer)
        self._changed()
        return self

    def _us(self, t) -> float:
        return (t - self.t0) / 1e3

    def overlaps(self) -> list:
        """(device node, CPU node) pairs of the same layer that ran at the same time."""
        out = []
        g = [r for r in self.records if r["lane"] == "gpu"]
        c = [r for r in self.records if r["lane"] == "cpu"]
        for a in g:
            for b in c:
                if _layer_of(a["name"]) == _layer_of(b["name"]) and a["t_start"] < b["t_end"] \
                        and b["t_start"] < a["t_end"]:
                    out.append((a["name"], b["name"]))
        return out

    def state(self) -> dict:
        by_n = {r["node_n"]: r for r in self.records}
        lanes = {"gpu": [r["node_n"] for r in self.records if r["lane"] == "gpu"],
                 "cpu": [r["node_n"] for r in self.records if r["lane"] == "cpu"]}
        late = [(r["name"], by_n[s]["name"]) for r in self.records for s in r["srcs"]
                if s in by_n and r["t_start"] < by_n[s]["t_end"]]
        busy = {k: sum(by_n[n]["t_end"] - by_n[n]["t_start"] for n in v) / 1e3 for k, v in lanes.items()}
        wait = {k: sum(by_n[n]["t_start"] - by_n[n]["t_wait"] for n in v) / 1e3 for k, v in lanes.items()}
        end = max(r["t_end"] for r in self.records)
        return {"n_nodes": len(self.records), "lanes": lanes, "cpu_threads": self.cpu_threads(),
                "layer": self.layer, "layers": self.layers,
                "wall_us": self._us(end), "busy_us": busy, "wait_us": wait,
                "started_before_sources_finished": late, "overlaps": self.overlaps()}

    def cpu_threads(self) -> list:
        """The CPU threads with kernel spans in the records (``threads`` of the "cpu" records; [] for records made
        before ggviz kept them, which are drawn as one CPU lane)."""
        return sorted({t[0] for r in self.records if r["lane"] == "cpu" for t in r.get("threads") or ()})

    def figure(self):
        st = self.state()
        recs = [r for r in self.records if self.layer is None or _layer_of(r["name"]) == self.layer]
        by_n = {r["node_n"]: r for r in self.records}
        cpu_ids = self.cpu_threads()
        # lanes, top to bottom: the device (thread 0), then CPU thread 1, 2, ... (one lane when no per-thread spans)
        n_cpu = max(len(cpu_ids), 1)
        y_gpu = float(n_cpu)
        y_thr = {i: float(n_cpu - 1 - k) for k, i in enumerate(cpu_ids)}
        y_rec = y_thr.get(1, n_cpu - 1.0)             # the recording CPU thread: waits and names are drawn there

        def ms(t):
            return self._us(t) / 1e3

        def colour(r):
            return "#2ca02c" if r["lane"] == "gpu" else ("#1f77b4" if "sparse" in r["name"] else "#7fa7c9")
        fig, ax = plt.subplots(figsize=(11.5, 2.6 + 0.75 * n_cpu))
        for r in recs:
            yy = y_gpu if r["lane"] == "gpu" else y_rec
            x0, x1 = ms(r["t_start"]), ms(r["t_end"])
            if r["lane"] == "cpu" and cpu_ids:
                for ith, a, b in r["threads"]:          # each thread's own share (ith - 1 of nth)
                    ax.barh(y_thr[ith], max(ms(b) - ms(a), 1e-3), left=ms(a), height=0.5, color=colour(r),
                            edgecolor="k", lw=0.3)
            else:
                ax.barh(yy, max(x1 - x0, 1e-3), left=x0, height=0.5, color=colour(r), edgecolor="k", lw=0.3)
            w0 = ms(r["t_wait"])
            if (x0 - w0) * 1e3 >= self.min_wait_us:
                ax.barh(yy + 0.32, x0 - w0, left=w0, height=0.08, color="tab:red")
                if r["lane"] == "gpu":
                    for s_ in r["srcs"]:
                        if s_ in by_n and by_n[s_]["lane"] == "cpu":
                            ax.annotate("", xy=(x0, yy - 0.25), xytext=(ms(by_n[s_]["t_end"]), y_rec + 0.25),
                                        arrowprops={"arrowstyle": "->", "color": "tab:red", "lw": 0.6})
        # names inside the nodes wide enough to carry one (the rest are in the table), staggered in two rows
        lo = min(ms(r["t_wait"]) for r in recs)
        span = max(ms(r["t_end"]) for r in recs) - lo or 1.0
        for lane, yy in (("gpu", y_gpu), ("cpu", y_rec)):
            wide = [r for r in recs if r["lane"] == lane and ms(r["t_end"]) - ms(r["t_start"]) >= 0.07 * span]
            for k, r in enumerate(sorted(wide, key=lambda r: r["t_start"])):
                ax.text((ms(r["t_start"]) + ms(r["t_end"])) / 2, yy + (0.1 if k % 2 else -0.1), r["name"],
                        fontsize=7, ha="center", va="center", color="white")
        if cpu_ids:
            ticks = [(y_thr[i], f"CPU thread {i} (ith {i - 1})") for i in cpu_ids]
        else:
            ticks = [(0.0, LANE_CPU if self.n_threads is None else f"CPU (threads 1…{self.n_threads - 1})")]
        ticks.append((y_gpu, LANE_GPU))
        ax.set_yticks([t for t, _ in ticks], [lab for _, lab in ticks])
        ax.set_ylim(-0.45, y_gpu + 0.5)
        ax.set_xlim(lo - 0.01 * span, lo + 1.01 * span)
        ax.set_xlabel("ms since the first node began waiting   (red: waiting on is_finish; arrow: for which source)")
        scope = "all layers" if self.layer is None else f"layer {self.layer}"
        ax.set_title(f"graph_compute_hybrid, {scope} (of {st['n_nodes']} nodes, wall {st['wall_us'] / 1e3:.1f} ms: "
                     f"device busy {st['busy_us']['gpu'] / 1e3:.1f} ms, waiting {st['wait_us']['gpu'] / 1e3:.1f} ms; "
                     f"CPU busy {st['busy_us']['cpu'] / 1e3:.1f} ms)", fontsize=9)
        ax.legend(handles=[Patch(color="#2ca02c", label="device node (*_gpu)"),
                           Patch(color="#1f77b4", label="sparse CPU node"),
                           Patch(color="#7fa7c9", label="other CPU node (predictor, act, add)"),
                           Patch(color="tab:red", label="waiting on is_finish")],
                  fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
        for s in ("top", "right"):
            ax.spines[s].set_visible(False)
        fig.tight_layout()
        return fig

    @staticmethod
    def _kind(r) -> str:
        if r["lane"] == "gpu":
            return "device: the hot rows (*_gpu)"
        if r["name"].startswith("mlp_pre"):
            return "CPU: the predictor (mlp_pre_*)"
        if "sparse" in r["name"]:
            return "CPU: the cold rows (ffn_*_sparse)"
        return "CPU: attention, norms, adds"

    def table_html(self) -> str:
        """The device nodes (what each waited for), and, zoomed on a layer, that layer's nodes summed by kind (one
        row per kind, not one per node: the picture above has the nodes)."""
        recs = [r for r in self.records if self.layer is None or _layer_of(r["name"]) == self.layer]
        by_n = {r["node_n"]: r for r in self.records}
        dev = [{"node": r["node_n"], "name": r["name"], "op": r["op"].split("(")[0],
                "waited (ms)": round((r["t_start"] - r["t_wait"]) / 1e6, 2),
                "ran (ms)": round((r["t_end"] - r["t_start"]) / 1e6, 2),
                "waited for (nodes)": ", ".join(by_n[s]["name"] for s in r["srcs"] if s in by_n)}
               for r in recs if r["lane"] == "gpu"]
        out = html_table(dev, title="device nodes" if self.layer is None else f"layer {self.layer}: device nodes")
        if self.layer is not None:
            kinds: dict = {}
            for r in recs:
                k = kinds.setdefault(self._kind(r), {"kind": self._kind(r), "nodes": 0, "ran (ms)": 0.0,
                                                       "waited (ms)": 0.0, "longest": ("", -1.0)})
                k["nodes"] += 1
                ran = (r["t_end"] - r["t_start"]) / 1e6
                k["ran (ms)"] += ran
                k["waited (ms)"] += (r["t_start"] - r["t_wait"]) / 1e6
                if ran > k["longest"][1]:
                    k["longest"] = (r["name"], ran)
            rows = [dict(v, **{"ran (ms)": round(v["ran (ms)"], 1), "waited (ms)": round(v["waited (ms)"], 1),
                               "longest": f"{v['longest'][0]} ({v['longest'][1]:.1f} ms)"})
                    for v in sorted(kinds.values(), key=lambda v: v["kind"], reverse=True)]
            out = html_table(rows, title=f"layer {self.layer}: its {len(recs)} nodes by kind") + out
        return out

    def text_html(self) -> str:
        """What ``to_html`` shows under the picture: the order check and the tables."""
        st = self.state()
        ok = ("every node started after its sources finished" if not st["started_before_sources_finished"]
              else f"{len(st['started_before_sources_finished'])} nodes started before a source finished!")
        return (f"<p>{esc(ok)}; device nodes overlapping CPU nodes of their layer: {len(st['overlaps'])} pairs.</p>"
                + self.table_html())

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + self.text_html()

    def book_view(self) -> dict:
        """All layers and a few single layers (``book_layers``) recorded: the zoom list switches between them."""
        layer = self.layer
        shown = book_layers(self.layers, layer)
        keys = ["all"] + [str(x) for x in shown]

        def frame(key):
            self.layer = None if key[0] == "all" else int(key[0])
            return {"picture": png_img(fig_to_png(self.figure()), "max-width:100%"), "info": self.text_html()}

        try:
            with quiet(self):
                return frames_book([{"name": "zoom", "label": "zoom", "kind": "select",
                                     "value": "all" if layer is None else str(layer),
                                     "options": [["all layers", "all"]] + [[f"layer {x}", str(x)] for x in shown]}],
                                   [(k,) for k in keys], frame,
                                   note=_layers_note(shown, self.layers, "a zoom on another layer"))
        finally:
            self.layer = layer

    def _build(self):
        opts = [("all layers", None)] + [(f"layer {x}", x) for x in self.layers]
        self._w_layer = W.Dropdown(options=opts, value=self.layer, description="zoom")
        self._w_layer.observe(lambda ch: self._in_refresh or self.select(ch["new"]), "value")
        self._w_body = W.HTML()
        return W.VBox([self._w_layer, self._w_body])

    def _refresh(self):
        self._w_layer.value = self.layer
        self._w_body.value = self.to_html()


# ---------------------------------------------------------------------------------------------------------------------
# 5. what the sparsity costs and saves
# ---------------------------------------------------------------------------------------------------------------------

def decode_flops_per_token(model) -> dict:
    """Multiply-add FLOPs (2 per weight) of one token's matrix products in the dense model: attention projections,
    FFN, output; and the predictor's, which only the sparse model pays."""
    def fl(t):
        return 2 * int(t.ne[0]) * int(t.ne[1])
    attn = sum(fl(ly.wq) + fl(ly.wk) + fl(ly.wv) + fl(ly.wo) for ly in model.layers)
    ffn = sum(fl(ly.ffn_up) + fl(ly.ffn_gate) + fl(ly.ffn_down) for ly in model.layers)
    pred = sum(fl(sl.mlp_pre_w1) + fl(sl.mlp_pre_w2) for sl in model.sparse.layers) if model.sparse else 0
    return {"attention": attn, "ffn": ffn, "output": fl(model.output), "predictor": pred}


def neuron_bytes(model, il: int = 0) -> int:
    """Bytes of weights one FFN neuron costs in the sparse model: its ffn_up and ffn_gate rows and its ffn_down_t row
    (PowerInfer reads exactly these for a kept neuron, and copies them to the device for a hot one)."""
    ly, sl = model.layers[il], model.sparse.layers[il]
    return sum(ggml.row_size(t.type, int(t.ne[0])) for t in (ly.ffn_up, ly.ffn_gate, sl.ffn_down_t))


class SparseCostView(VizWidget):
    """Per token: FLOPs and weight bytes of the FFN computed dense vs sparse at ``threshold`` (from the run's
    sparse_idx: the rows the kernels skip), the predictor's price, the whole decode's FLOPs, the bytes that cross to
    the device (``capture.device_transfers``) and measured kernel times (``kernel_times``: {rows skipped fraction: seconds})."""

    def __init__(self, model, run: SparseRun, threshold: float | None = None, kernel_times=None, transfers=None):
        if model.sparse is None:
            raise ValueError("SparseCostView: the model is not a PowerInfer (PWRI) model")
        self.model, self.run = model, run
        self.threshold = _check_threshold(run.threshold if threshold is None else threshold)
        self.kernel_times = dict(kernel_times or {})
        self.transfers = list(transfers or [])
        self.flops = decode_flops_per_token(model)
        self.neuron_bytes = neuron_bytes(model)
        # the dense FFN reads its own matrices (ffn_down in the model's type, Q4_1 here), not the F16 ffn_down_t
        # the sparse AXPY needs: a kept neuron costs the sparse path more bytes than the dense path pays for it
        self.dense_ffn_bytes = sum(ggml.nbytes(ly.ffn_up) + ggml.nbytes(ly.ffn_gate) + ggml.nbytes(ly.ffn_down)
                                   for ly in model.layers)

    def select(self, threshold):
        self.threshold = _check_threshold(threshold)
        self._changed()
        return self

    def state(self) -> dict:
        r = self.run
        # rows each token computes: MUL_MAT_SPARSE (up, gate) and AXPY (down) keep what the predictor keeps,
        # whichever side (CPU or device) holds the row
        kept = np.array([(~(r.idx[il] < self.threshold)).sum(1).mean() for il in range(r.n_layer)], np.float64)
        frac_skipped = 1.0 - kept.sum() / (r.n_layer * r.n_ff)
        f = self.flops
        ffn_sparse = f["ffn"] * (1.0 - frac_skipped)
        dense_total = f["attention"] + f["ffn"] + f["output"]
        sparse_total = f["attention"] + ffn_sparse + f["output"] + f["predictor"]
        nbytes = self.neuron_bytes
        xfer = {"to_device": sum(t["bytes"] for t in self.transfers if t["to"] == "device"),
                "to_cpu": sum(t["bytes"] for t in self.transfers if t["to"] == "cpu")}
        return {"threshold": self.threshold, "rows_skipped": float(frac_skipped),
                "kept_rows_per_layer": [float(v) for v in kept],
                "ffn_flops_dense": int(f["ffn"]), "ffn_flops_sparse": float(ffn_sparse),
                "predictor_flops": int(f["predictor"]), "decode_flops_dense": int(dense_total),
                "decode_flops_sparse": float(sparse_total), "decode_flops_ratio": float(sparse_total / dense_total),
                "ffn_flops_ratio": float((ffn_sparse + f["predictor"]) / f["ffn"]),
                "neuron_bytes": nbytes, "ffn_bytes_dense": int(self.dense_ffn_bytes),
                "ffn_bytes_sparse": float(nbytes * kept.sum()),
                "break_even_skip": float(f["predictor"] / f["ffn"]),
                "dense_neuron_bytes": int(self.dense_ffn_bytes // (r.n_ff * r.n_layer)),
                "down_t_row_bytes": int(ggml.row_size(self.model.sparse.layers[0].ffn_down_t.type, r.ffn_out[0].shape[1])),
                "transfer_bytes": xfer, "n_transfer_tokens": r.n_tokens,
                "kernel_times": {float(k): float(v) for k, v in sorted(self.kernel_times.items())}}

    def verdict(self) -> str:
        st = self.state()
        gain = 1.0 - st["decode_flops_ratio"]
        return (f"At threshold {st['threshold']:g} the kernels skip {st['rows_skipped']:.1%} of the FFN rows: the FFN's "
                f"products cost {st['ffn_flops_sparse'] / 1e6:.1f} MFLOP per token instead of "
                f"{st['ffn_flops_dense'] / 1e6:.1f}, but the predictor adds {st['predictor_flops'] / 1e6:.1f} MFLOP "
                f"(it pays for itself only above {st['break_even_skip']:.1%} rows skipped). The whole decode: "
                f"{st['decode_flops_sparse'] / 1e6:.1f} vs {st['decode_flops_dense'] / 1e6:.1f} MFLOP per token, "
                + (f"{gain:.1%} fewer." if gain >= 0 else f"{-gain:.1%} MORE than dense.")
                + f" Weights read by the FFN: {st['ffn_bytes_sparse'] / 2**20:.2f} MiB instead of "
                f"{st['ffn_bytes_dense'] / 2**20:.2f} MiB per token: a kept neuron costs {self.neuron_bytes:,} bytes "
                f"(its F16 ffn_down_t row is {st['down_t_row_bytes']:,} of them), the dense FFN "
                f"{st['dense_neuron_bytes']:,} bytes per neuron.")

    def figure(self):
        st = self.state()
        f = self.flops
        fig, ax = plt.subplots(1, 2, figsize=(11.5, 3.6))
        parts = [("attention", f["attention"], f["attention"], "#7fa7c9"),
                 ("FFN", f["ffn"], st["ffn_flops_sparse"], "#1f77b4"),
                 ("predictor", 0, f["predictor"], "tab:orange"),
                 ("output", f["output"], f["output"], "#9e9e9e")]
        left = np.zeros(2)
        for name, d, s, col in parts:
            v = np.array([d, s], np.float64) / 1e6
            ax[0].barh([1, 0], v, left=left, color=col, edgecolor="k", lw=0.3, label=name)
            left += v
        ax[0].set_yticks([1, 0], ["dense", f"sparse @ {st['threshold']:g}"])
        ax[0].set_xlabel("MFLOP per token (matrix products)")
        ax[0].set_title(f"sparse / dense = {st['decode_flops_ratio']:.3f} (rows skipped {st['rows_skipped']:.1%})",
                        fontsize=10)
        ax[0].legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22))
        kt = st["kernel_times"]
        if kt:
            xs = np.array(list(kt), np.float64)
            base = kt.get(0.0, max(kt.values()))
            ys = np.array([kt[k] / base for k in kt], np.float64)
            ax[1].plot(xs, ys, "o-", label="measured: compiled MUL_MAT_SPARSE, 1 thread")
            ax[1].plot([0, 1], [1, 0], "k:", lw=1, label="time ∝ rows computed")
            ax[1].axvline(st["rows_skipped"], color="tab:red", lw=1, label="rows skipped in this run at this threshold")
            ax[1].set_xlabel("fraction of rows skipped")
            ax[1].set_ylabel("time / time with no row skipped")
            ax[1].set_ylim(0, 1.1)
            ax[1].legend(fontsize=7)
            ax[1].set_title("kernel time vs rows skipped", fontsize=10)
        else:
            ax[1].axis("off")
        fig.tight_layout()
        return fig

    def table_html(self) -> str:
        st = self.state()
        rows = [{"what": "FFN products", "dense": f"{st['ffn_flops_dense'] / 1e6:.1f} MFLOP",
                 "sparse": f"{st['ffn_flops_sparse'] / 1e6:.1f} MFLOP"},
                {"what": "predictor (fc1, fc2)", "dense": "0", "sparse": f"{st['predictor_flops'] / 1e6:.1f} MFLOP"},
                {"what": "whole decode", "dense": f"{st['decode_flops_dense'] / 1e6:.1f} MFLOP",
                 "sparse": f"{st['decode_flops_sparse'] / 1e6:.1f} MFLOP"},
                {"what": "FFN weights read", "dense": f"{st['ffn_bytes_dense'] / 2**20:.2f} MiB",
                 "sparse": f"{st['ffn_bytes_sparse'] / 2**20:.2f} MiB"},
                {"what": "weight bytes per computed neuron", "dense": f"{st['dense_neuron_bytes']:,} B",
                 "sparse": f"{self.neuron_bytes:,} B (its F16 ffn_down_t row: {st['down_t_row_bytes']:,})"}]
        if self.transfers:
            x = st["transfer_bytes"]
            n_lay = len({_layer_of(t["tensor"]) for t in self.transfers})
            rows.append({"what": f"activations crossing CPU ↔ device in the hybrid run ({st['n_transfer_tokens']} "
                                 f"tokens, {n_lay} layers; not per token)", "dense": "none",
                         "sparse": f"{x['to_device'] / 1024:.1f} KiB to, {x['to_cpu'] / 1024:.1f} KiB back"})
        return html_table(rows, ["what", "dense", "sparse"], title="per token")

    def headline(self) -> str:
        """One sentence (the numbers are in the table below it)."""
        st = self.state()
        gain = 1.0 - st["decode_flops_ratio"]
        return (f"At threshold {st['threshold']:g} the kernels skip {st['rows_skipped']:.1%} of the FFN rows; with "
                f"the predictor's price the whole decode does "
                + (f"{gain:.1%} fewer FLOPs than dense" if gain >= 0 else f"{-gain:.1%} MORE FLOPs than dense")
                + f" (break-even: {st['break_even_skip']:.1%} rows skipped).")

    def to_html(self) -> str:
        return (png_img(fig_to_png(self.figure()), "max-width:100%") + f"<p>{esc(self.headline())}</p>"
                + self.table_html())

    BOOK_THRESHOLDS = (-1.0, 0.0, 1.0)

    def book_view(self) -> dict:
        """The lesson's thresholds recorded (−1, 0, 1 and the current one), as PredictorView's."""
        thr = self.threshold
        ths = sorted({*self.BOOK_THRESHOLDS, float(thr)})

        def frame(key):
            self.threshold = float(key[0])
            return {"picture": png_img(fig_to_png(self.figure()), "max-width:100%"),
                    "info": f"<p>{esc(self.headline())}</p>" + self.table_html()}

        try:
            with quiet(self):
                return frames_book(
                    [{"name": "threshold", "label": "threshold", "kind": "toggle", "value": f"{float(thr):g}",
                      "options": [[f"{t:g}", f"{t:g}"] for t in ths]}], [(f"{t:g}",) for t in ths], frame,
                    note=f"recorded for thresholds {', '.join(f'{t:g}' for t in ths)}: another threshold is another "
                         f"drawing, which needs a kernel (run the notebook and move the slider)")
        finally:
            self.threshold = thr

    def _build(self):
        self._w_thr = W.FloatSlider(value=min(max(self.threshold, -3.0), 2.0), min=-3.0, max=2.0, step=0.25, description="threshold",
                                    continuous_update=False)
        self._w_thr.observe(lambda ch: self._in_refresh or self.select(ch["new"]), "value")
        self._w_body = W.HTML()
        return W.VBox([self._w_thr, self._w_body])

    def _refresh(self):
        self._w_thr.value = min(max(self.threshold, self._w_thr.min), self._w_thr.max)
        self._w_body.value = self.to_html()
