"""The CPU backend's threadpool (ggviz.ggml.cpu.threadpool) and the executor's trace events.

Results must not depend on the thread count; a persistent pool must survive reuse, pause/resume, aborts, kernel
exceptions and dead workers; chunk claims and the ComputeTimeline / Chrome trace must be well-formed. Every compute
that could hang runs under a timeout guard.
"""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from ggviz import ggml, trace
from ggviz.ggml import consts as C
from ggviz.ggml.cpu import ggml_cpu, mul_mat
from ggviz.ggml.cpu import threadpool as tpm
from tests import graphs as G

MEM = 64 * 1024 * 1024
BUILDERS = ["build_simple_add", "build_q4_0_mul_mat", "build_permute_chain", "build_noop_heavy", "build_llama_block"]


def _build(name="build_llama_block", seed=0):
    ctx = ggml.init(MEM)
    b = getattr(G, name)(ggml, ctx)
    G.fill_leaves(ggml, b["gf"], b["inputs"], seed=seed)
    b["ctx"] = ctx
    return b


def _compute(b, n_threads, tp=None, abort=None):
    plan = ggml.graph_plan(b["gf"], n_threads, tp)
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    plan.abort_callback = abort
    st = ggml.graph_compute(b["gf"], plan)
    return st, ggml.get_data(b["out"]).copy()


