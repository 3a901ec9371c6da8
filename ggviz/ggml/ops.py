"""Graph-building operators: each call creates the result tensor and records op, op_params and src[] in it.

Mirrors the operator section of ggml.c (``ggml_dup`` ... ``ggml_glu``): names, argument order, shape rules,
assertions (``ggml_can_mul_mat``, ``ggml_can_repeat`` ...), op_params encoding and result-name suffixes are ggml's.
Nothing is computed here: computing is the CPU backend's job (``ggviz.ggml.cpu``).
"""
from __future__ import annotations

import operator
import struct

from . import consts as C
from .context import Context, GGMLError
from .tensor import GGML_OP_AXPY, GGML_OP_MUL_MAT_SPARSE  # PowerInfer's ops, see the end of this file
from .tensor import (
    _Q_SRC,
    _name_pack,
    _name_unpack,
    _unpack_ne_nb,
    _W_OP,
    _W_TYPE,
    Tensor,
    are_same_shape,
    can_mul_mat,
    can_out_prod,
    can_repeat,
    get_op_params_i32,
    is_contiguous,
    is_contiguous_1,
    is_contiguous_rows,
    is_matrix,
    is_padded_1d,
    is_scalar,
    is_transposed,
    is_vector,
    nelements,
    set_op_params,
    set_op_params_i32,
    type_name,
    type_size,
)


def _index(x, op: str, what: str) -> int:
    """An integer argument (Python or NumPy int), or a GGMLError naming it -- checked before the result tensor is
    created, so that a bad argument leaves the context as it was."""
    try:
        return operator.index(x)
    except TypeError:
        raise GGMLError(f"ggml_{op}: {what} must be an integer, got {x!r}") from None


def _desc(t: Tensor) -> str:
    return f"{t.name or '<unnamed>'} ({type_name(t.type)} ne={list(t.shape)})"


def _require(cond, op: str, msg: str, *tensors):
    if not cond:
        detail = ", ".join(_desc(t) for t in tensors if t is not None)
        raise GGMLError(f"ggml_{op}: {msg}" + (f" [{detail}]" if detail else ""))


_Q_NE = 2                 # ne[0] as a word of struct ggml_tensor (nb follows at word 6)
_AXES = [0, 1, 2, 3]


def _set_op(r: Tensor, op: int, *srcs) -> None:
    """``r->op = op; r->src[0] = srcs[0]; ...``: the words written straight into the struct (``r.op`` and
    ``r.src[i]`` go through a property and a new accessor object each, for every tensor a graph build makes), the
    source pointers with one pack of the words they fill."""
    r._w[_W_OP] = op
    n = len(srcs)
    if n == 1:
        a, = srcs
        _pack_srcs[1](r._q, _SRC_OFFS, 0 if a is None else a.addr)
    elif n == 2:
        a, b = srcs
        _pack_srcs[2](r._q, _SRC_OFFS, 0 if a is None else a.addr, 0 if b is None else b.addr)
    else:
        _pack_srcs[n](r._q, _SRC_OFFS, *[0 if t is None else t.addr for t in srcs])


_pack_srcs = [struct.Struct(f"<{n}Q").pack_into for n in range(C.GGML_MAX_SRC + 1)]
_SRC_OFFS = _Q_SRC * 8                 # (src[0]'s byte in the struct)


# ---------------------------------------------------------------- tensor creation

def new_tensor(ctx: Context, type: int, n_dims: int, ne) -> Tensor:
    return ctx.new_tensor_impl(type, n_dims, list(ne), None, 0)


def new_tensor_1d(ctx, type, ne0):
    return ctx.new_tensor_impl(type, 1, [ne0])


def new_tensor_2d(ctx, type, ne0, ne1):
    return ctx.new_tensor_impl(type, 2, [ne0, ne1])


def new_tensor_3d(ctx, type, ne0, ne1, ne2):
    return ctx.new_tensor_impl(type, 3, [ne0, ne1, ne2])


def new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3):
    return ctx.new_tensor_impl(type, 4, [ne0, ne1, ne2, ne3])


def dup_tensor(ctx, src: Tensor) -> Tensor:
    # (src's type word and ne as a list: what new_tensor_impl takes, without the shape property's tuple)
    return ctx.new_tensor_impl(src._w.item(_W_TYPE), C.GGML_MAX_DIMS, src.ne.tolist())


def set_name(t: Tensor, name: str) -> Tensor:
    t.name = name
    return t


def format_name(t: Tensor, fmt: str, *args) -> Tensor:
    """ggml_format_name: printf-style formatting, truncated to GGML_MAX_NAME - 1 bytes like vsnprintf."""
    t.name = (fmt % args) if args else fmt
    return t


def _name_after(r: Tensor, a: Tensor, suffix: bytes) -> None:
    """``ggml_format_name(r, "%s<suffix>", a->name)`` (the names ggml gives views, reshapes, copies ...) on the
    name bytes: a's name copied with the suffix, truncated to GGML_MAX_NAME - 1 bytes plus the NUL like
    vsnprintf -- without decoding a's name and encoding the result again (a build names ~1,000 tensors so). A
    name that is not ASCII goes through format_name (its bytes as the str round trip leaves them)."""
    nm = _name_unpack(a._q, 256)[0].partition(b"\0")[0]
    if nm.isascii():
        b = (nm + suffix)[:C.GGML_MAX_NAME - 1] + b"\0"
        _name_pack[len(b)](r._q, 256, b)
    else:
        format_name(r, "%s" + suffix.decode(), a.name)


def get_name(t: Tensor) -> str:
    return t.name


def set_input(t: Tensor) -> None:
    t.flags = t.flags | C.GGML_TENSOR_FLAG_INPUT


def set_output(t: Tensor) -> None:
    # the flag goes down the view_src chain too: a view's bytes are its source's, so the source must not be freed
    # or reused in place by the graph allocator either
    cur = t
    while cur is not None:
        cur.flags = cur.flags | C.GGML_TENSOR_FLAG_OUTPUT
        cur = cur.view_src


def set_param(t: Tensor) -> None:
    _require(t.op == C.GGML_OP_NONE, "set_param", "only leaf tensors can be parameters", t)
    t.flags = t.flags | C.GGML_TENSOR_FLAG_PARAM


def view_tensor(ctx, src: Tensor, fn: str = "ggml_view_tensor") -> Tensor:
    # the strides are src's (ggml copies them after ggml_new_tensor_impl): passed in, so the view's real extent is
    # checked against its source before anything is written (see Context.new_tensor_impl)
    ne_nb = _unpack_ne_nb(src._q, 16)          # (src's ne and nb, words 2..9, in one unpack)
    result = ctx.new_tensor_impl(src._w.item(_W_TYPE), C.GGML_MAX_DIMS, ne_nb[:4], src, 0, ne_nb[4:], fn)
    _name_after(result, src, b" (view)")
    return result


# ---------------------------------------------------------------- helpers

def _unary_like(ctx, a, inplace):
    return view_tensor(ctx, a) if inplace else dup_tensor(ctx, a)


