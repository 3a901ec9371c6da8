"""PowerInfer's views (ggviz/viz/widgets/powerinfer.py), each checked against the engine's own records of a real run.

A tiny build (32 training tokens, 1 epoch, a 0.1 GiB budget so that the solver puts rows on the device) gives a real
PWRI model and .generated.gpuidx in seconds; its predictor is weak, which does not matter here: the views must show
what the engine did, whatever it did. Oracles: the kernels' own outputs (a row MUL_MAT_SPARSE skipped is an exact 0
in ffn_up_sparse-N), the predictor recomputed in NumPy from the file's fc1/fc2, the activation-count files, the
gpuidx file, ``graph_compute_hybrid``'s records and trace events, and hand-checked sizes (1,872 bytes per neuron).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from ggviz import capture, ggml, llama, trace
from ggviz.ggml.cpu import powerinfer as cpu_pi
from ggviz.powerinfer import pipeline, solver
from ggviz.viz.widgets import powerinfer as PV

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="needs data/models/SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("pviews")
    old = cpu_pi.sparse_pred_threshold
    r = pipeline.build(out, MODEL, tokens=32, heldout=16, seq_len=48, epochs=1, vram_budget_gib=0.1, quiet=True)
    yield r
    cpu_pi.set_sparse_pred_threshold(old)


@pytest.fixture(scope="module")
def model(built):
    mp = llama.model_default_params()
    mp.vram_budget_gb = 0.1                  # loads <model>.generated.gpuidx: the graph gets its *_gpu halves
    m = llama.model_load_from_file(str(built.model_path), mp)
    yield m
    llama.model_free(m)


@pytest.fixture(scope="module")
def runs(model):
    ids = llama.tokenize(model.vocab, TEXT, add_special=False)[:8]
    return (capture.capture_sparse_run(model, ids, threshold=-np.inf),
            capture.capture_sparse_run(model, ids, threshold=0.0))


def _bundle_html(view) -> str:
    b = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in b
    return b["text/html"]


def test_capture_holds_the_predictor_the_file_defines(model, runs):
    """mlp_pre_out-N as captured = relu(ffn_inp · fc1) · fc2 recomputed in float64 from the file's weights."""
    full, _ = runs
    assert full.threshold == -np.inf and cpu_pi.sparse_pred_threshold == model.sparse.sparse_pred_threshold
    for il in (0, 17):
        sl = model.sparse.layers[il]
        w1 = np.array(ggml.get_data(sl.mlp_pre_w1), np.float64).reshape(-1, 576)       # (H, n_embd)
        w2 = np.array(ggml.get_data(sl.mlp_pre_w2), np.float64).reshape(1536, -1)      # (n_ff, H)
        ref = np.maximum(full.ffn_inp[il].astype(np.float64) @ w1.T, 0.0) @ w2.T
        assert np.abs(full.idx[il] - ref).max() <= 1e-4 * np.abs(ref).max()


def test_skipped_rows_are_the_kernels_zeros(built, runs, tmp_path):
    """The view's skipped rows per token = count(idx < threshold) on CPU rows of the node's sparse_idx, and they are
    exactly the rows MUL_MAT_SPARSE left at 0 (device rows are 0 in the CPU half too); the device rows are the
    gpuidx file's."""
    _, run = runs
    gi = solver.read_gpuidx(built.gpuidx_path)
    v = PV.SkippedRowsView(run, layer=5, token=2)
    st = v.state()
    total_skipped = 0
    for il in range(run.n_layer):
        assert np.array_equal(run.gpu_idx[il], gi[il])
        c = v.counts(il)
        cpu_row = run.gpu_idx[il] == 0
        want = ((run.idx[il] < 0.0) & cpu_row).sum(1)
        assert c["skipped"] == [int(x) for x in want]
        assert c["on_device"] == [int(gi[il].sum())] * run.n_tokens
        zero = run.up[il] == 0
        assert np.array_equal(zero, (run.idx[il] < 0.0) | ~cpu_row)       # what the kernel really skipped
        total_skipped += int(want.sum())
    assert total_skipped > 0 and sum(int(g.sum()) for g in gi) > 0
    assert st["skipped_rows"] == [int(r) for r in np.flatnonzero((run.idx[5][2] < 0) & (run.gpu_idx[5] == 0))]
    assert "MUL_MAT_SPARSE skipped" in _bundle_html(v)
    # the run is a record: saved and loaded back, the view draws the same page
    loaded = capture.load(capture.save(run, tmp_path / "sparse.npz"))
    assert PV.SkippedRowsView(loaded, layer=5, token=2).to_html() == v.to_html()
    with pytest.raises(ValueError, match="token 99"):
        v.select(layer=3, token=99)
    assert (v.layer, v.token) == (5, 2)                                      # a refused call changes nothing
    # the book's recording: layers 0, 15, 29 and 5, every token; one drawing per layer, the token's row marked
    # over it (lower for a later token), each token's skipped rows as the view lists them
    rec = v.book_view()
    tab = {t["set"]: t for t in rec["tables"]}
    assert [o[1] for o in json.loads(rec["state"]["controls"])[0]["options"]] == [0, 5, 15, 29]
    assert len(tab["picture"]["values"]) == 4 and len(tab["info"]["pick"]) == 4 * run.n_tokens
    info = lambda k: tab["info"]["values"][tab["info"]["pick"][k]]                 # noqa: E731
    assert info("15,3") == PV.SkippedRowsView(run, layer=15, token=3).token_html()
    assert "layers 0, 5, 15, 29: another layer" in rec["state"]["note"]
    top = lambda k: json.loads(tab["cursor"]["values"][tab["cursor"]["pick"][k]])[0]["t"]   # noqa: E731
    assert top("5,0") < top("5,1") < top("5,2") and (v.layer, v.token) == (5, 2)


