"""The llama context's graph cache (issue 14): graphs of shapes seen before stay built, split, allocated and compiled.

* Oracle llama.cpp (the installed AVX2 ``llama_cpp``, skipped if it cannot be imported): token-by-token decode of one
  sequence, interleaved with prompts of 6 and 10 tokens decoded into a second sequence that is removed again right
  after (so the first sequence's cells, mask and n_kv are those of llama.cpp's plain decode): every decode step's
  logits are llama.cpp's bits, while the graph switches decode -> prefill 6 -> decode (cached) -> prefill 10 ->
  decode (cached).
* Against a fresh build (``graph_reuse = False``: every ubatch built, split and allocated anew): the same logits on
  a prefill 6 -> decode -> prefill 10 -> decode -> prefill 6 sequence, and for every restored graph the same
  scheduler plan (backends, causes, splits), the same allocator plan (offsets, sizes, reuse) and the same place of
  every tensor in the compute buffer.
* A reused step builds nothing (counted by the builder, the scheduler's and allocator's trace events).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggviz import ggml, llama, trace
from ggviz.ggml import accel
from ggviz.ggml import backend as B
from ggviz.llama import context_pool
from ggviz.llama import graph as llama_graph
from ggviz.llama.models import llama as arch_llama

MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKS = [504, 3575, 282, 4649, 314, 28, 7065, 1326, 30, 2000, 300, 301, 302]


def _ctx(model, n_seq_max=1, reuse=True, threads=2):
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
    cp.n_seq_max = n_seq_max
    cp.n_threads = cp.n_threads_batch = threads
    ctx = llama.init_from_model(model, cp)
    ctx.graph_reuse = reuse
    return ctx


def _decode(ctx, ids, seq, pos0):
    b = llama.batch_init(len(ids))
    for i, t in enumerate(ids):
        llama.batch_add(b, int(t), pos0 + i, [seq], i == len(ids) - 1)
    assert llama.decode(ctx, b) == 0
    return llama.get_logits_ith(ctx, -1).copy()


_LLAMACPP_DECODE = """
import sys, numpy as np, llama_cpp as L
path, out, toks = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split(",")]
L.llama_backend_init()
lm = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = cp.n_batch = cp.n_ubatch = 512
cp.n_threads = cp.n_threads_batch = 2
lc = L.llama_init_from_model(lm, cp)             # flash attention at its default (auto: on), as ggviz's context
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(lm))
ref = []
for t in toks:
    arr = (L.llama_token * 1)(t)
    assert L.llama_decode(lc, L.llama_batch_get_one(arr, 1)) == 0
    ref.append(np.ctypeslib.as_array(L.llama_get_logits_ith(lc, -1), shape=(n_vocab,)).copy())
np.save(out, np.array(ref))
"""


def test_shape_switches_keep_llamacpp_decode_bits(model, tmp_path):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python (the AVX2 oracle build) is not installed")
    if not MODEL.exists():
        pytest.skip("the default model is not in data/models")
    # in a process of its own: a test module that loaded real ggml (tests/oracle) would give llama.cpp its symbols
    out = tmp_path / "ref.npy"
    r = subprocess.run([sys.executable, "-c", _LLAMACPP_DECODE, str(MODEL), str(out), ",".join(map(str, TOKS))],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = list(np.load(out))

    ctx = _ctx(model, n_seq_max=2)
    mine = []
    for i, t in enumerate(TOKS):
        mine.append(_decode(ctx, [t], 0, i))
        if i in (4, 8):              # a prompt of 6, then of 10 tokens into sequence 1, removed again
            _decode(ctx, list(range(1000, 1006 if i == 4 else 1010)), 1, 0)
            assert ctx.memory_seq_rm(1, -1, -1)
    same = [bool(np.array_equal(a, b)) for a, b in zip(mine, ref)]
    assert all(same), f"positions whose logits differ from llama.cpp's: {[i for i, s in enumerate(same) if not s]}"
    # decode, prefill 6, prefill 10 built once each; the decode graph came back from the cache twice
    assert ctx.n_graph_builds == 3 and ctx.n_graph_restored == 2
    assert ctx.graph_cache_keys() == [(6, 1, 256), (10, 1, 256)]


def _offsets(res):
    """Where every tensor of the graph lives: (name, buffer id-free offset into its compute buffer) in graph order;
    weights and the KV cache (not in a compute buffer) are left out."""
    out = []
    for t in list(res.gf.leafs) + list(res.gf.nodes):
        if not t.buffer or not t.data:
            continue
        buf = B.buffer_at(t.buffer)
        if buf.usage != B.GGML_BACKEND_BUFFER_USAGE_COMPUTE:
            continue
        out.append((t.name, t.data - B.backend_buffer_get_base(buf)))
    return out


def _alloc_plan(ctx):
    recs = ctx.sched.galloc.last_alloc["tensors"]
    return [{k: v for k, v in r.items() if k != "addr"} for r in recs], ctx.sched.galloc.last_alloc["chunk_sizes"]


def _run(ctx):
    """prefill 6 -> 3 decodes -> prefill 10 -> 3 decodes -> prefill 6 (a new sequence position range each time);
    after each ubatch: logits, the scheduler plan, the allocator plan, the tensors' offsets."""
    steps = []
    pos = 0

    def step(ids):
        nonlocal pos
        lg = _decode(ctx, ids, 0, pos)
        pos += len(ids)
        steps.append((lg, ctx.sched.last_plan, _alloc_plan(ctx), _offsets(ctx.last_graph), ctx.sched.n_splits))
        return int(np.argmax(lg))

    tok = step(TOKS[:6])
    for _ in range(3):
        tok = step([tok])
    tok = step(list(range(300, 310)))
    for _ in range(3):
        tok = step([tok])
    step(TOKS[:6])
    return steps


def test_restored_graphs_equal_fresh_builds(model):
    cached = _ctx(model)
    a = _run(cached)
    assert cached.n_graph_builds == 3 and cached.n_graph_restored == 2     # decode after p10, the last p6
    b = _run(_ctx(model, reuse=False))
    assert len(a) == len(b) == 9
    for i, (x, y) in enumerate(zip(a, b)):
        assert np.array_equal(x[0], y[0]), f"step {i}: logits differ"
        assert x[1] == y[1], f"step {i}: the scheduler's plan differs"
        assert x[2] == y[2], f"step {i}: the allocator's plan differs"
        assert x[3] == y[3] and len(x[3]) > 100, f"step {i}: tensor offsets differ"
        assert x[4] == y[4]


