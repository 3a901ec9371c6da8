"""Misuse never damages state, round two (issue 24): each case of the issue's red team as a test -- the clear error,
and the state as it was (the KV cells and the K/V bytes of every used cell, both caches of Gemma-3's iSWA; the next
valid decode's logits bit for bit against a fresh context fed the same history).

- llama_context_params copied when the context is created, as C passes the struct by value (``LlamaContext``);
- Gemma-3's iSWA cache without ``swa_full``: a failed decode gives back the sliding-window cells it evicted and the
  K/V rows it overwrote; a decode that attends positions whose cells are gone says so (a warning, a trace event);
- sampling refuses non-finite logits, the tokenizer a lone surrogate;
- a seeded fuzz of decode / abort / seq_rm / memory_clear / free / new context on both models, every logits row
  checked against a fresh replay of the same history.

Gemma-3's window is 512 tokens: a cache that evicts needs more than 768 positions (40 s of decode on a busy 2-core
machine), so the sliding-window cases run Gemma-3 270M with a 16-token window (a copy of the model object whose
hparams say ``n_swa = 16``: the same weights and graph; the window only shapes the cache and its mask).
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import re

import numpy as np
import pytest

from ggviz import ggml, llama, trace
from ggviz.fetch import models_dir
from ggviz.llama import context_pool
from tests.test_misuse_llama import _ctx, _fresh_logits

GEMMA = models_dir() / "gemma-3-270m-q4_k_m.gguf"


# ---------------------------------------------------------------------------------------------------------------
# 1. llama_context_params: copied at creation
# ---------------------------------------------------------------------------------------------------------------

def _params(threads=1, **kw):
    cp = llama.context_default_params()
    cp.n_ctx = 256
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    for k, v in kw.items():
        setattr(cp, k, v)
    return cp


def test_one_params_object_for_two_contexts_does_not_leak(model):
    """The issue's snippets: callbacks set on the params object after ctx1 was created fired inside ctx1 (an abort
    returned 2 from its decode); set_n_threads(ctx2) changed ctx1's threads and the caller's p.n_threads;
    p.hybrid flipped later broke ctx1 ('gpu_dev'). The context now owns a copy, as llama_init_from_model's
    by-value struct; ctx1's logits equal a fresh context's, bit for bit."""
    p = _params()
    keep = object()
    p.abort_callback_data = keep
    ctx1 = llama.init_from_model(model, p)
    assert ctx1.cparams is not p and ctx1.cparams.abort_callback_data is keep     # a shallow copy, as C's
    calls = []
    p.cb_eval = lambda t, ask: calls.append(t) or True
    p.abort_callback = lambda data: calls.append("abort") or True
    p.hybrid = True
    ctx2 = llama.init_from_model(model, _params())
    llama.set_n_threads(ctx2, 2, 3)
    assert (ctx2.cparams.n_threads, ctx2.cparams.n_threads_batch) == (2, 3)
    assert (ctx1.cparams.n_threads, ctx1.cparams.n_threads_batch) == (1, 1) and p.n_threads == 1
    assert ctx1.cparams.cb_eval is None and ctx1.cparams.abort_callback is None and not ctx1.cparams.hybrid
    assert llama.decode(ctx1, llama.batch_get_one([1, 2, 3])) == 0
    assert llama.decode(ctx1, llama.batch_get_one([4])) == 0
    assert calls == []
    assert llama.get_logits(ctx1).tobytes() == _fresh_logits(model, [[1, 2, 3]]).tobytes()
    for c in (ctx1, ctx2):
        llama.free(c)


def test_params_must_be_llama_context_params(model):
    with pytest.raises(TypeError, match="params must be llama_context_params, not dict"):
        llama.init_from_model(model, {"n_ctx": 256})


@pytest.mark.parametrize("enabled", [True, False])
def test_failed_load_and_init_leave_the_garbage_collector_as_it_was(model, tmp_path, enabled):
    """Model load and context creation pause Python's cyclic collector (ggml.memory.gc_paused): a failure inside
    leaves it as it was, enabled or not (the caller's choice)."""
    import gc
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with pytest.raises(TypeError):
            llama.init_from_model(model, {"n_ctx": 256})
        assert gc.isenabled() is enabled
        with pytest.raises(Exception):
            llama.model_load_from_file(str(tmp_path / "missing.gguf"), llama.model_default_params())
        assert gc.isenabled() is enabled
        with ggml.memory.gc_paused():
            with ggml.memory.gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_a_program_freezes_what_a_paused_block_made_and_only_when_it_ends_well():
    """`ggviz run` keeps its model and context until it exits: gc_freeze_after_paused makes the outermost
    gc_paused block freeze the heap as it ends (nothing for the collector to traverse again), but not after an
    error, and not for a library user (the flag is off by default)."""
    import gc
    mem = ggml.memory
    assert mem._gc_freeze_after is False                 # a library user's default
    was = gc.isenabled()
    gc.enable()
    gc.unfreeze()
    try:
        with mem.gc_paused():
            made = [[i] for i in range(1000)]
        assert gc.get_freeze_count() == 0                # off: nothing frozen
        mem.gc_freeze_after_paused()
        with pytest.raises(RuntimeError):
            with mem.gc_paused():
                raise RuntimeError("a failed load")
        assert gc.get_freeze_count() == 0 and gc.isenabled()
        with mem.gc_paused():
            with mem.gc_paused():
                made = [[i] for i in range(1000)]
            assert gc.get_freeze_count() == 0            # an inner block's end freezes nothing
        n = gc.get_freeze_count()
        assert n >= len(made) and gc.isenabled()
    finally:
        mem.gc_freeze_after_paused(False)
        gc.unfreeze()
        gc.enable() if was else gc.disable()


# ---------------------------------------------------------------------------------------------------------------
# 6. sampling on non-finite logits; lone surrogates
# ---------------------------------------------------------------------------------------------------------------

class _Out:
    """The one thing llama_sampler_sample reads from a context: get_logits_ith (here: given logits)."""

    def __init__(self, logits):
        self.logits = np.asarray(logits, np.float32)

    def get_logits_ith(self, i):
        return self.logits


def _chains():
    from ggviz import run as grun
    return {"greedy": lambda: grun.make_sampler(0.0), "dist": lambda: grun.make_sampler(0.8, seed=7)}


@pytest.mark.parametrize("case, what", [("all_nan", "NaN"), ("all_neginf", "-inf"), ("one_nan", "NaN"),
                                        ("one_posinf", "+inf"), ("one_neginf", "-inf")])
@pytest.mark.parametrize("chain", ["greedy", "dist"])
def test_sampling_refuses_non_finite_logits(case, what, chain):
    """All-NaN or all -inf logits still sampled a token (llama.cpp's greedy picks token 0, its dist a fixed
    fallback: it checks nothing). Refused now, naming the values, before any sampler ran: the chain draws
    afterwards exactly what a new chain draws."""
    rng = np.random.default_rng(3)
    good = rng.normal(size=64).astype(np.float32)
    bad = good.copy()
    bad[{"all_nan": slice(None), "all_neginf": slice(None), "one_nan": 5, "one_posinf": 9, "one_neginf": 0}[case]] = \
        {"all_nan": np.nan, "all_neginf": -np.inf, "one_nan": np.nan, "one_posinf": np.inf,
         "one_neginf": -np.inf}[case]
    smpl = _chains()[chain]()
    with pytest.raises(ValueError, match=rf"llama_sampler_sample: the logits of output -1 are not finite \(\d+ of 64: "
                                         rf".*{re.escape(what)}"):
        llama.sampler_sample(smpl, _Out(bad), -1)
    fresh = _chains()[chain]()
    got = [llama.sampler_sample(smpl, _Out(good * (k + 1)), -1) for k in range(3)]
    assert got == [llama.sampler_sample(fresh, _Out(good * (k + 1)), -1) for k in range(3)]


def test_a_lone_surrogate_is_refused_by_the_tokenizer(model):
    """'a\\ud800b' was tokenized to the bytes ED A0 80 without a word. llama-cpp-python's text.encode('utf-8')
    raises there; ggviz refuses it too, naming it (bytes still go through, invalid UTF-8 mapped as llama.cpp maps
    it: U+FFFD)."""
    vocab = llama.model_get_vocab(model)
    for call in (lambda t: llama.tokenize(vocab, t), lambda t: vocab.tokenize_words(t)):
        with pytest.raises(ValueError, match=r"llama_tokenize: the text has a lone surrogate U\+D800 at index 1 "
                                             r"\(not valid Unicode"):
            call("a\ud800b")
        with pytest.raises(ValueError, match=r"lone surrogate U\+DC80 at index 3"):
            call("héé\udc80")
    assert llama.tokenize(vocab, "a\U0001F600b") == llama.tokenize(vocab, "a\U0001F600b".encode())
    assert llama.tokenize(vocab, b"a\xffb") == llama.tokenize(vocab, "a\ufffdb")


# ---------------------------------------------------------------------------------------------------------------
# 2. Gemma-3's iSWA cache: rollback of evicted cells, the warning when a window's cells are gone
# ---------------------------------------------------------------------------------------------------------------

needs_gemma = pytest.mark.skipif(not GEMMA.exists(), reason=f"{GEMMA.name} is absent (ggviz fetch gemma3-270m)")
N_SWA = 16
HIST = [int(t) for t in (np.arange(264) * 7919 % 200000 + 100)]     # 264 positions: the 256-cell SWA cache wrapped


@pytest.fixture(scope="module")
def gemma():
    if not GEMMA.exists():
        pytest.skip(f"{GEMMA.name} is absent (ggviz fetch gemma3-270m)")
    m = llama.model_load_from_file(str(GEMMA))
    yield m
    context_pool.context_pool_clear(m)


@pytest.fixture(scope="module")
def gemma16(gemma):
    """Gemma-3 270M with a 16-token window (see the module docstring): a model object of its own."""
    m = copy.copy(gemma)
    m.hparams = dataclasses.replace(gemma.hparams, n_swa=N_SWA)
    yield m
    context_pool.context_pool_clear(m)


def _gctx(m, **kw):
    return _ctx(m, n_ctx=512, threads=2, n_batch=512, n_ubatch=16, swa_full=False, **kw)


@pytest.fixture(scope="module")
def gctx16(gemma16):
    """A context of gemma16 (swa_full off) holding HIST: its SWA cache has wrapped. Shared: the first test leaves it
    holding HIST + 2 tokens, the second cuts it."""
    ctx = _gctx(gemma16)
    assert llama.decode(ctx, llama.batch_get_one(HIST)) == 0
    yield ctx
    llama.free(ctx)


def _cache_state(kv) -> dict:
    """Cells and the K/V bytes of every used cell, of one KVCache."""
    used = np.flatnonzero(kv.cells.pos >= 0)
    rows = []
    for k, v in zip(kv.k_l, kv.v_l):
        rows.append(np.asarray(ggml.get_data(k)).reshape(kv.size, -1)[used].tobytes())
        rows.append(np.asarray(ggml.get_data(v)).reshape(-1, kv.size)[:, used].tobytes())
    return dict(pos=kv.cells.pos.tobytes(), seq=[sorted(s) for s in kv.cells.seq], used=kv.cells.used,
                mask=kv.cells.seq_mask.tobytes(), head=kv.head, rows=rows)


def _gfresh(m, history, nxt):
    ctx = _gctx(m)
    for toks in history:
        assert llama.decode(ctx, llama.batch_get_one(toks)) == 0
    assert llama.decode(ctx, llama.batch_get_one(nxt)) == 0
    out = llama.get_logits(ctx).copy()
    llama.free(ctx)
    return out


@needs_gemma
def test_a_failed_decode_gives_back_the_evicted_swa_cells(gemma16, gctx16, caplog):
    """swa_full = False, the SWA cache wrapped: a decode aborted in its second ubatch (the first one computed,
    its K/V written over reused cells) dropped the evicted cells (the issue: memory_seq_pos_min 232 -> 235).
    Now both caches are as before -- cells, K/V bytes, pos_min -- and the next decode equals a fresh replay."""
    m, ctx = gemma16, gctx16
    assert (ctx.kv.kv_swa.size, ctx.kv.kv_base.size) == (256, 512)
    pos_min = llama.memory_seq_pos_min(ctx, 0)
    assert pos_min > 0 and llama.memory_seq_pos_max(ctx, 0) == len(HIST) - 1        # evicted: the cache wrapped
    before = (_cache_state(ctx.kv.kv_base), _cache_state(ctx.kv.kv_swa), llama.get_logits(ctx).tobytes())
    seen = []

    def hook(res):
        seen.append(res)
        if len(seen) == 2:                 # the first ubatch is computed and stored over reused cells
            assert llama.memory_seq_pos_min(ctx, 0) > pos_min
            ctx.cparams.abort_callback = lambda data: True
    ctx.graph_hook = hook
    with caplog.at_level(logging.WARNING, logger="ggviz"):
        assert llama.decode(ctx, llama.batch_get_one(list(range(500, 524)))) == 2       # ubatches of 16 + 8
    ctx.graph_hook = None
    ctx.cparams.abort_callback = None
    assert len(seen) == 2
    assert llama.memory_seq_pos_min(ctx, 0) == pos_min
    assert (_cache_state(ctx.kv.kv_base), _cache_state(ctx.kv.kv_swa), llama.get_logits(ctx).tobytes()) == before
    assert not any("are gone" in r for r in caplog.messages)
    # an exception from the hook (a failure of any kind) the same way
    ctx.graph_hook = lambda res: (_ for _ in ()).throw(RuntimeError("boom in the hook"))
    with pytest.raises(RuntimeError, match="boom in the hook"):
        llama.decode(ctx, llama.batch_get_one(list(range(600, 624))))
    ctx.graph_hook = None
    assert (_cache_state(ctx.kv.kv_base), _cache_state(ctx.kv.kv_swa), llama.get_logits(ctx).tobytes()) == before
    assert llama.decode(ctx, llama.batch_get_one([7, 8])) == 0
    assert llama.get_logits(ctx).tobytes() == _gfresh(m, [HIST], [7, 8]).tobytes()


@needs_gemma
def test_a_decode_into_a_window_whose_cells_are_gone_warns(gemma16, gctx16, caplog):
    """seq_rm(0, p, -1) after the SWA cache evicted the front, then a decode at p: its window needs positions the
    SWA cache no longer has. The decode returns 0 (as llama.cpp's library) with logits that differ from a replay;
    ggviz says so: a warning naming the positions and a llama.kv_missing trace event."""
    m, ctx = gemma16, gctx16
    pos_min = llama.memory_seq_pos_min(ctx, 0)
    p = pos_min + 12                       # the window of p starts at p - 15 < pos_min
    assert llama.memory_seq_rm(ctx, 0, p, -1)
    with caplog.at_level(logging.WARNING, logger="ggviz"), trace.recording(("llama.kv_missing",)) as rec:
        assert llama.decode(ctx, llama.batch_get_one([9])) == 0
    lo = p - N_SWA + 1
    assert [e | {"ctx": 0} for e in rec.events if e["kind"] == "llama.kv_missing"] == [
        dict(kind="llama.kv_missing", ctx=0, seq_id=0, pos=p, lo=lo, pos_min=pos_min, cache="swa",
             t=rec.events[0]["t"])]
    assert f"decode: seq_id = 0 at pos = {p} attends positions [{lo}, {p}), but the swa KV cache holds them only " \
           f"from pos_min = {pos_min}: positions {lo}..{pos_min - 1} are gone" in " ".join(caplog.messages)
    assert llama.get_logits(ctx).tobytes() != _gfresh(m, [HIST[:p]], [9]).tobytes()


def test_a_decode_after_the_front_was_removed_warns(model, caplog):
    """The same on a plain cache: seq_rm of positions 0..1, then a decode at 3 attends them."""
    ctx = _ctx(model)
    assert llama.decode(ctx, llama.batch_get_one([1, 2, 3])) == 0
    with caplog.at_level(logging.WARNING, logger="ggviz"):
        assert llama.decode(ctx, llama.batch_get_one([4])) == 0
        assert not any("are gone" in r for r in caplog.messages)
        assert llama.memory_seq_rm(ctx, 0, 0, 2)
        assert llama.decode(ctx, llama.batch_get_one([5])) == 0
    assert "decode: seq_id = 0 at pos = 4 attends positions [0, 4), but the KV cache holds them only from " \
           "pos_min = 2: positions 0..1 are gone" in caplog.messages[-1]
    llama.free(ctx)




# ---------------------------------------------------------------------------------------------------------------
# 7. fuzz: random interleavings, every logits row against a fresh replay
# ---------------------------------------------------------------------------------------------------------------

def _caches(ctx):
    kv = ctx.kv
    return [kv.kv_base, kv.kv_swa] if hasattr(kv, "kv_swa") else [kv]


def _whole_state(ctx) -> tuple:
    return (tuple(tuple(sorted(_cache_state(c).items())) for c in _caches(ctx)), llama.get_logits(ctx).tobytes(),
            dict(ctx.output_ids), ctx.n_outputs)


def _seq_batch(tokens, s, p0):
    b = llama.batch_init(len(tokens), 0, 2)
    for i, t in enumerate(tokens):
        llama.batch_add(b, int(t), p0 + i, [s], True)           # every row an output: every row is compared
    return b


def _fuzz(model, seed: int, n_ops: int, **kw) -> dict:
    """``n_ops`` random calls on a 2-sequence context (seeded): valid decodes (1-5 tokens of either sequence),
    decodes that fail -- aborted (abort_callback, code 2) or raising (the graph hook) in their second ubatch, or
    invalid (a position gap: -1) --, seq_rm, memory_clear, llama_free + a new context (taken from the pool).
    Every failed call must leave the state as it was. Then a fresh replay: a new context per segment (the pool
    emptied first, so nothing is recycled) given only the calls that succeeded, in order: every logits row must
    be the same bits."""
    rng = np.random.default_rng(seed)
    vocab = model.hparams.n_vocab

    def new():
        return _ctx(model, n_seq_max=2, n_ubatch=4, **kw)
    ctx, segments, seg, hist, rows = new(), [], [], [0, 0], []
    counts: dict = {}
    for i in range(n_ops):
        r = rng.random() if i != n_ops // 2 else 1.0      # one llama_free + new context half-way, whatever the draw
        s = int(rng.integers(2))
        toks = [int(t) for t in rng.integers(1, vocab, int(rng.integers(1, 6)))]
        if r < 0.4 or not any(hist):                    # a valid decode
            assert llama.decode(ctx, _seq_batch(toks, s, hist[s])) == 0
            seg.append(("decode", s, hist[s], toks))
            rows.append(llama.get_logits(ctx).copy())
            hist[s] += len(toks)
            kind = "decode"
        elif r < 0.65:                                   # a decode failing in its second ubatch (abort, raise, ...)
            toks = toks + [5, 6, 7, 8]                   # 5..9 tokens: two or three ubatches of 4
            before = _whole_state(ctx)
            how = "raise" if counts.get("abort", 0) > counts.get("raise", 0) else "abort"
            seen = []

            def hook(res, how=how, seen=seen):
                seen.append(res)
                if len(seen) == 2:
                    if how == "raise":
                        raise RuntimeError("fuzz: failure in the second ubatch")
                    ctx.cparams.abort_callback = lambda data: True
            ctx.graph_hook = hook
            try:
                if how == "abort":
                    assert llama.decode(ctx, _seq_batch(toks, s, hist[s])) == 2
                else:
                    with pytest.raises(RuntimeError, match="fuzz: failure"):
                        llama.decode(ctx, _seq_batch(toks, s, hist[s]))
            finally:
                ctx.graph_hook = None
                ctx.cparams.abort_callback = None
            assert _whole_state(ctx) == before
            kind = how
        elif r < 0.7:                                    # invalid: a gap in the positions
            before = _whole_state(ctx)
            assert llama.decode(ctx, _seq_batch(toks, s, hist[s] + 3)) == -1
            assert _whole_state(ctx) == before
            kind = "invalid"
        elif r < 0.82:                                   # seq_rm of the tail
            p = int(rng.integers(0, hist[s] + 1))
            assert llama.memory_seq_rm(ctx, s, p, -1)
            seg.append(("rm", s, p))
            hist[s] = min(hist[s], p)
            kind = "seq_rm"
        elif r < 0.88:
            llama.memory_clear(ctx, bool(rng.integers(2)))
            seg.append(("clear",))
            hist = [0, 0]
            kind = "clear"
        else:                                            # llama_free, and a new context (recycled from the pool)
            llama.free(ctx)
            ctx = new()
            assert ctx.recycled
            segments.append(seg)
            seg, hist = [], [0, 0]
            kind = "free"
        counts[kind] = counts.get(kind, 0) + 1
    segments.append(seg)
    llama.free(ctx)
    # the fresh replay
    diffs, k = 0, 0
    for seg in segments:
        context_pool.context_pool_clear(model)
        fresh = new()
        assert not fresh.recycled
        for op in seg:
            if op[0] == "decode":
                _, s, p0, toks = op
                assert llama.decode(fresh, _seq_batch(toks, s, p0)) == 0
                diffs += int(llama.get_logits(fresh).tobytes() != rows[k].tobytes())
                k += 1
            elif op[0] == "rm":
                assert llama.memory_seq_rm(fresh, op[1], op[2], -1)
            else:
                llama.memory_clear(fresh)
        llama.free(fresh)
    context_pool.context_pool_clear(model)
    assert k == len(rows)
    return dict(counts=counts, diffs=diffs, rows=len(rows))


def test_fuzz_interleavings_smollm2(model):
    got = _fuzz(model, 2024, 12)
    assert got["diffs"] == 0, got
    assert got["rows"] >= 5 and {"abort", "raise", "free"} <= set(got["counts"]), got


@needs_gemma
def test_fuzz_interleavings_gemma3(gemma):
    got = _fuzz(gemma, 24, 12, swa_full=False)
    assert got["diffs"] == 0, got
    assert got["rows"] >= 5 and {"abort", "raise", "free"} <= set(got["counts"]), got
