"""Differential tests of ggviz's ggml core against the real ggml 0.20.2 (tests/oracle/ggml_lib.py).

Every assertion compares ggviz with real ggml running the same builder from tests/graphs.py:

1. arena layout (normal / no_alloc / caller-provided buffer contexts): used_mem, the object list, every tensor
   struct field, and the arena bytes themselves with pointer fields made relative to the arena base;
2. graphs: node / leaf order, counts, auto-names, use counts through each engine's hash set, overflow errors,
   ggml_graph_overhead_custom;
3. plans: ggml_graph_plan's n_threads and work_size for 1..8 threads;
4. results: every node's output after ggml_graph_compute_with_ctx with 1, 2 and 4 threads (NMSE <= 1e-6, a
   per-op summary is printed with ``-s``), ggviz bitwise identical across thread counts;
5. error messages of ggviz where real ggml aborts (shown in a subprocess).
"""
from __future__ import annotations

import math
import re
import textwrap
from functools import lru_cache

import numpy as np
import pytest


from tests import graphs
from tests.graphs import BUILDERS, graph_leafs, graph_nodes, tensor_info
from tests.oracle.ggml_lib import RealGGML, available, run_in_subprocess, unavailable_reason

from ggviz import ggml as gg

pytestmark = pytest.mark.skipif(not available(), reason="real ggml oracle: " + unavailable_reason())

MEM = 2 * 1024 * 1024
MODES = ("alloc", "no_alloc", "buffer")
NAMES = list(BUILDERS)
NMSE_MAX = 1e-6

OBJ_TENSOR, OBJ_GRAPH, OBJ_WORK = 0, 1, 2            # enum ggml_object_type
TENSOR_SIZE, OBJECT_SIZE, CGRAPH_SIZE = 336, 32, 96
U64 = (1 << 64) - 1

# struct ggml_tensor: byte offset -> field (for messages)
_TENSOR_FIELDS = [(0, "type"), (4, "<pad>"), (8, "buffer"), (16, "ne"), (48, "nb"), (80, "op"), (84, "op_params"),
                  (148, "flags"), (152, "src"), (232, "view_src"), (240, "view_offs"), (248, "data"), (256, "name"),
                  (320, "extra"), (328, "padding"), (336, "<data>")]
_TENSOR_PTRS = [8] + [152 + 8 * i for i in range(10)] + [232, 248, 320]
# struct ggml_cgraph: pointer members (nodes, grads, grad_accs, leafs, use_counts, hash.used, hash.keys)
_CGRAPH_PTRS = [16, 24, 32, 40, 48, 64, 72]
_CGRAPH_FIELDS = [(0, "size"), (4, "n_nodes"), (8, "n_leafs"), (12, "<pad>"), (16, "nodes"), (24, "grads"),
                  (32, "grad_accs"), (40, "leafs"), (48, "use_counts"), (56, "hash.size"), (64, "hash.used"),
                  (72, "hash.keys"), (80, "order"), (84, "<pad>"), (88, "uid")]


@pytest.fixture(scope="module")
def g():
    return RealGGML()


_REAL = None


def _g():
    global _REAL
    if _REAL is None:
        _REAL = RealGGML()
    return _REAL


# ====================================================================================================
# building the same graph in both engines
# ====================================================================================================

