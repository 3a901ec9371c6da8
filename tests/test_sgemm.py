"""llamafile's tinyBLAS (``ggviz/ggml/cpu/llamafile/sgemm.py`` and the compiled ``fast/sgemm.py``) against the real one.

Oracle: the ggml that llama-cpp-python 0.3.36 ships (``llama_cpp/lib/libggml-cpu.so``, built for AVX2 with
``LLAMAFILE = 1``: see tests/data/llamacpp/README.md), driven through its C graph API by ctypes in a subprocess
(tests/oracle/llamacpp_mul_mat.py). (The libggml-python 0.20.2 of tests/oracle is built without llamafile:
``ggml_cpu_has_llamafile() == 0``.) A MUL_MAT with
random operands is computed by both, with 1 and 2 threads, and the results must be the same bits -- for every type
tinyBLAS takes on x86 (F32, F16, BF16, Q8_0, Q4_0, Q5_0) and for shapes that pick each of its paths: the float
kernel's BM = 4 / 2 / 1 tilings and its refusals (``m % 4``, ``k % 8``: ggml's vec_dot chunks then), ``n = 1``
(never sgemm), the Q0 kernel's ragged edges, GQA broadcast and a permuted src1 (not contiguous: only the second
llamafile_sgemm call, after the conversion to vec_dot_type).
"""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from ggviz import ggml
from ggviz.ggml import consts as C
from ggviz.ggml import quants as Q
from ggviz.ggml.cpu import ggml_cpu, mul_mat
from ggviz.ggml.cpu.llamafile import sgemm

F32, F16, BF16 = C.GGML_TYPE_F32, C.GGML_TYPE_F16, C.GGML_TYPE_BF16
Q8_0, Q4_0, Q5_0 = C.GGML_TYPE_Q8_0, C.GGML_TYPE_Q4_0, C.GGML_TYPE_Q5_0


_ORACLE = os.path.join(os.path.dirname(__file__), "oracle", "llamacpp_mul_mat.py")
needs_oracle = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                  reason="llama-cpp-python (the AVX2 build with llamafile) not installed")


