"""PowerInfer's hybrid executor: one thread drives the GPU, the others run the CPU nodes, synchronised per tensor.

Mirrors SJTU-IPADS/PowerInfer's ggml.c ``ggml_graph_compute_thread_hybrid`` (built with GGML_USE_HYBRID_THREADING),
beside ggml's ``ggml_graph_compute`` (``ggml_cpu.graph_compute``), where every thread walks every node:

* ``struct ggml_tensor`` got an atomic ``is_finish``; ``ggml_visit_parents`` sets it to 1 on leafs (weights,
  inputs), nodes start at 0 and get 1 when computed.
* **thread 0** is the GPU driver: it walks all nodes, skips the CPU ones, spins until ``src[0..2]->is_finish`` are
  all 1 (only the first three sources: ``src[3]``, gpu_idx / gpu_bucket, is always a leaf), computes the node with
  ``{ith 0, nth 1}`` (a CUDA launch in PowerInfer; here the CPU kernels on the "device" thread), sets ``is_finish``.
  It never computes a CPU node, and returns when it has walked the graph.
* **threads 1 .. N-1** run the CPU nodes the ggml way of late 2023: the last thread to arrive (``n_active``) spins on
  the node's ``src[0..2]->is_finish`` (so a CPU node that needs a GPU result waits for it), runs INIT, then all
  compute it with ``ith - 1`` and ``nth = n_tasks - 1`` -- thread 0 is counted in ``n_tasks`` but never computes
  there, which answers the seed article's question of which threads compute: with ``-t 8`` seven do the CPU work.
  A node with n_tasks == 1 is computed by that one thread. After each node the CPU threads meet (ggml's barrier)
  and the node gets ``is_finish = 1``.

ggviz differences, each for Python's sake: a waiting thread blocks on a ``threading.Event`` per tensor instead of
spinning on an atomic int (a spinning Python thread would hold the interpreter lock the computing threads need);
the CPU threads' barrier is a ``threading.Barrier`` over the N-1 CPU threads; the GPU thread has its own work
buffer (CUDA has its own memory). PowerInfer needs N >= 2 (with one thread no CPU node would ever run): ggviz
raises instead of hanging. An exception in any thread stops the others (their waits are broken) and reaches the
caller as a GGMLError naming the node.

``graph_compute_hybrid`` returns the timeline: one record per computed node (lane "gpu" or "cpu", start / end and
the time spent waiting on ``is_finish``); with a trace listener each record is also emitted as ``hybrid.node``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ... import trace
from ..graph import CGraph
from ..impl import EMPTY_OPS, GGMLError
from ..tensor import Tensor, is_empty, op_desc
from . import ggml_cpu
from .common import ComputeParams

WAIT_TIMEOUT_S = 300.0        # a wait on is_finish longer than this is a bug (a node nobody computes)


class _Stop(BaseException):
    """Another thread failed: leave the graph."""


@dataclass
class HybridRecord:
    node_n: int
    name: str
    op: str
    lane: str                     # "gpu" (thread 0) or "cpu"
    ith: int                      # the thread that recorded it (the last CPU thread to leave, for a CPU node)
    t_wait: int                   # perf_counter_ns when it started waiting on is_finish
    t_start: int
    t_end: int
    srcs: list = field(default_factory=list)      # node indices of src[0..2] that are graph nodes


class _CpuGroup:
    """What the CPU threads share: the barrier (n_active in PowerInfer) and the chunk counter ``aic``."""

    def __init__(self, n: int, failed: threading.Event):
        self.n = n
        self._barriers: dict[int, threading.Barrier] = {}
        self._lock = threading.Lock()
        self.current_chunk = 0
        self.failed = failed

    def _barrier(self, n: int) -> threading.Barrier:
        with self._lock:
            b = self._barriers.get(n)
            if b is None:
                b = self._barriers[n] = threading.Barrier(n)
            return b

    def barrier(self, ith: int, nth: int | None = None) -> None:
        try:
            self._barrier(nth or self.n).wait(WAIT_TIMEOUT_S)
        except threading.BrokenBarrierError:
            raise _Stop() from None

    def abort(self):
        with self._lock:
            for b in self._barriers.values():
                b.abort()

    def chunk_set(self, v: int) -> None:
        self.current_chunk = v

    def chunk_add(self, v: int) -> int:
        with self._lock:
            old = self.current_chunk
            self.current_chunk = old + v
            return old

    chunk_fetch_add = chunk_add


class _Params(ComputeParams):
    """ggml_compute_params whose barrier is the CPU group's (for nth threads)."""
    __slots__ = ()

    def barrier(self):
        if self.nth > 1:
            self.threadpool.barrier(self.ith, self.nth)


