"""ggml-cpu.cpp: the CPU backend -- its backend (stream), device and reg -- over the executor of ``ggml_cpu.py``.

Mirrors (ggml 0.20.2 ``src/ggml-cpu/ggml-cpu.cpp``): ``struct ggml_backend_cpu_context`` (n_threads, threadpool,
work buffer, abort callback, use_ref), ``ggml_backend_cpu_init``, ``ggml_backend_is_cpu``,
``ggml_backend_cpu_set_n_threads`` / ``_set_threadpool`` / ``_set_abort_callback`` / ``_set_use_ref``, the backend
interface (``graph_compute`` = ``ggml_graph_plan`` + ``ggml_graph_compute``; ``graph_plan_create`` /
``graph_plan_compute``), the device (``supports_op`` -- asking the extra buffer types of ``traits.py`` first --,
``supports_buft`` = host or extra, memory from sysconf, the description from /proc/cpuinfo) and the reg
(``ggml_backend_cpu_reg``, with the functions it exports by name: ``ggml_backend_set_n_threads``,
``ggml_backend_dev_get_extra_bufts``, ``ggml_threadpool_new``, ...). The CPU *buffer type* is in ggml-backend.cpp,
so in ``ggviz.ggml.backend``.
"""
from __future__ import annotations

import os
import platform

import numpy as np

from .. import consts as C
from ..backend import (
    GGML_BACKEND_DEVICE_TYPE_CPU,
    backend_buft_is_host,
    backend_cpu_buffer_from_ptr,
    backend_cpu_buffer_type,
    backend_reg_dev_get,
    buffer_at,
    ggml_backend,
    ggml_backend_dev_caps,
    ggml_backend_device,
    ggml_backend_device_i,
    ggml_backend_i,
    ggml_backend_reg,
    ggml_backend_reg_i,
)
from ..impl import EMPTY_OPS, GGML_ASSERT, GGML_LOG
from ..tensor import _Q_BUFFER, _Q_SRC, _W_OP, Tensor, is_contiguous, is_quantized, tensor_at
from . import cpu_feats, ggml_cpu, traits
from . import threadpool as _tp
from .quants import VEC_DOT_TYPE


def backend_cpu_is_extra_buffer_type(buft) -> bool:
    return traits.is_extra_buffer_type(buft)


class ggml_backend_cpu_context:
    """``struct ggml_backend_cpu_context``."""

    def __init__(self):
        self.n_threads = C.GGML_DEFAULT_N_THREADS
        self.threadpool = None
        self.work_data: np.ndarray | None = None
        self.work_size = 0
        self.abort_callback = None
        self.abort_callback_data = None
        self.use_ref = False        # use reference implementation

    def __repr__(self):
        return f"<ggml_backend_cpu_context n_threads={self.n_threads} work_size={self.work_size}>"


class ggml_backend_plan_cpu:
    __slots__ = ("cplan", "cgraph")

    def __init__(self, cplan, cgraph):
        self.cplan, self.cgraph = cplan, cgraph


def _cpu_get_name(backend) -> str:
    return "CPU"


def _cpu_free(backend) -> None:
    ctx = backend.context
    ctx.work_data = None
    ctx.work_size = 0


def _cpu_graph_plan_create(backend, cgraph):
    ctx = backend.context
    cplan = ggml_cpu.graph_plan(cgraph, ctx.n_threads, ctx.threadpool)
    if cplan.work_size > 0:
        cplan.work_data = np.zeros(cplan.work_size, dtype=np.uint8)
    cplan.abort_callback = ctx.abort_callback
    cplan.abort_callback_data = ctx.abort_callback_data
    cplan.use_ref = ctx.use_ref
    return ggml_backend_plan_cpu(cplan, cgraph)     # FIXME in C: a shallow copy of the graph


def _cpu_graph_plan_free(backend, plan) -> None:
    plan.cplan.work_data = None


def _cpu_graph_plan_compute(backend, plan) -> int:
    return ggml_cpu.graph_compute(plan.cgraph, plan.cplan)


def _cpu_graph_compute(backend, cgraph) -> int:
    ctx = backend.context
    cplan = ggml_cpu.graph_plan(cgraph, ctx.n_threads, ctx.threadpool)
    if ctx.work_size < cplan.work_size:
        ctx.work_data = np.zeros(cplan.work_size, dtype=np.uint8)
        ctx.work_size = cplan.work_size
    cplan.work_data = ctx.work_data
    cplan.abort_callback = ctx.abort_callback
    cplan.abort_callback_data = ctx.abort_callback_data
    cplan.use_ref = ctx.use_ref
    return ggml_cpu.graph_compute(cgraph, cplan)


