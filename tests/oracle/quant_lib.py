"""Minimal ctypes bindings to the real ggml (the oracle) for the quantisation tests.

Only what tests/test_quants.py needs: ggml_quantize_chunk, the base type traits'
to_float, the CPU type traits (from_float / vec_dot / vec_dot_type / nrows),
ggml_cpu_init and the fp16/bf16 row converters.  Everything takes and returns
NumPy arrays so the tests can compare byte for byte.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

# typedef void (*ggml_to_float_t)  (const void * x, float * y, int64_t k);
_TO_FLOAT_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# typedef void (*ggml_from_float_t)(const float * x, void * y, int64_t k);
_FROM_FLOAT_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
# typedef void (*ggml_vec_dot_t)(int n, float * s, size_t bs, const void * x, size_t bx,
#                                const void * y, size_t by, int nrc);
_VEC_DOT_T = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int)


class _TypeTraits(ctypes.Structure):
    # struct ggml_type_traits (ggml.h)
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


class _TypeTraitsCpu(ctypes.Structure):
    # struct ggml_type_traits_cpu (ggml-cpu.h)
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


@functools.lru_cache(maxsize=None)
def libs():
    """(base, cpu) CDLLs, loaded once; base with RTLD_GLOBAL so cpu resolves against it."""
    import libggml

    libdir = os.path.join(os.path.dirname(libggml.__file__), "lib64")
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)

    base.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    base.ggml_get_type_traits.argtypes = [ctypes.c_int]
    base.ggml_row_size.restype = ctypes.c_size_t
    base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    base.ggml_type_size.restype = ctypes.c_size_t
    base.ggml_type_size.argtypes = [ctypes.c_int]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_void_p]
    for name in ("ggml_fp32_to_fp16_row", "ggml_fp32_to_bf16_row", "ggml_fp32_to_bf16_row_ref",
                 "ggml_fp16_to_fp32_row", "ggml_bf16_to_fp32_row"):
        fn = getattr(base, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    cpu.ggml_cpu_init.restype = None
    cpu.ggml_cpu_init.argtypes = []
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    cpu.ggml_cpu_init()
    return base, cpu


def available() -> bool:
    """True when the oracle library (the libggml-python wheel) can be loaded."""
    try:
        libs()
        return True
    except Exception:  # ImportError, OSError: no wheel / no .so
        return False


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def type_size(t: int) -> int:
    return libs()[0].ggml_type_size(t)


def row_size(t: int, n: int) -> int:
    return libs()[0].ggml_row_size(t, n)


def quantize_chunk(t: int, src: np.ndarray, start: int, nrows: int, n_per_row: int,
                   imatrix: np.ndarray | None = None, dst: np.ndarray | None = None):
    """ggml_quantize_chunk on a float32 buffer; returns (bytes written, dst uint8 buffer)."""
    src = np.ascontiguousarray(src, dtype=np.float32).reshape(-1)
    if dst is None:
        dst = np.zeros((start // n_per_row + nrows) * row_size(t, n_per_row), np.uint8)
    qw = None
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        qw = _ptr(imatrix)
    n = libs()[0].ggml_quantize_chunk(t, _ptr(src), _ptr(dst), start, nrows, n_per_row, qw)
    return n, dst


def to_float(t: int, raw: np.ndarray, n: int) -> np.ndarray:
    """type_traits[t].to_float over n values stored in raw (uint8)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(n, np.float32)
    fn = _TO_FLOAT_T(libs()[0].ggml_get_type_traits(t).contents.to_float)
    fn(_ptr(raw), _ptr(out), n)
    return out


def quantize_row_ref_c(t: int, name: str, x: np.ndarray) -> np.ndarray:
    """The exported ``quantize_row_<name>_ref`` of ggml-base over all of x (float32 (rows, n))."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.shape[0] * row_size(t, x.shape[-1]), np.uint8)
    fn = _FROM_FLOAT_T(ctypes.cast(getattr(libs()[0], f"quantize_row_{name}_ref"), ctypes.c_void_p).value)
    fn(_ptr(x), _ptr(out), x.size)
    return out


def dequantize_row_c(name: str, raw: np.ndarray, n: int) -> np.ndarray:
    """The exported ``dequantize_row_<name>`` of ggml-base (also for types without to_float, e.g. q8_K)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(n, np.float32)
    fn = _TO_FLOAT_T(ctypes.cast(getattr(libs()[0], f"dequantize_row_{name}"), ctypes.c_void_p).value)
    fn(_ptr(raw), _ptr(out), n)
    return out


def traits_cpu(t: int) -> dict:
    tr = libs()[1].ggml_get_type_traits_cpu(t).contents
    return {"from_float": tr.from_float, "vec_dot": tr.vec_dot,
            "vec_dot_type": tr.vec_dot_type, "nrows": tr.nrows}


def from_float_cpu(t: int, x: np.ndarray) -> np.ndarray:
    """CPU type_traits_cpu[t].from_float, row by row: float32 (rows, n) -> uint8 (rows, row_size)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    rs = row_size(t, n)
    # zero-filled so fields a from_float leaves untouched (q8_K bsums of an all-zero block) are 0
    out = np.zeros((rows, rs), np.uint8)
    fn = _FROM_FLOAT_T(traits_cpu(t)["from_float"])
    for r in range(rows):
        fn(_ptr(x[r]), _ptr(out[r]), n)
    return out


def vec_dot_cpu(t: int, x: np.ndarray, y: np.ndarray, n: int) -> np.ndarray:
    """All row.row dot products with the CPU vec_dot of type t: x (M, bytes), y (N, bytes) -> (N, M)."""
    x = np.ascontiguousarray(x, dtype=np.uint8)
    y = np.ascontiguousarray(y, dtype=np.uint8)
    fn = _VEC_DOT_T(traits_cpu(t)["vec_dot"])
    out = np.empty((y.shape[0], x.shape[0]), np.float32)
    s = ctypes.c_float()
    for j in range(y.shape[0]):
        for i in range(x.shape[0]):
            fn(n, ctypes.addressof(s), 0, _ptr(x[i]), 0, _ptr(y[j]), 0, 1)
            out[j, i] = s.value
    return out


def _row_conv(name: str, x: np.ndarray, out_dtype) -> np.ndarray:
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, out_dtype)
    getattr(libs()[0], name)(_ptr(x), _ptr(out), x.size)
    return out


def fp32_to_fp16_row(x: np.ndarray) -> np.ndarray:
    return _row_conv("ggml_fp32_to_fp16_row", np.asarray(x, np.float32), np.uint16)


def fp32_to_bf16_row(x: np.ndarray) -> np.ndarray:
    return _row_conv("ggml_fp32_to_bf16_row", np.asarray(x, np.float32), np.uint16)


def fp32_to_bf16_row_ref(x: np.ndarray) -> np.ndarray:
    return _row_conv("ggml_fp32_to_bf16_row_ref", np.asarray(x, np.float32), np.uint16)


def fp16_to_fp32_row(h: np.ndarray) -> np.ndarray:
    return _row_conv("ggml_fp16_to_fp32_row", np.asarray(h, np.uint16), np.float32)


def bf16_to_fp32_row(h: np.ndarray) -> np.ndarray:
    return _row_conv("ggml_bf16_to_fp32_row", np.asarray(h, np.uint16), np.float32)
