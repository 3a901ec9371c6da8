"""ggml_backend_sched in ggviz (ggviz/ggml/sched.py) against the real ggml 0.20.2 and against hand-derived plans.

1. CPU only, differential: the oracle library has only the CPU backend, so ``backend_sched_new([cpu])`` runs in
   both engines on the tests/graphs.py graphs (some with weights and KV cache placed in a WEIGHTS buffer first):
   the number of splits, the compute buffer size, every tensor's offset in its buffer, the eval callback's calls
   (tensor name, ask) in order, and the results agree.
2. Several backends, derived by hand from ggml's rules (the derivation is written next to each case): a two-layer
   mini model (rms_norm -> mul by a norm weight -> mul_mat -> residual add) on
   * an accelerator that lacks RMS_NORM: every rms_norm falls back to the CPU ("3.best"), a split around each, its
     input and output copied ("ACCEL0#norm-0#0", "CPU#out-0#0", cause "4.cpy");
   * weights split across backends (layer 0 in host memory, layer 1 on the accelerator, BLAS in between): which
     nodes run where and why ("1.wgt0/1", "2.sup" up and down, "1.inp", the weight leafs "1.dst" on BLAS);
   * a tensor pinned by the user (``set_tensor_backend`` -> "usr") and what it does to the expansion;
   * BLAS taking a 32-token MUL_MAT by a pass-3 upgrade ("3.upg": weights in a host buffer that is not a WEIGHTS
     buffer, node first expanded to the CPU) or directly by its weight ("1.wgt0");
   results bitwise equal to the CPU-only scheduler (the accelerator runs the CPU kernels), NMSE <= 1e-10 for BLAS.
3. The accelerator's memory capacity: a compute buffer or model weights that do not fit fail with a clear error.
4. The eval callback: called per split and node range, in graph order, with the data ready when asked.
5. Trace events and the plan record; SmolLM2 decode plans with -ngl 0/10/30/31 and an accelerator without
   RMS_NORM (splits, copies, causes), the faithful decode bitwise equal with the graph spread over 121 splits, and
   a 32-token prompt through CPU+BLAS keeping llama.cpp's teacher-forced top-1.
"""
from __future__ import annotations

import ctypes
import os
from types import SimpleNamespace

import numpy as np
import pytest
from tests import graphs
from tests.graphs import BUILDERS, graph_leafs, graph_nodes
from tests.oracle.ggml_lib import available, run_in_subprocess, unavailable_reason
from tests.pairs import Pair, buffer_place, nmse, pairs_fixture, real_ggml
from ggviz import ggml as gg, trace
from ggviz.ggml import accel, blas
from ggviz.ggml import alloc as A
from ggviz.ggml import backend as B
from ggviz.ggml import impl
from ggviz.ggml.cpu import cpu_backend
from ggviz.ggml import sched as S

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



F32 = gg.GGML_TYPE_F32
WEIGHTS = B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS
MODEL = os.path.join(_ROOT, "data", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DATA = os.path.join(_ROOT, "tests", "data", "llamacpp")

needs_oracle = pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())


# ====================================================================================================
# 1. CPU only: ggviz's scheduler vs ggml's
# ====================================================================================================

class LlamaSized1(graphs.LlamaHParams):
    """4 layers of SmolLM-135M's shape, one token after 32 (the decode step)."""
    n_embd, n_head, n_head_kv, n_embd_head, n_ff, n_vocab, n_layer = 576, 9, 3, 64, 1536, 512, 4
    n_tokens, n_past, kv_size, n_rot, out_ids = 1, 32, 256, 64, (0,)
    rope = ((0, 10000.0),) * 4
    graph_size = 1024


def _llama_sized_1(G, ctx):
    return graphs.build_llama_block(G, ctx, LlamaSized1)


# graphs whose leafs all get a backend: in the others a leaf is first read by a view op and keeps -1 (see
# test_unassigned_leaf_fails_like_ggml); the llama graphs qualify once their weights and KV cache are in a buffer
SCHED_CASES = [("simple_add", BUILDERS["simple_add"], False), ("q4_0_mul_mat", BUILDERS["q4_0_mul_mat"], False),
               ("llama_block_ext", BUILDERS["llama_block"], True), ("llama_sized_1_ext", _llama_sized_1, True)]


class SchedPair(Pair):
    """A ``Pair`` (tests/pairs.py: one graph built in both engines, no_alloc contexts; optionally the weights and the
    KV cache placed in a WEIGHTS buffer first with a tallocr) with the schedulers and ggml's CPU backend that
    ``_scheds`` makes for it (freed by ``close``)."""

    mem = 16 << 20
    rsched = vsched = None
    rbackend = None

    def close(self):
        g = real_ggml()
        if self.rsched:
            g.backend_sched_free(self.rsched)
        if self.rbackend:
            g.backend_free(self.rbackend)
        if self.vsched is not None:
            S.backend_sched_free(self.vsched)
        super().close()


pairs = pairs_fixture(SchedPair)


def _offsets(G, gf) -> list:
    """(name, offset of the data in its buffer or None) for every leaf and node, in graph order."""
    out = []
    for t in list(graph_leafs(G, gf)) + list(graph_nodes(G, gf)):
        name, buf, data, base = buffer_place(G, t)
        out.append((name, (data - base) if buf and data else None))
    return out


def _scheds(p: SchedPair, n_threads=2, graph_size=2048):
    g = real_ggml()
    p.rbackend = g.backend_cpu_init()
    g.backend_cpu_set_n_threads(p.rbackend, n_threads)
    arr = (ctypes.c_void_p * 1)(p.rbackend)
    p._keep = arr
    p.rsched = g.backend_sched_new(ctypes.addressof(arr), None, 1, graph_size, False, True)
    vb = cpu_backend.backend_cpu_init()
    cpu_backend.backend_cpu_set_n_threads(vb, n_threads)
    p.vbackend = vb
    p.vsched = S.backend_sched_new([vb], None, 1, graph_size, False, True)
    return p.rsched, p.vsched