class Pair:
    """One builder built in both engines, in the same kind of context."""

    def __init__(self, name, mode, mem=MEM):
        g = _g()
        self.name, self.mode = name, mode
        fn = BUILDERS[name]
        self._big = None
        if mode == "buffer":
            # Caller-provided, zeroed buffers whose bases differ by a multiple of 16 * hash_size: ggml_hash() is
            # (address >> 4) % size, so both graphs then put every tensor in the same hash slot and the whole
            # arena (use_counts and bitset included) can be compared byte for byte.
            probe = gg.init(MEM, no_alloc=True)
            try:
                hs = fn(gg, probe)["gf"].visited_hash_set.size
            finally:
                gg.free(probe)
            step = 16 * hs
            k = -(-mem // step) * step
            big = np.zeros(k + mem + 128, dtype=np.uint8)
            o = (-big.ctypes.data) % 64
            self._big = big
            self.rctx = g.init(mem, big[o:o + mem])
            self.vctx = gg.init(mem, big[o + k:o + k + mem])
        else:
            no_alloc = mode == "no_alloc"
            self.rctx = g.init(mem, None, no_alloc)
            self.vctx = gg.init(mem, None, no_alloc)
        self.r = fn(g, self.rctx)
        self.v = fn(gg, self.vctx)
        self.rbase = int(g.get_mem_buffer(self.rctx))
        self.vbase = self.vctx.base

    @property
    def rgf(self):
        return self.r["gf"]

    @property
    def vgf(self):
        return self.v["gf"]

    def close(self):
        _g().free(self.rctx)
        gg.free(self.vctx)


@pytest.fixture
def pair_factory():
    made = []

    def make(name, mode="alloc", mem=MEM):
        p = Pair(name, mode, mem)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


# ----------------------------------------------------------------------------------------------------
# objects, tensors, arena bytes
# ----------------------------------------------------------------------------------------------------

def real_objects(g, ctx, base):
    return [(o["addr"] - base, o["offs"], o["size"], o["type"], (o["next"] - base) if o["next"] else None)
            for o in g.context_info(ctx)["objects"]]


def viz_objects(ctx, base):
    return [(o.hdr_offs, o.offs, o.size, o.type, (o.next - base) if o.next else None) for o in ctx.objects]


def real_tensors(g, ctx, base):
    return [tensor_info(g, base + offs, base) for (_h, offs, _s, typ, _n) in real_objects(g, ctx, base)
            if typ == OBJ_TENSOR]


def viz_tensors(ctx, base):
    return [tensor_info(gg, o.payload, base) for o in ctx.objects if o.type == OBJ_TENSOR]


def _graph_layout(size, hs, grads):
    """ggml_new_graph_custom's incr_ptr_aligned sequence: offsets inside the graph object, and its size."""
    p = CGRAPH_SIZE
    lay = {}

    def inc(key, n, align):
        nonlocal p
        p = (p + align - 1) // align * align
        lay[key] = p
        p += n

    inc("nodes", size * 8, 8)
    inc("leafs", size * 8, 8)
    inc("use_counts", hs * 4, 4)
    inc("keys", hs * 8, 8)
    if grads:
        inc("grads", hs * 8, 8)
        inc("grad_accs", hs * 8, 8)
    inc("used", ((hs + 31) // 32) * 4, 4)
    return lay, p


def normalized_arena(arena, base, objects, exact):
    """A copy of the arena where every pointer field holds (pointer - base), work buffers are blanked, and - unless
    ``exact`` (zeroed caller buffers with hash-aligned bases) - the bytes that differ between engines by design are
    blanked: tensor data (uninitialised malloc'ed memory in ggml), the unused tails of the node/leaf arrays, and the
    hash set arrays (their slots depend on absolute addresses; compared as a mapping instead)."""
    a = np.array(arena, dtype=np.uint8, copy=True)
    q = a.view("<u8")
    w = a.view("<i4")

    def rel(off):
        v = int(q[off // 8])
        if v:
            q[off // 8] = (v - base) & U64

    for hdr, offs, size, typ, _next in objects:
        rel(hdr + 16)
        if typ == OBJ_TENSOR:
            for f in _TENSOR_PTRS:
                rel(offs + f)
            if not exact:
                a[offs + 4:offs + 8] = 0                      # struct padding after `type`
                a[offs + TENSOR_SIZE:offs + size] = 0         # data (and its alignment padding)
        elif typ == OBJ_GRAPH:
            gsize, n_nodes, n_leafs = (int(x) for x in w[offs // 4:offs // 4 + 3])
            hs = int(q[(offs + 56) // 8])
            grads = bool(q[(offs + 24) // 8])
            lay, _ = _graph_layout(gsize, hs, grads)
            for f in _CGRAPH_PTRS:
                rel(offs + f)
            for i in range(n_nodes):
                rel(offs + lay["nodes"] + 8 * i)
            for i in range(n_leafs):
                rel(offs + lay["leafs"] + 8 * i)
            used_w = a[offs + lay["used"]:offs + lay["used"] + ((hs + 31) // 32) * 4].view("<u4")
            if exact:
                for i in range(hs):
                    if (int(used_w[i >> 5]) >> (i & 31)) & 1:
                        rel(offs + lay["keys"] + 8 * i)
                if grads:
                    for i in range(hs):
                        rel(offs + lay["grads"] + 8 * i)
                        rel(offs + lay["grad_accs"] + 8 * i)
            else:
                # struct padding and the alignment gaps between the arrays are never written by ggml
                a[offs + 12:offs + 16] = 0
                a[offs + 84:offs + 88] = 0
                ends = {"nodes": 8 * gsize, "leafs": 8 * gsize, "use_counts": 4 * hs, "keys": 8 * hs,
                        "grads": 8 * hs, "grad_accs": 8 * hs, "used": ((hs + 31) // 32) * 4}
                covered = np.zeros(size, dtype=bool)
                covered[:CGRAPH_SIZE] = True
                for key, start in lay.items():
                    covered[start:start + ends[key]] = True
                a[offs:offs + size][~covered] = 0
                a[offs + lay["nodes"] + 8 * n_nodes:offs + lay["nodes"] + 8 * gsize] = 0
                a[offs + lay["leafs"] + 8 * n_leafs:offs + lay["leafs"] + 8 * gsize] = 0
                a[offs + lay["use_counts"]:offs + lay["use_counts"] + 4 * hs] = 0
                a[offs + lay["keys"]:offs + lay["keys"] + 8 * hs] = 0
                a[offs + lay["used"]:offs + lay["used"] + ((hs + 31) // 32) * 4] = 0
        elif typ == OBJ_WORK:
            a[offs:offs + size] = 0
    return a


def describe_offset(off, objects):
    """Which object and which field a byte offset of the arena belongs to."""
    for k, (hdr, offs, size, typ, _n) in enumerate(objects):
        if hdr <= off < offs:
            fld = {0: "offs", 8: "size", 16: "next", 24: "type", 28: "padding"}[max(
                x for x in (0, 8, 16, 24, 28) if x <= off - hdr)]
            return "object #%d header +%d (%s)" % (k, off - hdr, fld)
        if offs <= off < offs + size:
            rel = off - offs
            kind = {OBJ_TENSOR: "tensor", OBJ_GRAPH: "graph", OBJ_WORK: "work_buffer"}.get(typ, str(typ))
            if typ == OBJ_TENSOR:
                fld = [n for (o, n) in _TENSOR_FIELDS if o <= rel][-1]
            elif typ == OBJ_GRAPH and rel < CGRAPH_SIZE:
                fld = [n for (o, n) in _CGRAPH_FIELDS if o <= rel][-1]
            else:
                fld = "payload"
            return "object #%d (%s at offs %d) +%d (%s)" % (k, kind, offs, rel, fld)
    return "beyond the last object"


def graph_hash_map(G, gf, base):
    """{relative tensor address: use count} for every slot the graph's visited hash set uses."""
    if graphs.is_oracle(G):
        gi = G.graph_info(gf)
        return {k - base: gi["use_counts"][i] for i, k in enumerate(gi["hash_keys"]) if gi["hash_used"][i]}
    hs = gf.visited_hash_set
    return {int(hs.keys[i]) - base: int(gf.use_counts[i]) for i in range(hs.size) if hs.get_used(i)}


def real_use_count(g, gf, t):
    """ggml_node_get_use_count: ggml_hash_find's probe sequence over the real hash set."""
    gi = g.graph_info(gf)
    size = gi["hash_size"]
    h = (t >> 4) % size
    i = h
    while gi["hash_used"][i] and gi["hash_keys"][i] != t:
        i = (i + 1) % size
        if i == h:
            return None
    return gi["use_counts"][i] if gi["hash_used"][i] else None


def _fields_diff(rt, vt, where):
    out = []
    for k in rt:
        if rt[k] != vt[k]:
            out.append("%s %s: ggml %r, ggviz %r" % (where, k, rt[k], vt[k]))
    return out


# ====================================================================================================
# 1. arena layout
# ====================================================================================================

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_arena_layout(g, pair_factory, name, mode):
    p = pair_factory(name, mode)
    assert gg.used_mem(p.vctx) == g.used_mem(p.rctx), "used_mem"
    assert p.vctx.n_objects == g.context_info(p.rctx)["n_objects"], "ctx->n_objects"
    ro, vo = real_objects(g, p.rctx, p.rbase), viz_objects(p.vctx, p.vbase)
    assert len(vo) == len(ro), "number of objects"
    for k, (a, b) in enumerate(zip(ro, vo)):
        assert a == b, "object #%d (hdr, offs, size, type, next): ggml %r, ggviz %r" % (k, a, b)

    rts, vts = real_tensors(g, p.rctx, p.rbase), viz_tensors(p.vctx, p.vbase)
    assert len(rts) == len(vts)
    diffs = []
    for rt, vt in zip(rts, vts):
        diffs += _fields_diff(rt, vt, "tensor %r @%s" % (rt["name"], rt["addr"]))
    assert not diffs, "\n".join(diffs[:20])
    if mode == "no_alloc":
        assert all(t["data"] is None for t in rts), "no_alloc: every data pointer is NULL in ggml"

    exact = mode == "buffer"
    ra = normalized_arena(g.arena_bytes(p.rctx), p.rbase, ro, exact)
    va = normalized_arena(np.array(gg.get_mem_buffer(p.vctx)[:gg.used_mem(p.vctx)]), p.vbase, vo, exact)
    assert ra.shape == va.shape
    bad = np.flatnonzero(ra != va)
    assert bad.size == 0, "arena bytes differ at %d offsets, first: %s" % (bad.size, "; ".join(
        "%d [%s] ggml %02x ggviz %02x" % (o, describe_offset(int(o), ro), ra[o], va[o]) for o in bad[:8]))


def test_arena_after_compute_and_fill(g, pair_factory):
    """Filled data and the WORK_BUFFER objects of ggml_graph_compute_with_ctx keep the arenas identical."""
    p = pair_factory("llama_block", "buffer")
    written = graphs.fill_leaves(g, p.rgf, p.r["inputs"])
    graphs.fill_leaves(gg, p.vgf, p.v["inputs"], raw=written)
    ro, vo = real_objects(g, p.rctx, p.rbase), viz_objects(p.vctx, p.vbase)
    ra = normalized_arena(g.arena_bytes(p.rctx), p.rbase, ro, True)
    va = normalized_arena(np.array(gg.get_mem_buffer(p.vctx)[:gg.used_mem(p.vctx)]), p.vbase, vo, True)
    bad = np.flatnonzero(ra != va)
    assert bad.size == 0, "after fill: %s" % [(int(o), describe_offset(int(o), ro)) for o in bad[:8]]
    for n in (1, 3):
        assert g.graph_compute_with_ctx(p.rctx, p.rgf, n) == 0
        assert gg.graph_compute_with_ctx(p.vctx, p.vgf, n) == 0
    assert gg.used_mem(p.vctx) == g.used_mem(p.rctx)
    assert viz_objects(p.vctx, p.vbase) == real_objects(g, p.rctx, p.rbase)


# ====================================================================================================
# 2. graphs
# ====================================================================================================

@pytest.mark.parametrize("name", NAMES)
def test_graph_structure(g, pair_factory, name):
    p = pair_factory(name, "alloc")
    rgi = g.graph_info(p.rgf)
    vgf = p.vgf
    assert (vgf.size, vgf.n_nodes, vgf.n_leafs) == (rgi["size"], rgi["n_nodes"], rgi["n_leafs"])
    assert vgf.visited_hash_set.size == rgi["hash_size"]
    assert (vgf.order, vgf.uid) == (rgi["order"], rgi["uid"])

    rn = [graphs.tensor_info(g, t, p.rbase) for t in graph_nodes(g, p.rgf)]
    vn = [graphs.tensor_info(gg, t, p.vbase) for t in graph_nodes(gg, vgf)]
    rl = [graphs.tensor_info(g, t, p.rbase) for t in graph_leafs(g, p.rgf)]
    vl = [graphs.tensor_info(gg, t, p.vbase) for t in graph_leafs(gg, vgf)]
    assert [t["addr"] for t in vn] == [t["addr"] for t in rn], "node order"
    assert [t["addr"] for t in vl] == [t["addr"] for t in rl], "leaf order"
    assert [t["name"] for t in vn] == [t["name"] for t in rn], "node names (node_%d auto-names included)"
    assert [t["name"] for t in vl] == [t["name"] for t in rl], "leaf names (leaf_%d auto-names included)"
    flag_c = g.GGML_TENSOR_FLAG_COMPUTE
    assert [t["flags"] for t in vn] == [t["flags"] for t in rn], "node flags"
    assert [t["flags"] for t in vl] == [t["flags"] for t in rl], "leaf flags"
    assert all(t["flags"] & flag_c for t in rn if t["op"] != 0)

    # use counts through each engine's own hash lookup, for every node and leaf
    for rt, vt in zip(graph_nodes(g, p.rgf) + graph_leafs(g, p.rgf), graph_nodes(gg, vgf) + graph_leafs(gg, vgf)):
        assert vgf.use_count(vt) == real_use_count(g, p.rgf, rt), "use count of %r" % vt.name
    # the whole visited set, as {relative address: use count}
    assert graph_hash_map(gg, vgf, p.vbase) == graph_hash_map(g, p.rgf, p.rbase)


def test_auto_names_seed_example(g, pair_factory):
    p = pair_factory("simple_add", "alloc")
    names = [graphs.tensor_name(g, t) for t in graph_leafs(g, p.rgf) + graph_nodes(g, p.rgf)]
    assert names == ["leaf_0", "leaf_1", "node_0"]      # hand-derived: nothing was named by the builder
    assert [t.name for t in p.vgf.leafs + p.vgf.nodes] == names


_OVERFLOW_BODY = """
ctx = g.init(1 << 20)
gf = g.new_graph_custom(ctx, 4, False)
x = g.new_tensor_1d(ctx, g.GGML_TYPE_F32, 8)
for i in range(5):
    x = g.scale(ctx, x, 2.0)
g.build_forward_expand(gf, x)
"""


def test_graph_overflow(g):
    ctx = gg.init(1 << 20)
    try:
        gf = gg.new_graph_custom(ctx, 4, False)
        x = gg.new_tensor_1d(ctx, gg.GGML_TYPE_F32, 8)
        for _ in range(5):
            x = gg.scale(ctx, x, 2.0)
        with pytest.raises(gg.GGMLError) as ei:
            gg.build_forward_expand(gf, x)
        msg = str(ei.value)
        assert "full" in msg and "4" in msg, msg
        assert gf.n_nodes == 4
    finally:
        gg.free(ctx)
    err = _abort_in_ggml(_OVERFLOW_BODY)
    assert "GGML_ASSERT(cgraph->n_nodes < cgraph->size)" in err, err[-500:]


def test_graph_overhead(g):
    for size in (1, 2, 3, 16, 100, 256, 1000, 2048, 5000, 8192, 65536):
        for grads in (False, True):
            assert gg.graph_overhead_custom(size, grads) == g.graph_overhead_custom(size, grads), (size, grads)
    assert gg.graph_overhead() == g.graph_overhead()
    assert gg.tensor_overhead() == g.tensor_overhead()


def test_graph_with_grads_layout(g):
    """A graph object with grads arrays: identical object sizes and struct (pointers relative)."""
    rctx, vctx = g.init(4 << 20), gg.init(4 << 20)
    try:
        for G, ctx in ((g, rctx), (gg, vctx)):
            G.new_graph_custom(ctx, 100, True)
            G.new_graph_custom(ctx, 7, False)
        rb, vb = int(g.get_mem_buffer(rctx)), vctx.base
        ro, vo = real_objects(g, rctx, rb), viz_objects(vctx, vb)
        assert ro == vo
        ra = normalized_arena(g.arena_bytes(rctx), rb, ro, False)
        va = normalized_arena(np.array(gg.get_mem_buffer(vctx)[:gg.used_mem(vctx)]), vb, vo, False)
        bad = np.flatnonzero(ra != va)
        assert bad.size == 0, [(int(o), describe_offset(int(o), ro)) for o in bad[:8]]
    finally:
        g.free(rctx)
        gg.free(vctx)


# ====================================================================================================
# 3. plans
# ====================================================================================================

@pytest.mark.parametrize("name", NAMES)
def test_graph_plan(g, pair_factory, name):
    p = pair_factory(name, "no_alloc")
    got, want = [], []
    for n in range(1, 9):
        rp = g.graph_plan(p.rgf, n)
        vp = gg.graph_plan(p.vgf, n)
        want.append((n, rp["n_threads"], rp["work_size"]))
        got.append((n, vp.n_threads, vp.work_size))
    assert got == want, "graph_plan (n, n_threads, work_size): ggml %r, ggviz %r" % (want, got)


# ====================================================================================================
# 4. results
# ====================================================================================================

_SUMMARY: dict = {}          # (builder, op) -> max NMSE over nodes and thread counts


def nmse(a, ref):
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = float(np.sum(ref * ref))
    num = float(np.sum((a - ref) ** 2))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


@lru_cache(maxsize=None)
def computed(name, n_threads):
    """Build, fill and compute ``name`` in both engines (zeroed caller buffers); per node: op, name, ggml values,
    ggviz values, ggviz raw bytes."""
    g = _g()
    p = Pair(name, "buffer")
    try:
        written = graphs.fill_leaves(g, p.rgf, p.r["inputs"])              # ggml quantizes with its quantizer
        graphs.fill_leaves(gg, p.vgf, p.v["inputs"], raw=written)          # ggviz gets the very same bytes
        assert g.graph_compute_with_ctx(p.rctx, p.rgf, n_threads) == 0
        assert gg.graph_compute_with_ctx(p.vctx, p.vgf, n_threads) == 0
        out = []
        for rt, vt in zip(graph_nodes(g, p.rgf), graph_nodes(gg, p.vgf)):
            out.append((gg.op_desc(vt), vt.name, graphs.to_float(g, rt), graphs.to_float(gg, vt),
                        graphs.raw_bytes(gg, vt)))
        return out
    finally:
        p.close()


@pytest.fixture(scope="module", autouse=True)
def _print_summary():
    yield
    if _SUMMARY:
        print("\n\nmax NMSE per op (ggviz vs ggml, all nodes, n_threads 1/2/4):")
        for (b, op), v in sorted(_SUMMARY.items()):
            print("  %-14s %-12s %.3e" % (b, op, v))


@pytest.mark.parametrize("n_threads", (1, 2, 4))
@pytest.mark.parametrize("name", NAMES)
def test_compute_matches_ggml(name, n_threads):
    bad = []
    for i, (op, tname, ref, got, _raw) in enumerate(computed(name, n_threads)):
        assert got.shape == ref.shape, "node %d %r: shape %r vs %r" % (i, tname, got.shape, ref.shape)
        e = nmse(got, ref)
        key = (name, op)
        _SUMMARY[key] = max(_SUMMARY.get(key, 0.0), e)
        if not e <= NMSE_MAX:
            bad.append("node %d %r (%s): NMSE %.3e" % (i, tname, op, e))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("n_threads", (2, 4))
@pytest.mark.parametrize("name", NAMES)
def test_threads_bitwise(name, n_threads):
    one = computed(name, 1)
    many = computed(name, n_threads)
    bad = [r1[1] for r1, rn in zip(one, many) if r1[4] != rn[4]]
    assert not bad, "ggviz results differ between 1 and %d threads at nodes %r" % (n_threads, bad)


@pytest.mark.parametrize("name", NAMES)
def test_leaves_own_quantizer(g, pair_factory, name):
    """Each engine quantizing the same floats itself gives the same leaf bytes (F32/F16/ints trivially)."""
    p = pair_factory(name, "alloc")
    rw = graphs.fill_leaves(g, p.rgf, p.r["inputs"])
    vw = graphs.fill_leaves(gg, p.vgf, p.v["inputs"])
    assert sorted(rw) == sorted(vw)
    for k in rw:
        assert np.array_equal(rw[k], vw[k]), "quantized bytes of %r" % k
    for rt, vt in zip(graph_leafs(g, p.rgf), graph_leafs(gg, p.vgf)):
        assert graphs.raw_bytes(g, rt) == graphs.raw_bytes(gg, vt), "leaf %r" % vt.name


# ====================================================================================================
# 5. error messages (ggviz raises; real ggml aborts, shown in a subprocess)
# ====================================================================================================

def _abort_in_ggml(body):
    """Run ``body`` (with ``g = RealGGML()``) in a fresh interpreter; it must abort.  Returns its stderr."""
    src = ("import os\nos.environ['GGML_NO_BACKTRACE'] = '1'   # ggml_abort: no gdb backtrace\n"
           "from tests.oracle.ggml_lib import RealGGML\ng = RealGGML()\n" + textwrap.dedent(body)
           + "\nprint('NO' + '_ABORT')\n")
    rc, out, err = run_in_subprocess(src)
    assert rc != 0 and "NO_ABORT" not in out, (rc, out[-400:], err[-400:])
    return err


def test_error_mul_mat_shapes():
    ctx = gg.init(1 << 20)
    try:
        a = gg.set_name(gg.new_tensor_2d(ctx, gg.GGML_TYPE_F32, 64, 8), "wa")
        b = gg.set_name(gg.new_tensor_2d(ctx, gg.GGML_TYPE_F32, 32, 4), "xb")
        used = gg.used_mem(ctx)
        with pytest.raises(gg.GGMLError) as ei:
            gg.mul_mat(ctx, a, b)
        msg = str(ei.value)
        for s in ("mul_mat", "wa", "xb", "[64, 8, 1, 1]", "[32, 4, 1, 1]"):
            assert s in msg, (s, msg)
        assert gg.used_mem(ctx) == used, "nothing allocated by the failed op"
    finally:
        gg.free(ctx)
    err = _abort_in_ggml("""
        ctx = g.init(1 << 20)
        a = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 64, 8)
        b = g.new_tensor_2d(ctx, g.GGML_TYPE_F32, 32, 4)
        g.mul_mat(ctx, a, b)
    """)
    assert "GGML_ASSERT(ggml_can_mul_mat(a, b))" in err, err[-400:]


def test_error_out_of_memory():
    ctx = gg.init(2048)
    try:
        gg.new_tensor_1d(ctx, gg.GGML_TYPE_F32, 4)
        with pytest.raises(gg.GGMLError) as ei:
            gg.new_tensor_1d(ctx, gg.GGML_TYPE_F32, 1000)
        msg = str(ei.value)
    finally:
        gg.free(ctx)
    m = re.search(r"needed (\d+), available (\d+)", msg)
    assert m, msg
    # hand-derived: first object ends at 32 + 336 + 16 = 384; the new one needs 32 + pad16(336 + 4000)
    assert (int(m.group(1)), int(m.group(2))) == (384 + 32 + 4336, 2048)
    err = _abort_in_ggml("""
        ctx = g.init(2048)
        g.new_tensor_1d(ctx, g.GGML_TYPE_F32, 4)
        g.new_tensor_1d(ctx, g.GGML_TYPE_F32, 1000)
    """)
    m2 = re.search(r"needed (\d+), available (\d+)", err)
    assert m2, err[-400:]
    assert m.groups() == m2.groups(), "ggviz %r vs ggml %r" % (m.groups(), m2.groups())


def test_error_view_exceeds_source():
    ctx = gg.init(1 << 20)
    try:
        a = gg.set_name(gg.new_tensor_1d(ctx, gg.GGML_TYPE_F32, 10), "src")
        gg.view_1d(ctx, a, 8, 8)                       # 32 + 8 == 40 bytes: exactly fits
        with pytest.raises(gg.GGMLError) as ei:
            gg.view_1d(ctx, a, 8, 12)                  # 32 + 12 > 40
        msg = str(ei.value)
        for s in ("32", "12", "40", "src"):
            assert s in msg, (s, msg)
        # a view of a view is checked against the base tensor, with the offsets added up
        v = gg.view_1d(ctx, a, 6, 8)
        with pytest.raises(gg.GGMLError):
            gg.view_1d(ctx, v, 4, 20)                  # 16 + (8 + 20) > 40
    finally:
        gg.free(ctx)
    err = _abort_in_ggml("""
        ctx = g.init(1 << 20)
        a = g.new_tensor_1d(ctx, g.GGML_TYPE_F32, 10)
        g.view_1d(ctx, a, 8, 8)
        g.view_1d(ctx, a, 8, 12)
    """)
    assert "data_size + view_offs <= ggml_nbytes(view_src)" in err, err[-400:]
