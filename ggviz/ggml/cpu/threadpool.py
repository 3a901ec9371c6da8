"""``struct ggml_threadpool``: persistent worker threads that compute graph after graph.

Mirrors ggml-cpu.c (no OpenMP build) and ggml.c:

* ``ggml_threadpool_params_default/init/match`` and ``struct ggml_threadpool_params`` (cpumask, n_threads, prio,
  poll, strict_cpu, paused);
* ``ggml_threadpool_new_impl``: workers 1..n-1 are started at once and wait for work; worker 0 is the caller's own
  thread, which joins every graph compute;
* ``ggml_graph_compute_kickoff``: a new graph is announced by bumping ``n_graph``, whose low 16 bits
  (``GGML_THREADPOOL_N_THREADS_MASK``) carry how many threads take part in it; workers whose ``ith`` is beyond
  that count see the new graph and go back to sleep;
* ``ggml_graph_compute_secondary_thread`` / ``ggml_graph_compute_check_for_work`` /
  ``ggml_graph_compute_thread_ready``: a worker's life -- sleep while paused, wait for a new ``n_graph``, compute
  its share of the graph, repeat until ``stop``;
* ``ggml_barrier`` (``n_barrier``, ``n_barrier_passed``), ``current_chunk`` (``ggml_threadpool_chunk_set/add``),
  ``abort`` (node index at which every thread stops, -1 none) and ``ec`` (the compute's ggml_status);
* ``ggml_threadpool_pause/resume/free``, ``ggml_threadpool_get_n_threads``;
* ``ggml_thread_cpumask_next`` (each worker's CPU mask from the params' ``cpumask``: the whole mask, or with
  ``strict_cpu`` the next CPU of it, round-robin, worker 0 last), ``ggml_thread_cpumask_is_valid`` and
  ``ggml_thread_apply_affinity`` (Linux: ``os.sched_setaffinity(0, ...)`` pins the calling thread, as
  ``pthread_setaffinity_np`` does; elsewhere it does nothing and says so, like ggml's unsupported platforms).

Two things differ from ggml, both because these are Python threads sharing one interpreter lock:

* ggml's workers *poll* for new work (``poll`` rounds of ``_mm_pause``) and ``ggml_barrier`` *spins* on
  ``n_barrier_passed``: on dedicated cores a spin is cheaper than a futex wake-up. A spinning Python thread, though,
  holds the GIL for a whole switch interval (5 ms) at a time, starving the thread that has real work (NumPy only
  releases the GIL inside its kernels; all of ggviz's glue between kernels needs it). So every wait here sleeps on a
  condition variable instead: the same counters, the same protocol, but the last thread into a barrier wakes the
  others with ``notify_all``. ``poll`` is kept in the params (and compared by ``params_match``) but not used.
* ggml's threads cannot fail; Python kernels can raise. A worker's exception is stored in ``error`` and wakes every
  barrier; the other threads leave the graph at their next barrier (``_Stop``); thread 0 waits until every worker
  of the graph has left it, then re-raises the exception in the caller (an interrupt -- KeyboardInterrupt,
  SystemExit -- unchanged). The pool stays usable: the next kickoff clears the error and the barrier count, and
  restarts any worker thread that died; if an interrupt cut thread 0's part short (``settled`` is False), the next
  kickoff first tells the workers still in that graph to leave and waits for them. A kicked-off graph is always
  run to its end or its error, even if ``threadpool_pause`` is called meanwhile (ggml would leave a half-joined
  graph waiting). Waits that could block forever check the workers' liveness every ``_LIVENESS_S`` seconds and give
  up with a clear :class:`ThreadpoolError` after ``HANG_TIMEOUT_S`` (env ``GGVIZ_HANG_TIMEOUT``) -- a diagnostic of
  last resort, not part of the protocol.

Trace events (only while ``ggviz.trace.active``): ``cpu.kickoff``, ``cpu.barrier``, ``cpu.pause``, ``cpu.resume``,
``cpu.worker_error``, ``cpu.affinity`` (a thread applied its mask: the CPUs asked for and those the OS reports); the executor (ggml_cpu.py) adds ``cpu.node`` and ``cpu.abort``, mul_mat ``cpu.chunk``.
"""
from __future__ import annotations