@needs_oracle
@pytest.mark.parametrize("name,build,external", SCHED_CASES, ids=[c[0] for c in SCHED_CASES])
def test_cpu_sched_matches_ggml(pairs, name, build, external):
    g = real_ggml()
    p = pairs(build, external)
    rs, vs = _scheds(p)
    assert g.backend_sched_alloc_graph(rs, p.r["gf"])
    assert S.backend_sched_alloc_graph(vs, p.v["gf"])
    assert S.backend_sched_get_n_splits(vs) == g.backend_sched_get_n_splits(rs) == 1
    assert S.backend_sched_get_n_copies(vs) == g.backend_sched_get_n_copies(rs) == 1
    assert S.backend_sched_get_n_backends(vs) == g.backend_sched_get_n_backends(rs) == 1
    assert (S.backend_sched_get_buffer_size(vs, p.vbackend)
            == g.backend_sched_get_buffer_size(rs, p.rbackend)), name
    assert _offsets(gg, p.v["gf"]) == _offsets(g, p.r["gf"])
    # the backend of every tensor: the CPU (ggml_backend_sched_get_tensor_backend)
    for t in graph_nodes(gg, p.v["gf"]):
        assert S.backend_sched_get_tensor_backend(vs, t) is p.vbackend
    written = graphs.fill_leaves(g, p.r["gf"], p.r["inputs"])
    graphs.fill_leaves(gg, p.v["gf"], p.v["inputs"], raw=written)
    assert g.backend_sched_graph_compute(rs, p.r["gf"]) == 0
    assert S.backend_sched_graph_compute(vs, p.v["gf"]) == 0
    e = nmse(graphs.to_float(gg, p.v["out"]), graphs.to_float(g, p.r["out"]))
    assert e <= 1e-6, f"{name}: NMSE {e:.2e}"


@needs_oracle
def test_unassigned_leaf_fails_like_ggml():
    """permute_chain's first node is a PERMUTE of the leaf ``a``: pass 4 gives the view the backend of its (still
    unassigned) source, then ``a`` that of its consumer (-1), and only then the view the CPU -- ``a`` keeps -1. C
    reads ``bufts[-1]`` (NULL), sees the backend ids "changed", reserves, and ggml-alloc aborts on
    ``GGML_ASSERT(buffer_id >= 0)``; ggviz raises there. (llama.cpp never meets it: its leafs are weights and KV
    cache in buffers, or inputs.)"""
    p = SchedPair(BUILDERS["permute_chain"])
    _, vs = _scheds(p)
    with pytest.raises(gg.GGMLError, match="buffer_id >= 0"):
        S.backend_sched_alloc_graph(vs, p.v["gf"])
    leafs = {l["name"]: (l["backend_id"], l["cause"]) for l in vs.last_plan["leafs"]}
    assert leafs["a"] == (-1, "4.cur")
    src = (
        "import ctypes\n"
        "from tests.oracle.ggml_lib import RealGGML\n"
        "from tests.graphs import build_permute_chain\n"
        "g = RealGGML(); ctx = g.init(1 << 22, None, True); r = build_permute_chain(g, ctx)\n"
        "be = g.backend_cpu_init(); arr = (ctypes.c_void_p * 1)(be)\n"
        "s = g.backend_sched_new(ctypes.addressof(arr), None, 1, 2048, False, True)\n"
        "g.backend_sched_alloc_graph(s, r['gf'])\n")
    rc, _, err = run_in_subprocess(src)
    assert rc != 0 and "buffer_id >= 0" in err


@needs_oracle
def test_reserve_then_alloc_and_reserve_size_match_ggml(pairs):
    """backend_sched_reserve on the worst case (32 tokens), then a 1-token graph allocated into that plan."""
    g = real_ggml()
    big = pairs(lambda G, c: graphs.build_llama_block(G, c, _Sized32), external=True)
    small = pairs(_llama_sized_1, external=True)
    rs, vs = _scheds(big)
    assert g.backend_sched_reserve(rs, big.r["gf"]) and S.backend_sched_reserve(vs, big.v["gf"])
    rsize = g.backend_sched_get_buffer_size(rs, big.rbackend)
    assert S.backend_sched_get_buffer_size(vs, big.vbackend) == rsize
    sz = (ctypes.c_size_t * 1)()
    g.backend_sched_reserve_size(rs, big.r["gf"], ctypes.addressof(sz))
    assert S.backend_sched_reserve_size(vs, big.v["gf"]) == [sz[0]]
    S.backend_sched_reset(vs)
    g.backend_sched_reset(rs)
    assert g.backend_sched_alloc_graph(rs, small.r["gf"]) and S.backend_sched_alloc_graph(vs, small.v["gf"])
    assert S.backend_sched_get_buffer_size(vs, big.vbackend) == g.backend_sched_get_buffer_size(rs, big.rbackend)
    assert _offsets(gg, small.v["gf"]) == _offsets(g, small.r["gf"])


class _Sized32(LlamaSized1):
    n_tokens, n_past, out_ids = 32, 0, (31,)


_EVAL_CB = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)


@needs_oracle
def test_eval_callback_calls_match_ggml(pairs):
    """The callback sees the same (tensor, ask) sequence, and at ask=False the same data, as with ggml."""
    g = real_ggml()
    p = pairs(graphs.build_llama_block, external=True)
    rs, vs = _scheds(p, n_threads=1)
    want_names = {"attn_norm-0", "kq_soft_max-0", "ffn_out-0", "result_output"}
    rcalls, vcalls, rdata, vdata = [], [], {}, {}

    def rcb(t, ask, ud):
        name = g.tensor_info(t)["name"]
        rcalls.append((name, bool(ask)))
        if not ask:
            rdata[name] = g.to_float(t).copy()
        return name in want_names if ask else True

    def vcb(t, ask, ud):
        vcalls.append((t.name, bool(ask)))
        if not ask:
            vdata[t.name] = gg.get_data_f32(t).copy()
        return t.name in want_names if ask else True

    cb = _EVAL_CB(rcb)
    g.backend_sched_set_eval_callback(rs, ctypes.cast(cb, ctypes.c_void_p).value, None)
    S.backend_sched_set_eval_callback(vs, vcb, None)
    assert g.backend_sched_alloc_graph(rs, p.r["gf"]) and S.backend_sched_alloc_graph(vs, p.v["gf"])
    written = graphs.fill_leaves(g, p.r["gf"], p.r["inputs"])
    graphs.fill_leaves(gg, p.v["gf"], p.v["inputs"], raw=written)
    assert g.backend_sched_graph_compute(rs, p.r["gf"]) == 0
    assert S.backend_sched_graph_compute(vs, p.v["gf"]) == 0
    assert vcalls == rcalls and len(vcalls) > 20
    assert sorted(vdata) == sorted(rdata) == sorted(want_names)
    for k in vdata:
        assert nmse(vdata[k], rdata[k]) <= 1e-6, k


