"""One MUL_MAT through the ggml inside llama-cpp-python (AVX2 build, LLAMAFILE = 1), in a process of its own.

    python tests/oracle/llamacpp_mul_mat.py IN.npz OUT.npz

Used by tests/test_sgemm.py as the oracle for llamafile's tinyBLAS. A separate process because that ggml
(libggml-base.so.0, 0.25.3) and the libggml-python 0.20.2 of ggml_lib.py share a soname: loaded into one process,
the second would bind to the first's symbols. IN holds type, m, n, k, heads, kv_heads, permuted, nth, a (raw src0
bytes), b (float32 (heads, n, k)); OUT gets ``out`` (float32 (heads, n, m)). Exit code 3: no such build here.
"""
import ctypes
import importlib.util
import os
import sys

import numpy as np


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _libs():
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    try:
        base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"))
        cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"))
    except OSError:
        return None
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    for name, res, args in (("ggml_init", vp, [_InitParams]), ("ggml_free", None, [vp]),
                            ("ggml_new_tensor_3d", vp, [vp, ctypes.c_int, i64, i64, i64]),
                            ("ggml_get_data", vp, [vp]), ("ggml_mul_mat", vp, [vp, vp, vp]),
                            ("ggml_permute", vp, [vp, vp, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
                            ("ggml_new_graph", vp, [vp]), ("ggml_build_forward_expand", None, [vp, vp])):
        f = getattr(base, name)
        f.restype, f.argtypes = res, args
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    if not (cpu.ggml_cpu_has_llamafile() and cpu.ggml_cpu_has_avx2()):
        return None
    cpu.ggml_cpu_init()
    return base, cpu


def mul_mat(base, cpu, t, m, n, k, heads, kv_heads, permuted, nth, a, b):
    ctx = base.ggml_init(_InitParams(64 << 20, None, False))
    try:
        w = base.ggml_new_tensor_3d(ctx, t, k, m, kv_heads)
        ctypes.memmove(base.ggml_get_data(w), a.ctypes.data, a.nbytes)
        if permuted:
            x = base.ggml_new_tensor_3d(ctx, 0, k, heads, n)
            bb = np.ascontiguousarray(b.transpose(1, 0, 2))
            ctypes.memmove(base.ggml_get_data(x), bb.ctypes.data, bb.nbytes)
            x = base.ggml_permute(ctx, x, 0, 2, 1, 3)
        else:
            x = base.ggml_new_tensor_3d(ctx, 0, k, n, heads)
            ctypes.memmove(base.ggml_get_data(x), b.ctypes.data, b.nbytes)
        y = base.ggml_mul_mat(ctx, w, x)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, y)
        assert cpu.ggml_graph_compute_with_ctx(ctx, gf, nth) == 0
        out = np.empty((heads, n, m), np.float32)
        ctypes.memmove(out.ctypes.data, base.ggml_get_data(y), out.nbytes)
        return out
    finally:
        base.ggml_free(ctx)


def main():
    libs = _libs()
    if libs is None:
        return 3
    z = np.load(sys.argv[1])
    args = [int(z[f]) for f in ("type", "m", "n", "k", "heads", "kv_heads", "permuted", "nth")]
    out = mul_mat(*libs, *args, np.ascontiguousarray(z["a"]), np.ascontiguousarray(z["b"], np.float32))
    np.savez(sys.argv[2], out=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