def test_reused_step_rebuilds_nothing(model, monkeypatch):
    ctx = _ctx(model)
    builds = []
    orig = arch_llama.LlamaGraph.build

    def counting_build(self):
        builds.append((self.n_tokens, self.n_outputs, self.n_kv))
        return orig(self)
    monkeypatch.setattr(arch_llama.LlamaGraph, "build", counting_build)
    _decode(ctx, TOKS[:6], 0, 0)                 # the reserve's pp graph, derived to 6/1/256 (not built)
    _decode(ctx, [TOKS[6]], 0, 6)                # the reserve's tg graph, derived to n_kv 256 (not built)
    _decode(ctx, list(range(300, 310)), 0, 7)
    assert builds == [(10, 1, 256)] and ctx.n_graph_derived == 2 and ctx.n_graph_builds == 3
    heavy = ("sched.pass", "sched.split", "sched.assign", "sched.alloc", "alloc.reserve", "alloc.alloc",
             "llama.graph_reuse", "sched.restore_graph", "sched.save_graph")
    with trace.recording(heavy) as rec:
        _decode(ctx, [TOKS[7]], 0, 17)           # the decode graph, from the cache
        _decode(ctx, [TOKS[8]], 0, 18)           # the same graph again, still in the scheduler
    kinds = [e["kind"] for e in rec.events]
    assert builds == [(10, 1, 256)], "a reused step built a graph"
    assert kinds == ["sched.save_graph", "sched.restore_graph", "llama.graph_reuse", "llama.graph_reuse"], kinds
    reuse = [e for e in rec.events if e["kind"] == "llama.graph_reuse"]
    assert [e["cached"] for e in reuse] == [True, False]
    assert ctx.graph_cache_keys() == [(6, 1, 256), (10, 1, 256)]


def _graph_structs(res):
    """Every leaf and node of the graph as plain data: name, op, type, ne, nb, op_params, flags, view_offs, and its
    sources and view source by position in the graph (or address, outside it: weights, the KV cache)."""
    from ggviz.ggml.alloc import srcs_of
    pos = {t.addr: ("leaf", i) for i, t in enumerate(res.gf.leafs)}
    pos.update({t.addr: ("node", i) for i, t in enumerate(res.gf.nodes)})

    def one(t):
        return (t.name, t.op, t.type, t.shape, t.strides, tuple(t.op_params.tolist()), t.flags, t.view_offs,
                tuple((j, pos.get(s.addr, s.addr)) for j, s in srcs_of(t)),
                None if t.view_src is None else pos.get(t.view_src.addr, t.view_src.addr))
    return [one(t) for t in res.gf.leafs], [one(t) for t in res.gf.nodes]


@pytest.mark.parametrize("fa", [-1, 0], ids=["flash_attn", "no_flash_attn"])
def test_derived_graph_equals_a_fresh_build(model, fa):
    """The first decode step after a prompt takes the reserve's tg graph (n_kv = the cache size, 1024 here) with its
    n_kv rewritten to 256 (graph.derive_graph) instead of building it, and the prompt before it the reserve's pp
    graph (512 tokens and outputs, n_kv 1024) rewritten to 6 tokens, 1 output, n_kv 256: every leaf and node of
    both equals a fresh build's (names, ops, shapes, strides, parameters, sources), with and without flash
    attention (KQ, its soft_max and the transposed V view are the shapes n_kv reaches there)."""
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.flash_attn_type = 1024, 1, 1, fa
    ctx = llama.init_from_model(model, cp)
    pp = ctx._graph_template_pp
    assert pp is not None and llama_graph.derive_graph(pp, 6, 1, 256)     # (what the prompt will do)
    words = _words(pp)
    assert words == _words(ctx.build_graph(6, 1, 256))
    assert llama_graph.derive_graph(pp, 512, 512, 1024)                     # (back: the reserve's shape)
    _decode(ctx, TOKS[:6], 0, 0)
    prompt = _graph_structs(ctx.last_graph)
    assert ctx.n_graph_derived == 1 and ctx.last_graph.n_tokens == 6
    _decode(ctx, [TOKS[6]], 0, 6)
    res = ctx.last_graph
    assert ctx.n_graph_derived == 2 and res.n_kv == 256 and ctx.kv.size == 1024
    assert _graph_structs(res) == _graph_structs(ctx.build_graph(1, 1, 256))
    assert prompt == _graph_structs(ctx.build_graph(6, 1, 256))
    assert len(res.gf.nodes) == (936 if fa else 1086)


def _placement(gf):
    """Every leaf's and node's place after allocation: (name, its buffer's usage, data - the buffer's base, or the
    absolute address when it has no buffer) -- views, weights and the KV cache included."""
    out = []
    for t in list(gf.leafs) + list(gf.nodes):
        buf = B.buffer_at(t.buffer)
        out.append((t.name, None if buf is None else buf.usage,
                    t.data if buf is None else t.data - B.backend_buffer_get_base(buf)))
    return out