import itertools
import os
import threading
import time

from ... import trace
from .. import consts as C
from ..context import GGMLError

GGML_THREADPOOL_N_THREADS_MASK = 0xFFFF
GGML_THREADPOOL_N_THREADS_BITS = 16

HANG_TIMEOUT_S = float(os.environ.get("GGVIZ_HANG_TIMEOUT", "600"))
_LIVENESS_S = 0.5          # how often a sleeping waiter looks whether the threads it waits for are still alive

_serial = itertools.count(1)


class ThreadpoolError(GGMLError):
    """A pool that cannot go on: a worker thread died, or a wait ran past HANG_TIMEOUT_S."""


class _Stop(BaseException):
    """Raised inside workers when another worker failed: unwinds them out of barriers.

    A BaseException so that a kernel's ``except Exception`` cannot swallow it.
    """


# ---------------------------------------------------------------------------------------------------------------
# struct ggml_threadpool_params
# ---------------------------------------------------------------------------------------------------------------

class ThreadpoolParams:
    """struct ggml_threadpool_params."""
    __slots__ = ("cpumask", "n_threads", "prio", "poll", "strict_cpu", "paused")

    def __init__(self, n_threads: int = C.GGML_DEFAULT_N_THREADS):
        threadpool_params_init(self, n_threads)

    def __repr__(self):
        return (f"<ggml_threadpool_params n_threads={self.n_threads} prio={self.prio} poll={self.poll} "
                f"strict_cpu={self.strict_cpu} paused={self.paused}>")


def threadpool_params_init(p: ThreadpoolParams, n_threads: int) -> None:
    """ggml_threadpool_params_init."""
    p.n_threads = int(n_threads)
    p.prio = C.GGML_SCHED_PRIO_NORMAL   # default priority (usually means normal or inherited)
    p.poll = 50                         # hybrid-polling enabled (ggviz never polls, see the module docstring)
    p.strict_cpu = False                # no strict placement (all threads share same cpumask)
    p.paused = False                    # threads are ready to go
    p.cpumask = [False] * C.GGML_MAX_N_THREADS   # all-zero means use the default affinity (usually inherited)


def threadpool_params_default(n_threads: int) -> ThreadpoolParams:
    """ggml_threadpool_params_default."""
    return ThreadpoolParams(n_threads)


def threadpool_params_match(p0: ThreadpoolParams, p1: ThreadpoolParams) -> bool:
    """ggml_threadpool_params_match (``paused`` is not compared, as in ggml)."""
    return (p0.n_threads == p1.n_threads and p0.prio == p1.prio and p0.poll == p1.poll
            and p0.strict_cpu == p1.strict_cpu and list(p0.cpumask) == list(p1.cpumask))


def thread_cpumask_next(global_mask, local_mask: list, strict: bool, it: int) -> int:
    """ggml_thread_cpumask_next: fill ``local_mask`` (a worker's) from ``global_mask`` (the params'): a copy, or with
    ``strict`` only the first CPU of the global mask at or after ``it`` (wrapping around). Returns the new ``it``
    (C passes it by pointer): one past the CPU taken, so the next worker gets the next CPU."""
    if not strict:
        local_mask[:] = list(global_mask)
        return it
    local_mask[:] = [False] * C.GGML_MAX_N_THREADS
    for i in range(C.GGML_MAX_N_THREADS):
        idx = it + i
        if idx >= C.GGML_MAX_N_THREADS:
            idx -= C.GGML_MAX_N_THREADS
        if global_mask[idx]:
            local_mask[idx] = True
            return idx + 1
    return it


def thread_cpumask_is_valid(mask) -> bool:
    """ggml_thread_cpumask_is_valid: any CPU set (all-zero means: leave the thread where the OS puts it)."""
    return any(mask)


