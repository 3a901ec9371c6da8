"""struct ggml_cgraph: nodes, leafs, use counts and the visited hash set, laid out in the arena like ggml does.

Mirrors (ggml.c / ggml-impl.h): ``ggml_hash_size`` (the prime table), ``ggml_hash``/``ggml_hash_find``/
``ggml_hash_insert`` (address-based hash, linear probing, bitset of used slots), ``ggml_graph_nbytes``,
``ggml_graph_overhead(_custom)``, ``ggml_new_graph(_custom)``, ``ggml_visit_parents_graph``,
``ggml_build_forward_expand``, ``ggml_graph_n_nodes``, ``ggml_graph_node``, ``ggml_graph_size``,
``ggml_graph_get_tensor``, ``ggml_graph_view``, ``ggml_graph_reset``/``ggml_graph_clear``, ``ggml_graph_add_node``.

The graph object is one arena object of ``ggml_graph_nbytes(size, grads)`` bytes: the 96-byte struct, then the
nodes and leafs pointer arrays, the per-slot use counts, the hash keys, (grads,) and the used-bitset. ggviz writes
the same arrays there (as NumPy views), so the graph's bytes are inspectable like any other object.
"""
from __future__ import annotations

import operator
import struct

import numpy as np

from .. import trace
from . import consts as C
from .context import Context, GGMLError
from .tensor import _Q_SRC, _W_FLAGS, _W_OP, Tensor, _registry_refs, tensor_at

_NAME0_WORD = 32                 # the word whose low byte is the first of struct ggml_tensor's name (NUL: no name)
# node->src[0..9] (words 19..28 of the struct) as a tuple of addresses, unpacked from the struct's words (half the
# cost of slicing them out and tolist)
_unpack_srcs = struct.Struct(f"<{C.GGML_MAX_SRC}Q").unpack_from
_SRC_OFFS = _Q_SRC * 8
_OP_NONE = C.GGML_OP_NONE

GGML_CGRAPH_EVAL_ORDER_LEFT_TO_RIGHT = 0
GGML_CGRAPH_EVAL_ORDER_RIGHT_TO_LEFT = 1
CGRAPH_STRUCT_SIZE = 96          # sizeof(struct ggml_cgraph) on LP64
GGML_HASHSET_FULL = -1           # ((size_t)-1) in C
GGML_HASHSET_ALREADY_EXISTS = -2

_PRIMES = [2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537, 131101, 262147,
           524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879, 134217757, 268435459,
           536870923, 1073741827, 2147483659]


def hash_size(min_sz: int) -> int:
    """ggml_hash_size: the smallest prime of the table >= min_sz (next primes after powers of two)."""
    lo, hi = 0, len(_PRIMES)
    while lo < hi:
        m = (lo + hi) // 2
        if _PRIMES[m] < min_sz:
            lo = m + 1
        else:
            hi = m
    return _PRIMES[lo] if lo < len(_PRIMES) else (min_sz | 1)


def bitset_size(n: int) -> int:
    return (n + 31) >> 5


def hash_set_new(size: int) -> HashSet:
    """ggml_hash_set_new: a table of ggml_hash_size(size) slots (a prime), keys + used-bitset."""
    size = hash_size(size)
    return HashSet(size, np.zeros(bitset_size(size), np.uint32), np.zeros(size, np.uint64))


def _incr_aligned(p: int, size: int, align: int):
    p = (p + align - 1) // align * align
    return p, p + size


def _layout(size: int, grads: bool):
    """Offsets of each array inside the graph object (relative to the struct), and the total: ggml_graph_nbytes."""
    hs = hash_size(size * 2)
    p = CGRAPH_STRUCT_SIZE
    lay = {}
    lay["nodes"], p = _incr_aligned(p, size * 8, 8)
    lay["leafs"], p = _incr_aligned(p, size * 8, 8)
    lay["use_counts"], p = _incr_aligned(p, hs * 4, 4)
    lay["keys"], p = _incr_aligned(p, hs * 8, 8)
    if grads:
        lay["grads"], p = _incr_aligned(p, hs * 8, 8)
        lay["grad_accs"], p = _incr_aligned(p, hs * 8, 8)
    lay["used"], p = _incr_aligned(p, bitset_size(hs) * 4, 4)
    return lay, p, hs