def test_derived_graph_split_equals_the_passes(model, monkeypatch):
    """The derived graph's split takes passes 1-4 from the reserve's split of the same graph (the scheduler's split
    memo: only ne/nb changed, the backends answer the same), and pass 5's splits (it made no copies there): the
    scheduler's tables, plan (leafs and their buffer types included) and splits are, node by
    node, those of the passes run on it (the memo turned off). The same run places the scheduler's graph with the
    allocator's placing over arrays (alloc._alloc_graph_tensors_arrays), the other with ggml's call-by-call loop
    (what a trace listener gets): every tensor's buffer and place, views included, and the buffer sizes are the
    same."""
    from ggviz.ggml import alloc as ga
    from ggviz.ggml import sched as gs

    pass5 = []
    real_pass5 = gs._pass5
    monkeypatch.setattr(gs, "_pass5", lambda *a: pass5.append(1) or real_pass5(*a))

    def first_step():
        ctx = _ctx(model)
        _decode(ctx, TOKS[:6], 0, 0)
        n0 = ctx.sched.n_split_memo
        pass5.clear()
        _decode(ctx, [TOKS[6]], 0, 6)
        s, gf = ctx.sched, ctx.last_graph.gf
        # each tensor's backend id and cause, in graph order (the hash slots themselves follow the addresses,
        # which differ between two contexts)
        per_tensor = [(t.name, s.hv_tensor_backend_ids[s._slot[t.addr]], s.causes.get(s._slot[t.addr], ""))
                      for t in list(gf.leafs) + list(gf.nodes)]
        return (ctx.n_graph_derived, s.n_split_memo - n0, len(pass5), s.last_plan, s.node_backend_ids[:s.graph.n_nodes],
                per_tensor, len(s._slot), int(gs._used_slots(s.hash_set, s.hash_set.used).sum()), s.n_splits,
                [(sp.backend_id, sp.i_start, sp.i_end, len(sp.inputs)) for sp in s.splits[:s.n_splits]],
                _offsets(ctx.last_graph), _placement(s.graph), ga.gallocr_get_buffer_size(s.galloc, 0),
                llama.get_logits_ith(ctx, -1).tobytes())

    memo = first_step()
    with monkeypatch.context() as m:
        m.setattr(gs, "_split_memo_match", lambda sched, graph: None)
        m.setattr(ga, "_alloc_graph_tensors_fast", ga._alloc_graph_tensors)
        m.setattr(ga, "_alloc_graph_tensors_arrays", lambda galloc, graph: False)
        passes = first_step()
    # (pass 5 too: the memo's split made no copies, so its splits are put back)
    assert memo[:3] == (2, 1, 0) and passes[:3] == (2, 0, 1)
    for i, (x, y) in enumerate(zip(memo[3:], passes[3:])):
        assert x == y, f"item {i + 3} differs"


def test_split_hash_slots_follow_ggmls_insertion_order(model):
    """Pass 1 finds (and inserts) the hash slots of a graph's leafs and then its nodes in one go (sched._hash_ids):
    every slot is the one ggml's loops give -- the scheduler's pins first, then each leaf, then each node, inserted
    one by one into an empty hash set of the same size (ggml_hash_find, linear probing) -- for the reserve's graphs
    and a prompt's, whether the passes ran or the split memo's results were moved to other pins' slots
    (sched._split_memo_move)."""
    from ggviz.ggml import sched as gs
    from ggviz.ggml.graph import HashSet

    ctx = _ctx(model)
    checked = []
    real = gs._assign_backends
    real_move = gs._split_memo_move
    graphs = {}
    real_split = gs.backend_sched_split_graph

    def split(sched, graph):
        graphs[id(sched)] = graph
        return real_split(sched, graph)

    def check(sched, nodes, leafs, *a):
        pre = dict(sched._slot)                       # the pins (set_tensor_backend before the split)
        if nodes is None:                             # (_split_memo_move(sched, memo, unpin))
            gf = graphs[id(sched)]
            nodes, leafs = gf.nodes, gf.leafs
            out = real_move(sched, *a)
        else:
            out = real(sched, nodes, leafs, *a)
        hs = sched.hash_set
        ref = HashSet(hs.size, np.zeros_like(hs.used), np.zeros_like(hs.keys))
        want = {}
        for t in [ggml.tensor_at(a) for a in pre] + list(leafs) + list(nodes):
            if t.addr in want:
                continue
            i = ref.find(t.addr)
            ref.set_used(i)
            ref.keys[i] = t.addr
            want[t.addr] = i
        got = {a: sched._slot[a] for a in want}
        checked.append((len(want), got == want, out[0] == [want[t.addr] for t in nodes]))
        return out

    with pytest.MonkeyPatch.context() as m:
        m.setattr(gs, "_assign_backends", check)
        m.setattr(gs, "_split_memo_move", lambda sched, *a: check(sched, None, None, *a))
        m.setattr(gs, "backend_sched_split_graph", split)
        ctx.sched_need_reserve = True
        ctx.sched_reserve()
        _decode(ctx, TOKS[:6], 0, 0)
    assert len(checked) >= 3 and all(ok and hid_ok for _, ok, hid_ok in checked), checked


def _programs_as_built(ctx):
    """Each split's compiled program against a fresh build of the same split graph (fast/compiler.py's row
    builder over every node) and its plans against ggml_graph_plan's per-node loop run on the graph: equal, field by
    field. Returns how many of the programs were derived from a remembered one."""
    from ggviz.ggml.cpu import ggml_cpu, traits
    from ggviz.ggml.cpu.fast import compiler
    from ggviz.ggml.cpu.fast.program import FA_NTH
    s = ctx.sched
    derived = 0
    for sp in s.splits[:s.n_splits]:
        g = sp.graph
        fg = g._ggviz_fast[1]
        fresh = compiler._build(g, require_repack=False)
        P = fg.P.copy()
        P[fg.fa_rows, FA_NTH] = 0          # (ggml's n_threads, written before each compute: begin_compute)
        assert np.array_equal(P, fresh.P) and np.array_equal(fg.F, fresh.F), "program rows differ"
        assert (fg.node_index, fg.names, fg.meta, fg.n_nodes) == (fresh.node_index, fresh.names, fresh.meta,
                                                                  fresh.n_nodes)
        assert (fg.work_size, fg.row_ws) == (fresh.work_size, fresh.row_ws)
        assert fg.plan_nodes
        for nt, (tasks, ws) in fg.plan_nodes.items():
            want_t = [ggml_cpu.get_n_tasks(x, nt) for x in g.nodes]
            extra = [traits.extra_work_size(nt, x) for x in g.nodes]
            want_w = [e if e is not None else ggml_cpu.node_work_size(x, t, nt)
                      for x, t, e in zip(g.nodes, want_t, extra)]
            assert (tasks, ws) == (want_t, want_w), "the derived plan differs from ggml_graph_plan's loop"
            assert fg.plan_cache[nt] == (max(max(want_w), fg.work_size), max(want_t), want_t)
        derived += fg.plan_from is not None
    return derived


