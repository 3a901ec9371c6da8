"""The ggml-backend object model in ggviz (ggviz/ggml/backend.py, blas.py, accel.py): registry -> device -> backend.

1. The registry: ggviz is "built" with BLAS and the CPU (in ggml's registration order), the accelerator loads and
   unloads like a backend library; lookups by name (case-insensitive) and type; ``init_best``.
2. The CPU backend against the real ggml (the oracle library has the CPU backend): reg / device names, type,
   description, memory, props and caps, default buffer type, exported functions, and ``supports_op`` on every node
   of the tests/graphs.py graphs plus the cases it rejects (MUL_MAT with an F16 src1 against a Q4_0 weight, CPY
   to IQ2_XXS ...); ``graph_compute`` / graph plans / ``n_threads`` / the abort callback.
3. BLAS: ``supports_op`` as ggml-blas.cpp (contiguous, F32 src1, ne0/ne1/ne10 >= 32, the Hadamard hint, OUT_PROD
   matrices), the host buffer type shared with the CPU, and the results: F32 MUL_MAT within NMSE 1e-10 of a
   float64 reference and of the CPU backend, broadcasting over dims 2/3, a Q4_0 / F16 src0 converted with
   to_float first, OUT_PROD with a plain or transposed src1.
4. The accelerator: its own buffer type and memory (capacity, OOM as NULL + an error log, memory given back when
   a buffer is freed or dropped), not host memory (tensor_set/get, device-to-device cpy_tensor, the counters),
   the configurable op set, CUDA's offload_op rule, events, and compute on device memory bitwise equal to the CPU.
"""
from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest


from tests.graphs import BUILDERS, graph_nodes
from tests.oracle.ggml_lib import available, unavailable_reason
from tests.pairs import nmse, real_ggml

from ggviz import ggml as gg
from ggviz.ggml import accel, blas
from ggviz.ggml import alloc as A
from ggviz.ggml import backend as B
from ggviz.ggml import backend_reg, impl
from ggviz.ggml.cpu import cpu_backend
from ggviz.ggml import quants as Q

F32, F16 = gg.GGML_TYPE_F32, gg.GGML_TYPE_F16
needs_oracle = pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())


# ====================================================================================================
# 1. registry
# ====================================================================================================

def test_registry_lookup_and_accel_loading():
    names = [B.backend_reg_name(backend_reg.backend_reg_get(i)) for i in range(backend_reg.backend_reg_count())]
    assert names[-2:] == ["BLAS", "CPU"]            # ggml_backend_registry(): ..., BLAS, ..., CPU
    assert backend_reg.backend_reg_by_name("cpu") is cpu_backend.backend_cpu_reg() and backend_reg.backend_reg_by_name("nope") is None
    cpu = backend_reg.backend_dev_by_type(B.GGML_BACKEND_DEVICE_TYPE_CPU)
    assert B.backend_dev_name(cpu) == "CPU" and backend_reg.backend_dev_by_name("Cpu") is cpu
    assert B.backend_dev_backend_reg(cpu) is cpu_backend.backend_cpu_reg()
    assert backend_reg.backend_dev_by_type(B.GGML_BACKEND_DEVICE_TYPE_ACCEL) is B.backend_reg_dev_get(blas.backend_blas_reg(), 0)
    be = backend_reg.backend_init_by_name("blas")
    assert B.backend_name(be) == "BLAS" and blas.backend_is_blas(be) and not cpu_backend.backend_is_cpu(be)
    assert B.backend_name(backend_reg.backend_init_by_type(B.GGML_BACKEND_DEVICE_TYPE_CPU)) == "CPU"
    assert backend_reg.backend_init_by_name("ACCEL0") is None
    n_dev = backend_reg.backend_dev_count()
    # the accelerator is a backend "library" loaded at run time: its GPU-type device becomes the best one
    reg = backend_reg.backend_load("accel")
    try:
        assert backend_reg.backend_reg_by_name("ACCEL") is reg and backend_reg.backend_dev_count() == n_dev + B.backend_reg_dev_count(reg)
        best = backend_reg.backend_init_best()
        assert B.backend_name(best) == "ACCEL0" and accel.backend_is_accel(best)
        assert B.backend_dev_type(B.backend_get_device(best)) == B.GGML_BACKEND_DEVICE_TYPE_GPU
    finally:
        backend_reg.backend_unload(reg)
    assert backend_reg.backend_reg_by_name("ACCEL") is None and backend_reg.backend_dev_count() == n_dev
    assert B.backend_name(backend_reg.backend_init_best()) == "CPU"
    assert B.backend_name(None) == "NULL"