def _guarded(fn, timeout=20.0):
    """Run fn() on its own thread (it becomes worker 0); fail the test instead of hanging. Returns/raises fn's."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"graph_compute hung (> {timeout} s)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def pool4():
    tp = ggml.threadpool_new(ggml.threadpool_params_default(4))
    yield tp
    ggml.threadpool_free(tp)


@pytest.fixture(scope="module")
def refs():
    """1-thread results of every builder (disposable pool, the caller's thread only)."""
    out = {}
    for name in BUILDERS:
        st, r = _compute(_build(name), 1)
        assert st == C.GGML_STATUS_SUCCESS
        out[name] = r
    return out


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------------------------------- the API

def test_cpumask_next_places_workers_as_ggml():
    """ggml_thread_cpumask_next, hand-checked: without strict_cpu every worker gets the whole mask; with it, the
    mask's CPUs one by one, round-robin, workers 1..n-1 first and the main thread (worker 0) last."""
    g = [False] * C.GGML_MAX_N_THREADS
    for i in (2, 3, 5):
        g[i] = True
    local = [True] * C.GGML_MAX_N_THREADS
    assert tpm.thread_cpumask_next(g, local, False, 7) == 7 and local == g
    got, it = [], 0
    for _ in range(4):
        it = tpm.thread_cpumask_next(g, local, True, it)
        got.append([i for i, b in enumerate(local) if b])
    assert got == [[2], [3], [5], [2]] and it == 3
    assert not tpm.thread_cpumask_is_valid([False] * 4) and tpm.thread_cpumask_is_valid(g)
    p = ggml.threadpool_params_default(3)
    p.strict_cpu = True
    for i in (2, 3, 5):
        p.cpumask[i] = True
    p.paused = True                         # a paused pool does not pin the caller's thread at creation
    with ggml.threadpool_new(p) as tp:
        assert [[i for i, b in enumerate(w.cpumask) if b] for w in tp.workers] == [[5], [2], [3]]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity")
def test_workers_pin_themselves_to_their_mask():
    """ggml_thread_apply_affinity on Linux: each worker pins its own thread (os.sched_setaffinity(0, ...) acts on
    the calling thread), read back by that thread (cpu.affinity); the main thread's affinity is put back after."""
    cpus = sorted(os.sched_getaffinity(0))
    main_before = set(cpus)
    p = ggml.threadpool_params_default(2)
    p.strict_cpu = True
    p.cpumask[cpus[0]] = True
    p.cpumask[cpus[-1]] = True
    try:
        with trace.Recorder(kinds=["cpu.affinity"]) as rec:
            with ggml.threadpool_new(p) as tp:
                ctx = ggml.init(1 << 20)
                x = ggml.new_tensor_1d(ctx, C.GGML_TYPE_F32, 64)
                gf = ggml.new_graph(ctx)
                ggml.build_forward_expand(gf, ggml.scale(ctx, x, 2.0))
                ggml_cpu.graph_compute(gf, ggml_cpu.graph_plan(gf, 2, tp))   # worker 1 has started by now
        by = {e["ith"]: e for e in rec.events}
        assert by[1]["asked"] == by[1]["now"] == [cpus[0]] and by[1]["ok"]
        assert by[0]["asked"] == by[0]["now"] == [cpus[-1]]
        assert os.sched_getaffinity(0) == {cpus[-1]}            # the caller stays pinned, as in ggml
    finally:
        os.sched_setaffinity(0, main_before)

def test_params_and_api():
    p = ggml.threadpool_params_default(3)
    assert (p.n_threads, p.prio, p.poll, p.strict_cpu, p.paused) == (3, 0, 50, False, False)
    assert len(p.cpumask) == C.GGML_MAX_N_THREADS and not any(p.cpumask)
    q = tpm.ThreadpoolParams(1)
    ggml.threadpool_params_init(q, 3)
    assert ggml.threadpool_params_match(p, q)
    q.paused = True
    assert ggml.threadpool_params_match(p, q)          # ggml does not compare `paused`
    q.poll = 0
    assert not ggml.threadpool_params_match(p, q)
    q.poll, q.cpumask[5] = 50, True
    assert not ggml.threadpool_params_match(p, q)
    with ggml.threadpool_new(p) as tp:
        assert ggml.threadpool_get_n_threads(tp) == 3
        assert tp.workers[0].thrd is None                             # worker 0 is the caller
        assert all(w.thrd.is_alive() for w in tp.workers[1:])
        workers = [w.thrd for w in tp.workers[1:]]
        plan = ggml.graph_plan(_build("build_simple_add")["gf"], 0, tp)   # n_threads <= 0: the pool's
        assert plan.n_threads == 3 and plan.threadpool is tp               # (ADD: n_tasks = n_threads)
    assert not any(t.is_alive() for t in workers)                     # freed: joined
    with pytest.raises(ggml.GGMLError):
        tpm.graph_compute_kickoff(tp, 1)


# ----------------------------------------------------------------------------------- determinism, reuse

@pytest.mark.parametrize("name", BUILDERS)
def test_bitwise_identical_1_to_8_threads(name, refs):
    """Same bytes for n_threads 1..8, with disposable pools and with a pool of 8 used by fewer threads."""
    b = _build(name)
    with ggml.threadpool_new(8) as tp:
        for n in range(1, 9):
            st, out = _guarded(lambda: _compute(b, n))
            assert st == 0 and _same(out, refs[name]), f"{name}: disposable pool, {n} threads"
            with trace.Recorder(["cpu.node", "cpu.kickoff"]) as rec:
                st, out = _guarded(lambda: _compute(b, n, tp))
            assert st == 0 and _same(out, refs[name]), f"{name}: pool of 8, {n} threads"
            plan_n = ggml.graph_plan(b["gf"], n, tp).n_threads
            assert rec.of("cpu.kickoff")[0]["n_threads"] == plan_n
            assert rec.of("cpu.kickoff")[0]["n_graph"] & 0xFFFF == plan_n
            # only the first plan_n workers took part (cplan.n_threads < pool size)
            assert {e["ith"] for e in rec.of("cpu.node")} <= set(range(plan_n))


def test_pool_reused_20_computes(refs, pool4):
    idents = [w.thrd.ident for w in pool4.workers[1:]]
    b = _build("build_llama_block")
    t0 = time.perf_counter()
    for i in range(20):
        st, out = _guarded(lambda: _compute(b, 4, pool4))
        assert st == 0 and _same(out, refs["build_llama_block"]), f"compute {i}"
    assert pool4.n_graph >> tpm.GGML_THREADPOOL_N_THREADS_BITS == 20
    assert pool4.n_graph & tpm.GGML_THREADPOOL_N_THREADS_MASK == 4
    assert [w.thrd.ident for w in pool4.workers[1:]] == idents          # the same threads all along
    assert pool4.n_barrier == 0 and pool4.error is None
    assert time.perf_counter() - t0 < 15


def _wait_for(pred, timeout=5.0):
    t_end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > t_end:
            return False
        time.sleep(0.005)
    return True


def test_pause_resume(refs):
    p = ggml.threadpool_params_default(3)
    p.paused = True
    b = _build("build_llama_block")
    with trace.Recorder(["cpu.pause", "cpu.resume", "cpu.kickoff"]) as rec:
        with ggml.threadpool_new(p) as tp:
            assert tp.pause
            # a kickoff resumes a paused pool
            st, out = _guarded(lambda: _compute(b, 3, tp))
            assert st == 0 and _same(out, refs["build_llama_block"]) and not tp.pause
            assert [e["by"] for e in rec.of("cpu.resume") if e["ith"] is None] == ["kickoff"]
            assert rec.of("cpu.kickoff")[0]["was_paused"]
            # pause: the idle workers go to sleep on the condition ...
            ggml.threadpool_pause(tp)
            ggml.threadpool_pause(tp)                       # idempotent
            assert tp.pause
            asleep = lambda: [e["ith"] for e in rec.of("cpu.pause") if e.get("state") == "asleep"]  # noqa: E731
            awake = lambda: [e["ith"] for e in rec.of("cpu.resume") if e.get("state") == "awake"]  # noqa: E731
            # (the pool was created paused: both workers already slept once, and woke at the kickoff)
            assert _wait_for(lambda: sorted(asleep()) == [1, 1, 2, 2])
            assert sorted(awake()) == [1, 2]
            # ... and wake up on resume
            ggml.threadpool_resume(tp)
            assert not tp.pause
            assert _wait_for(lambda: sorted(awake()) == [1, 1, 2, 2])
            st, out = _guarded(lambda: _compute(b, 3, tp))
            assert st == 0 and _same(out, refs["build_llama_block"])
            # paused again, then computed: the kickoff resumes it once more
            ggml.threadpool_pause(tp)
            st, out = _guarded(lambda: _compute(b, 2, tp))
            assert st == 0 and _same(out, refs["build_llama_block"]) and not tp.pause
    assert [e["by"] for e in rec.of("cpu.pause") if e["ith"] is None] == ["api", "api"]


# ------------------------------------------------------------------------------------------------- abort

@pytest.mark.parametrize("n_threads", [1, 4])
@pytest.mark.parametrize("after", [1, 3, 7])
def test_abort_callback_stops_within_one_node(n_threads, after, refs, pool4):
    b = _build("build_llama_block")
    calls = []

    def abort(data):
        calls.append(threading.get_ident())
        return len(calls) >= after

    with trace.Recorder(["cpu.node", "cpu.abort", "cpu.barrier"]) as rec:
        st, _ = _guarded(lambda: _compute(b, n_threads, pool4, abort))
    assert st == C.GGML_STATUS_ABORTED
    assert len(calls) == after and set(calls) == {calls[0]}            # thread 0, once per node it computed
    (ab,) = rec.of("cpu.abort")
    nodes = rec.of("cpu.node")
    # thread 0 computed exactly `after` nodes; nobody computed a node past the one after which it aborted
    assert len([e for e in nodes if e["ith"] == 0]) == after
    assert max(e["node_n"] for e in nodes) == ab["node_n"] < ab["abort"]
    n_nodes = b["gf"].n_nodes
    assert ab["abort"] < n_nodes
    for ith in range(n_threads):
        assert max(e["node_n"] for e in nodes if e["ith"] == ith) <= ab["node_n"]
    if n_threads > 1:
        assert {e["ith"] for e in rec.of("cpu.barrier") if e["where"] == "final"} == set(range(n_threads))
    # the pool computes the next graph fully
    st, out = _guarded(lambda: _compute(b, n_threads, pool4))
    assert st == 0 and _same(out, refs["build_llama_block"])


def test_abort_disposable_pool():
    b = _build("build_llama_block")
    st, _ = _guarded(lambda: _compute(b, 2, None, lambda d: True))
    assert st == C.GGML_STATUS_ABORTED


# ------------------------------------------------------------------------------------------- failures

def _patch_kernel(monkeypatch, op, kernel_factory):
    """Wrap the executor's dispatch table entry for ``op`` (whatever _dispatch builds it from)."""
    orig_dispatch = ggml_cpu._dispatch

    def dispatch():
        table, ops = orig_dispatch()
        table = dict(table)
        table[op] = kernel_factory(table[op])
        return table, ops
    monkeypatch.setattr(ggml_cpu, "_dispatch", dispatch)


def _failing(when, bad_ith=2):
    def factory(orig):
        def kernel(params, dst):
            if when == "before" and params.ith == bad_ith:
                raise ValueError("injected failure")
            if when in ("before", "after"):
                params.barrier()                 # every thread (but a failed one) meets here first
            if when == "after" and params.ith == bad_ith:
                raise ValueError("injected failure")
            orig(params, dst)
            if when == "end" and params.ith == bad_ith:
                raise ValueError("injected failure")
        return kernel
    return factory


@pytest.mark.parametrize("when", ["before", "after", "end"])
@pytest.mark.parametrize("op", [C.GGML_OP_ADD, C.GGML_OP_MUL_MAT])
def test_worker_exception_reaches_caller_and_pool_survives(monkeypatch, when, op, refs, pool4):
    b = _build("build_llama_block")
    _patch_kernel(monkeypatch, op, _failing(when))
    first = next(i for i, t in enumerate(b["gf"].nodes) if t.op == op)
    with trace.Recorder(["cpu.worker_error"]) as rec:
        with pytest.raises(ggml.GGMLError) as ei:
            _guarded(lambda: _compute(b, 4, pool4))
    msg = str(ei.value)
    node = b["gf"].nodes[first]
    assert "thread 2" in msg and f"node {first} {node.name!r}" in msg and "injected failure" in msg, msg
    errs = rec.of("cpu.worker_error")
    assert errs and errs[0]["ith"] == 2 and errs[0]["node_n"] == first and errs[0]["first"]
    assert all(w.done_graph == pool4.n_graph for w in pool4.workers[1:])   # everybody left the graph
    monkeypatch.undo()
    st, out = _guarded(lambda: _compute(b, 4, pool4))
    assert st == 0 and _same(out, refs["build_llama_block"])
    st, out = _guarded(lambda: _compute(b, 3, pool4))
    assert st == 0 and _same(out, refs["build_llama_block"])


def test_exception_in_thread0_and_disposable(monkeypatch, refs):
    b = _build("build_llama_block")
    _patch_kernel(monkeypatch, C.GGML_OP_ADD, _failing("after", bad_ith=0))
    with pytest.raises(ggml.GGMLError, match="thread 0: computing node"):
        _guarded(lambda: _compute(b, 4))
    monkeypatch.undo()
    st, out = _guarded(lambda: _compute(b, 4))
    assert st == 0 and _same(out, refs["build_llama_block"])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_worker_is_reported_and_replaced(monkeypatch, refs, pool4):
    b = _build("build_llama_block")
    orig = tpm._run_graph

    def run_graph(state):
        if state.ith == 1:
            raise RuntimeError("worker killed")      # escapes the worker's loop: the thread ends
        orig(state)
    monkeypatch.setattr(tpm, "_run_graph", run_graph)
    with pytest.raises(tpm.ThreadpoolError, match="worker thread 1 died"):
        _guarded(lambda: _compute(b, 4, pool4))
    assert _wait_for(lambda: not pool4.workers[1].thrd.is_alive())
    monkeypatch.undo()
    st, out = _guarded(lambda: _compute(b, 4, pool4))        # the kickoff restarts worker 1
    assert st == 0 and _same(out, refs["build_llama_block"])
    assert pool4.workers[1].thrd.is_alive()


def test_stuck_worker_times_out_with_a_clear_error(monkeypatch):
    b = _build("build_simple_add")
    monkeypatch.setattr(tpm, "HANG_TIMEOUT_S", 0.3)
    release = threading.Event()

    def factory(orig):
        def kernel(params, dst):
            if params.ith == 1:
                release.wait(10)                    # a kernel that never returns (until the test lets it)
            orig(params, dst)
        return kernel
    _patch_kernel(monkeypatch, C.GGML_OP_ADD, factory)
    tp = ggml.threadpool_new(2)
    try:
        with pytest.raises(tpm.ThreadpoolError, match="GGVIZ_HANG_TIMEOUT"):
            _guarded(lambda: _compute(b, 2, tp), timeout=10)
        assert tp.broken
        with pytest.raises(tpm.ThreadpoolError, match="unusable"):
            _guarded(lambda: _compute(b, 2, tp), timeout=10)
    finally:
        release.set()
        ggml.threadpool_free(tp)


def test_second_caller_on_a_busy_pool_is_refused(monkeypatch, refs, pool4):
    b = _build("build_llama_block")
    inside, release = threading.Event(), threading.Event()

    def factory(orig):
        def kernel(params, dst):
            if params.ith == 1:
                inside.set()
                release.wait(10)
            orig(params, dst)
        return kernel
    _patch_kernel(monkeypatch, C.GGML_OP_ADD, factory)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=_compute(b, 4, pool4)), daemon=True)
    t.start()
    try:
        assert inside.wait(10)
        with pytest.raises(tpm.ThreadpoolError, match="already computing"):
            _guarded(lambda: _compute(_build("build_simple_add"), 2, pool4))
    finally:
        release.set()
        t.join(20)
    assert not t.is_alive()
    st, out = box["r"]
    assert st == 0 and _same(out, refs["build_llama_block"])
    monkeypatch.undo()
    st, out = _guarded(lambda: _compute(b, 4, pool4))
    assert st == 0 and _same(out, refs["build_llama_block"])


