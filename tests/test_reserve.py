"""llama_context's worst-case reserve at creation (llama_context::sched_reserve), against llama.cpp.

tests/data/llamacpp/smollm2_compute_buffers.json holds llama.cpp's compute buffer size (exact bytes, read with
ggml_backend_sched_get_buffer_size; and the logged MiB line) for several n_ctx / n_batch / n_ubatch settings
(tools/capture_llamacpp_compute_buffers.py). ggviz must reserve the same number of bytes, in llama.cpp's order of
graphs (pp, tg, pp again), and a decode must never grow the buffers afterwards.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggviz import llama, trace

DATA = Path(__file__).parent / "data" / "llamacpp"
MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
REF = json.load(open(DATA / "smollm2_compute_buffers.json"))


@pytest.fixture(scope="module")
def model():
    from ggviz.run import load_model
    return load_model(MODEL if MODEL.exists() else None)     # llama.model_default_params(), cached per process


def _ctx(model, n_ctx, n_batch, n_ubatch, threads=1):
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_ubatch
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return llama.init_from_model(model, cp)


@pytest.mark.parametrize("row", REF["settings"],
                         ids=[f"ctx{r['n_ctx_param']}-b{r['n_batch_param']}-ub{r['n_ubatch_param']}"
                              for r in REF["settings"]])
def test_compute_buffer_size_matches_llamacpp(model, row):
    with trace.recording(("llama.graph_reserve", "llama.sched_reserve")) as rec:
        ctx = _ctx(model, row["n_ctx_param"], row["n_batch_param"], row["n_ubatch_param"])
    assert (ctx.n_ctx, ctx.n_batch, ctx.n_ubatch) == (row["n_ctx"], row["n_batch"], row["n_ubatch"])
    # the exact bytes per buffer type (ggviz adds a BLAS backend that shares the CPU buffer type: one buffer)
    assert ctx.compute_buffer_sizes() == row["bytes"]
    # ... and llama.cpp's log line, to its 2 decimals
    for name, mib in row["log_mib"].items():
        assert f"sched_reserve: {name:>10s} compute buffer size = {mib:8.2f} MiB" in ctx.compute_buffer_log()
    # llama.cpp's reserves: three 1-token probes of its fused DeepSeek-V4 ops (split only, nothing allocated;
    # not mirrored), then pp, tg, pp
    ref_graphs = row["graph_reserve"][-3:]
    assert [dict(n_tokens=e["n_tokens"], n_seqs=e["n_seqs"], n_outputs=e["n_outputs"]) for e in ctx.reserve_log] \
        == ref_graphs
    assert all(e["n_kv"] == ctx.n_ctx and e["n_nodes"] == 1086 and not e["split_only"] for e in ctx.reserve_log)
    assert all(e == dict(n_tokens=1, n_seqs=1, n_outputs=1) for e in row["graph_reserve"][:-3])
    # the trace: one event per graph reserve, then the sizes
    kinds = [e["kind"] for e in rec.events]
    assert kinds == ["llama.graph_reserve"] * 3 + ["llama.sched_reserve"]
    last = rec.events[-1]
    assert sum(last["sizes"].values()) == sum(row["bytes"].values()) and last["n_nodes_pp"] == 1086


def test_reserve_graph_has_the_embeddings_input(model):
    """llama.cpp's build_inp_embd adds an F32 [n_embd, n_tokens] input ``inp_embd`` next to the token ids
    (ggml_build_forward_select picks the token path): a leaf no node reads, yet the allocator places it, and it is
    part of the reserved size."""
    ctx = _ctx(model, 256, 256, 64)
    res = ctx.graph_reserve(64, 1, 64)
    leafs = {t.name: t for t in res.gf.leafs}
    assert "inp_embd" in leafs and list(leafs["inp_embd"].shape)[:2] == [576, 64]
    assert not any(leafs["inp_embd"] is s for n in res.gf.nodes for s in n.src)
    assert res.gf.nodes[0].name == "embd" and res.inputs.embd is leafs["inp_embd"]
    assert ctx.check_compute_buffers() == []


def test_decode_does_not_grow_the_buffers(model):
    """After the reserve, a prefill and 16 generated tokens allocate every graph inside the reserved buffers: no
    ggml_gallocr buffer is (re)allocated, and the sizes stay llama.cpp's (which it also reads after its decode)."""
    row = next(r for r in REF["settings"] if (r["n_ctx_param"], r["n_ubatch_param"]) == (512, 512))
    ctx = _ctx(model, 512, 512, 512, threads=2)
    vocab = llama.model_get_vocab(model)
    ids = llama.tokenize(vocab, "The capital of France is", add_special=True)
    with trace.recording(("alloc.reserve", "sched.alloc", "llama.graph_reserve", "llama.graph_reuse")) as rec:
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        for _ in range(16):
            tok = int(np.argmax(llama.get_logits_ith(ctx, -1)))
            assert llama.decode(ctx, llama.batch_get_one([tok])) == 0
    reallocs = [e["reallocated"] for e in rec.events if e["kind"] == "alloc.reserve" and e["reallocated"]]
    assert reallocs == []
    assert not any(e["kind"] == "llama.graph_reserve" for e in rec.events)
    allocs = [e for e in rec.events if e["kind"] == "sched.alloc"]
    assert allocs and all(e["ok"] for e in allocs)
    assert ctx.check_compute_buffers() == []
    assert ctx.compute_buffer_sizes() == row["bytes_after_decode"]


