"""One graph compute, thread by thread: which node each thread ran when, its mul_mat chunks, its barrier waits.

Drawn only from recorded events of the CPU backend (``ggml_graph_compute``):

- ``cpu.plan``: n_threads, per-node ``n_tasks`` and the work size;
- ``cpu.compute.start`` / ``cpu.compute.end``: the compute's bounds (events in between belong to it);
- ``cpu.node``: thread ``ith`` ran node ``node_n`` from ``t_start`` to ``t_end`` (every thread calls every
  computed node's kernel; threads with ``ith >= n_tasks`` return at once);
- ``cpu.chunk``: thread ``ith`` computed chunk ``chunk`` of a mul_mat (rows ``ir0`` x columns ``ir1``) from
  ``t_start`` to ``t_end`` (without those fields: from the event time ``t`` to its next chunk or the node's end);
- ``cpu.barrier``: thread ``ith`` waited in ``ggml_barrier`` from ``t_enter`` to ``t_exit`` (after every node).

Which walk recorded it matters for what the picture teaches, so it is labelled: the compiled walk
(``ggviz/ggml/cpu/fast``, ``compiled: True``) runs the threads truly in parallel, as ggml's C does: both threads
compute chunks of the same MUL_MAT at the same time, then meet at the barrier. The node-by-node walk runs NumPy kernels
on Python threads: the GIL serialises everything but NumPy's inner loops (a 2-thread decode there takes ~4 s, half
of it in barriers). ggml's barrier spins on ``n_barrier_passed``; the compiled walk's
spins the same way for ``SPIN_CYCLES`` (~40 µs), then sleeps on a futex (ggviz: for oversubscribed
machines): the figure draws the spin as spin and the rest as sleep. ``thread_accounting`` splits each thread's wall
time into kernel work, barrier waits and time in the pool outside the walk (kickoff, join), so that they add up.
"""
from __future__ import annotations

import os
import textwrap
import time

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from .. import graph_dot as G
from ._base import VizWidget, chart_with_cursor, esc, fig_to_png, frames_book, html_table, png_img, quiet

try:        # the compiled walk's barrier: how long it spins before it sleeps (ticks of the timestamp counter)
    from ...ggml.cpu.fast import kernels as _fast_kernels
    from ...ggml.cpu.fast.program import SPIN_CYCLES
except ImportError:          # no Numba: only the node-by-node walk exists, whose barrier sleeps on a condition
    _fast_kernels, SPIN_CYCLES = None, 0

_SPIN_US: list = []


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width) or [""]


def spin_us() -> float:
    """How long the compiled walk's barrier spins before it sleeps, in µs (SPIN_CYCLES ticks of the timestamp
    counter, measured against perf_counter once per process; 0 without the compiled walk)."""
    if not _SPIN_US:
        if _fast_kernels is None:
            _SPIN_US.append(0.0)
        else:
            _fast_kernels.time_ns()      # the first call loads (or compiles) it: not inside the measured interval
            p0, c0 = time.perf_counter_ns(), _fast_kernels.time_ns()
            while time.perf_counter_ns() - p0 < 2_000_000:       # 2 ms: enough for 3 significant digits
                pass
            p1, c1 = time.perf_counter_ns(), _fast_kernels.time_ns()
            _SPIN_US.append(SPIN_CYCLES * (p1 - p0) / max(c1 - c0, 1) / 1e3)
    return _SPIN_US[0]


WALK_LABEL = {True: "compiled walk: the threads can run at once, as in ggml's C (when the OS gives each a core)",
              False: "node-by-node NumPy walk: Python threads, the GIL serialises all but NumPy's inner loops "
                     "(not how ggml's C runs)"}


def _spin(data: dict) -> float:
    """How long a barrier wait of ``data``'s compute spun before it slept, in µs: the ``spin_us`` recorded with the
    data (a recording drawn in another process draws the machine it was recorded on), else this process's."""
    if not data.get("compiled"):
        return 0.0
    return data["spin_us"] if data.get("spin_us") is not None else spin_us()


