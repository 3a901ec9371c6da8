"""PowerInfer's hybrid run through llama_decode: the FFN split in the simulated accelerator's memory
(ggviz/llama/powerinfer.py load_gpu_split), ``llama_context_params.hybrid`` (ggviz/llama/context.py) and the hybrid
executor with its device lane (ggviz/ggml/cpu/hybrid.py).

A tiny build (16 training tokens, a 16-wide predictor) with a VRAM budget that leaves 512-768 hot neurons per layer
(of 1536) makes a real hot/cold split in about 10 s. Oracles: the gpuidx file and the model's host rows (the device
copies), the same graph computed by the CPU alone (``ggml_graph_compute``) and by ggml_backend_sched's splits
(bit-identical logits), the graph itself (which tensors are activations, their byte sizes) for the bytes the
device counts, and the recorded timeline against the graph's dependencies.
"""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from ggviz import ggml, llama, trace
from ggviz import run as grun
from ggviz.ggml import accel
from ggviz.ggml import backend as B
from ggviz.ggml.cpu import ggml_cpu, hybrid
from ggviz.ggml.cpu import powerinfer as cpu_pi
from ggviz.llama import powerinfer as lp
from ggviz.llama.context import ContextParamsError
from ggviz.powerinfer import pipeline, solver

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="needs data/models/SmolLM2-135M-Instruct.Q4_1.gguf")

LOAD_STATS: dict = {}
PROMPT = [1]            # one token: the step after it has the same graph shape (reused, as llama.cpp does)
NEXT = 42


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """(model with the FFN split on its own ACCEL device, the device, the build)."""
    out = tmp_path_factory.mktemp("pinfer_hybrid")
    old = cpu_pi.sparse_pred_threshold
    r = pipeline.build(out, MODEL, tokens=16, heldout=8, seq_len=24, hidden=16, epochs=1, threshold=0.0,
                       vram_budget_gib=0.075, quiet=True)
    dev = accel.backend_accel_device_new("ACCEL_HYB")       # its own device: its counters are this module's
    mp = llama.model_default_params()
    mp.vram_budget_gb = 0.075
    mp.devices = [dev]
    m = llama.model_load_from_file(str(r.model_path), mp)
    LOAD_STATS.update(accel.backend_accel_stats(dev))
    yield m, dev, r
    llama.model_free(m)
    cpu_pi.set_sparse_pred_threshold(old)


def _ctx(m, hybrid_on: bool, n_threads: int):
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 64, 8, 8
    cp.n_threads = cp.n_threads_batch = n_threads
    cp.hybrid = hybrid_on
    return llama.init_from_model(m, cp)


def _decode(ctx, ids) -> np.ndarray:
    assert llama.decode(ctx, llama.batch_get_one(np.array(ids, np.int32))) == 0
    return np.array(ctx.get_logits_ith(-1), copy=True)


@pytest.fixture(scope="module")
def runs(split):
    """The hybrid run (3 threads: thread 0 the device, 2 CPU threads) and the scheduler's run (2 CPU threads, so that
    every CPU kernel splits its work alike): prompt, then one decode step, with the device's counters and the trace
    of that step."""
    m, dev, _ = split
    ctx = _ctx(m, True, 3)
    _decode(ctx, PROMPT)
    before = accel.backend_accel_stats(dev)
    inputs = {}

    def keep_inputs(res):
        # the graph's inputs, as set for this step (the allocator hands their memory to later nodes)
        inputs.update({t.addr: (t, np.array(B._bytes_at(t.data, ggml.nbytes(t)), copy=True))
                       for t in res.gf.leafs if t.flags & ggml.GGML_TENSOR_FLAG_INPUT})
    ctx.graph_hook = keep_inputs
    with trace.recording(("hybrid.node", "hybrid.graph", "hybrid.graph.end", "accel.transfer")) as rec:
        logits = _decode(ctx, [NEXT])
    ctx.graph_hook = None
    after = accel.backend_accel_stats(dev)
    sched = _ctx(m, False, 2)
    _decode(sched, PROMPT)
    s0 = accel.backend_accel_stats(dev)
    sched_logits = _decode(sched, [NEXT])
    s1 = accel.backend_accel_stats(dev)
    yield dict(ctx=ctx, logits=logits, before=before, after=after, events=rec.events, sched=sched, inputs=inputs,
               sched_logits=sched_logits, sched_stats=(s0, s1))
    llama.free(sched)
    llama.free(ctx)


