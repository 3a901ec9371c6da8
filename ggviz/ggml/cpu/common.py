"""What every CPU kernel receives: ``struct ggml_compute_params``, the type conversions, tensor bytes as arrays.

Mirrors ggml-cpu-impl.h (``ggml_compute_params``), ggml-cpu/common.h (``type_conversion_table<T>::to_f32`` /
``from_f32``, ``GGML_CPU_FP32_TO_FP16``, ``get_thread_range``) and the row-partitioning idiom of ggml-cpu's ops
(``dr = (nr + nth - 1)/nth; ir0 = dr*ith; ir1 = MIN(ir0 + dr, nr)``), plus the tensor plumbing the NumPy kernels of
``ops.py``, ``binary_ops.py`` and ``unary_ops.py`` share (strided views of a tensor's rows and blocks).

Kernel contract (ggviz.ggml.cpu.ops): ``forward_<op>(params, dst)`` is called once per thread with
``params.ith`` in ``range(params.nth)``, on every thread for every node, exactly as ggml calls
``ggml_compute_forward`` (ops that ggml runs single-threaded return early when ``ith != 0``). A kernel touches
only its own share of ``dst`` and may call ``params.barrier()`` where ggml calls ``ggml_barrier``.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import consts as C
from .. import memory
from ..tensor import NP_DTYPES, Tensor, blck_size, is_empty, nbytes, row_size, type_name, type_size

F32 = np.float32
F64 = np.float64

CACHE_LINE_SIZE = 64     # ops.h on x86-64
CACHE_LINE_SIZE_F32 = CACHE_LINE_SIZE // 4
# common.h's GGML_FA_TILE_Q / GGML_FA_TILE_KV: flash attention's tiles of query rows and KV cells (batch kernel)
FA_TILE_Q = 64
FA_TILE_KV = 64


class ComputeParams:
    """struct ggml_compute_params {ith, nth, wsize, wdata, threadpool, use_ref}."""
    __slots__ = ("ith", "nth", "wsize", "wdata", "threadpool", "use_ref")

    def __init__(self, ith: int, nth: int, wdata: np.ndarray | None, threadpool=None, use_ref: bool = False):
        self.ith = ith
        self.nth = nth
        self.wdata = wdata if wdata is not None else np.zeros(0, np.uint8)
        self.wsize = int(self.wdata.nbytes)
        self.threadpool = threadpool
        self.use_ref = use_ref

    def barrier(self):
        """ggml_barrier: every thread of the pool waits here until all have arrived."""
        if self.threadpool is not None and self.nth > 1:
            self.threadpool.barrier(self.ith)


def thread_range(n: int, ith: int, nth: int):
    """Rows [ir0, ir1) of thread ``ith``: ggml's ``dr = (nr + nth - 1)/nth`` split."""
    dr = (n + nth - 1) // nth
    ir0 = dr * ith
    ir1 = min(ir0 + dr, n)
    return ir0, max(ir0, ir1)


def tensor_bytes(t: Tensor) -> tuple[np.ndarray, int]:
    """(buffer, byte offset) of ``t->data``."""
    arr, off, _ = memory.resolve(t.data, nbytes(t))
    return arr, off


def as_array(t: Tensor, dtype=None) -> np.ndarray:
    """Zero-copy strided view (ne3, ne2, ne1, ne0) of an element-typed tensor, optionally re-typed.

    ``dtype`` lets a kernel read F32 bytes as float32 etc.; the byte strides stay ggml's nb.
    """
    dt = np.dtype(dtype) if dtype is not None else np.dtype(NP_DTYPES[t.type])
    ne, nb = t.shape, t.strides
    if min(ne) == 0:
        return np.zeros(ne[::-1], dtype=dt)
    arr, off = tensor_bytes(t)
    return np.ndarray(shape=ne[::-1], dtype=dt, buffer=arr, offset=off, strides=nb[::-1])


def rows_bytes(t: Tensor) -> np.ndarray:
    """Zero-copy (ne3, ne2, ne1, row_bytes) uint8 view of a tensor's rows (for quantized types)."""
    ne, nb = t.shape, t.strides
    rb = row_size(t.type, ne[0])
    arr, off = tensor_bytes(t)
    return np.ndarray(shape=(ne[3], ne[2], ne[1], rb), dtype=np.uint8, buffer=arr, offset=off,
                      strides=(nb[3], nb[2], nb[1], 1))


# =====================================================================================================================
# type conversions (common.h)
# =====================================================================================================================


def f32_to_f16(x):
    """GGML_CPU_FP32_TO_FP16 on F16C: vcvtps2ph with round-to-nearest-even (NumPy's cast rounds the same way)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, F32).astype(np.float16)


def f16_to_f32(h):
    return np.asarray(h).astype(F32)


def f32_to_bf16(x):
    """ggml_compute_fp32_to_bf16: round to nearest even on the bits; NaNs are quieted (| 64)."""
    u = np.asarray(x, F32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    if np.any(nan):
        r = np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)
    return r


def bf16_to_f32(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(F32)


def f32_to_i32(x):
    """C's float -> int32_t cast as x86 does it (cvttss2si): truncation; NaN/out of range -> INT32_MIN."""
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(x) & (x >= -2147483648.0) & (x < 2147483648.0)
        r = np.trunc(np.where(ok, x, 0)).astype(np.int32)
    return np.where(ok, r, np.int32(-2**31))


