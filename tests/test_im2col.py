"""IM2COL and the convolutions built on it (ggml_conv_1d, ggml_conv_2d) against the real ggml 0.20.2 (libggml-python
through ctypes).

``ggml_im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, is_2D, dst_type)``: the result's type, shape, op_params and sources
as ggml builds them, the planner's answer (its n_threads is the node's n_tasks, and the work size) and the values,
byte for byte, for F32 -> F32, F32 -> F16 and F16 -> F16, 1-D and 2-D, with strides, padding (asymmetric too) and
dilation, on 1 and 3 threads (more threads than channels included: ggml splits the channels). ``ggml_conv_2d`` and
``ggml_conv_1d``: the same graph (op by op, shape by shape) and the same result bits; and what they mean, checked
against a direct NumPy convolution. Bad input is refused with a GGMLError naming the problem and changes nothing.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggviz import ggml as gg
from ggviz.ggml import tensor as T
from ggviz.ggml.cpu import mul_mat
from tests import graphs
from tests.oracle.ggml_lib import available, unavailable_reason
from tests.pairs import real_ggml

F32, F16, BF16, Q4_0 = gg.GGML_TYPE_F32, gg.GGML_TYPE_F16, gg.GGML_TYPE_BF16, gg.GGML_TYPE_Q4_0

needs_oracle = pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())


@pytest.fixture(autouse=True)
def _as_the_oracle_build(monkeypatch):
    # libggml-python 0.20.2 is built without GGML_USE_LLAMAFILE: conv_2d's MUL_MAT takes ggml's own vec_dot there
    monkeypatch.setattr(mul_mat, "USE_LLAMAFILE", False)


# (kernel ne, image ne, s0, s1, p0, p1, d0, d1, is_2D)
CASES = {
    "2d_3x3": ((3, 3, 2, 4), (6, 6, 2, 1), 1, 1, 0, 0, 1, 1, True),
    "2d_asym": ((3, 2, 5, 3), (9, 7, 5, 2), 2, 1, 1, 2, 1, 2, True),     # stride, padding, dilation differ by axis
    "2d_short": ((5, 3, 3, 2), (4, 5, 3, 1), 2, 3, 0, 1, 1, 1, True),    # (4 - 5)/2 + 1 = 1 in C's division
    "1d": ((3, 4, 2, 1), (10, 4, 2, 1), 2, 0, 1, 0, 2, 0, False),
}


def _values(shape, seed):
    return np.random.default_rng(seed).standard_normal(int(np.prod(shape))).astype(np.float32) * 3


def _info(G, t):
    s = graphs.tensor_info(G, t, 0)
    return s["type"], s["ne"], s["op"], s["op_params"][:7]


def _im2col(G, case, src_type, dst_type, n_threads):
    ka, kb, s0, s1, p0, p1, d0, d1, is_2d = CASES[case]
    ctx = G.init(8 << 20)
    try:
        a = G.new_tensor_4d(ctx, F16, *ka)
        b = G.new_tensor_4d(ctx, src_type, *kb)
        x = _values(kb, 1)
        graphs.set_values(G, b, x if src_type == F32 else x.astype(np.float16))
        c = G.im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, is_2d, dst_type)
        info = _info(G, c)
        gf = G.new_graph(ctx)
        G.build_forward_expand(gf, c)
        plan = G.graph_plan(gf, n_threads)
        plan = (plan["work_size"], plan["n_threads"]) if isinstance(plan, dict) else (plan.work_size, plan.n_threads)
        if graphs.is_oracle(G):
            assert G.graph_compute(gf, n_threads) == 0
        else:
            assert G.graph_compute_with_ctx(ctx, gf, n_threads) == 0
        return graphs.raw_bytes(G, c), info, plan
    finally:
        G.free(ctx)


@needs_oracle
@pytest.mark.parametrize("src_type,dst_type", [(F32, F32), (F32, F16), (F16, F16)], ids=["f32", "f32_f16", "f16"])
@pytest.mark.parametrize("case", list(CASES))
def test_im2col_bitwise_with_ggml(case, src_type, dst_type):
    g = real_ggml()
    ref, rinfo, rplan = _im2col(g, case, src_type, dst_type, 3)
    for n in (1, 3):
        got, info, plan = _im2col(gg, case, src_type, dst_type, n)
        assert info == rinfo, "type, ne, op, op_params (s0, s1, p0, p1, d0, d1, is_2D)"
        assert plan == (rplan if n == 3 else (0, 1)), "ggml_graph_plan: work size, n_threads (IM2COL: n_tasks = n)"
        assert got == ref, f"{n} threads: the im2col bytes differ from ggml's"


def test_im2col_rows_hand_checked():
    """The meaning, on an image whose pixels hold their own index: row (oh, ow) of the result lists, channel by
    channel, the pixels under the kernel placed at (oh*s1 - p1, ow*s0 - p0), stepping d1 / d0, 0 outside."""
    ka, kb, s0, s1, p0, p1, d0, d1, _ = CASES["2d_asym"]
    KW, KH, IC, _ = ka
    IW, IH, _, N = kb
    ctx = gg.init(1 << 20)
    a = gg.new_tensor_4d(ctx, F16, *ka)
    b = gg.new_tensor_4d(ctx, F32, *kb)
    gg.set_data(b, np.arange(1, IW * IH * IC * N + 1, dtype=np.float32))     # pixel value = 1 + its index
    c = gg.im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, F32)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, c)
    assert gg.graph_compute_with_ctx(ctx, gf, 2) == 0
    got = np.array(gg.get_data(c))                                           # (N, OH, OW, IC*KH*KW)
    OW, OH = c.shape[1], c.shape[2]
    assert (OW, OH) == ((IW + 2 * p0 - d0 * (KW - 1) - 1) // s0 + 1, (IH + 2 * p1 - d1 * (KH - 1) - 1) // s1 + 1)
    for n in range(N):
        for oh in range(OH):
            for ow in range(OW):
                want = []
                for ic in range(IC):
                    for kh in range(KH):
                        for kw in range(KW):
                            ih, iw = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
                            inside = 0 <= ih < IH and 0 <= iw < IW
                            want.append(1 + ((n * IC + ic) * IH + ih) * IW + iw if inside else 0)
                assert got[n, oh, ow].tolist() == want, (n, oh, ow)
    gg.free(ctx)


def _conv(G, kind, kernel_type, n_threads, case):
    ka, kb, s0, s1, p0, p1, d0, d1, _ = CASES[case]
    ctx = G.init(16 << 20)
    try:
        if kind == "2d":
            a = G.new_tensor_4d(ctx, kernel_type, *ka)
            b = G.new_tensor_4d(ctx, F32, *kb)
        else:
            a = G.new_tensor_3d(ctx, kernel_type, *ka[:3])
            b = G.new_tensor_3d(ctx, F32, *kb[:3])
        w = _values(ka, 2)[:int(np.prod(graphs.ne(G, a)))]
        graphs.set_values(G, a, w.astype(np.float16) if kernel_type == F16 else w)
        graphs.set_values(G, b, _values(kb, 3)[:int(np.prod(graphs.ne(G, b)))])
        c = (G.conv_2d(ctx, a, b, s0, s1, p0, p1, d0, d1) if kind == "2d" else G.conv_1d(ctx, a, b, s0, p0, d0))
        gf = G.new_graph(ctx)
        G.build_forward_expand(gf, c)
        ops = [_info(G, t)[:3] for t in graphs.graph_nodes(G, gf)]
        plan = G.graph_plan(gf, 3)
        plan = (plan["work_size"], plan["n_threads"]) if isinstance(plan, dict) else (plan.work_size, plan.n_threads)
        if graphs.is_oracle(G):
            assert G.graph_compute(gf, n_threads) == 0
        else:
            assert G.graph_compute_with_ctx(ctx, gf, n_threads) == 0
        return graphs.raw_bytes(G, c), ops, plan, w, _values(kb, 3)
    finally:
        G.free(ctx)


def _direct_conv2d(w, x, ka, kb, s0, s1, p0, p1, d0, d1):
    """The textbook convolution (cross-correlation, as in ML), float64: out[n, oc, oh, ow]."""
    KW, KH, IC, OC = ka
    IW, IH, _, N = kb
    W = w.reshape(OC, IC, KH, KW).astype(np.float64)
    X = np.pad(x.reshape(N, IC, IH, IW).astype(np.float64), ((0, 0), (0, 0), (p1, p1), (p0, p0)))
    OH = (IH + 2 * p1 - d1 * (KH - 1) - 1) // s1 + 1
    OW = (IW + 2 * p0 - d0 * (KW - 1) - 1) // s0 + 1
    out = np.zeros((N, OC, OH, OW))
    for kh in range(KH):
        for kw in range(KW):
            patch = X[:, :, kh * d1: kh * d1 + s1 * (OH - 1) + 1: s1, kw * d0: kw * d0 + s0 * (OW - 1) + 1: s0]
            out += np.einsum("nchw,oc->nohw", patch, W[:, :, kh, kw])
    return out


@needs_oracle
@pytest.mark.parametrize("kernel_type", [F16, F32], ids=["f16_kernel", "f32_kernel"])
@pytest.mark.parametrize("case", ["2d_3x3", "2d_asym"])
def test_conv_2d_bitwise_with_ggml(case, kernel_type):
    g = real_ggml()
    ref, rops, rplan, _, _ = _conv(g, "2d", kernel_type, 2, case)
    for n in (1, 3):
        got, ops, plan, w, x = _conv(gg, "2d", kernel_type, n, case)
        assert ops == rops, "the same graph: type, ne and op of every node"
        assert plan == rplan, "ggml_graph_plan: work size (the kernel to F16 when it is F32), n_threads"
        assert got == ref, f"{n} threads: conv_2d's bytes differ from ggml's"
    views = (gg.GGML_OP_RESHAPE, gg.GGML_OP_PERMUTE)
    assert [op for _, _, op in rops if op not in views] == [gg.GGML_OP_IM2COL, gg.GGML_OP_MUL_MAT, gg.GGML_OP_CONT]
    # what it means: a convolution, to F16's precision (the image is rounded to F16 in the im2col)
    ka, kb, s0, s1, p0, p1, d0, d1, _ = CASES[case]
    want = _direct_conv2d(w.astype(np.float16) if kernel_type == F16 else w, x, ka, kb, s0, s1, p0, p1, d0, d1)
    have = np.frombuffer(ref, np.float32).reshape(want.shape)
    assert np.allclose(have, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@needs_oracle
def test_conv_1d_bitwise_with_ggml():
    g = real_ggml()
    ref, rops, rplan, _, _ = _conv(g, "1d", F16, 2, "1d")
    for n in (1, 3):
        got, ops, plan, _, _ = _conv(gg, "1d", F16, n, "1d")
        assert (ops, plan) == (rops, rplan)
        assert got == ref, f"{n} threads: conv_1d's bytes differ from ggml's"


# ---------------------------------------------------------------- bad input

def _snapshot(ctx):
    lo, hi = ctx.base, ctx.base + ctx.mem_size
    reg = {k: v for k, v in T._registry.items() if lo <= k < hi}
    return ctx.mem_buffer.copy(), ctx.used_mem(), list(ctx.objects), ctx.n_objects, reg


def _assert_unchanged(ctx, snap):
    mem, used, objs, n_objects, reg = _snapshot(ctx)
    assert np.array_equal(mem, snap[0]), "arena bytes changed"
    assert (used, n_objects) == (snap[1], snap[3]), "used_mem / n_objects changed"
    assert len(objs) == len(snap[2]) and all(x is y for x, y in zip(objs, snap[2])), "object list changed"
    assert reg.keys() == snap[4].keys(), "tensor registry changed"


BAD = [
    ("channels_2d", lambda ctx, t: gg.im2col(ctx, t["k"], t["x1"], 1, 1, 0, 0, 1, 1, True, F16),
     r"ggml_im2col: a and b must have the same channels: a.ne\[2\] == b.ne\[2\]"),
    ("channels_1d", lambda ctx, t: gg.conv_1d(ctx, t["k1"], t["x1"], 1, 0, 1),
     r"ggml_im2col: a and b must have the same channels: b.ne\[1\] == a.ne\[1\]"),
    ("too_small", lambda ctx, t: gg.conv_2d(ctx, t["k"], t["x"], 1, 1, 0, 0, 4, 1),
     r"ggml_im2col: b too small compared to a \(OW = -2\)"),
    ("zero_stride", lambda ctx, t: gg.conv_2d(ctx, t["k"], t["x"], 1, 0, 0, 0, 1, 1), r"strides must not be 0"),
    ("float_stride", lambda ctx, t: gg.conv_2d(ctx, t["k"], t["x"], 1.5, 1, 0, 0, 1, 1), r"s0 must be an integer"),
    ("param_range", lambda ctx, t: gg.im2col(ctx, t["k"], t["x"], 1, 1, 2**31, 0, 1, 1, True, F32),
     r"ggml_im2col: bad operator parameters"),
    ("transposed_kernel", lambda ctx, t: gg.conv_2d(ctx, t["kt"], t["x"], 1, 1, 0, 0, 1, 1),
     r"ggml_conv_2d: the kernel a must be contiguous"),
]


@pytest.mark.parametrize("call,pattern", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_refused_and_changes_nothing(call, pattern):
    ctx = gg.init(1 << 20)
    k = gg.new_tensor_4d(ctx, F16, 3, 3, 2, 4)
    t = dict(k=k, kt=gg.transpose(ctx, k), x=gg.new_tensor_4d(ctx, F32, 6, 6, 2, 1),
             x1=gg.new_tensor_4d(ctx, F32, 6, 6, 3, 1), k1=gg.new_tensor_3d(ctx, F16, 3, 3, 2))   # x1: 3 channels
    snap = _snapshot(ctx)
    try:
        with pytest.raises(gg.GGMLError, match=pattern):
            call(ctx, t)
        _assert_unchanged(ctx, snap)
    finally:
        gg.free(ctx)


def test_conv_2d_out_of_memory_midway_changes_nothing():
    """Arenas that hold the im2col but not all of conv_2d's 7 tensors: the call fails and leaves no tensor behind."""
    probe = gg.init(1 << 20)
    k = gg.new_tensor_4d(probe, F16, 3, 3, 2, 4)
    x = gg.new_tensor_4d(probe, F32, 6, 6, 2, 1)
    used = probe.used_mem()
    gg.conv_2d(probe, k, x, 1, 1, 0, 0, 1, 1)
    need = probe.used_mem() - used
    gg.free(probe)
    failed = 0
    for extra in range(400, need, 97):
        ctx = gg.init(used + extra)
        k = gg.new_tensor_4d(ctx, F16, 3, 3, 2, 4)
        x = gg.new_tensor_4d(ctx, F32, 6, 6, 2, 1)
        snap = _snapshot(ctx)
        with pytest.raises(gg.GGMLError, match="not enough space in the context's memory pool"):
            gg.conv_2d(ctx, k, x, 1, 1, 0, 0, 1, 1)
        _assert_unchanged(ctx, snap)
        failed += 1
        gg.free(ctx)
    assert failed > 5
    ctx = gg.init(used + need)
    k = gg.new_tensor_4d(ctx, F16, 3, 3, 2, 4)
    x = gg.new_tensor_4d(ctx, F32, 6, 6, 2, 1)
    assert gg.conv_2d(ctx, k, x, 1, 1, 0, 0, 1, 1).shape == (4, 4, 4, 1)
    gg.free(ctx)