def _random_rows(t, rows, k, rng):
    """Raw bytes (rows, row_size) of random values of type t (quant blocks: random levels, moderate scales)."""
    if t == F32:
        return rng.standard_normal((rows, k)).astype(np.float32).view(np.uint8)
    if t == F16:
        return rng.standard_normal((rows, k)).astype(np.float16).view(np.uint8)
    if t == BF16:
        bits = rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8)
    blocks = np.zeros(rows * (k // 32), Q.BLOCK_DTYPES[t])
    blocks["d"] = (rng.uniform(0.5, 2.0, blocks.shape) * 2.0 ** -7).astype(np.float16)
    if t == Q8_0:
        blocks["qs"] = rng.integers(-127, 128, blocks["qs"].shape)
    else:
        blocks["qs"] = rng.integers(0, 256, blocks["qs"].shape)
        if t == Q5_0:
            blocks["qh"] = rng.integers(0, 256, blocks["qh"].shape)
    return blocks.view(np.uint8).reshape(rows, -1)


def _case(t, m, n, k, heads=1, kv_heads=1, permuted=False, seed=0):
    """src0 (k, m, kv_heads) of type t, src1 F32 (k, n, heads) -- or its permutation when ``permuted``."""
    rng = np.random.default_rng(seed)
    a = _random_rows(t, m * kv_heads, k, rng)
    b = rng.standard_normal((heads, n, k)).astype(np.float32)
    return a, b


def _ggviz(t, m, n, k, heads, kv_heads, permuted, a, b, nth, fast=False):
    ctx = ggml.init(64 << 20)
    w = ggml.new_tensor_3d(ctx, t, k, m, kv_heads)
    ggml.get_data(w).reshape(-1).view(np.uint8)[:] = a.reshape(-1)
    if permuted:
        x = ggml.new_tensor_3d(ctx, F32, k, heads, n)
        ggml.get_data(x)[...] = b.transpose(1, 0, 2)
        x = ggml.permute(ctx, x, 0, 2, 1, 3)
    else:
        x = ggml.new_tensor_3d(ctx, F32, k, n, heads)
        ggml.get_data(x)[...] = b
    y = ggml.mul_mat(ctx, w, x)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, y)
    plan = ggml_cpu.graph_plan(gf, nth)
    if fast:
        from ggviz.ggml.cpu.fast import compiler
        plan.extra = compiler.compile_graph(gf)
        assert plan.extra is not None
    else:
        plan.extra = None
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    assert ggml_cpu.graph_compute(gf, plan) == C.GGML_STATUS_SUCCESS
    return np.array(ggml.get_data(y), copy=True).reshape(heads, n, m), mul_mat.mul_mat_kernel(y, nth)


def _real(t, m, n, k, heads, kv_heads, permuted, a, b, nth, tmp):
    """The same MUL_MAT by llama.cpp's ggml, in a subprocess (tests/oracle/llamacpp_mul_mat.py says why)."""
    src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
    np.savez(src, type=t, m=m, n=n, k=k, heads=heads, kv_heads=kv_heads, permuted=int(permuted), nth=nth, a=a, b=b)
    r = subprocess.run([sys.executable, _ORACLE, src, dst], capture_output=True, text=True, timeout=120)
    if r.returncode == 3:
        pytest.skip("llama-cpp-python here is not an AVX2 build with llamafile")
    assert r.returncode == 0, r.stderr[-2000:]
    return np.load(dst)["out"]


# (type, m, n, k, heads, kv_heads, permuted, kernel llama.cpp's ggml runs)
CASES = [
    (F32, 64, 7, 64, 1, 1, False, "sgemm"),          # BM 4 (m % 16, m/16 >= nth)
    (F32, 24, 5, 40, 1, 1, False, "sgemm"),          # BM 2
    (F32, 20, 29, 16, 1, 1, False, "sgemm"),         # BM 1, RN 3, ragged columns
    (F32, 18, 4, 64, 1, 1, False, "vec_dot chunks"),  # m % 4: refused
    (F32, 16, 3, 36, 1, 1, False, "vec_dot chunks"),  # k % 8: refused
    (F32, 16, 1, 64, 1, 1, False, "vec_dot chunks"),  # n = 1: never sgemm
    (F16, 256, 9, 64, 9, 3, True, "sgemm"),          # the KQ of a prefill: GQA 9 -> 3, q permuted
    (F16, 64, 2, 256, 9, 3, False, "sgemm"),         # the KQV: RN 2
    (F16, 52, 30, 24, 2, 1, True, "sgemm"),          # BM 1, 2 column blocks
    (F16, 36, 5, 20, 1, 1, False, "vec_dot chunks"),
    (BF16, 48, 6, 32, 1, 1, False, "sgemm"),
    (Q8_0, 37, 7, 64, 1, 1, False, "sgemm"),         # odd m: every Q0 tile shape
    (Q8_0, 40, 2, 96, 2, 2, False, "sgemm"),
    (Q4_0, 19, 11, 64, 1, 1, False, "sgemm"),
    (Q4_0, 8, 1, 64, 1, 1, False, "vec_dot chunks"),
    (Q5_0, 21, 6, 96, 1, 1, False, "sgemm"),
]


@needs_oracle
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{Q.type_name(c[0])}-m{c[1]}-n{c[2]}-k{c[3]}"
                         + ("-perm" if c[6] else "") + f"-h{c[4]}")
def test_faithful_mul_mat_bitexact_with_llamacpp(case, tmp_path):
    t, m, n, k, heads, kv_heads, permuted, kernel = case
    a, b = _case(t, m, n, k, heads, kv_heads, permuted)
    for nth in (1, 2):
        real = _real(t, m, n, k, heads, kv_heads, permuted, a, b, nth, str(tmp_path))
        got, used = _ggviz(t, m, n, k, heads, kv_heads, permuted, a, b, nth)
        assert used == kernel
        if kernel == "sgemm" or t in (F32, F16, BF16):     # quant vec_dot is exact only on the compiled path
            assert np.array_equal(got.view(np.uint32), real.view(np.uint32)), \
                (nth, int((got != real).sum()), float(np.abs(got - real).max()))


