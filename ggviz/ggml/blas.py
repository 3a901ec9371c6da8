"""The BLAS backend: MUL_MAT and OUT_PROD through NumPy's BLAS (ggml-blas/ggml-blas.cpp, 0.20.2).

What it is in ggml: an ``ACCEL``-type device that works *with* the CPU backend. It has no memory of its own: its
buffer type is the CPU buffer type and it accepts any host buffer type (``supports_buft`` = ``is_host``), so a
tensor the CPU can read, BLAS can read. It computes only

* ``MUL_MAT`` with an F32 ``src1``, both sources contiguous, and ``ne0``, ``ne1``, ``ne10`` all >= 32 ("BLAS
  usually is only faster for large matrices": a one-token decode never qualifies, a 32-token prompt does). A
  quantized / F16 ``src0`` is first converted to F32 with the type's ``to_float`` into the backend's work buffer,
  then ``cblas_sgemm(RowMajor, NoTrans, Trans, ne1, ne01, ne10, 1, y, ne10, x, ne00, 0, d, ne01)`` runs per
  (i12, i13) plane, broadcasting src0 over dims 2 and 3;
* ``OUT_PROD`` of F32 matrices (``sgemm`` with src1 transposed, or not when it already is);
* and passes over the view ops.

Because the scheduler lists backends in priority order (accelerators, BLAS, CPU) and BLAS shares the CPU's buffer
type, pass 3 of ``ggml_backend_sched_split_graph`` can "upgrade" a MUL_MAT assigned to the CPU to BLAS ("3.upg"),
and pass 1 sends a MUL_MAT whose weight sits in a host WEIGHTS buffer to BLAS directly ("1.wgt0").

ggviz's sgemm is ``np.matmul`` on float32 arrays (NumPy's BLAS, OpenBLAS here). Results differ from the CPU
backend's MUL_MAT by the order of the float additions (for F32 weights), and for quantized weights also because the
CPU quantizes src1 to the vec-dot type while BLAS multiplies the dequantized weights with the F32 activations.
"""
from __future__ import annotations

import numpy as np

from .. import trace
from . import backend as B
from . import consts as C
from . import memory
from .impl import GGML_ASSERT, GGMLError, op_is_empty
from .quants import _check_type, dequantize_row
from .tensor import Tensor, is_contiguous, is_matrix, is_transposed, op_desc, row_size, type_size

GGML_HINT_NONE = 0
GGML_HINT_SRC0_IS_HADAMARD = 1

_GUID = bytes([0x12, 0xa8, 0xae, 0xf4, 0xc0, 0x1e, 0x61, 0x97, 0x8f, 0xeb, 0x33, 0x04, 0xa1, 0x33, 0x51, 0x2d])


class ggml_backend_blas_context:
    """``struct ggml_backend_blas_context { n_threads; work_data; work_size; }``."""

    def __init__(self):
        self.n_threads = C.GGML_DEFAULT_N_THREADS
        self.work_data: np.ndarray | None = None    # float32 planes of src0 converted to F32
        self.work_size = 0

    def __repr__(self):
        return f"<ggml_backend_blas_context n_threads={self.n_threads} work_size={self.work_size}>"


def _f32_at(addr: int, shape, strides_bytes) -> np.ndarray:
    """A float32 ndarray over the bytes at ``addr`` (a strided view: what a ``float *`` with nb[] reaches)."""
    span = sum((n - 1) * s for n, s in zip(shape, strides_bytes)) + 4 if all(shape) else 0
    arr, off, _ = memory.resolve(addr, span)
    return np.ndarray(shape, dtype=np.float32, buffer=arr, offset=off, strides=strides_bytes)


def _to_float(type_: int, addr: int, ne00: int, ne01: int, nb01: int) -> np.ndarray:
    """type_traits->to_float over ne01 rows of src0: float32 (ne01, ne00)."""
    rs = row_size(type_, ne00)
    span = (ne01 - 1) * nb01 + rs
    arr, off, _ = memory.resolve(addr, span)
    rows = np.ndarray((ne01, rs), dtype=np.uint8, buffer=arr, offset=off, strides=(nb01, 1))
    return dequantize_row(type_, np.ascontiguousarray(rows)).reshape(ne01, ne00)


_set_num_threads = None


