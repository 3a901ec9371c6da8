"""A simulated accelerator backend ("ACCEL0"): a device with its own memory, for watching the scheduler split.

Nothing like it exists in ggml; it stands in for a GPU backend (CUDA, Metal, Vulkan ...) so that a learner on a
laptop sees what ``ggml_backend_sched`` does when part of a model lives in memory the CPU cannot address:

* **own memory**: the device's buffer type ("ACCEL0", alignment 128 like CUDA's) allocates from a configurable
  ``capacity``; a buffer that does not fit fails the way ``cudaMalloc`` does -- ``alloc_buffer`` logs
  "out of memory" and returns NULL, so ``ggml_backend_alloc_ctx_tensors_from_buft`` / ``ggml_gallocr_reserve_n``
  fail. The bytes are NumPy arrays (real addresses, so the CPU kernels can run on them), but the buffer type is not
  host memory: ``is_host`` is false, data moves only through ``ggml_backend_tensor_set/get`` and the buffer's
  ``cpy_tensor`` (device to device), and the device refuses to compute a node whose operands are not in its own
  memory (a real GPU would fault): the scheduler must have copied them;
* **a configurable set of ops** (``supports_op``; default: MUL_MAT, ADD, MUL, RMS_NORM, ROPE, SOFT_MAX, GET_ROWS,
  SET_ROWS, CPY, CONT, GLU, UNARY, SCALE and the view ops), so a learner can remove one (RMS_NORM) and watch the
  graph fall into many splits;
* **supports_buft**: only its own buffer type (a host weight used by an op on the device is copied to it);
* **offload_op**: CUDA's rule (``ggml_backend_cuda_device_offload_op``): worth it when the op's batch size is
  >= 32 (``ne[1]`` for MUL_MAT, ``ne[2]`` for MUL_MAT_ID / ROPE, never for GET_ROWS, else the number of rows), so
  a large prompt's MUL_MATs with weights in host memory run on the device ("1.off") and their weights are copied;
* **compute**: the CPU backend's faithful kernels (``ggml_cpu.graph_plan`` / ``graph_compute``, without the
  CPU_REPACK fast path) on the device's memory -- results are bitwise those of the CPU's faithful path;
* events (``event_new/record/synchronize/wait``) that complete immediately (the device is synchronous);
* PowerInfer's GPU halves (``GGML_OP_MUL_MAT_SPARSE`` from ``ggml_mul_mat_idx_upscale`` and ``GGML_OP_AXPY`` on
  ``gpu_bucket``): supported, so that the hot FFN rows ``llama.powerinfer.load_gpu_split`` puts in the device's
  memory are computed there by the scheduler; the CPU halves (on ``gpu_idx``) are not -- PowerInfer's
  ``ggml_cuda_compute_forward`` leaves them to the CPU ("when src0 (weights) is not on device, we compute on CPU
  with sparsity"). ``buffer_is_accel`` / ``tensor_is_accel`` tell the hybrid executor
  (``ggml.cpu.hybrid``) which tensors live in device memory.

The device type is ``GGML_BACKEND_DEVICE_TYPE_GPU``, so llama's loader offloads ``n_gpu_layers`` to it like to a
GPU. It is not compiled into ggviz's registry: ``ggml.backend.backend_load("accel")`` (or
``backend_register(backend_accel_reg())``) makes its devices visible, and ``backend_accel_device_new(...)`` makes a
device with another capacity / op set. Data movement is counted per device (``backend_accel_stats``).
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from .. import trace
from . import backend as B
from . import consts as C
from . import memory
from .cpu import ggml_cpu
from .cpu import powerinfer as cpu_pi
from .cpu.quants import VEC_DOT_TYPE
from .impl import GGML_ASSERT, GGML_LOG, GGMLError, op_is_empty
from .tensor import GGML_OP_AXPY, GGML_OP_MUL_MAT_SPARSE, Tensor, nbytes, nrows, op_desc

GGML_ACCEL_ALIGNMENT = 128
DEFAULT_CAPACITY = 2 << 30       # 2 GiB of simulated device memory
OFFLOAD_MIN_BATCH = 32           # ggml_backend_cuda_device_offload_op: min_batch_size

DEFAULT_SUPPORTED_OPS = frozenset((
    C.GGML_OP_MUL_MAT, C.GGML_OP_ADD, C.GGML_OP_MUL, C.GGML_OP_RMS_NORM, C.GGML_OP_ROPE, C.GGML_OP_SOFT_MAX,
    C.GGML_OP_GET_ROWS, C.GGML_OP_SET_ROWS, C.GGML_OP_CPY, C.GGML_OP_CONT, C.GGML_OP_GLU, C.GGML_OP_UNARY,
    C.GGML_OP_SCALE, GGML_OP_MUL_MAT_SPARSE, GGML_OP_AXPY,
))
_NO_FROM_FLOAT = {C.GGML_TYPE_IQ3_XXS, C.GGML_TYPE_IQ3_S, C.GGML_TYPE_IQ2_XXS, C.GGML_TYPE_IQ2_XS,
                  C.GGML_TYPE_IQ2_S, C.GGML_TYPE_IQ1_S, C.GGML_TYPE_IQ1_M}


def _op_id(op) -> int:
    if isinstance(op, str):
        name = op.upper()
        name = name[len("GGML_OP_"):] if name.startswith("GGML_OP_") else name
        return getattr(C, "GGML_OP_" + name)
    return int(op)


class ggml_backend_accel_device_context:
    """The device: its memory (capacity / used), the ops it computes and counters of the bytes moved."""

    def __init__(self, name: str, index: int, capacity: int, supported_ops, offload_min_batch: int,
                 n_threads: int | None, max_size: int | None):
        self.name = name
        self.index = index
        self.description = "ggviz simulated accelerator (NumPy memory, CPU kernels)"
        self.capacity = int(capacity)
        self.used = 0
        self.supported_ops = frozenset(_op_id(o) for o in supported_ops)
        self.offload_min_batch = int(offload_min_batch)
        # the CPU backend's default; llama contexts set both alike (ggml_backend_set_n_threads). The kernels give the
        # same bits for any thread count, so this only decides how the accelerator's work is shared
        self.n_threads = n_threads if n_threads else C.GGML_DEFAULT_N_THREADS
        self.max_size = max_size
        self.lock = threading.Lock()
        self.buft = None
        self.stats = dict(h2d_bytes=0, d2h_bytes=0, d2d_bytes=0, n_h2d=0, n_d2h=0, n_d2d=0, n_alloc=0,
                          n_alloc_failed=0, peak_used=0, n_graphs=0, n_nodes=0)

    def __repr__(self):
        return (f"<accel device {self.name}: {self.used}/{self.capacity} bytes used, "
                f"{len(self.supported_ops)} ops>")


def _dev_ctx(dev) -> ggml_backend_accel_device_context:
    return dev.context


# ==================================================================================================
# buffer
# ==================================================================================================

class _accel_buffer_context:
    __slots__ = ("dev", "data", "size", "released")

    def __init__(self, dev, data, size):
        self.dev, self.data, self.size, self.released = dev, data, size, False


def _release(bctx: _accel_buffer_context) -> None:
    if bctx.released:
        return
    bctx.released = True
    dctx = _dev_ctx(bctx.dev)
    with dctx.lock:
        dctx.used -= bctx.size
    memory.unregister(bctx.data)


def _count(dctx, kind: str, n: int, tensor: Tensor) -> None:
    dctx.stats[kind + "_bytes"] += n
    dctx.stats["n_" + kind] += 1
    if trace.active:
        trace.emit("accel.transfer", device=dctx.name, direction=kind, nbytes=n, tensor=tensor.name)


def _buffer_free_buffer(buffer) -> None:
    _release(buffer.context)


def _buffer_get_base(buffer) -> int:
    return buffer.context.data.ctypes.data


def _buffer_memset_tensor(buffer, tensor, value, offset, size) -> None:
    B._bytes_at(tensor.data + offset, size)[:] = value


def _buffer_set_tensor(buffer, tensor, data, offset, size) -> None:
    # host -> device (cudaMemcpyAsync(..., cudaMemcpyHostToDevice) + synchronize in CUDA)
    B._bytes_at(tensor.data + offset, size)[:] = B._as_bytes(data)[:size]
    _count(_dev_ctx(buffer.context.dev), "h2d", size, tensor)


def _buffer_get_tensor(buffer, tensor, data, offset, size) -> None:
    # device -> host
    data.reshape(-1).view(np.uint8)[:size] = B._bytes_at(tensor.data + offset, size)
    _count(_dev_ctx(buffer.context.dev), "d2h", size, tensor)


def _buffer_cpy_tensor(buffer, src, dst) -> bool:
    src_buf = B.buffer_at(src.view_src.buffer if src.view_src is not None else src.buffer)
    if src_buf is not None and buft_is_accel(src_buf.buft):
        # device -> device (peer copy when the devices differ)
        n = nbytes(src)
        B._bytes_at(dst.data, n)[:] = B._bytes_at(src.data, n)
        _count(_dev_ctx(buffer.context.dev), "d2d", n, dst)
        return True
    return False


def _buffer_clear(buffer, value) -> None:
    buffer.context.data[:buffer.size] = value


_accel_buffer_i = B.ggml_backend_buffer_i(
    free_buffer=_buffer_free_buffer,
    get_base=_buffer_get_base,
    init_tensor=None,
    memset_tensor=_buffer_memset_tensor,
    set_tensor=_buffer_set_tensor,
    get_tensor=_buffer_get_tensor,
    cpy_tensor=_buffer_cpy_tensor,
    clear=_buffer_clear,
    reset=None,
)


# ==================================================================================================
# buffer type
# ==================================================================================================

def _buft_get_name(buft) -> str:
    return _dev_ctx(buft.device).name


def _buft_alloc_buffer(buft, size: int):
    dev = buft.device
    dctx = _dev_ctx(dev)
    with dctx.lock:
        free = dctx.capacity - dctx.used
        if size > free:
            dctx.stats["n_alloc_failed"] += 1
            ok = False
        else:
            dctx.used += size
            dctx.stats["n_alloc"] += 1
            dctx.stats["peak_used"] = max(dctx.stats["peak_used"], dctx.used)
            ok = True
    if not ok:
        GGML_LOG("error", f"ggml_backend_accel_buffer_type_alloc_buffer: allocating {size} bytes "
                 f"({size / 1048576:.2f} MiB) on device {dctx.name}: out of memory ({free} bytes free of "
                 f"{dctx.capacity} = {dctx.capacity / 1048576:.2f} MiB)")
        if trace.active:
            trace.emit("accel.oom", device=dctx.name, size=size, free=free, capacity=dctx.capacity)
        return None
    data = memory.aligned_malloc(size, f"{dctx.name} buffer", alignment=GGML_ACCEL_ALIGNMENT)
    bctx = _accel_buffer_context(dev, data, size)
    buffer = B.backend_buffer_init(buft, _accel_buffer_i, bctx, size)
    # dropped without ggml_backend_buffer_free: give the device memory back anyway
    weakref.finalize(buffer, _release, bctx)
    return buffer


def _buft_get_alignment(buft) -> int:
    return GGML_ACCEL_ALIGNMENT


def _buft_get_max_size(buft) -> int:
    m = _dev_ctx(buft.device).max_size
    return B.SIZE_MAX if m is None else m


def _buft_is_host(buft) -> bool:
    return False


def buft_is_accel(buft) -> bool:
    return buft is not None and buft.iface.alloc_buffer is _buft_alloc_buffer


def tensor_is_accel(t: Tensor) -> bool:
    """Does ``t`` (or the tensor it views) live in an ACCEL device's memory? (CUDA: ``t->backend == GPU``.)"""
    buf = _operand_buffer(t)
    return buf is not None and buft_is_accel(buf.buft)


