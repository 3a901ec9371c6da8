"""DecodeExplorer: a selection shows, in every pane, what the engine itself recorded for that node.

One real decode step of the default model is recorded once for the module (``DecodeExplorer.record``). The oracles
are the engine's own data, read here independently of the explorer: the tensor's data pointer resolved in ggviz's
buffer registry and ``galloc.last_alloc`` (bytes), the raw ``cpu.node`` trace events (lanes), the scheduler's own
record of the split (``backend_sched_get_tensor_backend`` / ``_cause``) and the last ``sched.assign`` event (cause),
the model's embedding table and the context's logits (values).
"""
from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggviz import capture, ggml
from ggviz.ggml import backend as B
from ggviz.ggml import memory
from ggviz.ggml import sched as S
from ggviz.viz.widgets.explorer import PHASES, DecodeExplorer, lanes_window

NODES = ["kq-3", "ffn_out-7", "l_out-0", "result_output", "embd"]


@pytest.fixture(scope="module")
def ex(model):
    return DecodeExplorer.record(threads=2, model=model)


def _node(ex, name):
    return [t.name for t in ex.gf.nodes].index(name)


@pytest.mark.parametrize("name", NODES)
def test_bytes_follow_the_allocator(ex, name):
    i = _node(ex, name)
    t = ex.gf.nodes[i]
    st = ex.select(name).state()
    assert st["selected"]["index"] == i and st["selected"]["name"] == name
    b = st["bytes"]
    _, off, label = memory.resolve(t.data)                    # where the data pointer really is
    assert (b["offset"], b["buffer"], b["nbytes"]) == (off, label, ggml.nbytes(t))
    # its record in the allocator's plan (raw last_alloc: per node index and name)
    rec = [r for r in ex.sched.galloc.last_alloc["tensors"] if r["name"] == name and r["alloc_node"] == i
           and r["phase"] == "nodes"]
    assert len(rec) == 1 and rec[0]["view_src"] is None
    lo, hi = rec[0]["offset"], rec[0]["offset"] + rec[0]["alloc_size"]
    assert b["slot"] == (lo, hi) and lo == off and off + ggml.nbytes(t) <= hi
    assert b["reused_from"] == rec[0]["reused_from"]
    # the tensors that use the same bytes: recomputed from the raw plan (same buffer space, chunk, overlapping)
    space = ex.av._owner[rec[0]["buffer_id"]]
    want = sorted(r["name"] for r in ex.sched.galloc.last_alloc["tensors"]
                  if r is not rec[0] and r["view_src"] is None and r["offset"] is not None and r["alloc_size"] > 0
                  and ex.av._owner[r["buffer_id"]] == space and r["chunk"] == rec[0]["chunk"]
                  and r["offset"] < hi and r["offset"] + r["alloc_size"] > lo)
    assert sorted(o["name"] for o in b["sharers"]) == want
    # gallocr never gives the same bytes to two tensors alive at once (a hand-over shares only its node)
    a0, a1 = b["alloc_node"], (b["free_node"] if b["free_node"] is not None else ex.n_nodes - 1)
    for o in b["sharers"]:
        assert o["end_node"] <= a0 or o["alloc_node"] >= a1, (name, o)


@pytest.mark.parametrize("name", NODES)
def test_lanes_follow_the_trace(ex, name):
    i = _node(ex, name)
    lanes = ex.select(name).state()["lanes"]
    evs = ex.step.events
    s = max(k for k, e in enumerate(evs) if e["kind"] == "cpu.compute.start")
    raw = [e for e in evs[s:] if e["kind"] == "cpu.node" and e["node_n"] == i]
    assert raw, f"no cpu.node event for {name}"
    assert sorted(x["ith"] for x in lanes) == sorted(e["ith"] for e in raw) == list(range(ex.step.n_threads))
    for e in raw:
        x = next(x for x in lanes if x["ith"] == e["ith"])
        assert x["t1"] - x["t0"] == pytest.approx((e["t_end"] - e["t_start"]) / 1e3)
    # the spans lie inside the compute, in node order on each thread
    assert all(0 <= x["t0"] <= x["t1"] for x in lanes)


