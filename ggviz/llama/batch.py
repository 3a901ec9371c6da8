"""llama_batch: the tokens handed to llama_decode, and their validation.

Mirrors llama.h's ``struct llama_batch`` (token, embd, pos, n_seq_id, seq_id, logits) with ``llama_batch_get_one``
(a view of a token array: positions, sequence 0 and "output the last token" are filled in by decode) and
``llama_batch_init``/``llama_batch_free`` (arrays for up to n_tokens entries that the caller fills), and
llama-batch.cpp's ``llama_batch_allocr::init``: the checks llama_decode runs on a batch before it touches any
memory, and the fields it fills in (:func:`batch_allocr_init`).

Two kinds of bad batch, as in the C API:

* a batch whose *values* llama.cpp checks (token ids outside the vocabulary, seq_ids outside ``[0, n_seq_max)``,
  positions that do not continue the sequence in the KV cache ...): ``llama_decode`` returns -1 and the reason is
  logged with llama.cpp's ``LLAMA_LOG_ERROR`` text (``ggviz.ggml.impl.GGML_LOG``: logger ``ggviz.ggml``, and
  ``impl.log_messages``; the first error of the call is the reason). Nothing is touched.
* a batch that C's types would not let through -- token ids that are not integers (floats are refused, not
  truncated), arrays shorter than ``n_tokens``, a negative ``n_tokens``: a programming error, raised
  (``TypeError`` for a wrong type, :class:`DecodeError` otherwise).

ggviz checks a little more than llama.cpp, where llama.cpp would go on with memory it cannot describe: positions
must be valid ``llama_pos`` values >= 0 (llama.cpp marks an empty KV cell with position -1 and checks negative
positions only with debug-build asserts), ``n_seq_id[i]`` must be in ``[1, len(seq_id[i])]``, and the "decreasing
positions" check does what its comment says (llama.cpp's loop never updates ``cur_seq_pos``, so it never fires).
"""
from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass

import numpy as np

from ..ggml.impl import GGML_LOG

LLAMA_MAX_SEQ = 256                  # llama-cparams.h
LLAMA_POS_MAX = 2**31 - 1            # llama_pos is int32_t
_I32_MAX = 2**31 - 1


class DecodeError(RuntimeError):
    """A batch (or a decode) that cannot be run at all: a malformed batch, an input ggviz does not support, compute
    buffers that cannot be allocated. Invalid *values* are not raised: llama_decode returns -1, as in llama.cpp."""


@dataclass
class LlamaBatch:
    n_tokens: int
    token: np.ndarray | None = None
    embd: np.ndarray | None = None
    pos: np.ndarray | None = None
    n_seq_id: np.ndarray | None = None
    seq_id: list | None = None
    logits: np.ndarray | None = None


def _int_array(x, name: str, kinds: str = "iu") -> np.ndarray:
    """``x`` as a 1-D integer array, unchanged in value (no narrowing: an int64 2**32 + 5 stays 2**32 + 5, so the
    range check sees it). TypeError for anything that does not hold integers (floats are refused, not truncated)."""
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.dtype.kind in kinds and a.ndim == 1:
        return a
    if a.ndim == 1 and a.size == 0:
        return a.astype(np.int32)        # [] is float64 to NumPy
    if a.ndim != 1:
        raise TypeError(f"{name} must be a 1-D array, got shape {a.shape}")
    if a.dtype.kind == "O" and all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
                                   for v in a):
        return a                 # Python ints beyond int64: compared as Python ints by the range checks
    if a.dtype.kind == "O" and "b" in kinds and all(isinstance(v, (bool, np.bool_, numbers.Integral)) for v in a):
        return a
    raise TypeError(f"{name} must hold integers, not {a.dtype}" + (" (floats are not truncated)"
                                                                    if a.dtype.kind in "fc" else ""))


