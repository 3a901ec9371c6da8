"""ggviz.ggml: ggml's C API, mirrored in Python.

Every public ggml function keeps its name without the ``ggml_`` prefix and its argument order:
``ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 2)`` is ``ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 4, 2)``;
constants keep their C names and values (``ggml.GGML_TYPE_Q4_0 == 2``). The modules behind it follow ggml's
sources: ``context`` (ggml_init and the arena), ``tensor`` (struct ggml_tensor), ``ops`` (graph building),
``graph`` (ggml_cgraph), ``quants`` (ggml-quants.c), ``cpu`` (the CPU backend: plan, kernels, compute).
"""
from __future__ import annotations

from .consts import *  # noqa: F401,F403  (GGML_TYPE_*, GGML_OP_*, ...)
from . import consts as _C
from .context import Context, ContextOutOfMemory, GGMLError, Object
from .tensor import (Tensor, blck_size, can_mul_mat, can_out_prod, can_repeat, can_repeat_rows,  # noqa: F401
                     element_size, get_data, get_data_f32, get_glu_op, get_op_params_f32, get_op_params_i32,
                     get_unary_op, glu_op_name, is_3d, is_contiguous, is_contiguous_0, is_contiguous_1,
                     is_contiguous_2, is_contiguous_rows, is_contiguously_allocated, is_empty, is_matrix,
                     is_padded_1d, is_permuted, is_quantized, is_scalar, is_transposed, is_vector, is_view,
                     n_dims, nbytes, nbytes_pad, nelements, nrows, op_desc, op_name, op_symbol, row_size,
                     set_data, set_op_params_f32, set_op_params_i32, tensor_at, type_name, type_size, type_sizef,
                     unary_op_name, are_same_shape, are_same_stride, GGML_PAD)
from .ops import *  # noqa: F401,F403
from .graph import (CGraph, build_forward_expand, build_forward_order, build_forward_select,  # noqa: F401
                    graph_add_node, graph_clear, graph_get_tensor, graph_n_nodes, graph_nbytes, graph_node,
                    graph_key, graph_nodes, graph_overhead, graph_overhead_custom, graph_size, graph_view, hash_size,
                    new_graph, new_graph_custom, visit_parents)


def init(mem_size: int, mem_buffer=None, no_alloc: bool = False) -> Context:
    """ggml_init(params): a context whose arena is ``mem_size`` bytes (a NumPy uint8 array)."""
    if isinstance(mem_size, dict):   # ggml_init((struct ggml_init_params){...}) spelled as a dict
        p = mem_size
        return Context(p.get("mem_size", 0), p.get("mem_buffer"), p.get("no_alloc", False))
    return Context(mem_size, mem_buffer, no_alloc)


def free(ctx: Context) -> None:
    ctx.free()


def reset(ctx: Context) -> None:
    ctx.reset()


def used_mem(ctx: Context) -> int:
    return ctx.used_mem()


def get_mem_buffer(ctx: Context):
    """The arena itself (NumPy uint8, zero-copy): ``ggml_get_mem_buffer``."""
    return ctx.mem_buffer


def get_mem_size(ctx: Context) -> int:
    return ctx.mem_size


def get_no_alloc(ctx: Context) -> bool:
    return ctx.no_alloc


def set_no_alloc(ctx: Context, no_alloc: bool) -> None:
    ctx.no_alloc = bool(no_alloc)


def get_max_tensor_size(ctx: Context) -> int:
    return max((nbytes(t) for t in ctx.tensors()), default=0)


def tensor_overhead() -> int:
    return _C.GGML_OBJECT_SIZE + _C.GGML_TENSOR_SIZE


def new_buffer(ctx: Context, nbytes_: int):
    """ggml_new_buffer: a work-buffer object in the arena; returns its bytes (NumPy view)."""
    obj = ctx.new_object(_C.GGML_OBJECT_TYPE_WORK_BUFFER, nbytes_)
    return ctx.mem_buffer[obj.offs:obj.offs + nbytes_]


def get_first_tensor(ctx: Context):
    return next(ctx.tensors(), None)


def get_next_tensor(ctx: Context, tensor: Tensor):
    found = False
    for t in ctx.tensors():
        if found:
            return t
        found = t is tensor or t.addr == tensor.addr
    return None


def get_tensor(ctx: Context, name: str):
    for t in ctx.tensors():
        if t.name == name:
            return t
    return None


def __getattr__(name):
    # the CPU backend's entry points (ggml-cpu.h) are re-exported lazily: they import the kernels
    if name in ("graph_plan", "graph_compute", "graph_compute_with_ctx", "Cplan", "get_n_tasks"):
        from .cpu import ggml_cpu
        return getattr(ggml_cpu, name)
    if name in ("threadpool_new", "threadpool_free", "threadpool_pause", "threadpool_resume",
                "threadpool_params_default", "threadpool_params_init", "threadpool_params_match",
                "threadpool_get_n_threads"):
        from .cpu import threadpool
        return getattr(threadpool, name)
    raise AttributeError(f"module 'ggviz.ggml' has no attribute {name!r}")