def graph_nbytes(size: int, grads: bool = False) -> int:
    return _layout(size, grads)[1]


def graph_overhead_custom(size: int, grads: bool = False) -> int:
    return C.GGML_OBJECT_SIZE + (graph_nbytes(size, grads) + C.GGML_MEM_ALIGN - 1) // C.GGML_MEM_ALIGN * C.GGML_MEM_ALIGN


def graph_overhead() -> int:
    return graph_overhead_custom(C.GGML_DEFAULT_GRAPH_SIZE, False)


class HashSet:
    """struct ggml_hash_set {size, used (bitset), keys}: open addressing keyed by tensor address."""
    __slots__ = ("size", "used", "keys")

    def __init__(self, size, used, keys):
        self.size, self.used, self.keys = size, used, keys

    def get_used(self, i: int) -> bool:
        return bool((self.used.item(i >> 5) >> (i & 31)) & 1)

    def set_used(self, i: int):
        used = self.used
        used[i >> 5] = used.item(i >> 5) | (1 << (i & 31))

    def find(self, addr: int) -> int:
        """ggml_hash_find: slot of ``addr`` or the first free slot on its probe path; FULL if neither."""
        size, used, keys = self.size, self.used, self.keys
        h = (addr >> 4) % size           # ggml_hash: the low 4 bits of a tensor pointer are always zero
        i = h
        while (used.item(i >> 5) >> (i & 31)) & 1 and keys.item(i) != addr:
            i = (i + 1) % size
            if i == h:
                return GGML_HASHSET_FULL
        return i

    def find_or_insert(self, addr: int) -> int:
        """ggml_hash_find_or_insert: the slot of ``addr``, inserted there when it was not in the set; FULL if the
        set holds neither it nor a free slot (the caller raises). Each slot's bitset word is read once."""
        size, used, keys = self.size, self.used, self.keys
        h = i = (addr >> 4) % size
        while True:
            w = used.item(i >> 5)
            if not (w >> (i & 31)) & 1:
                used[i >> 5] = w | (1 << (i & 31))
                keys[i] = addr
                return i
            if keys.item(i) == addr:
                return i
            i = (i + 1) % size
            if i == h:
                return GGML_HASHSET_FULL

    def contains(self, addr: int) -> bool:
        i = self.find(addr)
        return i != GGML_HASHSET_FULL and self.get_used(i)

    def insert(self, addr: int) -> int:
        h = (addr >> 4) % self.size
        i = h
        while True:
            if not self.get_used(i):
                self.set_used(i)
                self.keys[i] = addr
                return i
            if int(self.keys[i]) == addr:
                return GGML_HASHSET_ALREADY_EXISTS
            i = (i + 1) % self.size
            if i == h:
                raise GGMLError("ggml_hash_insert: hash set is full")

    def reset(self):
        self.used[:] = 0


