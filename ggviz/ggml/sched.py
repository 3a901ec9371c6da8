"""ggml_backend_sched: run one graph on several backends -- assign, split, copy, allocate, compute.

Mirrors the scheduler part of ggml-backend.cpp (ggml 0.20.2) function by function, names without ``ggml_``
(``ggml_backend_sched_split_graph`` is ``backend_sched_split_graph``; static helpers keep their names too:
``backend_sched_backend_id_from_cur``, ``backend_sched_buffer_supported``, ``backend_sched_set_if_supported``,
``backend_sched_alloc_splits``, ``backend_sched_compute_splits``).

The scheduler is given backends in priority order (accelerators first, the CPU last) and a buffer type per backend.
``backend_sched_split_graph`` assigns every tensor of a graph a backend in five passes:

1. **pre-allocated tensors** (weights, KV cache: anything already in a buffer) go to the highest-priority backend
   that supports their buffer type and the op ("1.dst", through a view's source "1.vsrc"); graph inputs go to the
   CPU ("1.inp"); an op reading a weight runs where the weight is ("1.wgt<i>"), unless a higher-priority backend
   wants to offload it ("1.off": ``offload_op``, e.g. a large batch with host weights). User assignments
   (``set_tensor_backend``: "usr") are kept.
2. **expansion**: assigned non-CPU backends spread to unassigned neighbours, down then up the node list, then any
   backend down then up ("2.sup": only where the backend supports the op; view ops are skipped).
3. **upgrade**: an assigned node moves to a higher-priority backend that has the *same buffer type* and supports the
   op and all its sources' buffers ("3.upg": CPU -> BLAS); a still unassigned node goes to the backend that supports
   it with the most supported inputs ("3.best").
4. **views and sources**: views take their source's backend ("4.vsrc"), unassigned sources their consumer's
   ("4.cur"), still unassigned nodes the first backend that supports them.
5. **splits**: consecutive nodes on one backend form a split; a source on another backend whose buffer the split's
   backend cannot use becomes an *input* of the split, and a copy of it (``"{backend}#{name}#{copy}"``, "4.cpy") is
   made in the split backend's memory (``n_copies`` of them with pipeline parallelism); the node's ``src[j]`` is
   rewritten to the copy. A new split also starts when a weight is on an incompatible backend or the split's input
   list is full.

Then the scheduler builds ``sched.graph``: per split, each input (a view depending on it, on its backend) and its copy
(on the split's backend), then the split's nodes -- and ``ggml_gallocr_reserve_n`` / ``alloc_graph`` allocate it
with one buffer per backend (node/leaf buffer ids = backend ids). ``compute_splits`` copies each split's inputs and
runs the split's graph view on its backend (with the eval callback, per node range).

SET_CAUSE / GET_CAUSE are ggml's debug-build records: here they are always kept (``sched.causes``, per hash slot
as in C; ``backend_sched_get_tensor_cause``). ggviz: trace events ``sched.pass``,
``sched.assign`` (tensor, backend, cause), ``sched.split``, ``sched.copy`` (a copy created / an input copied),
``sched.alloc``, ``sched.compute_split``, ``sched.eval``; and ``sched.last_plan``, the last split as plain data
(per node: backend and cause; per split: backend, node range, inputs and their copies). ggviz:
``backend_sched_save_graph`` / ``backend_sched_restore_graph`` take an allocated graph's whole state out of the
scheduler and put it back later (llama's graph cache keeps several allocated graphs on one scheduler).
"""
from __future__ import annotations

import array
import os
import sys
import time
from itertools import compress

import numpy as np

from .. import trace
from . import alloc as A
from . import backend as B
from . import consts as C
from . import memory
from .context import GGMLError
from .context import free as ggml_free
from .context import init as ggml_init
from .graph import (
    GGML_HASHSET_FULL,
    CGraph,
    HashSet,
    graph_overhead_custom,
    graph_view,
    hash_set_new,
)
from .impl import GGML_ASSERT, GGML_LOG, last_log_error
from .ops import dup_tensor, view_tensor
from .tensor import (_Q_BUFFER, _Q_SRC, _Q_VIEW_SRC, _W_FLAGS, _W_OP, Tensor, arena_structs, nbytes, op_desc,
                     structs_in_arena, tensor_at)

GGML_SCHED_MAX_BACKENDS = 16
GGML_SCHED_MAX_SPLIT_INPUTS = 30
GGML_SCHED_MAX_COPIES = 4
GGML_SCHED_MAX_SPLITS_DEBUG = 4096


_VIEW_OPS = frozenset((C.GGML_OP_VIEW, C.GGML_OP_RESHAPE, C.GGML_OP_PERMUTE, C.GGML_OP_TRANSPOSE))


def is_view_op(op: int) -> bool:
    """ggml_is_view_op."""
    return op in _VIEW_OPS


_graph_uid = 0


def graph_next_uid() -> int:
    """ggml_graph_next_uid."""
    global _graph_uid
    _graph_uid += 1
    return _graph_uid


def _dup_tensor_layout(ctx, tensor: Tensor) -> Tensor:
    """ggml_dup_tensor_layout: a copy of the tensor with the same memory layout."""
    dup = dup_tensor(ctx, tensor)
    dup.nb[:] = tensor.nb
    return dup


class ggml_backend_sched_split:
    """``struct ggml_backend_sched_split { backend_id; i_start; i_end; inputs; n_inputs; inputs_capacity; graph; }``."""
    __slots__ = ("backend_id", "i_start", "i_end", "inputs", "inputs_capacity", "graph")

    def __init__(self):
        self.backend_id = 0
        self.i_start = 0
        self.i_end = 0
        self.inputs: list[Tensor] = []
        self.inputs_capacity = 0
        self.graph: CGraph | None = None     # graph view of this split

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    def __repr__(self):
        return (f"<sched split backend={self.backend_id} nodes [{self.i_start}, {self.i_end}) "
                f"inputs={[t.name for t in self.inputs]}>")


class ggml_backend_sched:
    """``struct ggml_backend_sched``."""

    def __init__(self):
        self.is_reset = False        # true if the scheduler has been reset since the last graph split
        self.is_alloc = False
        self.n_backends = 0
        self.backends: list = []
        self.bufts: list = []
        self.galloc = None
        # hash map of the nodes in the graph
        self.hash_set: HashSet | None = None
        self.hv_tensor_backend_ids: list[int] = []     # [hash_set.size]
        self.hv_tensor_copies: list = []               # [hash_set.size][n_backends][n_copies]
        self.node_backend_ids = _id_array(0)          # [graph_size] (int arrays: _id_array)
        self.leaf_backend_ids = _id_array(0)
        self.prev_node_backend_ids = _id_array(0)
        self.prev_leaf_backend_ids = _id_array(0)
        # ggviz: how many leading entries of those four arrays a split ever wrote (the rest still hold calloc's
        # zeros): what a saved graph copies of them (backend_sched_save_graph)
        self._ids_written = 0
        # copy of the graph with modified inputs
        self.graph = CGraph(None, 0, _view=True)
        # graph splits
        self.splits: list[ggml_backend_sched_split] = []
        self.n_splits = 0
        self.splits_capacity = 0
        # pipeline parallelism support
        self.n_copies = 1
        self.cur_copy = 0
        self.next_copy = 0
        self.events = []             # [n_backends][GGML_SCHED_MAX_COPIES]
        self.graph_inputs: list[Tensor] = []
        self.n_graph_inputs = 0
        self.graph_inputs_capacity = 0
        self.ctx = None
        self.callback_eval = None
        self.callback_eval_user_data = None
        self.context_buffer = None
        self.context_buffer_size = 0
        self.op_offload = True
        self.debug = 0
        self.debug_realloc = 0
        self.debug_graph_size = 0
        self.debug_prev_graph_size = 0
        # ggviz: the hash slot of each tensor address (ggml_hash_find_or_insert, memoized), SET_CAUSE records, the
        # pass now running (for trace events) and the last split plan as plain data
        self._slot: dict[int, int] = {}
        self.causes: dict[int, str] = {}
        self._pass = ""
        self._last_plan = None            # a dict, or a _PlanLater that makes it on first read
        self._spare_buffers: list = []    # context buffers given back by saved graph states (backend_sched_save_graph)
        # ggviz: the backends' supports_op / offload_op answers passes 1-4 asked for (recorded for the split memo,
        # _SplitMemo), None when not recording; how many splits took passes 1-4 from a memo
        self._queries: list | None = None
        self._buft_ok: dict = {}            # ggviz: (backend index, id(buft)) -> (buft, supports_buft)
        self.n_split_memo = 0
        self.n_split_memo_moved = 0         # ggviz: of those, how many were moved to other pins' slots (one backend)

    @property
    def last_plan(self) -> dict | None:
        """ggviz: the last split as plain data (``_make_plan``), made on its first read from what the split left."""
        p = self._last_plan
        if isinstance(p, _PlanLater):
            p = self._last_plan = p.make()
        return p

    @last_plan.setter
    def last_plan(self, plan) -> None:
        self._last_plan = plan

    def __repr__(self):
        names = [B.backend_name(b) for b in self.backends]
        return f"<ggml_backend_sched backends={names} n_splits={self.n_splits} n_copies={self.n_copies}>"


# ---- hash helpers (the macros hash_id / tensor_backend_id / tensor_id_copy / tensor_copy)

def _hash_id(sched: ggml_backend_sched, t: Tensor) -> int:
    """hash_id(tensor): ggml_hash_find_or_insert(&sched->hash_set, tensor)."""
    addr = t.addr
    i = sched._slot.get(addr)
    if i is None:
        i = sched._slot[addr] = _find_or_insert(sched.hash_set, addr)
    return i


def _find_or_insert(hs, addr: int) -> int:
    i = hs.find_or_insert(addr)
    if i == GGML_HASHSET_FULL:
        raise GGMLError("ggml_backend_sched: hash set is full (graph_size too small for this graph)")
    return i


def _hash_ids(sched: ggml_backend_sched, tensors) -> list:
    """``hash_id(t)`` of each tensor, in order (so new ones are inserted in the slots C's loop gives them) -- pass
    1 asks for a graph's ~1,300 leafs and nodes one after the other. (The new ones go through _insert_in_order:
    at once, or probed over a byte per slot -- ~0.3 us a key against ~0.8 through HashSet.find_or_insert.)"""
    slot = sched._slot
    if PLACE_AT_ONCE and len(tensors) > 16:
        # the tensors not in the set yet, inserted in their order (_insert_in_order: at once where no two share a
        # home slot and none is taken -- linear probing then moves none of them -- else one by one)
        addrs = [t.addr for t in tensors]
        new = [a for a in addrs if a not in slot]
        if len(set(new)) == len(new):
            _insert_in_order(sched, new)
            return [slot[a] for a in addrs]
    find_or_insert = sched.hash_set.find_or_insert
    out = []
    for t in tensors:
        addr = t.addr
        i = slot.get(addr)
        if i is None:
            i = find_or_insert(addr)              # (_find_or_insert, its check inline)
            if i == GGML_HASHSET_FULL:
                raise GGMLError("ggml_backend_sched: hash set is full (graph_size too small for this graph)")
            slot[addr] = i
        out.append(i)
    return out


def _tbid(sched, t) -> int:
    """tensor_backend_id(tensor) (read); -1 for NULL."""
    if t is None:
        return -1
    return sched.hv_tensor_backend_ids[_hash_id(sched, t)]


def _set_tbid(sched, t, backend_id: int) -> None:
    sched.hv_tensor_backend_ids[_hash_id(sched, t)] = backend_id


def _copy_index(sched, id_: int, backend_id: int, copy_id: int) -> int:
    return id_ * sched.n_backends * sched.n_copies + backend_id * sched.n_copies + copy_id


def _tensor_id_copy(sched, id_: int, backend_id: int, copy_id: int):
    return sched.hv_tensor_copies[_copy_index(sched, id_, backend_id, copy_id)]


def _set_tensor_id_copy(sched, id_: int, backend_id: int, copy_id: int, t) -> None:
    sched.hv_tensor_copies[_copy_index(sched, id_, backend_id, copy_id)] = t


def _tensor_copy(sched, t, backend_id: int, copy_id: int):
    return _tensor_id_copy(sched, _hash_id(sched, t), backend_id, copy_id)


def _bname(sched, backend_id: int):
    return B.backend_name(sched.backends[backend_id]) if 0 <= backend_id < sched.n_backends else None


def SET_CAUSE(sched, t: Tensor, cause: str, backend_id: int = -1) -> None:
    h = sched._slot.get(t.addr)          # (hash_id(t): nearly always a tensor the split has seen already)
    sched.causes[_hash_id(sched, t) if h is None else h] = cause
    if trace.active:
        trace.emit("sched.assign", sched=id(sched), name=t.name, addr=t.addr, op=op_desc(t), cause=cause,
                   backend=_bname(sched, backend_id), backend_id=backend_id, **{"pass": sched._pass})


def GET_CAUSE(sched, t: Tensor) -> str:
    return sched.causes.get(_hash_id(sched, t), "")


def backend_sched_get_tensor_cause(sched, t: Tensor) -> str:
    """Why the last split put ``t`` where it is (ggml's debug-build GET_CAUSE): "1.dst", "2.sup", "3.upg" ..."""
    return GET_CAUSE(sched, t)


def _pass(sched, name: str, what: str) -> None:
    sched._pass = name
    if trace.active:
        trace.emit("sched.pass", sched=id(sched), what=what, **{"pass": name})


# ---- capacity growth

def backend_sched_split_inputs_grow(split: ggml_backend_sched_split) -> None:
    new_cap = GGML_SCHED_MAX_SPLIT_INPUTS
    if split.inputs_capacity > 0:
        new_cap = 2 * split.inputs_capacity
        GGML_LOG("warn", f"ggml_backend_sched_split_inputs_grow: increasing split inputs capacity from "
                 f"{split.inputs_capacity} to {new_cap}")
    split.inputs_capacity = new_cap


