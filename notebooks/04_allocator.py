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
# # 04 · The graph allocator (ggml-alloc)
#
# A graph built in a `no_alloc` context is only a description: no tensor has memory yet. ggml-alloc gives it memory,
# with three allocators (`ggml-alloc.c`):
#
# * **`ggml_tallocr`**, a bump allocator: every tensor gets the next aligned offset of one buffer, nothing is ever freed.
#   `ggml_backend_alloc_ctx_tensors_from_buft` uses it for weights and the KV cache;
# * **`ggml_dyn_tallocr`**, a *planning* allocator: best-fit over a list of free blocks, merging neighbours on free; it
#   only records how big the buffer would have to be;
# * **`ggml_gallocr`**, the graph allocator: walks the graph in execution order, gives each node memory just before
#   it runs and frees its parents after their last consumer, writing a result **in place** over a dying parent when
#   the op allows it.
#
# This notebook: (1) tallocr vs gallocr on a small graph, (2) the allocation of one SmolLM2 decode, (3) reserve vs
# alloc, and when ggml plans again (`needs_realloc`).

# %%
from ggviz import ggml, llama, trace, viz
from ggviz.ggml import alloc, backend
from ggviz.viz.widgets.alloc_view import AllocatorView
from ggviz.viz.widgets import exercise as ex           # predict, then reveal: answers computed from the run

cpu_buft = backend.backend_cpu_buffer_type()      # ggml_backend_cpu_buffer_type(): host memory, 32-byte alignment
F32 = ggml.GGML_TYPE_F32

# %% [markdown]
# ## 1. A small graph: weights with a tallocr, activations with a gallocr
#
# The weights go in their own context, placed in one buffer by `ggml_backend_alloc_ctx_tensors_from_buft`, which runs
# a `ggml_tallocr` over the context's tensors (`ggml_tallocr_alloc`: offset += padded size). The trace event
# `alloc.tallocr` shows each placement.

# %%
wctx = ggml.init(8 * ggml.tensor_overhead(), no_alloc=True)
w1 = ggml.set_name(ggml.new_tensor_2d(wctx, F32, 64, 256), "w1.weight")
b1 = ggml.set_name(ggml.new_tensor_1d(wctx, F32, 256), "b1.bias")
w2 = ggml.set_name(ggml.new_tensor_2d(wctx, F32, 256, 64), "w2.weight")
with trace.recording(["alloc.tallocr"]) as rec:
    wbuf = alloc.backend_alloc_ctx_tensors_from_buft(wctx, cpu_buft)
viz.Table([{k: e[k] for k in ("name", "offset", "size")} for e in rec.events],
          title=f"ggml_tallocr_alloc into one {backend.backend_buffer_get_size(wbuf)}-byte buffer")

# %% [markdown]
# The activations: a tiny MLP block on 8 tokens. `x` is a graph input (`ggml_set_input`), `probs` a graph output
# (`ggml_set_output`); `res_T` is a transpose, a *view* that owns no bytes.

# %%
def mlp_graph(n_tokens):
    """The MLP block on n_tokens tokens, in a fresh no_alloc context: (context, graph, x, probs)."""
    gctx = ggml.init(1 << 20, no_alloc=True)
    x = ggml.set_name(ggml.new_tensor_2d(gctx, F32, 64, n_tokens), "x")
    ggml.set_input(x)
    h = ggml.set_name(ggml.rms_norm(gctx, x, 1e-5), "norm")
    h = ggml.set_name(ggml.mul_mat(gctx, w1, h), "up")
    h = ggml.set_name(ggml.add(gctx, h, b1), "up_b")
    h = ggml.set_name(ggml.silu(gctx, h), "act")
    y = ggml.set_name(ggml.mul_mat(gctx, w2, h), "down")
    y = ggml.set_name(ggml.add(gctx, y, x), "res")
    y = ggml.set_name(ggml.cont(gctx, ggml.set_name(ggml.transpose(gctx, y), "res_T")), "res_T_cont")
    probs = ggml.set_name(ggml.soft_max(gctx, y), "probs")
    ggml.set_output(probs)
    gf = ggml.new_graph(gctx)
    ggml.build_forward_expand(gf, probs)
    return gctx, gf, x, probs


gctx, gf, x, probs = mlp_graph(8)
print("nodes:", [t.name for t in gf.nodes])
print("leafs:", [t.name for t in gf.leafs])