def test_load_gpu_split_puts_the_hot_rows_in_accel_memory(split):
    m, dev, r = split
    sm = m.sparse
    gi = solver.read_gpuidx(r.gpuidx_path)
    assert sm.gpu_dev is dev and dev in m.devices
    n_hot = 0
    for il, (sl, ly) in enumerate(zip(sm.layers, m.layers)):
        hot = np.flatnonzero(gi[il])
        assert 0 < len(hot) < 1536 and len(hot) % 256 == 0          # a real hot/cold split
        n_hot += len(hot)
        for t in (sl.ffn_up_gpu, sl.ffn_gate_gpu, sl.ffn_down_gpu, sl.gpu_bucket):
            assert accel.tensor_device(t) is dev, t.name
        assert accel.tensor_device(sl.gpu_idx) is None                # the CPU halves read it
        assert np.array_equal(np.asarray(ggml.get_data(sl.gpu_idx)).reshape(-1), gi[il])
        bucket = B.backend_tensor_get(sl.gpu_bucket, np.zeros(len(hot), np.int32), 0, 4 * len(hot))
        assert np.array_equal(bucket, hot)
        if il in (0, 29):    # the device's bytes are the file's rows (read back through the device's get_tensor)
            for w, wg in ((ly.ffn_up, sl.ffn_up_gpu), (sl.ffn_down_t, sl.ffn_down_gpu)):
                rb = ggml.row_size(w.type, 576)
                rows = np.asarray(ggml.get_data(w)).reshape(-1).view(np.uint8).reshape(1536, rb)[hot]
                got = B.backend_tensor_get(wg, None, 0, ggml.nbytes(wg))
                assert np.array_equal(got, rows.reshape(-1)), w.name
    # one neuron: a Q4_1 row of up and of gate (576 -> 360 bytes each), an F16 row of down_t (1152): 1872 bytes,
    # plus its 4-byte gpu_bucket entry
    assert sm.gpu_bytes == n_hot * (360 + 360 + 1152 + 4)
    # without vram_offload_dense only the FFN split is on the device (see the next test)
    assert sm.offloaded == [] and accel.tensor_device(m.layers[0].wq) is None
    # loaded once, through the device's set_tensor: the load's copies are exactly the split's bytes
    assert LOAD_STATS["used"] == sm.gpu_bytes and LOAD_STATS["h2d_bytes"] == sm.gpu_bytes
    assert LOAD_STATS["n_h2d"] == 4 * sum(1 for sl in sm.layers if sl.ffn_up_gpu is not None)


def test_vram_offload_dense_places_what_powerinfer_offloads_first(split):
    """--vram-budget's order before the neurons: attention, predictor, ffn_norm, output in the device's memory; the
    KV cache planned but left in host memory (ggviz's KV cache follows n_gpu_layers)."""
    _, _, r = split
    dev = accel.backend_accel_device_new("ACCEL_DENSE")
    mp = llama.model_default_params()
    mp.vram_budget_gb, mp.vram_offload_dense, mp.devices = 0.075, True, [dev]
    m = llama.model_load_from_file(str(r.model_path), mp)
    try:
        sm = m.sparse
        assert [(w, p) for w, _, p in sm.offloaded] == [("attention", True), ("predictor", True),
                                                         ("ffn_norm", True), ("output", True), ("kv_cache", False)]
        plan = lp.offload_plan(m, int(0.075 * (1 << 30)))
        assert [b for _, b, _ in sm.offloaded] == [b for _, b, _ in plan["steps"]]
        placed = [m.layers[0].wq, m.layers[29].wo, m.layers[3].attn_norm, sm.layers[5].mlp_pre_w1,
                  m.layers[7].ffn_norm, m.output_norm, m.output]
        assert all(accel.tensor_device(t) is dev for t in placed)
        assert accel.tensor_device(m.tok_embd) is None and accel.tensor_device(m.layers[0].ffn_up) is None
        assert accel.backend_accel_stats(dev)["used"] >= sm.gpu_bytes + sum(b for _, b, p in sm.offloaded if p)
        # the device lane then takes every node with a device weight: Q/K/V/O, the predictor, the norms' MULs
        ctx = ggml.init(1 << 16, no_alloc=True)
        x = ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 576)
        assert hybrid.weight_on_device(ggml.mul_mat(ctx, m.layers[0].wq, x))
        assert hybrid.weight_on_device(ggml.mul(ctx, x, m.layers[0].attn_norm))       # the weight is src[1]
        assert not hybrid.weight_on_device(ggml.mul_mat(ctx, m.layers[0].ffn_up, x))
    finally:
        llama.model_free(m)


