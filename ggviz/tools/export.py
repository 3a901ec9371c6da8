"""Files out of a real run: the decode graph as DOT/SVG/PNG, one decode compute as a Chrome trace.

    ggviz graph [--layer N | --full] [--format dot|svg|png] [-o FILE]
    ggviz trace [-o trace.json] [-t THREADS] [-p PROMPT]

``ggviz graph`` builds (without computing) the graph llama.cpp's ``llama_decode`` builds for one new token of the
default model -- ``llm_build_llama`` through ``llama_context::build_graph``, 1086 nodes for SmolLM2-135M -- and
draws it with ``ggviz.viz.graph_dot``: by default every layer folded into one box, ``--layer N`` with layer N opened
up, ``--full`` every node (a very tall picture, laid out layer by layer by ``graph_dot.layered_layout``: under a
second, where Graphviz's ``dot`` on the whole graph needs 15-20 s; its DOT file carries every position and renders
with ``neato -n2``). svg/png need Graphviz's ``dot`` program; ``--format dot`` needs nothing but Python (without
Graphviz, ``--full`` writes the DOT source without positions).

``ggviz trace`` decodes the prompt, then one more token under ``ggviz.trace.ComputeTimeline`` and writes the
Chrome trace-event JSON of that one ``ggml_graph_compute``: per thread, a span per node (``cpu.node``), the
mul_mat chunks it claimed (``cpu.chunk``) and its waits in ``ggml_barrier`` (``cpu.barrier``). Open it in
https://ui.perfetto.dev or chrome://tracing.

The run behind both is recorded by ``ggviz.capture`` (``decode_graph``, ``decode_step``); ``graph_dot`` and
``chrome_trace`` turn it into files, and are used by the notebooks as well.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import graphviz

from .. import cli
from ..capture import DEFAULT_PROMPT, DecodeStep, decode_graph, decode_step
from ..run import load_model
from ..viz import graph_dot as G


# ====================================================================================================================
# the decode graph
# ====================================================================================================================

def graph_dot(gf, layer: int | None = None, full: bool = False, title: str | None = None, legend: bool = True):
    """A ``graphviz.Digraph`` of ``gf``: layers folded into boxes, except ``layer`` (or all of them, ``full``)."""

    layers = sorted({il for il in G.node_layers(gf) if il is not None})
    if full:
        collapse = ()
    elif layer is not None:
        if layer not in layers:
            raise ValueError(f"layer {layer} is not in the graph (layers {layers[0]}..{layers[-1]})")
        collapse = [il for il in layers if il != layer]
    else:
        collapse = "all"
    if title is None:
        what = "every node" if full else (f"layer {layer} expanded" if layer is not None else "one box per layer")
        title = f"llama_decode graph, one token: {gf.n_nodes} nodes, {gf.n_leafs} leafs ({what})"
    dot, info = G.graph_to_dot_grouped(gf, collapse=collapse, title=title, legend=legend)
    if full and info["layout"] == "dot":
        # (only without the layered layout, e.g. no layer names) ~1400 vertices and long edges from shared inputs
        # (inp_pos feeds 60 ROPEs): with its default effort dot needs many minutes; fewer crossing-minimisation /
        # network-simplex iterations and straight edges: 15-20 s
        dot.graph_attr.update(mclimit="0.3", nslimit="1", nslimit1="1", splines="line")
    return dot


def write_graph(path, gf, fmt: str | None = None, layer: int | None = None, full: bool = False) -> pathlib.Path:
    """Write ``gf`` as DOT source, SVG or PNG (``fmt``; default from the file's extension, else svg)."""
    path = pathlib.Path(path)
    if fmt is None:
        fmt = path.suffix.lstrip(".").lower() if path.suffix.lstrip(".").lower() in ("dot", "gv", "svg", "png") \
            else "svg"
    fmt = "dot" if fmt == "gv" else fmt
    if fmt not in ("dot", "svg", "png"):
        raise ValueError(f"unknown format {fmt!r} (dot, svg or png)")
    dot = graph_dot(gf, layer=layer, full=full)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "dot":
        path.write_text(dot.source, encoding="utf-8")
    else:
        path.write_bytes(dot.pipe(format=fmt))
    return path


# ====================================================================================================================
# Chrome trace-event JSON
# ====================================================================================================================

def chrome_trace(step_or_events, which: int = -1) -> dict:
    """The Chrome trace-event JSON (a dict) of one recorded graph compute (``which``: -1 = the last).

    Takes a ``DecodeStep``, a ``trace.ComputeTimeline`` or a list of trace events. Uses
    ``ComputeTimeline.to_chrome_trace`` when there is one; otherwise builds the same kind of file from the raw
    ``cpu.node`` / ``cpu.chunk`` / ``cpu.barrier`` events."""
    tl = getattr(step_or_events, "timeline", None) if isinstance(step_or_events, DecodeStep) else step_or_events
    if tl is not None and hasattr(tl, "to_chrome_trace"):
        n = len(tl.computes)
        if n == 0:
            raise ValueError("no graph compute was recorded")
        return tl.to_chrome_trace(which % n)
    events = step_or_events.events if isinstance(step_or_events, DecodeStep) else list(
        getattr(step_or_events, "events", step_or_events))
    return chrome_trace_from_events(events, which)


def chrome_trace_from_events(events, which: int = -1) -> dict:
    """Chrome trace-event JSON from raw events (the fallback of ``chrome_trace``): complete events ("X") per
    thread for node spans, chunk claims and barrier waits, in µs from the compute's start."""
    starts = [k for k, e in enumerate(events) if e["kind"] == "cpu.compute.start"]
    if not starts:
        raise ValueError("no cpu.compute.start event recorded")
    s = starts[which]
    end = next((k for k in range(s + 1, len(events)) if events[k]["kind"] == "cpu.compute.end"), len(events))
    t0 = events[s]["t"]
    us = 1e-3
    out, tids = [], {0}
    for e in events[s + 1:end]:
        k = e["kind"]
        if k == "cpu.node" and e.get("t_start"):
            tids.add(e["ith"])
            out.append({"ph": "X", "name": e["name"] or f"node_{e['node_n']}", "cat": "node", "pid": 0,
                        "tid": e["ith"], "ts": (e["t_start"] - t0) * us, "dur": (e["t_end"] - e["t_start"]) * us,
                        "args": {"node_n": e["node_n"], "op": e["op"]}})
        elif k == "cpu.barrier" and e.get("t_enter"):
            tids.add(e["ith"])
            out.append({"ph": "X", "name": "barrier", "cat": "barrier", "pid": 0, "tid": e["ith"],
                        "ts": (e["t_enter"] - t0) * us, "dur": (e["t_exit"] - e["t_enter"]) * us,
                        "args": {"where": e.get("where")}})
        elif k == "cpu.chunk":
            tids.add(e["ith"])
            a, b = e.get("t_start", e["t"]), e.get("t_end", e["t"])
            out.append({"ph": "X", "name": f"chunk {e['chunk']}", "cat": "chunk", "pid": 0, "tid": e["ith"],
                        "ts": (a - t0) * us, "dur": max(b - a, 0) * us,
                        "args": {"node": e["node"], "ir0": list(e["ir0"]), "ir1": list(e["ir1"])}})
    meta = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "ggml threadpool"}}]
    for tid in sorted(tids):
        meta.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": f"ggml-cpu-{tid}"}})
    return {"traceEvents": meta + sorted(out, key=lambda x: (x["tid"], x["ts"], -x["dur"])), "displayTimeUnit": "ms"}


