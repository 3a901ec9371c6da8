"""The thread sync of the compiled walk: ggml's barrier and chunk counter, the error slot and the trace log.

Mirrors ggml-cpu.c's ``ggml_barrier`` (``n_barrier`` / ``n_barrier_passed``: the last thread in bumps the passed
counter, the others spin on it) with real atomics on the shared ``sync`` array (``program.SYNC_*``). ggviz: two
things C does not need: a waiter spins ~40 us (``SPIN_CYCLES``), then sleeps on a futex, so that an oversubscribed
machine does not burn the core the late thread needs; and a barrier gives up after ~5 minutes and reports the thread
that never came (``ERR_BARRIER_TIMEOUT``) instead of hanging. ``tr_rec`` appends a record to the calling thread's
part of the trace log, when somebody listens (``compiler.FastGraph.trace_begin``).
"""
from __future__ import annotations

import numpy as np

from .intrinsics import (
    HAVE_FUTEX,
    atomic_add,
    atomic_load,
    atomic_store,
    compiled,
    cpu_relax,
    futex_wait,
    futex_wake,
    ld_i64,
    rdtsc,
    sched_yield,
    st_i64,
)
from .program import (
    BARRIER_MAX_SLEEPS,
    ERR_BARRIER_TIMEOUT,
    SPIN_CYCLES,
    SYNC_BARRIER_PASSED,
    SYNC_ERROR,
    SYNC_LEN,
    SYNC_N_BARRIER,
    SYNC_SLEEP_TICKS,
    SYNC_SLEEPERS,
    SYNC_TIMESPEC,
    SYNC_TRACE,
    TR_BARRIER,
    TR_REC,
)

# =================================================================================================================
# barrier and chunk counter (ggml_barrier, ggml_threadpool_chunk_set/add)
# =================================================================================================================

@compiled
def set_error(sync, code, k):
    if atomic_load(sync + 8 * SYNC_ERROR) == 0:
        atomic_store(sync + 8 * (SYNC_ERROR + 1), k)
        atomic_store(sync + 8 * SYNC_ERROR, code)

@compiled
def tr_rec(sync, ith, kind, k, a, b, c, d, e, f, t0, t1):
    """Append one record to thread ith's part of the trace log (if there is one, and while it has room: a
    full log counts the record and drops it). Each thread writes only its own part: no atomics needed."""
    log = ld_i64(sync + 8 * SYNC_TRACE)
    if log == 0:
        return
    cap = ld_i64(sync + 8 * (SYNC_TRACE + 1))
    base = log + 8 * ith * (1 + cap * TR_REC)
    n = ld_i64(base)
    st_i64(base, n + 1)
    if n >= cap:
        return
    r = base + 8 + 8 * TR_REC * n
    st_i64(r, kind)
    st_i64(r + 8, k)
    st_i64(r + 16, a)
    st_i64(r + 24, b)
    st_i64(r + 32, c)
    st_i64(r + 40, d)
    st_i64(r + 48, e)
    st_i64(r + 56, f)
    st_i64(r + 64, t0)
    st_i64(r + 72, t1)

@compiled
def traced(sync):
    return ld_i64(sync + 8 * SYNC_TRACE) != 0

@compiled
def traced_barrier(sync, nth, ith, k, where, tr):
    """barrier(), recorded in the trace log when ``tr``."""
    if not tr or nth == 1:
        barrier(sync, nth)
        return
    seq = atomic_load(sync + 8 * SYNC_BARRIER_PASSED)
    t0 = rdtsc()
    barrier(sync, nth)
    tr_rec(sync, ith, TR_BARRIER, k, where, seq, 0, 0, 0, 0, t0, rdtsc())

@compiled
def barrier(sync, nth):
    """ggml_barrier: the last thread in bumps n_barrier_passed; the others spin on it (pause), and after
    SPIN_CYCLES go to sleep on it (futex; sched_yield where there is none), so that an oversubscribed machine
    does not burn the core the late thread needs."""
    if nth == 1:
        return
    p_passed = sync + 8 * SYNC_BARRIER_PASSED
    p_sleepers = sync + 8 * SYNC_SLEEPERS
    n_passed = atomic_load(p_passed)
    if atomic_add(sync + 8 * SYNC_N_BARRIER, 1) == nth - 1:
        # last thread in
        atomic_store(sync + 8 * SYNC_N_BARRIER, 0)
        atomic_add(p_passed, 1)
        if atomic_load(p_sleepers) > 0:
            futex_wake(p_passed)
        return
    t0 = rdtsc()
    n_sleeps = 0
    while atomic_load(p_passed) == n_passed:
        if rdtsc() - t0 < SPIN_CYCLES:
            cpu_relax()
        elif HAVE_FUTEX:
            atomic_add(p_sleepers, 1)
            t1 = rdtsc()
            if atomic_load(p_passed) == n_passed:
                futex_wait(p_passed, n_passed, sync + 8 * SYNC_TIMESPEC)    # 100 ms at most
            atomic_add(sync + 8 * SYNC_SLEEP_TICKS, rdtsc() - t1)          # time asleep (contention)
            atomic_add(p_sleepers, -1)
            n_sleeps += 1
            if n_sleeps > BARRIER_MAX_SLEEPS:
                # a thread never came (it failed before reaching the compiled walk): give up, report it
                set_error(sync, ERR_BARRIER_TIMEOUT, -1)
                return
        else:
            t1 = rdtsc()
            sched_yield()
            atomic_add(sync + 8 * SYNC_SLEEP_TICKS, rdtsc() - t1)


def new_sync() -> np.ndarray:
    """The shared counters of one compiled graph (barrier, chunk, error, futex timeout)."""
    sync = np.zeros(SYNC_LEN, np.int64)
    sync[SYNC_TIMESPEC] = 0
    sync[SYNC_TIMESPEC + 1] = 100_000_000
    return sync
