"""ggviz.trace: the one-way instrumentation channel from the engine to whoever listens.

The engine calls ``emit(kind, **fields)`` at the points ggml would let a debugger stop (an object placed in a
context, a graph node visited, a node computed ...). Views subscribe with ``listen``; recorders turn events into
plain data. The engine never imports the visual layer: it only knows this module.

Cost when nobody listens: every call site is written as ``if trace.active: trace.emit(...)``, so the price is one
module-attribute load and a falsy test.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

active = False          # True while at least one listener is registered; call sites test this first
_listeners: list = []
_lock = threading.Lock()


def emit(kind: str, **fields) -> None:
    """Deliver one event to every listener. Call only behind ``if trace.active``."""
    fields["kind"] = kind
    fields.setdefault("t", time.perf_counter_ns())
    for fn in tuple(_listeners):
        fn(fields)


class Batch:
    """Many events produced at once, expanded into event dicts only when somebody reads them.

    The compiled CPU walk cannot call Python per node: it logs into an array, and after the compute the executor
    hands the whole log over as one Batch (``emit_batch``). ``expand()`` returns the events (plain dicts with
    ``kind``, as ``emit`` would have delivered them); it runs at most once."""

    __slots__ = ("_expand", "_events", "n")

    def __init__(self, expand, n: int):
        self._expand = expand         # () -> list[dict]
        self._events = None
        self.n = n                    # how many events it holds (known before expanding)

    def expand(self) -> list[dict]:
        if self._events is None:
            self._events = self._expand()
            self._expand = None
        return self._events

    def __len__(self):
        return self.n

    def __repr__(self):
        return f"<trace.Batch of {self.n} events>"


def emit_batch(batch: Batch) -> None:
    """Deliver a Batch: as one ``{"kind": "batch", "batch": batch}`` event to listeners that say they take them
    (``fn.accepts_batches = True``: the recorders, which expand lazily), as its events one by one to the others.
    Call only behind ``if trace.active``."""
    t = time.perf_counter_ns()
    for fn in tuple(_listeners):
        if getattr(fn, "accepts_batches", False):
            fn({"kind": "batch", "batch": batch, "t": t})
        else:
            for ev in batch.expand():
                fn(dict(ev))


def listen(fn) -> None:
    """Register ``fn(event_dict)``; it is called synchronously on the emitting thread."""
    global active
    with _lock:
        _listeners.append(fn)
        active = True


def unlisten(fn) -> None:
    global active
    with _lock:
        if fn in _listeners:
            _listeners.remove(fn)
        active = bool(_listeners)


class Recorder:
    """Collects events as plain dicts (optionally only some kinds); use as a context manager.

    ``events`` is the list of recorded events in arrival order. Batches (``emit_batch``) are kept as they come and
    expanded the first time ``events`` is read after them, so recording a compiled compute costs one append."""

    accepts_batches = True

    def __init__(self, kinds=None):
        self.kinds = set(kinds) if kinds else None
        self._items: list = []        # event dicts and Batches, in arrival order
        self._flat: list[dict] = []   # _items[:_n_flat] expanded
        self._n_flat = 0
        self._lock = threading.Lock()

    def __call__(self, ev: dict) -> None:
        if ev["kind"] == "batch":
            with self._lock:
                self._items.append(ev["batch"])
        elif self.kinds is None or ev["kind"] in self.kinds:
            with self._lock:
                self._items.append(dict(ev))

    @property
    def events(self) -> list[dict]:
        with self._lock:
            kinds = self.kinds
            for it in self._items[self._n_flat:]:
                if isinstance(it, Batch):
                    self._flat.extend(dict(e) for e in it.expand() if kinds is None or e["kind"] in kinds)
                else:
                    self._flat.append(it)
            self._n_flat = len(self._items)
            return self._flat

    @property
    def n_events(self) -> int:
        """How many events were recorded, without expanding batches (a batch counts all of its events)."""
        with self._lock:
            return sum(it.n if isinstance(it, Batch) else 1 for it in self._items)

    def __enter__(self):
        listen(self)
        return self

    def __exit__(self, *exc):
        unlisten(self)
        return False

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]

    def by_kind(self) -> dict[str, list[dict]]:
        """kind -> that kind's events, in arrival order (kinds in order of first arrival)."""
        out: dict[str, list[dict]] = {}
        events = list(self.events)
        for e in events:
            out.setdefault(e["kind"], []).append(e)
        return out

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._flat = []
            self._n_flat = 0


@contextmanager
def recording(kinds=None):
    rec = Recorder(kinds)
    with rec:
        yield rec


# ====================================================================================================================
# recorders that turn the CPU backend's events into plain data
# ====================================================================================================================