# ====================================================================================================
# 2. the CPU backend vs ggml
# ====================================================================================================

class _Caps(ctypes.Structure):
    _fields_ = [("async_", ctypes.c_bool), ("host_buffer", ctypes.c_bool), ("buffer_from_host_ptr", ctypes.c_bool),
                ("events", ctypes.c_bool), ("mmap_support", ctypes.c_bool)]


class _Props(ctypes.Structure):           # struct ggml_backend_dev_props
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p), ("memory_free", ctypes.c_size_t),
                ("memory_total", ctypes.c_size_t), ("type", ctypes.c_int), ("device_id", ctypes.c_char_p),
                ("caps", _Caps)]


@needs_oracle
def test_cpu_device_matches_ggml():
    g = real_ggml()
    rreg, vreg = g.backend_cpu_reg(), cpu_backend.backend_cpu_reg()
    assert B.backend_reg_name(vreg) == g.backend_reg_name(rreg) == "CPU"
    assert B.backend_reg_dev_count(vreg) == g.backend_reg_dev_count(rreg) == 1
    rdev, vdev = g.backend_reg_dev_get(rreg, 0), B.backend_reg_dev_get(vreg, 0)
    assert B.backend_dev_name(vdev) == g.backend_dev_name(rdev)
    assert B.backend_dev_description(vdev) == g.backend_dev_description(rdev)
    assert B.backend_dev_type(vdev) == g.backend_dev_type(rdev) == B.GGML_BACKEND_DEVICE_TYPE_CPU
    free, total = (ctypes.c_size_t * 1)(), (ctypes.c_size_t * 1)()
    g.backend_dev_memory(rdev, ctypes.addressof(free), ctypes.addressof(total))
    assert B.backend_dev_memory(vdev) == (total[0], total[0]) == (free[0], total[0])
    rp = _Props()
    g.backend_dev_get_props(rdev, ctypes.addressof(rp))
    vp = B.backend_dev_get_props(vdev)
    assert (vp.name, vp.description, vp.type, vp.device_id) == (rp.name.decode(), rp.description.decode(), rp.type, None)
    assert [getattr(vp.caps, f) for f, _ in _Caps._fields_] == [getattr(rp.caps, f) for f, _ in _Caps._fields_]
    # buffer type
    rbuft, vbuft = g.backend_dev_buffer_type(rdev), B.backend_dev_buffer_type(vdev)
    assert vbuft is B.backend_cpu_buffer_type() and rbuft == g.backend_cpu_buffer_type()
    assert B.backend_buft_name(vbuft) == g.backend_buft_name(rbuft) == "CPU"
    assert B.backend_buft_get_alignment(vbuft) == g.backend_buft_get_alignment(rbuft)
    assert B.backend_buft_is_host(vbuft) == g.backend_buft_is_host(rbuft)
    assert B.backend_dev_supports_buft(vdev, vbuft) == g.backend_dev_supports_buft(rdev, rbuft) == True  # noqa: E712
    assert B.backend_dev_host_buffer_type(vdev) is None and not g.backend_dev_host_buffer_type(rdev)
    # exported functions
    for name in ("ggml_backend_set_n_threads", "ggml_backend_dev_get_extra_bufts", "ggml_backend_get_features",
                 "ggml_backend_set_abort_callback", "ggml_backend_cpu_set_use_ref", "ggml_threadpool_new",
                 "ggml_threadpool_free", "ggml_backend_cpu_set_threadpool", "ggml_backend_no_such_thing"):
        assert (B.backend_reg_get_proc_address(vreg, name) is not None) == \
            bool(g.backend_reg_get_proc_address(rreg, name)), name
    # backends
    rb, vb = g.backend_cpu_init(), cpu_backend.backend_cpu_init()
    assert B.backend_name(vb) == g.backend_name(rb) == "CPU"
    assert B.backend_get_default_buffer_type(vb) is vbuft
    assert B.backend_get_alignment(vb) == g.backend_get_alignment(rb)
    assert B.backend_get_max_size(vb) == g.backend_get_max_size(rb)
    assert B.backend_guid(vb) == bytes(ctypes.string_at(g.backend_guid(rb), 16))
    g.backend_free(rb)
    B.backend_free(vb)


