"""llama_context: decode a batch through the model: ubatches, KV slots, graph, inputs, compute, logits.

Mirrors llama.cpp's ``llama_context`` (llama-context.cpp): ``llama_context_default_params``, ``llama_init_from_model``
(cparams derived from the model: rope base/scale, YaRN defaults, n_ctx padded to 256), ``decode`` (validate the
batch, split it into ubatches of ``n_ubatch`` tokens, for each: ``find_slot``/``apply_ubatch``, build the graph,
``set_inputs``, compute, copy the output rows of the logits), ``get_logits_ith``, and the scheduler's eval callback
(``cb_eval(tensor, ask) -> bool``: asked once per node; the nodes up to one it wants are computed, then it is called
with the data; returning False stops the decode).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from .. import ggml, trace
from ..ggml import memory
from ..ggml.cpu import ggml_cpu
from .graph import LlamaGraphBuilder, graph_max_nodes
from .kv_cache import KVCache

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


class DecodeError(RuntimeError):
    pass


class LlamaContext:
    def __init__(self, model, params: LlamaContextParams):
        self.model = model
        hp = model.hparams
        p = params
        if p.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_ENABLED:
            raise ValueError("flash attention is not implemented in ggviz's CPU path; use flash_attn_type = 0")
        n_ctx = p.n_ctx if p.n_ctx > 0 else hp.n_ctx_train
        # the KV cache size is padded to 256 cells (llama_kv_cache::get_padding)
        n_ctx = ggml.GGML_PAD(n_ctx, 256)
        self.cparams = p
        self.n_ctx = n_ctx
        self.n_batch = min(n_ctx, p.n_batch)
        self.n_ubatch = min(self.n_batch, p.n_ubatch)
        # cparams derived from the model (llama_init_from_model)
        self.rope_freq_base = p.rope_freq_base if p.rope_freq_base != 0.0 else hp.rope_freq_base_train
        self.rope_freq_scale = p.rope_freq_scale if p.rope_freq_scale != 0.0 else hp.rope_freq_scale_train
        self.yarn_ext_factor = 0.0 if p.yarn_ext_factor < 0.0 else p.yarn_ext_factor
        self.yarn_attn_factor = 1.0 if p.yarn_attn_factor < 0.0 else p.yarn_attn_factor
        self.yarn_beta_fast = 32.0 if p.yarn_beta_fast < 0.0 else p.yarn_beta_fast
        self.yarn_beta_slow = 1.0 if p.yarn_beta_slow < 0.0 else p.yarn_beta_slow
        self.kv = KVCache(hp, n_ctx, p.type_k, p.type_v, v_trans=True)
        self.logits = np.zeros((0, hp.n_vocab), dtype=np.float32)
        self.output_ids: dict[int, int] = {}
        self.n_outputs = 0
        self.perf = _Perf(t_start_us=int(time.perf_counter() * 1e6), t_load_us=model.t_load_us)
        self.last_graph = None            # the GraphResult of the last ubatch (for the visual layer)
        self.graph_hook = None            # optional callable(GraphResult) before compute (step-through views)
        self._compute_buf = None
        self._galloc = None
        # llama.cpp reuses the previous graph when the new ubatch has the same topology (llm_graph_result::can_reuse);
        # LLAMA_GRAPH_REUSE_DISABLE turns that off, as there
        self.graph_reuse = os.environ.get("LLAMA_GRAPH_REUSE_DISABLE") is None
        self._prev_key = None
        self.n_reused = 0

    # ---- cparams view used by the graph builder
    @property
    def rope_params(self):
        return self

    # ---- memory
    def memory_clear(self, data: bool = True):
        self.kv.clear()
        self._prev_key = None

    def memory_seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        return self.kv.seq_rm(seq_id, p0, p1)

    def memory_seq_pos_max(self, seq_id: int) -> int:
        return self.kv.cells.seq_pos_max(seq_id)

    # ---- decode
    def decode(self, batch) -> int:
        """llama_decode: 0 on success, 1 if no KV slot was found, -1 on invalid input, 2 if aborted."""
        hp = self.model.hparams
        n = batch.n_tokens
        if n <= 0:
            raise DecodeError("llama_decode: n_tokens == 0")
        if batch.token is None:
            raise DecodeError("llama_decode: embeddings input is not supported by ggviz; pass tokens")
        tokens = np.asarray(batch.token[:n], dtype=np.int32)
        bad = np.nonzero((tokens < 0) | (tokens >= hp.n_vocab))[0]
        if len(bad):
            raise DecodeError(f"llama_decode: invalid token[{int(bad[0])}] = {int(tokens[bad[0]])} "
                              f"(the vocabulary has {hp.n_vocab} tokens)")
        seq_ids = np.array([batch.seq_id[i][0] if batch.seq_id is not None else 0 for i in range(n)], dtype=np.int64)
        if batch.pos is not None:
            pos = np.asarray(batch.pos[:n], dtype=np.int64)
        else:
            # positions continue each sequence (llama_batch_allocr)
            pos = np.zeros(n, dtype=np.int64)
            nxt = {}
            for i in range(n):
                s = int(seq_ids[i])
                if s not in nxt:
                    nxt[s] = self.kv.cells.seq_pos_max(s) + 1
                pos[i] = nxt[s]
                nxt[s] += 1
        if batch.logits is not None:
            out_mask = np.asarray(batch.logits[:n], dtype=bool)
        else:
            out_mask = np.zeros(n, dtype=bool)
            out_mask[-1] = True                 # by default only the last token is output
        if self.cparams.embeddings:
            out_mask[:] = True
        n_outputs_all = int(out_mask.sum())
        self.logits = np.zeros((n_outputs_all, hp.n_vocab), dtype=np.float32)
        self.output_ids = {}
        n_out_done = 0
        t0 = time.perf_counter()
        for u0 in range(0, n, self.n_ubatch):
            u1 = min(n, u0 + self.n_ubatch)
            ok = self._decode_ubatch(tokens[u0:u1], pos[u0:u1], seq_ids[u0:u1], out_mask[u0:u1], n_out_done)
            if ok != 0:
                return ok
            for i in range(u0, u1):
                if out_mask[i]:
                    self.output_ids[i] = n_out_done
                    n_out_done += 1
        self.n_outputs = n_outputs_all
        dt = int((time.perf_counter() - t0) * 1e6)
        if n > 1:
            self.perf.t_p_eval_us += dt
            self.perf.n_p_eval += n
        else:
            self.perf.t_eval_us += dt
            self.perf.n_eval += 1
        return 0

    def build_graph(self, n_tokens: int, n_outputs: int, n_kv: int):
        b = LlamaGraphBuilder(self.model, self.kv, self, n_tokens, n_outputs, n_kv)
        return b.build()

    def _decode_ubatch(self, tokens, pos, seq_ids, out_mask, out_offset) -> int:
        n_tokens = len(tokens)
        n_outputs = int(out_mask.sum())
        try:
            idxs = self.kv.find_slot(n_tokens)
        except RuntimeError:
            return 1
        self.kv.apply_ubatch(idxs, pos, seq_ids)
        n_kv = self.kv.get_n_kv()
        key = (n_tokens, n_outputs, n_kv)
        if self.graph_reuse and self._prev_key == key and self.last_graph is not None:
            res = self.last_graph             # same shapes: only the inputs change
            self.n_reused += 1
            if trace.active:
                trace.emit("llama.graph_reuse", n_tokens=n_tokens, n_kv=n_kv)
        else:
            res = self.build_graph(n_tokens, n_outputs, n_kv)
            self._allocate(res)
            self._prev_key = key
        self._set_inputs(res, tokens, pos, seq_ids, out_mask, idxs, n_kv)
        self.last_graph = res
        if self.graph_hook is not None:
            self.graph_hook(res)
        n_threads = self.cparams.n_threads if n_tokens == 1 else self.cparams.n_threads_batch
        status = self._compute(res.gf, n_threads)
        if status != ggml.GGML_STATUS_SUCCESS:
            return 2
        if n_outputs:
            out = ggml.get_data(res.t_logits)          # (1, 1, n_outputs, n_vocab)
            self.logits[out_offset:out_offset + n_outputs] = out.reshape(n_outputs, -1)
        return 0

    def _allocate(self, res):
        """Give every graph tensor memory. With ggml-alloc available: the graph allocator with in-place reuse."""
        gf = res.gf
        try:
            from ..ggml import alloc as galloc_mod
            from ..ggml import backend as backend_mod
        except ImportError:
            galloc_mod = None
        if galloc_mod is not None:
            if self._galloc is None:
                self._galloc = galloc_mod.gallocr_new(backend_mod.backend_cpu_buffer_type())
            if not galloc_mod.gallocr_alloc_graph(self._galloc, gf):
                raise DecodeError("ggml_gallocr_alloc_graph failed")
            return
        # fallback: one fresh buffer, every tensor without data gets its own aligned slice (no reuse)
        need = []
        for t in list(gf.leafs) + list(gf.nodes):
            if t.data == 0 and t.view_src is None:
                need.append(t)
        total = sum(ggml.GGML_PAD(ggml.nbytes(t), 64) for t in need) + 64
        buf = memory.aligned_malloc(total, "compute")
        self._compute_buf = buf
        off = 0
        base = buf.ctypes.data
        for t in need:
            t.data = base + off
            off += ggml.GGML_PAD(ggml.nbytes(t), 64)
        for t in list(gf.leafs) + list(gf.nodes):
            if t.data == 0 and t.view_src is not None:
                t.data = t.view_src.data + t.view_offs

    def _set_inputs(self, res, tokens, pos, seq_ids, out_mask, idxs, n_kv):
        inp = res.inputs
        ggml.get_data(inp.tokens)[...] = tokens.reshape(1, 1, 1, -1)
        ggml.get_data(inp.pos)[...] = pos.astype(np.int32).reshape(1, 1, 1, -1)
        ggml.get_data(inp.k_idxs)[...] = self.kv.k_idxs_data(idxs).reshape(1, 1, 1, -1)
        ggml.get_data(inp.v_idxs)[...] = self.kv.v_idxs_data(idxs).reshape(1, 1, 1, -1)
        ggml.get_data(inp.kq_mask)[...] = self.kv.kq_mask_data(n_kv, pos, seq_ids).reshape(1, 1, len(tokens), n_kv)
        if inp.out_ids is not None:
            ggml.get_data(inp.out_ids)[...] = np.nonzero(out_mask)[0].astype(np.int32).reshape(1, 1, 1, -1)

    def _compute(self, gf, n_threads: int) -> int:
        cb = self.cparams.cb_eval
        if cb is None:
            return self._compute_range(gf, n_threads)
        # ggml_backend_sched_compute_splits with callback_eval: compute up to each node the callback asks for
        j = 0
        n = gf.n_nodes
        while j < n:
            j1 = j
            need = cb(gf.nodes[j1], True)
            while not need and j1 < n - 1:
                j1 += 1
                need = cb(gf.nodes[j1], True)
            st = self._compute_range(ggml.graph_view(gf, j, j1 + 1), n_threads)
            if st != ggml.GGML_STATUS_SUCCESS:
                return st
            if need and not cb(gf.nodes[j1], False):
                return ggml.GGML_STATUS_ABORTED
            j = j1 + 1
        return ggml.GGML_STATUS_SUCCESS

    def _compute_range(self, gf, n_threads: int) -> int:
        plan = ggml_cpu.graph_plan(gf, n_threads)
        plan.abort_callback = self.cparams.abort_callback
        plan.abort_callback_data = self.cparams.abort_callback_data
        if plan.work_size:
            plan.work_data = np.zeros(plan.work_size, dtype=np.uint8)
        return ggml_cpu.graph_compute(gf, plan)

    # ---- outputs
    def get_logits_ith(self, i: int) -> np.ndarray:
        """llama_get_logits_ith: logits of batch token i (negative: counted from the last output)."""
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


def init_from_model(model, params: LlamaContextParams | None = None) -> LlamaContext:
    return LlamaContext(model, params or context_default_params())
