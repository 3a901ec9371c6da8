"""ggviz: what a llama context keeps so that it does not build again -- no llama.cpp counterpart.

llama-context.cpp builds a graph per ubatch and reuses only the previous one (``llm_graph_result::can_reuse``:
same ``graph_key`` -- n_tokens, n_outputs, n_kv --, only the inputs are set), and allocates and reserves anew in
every ``llama_init_from_model``; that costs microseconds in C and tenths of seconds in Python. So ggviz keeps two
things more, both turned off by ``LLAMA_GRAPH_REUSE_DISABLE`` as llama.cpp's reuse is:

* **the graph cache** (:class:`GraphCache`, a base of ``LlamaContext``): the last ``graph_cache_size`` graphs of
  other keys stay built, split, allocated and compiled (the scheduler's per-graph state,
  ``ggml.sched.backend_sched_save_graph``, with the allocator's plan), so that the decode step after a prompt, or a
  prompt of a length seen before, builds nothing. A restored graph puts back its splits, causes, copies and
  allocator plan, so ``sched.last_plan`` and ``galloc.last_alloc`` describe the graph that runs
  (``n_graph_builds`` / ``n_graph_restored`` count; trace events ``llama.graph_reuse`` with ``cached``,
  ``sched.save_graph``, ``sched.restore_graph``).
* **the context pool**: ``llama_free`` (``LlamaContext.free``) parks the context's backends, KV cache and scheduler
  (compute buffers, graphs) on the model; the next ``init_from_model`` of the same model and shape
  (:func:`machinery_key`) takes them over -- the KV cache cleared as a new one is, the reserve record kept
  (``ctx.recycled``) -- instead of reserving and building again. ``context_pool_clear`` drops them.
"""
from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from .. import trace
from ..ggml import backend as gb
from ..ggml import backend_reg
from ..ggml import sched as gs
from ..ggml.cpu import cpu_feats

# how many allocated graphs a context keeps besides the one in the scheduler (decode, the prompt shapes ...)
GRAPH_CACHE_SIZE = 4


class GraphCache:
    """The graph cache and the takeover of a parked context, as methods of ``LlamaContext`` (which holds the state:
    ``sched``, ``last_graph``, ``_prev_key`` -- the key of the graph in the scheduler --, ``_installed_uid``,
    ``_graph_cache``: key -> (GraphResult, sched graph state), least recently used first)."""

    def _graph_cache_stash(self) -> None:
        """Before the scheduler takes another graph: keep the one it holds (built, split, allocated, compiled) in
        the cache under its key, dropping the least recently used beyond ``graph_cache_size``."""
        key, res = self._prev_key, self.last_graph
        self._prev_key = None
        if key is None or res is None or not self._installed() or self.graph_cache_size <= 0:
            return
        self._graph_cache[key] = (res, gs.backend_sched_save_graph(self.sched))
        self._graph_cache.move_to_end(key)
        while len(self._graph_cache) > self.graph_cache_size:
            _, (_, st) = self._graph_cache.popitem(last=False)
            gs.backend_sched_free_graph_state(self.sched, st)

    def _graph_cache_restore(self, key):
        """The cached graph of ``key`` put back into the scheduler (the one it held is stashed first), or None
        (not cached, or its compute buffers were reallocated since: then it is dropped)."""
        entry = self._graph_cache.pop(key, None)
        if entry is None:
            return None
        res, st = entry
        self._graph_cache_stash()
        if not gs.backend_sched_restore_graph(self.sched, st):
            gs.backend_sched_free_graph_state(self.sched, st)
            return None
        self._prev_key = key
        self._installed_uid = self._sched_uid()
        return res

    def _sched_uid(self):
        """The uid the scheduler's last split gave its first split graph (a new one at every split)."""
        sp = self.sched.splits
        return sp[0].graph.uid if self.sched.n_splits and sp[0].graph is not None else None

    def _installed(self) -> bool:
        """Is the graph this context allocated last still the one in the scheduler? (Somebody may have split and
        allocated another graph on ``ctx.sched`` directly -- the views do -- or reserved.)"""
        return self.sched.is_alloc and self._installed_uid is not None and self._installed_uid == self._sched_uid()

    def graph_cache_clear(self, installed: bool = False) -> None:
        """Drop every cached graph; with ``installed`` also the one in the scheduler (the next ubatch is then built,
        split and allocated whatever its shape)."""
        while self._graph_cache:
            _, (_, st) = self._graph_cache.popitem(last=False)
            gs.backend_sched_free_graph_state(self.sched, st)
        if installed:
            self._prev_key = None

    def graph_cache_keys(self) -> list:
        """The keys (n_tokens, n_outputs, n_kv) of the cached graphs, least recently used first; the graph in the
        scheduler is ``last_graph`` (key ``(n_tokens, n_outputs, n_kv)`` of it)."""
        return list(self._graph_cache)

    def _adopt(self, parked: Parked) -> None:
        """Take over a freed context's scheduler: its compute buffers are what this context's reserve would
        allocate (same model, same shapes: the same three worst-case graphs), its reserve record is this one's, and
        its graphs (the one in the scheduler and the cached ones) are graphs of this context's shapes over the same KV
        cache tensors -- their inputs are set before every compute, as always."""
        self.sched = parked.sched
        self.sched_need_reserve = False
        self.backend_buf_exp_size = list(parked.backend_buf_exp_size)
        self.reserve_log = [dict(e) for e in parked.reserve_log]
        self.reserve_stats = dict(parked.reserve_stats)
        self.flash_attn, self.auto_fa = self.reserve_stats["flash_attn"], False
        self._graph_cache = parked.graph_cache
        self._prev_key, self.last_graph = parked.prev_key, parked.last_graph
        self._installed_uid = parked.installed_uid
        self._graph_template = parked.graph_template
        self._graph_template_pp = parked.graph_template_pp
        if trace.active:
            trace.emit("llama.sched_reserve", ctx=id(self), sched=id(self.sched), recycled=True,
                       sizes={gb.backend_name(b): s for b, s in zip(self.backends, self.backend_buf_exp_size)},
                       bufts=[gb.backend_buft_name(bt) for bt in self.backend_buft], **self.reserve_stats)

    def _park(self) -> None:
        """``free``'s part: leave the backends, the KV cache and the scheduler (with its graphs) for the next context
        of the same model and shape (one parked context per model)."""
        if self.sched is not None and not self.sched_need_reserve:
            pool_put(self.model, self._machinery_key, Parked(
                backends=(self.backends, self.backend_cpu, self.set_n_threads_fns, self.backend_buft),
                kv=self.kv, sched=self.sched, backend_buf_exp_size=self.backend_buf_exp_size,
                reserve_log=self.reserve_log, reserve_stats=self.reserve_stats, graph_cache=self._graph_cache,
                prev_key=self._prev_key, last_graph=self.last_graph, installed_uid=self._installed_uid,
                graph_template=self._graph_template, graph_template_pp=self._graph_template_pp))
        self._graph_cache = OrderedDict()
        self._graph_template = self._graph_template_pp = None


