"""llama_kv_cache: per-layer K and V tensors, the cells that say what each slot holds, and the graph inputs.

Mirrors llama.cpp's ``llama_kv_cache`` (unified, one stream) and ``llama_kv_cells``:

- K is ``cache_k_l{il}`` [n_embd_k_gqa, kv_size] and V is ``cache_v_l{il}`` [n_embd_v_gqa, kv_size], F16 by
  default. Without flash attention V is stored *transposed* (``v_trans``): channel-major, so that
  ``kqv = V^T · softmax(KQ)`` reads contiguous rows; with flash attention (llama.cpp's default on the CPU) V is
  stored like K, one row per cell, which FLASH_ATTN_EXT reads cell by cell.
- ``find_slot`` picks free cells for a ubatch starting at ``head``; ``apply_ubatch`` marks them used;
  ``prepare`` finds the slots of every ubatch of a batch before any of them is computed (placing them one after
  the other, then restoring the cells), so a batch that does not fit is refused with nothing touched;
  ``rollback`` frees the cells a failed decode had placed (they were empty before it).
- ``get_n_kv`` is the attended window: the used cells rounded up to ``n_pad`` (256), capped at kv_size.
- ``cpy_k``/``cpy_v`` write a ubatch's K/V into the cache with SET_ROWS through index tensors (``k_idxs``: a cell
  per token; ``v_idxs``: for the transposed V, an element index ``channel*kv_size + cell`` per value).
- ``get_k``/``get_v`` are the views the attention reads, and ``set_input_kq_mask`` builds the causal mask.
- A cache may hold only some layers (``layer_ids``, llama.cpp's ``filter``: the iSWA cache in kv_cache_iswa.py
  makes one for the global layers and one for the sliding-window layers); a sliding-window cache (``n_swa`` > 0,
  ``swa_type``) also masks what lies beyond the window, and may reuse cells the window has left behind.
"""
from __future__ import annotations

import operator

import numpy as np

from .. import ggml
from ..ggml import alloc as galloc
from ..ggml import backend as gb
from ..ggml import impl
from .graph import TOK

_0T00, _00TT = (0, TOK, 0, 0), (0, 0, TOK, TOK)


def _no_rec(t, ne_roles, nb_roles=None):
    return t


N_PAD = 256   # llama_kv_cache's padding of n_kv (max(n_pad, 256), with or without flash attention)


class KVCells:
    """llama_kv_cells: pos[-1 = empty] and sequence membership per cell.

    ``seq[i]`` is the set of sequences of cell i (llama.cpp's bitset per cell); ``seq_mask[s, i]`` says the same
    as an array, so that ``seq_pos_min/max`` (llama.cpp keeps a set of positions per sequence for them) and the
    mask are vectorized instead of a Python loop over the cells."""

    def __init__(self, size: int, n_seq_max: int = 1):
        self.pos = np.full(size, -1, dtype=np.int64)
        self.seq = [set() for _ in range(size)]
        self.seq_mask = np.zeros((max(1, n_seq_max), size), dtype=bool)
        self.used = 0

    def size(self):
        return len(self.pos)

    def is_empty(self, i):
        return self.pos[i] == -1

    def used_max_p1(self) -> int:
        nz = np.flatnonzero(self.pos >= 0)
        return int(nz[-1]) + 1 if len(nz) else 0

    def rm(self, i):
        if self.pos[i] >= 0:
            self.used -= 1
        self.pos[i] = -1
        self.seq[i].clear()
        self.seq_mask[:, i] = False

    def set(self, i, pos: int, seq_ids) -> None:
        """pos_set + seq_add of an empty cell."""
        if self.pos[i] < 0:
            self.used += 1
        self.pos[i] = pos
        self.seq[i] = set(seq_ids)
        self.seq_mask[:, i] = False
        self.seq_mask[list(seq_ids), i] = True

    def seq_discard(self, i, seq_id: int) -> bool:
        """seq_rm of one cell: True if the cell became empty."""
        self.seq[i].discard(seq_id)
        self.seq_mask[seq_id, i] = False
        if not self.seq[i]:
            self.rm(i)
            return True
        return False

    def seq_pos_max(self, seq_id: int) -> int:
        """The largest position of sequence seq_id in the cells (-1: none)."""
        p = self.pos[self.seq_mask[seq_id]]
        return int(p.max()) if len(p) else -1

    def seq_pos_min(self, seq_id: int) -> int:
        """The smallest position of sequence seq_id in the cells (-1: none)."""
        p = self.pos[self.seq_mask[seq_id]]
        return int(p.min()) if len(p) else -1


