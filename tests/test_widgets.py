"""ggviz.viz.widgets and ggviz.viz.model_views, headless: what each view shows equals what the engine holds.

One real decode of the default model (trace events, inputs, sampler) and one step-through decode are shared by the
tests; every check compares a view's plain state with the engine's own objects or with an independent recording.
"""
import json
import re

import numpy as np
import pytest

from ggviz import capture, ggml, llama, trace
from ggviz.ggml import memory, quants
from ggviz.viz import model_views as MV
from ggviz.viz import graph_dot as G
from ggviz.capture import layer_of
from ggviz.viz.widgets import (ArenaWidget, DecodeStepper, GGUFMapWidget, GraphView, QuantBlockExplorer,
                               TensorExplorer, ThreadTimeline, VisitAnimation)
from ggviz.viz.widgets._base import chart_with_cursor, fig_to_png, frames_book, svg_window
from ggviz.viz.widgets.graph import node_buffers

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model():
    from ggviz.run import load_model
    from ggviz.viz.widgets.stepper import faithful_model_params

    kw = {"use_extra_bufts": False} if hasattr(faithful_model_params(), "use_extra_bufts") else {}
    return load_model(**kw)


@pytest.fixture(scope="module")
def fast_model():
    """The default model with its weights repacked (CPU_REPACK, as ggviz.run.load_model() and notebook 07 load it):
    a decode with the eval callback asking for nodes runs its segments on the compiled kernels (~4x faster than the
    faithful NumPy kernels of ``model``), for the tests whose subject is not the kernels."""
    from ggviz.run import load_model
    return load_model()


@pytest.fixture(scope="module")
def fast_stepper(fast_model):
    return DecodeStepper(PROMPT, model=fast_model)


@pytest.fixture(scope="module")
def run(model):
    """One decode of the prompt on 2 threads, recording every trace event and the graph inputs, then a sample."""
    cp = llama.context_default_params()
    cp.n_ctx = 256
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED     # the views below show KQ -> SOFT_MAX -> KQV
    ctx = llama.init_from_model(model, cp)
    ids = llama.tokenize(model.vocab, PROMPT, add_special=True, parse_special=True)
    with trace.Recorder() as rec, capture.capture_inputs(ctx) as snaps:
        assert llama.decode(ctx, llama.batch_get_one(ids)) == 0
    chain = llama.sampler_chain_init()
    for s in (llama.sampler_init_top_k(40), llama.sampler_init_top_p(0.95, 1), llama.sampler_init_min_p(0.05, 1),
              llama.sampler_init_temp(0.8), llama.sampler_init_dist(1234)):
        llama.sampler_chain_add(chain, s)
    tok = llama.sampler_sample(chain, ctx, -1)
    return {"ctx": ctx, "rec": rec, "snaps": snaps, "gf": ctx.last_graph.gf, "ids": ids, "chain": chain, "tok": tok}


@pytest.fixture(scope="module")
def stepper(model):
    seen = []

    def extra(t, ask):
        if not ask:
            seen.append((t.name, ggml.get_data_f32(t)))
        return True

    ds = DecodeStepper(PROMPT, model=model, extra_cb=extra)
    ds.seen = seen
    return ds


def _png_ok(fig):
    png = fig_to_png(fig, dpi=40)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


# ------------------------------------------------------------------------------------------------------------ GGUF