def test_derived_program_equals_a_fresh_build(model, monkeypatch):
    """A new graph whose topology was compiled before (another n_tokens or n_kv, another context) takes that program
    with its descriptors read from the new structs and the rows that read changed tensors rebuilt (fast/compiler.py:
    _derive), and ggml_graph_plan's loop runs on the changed nodes only: every program and plan equals a fresh
    build's and the loop's, the logits are the bits of a run with derivation off -- across a prompt -> decode
    step, a second context, and n_kv 256 -> 512 (a prompt crossing 256 cells, then a decode step there). A step
    recorded by a trace listener compiles for real."""
    from ggviz.ggml.cpu.fast import compiler
    long = [200 + (i * 7919) % 39800 for i in range(250)]

    def run(derive):
        monkeypatch.setattr(compiler, "DERIVE", derive)
        compiler._memo.clear()
        a, b = _ctx(model), _ctx(model)
        out, derived = [], []
        for ctx, ids, pos in ((a, TOKS[:6], 0), (a, [TOKS[6]], 6), (b, TOKS[:10], 0), (b, [TOKS[10]], 10),
                              (a, long, 7), (a, TOKS[:8], 257), (a, [TOKS[8]], 265)):
            out.append(_decode(ctx, ids, 0, pos).tobytes())
            derived.append(_programs_as_built(ctx))
        assert a.kv.get_n_kv() == 512
        with trace.recording(("cpu.plan",)) as rec:
            c = _ctx(model)
            out.append(_decode(c, TOKS[:6], 0, 0).tobytes())
            derived.append(_programs_as_built(c))
        assert rec.events
        return out, derived

    on, d_on = run(True)
    off, d_off = run(False)
    assert d_off == [0] * 8
    # derived: a's decode step (from its prompt's), b's prompt (from a's prompt) and decode step (from a's:
    # another context), a's long prompt, its 8 tokens at n_kv 512 and its decode step at n_kv 512; not the first
    # program, not the recorded step
    assert d_on == [0, 1, 1, 1, 1, 1, 1, 0], d_on
    assert on == off



@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
@pytest.mark.parametrize("fa", [-1, 0])
def test_first_program_built_by_classes_equals_a_row_by_row_build(model, which, fa):
    """A graph whose topology nothing was compiled for (a context's first prompt) is built one row per class of
    equal rows, its plan's node loop once per class of equal nodes (fast/compiler.py: _build_by_class): the program
    equals the row builder's over every node, field by field, and the plans ggml_graph_plan's loop (SmolLM2 and
    Gemma-3's K-quants, flash attention on and off, 1 and 3 threads); a step recorded by a trace listener is built
    row by row."""
    from ggviz.ggml.cpu.fast import compiler
    if which == "gemma3":
        path = MODEL.parent / "gemma-3-270m-q4_k_m.gguf"
        if not path.exists():
            pytest.skip("no Gemma-3 model")
        model = llama.model_load_from_file(str(path), llama.model_default_params())
    for threads in (1, 3):
        compiler._memo.clear()
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.flash_attn_type = 512, threads, threads, fa
        ctx = llama.init_from_model(model, cp)
        _decode(ctx, TOKS[:4], 0, 0)
        _programs_as_built(ctx)
        assert all(sp.graph._ggviz_fast[1].plan_groups is not None for sp in ctx.sched.splits[:ctx.sched.n_splits])
        llama.free(ctx)
    compiler._memo.clear()
    cp.n_ctx = 256                      # (not the freed context's shape: that one would be taken over, graphs and all)
    with trace.recording(("cpu.plan",)):
        ctx = llama.init_from_model(model, cp)
        _decode(ctx, TOKS[:4], 0, 0)
    assert all(sp.graph._ggviz_fast[1].plan_groups is None for sp in ctx.sched.splits[:ctx.sched.n_splits])
    llama.free(ctx)


def test_a_changed_graph_is_derived_or_built_as_a_fresh_build(model):
    """What the cheaper plan of a new shape reads (fast/compiler.py: the tensor table's words gathered from the
    arenas, the rows' names kept while their name words are, the norms' use counts read from the hash set at once,
    the plan's node loop per group, the program kept on the graph against a view of its arena) tells a changed graph
    from the one it derives from: a node renamed (a derived program with the new name), an RMS_NORM read twice (its
    MUL fusion refused: the program is built, not derived), then undone (fused again) -- every program and
    plan equal to a fresh row-by-row build's and ggml_graph_plan's per-node loop."""
    from ggviz.ggml.cpu import ggml_cpu
    from ggviz.ggml.cpu.fast import compiler
    from ggviz.ggml.cpu.fast.program import OP, OP_RMS_NORM, SUBOP
    compiler._memo.clear()
    ctx = _ctx(model)
    _decode(ctx, TOKS[:6], 0, 0)
    _decode(ctx, [TOKS[6]], 0, 6)
    g = ctx.sched.splits[0].graph
    fg = g._ggviz_fast[1]
    assert _programs_as_built(ctx) == 1                  # (the decode step: derived from the prompt's program)

    def replan():
        plan = ggml_cpu.graph_plan(g, 2)
        assert plan.extra is g._ggviz_fast[1]
        _programs_as_built(ctx)
        return plan.extra

    assert replan() is fg                               # unchanged: the kept program
    # a renamed node: the same words but for the name -> derived, its row named as the graph now names it
    k = fg.names.index(next(n for n in fg.names if n.startswith("Qcur")))
    node = g.nodes[fg.node_index[k]]
    old_name = node.name
    ggml.set_name(node, "renamed-for-the-test")
    got = replan()
    assert got is not fg and got.plan_from is not None and got.names[k] == "renamed-for-the-test"
    ggml.set_name(node, old_name)
    # an RMS_NORM fused with its MUL now read twice: ggml's fusion test refuses -> not derived (the fusion changed),
    # built by classes with the norm and the MUL as two rows
    fused = [j for j in range(len(got)) if got.P[j, OP] == OP_RMS_NORM and got.P[j, SUBOP] == 1]
    assert fused
    norm = g.nodes[got.node_index[fused[0]]]
    slot = g.visited_hash_set.find(norm.addr)
    g.use_counts[slot] += 1
    try:
        built = replan()
        assert built.plan_from is None and built.plan_groups is not None and len(built) == len(got) + 1
    finally:
        g.use_counts[slot] -= 1
    again = replan()                # (fused again: built, as the program remembered for these words is the unfused)
    assert len(again) == len(got) and again.names == fg.names
    llama.free(ctx)


def test_cache_is_bounded_and_cleared_by_a_new_reserve(model):
    ctx = _ctx(model)
    ctx.graph_cache_size = 2
    pos = 0
    for n in (2, 3, 4, 5):
        _decode(ctx, list(range(400, 400 + n)), 0, pos)
        pos += n
    # the graph in the scheduler (5 tokens) is not in the cache; the least recently used (2 tokens) was dropped
    assert ctx.graph_cache_keys() == [(3, 1, 256), (4, 1, 256)]
    lg = _decode(ctx, [TOKS[0]], 0, pos)
    ctx.sched_need_reserve = True                # a new scheduler: no cached graph can be used with it
    ctx.memory_seq_rm(0, pos, -1)
    assert np.array_equal(_decode(ctx, [TOKS[0]], 0, pos), lg)
    assert ctx.graph_cache_keys() == []