def tensor_device(t: Tensor):
    """The ACCEL device whose memory holds ``t``, or None."""
    buf = _operand_buffer(t)
    return buf.context.dev if buf is not None and buft_is_accel(buf.buft) else None


# ==================================================================================================
# backend (stream)
# ==================================================================================================

_GUID = bytes([0x67, 0x67, 0x76, 0x69, 0x7a, 0x2d, 0x61, 0x63, 0x63, 0x65, 0x6c, 0x00, 0x00, 0x00, 0x00, 0x01])


class ggml_backend_accel_context:
    def __init__(self, device):
        self.device = device
        self.name = _dev_ctx(device).name
        self.work_data: np.ndarray | None = None
        self.work_size = 0

    def __repr__(self):
        return f"<ggml_backend_accel_context {self.name}>"


def _backend_get_name(backend) -> str:
    return backend.context.name


def _backend_free(backend) -> None:
    backend.context.work_data = None


def _backend_synchronize(backend) -> None:
    pass        # every operation completes before returning


def _operand_buffer(t: Tensor):
    return B.buffer_at(t.view_src.buffer if t.view_src is not None else t.buffer)


def _check_on_device(dev, cgraph) -> None:
    """A device computes only on its own memory: every operand of a computed node must be in its buffers."""
    buft = _dev_ctx(dev).buft
    for node in cgraph.nodes:
        if op_is_empty(node.op) or not (node.flags & C.GGML_TENSOR_FLAG_COMPUTE):
            continue
        for t in [node] + [s for s in node.src if s is not None]:
            buf = _operand_buffer(t)
            if buf is None or buf.buft is not buft:
                where = "no buffer" if buf is None else f"a {B.backend_buft_name(buf.buft)} buffer"
                raise GGMLError(f"{_dev_ctx(dev).name}: node {node.name!r} ({op_desc(node)}) reads {t.name!r}, "
                                f"which is in {where}: the device can only address its own memory (a graph "
                                f"computed on it must come from ggml_backend_sched, which copies the inputs)")


