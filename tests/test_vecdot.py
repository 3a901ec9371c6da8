"""The vec_dot lanes view: one output element of a real MUL_MAT (layer 0's Qcur, Q4_1 weights x the normalised
activations), recomputed lane by lane as ggml's AVX2 ggml_vec_dot_q4_1_q8_1 does, must be the MUL_MAT's output
bit for bit; with another float32 summation order it would not be (so the bit test can fail)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ggviz.ggml import consts as C
from ggviz.ggml import quants as Q
from ggviz.viz.widgets import VecDotLanes
from ggviz.capture import capture_mul_mat
from ggviz.viz.widgets.vecdot import vec_dot_q4_1_q8_1_lanes


@pytest.fixture(scope="module")
def cap(model):
    return capture_mul_mat(model, "Qcur-0")


def _u32(x):
    return np.asarray(x, np.float32).view(np.uint32)


def test_every_element_of_the_mul_mat_is_the_lanes_result(cap):
    n_rows, n_cols = cap["w_rows"].shape[0], cap["y"].shape[0]
    assert cap["weight"] == "blk.0.attn_q.weight" and cap["out"].shape == (n_cols, n_rows) and n_cols >= 2
    got = np.array([[vec_dot_q4_1_q8_1_lanes(cap["w_rows"][r], cap["y"][c])["result"] for r in range(n_rows)]
                    for c in range(n_cols)], np.float32)
    assert np.array_equal(_u32(got), _u32(cap["out"]))


def test_the_steps_are_ggmls(cap):
    L = vec_dot_q4_1_q8_1_lanes(cap["w_rows"][7], cap["y"][0])
    bx = cap["w_rows"][7].view(Q.BLOCK_DTYPES[C.GGML_TYPE_Q4_1])
    # the weight levels and d/m dequantize to what ggml's dequantize_row_q4_1 gives
    deq = np.asarray(Q.dequantize_row(C.GGML_TYPE_Q4_1, cap["w_rows"][7]), np.float32).reshape(-1)
    mine = (L["qx"] * bx["d"].astype(np.float32)[:, None] + bx["m"].astype(np.float32)[:, None]).reshape(-1)
    assert np.allclose(mine, deq, rtol=1e-6, atol=1e-6)
    # lane u of block b is the integer dot product of elements 4u..4u+3
    b = 5
    assert L["P"][b, 3] == int(np.dot(L["qx"][b, 12:16], L["qy"][b, 12:16]))
    # the last accumulators are the lanes that the reduce adds, in hsum_float_8's order
    l = L["acc"][-1]
    assert float(L["hsum"]) == float(np.float32(np.float32(np.float32(l[4] + l[0]) + np.float32(l[6] + l[2]))
                                              + np.float32(np.float32(l[5] + l[1]) + np.float32(l[7] + l[3]))))
    # a plain left-to-right float32 sum of the same products differs in the last bits somewhere in the matrix
    naive = []
    for r in range(0, cap["w_rows"].shape[0], 3):
        M = vec_dot_q4_1_q8_1_lanes(cap["w_rows"][r], cap["y"][0])
        s = np.float32(0)
        for v in (M["d0d1"][:, None] * M["P"].astype(np.float32)).reshape(-1):
            s = np.float32(s + v)
        naive.append(_u32(np.float32(s + M["summs"][-1])) != _u32(cap["out"][0][r]))
    assert any(naive)


def test_widget_state_and_static_rendering(cap):
    w = VecDotLanes(cap, row=5, block=3, column=1)
    st = w.state()
    assert st["matches_output"] and st["result_bits"] == st["output_bits"]
    assert st["n_blocks"] == 18 and len(st["P"]) == 8 and st["block"] == 3
    assert st["output"] == float(cap["out"][1][5])
    html = w.to_html()
    assert "data:image/png;base64," in html and "the same bits" in html and "hsum_float_8" in html
    w.widget
    w._w_block.value = 7
    assert w.block == 7 and "block 7" in w._w_block_html.value
    w._w_row.value = 100
    assert w.row == 100 and w.state()["matches_output"]
    with pytest.raises(ValueError, match="out of range"):
        w.select_row(10_000)
    assert w.row == 100
    # the book: rows 0..2 and 100, each drawn once, every block; the block's box moves right over the drawing, its
    # table and the row's reduce are the view's own
    rec = w.book_view()
    tab = {t["set"]: t for t in rec["tables"]}
    assert len(tab["picture"]["values"]) == 4 and len(tab["info"]["pick"]) == 4 * 18
    left = lambda k: json.loads(tab["cursor"]["values"][tab["cursor"]["pick"][k]])[0]["l"]   # noqa: E731
    assert left("2,0") < left("2,1") < left("2,17")
    w2 = VecDotLanes(cap, row=2, block=5, column=1)
    assert tab["info"]["values"][tab["info"]["pick"]["2,5"]] == w2.block_html()
    assert tab["detail"]["values"][tab["detail"]["pick"]["2,5"]] == w2.reduce_html()
    assert (w.row, w.block) == (100, 7)