def _pack(op: str, fmt: str, *vals) -> bytes:
    """op_params bytes, packed before the result tensor exists: a value of the wrong kind is a GGMLError naming the
    op, and leaves the context as it was."""
    try:
        return struct.pack(fmt, *vals)
    except struct.error as e:
        raise GGMLError(f"ggml_{op}: bad operator parameters {vals!r}: {e}") from None


def _f32_params(*vals, op: str = "op") -> bytes:
    return _pack(op, f"<{len(vals)}f", *vals)


# ---------------------------------------------------------------- element-wise

def dup(ctx, a):
    r = _unary_like(ctx, a, False)
    _set_op(r, C.GGML_OP_DUP, a)
    return r


def dup_inplace(ctx, a):
    r = _unary_like(ctx, a, True)
    _set_op(r, C.GGML_OP_DUP, a)
    return r


def _binary(ctx, a, b, op, opname, inplace):
    # ggml_can_repeat(b, a), on ne read once
    b0, b1, b2, b3 = bn = b.ne.tolist()
    a0, a1, a2, a3 = an = a.ne.tolist()
    if 0 in bn:
        ok = 0 in an
    else:
        ok = a0 % b0 == 0 and a1 % b1 == 0 and a2 % b2 == 0 and a3 % b3 == 0
    _require(ok, opname, "b cannot be broadcast (repeated) to a's shape", a, b)
    r = _unary_like(ctx, a, inplace)
    _set_op(r, op, a, b)
    return r


def add(ctx, a, b):
    return _binary(ctx, a, b, C.GGML_OP_ADD, "add", False)


def add_inplace(ctx, a, b):
    return _binary(ctx, a, b, C.GGML_OP_ADD, "add", True)


def sub(ctx, a, b):
    return _binary(ctx, a, b, C.GGML_OP_SUB, "sub", False)


def sub_inplace(ctx, a, b):
    return _binary(ctx, a, b, C.GGML_OP_SUB, "sub", True)


def mul(ctx, a, b):
    return _binary(ctx, a, b, C.GGML_OP_MUL, "mul", False)


def mul_inplace(ctx, a, b):
    return _binary(ctx, a, b, C.GGML_OP_MUL, "mul", True)


def div(ctx, a, b):
    return _binary(ctx, a, b, C.GGML_OP_DIV, "div", False)


def div_inplace(ctx, a, b):
    return _binary(ctx, a, b, C.GGML_OP_DIV, "div", True)


def _add1(ctx, a, b, inplace):
    _require(is_scalar(b), "add1", "b must be a scalar", b)
    _require(is_padded_1d(a), "add1", "a must be padded 1d (contiguous rows)", a)
    r = _unary_like(ctx, a, inplace)
    _set_op(r, C.GGML_OP_ADD1, a, b)
    return r


def add1(ctx, a, b):
    return _add1(ctx, a, b, False)


def add1_inplace(ctx, a, b):
    return _add1(ctx, a, b, True)


def _simple_unary_op(ctx, a, op, inplace):
    r = _unary_like(ctx, a, inplace)
    _set_op(r, op, a)
    return r


def sqr(ctx, a):
    return _simple_unary_op(ctx, a, C.GGML_OP_SQR, False)


def sqr_inplace(ctx, a):
    return _simple_unary_op(ctx, a, C.GGML_OP_SQR, True)


def sqrt(ctx, a):
    return _simple_unary_op(ctx, a, C.GGML_OP_SQRT, False)


def sqrt_inplace(ctx, a):
    return _simple_unary_op(ctx, a, C.GGML_OP_SQRT, True)


def sum_rows(ctx, a):
    r = new_tensor(ctx, a.type, C.GGML_MAX_DIMS, [1] + list(a.shape[1:]))
    _set_op(r, C.GGML_OP_SUM_ROWS, a)
    return r


def mean(ctx, a):
    r = new_tensor(ctx, C.GGML_TYPE_F32, 4, [1] + list(a.shape[1:]))
    _set_op(r, C.GGML_OP_MEAN, a)
    return r


def argmax(ctx, a):
    _require(is_matrix(a), "argmax", "a must be a matrix (ne2 == ne3 == 1)", a)
    _require(a.ne[0] <= 2**31 - 1, "argmax", "rows longer than INT32_MAX", a)
    r = new_tensor_1d(ctx, C.GGML_TYPE_I32, int(a.ne[1]))
    _set_op(r, C.GGML_OP_ARGMAX, a)
    return r


def argsort(ctx, a, order):
    """ggml_argsort: per row of ``a``, the positions 0..ne0-1 sorted by value (I32, a's shape); op_params[0] is the
    order. ggviz: an order other than ASC / DESC is refused here (ggml aborts when it computes)."""
    order = _index(order, "argsort", "order")
    _require(order in (C.GGML_SORT_ORDER_ASC, C.GGML_SORT_ORDER_DESC), "argsort",
             f"order must be GGML_SORT_ORDER_ASC (0) or GGML_SORT_ORDER_DESC (1), got {order}", a)
    _require(a.ne[0] <= 2**31 - 1, "argsort", "rows longer than INT32_MAX", a)
    r = new_tensor(ctx, C.GGML_TYPE_I32, C.GGML_MAX_DIMS, a.shape)
    set_op_params_i32(r, 0, order)
    _set_op(r, C.GGML_OP_ARGSORT, a)
    return r


def argsort_top_k(ctx, a, k):
    """ggml_argsort_top_k: ARGSORT descending, then a view of each row's first k positions (the best k, in order,
    ties as std::sort leaves them). What llama.cpp's build_moe_ffn picks experts with."""
    k = _index(k, "argsort_top_k", "k")
    _require(0 <= k <= a.ne[0], "argsort_top_k", f"need 0 <= k <= a.ne[0], got k = {k}", a)
    # two objects: if the view does not fit, the ARGSORT goes too (a failed call leaves the context as it was)
    mark = ctx._mark(2 * (C.GGML_OBJECT_SIZE + C.GGML_TENSOR_SIZE) + 4 * nelements(a) + C.GGML_MEM_ALIGN)
    try:
        r = argsort(ctx, a, C.GGML_SORT_ORDER_DESC)
        return view_4d(ctx, r, k, int(r.ne[1]), int(r.ne[2]), int(r.ne[3]), int(r.nb[1]), int(r.nb[2]),
                       int(r.nb[3]), 0)
    except BaseException:
        ctx._rollback(mark)
        raise


def top_k(ctx, a, k):
    """ggml_top_k: per row, the positions of the k largest values (I32 [k, ne1, ne2, ne3]), by std::partial_sort;
    the order within them is not promised (the CPU kernel swaps the first two on purpose)."""
    k = _index(k, "top_k", "k")
    _require(0 <= k <= a.ne[0], "top_k", f"need 0 <= k <= a.ne[0], got k = {k}", a)
    r = new_tensor_4d(ctx, C.GGML_TYPE_I32, k, int(a.ne[1]), int(a.ne[2]), int(a.ne[3]))
    _set_op(r, C.GGML_OP_TOP_K, a)
    return r


