# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · The compute graph: nodes, leafs, and the order of evaluation
#
# ggml never computes while you *describe* a computation. `ggml_add(ctx, a, b)` only creates a tensor with
# `op = GGML_OP_ADD` and `src = {a, b}`. `ggml_build_forward_expand(gf, out)` then walks the sources of `out`
# depth-first (`ggml_visit_parents`) and fills two lists of the `ggml_cgraph`:
#
# * **nodes**: tensors with an op, in an order where every source comes before its consumers: the order the CPU
#   backend will compute them;
# * **leafs**: tensors without an op (weights, inputs, constants): their data must be there before computing.
#
# A hash set (`visited_hash_set`) remembers which tensors were already visited, so a tensor read by several nodes is
# added once; `use_counts` counts its readers. This notebook records the walk (`graph.visit` / `graph.add` trace
# events), replays it, and then looks at the 1086-node graph of one decode step (flash attention off, as
# `decode_graph` builds it; llama.cpp's default graph fuses each layer's attention into one FLASH_ATTN_EXT: 936 nodes).

# %%
from ggviz import ggml, trace, viz
from ggviz.viz.widgets import exercise as ex           # predict, then reveal: answers computed from the run

ctx = ggml.init(4 * 1024 * 1024)
x = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4), "x")
W = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 4, 4), "W")
b = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4), "b")
u = ggml.set_name(ggml.mul_mat(ctx, W, x), "u")        # u = W x
v = ggml.set_name(ggml.mul(ctx, u, u), "v")            # v = u * u   (u read twice)
z = ggml.set_name(ggml.add(ctx, v, b), "z")            # z = v + b
out = ggml.set_name(ggml.add(ctx, z, u), "out")        # out = z + u (u read a third time)
ex.graph_counts(z)                                     # predict, then reveal (the next cell builds gf for `out`)

# %%
with trace.Recorder(kinds=["graph.visit", "graph.add"]) as rec:
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, out)
print("nodes:", [t.name for t in gf.nodes])
print("leafs:", [t.name for t in gf.leafs])

# %% [markdown]
# ## 1. The walk, event by event
#
# `ggml_visit_parents(cgraph, node)`: if `node` is in the hash set, stop (a **hit**); otherwise insert it, visit
# `src[0]`, `src[1]`, ... recursively, and only *then* append `node` to `nodes` (or to `leafs` if it has no op).
# Appending after the sources is what makes the list a valid evaluation order (a post-order DFS).

# %%
rows = []
for k, e in enumerate(rec.events):
    if e["kind"] == "graph.visit":
        what = "hit: already in the graph" if e["hit"] else "visit: insert into the hash set"
    else:
        what = f"append to {e['kind_']}s[{e['index']}]"
    rows.append({"step": k, "tensor": e["name"], "hash slot": e["hash_pos"], "what": what})
viz.Table(rows, title="ggml_visit_parents, recorded")

# %%
from collections import Counter
hits = Counter(e["name"] for e in rec.events if e["kind"] == "graph.visit" and e["hit"])
assert gf.use_count(u) == 3 and hits == {"u": 2, "W": 2, "x": 2}
viz.Table([{"tensor": t.name, "in": kind, "use count (readers' src slots)": gf.use_count(t),
            "hash-set hits": hits.get(t.name, 0)} for kind, ts in (("nodes", gf.nodes), ("leafs", gf.leafs))
           for t in ts],
          title=f"{len(rec.of('graph.visit'))} visits, {sum(hits.values())} of them hash-set hits")

# %% [markdown]
# `u` has three readers (`v` twice, through `src[0]` and `src[1]`, and `out`), so its use count is 3, and the walk
# met it three times: one visit, two hits. `W` and `x` were hit twice as well (the exercise below asks why). The graph
# allocator (notebook 04) uses the use counts to know when `u`'s memory can be reused.

# %%
extra = 2                          # change it, predict, then run this cell again
out2 = out
for _ in range(extra):
    out2 = ggml.add(ctx, out2, u)  # each one reads u once more
g_extra = ggml.new_graph(ctx)
ggml.build_forward_expand(g_extra, out2)
ex.Exercise(f"The graph of `out` plus {extra} more ADD(·, u) nodes: what is u's use count?", g_extra.use_count(u),
            kind="rerun",
            explain="Each reading source slot counts once: v reads u twice (src[0] and src[1]), out once, and every "
                    "extra ADD once. u itself is still one node: the hash set keeps it from being added again.")

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
ex.Exercise(f"`W` and `x` are leafs of u only, yet the walk hit each of them {hits['W']} times. Why?",
            "on a hit, the walk still enters the sources not flagged COMPUTE, and a leaf never gets that flag",
            choices=["on a hit, the walk still enters the sources not flagged COMPUTE, and a leaf never gets that flag",
                     "leafs are stored twice, in nodes and in leafs",
                     "the hash set had a collision"],
            kind="why",
            explain="ggml_visit_parents, on a tensor already in the hash set, still walks into its sources that are "
                    "not yet flagged GGML_TENSOR_FLAG_COMPUTE (\"update the compute flag regardless\"); a node gets "
                    "the flag, a leaf (no op) never does, so u's leafs are met again each time u is.")

