"""A ``ggml_cgraph`` as plain data: what ``ggml_graph_print`` and ``ggml_graph_dump_dot`` (ggml.c) read of a graph
-- every node's and leaf's name, op (with its op_params: a UNARY or GLU node's function), type, ne, nb, sources,
view source, flags, data pointer -- so the views that draw a graph (``graph_dot``, ``GraphView``, ``DecodeStepper``)
draw it from a record saved to disk, with no ``ggml_cgraph`` alive.

``capture_graph(gf)`` records a graph into a ``GraphRecord``; ``GraphRecord.cgraph()`` gives back a ``RecordedGraph``
that reads like the cgraph (``nodes``, ``leafs``, ``n_nodes``, ``n_leafs``; tensors with the struct's field names),
so the drawing code reads a record and a live graph the same way (tests/test_capture.py checks that the pictures of
both are the same bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ggml import consts as C


@dataclass
class GraphRecord:
    """A cgraph's tensors as columns, one row per tensor: the nodes (``gf->nodes`` order), then the leafs
    (``gf->leafs`` order), then the tensors outside the graph that a node or leaf points at (a source, a view
    source: e.g. a tensor of another graph); of those only the fields are kept, not their own pointers.

    ``names`` (list of str); ``ops``, ``types``, ``flags`` (int32); ``op_params`` (int32, rows x 16: the struct's
    ``op_params``); ``ne``, ``nb`` (int64, rows x 4); ``src`` (int32, rows x ``GGML_MAX_SRC``: the row of each
    source slot, -1 for NULL); ``view_src`` (int32: the row, or -1); ``view_offs`` (int64); ``addrs``, ``data``
    (uint64: the struct's address, the identity the eval callback and the trace events name a tensor by, and its
    data pointer, 0 when not allocated)."""
    n_nodes: int
    n_leafs: int
    names: list
    ops: np.ndarray
    op_params: np.ndarray
    types: np.ndarray
    flags: np.ndarray
    ne: np.ndarray
    nb: np.ndarray
    src: np.ndarray
    view_src: np.ndarray
    view_offs: np.ndarray
    addrs: np.ndarray
    data: np.ndarray

    def cgraph(self) -> RecordedGraph:
        """The record as a graph the drawing code reads like a ``ggml_cgraph``."""
        return RecordedGraph(self)


class RecordedTensor:
    """One row of a ``GraphRecord``, read like a ``ggml_tensor`` (the C field names; ``src`` holds
    ``GGML_MAX_SRC`` slots, None for NULL)."""
    __slots__ = ("name", "op", "op_params", "type", "flags", "ne", "nb", "src", "view_src", "view_offs", "addr",
                 "data")

    @property
    def shape(self) -> tuple:
        return tuple(self.ne.tolist())

    @property
    def strides(self) -> tuple:
        return tuple(self.nb.tolist())

    def __repr__(self):
        return f"<RecordedTensor {self.name!r}>"


class RecordedGraph:
    """A ``GraphRecord`` read like a ``ggml_cgraph``: ``nodes`` / ``leafs`` lists of ``RecordedTensor``."""

    def __init__(self, rec: GraphRecord):
        ts = []
        for k, name in enumerate(rec.names):
            t = RecordedTensor()
            t.name, t.op, t.type, t.flags = name, int(rec.ops[k]), int(rec.types[k]), int(rec.flags[k])
            t.op_params, t.ne, t.nb = rec.op_params[k], rec.ne[k], rec.nb[k]
            t.view_offs, t.addr, t.data = int(rec.view_offs[k]), int(rec.addrs[k]), int(rec.data[k])
            ts.append(t)
        for k, t in enumerate(ts):
            t.src = [ts[j] if j >= 0 else None for j in rec.src[k].tolist()]
            t.view_src = ts[rec.view_src[k]] if rec.view_src[k] >= 0 else None
        self.record = rec
        self.nodes = ts[:rec.n_nodes]
        self.leafs = ts[rec.n_nodes:rec.n_nodes + rec.n_leafs]

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def __repr__(self):
        return f"<RecordedGraph n_nodes={self.n_nodes} n_leafs={self.n_leafs}>"


def capture_graph(gf) -> GraphRecord:
    """Record the cgraph ``gf`` (its nodes, its leafs and the tensors outside it they point at)."""
    if isinstance(gf, RecordedGraph):
        return gf.record
    rows = list(gf.nodes) + list(gf.leafs)
    row = {t.addr: k for k, t in enumerate(rows)}
    for t in list(rows):                      # the tensors outside the graph that its tensors point at
        for s in list(t.src) + [t.view_src]:
            if s is not None and s.addr not in row:
                row[s.addr] = len(rows)
                rows.append(s)
    n_in = gf.n_nodes + gf.n_leafs

    def ref(s, k):
        return -1 if s is None or k >= n_in else row[s.addr]  # an outside tensor's own pointers are not followed

    return GraphRecord(
        n_nodes=gf.n_nodes, n_leafs=gf.n_leafs, names=[t.name for t in rows],
        ops=np.array([t.op for t in rows], dtype=np.int32),
        op_params=np.array([np.asarray(t.op_params) for t in rows], dtype=np.int32).reshape(len(rows), -1),
        types=np.array([t.type for t in rows], dtype=np.int32),
        flags=np.array([t.flags for t in rows], dtype=np.int32),
        ne=np.array([t.shape for t in rows], dtype=np.int64).reshape(len(rows), 4),
        nb=np.array([t.strides for t in rows], dtype=np.int64).reshape(len(rows), 4),
        src=np.array([[ref(s, k) for s in t.src] for k, t in enumerate(rows)], dtype=np.int32
                     ).reshape(len(rows), C.GGML_MAX_SRC),
        view_src=np.array([ref(t.view_src, k) for k, t in enumerate(rows)], dtype=np.int32),
        view_offs=np.array([t.view_offs for t in rows], dtype=np.int64),
        addrs=np.array([t.addr for t in rows], dtype=np.uint64),
        data=np.array([t.data or 0 for t in rows], dtype=np.uint64))


def as_cgraph(gf):
    """``gf`` if it is a graph (a ``ggml_cgraph`` or a ``RecordedGraph``); a ``GraphRecord`` read as one."""
    return gf.cgraph() if isinstance(gf, GraphRecord) else gf
