"""The flash-attention stepper: one FLASH_ATTN_EXT node of a real SmolLM2 decode step (llama.cpp's default context
params, flash attention on), one query row walked through the KV cells with the one-chunk kernel's own functions,
must end on the node's output row bit for bit, for every head; with an F32 accumulator instead of the kernel's F16
one it would not (so the bit test can fail). The record saves and loads to the same HTML. And the graphs with and
without flash attention side by side (``AttnGraphsView``) against llama.cpp's node counts and compute buffers."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ggviz import llama
from ggviz.capture import capture_attn_graphs, capture_flash_attn, records, walk_flash_attn
from ggviz.ggml.cpu import ops
from ggviz.viz.widgets import AttnGraphsView, FlashAttnStepper

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def cap(model):
    return capture_flash_attn(model, layer=3)


def _u32(x):
    return np.asarray(x, np.float32).view(np.uint32)


def test_the_default_context_runs_flash_attention(cap):
    assert llama.context_default_params().flash_attn_type == llama.LLAMA_FLASH_ATTN_TYPE_AUTO
    assert cap.kernel == "one_chunk" and cap.q.shape == (9, 64) and cap.k.shape == cap.v.shape == (3, 256, 64)
    # the mask lets in the prompt's cells and the new token's: pos + 1 of them
    assert int(np.sum(cap.mask == 0)) == cap.pos + 1 and int(np.sum(cap.mask == -np.inf)) == 256 - cap.pos - 1


def test_every_heads_walk_ends_on_the_nodes_output_bits(cap):
    for h in range(cap.q.shape[0]):
        w = walk_flash_attn(cap, h)
        assert w.kv_head == h // 3 and list(w.cells) == list(range(cap.pos + 1))
        assert np.array_equal(_u32(w.result), _u32(cap.out[h])), h
        # the running max is the max of the scores so far; S is the sum of expf(s - M_final) up to rounding
        assert np.array_equal(w.M, np.maximum.accumulate(w.s))
        assert np.isclose(w.S[-1], np.sum(np.exp(w.s.astype(np.float64) - w.M[-1])), rtol=1e-5)


def test_an_f32_accumulator_gives_other_bits(cap):
    differs = 0
    for h in range(cap.q.shape[0]):
        w = walk_flash_attn(cap, h)
        M, S = np.full(1, -np.inf, np.float32), np.zeros(1, np.float32)
        acc = np.zeros((1, 64), np.float32)
        vr = cap.v[w.kv_head].astype(np.float32)
        for i, j in enumerate(w.cells):
            ops.fa_online_step(M, S, acc, w.s[i:i + 1], vr[j], np.ones(1, bool))
        differs += not np.array_equal(_u32(ops.fa_divide(S, acc)[0]), _u32(cap.out[h]))
    assert differs > 0


def test_stepper_state_and_round_trip(cap, tmp_path):
    w = walk_flash_attn(cap, 4)
    st = FlashAttnStepper(w, step=2).state()
    assert st["cell"] == 2 and st["M"] == float(w.M[2]) and st["S"] == float(w.S[2]) and not st["last"]
    assert FlashAttnStepper(w).state()["last"] and FlashAttnStepper(w).state()["matches_output"]
    with pytest.raises(ValueError, match="out of range"):
        FlashAttnStepper(w).goto(w.cells.shape[0])
    html = FlashAttnStepper(w).to_html()
    assert "== the node&#x27;s output, bit for bit" in html or "== the node's output, bit for bit" in html
    back = records.load(records.save(w, tmp_path / "fa.npz"))
    assert FlashAttnStepper(back).to_html() == html
    # live, the browser's slider moves the stepper; the book holds every step's frame
    fa = FlashAttnStepper(w, step=1)
    fa.widget
    fa._pane.pos = 3
    assert fa.step == 3 and json.loads(fa._pane.frame) == fa.frame()
    frames = fa.book_view()["tables"][0]["values"]
    assert len(frames) == fa.n_steps and fa.step == 3
    assert f"<b>step 2</b> of {fa.n_steps} (KV cell {int(w.cells[2])})" in json.loads(frames[2])["panel"]
    back_cap = records.load(records.save(cap, tmp_path / "cap.npz"))
    assert np.array_equal(_u32(walk_flash_attn(back_cap, 4).result), _u32(w.result))


# ---- the graph with flash attention beside the graph without it ----------------------------------------------------

@pytest.fixture(scope="module")
def graphs(model):
    return capture_attn_graphs(model, n_ctx=1024)


def test_attn_graphs_against_llamacpp(graphs, model):
    """Node counts and compute buffers of both contexts as llama.cpp has them (n_ctx 1024, n_ubatch 512): FA on
    from tests/data/flash_attn/ (936 nodes, its log's 98.25 MiB), FA off from tests/data/llamacpp/ (1086 nodes, the
    exact bytes); the FA layer's ops and names in llama.cpp's order."""
    fa_graph = json.loads((DATA / "flash_attn" / "smollm2_fa_graph.json").read_text())
    log = str(np.load(DATA / "flash_attn" / "smollm2_fa.npz")["log"])
    off = next(s for s in json.loads((DATA / "llamacpp" / "smollm2_compute_buffers.json").read_text())["settings"]
               if s["n_ctx"] == 1024 and s["n_ubatch"] == 512)
    assert graphs.n_nodes == {"fa": len(fa_graph["nodes"]), "no_fa": int(re.search(r"nodes = (\d+)",
                                                                                   off["graph_line"]).group(1))}
    assert f"{graphs.compute_buffer['fa']['CPU'] / 2**20:.2f}" == \
        re.search(r"CPU compute buffer size =\s+([0-9.]+) MiB", log).group(1)
    assert graphs.compute_buffer["no_fa"] == off["bytes"]
    names = [n["name"] for n in fa_graph["nodes"]]
    span = names[names.index("norm-0"):names.index("l_out-0") + 1]
    assert [(n["op"], n["name"]) for n in graphs.layer_nodes["fa"]] == \
        [(n["op"], n["name"]) for n in fa_graph["nodes"][names.index("norm-0"):names.index("l_out-0") + 1]]
    assert len(span) == len(graphs.layer_nodes["fa"])


def test_attn_graphs_view(graphs, model, tmp_path):
    """What FA removes and adds per layer (hand-checked against llama.cpp's build_attn_mha), times the layers, is
    the whole graph's difference; the removed KQ and its softmax are n_kv x n_tokens x n_head floats at the
    reserve's shape; the record saves and loads to the same HTML."""
    hp = model.hparams
    st = AttnGraphsView(graphs).state()
    assert sorted(st["removed"]) == sorted([
        ("MUL_MAT", "kq-0"), ("SOFT_MAX", "kq_soft_max-0"), ("MUL_MAT", "kqv-0"), ("PERMUTE", "kqv-0 (permuted)"),
        ("CONT", "kqv_out-0"), ("RESHAPE", "Vcur-0 (reshaped)"), ("RESHAPE", "Vcur-0 (reshaped) (reshaped)"),
        ("RESHAPE", "cache_v_l0 (reshaped)"), ("SET_ROWS", "cache_v_l0 (reshaped) (view)")])
    assert sorted(st["added"]) == sorted([("FLASH_ATTN_EXT", "(unnamed)"), ("RESHAPE", "kqv_out-0"),
                                          ("VIEW", "Vcur-0 (view)"), ("SET_ROWS", "cache_v_l0 (view)")])
    assert (len(st["removed"]) - len(st["added"])) * hp.n_layer == st["n_nodes"]["no_fa"] - st["n_nodes"]["fa"]
    assert sum(st["ops_delta"].values()) == st["n_nodes"]["fa"] - st["n_nodes"]["no_fa"]
    kq = {m["name"]: m for m in st["memory"]["removed"]}
    assert graphs.n_tokens_pp == 512 and graphs.n_kv == 1024
    for name in ("kq-0", "kq_soft_max-0"):
        assert kq[name]["bytes_pp"] == graphs.n_kv * graphs.n_tokens_pp * hp.n_head * 4
    assert [m["op"] for m in st["memory"]["added"]] == ["FLASH_ATTN_EXT"]
    html = AttnGraphsView(graphs).to_html()
    assert "kq_soft_max-0" in html and "98.25 MiB" in html
    back = records.load(records.save(graphs, tmp_path / "graphs.npz"))
    assert AttnGraphsView(back).to_html() == html
    assert AttnGraphsView(back, "reserve").state()["removed"] == st["removed"]
    with pytest.raises(ValueError, match="decode"):
        AttnGraphsView(back).show("prefill")