def test_hybrid_logits_equal_the_cpu_only_run_and_the_scheduler_run(split, runs):
    """Bitwise: the hybrid run's CPU kernels get nth = 3 - 1 = 2, the GPU halves are single-threaded, so the same
    graph computed by 2 CPU threads alone, and by the scheduler's splits (the GPU halves on ACCEL, the rest on a
    2-thread CPU backend), give the same bits."""
    ctx = runs["ctx"]
    assert np.array_equal(runs["logits"], runs["sched_logits"])
    # the same graph (still allocated, inputs set) computed by the CPU alone, node by node, 2 threads
    gf = ctx.last_graph.gf
    t_logits = ctx.last_graph.t_logits
    assert runs["inputs"]
    for t, raw in runs["inputs"].values():
        B._bytes_at(t.data, raw.nbytes)[:] = raw
    ggml.get_data(t_logits)[...] = np.nan
    plan = ggml_cpu.Cplan(hybrid.work_size(gf.nodes, 2), 2)
    plan.work_data = np.zeros(plan.work_size, np.uint8)
    assert ggml_cpu.graph_compute(gf, plan) == ggml.GGML_STATUS_SUCCESS
    cpu_only = np.array(ggml.get_data(t_logits), np.float32).reshape(-1)
    assert np.array_equal(cpu_only, runs["logits"])
    # the scheduler's split of that contrast really ran the GPU halves on the device
    s0, s1 = runs["sched_stats"]
    assert s1["n_nodes"] > s0["n_nodes"] and s1["h2d_bytes"] > s0["h2d_bytes"]


def test_only_activations_cross_to_the_device(split, runs):
    m, dev, _ = split
    gf = runs["ctx"].last_graph.gf
    gpu = [n for n in gf.nodes if hybrid.weight_on_device(n)]
    n_layers_split = sum(1 for sl in m.sparse.layers if sl.ffn_up_gpu is not None)
    assert len(gpu) == 3 * n_layers_split
    assert {n.name.rsplit("-", 1)[0] for n in gpu} == {"ffn_up_sparse_gpu", "ffn_gate_sparse_gpu",
                                                        "ffn_down_sparse_gpu"}
    # the device takes PowerInfer's GPU halves only (the scheduler's contrast runs them there)
    cpu_half = next(n for n in gf.nodes if n.name == gpu[0].name.replace("_gpu", ""))
    assert B.backend_dev_supports_op(dev, gpu[0]) and not B.backend_dev_supports_op(dev, cpu_half)
    # what must cross: every operand of a GPU node that is not in the device's memory (x and the sparse index,
    # both computed by the CPU threads in this step), and every GPU node's result back
    h2d = d2h = 0
    names = set()
    for n in gpu:
        seen = set()
        for s in n.src:
            if s is not None and accel.tensor_device(s) is None and s.addr not in seen:
                seen.add(s.addr)
                assert s.op != ggml.GGML_OP_NONE, s.name          # an activation, not a weight
                h2d += ggml.nbytes(s)
                names.add(s.name)
        d2h += ggml.nbytes(n)
        names.add(n.name)
    before, after = runs["before"], runs["after"]
    assert after["h2d_bytes"] - before["h2d_bytes"] == h2d
    assert after["d2h_bytes"] - before["d2h_bytes"] == d2h
    assert after["d2d_bytes"] == before["d2d_bytes"]
    # per layer: x (576 floats) and idx (1536) into up and gate, x (1536) and idx into down; 1536 + 1536 + 576 back
    assert h2d == n_layers_split * 4 * (2 * (576 + 1536) + 2 * 1536)
    assert d2h == n_layers_split * 4 * (1536 + 1536 + 576)
    rec = runs["ctx"].hybrid_records
    # transfer by transfer: only these activations, no weight, no gpu_bucket; nothing left on the device
    moved = [e for e in runs["events"] if e["kind"] == "accel.transfer"]
    assert moved and {e["tensor"] for e in moved} <= names
    assert sum(e["nbytes"] for e in moved if e["direction"] == "h2d") == h2d
    assert after["used"] == before["used"]
    assert sum(r.h2d_bytes for r in rec) == h2d and sum(r.d2h_bytes for r in rec) == d2h


