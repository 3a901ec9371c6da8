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
# # 02 · The context arena
#
# `ggml_init` allocates one buffer, the arena, and everything created in that context goes into it, one *object*
# after another: tensors (struct + data), graphs, and the work buffer of a computation. Each object starts with a
# 32-byte `struct ggml_object` header `{offs, size, next, type}`; the headers form a linked list from
# `ctx->objects_begin` to `ctx->objects_end`. Nothing is ever freed individually: `ggml_free` drops the whole arena.
#
# This notebook watches the arena grow, allocation by allocation, and reads the bytes back.

# %%
import numpy as np
import matplotlib.pyplot as plt

from ggviz import ggml, viz
from ggviz.viz.widgets import ArenaWidget
from ggviz.viz.widgets import exercise as ex           # predict, then reveal: answers computed from the run

np.set_printoptions(precision=4, suppress=True)
OBJ, TENSOR, ALIGN = ggml.GGML_OBJECT_SIZE, ggml.GGML_TENSOR_SIZE, ggml.GGML_MEM_ALIGN
print("sizeof(struct ggml_object) =", OBJ, " sizeof(struct ggml_tensor) =", TENSOR, " GGML_MEM_ALIGN =", ALIGN)

# %% [markdown]
# ## 1. Tensors: header + struct + data, padded to 16
#
# `ggml_new_object` puts the new header right after the previous object and asks for `GGML_PAD(size, 16)` payload
# bytes. For a tensor, `ggml_new_tensor_impl` asks for `sizeof(struct ggml_tensor) + data bytes`. So each tensor costs
# `32 + PAD(336 + nbytes, 16)` bytes of arena; `ggml_used_mem` is the end of the last object.

# %%
ex.tensor_cost(ggml.GGML_TYPE_F32, (7, 3))      # predict first; the table below shows four other tensors

# %%
ctx = ggml.init(256 * 1024)
print(f"fresh context: mem_size = {ggml.get_mem_size(ctx):,} bytes, used_mem = {ggml.used_mem(ctx)}")

def cost(nbytes):
    return OBJ + ggml.GGML_PAD(TENSOR + nbytes, ALIGN)

history = []
for name, typ, ne in [("x", ggml.GGML_TYPE_F32, (10,)), ("w", ggml.GGML_TYPE_F32, (3, 5)),
                      ("ids", ggml.GGML_TYPE_I32, (7,)), ("q", ggml.GGML_TYPE_Q4_0, (64, 2))]:
    before = ggml.used_mem(ctx)
    t = ggml.new_tensor(ctx, typ, len(ne), ne)
    ggml.set_name(t, name)
    grew = ggml.used_mem(ctx) - before
    history.append(viz.Table([{"tensor": name, "type": ggml.type_name(typ), "ne": list(ne), "nbytes": ggml.nbytes(t),
                               "32 + PAD(336 + nbytes)": cost(ggml.nbytes(t)), "used_mem grew by": grew,
                               "used_mem": ggml.used_mem(ctx)}]))
    assert grew == cost(ggml.nbytes(t))
viz.Table([h[0] for h in history])

# %%
fig, axes = plt.subplots(2, 1, figsize=(12, 5))
viz.plot_arena(ctx, ax=axes[0], title="linear scale: widths proportional to bytes")
viz.plot_arena(ctx, ax=axes[1], scale="sqrt", title="sqrt scale: small regions widened, ticks are real offsets")
fig.tight_layout()

# %%
viz.arena_map(ctx)

# %% [markdown]
# Section 4 shows this arena as an explorer (`ArenaWidget`): every object, its header decoded and its bytes in hex.
#
# *Read the code:* ggviz.ggml.context.Context.new_object, ggviz.ggml.context.Context.new_tensor_impl, ggviz.ggml.context.used_mem ↔ ggml.c ggml_new_object, ggml_new_tensor_impl, ggml_used_mem

# %% [markdown]
# ## 2. The object list and a header in hex
#
# The `next` field of each header holds the *address* of the next header (ggviz stores real addresses, like C). The
# table shows it as an offset into the arena. Below, the first header's 32 bytes in hex, then decoded by hand.

# %%
viz.objects_table(ctx)

# %%
mem = ggml.get_mem_buffer(ctx)              # ggml_get_mem_buffer: the arena itself (zero-copy uint8 array)
print(viz.hexdump(ctx, 0, OBJ))
offs, size, nxt = mem[0:24].view(np.uint64)
otype = mem[24:28].view(np.int32)[0]
print(f"offs={offs}  size={size}  next=ctx.base+{int(nxt) - ctx.base}  type={otype} (GGML_OBJECT_TYPE_TENSOR=0)")

# %% [markdown]
# *Read the code:* ggviz.ggml.context.Context.new_object, ggviz.ggml.context.get_mem_buffer ↔ ggml.c ggml_new_object, ggml_get_mem_buffer

# %% [markdown]
# ## 3. A tensor struct read straight from the arena
#
# The struct of tensor `w` starts at its object's `offs`. Decode its 336 bytes taken *from the arena* (not from the
# Python object) and check that they say what the tensor says. Notebook 01 §2 lists every field of the struct with
# its offset and bytes; here only the fields we check.