def test_reallocated_buffers_drop_a_cached_graph(model):
    """A cached graph whose compute buffers were reallocated since (its tensors point into the old ones) is not
    restored: it is built again, with the same result."""
    from ggviz.ggml import sched as gs
    ctx = _ctx(model)
    lg1 = _decode(ctx, TOKS[:6], 0, 0)
    _decode(ctx, [TOKS[6]], 0, 6)
    assert ctx.graph_cache_keys() == [(6, 1, 256)]
    st = ctx._graph_cache[(6, 1, 256)][1]
    st.plan.buffers = [object()] + st.plan.buffers[1:]                 # as if buffer 0 had been reallocated
    n = ctx.n_graph_builds
    ctx.memory_seq_rm(0, 0, -1)
    assert np.array_equal(_decode(ctx, TOKS[:6], 0, 0), lg1)
    assert ctx.n_graph_builds == n + 1 and ctx.n_graph_restored == 0
    assert gs.backend_sched_get_n_splits(ctx.sched) >= 1


def _generate(ctx, n=3):
    out = [_decode(ctx, TOKS[:4], 0, 0)]
    for i in range(n):
        out.append(_decode(ctx, [int(np.argmax(out[-1]))], 0, 4 + i))
    return out


def test_a_freed_context_is_taken_over_by_the_next_of_its_shape(model):
    """llama_free parks the context's backends, KV cache and scheduler (compute buffers, graphs) on the model; the
    next context of the same shape takes them over: no reserve, no graph built, the same reserve record and buffer
    sizes, bit-identical logits (against a context created from scratch); the freed context refuses to be used."""
    context_pool.context_pool_clear()
    a = _ctx(model)
    la = _generate(a)
    log, sizes = a.reserve_log, a.compute_buffer_sizes()
    sched = a.sched
    llama.free(a)
    with pytest.raises(llama.ContextFreedError):
        llama.decode(a, llama.batch_get_one([1]))
    with pytest.raises(llama.ContextFreedError):
        a.memory_seq_pos_max(0)
    b = _ctx(model)
    assert b.recycled and b.sched is sched and b.kv.seq_pos_max(0) == -1
    assert b.reserve_log == log and b.compute_buffer_sizes() == sizes and b.check_compute_buffers() == []
    lb = _generate(b)
    assert b.n_graph_builds == 0
    assert all(np.array_equal(x, y) for x, y in zip(la, lb))
    llama.free(b)
    other = _ctx(model, n_seq_max=2)              # another shape: a context of its own
    assert not other.recycled
    context_pool.context_pool_clear()
    c = _ctx(model)
    assert not c.recycled and len(c.reserve_log) == 4      # the flash-attention probe, pp, tg, pp
    lc = _generate(c)
    assert all(np.array_equal(x, y) for x, y in zip(la, lc))


def test_a_graph_allocated_on_the_scheduler_directly_is_not_taken_for_the_contexts(model):
    """The views split and allocate graphs on ``ctx.sched`` themselves (reset, build, alloc_graph): the context's
    next decode then neither reuses nor caches that foreign graph as its own; its logits stay a fresh build's."""
    from ggviz.ggml import sched as gs
    ctx = _ctx(model)
    fresh = _ctx(model, reuse=False)
    for c in (ctx, fresh):
        _decode(c, TOKS[:6], 0, 0)
    _decode(ctx, [TOKS[6]], 0, 6)
    _decode(fresh, [TOKS[6]], 0, 6)
    gs.backend_sched_reset(ctx.sched)                 # what tests/test_machinery_views.py's plan_decode does
    other = ctx.build_graph(1, 1, 256)
    assert gs.backend_sched_alloc_graph(ctx.sched, other.gf)
    n = ctx.n_graph_builds
    assert np.array_equal(_decode(ctx, [TOKS[7]], 0, 7), _decode(fresh, [TOKS[7]], 0, 7))
    assert ctx.n_graph_builds == n + 1 and ctx.last_graph is not other
    assert ctx.graph_cache_keys() == [(6, 1, 256)]
    assert np.array_equal(_decode(ctx, TOKS[:6], 0, 8), _decode(fresh, TOKS[:6], 0, 8))     # from the cache
    assert ctx.n_graph_restored == 1


def test_restored_graph_with_splits_and_input_copies():
    """The last 4 layers on a (simulated) accelerator that cannot run RMS_NORM: each graph is split in 19 pieces
    whose inputs are copied between the devices (copies made in the scheduler's own context), the CPU's splits run
    by compiled programs, the device's by the faithful kernels. A 3-token prompt's graph, restored from the cache
    after a decode step, computes bit for bit what a fresh build computes, with the same splits, causes and copies.

    The fresh build is made in the same context: the restored prompt's positions removed again, ``graph_reuse``
    off, the prompt decoded anew (the same KV history, built, split and allocated from scratch); a second context,
    fresh, splits and allocates (without computing) the same graph, for the plan. (Every layer on the device, with
    the weights in host memory, took 62 s under load: the faithful kernels on both sides; now 8.5 s.)"""
    if not MODEL.exists():
        pytest.skip("the default model is not in data/models")
    from ggviz.ggml import sched as gs
    dev = accel.backend_accel_device_new("ACCEL0", supported_ops=accel.DEFAULT_SUPPORTED_OPS - {ggml.GGML_OP_RMS_NORM})
    mp = llama.model_default_params()
    mp.devices, mp.n_gpu_layers = [dev], 4
    model = llama.model_load_from_file(str(MODEL), mp)
    ctx = _ctx(model, threads=1)
    prompt = [9690, 504, 3575]
    out = _decode(ctx, prompt, 0, 0)
    _decode(ctx, [int(np.argmax(out))], 0, 3)
    n_builds = ctx.n_graph_builds
    restored = _decode(ctx, prompt, 0, 4)
    plan_a, splits_a = ctx.sched.last_plan, ctx.sched.n_splits
    assert ctx.n_graph_restored == 1 and ctx.n_graph_builds == n_builds        # from the cache, not built
    assert ctx.memory_seq_rm(0, 4, -1)
    ctx.graph_reuse = False
    built = _decode(ctx, prompt, 0, 4)
    assert ctx.n_graph_builds == n_builds + 1 and ctx.n_graph_restored == 1      # built anew
    assert np.array_equal(restored, built)
    # per offloaded layer at least 4 splits: attn_norm (CPU), attention (device), ffn_norm (CPU), FFN (device)
    assert ctx.sched.n_splits == splits_a >= 4 * 4 and ctx.sched.last_plan == plan_a
    fresh = _ctx(model, reuse=False, threads=1)
    gs.backend_sched_reset(fresh.sched)
    assert gs.backend_sched_alloc_graph(fresh.sched, fresh.build_graph(len(prompt), 1, 256).gf)
    assert fresh.sched.n_splits == splits_a and fresh.sched.last_plan == plan_a
    assert plan_a["n_inputs"] >= 4 * 4              # the inputs copied between the devices: one per split at least


