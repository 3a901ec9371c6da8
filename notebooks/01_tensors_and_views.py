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
# # 01 · Tensors and views
#
# ggml describes every tensor with one C struct, `struct ggml_tensor`: a type, four sizes `ne[4]`, four byte strides
# `nb[4]`, a pointer `data`, and, for results of operations, the op and its sources `src[]`. This notebook builds tensors
# with ggviz's re-implementation of ggml (same function names, without the `ggml_` prefix) and looks at those fields
# and at the bytes behind them:
#
# 1. the *simple-add* example: a context, two tensors, a graph, a computation;
# 2. the tensor struct, decoded from its 336 bytes;
# 3. `ne` and `nb`, and how an index becomes a byte address;
# 4. permute, transpose, views with offsets and reshape: new structs over the same bytes;
# 5. a quantized block (`Q4_0`): 32 numbers in 18 bytes.
#
# Every cell runs the engine for real; nothing below is a drawing of what *should* happen.

# %%
import numpy as np

from ggviz import ggml, trace, viz
from ggviz.ggml import quants
from ggviz.viz.widgets import QuantBlockExplorer, TensorExplorer
from ggviz.viz.widgets import exercise as ex           # predict, then reveal: answers computed from the run

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## 1. The simple-add example
#
# The smallest complete ggml program: `ggml_init` reserves one memory arena, `ggml_new_tensor_2d` places tensors in it,
# `ggml_add` only *records* an addition (a new tensor with `op = GGML_OP_ADD` and `src = {a, b}`),
# `ggml_new_graph` + `ggml_build_forward_expand` collect what must be computed, and `ggml_graph_compute_with_ctx` runs it
# on the CPU.
#
# Note the order of the sizes: ggml lists the *fastest-varying* dimension first. A matrix of 3 rows and 2 columns is
# `ne = [2, 3]` (PyTorch would say `[3, 2]`).

# %%
# ggml_init(params): mem_size, mem_buffer = NULL (allocate it), no_alloc = false (tensors get data)
ctx = ggml.init(16 * 1024 * 1024 + ggml.graph_overhead())

a = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 2, 3)      # ggml_new_tensor_2d: ne0 = 2 columns, ne1 = 3 rows
b = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 2, 3)
ggml.set_name(a, "a")
ggml.set_name(b, "b")

a_data = np.array([1, 2,
                   3, 4,
                   5, 6], dtype=np.float32)
b_data = np.ones(6, dtype=np.float32)
# memcpy(a->data, a_data, ggml_nbytes(a)): get_data is a zero-copy NumPy view of the tensor's bytes
ggml.get_data(a).reshape(-1)[:] = a_data
ggml.get_data(b).reshape(-1)[:] = b_data

result = ggml.add(ctx, a, b)                               # nothing is computed yet
print("before compute:", result.name or "(unnamed)", ggml.op_desc(result), result.shape, "src =", [t.name for t in result.src[:2]])

gf = ggml.new_graph(ctx)                                   # ggml_new_graph
ggml.build_forward_expand(gf, result)                      # ggml_build_forward_expand
print(f"graph: n_nodes = {gf.n_nodes} {[t.name for t in gf.nodes]}, n_leafs = {gf.n_leafs} {[t.name for t in gf.leafs]}")

ggml.graph_compute_with_ctx(ctx, gf, 1)                    # ggml_graph_compute_with_ctx(ctx, gf, n_threads=1)
out = ggml.get_data(result)
print("result (ne3, ne2, ne1, ne0) =", out.shape)
print(out[0, 0])

# %%
import shutil

assert np.array_equal(ggml.get_data(result).reshape(-1), a_data + b_data)
dot = viz.graph_to_dot(gf, title="a + b: 2 leafs (ellipses), 1 node (box)")
dot if shutil.which("dot") else print(dot.source)      # drawing needs graphviz's `dot` program

# %% [markdown]
# *Read the code:* ggviz.ggml.context.init, ggviz.ggml.ops.add, ggviz.ggml.graph.build_forward_expand, ggviz.ggml.cpu.ggml_cpu.graph_compute_with_ctx ↔ ggml.c ggml_init, ggml_add, ggml_build_forward_expand; ggml-cpu.c ggml_graph_compute_with_ctx

# %% [markdown]
# ## 2. The tensor struct, byte by byte
#
# In C you would stop in a debugger and type `p *a`. `t.struct()` gives the same view, decoded from the bytes the
# struct occupies in the arena. `viz.tensor_header_table(t)` goes one step further and lists every field with its
# byte offset and size inside the 336-byte struct (as the compiler lays out `struct ggml_tensor` from `ggml.h` on
# x86-64): `type` at 0, then a 4-byte hole so that the pointer `buffer` is 8-byte aligned, `ne` at 16, `nb` at 48,
# `op` at 80, `op_params` at 84, `flags` at 148, `src[10]` at 152, `view_src` at 232, `view_offs` at 240, `data` at
# 248, `name[64]` at 256, `extra` at 320, `padding[8]` at 328.

# %%
s = a.struct()
for k in ("type", "buffer", "ne", "nb", "op", "flags", "view_src", "view_offs", "data", "name"):
    v = s[k]
    if k in ("buffer", "view_src", "data"):                  # pointers, printed as C's debugger would
        v = f"0x{v:x}" if v else "NULL"
    print(f"{k:10s} = {v}")

# %%
viz.tensor_header_table(a)

# %% [markdown]
# `data` points 336 bytes past the start of the struct: `ggml_new_tensor_impl` sets `data = (char *) (result + 1)`,
# the first byte after the struct, because the data was allocated in the same arena object. The `result` tensor has
# `op = GGML_OP_ADD` and its `src[0]`, `src[1]` are the addresses of `a` and `b`:

# %%
print("data - struct address =", a.data - a.addr, "= sizeof(struct ggml_tensor) =", ggml.GGML_TENSOR_SIZE)
print("src of result:", [t.name for t in result.src if t is not None])
viz.tensor_header_table(result).filter(lambda r: r["field"] in ("op", "src[0]", "src[1]", "src[2]", "data"))

# %% [markdown]
# *Read the code:* ggviz.ggml.context.Context.new_tensor_impl, ggviz.ggml.tensor.Tensor ↔ ggml.c ggml_new_tensor_impl

# %% [markdown]
# ## 3. `ne`, `nb`, and the address of an element
#
# `nb[i]` is the number of bytes to skip to advance index `i` by one. For a freshly created tensor
# (`ggml_new_tensor_impl`): `nb[0] = ggml_type_size(type)`, `nb[1] = nb[0] * ne[0] / ggml_blck_size(type)`, and
# `nb[i] = nb[i-1] * ne[i-1]` above that. The address of element `(i0, i1, i2, i3)` is then
#
#     (char *) t->data + i0*nb[0] + i1*nb[1] + i2*nb[2] + i3*nb[3]
#
# which is exactly how ggml's CPU kernels walk tensors. `viz.element_offset` computes that sum; the NumPy view from
# `get_data` uses the same strides, so the two agree:

# %%
viz.strides_table(a)

# %%
view = ggml.get_data(a)                     # shape (ne3, ne2, ne1, ne0), strides (nb3, nb2, nb1, nb0)
print("numpy strides:", view.strides, " ggml nb (reversed):", a.strides[::-1])
for (i0, i1) in [(0, 0), (1, 0), (0, 1), (1, 2)]:
    off = viz.element_offset(a, i0, i1)
    addr = view[0, 0, i1, i0:].ctypes.data   # address of that element in the arena
    print(f"a[i0={i0}, i1={i1}] = {view[0, 0, i1, i0]:.0f}   offset = {i0}*4 + {i1}*8 = {off:2d}   "
          f"address - data = {addr - a.data}")

# %% [markdown]
# Quantized types store *blocks*, not single numbers. A `Q4_0` row of 32 values is one 18-byte block, so for a
# `[32, 6]` `Q4_0` tensor `nb = [18, 18, 108, 108]`: `nb[0]` is the size of one block and `ne[0]/blck_size = 1` block
# per row. The smallest addressable unit is a block of 32 values.

# %%
c = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_Q4_0, 32, 6)
ggml.set_name(c, "c")
print("type_size =", ggml.type_size(c.type), " blck_size =", ggml.blck_size(c.type))
print("ne =", c.shape, " nb =", c.strides, " nbytes =", ggml.nbytes(c))
viz.strides_table(c)

# %%
ex.permute_nb(a, (2, 0, 1, 3))          # predict first (the next section shows another permutation)

# %%
new_type, new_ne = ggml.GGML_TYPE_Q8_0, (64, 3)     # change the type or the sizes, predict, then run this cell again
scratch = ggml.init(1 << 16, no_alloc=True)
t_new = ggml.new_tensor(scratch, new_type, len(new_ne), list(new_ne))
ex.Exercise(f"A new {ggml.type_name(new_type)} tensor with ne = {list(new_ne)} (a block of {ggml.blck_size(new_type)} "
            f"values is {ggml.type_size(new_type)} bytes). What is its nb (4 numbers, bytes)?",
            tuple(int(x) for x in t_new.nb), kind="rerun",
            explain="nb[0] = type_size (one block), nb[1] = nb[0] · ne[0] / blck_size (the blocks of one row), "
                    "then nb[i] = nb[i-1] · ne[i-1].")

# %% [markdown]
# *Read the code:* ggviz.ggml.context.Context.new_tensor_impl, ggviz.ggml.tensor.nbytes, ggviz.ggml.impl.type_size, ggviz.ggml.impl.blck_size ↔ ggml.c ggml_new_tensor_impl, ggml_nbytes, ggml_type_size, ggml_blck_size

# %% [markdown]
# ## 4. Permute, transpose, views, reshape: new structs, same bytes
#
# `ggml_permute(ctx, a, 1, 0, 2, 3)` creates a *view*: a new struct whose `ne` and `nb` are shuffled, whose `view_src`
# points at `a` and whose `data` is `a`'s data. No byte of data moves. Reading the permuted tensor with its own strides
# gives the transposed matrix: element `(i0, i1)` of `after` is at `i0*8 + i1*4`, i.e. element `(i1, i0)` of `a`.

# %%
before = a
after = ggml.permute(ctx, before, 1, 0, 2, 3)        # ggml_permute: axis i of `before` becomes axis axes[i]
for t in (before, after):
    s = t.struct()
    print(f"{t.name!r:16} ne={s['ne']} nb={s['nb']} op={ggml.op_name(s['op'])} "
          f"view_src={'a' if s['view_src'] == a.addr else ('NULL' if not s['view_src'] else hex(s['view_src']))} data=0x{s['data']:x}")

v_before, v_after = ggml.get_data(before), ggml.get_data(after)
print("same data pointer:", before.data == after.data, "  np.shares_memory:", np.shares_memory(v_before, v_after))
print("before (3 rows of 2):\n", v_before[0, 0])
print("after  (2 rows of 3):\n", v_after[0, 0])

# %%
# walking one row of `after` by hand: p + i0 * nb[0], with nb[0] = 8 bytes
mem = ggml.get_mem_buffer(ctx)
p = a.data - ctx.base                      # data as an offset into the arena
for i0 in range(3):
    off = p + i0 * after.nb[0]
    print(f"after[i0={i0}, i1=0] at data + {i0 * after.nb[0]:2d}:", mem[off:off + 4].view(np.float32)[0])
# writing through one view is visible through the other: it is the same memory
v_after[0, 0, 1, 2] = 60.0
print("a now:", v_before[0, 0].reshape(-1))
v_after[0, 0, 1, 2] = 6.0

