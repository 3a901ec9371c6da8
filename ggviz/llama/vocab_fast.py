"""A compiled twin of vocab.py's SentencePiece session (``llm_tokenizer_spm_session::tokenize``) and of the
special-token search that ``tokenizer_st_partition`` starts with. Not a llama.cpp source file.

vocab.py's ``Vocab.spm_session`` is the lesson: the symbols' linked list, the bigram priority queue, resegment,
one Python operation at a time (and it keeps the merge trace the views show). Gemma-3's 262,144-token vocabulary
makes that the slowest step of a prompt, so ``Vocab.tokenize`` runs this same algorithm compiled with Numba, every
raw fragment of the text in one call, when Numba is there (``GGVIZ_NO_NUMBA=1`` or no Numba: the faithful code):

* the vocabulary's ``token_to_id`` becomes an open-addressing hash table of the tokens' UTF-8 bytes (FNV-1a, linear
  probing) over one concatenated byte array;
* the priority queue is a binary heap of parallel arrays ordered as llama.cpp's ``llm_bigram_spm::comparator``
  (highest score first, then the smallest ``left``); a stale pair is skipped by the same size test;
* resegment needs no ``rev_merge`` here: a final symbol that is not a token was never merged (merges only make
  tokens), so it is one character and falls back to its bytes' ``<0xXX>`` tokens -- what the faithful resegment
  does too;
* ``special_found`` is a byte trie of the special tokens walked from every position of the text: it tells which
  special tokens occur at all, so the partition (still vocab.py's loop) only cuts with those.

Importing this module raises ImportError when Numba is missing or disabled, like ggviz.ggml.cpu.fast.
"""
from __future__ import annotations

import os

if os.environ.get("GGVIZ_NO_NUMBA", "") not in ("", "0"):
    raise ImportError("the compiled fast path is disabled by GGVIZ_NO_NUMBA")

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from ..ggml.cpu.fast import cached_without_registries  # noqa: E402

_JIT = dict(cache=True, nogil=True, boundscheck=False)


def _compiled(fn):
    """``@njit`` with these options, its cached machine code loaded without Numba's compiler registries (as the
    fast path's kernels: ``ggviz.ggml.cpu.fast.cached_without_registries``)."""
    return cached_without_registries(njit(**_JIT)(fn))
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@_compiled
def _fnv1a(buf, s, n):
    h = _FNV_OFFSET
    for i in range(s, s + n):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return h


@_compiled
def build_table(tok_bytes, tok_off):
    """The hash table (int32 token ids, -1 empty; a power of two at least twice the token count)."""
    n = tok_off.shape[0] - 1
    size = 1
    while size < 2 * n:
        size *= 2
    table = np.full(size, -1, np.int32)
    mask = np.uint64(size - 1)
    for t in range(n):
        i = _fnv1a(tok_bytes, tok_off[t], tok_off[t + 1] - tok_off[t]) & mask
        while table[i] != -1:
            i = (i + np.uint64(1)) & mask
        table[i] = t
    return table


@_compiled
def _lookup(text, s, n, tok_bytes, tok_off, table):
    """``token_to_id.find(text[s:s+n])``: the id, or -1."""
    mask = np.uint64(table.shape[0] - 1)
    i = _fnv1a(text, s, n) & mask
    while True:
        t = table[i]
        if t == -1:
            return -1
        o = tok_off[t]
        if tok_off[t + 1] - o == n:
            k = 0
            while k < n and tok_bytes[o + k] == text[s + k]:
                k += 1
            if k == n:
                return t
        i = (i + np.uint64(1)) & mask


@_compiled
def _better(hs, hl, a, b):
    """llm_bigram_spm::comparator, reversed: does entry ``a`` come out of the queue before ``b``?"""
    return hs[a] > hs[b] or (hs[a] == hs[b] and hl[a] < hl[b])


@_compiled
def _swap(hs, hl, hr, hn, a, b):
    hs[a], hs[b] = hs[b], hs[a]
    hl[a], hl[b] = hl[b], hl[a]
    hr[a], hr[b] = hr[b], hr[a]
    hn[a], hn[b] = hn[b], hn[a]


@_compiled
def _push(hs, hl, hr, hn, m, score, left, right, n):
    hs[m], hl[m], hr[m], hn[m] = score, left, right, n
    i = m
    while i > 0:
        p = (i - 1) >> 1
        if not _better(hs, hl, i, p):
            break
        _swap(hs, hl, hr, hn, i, p)
        i = p
    return m + 1


@_compiled
def _pop(hs, hl, hr, hn, m):
    """Move the top entry to slot m - 1 (read it there) and restore the heap over the first m - 1."""
    m -= 1
    _swap(hs, hl, hr, hn, 0, m)
    i = 0
    while True:
        c = 2 * i + 1
        if c >= m:
            break
        if c + 1 < m and _better(hs, hl, c + 1, c):
            c += 1
        if not _better(hs, hl, c, i):
            break
        _swap(hs, hl, hr, hn, i, c)
        i = c
    return m


