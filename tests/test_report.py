"""ggviz.tools.report and ggviz.tools.export: the recorded decode step, the standalone HTML page, the graph/trace commands.

The recording is checked against the engine and plain NumPy (the values the eval callback copied out are the values
the layer computes; attention rows are distributions over the visible cells; the replay reproduces the logits), the
page for being standalone (no network) and complete. ``tests/test_browser.py`` opens the same page in Chromium.
"""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from ggviz import cli
from ggviz.tools import report
from ggviz.tools.export import chrome_trace, chrome_trace_from_events

SECTION_IDS = ["overview", "gguf", "tokenize", "memory", "graph", "plan", "timeline", "sched", "kv", "attention",
               "logits"]
HAVE_DOT = shutil.which("dot") is not None


@pytest.fixture(scope="module")
def model():
    from ggviz.run import load_model
    return load_model()


@pytest.fixture(scope="module")
def rec(model):
    return report.recording(model=model)


@pytest.fixture(scope="module")
def doc(rec):
    return report.capture_report(rec)


@pytest.fixture(scope="module")
def page(doc):
    return report.render_report(doc)


def _value(rec, name):
    return next(v for v in rec.values if v["name"] == name)


# ---------------------------------------------------------------------------------------------------------- record

def test_recording_is_one_decode_step(rec):
    st = rec.step
    assert st.graph.n_tokens == 1 and st.graph.gf.n_nodes > 1000
    assert st.pos == len(st.prompt_ids) and st.ctx.kv.cells.pos[: st.pos + 1].tolist() == list(range(st.pos + 1))
    # the replay without the eval callback computes exactly the same logits
    assert rec.replay_max_diff == 0.0
    assert rec.logits.shape == (st.model.hparams.n_vocab,)
    # the sampler chain's last step selected the token the report names
    assert rec.sampler_history[0]["step"] == "logits" and rec.sampler_history[-1]["selected"] == rec.sampled


def test_layer0_values_are_what_the_layer_computes(rec):
    """cb_eval handed out each node's result as it was computed: check a few against plain NumPy."""
    from ggviz import ggml
    names = [v["name"] for v in rec.values]
    order = [v["node_n"] for v in rec.values]
    assert order == sorted(order) and names[0] in ("embd", "inp_embd") and names[-1] == "result_output"
    assert {"norm-0", "attn_norm-0", "kq_soft_max-0", "ffn_out-0", "l_out-0"} <= set(names)
    m = rec.model
    hp = m.hparams
    emb = ggml.get_data_f32(m.tok_embd).reshape(hp.n_vocab, hp.n_embd)[rec.step.token]
    x = _value(rec, names[0])["data"].reshape(-1)
    np.testing.assert_allclose(x, emb, rtol=1e-6)
    norm = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + hp.f_norm_rms_eps)
    np.testing.assert_allclose(_value(rec, "norm-0")["data"].reshape(-1), norm, rtol=2e-5, atol=1e-6)
    g = ggml.get_data_f32(m.layers[0].attn_norm).reshape(-1)
    np.testing.assert_allclose(_value(rec, "attn_norm-0")["data"].reshape(-1), norm * g, rtol=2e-5, atol=1e-6)
    # residual: l_out = ffn_out + ffn_inp (the last two adds of the layer)
    outs = [v for v in rec.values if v["name"] == "ffn_out-0"]
    ffn_inp = _value(rec, "ffn_inp-0")["data"].reshape(-1)
    np.testing.assert_allclose(_value(rec, "l_out-0")["data"].reshape(-1),
                               outs[0]["data"].reshape(-1) + ffn_inp, rtol=1e-5, atol=1e-6)
    # the logits the context returned are the last node's values
    np.testing.assert_array_equal(_value(rec, "result_output")["data"].reshape(-1), rec.logits)


def test_attention_rows_are_distributions_over_visible_cells(rec):
    n_vis = rec.step.pos + 1
    kq = _value(rec, "kq_soft_max-0")["data"]
    w = kq.reshape(rec.model.hparams.n_head, -1)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-5)
    assert np.all(w[:, n_vis:] == 0.0) and np.all(w[:, :n_vis] > 0.0)
    pa = rec.prompt_attn                                   # [head, query, key], causal
    n = len(rec.step.prompt_ids)
    assert pa.shape == (rec.model.hparams.n_head, n, n)
    np.testing.assert_allclose(pa.sum(axis=2), 1.0, rtol=1e-5)
    assert np.all(np.triu(pa, 1) == 0.0)
    # the masks read before each compute: causal for the prompt, the first n_vis cells for the step
    m_prompt, m_step = rec.step.masks[:2]
    assert np.isfinite(m_prompt[:, :n]).tolist() == np.tril(np.ones((n, n), bool)).tolist()
    assert np.isfinite(m_step[0]).sum() == n_vis and np.isfinite(m_step[0, :n_vis]).all()


