"""GGVIZ_CPU_VARIANT=zen4 against llama.cpp's AVX-512 build (the zen4 feature set), whose captures are
tests/data/llamacpp/smollm2_prefill6_tensors.npz and smollm2_teacher_forced_seq1.npz (see that folder's README):

* the 6-token prefill, compiled path: kq_soft_max-0 (tinyBLAS's 16-lane K·Q, the 16-lane ggml_v_expf with
  vscalefps, _mm512_reduce_add_ps), ffn_swiglu-0 (16-lane ggml_v_silu) and the logits, every element's bits;
  the haswell default differs from that build there (so the check can tell the builds apart);
* the same prefill through the faithful kernels (an abort callback keeps the compiled walk out): every layer-0
  tensor of the capture bit for bit;
* the 115-token one-batch prefill: every logits row equal to the AVX-512 build's (stored as float16);
* compiled == faithful under zen4 for the row tails (n % 16) the model shapes never reach.
"""
from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest

from ggviz import ggml, llama
from ggviz.llama.context_pool import context_pool_clear
from ggviz.ggml import consts as C
from ggviz.ggml.cpu import cpu_feats, vec

DATA = Path(__file__).parent / "data" / "llamacpp"
LAYER0 = ("embd", "attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kq_soft_max-0", "kqv_out-0", "attn_out-0",
          "ffn_inp-0", "ffn_norm-0", "ffn_gate-0", "ffn_swiglu-0", "ffn_out-0", "l_out-0")


@pytest.fixture(autouse=True, scope="module")
def _no_state_left_behind():
    """The contexts these tests made (under zen4 and haswell) leave the process: their parked machinery and
    compiled programs must not reach a later test's context."""
    yield
    context_pool_clear()
    gc.collect()


def _bits_equal(mine, want):
    mine = np.asarray(mine, np.float32).reshape(-1)
    want = np.asarray(want, np.float32).reshape(-1)
    assert mine.shape == want.shape
    return float(np.mean(mine.view(np.uint32) == want.view(np.uint32)))


def _prefill6(model, names, faithful=False, stop=None):
    """The capture's 6-token prefill (1 thread, FA off): {name: [tensors in graph order]} of the asked names."""
    cp = llama.context_default_params()
    cp.n_ctx = 512
    cp.n_threads = cp.n_threads_batch = 1
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if faithful:
        cp.abort_callback = lambda data: False      # the compiled walk never runs with an abort callback
    ctx = llama.init_from_model(model, cp)
    got: dict[str, list] = {}

    def cb(t, ask):
        if ask:
            return t.name in names
        if t.type == ggml.GGML_TYPE_F32:
            got.setdefault(t.name, []).append(np.array(ggml.get_data(t)))
        return t.name != stop

    ctx.cparams.cb_eval = cb
    ids = json.load(open(DATA / "smollm2_decode_graph.json"))["prompt_ids"]
    assert llama.decode(ctx, llama.batch_get_one(ids)) == (2 if stop else 0)
    return got


def _compiled_prefill6(model, monkeypatch):
    """kq_soft_max-0, ffn_swiglu-0 and the logits, each ending a sub-graph that holds repacked MUL_MATs: all three
    computed by the compiled walk (checked)."""
    pytest.importorskip("ggviz.ggml.cpu.fast.kernels", reason="the compiled path needs Numba")
    from ggviz.ggml.cpu import ggml_cpu
    compiled = []
    plan = ggml_cpu.fast.plan_graph

    def spy(cgraph, n_threads):
        prog = plan(cgraph, n_threads)
        compiled.append(prog is not None)
        return prog

    monkeypatch.setattr(ggml_cpu.fast, "plan_graph", spy)
    got = _prefill6(model, {"kq_soft_max-0", "ffn_swiglu-0", "result_output"})
    assert compiled and all(compiled)
    return got


@pytest.mark.parametrize("variant", ["zen4", "haswell"])
def test_compiled_prefill_bits_of_the_avx512_build(model, monkeypatch, variant):
    monkeypatch.setenv("GGVIZ_CPU_VARIANT", variant)
    ref = np.load(DATA / "smollm2_prefill6_tensors.npz")
    got = _compiled_prefill6(model, monkeypatch)
    eq = {name: _bits_equal(got[name][0], ref[name]) for name in ("kq_soft_max-0", "ffn_swiglu-0", "result_output")}
    if variant == "zen4":
        assert eq == {"kq_soft_max-0": 1.0, "ffn_swiglu-0": 1.0, "result_output": 1.0}
    else:   # AVX2: 8-lane tinyBLAS and ggml_v_expf (measured: 99.25 % and 89.84 % of the elements equal)
        assert eq["kq_soft_max-0"] < 1.0 and eq["ffn_swiglu-0"] < 1.0


def test_faithful_layer0_bits_of_the_avx512_build(model, monkeypatch):
    monkeypatch.setenv("GGVIZ_CPU_VARIANT", "zen4")
    ref = np.load(DATA / "smollm2_prefill6_tensors.npz")
    got = _prefill6(model, set(LAYER0), faithful=True, stop="l_out-0")
    checked = 0
    for key in ref.files:
        base, _, k = key.partition("#")
        if base not in LAYER0:
            continue
        mine = got[base][0 if base == "ffn_out-0" else int(k or 0)]   # ffn_out-0: the down projection
        assert _bits_equal(mine, ref[key]) == 1.0, key
        checked += 1
    assert checked == 19