def graph_compute_hybrid(cgraph: CGraph, n_threads: int, on_gpu) -> list[HybridRecord]:
    """ggml_graph_compute with ggml_graph_compute_thread_hybrid: ``on_gpu(node)`` says whether a node's backend is
    the GPU (PowerInfer: ``node->backend == GGML_BACKEND_GPU``, set when its weight src[0] lives there)."""
    if n_threads < 2:
        raise GGMLError("graph_compute_hybrid: needs at least 2 threads (thread 0 only drives the GPU)")
    nodes = list(cgraph.nodes)
    index = {n.addr: i for i, n in enumerate(nodes)}
    gpu = [bool(on_gpu(n)) for n in nodes]
    # is_finish: leafs (anything that is not a node of this graph) count as finished
    done = [threading.Event() for _ in nodes]
    plan = ggml_cpu.graph_plan(cgraph, n_threads)
    wdata = np.zeros(plan.work_size, np.uint8) if plan.work_size else None
    wdata_gpu = np.zeros(plan.work_size, np.uint8) if plan.work_size else None
    table, _ = ggml_cpu._dispatch()
    failed = threading.Event()
    errors: list[BaseException] = []
    group = _CpuGroup(n_threads - 1, failed)
    records: list[HybridRecord] = []
    rec_lock = threading.Lock()

    def srcs_of(node: Tensor) -> list[int]:
        return [index[s.addr] for s in node.src[:3] if s is not None and s.addr in index]

    def wait_srcs(node: Tensor):
        for k in srcs_of(node):
            if not done[k].wait(WAIT_TIMEOUT_S):
                raise GGMLError(f"graph_compute_hybrid: {node.name!r} waited {WAIT_TIMEOUT_S} s for "
                                f"{nodes[k].name!r}")
            if failed.is_set():
                raise _Stop()

    def compute(params, node, node_n):
        if node.op in EMPTY_OPS or is_empty(node):
            return
        fn = table.get(node.op)
        if fn is None:
            raise GGMLError(f"ggviz CPU backend has no kernel for op {op_desc(node)}")
        try:
            fn(params, node)
        except (GGMLError, _Stop):
            raise
        except Exception as exc:
            raise GGMLError(f"computing node {node_n} {node.name!r} ({op_desc(node)}) failed: "
                            f"{type(exc).__name__}: {exc}") from exc

    def record(node_n, lane, ith, t_wait, t0, t1):
        node = nodes[node_n]
        r = HybridRecord(node_n, node.name, op_desc(node), lane, ith, t_wait, t0, t1, srcs_of(node))
        with rec_lock:
            records.append(r)
        if trace.active:
            trace.emit("hybrid.node", node_n=node_n, name=r.name, op=r.op, lane=lane, ith=ith, t_wait=t_wait,
                       t_start=t0, t_end=t1)

    def gpu_thread():
        params = ComputeParams(0, 1, wdata_gpu, None)
        for node_n, node in enumerate(nodes):
            if not gpu[node_n]:
                continue
            t_wait = time.perf_counter_ns()
            wait_srcs(node)
            t0 = time.perf_counter_ns()
            compute(params, node, node_n)
            t1 = time.perf_counter_ns()
            record(node_n, "gpu", 0, t_wait, t0, t1)
            done[node_n].set()

    def cpu_thread(ith: int):
        for node_n, node in enumerate(nodes):
            if gpu[node_n]:
                continue
            t_wait = time.perf_counter_ns()
            wait_srcs(node)
            n_tasks = ggml_cpu.get_n_tasks(node, n_threads)
            t0 = time.perf_counter_ns()
            if n_tasks == 1:
                if ith == 1:
                    compute(_Params(0, 1, wdata, group), node, node_n)
            elif ith < n_tasks:
                # PowerInfer: params {ith = state->ith - 1, nth = n_tasks - 1}
                compute(_Params(ith - 1, n_tasks - 1, wdata, group), node, node_n)
            t1 = time.perf_counter_ns()
            group.barrier(ith)
            if ith == 1:
                record(node_n, "cpu", ith, t_wait, t0, t1)
                done[node_n].set()
            group.barrier(ith)

    def run(fn, *args):
        try:
            fn(*args)
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append(exc)
            failed.set()
            group.abort()
            for e in done:            # wake every waiter; they see `failed` and leave
                e.set()

    # the GPU driver starts first (in its own thread: the caller would otherwise wait for the interpreter lock
    # while the CPU threads start on the first nodes), then the CPU threads; the caller waits for all
    threads = [threading.Thread(target=run, args=(gpu_thread,), name="ggml-hybrid-0")]
    threads += [threading.Thread(target=run, args=(cpu_thread, i), name=f"ggml-hybrid-{i}")
                for i in range(1, n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        e = errors[0]
        if isinstance(e, GGMLError) or not isinstance(e, Exception):
            raise e
        raise GGMLError(f"graph_compute_hybrid: {type(e).__name__}: {e}") from e
    records.sort(key=lambda r: r.node_n)
    return records
