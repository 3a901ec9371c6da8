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
* The answers asked again after a reshape (the device's supports_op_reads): for every leaf and node of the first
  contexts' graphs, an answer said to read no shape is the same with the shapes scrambled and at every shape split
  (oracle: supports_op itself); an OUT_PROD whose answer reads its sources' ne[2] is asked again and, mismatched,
  turns the memo down.
* _insert_in_order's linear probing over a byte per slot against ggml_hash_find_or_insert one key after the other
  (collisions, used slots, across the table's end; a full set).
"""
from __future__ import annotations

import sys

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
        if sys._getframe(1).f_code.co_name == "_split_memo_move":      # (pass 1's _hash_ids inserts this way too)
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


# ---- which recorded answers are asked again (ggml_backend_device_i.supports_op_reads)

_SCRAMBLED = np.array([3, 5, 7, 11, 1, 2, 4, 8], np.uint64)      # ne[4], nb[4] no tensor here has


def _answer_scrambled(dev, t, others) -> bool:
    """supports_op's answer for ``t`` with the shapes (ne/nb: struct words 2..9) of ``t`` and ``others``
    replaced by nonsense, put back after."""
    saved = [(u, u._q[2:10].copy()) for u in [t] + others]
    try:
        for u, _ in saved:
            u._q[2:10] = _SCRAMBLED
        return bool(dev.iface.supports_op(dev, t))
    finally:
        for u, w in saved:
            u._q[2:10] = w


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
@pytest.mark.parametrize("fa", [-1, 0], ids=["flash_attn", "no_flash_attn"])
def test_answers_that_read_no_shape_hold_at_every_shape(which, fa, monkeypatch):
    """Every leaf and node of every graph a first context splits (the probe's and tg's 1 token, the pp reserve's
    512, prompts of 4 and 32 tokens derived from it, a step): the CPU device's supports_op_reads gives
    supports_op's answer; where it says the answer read no shape, that answer is the same with the shapes of the
    op, its sources and its view source scrambled, and the same at every shape the graph was split at; where it
    names tensors, they are the op's sources."""
    model = _model(which)
    answers: dict = {}
    shapes: dict = {}
    named = []
    real = S.backend_sched_split_graph

    def split(sched, graph):
        dev = sched.backends[-1].device
        for kind, ts in (("leaf", graph.leafs), ("node", graph.nodes)):
            for i, t in enumerate(ts):
                r, reads = cpu_backend._cpu_dev_supports_op_reads(dev, t)
                assert r == bool(dev.iface.supports_op(dev, t))
                srcs = [s for s in t.src if s is not None] + ([t.view_src] if t.view_src is not None else [])
                key = (kind, len(ts), i, t.name, t.op)
                if reads == ():
                    assert _answer_scrambled(dev, t, srcs) == r, (t.name, t.op)
                    answers.setdefault(key, set()).add(r)
                    shapes.setdefault(key, set()).add(tuple(t.ne.tolist()))
                else:
                    assert reads is not None and set(reads) <= {s.addr for s in srcs}, (t.name, reads)
                    named.append((t.op, len(reads)))
        return real(sched, graph)

    monkeypatch.setattr(S, "backend_sched_split_graph", split)
    for n_prompt in (4, 32):
        _first_context(model, fa, n_prompt)
    assert all(len(v) == 1 for v in answers.values())
    # (the graphs were split at several shapes: most nodes were seen at 1, 4, 32 and 512 tokens)
    assert sum(len(v) >= 3 for v in shapes.values()) > 200
    # (what names a shape here: the MUL_MATs of repacked weights -- their weight, outside the graph's arena)
    assert named and all(op == gg.GGML_OP_MUL_MAT and n == 1 for op, n in named), set(named)


def test_an_answer_that_reads_a_shape_is_asked_again(monkeypatch):
    """OUT_PROD of an F16 src0: the CPU supports it when src0 and src1 agree in ne[2] and ne[3]. Its memo names
    both sources; reshaped with ne[2] still agreeing the answer is asked again and the memo serves, with src0's
    ne[2] no longer matching it is asked again, no, and the memo does not serve; a node whose answer reads no
    shape (the ADD after it) is not asked again."""
    cpu = _cpu()
    ctx = gg.init(1 << 20, no_alloc=True)
    a = gg.new_tensor_3d(ctx, gg.GGML_TYPE_F16, 4, 3, 2)
    b = gg.new_tensor_3d(ctx, gg.GGML_TYPE_F32, 5, 3, 2)
    gg.set_input(a)
    gg.set_input(b)
    p = gg.out_prod(ctx, a, b)
    z = gg.add(ctx, p, p)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, z)
    sched = S.backend_sched_new([cpu], None, 1, 64, False, True)
    S.backend_sched_split_graph(sched, gf)
    (m,) = gf._ggviz_split_memo
    reads = {q[0]: q[4] for q in m.queries}
    assert reads[p.addr] == (a.addr, b.addr) and reads[z.addr] == ()
    asked = []
    dev = cpu.device
    real = dev.iface.supports_op
    monkeypatch.setattr(dev.iface, "supports_op", lambda d, t: asked.append(t.addr) or real(d, t))

    def reshape(t, ne2):
        t._q[4] = ne2                                   # ne[2]
        t._q[9] = int(t._q[8]) * ne2                    # nb[3]

    def match():
        S.backend_sched_reset(sched)
        asked.clear()
        return S._split_memo_match(sched, gf)

    # ne[2] 2 -> 4 in both sources (and the result): asked again about the OUT_PROD only, still yes
    for t in (a, b, p, z):
        reshape(t, 4)
    assert match() == (m, None) and asked == [p.addr]
    # src0's ne[2] 4 -> 1 (src1 keeps 4: out_prod broadcasts): asked again, no -- the memo does not serve
    reshape(a, 1)
    assert bool(real(dev, p)) is False
    assert match() is None and asked == [p.addr]
    # without the device saying what it read, every answer about a reshaped tensor or a reader of one is asked
    reshape(a, 4)
    m.reads = None
    m.queries = [q[:4] + (None,) for q in m.queries]
    for t in (a, b, p, z):
        reshape(t, 2)
    assert match() == (m, None) and set(asked) == {p.addr, z.addr}


def test_keys_inserted_in_order_as_find_or_insert_does(monkeypatch):
    """_insert_in_order (pass 1's _hash_ids, the moved memo) against ggml_hash_find_or_insert one key after the
    other: keys whose home slots collide with each other, with used slots and across the table's end, land where
    the one-by-one insertion puts them; a set too small raises and is left as it was."""
    cpu = _cpu()
    rng = np.random.default_rng(7)

    def tables(at_once, pre, addrs):
        monkeypatch.setattr(S, "PLACE_AT_ONCE", at_once)
        sched = S.backend_sched_new([cpu], None, 1, 64, False, True)
        size = sched.hash_set.size
        for a in pre:
            sched._slot[a] = sched.hash_set.find_or_insert(a)
        pos = S._insert_in_order(sched, list(addrs))
        hs = sched.hash_set
        u = S._used_slots(hs, hs.used)
        return size, (pos, hs.used.tolist(), hs.keys[u].tolist(), list(sched._slot.items()))

    size, _ = tables(False, [], [])
    for trial in range(20):
        homes = rng.integers(0, size, 40)
        homes[:6] = [size - 1, size - 1, size - 2, 0, 0, 1]            # (a cluster across the end)
        keys = [(int(h) + size * k) << 4 for k, h in enumerate(homes.tolist(), 1)]
        pre = [(int(h) + size * 1000 * (k + 1)) << 4 for k, h in enumerate(rng.integers(0, size, 20).tolist())]
        pre += [(size - 1 + size * 5000) << 4]
        keys = [k for k in dict.fromkeys(keys) if k not in pre]
        _, want = tables(False, pre, keys)
        _, got = tables(True, pre, keys)
        assert got == want, trial
    # more keys than free slots: GGMLError, nothing inserted
    monkeypatch.setattr(S, "PLACE_AT_ONCE", True)
    sched = S.backend_sched_new([cpu], None, 1, 64, False, True)
    hs = sched.hash_set
    before = (hs.used.copy(), hs.keys.copy())
    with pytest.raises(gg.GGMLError, match="hash set is full"):
        S._insert_in_order(sched, [(k + 1) << 4 for k in range(size + 1)])
    assert np.array_equal(hs.used, before[0]) and np.array_equal(hs.keys, before[1]) and not sched._slot
