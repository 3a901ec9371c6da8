"""A real decode step, recorded: the prompt decoded, then the greedy next token decoded alone -- the step every view
of ggviz draws (llama.cpp's ``llama_decode`` twice, as ``llama-simple`` does it).

``decode_step`` runs it once, with ``ggviz.trace`` listening (every event of the step, the thread timeline) and an
optional eval callback; ``record_decode`` runs it twice, once with an ``EvalCallback`` copying values and once
without (one uninterrupted compute, the timeline the user gets), numbers the copied values by node and checks both
runs picked the same token. ``decode_graph`` builds the graph of one token without computing it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import llama, trace
from ..ggml.tensor import get_data
from ..run import load_model
from .eval_callback import EvalCallback
from .inputs import capture_inputs
from .plans import SCHED_KINDS

DEFAULT_PROMPT = "The ggml library is"


@dataclass
class DecodeStep:
    """What ``decode_step`` ran: the llama context after prompt + one token, and what was recorded.

    ``graph`` is the ``GraphResult`` of the decode (``graph.gf`` the cgraph, ``graph.inputs`` its input leafs);
    ``prompt_ids`` the prompt's tokens, ``token`` the token decoded (the greedy pick after the prompt), ``pos`` its
    position; ``events`` every trace event of the decode (when ``record=True``); ``timeline`` the
    ``trace.ComputeTimeline``; ``split_events`` the ``sched.*`` events of the prompt's split (the step's split when
    the step reused the prompt's graph: a one-token prompt gives the step the same shape, so llama.cpp reuses the
    graph and the step splits nothing); ``masks`` the KQ masks set for each decode (prompt first), read through
    ``graph_hook`` just before each compute, and ``snapshots`` the same moments as ``capture.DecodeSnapshot``
    (inputs and KV cells); ``t_decode_ms`` the decode's wall time."""
    model: object
    ctx: object
    prompt: str
    prompt_ids: list
    token: int
    pos: int
    n_threads: int
    graph: object = None
    events: list = field(default_factory=list)
    timeline: object = None
    masks: list = field(default_factory=list)
    snapshots: list = field(default_factory=list)
    split_events: list = field(default_factory=list)
    t_prompt_ms: float = 0.0
    t_decode_ms: float = 0.0


def new_context(model=None, n_ctx: int = 256, threads: int = 2, cb_eval=None,
                flash_attn_type: int = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED):
    """``llama_init_from_model`` with a small KV cache (n_ctx cells) and ``threads`` threads. Flash attention off by
    default here: the exported graphs and steps (and the views and exercises built on them) show attention as
    KQ -> SOFT_MAX -> KQV, with the weights in a tensor; ``flash_attn_type`` = -1 gives llama.cpp's default graph
    (one FLASH_ATTN_EXT per layer)."""

    model = model if model is not None else load_model()
    cp = llama.context_default_params()
    cp.n_ctx = n_ctx
    cp.n_threads = cp.n_threads_batch = threads
    cp.cb_eval = cb_eval
    cp.flash_attn_type = flash_attn_type
    return model, llama.init_from_model(model, cp)