class CGraph:
    """``struct ggml_cgraph``. ``nodes``/``leafs`` are Python lists mirroring the pointer arrays in the arena."""

    def __init__(self, ctx: Context | None, size: int, grads: bool = False, _view=False):
        try:
            size = operator.index(size)
        except TypeError:
            raise GGMLError(f"ggml_new_graph_custom: size must be an integer, got {size!r}") from None
        if size < 0:
            # a size_t in ggml: -1 would ask for an enormous graph; ggviz refuses before touching the arena
            raise GGMLError(f"ggml_new_graph_custom: negative size {size}")
        self.ctx = ctx
        self.size = size
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.order = GGML_CGRAPH_EVAL_ORDER_LEFT_TO_RIGHT
        self.uid = 0
        self.obj = None
        # ggviz: the visited hash set's slots in the order the build took them (one per tensor, at its first visit):
        # a copy of the graph in another arena inserts its keys in this order, so that its table is laid out as a
        # build there would lay it out (llama.graph_copy)
        self.inserts: list[int] = []
        if _view:
            return
        lay, nbytes, hs = _layout(self.size, grads)
        # ggviz: a failure after the object exists (an interrupt) leaves the arena as it was (Context._mark). The
        # bytes written below: the header and the struct (saved by the mark), and the tail of the object, from the
        # grads (or the used-bitset) to its end (saved once the object fits); nodes, leafs, use counts and keys are
        # not touched until the graph is built.
        mark = ctx._mark(C.GGML_OBJECT_SIZE + CGRAPH_STRUCT_SIZE)
        tail = None
        try:
            obj = ctx.new_object(C.GGML_OBJECT_TYPE_GRAPH, nbytes)
            tail0 = obj.offs + lay["grads" if grads else "used"]
            tail = ctx.mem_buffer[tail0:obj.offs + nbytes].tobytes()
            self._init_object(ctx, obj, lay, nbytes, hs, grads)
        except BaseException:
            if tail is not None:
                ctx.mem_buffer[tail0:tail0 + len(tail)] = np.frombuffer(tail, np.uint8)
            ctx._rollback(mark)
            raise

    def _init_object(self, ctx, obj, lay, nbytes, hs, grads):
        obj.payload = self
        self.obj = obj
        base = obj.offs
        buf = ctx.mem_buffer
        self.raw = buf[base:base + nbytes]
        self.addr = self.raw.ctypes.data

        def arr(name, count, dt):
            o = base + lay[name]
            return buf[o:o + count * np.dtype(dt).itemsize].view(dt)

        self._nodes_ptr = arr("nodes", self.size, np.uint64)
        self._leafs_ptr = arr("leafs", self.size, np.uint64)
        self.use_counts = arr("use_counts", hs, np.int32)
        self.visited_hash_set = HashSet(hs, arr("used", bitset_size(hs), np.uint32), arr("keys", hs, np.uint64))
        self.grads = arr("grads", hs, np.uint64) if grads else None
        self.grad_accs = arr("grad_accs", hs, np.uint64) if grads else None
        self.visited_hash_set.reset()
        if grads:
            self.grads[:] = 0
            self.grad_accs[:] = 0
        # the struct itself: int size, n_nodes, n_leafs; then the pointers; the hash set; order; uid
        w = self.raw[:CGRAPH_STRUCT_SIZE].view(np.int32)
        q = self.raw[:CGRAPH_STRUCT_SIZE].view(np.uint64)
        w[0] = self.size
        self._w = w
        q[2] = self._nodes_ptr.ctypes.data
        q[3] = self.grads.ctypes.data if grads else 0
        q[4] = self.grad_accs.ctypes.data if grads else 0
        q[5] = self._leafs_ptr.ctypes.data
        q[6] = self.use_counts.ctypes.data
        q[7] = hs
        q[8] = self.visited_hash_set.used.ctypes.data
        q[9] = self.visited_hash_set.keys.ctypes.data
        w[20] = self.order
        q[11] = 0
        self._sync_counts()

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def _sync_counts(self):
        if self.obj is not None:
            self._w[1] = len(self.nodes)
            self._w[2] = len(self.leafs)

    def _append_node(self, t: Tensor):
        if len(self.nodes) >= self.size:
            raise GGMLError(f"graph is full: it holds {self.size} nodes (ggml_new_graph_custom size); "
                            f"cannot add {t.name!r}")
        if self.obj is not None:
            self._nodes_ptr[len(self.nodes)] = t.addr
        self.nodes.append(t)

    def _append_leaf(self, t: Tensor):
        if len(self.leafs) >= self.size:
            raise GGMLError(f"graph is full: it holds {self.size} leafs (ggml_new_graph_custom size); "
                            f"cannot add {t.name!r}")
        if self.obj is not None:
            self._leafs_ptr[len(self.leafs)] = t.addr
        self.leafs.append(t)

    def use_count(self, t: Tensor) -> int:
        """ggml_node_get_use_count: how many graph nodes read ``t``."""
        pos = self.visited_hash_set.find(t.addr)
        if pos < 0 or not self.visited_hash_set.get_used(pos):
            return 0
        return int(self.use_counts[pos])

    def __repr__(self):
        return f"<ggml_cgraph size={self.size} n_nodes={self.n_nodes} n_leafs={self.n_leafs}>"


def graph_key(cg: CGraph) -> int:
    """ggviz: the ``graph`` field of trace events: the graph's address in its context's arena (what ggml's
    ``struct ggml_cgraph *`` is, stable while the context lives); a graph view lives outside any arena (ggml returns it
    by value), so it gets its Python id."""
    return getattr(cg, "addr", 0) or id(cg)