def test_the_allocator_plan_check_over_arrays_equals_ggmls_loop(model):
    """gallocr_needs_realloc's check of a graph against the current plan, over all slots at once
    (alloc._plan_fits_arrays: each tensor's size from its struct words, the plan's slots read into arrays once per
    plan) says what the per-tensor loop says (alloc._plan_fits: gallocr_node_needs_realloc, tensor by tensor): for the
    prompt's and the decode step's graphs on the reserve's plan, and with tensors unplaced again (data unset, as
    before an allocation): a node's slot exactly its size, one byte short, a source's slot too small, the slot of
    a tensor that had data when planned. A reserve drops the arrays before it plans."""
    from ggviz.ggml import alloc as ga
    ctx = _ctx(model)
    _decode(ctx, TOKS[:6], 0, 0)
    s = ctx.sched
    galloc = s.galloc

    def both():
        galloc._slots_cache = None
        return ga._plan_fits(galloc, s.graph), ga._plan_fits_arrays(galloc, s.graph)

    assert both() == (True, True)
    _decode(ctx, [TOKS[6]], 0, 6)
    g = s.graph
    assert both() == (True, True)
    na = galloc.node_allocs
    i = next(k for k, t in enumerate(g.nodes) if t.view_src is None and na[k].dst.buffer_id >= 0
             and ggml.nbytes(t) > 0)
    k, j = next((k, j) for k, t in enumerate(g.nodes) for j, u in enumerate(t.src)
                if u is not None and u.view_src is None and na[k].src[j].buffer_id >= 0 and ggml.nbytes(u) > 0)
    node, src = g.nodes[i], g.nodes[k].src[j]
    saved = [(t, t.data) for t in (node, src)] + [(ta, (ta.buffer_id, ta.size_max)) for ta in (na[i].dst,
                                                                                             na[k].src[j])]
    try:
        node.data = 0
        src.data = 0
        if src.addr != node.addr:
            for m, t in enumerate(g.nodes):                    # (its own dst slot too: it is unplaced now)
                if t.addr == src.addr:
                    saved.append((na[m].dst, (na[m].dst.buffer_id, na[m].dst.size_max)))
                    na[m].dst.size_max = max(na[m].dst.size_max, ggml.nbytes(src))
        na[i].dst.size_max = ggml.nbytes(node)                 # exactly its size
        na[k].src[j].size_max = ggml.nbytes(src)
        assert both() == (True, True)
        na[i].dst.size_max = ggml.nbytes(node) - 1             # one byte short
        assert both() == (False, False)
        na[i].dst.size_max = ggml.nbytes(node)
        na[k].src[j].size_max = ggml.nbytes(src) - 1           # a source's slot too small
        assert both() == (False, False)
        na[k].src[j].buffer_id, na[k].src[j].size_max = -1, 1 << 40   # planned as a tensor with data
        assert both() == (False, False)
    finally:
        for obj, v in saved:
            if isinstance(v, tuple):
                obj.buffer_id, obj.size_max = v
            else:
                obj.data = v
    assert both() == (True, True)
    old = ga._plan_slots(galloc)
    assert ga.gallocr_reserve_n(galloc, g, s.node_backend_ids, s.leaf_backend_ids)
    # the reserve's own arrays (made from its tensor table as it ends) are the new plan's, the ones read back from
    # its tensor_alloc lists
    c = galloc._slots_cache
    assert c is not None and c[0] is galloc.node_allocs and c[1] is galloc._last_alloc and c[3] is not old[0]
    galloc._slots_cache = None
    bid, smax = ga._plan_slots(galloc)
    assert np.array_equal(c[3], bid) and np.array_equal(c[4], smax)


def test_placing_over_arrays_equals_the_loops(model, monkeypatch):
    """gallocr_alloc_graph's placing of a prompt's graph and of the decode step's after it: over arrays
    (alloc._alloc_graph_tensors_arrays, taken for both), the per-tensor fast loop and ggml's call-by-call loop give
    every tensor the same buffer and place (views included) and the same logits."""
    from ggviz.ggml import alloc as ga
    real_arrays, real_fast = ga._alloc_graph_tensors_arrays, ga._alloc_graph_tensors_fast
    taken = []

    def run(mode):
        monkeypatch.setattr(ga, "_alloc_graph_tensors_arrays",
                            (lambda g, gr: taken.append(real_arrays(g, gr)) or taken[-1]) if mode == "arrays"
                            else (lambda g, gr: False))
        monkeypatch.setattr(ga, "_alloc_graph_tensors_fast", real_fast if mode != "calls" else
                            ga._alloc_graph_tensors)
        ctx = _ctx(model)
        out = []
        for ids, pos in ((TOKS[:6], 0), ([TOKS[6]], 6)):
            logits = _decode(ctx, ids, 0, pos)
            out.append((_placement(ctx.sched.graph), logits.tobytes()))
        return out

    arrays = run("arrays")
    assert taken == [True, True]
    assert arrays == run("fast") == run("calls")


# ---- graphs of other ubatch shapes derived from a built one (graph.derive_graph, issue 23)

_SHAPES = [(1, 1, 256), (4, 1, 256), (7, 7, 256), (32, 1, 512), (128, 1, 256), (31, 3, 512), (512, 512, 512),
           (6, 1, 256)]
_derive_ctxs: dict = {}


