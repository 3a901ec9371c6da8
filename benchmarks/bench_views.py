"""How long does the Graph DAG view take to draw the decode graph?  Collapsed, fully expanded, and the old way.

    python benchmarks/bench_views.py [--runs 5] [--no-old] [--n-kv 256]

The graph is the one ``llama_decode`` builds for one token of the default model (SmolLM2-135M: 1086 nodes,
~340 leafs, ``ggviz.capture.decode_graph``). Each render is what a ``GraphView`` does before it can show the
picture -- build the Graphviz graph from ``gf``, lay it out, and have the SVG text in hand -- timed on a fresh
view (no cache):

* **collapsed** -- every layer folded into one box (``GraphView(gf)``, the default): ``dot`` on ~70 vertices;
* **expanded** -- every layer open (``GraphView.expand_all()``): 1086 node boxes + the leafs, laid out per layer by
  ``ggviz.viz.graph_dot.layered_layout`` (one ``dot`` run for the few distinct layer structures, the copies
  stacked, the picture drawn by ``neato -n2``);
* **expanded, old** -- the same picture laid out by ``dot`` as a whole (``layout="dot"`` with the settings the
  widget used: ``nslimit=2, nslimit1=2, mclimit=0.2``), which is what the view did before; timed once (15-20 s).

Reported: median and min over ``--runs`` renders, and the ratio old / new. The issue's target: the full decode DAG
in <= 3 s. Benchmarks print; they do not assert.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _render(gf, expanded: bool, layout: str = "auto"):
    from ggviz.viz import graph_dot as G
    from ggviz.viz.widgets import GraphView

    t0 = time.perf_counter()
    if layout == "auto":
        gv = GraphView(gf)
        if expanded:
            gv.expand_all()
        svg, info = gv.layout()
    else:                                     # the old path: dot on the whole picture, the widget's settings
        from ggviz.viz.widgets.graph import _FAST
        dot, info = G.graph_to_dot_grouped(gf, collapse=(), layout="dot", id_prefix="old-")
        dot.graph_attr.update(_FAST)
        svg = dot.pipe(format="svg").decode("utf-8")
    dt = time.perf_counter() - t0
    return dt, svg, info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="renders per mode (default 5)")
    ap.add_argument("--no-old", action="store_true", help="skip the old whole-graph dot layout (15-20 s)")
    ap.add_argument("--n-kv", type=int, default=256, help="attended KV cells of the decode graph (default 256)")
    a = ap.parse_args(argv)

    from ggviz.capture import decode_graph

    t0 = time.perf_counter()
    gf = decode_graph(n_kv=a.n_kv).gf
    print(f"decode graph: {gf.n_nodes} nodes, {gf.n_leafs} leafs (built in {time.perf_counter() - t0:.2f} s)")

    res = {}
    for name, expanded in (("collapsed", False), ("expanded", True)):
        _render(gf, expanded)                                     # warm-up (imports, first dot start)
        ts, info = [], None
        for _ in range(a.runs):
            dt, svg, info = _render(gf, expanded)
            ts.append(dt)
        res[name] = ts
        extra = (f", layout={info['layout']}, {info.get('bands', '-')} bands from {info.get('templates', '-')} "
                 f"dot layouts" if expanded else "")
        print(f"{name:>10}: median {statistics.median(ts) * 1e3:7.0f} ms  min {min(ts) * 1e3:7.0f} ms  "
              f"({info['n_nodes_drawn']} node vertices, {info['n_leafs_drawn']} leafs, {info['n_edges']} edges, "
              f"SVG {len(svg) / 1e6:.1f} MB{extra})")
    if not a.no_old:
        dt, svg, info = _render(gf, True, layout="dot")
        new = statistics.median(res["expanded"])
        print(f"{'old full':>10}: {dt * 1e3:7.0f} ms (once; dot on the whole graph, {info['n_edges']} edges, "
              f"SVG {len(svg) / 1e6:.1f} MB) -> the layered layout is {dt / new:.0f}x faster (median)")
    print(f"target: full decode DAG <= 3 s -> expanded median {statistics.median(res['expanded']):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
