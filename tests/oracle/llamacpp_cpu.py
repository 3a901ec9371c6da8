"""The oracle for the K-quant kernels: the ggml that the installed llama_cpp (llama-cpp-python 0.3.36) ships.

llama_cpp/lib/libggml-{base,cpu}.so are the exact AVX2 build ggviz must match (ggml 0.25.3, vendored by
llama-cpp-python 0.3.36). libggml-python's ggml (tests/oracle/quant_lib.py) has the same sonames, so the two cannot
share a process: every call here runs one child Python that loads only llama_cpp's libraries (``python -m
tests.oracle.llamacpp_cpu IN.npz OUT.npz``), takes its inputs from an .npz and writes its results to another.

Jobs (``run(jobs)``: a list of dicts, results in the same order):

* ``{"op": "vec_dot", "type": t, "x": uint8 (M, rb), "y": uint8 (N, rb_vd), "n": n}`` -> float32 (N, M),
  type_traits_cpu[t].vec_dot (the AVX2 ggml_vec_dot_*);
* ``{"op": "from_float", "type": t, "x": float32 (R, n)}`` -> uint8 (R, row_size), type_traits_cpu[t].from_float;
* ``{"op": "to_float", "type": t, "x": uint8 bytes, "n": n}`` -> float32 (n,), type_traits[t].to_float (GET_ROWS);
* ``{"op": "quantize_mat_q8_K_4x8", "x": float32 (4, n)}`` -> uint8 block_q8_Kx4 bytes;
* ``{"op": "gemv_q4_K_8x8" / "gemm_q4_K_8x8", "vx": repacked bytes, "vy": q8_K / q8_Kx4 bytes, "n", "nr", "nc"}``
  -> float32 (nr, nc) (``ggml_gemv_q4_K_8x8_q8_K`` / ``ggml_gemm_q4_K_8x8_q8_K``, bs = nc);
* ``{"op": "argsort" / "argsort_top_k" / "top_k", "x": float32 (R, n), "arg": order or k, "n_threads": k}`` -> int32
  (R, ne0): ``ggml_argsort(ctx, x, order)`` / ``ggml_argsort_top_k(ctx, x, k)`` / ``ggml_top_k(ctx, x, k)`` computed by
  ggml's CPU backend;
* ``{"op": "mul_mat", "type": t, "w": uint8 (M, rb), "x": float32 (N, K), "n_threads": k, "repack": bool}``
  -> {"out": float32 (N, M), "repacked": the weight's bytes as the buffer holds them}: one MUL_MAT graph computed by
  ggml's CPU backend, the weight in the CPU_REPACK buffer type (``repack``) or a plain CPU buffer; with ``"reps": r``
  also "times": the seconds of r more graph_computes.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import time
from ctypes import c_bool, c_float, c_int, c_int64, c_size_t, c_void_p

import numpy as np

_VEC_DOT_T = ctypes.CFUNCTYPE(None, c_int, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_int)
_FROM_FLOAT_T = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_int64)


def libdir() -> str | None:
    try:
        import importlib.util
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    return d if os.path.exists(os.path.join(d, "libggml-cpu.so")) else None


def available() -> bool:
    return libdir() is not None


def run(jobs: list, timeout: float = 300) -> list:
    """Run the jobs in a child process that loads only llama_cpp's ggml; returns their results."""
    with tempfile.TemporaryDirectory(prefix="ggviz_oracle_") as td:
        fin, fout = os.path.join(td, "in.npz"), os.path.join(td, "out.npz")
        arrs = {}
        for i, job in enumerate(jobs):
            for k, v in job.items():
                arrs[f"{i}:{k}"] = np.asarray(v)
        np.savez(fin, **arrs)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        p = subprocess.run([sys.executable, "-m", "tests.oracle.llamacpp_cpu", fin, fout], cwd=root,
                           capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"llama_cpp oracle failed ({p.returncode}): {p.stderr[-2000:]}")
        with np.load(fout) as z:
            res: list = [None] * len(jobs)
            for key in z.files:
                i, _, k = key.partition(":")
                if k == "":
                    res[int(i)] = z[key]
                else:
                    res[int(i)] = res[int(i)] or {}
                    res[int(i)][k] = z[key]
            return res


# ---------------------------------------------------------------------------------------------------------------
# the child
# ---------------------------------------------------------------------------------------------------------------

class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", c_size_t), ("mem_buffer", c_void_p), ("no_alloc", c_bool)]


class _Traits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", c_int64), ("blck_size_interleave", c_int64),
                ("type_size", c_size_t), ("is_quantized", c_bool), ("to_float", c_void_p), ("from_float_ref", c_void_p)]


class _TraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", c_void_p), ("vec_dot", c_void_p), ("vec_dot_type", c_int), ("nrows", c_int64)]


