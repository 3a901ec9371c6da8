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
    """Collects events as plain dicts (optionally only some kinds); use as a context manager."""

    def __init__(self, kinds=None):
        self.kinds = set(kinds) if kinds else None
        self.events: list[dict] = []
        self._lock = threading.Lock()

    def __call__(self, ev: dict) -> None:
        if self.kinds is None or ev["kind"] in self.kinds:
            with self._lock:
                self.events.append(dict(ev))

    def __enter__(self):
        listen(self)
        return self

    def __exit__(self, *exc):
        unlisten(self)
        return False

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]


@contextmanager
def recording(kinds=None):
    rec = Recorder(kinds)
    with rec:
        yield rec