def _openblas_set_num_threads(n: int) -> None:
    """openblas_set_num_threads(ctx->n_threads), on the OpenBLAS NumPy links (scipy-openblas names it
    ``scipy_openblas_set_num_threads64_``); a no-op when NumPy's BLAS is something else."""
    global _set_num_threads
    if _set_num_threads is None:
        _set_num_threads = False
        try:
            import ctypes
            import glob
            import os
            libs = []
            for d in (os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs"),
                      os.path.join(os.path.dirname(np.__file__), ".dylibs")):
                libs += glob.glob(os.path.join(d, "*openblas*"))
            for path in libs:
                lib = ctypes.CDLL(path)
                for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                            "openblas_set_num_threads64_", "openblas_set_num_threads"):
                    fn = getattr(lib, sym, None)
                    if fn is not None:
                        fn.argtypes = [ctypes.c_int]
                        fn.restype = None
                        _set_num_threads = fn
                        break
                if _set_num_threads:
                    break
        except OSError:
            _set_num_threads = False
    if _set_num_threads:
        _set_num_threads(int(n))


def _mul_mat(ctx: ggml_backend_blas_context, dst: Tensor) -> None:
    """ggml_backend_blas_mul_mat."""
    src0, src1 = dst.src[0], dst.src[1]
    ne00, ne01, ne02, ne03 = src0.shape
    nb00, nb01, nb02, nb03 = src0.strides
    ne10, ne11, ne12, ne13 = src1.shape
    nb10, nb11, nb12, nb13 = src1.strides
    ne0, ne1, ne2, ne3 = dst.shape
    nb0, nb1, nb2, nb3 = dst.strides
    type_ = src0.type

    GGML_ASSERT(ne0 == ne01, "ne0 == ne01")
    GGML_ASSERT(ne1 == ne11, "ne1 == ne11")
    GGML_ASSERT(ne2 == ne12, "ne2 == ne12")
    GGML_ASSERT(ne3 == ne13, "ne3 == ne13")
    # we don't support permuted src0 or src1
    GGML_ASSERT(nb00 == type_size(type_), "nb00 == ggml_type_size(type)")
    GGML_ASSERT(nb10 == type_size(src1.type), "nb10 == ggml_type_size(src1->type)")
    # dst cannot be transposed or permuted
    GGML_ASSERT(nb0 == 4, "nb0 == sizeof(float)")
    GGML_ASSERT(nb0 <= nb1 <= nb2 <= nb3, "nb0 <= nb1 <= nb2 <= nb3")

    # broadcast factors
    r2 = ne12 // ne02
    r3 = ne13 // ne03
    ne_plane = ne01 * ne00
    desired_wsize = 0 if type_ == C.GGML_TYPE_F32 else ne03 * ne02 * ne_plane * 4
    if ctx.work_size < desired_wsize:
        ctx.work_data = np.empty(desired_wsize // 4, dtype=np.float32)
        ctx.work_size = desired_wsize
    wdata = ctx.work_data

    # convert src0 to float
    if type_ != C.GGML_TYPE_F32:
        for i03 in range(ne03):
            for i02 in range(ne02):
                k = i02 * ne_plane + i03 * ne02 * ne_plane
                wdata[k:k + ne_plane].reshape(ne01, ne00)[...] = _to_float(
                    type_, src0.data + i02 * nb02 + i03 * nb03, ne00, ne01, nb01)

    _openblas_set_num_threads(ctx.n_threads)

    for i13 in range(ne13):
        for i12 in range(ne12):
            i03 = i13 // r3
            i02 = i12 // r2
            if type_ != C.GGML_TYPE_F32:
                k = i02 * ne_plane + i03 * ne02 * ne_plane
                x = wdata[k:k + ne_plane].reshape(ne01, ne00)
            else:
                x = _f32_at(src0.data + i02 * nb02 + i03 * nb03, (ne01, ne00), (nb01, 4))
            y = _f32_at(src1.data + i12 * nb12 + i13 * nb13, (ne11, ne10), (nb11, 4))
            d = _f32_at(dst.data + i12 * nb2 + i13 * nb3, (ne1, ne0), (nb1, 4))
            # cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ne1, ne01, ne10, 1.0f, y, ne10, x, ne00, 0.0f, d, ne01)
            np.matmul(y, x.T, out=d)


def _out_prod(ctx: ggml_backend_blas_context, dst: Tensor) -> None:
    """ggml_backend_blas_out_prod: dst (m, n) = src1^T (m, k) x src0 (k, n), as (major, minor)."""
    src0, src1 = dst.src[0], dst.src[1]
    ne00, ne01, ne02, ne03 = src0.shape
    ne10, ne11, ne12, ne13 = src1.shape
    ne0, ne1, ne2, ne3 = dst.shape
    GGML_ASSERT(ne0 == ne00, "ne0 == ne00")
    GGML_ASSERT(ne1 == ne10, "ne1 == ne10")
    GGML_ASSERT(ne2 == ne02, "ne2 == ne02")
    GGML_ASSERT(ne02 == ne12, "ne02 == ne12")
    GGML_ASSERT(ne3 == ne13, "ne3 == ne13")
    GGML_ASSERT(ne03 == ne13, "ne03 == ne13")
    # we don't support permuted src0 or src1
    GGML_ASSERT(src0.nb[0] == 4, "nb00 == sizeof(float)")
    # dst cannot be transposed or permuted
    GGML_ASSERT(dst.nb[0] == 4, "nb0 == sizeof(float)")
    n = ne00
    k = ne01
    m = ne10
    b = _f32_at(src0.data, (k, n), (n * 4, 4))
    c = _f32_at(dst.data, (m, n), (n * 4, 4))
    if not is_transposed(src1):
        a = _f32_at(src1.data, (k, m), (m * 4, 4)).T         # transposeA = CblasTrans, lda = m
    else:
        a = _f32_at(src1.data, (m, k), (k * 4, 4))           # transposeA = CblasNoTrans, lda = k
    np.matmul(a, b, out=c)


# ---- backend interface

def _get_name(backend) -> str:
    return "BLAS"


def _free(backend) -> None:
    backend.context.work_data = None
    backend.context.work_size = 0


def _graph_compute(backend, cgraph) -> int:
    ctx = backend.context
    for i in range(cgraph.n_nodes):
        node = cgraph.nodes[i]
        if not (node.flags & C.GGML_TENSOR_FLAG_COMPUTE):
            continue
        op = node.op
        if op == C.GGML_OP_MUL_MAT:
            _mul_mat(ctx, node)
        elif op == C.GGML_OP_OUT_PROD:
            _out_prod(ctx, node)
        elif op_is_empty(op):
            continue
        else:
            raise GGMLError(f"ggml_backend_blas_graph_compute: unsupported op {op_desc(node)}")
        if trace.active:
            trace.emit("blas.node", node_n=i, name=node.name, op=op_desc(node))
    return C.GGML_STATUS_SUCCESS


_blas_backend_i = B.ggml_backend_i(
    get_name=_get_name,
    free=_free,
    set_tensor_async=None,
    get_tensor_async=None,
    cpy_tensor_async=None,
    synchronize=None,
    graph_plan_create=None,
    graph_plan_free=None,
    graph_plan_update=None,
    graph_plan_compute=None,
    graph_compute=_graph_compute,
    event_record=None,
    event_wait=None,
    graph_optimize=None,
)


def backend_blas_init():
    """ggml_backend_blas_init."""
    return B.ggml_backend(_GUID, _blas_backend_i, B.backend_reg_dev_get(backend_blas_reg(), 0),
                          ggml_backend_blas_context())


def backend_is_blas(backend) -> bool:
    return backend is not None and backend.guid == _GUID


def backend_blas_set_n_threads(backend_blas, n_threads: int) -> None:
    """Stored like ggml's (which hands it to openblas_set_num_threads); NumPy's BLAS keeps its own thread count."""
    GGML_ASSERT(backend_is_blas(backend_blas), "ggml_backend_is_blas(backend_blas)")
    backend_blas.context.n_threads = n_threads


# ---- device interface

def _dev_get_name(dev) -> str:
    return "BLAS"


def _dev_get_description(dev) -> str:
    try:
        cfg = np.show_config(mode="dicts")
        name = cfg["Build Dependencies"]["blas"]["name"]
        return {"scipy-openblas": "OpenBLAS", "openblas": "OpenBLAS", "mkl": "MKL", "accelerate": "Accelerate",
                "blis": "BLIS"}.get(str(name).lower(), str(name))
    except Exception:   # noqa: BLE001 - older NumPy: no dict config
        return "BLAS"


def _dev_get_memory(dev):
    # no memory to report
    return 0, 0


def _dev_get_type(dev) -> int:
    return B.GGML_BACKEND_DEVICE_TYPE_ACCEL


def _dev_get_props(dev, props) -> None:
    props.name = _dev_get_name(dev)
    props.description = _dev_get_description(dev)
    props.type = _dev_get_type(dev)
    props.memory_free, props.memory_total = _dev_get_memory(dev)
    props.caps = B.ggml_backend_dev_caps(async_=False, host_buffer=False, buffer_from_host_ptr=True, events=False,
                                         mmap_support=True)


def _dev_init_backend(dev, params):
    return backend_blas_init()


def _dev_get_buffer_type(dev):
    return B.backend_cpu_buffer_type()


def _dev_buffer_from_host_ptr(dev, ptr, size, max_tensor_size):
    return B.backend_cpu_buffer_from_ptr(ptr, size)


def _has_to_float(type_: int) -> bool:
    try:
        _check_type(type_)
        return True
    except Exception:   # noqa: BLE001
        return False


def _dev_supports_op(dev, op: Tensor) -> bool:
    """ggml_backend_blas_device_supports_op."""
    src0, src1 = op.src[0], op.src[1]
    o = op.op
    if op_is_empty(o):
        return True
    if o == C.GGML_OP_MUL_MAT:
        # BLAS usually is only faster for large matrices
        ne10 = int(src1.ne[0])
        ne0 = int(op.ne[0])
        ne1 = int(op.ne[1])
        min_batch = 32      # TODO: find the optimal value
        # default back to CPU fast path
        if int(op.op_params[1]) == GGML_HINT_SRC0_IS_HADAMARD:
            return False
        return (is_contiguous(src0) and is_contiguous(src1) and src1.type == C.GGML_TYPE_F32
                and (ne0 >= min_batch and ne1 >= min_batch and ne10 >= min_batch)
                and (src0.type == C.GGML_TYPE_F32 or _has_to_float(src0.type)))
    if o == C.GGML_OP_OUT_PROD:
        return (src0.type == C.GGML_TYPE_F32 and src1.type == C.GGML_TYPE_F32 and is_matrix(src0)
                and is_matrix(src1) and is_contiguous(src0) and (is_contiguous(src1) or is_transposed(src1))
                and (src0.type == C.GGML_TYPE_F32 or _has_to_float(src0.type)))
    return False


def _dev_supports_buft(dev, buft) -> bool:
    return B.backend_buft_is_host(buft)


_blas_device_i = B.ggml_backend_device_i(
    get_name=_dev_get_name,
    get_description=_dev_get_description,
    get_memory=_dev_get_memory,
    get_type=_dev_get_type,
    get_props=_dev_get_props,
    init_backend=_dev_init_backend,
    get_buffer_type=_dev_get_buffer_type,
    get_host_buffer_type=None,
    buffer_from_host_ptr=_dev_buffer_from_host_ptr,
    supports_op=_dev_supports_op,
    supports_buft=_dev_supports_buft,
    offload_op=None,
    event_new=None,
    event_free=None,
    event_synchronize=None,
)


# ---- backend reg interface

_device = None
_reg = None


def _reg_get_name(reg) -> str:
    return "BLAS"


def _reg_get_device_count(reg) -> int:
    return 1


def _reg_get_device(reg, index: int):
    global _device
    GGML_ASSERT(index == 0, "index == 0")
    if _device is None:
        _device = B.ggml_backend_device(_blas_device_i, reg, None)
    return _device


def _reg_get_proc_address(reg, name: str):
    if name == "ggml_backend_set_n_threads":
        return backend_blas_set_n_threads
    return None


def backend_blas_reg():
    """ggml_backend_blas_reg."""
    global _reg
    if _reg is None:
        _reg = B.ggml_backend_reg(B.ggml_backend_reg_i(
            get_name=_reg_get_name,
            get_device_count=_reg_get_device_count,
            get_device=_reg_get_device,
            get_proc_address=_reg_get_proc_address,
        ))
    return _reg