# ====================================================================================================================
# command lines
# ====================================================================================================================

def _model(path):
    return load_model(path)


def graph_main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="ggviz graph", description="draw the decode graph of the default model "
                            "(one token): one box per layer, one layer opened up, or every node")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--layer", type=int, default=None, help="open up this layer (others stay folded)")
    g.add_argument("--full", action="store_true", help="draw every node (a very tall picture, laid out layer by layer)")
    ap.add_argument("--format", choices=("dot", "svg", "png"), default=None,
                    help="output format (default: from the file extension, else svg)")
    ap.add_argument("-o", "--out", default=None,
                    help="output file (default: decode_graph.<format>; missing folders are created)")
    ap.add_argument("-m", "--model", default=None, type=cli.model_file,
                    help=cli.MODEL_HELP)
    ap.add_argument("--n-kv", type=cli.int_arg(1), default=256,
                    help="attended KV cells (default 256, one padded block)")
    a = ap.parse_args(argv)
    fmt = a.format or (pathlib.Path(a.out).suffix.lstrip(".").lower() if a.out else "svg")
    if fmt not in ("dot", "svg", "png"):
        fmt = "svg"
    out = pathlib.Path(a.out or f"decode_graph.{fmt}")
    try:                                    # before the model loads: a path that cannot be written fails now
        cli.output_file(str(out))
    except argparse.ArgumentTypeError as e:
        ap.error(f"argument -o/--out: {e}")
    res = decode_graph(_model(a.model), a.n_kv)
    try:
        write_graph(out, res.gf, fmt, layer=a.layer, full=a.full)
    except ValueError as e:
        print(f"ggviz graph: {e}", file=sys.stderr)
        return 2
    # graphviz's dot missing (ExecutableNotFound), failing (CalledProcessError), not runnable or the file not writable
    except (graphviz.ExecutableNotFound, graphviz.CalledProcessError, OSError) as e:
        print(f"ggviz graph: cannot render {fmt} ({type(e).__name__}: {e}); --format dot needs no Graphviz",
              file=sys.stderr)
        return 1
    print(f"{out}  ({res.gf.n_nodes} nodes, {res.gf.n_leafs} leafs, {fmt})")
    return 0


def trace_main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="ggviz trace", description="Chrome trace-event JSON of one decode compute "
                            "(per-thread node spans, mul_mat chunks, barrier waits); open it in "
                            "ui.perfetto.dev or chrome://tracing")
    ap.add_argument("-o", "--out", default="trace.json", type=cli.output_file,
                    help="output file (default: trace.json; missing folders are created)")
    ap.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help="prompt decoded before the traced step")
    ap.add_argument("-t", "--threads", type=cli.thread_count, default=2, help="threads (default 2)")
    ap.add_argument("-m", "--model", default=None, type=cli.model_file,
                    help=cli.MODEL_HELP)
    a = ap.parse_args(argv)
    step = decode_step(a.prompt, a.threads, _model(a.model))
    doc = chrome_trace(step)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc), encoding="utf-8")
    ev = doc["traceEvents"]
    cats = {}
    for e in ev:
        if e["ph"] == "X":
            cats[e.get("cat")] = cats.get(e.get("cat"), 0) + 1
    print(f"{out}  ({len(ev)} events: " + ", ".join(f"{n} {c}" for c, n in sorted(cats.items()))
          + f"; {a.threads} threads, {step.t_decode_ms:.0f} ms decode) -- open it in https://ui.perfetto.dev")
    return 0