# %% [markdown]
# The same walk, for any element: pick an index of `after` (or switch to `a`); the explorer shows
# `offset = i0*nb[0] + i1*nb[1] + ...`, the 4 bytes there and which bytes of the source the whole view touches.

# %%
TensorExplorer(after, views=[before]).select(2, 1)

# %% [markdown]
# `ggml_transpose` is the special case that swaps dims 0 and 1. The result is not *contiguous* (`nb[0] > nb[1]`), so
# ops that need rows in order, such as `ggml_reshape` or the left operand of `ggml_mul_mat`, refuse it; `ggml_cont`
# adds a node that copies it into a fresh, contiguous tensor when the graph runs.

# %%
at = ggml.transpose(ctx, a)
print("transposed:", at.shape, at.strides, " is_transposed:", ggml.is_transposed(at),
      " is_contiguous:", ggml.is_contiguous(at))
try:
    ggml.reshape_2d(ctx, at, 6, 1)
except ggml.GGMLError as e:
    print("reshape refused:", e)

atc = ggml.cont(ctx, at)                   # a new tensor with its own data, filled when the graph runs
g2 = ggml.new_graph(ctx)
ggml.build_forward_expand(g2, atc)
ggml.graph_compute_with_ctx(ctx, g2, 1)
print("cont:", atc.shape, atc.strides, " shares memory with a:",
      np.shares_memory(ggml.get_data(atc), ggml.get_data(a)))
print(ggml.get_data(atc)[0, 0])

# %% [markdown]
# ### Views with an offset
#
# `ggml_view_2d(ctx, src, ne0, ne1, nb1, offset)` picks a window of an existing tensor: `data = src->data + offset`,
# `view_offs = offset`, with the row stride `nb1` chosen by the caller. Transformer code uses this to cut one fused
# projection into its parts. Here a `[3*4, 5]` tensor (think: Q, K and V of 4 features each, for 5 tokens) is split
# into three `[4, 5]` views without copying:

# %%
n, seq = 4, 5
qkv = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 3 * n, seq)
ggml.set_name(qkv, "qkv")
ggml.get_data(qkv)[0, 0] = np.arange(3 * n * seq, dtype=np.float32).reshape(seq, 3 * n)
parts = {}
for k, name in enumerate("QKV"):
    parts[name] = ggml.view_2d(ctx, qkv, n, seq, qkv.nb[1], k * n * 4)   # offset in bytes
    ggml.set_name(parts[name], name)
for name, t in parts.items():
    print(f"{name}: ne={t.shape[:2]} nb={t.strides[:2]} view_offs={t.view_offs:3d} "
          f"data = qkv.data + {t.data - qkv.data:3d}  "
          f"shares memory: {np.shares_memory(ggml.get_data(t), ggml.get_data(qkv))}")
print("K =\n", ggml.get_data(parts["K"])[0, 0])

# %%
# K's window of qkv: the bytes it touches are 4 of every 12 floats, starting 16 bytes in (view_offs)
TensorExplorer(parts["K"], views=[parts["Q"], parts["V"]]).select(1, 2)

# %%
ex.view_cost(a)

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
ex.Exercise("ggml_reshape_2d(ctx, at, 6, 1) was refused above, but the same reshape of `a` works. Why?",
            "at is not contiguous: a reshape only gives new sizes to the same bytes in the same order",
            choices=["at is not contiguous: a reshape only gives new sizes to the same bytes in the same order",
                     "at has no data of its own", "6 × 1 elements do not match at's 2 × 3"],
            kind="why",
            explain=f"`at` has nb = {[int(v) for v in at.nb]}: its rows are not consecutive bytes (nb[0] = {at.nb[0]} > nb[1] = "
                    f"{at.nb[1]}). Reshape recomputes the strides from the new ne as if the bytes were in row "
                    f"order, which is only true of a contiguous tensor; ggml_cont makes one (atc, nb = "
                    f"{[int(v) for v in atc.nb]}).")

# %% [markdown]
# ### Reshape
#
# `ggml_reshape_2d` keeps `data` and gives the same contiguous bytes new sizes; the strides are recomputed from the new
# `ne`. It is a view too (`op = GGML_OP_RESHAPE`, `view_src = a`).

# %%
r = ggml.reshape_2d(ctx, a, 3, 2)
print("a :", a.shape, a.strides)
print("r :", r.shape, r.strides, " same data:", r.data == a.data, " view_src is a:", r.view_src == a)
print(ggml.get_data(r)[0, 0])
viz.plot_arena(ctx, scale="sqrt", max_labels=40, title="after the reshape: the last object, 'a (reshaped)', is r: a struct whose data is a's");

# %% [markdown]
# ### In-place ops: the result is a view of `a`
#
# `ggml_add_inplace(ctx, a, b)` is `ggml_add` with one difference: the result is `ggml_view_tensor(ctx, a)`, a new
# struct whose `data` is `a`'s, so computing it overwrites `a`'s values and the arena gets no new data bytes. Chained
# in-place ops (`ggml_scale_inplace` of that result) still point at `a`: a view of a view records the first tensor
# as its `view_src`. ggml-alloc (notebook 04) does the same thing on its own for ops that allow it.

# %%
ip = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4), "ip")
one = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4), "one")
ggml.get_data(ip).reshape(-1)[:] = [1, 2, 3, 4]
ggml.get_data(one).reshape(-1)[:] = 1
before_ip, used0 = ggml.get_data(ip).reshape(-1).copy(), ggml.used_mem(ctx)
s1 = ggml.add_inplace(ctx, ip, one)              # ip + 1, written into ip's bytes
s2 = ggml.scale_inplace(ctx, s1, 10.0)           # (ip + 1) * 10, written into the same bytes
grew = ggml.used_mem(ctx) - used0
gi = ggml.new_graph(ctx)
ggml.build_forward_expand(gi, s2)
ggml.graph_compute_with_ctx(ctx, gi, 1)
viz.Table([{"tensor": t.name, "op": ggml.op_desc(t), "view_src": t.view_src.name if t.view_src is not None else "NULL",
            "data": "ip.data" if t.data == ip.data else "its own",
            "values after the compute": " ".join(f"{v:g}" for v in ggml.get_data(t).reshape(-1))}
           for t in (ip, s1, s2)],
          title=f"ip was {' '.join(f'{v:g}' for v in before_ip)}; the two in-place nodes cost {grew} bytes of arena "
                f"(2 × (32 + 336)), no data bytes")

