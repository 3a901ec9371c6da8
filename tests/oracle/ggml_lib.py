"""ctypes bindings to the real ggml (the differential-testing oracle).

Test-only dependency: the PyPI package ``libggml-python`` (0.20.2) ships
``libggml/lib64/libggml-base.so`` and ``libggml-cpu.so`` plus the public
headers.  This module only *binds* those libraries; it contains no ggml code.

Usage::

    from tests.oracle.ggml_lib import RealGGML, available
    g = RealGGML()
    ctx = g.init(16 * 1024 * 1024)
    a = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    g.set_array(a, np.arange(6, dtype=np.float32))
    ...
    g.free(ctx)

Conventions
-----------
* Every public C function ``ggml_X`` of ggml.h / ggml-alloc.h / ggml-backend.h /
  ggml-cpu.h is reachable as ``g.X`` with the same argument order.  The exact
  C signature of each one is declared in ``_SIGNATURES`` below (generated from
  the 0.20.2 headers) and set as argtypes/restype before the first call.
* Pointers (tensors, contexts, graphs, buffers ...) travel as plain Python
  ints (``None`` for NULL); ``const char *`` takes ``str`` and returns ``str``.
  Typed array parameters (``const int64_t * ne``, ``int sections[4]``, ...)
  also accept lists/tuples or numpy arrays of the right dtype.
* ``g.GGML_*`` resolves enum values and integer ``#define``s of ggml.h.
* Enum arguments are C ``int``.

Beware: a failed ``GGML_ASSERT`` inside ggml calls ``abort()`` and kills the
whole Python process.  Use :func:`run_in_subprocess` for negative tests.
"""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_float,
                    c_int, c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32,
                    c_uint64, c_void_p)

import numpy as np

__all__ = ["RealGGML", "available", "unavailable_reason", "OracleUnavailable",
           "GGMLTensor", "GGMLCGraph", "GGMLCPlan", "GGMLInitParams", "run_in_subprocess"]

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_MEM_ALIGN = 16
GGML_OBJECT_SIZE = 32          # sizeof(struct ggml_object)
GGML_TENSOR_SIZE = 336         # sizeof(struct ggml_tensor) on 64-bit


class OracleUnavailable(RuntimeError):
    """The real ggml shared libraries could not be located or loaded."""


# --------------------------------------------------------------------------------------
# C structures (layouts mirrored from ggml 0.20.2: include/ggml.h, src/ggml-impl.h,
# src/ggml.c, include/ggml-cpu.h).  Sizes are asserted at load time where possible.
# --------------------------------------------------------------------------------------

class GGMLInitParams(Structure):          # struct ggml_init_params (ggml.h)
    _fields_ = [("mem_size", c_size_t),
                ("mem_buffer", c_void_p),
                ("no_alloc", c_bool)]


class GGMLTensor(Structure):              # struct ggml_tensor (ggml.h)
    _fields_ = [("type", c_int),
                ("buffer", c_void_p),
                ("ne", c_int64 * GGML_MAX_DIMS),
                ("nb", c_size_t * GGML_MAX_DIMS),
                ("op", c_int),
                ("op_params", c_int32 * (GGML_MAX_OP_PARAMS // 4)),
                ("flags", c_int32),
                ("src", c_void_p * GGML_MAX_SRC),
                ("view_src", c_void_p),
                ("view_offs", c_size_t),
                ("data", c_void_p),
                ("name", c_char * GGML_MAX_NAME),
                ("extra", c_void_p),
                ("padding", c_char * 8)]


class GGMLHashSet(Structure):             # struct ggml_hash_set (ggml-impl.h, private)
    _fields_ = [("size", c_size_t),
                ("used", POINTER(c_uint32)),      # ggml_bitset_t == uint32_t
                ("keys", POINTER(c_void_p))]


class GGMLCGraph(Structure):              # struct ggml_cgraph (ggml-impl.h, private)
    _fields_ = [("size", c_int),
                ("n_nodes", c_int),
                ("n_leafs", c_int),
                ("nodes", POINTER(c_void_p)),
                ("grads", POINTER(c_void_p)),
                ("grad_accs", POINTER(c_void_p)),
                ("leafs", POINTER(c_void_p)),
                ("use_counts", POINTER(c_int32)),
                ("visited_hash_set", GGMLHashSet),
                ("order", c_int),                 # enum ggml_cgraph_eval_order
                ("uid", c_uint64)]


class GGMLCPlan(Structure):               # struct ggml_cplan (ggml-cpu.h), returned by value
    _fields_ = [("work_size", c_size_t),
                ("work_data", c_void_p),
                ("n_threads", c_int),
                ("threadpool", c_void_p),
                ("abort_callback", c_void_p),
                ("abort_callback_data", c_void_p),
                ("use_ref", c_bool)]


class GGMLObject(Structure):              # struct ggml_object (ggml.c, private)
    _fields_ = [("offs", c_size_t),
                ("size", c_size_t),
                ("next", c_void_p),
                ("type", c_int),
                ("padding", c_char * 4)]


class GGMLContext(Structure):             # struct ggml_context (ggml.c, private)
    _fields_ = [("mem_size", c_size_t),
                ("mem_buffer", c_void_p),
                ("mem_buffer_owned", c_bool),
                ("no_alloc", c_bool),
                ("n_objects", c_int),
                ("objects_begin", c_void_p),
                ("objects_end", c_void_p)]


class GGMLTypeTraits(Structure):          # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", c_char_p),
                ("blck_size", c_int64),
                ("blck_size_interleave", c_int64),
                ("type_size", c_size_t),
                ("is_quantized", c_bool),
                ("to_float", c_void_p),
                ("from_float_ref", c_void_p)]


assert ctypes.sizeof(GGMLTensor) == GGML_TENSOR_SIZE, ctypes.sizeof(GGMLTensor)
assert ctypes.sizeof(GGMLObject) == GGML_OBJECT_SIZE
assert ctypes.sizeof(GGMLCGraph) == 96, ctypes.sizeof(GGMLCGraph)
assert ctypes.sizeof(GGMLCPlan) == 56, ctypes.sizeof(GGMLCPlan)

_TO_FLOAT_T = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_int64)   # ggml_to_float_t