def _backend_graph_compute(backend, cgraph) -> int:
    ctx = backend.context
    dev = ctx.device
    dctx = _dev_ctx(dev)
    _check_on_device(dev, cgraph)
    cplan = ggml_cpu.graph_plan(cgraph, dctx.n_threads, None)
    cplan.extra = None          # the device runs the faithful kernels, node by node
    if ctx.work_size < cplan.work_size:
        ctx.work_data = np.zeros(cplan.work_size, dtype=np.uint8)
        ctx.work_size = cplan.work_size
    cplan.work_data = ctx.work_data
    dctx.stats["n_graphs"] += 1
    dctx.stats["n_nodes"] += cgraph.n_nodes
    return ggml_cpu.graph_compute(cgraph, cplan)


def _backend_event_record(backend, event) -> None:
    event.context["recorded"] = True


def _backend_event_wait(backend, event) -> None:
    pass        # the event's work is already complete


_accel_backend_i = B.ggml_backend_i(
    get_name=_backend_get_name,
    free=_backend_free,
    set_tensor_async=None,
    get_tensor_async=None,
    cpy_tensor_async=None,
    synchronize=_backend_synchronize,
    graph_plan_create=None,
    graph_plan_free=None,
    graph_plan_update=None,
    graph_plan_compute=None,
    graph_compute=_backend_graph_compute,
    event_record=_backend_event_record,
    event_wait=_backend_event_wait,
    graph_optimize=None,
)