# ====================================================================================================
# 2. several backends: plans derived by hand
# ====================================================================================================

N_EMBD = 64


def build_mini(n_layer=2, n_tok=4):
    """x (input) -> per layer: norm-l = rms_norm(cur); attn_norm-l = norm-l * blk.l.norm.weight;
    h-l = blk.l.w.weight x attn_norm-l; out-l = h-l + cur. Each layer's weights in its own no_alloc context."""
    gctx = gg.init(4 << 20, no_alloc=True)
    wctx = [gg.init(4 * gg.tensor_overhead(), no_alloc=True) for _ in range(n_layer)]
    x = gg.new_tensor_2d(gctx, F32, N_EMBD, n_tok)
    gg.set_name(x, "x")
    gg.set_input(x)
    cur, ws = x, []
    for il in range(n_layer):
        wn = gg.set_name(gg.new_tensor_1d(wctx[il], F32, N_EMBD), f"blk.{il}.norm.weight")
        w = gg.set_name(gg.new_tensor_2d(wctx[il], F32, N_EMBD, N_EMBD), f"blk.{il}.w.weight")
        n = gg.set_name(gg.rms_norm(gctx, cur, 1e-5), f"norm-{il}")
        m = gg.set_name(gg.mul(gctx, n, wn), f"attn_norm-{il}")
        h = gg.set_name(gg.mul_mat(gctx, w, m), f"h-{il}")
        cur = gg.set_name(gg.add(gctx, h, cur), f"out-{il}")
        ws.append((wn, w))
    gf = gg.new_graph_custom(gctx, 256, False)
    gg.build_forward_expand(gf, cur)
    return SimpleNamespace(gctx=gctx, wctx=wctx, gf=gf, x=x, out=cur, ws=ws, n_tok=n_tok, bufs=[],
                           nodes={t.name: t for t in gf.nodes})


def _values(name, shape, seed=0):
    rng = np.random.default_rng([seed, sum(map(ord, name))])
    if "norm" in name:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) / (np.sqrt(shape[-1]) if len(shape) > 1 else 1)).astype(np.float32)


def place(ns, il, buft, usage=WEIGHTS):
    """Layer il's weights into one buffer of ``buft`` (tensor_set: device buffers are not host memory)."""
    buf = A.backend_alloc_ctx_tensors_from_buft(ns.wctx[il], buft)
    assert buf is not None
    B.backend_buffer_set_usage(buf, usage)
    for t in ns.ws[il]:
        v = _values(t.name, tuple(reversed([d for d in t.shape if d > 1] or [1])))
        B.backend_tensor_set(t, v, 0, gg.nbytes(t))
    ns.bufs.append(buf)


def run(ns, backends, pins=(), cb=None, graph_size=256):
    sched = S.backend_sched_new(backends, None, len(backends), graph_size, False, True)
    for name, backend in pins:
        S.backend_sched_set_tensor_backend(sched, ns.nodes[name], backend)
    assert S.backend_sched_alloc_graph(sched, ns.gf)
    xv = _values("x", (ns.n_tok, N_EMBD), seed=1)
    B.backend_tensor_set(ns.x, xv, 0, xv.nbytes)
    if cb is not None:
        S.backend_sched_set_eval_callback(sched, cb, None)
    assert S.backend_sched_graph_compute(sched, ns.gf) == gg.GGML_STATUS_SUCCESS
    out = np.empty((ns.n_tok, N_EMBD), np.float32)
    B.backend_tensor_get(ns.out, out, 0, out.nbytes)
    return sched, out


def reference(n_tok=4, n_layer=2):
    """The same model, weights in host WEIGHTS buffers, on the CPU alone."""
    ns = build_mini(n_layer, n_tok)
    for il in range(n_layer):
        place(ns, il, B.backend_cpu_buffer_type())
    sched, out = run(ns, [cpu_backend.backend_cpu_init()])
    assert S.backend_sched_get_n_splits(sched) == 1
    return out


def assignments(sched, ns) -> dict:
    """node name -> (backend name, cause) from the plan record."""
    return {n["name"]: (n["backend"], n["cause"]) for n in sched.last_plan["nodes"]}


def splits(sched) -> list:
    return [(s["backend"], s["i_start"], s["i_end"], [(i["name"], i["copy"]) for i in s["inputs"]])
            for s in sched.last_plan["splits"]]


def _accel(ops=None, capacity=accel.DEFAULT_CAPACITY):
    dev = accel.backend_accel_device_new("ACCEL0", capacity=capacity, supported_ops=ops)
    return dev, accel.backend_accel_init(dev)