def backend_sched_graph_inputs_grow(sched) -> None:
    new_cap = GGML_SCHED_MAX_SPLIT_INPUTS
    if sched.graph_inputs_capacity > 0:
        new_cap = 2 * sched.graph_inputs_capacity
        GGML_LOG("warn", f"ggml_backend_sched_graph_inputs_grow: increasing graph inputs capacity from "
                 f"{sched.graph_inputs_capacity} to {new_cap}")
    sched.graph_inputs_capacity = new_cap


# ---- assignment helpers

def backend_sched_backend_id(sched, backend) -> int:
    """The priority of the backend, lower id is higher priority (-1: not in the scheduler)."""
    for i in range(sched.n_backends):
        if sched.backends[i] is backend:
            return i
    return -1


def _buffer_of(t: Tensor):
    q = t._q
    vs = q.item(_Q_VIEW_SRC)
    return B.buffer_at(tensor_at(vs)._q.item(_Q_BUFFER) if vs else q.item(_Q_BUFFER))


def _supports(sched, b: int, op: Tensor) -> bool:
    """ggml_backend_supports_op(sched->backends[b], op), the answer recorded while a split records its memo.
    (ggml_backend_supports_op -> ggml_backend_dev_supports_op -> the device's supports_op, called straight.)"""
    dev = sched.backends[b].device
    qs = sched._queries
    if qs is None:
        return bool(dev.iface.supports_op(dev, op))
    # (recording: with the shapes the answer read, where the device says -- ggml_backend_device_i.supports_op_reads)
    f = dev.iface.supports_op_reads
    if f is None:
        r, reads = bool(dev.iface.supports_op(dev, op)), None
    else:
        r, reads = f(dev, op)
        r = bool(r)
    qs.append((op.addr, b, False, r, reads))
    return r


def _supports_buft(sched, b: int, buft) -> bool:
    """ggml_backend_supports_buft(sched->backends[b], buft): a device's answer for a buffer type does not change
    (ggml's supports_buft reads only the two), so each pair is asked once per scheduler."""
    cache = sched._buft_ok
    e = cache.get((b, id(buft)))
    if e is not None and e[0] is buft:
        return e[1]
    r = B.backend_supports_buft(sched.backends[b], buft)
    cache[(b, id(buft))] = (buft, r)
    return r


def _offloads(sched, b: int, op: Tensor) -> bool:
    """ggml_backend_offload_op(sched->backends[b], op), recorded as ``_supports``."""
    r = B.backend_offload_op(sched.backends[b], op)
    if sched._queries is not None:
        sched._queries.append((op.addr, b, True, r, None))
    return r


def backend_sched_backend_from_buffer(sched, tensor: Tensor, op: Tensor) -> int:
    q = tensor._q
    vs = q.item(_Q_VIEW_SRC)
    return _backend_from_buffer_at(sched, tensor_at(vs)._q.item(_Q_BUFFER) if vs else q.item(_Q_BUFFER), tensor, op)


def _backend_from_buffer_at(sched, buf: int, tensor: Tensor, op: Tensor) -> int:
    """backend_sched_backend_from_buffer with ``buf``, the address of the tensor's buffer (its view source's for
    a view: ``tensor->view_src ? tensor->view_src->buffer : tensor->buffer``), read already."""
    if not buf:
        return -1
    buffer = B.buffer_at(buf)
    # find highest prio backend that supports the buffer type and the op
    # (_supports_buft's cache read inline: pass 1 asks this for every weight and every op on one, ~800 a graph)
    buft = buffer.buft
    cache = sched._buft_ok
    for i in range(sched.n_backends):
        e = cache.get((i, id(buft)))
        if (e[1] if e is not None and e[0] is buft else _supports_buft(sched, i, buft)) and _supports(sched, i, op):
            return i
    if sched.debug:
        GGML_LOG("debug", f"ggml_backend_sched_backend_from_buffer: warning: no backend supports op {op_desc(tensor)} "
                 f"with a weight with buffer type {B.backend_buffer_name(buffer)} used in tensor "
                 f"{tensor.name}, the weight will need to be copied")
    return -1


def _cause_at(sched, t: Tensor, h, cause: str, backend_id: int) -> None:
    """SET_CAUSE with ``h``, the tensor's hash slot, known (None: looked up)."""
    if h is None or trace.active:
        SET_CAUSE(sched, t, cause, backend_id)
    else:
        sched.causes[h] = cause


_WEIGHTS = B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS
_NO_WEIGHTS_TEST = (C.GGML_OP_ROPE, C.GGML_OP_FLASH_ATTN_EXT)


def backend_sched_backend_id_from_cur(sched, tensor: Tensor, h: int | None = None) -> int:
    """The backend that should be used for the node based on the current locations (pass 1). (``h``: the
    tensor's hash slot, when the caller has it. Each struct word below is read once, the buffers' addresses passed
    on: pass 1 asks this for ~800 tensors of a graph.)"""
    q = tensor._q
    # (a tensor with no buffer, neither its own nor its view source's -- most of a graph's nodes, views of them
    # included -- goes straight to the checks below: the three above it find no buffer and return -1 without
    # asking a backend)
    vs = q.item(_Q_VIEW_SRC)
    own = q.item(_Q_BUFFER)
    vbuf = tensor_at(vs)._q.item(_Q_BUFFER) if vs else 0
    if own or vbuf:
        # assign pre-allocated nodes to their backend
        cur_backend_id = _backend_from_buffer_at(sched, vbuf if vs else own, tensor, tensor)
        if cur_backend_id != -1:
            _cause_at(sched, tensor, h, "1.dst", cur_backend_id)
            return cur_backend_id

        # view_src
        if vs:
            v = tensor_at(vs)
            vq = v._q
            vvs = vq.item(_Q_VIEW_SRC)
            cur_backend_id = _backend_from_buffer_at(
                sched, tensor_at(vvs)._q.item(_Q_BUFFER) if vvs else vbuf, v, tensor)
            if cur_backend_id != -1:
                _cause_at(sched, tensor, h, "1.vsrc", cur_backend_id)
                return cur_backend_id

        # (own or vbuf: the tensor is pre-allocated, in its own buffer or its view source's)
        # since the tensor is pre-allocated, it cannot be moved to another backend
        buffer = _buffer_of(tensor)
        raise GGMLError(f"pre-allocated tensor ({tensor.name}) in a buffer ({B.backend_buffer_name(buffer)}) "
                        f"that cannot run the operation ({op_desc(tensor)})")

    # graph input
    w = tensor._w
    if w.item(_W_FLAGS) & C.GGML_TENSOR_FLAG_INPUT:
        cur_backend_id = sched.n_backends - 1      # last backend (assumed CPU)
        _cause_at(sched, tensor, h, "1.inp", cur_backend_id)
        return cur_backend_id

    # operations with weights are preferably run on the same backend as the weights
    # skip ROPE since the rope freqs tensor is too small to choose a backend based on it
    # skip FLASH_ATTN_EXT since the sinks tensor is too small to choose a based based on it
    if w.item(_W_OP) not in _NO_WEIGHTS_TEST:
        for i, a in enumerate(q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC].tolist()):
            if not a:
                continue
            src = tensor_at(a)
            sq = src._q
            sb = sq.item(_Q_BUFFER)
            if not sb:
                continue
            src_buf = B.buffer_at(sb)
            if src_buf._w.item(B._W_BUF_USAGE) == _WEIGHTS:          # (src_buf->usage)
                svs = sq.item(_Q_VIEW_SRC)
                src_backend_id = _backend_from_buffer_at(sched, tensor_at(svs)._q.item(_Q_BUFFER) if svs else sb,
                                                         src, tensor)
                # check if a backend with higher prio wants to offload the op
                # (with one backend there is no higher-prio backend to ask: is_host is not asked for nothing)
                if (sched.op_offload and src_backend_id == sched.n_backends - 1 and src_backend_id > 0
                        and B.backend_buffer_is_host(src_buf)):
                    for b in range(src_backend_id):
                        if _supports(sched, b, tensor) and _offloads(sched, b, tensor):
                            _cause_at(sched, tensor, h, "1.off", b)
                            return b
                _cause_at(sched, tensor, h, _WGT_CAUSES[i], src_backend_id)
                return src_backend_id
    return -1


_WGT_CAUSES = tuple(f"1.wgt{i}" for i in range(C.GGML_MAX_SRC))


def backend_sched_buffer_supported(sched, t: Tensor, backend_id: int) -> bool:
    buf = _buffer_of(t)
    buft = None
    if buf is not None:
        # the tensor is already allocated
        buft = buf.buft
    else:
        # see if the tensor already has a backend assigned, and use the buffer type of that backend
        tensor_backend_id = _tbid(sched, t)
        if tensor_backend_id == -1 and t.view_src is not None:
            tensor_backend_id = _tbid(sched, t.view_src)
        if tensor_backend_id != -1:
            buft = sched.bufts[tensor_backend_id]
    return buft is not None and _supports_buft(sched, backend_id, buft)


def backend_sched_set_if_supported(sched, node: Tensor, cur_backend_id: int) -> bool:
    """Assign ``cur_backend_id`` to ``node`` if the backend supports the op ("2.sup"); returns whether it did."""
    if _supports(sched, cur_backend_id, node):
        _set_tbid(sched, node, cur_backend_id)
        SET_CAUSE(sched, node, "2.sup", cur_backend_id)
        return True
    return False


# ==================================================================================================
# split
# ==================================================================================================

def backend_sched_split_graph(sched, graph: CGraph) -> None:
    """Assign backends to ops and split the graph into subgraphs that can be computed on the same backend."""
    # reset splits
    sched.n_splits = 0
    sched.n_graph_inputs = 0
    sched.graph_inputs = []
    sched.is_reset = False

    if sched.ctx is not None:
        _check_not_split_before(sched, graph)
        ggml_free(sched.ctx)
    sched.ctx = ggml_init(sched.context_buffer_size, sched.context_buffer, True)
    graph.uid = graph_next_uid()
    n_nodes, n_leafs = graph.n_nodes, graph.n_leafs
    nodes, leafs = graph.nodes, graph.leafs
    tbid = sched.hv_tensor_backend_ids
    cpu_id = sched.n_backends - 1

    hit = None if trace.active else _split_memo_match(sched, graph)
    matched = hit is not None
    if matched:
        # ggviz: passes 1-4 of this graph as its last split left them (see _SplitMemo: the same graph, only shapes
        # changed, which the backends' answers do not depend on; with one backend, other pins: moved to their slots)
        memo = hit[0]
        hid, isview = _split_memo_apply(sched, memo, hit[1])
        srcs = None
    else:
        pre = _split_memo_begin(sched)
        try:
            hid, isview, srcs, plain = _assign_backends(sched, nodes, leafs, n_nodes, tbid, cpu_id)
        finally:
            queries, sched._queries = sched._queries, None
        memo = _split_memo_end(sched, graph, pre, queries, hid, isview, plain)

    # pass 5: split graph, find tensors that need to be copied
    _pass(sched, "5", "split the graph, find the tensors that need to be copied")
    if matched and memo.pass5 is not None:
        # ggviz: what pass 5 made of this graph last time, when it made no copy (one backend): it reads the backends
        # passes 1-4 left (the memo's), the nodes' sources (the same pointers) and the weights' buffers (the same
        # bytes), so it finds the same split boundaries, and again no input to copy
        i_split = _split_memo_pass5(sched, memo)
    else:
        i_split = _pass5(sched, nodes, n_nodes, hid, isview, tbid, srcs)
        if memo is not None:
            memo.pass5 = ([(s.backend_id, s.i_start, s.i_end) for s in sched.splits[:i_split + 1]]
                          if sched.n_graph_inputs == 0 and not any(s.inputs for s in sched.splits[:i_split + 1])
                          else None)
    sched.n_splits = i_split + 1

    if sched.debug:
        sys.stderr.write(backend_sched_print_assignments(sched, graph))
    _split_finish(sched, graph, nodes, leafs, n_nodes, n_leafs, hid, tbid)


def _split_memo_pass5(sched, memo) -> int:
    """Pass 5's splits put back from the memo (none of them has inputs); returns the last split's index."""
    for k, (backend_id, i_start, i_end) in enumerate(memo.pass5):
        split = _get_split(sched, k)
        split.backend_id, split.i_start, split.i_end = backend_id, i_start, i_end
        split.inputs = []
    return len(memo.pass5) - 1


