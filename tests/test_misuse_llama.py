"""Misuse of the llama API never damages state (issue 13): each case asserts the exact outcome (llama.cpp's return
code and log line, or the exception and its message), that the context is as it was (KV cells, positions, sequences,
the K/V bytes of the used cells, the head, the outputs), and that the next valid decode gives the logits a fresh
context gives for the same history, bit for bit. Ends with a seeded fuzz run of random batches.

The oracle for the codes and messages is llama.cpp's source: ``llama_batch_allocr::init`` (llama-batch.cpp),
``llama_context::decode`` / ``llama_decode`` (llama-context.cpp), ``llama_kv_cache::prepare`` /
``find_slot`` / ``clear`` (llama-kv-cache.cpp); where ggviz is stricter, the test says so.
"""
from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest

from ggviz import ggml, llama
from ggviz.ggml import backend as gb
from ggviz.ggml import consts as C
from ggviz.ggml import sched as gs
from ggviz.ggml.cpu import ggml_cpu
from ggviz.ggml.cpu import threadpool as tpm
from ggviz.llama import context as lctx
from tests import graphs as G
from tests.test_threadpool import _compute, _guarded

PREFIX = [1, 2, 3]            # the history every case starts from: sequence 0 at positions 0..2
NEXT = [4]                    # the next valid decode after a case




def _ctx(model, n_ctx=256, threads=1, **kw):
    cp = llama.context_default_params()
    cp.n_ctx = n_ctx
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    for k, v in kw.items():
        setattr(cp, k, v)
    return llama.init_from_model(model, cp)


def _weights_digest(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.tensors.items()):
        buf = np.empty(ggml.nbytes(t), np.uint8)
        gb.backend_tensor_get(t, buf, 0, len(buf))
        h.update(name.encode())
        h.update(buf.tobytes())
    return h.hexdigest()


def _kv_rows(ctx, cells) -> list:
    """The K rows and (transposed) V columns of ``cells``, every layer: the K/V data that matters."""
    kv, cells = ctx.kv, np.asarray(sorted(cells), dtype=np.int64)
    out = []
    for k, v in zip(kv.k_l, kv.v_l):
        out.append(ggml.get_data(k).reshape(kv.size, -1)[cells].tobytes())
        out.append(ggml.get_data(v).reshape(-1, kv.size)[:, cells].tobytes())
    return out


def _state(ctx) -> dict:
    """Everything a failed call must leave as it was."""
    used = np.flatnonzero(ctx.kv.cells.pos >= 0)
    return dict(pos=ctx.kv.cells.pos.tobytes(), seq=[sorted(s) for s in ctx.kv.cells.seq],
                mask=ctx.kv.cells.seq_mask.tobytes(), used=ctx.kv.cells.used, head=ctx.kv.head,
                kv=_kv_rows(ctx, used), logits=ctx.logits.tobytes(), logits_shape=ctx.logits.shape,
                output_ids=dict(ctx.output_ids), n_outputs=ctx.n_outputs)


_FRESH: dict = {}


def _fresh_logits(model, history, nxt=NEXT, **kw) -> np.ndarray:
    """The logits of ``nxt`` after ``history`` in a fresh context made with ``kw``: computed once per model and
    arguments (several cases compare with the same one)."""
    key = (id(model), tuple(tuple(int(t) for t in toks) for toks in history), tuple(nxt), tuple(sorted(kw.items())))
    if key not in _FRESH:
        ctx = _ctx(model, **kw)
        for toks in history:
            assert llama.decode(ctx, llama.batch_get_one(toks)) == 0
        assert llama.decode(ctx, llama.batch_get_one(nxt)) == 0
        _FRESH[key] = (model, llama.get_logits(ctx).copy())      # the model kept: its id stays its own
    return _FRESH[key][1].copy()


def _batch(tokens, pos, seq_ids, logits=None):
    b = llama.LlamaBatch(n_tokens=len(tokens), token=np.asarray(tokens), pos=np.asarray(pos),
                         n_seq_id=np.array([len(s) for s in seq_ids], np.int32), seq_id=[list(s) for s in seq_ids],
                         logits=np.asarray(logits if logits is not None else [0] * (len(tokens) - 1) + [1], np.int8))
    return b


@pytest.fixture(scope="module")
def ref(model):
    """The logits of NEXT after PREFIX, from a fresh context."""
    return _fresh_logits(model, [PREFIX])


@pytest.fixture(scope="module")
def shared(model):
    """One context holding PREFIX; every case leaves it (and is checked to leave it) that way."""
    ctx = _ctx(model)
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    return ctx


def _next_valid_equals_fresh(ctx, ref):
    """The next valid decode gives the fresh context's logits bit for bit; then back to PREFIX."""
    before = _state(ctx)
    assert llama.decode(ctx, llama.batch_get_one(NEXT)) == 0
    got = llama.get_logits(ctx)
    assert got.shape == ref.shape and got.tobytes() == ref.tobytes()
    assert llama.memory_seq_rm(ctx, 0, len(PREFIX), -1)
    after = _state(ctx)
    for k in ("pos", "seq", "mask", "used", "kv"):
        assert after[k] == before[k], k


# ---------------------------------------------------------------------------------------------------------------
# invalid batches: llama_decode returns -1, logs llama.cpp's reason, touches nothing
# ---------------------------------------------------------------------------------------------------------------

