"""ggml-backend.cpp: buffer types, buffers, backends (streams), devices, regs, events -- the backend object model.

Mirrors (ggml-backend-impl.h / ggml-backend.h / ggml-backend.cpp, 0.20.2):

* ``struct ggml_backend_buffer_type_i`` / ``struct ggml_backend_buffer_type``: a kind of memory (its name, how to
  allocate a buffer of it, the alignment of tensors in it, an optional maximum buffer size, an optional per-tensor
  allocation size, whether it is host memory) and the ``ggml_backend_buft_*`` wrappers that apply the defaults
  (max size SIZE_MAX, alloc size ``ggml_nbytes``, not host);
* ``struct ggml_backend_buffer_i`` / ``struct ggml_backend_buffer``: one allocated block (base, size, usage ANY /
  WEIGHTS / COMPUTE) and the ``ggml_backend_buffer_*`` wrappers;
* ``ggml_backend_tensor_alloc`` (place a tensor at an address of a buffer), ``ggml_backend_view_init`` (a view
  shares its source's buffer), ``ggml_backend_tensor_set/get/memset``;
* the CPU buffer type (``ggml_backend_cpu_buffer_type``, name "CPU", alignment TENSOR_ALIGNMENT = 32, host memory)
  and ``ggml_backend_cpu_buffer_from_ptr`` -- in ggml-backend.cpp too, since every backend may use host buffers;
* the multi-buffer (``ggml_backend_multi_buffer_alloc_buffer``) that ``ggml_backend_alloc_ctx_tensors`` returns when
  a context's tensors need several buffers;
* ``struct ggml_backend_reg`` (a backend "library": its name, devices, exported functions by name:
  ``backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads")``), ``struct ggml_backend_device`` (name,
  description, type CPU / GPU / IGPU / ACCEL, memory, props and caps, its buffer type, ``supports_op``,
  ``supports_buft``, ``offload_op``, events) and ``struct ggml_backend`` (a stream on a device: ``graph_compute``,
  async tensor access, ``synchronize``, events), with the ``ggml_backend_*`` wrappers (``backend_tensor_copy``:
  host source -> tensor_set, host destination -> tensor_get, else the destination buffer's ``cpy_tensor``, else a
  bounce through host memory).

Function names are ggml-backend.h's without the ``ggml_`` prefix (``ggml_backend_buft_alloc_buffer`` is
``backend_buft_alloc_buffer``). Elsewhere: the registry (ggml-backend-reg.cpp) is ``ggviz.ggml.backend_reg``, the
CPU backend (ggml-cpu.cpp) ``ggviz.ggml.cpu.cpu_backend``, the scheduler ``ggviz.ggml.sched``.

Addresses are real. A buffer's memory comes from ``memory.aligned_malloc`` (so ``ggml.get_data`` works on its
tensors), and each buffer / buffer type also owns the bytes of its C struct (``struct ggml_backend_buffer`` is 120
bytes on LP64, ``struct ggml_backend_buffer_type`` 64), so ``tensor->buffer`` holds a genuine pointer that
``buffer_at`` turns back into the Python object. The ``iface`` function pointers are Python callables, not bytes:
those struct slots stay zero.
"""
from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .. import trace
from . import consts as C
from . import memory
from .impl import GGML_ASSERT, GGML_LOG, GGML_PAD, GGMLError
from .tensor import Tensor, nbytes

# ggml-impl.h: "required for mmap as gguf only guarantees 32-byte alignment". The CPU buffer type reports it as its
# alignment; the buffer memory itself comes from ggml_aligned_malloc (64-byte aligned), so offset 0 is aligned.
TENSOR_ALIGNMENT = 32
SIZE_MAX = (1 << 64) - 1

# enum ggml_backend_buffer_usage
GGML_BACKEND_BUFFER_USAGE_ANY = 0
GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 1
GGML_BACKEND_BUFFER_USAGE_COMPUTE = 2
BUFFER_USAGE_NAMES = {0: "ANY", 1: "WEIGHTS", 2: "COMPUTE"}

BUFFER_STRUCT_SIZE = 120        # sizeof(struct ggml_backend_buffer): iface (11 pointers), buft, context, size, usage
BUFT_STRUCT_SIZE = 64           # sizeof(struct ggml_backend_buffer_type): iface (6 pointers), device, context
_Q_BUF_BUFT, _Q_BUF_CONTEXT, _Q_BUF_SIZE, _W_BUF_USAGE = 11, 12, 13, 28      # word indices in the buffer struct
_Q_BUFT_DEVICE, _Q_BUFT_CONTEXT = 6, 7


# address -> buffer object (weak: a buffer nobody holds is released like a freed one)
_buffers: "weakref.WeakValueDictionary[int, ggml_backend_buffer]" = weakref.WeakValueDictionary()


# the registry's own dict (address -> weak reference), read directly as tensor.tensor_at reads the tensors': one
# probe and a call instead of WeakValueDictionary.get's Python frame (a graph's split asks ~1,600 times)
_buffers_refs = _buffers.data


def buffer_at(addr: int):
    """The ``ggml_backend_buffer`` whose struct starts at ``addr`` (None for NULL), e.g. ``buffer_at(t.buffer)``."""
    if not addr:
        return None
    r = _buffers_refs.get(addr if type(addr) is int else int(addr))
    b = r() if r is not None else None
    if b is None:
        raise ValueError(f"no ggml_backend_buffer at address 0x{int(addr):x} (freed?)")
    return b


# ==================================================================================================
# buffer type
# ==================================================================================================

@dataclass
class ggml_backend_buffer_type_i:
    get_name: Callable                               # (buft) -> str
    alloc_buffer: Callable                           # (buft, size) -> buffer: allocate a buffer of this type
    get_alignment: Callable                          # (buft) -> int: tensor alignment
    get_max_size: Optional[Callable] = None          # (buft) -> int: max buffer size (defaults to SIZE_MAX)
    get_alloc_size: Optional[Callable] = None        # (buft, tensor) -> int: incl. padding (defaults to ggml_nbytes)
    is_host: Optional[Callable] = None               # (buft) -> bool: host memory, standard layout (defaults False)