def _pass5(sched, nodes, n_nodes, hid, isview, tbid, srcs=None) -> int:
    """Pass 5 of backend_sched_split_graph: cut the graph into splits of one backend each and find the tensors to
    copy into a split's backend. Returns the last split's index. (``srcs``: see _node_words; None: read here.)"""
    i_split = 0
    split = _get_split(sched, 0)
    # find the backend of the first split, skipping view ops
    i = 0
    while i < n_nodes:
        if not isview[i]:
            split.backend_id = tbid[hid[i]]
            break
        i += 1
    split.i_start = 0
    split.inputs = []
    cur_backend_id = split.backend_id
    slot = sched._slot
    while i < n_nodes:
        if isview[i]:
            i += 1
            continue
        node = nodes[i]
        node_backend_id = tbid[hid[i]]
        # all nodes should be assigned by now, this can happen if there is no CPU fallback
        if not (node_backend_id != -1):      # (the message is only formatted when it fails)
            GGML_ASSERT(False, f"node {node.name!r} has no backend (no CPU fallback?)")

        # check if we should start a new split based on the sources of the current node
        need_new_split = False
        if node_backend_id == cur_backend_id and split.inputs:       # (split->n_inputs > 0)
            for j, src in A.srcs_of(node):
                # check if a weight is on a different and incompatible backend
                # by starting a new split, the memory of the previously offloaded weights can be reused
                src_buf = B.buffer_at(src.buffer) if src.buffer else None
                if src_buf is not None and src_buf.usage == B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS:
                    src_backend_id = _tbid(sched, src)
                    if src_backend_id != cur_backend_id and not backend_sched_buffer_supported(sched, src, cur_backend_id):
                        need_new_split = True
                        break
                # check if the split has too many inputs
                # FIXME: count the number of inputs instead of only checking when full
                if split.n_inputs >= split.inputs_capacity:
                    id_ = _hash_id(sched, src)
                    src_backend_id = tbid[id_]
                    supported = backend_sched_buffer_supported(sched, src, cur_backend_id)
                    if (src_backend_id != cur_backend_id and _tensor_id_copy(sched, id_, cur_backend_id, 0) is None
                            and not supported):
                        need_new_split = True
                        break

        if node_backend_id != cur_backend_id or need_new_split:
            split.i_end = i
            _emit_split(sched, i_split, split)
            i_split += 1
            split = _get_split(sched, i_split)
            split.backend_id = node_backend_id
            split.i_start = i
            split.inputs = []
            cur_backend_id = node_backend_id

        # find inputs that are not on the same backend
        # (node->src[j] from the struct's words, its hash slot the one pass 1-4 found; the Tensor only where the
        # body needs more than its backend id -- with one backend, nowhere)
        for j, a in enumerate(srcs[i] if srcs is not None else node._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC].tolist()):
            if not a:
                continue
            src_id = slot.get(a)
            if src_id is None:
                src_id = _hash_id(sched, tensor_at(a))
            src_backend_id = tbid[src_id]
            if not (src_backend_id != -1):      # (the message is only formatted when it fails)
                GGML_ASSERT(False, f"source {tensor_at(a).name!r} of {node.name!r} has no backend")
            if src_backend_id == cur_backend_id and sched.n_copies == 1:
                continue                        # (neither test below can hold)
            src = tensor_at(a)

            if (src.flags & C.GGML_TENSOR_FLAG_INPUT) and sched.n_copies > 1:
                if _tensor_id_copy(sched, src_id, src_backend_id, 0) is None:
                    backend = sched.backends[src_backend_id]
                    for c in range(sched.n_copies):
                        if c == sched.cur_copy:
                            tensor_copy = src     # use the original tensor as the current copy
                        else:
                            tensor_copy = _dup_tensor_layout(sched.ctx, src)
                            tensor_copy.name = f"{B.backend_name(backend)}#{src.name}#{c}"
                        tensor_copy.flags = tensor_copy.flags | C.GGML_TENSOR_FLAG_INPUT
                        _set_output(tensor_copy)     # prevent ggml-alloc from overwriting the tensor
                        _set_tensor_id_copy(sched, src_id, src_backend_id, c, tensor_copy)
                        SET_CAUSE(sched, tensor_copy, "4.cpy", src_backend_id)
                    n_graph_inputs = sched.n_graph_inputs
                    sched.n_graph_inputs += 1
                    if n_graph_inputs >= sched.graph_inputs_capacity:
                        backend_sched_graph_inputs_grow(sched)
                    sched.graph_inputs.append(src)

            if src_backend_id != cur_backend_id and not backend_sched_buffer_supported(sched, src, cur_backend_id):
                # create a copy of the input in the split's backend
                if _tensor_id_copy(sched, src_id, cur_backend_id, 0) is None:
                    backend = sched.backends[cur_backend_id]
                    for c in range(sched.n_copies):
                        tensor_copy = _dup_tensor_layout(sched.ctx, src)
                        tensor_copy.name = f"{B.backend_name(backend)}#{src.name}#{c}"
                        if sched.n_copies > 1:
                            tensor_copy.flags = tensor_copy.flags | C.GGML_TENSOR_FLAG_INPUT
                            _set_output(tensor_copy)    # prevent ggml-alloc from overwriting the tensor
                        _set_tensor_id_copy(sched, src_id, cur_backend_id, c, tensor_copy)
                        SET_CAUSE(sched, tensor_copy, "4.cpy", cur_backend_id)
                        if trace.active:
                            trace.emit("sched.copy", sched=id(sched), phase="split", split=i_split, input=src.name,
                                       copy=tensor_copy.name, from_backend=_bname(sched, src_backend_id),
                                       to_backend=_bname(sched, cur_backend_id), copy_id=c, nbytes=nbytes(src),
                                       node=node.name)
                    n_inputs = split.n_inputs
                    if n_inputs >= split.inputs_capacity:
                        backend_sched_split_inputs_grow(split)
                    split.inputs.append(src)
                node.src[j] = _tensor_id_copy(sched, src_id, cur_backend_id, sched.cur_copy)
        i += 1
    split.i_end = n_nodes
    _emit_split(sched, i_split, split)
    return i_split


def _split_finish(sched, graph, nodes, leafs, n_nodes, n_leafs, hid, tbid) -> None:
    """The end of backend_sched_split_graph: the graph copy the allocator gets (each split's input copies, then its
    nodes; the input copies and the leafs) with the backend of each, and the splits' graph views."""
    # swap node_backend_ids and leaf _backend_ids with prevs
    sched.node_backend_ids, sched.prev_node_backend_ids = sched.prev_node_backend_ids, sched.node_backend_ids
    sched.leaf_backend_ids, sched.prev_leaf_backend_ids = sched.prev_leaf_backend_ids, sched.leaf_backend_ids

    total_inputs = sched.n_graph_inputs
    for k in range(sched.n_splits):
        total_inputs += sched.splits[k].n_inputs
    graph_size = max(n_nodes, n_leafs) + total_inputs * 2 * sched.n_copies

    # remember the actual graph_size for performing reallocation checks later [GGML_SCHED_DEBUG_REALLOC]
    sched.debug_prev_graph_size = sched.debug_graph_size
    sched.debug_graph_size = graph_size

    if sched.graph.size < graph_size:
        sched.graph.size = graph_size
    gc_nodes: list[Tensor] = []
    gc_leafs: list[Tensor] = []
    node_ids = sched.node_backend_ids
    leaf_ids = sched.leaf_backend_ids
    _ensure_len(node_ids, graph_size)
    _ensure_len(leaf_ids, graph_size)
    # (the ids written below: at most graph_size of each -- the graph copy's nodes and leafs)
    sched._ids_written = max(sched._ids_written, graph_size)

    for k in range(sched.n_splits):
        split = sched.splits[k]
        split.graph = graph_view(graph, split.i_start, split.i_end)
        # ggviz: the view knows its graph's context, so the CPU backend can cache its compiled form between computes
        split.graph.ctx = graph.ctx

        # Optimize this split of the graph. This needs to happen before we make graph_copy, so they are in sync.
        B.backend_graph_optimize(sched.backends[split.backend_id], split.graph)

        # add inputs to the graph copy so that they are allocated by ggml-alloc at the start of the split
        for inp in split.inputs:
            input_id = _hash_id(sched, inp)
            input_cpy = _tensor_id_copy(sched, input_id, split.backend_id, sched.cur_copy)

            # add a dependency to the input source so that it is not freed before the copy is done
            input_dep = view_tensor(sched.ctx, inp)
            input_dep.src[0] = inp
            node_ids[len(gc_nodes)] = tbid[input_id]
            gc_nodes.append(input_dep)

            # add a dependency to the input copy so that it is allocated at the start of the split
            node_ids[len(gc_nodes)] = split.backend_id
            gc_nodes.append(input_cpy)

        # (the split's nodes and their ids in one slice each: node_ids is a C int array)
        k, i0, i1 = len(gc_nodes), split.i_start, split.i_end
        node_ids[k:k + i1 - i0] = array.array("i", [tbid[h] for h in hid[i0:i1]])
        gc_nodes.extend(nodes[i0:i1])

    if sched.n_copies > 1:
        # add input copies as leafs so that they are allocated first
        for inp in sched.graph_inputs:
            id_ = _hash_id(sched, inp)
            backend_id = tbid[id_]
            for c in range(sched.n_copies):
                input_cpy = _tensor_id_copy(sched, id_, backend_id, c)
                leaf_ids[len(gc_leafs)] = backend_id
                gc_leafs.append(input_cpy)
        for k in range(sched.n_splits):
            split = sched.splits[k]
            backend_id = split.backend_id
            for inp in split.inputs:
                id_ = _hash_id(sched, inp)
                for c in range(sched.n_copies):
                    input_cpy = _tensor_id_copy(sched, id_, backend_id, c)
                    leaf_ids[len(gc_leafs)] = backend_id
                    gc_leafs.append(input_cpy)

    # add leafs from the original graph
    # (hash_id(leaf): the slot pass 1 found, nearly always; their ids in one slice)
    slot = sched._slot
    k = len(gc_leafs)
    ids = []
    for leaf in leafs:
        h = slot.get(leaf.addr)
        ids.append(tbid[_hash_id(sched, leaf) if h is None else h])
    leaf_ids[k:k + len(ids)] = array.array("i", ids)
    gc_leafs.extend(leafs)

    sched.graph.nodes = gc_nodes
    sched.graph.leafs = gc_leafs

    # set ids for all splits
    for k in range(sched.n_splits):
        sched.splits[k].graph.uid = graph_next_uid()

    sched.last_plan = _PlanLater(sched, graph)
    sched._pass = ""


# ---- ggviz: the split memo (passes 1-4 of a graph split again with other shapes)
#
# llama.cpp splits every graph it builds (microseconds in C); ggviz turns the graph of one n_kv into the graph of
# another in place (llama.graph.derive_graph) and splits it again, ~1,000 nodes through passes 1-4 in Python. What
# passes 1-4 read is: the scheduler's per-graph tables as they start (the user's pins), the backends and their buffer
# types, each tensor's op, flags, sources, view source, buffer -- and the backends' supports_op / offload_op
# answers, the only place a tensor's shape enters. So a graph whose node and leaf structs are byte for byte those
# of its last split except ne/nb, split against the same starting tables, with every recorded supports_op /
# offload_op answer about a reshaped tensor or a consumer of one still the same, gets the same backends, causes
# and hash slots: they are put back instead of computed. (Backends answer from the op and its direct sources, as
# ggml's do. A device that says which shapes an answer reads -- ggml_backend_device_i.supports_op_reads; the
# CPU's read one for a few ops only -- is asked again only where one of those changed.) Anything else -- another node list, another field changed, a tensor outside the graph's arena
# changed, another answer, a trace listener (the views read the passes' events) -- runs the passes.
#
# Other pins, one backend. llama's graph callback pins each layer's "norm" below 32 tokens (cause "usr"), so a
# prompt's graph derived from the pp reserve's starts from other tables than the reserve's split did. With one
# backend (sched.n_backends == 1) a pin changes nothing but its own tensor's cause, under the conditions checked
# below (_memo_form, _pins_agree) -- walking ggml's passes (_assign_backends) with pins P (now) against the
# memo's run with pins Q, every pin to backend 0 and the tables holding nothing else:
#   pass 1   backend_id_from_cur reads only its own tensor (struct, buffers, the backends' answers about it) and
#            writes only its own slot: a tensor in neither P nor Q gets what it got in the memo's run. A tensor of
#            Q not in P must be a node pass 1 leaves at -1 without asking (_node_words' ``plain``: no buffer, no
#            input flag, no weight source), so it is -1 after pass 1 as in any run without its pin.
#   2.1/2.2  skipped with one backend (the CPU is the only backend and they skip it).
#   2.3/2.4  walk the non-view nodes; cur_backend_id becomes 0 at the first assigned one and stays 0 (no other
#            id exists). So if any non-view node is assigned when 2.3 starts, after 2.4 every non-view node the
#            backend supports is assigned: those assigned before keep their cause, the others get (0, "2.sup")
#            -- whether in 2.3 or 2.4, and wherever the pins are. Required: a non-view node assigned in pass 1 in
#            the memo's run, not pinned in either (an "anchor"; assigned in pass 1 now too, see pass 1).
#            Then a node of Q not in P, non-view and supported (the device is asked now, as the passes would),
#            gets (0, "2.sup"); a node of P not in Q is assigned before pass 3 both ways when the memo's run gave
#            it a pass-1 cause or "2.sup" (a supported node is assigned by 2.x there, so "2.sup" is not pass 4's).
#   3        with one backend an assigned node has no higher-priority backend (range(0)), and an unassigned non-view
#            node is one the backend does not support (see 2.x): the supports_op answer is no, nothing is read or
#            inserted. Pass 3 changes nothing, both ways.
#   4        reads only backend ids, view sources and sources, and writes only slots still at -1: with the ids equal
#            when it starts (above: every tensor's id is the memo's, the pins' 0 included), it writes the same ids
#            and causes, and inserts the same tensors (sources and view sources not in the graph) in the same order.
#   5        reads the ids (equal) and the graph: the memo's pass-5 record holds.
# So: every tensor gets the memo's backend and cause, but a tensor of P ((0, "usr")) and one of Q not in P
# ((0, "2.sup")). What does change is the hash slots: P's tensors were inserted first (set_tensor_backend), then
# the leafs, the nodes (pass 1's _hash_ids), then the tensors pass 4 met (in the memo's insertion order) -- and
# with linear probing the slots depend on which keys came first. So the memo's results are written per tensor
# into the slots a split gives now (_split_memo_move, inserting in that order). Anything the conditions cannot
# check (several backends, a pin on a leaf or a view, tables with more than pins, copies, a memo of another
# scheduler) runs the passes.
#
# A graph copied into a new arena (llama.graph_copy) inherits its source's memos, every pointer into the old arena
# moved as the copy moves them (split_memo_copy): the same structs, words and answers at the new addresses.

_TENSOR_WORDS = C.GGML_TENSOR_SIZE // 8
_SHAPE_WORDS = np.zeros(_TENSOR_WORDS, bool)
_SHAPE_WORDS[2:10] = True                    # ne[4], nb[4]: words 2..9 of struct ggml_tensor
_UNSET = object()


class _SplitMemo:
    __slots__ = ("key", "addrs", "rows", "words", "ext", "ext_bytes", "pre", "post", "queries", "reads", "hid",
                 "isview", "pass5", "n_leafs", "plain", "form")


