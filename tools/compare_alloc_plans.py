"""Compare what the graph allocator (ggviz/ggml/alloc.py) leaves in two source trees, e.g. main and a branch.

    python tools/compare_alloc_plans.py TREE OUT.pkl        # record, TREE's ggviz first on sys.path
    python tools/compare_alloc_plans.py --diff A.pkl B.pkl  # compare two records: IDENTICAL or the differences

Records, for SmolLM2 and Gemma-3 (GGUFs in $GGVIZ_MODELS, default /work/main/data/models), flash attention off and
on, without and with an ``alloc.*`` trace listener: after each gallocr_reserve_n_impl (a first context's pp512 and
tg1 reserves, and the third with a listener) and each gallocr_alloc_graph (a 4-token prompt, a decode step) the node
and leaf allocs, the hash set's size, insertion order and used keys, every hash_node, the dynamic allocators' chunk
sizes and free blocks, the buffer sizes, ``last_alloc`` with every record as the views read it, every graph tensor's
buffer and offset, and the trace events. Addresses are written as (tensor name, offset in its context's arena), so
that two processes compare. Where the tree has them (a plan's hash slots written at its end, slot arrays made at the
reserve), it also checks that the slots are those HashSet.find_or_insert gives for the plan's insertion order and
that the slot arrays equal the ones read back from the tensor_alloc lists.
"""
import collections
import os
import pickle
import sys