class ggml_backend_buffer_type:
    """``struct ggml_backend_buffer_type { iface; device; context; }``."""
    __slots__ = ("iface", "device", "context", "raw", "addr", "__weakref__")

    def __init__(self, iface: ggml_backend_buffer_type_i, device=None, context=None):
        self.iface = iface
        self.device = device
        self.context = context
        self.raw = memory.aligned_malloc(BUFT_STRUCT_SIZE, "ggml_backend_buffer_type")
        self.addr = self.raw.ctypes.data
        q = self.raw.view(np.uint64)
        q[_Q_BUFT_DEVICE] = getattr(device, "addr", 0) or 0
        q[_Q_BUFT_CONTEXT] = getattr(context, "addr", 0) or 0

    def __repr__(self):
        return f"<ggml_backend_buffer_type {backend_buft_name(self)!r} @0x{self.addr:x}>"


def backend_buft_name(buft) -> str:
    GGML_ASSERT(buft is not None, "buft")
    return buft.iface.get_name(buft)


def backend_buft_alloc_buffer(buft, size: int):
    GGML_ASSERT(buft is not None, "buft")
    if size == 0:
        # return a dummy buffer for zero-sized allocations
        return backend_buffer_init(buft, ggml_backend_buffer_i(), None, 0)
    return buft.iface.alloc_buffer(buft, size)


def backend_buft_get_alignment(buft) -> int:
    GGML_ASSERT(buft is not None, "buft")
    return buft.iface.get_alignment(buft)


def backend_buft_get_max_size(buft) -> int:
    GGML_ASSERT(buft is not None, "buft")
    # get_max_size is optional, defaults to SIZE_MAX
    if buft.iface.get_max_size is not None:
        return buft.iface.get_max_size(buft)
    return SIZE_MAX


def backend_buft_get_alloc_size(buft, tensor: Tensor) -> int:
    GGML_ASSERT(buft is not None, "buft")
    # get_alloc_size is optional, defaults to ggml_nbytes
    if buft.iface.get_alloc_size is not None:
        size = buft.iface.get_alloc_size(buft, tensor)
        assert size >= nbytes(tensor)
        return size
    return nbytes(tensor)


def backend_buft_is_host(buft) -> bool:
    GGML_ASSERT(buft is not None, "buft")
    if buft.iface.is_host is not None:
        return buft.iface.is_host(buft)
    return False


def backend_buft_get_device(buft):
    GGML_ASSERT(buft is not None, "buft")
    return buft.device


# ==================================================================================================
# buffer
# ==================================================================================================

@dataclass
class ggml_backend_buffer_i:
    free_buffer: Optional[Callable] = None     # (buffer): (optional) free the buffer
    get_base: Optional[Callable] = None        # (buffer) -> int: base address of the buffer
    init_tensor: Optional[Callable] = None     # (buffer, tensor) -> status: (optional) e.g. add tensor extras
    memset_tensor: Optional[Callable] = None   # (buffer, tensor, value, offset, size)
    set_tensor: Optional[Callable] = None      # (buffer, tensor, data, offset, size)
    get_tensor: Optional[Callable] = None      # (buffer, tensor, data, offset, size)
    set_tensor_2d: Optional[Callable] = None   # (optional) 2d data copies
    get_tensor_2d: Optional[Callable] = None
    cpy_tensor: Optional[Callable] = None      # (buffer, src, dst) -> bool: (optional) dst is in the buffer
    clear: Optional[Callable] = None           # (buffer, value): clear the entire buffer
    reset: Optional[Callable] = None           # (buffer): (optional) reset state due to tensor initialization


class ggml_backend_buffer:
    """``struct ggml_backend_buffer { iface; buft; context; size; usage; }``.

    ``context`` is the backend's private data: for a CPU buffer the NumPy array holding the memory (in C, the
    pointer returned by ggml_aligned_malloc). ``size`` and ``usage`` live in the struct bytes.
    """
    __slots__ = ("iface", "buft", "context", "raw", "addr", "_q", "_w", "__weakref__")

    def __init__(self, buft, iface: ggml_backend_buffer_i, context, size: int):
        self.raw = memory.aligned_malloc(BUFFER_STRUCT_SIZE, "ggml_backend_buffer")
        self.addr = self.raw.ctypes.data
        self._q = self.raw.view(np.uint64)
        self._w = self.raw.view(np.int32)
        self.iface = iface
        self.buft = buft
        self.context = context
        self._q[_Q_BUF_BUFT] = buft.addr if buft is not None else 0
        if isinstance(context, np.ndarray):
            self._q[_Q_BUF_CONTEXT] = context.ctypes.data
        self.size = size
        self.usage = GGML_BACKEND_BUFFER_USAGE_ANY
        _buffers[self.addr] = self
        # a buffer dropped without ggml_backend_buffer_free still gives its struct's address range back
        weakref.finalize(self, memory.unregister, self.addr)

    # (item(): a Python int without a NumPy scalar in between -- the split reads a source's usage per weight)
    size = property(lambda s: s._q.item(_Q_BUF_SIZE), lambda s, v: s._q.__setitem__(_Q_BUF_SIZE, v))
    usage = property(lambda s: s._w.item(_W_BUF_USAGE), lambda s, v: s._w.__setitem__(_W_BUF_USAGE, v))

    def __repr__(self):
        name = backend_buft_name(self.buft) if self.buft is not None else "?"
        return (f"<ggml_backend_buffer {name} size={self.size} usage={BUFFER_USAGE_NAMES.get(self.usage)} "
                f"@0x{self.addr:x}>")


def backend_buffer_init(buft, iface: ggml_backend_buffer_i, context, size: int) -> ggml_backend_buffer:
    buffer = ggml_backend_buffer(buft, iface, context, size)
    if trace.active:
        trace.emit("backend.buffer_init", buffer=buffer.addr, buft=backend_buft_name(buft) if buft else None,
                   size=size, base=backend_buffer_get_base(buffer) or 0)
    return buffer


def backend_buffer_name(buffer) -> str:
    return backend_buft_name(backend_buffer_get_type(buffer))


def backend_buffer_free(buffer) -> None:
    if buffer is None:
        return
    if buffer.iface.free_buffer is not None:
        buffer.iface.free_buffer(buffer)
    _buffers.pop(buffer.addr, None)
    memory.unregister(buffer.addr)          # delete buffer
    if trace.active:
        trace.emit("backend.buffer_free", buffer=buffer.addr)


def backend_buffer_get_size(buffer) -> int:
    GGML_ASSERT(buffer is not None, "buffer")
    return buffer.size


def backend_buffer_get_base(buffer) -> int:
    """The base address (0 for NULL)."""
    GGML_ASSERT(buffer is not None, "buffer")
    # get_base is optional if the buffer is zero-sized
    if buffer.size == 0:
        return 0
    if buffer.iface.get_base is None:
        return 0
    base = buffer.iface.get_base(buffer)
    GGML_ASSERT(base != 0, "backend buffer base cannot be NULL")
    return base


