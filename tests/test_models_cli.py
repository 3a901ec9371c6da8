"""Every CLI command, the report and the model views on both models: SmolLM2 (llama) and Gemma-3 270M (gemma3).

Run in-process through ``ggviz.cli.main`` (one model load per model, cached by ``ggviz.run.load_model``), asserting
what each output says against oracles:

- the decode graph's node count: llama.cpp's own graphs (``tests/data/llamacpp/smollm2_decode_graph.json``: 1086
  nodes, ``tests/data/gemma3/gemma3_shared_graph.json``: 817 nodes);
- the KV caches (how many, their cells, their layers, their bytes): llama.cpp's log of the same context
  (``llama_kv_cache: size = X MiB (N cells, L layers, ...)``), read from the installed AVX2 ``llama_cpp`` built with
  ``verbose=True`` (its log callback prints to ``sys.stderr``, which the test redirects);
- the tokenizer section: ids equal to llama.cpp's (``tests/data/gemma3/gemma3_tokenize.json``, and
  ``llama_cpp.Llama.tokenize`` for SmolLM2), and SPM's merges for Gemma, BPE's for SmolLM2.

The Gemma-3 cases skip when ``data/models/gemma-3-270m-q4_k_m.gguf`` is absent (``ggviz fetch gemma3-270m``).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from ggviz import capture, cli, ggml, llama
from ggviz.tools import report
from ggviz.fetch import FetchError, resolve_model

DATA = Path(__file__).parent / "data"
PROMPT = "The ggml library is"
MODELS = ["smollm2", "gemma3-270m"]
GRAPH_ORACLE = {"smollm2": DATA / "llamacpp" / "smollm2_decode_graph.json",
                "gemma3-270m": DATA / "gemma3" / "gemma3_shared_graph.json"}
# llama.cpp's graphs with its default context params (flash attention: one FLASH_ATTN_EXT per layer)
FA_GRAPH_ORACLE = {"smollm2": DATA / "flash_attn" / "smollm2_fa_graph.json",
                   "gemma3-270m": DATA / "flash_attn" / "gemma3_fa_graph.json"}


def _path(name: str) -> str:
    try:
        return str(resolve_model(name))
    except FetchError:
        pytest.skip(f"the model {name} is absent (ggviz fetch {name})")


@pytest.fixture(scope="module", params=MODELS)
def model_name(request):
    _path(request.param)
    return request.param


@pytest.fixture(scope="module")
def model(model_name):
    from ggviz.run import load_model
    return load_model(_path(model_name))


def _n_nodes_oracle(name: str, flash_attn: bool = False) -> int:
    return len(json.loads((FA_GRAPH_ORACLE if flash_attn else GRAPH_ORACLE)[name].read_text())["nodes"])


_LLAMACPP_LOG: dict = {}


def _llamacpp_kv(path: str, n_ctx: int) -> list[tuple[int, int, int]]:
    """(cells, layers, K+V bytes) of every KV cache llama.cpp creates for a context of ``n_ctx`` (its log, which
    gives the bytes in MiB to two decimals)."""
    key = (path, n_ctx)
    if key not in _LLAMACPP_LOG:
        llama_cpp = pytest.importorskip("llama_cpp")
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf):
            lm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=1, verbose=True, flash_attn=False)
            del lm
        caches = []
        for m in re.finditer(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers", buf.getvalue()):
            caches.append((int(m.group(2)), int(m.group(3)), round(float(m.group(1)) * 2**20)))
        assert caches, "llama.cpp's log has no llama_kv_cache size line"
        _LLAMACPP_LOG[key] = caches
    return _LLAMACPP_LOG[key]


def _llamacpp_tokens(path: str, text: str) -> list[int]:
    llama_cpp = pytest.importorskip("llama_cpp")
    lm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return lm.tokenize(text.encode("utf-8"), add_bos=True, special=True)


def _section(page: str, sid: str) -> str:
    i = page.index(f"id='{sid}'") if f"id='{sid}'" in page else page.index(f'id="{sid}"')
    j = page.find("<section", i)
    return page[i:j if j > 0 else len(page)]


def _table_rows(html: str) -> list[list[str]]:
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr, re.S)]
        rows.append(cells)
    return rows


# ---------------------------------------------------------------------------------------------------- the report

@pytest.fixture(scope="module")
def page(model_name, model, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"report-{model_name}") / "report.html"
    assert cli.main(["report", "--model", model_name, "-o", str(out), "-p", PROMPT]) == 0
    return out.read_text(encoding="utf-8")


def test_report_names_the_graph_as_llamacpp(model_name, model, page):
    n = _n_nodes_oracle(model_name)
    assert n == (817 if model_name == "gemma3-270m" else 1086)
    ov = _section(page, "overview")
    assert f"{n} nodes" in ov
    builder = "llm_build_gemma3" if model_name == "gemma3-270m" else "llm_build_llama"
    assert builder in _section(page, "graph")
    assert f"head_dim={model.hparams.n_embd_head_k}" in ov
    assert f"n_vocab={model.hparams.n_vocab}" in ov
    assert "this view failed" not in page


def test_report_kv_caches_as_llamacpp(model_name, model, page):
    """One KV table row per cache, with llama.cpp's cells, layer count and bytes for the same n_ctx."""
    expect = _llamacpp_kv(_path(model_name), 256)
    rows = _table_rows(_section(page, "kv"))
    header, body = rows[0], rows[1:]
    got = [(int(r[header.index("cells")].replace(",", "")), len(r[header.index("layers")].split(",")),
            int(r[header.index("K+V bytes")].replace(",", ""))) for r in body]
    # llama.cpp logs the size in MiB to two decimals: equal to that rounding
    assert [(c, ly) for c, ly, _ in got] == [(c, ly) for c, ly, _ in expect]
    assert [round(b / 2**20, 2) for _, _, b in got] == [round(b / 2**20, 2) for _, _, b in expect]
    if model_name == "gemma3-270m":
        assert [r[header.index("cache")] for r in body] == ["base", "SWA"]
        assert body[0][header.index("layers")] == "5, 11, 17"
        assert body[1][header.index("window")] == str(model.hparams.n_swa)
        assert "two</b> caches" in _section(page, "kv")


