"""``ggviz report``: one decode step of a model (SmolLM2 by default, or Gemma-3) as a standalone HTML page.

    ggviz report [-o report.html] [-p PROMPT] [-t THREADS] [-m MODEL] [--save-recording DIR]
    ggviz report --from-recording DIR [-o report.html]      # the same page again, from the saved record

The page is built from one real run (``record``): the prompt is tokenized and decoded, the greedy next token is
decoded alone (the *decode step*), with llama.cpp's eval callback (``cb_eval``) copying out layer 0's values as
they are computed; then the same prompt and step run again in a second llama context, without the callback (one
uninterrupted graph compute), under ``ggviz.trace`` recorders for the thread timeline. Every figure is drawn from
what those runs left: the GGUF file, the tokenizer's merges, the contexts and buffers, the graph, the plan, the trace
events, the KV cells and mask, the attention weights, the logits and the sampler's steps. Figures are inline (SVG, PNG
data URIs); a few lines of inline JavaScript drive the step sliders; nothing is fetched from the network.

The markup lives in Jinja2 templates, package data under ``ggviz/templates/report/``: ``report.html.j2`` (the page),
``section.html.j2`` (what every section shares: heading, the functions it mirrors, the teacher note),
``sections/<id>.html.j2`` (one per section), ``macros.html.j2`` (tables, images, the step slider) and ``report.css``
/ ``report.js``, inlined into the page. Python computes what each section shows (numbers, rows, figures), the
templates say how it reads.

Two phases: ``capture_report(rec)`` turns the run into the report's record -- each section's record, plain data
of the run (numbers, arrays, the trace events, ``ggviz.capture`` records: the graph, the allocator's plan, the KV
snapshots) -- and ``render_report(doc)`` draws the page from that record alone: each section's ``draw`` makes its
figures and tables from its record, so a record saved to disk (``save_recording``, ``--save-recording DIR``) and
loaded back (``load_recording``, ``--from-recording DIR``) gives the same page byte for byte, drawn again, without a
model. ``build_report(rec)`` is both, ``write_report(path)`` records and writes it.
"""
from __future__ import annotations

import base64
import dataclasses
import io
import math
import os
import pathlib
import platform
import sys
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import graphviz
import jinja2
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from markupsafe import Markup, escape

from .. import __version__, cli, ggml, llama
from ..capture import DEFAULT_PROMPT, EvalCallback, capture_alloc, capture_graph, layer_of, load, record_decode, save
from ..ggml import alloc as GA
from ..ggml import backend as B
from ..ggml.cpu import ggml_cpu, traits
from ..ggml.tensor import op_desc, type_name
from ..progress import progress
from ..run import load_model, make_sampler
from ..viz import arena as A
from ..viz import gguf_map as M
from ..viz import graph_dot as G
from ..viz import widgets
from ..viz.graph_dot import node_layers, op_color
from ..viz.model_views import kv_cache_figure, sampler_figure
from ..viz.widgets._base import array_png, colorbar_html, value_range, wrap_vector
from ..viz.widgets.alloc_view import AllocatorView
from ..viz.widgets.timeline import WALK_LABEL, concurrent_chunks, spin_us, thread_accounting, timeline_data

# names whose values the eval callback copies out besides layer 0's nodes
_EXTRA_VALUES = ("embd", "inp_embd", "result_norm", "result_output")


# ====================================================================================================================
# the run
# ====================================================================================================================

@dataclass
class Recording:
    """Everything one ``record`` run left, as engine objects and plain data."""
    step: object                      # capture.DecodeStep (model, ctx, graph, events of the decode with cb_eval)
    values: list                      # [{node_n, name, op, type, shape, src, data}] copied by cb_eval (layer 0 ...)
    prompt_attn: np.ndarray | None    # kq_soft_max-0 of the prompt: [head, query, cell]
    timeline_events: list             # trace events of the second run's decode (cpu.plan, cpu.node, cpu.chunk ...)
    timeline: object                  # trace.ComputeTimeline of that decode (or None)
    logits: np.ndarray                # logits of the decode step
    replay_max_diff: float            # max |logits(decode with cb_eval) - logits(the same step without it)|
    sampler_history: list             # llama_sampler_chain's steps on those logits
    sampled: int                      # the token the chain picked
    units: list                       # vocab.tokenize_words(prompt): pre-tokenized words + their ids
    merges: dict                      # word -> [BpeMerge] (BPE) or [SpmMerge] (SPM: Gemma-3)
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


def record(prompt: str = DEFAULT_PROMPT, threads: int = 2, model=None, n_ctx: int = 256,
           temp: float = 0.8, seed: int = 1234) -> Recording:
    """Run the decode step (see the module doc) and keep what the report shows."""

    t0 = time.perf_counter()
    # layer 0's values (and _EXTRA_VALUES) in the decode step; kq_soft_max-0 in the prompt's decode
    values = EvalCallback(lambda t: layer_of(t.name or "") == 0 or t.name in _EXTRA_VALUES)
    prompt_attn = EvalCallback(lambda t: t.name == "kq_soft_max-0")
    # then the same step in a second context, without the callback (one uninterrupted compute): the thread timeline
    run = record_decode(prompt, threads, model, n_ctx, values=values, prompt_values=prompt_attn, values_first=True)
    step, step_b = run.values_run, run.clean_run
    logits_a = step.ctx.get_logits_ith(-1).copy()
    logits = step_b.ctx.get_logits_ith(-1).copy()
    tl = step_b.timeline
    chain = make_sampler(temp=temp, seed=seed)
    sampled = llama.sampler_sample(chain, step_b.ctx, -1)
    vocab = llama.model_get_vocab(step.model)
    units = vocab.tokenize_words(prompt, add_special=True, parse_special=True)
    if vocab.type == "SPM":             # SentencePiece (Gemma-3): merges by score, on the escaped fragment
        merges = {u.text: vocab.spm_trace_unit(u) for u in units if not u.special}
    else:
        merges = {u.text: vocab.bpe_trace(u.encoded, encoded=True) for u in units if not u.special}
    kq = prompt_attn.by_name().get("kq_soft_max-0")
    n_p = len(step.prompt_ids)
    pa = kq.reshape(kq.shape[-3], kq.shape[-2], kq.shape[-1])[:, :n_p, :n_p] if kq is not None else None
    return Recording(step=step, values=[v.as_dict() for v in run.values], prompt_attn=pa,
                     timeline_events=step_b.events, timeline=tl,
                     logits=logits, replay_max_diff=float(np.max(np.abs(logits - logits_a))),
                     sampler_history=list(chain.history), sampled=int(sampled), units=units, merges=merges,
                     t_record_s=time.perf_counter() - t0,
                     meta=dict(temp=temp, seed=seed, n_ctx=n_ctx))


