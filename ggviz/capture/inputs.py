"""What the context prepared for a compute, and the attention weights it computed: recorded from a real
``ggviz.llama`` run, never recomputed.

- ``capture_inputs(ctx)``: a context manager; for every ubatch decoded inside it, a ``DecodeSnapshot`` of what the
  context wrote into the graph's inputs just before compute (``llm_graph_result::set_inputs``: tokens, positions, the
  KQ mask) and of the KV cells (``ctx.graph_hook``).
- ``capture_attention(ctx, tokens)``: decodes ``tokens`` with the eval callback asking for the ``kq_soft_max-<il>``
  nodes (the attention weights after the mask and softmax) and copies them into an ``AttentionRecord``.

Both records are plain data (numpy arrays, lists): ``ggviz.capture.records`` saves and loads them.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .. import llama
from ..ggml.tensor import get_data, get_data_f32
from .eval_callback import EvalCallback, installed
from .nodes import layer_of


def token_piece(vocab, tid: int) -> str:
    """The token's text (special tokens written out; a newline as \\n), for labels."""
    try:
        s = vocab.token_to_piece(int(tid), special=True).decode("utf-8", "replace")
    except Exception:      # noqa: BLE001 - a label only
        s = f"<{tid}>"
    return s.replace("\n", "\\n")


class RecordedPieces:
    """The pieces of a few tokens, recorded from a vocabulary: answers ``token_to_piece`` (what ``token_piece`` and
    ``token_label`` ask a vocabulary) for those tokens, so a view loaded from disk labels them with no model."""

    def __init__(self, pieces: dict):
        self.pieces = {int(k): str(v) for k, v in pieces.items()}

    @classmethod
    def of(cls, vocab, ids) -> RecordedPieces:
        return cls({int(t): vocab.token_to_piece(int(t), special=True).decode("utf-8", "replace") for t in set(ids)})

    def token_to_piece(self, tid: int, special: bool = True) -> bytes:
        return self.pieces.get(int(tid), f"<{int(tid)}>").encode("utf-8")


def token_label(vocab, tid) -> str:
    """``token_piece``, quoted when it has spaces at an end (or is empty)."""
    p = token_piece(vocab, tid)
    return repr(p)[1:-1] if p.strip() == p and p else repr(p)


@dataclass
class DecodeSnapshot:
    """One ubatch as the context prepared it: its inputs and the KV cells of one cache (copies, taken before compute).

    An iSWA cache (Gemma-3: ``llama_kv_cache_iswa``) is two caches, each with its own cells, n_kv, indices and mask
    (``llm_graph_input_attn_kv_iswa``): the snapshot is the base cache's (``cache == "base"``) and ``swa`` holds the
    sliding-window cache's snapshot of the same ubatch."""
    n_tokens: int
    n_kv: int
    tokens: np.ndarray
    pos: np.ndarray
    kq_mask: np.ndarray           # (n_tokens, n_kv): 0 = may attend, -inf = masked
    cells_pos: np.ndarray         # pos of cells 0..kv_size-1 (-1 = empty)
    cells_seq: list               # seq ids of each of the first n_kv cells
    k_idxs: np.ndarray            # the cell each token's K is written to
    kv_size: int
    head: int
    cache: str = ""               # "" (the model has one cache), "base" or "SWA"
    layers: list = field(default_factory=list)     # the layers whose K/V this cache holds
    n_swa: int = 0                # the sliding window (SWA cache), 0 = none
    swa: DecodeSnapshot | None = None               # iSWA: the sliding-window cache's snapshot