# %%
w = ggml.get_tensor(ctx, "w")              # ggml_get_tensor: walks the object list comparing names
o = next(o for o in ctx.objects if o.payload is w)
print(f"object header at {o.hdr_offs}, struct at {o.offs}, data at {w.data - ctx.base}")
table = viz.tensor_header_table(w, raw=mem[o.offs:o.offs + TENSOR])
by_field = {r["field"]: r["value"] for r in table}
assert [by_field[f"ne[{i}]"] for i in range(4)] == list(w.shape)
assert [by_field[f"nb[{i}]"] for i in range(4)] == list(w.strides)
assert by_field["data"] == w.data and by_field["name"] == "w"
table.filter(lambda r: r["field"] in ("type", "ne[0]", "ne[1]", "nb[0]", "nb[1]", "data", "name"))

# %% [markdown]
# *Read the code:* ggviz.ggml.context.get_tensor, ggviz.ggml.tensor.Tensor ↔ ggml.c ggml_get_tensor

# %% [markdown]
# ## 4. Views cost a struct, not data
#
# A view (`ggml_view_*`, `ggml_reshape_*`, `ggml_permute`, `ggml_transpose`) is a new tensor object whose payload is
# only the 336-byte struct: its `data` points into the source's bytes.

# %%
before = ggml.used_mem(ctx)
wt = ggml.transpose(ctx, w)
view_cost = ggml.used_mem(ctx) - before
print("transpose cost", view_cost, "bytes = 32 + 336;  data inside w's data:", wt.data == w.data)
viz.arena_map(ctx)[-2:]

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
ex.Exercise(f"The transpose of `w` ({ggml.nbytes(w)} bytes of data) cost {view_cost} bytes of arena. A transpose of a "
            f"1 MiB tensor would cost the same {view_cost}. Why?",
            "a view is a new header and struct whose data pointer points into the source's bytes",
            choices=["a view is a new header and struct whose data pointer points into the source's bytes",
                     "ggml copies the data lazily, when the graph runs",
                     "the arena stores views in a separate table"],
            kind="why",
            explain=f"{view_cost} = sizeof(struct ggml_object) {OBJ} + sizeof(struct ggml_tensor) {TENSOR}, already a "
                    f"multiple of {ALIGN}; `wt.data` = `w.data` (checked above). Only ggml_cont (a node) would copy.")

# %% [markdown]
# The whole arena as an explorer: the view's object is selected (a struct whose `data` points into `w`'s bytes); click
# any other object, or pick it in the list, to see its header decoded and its bytes in hex.

# %%
ArenaWidget(ctx).select(wt)

# %% [markdown]
# *Read the code:* ggviz.ggml.ops.transpose, ggviz.ggml.ops.view_tensor ↔ ggml.c ggml_transpose, ggml_view_impl

# %% [markdown]
# ## 5. A `no_alloc` context: metadata only
#
# With `no_alloc = true` tensors get their struct but no data (`data == NULL`): the data will live elsewhere (a backend
# buffer, an mmap of the model file). This is how llama.cpp creates its weight and compute contexts; the size it asks
# for is just `n_tensors * ggml_tensor_overhead()` (+ `ggml_graph_overhead()` for a graph).

# %%
n = 4
meta = ggml.init(n * ggml.tensor_overhead(), no_alloc=True)
big = [ggml.new_tensor_2d(meta, ggml.GGML_TYPE_Q4_1, 576, 1536) for _ in range(n)]
print(f"ggml_tensor_overhead() = {ggml.tensor_overhead()}, used_mem = {ggml.used_mem(meta):,} for {n} tensors "
      f"describing {sum(ggml.nbytes(t) for t in big):,} bytes of data")
print("data pointer:", "NULL" if not big[0].data else f"0x{big[0].data:x}")
try:
    ggml.get_data(big[0])
except ValueError as e:
    print("get_data:", e)
viz.plot_arena(meta);

# %% [markdown]
# *Read the code:* ggviz.ggml.context.init, ggviz.ggml.context.tensor_overhead ↔ ggml.c ggml_init, ggml_tensor_overhead

# %% [markdown]
# ## 6. The graph object
#
# `ggml_new_graph` is one object of `ggml_graph_nbytes(2048)` bytes: the `struct ggml_cgraph`, the `nodes` and `leafs`
# pointer arrays (2048 each), the use counts and the keys of the visited hash set (`ggml_hash_size(2 * 2048)` = 4099
# slots, a prime), and the bitset marking used slots. The whole object, header included, is `ggml_graph_overhead()`.

