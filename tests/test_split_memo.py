"""The scheduler's split memo moved to other pins (ggviz/ggml/sched.py: _split_memo_move) and inherited by a copied
graph (split_memo_copy, llama/graph_copy.py), against the real passes.

* Oracle: the same split of the same graph from the same starting tables with ggml's passes 1-5 (the memo turned
  off): the hash set (used bits, the keys of the used slots), ``_slot`` (slots and insertion order), every backend
  id and cause, the splits, the graph copy's node / leaf backend ids and ``last_plan`` (made). Every split of a
  first context (the probe, the pp reserve -- the copy of the probe's graph --, the tg reserve, the pp reserve
  again) and of its first prompt (4 tokens, 31, 32: pinned below 32 tokens, not at 32) and step: SmolLM2 and
  Gemma-3, flash attention on and off; the memo paths are taken where they should be (counters).
* A forced hash collision (an arena placed so that a node's home slot is a weight's): inserted one by one, in the
  passes' order, the same slots as the passes; and the first-context cases with the at-once placement turned off.
* Small graphs on one backend: pins added, removed, swapped.
* Outside the conditions the passes run: two backends, no node assigned in pass 1, a pin on a leaf.
"""
from __future__ import annotations


import numpy as np
import pytest

from ggviz import ggml as gg
from ggviz import llama
from ggviz.ggml import alloc as A
from ggviz.ggml import backend as B
from ggviz.ggml import blas
from ggviz.ggml import sched as S
from ggviz.ggml.cpu import cpu_backend
from ggviz.llama.context_pool import context_pool_clear
from tests.models import load_model as _model


def _state(sched, graph) -> dict:
    """Everything a split leaves in the scheduler (the tables by slot, the splits, the ids, the plan)."""
    hs = sched.hash_set
    u = S._used_slots(hs, hs.used)
    g = sched.graph
    return dict(
        used=hs.used.tolist(), keys=hs.keys[u].tolist(), slot=list(sched._slot.items()),
        tbid=list(sched.hv_tensor_backend_ids), causes=dict(sched.causes),
        copies=[c is None for c in sched.hv_tensor_copies],
        splits=[(s.backend_id, s.i_start, s.i_end, [t.addr for t in s.inputs]) for s in sched.splits[:sched.n_splits]],
        n_splits=sched.n_splits, nodes=[t.addr for t in g.nodes], leafs=[t.addr for t in g.leafs],
        node_ids=sched.node_backend_ids[:g.n_nodes].tolist(), leaf_ids=sched.leaf_backend_ids[:g.n_leafs].tolist(),
        plan=sched.last_plan)


def _put_tables(sched, t) -> None:
    """The tables ``t`` (S._tables) put back in place."""
    used, keys, slot, tbid, causes, copies = t
    hs = sched.hash_set
    hs.used[...] = used
    hs.keys[...] = keys
    sched._slot.clear()
    sched._slot.update(slot)
    sched.hv_tensor_backend_ids[:] = tbid
    sched.causes.clear()
    sched.causes.update(causes)
    sched.hv_tensor_copies[:] = copies


@pytest.fixture
def checked(monkeypatch):
    """Every split made twice from the same tables: as it runs (memo paths), then with the passes; records
    (memo hits, moved hits, state equal, the split's pins). The scheduler is left as one split leaves it."""
    rec = []
    real = S.backend_sched_split_graph

    def split(sched, graph):
        pre = S._tables(sched)
        n_pins = sum(c == "usr" for c in sched.causes.values())
        ids = [getattr(sched, f)[:] for f in ("node_backend_ids", "leaf_backend_ids",
                                               "prev_node_backend_ids", "prev_leaf_backend_ids")]
        n0, m0 = sched.n_split_memo, sched.n_split_memo_moved
        real(sched, graph)
        took = (sched.n_split_memo - n0, sched.n_split_memo_moved - m0)
        got = _state(sched, graph)
        after = [getattr(sched, f) for f in ("node_backend_ids", "leaf_backend_ids",
                                              "prev_node_backend_ids", "prev_leaf_backend_ids")]
        after_ids = [a[:] for a in after]
        memos = getattr(graph, "_ggviz_split_memo", None)
        # the passes, from the same tables and backend id arrays
        _put_tables(sched, pre)
        for f, a in zip(("node_backend_ids", "leaf_backend_ids", "prev_node_backend_ids", "prev_leaf_backend_ids"),
                        ids):
            getattr(sched, f)[:] = a
        with monkeypatch.context() as m:
            m.setattr(S, "_split_memo_match", lambda sched, graph: None)
            real(sched, graph)
        want = _state(sched, graph)
        # (the arrays as the one split left them; the memos as the first split left them)
        for f, a, v in zip(("node_backend_ids", "leaf_backend_ids", "prev_node_backend_ids", "prev_leaf_backend_ids"),
                           after, after_ids):
            a[:] = v
            setattr(sched, f, a)
        graph._ggviz_split_memo = memos
        diff = [k for k in want if got[k] != want[k]]
        rec.append(dict(took=took, diff=diff, n_pins=n_pins, n_nodes=graph.n_nodes))

    monkeypatch.setattr(S, "backend_sched_split_graph", split)
    return rec


