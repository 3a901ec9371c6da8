"""The CPU backend's graph executor: plan, threads, barrier, dispatch.

Mirrors ggml-cpu.c: ``ggml_get_n_tasks``, ``ggml_graph_plan`` (n_threads = max n_tasks, work size per op plus one
cache line per thread), ``struct ggml_cplan``, ``ggml_graph_compute`` (a disposable threadpool when none is given),
``ggml_graph_compute_thread`` (every thread walks every node; a barrier after each node), ``ggml_barrier``
(ggviz.ggml.cpu.threadpool: ``struct ggml_threadpool``, persistent or disposable), ``ggml_cpu_try_fuse_ops``
(RMS_NORM + MUL; its test is ``ops.can_fuse_rms_norm_mul``) and ``ggml_graph_compute_with_ctx`` (the work buffer
becomes a WORK_BUFFER object in the context).

Threads are real Python threads: NumPy releases the GIL inside its kernels. A worker's exception stops the others at
their next barrier and reaches the caller as a ``GGMLError`` naming the node; an interrupt (``KeyboardInterrupt``,
``SystemExit``: BaseExceptions that are not Exceptions) reaches it unchanged, and the pool stays usable.
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from ... import trace
from .. import consts as C
from ..context import Context
from ..graph import CGraph, graph_key
from ..impl import EMPTY_OPS, GGMLError
from ..tensor import Tensor, get_unary_op, is_empty, is_quantized, nelements, nrows, op_desc, row_size, type_size
from . import mul_mat, powerinfer, traits
from . import ops as cpu_ops
from . import threadpool as _tp
from .common import CACHE_LINE_SIZE, FA_TILE_KV, FA_TILE_Q, ComputeParams
from .quants import VEC_DOT_TYPE
from .threadpool import GGML_THREADPOOL_N_THREADS_MASK

try:    # the compiled fast path hooks in here, and only here (plan: compile the graph; compute: walk the program)
    from .fast import compiler as fast
    FAST_PATH_ERROR = None
except ImportError as _exc:      # no Numba (or GGVIZ_NO_NUMBA=1): every graph takes the node-by-node walk
    fast = None
    FAST_PATH_ERROR = f"{type(_exc).__name__}: {_exc}"

GGML_STATUS_SUCCESS = C.GGML_STATUS_SUCCESS
GGML_STATUS_ABORTED = C.GGML_STATUS_ABORTED


def vec_dot_type(t: int) -> int:
    return VEC_DOT_TYPE[t]


_N_THREADS_OPS = {C.GGML_OP_CPY, C.GGML_OP_DUP, C.GGML_OP_CONT, C.GGML_OP_ADD, C.GGML_OP_ADD_ID, C.GGML_OP_ADD1,
                  C.GGML_OP_ACC, C.GGML_OP_CUMSUM, C.GGML_OP_TRI, C.GGML_OP_FILL, C.GGML_OP_COUNT_EQUAL,
                  C.GGML_OP_SILU_BACK, C.GGML_OP_MUL, C.GGML_OP_DIV, C.GGML_OP_NORM, C.GGML_OP_RMS_NORM,
                  C.GGML_OP_RMS_NORM_BACK, C.GGML_OP_L2_NORM, C.GGML_OP_GROUP_NORM, C.GGML_OP_CONCAT,
                  C.GGML_OP_MUL_MAT, C.GGML_OP_MUL_MAT_ID, C.GGML_OP_OUT_PROD, C.GGML_OP_DIAG_MASK_ZERO,
                  C.GGML_OP_DIAG_MASK_INF, C.GGML_OP_SOFT_MAX_BACK, C.GGML_OP_ROPE, C.GGML_OP_ROPE_BACK,
                  C.GGML_OP_ADD_REL_POS, C.GGML_OP_IM2COL, C.GGML_OP_IM2COL_BACK, C.GGML_OP_CONV_2D,
                  C.GGML_OP_CONV_2D_DW, C.GGML_OP_CONV_TRANSPOSE_1D, C.GGML_OP_CONV_TRANSPOSE_2D,
                  C.GGML_OP_UPSCALE, C.GGML_OP_PAD, C.GGML_OP_PAD_REFLECT_1D, C.GGML_OP_ROLL, C.GGML_OP_ARANGE,
                  C.GGML_OP_TIMESTEP_EMBEDDING, C.GGML_OP_ARGSORT, C.GGML_OP_TOP_K, C.GGML_OP_FLASH_ATTN_EXT,
                  C.GGML_OP_FLASH_ATTN_BACK, C.GGML_OP_SSM_CONV, C.GGML_OP_SSM_SCAN}
_ONE_TASK_OPS = {C.GGML_OP_SUB, C.GGML_OP_SQR, C.GGML_OP_SQRT, C.GGML_OP_LOG, C.GGML_OP_SIN, C.GGML_OP_COS,
                 C.GGML_OP_SUM, C.GGML_OP_SUM_ROWS, C.GGML_OP_MEAN, C.GGML_OP_ARGMAX, C.GGML_OP_REPEAT,
                 C.GGML_OP_REPEAT_BACK, C.GGML_OP_LEAKY_RELU, C.GGML_OP_GET_ROWS, C.GGML_OP_SET_ROWS,
                 C.GGML_OP_SCALE, C.GGML_OP_SET, C.GGML_OP_RESHAPE, C.GGML_OP_VIEW, C.GGML_OP_PERMUTE,
                 C.GGML_OP_TRANSPOSE, C.GGML_OP_GET_ROWS_BACK, C.GGML_OP_DIAG, C.GGML_OP_CLAMP,
                 C.GGML_OP_POOL_1D, C.GGML_OP_POOL_2D, C.GGML_OP_POOL_2D_BACK, C.GGML_OP_WIN_PART,
                 C.GGML_OP_WIN_UNPART, C.GGML_OP_GET_REL_POS, C.GGML_OP_NONE}
_UNARY_MULTI = {C.GGML_UNARY_OP_GELU, C.GGML_UNARY_OP_GELU_ERF, C.GGML_UNARY_OP_GELU_QUICK, C.GGML_UNARY_OP_SILU,
                C.GGML_UNARY_OP_XIELU}


def get_n_tasks(node: Tensor, n_threads: int) -> int:
    """ggml_get_n_tasks: how many threads the planner counts for this node."""
    if is_empty(node):
        return 1     # no need to multi-thread a no-op
    op = node.op
    if op == C.GGML_OP_UNARY:
        return n_threads if get_unary_op(node) in _UNARY_MULTI else 1
    if op == C.GGML_OP_GLU:
        return n_threads
    if op == C.GGML_OP_SOFT_MAX:
        return min(n_threads, nrows(node.src[0]))
    if op in (C.GGML_OP_RWKV_WKV6, C.GGML_OP_GATED_LINEAR_ATTN, C.GGML_OP_RWKV_WKV7):
        return min(n_threads, int(node.src[1].ne[1]))
    if op in _N_THREADS_OPS:
        return n_threads
    if op in _ONE_TASK_OPS:
        return 1
    # custom ops and anything ggviz has no kernel for: ggml's default is to count all threads
    return n_threads


def node_work_size(node: Tensor, n_tasks: int, n_threads: int) -> int:
    """The per-op work-buffer need of ggml_graph_plan's switch."""
    op, s0, s1 = node.op, node.src[0], node.src[1]
    f32 = 4
    if op in (C.GGML_OP_CPY, C.GGML_OP_DUP):
        t0 = s0.type
        t1 = s1.type if s1 is not None else None
        if (is_quantized(node.type)
                or (t0 == C.GGML_TYPE_F16 and t1 == C.GGML_TYPE_BF16)
                or (t0 == C.GGML_TYPE_BF16 and t1 == C.GGML_TYPE_F16)
                or (t0 == C.GGML_TYPE_F32 and t1 == C.GGML_TYPE_I32)
                or (t0 == C.GGML_TYPE_I32 and t1 == C.GGML_TYPE_F32)):
            return f32 * int(node.ne[0]) * n_tasks
        return 0
    if op in (C.GGML_OP_ADD, C.GGML_OP_ADD_ID, C.GGML_OP_ADD1):
        return f32 * int(s0.ne[0]) * n_tasks if is_quantized(s0.type) else 0
    if op == C.GGML_OP_ACC:
        return f32 * int(s1.ne[0]) * n_tasks if is_quantized(s0.type) else 0
    if op == C.GGML_OP_COUNT_EQUAL:
        return type_size(node.type) * n_tasks
    if op == C.GGML_OP_MUL_MAT:
        vdt = vec_dot_type(s0.type)
        return row_size(vdt, nelements(s1)) if s1.type != vdt else 0
    if op == C.GGML_OP_MUL_MAT_ID:
        return mul_mat.mul_mat_id_work_size(node)
    if op == C.GGML_OP_OUT_PROD:
        return f32 * int(s0.ne[0]) * n_tasks if (is_quantized(s0.type) or s0.type == C.GGML_TYPE_F16) else 0
    if op == C.GGML_OP_SET_ROWS:
        return f32 * int(s0.ne[0]) * n_tasks if (s0.type == C.GGML_TYPE_F16 and node.type != C.GGML_TYPE_F16) else 0
    if op in (C.GGML_OP_SOFT_MAX, C.GGML_OP_ROPE, C.GGML_OP_ROPE_BACK):
        return f32 * int(node.ne[0]) * n_tasks
    if op == C.GGML_OP_TOP_K:
        return 4 * int(s0.ne[0]) * n_tasks
    if op == C.GGML_OP_FLASH_ATTN_EXT:
        # the larger of the tiled (batch) kernel's per-thread tiles and the decode kernel's accumulators + the
        # split-KV partials (M, S, VKQ per query head and KV chunk, one chunk per thread)
        neq2, dk, dv = int(s0.ne[2]), int(s1.ne[0]), int(node.src[2].ne[0])
        tq, tkv = FA_TILE_Q, FA_TILE_KV
        prefill = f32 * (tq * dk + 2 * tq * tkv + tq * dv + tkv * dv + tkv * dk) * n_tasks
        decode = f32 * (neq2 * n_tasks * (2 + dv) + n_tasks * (dk + 2 * dv))
        return max(prefill, decode)
    if op == C.GGML_OP_CROSS_ENTROPY_LOSS:
        return type_size(node.type) * (n_tasks + int(s0.ne[0]) * n_tasks)
    pi = powerinfer.work_size(node, n_tasks)      # PowerInfer's MUL_MAT_SPARSE / AXPY
    return pi if pi is not None else 0