def thread_apply_affinity(mask, ith: int = 0) -> bool:
    """ggml_thread_apply_affinity: pin the calling thread to the CPUs set in ``mask``. On Linux
    ``os.sched_setaffinity(0, cpus)`` acts on the calling thread only (like ``pthread_setaffinity_np``); a CPU the
    machine does not have makes it fail, which ggml reports on stderr and ignores."""
    cpus = {i for i, b in enumerate(mask) if b}
    if not hasattr(os, "sched_setaffinity"):          # ggml's "unsupported platforms": nothing done, true returned
        return True
    try:
        os.sched_setaffinity(0, cpus)
        ok = True
    except OSError as e:
        import sys
        print(f"warn: failed to set affinity mask {sorted(cpus)} ({e.strerror})", file=sys.stderr)
        ok = False
    if trace.active:
        trace.emit("cpu.affinity", ith=ith, asked=sorted(cpus), ok=ok, now=sorted(os.sched_getaffinity(0)))
    return ok


# ---------------------------------------------------------------------------------------------------------------
# struct ggml_compute_state, struct ggml_threadpool
# ---------------------------------------------------------------------------------------------------------------

class ComputeState:
    """struct ggml_compute_state: one worker's own state. ggviz: where it is, for traces and diagnostics."""
    __slots__ = ("thrd", "last_graph", "pending", "cpumask", "threadpool", "ith",
                 "node_n", "done_graph", "dead")

    def __init__(self, threadpool: "Threadpool", ith: int):
        self.thrd: threading.Thread | None = None     # None for worker 0: the caller's thread
        self.last_graph = 0
        self.pending = False
        self.cpumask = [False] * C.GGML_MAX_N_THREADS
        self.threadpool = threadpool
        self.ith = ith
        self.node_n = -1          # ggviz: the node this thread is computing (or has just computed)
        self.done_graph = 0       # ggviz: the n_graph value of the last graph this thread left
        self.dead = False         # ggviz: the thread ended without being stopped

    def __repr__(self):
        return f"<ggml_compute_state ith={self.ith} last_graph={self.last_graph:#x} node_n={self.node_n}>"


