"""llama_kv_cache_iswa: two KV caches, one for the global (full-attention) layers and one for the sliding-window
layers, each with its own cells, head, n_kv and mask.

Mirrors llama.cpp's ``llama-kv-cache-iswa.cpp``: ``kv_base`` holds the layers where ``hparams.is_swa(il)`` is false
(size ``kv_size``), ``kv_swa`` the others (size ``GGML_PAD(min(kv_size, n_swa*n_seq_max + n_ubatch), 256)``, or
``kv_size`` with ``swa_full``, llama.cpp's default). Every ubatch is placed in both (``prepare`` / ``apply_ubatch``):
the same token may land in different cells of the two, because the sliding-window cache reuses the cells its
window has left behind. The graph gets two sets of inputs (``build_attn_inp_kv_iswa``); ``seq_pos_min/max`` are
the sliding-window cache's, as in llama.cpp.

The slot of a ubatch is an ``ISWASlot`` (llama.cpp's pair of ``slot_info_vec_t``): its two cell lists; iterated,
it yields one (base cell, swa cell) pair per token, so a list of placed pairs can be rolled back.
"""
from __future__ import annotations

from types import SimpleNamespace

from .. import ggml
from .kv_cache import KVCache


class ISWASlot:
    """The cells of one ubatch in the base and in the sliding-window cache."""

    def __init__(self, base: list, swa: list):
        self.base, self.swa = list(base), list(swa)

    def __len__(self):
        return len(self.base)

    def __iter__(self):
        return iter(zip(self.base, self.swa))

    def __repr__(self):
        return f"ISWASlot(base={self.base}, swa={self.swa})"


class KVCacheISWA:
    def __init__(self, hparams, kv_size: int, type_k=ggml.GGML_TYPE_F16, type_v=ggml.GGML_TYPE_F16,
                 v_trans: bool = True, n_pad: int = 256, bufts=None, n_seq_max: int = 1, n_ubatch: int = 512,
                 swa_full: bool = True):
        self.hparams = hparams
        size_base = kv_size
        size_swa = ggml.GGML_PAD(min(size_base, hparams.n_swa * max(1, n_seq_max) + n_ubatch), 256)
        if swa_full:
            # llama.cpp warns "using full-size SWA cache" (llama_context_default_params has swa_full = true)
            size_swa = size_base
        base_ids = [il for il in range(hparams.n_layer) if not hparams.is_swa(il)]
        swa_ids = [il for il in range(hparams.n_layer) if hparams.is_swa(il)]
        self.kv_base = KVCache(hparams, size_base, type_k, type_v, v_trans, n_pad, bufts, n_seq_max,
                               layer_ids=base_ids)
        self.kv_swa = KVCache(hparams, size_swa, type_k, type_v, v_trans, n_pad, bufts, n_seq_max,
                              layer_ids=swa_ids, n_swa=hparams.n_swa, swa_type=hparams.swa_type)
        self.v_trans = v_trans

    # the parts the views and the report read (llama.cpp: get_base() / get_swa())
    def get_base(self) -> KVCache:
        return self.kv_base

    def get_swa(self) -> KVCache:
        return self.kv_swa

    @property
    def size(self) -> int:
        return self.kv_base.size

    @property
    def cells(self):
        return self.kv_base.cells

    @property
    def ctxs(self):
        return self.kv_base.ctxs + self.kv_swa.ctxs

    @property
    def bufs(self):
        return self.kv_base.bufs + self.kv_swa.bufs

    @property
    def ctx(self):
        return self.kv_base.ctx

    @property
    def k_l(self):
        """Every layer's K, in layer order (each cache holds some of them)."""
        return [self._layer_cache(il).k_l[self._layer_cache(il).map_layer_ids[il]]
                for il in range(self.hparams.n_layer)]

    @property
    def v_l(self):
        return [self._layer_cache(il).v_l[self._layer_cache(il).map_layer_ids[il]]
                for il in range(self.hparams.n_layer)]

    def _layer_cache(self, il: int) -> KVCache:
        return self.kv_swa if self.hparams.is_swa(il) else self.kv_base

    @property
    def head(self):
        return (self.kv_base.head, self.kv_swa.head)

    # ---- memory API
    def clear(self, data: bool = True):
        self.kv_base.clear(data)
        self.kv_swa.clear(data)

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        res = self.kv_base.seq_rm(seq_id, p0, p1)
        return self.kv_swa.seq_rm(seq_id, p0, p1) and res

    def seq_pos_min(self, seq_id: int) -> int:
        return self.kv_swa.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return self.kv_swa.seq_pos_max(seq_id)

    # ---- placing ubatches
    def prepare(self, ubatches):
        """Both caches prepare the ubatches; None (nothing touched) if either has no room."""
        b = self.kv_base.prepare(ubatches)
        if b is None:
            return None
        s = self.kv_swa.prepare(ubatches)
        if s is None:
            return None
        return [ISWASlot(x, y) for x, y in zip(b, s)]

    def apply_ubatch(self, slot: ISWASlot, pos, seq_ids):
        self.kv_base.apply_ubatch(slot.base, pos, seq_ids)
        self.kv_swa.apply_ubatch(slot.swa, pos, seq_ids)

    def backup(self, slots):
        """What rollback needs (KVCache.backup): the base cache only fills empty cells; the sliding-window cache
        reuses cells and drops the positions its window left behind, so its cells and reused K/V rows are kept."""
        return self.kv_base.backup([sl.base for sl in slots]), self.kv_swa.backup([sl.swa for sl in slots])

    def rollback(self, cells, head, saved=None) -> None:
        """``cells``: the (base, swa) pairs a failed decode placed; ``head``: the (base, swa) heads before it;
        ``saved``: ``backup``'s, taken before the decode applied anything (both caches then exactly as they were,
        the sliding-window cells it evicted included)."""
        pairs = list(cells)
        sb, ss = saved if saved is not None else (None, None)
        self.kv_base.rollback([b for b, _ in pairs], head[0], sb)
        self.kv_swa.rollback([s for _, s in pairs], head[1], ss)

    def missing_windows(self, seq_id: int, p0: int) -> list:
        """KVCache.missing_window of each cache: ``[("base" | "swa", lo, pos_min)]`` (empty: nothing is gone)."""
        out = []
        for name, kv in (("base", self.kv_base), ("swa", self.kv_swa)):
            m = kv.missing_window(seq_id, p0)
            if m is not None:
                out.append((name, *m))
        return out

    def get_n_kv(self):
        """(n_kv of the base cache, n_kv of the sliding-window cache): the graph's two attended windows."""
        return (self.kv_base.get_n_kv(), self.kv_swa.get_n_kv())

    # ---- graph inputs (llm_graph_input_attn_kv_iswa::set_input)
    def set_input(self, inp, slot: ISWASlot, n_kv, pos, seq_ids) -> None:
        n_base, n_swa = n_kv if isinstance(n_kv, tuple) else (n_kv, n_kv)
        self.kv_base.set_input(inp, slot.base, n_base, pos, seq_ids)

        # the sliding-window cache's inputs, under the names KVCache.set_input writes
        swa = SimpleNamespace(k_idxs=inp.k_idxs_swa, v_idxs=inp.v_idxs_swa, kq_mask=inp.kq_mask_swa)
        self.kv_swa.set_input(swa, slot.swa, n_swa, pos, seq_ids)
