"""ggviz.ggml: ggml's C API, mirrored in Python.

Every public ggml function keeps its name without the ``ggml_`` prefix and its argument order:
``ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 2)`` is ``ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 4, 2)``;
constants keep their C names and values (``ggml.GGML_TYPE_Q4_0 == 2``). The modules behind it follow ggml's
sources (the README's file map lists each module beside its C file): ``impl`` (ggml-impl.h), ``context`` (ggml_init
and the arena), ``tensor`` (struct ggml_tensor), ``ops`` (graph building), ``graph`` (ggml_cgraph), ``quants``
(ggml-quants.c), ``alloc`` (ggml-alloc.c), ``backend`` (ggml-backend.cpp), ``backend_reg`` (ggml-backend-reg.cpp),
``sched`` (the scheduler of ggml-backend.cpp), ``cpu`` (ggml-cpu: executor, threadpool, kernels, CPU backend),
``blas`` (ggml-blas.cpp) and ``accel`` (a simulated accelerator backend).

The names of ggml.h and ggml-cpu.h (``ggml.graph_compute``, ``ggml.threadpool_new`` ...) are re-exported here; the
backend API lives in its modules, as in its headers (``ggml.backend.backend_buft_alloc_buffer``,
``ggml.cpu.cpu_backend.backend_cpu_init``, ``ggml.backend_reg.backend_dev_count``).
"""
from __future__ import annotations

from .consts import *  # noqa: F401,F403  (GGML_TYPE_*, GGML_OP_*, ...)
from .context import (  # noqa: F401
                      Context,
                      ContextOutOfMemory,
                      Object,
                      free,
                      get_first_tensor,
                      get_max_tensor_size,
                      get_mem_buffer,
                      get_mem_size,
                      get_next_tensor,
                      get_no_alloc,
                      get_tensor,
                      init,
                      new_buffer,
                      reset,
                      set_no_alloc,
                      tensor_overhead,
                      used_mem,
)
from .cpu.ggml_cpu import Cplan, get_n_tasks, graph_compute, graph_compute_with_ctx, graph_plan  # noqa: F401,E402
from .cpu.threadpool import (  # noqa: F401,E402,E501
                      threadpool_free,
                      threadpool_get_n_threads,
                      threadpool_new,
                      threadpool_params_default,
                      threadpool_params_init,
                      threadpool_params_match,
                      threadpool_pause,
                      threadpool_resume,
)
from .graph import (  # noqa: F401
                      CGraph,
                      build_forward_expand,
                      build_forward_order,
                      build_forward_select,
                      graph_add_node,
                      graph_clear,
                      graph_get_tensor,
                      graph_key,
                      graph_n_nodes,
                      graph_nbytes,
                      graph_node,
                      graph_nodes,
                      graph_overhead,
                      graph_overhead_custom,
                      graph_size,
                      graph_view,
                      hash_size,
                      new_graph,
                      new_graph_custom,
                      visit_parents,
)
from .impl import GGML_ASSERT, GGML_PAD, GGMLError, op_is_empty  # noqa: F401
from .ops import *  # noqa: F401,F403
from .tensor import (  # noqa: F401
                      Tensor,
                      are_same_shape,
                      are_same_stride,
                      blck_size,
                      can_mul_mat,
                      can_out_prod,
                      can_repeat,
                      can_repeat_rows,
                      element_size,
                      get_data,
                      get_data_f32,
                      get_glu_op,
                      get_op_params_f32,
                      get_op_params_i32,
                      get_unary_op,
                      glu_op_name,
                      is_3d,
                      is_contiguous,
                      is_contiguous_0,
                      is_contiguous_1,
                      is_contiguous_2,
                      is_contiguous_rows,
                      is_contiguously_allocated,
                      is_empty,
                      is_matrix,
                      is_padded_1d,
                      is_permuted,
                      is_quantized,
                      is_scalar,
                      is_transposed,
                      is_vector,
                      is_view,
                      n_dims,
                      nbytes,
                      nbytes_pad,
                      nelements,
                      nrows,
                      op_desc,
                      op_name,
                      op_symbol,
                      row_size,
                      set_data,
                      set_op_params_f32,
                      set_op_params_i32,
                      tensor_at,
                      type_name,
                      type_size,
                      type_sizef,
                      unary_op_name,
)