class Threadpool:
    """struct ggml_threadpool."""

    def __init__(self, tpp: ThreadpoolParams, cgraph=None, cplan=None):
        # ggml_threadpool_new_impl
        self.mutex = threading.Lock()             # ggml's mutex + cond: "wait for new work"
        self.cond = threading.Condition(self.mutex)
        self.cgraph = cgraph
        self.cplan = cplan
        self.n_graph = 0              # (graph count << 16) | threads taking part in the current graph
        self.n_barrier = 0
        self.n_barrier_passed = 0
        self.current_chunk = 0        # next mul_mat chunk to claim, shared by all threads
        self.stop = False
        self.pause = bool(tpp.paused)
        self.abort = -1               # node index at which every thread stops (-1: none)
        self.n_threads = int(tpp.n_threads)
        self.prio = tpp.prio
        self.poll = tpp.poll
        self.ec = C.GGML_STATUS_SUCCESS
        # ggviz:
        self.serial = next(_serial)   # tells pools apart in traces (ids of freed objects are reused)
        self.error: BaseException | None = None
        self.broken: str | None = None    # why the pool cannot be used any more (a worker stuck past the timeout)
        # every worker of the last kicked-off graph is known to have left it (or will touch no shared state again);
        # False from a kickoff until thread 0 has finished the graph -- it stays False when an interrupt
        # (KeyboardInterrupt ...) cut thread 0's part short, and the next kickoff then waits for the workers first
        self.settled = True
        self.dispatch = None          # (op -> kernel table, ops module), set by graph_compute
        # ggml_graph_compute_thread, set by graph_compute: in C the executor and the pool share ggml-cpu.c; here the
        # pool (this module) sits below the executor (ggml_cpu.py), which hands it the function
        self.compute_thread = None
        self.fast = None              # the program (fast.compiler.FastGraph) this compute walks; None: node by node
        self._bcv = threading.Condition(threading.Lock())   # barrier, errors, "worker left the graph"
        self._chunk_lock = threading.Lock()
        self._busy = threading.Lock()     # ggviz: held from threadpool_claim to threadpool_release (one caller)
        if self.n_threads < 1 or self.n_threads > C.GGML_MAX_N_THREADS:
            raise GGMLError(f"ggml_threadpool_new: n_threads must be in 1..{C.GGML_MAX_N_THREADS}, "
                            f"got {self.n_threads}")
        self.workers = [ComputeState(self, j) for j in range(self.n_threads)]
        # the workers' CPU masks: 1..n-1 first, the main thread (worker 0) last, towards the higher CPUs
        it = 0
        for j in range(1, self.n_threads):
            it = thread_cpumask_next(tpp.cpumask, self.workers[j].cpumask, tpp.strict_cpu, it)
            self._start_worker(self.workers[j])
        thread_cpumask_next(tpp.cpumask, self.workers[0].cpumask, tpp.strict_cpu, it)
        if not self.pause and thread_cpumask_is_valid(self.workers[0].cpumask):
            thread_apply_affinity(self.workers[0].cpumask, 0)     # the caller's thread, pinned from now on (as C)

    def __repr__(self):
        return (f"<ggml_threadpool #{self.serial} n_threads={self.n_threads} n_graph={self.n_graph >> 16}:"
                f"{self.n_graph & GGML_THREADPOOL_N_THREADS_MASK} pause={self.pause} stop={self.stop}>")

    # ggviz: `with threadpool_new(p) as tp:` frees the pool at the end
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        threadpool_free(self)
        return False

    def _start_worker(self, state: ComputeState):
        state.dead = False
        state.thrd = threading.Thread(target=_secondary_thread, args=(state,), daemon=True,
                                      name=f"ggml-cpu-{self.serial}.{state.ith}")
        state.thrd.start()

    # ---- ggml_barrier ----------------------------------------------------------------------------------------
    def barrier(self, ith: int = 0, where: str = "kernel") -> None:
        """ggml_barrier: wait until all threads of the current graph have arrived.

        The counter protocol is ggml's: remember ``n_barrier_passed``, count yourself in ``n_barrier``; the last
        thread in resets ``n_barrier`` and bumps ``n_barrier_passed``, which releases the others. They sleep on a
        condition instead of spinning (see the module docstring). ``where`` is ggviz's label for traces:
        "kernel" (a kernel's own ggml_barrier), "node" (between two nodes), "final" (after the last node).
        """
        n_graph = self.n_graph
        n_threads = n_graph & GGML_THREADPOOL_N_THREADS_MASK
        if n_threads == 1:
            return
        t0 = time.perf_counter_ns() if trace.active else 0
        cv = self._bcv
        with cv:
            if self.error is not None:
                raise _Stop()
            n_passed = self.n_barrier_passed
            n_barrier = self.n_barrier
            self.n_barrier = n_barrier + 1
            if n_barrier == n_threads - 1:
                # last thread in: reset the count and let everybody through
                self.n_barrier = 0
                self.n_barrier_passed = n_passed + 1
                cv.notify_all()
            else:
                t_wait = None
                while self.n_barrier_passed == n_passed:
                    if self.error is not None:
                        raise _Stop()
                    if not cv.wait(_LIVENESS_S):
                        t_wait = self._waited_too_long(t_wait, n_threads, f"thread {ith} in a barrier")
        if t0 and trace.active:       # (t0 == 0: nobody was listening when this thread came in)
            st = self.workers[ith]
            node = self.cgraph.nodes[st.node_n] if self.cgraph is not None and 0 <= st.node_n < len(
                self.cgraph.nodes) else None
            trace.emit("cpu.barrier", ith=ith, pool=self.serial, n_graph=n_graph, seq=n_passed, where=where,
                       node_n=st.node_n, name=node.name if node is not None else None,
                       t_enter=t0, t_exit=time.perf_counter_ns())

    def _waited_too_long(self, t_wait, n_threads: int, who: str):
        """Called (holding _bcv) each time a wait times out: fail the graph if a worker died or time is up."""
        now = time.monotonic()
        if t_wait is None:
            t_wait = now - _LIVENESS_S
        for w in self.workers[1:n_threads]:
            if w.thrd is not None and not w.thrd.is_alive() and w.done_graph != self.n_graph:
                self._fail_locked(ThreadpoolError(f"ggml threadpool #{self.serial}: worker thread {w.ith} died "
                                                  f"(at node {w.node_n})"), w.ith)
                return t_wait
        if now - t_wait > HANG_TIMEOUT_S:
            where = ", ".join(f"thread {w.ith}: node {w.node_n}" for w in self.workers[:n_threads])
            self._fail_locked(ThreadpoolError(
                f"ggml threadpool #{self.serial}: {who} waited more than {HANG_TIMEOUT_S:.0f} s "
                f"(GGVIZ_HANG_TIMEOUT); n_barrier={self.n_barrier}/{n_threads}, {where}"), -1)
        return t_wait

    # ---- current_chunk -----------------------------------------------------------------------------------------
    def chunk_set(self, value: int) -> None:
        """ggml_threadpool_chunk_set."""
        self.current_chunk = value

    def chunk_add(self, value: int) -> int:
        """ggml_threadpool_chunk_add: atomic_fetch_add(&current_chunk, value)."""
        with self._chunk_lock:
            v = self.current_chunk
            self.current_chunk = v + value
            return v

    chunk_fetch_add = chunk_add

    # ---- errors ------------------------------------------------------------------------------------------------
    def fail(self, exc: BaseException, ith: int = -1) -> None:
        """A thread could not finish its part of the graph: remember the first error, wake every barrier."""
        with self._bcv:
            self._fail_locked(exc, ith)

    def _fail_locked(self, exc: BaseException, ith: int) -> None:
        first = self.error is None
        if first:
            self.error = exc
        self._bcv.notify_all()
        if trace.active:
            node_n = self.workers[ith].node_n if 0 <= ith < len(self.workers) else -1
            trace.emit("cpu.worker_error", ith=ith, pool=self.serial, n_graph=self.n_graph, node_n=node_n,
                       error=f"{type(exc).__name__}: {exc}", first=first)

    def finish_graph(self, n_threads: int) -> None:
        """ggviz: called by thread 0 after its own part. On an error, wait until every worker of this graph has
        left it (so the pool can be reused), then raise the error in the caller -- an interrupt (KeyboardInterrupt,
        SystemExit) as it is, so that ``except KeyboardInterrupt`` catches it. While tracing, also wait on
        success, so that the workers' last events (their exit from the final barrier) belong to this compute."""
        if self.error is None and not trace.active:
            self.settled = True
            return      # the final barrier already guarantees that everybody is done with the nodes
        self._wait_workers_left(n_threads, "failed")
        self.settled = True
        if self.error is not None:
            raise self.error

    def _wait_workers_left(self, n_threads: int, what: str) -> None:
        """Wait until workers 1..n_threads-1 have left graph ``n_graph`` (or died); give up after HANG_TIMEOUT_S
        (the pool is then marked broken)."""
        cv = self._bcv
        with cv:
            t_wait = None
            while True:
                busy = [w for w in self.workers[1:n_threads]
                        if w.done_graph != self.n_graph and w.thrd is not None and w.thrd.is_alive()]
                if not busy:
                    break
                if not cv.wait(_LIVENESS_S):
                    t_wait = t_wait if t_wait is not None else time.monotonic() - _LIVENESS_S
                    if time.monotonic() - t_wait > HANG_TIMEOUT_S:
                        self.broken = f"threads {[w.ith for w in busy]} stuck in graph {self.n_graph >> 16}"
                        raise ThreadpoolError(
                            f"ggml threadpool #{self.serial}: threads {[w.ith for w in busy]} did not leave the "
                            f"{what} graph within {HANG_TIMEOUT_S:.0f} s (GGVIZ_HANG_TIMEOUT)") from self.error

    def settle(self) -> None:
        """ggviz: make sure no worker is still inside the last graph before a new one is kicked off.

        Only needed when thread 0 did not finish that graph (``settled`` is False): an interrupt landed between the
        kickoff and the end of thread 0's part, or while it waited for the workers. The workers still in it are
        told to leave (the error slot wakes every barrier) and waited for; then the pool is as good as new."""
        n_threads = self.n_graph & GGML_THREADPOOL_N_THREADS_MASK
        with self._bcv:
            if self.error is None:
                self.error = ThreadpoolError(f"ggml threadpool #{self.serial}: graph {self.n_graph >> 16} was "
                                             f"interrupted")
            self._bcv.notify_all()
        self._wait_workers_left(n_threads, "interrupted")
        self.settled = True