def test_predictor_view_counts_and_refuses_a_thresholded_run(built, runs):
    full, run0 = runs
    thr = json.loads((built.model_path.parent / "metrics.json").read_text())["act_threshold"]
    v = PV.PredictorView(full, thr, layer=3, threshold=-0.5)
    st = v.state()
    active = np.abs(full.act[3]) > thr[3]
    kept = full.idx[3] >= -0.5
    c = st["current"]
    assert c["kept_active"] + c["missed_active"] + c["kept_inactive"] + c["skipped_inactive"] == 8 * 1536
    assert c["recall"] == pytest.approx((kept & active).sum() / active.sum())
    assert c["skipped"] == pytest.approx(1 - kept.mean())
    assert st["skipped"][10] == pytest.approx(float((full.idx[10] < -0.5).mean()))
    assert v.select(threshold=-np.inf).state()["mean_skipped"] == 0.0
    with pytest.raises(ValueError, match="threshold -inf"):
        PV.PredictorView(run0, thr)          # skipped neurons' activations are 0 there: recall 1 by construction
    with pytest.raises(ValueError, match="layer 30"):
        v.select(layer=30)
    assert v.layer == 3
    assert "<img" in _bundle_html(v.select(threshold=0.0))
    v._w_layer.value = 4                     # the live slider drives the same state
    assert v.state()["layer"] == 4 and "layer 4" in v._w_tab.value
    # the book: the lesson's thresholds (-1, 0, 1) recorded at this layer, each frame its own counts
    rec = v.book_view()
    assert (v.layer, v.threshold, rec["state"]["key"]) == (4, 0.0, "0") and "needs a kernel" in rec["state"]["note"]
    info = rec["tables"][3]
    for t in (-1.0, 0.0, 1.0):
        c = v.confusion(4, t)
        assert f"layer 4, threshold {t:g}," in info["values"][info["pick"][f"{t:g}"]]
        assert f"<td style='text-align:left;font-family:monospace;padding:1px 8px'>{c['kept_active']}</td>" in \
            info["values"][info["pick"][f"{t:g}"]]


def test_hot_cold_view_totals_and_device_rows(built, runs):
    _, run = runs
    d = built.model_path.parent / "activation"
    counts = np.stack([np.load(d / f"activation_{il}.npy") for il in range(30)])
    v = PV.HotColdView(counts, run.gpu_idx, layer=7)
    st = v.state()
    assert st["totals"] == [int(x) for x in counts.sum(1)]
    assert st["n_on_device"] == [int(g.sum()) for g in run.gpu_idx]
    for il, g in enumerate(run.gpu_idx):          # the solver's rows are the layer's hottest
        if g.any() and not g.all():
            assert counts[il][g == 1].min() >= counts[il][g == 0].max()
    # a hand-checked power law: counts 1..8, the hottest quarter (8 + 7) carries 15 / 36
    small = PV.HotColdView(np.arange(1, 9)[None, :], top=0.25).state()
    assert small["top_share"] == [pytest.approx(15 / 36)]
    assert "PowerInfer" in _bundle_html(v)
    rec = v.book_view()          # the book: layers 0, 7, 15, 29, each its own drawing and summary
    tab = {t["set"]: t for t in rec["tables"]}
    assert sorted(tab["info"]["pick"]) == ["0", "15", "29", "7"] and len(tab["picture"]["values"]) == 4
    assert tab["info"]["values"][tab["info"]["pick"]["15"]] == v.select(15).summary_html()