def _special_ops(G, ctx) -> list:
    """Ops the CPU accepts or rejects by type (ggml_backend_cpu_device_supports_op's switch)."""
    T = G
    w4 = G.new_tensor_2d(ctx, T.GGML_TYPE_Q4_0, 64, 8)
    wh = G.new_tensor_2d(ctx, T.GGML_TYPE_F16, 64, 8)
    x32 = G.new_tensor_2d(ctx, F32, 64, 3)
    x16 = G.new_tensor_2d(ctx, F16, 64, 3)
    iq = G.new_tensor_2d(ctx, T.GGML_TYPE_IQ2_XXS, 256, 3)
    q8 = G.new_tensor_2d(ctx, T.GGML_TYPE_Q8_0, 64, 3)
    x256 = G.new_tensor_2d(ctx, F32, 256, 3)
    return [G.mul_mat(ctx, w4, x32),          # src1 F32: yes
            G.mul_mat(ctx, w4, x16),          # src1 F16, Q4_0's vec-dot type is Q8_0: no
            G.mul_mat(ctx, w4, q8),           # src1 already Q8_0: yes
            G.mul_mat(ctx, wh, x16),          # F16's vec-dot type is F16: yes
            G.cpy(ctx, x256, iq),             # no from_float for IQ2_XXS: no
            G.cpy(ctx, x32, q8),              # yes
            G.out_prod(ctx, x32, G.new_tensor_2d(ctx, F32, 8, 3)),
            G.out_prod(ctx, G.new_tensor_2d(ctx, T.GGML_TYPE_Q4_0, 64, 3), G.new_tensor_2d(ctx, F32, 8, 3))]


@needs_oracle
@pytest.mark.parametrize("name", list(BUILDERS) + ["special"])
def test_cpu_supports_op_matches_ggml(name):
    g = real_ggml()
    rctx, vctx = g.init(8 << 20, None, True), gg.init(8 << 20, None, True)
    try:
        if name == "special":
            rn, vn = _special_ops(g, rctx), _special_ops(gg, vctx)
        else:
            rn = graph_nodes(g, BUILDERS[name](g, rctx)["gf"])
            vn = graph_nodes(gg, BUILDERS[name](gg, vctx)["gf"])
        rdev = g.backend_reg_dev_get(g.backend_cpu_reg(), 0)
        vdev = B.backend_reg_dev_get(cpu_backend.backend_cpu_reg(), 0)
        want = [bool(g.backend_dev_supports_op(rdev, t)) for t in rn]
        got = [B.backend_dev_supports_op(vdev, t) for t in vn]
        assert got == want
        if name == "special":
            assert want == [True, False, True, True, False, True, True, True]
    finally:
        g.free(rctx)
        gg.free(vctx)


_KEEP = []     # gallocrs (their buffers) must outlive the graphs of a test


def _alloc(gf, buft):
    galloc = A.gallocr_new(buft)
    assert A.gallocr_alloc_graph(galloc, gf)
    _KEEP[:] = _KEEP[-8:] + [galloc]
    return galloc


def _small_graph(n_tok=5):
    ctx = gg.init(1 << 20, no_alloc=True)
    w = gg.set_name(gg.new_tensor_2d(ctx, F32, 48, 40), "w")
    x = gg.set_name(gg.new_tensor_2d(ctx, F32, 48, n_tok), "x")
    gg.set_input(x)
    gg.set_input(w)
    h = gg.mul_mat(ctx, w, gg.rms_norm(ctx, x, 1e-6))
    y = gg.soft_max(ctx, gg.scale(ctx, gg.unary(ctx, h, gg.GGML_UNARY_OP_SILU), 0.5))
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, y)
    rng = np.random.default_rng(3)
    vals = {"w": rng.standard_normal((40, 48)).astype(np.float32),
            "x": rng.standard_normal((n_tok, 48)).astype(np.float32)}
    return ctx, gf, w, x, y, vals


def _set(t, v):
    B.backend_tensor_set(t, v, 0, v.nbytes)


def _get(t):
    out = np.empty(gg.nbytes(t), np.uint8)
    B.backend_tensor_get(t, out, 0, out.nbytes)
    return out.view(np.float32)