# ---------------------------------------------------------------------------------------------------------------
# worker threads
# ---------------------------------------------------------------------------------------------------------------

def _thread_ready(state: ComputeState) -> bool:
    """ggml_graph_compute_thread_ready (called holding tp.mutex): should the worker stop waiting?

    ggviz checks for a new graph before ``pause`` so that a kicked-off graph is always joined (see the docstring).
    """
    tp = state.threadpool
    if state.pending or tp.stop:
        return True
    n_graph = tp.n_graph
    if n_graph != state.last_graph:
        state.pending = state.ith < (n_graph & GGML_THREADPOOL_N_THREADS_MASK)
        state.last_graph = n_graph
        if not state.pending:
            state.done_graph = n_graph      # not taking part: nothing to leave
        return True
    return tp.pause


def _check_for_work(state: ComputeState) -> bool:
    """ggml_graph_compute_check_for_work, without the polling phase: sleep until kicked (or paused/stopped)."""
    tp = state.threadpool
    with tp.cond:
        while not _thread_ready(state):
            tp.cond.wait()
    return state.pending


def _secondary_thread(state: ComputeState) -> None:
    """ggml_graph_compute_secondary_thread: a worker's whole life."""
    tp = state.threadpool
    if thread_cpumask_is_valid(state.cpumask):
        thread_apply_affinity(state.cpumask, state.ith)
    try:
        while True:
            # check if we need to sleep
            if tp.pause and not tp.stop:
                with tp.cond:
                    if tp.pause and not tp.stop and tp.n_graph == state.last_graph:
                        if trace.active:
                            trace.emit("cpu.pause", ith=state.ith, pool=tp.serial, state="asleep")
                        while tp.pause and not tp.stop and tp.n_graph == state.last_graph:
                            tp.cond.wait()
                        if trace.active:
                            trace.emit("cpu.resume", ith=state.ith, pool=tp.serial, state="awake")
            # this needs to be checked for after the cond_wait
            if tp.stop:
                break
            # check if there is new work; the main thread is the only one that can dispatch new work
            _check_for_work(state)
            if state.pending:
                state.pending = False
                _run_graph(state)
    finally:
        if not tp.stop:
            # the thread is ending without being stopped (a bug in the loop above, or an injected fault)
            state.dead = True
            with tp._bcv:
                state.done_graph = state.last_graph       # it computes nothing any more
                tp._fail_locked(ThreadpoolError(f"ggml threadpool #{tp.serial}: worker thread {state.ith} died "
                                                f"(at node {state.node_n})"), state.ith)


