"""Gemma-3 270M (architecture gemma3) on ggviz's llama path, checked against llama.cpp (tests/data/gemma3, captured
from the AVX2 build of llama-cpp-python 0.3.36; see its README).

- the decode graph: 817 nodes with llama.cpp's op, name, type, ne and sources, in the same order (the iSWA inputs,
  the two caches' K/V tensors, QK norm, the unnamed Q SCALE, post-norms, GEGLU);
- hparams as llama.cpp reads them (sliding-window pattern, rope bases, f_attention_scale, head_dim 256, GQA 4:1);
- the iSWA KV cache: sliding-window mask and cell reuse (hand-checked on a tiny cache, then with gemma's own
  sizes and swa_full = false); the compute buffer reserved, as llama.cpp logs it;
- greedy: the first token of each prompt, and llama.cpp's continuations teacher-forced;
- teacher-forced logits on the decode path: the rows whose float32 bytes equal llama.cpp's (sha256), top-1 and KL.

Bit-exactness: every one of the 90 teacher-forced rows has llama.cpp's float32 bytes (the Q8_0 / Q5_0 / Q4_K /
Q6_K kernels and the repacked Q4_K are the AVX2 kernels' arithmetic, see ``test_kquants.py``), and the greedy
continuations equal llama.cpp's token for token from the first. The ops this architecture adds -- SCALE, GEGLU
(split), RMS_NORM of [256, 4] heads, NEOX RoPE with base 1e6 / 1e4 -- are bit-exact against the real ggml
(test_gemma3_ops_exact_vs_real_ggml).

Every test that needs the model skips when data/models/gemma-3-270m-q4_k_m.gguf is absent (``ggviz fetch``).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from ggviz import ggml, llama
from ggviz.llama.kv_cache import KVCache
from ggviz.llama.model import LLAMA_SWA_TYPE_STANDARD, LlamaHparams

DATA = Path(__file__).parent / "data" / "gemma3"
MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "gemma-3-270m-q4_k_m.gguf"

needs_model = pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL.name} is absent (ggviz fetch gemma3-270m)")


@pytest.fixture(scope="module")
def gemma():
    if not MODEL.exists():
        pytest.skip(f"{MODEL.name} is absent (ggviz fetch gemma3-270m)")
    return llama.model_load_from_file(str(MODEL), llama.model_default_params())


def _ctx(model, n_ctx=1024, threads=2):
    cp = llama.context_default_params()
    cp.n_ctx = n_ctx
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return llama.init_from_model(model, cp)


def _node_desc(t):
    return dict(name=t.name, op=ggml.op_desc(t), type=ggml.type_name(t.type), ne=list(t.shape),
                src=[s.name for s in t.src if s is not None])


@needs_model
def test_hparams_as_llamacpp_reads_them(gemma):
    hp = gemma.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_ff) == (18, 640, 4, 1, 2048)
    assert (hp.n_embd_head_k, hp.n_embd_head_v, hp.n_rot, hp.n_gqa) == (256, 256, 256, 4)
    assert hp.rope_type == ggml.GGML_ROPE_TYPE_NEOX
    assert (hp.n_swa, hp.swa_type) == (512, LLAMA_SWA_TYPE_STANDARD)
    # set_swa_pattern(6): every sixth layer is global
    assert [il for il in range(18) if not hp.is_swa(il)] == [5, 11, 17]
    assert (hp.rope_freq_base_train, hp.rope_freq_base_train_swa) == (1e6, 1e4)
    assert hp.f_attention_scale == 0.0625 and hp.f_final_logit_softcapping == 0.0
    assert gemma.output.name == "token_embd.weight"       # tied output (TENSOR_DUPLICATED)
    # llama_model_desc as the AVX2 build of llama-cpp-python 0.3.36 returned it for this file
    assert llama.model_desc(gemma) == "gemma3 270M Q4_K - Medium"


@needs_model
def test_decode_graph_matches_llamacpp(gemma):
    ref = json.load(open(DATA / "gemma3_shared_graph.json"))
    ctx = _ctx(gemma)
    n_prompt = len(ref["prompt_ids"]) - 1      # the graph is the step that decodes the last prompt token
    kv = ctx.kv
    assert kv.kv_base.layer_ids == [5, 11, 17] and len(kv.kv_swa.layer_ids) == 15
    assert kv.kv_base.size == kv.kv_swa.size == 1024        # swa_full (llama.cpp's default)
    slots = kv.prepare([(list(range(n_prompt)), [0] * n_prompt)])
    kv.apply_ubatch(slots[0], list(range(n_prompt)), [0] * n_prompt)
    slot = kv.prepare([([n_prompt], [0])])[0]
    kv.apply_ubatch(slot, [n_prompt], [0])
    res = ctx.build_graph(1, 1, kv.get_n_kv())
    assert (res.n_kv, res.n_kv_swa) == (256, 256)
    nodes = [_node_desc(t) for t in res.gf.nodes]
    assert len(nodes) == len(ref["nodes"]) == 817
    for i, (a, b) in enumerate(zip(nodes, ref["nodes"])):
        assert a == b, f"node {i}: ggviz {a} != llama.cpp {b}"


@needs_model
def test_compute_buffer_size_as_llamacpp(gemma):
    """The compute buffer the context reserves (worst-case pp graph of 512 tokens over the full caches): llama.cpp
    (AVX2 llama_cpp 0.3.36, n_ctx 1024, flash attention off, 2 threads) logs "CPU compute buffer size is 514.5020
    MiB" for this model (tests/data/gemma3/README.md)."""
    ctx = _ctx(gemma)
    assert round(ctx.compute_buffer_sizes()["CPU"] / 2**20, 4) == 514.502