def _derive_ctx(model, which, fa):
    """One context per (model, flash attention) for the derivation tests (n_ctx 512, one thread; built once)."""
    key = (which, fa)
    if key not in _derive_ctxs:
        if which == "gemma3":
            path = MODEL.parent / "gemma-3-270m-q4_k_m.gguf"
            if not path.exists():
                pytest.skip("no Gemma-3 model")
            model = llama.model_load_from_file(str(path), llama.model_default_params())
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = 1
        cp.flash_attn_type = fa
        _derive_ctxs[key] = llama.init_from_model(model, cp)
    return _derive_ctxs[key]


def _n_kv(ctx, n):
    kv = ctx.kv
    return (min(n, kv.kv_base.size), min(n, kv.kv_swa.size)) if hasattr(kv, "kv_swa") else n


_NOT_POINTERS = np.ones(42, bool)
_NOT_POINTERS[19:30] = False             # src[10], view_src: compared by position (_graph_structs)


def _words(res):
    """Every leaf's and node's struct ggml_tensor words but the pointers to other tensors (type, buffer, ne, nb, op,
    op_params, flags, view_offs, data, name, extra), as bytes: an unallocated graph's are a fresh build's."""
    return [t._q[:42][_NOT_POINTERS].tobytes() for t in list(res.gf.leafs) + list(res.gf.nodes)]


def _pins(res):
    """The build's scheduler pins as (position in the graph, backend name)."""
    pos = {t.addr: i for i, t in enumerate(res.gf.nodes)}
    return [(pos[t.addr], B.backend_name(b)) for t, b in res.sched_pins]


def _split(ctx, res):
    """The graph split by the context's scheduler with its pins: the split count and every node's backend."""
    from ggviz.ggml import sched as gs
    s = ctx.sched
    gs.backend_sched_reset(s)
    for t, b in res.sched_pins:
        gs.backend_sched_set_tensor_backend(s, t, b)
    gs.backend_sched_split_graph(s, res.gf)
    out = (s.n_splits, list(s.node_backend_ids[:s.graph.n_nodes]))
    gs.backend_sched_reset(s)
    return out


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
@pytest.mark.parametrize("fa", [-1, 0], ids=["flash_attn", "no_flash_attn"])
def test_graph_derived_to_other_shapes_equals_a_fresh_build(model, which, fa):
    """A graph built for one ubatch shape (the pp reserve's: 512 tokens, 512 outputs, n_kv 512) turned into the
    graphs of other shapes one after the other (graph.derive_graph: n_tokens, n_outputs and n_kv; 1/1, 4/1, 7/7,
    32/1, 128/1, 31/3 ...): each equals a fresh build of that shape -- every leaf and node (names, ops, types,
    shapes, strides, op_params, flags, sources, node order), the scheduler pins the build's callback makes (the
    layers' norms, below 32 tokens), and the scheduler's split of it (split count, every node's backend). SmolLM2
    and Gemma-3 (iSWA: two caches, two masks), flash attention on and off."""
    ctx = _derive_ctx(model, which, fa)
    res = ctx.build_graph(512, 512, _n_kv(ctx, 512))
    for n_tokens, n_outputs, n_kv in _SHAPES:
        assert llama_graph.derive_graph(res, n_tokens, n_outputs, _n_kv(ctx, n_kv)), (n_tokens, n_outputs, n_kv)
        res.sched_pins = ctx._norm_pins(res.norm_nodes, n_tokens)
        ref = ctx.build_graph(n_tokens, n_outputs, _n_kv(ctx, n_kv))
        what = (which, fa, n_tokens, n_outputs, n_kv)
        assert (res.n_tokens, res.n_outputs) == (n_tokens, n_outputs)
        assert _graph_structs(res) == _graph_structs(ref), what
        assert _words(res) == _words(ref), what
        assert _pins(res) == _pins(ref) and (len(ref.sched_pins) > 0) == (n_tokens < 32), what
        assert _split(ctx, res) == _split(ctx, ref), what


def test_graph_derivation_needs_every_record(model):
    """Each kind of recorded dim is needed: with the records of one site dropped (the inputs, the Q/K/V reshapes,
    the K/V cache writes' views, the attention's views and reshapes, the masks' n_kv ...) the graph derived to 4
    tokens, 1 output either is refused or differs from a fresh build -- so the equality above is no accident of
    values (n_tokens = n_kv = n_outputs = 512 in the graph it starts from). A graph without the records (an
    architecture that does not record them all) is refused any other n_tokens; the graph is left as it was."""
    import re
    G = llama_graph
    for fa in (-1, 0):
        ctx = _derive_ctx(model, "smollm2", fa)
        res = ctx.build_graph(512, 512, 512)
        ref = _graph_structs(ctx.build_graph(4, 1, 256))
        arena = res.ctx.mem_buffer.copy()
        before = _graph_structs(res)
        sites: dict = {}
        for k, (t, ne_r, nb_r) in enumerate(res.tok_dims):
            sites.setdefault(("tok", re.sub(r"-\d+", "", t.name), ne_r, nb_r), []).append(k)
        for k, (t, cache, dim) in enumerate(res.kv_dims):
            sites.setdefault(("kv", re.sub(r"_l\d+|-\d+", "", t.name), dim), []).append(k)
        assert len(sites) >= (14 if fa else 13), sorted(sites)
        tok_dims, kv_dims = res.tok_dims, res.kv_dims
        for site, ks in sites.items():
            res.tok_dims = [r for k, r in enumerate(tok_dims) if not (site[0] == "tok" and k in ks)]
            res.kv_dims = [r for k, r in enumerate(kv_dims) if not (site[0] == "kv" and k in ks)]
            ok = G.derive_graph(res, 4, 1, 256)
            assert not ok or _graph_structs(res) != ref, f"dropping {site} went unnoticed"
            res.ctx.mem_buffer[:] = arena
            res.n_tokens, res.n_outputs, res.n_kv = 512, 512, 512
        res.tok_dims, res.kv_dims = tok_dims, kv_dims
        assert _graph_structs(res) == before
        res.tok_dims = []
        assert not G.derive_graph(res, 4, 1, 256) and _graph_structs(res) == before
        assert G.derive_graph(res, 512, 512, 256)          # (n_kv alone needs no n_tokens records)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
