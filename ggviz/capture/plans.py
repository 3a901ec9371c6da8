"""The scheduler's and the allocator's plans of one graph, as plain records (what ``SchedulerView`` and
``AllocatorView`` draw): ``ggml_backend_sched_split_graph``'s passes, causes, splits and copies (``SchedRecord``,
replayed from the ``sched.*`` trace events) and ``ggml_gallocr``'s per-tensor offsets, sizes, buffers, frees and
in-place reuses (``AllocRecord``, from ``galloc.last_alloc``).

Both records hold numbers, strings, lists and dicts only (``records.save`` writes them, JSON-able as they are), and
everything the views read of the graph (node names, ops, which nodes are views, each view's source) is copied in
while the graph's tensors are alive, so a record drawn after the context is gone -- or loaded from disk -- draws the
same picture.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import trace
from ..ggml import alloc as A
from ..ggml import backend as B
from ..ggml import consts as C
from ..ggml import impl
from ..ggml import sched as S
from ..ggml.cpu import mul_mat
from ..ggml.sched import is_view_op
from ..ggml.tensor import op_desc

# the trace events a scheduler's split is replayed from
SCHED_KINDS = ("sched.pass", "sched.assign", "sched.split", "sched.copy")
# the passes of ggml_backend_sched_split_graph, in order ("usr": the pins set before pass 1)
STAGES = ["usr", "1", "2.1", "2.2", "2.3", "2.4", "3", "4", "5"]


@dataclass
class SchedRecord:
    """One ``ggml_backend_sched_split_graph``, pass by pass.

    ``backends`` / ``bufts``: the scheduler's backend and buffer-type names (a backend id indexes both);
    ``node_names``, ``node_ops`` (``op_desc``), ``view_op``: the graph's nodes in order; ``leaf_names``;
    ``snapshots``: {pass: {backend, cause, leaf_backend, leaf_cause}} -- every node's and leaf's backend id (-1:
    none) and cause as that pass ended; ``events_by_stage``: {pass: [{index, name, backend, cause, leaf}]} the
    assignments each pass made, in order; ``splits``: pass 5's splits [{index, backend, backend_id, i_start, i_end,
    n_nodes, inputs: [{name, copy, copies, from_backend, nbytes, consumer}]}]; ``kernels``: per node, the kernel a
    MUL_MAT runs on its final backend ("" otherwise); ``mul_mats``: the MUL_MAT nodes' indices; ``graph_inputs``:
    names with cause "1.inp"; ``which`` / ``n_recorded`` / ``is_last``: which split of the scheduler's recording;
    ``reused``: the recorded step split nothing (llama.cpp reused its graph, same shapes: no new split) and this
    is the split it computed with, made by the decode before it."""
    backends: list
    bufts: list
    n_nodes: int
    node_names: list
    node_ops: list
    view_op: list
    leaf_names: list
    snapshots: dict
    events_by_stage: dict
    splits: list
    kernels: list
    mul_mats: list
    graph_inputs: list
    which: int
    n_recorded: int
    is_last: bool
    reused: bool = False


def _splits_from(split_evs, copy_evs) -> list[dict]:
    """Pass 5's splits from their ``sched.split`` events, each input with the copies made of it (``sched.copy``:
    one per copy slot, ``n_copies`` > 1 for pipeline parallelism)."""
    copies: dict = {}
    for c in copy_evs:
        copies.setdefault((c["split"], c["input"]), []).append(c)
    splits = []
    for e in split_evs:
        ins = []
        for name in e["inputs"]:
            cs = copies.get((e["split"], name), [])
            ins.append(dict(name=name, copy=cs[0]["copy"] if cs else None, copies=[c["copy"] for c in cs],
                            from_backend=cs[0]["from_backend"] if cs else None,
                            nbytes=cs[0]["nbytes"] if cs else None,
                            consumer=cs[0]["node"] if cs else None))
        splits.append(dict(index=e["split"], backend=e["backend"], backend_id=e["backend_id"],
                           i_start=e["i_start"], i_end=e["i_end"], n_nodes=e["i_end"] - e["i_start"],
                           inputs=ins))
    return splits


def _split_window(events, sched, which: int):
    """The recorded events of split ``which`` of ``sched`` (a recording may hold several: one per
    ``ggml_backend_sched_split_graph``), with the "usr" pins made just before it; and (which, n_recorded, is_last)."""
    evs = events.events if hasattr(events, "events") else list(events)
    sid = id(sched)
    mine = [e for e in evs if e.get("sched") == sid and e["kind"] in SCHED_KINDS
            and not (e["kind"] == "sched.copy" and e.get("phase") != "split")]
    starts = [k for k, e in enumerate(mine) if e["kind"] == "sched.pass" and e["pass"] == "1"]
    if not starts:
        raise ValueError("no sched.pass event of this scheduler recorded: record the split with "
                         "ggviz.trace.recording(SchedulerView.KINDS) (or use SchedulerView.capture)")
    which = which if which >= 0 else len(starts) + which
    s = starts[which]
    e_end = starts[which + 1] if which + 1 < len(starts) else len(mine)
    # the user's pins for this split: "usr" assignments after the previous split's last event
    prev_end = 0
    for k in range(s - 1, -1, -1):
        e = mine[k]
        if not (e["kind"] == "sched.assign" and e.get("pass") == "usr"):
            prev_end = k + 1
            break
    return mine[prev_end:s] + mine[s:e_end], (which, len(starts), which == len(starts) - 1)


def _replay(window: list, node_ix: dict, leaf_ix: dict, n_nodes: int, n_leafs: int):
    """Replay the assign events in order: the snapshots (every node's and leaf's backend and cause as each pass
    ended: what SET_CAUSE had written by then), the assignments each pass made, pass 5's splits."""
    nb, nc = [-1] * n_nodes, [""] * n_nodes
    lb, lc = [-1] * n_leafs, [""] * n_leafs
    snapshots: dict[str, dict] = {}
    events_by_stage: dict[str, list] = {st: [] for st in STAGES}
    split_evs, copy_evs = [], []
    cur = "usr"

    def snap(stage):
        snapshots[stage] = dict(backend=list(nb), cause=list(nc), leaf_backend=list(lb), leaf_cause=list(lc))

    for e in window:
        k = e["kind"]
        if k == "sched.pass":
            snap(cur)
            cur = e["pass"]
        elif k == "sched.assign":
            st = e.get("pass") or cur
            bid = e["backend_id"] if e["backend_id"] is not None else -1
            i = node_ix.get(e["addr"])
            if i is not None:
                nb[i], nc[i] = bid, e["cause"]
                events_by_stage.setdefault(st, []).append(dict(index=i, name=e["name"], backend=e["backend"],
                                                               cause=e["cause"], leaf=False))
            else:
                j = leaf_ix.get(e["addr"])
                if j is not None:
                    lb[j], lc[j] = bid, e["cause"]
                    events_by_stage.setdefault(st, []).append(dict(index=j, name=e["name"], backend=e["backend"],
                                                                   cause=e["cause"], leaf=True))
        elif k == "sched.split":
            split_evs.append(e)
        elif k == "sched.copy":
            copy_evs.append(e)
    snap(cur)
    for st in STAGES:                          # a pass that did not run (cannot happen in ggml) keeps the last
        if st not in snapshots:
            prev = STAGES[STAGES.index(st) - 1] if st != "usr" else None
            snapshots[st] = snapshots[prev] if prev else dict(
                backend=[-1] * n_nodes, cause=[""] * n_nodes, leaf_backend=[-1] * n_leafs, leaf_cause=[""] * n_leafs)
    return snapshots, events_by_stage, _splits_from(split_evs, copy_evs)