@needs_oracle
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in (F32, F16)],
                         ids=lambda c: f"{Q.type_name(c[0])}-m{c[1]}-n{c[2]}-k{c[3]}" + ("-perm" if c[6] else ""))
def test_compiled_mul_mat_bitexact_with_llamacpp(case, tmp_path):
    pytest.importorskip("numba")
    from ggviz.ggml.cpu.fast import intrinsics
    if not intrinsics.HAVE_AVX2:
        pytest.skip("the compiled kernels are ggml's bits on AVX2 machines")
    t, m, n, k, heads, kv_heads, permuted, _ = case
    a, b = _case(t, m, n, k, heads, kv_heads, permuted)
    for nth in (1, 2):
        real = _real(t, m, n, k, heads, kv_heads, permuted, a, b, nth, str(tmp_path))
        got, _ = _ggviz(t, m, n, k, heads, kv_heads, permuted, a, b, nth, fast=True)
        assert np.array_equal(got.view(np.uint32), real.view(np.uint32)), (nth, int((got != real).sum()))


def test_tinyblas_job_grid_covers_c_once():
    """The float kernel's jobs tile C exactly once (hand-checked rule: rows in blocks of 4*BM, columns in
    BN-tile blocks of RN-1 / RN columns), for the shapes of a prefill."""
    for m, n in ((256, 115), (64, 2), (20, 29), (48, 3), (4096, 1000)):
        for nth in (1, 2, 3):
            bm = sgemm.tinyblas_bm(m, 64, nth)
            rn, nb_job, box = sgemm.tinyblas_jobs(m, n, bm)
            cover = np.zeros((m, n), np.int32)
            for job in range(nb_job):
                i0, i1, j0, j2 = box(job)
                cover[i0:i1, j0:j2] += 1
            assert (cover == 1).all(), (m, n, nth)
    assert sgemm.block_size(3, 115) == 3 and sgemm.block_size(3, 2) == 2 and sgemm.block_size(3, 4) == 2
    assert sgemm.tinyblas_bm(256, 64, 2) == 4 and sgemm.tinyblas_bm(24, 64, 2) == 2
    assert sgemm.tinyblas_bm(18, 64, 1) == 0 and sgemm.tinyblas_bm(16, 36, 1) == 0


def test_q0_tiles_cover_c_once():
    """tinyBLAS_Q0_AVX's mnpack regions and each thread's static share tile C exactly once."""
    for m, n in ((37, 7), (49152, 115), (5, 3), (1, 2), (8, 9)):
        for nth in (1, 2, 3):
            cover = np.zeros((m, n), np.int32)
            for m0, m1, n0, n1, rm, rn in sgemm.q0_regions(m, n):
                for ith in range(nth):
                    for i0, i1, j0, j1 in sgemm.q0_thread_tiles(m0, m1, n0, n1, rm, rn, ith, nth):
                        cover[i0:i1, j0:j1] += 1
            assert (cover == 1).all(), (m, n, nth)


# ---------------------------------------------------------------------------------------------------------------------
# a one-batch prefill of the model: every row of logits, llama.cpp's bits
# ---------------------------------------------------------------------------------------------------------------------

PREFILL_NPZ = os.path.join(os.path.dirname(__file__), "data", "llamacpp", "smollm2_prefill115_sgemm.npz")


def _prefill(model, ids, nth):
    from ggviz.llama.batch import batch_add, batch_init
    from ggviz.llama.context import context_default_params, init_from_model
    p = context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch = 512, 512, 512          # as captured (tools/capture_llamacpp_prefill.py)
    p.n_threads = p.n_threads_batch = nth
    p.flash_attn_type = 0
    ctx = init_from_model(model, p)
    b = batch_init(len(ids))
    for i, t in enumerate(ids):
        batch_add(b, int(t), i, [0], True)
    assert ctx.decode(b) == 0
    return np.asarray(ctx.get_logits(), np.float32).reshape(len(ids), -1)