def test_gguf_map_covers_the_file_and_selects_a_tensor(model):
    gf = model.gguf
    w = GGUFMapWidget(gf)
    st = w.state()
    regs = st["regions"]
    assert regs[0]["start"] == 0 and regs[-1]["end"] == gf.file_size
    assert all(a["end"] == b["start"] for a, b in zip(regs, regs[1:]))
    assert {r["kind"] for r in regs} >= {"header", "kv", "tensor_info", "tensor_data"}
    assert sum(s["size"] for s in st["sections"]) == gf.file_size

    w.select("blk.0.attn_q.weight")
    sel = w.state()["selected"]
    ti = gf.tensor("blk.0.attn_q.weight")
    assert (sel["name"], sel["ne"], sel["offset"], sel["file_offset"], sel["nbytes"]) == \
        (ti.name, list(ti.ne), ti.offset, ti.file_offset, ti.nbytes)
    lay = sel["layout"]
    assert lay["offset_aligned"] and ti.offset % gf.alignment == 0
    assert lay["n_blocks"] * lay["type_size"] == ti.nbytes and lay["blck_size"] == 32
    rec = {r["field"]: r["value"] for r in sel["info_record"]}           # decoded again from the file's bytes
    assert rec["name.data"] == ti.name and rec["n_dims"] == len(ti.ne) and rec["type"] == ti.type
    assert [rec[f"ne[{d}]"] for d in range(len(ti.ne))] == list(ti.ne) and rec["offset"] == ti.offset
    fb = sel["first_block"]
    raw = gf.tensor_data(ti.name)[:lay["type_size"]]
    assert np.array_equal(np.asarray(fb["values"], dtype=np.float32), quants.dequantize_row(ti.type, raw))
    # a click on the tensor's data range selects the same tensor; KV and header selections decode their bytes
    k = next(i for i, r in enumerate(w.layout) if r["kind"] == "tensor_data" and r["name"] == "output_norm.weight")
    assert w.select_range(k).state()["selected"]["name"] == "output_norm.weight"
    w.select("kv:llama.block_count")
    assert w.state()["selected"]["value"] == repr(gf.kv["llama.block_count"])
    hdr = {f["field"]: f["value"] for f in w.select("header").state()["selected"]["fields"]}
    assert hdr == {"magic": "GGUF", "version": gf.version, "n_tensors": gf.n_tensors, "n_kv": gf.n_kv}
    w.select("blk.0.attn_q.weight")
    svg = w.svg()
    assert svg.startswith("<svg") and f'id="{w.prefix}r{k}"' in svg
    w.widget._repr_mimebundle_ if hasattr(w.widget, "_repr_mimebundle_") else None
    assert w._w_pick.value == "blk.0.attn_q.weight"


def test_gguf_book_map_shows_the_selected_label(model):
    """The book draws the map once, with nothing selected; the selection's red labels (the live map's, same text)
    are in it hidden, and each frame's CSS shows its own selection's labels only (they were never drawn)."""
    w = GGUFMapWidget(model.gguf, selected="blk.0.attn_q.weight")
    rec = w.book_view()
    fr, other = _frame(rec, "blk.0.attn_q.weight"), _frame(rec, "output_norm.weight")
    assert fr["picture"] == other["picture"]                            # drawn once
    svg, live = fr["picture"], w.svg()
    mine = [i for i, r in enumerate(w.layout) if r.get("name") == "blk.0.attn_q.weight"]
    assert [w.layout[i]["kind"] for i in mine] == ["tensor_info", "tensor_data"]
    for i in mine:
        g = svg.index(f'id="{w.prefix}lab{i}"')
        text = re.search(r"<text[^>]*>([^<]*)</text>", svg[g:]).group(1)
        assert text.startswith("blk.0.attn_q.weight (") and f">{text}</text>" in live      # the live map's label
        assert f"#{w.prefix}lab{i}," in fr["css"] and f"#{w.prefix}lab{i}," not in other["css"]
    assert f"[id^='{w.prefix}lab'] {{ display: none; }}" in fr["css"]


# ----------------------------------------------------------------------------------------------------------- arena

def _small_ctx():
    ctx = ggml.init(1 << 18)
    a = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 6, 4), "a")
    ggml.get_data(a)[...] = np.arange(24, dtype=np.float32).reshape(4, 6)
    b = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 6, 4), "b")
    ggml.get_data(b)[...] = 1.0
    p = ggml.set_name(ggml.permute(ctx, a, 1, 0, 2, 3), "a_T")
    v = ggml.set_name(ggml.view_2d(ctx, a, 3, 2, a.nb[1], 8), "a_view")
    s = ggml.add(ctx, a, b)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, s)
    ggml.graph_compute_with_ctx(ctx, gf, 1)
    return ctx, dict(a=a, b=b, p=p, v=v, s=s, gf=gf)


def test_arena_widget_decodes_the_selected_header():
    ctx, t = _small_ctx()
    w = ArenaWidget(ctx)
    for name in ("a", "a_view", "a_T"):
        sel = w.select(name).state()["selected"]
        tt = {"a": t["a"], "a_view": t["v"], "a_T": t["p"]}[name]
        s = tt.struct()
        assert sel["struct"] == s
        hdr = {r["field"]: r["value"] for r in sel["header"]}       # unpacked from the arena's bytes
        assert hdr["type"] == s["type"] and hdr["op"] == s["op"] and hdr["name"] == s["name"]
        assert [hdr[f"ne[{i}]"] for i in range(4)] == s["ne"] and [hdr[f"nb[{i}]"] for i in range(4)] == s["nb"]
        assert hdr["data"] == s["data"] and hdr["view_src"] == s["view_src"] and hdr["view_offs"] == s["view_offs"]
        assert [hdr[f"src[{i}]"] for i in range(10)] == s["src"]
        oh = sel["object"]
        o = ctx.objects[sel["index"]]
        assert (oh["offs"], oh["size"], oh["type_name"]) == (o.offs, o.size, "tensor")
    assert w.select("a").state()["selected"]["values"][:6] == [0, 1, 2, 3, 4, 5]
    g = w.select(t["gf"]).state()["selected"]
    assert g["kind"] == "graph" and g["graph"]["n_nodes"] == t["gf"].n_nodes
    # the widget: picking from the dropdown selects; the map's patches carry clickable ids
    w.widget
    w._w_pick.value = 1
    assert w.sel == 1
    svg = w.svg()
    assert svg.startswith("<svg") and f'id="{w.prefix}o1r' in svg
    assert "struct ggml_tensor" in w.to_html()