def _first_context(model, fa, n_prompt):
    """A first context of the model (the pool cleared), its first prompt of ``n_prompt`` tokens and a step."""
    context_pool_clear(model)
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
    cp.n_threads = cp.n_threads_batch = 1
    cp.flash_attn_type = fa
    ctx = llama.init_from_model(model, cp)
    toks = [(17 * i + 5) % 1000 + 10 for i in range(n_prompt)]
    assert llama.decode(ctx, llama.batch_get_one(toks)) == 0
    assert llama.decode(ctx, llama.batch_get_one([42])) == 0
    logits = llama.get_logits_ith(ctx, -1).copy()
    llama.free(ctx)
    context_pool_clear(model)
    return logits


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
@pytest.mark.parametrize("fa", [-1, 0], ids=["flash_attn", "no_flash_attn"])
@pytest.mark.parametrize("at_once", [True, False], ids=["placed", "inserted"])
def test_first_context_splits_equal_the_passes(which, fa, at_once, checked, monkeypatch):
    """Each split of a first context and of its first prompt and step, through the memo paths, equals the passes'
    split of the same graph from the same tables. The probe (1 token, pinned norms) runs the passes; the pp reserve
    (its graph a copy of the probe's, no pins) and the pp reserve again take the probe's memo moved to the copy and
    unpinned; the tg reserve (the probe's graph and pins again) the probe's memo as it is; the first prompt (the pp
    graph derived, pinned below 32 tokens, not at 32) the moved memo too."""
    monkeypatch.setattr(S, "PLACE_AT_ONCE", at_once)
    model = _model(which)
    for n_prompt in (4, 31, 32):
        checked.clear()
        _first_context(model, fa, n_prompt)
        assert [r["diff"] for r in checked] == [[]] * len(checked), checked
        took = [r["took"] for r in checked]
        pinned = [r["n_pins"] > 0 for r in checked]
        # probe, pp reserve, tg reserve, pp reserve, the prompt, the step
        assert len(took) >= 5, took
        if fa == -1:
            assert pinned[:4] == [True, False, True, False], pinned
            assert took[:4] == [(0, 0), (1, 1), (1, 0), (1, 1)], took
        else:
            # (no probe: the pp graph is built and split, the tg graph is its copy, pinned)
            assert pinned[:3] == [False, True, False], pinned
            assert took[:3] == [(0, 0), (1, 1), (1, 0)], took
        prompt = 4 if fa == -1 else 3
        assert pinned[prompt] == (n_prompt < 32)
        # (at 32 tokens without the probe the pp graph's own memo, unpinned, serves as it is)
        assert took[prompt] == ((1, 0) if n_prompt == 32 and fa == 0 else (1, 1)), took


def _cpu():
    b = cpu_backend.backend_cpu_init()
    cpu_backend.backend_cpu_set_n_threads(b, 1)
    return b


def _mini_graph(n_extra=0, weight=True, second=True, w=None, mem_buffer=None):
    """x (input) -> rms_norm ("norm": plain, a pin's place) -> mul by a weight (pass 1: "1.wgt1") -> add x ->
    (``second``) mul by the weight again -> ``n_extra`` more adds; the weight in a WEIGHTS buffer (``weight``
    False: x instead, no node is assigned in pass 1)."""
    wctx = buf = None
    if w is None:
        wctx = gg.init(1 << 16, no_alloc=True)
        w = gg.new_tensor_1d(wctx, gg.GGML_TYPE_F32, 8)
        buf = A.backend_alloc_ctx_tensors_from_buft(wctx, cpu_backend.backend_cpu_buffer_type())
        B.backend_buffer_set_usage(buf, B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    ctx = gg.init(1 << 20, mem_buffer=mem_buffer, no_alloc=True)
    x = gg.new_tensor_2d(ctx, gg.GGML_TYPE_F32, 8, 4)
    gg.set_input(x)
    norm = gg.rms_norm(ctx, x, 1e-5)
    y = gg.mul(ctx, norm, w) if weight else gg.mul(ctx, norm, x)
    z = gg.add(ctx, y, x)
    if second:
        z = gg.mul(ctx, z, w if weight else x)
    for _ in range(n_extra):
        z = gg.add(ctx, z, x)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, z)
    return dict(ctx=ctx, wctx=wctx, buf=buf, gf=gf, x=x, norm=norm, y=y, z=z, w=w)


def _split_twice(sched, gf, pins_a, pins_b, backend, monkeypatch):
    """Split with pins ``pins_a`` (records the memo), then with ``pins_b``: the second split's state and memo
    counters, and the passes' state for the second split."""
    def split(pins):
        S.backend_sched_reset(sched)
        for t in pins:
            S.backend_sched_set_tensor_backend(sched, t, backend)
        n0, m0 = sched.n_split_memo, sched.n_split_memo_moved
        S.backend_sched_split_graph(sched, gf)
        return _state(sched, gf), (sched.n_split_memo - n0, sched.n_split_memo_moved - m0)

    split(pins_a)
    got, took = split(pins_b)
    memos = gf._ggviz_split_memo
    with monkeypatch.context() as m:
        m.setattr(S, "_split_memo_match", lambda sched, graph: None)
        want, _ = split(pins_b)
    gf._ggviz_split_memo = memos
    return got, want, took


