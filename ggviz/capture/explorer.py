"""One decode step as the ``DecodeExplorer`` draws it: the graph, the scheduler's split, the allocator's plan, the
thread lanes, the trace events, where every tensor's bytes are, the input leafs and (from a second run with the eval
callback) every node's values -- plain data, so an explorer loaded from disk draws the same views with no model.

``record_step(prompt, threads, model, n_ctx, values)`` runs the step (``record_decode``'s two runs when ``values``:
the eval callback copying every node in one, the clean compute the lanes show in the other; both must pick the same
token) and returns the ``StepRecord`` and the live step; ``capture_step(step, values, sampled)`` records a
``DecodeStep`` already run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ggml import memory
from .decode import DEFAULT_PROMPT, decode_step, record_decode
from .eval_callback import EvalCallback, copy_f32
from .graph import GraphRecord, capture_graph
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
    without it); ``sampled``: the greedy pick of the step's logits."""
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


def capture_step(step, values: dict | None = None, sampled: int | None = None) -> StepRecord:
    """The ``StepRecord`` of a ``DecodeStep`` recorded with ``record=True`` (its events, timeline, the context's
    scheduler and allocator, read now while they are alive); ``values``: {node index: output array}."""
    gf = step.graph.gf
    sched = step.ctx.sched
    log = getattr(step.ctx, "reserve_log", None) or []
    tl = step.timeline
    return StepRecord(
        prompt=step.prompt, token=int(step.token), pos=int(step.pos), t_decode_ms=float(step.t_decode_ms),
        graph=capture_graph(gf), sched=capture_sched(sched, gf, step.events), alloc=capture_alloc(sched.galloc, gf),
        reserve_tokens=int(log[-1]["n_tokens"]) if log else None, events=list(step.events),
        compute=tl.last if tl is not None else None, node_bytes=[_where(t) for t in gf.nodes],
        leaf_bytes=[_where(t) for t in gf.leafs], leaf_values=_input_leafs(step, gf), values=dict(values or {}),
        sampled=sampled)


def record_step(prompt: str | None = None, threads: int = 2, model=None, n_ctx: int = 256, values: bool = True):
    """Decode ``prompt`` and then one token (``decode_step``), recording the trace; then (``values``) the same step
    in a second context with the eval callback copying every node's output. Both runs must pick the same token.
    Returns ``(StepRecord, DecodeStep)``: the record, and the run it was taken from (its context still alive)."""
    prompt = DEFAULT_PROMPT if prompt is None else prompt
    if not values:
        step = decode_step(prompt, threads, model, n_ctx, record=True)
        return capture_step(step, None, int(np.argmax(step.ctx.get_logits_ith(-1)))), step
    cb = EvalCallback(copy=copy_f32, skip_unreadable=True)     # every node, as float32 (numpy order)
    run = record_decode(prompt, threads, model, n_ctx, values=cb, values_first=False, trace_values_run=False)
    step = run.clean_run
    copied = {v.node_n: v.data for v in run.values
              if v.node_n is not None and step.graph.gf.nodes[v.node_n].name == v.name}
    return capture_step(step, copied, int(np.argmax(step.ctx.get_logits_ith(-1)))), step