def test_hybrid_timeline_is_the_executors_records(model, runs):
    """Real layers through graph_compute_hybrid: outputs equal the decode's ffn_out to the bit; the view's lanes
    are the records' (and the trace events'); nothing started before its sources finished; only activations
    cross to the device, in the sizes the graph's shapes give."""
    _, run = runs
    layers = [il for il in (4, 5) if run.gpu_idx[il].any()]
    assert layers
    with trace.recording(kinds=["hybrid.node"]) as rec:
        recs, outs, xfer = capture.hybrid_ffn_run(model, run, layers, n_threads=3)
    for il in layers:
        assert np.array_equal(outs[il], run.ffn_out[il])
    v = PV.HybridTimelineView(recs, n_threads=3)
    st = v.state()
    assert st["lanes"]["gpu"] == [r.node_n for r in recs if r.lane == "gpu"]
    assert st["lanes"]["cpu"] == [r.node_n for r in recs if r.lane == "cpu"]
    assert {recs[i].name.rsplit("-", 1)[0] for i in range(len(recs)) if recs[i].lane == "gpu"} == \
        {"ffn_up_sparse_gpu", "ffn_gate_sparse_gpu", "ffn_down_sparse_gpu"}
    assert st["started_before_sources_finished"] == []
    end = {r.node_n: r.t_end for r in recs}
    assert all(r.t_start >= end[s] for r in recs for s in r.srcs)
    ev = PV.HybridTimelineView(rec.of("hybrid.node"), n_threads=3).state()
    assert ev["lanes"] == st["lanes"] and ev["wall_us"] == pytest.approx(st["wall_us"])
    # one lane per CPU thread: the threads that left kernel spans (3 threads: the device's 0, CPU threads 1 and 2)
    assert st["cpu_threads"] == ev["cpu_threads"] == [1, 2]
    assert sorted({t[0] for r in recs if r.lane == "cpu" for t in r.threads}) == [1, 2]
    T = run.n_tokens
    per_layer = {("ffn_norm", "device"): T * 576 * 4, ("mlp_pre_out", "device"): T * 1536 * 4,
                 ("ffn_gate_par", "device"): T * 1536 * 4, ("ffn_up_sparse_gpu", "cpu"): T * 1536 * 4,
                 ("ffn_gate_sparse_gpu", "cpu"): T * 1536 * 4, ("ffn_down_sparse_gpu", "cpu"): T * 576 * 4}
    got = {(x["tensor"], x["to"]): x["bytes"] for x in xfer}
    assert got == {(f"{n}-{il}", to): b for il in layers for (n, to), b in per_layer.items()}
    html = _bundle_html(v.select(layers[0]))
    assert "every node started after its sources finished" in html
    rec = v.book_view()          # the book: all layers and each recorded layer, its own drawing and tables
    tab = {t["set"]: t for t in rec["tables"]}
    assert sorted(tab["info"]["pick"]) == sorted(["all"] + [str(x) for x in layers])
    assert tab["info"]["values"][tab["info"]["pick"][str(layers[-1])]] == \
        PV.HybridTimelineView(recs, n_threads=3, layer=layers[-1]).text_html()
    assert rec["state"]["key"] == str(layers[0]) and v.layer == layers[0]
    assert rec["state"]["note"] == ""                 # every layer of these records is in the recording
    with pytest.raises(ValueError, match="no records"):
        v.select(29)
    assert v.layer == layers[0]


def test_cost_view_flops_and_bytes(model, runs):
    _, run = runs
    v = PV.SparseCostView(model, run, kernel_times={0.0: 2.0, 0.5: 1.1, 0.9: 0.3})
    st = v.state()
    assert PV.neuron_bytes(model) == 1872          # Q4_1 up + gate rows (2 x 360) + an F16 down_t row (1152)
    assert st["ffn_flops_dense"] == 30 * 3 * 2 * 576 * 1536
    H = model.sparse.n_hidden
    assert st["predictor_flops"] == 30 * 2 * (576 * H + H * 1536)
    kept = np.mean([(run.idx[il] >= 0.0).sum(1).mean() for il in range(30)])
    assert st["rows_skipped"] == pytest.approx(1 - kept / 1536)
    assert st["ffn_bytes_sparse"] == pytest.approx(1872 * kept * 30)
    # the dense FFN reads Q4_1 up, gate and down: 3 x 360 bytes per neuron (the sparse path's F16 down_t row is 1152)
    assert st["ffn_bytes_dense"] == 30 * 1536 * 1080 and st["dense_neuron_bytes"] == 1080
    assert st["down_t_row_bytes"] == 1152
    assert st["break_even_skip"] == pytest.approx(st["predictor_flops"] / st["ffn_flops_dense"])
    assert v.select(-np.inf).state()["decode_flops_ratio"] > 1.0      # nothing skipped: the predictor is pure cost
    assert "MORE than dense" in v.verdict()
    assert "MFLOP" in _bundle_html(v.select(0.0))
    rec = v.book_view()          # the book: thresholds -1, 0, 1, each its own drawing, headline and table
    tab = {t["set"]: t for t in rec["tables"]}
    assert sorted(tab["info"]["pick"]) == ["-1", "0", "1"] and len(set(tab["picture"]["pick"].values())) == 3
    assert "At threshold 1 the kernels skip" in tab["info"]["values"][tab["info"]["pick"]["1"]]
    assert v.threshold == 0.0