# %% [markdown]
# **Without reuse** every tensor keeps its own bytes for the whole run: that is what a tallocr over this context would
# need (`ggml_backend_alloc_ctx_tensors_from_buft_size`). **With the gallocr**, `ggml_gallocr_reserve` plans the graph
# and allocates exactly the high-water mark of the plan (`ggml_gallocr_get_buffer_size`); `ggml_gallocr_alloc_graph`
# then gives every tensor its planned address.

# %%
no_reuse = alloc.backend_alloc_ctx_tensors_from_buft_size(gctx, cpu_buft)

# %%
galloc = alloc.gallocr_new(cpu_buft)                     # ggml_gallocr_new(buft)
assert alloc.gallocr_reserve(galloc, gf)                 # ggml_gallocr_reserve: plan + allocate the buffer
assert alloc.gallocr_alloc_graph(galloc, gf)             # ggml_gallocr_alloc_graph: place the tensors
with_reuse = alloc.gallocr_get_buffer_size(galloc, 0)
print(f"without reuse (tallocr): {no_reuse:,} bytes;  gallocr: {with_reuse:,} bytes ({no_reuse / with_reuse:.1f}x less)")

# %%
av = AllocatorView(galloc, gf)           # the plan, from galloc.last_alloc
av.select(5)                             # node 5, "res": writes over "down" in place
av

# %% [markdown]
# > **Teacher note.** Read the chart left to right (execution order). Each rectangle is one tensor's bytes from the
# > node that allocates it (`ggml_gallocr_allocate_node`) to the node after which its last consumer has run
# > (`ggml_gallocr_free_node`, when `n_children` drops to 0). Orange arrows are **in-place hand-overs**: `up_b`, `act`,
# > `res` and `probs` are element-wise ops (`ggml_op_can_inplace`) whose parent dies at that very node, so the result
# > is written over it. `x` (an input, placed before node 0) stays alive until `res` has read it. The transpose `res_T`
# > gets no bytes: `ggml_backend_view_init` points it into `res`. `probs` is an output: never freed, so nothing can
# > overwrite it before you read it.

# %%
sel = av.state()["selected"]
print(f"node {sel['node']} {sel['name']}: {sel['alive_bytes']:,} bytes alive; handed over: "
      + (", ".join(f"{r['name']} → {r['to']}" for r in sel["handed_over"]) or "none"))
viz.Table(sel["alive"], title="alive at node 5")

# %%
n_tokens = 16                       # change it, predict, then run this cell again
gctx_n, gf_n, _, _ = mlp_graph(n_tokens)
no_reuse_n = alloc.backend_alloc_ctx_tensors_from_buft_size(gctx_n, cpu_buft)
e = ex.gallocr_size_kib(gf_n, cpu_buft, no_reuse_n)    # a fresh gallocr plans the new graph
e.kind = "rerun"
e.question = (f"The same block on {n_tokens} tokens instead of 8 (the buffer was {with_reuse / 1024:.1f} KiB for 8). "
              + e.question)
e

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
res_T = next(t for t in gf.nodes if t.name == "res_T")
ex.Exercise("In the plan above, `res_T` (the transpose) takes no bytes of the gallocr's buffer. Why?",
            "a view's data points into its source's bytes: ggml_backend_view_init places it inside res",
            choices=["a view's data points into its source's bytes: ggml_backend_view_init places it inside res",
                     "it is freed before it is computed", "the transpose is computed in the work buffer"],
            kind="why",
            explain=f"`res_T` has view_src = {res_T.view_src.name!r} and the same data address "
                    f"({res_T.data == res_T.view_src.data}); the gallocr counts a view as a reader of its source, "
                    "keeping `res` alive until `res_T_cont` has copied it.")

# %% [markdown]
# *Read the code:* ggviz.ggml.alloc.tallocr_alloc, ggviz.ggml.alloc.backend_alloc_ctx_tensors_from_buft, ggviz.ggml.alloc.gallocr_reserve, ggviz.ggml.alloc.gallocr_alloc_graph ↔ ggml-alloc.c ggml_tallocr_alloc, ggml_backend_alloc_ctx_tensors_from_buft, ggml_gallocr_reserve, ggml_gallocr_alloc_graph