def test_one_batch_prefill_logits_of_the_avx512_build(model, monkeypatch):
    """All 115 rows float16-equal to the AVX-512 build's (the haswell default: 3 of 115)."""
    monkeypatch.setenv("GGVIZ_CPU_VARIANT", "zen4")
    z = np.load(DATA / "smollm2_teacher_forced_seq1.npz")
    ids, ref = z["ids"], z["logits"]
    cp = llama.context_default_params()
    cp.n_ctx = 512
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama.init_from_model(model, cp)
    b = llama.batch_init(len(ids))
    for i, t in enumerate(ids):
        llama.batch_add(b, int(t), i, [0], True)
    assert llama.decode(ctx, b) == 0
    mine = llama.get_logits(ctx).astype(np.float16)
    rows = np.all(mine.view(np.uint16) == ref.view(np.uint16), axis=1)
    assert int(rows.sum()) == len(ids)


def test_v_expf_avx512_hand_checked():
    """The AVX-512 ggml_v_expf's saturation and vscalefps's subnormal results (2^-149 the smallest):
    e^-100 = 26.4 * 2^-149, e^-103.2789 = 0.99 * 2^-149, e^-104 = 0.46 * 2^-149 (rounded to 0)."""
    x = np.array([-np.inf, np.inf, 0.0, 89.0, -100.0, -103.2789, -104.0], np.float32)
    y = vec.v_expf_avx512(x)
    tiny = np.float32(2.0 ** -149)
    assert list(y) == [0, np.inf, 1, np.inf, 27 * tiny, tiny, 0]
    assert cpu_feats.variant_lanes("zen4") == 16 and cpu_feats.variant_lanes("haswell") == 8


@pytest.mark.parametrize("op, T", [("soft_max_tail", 0), ("swiglu_tail", 0), ("kq_f16", 7), ("kq_f16", 1),
                                   ("kqv_f16", 1), ("flash_attn", 1), ("flash_attn", 70)])
def test_compiled_equals_faithful_under_zen4(monkeypatch, op, T):
    """Rows with an n % 16 tail (libm expf); K·Q through 16-lane tinyBLAS (7 tokens); a decode step's K·Q and
    softmax·V through the 16-lane ggml_vec_dot_f16 (T = 1, n 64 and 80 = 64 + a double leftover of 16); flash
    attention's one-chunk kernel (16-lane vec_dot_f16) and tiled kernel (16-lane softmax per 64-cell tile)."""
    pytest.importorskip("ggviz.ggml.cpu.fast.kernels", reason="the compiled path needs Numba")
    from ggviz.ggml.cpu import ggml_cpu
    from ggviz.ggml.cpu.fast import compiler
    monkeypatch.setenv("GGVIZ_CPU_VARIANT", "zen4")
    out = {}
    for fast in (False, True):
        rng = np.random.default_rng(3)
        ctx = ggml.init(64 << 20)

        def f32(*ne, scale=1.0):
            t = ggml.new_tensor(ctx, C.GGML_TYPE_F32, len(ne), list(ne))
            ggml.get_data(t)[...] = (rng.standard_normal(ggml.get_data(t).shape) * scale).astype(np.float32)
            return t
        if op == "soft_max_tail":
            y = ggml.soft_max_ext(ctx, f32(67, 5, 2, scale=4.0), None, 0.3, 0.0)
        elif op == "swiglu_tail":
            y = ggml.swiglu_split(ctx, f32(1539, 3, scale=3.0), f32(1539, 3))
        elif op == "kq_f16":
            kc = ggml.new_tensor_3d(ctx, C.GGML_TYPE_F16, 64, 3, 256)
            ggml.get_data(kc)[...] = rng.standard_normal(ggml.get_data(kc).shape).astype(np.float16)
            q = ggml.permute(ctx, f32(64, 9, T), 0, 2, 1, 3)
            y = ggml.mul_mat(ctx, ggml.permute(ctx, kc, 0, 2, 1, 3), q)
        elif op == "kqv_f16":
            vt = ggml.new_tensor_3d(ctx, C.GGML_TYPE_F16, 80, 64, 3)
            ggml.get_data(vt)[...] = rng.standard_normal(ggml.get_data(vt).shape).astype(np.float16)
            y = ggml.mul_mat(ctx, vt, f32(80, T, 9))
        else:
            kv = []
            for _ in range(2):
                t = ggml.new_tensor_4d(ctx, C.GGML_TYPE_F16, 64, 100, 3, 1)
                ggml.get_data(t)[...] = rng.standard_normal(ggml.get_data(t).shape).astype(np.float16)
                kv.append(t)
            mask = ggml.new_tensor_4d(ctx, C.GGML_TYPE_F16, 100, T, 1, 1)
            ggml.get_data(mask)[...] = np.where(np.arange(100)[None, :] > 100 - T + np.arange(T)[:, None],
                                                -np.inf, 0).astype(np.float16).reshape(ggml.get_data(mask).shape)
            y = ggml.flash_attn_ext(ctx, f32(64, T, 9, 1, scale=2.0), kv[0], kv[1], mask, 0.125, 0.0, 0.0)
            ggml.flash_attn_ext_set_prec(y, ggml.GGML_PREC_F32)
        gf = ggml.new_graph(ctx)
        ggml.build_forward_expand(gf, y)
        plan = ggml_cpu.graph_plan(gf, 2)
        plan.extra = compiler.compile_graph(gf) if fast else None
        assert (plan.extra is not None) == fast
        if plan.work_size:
            plan.work_data = np.zeros(plan.work_size, np.uint8)
        assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS
        out[fast] = np.array(ggml.get_data(y), copy=True)
    assert _bits_equal(out[True], out[False]) == 1.0
