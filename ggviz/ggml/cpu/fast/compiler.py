"""The compiler of the fast path: a ggml graph -> ``FastGraph``, a program every thread walks inside one call.

Not a ggml source file (see the package docstring). ``plan_graph`` is what ``ggml_cpu.graph_plan`` asks for: the
program of a graph whose MUL_MATs read weights in CPU_REPACK and whose every other op has a compiled kernel, or None
(then the node-by-node walk runs). The program is cached on the graph while its nodes are unchanged (llama.cpp
reuses graphs between decodes); a new graph of a topology compiled before gets a program derived from that one
(``_derive``: same rows, the changed ones rebuilt), and the first graph of a topology is built one row per class of
equal rows (``_build_by_class``), unless a trace listener records (then every row is built: ``_build``).
``FastGraph.compute_thread`` is thread ith's part of ``ggml_graph_compute``;
``trace_begin`` / ``trace_end`` turn on the compiled walk's own log and hand it over as one ``trace.Batch``, expanded
into the node-by-node walk's ``cpu.node`` / ``cpu.barrier`` / ``cpu.chunk`` events only when somebody reads them.
Each row's columns are named in ``program.py``.
"""
from __future__ import annotations

import functools
import itertools
import operator
import os
import threading
import time
from collections import OrderedDict
from operator import is_not

import numpy as np

from .... import trace
from ... import consts as C
from ... import backend
from ...impl import EMPTY_OPS, GGMLError
from ...tensor import (
    GGML_OP_AXPY,
    GGML_OP_MUL_MAT_SPARSE,
    Tensor,
    get_glu_op,
    get_op_params_f32,
    get_op_params_i32,
    nelements,
    nrows,
    op_desc,
    _registry_refs,
    gather_structs,
)
from .. import cpu_feats, mul_mat, repack
from .. import ops as cpu_ops
from ..libm import fma32, logf, powf
from ..ops import can_fuse_rms_norm_mul, rope_yarn_corr_dims
from . import fattn, gemma_ops, kernels, sparse, sync
from .sgemm import row_kernel
from .program import (
    CPY_DTYPE,
    CPY_STYPE,
    DATA,
    DST,
    ERR_BARRIER_TIMEOUT,
    ERR_GET_ROWS_INDEX,
    ERR_SET_ROWS_INDEX,
    FA_MASK,
    GET_ROWS_ITYPE,
    GET_ROWS_TYPE,
    MMF_LANES,
    MMF_LLAMAFILE,
    MMF_TYPE,
    MMQ_D,
    MMQ_M,
    MMQ_QS,
    MMQ_TYPE,
    NB3,
    FA_NTH,
    NCOL,
    NE0,
    NE1,
    NE2,
    NE3,
    NFCOL,
    OP,
    OP_AXPY,
    OP_BINARY,
    OP_CPY,
    OP_FLASH_ATTN,
    OP_GET_ROWS,
    OP_MUL_MAT_F,
    OP_MUL_MAT_Q,
    OP_MUL_MAT_SPARSE,
    OP_RMS_NORM,
    OP_ROPE,
    OP_SET_ROWS,
    OP_SOFT_MAX,
    OP_SWIGLU,
    RMS_NORM_EPS,
    ROPE_FREQ_SCALE,
    ROPE_N_DIMS,
    ROPE_NEOX,
    ROPE_SIN_SIGN,
    S0,
    S1,
    S2,
    SET_ROWS_ITYPE,
    SET_ROWS_TYPE,
    SOFT_MAX_LANES,
    SOFT_MAX_MTYPE,
    SOFT_MAX_SCALE,
    SOFT_MAX_SLOPE,
    SUBOP,
    SWIGLU_LANES,
    SWIGLU_NC,
    SWIGLU_NROWS,
    SWIGLU_SWAPPED,
    SYNC_ERROR,
    SYNC_SLEEP_TICKS,
    SYNC_TICKS,
    SYNC_TRACE,
    TR_BARRIER,
    TR_CHUNK,
    TR_NODE,
    TR_REC,
    TRW_FINAL,
    TRW_KERNEL,
    TRW_NODE,
)

GGML_TYPE_F32, GGML_TYPE_F16 = C.GGML_TYPE_F32, C.GGML_TYPE_F16
GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0 = C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q4_1, C.GGML_TYPE_Q8_0

# CPUs this process may run on: the compiled walk never uses more threads than that (spinning barriers on an
# oversubscribed machine only burn the cores the other threads need)
try:
    N_CPUS = len(os.sched_getaffinity(0))
except (AttributeError, OSError):
    N_CPUS = os.cpu_count() or 1



_SPARSE_OPS = (GGML_OP_MUL_MAT_SPARSE, GGML_OP_AXPY, C.GGML_OP_UNARY)
_POWERINFER_OPS = (GGML_OP_MUL_MAT_SPARSE, GGML_OP_AXPY)
_BINOP = {C.GGML_OP_ADD: 0, C.GGML_OP_MUL: 1, C.GGML_OP_SUB: 2, C.GGML_OP_DIV: 3}


class _Unsupported(Exception):
    pass


def _desc(P, k, col, t: Tensor):
    """data, ne[4], nb[4] straight from the struct's words (data is word 31, ne and nb words 2..9)."""
    if t is None:
        return
    q = t._q
    P[k, col + DATA] = q[31]
    P[k, col + NE0:col + NB3 + 1] = q[2:10]


def _need(cond):
    if not cond:
        raise _Unsupported()