def repeat(ctx, a, b):
    _require(can_repeat(a, b), "repeat", "a cannot be repeated to b's shape", a, b)
    r = new_tensor(ctx, a.type, C.GGML_MAX_DIMS, b.shape)
    _set_op(r, C.GGML_OP_REPEAT, a)
    return r


def concat(ctx, a, b, dim):
    dim = _index(dim, "concat", "dim")
    _require(0 <= dim < C.GGML_MAX_DIMS, "concat", f"dim {dim} out of range", a, b)
    _require(a.type == b.type, "concat", "a and b must have the same type", a, b)
    ne = []
    for d in range(C.GGML_MAX_DIMS):
        if d == dim:
            ne.append(int(a.ne[d] + b.ne[d]))
            continue
        _require(a.ne[d] == b.ne[d], "concat", f"shapes differ in dim {d}", a, b)
        ne.append(int(a.ne[d]))
    r = new_tensor(ctx, a.type, C.GGML_MAX_DIMS, ne)
    set_op_params_i32(r, 0, dim)
    _set_op(r, C.GGML_OP_CONCAT, a, b)
    return r


# ---------------------------------------------------------------- normalisation

def _norm(ctx, a, eps, op, inplace):
    params = _f32_params(eps, op=C.OP_NAMES[op].lower())
    r = _unary_like(ctx, a, inplace)
    set_op_params(r, params)
    _set_op(r, op, a)
    return r


def norm(ctx, a, eps):
    return _norm(ctx, a, eps, C.GGML_OP_NORM, False)


def norm_inplace(ctx, a, eps):
    return _norm(ctx, a, eps, C.GGML_OP_NORM, True)


def rms_norm(ctx, a, eps):
    return _norm(ctx, a, eps, C.GGML_OP_RMS_NORM, False)


def rms_norm_inplace(ctx, a, eps):
    return _norm(ctx, a, eps, C.GGML_OP_RMS_NORM, True)


# ---------------------------------------------------------------- matrix products

def mul_mat(ctx, a, b):
    # ggml_can_mul_mat and !ggml_is_transposed(a), on ne read once (a graph build makes ~200)
    a0, a1, a2, a3 = a.ne.tolist()
    b0, b1, b2, b3 = b.ne.tolist()
    ok = a0 == b0 and (a2 == 0 or b2 % a2 == 0) and (a3 == 0 or b3 % a3 == 0)
    if not ok or is_transposed(a):          # (the messages only when one fails)
        _require(ok, "mul_mat", "shapes do not match: need a.ne[0] == b.ne[0] and b.ne[2], b.ne[3] multiples of "
                 "a's", a, b)
        _require(False, "mul_mat", "a must not be transposed (nb[0] > nb[1])", a)
    r = ctx.new_tensor_impl(C.GGML_TYPE_F32, 4, [a1, b1, b2, b3], None, 0)
    _set_op(r, C.GGML_OP_MUL_MAT, a, b)
    return r


def mul_mat_id(ctx, as_, b, ids):
    """ggml_mul_mat_id: one matrix product per selected expert. ``as_`` holds n_expert matrices [K, M, n_expert],
    ``b`` the activations [K, n_b, n_tokens] (n_b is 1, or n_expert_used when each expert gets its own input row),
    ``ids`` [n_expert_used, n_tokens] I32 the experts each token is routed to. The result is [M, n_expert_used,
    n_tokens]: column (e, t) is ``as_[ids[e, t]] @ b[:, e % n_b, t]``. (C names the first argument ``as``, a Python
    keyword.)"""
    _require(not is_transposed(as_), "mul_mat_id", "as must not be transposed", as_)
    _require(ids.type == C.GGML_TYPE_I32, "mul_mat_id", "ids must be I32", ids)
    _require(as_.ne[3] == 1, "mul_mat_id", "as must be 3d (one matrix per expert: ne[3] == 1)", as_)
    _require(b.ne[3] == 1, "mul_mat_id", "b must be 3d (ne[3] == 1)", b)
    _require(ids.ne[2] == 1 and ids.ne[3] == 1, "mul_mat_id", "ids must be 2d", ids)
    _require(ids.ne[1] == b.ne[2], "mul_mat_id", "ids needs one expert list per token: ids.ne[1] == b.ne[2]", ids, b)
    _require(as_.ne[0] == b.ne[0], "mul_mat_id", "shapes do not match: need as.ne[0] == b.ne[0]", as_, b)
    _require(ids.ne[0] % b.ne[1] == 0, "mul_mat_id", "ids.ne[0] must be a multiple of b.ne[1] (broadcast)", ids, b)
    ne = [int(as_.ne[1]), int(ids.ne[0]), int(b.ne[2]), 1]
    r = new_tensor(ctx, C.GGML_TYPE_F32, 4, ne)
    _set_op(r, C.GGML_OP_MUL_MAT_ID, as_, b, ids)
    return r


def out_prod(ctx, a, b):
    _require(can_out_prod(a, b), "out_prod",
             "shapes do not match: need a.ne[1] == b.ne[1] and b.ne[2], b.ne[3] multiples of a's", a, b)
    _require(not is_transposed(a), "out_prod", "a must not be transposed", a)
    ne = [int(a.ne[0]), int(b.ne[0]), int(b.ne[2]), int(b.ne[3])]
    r = new_tensor(ctx, C.GGML_TYPE_F32, 4, ne)
    _set_op(r, C.GGML_OP_OUT_PROD, a, b)
    return r


# ---------------------------------------------------------------- convolution: im2col, then a matrix product

def _conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size: (ins + 2p - d(ks - 1) - 1)/s + 1, divided as C divides int64_t (toward zero, so
    an input one tap short of the kernel still gives one output when s > 1)."""
    num = ins + 2 * p - d * (ks - 1) - 1
    q = abs(num) // abs(s)
    return (q if (num >= 0) == (s > 0) else -q) + 1


def _im2col_shape(a, b, s0, s1, p0, p1, d0, d1, is_2D):
    """ggml_im2col's asserts and result shape; returns (op_params bytes, ne). Nothing is created here."""
    s0, s1, p0, p1, d0, d1 = (_index(v, "im2col", n) for v, n in
                              zip((s0, s1, p0, p1, d0, d1), ("s0", "s1", "p0", "p1", "d0", "d1")))
    if is_2D:
        _require(a.ne[2] == b.ne[2], "im2col", "a and b must have the same channels: a.ne[2] == b.ne[2]", a, b)
    else:
        _require(b.ne[1] == a.ne[1], "im2col", "a and b must have the same channels: b.ne[1] == a.ne[1]", a, b)
        _require(b.ne[3] == 1, "im2col", "a 1-D b must be 3d (b.ne[3] == 1)", b)
    # ggviz: a zero stride divides by zero in C (SIGFPE); ggviz names it
    _require(s0 != 0 and (s1 != 0 or not is_2D), "im2col", f"the strides must not be 0 (s0={s0}, s1={s1})")
    params = _pack("im2col", "<7i", s0, s1, p0, p1, d0, d1, 1 if is_2D else 0)
    OH = _conv_output_size(int(b.ne[1]), int(a.ne[1]), s1, p1, d1) if is_2D else 0
    OW = _conv_output_size(int(b.ne[0]), int(a.ne[0]), s0, p0, d0)
    _require(not is_2D or OH > 0, "im2col", f"b too small compared to a (OH = {OH})", a, b)
    _require(OW > 0, "im2col", f"b too small compared to a (OW = {OW})", a, b)
    if is_2D:
        return params, [int(a.ne[2] * a.ne[1] * a.ne[0]), OW, OH, int(b.ne[3])]
    return params, [int(a.ne[1] * a.ne[0]), OW, int(b.ne[2]), 1]


