"""ggviz: a built graph copied into a new ggml context, laid out as a build of the same graph there would be.

llama.cpp builds each of a new context's reserve graphs (microseconds in C). The first context of a model builds
two distinct ones in ggviz (~19 ms of Python each on SmolLM2): the resolve_fused_ops probe (1 token) and the pp
reserve's (512 tokens). They are the same nodes; only the shapes the ubatch sets differ, which
``graph.derive_graph`` rewrites. It works in place, and the probe's graph is still needed (it is the tg reserve's),
so the pp graph is made from a copy of it: ``copy_graph`` then ``derive_graph``.

The copy is what a build into a fresh context of the same size would leave (tests/test_graph_copy.py compares them
word for word, relative to each arena's base):

* the arena's objects (the graph object first, then the tensors, as the builder makes them) byte for byte, with
  every pointer into the old arena moved by the distance between the two arenas: the objects' ``next``, the
  tensors' ``src``, ``view_src``, ``data``, ``buffer``, ``extra`` that point there, the cgraph struct's array
  pointers, the nodes and leafs arrays (a weight or a KV cache outside the arena keeps its address);
* the visited hash set rebuilt, not copied: a slot is ``(addr >> 4) % size`` probed linearly, so it depends on
  where each tensor is and on the order of the inserts. The build inserts each tensor at its first visit (a DFS
  pre-order from the tensors passed to build_forward_expand) and records the slots in that order
  (``CGraph.inserts``); the copy inserts the moved keys in the same order, each with its use count. Where no two
  keys share a home slot the order cannot matter (no key is moved along) and they are placed at once;
* new Tensor handles for the copied structs, the GraphResult's tensors (inputs, logits, the recorded dims, the
  fused nodes, the norms) mapped to them;
* the source's split memos (ggml.sched's: what the scheduler's passes 1-4 made of it), moved the same way
  (``sched.split_memo_copy``), so the copy's split is not the passes again.

``copy_graph`` returns None where it cannot vouch for that (a graph without its insert record, with gradients, not
evaluated left to right, an arena not laid out as a builder's, a replay that does not find the build's keys):
the caller builds.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import ggml
from ..ggml import consts as C
from ..ggml import sched as gs
from ..ggml.graph import CGraph, GGML_CGRAPH_EVAL_ORDER_LEFT_TO_RIGHT, _layout
from ..ggml.context import Object
from ..ggml.tensor import _Q_SRC, _Q_VIEW_SRC, tensor_in_arena
from .graph import GraphInputs, GraphResult

# the struct ggml_tensor words that may hold a pointer into the graph's arena: buffer (1), src[10] and view_src
# (19..29), data (31), extra (40); view_offs (30) is an offset
_PTR_WORDS = np.array([1] + list(range(_Q_SRC, _Q_VIEW_SRC + 1)) + [31, 40], np.int64)
_ALLOC_WORDS = np.array([1, _Q_VIEW_SRC, 31], np.int64)        # buffer, view_src, data
# the keys placed at their home slots at once when no two share one (False: always inserted one by one, in order;
# the tests compare the two)
PLACE_AT_ONCE = True


def _relocate(words: np.ndarray, lo: int, hi: int, delta: int) -> np.ndarray:
    """``words`` with each value in [lo, hi) (a pointer into the old arena) moved by ``delta``."""
    inside = (words >= lo) & (words < hi)
    if inside.any():
        words = words.copy()
        words[inside] += np.uint64(delta % (1 << 64))
    return words


def copy_graph(res: GraphResult, mem_buffer=None) -> GraphResult | None:
    """A copy of the built, unallocated graph ``res`` in a new context (see the module docstring), or None (an
    allocated graph among the refusals: a build's tensors have no buffer, and no data but a view's).
    ``mem_buffer``: the new context's arena (ggml_init's), a new one by default."""
    old = res.ctx
    gf = res.gf
    objs = old.objects
    if (old.freed or not objs or gf.obj is not objs[0] or gf.grads is not None or not gf.inserts
            or gf.order != GGML_CGRAPH_EVAL_ORDER_LEFT_TO_RIGHT or not old.no_alloc):
        return None
    tobjs = objs[1:]
    hdr = np.fromiter((o.hdr_offs for o in objs), np.int64, len(objs))
    if (old._i32[(hdr[1:] >> 2) + 6] != C.GGML_OBJECT_TYPE_TENSOR).any():       # (ggml_object.type)
        return None
    toffs = hdr[1:] + C.GGML_OBJECT_SIZE
    # unallocated: no tensor in a buffer, and no data but a view's (a view of the KV cache points into it)
    w = old._u64[(toffs >> 3)[:, None] + _ALLOC_WORDS[None, :]]
    if w[:, 0].any() or ((w[:, 1] == 0) & (w[:, 2] != 0)).any():
        return None
    lay, nbytes, hs_size = _layout(gf.size, False)
    used = old._end
    new = ggml.init(old.mem_size, mem_buffer=mem_buffer, no_alloc=True)
    lo, hi = old._base, old._base + old.mem_size
    delta = new._base - old._base
    # the arena's bytes but the hash set's (use counts, keys, used bits: a build's start from the fresh arena's)
    g0 = gf.obj.offs
    h0, h1 = g0 + lay["use_counts"], g0 + nbytes
    src_buf, dst = old.mem_buffer, new.mem_buffer
    dst[:h0] = src_buf[:h0]
    dst[h1:used] = src_buf[h1:used]
    u64 = new._u64
    # the objects' next pointers (the last one's is NULL)
    nxt = (hdr >> 3) + 2
    u64[nxt] = _relocate(u64[nxt], lo, hi, delta)
    # the tensors' pointer words
    idx = ((toffs >> 3)[:, None] + _PTR_WORDS[None, :]).ravel()
    u64[idx] = _relocate(u64[idx], lo, hi, delta)
    # the nodes and leafs arrays (the cgraph struct's own pointers are written by _init_object below)
    nq0 = (g0 + lay["nodes"]) >> 3
    lq0 = (g0 + lay["leafs"]) >> 3
    n_nodes, n_leafs = len(gf.nodes), len(gf.leafs)
    u64[nq0:nq0 + n_nodes] = _relocate(u64[nq0:nq0 + n_nodes], lo, hi, delta)
    u64[lq0:lq0 + n_leafs] = _relocate(u64[lq0:lq0 + n_leafs], lo, hi, delta)
    # the handles: the graph object, then a Tensor per struct
    base = new._base
    new_objs = [Object(0, new)]
    tmap: dict = {}
    told = [o.payload for o in tobjs]
    for o, t, offs in zip(tobjs, told, toffs.tolist()):
        nt = tensor_in_arena(new, offs, base + offs)
        new_objs.append(Object(o.hdr_offs, new, nt))
        tmap[t.addr] = nt
    new.objects = new_objs
    new.n_objects = old.n_objects
    new._end = used
    cg = CGraph(None, gf.size, _view=True)
    cg.ctx = new
    cg._init_object(new, new_objs[0], lay, nbytes, hs_size, False)
    get = tmap.get
    cg.nodes = [get(t.addr, t) for t in gf.nodes]
    cg.leafs = [get(t.addr, t) for t in gf.leafs]
    cg._sync_counts()
    if not _replay_hash_set(gf, cg, lo, hi, delta):
        new.free()
        return None
    # the source's split memos, moved as the structs were: the copy's split takes its passes 1-4 from them
    gs.split_memo_copy(gf, cg, lo, hi, delta, _PTR_WORDS)
    return _remap(res, new, cg, tmap)


def _replay_hash_set(gf, cg, lo: int, hi: int, delta: int) -> bool:
    """The visited hash set of ``cg`` filled as the build filled ``gf``'s: its keys (moved by ``delta`` where they
    are in the old arena [lo, hi)) inserted in the build's order (``CGraph.inserts``), each with ``gf``'s use
    count. False: the record does not hold every key of ``gf``'s set."""
    ohs = gf.visited_hash_set
    old_pos = np.array(gf.inserts, np.int64)
    n_used = int(np.unpackbits(ohs.used.view(np.uint8)).sum())
    if old_pos.size != n_used or np.unique(old_pos).size != n_used:
        return False
    keys = _relocate(ohs.keys[old_pos], lo, hi, delta)
    uc = gf.use_counts[old_pos]
    size = ohs.size
    home = (keys >> np.uint64(4)) % np.uint64(size)
    hs = cg.visited_hash_set
    if PLACE_AT_ONCE and np.unique(home).size == home.size:
        # no two keys share a home slot: none is ever moved along (linear probing moves a key only past a slot
        # taken before it), so each sits at its home slot, whatever the order
        pos = home.astype(np.int64)
        hs.keys[pos] = keys
        mask = np.zeros(hs.used.size * 32, bool)
        mask[pos] = True
        hs.used[:] = np.packbits(mask, bitorder="little").view(np.uint32)
        cg.use_counts[pos] = uc
        cg.inserts = pos.tolist()            # (the copy's own record: a copy of the copy replays it)
        return True
    ins = hs.find_or_insert
    use_counts = cg.use_counts
    cg.inserts = rec = []
    for k, c in zip(keys.tolist(), uc.tolist()):
        p = ins(k)
        if p < 0:
            return False
        use_counts[p] = c
        rec.append(p)
    return True


def _remap(res: GraphResult, ctx, gf, tmap) -> GraphResult:
    """``res``'s fields with its tensors replaced by their copies (``tmap``: old address -> copy)."""
    def m(t):
        return tmap.get(t.addr, t) if t is not None else None

    inputs = GraphInputs(**{f.name: m(getattr(res.inputs, f.name)) for f in dataclasses.fields(GraphInputs)})
    return GraphResult(ctx=ctx, gf=gf, inputs=inputs, t_logits=m(res.t_logits), t_embd=m(res.t_embd),
                       n_kv=res.n_kv, n_kv_swa=res.n_kv_swa, n_tokens=res.n_tokens, n_outputs=res.n_outputs,
                       named={k: m(t) for k, t in res.named.items()},
                       fused_nodes=[(op, m(t), il) for op, t, il in res.fused_nodes],
                       kv_dims=[(m(t), c, d) for t, c, d in res.kv_dims],
                       sched_pins=[(m(t), b) for t, b in res.sched_pins],
                       tok_dims=[(m(t), ne, nb) for t, ne, nb in res.tok_dims],
                       norm_nodes=[(m(t), il) for t, il in res.norm_nodes])