class Cplan:
    """struct ggml_cplan."""

    def __init__(self, work_size=0, n_threads=1, threadpool=None):
        self.work_size = work_size
        self.work_data: np.ndarray | None = None
        self.n_threads = n_threads
        self.threadpool = threadpool
        self.abort_callback = None
        self.abort_callback_data = None
        self.use_ref = False
        self.n_tasks: list[int] = []     # ggviz: the per-node n_tasks the planner computed (for the views)
        self.extra = None                # ggviz: the graph compiled for the fast path (fast.compiler.FastGraph)

    def __repr__(self):
        return f"<ggml_cplan n_threads={self.n_threads} work_size={self.work_size}>"


def graph_plan(cgraph: CGraph, n_threads: int, threadpool=None) -> Cplan:
    """ggml_graph_plan."""
    if n_threads <= 0:
        n_threads = threadpool.n_threads if threadpool is not None else C.GGML_DEFAULT_N_THREADS
    work_size = 0
    max_tasks = 1
    per_node = []
    # ggviz: the compiled program of the graph (cached while the graph is unchanged), or None
    prog = fast.plan_graph(cgraph, n_threads) if fast is not None else None
    if prog is not None and n_threads in prog.plan_cache:
        work_size, max_tasks, per_node = prog.plan_cache[n_threads]
    else:
        nodes = cgraph.nodes
        seed = prog.plan_from[0].get(n_threads) if prog is not None and prog.plan_from is not None else None
        if seed is not None and len(seed[0]) == len(nodes):
            # ggviz: a program derived from one of the same topology (fast/compiler.py): the nodes whose structs
            # (or their sources') changed are planned here, the others planned as they were there; of the changed
            # ones, a node whose own and whose sources' words equal an earlier one's (``reps``: that one) takes its
            # answers, which are functions of those words
            per_node, node_ws = _plan_by_groups(nodes, n_threads, seed, *prog.plan_from[1:])
        elif prog is not None and prog.plan_groups is not None and len(prog.plan_groups[0]) == len(nodes):
            # ggviz: a program built by classes of equal rows (fast/compiler.py: _build_by_class): every node is
            # planned, but a node whose own and whose sources' words equal an earlier one's takes its answers
            per_node, node_ws = _plan_by_groups(nodes, n_threads, None, *prog.plan_groups)
        else:
            per_node, node_ws = [0] * len(nodes), [0] * len(nodes)
            for i, node in enumerate(nodes):
                n_tasks = get_n_tasks(node, n_threads)
                per_node[i] = n_tasks
                extra = traits.extra_work_size(n_threads, node)       # ggml_cpu_extra_work_size first
                node_ws[i] = extra if extra is not None else node_work_size(node, n_tasks, n_threads)
        max_tasks = max(per_node, default=1)          # (n_tasks >= 1)
        work_size = max(node_ws, default=0)
        if prog is not None:
            prog.plan_nodes[n_threads] = (per_node, node_ws)
    if prog is not None:
        work_size = max(work_size, prog.work_size)     # what the compiled kernels lay out differently (fast/)
        prog.plan_cache[n_threads] = (work_size, max_tasks, list(per_node))
    if work_size > 0:
        # one cache line per thread so per-thread scratch slices never share a line
        work_size += CACHE_LINE_SIZE * n_threads
    plan = Cplan(work_size, min(max_tasks, n_threads), threadpool)
    plan.n_tasks = list(per_node)
    plan.extra = prog
    if trace.active:
        trace.emit("cpu.plan", graph=graph_key(cgraph), n_threads=plan.n_threads, work_size=work_size, n_tasks=per_node)
    return plan


