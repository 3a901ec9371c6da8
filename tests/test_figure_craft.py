"""Figure craft (issue 12, item 6), checked on the drawn figures: labels that do not collide, a long vector drawn as
a grid, colour bars that say what the colours mean, one swatch per view op."""
from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from ggviz import ggml  # noqa: E402
from ggviz.viz import arena as A  # noqa: E402
from ggviz.viz import graph_dot as G  # noqa: E402
from ggviz.viz.gguf_map import plot_gguf_map  # noqa: E402
from ggviz.viz.widgets._base import array_png, colorbar_html, wrap_vector  # noqa: E402

MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _no_overlap(fig, texts):
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in texts if t.get_text()]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    return len(boxes)


def test_wrap_vector_and_colorbar():
    g, blank, w = wrap_vector(np.arange(49152, dtype=np.float32)[None, :])
    assert g.shape == (192, 256) and blank is None and w == 256
    assert g[1, 0] == 256 and g[-1, -1] == 49151                    # read left to right, top to bottom
    g, blank, w = wrap_vector(np.ones((100, 1)))                     # a column too
    assert g.shape == (2, 64) and blank.sum() == 28 and not blank.reshape(-1)[:100].any()
    small = np.ones((3, 40))
    assert wrap_vector(small)[0] is small and wrap_vector(small)[2] is None
    png = array_png(g, blank=blank)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    html = colorbar_html(-0.5, 2.0, "RdBu_r", label="x")
    assert "linear-gradient" in html and "-0.5" in html and ">2<" in html and ">0<" in html
    assert ">0<" not in colorbar_html(1.0, 2.0)                      # 0 only where it is inside the range


def test_view_ops_have_their_own_swatch():
    cols = [G.op_color(op) for op in ("RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE")]
    assert len(set(cols)) == 4 and G.BOX_COLOR not in cols


@pytest.mark.skipif(not MODEL.exists(), reason="the default model is not in data/models")
def test_gguf_map_labels_do_not_collide():
    from ggviz.ggml.gguf import load_gguf

    gf = load_gguf(str(MODEL))
    fig = plot_gguf_map(gf, selected="blk.0.attn_q.weight", label_kv=8, label_tensors=14)
    fig.canvas.draw()
    ax2 = fig.axes[1]
    under = [t for t in ax2.texts if t.get_position()[1] < -0.1]       # the labels under the bar
    assert _no_overlap(fig, under) >= 8
    assert all(t.get_rotation() == 0 for t in under)
    # the 272 tensor infos and data are grouped by layer: 30 outlined boxes per section
    outlines = [p for p in ax2.patches if p.get_facecolor()[3] == 0 and p.get_linewidth() == 0.7]
    assert len(outlines) == 2 * 30
    plt.close(fig)


def test_arena_labels_do_not_collide():
    ctx = ggml.init(1 << 20)
    for k in range(14):
        ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 1 + 3 * k), f"tensor_number_{k}")
    ax = A.plot_arena(ctx, scale="log", max_labels=14)
    fig = ax.figure
    fig.canvas.draw()
    labels = [t for t in ax.texts if t.get_position()[1] > 1.0]
    assert _no_overlap(fig, labels + [ax.title]) >= 8
    assert all(t.get_rotation() == 0 for t in labels)
    plt.close(fig)