@_compiled
def spm_sessions(text, seg_off, tok_bytes, tok_off, table, scores, byte_tok, utf8_len, max_len, out, out_off):
    """Tokenize the fragments ``text[seg_off[k]:seg_off[k+1]]`` (escaped UTF-8); fragment k's ids go to
    ``out[out_off[k]:out_off[k+1]]``. Returns 0, or 1 + the byte whose fallback token is missing (the caller then
    runs the faithful code, which raises the error)."""
    total = text.shape[0]
    start = np.empty(total, np.int64)
    size = np.empty(total, np.int64)
    prev = np.empty(total, np.int64)
    nxt = np.empty(total, np.int64)
    cap = 3 * total + 1
    hs = np.empty(cap, np.float32)
    hl = np.empty(cap, np.int64)
    hr = np.empty(cap, np.int64)
    hn = np.empty(cap, np.int64)
    o = 0
    out_off[0] = 0
    for k in range(seg_off.shape[0] - 1):
        s0, s1 = seg_off[k], seg_off[k + 1]
        # one symbol per UTF-8 character (unicode_len_utf8 of the lead byte, cut at the end)
        count = 0
        offs = s0
        while offs < s1:
            n = min(utf8_len[text[offs] >> 4], s1 - offs)
            start[count] = offs
            size[count] = n
            prev[count] = count - 1
            nxt[count] = count + 1
            count += 1
            offs += n
        if count == 0:
            out_off[k + 1] = o
            continue
        nxt[count - 1] = -1
        m = 0
        for i in range(1, count):                                     # try_add_bigram(i - 1, i)
            n = size[i - 1] + size[i]
            if n <= max_len:
                t = _lookup(text, start[i - 1], n, tok_bytes, tok_off, table)
                if t >= 0:
                    m = _push(hs, hl, hr, hn, m, scores[t], i - 1, i, n)
        while m > 0:
            m = _pop(hs, hl, hr, hn, m)
            left, right, n = hl[m], hr[m], hn[m]
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != n:
                continue                                              # outdated pair
            size[left] += size[right]
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            a = prev[left]                                            # try_add_bigram(prev[left], left)
            if a != -1:
                n = size[a] + size[left]
                if n <= max_len:
                    t = _lookup(text, start[a], n, tok_bytes, tok_off, table)
                    if t >= 0:
                        m = _push(hs, hl, hr, hn, m, scores[t], a, left, n)
            b = nxt[left]                                             # try_add_bigram(left, nxt[left])
            if b != -1:
                n = size[left] + size[b]
                if n <= max_len:
                    t = _lookup(text, start[left], n, tok_bytes, tok_off, table)
                    if t >= 0:
                        m = _push(hs, hl, hr, hn, m, scores[t], left, b, n)
        i = 0
        while i != -1:                                                # resegment
            t = _lookup(text, start[i], size[i], tok_bytes, tok_off, table) if size[i] <= max_len else -1
            if t >= 0:
                out[o] = t
                o += 1
            else:                                                     # byte fallback
                for j in range(start[i], start[i] + size[i]):
                    bt = byte_tok[text[j]]
                    if bt < 0:
                        return 1 + text[j]
                    out[o] = bt
                    o += 1
            i = nxt[i]
        out_off[k + 1] = o
    return 0


@_compiled
def build_trie(needles, needle_off):
    """A byte trie of the needles: per node its byte, first child, next sibling and the needle ending there."""
    cap = needle_off[-1] + 1
    byte = np.zeros(cap, np.uint8)
    child = np.full(cap, -1, np.int64)
    sibling = np.full(cap, -1, np.int64)
    term = np.full(cap, -1, np.int64)
    nodes = 1
    for k in range(needle_off.shape[0] - 1):
        node = 0
        for j in range(needle_off[k], needle_off[k + 1]):
            c = needles[j]
            ch = child[node]
            while ch != -1 and byte[ch] != c:
                ch = sibling[ch]
            if ch == -1:
                ch = nodes
                nodes += 1
                byte[ch] = c
                sibling[ch] = child[node]
                child[node] = ch
            node = ch
        if term[node] == -1:
            term[node] = k
    return byte[:nodes].copy(), child[:nodes].copy(), sibling[:nodes].copy(), term[:nodes].copy()


@_compiled
def special_found(text, byte, child, sibling, term, n_needles):
    """Which needles occur in ``text`` (a bool per needle; equal needles: the first one's index)."""
    found = np.zeros(n_needles, np.bool_)
    total = text.shape[0]
    for p in range(total):
        node = 0
        q = p
        while q < total:
            c = text[q]
            ch = child[node]
            while ch != -1 and byte[ch] != c:
                ch = sibling[ch]
            if ch == -1:
                break
            node = ch
            if term[node] >= 0:
                found[term[node]] = True
            q += 1
    return found


def warmup() -> None:
    """Compile (or load from Numba's cache) every entry point with the argument types vocab.py passes (read-only
    byte views from np.frombuffer, int64 offsets, float32 scores), on a two-token vocabulary; ``./dev`` calls this
    so no first Gemma-3 prompt pays the compile."""
    tok_bytes = np.frombuffer(b"ab", dtype=np.uint8)
    tok_off = np.array([0, 1, 2], dtype=np.int64)
    byte_tok = np.full(256, -1, dtype=np.int32)
    tables = (tok_bytes, tok_off, build_table(tok_bytes, tok_off), np.asarray([0.0, 0.0], dtype=np.float32),
              byte_tok, np.ones(16, dtype=np.int64), 1)
    text = np.frombuffer(b"ab", dtype=np.uint8)
    seg = np.array([0, 2], dtype=np.int64)
    spm_sessions(text, seg, *tables, np.empty(2, dtype=np.int32), np.empty(2, dtype=np.int64))
    trie = build_trie(np.frombuffer(b"ab", dtype=np.uint8), np.array([0, 2], dtype=np.int64))
    special_found(text, *trie, 1)