def test_a_view_has_no_lane(ex):
    i = next(k for k, t in enumerate(ex.gf.nodes) if t.view_src is not None)
    st = ex.select(i).state()
    assert st["lanes"] == [] and st["bytes"]["view_of"] == ex.gf.nodes[i].view_src.name


@pytest.mark.parametrize("name", NODES)
def test_cause_follows_the_scheduler(ex, name):
    i = _node(ex, name)
    t = ex.step.graph.gf.nodes[i]                              # the live tensor: the scheduler's own answer
    c = ex.select(name).state()["cause"]
    assert c["backend"] == B.backend_name(S.backend_sched_get_tensor_backend(ex.sched, t))
    assert c["cause"] == S.backend_sched_get_tensor_cause(ex.sched, t)
    last = [e for e in ex.step.events if e["kind"] == "sched.assign" and e["addr"] == t.addr][-1]
    assert (c["cause"], c["backend"]) == (last["cause"], last["backend"])
    split = ex.sched.last_plan["splits"][c["split"]]
    assert split["i_start"] <= i < split["i_end"]
    assert c["why"]                                             # every cause code is explained


def test_graph_highlight_and_css(ex):
    i = _node(ex, "kq-3")
    st = ex.select("kq-3").state()
    vert = st["graph_highlight"]
    # the highlighted vertex of the explorer's SVG is the one drawn for this node (its label names it)
    gid = (ex.graph.prefix + vert).replace("-", "&#45;")           # Graphviz writes "-" in ids as &#45;
    m = re.search(r'<g id="' + re.escape(gid) + r'" class="node">(.*?)</g>', ex._gsvg, re.S)
    assert m and f"node {i}: kq&#45;3 (MUL_MAT)" in m.group(1)
    d = json.loads(ex.nodes_json())[f"n{i}"]                  # what the browser builds its CSS from
    b = st["bytes"]
    assert (d["v"], d["item"], d["sh"]) == (vert, b["item"], [o["id"] for o in b["sharers"]])
    # its sources: kq = mul_mat(k, q): the vertices drawn for the tensors in src[]
    t = ex.gf.nodes[i]
    names = {v: n for v, n in zip(ex._ginfo["vertex_of_node"], ex.node_names)}
    names.update(zip(ex._ginfo["vertex_of_leaf"], ex.leaf_names))
    assert [names[v] for v in d["src"]] == [s.name for s in t.src if s is not None]
    css = ex.css_for("node", i)                                 # the same rules, written in Python (static view)
    assert f"#{ex.graph.prefix}{vert} path" in css
    assert f"#{ex.prefix}m{b['item']} {{ stroke: #d50000" in css and f"#{ex.prefix}b{b['item']}" in css
    assert all(f"#{ex.prefix}m{o['id']}" in css for o in b["sharers"])
    assert f".{ex.prefix}s{i} " in css
    # the pictures carry those ids / classes: the slot, its band, one lane span per thread
    mem, lanes = ex.mem_svg(), ex.lanes_svg()
    assert f'id="{ex.prefix}m{b["item"]}"' in mem and f'id="{ex.prefix}b{b["item"]}"' in mem
    assert lanes.count(f'class="{ex.prefix}s{i} ') == ex.step.n_threads
    memz = ex.mem_svg(prefix=ex.prefix + "z", zoom=True)
    assert memz.count("<rect id=") == mem.count("<rect id=")         # the zoomed copy: the same slots and bands
    assert d["t"] == [min(x["t0"] for x in st["lanes"]), max(x["t1"] for x in st["lanes"])]


def test_values(ex, model):
    st = ex.select("embd").state()
    emb = ggml.get_data_f32(model.tok_embd).reshape(model.hparams.n_vocab, -1)[ex.step.token]
    v = ex.values[_node(ex, "embd")].reshape(-1)
    np.testing.assert_array_equal(v, emb)                       # GET_ROWS: the token's row, dequantized
    assert st["values"]["n"] == emb.size
    logits = ex.step.ctx.get_logits_ith(-1)
    out = ex.values[_node(ex, "result_output")].reshape(-1)
    assert int(np.argmax(out)) == int(np.argmax(logits)) == ex.sampled
    np.testing.assert_allclose(out, logits, rtol=0, atol=1e-4)