def new_graph_custom(ctx: Context, size: int, grads: bool = False) -> CGraph:
    return CGraph(ctx, size, grads)


def new_graph(ctx: Context) -> CGraph:
    return CGraph(ctx, C.GGML_DEFAULT_GRAPH_SIZE, False)


def _enter(cg: CGraph, node: Tensor, compute: bool, pos: int | None = None):
    """The start of ggml_visit_parents_graph(cg, node, compute): up to the loop over the sources. Returns the hash
    slot when the call ends there (already visited, no source to visit again), else the frame of the loop
    (``visit_parents`` runs it): ``[new, node, src addresses, next index, slot, compute]``. ``pos``: the node's
    slot when the caller has probed for it already."""
    w = node._w
    if compute and w.item(_W_OP) != C.GGML_OP_NONE:
        w[_W_FLAGS] = w.item(_W_FLAGS) | C.GGML_TENSOR_FLAG_COMPUTE        # (node->flags |= COMPUTE)
    hs = cg.visited_hash_set
    addr = node.addr
    if pos is None:
        pos = hs.find(addr)
    if pos == GGML_HASHSET_FULL:
        raise GGMLError(f"graph hash set is full ({hs.size} slots) while visiting {node.name!r}")
    used = hs.used
    if (used.item(pos >> 5) >> (pos & 31)) & 1:
        # already visited: only propagate the compute flag
        if trace.active:
            trace.emit("graph.visit", graph=graph_key(cg), addr=addr, name=node.name, hash_pos=pos, hit=True)
        if compute:
            addrs = _unpack_srcs(node._q, _SRC_OFFS)
            for a in addrs:
                if a and not (tensor_at(a).flags & C.GGML_TENSOR_FLAG_COMPUTE):
                    # (the flags are read again as the loop reaches each source: a visit may set a later one's)
                    return [False, node, addrs, 0, pos, True]
        return pos
    # first time we see this node in the current graph
    hs.keys[pos] = addr
    used[pos >> 5] = used.item(pos >> 5) | (1 << (pos & 31))
    cg.use_counts[pos] = 0
    cg.inserts.append(pos)
    if trace.active:
        trace.emit("graph.visit", graph=graph_key(cg), addr=addr, name=node.name, hash_pos=pos, hit=False)
    # node->src[k] for k in the graph's order, the pointer array read from the struct in one go; the NULL ones
    # (ggml's loop skips them: most of a node's GGML_MAX_SRC slots) left out here, in C, not by the frame's loop
    addrs = tuple(filter(None, _unpack_srcs(node._q, _SRC_OFFS)))
    if cg.order == GGML_CGRAPH_EVAL_ORDER_RIGHT_TO_LEFT:
        addrs = addrs[::-1]
    return [True, node, addrs, 0, pos, compute]


def _leave(cg: CGraph, node: Tensor, pos: int) -> None:
    """The end of ggml_visit_parents_graph for a node seen for the first time: it joins the leafs or the nodes.
    (CGraph._append_leaf / _append_node written out here: this runs for every tensor of a graph build.)"""
    w = node._w
    if w.item(_W_OP) == C.GGML_OP_NONE and not (w.item(_W_FLAGS) & C.GGML_TENSOR_FLAG_PARAM):
        # a leaf: constant data, not computed by the graph
        lst, kind = cg.leafs, "leaf"
    else:
        lst, kind = cg.nodes, "node"
    n = len(lst)
    if not node._q.item(_NAME0_WORD) & 0xFF:
        node.name = f"{kind}_{n}"
    if n >= cg.size:
        raise GGMLError(f"graph is full: it holds {cg.size} {kind}s (ggml_new_graph_custom size); "
                        f"cannot add {node.name!r}")
    if cg.obj is not None:
        (cg._leafs_ptr if kind == "leaf" else cg._nodes_ptr)[n] = node.addr
    lst.append(node)
    if trace.active:
        cg._sync_counts()          # (without a listener, visit_parents writes the counts once, when it returns)
        trace.emit("graph.add", graph=graph_key(cg), addr=node.addr, name=node.name, hash_pos=pos, kind_=kind,
                   index=n)