def _overlaps(recs) -> int:
    gpu = [r for r in recs if r.lane == "gpu"]
    cpu = [r for r in recs if r.lane == "cpu" and r.t_kernel_end > r.t_kernel]
    return sum(1 for g in gpu for c in cpu if g.layer == c.layer and g.t_start < c.t_end and c.t_start < g.t_end)


def test_timeline_respects_dependencies_and_gpu_nodes_overlap_cpu_nodes(split, runs):
    ctx = runs["ctx"]
    recs = ctx.hybrid_records
    gf = ctx.last_graph.gf
    assert [r.node_n for r in recs] == list(range(gf.n_nodes))
    by_n = {r.node_n: r for r in recs}
    for r in recs:
        assert r.t_wait <= r.t_start <= r.t_kernel <= r.t_kernel_end <= r.t_end
        for k in r.srcs:                     # no node starts before its sources finished (is_finish)
            assert r.t_start >= by_n[k].t_end, (r.name, by_n[k].name)
        assert (r.lane == "gpu") == hybrid.weight_on_device(gf.nodes[r.node_n])
        assert r.layer == hybrid.layer_of(r.name)
    # the trace event stream carries the same timeline
    ev = [e for e in runs["events"] if e["kind"] == "hybrid.node"]
    assert sorted((e["node_n"], e["lane"], e["t_start"], e["t_end"]) for e in ev) == \
        [(r.node_n, r.lane, r.t_start, r.t_end) for r in recs]
    g0 = [e for e in runs["events"] if e["kind"] == "hybrid.graph"]
    assert len(g0) == 1 and g0[0]["n_gpu"] == sum(r.lane == "gpu" for r in recs) and g0[0]["n_threads"] == 3
    assert g0[0]["n_nodes"] == gf.n_nodes and g0[0]["device"] == "ACCEL_HYB"
    # every field the module docstring documents, in every event
    fields = {"node_n", "name", "op", "lane", "ith", "nth", "layer", "srcs", "t_wait", "t_start", "t_kernel",
              "t_kernel_end", "t_end", "h2d_bytes", "d2h_bytes", "threads"}
    assert all(fields <= set(e) for e in ev)
    # one kernel span per thread that computed the node: thread 0 alone on the GPU lane; on the CPU lane threads
    # 1..nth (ith - 1 = 0..nth-1). Each thread waits on is_finish itself, so each span starts after every source
    # finished (a thread may start before the recording thread 1 does) and ends before is_finish is set
    for r in recs:
        assert [t[0] for t in r.threads] == ([0] if r.lane == "gpu" else list(range(1, r.nth + 1))), r
        ready = max([by_n[k].t_end for k in r.srcs], default=0)
        assert all(ready <= a <= b <= r.t_end for _, a, b in r.threads), r
    assert any(len(r.threads) == 2 for r in recs)
    assert {(e["lane"], e["ith"]) for e in ev} == {("gpu", 0), ("cpu", 1)}
    assert {e["nth"] for e in ev if e["lane"] == "cpu"} == {1, 2}       # n_tasks - 1 = 2 threads, or one thread
    g1 = [e for e in runs["events"] if e["kind"] == "hybrid.graph.end"]
    assert len(g1) == 1 and g1[0]["ok"] and g1[0]["h2d_bytes"] == sum(e["h2d_bytes"] for e in ev)
    # overlap depends on how the interpreter lock is handed between threads: up to 3 more decode steps
    for k in range(3):
        if _overlaps(recs):
            break
        _decode(ctx, [NEXT + 1 + k])
        recs = ctx.hybrid_records
    assert _overlaps(recs) >= 1