# %% [markdown]
# ## 2. The compute buffer of a SmolLM2 context, and one decode in it
#
# When llama.cpp creates a context it reserves the compute buffers for the worst case (`sched_reserve`): it builds
# the graph of a full prompt batch (`min(n_ctx, n_ubatch)` tokens, all of them outputs, attending the whole KV cache),
# then a one-token graph, then the full batch again, and calls `ggml_backend_sched_reserve` on each. ggviz does the
# same and prints llama.cpp's log lines; the sizes are byte-equal to llama.cpp's (tests/test_reserve.py).
#
# A later `llama_decode` builds the graph of its batch and hands it to the scheduler: `ggml_backend_sched_alloc_graph`
# splits it over the backends (notebook 05) and runs `ggml_gallocr_alloc_graph` on the scheduler's copy of the graph,
# one buffer per backend. Here the CPU is the only backend (llama.cpp's default build; BLAS, opted in with
# `use_blas`, would share the CPU buffer type), so there is one compute buffer. The
# one-token graph has as many nodes as the reserved one, so gallocr keeps the worst-case plan and puts each tensor in
# its reserved slot: no new plan, no new buffer.
#
# One token, after the BOS token of a prompt:

# %%
from ggviz.run import load_model

model = load_model(use_extra_bufts=False)             # weights stay in the file's mapping (a plain CPU build)
cp = llama.context_default_params()
# flash attention off, so KQ and its softmax are tensors to place (llama.cpp's default, on, fuses them: notebook 07 §8)
cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.flash_attn_type = 256, 2, 2, 0
ctx = llama.init_from_model(model, cp)                  # reserves: pp 256 tokens, tg 1 token, pp again
print(ctx.compute_buffer_log())
size0 = alloc.gallocr_get_buffer_size(ctx.sched.galloc, 0)
vocab = llama.model_get_vocab(model)
bos = llama.tokenize(vocab, "The", add_special=True, parse_special=True)[0]
with trace.recording(["alloc.reserve"]) as rec_dec:
    assert llama.decode(ctx, llama.batch_get_one([bos])) == 0
print(f"after the decode: buffer {alloc.gallocr_get_buffer_size(ctx.sched.galloc, 0):,} bytes (was {size0:,}); "
      f"new plans made by the decode: {len(rec_dec.events)}")
dv = AllocatorView(ctx.sched.galloc, ctx.sched.graph)   # the plan of sched->galloc for sched->graph
s = dv.state()
print(f"{s['n_rects']} tensors in a {s['buffer_size'] / 2**20:.2f} MiB buffer ({s['sum_sizes'] / 2**20:.2f} MiB "
      f"without reuse); {s['n_reused']} written in place over a parent; {s['n_views']} views into it, "
      f"{s['n_external_views']} into the KV cache; never freed: {', '.join(s['never_freed'])}")

# %%
dv.figure();

# %%
n_vocab, n_ubatch = model.hparams.n_vocab, min(cp.n_ctx, cp.n_ubatch)
slot = next(r for r in dv.rects() if r["name"] == "result_output")
ex.Exercise(f"The reserve planned `result_output` (the logits) for {n_ubatch} tokens of {n_vocab} F32 logits. How many "
            f"MiB is its slot in the compute buffer?", round(slot["size"] / 2**20, 3), rel_tol=0.01, unit="MiB",
            explain=f"{n_ubatch} × {n_vocab} × 4 bytes = {n_ubatch * n_vocab * 4:,} bytes "
                    f"({n_ubatch * n_vocab * 4 / 2**20:.2f} MiB): the slot is {slot['size']:,} bytes of a "
                    f"{s['buffer_size'] / 2**20:.2f} MiB buffer. A decode of one token writes only its first "
                    f"{n_vocab * 4:,} bytes.")

# %% [markdown]
# > **Teacher note.** The slots are the worst case's: `result_output` was planned for 256 tokens of 49152 logits
# > (nearly all of the buffer), so the offset axis is broken above the rest. The one-token decode writes only
# > the start of each slot. The thirty layers look alike: the plan gives every layer the same offsets. The residual stream
# > lives in two slots: `ffn_inp-l` (the first residual ADD, written in place over `attn_out-l`) and `l_out-l` (the
# > second, in place over `ffn_out-l`), at the same two offsets in every layer. The graph inputs (`inp_pos`, the KV
# > indices, the mask) stay alive until their last reader in layer 29. Zoom into layer 0:

# %%
dv.set_range(0, 40).select("kq-0")
dv

# %% [markdown]
# *Read the code:* ggviz.llama.context.LlamaContext.sched_reserve, ggviz.ggml.sched.backend_sched_reserve, ggviz.ggml.sched.backend_sched_alloc_graph ↔ llama-context.cpp llama_context::sched_reserve; ggml-backend.cpp ggml_backend_sched_reserve, ggml_backend_sched_alloc_graph


# %% [markdown]
# ## 3. Reserve vs alloc, and when ggml plans again
#
# llama.cpp calls `ggml_backend_sched_reserve` when it creates a context, with a worst-case graph (a full batch), so
# that a later decode never needs a bigger buffer. `ggml_gallocr_alloc_graph` first asks
# `ggml_gallocr_needs_realloc`: same number of nodes and leafs, and every tensor no larger than the slot planned for
# it? Then the old plan is reused as is. Otherwise, with a single buffer, it plans again (`ggml_gallocr_reserve`),
# growing the buffer if needed.
#
# Below: a standalone gallocr over the CPU buffer type, on two decode graphs of the same model (32 tokens and 1
# token; the weights and the KV cache already have their buffers, so the gallocr only plans the activations).

# %%
def decode_graph(n_tokens):
    return ctx.build_graph(n_tokens, 1, 256).gf          # llm_build_llama for one ubatch (not computed here)

events = ["alloc.reserve", "alloc.needs_realloc"]
# worst case first: reserve for 32 tokens, then allocate a 1-token graph
ga = alloc.gallocr_new(cpu_buft)
big, small = decode_graph(32), decode_graph(1)
with trace.recording(events) as rec1:
    alloc.gallocr_reserve(ga, big)
    size_reserved = alloc.gallocr_get_buffer_size(ga, 0)
    fits = not alloc.gallocr_needs_realloc(ga, small)
    assert alloc.gallocr_alloc_graph(ga, small)
print(f"reserve(32 tokens): {size_reserved:,} bytes; the 1-token graph fits that plan: {fits}; "
      f"buffer now {alloc.gallocr_get_buffer_size(ga, 0):,} bytes; re-plans: {len(rec1.of('alloc.reserve')) - 1}")

# the other way round: plan for 1 token, then allocate 32
ga2 = alloc.gallocr_new(cpu_buft)
big2, small2 = decode_graph(32), decode_graph(1)
with trace.recording(events) as rec2:
    alloc.gallocr_reserve(ga2, small2)
    size_small = alloc.gallocr_get_buffer_size(ga2, 0)
    assert alloc.gallocr_alloc_graph(ga2, big2)
viz.Table([{"event": e["kind"], "reason": e.get("reason"), "chunk sizes": e.get("chunk_sizes"),
            "reallocated (buffer, old, new)": e.get("reallocated")} for e in rec2.events],
          title=f"reserve(1 token) = {size_small} bytes, then alloc_graph(32 tokens)")

# %% [markdown]
# > **Teacher note.** With the worst case reserved first, the small graph is placed into the big plan: offsets come
# > from the 32-token plan, nothing is planned again (`needs_realloc` is false: every 1-token tensor is smaller than
# > its slot). In the other order, the first 32-token tensor larger than its slot (`node embd is not valid`) makes
# > `ggml_gallocr_alloc_graph` call `ggml_gallocr_reserve` itself ("reallocating buffers automatically"): a new plan
# > and a larger buffer, the old one freed. That is why llama.cpp reserves first: no reallocation in the middle of
# > generation. (A scheduler with several buffers cannot re-plan by itself: `ggml_backend_sched_alloc_splits` calls
# > `ggml_gallocr_reserve_n` when `alloc_graph` fails or the backend assignment changed.)

# %%
AllocatorView(ga2, big2, title="the re-plan made by alloc_graph for 32 tokens").set_range(0, 40).figure();

# %% [markdown]
# *Read the code:* ggviz.ggml.alloc.gallocr_reserve_n, ggviz.ggml.alloc.gallocr_needs_realloc, ggviz.ggml.alloc.gallocr_alloc_graph ↔ ggml-alloc.c ggml_gallocr_reserve_n, ggml_gallocr_needs_realloc, ggml_gallocr_alloc_graph