def _settled(src: Tensor, compute: bool) -> bool:
    """ggviz: the recursive call on an already visited ``src`` would not recurse further: its compute flag is set
    here as that call sets it (True), without a frame for it (most of a graph's visits are of a tensor already in
    it: a weight, a norm or a residual read again). False: a source of it other than a leaf still lacks the compute
    flag (the call recurses: the caller makes it)."""
    if compute:
        for a in filter(None, _unpack_srcs(src._q, _SRC_OFFS)):      # (its non-NULL sources)
            s = tensor_at(a)
            if not (s._w.item(_W_FLAGS) & C.GGML_TENSOR_FLAG_COMPUTE) and (
                    s._w.item(_W_OP) != C.GGML_OP_NONE or any(_unpack_srcs(s._q, _SRC_OFFS))):
                # (a source without the flag is visited again, which changes nothing for a leaf -- op NONE,
                # no sources: it never gets the flag and has nothing to visit -- and may for anything else)
                return False
        w = src._w
        if w.item(_W_OP) != C.GGML_OP_NONE:
            w[_W_FLAGS] = w.item(_W_FLAGS) | C.GGML_TENSOR_FLAG_COMPUTE
    return True


def visit_parents(cg: CGraph, node: Tensor, compute: bool = True) -> int:
    """ggml_visit_parents_graph: the recursive DFS over src[] run with a stack of frames (no Python recursion: a
    graph is thousands of nodes deep). Each frame is one C call's loop over its sources (``_enter`` makes it,
    ``_leave`` ends a new node's); the value a call returns (the source's hash slot) counts one more use of that
    source in its caller, when the caller is the first visit of its node. A source's slot is probed once: the
    call on a visited source that would not recurse is done in place (``_settled``), else ``_enter`` takes the
    slot."""
    r = _enter(cg, node, compute)
    if type(r) is int:
        return r
    try:
        return _visit_frames(cg, r)
    finally:
        cg._sync_counts()          # the struct's n_nodes / n_leafs, as the C calls leave them


def _visit_frames(cg: CGraph, r: list) -> int:
    """visit_parents' loop over the stack of frames, from the root's frame ``r``."""
    stack = [r]
    hs = cg.visited_hash_set
    size, used, keys = hs.size, hs.used, hs.keys
    use_counts = cg.use_counts
    tr = trace.active
    refs_get = _registry_refs.get
    COMPUTE = C.GGML_TENSOR_FLAG_COMPUTE
    rtl = cg.order == GGML_CGRAPH_EVAL_ORDER_RIGHT_TO_LEFT
    leafs, nodes, gsize, inserts = cg.leafs, cg.nodes, cg.size, cg.inserts
    leafs_ptr, nodes_ptr = (cg._leafs_ptr, cg._nodes_ptr) if cg.obj is not None else (None, None)
    pos = -1
    while stack:
        f = stack[-1]
        new, addrs, i = f[0], f[2], f[3]
        child = push = None
        sp = None
        n = len(addrs)
        while i < n:
            a = addrs[i]
            i += 1
            if not a:
                continue
            # tensor_at(a), its registry lookup written out (tensor_at raises for an address without a tensor)
            ref = refs_get(a)
            src = ref() if ref is not None else None
            if src is None:
                src = tensor_at(a)
            if new:
                # HashSet.find(a) written out (ggml_hash_find: linear probing from ggml_hash(a)); ``found``: the
                # slot holds a (the source was visited)
                sp = h = (a >> 4) % size
                found = False
                while (used.item(sp >> 5) >> (sp & 31)) & 1:
                    if keys.item(sp) == a:
                        found = True
                        break
                    sp = (sp + 1) % size
                    if sp == h:
                        sp = GGML_HASHSET_FULL
                        break
                if found:
                    if not tr and _settled(src, f[5]):
                        use_counts[sp] = use_counts.item(sp) + 1
                        continue
                elif sp >= 0 and not tr:
                    # the call on a source seen for the first time: _enter's first visit written out (the flag,
                    # the slot taken, its use count zeroed and recorded in cg.inserts, the frame of its own loop)
                    compute = f[5]
                    w = src._w
                    if compute and w.item(_W_OP) != _OP_NONE:
                        w[_W_FLAGS] = w.item(_W_FLAGS) | COMPUTE
                    keys[sp] = a
                    used[sp >> 5] = used.item(sp >> 5) | (1 << (sp & 31))
                    use_counts[sp] = 0
                    inserts.append(sp)
                    src_addrs = tuple(filter(None, _unpack_srcs(src._q, _SRC_OFFS)))   # (as _enter's)
                    if rtl:
                        src_addrs = src_addrs[::-1]
                    push = [True, src, src_addrs, 0, sp, compute]
                    break
                child = src
                break
            elif not (src._w.item(_W_FLAGS) & COMPUTE):
                child = src
                break
        f[3] = i
        if push is not None:
            stack.append(push)
            continue
        if child is not None:
            r = _enter(cg, child, f[5], sp)
            if type(r) is int:
                if new:
                    use_counts[r] = use_counts.item(r) + 1
            else:
                stack.append(r)
            continue
        # the call of this frame returns
        stack.pop()
        pos = f[4]
        if new:
            node = f[1]
            w = node._w
            if w.item(_W_OP) == _OP_NONE and not (w.item(_W_FLAGS) & C.GGML_TENSOR_FLAG_PARAM):
                lst, ptrs = leafs, leafs_ptr
            else:
                lst, ptrs = nodes, nodes_ptr
            n = len(lst)
            if tr or n >= gsize or not node._q.item(_NAME0_WORD) & 0xFF:
                _leave(cg, node, pos)       # (a trace event, a name to give, a full graph: _leave does it all)
            else:
                # _leave for a named node of a graph with room (most of them), written out
                if ptrs is not None:
                    ptrs[n] = node.addr
                lst.append(node)
        if stack and stack[-1][0]:
            use_counts[pos] = use_counts.item(pos) + 1
    return pos