def im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, is_2D, dst_type):
    """ggml_im2col: unroll the patches of image ``b`` [IW, IH, IC, N] that kernel ``a`` [KW, KH, IC, OC] visits into
    rows: the result [IC*KH*KW, OW, OH, N] holds in row (ow, oh, n) the IC*KH*KW input values under the kernel placed
    at output pixel (ow, oh), zero where the kernel hangs over the padding. Only ``a``'s shape is read. 1-D
    (``is_2D`` false): ``a`` [K, IC, OC], ``b`` [IL, IC, N], result [IC*K, OL, N]. ``dst_type`` is F16 or F32
    (the CPU kernel takes no other). op_params: s0, s1, p0, p1, d0, d1, is_2D as int32."""
    params, ne = _im2col_shape(a, b, s0, s1, p0, p1, d0, d1, is_2D)
    r = new_tensor(ctx, dst_type, 4, ne)
    set_op_params(r, params)
    _set_op(r, C.GGML_OP_IM2COL, a, b)
    return r


def _conv_via_im2col(ctx, fn, a, b, conv_params, is_2D, build):
    """ggml_conv_1d / ggml_conv_2d: im2col into F16 (F32 for a BF16 kernel), then ``build(col)`` the MUL_MAT and
    the reshapes. ggviz: every check comes first, and the tensors are made all or none (a mark covering the bytes
    they can write; ``ctx._rollback`` if the arena runs out midway), so a failed call changes nothing."""
    _require(is_contiguous(a), fn, "the kernel a must be contiguous (it is reshaped)", a)
    _, ne = _im2col_shape(a, b, *conv_params, is_2D)
    dst_type = C.GGML_TYPE_F32 if a.type == C.GGML_TYPE_BF16 else C.GGML_TYPE_F16
    n_rows, n_oc = ne[1] * ne[2] * ne[3], int(a.ne[3] if is_2D else a.ne[2])
    nbytes = type_size(dst_type) * ne[0] * n_rows + 2 * 4 * n_rows * n_oc     # im2col, MUL_MAT and cont (F32)
    mark = ctx._mark(nbytes + 8 * (C.GGML_OBJECT_SIZE + C.GGML_TENSOR_SIZE + 2 * C.GGML_MEM_ALIGN))
    try:
        return build(im2col(ctx, a, b, *conv_params, is_2D, dst_type))
    except BaseException:
        ctx._rollback(mark)
        raise


def conv_1d(ctx, a, b, s0, p0, d0):
    """ggml_conv_1d: kernel ``a`` [K, IC, OC], signal ``b`` [IL, IC, N] -> [OL, OC, N]: im2col [IC*K, OL, N], then
    MUL_MAT of its rows by the kernel as OC rows of IC*K values, reshaped."""
    def build(col):                                                                         # [N, OL, IC*K]
        r = mul_mat(ctx, reshape_2d(ctx, col, int(col.ne[0]), int(col.ne[2] * col.ne[1])),
                    reshape_2d(ctx, a, int(a.ne[0] * a.ne[1]), int(a.ne[2])))               # [OC, N*OL]
        return reshape_3d(ctx, r, int(col.ne[1]), int(a.ne[2]), int(col.ne[2]))              # [N, OC, OL]
    return _conv_via_im2col(ctx, "conv_1d", a, b, (s0, 0, p0, 0, d0, 0), False, build)


def conv_2d(ctx, a, b, s0, s1, p0, p1, d0, d1):
    """ggml_conv_2d: kernel ``a`` [KW, KH, IC, OC], image ``b`` [IW, IH, IC, N] -> [OW, OH, OC, N]. ggml builds it
    from other ops: im2col [IC*KH*KW, OW, OH, N]; MUL_MAT of those rows by the kernel as OC rows of IC*KH*KW
    values, [N*OH*OW, OC]; reshaped to [OW, OH, N, OC], and OC moved before N by a permute and a cont."""
    def build(col):                                                                         # [N, OH, OW, IC*KH*KW]
        r = mul_mat(ctx, reshape_2d(ctx, col, int(col.ne[0]), int(col.ne[3] * col.ne[2] * col.ne[1])),
                    reshape_2d(ctx, a, int(a.ne[0] * a.ne[1] * a.ne[2]), int(a.ne[3])))      # [OC, N*OH*OW]
        r = reshape_4d(ctx, r, int(col.ne[1]), int(col.ne[2]), int(col.ne[3]), int(a.ne[3]))  # [OC, N, OH, OW]
        return cont(ctx, permute(ctx, r, 0, 1, 3, 2))                                       # [N, OC, OH, OW]
    return _conv_via_im2col(ctx, "conv_2d", a, b, (s0, s1, p0, p1, d0, d1), True, build)


# ---------------------------------------------------------------- scale

def _scale(ctx, a, s, b, inplace):
    _require(is_padded_1d(a), "scale", "a must be padded 1d", a)
    params = _f32_params(s, b, op="scale")
    r = _unary_like(ctx, a, inplace)
    set_op_params(r, params)
    _set_op(r, C.GGML_OP_SCALE, a)
    return r


def scale(ctx, a, s):
    return _scale(ctx, a, s, 0.0, False)


def scale_inplace(ctx, a, s):
    return _scale(ctx, a, s, 0.0, True)


def scale_bias(ctx, a, s, b):
    return _scale(ctx, a, s, b, False)


# ---------------------------------------------------------------- copies and layout

def cpy(ctx, a, b):
    _require(nelements(a) == nelements(b), "cpy", "a and b must have the same number of elements", a, b)
    r = view_tensor(ctx, b)   # a view of the destination
    if b.name:
        format_name(r, "%s (copy of %s)", b.name, a.name)
    else:
        _name_after(r, a, b" (copy)")
    _set_op(r, C.GGML_OP_CPY, a, b)
    return r


def cast(ctx, a, type):
    r = new_tensor(ctx, type, C.GGML_MAX_DIMS, a.shape)
    _name_after(r, a, b" (copy)")
    _set_op(r, C.GGML_OP_CPY, a, r)
    return r


def cont(ctx, a):
    r = dup_tensor(ctx, a)
    _name_after(r, a, b" (cont)")
    _set_op(r, C.GGML_OP_CONT, a)
    return r


def cont_4d(ctx, a, ne0, ne1, ne2, ne3):
    _require(nelements(a) == ne0 * ne1 * ne2 * ne3, "cont_4d", "element count mismatch", a)
    r = new_tensor_4d(ctx, a.type, ne0, ne1, ne2, ne3)
    _name_after(r, a, b" (cont)")
    _set_op(r, C.GGML_OP_CONT, a)
    return r


