"""Tracing the compiled CPU walk (ggviz/ggml/cpu/fast/: compiler.FastGraph + the kernels' trace log).

A traced compute on the fast path stays compiled: every thread logs its node spans, barrier waits and MUL_MAT chunk
claims into an array and the executor hands the log over as one ``trace.Batch``. These tests check that what comes
out is what the walk did, by ggml's rules rather than by the log's own word:

* results are bit-identical with and without a listener;
* every thread that took part has one node span per program row, in program order, non-overlapping, and the
  node indices/names are the graph's;
* every thread passes the same barriers (ggml's barrier: all threads, same sequence numbers), one per node but the
  last, one in every MUL_MAT kernel (after src1's conversion; two more per matrix in tinyBLAS) and the final one;
* the MUL_MAT chunks claimed by all threads together are each chunk of ggml's chunking exactly once, and their row
  ranges tile the output;
* a listener that does not take batches gets the same events one by one; kind filters apply to batches.
"""
from __future__ import annotations


import numpy as np
import pytest


from ggviz import ggml, trace
from ggviz.ggml import consts as C
program = pytest.importorskip("ggviz.ggml.cpu.fast.program")
compiler = pytest.importorskip("ggviz.ggml.cpu.fast.compiler", reason="the compiled fast path needs Numba")
from ggviz.ggml.cpu import ggml_cpu  # noqa: E402 - after the importorskip


from test_fast_path import _f32, _fill, _weight_ctx  # noqa: E402 - after the importorskip

F32, F16, Q4_1 = C.GGML_TYPE_F32, C.GGML_TYPE_F16, C.GGML_TYPE_Q4_1


def _graph(T=3, seed=0):
    """A small llama-like chain: rms_norm*w -> repacked Q4_1 MUL_MAT -> F16 KQ MUL_MAT -> soft_max -> F32 MUL_MAT."""
    rng = np.random.default_rng(seed)
    w, keep = _weight_ctx(Q4_1, 192, 64, rng, place=True)
    ctx = ggml.init(64 << 20)
    x = _f32(ctx, rng, 64, T)
    nw = _f32(ctx, rng, 64)
    cur = ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-5), nw)
    q = ggml.mul_mat(ctx, w, cur)                                          # [192, T] (repacked)
    q = ggml.permute(ctx, ggml.reshape_3d(ctx, q, 64, 3, T), 0, 2, 1, 3)   # [64, T, 3]
    kc = ggml.new_tensor_3d(ctx, F16, 64, 3, 40)
    _fill(kc, rng.standard_normal(64 * 3 * 40).astype(np.float16))
    k = ggml.permute(ctx, kc, 0, 2, 1, 3)                                  # [64, 40, 3]
    kq = ggml.soft_max(ctx, ggml.mul_mat(ctx, k, q))                       # [40, T, 3]
    v = _f32(ctx, rng, 40, 24)
    out = ggml.mul_mat(ctx, v, ggml.cont_2d(ctx, kq, 40, T * 3))           # [24, T*3] (F32 src0)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, out)
    return gf, out, (ctx, keep)


def _compute(gf, nth):
    plan = ggml_cpu.graph_plan(gf, nth)
    assert plan.extra is not None, "the graph should take the compiled walk"
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS
    return plan.extra


def _kernel_barriers(fg, k):
    """ggml's barriers inside a MUL_MAT: one after src1's conversion; with llamafile's tinyBLAS (which takes the F16
    KQ after the conversion and the contiguous F32 x F32 before it, returning at once) two per matrix."""
    from ggviz.ggml.cpu.fast.sgemm import row_kernel
    if row_kernel(fg.P, k) != "sgemm":
        return 1
    mats = int(fg.P[k, program.S1 + program.NE2]) * int(fg.P[k, program.S1 + program.NE3])
    return 2 * mats + (1 if fg.P[k, program.MMF_TYPE] == C.GGML_TYPE_F16 else 0)