# ---------------------------------------------------------------------------------------------- chunks

@pytest.mark.parametrize("type_", [C.GGML_TYPE_F32, C.GGML_TYPE_Q4_0])
def test_chunk_claims_cover_every_chunk_once(type_, monkeypatch):
    # F32: llamafile's tinyBLAS claims its jobs from current_chunk like ggml's chunks; Q4_0: tinyBLAS_Q0 splits
    # statically (nothing to claim), so the chunked vec_dot path is shown as a build without GGML_USE_LLAMAFILE runs it
    if type_ == C.GGML_TYPE_Q4_0:
        monkeypatch.setattr(mul_mat, "USE_LLAMAFILE", False)
    ctx = ggml.init(MEM)
    w = ggml.new_tensor_2d(ctx, type_, 576, 1536)
    ggml.set_name(w, "w.weight")
    x = ggml.new_tensor_2d(ctx, C.GGML_TYPE_F32, 576, 64)
    ggml.set_name(x, "x")
    y = ggml.mul_mat(ctx, w, x)
    ggml.set_name(y, "y")
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, y)
    G.fill_leaves(ggml, gf)
    b = dict(gf=gf, out=y)
    _, ref = _compute(b, 1)
    with ggml.threadpool_new(4) as tp:
        with trace.ComputeTimeline() as tl:
            st, out = _guarded(lambda: _compute(b, 4, tp))
    assert st == 0 and _same(out, ref)
    chunks = [c for ln in tl.threads.values() for c in ln["chunks"]]
    nchunk0, nchunk1 = chunks[0]["nchunk"]
    assert nchunk0 * nchunk1 >= 16
    assert sorted(c["chunk"] for c in chunks) == list(range(nchunk0 * nchunk1))      # each exactly once
    cover = np.zeros((1536, 64), np.int32)
    for c in chunks:
        cover[c["ir0"][0]:c["ir0"][1], c["ir1"][0]:c["ir1"][1]] += 1
    assert (cover == 1).all()
    assert set(tl.threads) == {0, 1, 2, 3}
    for ith, ln in tl.threads.items():
        # a thread starts with chunk ith, then claims increasing chunks from current_chunk (starting at nth)
        ids = [c["chunk"] for c in ln["chunks"]]
        assert ids[0] == ith and all(i >= 4 for i in ids[1:]) and ids == sorted(ids)
        assert all(c["node_n"] == 0 for c in ln["chunks"])