class FastGraph:
    """A graph as a program for ``fast_kernels.graph_compute_thread``: one row per computed node."""

    def __init__(self, P, F, node_index, names, wsize, meta=None, n_nodes=0):
        self.P, self.F = P, F
        self.node_index = node_index          # program row -> graph node index
        self.names = names
        self._meta = meta or [(0, "")] * len(names)    # program row -> (node addr, op description), for the trace
        self._meta_parts = None               # or (node addrs, op descriptions), zipped when first read (meta)
        self._descs = None                    # (the op descriptions of a derived or class-built program)
        self.n_nodes = n_nodes                # the graph's node count (a "final" barrier follows node n_nodes)
        self._log = None                      # the trace log of the compute in flight (trace_begin/trace_end)
        self._log_cap = 0
        self._caps = {}                       # n_threads -> records per thread (_trace_capacity)
        self._clock = None
        self.work_size = wsize
        self.sync = sync.new_sync()
        self.timings = np.zeros(0, np.int64)  # per-row cycle counts when profiling (set_profiling)
        self.plan_cache = {}                  # n_threads -> what ggml_graph_plan's node loop found (same graph)
        self.n_next = 1 << 30                 # threads for the next compute (see compute_thread)
        self.serial = next(_serials)          # tells programs apart in _last_compute (which holds no program)
        self.n_use_now = None                 # threads of the compute in flight, fixed before its kickoff
        self.wall = {}                        # n_use -> recent wall ns of a compute (exponential average)
        self.n_computes = 0                   # computes so far (the first decides nothing: _choose_threads)
        self.n_single = 0                     # computes run on one thread since the last probe ...
        self.single_ns = 0                    # ... and their time
        self.probe_every, self.probe_ns, self.probing = self.PROBE_EVERY, self.PROBE_NS, False
        if not trace.active:
            # (a new program on a machine whose cores are taken: see _machine_mode. Not one a listener records:
            # the views show ggml's walk on every thread it is given)
            self._adopt_machine_mode()
        self.sparse_work = []                 # (bytes, bytes per thread) of PowerInfer's AXPY rows
        self.row_ws = []                      # each row's work size (work_size is their max)
        self.plan_nodes = {}                  # n_threads -> ggml_graph_plan's per-node (n_tasks, work sizes)
        self.plan_from = None                 # a derived program: (the plan_nodes it came from, nodes changed,
        #                                       the first changed node of each one's words: _plan_groups)
        self.plan_groups = None               # a program built by classes (_build_by_class): every node, and the
        #                                       first node of equal words for each (_plan_groups)
        # rows of FLASH_ATTN_EXT: ggml's n_threads is written before each compute (the split-KV chunks)
        self.fa_rows = np.flatnonzero(P[:, OP] == OP_FLASH_ATTN)
        # rows of PowerInfer's MUL_MAT_SPARSE / AXPY: their threshold and n_threads are written before each compute
        self.sparse_rows = np.flatnonzero((P[:, OP] == OP_MUL_MAT_SPARSE) | (P[:, OP] == OP_AXPY)) \
            if len(P) else np.zeros(0, np.int64)

    def __len__(self):
        return self.P.shape[0]

    @property
    def meta(self) -> list:
        """Program row -> (node addr, op description): what the trace shows of each row. A derived or class-built
        program holds its two columns and zips them when somebody reads them (the trace expander, the tests)."""
        if self._meta_parts is not None:
            addrs, descs = self._meta_parts
            self._meta = list(zip(addrs.tolist(), descs))
            self._meta_parts = None
        return self._meta

    def _set_meta(self, addrs, descs) -> None:
        self._meta_parts = (addrs, descs)
        self._descs = descs

    def set_profiling(self, on: bool):
        self.timings = np.zeros(len(self) if on else 0, np.int64)

    # ggviz's thread policy for the compiled walk (ggml has none: it always uses every thread it is given).
    # With another process holding one of the cores, every one of the ~600 barriers of a decode waits for a
    # descheduled thread and two threads become several times slower than one. So: when a compute's threads spent
    # more than CONTENDED of its wall time asleep in barriers, the next compute runs on one thread; while on one
    # thread, every PROBE_EVERY computes one runs on all threads again, and the faster mode (per this graph, in
    # recent computes) is kept. Results do not depend on it (ggml's partitions give the same values).
    CONTENDED = 0.25
    PROBE_EVERY = 16              # computes on one thread before trying all threads again (doubles while they lose)
    PROBE_NS = 2_000_000_000      # ... or that much time

    def _choose_threads(self, n_max: int, n_use: int, wall_ns: int, wall_ticks: int) -> None:
        slept_ticks = int(self.sync[SYNC_SLEEP_TICKS])
        self.sync[SYNC_SLEEP_TICKS] = 0
        self.n_computes += 1
        if self.n_computes == 1:
            # a program's first compute is no sample of contention: it pays one-time costs in one thread while the
            # others sleep in a barrier (a process's first compute loads Numba's machine code in thread 0; the first
            # touches of a new graph's buffers). Counted, it sent a one-shot `ggviz run` to one thread for its
            # first 16 decode steps: ~17 ms a step where two threads take ~11.6 (SmolLM2, quiet 2-core machine).
            # One on one thread of more still counts towards the next probe (it may continue the probe schedule of
            # the program before it: _adopt_machine_mode)
            if n_use == 1 and n_max > 1:
                self._count_single(n_max, wall_ns)
            return
        prev = self.wall.get(n_use)
        self.wall[n_use] = wall_ns if prev is None else (prev * 3 + wall_ns) // 4
        if n_max <= 1:
            return
        if n_use > 1:
            slept_ns = slept_ticks * wall_ns / max(wall_ticks, 1)
            contended = slept_ns > self.CONTENDED * wall_ns * (n_use - 1)
            single = self.wall.get(1)
            if contended and (single is None or single < self.wall[n_use]):
                if self.probing:              # all threads lost again: wait longer before the next try
                    self.probe_every = min(self.probe_every * 2, 1024)
                    self.probe_ns = min(self.probe_ns * 2, 60_000_000_000)
                self.n_next, self.single_ns, self.n_single = 1, 0, 0
                _idle_mark[:] = _read_idle()              # watch the other cores from now on (_machine_idle)
            else:
                self.n_next = n_max
                self.probe_every, self.probe_ns = self.PROBE_EVERY, self.PROBE_NS
            self.probing = False
        else:
            self.n_single += 1
            self.single_ns += wall_ns
            multi = self.wall.get(n_max)
            if self.n_single >= self.probe_every or self.single_ns >= self.probe_ns:
                self.n_next, self.probing = n_max, True       # try all threads again
            elif multi is not None and multi < self.wall[1]:
                self.n_next = n_max                           # one thread got slower than all of them were
            elif _machine_idle(n_max):
                self.n_next, self.probing = n_max, True       # the other cores went idle: try them now

    def _count_single(self, n_max: int, wall_ns: int) -> None:
        """A program's first compute, run on one thread of n_max: towards the probe schedule, and a probe now if
        the other cores went idle (no wall sample: one-time costs)."""
        self.n_single += 1
        self.single_ns += wall_ns
        if self.n_single >= self.probe_every or self.single_ns >= self.probe_ns or _machine_idle(n_max):
            self.n_next, self.probing = n_max, True

    def _adopt_machine_mode(self) -> None:
        """Before a program's compute that follows another program's (a new program, or one that comes back): the
        thread mode the machine is in by the last compute (_machine_mode), with its probe schedule."""
        mode = _machine_mode()
        if mode is None:
            return
        self.probing = False
        if mode is _ALL:
            self.n_next = 1 << 30
        else:
            self.n_next = 1
            self.n_single, self.single_ns, self.probe_every, self.probe_ns = mode
            # its wall times on more threads are from before (another machine, as far as they go): "one thread got
            # slower than all of them were" must not send it back at once
            self.wall = {n: w for n, w in self.wall.items() if n == 1}

    # ---- tracing the compiled walk ------------------------------------------------------------------------------
    # The compiled walk cannot call Python per node, so when somebody listens each thread appends fixed-size records
    # (node spans, barrier waits, MUL_MAT chunk claims, timestamp-counter ticks) to its own part of one int64 array
    # (tr_rec); after the compute the caller hands the array over as one trace.Batch, which is turned into the
    # same cpu.node / cpu.barrier / cpu.chunk events as the node-by-node walk's only when somebody reads them.

    def _trace_capacity(self, n_threads: int) -> int:
        """Records one thread can write in one compute: a node and a barrier per row, a kernel barrier per MUL_MAT
        and at most every chunk of every MUL_MAT (ggml's chunking, bounded from above)."""
        cached = self._caps.get(n_threads)
        if cached is not None:
            return cached
        P = self.P
        cap = 2 * len(P) + 8
        for k in range(len(P)):
            op = P[k, OP]
            if op == OP_MUL_MAT_Q:
                cap += 1 + ((int(P[k, S0 + NE1]) + 7) // 8) * int(P[k, S1 + NE2]) + n_threads
            elif op == OP_MUL_MAT_SPARSE or op == OP_AXPY:
                cap += 2                      # the kernel barriers after INIT (and AXPY's before its reduction)
            elif op == OP_MUL_MAT_F:
                nr0 = int(P[k, DST + NE0])
                nr1 = int(P[k, DST + NE1]) * int(P[k, S1 + NE2]) * int(P[k, S1 + NE3])
                cap += 1 + ((nr0 + 15) // 16) * ((nr1 + 15) // 16) + 4 * n_threads
                # tinyBLAS (fast/sgemm.py): per matrix two barriers and at most (m/4) x (n/36 + 2) jobs
                mats = int(P[k, S1 + NE2]) * int(P[k, S1 + NE3])
                cap += mats * (2 + (nr0 // 4 + 1) * (int(P[k, DST + NE1]) // 36 + 2))
        self._caps[n_threads] = cap
        return cap

    def trace_begin(self, n_threads: int) -> None:
        """Give the compiled walk a zeroed log for ``n_threads`` threads (before the kickoff)."""
        cap = self._trace_capacity(n_threads)
        stride = 1 + cap * TR_REC
        if self._log is None or self._log_cap != cap or self._log.size < n_threads * stride:
            self._log = np.zeros(n_threads * stride, np.int64)
            self._log_cap = cap
        else:
            self._log[:n_threads * stride:stride] = 0          # the per-thread record counts
        self._log_threads = n_threads
        self.sync[SYNC_TRACE + 1] = cap
        self.sync[SYNC_TRACE] = self._log.ctypes.data
        self._clock = (time.perf_counter_ns(), kernels.time_ns())

    def trace_end(self, cgraph, pool: int, n_graph: int):
        """Stop logging; the compute's records as a trace.Batch (a copy: the log is reused)."""
        self.sync[SYNC_TRACE] = 0
        p1, c1 = time.perf_counter_ns(), kernels.time_ns()
        p0, c0 = self._clock
        stride = 1 + self._log_cap * TR_REC
        nth = self._log_threads
        parts = []
        dropped = 0
        for ith in range(nth):
            base = ith * stride
            n = int(self._log[base])
            m = min(n, self._log_cap)
            dropped += n - m
            if m:
                parts.append((ith, self._log[base + 1:base + 1 + m * TR_REC].reshape(m, TR_REC).copy()))
        ns_per_tick = (p1 - p0) / max(c1 - c0, 1)
        return trace.Batch(_FastTraceExpander(self, parts, p0, c0, ns_per_tick, pool, n_graph, dropped),
                           sum(len(r) for _, r in parts) + (1 if dropped else 0))

    def begin_compute(self, nth: int) -> None:
        """Fix the number of threads of the next compute (called by graph_compute before the kickoff)."""
        if _last_compute[3] != self.serial and not trace.active:
            self._adopt_machine_mode()     # another program computed since this one did: the machine as it left it
        self.n_use_now = max(1, min(min(nth, N_CPUS), self.n_next))
        self._cpu_now = [None] * max(nth, 1)        # each thread's CPU time in this compute (_last_compute)
        sparse.set_compute_params(self.P, self.F, self.sparse_rows, nth)
        if self.fa_rows.size:
            self.P[self.fa_rows, FA_NTH] = int(nth)      # the split-KV kernel's chunks follow ggml's nth

    def compute_thread(self, ith: int, nth: int, work_data) -> None:
        """Thread ith's walk over every node (ggml_graph_compute_thread, compiled). ``self.n_next`` (decided by
        thread 0 at the end of the previous compute, capped by nth and N_CPUS) threads take part, the others return
        at once; they split the work with ggml's ith/nth partitions."""
        n_max = min(nth, N_CPUS)
        # the thread count is fixed before the kickoff (begin_compute): reading n_next here would race with thread
        # 0, which may finish a one-thread compute and change n_next before a late worker has even looked at it
        # -- that worker would then wait in a barrier nobody else enters
        n_use = min(n_max, self.n_use_now) if self.n_use_now is not None else max(1, min(n_max, self.n_next))
        if ith >= n_use:
            return
        nbytes = work_data.nbytes if work_data is not None else 0
        if self.sparse_rows.size:
            # PowerInfer's kernels lay out the work buffer their own way: check it (every thread sees the same and
            # leaves before the first barrier, so the caller gets the error and nothing is overrun)
            need = max([self.work_size] + [a + nth * b for a, b in self.sparse_work])
            if nbytes < need:
                raise GGMLError(f"the compiled graph needs a work buffer of {need} bytes for {nth} threads, got "
                                f"{nbytes} (ggml_graph_plan's work_size includes it)")
        w = work_data.ctypes.data if nbytes else 0
        u0 = time.thread_time_ns()
        if ith == 0:
            t0 = time.perf_counter_ns()
        kernels.graph_compute_thread(self.P, self.F, w, self.sync.ctypes.data, ith, n_use, 0, len(self), self.timings)
        cpu = getattr(self, "_cpu_now", None)
        if cpu is not None and ith < len(cpu):
            cpu[ith] = time.thread_time_ns() - u0
        if ith == 0:
            wall_ns = time.perf_counter_ns() - t0
            # (the walk's own timestamp ticks, written by thread 0: calling the compiled time_ns from here cost a
            # process's first compute the load of its machine code, ~1.5 ms)
            self._choose_threads(n_max, n_use, wall_ns, int(self.sync[SYNC_TICKS + 1] - self.sync[SYNC_TICKS]))
            _last_compute[:] = [time.perf_counter_ns(), wall_ns, cpu or [], self.serial,
                                (self.n_single, self.single_ns, self.probe_every, self.probe_ns)
                                if n_use < n_max and self.n_next == 1 else None]
            err = int(self.sync[SYNC_ERROR])
            if err:
                k = int(self.sync[SYNC_ERROR + 1])
                self.sync[SYNC_ERROR] = 0
                what = {ERR_GET_ROWS_INDEX: "GGML_ASSERT(i01 >= 0 && i01 < ne01) failed",
                        ERR_SET_ROWS_INDEX: "GGML_ASSERT(i1 >= 0 && i1 < ne1) failed",
                        ERR_BARRIER_TIMEOUT: "a thread never reached the barrier"}.get(err, f"error {err}")
                where = (f"node {self.node_index[k]} {self.names[k]!r}" if 0 <= k < len(self.node_index)
                         else "the compiled graph")
                raise GGMLError(f"computing {where}: {what}")


# ggviz: what the thread policy knows of the machine when a program computes after another one (a new program, or
# one that comes back: the decode step after a prompt). The policy itself is per program and skips a program's first
# compute (one-time costs make it no sample), so on a machine whose cores other processes hold, each new program ran
# its first two computes on all threads: 75-120 ms where one thread took 6.6 (SmolLM2 decode, 2 threads, load
# average 4 on 2 cores). The last compute of the process tells it (_machine_mode):
#
# * one on all threads: the threads' CPU times against its wall time tell contention apart from one-time costs and
#   from uneven work: then one thread at least runs nearly all the time (a 128-token prompt's, quiet machine: thread 1
#   98 %, thread 0 73 %, asleep in barriers); when even the busiest ran under 1 - CONTENDED of it, every thread was
#   off its core part of the time (the same prompt under load 3: 56 % and 45 %): one thread; else all threads.
# * one the policy ran on one thread of more: its CPU time says nothing (one thread alone, nearly always on its core,
#   looks like a quiet machine); its program's mode does, and the next program continues it with its probe schedule
#   (n_single, single_ns, and the intervals), as if one program had run throughout. Without it, after a contended
#   128-token prompt on one thread, the decode program after it started on both: 40-44 ms for its first two steps
#   where one thread took 7 (SmolLM2, 2 threads, load 1.5 on 2 cores).
#
# Continuing one-thread mode costs a quiet machine a step on one thread where all threads would be faster (7-8 ms
# against 5.4), up to PROBE_EVERY of them when the load went away. So while on one thread the policy also watches
# the other cores (_machine_idle, _cores_free: the kernel's idle time of all CPUs, /proc/stat, and this process's
# CPU time): when, over the last IDLE_WINDOW_NS or more, they had room for the other threads, it tries all threads
# at once instead of waiting for the schedule; under load they had not, and nothing changes. A compute older than
# PROBE_NS tells nothing. Results do not depend on any of it (ggml's partitions give the same values).
_last_compute = [0, 0, [], None, None]   # the last compute: perf_counter_ns at its end, its wall ns, each thread's
#   CPU ns, its program's serial, and that program's probe schedule (n_single, single_ns, probe_every, probe_ns)
#   when it ran it on one thread of more and stays there
_ALL = "all"
_serials = itertools.count(1)
MIN_SAMPLE_NS = 1_000_000      # a shorter compute (a small split of a graph) tells nothing: wake-ups dominate it
IDLE_WINDOW_NS = 40_000_000    # /proc/stat counts idle time in USER_HZ ticks (10 ms): a window holds 4 or more
_idle_mark = [0, 0, 0]         # _read_idle where the current window of one-thread mode began (0: none)


def _machine_mode():
    """None: no recent compute, nothing to change; _ALL: all threads; else one thread, with the probe schedule
    (n_single, single_ns, probe_every, probe_ns) to continue."""
    t, wall, cpu, prog, single = _last_compute
    if not t:
        return _first_mode()
    if wall < MIN_SAMPLE_NS or time.perf_counter_ns() - t >= FastGraph.PROBE_NS:
        return None
    if single is not None:
        return single
    got = [c for c in cpu if c is not None]
    if got and max(got) < (1 - FastGraph.CONTENDED) * wall:
        _idle_mark[:] = _read_idle()
        return (0, 0, FastGraph.PROBE_EVERY, FastGraph.PROBE_NS)
    return _ALL


def _read_idle():
    """[perf_counter_ns, idle + iowait ticks of all CPUs (-1: not known), this process's CPU ns]."""
    try:
        with open("/proc/stat", "rb") as f:
            w = f.readline().split()
        idle = int(w[4]) + int(w[5])          # "cpu  user nice system idle iowait ..."
    except (OSError, ValueError, IndexError):
        idle = -1
    return [time.perf_counter_ns(), idle, time.process_time_ns()]


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_start_mark = _read_idle()     # when the engine was imported (_first_mode)


def _cores_free(mark, now, n_max: int):
    """Over the span from ``mark`` to ``now`` (_read_idle), while this process ran on one thread: was there room
    for its n_max - 1 other threads? The room beside its own thread is the CPUs' idle time plus what this process
    used, less one thread's span (idle + own CPU - span; the other processes' load is what it leaves out), and it
    must reach 1 - CONTENDED of those threads' span. None: not known, or a span under IDLE_WINDOW_NS."""
    span = now[0] - mark[0]
    if not mark[0] or mark[1] < 0 or now[1] < 0 or span < IDLE_WINDOW_NS:
        return None
    room = (now[1] - mark[1]) * 1_000_000_000 // _CLK_TCK + (now[2] - mark[2]) - span
    return room >= (1 - FastGraph.CONTENDED) * (min(n_max, N_CPUS) - 1) * span


def _first_mode():
    """The process's first compute: nothing computed yet to tell contention, but since the engine was imported the
    process ran on one thread (imports, model load, graph builds): room for one more thread over that span (see
    _cores_free), or not known -> all threads, as ggml; none -> one thread, a fresh probe schedule. Under load 2
    on 2 cores the first 4-token prompt of a fresh process took 50-60 ms on two threads, 13-15 on one (SmolLM2)."""
    now = _read_idle()
    if _cores_free(_start_mark, now, 2) is not False:
        return None
    _idle_mark[:] = now
    return (0, 0, FastGraph.PROBE_EVERY, FastGraph.PROBE_NS)


def _machine_idle(n_max: int) -> bool:
    """While on one thread of n_max: was there room for the other threads over the window since _idle_mark
    (_cores_free)? A window that is judged starts the next one."""
    if not _idle_mark[0]:
        return False
    now = _read_idle()
    free = _cores_free(_idle_mark, now, n_max)
    if free is None and now[0] - _idle_mark[0] < IDLE_WINDOW_NS:
        return False
    _idle_mark[:] = now
    return bool(free)


class _FastTraceExpander:
    """Turns one compiled compute's log into the node-by-node walk's event dicts (called lazily by trace.Batch)."""

    _WHERE = {TRW_NODE: "node", TRW_FINAL: "final", TRW_KERNEL: "kernel"}

    def __init__(self, fg, parts, p0, c0, ns_per_tick, pool, n_graph, dropped):
        self.fg, self.parts = fg, parts
        self.p0, self.c0, self.scale = p0, c0, ns_per_tick
        self.pool, self.n_graph, self.dropped = pool, n_graph, dropped

    def __call__(self) -> list[dict]:
        fg = self.fg
        idx, names, meta, P = fg.node_index, fg.names, fg.meta, fg.P
        pool, n_graph = self.pool, self.n_graph
        out = []
        for ith, rec in self.parts:
            # ticks -> perf_counter ns, vectorized
            ts = (self.p0 + (rec[:, 8:10] - self.c0) * self.scale).astype(np.int64)
            for r, (t0, t1) in zip(rec.tolist(), ts.tolist()):
                kind, k = r[0], r[1]
                if kind == TR_NODE:
                    addr, op = meta[k]
                    out.append({"kind": "cpu.node", "ith": ith, "node_n": idx[k], "addr": addr, "name": names[k],
                                "op": op, "t_start": t0, "t_end": t1,
                                "fused": bool(P[k, OP] == OP_RMS_NORM and P[k, SUBOP] == 1), "pool": pool,
                                "n_graph": n_graph, "compiled": True, "t": t1, "kernel": row_kernel(P, k)})
                elif kind == TR_BARRIER:
                    final = k >= len(idx)
                    out.append({"kind": "cpu.barrier", "ith": ith, "pool": pool, "n_graph": n_graph, "seq": r[3],
                                "where": self._WHERE.get(r[2], str(r[2])),
                                "node_n": fg.n_nodes if final else idx[k], "name": None if final else names[k],
                                "t_enter": t0, "t_exit": t1, "compiled": True, "t": t1})
                elif kind == TR_CHUNK:
                    out.append({"kind": "cpu.chunk", "ith": ith, "node": names[k], "chunk": r[2],
                                "nchunk": (r[7] >> 32, r[7] & 0xFFFFFFFF), "ir0": (r[3], r[4]), "ir1": (r[5], r[6]),
                                "t_start": t0, "t_end": t1, "pool": pool, "n_graph": n_graph, "compiled": True,
                                "t": t1})
        if self.dropped:
            out.append({"kind": "trace.dropped", "what": "compiled walk records", "n": self.dropped, "pool": pool,
                        "n_graph": n_graph, "t": self.p0})
        return out


def _graph_signature(cgraph):
    """Bytes that change whenever the graph's nodes change: the arena of the graph's context (all node structs,
    with their data pointers, shapes, strides, op params and src pointers, live there) -- a view of it (as words
    where it is whole words: compared without a bytes copy of ~480 KB at every plan)."""
    ctx = cgraph.ctx
    if ctx is None:
        return None
    used = ctx.used_mem()
    b = ctx.mem_buffer[:used]
    return b.view(np.uint64) if used % 8 == 0 else b


def _same_signature(kept, sig) -> bool:
    return kept.dtype == sig.dtype and kept.shape == sig.shape and bool((kept == sig).all())


def _keep_signature(cache, sig):
    """A copy of the view ``sig`` to keep with a program: into the graph's last kept one where it has the size
    (no new pages), else new."""
    old = cache[0] if cache is not None else None
    if old is not None and old.dtype == sig.dtype and old.shape == sig.shape:
        np.copyto(old, sig)
        return old
    return sig.copy()


def plan_graph(cgraph, n_threads: int):
    """The compiled program for ``cgraph``, or None when the graph must take the node-by-node walk (no weight in
    CPU_REPACK, or an op/type the compiled kernels do not cover). Cached on the graph while its nodes are
    unchanged (llama.cpp reuses graphs between decodes)."""
    if not repack.in_use() or not repack.available():
        return None
    sig = None
    cache = getattr(cgraph, "_ggviz_fast", None)
    if cache is not None and getattr(cgraph, "ctx", None) is not None:
        sig = _graph_signature(cgraph)
        if cache[2] == cgraph.n_nodes and _same_signature(cache[0], sig):
            return cache[1]
    if not _has_repacked_mul_mat(cgraph):
        return None
    # a program derived from the last one of the same topology (only shapes, places and buffers changed), or
    # built; never while somebody records (a recorded step shows the compiler's real work)
    fg = None
    topo = False                                        # (not worked out: no derivation)
    parent = getattr(cgraph, "view_parent", None)
    if DERIVE and (parent is None or getattr(parent, "view_of", None) is None):
        # (a whole graph or a scheduler's split: not the eval callback's segments, one-off views of a split; not a
        # PowerInfer graph, whose sparse rows read settings outside the tensors' structs -- the context's hybrid
        # flag, the device's row split -- that the topology key does not hold. A graph, or a split that is all of
        # its graph -- a CPU-only model's -- is asked through its tensor table's op words)
        root = getattr(cgraph, "view_of", None)
        nodes = cgraph.nodes
        whole = root is None or (len(nodes) == len(root.nodes) and all(map(operator.is_, nodes, root.nodes)))
        if whole or not _powerinfer_graph(cgraph):
            topo = _topo_of(cgraph)
            if topo is not None and topo.powerinfer:
                topo = False
        if topo and not trace.active:
            fg = _derive(cgraph, topo)
    if fg is None and topo and not trace.active:
        fg = _build_by_class(cgraph, topo)
    if fg is None:
        fg = _build(cgraph, require_repack=False, memo=topo)   # (the test above stood for require_repack)
    if fg is not None and getattr(cgraph, "ctx", None) is not None:
        if sig is None:
            sig = _graph_signature(cgraph)
        try:
            cgraph._ggviz_fast = (_keep_signature(cache, sig), fg, cgraph.n_nodes)
        except AttributeError:
            pass
    return fg


def compile_graph(cgraph, require_repack: bool = False):
    """The FastGraph of ``cgraph`` (None if some node has no compiled kernel). Unlike ``plan_graph`` this does not
    need a CPU_REPACK weight in the graph and does not cache: for tests and the views."""
    return _build(cgraph, require_repack)


def _powerinfer_graph(cgraph) -> bool:
    """Does the graph (or the graph it was cut from) hold PowerInfer's sparse ops?"""
    root = getattr(cgraph, "view_of", None)
    return any(x.op in _POWERINFER_OPS for x in (cgraph.nodes if root is None else root.nodes))


def _has_repacked_mul_mat(cgraph) -> bool:
    """Cheap test before compiling: does some MUL_MAT read a weight that has CPU_REPACK traits? A view (a split, or
    the node range between two nodes the eval callback asked for) may hold none, so for those the graph it was cut
    from decides. A PowerInfer graph's views ask the root: the sparse kernels and the predictor read the plain
    layout, and a segment of a compiled PWRI model's graph runs compiled too (the same bits; the node-by-node NumPy
    walk of ~300 segments cost a captured run ~2x its time). A dense graph's eval-callback segment (a view of a
    split) runs as its split does: compiled when the split holds a repacked MUL_MAT, so that a step-through of a
    repacked model computes its KQ / KQV (F16 / F32) MUL_MATs and its other ops with the compiled kernels -- the
    same bits as the faithful ones (fast/sgemm.py is tinyBLAS lane for lane), not the NumPy lane emulation that
    cost such a decode ~60 % of its time. A split itself keeps its own rule, and a model whose weights stay in
    the mapping (``use_extra_bufts=False``) has no repacked MUL_MAT anywhere: every node on the faithful kernels."""
    if _repacked_mul_mat_in(cgraph.nodes):
        return True
    root = getattr(cgraph, "view_of", None)
    if root is None:
        return False
    n = len(root.nodes)
    cached = getattr(root, "_ggviz_pwri_compiled", None)
    if cached is None or cached[0] != n:
        cached = (n, any(x.op in _POWERINFER_OPS for x in root.nodes) and _repacked_mul_mat_in(root.nodes))
        try:
            root._ggviz_pwri_compiled = cached
        except AttributeError:
            pass
    if cached[1]:
        return True
    split = getattr(cgraph, "view_parent", None)
    if split is None or getattr(split, "view_of", None) is None:      # a split (cut from the root), or no parent
        return False
    nodes = split.nodes
    cached = getattr(split, "_ggviz_split_repacked", None)
    if cached is None or cached[0] is not nodes or cached[1] != len(nodes):
        cached = (nodes, len(nodes), _repacked_mul_mat_in(nodes))
        try:
            split._ggviz_split_repacked = cached
        except AttributeError:
            pass
    return cached[2]


def _repacked_mul_mat_in(nodes) -> bool:
    mm = C.GGML_OP_MUL_MAT
    for node in nodes:
        if node.op == mm:
            s0 = node.src[0]
            if s0 is not None and s0.extra and repack.tensor_traits_of(s0) is not None:
                return True
    return False


def _build_mul_mat(P, k, node):
    """MUL_MAT's row: the repacked (CPU_REPACK extra) or the float kernel; returns (work size, repacked?)."""
    s0, s1 = node.src[0], node.src[1]
    tr = repack.repack_buffer_type().context.get_tensor_traits(node) if repack.in_use() else None
    _need(int(node.nb[0]) == 4 and int(s1.nb[0]) == 4)
    if tr is not None:
        rw = s0.py_extra
        _need(int(s1.ne[3]) == 1 and int(node.ne[3]) == 1)
        P[k, OP] = OP_MUL_MAT_Q
        P[k, MMQ_TYPE] = s0.type
        P[k, MMQ_QS], P[k, MMQ_D], P[k, MMQ_M] = rw.ptrs
        return tr.work_size(1, node), True
    else:
        _need(s0.type in (GGML_TYPE_F16, GGML_TYPE_F32) and s1.type == GGML_TYPE_F32)
        _need(int(s0.nb[0]) == (2 if s0.type == GGML_TYPE_F16 else 4))
        _need(int(s1.ne[2]) % int(s0.ne[2]) == 0 and int(s1.ne[3]) % int(s0.ne[3]) == 0)
        P[k, OP] = OP_MUL_MAT_F
        P[k, MMF_TYPE] = s0.type
        P[k, MMF_LLAMAFILE] = 1 if mul_mat.USE_LLAMAFILE else 0     # the build's GGML_USE_LLAMAFILE
        P[k, MMF_LANES] = cpu_feats.variant_lanes()                  # tinyBLAS<8, __m256> / <16, __m512>
        return (2 * nelements(s1) if s0.type == GGML_TYPE_F16 else 0), False


def _build_rms_norm(P, F, k, cgraph, i, node, slot) -> int:
    """RMS_NORM's row, fused with the MUL that follows when ggml-cpu fuses them; returns the nodes it swallowed."""
    s0 = node.src[0]
    _need(s0.type == GGML_TYPE_F32 and node.type == GGML_TYPE_F32 and int(s0.nb[0]) == 4)
    _need(int(node.nb[0]) == 4)
    P[k, OP] = OP_RMS_NORM
    F[k, RMS_NORM_EPS] = float(np.frombuffer(node.op_params[:1].tobytes(), np.float32)[0])
    mul = can_fuse_rms_norm_mul(cgraph, i)
    if mul is not None:
        a0 = mul.src[0]
        w = mul.src[1] if (a0 is not None and a0.addr == node.addr) else a0
        P[k, SUBOP] = 1
        _desc(P, k, DST, mul)
        _desc(P, k, S1, w)
        slot[0], slot[2] = mul, w
        return 1
    return 0


def _build_swiglu(P, k, node):
    """GLU (SWIGLU)'s row: one input split in halves, or two inputs."""
    s0, s1 = node.src[0], node.src[1]
    _need(get_glu_op(node) == C.GGML_GLU_OP_SWIGLU and s0.type == GGML_TYPE_F32)
    _need(int(s0.nb[0]) == 4 and int(node.nb[0]) == 4)
    if s1 is not None:
        _need(s1.type == GGML_TYPE_F32 and int(s1.nb[0]) == 4)
    nc = int(s0.ne[0]) if s1 is not None else int(s0.ne[0]) // 2
    P[k, OP] = OP_SWIGLU
    P[k, SWIGLU_NC] = nc
    P[k, SWIGLU_SWAPPED] = get_op_params_i32(node, 1)
    P[k, SWIGLU_NROWS] = nrows(s0)
    P[k, SWIGLU_LANES] = cpu_feats.variant_lanes()
    if s1 is None:
        P[k, S1 + DATA] = 0


# ---- ggviz: a program derived from the previous program of the same topology
#
# A new batch shape is a new graph: llama.cpp builds and plans it in microseconds, ggviz compiled ~500 rows in Python
# (~25 ms) and planned ~900 nodes (~12 ms) again. But the graph of a new n_kv (every 256 cells), or the decode graph
# of another context of the model, has the nodes of one compiled before -- the same ops reading the same operands,
# in the same order -- and differs in shapes, places and buffers only. So each compiled program is remembered under
# its graph's topology (``_Topo``: every node's and leaf's sources and view source as positions in one tensor
# table, the repacked weights' block addresses, the settings the rows bake in), with every tensor's struct words but
# for pointers; a graph of the same topology takes the remembered rows, with the descriptors (data, ne, nb) read
# from its own structs and every row that reads a tensor whose other words changed rebuilt by the row builder
# (``_build_row``). What a row holds is a function of those words (its node's and its sources' types, shapes,
# op params, flags, whether data is set, buffer types) and of the repacked weights: equal words, equal row
# (tests/test_graph_cache.py compares derived and fresh programs, plans and logits). The one data pointer a row
# holds beyond the descriptors' (FLASH_ATTN_EXT's mask) is read from the words of every such row's mask; graphs
# with PowerInfer's rows (operand contents checked at build) are never derived. ``ggml_graph_plan``'s per-node loop
# is derived the same way (``FastGraph.plan_from``: the nodes whose words changed are planned again, one of each
# group of equal ones).

DERIVE = True                 # tests turn it off to compare derived programs with fresh builds
MEMO_SIZE = 8                 # topologies remembered (a context's decode, prompt shapes; other contexts')
SHAPES_PER_TOPO = 4           # programs remembered per topology (the one closest to a new graph is taken)
_memo: OrderedDict = OrderedDict()
_memo_lock = threading.Lock()
_NW = C.GGML_TENSOR_SIZE // 8                       # 42 words a struct
_W_BUF, _W_SRC, _W_VIEW_SRC, _W_DATA, _W_NAME = 1, 19, 29, 31, 32
# the columns of the masked words (_Topo.Wm): all but src[] / view_src and name, which the masking zeroed (left out:
# half the words to copy, compare and hash); data (as set / unset) is column _WM_DATA there, buffer column _W_BUF
_WM_COLS = np.r_[0:_W_SRC, _W_VIEW_SRC + 1:_W_NAME, _W_NAME + 8:_NW]
_WM_DATA = int(np.flatnonzero(_WM_COLS == _W_DATA)[0])
_NREF = C.GGML_MAX_SRC + 1                          # src[] and view_src
# A repacked MUL_MAT's row holds its weight's repacked blocks, which no word tells apart (a repacked weight's
# ``extra`` is its type's traits, shared): it is copied from an equal row all but those (MMQ_QS .. MMQ_M), which stay
# the remembered row's -- the same weight, as the topology key holds each table position's repacked blocks. A
# FLASH_ATTN_EXT row holds its mask's data pointer (FA_MASK, beyond the descriptors): every such row, built, copied
# or taken over, gets its own mask's from the struct words
_MMQ_PTRS = slice(MMQ_QS, MMQ_M + 1)
_W32_OP, _W32_FLAGS = 20, 37                        # op and flags as int32 words of the struct
_EMPTY_OPS = np.array(sorted(EMPTY_OPS), np.int64)
_EMPTY_LUT = np.zeros(int(_EMPTY_OPS.max()) + 1, bool)      # op -> a view op (is_empty's first test)
_EMPTY_LUT[_EMPTY_OPS] = True
_DESC_END = S2 + NB3 + 1                            # the descriptor columns: DST .. S2's nb[3]
_DESC_WORDS = np.array([_W_DATA, 2, 3, 4, 5, 6, 7, 8, 9])  # a descriptor's words: data, ne[0..3], nb[0..3]
assert (S0 - DST, S1 - S0, S2 - S1, _DESC_END - S2) == (len(_DESC_WORDS),) * 4 and (DATA, NE0, NB3) == (0, 1, 8)


class _Topo:
    """A graph's tensor table: nodes, leafs, then the tensors they reference from outside the graph (weights, the
    KV cache), in order of first reference; their struct words (``W``), the words but for pointers (``Wm``: src,
    view_src and name zeroed, data as set / unset, buffer as its buffer type), each one's references (``refs``:
    positions in the table, -1 for NULL) and the topology key."""

    def __init__(self, cgraph):
        nodes, leafs = cgraph.nodes, cgraph.leafs
        T = list(nodes) + list(leafs)
        n_in = len(T)
        addrs = np.fromiter((t.addr for t in T), np.uint64, n_in)
        # (room for the tensors referenced from outside too: a decode graph's table is ~1.4x its nodes and leafs; a
        # scratch grown below copies what it holds)
        W = _gather_words(_table_scratch(2 * n_in + 64), 0, T, addrs)
        ops = W[:len(nodes)].view(np.int32)[:, _W32_OP]
        self.powerinfer = bool(((ops == GGML_OP_MUL_MAT_SPARSE) | (ops == GGML_OP_AXPY)).any())   # (its ops)
        if self.powerinfer:
            return                    # (a PowerInfer graph: never derived nor remembered, so no table to finish)
        ref = W[:, _W_SRC:_W_SRC + _NREF]
        # each reference as a table position: looked up among the graph's own tensors by address (the ~70 % of
        # slots that are NULL left out of the search), then the tensors outside the graph appended
        refs = np.full(ref.shape, -1, np.int64)
        nz = ref != 0
        rq = ref[nz]
        order = np.argsort(addrs, kind="stable")
        sa = addrs[order]
        pos = np.minimum(np.searchsorted(sa, rq), max(n_in - 1, 0))
        found = (sa[pos] == rq) if n_in else np.zeros(rq.shape, bool)
        if n_in:
            refs[nz] = np.where(found, order[pos], -1)
        if not found.all():
            flat = rq[~found]
            ext_addrs, first, inv = np.unique(flat, return_index=True, return_inverse=True)
            by_first = np.argsort(first)                    # in order of first reference
            rank = np.empty(len(first), np.int64)
            rank[by_first] = np.arange(len(first))
            ext = ext_addrs[by_first]
            T += _tensors_at(ext.tolist())
            W = _words_into(_table_scratch(len(T) + 1, keep=n_in), n_in, T[n_in:])
            q = refs[nz]
            q[~found] = n_in + rank[inv.ravel()]
            refs[nz] = q
        W = _table_scratch(len(T) + 1, keep=len(T))[:len(T) + 1]
        W[len(T)] = 0
        # the words with a zero row after the last tensor's (index -1: a NULL reference reads zeros), as int64 (the
        # thread's scratch: a table lives while its graph is planned; what is kept -- Wm, the memo's -- is copied)
        self.Wz = W.view(np.int64)
        W = W[:len(T)]
        self.T, self.W, self.refs = T, W, refs
        self.n_nodes, self.n_in = len(nodes), n_in
        self.addrs = addrs                        # the nodes' and leafs' struct addresses (the rows' trace meta)
        # the masked words: the columns but src / view_src and name (zero there: left out), data as set / unset,
        # buffer as its buffer type
        Wm = W[:, _WM_COLS]
        Wm[:, _WM_DATA] = W[:, _W_DATA] != 0
        bufs = W[:, _W_BUF]
        for b in np.unique(bufs).tolist():
            if b:
                buf = backend._buffers.get(b)
                Wm[bufs == b, _W_BUF] = id(buf.buft) if buf is not None else b
        self.Wm = Wm
        # a repacked weight's row holds the addresses of its repacked blocks (tensor->extra's, not the struct's):
        # they are part of the key (not the tensor's address: a freed weight's struct address comes back)
        RW = repack.RepackedWeight
        extras = list(map(_py_extra, T))
        rw_at = [j for j in itertools.compress(range(len(T)), map(is_not, extras, _NONES)) if type(extras[j]) is RW]
        rw_ptrs = [extras[j].ptrs for j in rw_at]
        self.rw = rw = tuple(zip(rw_at, rw_ptrs))     # (table position, repacked blocks) of each repacked weight
        # (the references as int16 where the table allows: the key is hashed at each plan, a quarter of the bytes)
        small = np.int16 if len(T) < 2 ** 15 else np.int64
        self.key = (self.n_nodes, n_in, len(T), refs.astype(small).tobytes(), rw, repack.in_use(),
                    cpu_feats.variant_lanes(), mul_mat.USE_LLAMAFILE, cpu_ops.FA_S_FMA, cpu_ops.FA_REDUCE_FMA)
        # each tensor's class of equal masked words (equal ids: equal Wm rows), -1 appended for NULL, and whether
        # it is a repacked weight (which no word tells: its ``extra`` is its type's shared traits): the keys of the
        # groups of equal rows and plans (_derive), 12 small ints a node instead of its and its sources' 504 words
        self.wid = np.append(_row_classes(Wm), -1)
        self.is_rw = np.zeros(len(T) + 1, np.int64)
        self.is_rw[rw_at] = 1


_py_extra = operator.attrgetter("py_extra")
_NONES = itertools.repeat(None)


def _tensors_at(addrs: list) -> list:
    """tensor_at of each address (ValueError: no live tensor there), one lookup of the registry's weak references
    for all of them."""
    if not addrs:
        return []
    try:
        refs = operator.itemgetter(*addrs)(_registry_refs)
    except KeyError:
        raise ValueError("no ggml_tensor at one of the referenced addresses") from None
    ts = [r() for r in refs] if len(addrs) > 1 else [refs()]
    if any(t is None for t in ts):
        raise ValueError("no ggml_tensor at one of the referenced addresses")
    return ts


def _gather_words(buf, at: int, T, addrs) -> np.ndarray:
    """The struct words of tensors ``T`` (their struct addresses ``addrs``) written to rows ``at`` .. of ``buf``;
    returns ``buf[:at + len(T)]``. Those whose structs lie in the first one's context arena (a graph's nodes do)
    are read from it in one gather (tensor.gather_structs, its word indices in this thread's scratch), instead of
    a copy per tensor; the others one by one."""
    n = len(T)
    if n:
        idx = getattr(_scratch, "index", None)
        if idx is None or len(idx) < n:
            idx = _scratch.index = np.empty((2 * n, _NW), np.intp)
        gather_structs(T, addrs.astype(np.int64), buf[at:at + n], idx[:n])
    return buf[:at + n]


_scratch = threading.local()


def _table_scratch(rows: int, keep: int = 0) -> np.ndarray:
    """This thread's buffer for a tensor table's words, at least ``rows`` x 42 (its first ``keep`` rows kept when it
    grows). The table of a decode graph is ~1,550 tensors, 520 KB: a new array for it at every plan (and a second one
    when the weights' words were appended) took fresh pages from the kernel each time, ~240 page faults of the
    ~310 a new decode shape's _Topo took (~7 us each on this VM)."""
    buf = getattr(_scratch, "words", None)
    if buf is None or len(buf) < rows:
        new = np.empty((max(rows, 2 * len(buf) if buf is not None else rows), _NW), np.uint64)
        if keep:
            new[:keep] = buf[:keep]
        _scratch.words = buf = new
    return buf


def _words_into(buf, at: int, T) -> np.ndarray:
    """The struct words of tensors ``T`` written to rows ``at`` .. of ``buf``; returns ``buf[:at + len(T)]``."""
    if T:
        np.concatenate([t._q for t in T], out=buf[at:at + len(T)].reshape(-1))
    return buf[:at + len(T)]


_ROW_HASH = np.random.default_rng(0x6767).integers(1, 2 ** 63, size=64, dtype=np.uint64) | np.uint64(1)


def _classes(A) -> tuple:
    """(id, first) for the rows of the 2-D integer array ``A`` (at most 64 columns): ``id`` equal for equal rows
    and only for them, ``first[id]`` the first row of each. Rows grouped by a 64-bit hash of their words, every row
    then compared with its group's first (a collision, never seen, falls back to sorting the rows themselves)."""
    if not len(A):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    A = np.ascontiguousarray(A).view(np.uint64)
    h = A.dot(_ROW_HASH[:A.shape[1]])         # (integer dot, no BLAS: wraps modulo 2**64; no rows x words temporary)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.ravel()
    rep = first[inv]
    # (compared a block of rows at a time: temporaries below malloc's mmap threshold, pages reused, not faulted in)
    step = max(1, 8192 // A.shape[1])
    if not all((A[a:a + step] == A[rep[a:a + step]]).all() for a in range(0, len(A), step)):
        _, first, inv = np.unique(A.view(np.dtype((np.void, A.shape[1] * 8))).ravel(), return_index=True,
                                  return_inverse=True)
        inv = inv.ravel()
    return inv.astype(np.int64), first.astype(np.int64)


def _row_classes(Wm) -> np.ndarray:
    """An id per row of ``Wm``, equal for equal rows and only for them."""
    return _classes(Wm)[0]


def _first_of_class(A) -> np.ndarray:
    """For each row of ``A``, the index of the first row equal to it."""
    inv, first = _classes(A)
    return first[inv]


class _Memo:
    """What a program's derivation reads of it (not the FastGraph: its sync words, thread policy and trace log stay
    with the graph that has it): its rows, their nodes, descriptor tensors (positions in the tensor table) and
    work sizes, and its plans (``plan_nodes``: filled by ggml_graph_plan after the compile)."""
    __slots__ = ("Wm", "P", "F", "node_index", "descs", "row_ws", "plan_nodes", "slots", "fused", "names",
                 "name_words")

    def __init__(self, Wm, fg, slots, fused, name_words):
        self.Wm, self.slots, self.fused = Wm, slots, fused
        self.P, self.F, self.node_index = fg.P, fg.F, fg.node_index
        self.descs = fg._descs if fg._descs is not None else [d for _, d in fg.meta]
        self.row_ws, self.plan_nodes = fg.row_ws, fg.plan_nodes
        self.names, self.name_words = fg.names, name_words      # the rows' names and their name words


def _topo_of(cgraph):
    """The graph's _Topo, or None (a reference to no live tensor, or a buffer nobody knows: nothing to remember)."""
    try:
        return _Topo(cgraph)
    except (ValueError, KeyError):
        return None


def _memo_store(topo, fg, slots) -> None:
    """Remember ``fg`` (just built for the graph of ``topo``) under its topology."""
    where = {t.addr: j for j, t in enumerate(topo.T)}
    try:
        ids = np.array([[-1 if t is None else where[t.addr] for t in slots[k]] for k in range(len(fg))],
                       np.int64).reshape(len(fg), 4)
    except KeyError:            # a row describes a tensor outside the table: not derivable, not remembered
        return
    _memo_put(topo.key, _Memo(topo.Wm, fg, ids, (fg.P[:, OP] == OP_RMS_NORM) & (fg.P[:, SUBOP] == 1),
                              _name_words(topo.Wz, np.asarray(fg.node_index, np.int64))))


def _memo_put(key, m, equal=()) -> None:
    """Remember ``m`` first among the programs of its topology (one per set of shapes: a prompt's and a decode
    step's graphs can share a topology), at most SHAPES_PER_TOPO of them, MEMO_SIZE topologies. ``equal``: those
    already known to have its words (_derive compared them), replaced without a second comparison."""
    with _memo_lock:
        same = [o for o in _memo.get(key, ())
                if not any(o is e for e in equal) and not np.array_equal(o.Wm, m.Wm)]
        _memo[key] = [m] + same[:SHAPES_PER_TOPO - 1]
        _memo.move_to_end(key)
        while len(_memo) > MEMO_SIZE:
            _memo.popitem(last=False)


def _empty_rows(Wr) -> np.ndarray:
    """ggml_cpu's is_empty for the struct words ``Wr`` (one row each): a view op, not computed, or no elements."""
    w32 = Wr.view(np.int32)
    ops = w32[:, _W32_OP]
    inr = (ops >= 0) & (ops < len(_EMPTY_LUT))
    view = _EMPTY_LUT[np.where(inr, ops, 0)] & inr
    return view | ((w32[:, _W32_FLAGS] & C.GGML_TENSOR_FLAG_COMPUTE) == 0) | (Wr[:, 2:6] == 0).any(axis=1)


def _set_descriptors(P, rows, W, slots) -> None:
    """Rows ``rows`` of ``P``: the DST / S0 / S1 / S2 descriptors (data, ne, nb) from the struct words of the
    tensors in ``slots`` (one row of 4 table positions each; a NULL slot reads the zero row) -- the words read, not
    whole structs."""
    D = W[:, _DESC_WORDS]                       # (each tensor's data, ne, nb: a descriptor's order)
    P[rows, DST:_DESC_END] = D[slots].reshape(len(slots), 4 * len(_DESC_WORDS))


def _rows_have_data(W, refs, nodes) -> bool:
    """_build_row's check for rows not built by it (taken over or copied): every tensor they describe (the node
    ``nodes[j]`` and its src[0..2]) that has elements has data."""
    if not nodes.size:
        return True
    chk = np.concatenate([nodes[:, None], refs[nodes, :3]], axis=1)
    has = (W[chk, 2:6] != 0).all(axis=2) & (chk >= 0)                # (rows, 4): ne words all set
    return not (has & (W[chk, _W_DATA] == 0)).any()


def _set_fa_masks(P, W, refs, idx) -> bool:
    """Each FLASH_ATTN_EXT row's own mask (src[3]) where this graph has one; False when a mask has no data
    (fattn.build_node: such a mask takes no compiled row, so the program must be built)."""
    fa = np.flatnonzero(P[:, OP] == OP_FLASH_ATTN)
    if fa.size:
        masked = fa[P[fa, FA_MASK] != 0]
        mdata = W[refs[idx[masked], 3], _W_DATA]
        if (mdata == 0).any():
            return False
        P[masked, FA_MASK] = mdata
    return True


def _name_words(W, idx) -> np.ndarray:
    """The rows' name words (a copy: what a remembered program's names were read from)."""
    return W[idx, _W_NAME:_W_NAME + 8]


def _row_names(W, idx) -> list:
    """The names of the rows' nodes, from the tensor table's name words."""
    sel = W[idx, _W_NAME:_W_NAME + 8].tobytes()
    return [sel[j * 64:(j + 1) * 64].partition(b"\0")[0].decode("utf-8", "replace") for j in range(len(idx))]


def _derive(cgraph, topo):
    """The program of ``cgraph`` (its tensor table ``topo``) from the remembered program of its topology, or None
    (none remembered, or the graph's rows would not be the remembered ones': then it is built)."""
    with _memo_lock:
        cands = list(_memo.get(topo.key, ()))
    if not cands:
        return None
    # the remembered program whose graph is closest: the fewest tensors changed
    diffs = [(topo.Wm != o.Wm).any(axis=1) for o in cands]
    best = min(range(len(cands)), key=lambda j: int(diffs[j].sum()))
    m = prev = cands[best]
    n = topo.n_nodes
    nodes = cgraph.nodes
    changed = np.append(diffs[best], False)         # (index -1: NULL, unchanged)
    refs = topo.refs[:n, :C.GGML_MAX_SRC]
    node_changed = changed[:n] | changed[refs].any(axis=1)
    idx = np.asarray(prev.node_index, np.int64)
    k_n = len(idx)
    rebuild = node_changed[idx]
    rebuild[m.fused] |= node_changed[idx[m.fused] + 1]
    W = topo.Wz
    # the rows are the remembered ones: every changed node that was no row is still empty or swallowed by a fusion
    # (is_empty: a view op, not computed, or no elements -- from the struct words of all of them at once) ...
    is_row = np.zeros(n, bool)
    is_row[idx] = True
    is_row[idx[m.fused] + 1] = True
    other = np.flatnonzero(node_changed & ~is_row)
    if other.size:
        if not _empty_rows(W[other]).all():
            return None
    wid = topo.wid
    rms_key = _fusions_hold(cgraph, topo, m, idx)
    if rms_key is None:
        return None
    P, F = prev.P.copy(), prev.F.copy()
    # the descriptors from this graph's structs (a NULL slot reads the zero row)
    _set_descriptors(P, slice(None), W, m.slots)
    row_ws = list(prev.row_ws)
    descs = list(prev.descs)
    slots = {}
    rb = np.flatnonzero(rebuild)
    # rows whose node's and sources' words (pointers masked: topo.Wm) are equal are equal but for their descriptors:
    # one row of each such group is built, the others take its columns (a new batch shape changes every row, and a
    # decode graph's 30 layers repeat the same ones: a 1-token step after a prompt built 305 rows, 210 of them the
    # repacked MUL_MATs). An RMS_NORM row's key holds its fusion's (above); a repacked MUL_MAT keeps its own
    # weight's blocks, a FLASH_ATTN_EXT row its own mask (below). The key holds the remembered row's op, so that a
    # repacked MUL_MAT is only ever copied from another one
    rep = np.arange(k_n)
    if rb.size > 1:
        keys = wid[np.concatenate([m.slots[rb], topo.refs[idx[rb]]], axis=1)]
        keys = np.concatenate([keys, prev.P[rb, OP, None], rms_key[rb]], axis=1)
        rep[rb] = rb[_first_of_class(keys)]
    copies = np.flatnonzero(rep != np.arange(k_n))
    try:
        for k in rb[rep[rb] == rb].tolist():
            P[k] = 0
            F[k] = 0
            i = int(idx[k])
            if 0 in nodes[i]._q[2:6].tolist():
                return None                 # (empty now: no row)
            skip, ws, _, sparse_ws = _build_row(P, F, k, cgraph, nodes, i, slots)
            if skip != int(m.fused[k]) or sparse_ws is not None:
                return None
            row_ws[k] = ws
            descs[k] = op_desc(nodes[i])
    except _Unsupported:
        return None
    if copies.size:
        src = rep[copies]
        mmq = prev.P[copies, OP] == OP_MUL_MAT_Q
        if ((P[src, OP] == OP_MUL_MAT_Q) != mmq).any():
            return None                     # (a weight repacked here and not there: built)
        P[copies, :DST] = P[src, :DST]
        P[copies, _DESC_END:] = P[src, _DESC_END:]
        P[copies[mmq], _MMQ_PTRS] = prev.P[copies[mmq], _MMQ_PTRS]     # each its own weight's repacked blocks
        F[copies] = F[src]
        at = rep.tolist()                   # (each row's built one: itself or the one it copies)
        row_ws = [row_ws[r] for r in at]
        descs = [descs[r] for r in at]
    keep = np.flatnonzero(~rebuild)
    # (the rows taken over)
    if not _rows_have_data(W, refs, idx[keep]) or not _set_fa_masks(P, W, refs, idx):
        return None
    # the rows' names: the remembered ones while their name words are (a new shape of the same graph, another
    # context's graph of the model: the same names)
    nw = _name_words(W, idx)
    names = prev.names if np.array_equal(nw, prev.name_words) else _row_names(W, idx)
    fg = FastGraph(P, F, list(prev.node_index), names, max(row_ws, default=0), None, n)
    fg._set_meta(topo.addrs[idx], descs)
    fg.row_ws = row_ws
    fg.plan_from = (prev.plan_nodes,) + _plan_groups(topo, node_changed)
    _memo_put(topo.key, _Memo(topo.Wm, fg, m.slots, m.fused, nw), [o for o, d in zip(cands, diffs) if not d.any()])
    return fg


def _fusions_hold(cgraph, topo, m, idx):
    """_derive's test that every RMS_NORM row of the remembered program ``m`` still fuses (or not) with the MUL
    after it as it did. ggml's test reads the two nodes' and their operands' words (ops, flags, types, shapes), the
    MUL's operand positions and the norm's use count: rows equal in all of them fuse alike, and one of each is
    asked. Returns those keys per row (k_n x 7, zeros for the other rows: their op tells them apart), or None when
    a fusion changed."""
    n, wid, refs = topo.n_nodes, topo.wid, topo.refs
    rms = np.flatnonzero(m.P[:, OP] == OP_RMS_NORM)
    rms_key = np.zeros((len(idx), 7), np.int64)
    if rms.size:
        ri = idx[rms]
        nxt = np.minimum(ri + 1, n - 1)
        has_next = ri + 1 < n
        mrefs = np.where(has_next[:, None], refs[nxt, :2], -1)
        uses = _use_counts(cgraph, topo, ri) == 1
        kr = np.stack([np.where(has_next, wid[nxt], -2), wid[mrefs[:, 0]], wid[mrefs[:, 1]],
                       mrefs[:, 0] == ri, mrefs[:, 1] == ri, uses, m.fused[rms]], axis=1).astype(np.int64)
        rms_key[rms] = kr
        for k in rms[np.unique(_first_of_class(kr))].tolist():
            if (can_fuse_rms_norm_mul(cgraph, int(idx[k])) is not None) != bool(m.fused[k]):
                return None
    return rms_key


def _use_counts(cgraph, topo, rows) -> np.ndarray:
    """ggml_node_get_use_count of the graph's nodes ``rows`` (positions in ``topo``): each node's slot in the
    visited hash set where ggml_hash_find finds it at its hash (the common case), read at once; a node whose probe
    goes further is asked one by one (``CGraph.use_count``)."""
    hs, uc = cgraph.visited_hash_set, cgraph.use_counts
    a = topo.addrs[rows]
    pos = ((a >> np.uint64(4)) % np.uint64(hs.size)).astype(np.int64)
    used = ((hs.used[pos >> 5] >> (pos & 31).astype(hs.used.dtype)) & 1).astype(bool)
    hit = used & (hs.keys[pos] == a)
    out = np.where(hit, uc[pos], 0).astype(np.int64)
    for j in np.flatnonzero(used & ~hit).tolist():
        out[j] = cgraph.use_count(topo.T[int(rows[j])])
    return out


def _plan_groups(topo, node_changed):
    """The nodes ggml_graph_plan's loop plans again for a derived program (those whose struct words or whose
    sources' changed) and, for each, the first of them with equal words of its own, of its sources and view source
    and the same repacked-ness of its weight: ggml_get_n_tasks, ggml_cpu_extra_work_size and the op's work size
    read those alone, so the loop computes that one and the others take its answers (a decode graph's 30 layers
    repeat the same nodes). Returns (those nodes, the first of each one's group, the groups' firsts) as arrays."""
    todo = np.flatnonzero(node_changed)
    if not todo.size:
        return todo, todo, todo
    r = topo.refs[todo]
    keys = np.concatenate([topo.wid[todo, None], topo.wid[r], topo.is_rw[r[:, :1]]], axis=1)
    inv, first = _classes(keys)
    return todo, todo[first[inv]], todo[np.sort(first)]


def _build_row(P, F, k, cgraph, nodes, i, slots):
    """Program row k for node i (not empty). Returns (nodes it swallowed, work size, repacked MUL_MAT?, the AXPY's
    (bytes, bytes per thread) or None); ``slots[k]`` gets the tensors of the row's DST, S0, S1, S2 descriptors.
    Raises _Unsupported."""
    node = nodes[i]
    op = node.op
    s0, s1, s2 = node.src[0], node.src[1], node.src[2]
    _desc(P, k, DST, node)
    _desc(P, k, S0, s0)
    _desc(P, k, S1, s1)
    _desc(P, k, S2, s2)
    slot = [node, s0, s1, s2]
    skip = 0
    ws = 0
    is_repack = False
    sparse_ws = None
    if op == C.GGML_OP_MUL_MAT:
        ws, is_repack = _build_mul_mat(P, k, node)
    elif op == C.GGML_OP_RMS_NORM:
        skip = _build_rms_norm(P, F, k, cgraph, i, node, slot)
    elif op in _BINOP:
        _need(s0.type == GGML_TYPE_F32 and s1.type == GGML_TYPE_F32 and node.type == GGML_TYPE_F32)
        _need(int(s0.nb[0]) == 4 and int(node.nb[0]) == 4 and s0.shape == node.shape)
        P[k, OP] = OP_BINARY
        P[k, SUBOP] = _BINOP[op]
    elif op == C.GGML_OP_ROPE:
        _build_rope(P, F, k, node)
    elif op == C.GGML_OP_SET_ROWS:
        _need(s0.type == GGML_TYPE_F32 and node.type in (GGML_TYPE_F16, GGML_TYPE_F32))
        _need(s1.type in (C.GGML_TYPE_I32, C.GGML_TYPE_I64))
        P[k, OP] = OP_SET_ROWS
        P[k, SET_ROWS_TYPE] = node.type
        P[k, SET_ROWS_ITYPE] = s1.type
    elif op == C.GGML_OP_SOFT_MAX:
        _need(s0.type == GGML_TYPE_F32 and s2 is None and int(s0.nb[0]) == 4)
        max_bias = get_op_params_f32(node, 1)
        _need(max_bias == 0.0)
        if s1 is not None:
            _need(s1.type in (GGML_TYPE_F32, GGML_TYPE_F16) and int(s1.nb[0]) in (2, 4))
            P[k, SOFT_MAX_MTYPE] = s1.type
        P[k, OP] = OP_SOFT_MAX
        P[k, SOFT_MAX_LANES] = cpu_feats.variant_lanes()
        F[k, SOFT_MAX_SCALE] = get_op_params_f32(node, 0)
        F[k, SOFT_MAX_SLOPE] = 1.0
    elif op in (C.GGML_OP_CPY, C.GGML_OP_CONT, C.GGML_OP_DUP):
        ok = {(GGML_TYPE_F32, GGML_TYPE_F32), (GGML_TYPE_F16, GGML_TYPE_F16), (GGML_TYPE_F32, GGML_TYPE_F16),
              (GGML_TYPE_F16, GGML_TYPE_F32)}
        _need((s0.type, node.type) in ok)
        P[k, OP] = OP_CPY
        P[k, CPY_STYPE] = s0.type
        P[k, CPY_DTYPE] = node.type
        _desc(P, k, DST, node)
    elif op == C.GGML_OP_SCALE:
        _need(gemma_ops.build_scale(P, F, k, node))
    elif op == C.GGML_OP_GLU and get_glu_op(node) == C.GGML_GLU_OP_GEGLU:
        _need(gemma_ops.build_geglu(P, F, k, node))
    elif op == C.GGML_OP_GLU:
        _build_swiglu(P, k, node)
    elif op in _SPARSE_OPS:
        # PowerInfer's sparse FFN: MUL_MAT_SPARSE, AXPY and the RELU / SILU around them (sparse.py)
        _need(sparse.build_node(P, F, k, node))
        fixed, per_thread = sparse.work_size(node)
        ws = fixed
        if per_thread:
            sparse_ws = (fixed, per_thread)
    elif op == C.GGML_OP_FLASH_ATTN_EXT:
        _need(fattn.build_node(P, F, k, node))
    elif op == C.GGML_OP_GET_ROWS:
        _need(node.type == GGML_TYPE_F32 and s1.type in (C.GGML_TYPE_I32, C.GGML_TYPE_I64))
        _need(s0.type in (GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                          C.GGML_TYPE_Q5_0, C.GGML_TYPE_Q4_K, C.GGML_TYPE_Q6_K))
        _need(int(node.nb[0]) == 4)
        P[k, OP] = OP_GET_ROWS
        P[k, GET_ROWS_TYPE] = s0.type
        P[k, GET_ROWS_ITYPE] = s1.type
    else:
        raise _Unsupported()
    for t in (node, s0, s1, s2):
        if t is not None and nelements(t) > 0 and not t.data:
            raise _Unsupported()
    slots[k] = slot
    return skip, ws, is_repack, sparse_ws


def _build(cgraph, require_repack: bool = True, memo=None):
    """The program of ``cgraph`` row by row (None: some node has no compiled kernel); remembered for derivations
    under ``memo``, the graph's _Topo, if given."""
    nodes = list(cgraph.nodes)
    n = len(nodes)
    P = np.zeros((n, NCOL), np.int64)
    F = np.zeros((n, NFCOL), np.float64)
    idx, names, meta = [], [], []
    k = 0
    row_ws = []
    any_repack = False
    sparse_work = []              # (bytes, bytes per thread) of the AXPY rows (sparse.work_size)
    slots = {}
    i = 0
    try:
        while i < n:
            node = nodes[i]
            op = node.op
            if op in EMPTY_OPS or not (node.flags & C.GGML_TENSOR_FLAG_COMPUTE) or 0 in node._q[2:6].tolist():   # is_empty (ne is words 2..5)
                i += 1
                continue
            skip, ws, is_repack, sparse_ws = _build_row(P, F, k, cgraph, nodes, i, slots)
            row_ws.append(ws)
            any_repack = any_repack or is_repack
            if sparse_ws is not None:
                sparse_work.append(sparse_ws)
            idx.append(i)
            names.append(node.name)
            meta.append((node.addr, op_desc(node)))
            k += 1
            i += 1 + skip
    except _Unsupported:
        return None
    if require_repack and not any_repack:
        return None
    fg = FastGraph(P[:k].copy(), F[:k].copy(), idx, names, max(row_ws, default=0), meta, n)
    fg.sparse_work = sparse_work
    fg.row_ws = row_ws
    if memo and not sparse_work:
        _memo_store(memo, fg, slots)
    return fg


# ---- ggviz: a new graph's program built one row per class of equal rows
#
# The first graph of a topology has no program to derive from (_derive): a context's first prompt, a one-shot run's.
# Built row by row (_build) its ~500 rows cost ~10 ms of Python (SmolLM2), though its 30 layers repeat the same
# rows: what a row holds but for its descriptors is a function of its node's and its sources' struct words with
# pointers masked (_Topo.Wm; the premise _derive stands on, checked by tests/test_graph_cache.py against _build), of
# its repacked weight's blocks and of its mask's data pointer. So the rows are grouped by those words, the first row
# of each group is built by the row builder (_build_row, with every check it makes), and the others take its
# columns with their own descriptors, weight blocks and mask read from their structs -- as _derive copies equal rows.
# Which nodes are rows (is_empty) and which RMS_NORMs swallow their MUL (ggml's fusion test, asked once per group
# of equal words) are read from the words too. Never while a trace listener records (a recorded step shows the
# compiler's real work), and not with DERIVE off (the tests' row-by-row builds).

def _build_by_class(cgraph, topo):
    """The program of ``cgraph`` (its tensor table ``topo``) with one row of each class of equal rows built, or None
    (then _build builds it row by row: a PowerInfer graph, a row the classes cannot tell, an unsupported node)."""
    if not DERIVE:
        return None
    n = topo.n_nodes
    nodes = cgraph.nodes
    if n == 0 or len(nodes) != n:
        return None
    W = topo.Wz
    wid, refs_all = topo.wid, topo.refs
    refs = refs_all[:n]
    ops = W[:n].view(np.int32)[:, _W32_OP]
    empty = _empty_rows(W[:n])
    # ggml-cpu's RMS_NORM + MUL fusion, one test per class of the words it reads (as _fusions_hold)
    fused = np.zeros(n, bool)
    rms = np.flatnonzero(~empty & (ops == C.GGML_OP_RMS_NORM))
    if rms.size:
        nxt = np.minimum(rms + 1, n - 1)
        has_next = rms + 1 < n
        mrefs = np.where(has_next[:, None], refs[nxt, :2], -1)
        uses = (_use_counts(cgraph, topo, rms) == 1) if cgraph.use_counts is not None else np.full(len(rms), -1)
        kr = np.concatenate([wid[rms, None], wid[refs[rms]],
                             np.stack([np.where(has_next, wid[nxt], -2), wid[mrefs[:, 0]], wid[mrefs[:, 1]],
                                       mrefs[:, 0] == rms, mrefs[:, 1] == rms, uses], axis=1)], axis=1)
        inv, first = _classes(kr.astype(np.int64))
        ans = np.array([can_fuse_rms_norm_mul(cgraph, int(rms[j])) is not None for j in first.tolist()], bool)
        fused[rms] = ans[inv]
    swallowed = np.zeros(n, bool)
    swallowed[np.flatnonzero(fused) + 1] = True
    idx = np.flatnonzero(~empty & ~swallowed)
    k_n = len(idx)
    if k_n == 0:
        return None
    f_row = fused[idx]
    # each row's descriptor tensors (_build_row's slots): node, src[0..2]; a fused RMS_NORM's DST is its MUL and its
    # S1 the MUL's other operand
    slots = np.stack([idx, refs[idx, 0], refs[idx, 1], refs[idx, 2]], axis=1)
    fr = np.flatnonzero(f_row)
    if fr.size:
        ri = idx[fr]
        m0, m1 = refs[ri + 1, 0], refs[ri + 1, 1]
        slots[fr, 0] = ri + 1
        slots[fr, 2] = np.where(m0 == ri, m1, m0)
    keys = np.concatenate([wid[slots], wid[refs[idx]], f_row[:, None]], axis=1)
    if fr.size:
        keys = np.concatenate([keys, wid[refs[idx + np.where(f_row, 1, 0)]]], axis=1)   # the MUL's sources
    inv, first = _classes(keys)
    rep = first[inv]
    P = np.zeros((k_n, NCOL), np.int64)
    F = np.zeros((k_n, NFCOL), np.float64)
    row_ws = [0] * k_n
    descs = [None] * k_n
    built = {}
    try:
        for k in first.tolist():
            i = int(idx[k])
            skip, ws, _, sparse_ws = _build_row(P, F, k, cgraph, nodes, i, built)
            if skip != int(f_row[k]) or sparse_ws is not None:
                return None
            row_ws[k] = ws
            descs[k] = op_desc(nodes[i])
    except _Unsupported:
        return None
    copies = np.flatnonzero(rep != np.arange(k_n))
    if copies.size:
        src = rep[copies]
        P[copies, :DST] = P[src, :DST]
        P[copies, _DESC_END:] = P[src, _DESC_END:]
        F[copies] = F[src]
        _set_descriptors(P, copies, W, slots[copies])
        # a repacked MUL_MAT's blocks: its own weight's (src[0], a position of the table's repacked weights)
        mmq = copies[P[copies, OP] == OP_MUL_MAT_Q]
        if mmq.size:
            rw = dict(topo.rw)
            try:
                P[mmq, _MMQ_PTRS] = [rw[j] for j in refs[idx[mmq], 0].tolist()]
            except KeyError:
                return None
        if not _rows_have_data(W, refs, idx[copies]):        # (the copied rows)
            return None
        at = rep.tolist()                                   # (each row's built one: itself or the one it copies)
        row_ws = [row_ws[r] for r in at]
        descs = [descs[r] for r in at]
    if not _set_fa_masks(P, W, refs, idx):
        return None
    names = _row_names(W, idx)
    fg = FastGraph(P, F, idx.tolist(), names, max(row_ws, default=0), None, n)
    fg._set_meta(topo.addrs[idx], descs)
    fg.row_ws = row_ws
    fg.plan_groups = _plan_groups(topo, np.ones(n, bool))
    _memo_put(topo.key, _Memo(topo.Wm, fg, slots, f_row.copy(), _name_words(W, idx)))
    return fg


def _build_rope(P, F, k, node):
    s0, s1, s2 = node.src[0], node.src[1], node.src[2]
    mode, n_dims, freq_consts = _rope_consts(node.op_params[:11].tobytes())
    _need(s0.type == GGML_TYPE_F32 and node.type == GGML_TYPE_F32 and s1.type == C.GGML_TYPE_I32)
    _need(mode in (C.GGML_ROPE_TYPE_NORMAL, C.GGML_ROPE_TYPE_NEOX))
    _need(int(s0.nb[0]) == 4 and int(node.nb[0]) == 4)
    _need(n_dims <= int(node.ne[0]) and n_dims % 2 == 0)
    if s2 is not None:
        _need(s2.type == GGML_TYPE_F32 and int(s2.ne[0]) >= n_dims // 2)
    P[k, OP] = OP_ROPE
    P[k, ROPE_N_DIMS] = n_dims
    P[k, ROPE_NEOX] = 1 if mode == C.GGML_ROPE_TYPE_NEOX else 0
    F[k, ROPE_FREQ_SCALE:ROPE_SIN_SIGN + 1] = freq_consts
    if s2 is None:
        P[k, S2 + DATA] = 0


@functools.lru_cache(maxsize=64)
def _rope_consts(op_params: bytes):
    """(mode, n_dims, the F columns) of a ROPE row: a function of the node's op params alone (words 0..10: n_dims,
    mode, n_ctx_orig, freq_base ... beta_slow), worked out once per distinct params -- a model's ROPE nodes share
    them, and libm's powf/logf and the YaRN corr dims cost ~1 ms a node in Python."""
    w = np.frombuffer(op_params, np.int32)
    f = np.frombuffer(op_params, np.float32)
    n_dims, mode, n_ctx_orig = int(w[1]), int(w[2]), int(w[4])
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (np.float32(f[i]) for i in range(5, 11))
    theta_scale = powf(freq_base, np.float32(-2.0) / np.float32(n_dims))
    corr = rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    mscale = attn_factor
    if ext_factor != 0:
        # rope_yarn: mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale) (gcc fuses it into an FMA)
        mscale = np.float32(mscale * fma32(np.float32(0.1), logf(np.float32(1) / freq_scale), np.float32(1)))
    return mode, n_dims, [float(v) for v in (freq_scale, ext_factor, mscale, theta_scale, corr[0], corr[1], 1.0)]