def backend_buffer_init_tensor(buffer, tensor: Tensor) -> int:
    GGML_ASSERT(buffer is not None, "buffer")
    # init_tensor is optional
    if buffer.iface.init_tensor is not None:
        return buffer.iface.init_tensor(buffer, tensor)
    return C.GGML_STATUS_SUCCESS


def backend_buffer_clear(buffer, value: int) -> None:
    GGML_ASSERT(buffer is not None, "buffer")
    # clear is optional if the buffer is zero-sized
    if buffer.size == 0:
        return
    buffer.iface.clear(buffer, value)


def backend_buffer_get_alignment(buffer) -> int:
    return backend_buft_get_alignment(backend_buffer_get_type(buffer))


def backend_buffer_get_max_size(buffer) -> int:
    return backend_buft_get_max_size(backend_buffer_get_type(buffer))


def backend_buffer_get_alloc_size(buffer, tensor: Tensor) -> int:
    return backend_buft_get_alloc_size(backend_buffer_get_type(buffer), tensor)


def backend_buffer_is_host(buffer) -> bool:
    return backend_buft_is_host(backend_buffer_get_type(buffer))


def backend_buffer_set_usage(buffer, usage: int) -> None:
    GGML_ASSERT(buffer is not None, "buffer")
    buffer.usage = usage
    # FIXME: add a generic callback to the buffer interface
    if backend_buffer_is_multi_buffer(buffer):
        backend_multi_buffer_set_usage(buffer, usage)


def backend_buffer_get_usage(buffer) -> int:
    GGML_ASSERT(buffer is not None, "buffer")
    return buffer.usage


def backend_buffer_get_type(buffer):
    GGML_ASSERT(buffer is not None, "buffer")
    return buffer.buft


def backend_buffer_reset(buffer) -> None:
    GGML_ASSERT(buffer is not None, "buffer")
    if buffer.iface.reset is not None:
        buffer.iface.reset(buffer)


def backend_buffer_copy_tensor(src: Tensor, dst: Tensor) -> bool:
    dst_buf = buffer_at(dst.view_src.buffer if dst.view_src is not None else dst.buffer)
    if dst_buf.iface.cpy_tensor is not None:
        return dst_buf.iface.cpy_tensor(dst_buf, src, dst)
    return False


# ==================================================================================================
# tensor data access (through the tensor's buffer)
# ==================================================================================================

def _tensor_buf(tensor: Tensor):
    return buffer_at(tensor.view_src.buffer if tensor.view_src is not None else tensor.buffer)


# ggviz: offset and size are size_t in ggml, so a negative one wraps -- and ``offset + size <= ggml_nbytes(tensor)``
# then lets a negative offset through (real ggml writes the bytes before the tensor). ggviz checks both are integers
# >= 0 first, then ggml's own bounds assertion (its message, with the numbers), and that ``data`` holds ``size``
# bytes, before a byte moves.

def _range(fn: str, tensor: Tensor, offset, size):
    try:
        offset, size = operator.index(offset), operator.index(size)
    except TypeError:
        raise GGMLError(f"{fn}: offset and size must be integers, got offset={offset!r}, size={size!r}") from None
    if offset < 0 or size < 0:
        raise GGMLError(f"{fn}: negative {'offset' if offset < 0 else 'size'} (offset={offset}, size={size}) for "
                        f"tensor {tensor.name!r} ({nbytes(tensor)} bytes)")
    return offset, size


def _in_bounds(tensor: Tensor, offset: int, size: int, what: str) -> None:
    n = nbytes(tensor)
    GGML_ASSERT(offset + size <= n, f"tensor {what} out of bounds: offset {offset} + size {size} > {n} bytes of "
                                    f"{tensor.name!r}")


def _src_bytes(fn: str, data, size: int) -> np.ndarray:
    src = _as_bytes(data)
    if src.nbytes < size:
        raise GGMLError(f"{fn}: data holds {src.nbytes} bytes, size asks for {size}")
    return src


def _dst_bytes(fn: str, data, size: int) -> np.ndarray:
    # a copy (reshape of a non-contiguous array) would take the bytes and drop them: refused
    if not isinstance(data, np.ndarray) or not data.flags.c_contiguous or not data.flags.writeable:
        raise GGMLError(f"{fn}: data must be a writable C-contiguous NumPy array (or None), got {type(data).__name__}")
    if data.nbytes < size:
        raise GGMLError(f"{fn}: data holds {data.nbytes} bytes, size asks for {size}")
    return data


def backend_tensor_set(tensor: Tensor, data, offset: int, size: int) -> None:
    """Copy ``size`` bytes of ``data`` (bytes / any NumPy array, read as raw bytes) to the tensor at ``offset``."""
    GGML_ASSERT(tensor is not None, "tensor")
    offset, size = _range("ggml_backend_tensor_set", tensor, offset, size)
    buf = _tensor_buf(tensor)
    GGML_ASSERT(buf is not None, "tensor buffer not set")
    if size == 0:
        return
    GGML_ASSERT(tensor.data != 0, "tensor not allocated")
    _in_bounds(tensor, offset, size, "write")
    data = _src_bytes("ggml_backend_tensor_set", data, size)
    buf.iface.set_tensor(buf, tensor, data, offset, size)


def backend_tensor_get(tensor: Tensor, data, offset: int, size: int):
    """Copy ``size`` bytes of the tensor from ``offset`` into ``data`` (a writable NumPy array, or None for a new
    uint8 array). Returns ``data``."""
    GGML_ASSERT(tensor is not None, "tensor")
    offset, size = _range("ggml_backend_tensor_get", tensor, offset, size)
    buf = _tensor_buf(tensor)
    GGML_ASSERT(buf is not None, "tensor buffer not set")
    if data is None:
        data = np.empty(size, dtype=np.uint8)
    if size == 0:
        return data
    GGML_ASSERT(tensor.data != 0, "tensor not allocated")
    _in_bounds(tensor, offset, size, "read")
    _dst_bytes("ggml_backend_tensor_get", data, size)
    buf.iface.get_tensor(buf, tensor, data, offset, size)
    return data