def test_tokenization_and_merges(rec):
    vocab = rec.model.vocab
    ids = [i for u in rec.units for i in u.ids]
    assert ids == rec.step.prompt_ids
    for u in rec.units:
        if u.special:
            continue
        ms = rec.merges[u.text]
        final = ms[-1].symbols if ms else tuple(u.encoded)
        assert tuple(vocab.tokens[i] for i in u.ids) == final
        assert [m.step for m in ms] == list(range(1, len(ms) + 1))


def test_timeline_recorded(rec):
    kinds = {e["kind"] for e in rec.timeline_events}
    assert {"cpu.plan", "cpu.compute.start", "cpu.node", "cpu.barrier", "cpu.compute.end"} <= kinds
    starts = [e for e in rec.timeline_events if e["kind"] == "cpu.compute.start"]
    assert len(starts) == 1                                 # the replay is one uninterrupted compute
    if rec.timeline is not None:
        assert sorted(rec.timeline.last["threads"]) == list(range(rec.step.n_threads))


def test_timeline_section_is_the_compiled_walk_and_adds_up(rec):
    """The report's thread timeline comes from the compiled walk (threads truly parallel), says so, and each
    thread's row splits the compute's wall time into parts that add up, none counted twice (the 5 % bound on the
    unrecorded rest is tests/test_timeline.py's: on a shared machine one recording may exceed it)."""
    pytest.importorskip("ggviz.ggml.cpu.fast.compiler", reason="the compiled walk needs Numba")
    out = report.draw_timeline(report.sec_timeline(rec))
    assert out["compiled"] and "compiled walk" in out["walk"] and out["n_mul_mat"] > 200
    assert len(out["threads"]) == rec.step.n_threads
    for row in out["threads"]:
        parts = sum(row[k] for k in ("in kernels (µs)", "barrier: spinning (µs)", "barrier: asleep (µs)",
                                     "pool: kickoff/join (µs)"))
        assert row["unrecorded (µs)"] >= -3 and row["in kernels (µs)"] > 0, row      # -3: five roundings
        assert abs(parts + row["unrecorded (µs)"] - row["wall (µs)"]) <= 3, row


# ---------------------------------------------------------------------------------------------------------- page

def test_page_is_complete_and_standalone(page, rec):
    for sid in SECTION_IDS:
        assert f"<section id='{sid}'>" in page
    assert "this view failed" not in page
    # nothing to fetch: no external scripts, styles, images or frames
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", page)
    assert "<link" not in page and "<iframe" not in page and "@import" not in page
    assert page.count("data:image/png;base64,") >= 8
    assert page.count("<svg") >= 2
    # every section names the C functions it mirrors and carries a teacher note
    assert page.count("<b class='m'>Mirrors:</b>") >= len(SECTION_IDS)
    # the layer-0 stepper has one frame per value the eval callback copied out
    frames = re.findall(r"<div class='ggv-frame' data-k='(\d+)'", page.split("id='layer0-stepper'")[1].split(
        "</section>")[0])
    assert len(frames) == sum(v["node_n"] is not None for v in rec.values)
    vocab = rec.model.vocab
    assert report.esc(vocab.token_to_piece(rec.sampled, True).decode("utf-8", "replace")) in page


def _sections(page):
    return dict(re.findall(r"<section id='([^']+)'>(.*?)</section>", page, re.S))