def kv_caches(kv) -> list:
    """(label, cache) of a context's KV memory: [("", kv)] for one cache; [("base", ...), ("SWA", ...)] for an iSWA
    one (llama_kv_cache_iswa: Gemma-3's global layers, then its sliding-window layers)."""
    if hasattr(kv, "kv_swa"):
        return [("base", kv.get_base()), ("SWA", kv.get_swa())]
    return [("", kv)]


def graph_builder(model) -> str:
    """llama.cpp's graph builder of the model's architecture (src/models/<arch>.cpp): llm_build_llama, ..."""
    return f"llm_build_{getattr(model, 'arch', 'llama') or 'llama'}"


def _type(t) -> str:
    return type_name(t.type)


# ====================================================================================================================
# templates, figures
# ====================================================================================================================

def esc(s) -> str:
    """``s`` escaped for HTML text or a quoted attribute, as the templates escape it."""
    return str(escape(str(s)))


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _cell(v):
    """A table cell's text: floats to 4 digits, large ints with thousands separators (the template escapes it;
    ``Markup`` passes as it is)."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10000:
        return f"{v:,}"
    return v


_ENV: jinja2.Environment | None = None


def _env() -> jinja2.Environment:
    """The Jinja2 environment of the report's templates (made once): autoescape on for the HTML templates."""
    global _ENV
    if _ENV is None:
        env = jinja2.Environment(loader=jinja2.PackageLoader("ggviz", "templates/report"),
                                 autoescape=jinja2.select_autoescape(enabled_extensions=("html", "html.j2")),
                                 undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        env.filters.update(data_uri=_data_uri, cell=_cell, repr=repr)
        _ENV = env
    return _ENV


def _asset(name: str) -> Markup:
    """``report.css`` / ``report.js``, read as they are (not as templates), to inline into the page: our own files,
    so safe to put into ``<style>`` / ``<script>`` unescaped."""
    env = _env()
    return Markup(env.loader.get_source(env, name)[0])


def fig_png(fig, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def svg_markup(svg_bytes_or_text) -> Markup:
    """Graphviz's SVG output from the ``<svg`` tag on (no XML prolog), marked safe: markup Graphviz generated, to
    be inlined as it is."""
    s = svg_bytes_or_text.decode("utf-8") if isinstance(svg_bytes_or_text, bytes) else svg_bytes_or_text
    i = s.find("<svg")
    return Markup(s[i:] if i >= 0 else s)


def _widgets():
    """ggviz.viz.widgets (the report draws with the widgets' static renderings)."""
    return widgets


def _piece(vocab, tid: int) -> str:
    return vocab.token_to_piece(int(tid), True).decode("utf-8", "replace")


# ====================================================================================================================
# sections: each builds the data its template (templates/report/sections/<sid>.html.j2) shows
# ====================================================================================================================

@dataclass(frozen=True)
class SectionSpec:
    sid: str                                  # the HTML id, the template's name
    title: str
    mirrors: tuple                            # the ggml / llama.cpp functions this section's engine code mirrors
    build: Callable                           # Recording -> the section's record (plain data, saved)
    draw: Callable | None = None              # record -> the template's variables (None: the record is them)


SECTIONS: list[SectionSpec] = []              # in page order


def section(sid: str, title: str, *mirrors: str, draw: Callable | None = None):
    """Register a section's builder (in definition order: the page's order) and ``draw``, what renders its record
    into the template's variables at render time (the figures drawn from the record, not from the run)."""
    def deco(fn):
        SECTIONS.append(SectionSpec(sid, title, mirrors, fn, draw))
        return fn
    return deco


class _Pieces:
    """``token_to_piece`` of the tokens a section's record names (``_pieces``): what the views ask a vocabulary,
    answered without the model."""

    def __init__(self, pieces: dict):
        self.pieces = pieces

    def token_to_piece(self, tid: int, special: bool = True, lstrip: int = 0) -> bytes:
        return self.pieces[int(tid)].encode("utf-8")


def _pieces(vocab, ids) -> dict:
    """{token id: its text} of ``ids``, for ``_Pieces``."""
    return {int(t): _piece(vocab, t) for t in ids}


@section("overview", "One decode step", "llama_decode", "llama_context::decode", "llama_sampler_sample")
def sec_overview(rec: Recording) -> dict:
    m, st = rec.model, rec.step
    hp = m.hparams
    vocab = m.vocab
    greedy = int(rec.logits.argmax())
    rows = [
        {"": "model", "value": f"{m.name or pathlib.Path(m.path).name}: {m.desc()}, {hp.n_layer} layers, "
                               f"n_embd={hp.n_embd}, n_head={hp.n_head} (n_head_kv={hp.n_head_kv}), "
                               f"head_dim={hp.n_embd_head_k}, n_ff={hp.n_ff}, n_vocab={hp.n_vocab}"},
        {"": "prompt", "value": repr(st.prompt)},
        {"": "decode step", "value": f"token {st.token} ({_piece(vocab, st.token)!r}) at position {st.pos}, "
                                     f"{st.n_threads} threads, n_ctx={st.ctx.n_ctx}"},
        {"": "graph", "value": f"{rec.gf.n_nodes} nodes, {rec.gf.n_leafs} leafs ({graph_builder(m)})"},
        {"": "KV cache", "value": "; ".join(
            f"{label + ' cache: ' if label else ''}{len(c.layer_ids)} layers x {c.size} cells, n_kv={c.get_n_kv()}"
            + (f", window {c.n_swa}" if getattr(c, "n_swa", 0) else "") for label, c in kv_caches(st.ctx.kv))},
        {"": "next token", "value": f"{rec.sampled} ({_piece(vocab, rec.sampled)!r}) sampled "
                                    f"(temp {rec.meta['temp']}, seed {rec.meta['seed']}); greedy would pick "
                                    f"{greedy} ({_piece(vocab, greedy)!r})"},
        {"": "timings", "value": f"prompt {st.t_prompt_ms:.0f} ms, decode step {st.t_decode_ms:.0f} ms "
                                 f"(with the eval callback), the whole recording {rec.t_record_s:.1f} s"},
        {"": "replay check", "value": f"the step run twice (with the eval callback for the values, without it for the "
                                     f"timeline): max |logits difference| = {rec.replay_max_diff:.3g}"},
        {"": "versions", "value": f"ggviz {__version__}, Python {platform.python_version()}, NumPy {np.__version__}"},
    ]
    return dict(tokens=[(_piece(vocab, t), t) for t in st.prompt_ids], rows=rows)


_GGUF_SELECTED = "blk.0.attn_q.weight"           # outlined in the file map: the first matrix layer 0 multiplies by


@section("gguf", "The model file (GGUF)", "gguf_init_from_file", "llama_model_loader", "llama_model_load_from_file")
def sec_gguf(rec: Recording) -> dict:
    gf = rec.model.gguf
    # another architecture may name its tensors differently: then the map outlines nothing
    sel = _GGUF_SELECTED if any(t.name == _GGUF_SELECTED for t in gf.tensors) else None
    W = _widgets()
    widget = map_png = sections = None
    if W is not None and hasattr(W, "GGUFMapWidget"):
        widget = Markup(W.GGUFMapWidget(gf, selected=sel).to_html())    # the widget escapes its own text
    else:
        map_png = fig_png(M.plot_gguf_map(gf, selected=sel))
        sections = [dict(r) for r in M.sections(gf)]
    kinds: dict = {}
    for t in gf.tensors:
        kinds.setdefault(t.type_name, [0, 0])
        kinds[t.type_name][0] += 1
        kinds[t.type_name][1] += int(t.nbytes)
    by_type = [{"type": k, "tensors": n, "bytes": b} for k, (n, b) in sorted(kinds.items(), key=lambda x: -x[1][1])]
    return dict(widget=widget, map_png=map_png, sections=sections, by_type=by_type, alignment=gf.alignment,
                selected=sel)


@section("tokenize", "Tokenization: text to token ids", "llama_tokenize", "llama_vocab::impl::tokenize",
         "llm_tokenizer_bpe_session::tokenize", "unicode_regex_split")
def sec_tokenize(rec: Recording) -> dict:
    vocab = rec.model.vocab
    rows = []
    for u in rec.units:
        rows.append({"unit": "special" if u.special else repr(u.text), "byte-level": u.encoded or "",
                     "ids": ", ".join(str(i) for i in u.ids), "tokens": [vocab.tokens[i] for i in u.ids],
                     "merges": len(rec.merges.get(u.text, ())) if not u.special else ""})
    spm = vocab.type == "SPM"
    if spm:
        return dict(rows=rows, frames=_spm_frames(rec), add_bos=bool(getattr(vocab, "add_bos", False)), spm=True,
                    mirrors=("llama_tokenize", "llama_vocab::impl::tokenize", "llm_tokenizer_spm_session::tokenize"))
    # the BPE stepper's frames: per word, its bytes as symbols, each merge, the tokens
    frames = []
    for u in rec.units:
        if u.special:
            continue
        start = list(u.encoded)
        ms = rec.merges.get(u.text, [])
        frames.append(dict(kind="bytes", label=f"{u.text!r}: the bytes as symbols ({len(start)})", css="", focus="",
                           word=u.text, encoded=u.encoded, symbols=start, new=None))
        for m in ms:
            frames.append(dict(kind="merge", label=f"{u.text!r}: merge {m.step}/{len(ms)}: {m.left} + {m.right} -> "
                                                   f"{m.merged}", css="", focus="",
                               word=u.text, merge=m, n_merges=len(ms), symbols=list(m.symbols), new=m.index))
        frames.append(dict(kind="tokens", label=f"{u.text!r}: tokens {list(u.ids)}", css="", focus="", word=u.text,
                           tokens=[(vocab.tokens[i], i) for i in u.ids]))
    return dict(rows=rows, frames=frames, add_bos=bool(getattr(vocab, "add_bos", False)), spm=False)


def _spm_frames(rec: Recording) -> list:
    """The SPM stepper's frames (llm_tokenizer_spm_session): per fragment its characters as symbols, each merge
    (the adjacent pair whose merged text is the token of highest score), the tokens."""
    vocab = rec.model.vocab
    frames = []
    for u in rec.units:
        if u.special:
            continue
        syms = [c for c in u.encoded]                 # one symbol per UTF-8 character (unicode_len_utf8)
        frames.append(dict(kind="bytes", label=f"{u.encoded!r}: the characters as symbols ({len(syms)})", css="",
                           focus="", word=u.text, encoded=u.encoded, symbols=syms, new=None))
        ms = rec.merges.get(u.text, [])
        for m in ms:
            new_syms = [x.decode("utf-8", "backslashreplace") for x in m.symbols]
            left, right = (m.left.decode("utf-8", "backslashreplace"), m.right.decode("utf-8", "backslashreplace"))
            # where the merged symbol is: the first place the old list had left, right and the new one the merge
            at = next((j for j in range(len(new_syms)) if syms[j:j + 2] == [left, right]
                       and syms[:j] == new_syms[:j]), None)
            frames.append(dict(kind="spm_merge", label=f"{u.encoded!r}: merge {m.step}/{len(ms)}: {left} + {right} "
                                                       f"-> {new_syms[at] if at is not None else ''}", css="",
                               focus="", word=u.text, left=left, right=right, score=float(m.score), token=m.token,
                               step=m.step, n_merges=len(ms), symbols=new_syms, new=at))
            syms = new_syms
        frames.append(dict(kind="tokens", label=f"{u.encoded!r}: tokens {list(u.ids)}", css="", focus="",
                           word=u.text, tokens=[(vocab.tokens[i], i) for i in u.ids]))
    return frames


def _alloc_info(ctx):
    galloc = getattr(ctx, "_galloc", None)
    if galloc is None:
        sched = getattr(ctx, "sched", None) or getattr(ctx, "_sched", None)
        galloc = getattr(sched, "galloc", None)
    return galloc


def draw_memory(r: dict) -> dict:
    """The memory section from its record: the arenas (weights, KV caches), the compute buffer's plan."""
    arenas = r["arenas"]
    fig, axes = plt.subplots(len(arenas), 1, figsize=(13, 2.2 * len(arenas)))
    for ax, a in zip(axes, arenas):
        A.plot_arena(None, rows=a["rows"], ax=ax, scale=a["scale"], max_labels=12, title=a["title"])
    fig.tight_layout()
    plan = None
    if r["alloc"] is not None:
        # the allocator view's figure (as notebook 04 draws it): a broken axis, so the 49 MiB output slot does not
        # squash the 1-6 MiB where the layers' tensors live
        plan = dict(png=fig_png(AllocatorView(record=r["alloc"]).figure(highlight=None), 90), row=r["plan_row"],
                    reserved_for_step=r["reserved_for_step"])
    return dict(weights=r["weights"], bufs=r["bufs"], arenas_png=fig_png(fig, 90), graph_ctx=r["graph_ctx"],
                plan=plan)


@section("memory", "Memory: weights, KV cache, compute buffer", "ggml_init(no_alloc)",
         "ggml_backend_alloc_ctx_tensors_from_buft", "llama_kv_cache::llama_kv_cache", "ggml_gallocr_reserve",
         "ggml_gallocr_alloc_graph", "ggml_dyn_tallocr_alloc", draw=draw_memory)
def sec_memory(rec: Recording) -> dict:
    """The weights by type, the model's buffers, the arenas' regions (``arena_map``), the graph context, the
    compute buffer's plan (``AllocRecord``) and its numbers."""
    m, ctx = rec.model, rec.ctx
    kv = ctx.kv
    # ---- weights
    by_type: dict = {}
    for name, t in m.tensors.items():
        k = "tokens/output" if not name.startswith("blk.") else "layers"
        by_type.setdefault((k, _type(t)), 0)
        by_type[(k, _type(t))] += ggml.nbytes(t)
    weights = [{"where": k, "type": ty, "bytes": b} for (k, ty), b in sorted(by_type.items())]
    bufs = [{"buffer": B.backend_buffer_name(b), "size": B.backend_buffer_get_size(b)}
            for b in getattr(m, "bufs", []) or []]
    # ---- contexts
    caches = kv_caches(kv)
    arenas = [dict(rows=[dict(q) for q in A.arena_map(m.ctx_w)], scale="log",
                   title=f"weights context (no_alloc): {len(m.ctx_w.objects)} tensor headers, "
                         f"{m.ctx_w.used_mem():,} bytes; the data stays in the file mapping")]
    for label, c in caches:
        arenas.append(dict(rows=[dict(q) for q in A.arena_map(c.ctx)], scale="sqrt",
                           title=f"{label + ' ' if label else ''}KV cache context: {len(c.k_l)} K + {len(c.v_l)} V "
                                 f"tensors of {c.size} cells ({ggml.type_name(c.type_k)}), {c.ctx.used_mem():,} bytes"))
    gctx = rec.step.graph.ctx
    graph_ctx = dict(n_objects=len(gctx.objects), used_mem=gctx.used_mem(),
                     n_tensors=sum(1 for o in gctx.objects if o.type == ggml.GGML_OBJECT_TYPE_TENSOR))
    # ---- compute buffer
    galloc = _alloc_info(ctx)
    last = getattr(galloc, "last_alloc", None) if galloc is not None else None
    alloc = row = None
    if last:
        tens = last["tensors"]
        total = sum(t.get("size") or 0 for t in tens if t.get("offset") is not None and not t.get("view_src"))
        buf = sum(GA.gallocr_get_buffer_size(galloc, i) for i in range(galloc.n_buffers))
        alloc = capture_alloc(galloc, getattr(ctx.sched, "graph", None), plan=last)
        row = {"planned for": f"{last['n_nodes']} nodes, {last['n_leafs']} leafs", "tensors placed": len(tens),
               "in place (reused a parent)": sum(1 for t in tens if t.get("reused_from")),
               "views": sum(1 for t in tens if t.get("view_src")), "sum of sizes": total, "buffer size": buf,
               "saved": f"{100 * (1 - buf / max(total, 1)):.0f} %"}
    return dict(weights=weights, bufs=bufs, arenas=arenas, graph_ctx=graph_ctx, alloc=alloc, plan_row=row,
                reserved_for_step=any(e["kind"] == "alloc.reserve" for e in rec.step.events))


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
    "GLU": "gated FFN: SwiGLU silu(gate) * up (llama), GEGLU gelu(gate) * up (Gemma-3)",
    "SCALE": "multiply by a constant (Gemma-3: the embeddings by sqrt(n_embd), Q by 1/sqrt(head_dim))",
}


def _frame_values(v) -> dict:
    """What one frame of the layer-0 stepper shows of a value the eval callback copied out."""
    d = np.asarray(v["data"])
    flat = d.reshape(-1).astype(np.float64) if d.dtype.kind in "fiu" else np.zeros(0)
    fin = flat[np.isfinite(flat)] if flat.size else flat
    stats = (f"min {fin.min():.4g}, max {fin.max():.4g}, mean {fin.mean():.4g}, |x| {np.linalg.norm(fin):.4g}"
             if fin.size else "")
    head = ", ".join(f"{x:.4g}" for x in flat[:8])
    pic = cbar = None
    if flat.size and d.dtype.kind == "f":
        arr = d.reshape(-1, d.shape[-1]) if d.ndim > 1 else d.reshape(1, -1)
        arr = arr[np.isfinite(arr).any(axis=1)] if arr.shape[0] > 1 else arr
        arr, blank, w = wrap_vector(arr)                      # a long row or column: a grid, not a 1-pixel strip
        if w is None:
            arr = arr[:48, :256]
        fin = np.isfinite(arr) if blank is None else np.isfinite(arr) & ~blank
        lo, hi = value_range(np.where(fin, arr, np.nan))
        scale = max(1, min(8, 512 // max(arr.shape[1], 1)))
        pic = array_png(arr, vmin=lo, vmax=hi, scale=scale, blank=blank)
        cbar = Markup(colorbar_html(lo, hi, "RdBu_r", label=(f"{flat.size} values wrapped into rows of {w}"
                                                             if w is not None else "")))
    op = v["op"]
    base = op.split(" ")[0].split("(")[0]
    return dict(node_n=v["node_n"], name=v["name"], op=op, src=", ".join(v["src"]), type=v["type"], shape=v["shape"],
                op_note=_OP_NOTES.get(base, ""), stats=stats, head=head, more=flat.size > 8, png=pic, cbar=cbar)


def draw_graph(r: dict) -> dict:
    """The graph section from its record: the whole graph and layer 0 (Graphviz SVG), a frame per value copied."""
    gf = r["graph"].cgraph()
    dot_all, info = G.graph_to_dot_grouped(gf, collapse="all", legend=True, id_prefix="ga-",
                                           title=f"the decode graph: {gf.n_nodes} nodes, one box per layer")
    layers = sorted({il for il in G.node_layers(gf) if il is not None})
    dot0, info0 = G.graph_to_dot_grouped(gf, collapse=[il for il in layers if il != 0], legend=True, id_prefix="l0-",
                                         title="layer 0 expanded (the other layers folded)")
    frames = []
    for v in r["values"]:
        i = v["node_n"]
        vid = f"l0-{info0['vertex_of_node'][i]}"
        # the frame's style: outline its vertex in the layer-0 SVG
        css = (f"#{vid} polygon,#{vid} path,#{vid} ellipse{{stroke:#d50000 !important;stroke-width:5px !important}}"
               f"#{vid} text{{font-weight:bold}}")
        frames.append(dict(label=f"#{i} {v['name']} ({v['op']})", css=css, focus=vid, value=_frame_values(v)))
    builder = r["builder"]
    return dict(builder=builder, mirrors=(builder,) + SECTION_MIRRORS["graph"][1:],
                svg_all=svg_markup(dot_all.pipe(format="svg")), svg_layer0=svg_markup(dot0.pipe(format="svg")),
                frames=frames, n_visits=r["n_visits"], n_hits=r["n_hits"])


@section("graph", "The compute graph", "llm_build_llama", "ggml_build_forward_expand", "ggml_visit_parents",
         "ggml_backend_sched_eval_callback", draw=draw_graph)
def sec_graph(rec: Recording) -> dict:
    """The decode graph (``GraphRecord``), the values the eval callback copied of its nodes, the graph walk's
    visits (``graph.visit`` events: how many found the graph already built)."""
    visits = [e for e in rec.step.events if e["kind"] == "graph.visit"]
    return dict(graph=capture_graph(rec.gf), values=[v for v in rec.values if v["node_n"] is not None],
                n_visits=len(visits), n_hits=sum(1 for e in visits if e.get("hit")), builder=graph_builder(rec.model))


@section("plan", "The CPU plan", "ggml_graph_plan", "ggml_get_n_tasks", "ggml_cpu_extra_work_size")
def sec_plan(rec: Recording) -> dict:

    gf = rec.gf
    by_op: dict = {}
    for node in gf.nodes:
        k = op_desc(node)
        r = by_op.setdefault(k, {"op": k, "nodes": 0})
        r["nodes"] += 1
        for n in (1, 2, 3, 4):
            nt = ggml_cpu.get_n_tasks(node, n)
            extra = traits.extra_work_size(n, node)
            ws = extra if extra is not None else ggml_cpu.node_work_size(node, nt, n)
            r[f"n_tasks@{n}"] = max(r.get(f"n_tasks@{n}", 0), nt)
            r[f"work@{n}"] = max(r.get(f"work@{n}", 0), ws)
    rows = sorted(by_op.values(), key=lambda r: -r["nodes"])
    totals = []
    for n in (1, 2, 3, 4):
        p = ggml_cpu.graph_plan(gf, n)
        totals.append({"threads": n, "plan.n_threads": p.n_threads, "work_size": p.work_size})
    plans = [e for e in rec.timeline_events if e["kind"] == "cpu.plan"]
    return dict(rows=rows, columns=["op", "nodes"] + [f"n_tasks@{n}" for n in (1, 2, 3, 4)]
                + [f"work@{n}" for n in (1, 2, 3, 4)], totals=totals, recorded=plans[-1] if plans else None)


def _timeline_fallback(tl, node_range=None):


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


def draw_timeline(r: dict) -> dict:
    """The timeline section from its record: the thread timeline (widget, or figures), each thread's accounting."""
    events, last, l0 = r["events"], r["last"], r["l0"]
    W = _widgets()
    rng = (l0[0], l0[-1] + 1) if l0 else None
    widget = None
    if W is not None and hasattr(W, "ThreadTimeline"):
        try:
            w = W.ThreadTimeline(events, window=len(l0) or 40, spin=r["spin_us"])
        except ValueError:                      # the recorded compute ran no node: the figures below say so
            w = None
        if w is not None:
            if l0:
                w.select(l0[0])
                w.set_range(*rng)
            widget = Markup(w.to_html())        # the widget escapes its own text
    out = dict(widget=widget, recorded=last is not None, whole_png=None, layer0_png=None,
               threads=[], total_ms=0.0, walk=None, compiled=False, concurrent=0, n_mul_mat=0)
    if out["recorded"]:
        c = last
        tl = types.SimpleNamespace(last=last)
        if widget is None:
            out["whole_png"] = fig_png(_timeline_fallback(tl), 90)
            if rng:
                out["layer0_png"] = fig_png(_timeline_fallback(tl, rng), 90)
        # each thread's wall time split into parts that add up (a MUL_MAT's in-kernel barrier is not counted twice)
        d = dict(timeline_data(events), spin_us=r["spin_us"])
        for a in thread_accounting(d):
            out["threads"].append({"thread": a["thread"], "in kernels (µs)": round(a["kernel_us"]),
                                   "barrier: spinning (µs)": round(a["spin_us"]),
                                   "barrier: asleep (µs)": round(a["sleep_us"]),
                                   "pool: kickoff/join (µs)": round(a["pool_us"]),
                                   "unrecorded (µs)": round(a["other_us"]), "wall (µs)": round(a["wall_us"]),
                                   "mul_mat chunks claimed": a["chunks"]})
        out["walk"] = WALK_LABEL[d["compiled"]]
        out["compiled"] = d["compiled"]
        out["concurrent"] = len(concurrent_chunks(d))
        out["n_mul_mat"] = len({ch["node_n"] for ch in d["chunks"]})
        out["total_ms"] = ((c["t_end"] or c["t_start"]) - c["t_start"]) / 1e6
    return out


@section("timeline", "Threads: the compute, thread by thread", "ggml_graph_compute", "ggml_graph_compute_thread",
         "ggml_barrier", "ggml_compute_forward_mul_mat", draw=draw_timeline)
def sec_timeline(rec: Recording) -> dict:
    """The second run's trace events, its last compute (``ComputeTimeline.last``), layer 0's node numbers and how
    long this machine's barrier spins (``spin_us``: the accounting's split of a wait into spin and sleep)."""
    tl = rec.timeline
    return dict(events=rec.timeline_events, last=tl.last if tl is not None else None,
                l0=[i for i, il in enumerate(node_layers(rec.gf)) if il == 0], spin_us=spin_us())


def _sched_plan(ctx):
    sc = getattr(ctx, "sched", None)
    return getattr(sc, "last_plan", None) if sc is not None else None


def draw_sched(r: dict) -> dict:
    """The scheduler section from its record: the plan's splits, the causes of each node's backend, the leafs."""
    plan = r["plan"]
    if not plan:
        return dict(plan=None, n_nodes=r["n_nodes"], ops=r["ops"])
    splits = []
    for sp in plan["splits"]:
        ins = ", ".join(f"{i['name']} -> {i['copy']}" if i.get("copy") else i["name"] for i in sp["inputs"])
        splits.append({"split": sp["index"], "backend": sp["backend"], "nodes": f"{sp['i_start']}..{sp['i_end'] - 1}",
                       "n_nodes": sp["n_nodes"], "inputs copied in": ins or "(none)"})
    causes: dict = {}
    for n in plan["nodes"]:
        if n["view_op"]:
            continue
        k = (n["backend"], n["cause"] or "?")
        causes[k] = causes.get(k, 0) + 1
    leafs: dict = {}
    for lf in plan["leafs"]:
        k = (lf["backend"], lf.get("buft") or "(graph input)")
        leafs[k] = leafs.get(k, 0) + 1
    return dict(plan=plan, n_nodes=r["n_nodes"], splits=splits,
                causes=[{"backend": b, "cause": c, "nodes (views not counted)": n}
                        for (b, c), n in sorted(causes.items(), key=lambda x: -x[1])],
                leafs=[{"backend": b, "buffer type": bt, "leafs": n} for (b, bt), n in sorted(leafs.items())])


@section("sched", "The backend scheduler", "ggml_backend_sched_split_graph", "ggml_backend_sched_alloc_graph",
         "ggml_backend_sched_compute_splits", draw=draw_sched)
def sec_sched(rec: Recording) -> dict:
    """The scheduler's last plan (``sched.last_plan``: plain data); without one, the graph's ops counted."""
    gf = rec.gf
    plan = _sched_plan(rec.ctx)
    ops: dict = {}
    if not plan:
        for n in gf.nodes:
            ops[op_desc(n).split(" ")[0]] = ops.get(op_desc(n).split(" ")[0], 0) + 1
    return dict(plan=plan, n_nodes=gf.n_nodes, ops=sorted(ops.items(), key=lambda x: -x[1]))


def draw_kv(r: dict) -> dict:
    """The KV section from its record: the cells and masks of the prompt and of the step, the caches' table."""
    snaps = r["snapshots"]
    if len(snaps) >= 2:
        vocab = _Pieces(r["pieces"])
        figs = [(fig_png(kv_cache_figure(snaps[0], vocab, title=f"the prompt: {snaps[0].n_tokens} tokens into cells "
                                                                 f"{list(map(int, snaps[0].k_idxs))}"), 90),
                 "KV cells and mask, prompt"),
                (fig_png(kv_cache_figure(snaps[1], vocab, title=f"the decode step: 1 token into cell "
                                                                 f"{int(snaps[1].k_idxs[0])}"), 90),
                 "KV cells and mask, step")]
    else:
        figs = [(fig_png(_kv_masks_figure(r["cells"], r["masks"]), 90), "KV cells and masks")]
    return dict(figures=figs, rows=r["rows"], iswa=len(r["rows"]) > 1)


@section("kv", "The KV cache: cells and mask", "llama_kv_cache::find_slot", "llama_kv_cache::apply_ubatch",
         "llama_kv_cache::set_input_kq_mask", draw=draw_kv)
def sec_kv(rec: Recording) -> dict:
    """The KV cells and inputs before each compute (``DecodeSnapshot``s, when ``capture_inputs`` ran; else the base
    cache's cell positions and the recorded masks), and each cache's numbers."""
    kv = rec.ctx.kv
    rows = []
    for label, c in kv_caches(kv):
        rows.append({"cache": label or "one", "layers": ", ".join(map(str, c.layer_ids)), "cells": c.size,
                     "used": int(c.cells.used), "head": c.head, "n_kv attended": c.get_n_kv(),
                     "window": c.n_swa or "none", "K type": _type(c.k_l[0]),
                     "K per layer": f"{list(c.k_l[0].shape[:2])}", "V (transposed)": f"{list(c.v_l[0].shape[:2])}",
                     "K+V bytes": sum(ggml.nbytes(t) for t in c.k_l + c.v_l)})
    base = kv_caches(kv)[0][1]              # the base cache's (the recorded masks are attn_inp_kq_mask's)
    n_kv = base.get_n_kv()
    return dict(snapshots=list(rec.step.snapshots), rows=rows, masks=list(rec.step.masks),
                pieces=_pieces(rec.model.vocab, rec.step.prompt_ids + [rec.step.token]),
                cells=dict(size=base.size, n_kv=n_kv, pos=np.array(base.cells.pos[:n_kv])))


def _kv_masks_figure(cells: dict, masks: list):
    """The KV cells and the KQ masks from the cells' positions and the recorded masks (without
    ggviz.viz.model_views' snapshots)."""
    n_kv = cells["n_kv"]
    pos = cells["pos"]
    n_show = min(n_kv, max(16, int((pos >= 0).sum()) + 4))
    fig, axes = plt.subplots(1 + len(masks), 1, figsize=(13, 1.2 + 1.1 * (1 + sum(m.shape[0] for m in masks)) / 2),
                             gridspec_kw={"height_ratios": [1] + [max(m.shape[0], 1) for m in masks]})
    ax = axes[0]
    used = (pos[:n_show] >= 0).astype(float)
    ax.imshow(used[None, :], cmap="Greens", vmin=0, vmax=1.3, aspect="auto")
    for i in range(n_show):
        ax.text(i, 0, str(int(pos[i])) if pos[i] >= 0 else "·", ha="center", va="center", fontsize=8)
    ax.set_yticks([])
    ax.set_title(f"KV cells 0..{n_show - 1} of {cells['size']} (n_kv = {n_kv} attended): the position each cell holds")
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
    return fig


def draw_attention(r: dict) -> dict:
    """The attention section from its record: the prompt's and the decode step's layer-0 attention weights."""
    labels = r["labels"]
    figs = []
    pa = r["prompt_attn"]
    if pa is not None:
        nh = pa.shape[0]
        cols = min(nh, 5)
        rows_ = math.ceil(nh / cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(2.6 * cols + 0.8, 2.6 * rows_), constrained_layout=True)
        im = None
        for h, ax in enumerate(np.atleast_1d(axes).reshape(-1)):
            if h >= nh:
                ax.set_axis_off()
                continue
            im = ax.imshow(pa[h], cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"head {h}", fontsize=9)
            n = pa.shape[1]
            ax.set_xticks(range(n))
            ax.set_xticklabels(labels[:n], rotation=90, fontsize=7)
            ax.set_yticks(range(n))
            ax.set_yticklabels(labels[:n], fontsize=7)
        fig.suptitle("layer 0, the prompt: softmax(K·Q) per head (row = query token, column = key token)")
        fig.colorbar(im, ax=axes, shrink=0.5, label="attention weight")
        figs.append((fig_png(fig, 90), "prompt attention, layer 0"))
    kq = r["kq"]
    if kq is not None:
        d = np.asarray(kq)
        w = d.reshape(d.shape[-3], -1)[:, :r["pos"] + 1]
        fig, ax = plt.subplots(figsize=(8.8, 3.2))
        im = ax.imshow(w, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label="attention weight")
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
        figs.append((fig_png(fig, 90), "decode attention, layer 0"))
    # heads that put most of the prompt's weight on the first token (None: no prompt attention to look at)
    sink_heads = ([h for h in range(pa.shape[0]) if float(pa[h, 1:, 0].mean()) >= 0.5]
                  if pa is not None and pa.shape[1] > 1 else None)
    return dict(figures=figs, hparams=r["hparams"], sink_heads=sink_heads, kq_scale=r["kq_scale"])


@section("attention", "Attention in layer 0", "llm_graph_context::build_attn_mha", "ggml_soft_max_ext",
         "ggml_mul_mat", draw=draw_attention)
def sec_attention(rec: Recording) -> dict:
    """Layer 0's attention weights (kq_soft_max-0) of the prompt and of the decode step, the tokens' labels."""
    vocab = rec.model.vocab
    ids = rec.step.prompt_ids + [rec.step.token]
    kq = next((v for v in rec.values if v["name"] == "kq_soft_max-0"), None)
    # the scale ggml_soft_max_ext applies (op_params[0]): 1/sqrt(head_dim) for llama; 1 for Gemma-3, whose Q was
    # already multiplied by f_attention_scale (a SCALE node before the attention)
    sm = next((t for t in rec.gf.nodes if t.name == "kq_soft_max-0"), None)
    kq_scale = ggml.get_op_params_f32(sm, 0) if sm is not None else None
    return dict(labels=[_piece(vocab, t).replace("\n", "\\n") or "∅" for t in ids], prompt_attn=rec.prompt_attn,
                kq=None if kq is None else np.asarray(kq["data"]), pos=rec.step.pos, kq_scale=kq_scale,
                hparams=rec.model.hparams)


def draw_logits(r: dict) -> dict:
    """The logits section from its record: the highest logits, the sampler chain's steps, the next token."""
    vocab = _Pieces(r["pieces"])
    lg = r["logits"]
    sampled = r["sampled"]
    top = np.argsort(-lg, kind="stable")[:15]
    p = np.exp(lg - lg.max())
    p /= p.sum()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.barh(range(len(top)), lg[top], color=["#e65100" if t == sampled else "#64b5f6" for t in top])
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
    top_png = fig_png(fig, 90)
    rows = []
    for h in r["history"]:
        rows.append({"step": h["step"], "candidates left": h["n"],
                     "top (token: logit)": ", ".join(f"{_piece(vocab, t)!r}: {v:.2f}" for t, v in h["top"][:5]),
                     "selected": "" if h.get("selected") is None else
                     f"{h['selected']} ({_piece(vocab, h['selected'])!r})"})
    chain_png = fig_png(sampler_figure(r["history"], vocab), 80)
    return dict(top_png=top_png, rows=rows, chain_png=chain_png, sampled=sampled, sampled_piece=_piece(vocab, sampled),
                text=r["prompt"] + _piece(vocab, r["token"]) + _piece(vocab, sampled))


@section("logits", "Logits, sampler, the next token", "llama_get_logits_ith", "llama_sampler_sample",
         "llama_sampler_chain_apply", "llama_sampler_top_k_impl", "llama_sampler_dist_apply", draw=draw_logits)
def sec_logits(rec: Recording) -> dict:
    """The decode step's logits, the sampler chain's history, and the text of every token they name."""
    hist = rec.sampler_history
    ids = {rec.sampled, rec.step.token, *np.argsort(-rec.logits, kind="stable")[:15].tolist()}
    for h in hist:
        ids |= {c["id"] for c in h.get("cands", ())} | {t for t, _ in h.get("top", ())}
        if h.get("selected") is not None:
            ids.add(h["selected"])
    return dict(logits=rec.logits, sampled=rec.sampled, history=hist, prompt=rec.step.prompt, token=rec.step.token,
                pieces=_pieces(rec.model.vocab, sorted(ids)))


# ====================================================================================================================
# the page
# ====================================================================================================================

# What may break one view without costing the others: Graphviz's ``dot`` missing or failing (the graph section),
# files that cannot be read, and data a view needs that this model or run does not have (a tensor, a recorded event, a
# sampler step: LookupError, ValueError). Anything else (a TypeError, an AttributeError, a template error) is a bug
# in the report and propagates.
VIEW_ERRORS = (graphviz.ExecutableNotFound, graphviz.CalledProcessError, OSError, LookupError, ValueError)


def _failed(spec: SectionSpec, e: Exception) -> dict:
    warnings.warn(f"ggviz report: the {spec.sid!r} section failed: {type(e).__name__}: {e}", stacklevel=4)
    return dict(error_type=type(e).__name__, error=str(e))


def _section_record(spec: SectionSpec, rec: Recording) -> dict:
    """What one section keeps of the run: its record (plain data), or the failure of a view that could not take
    what it needs."""
    try:
        return dict(sid=spec.sid, title=spec.title, record=_to_plain(spec.build(rec)))
    except VIEW_ERRORS as e:
        return dict(sid=spec.sid, title=spec.title, failed=_failed(spec, e))


def _section_data(spec: SectionSpec, s: dict) -> dict:
    """What one section shows, drawn from its record: its template, the functions it mirrors and the template's
    variables (a failed view: the failure, shown in its place)."""
    if "failed" in s:
        return dict(template="sections/failed.html.j2", mirrors=tuple(spec.mirrors), data=_from_plain(s["failed"]))
    try:
        data = _from_plain(s["record"])
        if spec.draw is not None:
            # as the template would read it from a record of drawn data: tagged values back as they come from disk
            data = _from_plain(_to_plain(spec.draw(data)))
        mirrors = data.pop("mirrors", spec.mirrors)     # a section may name the architecture's own function
        return dict(template=f"sections/{spec.sid}.html.j2", mirrors=tuple(mirrors), data=data)
    except VIEW_ERRORS as e:
        return dict(template="sections/failed.html.j2", mirrors=tuple(spec.mirrors), data=_failed(spec, e))


# The report's record (``capture_report``): plain data ``ggviz.capture.records`` saves -- each section's record
# (what its ``draw`` draws from: numbers, rows, arrays, trace events, ``ggviz.capture`` records, kept as they are; a
# section without ``draw`` keeps its template's variables), the page's header. Three kinds of value are tagged so
# that they come back as they were: markup the page inlines as it is ({"__markup__": text}), bytes ({"__bytes__":
# uint8 array}) and an engine object a template reads attributes of (a BPE merge, the hparams: {"__object__":
# {field: value}}, back as a ``SimpleNamespace``).
REPORT_FORMAT = "ggviz-report-2"
RECORDING_FILE = "report.npz"


def _to_plain(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type) and type(x).__module__.startswith("ggviz.capture."):
        return x                                # a capture record: records.save keeps it (and loads it back)
    if isinstance(x, Markup):
        return {"__markup__": str(x)}
    if isinstance(x, (bytes, bytearray)):
        return {"__bytes__": np.frombuffer(bytes(x), dtype=np.uint8).copy()}
    if x is None or isinstance(x, (bool, int, float, str, np.ndarray, np.generic)):
        return x
    if isinstance(x, list):
        return [_to_plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_to_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_plain(v) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"__object__": {f.name: _to_plain(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    if isinstance(x, types.SimpleNamespace):    # such an object loaded back (``_from_plain``)
        return {"__object__": {k: _to_plain(v) for k, v in vars(x).items()}}
    raise TypeError(f"the report's record cannot hold a {type(x).__module__}.{type(x).__qualname__}")


def _from_plain(x):
    if isinstance(x, list):
        return [_from_plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_from_plain(v) for v in x)
    if not isinstance(x, dict):
        return x
    if "__markup__" in x:
        return Markup(x["__markup__"])
    if "__bytes__" in x:
        return np.asarray(x["__bytes__"], dtype=np.uint8).tobytes()
    if "__object__" in x:
        return types.SimpleNamespace(**{k: _from_plain(v) for k, v in x["__object__"].items()})
    return {k: _from_plain(v) for k, v in x.items()}


def capture_report(rec: Recording, bar=None) -> dict:
    """The report's record of a ``Recording``: {format, header, sections: [{sid, title, record (or failed)}]},
    plain data (``save_recording`` writes it; ``render_report`` draws the page from it, nothing else). ``bar``: a
    ``ggviz.progress`` bar to count the sections on."""
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    sections = []
    for spec in SECTIONS:
        if bar is not None:
            bar.set_postfix_str(spec.sid, refresh=True)
        sections.append(_section_record(spec, rec))
        if bar is not None:
            bar.update(1)
    st = rec.step
    vocab = rec.model.vocab
    header = dict(title=f"ggviz: one decode step of {rec.model.name or 'the model'}", prompt=st.prompt,
                  token_piece=_piece(vocab, st.token), pos=st.pos, next_piece=_piece(vocab, rec.sampled))
    return dict(format=REPORT_FORMAT, header=header, sections=sections)


def render_report(doc: dict) -> str:
    """The standalone HTML page of a report record (``capture_report``'s, or ``load_recording``'s)."""
    if not isinstance(doc, dict) or doc.get("format") != REPORT_FORMAT:
        raise ValueError(f"not a ggviz report record (expected format {REPORT_FORMAT!r})")
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    env = _env()
    specs = {spec.sid: spec for spec in SECTIONS}
    sections = []
    for s in doc["sections"]:
        if s["sid"] not in specs:
            raise ValueError(f"the report record has a section this ggviz does not draw: {s['sid']!r}")
        d = _section_data(specs[s["sid"]], s)
        # rendered by an autoescaping template: safe to put into the page as it is
        html = Markup(env.get_template(d["template"]).render(sid=s["sid"], title=s["title"], mirrors=d["mirrors"],
                                                             **d["data"]))
        sections.append(dict(sid=s["sid"], title=s["title"], html=html))
    return env.get_template("report.html.j2").render(**doc["header"], sections=sections, css=_asset("report.css"),
                                                     js=_asset("report.js"))


def build_report(rec: Recording, bar=None) -> str:
    """The standalone HTML page of a ``Recording``: ``render_report(capture_report(rec))``."""
    return render_report(capture_report(rec, bar))


def save_recording(doc: dict, folder) -> pathlib.Path:
    """Write a report record to ``folder``/report.npz (``ggviz.capture.records``' format); returns the file."""
    return save(doc, pathlib.Path(folder) / RECORDING_FILE)


def load_recording(folder) -> dict:
    """The report record ``save_recording`` wrote to ``folder`` (or to that file)."""
    p = pathlib.Path(folder)
    p = p / RECORDING_FILE if p.is_dir() else p
    if not p.exists():
        raise FileNotFoundError(f"no recording at {str(p)!r} (write one with ggviz report --save-recording DIR)")
    doc = load(p)
    if not isinstance(doc, dict) or doc.get("format") != REPORT_FORMAT:
        raise ValueError(f"{str(p)!r} is not a report recording")
    return doc


SECTION_MIRRORS = {spec.sid: spec.mirrors for spec in SECTIONS}

_CACHE: dict = {}


def recording(prompt: str = DEFAULT_PROMPT, threads: int = 2, model=None) -> Recording:
    """``record(prompt, threads, model)``, made once per process for the same arguments (tests, the CLI)."""
    if model is None or isinstance(model, (str, os.PathLike)):
        model = load_model(model)       # a name of the registry or a GGUF path (None: the default model)
    key = (prompt, threads, getattr(model, "path", None), id(model))
    if key not in _CACHE:
        _CACHE[key] = record(prompt, threads, model)
    return _CACHE[key]


def write_report(path="report.html", prompt: str = DEFAULT_PROMPT, threads: int = 2, model=None,
                 rec: Recording | None = None, disable_progress: bool | None = None, save_to=None,
                 from_recording=None) -> pathlib.Path:
    """Write the report of ``rec`` (default: ``recording(prompt, threads, model)``) to ``path``; returns the path.
    ``save_to``: also save the report's record into that folder (``save_recording``); ``from_recording``: draw the
    page from the record saved in that folder instead (no model loaded, nothing run). A progress bar (the decode
    step, then each section) shows where someone watches (``ggviz.progress``)."""
    if from_recording is not None:
        page = render_report(load_recording(from_recording))
    else:
        with progress(total=1 + len(SECTIONS), desc="ggviz report", unit="step", disable=disable_progress) as bar:
            if rec is None:
                bar.set_postfix_str("record the decode step", refresh=True)
                rec = recording(prompt, threads, model)
            bar.update(1)
            doc = capture_report(rec, bar)
        if save_to is not None:
            save_recording(doc, save_to)
        page = render_report(doc)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="ggviz report", description="write a standalone HTML walkthrough of one "
                            "decode step of a model (default: SmolLM2)")
    ap.add_argument("-o", "--out", default="report.html", type=cli.output_file,
                    help="output file (default: report.html)")
    ap.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help=f"prompt (default: {DEFAULT_PROMPT!r})")
    ap.add_argument("-t", "--threads", type=cli.thread_count, default=2, help="threads (default 2)")
    ap.add_argument("-m", "--model", default=None, type=cli.model_file,
                    help=cli.MODEL_HELP)
    rg = ap.add_mutually_exclusive_group()
    rg.add_argument("--save-recording", metavar="DIR", type=cli.output_dir,
                    help=f"also save the run's records the page is drawn from into DIR ({RECORDING_FILE}), to "
                         "draw it again later")
    rg.add_argument("--from-recording", metavar="DIR",
                    help="draw the page from a recording saved with --save-recording (no model, no decode)")
    a = ap.parse_args(argv)
    if a.from_recording is not None and (a.model or a.prompt != DEFAULT_PROMPT or a.threads != 2):
        ap.error("--from-recording draws a saved run: -m, -p and -t do not apply")
    t0 = time.perf_counter()
    if a.from_recording is not None:
        path = write_report(a.out, from_recording=a.from_recording)
    else:
        path = write_report(a.out, a.prompt, a.threads, load_model(a.model), save_to=a.save_recording)
    print(f"{path}  ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s) -- open it in a browser")
    if a.save_recording is not None:
        print(f"recording saved: {pathlib.Path(a.save_recording) / RECORDING_FILE} "
              f"(ggviz report --from-recording {a.save_recording})")
    return 0


if __name__ == "__main__":
    sys.exit(cli.command_main("report"))