@pytest.mark.parametrize("nth", [1, 2])
def test_prefill_logits_bitexact_with_llamacpp(model, nth):
    """The 115-token text in one llama_decode with logits for every token (SmolLM2 Q4_1, compiled path): each row's
    float32 bits hash to what llama.cpp's AVX2 build gave (captured with 1 and 2 threads). The KV attention goes
    through tinyBLAS there; through ggml_vec_dot_f16 only 3 of the 115 rows came out the same."""
    import hashlib
    pytest.importorskip("numba")
    from ggviz.ggml.cpu.fast import intrinsics
    if not intrinsics.HAVE_AVX2:
        pytest.skip("llama.cpp's bits are those of its AVX2 build")
    ref = np.load(PREFILL_NPZ)
    lg = _prefill(model, ref["ids"], nth)
    got = np.array([hashlib.sha256(r.tobytes()).hexdigest() for r in lg])
    bad = np.nonzero(got != ref[f"sha256_t{nth}"])[0]
    rows = list(ref["rows"])
    assert len(bad) == 0, (f"{len(bad)} of {len(got)} rows differ (first {bad[:8]}); max |diff| on the stored rows "
                           f"{float(np.abs(lg[rows] - ref['logits']).max())}")


# ---------------------------------------------------------------------------------------------------------------------
# BLAS is opt-in; the kernel each MUL_MAT ran is in the trace and the scheduler view
# ---------------------------------------------------------------------------------------------------------------------

def _ctx(model, **kw):
    from ggviz.llama.context import context_default_params, init_from_model
    p = context_default_params()
    p.n_ctx, p.n_threads, p.n_threads_batch, p.flash_attn_type = 256, 2, 2, 0
    for k, v in kw.items():
        setattr(p, k, v)
    return init_from_model(model, p)


def test_blas_backend_is_opt_in(model):
    """llama.cpp's default CPU build has no BLAS backend: a context gets the CPU only, unless ``use_blas``."""
    from ggviz.ggml import backend as B
    assert [B.backend_name(b) for b in _ctx(model).backends] == ["CPU"]
    assert [B.backend_name(b) for b in _ctx(model, use_blas=True).backends] == ["BLAS", "CPU"]


def _kernels_by_node(events):
    out = {}
    for e in events:
        if e["kind"] == "cpu.node" and e["op"] == "MUL_MAT":
            out.setdefault(e["name"].split("-")[0], set()).add(e["kernel"])
    return out


@pytest.mark.parametrize("compiled", [True, False])
def test_trace_names_the_mul_mat_kernel(model, compiled):
    """cpu.node events of a MUL_MAT carry the kernel it ran: a 6-token prompt sends the KV attention through
    tinyBLAS and the repacked weights through CPU_REPACK's gemm; a 1-token decode's attention is vec_dot chunks.
    The faithful walk (an abort callback forces it) records the same names."""
    from ggviz import trace
    from ggviz.llama.batch import batch_get_one
    ctx = _ctx(model) if compiled else _ctx(model, abort_callback=lambda data: False)
    with trace.recording(("cpu.node",)) as rec:
        assert ctx.decode(batch_get_one([1, 2, 3, 4, 5, 6])) == 0
    k = _kernels_by_node(rec.events)
    assert k["kq"] == k["kqv"] == {mul_mat.KERNEL_SGEMM}
    assert k["Qcur"] == k["ffn_up"] == k["result_output"] == {mul_mat.KERNEL_REPACK}
    with trace.recording(("cpu.node",)) as rec:
        assert ctx.decode(batch_get_one([7])) == 0
    k = _kernels_by_node(rec.events)
    assert k["kq"] == k["kqv"] == {mul_mat.KERNEL_VEC_DOT}