class _MemoForm:
    """A split memo's results by tensor address, not by hash slot (for other pins on one backend: see above):
    ``pins`` the memo's run started with (addresses, in order), ``order`` every tensor the passes inserted (leafs,
    nodes, then the others, in their order), ``tb`` / ``cause`` what each got, ``nodes`` the node addresses, and the
    nodes a pin may be put on (``pinnable``), taken off (``unpinnable``), the ``anchors``."""
    __slots__ = ("pins", "order", "tb", "cause", "has_cause", "home", "nodes", "pinnable", "unpinnable", "anchors")


def _tables(sched) -> tuple:
    """The per-graph tables passes 1-4 read and write (copies)."""
    hs = sched.hash_set
    return (hs.used.copy(), hs.keys.copy(), dict(sched._slot), list(sched.hv_tensor_backend_ids),
            dict(sched.causes), list(sched.hv_tensor_copies))


def _used_slots(hs, used) -> np.ndarray:
    """The used bitset as one bool per slot."""
    return np.unpackbits(used.view(np.uint8), bitorder="little")[:hs.size].astype(bool)


def _tables_equal(sched, t: tuple) -> bool:
    """Do the scheduler's tables equal ``t``? (The keys of unused slots are left from earlier graphs, as in C --
    reset clears only the bitset -- and nothing reads them.)"""
    hs = sched.hash_set
    if not (np.array_equal(hs.used, t[0]) and sched._slot == t[2] and sched.hv_tensor_backend_ids == t[3]
            and sched.causes == t[4] and sched.hv_tensor_copies == t[5]):
        return False
    u = _used_slots(hs, hs.used)
    return np.array_equal(hs.keys[u], t[1][u])


def _pins_of(size: int, used, keys, slot, tbid, causes, copies):
    """The tensors pinned to backend 0 (addresses, in insertion order) if the tables hold those pins and nothing
    else -- each used slot a pinned tensor's, cause "usr", every other id -1, no copy -- else None."""
    n = len(slot)
    if len(causes) != n or int(np.unpackbits(used.view(np.uint8)).sum()) != n:
        return None
    for a, i in slot.items():
        if tbid[i] != 0 or causes.get(i) != "usr" or keys.item(i) != a:
            return None
    if tbid.count(-1) != len(tbid) - n or copies.count(None) != len(copies):
        return None
    return list(slot)


def _sched_key(sched) -> tuple:
    return (id(sched), tuple(id(b) for b in sched.backends), tuple(id(b) for b in sched.bufts), sched.op_offload,
            sched.n_copies, sched.hash_set.size)


def _arena_of(graph):
    """The graph's context arena as 64-bit words (the node structs live there), or None."""
    ctx = getattr(graph, "ctx", None)
    if ctx is None or getattr(ctx, "mem_buffer", None) is None:
        return None
    return ctx.mem_buffer[:ctx.used_mem() // 8 * 8].view(np.uint64)


def _split_memo_begin(sched):
    """Before passes 1-4: the tables they start from, and turn on the recording of the backends' answers."""
    if trace.active:
        return None
    sched._queries = []
    return _tables(sched)


def _split_memo_end(sched, graph, pre, queries, hid, isview, plain):
    """After passes 1-4: remember, on the graph, what they started from, read and left. Returns the memo (pass 5
    adds its splits when it made no copies), or None."""
    if pre is None or queries is None:
        return None
    arena = _arena_of(graph)
    if arena is None:
        return None
    base = graph.ctx.mem_buffer.ctypes.data
    tensors = list(graph.leafs) + list(graph.nodes)
    addrs = [t.addr for t in tensors]
    # each struct's word row in the arena, or the tensor is kept whole (weights, the KV cache: structs in other
    # contexts) -- the offsets tested all at once
    off = np.array(addrs, np.int64) - base
    inside = (off >= 0) & (off % 8 == 0) & (off + C.GGML_TENSOR_SIZE <= arena.nbytes)
    ext = [tensors[k] for k in np.flatnonzero(~inside).tolist()]
    m = _SplitMemo()
    m.key = _sched_key(sched)
    m.addrs = addrs
    m.rows = off[inside] // 8                # (each struct's first word)
    m.words = arena_structs(arena, m.rows)
    m.ext = ext
    m.ext_bytes = b"".join(t.raw.tobytes() for t in ext)
    m.pre, m.post = pre, _tables(sched)
    m.queries, m.hid, m.isview = queries, list(hid), list(isview)
    m.reads = None                           # (made when first needed: _query_reads)
    m.pass5 = None
    m.n_leafs, m.plain = len(graph.leafs), plain
    m.form = _UNSET                          # (made when first needed: _memo_form)
    # (two per graph: llama's reserve splits the tg graph with the build's pins and again without, and its
    # first decode splits it with them)
    try:
        graph._ggviz_split_memo = [m] + [o for o in (getattr(graph, "_ggviz_split_memo", None) or ())[:1]
                                         if o.key != m.key or o.pre is None or not _same_tables(o.pre, m.pre)]
    except AttributeError:
        pass
    return m


def _same_tables(a: tuple, b: tuple) -> bool:
    return (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2] and a[3] == b[3]
            and a[4] == b[4] and a[5] == b[5])


def _split_memo_match(sched, graph):
    """A split memo of the graph for which passes 1-4 would give what they gave it (see above), as ``(memo,
    None)`` -- its tables put back as they are -- or ``(memo, unpin)`` -- its results moved to the slots of this
    split's pins (one backend; ``unpin``: the memo's pins not pinned now) -- else None."""
    memos = getattr(graph, "_ggviz_split_memo", None)
    if not memos:
        return None
    key = _sched_key(sched)
    addrs = None
    for m in memos:
        if m.pre is None or m.key != key or not _tables_equal(sched, m.pre):
            continue
        if addrs is None:
            addrs = [t.addr for t in list(graph.leafs) + list(graph.nodes)]
        if addrs == m.addrs and _memo_holds(sched, graph, m):
            return m, None
    if sched.n_backends != 1:
        return None
    pins = None
    for m in memos:
        if m.key != key:
            continue
        form = _memo_form(m)
        if form is None:
            continue
        if pins is None:
            hs = sched.hash_set
            pins = _pins_of(hs.size, hs.used, hs.keys, sched._slot, sched.hv_tensor_backend_ids, sched.causes,
                            sched.hv_tensor_copies)
            if pins is None:
                return None
        unpin = _pins_agree(form, pins)
        if unpin is None:
            continue
        if addrs is None:
            addrs = [t.addr for t in list(graph.leafs) + list(graph.nodes)]
        if addrs != m.addrs or not _memo_holds(sched, graph, m):
            continue
        # a node pinned in the memo's run and not now: the passes ask the backend (2.3/2.4); it must say yes
        if all(_supports(sched, 0, tensor_at(a)) for a in unpin):
            return m, unpin
    return None


def _memo_form(m):
    """The memo's _MemoForm, made on first use; None where it cannot serve other pins (see above)."""
    f = m.form
    if f is _UNSET:
        f = m.form = _make_form(m)
    return f


def _make_form(m):
    if m.pre is None or len(m.key[1]) != 1:
        return None
    size = m.key[-1]
    pins = _pins_of(size, *m.pre)
    if pins is None:
        return None
    used, keys, slot, tbid, causes, copies = m.post
    if copies.count(None) != len(copies):
        return None
    addrs = m.addrs
    seen = set(addrs)
    nodes = addrs[m.n_leafs:]
    if len(seen) != len(addrs) or not set(pins) <= set(nodes) or not seen <= slot.keys():
        return None
    # (slot keeps insertion order: the pins, the leafs, the nodes, then what pass 4 inserted)
    order = addrs + [a for a in slot if a not in seen]
    at = [slot[a] for a in order]
    f = _MemoForm()
    f.pins, f.order, f.nodes = tuple(pins), order, nodes
    f.tb = [tbid[i] for i in at]
    f.cause = [causes.get(i) for i in at]
    f.has_cause = [c is not None for c in f.cause]
    f.home = _home_slots(order, size)
    f.pinnable, f.unpinnable, f.anchors = set(), set(), []
    pinned = set(pins)
    n0 = m.n_leafs
    for k, a in enumerate(nodes):
        if m.isview[k]:
            continue
        c = f.cause[n0 + k]
        if a in pinned:
            f.pinnable.add(a)
            if m.plain[k]:
                f.unpinnable.add(a)
        elif f.tb[n0 + k] == 0 and c is not None:
            if c.startswith("1."):
                f.anchors.append(a)
                f.pinnable.add(a)
            elif c == "2.sup":
                f.pinnable.add(a)
    return f


def _pins_agree(form, pins):
    """The memo's pins that are not pinned now (each must be a plain non-view node), if the pins ``pins`` now
    are all where a pin changes only its own cause, and an anchor is left unpinned; else None (see above)."""
    pinnable = form.pinnable
    now = set(pins)
    if not all(a in pinnable for a in pins):
        return None
    unpin = [a for a in form.pins if a not in now]
    if not all(a in form.unpinnable for a in unpin):
        return None
    if not any(a not in now for a in form.anchors):
        return None
    return unpin


