"""llama_kv_cache: per-layer K and V tensors, the cells that say what each slot holds, and the graph inputs.

Mirrors llama.cpp's ``llama_kv_cache`` (unified, one stream) and ``llama_kv_cells``:

- K is ``cache_k_l{il}`` [n_embd_k_gqa, kv_size] and V is ``cache_v_l{il}`` [n_embd_v_gqa, kv_size], F16 by
  default. Without flash attention V is stored *transposed* (``v_trans``): channel-major, so that
  ``kqv = V^T · softmax(KQ)`` reads contiguous rows.
- ``find_slot`` picks free cells for a ubatch starting at ``head``; ``apply_ubatch`` marks them used.
- ``get_n_kv`` is the attended window: the used cells rounded up to ``n_pad`` (256), capped at kv_size.
- ``cpy_k``/``cpy_v`` write a ubatch's K/V into the cache with SET_ROWS through index tensors (``k_idxs``: a cell
  per token; ``v_idxs``: for the transposed V, an element index ``channel*kv_size + cell`` per value).
- ``get_k``/``get_v`` are the views the attention reads, and ``set_input_kq_mask`` builds the causal mask.
"""
from __future__ import annotations

import numpy as np

from .. import ggml
from ..ggml import alloc as galloc
from ..ggml import backend as gb
from ..ggml import impl

N_PAD = 256   # llama_kv_cache's padding of n_kv when flash attention is off


class KVCells:
    """llama_kv_cells: pos[-1 = empty] and sequence membership per cell."""

    def __init__(self, size: int):
        self.pos = np.full(size, -1, dtype=np.int64)
        self.seq = [set() for _ in range(size)]
        self.used = 0

    def size(self):
        return len(self.pos)

    def is_empty(self, i):
        return self.pos[i] == -1

    def used_max_p1(self) -> int:
        nz = np.nonzero(self.pos >= 0)[0]
        return int(nz[-1]) + 1 if len(nz) else 0

    def rm(self, i):
        if self.pos[i] >= 0:
            self.used -= 1
        self.pos[i] = -1
        self.seq[i].clear()

    def seq_pos_max(self, seq_id: int) -> int:
        ps = [int(self.pos[i]) for i in range(len(self.pos)) if seq_id in self.seq[i]]
        return max(ps) if ps else -1