def _frame(rec, key: str) -> dict:
    """What book_model.js sets when a frames.js view's key becomes ``key``: each table's value for it."""
    out = {}
    for t in rec["tables"]:
        assert t["on"] == "key"
        i = t["pick"].get(key)
        out[t["set"]] = t["values"][i] if i is not None else t.get("missing")
    return out


def test_arena_book_records_every_object():
    """The book's arena: the map once, every object's decoded header recorded, its regions outlined by CSS, and a
    click on any region of the map picks its object."""
    ctx, t = _small_ctx()
    w = ArenaWidget(ctx).select("a_T")
    rec = w.book_view()
    assert rec["esm"] == "frames.js" and w.sel == 2 and rec["state"]["key"] == "2"
    pictures = {_frame(rec, str(i))["picture"] for i in range(len(ctx.objects))}
    assert len(pictures) == 1 and len(rec["tables"][0]["values"]) == 1          # stored once
    for i in range(len(ctx.objects)):
        fr = _frame(rec, str(i))
        assert f"struct ggml_object #{i} " in fr["info"] and f"[id^='{w.prefix}o{i}r']" in fr["css"]
    svg = pictures.pop()
    clickmap = json.loads(rec["state"]["clickmap"])
    assert clickmap and all(f'id="{w.prefix}{k}"' in svg for k in clickmap)
    assert {clickmap[k] for k in clickmap} == set(range(len(ctx.objects)))


def test_frames_book_stores_each_part_once():
    seen = []
    rec = frames_book([{"name": "n", "kind": "range", "min": 0, "max": 3, "value": 2}], [(i,) for i in range(4)],
                      lambda k: seen.append(k) or {"picture": "P", "cursor": [{"l": k[0]}], "info": f"node {k[0]}"})
    assert seen == [(0,), (1,), (2,), (3,)]
    assert rec["state"]["info"] == "node 2" and rec["state"]["picture"] == "P"
    assert _frame(rec, "3") == {"picture": "P", "cursor": '[{"l":3}]', "css": "", "info": "node 3", "detail": ""}
    assert [len(t["values"]) for t in rec["tables"]] == [1, 4, 1, 4, 1]
    assert "not recorded" in _frame(rec, "9")["info"]


def test_chart_cursor_lands_on_the_drawn_span():
    """chart_with_cursor's boxes are where matplotlib drew: a red span over x in [3, 5] found in the PNG."""
    import base64
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    fig, (ax, axb) = plt.subplots(2, 1, figsize=(6, 3), sharex=True)
    ax.set_xlim(0, 10)
    ax.set_title("a title that widens the tight box")
    ax.axvspan(3, 5, color="#ff0000")
    axb.plot([0, 10], [0, 1])
    axb.set_xlabel("x")
    img, box = chart_with_cursor(fig, ax, axb)
    png = base64.b64decode(img.split("base64,", 1)[1].split("'", 1)[0])
    a = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    red = (a[..., 0] > 240) & (a[..., 1] < 20) & (a[..., 2] < 20)
    cols, rows = np.nonzero(red.any(axis=0))[0], np.nonzero(red.any(axis=1))[0]
    b = box(3, 5)
    H, W = a.shape[:2]
    assert abs(b["l"] / 100 * W - cols[0]) <= 1.5 and abs((b["l"] + b["w"]) / 100 * W - cols[-1] - 1) <= 1.5
    assert abs(b["t"] / 100 * H - rows[0]) <= 1.5              # from the top of ax ...
    assert (b["t"] + b["h"]) / 100 * H > rows[-1] + 20          # ... to the bottom of axb, below it
    r = box(3, 5, 0.2, 0.4, axb)
    assert r["t"] > b["t"] + (rows[-1] - rows[0]) / H * 100 and r["h"] < b["h"] / 4


# ---------------------------------------------------------------------------------------------------------- tensor