# %%
x = ggml.get_tensor(ctx, "x")
ggml.get_data(x)[...] = np.arange(10, dtype=np.float32)
y = ggml.set_name(ggml.scale(ctx, ggml.add(ctx, x, x), 10.0), "y")   # (x + x) * 10
before = ggml.used_mem(ctx)
gf = ggml.new_graph(ctx)
print(f"graph object: {ggml.used_mem(ctx) - before:,} bytes;  ggml_graph_overhead() = {ggml.graph_overhead():,}")
ggml.build_forward_expand(gf, y)
print(f"graph: size = {gf.size}, nodes = {[t.name for t in gf.nodes]}, leafs = {[t.name for t in gf.leafs]}")
g_rows = [r for r in viz.arena_map(ctx, detail=True) if r["kind"] == "graph" or (r["obj"] == len(ctx.objects) - 1)]
viz.Table(g_rows, ["start", "end", "size", "kind", "name", "note"])

# %% [markdown]
# *Read the code:* ggviz.ggml.graph.new_graph, ggviz.ggml.graph.graph_nbytes, ggviz.ggml.graph.hash_size ↔ ggml.c ggml_new_graph, ggml_graph_nbytes, ggml_hash_size

# %% [markdown]
# ## 7. The work buffer
#
# `ggml_graph_compute_with_ctx` calls `ggml_graph_plan`, then `ggml_new_buffer(ctx, cplan.work_size)`: one more
# object, appended after everything else, even when `work_size` is 0 (then it is a bare 32-byte header). Ops that
# convert their inputs need scratch space: a `Q4_0 x F32` `mul_mat` converts the F32 operand to `Q8_0` blocks there
# first, so its plan asks for a work buffer.

# %%
before = ggml.used_mem(ctx)
plan = ggml.graph_plan(gf, 1)
ggml.graph_compute_with_ctx(ctx, gf, 1)
print("add+scale: work_size =", plan.work_size, " used_mem grew by", ggml.used_mem(ctx) - before, "(one header)")
print("y =", ggml.get_data(y).reshape(-1))

q = ggml.get_tensor(ctx, "q")                     # Q4_0 [64, 2]
ggml.set_data(q, np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64))
v = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 64), "v")
ggml.get_data(v)[...] = 1.0
mm = ggml.set_name(ggml.mul_mat(ctx, q, v), "q x v")
g2 = ggml.new_graph(ctx)
ggml.build_forward_expand(g2, mm)
for n_threads in (1, 2):
    print(f"mul_mat plan, {n_threads} thread(s): work_size =", ggml.graph_plan(g2, n_threads).work_size,
          "bytes (64 floats -> 2 Q8_0 blocks of 34 bytes, + 64 bytes per thread)")
before = ggml.used_mem(ctx)
ggml.graph_compute_with_ctx(ctx, g2, 1)
print("used_mem grew by", ggml.used_mem(ctx) - before, "= 32 + PAD(work_size, 16)")
print("q x v =", ggml.get_data(mm).reshape(-1),
      " float reference:", ggml.get_data_f32(q)[0, 0] @ np.ones(64, dtype=np.float32))

# %%
viz.plot_arena(ctx, scale="sqrt", max_labels=20, title="the whole arena: tensors, views, two graphs, two work buffers")
viz.objects_table(ctx)

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.ggml_cpu.graph_plan, ggviz.ggml.cpu.ggml_cpu.graph_compute_with_ctx, ggviz.ggml.context.new_buffer ↔ ggml-cpu.c ggml_graph_plan, ggml_graph_compute_with_ctx; ggml.c ggml_new_buffer

# %% [markdown]
# ## 8. When the arena is full
#
# The arena never grows. `ggml_new_object` asserts that the new object fits and aborts otherwise; ggviz raises an
# error with the same numbers instead.

# %%
small = ggml.init(1024)
ggml.new_tensor_1d(small, ggml.GGML_TYPE_F32, 100)      # 32 + PAD(336 + 400, 16) = 32 + 736 = 768 bytes: fits
print("after one tensor of 100 floats: used_mem =", ggml.used_mem(small), "of", ggml.get_mem_size(small))
try:
    ggml.new_tensor_1d(small, ggml.GGML_TYPE_F32, 100)  # another 768 (to 1536): does not
except ggml.ContextOutOfMemory as e:
    print(e)
ggml.free(small)
ggml.free(meta)
ggml.free(ctx)

# %%
n_floats = 30                        # change it, predict, then run this cell again
tiny = ggml.init(1024)
fitted = 0
try:
    while True:
        ggml.new_tensor_1d(tiny, ggml.GGML_TYPE_F32, n_floats)
        fitted += 1
except ggml.ContextOutOfMemory:
    pass
ggml.free(tiny)
ex.Exercise(f"How many F32 tensors of {n_floats} floats fit in a 1024-byte context before ggml_new_object refuses?",
            fitted, unit="tensors", kind="rerun",
            explain=f"Each costs 32 + PAD(336 + 4·{n_floats}, 16) = {cost(4 * n_floats)} bytes; "
                    f"{fitted} × {cost(4 * n_floats)} = {fitted * cost(4 * n_floats)} ≤ 1024 &lt; "
                    f"{(fitted + 1) * cost(4 * n_floats)}.")

# %% [markdown]
# *Read the code:* ggviz.ggml.context.Context.new_object ↔ ggml.c ggml_new_object