class KVCache:
    def __init__(self, hparams, kv_size: int, type_k=ggml.GGML_TYPE_F16, type_v=ggml.GGML_TYPE_F16,
                 v_trans: bool = True, n_pad: int = N_PAD, bufts=None):
        self.hparams = hparams
        self.size = kv_size
        self.type_k, self.type_v = type_k, type_v
        self.v_trans = v_trans
        self.n_pad = n_pad
        self.cells = KVCells(kv_size)
        self.head = 0
        n_layer = hparams.n_layer
        # llama.cpp's ctx_map: one no_alloc context per buffer type (bufts[il]: the layer's device buffer type when
        # the KV cache is offloaded, else the CPU's), each allocated in one backend buffer and cleared
        if bufts is None:
            bufts = [gb.backend_cpu_buffer_type()] * n_layer
        ctx_map: dict = {}
        self.k_l, self.v_l = [], []
        for il in range(n_layer):
            buft = bufts[il]
            if id(buft) not in ctx_map:
                ctx_map[id(buft)] = (buft, ggml.init(2 * n_layer * ggml.tensor_overhead(), no_alloc=True))
            ctx = ctx_map[id(buft)][1]
            k = ggml.new_tensor_3d(ctx, type_k, hparams.n_embd_k_gqa, kv_size, 1)
            v = ggml.new_tensor_3d(ctx, type_v, hparams.n_embd_v_gqa, kv_size, 1)
            ggml.format_name(k, "cache_k_l%d", il)
            ggml.format_name(v, "cache_v_l%d", il)
            self.k_l.append(k)
            self.v_l.append(v)
        self.ctxs, self.bufs = [], []
        for buft, ctx in ctx_map.values():
            buf = galloc.backend_alloc_ctx_tensors_from_buft(ctx, buft)
            if buf is None:
                raise RuntimeError(f"llama_kv_cache: failed to allocate buffer for kv cache "
                                   f"({gb.backend_buft_name(buft)}: {impl.last_log_error() or 'allocation failed'})")
            # clear the buffer to avoid NaNs in the padding
            gb.backend_buffer_clear(buf, 0)
            self.ctxs.append(ctx)
            self.bufs.append(buf)
        self.ctx = self.ctxs[0]

    # ---- bookkeeping
    def clear(self):
        """llama_memory_clear: forget every cell (the bytes stay, as in llama.cpp)."""
        for i in range(self.size):
            self.cells.rm(i)
        self.head = 0

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        p1 = np.iinfo(np.int64).max if p1 < 0 else p1
        p0 = 0 if p0 < 0 else p0
        new_head = self.size
        for i in range(self.size):
            if self.cells.pos[i] >= 0 and (seq_id < 0 or seq_id in self.cells.seq[i]) and p0 <= self.cells.pos[i] < p1:
                if seq_id < 0:
                    self.cells.rm(i)
                else:
                    self.cells.seq[i].discard(seq_id)
                    if not self.cells.seq[i]:
                        self.cells.rm(i)
                if self.cells.is_empty(i) and new_head == self.size:
                    new_head = i
        # as llama.cpp: if we freed up a slot, set head to it so searching can start there
        if new_head != self.size and new_head < self.head:
            self.head = new_head
        return True

    def find_slot(self, n_tokens: int) -> list[int]:
        """llama_kv_cache::find_slot (non-continuous): the first n_tokens empty cells from ``head``."""
        if n_tokens > self.size:
            raise ValueError(f"n_tokens = {n_tokens} > kv cache size = {self.size}")
        head_cur = self.head
        # plenty of unused cells before head: start again from the beginning to keep the cache compact
        if head_cur > self.cells.used + 2 * n_tokens:
            head_cur = 0
        idxs: list[int] = []
        n_tested = 0
        while len(idxs) < n_tokens:
            if head_cur > self.size - 1:
                head_cur = 0
                continue
            if self.cells.is_empty(head_cur):
                idxs.append(head_cur)
            head_cur += 1
            n_tested += 1
            if n_tested >= self.size and len(idxs) < n_tokens:
                raise RuntimeError(f"KV cache is full: {self.cells.used} of {self.size} cells used, "
                                   f"cannot place {n_tokens} tokens (decode returns 1 in llama.cpp)")
        return idxs

    def apply_ubatch(self, idxs, pos, seq_ids):
        for i, c in enumerate(idxs):
            if self.cells.pos[c] < 0:
                self.cells.used += 1
            self.cells.pos[c] = int(pos[i])
            self.cells.seq[c] = {int(seq_ids[i])}
        self.head = idxs[-1] + 1 if idxs else self.head

    def get_n_kv(self) -> int:
        return int(min(self.size, max(self.n_pad, ggml.GGML_PAD(self.cells.used_max_p1(), self.n_pad))))

    # ---- graph pieces (llama_kv_cache_context in llama.cpp)
    def get_k(self, ctx, il: int, n_kv: int):
        hp = self.hparams
        k = self.k_l[il]
        return ggml.view_4d(ctx, k, hp.n_embd_head_k, hp.n_head_kv, n_kv, 1,
                            ggml.row_size(k.type, hp.n_embd_head_k),
                            ggml.row_size(k.type, hp.n_embd_k_gqa),
                            ggml.row_size(k.type, hp.n_embd_k_gqa * self.size), 0)

    def get_v(self, ctx, il: int, n_kv: int):
        hp = self.hparams
        v = self.v_l[il]
        if not self.v_trans:
            return ggml.view_4d(ctx, v, hp.n_embd_head_v, hp.n_head_kv, n_kv, 1,
                                ggml.row_size(v.type, hp.n_embd_head_v),
                                ggml.row_size(v.type, hp.n_embd_v_gqa),
                                ggml.row_size(v.type, hp.n_embd_v_gqa * self.size), 0)
        # transposed: [n_kv, n_head_kv, head_dim], a head is head_dim rows of kv_size values
        return ggml.view_4d(ctx, v, n_kv, hp.n_head_kv, hp.n_embd_head_v, 1,
                            ggml.row_size(v.type, self.size * hp.n_embd_head_v),
                            ggml.row_size(v.type, self.size),
                            ggml.row_size(v.type, self.size * hp.n_embd_v_gqa), 0)

    def cpy_k(self, ctx, k_cur, k_idxs, il: int):
        k = self.k_l[il]
        n_tokens = int(k_cur.ne[2])
        k_cur = ggml.view_2d(ctx, k_cur, int(k.ne[0]), n_tokens, int(k_cur.nb[2]), 0)
        return ggml.set_rows(ctx, k, k_cur, k_idxs)

    def cpy_v(self, ctx, v_cur, v_idxs, il: int):
        v = self.v_l[il]
        n_tokens = int(v_cur.ne[2])
        v_cur = ggml.reshape_2d(ctx, v_cur, int(v.ne[0]), n_tokens)
        if not self.v_trans:
            return ggml.set_rows(ctx, v, v_cur, v_idxs)
        # the transposed cache is addressed element by element: rows of one value
        v_view = ggml.reshape_2d(ctx, v, 1, int(v.ne[0]) * int(v.ne[1]))
        v_cur = ggml.reshape_2d(ctx, v_cur, 1, int(v_cur.ne[0]) * int(v_cur.ne[1]))
        return ggml.set_rows(ctx, v_view, v_cur, v_idxs)

    # ---- input data (llm_graph_input_attn_kv::set_input)
    def k_idxs_data(self, idxs) -> np.ndarray:
        return np.asarray(idxs, dtype=np.int64)

    def v_idxs_data(self, idxs) -> np.ndarray:
        if not self.v_trans:
            return np.asarray(idxs, dtype=np.int64)
        n_embd_v = self.hparams.n_embd_v_gqa
        ch = np.arange(n_embd_v, dtype=np.int64)
        return (ch[None, :] * self.size + np.asarray(idxs, dtype=np.int64)[:, None]).reshape(-1)

    def kq_mask_data(self, n_kv: int, pos, seq_ids) -> np.ndarray:
        """set_input_kq_mask: 0 where token j may attend cell i (same sequence, cell pos <= token pos), -INF elsewhere."""
        pos = np.asarray(pos, dtype=np.int64)
        cpos = self.cells.pos[:n_kv]
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        mask = np.full((len(pos), n_kv), -np.inf, dtype=np.float32)
        for sid in np.unique(seq_ids):
            in_seq = np.fromiter((int(sid) in s for s in self.cells.seq[:n_kv]), dtype=bool, count=n_kv)
            rows = np.nonzero(seq_ids == sid)[0]
            ok = (cpos[None, :] >= 0) & (cpos[None, :] <= pos[rows][:, None]) & in_seq[None, :]
            mask[rows] = np.where(ok, np.float32(0.0), np.float32(-np.inf))
        return mask