def _memo_holds(sched, graph, m) -> bool:
    """Are the graph's structs those of the memo's split but for ne/nb, with the same backends' answers?"""
    arena = _arena_of(graph)
    if arena is None or m.rows.size and m.rows.max() + _TENSOR_WORDS > arena.size:
        return False
    words = arena_structs(arena, m.rows)
    diff = words != m.words
    if (diff & ~_SHAPE_WORDS).any():
        return False                          # a field other than ne/nb changed
    if b"".join(t.raw.tobytes() for t in m.ext) != m.ext_bytes:
        return False
    reshaped = diff.any(axis=1)
    if reshaped.any():
        base = graph.ctx.mem_buffer.ctypes.data
        rows = m.rows[reshaped]
        shaped = set((rows * 8 + base).tolist())        # the reshaped structs' addresses
        reads = m.reads
        if reads is None:
            reads = m.reads = _query_reads(m.queries)
        affected = None
        backends = sched.backends
        queries = m.queries
        for k, r in reads:
            addr, b, offload, answer, _ = queries[k]
            if r is None:
                # an answer the device does not say it reads no shape for: asked again if the op or a tensor it
                # reads (a source, its view source) was reshaped -- a reference is an arena word offset, looked up
                # in a table of the reshaped structs' first words
                if affected is None:
                    at = np.zeros(arena.size, bool)
                    at[rows] = True
                    refs = words[:, _Q_SRC:_Q_SRC + C.GGML_MAX_SRC + 1].view(np.int64) - base   # src[], view_src
                    inside = (refs >= 0) & (refs < arena.size * 8) & (refs % 8 == 0)
                    hit = reshaped | (inside & at[np.where(inside, refs // 8, 0)]).any(axis=1)
                    affected = set((m.rows[hit] * 8 + base).tolist())
                if addr not in affected:
                    continue
            elif shaped.isdisjoint(r):
                continue                               # (none of the shapes it reads changed)
            if offload:
                now = B.backend_offload_op(backends[b], tensor_at(addr))
            else:
                dev = backends[b].device               # (as _supports asks)
                now = bool(dev.iface.supports_op(dev, tensor_at(addr)))
            if now != answer:
                return False
        # every answer the memo holds is the backends' answer about these structs too: the memo now describes them
        # (the next split of this shape reads no answer again)
        m.words = words
    return True


def _query_reads(queries) -> list:
    """The recorded answers that may have read a shape (_memo_holds asks only those again): ``(k, reads)`` for each
    query ``k`` whose device said its answer read the shapes of the tensors ``reads`` (addresses; answers that read
    none are left out), or with ``reads`` None -- an offload_op answer, or a device that does not say
    (ggml_backend_device_i.supports_op_reads): any shape of the op and its sources."""
    return [(k, q[4]) for k, q in enumerate(queries) if q[4] is None or q[4]]


def _split_memo_apply(sched, m, unpin=None):
    """Put passes 1-4's results back (in place: the split holds references to these tables); with ``unpin`` not
    None, moved to this split's slots (_split_memo_move)."""
    if unpin is not None:
        return _split_memo_move(sched, m, unpin)
    used, keys, slot, tbid, causes, copies = m.post
    hs = sched.hash_set
    hs.used[...] = used
    u = _used_slots(hs, used)
    hs.keys[u] = keys[u]                     # (the other slots keep what they hold, as after the passes)
    sched._slot.clear()
    sched._slot.update(slot)
    sched.hv_tensor_backend_ids[:] = tbid
    sched.causes.clear()
    sched.causes.update(causes)
    sched.hv_tensor_copies[:] = copies
    sched.n_split_memo += 1
    return list(m.hid), list(m.isview)


def _split_memo_move(sched, m, unpin):
    """The memo's results written into the slots this split gives its tensors (one backend, other pins: see
    above): the tensors the passes insert, in their order, after the pins already there; each gets the memo's
    backend and cause but the pins (kept: (0, "usr")) and the memo's pins not pinned now ((0, "2.sup"))."""
    f = m.form
    slot = sched._slot
    pins = list(slot)
    pinned = set(pins)
    order = f.order
    keep = [a not in pinned for a in order] if pins else None
    new = list(compress(order, keep)) if pins else order
    pos = _insert_in_order(sched, new, f.home[np.array(keep, bool)] if pins else f.home)
    if pins:                                     # (each tensor's slot, in the form's order)
        it = iter(pos)
        pos = [next(it) if k else slot[a] for a, k in zip(order, keep)]
    tbid, causes = sched.hv_tensor_backend_ids, sched.causes
    for i, b in zip(pos, f.tb):
        tbid[i] = b
    causes.update(compress(zip(pos, f.cause), f.has_cause))
    for a in pins:
        i = slot[a]
        tbid[i] = 0
        causes[i] = "usr"
    for a in unpin:
        i = slot[a]
        tbid[i] = 0
        causes[i] = "2.sup"
    sched.n_split_memo += 1
    sched.n_split_memo_moved += 1
    return pos[m.n_leafs:len(m.addrs)], list(m.isview)      # (the order starts with the leafs and nodes)


# the keys placed at their home slots at once when no two share one and none is taken (False: always inserted one
# by one, in order; tests compare the two)
PLACE_AT_ONCE = True


def _home_slots(addrs, size: int) -> np.ndarray:
    """ggml_hash: ``(addr >> 4) % size`` of each address."""
    return (np.fromiter(addrs, np.int64, len(addrs)) >> 4) % size


def _insert_in_order(sched, addrs, home=None) -> list:
    """ggml_hash_find_or_insert of each address (none in the set yet), in order, recorded in ``sched._slot``;
    returns their slots. Where every home slot ``(addr >> 4) % size`` (``home``: computed already) is distinct and
    free, linear probing moves no key along: each lands at its home whatever the order, and they are placed at
    once."""
    if not addrs:
        return []
    hs = sched.hash_set
    slot = sched._slot
    if PLACE_AT_ONCE:
        if home is None:
            home = _home_slots(addrs, hs.size)
        mask = np.unpackbits(hs.used.view(np.uint8), bitorder="little").view(bool)
        n0 = int(np.count_nonzero(mask))
        if not mask[home].any():
            mask[home] = True
            if int(np.count_nonzero(mask)) == n0 + len(addrs):       # (none free twice: the homes are distinct)
                hs.keys[home] = addrs
                hs.used[:] = np.packbits(mask, bitorder="little").view(hs.used.dtype)
                pos = home.tolist()
                slot.update(zip(addrs, pos))
                return pos
            mask[home] = False
            mask[np.unpackbits(hs.used.view(np.uint8), bitorder="little").view(bool)] = True
        # linear probing, one key after the other as ggml_hash_find_or_insert does, over a byte per slot (none of
        # these keys is in the set: a used slot is only passed over); the keys and the bitset written after
        size = hs.size
        if len(addrs) > size - n0:
            raise GGMLError("ggml_backend_sched: hash set is full (graph_size too small for this graph)")
        used = bytearray(mask.view(np.uint8))
        pos = []
        for a, i in zip(addrs, home.tolist()):
            while used[i]:
                i += 1
                if i == size:
                    i = 0
            used[i] = 1
            pos.append(i)
        hs.keys[pos] = addrs
        hs.used[:] = np.packbits(np.frombuffer(used, bool), bitorder="little").view(hs.used.dtype)
        slot.update(zip(addrs, pos))
        return pos
    find_or_insert = hs.find_or_insert
    pos = []
    for addr in addrs:
        i = find_or_insert(addr)
        if i == GGML_HASHSET_FULL:
            raise GGMLError("ggml_backend_sched: hash set is full (graph_size too small for this graph)")
        slot[addr] = i
        pos.append(i)
    return pos


def split_memo_copy(src, dst, lo: int, hi: int, delta: int, ptr_words) -> None:
    """ggviz: ``dst``, a copy of the graph ``src`` whose structs were moved from the arena [lo, hi) by ``delta``
    (llama.graph_copy: each pointer into that arena in the struct words ``ptr_words`` moved, the rest byte for
    byte), inherits ``src``'s split memos that can serve other pins (_memo_form), moved the same way: addresses,
    the struct words compared, the recorded answers' tensors. Their tables are by address only (the hash slots
    of the copy's tensors are others), so they serve through _split_memo_move."""
    out = []

    def mv(addrs):
        a = np.fromiter(addrs, np.int64)
        a[(a >= lo) & (a < hi)] += delta
        return a.tolist()

    for m in getattr(src, "_ggviz_split_memo", None) or ():
        f = _memo_form(m)
        if f is None:
            continue
        r = _SplitMemo()
        r.key, r.rows, r.ext, r.ext_bytes = m.key, m.rows, m.ext, m.ext_bytes
        r.isview, r.pass5, r.n_leafs, r.plain = m.isview, m.pass5, m.n_leafs, m.plain
        w = m.words.copy()
        cols = w[:, ptr_words]
        cols[(cols >= np.uint64(lo)) & (cols < np.uint64(hi))] += np.uint64(delta % (1 << 64))
        w[:, ptr_words] = cols
        r.words = w
        r.pre = r.post = r.hid = None
        q = list(zip(*m.queries)) if m.queries else [(), (), (), (), ()]
        r.queries = list(zip(mv(q[0]), q[1], q[2], q[3], [rd if not rd else tuple(mv(rd)) for rd in q[4]]))
        r.reads = None
        g = r.form = _MemoForm()
        order = mv(f.order)
        g.order, g.tb, g.cause, g.has_cause = order, f.tb, f.cause, f.has_cause
        g.home = _home_slots(order, m.key[-1])
        r.addrs = order[:len(m.addrs)]           # (the order starts with the leafs and nodes)
        g.nodes = r.addrs[m.n_leafs:]
        g.pins = tuple(mv(f.pins))
        g.pinnable, g.unpinnable = set(mv(f.pinnable)), set(mv(f.unpinnable))
        g.anchors = mv(f.anchors)
        out.append(r)
    if out:
        try:
            dst._ggviz_split_memo = out
        except AttributeError:
            pass


def _assign_backends(sched, nodes, leafs, n_nodes, tbid, cpu_id):
    """Passes 1-4 of backend_sched_split_graph: every node and leaf gets its backend (and cause). Returns each
    node's hash slot and whether it is a view op (pass 5 reads them), its source pointers and whether pass 1 left
    it unassigned without asking (``_node_words``: the split memo keeps that)."""
    # pass 1: assign backends to ops with pre-allocated inputs
    _pass(sched, "1", "assign backends to ops with pre-allocated inputs (weights, KV cache), graph inputs")
    # ggviz: the leafs' hash slots, then the nodes', found (and inserted) in the order the loops below ask for them
    # -- backend_id_from_cur inserts nothing but its own tensor -- so they are the slots C's loops give; the nodes'
    # are kept for the passes below (C's hash_id(node) is a probe of the hash set; the Python one ~10 operations)
    for leaf, h in zip(leafs, _hash_ids(sched, leafs)):
        # do not overwrite user assignments
        if tbid[h] == -1:
            tbid[h] = backend_sched_backend_id_from_cur(sched, leaf, h)
    hid = _hash_ids(sched, nodes)
    ops, vss, srcs, unplaced = _node_words(nodes)
    isview = [o in _VIEW_OPS for o in ops]                      # ggml_is_view_op
    for node, h, skip in zip(nodes, hid, unplaced):
        # do not overwrite user assignments
        if tbid[h] == -1 and not skip:
            tbid[h] = backend_sched_backend_id_from_cur(sched, node, h)

    # pass 2: expand current backend assignments
    # assign the same backend to adjacent nodes
    # expand gpu backends (i.e. non last prio) up and down, ignoring cpu (the lowest priority backend)
    # thus, cpu will never be used unless weights are on cpu, or there are no gpu ops between cpu ops
    # ops unsupported by the backend being expanded will be left unassigned so that they can be assigned later when
    # the locations of its inputs are known
    for name, order, skip_cpu, what in (("2.1", range(n_nodes), True, "expand gpu down"),
                                        ("2.2", range(n_nodes - 1, -1, -1), True, "expand gpu up"),
                                        ("2.3", range(n_nodes), False, "expand rest down"),
                                        ("2.4", range(n_nodes - 1, -1, -1), False, "expand rest up")):
        _pass(sched, name, what)
        if skip_cpu and sched.n_backends == 1:
            # (the only backend is the CPU, which these passes skip: every node they reach either is the CPU's --
            # cur_backend_id back to -1 -- or finds cur_backend_id at -1, so they assign nothing)
            continue
        cur_backend_id = -1
        for i in order:
            if isview[i]:
                continue
            node_backend_id = tbid[hid[i]]
            if node_backend_id != -1:
                if skip_cpu and node_backend_id == cpu_id:
                    # skip cpu (lowest prio backend)
                    cur_backend_id = -1
                else:
                    cur_backend_id = node_backend_id
            elif cur_backend_id != -1:
                backend_sched_set_if_supported(sched, nodes[i], cur_backend_id)

    # pass 3: upgrade nodes to higher prio backends with compatible buffer types
    # if the tensor is already in the same buffer type (*) as another higher priority backend, we should move it there
    # however, we also need to verify that the sources are in compatible buffer types
    # (*) the actual requirement is more relaxed, the buffer type of the backend should be supported by all the users
    # of this tensor further down the graph; however, this is slow to verify, so we have a more strict requirement
    # that the buffer type is the same. this is not uncommon since multiple backends can use host memory, with the
    # same buffer type (eg. BLAS and CPU)
    # additionally, set remaining unassigned nodes to the backend with the most supported inputs
    # only nodes that could not be assigned during expansion due to the backend not supporting the op should be
    # unassigned at this point
    _pass(sched, "3", "upgrade to higher-priority backends with the same buffer type; assign the rest")
    for i, node in enumerate(nodes):
        if isview[i]:
            continue
        h = hid[i]
        if tbid[h] == -1:
            # unassigned node: find the backend with the most supported inputs
            n_supported_best = -1
            for b in range(sched.n_backends):
                if _supports(sched, b, node):
                    n_supported = 0
                    for j, src in A.srcs_of(node):
                        if ((_tbid(sched, src) != -1 or _tbid(sched, src.view_src) != -1)
                                and backend_sched_buffer_supported(sched, src, b)):
                            n_supported += 1
                    if n_supported > n_supported_best:
                        n_supported_best = n_supported
                        tbid[h] = b
                        SET_CAUSE(sched, node, "3.best", b)
        else:
            # assigned node: upgrade to higher prio backend if possible
            for b in range(tbid[h]):
                if sched.bufts[b] is sched.bufts[tbid[h]] and _supports(sched, b, node):
                    supported = True
                    for j, src in A.srcs_of(node):
                        if not backend_sched_buffer_supported(sched, src, b):
                            supported = False
                            break
                    if supported:
                        tbid[h] = b
                        SET_CAUSE(sched, node, "3.upg", b)
                        break

    # pass 4: assign backends to remaining src from dst and view_src
    _assign_pass4(sched, nodes, hid, tbid, vss, srcs)
    return hid, isview, srcs, unplaced


def _node_words(nodes) -> tuple:
    """ggviz: each node's op, view_src and src[] pointers (passes 1, 4 and 5 read them: passes 1-4 write no struct,
    pass 5 rewrites a node's src[j] only after reading that node's), and whether
    backend_sched_backend_id_from_cur would return -1 for it without asking a backend or setting a cause -- read
    from the nodes' struct words at once, where the graph's context arena holds the node and every tensor the test
    reads.

    That is a node with no buffer, no view source with a buffer, no INPUT flag, and either a ROPE / FLASH_ATTN_EXT
    op (those skip the weights test) or no source with a buffer (the weights test looks for a WEIGHTS buffer among
    the sources). Its slot keeps -1, as the call would leave it; a node or source outside the arena (weights, the
    KV cache, a scheduler's copy) is not decided here, and the call is made as before. About half of a llama
    graph's nodes (483 of SmolLM2's 936: the activations between the weights' ops) are decided here."""
    got = structs_in_arena(nodes)
    if got is None:
        ops = [node._w.item(_W_OP) for node in nodes]
        vss = [node._q.item(_Q_VIEW_SRC) for node in nodes]
        srcs = [node._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC].tolist() for node in nodes]
        return ops, vss, srcs, [False] * len(nodes)
    words, inside, arena, base = got
    w32 = words.view(np.int32)

    def no_buffer(ptrs):
        # NULL, or a struct inside the arena whose buffer word is 0 (one outside it counts as "has one": not decided)
        rel = ptrs.view(np.int64) - base
        ins = (rel >= 0) & (rel % 8 == 0) & (rel + C.GGML_TENSOR_SIZE <= arena.nbytes)
        buf = arena[np.where(ins, rel // 8 + _Q_BUFFER, 0)]
        return (ptrs == 0) | (ins & (buf == 0))

    op = w32[:, _W_OP]
    ops, vss = op.tolist(), words[:, _Q_VIEW_SRC].tolist()
    srcs = words[:, _Q_SRC:_Q_SRC + C.GGML_MAX_SRC].tolist()
    for k in np.flatnonzero(~inside).tolist():        # (a node whose struct is elsewhere: its own words)
        q = nodes[k]._q
        ops[k], vss[k] = nodes[k]._w.item(_W_OP), q.item(_Q_VIEW_SRC)
        srcs[k] = q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC].tolist()
    plain = (inside & (words[:, _Q_BUFFER] == 0) & no_buffer(words[:, _Q_VIEW_SRC])
             & ((w32[:, _W_FLAGS] & C.GGML_TENSOR_FLAG_INPUT) == 0))
    skips_weights = (op == C.GGML_OP_ROPE) | (op == C.GGML_OP_FLASH_ATTN_EXT)
    plain &= skips_weights | no_buffer(words[:, _Q_SRC:_Q_SRC + C.GGML_MAX_SRC]).all(axis=1)
    return ops, vss, srcs, plain.tolist()


def _assign_pass4(sched, nodes, hid, tbid, vss, srcs) -> None:
    """Pass 4 of backend_sched_split_graph: views take their source's backend, sources their consumer's, and a
    node still unassigned the first backend that supports it."""
    _pass(sched, "4", "views take their source's backend, sources their consumer's")
    slot = sched._slot
    for i, node in enumerate(nodes):
        h = hid[i]
        vs = vss[i]
        if vs and tbid[h] == -1:
            tbid[h] = _tbid(sched, tensor_at(vs))
            SET_CAUSE(sched, node, "4.vsrc", tbid[h])
        # (node->src[j] from the struct's words; hash_id(src) is the slot found before, for nearly every source)
        for a in srcs[i]:
            if not a:
                continue
            hs = slot.get(a)
            if hs is None:
                hs = _hash_id(sched, tensor_at(a))
            if tbid[hs] == -1:
                src = tensor_at(a)
                if src.view_src is not None:
                    # views are always on the same backend as the source
                    tbid[hs] = _tbid(sched, src.view_src)
                    SET_CAUSE(sched, src, "4.vsrc", tbid[hs])
                else:
                    tbid[hs] = tbid[h]
                    SET_CAUSE(sched, src, "4.cur", tbid[hs])
        # if the node is still unassigned, assign it to the first backend that supports it
        b = 0
        while b < sched.n_backends and tbid[h] == -1:
            backend_sched_set_if_supported(sched, node, b)
            b += 1
        if not (tbid[h] != -1):      # (the message is only formatted when it fails)
            GGML_ASSERT(False, f"GGML_ASSERT(*cur_backend_id != -1): no backend supports node "
                               f"{node.name!r} ({op_desc(node)})")


def _check_not_split_before(sched, graph) -> None:
    """Splitting rewrites node sources to the copies in ``sched->ctx``, which the next split frees: a graph split
    once must not be split again (C would read freed tensors; ggviz says so)."""
    old = {t.addr for t in sched.ctx.tensors()}
    if not old:
        return
    for node in graph.nodes:
        for a in node._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC]:
            if a and int(a) in old:
                raise GGMLError(f"ggml_backend_sched_split_graph: node {node.name!r} reads a tensor copy made when this "
                                f"graph was split before (its sources were rewritten to the copies of that split); "
                                f"build the graph again before allocating it again")


def _id_array(n: int) -> array.array:
    """``calloc(n, sizeof(int))`` for the scheduler's backend id arrays: a Python int array (not a list of n
    references: copied as bytes, never traversed by the cyclic collector)."""
    return array.array("i", bytes(4 * n))


def _ensure_len(ids, n: int) -> None:
    if len(ids) < n:
        ids.extend([0] * (n - len(ids)))


def _set_output(t: Tensor) -> None:
    # ggml_set_output: only the flag of this tensor (the copies are not views)
    t.flags = t.flags | C.GGML_TENSOR_FLAG_OUTPUT


def _get_split(sched, i_split: int) -> ggml_backend_sched_split:
    if i_split >= sched.splits_capacity:
        old_cap = sched.splits_capacity
        sched.splits_capacity = max(16, 2 * sched.splits_capacity)
        for _ in range(old_cap, sched.splits_capacity):
            sched.splits.append(ggml_backend_sched_split())
    return sched.splits[i_split]


def _emit_split(sched, i_split: int, split) -> None:
    if trace.active:
        trace.emit("sched.split", sched=id(sched), split=i_split, backend=_bname(sched, split.backend_id),
                   backend_id=split.backend_id, i_start=split.i_start, i_end=split.i_end,
                   inputs=[t.name for t in split.inputs])


class _PlanLater:
    """ggviz: what ``_make_plan`` reads of a split, kept when the split ends (copies of the per-graph tables, which
    the next reset clears in place; each node's source pointers; the leafs and splits part made at once), so that
    the plan's per-node dicts -- a third of a split's Python work -- are made only when a view reads them."""
    __slots__ = ("plan", "nodes", "srcs", "slot", "tbid", "causes", "node_split", "leafs", "leaf_bufts")

    def __init__(self, sched, graph):
        self.plan = _make_plan(sched, graph, with_nodes=False, with_leafs=False)
        self.nodes = list(graph.nodes)
        # the nodes' sources as the split left them: pass 5 rewrites a source that is copied into another backend
        # (and a graph split with copies is never split again); without copies, they are the build's, read later
        self.srcs = ([t._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC].tolist() for t in self.nodes]
                     if self.plan["n_inputs"] or self.plan["graph_inputs"] else None)
        self.slot = dict(sched._slot)
        self.tbid = list(sched.hv_tensor_backend_ids)
        self.causes = dict(sched.causes)
        self.node_split = []
        for k in range(sched.n_splits):
            s = sched.splits[k]
            self.node_split.extend([k] * (s.i_end - s.i_start))
        # each leaf's buffer type now (the allocation that follows gives the graph's inputs a buffer)
        self.leafs = list(graph.leafs)
        bufts = {}
        self.leaf_bufts = []
        for t in self.leafs:
            q = t._q
            vs = q.item(_Q_VIEW_SRC)
            a = tensor_at(vs)._q.item(_Q_BUFFER) if vs else q.item(_Q_BUFFER)
            n = bufts.get(a, bufts)
            if n is bufts:
                buf = B.buffer_at(a)
                n = bufts[a] = B.backend_buft_name(buf.buft) if buf is not None else None
            self.leaf_bufts.append(n)

    def make(self) -> dict:
        names, tbid, causes, node_split = self.plan["backends"], self.tbid, self.causes, self.node_split
        nodes = []
        srcs_at = self.srcs or [t._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC].tolist() for t in self.nodes]
        for i, (t, srcs) in enumerate(zip(self.nodes, srcs_at)):
            h = self.slot[t.addr]
            b = tbid[h]
            nodes.append(dict(index=i, name=t.name, op=op_desc(t), backend=names[b] if b >= 0 else None,
                              backend_id=b, cause=causes.get(h, ""),
                              split=node_split[i] if i < len(node_split) else None, view_op=is_view_op(t.op),
                              srcs=[tensor_at(a).name for a in srcs if a]))
        leafs = []
        for t, buft in zip(self.leafs, self.leaf_bufts):
            h = self.slot[t.addr]
            b = tbid[h]
            leafs.append(dict(name=t.name, backend=names[b] if b >= 0 else None, backend_id=b,
                              cause=causes.get(h, ""), buft=buft))
        plan = dict(self.plan)
        plan["nodes"] = nodes
        plan["leafs"] = leafs
        return {k: plan[k] for k in _PLAN_KEYS}