@pytest.mark.parametrize("src_type,dst_type,pattern", [
    (F16, F32, r"GGML_ASSERT\(src1->type == GGML_TYPE_F32\) failed \(src1 is f16\)"),
    (BF16, F16, r"GGML_ASSERT\(src1->type == GGML_TYPE_F16 \|\| src1->type == GGML_TYPE_F32\) failed"),
    (F32, Q4_0, r"no kernel for a q4_0 result \(F16 or F32\)"),
])
def test_im2col_wrong_types_fail_the_compute(src_type, dst_type, pattern):
    """ggml checks the types in the kernel (GGML_ASSERT, GGML_ABORT for another result type): so does ggviz, and
    the error reaches the caller naming the node."""
    ctx = gg.init(1 << 20)
    a = gg.new_tensor_4d(ctx, F16, 32, 1, 1, 1)          # rows of 32 values: a Q4_0 result can be made
    b = gg.new_tensor_4d(ctx, src_type, 32, 4, 1, 1)
    c = gg.im2col(ctx, a, b, 1, 1, 0, 0, 1, 1, True, dst_type)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, c)
    with pytest.raises(gg.GGMLError, match=r"computing node 0 .*" + pattern):
        gg.graph_compute_with_ctx(ctx, gf, 2)
    gg.free(ctx)