def _tiny_swa_cache(size=8, n_swa=4):
    hp = LlamaHparams(n_vocab=1, n_ctx_train=64, n_embd=4, n_layer=1, n_head=1, n_head_kv=1, n_ff=4, n_rot=4,
                      n_embd_head_k=4, n_embd_head_v=4, f_norm_rms_eps=1e-6, rope_freq_base_train=1e4,
                      n_swa=n_swa, swa_type=LLAMA_SWA_TYPE_STANDARD, swa_layers=[True])
    return KVCache(hp, size, n_pad=8, layer_ids=[0], n_swa=n_swa, swa_type=LLAMA_SWA_TYPE_STANDARD)


def test_swa_mask_hand_checked():
    kv = _tiny_swa_cache()
    kv.apply_ubatch(list(range(6)), list(range(6)), [0] * 6)
    m = kv.kq_mask_data(8, [5], [0])[0]
    # position 5 with a window of 4 sees positions 2..5 (5 - p0 < 4), not 0..1, not the empty cells 6..7
    assert np.isneginf(m[[0, 1, 6, 7]]).all() and (m[2:6] == 0).all()
    # two tokens of one ubatch: position 4 sees 1..4
    m = kv.kq_mask_data(8, [4, 5], [0, 0])
    assert list(np.flatnonzero(m[0] == 0)) == [1, 2, 3, 4] and list(np.flatnonzero(m[1] == 0)) == [2, 3, 4, 5]


def test_swa_cache_reuses_cells_left_behind():
    kv = _tiny_swa_cache()
    kv.apply_ubatch(list(range(8)), list(range(8)), [0] * 8)        # full: positions 0..7 in cells 0..7
    slots = kv.prepare([([8], [0])])
    assert slots == [[0]]            # position 8's window (5..8) has left cells 0..4 behind; the scan wraps to 0
    assert list(kv.cells.pos) == list(range(8))                      # prepare left the cells as they were
    kv.apply_ubatch(slots[0], [8], [0])
    assert list(kv.cells.pos) == [8, 1, 2, 3, 4, 5, 6, 7] and kv.cells.used == 8
    # a plain cache of the same size is full
    full = KVCache(kv.hparams, 8, n_pad=8)
    full.apply_ubatch(list(range(8)), list(range(8)), [0] * 8)
    assert full.prepare([([8], [0])]) is None


@needs_model
def test_iswa_cache_without_swa_full(gemma):
    """llama_kv_cache_iswa with swa_full = false: the SWA cache has GGML_PAD(min(kv_size, n_swa + n_ubatch), 256)
    cells, and past them it reuses the cells its window has left behind while the base cache keeps everything.
    (Cell bookkeeping only, as llama_decode does it before computing.)"""
    from ggviz.llama.kv_cache_iswa import KVCacheISWA
    hp = gemma.hparams
    kv = KVCacheISWA(hp, 2048, n_ubatch=512, swa_full=False)
    assert (kv.kv_base.size, kv.kv_swa.size) == (2048, 1024)
    assert kv.kv_base.layer_ids == [5, 11, 17] and kv.kv_swa.layer_ids == [il for il in range(18) if il % 6 != 5]
    n = 1024
    (slot,) = kv.prepare([(list(range(n)), [0] * n)])
    kv.apply_ubatch(slot, list(range(n)), [0] * n)
    pos = list(range(n, n + 64))
    (slot,) = kv.prepare([(pos, [0] * 64)])
    assert slot.base == list(range(1024, 1088))      # the base cache has room
    assert slot.swa == list(range(64))               # the SWA cache is full: positions 0..63 are out of the window
    kv.apply_ubatch(slot, pos, [0] * 64)
    assert kv.kv_swa.cells.used == 1024 and kv.kv_base.cells.used == 1088
    assert kv.seq_pos_min(0) == 64 and kv.seq_pos_max(0) == 1087     # the SWA cache's, as llama.cpp's iswa
    n_base, n_swa = kv.get_n_kv()
    m_swa = kv.kv_swa.kq_mask_data(n_swa, [1087], [0])[0]
    m_base = kv.kv_base.kq_mask_data(n_base, [1087], [0])[0]
    seen = kv.kv_swa.cells.pos[:n_swa][np.isfinite(m_swa)]
    assert sorted(seen) == list(range(1087 - 511, 1088))           # the last 512 positions
    assert int(np.isfinite(m_base).sum()) == 1088