def test_tensor_explorer_offsets_and_shared_bytes():
    ctx, t = _small_ctx()
    a, v, p = t["a"], t["v"], t["p"]
    te = TensorExplorer(v, views=[p])
    st = te.select(2, 1).state()
    assert st["offset"] == 2 * 4 + 1 * 24 and st["source_offset"] == 8 + st["offset"]
    assert st["value"] == float(ggml.get_data(v)[0, 0, 1, 2]) == 10.0
    assert st["bytes"] == np.float32(10.0).tobytes().hex(" ")
    mask = te.touched()
    assert mask.sum() == st["n_touched_bytes"] == ggml.nelements(v) * 4
    # the touched bytes hold exactly the view's values
    assert sorted(np.frombuffer(bytes(ggml.get_data(a).view(np.uint8).reshape(-1)[mask]), np.float32)) == \
        sorted(ggml.get_data(v).reshape(-1).tolist())
    st = te.show(p).select(1, 3).state()
    assert st["name"] == "a_T" and st["is_view"] and not st["contiguous"]
    assert st["offset"] == 1 * p.nb[0] + 3 * p.nb[1] and st["value"] == float(ggml.get_data(a)[0, 0, 1, 3])
    assert st["n_touched_bytes"] == ggml.nbytes(a)
    with pytest.raises(IndexError):
        te.select(4, 0)
    # the book's recording: every index of each tensor, each frame the state's own numbers, the state kept
    te.show(v).select(1, 1)
    rec = te.book_view()
    assert (te.cur, te.index) == (1, [1, 1, 0, 0]) and rec["state"]["key"] == "1,1,1"
    assert len(rec["tables"][3]["pick"]) == ggml.nelements(v) + ggml.nelements(p) + ggml.nelements(a)
    ctrl = json.loads(rec["state"]["controls"])
    assert [c["name"] for c in ctrl] == ["tensor", "i0", "i1"] and ctrl[1]["max"] == {"0": 5, "1": 2, "2": 3}
    fr = _frame(rec, "2,1,3")                                  # a_T[1, 3] = a[i0=3, i1=1] = 9
    want = te.show(p).select(1, 3).state()
    assert want["formula"] in fr["info"] and f"at source byte {want['source_offset']}" in fr["picture"]
    red = fr["picture"].split("outline:3px")[1:]              # the red cells: in the index grid, in the memory grid
    assert want["value"] == 9.0 and len(red) == 2 and all(">9<" in x[:45] or ">9<br/>" in x[:45] for x in red)
    te.widget
    te._w_idx[0].value = 2                       # the slider drives the state
    assert te.index[0] == 2
    _png_ok(te.figure())


def test_quant_block_explorer_equals_dequantization(model):
    t = model.tensors["blk.0.attn_q.weight"]                   # Q4_1 in the file
    q = QuantBlockExplorer(t, row=3, block=2)
    st = q.state()
    assert st["type"] == "q4_1" and not st["requantized"]
    full = ggml.get_data_f32(t)
    assert np.array_equal(np.asarray(st["values"], np.float32), full[0, 0, 3, 64:96])
    raw = np.asarray(ggml.get_data(t)[0, 0, 3, 2 * 20:3 * 20])
    assert st["bytes"] == raw.tolist() and st["fields"]["d"] == float(quants.decode_block(t.type, raw)["d"])
    e = QuantBlockExplorer(model.tensors["token_embd.weight"], row=7042, block=3)     # Q8_0 in the file
    es = e.state()
    row = quants.dequantize_row(ggml.GGML_TYPE_Q8_0, np.ascontiguousarray(ggml.get_data(e.t)[0, 0, 7042]))
    assert es["type"] == "q8_0" and np.array_equal(np.asarray(es["values"], np.float32), row[96:128])
    # formats the file lacks: the same real row, re-quantized by ggml's reference quantizer
    d = QuantBlockExplorer(model.tensors["blk.0.ffn_down.weight"], row=5, block=1)
    src = d._row_floats(5)
    for ty in (ggml.GGML_TYPE_Q4_0, ggml.GGML_TYPE_Q8_0, ggml.GGML_TYPE_Q4_K, ggml.GGML_TYPE_Q6_K):
        s = d.set_type(ty).state()
        assert s["requantized"]
        qrow = quants.quantize_row_ref(ty, src).reshape(-1)
        ts, bs = ggml.type_size(ty), ggml.blck_size(ty)
        assert s["bytes"] == qrow[ts:2 * ts].tolist()
        assert np.array_equal(np.asarray(s["values"], np.float32), quants.dequantize_row(ty, qrow)[bs:2 * bs])
        assert np.array_equal(np.asarray(s["source_values"], np.float32), src[bs:2 * bs])
    assert "sub_d" in s and len(s["sub_d"]) == 16                 # Q6_K: 16 sub-blocks of 16
    with pytest.raises(ValueError, match="multiple"):
        q.set_type(ggml.GGML_TYPE_Q4_K)                           # rows of 576 hold no 256-blocks
    assert [ggml.type_name(x) for x in q.compatible_types()] == ["q4_0", "q4_1", "q8_0"]
    _png_ok(d.figure())


