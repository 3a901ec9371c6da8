"""Tests of the real-ggml oracle bindings (tests/oracle/ggml_lib.py).

Each expectation below is derived by hand from ggml's documented layout rules,
not read back from the library, so a wrong struct layout / signature fails.
"""

import numpy as np
import pytest


from tests.oracle.ggml_lib import RealGGML, available, run_in_subprocess, unavailable_reason

pytestmark = pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())

MB = 1024 * 1024


@pytest.fixture(scope="module")
def g():
    return RealGGML()


@pytest.fixture
def ctx(g):
    c = g.init(16 * MB)
    yield c
    g.free(c)


def test_constants_and_type_table(g):
    assert g.GGML_TYPE_F32 == 0 and g.GGML_TYPE_F16 == 1 and g.GGML_TYPE_Q8_0 == 8
    assert g.GGML_TYPE_BF16 == 30 and g.GGML_OP_NONE == 0
    assert g.op_name(g.GGML_OP_MUL_MAT) == "MUL_MAT"
    assert g.type_name(g.GGML_TYPE_Q4_0) == "q4_0"
    assert g.type_size(g.GGML_TYPE_F16) == 2
    assert g.blck_size(g.GGML_TYPE_Q8_0) == 32
    assert g.type_size(g.GGML_TYPE_Q8_0) == 34                    # fp16 scale + 32 int8
    assert g.row_size(g.GGML_TYPE_Q8_0, 64) == 68
    assert g.tensor_overhead() == 32 + 336                          # ggml_object + ggml_tensor
    assert g.version() == "0.20.2"


def test_2x3_tensor_layout_and_used_mem(g, ctx):
    assert g.used_mem(ctx) == 0
    t = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 2, 3)
    info = g.tensor_info(t)
    assert info["ne"] == (2, 3, 1, 1)
    assert info["nb"] == (4, 8, 24, 24)
    assert info["type"] == 0 and info["op"] == 0
    assert info["src"] == (0,) * 10 and info["view_src"] == 0
    # object header (32) + tensor struct (336) + data (24 padded to 16 -> 32)
    assert g.used_mem(ctx) == 32 + 336 + 32
    base = g.get_mem_buffer(ctx)
    assert info["addr"] == base + 32
    assert info["data"] == base + 32 + 336
    assert g.nbytes(t) == 24 and g.nelements(t) == 6 and g.nrows(t) == 3
    ci = g.context_info(ctx)
    assert ci["n_objects"] == 1
    assert ci["objects"][0]["offs"] == 32 and ci["objects"][0]["size"] == 336 + 32
    arena = g.arena_bytes(ctx)
    assert arena.shape == (400,)
    # ne[0] of the tensor struct lives at offset 32 (object) + 16 inside the arena
    assert int(arena[48:56].view(np.int64)[0]) == 2


def test_new_tensor_from_list_and_names(g, ctx):
    t = g.new_tensor(ctx, g.GGML_TYPE_F16, 3, [5, 4, 3])
    assert g.tensor_info(t)["ne"] == (5, 4, 3, 1)
    assert g.tensor_info(t)["nb"] == (2, 10, 40, 120)
    g.set_name(t, "weight")
    assert g.get_name(t) == "weight"
    g.format_name(t, "blk.%d" % 7)
    assert g.tensor_info(t)["name"] == "blk.7"
    g.set_input(t)
    assert g.tensor_info(t)["flags"] & g.GGML_TENSOR_FLAG_INPUT


def test_add_compute_with_ctx(g, ctx):
    a = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    b = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    g.set_array(a, [[1, 2, 3], [4, 5, 6]])
    g.set_array(b, [[10, 20, 30], [40, 50, 60]])
    c = g.add(ctx, a, b)
    assert g.tensor_info(c)["src"][:2] == (a, b)
    assert g.tensor_info(c)["op"] == g.GGML_OP_ADD
    gf = g.new_graph(ctx)
    g.build_forward_expand(gf, c)
    assert g.graph_compute_with_ctx(ctx, gf, 2) == 0
    np.testing.assert_array_equal(g.get_array(c)[0, 0], [[11, 22, 33], [44, 55, 66]])