def test_cpu_backend_compute_plan_threads_abort():
    ctx, gf, w, x, y, vals = _small_graph()
    _alloc(gf, B.backend_cpu_buffer_type())

    def set_inputs():           # the graph allocator may reuse an input's memory after its last use
        _set(w, vals["w"])
        _set(x, vals["x"])

    set_inputs()
    cplan = gg.graph_plan(gf, 3)
    cplan.work_data = np.zeros(cplan.work_size, np.uint8)
    assert gg.graph_compute(gf, cplan) == 0
    ref = _get(y).copy()
    be = cpu_backend.backend_cpu_init()
    assert be.context.n_threads == gg.GGML_DEFAULT_N_THREADS
    cpu_backend.backend_cpu_set_n_threads(be, 3)
    set_inputs()
    assert B.backend_graph_compute(be, gf) == gg.GGML_STATUS_SUCCESS
    np.testing.assert_array_equal(_get(y), ref)
    assert be.context.work_size >= gg.graph_plan(gf, 3).work_size
    plan = B.backend_graph_plan_create(be, gf)
    assert plan.cplan.n_threads == 3
    set_inputs()
    assert B.backend_graph_plan_compute(be, plan) == 0
    B.backend_graph_plan_free(be, plan)
    np.testing.assert_array_equal(_get(y), ref)
    # the abort callback stops the compute (after the first node)
    cpu_backend.backend_cpu_set_abort_callback(be, lambda data: data == "stop", "stop")
    assert B.backend_graph_compute(be, gf) == gg.GGML_STATUS_ABORTED
    with pytest.raises(gg.GGMLError):
        cpu_backend.backend_cpu_set_n_threads(blas.backend_blas_init(), 2)


# ====================================================================================================
# 3. BLAS
# ====================================================================================================

def _mm(ctx, t0, shape0, shape1, contiguous=True, t1=F32):
    a = gg.new_tensor(ctx, t0, len(shape0), list(shape0))
    b = gg.new_tensor(ctx, t1, len(shape1), list(shape1))
    if not contiguous:
        b = gg.transpose(ctx, gg.new_tensor_2d(ctx, t1, shape1[1], shape1[0]))
    return gg.mul_mat(ctx, a, b)


def test_blas_device_and_supports_op():
    dev = B.backend_reg_dev_get(blas.backend_blas_reg(), 0)
    assert B.backend_dev_type(dev) == B.GGML_BACKEND_DEVICE_TYPE_ACCEL
    assert B.backend_dev_buffer_type(dev) is B.backend_cpu_buffer_type()      # host memory, shared with the CPU
    assert B.backend_dev_memory(dev) == (0, 0)
    p = B.backend_dev_get_props(dev)
    assert p.name == "BLAS" and p.caps.buffer_from_host_ptr and not p.caps.async_
    assert B.backend_dev_supports_buft(dev, B.backend_cpu_buffer_type())
    adev = accel.backend_accel_device_new()
    assert not B.backend_dev_supports_buft(dev, B.backend_dev_buffer_type(adev))
    ctx = gg.init(1 << 20, no_alloc=True)
    sup = lambda t: B.backend_dev_supports_op(dev, t)          # noqa: E731
    assert sup(_mm(ctx, F32, (64, 32), (64, 32)))
    assert not sup(_mm(ctx, F32, (64, 31), (64, 32)))           # ne0 = 31
    assert not sup(_mm(ctx, F32, (64, 32), (64, 31)))           # ne1 = 31: a decode step never qualifies
    assert not sup(_mm(ctx, F32, (31, 32), (31, 32)))           # ne10 = 31
    assert sup(_mm(ctx, gg.GGML_TYPE_Q4_0, (64, 32), (64, 32)))  # to_float first
    assert sup(_mm(ctx, F16, (64, 32, 2), (64, 32, 4)))
    assert not sup(_mm(ctx, F32, (64, 32), (64, 32), t1=F16))   # src1 must be F32
    assert not sup(_mm(ctx, F32, (64, 32), (64, 32), contiguous=False))
    t = _mm(ctx, F32, (64, 32), (64, 32))
    gg.set_op_params_i32(t, 1, blas.GGML_HINT_SRC0_IS_HADAMARD)
    assert not sup(t)
    a, b = gg.new_tensor_2d(ctx, F32, 8, 5), gg.new_tensor_2d(ctx, F32, 6, 5)
    assert sup(gg.out_prod(ctx, a, b))
    assert sup(gg.out_prod(ctx, a, gg.transpose(ctx, gg.new_tensor_2d(ctx, F32, 5, 6))))
    assert not sup(gg.rms_norm(ctx, a, 1e-6)) and sup(gg.reshape_1d(ctx, a, 40)) and sup(gg.transpose(ctx, a))
    assert B.backend_reg_get_proc_address(blas.backend_blas_reg(), "ggml_backend_set_n_threads") is \
        blas.backend_blas_set_n_threads