def test_pins_added_and_removed_on_one_backend(monkeypatch):
    """A small graph: its memo without pins serves a split with the norm pinned (or a weight's MUL), and one with
    the norm pinned serves a split without -- the passes' own result, slot for slot."""
    g = _mini_graph()
    cpu = _cpu()
    sched = S.backend_sched_new([cpu], None, 1, 64, False, True)
    for a, b in (([], [g["norm"]]), ([g["norm"]], []), ([], [g["y"]]), ([g["norm"]], [g["y"], g["norm"]])):
        g["gf"]._ggviz_split_memo = None
        got, want, took = _split_twice(sched, g["gf"], a, b, cpu, monkeypatch)
        assert took == (1, 1)
        assert got == want
        causes = {sched._slot[t.addr]: c for t, c in ((g["norm"], "usr" if g["norm"] in b else "2.sup"),
                                                      (g["y"], "usr" if g["y"] in b else "1.wgt1"))}
        assert {i: sched.causes[i] for i in causes} == causes


def test_colliding_home_slots_are_inserted_in_the_passes_order(monkeypatch):
    """A hash size where two of the tensors the moved memo inserts share a home slot (so they cannot be placed at
    once): inserted one by one, in the passes' order -- the passes' slots."""
    g0 = _mini_graph(n_extra=24)
    cpu = _cpu()
    graph_size = 64
    size = S.hash_set_new(graph_size).size
    # an arena where the last node's home slot is the weight's (as tests/test_graph_copy.py places a copy): the
    # weight (a leaf) is inserted first, the node moves on
    w, z_offs = g0["w"], g0["z"].addr - g0["ctx"].base
    big = np.zeros((1 << 20) + 16 * (size + 1), np.uint8)
    o = (-big.ctypes.data) % 16
    o += 16 * ((((w.addr >> 4) - ((big.ctypes.data + o + z_offs) >> 4)) % size))
    g = _mini_graph(n_extra=24, w=w, mem_buffer=big[o:o + (1 << 20)])
    assert (g["z"].addr >> 4) % size == (w.addr >> 4) % size
    sched = S.backend_sched_new([cpu], None, 1, graph_size, False, True)
    seen = []
    real = S._insert_in_order

    def spy(sched, addrs, home=None):
        hs = sched.hash_set
        seen.append(len({(a >> 4) % hs.size for a in addrs}) < len(addrs))
        return real(sched, addrs, home)

    monkeypatch.setattr(S, "_insert_in_order", spy)
    got, want, took = _split_twice(sched, g["gf"], [], [g["norm"]], cpu, monkeypatch)
    assert took == (1, 1) and seen == [True]
    assert got == want


def test_outside_the_conditions_the_passes_run(monkeypatch):
    """Two backends (BLAS + CPU), a graph with no node assigned in pass 1 (no weight), a pin on a leaf: the
    passes run (no memo hit) and give what they give."""
    cpu = _cpu()
    # no node assigned in pass 1: the pin could change who expands first
    g = _mini_graph(weight=False)
    sched = S.backend_sched_new([cpu], None, 1, 64, False, True)
    got, want, took = _split_twice(sched, g["gf"], [], [g["norm"]], cpu, monkeypatch)
    assert took == (0, 0) and got == want
    # the only node assigned in pass 1 pinned: no anchor left (nothing assigned when 2.3 starts but the pin)
    g = _mini_graph(second=False)
    sched = S.backend_sched_new([cpu], None, 1, 64, False, True)
    got, want, took = _split_twice(sched, g["gf"], [], [g["y"]], cpu, monkeypatch)
    assert took == (0, 0) and got == want
    # a pin on a leaf (the input)
    g = _mini_graph()
    sched = S.backend_sched_new([cpu], None, 1, 64, False, True)
    got, want, took = _split_twice(sched, g["gf"], [], [g["x"]], cpu, monkeypatch)
    assert took == (0, 0) and got == want
    # two backends, pins to either
    g = _mini_graph()
    bl = blas.backend_blas_init()
    sched = S.backend_sched_new([bl, cpu], None, 2, 64, False, True)
    for backend in (bl, cpu):
        g["gf"]._ggviz_split_memo = None
        got, want, took = _split_twice(sched, g["gf"], [], [g["norm"]], backend, monkeypatch)
        assert took == (0, 0) and got == want
    # the same graph split again with the same pins on two backends: the memo as it is (the exact path)
    g["gf"]._ggviz_split_memo = None
    got, want, took = _split_twice(sched, g["gf"], [g["norm"]], [g["norm"]], cpu, monkeypatch)
    assert took == (1, 0) and got == want