def test_transpose_view_strides_and_get_array(g, ctx):
    a = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)          # 2 rows of 3
    g.set_array(a, np.arange(6))
    at = g.transpose(ctx, a)
    ia = g.tensor_info(at)
    assert ia["ne"] == (2, 3, 1, 1)
    assert ia["nb"] == (12, 4, 24, 24)
    assert ia["view_src"] == a and ia["op"] == g.GGML_OP_TRANSPOSE
    np.testing.assert_array_equal(g.get_array(at)[0, 0], [[0, 3], [1, 4], [2, 5]])
    v = g.view_2d(ctx, a, 2, 2, 12, 4)                         # skip first element of each row
    np.testing.assert_array_equal(g.get_array(v)[0, 0], [[1, 2], [4, 5]])
    assert g.tensor_info(v)["view_offs"] == 4
    p = g.permute(ctx, g.reshape_3d(ctx, a, 1, 3, 2), 2, 0, 1, 3)
    assert g.tensor_info(p)["ne"] == (3, 2, 1, 1)


def test_graph_nodes_leafs_and_hash(g, ctx):
    x = g.new_tensor_1d(ctx, g.GGML_TYPE_F32, 4)
    w = g.new_tensor_1d(ctx, g.GGML_TYPE_F32, 4)
    y = g.mul(ctx, x, w)
    z = g.sqr(ctx, y)
    gf = g.new_graph(ctx)
    g.build_forward_expand(gf, z)
    info = g.graph_info(gf)
    assert info["size"] == 2048                    # GGML_DEFAULT_GRAPH_SIZE
    assert info["n_nodes"] == 2 and g.graph_n_nodes(gf) == 2
    assert info["nodes"] == [y, z]
    assert g.graph_node(gf, -1) == z
    assert info["n_leafs"] == 2 and info["leafs"] == [x, w]
    keys = {k for k in info["hash_keys"] if k}
    assert keys == {x, w, y, z}
    slot = info["hash_keys"].index(y)
    assert info["use_counts"][slot] == 1           # y used once (by z)
    assert info["grads"] is None and info["order"] == 0
    assert g.graph_overhead() == g.graph_overhead_custom(2048, False)


def test_graph_plan_mul_mat_f16_weight(g, ctx):
    w = g.new_tensor_2d(ctx, g.GGML_TYPE_F16, 64, 8)
    x = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 64, 3)
    y = g.mul_mat(ctx, w, x)
    assert g.tensor_info(y)["ne"] == (8, 3, 1, 1)
    gf = g.new_graph(ctx)
    g.build_forward_expand(gf, y)
    plan = g.graph_plan(gf, 4)
    assert plan["n_threads"] == 4
    # src1 is converted to the F16 vec_dot type: at least 64*3 halves
    assert plan["work_size"] >= 64 * 3 * 2
    # F32 x F32 needs no conversion
    w32 = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 64, 8)
    gf2 = g.new_graph(ctx)
    g.build_forward_expand(gf2, g.mul_mat(ctx, w32, x))
    assert g.graph_plan(gf2, 4)["work_size"] == 0

    rng = np.random.default_rng(0)
    wv = rng.standard_normal((8, 64)).astype(np.float16)
    xv = rng.standard_normal((3, 64)).astype(np.float32)
    g.set_array(w, wv)
    g.set_array(x, xv)
    assert g.graph_compute(gf, 4) == 0
    ref = xv.astype(np.float16).astype(np.float64) @ wv.astype(np.float64).T
    np.testing.assert_allclose(g.get_array(y)[0, 0], ref, rtol=1e-3, atol=1e-3)


