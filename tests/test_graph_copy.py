"""A reserve graph copied from another one (llama.graph_copy, issue 23) is the graph a build would make.

* Oracle: a fresh build of the same shape into the same arena (the copy's buffer, cleared, handed to the builder's
  ggml_init): every byte of the arena -- object headers, tensor structs (names, op_params, flags, shapes, source
  pointers), the cgraph struct, nodes and leafs arrays, the visited hash set's slots, keys and use counts -- and the
  GraphResult's tensors (inputs, logits, fused nodes, recorded dims, norms), by address. SmolLM2 and Gemma-3 (iSWA),
  flash attention on and off, the probe's graph to the pp graph and back, the keys placed at once and one by one.
* Oracle: the same context made with the copy turned off (every reserve graph built): the reserve log (nodes,
  leafs, split counts, buffer sizes per reserve), the split of the pp graph, the logits of a prompt and a step.
* Guards: a trace listener or LLAMA_GRAPH_REUSE_DISABLE build every graph; a graph without its insert record, or
  an allocated one, is not copied.
"""
from __future__ import annotations


import numpy as np
import pytest

from ggviz import ggml, llama, trace
from ggviz.llama import context_pool, graph_copy
from tests.models import load_model as _model

_ctxs: dict = {}


def _ctx(which, fa):
    """One context per (model, flash attention), n_ctx 512, one thread (built once)."""
    key = (which, fa)
    if key not in _ctxs:
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.n_threads = cp.n_threads_batch = 1
        cp.flash_attn_type = fa
        _ctxs[key] = llama.init_from_model(_model(which), cp)
    return _ctxs[key]


def _fields(res):
    """The GraphResult's tensors by address, and its shape fields."""
    a = lambda t: None if t is None else t.addr       # noqa: E731
    inp = res.inputs
    return dict(
        inputs={k: a(getattr(inp, k)) for k in vars(inp)}, logits=a(res.t_logits), embd=a(res.t_embd),
        shape=(res.n_tokens, res.n_outputs, res.n_kv, res.n_kv_swa), named={k: a(t) for k, t in res.named.items()},
        fused=[(op, a(t), il) for op, t, il in res.fused_nodes], kv=[(a(t), c, d) for t, c, d in res.kv_dims],
        tok=[(a(t), ne, nb) for t, ne, nb in res.tok_dims], norms=[(a(t), il) for t, il in res.norm_nodes],
        pins=[(a(t), id(b)) for t, b in res.sched_pins], nodes=[t.addr for t in res.gf.nodes],
        leafs=[t.addr for t in res.gf.leafs], inserts=list(res.gf.inserts),
        objects=[(o.hdr_offs, o.type) for o in res.ctx.objects], used=res.ctx.used_mem())


def _fresh_build_in(ctx, buf, n_tokens, n_outputs, monkeypatch):
    """A fresh build of the shape into the arena ``buf`` (cleared first: a new arena's zeros)."""
    buf[:] = 0
    size = buf.size
    real = ggml.init
    monkeypatch.setattr(ggml, "init", lambda mem, no_alloc=False: real(size, mem_buffer=buf, no_alloc=no_alloc))
    try:
        return ctx.build_graph(n_tokens, n_outputs, ctx.kv.size)
    finally:
        monkeypatch.setattr(ggml, "init", real)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
@pytest.mark.parametrize("fa", [-1, 0], ids=["flash_attn", "no_flash_attn"])
@pytest.mark.parametrize("way", [(1, 512), (512, 1)], ids=["probe_to_pp", "pp_to_tg"])
@pytest.mark.parametrize("at_once", [True, False], ids=["placed", "inserted"])
def test_copied_graph_equals_a_fresh_build_in_its_arena(which, fa, way, at_once, monkeypatch):
    """The probe's graph (1 token) copied and turned into the pp reserve's (512 tokens, 512 outputs), and the pp
    graph into the tg one: every byte of the copy's arena and every tensor of its GraphResult are those of a fresh
    build of that shape into the same arena. The source graph is left as it was."""
    monkeypatch.setattr(graph_copy, "PLACE_AT_ONCE", at_once)
    ctx = _ctx(which, fa)
    a, b = way
    src = ctx.build_graph(a, a, ctx.kv.size)
    before = src.ctx.mem_buffer.copy()
    res = ctx._copy_graph(src, b, b)
    assert res is not None and res.ctx is not src.ctx
    assert np.array_equal(src.ctx.mem_buffer, before)
    buf = res.ctx.mem_buffer
    copied = buf.copy()
    fields = _fields(res)
    hs = res.gf.visited_hash_set
    n_keys = int(np.unpackbits(hs.used.view(np.uint8)).sum())
    assert n_keys == len(res.gf.nodes) + len(res.gf.leafs) == len(res.gf.inserts)
    ggml.free(res.ctx)
    ref = _fresh_build_in(ctx, buf, b, b, monkeypatch)
    assert ref.ctx.mem_buffer.ctypes.data == buf.ctypes.data
    assert np.array_equal(ref.ctx.mem_buffer, copied), np.flatnonzero(
        ref.ctx.mem_buffer.view(np.uint64) != copied.view(np.uint64))[:8]
    assert _fields(ref) == fields
    ggml.free(ref.ctx)