def test_scheduler_view_shows_the_kernels(model):
    from ggviz import llama, trace
    from ggviz.ggml import sched as S
    from ggviz.viz.widgets.sched_view import SchedulerView
    mp = llama.model_default_params()
    mp.use_extra_bufts = False                     # weights in host memory: BLAS can take them when it is there
    m2 = llama.model_load_from_file(model.path, mp)
    # Q4_1 weights: tinyBLAS refuses them (ggml's vec_dot chunks), BLAS takes them when it is there
    for use_blas, want in ((False, mul_mat.KERNEL_VEC_DOT), (True, mul_mat.KERNEL_BLAS)):
        ctx = _ctx(m2, use_blas=use_blas)
        with trace.recording(SchedulerView.KINDS) as rec:
            S.backend_sched_reset(ctx.sched)
            res = ctx.build_graph(32, 32, 256)
            assert S.backend_sched_alloc_graph(ctx.sched, res.gf)
        sv = SchedulerView(ctx.sched, res.gf, rec)
        i = sv.node_names.index("Qcur-0")
        assert sv.kernel(i).startswith(want)
        kq = sv.kernel(sv.node_names.index("kq-0"))
        assert kq == mul_mat.KERNEL_SGEMM                                # q is permuted: BLAS cannot take it
        out = sv.kernel(sv.node_names.index("result_output"))
        assert out == (mul_mat.KERNEL_SGEMM if not use_blas else mul_mat.KERNEL_BLAS + " (opt-in: GGML_BLAS build)")
        sv.select_split(0)
        assert "kernel" in sv.info_html() and want in sv.info_html()


def test_q0_lanes_integer_paths():
    """The Q0 kernel's 8 integer lanes per block: the matmul shortcut equals the intrinsic emulation (psignb,
    pmaddubsw, pmaddwd) on values in [-127, 127]; a = b = -128 follows the intrinsics, hand-checked: psignb(-128,
    -128) wraps to -128, |a| = 128 as unsigned, so each product is -16384, each pair -32768 (pmaddubsw's int16 floor,
    not saturated), each lane -65536 -- not +65536."""
    rng = np.random.default_rng(3)
    qa = rng.integers(-127, 128, (5, 3, 32)).astype(np.int16)
    qb = rng.integers(-127, 128, (4, 3, 32)).astype(np.int16)
    da = rng.uniform(0.5, 2, (5, 3)).astype(np.float32)
    db = rng.uniform(0.5, 2, (4, 3)).astype(np.float32)
    fast = sgemm.q0_lanes(qa, da, qb, db)
    qa2 = qa.copy()
    qa2[0, 0, 0] = -128                                     # forces the emulation path (with qb2's -128 below)
    qb2 = qb.copy()
    qb2[3, 2, 31] = -128
    slow = sgemm.q0_lanes(qa2, da, qb2, db)
    # the changed elements meet nowhere (row 0 block 0 vs column 3 block 2): every other product is unchanged
    ref = sgemm.q0_lanes(qa2, da, qb, db)                    # no -128 in b: the matmul path
    assert np.array_equal(slow[:3], ref[:3])
    lanes = sgemm._updot(np.full(32, -128, np.int16), np.full(32, -128, np.int16))
    assert lanes.tolist() == [-65536] * 8
    assert np.array_equal(sgemm._updot(qa[:, None, 0, :], qb[None, :, 0, :]).sum(-1),
                          (qa[:, None, 0, :].astype(np.int64) * qb[None, :, 0, :]).sum(-1))
    assert fast.dtype == np.float32 and fast.shape == (4, 5)


@needs_oracle
@pytest.mark.parametrize("t", [Q8_0, Q4_0, Q5_0], ids=lambda t: Q.type_name(t))
def test_q0_sgemm_equals_llamacpp_vec_dot(t, tmp_path):
    """For Q8_0 / Q4_0 / Q5_0 weights tinyBLAS_Q0's arithmetic is that of ggml's AVX2 vec_dot: ggviz's tinyBLAS on a
    2-column product gives, in each column, the bits llama.cpp's vec_dot gives that column alone (n = 1)."""
    a, b = _case(t, 37, 1, 256, seed=5)
    real1 = _real(t, 37, 1, 256, 1, 1, False, a, b, 1, str(tmp_path))
    mine, used = _ggviz(t, 37, 2, 256, 1, 1, False, a, np.concatenate([b, b], axis=1), 1)
    assert used == mul_mat.KERNEL_SGEMM
    for j in (0, 1):
        assert np.array_equal(mine[0, j].view(np.uint32), real1[0, 0].view(np.uint32))