def _plan_by_groups(nodes, n_threads: int, seed, todo, reps, heads):
    """ggviz: ggml_graph_plan's per-node answers (n_tasks, work size) for a compiled program that knows which nodes
    to plan (``todo``: the others keep ``seed``'s answers, or 0 without one) and, for each, the node whose answers
    it takes (``reps``; ``heads``: those, planned here -- the answers are functions of a node's and its sources'
    words, equal in a group). Lists, as the loop's."""
    n = len(nodes)
    per_node = np.array(seed[0], np.int64) if seed is not None else np.zeros(n, np.int64)
    node_ws = np.array(seed[1], np.int64) if seed is not None else np.zeros(n, np.int64)
    for i in heads.tolist():
        node = nodes[i]
        n_tasks = get_n_tasks(node, n_threads)
        per_node[i] = n_tasks
        extra = traits.extra_work_size(n_threads, node)       # ggml_cpu_extra_work_size first
        node_ws[i] = extra if extra is not None else node_work_size(node, n_tasks, n_threads)
    per_node[todo] = per_node[reps]
    node_ws[todo] = node_ws[reps]
    return per_node.tolist(), node_ws.tolist()


def _dispatch():
    table = dict(cpu_ops.FORWARD)
    table[C.GGML_OP_MUL_MAT] = mul_mat.forward_mul_mat
    table[C.GGML_OP_MUL_MAT_ID] = mul_mat.forward_mul_mat_id
    table.update(powerinfer.FORWARD)
    return table, cpu_ops