@pytest.mark.parametrize("fa", [-1, 0], ids=["flash_attn", "no_flash_attn"])
def test_derivation_over_arrays_equals_node_by_node(model, which, fa, monkeypatch):
    """derive_graph for a new ubatch shape works over arrays (graph._derive_arrays: each dim and stride followed to
    the one it copies, the contiguous strides and ggml's checks over all nodes of an op at once), node by node only
    where that cannot vouch. It answers for every shape of these graphs (none falls back to node by node), and the
    graph it leaves is word for word the one the node-by-node derivation (VECTORIZED False) leaves -- which the test
    above compares with fresh builds."""
    G = llama_graph
    ctx = _derive_ctx(model, which, fa)
    answers = []
    arrays = G._derive_arrays
    monkeypatch.setattr(G, "_derive_arrays", lambda *a: answers.append(arrays(*a)) or answers[-1])
    a = ctx.build_graph(512, 512, _n_kv(ctx, 512))
    b = ctx.build_graph(512, 512, _n_kv(ctx, 512))
    for n_tokens, n_outputs, n_kv in _SHAPES:
        for res, vec in ((a, True), (b, False)):
            monkeypatch.setattr(G, "VECTORIZED", vec)
            assert G.derive_graph(res, n_tokens, n_outputs, _n_kv(ctx, n_kv)), (vec, n_tokens, n_outputs, n_kv)
        what = (which, fa, n_tokens, n_outputs, n_kv)
        assert _words(a) == _words(b) and _graph_structs(a) == _graph_structs(b), what
    assert len(answers) == len(_SHAPES) and all(x is True for x in answers), answers


def test_leaf_words_are_each_leafs_struct(model):
    """The derivation over arrays reads the leafs' struct words gathered from each context arena they lie in (the
    weights', the KV cache's, the graph's), one by one for a tensor in no arena (here a handle on bytes of its
    own): the rows are each tensor's own words, in the leafs' order."""
    from ggviz.ggml.tensor import Tensor
    ctx = _derive_ctx(model, "smollm2", -1)
    res = ctx.build_graph(4, 1, 256)
    own = np.zeros(336, np.uint8)
    lone = Tensor(own, None)
    lone._q[2:10] = [3, 1, 1, 1, 4, 12, 12, 12]
    leafs = [lone] + list(res.gf.leafs)[::-1] + [lone]
    assert len({id(t.ctx) for t in leafs}) >= 4
    W = llama_graph._leaf_words(leafs)
    assert W.shape == (len(leafs), llama_graph._NQ)
    assert all(np.array_equal(W[i], t._q[:llama_graph._NQ]) for i, t in enumerate(leafs))
    assert llama_graph._leaf_words([]).shape == (0, llama_graph._NQ)


def test_derivation_over_arrays_refuses_as_node_by_node(model, monkeypatch):
    """With the records of one site dropped (graphs a derivation must refuse, or would get wrong: see
    test_graph_derivation_needs_every_record), with a weight's shape that no longer fits its MUL_MAT, and with an
    op the derivation has no rule for put in a node's place, the derivation over arrays and the node-by-node one
    give the same answer and leave the same arena bytes."""
    import re
    G = llama_graph
    for fa in (-1, 0):
        ctx = _derive_ctx(model, "smollm2", fa)
        res = ctx.build_graph(512, 512, 512)
        arena = res.ctx.mem_buffer.copy()
        tok_dims, kv_dims = res.tok_dims, res.kv_dims
        cases: dict = {}
        for k, (t, ne_r, nb_r) in enumerate(tok_dims):
            cases.setdefault(("tok", re.sub(r"-\d+", "", t.name), ne_r, nb_r), []).append(k)
        for k, (t, cache, dim) in enumerate(kv_dims):
            cases.setdefault(("kv", re.sub(r"_l\d+|-\d+", "", t.name), dim), []).append(k)
        w = next(t for t in res.gf.leafs if t.name == "blk.3.ffn_down.weight")
        node = next(t for t in res.gf.nodes if t.name == "ffn_swiglu-5")
        cases[("weight",)] = cases[("op",)] = []
        n_answers = {True: 0, False: 0}
        for case, ks in cases.items():
            out = []
            for vec in (True, False):
                monkeypatch.setattr(G, "VECTORIZED", vec)
                res.tok_dims = [r for k, r in enumerate(tok_dims) if not (case[0] == "tok" and k in ks)]
                res.kv_dims = [r for k, r in enumerate(kv_dims) if not (case[0] == "kv" and k in ks)]
                ne = w.ne.tolist()
                if case[0] == "weight":
                    w.ne[0] = ne[0] * 2          # (its MUL_MAT's check fails)
                if case[0] == "op":
                    node.op = ggml.GGML_OP_ARGSORT
                try:
                    ok = G.derive_graph(res, 4, 1, 256)
                    out.append((ok, res.ctx.mem_buffer.tobytes(), res.n_tokens))
                finally:
                    w.ne[:] = ne
                    res.ctx.mem_buffer[:] = arena
                    res.n_tokens, res.n_outputs, res.n_kv = 512, 512, 512
            assert out[0] == out[1], (fa, case)
            n_answers[out[0][0]] += 1
        assert n_answers[True] and n_answers[False], n_answers
        res.tok_dims, res.kv_dims = tok_dims, kv_dims


def test_derivation_guards_build_and_logits_equal(model, monkeypatch):
    """Where the graph must be a real build it is: with a trace listener recording (the views record the build's
    events: graph.visit) and with LLAMA_GRAPH_REUSE_DISABLE (every ubatch built). The counters say which: a derived
    prompt counts in n_graph_builds and n_graph_derived; its logits are those of the built graph, bit for bit."""
    ctx = _ctx(model)
    a = _decode(ctx, TOKS[:5], 0, 0)
    assert (ctx.n_graph_builds, ctx.n_graph_derived) == (1, 1)
    llama.free(ctx)
    context_pool.context_pool_clear(model)
    ctx = _ctx(model)
    with trace.recording(("graph.visit",)) as rec:
        b = _decode(ctx, TOKS[:5], 0, 0)
    assert (ctx.n_graph_builds, ctx.n_graph_derived) == (1, 0) and len(rec.events) > 500
    llama.free(ctx)
    context_pool.context_pool_clear(model)
    monkeypatch.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1")
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
    cp.n_threads = cp.n_threads_batch = 2
    ctx = llama.init_from_model(model, cp)
    assert not ctx.graph_reuse
    c = _decode(ctx, TOKS[:5], 0, 0)
    _decode(ctx, [TOKS[5]], 0, 5)
    assert (ctx.n_graph_builds, ctx.n_graph_derived) == (2, 0)
    llama.free(ctx)
    context_pool.context_pool_clear(model)
    assert np.array_equal(a, b) and np.array_equal(a, c)
