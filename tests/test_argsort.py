"""ARGSORT, TOP_K and argsort_top_k against the real ggml: libggml-python 0.20.2 (ctypes, in process) and the ggml
llama-cpp-python 0.3.36 vendors (what llama.cpp runs; tests/oracle/llamacpp_cpu.py, a child process).

``ggml_argsort(ctx, a, order)``, ``ggml_argsort_top_k(ctx, a, k)`` and ``ggml_top_k(ctx, a, k)``: the result's
shape, type, op and op_params as ggml builds them, the planner's work size (TOP_K: one int32 row per thread) and
the indices, element for element, on F32 rows full of ties (std::sort and std::partial_sort are not stable: equal
values come out in the order libstdc++'s introsort / heap select leaves them, which ggviz walks step by step),
row lengths 1 to 300 (16 is introsort's insertion-sort threshold), with 1 and 3 threads. The two ggml versions'
constructors and CPU kernels are the same code (ggml.c ``ggml_argsort`` .. ``ggml_top_k``, ops.cpp
``ggml_compute_forward_argsort`` / ``_top_k``, ggml-cpu.c's n_tasks and work size are identical in 0.20.2 and the
vendored tree): both are checked, and agree. TOP_K's output is *not* in value order: ggml swaps its first two on
purpose. Then the expert routing of llama.cpp's build_moe_ffn (SOFT_MAX -> argsort_top_k -> GET_ROWS) on a
hand-made router, and bad input.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggviz import ggml as gg
from tests import graphs
from tests.oracle import llamacpp_cpu
from tests.oracle.ggml_lib import available, unavailable_reason
from tests.pairs import real_ggml

F32, I32, F16 = gg.GGML_TYPE_F32, gg.GGML_TYPE_I32, gg.GGML_TYPE_F16
ASC, DESC = gg.GGML_SORT_ORDER_ASC, gg.GGML_SORT_ORDER_DESC

needs_oracle = pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())


def _rows() -> list[np.ndarray]:
    """(R, n) float32 row sets: hand-made ties, heavy ties, distinct values, +-0, several lengths."""
    rng = np.random.default_rng(22)
    sets = [np.array([[3, 1, 2, 2, 5], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5], [5, 4, 3, 2, 1], [2, -0.0, 0.0, 2, -1]],
                     np.float32),
            np.array([[7.0]], np.float32),
            np.array([[1, 1], [2, 1]], np.float32)]
    for n in (16, 17, 33, 100, 300):
        sets.append(rng.integers(0, 4, (4, n)).astype(np.float32))            # ties everywhere
        sets.append(np.round(rng.standard_normal((3, n)), 1).astype(np.float32))  # some ties
    sets.append(rng.standard_normal((6, 57)).astype(np.float32))              # distinct
    return sets


CASES = [(what, arg) for what, args in (("argsort", (ASC, DESC)), ("argsort_top_k", (1, 2, 4)), ("top_k", (1, 2, 4)))
         for arg in args]


def _run(L, x, what, arg, n_threads):
    """One graph: ``what``(ctx, a, arg) on a (R rows of n) F32 tensor shaped [n, 2, R/2] when R is even (rows across
    two dimensions), else [n, R]. Returns (indices (R, ne0), ne, op, op_params[0], type, (work size, plan threads))."""
    R, n = x.shape
    ctx = L.init(8 << 20)
    try:
        a = L.new_tensor_3d(ctx, F32, n, 2, R // 2) if R % 2 == 0 and R > 2 else L.new_tensor_2d(ctx, F32, n, R)
        graphs.set_values(L, a, x.reshape(-1))
        t = getattr(L, what)(ctx, a, arg)
        s = L.tensor_struct(t) if graphs.is_oracle(L) else t
        head = (list(graphs.ne(L, t)), int(s.op), int(s.op_params[0]), int(s.type))
        if what == "argsort_top_k":                   # a VIEW of the ARGSORT: op/op_params of that node
            src = L.tensor_struct(s.src[0]) if graphs.is_oracle(L) else s.src[0]
            head = head[:1] + (int(src.op), int(src.op_params[0]), int(s.type))
        gf = L.new_graph(ctx)
        L.build_forward_expand(gf, t)
        plan = L.graph_plan(gf, 3)          # n_tasks = n_threads for both ops: the plan takes all 3
        ws = (plan["work_size"], plan["n_threads"]) if isinstance(plan, dict) else (plan.work_size, plan.n_threads)
        if graphs.is_oracle(L):
            assert L.graph_compute(gf, n_threads) == 0
        else:
            assert L.graph_compute_with_ctx(ctx, gf, n_threads) == 0
        got = np.array(L.get_array(t) if graphs.is_oracle(L) else gg.get_data(t)).reshape(R, -1)
        return (got,) + head + (ws,)
    finally:
        L.free(ctx)


@needs_oracle
@pytest.mark.parametrize("what,arg", CASES, ids=[f"{w}-{a}" for w, a in CASES])
def test_bitwise_with_ggml_0_20_2(what, arg):
    g = real_ggml()
    want_op = {"argsort": gg.GGML_OP_ARGSORT, "argsort_top_k": gg.GGML_OP_ARGSORT, "top_k": gg.GGML_OP_TOP_K}[what]
    for x in _rows():
        if what != "argsort" and arg > x.shape[1]:
            continue
        ref = _run(g, x, what, arg, 2)
        assert ref[2] == want_op
        for n in (1, 3):
            got = _run(gg, x, what, arg, n)
            assert got[1:] == ref[1:], f"{what}({arg}) of {x.shape}: ne, op, op_params, type, plan"
            assert np.array_equal(got[0], ref[0]), f"{what}({arg}), {n} threads, rows {x.tolist()}:\n{got[0]}\n{ref[0]}"
        # and what it means: the positions of the best values (in order, but for TOP_K's swapped first two)
        k = ref[0].shape[1]
        key = x if what != "argsort" or arg == DESC else -x
        best = np.sort(key, axis=1)[:, ::-1][:, :k]
        picked = np.take_along_axis(key, ref[0].astype(np.int64), axis=1)
        if what == "top_k" and k > 1:
            picked[:, [0, 1]] = picked[:, [1, 0]]
        assert np.array_equal(picked, best)


@pytest.mark.skipif(not llamacpp_cpu.available(), reason="llama-cpp-python (the vendored ggml) is not installed")
def test_equal_to_the_ggml_llama_cpp_vendors():
    """The same cases through the ggml that llama-cpp-python 0.3.36 ships (llama.cpp's ARGSORT / TOP_K): one child
    process for all of them."""
    jobs, mine = [], []
    for what, arg in CASES:
        for x in _rows():
            if what != "argsort" and arg > x.shape[1]:
                continue
            jobs.append({"op": what, "x": x, "arg": arg, "n_threads": 3})
            mine.append(_run(gg, x, what, arg, 3)[0])
    for job, ref, got in zip(jobs, llamacpp_cpu.run(jobs), mine):
        assert np.array_equal(got, ref), f"{job['op']}({job['arg']}) of {job['x'].shape}:\n{got}\n{ref}"


def test_hand_checked_ties_and_scratch():
    """Without an oracle: rows worked by hand. ASC of [3, 1, 2, 2, 5] is 1, then the two 2s, then 0, 4; five equal
    values keep 0..4 (insertion sort moves nothing that is not strictly smaller). TOP_K(3) of [1, 2, 3, 4, 5]:
    positions 4, 3, 2, with the first two swapped; each thread's scratch row holds the whole partial_sort result."""
    ctx = gg.init(1 << 20)
    a = gg.new_tensor_2d(ctx, F32, 5, 3)
    gg.set_data(a, np.array([[3, 1, 2, 2, 5], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5]], np.float32))
    asc, desc, tk = gg.argsort(ctx, a, ASC), gg.argsort_top_k(ctx, a, 3), gg.top_k(ctx, a, 3)
    gf = gg.new_graph(ctx)
    for t in (asc, desc, tk):
        gg.build_forward_expand(gf, t)
    plan = gg.graph_plan(gf, 3)
    assert plan.work_size == 4 * 5 * 3 + 64 * 3          # TOP_K: ne00 int32 per task, plus a cache line per thread
    assert gg.graph_compute_with_ctx(ctx, gf, 1) == 0
    assert gg.get_data(asc)[0, 0].tolist() == [[1, 2, 3, 0, 4], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert gg.get_data(desc)[0, 0].tolist() == [[4, 0, 2], [0, 1, 2], [4, 3, 2]]
    assert gg.get_data(tk)[0, 0].tolist() == [[0, 4, 3], [1, 0, 2], [3, 4, 2]]
    work = [o for o in ctx.objects if o.type == gg.GGML_OBJECT_TYPE_WORK_BUFFER]
    scratch = np.frombuffer(gg.get_mem_buffer(ctx), np.uint8)[work[-1].offs:work[-1].offs + 20].view(np.int32)
    assert scratch.tolist()[:3] == [4, 3, 2] and sorted(scratch.tolist()) == [0, 1, 2, 3, 4]   # the last row's
    gg.free(ctx)


def test_moe_routing_as_build_moe_ffn():
    """llama.cpp's build_moe_ffn routing on a hand-made router: logits -> SOFT_MAX -> argsort_top_k(2) ->
    GET_ROWS of the probabilities. Token 0's logits [0, 3, 1, 2] pick experts 1 then 3; token 1's [2, 2, 0, -1]
    ties at the top (both experts 0 and 1, std::sort's order); token 2 picks 2 then 0. The picks equal NumPy's
    argsort of the softmax, the weights are the softmax at the picks."""
    logits = np.array([[0, 3, 1, 2], [2, 2, 0, -1], [1, -2, 4, 0]], np.float32)
    ctx = gg.init(1 << 20)
    lg = gg.new_tensor_2d(ctx, F32, 4, 3)
    gg.set_data(lg, logits)
    probs = gg.soft_max(ctx, lg)
    sel = gg.argsort_top_k(ctx, probs, 2)
    w = gg.get_rows(ctx, gg.reshape_3d(ctx, probs, 1, 4, 3), sel)           # [1, 2, 3]
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, w)
    assert gg.graph_compute_with_ctx(ctx, gf, 2) == 0
    P, ids = gg.get_data(probs)[0, 0], gg.get_data(sel)[0, 0]
    assert ids[0].tolist() == [1, 3] and ids[2].tolist() == [2, 0] and sorted(ids[1].tolist()) == [0, 1]
    assert np.array_equal(ids, np.argsort(-P, axis=1, kind="stable")[:, :2])
    assert np.array_equal(gg.get_data(w)[0, :, :, 0], np.take_along_axis(P, ids.astype(np.int64), axis=1))
    gg.free(ctx)