def to_f32(a, type_):
    """type_conversion_table<T>::to_f32 on an array of ``type_`` elements (BF16 given as uint16 bits)."""
    if type_ == C.GGML_TYPE_F32:
        return np.asarray(a, F32)
    if type_ == C.GGML_TYPE_F16:
        return f16_to_f32(a)
    if type_ == C.GGML_TYPE_BF16:
        return bf16_to_f32(a)
    if type_ == C.GGML_TYPE_I32:
        return np.asarray(a).astype(F32)
    raise NotImplementedError(f"no float conversion from {type_name(type_)}")


def from_f32(v, type_):
    """type_conversion_table<T>::from_f32."""
    if type_ == C.GGML_TYPE_F32:
        return np.asarray(v, F32)
    if type_ == C.GGML_TYPE_F16:
        return f32_to_f16(v)
    if type_ == C.GGML_TYPE_BF16:
        return f32_to_bf16(v)
    if type_ == C.GGML_TYPE_I32:
        return f32_to_i32(v)
    raise NotImplementedError(f"no float conversion to {type_name(type_)}")


# =====================================================================================================================
# tensor plumbing
# =====================================================================================================================


def block_view(t: Tensor) -> np.ndarray:
    """(ne3, ne2, ne1, ne0/blck) view whose elements are the tensor's blocks as raw bytes (void dtype).

    For element types a block is one element; this is how dup_bytes / concat_any see any type.
    """
    ts, bs = type_size(t.type), blck_size(t.type)
    ne, nb = t.shape, t.strides
    shape = (ne[3], ne[2], ne[1], ne[0] // bs)
    dt = np.dtype((np.void, ts))
    if min(shape) == 0:
        return np.zeros(shape, dt)
    arr, off = tensor_bytes(t)
    return np.ndarray(shape=shape, dtype=dt, buffer=arr, offset=off, strides=(nb[3], nb[2], nb[1], nb[0]))


def flat_rows(t: Tensor, nr: int, ne0: int, dtype=None) -> np.ndarray:
    """(nr, ne0) view of a tensor whose rows are ``i*nb[1]`` apart (what GLU/SCALE index as ``i1*nb1``)."""
    dt = np.dtype(dtype) if dtype is not None else np.dtype(NP_DTYPES[t.type])
    arr, off = tensor_bytes(t)
    return np.ndarray(shape=(nr, ne0), dtype=dt, buffer=arr, offset=off, strides=(int(t.nb[1]), int(t.nb[0])))


def row_idx(ir0: int, ir1: int, ne1: int, ne2: int):
    """ir -> (i3, i2, i1) exactly as the kernels decompose a flat row index."""
    r = np.arange(ir0, ir1, dtype=np.int64)
    i3 = r // (ne2 * ne1)
    i2 = (r - i3 * ne2 * ne1) // ne1
    i1 = r - i3 * ne2 * ne1 - i2 * ne1
    return i3, i2, i1


def interleaved_rows(ne1: int, ne2: int, ne3: int, ith: int, nth: int):
    """Rows of ``for i03, for i02, for (i01 = ith; i01 < ne01; i01 += nth)`` (norm, rms_norm, soft_max)."""
    i1s = np.arange(ith, ne1, nth, dtype=np.int64)
    if i1s.size == 0:
        return None
    i3, i2, i1 = np.meshgrid(np.arange(ne3), np.arange(ne2), i1s, indexing="ij")
    return i3.ravel(), i2.ravel(), i1.ravel()


def scratch(params: ComputeParams, ne0: int):
    """``(float *) params->wdata + (ne0 + CACHE_LINE_SIZE_F32)*ith``: this thread's float scratch row (or None)."""
    start = (ne0 + CACHE_LINE_SIZE_F32) * params.ith * 4
    w = params.wdata
    if w is None or w.nbytes < start + ne0 * 4:
        return None
    return w[start:start + ne0 * 4].view(F32)


def put_scratch(params: ComputeParams, ne0: int, row):
    """Leave in the scratch row what ggml leaves there: the last row the thread staged."""
    s = scratch(params, ne0)
    if s is not None and row is not None:
        s[:] = np.asarray(row, F32).ravel()[:ne0]


def kernel(fn):
    """ggml_compute_forward's early return: nothing to do for GGML_OP_NONE or an empty tensor."""
    @functools.wraps(fn)
    def run(params: ComputeParams, dst: Tensor, *args):
        if dst.op == C.GGML_OP_NONE or is_empty(dst):
            return
        return fn(params, dst, *args)
    return run