def test_colliding_home_slots_take_the_builds_order():
    """Keys whose home slots collide in the copy's arena are inserted one by one in the build's order (linear
    probing): a graph reading a weight whose home slot is that of one of the graph's tensors once copied (the
    copy's arena chosen so) lands them where a build in that arena lands them."""
    from ggviz.llama.graph import GraphInputs, GraphResult

    def make(ctx, w):
        gf = ggml.new_graph_custom(ctx, 64, False)
        x = ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 8)
        ggml.build_forward_expand(gf, ggml.add(ctx, x, w))
        return gf, x

    mem = ggml.tensor_overhead() * 64 + ggml.graph_overhead_custom(64, False)
    w_ctx = ggml.init(1 << 12, no_alloc=True)
    w = ggml.new_tensor_1d(w_ctx, ggml.GGML_TYPE_F32, 8)         # (a weight: outside the graph's arena)
    ctx = ggml.init(mem, no_alloc=True)
    gf, x = make(ctx, w)
    size = gf.visited_hash_set.size
    # an arena where the copy of x has w's home slot: x is inserted before w (the add's first source), w moves on
    big = np.zeros(mem + 16 * (size + 1), np.uint8)
    o = (-big.ctypes.data) % 16
    x_offs = x.addr - ctx.base
    o += 16 * ((((w.addr >> 4) - ((big.ctypes.data + o + x_offs) >> 4)) % size))
    buf = big[o:o + mem]
    assert ((buf.ctypes.data + x_offs) >> 4) % size == (w.addr >> 4) % size
    res = graph_copy.copy_graph(GraphResult(ctx=ctx, gf=gf, inputs=GraphInputs()), mem_buffer=buf)
    assert res is not None
    hs = res.gf.visited_hash_set
    assert hs.keys[(w.addr >> 4) % size] == x.addr - ctx.base + buf.ctypes.data
    copied = buf.copy()
    ggml.free(res.ctx)
    buf[:] = 0
    make(ggml.init(mem, mem_buffer=buf, no_alloc=True), w)
    assert np.array_equal(buf, copied)


def test_a_graph_without_its_insert_record_is_not_copied():
    ctx = _ctx("smollm2", -1)
    src = ctx.build_graph(1, 1, ctx.kv.size)
    src.gf.inserts = src.gf.inserts[:-1]
    assert graph_copy.copy_graph(src) is None
    src.gf.inserts = []
    assert graph_copy.copy_graph(src) is None


def test_an_allocated_graph_is_not_copied():
    """A graph whose tensors were placed (data set, or a buffer) is not what a build makes: not copied."""
    ctx = _ctx("smollm2", -1)
    src = ctx.build_graph(1, 1, ctx.kv.size)
    assert graph_copy.copy_graph(src) is not None
    node = next(t for t in src.gf.nodes if not t.view_src)
    node.data = 0x1000
    assert graph_copy.copy_graph(src) is None
    node.data = 0
    node.buffer = 0x2000
    assert graph_copy.copy_graph(src) is None