def backend_tensor_memset(tensor: Tensor, value: int, offset: int, size: int) -> None:
    GGML_ASSERT(tensor is not None, "tensor")
    offset, size = _range("ggml_backend_tensor_memset", tensor, offset, size)
    buf = _tensor_buf(tensor)
    if size == 0:
        return
    GGML_ASSERT(buf is not None, "tensor buffer not set")
    GGML_ASSERT(tensor.data != 0, "tensor not allocated")
    _in_bounds(tensor, offset, size, "write")
    GGML_ASSERT(buf.iface.memset_tensor is not None, "memset not implemented by backend buffer")
    try:
        value = operator.index(value)
    except TypeError:
        value = -1
    if not 0 <= value <= 255:      # a uint8_t in ggml
        raise GGMLError(f"ggml_backend_tensor_memset: value must be a byte (0..255), got {value!r}")
    buf.iface.memset_tensor(buf, tensor, value, offset, size)


# ==================================================================================================
# utils: placing tensors
# ==================================================================================================

def backend_view_init(tensor: Tensor) -> int:
    """A view gets its source's buffer and ``data = view_src->data + view_offs``."""
    # (the checks read each field once and format their messages only when one fails: the graph allocator places
    # ~400 views per graph)
    GGML_ASSERT(tensor is not None, "tensor")
    view_src = tensor.view_src
    if tensor.buffer != 0:
        GGML_ASSERT(False, f"ggml_backend_view_init: {tensor.name!r} already has a buffer")
    if view_src is None:
        GGML_ASSERT(False, f"ggml_backend_view_init: {tensor.name!r} is not a view")
    src_buffer, src_data = view_src.buffer, view_src.data
    if src_buffer == 0:
        GGML_ASSERT(False, f"ggml_backend_view_init: the source {view_src.name!r} of {tensor.name!r} has no buffer")
    if src_data == 0:
        GGML_ASSERT(False, f"ggml_backend_view_init: the source {view_src.name!r} of {tensor.name!r} has no data")
    tensor.buffer = src_buffer
    tensor.data = src_data + tensor.view_offs
    return backend_buffer_init_tensor(buffer_at(src_buffer), tensor)


def backend_tensor_alloc(buffer, tensor: Tensor, addr: int) -> int:
    """Place ``tensor`` at ``addr`` inside ``buffer``: ``tensor->buffer = buffer; tensor->data = addr``."""
    GGML_ASSERT(tensor is not None, "tensor")
    if tensor.buffer != 0:
        GGML_ASSERT(False, f"ggml_backend_tensor_alloc: {tensor.name!r} already has a buffer")
    if tensor.data != 0:
        GGML_ASSERT(False, f"ggml_backend_tensor_alloc: {tensor.name!r} already has data")
    if tensor.view_src is not None:
        GGML_ASSERT(False, f"ggml_backend_tensor_alloc: {tensor.name!r} is a view")
    base = backend_buffer_get_base(buffer)
    GGML_ASSERT(addr >= base, "ggml_backend_tensor_alloc: address below the buffer base")
    size = backend_buffer_get_alloc_size(buffer, tensor)
    if addr + size > base + backend_buffer_get_size(buffer):
        GGML_ASSERT(False, f"ggml_backend_tensor_alloc: {tensor.name!r} ({size} bytes at offset {addr - base}) does "
                           f"not fit in the buffer ({backend_buffer_get_size(buffer)} bytes)")
    tensor.buffer = buffer.addr
    tensor.data = addr
    return backend_buffer_init_tensor(buffer, tensor)


# ==================================================================================================
# multi-buffer: a buffer that contains a collection of buffers
# ==================================================================================================

class ggml_backend_multi_buffer_context:
    __slots__ = ("buffers", "n_buffers")

    def __init__(self, buffers, n_buffers):
        self.buffers = list(buffers)
        self.n_buffers = n_buffers


def _multi_buffer_free_buffer(buffer):
    ctx = buffer.context
    for b in ctx.buffers:
        backend_buffer_free(b)
    ctx.buffers = []


def _multi_buffer_clear(buffer, value):
    for b in buffer.context.buffers:
        backend_buffer_clear(b, value)


def backend_multi_buffer_alloc_buffer(buffers, n_buffers: int):
    ctx = ggml_backend_multi_buffer_context(buffers[:n_buffers], n_buffers)
    total_size = sum(backend_buffer_get_size(b) for b in ctx.buffers)
    iface = ggml_backend_buffer_i(free_buffer=_multi_buffer_free_buffer, clear=_multi_buffer_clear)
    return backend_buffer_init(buffers[0].buft, iface, ctx, total_size)


def backend_buffer_is_multi_buffer(buffer) -> bool:
    GGML_ASSERT(buffer is not None, "buffer")
    return buffer.iface.free_buffer is _multi_buffer_free_buffer


def backend_multi_buffer_set_usage(buffer, usage: int) -> None:
    GGML_ASSERT(backend_buffer_is_multi_buffer(buffer), "not a multi-buffer")
    for b in buffer.context.buffers:
        backend_buffer_set_usage(b, usage)


# ==================================================================================================
# CPU backend - buffer
# ==================================================================================================

def _bytes_at(addr: int, size: int) -> np.ndarray:
    """The ``size`` bytes at ``addr`` as a writable uint8 view (what a C pointer would reach)."""
    arr, off, _ = memory.resolve(addr, size)
    return arr[off:off + size]


def _as_bytes(data) -> np.ndarray:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    a = np.asarray(data)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def _cpu_buffer_get_base(buffer) -> int:
    data = buffer.context.ctypes.data
    # align the buffer
    if data % TENSOR_ALIGNMENT != 0:
        data = GGML_PAD(data, TENSOR_ALIGNMENT)
    return data


def _cpu_buffer_free_buffer(buffer):
    memory.unregister(buffer.context)            # ggml_aligned_free(buffer->context, buffer->size)


def _cpu_buffer_memset_tensor(buffer, tensor, value, offset, size):
    _bytes_at(tensor.data + offset, size)[:] = value


def _cpu_buffer_set_tensor(buffer, tensor, data, offset, size):
    _bytes_at(tensor.data + offset, size)[:] = _as_bytes(data)[:size]


def _cpu_buffer_get_tensor(buffer, tensor, data, offset, size):
    out = data.reshape(-1).view(np.uint8)
    out[:size] = _bytes_at(tensor.data + offset, size)


def _cpu_buffer_cpy_tensor(buffer, src, dst) -> bool:
    if backend_buffer_is_host(buffer_at(src.buffer)):
        n = nbytes(src)
        _bytes_at(dst.data, n)[:] = _bytes_at(src.data, n)
        return True
    return False


def _cpu_buffer_clear(buffer, value):
    buffer.context[:buffer.size] = value


