"""What every CPU kernel receives: ``struct ggml_compute_params`` and helpers to see tensor bytes as arrays.

Mirrors ggml-cpu-impl.h (``ggml_compute_params``) and the row-partitioning idiom of ggml-cpu's ops
(``dr = (nr + nth - 1)/nth; ir0 = dr*ith; ir1 = MIN(ir0 + dr, nr)``).

Kernel contract (ggviz.ggml.cpu.ops): ``forward_<op>(params, dst)`` is called once per thread with
``params.ith`` in ``range(params.nth)``, on every thread for every node, exactly as ggml calls
``ggml_compute_forward`` (ops that ggml runs single-threaded return early when ``ith != 0``). A kernel touches
only its own share of ``dst`` and may call ``params.barrier()`` where ggml calls ``ggml_barrier``.
"""
from __future__ import annotations

import numpy as np

from ..tensor import NP_DTYPES, Tensor, nbytes
from .. import memory

CACHE_LINE_SIZE = 64     # ops.h on x86-64
CACHE_LINE_SIZE_F32 = CACHE_LINE_SIZE // 4


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
    from ..tensor import row_size
    ne, nb = t.shape, t.strides
    rb = row_size(t.type, ne[0])
    arr, off = tensor_bytes(t)
    return np.ndarray(shape=(ne[3], ne[2], ne[1], rb), dtype=np.uint8, buffer=arr, offset=off,
                      strides=(nb[3], nb[2], nb[1], 1))
