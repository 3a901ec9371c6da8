"""ggviz with llama.cpp's DEFAULT context params (flash_attn_type AUTO -> FLASH_ATTN_EXT on the CPU) against llama.cpp's
own default run (captures: tests/data/flash_attn/, tools/capture_llamacpp_flash_attn.py; README there).

Per model (SmolLM2, Gemma-3 270M): the logits bits of every row of a text, the decode path (one token per decode) and
one-batch prefill, with 1 and 2 threads; the FA decode graph node for node; the compute buffer size llama.cpp logs;
the flash-attention resolution; 32 greedy tokens; and ``ggviz run``'s text (SmolLM2)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from ggviz import ggml, llama

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "flash_attn"
MODELS = {"smollm2": ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3": ROOT / "data" / "models" / "gemma-3-270m-q4_k_m.gguf"}


def _fast() -> bool:
    try:
        from ggviz.ggml.cpu import repack
        return repack.available()
    except ImportError:     # pragma: no cover
        return False


pytestmark = pytest.mark.skipif(not _fast(), reason="llama.cpp's exact logits need the compiled fast path (Numba)")


@pytest.fixture(scope="module", params=sorted(MODELS))
def name(request):
    if not MODELS[request.param].exists():
        pytest.skip(f"model {MODELS[request.param].name} not downloaded")
    return request.param


@pytest.fixture(scope="module")
def ref(name):
    return np.load(DATA / f"{name}_fa.npz")


@pytest.fixture(scope="module")
def model(name):
    from ggviz.run import load_model
    return load_model(str(MODELS[name]))


def _ctx(model, nth):
    cp = llama.context_default_params()          # flash_attn_type: the default, AUTO
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 1024, 512, 512
    cp.n_threads = cp.n_threads_batch = nth
    return llama.init_from_model(model, cp)


def _sha(rows):
    return np.array([hashlib.sha256(np.ascontiguousarray(r, np.float32).tobytes()).hexdigest() for r in rows])


@pytest.fixture(scope="module")
def runs(model, ref):
    """ggviz's logits of the text: decode path and one-batch prefill, 1 and 2 threads (shared by the tests)."""
    ids = [int(t) for t in ref["ids"]]
    out = {}
    for nth in (1, 2):
        ctx = _ctx(model, nth)
        rows = []
        for t in ids:
            assert llama.decode(ctx, llama.batch_get_one([t])) == 0
            rows.append(np.array(llama.get_logits_ith(ctx, -1), np.float32))
        out[("decode", nth)] = np.stack(rows)
        llama.free(ctx)
        ctx = _ctx(model, nth)
        b = llama.batch_init(len(ids))
        for i, t in enumerate(ids):
            llama.batch_add(b, t, i, [0], True)
        assert llama.decode(ctx, b) == 0
        out[("prefill", nth)] = np.stack([np.array(llama.get_logits_ith(ctx, i), np.float32)
                                          for i in range(len(ids))])
        llama.free(ctx)
    return out


@pytest.mark.parametrize("nth", (1, 2))
@pytest.mark.parametrize("path", ("decode", "prefill"))
def test_logits_bits_as_llamacpp(runs, ref, path, nth):
    got = runs[(path, nth)]
    want = ref[f"sha256_{path}_t{nth}"]
    equal = int((_sha(got) == want).sum())
    rows = [int(r) for r in ref["rows"]]
    if equal != len(want):              # a readable diff on the stored rows
        d = np.abs(got[rows] - ref[f"logits_{path}"]).max(axis=1) if nth == 1 else None
        pytest.fail(f"{path}, {nth} threads: {equal} of {len(want)} rows bit-equal to llama.cpp's (stored rows "
                    f"{rows}: max |diff| {d})")


def test_flash_attention_resolved_as_llamacpp(model, ref):
    """llama.cpp's log says AUTO resolved to enabled (the graph-reserve probe); so does ggviz's context."""
    assert "Flash Attention enabled" in str(ref["log"])
    ctx = _ctx(model, 1)
    try:
        assert ctx.flash_attn and not ctx.kv.v_trans
        assert ctx.reserve_log[0]["split_only"] and ctx.reserve_log[0]["n_tokens"] == 1
    finally:
        llama.free(ctx)