def _cpu_owned_buffer_clear(buffer, value):
    """ggml_backend_cpu_buffer_clear (memset) of a buffer whose memory aligned_malloc made: zeros by whole pages
    handed back to the kernel (memory.zero_owned: the same bytes as C's memset, without a write to each page --
    the fresh KV cache llama.cpp clears at every context creation). (A buffer over memory it was given -- a mapped
    model file -- is cleared by _cpu_buffer_clear.)"""
    if value == 0:
        memory.zero_owned(buffer.context[:buffer.size])
    else:
        buffer.context[:buffer.size] = value


_cpu_buffer_i = ggml_backend_buffer_i(
    free_buffer=_cpu_buffer_free_buffer,
    get_base=_cpu_buffer_get_base,
    init_tensor=None,             # no initialization required
    memset_tensor=_cpu_buffer_memset_tensor,
    set_tensor=_cpu_buffer_set_tensor,
    get_tensor=_cpu_buffer_get_tensor,
    cpy_tensor=_cpu_buffer_cpy_tensor,
    clear=_cpu_owned_buffer_clear,
    reset=None,
)

_cpu_buffer_from_ptr_i = ggml_backend_buffer_i(
    free_buffer=None,             # ptr is not owned by the buffer, so it does not need to be freed
    get_base=_cpu_buffer_get_base,
    init_tensor=None,
    memset_tensor=_cpu_buffer_memset_tensor,
    set_tensor=_cpu_buffer_set_tensor,
    get_tensor=_cpu_buffer_get_tensor,
    cpy_tensor=_cpu_buffer_cpy_tensor,
    clear=_cpu_buffer_clear,
    reset=None,
)


# CPU backend buffer type: defined here to make it available to all backends

def _cpu_buffer_type_alloc_buffer(buft, size: int):
    data = memory.aligned_malloc(size, "CPU buffer")     # ggml_aligned_malloc: 64-byte aligned
    # ordinary pages, as ggml_aligned_malloc's memory has: NumPy asks for huge pages, which made a fresh context's
    # first prompt fault 2 MiB at a time into its sparsely touched compute buffer (memory.small_pages)
    memory.small_pages(data)
    buffer = backend_buffer_init(buft, _cpu_buffer_i, data, size)
    # dropped without ggml_backend_buffer_free: release the memory's address range anyway (C would leak it)
    weakref.finalize(buffer, memory.unregister, data.ctypes.data)
    return buffer


def _cpu_buffer_type_get_alignment(buft) -> int:
    return TENSOR_ALIGNMENT


def _cpu_buffer_type_is_host(buft) -> bool:
    return True


_cpu_buffer_type = None
_cpu_buffer_from_ptr_type = None


def backend_cpu_buffer_type() -> ggml_backend_buffer_type:
    """The CPU buffer type (one static object, as in C): "CPU", alignment 32, no max size, alloc size = nbytes."""
    global _cpu_buffer_type
    if _cpu_buffer_type is None:
        _cpu_buffer_type = ggml_backend_buffer_type(ggml_backend_buffer_type_i(
            get_name=lambda buft: "CPU",
            alloc_buffer=_cpu_buffer_type_alloc_buffer,
            get_alignment=_cpu_buffer_type_get_alignment,
            get_max_size=None,        # defaults to SIZE_MAX
            get_alloc_size=None,      # defaults to ggml_nbytes
            is_host=_cpu_buffer_type_is_host,
        ), device=None, context=None)
    return _cpu_buffer_type


def _backend_cpu_buffer_from_ptr_type() -> ggml_backend_buffer_type:
    global _cpu_buffer_from_ptr_type
    if _cpu_buffer_from_ptr_type is None:
        _cpu_buffer_from_ptr_type = ggml_backend_buffer_type(ggml_backend_buffer_type_i(
            get_name=lambda buft: "CPU_Mapped",
            alloc_buffer=_cpu_buffer_type_alloc_buffer,
            get_alignment=_cpu_buffer_type_get_alignment,
            is_host=_cpu_buffer_type_is_host,
        ))
    return _cpu_buffer_from_ptr_type


def backend_cpu_buffer_from_ptr(ptr, size: int) -> ggml_backend_buffer:
    """A CPU buffer over memory the caller owns: ``ptr`` is a registered NumPy uint8 array (or an address inside
    one), ``TENSOR_ALIGNMENT``-aligned."""
    if isinstance(ptr, np.ndarray):
        arr = ptr.reshape(-1).view(np.uint8)
    else:
        arr = _bytes_at(int(ptr), size)
    GGML_ASSERT(arr.ctypes.data % TENSOR_ALIGNMENT == 0, "buffer pointer must be aligned")
    try:
        memory.resolve(arr.ctypes.data, size)
    except ValueError:
        memory.register(arr, "CPU_Mapped buffer")
    return backend_buffer_init(_backend_cpu_buffer_from_ptr_type(), _cpu_buffer_from_ptr_i, arr, size)


# ==================================================================================================
# backend (stream), device, registry: struct ggml_backend / ggml_backend_device / ggml_backend_reg / ggml_backend_event
# ==================================================================================================

GGML_BACKEND_API_VERSION = 2

# enum ggml_backend_dev_type
GGML_BACKEND_DEVICE_TYPE_CPU = 0     # CPU device using system memory
GGML_BACKEND_DEVICE_TYPE_GPU = 1     # GPU device using dedicated memory
GGML_BACKEND_DEVICE_TYPE_IGPU = 2    # integrated GPU device using host memory
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3   # accelerator devices intended to be used together with the CPU backend (BLAS, AMX)
GGML_BACKEND_DEVICE_TYPE_META = 4    # "meta" device wrapping multiple other devices for tensor parallelism
DEVICE_TYPE_NAMES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}

BACKEND_STRUCT_SIZE = 152   # guid*, iface (16 pointers), device*, context*
DEVICE_STRUCT_SIZE = 136    # iface (15 pointers), reg*, context*
REG_STRUCT_SIZE = 48        # int api_version (+pad), iface (4 pointers), context*
EVENT_STRUCT_SIZE = 16      # device*, context*


def _struct_bytes(size: int, label: str):
    raw = memory.aligned_malloc(size, label)
    return raw, raw.ctypes.data