def test_leaf_and_phase(ex):
    st = ex.select("inp_pos").state()                           # a name that is a leaf
    assert st["selected"]["kind"] == "leaf" and st["lanes"] == []
    j = [t.name for t in ex.gf.leafs].index("inp_pos")
    assert st["graph_highlight"] == ex._ginfo["vertex_of_leaf"][j]
    assert st["cause"]["cause"] == "1.inp" and st["bytes"]["planned"]
    ex.select_phase("logits")
    assert ex.state()["selected"]["name"] == "result_output" and ex.state()["phase"] == "logits"
    t = ex.gf.nodes[ex.select_phase("process_ubatch").index]
    assert ggml.op_desc(t) == "SET_ROWS" and "cache_k" in t.name
    st = ex.select_phase("sched_alloc").state()
    i = st["selected"]["index"]
    rec = [r for r in ex.sched.galloc.last_alloc["tensors"] if r["alloc_node"] == i and r["name"] == ex.gf.nodes[i].name]
    assert rec[0]["reused_from"] is not None                    # gallocr put it in place over a parent
    st = ex.select_phase("compute").state()
    assert st["selected"]["op"] == "MUL_MAT" and len(st["lanes"]) == ex.step.n_threads
    ph = ex.phases()
    assert [p["key"] for p in ph] == [p[0] for p in PHASES]
    comp = next(p for p in ph if p["key"] == "compute")
    tl = ex.step.timeline.last
    assert comp["ms"] == pytest.approx((tl["t_end"] - tl["t_start"]) / 1e6)
    alloc = [e for e in ex.step.events if e["kind"] == "sched.alloc"][-1]
    split = [e for e in ex.step.events if e["kind"] == "sched.compute_split"][0]
    assert next(p for p in ph if p["key"] == "set_inputs")["ms"] == pytest.approx((split["t_start"] - alloc["t"]) / 1e6)


def test_bad_selection_leaves_state(ex):
    ex.select("kq-3")
    before = ex.state()["selected"]
    with pytest.raises(KeyError, match="no node named 'nope'"):
        ex.select("nope")
    with pytest.raises(IndexError, match="out of range"):
        ex.select(10 ** 6)
    with pytest.raises(KeyError, match="no phase"):
        ex.select_phase("nope")
    assert ex.state()["selected"] == before


def test_static_and_live(ex):
    ex.select("kq-3")
    html = ex.to_html()
    assert "kq-3" in html and "llama_sampler_sample" in html and "<svg" in html
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and bundle["text/html"].count("<svg") >= 3
    pane = ex._pane
    assert pane.selected == f"n{_node(ex, 'kq-3')}"
    ex.select("ffn_out-7")                                      # Python -> browser
    assert pane.selected == f"n{_node(ex, 'ffn_out-7')}"
    pane.selected = f"n{_node(ex, 'l_out-0')}"                  # browser -> Python: the values pane follows
    assert ex.state()["selected"]["name"] == "l_out-0"
    assert "l_out-0" in ex._pane.values_html
    # the book's recording: the live pane's traits, and one values pane per node and leaf -- what values_html shows
    # for that selection (small) -- so the static page's panes follow every selection the live one can make
    rec = ex.book_view()
    table = rec["tables"][0]
    assert rec["esm"] == "explorer.js" and rec["css"] == "explorer.css" and table["on"] == "selected"
    assert rec["state"]["nodes"] == pane.nodes and rec["state"]["graph_svg"] == pane.graph_svg
    assert len(table["values"]) == ex.n_nodes + ex.gf.n_leafs and ex.state()["selected"]["name"] == "l_out-0"
    for name in ("kq-3", "inp_pos"):
        kind = "leaf" if name == "inp_pos" else "node"
        ex.select(name, kind=kind)
        key = pane.selected
        assert table["values"][key] == ex.values_html(small=True) and name in table["values"][key]