def test_accel_without_rms_norm_splits_around_every_rms_norm():
    """[ACCEL0 (no RMS_NORM), CPU], every weight on the accelerator.

    pass 1: x "1.inp" (CPU); the weight leafs "1.dst" (ACCEL0: its buffer, op NONE); attn_norm-l "1.wgt1" and h-l
            "1.wgt0" (their weights); norm-l, out-l unassigned.
    pass 2: gpu down from attn_norm-0: out-0 "2.sup"; norm-1 stays unassigned (ACCEL0 cannot), out-1 "2.sup";
            gpu up reaches nothing new (norm-0 / norm-1 unsupported).
    pass 3: norm-0: only the CPU supports it, x is on the CPU -> "3.best"; norm-1: its input out-0 is in ACCEL0
            memory, which the CPU cannot use (0 supported inputs) -> still the CPU, "3.best".
    pass 5: CPU [norm-0] | ACCEL0 [attn_norm-0 .. out-0] copies norm-0 and x | CPU [norm-1] copies out-0 |
            ACCEL0 [attn_norm-1 .. out-1] copies norm-1 (out-0 is already on ACCEL0).
    """
    dev, acc = _accel(accel.DEFAULT_SUPPORTED_OPS - {gg.GGML_OP_RMS_NORM})
    cpu = cpu_backend.backend_cpu_init()
    ns = build_mini()
    for il in range(2):
        place(ns, il, B.backend_dev_buffer_type(dev))
    accel.backend_accel_reset_stats(dev)
    sched, out = run(ns, [acc, cpu])
    assert assignments(sched, ns) == {
        "norm-0": ("CPU", "3.best"), "attn_norm-0": ("ACCEL0", "1.wgt1"), "h-0": ("ACCEL0", "1.wgt0"),
        "out-0": ("ACCEL0", "2.sup"), "norm-1": ("CPU", "3.best"), "attn_norm-1": ("ACCEL0", "1.wgt1"),
        "h-1": ("ACCEL0", "1.wgt0"), "out-1": ("ACCEL0", "2.sup")}
    leafs = {l["name"]: (l["backend"], l["cause"]) for l in sched.last_plan["leafs"]}
    assert leafs["x"] == ("CPU", "1.inp")
    assert leafs["blk.0.w.weight"] == leafs["blk.1.norm.weight"] == ("ACCEL0", "1.dst")
    assert splits(sched) == [
        ("CPU", 0, 1, []),
        ("ACCEL0", 1, 4, [("norm-0", "ACCEL0#norm-0#0"), ("x", "ACCEL0#x#0")]),
        ("CPU", 4, 5, [("out-0", "CPU#out-0#0")]),
        ("ACCEL0", 5, 8, [("norm-1", "ACCEL0#norm-1#0")])]
    assert S.backend_sched_get_n_splits(sched) == 4
    assert sched.last_plan["copies_per_backend"] == {"ACCEL0": 3, "CPU": 1}
    # the nodes now read the copies, which have cause "4.cpy"
    an0 = ns.nodes["attn_norm-0"]
    assert an0.src[0].name == "ACCEL0#norm-0#0"
    assert S.backend_sched_get_tensor_cause(sched, an0.src[0]) == "4.cpy"
    assert ns.nodes["norm-1"].src[0].name == "CPU#out-0#0"
    assert B.backend_buffer_name(B.buffer_at(an0.src[0].buffer)) == "ACCEL0"
    # data moved: 3 copies into the device (norm-0, x, norm-1: [64, 4] F32 each), out-0 back, and the result read
    st = accel.backend_accel_stats(dev)
    assert (st["n_h2d"], st["h2d_bytes"]) == (3, 3 * N_EMBD * 4 * 4)
    assert (st["n_d2h"], st["d2h_bytes"]) == (2, 2 * N_EMBD * 4 * 4)
    np.testing.assert_array_equal(out, reference())


def test_weights_split_across_backends():
    """[ACCEL0, BLAS, CPU]: layer 0's weights in a host WEIGHTS buffer, layer 1's on ACCEL0; 4 tokens (too few for
    BLAS and for offloading).

    pass 1: weight leafs of layer 0 "1.dst" on BLAS (the highest-priority backend that takes a host buffer and op
            NONE), of layer 1 on ACCEL0; attn_norm-0 "1.wgt1" / h-0 "1.wgt0" on the CPU (ACCEL0 cannot read host
            memory, BLAS has no MUL and no small MUL_MAT; no offload at 4 rows); attn_norm-1, h-1 on ACCEL0.
    pass 2: gpu down: out-1 "2.sup"; gpu up from attn_norm-1: norm-1 and out-0 "2.sup" on ACCEL0 (until h-0, on
            the CPU); rest up: norm-0 "2.sup" from attn_norm-0 (CPU).
    pass 3: CPU nodes could go to BLAS (same buffer type) but BLAS supports none of them.
    pass 5: CPU [norm-0, attn_norm-0, h-0] | ACCEL0 [out-0 .. out-1], which copies h-0 and x.
    """
    dev, acc = _accel()
    blas_b, cpu = blas.backend_blas_init(), cpu_backend.backend_cpu_init()
    ns = build_mini()
    place(ns, 0, B.backend_cpu_buffer_type())
    place(ns, 1, B.backend_dev_buffer_type(dev))
    sched, out = run(ns, [acc, blas_b, cpu])
    assert assignments(sched, ns) == {
        "norm-0": ("CPU", "2.sup"), "attn_norm-0": ("CPU", "1.wgt1"), "h-0": ("CPU", "1.wgt0"),
        "out-0": ("ACCEL0", "2.sup"), "norm-1": ("ACCEL0", "2.sup"), "attn_norm-1": ("ACCEL0", "1.wgt1"),
        "h-1": ("ACCEL0", "1.wgt0"), "out-1": ("ACCEL0", "2.sup")}
    leafs = {l["name"]: (l["backend"], l["cause"], l["buft"]) for l in sched.last_plan["leafs"]}
    assert leafs["blk.0.w.weight"] == ("BLAS", "1.dst", "CPU")
    assert leafs["blk.1.w.weight"] == ("ACCEL0", "1.dst", "ACCEL0")
    assert splits(sched) == [("CPU", 0, 3, []),
                             ("ACCEL0", 3, 8, [("h-0", "ACCEL0#h-0#0"), ("x", "ACCEL0#x#0")])]
    np.testing.assert_array_equal(out, reference())
    # the compute buffers: ACCEL0's holds the copies and layer-1 activations, the CPU's (shared with BLAS: same
    # buffer type, one gallocr buffer) the rest
    assert S.backend_sched_get_buffer_size(sched, acc) > 0
    assert S.backend_sched_get_buffer_size(sched, cpu) == 0 < S.backend_sched_get_buffer_size(sched, blas_b)


def test_user_pinned_tensor():
    """As test_weights_split_across_backends, with norm-1 pinned to the CPU (set_tensor_backend: "usr").

    pass 2: gpu up from attn_norm-1 stops at norm-1 (a CPU node resets the expansion), so out-0 stays unassigned
            until rest down carries the CPU from h-0: out-0 "2.sup" on the CPU.
    pass 5: CPU [norm-0 .. norm-1] | ACCEL0 [attn_norm-1 .. out-1] copying norm-1 and out-0.
    """
    dev, acc = _accel()
    blas_b, cpu = blas.backend_blas_init(), cpu_backend.backend_cpu_init()
    ns = build_mini()
    place(ns, 0, B.backend_cpu_buffer_type())
    place(ns, 1, B.backend_dev_buffer_type(dev))
    with trace.recording(["sched.assign"]) as rec:
        sched, out = run(ns, [acc, blas_b, cpu], pins=[("norm-1", cpu)])
    assert rec.events[0]["name"] == "norm-1" and rec.events[0]["cause"] == "usr"
    got = assignments(sched, ns)
    assert got["norm-1"] == ("CPU", "usr")
    assert got["out-0"] == ("CPU", "2.sup")
    assert S.backend_sched_get_tensor_backend(sched, ns.nodes["norm-1"]) is cpu
    assert splits(sched) == [("CPU", 0, 5, []),
                             ("ACCEL0", 5, 8, [("norm-1", "ACCEL0#norm-1#0"), ("out-0", "ACCEL0#out-0#0")])]
    np.testing.assert_array_equal(out, reference())