def batch_get_one(tokens) -> LlamaBatch:
    """llama_batch_get_one: a batch of one sequence whose positions continue the KV cache."""
    t = _int_array(np.asarray(tokens).reshape(-1), "llama_batch_get_one: tokens")
    if t.dtype != np.int32 and t.dtype.kind != "O" and len(t) and t.min() >= 0 and t.max() <= _I32_MAX:
        t = t.astype(np.int32)     # llama_token; values that do not fit stay as they are, for decode to refuse
    return LlamaBatch(n_tokens=len(t), token=t)


def batch_init(n_tokens_alloc: int, embd: int = 0, n_seq_max: int = 1) -> LlamaBatch:
    n_tokens_alloc = operator.index(n_tokens_alloc)
    if n_tokens_alloc < 0:
        raise ValueError(f"llama_batch_init: n_tokens_alloc = {n_tokens_alloc} < 0")
    b = LlamaBatch(n_tokens=0)
    if embd:
        b.embd = np.zeros((n_tokens_alloc, embd), dtype=np.float32)
    else:
        b.token = np.zeros(n_tokens_alloc, dtype=np.int32)
    b.pos = np.zeros(n_tokens_alloc, dtype=np.int32)
    b.n_seq_id = np.zeros(n_tokens_alloc, dtype=np.int32)
    b.seq_id = [[0] * n_seq_max for _ in range(n_tokens_alloc)]
    b.logits = np.zeros(n_tokens_alloc, dtype=np.int8)
    return b


def _store(arr: np.ndarray, i: int, value, what: str) -> None:
    """arr[i] = value for an integer ``value`` that fits arr's C type (numpy would wrap an np.int64 silently)."""
    v = operator.index(value)      # TypeError for floats, strings ...
    info = np.iinfo(arr.dtype)
    if not info.min <= v <= info.max:
        raise OverflowError(f"llama_batch_add: {what} = {v} does not fit the batch's {arr.dtype} field")
    arr[i] = v


def batch_add(batch: LlamaBatch, token: int, pos: int, seq_ids, logits: bool) -> None:
    """common_batch_add from llama.cpp's common library (values that C's types would not hold are refused)."""
    i = batch.n_tokens
    if batch.token is None or i >= len(batch.token):
        raise IndexError(f"llama_batch_add: the batch is full ({i} tokens allocated)")
    seq_ids = [operator.index(s) for s in seq_ids]
    _store(batch.token, i, token, "token")
    _store(batch.pos, i, pos, "pos")
    _store(batch.n_seq_id, i, len(seq_ids), "n_seq_id")
    batch.seq_id[i] = seq_ids
    batch.logits[i] = 1 if logits else 0
    batch.n_tokens += 1


def batch_free(batch: LlamaBatch) -> None:
    batch.n_tokens = 0


# ---------------------------------------------------------------------------------------------------------------
# llama_batch_allocr::init
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class AllocrBatch:
    """What llama_batch_allocr holds after a successful init: the batch with every field filled in."""
    token: np.ndarray        # int32 [n]
    pos: np.ndarray          # int64 [n]
    seq0: np.ndarray         # int64 [n]: seq_id[i][0] (the sequence whose cells token i attends)
    seq_ids: object          # seq0 when every token is in one sequence, else a list of tuples (all of them)
    output: np.ndarray       # bool [n]
    n_outputs: int


def _error(msg: str) -> None:
    GGML_LOG("error", msg)           # LLAMA_LOG_ERROR goes through ggml's log callback in llama.cpp too


def _field(batch, name: str, n: int, kinds: str = "iu") -> np.ndarray:
    a = _int_array(getattr(batch, name), f"llama_decode: batch.{name}", kinds)
    if len(a) < n:
        raise DecodeError(f"llama_decode: batch.{name} has {len(a)} entries, n_tokens = {n}")
    return a[:n]