# ---------------------------------------------------------------- the lesson's figure and exercise (nb01 §4)

def test_im2col_figure_draws_the_computed_matrix():
    """Every cell of the figure's matrix is the im2col's value, "·" exactly where the kernel hangs over the padding
    (counted by hand from the geometry), and the input panel shows each pixel once."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ggviz import viz
    ctx = gg.init(1 << 20)
    img = gg.new_tensor_4d(ctx, F32, 5, 4, 2, 1)
    k = gg.new_tensor_4d(ctx, F16, 3, 3, 2, 1)
    gg.set_data(img, np.arange(40, dtype=np.float32))
    c = gg.im2col(ctx, k, img, 2, 1, 1, 1, 1, 1, True, F16)           # OW = 3, OH = 4: 12 rows of 18
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, c)
    assert gg.graph_compute_with_ctx(ctx, gf, 3) == 0
    fig = viz.im2col_figure(c, oh=1, ow=2)
    ax0, ax1 = fig.axes
    cells = [t.get_text() for t in ax1.texts]
    m = np.array(gg.get_data_f32(c)).reshape(12, 18)
    pads = sum(1 for oh in range(4) for ow in range(3) for ic in range(2) for kh in range(3) for kw in range(3)
               if not (0 <= oh + kh - 1 < 4 and 0 <= 2 * ow + kw - 1 < 5))
    assert len(cells) == 12 * 18 and cells.count("·") == pads == 2 * (108 - 10 * 7)   # per channel: (oh, kh) 10 of 12 inside, (ow, kw) 7 of 9
    assert all(t == "·" or float(t) == v for t, v in zip(cells, m.reshape(-1)))
    assert sorted(float(t.get_text()) for t in ax0.texts if t.get_text()[0].isdigit()) == list(range(40))
    assert "s=(2, 1)" in ax1.get_title() and "ne = [18, 3, 4, 1]" in ax1.get_title()
    plt.close(fig)
    gg.free(ctx)


def test_im2col_exercise():
    from ggviz.viz.widgets import exercise as ex
    e = ex.im2col_ne([3, 3, 2, 3], [6, 6, 2, 1], 2, 1, 1)
    assert e.kind == "rerun" and e.answer == (18, 3, 3, 1)            # (6 + 2 - 2 - 1)//2 + 1 = 3
    assert e.check("[18, 3, 3, 1]") and not e.check("18 4 4 1")
    assert ex.im2col_ne([3, 3, 2, 3], [6, 6, 2, 1], 1, 0, 2).answer == (18, 2, 2, 1)   # dilation 2: a 5x5 reach