def build_upg(weights_usage):
    """32 tokens, F32: n = x * wn (wn in a host WEIGHTS buffer); h = W x n (W in a host buffer of ``weights_usage``);
    out = h + x."""
    n_tok = 32
    gctx = gg.init(1 << 20, no_alloc=True)
    c0, c1 = gg.init(2 * gg.tensor_overhead(), no_alloc=True), gg.init(2 * gg.tensor_overhead(), no_alloc=True)
    x = gg.set_name(gg.new_tensor_2d(gctx, F32, N_EMBD, n_tok), "x")
    gg.set_input(x)
    wn = gg.set_name(gg.new_tensor_1d(c0, F32, N_EMBD), "wn.norm")
    w = gg.set_name(gg.new_tensor_2d(c1, F32, N_EMBD, N_EMBD), "W")
    n = gg.set_name(gg.mul(gctx, x, wn), "n")
    h = gg.set_name(gg.mul_mat(gctx, w, n), "h")
    out = gg.set_name(gg.add(gctx, h, x), "out")
    gf = gg.new_graph_custom(gctx, 64, False)
    gg.build_forward_expand(gf, out)
    ns = SimpleNamespace(gctx=gctx, wctx=[c0, c1], ws=[(wn,), (w,)], gf=gf, x=x, out=out, n_tok=n_tok, bufs=[],
                         nodes={t.name: t for t in gf.nodes})
    place(ns, 0, B.backend_cpu_buffer_type(), WEIGHTS)
    place(ns, 1, B.backend_cpu_buffer_type(), weights_usage)
    return ns


def test_blas_takes_mul_mat_by_pass3_upgrade():
    """[BLAS, CPU], W in a host buffer that is *not* a WEIGHTS buffer.

    pass 1: n "1.wgt1" (its weight wn; BLAS has no MUL) on the CPU; h has no weight source: unassigned.
    pass 2: rest down from n: h "2.sup" and out "2.sup" on the CPU.
    pass 3: h is on the CPU, BLAS has the same buffer type (CPU), supports this MUL_MAT (32 x 64 x 64, contiguous,
            F32) and every source's buffer -> "3.upg" to BLAS. out: BLAS has no ADD.
    pass 5: CPU [n] | BLAS [h] | CPU [out]: three splits and no copies (one buffer type).
    Then with W in a WEIGHTS buffer, pass 1 already sends h to BLAS ("1.wgt0").
    """
    blas_b, cpu = blas.backend_blas_init(), cpu_backend.backend_cpu_init()
    ns = build_upg(B.GGML_BACKEND_BUFFER_USAGE_ANY)
    sched, out = run(ns, [blas_b, cpu], graph_size=64)
    assert assignments(sched, ns) == {"n": ("CPU", "1.wgt1"), "h": ("BLAS", "3.upg"), "out": ("CPU", "2.sup")}
    assert splits(sched) == [("CPU", 0, 1, []), ("BLAS", 1, 2, []), ("CPU", 2, 3, [])]
    ref_ns = build_upg(B.GGML_BACKEND_BUFFER_USAGE_ANY)
    _, ref = run(ref_ns, [cpu_backend.backend_cpu_init()], graph_size=64)
    assert 0 < nmse(out, ref) <= 1e-10 or np.array_equal(out, ref)
    # float64 reference of the whole thing
    x = _values("x", (32, N_EMBD), seed=1).astype(np.float64)
    wn = _values("wn.norm", (N_EMBD,)).astype(np.float64)
    w = _values("W", (N_EMBD, N_EMBD)).astype(np.float64)
    assert nmse(out, (x * wn) @ w.T + x) <= 1e-10

    ns2 = build_upg(WEIGHTS)
    sched2, out2 = run(ns2, [blas.backend_blas_init(), cpu_backend.backend_cpu_init()], graph_size=64)
    assert assignments(sched2, ns2)["h"] == ("BLAS", "1.wgt0")
    np.testing.assert_array_equal(out2, out)


# ====================================================================================================
# 3. the accelerator's memory
# ====================================================================================================

def test_accel_capacity_exceeded_fails_clearly():
    ns = build_mini(n_tok=64)
    dev, acc = _accel(capacity=2 * 20000)           # room for the two layers' weights (16.6 KB each), not more
    for il in range(2):
        place(ns, il, B.backend_dev_buffer_type(dev))
    free, total = B.backend_dev_memory(dev)
    assert total == 40000 and free == 40000 - 2 * (256 + 16384)      # norm weight + matrix, 128-aligned
    sched = S.backend_sched_new([acc, cpu_backend.backend_cpu_init()], None, 2, 256, False, True)
    assert not S.backend_sched_alloc_graph(sched, ns.gf)
    msg = impl.last_log_error()
    assert "out of memory" in msg and "ACCEL0" in msg
    # the graph now reads the copies of that split: it cannot be split again ...
    with pytest.raises(gg.GGMLError, match="split before"):
        S.backend_sched_graph_compute(sched, ns.gf)
    # ... a new one can, and fails the same way: ggml_backend_sched_graph_compute -> GGML_STATUS_ALLOC_FAILED
    for b in ns.bufs:
        B.backend_buffer_free(b)                  # gives the device memory back
    assert B.backend_dev_memory(dev) == (40000, 40000)
    ns2 = build_mini(n_tok=64)
    for il in range(2):
        place(ns2, il, B.backend_dev_buffer_type(dev))
    # (a fresh scheduler: after a failed reserve ggml's gallocr keeps the plan but not the buffer -- C would
    # dereference the NULL buffer on a retry of the same shape)
    sched2 = S.backend_sched_new([acc, cpu_backend.backend_cpu_init()], None, 2, 256, False, True)
    assert S.backend_sched_graph_compute(sched2, ns2.gf) == gg.GGML_STATUS_ALLOC_FAILED
    # weights that do not fit: ggml_backend_alloc_ctx_tensors_from_buft returns NULL
    dev2, _ = _accel(capacity=1000)
    ns2 = build_mini()
    assert A.backend_alloc_ctx_tensors_from_buft(ns2.wctx[0], B.backend_dev_buffer_type(dev2)) is None
    assert accel.backend_accel_stats(dev2)["n_alloc_failed"] == 1