def test_bad_input_leaves_the_context_as_it_was():
    ctx = gg.init(1 << 20)
    a = gg.new_tensor_2d(ctx, F32, 5, 3)
    used, n = gg.used_mem(ctx), ctx.n_objects
    for call, msg in ((lambda: gg.argsort(ctx, a, 2), "order must be GGML_SORT_ORDER_ASC"),
                      (lambda: gg.argsort(ctx, a, "desc"), "order must be an integer"),
                      (lambda: gg.top_k(ctx, a, 6), r"need 0 <= k <= a.ne\[0\], got k = 6"),
                      (lambda: gg.top_k(ctx, a, -1), "got k = -1"),
                      (lambda: gg.argsort_top_k(ctx, a, 6), "got k = 6"),
                      (lambda: gg.argsort_top_k(ctx, a, 2.0), "k must be an integer")):
        with pytest.raises(gg.GGMLError, match=msg):
            call()
        assert (gg.used_mem(ctx), ctx.n_objects) == (used, n)
    gg.free(ctx)
    # argsort_top_k makes two objects: when the view does not fit, the ARGSORT is taken back too
    small = gg.init(gg.tensor_overhead() * 2 + 4 * 5 * 3 + 64)
    b = gg.new_tensor_2d(small, F32, 5, 3)
    used, n = gg.used_mem(small), small.n_objects
    with pytest.raises(gg.GGMLError, match="not enough space"):
        gg.argsort_top_k(small, b, 2)
    assert (gg.used_mem(small), small.n_objects) == (used, n) and len(list(small.tensors())) == 1
    gg.free(small)
    # ggml's CPU kernels sort F32 rows only: an F16 row is an error naming the node, and the graph can run again
    ctx = gg.init(1 << 20)
    h = gg.new_tensor_2d(ctx, F16, 4, 2)
    t = gg.argsort(ctx, h, DESC)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, t)
    with pytest.raises(gg.GGMLError, match="argsort: ggml's CPU kernel sorts F32 rows only, src0 is f16"):
        gg.graph_compute_with_ctx(ctx, gf, 2)
    gg.free(ctx)
