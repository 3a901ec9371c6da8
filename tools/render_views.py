"""Render the drawing code's outputs into files, to check that a refactor of the views changes no byte of them.

    PYTHONPATH=. python tools/render_views.py OUT_DIR                # render
    PYTHONPATH=. python tools/render_views.py OUT_DIR --against REF  # render, then compare with an earlier render

What it renders (the views issue #19 item 4 split into phases, and the scripts the widgets send to the browser):

* ``graph_dot.graph_to_dot_grouped`` on a small synthetic layered graph and on a SmolLM2 decode graph (and Gemma-3
  270M's when its GGUF is under $GGVIZ_MODELS): the dot source of the layered layout and of dot's own, layers
  collapsed and open, with legend, highlight, hidden leafs; the SVG of ``GraphView`` (the layered layout, drawn by dot);
* ``AllocatorView``: a small ggml_gallocr plan and the SmolLM2 decode plan (PNG, HTML, state), a node range, a selection;
* ``SchedulerView``: the mini model of tests/test_sched.py pass by pass, SmolLM2 with -ngl 10 (PNG, HTML, state);
* ``GGUFView``: the file map of SmolLM2 (PNG), a tensor selected;
* ``DecodeExplorer``: one SmolLM2 decode step (1 thread, a counting clock so the thread lanes are reproducible): its
  static page (``to_html``) with nothing, a node, a leaf and the compute phase selected, its per-node table;
* the anywidget ES modules and stylesheets the live widgets send (the same text the book's pages embed).

Deterministic: matplotlib's SVG hash salt and date are fixed; the compiled fast path is off (GGVIZ_NO_NUMBA=1: its
walk times nodes with a clock inside the compiled code) and ggviz's clocks count (its modules' ``time`` is a
counting clock while the explorer's step is recorded); each part numbers its SVG id prefixes from 1.
``GGVIZ_NO_NUMBA=0 ... --only graphs,alloc,sched,gguf`` renders with the compiled path (CPU_REPACK weights in the
plans) instead. Exit status 1 if ``--against`` finds a difference.
"""
from __future__ import annotations

import argparse
import filecmp
import itertools
import json
import os
import pathlib
import sys
import time

import anywidget
import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "ggviz-render-views"
os.environ.setdefault("SOURCE_DATE_EPOCH", "0")
# the faithful kernels: the compiled walk times its nodes with its own clock, which no Python patch reaches
os.environ.setdefault("GGVIZ_NO_NUMBA", "1")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggviz import ggml as gg  # noqa: E402
from ggviz.ggml import accel  # noqa: E402
from ggviz.ggml import alloc as A, backend as B  # noqa: E402
from ggviz.llama.graph import graph_max_nodes  # noqa: E402
from ggviz.ggml import sched as S  # noqa: E402
from ggviz.ggml.cpu import cpu_backend  # noqa: E402
from ggviz.viz import graph_dot as G  # noqa: E402
from ggviz.viz import widgets  # noqa: E402,F401  (every widget module, for the anywidget classes)
from ggviz.viz.widgets import _base  # noqa: E402
try:                                          # where the capture branch (#19 items 1-2) puts it
    from ggviz.capture.decode import decode_graph  # noqa: E402
except ImportError:
    from ggviz.export import decode_graph  # noqa: E402
from ggviz.run import load_model  # noqa: E402
from ggviz.viz.widgets.alloc_view import AllocatorView  # noqa: E402
from ggviz.viz.widgets.explorer import DecodeExplorer, ExplorerPane  # noqa: E402
from ggviz.viz.widgets.gguf import GGUFMapWidget  # noqa: E402
from ggviz.viz.widgets.graph import GraphView  # noqa: E402
from ggviz.viz.widgets.sched_view import STAGES, SchedulerView  # noqa: E402
import tests.test_machinery_views  # noqa: E402
from tests.test_graph_layout import _layered_graph  # noqa: E402
from tests.test_machinery_views import _load, plan_decode, small_graph  # noqa: E402
from tests.test_sched import _accel, build_mini, place  # noqa: E402

MODELS = pathlib.Path(os.environ.get("GGVIZ_MODELS", ROOT / "data" / "models"))
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = next(iter(sorted(MODELS.glob("gemma-3-270m*.gguf"))), None) if MODELS.exists() else None
tests.test_machinery_views.MODEL = str(SMOL)     # its _load reads the checkout's data/models otherwise