_cpu_backend_i = ggml_backend_i(
    get_name=_cpu_get_name,
    free=_cpu_free,
    set_tensor_async=None,
    get_tensor_async=None,
    cpy_tensor_async=None,
    synchronize=None,
    graph_plan_create=_cpu_graph_plan_create,
    graph_plan_free=_cpu_graph_plan_free,
    graph_plan_update=None,
    graph_plan_compute=_cpu_graph_plan_compute,
    graph_compute=_cpu_graph_compute,
    event_record=None,
    event_wait=None,
    graph_optimize=None,
)

_CPU_GUID = bytes([0xaa, 0x67, 0xc7, 0x43, 0x96, 0xe6, 0xa3, 0x8a, 0xe3, 0xaf, 0xea, 0x92, 0x36, 0xbc, 0xfc, 0x89])

_warned_variants: set[str] = set()


def backend_cpu_init():
    """ggml_backend_cpu_init: a CPU backend (stream) with GGML_DEFAULT_N_THREADS threads and no threadpool."""
    variant = cpu_feats.cpu_variant()   # ggviz: a GGVIZ_CPU_VARIANT it cannot compute as fails here, before any work
    warn = cpu_feats.variant_warning(variant)
    if warn and variant not in _warned_variants:       # once per process and variant
        _warned_variants.add(variant)
        GGML_LOG("warn", warn)
    return ggml_backend(_CPU_GUID, _cpu_backend_i, backend_reg_dev_get(backend_cpu_reg(), 0),
                        ggml_backend_cpu_context())


def backend_is_cpu(backend) -> bool:
    return backend is not None and backend.guid == _CPU_GUID


def backend_cpu_set_n_threads(backend_cpu, n_threads: int) -> None:
    GGML_ASSERT(backend_is_cpu(backend_cpu), "ggml_backend_is_cpu(backend_cpu)")
    backend_cpu.context.n_threads = n_threads


def backend_cpu_set_threadpool(backend_cpu, threadpool) -> None:
    GGML_ASSERT(backend_is_cpu(backend_cpu), "ggml_backend_is_cpu(backend_cpu)")
    ctx = backend_cpu.context
    if ctx.threadpool is not None and ctx.threadpool is not threadpool:
        # already had a different threadpool, pause/suspend it before switching
        _tp.threadpool_pause(ctx.threadpool)
    ctx.threadpool = threadpool


def backend_cpu_set_abort_callback(backend_cpu, abort_callback, abort_callback_data=None) -> None:
    GGML_ASSERT(backend_is_cpu(backend_cpu), "ggml_backend_is_cpu(backend_cpu)")
    backend_cpu.context.abort_callback = abort_callback
    backend_cpu.context.abort_callback_data = abort_callback_data


def backend_cpu_set_use_ref(backend_cpu, use_ref: bool) -> None:
    GGML_ASSERT(backend_is_cpu(backend_cpu), "ggml_backend_is_cpu(backend_cpu)")
    backend_cpu.context.use_ref = bool(use_ref)


# ---- CPU device