def cont_1d(ctx, a, ne0):
    return cont_4d(ctx, a, ne0, 1, 1, 1)


def cont_2d(ctx, a, ne0, ne1):
    return cont_4d(ctx, a, ne0, ne1, 1, 1)


def cont_3d(ctx, a, ne0, ne1, ne2):
    return cont_4d(ctx, a, ne0, ne1, ne2, 1)


def _reshape_nd(ctx, a, ne, fn):
    _require(is_contiguous(a), fn, "a must be contiguous (use ggml_cont first)", a)
    prod = 1
    for x in ne:
        prod *= x
    if nelements(a) != prod:                # (the message only when it fails)
        _require(False, fn, f"cannot reshape {nelements(a)} elements to {list(ne)}", a)
    r = ctx.new_tensor_impl(a.type, len(ne), list(ne), a, 0, None, f"ggml_{fn}")
    _name_after(r, a, b" (reshaped)")
    _set_op(r, C.GGML_OP_RESHAPE, a)
    return r


def reshape(ctx, a, b):
    _require(is_contiguous(a), "reshape", "a must be contiguous", a)
    _require(nelements(a) == nelements(b), "reshape", "a and b must have the same number of elements", a, b)
    r = ctx.new_tensor_impl(a.type, C.GGML_MAX_DIMS, b.shape, a, 0, None, "ggml_reshape")
    _name_after(r, a, b" (reshaped)")
    _set_op(r, C.GGML_OP_RESHAPE, a)
    return r


def reshape_1d(ctx, a, ne0):
    return _reshape_nd(ctx, a, (ne0,), "reshape_1d")


def reshape_2d(ctx, a, ne0, ne1):
    return _reshape_nd(ctx, a, (ne0, ne1), "reshape_2d")


def reshape_3d(ctx, a, ne0, ne1, ne2):
    return _reshape_nd(ctx, a, (ne0, ne1, ne2), "reshape_3d")


def reshape_4d(ctx, a, ne0, ne1, ne2, ne3):
    return _reshape_nd(ctx, a, (ne0, ne1, ne2, ne3), "reshape_4d")


def _view_impl(ctx, a, ne, offset, nb, fn):
    """ggml_view_impl, then the strides view_2d..4d set. ggml checks only the contiguous size of ``ne`` against the
    source; ggviz checks every byte the strides ``nb`` can reach (real ggml accepts, e.g., ``view_2d(a, 4, 4, 1000,
    0)`` of a 16-float tensor, and a negative offset), in new_tensor_impl, before anything is written."""
    if nb is not None:
        try:
            nb = list(map(operator.index, nb))     # (a C loop: no comprehension frame)
        except TypeError:
            raise GGMLError(f"ggml_{fn}: the strides must be integers, got {list(nb)}") from None
        nb = [type_size(a.type)] + nb
    r = ctx.new_tensor_impl(a.type, len(ne), list(ne), a, offset, nb, f"ggml_{fn}")
    _name_after(r, a, b" (view)")
    set_op_params(r, struct.pack("<Q", offset))     # offset is a checked integer in 0..nbytes(a) by now
    _set_op(r, C.GGML_OP_VIEW, a)
    return r


def view_1d(ctx, a, ne0, offset):
    return _view_impl(ctx, a, (ne0,), offset, None, "view_1d")


def view_2d(ctx, a, ne0, ne1, nb1, offset):
    nb1, ne1 = _index(nb1, "view_2d", "nb1"), _index(ne1, "view_2d", "ne1")
    return _view_impl(ctx, a, (ne0, ne1), offset, (nb1, nb1 * ne1, nb1 * ne1), "view_2d")


def view_3d(ctx, a, ne0, ne1, ne2, nb1, nb2, offset):
    nb2, ne2 = _index(nb2, "view_3d", "nb2"), _index(ne2, "view_3d", "ne2")
    return _view_impl(ctx, a, (ne0, ne1, ne2), offset, (nb1, nb2, nb2 * ne2), "view_3d")


def view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset):
    return _view_impl(ctx, a, (ne0, ne1, ne2, ne3), offset, (nb1, nb2, nb3), "view_4d")


def _view_renamed(ctx, a: Tensor, fn: str, suffix: bytes):
    """``ggml_view_tensor(ctx, a)`` then ``ggml_format_name(result, fmt, a->name)``, as permute and transpose start.
    view_tensor names the view "<a> (view)" first; the second name (``suffix`` after a's) is longer, so it covers
    every byte of the first (and its NUL): it is the only one written. Returns the view and a's ne and nb (Python ints)."""
    ne_a, nb_a = a.ne.tolist(), a.nb.tolist()
    r = ctx.new_tensor_impl(a.type, C.GGML_MAX_DIMS, ne_a, a, 0, nb_a, fn)
    _name_after(r, a, suffix)
    return r, ne_a, nb_a


def permute(ctx, a, axis0, axis1, axis2, axis3):
    axes = (axis0, axis1, axis2, axis3)
    if not (type(axis0) is int and type(axis1) is int and type(axis2) is int and type(axis3) is int):
        axes = tuple(_index(x, "permute", "an axis") for x in axes)
    if sorted(axes) != _AXES:               # (0..3 each once)
        _require(False, "permute", f"axes {list(axes)} must be a permutation of 0..3", a)
    r, ne_a, nb_a = _view_renamed(ctx, a, "ggml_permute", b" (permuted)")  # a permutation of a's ne/nb: a's bytes
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax] = ne_a[i]
        nb[ax] = nb_a[i]
    r._q[_Q_NE:_Q_NE + 8] = ne + nb              # ne[4], nb[4]: words 2..9 of the struct
    _set_op(r, C.GGML_OP_PERMUTE, a)
    set_op_params(r, struct.pack("<4i", *axes))
    return r


def transpose(ctx, a):
    r, (ne0, ne1, ne2, ne3), (nb0, nb1, nb2, nb3) = _view_renamed(ctx, a, "ggml_transpose", b" (transposed)")
    r._q[_Q_NE:_Q_NE + 8] = (ne1, ne0, ne2, ne3, nb1, nb0, nb2, nb3)
    _set_op(r, C.GGML_OP_TRANSPOSE, a)
    return r


# ---------------------------------------------------------------- rows

def get_rows(ctx, a, b):
    _require(a.ne[2] == b.ne[1], "get_rows", "a.ne[2] must equal b.ne[1]", a, b)
    _require(a.ne[3] == b.ne[2], "get_rows", "a.ne[3] must equal b.ne[2]", a, b)
    _require(b.ne[3] == 1, "get_rows", "b.ne[3] must be 1", b)
    _require(b.type == C.GGML_TYPE_I32, "get_rows", "row indices b must be I32", b)
    type_ = C.GGML_TYPE_I32 if a.type == C.GGML_TYPE_I32 else C.GGML_TYPE_F32
    r = new_tensor_4d(ctx, type_, int(a.ne[0]), int(b.ne[0]), int(b.ne[1]), int(b.ne[2]))
    _set_op(r, C.GGML_OP_GET_ROWS, a, b)
    return r


