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
buffer (CUDA has its own memory); the CPU threads walk node by node with the per-node kernels (CPU_REPACK's
included), never the compiled whole-graph program of ``ggml_cpu.graph_compute``, which needs every thread on every
node -- which is why a hybrid decode step of ggviz is slower than the scheduler's, the threads handing each node
over in Python (``benchmarks/bench_powerinfer_hybrid.py``). PowerInfer needs N >= 2 (with one thread no CPU node would ever run): ggviz
raises instead of hanging. An exception in any thread stops the others (their waits are broken) and reaches the
caller as a GGMLError naming the node; the abort callback (asked by CPU thread 1 after every node) stops them the
same way (``HybridAborted``), and so does an interrupt of the calling thread.

**The device's memory** (``device``: an ACCEL device, ``ggml.accel``). PowerInfer's GPU nodes have their weights
in CUDA memory (``ggml_cuda_transform_tensor`` at load); their other operands -- activations the CPU threads
computed -- are copied in by ``ggml_cuda_op_flatten`` / ``ggml_cuda_op_mul_mat`` ("src1 not on device: cudaMemcpy
host to device") and a result the CPU needs is copied back. With ``device`` given, thread 0 does the same: every
operand of a GPU node that is not in the device's memory is copied into a staging buffer of the device
(``ggml_backend_tensor_set``, counted as h2d by ``accel.backend_accel_stats``), the kernel runs on the device's
copies, and the result goes back to the node's host memory (``ggml_backend_tensor_get``, d2h). Weights already in
the device are read where they are, so after the load only activations cross: per decode the bytes moved are
exactly those of the staged operands and results (``HybridRecord.h2d_bytes`` / ``d2h_bytes``). Deviation: in
PowerInfer the ``*_gpu`` result stays on the device and the CPU's ``*_merged`` ADD pulls it through CUDA, and the
sparse index is read by the kernel through host memory (zero-copy); ggviz copies the index in and the result back,
which moves the same activations, each once per GPU node. Without ``device`` nothing is staged (the kernels read
host memory, as in the first tests of this module).

**The timeline: a trace event stream.** ``graph_compute_hybrid`` returns one ``HybridRecord`` per computed node,
sorted by node index, and, while a trace listener is on (``ggviz.trace``), emits:

* ``hybrid.graph`` once before the threads start: ``n_threads``, ``n_nodes``, ``n_gpu`` (nodes on the device
  lane), ``device`` (its name or None), ``t`` (perf_counter_ns);
* ``hybrid.node`` per computed node, when it finishes: ``node_n`` (index in the graph), ``name``, ``op``
  (op_desc), ``lane`` ("gpu": thread 0; "cpu": threads 1..N-1), ``ith`` (the recording thread: 0 on the GPU lane,
  1 on the CPU lane -- a CPU node is computed by threads 1..n_tasks-1 together), ``nth`` (threads that computed
  it: 1 on the GPU lane, ``n_tasks - 1`` or 1 on the CPU lane), ``layer`` (the ``-il`` suffix of the name, -1
  without), ``srcs`` (node indices of src[0..2] that are graph nodes: the tensors whose ``is_finish`` it waited
  on), ``t_wait`` (began waiting on them), ``t_start`` (all were finished: the node starts; ``t_start - t_wait``
  is the wait on ``is_finish``), ``t_kernel`` / ``t_kernel_end`` (the kernel itself; on the GPU lane the copies
  in are ``t_start..t_kernel`` and the copy back ``t_kernel_end..t_end``), ``t_end`` (``is_finish`` set; on the
  CPU lane after the CPU threads' barrier), ``h2d_bytes`` / ``d2h_bytes`` (bytes copied to / from the device),
  ``threads`` (``[(ith, t_kernel, t_kernel_end)]``, by ith: the kernel span of each thread that computed the node
  -- ``[(0, ...)]`` on the GPU lane, threads ``1..nth`` on the CPU lane, each with its own ``ith - 1`` share);
* ``hybrid.graph.end`` after all threads joined: ``t``, ``ok`` (False when a thread failed), ``h2d_bytes``,
  ``d2h_bytes`` (totals).

All times are ``time.perf_counter_ns()`` of one process, so lanes can be drawn on one axis: device lane = the
"gpu" records, one CPU lane per thread from the "cpu" records' ``threads``, waits = ``t_wait..t_start`` of each.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ... import trace
from .. import alloc as galloc
from .. import backend as B
from ..context import init as ggml_init
from ..context import tensor_overhead
from ..graph import CGraph
from ..impl import EMPTY_OPS, GGMLError
from ..tensor import Tensor, is_empty, nbytes, op_desc
from . import ggml_cpu, traits
from .common import CACHE_LINE_SIZE, ComputeParams

WAIT_TIMEOUT_S = 300.0        # a wait on is_finish longer than this is a bug (a node nobody computes)
_LAYER = re.compile(r"-(\d+)$")


class _Stop(BaseException):
    """Another thread failed: leave the graph."""


class HybridAborted(GGMLError):
    """The abort callback returned true: the graph was left part-way (ggml's GGML_EXIT_ABORTED)."""


@dataclass
class HybridRecord:
    """One computed node of the timeline (see the module docstring for the fields)."""
    node_n: int
    name: str
    op: str
    lane: str                     # "gpu" (thread 0) or "cpu"
    ith: int                      # the thread that recorded it (1 for a CPU node: threads 1..n_tasks-1 computed it)
    t_wait: int                   # perf_counter_ns when it started waiting on is_finish
    t_start: int
    t_end: int
    srcs: list = field(default_factory=list)      # node indices of src[0..2] that are graph nodes
    nth: int = 1
    layer: int = -1
    t_kernel: int = 0
    t_kernel_end: int = 0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    threads: list = field(default_factory=list)   # (ith, t_kernel, t_kernel_end) of every thread that computed it


def layer_of(name: str) -> int:
    """llama.cpp names a layer's tensors "<name>-<il>"."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else -1


def _buffer_of(t: Tensor):
    return B.buffer_at(t.view_src.buffer if t.view_src is not None else t.buffer)


def in_device_memory(t: Tensor, dev) -> bool:
    """Is ``t`` (or what it views) in a buffer of ``dev``'s buffer type?"""
    buf = _buffer_of(t)
    return buf is not None and buf.buft is B.backend_dev_buffer_type(dev)


def weight_on_device(node: Tensor) -> bool:
    """PowerInfer's placement of a node: llm_build_ffn_sparse's ``cb`` gives a node the GPU backend when its
    src[0] (the weight, for MUL_MAT_SPARSE and AXPY) is on the GPU, and llama.cpp's offload functions do the same
    for the attention, the norms and the output layer it placed there; here, when one of its operands is a
    WEIGHTS tensor in the memory of a GPU-type device (an ACCEL device; not CPU_REPACK, an extra buffer type of
    the CPU) -- the weight of a MUL_MAT, or of a norm's MUL (src[1])."""
    if node.op in EMPTY_OPS:
        return False
    for s in node.src:
        if s is None:
            continue
        buf = _buffer_of(s)
        if buf is None or B.backend_buffer_get_usage(buf) != B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS:
            continue
        dev = B.backend_buft_get_device(buf.buft)
        if dev is not None and B.backend_dev_type(dev) == B.GGML_BACKEND_DEVICE_TYPE_GPU:
            return True
    return False


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


def work_size(nodes, n_threads: int) -> int:
    """ggml_graph_plan's work size, without the compiled fast path (the hybrid executor walks node by node)."""
    size = 0
    for node in nodes:
        n_tasks = ggml_cpu.get_n_tasks(node, n_threads)
        extra = traits.extra_work_size(n_threads, node)
        size = max(size, extra if extra is not None else ggml_cpu.node_work_size(node, n_tasks, n_threads))
    return size + CACHE_LINE_SIZE * n_threads if size else 0


class _DeviceStage:
    """Thread 0's copies on the device: for every GPU node, a device tensor per operand that is not in the device's
    memory and one for the result (CUDA's pool buffers of ggml_cuda_op_flatten), all in one buffer of the device
    allocated before the threads start and freed after."""

    def __init__(self, nodes, gpu, dev):
        self.dev = dev
        self.ctx = None
        self.buf = None
        self.plan: dict[int, tuple] = {}       # node_n -> (device node, [(host, device) operands], device result)
        n_t = sum(1 + sum(s is not None for s in n.src) for n, g in zip(nodes, gpu) if g)
        if not n_t:
            return
        self.ctx = ggml_init(n_t * tensor_overhead() + 1024, no_alloc=True)
        for node_n, (node, g) in enumerate(zip(nodes, gpu)):
            if not g or node.op in EMPTY_OPS or is_empty(node):
                continue
            staged: dict[int, Tensor] = {}
            ins = []
            srcs = []
            for s in node.src:
                if s is None or in_device_memory(s, dev):
                    srcs.append(s)
                    continue
                d = staged.get(s.addr)
                if d is None:
                    d = staged[s.addr] = self._like(s, s.name)
                    ins.append((s, d))
                srcs.append(d)
            out = self._like(node, node.name)
            out.op = node.op
            out.op_params[:] = node.op_params
            for j, d in enumerate(srcs):
                if d is not None:
                    out.src[j] = d
            self.plan[node_n] = (out, ins, out)
        buft = B.backend_dev_buffer_type(dev)
        self.buf = galloc.backend_alloc_ctx_tensors_from_buft(self.ctx, buft)
        if self.buf is None:
            raise GGMLError(f"graph_compute_hybrid: no room on {B.backend_buft_name(buft)} for the GPU nodes' "
                            f"operands and results ({galloc.backend_alloc_ctx_tensors_from_buft_size(self.ctx, buft)} "
                            f"bytes)")

    def _like(self, t: Tensor, name: str) -> Tensor:
        """A device tensor with t's type, shape and strides (a view keeps its strides: its bytes are copied as
        they lie)."""
        d = self.ctx.new_tensor_impl(t.type, 4, [int(x) for x in t.ne], None, 0)
        d.nb[:] = t.nb
        d.name = name
        return d

    def free(self):
        if self.buf is not None:
            B.backend_buffer_free(self.buf)
            self.buf = None


def graph_compute_hybrid(cgraph: CGraph, n_threads: int, on_gpu=None, device=None, abort_callback=None,
                         abort_callback_data=None) -> list[HybridRecord]:
    """ggml_graph_compute with ggml_graph_compute_thread_hybrid. ``on_gpu(node)`` says whether a node's backend is
    the GPU (default ``weight_on_device``: PowerInfer's ``node->backend == GGML_BACKEND_GPU``, set when its weight
    src[0] lives there); ``device``: the ACCEL device whose memory the GPU nodes work in (None: no staging);
    ``abort_callback(data)``: asked after every CPU node, as PowerInfer's threads ask ``cplan->abort_callback``.
    Returns the timeline (HybridRecords, by node index); raises GGMLError when a kernel fails in any thread,
    HybridAborted when the abort callback said so; an interrupt of the caller stops the threads too."""
    if n_threads < 2:
        raise GGMLError(f"graph_compute_hybrid: n_threads = {n_threads}: needs at least 2 threads (thread 0 only "
                        f"drives the GPU; PowerInfer: \"n_threads must be > 1 to enable hybrid CPU/GPU "
                        f"computation\")")
    on_gpu = weight_on_device if on_gpu is None else on_gpu
    nodes = list(cgraph.nodes)
    index = {n.addr: i for i, n in enumerate(nodes)}
    gpu = [bool(on_gpu(n)) for n in nodes]
    # is_finish: leafs (anything that is not a node of this graph) count as finished
    done = [threading.Event() for _ in nodes]
    wsize = work_size(nodes, n_threads)
    wdata = np.zeros(wsize, np.uint8) if wsize else None
    wdata_gpu = np.zeros(wsize, np.uint8) if wsize else None      # the device has its own scratch (CUDA's pool)
    stage = _DeviceStage(nodes, gpu, device) if device is not None else None
    table, _ = ggml_cpu._dispatch()
    failed = threading.Event()
    aborted = threading.Event()
    errors: list[BaseException] = []
    group = _CpuGroup(n_threads - 1, failed)
    records: list[HybridRecord] = []
    rec_lock = threading.Lock()
    spans_of: list[list] = [[] for _ in nodes]     # per node: (ith, kernel start, kernel end) of each CPU thread

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
        try:
            # an extra buffer type (CPU_REPACK) computes the MUL_MATs of its weights, as in ggml_compute_forward
            if traits.extra_compute_forward(params, node):
                return
            fn = table.get(node.op)
            if fn is None:
                raise GGMLError(f"ggviz CPU backend has no kernel for op {op_desc(node)}")
            fn(params, node)
        except (GGMLError, _Stop):
            raise
        except Exception as exc:
            raise GGMLError(f"computing node {node_n} {node.name!r} ({op_desc(node)}) failed: "
                            f"{type(exc).__name__}: {exc}") from exc

    def record(node_n, lane, ith, nth, t_wait, t0, tk0, tk1, t1, h2d=0, d2h=0):
        node = nodes[node_n]
        spans = sorted(spans_of[node_n]) if lane == "cpu" else [(0, tk0, tk1)]
        r = HybridRecord(node_n, node.name, op_desc(node), lane, ith, t_wait, t0, t1, srcs_of(node), nth,
                         layer_of(node.name), tk0, tk1, h2d, d2h, spans)
        with rec_lock:
            records.append(r)
        if trace.active:
            trace.emit("hybrid.node", node_n=node_n, name=r.name, op=r.op, lane=lane, ith=ith, nth=nth,
                       layer=r.layer, srcs=r.srcs, t_wait=t_wait, t_start=t0, t_kernel=tk0, t_kernel_end=tk1,
                       t_end=t1, h2d_bytes=h2d, d2h_bytes=d2h, threads=spans)

    def gpu_thread():
        params = ComputeParams(0, 1, wdata_gpu, None)
        for node_n, node in enumerate(nodes):
            if not gpu[node_n]:
                continue
            t_wait = time.perf_counter_ns()
            wait_srcs(node)
            t0 = time.perf_counter_ns()
            h2d = d2h = 0
            plan = stage.plan.get(node_n) if stage is not None else None
            if plan is None:
                tk0 = t0
                compute(params, node, node_n)
                tk1 = time.perf_counter_ns()
            else:
                dnode, ins, dout = plan
                for host, dev_t in ins:             # host -> device: the operands the CPU computed
                    n = nbytes(host)
                    B.backend_tensor_set(dev_t, B._bytes_at(host.data, n), 0, n)
                    h2d += n
                tk0 = time.perf_counter_ns()
                compute(params, dnode, node_n)
                tk1 = time.perf_counter_ns()
                n = nbytes(node)                    # device -> host: the result, for the CPU nodes that read it
                B.backend_tensor_get(dout, B._bytes_at(node.data, n), 0, n)
                d2h = n
            t1 = time.perf_counter_ns()
            record(node_n, "gpu", 0, 1, t_wait, t0, tk0, tk1, t1, h2d, d2h)
            done[node_n].set()

    def cpu_thread(ith: int):
        for node_n, node in enumerate(nodes):
            if gpu[node_n]:
                continue
            t_wait = time.perf_counter_ns()
            wait_srcs(node)
            n_tasks = ggml_cpu.get_n_tasks(node, n_threads)
            t0 = time.perf_counter_ns()
            nth = 1
            if n_tasks == 1:
                if ith == 1:
                    compute(_Params(0, 1, wdata, group), node, node_n)
            else:
                # PowerInfer: params {ith = state->ith - 1, nth = n_tasks - 1}
                nth = n_tasks - 1
                if ith < n_tasks:
                    compute(_Params(ith - 1, nth, wdata, group), node, node_n)
            tk1 = time.perf_counter_ns()
            if ith == 1 or (n_tasks > 1 and ith < n_tasks):
                spans_of[node_n].append((ith, t0, tk1))      # list.append: atomic under the interpreter lock
            group.barrier(ith)
            if ith == 1:
                record(node_n, "cpu", ith, nth, t_wait, t0, t0, tk1, time.perf_counter_ns())
                done[node_n].set()
                if abort_callback is not None and abort_callback(abort_callback_data):
                    aborted.set()
                    stop_all()
            group.barrier(ith)

    def stop_all():
        failed.set()
        group.abort()
        for e in done:                # wake every waiter; they see `failed` and leave
            e.set()

    def run(fn, *args):
        try:
            fn(*args)
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append(exc)
            stop_all()

    if trace.active:
        trace.emit("hybrid.graph", n_threads=n_threads, n_nodes=len(nodes), n_gpu=sum(gpu),
                   device=B.backend_dev_name(device) if device is not None else None, t=time.perf_counter_ns())
    # the GPU driver starts first (in its own thread: the caller would otherwise wait for the interpreter lock
    # while the CPU threads start on the first nodes), then the CPU threads; the caller waits for all
    threads = [threading.Thread(target=run, args=(gpu_thread,), name="ggml-hybrid-0")]
    threads += [threading.Thread(target=run, args=(cpu_thread, i), name=f"ggml-hybrid-{i}")
                for i in range(1, n_threads)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:
        stop_all()                    # the caller was interrupted (Ctrl-C): the threads leave at their next wait
        raise
    finally:
        for t in threads:
            if t.ident is not None:
                t.join()
        if stage is not None:
            stage.free()
    records.sort(key=lambda r: r.node_n)
    if trace.active:
        trace.emit("hybrid.graph.end", t=time.perf_counter_ns(), ok=not errors,
                   h2d_bytes=sum(r.h2d_bytes for r in records), d2h_bytes=sum(r.d2h_bytes for r in records))
    if aborted.is_set() and not errors:
        raise HybridAborted("graph_compute_hybrid: aborted by the abort callback")
    if errors:
        e = errors[0]
        if isinstance(e, GGMLError) or not isinstance(e, Exception):
            raise e
        raise GGMLError(f"graph_compute_hybrid: {type(e).__name__}: {e}") from e
    return records