_PLAN_KEYS = ("backends", "bufts", "n_copies", "cur_copy", "n_splits", "nodes", "leafs", "splits", "n_inputs",
              "copies_per_backend", "graph_inputs")


def _make_plan(sched, graph, with_nodes: bool = True, with_leafs: bool = True) -> dict:
    """The split as plain data (for the visual layer): per node its backend and cause, per split its node range and
    inputs (with the copy each input got), per backend the number of copies made into it."""
    names = [B.backend_name(b) for b in sched.backends]
    tbid = sched.hv_tensor_backend_ids
    causes = sched.causes
    node_split = []
    for k in range(sched.n_splits):
        s = sched.splits[k]
        node_split.extend([k] * (s.i_end - s.i_start))
    nodes = []
    for i, t in enumerate(graph.nodes if with_nodes else ()):
        h = _hash_id(sched, t)
        b = tbid[h]
        nodes.append(dict(index=i, name=t.name, op=op_desc(t), backend=names[b] if b >= 0 else None, backend_id=b,
                          cause=causes.get(h, ""), split=node_split[i] if i < len(node_split) else None,
                          view_op=is_view_op(t.op), srcs=[s.name for _, s in A.srcs_of(t)]))
    leafs = []
    for t in graph.leafs if with_leafs else ():
        h = _hash_id(sched, t)
        b = tbid[h]
        buf = _buffer_of(t)
        leafs.append(dict(name=t.name, backend=names[b] if b >= 0 else None, backend_id=b, cause=causes.get(h, ""),
                          buft=B.backend_buft_name(buf.buft) if buf is not None else None))
    splits = []
    copies_per_backend = {n: 0 for n in names}
    for k in range(sched.n_splits):
        s = sched.splits[k]
        ins = []
        for t in s.inputs:
            h = _hash_id(sched, t)
            cpy = _tensor_id_copy(sched, h, s.backend_id, sched.cur_copy)
            ins.append(dict(name=t.name, backend=names[tbid[h]] if tbid[h] >= 0 else None,
                            copy=cpy.name if cpy is not None else None, nbytes=nbytes(t),
                            is_input=bool(t.flags & C.GGML_TENSOR_FLAG_INPUT)))
        copies_per_backend[names[s.backend_id]] += len(s.inputs) * sched.n_copies
        splits.append(dict(index=k, backend=names[s.backend_id], backend_id=s.backend_id, i_start=s.i_start,
                           i_end=s.i_end, n_nodes=s.i_end - s.i_start, inputs=ins))
    return dict(backends=names, bufts=[B.backend_buft_name(b) for b in sched.bufts], n_copies=sched.n_copies,
                cur_copy=sched.cur_copy, n_splits=sched.n_splits, nodes=nodes, leafs=leafs, splits=splits,
                n_inputs=sum(len(s["inputs"]) for s in splits), copies_per_backend=copies_per_backend,
                graph_inputs=[t.name for t in sched.graph_inputs])


def _fmt_size(size: int) -> str:
    if size >= 1024 * 1024:
        return f"{size // 1024 // 1024}M"
    return f"{size // 1024}K"


def backend_sched_print_assignments(sched, graph) -> str:
    """ggml_backend_sched_print_assignments (GGML_SCHED_DEBUG=1 / 2): the splits, and with 2 every node's backend,
    cause and sources. Returned as text (ggml prints it with GGML_LOG_DEBUG)."""
    out = []
    cur_split = 0
    for i in range(graph.n_nodes):
        if cur_split < sched.n_splits and i == sched.splits[cur_split].i_start:
            s = sched.splits[cur_split]
            line = f"\n## SPLIT #{cur_split}: {B.backend_name(sched.backends[s.backend_id])} # {s.n_inputs} inputs"
            if s.n_inputs:
                line += ": " + " ".join(f"[{t.name} ({_fmt_size(nbytes(t)):>5.5})]" for t in s.inputs)
            out.append(line + "\n")
            cur_split += 1
        node = graph.nodes[i]
        if is_view_op(node.op):
            continue
        if sched.debug > 1 or sched.debug == 0:
            tb = backend_sched_get_tensor_backend(sched, node)
            line = (f"node #{i:3d} ({op_desc(node)[:10]:>10.10}): {node.name[:20]:>20.20} ({_fmt_size(nbytes(node)):>5.5}) "
                    f"[{(B.backend_name(tb) if tb else 'NULL'):>5.5} {GET_CAUSE(sched, node):>8.8}] "
                    f"use={graph.use_count(node) if graph.use_counts is not None else 0},"
                    f"c={1 if node.flags & C.GGML_TENSOR_FLAG_COMPUTE else 0}:")
            for src in node.src:
                if src is None:
                    continue
                sb = backend_sched_get_tensor_backend(sched, src)
                line += (f" {src.name[:20]:>20.20} ({_fmt_size(nbytes(src)):>5.5}) "
                         f"[{(B.backend_name(sb) if sb else 'NULL'):>5.5} {GET_CAUSE(sched, src):>8.8}]")
            out.append(line + "\n")
    return "".join(out)


# ==================================================================================================
# allocation and compute
# ==================================================================================================

def _buft_of_id(sched, i: int):
    """sched->bufts[i]. A backend id of -1 (a leaf that no pass assigned: ggml leaves a leaf unassigned when the
    first node reading it is a view op) reads bufts[-1] in C, i.e. backends[GGML_SCHED_MAX_BACKENDS - 1]: NULL."""
    if i < 0:
        return sched.backends[GGML_SCHED_MAX_BACKENDS - 1] if sched.n_backends == GGML_SCHED_MAX_BACKENDS else None
    return sched.bufts[i]


def backend_sched_alloc_splits(sched) -> bool:
    backend_ids_changed = False
    g = sched.graph
    for i in range(g.n_nodes):
        if (sched.node_backend_ids[i] != sched.prev_node_backend_ids[i]
                and _buft_of_id(sched, sched.node_backend_ids[i]) is not _buft_of_id(sched, sched.prev_node_backend_ids[i])):
            backend_ids_changed = True
            break
    if not backend_ids_changed:
        for i in range(g.n_leafs):
            if (sched.leaf_backend_ids[i] != sched.prev_leaf_backend_ids[i]
                    and _buft_of_id(sched, sched.leaf_backend_ids[i]) is not _buft_of_id(sched, sched.prev_leaf_backend_ids[i])):
                backend_ids_changed = True
                break

    reserved = False
    # allocate graph
    if backend_ids_changed or not A.gallocr_alloc_graph(sched.galloc, g):
        if sched.debug:
            GGML_LOG("debug", f"ggml_backend_sched_alloc_splits: failed to allocate graph, reserving "
                     f"(backend_ids_changed = {int(backend_ids_changed)})")
        if sched.debug_realloc > 0:
            # we are interested only in situations where the graph was reallocated even though its size remained
            # the same [GGML_SCHED_DEBUG_REALLOC]
            unexpected = not backend_ids_changed and sched.debug_prev_graph_size == sched.debug_graph_size
            if unexpected or sched.debug_realloc > 1:
                raise GGMLError(f"ggml_backend_sched_alloc_splits: unexpected graph reallocation (graph size = "
                                f"{sched.debug_graph_size}, nodes = {g.n_nodes}, leafs = {g.n_leafs}), "
                                f"debug_realloc = {sched.debug_realloc}")
        # the re-allocation may cause the split inputs to be moved to a different address
        # synchronize without ggml_backend_sched_synchronize to avoid changing cur_copy
        for b in sched.backends:
            B.backend_synchronize(b)
        reserved = True
        ok = A.gallocr_reserve_n(sched.galloc, g, sched.node_backend_ids, sched.leaf_backend_ids)
        if not ok or not A.gallocr_alloc_graph(sched.galloc, g):
            GGML_LOG("error", "ggml_backend_sched_alloc_splits: failed to allocate graph"
                     + (f" ({last_log_error()})" if not ok and last_log_error() else ""))
            if trace.active:
                trace.emit("sched.alloc", sched=id(sched), ok=False, reserved=True,
                           backend_ids_changed=backend_ids_changed)
            return False
    if trace.active:
        trace.emit("sched.alloc", sched=id(sched), ok=True, reserved=reserved, backend_ids_changed=backend_ids_changed,
                   sizes={B.backend_name(sched.backends[i]): A.gallocr_get_buffer_size(sched.galloc, i)
                          for i in range(sched.n_backends)})
    return True