def backend_accel_init(device=None):
    """A backend (stream) on ``device`` (default: the ACCEL reg's first device)."""
    if device is None:
        device = B.backend_reg_dev_get(backend_accel_reg(), 0)
    return B.ggml_backend(_GUID, _accel_backend_i, device, ggml_backend_accel_context(device))


def backend_is_accel(backend) -> bool:
    return backend is not None and backend.guid == _GUID


# ==================================================================================================
# device
# ==================================================================================================

def _dev_get_name(dev) -> str:
    return _dev_ctx(dev).name


def _dev_get_description(dev) -> str:
    return _dev_ctx(dev).description


def _dev_get_memory(dev):
    d = _dev_ctx(dev)
    return d.capacity - d.used, d.capacity


def _dev_get_type(dev) -> int:
    return B.GGML_BACKEND_DEVICE_TYPE_GPU


def _dev_get_props(dev, props) -> None:
    props.name = _dev_get_name(dev)
    props.description = _dev_get_description(dev)
    props.type = _dev_get_type(dev)
    props.device_id = None
    props.memory_free, props.memory_total = _dev_get_memory(dev)
    props.caps = B.ggml_backend_dev_caps(async_=False, host_buffer=False, buffer_from_host_ptr=False, events=True,
                                         mmap_support=False)