@dataclass
class ggml_backend_i:
    get_name: Callable                                # (backend) -> str
    free: Callable                                    # (backend)
    set_tensor_async: Optional[Callable] = None       # (optional) asynchronous tensor data access
    get_tensor_async: Optional[Callable] = None
    set_tensor_2d_async: Optional[Callable] = None
    get_tensor_2d_async: Optional[Callable] = None
    cpy_tensor_async: Optional[Callable] = None       # (backend_src, backend_dst, src, dst) -> bool
    synchronize: Optional[Callable] = None            # (optional) complete all pending operations
    graph_plan_create: Optional[Callable] = None      # (optional) graph plans
    graph_plan_free: Optional[Callable] = None
    graph_plan_update: Optional[Callable] = None
    graph_plan_compute: Optional[Callable] = None
    graph_compute: Optional[Callable] = None          # (backend, cgraph) -> ggml_status
    event_record: Optional[Callable] = None           # (optional) event synchronization
    event_wait: Optional[Callable] = None
    graph_optimize: Optional[Callable] = None         # (optional) sort/optimize the nodes in the graph


class ggml_backend:
    """``struct ggml_backend { guid; iface; device; context; }``: one stream on a device."""
    __slots__ = ("guid", "iface", "device", "context", "raw", "addr", "__weakref__")

    def __init__(self, guid: bytes, iface: ggml_backend_i, device, context):
        self.guid, self.iface, self.device, self.context = guid, iface, device, context
        self.raw, self.addr = _struct_bytes(BACKEND_STRUCT_SIZE, "ggml_backend")
        self.raw.view(np.uint64)[17] = getattr(device, "addr", 0) or 0

    def __repr__(self):
        return f"<ggml_backend {backend_name(self)!r} @0x{self.addr:x}>"


@dataclass
class ggml_backend_dev_caps:
    async_: bool = False                 # asynchronous operations ("async" in C)
    host_buffer: bool = False            # pinned host buffer
    buffer_from_host_ptr: bool = False   # creating buffers from host ptr
    events: bool = False                 # event synchronization
    mmap_support: bool = False           # mmap is supported for loading


@dataclass
class ggml_backend_dev_props:
    name: str = ""
    description: str = ""
    memory_free: int = 0
    memory_total: int = 0
    type: int = GGML_BACKEND_DEVICE_TYPE_CPU
    device_id: Optional[str] = None
    caps: ggml_backend_dev_caps = None


@dataclass
class ggml_backend_device_i:
    get_name: Callable                                  # (dev) -> str
    get_description: Callable                           # (dev) -> str
    get_memory: Callable                                # (dev) -> (free, total)
    get_type: Callable                                  # (dev) -> enum ggml_backend_dev_type
    get_props: Callable                                 # (dev, props)
    init_backend: Callable                              # (dev, params) -> backend
    get_buffer_type: Callable                           # (dev) -> buft: preferred buffer type
    get_host_buffer_type: Optional[Callable] = None     # (optional) host buffer type (pinned memory)
    buffer_from_host_ptr: Optional[Callable] = None     # (optional) buffer from a host pointer
    supports_op: Callable = None                        # (dev, op) -> bool: can the device compute this op
    supports_buft: Callable = None                      # (dev, buft) -> bool: can it use a buffer of this type
    offload_op: Optional[Callable] = None               # (optional) (dev, op) -> bool: worth copying weights
    event_new: Optional[Callable] = None                # (optional) events
    event_free: Optional[Callable] = None
    event_synchronize: Optional[Callable] = None
    # ggviz (not in ggml): (dev, op) -> (supports_op's answer, the addresses of the tensors -- the op, its sources
    # -- whose shape (ne/nb) that answer read, or None: any of them, the device does not say). The scheduler asks
    # this instead of supports_op while it records a split memo; after a graph was reshaped, the memo asks the
    # device again only about answers that read a changed shape (sched._memo_holds: what an answer reads besides
    # shapes -- op codes, types, op params, buffers -- is unchanged there).
    supports_op_reads: Optional[Callable] = None


class ggml_backend_device:
    """``struct ggml_backend_device { iface; reg; context; }``."""
    __slots__ = ("iface", "reg", "context", "raw", "addr", "__weakref__")

    def __init__(self, iface: ggml_backend_device_i, reg, context):
        self.iface, self.reg, self.context = iface, reg, context
        self.raw, self.addr = _struct_bytes(DEVICE_STRUCT_SIZE, "ggml_backend_device")
        self.raw.view(np.uint64)[15] = getattr(reg, "addr", 0) or 0

    def __repr__(self):
        return f"<ggml_backend_device {backend_dev_name(self)!r} ({DEVICE_TYPE_NAMES.get(backend_dev_type(self))})>"


@dataclass
class ggml_backend_reg_i:
    get_name: Callable                                  # (reg) -> str
    get_device_count: Callable                          # (reg) -> int
    get_device: Callable                                # (reg, index) -> device
    get_proc_address: Optional[Callable] = None         # (optional) (reg, name) -> function or None


class ggml_backend_reg:
    """``struct ggml_backend_reg { api_version; iface; context; }``: a backend library and its devices."""
    __slots__ = ("api_version", "iface", "context", "raw", "addr", "__weakref__")

    def __init__(self, iface: ggml_backend_reg_i, context=None, api_version: int = GGML_BACKEND_API_VERSION):
        self.api_version, self.iface, self.context = api_version, iface, context
        self.raw, self.addr = _struct_bytes(REG_STRUCT_SIZE, "ggml_backend_reg")
        self.raw.view(np.int32)[0] = api_version

    def __repr__(self):
        return f"<ggml_backend_reg {backend_reg_name(self)!r} ({backend_reg_dev_count(self)} devices)>"


class ggml_backend_event:
    """``struct ggml_backend_event { device; context; }``."""
    __slots__ = ("device", "context", "raw", "addr")

    def __init__(self, device, context=None):
        self.device, self.context = device, context
        self.raw, self.addr = _struct_bytes(EVENT_STRUCT_SIZE, "ggml_backend_event")

    def __repr__(self):
        return f"<ggml_backend_event on {backend_dev_name(self.device)!r}>"


# ---- backend

def backend_guid(backend):
    return None if backend is None else backend.guid


def backend_name(backend) -> str:
    if backend is None:
        return "NULL"
    return backend.iface.get_name(backend)


def backend_free(backend) -> None:
    if backend is None:
        return
    backend.iface.free(backend)


def backend_get_default_buffer_type(backend):
    """ggml_backend_get_default_buffer_type: the buffer type of the backend's device."""
    GGML_ASSERT(backend is not None, "backend")
    return backend_dev_buffer_type(backend.device)


def backend_alloc_buffer(backend, size: int):
    return backend_buft_alloc_buffer(backend_get_default_buffer_type(backend), size)