def test_gemma3_ops_exact_vs_real_ggml():
    """SCALE, GEGLU split, RMS_NORM * weight of [256, 4] heads and NEOX RoPE at gemma3's sizes, bit for bit."""
    oracle = pytest.importorskip("tests.oracle.ggml_lib")
    if not oracle.available():
        pytest.skip(f"real ggml unavailable: {oracle.unavailable_reason()}")
    from tests.test_cpu_ops import run_case
    g = oracle.RealGGML()
    F32, I32 = ggml.GGML_TYPE_F32, ggml.GGML_TYPE_I32
    s = float(np.sqrt(np.float32(640)))
    run_case(g, "gemma3 inp_scaled", [(F32, (640, 3), "wide")], lambda L, ctx, t: L.scale(ctx, t[0], s))
    run_case(g, "gemma3 Q scale", [(F32, (256, 4, 3), "wide")], lambda L, ctx, t: L.scale(ctx, t[0], 0.0625))
    run_case(g, "gemma3 geglu_split", [(F32, (2048, 2), "wide"), (F32, (2048, 2), "wide")],
             lambda L, ctx, t: L.geglu_split(ctx, t[0], t[1]))
    run_case(g, "gemma3 qk norm", [(F32, (256, 4, 2), "wide"), (F32, (256,), "wide")],
             lambda L, ctx, t: L.mul(ctx, L.rms_norm(ctx, t[0], 1e-6), t[1]))
    pos = np.array([0, 7, 300, 1000], np.int32)
    for base in (1e6, 1e4):
        run_case(g, f"gemma3 rope neox {base:g}", [(F32, (256, 4, 4), "wide"), (I32, (4,), pos)],
                 lambda L, ctx, t, b=base: L.rope_ext(ctx, t[0], t[1], None, 256, ggml.GGML_ROPE_TYPE_NEOX, 32768,
                                                     b, 1.0, 0.0, 1.0, 32.0, 1.0))


def _decode_one_by_one(ctx, ids):
    rows = []
    for t in ids:
        assert llama.decode(ctx, llama.batch_get_one([int(t)])) == 0
        rows.append(llama.get_logits_ith(ctx, -1).astype(np.float32).copy())
    return np.array(rows)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@needs_model
def test_teacher_forced_decode_path(gemma):
    """The shared text fed one token per llama_decode (as llama.cpp's capture): every logits row's float32 bytes
    equal llama.cpp's (the sha256 of each row)."""
    z = np.load(DATA / "gemma3_tf_seq1_compact.npz")
    rows = _decode_one_by_one(_ctx(gemma), z["ids"])
    exact = [hashlib.sha256(r.tobytes()).hexdigest() == str(h) for r, h in zip(rows, z["row_sha256"])]
    assert len(exact) == 90
    assert all(exact), f"rows not bit-identical to llama.cpp's: {[i for i, e in enumerate(exact) if not e]}"
    assert np.array_equal(rows.argmax(-1), z["argmax"])
    # the float16 rows llama.cpp stored are the float32 rows rounded: a second, independent check of the bytes
    assert np.array_equal(rows[:4].astype(np.float16), z["logits_f16_first4"])


@needs_model
def test_teacher_forced_prompt_path(gemma):
    """The same 90 ids in ONE llama_decode, logits for every position (llama.cpp's capture made the same way): the
    prompt path -- src1 quantized a batch at a time, Q5_0 through tinyBLAS_Q0's tiles on ggml's own blocks, the
    repacked Q4_K GEMM, Q6_K's tiled microkernel, the batched attention -- gives every row's float32 bytes."""
    z = np.load(DATA / "gemma3_tf_batch90.npz")
    ids = z["ids"]
    ctx = _ctx(gemma)
    b = llama.batch_init(len(ids), 0, 1)
    for i, t in enumerate(ids):
        b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = int(t), i, 1, 0, 1
    b.n_tokens = len(ids)
    assert llama.decode(ctx, b) == 0
    rows = np.array([llama.get_logits_ith(ctx, i).astype(np.float32) for i in range(len(ids))])
    exact = [hashlib.sha256(r.tobytes()).hexdigest().encode() == bytes(h) for r, h in zip(rows, z["row_sha256"])]
    assert all(exact), f"rows not bit-identical to llama.cpp's: {[i for i, e in enumerate(exact) if not e]}"
    assert np.array_equal(rows.argmax(-1), z["argmax"])


@needs_model
def test_greedy_continuations_equal_llamacpp(gemma):
    """Each of the 3 prompts (llama.cpp's ids, one batch), then 32 tokens, one per llama_decode, each the argmax:
    the same 32 tokens as llama.cpp's greedy run, from the first."""
    ref = json.load(open(DATA / "gemma3_shared_tokens_greedy.json"))
    for case in ref["greedy"]:
        ids, gen = [int(t) for t in case["prompt_ids"]], [int(t) for t in case["gen_ids"]]
        ctx = _ctx(gemma, n_ctx=256)
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        out = []
        for _ in range(len(gen)):
            tok = int(np.argmax(llama.get_logits_ith(ctx, -1)))
            out.append(tok)
            assert llama.decode(ctx, llama.batch_get_one([tok])) == 0
        assert out == gen, f"greedy continuation of {case['prompt']!r}"