# --------------------------------------------------------------------------------------
# Signature table, generated from the public headers of ggml 0.20.2.
# Columns: name (without the ggml_ prefix), return type, argument types ("-" = none).
# Codes: p = any pointer (void*, struct X*, opaque *_t handles, callbacks) -> int/None
#        s = const char * (str)          v = void
#        i = int / enum (c_int)          i32/u32/i64/u64/u8/u16 = fixed width ints
#        sz = size_t   f = float   d = double   b = bool
#        *f/*i/*i32/*i64/*sz = typed array pointer (float*, int*, ...): accepts
#        list/tuple, numpy array of that dtype, ctypes array, address int or None.
# Functions with struct-by-value arguments/results or varargs are bound by hand
# (init, graph_plan, format_name) or not at all (abort, threadpool_params_default,
# tallocr_new, backend_graph_copy, backend_graph_copy_free).
# --------------------------------------------------------------------------------------
_SIGNATURES = """
# --- ggml.h
set_abort_callback                           p    p
status_to_string                             s    i
fp16_to_fp32                                 f    u16
fp32_to_fp16                                 u16  f
fp16_to_fp32_row                             v    p *f i64
fp32_to_fp16_row                             v    *f p i64
fp32_to_bf16                                 u16  f
bf16_to_fp32                                 f    u16
bf16_to_fp32_row                             v    p *f i64
fp32_to_bf16_row_ref                         v    *f p i64
fp32_to_bf16_row                             v    *f p i64
guid_matches                                 b    p p
version                                      s    -
commit                                       s    -
time_init                                    v    -
time_ms                                      i64  -
time_us                                      i64  -
cycles                                       i64  -
cycles_per_ms                                i64  -
fopen                                        p    s s
print_object                                 v    p
print_objects                                v    p
nelements                                    i64  p
nrows                                        i64  p
nbytes                                       sz   p
nbytes_pad                                   sz   p
blck_size                                    i64  i
type_size                                    sz   i
row_size                                     sz   i i64
type_sizef                                   d    i
type_name                                    s    i
op_name                                      s    i
op_symbol                                    s    i
unary_op_name                                s    i
glu_op_name                                  s    i
op_desc                                      s    p
element_size                                 sz   p
is_quantized                                 b    i
ftype_to_ggml_type                           i    i
is_transposed                                b    p
is_permuted                                  b    p
is_empty                                     b    p
is_view                                      b    p
is_scalar                                    b    p
is_vector                                    b    p
is_matrix                                    b    p
is_3d                                        b    p
n_dims                                       i    p
is_contiguous                                b    p
is_contiguous_0                              b    p
is_contiguous_1                              b    p
is_contiguous_2                              b    p
is_contiguous_to_1                           b    p
is_contiguous_to_2                           b    p
is_contiguous_to_3                           b    p
is_contiguously_allocated                    b    p
is_contiguous_channels                       b    p
is_contiguous_rows                           b    p
are_same_shape                               b    p p
are_same_stride                              b    p p
can_repeat                                   b    p p
tensor_overhead                              sz   -
validate_row_data                            b    i p sz
reset                                        v    p
free                                         v    p
used_mem                                     sz   p
get_no_alloc                                 b    p
set_no_alloc                                 v    p b
get_mem_buffer                               p    p
get_mem_size                                 sz   p
get_max_tensor_size                          sz   p
new_tensor                                   p    p i i *i64
new_tensor_1d                                p    p i i64
new_tensor_2d                                p    p i i64 i64
new_tensor_3d                                p    p i i64 i64 i64
new_tensor_4d                                p    p i i64 i64 i64 i64
new_buffer                                   p    p sz
dup_tensor                                   p    p p
view_tensor                                  p    p p
get_first_tensor                             p    p
get_next_tensor                              p    p p
get_tensor                                   p    p s
unravel_index                                v    p i64 *i64 *i64 *i64 *i64
get_unary_op                                 i    p
get_glu_op                                   i    p
get_data                                     p    p
get_data_f32                                 *f   p
get_name                                     s    p
set_name                                     p    p s
set_input                                    v    p
set_output                                   v    p
set_param                                    v    p
set_loss                                     v    p
dup                                          p    p p
dup_inplace                                  p    p p
add                                          p    p p p
add_inplace                                  p    p p p
add_cast                                     p    p p p i
add_id                                       p    p p p p
add1                                         p    p p p
add1_inplace                                 p    p p p
acc                                          p    p p p sz sz sz sz
acc_inplace                                  p    p p p sz sz sz sz
sub                                          p    p p p
sub_inplace                                  p    p p p
mul                                          p    p p p
mul_inplace                                  p    p p p
div                                          p    p p p
div_inplace                                  p    p p p
sqr                                          p    p p
sqr_inplace                                  p    p p
sqrt                                         p    p p
sqrt_inplace                                 p    p p
log                                          p    p p
log_inplace                                  p    p p
expm1                                        p    p p
expm1_inplace                                p    p p
softplus                                     p    p p
softplus_inplace                             p    p p
sin                                          p    p p
sin_inplace                                  p    p p
cos                                          p    p p
cos_inplace                                  p    p p
sum                                          p    p p
sum_rows                                     p    p p
cumsum                                       p    p p
mean                                         p    p p
argmax                                       p    p p
count_equal                                  p    p p p
repeat                                       p    p p p
repeat_4d                                    p    p p i64 i64 i64 i64
repeat_back                                  p    p p p
concat                                       p    p p p i
abs                                          p    p p
abs_inplace                                  p    p p
sgn                                          p    p p
sgn_inplace                                  p    p p
neg                                          p    p p
neg_inplace                                  p    p p
step                                         p    p p
step_inplace                                 p    p p
tanh                                         p    p p
tanh_inplace                                 p    p p
elu                                          p    p p
elu_inplace                                  p    p p
relu                                         p    p p
leaky_relu                                   p    p p f b
relu_inplace                                 p    p p
sigmoid                                      p    p p
sigmoid_inplace                              p    p p
gelu                                         p    p p
gelu_inplace                                 p    p p
gelu_erf                                     p    p p
gelu_erf_inplace                             p    p p
gelu_quick                                   p    p p
gelu_quick_inplace                           p    p p
silu                                         p    p p
silu_inplace                                 p    p p
silu_back                                    p    p p p
hardswish                                    p    p p
hardsigmoid                                  p    p p
exp                                          p    p p
exp_inplace                                  p    p p
floor                                        p    p p
floor_inplace                                p    p p
ceil                                         p    p p
ceil_inplace                                 p    p p
round                                        p    p p
round_inplace                                p    p p
trunc                                        p    p p
trunc_inplace                                p    p p
xielu                                        p    p p f f f f
glu                                          p    p p i b
reglu                                        p    p p
reglu_swapped                                p    p p
geglu                                        p    p p
geglu_swapped                                p    p p
swiglu                                       p    p p
swiglu_swapped                               p    p p
geglu_erf                                    p    p p
geglu_erf_swapped                            p    p p
geglu_quick                                  p    p p
geglu_quick_swapped                          p    p p
glu_split                                    p    p p p i
reglu_split                                  p    p p p
geglu_split                                  p    p p p
swiglu_split                                 p    p p p
geglu_erf_split                              p    p p p
geglu_quick_split                            p    p p p
swiglu_oai                                   p    p p p f f
norm                                         p    p p f
norm_inplace                                 p    p p f
rms_norm                                     p    p p f
rms_norm_inplace                             p    p p f
group_norm                                   p    p p i f
group_norm_inplace                           p    p p i f
l2_norm                                      p    p p f
l2_norm_inplace                              p    p p f
rms_norm_back                                p    p p p f
mul_mat                                      p    p p p
mul_mat_set_prec                             v    p i
mul_mat_set_hint                             v    p i
mul_mat_id                                   p    p p p p
out_prod                                     p    p p p
scale                                        p    p p f
scale_inplace                                p    p p f
scale_bias                                   p    p p f f
scale_bias_inplace                           p    p p f f
set                                          p    p p p sz sz sz sz
set_inplace                                  p    p p p sz sz sz sz
set_1d                                       p    p p p sz
set_1d_inplace                               p    p p p sz
set_2d                                       p    p p p sz sz
set_2d_inplace                               p    p p p sz sz
cpy                                          p    p p p
cast                                         p    p p i
cont                                         p    p p
cont_1d                                      p    p p i64
cont_2d                                      p    p p i64 i64
cont_3d                                      p    p p i64 i64 i64
cont_4d                                      p    p p i64 i64 i64 i64
reshape                                      p    p p p
reshape_1d                                   p    p p i64
reshape_2d                                   p    p p i64 i64
reshape_3d                                   p    p p i64 i64 i64
reshape_4d                                   p    p p i64 i64 i64 i64
view_1d                                      p    p p i64 sz
view_2d                                      p    p p i64 i64 sz sz
view_3d                                      p    p p i64 i64 i64 sz sz sz
view_4d                                      p    p p i64 i64 i64 i64 sz sz sz sz
permute                                      p    p p i i i i
transpose                                    p    p p
get_rows                                     p    p p p
get_rows_back                                p    p p p p
set_rows                                     p    p p p p
diag                                         p    p p
diag_mask_inf                                p    p p i
diag_mask_inf_inplace                        p    p p i
diag_mask_zero                               p    p p i
diag_mask_zero_inplace                       p    p p i
soft_max                                     p    p p
soft_max_inplace                             p    p p
soft_max_ext                                 p    p p p f f
soft_max_ext_inplace                         p    p p p f f
soft_max_add_sinks                           v    p p
soft_max_ext_back                            p    p p p f f
soft_max_ext_back_inplace                    p    p p p f f
rope                                         p    p p p i i
rope_inplace                                 p    p p p i i
rope_ext                                     p    p p p p i i i f f f f f f
rope_multi                                   p    p p p p i *i i i f f f f f f
rope_ext_inplace                             p    p p p p i i i f f f f f f
rope_multi_inplace                           p    p p p p i *i i i f f f f f f
rope_custom                                  p    p p p i i i f f f f f f
rope_custom_inplace                          p    p p p i i i f f f f f f
rope_yarn_corr_dims                          v    i i f f f *f
rope_ext_back                                p    p p p p i i i f f f f f f
rope_multi_back                              p    p p p p i *i i i f f f f f f
clamp                                        p    p p f f
im2col                                       p    p p p i i i i i i b i
im2col_back                                  p    p p p *i64 i i i i i i b
col2im_1d                                    p    p p i i i
conv_1d                                      p    p p p i i i
conv_1d_ph                                   p    p p p i i
conv_1d_dw                                   p    p p p i i i
conv_1d_dw_ph                                p    p p p i i
conv_transpose_1d                            p    p p p i i i
conv_2d                                      p    p p p i i i i i i
im2col_3d                                    p    p p p i64 i i i i i i i i i i
conv_3d                                      p    p p p i64 i i i i i i i i i
conv_2d_sk_p0                                p    p p p
conv_2d_s1_ph                                p    p p p
conv_2d_dw                                   p    p p p i i i i i i
conv_2d_dw_direct                            p    p p p i i i i i i
conv_transpose_2d_p0                         p    p p p i
conv_2d_direct                               p    p p p i i i i i i
conv_3d_direct                               p    p p p i i i i i i i i i i i i
pool_1d                                      p    p p i i i i
pool_2d                                      p    p p i i i i i f f
pool_2d_back                                 p    p p p i i i i i f f
upscale                                      p    p p i i
upscale_ext                                  p    p p i i i i i
interpolate                                  p    p p i64 i64 i64 i64 u32
pad                                          p    p p i i i i
pad_circular                                 p    p p i i i i
pad_ext                                      p    p p i i i i i i i i
pad_ext_circular                             p    p p i i i i i i i i
pad_reflect_1d                               p    p p i i
roll                                         p    p p i i i i
tri                                          p    p p i
fill                                         p    p p f
fill_inplace                                 p    p p f
timestep_embedding                           p    p p i i
argsort                                      p    p p i
argsort_top_k                                p    p p i
top_k                                        p    p p i
arange                                       p    p f f f
flash_attn_ext                               p    p p p p p f f f
flash_attn_ext_set_prec                      v    p i
flash_attn_ext_get_prec                      i    p
flash_attn_ext_add_sinks                     v    p p
flash_attn_back                              p    p p p p p b
ssm_conv                                     p    p p p
ssm_scan                                     p    p p p p p p p p i64
win_part                                     p    p p i
win_unpart                                   p    p p i i i
unary                                        p    p p i
unary_inplace                                p    p p i
get_rel_pos                                  p    p p i i
add_rel_pos                                  p    p p p p
add_rel_pos_inplace                          p    p p p p
rwkv_wkv6                                    p    p p p p p p p
gated_linear_attn                            p    p p p p p p f
rwkv_wkv7                                    p    p p p p p p p p
solve_tri                                    p    p p p b b b
gated_delta_net                              p    p p p p p p p i64
lightning_indexer                            p    p p p p p
dsv4_hc_comb                                 p    p p p p f i32
dsv4_hc_pre                                  p    p p p
dsv4_hc_post                                 p    p p p p p
map_custom1                                  p    p p p i p
map_custom1_inplace                          p    p p p i p
map_custom2                                  p    p p p p i p
map_custom2_inplace                          p    p p p p i p
map_custom3                                  p    p p p p p i p
map_custom3_inplace                          p    p p p p p i p
custom_4d                                    p    p i i64 i64 i64 i64 p i p i p
custom_inplace                               p    p p p i p i p
cross_entropy_loss                           p    p p p
cross_entropy_loss_back                      p    p p p p
opt_step_adamw                               p    p p p p p p
opt_step_sgd                                 p    p p p p
build_forward_select                         p    p p i i
build_forward_expand                         v    p p
build_forward_order                          v    p p
build_backward_expand                        v    p p p
new_graph                                    p    p
new_graph_custom                             p    p sz b
graph_dup                                    p    p p b
graph_cpy                                    v    p p
graph_reset                                  v    p
graph_clear                                  v    p
graph_size                                   i    p
graph_node                                   p    p i
graph_nodes                                  p    p
graph_n_nodes                                i    p
graph_add_node                               v    p p
graph_overhead                               sz   -
graph_overhead_custom                        sz   sz b
graph_get_tensor                             p    p s
graph_get_grad                               p    p p
graph_get_grad_acc                           p    p p
graph_print                                  v    p
graph_dump_dot                               v    p p s
log_get                                      v    p p
log_set                                      v    p p
set_zero                                     p    p
quantize_init                                v    i
quantize_free                                v    -
quantize_requires_imatrix                    b    i
quantize_chunk                               sz   i *f p i64 i64 i64 *f
get_type_traits                              p    i
threadpool_params_init                       v    p i
threadpool_params_match                      b    p p
# --- ggml-alloc.h
tallocr_alloc                                i    p p
gallocr_new                                  p    p
gallocr_new_n                                p    p i
gallocr_free                                 v    p
gallocr_reserve                              b    p p
gallocr_reserve_n_size                       v    p p *i *i *sz
gallocr_reserve_n                            b    p p *i *i
gallocr_alloc_graph                          b    p p
gallocr_get_buffer_size                      sz   p i
backend_alloc_ctx_tensors_from_buft_size     sz   p p
backend_alloc_ctx_tensors_from_buft          p    p p
backend_alloc_ctx_tensors                    p    p p
# --- ggml-backend.h
backend_buft_name                            s    p
backend_buft_alloc_buffer                    p    p sz
backend_buft_get_alignment                   sz   p
backend_buft_get_max_size                    sz   p
backend_buft_get_alloc_size                  sz   p p
backend_buft_is_host                         b    p
backend_buft_get_device                      p    p
backend_buffer_name                          s    p
backend_buffer_free                          v    p
backend_buffer_get_base                      p    p
backend_buffer_get_size                      sz   p
backend_buffer_init_tensor                   i    p p
backend_buffer_get_alignment                 sz   p
backend_buffer_get_max_size                  sz   p
backend_buffer_get_alloc_size                sz   p p
backend_buffer_clear                         v    p u8
backend_buffer_is_host                       b    p
backend_buffer_set_usage                     v    p i
backend_buffer_get_usage                     i    p
backend_buffer_get_type                      p    p
backend_buffer_reset                         v    p
backend_tensor_copy                          v    p p
backend_guid                                 p    p
backend_name                                 s    p
backend_free                                 v    p
backend_get_default_buffer_type              p    p
backend_alloc_buffer                         p    p sz
backend_get_alignment                        sz   p
backend_get_max_size                         sz   p
backend_tensor_set_async                     v    p p p sz sz
backend_tensor_get_async                     v    p p p sz sz
backend_tensor_set_2d_async                  v    p p p sz sz sz sz sz
backend_tensor_get_2d_async                  v    p p p sz sz sz sz sz
backend_tensor_set                           v    p p sz sz
backend_tensor_get                           v    p p sz sz
backend_tensor_set_2d                        v    p p sz sz sz sz sz
backend_tensor_get_2d                        v    p p sz sz sz sz sz
backend_tensor_memset                        v    p u8 sz sz
backend_synchronize                          v    p
backend_graph_plan_create                    p    p p
backend_graph_plan_free                      v    p p
backend_graph_plan_compute                   i    p p
backend_graph_compute                        i    p p
backend_graph_compute_async                  i    p p
backend_supports_op                          b    p p
backend_supports_buft                        b    p p
backend_offload_op                           b    p p
backend_tensor_copy_async                    v    p p p p
backend_get_device                           p    p
backend_event_new                            p    p
backend_event_free                           v    p
backend_event_record                         v    p p
backend_event_synchronize                    v    p
backend_event_wait                           v    p p
backend_dev_name                             s    p
backend_dev_description                      s    p
backend_dev_memory                           v    p *sz *sz
backend_dev_type                             i    p
backend_dev_get_props                        v    p p
backend_dev_backend_reg                      p    p
backend_dev_init                             p    p s
backend_dev_buffer_type                      p    p
backend_dev_host_buffer_type                 p    p
backend_dev_buffer_from_host_ptr             p    p p sz sz
backend_dev_supports_op                      b    p p
backend_dev_supports_buft                    b    p p
backend_dev_offload_op                       b    p p
backend_reg_name                             s    p
backend_reg_dev_count                        sz   p
backend_reg_dev_get                          p    p sz
backend_reg_get_proc_address                 p    p s
backend_register                             v    p
backend_device_register                      v    p
backend_reg_count                            sz   -
backend_reg_get                              p    sz
backend_reg_by_name                          p    s
backend_dev_count                            sz   -
backend_dev_get                              p    sz
backend_dev_by_name                          p    s
backend_dev_by_type                          p    i
backend_init_by_name                         p    s s
backend_init_by_type                         p    i s
backend_init_best                            p    -
backend_load                                 p    s
backend_unload                               v    p
backend_load_all                             v    -
backend_load_all_from_path                   v    s
backend_sched_new                            p    p p i sz b b
backend_sched_free                           v    p
backend_sched_reserve_size                   v    p p *sz
backend_sched_reserve                        b    p p
backend_sched_get_n_backends                 i    p
backend_sched_get_backend                    p    p i
backend_sched_get_n_splits                   i    p
backend_sched_get_n_copies                   i    p
backend_sched_get_buffer_type                p    p p
backend_sched_get_buffer_size                sz   p p
backend_sched_set_tensor_backend             v    p p p
backend_sched_get_tensor_backend             p    p p
backend_sched_split_graph                    v    p p
backend_sched_alloc_graph                    b    p p
backend_sched_graph_compute                  i    p p
backend_sched_graph_compute_async            i    p p
backend_sched_synchronize                    v    p
backend_sched_reset                          v    p
backend_sched_set_eval_callback              v    p p p
backend_meta_split_axis_name                 s    i
backend_meta_device                          p    p sz p p
backend_compare_graph_backend                b    p p p p p p sz
backend_tensor_alloc                         i    p p p
backend_view_init                            i    p
backend_cpu_buffer_from_ptr                  p    p sz
backend_cpu_buffer_type                      p    -
# --- ggml-cpu.h
numa_init                                    v    i
is_numa                                      b    -
new_i32                                      p    p i32
new_f32                                      p    p f
set_i32                                      p    p i32
set_f32                                      p    p f
get_i32_1d                                   i32  p i
set_i32_1d                                   v    p i i32
get_i32_nd                                   i32  p i i i i
set_i32_nd                                   v    p i i i i i32
get_f32_1d                                   f    p i
set_f32_1d                                   v    p i f
get_f32_nd                                   f    p i i i i
set_f32_nd                                   v    p i i i i f
threadpool_new                               p    p
threadpool_free                              v    p
threadpool_get_n_threads                     i    p
threadpool_pause                             v    p
threadpool_resume                            v    p
graph_compute                                i    p p
graph_compute_with_ctx                       i    p p i
cpu_has_sse3                                 i    -
cpu_has_ssse3                                i    -
cpu_has_avx                                  i    -
cpu_has_avx_vnni                             i    -
cpu_has_avx2                                 i    -
cpu_has_bmi2                                 i    -
cpu_has_f16c                                 i    -
cpu_has_fma                                  i    -
cpu_has_avx512                               i    -
cpu_has_avx512_vbmi                          i    -
cpu_has_avx512_vnni                          i    -
cpu_has_avx512_bf16                          i    -
cpu_has_amx_int8                             i    -
cpu_has_neon                                 i    -
cpu_has_arm_fma                              i    -
cpu_has_fp16_va                              i    -
cpu_has_dotprod                              i    -
cpu_has_matmul_int8                          i    -
cpu_has_sve                                  i    -
cpu_get_sve_cnt                              i    -
cpu_has_sme                                  i    -
cpu_has_sme2                                 i    -
cpu_has_riscv_v                              i    -
cpu_get_rvv_vlen                             i    -
cpu_has_vsx                                  i    -
cpu_has_vxe                                  i    -
cpu_has_wasm_simd                            i    -
cpu_has_llamafile                            i    -
get_type_traits_cpu                          p    i
cpu_init                                     v    -
backend_cpu_init                             p    -
backend_is_cpu                               b    p
backend_cpu_set_n_threads                    v    p i
backend_cpu_set_threadpool                   v    p p
backend_cpu_set_abort_callback               v    p p p
backend_cpu_set_use_ref                      v    p b
backend_cpu_reg                              p    -
cpu_fp32_to_fp32                             v    *f *f i64
cpu_fp32_to_i32                              v    *f *i32 i64
cpu_fp32_to_fp16                             v    *f p i64
cpu_fp16_to_fp32                             v    p *f i64
cpu_fp32_to_bf16                             v    *f p i64
cpu_bf16_to_fp32                             v    p *f i64
"""