# %% [markdown]
# ### `ggml_cpy`: the result is a view of the destination
#
# `ggml_cpy(ctx, a, b)` does not allocate a result: it returns `ggml_view_tensor(ctx, b)` with `op = GGML_OP_CPY`
# and `src = {a, b}`. Computing that node writes `a`'s values, converted to `b`'s type, into `b`'s own bytes. This is
# how ggml writes into an existing buffer (llama.cpp used it to store K and V into views of the KV cache).

# %%
dst = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F16, 2, 3), "dst")     # an F16 destination
cp = ggml.cpy(ctx, a, dst)                                                        # ggml_cpy: F32 -> F16
g3 = ggml.new_graph(ctx)
ggml.build_forward_expand(g3, cp)
ggml.graph_compute_with_ctx(ctx, g3, 1)
viz.Table([{"tensor": t.name, "type": ggml.type_name(t.type), "op": ggml.op_desc(t),
            "view_src": t.view_src.name if t.view_src is not None else "NULL",
            "data": "dst.data" if t.data == dst.data else ("a.data" if t.data == a.data else "its own"),
            "src": ", ".join(x.name for x in t.src if x is not None) or "—",
            "values after the compute": " ".join(f"{v:g}" for v in ggml.get_data(t)[0, 0].reshape(-1))}
           for t in (a, dst, cp)],
          title="ggml_cpy(ctx, a, dst): the result is a view of dst; computing it wrote a, as fp16, into dst's bytes")

# %% [markdown]
# ### `ggml_mul_mat` and `ggml_out_prod`: which dimension is summed
#
# `ggml_mul_mat(a, b)` sums over `ne[0]` of both (a row of `a` · a row of `b`): `a` `[K, M]`, `b` `[K, N]` →
# `[M, N]`, i.e. `b · aᵀ` in NumPy's row-major view; that is why weights are stored `[n_in, n_out]` and the
# activations `[n_in, n_tokens]`. `ggml_out_prod(a, b)` sums over `ne[1]` instead (a sum of outer products of
# columns): `a` `[M, K]`, `b` `[N, K]` → `[M, N]`. The same numbers, laid out the other way, give the same result:

# %%
mctx = ggml.init(1 << 20)
K, M, N = 3, 2, 4
A = ggml.set_name(ggml.new_tensor_2d(mctx, ggml.GGML_TYPE_F32, K, M), "A")     # ne = [K, M]: M rows of K
B = ggml.set_name(ggml.new_tensor_2d(mctx, ggml.GGML_TYPE_F32, K, N), "B")     # ne = [K, N]: N rows of K
ggml.get_data(A)[0, 0] = np.arange(M * K, dtype=np.float32).reshape(M, K)
ggml.get_data(B)[0, 0] = np.arange(N * K, dtype=np.float32).reshape(N, K) / 10
mm = ggml.mul_mat(mctx, A, B)                          # ne = [M, N]
U = ggml.set_name(ggml.new_tensor_2d(mctx, ggml.GGML_TYPE_F32, M, K), "U")     # A's numbers as [M, K]
V = ggml.set_name(ggml.new_tensor_2d(mctx, ggml.GGML_TYPE_F32, N, K), "V")     # B's numbers as [N, K]
ggml.get_data(U)[0, 0] = ggml.get_data(A)[0, 0].T
ggml.get_data(V)[0, 0] = ggml.get_data(B)[0, 0].T
op = ggml.out_prod(mctx, U, V)                         # ne = [M, N]
g4 = ggml.new_graph(mctx)
ggml.build_forward_expand(g4, mm)
ggml.build_forward_expand(g4, op)
ggml.graph_compute_with_ctx(mctx, g4, 1)
ref = ggml.get_data(B)[0, 0] @ ggml.get_data(A)[0, 0].T                        # NumPy: B · Aᵀ, [N, M]
assert np.array_equal(ggml.get_data(mm)[0, 0], ref) and np.allclose(ggml.get_data(op)[0, 0], ref)
viz.Table([{"": f"row i1 = {n}", **{f"mul_mat [{m}]": f"{ggml.get_data(mm)[0, 0][n, m]:g}" for m in range(M)},
            **{f"out_prod [{m}]": f"{ggml.get_data(op)[0, 0][n, m]:g}" for m in range(M)},
            **{f"B·Aᵀ [{m}]": f"{ref[n, m]:g}" for m in range(M)}} for n in range(N)],
          title=f"mul_mat(A [K={K}, M={M}], B [K, N={N}]) and out_prod(U [M, K], V [N, K]): both ne = "
                f"{list(mm.shape[:2])}, the same numbers (NumPy shows the rows i1, the columns i0)")

# %% [markdown]
# ### `ggml_conv_2d`: im2col, then a MUL_MAT
#
# A 2-D convolution slides a `KH × KW` kernel over an image and, at each output pixel, sums kernel × pixels over
# every input channel. ggml's `ggml_conv_2d(ctx, a, b, s0, s1, p0, p1, d0, d1)` (kernel `a` `[KW, KH, IC, OC]`,
# image `b` `[IW, IH, IC, N]`, stride, padding, dilation per axis) has no loop of its own: it builds **IM2COL**,
# which copies the `IC·KH·KW` input values under the kernel at each output pixel into one row (`[IC·KH·KW, OW, OH,
# N]`, F16), then one **MUL_MAT** of those rows by the kernel seen as `OC` rows of `IC·KH·KW` values, then reshapes and
# a permute + cont put `OC` before `N`. The sliding window becomes a matrix product — the operation ggml is fastest at.
#
# Below, a 6 × 6 image with 2 channels whose pixels hold their own labels (channel 0: 0–35, channel 1: 36–71) goes
# through `ggml_im2col` with a 3 × 3 kernel (stride 1, no padding): each row of the result is one output pixel,
# each column one (channel, kh, kw) tap, and each cell says which input pixel landed there.