@pytest.mark.parametrize("nth", [1, 2, 3])
def test_traced_compiled_walk(nth):
    gf, out, keep = _graph()
    _compute(gf, nth)
    plain = np.array(ggml.get_data(out), copy=True)
    with trace.ComputeTimeline() as tl:
        fg = _compute(gf, nth)
    assert np.array_equal(plain.view(np.uint32), np.asarray(ggml.get_data(out)).view(np.uint32))

    c = tl.last
    # the compiled walk runs on at most as many threads as there are CPUs (compiler.N_CPUS); a pool thread beyond
    # that only waits in the pool's final barrier
    lanes = {ith: ln for ith, ln in c["threads"].items() if ln["nodes"]}
    n_use = len(lanes)
    assert 1 <= n_use <= min(nth, compiler.N_CPUS)
    assert sorted(lanes) == list(range(n_use))
    for ith, ln in c["threads"].items():
        if ith not in lanes:
            assert [b["where"] for b in ln["barriers"]] == ["final"] and not ln["chunks"]
    rows = len(fg)
    mm_rows = [k for k in range(rows) if fg.P[k, program.OP] in (program.OP_MUL_MAT_Q, program.OP_MUL_MAT_F)]
    assert len(mm_rows) == 3
    seqs = None
    for ith, ln in lanes.items():
        nodes = ln["nodes"]
        assert [s["node_n"] for s in nodes] == list(fg.node_index)
        assert [s["name"] for s in nodes] == [gf.nodes[i].name for i in fg.node_index]
        assert all(s["t_start"] <= s["t_end"] for s in nodes)
        assert all(a["t_end"] <= b["t_start"] for a, b in zip(nodes, nodes[1:]))
        fused = [s for s in nodes if s["fused"]]
        assert [s["op"] for s in fused] == ["RMS_NORM"]            # the RMS_NORM+MUL fusion is one row
        bars = ln["barriers"]
        if n_use == 1:
            # ggml_barrier returns at once for one thread; only the pool's final barrier (if the pool has more)
            assert [b["where"] for b in bars] == (["final"] if nth > 1 else [])
            continue
        where = [b["where"] for b in bars]
        assert where.count("node") == rows - 1
        assert where.count("kernel") == sum(_kernel_barriers(fg, k) for k in mm_rows)
        assert where.count("final") == 2                           # the compiled walk's and the pool's own
        compiled = [b for b in bars if b.get("where") != "final" or b["node_n"] == gf.n_nodes]
        s = [b["seq"] for b in compiled if b["where"] != "final"]
        assert s == sorted(s) and len(set(s)) == len(s)             # one generation per barrier
        if seqs is None:
            seqs = s
        assert s == seqs                                            # every thread passes the same barriers

    chunks = [ch for ln in lanes.values() for ch in ln["chunks"]]
    by_node: dict = {}
    for ch in chunks:
        by_node.setdefault(ch["node"], []).append(ch)
    assert set(by_node) == {gf.nodes[fg.node_index[k]].name for k in mm_rows}
    for name, chs in by_node.items():
        n0, n1 = chs[0]["nchunk"]
        assert sorted(ch["chunk"] for ch in chs) == list(range(n0 * n1)), name
        node = next(t for t in gf.nodes if t.name == name)
        cover = np.zeros((int(node.ne[0]), int(node.ne[1] * node.ne[2])), np.int64)
        for ch in chs:
            cover[ch["ir0"][0]:ch["ir0"][1], ch["ir1"][0]:ch["ir1"][1]] += 1
        assert (cover == 1).all(), name                             # the chunks tile dst exactly once
        assert all(ch["node_n"] == gf.nodes.index(node) for ch in chs)

    ct = tl.to_chrome_trace()
    xs = [e for e in ct["traceEvents"] if e.get("ph") == "X"]
    assert sum(e["cat"] == "node" for e in xs) == rows * n_use
    assert sum(e["cat"] == "chunk" for e in xs) == len(chunks)


def test_plain_listener_and_kind_filter():
    gf, out, keep = _graph(T=2)
    got = []

    def plain(ev):                     # no accepts_batches: gets every event on its own
        got.append(ev)

    trace.listen(plain)
    try:
        with trace.Recorder() as rec, trace.Recorder(kinds={"cpu.chunk"}) as only_chunks:
            _compute(gf, 2)
    finally:
        trace.unlisten(plain)
    assert not trace.active
    kinds = lambda evs: sorted(e["kind"] for e in evs)  # noqa: E731
    assert kinds(got) == kinds(rec.events)
    assert rec.n_events == len(rec.events)
    assert only_chunks.events and all(e["kind"] == "cpu.chunk" for e in only_chunks.events)
    assert len(only_chunks.events) == sum(e["kind"] == "cpu.chunk" for e in rec.events)
    assert all(e.get("compiled") for e in rec.events if e["kind"] == "cpu.node")
    rec.clear()
    assert rec.events == [] and rec.n_events == 0


def test_untraced_compute_leaves_no_log():
    gf, out, keep = _graph()
    fg = _compute(gf, 2)
    with trace.Recorder():
        _compute(gf, 2)
    assert fg.sync[program.SYNC_TRACE] == 0                              # logging stops with the compute
    _compute(gf, 2)
    assert fg.sync[program.SYNC_TRACE] == 0