def _load():
    d = libdir()
    base = ctypes.CDLL(os.path.join(d, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    sig = {
        (base, "ggml_row_size"): (c_size_t, [c_int, c_int64]),
        (base, "ggml_get_type_traits"): (ctypes.POINTER(_Traits), [c_int]),
        (base, "ggml_init"): (c_void_p, [_InitParams]),
        (base, "ggml_free"): (None, [c_void_p]),
        (base, "ggml_new_tensor_2d"): (c_void_p, [c_void_p, c_int, c_int64, c_int64]),
        (base, "ggml_mul_mat"): (c_void_p, [c_void_p, c_void_p, c_void_p]),
        (base, "ggml_argsort"): (c_void_p, [c_void_p, c_void_p, c_int]),
        (base, "ggml_argsort_top_k"): (c_void_p, [c_void_p, c_void_p, c_int]),
        (base, "ggml_top_k"): (c_void_p, [c_void_p, c_void_p, c_int]),
        (base, "ggml_new_graph"): (c_void_p, [c_void_p]),
        (base, "ggml_build_forward_expand"): (None, [c_void_p, c_void_p]),
        (base, "ggml_get_data"): (c_void_p, [c_void_p]),
        (base, "ggml_nbytes"): (c_size_t, [c_void_p]),
        (base, "ggml_backend_alloc_ctx_tensors_from_buft"): (c_void_p, [c_void_p, c_void_p]),
        (base, "ggml_backend_tensor_set"): (None, [c_void_p, c_void_p, c_size_t, c_size_t]),
        (base, "ggml_backend_cpu_buffer_type"): (c_void_p, []),
        (base, "ggml_backend_graph_compute"): (c_int, [c_void_p, c_void_p]),
        (base, "ggml_backend_buffer_free"): (None, [c_void_p]),
        (base, "ggml_backend_free"): (None, [c_void_p]),
        (cpu, "ggml_cpu_init"): (None, []),
        (cpu, "ggml_get_type_traits_cpu"): (ctypes.POINTER(_TraitsCpu), [c_int]),
        (cpu, "ggml_backend_cpu_init"): (c_void_p, []),
        (cpu, "ggml_backend_cpu_set_n_threads"): (None, [c_void_p, c_int]),
        (cpu, "_Z35ggml_backend_cpu_repack_buffer_typev"): (c_void_p, []),
        (cpu, "ggml_quantize_mat_q8_K_4x8"): (None, [c_void_p, c_void_p, c_int64]),
        (cpu, "ggml_gemv_q4_K_8x8_q8_K"): (None, [c_int, c_void_p, c_size_t, c_void_p, c_void_p, c_int, c_int]),
        (cpu, "ggml_gemm_q4_K_8x8_q8_K"): (None, [c_int, c_void_p, c_size_t, c_void_p, c_void_p, c_int, c_int]),
    }
    for (lib, name), (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    cpu.ggml_cpu_init()
    return base, cpu


def _p(a: np.ndarray) -> int:
    return a.ctypes.data


def _job(base, cpu, job: dict):
    op = str(job["op"])
    if op == "vec_dot":
        t, n = int(job["type"]), int(job["n"])
        x, y = np.ascontiguousarray(job["x"], np.uint8), np.ascontiguousarray(job["y"], np.uint8)
        fn = _VEC_DOT_T(cpu.ggml_get_type_traits_cpu(t).contents.vec_dot)
        out = np.empty((y.shape[0], x.shape[0]), np.float32)
        s = c_float()
        for j in range(y.shape[0]):
            for i in range(x.shape[0]):
                fn(n, ctypes.addressof(s), 0, _p(x[i]), 0, _p(y[j]), 0, 1)
                out[j, i] = s.value
        return out
    if op == "from_float":
        t = int(job["type"])
        x = np.ascontiguousarray(job["x"], np.float32)
        rs = base.ggml_row_size(t, x.shape[1])
        out = np.zeros((x.shape[0], rs), np.uint8)
        fn = _FROM_FLOAT_T(cpu.ggml_get_type_traits_cpu(t).contents.from_float)
        for r in range(x.shape[0]):
            fn(_p(x[r]), _p(out[r]), x.shape[1])
        return out
    if op == "to_float":
        t, n = int(job["type"]), int(job["n"])
        x = np.ascontiguousarray(job["x"], np.uint8)
        out = np.empty(n, np.float32)
        _FROM_FLOAT_T(base.ggml_get_type_traits(t).contents.to_float)(_p(x), _p(out), n)
        return out
    if op == "quantize_mat_q8_K_4x8":
        x = np.ascontiguousarray(job["x"], np.float32)
        k = x.shape[1]
        out = np.zeros((k // 256) * (16 + 1024 + 128), np.uint8)
        cpu.ggml_quantize_mat_q8_K_4x8(_p(x), _p(out), k)
        return out
    if op in ("gemv_q4_K_8x8", "gemm_q4_K_8x8"):
        n, nr, nc = int(job["n"]), int(job["nr"]), int(job["nc"])
        vx, vy = np.ascontiguousarray(job["vx"], np.uint8), np.ascontiguousarray(job["vy"], np.uint8)
        out = np.zeros((nr, nc), np.float32)
        fn = cpu.ggml_gemv_q4_K_8x8_q8_K if op.startswith("gemv") else cpu.ggml_gemm_q4_K_8x8_q8_K
        fn(n, _p(out), nc, _p(vx), _p(vy), nr, nc)
        return out
    if op == "mul_mat":
        t, nth = int(job["type"]), int(job["n_threads"])
        w = np.ascontiguousarray(job["w"], np.uint8)
        x = np.ascontiguousarray(job["x"], np.float32)
        M, (N, K) = w.shape[0], x.shape
        ctx_w = base.ggml_init(_InitParams(1 << 20, None, True))
        tw = base.ggml_new_tensor_2d(ctx_w, t, K, M)
        buft = cpu._Z35ggml_backend_cpu_repack_buffer_typev() if bool(job["repack"]) \
            else base.ggml_backend_cpu_buffer_type()
        buf = base.ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, buft)
        assert buf, "could not allocate the weight buffer"
        base.ggml_backend_tensor_set(tw, _p(w), 0, w.nbytes)
        repacked = np.frombuffer(ctypes.string_at(base.ggml_get_data(tw), base.ggml_nbytes(tw)), np.uint8).copy()
        ctx = base.ggml_init(_InitParams(x.nbytes + 4 * M * N + (1 << 22), None, False))
        tx = base.ggml_new_tensor_2d(ctx, 0, K, N)
        ctypes.memmove(base.ggml_get_data(tx), _p(x), x.nbytes)
        to = base.ggml_mul_mat(ctx, tw, tx)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, to)
        be = cpu.ggml_backend_cpu_init()
        cpu.ggml_backend_cpu_set_n_threads(be, nth)
        st = base.ggml_backend_graph_compute(be, gf)
        assert st == 0, f"graph_compute status {st}"
        times = []
        for _ in range(int(job["reps"]) if "reps" in job else 0):      # timing (benchmarks/bench_kquants.py)
            t0 = time.perf_counter()
            base.ggml_backend_graph_compute(be, gf)
            times.append(time.perf_counter() - t0)
        out = np.frombuffer(ctypes.string_at(base.ggml_get_data(to), 4 * M * N), np.float32).reshape(N, M).copy()
        base.ggml_backend_free(be)
        base.ggml_free(ctx)
        base.ggml_backend_buffer_free(buf)
        base.ggml_free(ctx_w)
        return {"out": out, "repacked": repacked, "times": np.asarray(times, np.float64)}
    if op in ("argsort", "argsort_top_k", "top_k"):      # arg: the order (argsort) or k
        x = np.ascontiguousarray(job["x"], np.float32)
        R, n = x.shape
        arg, nth = int(job["arg"]), int(job["n_threads"])
        ctx = base.ggml_init(_InitParams(x.nbytes * 3 + (1 << 20), None, False))
        tx = base.ggml_new_tensor_2d(ctx, 0, n, R)
        ctypes.memmove(base.ggml_get_data(tx), _p(x), x.nbytes)
        to = getattr(base, "ggml_" + op)(ctx, tx, arg)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, to)
        be = cpu.ggml_backend_cpu_init()
        cpu.ggml_backend_cpu_set_n_threads(be, nth)
        st = base.ggml_backend_graph_compute(be, gf)
        assert st == 0, f"graph_compute status {st}"
        ne0 = n if op == "argsort" else arg
        stride = n if op != "top_k" else arg          # argsort_top_k: a view of the argsort's rows
        out = np.frombuffer(ctypes.string_at(base.ggml_get_data(to), 4 * stride * R), np.int32)
        out = out.reshape(R, stride)[:, :ne0].copy()
        base.ggml_backend_free(be)
        base.ggml_free(ctx)
        return out
    raise ValueError(f"unknown oracle op {op!r}")


def _main(fin: str, fout: str) -> None:
    base, cpu = _load()
    with np.load(fin) as z:
        jobs: dict = {}
        for key in z.files:
            i, _, k = key.partition(":")
            jobs.setdefault(int(i), {})[k] = z[key]
    res = {}
    for i in sorted(jobs):
        r = _job(base, cpu, jobs[i])
        if isinstance(r, dict):
            for k, v in r.items():
                res[f"{i}:{k}"] = v
        else:
            res[f"{i}:"] = r
    np.savez(fout, **res)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