def test_cli_explore_user_errors():
    """`ggviz explore` with a bad port or thread count: a two-line error, exit status 2, no traceback."""
    root = Path(__file__).resolve().parents[1]
    for args, word in ((["--port", "0"], "port"), (["-t", "0"], "threads")):
        r = subprocess.run([sys.executable, "-m", "ggviz", "explore", *args], cwd=root, capture_output=True,
                           text=True, timeout=60)
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) <= 2 and "Traceback" not in r.stderr, r.stderr
        assert word in err[0] or word.rstrip("s") in err[0], err


def test_lanes_say_which_path(ex):
    start = [e for e in ex.step.events if e["kind"] == "cpu.compute.start"][-1]
    assert ex.compiled == bool(start.get("compiled"))
    assert ("compiled path" in ex.lanes_note()) == ex.compiled and html.escape(ex.lanes_note()) in ex.to_html()


def test_the_plan_is_the_reserves(ex):
    """No re-plan during the step: every slot has the size the last reserve (a worst-case ubatch) gave it."""
    assert not any(e["kind"] == "alloc.reserve" for e in ex.step.events)
    n = ex.step.ctx.reserve_log[-1]["n_tokens"]
    assert ex.plan_tokens == n and f"{n} tokens" in ex.plan_note
    t = ex.gf.nodes[_node(ex, "kq-3")]                         # [n_kv, n_tokens, n_head]: one token here
    lo, hi = ex.select("kq-3").state()["bytes"]["slot"]
    assert hi - lo == ggml.nbytes(t) * n


def test_without_values_or_selection(ex):
    bare = DecodeExplorer(ex.step)                              # the same recorded step, no values pane data
    assert bare.state()["selected"] is None
    html = bare.to_html()                                       # nothing selected: the spine and the pictures
    assert "nothing selected" in html and "llama_decode" in html
    bare.select("kq-3")
    assert bare.state()["values"] is None and "no values recorded" in bare.values_html()
    assert bare.state()["bytes"] == ex.select("kq-3").state()["bytes"]


def test_input_leaf_values(ex):
    """The step's inputs, as set_inputs wrote them: this token at its position, the mask letting it see cells 0..pos."""
    assert ex.select("inp_tokens").state()["values"]["first"] == [float(ex.step.token)]
    assert ex.select("inp_pos").state()["values"]["first"] == [float(ex.step.pos)]
    m = ex.leaf_values[ex.leaf_names.index("attn_inp_kq_mask")].reshape(-1)
    assert np.all(m[:ex.step.pos + 1] == 0) and np.all(np.isneginf(m[ex.step.pos + 1:]))
    assert "inp_pos" in ex.select("inp_pos").values_html()
    assert "no values shown" in ex.select("token_embd.weight").values_html()


def _ids_in_order(text: str) -> str:
    """``text`` with every view's SVG id prefix (``ggv<N>``) renumbered by first appearance: each view numbers its
    ids, so two views of the same step differ only there."""
    seen: dict = {}
    return re.sub(r"ggv(\d+)", lambda m: f"ggv#{seen.setdefault(m.group(1), len(seen))}", text)


def test_a_recording_from_disk_draws_the_same(ex, tmp_path):
    """The step's record saved and loaded back (no model, no engine object in it): the same pages, tables and
    pictures, selection by selection."""
    back = DecodeExplorer(capture.load(capture.save(ex.record, tmp_path / "step.npz")))
    ref = DecodeExplorer(ex.record)                             # the record in memory, nothing selected yet
    assert back.step is None and back.sched is None and isinstance(back.gf, capture.RecordedGraph)
    assert _ids_in_order(back.nodes_json()) == _ids_in_order(ex.nodes_json()) and back.phases() == ex.phases()
    for what, kind in ((None, None), ("kq-3", "node"), ("inp_pos", "leaf"), (40, "node")):
        if what is not None:
            ref.select(what, kind=kind)
            back.select(what, kind=kind)
            assert back.state() == dict(ex.select(what, kind=kind).state(), phase=None)
        assert back.state() == ref.state()
        assert _ids_in_order(back.to_html()) == _ids_in_order(ref.to_html())
        assert _ids_in_order(back.mem_svg() + back.lanes_svg()) == _ids_in_order(ref.mem_svg() + ref.lanes_svg())