def record(tree: str, out: str) -> None:
    sys.path.insert(0, tree)
    import numpy as np

    from ggviz import llama as L, trace
    from ggviz.ggml import alloc as A, backend as B
    from ggviz.ggml.graph import HashSet
    from ggviz.ggml.tensor import tensor_at
    from ggviz.llama.context_pool import context_pool_clear

    calls = collections.defaultdict(list)          # per hash set: find_or_insert addresses since its last reset
    checks = collections.Counter()
    find_or_insert, reset = HashSet.find_or_insert, HashSet.reset

    def fi(self, addr):
        calls[id(self)].append(addr)
        return find_or_insert(self, addr)

    def rs(self):
        calls[id(self)] = []
        return reset(self)

    HashSet.find_or_insert, HashSet.reset = fi, rs
    if hasattr(A, "_plan_hash_flush"):
        flush = A._plan_hash_flush

        def fl(galloc, P):
            calls[id(galloc.hash_set)].extend(P.taken.values())
            r = flush(galloc, P)
            hs = galloc.hash_set
            fresh = HashSet(hs.size, np.zeros_like(hs.used), np.zeros_like(hs.keys))
            for a in P.taken.values():
                find_or_insert(fresh, a)
            used = [i for i in range(hs.size) if hs.get_used(i)]
            assert (fresh.used == hs.used).all() and (fresh.keys[used] == hs.keys[used]).all(), "hash slots differ"
            checks["hash sets"] += 1
            return r
        A._plan_hash_flush = fl

    def norm(addr):
        if not addr:
            return 0
        try:
            t = tensor_at(addr)
        except ValueError:
            return ("?", addr)
        mb = getattr(t.ctx, "mem_buffer", None)
        return (t.name, addr - mb.ctypes.data if mb is not None else None)

    bufs = {}

    def ta(x):
        return (x.buffer_id, tuple(x.addr), x.size_max)

    def snap(g, graph, what):
        c = getattr(g, "_slots_cache", None)
        if c is not None and c[0] is g.node_allocs and c[1] is getattr(g, "_last_alloc", None) and c[2] == g.n_nodes:
            g._slots_cache = None
            b, sm = A._plan_slots(g)
            assert (b == c[3]).all() and (sm == c[4]).all(), "slot arrays differ"
            checks["slot arrays"] += 1
        s = {"what": what, "n": (g.n_nodes, g.n_leafs)}
        s["nodes"] = [(ta(na.dst), [ta(x) for x in na.src]) for na in g.node_allocs[:g.n_nodes]]
        s["leafs"] = [ta(la.leaf) for la in g.leaf_allocs[:g.n_leafs]]
        hs = g.hash_set
        s["hsize"] = hs.size
        seen, order = set(), []
        for a in calls[id(hs)]:
            if a not in seen:
                seen.add(a)
                order.append(norm(a))
        s["insert_order"] = order
        s["used"] = sorted(str(norm(int(hs.keys[i]))) for i in range(hs.size) if hs.get_used(i))
        hv = {}
        for i, hn in g.hash_values.items():
            assert hs.get_used(i)
            hv[str(norm(int(hs.keys[i])))] = (hn.n_children, hn.n_views, hn.buffer_id, tuple(hn.addr), hn.allocated)
        s["hash_values"] = hv
        s["chunks"] = [[(ch.max_size, [(b.offset, b.size) for b in ch.free_blocks]) for ch in t.chunks]
                       for t in g.buf_tallocs]
        la = g.last_alloc
        s["last_alloc"] = None if la is None else {
            k: ([{f: (norm(v) if f == "addr" else v) for f, v in r.items()} for r in v] if k == "tensors" else v)
            for k, v in la.items()}
        s["bufsizes"] = [None if vb is None else [B.backend_buffer_get_size(c) for c in vb.chunks if c is not None]
                         for vb in g.buffers]
        ts = list(graph.leafs[:graph.n_leafs]) + list(graph.nodes[:graph.n_nodes])
        for n in graph.nodes[:graph.n_nodes]:
            ts += [x for x in n.src if x is not None]
        placed = {}
        for t in ts:
            b, d = t.buffer, t.data
            if b:
                placed[norm(t.addr)] = (bufs.setdefault(b, len(bufs)),
                                        d - B.backend_buffer_get_base(B.buffer_at(b)) if d else None)
            else:
                placed[norm(t.addr)] = (0, d != 0)
        s["placed"] = sorted(placed.items(), key=str)
        return s

    out_snaps = []
    reserve_impl, alloc_graph = A.gallocr_reserve_n_impl, A.gallocr_alloc_graph

    def rn(galloc, graph, *a, **k):
        r = reserve_impl(galloc, graph, *a, **k)
        out_snaps.append(snap(galloc, graph, "reserve"))
        return r

    def ag(galloc, graph):
        r = alloc_graph(galloc, graph)
        out_snaps.append(snap(galloc, graph, "alloc_graph"))
        return r

    A.gallocr_reserve_n_impl, A.gallocr_alloc_graph = rn, ag
    kinds = ("alloc.alloc", "alloc.reuse", "alloc.free", "alloc.view", "alloc.needs_realloc", "alloc.reserve")

    def nev(e):          # (addresses normalized, the allocator's id and the clock left out)
        return {k: (norm(v) if k in ("addr", "parent_addr", "view_src_addr") else 0 if k == "galloc" else v)
                for k, v in e.items() if k not in ("t", "ts", "time", "thread")}

    models = os.environ.get("GGVIZ_MODELS", "/work/main/data/models")
    res = {}
    for path in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"):
        m = L.model_load_from_file(os.path.join(models, path), L.model_default_params())
        for fa in (0, 1):
            for listen in (False, True):
                out_snaps.clear()
                bufs.clear()
                cp = L.context_default_params()
                cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.flash_attn_type = 512, 2, 2, fa
                rec = trace.Recorder(kinds) if listen else None
                if rec:
                    trace.listen(rec)
                try:
                    ctx = L.init_from_model(m, cp)
                    for ids in ([504, 3575, 282, 4649], [1530], [28]):
                        assert L.decode(ctx, L.batch_get_one(ids)) == 0
                finally:
                    if rec:
                        trace.unlisten(rec)
                key = (path, fa, listen)
                res[key] = dict(snaps=list(out_snaps), events=[nev(e) for e in rec.events] if rec else None)
                print(key, len(out_snaps), "snapshots", len(rec.events) if rec else 0, "events", flush=True)
                L.free(ctx)
                context_pool_clear(m)
    print("checked:", dict(checks))
    with open(out, "wb") as f:
        pickle.dump(res, f)


def diff(pa: str, pb: str) -> int:
    with open(pa, "rb") as f:
        a = pickle.load(f)
    with open(pb, "rb") as f:
        b = pickle.load(f)
    assert a.keys() == b.keys()
    bad = 0
    for k in a:
        x, y = a[k], b[k]
        if len(x["snaps"]) != len(y["snaps"]):
            print(k, "snapshots", len(x["snaps"]), len(y["snaps"]))
            bad += 1
            continue
        for i, (s, t) in enumerate(zip(x["snaps"], y["snaps"])):
            for f in s:
                if s[f] != t[f]:
                    print(k, i, s["what"], "differs:", f)
                    bad += 1
        if x["events"] != y["events"]:
            print(k, "events differ")
            bad += 1
        print(k, "snapshots", len(x["snaps"]), "events", len(x["events"] or ()), "records",
              [len(s["last_alloc"]["tensors"]) for s in x["snaps"] if s["last_alloc"]])
    print("IDENTICAL" if not bad else f"{bad} DIFFERENCES")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        sys.exit(diff(sys.argv[2], sys.argv[3]))
    record(sys.argv[1], sys.argv[2])