def _one(token=4, pos=3, seq=(0,)):
    return _batch([token], [pos], [seq])


INVALID = {
    # llama_batch_allocr::init: "invalid token[%d] = %d"
    "token = n_vocab": (lambda: llama.batch_get_one([4, 49152]), "init: invalid token[1] = 49152"),
    "token = -1": (lambda: llama.batch_get_one([-1]), "init: invalid token[0] = -1"),
    "token int64 2**32 + 5 (not 5)": (lambda: llama.batch_get_one(np.array([2**32 + 5], np.int64)),
                                      "init: invalid token[0] = 4294967301"),
    "token uint64 2**63 + 1": (lambda: llama.batch_get_one(np.array([2**63 + 1], np.uint64)),
                               "init: invalid token[0] = 9223372036854775809"),
    "token Python int 2**70": (lambda: llama.batch_get_one([2**70]), f"init: invalid token[0] = {2**70}"),
    "token int64 2**32 + 5 in a batch": (lambda: _batch(np.array([2**32 + 5]), [3], [(0,)]),
                                         "init: invalid token[0] = 4294967301"),
    # "invalid seq_id[%d][%d] = %d >= %d" (printed with ">=" for negative ids too)
    "seq_id 7, n_seq_max 1": (lambda: _one(seq=(7,)), "init: invalid seq_id[0][0] = 7 >= 1"),
    "seq_id -3": (lambda: _one(seq=(-3,)), "init: invalid seq_id[0][0] = -3 >= 1"),
    "second seq_id 1": (lambda: _one(seq=(0, 1)), "init: invalid seq_id[0][1] = 1 >= 1"),
    # the memory-consistency checks ("Y = X + 1", continuity, order)
    "positions [3, 4, 1000, 6]": (lambda: _batch([4, 5, 6, 7], [3, 4, 1000, 6], [(0,)] * 4),
                                  "init: sequence 0 positions are not continuous"),
    "position 7 after 2": (lambda: _one(pos=7), (
        "init: the tokens of sequence 0 in the input batch have inconsistent sequence positions:\n"
        " - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 is X = 2\n"
        " - the tokens for sequence 0 in the input batch have a starting position of Y = 7\n"
        " it is required that the sequence positions remain consecutive: Y = X + 1")),
    "position 0 again": (lambda: _one(pos=0), None),     # the same message with Y = 0
    "positions [4, 3]": (lambda: _batch([4, 5], [4, 3], [(0,), (0,)]),
                         "init: sequence 0 positions are decreasing (not allowed)"),
    # ggviz is stricter: llama.cpp checks negative positions only with debug asserts (an empty cell has pos -1)
    "position -5": (lambda: _one(pos=-5), "init: invalid pos[0] = -5 (positions must be in [0, 2147483647])"),
    "position 2**31": (lambda: _batch([4], np.array([2**31], np.int64), [(0,)]),
                       "init: invalid pos[0] = 2147483648 (positions must be in [0, 2147483647])"),
    "n_seq_id 0": (lambda: llama.LlamaBatch(1, token=np.array([4]), pos=np.array([3]), n_seq_id=np.array([0]),
                                            seq_id=[[0]], logits=np.array([1])),
                   "init: invalid n_seq_id[0] = 0 (token 0 has 1 seq_id slots)"),
    # llama_context::decode
    "n_tokens 0": (lambda: llama.batch_get_one([]), "decode: n_tokens == 0"),
    "n_tokens > n_batch": (lambda: llama.batch_get_one(list(range(1, 301))),
                           "decode: n_tokens_all = 300 > n_batch = 256 (split the batch, or create the context with "
                           "a larger n_batch / n_ctx)"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_batch_returns_minus_one_and_touches_nothing(case, shared, ref, caplog):
    make, first_error = INVALID[case]
    if first_error is None:
        first_error = INVALID["position 7 after 2"][1].replace("Y = 7", "Y = 0")
    before = _state(shared)
    seen = []
    shared.graph_hook = seen.append
    try:
        with caplog.at_level("DEBUG", logger="ggviz.ggml"):
            rc = llama.decode(shared, make())
    finally:
        shared.graph_hook = None
    assert rc == -1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors[0] == first_error
    assert errors[-1] == "llama_decode: failed to decode, ret = -1"
    if first_error.startswith("init:"):
        assert errors[1:-1] == ["decode: failed to initialize batch"]
    assert not seen                          # nothing was built or computed
    assert _state(shared) == before
    _next_valid_equals_fresh(shared, ref)


MALFORMED = {
    # what C's types would not let through: raised, nothing touched
    "float tokens": (lambda: llama.LlamaBatch(1, token=np.array([4.0])), TypeError,
                     "llama_decode: batch.token must hold integers, not float64 (floats are not truncated)"),
    "bool tokens": (lambda: llama.LlamaBatch(1, token=np.array([True])), TypeError,
                    "llama_decode: batch.token must hold integers, not bool"),
    "float positions": (lambda: _batch([4], [3.0], [(0,)]), TypeError,
                        "llama_decode: batch.pos must hold integers, not float64 (floats are not truncated)"),
    "string seq_id": (lambda: _batch([4], [3], [("0",)]), TypeError,
                      "llama_decode: batch.seq_id[0][0] must be an integer, not str"),
    "tokens shorter than n_tokens": (lambda: llama.LlamaBatch(3, token=np.array([4, 5])), llama.DecodeError,
                                     "llama_decode: batch.token has 2 entries, n_tokens = 3"),
    "negative n_tokens": (lambda: llama.LlamaBatch(-2, token=np.array([4, 5])), llama.DecodeError,
                          "llama_batch_allocr::init: GGML_ASSERT(batch.n_tokens > 0) failed: n_tokens = -2"),
    "embeddings input": (lambda: llama.LlamaBatch(1, embd=np.zeros((1, 576), np.float32)), llama.DecodeError,
                         "llama_decode: embeddings input (batch.embd) is not supported by ggviz; pass tokens"),
    "n_tokens a float": (lambda: llama.LlamaBatch(1.0, token=np.array([4])), TypeError, None),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_batch_raises_and_touches_nothing(case, shared, ref):
    make, exc, msg = MALFORMED[case]
    before = _state(shared)
    with pytest.raises(exc) as ei:
        llama.decode(shared, make())
    if msg is not None:
        assert str(ei.value) == msg
    assert _state(shared) == before
    _next_valid_equals_fresh(shared, ref)


def test_batch_helpers_refuse_what_c_types_would_not_hold():
    with pytest.raises(TypeError, match="floats are not truncated"):
        llama.batch_get_one([4, 5.5])
    t = llama.batch_get_one(np.array([4, 5], np.int64)).token
    assert t.dtype == np.int32 and t.tolist() == [4, 5]
    t = llama.batch_get_one(np.array([2**32 + 5], np.int64)).token
    assert t.dtype == np.int64 and t.tolist() == [2**32 + 5]         # kept, for decode to refuse (not 5)
    b = llama.batch_init(2)
    with pytest.raises(TypeError):
        llama.batch_add(b, 4.7, 0, [0], True)
    with pytest.raises(OverflowError, match="token = 4294967301 does not fit"):
        llama.batch_add(b, np.int64(2**32 + 5), 0, [0], True)         # numpy would store 5
    with pytest.raises(TypeError):
        llama.batch_add(b, 4, 0, [0.0], True)
    assert b.n_tokens == 0
    llama.batch_add(b, 4, 0, [0], True)
    llama.batch_add(b, 5, 1, [0], True)
    with pytest.raises(IndexError, match="the batch is full"):
        llama.batch_add(b, 6, 2, [0], True)


def test_coupled_sequences_that_diverged_are_refused(model, caplog):
    ctx = _ctx(model, n_seq_max=2)
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0                 # sequence 0 at 0..2, 1 empty
    before = _state(ctx)
    with caplog.at_level("ERROR", logger="ggviz.ggml"):
        assert llama.decode(ctx, _batch([4], [3], [(0, 1)])) == -1
    assert caplog.messages[0] == "init: sequence 1 is coupled to 0 in the input batch, but have divereged"
    assert _state(ctx) == before
    # a valid multi-sequence batch: one token in both sequences, from empty memory
    ctx2 = _ctx(model, n_seq_max=2)
    assert llama.decode(ctx2, _batch([1, 2, 3], [0, 1, 2], [(0, 1)] * 3)) == 0
    assert [sorted(s) for s in ctx2.kv.cells.seq[:3]] == [[0, 1]] * 3
    assert llama.memory_seq_pos_max(ctx2, 1) == 2 and llama.memory_seq_pos_min(ctx2, 1) == 0
    # sequence 1 continues alone: the same logits as sequence 0 continuing in a fresh context
    assert llama.decode(ctx2, _batch(NEXT, [3], [(1,)])) == 0
    assert llama.get_logits(ctx2).tobytes() == _fresh_logits(model, [PREFIX]).tobytes()


# ---------------------------------------------------------------------------------------------------------------
# no KV slot: 1, nothing computed or stored
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_ubatch", [512, 64])
def test_batch_larger_than_the_free_cells_returns_1_and_stores_nothing(model, n_ubatch, caplog):
    """300 cells used of 512: 250 more do not fit. With n_ubatch 64, the first three ubatches would fit: llama.cpp
    (llama_kv_cache::prepare) finds the slots of every ubatch before the first is computed."""
    ctx = _ctx(model, n_ctx=512, n_ubatch=n_ubatch)
    hist = list(range(1, 301))
    assert llama.decode(ctx, llama.batch_get_one(hist)) == 0
    before = _state(ctx)
    seen = []
    ctx.graph_hook = seen.append
    with caplog.at_level("WARNING", logger="ggviz.ggml"):
        assert llama.decode(ctx, llama.batch_get_one(list(range(1, 251)))) == 1
    ctx.graph_hook = None
    assert caplog.messages == ["decode: failed to find a memory slot for batch of size 250"]
    assert not seen and _state(ctx) == before
    assert llama.decode(ctx, llama.batch_get_one(NEXT)) == 0
    assert llama.get_logits(ctx).tobytes() == _fresh_logits(model, [hist], n_ctx=512, n_ubatch=n_ubatch).tobytes()


def test_prepare_restores_cells_and_head(model):
    ctx = _ctx(model)
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    kv = ctx.kv
    before = _state(ctx)
    pos = np.arange(3, 3 + 200)
    slots = kv.prepare([(pos[:100], np.zeros(100, np.int64)), (pos[100:], np.zeros(100, np.int64))])
    assert [len(s) for s in slots] == [100, 100] and slots[0][0] == 3 and slots[1][0] == 103
    assert _state(ctx) == before
    assert kv.prepare([(np.arange(3, 300), np.zeros(297, np.int64))]) is None
    assert _state(ctx) == before


# ---------------------------------------------------------------------------------------------------------------
# failed, aborted, interrupted ubatches: everything as before the call
# ---------------------------------------------------------------------------------------------------------------

def _interrupted_case(model, setup, expect, n_ubatch=4, threads=1, arm_in_second=True):
    """PREFIX, then a 10-token batch (ubatches of 4, 4, 2) that ``setup(ctx)`` makes fail in its second ubatch;
    ``expect(call)`` runs the decode and checks its outcome. Then: state as before (the first ubatch was computed
    and stored before the failure: undone too), next decode == fresh.

    ``arm_in_second``: ``setup`` runs when the second ubatch's graph is ready (the graph hook, just before its
    compute) rather than before the decode. A callback makes ubatches take the node-by-node walk (the faithful
    kernels, in NumPy: about 10 s a ubatch); the first one has nothing to show there, it only has to be stored."""
    ctx = _ctx(model, n_ubatch=n_ubatch, threads=threads)
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    before = _state(ctx)
    computed, undo = [], []

    def hook(res):
        computed.append(res)
        if arm_in_second and len(computed) == 2:
            # the first ubatch is in the cache, and this one's cells are placed (apply_ubatch, before its compute)
            assert ctx.kv.cells.used == len(PREFIX) + 2 * n_ubatch
            undo.append(setup(ctx))
    if not arm_in_second:
        undo.append(setup(ctx))
    ctx.graph_hook = hook
    expect(lambda: llama.decode(ctx, llama.batch_get_one(list(range(10, 20)))))
    ctx.graph_hook = None
    assert len(undo) == 1
    undo[0]()
    assert len(computed) == 2           # two ubatches went to compute, no third: the failure came before
    assert _state(ctx) == before
    assert llama.decode(ctx, llama.batch_get_one(NEXT)) == 0
    assert llama.get_logits(ctx).tobytes() == _fresh_logits(model, [PREFIX], n_ubatch=n_ubatch).tobytes()
    return ctx


def _after_nodes(n):
    """A counter that says "now" once it has been called n times."""
    box = {"n": 0}

    def now():
        box["n"] += 1
        return box["n"] > n
    return now


def test_abort_callback_returns_2_and_rolls_back(model, caplog):
    def setup(ctx):
        now = _after_nodes(50)                    # armed in the second ubatch: aborted after its 50th node
        ctx.cparams.abort_callback = lambda data: now()

        def undo():
            ctx.cparams.abort_callback = None
        return undo

    def expect(call):
        with caplog.at_level("WARNING", logger="ggviz.ggml"):
            assert call() == 2
        assert caplog.messages[-4:] == [
            "graph_compute: ggml_backend_sched_graph_compute_async failed with error 1",
            "process_ubatch: failed to compute graph, compute status: 1",
            "decode: removing memory module entries for seq_id = 0, pos = [3, +inf)",
            "llama_decode: failed to decode, ret = 2"]
    _interrupted_case(model, setup, expect)


def test_cb_eval_returning_false_returns_2_and_rolls_back(model):
    def setup(ctx):
        now = _after_nodes(300)

        def cb(t, ask):
            return True if ask else not now()
        ctx.cparams.cb_eval = cb

        def undo():
            ctx.cparams.cb_eval = None
        return undo
    _interrupted_case(model, setup, lambda call: call() == 2 or pytest.fail("rc != 2"))


@pytest.mark.parametrize("exc", [ValueError("boom in cb_eval"), KeyboardInterrupt()])
def test_exception_from_cb_eval_propagates_and_rolls_back(model, exc):
    def setup(ctx):
        now = _after_nodes(200)

        def cb(t, ask):
            if not ask and now():
                raise exc
            return True
        ctx.cparams.cb_eval = cb

        def undo():
            ctx.cparams.cb_eval = None
        return undo

    def expect(call):
        with pytest.raises(type(exc)) as ei:
            call()
        assert ei.value is exc
    _interrupted_case(model, setup, expect)


@pytest.mark.parametrize("threads", [1, 2])
def test_keyboard_interrupt_inside_a_kernel_stays_an_interrupt(model, monkeypatch, threads):
    """A Ctrl-C that lands in a kernel: `except KeyboardInterrupt` catches it (not a GGMLError wrapping it), the
    decode is undone and the context (and its threads) keep working."""
    def setup(ctx):
        now = _after_nodes(threads * 3)                # soft_max calls (one per thread per layer): layer 3
        orig_dispatch = ggml_cpu._dispatch

        def dispatch():
            table, ops = orig_dispatch()
            table = dict(table)
            orig = table[C.GGML_OP_SOFT_MAX]

            def soft_max(params, dst):
                if now():
                    raise KeyboardInterrupt
                orig(params, dst)
            table[C.GGML_OP_SOFT_MAX] = soft_max
            return table, ops
        monkeypatch.setattr(ggml_cpu, "_dispatch", dispatch)
        ctx.cparams.abort_callback = lambda data: False      # the node-by-node walk (the compiled one never returns)

        def undo():
            monkeypatch.undo()
            ctx.cparams.abort_callback = None
        return undo

    def expect(call):
        with pytest.raises(KeyboardInterrupt):
            call()
    _interrupted_case(model, setup, expect, threads=threads)


def test_alloc_failure_returns_minus_2_and_rolls_back(model, monkeypatch, caplog):
    def setup(ctx):
        ctx.graph_reuse = False
        now = _after_nodes(2)                   # the third ubatch's graph cannot be allocated
        orig = gs.backend_sched_alloc_graph

        def alloc(sched, graph):
            return False if now() else orig(sched, graph)
        monkeypatch.setattr(gs, "backend_sched_alloc_graph", alloc)

        def undo():
            monkeypatch.undo()
            ctx.graph_reuse = True
        return undo

    def expect(call):
        with caplog.at_level("ERROR", logger="ggviz.ggml"):
            assert call() == -2
        assert caplog.messages[-1] == "llama_decode: failed to decode, ret = -2"
        assert caplog.messages[-2].startswith("process_ubatch: failed to allocate graph")
    _interrupted_case(model, setup, expect, arm_in_second=False)


def test_previous_outputs_survive_a_failed_decode(model):
    ctx = _ctx(model)
    b = llama.batch_init(3)
    for i, t in enumerate(PREFIX):
        llama.batch_add(b, t, i, [0], True)
    assert llama.decode(ctx, b) == 0
    rows = [llama.get_logits_ith(ctx, i).copy() for i in range(3)]
    ctx.cparams.abort_callback = lambda data: True
    assert llama.decode(ctx, llama.batch_get_one(NEXT)) == 2
    ctx.cparams.abort_callback = None
    assert ctx.n_outputs == 3 and [llama.get_logits_ith(ctx, i).tobytes() for i in range(3)] == \
        [r.tobytes() for r in rows]
    with pytest.raises(IndexError):
        llama.get_logits_ith(ctx, 3)
    with pytest.raises(TypeError):
        llama.get_logits_ith(ctx, 1.0)


# ---------------------------------------------------------------------------------------------------------------
# the threadpool: interrupts stay interrupts, the pool stays usable
# ---------------------------------------------------------------------------------------------------------------

def _graph():
    ctx = ggml.init(64 * 1024 * 1024)
    b = G.build_llama_block(ggml, ctx)
    G.fill_leaves(ggml, b["gf"], b["inputs"], seed=0)
    b["ctx"] = ctx
    return b


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("ith", [0, 2])
def test_interrupt_in_a_kernel_reaches_the_caller_unchanged(monkeypatch, exc, ith):
    b = _graph()
    ref = _compute(b, 1)[1]
    orig_dispatch = ggml_cpu._dispatch

    def dispatch():
        table, ops = orig_dispatch()
        table = dict(table)
        orig = table[C.GGML_OP_ADD]

        def add(params, dst):
            if params.ith == ith:
                raise exc("stop")
            orig(params, dst)
        table[C.GGML_OP_ADD] = add
        return table, ops
    tp = ggml.threadpool_new(4)
    try:
        monkeypatch.setattr(ggml_cpu, "_dispatch", dispatch)
        with pytest.raises(exc) as ei:
            _guarded(lambda: _compute(b, 4, tp))
        assert type(ei.value) is exc and str(ei.value) == "stop"
        monkeypatch.undo()
        st, out = _guarded(lambda: _compute(b, 4, tp))
        assert st == 0 and out.tobytes() == ref.tobytes()
    finally:
        ggml.threadpool_free(tp)


@pytest.mark.parametrize("disposable", [False, True])
def test_interrupt_between_kickoff_and_thread0_leaves_a_usable_pool(monkeypatch, disposable):
    """Ctrl-C after the workers were kicked off but before thread 0 joined the graph: they wait in a barrier for a
    thread that never comes. The next compute on the pool (or the disposable pool's free) lets them out."""
    b = _graph()
    ref = _compute(b, 1)[1]
    orig = tpm.run_thread0

    def run_thread0(tp):
        raise KeyboardInterrupt
    tp = None if disposable else ggml.threadpool_new(4)
    try:
        monkeypatch.setattr(tpm, "run_thread0", run_thread0)
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            _guarded(lambda: _compute(b, 4, tp))
        assert time.monotonic() - t0 < 10
        if tp is not None:
            assert not tp.settled
        monkeypatch.setattr(tpm, "run_thread0", orig)
        st, out = _guarded(lambda: _compute(b, 4, tp))
        assert st == 0 and out.tobytes() == ref.tobytes()
        if tp is not None:
            assert tp.settled
    finally:
        ggml.threadpool_free(tp)


# ---------------------------------------------------------------------------------------------------------------
# one context, two threads
# ---------------------------------------------------------------------------------------------------------------

def test_second_thread_gets_a_clear_error_and_leaks_nothing(model):
    ctx = _ctx(model)
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    inside, release = threading.Event(), threading.Event()

    def cb(t, ask):
        if not ask:
            inside.set()
            release.wait(30)
        return t.name == "result_output"
    ctx.cparams.cb_eval = cb
    box = {}
    a = threading.Thread(target=lambda: box.setdefault("rc", llama.decode(ctx, llama.batch_get_one(NEXT))))
    a.start()
    try:
        assert inside.wait(30)
        used = ctx.kv.cells.used                        # 4: PREFIX + A's token
        for call in (lambda: llama.decode(ctx, llama.batch_get_one([9])), lambda: llama.memory_clear(ctx),
                     lambda: llama.memory_seq_rm(ctx, 0, 0, -1)):
            with pytest.raises(llama.ContextBusyError, match="this llama context is already decoding in another "
                                                             "thread"):
                call()
        assert ctx.kv.cells.used == used
    finally:
        release.set()
        a.join(30)
    ctx.cparams.cb_eval = None
    assert box["rc"] == 0 and ctx.kv.cells.used == len(PREFIX) + 1
    assert llama.get_logits(ctx).tobytes() == _fresh_logits(model, [PREFIX]).tobytes()


def test_decode_from_its_own_callback_is_refused(model):
    ctx = _ctx(model)
    errors = []

    def cb(t, ask):
        if not ask and not errors:
            try:
                llama.decode(ctx, llama.batch_get_one([9]))
            except llama.ContextBusyError as e:
                errors.append(str(e))
        return t.name == "result_norm"
    ctx.cparams.cb_eval = cb
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    assert errors == ["llama_decode: this llama context is already decoding in this thread (called from its own "
                      "eval callback or graph hook); use one context per thread"]
    assert ctx.kv.cells.used == len(PREFIX)


# ---------------------------------------------------------------------------------------------------------------
# the memory API, the vocabulary
# ---------------------------------------------------------------------------------------------------------------

def test_memory_clear_zeroes_the_data_and_seq_rm_checks_the_sequence(model):
    ctx = _ctx(model)
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    assert any(np.any(ggml.get_data(k)) for k in ctx.kv.k_l)
    llama.memory_clear(ctx, False)                       # llama_kv_cache::clear(data = false): the bytes stay
    assert ctx.kv.cells.used == 0 and any(np.any(ggml.get_data(k)) for k in ctx.kv.k_l)
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    llama.memory_clear(ctx)                              # data = true: the buffers are cleared too
    assert ctx.kv.cells.used == 0 and ctx.kv.head == 0
    assert not any(np.any(ggml.get_data(t)) for t in ctx.kv.k_l + ctx.kv.v_l)
    with pytest.raises(ggml.GGMLError, match=r"seq_rm: GGML_ASSERT\(seq_id == -1 \|\| \(seq_id >= 0 && seq_id < "
                                             r"n_seq_max\)\) failed: seq_id = 7, n_seq_max = 1"):
        llama.memory_seq_rm(ctx, 7, 0, -1)
    with pytest.raises(ggml.GGMLError, match="seq_id = -2"):
        llama.memory_seq_rm(ctx, -2, 0, -1)
    with pytest.raises(ggml.GGMLError, match="seq_pos_max"):
        llama.memory_seq_pos_max(ctx, 1)
    assert llama.memory_seq_rm(ctx, -1, 0, -1) and llama.memory_seq_pos_max(ctx, 0) == -1


def test_vocab_accessors_are_bounds_checked(model):
    v = llama.model_get_vocab(model)
    n = llama.vocab_n_tokens(v)
    assert llama.vocab_get_text(v, n - 1) == v.tokens[-1]
    assert llama.vocab_get_text(v, np.int64(5)) == v.tokens[5]
    for bad in (-1, n, 2**32 + 5):
        with pytest.raises(IndexError, match=rf"llama_vocab_get_text: token id {bad} out of range \[0, {n}\)"):
            llama.vocab_get_text(v, bad)
        with pytest.raises(IndexError, match="out of range"):
            llama.token_to_piece(v, bad)
        with pytest.raises(IndexError, match="out of range"):
            llama.vocab_is_control(v, bad)
        assert llama.vocab_is_eog(v, bad) is False       # llama.cpp answers any id here
    with pytest.raises(TypeError, match="token id must be an integer, not float"):
        llama.vocab_get_text(v, 5.0)
    with pytest.raises(TypeError):
        llama.vocab_is_eog(v, 2.0)
    with pytest.raises(IndexError):
        llama.detokenize(v, [1, -1])


# ---------------------------------------------------------------------------------------------------------------
# sizes refused up front
# ---------------------------------------------------------------------------------------------------------------

def test_n_ctx_that_cannot_fit_is_refused_before_allocating(model, monkeypatch):
    def no_kv(*a, **k):
        raise AssertionError("the KV cache was allocated")
    monkeypatch.setattr(lctx, "KVCache", no_kv)
    t0 = time.monotonic()
    with pytest.raises(llama.ContextParamsError) as ei:
        _ctx(model, n_ctx=100_000_000)
    assert time.monotonic() - t0 < 2
    e = ei.value
    assert isinstance(e, ValueError) and e.param == "n_ctx" and e.value == 100_000_000
    assert e.fits is not None and e.fits % 256 == 0 and e.required > e.available
    assert str(e).startswith("llama_init_from_model: n_ctx = 100000000 needs ")
    assert str(e).endswith(f"of memory are available; the largest n_ctx that fits is {e.fits}")


def test_the_largest_n_ctx_that_fits_fits(model, monkeypatch):
    """With 400 MiB available, the n_ctx named fits (and is allocated for real), 256 more does not."""
    monkeypatch.setattr(lctx, "available_memory", lambda: 400 << 20)
    with pytest.raises(llama.ContextParamsError) as ei:
        _ctx(model, n_ctx=65536)
    fits = ei.value.fits
    hp = model.hparams

    def need(n):
        return lctx.context_memory_size(hp, n, min(n, 512))["total"]
    assert need(fits) <= 400 << 20 < need(fits + 256)
    ctx = _ctx(model, n_ctx=fits)
    assert ctx.n_ctx == fits and llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    monkeypatch.setattr(lctx, "available_memory", lambda: 1 << 20)
    with pytest.raises(llama.ContextParamsError, match="not even n_ctx = 256 fits") as ei:
        _ctx(model, n_ctx=256)
    assert ei.value.fits is None


@pytest.mark.parametrize("where", ["kv", "reserve"])
def test_an_allocation_that_fails_anyway_is_the_same_error(model, monkeypatch, where):
    """The estimate passed but the memory went meanwhile: the same ContextParamsError, with a smaller n_ctx."""
    if where == "kv":
        def fail(*a, **k):
            raise MemoryError("Unable to allocate 94.0 MiB")
        monkeypatch.setattr(lctx, "KVCache", fail)
    else:
        def fail(self):
            raise llama.DecodeError("llama_context::graph_reserve: failed to allocate compute buffers")
        monkeypatch.setattr(lctx.LlamaContext, "sched_reserve", fail)
    with pytest.raises(llama.ContextParamsError) as ei:
        _ctx(model, n_ctx=4096)
    e = ei.value
    what = "the KV cache" if where == "kv" else "the compute buffers"
    assert "n_ctx = 4096 needs " in str(e) and f"but {what} could not be allocated (" in str(e)
    assert e.param == "n_ctx" and e.fits is not None and e.fits < 4096 and isinstance(e.__cause__,
                                                                                     (MemoryError, llama.DecodeError))


@pytest.mark.parametrize("n_ctx,n_ubatch", [(256, 512), (512, 512), (2048, 512), (4096, 64), (8192, 512)])
def test_memory_estimate_bounds_what_the_context_allocates(model, n_ctx, n_ubatch):
    """The oracle is the context itself: the KV buffer it allocates (exactly) and the compute buffers its reserve
    allocates (the estimate is above, and within 20 %)."""
    ctx = _ctx(model, n_ctx=n_ctx, n_ubatch=n_ubatch)
    est = lctx.context_memory_size(model.hparams, n_ctx, min(n_ctx, n_ubatch))
    assert est["kv"] == sum(gb.backend_buffer_get_size(b) for b in ctx.kv.bufs)
    real = sum(ctx.backend_buf_exp_size)
    assert real <= est["compute"] <= 1.2 * real


@pytest.mark.parametrize("field,value,exc,msg", [
    ("n_threads", 0, llama.ContextParamsError, "n_threads = 0: the CPU backend takes 1 to 512 threads"),
    ("n_threads", -4, llama.ContextParamsError, "n_threads = -4: the CPU backend takes 1 to 512 threads"),
    ("n_threads_batch", 1000, llama.ContextParamsError, "n_threads_batch = 1000: the CPU backend takes 1 to 512"),
    ("n_threads", 2.5, TypeError, "n_threads must be an integer, not float"),
    ("n_ctx", -1, llama.ContextParamsError, "llama_init_from_model: n_ctx = -1 must be >= 0"),
    ("n_ctx", 512.0, TypeError, "llama_context_params.n_ctx must be an integer, not float"),
    ("n_batch", 0, llama.ContextParamsError, "llama_init_from_model: n_batch = 0 must be >= 1"),
    ("n_seq_max", 257, llama.ContextParamsError, "llama_init_from_model: n_seq_max must be <= 256, got 257"),
])
def test_bad_context_params_are_refused(model, monkeypatch, field, value, exc, msg):
    monkeypatch.setattr(lctx, "KVCache", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(exc) as ei:
        _ctx(model, **{field: value})
    assert str(ei.value).startswith(msg)
    if exc is llama.ContextParamsError:
        assert ei.value.param == field and ei.value.value == value


def test_set_n_threads_is_checked(model, caplog):
    ctx = _ctx(model)
    with pytest.raises(llama.ContextParamsError):
        llama.set_n_threads(ctx, 0, 1)
    assert ctx.cparams.n_threads == 1 and ctx.cparams.n_threads_batch == 1
    with caplog.at_level("WARNING", logger="ggviz.ggml"):
        llama.set_n_threads(ctx, 512, 2)
    assert any("n_threads = 512 >" in m for m in caplog.messages)
    assert ctx.cparams.n_threads == 512


# ---------------------------------------------------------------------------------------------------------------
# fuzz: random batches
# ---------------------------------------------------------------------------------------------------------------

def _random_batch(rng, ctx, n_vocab, n_seq_max):
    """A random batch: mostly plausible (continuing a sequence), often not (any position, any seq_id, token ids
    out of range, of odd dtypes, floats)."""
    n = int(rng.choice([0, 1, 1, 2, 3, 5, 8, 17, 40, 64]))
    kind = rng.random()
    toks = rng.integers(0, n_vocab, n)
    if kind < 0.1:
        toks[rng.integers(0, max(n, 1)) % max(n, 1):] += n_vocab * int(rng.choice([1, -1]))
    dtype = rng.choice(["int32", "int64", "uint16", "uint64", "object", "float32", "int8"])
    if dtype == "float32" and rng.random() < 0.5:
        dtype = "int32"
    if dtype == "object":
        tok_arr = np.array([int(t) + (2**70 if rng.random() < 0.1 else 0) for t in toks], dtype=object)
    elif dtype == "uint16":
        tok_arr = (toks % 2**16).astype(np.uint16)
    elif dtype == "int8":
        tok_arr = (toks % 100).astype(np.int8)
    else:
        tok_arr = toks.astype(dtype)
    if rng.random() < 0.3:
        # batch_get_one style; now and then n_tokens says more than there are
        return llama.LlamaBatch(n_tokens=n + (2 if rng.random() < 0.1 else 0), token=tok_arr)
    seqs = []
    for _ in range(n):
        k = 1 if rng.random() < 0.85 else 2
        ids = rng.integers(0, n_seq_max, k) if rng.random() < 0.9 else rng.integers(-2, n_seq_max + 3, k)
        seqs.append([int(x) for x in ids])
    s0 = seqs[0][0] if n and 0 <= seqs[0][0] < n_seq_max else 0
    start = ctx.kv.cells.seq_pos_max(s0) + 1
    mode = rng.random()
    if mode < 0.6:
        pos = start + np.arange(n)
    elif mode < 0.8:
        pos = start + rng.permutation(n) if n else np.arange(0)
    else:
        pos = rng.integers(-3, start + 10, n)
    pos_dtype = rng.choice(["int32", "int64", "float64"], p=[0.6, 0.35, 0.05])
    return llama.LlamaBatch(n_tokens=n, token=tok_arr, pos=pos.astype(pos_dtype),
                            n_seq_id=np.array([len(s) for s in seqs], np.int32), seq_id=seqs,
                            logits=(rng.random(n) < 0.3).astype(np.int8))


def test_fuzz_random_batches(model):
    """100 random batches into a 4-sequence context (seeded): each returns 0, -1 or 1, or raises TypeError /
    DecodeError; a call that does not return 0 changes nothing; one that does changes only the cells of the
    sequences it names, and its logits are finite. The weights never change, and afterwards the context still
    gives a fresh context's logits."""
    rng = np.random.default_rng(1234)
    n_seq_max = 4
    ctx = _ctx(model, n_seq_max=n_seq_max, n_ubatch=16)
    n_vocab = model.hparams.n_vocab
    w0 = _weights_digest(model)
    counts = {}
    n_full = 0
    t_end = time.monotonic() + 120
    for it in range(100):
        assert time.monotonic() < t_end, "the fuzz run is too slow (a hang?)"
        if counts.get(1, 0) > n_full:            # the cache was full: start again (keeping the bytes, or not)
            n_full = counts[1]
            llama.memory_clear(ctx, bool(it % 2))
        b = _random_batch(rng, ctx, n_vocab, n_seq_max)
        before = _state(ctx)
        cells_of = {s: np.flatnonzero(ctx.kv.cells.seq_mask[s]) for s in range(n_seq_max)}
        try:
            rc = llama.decode(ctx, b)
        except (TypeError, llama.DecodeError) as e:
            rc = type(e).__name__
        counts[rc] = counts.get(rc, 0) + 1
        if rc != 0:
            assert rc in (-1, 1, "TypeError", "DecodeError"), rc
            assert _state(ctx) == before, f"iteration {it}: state changed by a call that returned {rc}"
            continue
        assert np.isfinite(ctx.logits).all()
        named = {int(s) for row in b.seq_id[:b.n_tokens] for s in row} if b.seq_id is not None else {0}
        for s in range(n_seq_max):
            if s in named:
                continue
            c = cells_of[s]
            assert np.array_equal(np.flatnonzero(ctx.kv.cells.seq_mask[s]), c), f"iteration {it}: seq {s} moved"
            if not len(c):
                continue
            assert _kv_rows(ctx, c) == [r for r in _kv_rows_before(before, ctx, c)], f"iteration {it}: seq {s} data"
    assert counts.get(0, 0) >= 20 and counts.get(-1, 0) >= 20 and counts.keys() >= {1, "TypeError", "DecodeError"}, \
        counts
    assert _weights_digest(model) == w0
    llama.memory_clear(ctx)
    assert llama.decode(ctx, llama.batch_get_one(PREFIX)) == 0
    assert llama.decode(ctx, llama.batch_get_one(NEXT)) == 0
    assert llama.get_logits(ctx).tobytes() == _fresh_logits(model, [PREFIX], n_seq_max=n_seq_max,
                                                            n_ubatch=16).tobytes()


def _kv_rows_before(before, ctx, cells):
    """The K/V rows of ``cells`` as they were in ``before`` (which holds the rows of every used cell, in order)."""
    used = np.frombuffer(before["pos"], dtype=np.int64)
    used = np.flatnonzero(used >= 0)
    where = np.searchsorted(used, cells)
    out = []
    for layer_k, layer_v in zip(before["kv"][0::2], before["kv"][1::2]):
        k = np.frombuffer(layer_k, dtype=np.float16).reshape(len(used), -1)
        v = np.frombuffer(layer_v, dtype=np.float16).reshape(-1, len(used))
        out.append(k[where].tobytes())
        out.append(v[:, where].tobytes())
    return out