def _kernel_on(node, backend: str | None) -> str:
    if backend == "BLAS":
        return mul_mat.KERNEL_BLAS + " (opt-in: GGML_BLAS build)"
    if backend == "CPU":
        return mul_mat.cpu_kernel(node)
    return ""


def capture_sched(sched, graph, events, which: int = -1) -> SchedRecord:
    """The ``SchedRecord`` of split ``which`` (-1: the last) of ``sched`` in ``events`` (a ``trace.Recorder`` or its
    events, holding ``SCHED_KINDS`` recorded while ``graph`` was split, pins included)."""
    backends = [B.backend_name(b) for b in sched.backends]
    nodes, leafs = list(graph.nodes), list(graph.leafs)
    window, (which, n_recorded, is_last) = _split_window(events, sched, which)
    snapshots, by_stage, splits = _replay(window, {t.addr: i for i, t in enumerate(nodes)},
                                          {t.addr: i for i, t in enumerate(leafs)}, len(nodes), len(leafs))
    fin = snapshots["5"]
    # each MUL_MAT's kernel on its final backend, decided now, while the graph's tensors are alive
    mul_mats = [i for i, t in enumerate(nodes) if t.op == C.GGML_OP_MUL_MAT]
    kernels = [""] * len(nodes)
    for i in mul_mats:
        b = fin["backend"][i]
        kernels[i] = _kernel_on(nodes[i], backends[b] if 0 <= b < len(backends) else None)
    node_names, leaf_names = [t.name for t in nodes], [t.name for t in leafs]
    graph_inputs = sorted({leaf_names[j] for j, c in enumerate(fin["leaf_cause"]) if c == "1.inp"}
                          | {node_names[i] for i, c in enumerate(fin["cause"]) if c == "1.inp"})
    return SchedRecord(backends=backends, bufts=[B.backend_buft_name(b) for b in sched.bufts], n_nodes=len(nodes),
                       node_names=node_names, node_ops=[op_desc(t) for t in nodes],
                       view_op=[bool(is_view_op(t.op)) for t in nodes], leaf_names=leaf_names, snapshots=snapshots,
                       events_by_stage=by_stage, splits=splits, kernels=kernels, mul_mats=mul_mats,
                       graph_inputs=graph_inputs, which=which, n_recorded=n_recorded, is_last=is_last)