def _compute_thread(ith: int, nth: int, cgraph: CGraph, cplan: Cplan, tp: _tp.Threadpool, table, cpu_ops):
    params = ComputeParams(ith, nth, cplan.work_data, tp, cplan.use_ref)
    state = tp.workers[ith]
    n = cgraph.n_nodes
    node_n = 0
    if tp.fast is not None:
        # ggviz fast path: every node compiled (fast/); decided once per compute by graph_compute, so that all
        # threads take the same walk even if somebody starts listening meanwhile
        tp.fast.compute_thread(ith, nth, cplan.work_data)
        node_n = n
    while node_n < n and tp.abort != node_n:
        node = cgraph.nodes[node_n]
        if node.op in EMPTY_OPS or not (node.flags & C.GGML_TENSOR_FLAG_COMPUTE):
            node_n += 1
            continue
        state.node_n = node_n
        t0 = time.perf_counter_ns() if trace.active else 0
        try:
            fused = (None if cplan.use_ref or node.op != C.GGML_OP_RMS_NORM
                     else cpu_ops.can_fuse_rms_norm_mul(cgraph, node_n))
            if fused is not None:
                cpu_ops.forward_rms_norm_mul_fused(params, node, fused)
            elif not is_empty(node) and not traits.extra_compute_forward(params, node):
                fn = table.get(node.op)
                if fn is None:
                    raise GGMLError(f"ggviz CPU backend has no kernel for op {op_desc(node)}")
                fn(params, node)
        except Exception as exc:
            # re-raised in the caller with the node's name. Interrupts (KeyboardInterrupt, SystemExit, and _Stop,
            # another worker's failure) are BaseExceptions, not Exceptions: they pass through unchanged, so that
            # `except KeyboardInterrupt` still catches a Ctrl-C that landed inside a kernel
            raise GGMLError(f"thread {ith}: computing node {node_n} {node.name!r} ({op_desc(node)}) failed: "
                            f"{type(exc).__name__}: {exc}") from exc
        if trace.active:
            trace.emit("cpu.node", ith=ith, node_n=node_n, addr=node.addr, name=node.name, op=op_desc(node),
                       t_start=t0, t_end=time.perf_counter_ns(), fused=fused is not None, pool=tp.serial,
                       n_graph=tp.n_graph,
                       kernel=mul_mat.cpu_kernel(node, nth) if node.op == C.GGML_OP_MUL_MAT else None)
        if fused is not None:
            node_n += 1
            state.node_n = node_n
        if ith == 0 and cplan.abort_callback is not None and cplan.abort_callback(cplan.abort_callback_data):
            tp.abort = node_n + 1
            tp.ec = GGML_STATUS_ABORTED
            if trace.active:
                trace.emit("cpu.abort", ith=ith, node_n=node_n, abort=node_n + 1, name=node.name, pool=tp.serial,
                           n_graph=tp.n_graph)
        if node_n + 1 < n and nth > 1:
            tp.barrier(ith, "node")
        node_n += 1
    # every thread waits for the others before leaving the graph (ggml_graph_compute_thread's last ggml_barrier)
    state.node_n = n
    if nth > 1:
        tp.barrier(ith, "final")