def _dev_init_backend(dev, params):
    return backend_accel_init(dev)


def _dev_get_buffer_type(dev):
    return _dev_ctx(dev).buft


def _dev_supports_op(dev, op: Tensor) -> bool:
    o = op.op
    if op_is_empty(o):
        return True
    if o not in _dev_ctx(dev).supported_ops:
        return False
    # what the CPU kernels it runs can do
    if o == C.GGML_OP_MUL_MAT:
        return op.src[1].type == C.GGML_TYPE_F32 or op.src[1].type == VEC_DOT_TYPE.get(op.src[0].type)
    if o in (C.GGML_OP_CPY, C.GGML_OP_SET_ROWS):
        return op.type not in _NO_FROM_FLOAT
    if o in (GGML_OP_MUL_MAT_SPARSE, GGML_OP_AXPY):
        # PowerInfer: only the GPU half (its weight holds the hot rows, src[3] is gpu_bucket) runs on the device
        return cpu_pi.is_upscale(op)
    return True


def _dev_supports_buft(dev, buft) -> bool:
    return buft is not None and buft is _dev_ctx(dev).buft


def get_op_batch_size(op: Tensor) -> int:
    """CUDA's get_op_batch_size."""
    if op.op == C.GGML_OP_GET_ROWS:
        return 0
    if op.op == C.GGML_OP_MUL_MAT:
        return int(op.ne[1])
    if op.op in (C.GGML_OP_MUL_MAT_ID, C.GGML_OP_ROPE, C.GGML_OP_ROPE_BACK):
        return int(op.ne[2])
    return nrows(op)


def _dev_offload_op(dev, op: Tensor) -> bool:
    return get_op_batch_size(op) >= _dev_ctx(dev).offload_min_batch


def _dev_event_new(dev):
    return B.ggml_backend_event(dev, {"recorded": False})


def _dev_event_free(dev, event) -> None:
    event.context = None


def _dev_event_synchronize(dev, event) -> None:
    pass


_accel_device_i = B.ggml_backend_device_i(
    get_name=_dev_get_name,
    get_description=_dev_get_description,
    get_memory=_dev_get_memory,
    get_type=_dev_get_type,
    get_props=_dev_get_props,
    init_backend=_dev_init_backend,
    get_buffer_type=_dev_get_buffer_type,
    get_host_buffer_type=None,
    buffer_from_host_ptr=None,
    supports_op=_dev_supports_op,
    supports_buft=_dev_supports_buft,
    offload_op=_dev_offload_op,
    event_new=_dev_event_new,
    event_free=_dev_event_free,
    event_synchronize=_dev_event_synchronize,
)


# ==================================================================================================
# reg
# ==================================================================================================

_reg = None
_devices: list = []


def _reg_get_name(reg) -> str:
    return "ACCEL"


def _reg_get_device_count(reg) -> int:
    return len(_devices)


