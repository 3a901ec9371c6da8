"""Misuse of the ggml mirror (issue 13): every bad call is refused with a GGMLError naming the problem, and leaves
everything as it was.

Families: views whose strides reach beyond their source (view_1d..4d, and what is built on views: view_tensor,
permute, transpose, reshape), negative or past-the-end offsets, ``backend_tensor_set/get/memset`` bounds, set_rows
indices out of range (the faithful and the compiled kernel), overflow-checked sizes, and constructors that fail
(``view_1d`` with a negative offset, ``new_graph_custom`` with a negative size, ne = 2**63, a context out of memory,
an exception in the middle of a constructor).

"State unchanged" is checked byte for byte: the whole arena, ``used_mem``, the object list, ``n_objects`` and the
address -> tensor registry; and the next valid calls give the same arena, byte for byte, as on a fresh context
(both contexts use the same caller buffer, so even the pointers stored in the structs are the same).

Real ggml (tests/oracle) accepts several of the calls ggviz refuses -- ggviz is stricter on purpose, a Python mirror
must not write outside a tensor: it only checks the contiguous size of a view (so ``view_2d(a, 4, 4, 1000, 0)`` of a
16-float tensor is accepted, and reaches 12 KB past it), computes offsets and sizes in size_t (a negative offset
wraps, and ``view_1d(a, 4, -4)`` points 4 bytes before ``a``), and ``nelements`` of a 2^31 x 2^31 x 4 tensor wraps to
0. ``test_real_ggml_accepts_what_ggviz_refuses`` shows it.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggviz import ggml as gg
from ggviz import trace
from ggviz.ggml import alloc as A
from ggviz.ggml import backend as B
from ggviz.ggml import tensor as T
from ggviz.ggml.cpu import ggml_cpu
from tests.oracle.ggml_lib import RealGGML, available, unavailable_reason

try:                        # the compiled fast path is optional (Numba)
    from ggviz.ggml.cpu.fast import compiler
except ImportError:
    compiler = None

F32, F16, I32, I64, Q4_0 = gg.GGML_TYPE_F32, gg.GGML_TYPE_F16, gg.GGML_TYPE_I32, gg.GGML_TYPE_I64, gg.GGML_TYPE_Q4_0
SIZE = 1 << 16


# ---------------------------------------------------------------- helpers

def _snapshot(ctx):
    """Everything a failed call must leave alone."""
    lo, hi = ctx.base, ctx.base + ctx.mem_size
    reg = {a: t for a, t in T._registry.items() if lo <= a < hi}
    return ctx.mem_buffer.copy(), ctx.used_mem(), list(ctx.objects), ctx.n_objects, reg


def _assert_unchanged(ctx, snap):
    mem, used, objs, n_objects, reg = _snapshot(ctx)
    diff = np.flatnonzero(mem != snap[0])
    assert diff.size == 0, f"{diff.size} arena bytes changed, the first at offset {diff[:1]}"
    assert used == snap[1], "used_mem changed"
    assert len(objs) == len(snap[2]) and all(a is b for a, b in zip(objs, snap[2])), "object list changed"
    assert n_objects == snap[3], "n_objects changed"
    assert reg.keys() == snap[4].keys() and all(reg[k] is snap[4][k] for k in reg), "tensor registry changed"


def _aligned(n):
    raw = np.zeros(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n]


def _ctx_with_neighbours(buf=None):
    """An arena holding a (16 floats), a neighbour n after it, values in both."""
    ctx = gg.init(SIZE, buf)
    a = gg.set_name(gg.new_tensor_1d(ctx, F32, 16), "a")
    n = gg.set_name(gg.new_tensor_1d(ctx, F32, 8), "n")
    gg.set_data(a, np.arange(16, dtype=np.float32))
    gg.set_data(n, -np.arange(8, dtype=np.float32) - 1)
    return ctx, a, n


# each: (id, call(ctx, a), GGMLError message pattern). a is a 16-float (64-byte) tensor.
BAD_CALLS = [
    # views: every byte the strides reach must lie inside the source (real ggml checks only 4*4*4 <= 64 here)
    ("view_2d_stride_past_source", lambda ctx, a: gg.view_2d(ctx, a, 4, 4, 1000, 0),
     r"ggml_view_2d: a view of 'a' .*nb=\[4, 1000, 4000, 4000\].* reaches 3016 bytes.*'a' \(64 bytes\)"),
    ("view_2d_stride_one_float_too_far", lambda ctx, a: gg.view_2d(ctx, a, 4, 4, 17, 0),
     r"ggml_view_2d: .*up to byte 67.*\(64 bytes\)"),
    ("view_3d_stride_past_source", lambda ctx, a: gg.view_3d(ctx, a, 2, 2, 2, 8, 64, 0),
     r"ggml_view_3d: .*reaches 80 bytes, up to byte 80.*\(64 bytes\)"),
    ("view_4d_stride_past_source", lambda ctx, a: gg.view_4d(ctx, a, 1, 1, 1, 2, 4, 4, 64, 4),
     r"ggml_view_4d: .*offset 4 reaches 68 bytes, up to byte 72"),
    ("view_2d_offset_plus_stride", lambda ctx, a: gg.view_2d(ctx, a, 4, 2, 32, 32),
     r"ggml_view_2d: .*offset 32 reaches 48 bytes, up to byte 80"),
    ("view_2d_negative_stride", lambda ctx, a: gg.view_2d(ctx, a, 4, 2, -16, 32),
     r"ggml_view_2d: the strides nb=\[4, -16, -32, -32\] must be in 0..INT64_MAX"),
    ("view_4d_float_stride", lambda ctx, a: gg.view_4d(ctx, a, 2, 2, 1, 1, 8.0, 16, 16, 0),
     r"ggml_view_4d: the strides must be integers"),
    ("view_1d_negative_offset", lambda ctx, a: gg.view_1d(ctx, a, 4, -4),
     r"ggml_view_1d: negative offset -4 into 'a'"),
    ("view_1d_contiguous_past_source", lambda ctx, a: gg.view_1d(ctx, a, 8, 36),
     r"view of 32 bytes at offset 36 exceeds its source 'a' \(64 bytes\)"),
    ("view_1d_empty_past_end", lambda ctx, a: gg.view_1d(ctx, a, 0, 65),
     r"ggml_view_1d: offset 65 is past the end of 'a' \(64 bytes\)"),
    ("view_2d_float_ne", lambda ctx, a: gg.view_2d(ctx, a, 2.5, 2, 16, 0),
     r"ggml_view_2d: ne must hold integers"),
    ("view_1d_float_offset", lambda ctx, a: gg.view_1d(ctx, a, 2, 1.5),
     r"ggml_view_1d: the offset must be an integer"),
    ("reshape_too_many", lambda ctx, a: gg.reshape_2d(ctx, a, 4, 5),
     r"ggml_reshape_2d: cannot reshape 16 elements"),
    ("permute_not_a_permutation", lambda ctx, a: gg.permute(ctx, a, 0, 0, 1, 2),
     r"ggml_permute: axes \[0, 0, 1, 2\] must be a permutation"),
    ("permute_float_axis", lambda ctx, a: gg.permute(ctx, a, 0, 1.0, 2, 3),
     r"ggml_permute: an axis must be an integer"),
    # sizes: ne in 0..INT64_MAX, and every size derived from it fits int64_t
    ("ne_2_63", lambda ctx, a: gg.new_tensor_1d(ctx, F32, 2**63),
     r"ggml_new_tensor: ne=\[9223372036854775808\].*does not fit int64_t"),
    ("ne_negative", lambda ctx, a: gg.new_tensor_2d(ctx, F32, 4, -1),
     r"ggml_new_tensor: ne=\[4, -1\].*negative dimension"),
    ("nelements_wraps", lambda ctx, a: gg.new_tensor_3d(ctx, F32, 2**31, 2**31, 4),
     r"ggml_new_tensor: a f32 tensor of ne=\[2147483648, 2147483648, 4, 1\] overflows: its size "
     r"\(18446744073709551616 elements"),
    ("row_size_overflows", lambda ctx, a: gg.new_tensor_1d(ctx, F32, 2**62),
     r"overflows.*18446744073709551616 bytes"),
    ("stride_overflows_with_empty_dim", lambda ctx, a: gg.new_tensor_4d(ctx, F32, 2**40, 2**40, 1, 0),
     r"overflows"),
    ("ne_not_a_block_multiple", lambda ctx, a: gg.new_tensor_1d(ctx, Q4_0, 33),
     r"ne\[0\] = 33 is not a multiple of q4_0's block size 32"),
    ("ne_float", lambda ctx, a: gg.new_tensor_1d(ctx, F32, 4.0), r"ne must hold integers"),
    ("n_dims_missing_ne", lambda ctx, a: gg.new_tensor(ctx, F32, 3, [4, 4]), r"n_dims is 3 but ne has 2 values"),
    ("bad_type", lambda ctx, a: gg.new_tensor_1d(ctx, 99, 4), r"invalid ggml_type 99"),
    # the context runs out of memory: ggml_new_object refuses before writing
    ("out_of_memory_tensor", lambda ctx, a: gg.new_tensor_1d(ctx, F32, SIZE), r"not enough space"),
    ("out_of_memory_graph", lambda ctx, a: gg.new_graph_custom(ctx, 100000), r"not enough space"),
    ("graph_negative_size", lambda ctx, a: gg.new_graph_custom(ctx, -1), r"ggml_new_graph_custom: negative size -1"),
    ("graph_float_size", lambda ctx, a: gg.new_graph_custom(ctx, 8.5), r"size must be an integer"),
    ("new_buffer_negative", lambda ctx, a: gg.new_buffer(ctx, -8), r"ggml_new_object: negative size -8"),
    # op parameters are packed before the result exists
    ("scale_bad_param", lambda ctx, a: gg.scale(ctx, a, "x"), r"ggml_scale: bad operator parameters"),
    ("rms_norm_bad_param", lambda ctx, a: gg.rms_norm(ctx, a, None), r"ggml_rms_norm: bad operator parameters"),
    ("concat_float_dim", lambda ctx, a: gg.concat(ctx, a, a, 0.5), r"ggml_concat: dim must be an integer"),
]


@pytest.mark.parametrize("call,pattern", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_call_is_refused_and_changes_nothing(call, pattern):
    ctx, a, n = _ctx_with_neighbours()
    try:
        snap = _snapshot(ctx)
        with pytest.raises(gg.GGMLError, match=pattern):
            call(ctx, a)
        _assert_unchanged(ctx, snap)
    finally:
        gg.free(ctx)


# Op checks on their operands (made first; the refused call must change nothing after them): each is
# (id, operands {name: (type, ne) or a callable of ctx}, the call, the message pattern, or None: accepted). The ops
# test every condition at once and fall back to the checks one by one only when one fails: the message is the
# first failing check's, as when each was asked in turn.
_MASK_T = lambda ctx: gg.transpose(ctx, gg.new_tensor_2d(ctx, F16, 4, 256))  # noqa: E731 - a non-contiguous mask
_ROPE = (4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
_FA_QKV = {"q": (F32, [64, 4, 9]), "k": (F16, [64, 256, 3]), "v": (F16, [64, 256, 3])}
OP_CHECKS = [
    ("set_rows_ok", {"a": (F16, [64, 10]), "b": (F32, [64, 3]), "c": (I64, [3])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), None),
    ("set_rows_ne0", {"a": (F16, [64, 10]), "b": (F32, [32, 3]), "c": (I64, [3])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), r"ggml_set_rows: a.ne\[0\] must equal b.ne\[0\]"),
    ("set_rows_ne2", {"a": (F16, [64, 10, 2]), "b": (F32, [64, 3]), "c": (I64, [3])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), r"a and b must agree in ne\[2\], ne\[3\]"),
    ("set_rows_n_indices", {"a": (F16, [64, 10]), "b": (F32, [64, 3]), "c": (I64, [4])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), r"b.ne\[1\] must equal the number of indices"),
    ("set_rows_broadcast", {"a": (F16, [64, 10, 3]), "b": (F32, [64, 3, 3]), "c": (I64, [3, 2])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), r"c must broadcast over b"),
    ("set_rows_c_ne3", {"a": (F16, [64, 10]), "b": (F32, [64, 3]), "c": (I64, [3, 1, 1, 2])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), r"c.ne\[3\] must be 1"),
    ("set_rows_b_type", {"a": (F16, [64, 10]), "b": (I32, [64, 3]), "c": (I64, [3])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), r"b must be F32 or F16"),
    ("set_rows_c_type", {"a": (F16, [64, 10]), "b": (F32, [64, 3]), "c": (F32, [3])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), r"indices c must be I64 or I32"),
    ("set_rows_rows", {"a": (F16, [64, 10]), "b": lambda ctx: gg.transpose(ctx, gg.new_tensor_2d(ctx, F32, 3, 64)),
                       "c": (I64, [3])},
     lambda ctx, o: gg.set_rows(ctx, o["a"], o["b"], o["c"]), r"ggml_set_rows: rows must be contiguous"),
    ("mul_mat_ok", {"a": (F32, [64, 10]), "b": (F32, [64, 3])}, lambda ctx, o: gg.mul_mat(ctx, o["a"], o["b"]), None),
    ("mul_mat_shape", {"a": (F32, [64, 10]), "b": (F32, [32, 3])},
     lambda ctx, o: gg.mul_mat(ctx, o["a"], o["b"]), r"ggml_mul_mat: shapes do not match"),
    ("mul_mat_transposed", {"a": lambda ctx: gg.transpose(ctx, gg.new_tensor_2d(ctx, F32, 10, 64)),
                            "b": (F32, [64, 3])},
     lambda ctx, o: gg.mul_mat(ctx, o["a"], o["b"]), r"ggml_mul_mat: a must not be transposed"),
    ("mul_mat_both", {"a": lambda ctx: gg.transpose(ctx, gg.new_tensor_2d(ctx, F32, 10, 64)), "b": (F32, [32, 3])},
     lambda ctx, o: gg.mul_mat(ctx, o["a"], o["b"]), r"ggml_mul_mat: shapes do not match"),
    ("rope_ok", {"a": (F32, [64, 9, 4]), "b": (I32, [4]), "c": (F32, [32])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], o["c"], 64, 2, *_ROPE), None),
    ("rope_mode_1", {"a": (F32, [64, 9, 4]), "b": (I32, [4])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], None, 64, 1, *_ROPE), r"mode & 1 == 1 is no longer supported"),
    ("rope_positions_not_a_vector", {"a": (F32, [64, 9, 4]), "b": (I32, [4, 2])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], None, 64, 0, *_ROPE), r"positions b must be a vector"),
    ("rope_positions_type", {"a": (F32, [64, 9, 4]), "b": (F32, [4])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], None, 64, 0, *_ROPE), r"positions b must be I32"),
    ("rope_one_position_per_token", {"a": (F32, [64, 9, 4]), "b": (I32, [5])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], None, 64, 0, *_ROPE), r"need one position per token"),
    ("rope_mrope_ok", {"a": (F32, [64, 9, 4]), "b": (I32, [16])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], None, 64, 8, *_ROPE), None),
    ("rope_mrope_positions", {"a": (F32, [64, 9, 4]), "b": (I32, [4])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], None, 64, 8, *_ROPE), r"mrope expects 4 positions per token"),
    ("rope_freq_factors_type", {"a": (F32, [64, 9, 4]), "b": (I32, [4]), "c": (F16, [32])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], o["c"], 64, 0, *_ROPE), r"freq factors c must be F32"),
    ("rope_freq_factors_size", {"a": (F32, [64, 9, 4]), "b": (I32, [4]), "c": (F32, [16])},
     lambda ctx, o: gg.rope_ext(ctx, o["a"], o["b"], o["c"], 64, 0, *_ROPE), r"freq factors c must hold n_dims/2"),
    ("flash_attn_ok", dict(_FA_QKV, m=(F16, [256, 4])),
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], o["m"], 0.125, 0.0, 0.0), None),
    ("flash_attn_empty_mask_dim", dict(_FA_QKV, m=(F16, [256, 4, 0])),      # (C: q->ne[2] % 0 traps)
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], o["m"], 0.125, 0.0, 0.0),
     r"ggml_flash_attn_ext: mask must broadcast over q"),
    ("flash_attn_shape", dict(_FA_QKV, q=(F32, [32, 4, 9])),
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], None, 0.125, 0.0, 0.0),
     r"ggml_flash_attn_ext: shapes do not match"),
    ("flash_attn_heads", dict(_FA_QKV, q=(F32, [64, 4, 8])),
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], None, 0.125, 0.0, 0.0),
     r"ggml_flash_attn_ext: shapes do not match"),
    ("flash_attn_ne3", {"q": (F32, [64, 4, 9, 2]), "k": (F16, [64, 256, 3, 2]), "v": (F16, [64, 256, 3])},
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], None, 0.125, 0.0, 0.0),
     r"q, k, v must have the same ne\[3\]"),
    ("flash_attn_mask_type", dict(_FA_QKV, m=(F32, [256, 4])),
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], o["m"], 0.125, 0.0, 0.0), r"mask must be F16"),
    ("flash_attn_mask_contiguous", dict(_FA_QKV, m=_MASK_T),
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], o["m"], 0.125, 0.0, 0.0),
     r"mask must be contiguous"),
    ("flash_attn_mask_broadcast", dict(_FA_QKV, m=(F16, [256, 4, 2])),
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], o["m"], 0.125, 0.0, 0.0),
     r"mask must broadcast over q in ne\[2\], ne\[3\]"),
    ("glu_ok", {"a": (F32, [64, 3])}, lambda ctx, o: gg.swiglu(ctx, o["a"]), None),
    ("glu_split_ok", {"a": (F32, [64, 3]), "b": (F32, [64, 3])}, lambda ctx, o: gg.swiglu_split(ctx, o["a"], o["b"]),
     None),
    ("glu_a_not_contiguous", {"a": lambda ctx: gg.transpose(ctx, gg.new_tensor_2d(ctx, F32, 3, 64))},
     lambda ctx, o: gg.swiglu(ctx, o["a"]), r"ggml_glu: a must be contiguous in dims >= 1"),
    ("glu_b_not_contiguous", {"a": (F32, [64, 3]),
                              "b": lambda ctx: gg.permute(ctx, gg.new_tensor_3d(ctx, F32, 64, 3, 2), 0, 2, 1, 3)},
     lambda ctx, o: gg.swiglu_split(ctx, o["a"], o["b"]), r"ggml_glu: b must be contiguous in dims >= 1"),
    ("glu_shape", {"a": (F32, [64, 3]), "b": (F32, [64, 4])},
     lambda ctx, o: gg.swiglu_split(ctx, o["a"], o["b"]), r"ggml_glu: a and b must have the same shape"),
    ("glu_type", {"a": (F32, [64, 3]), "b": (F16, [64, 3])},
     lambda ctx, o: gg.swiglu_split(ctx, o["a"], o["b"]), r"ggml_glu: a and b must have the same type"),
    ("flash_attn_alibi_without_mask", dict(_FA_QKV),
     lambda ctx, o: gg.flash_attn_ext(ctx, o["q"], o["k"], o["v"], None, 0.125, 8.0, 0.0),
     r"max_bias \(ALiBi\) needs a mask"),
]


@pytest.mark.parametrize("operands,call,pattern", [c[1:] for c in OP_CHECKS], ids=[c[0] for c in OP_CHECKS])
def test_op_checks_refuse_with_the_first_failing_message(operands, call, pattern):
    ctx = gg.init(SIZE, None, True)
    try:
        o = {k: (v(ctx) if callable(v) else gg.new_tensor(ctx, v[0], len(v[1]), v[1])) for k, v in operands.items()}
        snap = _snapshot(ctx)
        if pattern is None:
            r = call(ctx, o)
            assert ctx.n_objects == snap[3] + 1 and r.op != gg.GGML_OP_NONE
        else:
            with pytest.raises(gg.GGMLError, match=pattern):
                call(ctx, o)
            _assert_unchanged(ctx, snap)
    finally:
        gg.free(ctx)


def _valid_calls(ctx, a):
    """A few valid calls after the bad ones: views, a graph, a compute through the views."""
    v = gg.set_name(gg.view_2d(ctx, a, 4, 2, 32, 16), "v")        # rows a[4:8], a[12:16]
    y = gg.scale_inplace(ctx, gg.view_1d(ctx, a, 4, 16), 10.0)     # a[4:8] *= 10
    c = gg.cont(ctx, gg.transpose(ctx, v))
    r = gg.reshape_2d(ctx, gg.view_1d(ctx, a, 8, 0), 4, 2)
    gf = gg.new_graph_custom(ctx, 16, False)
    gg.build_forward_expand(gf, y)
    gg.build_forward_expand(gf, c)
    gg.build_forward_expand(gf, gg.add(ctx, r, r))
    assert gg.graph_compute_with_ctx(ctx, gf, 1) == gg.GGML_STATUS_SUCCESS
    return c


def test_next_valid_calls_match_a_fresh_context():
    """Every bad call above on one context, then valid calls: the arena is byte-identical to a fresh context's that
    made only the valid calls (same caller buffer, so the same addresses)."""
    buf = _aligned(SIZE)
    images = []
    for with_bad_calls in (True, False):
        buf[:] = 0
        ctx, a, n = _ctx_with_neighbours(buf)
        try:
            if with_bad_calls:
                for name, call, pattern in BAD_CALLS:
                    with pytest.raises(gg.GGMLError, match=pattern):
                        call(ctx, a)
            p = _valid_calls(ctx, a)
            assert gg.get_data(p).tolist() == [[[[40, 12], [50, 13], [60, 14], [70, 15]]]]
            assert gg.get_data(n).reshape(-1).tolist() == (-np.arange(8) - 1).tolist()    # the neighbour
            images.append((buf.copy(), ctx.used_mem(), len(ctx.objects), ctx.n_objects))
        finally:
            gg.free(ctx)
    assert np.array_equal(images[0][0], images[1][0])
    assert images[0][1:] == images[1][1:]


# ---------------------------------------------------------------- views: real strides

def test_views_that_fit_exactly_are_accepted_and_write_only_their_source():
    ctx, a, n = _ctx_with_neighbours()
    try:
        n_before = gg.get_data(n).copy()
        hdr_n = n.raw.copy()
        # each one's last element is a's last float (byte 60..64)
        views = [gg.view_2d(ctx, a, 4, 4, 16, 0), gg.view_2d(ctx, a, 1, 4, 16, 12),
                 gg.view_3d(ctx, a, 2, 2, 2, 8, 32, 16), gg.view_4d(ctx, a, 1, 1, 1, 4, 4, 4, 16, 12),
                 gg.view_1d(ctx, a, 16, 0), gg.view_1d(ctx, a, 0, 64)]
        views += [gg.transpose(ctx, views[0]), gg.permute(ctx, views[2], 2, 0, 1, 3),
                  gg.reshape_2d(ctx, views[4], 8, 2), gg.view_tensor(ctx, views[3])]
        for i, v in enumerate(views):
            gg.get_data(v)[...] = 100 + i
        assert np.array_equal(gg.get_data(n), n_before) and np.array_equal(n.raw, hdr_n)
        # a broadcast (stride 0) view reaches only its first row (ggml's own check still wants its contiguous size)
        z = gg.view_2d(ctx, a, 4, 2, 0, 32)
        assert gg.nbytes(z) == 16
    finally:
        gg.free(ctx)


def test_view_of_a_view_is_checked_against_the_base_with_the_offsets_added():
    ctx, a, n = _ctx_with_neighbours()
    try:
        v = gg.set_name(gg.view_1d(ctx, a, 8, 16), "v")              # a[4:12]
        gg.view_2d(ctx, v, 2, 3, 16, 8)                               # 16 + 8 + 4 + 2*16 + 4 = 64: fits
        snap = _snapshot(ctx)
        with pytest.raises(gg.GGMLError, match=r"a view of 'a' .* at offset 24 reaches 48 bytes, up to byte 72, beyond its source 'a' \(64 bytes\)"):
            gg.view_2d(ctx, v, 2, 3, 20, 8)
        _assert_unchanged(ctx, snap)
    finally:
        gg.free(ctx)


def test_quantized_view_extent_counts_whole_blocks():
    ctx = gg.init(SIZE)
    try:
        q = gg.set_name(gg.new_tensor_2d(ctx, Q4_0, 64, 2), "q")    # 2 rows of 2 blocks of 18 bytes: 72 bytes
        gg.view_2d(ctx, q, 32, 2, 36, 18)                             # the second block of each row: ends at 72
        snap = _snapshot(ctx)
        with pytest.raises(gg.GGMLError, match=r"at offset 19 reaches 54 bytes, up to byte 73, beyond its source 'q' \(72 bytes\)"):
            gg.view_2d(ctx, q, 32, 2, 36, 19)
        _assert_unchanged(ctx, snap)
    finally:
        gg.free(ctx)


# ---------------------------------------------------------------- failed constructors roll back

def test_exception_inside_a_constructor_rolls_the_arena_back():
    """A failure after ggml_new_object wrote the header (here: a trace listener raising on the new tensor or on the
    graph's object; in life an interrupt) is undone: arena bytes, object list, n_objects, registry."""
    ctx, a, n = _ctx_with_neighbours()
    # bytes that are not zero where the next objects go, so that a restore of "zeros" would be caught
    ctx.mem_buffer[ctx.used_mem():] = 0xA5
    snap = _snapshot(ctx)

    def boom(ev):
        if ev["kind"] in ("tensor.new", "ctx.object"):
            raise KeyboardInterrupt(ev["kind"])

    trace.listen(boom)
    try:
        for call in (lambda: gg.new_tensor_1d(ctx, F32, 4), lambda: gg.view_2d(ctx, a, 4, 2, 16, 0),
                     lambda: gg.new_graph_custom(ctx, 8, True), lambda: gg.new_graph_custom(ctx, 64)):
            with pytest.raises(KeyboardInterrupt):
                call()
            _assert_unchanged(ctx, snap)
    finally:
        trace.unlisten(boom)
        gg.free(ctx)


# ---------------------------------------------------------------- overflow-checked sizes

def test_sizes_at_the_int64_limit():
    ctx = gg.init(SIZE, None, True)                     # no_alloc: shapes only
    try:
        big = gg.new_tensor_3d(ctx, F32, 2**30, 2**29, 2)              # 2^60 elements, 2^62 bytes: fits
        assert gg.nelements(big) == 2**60 and gg.nbytes(big) == 2**62 and gg.nrows(big) == 2**30
        snap = _snapshot(ctx)
        with pytest.raises(gg.GGMLError, match=r"overflows: its size \(\d+ elements, 9223372036854775808 bytes\)"):
            gg.new_tensor_3d(ctx, F32, 2**31, 2**29, 2)                # 2^63 bytes: one past INT64_MAX
        _assert_unchanged(ctx, snap)
        m = gg.new_tensor_1d(ctx, gg.GGML_TYPE_I8, 2**63 - 1)          # INT64_MAX bytes: the largest there is
        assert gg.nbytes(m) == 2**63 - 1
        e = gg.new_tensor_4d(ctx, F32, 2**40, 2**20, 0, 7)             # empty; its strides fit
        assert gg.nelements(e) == 0 and gg.nbytes(e) == 0 and e.strides == (4, 2**42, 2**62, 0)
        # nelements/nrows in Python ints: an ne written by hand (as C code may) does not wrap either
        e.ne[:] = [2**31, 2**31, 4, 1]
        assert gg.nelements(e) == 2**64 and gg.nrows(e) == 2**33
    finally:
        gg.free(ctx)


# ---------------------------------------------------------------- backend_tensor_set / get / memset

@pytest.fixture
def buffer_tensors():
    """a (8 x 4 floats) and its neighbour n in one CPU backend buffer; v = a's row 1."""
    ctx = gg.init(SIZE, None, True)
    a = gg.set_name(gg.new_tensor_2d(ctx, F32, 8, 4), "a")
    n = gg.set_name(gg.new_tensor_1d(ctx, F32, 16), "n")
    v = gg.set_name(gg.view_1d(ctx, a, 8, 32), "v")
    buf = A.backend_alloc_ctx_tensors_from_buft(ctx, B.backend_cpu_buffer_type())
    B.backend_tensor_set(a, np.arange(32, dtype=np.float32), 0, 128)
    B.backend_tensor_set(n, np.full(16, 7, np.float32), 0, 64)
    base = B.backend_buffer_get_base(buf)
    mem = B._bytes_at(base, B.backend_buffer_get_size(buf))
    yield a, n, v, mem
    B.backend_buffer_free(buf)
    gg.free(ctx)


BAD_TENSOR_IO = [
    ("set_negative_offset", lambda a, v: B.backend_tensor_set(v, np.zeros(2, np.float32), -8, 8),
     r"ggml_backend_tensor_set: negative offset \(offset=-8, size=8\) for tensor 'v' \(32 bytes\)"),
    ("set_negative_offset_zero_size", lambda a, v: B.backend_tensor_set(v, b"", -8, 0), r"negative offset"),
    ("set_negative_size", lambda a, v: B.backend_tensor_set(v, b"", 0, -1), r"negative size"),
    ("set_out_of_bounds", lambda a, v: B.backend_tensor_set(v, np.zeros(9, np.float32), 0, 36),
     r"tensor write out of bounds: offset 0 \+ size 36 > 32 bytes of 'v'"),
    ("set_offset_out_of_bounds", lambda a, v: B.backend_tensor_set(v, np.zeros(2, np.float32), 28, 8),
     r"tensor write out of bounds: offset 28 \+ size 8"),
    ("set_data_too_short", lambda a, v: B.backend_tensor_set(v, np.zeros(2, np.float32), 0, 16),
     r"ggml_backend_tensor_set: data holds 8 bytes, size asks for 16"),
    ("set_float_offset", lambda a, v: B.backend_tensor_set(v, np.zeros(2, np.float32), 1.0, 8),
     r"offset and size must be integers"),
    ("get_negative_offset", lambda a, v: B.backend_tensor_get(v, np.zeros(2, np.float32), -4, 8),
     r"ggml_backend_tensor_get: negative offset"),
    ("get_out_of_bounds", lambda a, v: B.backend_tensor_get(v, None, 8, 32), r"tensor read out of bounds"),
    ("get_data_too_small", lambda a, v: B.backend_tensor_get(v, np.zeros(1, np.float32), 0, 8),
     r"ggml_backend_tensor_get: data holds 4 bytes, size asks for 8"),
    ("get_into_a_strided_array", lambda a, v: B.backend_tensor_get(v, np.zeros(8, np.float32)[::2], 0, 16),
     r"data must be a writable C-contiguous NumPy array"),
    ("memset_negative_offset", lambda a, v: B.backend_tensor_memset(v, 0, -4, 4),
     r"ggml_backend_tensor_memset: negative offset"),
    ("memset_out_of_bounds", lambda a, v: B.backend_tensor_memset(v, 0, 0, 33), r"tensor write out of bounds"),
    ("memset_value_not_a_byte", lambda a, v: B.backend_tensor_memset(v, 256, 0, 4), r"value must be a byte"),
    ("set_2d_last_row_out_of_bounds",
     lambda a, v: B.backend_tensor_set_2d(a, np.zeros(64, np.float32), 0, 16, 5, 32, 16),
     r"tensor write out of bounds: offset 128 \+ size 16"),
    ("get_2d_negative_stride", lambda a, v: B.backend_tensor_get_2d(a, None, 0, 16, 2, -32, 16), r"negative"),
]


@pytest.mark.parametrize("call,pattern", [c[1:] for c in BAD_TENSOR_IO], ids=[c[0] for c in BAD_TENSOR_IO])
def test_tensor_io_out_of_range_is_refused_and_changes_nothing(buffer_tensors, call, pattern):
    a, n, v, mem = buffer_tensors
    before = mem.copy()
    with pytest.raises(gg.GGMLError, match=pattern):
        call(a, v)
    assert np.array_equal(mem, before)
    # the next valid call does what it does on untouched tensors
    B.backend_tensor_set(v, np.full(8, 5, np.float32), 0, 32)
    expect = np.arange(32, dtype=np.float32)
    expect[8:16] = 5
    assert B.backend_tensor_get(a, None, 0, 128).view(np.float32).tolist() == expect.tolist()
    assert B.backend_tensor_get(n, None, 0, 64).view(np.float32).tolist() == [7.0] * 16


def test_tallocr_refusing_a_tensor_keeps_its_offset():
    """ggml_tallocr_alloc of a tensor that already has a buffer is refused, and the allocator's offset stays."""
    ctx = gg.init(SIZE, None, True)
    buf = B.backend_buft_alloc_buffer(B.backend_cpu_buffer_type(), 4096)
    try:
        a = gg.new_tensor_1d(ctx, F32, 16)
        b = gg.new_tensor_1d(ctx, F32, 16)
        talloc = A.tallocr_new(buf)
        A.tallocr_alloc(talloc, a)
        offset = talloc.offset
        with pytest.raises(gg.GGMLError, match="already has a buffer"):
            A.tallocr_alloc(talloc, a)
        assert talloc.offset == offset
        A.tallocr_alloc(talloc, b)
        assert b.data == a.data + 64                 # right after a, as without the refused call
    finally:
        B.backend_buffer_free(buf)
        gg.free(ctx)


# ---------------------------------------------------------------- set_rows indices

def _set_rows_graph(ctx, idx_type, idx):
    """dst (4 rows of 8 floats) between two guards, in one arena; 2 rows of src go to rows idx of dst."""
    g0 = gg.set_name(gg.new_tensor_1d(ctx, F32, 8), "guard0")
    dst = gg.set_name(gg.new_tensor_2d(ctx, F32, 8, 4), "dst")
    g1 = gg.set_name(gg.new_tensor_1d(ctx, F32, 8), "guard1")
    src = gg.set_name(gg.new_tensor_2d(ctx, F32, 8, 2), "src")
    ids = gg.set_name(gg.new_tensor_1d(ctx, idx_type, 2), "ids")
    for t, val in ((g0, 1), (dst, 2), (g1, 3)):
        gg.set_data(t, np.full(gg.nelements(t), val, np.float32))
    gg.set_data(src, np.arange(16, dtype=np.float32))
    gg.get_data(ids)[...] = idx
    out = gg.set_rows(ctx, dst, src, ids)
    gf = gg.new_graph_custom(ctx, 16, False)
    gg.build_forward_expand(gf, out)
    return gf, dst, (g0, g1)


def _compute(gf, nth, compiled):
    plan = ggml_cpu.graph_plan(gf, nth)
    if compiled:
        if compiler is None:
            pytest.skip("the compiled fast path needs Numba")
        plan.extra = compiler.compile_graph(gf)
        assert plan.extra is not None, "the compiled walk does not cover set_rows"
    else:
        plan.extra = None                  # the faithful, node-by-node kernels
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    return ggml_cpu.graph_compute(gf, plan)


@pytest.mark.parametrize("compiled", [False, True], ids=["faithful", "compiled"])
@pytest.mark.parametrize("idx_type", [I32, I64], ids=["i32", "i64"])
@pytest.mark.parametrize("bad", [4, -1, 2**40], ids=["ne1", "negative", "huge"])
def test_set_rows_index_out_of_range(compiled, idx_type, bad):
    if idx_type == I32 and bad == 2**40:
        bad = 2**31 - 1
    ctx = gg.init(SIZE)
    try:
        gf, dst, guards = _set_rows_graph(ctx, idx_type, [1, bad])
        with pytest.raises(gg.GGMLError, match=r"computing node 0 .*GGML_ASSERT\(i1 >= 0 && i1 < ne1\) failed"):
            _compute(gf, 1, compiled)
        for g, val in zip(guards, (1, 3)):                  # nothing written outside dst
            assert gg.get_data(g).tolist() == [[[[float(val)] * 8]]]
        rows = gg.get_data(dst)[0, 0]
        assert rows[[0, 2, 3]].tolist() == [[2.0] * 8] * 3
        # row 1 is the good index's row: the compiled walk writes it, the faithful kernel checks first
        assert rows[1].tolist() == (list(range(8)) if compiled else [2.0] * 8)
        # the same context computes a valid set_rows afterwards
        gf2, dst2, _ = _set_rows_graph(ctx, idx_type, [3, 0])
        assert _compute(gf2, 2, compiled) == gg.GGML_STATUS_SUCCESS
        assert gg.get_data(dst2)[0, 0, [3, 0]].tolist() == [list(range(8)), list(range(8, 16))]
    finally:
        gg.free(ctx)


@pytest.mark.parametrize("compiled", [False, True], ids=["faithful", "compiled"])
@pytest.mark.parametrize("bad", [4, -1], ids=["ne01", "negative"])
def test_get_rows_index_out_of_range(compiled, bad):
    """The neighbour of set_rows: a row index outside src0 reads nothing and is reported by both kernels."""
    ctx = gg.init(SIZE)
    try:
        src = gg.set_name(gg.new_tensor_2d(ctx, F32, 8, 4), "src")
        ids = gg.set_name(gg.new_tensor_1d(ctx, I32, 2), "ids")
        gg.set_data(src, np.arange(32, dtype=np.float32))
        gg.get_data(ids)[...] = [2, bad]
        gf = gg.new_graph_custom(ctx, 16, False)
        gg.build_forward_expand(gf, gg.get_rows(ctx, src, ids))
        with pytest.raises(gg.GGMLError, match=r"computing node 0 .*GGML_ASSERT\(i01 >= 0 && i01 < ne01\) failed"):
            _compute(gf, 1, compiled)
        assert gg.get_data(src).reshape(-1).tolist() == list(range(32))
    finally:
        gg.free(ctx)


# ---------------------------------------------------------------- fuzz: random views and strides

def _rand_int(rng, hi):
    """Mostly small, sometimes negative, sometimes huge."""
    r = rng.random()
    if r < 0.05:
        return -int(rng.integers(1, 64))
    if r < 0.08:
        return int(rng.choice([2**31, 2**62, 2**63 - 1, 2**63, 2**64]))
    return int(rng.integers(0, hi))


def test_fuzz_random_views_never_corrupt_the_arena():
    """Random view_1d..4d / permute / transpose / reshape / view_tensor calls on a tensor between two neighbours,
    each accepted view written through (NumPy over get_data, and a ggml compute). After every call: the neighbours'
    bytes and headers are unchanged, and a refused call changed nothing at all. Seeded, 2500 calls (~3 s)."""
    rng = np.random.default_rng(13)
    ctx = gg.init(1 << 22)
    try:
        left = gg.set_name(gg.new_tensor_1d(ctx, F32, 32), "left")
        a = gg.set_name(gg.new_tensor_3d(ctx, F32, 8, 4, 2), "a")       # 256 bytes
        right = gg.set_name(gg.new_tensor_1d(ctx, F32, 32), "right")
        gg.set_data(left, rng.standard_normal(32))
        gg.set_data(right, rng.standard_normal(32))
        a_lo = a.data - ctx.base
        a_hi = a_lo + gg.nbytes(a)

        def outside_a():
            """The arena, except a's data: neighbours' data, every header and struct (a's own included)."""
            m = ctx.mem_buffer
            return np.concatenate([m[:a_lo], m[a_hi:ctx.used_mem()]])

        n_ok = n_refused = n_computed = 0
        views = [a]
        for it in range(2500):
            parent = views[int(rng.integers(len(views)))]
            kind = int(rng.integers(8))
            ne = [max(0, _rand_int(rng, 9)) if rng.random() < 0.9 else _rand_int(rng, 9) for _ in range(4)]
            nb = [_rand_int(rng, 300) for _ in range(3)]
            off = _rand_int(rng, 300)
            calls = {
                0: lambda: gg.view_1d(ctx, parent, ne[0], off),
                1: lambda: gg.view_2d(ctx, parent, ne[0], ne[1], nb[0], off),
                2: lambda: gg.view_3d(ctx, parent, ne[0], ne[1], ne[2], nb[0], nb[1], off),
                3: lambda: gg.view_4d(ctx, parent, ne[0], ne[1], ne[2], ne[3], nb[0], nb[1], nb[2], off),
                4: lambda: gg.permute(ctx, parent, *rng.permutation(4).tolist()),
                5: lambda: gg.transpose(ctx, parent),
                6: lambda: gg.reshape_1d(ctx, parent, gg.nelements(parent)),
                7: lambda: gg.view_tensor(ctx, parent),
            }
            before = outside_a()
            snap_used, snap_n = ctx.used_mem(), len(ctx.objects)
            last_next = ctx.objects[-1].hdr_offs + 16               # obj_cur->next: set by an accepted call
            mem_a = ctx.mem_buffer[a_lo:a_hi].copy()
            try:
                v = calls[kind]()
            except gg.GGMLError:
                n_refused += 1
                assert ctx.used_mem() == snap_used and len(ctx.objects) == snap_n, (it, kind)
                assert np.array_equal(ctx.mem_buffer[a_lo:a_hi], mem_a), (it, kind)
                assert np.array_equal(outside_a(), before), (it, kind)
                continue
            n_ok += 1
            # the new object's own header and struct are new bytes; everything before them must be as it was
            old = before[:snap_used - (a_hi - a_lo)]
            now = outside_a()[:old.size]
            k = last_next - (a_hi - a_lo) if last_next >= a_hi else last_next
            assert int(now[k:k + 8].view(np.uint64)[0]) == ctx.objects[-1].hdr_offs + ctx.base, (it, kind)
            now[k:k + 8] = old[k:k + 8]
            assert np.array_equal(now, old), (it, kind)
            # a view reaches only a's bytes
            if gg.nbytes(v):
                assert a.data <= v.data and v.data + gg.nbytes(v) <= a.data + gg.nbytes(a), (it, kind)
            views.append(v)
            if len(views) > 40:
                views.pop(1)
            # write through it: NumPy over the strided view, then (sometimes) a ggml compute into it
            before = outside_a()
            if gg.nelements(v):
                gg.get_data(v)[...] = rng.standard_normal(v.shape[::-1])
                if it % 10 == 0:
                    gf = gg.new_graph_custom(ctx, 256, False)
                    simple = gg.is_contiguous(v) and gg.is_padded_1d(v)      # what the SCALE kernel takes
                    y = gg.scale_inplace(ctx, v, 0.5) if simple else gg.cpy(ctx, gg.cont(ctx, v), v)
                    gg.build_forward_expand(gf, y)
                    before = outside_a()[:before.size]
                    assert gg.graph_compute_with_ctx(ctx, gf, 2) == gg.GGML_STATUS_SUCCESS
                    n_computed += 1
            assert np.array_equal(outside_a()[:before.size], before), (it, kind)
        assert n_ok > 100 and n_refused > 100 and n_computed > 5, (n_ok, n_refused, n_computed)
    finally:
        gg.free(ctx)


# ---------------------------------------------------------------- ggviz is stricter than real ggml on purpose

@pytest.mark.skipif(not available(), reason=f"real ggml unavailable: {unavailable_reason()}")
def test_real_ggml_accepts_what_ggviz_refuses():
    """The calls real ggml 0.20.2 accepts (no abort) and ggviz refuses: a view whose strides leave its source, a
    negative offset (wrapped to a size_t), a 2^31 x 2^31 x 4 tensor whose nelements wraps to 0."""
    g = RealGGML()
    ctx = g.init(1 << 20)
    try:
        a = g.new_tensor_1d(ctx, g.GGML_TYPE_F32, 16)
        v = g.view_2d(ctx, a, 4, 4, 1000, 0)
        assert g.nbytes(v) == 3016 > g.nbytes(a) == 64
        w = g.view_1d(ctx, a, 4, 2**64 - 4)
        assert g.tensor_struct(w).data == g.tensor_struct(a).data - 4
        c2 = g.init(1 << 20, None, True)
        t = g.new_tensor_3d(c2, g.GGML_TYPE_F32, 2**31, 2**31, 4)
        assert g.nelements(t) == 0 and g.nbytes(t) == 0
        g.free(c2)
    finally:
        g.free(ctx)