# ----------------------------------------------------------------------------------------------------------- graph

def test_graph_view_collapses_layers(run):
    gf = run["gf"]
    assert gf.n_nodes == 1086
    gv = GraphView(gf)
    st = gv.state()
    # what keeps the full decode DAG quick to show: graphviz lays out only the collapsed picture (a vertex per drawn
    # node, leaf and layer box, not 1086 nodes), once -- asking again re-uses that layout
    svg = gv.svg()
    assert svg.count('class="node"') == st["n_nodes_drawn"] + st["n_leafs_drawn"] == 34 + 5
    assert len(gv._cache) == 1 and gv.layout() is gv.layout()
    boxes = st["boxes"]
    # 36 nodes per layer; the last layer also holds llama.cpp's two unnamed get_rows by inp_out_ids (node_1073/4)
    assert sorted(boxes) == list(range(30)) and boxes == {il: 36 if il < 29 else 38 for il in range(30)}
    assert st["n_nodes_drawn"] == gf.n_nodes - sum(boxes.values()) + len(boxes) == 1086 - 1082 + 30
    # every node in a box carries that layer in its name, but those two
    layers = [layer_of(t.name) for t in gf.nodes]
    assert all(layers.count(il) == 36 for il in boxes)
    extra = [i for i, t in enumerate(gf.nodes) if layers[i] is None and G.node_layers(gf)[i] == 29]
    assert [gf.nodes[i].name for i in extra] == ["node_1073", "node_1074"]
    assert all(gf.nodes[i].op == ggml.GGML_OP_GET_ROWS and gf.nodes[i].src[1].name == "out_ids" for i in extra)
    svg = gv.svg()
    assert svg.startswith("<svg") and f'id="{gv.prefix}L3"' in svg.replace("&#45;", "-")
    # a click on a box opens it; selecting a node opens its layer and outlines it
    gv.click("L3")
    st = gv.state()
    assert st["open"] == [3] and st["n_nodes_drawn"] == 1086 - (28 * 36 + 38) + 29
    i = [t.name for t in gf.nodes].index("kq_soft_max-7")
    gv.select(i)
    st = gv.state()
    assert st["selected"]["name"] == "kq_soft_max-7" and st["selected"]["op"] == "SOFT_MAX"
    assert 7 in st["open"] and st["selected"]["vertex"] == f"n{i}"
    assert f"#{gv.prefix}n{i} path" in gv.css()
    gv.expand(12)
    gv.expand(20)
    assert len(gv.state()["open"]) <= gv.max_open
    # colour by a per-node attribute: here the buffer each node's data lives in
    where = node_buffers(gf)
    assert where == {k: memory.resolve(t.data)[2] for k, t in enumerate(gf.nodes)}
    gv.collapse_all()
    gv.set_color_by(where)
    assert set(gv.state()["colors"]) == {str(x) for x in where.values()}
    dot = gv.dot()
    assert "penwidth" in dot.source
    gv.widget
    assert gv._canvas.svg.startswith("<svg")
    # the book's recording: the picture as it is (layer 0 open, opening on its first node); a click on any drawn node
    # outlines it and shows its table; a collapsed layer's box says that opening it needs a kernel
    gv.collapse_all()
    gv.expand(0)
    gv.selected = None
    rec = gv.book_view()
    css, info = rec["tables"][0]["values"], rec["tables"][1]["values"]
    first = layers.index(0)
    assert rec["esm"] == "svg_canvas.js" and rec["state"]["focus"] == f"{gv.prefix}n{first}" and gv.selected is None
    k = [t.name for t in gf.nodes].index("kq-0")
    assert f"#{gv.prefix}n{k} path" in css[f"n{k}"] and "kq-0" in info[f"n{k}"] and "MUL_MAT" in info[f"n{k}"]
    assert "needs a kernel" in info["L5"] and "L0" not in info
    assert rec["state"]["svg"] == gv.svg()