def test_hybrid_refuses_one_thread_and_a_dense_model(split):
    m, _, _ = split
    for field in ("n_threads", "n_threads_batch"):
        cp = llama.context_default_params()
        cp.n_ctx, cp.hybrid = 64, True
        cp.n_threads = cp.n_threads_batch = 2
        setattr(cp, field, 1)
        with pytest.raises(ContextParamsError, match=f"{field} >= 2") as ei:
            llama.init_from_model(m, cp)
        assert ei.value.param == field
    ctx = _ctx(m, True, 2)
    try:
        with pytest.raises(ContextParamsError, match="n_threads >= 2"):
            ctx.set_n_threads(1, 2)
        assert ctx.cparams.n_threads == 2           # unchanged
    finally:
        llama.free(ctx)
    dense = grun.load_model(str(MODEL))        # (cached in the process: the CLI test below loads it too)
    cp = llama.context_default_params()
    cp.n_ctx, cp.hybrid, cp.n_threads = 64, True, 2
    with pytest.raises(ContextParamsError, match="PWRI") as ei:
        llama.init_from_model(dense, cp)
    assert ei.value.param == "hybrid"


def test_a_kernel_error_on_the_device_lane_reaches_the_caller_and_changes_nothing(split, runs, monkeypatch):
    _, dev, _ = split
    ctx = runs["ctx"]
    pos_max = ctx.memory_seq_pos_max(0)
    last = np.array(ctx.get_logits_ith(-1), copy=True)
    used = accel.backend_accel_stats(dev)["used"]
    orig = cpu_pi.FORWARD[cpu_pi.GGML_OP_AXPY]

    def failing(params, dst):
        if cpu_pi.is_upscale(dst):
            raise RuntimeError("simulated device fault")
        return orig(params, dst)
    monkeypatch.setitem(cpu_pi.FORWARD, cpu_pi.GGML_OP_AXPY, failing)
    with pytest.raises(ggml.GGMLError, match="simulated device fault") as ei:
        llama.decode(ctx, llama.batch_get_one(np.array([NEXT], np.int32)))
    assert "ffn_down_sparse_gpu" in str(ei.value)
    assert ctx.memory_seq_pos_max(0) == pos_max                       # the KV cache as before
    assert np.array_equal(ctx.get_logits_ith(-1), last)              # the outputs as before
    assert accel.backend_accel_stats(dev)["used"] == used            # the staging buffer given back
    monkeypatch.setitem(cpu_pi.FORWARD, cpu_pi.GGML_OP_AXPY, orig)
    assert llama.decode(ctx, llama.batch_get_one(np.array([NEXT], np.int32))) == 0     # and the context works
    assert ctx.memory_seq_pos_max(0) == pos_max + 1


def test_a_split_that_does_not_fit_the_device_leaves_the_model_as_it_was(split):
    m, _, r = split
    small = accel.backend_accel_device_new("ACCEL_SMALL", capacity=1 << 20)
    sm = m.sparse
    before = [(sl.ffn_up_gpu, sl.gpu_bucket, sl.gpu_idx) for sl in sm.layers]
    with pytest.raises(MemoryError, match="FFN split needs"):
        lp.load_gpu_split(m, r.gpuidx_path, dev=small)
    assert [(sl.ffn_up_gpu, sl.gpu_bucket, sl.gpu_idx) for sl in sm.layers] == before
    assert sm.gpu_bytes > 0 and accel.backend_accel_stats(small)["used"] == 0