# %%
cctx = ggml.init(1 << 20)
IW = IH = 6
IC, OC, KS = 2, 3, 3
img = ggml.set_name(ggml.new_tensor_4d(cctx, ggml.GGML_TYPE_F32, IW, IH, IC, 1), "img")
kern = ggml.set_name(ggml.new_tensor_4d(cctx, ggml.GGML_TYPE_F16, KS, KS, IC, OC), "kernel")
ggml.get_data(img)[...] = np.arange(IC * IH * IW, dtype=np.float32).reshape(1, IC, IH, IW)     # pixel labels
col = ggml.im2col(cctx, kern, img, 1, 1, 0, 0, 1, 1, True, ggml.GGML_TYPE_F32)   # s0, s1, p0, p1, d0, d1, is_2D
gc = ggml.new_graph(cctx)
ggml.build_forward_expand(gc, col)
ggml.graph_compute_with_ctx(cctx, gc, 2)       # 2 threads: thread 0 fills channel 0's columns, thread 1 channel 1's
viz.im2col_figure(col, oh=1, ow=2);

# %% [markdown]
# Row (1, 2) holds pixels 8–10, 14–16, 20–22 of channel 0 and the same window of channel 1: the red square on the
# left. Neighbouring output pixels share most of their input, so the im2col matrix holds each pixel up to 9 times
# (here 16 × 18 = 288 values from 72 pixels): memory traded for one large matrix product.
#
# Now the convolution itself, with small integers in the image and the kernel (so that the F16 the im2col stores
# them in holds them exactly): `ggml_conv_2d`'s graph, and its result beside a direct convolution in NumPy.

# %%
rng = np.random.default_rng(5)
ggml.get_data(img)[...] = rng.integers(-4, 5, (1, IC, IH, IW)).astype(np.float32)
W = rng.integers(-2, 3, (OC, IC, KS, KS)).astype(np.float32)
ggml.get_data(kern)[...] = W.astype(np.float16)
conv = ggml.conv_2d(cctx, kern, img, 1, 1, 0, 0, 1, 1)       # [OW, OH, OC, N]
gconv = ggml.new_graph(cctx)
ggml.build_forward_expand(gconv, conv)
ggml.graph_compute_with_ctx(cctx, gconv, 2)
viz.Table([{"node": i, "op": ggml.op_desc(t), "type": ggml.type_name(t.type), "ne": list(t.shape),
            "computes": "nothing (a view)" if t.view_src is not None else "yes"}
           for i, t in enumerate(gconv.nodes[:gconv.n_nodes])],
          title="ggml_conv_2d's graph: IM2COL, MUL_MAT, CONT compute; the reshapes and the permute are views")

# %%
X = ggml.get_data(img)[0]                                   # (IC, IH, IW)
OHW = IH - KS + 1
direct = np.zeros((OC, OHW, OHW), np.float64)               # out[oc, oh, ow] = Σ_c,kh,kw W[oc, c, kh, kw] · X[c, oh+kh, ow+kw]
for kh in range(KS):
    for kw in range(KS):
        direct += np.einsum("chw,oc->ohw", X[:, kh:kh + OHW, kw:kw + OHW], W[:, :, kh, kw])
got = ggml.get_data(conv)[0]                                # (OC, OH, OW)
print(f"conv_2d result ne = {list(conv.shape)}; output channel 0:\n{got[0]}")
print(f"equal to the direct NumPy convolution: {np.array_equal(got, direct)} "
      f"(largest difference {np.abs(got - direct).max():g})")

# %%
s, p, d = 2, 1, 1        # change the stride, padding or dilation, predict, then run this cell again
ex.im2col_ne(list(kern.shape), list(img.shape), s, p, d)

# %% [markdown]
# ### `ggml_mul_mat_id`: expert routing (mixture of experts)
#
# A mixture-of-experts FFN (Mixtral, Qwen-MoE, gpt-oss ...) has `n_expert` weight matrices per layer, stored as one 3-d
# tensor `as` `[K, M, n_expert]`, and sends each token through only `n_expert_used` of them. Below, a synthetic layer
# of 4 experts, 2 used, 6 tokens (no MoE model is at hand), built as llama.cpp's `build_moe_ffn` (llama-graph.cpp)
# builds it, with Qwen2-MoE's settings (softmax gating, weights not renormalized; Mixtral would add SUM_ROWS, CLAMP,
# DIV): the router's logits `ggml_mul_mat(gate_inp, x)`, `ggml_soft_max` (the probabilities), `ggml_argsort_top_k`
# (an ARGSORT of each token's probabilities, descending, and a view of its first 2: `ids` `[2, n_tokens]`, I32),
# `ggml_get_rows` of the probabilities at those ids (the weights), then `ggml_mul_mat_id(ctx, as, b, ids)` for the
# experts' up, gate and down matrices: column (slot s, token t) of its result is expert `ids[s, t]`'s matrix times
# token t's row. The weighted experts are summed per token. All of it is one graph, computed by ggviz's CPU backend
# (tests/test_argsort.py and tests/test_mul_mat_id.py check ARGSORT and MUL_MAT_ID against the real ggml).

# %%
from ggviz.viz.widgets import GraphView