_F32_F16, _I64_I32 = (C.GGML_TYPE_F32, C.GGML_TYPE_F16), (C.GGML_TYPE_I64, C.GGML_TYPE_I32)


def set_rows(ctx, a, b, c):
    """ggml_set_rows: write rows of b into a at the row indices c; returns a view of a."""
    a0, _, a2, a3 = a.ne.tolist()
    b0, b1, b2, b3 = b.ne.tolist()
    c0, c1, c2, c3 = c.ne.tolist()
    b_type, c_type = b._w.item(_W_TYPE), c._w.item(_W_TYPE)
    # (x % 0 is 0 for NumPy's int64, which these were compared as)
    if not (a0 == b0 and a2 == b2 and a3 == b3 and b1 == c0 and (c1 == 0 or b2 % c1 == 0)
            and (c2 == 0 or b3 % c2 == 0) and c3 == 1 and b_type in _F32_F16 and c_type in _I64_I32
            and is_contiguous_rows(a) and is_contiguous_rows(b)):
        # the checks one by one (a _require call each) only when one fails: the first failing one's message
        _require(a0 == b0, "set_rows", "a.ne[0] must equal b.ne[0]", a, b)
        _require(a2 == b2 and a3 == b3, "set_rows", "a and b must agree in ne[2], ne[3]", a, b)
        _require(b1 == c0, "set_rows", "b.ne[1] must equal the number of indices c.ne[0]", b, c)
        _require((c1 == 0 or b2 % c1 == 0) and (c2 == 0 or b3 % c2 == 0), "set_rows", "c must broadcast over b",
                 b, c)
        _require(c3 == 1, "set_rows", "c.ne[3] must be 1", c)
        _require(b_type in _F32_F16, "set_rows", "b must be F32 or F16", b)
        _require(c_type in _I64_I32, "set_rows", "indices c must be I64 or I32", c)
        _require(False, "set_rows", "rows must be contiguous", a, b)
    r = view_tensor(ctx, a)
    # order is ggml's (legacy): src0 = the rows, src1 = the indices, src2 = the destination
    _set_op(r, C.GGML_OP_SET_ROWS, b, c, a)
    return r


# ---------------------------------------------------------------- attention pieces

def _soft_max(ctx, a, mask, scale_, max_bias, inplace):
    _require(is_contiguous(a), "soft_max", "a must be contiguous", a)
    if mask is not None:
        _require(mask.type in (C.GGML_TYPE_F16, C.GGML_TYPE_F32), "soft_max", "mask must be F16 or F32", mask)
        _require(is_contiguous(mask), "soft_max", "mask must be contiguous", mask)
        _require(mask.ne[0] == a.ne[0], "soft_max", "mask.ne[0] must equal a.ne[0]", a, mask)
        _require(mask.ne[1] >= a.ne[1], "soft_max", "mask.ne[1] must be >= a.ne[1]", a, mask)
        _require(a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0, "soft_max",
                 "mask must broadcast over a in ne[2], ne[3]", a, mask)
    if max_bias > 0.0:
        _require(mask is not None, "soft_max", "max_bias (ALiBi) needs a mask", a)
    params = _f32_params(scale_, max_bias, op="soft_max")
    r = _unary_like(ctx, a, inplace)
    set_op_params(r, params)
    _set_op(r, C.GGML_OP_SOFT_MAX, a, mask)
    return r


def soft_max(ctx, a):
    return _soft_max(ctx, a, None, 1.0, 0.0, False)


def soft_max_inplace(ctx, a):
    return _soft_max(ctx, a, None, 1.0, 0.0, True)


def soft_max_ext(ctx, a, mask, scale, max_bias):
    return _soft_max(ctx, a, mask, scale, max_bias, False)


def flash_attn_ext(ctx, q, k, v, mask, scale, max_bias, logit_softcap):
    """ggml_flash_attn_ext: softmax(scale * K·Q + mask) · V fused, with the online softmax (no KQ matrix).

    q [DK, n_tokens, n_head, ne3] F32, k [DK, n_kv, n_head_kv, ne3], v [DV, n_kv, n_head_kv, ne3] (not transposed),
    mask [n_kv, >= n_tokens, ne2 | n_head, ne3 | ...] F16 (optional). The result is permuted as ggml's:
    [DV, n_head, n_tokens, ne3] F32. op_params: scale, max_bias, logit_softcap (floats 0..2), the precision
    (int 3, ``flash_attn_ext_set_prec``) and n_kv_max (int 4, ``flash_attn_ext_set_n_kv_max``)."""
    q0, q1, q2, q3 = q.ne.tolist()
    k0, _, k2, k3 = k.ne.tolist()
    v0, _, _, v3 = v.ne.tolist()
    ok = k0 == q0 and (k2 == 0 or q2 % k2 == 0) and (k3 == 0 or q3 % k3 == 0) and q3 == k3 and q3 == v3
    if ok and mask is not None:
        _, _, m2, m3 = mask.ne.tolist()
        # (an empty mask dim broadcasts over nothing: refused below, where C's q->ne[2] % 0 would trap)
        ok = (mask._w.item(_W_TYPE) == C.GGML_TYPE_F16 and is_contiguous(mask) and m2 != 0 and m3 != 0
              and q2 % m2 == 0 and q3 % m3 == 0)
    if not ok:
        # the checks one by one, with their messages, only when one fails
        _require(can_mul_mat(k, q), "flash_attn_ext",
                 "shapes do not match: need k.ne[0] == q.ne[0] and q.ne[2], q.ne[3] multiples of k's", k, q)
        _require(q.ne[3] == k.ne[3] and q.ne[3] == v.ne[3], "flash_attn_ext", "q, k, v must have the same ne[3]",
                 q, k, v)
        if mask is not None:
            _require(mask.type == C.GGML_TYPE_F16, "flash_attn_ext", "mask must be F16", mask)
            _require(is_contiguous(mask), "flash_attn_ext", "mask must be contiguous", mask)
            _, _, m2, m3 = mask.ne.tolist()
            _require(m2 != 0 and m3 != 0 and q2 % m2 == 0 and q3 % m3 == 0, "flash_attn_ext",
                     "mask must broadcast over q in ne[2], ne[3]", q, mask)
    if max_bias > 0.0:
        _require(mask is not None, "flash_attn_ext", "max_bias (ALiBi) needs a mask", q)
    params = _f32_params(scale, max_bias, logit_softcap, op="flash_attn_ext")
    # permute(0, 2, 1, 3): the heads of a token are next to each other, ready for the output projection
    ne = [v0, q2, q1, q3]
    r = new_tensor(ctx, C.GGML_TYPE_F32, 4, ne)
    set_op_params(r, params)
    _set_op(r, C.GGML_OP_FLASH_ATTN_EXT, q, k, v, mask)
    return r


def flash_attn_ext_set_prec(a, prec: int) -> None:
    """ggml_flash_attn_ext_set_prec: op_params[3] (after scale, max_bias, logit_softcap)."""
    _require(a.op == C.GGML_OP_FLASH_ATTN_EXT, "flash_attn_ext_set_prec", "a must be a FLASH_ATTN_EXT node", a)
    set_op_params_i32(a, 3, _index(prec, "flash_attn_ext_set_prec", "prec"))