def backend_sched_compute_splits(sched) -> int:
    GGML_ASSERT(sched is not None, "sched")
    splits = sched.splits
    prev_ids_tensor = None
    ids = None
    used_ids: set = set()

    for split_id in range(sched.n_splits):
        split = splits[split_id]
        split_backend_id = split.backend_id
        split_backend = sched.backends[split_backend_id]
        event = sched.events[split_backend_id][sched.cur_copy] if sched.events else None
        t0 = time.perf_counter_ns() if trace.active else 0

        # copy the input tensors to the split backend
        for input_id in range(split.n_inputs):
            input_backend = backend_sched_get_tensor_backend(sched, split.inputs[input_id])
            inp = split.inputs[input_id]
            input_cpy = _tensor_copy(sched, inp, split_backend_id, sched.cur_copy)

            if inp.flags & C.GGML_TENSOR_FLAG_INPUT:
                # inputs from the user must be copied immediately to prevent the user overwriting the data before
                # the copy is done
                if event is not None:
                    B.backend_event_synchronize(event)
                else:
                    B.backend_synchronize(split_backend)
                B.backend_tensor_copy(inp, input_cpy)
            else:
                # wait for the split backend to finish using the input before overwriting it
                if event is not None:
                    B.backend_event_wait(split_backend, event)
                else:
                    B.backend_synchronize(split_backend)

                # when offloading MoE weights, we can reduce the amount of data copied by copying only the experts
                # that are used
                node = split.graph.nodes[0] if split.graph.n_nodes > 0 else None
                inp_buf = B.buffer_at(inp.buffer) if inp.buffer else None
                if (node is not None and inp_buf is not None
                        and B.backend_buffer_get_usage(inp_buf) == B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS
                        and B.backend_buffer_is_host(inp_buf)
                        and node.src[0] is input_cpy and node.op == C.GGML_OP_MUL_MAT_ID):
                    prev_ids_tensor, ids, used_ids = _copy_used_experts(
                        sched, split, input_id, inp, input_cpy, input_backend, split_backend, node, prev_ids_tensor,
                        ids, used_ids)
                else:
                    # try async copy, but if not possible, we can still use a sync copy without synchronizing the dst
                    # backend, since we handle the synchronization here with multiple copies and events
                    if (split_backend.iface.cpy_tensor_async is None
                            or not split_backend.iface.cpy_tensor_async(input_backend, split_backend, inp, input_cpy)):
                        B.backend_synchronize(input_backend)
                        if event is not None:
                            B.backend_event_synchronize(event)
                        else:
                            B.backend_synchronize(split_backend)
                        B.backend_tensor_copy(inp, input_cpy)
            if trace.active:
                trace.emit("sched.copy", sched=id(sched), phase="compute", split=split_id, input=inp.name,
                           copy=input_cpy.name, from_backend=B.backend_name(input_backend),
                           to_backend=B.backend_name(split_backend), nbytes=nbytes(inp))

        if sched.callback_eval is None:
            ec = B.backend_graph_compute_async(split_backend, split.graph)
            if trace.active:
                _emit_compute(sched, split_id, split, t0)
            if ec != C.GGML_STATUS_SUCCESS:
                return ec
        else:
            # similar to ggml_backend_compare_graph_backend
            j0 = 0
            n = split.graph.n_nodes
            stop = False
            while j0 < n:
                t = split.graph.nodes[j0]
                # check if the user needs data from this node
                need = sched.callback_eval(t, True, sched.callback_eval_user_data)
                j1 = j0
                # determine the range [j0, j1] of nodes that can be computed together
                while not need and j1 < n - 1:
                    j1 += 1
                    t = split.graph.nodes[j1]
                    need = sched.callback_eval(t, True, sched.callback_eval_user_data)
                gv = graph_view(split.graph, j0, j1 + 1)
                ec = B.backend_graph_compute_async(split_backend, gv)
                if ec != C.GGML_STATUS_SUCCESS:
                    return ec
                # TODO: pass backend to the callback, then the user can decide if they want to synchronize
                B.backend_synchronize(split_backend)
                if trace.active:
                    trace.emit("sched.eval", sched=id(sched), split=split_id, j0=split.i_start + j0,
                               j1=split.i_start + j1, name=t.name, need=bool(need))
                if need and not sched.callback_eval(t, False, sched.callback_eval_user_data):
                    # as in ggml: this split stops here, the next splits still run
                    stop = True
                    break
                j0 = j1 + 1
            if trace.active:
                _emit_compute(sched, split_id, split, t0)
                if stop:
                    trace.emit("sched.eval_stop", sched=id(sched), split=split_id, name=t.name)

        # record the event of this copy
        if split.n_inputs > 0:
            if event is not None:
                B.backend_event_record(event, split_backend)
    return C.GGML_STATUS_SUCCESS


def _emit_compute(sched, split_id, split, t0):
    trace.emit("sched.compute_split", sched=id(sched), split=split_id,
               backend=B.backend_name(sched.backends[split.backend_id]), i_start=split.i_start, i_end=split.i_end,
               n_inputs=split.n_inputs, t_start=t0, t_end=time.perf_counter_ns())


