"""``ggviz report``: one decode step of the default model as a standalone HTML page, readable without Jupyter.

    ggviz report [-o report.html] [-p PROMPT] [-t THREADS] [-m MODEL]

The page is built from one real run (``record``): the prompt is tokenized and decoded, the greedy next token is
decoded alone (the *decode step*), with llama.cpp's eval callback (``cb_eval``) copying out layer 0's values as
they are computed; then the same prompt and step run again in a second llama context, without the callback (one
uninterrupted graph compute), under ``ggviz.trace`` recorders for the thread timeline. Every figure is drawn from what those runs left: the GGUF file,
the tokenizer's merges, the contexts and buffers, the graph, the plan, the trace events, the KV cells and mask, the
attention weights, the logits and the sampler's steps. Figures are inline (SVG, PNG data URIs); a few lines of
inline JavaScript drive the step sliders; nothing is fetched from the network.

``build_report(rec)`` returns the HTML text, ``write_report(path)`` records and writes it.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import math
import pathlib
import platform
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .export import DEFAULT_PROMPT, decode_step

# names whose values the eval callback copies out besides layer 0's nodes
_EXTRA_VALUES = ("embd", "inp_embd", "result_norm", "result_output")


# ====================================================================================================================
# the run
# ====================================================================================================================

@dataclass
class Recording:
    """Everything one ``record`` run left, as engine objects and plain data."""
    step: object                      # export.DecodeStep (model, ctx, graph, events of the decode with cb_eval)
    values: list                      # [{node_n, name, op, type, shape, src, data}] copied by cb_eval (layer 0 ...)
    prompt_attn: np.ndarray | None    # kq_soft_max-0 of the prompt: [head, query, cell]
    timeline_events: list             # trace events of the second run's decode (cpu.plan, cpu.node, cpu.chunk ...)
    timeline: object                  # trace.ComputeTimeline of that decode (or None)
    logits: np.ndarray                # logits of the decode step
    replay_max_diff: float            # max |logits(decode with cb_eval) - logits(the same step without it)|
    sampler_history: list             # llama_sampler_chain's steps on those logits
    sampled: int                      # the token the chain picked
    units: list                       # vocab.tokenize_words(prompt): pre-tokenized words + their ids
    merges: dict                      # word -> [BpeMerge]
    t_record_s: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def model(self):
        return self.step.model

    @property
    def ctx(self):
        return self.step.ctx

    @property
    def gf(self):
        return self.step.graph.gf


def _copy_values(t) -> np.ndarray:
    from . import ggml
    a = ggml.get_data(t)
    if a.dtype == np.uint8 and t.type not in (ggml.GGML_TYPE_I8,):
        return ggml.get_data_f32(t).reshape(a.shape[:3] + (-1,))
    return np.array(a, dtype=np.float32 if a.dtype.kind == "f" else a.dtype)


def record(prompt: str = DEFAULT_PROMPT, threads: int = 2, model=None, n_ctx: int = 256,
           temp: float = 0.8, seed: int = 1234) -> Recording:
    """Run the decode step (see the module doc) and keep what the report shows."""
    from . import llama
    from .run import make_sampler
    from .viz.graph_dot import layer_of

    t0 = time.perf_counter()
    values: list = []
    prompt_attn: dict = {}

    def want(t) -> bool:
        return layer_of(t.name or "") == 0 or t.name in _EXTRA_VALUES

    def cb_values(t, ask):                      # llama.cpp's cb_eval: asked first, then called with the data
        if ask:
            return want(t)
        values.append(dict(name=t.name, op=_op(t), type=_type(t), shape=[int(x) for x in t.shape],
                           src=[s.name for s in t.src if s is not None], data=_copy_values(t), addr=t.addr))
        return True

    def cb_prompt(t, ask):
        if ask:
            return t.name == "kq_soft_max-0"
        prompt_attn["kq"] = _copy_values(t)
        return True

    step = decode_step(prompt, threads, model, n_ctx, record=True, cb_eval=cb_values, cb_eval_prompt=cb_prompt)
    ctx = step.ctx
    gf = step.graph.gf
    index = {t.addr: i for i, t in enumerate(gf.nodes)}
    for v in values:
        v["node_n"] = index.get(v.pop("addr"))
    logits_a = ctx.get_logits_ith(-1).copy()

    # the same step in a second context, without the callback (one uninterrupted compute): the thread timeline
    step_b = decode_step(prompt, threads, step.model, n_ctx, record=True)
    if step_b.token != step.token:
        raise RuntimeError("the two runs of the decode step disagree on the prompt's greedy token")
    logits = step_b.ctx.get_logits_ith(-1).copy()
    tl = step_b.timeline
    chain = make_sampler(temp=temp, seed=seed)
    sampled = llama.sampler_sample(chain, step_b.ctx, -1)
    vocab = llama.model_get_vocab(step.model)
    units = vocab.tokenize_words(prompt, add_special=True, parse_special=True)
    merges = {u.text: vocab.bpe_trace(u.encoded, encoded=True) for u in units if not u.special}
    kq = prompt_attn.get("kq")
    n_p = len(step.prompt_ids)
    pa = kq.reshape(kq.shape[-3], kq.shape[-2], kq.shape[-1])[:, :n_p, :n_p] if kq is not None else None
    return Recording(step=step, values=values, prompt_attn=pa, timeline_events=step_b.events, timeline=tl,
                     logits=logits, replay_max_diff=float(np.max(np.abs(logits - logits_a))),
                     sampler_history=list(chain.history), sampled=int(sampled), units=units, merges=merges,
                     t_record_s=time.perf_counter() - t0,
                     meta=dict(temp=temp, seed=seed, n_ctx=n_ctx))


def _op(t) -> str:
    from .ggml.tensor import op_desc
    return op_desc(t)


def _type(t) -> str:
    from .ggml.tensor import type_name
    return type_name(t.type)


# ====================================================================================================================
# HTML pieces
# ====================================================================================================================

def esc(s) -> str:
    return html.escape(str(s), quote=True)


def _widgets():
    """ggviz.viz.widgets when it imports (it is optional for the report: static fallbacks exist)."""
    try:
        from .viz import widgets
        return widgets
    except Exception:  # noqa: BLE001 - any import problem means: use the fallbacks
        return None


def fig_png(fig, dpi: int = 100) -> bytes:
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def img(png: bytes, alt: str, style: str = "max-width:100%") -> str:
    return (f"<img alt='{esc(alt)}' style='{style}' "
            f"src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'/>")


def array_png(a, cmap: str = "RdBu_r", scale: int = 4, symmetric: bool = True) -> bytes:
    """A 2-D array as a small PNG heat map (each value ``scale`` x ``scale`` pixels)."""
    import matplotlib
    a = np.asarray(a, dtype=np.float32)
    a = np.where(np.isfinite(a), a, np.nan)
    if a.ndim == 1:
        a = a[None, :]
    fin = a[np.isfinite(a)]
    vmax = float(np.max(np.abs(fin))) if fin.size else 1.0
    vmax = vmax or 1.0
    vmin = -vmax if symmetric else float(fin.min() if fin.size else 0.0)
    if not symmetric:
        vmax = float(fin.max() if fin.size else 1.0)
        vmax = vmax if vmax > vmin else vmin + 1.0
    rgba = matplotlib.colormaps[cmap]((a - vmin) / (vmax - vmin))
    rgba[~np.isfinite(a)] = (0.2, 0.2, 0.2, 1.0)
    rgba = np.repeat(np.repeat(rgba, scale, axis=0), scale, axis=1)
    buf = io.BytesIO()
    matplotlib.pyplot.imsave(buf, rgba, format="png")
    return buf.getvalue()


def table(rows, columns=None, cls: str = "t") -> str:
    rows = list(rows)
    if not rows:
        return "<p><i>(empty)</i></p>"
    columns = columns or list(rows[0].keys())
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table class='{cls}'><tr>{head}</tr>{body}</table>"


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return esc(f"{v:.4g}")
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10000:
        return esc(f"{v:,}")
    if isinstance(v, str) and v.startswith("<"):
        return v                                       # already HTML
    return esc(v)


def svg_inline(svg_bytes_or_text, cls: str = "svg") -> str:
    s = svg_bytes_or_text.decode("utf-8") if isinstance(svg_bytes_or_text, bytes) else svg_bytes_or_text
    i = s.find("<svg")
    s = s[i:] if i >= 0 else s
    return f"<div class='{cls}'>{s}</div>"


def stepper(frames, sid: str, shared: str = "", title: str = "") -> str:
    """A step slider: ``frames`` = [(label, html, css, focus_id)]; frame k is shown, its ``css`` restyles
    ``shared`` (an SVG shown above the frames), ``focus_id`` is scrolled into view."""
    parts = [f"<div class='ggv-stepper' id='{sid}' data-n='{len(frames)}'>",
             f"<div class='ggv-controls'>{esc(title)} <button class='ggv-prev' type='button'>&#9664; prev</button>"
             f"<input class='ggv-range' type='range' min='0' max='{max(len(frames) - 1, 0)}' value='0' step='1'/>"
             f"<button class='ggv-next' type='button'>next &#9654;</button> "
             f"<span class='ggv-label'>{esc(frames[0][0]) if frames else ''}</span></div>",
             f"<style class='ggv-style'>{frames[0][2] if frames else ''}</style>"]
    if shared:
        parts.append(f"<div class='ggv-scroll'>{shared}</div>")
    parts.append("<div class='ggv-frames'>")
    for k, (label, body, css, focus) in enumerate(frames):
        hide = "" if k == 0 else " style='display:none'"
        parts.append(f"<div class='ggv-frame' data-k='{k}' data-label='{esc(label)}' data-css='{esc(css or '')}' "
                     f"data-focus='{esc(focus or '')}'{hide}>{body}</div>")
    parts.append("</div></div>")
    return "".join(parts)


_JS = r"""
(function(){
  function setup(st){
    var frames = st.querySelectorAll('.ggv-frames > .ggv-frame');
    var range = st.querySelector('.ggv-range'), label = st.querySelector('.ggv-label');
    var style = st.querySelector('style.ggv-style'), box = st.querySelector('.ggv-scroll');
    function show(k){
      k = Math.max(0, Math.min(frames.length - 1, k));
      range.value = k;
      for (var i = 0; i < frames.length; i++) frames[i].style.display = (i === k) ? '' : 'none';
      label.textContent = (k + 1) + ' / ' + frames.length + ': ' + (frames[k].getAttribute('data-label') || '');
      if (style) style.textContent = frames[k].getAttribute('data-css') || '';
      st.setAttribute('data-step', k);
      var f = frames[k].getAttribute('data-focus');
      if (box && f){
        var el = document.getElementById(f);
        if (el){
          var b = el.getBoundingClientRect(), c = box.getBoundingClientRect();
          box.scrollTop += (b.top - c.top) - box.clientHeight / 2 + b.height / 2;
          box.scrollLeft += (b.left - c.left) - box.clientWidth / 2 + b.width / 2;
        }
      }
    }
    range.addEventListener('input', function(){ show(parseInt(range.value, 10)); });
    st.querySelector('.ggv-prev').addEventListener('click', function(){ show(parseInt(range.value, 10) - 1); });
    st.querySelector('.ggv-next').addEventListener('click', function(){ show(parseInt(range.value, 10) + 1); });
    st.addEventListener('keydown', function(e){
      if (e.key === 'ArrowRight') show(parseInt(range.value, 10) + 1);
      if (e.key === 'ArrowLeft') show(parseInt(range.value, 10) - 1);
    });
    show(0);
  }
  var all = document.querySelectorAll('.ggv-stepper');
  for (var i = 0; i < all.length; i++) setup(all[i]);
  document.body.setAttribute('data-ggv-ready', '1');
})();
"""

_CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0;color:#212121;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:0 24px 80px}
header{background:#263238;color:#eceff1;padding:18px 24px}
header h1{margin:0 0 4px;font-size:24px} header p{margin:2px 0;color:#b0bec5}
nav{position:sticky;top:0;background:#eceff1;border-bottom:1px solid #cfd8dc;padding:6px 24px;z-index:5;
    font-size:13px;line-height:1.9}
nav a{margin-right:12px;color:#37474f;text-decoration:none} nav a:hover{text-decoration:underline}
section{background:#fff;border:1px solid #e0e0e0;border-radius:6px;margin:22px 0;padding:6px 20px 16px;
        scroll-margin-top:64px}
h2{border-bottom:2px solid #90a4ae;padding-bottom:4px} h3{margin-bottom:6px;color:#37474f}
.note{background:#fffde7;border-left:4px solid #fbc02d;padding:8px 12px;margin:10px 0;font-size:14px}
.note b.m{color:#6d4c41} code{background:#eceff1;padding:0 3px;border-radius:3px;font-size:90%}
table.t{border-collapse:collapse;font-size:12px;margin:6px 0}
table.t td,table.t th{border:1px solid #e0e0e0;padding:2px 7px;text-align:left;font-family:monospace}
table.t th{background:#eceff1}
.svg{overflow:auto;max-width:100%} .svg svg{max-width:none} .svgraw svg{max-width:none}
.ggv-stepper{border:1px solid #b0bec5;border-radius:6px;padding:8px;margin:10px 0;background:#f5f7f8;
             scroll-margin-top:64px}
.ggv-controls{display:flex;align-items:center;gap:8px;flex-wrap:wrap;font-size:14px}
.ggv-range{width:360px} .ggv-label{font-family:monospace;font-size:13px}
.ggv-scroll{max-height:560px;overflow:auto;border:1px solid #cfd8dc;background:#fff;margin:8px 0}
.ggv-frame{padding:4px 0}
.sym{display:inline-block;border:1px solid #90a4ae;border-radius:3px;padding:1px 4px;margin:2px;
     font-family:monospace;background:#fff}
.sym.new{background:#ffcc80;border-color:#e65100;font-weight:bold}
.kv{font-family:monospace;font-size:13px} .muted{color:#757575;font-size:13px}
.row{display:flex;gap:18px;flex-wrap:wrap;align-items:flex-start}
"""