_CTYPE = {
    "p": c_void_p, "s": c_char_p, "v": None, "i": c_int, "i32": c_int32, "u32": c_uint32,
    "i64": c_int64, "u64": c_uint64, "sz": c_size_t, "f": c_float, "d": c_double,
    "b": c_bool, "u8": c_uint8, "u16": c_uint16,
    "*f": c_void_p, "*i": c_void_p, "*i32": c_void_p, "*i64": c_void_p, "*sz": c_void_p,
}
_ARRAY_ELEM = {"*f": (c_float, np.float32), "*i": (c_int, np.intc), "*i32": (c_int32, np.int32),
               "*i64": (c_int64, np.int64), "*sz": (c_size_t, np.uintp)}


def _parse_signatures(text):
    sigs = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        name, ret, args = parts[0], parts[1], parts[2:]
        if args == ["-"]:
            args = []
        sigs[name] = (ret, tuple(args))
    return sigs


SIGNATURES = _parse_signatures(_SIGNATURES)

# numpy dtypes for the plain (non block-quantized) ggml types
_TYPE_DTYPE = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32,
               27: np.int64, 28: np.float64, 30: np.uint16}   # 30 = BF16, raw bits
_T_F32, _T_F16, _T_BF16 = 0, 1, 30

# --------------------------------------------------------------------------------------
# library loading
# --------------------------------------------------------------------------------------