def build_forward_expand(cg: CGraph, tensor: Tensor) -> None:
    n_old = cg.n_nodes
    visit_parents(cg, tensor, True)
    if cg.n_nodes - n_old > 0 and cg.nodes[-1] is not tensor:
        raise GGMLError("ggml_build_forward_expand: the last added node should be the requested tensor")


def build_forward_order(cg: CGraph, tensor: Tensor) -> None:
    visit_parents(cg, tensor, False)


def build_forward_select(cg: CGraph, tensors, idx: int) -> Tensor:
    for i, t in enumerate(tensors):
        visit_parents(cg, t, i == idx)
    return tensors[idx]


def graph_n_nodes(cg: CGraph) -> int:
    return cg.n_nodes


def graph_node(cg: CGraph, i: int) -> Tensor:
    """ggml_graph_node: negative i counts from the end, like the C function."""
    if i < 0:
        if cg.n_nodes + i < 0:
            raise IndexError(f"graph node {i} out of range (n_nodes = {cg.n_nodes})")
        return cg.nodes[cg.n_nodes + i]
    if i >= cg.n_nodes:
        raise IndexError(f"graph node {i} out of range (n_nodes = {cg.n_nodes})")
    return cg.nodes[i]


def graph_nodes(cg: CGraph) -> list:
    return list(cg.nodes)


def graph_size(cg: CGraph) -> int:
    return cg.size


def graph_get_tensor(cg: CGraph, name: str):
    for t in cg.leafs:
        if t.name == name:
            return t
    for t in cg.nodes:
        if t.name == name:
            return t
    return None


def graph_add_node(cg: CGraph, t: Tensor) -> None:
    cg._append_node(t)
    cg._sync_counts()


def graph_clear(cg: CGraph) -> None:
    cg.nodes.clear()
    cg.leafs.clear()
    cg.inserts.clear()
    cg._sync_counts()
    cg.visited_hash_set.reset()


def graph_view(cg: CGraph, i0: int, i1: int) -> CGraph:
    """ggml_graph_view: nodes [i0, i1) of a graph; no leafs, but the parent's use counts and hash set are shared
    (the scheduler computes its splits, and the eval callback its node ranges, through such views)."""
    v = CGraph(None, 0, _view=True)
    v.nodes = cg.nodes[i0:i1]
    v.use_counts = cg.use_counts
    v.visited_hash_set = cg.visited_hash_set
    v.order = cg.order
    # ggviz: the graph the view was cut from (a view of a view points at the root): the fast path asks it whether
    # the model runs compiled when a view alone (one eval-callback segment) cannot tell
    v.view_of = getattr(cg, "view_of", None) or cg
    v.view_parent = cg        # ggviz: and the graph it was cut from (an eval-callback segment: its split)
    return v