def _run_blas(build):
    """Build a graph of one op in a no_alloc context, allocate it in host memory, fill the leafs, compute it on
    BLAS and (again) on the CPU backend; returns (blas result, cpu result, leaf values)."""
    ctx = gg.init(1 << 20, no_alloc=True)
    out, leafs = build(ctx)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, out)
    for t in leafs:
        gg.set_input(t)
    _alloc(gf, B.backend_cpu_buffer_type())
    rng = np.random.default_rng(7)
    vals = []
    for t in leafs:
        v = rng.standard_normal(tuple(reversed(t.shape))).astype(np.float32)
        if t.type == F32:
            _set(t, v)
        else:
            raw = Q.quantize_row_ref(t.type, v.reshape(-1, t.shape[0]))
            B.backend_tensor_set(t, raw, 0, gg.nbytes(t))
            v = Q.dequantize_row(t.type, raw)
            v = v.reshape(tuple(reversed(t.shape)))
        vals.append(v.astype(np.float64).squeeze())
    bb = blas.backend_blas_init()
    assert all(B.backend_supports_op(bb, n) for n in gf.nodes)
    assert B.backend_graph_compute(bb, gf) == 0
    r_blas = _get(out).reshape(tuple(reversed(out.shape))).squeeze().copy()
    cpu = cpu_backend.backend_cpu_init()
    cpu_backend.backend_cpu_set_n_threads(cpu, 2)
    assert B.backend_graph_compute(cpu, gf) == 0
    r_cpu = _get(out).reshape(tuple(reversed(out.shape))).squeeze().copy()
    return r_blas, r_cpu, vals


def test_blas_mul_mat_f32_with_broadcast():
    # src0 [64, 48, 2, 1] broadcast over src1 [64, 40, 4, 2]: r2 = 2, r3 = 2
    def build(ctx):
        a = gg.new_tensor_4d(ctx, F32, 64, 48, 2, 1)
        b = gg.new_tensor_4d(ctx, F32, 64, 40, 4, 2)
        return gg.mul_mat(ctx, a, b), [a, b]
    r_blas, r_cpu, (a, b) = _run_blas(build)
    a_b = np.broadcast_to(np.repeat(a[None], 2, axis=1), (2, 4, 48, 64))
    ref = np.einsum("pqkd,pqnd->pqnk", a_b, b)            # dst[i13, i12, n, k] = sum_d a[k, d] b[n, d]
    assert nmse(r_blas, ref) <= 1e-10
    assert nmse(r_blas, r_cpu) <= 1e-10


@pytest.mark.parametrize("type_", [gg.GGML_TYPE_Q4_0, gg.GGML_TYPE_Q8_0, F16])
def test_blas_mul_mat_converts_src0_to_f32(type_):
    def build(ctx):
        a = gg.new_tensor_2d(ctx, type_, 64, 40)
        b = gg.new_tensor_2d(ctx, F32, 64, 33)
        return gg.mul_mat(ctx, a, b), [a, b]
    r_blas, r_cpu, (a, b) = _run_blas(build)
    assert nmse(r_blas, b @ a.T) <= 1e-10                  # the dequantized weights times the F32 activations
    # the CPU quantizes the activations to the vec-dot type: close, not equal
    assert nmse(r_blas, r_cpu) <= (1e-3 if type_ != F16 else 1e-6)


