"""The flash-attention stepper: one FLASH_ATTN_EXT node of a real SmolLM2 decode step (llama.cpp's default context
params, flash attention on), one query row walked through the KV cells with the one-chunk kernel's own functions,
must end on the node's output row bit for bit, for every head; with an F32 accumulator instead of the kernel's F16
one it would not (so the bit test can fail). The record saves and loads to the same HTML."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ggviz import llama
from ggviz.capture import capture_flash_attn, records, walk_flash_attn
from ggviz.ggml.cpu import ops
from ggviz.viz.widgets import FlashAttnStepper


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