def test_visit_animation_replays_the_build(run):
    gf, rec = run["gf"], run["rec"]
    va = VisitAnimation(rec, gf)
    evs = [e for e in rec.events if e["kind"] in ("graph.visit", "graph.add") and e["graph"] == ggml.graph_key(gf)]
    assert va.n_steps == len(evs)
    last = va.state(va.n_steps - 1)
    assert last["n_nodes"] == gf.n_nodes and last["n_leafs"] == gf.n_leafs and last["stack"] == []
    assert last["n_hits"] == sum(1 for e in evs if e["kind"] == "graph.visit" and e["hit"])
    adds = [(e["addr"], e["index"]) for e in evs if e["kind"] == "graph.add" and e["kind_"] == "node"]
    assert adds == [(t.addr, k) for k, t in enumerate(gf.nodes)]      # (names may change after the add)
    k_hit = next(k for k, e in enumerate(evs) if e["kind"] == "graph.visit" and e["hit"])
    st = va.goto(k_hit).state()
    assert st["action"] == "hit" and st["hash_pos"] == evs[k_hit]["hash_pos"]
    # before its add, a visited node is on the DFS stack; after it, in nodes[]
    # nodes[0] is the token embedding lookup: as in llama.cpp, build_inp_embd's ggml_build_forward_select visits it
    # before the graph callback names it "embd", so the DFS names it "node_0" when it is added
    a0 = gf.nodes[0].addr
    k_ins = next(k for k, e in enumerate(evs) if e["kind"] == "graph.visit" and not e["hit"] and e["addr"] == a0)
    k_add = next(k for k, e in enumerate(evs) if e["kind"] == "graph.add" and e["addr"] == a0)
    assert gf.nodes[0].name == "embd"
    assert "embd" in va.state(k_ins)["stack"] and "embd" not in va.state(k_add)["stack"]
    assert va.state(k_add)["text"].endswith("nodes[0] = 'node_0'")
    va.widget
    va.goto(0).step(3)
    assert va.pos == 3 and va._pane.pos == 3 and "opacity" in json.loads(va._pane.frame)["css"]
    va._pane.pos = 5                                          # what the browser does: Python follows
    assert va.pos == 5 and json.loads(va._pane.frame) == va.frame()
    assert "<svg" in va.to_html()
    # the book's recording: one frame per event, each what the live widget shows at that event
    rec = va.book_view()
    frames, pick, svgs = rec["tables"][1]["values"], rec["tables"][0]["pick"], rec["tables"][0]["values"]
    assert rec["esm"] == "stepper.js" and len(frames) == len(pick) == va.n_steps and va.pos == 5
    for k in (0, k_hit, va.n_steps - 1):
        assert json.loads(frames[k]) == va.goto(k).frame() and svgs[pick[k]] == va._pane.svg


# -------------------------------------------------------------------------------------------------------- timeline

def test_thread_timeline_from_recorded_compute(run):
    tl = ThreadTimeline(run["rec"])
    d = tl.data
    assert d["n_threads"] == 2 and d["n_tasks"] is not None and len(d["n_tasks"]) == run["gf"].n_nodes
    for ith in range(2):
        ns = [n for n in d["nodes"] if n["ith"] == ith]
        assert all(a["t1"] <= b["t0"] + 1e-6 for a, b in zip(ns, ns[1:]))        # a thread runs one node at a time
    i = [t.name for t in run["gf"].nodes].index("ffn_gate-0")
    ni = tl.select(i).state()["node"]
    assert ni["name"] == "ffn_gate-0" and ni["op"] == "MUL_MAT" and len(ni["threads"]) == 2
    # the chunks of a mul_mat cover its output (rows ir0 x columns ir1) exactly once
    ch = [c for c in d["chunks"] if c["node_n"] == i]
    cells = sorted((r, c) for x in ch for r in range(*x["ir0"]) for c in range(*x["ir1"]))
    ne = run["gf"].nodes[i].ne
    assert cells == [(r, c) for r in range(int(ne[0])) for c in range(int(ne[1]))]
    assert sum(len(t["chunks"]) for t in ni["threads"]) == ni["n_chunks"] == len(ch)
    assert tl.state()["range"][0] <= i < tl.state()["range"][1]
    tl.widget
    tl._w_node.value = tl.computed[5]
    assert tl.node == tl.computed[5]
    _png_ok(tl.figure())


# ----------------------------------------------------------------------------------------------------- model views

def test_kv_cache_view_and_mask(run, model, tmp_path):
    snaps = run["snaps"]
    assert len(snaps) == 1
    s = snaps[0]
    kv = MV.KVCacheView(snaps, model.vocab)
    st = kv.state()
    n = len(run["ids"])
    assert st["tokens"] == run["ids"] and st["pos"] == list(range(n)) and st["written_cells"] == list(range(n))
    cp = np.asarray(st["cells_pos"])
    allowed = (cp[None, :] >= 0) & (cp[None, :] <= np.asarray(st["pos"])[:, None])
    assert np.array_equal(np.asarray(st["mask_allowed"]), allowed)              # causal mask, as recorded
    assert np.array_equal(run["ctx"].kv.cells.pos[:s.n_kv], s.cells_pos[:s.n_kv])
    _png_ok(kv.figure())
    # the snapshots are a record: saved and loaded back, the view draws the same page
    loaded = capture.load(capture.save(snaps, tmp_path / "snaps.npz"))
    assert MV.KVCacheView(loaded, model.vocab).to_html() == kv.to_html()