ectx = ggml.init(1 << 20)
n_embd, n_ff, n_expert, n_used, n_tok = 8, 4, 4, 2, 6
rng = np.random.default_rng(3)
F32 = ggml.GGML_TYPE_F32
x = ggml.set_name(ggml.new_tensor_2d(ectx, F32, n_embd, n_tok), "x")                      # 6 token rows
gate_inp = ggml.set_name(ggml.new_tensor_2d(ectx, F32, n_embd, n_expert), "gate_inp")       # the router
up_exps = ggml.set_name(ggml.new_tensor_3d(ectx, F32, n_embd, n_ff, n_expert), "up_exps")   # 4 experts' matrices
gate_exps = ggml.set_name(ggml.new_tensor_3d(ectx, F32, n_embd, n_ff, n_expert), "gate_exps")
down_exps = ggml.set_name(ggml.new_tensor_3d(ectx, F32, n_ff, n_embd, n_expert), "down_exps")
for t_ in (x, gate_inp, up_exps, gate_exps, down_exps):
    ggml.get_data(t_)[...] = rng.standard_normal(ggml.get_data(t_).shape).astype(np.float32)

# llm_graph_context::build_moe_ffn, step by step (the names are llama.cpp's callback names)
logits = ggml.set_name(ggml.mul_mat(ectx, gate_inp, x), "ffn_moe_logits")                # [n_expert, n_tok]
probs = ggml.set_name(ggml.soft_max(ectx, logits), "ffn_moe_probs")
selected = ggml.set_name(ggml.argsort_top_k(ectx, probs, n_used), "ffn_moe_topk")       # [n_used, n_tok], I32
ggml.set_name(selected.src[0], "ffn_moe_argsort")                                        # the ARGSORT it views
weights = ggml.set_name(ggml.get_rows(ectx, ggml.reshape_3d(ectx, probs, 1, n_expert, n_tok), selected),
                        "ffn_moe_weights")                                               # [1, n_used, n_tok]
gm = ggml.new_graph(ectx)
ggml.build_forward_expand(gm, weights)
cur = ggml.reshape_3d(ectx, x, n_embd, 1, n_tok)
up = ggml.set_name(ggml.mul_mat_id(ectx, up_exps, cur, selected), "ffn_moe_up")         # [n_ff, n_used, n_tok]
gate = ggml.set_name(ggml.mul_mat_id(ectx, gate_exps, cur, selected), "ffn_moe_gate")
act = ggml.set_name(ggml.swiglu_split(ectx, gate, up), "ffn_moe_swiglu")
experts_out = ggml.set_name(ggml.mul_mat_id(ectx, down_exps, act, selected), "ffn_moe_down")  # [n_embd, n_used, n_tok]
experts_out = ggml.set_name(ggml.mul(ectx, experts_out, weights), "ffn_moe_weighted")
ggml.build_forward_expand(gm, experts_out)
slots = [ggml.view_2d(ectx, experts_out, n_embd, n_tok, experts_out.nb[2], s * experts_out.nb[1]) for s in range(n_used)]
for v in slots:
    ggml.build_forward_expand(gm, v)
moe_out = ggml.set_name(ggml.add(ectx, slots[0], slots[1]), "ffn_moe_out")               # [n_embd, n_tok]
ggml.build_forward_expand(gm, moe_out)
with trace.recording(kinds={"cpu.mul_mat_id_rows", "cpu.chunk"}) as mmid_rec:
    ggml.graph_compute_with_ctx(ectx, gm, 2)

P, top, wts = ggml.get_data(probs)[0, 0], ggml.get_data(selected)[0, 0], ggml.get_data(weights)[0, :, :, 0]
# the graph's picks are the 2 largest probabilities of each token (no ties here: with ties, std::sort's order decides)
assert np.array_equal(top, np.argsort(-P, axis=1, kind="stable")[:, :n_used])
# and the layer's output is the weighted sum of the chosen experts' SwiGLU FFNs (float64 NumPy, to float32 rounding)
Wu, Wg, Wd = (ggml.get_data(t_)[0].astype(np.float64) for t_ in (up_exps, gate_exps, down_exps))
X = ggml.get_data(x)[0, 0].astype(np.float64)
ffn = lambda e, v: Wd[e] @ ((Wg[e] @ v) / (1 + np.exp(-(Wg[e] @ v))) * (Wu[e] @ v))   # noqa: E731
want = np.stack([sum(wts[t, s] * ffn(top[t, s], X[t]) for s in range(n_used)) for t in range(n_tok)])
assert np.allclose(ggml.get_data(moe_out)[0, 0], want, rtol=1e-4, atol=1e-5)
viz.Table([{"token": t, **{f"p(expert {e})": f"{P[t, e]:.2f}" for e in range(n_expert)},
            "ids (slot 0, slot 1)": f"{top[t, 0]}, {top[t, 1]}",
            "weights": f"{wts[t, 0]:.2f}, {wts[t, 1]:.2f}"} for t in range(n_tok)],
          title=f"the router: ffn_moe_probs (SOFT_MAX of gate_inp · x) per token, the top {n_used} experts the "
                f"ARGSORT picks (ffn_moe_topk) and their probabilities (GET_ROWS: ffn_moe_weights)")

# %% [markdown]
# The graph (click a node for its tensor; *fit* shows all of it, drag pans): ARGSORT and its VIEW pick the experts,
# GET_ROWS their weights, the three MUL_MAT_IDs read the same `ffn_moe_topk`, MUL scales each slot by its weight, and
# the two VIEWs of the slots are added.

# %%
GraphView(gm, title=f"build_moe_ffn: {gm.n_nodes} nodes", max_height="820px")