def test_compute_buffer_size_as_llamacpp(model, ref):
    """The CPU compute buffer llama.cpp reserves with flash attention on (its log, MiB to 2 decimals)."""
    m = re.search(r"CPU compute buffer size =\s+([0-9.]+) MiB", str(ref["log"]))
    ctx = _ctx(model, 1)
    try:
        assert f"{ctx.compute_buffer_sizes()['CPU'] / 1024 / 1024:.2f}" == m.group(1)
    finally:
        llama.free(ctx)


def test_fa_decode_graph_as_llamacpp(name, model):
    """One decode step after the prompt: llama.cpp's nodes (op, name, type, ne, sources), one FLASH_ATTN_EXT per
    layer reading K and V views of the cache (V not transposed) and the F16 mask."""
    g = json.loads((DATA / f"{name}_fa_graph.json").read_text())
    ctx = _ctx(model, 2)
    try:
        ids = g["prompt_ids"]
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
        t = int(np.argmax(llama.get_logits_ith(ctx, -1)))
        assert llama.decode(ctx, llama.batch_get_one([t])) == 0
        nodes = [dict(name=n.name, op=ggml.op_desc(n), type=ggml.type_name(n.type), ne=list(n.shape),
                      src=[s.name for s in n.src if s is not None]) for n in ctx.last_graph.gf.nodes]
    finally:
        llama.free(ctx)
    assert len(nodes) == len(g["nodes"])
    for i, (a, b) in enumerate(zip(nodes, g["nodes"])):
        assert a == b, f"node {i}: ggviz {a} != llama.cpp {b}"
    assert sum(n["op"] == "FLASH_ATTN_EXT" for n in nodes) == model.hparams.n_layer
    assert not any(n["op"] == "SOFT_MAX" for n in nodes)


def test_greedy_as_llamacpp(name, model, ref):
    from ggviz.run import generate
    p = "The capital of France is"
    g = generate(p, 32, model=model, threads=2, n_ctx=1024)
    assert g.prompt_tokens == ref["greedy_prompt_ids"].tolist()
    assert g.tokens == ref["greedy_ids"].tolist()


def test_ggviz_run_prints_llamacpps_text(name, ref, capsys):
    """``ggviz run -p "The capital of France is" -n 32``: the text of llama.cpp's default run."""
    if name != "smollm2":
        pytest.skip("one model is enough for the CLI")
    from ggviz import cli
    from ggviz.run import load_model
    vocab = llama.model_get_vocab(load_model(str(MODELS[name])))
    text = "".join(llama.token_to_piece(vocab, int(t)).decode("utf-8", "replace") for t in ref["greedy_ids"])
    assert cli.main(["run", "-m", str(MODELS[name]), "-p", "The capital of France is", "-n", "32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The capital of France is" + text)


@pytest.mark.parametrize("nth", (1, 2))
def test_split_kv_decode_as_llamacpp(name, model, nth):
    """Past 256 cells a decode attends n_kv = 512 cells: ggml's split-KV kernel (per-thread KV chunks merged, so 1
    and 2 threads give different bits -- llama.cpp's too). A 256-token prefill, then 8 decodes: every row bit-equal."""
    if name != "smollm2":
        pytest.skip("one model is enough for the split-KV kernel")
    z = np.load(DATA / "smollm2_fa_split.npz")
    ids, n0 = [int(t) for t in z["ids"]], int(z["n_prefill"])
    ctx = _ctx(model, nth)
    try:
        assert llama.decode(ctx, llama.batch_get_one(ids[:n0])) == 0
        rows = []
        for t in ids[n0:]:
            assert llama.decode(ctx, llama.batch_get_one([t])) == 0
            rows.append(np.array(llama.get_logits_ith(ctx, -1), np.float32))
        assert ctx.last_graph.n_kv == 512
    finally:
        llama.free(ctx)
    equal = int((_sha(rows) == z[f"sha256_t{nth}"]).sum())
    assert equal == len(rows), f"{nth} threads: {equal} of {len(rows)} rows bit-equal to llama.cpp's"