class ComputeTimeline(Recorder):
    """Per-thread timeline of graph computes: node spans, mul_mat chunk claims and barrier waits.

    ::

        with trace.ComputeTimeline() as tl:
            ggml.graph_compute(gf, plan)
        tl.threads[1]["nodes"]        # thread 1's node spans of the last compute
        json.dump(tl.to_chrome_trace(), open("compute.json", "w"))     # open in ui.perfetto.dev

    Every compute started while listening is kept (``computes``, oldest first); ``last``/``threads`` are the last
    one's. A compute is a plain dict: ``graph`` (id of the cgraph), ``pool`` (the threadpool's serial),
    ``n_graph`` (its kickoff counter: graph count << 16 | n_threads), ``n_threads``, ``n_nodes``, ``disposable``,
    ``t_start``/``t_end`` (perf_counter ns), ``status`` (ggml_status, None if it raised), ``abort``
    (the ``cpu.abort`` event or None), ``errors`` (``cpu.worker_error`` events) and ``threads``:
    ith -> {"nodes": [{node_n, name, op, fused, t_start, t_end}],
            "chunks": [{node_n, node, chunk, nchunk, ir0, ir1, t_start, t_end}],
            "barriers": [{seq, where, node_n, name, t_enter, t_exit}]}
    (a barrier's ``node_n``/``name``: the node it follows -- or, for where == "kernel", the node whose kernel waits
    in it; "final" barriers have node_n == n_nodes). ``pauses``: the pool pause/resume events seen.
    """

    KINDS = ("cpu.compute.start", "cpu.kickoff", "cpu.node", "cpu.chunk", "cpu.barrier", "cpu.abort",
             "cpu.worker_error", "cpu.compute.end", "cpu.pause", "cpu.resume")

    def __init__(self):
        super().__init__(self.KINDS)

    # ---- the plain data ----------------------------------------------------------------------------------------
    @property
    def computes(self) -> list[dict]:
        events = list(self.events)
        computes: list[dict] = []
        by_key: dict = {}
        cur = None
        pending_chunks: dict = {}          # (compute index, ith) -> chunks not yet followed by their cpu.node

        def lane(c, ith):
            return c["threads"].setdefault(ith, {"nodes": [], "chunks": [], "barriers": []})

        for e in events:
            k = e["kind"]
            if k == "cpu.compute.start":
                cur = dict(graph=e.get("graph"), pool=e.get("pool"), n_graph=None, n_threads=e.get("n_threads"),
                           n_nodes=e.get("n_nodes"), disposable=e.get("disposable"), t_start=e["t"], t_end=None,
                           status=None, abort=None, errors=[], threads={})
                computes.append(cur)
                continue
            if k in ("cpu.pause", "cpu.resume"):
                continue
            # events of workers carry (pool, n_graph); stragglers of a previous compute find it by that key (and
            # are dropped if that compute started before the recording did)
            if "n_graph" in e and k != "cpu.kickoff":
                c = by_key.get((e.get("pool"), e.get("n_graph")))
            else:
                c = cur
            if c is None:
                continue
            if (k == "cpu.node" and not e["t_start"]) or (k == "cpu.barrier" and not e["t_enter"]) or (
                    k == "cpu.chunk" and not e.get("t_start", 1)):
                continue        # began before anybody listened: no start time
            if k == "cpu.kickoff":
                c["n_graph"] = e["n_graph"]
                c["n_threads"] = e["n_threads"]
                by_key[(e["pool"], e["n_graph"])] = c
            elif k == "cpu.node":
                node = dict(node_n=e["node_n"], name=e["name"], op=e["op"], fused=e.get("fused", False),
                            t_start=e["t_start"], t_end=e["t_end"])
                lane(c, e["ith"])["nodes"].append(node)
                for ch in pending_chunks.pop((id(c), e["ith"]), ()):
                    ch["node_n"] = e["node_n"]
            elif k == "cpu.chunk":
                ch = dict(node_n=None, node=e["node"], chunk=e["chunk"], nchunk=e.get("nchunk"), ir0=e["ir0"],
                          ir1=e["ir1"], t_start=e.get("t_start", e["t"]), t_end=e.get("t_end", e["t"]))
                lane(c, e["ith"])["chunks"].append(ch)
                pending_chunks.setdefault((id(c), e["ith"]), []).append(ch)
            elif k == "cpu.barrier":
                lane(c, e["ith"])["barriers"].append(dict(seq=e.get("seq"), where=e.get("where"),
                                                          node_n=e.get("node_n"), name=e.get("name"),
                                                          t_enter=e["t_enter"], t_exit=e["t_exit"]))
            elif k == "cpu.abort":
                c["abort"] = dict(e)
            elif k == "cpu.worker_error":
                c["errors"].append(dict(e))
            elif k == "cpu.compute.end":
                c["t_end"] = e["t"]
                c["status"] = e.get("status")
        for c in computes:
            for ln in c["threads"].values():
                ln["nodes"].sort(key=lambda s: s["t_start"])
                ln["chunks"].sort(key=lambda s: s["t_start"])
                ln["barriers"].sort(key=lambda s: s["t_enter"])
            c["threads"] = dict(sorted(c["threads"].items()))
        return computes

    @property
    def last(self) -> dict | None:
        cs = self.computes
        return cs[-1] if cs else None

    @property
    def threads(self) -> dict:
        c = self.last
        return c["threads"] if c is not None else {}

    @property
    def pauses(self) -> list[dict]:
        return [e for e in self.events if e["kind"] in ("cpu.pause", "cpu.resume")]

    # ---- Chrome / Perfetto trace-event JSON --------------------------------------------------------------------
    def to_chrome_trace(self, which=None) -> dict:
        """The Chrome trace-event JSON (a dict; ``json.dump`` it) of every recorded compute, or of
        ``computes[which]``. Node spans, barrier waits and chunk claims are complete events ("ph": "X", ts/dur in
        µs from the first compute's start), nested per thread: chunks and in-kernel barriers inside their node,
        everything inside the "graph_compute" span on thread 0. Opens in ui.perfetto.dev and chrome://tracing."""
        cs = self.computes
        if which is not None:
            cs = [cs[which]]
        spans = []          # (pid, tid, name, cat, t0_ns, t1_ns, args)
        instants = []       # (pid, tid, name, cat, t_ns, args)
        pids: dict = {}
        for ci, c in enumerate(cs):
            pid = c["pool"] if c["pool"] is not None else 0
            tids = pids.setdefault(pid, set())
            t_first = min([c["t_start"]] + [s["t_start"] for ln in c["threads"].values() for s in ln["nodes"]])
            t_last = max([c["t_end"] or c["t_start"]]
                         + [b["t_exit"] for ln in c["threads"].values() for b in ln["barriers"]]
                         + [s["t_end"] for ln in c["threads"].values() for s in ln["nodes"]])
            tids.add(0)
            spans.append((pid, 0, "graph_compute", "compute", t_first, t_last,
                          dict(compute=ci, graph=c["graph"], n_graph=c["n_graph"], n_threads=c["n_threads"],
                               n_nodes=c["n_nodes"], status=c["status"], disposable=c["disposable"])))
            for ith, ln in c["threads"].items():
                tids.add(ith)
                for s in ln["nodes"]:
                    spans.append((pid, ith, s["name"] or f"node_{s['node_n']}", "node", s["t_start"], s["t_end"],
                                  dict(node_n=s["node_n"], op=s["op"], fused=s["fused"])))
                for b in ln["barriers"]:
                    spans.append((pid, ith, "barrier", "barrier", b["t_enter"], b["t_exit"],
                                  dict(seq=b["seq"], where=b["where"], node_n=b["node_n"], after=b["name"])))
                for ch in ln["chunks"]:
                    spans.append((pid, ith, f"chunk {ch['chunk']}", "chunk", ch["t_start"], ch["t_end"],
                                  dict(node=ch["node"], node_n=ch["node_n"], chunk=ch["chunk"],
                                       nchunk=list(ch["nchunk"]) if ch["nchunk"] else None,
                                       ir0=list(ch["ir0"]), ir1=list(ch["ir1"]))))
            if c["abort"] is not None:
                a = c["abort"]
                instants.append((pid, 0, "abort", "abort", a["t"], dict(node_n=a["node_n"], abort=a["abort"])))
            for e in c["errors"]:
                ith = e["ith"] if e.get("ith", -1) is not None and e.get("ith", -1) >= 0 else 0
                tids.add(ith)
                instants.append((pid, ith, "worker_error", "error", e["t"],
                                 dict(ith=e.get("ith"), node_n=e.get("node_n"), error=e.get("error"))))
        t0 = min([s[4] for s in spans] + [i[4] for i in instants], default=0)
        us = 1e-3
        out = []
        for pid, tids in sorted(pids.items()):
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                        "args": {"name": f"ggml threadpool #{pid}"}})
            for tid in sorted(tids):
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": f"ggml-cpu-{tid}" + (" (caller)" if tid == 0 else "")}})
                out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                            "args": {"sort_index": tid}})
        # parents before children when they start together: longer spans first
        spans.sort(key=lambda s: (s[0], s[1], s[4], -(s[5] - s[4])))
        for pid, tid, name, cat, a, b, args in spans:
            out.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                        "ts": (a - t0) * us, "dur": max(b - a, 0) * us, "args": args})
        for pid, tid, name, cat, t, args in instants:
            out.append({"ph": "i", "s": "t", "name": name, "cat": cat, "pid": pid, "tid": tid,
                        "ts": (t - t0) * us, "args": args})
        return {"traceEvents": out, "displayTimeUnit": "ms"}
