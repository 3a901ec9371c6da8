"""llama_batch: the tokens handed to llama_decode.

Mirrors llama.h's ``struct llama_batch`` (token, embd, pos, n_seq_id, seq_id, logits) with ``llama_batch_get_one``
(a view of a token array: positions, sequence 0 and "output the last token" are filled in by decode) and
``llama_batch_init``/``llama_batch_free`` (arrays for up to n_tokens entries that the caller fills).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class LlamaBatch:
    n_tokens: int
    token: np.ndarray | None = None
    embd: np.ndarray | None = None
    pos: np.ndarray | None = None
    n_seq_id: np.ndarray | None = None
    seq_id: list | None = None
    logits: np.ndarray | None = None


def batch_get_one(tokens) -> LlamaBatch:
    t = np.asarray(tokens, dtype=np.int32).reshape(-1)
    return LlamaBatch(n_tokens=len(t), token=t)


def batch_init(n_tokens_alloc: int, embd: int = 0, n_seq_max: int = 1) -> LlamaBatch:
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


def batch_add(batch: LlamaBatch, token: int, pos: int, seq_ids, logits: bool) -> None:
    """common_batch_add from llama.cpp's common library."""
    i = batch.n_tokens
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = len(seq_ids)
    batch.seq_id[i] = list(seq_ids)
    batch.logits[i] = 1 if logits else 0
    batch.n_tokens += 1


def batch_free(batch: LlamaBatch) -> None:
    batch.n_tokens = 0