@pytest.mark.parametrize("transposed", [False, True])
def test_blas_out_prod(transposed):
    def build(ctx):
        a = gg.new_tensor_2d(ctx, F32, 24, 7)           # src0 (k, n) = [ne01 = 7, ne00 = 24]
        if transposed:
            b0 = gg.new_tensor_2d(ctx, F32, 7, 12)
            return gg.out_prod(ctx, a, gg.transpose(ctx, b0)), [a, b0]
        b = gg.new_tensor_2d(ctx, F32, 12, 7)            # src1 (k, m)
        return gg.out_prod(ctx, a, b), [a, b]
    r_blas, r_cpu, (a, b) = _run_blas(build)
    src1 = b.T if transposed else b                      # as (k, m)
    ref = src1.T @ a                                     # dst (m, n) = sum_k src1[k, m] src0[k, n]
    assert nmse(r_blas, ref) <= 1e-10 and nmse(r_blas, r_cpu) <= 1e-10


def test_blas_rejects_unsupported_op():
    ctx, gf, w, x, y, vals = _small_graph()
    _alloc(gf, B.backend_cpu_buffer_type())
    with pytest.raises(gg.GGMLError, match="unsupported op RMS_NORM"):
        B.backend_graph_compute(blas.backend_blas_init(), gf)


# ====================================================================================================
# 4. the accelerator
# ====================================================================================================

def test_accel_device_memory_and_buffers():
    dev = accel.backend_accel_device_new("ACCEL7", capacity=10_000)
    assert B.backend_dev_name(dev) == "ACCEL7" and B.backend_dev_type(dev) == B.GGML_BACKEND_DEVICE_TYPE_GPU
    p = B.backend_dev_get_props(dev)
    assert (p.memory_free, p.memory_total) == (10_000, 10_000) and p.caps.events and not p.caps.buffer_from_host_ptr
    buft = B.backend_dev_buffer_type(dev)
    assert B.backend_buft_name(buft) == "ACCEL7" and B.backend_buft_get_device(buft) is dev
    assert not B.backend_buft_is_host(buft) and B.backend_buft_get_alignment(buft) == 128
    assert B.backend_dev_supports_buft(dev, buft) and not B.backend_dev_supports_buft(dev, B.backend_cpu_buffer_type())
    assert not B.backend_dev_supports_buft(dev, B.backend_dev_buffer_type(accel.backend_accel_device_new()))
    b1 = B.backend_buft_alloc_buffer(buft, 6000)
    assert B.backend_dev_memory(dev) == (4000, 10_000) and not B.backend_buffer_is_host(b1)
    assert B.backend_buft_alloc_buffer(buft, 4001) is None                       # out of memory: NULL
    assert "out of memory" in impl.last_log_error() and "4001 bytes" in impl.last_log_error()
    b2 = B.backend_buft_alloc_buffer(buft, 4000)
    assert B.backend_dev_memory(dev)[0] == 0
    B.backend_buffer_free(b1)
    assert B.backend_dev_memory(dev)[0] == 6000
    del b2
    gc.collect()                                                                 # dropped: given back as well
    assert B.backend_dev_memory(dev) == (10_000, 10_000)
    st = accel.backend_accel_stats(dev)
    assert (st["n_alloc"], st["n_alloc_failed"], st["peak_used"]) == (2, 1, 10_000)
    accel.backend_accel_set_capacity(dev, 20_000)
    assert B.backend_dev_memory(dev) == (20_000, 20_000)


def test_accel_tensor_data_moves_through_the_backend():
    dev = accel.backend_accel_device_new()
    dev2 = accel.backend_accel_device_new()
    ctx = gg.init(8 * gg.tensor_overhead(), no_alloc=True)
    h = gg.new_tensor_2d(ctx, F32, 16, 4)
    d = gg.new_tensor_2d(ctx, F32, 16, 4)
    d2 = gg.new_tensor_2d(ctx, F32, 16, 4)
    ctx_h, ctx_d, ctx_d2 = [gg.init(2 * gg.tensor_overhead(), no_alloc=True) for _ in range(3)]
    bh = B.backend_buft_alloc_buffer(B.backend_cpu_buffer_type(), 256)
    bd = B.backend_buft_alloc_buffer(B.backend_dev_buffer_type(dev), 256)
    bd2 = B.backend_buft_alloc_buffer(B.backend_dev_buffer_type(dev2), 256)
    for t, b in ((h, bh), (d, bd), (d2, bd2)):
        B.backend_tensor_alloc(b, t, B.backend_buffer_get_base(b))
    v = np.arange(64, dtype=np.float32)
    _set(h, v)
    B.backend_tensor_copy(h, d)                   # host -> device: tensor_set
    B.backend_tensor_copy(d, d2)                  # device -> device: the destination buffer's cpy_tensor
    np.testing.assert_array_equal(_get(d2), v)    # device -> host: tensor_get
    B.backend_tensor_memset(d, 0, 0, 64)
    np.testing.assert_array_equal(_get(d)[:16], 0)
    acc = accel.backend_accel_init(dev)
    B.backend_tensor_set_async(acc, d, v, 0, v.nbytes)
    out = B.backend_tensor_get_async(acc, d, None, 0, v.nbytes)
    B.backend_synchronize(acc)
    np.testing.assert_array_equal(out.view(np.float32), v)
    B.backend_tensor_copy_async(acc, cpu_backend.backend_cpu_init(), d, h)
    st, st2 = accel.backend_accel_stats(dev), accel.backend_accel_stats(dev2)
    assert (st["n_h2d"], st["n_d2h"], st2["n_d2d"], st2["n_d2h"]) == (2, 3, 1, 1)
    assert st["h2d_bytes"] == 2 * 256