class Out:
    def __init__(self, d: pathlib.Path):
        self.d = d
        d.mkdir(parents=True, exist_ok=True)
        self.n = 0

    def __call__(self, name: str, data):
        if isinstance(data, (dict, list)):
            data = json.dumps(data, indent=1, sort_keys=True, default=repr)
        p = self.d / name
        (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
        self.n += 1


def graphs(out: Out, tag: str, gf):
    """The dot sources of the grouped graph (both layouts, several options) and GraphView's SVG."""
    il = sorted({x for x in G.node_layers(gf) if x is not None})
    opts = {"open": dict(collapse=()), "closed": dict(collapse="all"),
            "mixed": dict(collapse=il[1:], legend=True, highlight=[3, 5]),
            "openlegend": dict(collapse=(), legend=True, highlight=[3, 5], title="a title", id_prefix="q-"),
            "hide": dict(collapse=(), hide_leafs=True, edge_labels=True, color_by="type", id_prefix="p-")}
    for k, kw in opts.items():
        for layout in ("layers", "dot", "auto"):
            if layout == "layers" and kw["collapse"]:
                continue
            dot, info = G.graph_to_dot_grouped(gf, layout=layout, **kw)
            out(f"{tag}_dot_{k}_{layout}.gv", dot.source)
            out(f"{tag}_dot_{k}_{layout}.json", {kk: v for kk, v in info.items()})
    gv = GraphView(gf, max_open=2)
    out(f"{tag}_graphview_collapsed.svg", gv.svg())
    gv.expand_all()
    gv.select(min(7, gf.n_nodes - 1))
    out(f"{tag}_graphview_open.svg", gv.svg())
    out(f"{tag}_graphview_open.html", gv.to_html())


def allocator(out: Out):
    gf, keep = small_graph()
    galloc = A.gallocr_new(B.backend_cpu_buffer_type())
    assert A.gallocr_reserve(galloc, gf) and A.gallocr_alloc_graph(galloc, gf)
    v = AllocatorView(galloc, gf)
    out("alloc_small.png", v.png())
    out("alloc_small.json", v.state())
    v.select("res_T_cont")
    out("alloc_small_sel.html", v.to_html())
    ctx = _load(0, devices=False)
    ctx.sched = S.backend_sched_new(ctx.backends, ctx.backend_buft, len(ctx.backends), graph_max_nodes(ctx.model),
                                    False, True)
    plan_decode(ctx)
    v = AllocatorView(ctx.sched.galloc, ctx.sched.graph)
    out("alloc_decode.png", v.png())
    out("alloc_decode.json", v.state())
    v.select(30)
    out("alloc_decode_sel.html", v.to_html())
    v.set_range(0, 40)
    out("alloc_decode_layer0.png", v.png())
    ctx = _load(10)
    plan_decode(ctx)
    v = AllocatorView(ctx.sched.galloc, ctx.sched.graph)
    out("alloc_two_buffers.png", v.png())
    out("alloc_two_buffers.json", v.state())
    return keep


def scheduler(out: Out):
    dev, acc = _accel(accel.DEFAULT_SUPPORTED_OPS - {gg.GGML_OP_RMS_NORM})
    ns = build_mini()
    for il in range(2):
        place(ns, il, B.backend_dev_buffer_type(dev))
    sched = S.backend_sched_new([acc, cpu_backend.backend_cpu_init()], None, 2, 256, False, True)
    sv = SchedulerView.capture(sched, ns.gf)
    for st in STAGES:
        sv.goto_pass(st)
        out(f"sched_mini_{st}.png", sv.png())
        out(f"sched_mini_{st}.html", sv.to_html())
    sv.select_split(1)
    out("sched_mini_split1.png", sv.png())
    out("sched_mini_split1.json", sv.state())
    for ngl in (0, 10):
        ctx = _load(ngl)
        res, rec = plan_decode(ctx)
        sv = SchedulerView(ctx.sched, res.gf, rec)
        out(f"sched_ngl{ngl}.png", sv.png())
        out(f"sched_ngl{ngl}.json", sv.state())
        sv.select_split(1 if ngl else 0)
        sv.goto_pass("2.2")
        out(f"sched_ngl{ngl}_sel.png", sv.png())
        out(f"sched_ngl{ngl}_sel.html", sv.to_html())


def gguf_map(out: Out):
    v = GGUFMapWidget(str(SMOL))
    out("gguf_map.png", _base.fig_to_png(v.figure()))
    out("gguf_map.svg", v.svg())
    v.select("blk.3.attn_q.weight")
    out("gguf_map_sel.png", _base.fig_to_png(v.figure()))
    out("gguf_map_sel.html", v.to_html())


class _CountingClock:
    """The ``time`` module, except that its performance counters count: each call is 1 us after the one before."""

    def __init__(self):
        self._ticks = itertools.count(1_000_000, 1000)

    def perf_counter_ns(self):
        return next(self._ticks)

    def perf_counter(self):
        return next(self._ticks) / 1e9

    def __getattr__(self, name):
        return getattr(time, name)


def explorer(out: Out):
    # ggviz's modules read a counting clock (only theirs: library code calling time.perf_counter in between would
    # shift the count from run to run)
    clock = _CountingClock()
    patched = [m for name, m in sys.modules.items() if name.startswith("ggviz") and getattr(m, "time", None) is time]
    for m in patched:
        m.time = clock
    try:
        ex = DecodeExplorer.record("The capital of France is", threads=1, model=load_model(str(SMOL)), values=True)
    finally:
        for m in patched:
            m.time = time
    out("explorer_none.html", ex.to_html())
    out("explorer_nodes.json", ex.nodes_json())
    out("explorer_phases.json", ex.phases())
    ex.select(40)
    out("explorer_node40.html", ex.to_html())
    ex.select(2, kind="leaf")
    out("explorer_leaf2.html", ex.to_html())
    ex.select_phase("compute")
    out("explorer_compute.html", ex.to_html())
    out("explorer_mem.svg", ex.mem_svg())
    out("explorer_lanes.svg", ex.lanes_svg())


def scripts(out: Out):
    """The anywidget modules and stylesheets of every live widget (what the book's pages embed)."""
    seen = {}
    for cls in _all_subclasses(anywidget.AnyWidget):
        if cls.__module__.startswith("ggviz."):
            for attr in ("_esm", "_css"):
                v = getattr(cls, attr, None)
                if isinstance(v, str):
                    seen[f"{cls.__module__}.{cls.__qualname__}.{attr}"] = v
    canvas = _base.svg_canvas("<svg/>", prefix="p-", css="#p-n1{}")
    seen["svg_canvas._esm"] = canvas._esm
    pane = ExplorerPane()
    seen["ExplorerPane._esm"], seen["ExplorerPane._css"] = pane._esm, getattr(pane, "_css", "")
    out("scripts.json", seen)


def _all_subclasses(c):
    for s in c.__subclasses__():
        yield s
        yield from _all_subclasses(s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--against", help="an earlier render to compare with (byte for byte)")
    ap.add_argument("--only", default="", help="comma-separated parts (graphs,alloc,sched,gguf,explorer,scripts)")
    a = ap.parse_args(argv)
    out = Out(pathlib.Path(a.out))
    parts = set(a.only.split(",")) if a.only else {"graphs", "alloc", "sched", "gguf", "explorer", "scripts"}
    t0 = time.perf_counter()
    # each part numbers its SVG id prefixes from 1 (``new_prefix``), so a part renders the same whichever ran before
    if "graphs" in parts:
        _base._uid = itertools.count(1)
        graphs(out, "synthetic", _layered_graph())
        for tag, path in (("smollm2", SMOL), ("gemma3", GEMMA)):
            if path is not None and path.exists():
                graphs(out, tag, decode_graph(load_model(str(path))).gf)
    if "alloc" in parts:
        _base._uid = itertools.count(1)
        allocator(out)
    if "sched" in parts:
        _base._uid = itertools.count(1)
        scheduler(out)
    if "gguf" in parts:
        _base._uid = itertools.count(1)
        gguf_map(out)
    if "explorer" in parts:
        _base._uid = itertools.count(1)
        explorer(out)
    if "scripts" in parts:
        _base._uid = itertools.count(1)
        scripts(out)
    print(f"{out.n} files in {a.out} ({time.perf_counter() - t0:.0f} s)")
    if a.against:
        ref = pathlib.Path(a.against)
        names = sorted(p.name for p in out.d.iterdir())
        missing = sorted(p.name for p in ref.iterdir() if not (out.d / p.name).exists())
        diff = [n for n in names if not (ref / n).exists() or not filecmp.cmp(ref / n, out.d / n, shallow=False)]
        for n in diff:
            print(f"DIFFERS: {n}")
        for n in missing:
            print(f"MISSING: {n}")
        print(f"{len(names) - len(diff)} of {len(names)} files identical to {ref}")
        return 1 if diff or missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