def batch_allocr_init(batch, n_vocab: int, memory, n_seq_max: int, output_all: bool) -> AllocrBatch | None:
    """llama_batch_allocr::init: validate the batch and fill in what it leaves out; None (with the reason logged,
    as LLAMA_LOG_ERROR) when llama.cpp returns false -- decode then returns -1. ``memory`` is the KV cache
    (``seq_pos_min``/``seq_pos_max`` per sequence)."""
    n = operator.index(batch.n_tokens)
    if n <= 0:
        raise DecodeError(f"llama_batch_allocr::init: GGML_ASSERT(batch.n_tokens > 0) failed: n_tokens = {n}")

    # ---- validate input batch
    if n_seq_max > LLAMA_MAX_SEQ:
        _error(f"init: n_seq_max = {n_seq_max} > {LLAMA_MAX_SEQ}")
        return None
    if batch.token is None:
        raise DecodeError("llama_decode: embeddings input (batch.embd) is not supported by ggviz; pass tokens")
    tok = _field(batch, "token", n)
    if tok.min() < 0 or tok.max() >= n_vocab:
        i = int(np.flatnonzero((tok < 0) | (tok >= n_vocab))[0])
        _error(f"init: invalid token[{i}] = {int(tok[i])}")
        return None
    token = tok.astype(np.int32)
    if batch.seq_id is None and batch.pos is None and batch.logits is None:
        # llama_batch_get_one: sequence 0, positions from the memory, the last token output -- positions made
        # this way pass every consistency check below by construction
        p0 = memory.seq_pos_max(0) + 1
        if p0 + n - 1 > LLAMA_POS_MAX:
            _error(f"init: invalid pos[{LLAMA_POS_MAX + 1 - p0}] = {LLAMA_POS_MAX + 1} (positions must be in "
                   f"[0, {LLAMA_POS_MAX}])")
            return None
        output = np.full(n, bool(output_all))
        output[-1] = True
        seq0 = np.zeros(n, dtype=np.int64)
        return AllocrBatch(token=token, pos=np.arange(p0, p0 + n, dtype=np.int64), seq0=seq0, seq_ids=seq0,
                           output=output, n_outputs=int(output.sum()))

    multi = False               # some token belongs to more than one sequence
    if batch.seq_id is None:
        seq0 = np.zeros(n, dtype=np.int64)
        sets = None
    else:
        n_seq_id = _field(batch, "n_seq_id", n) if batch.n_seq_id is not None else np.ones(n, dtype=np.int64)
        if len(batch.seq_id) < n:
            raise DecodeError(f"llama_decode: batch.seq_id has {len(batch.seq_id)} entries, n_tokens = {n}")
        sets = []
        for i in range(n):
            row = batch.seq_id[i]
            k = int(n_seq_id[i])
            if not 1 <= k <= len(row):
                _error(f"init: invalid n_seq_id[{i}] = {k} (token {i} has {len(row)} seq_id slots)")
                return None
            ids = []
            for s in range(k):
                sid = row[s]
                if not isinstance(sid, numbers.Integral) or isinstance(sid, (bool, np.bool_)):
                    raise TypeError(f"llama_decode: batch.seq_id[{i}][{s}] must be an integer, not "
                                    f"{type(sid).__name__}")
                sid = int(sid)
                if sid < 0 or sid >= n_seq_max:
                    _error(f"init: invalid seq_id[{i}][{s}] = {sid} >= {n_seq_max}")
                    return None
                if sid not in ids:
                    ids.append(sid)
            multi = multi or len(ids) > 1
            sets.append(tuple(ids))
        seq0 = np.fromiter((ids[0] for ids in sets), dtype=np.int64, count=n)

    # ---- auto-generate missing fields
    if batch.pos is None:
        # the starting position of each sequence from the positions in the memory
        if sets is None or (not multi and (seq0 == seq0[0]).all()):
            pos = memory.seq_pos_max(int(seq0[0])) + 1 + np.arange(n, dtype=np.int64)
        else:
            p0 = {}
            pos = np.zeros(n, dtype=np.int64)
            for i in range(n):
                s0 = sets[i][0]
                if s0 not in p0:
                    p0[s0] = memory.seq_pos_max(s0) + 1
                pos[i] = p0[s0]
                # update the starting position for all sequences that are assigned to this token
                for s in sets[i]:
                    p0[s] = pos[i] + 1
    else:
        pos = _field(batch, "pos", n)
    if pos.min() < 0 or pos.max() > LLAMA_POS_MAX:
        i = int(np.flatnonzero((pos < 0) | (pos > LLAMA_POS_MAX))[0])
        _error(f"init: invalid pos[{i}] = {int(pos[i])} (positions must be in [0, {LLAMA_POS_MAX}])")
        return None
    pos = pos.astype(np.int64)

    if batch.logits is None:
        output = np.ones(n, dtype=bool) if output_all else np.zeros(n, dtype=bool)
        output[-1] = True                 # return the output only for the last token
    else:
        output = _field(batch, "logits", n, "iub").astype(bool)
        if output_all and not output.all():
            GGML_LOG("warn", "init: embeddings required but some input tokens were not marked as outputs -> "
                             "overriding")
            output = np.ones(n, dtype=bool)

    # ---- consistency checks (one stream, n_pos_per_embd == 1)
    by_seq: dict[int, np.ndarray] = {}
    if sets is None or not multi:
        for s in (np.unique(seq0) if sets is not None else (0,)):
            by_seq[int(s)] = pos if sets is None else pos[seq0 == s]
    else:
        rows: dict[int, list[int]] = {}
        for i, ids in enumerate(sets):
            for s in ids:
                rows.setdefault(s, []).append(i)
        by_seq = {s: pos[r] for s, r in sorted(rows.items())}
    for s, ps in by_seq.items():
        p_min, p_max = int(ps.min()), int(ps.max())
        p0 = memory.seq_pos_max(s)
        if p0 >= 0 and p_min != p0 + 1:
            _error(f"init: the tokens of sequence {s} in the input batch have inconsistent sequence positions:\n"
                   f" - the last position stored in the memory module of the context (i.e. the KV cache) for "
                   f"sequence {s} is X = {p0}\n"
                   f" - the tokens for sequence {s} in the input batch have a starting position of Y = {p_min}\n"
                   f" it is required that the sequence positions remain consecutive: Y = X + 1")
            return None
        if p_max - p_min + 1 > (len(np.unique(ps)) if len(ps) > 1 else 1):
            _error(f"init: sequence {s} positions are not continuous")
            return None
    if multi:
        # coupled sequences: a token in s0 (its first sequence) and s1 needs both to be at the same place
        cpl = sorted({(s1, ids[0]) for ids in sets for s1 in ids[1:]})
        for s1, s0 in cpl:
            if (memory.seq_pos_min(s0) != memory.seq_pos_min(s1)
                    or memory.seq_pos_max(s0) != memory.seq_pos_max(s1)):
                # llama.cpp loops s0 over the rows of seq_cpl: the coupled-to sequence is printed first
                _error(f"init: sequence {s1} is coupled to {s0} in the input batch, but have divereged")
                return None
    # disallow partial sequence sub-sets and decreasing sequence positions
    if sets is None:
        if n > 1 and (np.diff(pos) < 0).any():
            _error("init: sequence 0 positions are decreasing (not allowed)")
            return None
    else:
        cur_set: dict[int, frozenset] = {}
        cur_pos: dict[int, int] = {}
        for i in range(n):
            ids = frozenset(sets[i])
            p = int(pos[i])
            for s in sets[i]:
                cur = cur_set.get(s, ids) & ids
                cur_set[s] = cur
                if not cur:
                    _error(f"init: sequence {s} belongs to incompatible sequence sets (not allowed)")
                    return None
                if p < cur_pos.get(s, -1):
                    _error(f"init: sequence {s} positions are decreasing (not allowed)")
                    return None
                cur_pos[s] = p
    return AllocrBatch(token=token, pos=pos, seq0=seq0, seq_ids=sets if multi else seq0, output=output,
                       n_outputs=int(output.sum()))
