"""ggml-backend: buffer types and buffers (the part of ggml-backend that ggml-alloc needs).

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
  and ``ggml_backend_cpu_buffer_from_ptr``;
* the multi-buffer (``ggml_backend_multi_buffer_alloc_buffer``) that ``ggml_backend_alloc_ctx_tensors`` returns when
  a context's tensors need several buffers.

Function names are ggml-backend.h's without the ``ggml_`` prefix (``ggml_backend_buft_alloc_buffer`` is
``backend_buft_alloc_buffer``). Backends, devices and the scheduler will join this module later.

Addresses are real. A buffer's memory comes from ``memory.aligned_malloc`` (so ``ggml.get_data`` works on its
tensors), and each buffer / buffer type also owns the bytes of its C struct (``struct ggml_backend_buffer`` is 120
bytes on LP64, ``struct ggml_backend_buffer_type`` 64), so ``tensor->buffer`` holds a genuine pointer that
``buffer_at`` turns back into the Python object. The ``iface`` function pointers are Python callables, not bytes:
those struct slots stay zero.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .. import trace
from . import consts as C
from . import memory
from .context import GGMLError
from .tensor import GGML_PAD, Tensor, nbytes

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


def GGML_ASSERT(cond, msg: str = ""):
    if not cond:
        raise GGMLError(msg or "GGML_ASSERT failed")


# address -> buffer object (weak: a buffer nobody holds is released like a freed one)
_buffers: "weakref.WeakValueDictionary[int, ggml_backend_buffer]" = weakref.WeakValueDictionary()


def buffer_at(addr: int):
    """The ``ggml_backend_buffer`` whose struct starts at ``addr`` (None for NULL), e.g. ``buffer_at(t.buffer)``."""
    if not addr:
        return None
    b = _buffers.get(int(addr))
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

    size = property(lambda s: int(s._q[_Q_BUF_SIZE]), lambda s, v: s._q.__setitem__(_Q_BUF_SIZE, v))
    usage = property(lambda s: int(s._w[_W_BUF_USAGE]), lambda s, v: s._w.__setitem__(_W_BUF_USAGE, v))

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


def backend_tensor_set(tensor: Tensor, data, offset: int, size: int) -> None:
    """Copy ``size`` bytes of ``data`` (bytes / any NumPy array, read as raw bytes) to the tensor at ``offset``."""
    GGML_ASSERT(tensor is not None, "tensor")
    buf = _tensor_buf(tensor)
    GGML_ASSERT(buf is not None, "tensor buffer not set")
    if size == 0:
        return
    GGML_ASSERT(tensor.data != 0, "tensor not allocated")
    GGML_ASSERT(offset + size <= nbytes(tensor), "tensor write out of bounds")
    buf.iface.set_tensor(buf, tensor, data, offset, size)


def backend_tensor_get(tensor: Tensor, data, offset: int, size: int):
    """Copy ``size`` bytes of the tensor from ``offset`` into ``data`` (a writable NumPy array, or None for a new
    uint8 array). Returns ``data``."""
    GGML_ASSERT(tensor is not None, "tensor")
    buf = _tensor_buf(tensor)
    GGML_ASSERT(buf is not None, "tensor buffer not set")
    if data is None:
        data = np.empty(size, dtype=np.uint8)
    if size == 0:
        return data
    GGML_ASSERT(tensor.data != 0, "tensor not allocated")
    GGML_ASSERT(offset + size <= nbytes(tensor), "tensor read out of bounds")
    buf.iface.get_tensor(buf, tensor, data, offset, size)
    return data


def backend_tensor_memset(tensor: Tensor, value: int, offset: int, size: int) -> None:
    GGML_ASSERT(tensor is not None, "tensor")
    buf = _tensor_buf(tensor)
    if size == 0:
        return
    GGML_ASSERT(buf is not None, "tensor buffer not set")
    GGML_ASSERT(tensor.data != 0, "tensor not allocated")
    GGML_ASSERT(offset + size <= nbytes(tensor), "tensor write out of bounds")
    GGML_ASSERT(buf.iface.memset_tensor is not None, "memset not implemented by backend buffer")
    buf.iface.memset_tensor(buf, tensor, value, offset, size)


# ==================================================================================================
# utils: placing tensors
# ==================================================================================================

def backend_view_init(tensor: Tensor) -> int:
    """A view gets its source's buffer and ``data = view_src->data + view_offs``."""
    GGML_ASSERT(tensor is not None, "tensor")
    GGML_ASSERT(tensor.buffer == 0, f"ggml_backend_view_init: {tensor.name!r} already has a buffer")
    GGML_ASSERT(tensor.view_src is not None, f"ggml_backend_view_init: {tensor.name!r} is not a view")
    GGML_ASSERT(tensor.view_src.buffer != 0,
                f"ggml_backend_view_init: the source {tensor.view_src.name!r} of {tensor.name!r} has no buffer")
    GGML_ASSERT(tensor.view_src.data != 0,
                f"ggml_backend_view_init: the source {tensor.view_src.name!r} of {tensor.name!r} has no data")
    tensor.buffer = tensor.view_src.buffer
    tensor.data = tensor.view_src.data + tensor.view_offs
    return backend_buffer_init_tensor(buffer_at(tensor.buffer), tensor)


def backend_tensor_alloc(buffer, tensor: Tensor, addr: int) -> int:
    """Place ``tensor`` at ``addr`` inside ``buffer``: ``tensor->buffer = buffer; tensor->data = addr``."""
    GGML_ASSERT(tensor is not None, "tensor")
    GGML_ASSERT(tensor.buffer == 0, f"ggml_backend_tensor_alloc: {tensor.name!r} already has a buffer")
    GGML_ASSERT(tensor.data == 0, f"ggml_backend_tensor_alloc: {tensor.name!r} already has data")
    GGML_ASSERT(tensor.view_src is None, f"ggml_backend_tensor_alloc: {tensor.name!r} is a view")
    base = backend_buffer_get_base(buffer)
    GGML_ASSERT(addr >= base, "ggml_backend_tensor_alloc: address below the buffer base")
    GGML_ASSERT(addr + backend_buffer_get_alloc_size(buffer, tensor) <= base + backend_buffer_get_size(buffer),
                f"ggml_backend_tensor_alloc: {tensor.name!r} ({backend_buffer_get_alloc_size(buffer, tensor)} bytes "
                f"at offset {addr - base}) does not fit in the buffer ({backend_buffer_get_size(buffer)} bytes)")
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
# backend / device: only what ggml_backend_alloc_ctx_tensors needs (the backend layer proper comes later)
# ==================================================================================================

def backend_dev_buffer_type(device):
    """ggml_backend_dev_buffer_type: the device's default buffer type (``device->iface.get_buffer_type``)."""
    GGML_ASSERT(device is not None, "device")
    return device.iface.get_buffer_type(device)


def backend_get_default_buffer_type(backend):
    """ggml_backend_get_default_buffer_type: the buffer type of the backend's device."""
    GGML_ASSERT(backend is not None, "backend")
    return backend_dev_buffer_type(backend.device)


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


_cpu_buffer_i = ggml_backend_buffer_i(
    free_buffer=_cpu_buffer_free_buffer,
    get_base=_cpu_buffer_get_base,
    init_tensor=None,             # no initialization required
    memset_tensor=_cpu_buffer_memset_tensor,
    set_tensor=_cpu_buffer_set_tensor,
    get_tensor=_cpu_buffer_get_tensor,
    cpy_tensor=_cpu_buffer_cpy_tensor,
    clear=_cpu_buffer_clear,
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