def _run_graph(state: ComputeState) -> None:
    """One thread's part of one graph: ggml_graph_compute_thread, plus ggviz's failure handling."""
    tp = state.threadpool
    try:
        if tp.error is None:
            tp.compute_thread(state)
    except _Stop:
        pass
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread by finish_graph
        tp.fail(exc, state.ith)
    finally:
        if state.ith > 0:
            with tp._bcv:
                state.done_graph = state.last_graph
                tp._bcv.notify_all()            # thread 0 may wait for it (finish_graph)


# ---------------------------------------------------------------------------------------------------------------
# the public API (ggml-cpu.h)
# ---------------------------------------------------------------------------------------------------------------

def threadpool_new_impl(tpp: ThreadpoolParams, cgraph=None, cplan=None) -> Threadpool:
    """ggml_threadpool_new_impl."""
    return Threadpool(tpp, cgraph, cplan)


def threadpool_new(params: ThreadpoolParams | int) -> Threadpool:
    """ggml_threadpool_new (ggviz also takes a plain thread count)."""
    if isinstance(params, int):
        params = threadpool_params_default(params)
    return threadpool_new_impl(params, None, None)


def threadpool_free(threadpool: Threadpool | None) -> None:
    """ggml_threadpool_free: stop and join the workers."""
    if threadpool is None:
        return
    with threadpool.cond:
        threadpool.stop = True
        threadpool.pause = False
        threadpool.cond.notify_all()
    if not threadpool.settled:
        # thread 0 was interrupted in a graph: workers may wait in its barriers; the error slot lets them out
        with threadpool._bcv:
            if threadpool.error is None:
                threadpool.error = ThreadpoolError(f"ggml threadpool #{threadpool.serial} has been freed")
            threadpool._bcv.notify_all()
    if threadpool.broken:
        return      # a stuck worker would make the join hang: leave the (daemon) threads behind
    for w in threadpool.workers[1:]:
        if w.thrd is not None and w.thrd is not threading.current_thread():
            w.thrd.join(HANG_TIMEOUT_S)