def test_sampler_view_is_the_chain_history(run, model):
    sv = MV.SamplerView(run["chain"], model.vocab)
    st = sv.state()
    h = run["chain"].history
    assert st["steps"] == [x["step"] for x in h] == ["logits", "top-k", "top-p", "min-p", "temp", "dist"]
    assert st["n"][0] == model.hparams.n_vocab and st["n"][1] == 40
    assert st["selected"] == run["tok"]
    top0 = h[0]["top"][0][0]
    assert top0 == int(np.argmax(llama.get_logits_ith(run["ctx"], -1)))
    # per stage: the best 20 survivors with logit / p / probability, the counts, the draw of dist
    assert [len(x["cands"]) for x in st["stages"]] == [min(20, n) for n in st["n"]]
    assert st["stages"][0]["cands"][0]["piece"] == MV._piece(model.vocab, top0)
    d = st["stages"][-1]
    assert d["draw"] is not None and d["p_valid"] and d["selected"] == run["tok"]
    if d["draw"]["rank"] < len(d["cands"]):
        assert d["cands"][d["draw"]["rank"]]["id"] == run["tok"]
    assert sum(c["prob"] for c in d["cands"]) <= 1.0 + 1e-9
    _png_ok(sv.figure())
    assert sv.to_html().count("<table") == len(h)


def test_bpe_view(model):
    text = "The tokenizer merges unbelievable words"
    bv = MV.BPEView(model.vocab, text)
    st = bv.state()
    assert st["all_ids"] == llama.tokenize(model.vocab, text, add_special=True, parse_special=True)
    k = next(i for i, u in enumerate(bv.units) if u.text == " unbelievable")
    st = bv.select(k).state()
    assert st["merges"] and st["merges"][-1]["symbols"].split(" ") == [model.vocab.tokens[i] for i in st["ids"]]
    assert [m["rank"] for m in st["merges"]] == [m.rank for m in model.vocab.bpe_trace(" unbelievable")]
    assert "<table" in bv.to_html()


def test_attention_capture_matches_the_stepper(fast_model, fast_stepper, tmp_path):
    model, stepper = fast_model, fast_stepper
    cp = llama.context_default_params()
    cp.n_ctx, cp.flash_attn_type = 256, 0        # the weights are a node (kq_soft_max) only without flash attention
    cp.n_threads = cp.n_threads_batch = 2
    ctx = llama.init_from_model(model, cp)
    rec = capture.capture_attention(ctx, stepper.tokens, layers=[0, 29])
    assert sorted(rec.layers) == [0, 29]
    n = len(stepper.tokens)
    a = rec.layers[0]
    assert a.shape == (model.hparams.n_head, n, 256)
    assert np.allclose(a.sum(axis=-1), 1.0, atol=1e-5) and np.all(np.triu(a[:, :, :n], 1) == 0)
    i = [r["name"] for r in stepper.records].index("kq_soft_max-0")
    assert np.array_equal(stepper.values(i)[0], a)          # two real runs, same inputs: the same weights
    av = MV.AttentionView(rec)
    assert av.select(29, head=2).state()["weights"] == rec.layers[29][2].tolist()
    _png_ok(av.select(0).figure())
    # a record: saved and loaded back, the same page
    loaded = capture.load(capture.save(rec, tmp_path / "attention.npz"))
    assert isinstance(loaded, capture.AttentionRecord) and loaded.pieces == rec.pieces
    assert MV.AttentionView(loaded, 29).to_html() == MV.AttentionView(rec, 29).to_html()


# -------------------------------------------------------------------------------------------------------- stepper

