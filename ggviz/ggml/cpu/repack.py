"""ggml-cpu's extra buffer types, and the CPU_REPACK one: weights repacked at load for compiled kernels.

Mirrors ggml 0.20.2 ``src/ggml-cpu``:

* traits.h / traits.cpp: ``ggml::cpu::tensor_traits`` (``work_size``, ``compute_forward``),
  ``ggml::cpu::extra_buffer_type`` (``supports_op``, ``get_tensor_traits``), ``ggml_cpu_extra_compute_forward``
  and ``ggml_cpu_extra_work_size`` (ask every extra buffer type whether it takes the op: the executor calls them
  before its own switch, the planner before its own work-size switch);
* ggml-cpu.cpp: ``ggml_backend_cpu_get_extra_buffer_types`` (the list: here only CPU_REPACK, and only when the
  compiled kernels are available -- like ggml built without ``GGML_USE_CPU_REPACK`` otherwise);
* repack.cpp: ``ggml_backend_cpu_repack_buffer_type`` ("CPU_REPACK": a CPU buffer whose ``init_tensor`` stores the
  tensor's traits in ``tensor->extra`` and whose ``set_tensor`` repacks), ``ggml_repack_get_optimal_repack_type``
  (which layout for which tensor: rows a multiple of 8), ``tensor_traits<...>::repack``, ``work_size``
  (``ggml_row_size(PARAM_TYPE, nelements(src1))``-like) and ``forward_mul_mat`` (src1 quantized to the vec-dot
  type, 4 chunks per thread aligned to 8 rows, ``current_chunk`` claiming), and the ``extra_buffer_type`` that
  takes MUL_MAT with a 2-D src0 in its buffer and an F32 src1.

Where ggviz differs from ggml, and why:

* The layouts: ``q4_0_8x4``, ``q4_1_8x4`` and ``q8_0_8x4`` -- 8 rows interleaved in 4-byte groups per block, the
  8 rows' block scales in their own array (fp16, or float32 on CPUs without hardware fp16 conversion). ggml on AVX2
  has no repack for Q4_1 or Q8_0 weights; ggviz adds them because its test model is Q4_1 with a tied Q8_0 output,
  and computes them with the arithmetic of ggml's *non*-repacked AVX2 vec_dot, so the results are ggml's bits.
* The repacked data is kept *beside* the original bytes, not instead of them: the buffer holds the tensor's
  ggml blocks unchanged (so GET_ROWS of the tied token embedding, the faithful kernels and the views still read
  ggml's own layout) and ``tensor.py_extra`` holds the repacked arrays. ``tensor->extra`` points at the traits
  object, as in ggml.
* Besides the per-node ``compute_forward``, a graph whose MUL_MATs all go through CPU_REPACK (and whose other ops
  have compiled kernels) is compiled once into a program that every thread walks without returning to Python
  (``FastGraph``; see ``fast_kernels``). The executor asks for it in ``graph_plan`` and uses it unless an abort
  callback or reference mode asks for the node-by-node walk. Traced computes stay compiled: the threads log node
  spans, barriers and chunk claims into an array that becomes ``trace`` events after the compute.

For quantized weights, results differ from the faithful MUL_MAT (``cpu/mul_mat.py``) only in the order of float
additions (the faithful path scales exact per-block integer sums; ggml, and this path, scale 8 partial sums per block
in 8 float lanes): src1 is quantized bit-exactly as ggml does, and every integer sum is exact. F16/F32 MUL_MATs are
ggml's bits on both paths (``ggml_vec_dot_f16/f32``: 4 x 8 FMA lanes, ggml's reduction, the compiler's tail).

Which weights go here: ``llama_model_params.use_extra_bufts`` (default True) makes the model loader place the
MUL_MAT weights in this buffer type (a tied output is duplicated, as llama.cpp's TENSOR_DUPLICATED, so GET_ROWS
keeps reading token_embd from the mapping); ``use_extra_bufts=False`` (what the step-through views use) keeps
every weight in the mapping and every node on the faithful kernels. ``GGVIZ_NO_REPACK=1`` removes the buffer type.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time

import numpy as np

from ... import trace
from .. import backend
from .. import consts as C
from .. import memory
from .. import quants as Q
from ..context import GGMLError
from ..tensor import Tensor, is_empty, n_dims, nbytes, nelements, op_desc
from . import fast_kernels as fk

GGML_TYPE_F32, GGML_TYPE_F16 = C.GGML_TYPE_F32, C.GGML_TYPE_F16
GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0 = C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q4_1, C.GGML_TYPE_Q8_0
NB_COLS = 8           # rows interleaved per group
INTER_SIZE = 4        # bytes per row per group step


_NO_REPACK = os.environ.get("GGVIZ_NO_REPACK", "") not in ("", "0")
# CPUs this process may run on: the compiled walk never uses more threads than that (spinning barriers on an
# oversubscribed machine only burn the cores the other threads need)
try:
    N_CPUS = len(os.sched_getaffinity(0))
except (AttributeError, OSError):
    N_CPUS = os.cpu_count() or 1


def repack_disabled() -> bool:
    """GGVIZ_NO_REPACK=1 (read at import): never offer the extra buffer type (every graph runs the faithful
    kernels)."""
    return _NO_REPACK


# =====================================================================================================================
# tensor_traits
# =====================================================================================================================

class RepackedWeight:
    """The repacked data of one weight (what ggml writes into tensor->data): per group of 8 rows and block, the
    interleaved quants ``qs`` (uint8), the 8 rows' scales ``d`` (and mins ``m`` for Q4_1), fp16 bits where the CPU
    converts fp16 in hardware, float32 otherwise (``fast_kernels.SCALES_F16``)."""
    __slots__ = ("traits", "qs", "d", "m", "rows", "ne00")

    def __init__(self, traits, qs, d, m, rows, ne00):
        self.traits, self.qs, self.d, self.m, self.rows, self.ne00 = traits, qs, d, m, rows, ne00

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.d.nbytes + (self.m.nbytes if self.m is not None else 0)

    def __repr__(self):
        return f"<repacked {self.traits.name} {self.rows}x{self.ne00} ({self.nbytes} bytes)>"


class TensorTraits:
    """``ggml::cpu::repack::tensor_traits<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>``."""

    def __init__(self, type_: int, param_type: int, name: str):
        self.type = type_
        self.param_type = param_type          # the vec-dot type src1 is quantized to (Q8_0 / Q8_1)
        self.name = name
        # the object's "address" (tensor->extra points at it, as at the static traits instance in C)
        self._raw = memory.aligned_malloc(16, f"tensor_traits {name}")
        self.addr = self._raw.ctypes.data
        _TRAITS_BY_ADDR[self.addr] = self

    def __repr__(self):
        return f"<tensor_traits {self.name} @0x{self.addr:x}>"

    # ---- work_size / compute_forward (the virtual methods)
    def work_size(self, n_threads: int, op: Tensor):
        if op.op != C.GGML_OP_MUL_MAT:
            return None
        s1 = op.src[1]
        return int(fk.mmq_layout(int(s1.ne[0]), int(s1.ne[1]) * int(s1.ne[2]))[4]) if fk.HAVE_NUMBA else 0

    def compute_forward(self, params, op: Tensor) -> bool:
        if op.op != C.GGML_OP_MUL_MAT:
            return False
        self.forward_mul_mat(params, op)
        return True

    def forward_mul_mat(self, params, op: Tensor) -> None:
        src0, src1 = op.src[0], op.src[1]
        rw: RepackedWeight = src0.py_extra
        ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
        ne10, ne11, ne12, ne13 = (int(v) for v in src1.ne)
        nb10, nb11, nb12 = (int(v) for v in src1.nb[:3])
        nb1, nb2 = int(op.nb[1]), int(op.nb[2])
        ith, nth = params.ith, params.nth
        if not (int(op.ne[0]) == ne01 and int(op.ne[1]) == ne11 and int(op.ne[2]) == ne12 and ne13 == 1):
            raise GGMLError("repack mul_mat: dst does not match src0 x src1 (or src1 is 4-D)")
        wdata = params.wdata
        need = int(fk.mmq_layout(ne10, ne11 * ne12)[4])
        if wdata is None or wdata.nbytes < need:
            raise GGMLError(f"repack mul_mat: work buffer of {0 if wdata is None else wdata.nbytes} bytes, "
                            f"needs {need}")
        w = wdata.ctypes.data
        qtype = self.type
        fk.mmq_quantize(int(src1.data), ne10, ne11, ne12, nb11, nb12, nb10, w, qtype == GGML_TYPE_Q4_1, ith, nth)
        tp = params.threadpool
        nchunk0, dr0 = fk.mmq_nchunk(ne01, nth)
        nchunk1 = ne12
        if ith == 0 and tp is not None:
            # every thread starts at its own chunk ith, so the first unclaimed chunk is nth
            tp.chunk_set(nth)
        params.barrier()
        xq, xd = rw.qs.ctypes.data, rw.d.ctypes.data
        xm = rw.m.ctypes.data if rw.m is not None else 0
        current = ith
        while current < nchunk0 * nchunk1:
            s, e = fk.mmq_chunk_rows(current, nchunk0, dr0, ne01)
            if s < e:
                if trace.active:
                    trace.emit("cpu.chunk", ith=ith, node=op.name, chunk=current, ir0=(int(s), int(e)),
                               ir1=(0, ne11), repack=self.name)
                fk.mmq_chunk(qtype, xq, xd, xm, ne00, s, e, int(op.data), nb1, nb2, current // nchunk0, ne11,
                             ne10, w, ne11 * ne12)
            current = tp.chunk_add(1) if tp is not None else current + nth

    # ---- repack (tensor_traits_base::repack)
    def repack(self, t: Tensor, data: np.ndarray) -> RepackedWeight:
        rows, ne00 = int(t.ne[1]), int(t.ne[0])
        blocks = np.ascontiguousarray(data).view(Q.BLOCK_DTYPES[self.type]).reshape(rows, ne00 // 32)
        return repack_blocks(self, blocks, rows, ne00)


def repack_blocks(traits: TensorTraits, blocks: np.ndarray, rows: int, ne00: int) -> RepackedWeight:
    """ggml blocks (rows, nb) -> the 8-row interleaved layout the compiled kernels read."""
    g, nb = rows // NB_COLS, ne00 // 32

    def scales(field):
        v = blocks[field].view(np.uint16)                                # (rows, nb) fp16 bits
        if not fk.SCALES_F16:
            v = Q.fp16_to_fp32(v)                                        # exact
        return np.ascontiguousarray(v.reshape(g, NB_COLS, nb).transpose(0, 2, 1))
    d = scales("d")
    m = None
    if traits.type == GGML_TYPE_Q8_0:
        qs = blocks["qs"].view(np.uint8).reshape(g, NB_COLS, nb, 8, INTER_SIZE)
        qs = np.ascontiguousarray(qs.transpose(0, 2, 3, 1, 4))          # (g, nb, chunk, row, 4)
    else:
        qs = blocks["qs"].reshape(g, NB_COLS, nb, 4, INTER_SIZE)        # 16 bytes: lo nibble j, hi nibble j+16
        qs = np.ascontiguousarray(qs.transpose(0, 2, 3, 1, 4))
        if traits.type == GGML_TYPE_Q4_1:
            m = scales("m")
    return RepackedWeight(traits, qs.reshape(-1), d.reshape(-1), None if m is None else m.reshape(-1), rows, ne00)


_TRAITS_BY_ADDR: dict[int, TensorTraits] = {}
_TRAITS: dict[int, TensorTraits] = {}


def _traits_for_type(t: int) -> TensorTraits:
    if t not in _TRAITS:
        name = {GGML_TYPE_Q4_0: "q4_0_8x4_q8_0", GGML_TYPE_Q4_1: "q4_1_8x4_q8_1", GGML_TYPE_Q8_0: "q8_0_8x4_q8_0"}[t]
        param = C.GGML_TYPE_Q8_1 if t == GGML_TYPE_Q4_1 else C.GGML_TYPE_Q8_0
        _TRAITS[t] = TensorTraits(t, param, name)
    return _TRAITS[t]


def get_optimal_repack_type(cur: Tensor):
    """ggml_repack_get_optimal_repack_type: the traits for this weight, or None (then it is not repacked)."""
    if not fk.HAVE_NUMBA:
        return None
    if cur.type not in (GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0):
        return None
    if int(cur.ne[1]) % NB_COLS != 0 or int(cur.ne[0]) % 32 != 0 or n_dims(cur) > 2:
        return None
    return _traits_for_type(cur.type)


def tensor_traits_of(t: Tensor):
    """The traits ``tensor->extra`` points at (None when it points at nothing ggviz knows)."""
    return _TRAITS_BY_ADDR.get(int(t.extra)) if t.extra else None


# =====================================================================================================================
# the CPU_REPACK buffer type
# =====================================================================================================================

def _repack_buffer_init_tensor(buffer, tensor: Tensor) -> int:
    traits = get_optimal_repack_type(tensor)
    tensor.extra = traits.addr if traits is not None else 0
    return C.GGML_STATUS_SUCCESS


def _repack_buffer_set_tensor(buffer, tensor: Tensor, data, offset: int, size: int) -> None:
    if offset != 0 or size != nbytes(tensor):
        raise GGMLError("CPU_REPACK set_tensor: GGML_ASSERT(offset == 0 && size == ggml_nbytes(tensor))")
    src = backend._as_bytes(data)[:size]
    # ggviz keeps ggml's own bytes in the buffer (see the module docstring) ...
    backend._bytes_at(tensor.data, size)[:] = src
    traits = tensor_traits_of(tensor)
    if traits is None:
        return
    # ... and the repacked copy beside it
    tensor.py_extra = traits.repack(tensor, src)
    if trace.active:
        trace.emit("cpu.repack", tensor=tensor.name, traits=traits.name, nbytes=tensor.py_extra.nbytes)


def _repack_buffer_type_alloc_buffer(buft, size: int):
    buffer = backend.backend_buft_alloc_buffer(backend.backend_cpu_buffer_type(), size)
    if buffer is None:
        return None
    buffer.buft = buft
    buffer._q[11] = buft.addr          # struct ggml_backend_buffer .buft
    buffer.iface = dataclasses.replace(buffer.iface, init_tensor=_repack_buffer_init_tensor,
                                       set_tensor=_repack_buffer_set_tensor)
    return buffer


class ExtraBufferType:
    """``ggml::cpu::repack::extra_buffer_type`` (the buffer type's context)."""

    def supports_op(self, dev, op: Tensor) -> bool:
        if op.op == C.GGML_OP_MUL_MAT:
            s0, s1 = op.src[0], op.src[1]
            if (s0.buffer and n_dims(s0) == 2 and backend.buffer_at(s0.buffer).buft is repack_buffer_type()
                    and get_optimal_repack_type(s0) is not None):
                if s1.buffer and not backend.backend_buft_is_host(backend.buffer_at(s1.buffer).buft):
                    return False
                return s1.type == GGML_TYPE_F32
        return False

    def get_tensor_traits(self, op: Tensor):
        if op.op == C.GGML_OP_MUL_MAT:
            s0 = op.src[0]
            if s0.buffer and s0.extra and backend.buffer_at(s0.buffer).buft is repack_buffer_type():
                tr = tensor_traits_of(s0)
                if tr is not None and isinstance(s0.py_extra, RepackedWeight) and op.src[1].type == GGML_TYPE_F32:
                    return tr
        return None


_repack_buft = None
_lock = threading.Lock()


def repack_buffer_type():
    """ggml_backend_cpu_repack_buffer_type: one static object, named "CPU_REPACK", alignment 32."""
    global _repack_buft
    if _repack_buft is not None:
        return _repack_buft
    with _lock:
        if _repack_buft is None:
            _repack_buft = backend.ggml_backend_buffer_type(backend.ggml_backend_buffer_type_i(
                get_name=lambda buft: "CPU_REPACK",
                alloc_buffer=_repack_buffer_type_alloc_buffer,
                get_alignment=lambda buft: backend.TENSOR_ALIGNMENT,
                get_max_size=None,       # defaults to SIZE_MAX
                get_alloc_size=None,     # defaults to ggml_nbytes
                is_host=None,            # not host: its tensors are only read by the kernels that know them
            ), device=None, context=ExtraBufferType())
    return _repack_buft


def get_extra_buffer_types() -> list:
    """ggml_backend_cpu_get_extra_buffer_types."""
    if not fk.HAVE_NUMBA or repack_disabled():
        return []
    return [repack_buffer_type()]


def is_extra_buffer_type(buft) -> bool:
    return any(b is buft for b in get_extra_buffer_types())


def extra_compute_forward(params, op: Tensor) -> bool:
    """ggml_cpu_extra_compute_forward: True if an extra buffer type computed the op."""
    if op.op != C.GGML_OP_MUL_MAT or _repack_buft is None:
        return False
    for extra in get_extra_buffer_types():
        tr = extra.context.get_tensor_traits(op)
        if tr is not None and tr.compute_forward(params, op):
            return True
    return False


def extra_work_size(n_threads: int, op: Tensor):
    """ggml_cpu_extra_work_size: the work size an extra buffer type wants for the op, or None."""
    if op.op != C.GGML_OP_MUL_MAT or _repack_buft is None:
        return None
    for extra in get_extra_buffer_types():
        tr = extra.context.get_tensor_traits(op)
        if tr is not None:
            size = tr.work_size(n_threads, op)
            if size is not None:
                return size
    return None


# =====================================================================================================================
# placing weights (what llama.cpp's loader does for weights whose buffer type is an extra one)
# =====================================================================================================================

def place_weights(tensors, label: str = "model weights"):
    """Allocate one CPU_REPACK buffer for ``tensors`` (no_alloc tensors whose data points at their bytes, e.g. in
    the GGUF mapping) and load them into it with ``ggml_backend_tensor_set`` (which repacks). Tensors the buffer
    type has no layout for are left where they are. Returns the buffer (or None)."""
    buft = repack_buffer_type()
    todo = []
    seen = set()
    for t in tensors:
        if t is None or t.addr in seen or get_optimal_repack_type(t) is None:
            continue
        seen.add(t.addr)
        todo.append(t)
    if not todo:
        return None
    align = backend.backend_buft_get_alignment(buft)
    total = sum(-(-backend.backend_buft_get_alloc_size(buft, t) // align) * align for t in todo)
    buffer = backend.backend_buft_alloc_buffer(buft, total)
    backend.backend_buffer_set_usage(buffer, backend.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    base = backend.backend_buffer_get_base(buffer)
    off = 0
    for t in todo:
        n = nbytes(t)
        arr, o, _ = memory.resolve(t.data, n)
        src = arr[o:o + n]
        t.data = 0
        backend.backend_tensor_alloc(buffer, t, base + off)
        backend.backend_tensor_set(t, src, 0, n)
        off += -(-n // align) * align
    return buffer


# =====================================================================================================================
# FastGraph: a graph compiled into a program every thread walks inside one nogil call
# =====================================================================================================================

_BINOP = {C.GGML_OP_ADD: 0, C.GGML_OP_MUL: 1, C.GGML_OP_SUB: 2, C.GGML_OP_DIV: 3}
_EMPTY_OPS = {C.GGML_OP_NONE, C.GGML_OP_RESHAPE, C.GGML_OP_TRANSPOSE, C.GGML_OP_VIEW, C.GGML_OP_PERMUTE}


class _Unsupported(Exception):
    pass


def _desc(P, k, col, t: Tensor):
    """data, ne[4], nb[4] straight from the struct's words (data is word 31, ne and nb words 2..9)."""
    if t is None:
        return
    q = t._q
    P[k, col] = q[31]
    P[k, col + 1:col + 9] = q[2:10]


def _need(cond):
    if not cond:
        raise _Unsupported()


class FastGraph:
    """A graph as a program for ``fast_kernels.graph_compute_thread``: one row per computed node."""

    def __init__(self, P, F, node_index, names, wsize, meta=None, n_nodes=0):
        self.P, self.F = P, F
        self.node_index = node_index          # program row -> graph node index
        self.names = names
        self.meta = meta or [(0, "")] * len(names)     # program row -> (node addr, op description), for the trace
        self.n_nodes = n_nodes                # the graph's node count (a "final" barrier follows node n_nodes)
        self._log = None                      # the trace log of the compute in flight (trace_begin/trace_end)
        self._log_cap = 0
        self._caps = {}                       # n_threads -> records per thread (_trace_capacity)
        self._clock = None
        self.work_size = wsize
        self.sync = fk.new_sync()
        self.timings = np.zeros(0, np.int64)  # per-row cycle counts when profiling (set_profiling)
        self.plan_cache = {}                  # n_threads -> what ggml_graph_plan's node loop found (same graph)
        self.n_next = 1 << 30                 # threads for the next compute (see compute_thread)
        self.wall = {}                        # n_use -> recent wall ns of a compute (exponential average)
        self.n_single = 0                     # computes run on one thread since the last probe ...
        self.single_ns = 0                    # ... and their time
        self.probe_every, self.probe_ns, self.probing = self.PROBE_EVERY, self.PROBE_NS, False

    def __len__(self):
        return self.P.shape[0]

    def set_profiling(self, on: bool):
        self.timings = np.zeros(len(self) if on else 0, np.int64)

    # ggviz's thread policy for the compiled walk (ggml has none: it always uses every thread it is given).
    # With another process holding one of the cores, every one of the ~600 barriers of a decode waits for a
    # descheduled thread and two threads become several times slower than one. So: when a compute's threads spent
    # more than CONTENDED of its wall time asleep in barriers, the next compute runs on one thread; while on one
    # thread, every PROBE_EVERY computes one runs on all threads again, and the faster mode (per this graph, in
    # recent computes) is kept. Results do not depend on it (ggml's partitions give the same values).
    CONTENDED = 0.25
    PROBE_EVERY = 16              # computes on one thread before trying all threads again (doubles while they lose)
    PROBE_NS = 2_000_000_000      # ... or that much time

    def _choose_threads(self, n_max: int, n_use: int, wall_ns: int, wall_ticks: int) -> None:
        slept_ticks = int(self.sync[fk.SYNC_SLEEP_TICKS])
        self.sync[fk.SYNC_SLEEP_TICKS] = 0
        prev = self.wall.get(n_use)
        self.wall[n_use] = wall_ns if prev is None else (prev * 3 + wall_ns) // 4
        if n_max <= 1:
            return
        if n_use > 1:
            slept_ns = slept_ticks * wall_ns / max(wall_ticks, 1)
            contended = slept_ns > self.CONTENDED * wall_ns * (n_use - 1)
            single = self.wall.get(1)
            if contended and (single is None or single < self.wall[n_use]):
                if self.probing:              # all threads lost again: wait longer before the next try
                    self.probe_every = min(self.probe_every * 2, 1024)
                    self.probe_ns = min(self.probe_ns * 2, 60_000_000_000)
                self.n_next, self.single_ns, self.n_single = 1, 0, 0
            else:
                self.n_next = n_max
                self.probe_every, self.probe_ns = self.PROBE_EVERY, self.PROBE_NS
            self.probing = False
        else:
            self.n_single += 1
            self.single_ns += wall_ns
            multi = self.wall.get(n_max)
            if self.n_single >= self.probe_every or self.single_ns >= self.probe_ns:
                self.n_next, self.probing = n_max, True       # try all threads again
            elif multi is not None and multi < self.wall[1]:
                self.n_next = n_max                           # one thread got slower than all of them were

    # ---- tracing the compiled walk ------------------------------------------------------------------------------
    # The compiled walk cannot call Python per node, so when somebody listens each thread appends fixed-size records
    # (node spans, barrier waits, MUL_MAT chunk claims, timestamp-counter ticks) to its own part of one int64 array
    # (fk.tr_rec); after the compute the caller hands the array over as one trace.Batch, which is turned into the
    # same cpu.node / cpu.barrier / cpu.chunk events as the node-by-node walk's only when somebody reads them.

    def _trace_capacity(self, n_threads: int) -> int:
        """Records one thread can write in one compute: a node and a barrier per row, a kernel barrier per MUL_MAT
        and at most every chunk of every MUL_MAT (ggml's chunking, bounded from above)."""
        cached = self._caps.get(n_threads)
        if cached is not None:
            return cached
        P = self.P
        cap = 2 * len(P) + 8
        for k in range(len(P)):
            op = P[k, 0]
            if op == fk.OP_MUL_MAT_Q:
                cap += 1 + ((int(P[k, fk.S0 + 2]) + 7) // 8) * int(P[k, fk.S1 + 3]) + n_threads
            elif op == fk.OP_MUL_MAT_F:
                nr0 = int(P[k, fk.DST + 1])
                nr1 = int(P[k, fk.DST + 2]) * int(P[k, fk.S1 + 3]) * int(P[k, fk.S1 + 4])
                cap += 1 + ((nr0 + 15) // 16) * ((nr1 + 15) // 16) + 4 * n_threads
        self._caps[n_threads] = cap
        return cap

    def trace_begin(self, n_threads: int) -> None:
        """Give the compiled walk a zeroed log for ``n_threads`` threads (before the kickoff)."""
        cap = self._trace_capacity(n_threads)
        stride = 1 + cap * fk.TR_REC
        if self._log is None or self._log_cap != cap or self._log.size < n_threads * stride:
            self._log = np.zeros(n_threads * stride, np.int64)
            self._log_cap = cap
        else:
            self._log[:n_threads * stride:stride] = 0          # the per-thread record counts
        self._log_threads = n_threads
        self.sync[fk.SYNC_TRACE + 1] = cap
        self.sync[fk.SYNC_TRACE] = self._log.ctypes.data
        self._clock = (time.perf_counter_ns(), fk.time_ns())

    def trace_end(self, cgraph, pool: int, n_graph: int):
        """Stop logging; the compute's records as a trace.Batch (a copy: the log is reused)."""
        self.sync[fk.SYNC_TRACE] = 0
        p1, c1 = time.perf_counter_ns(), fk.time_ns()
        p0, c0 = self._clock
        stride = 1 + self._log_cap * fk.TR_REC
        nth = self._log_threads
        parts = []
        dropped = 0
        for ith in range(nth):
            base = ith * stride
            n = int(self._log[base])
            m = min(n, self._log_cap)
            dropped += n - m
            if m:
                parts.append((ith, self._log[base + 1:base + 1 + m * fk.TR_REC].reshape(m, fk.TR_REC).copy()))
        ns_per_tick = (p1 - p0) / max(c1 - c0, 1)
        return trace.Batch(_FastTraceExpander(self, parts, p0, c0, ns_per_tick, pool, n_graph, dropped),
                           sum(len(r) for _, r in parts) + (1 if dropped else 0))

    def compute_thread(self, ith: int, nth: int, work_data) -> None:
        """Thread ith's walk over every node (ggml_graph_compute_thread, compiled). ``self.n_next`` (decided by
        thread 0 at the end of the previous compute, capped by nth and N_CPUS) threads take part, the others return
        at once; they split the work with ggml's ith/nth partitions."""
        n_max = min(nth, N_CPUS)
        n_use = max(1, min(n_max, self.n_next))
        if ith >= n_use:
            return
        w = work_data.ctypes.data if work_data is not None and work_data.nbytes else 0
        if ith == 0:
            t0, c0 = time.perf_counter_ns(), fk.time_ns()
        fk.graph_compute_thread(self.P, self.F, w, self.sync.ctypes.data, ith, n_use, 0, len(self), self.timings)
        if ith == 0:
            self._choose_threads(n_max, n_use, time.perf_counter_ns() - t0, fk.time_ns() - c0)
            err = int(self.sync[fk.SYNC_ERROR])
            if err:
                k = int(self.sync[fk.SYNC_ERROR + 1])
                self.sync[fk.SYNC_ERROR] = 0
                what = {fk.ERR_GET_ROWS_INDEX: "GGML_ASSERT(i01 >= 0 && i01 < ne01) failed",
                        fk.ERR_SET_ROWS_INDEX: "GGML_ASSERT(i1 >= 0 && i1 < ne1) failed",
                        fk.ERR_BARRIER_TIMEOUT: "a thread never reached the barrier"}.get(err, f"error {err}")
                where = (f"node {self.node_index[k]} {self.names[k]!r}" if 0 <= k < len(self.node_index)
                         else "the compiled graph")
                raise GGMLError(f"computing {where}: {what}")


class _FastTraceExpander:
    """Turns one compiled compute's log into the node-by-node walk's event dicts (called lazily by trace.Batch)."""

    _WHERE = {fk.TRW_NODE: "node", fk.TRW_FINAL: "final", fk.TRW_KERNEL: "kernel"}

    def __init__(self, fg, parts, p0, c0, ns_per_tick, pool, n_graph, dropped):
        self.fg, self.parts = fg, parts
        self.p0, self.c0, self.scale = p0, c0, ns_per_tick
        self.pool, self.n_graph, self.dropped = pool, n_graph, dropped

    def __call__(self) -> list[dict]:
        fg = self.fg
        idx, names, meta, P = fg.node_index, fg.names, fg.meta, fg.P
        pool, n_graph = self.pool, self.n_graph
        out = []
        for ith, rec in self.parts:
            # ticks -> perf_counter ns, vectorized
            ts = (self.p0 + (rec[:, 8:10] - self.c0) * self.scale).astype(np.int64)
            for r, (t0, t1) in zip(rec.tolist(), ts.tolist()):
                kind, k = r[0], r[1]
                if kind == fk.TR_NODE:
                    addr, op = meta[k]
                    out.append({"kind": "cpu.node", "ith": ith, "node_n": idx[k], "addr": addr, "name": names[k],
                                "op": op, "t_start": t0, "t_end": t1,
                                "fused": bool(P[k, 0] == fk.OP_RMS_NORM and P[k, 2] == 1), "pool": pool,
                                "n_graph": n_graph, "compiled": True, "t": t1})
                elif kind == fk.TR_BARRIER:
                    final = k >= len(idx)
                    out.append({"kind": "cpu.barrier", "ith": ith, "pool": pool, "n_graph": n_graph, "seq": r[3],
                                "where": self._WHERE.get(r[2], str(r[2])),
                                "node_n": fg.n_nodes if final else idx[k], "name": None if final else names[k],
                                "t_enter": t0, "t_exit": t1, "compiled": True, "t": t1})
                elif kind == fk.TR_CHUNK:
                    out.append({"kind": "cpu.chunk", "ith": ith, "node": names[k], "chunk": r[2],
                                "nchunk": (r[7] >> 32, r[7] & 0xFFFFFFFF), "ir0": (r[3], r[4]), "ir1": (r[5], r[6]),
                                "t_start": t0, "t_end": t1, "pool": pool, "n_graph": n_graph, "compiled": True,
                                "t": t1})
        if self.dropped:
            out.append({"kind": "trace.dropped", "what": "compiled walk records", "n": self.dropped, "pool": pool,
                        "n_graph": n_graph, "t": self.p0})
        return out


def _graph_signature(cgraph):
    """Bytes that change whenever the graph's nodes change: the arena of the graph's context (all node structs,
    with their data pointers, shapes, strides, op params and src pointers, live there)."""
    ctx = cgraph.ctx
    if ctx is None:
        return None
    return ctx.mem_buffer[:ctx.used_mem()].tobytes()


def plan_graph(cgraph, n_threads: int):
    """The compiled program for ``cgraph``, or None when the graph must take the node-by-node walk (no weight in
    CPU_REPACK, or an op/type the compiled kernels do not cover). Cached on the graph while its nodes are
    unchanged (llama.cpp reuses graphs between decodes)."""
    if _repack_buft is None or not fk.HAVE_NUMBA or repack_disabled():
        return None
    sig = None
    cache = getattr(cgraph, "_ggviz_fast", None)
    if cache is not None and getattr(cgraph, "ctx", None) is not None:
        sig = _graph_signature(cgraph)
        if cache[0] == sig and cache[2] == cgraph.n_nodes:
            return cache[1]
    if not _has_repacked_mul_mat(cgraph):
        return None
    fg = _build(cgraph)
    if fg is not None and getattr(cgraph, "ctx", None) is not None:
        if sig is None:
            sig = _graph_signature(cgraph)
        try:
            cgraph._ggviz_fast = (sig, fg, cgraph.n_nodes)
        except AttributeError:
            pass
    return fg


def compile_graph(cgraph, require_repack: bool = False):
    """The FastGraph of ``cgraph`` (None if some node has no compiled kernel). Unlike ``plan_graph`` this does not
    need a CPU_REPACK weight in the graph and does not cache: for tests and the views."""
    if not fk.HAVE_NUMBA:
        return None
    return _build(cgraph, require_repack)


def _has_repacked_mul_mat(cgraph) -> bool:
    """Cheap test before compiling: does some MUL_MAT read a weight that has CPU_REPACK traits?"""
    mm = C.GGML_OP_MUL_MAT
    for node in cgraph.nodes:
        if node.op == mm:
            s0 = node.src[0]
            if s0 is not None and s0.extra and tensor_traits_of(s0) is not None:
                return True
    return False


def _build(cgraph, require_repack: bool = True):
    from .ggml_cpu import _can_fuse_rms_norm_mul
    nodes = list(cgraph.nodes)
    n = len(nodes)
    P = np.zeros((n, fk.NCOL), np.int64)
    F = np.zeros((n, fk.NFCOL), np.float64)
    idx, names, meta = [], [], []
    k = 0
    wsize = 0
    any_repack = False
    i = 0
    try:
        while i < n:
            node = nodes[i]
            op = node.op
            if op in _EMPTY_OPS or not (node.flags & C.GGML_TENSOR_FLAG_COMPUTE) or is_empty(node):
                i += 1
                continue
            s0, s1, s2 = node.src[0], node.src[1], node.src[2]
            _desc(P, k, fk.DST, node)
            _desc(P, k, fk.S0, s0)
            _desc(P, k, fk.S1, s1)
            _desc(P, k, fk.S2, s2)
            skip = 0
            if op == C.GGML_OP_MUL_MAT:
                tr = repack_buffer_type().context.get_tensor_traits(node) if _repack_buft is not None else None
                _need(int(node.nb[0]) == 4 and int(s1.nb[0]) == 4)
                if tr is not None:
                    rw = s0.py_extra
                    _need(int(s1.ne[3]) == 1 and int(node.ne[3]) == 1)
                    P[k, 0] = fk.OP_MUL_MAT_Q
                    P[k, fk.X] = s0.type
                    P[k, fk.X + 1] = rw.qs.ctypes.data
                    P[k, fk.X + 2] = rw.d.ctypes.data
                    P[k, fk.X + 3] = rw.m.ctypes.data if rw.m is not None else 0
                    wsize = max(wsize, tr.work_size(1, node))
                    any_repack = True
                else:
                    _need(s0.type in (GGML_TYPE_F16, GGML_TYPE_F32) and s1.type == GGML_TYPE_F32)
                    _need(int(s0.nb[0]) == (2 if s0.type == GGML_TYPE_F16 else 4))
                    _need(int(s1.ne[2]) % int(s0.ne[2]) == 0 and int(s1.ne[3]) % int(s0.ne[3]) == 0)
                    P[k, 0] = fk.OP_MUL_MAT_F
                    P[k, fk.X] = s0.type
                    if s0.type == GGML_TYPE_F16:
                        wsize = max(wsize, 2 * nelements(s1))
            elif op == C.GGML_OP_RMS_NORM:
                _need(s0.type == GGML_TYPE_F32 and node.type == GGML_TYPE_F32 and int(s0.nb[0]) == 4)
                _need(int(node.nb[0]) == 4)
                P[k, 0] = fk.OP_RMS_NORM
                F[k, 0] = float(np.frombuffer(node.op_params[:1].tobytes(), np.float32)[0])
                mul = _can_fuse_rms_norm_mul(cgraph, i)
                if mul is not None:
                    a0 = mul.src[0]
                    w = mul.src[1] if (a0 is not None and a0.addr == node.addr) else a0
                    P[k, 2] = 1
                    _desc(P, k, fk.DST, mul)
                    _desc(P, k, fk.S1, w)
                    skip = 1
            elif op in _BINOP:
                _need(s0.type == GGML_TYPE_F32 and s1.type == GGML_TYPE_F32 and node.type == GGML_TYPE_F32)
                _need(int(s0.nb[0]) == 4 and int(node.nb[0]) == 4 and s0.shape == node.shape)
                P[k, 0] = fk.OP_BINARY
                P[k, 2] = _BINOP[op]
            elif op == C.GGML_OP_ROPE:
                _build_rope(P, F, k, node)
            elif op == C.GGML_OP_SET_ROWS:
                _need(s0.type == GGML_TYPE_F32 and node.type in (GGML_TYPE_F16, GGML_TYPE_F32))
                _need(s1.type in (C.GGML_TYPE_I32, C.GGML_TYPE_I64))
                P[k, 0] = fk.OP_SET_ROWS
                P[k, fk.X] = node.type
                P[k, fk.X + 1] = s1.type
            elif op == C.GGML_OP_SOFT_MAX:
                from ..tensor import get_op_params_f32
                _need(s0.type == GGML_TYPE_F32 and s2 is None and int(s0.nb[0]) == 4)
                max_bias = get_op_params_f32(node, 1)
                _need(max_bias == 0.0)
                if s1 is not None:
                    _need(s1.type in (GGML_TYPE_F32, GGML_TYPE_F16) and int(s1.nb[0]) in (2, 4))
                    P[k, fk.X] = s1.type
                P[k, 0] = fk.OP_SOFT_MAX
                F[k, 0] = get_op_params_f32(node, 0)
                F[k, 1] = 1.0
            elif op in (C.GGML_OP_CPY, C.GGML_OP_CONT, C.GGML_OP_DUP):
                ok = {(GGML_TYPE_F32, GGML_TYPE_F32), (GGML_TYPE_F16, GGML_TYPE_F16), (GGML_TYPE_F32, GGML_TYPE_F16),
                      (GGML_TYPE_F16, GGML_TYPE_F32)}
                _need((s0.type, node.type) in ok)
                P[k, 0] = fk.OP_CPY
                P[k, fk.X] = s0.type
                P[k, fk.X + 1] = node.type
                _desc(P, k, fk.DST, node)
            elif op == C.GGML_OP_GLU:
                from ..tensor import get_glu_op, get_op_params_i32, nrows
                _need(get_glu_op(node) == C.GGML_GLU_OP_SWIGLU and s0.type == GGML_TYPE_F32)
                _need(int(s0.nb[0]) == 4 and int(node.nb[0]) == 4)
                if s1 is not None:
                    _need(s1.type == GGML_TYPE_F32 and int(s1.nb[0]) == 4)
                nc = int(s0.ne[0]) if s1 is not None else int(s0.ne[0]) // 2
                P[k, 0] = fk.OP_SWIGLU
                P[k, fk.X] = nc
                P[k, fk.X + 1] = get_op_params_i32(node, 1)
                P[k, fk.X + 2] = nrows(s0)
                if s1 is None:
                    P[k, fk.S1] = 0
            elif op == C.GGML_OP_GET_ROWS:
                _need(node.type == GGML_TYPE_F32 and s1.type in (C.GGML_TYPE_I32, C.GGML_TYPE_I64))
                _need(s0.type in (GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1))
                _need(int(node.nb[0]) == 4)
                P[k, 0] = fk.OP_GET_ROWS
                P[k, fk.X] = s0.type
                P[k, fk.X + 1] = s1.type
            else:
                raise _Unsupported()
            for t in (node, s0, s1, s2):
                if t is not None and nelements(t) > 0 and not t.data:
                    raise _Unsupported()
            idx.append(i)
            names.append(node.name)
            meta.append((node.addr, op_desc(node)))
            k += 1
            i += 1 + skip
    except _Unsupported:
        return None
    if require_repack and not any_repack:
        return None
    return FastGraph(P[:k].copy(), F[:k].copy(), idx, names, wsize, meta, n)


def _build_rope(P, F, k, node):
    from ..tensor import get_op_params_i32, get_op_params_f32
    from .ops import fma32, logf, powf, rope_yarn_corr_dims
    s0, s1, s2 = node.src[0], node.src[1], node.src[2]
    mode = get_op_params_i32(node, 2)
    _need(s0.type == GGML_TYPE_F32 and node.type == GGML_TYPE_F32 and s1.type == C.GGML_TYPE_I32)
    _need(mode in (C.GGML_ROPE_TYPE_NORMAL, C.GGML_ROPE_TYPE_NEOX))
    _need(int(s0.nb[0]) == 4 and int(node.nb[0]) == 4)
    n_dims = get_op_params_i32(node, 1)
    n_ctx_orig = get_op_params_i32(node, 4)
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (
        np.float32(get_op_params_f32(node, i)) for i in range(5, 11))
    _need(n_dims <= int(node.ne[0]) and n_dims % 2 == 0)
    if s2 is not None:
        _need(s2.type == GGML_TYPE_F32 and int(s2.ne[0]) >= n_dims // 2)
    theta_scale = powf(freq_base, np.float32(-2.0) / np.float32(n_dims))
    corr = rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    P[k, 0] = fk.OP_ROPE
    P[k, fk.X] = n_dims
    P[k, fk.X + 1] = 1 if mode == C.GGML_ROPE_TYPE_NEOX else 0
    mscale = attn_factor
    if ext_factor != 0:
        # rope_yarn: mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale) (gcc fuses it into an FMA)
        mscale = np.float32(mscale * fma32(np.float32(0.1), logf(np.float32(1) / freq_scale), np.float32(1)))
    F[k, 0:7] = [freq_scale, ext_factor, mscale, theta_scale, corr[0], corr[1], 1.0]
    if s2 is None:
        P[k, fk.S2] = 0