def test_report_tokenizer_section(model_name, model, page):
    sec = _section(page, "tokenize")
    ids = llama.tokenize(model.vocab, PROMPT, add_special=True, parse_special=True)
    # llama.cpp's tokens of the prompt (its own tokenizer, the installed AVX2 build)
    assert ids == _llamacpp_tokens(_path(model_name), PROMPT)
    if model_name == "gemma3-270m":
        assert "SPM, merge by merge" in sec and "highest score" in sec
        assert "BPE, merge by merge" not in sec
        # the last merge of the fragment makes the token llama.cpp gives for " ggml"'s first piece: "▁gg" (40620)
        assert "token 40620" in sec
    else:
        assert "BPE, merge by merge" in sec and "SPM" not in sec
    for t in ids:
        assert re.search(rf"\b{t}\b", sec)


# ---------------------------------------------------------------------------------------------------- the commands

def test_graph_command(model_name, tmp_path, capsys):
    out = tmp_path / "g.dot"
    assert cli.main(["graph", "--model", model_name, "--full", "--format", "dot", "-o", str(out)]) == 0
    n = _n_nodes_oracle(model_name)
    assert f"({n} nodes" in capsys.readouterr().out
    dot = out.read_text()
    if model_name == "gemma3-270m":
        for name in ("attn_post_norm-0", "ffn_post_norm-0", "Qcur_normed-0", "inp_scaled"):
            assert name in dot


def test_trace_command(model_name, tmp_path):
    out = tmp_path / "t.json"
    assert cli.main(["trace", "--model", model_name, "-o", str(out)]) == 0
    ev = json.loads(out.read_text())
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    names = {e.get("name", "") for e in ev}
    # the traced compute ran the architecture's own nodes: Gemma's GEGLU, SmolLM2's SWIGLU, in every layer (a
    # norm's MUL may be fused into its RMS_NORM on the fast path: no span of its own, so it is not asked for)
    n_layer = 18 if model_name == "gemma3-270m" else 30
    if model_name == "gemma3-270m":
        want = {f"ffn_geglu-{il}" for il in range(n_layer)}
        assert not any(n.startswith("ffn_swiglu") for n in names)
    else:
        want = {f"ffn_swiglu-{il}" for il in range(n_layer)}
        assert not any(n.startswith(("ffn_geglu", "attn_post_norm")) for n in names)
    assert want <= names


GREEDY_ORACLE = {"smollm2": DATA / "llamacpp" / "smollm2_tokens_greedy.json",
                 "gemma3-270m": DATA / "gemma3" / "gemma3_shared_tokens_greedy.json"}