# ----------------------------------------------------------------------------------- timeline, Chrome JSON

def _laminar(spans, tol=0.0):
    """Spans (a, b) on one thread are pairwise disjoint or nested."""
    spans = sorted(spans, key=lambda s: (s[0], -s[1]))
    stack = []
    for a, b in spans:
        while stack and stack[-1][1] <= a + tol:
            stack.pop()
        if stack and b > stack[-1][1] + tol:
            return False
        stack.append((a, b))
    return True


def test_compute_timeline_and_chrome_trace(pool4):
    b = _build("build_llama_block")
    with trace.ComputeTimeline() as tl:
        for _ in range(2):
            st, _ = _guarded(lambda: _compute(b, 4, pool4))
            assert st == 0
    assert len(tl.computes) == 2
    c = tl.last
    assert c["status"] == 0 and c["n_threads"] == 4 and c["n_graph"] == pool4.n_graph and not c["errors"]
    assert set(c["threads"]) == {0, 1, 2, 3}
    computed = [i for i, t in enumerate(b["gf"].nodes) if not ggml.op_is_empty(t.op)]
    for ith, ln in c["threads"].items():
        top = [(s["t_start"], s["t_end"]) for s in ln["nodes"]]
        top += [(x["t_enter"], x["t_exit"]) for x in ln["barriers"] if x["where"] != "kernel"]
        top.sort()
        assert all(top[i][1] <= top[i + 1][0] for i in range(len(top) - 1)), f"thread {ith}: overlapping spans"
        node_spans = {s["node_n"]: s for s in ln["nodes"]}
        assert set(node_spans) <= set(computed) and len(node_spans) == len(ln["nodes"])
        # a fused RMS_NORM + MUL is one span, reported at the RMS_NORM; the barrier after it names the MUL
        fused = {s["node_n"] + 1: s for s in ln["nodes"] if s["fused"]}
        assert fused, "the llama block's rms_norm + mul should be fused"
        node_spans.update(fused)
        for x in ln["barriers"]:
            if x["where"] == "node":      # the barrier records the node it follows
                assert node_spans[x["node_n"]]["t_end"] <= x["t_enter"]
                assert x["name"] == b["gf"].nodes[x["node_n"]].name
            elif x["where"] == "kernel":  # ... or the node whose kernel waits in it
                s = node_spans[x["node_n"]]
                assert s["t_start"] <= x["t_enter"] and x["t_exit"] <= s["t_end"]
        assert [x["where"] for x in ln["barriers"]][-1] == "final"
        for ch in ln["chunks"]:
            s = node_spans[ch["node_n"]]
            assert s["t_start"] <= ch["t_start"] <= ch["t_end"] <= s["t_end"]
    # all threads pass the same barriers (same seq numbers)
    seqs = [[x["seq"] for x in ln["barriers"]] for ln in c["threads"].values()]
    assert all(s == seqs[0] for s in seqs)

    ct = tl.to_chrome_trace()
    doc = json.loads(json.dumps(ct))
    evs = doc["traceEvents"]
    xs = [e for e in evs if e["ph"] == "X"]
    assert xs
    for e in xs:
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert {"name", "pid", "tid", "cat"} <= set(e)
    named = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in xs} <= named
    assert {e["cat"] for e in xs} == {"compute", "node", "barrier", "chunk"}
    for key in {(e["pid"], e["tid"]) for e in xs}:
        mine = [e for e in xs if (e["pid"], e["tid"]) == key]
        assert _laminar([(e["ts"], e["ts"] + e["dur"]) for e in mine], tol=1e-3), key
        top = sorted((e["ts"], e["ts"] + e["dur"]) for e in mine
                     if e["cat"] == "node" or (e["cat"] == "barrier" and e["args"]["where"] != "kernel"))
        assert all(top[i][1] <= top[i + 1][0] + 1e-3 for i in range(len(top) - 1))
    one = tl.to_chrome_trace(0)["traceEvents"]
    assert len([e for e in one if e["ph"] == "X" and e["cat"] == "compute"]) == 1