def _cache_snapshot(res, kv, kq_mask, k_idxs, n_kv: int, cache: str = "") -> DecodeSnapshot:
    inp = res.inputs
    mask = np.array(get_data(kq_mask)).reshape(res.n_tokens if res.n_tokens else -1, -1)
    layers = getattr(kv, "layer_ids", None)
    return DecodeSnapshot(
        n_tokens=int(res.n_tokens), n_kv=int(n_kv), tokens=np.array(get_data(inp.tokens)).reshape(-1),
        pos=np.array(get_data(inp.pos)).reshape(-1), kq_mask=mask[:res.n_tokens, :n_kv],
        cells_pos=kv.cells.pos.copy(), cells_seq=[sorted(s) for s in kv.cells.seq[:n_kv]],
        k_idxs=np.array(get_data(k_idxs)).reshape(-1), kv_size=int(kv.size), head=int(kv.head), cache=cache,
        layers=list(layers) if layers is not None else list(range(kv.hparams.n_layer)),
        n_swa=int(getattr(kv, "n_swa", 0)))


@contextmanager
def capture_inputs(ctx):
    """Record a ``DecodeSnapshot`` for every ubatch decoded inside the block (yields the list). With an iSWA cache
    each snapshot is the base cache's, its ``swa`` the sliding-window cache's."""

    snaps: list[DecodeSnapshot] = []
    prev = ctx.graph_hook

    def hook(res):
        inp = res.inputs
        kv = ctx.kv
        if hasattr(kv, "kv_swa"):
            # two caches: the base one's inputs are attn_inp_kq_mask / k_idxs, the SWA one's the *_swa inputs
            snap = _cache_snapshot(res, kv.kv_base, inp.kq_mask, inp.k_idxs, res.n_kv, "base")
            snap.swa = _cache_snapshot(res, kv.kv_swa, inp.kq_mask_swa, inp.k_idxs_swa, res.n_kv_swa, "SWA")
        else:
            snap = _cache_snapshot(res, kv, inp.kq_mask, inp.k_idxs, res.n_kv)
        snaps.append(snap)
        if prev is not None:
            prev(res)

    ctx.graph_hook = hook
    try:
        yield snaps
    finally:
        ctx.graph_hook = prev


@dataclass
class AttentionRecord:
    """``kq_soft_max-<il>`` of every layer as recorded by the eval callback: (n_head, n_tokens, n_kv) each."""
    tokens: list
    pos: list
    layers: dict = field(default_factory=dict)        # il -> ndarray (n_head, n_tokens, n_kv)
    cells_pos: np.ndarray | None = None
    pieces: list = field(default_factory=list)


def capture_attention(ctx, tokens, layers=None) -> AttentionRecord:
    """Decode ``tokens`` on ``ctx`` and copy the attention weights of ``layers`` (default: all).

    The eval callback answers yes only for ``kq_soft_max-<il>`` nodes, so the scheduler computes the graph in
    ranges ending at those nodes and the callback sees each softmax before later nodes can reuse its memory.
    """

    if getattr(ctx, "flash_attn", False):
        raise ValueError("capture_attention needs a context without flash attention (flash_attn_type = 0): with "
                         "FLASH_ATTN_EXT the attention weights are never a tensor (llama.cpp's default on the CPU)")
    want = None if layers is None else {int(x) for x in layers}
    rec = AttentionRecord(tokens=list(tokens), pos=[])

    def wanted(t) -> bool:
        return t.name.startswith("kq_soft_max-") and (want is None or layer_of(t.name) in want)

    cb = EvalCallback(wanted, copy=lambda t: np.array(get_data_f32(t)[0]))    # (n_head, n_tokens, n_kv)

    with capture_inputs(ctx) as snaps, installed(ctx, cb):
        ret = llama.decode(ctx, llama.batch_get_one(list(tokens)))
    if ret != 0:
        raise RuntimeError(f"llama_decode returned {ret}")
    for v in cb.values:
        rec.layers[layer_of(v.name)] = v.data
    s = snaps[-1]
    rec.pos = s.pos.tolist()
    rec.cells_pos = s.cells_pos[:s.n_kv].copy()
    vocab = llama.model_get_vocab(ctx.model)
    rec.pieces = [token_label(vocab, t) for t in tokens]
    return rec