class KVCache:
    def __init__(self, hparams, kv_size: int, type_k=ggml.GGML_TYPE_F16, type_v=ggml.GGML_TYPE_F16,
                 v_trans: bool = True, n_pad: int = N_PAD, bufts=None, n_seq_max: int = 1,
                 layer_ids=None, n_swa: int = 0, swa_type: int = 0):
        self.hparams = hparams
        # the layers this cache holds (llama.cpp's layer filter) and il -> index (map_layer_ids)
        self.layer_ids = list(range(hparams.n_layer)) if layer_ids is None else list(layer_ids)
        self.map_layer_ids = {il: i for i, il in enumerate(self.layer_ids)}
        self.n_swa, self.swa_type = int(n_swa), int(swa_type)
        self.size = kv_size
        self.type_k, self.type_v = type_k, type_v
        self.v_trans = v_trans
        self.n_pad = n_pad
        self.n_seq_max = max(1, n_seq_max)
        self.cells = KVCells(kv_size, self.n_seq_max)
        self.head = 0
        n_layer = len(self.layer_ids)
        # llama.cpp's ctx_map: one no_alloc context per buffer type (bufts[il]: the layer's device buffer type when
        # the KV cache is offloaded, else the CPU's), each allocated in one backend buffer and cleared
        if bufts is None:
            bufts = [gb.backend_cpu_buffer_type()] * hparams.n_layer      # indexed by il, like the caller's
        ctx_map: dict = {}
        self.k_l, self.v_l = [], []
        for il in self.layer_ids:
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
    def clear(self, data: bool = True):
        """llama_kv_cache::clear: forget every cell; with ``data`` also zero the K/V buffers (as llama.cpp does:
        stale values in empty cells are masked, but a NaN there would still reach the output as 0 * NaN)."""
        self.cells = KVCells(self.size, self.n_seq_max)
        self.head = 0
        if data:
            for buf in self.bufs:
                gb.backend_buffer_clear(buf, 0)

    def _check_seq_id(self, fn: str, seq_id: int, allow_all: bool) -> int:
        seq_id = operator.index(seq_id)
        impl.GGML_ASSERT((allow_all and seq_id == -1) or 0 <= seq_id < self.n_seq_max,
                         f"{fn}: GGML_ASSERT(seq_id {'== -1 || ' if allow_all else ''}(seq_id >= 0 && seq_id < "
                         f"n_seq_max)) failed: seq_id = {seq_id}, n_seq_max = {self.n_seq_max}")
        return seq_id

    def seq_pos_max(self, seq_id: int) -> int:
        """llama_kv_cache::seq_pos_max (-1: the sequence has no cell)."""
        return self.cells.seq_pos_max(self._check_seq_id("llama_kv_cache::seq_pos_max", seq_id, False))

    def seq_pos_min(self, seq_id: int) -> int:
        """llama_kv_cache::seq_pos_min (-1: the sequence has no cell)."""
        return self.cells.seq_pos_min(self._check_seq_id("llama_kv_cache::seq_pos_min", seq_id, False))

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        """llama_kv_cache::seq_rm: remove positions [p0, p1) of seq_id (-1: of every sequence; p0 < 0: from 0,
        p1 < 0: to the end)."""
        seq_id = self._check_seq_id("llama_kv_cache::seq_rm", seq_id, True)
        p1 = np.iinfo(np.int64).max if p1 < 0 else p1
        p0 = 0 if p0 < 0 else p0
        new_head = self.size
        for i in range(self.size):
            if self.cells.pos[i] >= 0 and (seq_id < 0 or seq_id in self.cells.seq[i]) and p0 <= self.cells.pos[i] < p1:
                if seq_id < 0:
                    self.cells.rm(i)
                else:
                    self.cells.seq_discard(i, seq_id)
                if self.cells.is_empty(i) and new_head == self.size:
                    new_head = i
        # as llama.cpp: if we freed up a slot, set head to it so searching can start there
        if new_head != self.size and new_head < self.head:
            self.head = new_head
        return True

    def find_slot(self, n_tokens: int) -> list[int]:
        """llama_kv_cache::find_slot (non-continuous): the first n_tokens empty cells from ``head``."""
        if n_tokens > self.size:
            raise ValueError(f"n_tokens = {n_tokens} > size = {self.size}")
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
            if self.cells.is_empty(head_cur) or self._swa_reusable(head_cur):
                idxs.append(head_cur)
            head_cur += 1
            n_tested += 1
            if n_tested >= self.size and len(idxs) < n_tokens:
                raise RuntimeError(f"KV cache is full: {self.cells.used} of {self.size} cells used, "
                                   f"cannot place {n_tokens} tokens (decode returns 1 in llama.cpp)")
        return idxs

    def _swa_reusable(self, i: int) -> bool:
        """find_slot's second way to use a cell: it holds one sequence, and the window of that sequence's latest
        position (+1) has left it behind (is_masked_swa)."""
        if self.n_swa <= 0 or len(self.cells.seq[i]) != 1:
            return False
        (s,) = self.cells.seq[i]
        return bool(self.hparams.is_masked_swa(self.n_swa, self.swa_type, int(self.cells.pos[i]),
                                               self.cells.seq_pos_max(s) + 1))

    def apply_ubatch(self, idxs, pos, seq_ids):
        """llama_kv_cache::apply_ubatch: cell idxs[k] holds position pos[k] of the sequences seq_ids[k] (one id, or
        a sequence of ids for a token shared by several sequences); the head moves after the slot. A reused
        (sliding-window) cell drops its old position first, and then every older position of that sequence
        (``seq_rm(s, -1, seq_pos_max_rm[s] + 1)``), as llama.cpp does."""
        seq_pos_max_rm: dict[int, int] = {}
        for c in idxs:
            if not self.cells.is_empty(c):
                (s,) = self.cells.seq[c]
                seq_pos_max_rm[s] = max(seq_pos_max_rm.get(s, -1), int(self.cells.pos[c]))
                self.cells.rm(c)
        for i, c in enumerate(idxs):
            s = seq_ids[i]
            self.cells.set(c, int(pos[i]), (int(s),) if isinstance(s, (int, np.integer)) else [int(x) for x in s])
        for s, p in seq_pos_max_rm.items():
            self.seq_rm(s, -1, p + 1)
        self.head = idxs[-1] + 1 if idxs else self.head

    def prepare(self, ubatches) -> list | None:
        """llama_kv_cache::prepare: find the slot of each ubatch ``(pos, seq_ids)`` as if the ones before it were
        placed (they are placed, then the cells and the head are restored). Returns the cells of each ubatch, or
        None if one does not fit -- in both cases the cache is as it was."""
        head0 = self.head
        # a sliding-window cache may reuse occupied cells, which rollback cannot give back: keep a copy instead
        saved = self._snapshot() if self.n_swa > 0 else None
        placed: list[list[int]] = []
        ok = True
        try:
            for pos, seq_ids in ubatches:
                try:
                    idxs = self.find_slot(len(pos))
                except ValueError as e:        # n_tokens > size
                    impl.GGML_LOG("error", f"find_slot: {e}")
                    ok = False
                    break
                except RuntimeError:           # no room (llama.cpp returns an empty slot_info, silently)
                    ok = False
                    break
                placed.append(idxs)
                self.apply_ubatch(idxs, pos, seq_ids)
        finally:
            if saved is not None:
                self._restore(saved)
            else:
                self.rollback([c for idxs in placed for c in idxs], head0)
        return placed if ok else None

    # The snapshot is taken on every decode (prepare), so it must be cheap: a fresh set per cell made ~2,000 objects
    # per decode and the garbage collector's passes over them cost ~15 ms of a 40 ms Gemma decode step. Empty sets are
    # shared, not copied (a cell's set is never grown in place: ``Cells.set`` replaces it), and the snapshot, owned by
    # the one prepare() that took it, is handed back as it is.
    def _snapshot(self):
        c = self.cells
        return (c.pos.copy(), [set(x) if x else x for x in c.seq], c.seq_mask.copy(), c.used, self.head)

    def _restore(self, saved) -> None:
        c = self.cells
        c.pos, c.seq, c.seq_mask, c.used, self.head = saved

    def backup(self, slots):
        """ggviz: what ``rollback`` needs to undo a decode whose ubatches go to ``slots`` (prepare's cells), taken
        before the first apply_ubatch. A cache without a sliding window only fills empty cells: nothing (None). A
        sliding-window cache also reuses occupied cells (their old K/V rows are overwritten by the compute) and
        apply_ubatch then drops every older position of the sequence: its cells as they are, and the K/V bytes of
        the occupied cells the slots reuse. (llama.cpp keeps neither: a failed decode there loses the evicted
        cells; ggviz promises that a failed decode leaves the cache as it was.)"""
        if self.n_swa <= 0:
            return None
        reused = np.array(sorted({int(c) for idxs in slots for c in idxs if self.cells.pos[c] >= 0}), np.int64)
        rows = None
        if len(reused) and not all(gb.backend_buffer_is_host(b) for b in self.bufs):
            # a cache in device memory (offload_kqv): its tensors whole, through the backend (get/set_tensor)
            rows = [(None, gb.backend_tensor_get(t, None, 0, ggml.nbytes(t))) for t in self.k_l + self.v_l]
        elif len(reused):
            rows = [(ggml.get_data(k).reshape(self.size, -1)[reused].copy(),
                     ggml.get_data(v).reshape(-1, self.size)[:, reused].copy() if self.v_trans
                     else ggml.get_data(v).reshape(self.size, -1)[reused].copy())
                    for k, v in zip(self.k_l, self.v_l)]
        return self._snapshot(), reused, rows

    def rollback(self, cells, head: int, saved=None) -> None:
        """ggviz: undo apply_ubatch of a failed or interrupted decode. Without ``saved`` (a cache that only filled
        empty cells): those cells are empty again and the head is back where it was (llama.cpp's decode does
        ``seq_rm(s, pos_min, -1)`` for the sequences of the failed ubatch; on cells that were empty before, that
        frees the same cells). With ``saved`` (``backup``'s, a sliding-window cache): the cells as they were,
        evicted ones included, and the K/V bytes of the reused cells."""
        if saved is None:
            for c in cells:
                self.cells.rm(c)
            self.head = head
            return
        snap, reused, rows = saved
        self._restore(snap)
        if rows is not None and rows[0][0] is None:
            for t, (_, data) in zip(self.k_l + self.v_l, rows):
                gb.backend_tensor_set(t, data, 0, len(data))
        elif rows is not None:
            for (k, v), (kr, vr) in zip(zip(self.k_l, self.v_l), rows):
                ggml.get_data(k).reshape(self.size, -1)[reused] = kr
                if self.v_trans:
                    ggml.get_data(v).reshape(-1, self.size)[:, reused] = vr
                else:
                    ggml.get_data(v).reshape(self.size, -1)[reused] = vr

    def missing_window(self, seq_id: int, p0: int):
        """ggviz: the positions a token of ``seq_id`` at ``p0`` attends that this cache no longer holds, as
        ``(lo, pos_min)`` -- positions ``lo .. pos_min - 1`` are gone -- or None. The token attends every earlier
        position (``lo`` = 0), or with a sliding window those within it (``lo = p0 - n_swa + 1``); the cache holds
        ``[seq_pos_min, seq_pos_max]`` (llama.cpp keeps that range whole). A window the cache has left behind
        (evicted cells, ``seq_rm`` of the front) makes the logits differ from a replay: llama.cpp's library says
        nothing; its server (server-context.cpp) compares ``seq_pos_min`` with ``max(0, pos_next - n_swa)``, one
        position more cautious than this exact window, and re-processes the prompt (or restores a checkpoint)."""
        pmin = self.cells.seq_pos_min(seq_id)
        if pmin < 0 or p0 <= 0:
            return None
        lo = max(0, p0 - self.n_swa + 1) if self.n_swa > 0 else 0
        return (lo, pmin) if pmin > lo else None

    def missing_windows(self, seq_id: int, p0: int) -> list:
        """``missing_window`` as a list of ``(cache, lo, pos_min)`` (the iSWA cache has two caches to ask)."""
        m = self.missing_window(seq_id, p0)
        return [("kv", *m)] if m is not None else []

    def get_n_kv(self) -> int:
        return int(min(self.size, max(self.n_pad, ggml.GGML_PAD(self.cells.used_max_p1(), self.n_pad))))

    # ---- graph pieces (llama_kv_cache_context in llama.cpp)
    def get_k(self, ctx, il: int, n_kv: int):
        hp = self.hparams
        k = self.k_l[self.map_layer_ids[il]]
        return ggml.view_4d(ctx, k, hp.n_embd_head_k, hp.n_head_kv, n_kv, 1,
                            ggml.row_size(k.type, hp.n_embd_head_k),
                            ggml.row_size(k.type, hp.n_embd_k_gqa),
                            ggml.row_size(k.type, hp.n_embd_k_gqa * self.size), 0)

    def get_v(self, ctx, il: int, n_kv: int):
        hp = self.hparams
        v = self.v_l[self.map_layer_ids[il]]
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

    # ``rec``: ggviz, the graph builder's record of the shapes taken from n_tokens (LlmGraphContext.rec): k_cur and
    # v_cur are [head_dim, n_head_kv, n_tokens]
    def cpy_k(self, ctx, k_cur, k_idxs, il: int, rec=_no_rec):
        k = self.k_l[self.map_layer_ids[il]]
        n_tokens = int(k_cur.ne[2])
        k_cur = ggml.view_2d(ctx, k_cur, int(k.ne[0]), n_tokens, int(k_cur.nb[2]), 0)
        rec(k_cur, _0T00, _00TT)          # (view_2d: nb[2] = nb[3] = nb[1] * ne[1])
        return ggml.set_rows(ctx, k, k_cur, k_idxs)

    def cpy_v(self, ctx, v_cur, v_idxs, il: int, rec=_no_rec):
        v = self.v_l[self.map_layer_ids[il]]
        n_tokens = int(v_cur.ne[2])
        if not self.v_trans:
            # flash attention: V stored like K, one row per cell (a view of the token rows, as cpy_k)
            v_cur = ggml.view_2d(ctx, v_cur, int(v.ne[0]), n_tokens, int(v_cur.nb[2]), 0)
            rec(v_cur, _0T00, _00TT)
            return ggml.set_rows(ctx, v, v_cur, v_idxs)
        v_cur = ggml.reshape_2d(ctx, v_cur, int(v.ne[0]), n_tokens)
        rec(v_cur, _0T00)
        # the transposed cache is addressed element by element: rows of one value
        v_view = ggml.reshape_2d(ctx, v, 1, int(v.ne[0]) * int(v.ne[1]))
        v_cur = ggml.reshape_2d(ctx, v_cur, 1, int(v_cur.ne[0]) * int(v_cur.ne[1]))
        rec(v_cur, _0T00)
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
            in_seq = self.cells.seq_mask[sid, :n_kv]
            rows = np.nonzero(seq_ids == sid)[0]
            ok = (cpos[None, :] >= 0) & (cpos[None, :] <= pos[rows][:, None]) & in_seq[None, :]
            if self.n_swa > 0:
                # apply SWA: a token at p1 does not see p0 when p1 - p0 >= n_swa (LLAMA_SWA_TYPE_STANDARD)
                ok &= ~self.hparams.is_masked_swa(self.n_swa, self.swa_type, cpos[None, :], pos[rows][:, None])
            mask[rows] = np.where(ok, np.float32(0.0), np.float32(-np.inf))
        return mask

    def set_input(self, inp, idxs, n_kv: int, pos, seq_ids) -> None:
        """llm_graph_input_attn_kv::set_input: the cache's k_idxs, v_idxs and kq_mask of a ubatch in cells idxs."""
        n_tokens = len(pos)
        ggml.get_data(inp.k_idxs)[...] = self.k_idxs_data(idxs).reshape(1, 1, 1, -1)
        ggml.get_data(inp.v_idxs)[...] = self.v_idxs_data(idxs).reshape(1, 1, 1, -1)
        ggml.get_data(inp.kq_mask)[...] = self.kq_mask_data(n_kv, pos, seq_ids).reshape(1, 1, n_tokens, n_kv)