def flash_attn_ext_get_prec(a) -> int:
    _require(a.op == C.GGML_OP_FLASH_ATTN_EXT, "flash_attn_ext_get_prec", "a must be a FLASH_ATTN_EXT node", a)
    return get_op_params_i32(a, 3)


def flash_attn_ext_set_n_kv_max(a, n_kv_max: int) -> None:
    """ggml_flash_attn_ext_set_n_kv_max: op_params[4] (0: all of k's cells; a hint the CPU kernel does not read)."""
    _require(a.op == C.GGML_OP_FLASH_ATTN_EXT, "flash_attn_ext_set_n_kv_max", "a must be a FLASH_ATTN_EXT node", a)
    n_kv_max = _index(n_kv_max, "flash_attn_ext_set_n_kv_max", "n_kv_max")
    _require(n_kv_max >= 0, "flash_attn_ext_set_n_kv_max", f"n_kv_max must be >= 0, got {n_kv_max}", a)
    set_op_params_i32(a, 4, n_kv_max)


def flash_attn_ext_add_sinks(a, sinks) -> None:
    """ggml_flash_attn_ext_add_sinks: src[4], one F32 sink logit per query head (None: no sinks)."""
    if sinks is None:
        a.src[4] = None
        return
    _require(a.op == C.GGML_OP_FLASH_ATTN_EXT, "flash_attn_ext_add_sinks", "a must be a FLASH_ATTN_EXT node", a)
    _require(a.src[4] is None, "flash_attn_ext_add_sinks", "the node already has sinks", a)
    _require(a.src[0].ne[2] == sinks.ne[0], "flash_attn_ext_add_sinks", "need one sink per query head", a, sinks)
    _require(sinks.type == C.GGML_TYPE_F32, "flash_attn_ext_add_sinks", "sinks must be F32", sinks)
    a.src[4] = sinks


def prec_set_acc(a, prec: int) -> bool:
    """ggml_prec_set_acc: the accumulator precision op param of MUL_MAT / MUL_MAT_ID (op_params[0]) and
    FLASH_ATTN_EXT (op_params[3]); False for any other op."""
    prec = _index(prec, "prec_set_acc", "prec")
    if a.op in (C.GGML_OP_MUL_MAT, C.GGML_OP_MUL_MAT_ID):
        set_op_params_i32(a, 0, prec)
    elif a.op == C.GGML_OP_FLASH_ATTN_EXT:
        set_op_params_i32(a, 3, prec)
    else:
        return False
    return True