def test_run_command_greedy(model_name, model, capsys):
    """``ggviz run`` greedy continues "The capital of France is" as llama.cpp does (its 32-token greedy
    continuation, captured one token per llama_decode: the first 8 tokens, detokenized)."""
    case = next(c for c in json.loads(GREEDY_ORACLE[model_name].read_text())["greedy"]
                if c["prompt"] == "The capital of France is")
    expect = b"".join(llama.token_to_piece(model.vocab, t, 0, False) for t in case["gen_ids"][:8]).decode()
    assert cli.main(["run", "--model", model_name, "-p", case["prompt"], "-n", "8", "--temp", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(case["prompt"] + expect)


def test_demo_command(model_name, model, tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--model", model_name, "--out", str(out), "-n", "0", "--no-report", "--quiet"]) == 0
    assert (out / "arena.txt").exists() and (out / "layer0.dot").exists()
    assert not (out / "report.html").exists()          # --no-report (test_report: the report is written last)
    arena = (out / "arena.txt").read_text()
    expect = _llamacpp_kv(_path(model_name), 256)
    if model_name == "gemma3-270m":
        assert "== base KV cache context (256 cells x 3 layers)" in arena
        assert "== SWA KV cache context (256 cells x 15 layers)" in arena
        assert [(256, 3), (256, 15)] == [(c, ly) for c, ly, _ in expect]
    else:
        assert f"KV cache context ({expect[0][0]} cells x {expect[0][1]} layers)" in arena


def test_demo_summary_names_both_caches(model_name, model):
    from ggviz.tools import demo
    r = demo.run(model, PROMPT, n_threads=2)
    s = demo.summary(r)
    assert f"n_nodes={_n_nodes_oracle(model_name)}" in s
    if model_name == "gemma3-270m":
        assert "llm_build_gemma3" in s and "base KV cache of 256 cells x 3 layers" in s
        assert "SWA KV cache of 256 cells x 15 layers (window 512)" in s
    else:
        assert "llm_build_llama" in s


# ---------------------------------------------------------------------------------------------------- the views

def test_kv_view_shows_each_cache(model_name, model):
    """KVCacheView / capture_inputs: one snapshot per cache, each with the cache's own n_kv, cells and mask, equal to
    what the cache holds after the decode."""
    from ggviz.viz import model_views as MV
    cp = llama.context_default_params()
    cp.n_ctx = 256
    ctx = llama.init_from_model(model, cp)
    ids = llama.tokenize(model.vocab, PROMPT, add_special=True, parse_special=True)
    with capture.capture_inputs(ctx) as snaps:
        assert llama.decode(ctx, llama.batch_get_one(ids[:-1])) == 0
        assert llama.decode(ctx, llama.batch_get_one(ids[-1:])) == 0
    assert len(snaps) == 2
    st = MV.KVCacheView(snaps, model.vocab).state()
    caches = report.kv_caches(ctx.kv)
    if model_name == "gemma3-270m":
        assert [lbl for lbl, _ in caches] == ["base", "SWA"]
        assert st["cache"] == "base" and st["swa"] is not None
        assert st["layers"] == [5, 11, 17] and len(st["swa"]["layers"]) == 15
        assert st["swa"]["n_swa"] == model.hparams.n_swa
        assert st["swa"]["n_kv"] == ctx.kv.kv_swa.get_n_kv()
        assert st["n_kv"] == ctx.kv.kv_base.get_n_kv()
        assert st["swa"]["written_cells"] == [len(ids) - 1]
        # within the window both masks let the last token see positions 0..5, nothing else
        assert np.array(st["swa"]["mask_allowed"])[0, :len(ids)].all()
        assert not np.array(st["swa"]["mask_allowed"])[0, len(ids):].any()
    else:
        assert st["swa"] is None and st["cache"] == ""
    assert st["written_cells"] == [len(ids) - 1]
    assert np.array(st["mask_allowed"])[0, :len(ids)].all()
    assert st["n_used"] == len(ids)


def test_tokenizer_view(model_name, model):
    from ggviz.viz import model_views as MV
    v = MV.BPEView(model.vocab, PROMPT)
    st = v.state()
    assert [t for u in st["units"] for t in u["ids"]] == llama.tokenize(model.vocab, PROMPT, True, True)
    word = next(k for k, u in enumerate(v.units) if not u.special)
    st = v.select(word).state()
    assert st["merges"]
    if model_name == "gemma3-270m":
        assert st["tokenizer"] == "SPM"
        # the merges end in the fragment's tokens: the last step's symbols are the pieces llama.cpp emits
        pieces = [model.vocab.tokens[t] for t in st["ids"]]
        assert st["merges"][-1]["symbols"].split(" ") == pieces
        assert "score" in st["merges"][0]
    else:
        assert st["tokenizer"] == "BPE" and "rank" in st["merges"][0]
    assert "special token" not in v.to_html()


def test_report_attention_scale(model_name, page):
    """llama.cpp's gemma3.cpp scales Q by f_attention_scale (1/sqrt(256)) and calls build_attn with kq_scale 1;
    llama.cpp's llama.cpp passes 1/sqrt(head_dim) to the softmax: the section says which."""
    sec = _section(page, "attention")
    if model_name == "gemma3-270m":
        assert "scale is 1" in sec and "0.0625" in sec
    else:
        assert "scales by 1/sqrt(head_dim)" in sec


def test_attention_view(model_name, model):
    """AttentionView on every layer (Gemma: the SWA layers and the global ones): each row a distribution over the
    cells the mask lets the token see (the causal triangle of the prompt), none on the others."""
    from ggviz.viz import model_views as MV
    cp = llama.context_default_params()
    cp.n_ctx, cp.flash_attn_type = 256, 0        # the weights are a node (kq_soft_max) only without flash attention
    ctx = llama.init_from_model(model, cp)
    ids = llama.tokenize(model.vocab, PROMPT, add_special=True, parse_special=True)
    rec = capture.capture_attention(ctx, ids)
    assert sorted(rec.layers) == list(range(model.hparams.n_layer))
    n = len(ids)
    for il, w in rec.layers.items():
        assert w.shape[:2] == (model.hparams.n_head, n)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        assert not np.triu(w[:, :, :n], 1).any() and not w[:, :, n:].any()
    st = MV.AttentionView(rec, 5).state()
    assert st["n_head"] == model.hparams.n_head and st["n_tokens"] == n


def test_machinery_widgets(model_name, model):
    """The graph, build-replay, scheduler and allocator widgets on a prompt decode of each model: the replay of
    ggml_build_forward_expand ends with as many nodes as llama.cpp's graph for this prompt length has with its default
    params, flash attention on (the decode graph's count for one token: prefill and decode graphs have the same nodes
    here, both with one output row)."""
    from ggviz import trace
    from ggviz.viz.widgets import AllocatorView, GraphView, SchedulerView, VisitAnimation
    cp = llama.context_default_params()
    cp.n_ctx = 256
    ctx = llama.init_from_model(model, cp)
    ids = llama.tokenize(model.vocab, PROMPT, add_special=True, parse_special=True)
    with trace.Recorder() as rec:
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
    gf = ctx.last_graph.gf
    assert gf.n_nodes == _n_nodes_oracle(model_name, flash_attn=True)
    va = VisitAnimation(rec, gf)
    assert va.state(va.n_steps - 1)["n_nodes"] == gf.n_nodes
    assert GraphView(gf).to_html().count("<svg") >= 1
    assert SchedulerView(ctx.sched, gf, rec).state()["n_splits"] == 1
    assert "<img" in AllocatorView(ctx.sched.galloc, ctx.sched.graph).to_html() or \
        "<svg" in AllocatorView(ctx.sched.galloc, ctx.sched.graph).to_html()


def test_quant_block_explorer_every_type_of_the_file(model_name, model):
    """QuantBlockExplorer on one tensor of each quantized type in the file (Gemma: Q8_0, Q5_0, Q4_K, Q6_K; SmolLM2:
    Q8_0, Q4_1): the block's values are that row's dequantization (ggml's dequantize_row_*)."""
    from ggviz.ggml import quants
    from ggviz.viz.widgets import QuantBlockExplorer
    seen = {}
    for name, t in model.tensors.items():
        ty = ggml.type_name(t.type)
        if ty in seen or t.type in (ggml.GGML_TYPE_F32, ggml.GGML_TYPE_F16):
            continue
        seen[ty] = name
        st = QuantBlockExplorer(t, row=3, block=1).state()
        assert st["type"] == ty and not st["requantized"]
        bs = ggml.blck_size(t.type)
        raw = np.ascontiguousarray(np.asarray(ggml.get_data(t)).reshape(-1, ggml.row_size(t.type, t.ne[0]))[3])
        row = quants.dequantize_row(t.type, raw)
        assert np.array_equal(np.asarray(st["values"], np.float32), row[bs:2 * bs])
    expect = {"q8_0", "q5_0", "q4_K", "q6_K"} if model_name == "gemma3-270m" else {"q8_0", "q4_1"}
    assert set(seen) == expect


def test_explorer_inputs_of_each_cache(model_name, model):
    """The explorer (what `ggviz explore` serves) on each model: the graph's input leafs carry the values the
    context set; with Gemma's iSWA cache both masks (two leafs named attn_inp_kq_mask), each its own cache's."""
    from ggviz.viz.widgets.explorer import DecodeExplorer
    ex = DecodeExplorer.record(PROMPT, threads=2, model=model, values=False)
    assert ex.state()["n_nodes"] == _n_nodes_oracle(model_name)
    masks = [j for j, lf in enumerate(ex.gf.leafs) if lf.name == "attn_inp_kq_mask"]
    assert len(masks) == (2 if model_name == "gemma3-270m" else 1)
    assert all(j in ex.leaf_values for j in masks)
    n_past = len(llama.tokenize(model.vocab, PROMPT, add_special=True, parse_special=True))
    for j in masks:
        allowed = np.isfinite(ex.leaf_values[j]).reshape(-1)
        assert allowed[:n_past + 1].all() and not allowed[n_past + 1:].any()     # the step sees the prompt + itself