@dataclass
class Section:
    sid: str
    title: str
    mirrors: str          # the ggml / llama.cpp functions this section's engine code mirrors
    note: str             # the teacher note (HTML)
    body: str

    def html(self) -> str:
        return (f"<section id='{self.sid}'><h2>{esc(self.title)}</h2>"
                f"<div class='note'><b class='m'>Mirrors:</b> {self.mirrors}<br/>{self.note}</div>"
                f"{self.body}</section>")


def _c(*names) -> str:
    return ", ".join(f"<code>{esc(n)}</code>" for n in names)


def _piece(vocab, tid: int) -> str:
    return vocab.token_to_piece(int(tid), True).decode("utf-8", "replace")


# ====================================================================================================================
# sections
# ====================================================================================================================

def sec_overview(rec: Recording) -> Section:
    from . import __version__
    m, st = rec.model, rec.step
    hp = m.hparams
    vocab = m.vocab
    toks = " ".join(f"<span class='sym'>{esc(_piece(vocab, t))}</span><sub>{t}</sub>" for t in st.prompt_ids)
    rows = [
        {"": "model", "value": f"{m.name or pathlib.Path(m.path).name}: {m.desc()}, {hp.n_layer} layers, "
                               f"n_embd={hp.n_embd}, n_head={hp.n_head} (n_head_kv={hp.n_head_kv}), n_ff={hp.n_ff}, "
                               f"n_vocab={hp.n_vocab}"},
        {"": "prompt", "value": repr(st.prompt)},
        {"": "decode step", "value": f"token {st.token} ({_piece(vocab, st.token)!r}) at position {st.pos}, "
                                     f"{st.n_threads} threads, n_ctx={st.ctx.n_ctx}"},
        {"": "graph", "value": f"{rec.gf.n_nodes} nodes, {rec.gf.n_leafs} leafs"},
        {"": "next token", "value": f"{rec.sampled} ({_piece(vocab, rec.sampled)!r}) sampled "
                                    f"(temp {rec.meta['temp']}, seed {rec.meta['seed']}); greedy would pick "
                                    f"{int(rec.logits.argmax())} ({_piece(vocab, int(rec.logits.argmax()))!r})"},
        {"": "timings", "value": f"prompt {st.t_prompt_ms:.0f} ms, decode step {st.t_decode_ms:.0f} ms "
                                 f"(with the eval callback), the whole recording {rec.t_record_s:.1f} s"},
        {"": "replay check", "value": f"the step run twice (with the eval callback for the values, without it for the "
                                     f"timeline): max |logits difference| = {rec.replay_max_diff:.3g}"},
        {"": "versions", "value": f"ggviz {__version__}, Python {platform.python_version()}, NumPy {np.__version__}"},
    ]
    body = f"<p>Prompt tokens: {toks}</p>" + table(rows, ["", "value"])
    note = ("One <i>decode step</i> is one call of <code>llama_decode</code> with a batch of one token: the graph of "
            "the whole model is built (or reused), its inputs are set, the CPU backend computes it, and the logits of "
            "the last row come back. The sections below follow that path in order. Everything on this page was "
            "recorded from ggviz's Python mirror of ggml and llama.cpp running the real model file.")
    return Section("overview", "One decode step", _c("llama_decode", "llama_context::decode",
                                                      "llama_sampler_sample"), note, body)