def test_accel_refuses_host_operands():
    """A graph computed directly on the accelerator must have its operands in device memory (the scheduler's
    copies): a host tensor is refused with a message saying so."""
    dev, acc = _accel()
    ns = build_mini(n_layer=1)
    place(ns, 0, B.backend_cpu_buffer_type())
    galloc = A.gallocr_new(B.backend_cpu_buffer_type())
    assert A.gallocr_alloc_graph(galloc, ns.gf)
    with pytest.raises(gg.GGMLError, match="can only address its own memory"):
        B.backend_graph_compute(acc, ns.gf)


# ====================================================================================================
# 4. the eval callback
# ====================================================================================================

def test_eval_callback_order_across_splits():
    """Asked per node of each split in graph order; a wanted node ends a range (compute, then ask=False with the
    data ready, equal to the CPU-only values); the ranges never cross a split (norm-0 is a split by itself)."""
    dev, acc = _accel(accel.DEFAULT_SUPPORTED_OPS - {gg.GGML_OP_RMS_NORM})
    ns = build_mini()
    for il in range(2):
        place(ns, il, B.backend_dev_buffer_type(dev))
    want = {"norm-0", "out-0", "h-1"}
    calls, seen = [], {}

    def cb(t, ask, ud):
        calls.append((t.name, bool(ask)))
        if ask:
            return t.name in want
        buf = np.empty(gg.nbytes(t), np.uint8)
        B.backend_tensor_get(t, buf, 0, buf.nbytes)        # device tensors are read through the backend
        seen[t.name] = buf.view(np.float32).copy()
        return True

    with trace.recording(["sched.compute_split", "sched.eval"]) as rec:
        run(ns, [acc, cpu_backend.backend_cpu_init()], cb=cb)
    assert calls == [("norm-0", True), ("norm-0", False),
                     ("attn_norm-0", True), ("h-0", True), ("out-0", True), ("out-0", False),
                     ("norm-1", True),
                     ("attn_norm-1", True), ("h-1", True), ("h-1", False), ("out-1", True)]
    assert [e["backend"] for e in rec.of("sched.compute_split")] == ["CPU", "ACCEL0", "CPU", "ACCEL0"]
    assert [(e["j0"], e["j1"]) for e in rec.of("sched.eval")] == [(0, 0), (1, 3), (4, 4), (5, 6), (7, 7)]
    # the same values as the CPU-only run
    ref = build_mini()
    for il in range(2):
        place(ref, il, B.backend_cpu_buffer_type())
    ref_seen = {}

    def rcb(t, ask, ud):
        if ask:
            return t.name in want
        ref_seen[t.name] = gg.get_data_f32(t).ravel().copy()
        return True

    run(ref, [cpu_backend.backend_cpu_init()], cb=rcb)
    for k in want:
        np.testing.assert_array_equal(seen[k], ref_seen[k])


# ====================================================================================================
# 5. trace events, the plan record, SmolLM2
# ====================================================================================================

def test_trace_events_and_plan_record():
    dev, acc = _accel(accel.DEFAULT_SUPPORTED_OPS - {gg.GGML_OP_RMS_NORM})
    ns = build_mini()
    for il in range(2):
        place(ns, il, B.backend_dev_buffer_type(dev))
    kinds = ["sched.pass", "sched.assign", "sched.split", "sched.copy", "sched.compute_split", "sched.alloc"]
    with trace.recording(kinds) as rec:
        sched, _ = run(ns, [acc, cpu_backend.backend_cpu_init()])
    assert [e["pass"] for e in rec.of("sched.pass")] == ["1", "2.1", "2.2", "2.3", "2.4", "3", "4", "5"]
    # every node's final (backend, cause) is the last assign event for it
    last = {}
    for e in rec.of("sched.assign"):
        last[e["addr"]] = (e["backend"], e["cause"])
    for n in sched.last_plan["nodes"]:
        assert last[ns.nodes[n["name"]].addr] == (n["backend"], n["cause"])
    assert [(e["backend"], e["i_start"], e["i_end"]) for e in rec.of("sched.split")] == \
        [(s["backend"], s["i_start"], s["i_end"]) for s in sched.last_plan["splits"]]
    made = [e for e in rec.of("sched.copy") if e["phase"] == "split"]
    moved = [e for e in rec.of("sched.copy") if e["phase"] == "compute"]
    assert [e["copy"] for e in made] == [e["copy"] for e in moved] == \
        ["ACCEL0#norm-0#0", "ACCEL0#x#0", "CPU#out-0#0", "ACCEL0#norm-1#0"]
    assert len(rec.of("sched.compute_split")) == 4
    alloc = rec.of("sched.alloc")[-1]
    assert alloc["ok"] and alloc["reserved"] and alloc["sizes"]["ACCEL0"] > 0
    text = S.backend_sched_print_assignments(sched, ns.gf)
    assert "## SPLIT #1: ACCEL0 # 2 inputs: [norm-0 (" in text and "3.best" in text


def _llama():
    pytest.importorskip("ggviz.llama")
    from ggviz import llama
    if not os.path.exists(MODEL):
        pytest.skip("SmolLM2 model not downloaded")
    return llama


def _decode_plan(llama, ngl, ops=None, n_tokens=1):
    """Load with -ngl, make a context, build + split + allocate the decode graph (no compute)."""
    dev = accel.backend_accel_device_new("ACCEL0", supported_ops=ops)
    mp = llama.model_default_params()
    mp.devices, mp.n_gpu_layers = [dev], ngl
    mp.use_extra_bufts = False          # (no repacking at load: the decode plan is the same, the load faster)
    model = llama.model_load_from_file(MODEL, mp)
    cp = llama.context_default_params()
    cp.n_ctx, cp.flash_attn_type = 256, llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.use_blas = True                  # [ACCEL0, BLAS, CPU]: the BLAS backend opted in (a GGML_BLAS build)
    ctx = llama.init_from_model(model, cp)
    S.backend_sched_reset(ctx.sched)
    res = ctx.build_graph(n_tokens, 1, 256)
    assert S.backend_sched_alloc_graph(ctx.sched, res.gf)
    return model, ctx, ctx.sched.last_plan


def _split_summary(plan):
    return [(s["backend"], len(s["inputs"])) for s in plan["splits"]]