def _cpu_description() -> str:
    """The "model name" line of /proc/cpuinfo, as ggml_backend_cpu_device_context reads it ("CPU" otherwise)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    p = line.find(":")
                    if p >= 0:
                        return line[p + 1:].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


class ggml_backend_cpu_device_context:
    def __init__(self):
        self.description = _cpu_description()


def _cpu_dev_get_name(dev) -> str:
    return "CPU"


def _cpu_dev_get_description(dev) -> str:
    return dev.context.description


def _cpu_dev_get_memory(dev):
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 0
    # "free" system memory is ill-defined, for practical purposes assume that all of it is free
    return total, total


def _cpu_dev_get_type(dev) -> int:
    return GGML_BACKEND_DEVICE_TYPE_CPU


def _cpu_dev_get_props(dev, props) -> None:
    props.name = _cpu_dev_get_name(dev)
    props.description = _cpu_dev_get_description(dev)
    props.type = _cpu_dev_get_type(dev)
    props.memory_free, props.memory_total = _cpu_dev_get_memory(dev)
    props.caps = ggml_backend_dev_caps(async_=False, host_buffer=False, buffer_from_host_ptr=True, events=False,
                                       mmap_support=True)


def _cpu_dev_init_backend(dev, params):
    return backend_cpu_init()


def _cpu_dev_get_buffer_type(dev):
    return backend_cpu_buffer_type()


def _cpu_dev_buffer_from_host_ptr(dev, ptr, size, max_tensor_size):
    return backend_cpu_buffer_from_ptr(ptr, size)


_CPU_NO_FROM_FLOAT = {C.GGML_TYPE_IQ3_XXS, C.GGML_TYPE_IQ3_S, C.GGML_TYPE_IQ2_XXS, C.GGML_TYPE_IQ2_XS,
                      C.GGML_TYPE_IQ2_S, C.GGML_TYPE_IQ1_S, C.GGML_TYPE_IQ1_M}   # missing type_traits.from_float


_CPU_OPS_CHECKED = frozenset((C.GGML_OP_CPY, C.GGML_OP_SET_ROWS, C.GGML_OP_MUL_MAT, C.GGML_OP_SOFT_MAX_BACK,
                              C.GGML_OP_IM2COL_BACK, C.GGML_OP_GET_ROWS_BACK, C.GGML_OP_OUT_PROD, C.GGML_OP_CONV_2D,
                              C.GGML_OP_SSM_SCAN))


def _cpu_dev_supports_op(dev, op: Tensor) -> bool:
    """ggml_backend_cpu_device_supports_op (below, with what it reads)."""
    return _cpu_dev_supports_op_reads(dev, op)[0]


_NO_SHAPE = (True, ())


def _cpu_dev_supports_op_reads(dev, op: Tensor):
    """ggml_backend_cpu_device_supports_op's answer, and the tensors whose shape (ne/nb) it read (addresses:
    ggml_backend_device_i.supports_op_reads) -- those of the extra buffer type that answers, else OUT_PROD's two
    sources, CONV_2D's src[0] (is_contiguous), SSM_SCAN's src[3]; every other answer reads op codes, types, op
    params and buffers only."""
    o = op._w.item(_W_OP)
    if o in EMPTY_OPS:                                 # ggml_op_is_empty
        return _NO_SHAPE
    # check extra buffer types
    # note: only the first sources are checked for extra buffer types to reduce overhead, increase if necessary
    srcs = op._q[_Q_SRC:_Q_SRC + 4].tolist()          # op->src[0..3], the pointers read in one go
    extra = traits.extra_buffer_types() if any(srcs) else ()
    if extra:
        for a in srcs:
            if not a:
                continue
            buf = tensor_at(a)._q.item(_Q_BUFFER)
            if buf:
                buft = buffer_at(buf).buft
                for b in extra:
                    if b is buft:                      # ggml_backend_cpu_is_extra_buffer_type
                        f = getattr(buft.context, "supports_op_reads", None)
                        if f is None:
                            return bool(buft.context.supports_op(dev, op)), None
                        r, reads = f(dev, op)
                        return bool(r), reads
    if o not in _CPU_OPS_CHECKED:                      # (the ops below; every other op is supported)
        return _NO_SHAPE
    src0, src1 = tensor_at(srcs[0]), tensor_at(srcs[1])
    if o in (C.GGML_OP_CPY, C.GGML_OP_SET_ROWS):
        return op.type not in _CPU_NO_FROM_FLOAT, ()
    if o == C.GGML_OP_MUL_MAT:
        return src1.type == C.GGML_TYPE_F32 or src1.type == VEC_DOT_TYPE.get(src0.type), ()
    if o == C.GGML_OP_SOFT_MAX_BACK:
        if op.src[0].type != C.GGML_TYPE_F32 or op.src[1].type != C.GGML_TYPE_F32:
            return False, ()
        max_bias = float(op.op_params[1:2].view(np.float32)[0])
        return max_bias == 0.0, ()
    if o == C.GGML_OP_IM2COL_BACK:
        return src0.type == C.GGML_TYPE_F32 and src1.type in (C.GGML_TYPE_F32, C.GGML_TYPE_F16), ()
    if o == C.GGML_OP_GET_ROWS_BACK:
        return src0.type in (C.GGML_TYPE_F32, C.GGML_TYPE_F16), ()
    if o == C.GGML_OP_OUT_PROD:
        return ((src0.type == C.GGML_TYPE_F32
                 or ((src0.type == C.GGML_TYPE_F16 or is_quantized(src0.type))
                     and src0.ne[2] == src1.ne[2] and src0.ne[3] == src1.ne[3]))
                and src1.type == C.GGML_TYPE_F32 and op.type == C.GGML_TYPE_F32), (srcs[0], srcs[1])
    if o == C.GGML_OP_CONV_2D:
        return is_contiguous(op.src[0]), (srcs[0],)
    if o == C.GGML_OP_SSM_SCAN:
        return int(op.op_params[0]) == 1 or op.src[3].ne[0] == 1, (srcs[3],)
    return _NO_SHAPE


def _cpu_dev_supports_buft(dev, buft) -> bool:
    return backend_buft_is_host(buft) or backend_cpu_is_extra_buffer_type(buft)


_cpu_device_i = ggml_backend_device_i(
    get_name=_cpu_dev_get_name,
    get_description=_cpu_dev_get_description,
    get_memory=_cpu_dev_get_memory,
    get_type=_cpu_dev_get_type,
    get_props=_cpu_dev_get_props,
    init_backend=_cpu_dev_init_backend,
    get_buffer_type=_cpu_dev_get_buffer_type,
    get_host_buffer_type=None,
    buffer_from_host_ptr=_cpu_dev_buffer_from_host_ptr,
    supports_op=_cpu_dev_supports_op,
    supports_buft=_cpu_dev_supports_buft,
    offload_op=None,
    event_new=None,
    event_free=None,
    event_synchronize=None,
    supports_op_reads=_cpu_dev_supports_op_reads,
)


# ---- CPU reg

def _cpu_reg_get_name(reg) -> str:
    return "CPU"


def _cpu_reg_get_device_count(reg) -> int:
    return 1


_cpu_device = None


def _cpu_reg_get_device(reg, index: int):
    global _cpu_device
    GGML_ASSERT(index == 0, "index == 0")
    if _cpu_device is None:
        _cpu_device = ggml_backend_device(_cpu_device_i, reg, ggml_backend_cpu_device_context())
    return _cpu_device


def _cpu_get_extra_bufts(device) -> list:
    """ggml_backend_dev_get_extra_bufts_t for the CPU: the extra buffer types, NULL-terminated as in C."""
    return traits.get_extra_buffer_types() + [None]


def _cpu_get_features(reg) -> list:
    """ggml_backend_cpu_get_features: what the build was compiled with -- the instruction-set macros of the variant
    ggviz computes as (``cpu_feats.cpu_variant()``, haswell), tinyBLAS (GGML_USE_LLAMAFILE, always), no OpenMP
    (ggviz's threadpool is ggml's own), and REPACK when the repacking buffer type is there."""
    feats = [(f, "1") for f in cpu_feats.variant_features(cpu_feats.cpu_variant())]
    feats.append(("LLAMAFILE", "1"))
    if traits.get_extra_buffer_types():
        feats.append(("REPACK", "1"))
    feats.append((None, None))
    return feats


def _cpu_get_proc_address(reg, name: str):
    table = {
        "ggml_backend_set_n_threads": backend_cpu_set_n_threads,
        "ggml_backend_dev_get_extra_bufts": _cpu_get_extra_bufts,
        "ggml_backend_get_features": _cpu_get_features,
        "ggml_backend_set_abort_callback": backend_cpu_set_abort_callback,
        "ggml_backend_cpu_set_use_ref": backend_cpu_set_use_ref,
        "ggml_threadpool_new": getattr(_tp, "threadpool_new", None),
        "ggml_threadpool_free": getattr(_tp, "threadpool_free", None),
        "ggml_backend_cpu_set_threadpool": backend_cpu_set_threadpool,
    }
    return table.get(name)


_cpu_reg = None


def backend_cpu_reg():
    """ggml_backend_cpu_reg: the CPU backend's registration entry (one static object)."""
    global _cpu_reg
    if _cpu_reg is None:
        _cpu_reg = ggml_backend_reg(ggml_backend_reg_i(
            get_name=_cpu_reg_get_name,
            get_device_count=_cpu_reg_get_device_count,
            get_device=_cpu_reg_get_device,
            get_proc_address=_cpu_get_proc_address,
        ))
    return _cpu_reg