def _copy_used_experts(sched, split, input_id, inp, input_cpy, input_backend, split_backend, node, prev_ids_tensor,
                       ids, used_ids):
    """The MUL_MAT_ID branch of compute_splits: copy only the experts the ids select, grouped in ranges."""
    n_expert = int(inp.ne[2])
    expert_size = int(inp.nb[2])
    B.backend_synchronize(input_backend)
    # get the ids
    ids_tensor = node.src[2]
    ids_backend = split_backend
    # if the ids tensor is also an input of the split, it may not have been copied yet to the split backend
    # in that case, we use the original ids tensor
    for i in range(input_id + 1, split.n_inputs):
        if ids_tensor is _tensor_copy(sched, split.inputs[i], split.backend_id, sched.cur_copy):
            ids_tensor = split.inputs[i]
            ids_backend = backend_sched_get_tensor_backend(sched, split.inputs[i])
            break
    if ids_tensor is not prev_ids_tensor:
        raw = B.backend_tensor_get_async(ids_backend, ids_tensor, None, 0, nbytes(ids_tensor))
        B.backend_synchronize(ids_backend)
        ids = raw.view(np.int32)
        # find the used experts
        used_ids = set()
        for i1 in range(int(ids_tensor.ne[1])):
            for i0 in range(int(ids_tensor.ne[0])):
                id_ = int(ids[i1 * int(ids_tensor.nb[1]) // 4 + i0 * int(ids_tensor.nb[0]) // 4])
                GGML_ASSERT(0 <= id_ < n_expert, "id >= 0 && id < n_expert")
                used_ids.add(id_)
        prev_ids_tensor = ids_tensor

    def copy_experts(first_id, last_id):
        expert_offset = first_id * expert_size
        expert_size_copy = (last_id - first_id + 1) * expert_size
        padding = min(expert_size, 512)
        padding_end = padding if last_id < n_expert - 1 else 0
        # copy a bit extra at the to ensure there are no NaNs in the padding of the last expert
        B.backend_tensor_set_async(split_backend, input_cpy, B._bytes_at(inp.data + expert_offset,
                                                                         expert_size_copy + padding_end),
                                   expert_offset, expert_size_copy + padding_end)

    used = sorted(used_ids)
    first_id = last_id = used[0]
    for id_ in used[1:]:
        if id_ == last_id + 1:
            last_id = id_
            continue
        copy_experts(first_id, last_id)
        first_id = last_id = id_
    copy_experts(first_id, last_id)
    return prev_ids_tensor, ids, used_ids


# ==================================================================================================
# public API
# ==================================================================================================

def backend_sched_new(backends, bufts=None, n_backends: int | None = None, graph_size: int = C.GGML_DEFAULT_GRAPH_SIZE,
                      parallel: bool = False, op_offload: bool = True) -> ggml_backend_sched:
    """ggml_backend_sched_new(backends, bufts, n_backends, graph_size, parallel, op_offload): ``backends`` in priority
    order, the last one the CPU; ``bufts`` one buffer type per backend (None: each backend's default)."""
    backends = list(backends)
    if n_backends is None:
        n_backends = len(backends)
    GGML_ASSERT(n_backends > 0, "n_backends > 0")
    GGML_ASSERT(n_backends <= GGML_SCHED_MAX_BACKENDS, "n_backends <= GGML_SCHED_MAX_BACKENDS")
    GGML_ASSERT(B.backend_dev_type(B.backend_get_device(backends[n_backends - 1])) == B.GGML_BACKEND_DEVICE_TYPE_CPU,
                "the last backend of a scheduler must be the CPU")

    sched = ggml_backend_sched()
    env = os.environ.get("GGML_SCHED_DEBUG")
    sched.debug = int(env) if env else 0
    sched.debug_realloc = 0
    env = os.environ.get("GGML_SCHED_DEBUG_REALLOC")
    sched.debug_realloc = int(env) if env else sched.debug_realloc

    sched.n_backends = n_backends
    sched.n_copies = GGML_SCHED_MAX_COPIES if parallel else 1

    # initialize hash table
    # FIXME: needs to be size*2 to account for leafs (do it in graph_split instead)
    sched.hash_set = hash_set_new(graph_size)
    sched.hv_tensor_backend_ids = [-1] * sched.hash_set.size
    sched.hv_tensor_copies = [None] * (sched.hash_set.size * sched.n_backends * sched.n_copies)

    ggml_sched_max_splits = graph_size      # at most there is one split for each node in the graph
    nodes_size = graph_size + ggml_sched_max_splits * GGML_SCHED_MAX_SPLIT_INPUTS * 2
    # (int arrays, as C's: ~130,000 ids each for a 272-tensor model. As Python lists, every copy a saved graph takes
    # -- the graph cache's, per new shape -- was four lists of that many references, which the cyclic collector
    # then traversed: ~2 ms of the first decode step after a prompt)
    sched.node_backend_ids = _id_array(nodes_size)
    sched.leaf_backend_ids = _id_array(nodes_size)
    sched.prev_node_backend_ids = _id_array(nodes_size)
    sched.prev_leaf_backend_ids = _id_array(nodes_size)
    sched._ids_written = 0

    sched.debug_graph_size = 0
    sched.debug_prev_graph_size = 0

    sched.context_buffer_size = (ggml_sched_max_splits * GGML_SCHED_MAX_SPLIT_INPUTS * 2 * C.GGML_TENSOR_SIZE
                                 + graph_overhead_custom(graph_size, False))
    # (pages are only touched as the copies and their views are created)
    sched.context_buffer = memory.aligned_malloc(sched.context_buffer_size, "ggml_backend_sched context buffer")

    initial_splits_capacity = 16
    sched.splits = [ggml_backend_sched_split() for _ in range(initial_splits_capacity)]
    sched.splits_capacity = initial_splits_capacity

    sched.graph_inputs_capacity = GGML_SCHED_MAX_SPLIT_INPUTS
    sched.graph_inputs = []

    sched.backends = backends[:n_backends]
    sched.bufts = []
    sched.events = [[None] * GGML_SCHED_MAX_COPIES for _ in range(n_backends)]
    for b in range(n_backends):
        buft = bufts[b] if bufts is not None and bufts[b] is not None else B.backend_get_default_buffer_type(backends[b])
        sched.bufts.append(buft)
        GGML_ASSERT(B.backend_supports_buft(backends[b], buft),
                    f"backend {B.backend_name(backends[b])} does not support buffer type {B.backend_buft_name(buft)}")
        if sched.n_copies > 1:
            for c in range(sched.n_copies):
                sched.events[b][c] = B.backend_event_new(backends[b].device)

    sched.galloc = A.gallocr_new_n(sched.bufts, n_backends)
    sched.op_offload = bool(op_offload)

    backend_sched_reset(sched)
    if trace.active:
        trace.emit("sched.new", sched=id(sched), backends=[B.backend_name(b) for b in sched.backends],
                   bufts=[B.backend_buft_name(b) for b in sched.bufts], n_copies=sched.n_copies,
                   graph_size=graph_size, hash_size=sched.hash_set.size, op_offload=sched.op_offload)
    return sched


def backend_sched_free(sched) -> None:
    if sched is None:
        return
    for b in range(sched.n_backends):
        for c in range(sched.n_copies):
            B.backend_event_free(sched.events[b][c])
    A.gallocr_free(sched.galloc)
    if sched.ctx is not None:
        ggml_free(sched.ctx)
        sched.ctx = None
    sched.splits = []
    sched.graph_inputs = []
    if sched.context_buffer is not None:
        memory.unregister(sched.context_buffer)
        sched.context_buffer = None
    for buf in sched._spare_buffers:
        memory.unregister(buf)
    sched._spare_buffers = []


def backend_sched_reset(sched) -> None:
    GGML_ASSERT(sched is not None, "sched")
    # reset state for the next run
    if not sched.is_reset:
        sched.hash_set.reset()
        sched._slot.clear()
        sched.causes.clear()
        n = sched.hash_set.size
        sched.hv_tensor_backend_ids[:] = [-1] * n
        sched.hv_tensor_copies[:] = [None] * (n * sched.n_backends * sched.n_copies)
        sched.is_reset = True
    sched.is_alloc = False


# ==================================================================================================
# ggviz: several allocated graphs on one scheduler (llama's graph cache)
# ==================================================================================================

_GRAPH_STATE_FIELDS = ("hash_set", "_slot", "causes", "hv_tensor_backend_ids", "hv_tensor_copies", "splits",
                       "n_splits", "splits_capacity", "graph", "graph_inputs", "n_graph_inputs", "ctx",
                       "context_buffer", "_last_plan", "cur_copy", "debug_graph_size", "debug_prev_graph_size")


class backend_sched_graph_state:
    """ggviz: everything ``backend_sched_alloc_graph`` left in the scheduler for one graph
    -- the hash set with the backend id, cause and copies of every tensor, the splits (with their graph views, and
    so the compiled programs cached on them), the graph copy with its inputs, the context holding the input copies,
    the node/leaf backend ids, the allocator's plan (``gallocr_plan``) -- taken out by ``backend_sched_save_graph``
    and put back by ``backend_sched_restore_graph``. ggml's scheduler holds one graph; llama.cpp reuses only the
    last one (``llm_graph_result::can_reuse``); ggviz keeps a few, so that going back to a graph shape seen before
    costs no build, split or allocation, and the scheduler and allocator then describe the graph that really runs."""
    __slots__ = _GRAPH_STATE_FIELDS + ("sched", "node_backend_ids", "leaf_backend_ids", "prev_node_backend_ids",
                                       "prev_leaf_backend_ids", "ids_lens", "plan", "uid")


def backend_sched_save_graph(sched) -> backend_sched_graph_state:
    """Take the allocated graph's state out of the scheduler, which is left as ``backend_sched_reset`` leaves it
    (the next graph is split and allocated from scratch, against the same previous backend ids and allocator plan
    as without the save)."""
    GGML_ASSERT(sched is not None, "sched")
    GGML_ASSERT(sched.is_alloc, "backend_sched_save_graph: no allocated graph to save")
    st = backend_sched_graph_state()
    st.sched = sched
    for f in _GRAPH_STATE_FIELDS:
        setattr(st, f, getattr(sched, f))
    st.uid = sched.graph.uid
    # the backend id arrays stay with the scheduler (the next split compares against them): the state takes copies
    # of the entries any split wrote (the rest are zeros, and their lengths: restore puts the same arrays back).
    # Whole copies were four new ~530 KB arrays per saved graph, ~130 page faults each: ~1.6 of the ~1.8 ms that
    # keeping the prompt's graph took the first decode step after a 128-token prompt (SmolLM2, n_ctx 512)
    fields = ("node_backend_ids", "leaf_backend_ids", "prev_node_backend_ids", "prev_leaf_backend_ids")
    n = sched._ids_written
    for f in fields:
        setattr(st, f, getattr(sched, f)[:n])
    st.ids_lens = tuple(len(getattr(sched, f)) for f in fields)
    st.plan = A.gallocr_save_plan(sched.galloc)
    # the scheduler gets fresh per-graph containers (what reset would have cleared in place)
    hs = st.hash_set
    sched.hash_set = HashSet(hs.size, np.zeros_like(hs.used), np.zeros_like(hs.keys))
    sched._slot = {}
    sched.causes = {}
    sched.hv_tensor_backend_ids = [-1] * hs.size
    sched.hv_tensor_copies = [None] * (hs.size * sched.n_backends * sched.n_copies)
    sched.splits = [ggml_backend_sched_split() for _ in range(st.splits_capacity)]
    sched.n_splits = 0
    sched.graph = CGraph(None, 0, _view=True)
    sched.graph.size = st.graph.size
    sched.graph_inputs = []
    sched.n_graph_inputs = 0
    sched.ctx = None
    sched.context_buffer = (sched._spare_buffers.pop() if sched._spare_buffers else
                            memory.aligned_malloc(sched.context_buffer_size, "ggml_backend_sched context buffer"))
    sched.last_plan = None
    sched.is_reset = True
    sched.is_alloc = False
    if trace.active:
        trace.emit("sched.save_graph", sched=id(sched), uid=st.uid, n_splits=st.n_splits,
                   n_nodes=st.graph.n_nodes)
    return st


def backend_sched_restore_graph(sched, st: backend_sched_graph_state) -> bool:
    """Put a saved graph back: the scheduler is then as right after ``backend_sched_alloc_graph`` of that graph
    (splits, copies, backend ids, allocator plan), and its tensors still hold their places in the compute buffers.
    False (nothing changed) if the state cannot be used: another scheduler's, or the compute buffers were
    reallocated since it was saved. The state is spent either way (free it if False). Whatever graph the scheduler
    held before is dropped: save it first to keep it."""
    GGML_ASSERT(sched is not None, "sched")
    if st.sched is not sched or not A.gallocr_plan_valid(sched.galloc, st.plan):
        return False
    backend_sched_synchronize(sched)
    if sched.ctx is not None:
        ggml_free(sched.ctx)
    _spare(sched, sched.context_buffer)
    for f in _GRAPH_STATE_FIELDS:
        setattr(sched, f, getattr(st, f))
    # the saved entries, zeros after them, the saved lengths: the arrays as they were at the save (written in place)
    written = sched._ids_written
    for f, n_all in zip(("node_backend_ids", "leaf_backend_ids", "prev_node_backend_ids", "prev_leaf_backend_ids"),
                        st.ids_lens):
        ids, saved = getattr(sched, f), getattr(st, f)
        n = len(saved)
        ids[:n] = saved
        if len(ids) > n_all:
            del ids[n_all:]
        elif len(ids) < n_all:
            ids.extend(array.array("i", bytes(4 * (n_all - len(ids)))))
        end = min(written, n_all)
        if end > n:
            ids[n:end] = array.array("i", bytes(4 * (end - n)))
    A.gallocr_restore_plan(sched.galloc, st.plan)
    sched.is_reset = False
    sched.is_alloc = True
    st.ctx = st.context_buffer = st.sched = None
    if trace.active:
        trace.emit("sched.restore_graph", sched=id(sched), uid=st.uid, n_splits=sched.n_splits,
                   n_nodes=sched.graph.n_nodes,
                   sizes={B.backend_name(sched.backends[i]): A.gallocr_get_buffer_size(sched.galloc, i)
                          for i in range(sched.n_backends)})
    return True


def backend_sched_free_graph_state(sched, st: backend_sched_graph_state) -> None:
    """Free a saved graph state that will not be restored (its copies' context; its buffer is kept for reuse)."""
    if st.ctx is not None:
        ggml_free(st.ctx)
        st.ctx = None
    if st.context_buffer is not None and sched is not None:
        _spare(sched, st.context_buffer)
    st.context_buffer = st.sched = None


def _spare(sched, buf) -> None:
    if buf is None:
        return
    if len(sched._spare_buffers) < 1 and sched.context_buffer_size == buf.nbytes:
        sched._spare_buffers.append(buf)
    else:
        memory.unregister(buf)


def backend_sched_reserve_size(sched, measure_graph, sizes=None) -> list:
    """The buffer size per backend that reserving ``measure_graph`` would allocate (nothing is allocated)."""
    GGML_ASSERT(sched is not None, "sched")
    GGML_ASSERT(sched.hash_set.size >= measure_graph.n_nodes + measure_graph.n_leafs, "hash_set.size")
    backend_sched_reset(sched)
    backend_sched_synchronize(sched)
    backend_sched_split_graph(sched, measure_graph)
    return A.gallocr_reserve_n_size(sched.galloc, sched.graph, sched.node_backend_ids, sched.leaf_backend_ids, sizes)


def backend_sched_reserve(sched, measure_graph) -> bool:
    GGML_ASSERT(sched is not None, "sched")
    GGML_ASSERT(sched.hash_set.size >= measure_graph.n_nodes + measure_graph.n_leafs, "hash_set.size")
    backend_sched_synchronize(sched)
    backend_sched_split_graph(sched, measure_graph)
    if not A.gallocr_reserve_n(sched.galloc, sched.graph, sched.node_backend_ids, sched.leaf_backend_ids):
        return False
    backend_sched_reset(sched)
    return True


class backend_sched_reserve_state:
    """ggviz: what ``backend_sched_reserve`` of one graph left for the allocator -- its plan (``gallocr_plan``) and
    the backend ids of the split graph's nodes and leafs it was made for -- so that reserving the same graph again
    (llama_context::sched_reserve reserves its prompt graph twice) can put the plan back
    (``backend_sched_reserve_again``) instead of planning again."""
    __slots__ = ("plan", "node_backend_ids", "leaf_backend_ids")


def backend_sched_save_reserve(sched) -> backend_sched_reserve_state:
    """Right after ``backend_sched_reserve``: keep its plan (see ``backend_sched_reserve_state``)."""
    st = backend_sched_reserve_state()
    g = sched.graph
    st.node_backend_ids = sched.node_backend_ids[:g.n_nodes]
    st.leaf_backend_ids = sched.leaf_backend_ids[:g.n_leafs]
    st.plan = A.gallocr_save_plan(sched.galloc)
    return st


def backend_sched_reserve_again(sched, measure_graph, st: backend_sched_reserve_state) -> bool:
    """ggviz: ``backend_sched_reserve`` of a graph this scheduler reserved before (``st``: saved right after that
    reserve). The graph is split as in ggml; the allocator's plan is the saved one put back, not made again: the
    plan is a function of the split graph and its backend ids alone (the dynamic allocators start empty at every
    reserve), so when those ids are the same and the buffers were not reallocated since (no larger chunk), planning
    again would give the same node and leaf placements, the same chunk sizes and no reallocation -- about a fifth of
    a first context's work in Python, for nothing. With a trace listener, or when anything differs, it is the real
    reserve (the listener sees every pass). The state is spent either way."""
    GGML_ASSERT(sched is not None, "sched")
    if trace.active or st.plan is None or not A.gallocr_plan_valid(sched.galloc, st.plan):
        return backend_sched_reserve(sched, measure_graph)
    GGML_ASSERT(sched.hash_set.size >= measure_graph.n_nodes + measure_graph.n_leafs, "hash_set.size")
    backend_sched_synchronize(sched)
    backend_sched_split_graph(sched, measure_graph)
    g = sched.graph
    if (g.n_nodes != st.plan.n_nodes or g.n_leafs != st.plan.n_leafs
            or sched.node_backend_ids[:g.n_nodes] != st.node_backend_ids
            or sched.leaf_backend_ids[:g.n_leafs] != st.leaf_backend_ids):
        ok = A.gallocr_reserve_n(sched.galloc, g, sched.node_backend_ids, sched.leaf_backend_ids)
    else:
        A.gallocr_restore_plan(sched.galloc, st.plan)
        # what gallocr_reserve_n's record says of a plan that fits the buffers as they are: nothing reallocated
        A.gallocr_last_alloc_update(sched.galloc, reallocated=[])
        ok = True
    st.plan = None
    if not ok:
        return False
    backend_sched_reset(sched)
    return True


def backend_sched_alloc_graph(sched, graph) -> bool:
    GGML_ASSERT(sched is not None, "sched")
    GGML_ASSERT(sched.hash_set.size >= graph.n_nodes + graph.n_leafs,
                f"hash_set.size ({sched.hash_set.size}) >= n_nodes + n_leafs ({graph.n_nodes + graph.n_leafs}): "
                f"graph_size of the scheduler too small")
    GGML_ASSERT(not sched.is_alloc, "!sched->is_alloc (reset the scheduler before allocating another graph)")
    sched.cur_copy = sched.next_copy
    sched.next_copy = (sched.next_copy + 1) % sched.n_copies
    backend_sched_split_graph(sched, graph)
    if not backend_sched_alloc_splits(sched):
        return False
    sched.is_alloc = True
    return True


def backend_sched_graph_compute(sched, graph) -> int:
    err = backend_sched_graph_compute_async(sched, graph)
    backend_sched_synchronize(sched)
    return err


def backend_sched_graph_compute_async(sched, graph) -> int:
    GGML_ASSERT(sched is not None, "sched")
    if not sched.is_reset and not sched.is_alloc:
        backend_sched_reset(sched)
    if not sched.is_alloc:
        if not backend_sched_alloc_graph(sched, graph):
            return C.GGML_STATUS_ALLOC_FAILED
    return backend_sched_compute_splits(sched)


def backend_sched_synchronize(sched) -> None:
    GGML_ASSERT(sched is not None, "sched")
    for b in sched.backends:
        B.backend_synchronize(b)
    if not sched.is_alloc:
        # if the graph is not already allocated, always use copy 0 after a synchronization
        # this ensures that during generation the same copy is used every time,
        # which avoids changes in the graph that could cause CUDA or other graphs to be disabled
        sched.next_copy = 0


def backend_sched_set_eval_callback(sched, callback, user_data=None) -> None:
    """``callback(t, ask, user_data) -> bool``: asked (``ask`` True) for every node whether the user wants its data;
    the nodes up to the first wanted one are computed, then it is called again (``ask`` False) with the data ready;
    returning False stops."""
    GGML_ASSERT(sched is not None, "sched")
    sched.callback_eval = callback
    sched.callback_eval_user_data = user_data


def backend_sched_get_n_splits(sched) -> int:
    GGML_ASSERT(sched is not None, "sched")
    return sched.n_splits


def backend_sched_get_n_copies(sched) -> int:
    GGML_ASSERT(sched is not None, "sched")
    return sched.n_copies


def backend_sched_get_n_backends(sched) -> int:
    GGML_ASSERT(sched is not None, "sched")
    return sched.n_backends


def backend_sched_get_backend(sched, i: int):
    GGML_ASSERT(sched is not None, "sched")
    GGML_ASSERT(0 <= i < sched.n_backends, "i >= 0 && i < sched->n_backends")
    return sched.backends[i]


def backend_sched_get_buffer_type(sched, backend):
    GGML_ASSERT(sched is not None, "sched")
    backend_index = backend_sched_backend_id(sched, backend)
    GGML_ASSERT(0 <= backend_index < sched.n_backends, "backend not in the scheduler")
    return sched.bufts[backend_index]


def backend_sched_get_buffer_size(sched, backend) -> int:
    GGML_ASSERT(sched is not None, "sched")
    backend_index = backend_sched_backend_id(sched, backend)
    GGML_ASSERT(0 <= backend_index < sched.n_backends, "backend not in the scheduler")
    return A.gallocr_get_buffer_size(sched.galloc, backend_index)


def backend_sched_set_tensor_backend(sched, node: Tensor, backend) -> None:
    GGML_ASSERT(sched is not None, "sched")
    backend_index = backend_sched_backend_id(sched, backend)
    GGML_ASSERT(0 <= backend_index < sched.n_backends, "backend not in the scheduler")
    _set_tbid(sched, node, backend_index)
    sched._pass = "usr"
    SET_CAUSE(sched, node, "usr", backend_index)
    sched._pass = ""
    sched.is_reset = False


def backend_sched_get_tensor_backend(sched, node: Tensor):
    GGML_ASSERT(sched is not None, "sched")
    backend_index = _tbid(sched, node)
    if backend_index == -1:
        return None
    return sched.backends[backend_index]