_LIBS = None          # (base, cpu, [all libs in lookup order], libdir)
_LOAD_ERROR = None


def _find_libdir():
    env = os.environ.get("GGVIZ_GGML_LIBDIR")
    if env:
        return env
    try:
        import libggml  # type: ignore
    except ImportError as e:  # pragma: no cover - depends on environment
        raise OracleUnavailable(
            "the real-ggml oracle needs the PyPI package 'libggml-python' "
            "(pip install libggml-python==0.20.2): %s" % e) from e
    root = os.path.dirname(libggml.__file__)
    for sub in ("lib64", "lib"):
        d = os.path.join(root, sub)
        if os.path.exists(os.path.join(d, "libggml-base.so")):
            return d
    raise OracleUnavailable("libggml-python is installed at %s but libggml-base.so was "
                            "not found under lib64/ or lib/" % root)


def _load():
    global _LIBS, _LOAD_ERROR
    if _LIBS is not None:
        return _LIBS
    if _LOAD_ERROR is not None:
        raise _LOAD_ERROR
    try:
        libdir = _find_libdir()
        base_path = os.path.join(libdir, "libggml-base.so")
        cpu_path = os.path.join(libdir, "libggml-cpu.so")
        for p in (base_path, cpu_path):
            if not os.path.exists(p):
                raise OracleUnavailable("missing %s" % p)
        try:
            base = ctypes.CDLL(base_path, mode=ctypes.RTLD_GLOBAL)
            cpu = ctypes.CDLL(cpu_path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise OracleUnavailable("could not load ggml shared libraries from %s: %s"
                                    % (libdir, e)) from e
        libs = [base, cpu]
        reg_path = os.path.join(libdir, "libggml.so")   # backend registry (optional)
        if os.path.exists(reg_path):
            try:
                libs.append(ctypes.CDLL(reg_path))
            except OSError:
                pass
        if hasattr(cpu, "ggml_cpu_init"):
            cpu.ggml_cpu_init.argtypes = []
            cpu.ggml_cpu_init.restype = None
            cpu.ggml_cpu_init()            # fp16 tables etc.
        _LIBS = (base, cpu, libs, libdir)
        return _LIBS
    except OracleUnavailable as e:
        _LOAD_ERROR = e
        raise


def available() -> bool:
    """True when the real ggml libraries can be loaded."""
    try:
        _load()
        return True
    except OracleUnavailable:
        return False


def unavailable_reason() -> str:
    """Why :func:`available` is False ('' when it is True) - for pytest skip reasons."""
    try:
        _load()
        return ""
    except OracleUnavailable as e:
        return str(e)


def run_in_subprocess(source: str, timeout: float = 120):
    """Run python ``source`` in a fresh interpreter (cwd = repo root, so
    ``from tests.oracle.ggml_lib import RealGGML`` works).  Returns
    ``(returncode, stdout, stderr)``.  Use it for calls expected to hit
    ``GGML_ASSERT``/``GGML_ABORT`` (which abort the process: returncode -6)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", source], cwd=root, env=env,
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def _parse_header_constants(libdir):
    """enum values and integer #defines from the installed ggml.h."""
    enums, defines = {}, {}
    inc = os.path.join(os.path.dirname(libdir), "include", "ggml.h")
    if not os.path.exists(inc):
        return enums, defines
    src = open(inc, encoding="utf-8", errors="replace").read()
    for m in re.finditer(r"^\s*#\s*define\s+(GGML_\w+)\s+(-?\d+)\b", src, re.M):
        defines.setdefault(m.group(1), int(m.group(2)))
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    for m in re.finditer(r"\benum\s+(\w+)\s*\{([^}]*)\}", src):
        vals, nxt = {}, 0
        for item in m.group(2).split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                k, expr = (x.strip() for x in item.split("=", 1))
                if not re.fullmatch(r"[\w\s()<>|+\-]*", expr):
                    raise ValueError("unexpected enum expression %r" % expr)
                names = dict(vals)
                v = int(eval(expr, {"__builtins__": {}}, names))  # ints, shifts, earlier names
            else:
                k, v = item, nxt
            vals[k] = v
            nxt = v + 1
        enums[m.group(1)] = vals
    return enums, defines


# --------------------------------------------------------------------------------------
# the oracle
# --------------------------------------------------------------------------------------

class RealGGML:
    """Handle on the real ggml.  Cheap to construct (libraries are loaded once)."""

    def __init__(self):
        self._base, self._cpu, self._libs, self.libdir = _load()
        self._keep = {}             # ctx -> python object backing its mem_buffer
        self._raw = {}
        self.enums, self.defines = _parse_header_constants(self.libdir)
        self._consts = dict(self.defines)
        for vals in self.enums.values():
            self._consts.update(vals)
        ov = self.tensor_overhead()
        if ov - GGML_OBJECT_SIZE != ctypes.sizeof(GGMLTensor):
            raise RuntimeError("struct ggml_tensor layout mismatch: ggml_tensor_overhead()=%d"
                                    % ov)

    # ---- raw symbol access ----------------------------------------------------------
    def symbol(self, cname):
        """The raw ctypes function ``cname`` (e.g. 'ggml_add') from the loaded libraries."""
        for lib in self._libs:
            try:
                return getattr(lib, cname)
            except AttributeError:
                continue
        raise AttributeError("symbol %s not exported by the ggml libraries" % cname)

    def raw(self, name):
        """ctypes function for ``ggml_<name>`` with argtypes/restype from the table."""
        f = self._raw.get(name)
        if f is None:
            ret, args = SIGNATURES[name]
            f = self.symbol("ggml_" + name)
            f.argtypes = [_CTYPE[a] for a in args]
            f.restype = _CTYPE[ret]
            self._raw[name] = f
        return f

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name.startswith("GGML_"):
            try:
                return self._consts[name]
            except KeyError:
                raise AttributeError("no ggml constant %s" % name) from None
        if name not in SIGNATURES:
            raise AttributeError("ggml_%s is not bound (not in the 0.20.2 public headers or "
                                 "needs a hand-written binding)" % name)
        wrapper = self._make_wrapper(name)
        self.__dict__[name] = wrapper
        return wrapper

    def _make_wrapper(self, name):
        f = self.raw(name)
        ret, args = SIGNATURES[name]

        def conv(code, x):
            if code == "s":
                return x.encode() if isinstance(x, str) else x
            if code == "p":
                if isinstance(x, np.ndarray):
                    return x.ctypes.data
                return x
            if code in _ARRAY_ELEM:
                ct, dt = _ARRAY_ELEM[code]
                if isinstance(x, np.ndarray):
                    if x.dtype != np.dtype(dt) or not x.flags.c_contiguous:
                        raise TypeError("ggml_%s: expected a C-contiguous %s array"
                                        % (name, np.dtype(dt)))
                    return x.ctypes.data
                if isinstance(x, (list, tuple)):
                    return (ct * len(x))(*x)
                return x
            return x

        def call(*a):
            if len(a) != len(args):
                raise TypeError("ggml_%s takes %d arguments (%d given)" % (name, len(args), len(a)))
            r = f(*[conv(c, x) for c, x in zip(args, a)])
            if ret == "s" and r is not None:
                return r.decode("utf-8", "replace")
            return r

        call.__name__ = name
        call.__doc__ = "ggml_%s(%s) -> %s" % (name, ", ".join(args), ret)
        return call

    # ---- hand-bound functions (struct by value / varargs) ----------------------------
    def init(self, mem_size, mem_buffer=None, no_alloc=False):
        """ggml_init.  ``mem_buffer``: None (ggml mallocs), a writable numpy array /
        bytearray (kept alive until :meth:`free`), or a raw address int."""
        keep = None
        addr = None
        if mem_buffer is None:
            addr = None
        elif isinstance(mem_buffer, int):
            addr = mem_buffer
        elif isinstance(mem_buffer, np.ndarray):
            if not mem_buffer.flags.c_contiguous or not mem_buffer.flags.writeable:
                raise ValueError("mem_buffer must be a writable C-contiguous array")
            if mem_buffer.nbytes < mem_size:
                raise ValueError("mem_buffer (%d bytes) smaller than mem_size %d"
                                 % (mem_buffer.nbytes, mem_size))
            addr, keep = mem_buffer.ctypes.data, mem_buffer
        elif isinstance(mem_buffer, bytearray):
            if len(mem_buffer) < mem_size:
                raise ValueError("mem_buffer smaller than mem_size")
            cbuf = (c_char * len(mem_buffer)).from_buffer(mem_buffer)
            addr, keep = ctypes.addressof(cbuf), (mem_buffer, cbuf)
        else:
            raise TypeError("unsupported mem_buffer %r" % type(mem_buffer))
        if addr is not None and addr % GGML_MEM_ALIGN:
            # GGML_ASSERT_ALIGNED would abort() the interpreter
            raise ValueError("mem_buffer address must be %d-byte aligned" % GGML_MEM_ALIGN)
        f = self._base.ggml_init
        f.argtypes = [GGMLInitParams]
        f.restype = c_void_p
        ctx = f(GGMLInitParams(mem_size, addr, bool(no_alloc)))
        if not ctx:
            raise MemoryError("ggml_init failed")
        if keep is not None:
            self._keep[ctx] = keep
        return ctx

    def free(self, ctx):
        self.raw("free")(ctx)
        self._keep.pop(ctx, None)

    def format_name(self, tensor, name):
        """ggml_format_name(tensor, "%s", name): pass the already formatted string."""
        f = self._base.ggml_format_name
        f.argtypes = [c_void_p, c_char_p, c_char_p]      # variadic: fmt + one char*
        f.restype = c_void_p
        return f(tensor, b"%s", name.encode() if isinstance(name, str) else name)

    def _plan(self, gf, n_threads, threadpool=None):
        f = self._cpu.ggml_graph_plan
        f.argtypes = [c_void_p, c_int, c_void_p]
        f.restype = GGMLCPlan
        return f(gf, n_threads, threadpool)

    def graph_plan(self, gf, n_threads=4, threadpool=None):
        """ggml_graph_plan -> dict(work_size, n_threads, use_ref, threadpool)."""
        p = self._plan(gf, n_threads, threadpool)
        return dict(work_size=p.work_size, n_threads=p.n_threads, use_ref=bool(p.use_ref),
                    threadpool=p.threadpool)

    def graph_compute(self, gf, n_threads=1, threadpool=None):
        """plan + numpy work buffer + ggml_graph_compute.  Returns enum ggml_status
        (0 = GGML_STATUS_SUCCESS)."""
        plan = self._plan(gf, n_threads, threadpool)
        work = None
        if plan.work_size > 0:
            work = np.zeros(plan.work_size + 64, dtype=np.uint8)
            plan.work_data = work.ctypes.data
        f = self._cpu.ggml_graph_compute
        f.argtypes = [c_void_p, POINTER(GGMLCPlan)]
        f.restype = c_int
        status = f(gf, ctypes.byref(plan))
        del work
        return status

    # ---- reading structs --------------------------------------------------------------
    @staticmethod
    def tensor_struct(t) -> GGMLTensor:
        """The live struct ggml_tensor at address ``t`` (no copy)."""
        if not t:
            raise ValueError("NULL tensor")
        return GGMLTensor.from_address(t)

    def tensor_info(self, t) -> dict:
        s = self.tensor_struct(t)
        return dict(
            addr=t, type=s.type, ne=tuple(s.ne), nb=tuple(s.nb), op=s.op,
            op_params=tuple(s.op_params), flags=s.flags,
            src=tuple(x or 0 for x in s.src), view_src=s.view_src or 0,
            view_offs=s.view_offs, data=s.data or 0,
            name=s.name.decode("utf-8", "replace"), buffer=s.buffer or 0,
            extra=s.extra or 0)

    def op_params_f32(self, t):
        """op_params reinterpreted as 16 float32 (for ops storing floats there)."""
        s = self.tensor_struct(t)
        return tuple(np.frombuffer(bytes(s.op_params), dtype=np.float32).tolist())

    def graph_info(self, gf) -> dict:
        """Read the private struct ggml_cgraph."""
        if not gf:
            raise ValueError("NULL graph")
        g = GGMLCGraph.from_address(gf)
        hs = g.visited_hash_set
        hsize = hs.size

        def arr(ptr, n):
            if not ptr or n <= 0:
                return []
            return [x or 0 for x in ptr[:n]]

        used = [False] * hsize
        if hs.used and hsize:
            words = hs.used[:(hsize + 31) // 32]
            used = [bool((words[i >> 5] >> (i & 31)) & 1) for i in range(hsize)]
        keys = []
        if hs.keys and hsize:
            raw = hs.keys[:hsize]
            keys = [(raw[i] or 0) if used[i] else 0 for i in range(hsize)]
        return dict(
            size=g.size, n_nodes=g.n_nodes, n_leafs=g.n_leafs,
            nodes=arr(g.nodes, g.n_nodes), leafs=arr(g.leafs, g.n_leafs),
            use_counts=(list(g.use_counts[:hsize]) if g.use_counts and hsize else []),
            hash_size=hsize, hash_used=used, hash_keys=keys,
            grads=(arr(g.grads, hsize) if g.grads else None),
            grad_accs=(arr(g.grad_accs, hsize) if g.grad_accs else None),
            order=g.order, uid=g.uid)

    def context_info(self, ctx) -> dict:
        """Read the private struct ggml_context and its object list."""
        c = GGMLContext.from_address(ctx)
        objs = []
        o = c.objects_begin
        while o:
            ob = GGMLObject.from_address(o)
            objs.append(dict(addr=o, offs=ob.offs, size=ob.size, type=ob.type,
                             next=ob.next or 0))
            o = ob.next
        return dict(mem_size=c.mem_size, mem_buffer=c.mem_buffer or 0,
                    mem_buffer_owned=bool(c.mem_buffer_owned), no_alloc=bool(c.no_alloc),
                    n_objects=c.n_objects, objects=objs)

    def arena_bytes(self, ctx) -> np.ndarray:
        """Copy of the context's mem_buffer, ``used_mem(ctx)`` bytes long."""
        n = self.used_mem(ctx)
        base = self.get_mem_buffer(ctx)
        if n == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.frombuffer((c_char * n).from_address(base), dtype=np.uint8).copy()

    # ---- tensor data ---------------------------------------------------------------
    def _view(self, t):
        s = self.tensor_struct(t)
        if not s.data:
            raise ValueError("tensor %r has no data (no_alloc context / not allocated)"
                             % s.name)
        typ = s.type
        ne = [int(x) for x in s.ne]
        nb = [int(x) for x in s.nb]
        if typ in _TYPE_DTYPE:
            dt = np.dtype(_TYPE_DTYPE[typ])
            shape = (ne[3], ne[2], ne[1], ne[0])
            strides = (nb[3], nb[2], nb[1], nb[0])
        else:
            dt = np.dtype(np.uint8)
            row = self.row_size(typ, ne[0])
            shape = (ne[3], ne[2], ne[1], row)
            strides = (nb[3], nb[2], nb[1], 1)
        if 0 in shape:
            return np.zeros(shape, dtype=dt), s
        extent = sum((n - 1) * st for n, st in zip(shape, strides)) + (
            dt.itemsize if typ in _TYPE_DTYPE else 1)
        buf = (c_char * extent).from_address(s.data)
        return np.ndarray(shape, dtype=dt, buffer=buf, strides=strides), s

    def get_array(self, t) -> np.ndarray:
        """Copy of the tensor's data, shape (ne3, ne2, ne1, ne0) following nb (views ok).
        F32/F16/I8/I16/I32/I64/F64 typed; BF16 as raw uint16; block-quantized types as
        raw bytes of shape (ne3, ne2, ne1, row_size)."""
        v, _ = self._view(t)
        return v.copy()

    def to_float(self, t) -> np.ndarray:
        """Tensor data converted to float32 by ggml's own type traits (dequantize /
        f16 / bf16), shape (ne3, ne2, ne1, ne0)."""
        s = self.tensor_struct(t)
        typ = s.type
        ne = [int(x) for x in s.ne]
        if typ in _TYPE_DTYPE and typ not in (_T_F16, _T_BF16):
            return self.get_array(t).astype(np.float32)
        raw, _ = self._view(t)
        f = self._base.ggml_get_type_traits
        f.argtypes = [c_int]
        f.restype = POINTER(GGMLTypeTraits)
        tr = f(typ).contents
        if not tr.to_float:
            raise ValueError("type %s has no to_float" % self.type_name(typ))
        to_float = _TO_FLOAT_T(tr.to_float)
        out = np.empty((ne[3], ne[2], ne[1], ne[0]), dtype=np.float32)
        for i3 in range(ne[3]):
            for i2 in range(ne[2]):
                for i1 in range(ne[1]):
                    row = np.ascontiguousarray(raw[i3, i2, i1])
                    to_float(row.ctypes.data, out[i3, i2, i1].ctypes.data, ne[0])
        return out

    def set_array(self, t, arr):
        """Write ``arr`` into a contiguous tensor.  Plain types: converted to the
        tensor dtype (F16 / BF16 from float input use ggml's own fp32->fp16/bf16 row
        conversion; uint16 input for BF16 and float16 input for F16 are raw bits).
        Quantized types: raw uint8 bytes (nbytes long), or float input quantized
        with ggml_quantize_chunk."""
        s = self.tensor_struct(t)
        if not s.data:
            raise ValueError("tensor has no data")
        if not self.is_contiguous(t):
            raise ValueError("set_array needs a contiguous tensor")
        typ = s.type
        nel = self.nelements(t)
        nbytes = self.nbytes(t)
        arr = np.asarray(arr)
        if typ in _TYPE_DTYPE and typ not in (_T_F16, _T_BF16):
            src = np.ascontiguousarray(arr, dtype=_TYPE_DTYPE[typ]).reshape(-1)
            if src.size != nel:
                raise ValueError("size %d != nelements %d" % (src.size, nel))
            ctypes.memmove(s.data, src.ctypes.data, nbytes)
            return
        if arr.dtype == np.uint8 and typ not in (_T_F16, _T_BF16):
            src = np.ascontiguousarray(arr).reshape(-1)
            if src.size != nbytes:
                raise ValueError("raw size %d != nbytes %d" % (src.size, nbytes))
            ctypes.memmove(s.data, src.ctypes.data, nbytes)
            return
        if (typ == _T_F16 and arr.dtype == np.float16) or (typ == _T_BF16 and arr.dtype == np.uint16):
            src = np.ascontiguousarray(arr).reshape(-1)
            if src.size != nel:
                raise ValueError("size %d != nelements %d" % (src.size, nel))
            ctypes.memmove(s.data, src.ctypes.data, nbytes)
            return
        src = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
        if src.size != nel:
            raise ValueError("size %d != nelements %d" % (src.size, nel))
        if typ == _T_F16:
            self.fp32_to_fp16_row(src, s.data, nel)
        elif typ == _T_BF16:
            self.fp32_to_bf16_row(src, s.data, nel)
        else:
            if self.quantize_requires_imatrix(typ):
                raise ValueError("%s needs an importance matrix" % self.type_name(typ))
            ne0 = int(s.ne[0])
            written = self.quantize_chunk(typ, src, s.data, 0, nel // ne0, ne0, None)
            if written != nbytes:
                raise RuntimeError("ggml_quantize_chunk wrote %d of %d bytes" % (written, nbytes))
