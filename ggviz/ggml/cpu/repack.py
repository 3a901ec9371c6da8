"""ggml-cpu's repack.cpp: the CPU_REPACK extra buffer type, weights repacked at load for the compiled kernels.

Mirrors ggml 0.20.2 ``src/ggml-cpu`` (the extra-buffer-type interfaces themselves are ``traits.py``):

* repack.cpp: ``ggml_backend_cpu_repack_buffer_type`` ("CPU_REPACK": a CPU buffer whose ``init_tensor`` stores the
  tensor's traits in ``tensor->extra`` and whose ``set_tensor`` repacks), ``ggml_repack_get_optimal_repack_type``
  (which layout for which tensor: rows a multiple of 8), ``tensor_traits<...>::repack``, ``work_size``
  (``ggml_row_size(PARAM_TYPE, nelements(src1))``-like) and ``forward_mul_mat`` (src1 quantized to the vec-dot
  type, 4 chunks per thread aligned to 8 rows, ``current_chunk`` claiming), and the ``extra_buffer_type`` that
  takes MUL_MAT with a 2-D src0 in its buffer and an F32 src1.
* for Gemma-3's Q4_K weights, from the ggml llama-cpp-python 0.3.36 vendors (0.25.3): ``block_q4_Kx8`` and
  ``repack_q4_K_to_q4_K_8_bl`` (the byte layout of the C), and, from ``arch/x86/repack.cpp`` in NumPy (the faithful
  versions of fast/kquants.py's kernels), ``ggml_quantize_mat_q8_K_4x8``, ``ggml_gemv_q4_K_8x8_q8_K`` and
  ``ggml_gemm_q4_K_8x8_q8_K`` (:func:`mul_mat_q4_K_8x8` strings them together as ``forward_mul_mat`` does). On AVX2
  ggml repacks Q4_K (ne1 % 8 == 0) to ``q4_K_8x8_q8_K`` and leaves Q5_0, Q6_K and Q8_0 alone.

Where ggviz differs from ggml, and why:

* The layouts: ``q4_0_8x4``, ``q4_1_8x4`` and ``q8_0_8x4`` -- 8 rows interleaved in 4-byte groups per block, the
  8 rows' block scales in their own array (fp16, or float32 on CPUs without hardware fp16 conversion). ggml on AVX2
  has no repack for Q4_1 or Q8_0 weights. ggviz: they are added because its test model is Q4_1 with a tied Q8_0 output,
  and computes them with the arithmetic of ggml's *non*-repacked AVX2 vec_dot, so the results are ggml's bits.
  Likewise for Gemma-3: Q5_0 weights are expanded to ``q8_0_8x4`` (int8 levels q - 16; ggml_vec_dot_q5_0_q8_0 is
  vec_dot_q8_0 on those levels) for MUL_MATs of a few src1 rows (a decode), while a prompt's MUL_MAT reads ggml's
  own 22-byte blocks in ``tensor->data`` through tinyBLAS_Q0_AVX's tiles, as llama.cpp does (fast/sgemm.py
  ``q5_0_rows``; the same lanes and FMAs, so the same bits), and Q6_K weights are kept as rows
  (``q6_K_rows_q8_K``: vec_dot_q6_K, or tiled.cpp's microtile from 8 src1 rows on), so that a Gemma graph compiles
  whole; Q4_K is ggml's own ``q4_K_8x8_q8_K``.
* The repacked data is kept *beside* the original bytes, not instead of them: the buffer holds the tensor's
  ggml blocks unchanged (so GET_ROWS of the tied token embedding, the faithful kernels and the views still read
  ggml's own layout) and ``tensor.py_extra`` holds the repacked arrays. ``tensor->extra`` points at the traits
  object, as in ggml.
* Besides the per-node ``compute_forward``, a graph whose MUL_MATs all go through CPU_REPACK (and whose other ops
  have compiled kernels) is compiled once into a program that every thread walks without returning to Python
  (``fast.compiler.FastGraph``). The executor asks for it in ``graph_plan`` and uses it unless an abort
  callback or reference mode asks for the node-by-node walk. Traced computes stay compiled: the threads log node
  spans, barriers and chunk claims into an array that becomes ``trace`` events after the compute.

For Q4_0 / Q4_1 weights, results differ from the faithful MUL_MAT (``cpu/mul_mat.py``) only in the order of float
additions (the faithful path scales exact per-block integer sums; ggml, and this path, scale 8 partial sums per block
in 8 float lanes): src1 is quantized bit-exactly as ggml does, and every integer sum is exact. For Q8_0, Q5_0, Q6_K
the faithful MUL_MAT follows the AVX2 lanes too, so both paths give llama.cpp's bits; a repacked Q4_K gives
llama.cpp's CPU_REPACK bits (gemv / gemm), the faithful Q4_K MUL_MAT those of llama.cpp without repack (vec_dot /
tiled) -- the two differ in the last bits, as they do in llama.cpp. F16/F32 MUL_MATs are
ggml's bits on both paths (``ggml_vec_dot_f16/f32``: 4 x 8 FMA lanes, ggml's reduction, the compiler's tail).

Which weights go here: ``llama_model_params.use_extra_bufts`` (default True) makes the model loader place the
MUL_MAT weights in this buffer type (a tied output is duplicated, as llama.cpp's TENSOR_DUPLICATED, so GET_ROWS
keeps reading token_embd from the mapping); ``use_extra_bufts=False`` (what the step-through views use) keeps
every weight in the mapping and every node on the faithful kernels. ``GGVIZ_NO_REPACK=1`` removes the buffer type.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import threading
import weakref

import numpy as np

from ... import trace
from .. import backend, memory
from .. import consts as C
from .. import quants as Q
from ..context import GGMLError
from ..tensor import _Q_BUFFER, _Q_SRC, _W_OP, _W_TYPE, Tensor, n_dims, nbytes, tensor_at
from .libm import fma32

try:    # the compiled kernels this buffer type's layout is made for (optional: without Numba, no CPU_REPACK)
    from .fast import intrinsics as _intrinsics
    from .fast import kernels as fk
    from .fast import kquants as kq
    SCALES_F16 = _intrinsics.SCALES_F16
except ImportError:
    fk = kq = None
    SCALES_F16 = False

GGML_TYPE_F32, GGML_TYPE_F16 = C.GGML_TYPE_F32, C.GGML_TYPE_F16
GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0 = C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q4_1, C.GGML_TYPE_Q8_0
GGML_TYPE_Q4_K, GGML_TYPE_Q8_K = C.GGML_TYPE_Q4_K, C.GGML_TYPE_Q8_K
GGML_TYPE_Q5_0, GGML_TYPE_Q6_K = C.GGML_TYPE_Q5_0, C.GGML_TYPE_Q6_K
# Gemma-3's weight types, computed by fast/kquants.py: Q4_K repacked as ggml does on AVX2 (block_q4_Kx8); Q6_K,
# which ggml does not repack on AVX2, kept in its own layout here so that a Gemma graph compiles whole (its MUL_MAT
# is ggml's plain one: vec_dot, or tiled.cpp for >= 8 src1 rows -- the same bits). Q5_0 (not repacked by ggml on
# AVX2 either) is expanded to the q8_0_8x4 layout (int8 levels q - 16, the same fp16 d): ggml_vec_dot_q5_0_q8_0 is
# ggml_vec_dot_q8_0_q8_0 on those levels, operation for operation, so the Q8_0 micro-kernels give its bits.
K_TYPES = (GGML_TYPE_Q4_K, GGML_TYPE_Q6_K)
NB_COLS = 8           # rows interleaved per group
INTER_SIZE = 4        # bytes per row per group step


_NO_REPACK = os.environ.get("GGVIZ_NO_REPACK", "") not in ("", "0")


def repack_disabled() -> bool:
    """GGVIZ_NO_REPACK=1 (read at import): never offer the extra buffer type (every graph runs the faithful
    kernels)."""
    return _NO_REPACK


# =====================================================================================================================
# tensor_traits
# =====================================================================================================================

class RepackArena:
    """Where one CPU_REPACK buffer's repacked arrays live: chunks of at least CHUNK bytes, each array carved from one
    at a 64-byte boundary (``empty``), instead of an allocation per array. ggml writes the repacked blocks into the
    buffer's one allocation; ggviz keeps them beside it (see the module docstring), and one NumPy allocation per
    array made every page of a model's repacked weights a fault of its own: SmolLM2's 210 Q4_1 weights (66 MB,
    arrays of 0.1-0.5 MB) took 16,200 page faults and 43-46 ms to repack, from chunks 315 faults and 22-24 ms
    (NumPy asks the kernel for huge pages on allocations of 4 MiB and more). A chunk lives as long as an array
    carved from it."""
    CHUNK = 32 << 20
    ALIGN = 64

    def __init__(self):
        self._chunk = None
        self._off = 0
        self._lock = threading.Lock()         # (set_tensor of one buffer's tensors from several threads)

    def empty(self, shape, dtype) -> np.ndarray:
        """``np.empty(shape, dtype)`` (C order), carved from the current chunk (a new one when it is full)."""
        dtype = np.dtype(dtype)
        n = dtype.itemsize
        for x in shape:
            n *= int(x)
        if n == 0 or n > self.CHUNK // 4:
            return np.empty(shape, dtype)        # big enough for the kernel's huge pages on its own
        with self._lock:
            if self._chunk is None or self._off + n > len(self._chunk):
                self._chunk = np.empty(self.CHUNK, np.uint8)
                self._off = (-self._chunk.ctypes.data) % self.ALIGN
            a = self._chunk[self._off:self._off + n]
            self._off += n + (-n) % self.ALIGN
        return a.view(dtype).reshape(shape)


class RepackedWeight:
    """The repacked data of one weight (what ggml writes into tensor->data): per group of 8 rows and block, the
    interleaved quants ``qs`` (uint8), the 8 rows' scales ``d`` (and mins ``m`` for Q4_1), fp16 bits where the CPU
    converts fp16 in hardware, float32 otherwise (``fast.intrinsics.SCALES_F16``)."""
    __slots__ = ("traits", "qs", "d", "m", "rows", "ne00", "ptrs")

    def __init__(self, traits, qs, d, m, rows, ne00):
        self.traits, self.qs, self.d, self.m, self.rows, self.ne00 = traits, qs, d, m, rows, ne00
        # the blocks' addresses (what a compiled program row holds; fast/compiler.py keys derived programs on them)
        self.ptrs = (qs.ctypes.data, d.ctypes.data, 0 if m is None else m.ctypes.data)

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.d.nbytes + (self.m.nbytes if self.m is not None else 0)

    def __repr__(self):
        return f"<repacked {self.traits.name} {self.rows}x{self.ne00} ({self.nbytes} bytes)>"


class TensorTraits:
    """``ggml::cpu::repack::tensor_traits<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>``."""

    def __init__(self, type_: int, param_type: int, name: str):
        self.type = type_
        # the layout / kernel that computes it (Q5_0 weights are expanded to Q8_0's repacked layout)
        self.kernel_type = GGML_TYPE_Q8_0 if type_ == GGML_TYPE_Q5_0 else type_
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
        ne = s1._q[2:5].tolist()               # src1->ne[0..2]
        return _work_size(self.type, ne[0], ne[1] * ne[2])

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
        if self.type in K_TYPES:
            self._forward_mul_mat_kq(params, op, rw, wdata)
            return
        need = int(fk.mmq_layout(ne10, ne11 * ne12)[4])
        if wdata is None or wdata.nbytes < need:
            raise GGMLError(f"repack mul_mat: work buffer of {0 if wdata is None else wdata.nbytes} bytes, "
                            f"needs {need}")
        w = wdata.ctypes.data
        qtype = self.type if self.type == GGML_TYPE_Q5_0 else self.kernel_type     # mmq_chunk picks Q5_0's layout
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
                             ne10, w, ne11 * ne12, int(src0.data), int(src0.nb[1]))
            current = tp.chunk_add(1) if tp is not None else current + nth

    def _forward_mul_mat_kq(self, params, op: Tensor, rw, wdata) -> None:
        """forward_mul_mat for Q4_K / Q5_0 / Q6_K: the same steps, the kernels of fast/kquants.py."""
        src0, src1 = op.src[0], op.src[1]
        ne00, ne01 = int(src0.ne[0]), int(src0.ne[1])
        ne10, ne11, ne12 = (int(v) for v in src1.ne[:3])
        nb11, nb12 = int(src1.nb[1]), int(src1.nb[2])
        nb1, nb2 = int(op.nb[1]), int(op.nb[2])
        ith, nth = params.ith, params.nth
        need = int(kq.kq_work_size(self.type, ne10, ne11 * ne12))
        if wdata is None or wdata.nbytes < need:
            raise GGMLError(f"repack mul_mat: work buffer of {0 if wdata is None else wdata.nbytes} bytes, "
                            f"needs {need}")
        if int(src1.nb[0]) != 4:
            raise GGMLError("repack mul_mat: src1 rows must be contiguous float32")
        w = wdata.ctypes.data
        kq.kq_quantize(self.type, int(src1.data), ne10, ne11, ne12, nb11, nb12, w, ith, nth)
        tp = params.threadpool
        nchunk0, dr0 = kq.kq_nchunk(ne01, nth)
        if ith == 0 and tp is not None:
            tp.chunk_set(nth)
        params.barrier()
        xq = rw.qs.ctypes.data
        current = ith
        while current < nchunk0 * ne12:
            s, e = kq.kq_chunk_rows(current, nchunk0, dr0, ne01)
            if s < e:
                if trace.active:
                    trace.emit("cpu.chunk", ith=ith, node=op.name, chunk=current, ir0=(int(s), int(e)),
                               ir1=(0, ne11), repack=self.name)
                kq.kq_chunk(self.type, xq, ne00, s, e, int(op.data), nb1, nb2, current // nchunk0, ne11, ne10, w)
            current = tp.chunk_add(1) if tp is not None else current + nth

    # ---- repack (tensor_traits_base::repack)
    def repack(self, t: Tensor, data: np.ndarray, empty=np.empty) -> RepackedWeight:
        """The repacked copy of ``t``'s ggml blocks ``data``; ``empty`` allocates the arrays of the compiled
        repack (``RepackArena.empty`` for a buffer's weights)."""
        rows, ne00 = int(t.ne[1]), int(t.ne[0])
        if self.type in K_TYPES:
            raw = np.ascontiguousarray(np.asarray(data).view(np.uint8)[:rows * Q.row_size(self.type, ne00)])
            if self.type == GGML_TYPE_Q4_K:
                qs = repack_q4_K_to_q4_K_8_bl(raw.view(Q.BLOCK_DTYPES[self.type]).reshape(rows, -1)).view(np.uint8)
            else:
                qs = raw.copy()                  # not repacked by ggml on AVX2: the rows as they are
            return RepackedWeight(self, qs, np.zeros(0, np.uint8), None, rows, ne00)
        blocks = np.ascontiguousarray(data).view(Q.BLOCK_DTYPES[self.type]).reshape(rows, ne00 // 32)
        if self.type == GGML_TYPE_Q5_0:
            blocks = q5_0_as_q8_0(blocks)
        return repack_blocks(self, blocks, rows, ne00, empty)


def _qs_words(blocks: np.ndarray):
    """The blocks' 16 quant bytes as 4 uint32 words each, (rows, nb, 4), viewing the same memory -- or None when the
    quants do not sit on 4-byte boundaries (Q4_0's 18-byte blocks)."""
    off = blocks.dtype.fields["qs"][1]
    size = blocks.dtype.itemsize
    base = blocks.__array_interface__["data"][0]
    if (size % 4 or off % 4 or base % 4 or blocks.strides[-1] != size
            or blocks.strides[0] != size * blocks.shape[1]):
        return None
    words = np.frombuffer(blocks, np.uint32) if blocks.flags.c_contiguous else None
    if words is None:
        return None
    return words.reshape(blocks.shape[0], blocks.shape[1], size // 4)[:, :, off // 4:off // 4 + 4]


def repack_blocks(traits: TensorTraits, blocks: np.ndarray, rows: int, ne00: int, empty=np.empty) -> RepackedWeight:
    """ggml blocks (rows, nb) -> the 8-row interleaved layout the compiled kernels read: the compiled
    ``fast.kernels.repack_blocks_8x4`` for C-contiguous blocks of rows in groups of 8 (every weight of a model
    file), else NumPy's transposes (``repack_blocks_numpy``). The compiled loop reads a word at a time: SmolLM2's
    210 Q4_1 weights (66 MB) in 13 ms against NumPy's 24-26 ms with the quants moved as 4-byte words (its Q8_0 /
    Q4_0 transposes move single bytes: ~3x slower still). Same bytes (tests/test_fast_path.py)."""
    if not blocks.flags.c_contiguous or blocks.shape != (rows, ne00 // 32) or rows % NB_COLS:
        return repack_blocks_numpy(traits, blocks, rows, ne00)
    return repack_blocks_compiled(traits, blocks, rows, ne00, empty)


def repack_blocks_compiled(traits: TensorTraits, blocks: np.ndarray, rows: int, ne00: int,
                           empty=np.empty) -> RepackedWeight:
    """``repack_blocks`` by ``fast.kernels.repack_blocks_8x4`` (C-contiguous blocks, rows a multiple of 8), into
    arrays from ``empty``."""
    g, nb = rows // NB_COLS, ne00 // 32
    dt = blocks.dtype
    qs_off, qs_len = dt.fields["qs"][1], dt.fields["qs"][0].itemsize
    is_q4_1 = traits.type == GGML_TYPE_Q4_1
    n_words = qs_len // INTER_SIZE
    qs = empty((g, nb, n_words, NB_COLS), np.uint32)
    d = empty((g, nb, NB_COLS), np.uint16)
    m = empty((g, nb, NB_COLS), np.uint16) if is_q4_1 else d
    # C-contiguous (checked by repack_blocks), read in place: `blocks` outlives the call
    fk.repack_blocks_8x4(blocks.ctypes.data, rows, nb * dt.itemsize, nb, dt.itemsize, qs_off, n_words,
                         dt.fields["d"][1], dt.fields["m"][1] if is_q4_1 else -1, qs, d, m)
    if not SCALES_F16:
        d = Q.fp16_to_fp32(d)                                            # exact
        m = Q.fp16_to_fp32(m) if is_q4_1 else None
    return RepackedWeight(traits, qs.reshape(-1).view(np.uint8), d.reshape(-1),
                          m.reshape(-1) if is_q4_1 else None, rows, ne00)


def repack_blocks_numpy(traits: TensorTraits, blocks: np.ndarray, rows: int, ne00: int) -> RepackedWeight:
    """``repack_blocks`` with NumPy transposes (the reference the compiled repack is checked against)."""
    g, nb = rows // NB_COLS, ne00 // 32

    def scales(field):
        v = blocks[field].view(np.uint16)                                # (rows, nb) fp16 bits
        if not SCALES_F16:
            v = Q.fp16_to_fp32(v)                                        # exact
        return np.ascontiguousarray(v.reshape(g, NB_COLS, nb).transpose(0, 2, 1))
    d = scales("d")
    m = None
    if traits.kernel_type == GGML_TYPE_Q8_0:
        qs = blocks["qs"].view(np.uint8).reshape(g, NB_COLS, nb, 8, INTER_SIZE)
        qs = np.ascontiguousarray(qs.transpose(0, 2, 3, 1, 4))          # (g, nb, chunk, row, 4)
    else:
        qs = _qs_words(blocks)
        if qs is not None:    # the same bytes moved 4 at a time (one uint32 per row and step): ~4x faster
            qs = np.ascontiguousarray(qs.reshape(g, NB_COLS, nb, 4).transpose(0, 2, 3, 1)).view(np.uint8)
        else:
            qs = blocks["qs"].reshape(g, NB_COLS, nb, 4, INTER_SIZE)    # 16 bytes: lo nibble j, hi nibble j+16
            qs = np.ascontiguousarray(qs.transpose(0, 2, 3, 1, 4))
        if traits.type == GGML_TYPE_Q4_1:
            m = scales("m")
    return RepackedWeight(traits, qs.reshape(-1), d.reshape(-1), None if m is None else m.reshape(-1), rows, ne00)


def q5_0_as_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q5_0 blocks -> Q8_0 blocks with the same d and the int8 levels q - 16 (what the AVX2 kernel multiplies)."""
    u = Q.unpack_blocks(GGML_TYPE_Q5_0, blocks.reshape(-1))
    out = np.zeros(blocks.size, Q.BLOCK_DTYPES[GGML_TYPE_Q8_0])
    out["d"] = blocks["d"].reshape(-1)
    out["qs"] = (u["q"] - 16).astype(np.int8)
    return out.reshape(blocks.shape)


_TRAITS_BY_ADDR: dict[int, TensorTraits] = {}
_TRAITS: dict[int, TensorTraits] = {}


def _traits_for_type(t: int) -> TensorTraits:
    if t not in _TRAITS:
        name = {GGML_TYPE_Q4_0: "q4_0_8x4_q8_0", GGML_TYPE_Q4_1: "q4_1_8x4_q8_1", GGML_TYPE_Q8_0: "q8_0_8x4_q8_0",
                GGML_TYPE_Q4_K: "q4_K_8x8_q8_K", GGML_TYPE_Q5_0: "q5_0_8x4_q8_0", GGML_TYPE_Q6_K: "q6_K_rows_q8_K"}[t]
        param = {GGML_TYPE_Q4_1: C.GGML_TYPE_Q8_1, GGML_TYPE_Q4_K: GGML_TYPE_Q8_K,
                 GGML_TYPE_Q6_K: GGML_TYPE_Q8_K}.get(t, C.GGML_TYPE_Q8_0)
        _TRAITS[t] = TensorTraits(t, param, name)
    return _TRAITS[t]


_REPACK_TYPES = frozenset((GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_Q5_0) + K_TYPES)


def get_optimal_repack_type(cur: Tensor):
    """ggml_repack_get_optimal_repack_type: the traits for this weight, or None (then it is not repacked)."""
    if fk is None:
        return None
    type_ = cur._w.item(_W_TYPE)
    if type_ not in _REPACK_TYPES:
        return None
    ne0, ne1, ne2, ne3 = cur.ne.tolist()
    # (ggml_n_dims(cur) > 2: ne[2] or ne[3] above 1, from the ne already read)
    if ne1 % NB_COLS != 0 or ne0 % Q.blck_size(type_) != 0 or ne2 > 1 or ne3 > 1:
        return None
    return _traits_for_type(type_)


@functools.lru_cache(maxsize=256)
def _work_size(type_: int, ne10: int, nrows1: int) -> int:
    """The repacked MUL_MAT's work buffer: src1 quantized to the weight's vec-dot layout (a function of the weight
    type and src1's row length and row count only; the planner and the compiler ask it for every MUL_MAT node)."""
    if type_ in K_TYPES:
        return int(kq.kq_work_size(type_, ne10, nrows1))
    # the compiled layout's own Python (five integer expressions): called from here, the compiled one would first
    # load its machine code from Numba's cache -- ~1.5 ms of a process's first prompt, in ggml_graph_plan
    return int(_MMQ_LAYOUT(ne10, nrows1)[4])


# (the jitted function's ``py_func``; the function itself where Numba's JIT is disabled)
_MMQ_LAYOUT = getattr(fk.mmq_layout, "py_func", fk.mmq_layout) if fk is not None else None


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


# a CPU_REPACK buffer -> the arena its weights' repacked arrays are carved from
_ARENAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _repack_buffer_set_tensor(buffer, tensor: Tensor, data, offset: int, size: int) -> None:
    if offset != 0 or size != nbytes(tensor):
        raise GGMLError("CPU_REPACK set_tensor: GGML_ASSERT(offset == 0 && size == ggml_nbytes(tensor))")
    src = backend._as_bytes(data)[:size]
    # ggviz keeps ggml's own bytes in the buffer (see the module docstring) ...
    backend._bytes_at(tensor.data, size)[:] = src
    traits = tensor_traits_of(tensor)
    if traits is None:
        return
    # ... and the repacked copy beside it, in the buffer's arena
    arena = _ARENAS.get(buffer)
    if arena is None:
        arena = _ARENAS[buffer] = RepackArena()
    tensor.py_extra = traits.repack(tensor, src, arena.empty)
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
        return self.supports_op_reads(dev, op)[0]

    def supports_op_reads(self, dev, op: Tensor):
        """``supports_op``'s answer, and (ggviz: ggml_backend_device_i.supports_op_reads) the tensors whose shape it
        read: a MUL_MAT's weight when it has a buffer (n_dims, get_optimal_repack_type); the rest reads op codes,
        types and buffers only."""
        # (op->src[0], op->src[1] and their buffers read from the structs' words: the split asks this of every
        # MUL_MAT node it places by its weight)
        if op._w.item(_W_OP) == C.GGML_OP_MUL_MAT:
            q = op._q
            a0 = q.item(_Q_SRC)
            s0, s1 = tensor_at(a0), tensor_at(q.item(_Q_SRC + 1))
            b0 = s0._q.item(_Q_BUFFER)
            if not b0:
                return False, ()
            if (n_dims(s0) == 2 and backend.buffer_at(b0).buft is repack_buffer_type()
                    and get_optimal_repack_type(s0) is not None):
                b1 = s1._q.item(_Q_BUFFER)
                if b1 and not backend.backend_buft_is_host(backend.buffer_at(b1).buft):
                    return False, (a0,)
                return s1._w.item(_W_TYPE) == GGML_TYPE_F32, (a0,)
            return False, (a0,)
        return False, ()

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


def available() -> bool:
    """Whether this build offers CPU_REPACK: the compiled kernels loaded and GGVIZ_NO_REPACK is not set."""
    return fk is not None and not repack_disabled()


def in_use() -> bool:
    """Whether the CPU_REPACK buffer type exists yet (until a weight is placed there, no op can be its)."""
    return _repack_buft is not None


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
# Q4_K: block_q4_Kx8 (repack.cpp's make_block_q4_Kx8) and the AVX2 q4_K_8x8_q8_K kernels, faithful (NumPy)
# =====================================================================================================================
# ggml on AVX2 repacks Q4_K weights with ne1 % 8 == 0 to q4_K_8x8_q8_K (ggml_repack_get_optimal_repack_type):
# src1 rows in groups of 4 are quantized by ggml_quantize_mat_q8_K_4x8 and go through ggml_gemm_q4_K_8x8_q8_K, the
# last ne11 % 4 rows by quantize_row_q8_K and ggml_gemv_q4_K_8x8_q8_K. Neither Q5_0, Q6_K nor Q8_0 is repacked on
# AVX2 (only on NEON), so those MUL_MATs run the plain vec_dot kernels (cpu/quants.py).

Q4_KX8_DTYPE = np.dtype([("d", "<u2", (8,)), ("dmin", "<u2", (8,)), ("scales", "u1", (96,)), ("qs", "u1", (1024,))])
Q8_KX4_DTYPE = np.dtype([("d", "<f4", (4,)), ("qs", "i1", (1024,)), ("bsums", "<i2", (64,))])


def repack_q4_K_to_q4_K_8_bl(blocks: np.ndarray) -> np.ndarray:
    """repack_q4_K_to_q4_K_8_bl(interleave 8): Q4_K blocks (rows, nb), rows % 8 == 0 -> block_q4_Kx8 (rows/8 * nb).

    Per group of 8 rows and super-block: the 8 d and 8 dmin; per sub-block s the 8 rows' 6-bit scales and mins packed
    as one Q4_K scales field (12 bytes at 12*s); the quants 8 bytes at a time, row after row
    (qs[64c + 8r .. +8] = row r's qs[8c .. 8c+8])."""
    rows, nb = blocks.shape
    if rows % NB_COLS:
        raise ValueError(f"q4_K_8x8 repack needs a multiple of 8 rows, got {rows}")
    g = rows // NB_COLS
    b = blocks.reshape(g, NB_COLS, nb)
    out = np.zeros((g, nb), Q4_KX8_DTYPE)
    out["d"] = b["d"].view(np.uint16).transpose(0, 2, 1)
    out["dmin"] = b["dmin"].view(np.uint16).transpose(0, 2, 1)
    sc, mn = Q._get_scale_min_k4(b["scales"].reshape(-1, 12))               # (g*8*nb, 8 sub-blocks)
    sc = sc.reshape(g, NB_COLS, nb, 8).transpose(0, 2, 3, 1)                # (g, nb, sub-block, row)
    mn = mn.reshape(g, NB_COLS, nb, 8).transpose(0, 2, 3, 1)
    out["scales"] = Q._pack_scale_min_k4(sc.reshape(-1, 8), mn.reshape(-1, 8)).reshape(g, nb, 96)
    out["qs"] = b["qs"].reshape(g, NB_COLS, nb, 16, 8).transpose(0, 2, 3, 1, 4).reshape(g, nb, 1024)
    return out.reshape(-1)


def quantize_mat_q8_K_4x8(x: np.ndarray) -> np.ndarray:
    """ggml_quantize_mat_q8_K_4x8 (AVX2): 4 float32 rows (4, k) -> block_q8_Kx4 (k/256,).

    The numbers are quantize_row_q8_K_ref's except for the scale's sign: the AVX2 code takes -127/max when any value
    equals +max, the reference the sign of the first value of largest magnitude. Quants are interleaved 8 at a time
    (qs[32c + 8r ..] = row r's quants 8c..8c+7) and bsums[16k + 4r + j] = row r's bsums[4k + j]."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] != 4 or x.shape[1] % 256:
        raise ValueError(f"quantize_mat_q8_K_4x8 needs (4, k) rows with k % 256 == 0, got {x.shape}")
    nb = x.shape[1] // 256
    v = x.reshape(4, nb, 256)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        amax = np.abs(v).max(-1)
        haspos = (v == amax[..., None]).any(-1)
        iscale = np.where(amax != 0, np.where(haspos, np.float32(-127.0), np.float32(127.0)) / amax, np.float32(0))
        iscale = iscale.astype(np.float32)
        d = np.where(amax != 0, np.float32(1.0) / iscale, np.float32(0)).astype(np.float32)
        r = np.rint(v * iscale[..., None])
        q = np.where(np.isnan(r), -128, np.clip(r, -128, 127)).astype(np.int8)
    out = np.zeros(nb, Q8_KX4_DTYPE)
    out["d"] = d.T
    out["qs"] = q.reshape(4, nb, 32, 8).transpose(1, 2, 0, 3).reshape(nb, 1024)
    bs = q.astype(np.int16).reshape(4, nb, 16, 16).sum(-1, dtype=np.int16)   # (row, nb, 16)
    out["bsums"] = bs.reshape(4, nb, 4, 4).transpose(1, 2, 0, 3).reshape(nb, 64)
    return out


def _q8_Kx4_rows(y4: np.ndarray):
    """block_q8_Kx4 (nb,) -> the 4 rows' d (4, nb), qs (4, nb*256) int, bsums (4, nb, 16)."""
    nb = y4.shape[0]
    d = y4["d"].T
    qs = y4["qs"].reshape(nb, 32, 4, 8).transpose(2, 0, 1, 3).reshape(4, nb * 256)
    bs = y4["bsums"].reshape(nb, 4, 4, 4).transpose(2, 0, 1, 3).reshape(4, nb, 16)
    return d, qs, bs


def _q4_K_parts(w: np.ndarray):
    """Q4_K rows (M, row bytes) -> d, dmin (M, nb) float32, sc*q levels (M, nb, 8, 32) float64, mins (M, nb, 8)."""
    blocks = Q.as_blocks(GGML_TYPE_Q4_K, np.ascontiguousarray(w))
    M, nb = blocks.shape
    u = Q.unpack_blocks(GGML_TYPE_Q4_K, blocks.reshape(-1))
    q = u["q"].reshape(M, nb, 8, 32).astype(np.float64) * u["sc"].reshape(M, nb, 8, 1)
    return (u["d"].reshape(M, nb), u["dmin"].reshape(M, nb), q, u["mn"].reshape(M, nb, 8).astype(np.float64))


def gemv_q4_K_8x8_q8_K(w: np.ndarray, dy: np.ndarray, qy: np.ndarray, bsy: np.ndarray) -> np.ndarray:
    """ggml_gemv_q4_K_8x8_q8_K (AVX2), per output: Q4_K rows w (M, bytes) . q8_K rows (d (N, nb), qs (N, nb*256),
    bsums (N, nb, 16)) -> (N, M) float32.

    One float lane per weight row: per super-block the exact int32 sum over its 8 sub-blocks of scale*dot and of
    min*bsum32, then ``acc = fmadd((float) isum, d_w*d_y, acc)``, ``acc_min = fmadd((float) imin, dmin_w*d_y,
    acc_min)``; the result is acc - acc_min."""
    dx, mx, X, mins = _q4_K_parts(w)
    N, nb = dy.shape
    Y = qy.reshape(N, nb, 256).astype(np.float64)
    B = bsy.reshape(N, nb, 8, 2).astype(np.float64).sum(-1)                  # bsums of 32
    acc = np.zeros((N, X.shape[0]), np.float32)
    acc_min = np.zeros_like(acc)
    with np.errstate(over="ignore", invalid="ignore"):
        for b in range(nb):
            isum = Y[:, b] @ X[:, b].reshape(-1, 256).T
            imin = B[:, b] @ mins[:, b].T
            acc = fma32(isum.astype(np.float32), dx[None, :, b] * dy[:, b, None], acc)
            acc_min = fma32(imin.astype(np.float32), mx[None, :, b] * dy[:, b, None], acc_min)
    return acc - acc_min


def gemm_q4_K_8x8_q8_K(w: np.ndarray, dy: np.ndarray, qy: np.ndarray, bsy: np.ndarray) -> np.ndarray:
    """ggml_gemm_q4_K_8x8_q8_K (AVX2), per output: as the gemv but the float accumulation is per pair of sub-blocks
    (4 fmadds per super-block, each with the int32 sum of 2 sub-blocks), for both the scales and the mins."""
    dx, mx, X, mins = _q4_K_parts(w)
    N, nb = dy.shape
    Y = qy.reshape(N, nb, 4, 64).astype(np.float64)
    B = bsy.reshape(N, nb, 4, 2, 2).astype(np.float64).sum(-1)               # (N, nb, pair, 2 sub-blocks)
    Xp = X.reshape(X.shape[0], nb, 4, 64)
    mp = mins.reshape(-1, nb, 4, 2)
    acc = np.zeros((N, X.shape[0]), np.float32)
    acc_min = np.zeros_like(acc)
    with np.errstate(over="ignore", invalid="ignore"):
        for b in range(nb):
            ds = dx[None, :, b] * dy[:, b, None]
            dm = mx[None, :, b] * dy[:, b, None]
            for sb in range(4):
                isum = Y[:, b, sb] @ Xp[:, b, sb].T
                acc = fma32(isum.astype(np.float32), ds, acc)
                imin = B[:, b, sb] @ mp[:, b, sb].T
                acc_min = fma32(imin.astype(np.float32), dm, acc_min)
    return acc - acc_min


def mul_mat_q4_K_8x8(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """What tensor_traits<block_q4_K, 8, 8, Q8_K>::forward_mul_mat computes for one plane: Q4_K weights w (M, bytes),
    M % 8 == 0, times float32 src1 rows x (N, K) -> (N, M). Rows 4i..4i+3 (i < N // 4) through quantize_mat_q8_K_4x8
    + gemm, the last N % 4 rows through quantize_row_q8_K + gemv. (Chunking over M cannot change a bit: every output
    is its own lane.)"""
    x = np.ascontiguousarray(x, dtype=np.float32)
    N, K = x.shape
    nb = K // 256
    out = np.empty((N, w.shape[0]), np.float32)
    n4 = N - N % 4
    if n4:
        d, q, bs = [], [], []
        for i in range(0, n4, 4):
            di, qi, bi = _q8_Kx4_rows(quantize_mat_q8_K_4x8(x[i:i + 4]))
            d.append(di)
            q.append(qi)
            bs.append(bi)
        out[:n4] = gemm_q4_K_8x8_q8_K(w, np.concatenate(d), np.concatenate(q), np.concatenate(bs))
    if N > n4:
        y = Q.quantize_row_ref(GGML_TYPE_Q8_K, x[n4:]).view(Q.BLOCK_DTYPES[GGML_TYPE_Q8_K]).reshape(N - n4, nb)
        out[n4:] = gemv_q4_K_8x8_q8_K(w, y["d"], y["qs"].reshape(N - n4, -1), y["bsums"])
    return out