def test_sample_phase_shows_the_sampler_chain_and_the_reused_step(ex):
    """The "sample" phase opens the sampler chain run on this step's logits (SamplerView's grid and a stage table),
    not just the last node; the spine's second times are the next step's, which reused the graph."""
    h = ex.chain_history
    assert [x["step"] for x in h] == ["logits", "top-k", "top-p", "min-p", "temp", "dist"]
    assert h[0]["top"][0][0] == ex.sampled                  # the best logit is the greedy pick the recording made
    assert h[-1]["selected"] == ex.chain_token and h[1]["n"] == 40
    ph = {p["key"]: p for p in ex.phases()}
    assert "data:image/png;base64," in ph["sample"]["html"] and "<table" in ph["sample"]["html"]
    assert all(not p["html"] for k, p in ph.items() if k != "sample")
    assert f"token {ex.chain_token}" in ph["sample"]["text"]
    assert ph["sample"]["html"] in ex.select_phase("sample").to_html()
    # the next token's step: the graph reused (llama.cpp's can_reuse), so nothing was built or allocated
    r = ex.reused
    assert r is not None and r["reused"] and "build_graph" not in r["ms"] and r["ms"]["compute"] > 0
    assert ph["compute"]["ms_next"] == pytest.approx(r["ms"]["compute"]) and ph["build_graph"]["ms_next"] == 0.0
    assert "reused the graph" in ex.timing_note()


def test_a_one_token_prompt_shows_the_reused_split(model):
    """A one-token prompt gives the recorded step the prompt's shapes: llama.cpp reuses the graph (no new split, no
    sched.* event of the step). The explorer shows the split the step computed with -- checked against the
    scheduler's own splits and node backends -- and says it was reused (it used to raise "no sched.pass event")."""
    ex1 = DecodeExplorer.record("Hi", threads=1, model=model, values=False)
    assert len(ex1.step.prompt_ids) == 1
    assert any(e["kind"] == "llama.graph_reuse" for e in ex1.record.events)
    assert not any(e["kind"] == "sched.pass" for e in ex1.record.events)
    sched = ex1.sched
    assert ex1.record.sched.reused and ex1.sv.reused and ex1.sv.state()["reused"]
    assert [(s["i_start"], s["i_end"], s["backend_id"]) for s in ex1.sv.splits] == [
        (sp.i_start, sp.i_end, sp.backend_id) for sp in sched.splits[:sched.n_splits]]
    names = [B.backend_name(b) for b in sched.backends]
    assert [names[b] for b in ex1.sv.snapshots["5"]["backend"]] == [
        B.backend_name(S.backend_sched_get_tensor_backend(sched, t)) for t in ex1.gf.nodes]
    text = next(p["text"] for p in ex1.phases() if p["key"] == "sched_alloc")
    assert "reused the previous decode's graph" in text and "reused the previous decode's graph" in ex1.sv.info_html()


def test_lanes_window_stays_inside_the_compute(ex):
    # hand-checked: a short node mid-compute gets 150 µs each side; a long node at the end is shifted left, not
    # clipped at 0 and stretched past the end (what CI saw for result_output on a busy machine)
    assert lanes_window(500.0, 510.0, 2000.0) == (350.0, 310.0)
    assert lanes_window(1000.0, 1100.0, 2000.0) == (700.0, 700.0)
    assert lanes_window(1800.0, 1900.0, 2000.0) == (1300.0, 700.0)      # 3x each side would end at 2200
    assert lanes_window(1000.0, 1300.0, 2000.0) == (0.0, 2000.0)        # wider than the compute: all of it
    assert lanes_window(0.0, 10.0, 2000.0) == (0.0, 310.0)
    # the static page draws that window for the last node
    last = ex.n_nodes - 1
    ex.select(last)
    lanes = ex.lanes_of(last)
    t_end = float(re.search(r'data-t-end="([0-9.]+)"', ex.lanes_svg()).group(1))
    x, w = lanes_window(min(s["t0"] for s in lanes), max(s["t1"] for s in lanes), t_end)
    assert f'viewBox="{x:.3f} 0 {w:.3f} ' in ex.to_html() and x + w <= t_end + 1e-3