@dataclass
class Parked:
    """What a freed context leaves for the next context of the same model and shape (``machinery_key``):
    llama.cpp allocates and reserves anew in every ``llama_init_from_model`` (a few ms in C); ggviz's reserve
    builds, splits and plans three worst-case graphs in Python (~0.5 s), and its first prompt builds a graph again
    -- the freed context already has all of that, for exactly the same shapes."""
    backends: tuple
    kv: object
    sched: object
    backend_buf_exp_size: list
    reserve_log: list
    reserve_stats: dict
    graph_cache: OrderedDict
    prev_key: object
    last_graph: object
    installed_uid: object
    graph_template: object = None      # the reserve's tg graph if no decode step took it (LlamaContext._derive_graph)
    graph_template_pp: object = None   # the reserve's pp graph, the same


_pool: dict = {}          # id(model) -> (weakref to the model, key, Parked); dropped when the model goes
_pool_lock = threading.Lock()


def machinery_key(model, p, n_ctx: int, ctx) -> tuple:
    """Everything the backends, the KV cache, the reserve and the graphs of a context depend on: its shapes and
    types, the cparams baked into the graph (rope, YaRN), offload settings, and the accelerator devices registered
    now (the backends a new context would get), the CPU variant. Not: thread counts and callbacks (set at each compute)."""
    accel = tuple(gb.backend_dev_name(backend_reg.backend_dev_get(i)) for i in range(backend_reg.backend_dev_count())
                  if gb.backend_dev_type(backend_reg.backend_dev_get(i)) == gb.GGML_BACKEND_DEVICE_TYPE_ACCEL)
    return (n_ctx, ctx.n_batch, ctx.n_ubatch, ctx.n_seq_max, ctx.n_outputs_max, p.type_k, p.type_v, p.flash_attn_type,
            bool(p.embeddings), bool(p.offload_kqv), bool(p.op_offload), ctx.rope_freq_base, ctx.rope_freq_scale,
            ctx.yarn_ext_factor, ctx.yarn_attn_factor, ctx.yarn_beta_fast, ctx.yarn_beta_slow, accel,
            os.environ.get("LLAMA_GRAPH_REUSE_DISABLE") is None, bool(p.use_blas), bool(p.swa_full),
            cpu_feats.cpu_variant())     # the compiled programs bake the variant's lane widths in


def pool_take(model, key):
    with _pool_lock:
        entry = _pool.get(id(model))
        if entry is None or entry[0]() is not model or entry[1] != key:
            return None
        del _pool[id(model)]
        return entry[2]


def pool_put(model, key, parked: Parked) -> None:
    if _closing:                # the interpreter is exiting: nothing will take it, release now
        _release(parked)
        return
    with _pool_lock:
        old = _pool.get(id(model))
        _pool[id(model)] = (weakref.ref(model, lambda _r, i=id(model): _pool_drop(i)), key, parked)
    if old is not None:
        _release(old[2])


def _pool_drop(model_id: int) -> None:
    """The model was garbage-collected: its parked machinery goes too."""
    if _pool is None:           # a model collected while the interpreter tears this module down: nothing left
        return
    with _pool_lock:
        entry = _pool.get(model_id)
        if entry is not None and entry[0]() is None:
            del _pool[model_id]
        else:
            entry = None
    if entry is not None:
        _release(entry[2])


def _release(parked: Parked) -> None:
    for _, st in parked.graph_cache.values():
        gs.backend_sched_free_graph_state(parked.sched, st)
    parked.graph_cache.clear()
    gs.backend_sched_free(parked.sched)


def context_pool_clear(model=None) -> None:
    """Drop the machinery parked by freed contexts (of ``model``, or of every model): their memory goes back."""
    with _pool_lock:
        ids = [id(model)] if model is not None else list(_pool)
        entries = [_pool.pop(i, None) for i in ids]
    for e in entries:
        if e is not None:
            _release(e[2])


_closing = False


@atexit.register
def _at_exit() -> None:
    """Release everything parked while the modules _release needs are still whole (atexit runs before the
    interpreter tears modules down; a model weakref firing afterwards then finds nothing to do)."""
    global _closing
    _closing = True
    context_pool_clear()