def test_gallocr_no_alloc_graph(g):
    ctx = g.init(g.tensor_overhead() * 8 + g.graph_overhead(), no_alloc=True)
    try:
        a = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 16, 4)
        b = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 16, 4)
        c = g.scale(ctx, g.add(ctx, a, b), 0.5)
        assert g.tensor_info(c)["data"] == 0
        gf = g.new_graph(ctx)
        g.build_forward_expand(gf, c)
        galloc = g.gallocr_new(g.backend_cpu_buffer_type())
        assert g.gallocr_reserve(galloc, gf)
        assert g.gallocr_get_buffer_size(galloc, 0) >= 2 * 16 * 4 * 4
        assert g.gallocr_alloc_graph(galloc, gf)
        ic = g.tensor_info(c)
        assert ic["data"] != 0 and ic["buffer"] != 0
        assert g.backend_buffer_get_base(ic["buffer"]) <= ic["data"]
        g.set_array(a, np.ones((4, 16)))
        g.set_array(b, np.full((4, 16), 3.0))
        assert g.graph_compute(gf, 1) == 0
        np.testing.assert_array_equal(g.get_array(c), np.full((1, 1, 4, 16), 2.0, np.float32))
        g.gallocr_free(galloc)
    finally:
        g.free(ctx)


def test_user_mem_buffer_and_f16_bf16_roundtrip(g):
    buf = np.zeros(1 * MB, dtype=np.uint8)
    ctx = g.init(buf.nbytes, buf)
    try:
        assert g.get_mem_buffer(ctx) == buf.ctypes.data
        h = g.new_tensor_1d(ctx, g.GGML_TYPE_F16, 3)
        g.set_array(h, [1.0, 0.5, 1.0 + 2.0 ** -11])          # last one rounds to even -> 1.0
        np.testing.assert_array_equal(g.get_array(h).ravel(), np.array([1, 0.5, 1], np.float16))
        assert bytes(buf[32 + 336:32 + 336 + 6]) == np.array([1, 0.5, 1], np.float16).tobytes()
        bf = g.new_tensor_1d(ctx, g.GGML_TYPE_BF16, 2)
        g.set_array(bf, [1.0, -2.0])
        np.testing.assert_array_equal(g.get_array(bf).ravel(), [0x3F80, 0xC000])
        np.testing.assert_array_equal(g.to_float(bf).ravel(), [1.0, -2.0])
    finally:
        g.free(ctx)


def test_q8_0_quantize_roundtrip(g, ctx):
    q = g.new_tensor_2d(ctx, g.GGML_TYPE_Q8_0, 32, 2)
    vals = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    g.set_array(q, vals)
    raw = g.get_array(q)
    assert raw.shape == (1, 1, 2, 34) and raw.dtype == np.uint8
    # block = fp16 scale d = amax/127, then round(x/d) as int8: amax is 1.0 -> q[-1] = 127
    d = raw[0, 0, 0, :2].view(np.float16)[0]
    assert d == np.float16(1.0 / 127)
    assert raw[0, 0, 1, 2:].view(np.int8)[-1] == 127
    np.testing.assert_allclose(g.to_float(q)[0, 0], vals, atol=1.0 / 127)