def threadpool_get_n_threads(threadpool: Threadpool) -> int:
    """ggml_threadpool_get_n_threads."""
    return threadpool.n_threads


def _pause_locked(tp: Threadpool, by: str) -> None:
    tp.pause = True
    tp.cond.notify_all()
    if trace.active:
        trace.emit("cpu.pause", ith=None, pool=tp.serial, by=by)


def _resume_locked(tp: Threadpool, by: str) -> None:
    tp.pause = False
    tp.cond.notify_all()
    if trace.active:
        trace.emit("cpu.resume", ith=None, pool=tp.serial, by=by)


def threadpool_pause(threadpool: Threadpool) -> None:
    """ggml_threadpool_pause: idle workers sleep until resume (or the next kickoff)."""
    with threadpool.cond:
        if not threadpool.pause:
            _pause_locked(threadpool, "api")


def threadpool_resume(threadpool: Threadpool) -> None:
    """ggml_threadpool_resume."""
    with threadpool.cond:
        if threadpool.pause:
            _resume_locked(threadpool, "api")


def threadpool_claim(tp: Threadpool) -> None:
    """ggviz: taken by graph_compute before it touches the pool, released by threadpool_release at the end.

    ggml leaves two simultaneous computes on one pool undefined (they would share the counters and hang); ggviz
    refuses the second. Also refuses a freed or broken pool."""
    if tp.stop:
        raise ThreadpoolError(f"ggml threadpool #{tp.serial} has been freed")
    if tp.broken:
        raise ThreadpoolError(f"ggml threadpool #{tp.serial} is unusable ({tp.broken}); free it and make another")
    if not tp._busy.acquire(blocking=False):
        raise ThreadpoolError(f"ggml threadpool #{tp.serial} is already computing a graph (one caller at a time)")


def threadpool_release(tp: Threadpool) -> None:
    """ggviz: the end of threadpool_claim."""
    tp._busy.release()


def graph_compute_kickoff(threadpool: Threadpool, n_threads: int) -> None:
    """ggml_graph_compute_kickoff: announce a new graph to n_threads threads (workers 1..n_threads-1 join)."""
    tp = threadpool
    if tp.stop:
        raise ThreadpoolError(f"ggml threadpool #{tp.serial} has been freed")
    if not tp.settled:
        tp.settle()     # ggviz: the previous graph was interrupted; its workers leave it first
    tp.settled = False
    with tp.cond:
        # ggviz: the previous graph may have failed -- clear its traces from the shared state
        tp.error = None
        tp.n_barrier = 0
        for w in tp.workers[1:n_threads]:
            if w.thrd is None or not w.thrd.is_alive():
                w.last_graph = w.done_graph = tp.n_graph
                w.pending = False
                tp._start_worker(w)
        # update the number of active threads and the graph count
        n_graph = tp.n_graph >> GGML_THREADPOOL_N_THREADS_BITS
        n_graph = ((n_graph + 1) << GGML_THREADPOOL_N_THREADS_BITS) | (n_threads & GGML_THREADPOOL_N_THREADS_MASK)
        tp.n_graph = n_graph
        tp.workers[0].last_graph = n_graph
        if trace.active:
            trace.emit("cpu.kickoff", pool=tp.serial, n_graph=n_graph,
                       graph_n=n_graph >> GGML_THREADPOOL_N_THREADS_BITS, n_threads=n_threads,
                       pool_threads=tp.n_threads, was_paused=tp.pause)
        if tp.pause:
            _resume_locked(tp, "kickoff")     # resume does cond broadcast
        else:
            tp.cond.notify_all()


def run_thread0(threadpool: Threadpool) -> None:
    """Thread 0's part of the current graph ("this is a work thread too"), then ggviz's error collection."""
    try:
        _run_graph(threadpool.workers[0])
    except BaseException as exc:  # noqa: BLE001 - an interrupt outside the kernels: handled like a worker error
        threadpool.fail(exc, 0)
    threadpool.finish_graph(threadpool.n_graph & GGML_THREADPOOL_N_THREADS_MASK)