def graph_compute_thread(state) -> None:
    """ggml_graph_compute_thread: thread ``state.ith``'s walk over the pool's current graph.

    nth is the number of threads that take part, from the low bits of ``n_graph`` (set by the kickoff)."""
    tp = state.threadpool
    nth = tp.n_graph & GGML_THREADPOOL_N_THREADS_MASK
    table, cpu_ops = tp.dispatch
    _compute_thread(state.ith, nth, tp.cgraph, tp.cplan, tp, table, cpu_ops)


def graph_compute(cgraph: CGraph, cplan: Cplan) -> int:
    """ggml_graph_compute: run every node on cplan.n_threads threads; returns a ggml_status."""
    if cplan is None or cplan.n_threads <= 0:
        raise GGMLError("ggml_graph_compute: cplan.n_threads must be > 0")
    if cplan.work_size > 0 and (cplan.work_data is None or cplan.work_data.nbytes < cplan.work_size):
        raise GGMLError(f"ggml_graph_compute: cplan needs a work buffer of {cplan.work_size} bytes "
                        f"(got {0 if cplan.work_data is None else cplan.work_data.nbytes})")
    n_threads = cplan.n_threads
    tp = cplan.threadpool
    disposable = tp is None
    if disposable:
        # no threadpool given: a disposable one, freed below (its workers start now and wait for the kickoff)
        tp = _tp.threadpool_new_impl(_tp.threadpool_params_default(n_threads), cgraph, cplan)
    _tp.threadpool_claim(tp)     # ggviz: one caller at a time (raises if the pool is busy, freed or broken)
    try:
        if not disposable:
            # reset some of the parameters that need resetting (no worker is in a graph at this point)
            tp.cgraph = cgraph
            tp.cplan = cplan
            tp.current_chunk = 0
            tp.abort = -1
            tp.ec = GGML_STATUS_SUCCESS
        tp.dispatch = _dispatch()
        tp.compute_thread = graph_compute_thread
        if n_threads > tp.n_threads:
            warnings.warn(f"cplan requested more threads ({n_threads}) than available ({tp.n_threads})")
            n_threads = tp.n_threads
        # the compiled walk runs every node without returning to Python: not with an abort callback (ggml calls it
        # after every node) or in reference mode
        prog = cplan.extra if (cplan.extra is not None and not cplan.use_ref and cplan.abort_callback is None) \
            else None
        tp.fast = prog
        if prog is not None:
            prog.begin_compute(n_threads)
        traced = trace.active
        if traced:
            trace.emit("cpu.compute.start", graph=graph_key(cgraph), n_threads=n_threads, n_nodes=cgraph.n_nodes,
                       pool=tp.serial, disposable=disposable, compiled=prog is not None)
            if prog is not None:
                prog.trace_begin(n_threads)    # the compiled walk logs into an array; events follow the compute
        try:
            # kick all threads to start the new graph; this is a work thread too (worker 0)
            _tp.graph_compute_kickoff(tp, n_threads)
            _tp.run_thread0(tp)      # raises the first worker error, once every worker has left the graph
        finally:
            if traced and prog is not None:
                batch = prog.trace_end(cgraph, tp.serial, tp.n_graph)
                if trace.active:
                    trace.emit_batch(batch)
    finally:
        tp.fast = None
        _tp.threadpool_release(tp)
        if disposable:
            _tp.threadpool_free(tp)
    if trace.active:
        trace.emit("cpu.compute.end", graph=graph_key(cgraph), status=tp.ec, pool=tp.serial)
    return tp.ec


def graph_compute_with_ctx(ctx: Context, cgraph: CGraph, n_threads: int) -> int:
    """ggml_graph_compute_with_ctx: the work buffer is a WORK_BUFFER object in ``ctx`` (even when 0 bytes)."""
    cplan = graph_plan(cgraph, n_threads, None)
    obj = ctx.new_object(C.GGML_OBJECT_TYPE_WORK_BUFFER, cplan.work_size)
    cplan.work_data = ctx.mem_buffer[obj.offs:obj.offs + cplan.work_size]
    return graph_compute(cgraph, cplan)