def _first_context(which, fa, copy=True, monkeypatch=None):
    model = _model(which)
    context_pool.context_pool_clear(model)
    if not copy:
        monkeypatch.setattr(graph_copy, "copy_graph", lambda res: None)
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 512, 1, 1
    cp.flash_attn_type = fa
    ctx = llama.init_from_model(model, cp)
    out = dict(log=[{k: v for k, v in e.items() if k != "copied"} for e in ctx.reserve_log],
               copied=ctx.n_graph_copied, sizes=list(ctx.backend_buf_exp_size), stats=dict(ctx.reserve_stats),
               fa=ctx.flash_attn)
    out["stats"].pop("t_us")
    b = llama.batch_init(8)
    for i, t in enumerate([504, 3575, 282, 4649, 314]):
        llama.batch_add(b, t, i, [0], i == 4)
    assert llama.decode(ctx, b) == 0
    out["prompt"] = llama.get_logits_ith(ctx, -1).copy()
    b = llama.batch_init(1)
    llama.batch_add(b, 28, 5, [0], True)
    assert llama.decode(ctx, b) == 0
    out["step"] = llama.get_logits_ith(ctx, -1).copy()
    llama.free(ctx)
    context_pool.context_pool_clear(model)
    if not copy:
        monkeypatch.undo()
    return out


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
@pytest.mark.parametrize("fa", [-1, 0], ids=["flash_attn", "no_flash_attn"])
def test_first_context_with_a_copied_graph_equals_the_built_one(which, fa, monkeypatch):
    """A first context whose second reserve graph is a copy reserves what the one that builds both reserves: the
    same nodes, leafs, splits and buffer sizes per reserve; its prompt and next step give the same logits, bit for
    bit."""
    a = _first_context(which, fa)
    b = _first_context(which, fa, copy=False, monkeypatch=monkeypatch)
    assert a["copied"] == 1 and b["copied"] == 0
    for k in ("log", "sizes", "stats", "fa"):
        assert a[k] == b[k], k
    assert np.array_equal(a["prompt"], b["prompt"]) and np.array_equal(a["step"], b["step"])


def test_views_and_reuse_disabled_build_every_graph(monkeypatch):
    """With a trace listener recording, and with LLAMA_GRAPH_REUSE_DISABLE, the reserve graphs are built."""
    model = _model("smollm2")
    context_pool.context_pool_clear(model)
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 512, 1, 1
    with trace.recording(("graph.visit",)) as rec:
        ctx = llama.init_from_model(model, cp)
    assert ctx.n_graph_copied == 0 and len(rec.events) > 1000
    llama.free(ctx)
    context_pool.context_pool_clear(model)
    monkeypatch.setenv("LLAMA_GRAPH_REUSE_DISABLE", "1")
    ctx = llama.init_from_model(model, cp)
    assert ctx.n_graph_copied == 0
    llama.free(ctx)
    context_pool.context_pool_clear(model)


def test_handles_read_and_write_the_struct_through_views_made_when_first_read():
    """A tensor handle's ``raw``, ``nb`` and ``op_params`` are made when first read (a build or a copy makes ~1,000
    handles, most never read through them): for a built tensor, a copied one and one made by ``Tensor(raw)``, each
    is a view of the struct's own bytes in the arena, and a write through it is a write of the struct (what
    ``t->nb[1] = ..`` does in C)."""
    from ggviz.ggml.tensor import Tensor
    ctx = _ctx("smollm2", -1)
    src = ctx.build_graph(1, 1, ctx.kv.size)
    cp = graph_copy.copy_graph(src)
    arena = ggml.init(1 << 12, no_alloc=True)
    made = ggml.new_tensor_2d(arena, ggml.GGML_TYPE_F32, 8, 3)
    for t in (cp.gf.nodes[5], made):
        assert t._raw is None and t._nb is None and t._op_params is None
    by_init = Tensor(made.raw, arena, made.addr)
    for t in (src.gf.nodes[5], cp.gf.nodes[5], made, by_init):
        buf, offs = t.ctx.mem_buffer, t.addr - t.ctx.base
        assert t.raw.ctypes.data == t.addr and t.raw.nbytes == 336 and t.raw.dtype == np.uint8
        assert t.nb.ctypes.data == t.addr + 48 and t.nb.dtype == np.int64 and t.nb.size == 4
        assert t.op_params.ctypes.data == t.addr + 84 and t.op_params.dtype == np.int32 and t.op_params.size == 16
        assert t.raw is t.raw and t.nb is t.nb and t.op_params is t.op_params
        before = buf[offs:offs + 336].copy()
        nb1, p2 = int(t.nb[1]), int(t.op_params[2])
        t.nb[1] = 12345
        t.op_params[2] = -7
        assert buf[offs + 56:offs + 64].view(np.int64)[0] == 12345 and t._q[7] == 12345
        assert buf[offs + 92:offs + 96].view(np.int32)[0] == -7 and t.raw[92:96].view(np.int32)[0] == -7
        t.nb[1], t.op_params[2] = nb1, p2
        assert np.array_equal(buf[offs:offs + 336], before)
        t.name = "renamed"
        assert t.raw[256:264].tobytes() == b"renamed\0" and t.name == "renamed"
    ggml.free(cp.ctx)