# %% [markdown]
# `ggml_compute_forward_mul_mat_id` does not run one matrix product per token. Thread 0 first groups the work by
# expert: for each expert, the list of (slot, token) pairs routed to it (`matrix_row_counts`, `matrix_rows`, kept in
# the work buffer), appended token by token. Then every thread walks the experts in order and, for an expert with
# rows, splits (its `n_ff` rows × its routed columns) into chunks claimed from that expert's own `current_chunk`
# counter. So each expert's weights are read once per step, however many tokens chose it; an expert nobody chose
# costs nothing. The mapping and the chunks below were recorded from the compute above (2 threads) for `ffn_moe_up`
# (`ffn_moe_gate` and `ffn_moe_down` read the same ids, so they map the same pairs):

# %%
(rows_ev,) = [e for e in mmid_rec.events if e["kind"] == "cpu.mul_mat_id_rows" and e["node"] == "ffn_moe_up"]
chunks_by_expert = {}
for e in mmid_rec.events:
    if e["kind"] == "cpu.chunk" and e["node"] == "ffn_moe_up":
        chunks_by_expert.setdefault(e["expert"], []).append((e["ith"], f"thread {e['ith']}: rows {e['ir0'][0]}–"
                                                            f"{e['ir0'][1] - 1}, columns {e['ir1'][0]}–{e['ir1'][1] - 1}"))
viz.Table([{"expert": e, "src1 rows routed (matrix_row_counts)": rows_ev["counts"][e],
            "(slot, token) pairs, in order (matrix_rows)": " ".join(f"({s},{t})" for s, t in rows_ev["rows"][e]) or "—",
            "chunks (the expert's rows × its routed columns)": "; ".join(c for _, c in sorted(chunks_by_expert.get(e, [])))
            or "none"}
           for e in range(n_expert)],
          title=f"MUL_MAT_ID's row mapping: {n_tok} tokens × {n_used} slots = {sum(rows_ev['counts'])} columns, "
                f"grouped by expert; dst[:, slot, token] is written from each pair")

# %% [markdown]
# *Read the code:* ggviz.ggml.ops.permute, ggviz.ggml.ops.transpose, ggviz.ggml.ops.view_2d, ggviz.ggml.ops.reshape_2d, ggviz.ggml.ops.cont, ggviz.ggml.ops.add_inplace, ggviz.ggml.ops.scale_inplace, ggviz.ggml.ops.cpy, ggviz.ggml.ops.mul_mat, ggviz.ggml.ops.out_prod, ggviz.ggml.ops.im2col, ggviz.ggml.ops.conv_2d, ggviz.ggml.cpu.ops.forward_im2col, ggviz.ggml.ops.mul_mat_id, ggviz.ggml.ops.argsort_top_k, ggviz.ggml.cpu.ops.forward_argsort, ggviz.ggml.cpu.mul_mat.forward_mul_mat_id ↔ ggml.c ggml_permute, ggml_transpose, ggml_view_2d, ggml_reshape_2d, ggml_cont, ggml_add_inplace, ggml_scale_inplace, ggml_cpy, ggml_mul_mat, ggml_out_prod, ggml_im2col, ggml_conv_2d, ggml_mul_mat_id, ggml_argsort_top_k; ops.cpp ggml_compute_forward_im2col, ggml_compute_forward_argsort; ggml-cpu.c ggml_compute_forward_mul_mat_id; llama-graph.cpp llm_graph_context::build_moe_ffn

# %% [markdown]
# ## 5. A quantized block: `block_q4_0`
#
# `ggml-common.h` defines `block_q4_0` as one `ggml_half d` (the scale, an IEEE fp16) followed by `uint8_t qs[16]`:
# 32 four-bit numbers, two per byte. `quantize_row_q4_0_ref` picks `d = max / -8`, where `max` is the value of largest
# magnitude (sign kept), stores `q = round(x/d) + 8` clamped to 0..15, and puts element `j` in the low nibble of
# `qs[j]` and element `j + 16` in its high nibble. `dequantize_row_q4_0` gives back `(q - 8) * d`.

# %%
rng = np.random.default_rng(0)
x = rng.normal(0, 1, 32).astype(np.float32)
raw = quants.quantize_row_ref(ggml.GGML_TYPE_Q4_0, x)      # quantize_row_q4_0_ref
print(len(raw), "bytes:", raw.tobytes().hex(" "))
print(viz.hexdump(raw))
blk = quants.decode_block(ggml.GGML_TYPE_Q4_0, raw)
print(f"d = {blk['d']:.6g} (fp16 bytes {raw[:2].tobytes().hex(' ')})")
print("qs[0] = 0x%02x -> element 0 = low nibble %d, element 16 = high nibble %d" % (raw[2], raw[2] & 15, raw[2] >> 4))
print("signed quants:", blk["quants"])

# %%
y = quants.dequantize_row(ggml.GGML_TYPE_Q4_0, raw)         # dequantize_row_q4_0
err = y - x
print("x    :", x[:8])
print("y    :", y[:8])
print("max |error| = %.4f   (d/2 = %.4f)" % (np.abs(err).max(), abs(blk["d"]) / 2))
viz.q4_0_block_figure(raw, x);

# %% [markdown]
# The sign of `d` follows the extreme value: `d = max / -8` sends that value exactly to level `-8` (stored nibble 0).
# Levels run from `-8` to `+7`, so a value at the *other* end, close to `-max`, would need `+8` and is clamped to `+7`:
# only such values can be off by more than `|d|/2`. The whole budget is 4.5 bits per value (18 bytes / 32 values).
#
# Filling a `Q4_0` tensor with floats quantizes row by row, and `get_data` returns the raw block bytes:

# %%
vals = rng.normal(0, 1, (6, 32)).astype(np.float32)
ggml.set_data(c, vals)                                  # quantizes each 32-value row into one block
rows = ggml.get_data(c)                                 # (ne3, ne2, ne1, row bytes) = (1, 1, 6, 18)
print(rows.shape, "row 0:", rows[0, 0, 0].tobytes().hex(" "))
print("row 1 starts", viz.element_offset(c, 0, 1), "bytes after row 0 (= nb[1])")
back = ggml.get_data_f32(c)[0, 0]
print("max |error| over the tensor: %.4f" % np.abs(back - vals).max())

