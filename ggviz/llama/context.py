"""llama_context: decode a batch through the model -- mirrors llama.cpp's src/llama-context.cpp.

``llama_context_default_params``, ``llama_init_from_model`` (cparams derived from the model: rope base/scale, YaRN
defaults, n_ctx padded to 256; the worst-case reserve of the compute buffers, ``sched_reserve``), ``decode``
(validate the batch -- ``llama_batch_allocr::init``, batch.py --, split it into ubatches of ``n_ubatch`` tokens,
find the KV slots of all of them -- ``llama_kv_cache::prepare`` --, then for each: ``apply_ubatch``, build the
graph, ``set_inputs``, compute through ``ggml_backend_sched``, copy the output rows of the logits),
``get_logits_ith`` and the scheduler's eval callback (``cb_eval(tensor, ask) -> bool``).

ggviz: a decode that does not succeed (llama.cpp's codes: 1 no KV slot, -1 invalid input, 2 aborted, -2 no compute
buffers; or an exception from a kernel or a callback) leaves the context as it was before the call -- llama.cpp
removes the failed ubatch only. One context decodes in one thread at a time (:class:`ContextBusyError`). Sizes and
thread counts are checked before anything is allocated (:class:`ContextParamsError`). The graph cache and the pool
of freed contexts' machinery are in context_pool.py; PowerInfer's hybrid executor (``hybrid``) is
``_process_ubatch_hybrid``.
"""
from __future__ import annotations

import copy
import functools
import operator
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .. import ggml, trace
from ..ggml import backend as gb
from ..ggml import backend_reg, impl, memory
from ..ggml import alloc as galloc
from ..ggml import sched as gs
from ..ggml.cpu import cpu_backend, hybrid
from . import context_pool
from .batch import LLAMA_MAX_SEQ, DecodeError, batch_allocr_init
from . import models as arch_models
from . import graph_copy
from .graph import LLM_FUSED_OP_FLASH_ATTN, derive_graph, graph_max_nodes
from .kv_cache import KVCache
from .kv_cache_iswa import KVCacheISWA

try:        # RLIMIT_AS (POSIX only): a process limited to less memory than the machine has
    import resource
except ImportError:      # pragma: no cover - Windows
    resource = None

LLAMA_FLASH_ATTN_TYPE_AUTO = -1
LLAMA_FLASH_ATTN_TYPE_DISABLED = 0
LLAMA_FLASH_ATTN_TYPE_ENABLED = 1


@dataclass
class LlamaContextParams:
    """llama_context_params (CPU-relevant fields; 0 means "from the model" as in llama.cpp)."""
    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_threads: int = ggml.GGML_DEFAULT_N_THREADS
    n_threads_batch: int = ggml.GGML_DEFAULT_N_THREADS
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_fast: float = -1.0
    yarn_beta_slow: float = -1.0
    flash_attn_type: int = LLAMA_FLASH_ATTN_TYPE_AUTO
    type_k: int = ggml.GGML_TYPE_F16
    type_v: int = ggml.GGML_TYPE_F16
    cb_eval: object = None
    cb_eval_user_data: object = None
    embeddings: bool = False
    no_perf: bool = False
    abort_callback: object = None
    abort_callback_data: object = None
    offload_kqv: bool = True         # KV cache of offloaded layers on their device
    op_offload: bool = True          # let offload devices take large-batch ops whose weights are in host memory
    n_outputs_max: int = 0           # max outputs of a batch (0: n_batch); the pp reserve graph has min(n_ubatch, this)
    swa_full: bool = True            # a full-size sliding-window KV cache (llama.cpp's default: true)
    use_blas: bool = False           # ggviz: add the BLAS backend (as llama.cpp built with GGML_BLAS); llama.cpp's
                                     # default build has none: prefill MUL_MATs go to the CPU's tinyBLAS / vec_dot
    hybrid: bool = False             # PowerInfer's GGML_USE_HYBRID_THREADING (a build-time choice there): a PWRI
                                     # model's graphs run on ggml_graph_compute_thread_hybrid (thread 0 drives the
                                     # accelerator holding the FFN split) instead of ggml_backend_sched's splits


def _is_blas(dev) -> bool:
    """The BLAS device: present in the registry (ggviz is "built" with GGML_BLAS), used only with ``use_blas``."""
    return gb.backend_dev_name(dev) == "BLAS"


def context_default_params() -> LlamaContextParams:
    return LlamaContextParams()


@dataclass
class _Perf:
    t_start_us: int = 0
    t_load_us: int = 0
    t_p_eval_us: int = 0
    t_eval_us: int = 0
    n_p_eval: int = 0
    n_eval: int = 0


class ContextParamsError(ValueError):
    """A llama_context_params value that cannot work, refused by ``init_from_model`` before anything is allocated
    (or a thread count refused by ``set_n_threads``). ``param``: the field; ``value``: what was asked; ``fits``:
    the largest value that would work (None if none); ``required``/``available``: bytes, for sizes.

    ggviz: the KV cache and the compute buffers of ``n_ctx`` must fit in the memory available (``available_memory``:
    MemAvailable, capped by RLIMIT_AS); llama.cpp finds out when an allocation fails."""

    def __init__(self, msg: str, param: str, value, fits=None, required: int | None = None,
                 available: int | None = None):
        super().__init__(msg)
        self.param, self.value, self.fits = param, value, fits
        self.required, self.available = required, available


class ContextBusyError(DecodeError):
    """The context is already decoding (in another thread, or re-entered from its own callback)."""


class ContextFreedError(DecodeError):
    """The context was freed (``llama_free``): its KV cache and scheduler may belong to a new context now."""