def sec_gguf(rec: Recording) -> Section:
    gf = rec.model.gguf
    sel = "blk.0.attn_q.weight"
    W = _widgets()
    body = ""
    if W is not None and hasattr(W, "GGUFMapWidget"):
        try:
            body = W.GGUFMapWidget(gf, selected=sel).to_html()
        except Exception:  # noqa: BLE001
            body = ""
    if not body:
        from .viz import gguf_map as M
        body = img(fig_png(M.plot_gguf_map(gf, selected=sel)), "GGUF file map")
        body += table([dict(r) for r in M.sections(gf)], ["section", "start", "end", "size", "count"])
    kinds: dict = {}
    for t in gf.tensors:
        kinds.setdefault(t.type_name, [0, 0])
        kinds[t.type_name][0] += 1
        kinds[t.type_name][1] += int(t.nbytes)
    body += "<h3>Tensor data by type</h3>" + table(
        [{"type": k, "tensors": n, "bytes": b} for k, (n, b) in sorted(kinds.items(), key=lambda x: -x[1][1])])
    note = (f"A GGUF file is a header, key-value metadata (hyper-parameters, the tokenizer), one info record per "
            f"tensor (name, shape, type, offset) and then the tensor data, each tensor aligned to "
            f"{gf.alignment} bytes. llama.cpp maps the file into memory and points the weight tensors into it: the "
            f"weights are never copied. Outlined: <code>{sel}</code>, the first matrix layer 0 multiplies by.")
    return Section("gguf", "The model file (GGUF)", _c("gguf_init_from_file", "llama_model_loader",
                                                        "llama_model_load_from_file"), note, body)


def sec_tokenize(rec: Recording) -> Section:
    vocab = rec.model.vocab
    rows = []
    for u in rec.units:
        rows.append({"unit": "special" if u.special else repr(u.text), "byte-level": u.encoded or "",
                     "ids": ", ".join(str(i) for i in u.ids),
                     "tokens": " ".join(f"<span class='sym'>{esc(vocab.tokens[i])}</span>" for i in u.ids),
                     "merges": len(rec.merges.get(u.text, ())) if not u.special else ""})
    frames = []
    for u in rec.units:
        if u.special:
            continue
        start = list(u.encoded)
        ms = rec.merges.get(u.text, [])
        sym = "".join(f"<span class='sym'>{esc(s)}</span>" for s in start)
        frames.append((f"{u.text!r}: the bytes as symbols ({len(start)})",
                       f"<p>word <b>{esc(repr(u.text))}</b>, byte-level <code>{esc(u.encoded)}</code>: start with "
                       f"one symbol per byte</p><p>{sym}</p>", "", ""))
        for m in ms:
            sym = "".join(f"<span class='sym{' new' if i == m.index else ''}'>{esc(s)}</span>"
                          for i, s in enumerate(m.symbols))
            frames.append((f"{u.text!r}: merge {m.step}/{len(ms)}: {m.left} + {m.right} -> {m.merged}",
                           f"<p>word <b>{esc(repr(u.text))}</b>, merge {m.step} of {len(ms)}: the adjacent pair with "
                           f"the lowest rank is <code>{esc(m.left)}</code> + <code>{esc(m.right)}</code> "
                           f"(rank {m.rank} in <code>tokenizer.ggml.merges</code>)</p><p>{sym}</p>", "", ""))
        frames.append((f"{u.text!r}: tokens {list(u.ids)}",
                       f"<p>word <b>{esc(repr(u.text))}</b>: no mergeable pair left; each symbol is a token: "
                       + " ".join(f"<span class='sym'>{esc(vocab.tokens[i])}</span><sub>{i}</sub>" for i in u.ids)
                       + "</p>", "", ""))
    body = (table(rows, ["unit", "byte-level", "merges", "tokens", "ids"]) + "<h3>BPE, merge by merge</h3>"
            + stepper(frames, "bpe-stepper", title="merge"))
    note = ("<code>llama_tokenize</code> first splits off special tokens, then cuts the text into words with the "
            "pre-tokenizer's regex (<code>unicode_regex_split</code>), maps every byte to a printable symbol "
            "(GPT-2's byte-level trick: a space becomes <code>Ġ</code>), and runs byte-pair encoding on each word: "
            "repeatedly merge the adjacent pair that was learnt earliest (lowest rank), until no pair is in the merge "
            "list. " + ("A BOS token is put first because the model's <code>add_bos_token</code> asks for it."
                        if getattr(vocab, "add_bos", False) else
                        "No BOS token is put first: this model's <code>add_bos_token</code> is false."))
    return Section("tokenize", "Tokenization: text to token ids", _c(
        "llama_tokenize", "llama_vocab::impl::tokenize", "llm_tokenizer_bpe_session::tokenize",
        "unicode_regex_split"), note, body)