def test_decode_stepper_shows_what_cb_eval_saw(stepper, model):
    ds = stepper
    gf = ds.gf
    assert ds.n_steps == gf.n_nodes == len(ds.seen) == 1086
    for i, (name, vals) in enumerate(ds.seen):
        r = ds.records[i]
        assert r["name"] == name == gf.nodes[i].name
        if r["full"]:
            assert np.array_equal(ds.values(i), vals, equal_nan=True)
        else:
            rows = vals.reshape(-1, vals.shape[-1])
            assert np.array_equal(ds.values(i), rows[:ds.slice_rows, :ds.slice_cols])
            assert r["stats"]["max"] == float(np.max(vals))
    assert np.array_equal(ds.logits, llama.get_logits_ith(ds.ctx, -1))
    assert int(np.argmax(ds.logits)) == 7042                  # " Paris"
    ds.widget
    for i in (0, 1, 37, 131, 132, 133, 600, 1085):
        st = ds.goto(i).state()
        t = gf.nodes[i]
        assert st["index"] == i and st["name"] == t.name and st["op"] == ggml.op_desc(t)
        assert st["open_layers"] == ([] if layer_of(t.name) is None else [layer_of(t.name)])
        assert st["vertex"] == f"n{i}"
        _, off, label = memory.resolve(t.data)
        assert (st["buffer"], st["offset"], st["nbytes"]) == (label, off, ggml.nbytes(t))
        frame = json.loads(ds._pane.frame)
        assert ds._pane.pos == i and frame["focus"].endswith(f"n{i}") and f"n{i} path" in frame["css"]
    for _ in range(40):
        ds.step()
    assert ds.pos == 1085                                     # clipped at the last node
    ds.goto("kq_soft_max-3").back()
    assert ds.state()["name"] == "kq-3"
    print(f"\ndecode stepper: {ds.n_steps} nodes recorded in {ds.decode_s:.1f} s; step (incl. widget refresh): "
          f"median {np.median(ds.step_ms):.1f} ms, max {max(ds.step_ms):.1f} ms")
    # the same bytes serve several nodes: the allocator reuses memory in place
    assert any(q["index"] != ds.pos for q in ds.sharing())
    html = ds.to_html()
    assert "<svg" in html and "kq-3" in html and "data:image/png;base64" in html
    # the browser moves the stepper (the pane's pos): Python follows
    ds._pane.pos = 131
    assert ds.pos == 131 and json.loads(ds._pane.frame)["focus"].endswith("n131")
    # the book's recording: a frame per node (what the live pane shows there, with the small heatmap), the node
    # table the memory bar is drawn from (offsets and sizes as recorded), one picture per open layer
    rec = ds.book_view()
    (svg_t, frame_t), st = rec["tables"], rec["state"]
    assert ds.pos == 131 and len(frame_t["values"]) == ds.n_steps and len(svg_t["values"]) == 31
    table = json.loads(st["nodes"])
    for i in (0, 131, 1085):
        r = ds.records[i]
        name, b, off, n = table["nodes"][i]
        assert (name, off, n) == (r["name"], r["offset"], r["nbytes"])
        assert table["buffers"][b] == {"label": r["buffer"], "size": r["buffer_size"]}
        f = json.loads(frame_t["values"][i])
        assert f["focus"] == ds.view.prefix + f"n{i}" and f"node #{i} / 1085: {r['name']}" in f["panel"]
        assert svg_t["values"][svg_t["pick"][i]] == ds.goto(i).view.svg()


def test_decode_stepper_header_shows_the_given_tokens(fast_model, stepper, tmp_path):
    # the fixture's stepper: from the prompt, which is also what its tokens detokenize to
    assert stepper.text == PROMPT and stepper.prompt == PROMPT and "The capital of France is" in stepper.header_html()
    # only tokens: the header shows them, detokenized (special tokens written out), not the default prompt
    # (3 tokens, on the repacked model: its segments run compiled; the faithful kernels took ~5 s a token)
    ids = [1] + llama.tokenize(fast_model.vocab, "Bonjour", add_special=False, parse_special=False)
    assert len(ids) == 3
    ds = DecodeStepper(tokens=ids, model=fast_model, copy_limit=0, slice_rows=1, slice_cols=4)
    assert ds.tokens == ids and ds.state()["tokens"] == ids
    assert ds.text == ds.prompt == "<|im_start|>Bonjour" == ds.state()["text"]
    head = ds.header_html()
    assert f"decode of {len(ids)} tokens" in head and "Bonjour" in head and "capital" not in head
    assert "tokens: [" + ", ".join(map(str, ids)) + "]" in head
    w = ds.widget                                          # built headless: the pane carries the header
    assert w.header == head
    # its frames (big tensors kept as slices here) and its graph saved to disk and loaded back: the same steps, the
    # same DAG, with no ggml_cgraph
    back = DecodeStepper.from_record(capture.load(capture.save(ds.record, tmp_path / "stepper.npz")))
    assert isinstance(back.gf, capture.RecordedGraph) and back.graph_result is None
    for i in (0, 40, ds.n_steps - 1):                      # (each DAG numbers its SVG ids: the same but for that)
        assert back.goto(i).to_html().replace(back.view.prefix[:-1], ds.view.prefix[:-1]) == ds.goto(i).to_html()
        assert back.state() == ds.state()
    assert back.header_html() == head


def test_svg_window_crops_around_a_node(run):
    gv = GraphView(run["gf"])
    gv.expand(0)
    svg = gv.svg()
    out = svg_window(svg, gv.prefix + "n5", 400, 300)
    assert 'width="400pt" height="300pt"' in out and out != svg