def test_sched_need_reserve_reserves_before_the_next_decode(model):
    ctx = _ctx(model, 256, 256, 32)
    n0 = len(ctx.reserve_log)
    assert n0 == 3 and not ctx.sched_need_reserve
    ctx.sched_need_reserve = True          # what llama.cpp's setters (set_causal_attn, adapters ...) do
    with trace.recording(("llama.sched_reserve",)) as rec:
        assert llama.decode(ctx, llama.batch_get_one([1, 2, 3])) == 0
    assert [e["kind"] for e in rec.events] == ["llama.sched_reserve"] and not ctx.sched_need_reserve
    assert len(ctx.reserve_log) == 3 and ctx.check_compute_buffers() == []


def _plan_of(ctx):
    """The allocator's plan and the scheduler's split as the reserve left them, as plain data."""
    sched = ctx.sched
    g = sched.galloc
    ta = lambda a: (a.buffer_id, a.addr, a.size_max)     # noqa: E731
    chunks = [[(ch.max_size, [(b.offset, b.size) for b in ch.free_blocks]) for ch in t.chunks] for t in g.buf_tallocs]
    return dict(nodes=[(ta(na.dst), [ta(s) for s in na.src]) for na in g.node_allocs[:g.n_nodes]],
                leafs=[ta(la.leaf) for la in g.leaf_allocs[:g.n_leafs]], n=(g.n_nodes, g.n_leafs), chunks=chunks,
                last_alloc={k: v for k, v in g.last_alloc.items() if k != "tensors"},
                tensors=[sorted((k, v) for k, v in r.items() if k != "addr") for r in g.last_alloc["tensors"]],
                splits=sched.n_splits, sizes=ctx.compute_buffer_sizes(),
                # (whether the pp graph was copied from the probe's: only without a trace listener, graph_copy)
                log=[{k: v for k, v in e.items() if k != "copied"} for e in ctx.reserve_log])


def test_third_reserve_puts_back_the_same_plan(model):
    """sched_reserve's third reserve (the pp graph again) puts the first one's allocator plan back
    (sched.backend_sched_reserve_again) unless a trace listener is active: both ways leave the same plan, split and
    sizes, and the prompt after it runs at the same addresses."""
    def make():
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch = 512, 1, 1
        return llama.init_from_model(model, cp)
    from ggviz.llama.context_pool import context_pool_clear
    fast = make()
    st = _plan_of(fast)
    llama.free(fast)
    context_pool_clear(model)
    with trace.recording(("alloc.reserve",)) as rec:
        real = make()
    assert len(rec.events) == 3          # the real passes ran: pp, tg, pp
    assert _plan_of(real) == st
    assert st["last_alloc"]["reallocated"] == [] and st["n"][0] == st["nodes"].__len__() > 0
    llama.free(real)
    context_pool_clear(model)


def test_token_generation_reserve_splits_what_the_probe_split(model, monkeypatch):
    """With flash attention AUTO the tg reserve reserves the probe's graph again (not rebuilt, one backend): the
    build's scheduler pins (graph_get_cb's norms, cause "usr") are made again, as llama.cpp's rebuild makes them, so
    its split -- every tensor's backend and cause, the split graph's backend ids -- is the probe's. It takes passes
    1-4 from the probe's split memo; the pp reserves (a copy of the probe's graph, without the pins) take it too,
    moved to the copy and unpinned (sched._split_memo_move): the same result as the passes run with the memo off."""
    from ggviz.ggml import sched as gs
    from ggviz.llama.context_pool import context_pool_clear

    def create():
        seen = []
        real = gs.backend_sched_split_graph

        def split(sched, graph):
            real(sched, graph)
            seen.append(([(t.name, sched.hv_tensor_backend_ids[sched._slot[t.addr]],
                           sched.causes.get(sched._slot[t.addr], "")) for t in list(graph.leafs) + list(graph.nodes)],
                         sched.node_backend_ids[:sched.graph.n_nodes], sched.n_splits))
        monkeypatch.setattr(gs, "backend_sched_split_graph", split)
        context_pool_clear(model)
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch = 512, 1, 1
        ctx = llama.init_from_model(model, cp)
        out = (seen, (ctx.sched.n_split_memo, ctx.sched.n_split_memo_moved), ctx.reserve_log,
               ctx.compute_buffer_sizes(), ctx.flash_attn)
        llama.free(ctx)
        context_pool_clear(model)
        monkeypatch.undo()
        return out

    memo = create()
    monkeypatch.setattr(gs, "_split_memo_match", lambda sched, graph: None)
    passes = create()
    assert [e["split_only"] for e in memo[2]] == [True, False, False, False] and memo[4] is True
    probe, pp, tg, pp2 = memo[0]
    assert sum(c == "usr" for _, _, c in probe[0]) > 0       # the 1-token graph pins its norms (n_tokens < 32)
    assert tg == probe and pp2 == pp and not any(c == "usr" for _, _, c in pp[0])
    assert memo[1] == (3, 2) and passes[1] == (0, 0)
    assert memo[0] == passes[0] and memo[2:] == passes[2:]