# %% [markdown]
# One block of `c`, taken apart: its 18 bytes, the fp16 scale, the 32 nibbles and the values they decode to. Choose
# another row or block, or another format (`Q4_1`, `Q8_0`, `Q4_K`, ...: the row is re-quantized with ggml's reference
# quantizer) to compare what each format stores.

# %%
QuantBlockExplorer(c, row=2)

# %% [markdown]
# ### fp16, and the tables `ggml_cpu_init` fills
#
# The block scale `d` above is an IEEE fp16 (`ggml_fp16_t`). fp16 has only 65536 bit patterns, so ggml's CPU backend
# precomputes some functions for all of them once, in `ggml_cpu_init`: with `GGML_GELU_FP16`, `ggml_vec_gelu_f32`
# rounds x to fp16 and looks up `ggml_table_gelu_f16[bits]` instead of computing tanh. Below: the real table (ggviz
# fills it the same way, bit for bit), what the kernel returns, and GELU in float64 for comparison.

# %%
import math
from ggviz.ggml.cpu import vec

tab = vec.gelu_table_f16()            # ggml_table_gelu_f16[1 << 16], filled once by ggml_cpu_init
gelu_rows = []
for x in np.array([-3.0, -0.5, 0.1, 0.7003, 2.5], np.float32):
    h = np.float16(x)                 # GGML_CPU_FP32_TO_FP16: the table's index is the fp16 bit pattern
    bits = int(np.array(h).view(np.uint16))
    exact = 0.5 * float(x) * (1 + math.tanh(math.sqrt(2 / math.pi) * (float(x) + 0.044715 * float(x) ** 3)))
    gelu_rows.append({"x": float(x), "fp16(x)": float(h), "bits": f"0x{bits:04x}", "table[bits]": float(tab[bits]),
                      "ggml_vec_gelu_f32(x)": float(vec.gelu_f32(x)), "GELU(x) in float64": exact})
print(f"ggml_table_gelu_f16: {len(tab)} entries of {tab.dtype}, {tab.nbytes:,} bytes")
viz.Table(gelu_rows)

# %% [markdown]
# The same `ggml_cpu_init` loop fills `ggml_table_f32_f16[bits]`, fp16 → fp32 for every pattern, with
# `ggml_compute_fp16_to_fp32` (ggml-impl.h). That function needs no float16 hardware: an fp16 is 1 sign bit, 5
# exponent bits (bias 15) and 10 mantissa bits; shifted up into a float32's fields, its exponent is 112 too small
# (bias 127 − 15), so ggml adds `0xE0 << 23` to the bits and multiplies by 2⁻¹¹² (which also turns exponent 31 into
# inf / NaN); subnormals (exponent 0) are built as `magic − 0.5` from a float whose mantissa holds the fp16's. Below,
# that bit trick in NumPy, run on all 65536 patterns and compared with ggviz's conversion, then five values decoded by
# hand.

# %%
w = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)        # each fp16 in the top half of a 32-bit word
two_w = w + w                                                    # drops the sign bit
exp_scale = np.array(0x07800000, np.uint32).view(np.float32)     # 2**-112 as float32 bits
with np.errstate(invalid="ignore"):                              # NaN patterns stay NaN (quiet), as in C
    normal = ((two_w >> np.uint32(4)) + np.uint32(0xE0 << 23)).view(np.float32) * exp_scale
subnormal = ((two_w >> np.uint32(17)) | np.uint32(126 << 23)).view(np.float32) - np.float32(0.5)
trick = (w & np.uint32(0x80000000)) | np.where(two_w < np.uint32(1 << 27), subnormal.view(np.uint32),
                                               normal.view(np.uint32))
table_f32_f16 = quants.fp16_to_fp32(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16))
same = int((trick == table_f32_f16.view(np.uint32)).sum())
print(f"the bit trick and ggviz's fp16_to_fp32 agree bit for bit on {same:,} of 65,536 patterns")
d_bits = int.from_bytes(raw[:2].tobytes(), "little")           # the Q4_0 block's scale d, above
fp16_rows = []
for bits in (0x3C00, 0xC000, d_bits, 0x0001, 0x7C00):
    sgn, e, m = bits >> 15, (bits >> 10) & 0x1F, bits & 0x3FF
    by_hand = ((-1) ** sgn * (2.0 ** (e - 15) * (1 + m / 1024) if 0 < e < 31 else
               (-1) ** sgn * 2.0 ** -14 * (m / 1024) if e == 0 else float("inf")))
    fp16_rows.append({"bits": f"0x{bits:04x}", "sign": sgn, "exponent": e, "mantissa": m,
                      "by hand": "(−1)^s · 2^(e−15) · (1 + m/1024)" if 0 < e < 31 else
                      ("subnormal: 2^−14 · m/1024" if e == 0 else "exponent 31, m = 0: inf"),
                      "value": f"{by_hand:.9g}", "ggml_table_f32_f16[bits]": f"{float(table_f32_f16[bits]):.9g}"})
viz.Table(fp16_rows, title=f"five fp16s decoded (0x{d_bits:04x}: the scale d of the Q4_0 block above)")

# %% [markdown]
# **Next:** `02_context_arena.ipynb` follows the arena that all these structs and bytes live in.
#
# *Read the code:* ggviz.ggml.quants.quantize_row_ref, ggviz.ggml.quants.dequantize_row, ggviz.ggml.cpu.vec.gelu_f32, ggviz.ggml.quants.fp16_to_fp32 ↔ ggml-quants.c quantize_row_q4_0_ref, dequantize_row_q4_0; vec.h ggml_vec_gelu_f32; ggml-cpu.c ggml_cpu_init; ggml-impl.h ggml_compute_fp16_to_fp32