def backend_get_alignment(backend) -> int:
    return backend_buft_get_alignment(backend_get_default_buffer_type(backend))


def backend_get_max_size(backend) -> int:
    return backend_buft_get_max_size(backend_get_default_buffer_type(backend))


def backend_tensor_set_async(backend, tensor: Tensor, data, offset: int, size: int) -> None:
    GGML_ASSERT(backend is not None, "backend")
    GGML_ASSERT(tensor is not None, "tensor")
    offset, size = _range("ggml_backend_tensor_set_async", tensor, offset, size)
    GGML_ASSERT(tensor.data != 0, "tensor not allocated")
    _in_bounds(tensor, offset, size, "write")
    data = _src_bytes("ggml_backend_tensor_set_async", data, size)
    if backend.iface.set_tensor_async is None:
        backend_synchronize(backend)
        backend_tensor_set(tensor, data, offset, size)
    else:
        backend.iface.set_tensor_async(backend, tensor, data, offset, size)


def backend_tensor_get_async(backend, tensor: Tensor, data, offset: int, size: int):
    GGML_ASSERT(backend is not None, "backend")
    GGML_ASSERT(tensor is not None, "tensor")
    offset, size = _range("ggml_backend_tensor_get_async", tensor, offset, size)
    GGML_ASSERT(tensor.data != 0, "tensor not allocated")
    _in_bounds(tensor, offset, size, "read")
    if backend.iface.get_tensor_async is None:
        backend_synchronize(backend)
        return backend_tensor_get(tensor, data, offset, size)
    if data is None:
        data = np.empty(size, dtype=np.uint8)
    _dst_bytes("ggml_backend_tensor_get_async", data, size)
    backend.iface.get_tensor_async(backend, tensor, data, offset, size)
    return data


def _rows_2d(fn, tensor, data_nbytes, offset, size, n_copies, stride_tensor, stride_data) -> None:
    """ggviz: every row of a 2d copy checked before the first one moves (a bad last row must not leave the first
    ones written)."""
    try:
        n_copies, stride_tensor, stride_data = (operator.index(x) for x in (n_copies, stride_tensor, stride_data))
    except TypeError:
        raise GGMLError(f"{fn}: n_copies and the strides must be integers") from None
    if n_copies < 0 or stride_tensor < 0 or stride_data < 0:
        raise GGMLError(f"{fn}: negative n_copies or stride (n_copies={n_copies}, stride_tensor={stride_tensor}, "
                        f"stride_data={stride_data})")
    offset, size = _range(fn, tensor, offset, size)
    if n_copies == 0 or size == 0:
        return
    _in_bounds(tensor, offset + (n_copies - 1) * stride_tensor, size, "write" if "set" in fn else "read")
    need = (n_copies - 1) * stride_data + size
    if data_nbytes < need:
        raise GGMLError(f"{fn}: data holds {data_nbytes} bytes, {n_copies} rows of {size} bytes {stride_data} apart "
                        f"need {need}")


def backend_tensor_set_2d(tensor: Tensor, data, offset: int, size: int, n_copies: int, stride_tensor: int,
                          stride_data: int) -> None:
    """``n_copies`` rows of ``size`` bytes: row i from ``data[i*stride_data:]`` to ``offset + i*stride_tensor``."""
    src = _as_bytes(data)
    _rows_2d("ggml_backend_tensor_set_2d", tensor, src.nbytes, offset, size, n_copies, stride_tensor, stride_data)
    for i in range(n_copies):
        backend_tensor_set(tensor, src[i * stride_data:i * stride_data + size], offset + i * stride_tensor, size)


def backend_tensor_get_2d(tensor: Tensor, data, offset: int, size: int, n_copies: int, stride_tensor: int,
                          stride_data: int):
    if data is not None:
        _dst_bytes("ggml_backend_tensor_get_2d", data, 0)
    out = data.reshape(-1).view(np.uint8) if data is not None else np.empty(max(0, (n_copies - 1) * stride_data + size), np.uint8)
    _rows_2d("ggml_backend_tensor_get_2d", tensor, out.nbytes, offset, size, n_copies, stride_tensor, stride_data)
    for i in range(n_copies):
        backend_tensor_get(tensor, out[i * stride_data:i * stride_data + size], offset + i * stride_tensor, size)
    return out


def backend_synchronize(backend) -> None:
    GGML_ASSERT(backend is not None, "backend")
    if backend.iface.synchronize is None:
        return
    backend.iface.synchronize(backend)


def backend_graph_plan_create(backend, cgraph):
    GGML_ASSERT(backend is not None, "backend")
    GGML_ASSERT(backend.iface.graph_plan_create is not None, "graph_plan_create")
    return backend.iface.graph_plan_create(backend, cgraph)


def backend_graph_plan_free(backend, plan) -> None:
    GGML_ASSERT(backend is not None, "backend")
    GGML_ASSERT(backend.iface.graph_plan_free is not None, "graph_plan_free")
    backend.iface.graph_plan_free(backend, plan)


def backend_graph_plan_compute(backend, plan) -> int:
    GGML_ASSERT(backend is not None, "backend")
    GGML_ASSERT(backend.iface.graph_plan_compute is not None, "graph_plan_compute")
    return backend.iface.graph_plan_compute(backend, plan)


def backend_graph_compute(backend, cgraph) -> int:
    err = backend_graph_compute_async(backend, cgraph)
    backend_synchronize(backend)
    return err


def backend_graph_compute_async(backend, cgraph) -> int:
    GGML_ASSERT(backend is not None, "backend")
    return backend.iface.graph_compute(backend, cgraph)


def backend_supports_op(backend, op: Tensor) -> bool:
    GGML_ASSERT(backend is not None, "backend")
    return backend_dev_supports_op(backend.device, op)


def backend_supports_buft(backend, buft) -> bool:
    GGML_ASSERT(backend is not None, "backend")
    return backend_dev_supports_buft(backend.device, buft)


def backend_offload_op(backend, op: Tensor) -> bool:
    GGML_ASSERT(backend is not None, "backend")
    return backend_dev_offload_op(backend.device, op)


def backend_get_device(backend):
    GGML_ASSERT(backend is not None, "backend")
    return backend.device


def backend_graph_optimize(backend, cgraph) -> None:
    """(static in C) let the backend reorder a split's nodes before the scheduler copies the graph."""
    GGML_ASSERT(backend is not None, "backend")
    if backend.iface.graph_optimize is not None:
        backend.iface.graph_optimize(backend, cgraph)


# ---- backend copy