def available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable (/proc/meminfo; else sysconf's available pages), capped by
    RLIMIT_AS minus the address space in use. None if the system does not say."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pass
    if resource is not None:
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            try:
                with open("/proc/self/statm") as f:
                    used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                used = 0
            room = max(0, soft - used)
            avail = room if avail is None else min(avail, room)
    return avail


def context_memory_size(hp, n_ctx: int, n_ubatch: int, n_seq_max: int = 1, n_outputs_max: int = 0,
                        type_k: int = ggml.GGML_TYPE_F16, type_v: int = ggml.GGML_TYPE_F16) -> dict:
    """The bytes a context of ``n_ctx`` cells needs (before it allocates them), as a dict: ``kv`` (the K and V
    tensors of every layer: exact, what llama.cpp logs as "KV buffer size"), ``cells`` (ggviz's per-cell bookkeeping),
    ``compute`` (the reserved compute buffers: an upper bound, within ~10 % of what the reserve allocates -- its peak
    is the larger of the logits [n_vocab, n_outputs] and one layer's attention scores [n_kv, n_tokens, n_head] with
    the mask, plus the activations of n_tokens) and ``total``."""
    n_tokens = min(n_ctx, n_ubatch)                           # the prompt-processing reserve graph
    n_outputs = min(n_tokens, n_outputs_max) if n_outputs_max > 0 else n_tokens
    kv = hp.n_layer * n_ctx * (ggml.row_size(type_k, hp.n_embd_k_gqa) + ggml.row_size(type_v, hp.n_embd_v_gqa))
    cells = n_ctx * (8 + 8 + 216 + max(1, n_seq_max))         # pos, list slot, an empty set(), the seq mask
    logits = 4 * hp.n_vocab * n_outputs
    attn = 4 * n_ctx * n_tokens * (hp.n_head + 1)             # KQ (soft_max works in place) + the KQ mask
    compute = int(1.05 * max(logits, attn)) + 4 * n_tokens * (2 * hp.n_embd + hp.n_ff)
    return dict(kv=kv, cells=cells, compute=compute, total=kv + cells + compute)


def _copy_params(model, params) -> LlamaContextParams:
    """``llama_init_from_model``'s params, checked and copied: C takes ``llama_context_params`` by value."""
    # llama_init_from_model takes llama_context_params by value: the context works on its own copy, so a params
    # object the caller changes later (or hands to a second context) never reaches this one. A shallow copy, as
    # C's: the callbacks and their user data are the caller's objects, the fields are the context's.
    if not isinstance(params, LlamaContextParams):
        raise TypeError(f"llama_init_from_model: params must be llama_context_params, not "
                        f"{type(params).__name__}")
    p = copy.copy(params)
    if p.flash_attn_type not in (LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED,
                                 LLAMA_FLASH_ATTN_TYPE_ENABLED):
        raise ContextParamsError(f"llama_init_from_model: flash_attn_type must be -1 (auto), 0 (disabled) or 1 "
                                 f"(enabled), got {p.flash_attn_type!r}", "flash_attn_type", p.flash_attn_type)
    if getattr(model, "sparse", None) is not None and p.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_ENABLED:
        raise ContextParamsError("llama_init_from_model: a PowerInfer (PWRI) model has no flash attention "
                                 "(PowerInfer's llama.cpp predates it); use flash_attn_type = -1 or 0",
                                 "flash_attn_type", p.flash_attn_type)
    return p


class LlamaContext(context_pool.GraphCache):
    def __init__(self, model, params: LlamaContextParams):
        self.model = model
        hp = model.hparams
        p = _copy_params(model, params)
        n_ctx_req = self._param("n_ctx", p.n_ctx, 0, "0: the model's n_ctx_train")
        n_ctx = n_ctx_req if n_ctx_req > 0 else hp.n_ctx_train
        # the KV cache size is padded to 256 cells (llama_kv_cache::get_padding)
        n_ctx = ggml.GGML_PAD(n_ctx, 256)
        n_batch = self._param("n_batch", p.n_batch, 1)
        n_ubatch = self._param("n_ubatch", p.n_ubatch, 0, "0: n_batch")
        n_seq_max = self._param("n_seq_max", p.n_seq_max, 0)
        if n_seq_max > LLAMA_MAX_SEQ:
            raise ContextParamsError(f"llama_init_from_model: n_seq_max must be <= {LLAMA_MAX_SEQ}, got {n_seq_max}",
                                     "n_seq_max", n_seq_max, LLAMA_MAX_SEQ)
        n_outputs_max = self._param("n_outputs_max", p.n_outputs_max, 0, "0: n_batch")
        for name in ("n_threads", "n_threads_batch"):
            check_n_threads(name, getattr(p, name))
        if p.hybrid:
            _check_hybrid(model, p, p.n_threads, p.n_threads_batch)
        self.cparams = p
        self.n_ctx = n_ctx
        self.n_batch = min(n_ctx, n_batch)
        self.n_ubatch = min(self.n_batch, n_ubatch if n_ubatch > 0 else n_batch)
        self.n_seq_max = max(1, n_seq_max)
        self.n_outputs_max = self.n_batch if n_outputs_max == 0 else n_outputs_max
        self._check_memory(hp, n_ctx_req)
        if n_ctx // self.n_seq_max > hp.n_ctx_train:
            impl.GGML_LOG("warn", f"llama_context: n_ctx_per_seq ({n_ctx // self.n_seq_max}) > n_ctx_train "
                                  f"({hp.n_ctx_train}) -- possible training context overflow")
        self._busy = threading.Lock()       # ggviz: one decode at a time (ContextBusyError)
        self._busy_thread = None
        # cparams derived from the model (llama_init_from_model)
        self.rope_freq_base = p.rope_freq_base if p.rope_freq_base != 0.0 else hp.rope_freq_base_train
        self.rope_freq_scale = p.rope_freq_scale if p.rope_freq_scale != 0.0 else hp.rope_freq_scale_train
        self.yarn_ext_factor = 0.0 if p.yarn_ext_factor < 0.0 else p.yarn_ext_factor
        self.yarn_attn_factor = 1.0 if p.yarn_attn_factor < 0.0 else p.yarn_attn_factor
        self.yarn_beta_fast = 32.0 if p.yarn_beta_fast < 0.0 else p.yarn_beta_fast
        self.yarn_beta_slow = 1.0 if p.yarn_beta_slow < 0.0 else p.yarn_beta_slow
        # cparams.flash_attn / auto_fa: AUTO starts enabled (the KV cache is made for it: V not transposed) and is
        # resolved by the reserve's probe (resolve_fused_ops). ggviz: a PowerInfer model keeps its own attention
        # (PowerInfer's llama.cpp, Dec 2023, has no FLASH_ATTN_EXT), so AUTO is off there from the start.
        self.flash_attn = p.flash_attn_type != LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.auto_fa = p.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_AUTO
        if getattr(model, "sparse", None) is not None:
            self.flash_attn = self.auto_fa = False
        self._freed = False
        # ggviz: the machinery of a context of the same model and shape that was freed (llama_free) is taken over
        # instead of allocated and reserved again (context_pool.py)
        self._machinery_key = context_pool.machinery_key(model, p, n_ctx, self)
        parked = context_pool.pool_take(model, self._machinery_key)
        if parked is not None:
            self.backends, self.backend_cpu, self.set_n_threads_fns, self.backend_buft = parked.backends
            self.kv = parked.kv
            self.kv.clear(True)             # as a new cache: empty cells, zeroed buffers
        else:
            self._init_backends(model, p)
            # the KV cache of each layer lives on the layer's device when offload_kqv (llama_kv_cache's buft per
            # layer)
            kv_bufts = [gb.backend_dev_buffer_type(d) if (p.offload_kqv and d is not None)
                        else gb.backend_cpu_buffer_type() for d in (model.dev_layer or [None] * hp.n_layer)]
            try:
                if arch_models.uses_iswa(hp):      # llama_model::create_memory: sliding-window layers -> iSWA
                    self.kv = KVCacheISWA(hp, n_ctx, p.type_k, p.type_v, v_trans=not self.flash_attn,
                                          bufts=kv_bufts,
                                          n_seq_max=self.n_seq_max, n_ubatch=self.n_ubatch, swa_full=p.swa_full)
                else:
                    self.kv = KVCache(hp, n_ctx, p.type_k, p.type_v, v_trans=not self.flash_attn, bufts=kv_bufts,
                                      n_seq_max=self.n_seq_max)
            except (MemoryError, RuntimeError) as e:       # the estimate said it fits, the allocation says no
                if isinstance(e, RuntimeError) and "failed to allocate" not in str(e):
                    raise
                raise self._memory_refusal(hp, n_ctx_req, f"the KV cache could not be allocated ({e})") from e
        self.logits = np.zeros((0, hp.n_vocab), dtype=np.float32)
        self.output_ids: dict[int, int] = {}
        self.n_outputs = 0
        self.perf = _Perf(t_start_us=int(time.perf_counter() * 1e6), t_load_us=model.t_load_us)
        self.last_graph = None            # the GraphResult of the last ubatch (for the visual layer)
        self.graph_hook = None            # optional callable(GraphResult) before compute (step-through views)
        self.hybrid_records = []          # cparams.hybrid: the last ubatch's timeline (ggml.cpu.hybrid.HybridRecord)
        self._hybrid_galloc = None        # cparams.hybrid: the graph allocator of the hybrid executor's graphs
        self._hybrid_prev = None          # cparams.hybrid: (graph_key, GraphResult) of the last graph it allocated
        self._cb_stopped = False
        # llama.cpp reuses the previous graph when the new ubatch has the same topology (llm_graph_result::can_reuse);
        # LLAMA_GRAPH_REUSE_DISABLE turns that off, as there
        self.graph_reuse = os.environ.get("LLAMA_GRAPH_REUSE_DISABLE") is None
        self._prev_key = None
        self._installed_uid = None       # _sched_uid() of the graph this context put in the scheduler last
        self.n_reused = 0
        # ggviz: the last few graphs of other shapes stay built, split and allocated (context_pool.GraphCache), so
        # that going back to a shape seen before (decode after a prompt) costs nothing either
        self.graph_cache_size = context_pool.GRAPH_CACHE_SIZE
        self._graph_cache: OrderedDict = OrderedDict()      # key -> (GraphResult, sched graph state), LRU last
        self.n_graph_builds = 0           # graphs built for decode (not counting the reserve's), derived ones included
        self.n_graph_restored = 0         # of the reuses, those that put a cached graph back into the scheduler
        self.n_graph_derived = 0          # of the builds, those derived from a reserve's graph (graph.derive_graph)
        self.n_graph_copied = 0           # reserve graphs copied from another reserve's (graph_copy), not built
        # ggviz: the reserve's token-generation graph and its prompt-processing graph (built, split and planned,
        # never allocated), kept so that the first ubatch of the tg shape and the first of any other shape take one
        # instead of building the same nodes again: only their shapes differ (graph.derive_graph). One backend only
        # (with several the split rewrites node sources to copies).
        self._graph_template = None
        self._graph_template_pp = None
        self._build_pins = None           # while building: the scheduler pins of the build's callback
        self._build_norms = None          # while building: the tensors the callback saw named "norm" in a layer
        # the worst-case reserve (llama_context::sched_reserve): the scheduler is created there, and the compute
        # buffers are allocated once, before the first decode
        self.sched = None
        self.sched_need_reserve = True
        self.backend_buf_exp_size = [0] * len(self.backends)   # bytes per backend after the reserve
        self.reserve_log: list[dict] = []                      # one entry per graph_reserve, in order
        self.reserve_stats: dict = {}
        self.recycled = parked is not None     # ggviz: the scheduler and KV cache came from a freed context
        if parked is not None:
            self._adopt(parked)
            return
        try:
            self.sched_reserve()
        except (MemoryError, DecodeError) as e:
            raise self._memory_refusal(hp, n_ctx_req, f"the compute buffers could not be allocated ({e})") from e

    def free(self) -> None:
        """llama_free: the context can no longer be used. ggviz parks its machinery (backends, KV cache, scheduler
        with its compute buffers and graphs) on the model, for the next context of the same shape to take over
        (one parked context per model; ``context_pool_clear`` drops them)."""
        with self._claim("llama_free"):
            if self._freed:
                return
            self._freed = True
            self._park()
            self.sched = None
            self.last_graph = None
            self._prev_key = None
            if self._hybrid_galloc is not None:
                galloc.gallocr_free(self._hybrid_galloc)
                self._hybrid_galloc = None
                self._hybrid_prev = None

    @staticmethod
    def _param(name: str, value, lo: int, note: str = "") -> int:
        try:
            v = operator.index(value)
        except TypeError:
            raise TypeError(f"llama_context_params.{name} must be an integer, not {type(value).__name__}") from None
        if v < lo:
            raise ContextParamsError(f"llama_init_from_model: {name} = {v} must be >= {lo}"
                                     + (f" ({note})" if note else ""), name, v, None)
        return v

    def _need(self, hp, n_ctx: int) -> dict:
        p = self.cparams
        return context_memory_size(hp, n_ctx, min(n_ctx, self.n_ubatch), self.n_seq_max, self.n_outputs_max,
                                   p.type_k, p.type_v)

    def _check_memory(self, hp, n_ctx_req: int) -> None:
        """Refuse an n_ctx whose KV cache and compute buffers cannot be allocated, naming the largest that can --
        before allocating anything. ggviz: llama.cpp finds out when the allocation fails."""
        avail = available_memory()
        if avail is not None and self._need(hp, self.n_ctx)["total"] > avail:
            raise self._memory_refusal(hp, n_ctx_req, None, avail)

    def _memory_refusal(self, hp, n_ctx_req: int, why: str | None, avail: int | None = None) -> ContextParamsError:
        """The ContextParamsError for an n_ctx that does not fit: what it needs, what is available, the largest
        n_ctx (a multiple of 256) whose estimate fits."""
        if avail is None:
            avail = available_memory()
        req = self._need(hp, self.n_ctx)
        fits = None
        if avail is not None:
            # the largest multiple of 256 that fits (_need grows with n_ctx); below n_ctx if its allocation failed
            lo, hi = 0, self.n_ctx // 256 - (1 if why else 0)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._need(hp, mid * 256)["total"] <= avail:
                    lo = mid
                else:
                    hi = mid - 1
            fits = lo * 256 or None
        mib = 1024 * 1024
        n = n_ctx_req or self.n_ctx
        msg = (f"llama_init_from_model: n_ctx = {n} needs {req['total'] / mib:,.0f} MiB (KV cache "
               f"{req['kv'] / mib:,.0f} MiB + compute buffers ~{req['compute'] / mib:,.0f} MiB)")
        if why:
            msg += f", but {why}"
        if avail is not None:
            msg += (f"{'; ' if why else ', but only '}{avail / mib:,.0f} MiB of memory are available; "
                    + (f"the largest n_ctx that fits is {fits}" if fits else "not even n_ctx = 256 fits"))
        return ContextParamsError(msg, "n_ctx", n, fits, req["total"], avail)

    def set_n_threads(self, n_threads: int, n_threads_batch: int) -> None:
        """llama_set_n_threads (the counts are checked as at creation); written to the context's own cparams,
        never to the params object it was created from."""
        n_threads = check_n_threads("n_threads", n_threads)
        n_threads_batch = check_n_threads("n_threads_batch", n_threads_batch)
        if self.cparams.hybrid:
            _check_hybrid(self.model, self.cparams, n_threads, n_threads_batch)
        self.cparams.n_threads = n_threads
        self.cparams.n_threads_batch = n_threads_batch

    def _init_backends(self, model, p):
        """llama_context's constructor: the backends (offload devices, ACCEL devices such as BLAS, the CPU), their
        buffer types and the set_n_threads functions (the scheduler over them is created by ``sched_reserve``)."""
        self.backends = [gb.backend_dev_init(dev, None) for dev in model.devices]
        # add ACCEL backends (such as BLAS)
        for i in range(backend_reg.backend_dev_count()):
            dev = backend_reg.backend_dev_get(i)
            if gb.backend_dev_type(dev) == gb.GGML_BACKEND_DEVICE_TYPE_ACCEL and (p.use_blas or not _is_blas(dev)):
                self.backends.append(gb.backend_dev_init(dev, None))
        # add CPU backend
        self.backend_cpu = backend_reg.backend_init_by_type(gb.GGML_BACKEND_DEVICE_TYPE_CPU, None)
        self.backends.append(self.backend_cpu)
        self.set_n_threads_fns = []
        for b in self.backends:
            reg = gb.backend_dev_backend_reg(gb.backend_get_device(b))
            fn = gb.backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads")
            if fn is not None:
                self.set_n_threads_fns.append((b, fn))
        bufts = []
        for b in self.backends:
            buft = gb.backend_get_default_buffer_type(b)
            if gb.backend_dev_type(gb.backend_get_device(b)) == gb.GGML_BACKEND_DEVICE_TYPE_CPU and model.devices:
                # use the host buffer of the first device CPU for faster transfer of the intermediate state
                host_buft = gb.backend_dev_host_buffer_type(model.devices[0])
                if host_buft is not None:
                    buft = host_buft
            bufts.append(buft)
        self.backend_buft = bufts

    # ---- worst-case reserve (llama_context::sched_reserve / graph_reserve)
    def sched_reserve(self) -> None:
        """llama_context::sched_reserve: create the scheduler and reserve its compute buffers for the worst case.

        Over the full KV cache (``memory->init_full()``: every graph attends all ``n_ctx`` cells), in llama.cpp's
        order: the prompt-processing graph first (``n_tokens = min(n_ctx, n_ubatch)``, ``n_outputs =
        min(n_tokens, n_outputs_max)``) "so that buffers are only allocated once", the token-generation graph
        (1 token, 1 output; it gives the node and split counts of tg), and the pp graph again "to avoid ggml-alloc
        reallocations during inference". The buffers keep the largest size any of them needed; the sizes per
        backend go to ``backend_buf_exp_size`` (llama.cpp's ``sched_reserve: CPU compute buffer size = X MiB``).

        Before them, ``resolve_fused_ops``: with ``flash_attn_type`` AUTO, a 1-token graph is split (not
        allocated) and flash attention stays enabled only if every FLASH_ATTN_EXT node landed on its layer's device
        (on the CPU it does; a layer on a device without the op turns it off). llama.cpp's other probes (Gated Delta
        Net, DeepSeek-V4 HC ...) are for ops ggviz's models do not have."""
        if not self.sched_need_reserve:
            return
        self.sched_need_reserve = False
        t0 = time.perf_counter()
        n_seqs = self.n_seq_max
        n_tokens = min(self.n_ctx, self.n_ubatch)
        max_nodes = graph_max_nodes(self.model)
        if self.sched is not None:
            self.graph_cache_clear()
            gs.backend_sched_free(self.sched)
        self.sched = gs.backend_sched_new(self.backends, self.backend_buft, len(self.backends), max_nodes, False,
                                          self.cparams.op_offload)
        self._prev_key = None
        self.last_graph = None
        self.reserve_log = []
        # ggviz: llama.cpp builds a graph for each of the four reserves below; two are the same graph as an earlier
        # one (the tg probe and the tg reserve; the two pp reserves). With a single backend splitting leaves a graph
        # as it was built (no input copies rewrite a node's sources), so the built graph is reserved again instead
        # of rebuilt: the same nodes, the same sizes, half the Python work of a first context. With several
        # backends each reserve builds its own, as in llama.cpp. The third reserve also puts the first one's
        # allocator plan back instead of planning the same graph again (sched.backend_sched_reserve_again; the real
        # passes when a trace listener is active). And of the two graphs left (1 token, n_ubatch tokens) only the
        # first is built: the second is a copy of it in a new context, laid out as a build there would be, its
        # shapes turned into its own (graph_copy, derive_graph; ~8 ms instead of a ~19 ms build on SmolLM2).
        reuse = {} if len(self.backends) == 1 else None
        self._graph_template = self._graph_template_pp = None
        tg_probe = self.resolve_fused_ops(n_seqs)
        if reuse is not None and tg_probe is not None and self.flash_attn:
            reuse["tg"] = tg_probe        # (a probe that turned flash attention off built the other graph)
        n_outputs_pp = min(n_tokens, self.n_outputs_max)
        # reserve pp (prompt processing) graph first so that buffers are only allocated once
        # (ggviz: with one backend, a copy of the probe's graph turned into the pp graph when it fits: graph_copy)
        pp = self.graph_reserve(n_tokens, n_seqs, n_outputs_pp, copy_of=(reuse or {}).get("tg"))
        if reuse is not None:
            reuse["pp"] = pp
            # ... and its allocator plan, put back by the third reserve if nothing changed (reserve_again)
            reuse["pp_plan"] = gs.backend_sched_save_reserve(self.sched)
        n_splits_pp, n_nodes_pp = gs.backend_sched_get_n_splits(self.sched), pp.gf.n_nodes
        # reserve with tg (token generation) graph to get the number of splits and nodes
        # (ggviz: without the probe's graph, one backend: a copy of the pp graph turned into the tg graph)
        tg = self.graph_reserve(n_seqs, n_seqs, n_seqs, reuse=(reuse or {}).get("tg"),
                                copy_of=pp if reuse is not None and "tg" not in reuse else None)
        n_splits_tg, n_nodes_tg = gs.backend_sched_get_n_splits(self.sched), tg.gf.n_nodes
        # reserve again with pp graph to avoid ggml-alloc reallocations during inference
        self.graph_reserve(n_tokens, n_seqs, n_outputs_pp, reuse=(reuse or {}).get("pp"),
                           plan=(reuse or {}).get("pp_plan"))
        if reuse is not None:
            self._graph_template, self._graph_template_pp = tg, pp
        self.backend_buf_exp_size = [gs.backend_sched_get_buffer_size(self.sched, b) for b in self.backends]
        self.reserve_stats = dict(n_tokens_pp=n_tokens, n_outputs_pp=n_outputs_pp, n_tokens_tg=n_seqs,
                                  n_kv=self.kv.size, n_nodes_pp=n_nodes_pp, n_nodes_tg=n_nodes_tg,
                                  n_splits_pp=n_splits_pp, n_splits_tg=n_splits_tg, max_nodes=max_nodes,
                                  flash_attn=self.flash_attn,
                                  t_us=int((time.perf_counter() - t0) * 1e6))
        if trace.active:
            trace.emit("llama.sched_reserve", ctx=id(self), sched=id(self.sched),
                       sizes={gb.backend_name(b): s for b, s in zip(self.backends, self.backend_buf_exp_size)},
                       bufts=[gb.backend_buft_name(bt) for bt in self.backend_buft], **self.reserve_stats)

    def resolve_fused_ops(self, n_seqs: int) -> None:
        """llama_context::resolve_fused_ops for flash attention (``cparams.auto_fa``): split a graph of one token per
        sequence and keep flash attention only if the scheduler put each FLASH_ATTN_EXT on the device of its layer
        (``model.dev_layer(il)``; the CPU when the layer is not offloaded)."""
        if not self.auto_fa:
            return None
        self.auto_fa = False
        res = self.graph_reserve(n_seqs, n_seqs, n_seqs, split_only=True)
        cpu = gb.backend_get_device(self.backend_cpu)
        mismatch = None
        for op, t, il in res.fused_nodes:
            if op != LLM_FUSED_OP_FLASH_ATTN:
                continue
            backend = gs.backend_sched_get_tensor_backend(self.sched, t)
            dev_fused = gb.backend_get_device(backend) if backend is not None else None
            dev_layer = (self.model.dev_layer[il] if self.model.dev_layer else None) or cpu
            if dev_fused is not dev_layer:
                mismatch = (il, dev_layer, dev_fused)
                break
        if mismatch is not None:
            il, dl, df = mismatch
            impl.GGML_LOG("warn", f"resolve_fused_ops: layer {il} is assigned to device {gb.backend_dev_name(dl)} "
                                  f"but Flash Attention is assigned to device "
                                  f"{gb.backend_dev_name(df) if df is not None else 'none'} (usually due to missing "
                                  f"support)")
            impl.GGML_LOG("warn", "resolve_fused_ops: Flash Attention not supported, set to disabled")
            self.flash_attn = False
        else:
            impl.GGML_LOG("info", "resolve_fused_ops: Flash Attention enabled")
            self.flash_attn = True
        return res

    def graph_reserve(self, n_tokens: int, n_seqs: int, n_outputs: int, split_only: bool = False, reuse=None,
                      plan=None, copy_of=None):
        """llama_context::graph_reserve: build the graph of a dummy ubatch (``n_tokens`` tokens, the first
        ``n_outputs`` of them output) over the full KV cache and reserve the scheduler's buffers for it
        (``ggml_backend_sched_reserve``), or only split it (``split_only``). The scheduler is reset first, so the
        previous graph can no longer be reused. Returns the GraphResult (its inputs are never set). ``reuse``:
        ggviz: the GraphResult of an earlier reserve of the same dummy ubatch, reserved again instead of rebuilt
        (sched_reserve); ``plan``: what the scheduler kept of that reserve (``backend_sched_save_reserve``): the graph
        is split again and the allocator's plan put back, not made again (``backend_sched_reserve_again``: the same
        plan, no reallocation; the real reserve with a trace listener or when anything differs); ``copy_of``: ggviz:
        the built graph of another reserve, copied and turned into this one's shape instead of a build where it
        can be (``_copy_graph``)."""
        if n_tokens % n_seqs != 0:
            n_tokens = ((n_tokens + (n_seqs - 1)) // n_seqs) * n_seqs   # round to next multiple of n_seqs
        gs.backend_sched_reset(self.sched)
        # when the scheduler is reset, we cannot reuse old graphs
        self._prev_key = None
        # memory->init_full(): the graph attends the whole cache
        res = reuse
        if res is None and copy_of is not None:
            res = self._copy_graph(copy_of, n_tokens, n_outputs)
        copied = reuse is None and res is not None
        if res is None:
            res = self.build_graph(n_tokens, n_outputs, self.kv.size)
        if reuse is not None:
            # the build's scheduler pins (graph_get_cb's norms, cause "usr"), made again as llama.cpp's rebuild makes
            # them: the reset above dropped them. So the split sees what the probe's split saw (and takes passes 1-4
            # from the probe's split memo: the same graph, the same tables)
            for t, backend in res.sched_pins:
                gs.backend_sched_set_tensor_backend(self.sched, t, backend)
        if split_only:
            gs.backend_sched_split_graph(self.sched, res.gf)
        elif not (gs.backend_sched_reserve(self.sched, res.gf) if plan is None
                  else gs.backend_sched_reserve_again(self.sched, res.gf, plan)):
            raise DecodeError(f"llama_context::graph_reserve: failed to allocate compute buffers "
                              f"({impl.last_log_error() or 'allocation failed'})")
        entry = dict(n_tokens=n_tokens, n_seqs=n_seqs, n_outputs=n_outputs, n_kv=self.kv.size,
                     split_only=split_only, rebuilt=reuse is None, copied=copied, n_nodes=res.gf.n_nodes, n_leafs=res.gf.n_leafs,
                     n_splits=gs.backend_sched_get_n_splits(self.sched),
                     sizes={gb.backend_name(b): gs.backend_sched_get_buffer_size(self.sched, b)
                            for b in self.backends})
        self.reserve_log.append(entry)
        if trace.active:
            trace.emit("llama.graph_reserve", ctx=id(self), sched=id(self.sched), **entry)
        return res

    def compute_buffer_sizes(self) -> dict:
        """The reserved compute buffer size per buffer type name, as llama.cpp logs it after the reserve
        (``sched_reserve: %10s compute buffer size = %8.2f MiB``, only sizes > 1 byte). Backends that share a buffer
        type share one buffer: the scheduler counts it once, under the first of them."""
        out: dict = {}
        for buft, size in zip(self.backend_buft, self.backend_buf_exp_size):
            if size > 1:
                name = gb.backend_buft_name(buft)
                out[name] = out.get(name, 0) + size
        return out

    def compute_buffer_log(self) -> str:
        """llama.cpp's log lines of the reserve (``sched_reserve: ... compute buffer size = X MiB`` and the graph
        line)."""
        lines = [f"sched_reserve: {gb.backend_buft_name(buft):>10s} compute buffer size = "
                 f"{size / 1024.0 / 1024.0:8.2f} MiB"
                 for buft, size in zip(self.backend_buft, self.backend_buf_exp_size) if size > 1]
        st = self.reserve_stats
        if st:
            diff = st["n_nodes_pp"] != st["n_nodes_tg"] or st["n_splits_pp"] != st["n_splits_tg"]
            if diff:
                lines.append(f"sched_reserve: graph (pp bs={st['n_tokens_pp']}, tg bs={st['n_tokens_tg']}): "
                             f"nodes = {st['n_nodes_pp']} / {st['n_nodes_tg']}, "
                             f"splits = {st['n_splits_pp']} / {st['n_splits_tg']}")
            else:
                lines.append(f"sched_reserve: graph: nodes = {st['n_nodes_pp']}, splits = {st['n_splits_pp']}")
        return "\n".join(lines)

    def check_compute_buffers(self) -> list:
        """~llama_context's check: is every backend's compute buffer still the size the reserve expected? Returns
        ``(backend name, expected, actual)`` for each backend whose buffer changed (empty: none did)."""
        out = []
        for b, exp in zip(self.backends, self.backend_buf_exp_size):
            act = gs.backend_sched_get_buffer_size(self.sched, b)
            if act != exp:
                out.append((gb.backend_name(b), exp, act))
        return out

    # ---- cparams view used by the graph builder
    @property
    def rope_params(self):
        return self

    # ---- memory
    def memory_clear(self, data: bool = True):
        """llama_memory_clear: forget every cell; with ``data`` also zero the K/V buffers."""
        with self._claim("llama_memory_clear"):
            self.kv.clear(data)     # the graphs stay valid: they depend on the cache's tensors, not its contents

    def memory_seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        with self._claim("llama_memory_seq_rm"):
            return self.kv.seq_rm(seq_id, p0, p1)

    def memory_seq_pos_max(self, seq_id: int) -> int:
        self._check_live("llama_memory_seq_pos_max")
        return self.kv.seq_pos_max(seq_id)

    def memory_seq_pos_min(self, seq_id: int) -> int:
        self._check_live("llama_memory_seq_pos_min")
        return self.kv.seq_pos_min(seq_id)

    def _check_live(self, what: str) -> None:
        if self._freed:
            raise ContextFreedError(f"{what}: this llama context was freed (llama_free)")

    # ---- one caller at a time
    def _claim(self, what: str):
        """The context's lock, taken without waiting: a second caller gets ContextBusyError. ggviz:
        llama.cpp leaves two threads in one context undefined."""
        if what != "llama_free":
            self._check_live(what)
        if not self._busy.acquire(blocking=False):
            same = self._busy_thread == threading.get_ident()
            raise ContextBusyError(f"{what}: this llama context is already decoding in "
                                   + ("this thread (called from its own eval callback or graph hook)" if same
                                      else "another thread") + "; use one context per thread")
        self._busy_thread = threading.get_ident()
        return _Release(self)

    # ---- decode
    def decode(self, batch) -> int:
        """llama_decode: 0 on success, 1 if no KV slot was found for the batch, -1 on invalid input, 2 if aborted,
        -2 if the compute buffers could not be allocated (llama.cpp's codes; the reason is logged as llama.cpp logs
        it). Whatever the outcome, a decode that does not return 0 leaves the KV cache and the outputs as they were.

        Raised instead (programming errors; the context is unchanged as well): TypeError for a batch field of the
        wrong type (token ids that are floats ...), DecodeError for a malformed batch (arrays shorter than
        n_tokens, n_tokens < 0, embeddings input), ContextBusyError when the context is already decoding; and
        whatever a callback or a kernel raised (KeyboardInterrupt included, as it is)."""
        with self._claim("llama_decode"):
            return self._decode(batch)

    def _decode(self, batch) -> int:
        hp = self.model.hparams
        if self.sched_need_reserve:
            self.sched_reserve()
        n = operator.index(batch.n_tokens)
        if n == 0:
            impl.GGML_LOG("error", "decode: n_tokens == 0")
            return -1
        ab = batch_allocr_init(batch, hp.n_vocab, self.kv, self.n_seq_max, bool(self.cparams.embeddings))
        if ab is None:
            impl.GGML_LOG("error", "decode: failed to initialize batch")
            return -1
        if n > self.n_batch:
            # llama.cpp: GGML_ASSERT(n_tokens_all <= cparams.n_batch), an abort; ggviz: invalid input
            impl.GGML_LOG("error", f"decode: n_tokens_all = {n} > n_batch = {self.n_batch} (split the batch, or "
                                   f"create the context with a larger n_batch / n_ctx)")
            return -1
        # split_simple into ubatches, then the KV slots of all of them before any is computed (init_batch/prepare)
        bounds = [(u0, min(n, u0 + self.n_ubatch)) for u0 in range(0, n, self.n_ubatch)]
        seq_ids = ab.seq_ids
        slots = self.kv.prepare([(ab.pos[a:b], seq_ids[a:b]) for a, b in bounds])
        if slots is None:
            impl.GGML_LOG("warn", f"decode: failed to find a memory slot for batch of size {n}")
            return 1
        self._warn_missing(ab)
        # the outputs of this batch; they replace the previous ones only when every ubatch succeeded
        logits = np.zeros((ab.n_outputs, hp.n_vocab), dtype=np.float32)
        head0 = self.kv.head
        saved = self.kv.backup(slots)        # a sliding-window cache: what the ubatches will evict or overwrite
        placed: list[int] = []
        done = False
        t0 = time.perf_counter()
        try:
            n_out_done = 0
            for (a, b), idxs in zip(bounds, slots):
                placed.extend(idxs)          # before apply: an interrupt inside it still gets them freed
                self.kv.apply_ubatch(idxs, ab.pos[a:b], seq_ids[a:b])
                out = ab.output[a:b]
                status = self._process_ubatch(ab.token[a:b], ab.pos[a:b], ab.seq0[a:b], out, idxs, logits, n_out_done)
                if status != ggml.GGML_STATUS_SUCCESS:
                    return {ggml.GGML_STATUS_ABORTED: 2, ggml.GGML_STATUS_ALLOC_FAILED: -2}.get(status, -3)
                n_out_done += int(out.sum())
            done = True
        finally:
            if not done:
                self._undo(placed, head0, ab, saved)
        self.logits = logits
        self.output_ids = {int(i): k for k, i in enumerate(np.flatnonzero(ab.output))}
        self.n_outputs = ab.n_outputs
        dt = int((time.perf_counter() - t0) * 1e6)
        if n > 1:
            self.perf.t_p_eval_us += dt
            self.perf.n_p_eval += n
        else:
            self.perf.t_eval_us += dt
            self.perf.n_eval += 1
        return 0

    def _warn_missing(self, ab) -> None:
        """ggviz: a sequence whose first token here attends positions the KV cache no longer holds (a sliding window
        that evicted them, a ``seq_rm`` of the front, then a decode further back) computes without them: the logits
        differ from a replay of the history. llama.cpp's library says nothing (its server checks ``seq_pos_min``
        against the window and re-processes the prompt); ggviz says so: a warning and a ``llama.kv_missing`` trace
        event per sequence and cache."""
        for s in np.unique(ab.seq0):
            s = int(s)
            p0 = int(ab.pos[ab.seq0 == s].min())
            for cache, lo, pmin in self.kv.missing_windows(s, p0):
                impl.GGML_LOG("warn", f"decode: seq_id = {s} at pos = {p0} attends positions [{lo}, {p0}), but "
                                      f"the {'' if cache == 'kv' else cache + ' '}KV cache holds them only from "
                                      f"pos_min = {pmin}: positions {lo}..{pmin - 1} are gone (evicted by the "
                                      f"sliding window, or removed by seq_rm), so the logits differ from a replay "
                                      f"of the history (llama.cpp's server re-processes the prompt here)")
                if trace.active:
                    trace.emit("llama.kv_missing", ctx=id(self), seq_id=s, pos=p0, lo=lo, pos_min=pmin, cache=cache)

    def _undo(self, placed: list, head0: int, ab, saved=None) -> None:
        """A ubatch failed, was aborted or interrupted: free every cell this decode placed (llama.cpp: "the last
        ubatch failed or was aborted -> remove all positions of that ubatch from the memory module"), so the cache
        is as before the call -- a sliding-window cache from ``saved`` (KVCache.backup), with the cells this decode
        evicted and the K/V rows it overwrote (llama.cpp loses those); the graph is rebuilt next time."""
        self._prev_key = None
        self._hybrid_prev = None
        if not placed:
            return
        n_placed = len(placed)
        seq0, pos = ab.seq0[:n_placed], ab.pos[:n_placed]
        for s in np.unique(seq0):
            impl.GGML_LOG("warn", f"decode: removing memory module entries for seq_id = {int(s)}, "
                                  f"pos = [{int(pos[seq0 == s].min())}, +inf)")
        self.kv.rollback(placed, head0, saved)

    def build_graph(self, n_tokens: int, n_outputs: int, n_kv: int):
        b = arch_models.graph_builder(self.model.arch)(self.model, self.kv, self, n_tokens, n_outputs, n_kv,
                              cb_name=functools.partial(self._graph_cb, n_tokens))
        self._build_pins = pins = []
        self._build_norms = norms = []
        try:
            res = b.build()
        finally:
            self._build_pins = self._build_norms = None
        res.sched_pins = pins
        res.norm_nodes = norms
        return res

    def _copy_graph(self, src, n_tokens: int, n_outputs: int):
        """ggviz: the reserve graph of ``n_tokens`` / ``n_outputs`` over the full cache as a copy of another reserve's
        built graph ``src`` in a new context (graph_copy.copy_graph: the arena, hash set and addresses a build there
        would make), turned into this shape (graph.derive_graph), with the scheduler pins the build's callback would
        make (``_norm_pins``). None (the caller builds): a trace listener is recording (the views record the
        build), LLAMA_GRAPH_REUSE_DISABLE, an architecture that does not record every shape it takes from the
        ubatch, or a graph the copy or the derivation refuses."""
        if trace.active or not self.graph_reuse or not src.tok_dims:
            return None
        res = graph_copy.copy_graph(src)
        if res is None:
            return None
        kv = self.kv
        n_kv = (kv.kv_base.size, min(kv.size, kv.kv_swa.size)) if hasattr(kv, "kv_swa") else kv.size
        if not derive_graph(res, n_tokens, n_outputs, n_kv):
            ggml.free(res.ctx)
            return None
        res.sched_pins = self._norm_pins(res.norm_nodes, n_tokens)
        for t, backend in res.sched_pins:
            gs.backend_sched_set_tensor_backend(self.sched, t, backend)
        self.n_graph_copied += 1
        return res

    def _derive_graph(self, n_tokens: int, n_outputs: int, n_kv):
        """ggviz: the graph of this ubatch shape from a reserve's graph (graph.derive_graph: the same nodes, shapes
        and names as a build): the tg graph (``_graph_template``) for its own n_tokens / n_outputs (only n_kv is
        rewritten), the pp graph (``_graph_template_pp``) for any other; the scheduler pins the build's callback
        would make for this n_tokens are made (``_norm_pins``). The template is spent (it is the scheduler's graph
        now). None: no template or derive_graph refused (the caller builds), or a trace listener is recording: a recorded step shows the
        build llama.cpp makes there (the graph.visit / graph.add events the explorer's build phase, the report's
        visit counts and VisitAnimation read)."""
        if trace.active:
            return None
        res = self._graph_template
        tg = res is not None and res.n_tokens == n_tokens and res.n_outputs == n_outputs
        if not tg:
            res = self._graph_template_pp
            if res is None:
                return None
        if not derive_graph(res, n_tokens, n_outputs, n_kv):
            return None                  # (refused: the template is as it was, and stays)
        if tg:
            self._graph_template = None
        else:
            self._graph_template_pp = None
        res.sched_pins = self._norm_pins(res.norm_nodes, n_tokens)
        for t, backend in res.sched_pins:
            gs.backend_sched_set_tensor_backend(self.sched, t, backend)
        self.n_graph_derived += 1
        return res

    def _norm_pins(self, norms, n_tokens: int) -> list:
        """The (tensor, backend) pins graph_get_cb makes for ``norms`` ((tensor, il) of the tensors named "norm")
        in a graph of ``n_tokens`` tokens (see _graph_cb), in the callback's order."""
        full_offload = self.model.params.n_gpu_layers > self.model.hparams.n_layer
        if not ((n_tokens < 32 or full_offload) and self.model.dev_layer):
            return []
        pins = []
        for cur, il in norms:
            dev_layer = self.model.dev_layer[il]
            for backend in self.backends:
                if gb.backend_get_device(backend) is dev_layer and gb.backend_supports_op(backend, cur):
                    pins.append((cur, backend))
        return pins

    def _graph_cb(self, n_tokens: int, cur, name: str, il: int) -> None:
        """llama_context::graph_get_cb (after naming): "norm may be automatically assigned to the backend of the
        previous layer, increasing data transfer between backends" -- so for small batches (or a full offload) each
        layer's norm is pinned to its layer's device (``ggml_backend_sched_set_tensor_backend``: cause "usr").
        (``n_tokens`` first: the build's partial binds it positionally, a call without a keyword dict to merge --
        it runs for each of a build's ~700 named tensors.)"""
        if name != "norm" or il == -1:       # (the cheap tests first: this runs for every named tensor)
            return
        if self._build_norms is not None:
            self._build_norms.append((cur, il))
        full_offload = self.model.params.n_gpu_layers > self.model.hparams.n_layer
        if (n_tokens < 32 or full_offload) and self.model.dev_layer:
            dev_layer = self.model.dev_layer[il]
            for backend in self.backends:
                if gb.backend_get_device(backend) is dev_layer and gb.backend_supports_op(backend, cur):
                    gs.backend_sched_set_tensor_backend(self.sched, cur, backend)
                    if self._build_pins is not None:
                        self._build_pins.append((cur, backend))

    def _process_ubatch(self, tokens, pos, seq_ids, out_mask, idxs, logits, out_offset) -> int:
        """llama_context::process_ubatch for a ubatch already placed in the KV cache (cells ``idxs``): build (or
        reuse) the graph, set the inputs, compute, copy the output rows into ``logits[out_offset:]``. Returns the
        ggml_status."""
        if self.cparams.hybrid:
            return self._process_ubatch_hybrid(tokens, pos, seq_ids, out_mask, idxs, logits, out_offset)
        n_tokens = len(tokens)
        n_outputs = int(out_mask.sum())
        n_kv = self.kv.get_n_kv()
        key = self.graph_key(n_tokens, n_outputs, n_kv)
        if self.graph_reuse and self._prev_key == key and self.last_graph is not None and self._installed():
            res = self.last_graph             # same shapes: only the inputs change
            self.n_reused += 1
            if trace.active:
                trace.emit("llama.graph_reuse", n_tokens=n_tokens, n_outputs=n_outputs, n_kv=n_kv, cached=False)
        elif self.graph_reuse and (res := self._graph_cache_restore(key)) is not None:
            self.n_reused += 1
            self.n_graph_restored += 1
            if trace.active:
                trace.emit("llama.graph_reuse", n_tokens=n_tokens, n_outputs=n_outputs, n_kv=n_kv, cached=True)
        else:
            if self.graph_reuse:
                self._graph_cache_stash()
            gs.backend_sched_reset(self.sched)
            self._prev_key = None
            res = self._derive_graph(n_tokens, n_outputs, n_kv) if self.graph_reuse else None
            if res is None:
                res = self.build_graph(n_tokens, n_outputs, n_kv)
            self.n_graph_builds += 1
            if not self._allocate(res):
                return ggml.GGML_STATUS_ALLOC_FAILED
            self._prev_key = key
            self._installed_uid = self._sched_uid()
        self._set_inputs(res, tokens, pos, seq_ids, out_mask, idxs, n_kv)
        self.last_graph = res
        if self.graph_hook is not None:
            self.graph_hook(res)
        n_threads = self.cparams.n_threads if n_tokens == 1 else self.cparams.n_threads_batch
        status = self._compute(res.gf, n_threads)
        if status != ggml.GGML_STATUS_SUCCESS:
            impl.GGML_LOG("error", f"graph_compute: ggml_backend_sched_graph_compute_async failed with error {status}")
            impl.GGML_LOG("error", f"process_ubatch: failed to compute graph, compute status: {status}")
            return status
        if n_outputs:
            # ggml_backend_tensor_get_async(backend_res, t_logits, ...): the logits may be in device memory
            out = logits[out_offset:out_offset + n_outputs]
            gb.backend_tensor_get(res.t_logits, out, 0, ggml.nbytes(res.t_logits))
        return ggml.GGML_STATUS_SUCCESS

    def _process_ubatch_hybrid(self, tokens, pos, seq_ids, out_mask, idxs, logits, out_offset) -> int:
        """process_ubatch with PowerInfer's hybrid executor (``cparams.hybrid``): the graph is built as for the
        scheduler, allocated in host memory by a graph allocator of its own (``_hybrid_alloc``) and computed by
        ``ggml.cpu.hybrid.graph_compute_hybrid``: thread 0 runs the nodes whose weight is in the accelerator's
        memory (the ``*_gpu`` halves of the FFN split) on the device, threads 1..N-1 the others. The timeline is
        kept in ``hybrid_records`` (and emitted as ``hybrid.node`` trace events). A PWRI model only, n_threads >= 2,
        no eval callback (``_check_hybrid``). The same graph through the scheduler (``hybrid`` off) is the contrast:
        its ACCEL split runs the ``*_gpu`` halves, with the same bits when its CPU backend has N-1 threads."""
        n_tokens = len(tokens)
        n_outputs = int(out_mask.sum())
        n_kv = self.kv.get_n_kv()
        self._prev_key = None            # the scheduler's graph is not this one
        key = self.graph_key(n_tokens, n_outputs, n_kv)
        if self.graph_reuse and self._hybrid_prev is not None and self._hybrid_prev[0] == key:
            res = self._hybrid_prev[1]   # same shapes: the graph and its memory stay, only the inputs change
            self.n_reused += 1
        else:
            self._hybrid_prev = None
            gs.backend_sched_reset(self.sched)      # (the build's callback pins norms in the scheduler: start clean)
            res = self.build_graph(n_tokens, n_outputs, n_kv)
            self.n_graph_builds += 1
            if not self._hybrid_alloc(res.gf):
                why = impl.last_log_error() or "allocation failed"
                impl.GGML_LOG("error", f"process_ubatch: failed to allocate graph for the hybrid executor ({why})")
                return ggml.GGML_STATUS_ALLOC_FAILED
            self._hybrid_prev = (key, res)
        self._set_inputs(res, tokens, pos, seq_ids, out_mask, idxs, n_kv)
        self.last_graph = res
        if self.graph_hook is not None:
            self.graph_hook(res)
        n_threads = self.cparams.n_threads if n_tokens == 1 else self.cparams.n_threads_batch
        sm = self.model.sparse
        try:
            self.hybrid_records = hybrid.graph_compute_hybrid(res.gf, n_threads, hybrid.weight_on_device, sm.gpu_dev,
                                                              self.cparams.abort_callback,
                                                              self.cparams.abort_callback_data)
        except hybrid.HybridAborted:
            impl.GGML_LOG("error", f"graph_compute: hybrid executor aborted, status {ggml.GGML_STATUS_ABORTED}")
            return ggml.GGML_STATUS_ABORTED
        if n_outputs:
            out = logits[out_offset:out_offset + n_outputs]
            gb.backend_tensor_get(res.t_logits, out, 0, ggml.nbytes(res.t_logits))
        return ggml.GGML_STATUS_SUCCESS

    def _hybrid_alloc(self, gf) -> bool:
        """ggml_gallocr for a graph the hybrid executor runs. The device lane runs out of the graph's order, so
        the allocator's reuse of memory (a tensor's memory goes to a later node once its last consumer in graph
        order is computed, or a node is computed in place over its source) could hand a CPU node the memory of an
        operand thread 0 has not read yet, or hand thread 0 memory a CPU node still reads. So: the operands of the
        device lane's nodes are flagged OUTPUT (never freed, never overwritten in place) and its results go to a
        second buffer of their own (also OUTPUT: never reused)."""
        cpu_buft = gb.backend_get_default_buffer_type(self.backend_cpu)
        if self._hybrid_galloc is None:
            self._hybrid_galloc = galloc.gallocr_new_n([cpu_buft, cpu_buft])
        node_ids = []
        for node in gf.nodes:
            on = hybrid.weight_on_device(node)
            node_ids.append(1 if on else 0)
            if on:
                node.flags |= ggml.GGML_TENSOR_FLAG_OUTPUT
                for s in node.src:
                    if s is not None:
                        s.flags |= ggml.GGML_TENSOR_FLAG_OUTPUT
                        if s.view_src is not None:
                            s.view_src.flags |= ggml.GGML_TENSOR_FLAG_OUTPUT
        leaf_ids = [0] * gf.n_leafs
        if not galloc.gallocr_reserve_n(self._hybrid_galloc, gf, node_ids, leaf_ids):
            return False
        return galloc.gallocr_alloc_graph(self._hybrid_galloc, gf)

    @staticmethod
    def graph_key(n_tokens: int, n_outputs: int, n_kv: int) -> tuple:
        """What the decode graph depends on (llm_graph_result::can_reuse's checks for this model: the ubatch's
        n_tokens -- one sequence per ubatch, split_simple --, n_outputs (the out_ids input), the attended KV cells
        n_kv). Everything else it is built from is fixed for the context's life (cparams, the model, the KV cache's
        size and types) or set per compute (thread count, eval and abort callbacks), and the inputs are set before
        every compute."""
        return (n_tokens, n_outputs, n_kv)

    def _allocate(self, res) -> bool:
        """ggml_backend_sched_alloc_graph: split the graph over the backends and allocate its compute buffers."""
        if not gs.backend_sched_alloc_graph(self.sched, res.gf):
            sizes = {gb.backend_name(b): gs.backend_sched_get_buffer_size(self.sched, b) for b in self.backends}
            why = impl.last_log_error() or "allocation failed"
            impl.GGML_LOG("error", f"process_ubatch: failed to allocate graph ({why}; allocated now: {sizes})")
            return False
        return True

    def _set_inputs(self, res, tokens, pos, seq_ids, out_mask, idxs, n_kv):
        inp = res.inputs
        ggml.get_data(inp.tokens)[...] = tokens.reshape(1, 1, 1, -1)
        ggml.get_data(inp.pos)[...] = pos.astype(np.int32).reshape(1, 1, 1, -1)
        self.kv.set_input(inp, idxs, n_kv, pos, seq_ids)
        if inp.out_ids is not None:
            ggml.get_data(inp.out_ids)[...] = np.nonzero(out_mask)[0].astype(np.int32).reshape(1, 1, 1, -1)

    def _compute(self, gf, n_threads: int) -> int:
        """llama_context::graph_compute: set the thread counts, then ggml_backend_sched_graph_compute_async (the eval
        callback goes through the scheduler: per split, per node range)."""
        for backend, fn in self.set_n_threads_fns:
            fn(backend, n_threads)
        cpu_backend.backend_cpu_set_abort_callback(self.backend_cpu, self.cparams.abort_callback,
                                                   self.cparams.abort_callback_data)
        self._cb_stopped = False
        gs.backend_sched_set_eval_callback(self.sched, self._eval_cb if self.cparams.cb_eval is not None else None,
                                           self.cparams.cb_eval_user_data)
        status = gs.backend_sched_graph_compute_async(self.sched, gf)
        gs.backend_sched_synchronize(self.sched)
        if status == ggml.GGML_STATUS_SUCCESS and self._cb_stopped:
            return ggml.GGML_STATUS_ABORTED
        return status

    def _eval_cb(self, t, ask: bool, user_data=None) -> bool:
        """The scheduler's eval callback -> ``cparams.cb_eval(t, ask)``. Once it has returned False the decode is
        over for the caller: ggml still runs the remaining splits, but the callback is not asked again."""
        if self._cb_stopped:
            return False
        r = bool(self.cparams.cb_eval(t, ask))
        if not ask and not r:
            self._cb_stopped = True
        return r

    # ---- outputs
    def get_logits_ith(self, i: int) -> np.ndarray:
        """llama_get_logits_ith: logits of batch token i (negative: counted from the last output)."""
        i = operator.index(i)
        if i < 0:
            j = self.n_outputs + i
            if j < 0:
                raise IndexError(f"llama_get_logits_ith: negative index {i} out of range ({self.n_outputs} outputs)")
        else:
            if i not in self.output_ids:
                raise IndexError(f"llama_get_logits_ith: batch token {i} has no output (set batch.logits[{i}])")
            j = self.output_ids[i]
        return self.logits[j]

    def get_logits(self) -> np.ndarray:
        return self.logits


class _Release:
    """The end of LlamaContext._claim (a context manager)."""
    __slots__ = ("ctx",)

    def __init__(self, ctx):
        self.ctx = ctx

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.ctx._busy_thread = None
        self.ctx._busy.release()
        return False


def check_n_threads(name: str, n) -> int:
    """A thread count for the CPU backend: an integer in [1, GGML_MAX_N_THREADS] (512).

    ggviz: llama.cpp passes a count <= 0 on, and ggml_graph_plan silently uses 4 threads; ggml's threadpool refuses
    more than 512, which ggviz would only find out in the first decode. More threads than CPU cores are accepted,
    as in llama.cpp, with a warning (above the default 4): ggviz's threads share the interpreter lock, so extra
    threads only add barrier waits."""
    try:
        v = operator.index(n)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(n).__name__}") from None
    cores = os.cpu_count() or 1
    if not 1 <= v <= ggml.GGML_MAX_N_THREADS:
        raise ContextParamsError(f"{name} = {v}: the CPU backend takes 1 to {ggml.GGML_MAX_N_THREADS} threads "
                                 f"(this machine has {cores} CPU cores)", name, v, min(cores, ggml.GGML_MAX_N_THREADS))
    if v > max(cores, ggml.GGML_DEFAULT_N_THREADS):     # (the default, 4, is not worth a warning on 2 cores)
        impl.GGML_LOG("warn", f"llama_context: {name} = {v} > {cores} CPU cores: ggviz's threads share the Python "
                              f"interpreter lock, extra threads only add barrier waits")
    return v


def _check_hybrid(model, p, n_threads: int, n_threads_batch: int) -> None:
    """``hybrid`` needs what PowerInfer's hybrid build needs: a sparse (PWRI) model, and 2 threads or more
    (thread 0 only drives the accelerator: with one thread no CPU node would ever run)."""
    if getattr(model, "sparse", None) is None:
        raise ContextParamsError("llama_context: hybrid = True runs PowerInfer's hybrid executor, which needs a "
                                 "PowerInfer (PWRI) model; this one is dense", "hybrid", True, False)
    for name, v in (("n_threads", n_threads), ("n_threads_batch", n_threads_batch)):
        if v < 2:
            raise ContextParamsError(f"llama_context: hybrid = True needs {name} >= 2 (thread 0 drives the "
                                     f"accelerator, threads 1..N-1 compute the CPU nodes), got {v}", name, v, None)
    if p.cb_eval is not None:
        raise ContextParamsError("llama_context: hybrid = True: the hybrid executor has no eval callback (its "
                                 "timeline is in ctx.hybrid_records and the hybrid.node trace events)", "cb_eval",
                                 p.cb_eval, None)


def init_from_model(model, params: LlamaContextParams | None = None) -> LlamaContext:
    with memory.gc_paused():     # ggviz: the graphs' ~30,000 long-lived objects, not traversed while made
        return LlamaContext(model, params or context_default_params())