def _reg_get_device(reg, index: int):
    GGML_ASSERT(0 <= index < len(_devices), "index < device count")
    return _devices[index]


def backend_accel_set_n_threads_backend(backend, n_threads: int) -> None:
    """ggml_backend_set_n_threads_t for the accelerator (ggviz: it runs the CPU kernels, whose thread
    count matters for bitwise equality with the CPU backend)."""
    GGML_ASSERT(backend_is_accel(backend), "ggml_backend_is_accel(backend)")
    _dev_ctx(backend.device).n_threads = int(n_threads)


def _reg_get_proc_address(reg, name: str):
    if name == "ggml_backend_set_n_threads":
        return backend_accel_set_n_threads_backend
    return None


def backend_accel_reg():
    """The ACCEL backend's registration entry; it starts with one device, "ACCEL0", of DEFAULT_CAPACITY bytes."""
    global _reg
    if _reg is None:
        _reg = B.ggml_backend_reg(B.ggml_backend_reg_i(
            get_name=_reg_get_name,
            get_device_count=_reg_get_device_count,
            get_device=_reg_get_device,
            get_proc_address=_reg_get_proc_address,
        ))
        _new_device("ACCEL0", DEFAULT_CAPACITY, None, OFFLOAD_MIN_BATCH, None, None)
    return _reg


def backend_accel_device_new(name: str | None = None, capacity: int = DEFAULT_CAPACITY, supported_ops=None,
                             offload_min_batch: int = OFFLOAD_MIN_BATCH, n_threads: int | None = None,
                             max_size: int | None = None):
    """A new simulated device of the ACCEL reg (not yet in the global registry; pass it to llama's model params
    ``devices`` or register it with ``backend_device_register``).

    ``capacity``: bytes of device memory; ``supported_ops``: the ops it computes (GGML_OP_* ids or names, e.g.
    ``DEFAULT_SUPPORTED_OPS - {GGML_OP_RMS_NORM}``); view ops are always supported; ``offload_min_batch``: the
    batch size from which ``offload_op`` says yes; ``max_size``: the buffer type's maximum buffer size."""
    backend_accel_reg()
    return _new_device(name, capacity, supported_ops, offload_min_batch, n_threads, max_size)


def _new_device(name, capacity, supported_ops, offload_min_batch, n_threads, max_size):
    reg = _reg
    index = len(_devices)
    ctx = ggml_backend_accel_device_context(name or f"ACCEL{index}", index, capacity,
                                            DEFAULT_SUPPORTED_OPS if supported_ops is None else supported_ops,
                                            offload_min_batch, n_threads, max_size)
    dev = B.ggml_backend_device(_accel_device_i, reg, ctx)
    ctx.buft = B.ggml_backend_buffer_type(B.ggml_backend_buffer_type_i(
        get_name=_buft_get_name,
        alloc_buffer=_buft_alloc_buffer,
        get_alignment=_buft_get_alignment,
        get_max_size=_buft_get_max_size,
        get_alloc_size=None,          # defaults to ggml_nbytes
        is_host=_buft_is_host,
    ), device=dev, context=None)
    _devices.append(dev)
    return dev


def backend_accel_set_capacity(dev, capacity: int) -> None:
    _dev_ctx(dev).capacity = int(capacity)


def backend_accel_set_supported_ops(dev, ops) -> None:
    _dev_ctx(dev).supported_ops = frozenset(_op_id(o) for o in ops)


def backend_accel_set_n_threads(dev, n_threads: int) -> None:
    _dev_ctx(dev).n_threads = int(n_threads)


def backend_accel_stats(dev) -> dict:
    """Bytes and transfers host->device, device->host, device->device; allocations; memory in use."""
    d = _dev_ctx(dev)
    return dict(d.stats, used=d.used, capacity=d.capacity)


def backend_accel_reset_stats(dev) -> None:
    for k in _dev_ctx(dev).stats:
        if k != "peak_used":
            _dev_ctx(dev).stats[k] = 0