def _plot_galloc(last, n_nodes, buf_size=None):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from .viz.graph_dot import op_color

    fig, ax = plt.subplots(figsize=(13, 4.2))
    tens = [t for t in last["tensors"] if t.get("offset") is not None and t.get("size")]
    ymax = 1
    from .ggml import consts as C
    for t in tens:
        x0 = t["alloc_node"] if t["alloc_node"] is not None else -1
        x1 = t["free_node"] if t["free_node"] is not None else n_nodes
        y0 = t["offset"] / 1024
        h = max(t["size"] / 1024, 0.05)
        op = t.get("op")
        color = op_color(C.OP_NAMES[op]) if op else "#e0e0e0"
        ax.add_patch(Rectangle((x0, y0), max(x1 - x0, 0.6), h, facecolor=color, edgecolor="#37474f",
                               linewidth=0.2, alpha=0.9))
        ymax = max(ymax, y0 + h)
    ax.set_xlim(-2, n_nodes + 1)
    ax.set_ylim(0, ymax * 1.03)
    ax.set_xlabel("node index (allocated just before the node runs; freed after its last consumer)")
    ax.set_ylabel("offset in the compute buffer (KiB)")
    size = buf_size if buf_size is not None else sum(sum(c) for c in last["chunk_sizes"])
    ax.set_title(f"ggml_gallocr plan: {len(tens)} tensors in a {size / 2**20:.2f} MiB buffer (colour = op)")
    return fig


def _alloc_info(ctx):
    galloc = getattr(ctx, "_galloc", None)
    if galloc is None:
        sched = getattr(ctx, "sched", None) or getattr(ctx, "_sched", None)
        galloc = getattr(sched, "galloc", None)
    return galloc


def sec_memory(rec: Recording) -> Section:
    import matplotlib.pyplot as plt

    from . import ggml
    from .viz import arena as A

    m, ctx = rec.model, rec.ctx
    kv = ctx.kv
    body = []
    # ---- weights
    by_type: dict = {}
    for name, t in m.tensors.items():
        k = "tokens/output" if not name.startswith("blk.") else "layers"
        by_type.setdefault((k, _type(t)), 0)
        by_type[(k, _type(t))] += ggml.nbytes(t)
    rows = [{"where": k, "type": ty, "bytes": b} for (k, ty), b in sorted(by_type.items())]
    bufs = []
    for b in getattr(m, "bufs", []) or []:
        try:
            from .ggml import backend as B
            bufs.append({"buffer": B.backend_buffer_name(b), "size": B.backend_buffer_get_size(b)})
        except Exception:  # noqa: BLE001
            pass
    body.append("<h3>Weights: mapped from the file</h3><div class='row'><div>" + table(rows) + "</div><div>"
                + (table(bufs) + "<p class='muted'>extra buffer types: weights repacked at load for the fast "
                   "mul_mat path</p>" if bufs else "") + "</div></div>")
    fig, axes = plt.subplots(2, 1, figsize=(13, 4.4))
    A.plot_arena(m.ctx_w, ax=axes[0], scale="log", max_labels=12,
                 title=f"weights context (no_alloc): {len(m.ctx_w.objects)} tensor headers, "
                       f"{m.ctx_w.used_mem():,} bytes; the data stays in the file mapping")
    A.plot_arena(kv.ctx, ax=axes[1], scale="sqrt", max_labels=12,
                 title=f"KV cache context: {len(kv.k_l)} K + {len(kv.v_l)} V tensors of {kv.size} cells "
                       f"({ggml.type_name(kv.type_k)}), {kv.ctx.used_mem():,} bytes")
    fig.tight_layout()
    gctx = rec.step.graph.ctx
    body.append("<h3>Contexts: where the tensor structs live</h3>" + img(fig_png(fig, 90), "context arenas")
                + f"<p class='muted'>The graph's own context (llama.cpp's <code>buf_compute_meta</code>, no_alloc) holds "
                  f"{len(gctx.objects)} objects in {gctx.used_mem():,} bytes: "
                  f"{sum(1 for o in gctx.objects if o.type == ggml.GGML_OBJECT_TYPE_TENSOR)} tensor headers (the "
                  f"graph's own tensors: results and views; the weights and the cache are in their own contexts) "
                  f"and the cgraph object (node/leaf arrays, use counts, the hash set).</p>")
    # ---- compute buffer
    galloc = _alloc_info(ctx)
    last = getattr(galloc, "last_alloc", None) if galloc is not None else None
    if last:
        tens = last["tensors"]
        n_reuse = sum(1 for t in tens if t.get("reused_from"))
        n_view = sum(1 for t in tens if t.get("view_src"))
        total = sum(t.get("size") or 0 for t in tens if t.get("offset") is not None and not t.get("view_src"))
        try:
            from .ggml import alloc as GA
            buf = sum(GA.gallocr_get_buffer_size(galloc, i) for i in range(galloc.n_buffers))
        except Exception:  # noqa: BLE001
            buf = sum(sum(c) for c in last["chunk_sizes"])
        fig = _plot_galloc(last, last["n_nodes"], buf)
        body.append("<h3>Compute buffer: the graph allocator's plan</h3>" + img(fig_png(fig, 90), "gallocr plan"))
        body.append(table([{"planned for": f"{last['n_nodes']} nodes, {last['n_leafs']} leafs",
                            "tensors placed": len(tens), "in place (reused a parent)": n_reuse, "views": n_view,
                            "sum of sizes": total, "buffer size": buf,
                            "saved": f"{100 * (1 - buf / max(total, 1)):.0f} %"}]))
        alloc_note = ("The graph allocator (<code>ggml_gallocr</code>) walks the nodes in execution order, gives "
                      "each one memory just before it runs and frees its parents after their last consumer, reusing "
                      "a dying parent's bytes in place when the op allows it: all intermediate results fit in a "
                      "buffer far smaller than their sum. " + (
                          "This plan was made for the decode step's own graph (it did not fit the previous plan)."
                          if any(e["kind"] == "alloc.reserve" for e in rec.step.events) else
                          "This plan is the one in use: <code>ggml_gallocr_reserve</code> made it for the prompt's "
                          "graph; the decode step's graph has the same nodes and fits "
                          "(<code>ggml_gallocr_needs_realloc</code> is false), so "
                          "<code>ggml_gallocr_alloc_graph</code> only replayed it (leafs at x = -1)."))
    else:
        alloc_note = "This build's llama context recorded no graph-allocator plan (<code>galloc.last_alloc</code>)."
    note = ("Three kinds of memory: the <b>weights</b> (mapped from the file, read-only), the <b>KV cache</b> (K and V "
            "of every past token, per layer) and the <b>compute buffer</b> (the graph's intermediate tensors). The "
            "tensor <i>structs</i> live in ggml contexts, which here hold no data (<code>no_alloc</code>): the data "
            "lives in backend buffers. " + alloc_note)
    return Section("memory", "Memory: weights, KV cache, compute buffer", _c(
        "ggml_init(no_alloc)", "ggml_backend_alloc_ctx_tensors_from_buft", "llama_kv_cache::llama_kv_cache",
        "ggml_gallocr_reserve", "ggml_gallocr_alloc_graph", "ggml_dyn_tallocr_alloc"), note, "".join(body))


