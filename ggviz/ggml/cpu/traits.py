"""ggml-cpu's traits.h / traits.cpp: how the CPU executor asks its extra buffer types to take an op.

Mirrors (ggml 0.20.2 ``src/ggml-cpu``): ``ggml::cpu::tensor_traits`` (``work_size``, ``compute_forward``) and
``ggml::cpu::extra_buffer_type`` (``supports_op``, ``get_tensor_traits``) -- duck-typed here, implemented by
``repack.py`` -- and the two questions every extra buffer type is asked: ``ggml_cpu_extra_compute_forward`` (the
executor calls it before its own op switch) and ``ggml_cpu_extra_work_size`` (the planner, before its own work-size
switch). ``get_extra_buffer_types`` is ggml-cpu.cpp's ``ggml_backend_cpu_get_extra_buffer_types``: the extra buffer
types this build has -- here CPU_REPACK only, and only when the compiled kernels are available (like ggml built
without ``GGML_USE_CPU_REPACK`` otherwise). It sits here, beside its users, so that imports run one way.
"""
from __future__ import annotations

from .. import consts as C
from ..tensor import Tensor
from . import repack


_extra_bufts: tuple | None = None


def extra_buffer_types() -> tuple:
    """The extra buffer types, made on the first call and kept: ggml-cpu.cpp's static vector (what it holds is fixed
    once the module is imported: the compiled kernels loaded or not, GGVIZ_NO_REPACK read at import). The CPU
    device's supports_op asks for them for every op with a source (~600 times a graph split)."""
    global _extra_bufts
    if _extra_bufts is None:
        _extra_bufts = (repack.repack_buffer_type(),) if repack.available() else ()
    return _extra_bufts


def get_extra_buffer_types() -> list:
    """ggml_backend_cpu_get_extra_buffer_types."""
    return list(extra_buffer_types())


def is_extra_buffer_type(buft) -> bool:
    return buft is not None and any(b is buft for b in get_extra_buffer_types())


def extra_compute_forward(params, op: Tensor) -> bool:
    """ggml_cpu_extra_compute_forward: True if an extra buffer type computed the op."""
    if op.op != C.GGML_OP_MUL_MAT or not repack.in_use():     # ggviz: skip the loop for graphs without one
        return False
    for extra in get_extra_buffer_types():
        tr = extra.context.get_tensor_traits(op)
        if tr is not None and tr.compute_forward(params, op):
            return True
    return False


def extra_work_size(n_threads: int, op: Tensor):
    """ggml_cpu_extra_work_size: the work size an extra buffer type wants for the op, or None."""
    if op.op != C.GGML_OP_MUL_MAT or not repack.in_use():
        return None
    for extra in get_extra_buffer_types():
        tr = extra.context.get_tensor_traits(op)
        if tr is not None:
            size = tr.work_size(n_threads, op)
            if size is not None:
                return size
    return None
