"""ggml_flash_attn_ext and its CPU kernel against the real ggml (libggml-python 0.20.2, whose FLASH_ATTN_EXT kernels --
one-chunk, tiled, split-KV -- are those of the ggml llama-cpp-python 0.3.36 vendors, compiled with one contraction
less: see FA_S_FMA): the result bits, for each of the three kernels, 1 to 3 threads, GQA, ALiBi, F16 and F32 K/V,
faithful and compiled; and the op's checks."""
from __future__ import annotations

import numpy as np
import pytest

from ggviz import ggml as gg
from ggviz.ggml.cpu import ggml_cpu
from ggviz.ggml.cpu.ops import fa_kernel

try:
    from ggviz.ggml.cpu.fast import compiler
except ImportError:         # no Numba: only the faithful kernels
    compiler = None

from tests.oracle.ggml_lib import RealGGML, available, unavailable_reason

_REAL = None


def _real():
    global _REAL
    if _REAL is None:
        _REAL = RealGGML()
    return _REAL


def _fa(G, ctx, DK, DV, N, NKV, H, HKV, with_mask, scale, max_bias, kvt):
    q = G.new_tensor_4d(ctx, G.GGML_TYPE_F32, DK, N, H, 1)
    k = G.new_tensor_4d(ctx, kvt, DK, NKV, HKV, 1)
    v = G.new_tensor_4d(ctx, kvt, DV, NKV, HKV, 1)
    m = G.new_tensor_4d(ctx, G.GGML_TYPE_F16, NKV, N, 1, 1) if with_mask else None
    out = G.flash_attn_ext(ctx, q, k, v, m, scale, max_bias, 0.0)
    G.flash_attn_ext_set_prec(out, G.GGML_PREC_F32)
    gf = G.new_graph(ctx)
    G.build_forward_expand(gf, out)
    return (q, k, v, m), out, gf


def _inputs(DK, DV, N, NKV, H, HKV, kvt, seed=0):
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((1, H, N, DK)).astype(np.float32) * 2
    dt = np.float16 if kvt == gg.GGML_TYPE_F16 else np.float32
    K = rng.standard_normal((1, HKV, NKV, DK)).astype(np.float16).astype(dt)
    V = rng.standard_normal((1, HKV, NKV, DV)).astype(np.float16).astype(dt)
    Mk = np.zeros((1, 1, N, NKV), np.float16)
    for i in range(N):                      # causal over the last N cells, and one cell masked for every row
        Mk[0, 0, i, NKV - N + i + 1:] = -np.inf
    Mk[0, 0, :, 3] = -np.inf
    return Q, K, V, Mk


CASES = {
    # one query row (decode): the one-chunk kernel, F16 accumulator
    "decode": dict(N=1, NKV=40, nth=(1, 2)),
    "decode_nomask": dict(N=1, NKV=40, with_mask=False, nth=(1,)),
    "few_rows": dict(N=3, NKV=30, nth=(1, 2)),
    # >= 64 query rows: the tiled kernel (F32 Q, simd_gemm, ggml_v_expf softmax), tiles cut by heads and chunks
    "tiled": dict(N=70, NKV=100, nth=(1, 2)),
    # one query row over >= 512 cells: the split-KV kernel, whose merge depends on the thread count
    "split_kv": dict(N=1, NKV=600, nth=(1, 2, 3)),
    "f32_kv": dict(N=1, NKV=40, kvt=gg.GGML_TYPE_F32, nth=(1,)),
    "f32_kv_tiled": dict(N=70, NKV=130, kvt=gg.GGML_TYPE_F32, nth=(1,)),
    "alibi": dict(N=1, NKV=40, max_bias=8.0, nth=(1,)),
    "alibi_tiled": dict(N=70, NKV=100, max_bias=8.0, nth=(1,)),
    "gemma_heads": dict(DK=256, DV=256, H=4, HKV=1, N=5, NKV=50, nth=(2,)),
}


@pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())
@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attn_ext_bits_equal_ggml(name, monkeypatch):
    # libggml-python 0.20.2's build rounds the one-chunk kernel's ``S = S*ms + vs`` twice; llama.cpp 0.3.36's AVX2
    # build fuses it (ggviz's default: tests/test_flash_attn_llamacpp.py holds it to llama.cpp's logits)
    from ggviz.ggml.cpu import ops as cpu_ops
    monkeypatch.setattr(cpu_ops, "FA_S_FMA", False)
    c = dict(DK=64, DV=64, H=9, HKV=3, with_mask=True, scale=0.125, max_bias=0.0, kvt=gg.GGML_TYPE_F16)
    c.update(CASES[name])
    nths = c.pop("nth")
    Q, K, V, Mk = _inputs(c["DK"], c["DV"], c["N"], c["NKV"], c["H"], c["HKV"], c["kvt"])
    g = _real()
    for nth in nths:
        outs = []
        for G in (g, gg):
            ctx = G.init(64 << 20)
            try:
                ins, out, gf = _fa(G, ctx, **c)
                for t, a in zip(ins, (Q, K, V, Mk)):
                    if t is None:
                        continue
                    if G is g:
                        G.set_array(t, a.ravel())
                    else:
                        gg.get_data(t)[...] = a.reshape(gg.get_data(t).shape)
                assert G.graph_compute_with_ctx(ctx, gf, nth) == 0
                outs.append(np.array(G.get_array(out) if G is g else gg.get_data(out), np.float32).ravel())
                if G is gg:
                    kern = fa_kernel(out)
                    prog = compiler.compile_graph(gf) if compiler is not None else None
                    if prog is not None:        # the compiled walk (fast/fattn.py), when it takes the node
                        gg.get_data(out)[...] = 0
                        plan = ggml_cpu.graph_plan(gf, nth)
                        plan.extra = prog
                        plan.work_data = np.zeros(plan.work_size, np.uint8)
                        assert ggml_cpu.graph_compute(gf, plan) == 0
                        outs.append(np.array(gg.get_data(out), np.float32).ravel())
            finally:
                G.free(ctx)
        real = outs[0]
        assert np.isfinite(real).all()
        for how, mine in zip(("faithful", "compiled"), outs[1:]):
            diff = int(np.sum(real.view(np.uint32) != mine.view(np.uint32)))
            assert diff == 0, f"{name} ({kern}, {how}), {nth} threads: {diff} of {real.size} values differ from ggml's"
        # which cases the compiled kernel takes (fast/fattn.py's docstring): F16 K/V, no ALiBi
        if compiler is not None:
            assert (len(outs) == 3) == (c["max_bias"] == 0 and c["kvt"] == gg.GGML_TYPE_F16)


def test_flash_attn_ext_checks():
    ctx = gg.init(1 << 20)
    try:
        q = gg.new_tensor_4d(ctx, gg.GGML_TYPE_F32, 64, 2, 4, 1)
        k = gg.new_tensor_4d(ctx, gg.GGML_TYPE_F16, 64, 8, 2, 1)
        v = gg.new_tensor_4d(ctx, gg.GGML_TYPE_F16, 32, 8, 2, 1)
        m32 = gg.new_tensor_4d(ctx, gg.GGML_TYPE_F32, 8, 2, 1, 1)
        with pytest.raises(gg.GGMLError, match="mask must be F16"):
            gg.flash_attn_ext(ctx, q, k, v, m32, 1.0, 0.0, 0.0)
        with pytest.raises(gg.GGMLError, match="ALiBi"):
            gg.flash_attn_ext(ctx, q, k, v, None, 1.0, 8.0, 0.0)
        kbad = gg.new_tensor_4d(ctx, gg.GGML_TYPE_F16, 32, 8, 2, 1)
        with pytest.raises(gg.GGMLError, match="shapes do not match"):
            gg.flash_attn_ext(ctx, q, kbad, v, None, 1.0, 0.0, 0.0)
        r = gg.flash_attn_ext(ctx, q, k, v, None, 0.5, 0.0, 0.0)
        # permute(0, 2, 1, 3) of [DV, n_tokens, n_head]: [DV, n_head, n_tokens]
        assert list(r.ne) == [32, 4, 2, 1] and r.type == gg.GGML_TYPE_F32
        assert gg.get_op_params_f32(r, 0) == 0.5
        gg.prec_set_acc(r, gg.GGML_PREC_F32)
        assert gg.flash_attn_ext_get_prec(r) == gg.GGML_PREC_F32
        with pytest.raises(gg.GGMLError, match="n_kv_max must be >= 0"):
            gg.flash_attn_ext_set_n_kv_max(r, -1)
        assert fa_kernel(r) == "one_chunk"
    finally:
        gg.free(ctx)


def test_flash_attn_type_resolution(model):
    """llama_context_params.flash_attn_type as llama.h spells it: AUTO (the default) probes and enables flash
    attention on the CPU (V cache not transposed, F16 mask, FLASH_ATTN_EXT nodes), ENABLED skips the probe, DISABLED
    keeps KQ -> SOFT_MAX -> KQV over a transposed V cache; anything else is refused before anything is allocated."""
    from ggviz import llama
    assert llama.context_default_params().flash_attn_type == llama.LLAMA_FLASH_ATTN_TYPE_AUTO == -1
    assert (llama.LLAMA_FLASH_ATTN_TYPE_DISABLED, llama.LLAMA_FLASH_ATTN_TYPE_ENABLED) == (0, 1)
    seen = {}
    for fa in (-1, 0, 1):
        cp = llama.context_default_params()
        cp.n_ctx, cp.flash_attn_type = 256, fa
        ctx = llama.init_from_model(model, cp)
        try:
            res = ctx.build_graph(1, 1, 256)
            ops = {gg.op_desc(t) for t in res.gf.nodes}
            seen[fa] = (ctx.flash_attn, ctx.kv.v_trans, [e["split_only"] for e in ctx.reserve_log],
                        "FLASH_ATTN_EXT" in ops, "SOFT_MAX" in ops, gg.type_name(res.inputs.kq_mask.type))
        finally:
            llama.free(ctx)
    assert seen[-1] == (True, False, [True, False, False, False], True, False, "f16")
    assert seen[1] == (True, False, [False, False, False], True, False, "f16")
    assert seen[0] == (False, True, [False, False, False], False, True, "f32")
    cp = llama.context_default_params()
    cp.flash_attn_type = 2
    with pytest.raises(llama.ContextParamsError, match="flash_attn_type must be -1"):
        llama.init_from_model(model, cp)