def test_cli_hybrid_flag_user_errors(capsys):
    """`ggviz run --hybrid`: one thread, or a dense model, is a two-line user error (no traceback, no hang)."""
    from ggviz import cli
    with pytest.raises(SystemExit) as ei:
        cli.main(["run", "--hybrid", "-t", "1", "-n", "0", "-m", str(MODEL)])
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--hybrid needs -t 2" in err[0]
    assert cli.main(["run", "--hybrid", "-t", "2", "-n", "0", "-m", str(MODEL)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "PWRI" in err[0], err
    with pytest.raises(SystemExit):
        cli.main(["run", "--vram-budget", "0", "-m", str(MODEL)])
    assert "--vram-budget: 0 is out of range: must be > 0" in capsys.readouterr().err


def test_abort_callback_stops_the_hybrid_run_and_rolls_back(split, runs):
    """llama_decode returns 2 (aborted) when the abort callback says so part-way; the KV cache is as before."""
    ctx = runs["ctx"]
    pos_max = ctx.memory_seq_pos_max(0)
    calls = []

    def abort(data):
        calls.append(data)
        return len(calls) >= 40            # some way into the graph
    ctx.cparams.abort_callback, ctx.cparams.abort_callback_data = abort, "x"
    try:
        assert llama.decode(ctx, llama.batch_get_one(np.array([NEXT], np.int32))) == 2
    finally:
        ctx.cparams.abort_callback = ctx.cparams.abort_callback_data = None
    assert len(calls) == 40 and calls[0] == "x"
    assert ctx.memory_seq_pos_max(0) == pos_max


def test_no_room_for_the_device_lanes_copies_is_a_clear_error(split, runs):
    """The device is full (its capacity cut to what the weights use): the staging buffer cannot be allocated, the
    decode raises before any thread starts, and nothing changed."""
    _, dev, _ = split
    ctx = runs["ctx"]
    pos_max = ctx.memory_seq_pos_max(0)
    st = accel.backend_accel_stats(dev)
    accel.backend_accel_set_capacity(dev, st["used"])
    try:
        with pytest.raises(ggml.GGMLError, match="no room on ACCEL_HYB"):
            llama.decode(ctx, llama.batch_get_one(np.array([NEXT], np.int32)))
    finally:
        accel.backend_accel_set_capacity(dev, st["capacity"])
    assert ctx.memory_seq_pos_max(0) == pos_max
    assert accel.backend_accel_stats(dev)["used"] == st["used"]
    assert llama.decode(ctx, llama.batch_get_one(np.array([NEXT], np.int32))) == 0


# ---------------------------------------------------------------------------------------------------------------
# misuse (issue 24): every number checked, the gpuidx checked against the model and the budget, nothing written
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, what", [
    (["--threshold", "nan"], "--threshold: 'nan' is not a finite number"),
    (["--threshold", "inf"], "--threshold: 'inf' is not a finite number"),
    (["--threshold=-inf"], "--threshold: '-inf' is not a finite number"),
    (["--pos-weight", "inf"], "--pos-weight: 'inf' is not a finite number"),
    (["--pos-weight", "nan"], "--pos-weight: 'nan' is not a finite number"),
    (["--pos-weight", "-1"], "--pos-weight: -1 is out of range: must be > 0"),
    (["--vram-budget", "inf"], "--vram-budget: 'inf' is not a finite number"),
    (["--vram-budget", "nan"], "--vram-budget: 'nan' is not a finite number"),
    (["--vram-budget", "0"], "--vram-budget: 0 is out of range: must be > 0"),
])
def test_powerinfer_build_refuses_non_finite_numbers_in_two_lines(tmp_path, capsys, args, what):
    """`ggviz powerinfer build` exited 0 on --threshold nan/inf and --pos-weight inf, and printed a 20-line
    traceback on --vram-budget inf: each is now refused by the parser, before anything is read or written."""
    from ggviz import cli
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as ei:
        cli.main(["powerinfer", "build", "--out", str(out), *args])
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and what in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("kw, what", [
    (dict(threshold=float("nan")), "threshold = nan"), (dict(threshold=float("inf")), "threshold = inf"),
    (dict(pos_weight=float("inf")), "pos_weight = inf"), (dict(vram_budget_gib=float("inf")), "vram_budget = inf"),
    (dict(vram_budget_gib=float("nan")), "vram_budget = nan"), (dict(vram_budget_gib=0.0), "vram_budget = 0.0"),
    (dict(tokens=8), "tokens = 8"), (dict(epochs=0), "epochs = 0"), (dict(threads=1.5), "threads = 1.5"),
])
def test_powerinfer_build_api_checks_its_numbers_first(tmp_path, kw, what):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=what.replace(".", r"\.")):
        pipeline.build(out, MODEL, **kw)
    assert not out.exists()