# %% [markdown]
# Step through the walk with the widget (each click: one event; the hash set on the right):

# %%
from ggviz.viz.widgets import VisitAnimation

anim = VisitAnimation(rec, gf)
anim.goto(5)
anim

# %% [markdown]
# *Read the code:* ggviz.ggml.graph.build_forward_expand, ggviz.ggml.graph.visit_parents ↔ ggml.c ggml_build_forward_expand, ggml_visit_parents_graph

# %% [markdown]
# ## 2. The graph of one decode step
#
# Now the real thing: the graph `llama_decode` builds for one new token (`llm_build_llama`). We record its
# construction the same way.

# %%
from collections import Counter
from ggviz.run import load_model
from ggviz.capture import decode_graph

model = load_model()
with trace.Recorder(kinds=["graph.visit", "graph.add"]) as rec_dec:
    res = decode_graph(model)
gfd = res.gf

# %%
visits = [e for e in rec_dec.events if e["kind"] == "graph.visit" and e["graph"] == ggml.graph_key(gfd)]
print(f"{gfd.n_nodes} nodes, {gfd.n_leafs} leafs; ggml_visit_parents entered {len(visits)} times, "
      f"{sum(e['hit'] for e in visits)} hash-set hits")
leaf_rows = []
for name in ("inp_pos", "attn_inp_kq_mask", "token_embd.weight", "blk.0.attn_q.weight"):
    for t in [t for t in gfd.leafs if t.name == name]:
        readers = [n.name for n in gfd.nodes if any(s is t for s in n.src)]
        leaf_rows.append({"leaf": name, "use count": gfd.use_count(t), "read by": ", ".join(readers[:3])
                          + (f" … and {len(readers) - 3} more" if len(readers) > 3 else "")})
viz.Table(leaf_rows, title="four leafs of the decode graph and their readers")

# %% [markdown]
# ### The ops of the decode graph: `GGML_OP_NAME` and `GGML_OP_SYMBOL`
#
# A node's `op` is a number, an `enum ggml_op`. ggml.c keeps two tables indexed by it, `GGML_OP_NAME` ("MUL_MAT")
# and `GGML_OP_SYMBOL` ("X*Y"), read by `ggml_op_name` / `ggml_op_symbol` (debug prints, `ggml_graph_print`, the
# DOT export). A `static_assert(GGML_OP_COUNT == ...)` beside each table makes adding an op without naming it a
# compile error. The decode graph's ops, with their numbers and both names:

# %%
nl = model.hparams.n_layer
op_counts = Counter(t.op for t in gfd.nodes).most_common()
viz.Table([{"enum ggml_op": op, "GGML_OP_NAME": ggml.op_name(op), "GGML_OP_SYMBOL": ggml.op_symbol(op), "nodes": n,
            "per layer": f"{n // nl}" if n % nl == 0 else "—"} for op, n in op_counts],
          title=f"the {gfd.n_nodes} nodes of the decode graph by op ({ggml.GGML_OP_COUNT} ops in the enum)")

# %% [markdown]
# > **Teacher note.** `inp_pos` is read by 60 ROPE nodes (Q and K of 30 layers), the mask by 30 softmaxes. This
# > model ties its output head to the token embeddings: llama.cpp loads `token_embd.weight` a second time as the
# > output matrix (`TENSOR_DUPLICATED`), so the graph has two leafs of that name, one read by the first GET_ROWS
# > (the embedding), one by the last MUL_MAT (the logits). Views (RESHAPE, VIEW, PERMUTE, TRANSPOSE) are nodes too, but they compute nothing: they are a
# > new header over the same bytes.
#
# Collapsed per layer, the graph is a chain of blocks: layer 0 open below, the layers identical to it node for node
# folded into one box, the last layer in its own box (it also holds the two GET_ROWS by `inp_out_ids`), then the
# output head. A click on a box opens its first layer:

# %%
from ggviz.viz import graph_dot
from ggviz.viz.widgets import GraphView

view = GraphView(gfd, fold=True)
view.expand(0)
print(graph_dot.describe_picture(view.layout()[1]))
view

# %% [markdown]
# *Read the code:* ggviz.llama.context.LlamaContext.build_graph, ggviz.llama.models.llama.LlamaGraph.build, ggviz.llama.graph.LlmGraphContext.build_attn, ggviz.ggml.tensor.op_name, ggviz.ggml.tensor.op_symbol ↔ llama-context.cpp llama_context::process_ubatch; models/llama.cpp llama_model_llama::build_arch_graph; llama-graph.cpp llm_graph_context::build_attn; ggml.c ggml_op_name, ggml_op_symbol