_OP_NOTES = {
    "GET_ROWS": "copy the token's row out of the embedding matrix (dequantizing it)",
    "RMS_NORM": "x / sqrt(mean(x^2) + eps)",
    "MUL": "element-wise product (here: by the learned norm weights)",
    "MUL_MAT": "matrix x vector: the weights (quantized) times the activations (converted to q8 blocks)",
    "RESHAPE": "a new header over the same bytes (no kernel runs)",
    "VIEW": "a new header over the same bytes (no kernel runs)",
    "PERMUTE": "a new header with swapped ne/nb (no kernel runs)",
    "TRANSPOSE": "a new header with swapped ne/nb (no kernel runs)",
    "ROPE": "rotate pairs of channels by an angle that grows with the position",
    "SET_ROWS": "write this token's K or V into its KV-cache cell",
    "SOFT_MAX": "scale, add the mask (-inf for cells the token may not see), softmax per head",
    "CONT": "copy a strided view into contiguous memory",
    "CPY": "copy/convert",
    "ADD": "element-wise sum: the residual connection",
    "GLU": "SwiGLU: silu(gate) * up",
}


def _frame_values(v) -> str:
    d = np.asarray(v["data"])
    flat = d.reshape(-1).astype(np.float64) if d.dtype.kind in "fiu" else np.zeros(0)
    fin = flat[np.isfinite(flat)] if flat.size else flat
    stats = (f"min {fin.min():.4g}, max {fin.max():.4g}, mean {fin.mean():.4g}, |x| {np.linalg.norm(fin):.4g}"
             if fin.size else "")
    head = ", ".join(f"{x:.4g}" for x in flat[:8])
    pic = ""
    if flat.size and d.dtype.kind == "f":
        arr = d.reshape(-1, d.shape[-1]) if d.ndim > 1 else d.reshape(1, -1)
        arr = arr[np.isfinite(arr).any(axis=1)] if arr.shape[0] > 1 else arr
        if arr.shape[0] == 1 and arr.shape[1] > 96:            # a long vector: wrap it into rows of 64
            n = arr.shape[1]
            w = 64
            pad = (-n) % w
            arr = np.concatenate([arr[0], np.full(pad, np.nan, dtype=np.float32)]).reshape(-1, w)
        arr = arr[:48, :256]
        scale = max(1, min(8, 512 // max(arr.shape[1], 1)))
        pic = img(array_png(arr, scale=scale), f"values of {v['name']}", "image-rendering:pixelated")
    op = v["op"]
    base = op.split(" ")[0].split("(")[0]
    return (f"<p class='kv'><b>#{v['node_n']} {esc(v['name'])}</b> = {esc(op)}({esc(', '.join(v['src']))}) "
            f"&nbsp; {esc(v['type'])} ne={v['shape']}</p>"
            f"<p class='muted'>{esc(_OP_NOTES.get(base, ''))}</p>"
            f"<p class='kv'>{esc(stats)}<br/>first values: [{esc(head)}{', …' if flat.size > 8 else ''}]</p>{pic}")


def sec_graph(rec: Recording) -> Section:
    from .viz import graph_dot as G

    gf = rec.gf
    dot_all, info = G.graph_to_dot_grouped(gf, collapse="all", legend=True, id_prefix="ga-",
                                           title=f"the decode graph: {gf.n_nodes} nodes, one box per layer")
    body = ["<h3>The whole graph, one box per layer</h3>",
            f"<div class='ggv-scroll'>{svg_inline(dot_all.pipe(format='svg'), cls='svgraw')}</div>"]
    layers = sorted({il for il in G.node_layers(gf) if il is not None})
    dot0, info0 = G.graph_to_dot_grouped(gf, collapse=[il for il in layers if il != 0], legend=True, id_prefix="l0-",
                                         title="layer 0 expanded (the other layers folded)")
    shared = svg_inline(dot0.pipe(format="svg"), cls="svgraw")
    frames = []
    for v in rec.values:
        i = v["node_n"]
        if i is None:
            continue
        vid = f"l0-{info0['vertex_of_node'][i]}"
        css = (f"#{vid} polygon,#{vid} path,#{vid} ellipse{{stroke:#d50000 !important;stroke-width:5px !important}}"
               f"#{vid} text{{font-weight:bold}}")
        frames.append((f"#{i} {v['name']} ({v['op']})", _frame_values(v), css, vid))
    visits = [e for e in rec.step.events if e["kind"] == "graph.visit"]
    hits = sum(1 for e in visits if e.get("hit"))
    body.append("<h3>Layer 0, node by node (values copied out by the eval callback)</h3>")
    body.append(stepper(frames, "layer0-stepper", shared=shared, title="node"))
    if visits:
        body.append(f"<p class='muted'>Building this graph, <code>ggml_visit_parents</code> was entered "
                    f"{len(visits)} times; {hits} of those found the tensor already in the graph's hash set "
                    f"(a tensor used by several nodes is added once).</p>")
    note = ("<code>llm_build_llama</code> only <i>describes</i> the computation: every ggml call adds a tensor whose "
            "<code>op</code> and <code>src[]</code> say how to compute it; <code>ggml_build_forward_expand</code> "
            "walks the sources depth-first and lists the nodes in an order where every source comes first. "
            "Boxes are nodes (computed), ellipses leafs (weights, inputs, the KV cache). Step through layer 0: the "
            "slider moves along <code>gf-&gt;nodes</code>, and the values are what the CPU backend computed for "
            "this token, handed out by llama.cpp's eval callback (<code>cb_eval</code>), which splits the compute "
            "at every node it asks for.")
    return Section("graph", "The compute graph", _c("llm_build_llama", "ggml_build_forward_expand",
                                                    "ggml_visit_parents", "ggml_backend_sched_eval_callback"),
                   note, "".join(body))


def sec_plan(rec: Recording) -> Section:
    from .ggml.cpu import ggml_cpu
    from .ggml.tensor import op_desc

    gf = rec.gf
    try:
        from .ggml.cpu import repack as R
    except Exception:  # noqa: BLE001
        R = None
    by_op: dict = {}
    for node in gf.nodes:
        k = op_desc(node)
        r = by_op.setdefault(k, {"op": k, "nodes": 0})
        r["nodes"] += 1
        for n in (1, 2, 3, 4):
            nt = ggml_cpu.get_n_tasks(node, n)
            extra = R.extra_work_size(n, node) if R is not None else None
            ws = extra if extra is not None else ggml_cpu._work_size(node, nt, n)
            r[f"n_tasks@{n}"] = max(r.get(f"n_tasks@{n}", 0), nt)
            r[f"work@{n}"] = max(r.get(f"work@{n}", 0), ws)
    rows = sorted(by_op.values(), key=lambda r: -r["nodes"])
    plans = [e for e in rec.timeline_events if e["kind"] == "cpu.plan"]
    totals = []
    for n in (1, 2, 3, 4):
        p = ggml_cpu.graph_plan(gf, n)
        totals.append({"threads": n, "plan.n_threads": p.n_threads, "work_size": p.work_size})
    body = (table(rows, ["op", "nodes"] + [f"n_tasks@{n}" for n in (1, 2, 3, 4)] + [f"work@{n}" for n in (1, 2, 3, 4)])
            + "<h3>The plan for 1 to 4 threads</h3>" + table(totals))
    if plans:
        p = plans[-1]
        body += (f"<p>The recorded decode: <code>ggml_graph_plan</code> with {p['n_threads']} threads, "
                 f"work_size = {p['work_size']:,} bytes.</p>")
    note = ("Before computing, <code>ggml_graph_plan</code> asks each node how many threads can share it "
            "(<code>ggml_get_n_tasks</code>: views need none, a mul_mat or an add can use all, a softmax at most one "
            "per row) and how much scratch memory it needs; the work buffer is the largest need plus one cache line "
            "per thread. The big item is mul_mat: its F32 input is converted once to the weights' dot-product type "
            "(q8 blocks) in that buffer.")
    return Section("plan", "The CPU plan", _c("ggml_graph_plan", "ggml_get_n_tasks",
                                              "ggml_cpu_extra_work_size"), note, body)


def _timeline_fallback(tl, node_range=None):
    import matplotlib.pyplot as plt

    from .viz.graph_dot import op_color

    c = tl.last
    t0 = c["t_start"]
    fig, ax = plt.subplots(figsize=(13, 1.0 + 0.7 * len(c["threads"])))
    lo, hi = None, None
    for ith, ln in c["threads"].items():
        for s in ln["nodes"]:
            if node_range and not node_range[0] <= s["node_n"] < node_range[1]:
                continue
            a, b = (s["t_start"] - t0) / 1e3, (s["t_end"] - t0) / 1e3
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
            ax.barh(ith, b - a, left=a, height=0.6, color=op_color(s["op"].split(" ")[0]), edgecolor="#455a64",
                    linewidth=0.2)
        for br in ln["barriers"]:
            a, b = (br["t_enter"] - t0) / 1e3, (br["t_exit"] - t0) / 1e3
            if lo is not None and node_range and not (lo <= a <= hi):
                continue
            ax.barh(ith + 0.38, b - a, left=a, height=0.14, color="#9e9e9e")
        for ch in ln["chunks"]:
            a = (ch["t_start"] - t0) / 1e3
            if lo is not None and node_range and not (lo <= a <= hi):
                continue
            ax.plot([a, a], [ith - 0.3, ith - 0.42], color="#0d47a1", linewidth=0.6)
    if node_range and lo is not None:
        ax.set_xlim(lo, hi)
    ax.set_yticks(sorted(c["threads"]))
    ax.set_yticklabels([f"thread {i}" for i in sorted(c["threads"])])
    ax.invert_yaxis()
    ax.set_xlabel("µs since ggml_graph_compute started (bars: nodes by op; grey: barrier waits; ticks: chunks)")
    return fig


def sec_timeline(rec: Recording) -> Section:
    from .viz.graph_dot import node_layers

    tl = rec.timeline
    body = []
    W = _widgets()
    l0 = [i for i, il in enumerate(node_layers(rec.gf)) if il == 0]
    rng = (l0[0], l0[-1] + 1) if l0 else None
    done = False
    if W is not None and hasattr(W, "ThreadTimeline"):
        try:
            w = W.ThreadTimeline(rec.timeline_events, window=len(l0) or 40)
            if l0:
                w.select(l0[0])
                w.set_range(*rng)
            body.append(w.to_html())
            done = True
        except Exception:  # noqa: BLE001
            done = False
    if tl is not None and tl.last is not None:
        c = tl.last
        if not done:
            body.append("<h3>The whole compute</h3>" + img(fig_png(_timeline_fallback(tl), 90), "thread timeline"))
            if rng:
                body.append("<h3>Layer 0 only</h3>" + img(fig_png(_timeline_fallback(tl, rng), 90),
                                                         "thread timeline, layer 0"))
        rows = []
        for ith, ln in c["threads"].items():
            busy = sum(s["t_end"] - s["t_start"] for s in ln["nodes"]) / 1e3
            wait = sum(b["t_exit"] - b["t_enter"] for b in ln["barriers"]) / 1e3
            rows.append({"thread": ith, "node calls": len(ln["nodes"]), "in kernels (µs)": round(busy),
                         "barriers": len(ln["barriers"]), "waiting (µs)": round(wait),
                         "mul_mat chunks claimed": len(ln["chunks"])})
        total = ((c["t_end"] or c["t_start"]) - c["t_start"]) / 1e3
        body.append(f"<h3>Per thread ({total / 1e3:.1f} ms in all)</h3>" + table(rows))
    elif not done:
        body.append("<p>No thread timeline was recorded (ggviz.trace.ComputeTimeline is missing).</p>")
    note = ("<code>ggml_graph_compute</code> wakes the threadpool; every thread runs "
            "<code>ggml_graph_compute_thread</code>: for each node it calls the op's kernel with its index "
            "<code>ith</code> of <code>nth</code>, then waits in <code>ggml_barrier</code> until all threads are "
            "done with that node. Kernels split their work by <code>ith</code>; mul_mat instead hands out chunks "
            "of rows through an atomic counter (<code>current_chunk</code>), so a thread that finishes early takes "
            "the next chunk. The whole timeline is also available as a Chrome/Perfetto trace: "
            "<code>ggviz trace -o trace.json</code>.")
    return Section("timeline", "Threads: the compute, thread by thread", _c(
        "ggml_graph_compute", "ggml_graph_compute_thread", "ggml_barrier", "ggml_compute_forward_mul_mat"),
        note, "".join(body))


def _sched_plan(ctx):
    sc = getattr(ctx, "sched", None)
    return getattr(sc, "last_plan", None) if sc is not None else None


def sec_sched(rec: Recording) -> Section:
    from .ggml.tensor import op_desc

    gf = rec.gf
    plan = _sched_plan(rec.ctx)
    if plan:
        rows = []
        for sp in plan["splits"]:
            ins = ", ".join(f"{i['name']} -> {i['copy']}" if i.get("copy") else i["name"] for i in sp["inputs"])
            rows.append({"split": sp["index"], "backend": sp["backend"],
                         "nodes": f"{sp['i_start']}..{sp['i_end'] - 1}", "n_nodes": sp["n_nodes"],
                         "inputs copied in": ins or "(none)"})
        causes: dict = {}
        for n in plan["nodes"]:
            if n["view_op"]:
                continue
            k = (n["backend"], n["cause"] or "?")
            causes[k] = causes.get(k, 0) + 1
        crow = [{"backend": b, "cause": c, "nodes (views not counted)": n}
                for (b, c), n in sorted(causes.items(), key=lambda x: -x[1])]
        leafs: dict = {}
        for lf in plan["leafs"]:
            k = (lf["backend"], lf.get("buft") or "(graph input)")
            leafs[k] = leafs.get(k, 0) + 1
        lrow = [{"backend": b, "buffer type": bt, "leafs": n} for (b, bt), n in sorted(leafs.items())]
        body = (f"<p>Backends, in priority order: <b>{esc(', '.join(plan['backends']))}</b> (buffer types "
                f"{esc(', '.join(plan['bufts']))}); this graph: <b>{plan['n_splits']} split(s)</b>, "
                f"{plan['n_inputs']} input copies.</p>" + table(rows)
                + "<div class='row'><div><h3>Why each node went where it went</h3>" + table(crow)
                + "</div><div><h3>Leafs</h3>" + table(lrow) + "</div></div>"
                + "<p class='muted'>Causes are ggml's debug tags (<code>SET_CAUSE</code>): 1.dst/1.vsrc "
                  "pre-allocated tensors, 1.inp graph inputs, 1.wgt<i>N</i> the backend of weight src N, 1.off "
                  "offload, 2.sup expansion, 3.upg upgrade, 3.best, 4.vsrc/4.cur views and sources, usr the "
                  "caller's choice.</p>")
        what = (f"the scheduler kept all {gf.n_nodes} nodes in {plan['n_splits']} split(s); with one token there "
                f"is nothing worth offloading (BLAS, like a GPU, gets a matrix product only for large batches)"
                if plan["n_splits"] == 1 else f"{plan['n_splits']} splits")
    else:
        ops = {}
        for n in gf.nodes:
            ops[op_desc(n).split(" ")[0]] = ops.get(op_desc(n).split(" ")[0], 0) + 1
        body = (f"<p><b>CPU only</b>: one backend, so the whole graph is one split: nodes 0..{gf.n_nodes - 1}, "
                f"no copies between backends. Ops in it: "
                + ", ".join(f"{k} &times; {v}" for k, v in sorted(ops.items(), key=lambda x: -x[1])) + ".</p>")
        what = "CPU only, one split"
    note = ("With several backends (a GPU, BLAS, the CPU) <code>ggml_backend_sched</code> assigns every node to a "
            "backend (where its weights live, the graph inputs on the CPU, neighbours following neighbours), cuts "
            "the graph into <i>splits</i> of consecutive nodes on one backend, and copies each split's inputs from "
            f"other backends' memory. This run: {what}.")
    return Section("sched", "The backend scheduler", _c("ggml_backend_sched_split_graph",
                                                        "ggml_backend_sched_alloc_graph",
                                                        "ggml_backend_sched_compute_splits"), note, body)


def sec_kv(rec: Recording) -> Section:
    import matplotlib.pyplot as plt

    ctx = rec.ctx
    kv = ctx.kv
    n_kv = kv.get_n_kv()
    snaps = rec.step.snapshots
    if len(snaps) >= 2:
        try:
            from .viz.model_views import kv_cache_figure
            vocab = rec.model.vocab
            body = (img(fig_png(kv_cache_figure(snaps[0], vocab, title=f"the prompt: {snaps[0].n_tokens} tokens "
                                                f"into cells {list(map(int, snaps[0].k_idxs))}"), 90),
                        "KV cells and mask, prompt")
                    + img(fig_png(kv_cache_figure(snaps[1], vocab, title=f"the decode step: 1 token into cell "
                                                  f"{int(snaps[1].k_idxs[0])}"), 90), "KV cells and mask, step"))
            return _kv_section(rec, body)
        except Exception:  # noqa: BLE001 - fall back to the figure below
            pass
    pos = kv.cells.pos[:n_kv]
    masks = rec.step.masks
    n_show = min(n_kv, max(16, int((pos >= 0).sum()) + 4))
    fig, axes = plt.subplots(1 + len(masks), 1, figsize=(13, 1.2 + 1.1 * (1 + sum(m.shape[0] for m in masks)) / 2),
                             gridspec_kw={"height_ratios": [1] + [max(m.shape[0], 1) for m in masks]})
    ax = axes[0]
    used = (pos[:n_show] >= 0).astype(float)
    ax.imshow(used[None, :], cmap="Greens", vmin=0, vmax=1.3, aspect="auto")
    for i in range(n_show):
        ax.text(i, 0, str(int(pos[i])) if pos[i] >= 0 else "·", ha="center", va="center", fontsize=8)
    ax.set_yticks([])
    ax.set_title(f"KV cells 0..{n_show - 1} of {kv.size} (n_kv = {n_kv} attended): the position each cell holds")
    names = ["prompt", "decode step"] + [f"decode {k}" for k in range(2, len(masks))]
    for k, (ax, mk) in enumerate(zip(axes[1:], masks)):
        part = mk[:, :n_show]
        ax.imshow(np.where(np.isfinite(part), 1.0, 0.0), cmap="Greys_r", vmin=-0.3, vmax=1, aspect="auto")
        ax.set_yticks(range(part.shape[0]))
        ax.set_ylabel("token")
        ax.set_title(f"KQ mask of the {names[k] if k < len(names) else k} ({mk.shape[0]} x {mk.shape[1]}): white = 0 "
                     f"(may attend), black = -inf")
    axes[-1].set_xlabel("KV cell")
    fig.tight_layout()
    return _kv_section(rec, img(fig_png(fig, 90), "KV cells and masks"))


def _kv_section(rec: Recording, body: str) -> Section:
    kv = rec.ctx.kv
    n_kv = kv.get_n_kv()
    body += table([{"cells": kv.size, "used": int(kv.cells.used), "head": kv.head, "n_kv attended": n_kv,
                    "K type": _type(kv.k_l[0]), "K per layer": f"{list(kv.k_l[0].shape[:2])}",
                    "V (transposed)": f"{list(kv.v_l[0].shape[:2])}"}])
    note = ("Each layer keeps K and V of every token seen so far in cells. <code>find_slot</code> gives the new token "
            "the next free cell, <code>apply_ubatch</code> records its position, and the graph writes K and V there "
            "with SET_ROWS. The attention reads the first <code>n_kv</code> cells (rounded up to 256) and the mask "
            "hides what a token may not see: empty cells and, in the prompt, later positions (the causal triangle).")
    return Section("kv", "The KV cache: cells and mask", _c("llama_kv_cache::find_slot",
                                                             "llama_kv_cache::apply_ubatch",
                                                             "llama_kv_cache::set_input_kq_mask"), note, body)


def sec_attention(rec: Recording) -> Section:
    import matplotlib.pyplot as plt

    vocab = rec.model.vocab
    ids = rec.step.prompt_ids + [rec.step.token]
    labels = [_piece(vocab, t).replace("\n", "\\n") or "∅" for t in ids]
    body = []
    pa = rec.prompt_attn
    if pa is not None:
        nh = pa.shape[0]
        cols = min(nh, 5)
        rows_ = math.ceil(nh / cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(2.6 * cols, 2.6 * rows_))
        for h, ax in enumerate(np.atleast_1d(axes).reshape(-1)):
            if h >= nh:
                ax.set_axis_off()
                continue
            ax.imshow(pa[h], cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"head {h}", fontsize=9)
            n = pa.shape[1]
            ax.set_xticks(range(n))
            ax.set_xticklabels(labels[:n], rotation=90, fontsize=7)
            ax.set_yticks(range(n))
            ax.set_yticklabels(labels[:n], fontsize=7)
        fig.suptitle("layer 0, the prompt: softmax(K·Q) per head (row = query token, column = key token)")
        fig.tight_layout()
        body.append(img(fig_png(fig, 90), "prompt attention, layer 0"))
    kq = next((v for v in rec.values if v["name"] == "kq_soft_max-0"), None)
    if kq is not None:
        d = np.asarray(kq["data"])
        w = d.reshape(d.shape[-3], -1)[:, :rec.step.pos + 1]
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ax.imshow(w, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(w.shape[1]))
        ax.set_xticklabels(labels[:w.shape[1]], rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(w.shape[0]))
        ax.set_yticklabels([f"head {h}" for h in range(w.shape[0])], fontsize=8)
        for h in range(w.shape[0]):
            for j in range(w.shape[1]):
                ax.text(j, h, f"{w[h, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if w[h, j] < 0.5 else "black")
        ax.set_title(f"layer 0, the decode step: token {labels[-1]!r} attends to the {w.shape[1]} cells it may see")
        fig.tight_layout()
        body.append(img(fig_png(fig, 90), "decode attention, layer 0"))
    hp = rec.model.hparams
    sink = ""
    if pa is not None and pa.shape[1] > 1:
        heads = [h for h in range(pa.shape[0]) if float(pa[h, 1:, 0].mean()) >= 0.5]
        sink = (f"In the prompt, head(s) {', '.join(map(str, heads))} put most of their weight on the first token "
                f"(an \"attention sink\"); the others spread it, or look at the token itself or the one before."
                if heads else "No head here puts most of its weight on the first token.")
    note = (f"Layer 0 has {hp.n_head} query heads sharing {hp.n_head_kv} K/V heads (grouped-query attention: "
            f"each K/V head serves {hp.n_head // hp.n_head_kv} query heads, by broadcasting in mul_mat). "
            "<code>kq = K·Q</code> scores every visible cell, <code>ggml_soft_max_ext</code> scales by "
            "1/sqrt(head_dim), adds the mask and normalizes each row; the weights then mix the V rows "
            "(<code>kqv</code>). " + sink)
    return Section("attention", "Attention in layer 0", _c("llm_graph_context::build_attn_mha", "ggml_soft_max_ext",
                                                          "ggml_mul_mat"), note, "".join(body))


def sec_logits(rec: Recording) -> Section:
    import matplotlib.pyplot as plt

    vocab = rec.model.vocab
    lg = rec.logits
    top = np.argsort(-lg, kind="stable")[:15]
    p = np.exp(lg - lg.max())
    p /= p.sum()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.barh(range(len(top)), lg[top], color=["#e65100" if t == rec.sampled else "#64b5f6" for t in top])
    ax.set_yticks(range(len(top)))
    ax.set_yticklabels([f"{_piece(vocab, t)!r} ({t})" for t in top], fontsize=8)
    ax.invert_yaxis()
    lo = float(lg[top].min())
    ax.set_xlim(lo - 0.1 * abs(lo) - 1, float(lg[top].max()) + 1)
    for k, t in enumerate(top):
        ax.text(float(lg[t]), k, f"  p={p[t]:.3f}", va="center", fontsize=7)
    ax.set_xlabel(f"logit (of {len(lg)}); orange: the sampled token")
    ax.set_title("the 15 highest logits of the decode step")
    fig.tight_layout()
    body = img(fig_png(fig, 90), "top logits")
    rows = []
    for h in rec.sampler_history:
        rows.append({"step": h["step"], "candidates left": h["n"],
                     "top (token: logit)": ", ".join(f"{_piece(vocab, t)!r}: {v:.2f}" for t, v in h["top"][:5]),
                     "selected": "" if h.get("selected") is None else
                     f"{h['selected']} ({_piece(vocab, h['selected'])!r})"})
    body += "<h3>The sampler chain</h3>" + table(rows)
    try:
        from .viz.model_views import sampler_figure
        body += img(fig_png(sampler_figure(rec.sampler_history, vocab), 80), "sampler chain")
    except ImportError:
        pass
    body += (f"<p>Chosen: <b>{rec.sampled}</b> <span class='sym new'>{esc(_piece(vocab, rec.sampled))}</span>; the "
             f"text so far: <code>{esc(rec.step.prompt + _piece(vocab, rec.step.token) + _piece(vocab, rec.sampled))}"
             f"</code></p>")
    note = ("The last node, <code>result_output</code>, multiplies the final normalized hidden state by the output "
            "matrix (here the token embeddings, tied): one logit per vocabulary entry. "
            "<code>llama_get_logits_ith</code> returns that row; <code>llama_sampler_sample</code> copies it into a "
            "candidate array and runs the chain: top-k keeps the k best, top-p the smallest set with probability "
            "mass p, min-p drops tokens much less likely than the best, temperature divides the logits, and "
            "<code>dist</code> draws one token with a seeded random generator (greedy would take the argmax).")
    return Section("logits", "Logits, sampler, the next token", _c(
        "llama_get_logits_ith", "llama_sampler_sample", "llama_sampler_chain_apply", "llama_sampler_top_k_impl",
        "llama_sampler_dist_apply"), note, body)


SECTIONS = [sec_overview, sec_gguf, sec_tokenize, sec_memory, sec_graph, sec_plan, sec_timeline, sec_sched, sec_kv,
            sec_attention, sec_logits]


def build_report(rec: Recording) -> str:
    """The standalone HTML page of a ``Recording``."""
    import matplotlib
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    secs = []
    for fn in SECTIONS:
        try:
            secs.append(fn(rec))
        except Exception as e:  # noqa: BLE001 - one broken view must not cost the others
            secs.append(Section(fn.__name__[4:], fn.__name__[4:], "", "",
                                f"<p><b>this view failed</b>: {esc(type(e).__name__)}: {esc(e)}</p>"))
    st = rec.step
    vocab = rec.model.vocab
    nav = "".join(f"<a href='#{s.sid}'>{esc(s.title)}</a>" for s in secs)
    title = f"ggviz: one decode step of {rec.model.name or 'the model'}"
    sub = (f"prompt {st.prompt!r} &rarr; decode token {esc(repr(_piece(vocab, st.token)))} at position {st.pos} "
           f"&rarr; next {esc(repr(_piece(vocab, rec.sampled)))}")
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'/>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'/>"
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>{esc(title)}</h1><p>{sub}</p><p>generated by <code>ggviz report</code>: every figure is "
            f"drawn from the recorded run; no network needed.</p></header><nav>{nav}</nav><main>"
            + "".join(s.html() for s in secs)
            + f"</main><script>{_JS}</script></body></html>")


_CACHE: dict = {}


def recording(prompt: str = DEFAULT_PROMPT, threads: int = 2, model=None) -> Recording:
    """``record(prompt, threads, model)``, made once per process for the same arguments (tests, the CLI)."""
    if model is None:
        from .run import load_model
        model = load_model()
    key = (prompt, threads, getattr(model, "path", None), id(model))
    if key not in _CACHE:
        _CACHE[key] = record(prompt, threads, model)
    return _CACHE[key]


def write_report(path="report.html", prompt: str = DEFAULT_PROMPT, threads: int = 2, model=None,
                 rec: Recording | None = None) -> pathlib.Path:
    """Write the report of ``rec`` (default: ``recording(prompt, threads, model)``) to ``path``; returns the path."""
    if rec is None:
        rec = recording(prompt, threads, model)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_report(rec), encoding="utf-8")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ggviz report", description="write a standalone HTML walkthrough of one "
                                 "decode step of the default model")
    ap.add_argument("-o", "--out", default="report.html", help="output file (default: report.html)")
    ap.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help=f"prompt (default: {DEFAULT_PROMPT!r})")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads (default 2)")
    ap.add_argument("-m", "--model", default=None, help="GGUF path (default: the default model)")
    a = ap.parse_args(argv)
    from .run import load_model
    t0 = time.perf_counter()
    path = write_report(a.out, a.prompt, a.threads, load_model(a.model))
    print(f"{path}  ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s) -- open it in a browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