def test_smollm2_decode_plans():
    """SmolLM2 (30 layers) decode, [ACCEL0, BLAS, CPU]: where the splits fall for -ngl 0/10/30/31 and with an
    accelerator that lacks RMS_NORM (ngl 30): 1, 3, 3, 2 and 121 splits."""
    llama = _llama()
    inputs = ["inp_pos", "attn_inp_k_idxs", "attn_inp_v_idxs", "attn_inp_kq_mask", "out_ids"]

    model, ctx, p = _decode_plan(llama, 0)
    assert [B.backend_buffer_name(b) for b in model.bufs][-1] == "CPU_Mapped"
    assert _split_summary(p) == [("CPU", 0)]
    assert {n["cause"] for n in p["nodes"] if n["name"].startswith("norm-")} == {"usr"}   # llama.cpp's pinning

    model, ctx, p = _decode_plan(llama, 10)
    assert [B.backend_dev_name(d) for d in model.dev_layer] == ["CPU"] * 20 + ["ACCEL0"] * 10
    assert B.backend_buffer_name(B.buffer_at(model.layers[25].wq.buffer)) == "ACCEL0"
    assert B.backend_buffer_name(B.buffer_at(ctx.kv.k_l[25].buffer)) == "ACCEL0"
    assert B.backend_buffer_name(B.buffer_at(ctx.kv.k_l[5].buffer)) == "CPU"
    assert _split_summary(p) == [("CPU", 0), ("ACCEL0", 7), ("CPU", 1)]
    # layer 19's last add is pulled up to the accelerator (gpu up from the pinned norm-20): its two operands are
    # copied, then the graph inputs; the output layer gets the final norm back
    assert [i["name"] for i in p["splits"][1]["inputs"]] == ["ffn_out-19", "ffn_inp-19"] + inputs
    assert [i["copy"] for i in p["splits"][2]["inputs"]] == ["CPU#norm#0"]
    byname = {(n["name"], n["op"]): (n["backend"], n["cause"]) for n in p["nodes"]}
    assert byname[("l_out-19", "ADD")] == ("ACCEL0", "2.sup")
    assert byname[("norm-20", "RMS_NORM")] == ("ACCEL0", "usr")
    assert byname[("attn_out-25", "MUL_MAT")] == ("ACCEL0", "1.wgt0")
    assert byname[("result_output", "MUL_MAT")] == ("CPU", "1.wgt0")

    _, _, p = _decode_plan(llama, 30)
    assert _split_summary(p) == [("CPU", 0), ("ACCEL0", 6), ("CPU", 1)]
    assert [i["name"] for i in p["splits"][1]["inputs"]] == ["embd"] + inputs

    model, _, p = _decode_plan(llama, 31)
    assert B.backend_dev_name(model.dev_output) == "ACCEL0"
    assert model.output.name == "token_embd.weight" and model.output is not model.tok_embd   # duplicated
    assert _split_summary(p) == [("CPU", 0), ("ACCEL0", 6)]

    _, _, p = _decode_plan(llama, 30, accel.DEFAULT_SUPPORTED_OPS - {gg.GGML_OP_RMS_NORM})
    summ = _split_summary(p)
    assert len(summ) == 121 and sum(n for _, n in summ) == 126
    assert summ[:4] == [("CPU", 0), ("ACCEL0", 6), ("CPU", 1), ("ACCEL0", 1)]
    assert p["copies_per_backend"] == {"ACCEL0": 66, "BLAS": 0, "CPU": 60}
    causes = {(n["name"], n["op"]): n["cause"] for n in p["nodes"]}
    assert causes[("norm-5", "RMS_NORM")] == "3.best"

    # 30 layers of weights (~72 MB) on an 8 MiB device: the load fails like llama.cpp's "unable to allocate"
    small = accel.backend_accel_device_new("ACCEL0", capacity=8 << 20)
    mp = llama.model_default_params()
    mp.devices, mp.n_gpu_layers, mp.use_extra_bufts = [small], 30, False
    with pytest.raises(MemoryError, match="unable to allocate ACCEL0 buffer.*out of memory"):
        llama.model_load_from_file(MODEL, mp)


def test_smollm2_decode_bitwise_with_122_splits():
    """The faithful CPU path vs the same model with every layer and the output on an accelerator without
    RMS_NORM (122 splits: the output layer's norm is a split of its own too; 127 copies per token): the logits
    are bitwise equal."""
    llama = _llama()
    logits = []
    for ngl, ops in ((0, None), (31, accel.DEFAULT_SUPPORTED_OPS - {gg.GGML_OP_RMS_NORM})):
        dev = accel.backend_accel_device_new("ACCEL0", supported_ops=ops)
        mp = llama.model_default_params()
        mp.devices, mp.n_gpu_layers, mp.use_extra_bufts = [dev], ngl, False
        model = llama.model_load_from_file(MODEL, mp)
        cp = llama.context_default_params()
        cp.n_ctx, cp.flash_attn_type = 256, llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.n_threads = cp.n_threads_batch = 1       # faithful kernels: a second thread only adds GIL and barriers
        ctx = llama.init_from_model(model, cp)
        assert llama.decode(ctx, llama.batch_get_one([9690])) == 0
        logits.append(llama.get_logits(ctx).copy())
        if ngl:
            assert ctx.sched.n_splits == 122 and ctx.sched.last_plan["n_inputs"] == 127
    np.testing.assert_array_equal(logits[1], logits[0])


