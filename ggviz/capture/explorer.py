"""One decode step as the ``DecodeExplorer`` draws it: the graph, the scheduler's split, the allocator's plan, the
thread lanes, the trace events, where every tensor's bytes are, the input leafs and (from a second run with the eval
callback) every node's values -- plain data, so an explorer loaded from disk draws the same views with no model.

``record_step(prompt, threads, model, n_ctx, values)`` runs the step (``record_decode``'s two runs when ``values``:
the eval callback copying every node in one, the clean compute the lanes show in the other; both must pick the same
token) and returns the ``StepRecord`` and the live step; ``capture_step(step, values, sampled)`` records a
``DecodeStep`` already run. The record also holds the "sample" phase (``sample_chain``: llama-cli's default chain on
the step's logits, its history and the pieces of the tokens it lists) and, from ``reused_step``, the phases of the
next step, which reuses the graph (``phase_spans`` turns a step's events into phase times).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import llama, trace
from ..ggml import memory
from .decode import DEFAULT_PROMPT, decode_step, record_decode
from .eval_callback import EvalCallback, copy_f32
from .graph import GraphRecord, capture_graph
from .inputs import RecordedPieces
from .plans import AllocRecord, SchedRecord, capture_alloc, capture_sched


@dataclass
class StepRecord:
    """A recorded decode step (``capture.DecodeStep``, as plain data).

    ``prompt``, ``token`` (the token decoded), ``pos`` (its position), ``t_decode_ms``; ``graph``: the step's graph
    (``GraphRecord``); ``sched``: its split (``SchedRecord``); ``alloc``: the compute buffer's plan (``AllocRecord``);
    ``reserve_tokens``: n_tokens of the context's last ``graph_reserve`` (None: none logged); ``events``: every
    trace event of the step; ``compute``: the last graph compute's thread lanes (``trace.ComputeTimeline.last``, or
    None); ``node_bytes`` / ``leaf_bytes``: per node / leaf, where its data pointer is (``memory.resolve``):
    [buffer label, offset], ["outside ggviz buffers", None], or None (no data); ``leaf_values``: {leaf index: the
    input as ``set_inputs`` wrote it}; ``values``: {node index: its output, float32} (the eval callback's run; empty
    without it); ``sampled``: the greedy pick of the step's logits; ``chain``: {"token", "history", "pieces"} of
    ``sample_chain`` on the step's logits (None: no logits); ``reused``: ``reused_step``'s phases of the next step
    (None: not run)."""
    prompt: str
    token: int
    pos: int
    t_decode_ms: float
    graph: GraphRecord
    sched: SchedRecord
    alloc: AllocRecord
    reserve_tokens: int | None
    events: list
    compute: dict | None
    node_bytes: list
    leaf_bytes: list
    leaf_values: dict
    values: dict
    sampled: int | None
    chain: dict | None = None
    reused: dict | None = None


def phase_spans(ev) -> dict:
    """{phase key: (t_first, t_last)} of one decode step's trace events (ns): the graph build (graph.visit / add),
    the scheduler and allocator (sched.*), set_inputs (from the allocation to the first split's compute) and the
    compute."""
    def span(pred):
        ts = [e["t"] for e in ev if pred(e)]
        return (min(ts), max(ts)) if ts else None

    spans = {
        "build_graph": span(lambda e: e["kind"] in ("graph.visit", "graph.add")),
        "sched_alloc": span(lambda e: e["kind"] in ("sched.pass", "sched.assign", "sched.split", "sched.alloc")),
        "compute": span(lambda e: e["kind"] in ("cpu.compute.start", "cpu.compute.end")),
    }
    # set_inputs runs between the allocation and the compute (llm_graph_result::set_inputs has no event of its
    # own): from the sched.alloc event to the start of the first split's compute
    a = [e["t"] for e in ev if e["kind"] == "sched.alloc"]
    c = [e["t_start"] for e in ev if e["kind"] == "sched.compute_split"]
    if a and c and c[0] >= a[-1]:
        spans["set_inputs"] = (a[-1], c[0])
    return spans


def reused_step(ctx, token: int) -> dict | None:
    """Decode ``token`` in ``ctx`` (which has just decoded one token: same shape) under a trace recorder: llama.cpp
    and ggviz reuse the graph (``llm_graph_result::can_reuse``), so the step neither builds nor allocates one. Returns
    {"reused", "total_ms", "ms": {phase: ms}} (None if the decode failed). This is how every later token runs."""
    ctx.cparams.cb_eval = None
    rec = trace.Recorder()
    trace.listen(rec)
    try:
        t0 = time.perf_counter()
        rc = llama.decode(ctx, llama.batch_get_one([int(token)]))
        total = (time.perf_counter() - t0) * 1e3
    finally:
        trace.unlisten(rec)
    if rc != 0:
        return None
    ev = rec.events
    sp = phase_spans(ev)
    return {"reused": any(e["kind"] == "llama.graph_reuse" for e in ev), "total_ms": total,
            "ms": {k: (v[1] - v[0]) / 1e6 for k, v in sp.items() if v is not None}}


# the chain the "sample" phase shows: llama-cli's defaults (common_params_sampling: top-k 40, top-p 0.95, min-p 0.05,
# temperature 0.8, then a seeded draw), seeded so that the page is the same on every build
SAMPLER_CHAIN = (("top_k", 40), ("top_p", 0.95), ("min_p", 0.05), ("temp", 0.8), ("dist", 42))


def sample_chain(ctx, chain=SAMPLER_CHAIN):
    """``llama_sampler_sample`` of a chain built from ``chain`` on the context's last logits: (token, history)."""
    ch = llama.sampler_chain_init()
    for kind, v in chain:
        smpl = {"top_k": lambda: llama.sampler_init_top_k(int(v)), "top_p": lambda: llama.sampler_init_top_p(v, 1),
                "min_p": lambda: llama.sampler_init_min_p(v, 1), "temp": lambda: llama.sampler_init_temp(v),
                "dist": lambda: llama.sampler_init_dist(int(v)), "greedy": llama.sampler_init_greedy}[kind]()
        llama.sampler_chain_add(ch, smpl)
    tok = int(llama.sampler_sample(ch, ctx, -1))
    return tok, [dict(h) for h in ch.history]


def _chain(step, sampled) -> dict | None:
    """The "sample" phase's record: the chain's pick and history, and the pieces of every token they list."""
    try:
        tok, hist = sample_chain(step.ctx)
    except Exception:             # noqa: BLE001 - a context without logits (nothing decoded): no sampler pane
        return None
    ids = [tok] + ([sampled] if sampled is not None else []) + [c["id"] for h in hist for c in h.get("cands", [])]
    return {"token": tok, "history": hist,
            "pieces": RecordedPieces.of(llama.model_get_vocab(step.model), ids).pieces}


def _where(t):
    if not t.data:
        return None
    try:
        _, off, label = memory.resolve(t.data)
        return [label, int(off)]
    except ValueError:
        return ["outside ggviz buffers", None]


def _input_leafs(step, gf) -> dict:
    """{leaf index: value} of the step's input leafs, as ``set_inputs`` wrote them (copied just before the compute)."""
    out: dict = {}
    snap = step.snapshots[-1] if getattr(step, "snapshots", None) else None
    if snap is None:
        return out
    # found by identity, not by name: with an iSWA cache (Gemma-3) two leafs are called attn_inp_kq_mask (and two
    # attn_inp_k_idxs), and the sliding-window ones come first (layer 0 is a sliding-window layer)
    inp = step.graph.inputs
    pairs = [(inp.tokens, snap.tokens), (inp.pos, snap.pos), (inp.kq_mask, snap.kq_mask), (inp.k_idxs, snap.k_idxs)]
    if getattr(snap, "swa", None) is not None:
        pairs += [(inp.kq_mask_swa, snap.swa.kq_mask), (inp.k_idxs_swa, snap.swa.k_idxs)]
    for t, a in pairs:
        j = next((k for k, lf in enumerate(gf.leafs) if t is not None and lf is t), None)
        if j is not None:
            out[j] = np.asarray(a)
    return out


def _step_split(step, sched, gf) -> SchedRecord:
    """The split the step computed with: its own, or -- when it reused the previous decode's graph (llama.cpp's
    graph reuse: the same shapes, e.g. after a one-token prompt, so no new split and no sched.* event) -- the split
    that decode made of the same graph (``DecodeStep.split_events``), marked ``reused``."""
    sid = id(sched)
    if any(e["kind"] == "sched.pass" and e.get("sched") == sid for e in step.events):
        return capture_sched(sched, gf, step.events)
    if not any(e["kind"] == "llama.graph_reuse" for e in step.events):
        raise ValueError("the decode step recorded neither a split of its graph nor a graph reuse")
    rec = capture_sched(sched, gf, getattr(step, "split_events", None) or [])
    rec.reused = True
    return rec


def capture_step(step, values: dict | None = None, sampled: int | None = None, reused: dict | None = None) -> StepRecord:
    """The ``StepRecord`` of a ``DecodeStep`` recorded with ``record=True`` (its events, timeline, the context's
    scheduler and allocator, the sampler chain on its logits, read now while they are alive); ``values``: {node
    index: output array}; ``reused``: ``reused_step``'s result."""
    gf = step.graph.gf
    sched = step.ctx.sched
    log = getattr(step.ctx, "reserve_log", None) or []
    tl = step.timeline
    return StepRecord(
        prompt=step.prompt, token=int(step.token), pos=int(step.pos), t_decode_ms=float(step.t_decode_ms),
        graph=capture_graph(gf), sched=_step_split(step, sched, gf), alloc=capture_alloc(sched.galloc, gf),
        reserve_tokens=int(log[-1]["n_tokens"]) if log else None, events=list(step.events),
        compute=tl.last if tl is not None else None, node_bytes=[_where(t) for t in gf.nodes],
        leaf_bytes=[_where(t) for t in gf.leafs], leaf_values=_input_leafs(step, gf), values=dict(values or {}),
        sampled=sampled, chain=_chain(step, sampled), reused=reused)


def record_step(prompt: str | None = None, threads: int = 2, model=None, n_ctx: int = 256, values: bool = True,
                choose=None):
    """Decode ``prompt`` and then one token (``decode_step``), recording the trace; then (``values``) the same step
    in a second context with the eval callback copying every node's output, and the next token in that context
    (``reused_step``: the graph reused). Both runs must pick the same token. ``choose(step, again)``, if given, returns
    the step to keep: ``step`` or one of its re-recordings (``again()`` decodes the same step anew; the views pass
    the cleanest of a few when a busy machine disturbed the first). Returns ``(StepRecord, DecodeStep)``: the record,
    and the run it was taken from (its context still alive)."""
    prompt = DEFAULT_PROMPT if prompt is None else prompt
    if not values:
        step = decode_step(prompt, threads, model, n_ctx, record=True)
        return capture_step(step, None, int(np.argmax(step.ctx.get_logits_ith(-1)))), step
    cb = EvalCallback(copy=copy_f32, skip_unreadable=True)     # every node, as float32 (numpy order)
    run = record_decode(prompt, threads, model, n_ctx, values=cb, values_first=False, trace_values_run=False)
    step = run.clean_run
    if choose is not None:
        first = step
        step = choose(step, lambda: decode_step(prompt, threads, first.model, n_ctx, record=True))
    copied = {v.node_n: v.data for v in run.values
              if v.node_n is not None and step.graph.gf.nodes[v.node_n].name == v.name}
    sampled = int(np.argmax(step.ctx.get_logits_ith(-1)))
    return capture_step(step, copied, sampled, reused=reused_step(run.values_run.ctx, sampled)), step