def test_many_op_signatures(g, ctx):
    """Builds one graph touching the ops whose C signatures are easy to get wrong."""
    F32, I32 = g.GGML_TYPE_F32, g.GGML_TYPE_I32
    emb = g.new_tensor_2d(ctx, F32, 8, 5)
    g.set_array(emb, np.arange(40).reshape(5, 8))
    ids = g.new_tensor_1d(ctx, I32, 3)
    g.set_array(ids, [4, 0, 2])
    x = g.get_rows(ctx, emb, ids)                                     # (8, 3)
    np.testing.assert_array_equal(g.tensor_info(x)["ne"], (8, 3, 1, 1))
    xn = g.rms_norm(ctx, x, 1e-5)
    assert g.op_params_f32(xn)[0] == np.float32(1e-5)
    x3 = g.reshape_3d(ctx, xn, 4, 2, 3)                                # head_dim 4, 2 heads, 3 tok
    pos = g.new_tensor_1d(ctx, I32, 3)
    g.set_array(pos, [0, 1, 2])
    r = g.rope_ext(ctx, x3, pos, None, 4, g.GGML_ROPE_TYPE_NEOX, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    op = g.tensor_info(r)["op_params"]
    assert op[1] == 4 and op[2] == 2                                    # n_dims, mode
    assert g.op_params_f32(r)[5] == 10000.0                             # freq_base
    q = g.cont(ctx, g.permute(ctx, r, 0, 2, 1, 3))                     # (4, 3 tok, 2 heads)
    assert g.tensor_info(q)["ne"] == (4, 3, 2, 1)
    kq = g.mul_mat(ctx, q, q)                                          # (3 kv, 3 q, 2 heads)
    mask = g.new_tensor_2d(ctx, F32, 3, 3)
    g.set_array(mask, np.triu(np.full((3, 3), -np.inf, np.float32), 1))
    sm = g.soft_max_ext(ctx, kq, mask, 0.5, 0.0)
    assert g.op_params_f32(sm)[:2] == (0.5, 0.0)
    cat = g.concat(ctx, sm, sm, 1)                                     # (3, 6, 2)
    assert g.tensor_info(cat)["ne"] == (3, 6, 2, 1)
    assert g.tensor_info(cat)["op_params"][0] == 1
    gate = g.swiglu_split(ctx, xn, xn)
    cache = g.new_tensor_2d(ctx, F32, 8, 6)
    g.set_array(cache, np.zeros((6, 8)))
    rows = g.new_tensor_1d(ctx, g.GGML_TYPE_I64, 3)
    g.set_array(rows, [5, 1, 3])
    sr = g.set_rows(ctx, cache, gate, rows)
    col_sums = g.sum_rows(ctx, g.cont(ctx, g.transpose(ctx, sr)))          # (1, 8)
    am = g.argmax(ctx, g.reshape_1d(ctx, col_sums, 8))
    outs = [cat, am, g.gelu(ctx, x), g.silu(ctx, x), g.relu(ctx, x), g.mean(ctx, x),
            g.norm(ctx, x, 1e-6), g.soft_max(ctx, x), g.out_prod(ctx, x, x), g.sqrt(ctx, g.sqr(ctx, x)),
            g.div(ctx, g.sub(ctx, x, x), g.add1(ctx, x, g.new_f32(ctx, 1.0))),
            g.repeat(ctx, ids, g.new_tensor_2d(ctx, I32, 3, 2)),
            g.swiglu(ctx, g.new_tensor_2d(ctx, F32, 8, 1)), g.dup(ctx, x),
            g.cpy(ctx, x, g.new_tensor_2d(ctx, g.GGML_TYPE_F16, 8, 3))]
    gf = g.new_graph_custom(ctx, 256, False)
    for o in outs:
        g.build_forward_expand(gf, o)
    assert g.graph_compute(gf, 2) == 0
    # get_rows picked rows 4, 0, 2
    np.testing.assert_array_equal(g.get_array(x)[0, 0, :, 0], [32, 0, 16])
    # causal soft_max: first query attends only to itself
    np.testing.assert_allclose(g.get_array(sm)[0, :, 0, :], [[1, 0, 0], [1, 0, 0]], atol=1e-6)
    # set_rows wrote token rows into cache rows 5, 1, 3 and left the others untouched
    srv = g.get_array(sr)[0, 0]
    np.testing.assert_array_equal(srv[[0, 2, 4]], 0)
    np.testing.assert_array_equal(srv[[5, 1, 3]], g.get_array(gate)[0, 0])
    # swiglu_split(a, b) = silu(a) * b
    xv = g.get_array(xn)[0, 0].astype(np.float64)
    np.testing.assert_allclose(srv[[5, 1, 3]], xv / (1 + np.exp(-xv)) * xv, rtol=1e-5, atol=1e-6)
    # argmax over the 8 per-column sums of the (transposed) cache
    assert g.get_array(am)[0, 0, 0, 0] == int(np.argmax(srv.sum(axis=0)))
    assert g.op_desc(am) == "ARGMAX"
    assert g.op_desc(outs[2]) == "GELU"                               # unary ops report their kind


def test_assert_failure_is_isolated():
    rc, _, err = run_in_subprocess(
        "from tests.oracle.ggml_lib import RealGGML\n"
        "g = RealGGML(); c = g.init(1 << 20)\n"
        "a = g.new_tensor_1d(c, 0, 4); b = g.new_tensor_1d(c, 0, 5)\n"
        "g.add(c, a, b)\n")
    assert rc != 0 and "GGML_ASSERT" in err