def record_sched_split(sched, graph, setup=None, which: int = -1) -> SchedRecord:
    """Run ``ggml_backend_sched_alloc_graph(sched, graph)`` under a trace recording (``setup()`` first, inside it:
    e.g. ``backend_sched_set_tensor_backend`` pins) and return its ``SchedRecord``."""
    with trace.recording(SCHED_KINDS) as rec:
        if setup is not None:
            setup()
        if not S.backend_sched_alloc_graph(sched, graph):
            raise RuntimeError(f"ggml_backend_sched_alloc_graph failed: {impl.last_log_error()}")
    return capture_sched(sched, graph, rec, which)


@dataclass
class AllocRecord:
    """One ``ggml_gallocr`` plan.

    ``plan``: the allocator's ``last_alloc`` (n_nodes, n_leafs, hash_size, chunk_sizes per buffer, reallocated
    [(buffer, old size, new size)], tensors: per tensor {name, addr, op, phase, buffer_id, chunk, offset, size,
    alloc_size, alloc_node, free_node, reused_from, reused_by, view_src, view_offs, extra_freed, output, input});
    ``buffer_owner``: per buffer id, the first buffer id sharing its dynamic allocator (same buffer type: one address
    space); ``buffer_names``: their buffer types' names; ``allocated_sizes``: each buffer's allocated size (None:
    unknown, a plan given without its allocator); ``node_names`` / ``node_ops``: the planned graph's nodes (None
    where no graph was given); ``view_srcs``: [view address, its source's address] of the graph's views."""
    plan: dict
    buffer_owner: list
    buffer_names: list
    allocated_sizes: list
    node_names: list
    node_ops: list
    view_srcs: list


def capture_alloc(galloc=None, graph=None, plan=None) -> AllocRecord:
    """The ``AllocRecord`` of ``galloc``'s last plan (or of ``plan``, a ``last_alloc`` dict, without its allocator);
    ``graph``: the graph it planned (for a scheduler ``sched.graph``), for node names, ops and views' sources."""
    if plan is None:
        if galloc is None or galloc.last_alloc is None:
            raise ValueError("no plan: pass a ggml_gallocr that has reserved / allocated a graph, or plan=")
        plan = galloc.last_alloc
    plan = dict(plan, chunk_sizes=[list(c) for c in plan["chunk_sizes"]],
                reallocated=list(plan.get("reallocated", [])), tensors=[dict(r) for r in plan["tensors"]])
    n_buf, n_nodes = len(plan["chunk_sizes"]), int(plan["n_nodes"])
    owner = list(range(n_buf))
    names = [f"buffer {i}" for i in range(n_buf)]
    sizes = [None] * n_buf
    if galloc is not None:
        for i in range(n_buf):
            for j in range(i):
                if galloc.buf_tallocs[j] is galloc.buf_tallocs[i]:
                    owner[i] = owner[j]
                    break
            names[i] = B.backend_buft_name(galloc.bufts[i])
            buf = galloc.buffers[i]
            sizes[i] = A.vbuffer_size(buf) if buf is not None else 0
    node_names, node_ops = [None] * n_nodes, [None] * n_nodes
    vsrc: dict[int, int] = {}
    if graph is not None:
        for i, t in enumerate(graph.nodes[:n_nodes]):
            node_names[i], node_ops[i] = t.name, op_desc(t)
        for t in list(graph.nodes) + list(graph.leafs):
            if t.view_src is not None:
                vsrc[t.addr] = t.view_src.addr
            for s in t.src:
                if s is not None and s.view_src is not None:
                    vsrc[s.addr] = s.view_src.addr
    return AllocRecord(plan=plan, buffer_owner=owner, buffer_names=names, allocated_sizes=sizes,
                       node_names=node_names, node_ops=node_ops, view_srcs=[[a, b] for a, b in vsrc.items()])