def machine_cores() -> int:
    """The cores this process may run on (its affinity mask; what a recording made here could use)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def timeline_data(events, which: int = -1) -> dict:
    """Plain data of one compute (``which``: index among the recorded computes, -1 = the last).

    Times are microseconds from the compute's start. Returns ``n_threads``, ``n_tasks`` (from the plan, if
    recorded), ``nodes`` [{ith, node_n, name, op, t0, t1}], ``chunks`` [{ith, node_n, chunk, t0, t1, ir0, ir1}],
    ``barriers`` [{ith, node_n, t0, t1}] and ``t_end``.
    """
    evs = events.events if hasattr(events, "events") else list(events)
    starts = [k for k, e in enumerate(evs) if e["kind"] == "cpu.compute.start"]
    if not starts:
        raise ValueError("no cpu.compute.start event recorded: record a graph compute with ggviz.trace.Recorder")
    s = starts[which]
    e_end = next((k for k in range(s + 1, len(evs)) if evs[k]["kind"] == "cpu.compute.end"), len(evs))
    start = evs[s]
    plan = next((evs[k] for k in range(s - 1, -1, -1) if evs[k]["kind"] == "cpu.plan"
                 and evs[k].get("graph") == start.get("graph")), None)
    t_base = start["t"]
    us = 1e-3
    nodes, chunks_raw, barriers = [], [], []
    for e in evs[s + 1:e_end]:
        k = e["kind"]
        if k == "cpu.node":
            nodes.append({"ith": e["ith"], "node_n": e["node_n"], "name": e["name"], "op": e["op"],
                          "t0": (e["t_start"] - t_base) * us, "t1": (e["t_end"] - t_base) * us,
                          "fused": bool(e.get("fused"))})
        elif k == "cpu.chunk":
            chunks_raw.append(e)
        elif k == "cpu.barrier":
            barriers.append({"ith": e["ith"], "t0": (e["t_enter"] - t_base) * us, "t1": (e["t_exit"] - t_base) * us,
                             "node_n": e.get("node_n"), "where": e.get("where")})
    n_threads = start.get("n_threads") or (max((n["ith"] for n in nodes), default=0) + 1)
    # per thread, nodes in time order: a chunk belongs to the node running on its thread at its time
    by_thread = {i: sorted([n for n in nodes if n["ith"] == i], key=lambda n: n["t0"]) for i in range(n_threads)}
    t0s = {i: np.array([n["t0"] for n in lst]) for i, lst in by_thread.items()}
    t1s = {i: np.array([n["t1"] for n in lst]) for i, lst in by_thread.items()}
    chunks = []
    for e in chunks_raw:
        # a chunk event with t_start/t_end times itself; one without (emitted as the chunk starts) lasts until
        # that thread's next chunk or the end of its node
        timed = "t_start" in e and "t_end" in e
        t = ((e["t_start"] if timed else e["t"]) - t_base) * us
        lst = by_thread.get(e["ith"], [])
        j = int(np.searchsorted(t0s.get(e["ith"], np.zeros(0)), t, side="right")) - 1
        owner = lst[j] if j >= 0 else None
        t1 = (e["t_end"] - t_base) * us if timed else None
        chunks.append({"ith": e["ith"], "node_n": owner["node_n"] if owner else None, "name": e["node"],
                       "chunk": e["chunk"], "t0": t, "t1": t1, "ir0": tuple(e["ir0"]), "ir1": tuple(e["ir1"])})
    chunks.sort(key=lambda c: (c["ith"], c["t0"]))
    for k, a in enumerate(chunks):
        if a["t1"] is None:
            b = chunks[k + 1] if k + 1 < len(chunks) else None
            if b is not None and b["ith"] == a["ith"] and b["node_n"] == a["node_n"]:
                a["t1"] = b["t0"]
            else:
                own = [n for n in by_thread.get(a["ith"], []) if n["node_n"] == a["node_n"]]
                a["t1"] = own[0]["t1"] if own else a["t0"]
    for b in barriers:
        if b.get("node_n") is not None:          # the engine says which node the barrier follows (or is inside)
            continue
        lst = by_thread.get(b["ith"], [])
        j = int(np.searchsorted(t1s.get(b["ith"], np.zeros(0)), b["t0"] + 1e-9, side="right")) - 1
        b["node_n"] = lst[j]["node_n"] if j >= 0 else None
    t_end = (evs[e_end]["t"] - t_base) * us if e_end < len(evs) else max((n["t1"] for n in nodes), default=0.0)
    compiled = bool(start.get("compiled")) or any(n.get("compiled") for n in evs[s + 1:e_end][:50]
                                                  if n["kind"] == "cpu.node")
    return {"n_threads": int(n_threads), "compiled": compiled, "n_tasks": list(plan["n_tasks"]) if plan else None,
            "work_size": plan["work_size"] if plan else None, "n_nodes": start.get("n_nodes"),
            "nodes": nodes, "chunks": chunks, "barriers": barriers, "t_end": t_end}


def thread_accounting(data: dict) -> list[dict]:
    """Each thread's wall time (the compute's, ``t_end``) split into parts that add up, in µs:

    - ``kernel_us``: inside a node's kernel (node spans, less the barrier a MUL_MAT kernel waits in after converting
      its src1);
    - ``barrier_us``: waiting in ``ggml_barrier`` (``spin_us`` of it spinning on n_barrier_passed, ``sleep_us``
      asleep: only the compiled walk's barrier sleeps, after ~40 µs of spin; the node-by-node walk's waits on a
      condition variable and counts as asleep);
    - ``pool_us``: in the threadpool but outside the walk: before the thread's first node (the kickoff wakes it) and
      after its last node, outside the final barriers (returning from the walk, the main thread joining the workers);
    - ``other_us``: what no record covers: the walk's own loop between a barrier and the next node (well under a
      µs each), or the OS running another process while the thread was between records.

    ``busy_us`` = kernel_us, ``wait_us`` = barrier_us + pool_us; busy + wait + other = wall."""
    wall = float(data["t_end"])
    sp = _spin(data)
    out = []
    for i in range(data["n_threads"]):
        ns = [n for n in data["nodes"] if n["ith"] == i]
        bs = [b for b in data["barriers"] if b["ith"] == i]
        clip = lambda a, b: max(0.0, min(b, wall) - max(a, 0.0))  # noqa: E731 - an interval inside the compute
        node = sum(clip(n["t0"], n["t1"]) for n in ns)
        bar = [clip(b["t0"], b["t1"]) for b in bs]
        inside = sum(w for b, w in zip(bs, bar) if b.get("where") == "kernel")
        spin = sum(min(w, sp) for w in bar)
        if ns:
            # before its first node the thread waits for the kickoff; after its last node it passes the final
            # barriers (counted as barrier time) and otherwise runs the pool's own code (return, join, handing over)
            first, last = min(n["t0"] for n in ns), max(n["t1"] for n in ns)
            tail_bar = sum(clip(max(b["t0"], last), b["t1"]) for b in bs if b["t1"] > last)
            pool = clip(0.0, first) + clip(last, wall) - tail_bar
        else:
            pool = wall - sum(bar)            # a thread that took no part (ith >= the threads the walk used)
        kernel = node - inside
        barrier = sum(bar)
        out.append({"thread": i, "wall_us": wall, "kernel_us": kernel, "barrier_us": barrier, "spin_us": spin,
                    "sleep_us": barrier - spin, "pool_us": pool, "other_us": wall - kernel - barrier - pool,
                    "busy_us": kernel, "wait_us": barrier + pool, "nodes": len(ns), "barriers": len(bs),
                    "chunks": sum(c["ith"] == i for c in data["chunks"])})
    return out


def concurrent_chunks(data: dict) -> dict:
    """node_n -> [(chunk of thread a, chunk of thread b)] for each MUL_MAT whose chunks on two different threads ran
    at the same time (their time spans overlap): the threads worked on the same node together."""
    by: dict = {}
    for c in data["chunks"]:
        by.setdefault(c["node_n"], []).append(c)
    out: dict = {}
    for nn, cs in by.items():
        cs = sorted(cs, key=lambda c: c["t0"])
        pairs = []
        for k, a in enumerate(cs):
            for b in cs[k + 1:]:
                if b["t0"] >= a["t1"]:
                    break
                if b["ith"] != a["ith"] and b["t0"] < b["t1"] and a["t0"] < a["t1"]:
                    pairs.append((a, b))
        if pairs:
            out[nn] = pairs
    return out


# a recording is "clean" when both threads were inside the same MUL_MAT (chunks overlapping in time) for at least this
# share of the MUL_MATs, and no thread started later than LATE_SHARE of the compute's wall time
CLEAN_SHARE = 0.5
LATE_SHARE = 0.05


def disturbance(data: dict) -> dict:
    """How much the machine disturbed this recording, from its own records (µs): per thread the time asleep in
    ``ggml_barrier`` (a thread sleeps there when the other one is late: on a busy machine, because the OS gave its
    core to another process) and how late its first node started after the first thread's; the MUL_MATs whose
    chunks ran on two threads at once (``concurrent_chunks``) out of those with chunks on two threads or more; the
    most lopsided chunk split of a MUL_MAT; the threads that ran no node (``idle``: the compiled walk never runs
    more threads than the process has cores, ``N_CPUS``). ``clean``: both threads inside the same MUL_MAT for at
    least ``CLEAN_SHARE`` of them, no thread more than ``LATE_SHARE`` of the wall time late, every thread at work,
    and no more threads than the cores the recording process had (``data["cores"]`` where the recorder wrote it).
    ``note``: one line that says so in numbers (the figures' titles carry it)."""
    wall = float(data["t_end"]) or 1.0
    nt = int(data["n_threads"])
    acc = thread_accounting(data)
    first = {i: min((n["t0"] for n in data["nodes"] if n["ith"] == i), default=None) for i in range(nt)}
    t_first = min((v for v in first.values() if v is not None), default=0.0)
    ran = [i for i in range(nt) if first[i] is not None] or list(range(nt))
    idle = [i for i in range(nt) if i not in ran]
    late = {i: (first[i] - t_first if first[i] is not None else wall) for i in ran}
    per_mm: dict = {}
    for c in data["chunks"]:
        per_mm.setdefault(c["node_n"], []).append(c["ith"])
    shared = {nn: ths for nn, ths in per_mm.items() if len(set(ths)) > 1}
    n_mm = len(per_mm)
    both = len(concurrent_chunks(data)) if nt > 1 else 0
    worst = None
    for nn, ths in per_mm.items():
        counts = sorted((ths.count(i) for i in ran), reverse=True)
        if len(ths) >= 4 and (worst is None or counts[0] / max(counts[-1], 0.5) > worst[1][0] / max(worst[1][-1], 0.5)):
            worst = (nn, counts)
    sleep = {a["thread"]: a["sleep_us"] for a in acc}
    share = both / n_mm if n_mm else 0.0
    max_late = max(late.values()) if late else 0.0
    cores = data.get("cores")
    over = bool(cores) and nt > cores
    clean = nt < 2 or (share >= CLEAN_SHARE and max_late <= LATE_SHARE * wall and not over and not idle)
    if nt < 2:
        note = f"one thread: nothing ran in parallel ({wall / 1e3:.1f} ms)"
    elif len(ran) < 2:
        note = f"only thread {ran[0]} ran nodes ({wall / 1e3:.1f} ms)"
    else:
        slept = ", ".join(f"thread {i} {sleep[i] / 1e3:.1f} ms" for i in ran)
        lat = max(late, key=late.get)
        who = "both threads" if len(ran) == 2 else "two threads or more"
        note = (f"{who} inside the same MUL_MAT for {both} of {n_mm} MUL_MATs; asleep in barriers: {slept} "
                f"of {wall / 1e3:.1f} ms; thread {lat} started {late[lat] / 1e3:.1f} ms after the first")
    if len(ran) >= 2:
        if over and not idle:
            note = (f"MORE THREADS THAN CORES ({nt} threads, {cores} cores: the threads took turns on the cores): "
                    + note)
        elif not (share >= CLEAN_SHARE and max_late <= LATE_SHARE * wall):
            note = ("BUSY MACHINE (another process held a core, so the threads took turns): " + note
                    + (f"; the most lopsided MUL_MAT split its chunks {':'.join(map(str, worst[1]))}"
                       if worst is not None else ""))
    if idle:           # said first: the picture has fewer working threads than its title's count
        names = ", ".join(map(str, idle))
        note = (f"ONLY {len(ran)} OF {nt} THREADS WORKED: thread{'s' if len(idle) > 1 else ''} {names} ran no node"
                + ((" (ggviz's compiled walk runs at most as many threads as the process has cores"
                    + (f", {cores} here" if cores else "") + f"; ggml's C would run all {nt}, taking turns on the "
                    f"cores)") if data.get("compiled") else "") + ": " + note)
    return {"n_threads": nt, "wall_us": wall, "n_mul_mat": n_mm, "n_shared": len(shared), "n_both": both,
            "both_share": share, "late_us": late, "idle": idle, "sleep_us": sleep, "worst_split": worst,
            "clean": bool(clean), "note": note}


def cleanest(record, tries: int = 3, events=lambda r: r.events):
    """Call ``record()`` (it returns a recording whose ``events(r)`` hold a graph compute) up to ``tries`` times and
    keep the cleanest: the first one ``disturbance`` calls clean, else the one with the largest share of MUL_MATs run
    by both threads at once. Returns (recording, timeline_data of it, disturbance of it, [each try's both_share])."""
    best, shares = None, []
    for _ in range(max(1, int(tries))):
        r = record()
        d = timeline_data(events(r))
        q = disturbance(d)
        shares.append(round(q["both_share"], 3))
        if best is None or (q["clean"], q["both_share"]) > (best[2]["clean"], best[2]["both_share"]):
            best = (r, d, q)
        if q["clean"]:
            break
    return best + (shares,)


def plot_timeline(data: dict, node_range=None, highlight: int | None = None, ax=None, title: str | None = None):
    """Gantt chart: one row per thread; node bars coloured by op (labelled when wide enough), mul_mat chunks as
    ticks under them, barrier waits hatched grey. ``node_range=(a, b)``: only nodes a..b-1 (and the time they
    span). Returns the Figure."""

    nodes = data["nodes"]
    if node_range is not None:
        a, b = node_range
        nodes = [n for n in nodes if a <= n["node_n"] < b]
    if not nodes:
        raise ValueError("no computed node in that range")
    t_lo = min(n["t0"] for n in nodes)
    t_hi = max(n["t1"] for n in nodes)
    sel = {n["node_n"] for n in nodes}
    chunks = [c for c in data["chunks"] if c["node_n"] in sel]
    barriers = [b for b in data["barriers"] if b["t1"] >= t_lo and b["t0"] <= t_hi]
    nt = data["n_threads"]
    if ax is None:
        fig, ax = plt.subplots(figsize=(13, 1.2 + 1.0 * nt))
    else:
        fig = ax.figure
    H = 0.55
    ops_seen: dict = {}
    span = t_hi - t_lo or 1.0
    minw = span * 1e-4
    # one broken_barh per (thread, colour): thousands of spans draw fast as a few collections
    groups: dict = {}
    for n in nodes:
        c = G.op_color(n["op"])
        ops_seen[n["op"]] = c
        groups.setdefault((n["ith"], c), []).append((n["t0"], max(n["t1"] - n["t0"], minw)))
    for (ith, c), xr in groups.items():
        ax.broken_barh(xr, (ith - H / 2, H), facecolors=c, edgecolors="#424242", linewidth=0.4, zorder=2)
    for n in nodes:
        w = max(n["t1"] - n["t0"], minw)
        if highlight is not None and n["node_n"] == highlight:
            ax.add_patch(Rectangle((n["t0"], n["ith"] - H / 2), w, H, facecolor="none", edgecolor="#d50000",
                                   linewidth=2.5, zorder=3))
        label = f"#{n['node_n']} {n['name']}"
        if w > span * 0.0062 * (len(label) + 1):          # ~ the text's width at 7.5 pt on a 10-inch axis
            ax.text(n["t0"] + w / 2, n["ith"] + 0.02, label, ha="center", va="center", fontsize=7.5, clip_on=True,
                    zorder=4)
    cg: dict = {}
    for c in chunks:
        shade = "#1565c0" if c["chunk"] % 2 == 0 else "#64b5f6"
        cg.setdefault((c["ith"], shade), []).append((c["t0"], max(c["t1"] - c["t0"], minw)))
    for (ith, shade), xr in cg.items():
        ax.broken_barh(xr, (ith - H / 2 - 0.13, 0.11), facecolors=shade, edgecolors="none", zorder=2)
    # a barrier wait: spinning on n_barrier_passed (as ggml's barrier always does) for up to spin_us(), then
    # asleep (the compiled walk's futex; the node-by-node walk's condition variable sleeps from the start)
    sp = _spin(data)
    bspin: dict = {}
    bsleep: dict = {}
    for b in barriers:
        t0, t1 = max(b["t0"], t_lo), min(b["t1"], t_hi)
        ts = min(t1, b["t0"] + sp)
        if ts > t0:
            bspin.setdefault(b["ith"], []).append((t0, max(ts - t0, minw)))
        if t1 > ts:
            bsleep.setdefault(b["ith"], []).append((max(ts, t0), max(t1 - max(ts, t0), minw)))
    for ith, xr in bspin.items():
        ax.broken_barh(xr, (ith + H / 2 + 0.03, 0.12), facecolors="#ff8f00", edgecolors="#e65100", hatch="xxxx",
                       linewidth=0.3, zorder=2)
    for ith, xr in bsleep.items():
        ax.broken_barh(xr, (ith + H / 2 + 0.03, 0.12), facecolors="#cfd8dc", edgecolors="#90a4ae", linewidth=0.3,
                       zorder=2)
    if highlight is not None:
        hn = [n for n in nodes if n["node_n"] == highlight]
        if hn:
            ax.axvspan(min(n["t0"] for n in hn), max(n["t1"] for n in hn), color="#ffcdd2", alpha=0.35, zorder=0)
    ax.set_xlim(t_lo - span * 0.01, t_hi + span * 0.01)
    ax.set_ylim(nt - 0.35, -0.65)
    ax.set_yticks(range(nt))
    ax.set_yticklabels([f"thread {i}" for i in range(nt)], fontsize=10)
    ax.set_xlabel("time since ggml_graph_compute started (µs)", fontsize=10)
    ax.tick_params(axis="x", labelsize=9)
    handles = [Patch(facecolor=c, edgecolor="#424242", label=op) for op, c in ops_seen.items()]
    handles += [Patch(facecolor="#1565c0", label="mul_mat chunk (alternating shades)")]
    if sp:
        handles.append(Patch(facecolor="#ff8f00", hatch="xxxx", edgecolor="#e65100",
                             label=f"ggml_barrier: spinning on n_barrier_passed (first {sp:.0f} µs)"))
    handles.append(Patch(facecolor="#cfd8dc", edgecolor="#90a4ae",
                         label="ggml_barrier: asleep (ggviz's futex; ggml keeps spinning)" if sp
                         else "ggml_barrier: asleep on a condition variable"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    rng = f"nodes {min(sel)}–{max(sel)}" if node_range is not None else f"all {len(sel)} computed nodes"
    walk = WALK_LABEL[bool(data.get("compiled"))]
    q = disturbance(data)
    # what the machine did to this recording, in numbers, on the figure itself (red when it was busy)
    note = "\n".join(_wrap(q["note"], 140))
    ax.set_title((title or f"graph compute on {nt} threads, {rng}\n{walk}") + "\nthis recording: " + note,
                 fontsize=10, color="#212121" if q["clean"] else "#c62828")
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    fig.tight_layout()
    return fig


class ThreadTimeline(VizWidget):
    """Per-thread Gantt of one recorded graph compute; a node slider highlights one node and lists its chunks.

    ``others``: the same graph computed on other thread counts ({n_threads: events}, e.g. the same decode step
    recorded on 1, 3 and 4 threads): a thread-count control picks the recording shown (``select_threads``); each
    says under its title how the machine treated it. ``cores``: the cores the recording process could use
    (``machine_cores()`` where this process just recorded; None: not known), so a recording on more threads than
    cores says so."""

    def __init__(self, events, which: int = -1, window: int = 40, spin: float | None = None, others=None,
                 cores: int | None = None):
        self.runs = {}
        for want, ev in [(None, events), *dict(others or {}).items()]:
            d = timeline_data(ev, which)
            if want is not None and int(want) != d["n_threads"]:
                raise ValueError(f"others[{want}]: that recording ran on {d['n_threads']} threads, not {want}")
            d["spin_us"] = spin                     # None: this process's spin_us() (a recording: its own)
            d["cores"] = cores
            if not d["nodes"]:
                raise ValueError("the recorded compute ran no node")
            if d["n_threads"] in self.runs:
                raise ValueError(f"two recordings on {d['n_threads']} threads: give one per thread count")
            self.runs[d["n_threads"]] = d
        self.window = window
        self.threads = None
        self.node = None
        self._use(next(iter(self.runs)))
        self.node = self.computed[0]
        self.range = (self.computed[0], self.computed[min(len(self.computed), window) - 1] + 1)

    def _use(self, n_threads: int):
        self.threads = int(n_threads)
        self.data = self.runs[self.threads]
        self.computed = sorted({n["node_n"] for n in self.data["nodes"]})

    def select_threads(self, n_threads: int):
        """Show the recording on ``n_threads`` threads (one of ``others``), at the same node."""
        if int(n_threads) not in self.runs:
            raise ValueError(f"no recording on {n_threads} threads (recorded: {sorted(self.runs)})")
        self._use(n_threads)
        return self.select(self.node)

    def select(self, node_n: int):
        """Highlight node ``node_n`` (the window moves to contain it)."""
        node_n = int(node_n)
        if node_n not in self.computed:
            later = [x for x in self.computed if x >= node_n]
            node_n = later[0] if later else self.computed[-1]
        self.node = node_n
        a, b = self.range
        if not a <= node_n < b:
            k = self.computed.index(node_n)
            lo = max(0, k - self.window // 4)
            hi = min(len(self.computed), lo + self.window)
            self.range = (self.computed[lo], self.computed[hi - 1] + 1)
        self._changed()
        return self

    def set_range(self, a: int, b: int):
        self.range = (int(a), int(b))
        self._changed()

    def node_info(self, node_n: int | None = None) -> dict:
        n = self.node if node_n is None else node_n
        runs = [x for x in self.data["nodes"] if x["node_n"] == n]
        ch = [c for c in self.data["chunks"] if c["node_n"] == n]
        bar = [b for b in self.data["barriers"] if b["node_n"] == n]
        per = []
        for r in sorted(runs, key=lambda r: r["ith"]):
            mine = [c for c in ch if c["ith"] == r["ith"]]
            wait = [b for b in bar if b["ith"] == r["ith"]]
            per.append({"thread": r["ith"], "start_us": round(r["t0"], 1), "time_us": round(r["t1"] - r["t0"], 1),
                        "chunks": [c["chunk"] for c in mine],
                        "rows": [f"{c['ir0'][0]}-{c['ir0'][1]}" for c in mine],
                        "barrier_wait_us": round(sum(b["t1"] - b["t0"] for b in wait), 1)})
        return {"node_n": n, "name": runs[0]["name"] if runs else None, "op": runs[0]["op"] if runs else None,
                "n_tasks": self.data["n_tasks"][n] if self.data["n_tasks"] else None, "threads": per,
                "n_chunks": len(ch)}

    def state(self) -> dict:
        d = self.data
        return {"n_threads": d["n_threads"], "recorded_threads": sorted(self.runs), "n_computed": len(self.computed),
                "range": self.range,
                "node": self.node_info(), "total_us": d["t_end"],
                "barrier_wait_us": {i: sum(b["t1"] - b["t0"] for b in d["barriers"] if b["ith"] == i)
                                    for i in range(d["n_threads"])},
                "n_chunks": len(d["chunks"]), "compiled": d["compiled"], "walk": WALK_LABEL[d["compiled"]],
                "accounting": thread_accounting(d), "concurrent_mul_mats": len(concurrent_chunks(d))}

    def accounting_html(self) -> str:
        """Per thread: where its wall time went (the parts add up to the compute's wall time)."""
        d = self.data
        rows = [{"thread": a["thread"], "in kernels (µs)": round(a["kernel_us"]),
                 "barrier: spinning (µs)": round(a["spin_us"]), "barrier: asleep (µs)": round(a["sleep_us"]),
                 "pool: kickoff/join (µs)": round(a["pool_us"]), "unrecorded (µs)": round(a["other_us"]),
                 "wall (µs)": round(a["wall_us"]), "chunks claimed": a["chunks"]} for a in thread_accounting(d)]
        cc = concurrent_chunks(d)
        n_mm = len({c["node_n"] for c in d["chunks"]})
        q = disturbance(d)
        head = (f"<p><b>{esc(WALK_LABEL[d['compiled']])}.</b> MUL_MATs whose chunks ran on two threads at the same "
                f"time: {len(cc)} of {n_mm}.<br/><span style='color:{'#212121' if q['clean'] else '#c62828'}'>"
                f"This recording: {esc(q['note'])}.</span></p>")
        return head + html_table(rows, list(rows[0]) if rows else [])

    def figure(self, node_range=None, highlight="current"):
        hl = self.node if highlight == "current" else highlight
        return plot_timeline(self.data, node_range=self.range if node_range is None else node_range, highlight=hl)

    def info_html(self) -> str:
        ni = self.node_info()
        head = (f"<b>node #{ni['node_n']} {esc(ni['name'])}</b> ({esc(ni['op'])}), n_tasks = {ni['n_tasks']}, "
                f"{ni['n_chunks']} chunks")
        return head + html_table(ni["threads"], ["thread", "start_us", "time_us", "chunks", "rows",
                                                 "barrier_wait_us"])

    def to_html(self) -> str:
        return png_img(fig_to_png(self.figure()), "max-width:100%") + self.accounting_html() + self.info_html()

    def book_view(self) -> dict:
        """This window's chart drawn once per thread count (no node marked), the selected node's time span marked
        over it in the page; every node of the window's table recorded, for each recorded thread count. Another
        window is another drawing, which needs a kernel."""
        a, b = self.range
        node, threads = self.node, self.threads
        charts, wins = {}, {}
        try:
            with quiet(self):
                for nt in self.runs:
                    self._use(nt)
                    fig = self.figure(highlight=None)
                    img, box = chart_with_cursor(fig, fig.axes[0])
                    spans = {}
                    for x in self.data["nodes"]:
                        lo, hi = spans.get(x["node_n"], (x["t0"], x["t1"]))
                        spans[x["node_n"]] = (min(lo, x["t0"]), max(hi, x["t1"]))
                    charts[nt] = (img, box, spans, self.accounting_html())
                    wins[nt] = [n for n in self.computed if a <= n < b]
                lo = min(w[0] for w in wins.values())
                hi = max(w[-1] for w in wins.values())

                def frame(key):
                    nt, n = (threads, key[0]) if len(key) == 1 else key
                    self._use(nt)
                    img, box, spans, acc = charts[nt]
                    # a node number that computed nothing shows the next one that did (as select does)
                    self.node = next((x for x in wins[nt] if x >= n), wins[nt][-1])
                    return {"picture": img, "cursor": [box(*spans[self.node])], "info": self.info_html(), "foot": acc}

                ctrl = [{"name": "node", "label": "node", "kind": "range", "min": lo, "max": hi, "value": node,
                         "width": 480}]
                keys = [(n,) for n in range(lo, hi + 1)]
                if len(self.runs) > 1:
                    ctrl.insert(0, {"name": "threads", "label": "threads (recorded runs)", "kind": "toggle",
                                    "value": threads, "options": [[str(t), t] for t in sorted(self.runs)]})
                    keys = [(t, n) for t in sorted(self.runs) for n in range(lo, hi + 1)]
                in_win = wins[threads]
                return frames_book(
                    ctrl, keys, frame,
                    note="" if len(in_win) == len(self.computed) else
                    f"nodes {in_win[0]} … {in_win[-1]} of {self.computed[0]} … {self.computed[-1]} drawn here: "
                    f"another window is another drawing, which needs a kernel (run the notebook and move the slider "
                    f"past the window)")
        finally:
            self._use(threads)
            self.node = node

    def _build(self):

        self._w_node = W.SelectionSlider(options=self.computed, value=self.node, description="node",
                                         continuous_update=False, layout=W.Layout(width="700px"))
        self._w_node.observe(lambda ch: None if getattr(self, "_syncing", False) else self.select(ch["new"]),
                             "value")
        self._w_threads = W.ToggleButtons(options=sorted(self.runs), value=self.threads,
                                          description="threads", layout=W.Layout(
                                              display=None if len(self.runs) > 1 else "none"))
        self._w_threads.observe(lambda ch: None if getattr(self, "_syncing", False)
                                else self.select_threads(ch["new"]), "value")
        self._w_img = W.HTML()
        self._w_acc = W.HTML()
        self._w_info = W.HTML()
        return W.VBox([W.HBox([self._w_threads, self._w_node]), self._w_img, self._w_acc, self._w_info])

    def _refresh(self):
        self._syncing = True
        try:
            if self._w_node.options != tuple(self.computed):
                self._w_node.options = self.computed
            if self._w_node.value != self.node:
                self._w_node.value = self.node
            self._w_threads.value = self.threads
        finally:
            self._syncing = False
        self._w_img.value = png_img(fig_to_png(self.figure()), "max-width:100%")
        self._w_acc.value = self.accounting_html()
        self._w_info.value = self.info_html()