def _same_layout(a: Tensor, b: Tensor) -> bool:
    # ggml_are_same_layout: same type, ne and nb
    return a.type == b.type and a.shape == b.shape and a.strides == b.strides


def backend_tensor_copy(src: Tensor, dst: Tensor) -> None:
    """ggml_backend_tensor_copy: host source -> tensor_set, host destination -> tensor_get, else the destination
    buffer's cpy_tensor, else a bounce through host memory ("slow copy")."""
    GGML_ASSERT(_same_layout(src, dst), "cannot copy tensors with different layouts")
    if src.addr == dst.addr:
        return
    n = nbytes(src)
    if trace.active:
        trace.emit("backend.tensor_copy", src=src.name, dst=dst.name, nbytes=n,
                   src_buft=backend_buffer_name(buffer_at(src.buffer)), dst_buft=backend_buffer_name(buffer_at(dst.buffer)))
    if backend_buffer_is_host(buffer_at(src.buffer)):
        backend_tensor_set(dst, _bytes_at(src.data, n), 0, n)
    elif backend_buffer_is_host(buffer_at(dst.buffer)):
        backend_tensor_get(src, _bytes_at(dst.data, n), 0, n)
    elif not backend_buffer_copy_tensor(src, dst):
        GGML_LOG("debug", f"ggml_backend_tensor_copy: warning: slow copy from {backend_buffer_name(buffer_at(src.buffer))} "
                          f"to {backend_buffer_name(buffer_at(dst.buffer))}")
        data = backend_tensor_get(src, None, 0, n)
        backend_tensor_set(dst, data, 0, n)


def backend_tensor_copy_async(backend_src, backend_dst, src: Tensor, dst: Tensor) -> None:
    GGML_ASSERT(_same_layout(src, dst), "cannot copy tensors with different layouts")
    if src.addr == dst.addr:
        return
    GGML_ASSERT(backend_dst is not None, "backend_dst")
    if backend_dst.iface.cpy_tensor_async is not None:
        if backend_dst.iface.cpy_tensor_async(backend_src, backend_dst, src, dst):
            return
    # an async copy would normally happen after all the queued operations on both backends are completed
    # to simulate the same behavior, we need to synchronize both backends first, and do a blocking copy
    backend_synchronize(backend_src)
    backend_synchronize(backend_dst)
    backend_tensor_copy(src, dst)


# ---- events

def backend_event_new(device):
    # null device is allowed for the transition period to the device interface
    if device is None or device.iface.event_new is None:
        return None
    return device.iface.event_new(device)


def backend_event_free(event) -> None:
    if event is None:
        return
    event.device.iface.event_free(event.device, event)


def backend_event_record(event, backend) -> None:
    GGML_ASSERT(backend is not None, "backend")
    GGML_ASSERT(backend.iface.event_record is not None, "event_record")
    backend.iface.event_record(backend, event)


def backend_event_synchronize(event) -> None:
    GGML_ASSERT(event is not None, "event")
    GGML_ASSERT(event.device.iface.event_synchronize is not None, "event_synchronize")
    event.device.iface.event_synchronize(event.device, event)


def backend_event_wait(backend, event) -> None:
    GGML_ASSERT(backend is not None, "backend")
    GGML_ASSERT(backend.iface.event_wait is not None, "event_wait")
    backend.iface.event_wait(backend, event)


# ---- device

def backend_dev_name(device) -> str:
    GGML_ASSERT(device is not None, "device")
    return device.iface.get_name(device)


def backend_dev_description(device) -> str:
    GGML_ASSERT(device is not None, "device")
    return device.iface.get_description(device)


def backend_dev_memory(device):
    """ggml_backend_dev_memory: returns (free, total) in bytes (C writes them through two pointers)."""
    GGML_ASSERT(device is not None, "device")
    return device.iface.get_memory(device)


def backend_dev_type(device) -> int:
    GGML_ASSERT(device is not None, "device")
    return device.iface.get_type(device)


def backend_dev_get_props(device, props: ggml_backend_dev_props | None = None) -> ggml_backend_dev_props:
    GGML_ASSERT(device is not None, "device")
    if props is None:
        props = ggml_backend_dev_props()
    # memset(props, 0, sizeof(*props))
    props.__init__()
    props.caps = ggml_backend_dev_caps()
    device.iface.get_props(device, props)
    return props


def backend_dev_backend_reg(device):
    GGML_ASSERT(device is not None, "device")
    return device.reg


def backend_dev_init(device, params: str | None = None):
    GGML_ASSERT(device is not None, "device")
    return device.iface.init_backend(device, params)


def backend_dev_buffer_type(device):
    """ggml_backend_dev_buffer_type: the device's default buffer type (``device->iface.get_buffer_type``)."""
    GGML_ASSERT(device is not None, "device")
    return device.iface.get_buffer_type(device)


def backend_dev_host_buffer_type(device):
    GGML_ASSERT(device is not None, "device")
    if device.iface.get_host_buffer_type is None:
        return None
    return device.iface.get_host_buffer_type(device)


def backend_dev_buffer_from_host_ptr(device, ptr, size: int, max_tensor_size: int):
    GGML_ASSERT(device is not None, "device")
    return device.iface.buffer_from_host_ptr(device, ptr, size, max_tensor_size)


def backend_dev_supports_op(device, op: Tensor) -> bool:
    GGML_ASSERT(device is not None, "device")
    return bool(device.iface.supports_op(device, op))


def backend_dev_supports_buft(device, buft) -> bool:
    GGML_ASSERT(device is not None, "device")
    return bool(device.iface.supports_buft(device, buft))


def backend_dev_offload_op(device, op: Tensor) -> bool:
    GGML_ASSERT(device is not None, "device")
    if device.iface.offload_op is not None:
        return bool(device.iface.offload_op(device, op))
    return False


# ---- reg

def backend_reg_name(reg) -> str:
    GGML_ASSERT(reg is not None, "reg")
    return reg.iface.get_name(reg)


def backend_reg_dev_count(reg) -> int:
    GGML_ASSERT(reg is not None, "reg")
    return reg.iface.get_device_count(reg)


def backend_reg_dev_get(reg, index: int):
    GGML_ASSERT(reg is not None, "reg")
    return reg.iface.get_device(reg, index)


def backend_reg_get_proc_address(reg, name: str):
    """The function the backend exports under ``name`` (a Python callable), or None."""
    GGML_ASSERT(reg is not None, "reg")
    if reg.iface.get_proc_address is None:
        return None
    return reg.iface.get_proc_address(reg, name)