def test_page_sections_have_their_content(page, rec):
    """Each section keeps its heading, nav link, figures, tables and sliders (a lost piece shows up here)."""
    secs = _sections(page)
    assert list(secs) == SECTION_IDS == [s.sid for s in report.SECTIONS]
    nav = page.split("<nav>")[1].split("</nav>")[0]
    for spec in report.SECTIONS:
        body = secs[spec.sid]
        assert f"<h2>{report.esc(spec.title)}</h2>" in body
        assert f"<a href='#{spec.sid}'>{report.esc(spec.title)}</a>" in nav
        assert all(f"<code>{report.esc(m)}</code>" in body for m in spec.mirrors)
    alts = {sid: re.findall(r"<img alt='([^']*)'", body) for sid, body in secs.items()}
    assert {"context arenas", "gallocr plan"} <= set(alts["memory"])
    assert alts["kv"] == ["KV cells and mask, prompt", "KV cells and mask, step"]
    assert alts["attention"] == ["prompt attention, layer 0", "decode attention, layer 0"]
    assert alts["logits"] == ["top logits", "sampler chain"]
    n_values = sum(v["node_n"] is not None for v in rec.values)
    assert len(alts["graph"]) == n_values and secs["graph"].count("<svg") == 2
    assert "<svg" in secs["gguf"] and "Tensor data by type" in secs["gguf"]
    assert secs["timeline"].count("data:image/png;base64,") >= 1 and "Per thread (" in secs["timeline"]
    tables = {sid: body.count("<table class='t'>") for sid, body in secs.items()}
    assert tables["overview"] == 1 and tables["tokenize"] == 1 and tables["plan"] == 2 and tables["sched"] == 3
    assert tables["memory"] == 3 and tables["kv"] == 1 and tables["logits"] == 1
    # the BPE slider: per word, its bytes, each merge, its tokens
    words = [u for u in rec.units if not u.special]
    n_bpe = sum(len(rec.merges[u.text]) + 2 for u in words)
    assert f"id='bpe-stepper' data-n='{n_bpe}'" in secs["tokenize"]
    assert f"id='layer0-stepper' data-n='{n_values}'" in secs["graph"]
    # the page's style and script are inlined
    assert ".ggv-stepper{" in page.split("<style>")[1].split("</style>")[0]
    assert "data-ggv-ready" in page.split("<script>")[1].split("</script>")[0]


def test_a_failing_view_says_what_failed(rec, monkeypatch):
    """Graphviz's dot missing costs the graph section only, and the section says so; a bug propagates."""
    import graphviz

    def no_dot(self, *a, **k):
        raise graphviz.ExecutableNotFound(["dot"])

    monkeypatch.setattr(graphviz.Digraph, "pipe", no_dot)
    kept = [s for s in report.SECTIONS if s.sid in ("overview", "graph", "sched")]
    monkeypatch.setattr(report, "SECTIONS", kept)
    with pytest.warns(UserWarning, match="'graph' section failed"):
        page = report.build_report(rec)
    secs = _sections(page)
    assert list(secs) == ["overview", "graph", "sched"]
    assert "<b>this view failed</b>: ExecutableNotFound: " in secs["graph"] and "<h2>The compute graph</h2>" in secs["graph"]
    assert "this view failed" not in secs["overview"] + secs["sched"]

    def bug(rec_):
        raise TypeError("a bug")

    monkeypatch.setattr(report, "SECTIONS", [report.SectionSpec("overview", "x", (), bug)])
    with pytest.raises(TypeError, match="a bug"):
        report.build_report(rec)


def test_templates_escape_and_ship():
    """The templates are found through the package (package data) and escape what they are given."""
    env = report._env()
    names = set(env.list_templates())
    assert {"report.html.j2", "report.css", "report.js"} <= names
    assert {f"sections/{s.sid}.html.j2" for s in report.SECTIONS} <= names
    out = env.get_template("sections/failed.html.j2").render(sid="x", title="<t>", mirrors=("a<b",),
                                                           error_type="E", error="<script>alert(1)</script>")
    assert "<script>" not in out and "&lt;script&gt;" in out and "<h2>&lt;t&gt;</h2>" in out
    assert "<code>a&lt;b</code>" in out


# the sections whose record holds the run's data, drawn at render time (the others keep their template's variables)
DRAWN_FROM_RECORDS = {"memory", "graph", "timeline", "sched", "kv", "attention", "logits"}


def _drawn(x) -> list:
    """The drawn things (PNG bytes, inline markup) somewhere in a saved record."""
    if isinstance(x, dict):
        return ([k for k in ("__bytes__", "__markup__") if k in x]
                + [d for v in x.values() for d in _drawn(v)])
    if isinstance(x, (list, tuple)):
        return [d for v in x for d in _drawn(v)]
    return []


def test_saved_recording_renders_the_same_page(doc, page, tmp_path, monkeypatch):
    """The report's record saved to disk and loaded back draws the same page, byte for byte, with no model loaded
    and nothing run; the record holds plain data only (records.save refuses anything else), and the sections that
    draw from records hold no figure drawn: render_report draws them again from the run's data."""
    report.save_recording(doc, tmp_path)
    back = report.load_recording(tmp_path)
    assert [s["sid"] for s in back["sections"]] == SECTION_IDS
    assert {s.sid for s in report.SECTIONS if s.draw is not None} == DRAWN_FROM_RECORDS
    for s in back["sections"]:
        assert "failed" not in s, s
        if s["sid"] in DRAWN_FROM_RECORDS:
            assert not _drawn(s["record"]), s["sid"]
    assert _drawn(next(s for s in back["sections"] if s["sid"] == "gguf")["record"])   # the check can fail

    def no_model(*a, **k):
        raise AssertionError("a saved recording must render without a model")

    monkeypatch.setattr(report, "load_model", no_model)
    monkeypatch.setattr(report, "record_decode", no_model)
    assert report.render_report(back) == page
    with pytest.raises(ValueError, match="not a ggviz report record"):
        report.render_report({"format": "x"})
    with pytest.raises(FileNotFoundError, match="no recording"):
        report.load_recording(tmp_path / "missing")