def test_timeline_of_failed_and_aborted_computes(monkeypatch, pool4):
    b = _build("build_llama_block")
    with trace.ComputeTimeline() as tl:
        _guarded(lambda: _compute(b, 4, pool4, lambda d: True))
        _patch_kernel(monkeypatch, C.GGML_OP_ADD, _failing("before"))
        with pytest.raises(ggml.GGMLError):
            _guarded(lambda: _compute(b, 4, pool4))
    aborted, failed = tl.computes
    assert aborted["status"] == C.GGML_STATUS_ABORTED and aborted["abort"]["abort"] >= 1
    assert failed["status"] is None and failed["errors"][0]["ith"] == 2
    evs = tl.to_chrome_trace()["traceEvents"]
    assert {e["name"] for e in evs if e["ph"] == "i"} == {"abort", "worker_error"}


def test_recorder_by_kind(monkeypatch):
    monkeypatch.setattr(mul_mat, "USE_LLAMAFILE", False)      # Q4_0 through ggml's vec_dot chunks (cpu.chunk events)
    b = _build("build_q4_0_mul_mat")
    with trace.Recorder() as rec:
        _guarded(lambda: _compute(b, 2))
    bk = rec.by_kind()
    assert list(bk)[0] == "cpu.plan" or "cpu.compute.start" in bk
    assert sum(len(v) for v in bk.values()) == len(rec.events)
    for k in ("cpu.compute.start", "cpu.kickoff", "cpu.node", "cpu.chunk", "cpu.barrier", "cpu.compute.end"):
        assert bk[k] and all(e["kind"] == k for e in bk[k])