def _rope_impl(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
               beta_fast, beta_slow, inplace):
    mrope = bool(mode & C.GGML_ROPE_TYPE_MROPE)
    b0, b1, b2, b3 = b.ne.tolist()
    if not ((mode & 1) == 0 and b1 == 1 and b2 == 1 and b3 == 1 and b._w.item(_W_TYPE) == C.GGML_TYPE_I32
            and a.ne.item(2) * (4 if mrope else 1) == b0
            and (c is None or (c._w.item(_W_TYPE) == C.GGML_TYPE_F32 and c.ne.item(0) >= n_dims // 2))):
        # the checks one by one (with their messages, on NumPy's scalars as ever) only when one fails
        _require((mode & 1) == 0, "rope", "mode & 1 == 1 is no longer supported", a)
        _require(is_vector(b), "rope", "positions b must be a vector", b)
        _require(b.type == C.GGML_TYPE_I32, "rope", "positions b must be I32", b)
        if mrope:
            _require(a.ne[2] * 4 == b.ne[0], "rope", "mrope expects 4 positions per token", a, b)
        else:
            _require(a.ne[2] == b.ne[0], "rope", "need one position per token: a.ne[2] == b.ne[0]", a, b)
        if c is not None:
            _require(c.type == C.GGML_TYPE_F32, "rope", "freq factors c must be F32", c)
            _require(c.ne[0] >= n_dims // 2, "rope", "freq factors c must hold n_dims/2 values", c)
    secs = list(sections) if (mrope and sections) else [0, 0, 0, 0]
    params = _pack("rope", "<5i6f4i", 0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale, ext_factor,
                   attn_factor, beta_fast, beta_slow, *secs)
    r = _unary_like(ctx, a, inplace)
    set_op_params(r, params)
    _set_op(r, C.GGML_OP_ROPE, a, b, c)
    return r


def rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
             beta_slow):
    return _rope_impl(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                      beta_fast, beta_slow, False)


def rope_ext_inplace(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                     beta_fast, beta_slow):
    return _rope_impl(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                      beta_fast, beta_slow, True)


def rope(ctx, a, b, n_dims, mode):
    return _rope_impl(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False)


# ---------------------------------------------------------------- activations

def _unary(ctx, a, uop, inplace):
    _require(is_contiguous_rows(a), "unary", "a must have contiguous rows", a)
    params = _pack("unary", "<i", uop)
    r = _unary_like(ctx, a, inplace)
    set_op_params(r, params)
    _set_op(r, C.GGML_OP_UNARY, a)
    return r


def unary(ctx, a, op):
    return _unary(ctx, a, op, False)


def unary_inplace(ctx, a, op):
    return _unary(ctx, a, op, True)


def silu(ctx, a):
    return _unary(ctx, a, C.GGML_UNARY_OP_SILU, False)


def silu_inplace(ctx, a):
    return _unary(ctx, a, C.GGML_UNARY_OP_SILU, True)


def gelu(ctx, a):
    return _unary(ctx, a, C.GGML_UNARY_OP_GELU, False)


def gelu_inplace(ctx, a):
    return _unary(ctx, a, C.GGML_UNARY_OP_GELU, True)


def relu(ctx, a):
    return _unary(ctx, a, C.GGML_UNARY_OP_RELU, False)


def relu_inplace(ctx, a):
    return _unary(ctx, a, C.GGML_UNARY_OP_RELU, True)


def _glu(ctx, a, b, gop, swapped):
    a_type, ne = a._w.item(_W_TYPE), a.ne.tolist()
    if not is_contiguous_1(a) or (b is not None and not (
            is_contiguous_1(b) and b.ne.tolist() == ne and b._w.item(_W_TYPE) == a_type)):
        # the checks one by one, with their messages, only when one fails
        _require(is_contiguous_1(a), "glu", "a must be contiguous in dims >= 1", a)
        if b is not None:
            _require(is_contiguous_1(b), "glu", "b must be contiguous in dims >= 1", b)
            _require(are_same_shape(a, b), "glu", "a and b must have the same shape", a, b)
            _require(a.type == b.type, "glu", "a and b must have the same type", a, b)
    if b is None:
        ne[0] //= 2
    params = _pack("glu", "<2i", gop, int(swapped))
    r = ctx.new_tensor_impl(a_type, C.GGML_MAX_DIMS, ne, None, 0)
    set_op_params(r, params)
    _set_op(r, C.GGML_OP_GLU, a, b)
    return r


def glu(ctx, a, op, swapped):
    return _glu(ctx, a, None, op, swapped)


def glu_split(ctx, a, b, op):
    return _glu(ctx, a, b, op, False)


def swiglu(ctx, a):
    return _glu(ctx, a, None, C.GGML_GLU_OP_SWIGLU, False)


def swiglu_swapped(ctx, a):
    return _glu(ctx, a, None, C.GGML_GLU_OP_SWIGLU, True)


def swiglu_split(ctx, a, b):
    return _glu(ctx, a, b, C.GGML_GLU_OP_SWIGLU, False)


def geglu(ctx, a):
    return _glu(ctx, a, None, C.GGML_GLU_OP_GEGLU, False)


def geglu_split(ctx, a, b):
    return _glu(ctx, a, b, C.GGML_GLU_OP_GEGLU, False)


# ---------------------------------------------------------------- PowerInfer's sparse FFN ops (SJTU-IPADS/PowerInfer)
# ggml_mul_mat_idx, ggml_mul_mat_idx_upscale and ggml_axpy of PowerInfer's ggml.c. Their op ids come after ggml
# 0.20.2's enum (tensor.GGML_OP_MUL_MAT_SPARSE / GGML_OP_AXPY): PowerInfer inserted them after GGML_OP_MUL_MAT,
# ggviz does not renumber ggml's ops. The kernels are ggviz.ggml.cpu.powerinfer.


def _sparse_checks(op, a, b, sparse_idx, aux, n_idx):
    _require(a is not None and b is not None and sparse_idx is not None, op, "a, b and sparse_idx are required")
    _require(not is_transposed(a), op, "a must not be transposed (nb[0] > nb[1])", a)
    _require(sparse_idx.type == C.GGML_TYPE_F32, op, "sparse_idx must be F32 (the predictor's logits)", sparse_idx)
    _require(int(sparse_idx.ne[0]) == n_idx and nelements(sparse_idx) == n_idx * int(b.ne[1] * b.ne[2] * b.ne[3]),
             op, f"sparse_idx must be [{n_idx}, n_tokens] like b's columns", sparse_idx, b)
    _require(aux is None or (aux.type == C.GGML_TYPE_I32 and is_vector(aux)), op,
             "gpu_idx / gpu_bucket must be an I32 vector", aux)


def mul_mat_idx(ctx, a, b, sparse_idx, gpu_idx):
    """ggml_mul_mat_idx: a * b like ggml_mul_mat, but row r of the result is 0 where gpu_idx[r] == 1 (the row lives
    on the GPU) or sparse_idx[r] < sparse_pred_threshold (the predictor says the neuron stays inactive).
    gpu_idx may be None (all rows on the CPU)."""
    _require(can_mul_mat(a, b), "mul_mat_idx",
             "shapes do not match: need a.ne[0] == b.ne[0] and b.ne[2], b.ne[3] multiples of a's", a, b)
    _sparse_checks("mul_mat_idx", a, b, sparse_idx, gpu_idx, int(a.ne[1]))
    _require(gpu_idx is None or int(gpu_idx.ne[0]) == int(a.ne[1]), "mul_mat_idx",
             "gpu_idx must have one entry per row of a", gpu_idx, a)
    ne = [int(a.ne[1]), int(b.ne[1]), int(b.ne[2]), int(b.ne[3])]
    r = new_tensor(ctx, C.GGML_TYPE_F32, 4, ne)
    _set_op(r, GGML_OP_MUL_MAT_SPARSE, a, b, sparse_idx, gpu_idx)
    set_op_params_i32(r, 0, 0 if gpu_idx is not None else 1)
    return r


def mul_mat_idx_upscale(ctx, a, b, sparse_idx, gpu_bucket, result_ne0):
    """ggml_mul_mat_idx_upscale: the GPU half. a holds only the hot rows (a.ne[1] == len(gpu_bucket)); the result
    has result_ne0 (n_ff) rows: row gpu_bucket[i] = a[i] . b where the predictor keeps it, every other row 0.

    op_params[1] = 1 is ggviz's: PowerInfer's dispatcher knows the GPU half by tensor->backend, which ggviz's
    tensors do not have, so the kernel reads this flag instead."""
    result_ne0 = _index(result_ne0, "mul_mat_idx_upscale", "result_ne0")
    _require(int(a.ne[0]) == int(b.ne[0]), "mul_mat_idx_upscale", "need a.ne[0] == b.ne[0]", a, b)
    _require(int(a.ne[2]) == 1 and int(a.ne[3]) == 1, "mul_mat_idx_upscale", "a must be a matrix", a)
    _sparse_checks("mul_mat_idx_upscale", a, b, sparse_idx, gpu_bucket, result_ne0)
    _require(gpu_bucket is not None and int(gpu_bucket.ne[0]) == int(a.ne[1]), "mul_mat_idx_upscale",
             "gpu_bucket must name one row of the result per row of a", gpu_bucket, a)
    ne = [result_ne0, int(b.ne[1]), int(b.ne[2]), int(b.ne[3])]
    r = new_tensor(ctx, C.GGML_TYPE_F32, 4, ne)
    _set_op(r, GGML_OP_MUL_MAT_SPARSE, a, b, sparse_idx, gpu_bucket)
    set_op_params_i32(r, 1, 1)
    return r


def axpy(ctx, a, b, sparse_idx, hybrid_aux, *, bucket=False):
    """ggml_axpy: dst[:, j] = sum over rows r of a (= down^T, [n_embd, n_ff]) of b[r, j] * a[r], skipping rows where
    b[r, j] == 0, sparse_idx[r, j] < sparse_pred_threshold or (CPU half) hybrid_aux[r] == 1 (the row is on the GPU).

    hybrid_aux is gpu_idx on the CPU; on the GPU it is gpu_bucket (a holds only the hot rows, row i is neuron
    gpu_bucket[i]): ``bucket=True`` says so (ggviz's op_params[1]; PowerInfer tells by tensor->backend)."""
    _require(a is not None and b is not None, "axpy", "a and b are required")
    n_ff = int(b.ne[0])
    _sparse_checks("axpy", a, b, sparse_idx, hybrid_aux, n_ff)
    _require(int(a.ne[2]) == 1 and int(a.ne[3]) == 1, "axpy", "a must be a matrix", a)
    if bucket:
        _require(hybrid_aux is not None and int(hybrid_aux.ne[0]) == int(a.ne[1]), "axpy",
                 "gpu_bucket must name one neuron per row of a", hybrid_aux, a)
    else:
        _require(int(a.ne[1]) == n_ff, "axpy", "a must have one row per element of b's columns (a.ne[1] == b.ne[0])",
                 a, b)
        _require(hybrid_aux is None or int(hybrid_aux.ne[0]) == n_ff, "axpy",
                 "gpu_idx must have one entry per row of a", hybrid_aux, a)
    ne = [int(a.ne[0]), int(b.ne[1]), int(b.ne[2]), int(b.ne[3])]
    r = new_tensor(ctx, C.GGML_TYPE_F32, 4, ne)
    _set_op(r, GGML_OP_AXPY, a, b, sparse_idx, hybrid_aux)
    set_op_params_i32(r, 0, 0 if hybrid_aux is not None else 1)
    set_op_params_i32(r, 1, 1 if bucket else 0)
    return r