def test_accel_ops_offload_and_events():
    dev = accel.backend_accel_device_new(supported_ops=["mul_mat", "GGML_OP_ADD", gg.GGML_OP_ROPE])
    ctx = gg.init(1 << 20, no_alloc=True)
    sup = lambda t: B.backend_dev_supports_op(dev, t)          # noqa: E731
    off = lambda t: B.backend_dev_offload_op(dev, t)           # noqa: E731
    a = gg.new_tensor_2d(ctx, F32, 64, 32)
    assert sup(_mm(ctx, F32, (64, 8), (64, 32))) and sup(gg.add(ctx, a, a)) and sup(gg.view_1d(ctx, a, 8, 0))
    assert not sup(gg.mul(ctx, a, a)) and not sup(gg.rms_norm(ctx, a, 1e-6))
    accel.backend_accel_set_supported_ops(dev, accel.DEFAULT_SUPPORTED_OPS)
    assert sup(gg.rms_norm(ctx, a, 1e-6)) and not sup(gg.sqr(ctx, a))
    # CUDA's rule: a batch of at least 32 (ne1 for MUL_MAT, ne2 for ROPE, never GET_ROWS, else the rows)
    assert off(_mm(ctx, F32, (64, 8), (64, 32))) and not off(_mm(ctx, F32, (64, 8), (64, 31)))
    b = gg.new_tensor_2d(ctx, F32, 64, 31)
    assert off(gg.add(ctx, a, a)) and not off(gg.add(ctx, b, b))
    assert not off(gg.get_rows(ctx, a, gg.new_tensor_1d(ctx, gg.GGML_TYPE_I32, 64)))
    q = gg.new_tensor_3d(ctx, F32, 64, 4, 40)
    pos = gg.new_tensor_1d(ctx, gg.GGML_TYPE_I32, 40)
    assert off(gg.rope_ext(ctx, q, pos, None, 64, 0, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0))
    # events complete at once (the device is synchronous)
    acc = accel.backend_accel_init(dev)
    ev = B.backend_event_new(dev)
    B.backend_event_record(ev, acc)
    assert ev.context["recorded"]
    B.backend_event_wait(acc, ev)
    B.backend_event_synchronize(ev)
    B.backend_event_free(ev)
    assert B.backend_event_new(backend_reg.backend_dev_by_type(B.GGML_BACKEND_DEVICE_TYPE_CPU)) is None


def test_accel_computes_bitwise_like_the_cpu():
    """The same graph allocated in device memory (gallocr with the ACCEL buffer type) and in host memory: the
    accelerator's compute (the CPU's kernels) gives bitwise the CPU backend's result."""
    results = []
    for on_device in (False, True):
        dev = accel.backend_accel_device_new()
        ctx, gf, w, x, y, vals = _small_graph(n_tok=7)
        buft = B.backend_dev_buffer_type(dev) if on_device else B.backend_cpu_buffer_type()
        _alloc(gf, buft)
        _set(w, vals["w"])
        _set(x, vals["x"])
        be = accel.backend_accel_init(dev) if on_device else cpu_backend.backend_cpu_init()
        assert B.backend_graph_compute(be, gf) == 0
        results.append(_get(y).copy())
        if on_device:
            assert accel.backend_accel_stats(dev)["n_graphs"] == 1
    np.testing.assert_array_equal(results[1], results[0])