def test_a_non_finite_vram_budget_is_refused_not_ignored(split, capsys):
    """`run --hybrid --vram-budget nan` loaded no split (nan passes `budget <= 0`): refused by the parser, and by
    the loader for the API (nan and inf; <= 0 still means no split)."""
    from ggviz import cli
    _, _, r = split
    for v in ("nan", "inf"):
        with pytest.raises(SystemExit) as ei:
            cli.main(["run", "--hybrid", "-t", "2", "--vram-budget", v, "-n", "0", "-m", str(r.model_path)])
        assert ei.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 2 and f"--vram-budget: '{v}' is not a finite number" in err[0], err
        mp = llama.model_default_params()
        mp.vram_budget_gb = float(v)
        with pytest.raises(ValueError, match=f"vram_budget_gb = {v}: a VRAM budget must be a finite number"):
            llama.model_load_from_file(str(r.model_path), mp)


def test_a_split_solved_for_a_larger_budget_is_refused(split, capsys):
    """A gpuidx built for 0.075 GiB loaded whole under any positive budget (1e-9 GiB): its split.vram_capacity is
    now compared with the budget, as PowerInfer's check_vram_allocable does; the model is left as it was."""
    from ggviz import cli
    m, dev, r = split
    cap = int(0.075 * (1 << 30))
    assert lp.read_split_file(r.gpuidx_path)[1] == cap
    mp = llama.model_default_params()
    mp.vram_budget_gb = 1e-9
    mp.devices = [accel.backend_accel_device_new("ACCEL_TINY")]
    with pytest.raises(ValueError, match=r"solved for a VRAM budget of 0\.075 GiB \(split\.vram_capacity = "
                                         rf"{cap} bytes\), more than the budget \(1 bytes = "):
        llama.model_load_from_file(str(r.model_path), mp)
    assert accel.backend_accel_stats(mp.devices[0])["used"] == 0
    sm = m.sparse
    before = [(sl.ffn_up_gpu, sl.gpu_bucket, sl.gpu_idx) for sl in sm.layers]
    with pytest.raises(ValueError, match=r"more than the budget \(75161927 bytes = 0\.07 GiB\)"):
        lp.load_gpu_split(m, r.gpuidx_path, dev=dev, budget_bytes=int(0.07 * (1 << 30)))
    assert [(sl.ffn_up_gpu, sl.gpu_bucket, sl.gpu_idx) for sl in sm.layers] == before
    assert cli.main(["run", "--vram-budget", "0.01", "-n", "0", "-m", str(r.model_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "more than the budget (10737418 bytes = 0.01 GiB)" in err[0], err


def _gpuidx_file(path, rows, cap=1 << 20):
    solver.export_split(path, rows, cap)
    return path


def test_a_gpuidx_for_another_model_or_with_bad_values_is_refused(split, tmp_path):
    """A gpuidx of 33 layers was accepted for a 30-layer model (its extra layers ignored); a gpu_idx value of 2 was
    refused with a message about the entry count. Each is now refused naming what is wrong; the model unchanged."""
    m, dev, r = split
    sm = m.sparse
    n_layer, n_ff = len(sm.layers), m.hparams.n_ff
    before = [(sl.ffn_up_gpu, sl.gpu_bucket, sl.gpu_idx) for sl in sm.layers]
    zeros = [np.zeros(n_ff, np.int32) for _ in range(n_layer + 3)]
    big = _gpuidx_file(tmp_path / "33.gpuidx", zeros)
    with pytest.raises(ValueError, match=f"block_count: expected {n_layer} layers \\(this model's\\), found "
                                              f"{n_layer + 3} layers"):
        lp.load_gpu_split(m, big, dev=dev)
    short = _gpuidx_file(tmp_path / "narrow.gpuidx", [np.zeros(n_ff // 2, np.int32)] * n_layer)
    with pytest.raises(ValueError, match=f"expected {n_ff} entries"):
        lp.load_gpu_split(m, short, dev=dev)
    two = [np.zeros(n_ff, np.int32) for _ in range(n_layer)]
    two[4][17] = 2
    bad = _gpuidx_file(tmp_path / "two.gpuidx", two)
    for call in (lambda: lp.load_gpu_split(m, bad, dev=dev), lambda: solver.read_gpuidx(bad)):
        with pytest.raises(ValueError, match=r"blk\.4\.gpu_idx: expected each entry 0 \(CPU\) or 1 \(GPU\), "
                                                  r"found 2 at entry 17"):
            call()
    with pytest.raises(ValueError, match="gpu_idx: layer 4, entry 17 is 2"):
        lp.set_gpu_index(sm, two, n_ff)
    assert [(sl.ffn_up_gpu, sl.gpu_bucket, sl.gpu_idx) for sl in sm.layers] == before


def test_read_gpuidx_writes_nothing_beside_the_index(split, tmp_path):
    """read_gpuidx wrote a patched copy of the file beside it (failing in a read-only folder); it now reads the
    mapping: the folder's listing and its mtime (a file created and removed there would change it) stay."""
    _, _, r = split
    d = tmp_path / "ro"
    d.mkdir()
    (d / "m.gpuidx").write_bytes(pathlib.Path(r.gpuidx_path).read_bytes())
    d.chmod(0o555)
    try:
        st = d.stat().st_mtime_ns
        time_before = sorted(p.name for p in d.iterdir())
        gi = solver.read_gpuidx(d / "m.gpuidx")
        assert sorted(p.name for p in d.iterdir()) == time_before and d.stat().st_mtime_ns == st
    finally:
        d.chmod(0o755)
    assert [g.tolist() for g in gi] == [g.tolist() for g in solver.read_gpuidx(r.gpuidx_path)]
    assert sum(int(g.sum()) for g in gi) > 0


def test_a_non_finite_threshold_from_the_environment_is_refused(split, monkeypatch):
    _, _, r = split
    for v in ("nan", "inf"):
        monkeypatch.setenv("LLAMA_SPARSE_PRED_THRESHOLD", v)
        with pytest.raises(ValueError, match=f"LLAMA_SPARSE_PRED_THRESHOLD = {v}"):
            llama.model_load_from_file(str(r.model_path))


def test_the_solvers_api_checks_its_numbers(split):
    m, _, _ = split
    for bad in (float("nan"), float("inf"), -1):
        with pytest.raises(ValueError, match="neuron_cap: budget_bytes = .* must be a finite number of bytes >= 0"):
            solver.neuron_cap(bad, m.layers[0].ffn_up)
    with pytest.raises(ValueError, match="offload_plan: budget_bytes = inf must be an integer >= 0"):
        lp.offload_plan(m, float("inf"))
    counts = np.ones((2, 512))
    with pytest.raises(ValueError, match="capacity = -256 must be an integer >= 0"):
        solver.solve_gpu_split(counts, -256)
    counts[1, 3] = np.nan
    with pytest.raises(ValueError, match="counts must be a \\(layers, n_ff\\) array of finite counts >= 0"):
        solver.solve_gpu_split(counts, 256)