def decode_step(prompt: str = DEFAULT_PROMPT, threads: int = 2, model=None, n_ctx: int = 256, record: bool = True,
                cb_eval=None, cb_eval_prompt=None) -> DecodeStep:
    """Decode ``prompt`` (one ubatch), pick the greedy next token, then decode that token alone: one decode step.

    With ``record`` the second ``llama_decode`` runs under ``trace.Recorder`` (every event) and
    ``trace.ComputeTimeline``. ``cb_eval(tensor, ask)`` (llama.cpp's ``cb_eval``, e.g. an ``EvalCallback``) is
    installed for the decode step, ``cb_eval_prompt`` for the prompt; either splits that compute at the nodes it asks
    for."""

    model, ctx = new_context(model, n_ctx, threads, cb_eval_prompt)
    vocab = llama.model_get_vocab(model)
    ids = llama.tokenize(vocab, prompt, add_special=True, parse_special=True)
    if not ids:
        raise ValueError("the prompt tokenized to zero tokens")
    masks = []
    # the prompt's split, recorded only up to its compute (the graph hook runs after the split and the allocation):
    # the step that follows splits its graph anew -- or, when it reuses the prompt's graph, keeps this split
    split_rec = trace.Recorder(SCHED_KINDS) if record else None

    def hook(res):
        if split_rec is not None:
            trace.unlisten(split_rec)
        masks.append(get_data(res.inputs.kq_mask).reshape(res.n_tokens, -1).copy())

    ctx.graph_hook = hook
    recorders = [trace.Recorder(), trace.ComputeTimeline()] if record else []
    try:
        # the snapshots of the inputs and KV cells, taken by a graph hook chained after the one above
        with capture_inputs(ctx) as snapshots:
            t0 = time.perf_counter()
            if split_rec is not None:
                trace.listen(split_rec)
            try:
                if llama.decode(ctx, llama.batch_get_one(ids)) != 0:
                    raise RuntimeError("llama_decode failed on the prompt")
            finally:
                if split_rec is not None:
                    trace.unlisten(split_rec)
            t_prompt = (time.perf_counter() - t0) * 1e3
            token = int(ctx.get_logits_ith(-1).argmax())
            step = DecodeStep(model=model, ctx=ctx, prompt=prompt, prompt_ids=list(ids), token=token, pos=len(ids),
                              n_threads=threads, masks=masks, snapshots=snapshots, t_prompt_ms=t_prompt,
                              timeline=recorders[1] if record else None)
            ctx.cparams.cb_eval = cb_eval
            for r in recorders:
                trace.listen(r)
            try:
                t0 = time.perf_counter()
                st = llama.decode(ctx, llama.batch_get_one([token]))
                step.t_decode_ms = (time.perf_counter() - t0) * 1e3
            finally:
                for r in recorders:
                    trace.unlisten(r)
    finally:
        ctx.graph_hook = None
    if st != 0:
        raise RuntimeError(f"llama_decode failed on the decode step (status {st})")
    if record:
        step.events = recorders[0].events
        step.split_events = split_rec.events
    step.graph = ctx.last_graph
    return step


@dataclass
class RecordedStep:
    """``record_decode``'s two runs of one decode step: ``values_run`` with the eval callback, ``clean_run`` without
    it; ``values`` what the callback copied, numbered by the values run's graph (``NodeValue.node_n``)."""
    values_run: DecodeStep
    clean_run: DecodeStep
    values: list


def record_decode(prompt: str = DEFAULT_PROMPT, threads: int = 2, model=None, n_ctx: int = 256, *,
                  values: EvalCallback, prompt_values: EvalCallback | None = None, values_first: bool = True,
                  trace_values_run: bool = True, trace_clean_run: bool = True) -> RecordedStep:
    """The decode step twice, in two contexts: once with ``values`` as the eval callback (and ``prompt_values`` for
    the prompt), once without any (one uninterrupted compute: the thread timeline a user gets). ``values_first``:
    which runs first (the second context may reuse the machinery the first one left: ``llama_free``'s pool). The
    copied values are numbered by the values run's graph; both runs must have picked the same token."""
    model = model if model is not None else load_model()

    def values_run():
        return decode_step(prompt, threads, model, n_ctx, record=trace_values_run, cb_eval=values,
                           cb_eval_prompt=prompt_values)

    def clean_run():
        return decode_step(prompt, threads, model, n_ctx, record=trace_clean_run)

    if values_first:
        a = values_run()
        b = clean_run()
    else:
        b = clean_run()
        a = values_run()
    if a.token != b.token:
        raise RuntimeError("the two runs of the decode step disagree on the prompt's greedy token")
    return RecordedStep(values_run=a, clean_run=b, values=values.number(a.graph.gf))


def decode_graph(model=None, n_kv: int = 256):
    """The graph ``llama_decode`` builds for one token (n_tokens = 1, one output, ``n_kv`` attended cells), built
    but neither allocated nor computed. Returns the ``GraphResult`` (``.gf`` is the cgraph)."""
    model, ctx = new_context(model, n_ctx=max(n_kv, 256), threads=1)
    return ctx.build_graph(1, 1, n_kv)