def test_smollm2_prompt_through_blas_keeps_quality():
    """A 32-token prompt on CPU+BLAS, weights in host memory: BLAS takes every weight MUL_MAT (32 rows) by
    "1.wgt0", and, being the only non-CPU backend, expands down ("2.sup") through the nodes it cannot run to the
    attention's kqv (V^T.softmax: contiguous when n_kv = kv_size); teacher-forced top-1 against llama.cpp's logits
    stays >= 0.93 (the first 32 tokens of the reference text)."""
    llama = _llama()
    z = np.load(os.path.join(DATA, "smollm2_teacher_forced_seq1.npz"))
    ids, ref = z["ids"][:32], z["logits"][:32]
    mp = llama.model_default_params()
    mp.use_extra_bufts = False                  # weights in CPU_Mapped (host) memory, where BLAS can read them
    model = llama.model_load_from_file(MODEL, mp)
    cp = llama.context_default_params()
    cp.n_ctx, cp.flash_attn_type = 256, llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.n_threads = cp.n_threads_batch = 1       # faithful kernels: a second thread only adds GIL and barriers
    cp.use_blas = True                          # opt-in, as llama.cpp built with GGML_BLAS
    ctx = llama.init_from_model(model, cp)
    assert [B.backend_name(b) for b in ctx.backends] == ["BLAS", "CPU"]
    b = llama.batch_init(len(ids))
    for i, t in enumerate(ids):
        llama.batch_add(b, int(t), i, [0], True)
    assert llama.decode(ctx, b) == 0
    mine = llama.get_logits(ctx).copy()
    plan = ctx.sched.last_plan
    causes = {}
    for n in plan["nodes"]:
        if n["op"] == "MUL_MAT" and n["backend"] == "BLAS":
            causes.setdefault(n["cause"], set()).add(n["name"].split("-")[0])
    assert causes["1.wgt0"] == {"Qcur", "Kcur", "Vcur", "attn_out", "ffn_gate", "ffn_up", "ffn_out", "result_output"}
    assert causes["2.sup"] == {"kqv"}
    top1 = float((mine.argmax(-1) == ref.argmax(-1)).mean())
    assert top1 >= 0.93, f"teacher-forced top-1 {top1:.3f}"


def test_split_memo_only_where_the_passes_would_agree(monkeypatch):
    """A graph split again (after a reset) with only ne/nb changed takes passes 1-4 from its last split (the split
    memo); the result equals the passes' own, node by node. Any other changed field, or a trace listener (the views
    read the passes' events), runs the passes."""
    ctx = gg.init(1 << 20, no_alloc=True)
    a = gg.new_tensor_2d(ctx, gg.GGML_TYPE_F32, 8, 4)
    b = gg.new_tensor_2d(ctx, gg.GGML_TYPE_F32, 8, 4)
    gg.set_input(a)
    gg.set_input(b)
    s = gg.add(ctx, a, b)
    c = gg.mul(ctx, s, b)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, c)
    sched = S.backend_sched_new([cpu_backend.backend_cpu_init()], None, 1, 256, False, True)

    def split():
        S.backend_sched_reset(sched)
        S.backend_sched_split_graph(sched, gf)
        return (sched.last_plan, list(sched.hv_tensor_backend_ids), dict(sched.causes), dict(sched._slot),
                sched.hash_set.used.copy().tolist())

    first = split()
    assert sched.n_split_memo == 0
    assert split() == first and sched.n_split_memo == 1
    for t in (a, b, s, c):                       # a new shape, in place (as llama.graph.derive_n_kv writes them)
        t.ne[1] = 2
        t.nb[2] = t.nb[3] = t.nb[1] * 2
    derived = split()
    assert sched.n_split_memo == 2
    with monkeypatch.context() as m:
        m.setattr(S, "_split_memo_match", lambda sched, graph: None)
        assert split() == derived                # the passes' own result
    s.op_params[0] = 1                           # another field: the passes run
    split()
    assert sched.n_split_memo == 2
    split()
    assert sched.n_split_memo == 3               # (and remember it)
    with trace.recording(["sched.pass", "sched.assign"]) as rec:
        split()
    assert sched.n_split_memo == 3
    assert {e["pass"] for e in rec.events if e["kind"] == "sched.pass"} >= {"1", "2.1", "3", "4", "5"}


@pytest.mark.parametrize("ngl", [0, 10])
def test_node_words_decide_only_nodes_backend_id_from_cur_leaves_unassigned(ngl):
    """Pass 1 skips backend_sched_backend_id_from_cur for the nodes whose struct words (in the graph's arena) show
    it would return -1 without asking a backend or setting a cause (no buffer, no input flag, no source with a
    buffer, or ROPE / FLASH_ATTN_EXT). For each such node of SmolLM2's prompt graph -- the CPU alone, and weights
    split over ACCEL0 and the CPU -- the call itself returns -1, asks nothing, sets no cause; the whole split equals
    the one that calls it for every node; and the other nodes (a weight's consumer, a view of the KV cache, an
    input) are left to the call."""
    llama = _llama()
    model, ctx, _ = _decode_plan(llama, ngl, n_tokens=8)
    sched = ctx.sched

    def split():
        S.backend_sched_reset(sched)
        res = ctx.build_graph(8, 1, 256)
        for t, b in res.sched_pins:
            S.backend_sched_set_tensor_backend(sched, t, b)
        S.backend_sched_split_graph(sched, res.gf)
        tensors = list(res.gf.leafs) + list(res.gf.nodes)
        return res.gf, (sched.last_plan, [S._tbid(sched, t) for t in tensors],
                        [S.backend_sched_get_tensor_cause(sched, t) for t in tensors], sched.n_splits,
                        [(s.backend_id, s.i_start, s.i_end, [i.name for i in s.inputs])
                         for s in sched.splits[:sched.n_splits]])

    gf, ours = split()
    ops, vss, srcs, decided = S._node_words(gf.nodes)
    assert ops == [n.op for n in gf.nodes]
    assert 0.4 < sum(decided) / len(decided) < 0.8
    weights = {id(t) for t in gf.leafs if t.buffer}
    by_weight = [d for n, d in zip(gf.nodes, decided) if any(id(s) in weights for s in n.src if s is not None)]
    assert len(by_weight) > 60 and not any(by_weight)      # the MUL_MATs by a weight, the MULs by a norm weight
    assert [d for n, d in zip(gf.nodes, decided) if n.flags & gg.GGML_TENSOR_FLAG_INPUT] == []
    sched._queries = []
    causes = dict(sched.causes)
    for node, d in zip(gf.nodes, decided):
        if d:
            assert S.backend_sched_backend_id_from_cur(sched, node) == -1, node.name
    assert sched._queries == [] and sched.causes == causes
    sched._queries = None
    orig = S._node_words
    try:
        S._node_words = lambda nodes: orig(nodes)[:3] + ([False] * len(nodes),)
        gf2, theirs = split()
    finally:
        S._node_words = orig
    assert [n.name for n in gf2.nodes] == [n.name for n in gf.nodes]
    assert theirs[1:] == ours[1:]
    assert len(ours[4]) == (1 if ngl == 0 else 3)
    assert [{k: v for k, v in n.items() if k != "addr"} for n in theirs[0]["nodes"]] == \
           [{k: v for k, v in n.items() if k != "addr"} for n in ours[0]["nodes"]]