def test_write_report_and_cli(tmp_path, model):
    """``ggviz report -o r.html --save-recording DIR``, then ``--from-recording DIR``: the same file."""
    out, again, saved = tmp_path / "r.html", tmp_path / "again.html", tmp_path / "rec"
    assert cli.main(["report", "-o", str(out), "--save-recording", str(saved)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and text.rstrip().endswith("</html>")
    assert cli.main(["report", "--from-recording", str(saved), "-o", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()
    with pytest.raises(SystemExit):                   # a saved run has no model or prompt to change
        report.main(["--from-recording", str(saved), "-p", "another prompt"])


# ---------------------------------------------------------------------------------------------------------- export

def test_graph_command_dot(tmp_path, model):
    from ggviz.capture import decode_graph
    out = tmp_path / "g.dot"
    assert cli.main(["graph", "--format", "dot", "-o", str(out)]) == 0
    src = out.read_text()
    gf = decode_graph(model).gf
    assert src.startswith("digraph") and src.count("shape=box3d") == model.hparams.n_layer
    assert f"{gf.n_nodes} nodes" in src
    out1 = tmp_path / "l3.dot"
    assert cli.main(["graph", "--layer", "3", "-o", str(out1)]) == 0
    s1 = out1.read_text()
    assert s1.count("shape=box3d") == model.hparams.n_layer - 1 and "Qcur-3" in s1
    assert cli.main(["graph", "--layer", "99", "--format", "dot", "-o", str(tmp_path / "x.dot")]) == 2


@pytest.mark.skipif(not HAVE_DOT, reason="graphviz's dot is not installed")
def test_graph_command_svg_png(tmp_path, model):
    svg = tmp_path / "g.svg"
    assert cli.main(["graph", "-o", str(svg)]) == 0
    assert "<svg" in svg.read_text()
    png = tmp_path / "l0.png"
    assert cli.main(["graph", "--layer", "0", "--format", "png", "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_command(tmp_path, model):
    out = tmp_path / "t.json"
    assert cli.main(["trace", "-o", str(out), "-t", "2"]) == 0
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    spans = [e for e in ev if e["ph"] == "X"]
    cats = {e["cat"] for e in spans}
    assert {"node", "barrier", "chunk"} <= cats
    assert {e["tid"] for e in spans if e["cat"] == "node"} == {0, 1}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    names = {e["name"] for e in spans if e["cat"] == "node"}
    assert {"Qcur-0", "kq_soft_max-0", "result_output"} <= names


def test_chrome_trace_fallback_agrees(rec):
    """The raw-event fallback finds the same node spans as ComputeTimeline.to_chrome_trace."""
    fb = chrome_trace_from_events(rec.timeline_events)
    spans = sorted((e["tid"], e["name"]) for e in fb["traceEvents"] if e["ph"] == "X" and e["cat"] == "node")
    assert spans
    if rec.timeline is not None:
        doc = chrome_trace(rec.timeline)
        ref = sorted((e["tid"], e["name"]) for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "node")
        assert spans == ref


def test_demo_ends_with_the_report(tmp_path, monkeypatch, capsys, model):
    """``ggviz demo`` writes report.html into its --out folder last, and says where (the writing itself is stubbed
    here: test_write_report_and_cli covers it; --no-report writes none: test_models_cli's test_demo_command)."""
    from ggviz.tools import demo

    calls = []

    def fake_write_report(path, prompt, threads, model_, disable_progress=None):
        calls.append((str(path), prompt, threads, model_))
        path.write_text("<!doctype html>")
        return path

    monkeypatch.setattr(demo, "write_report", fake_write_report)
    assert demo.main(["--model", model.path, "--out", str(tmp_path), "-n", "0", "--quiet", "-p", "Hi"]) == 0
    assert calls == [(str(tmp_path / "report.html"), "Hi", 2, model)]
    out = capsys.readouterr().out
    assert "report.html" in out.splitlines()[-1]
