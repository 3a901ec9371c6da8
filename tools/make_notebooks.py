"""Generate the notebooks in notebooks/ (without outputs): 00_quickstart, 01_tensors_and_views, 02_context_arena,
03_cgraph, 06_threadpool, 07_decode_walkthrough.

    python tools/make_notebooks.py            # (re)write the notebooks
    python tools/make_notebooks.py --check    # exit 1 if a committed notebook differs from what this script writes

The notebooks are data, this script is their source: edit the cells here, re-run, commit both. Cell ids are derived
from the notebook name and the cell's position, so the output is byte-for-byte reproducible.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"

SETUP = """\
import numpy as np
import matplotlib.pyplot as plt

from ggviz import ggml, viz
from ggviz.ggml import quants

np.set_printoptions(precision=4, suppress=True)"""

# --------------------------------------------------------------------------------------------------------------------
NB01 = [
    ("md", """\
# 01 · Tensors and views

ggml describes every tensor with one C struct, `struct ggml_tensor`: a type, four sizes `ne[4]`, four byte strides
`nb[4]`, a pointer `data`, and, for results of operations, the op and its sources `src[]`. This notebook builds tensors
with ggviz's re-implementation of ggml (same function names, without the `ggml_` prefix) and looks at those fields
and at the bytes behind them:

1. the *simple-add* example: a context, two tensors, a graph, a computation;
2. the tensor struct, decoded from its 336 bytes;
3. `ne` and `nb`, and how an index becomes a byte address;
4. permute, transpose, views with offsets and reshape: new structs over the same bytes;
5. a quantized block (`Q4_0`): 32 numbers in 18 bytes.

Every cell runs the engine for real; nothing below is a drawing of what *should* happen."""),
    ("code", SETUP),
    ("md", """\
## 1. The simple-add example

The smallest complete ggml program: `ggml_init` reserves one memory arena, `ggml_new_tensor_2d` places tensors in it,
`ggml_add` only *records* an addition (a new tensor with `op = GGML_OP_ADD` and `src = {a, b}`),
`ggml_new_graph` + `ggml_build_forward_expand` collect what must be computed, and `ggml_graph_compute_with_ctx` runs it
on the CPU.

Note the order of the sizes: ggml lists the *fastest-varying* dimension first. A matrix of 3 rows and 2 columns is
`ne = [2, 3]` (PyTorch would say `[3, 2]`)."""),
    ("code", """\
# ggml_init(params): mem_size, mem_buffer = NULL (allocate it), no_alloc = false (tensors get data)
ctx = ggml.init(16 * 1024 * 1024 + ggml.graph_overhead())

a = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 2, 3)      # ggml_new_tensor_2d: ne0 = 2 columns, ne1 = 3 rows
b = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 2, 3)
ggml.set_name(a, "a"); ggml.set_name(b, "b")

a_data = np.array([1, 2,
                   3, 4,
                   5, 6], dtype=np.float32)
b_data = np.ones(6, dtype=np.float32)
# memcpy(a->data, a_data, ggml_nbytes(a)): get_data is a zero-copy NumPy view of the tensor's bytes
ggml.get_data(a).reshape(-1)[:] = a_data
ggml.get_data(b).reshape(-1)[:] = b_data

result = ggml.add(ctx, a, b)                               # nothing is computed yet
print("before compute:", result.name or "(unnamed)", ggml.op_desc(result), result.shape, "src =", result.src[:2])

gf = ggml.new_graph(ctx)                                   # ggml_new_graph
ggml.build_forward_expand(gf, result)                      # ggml_build_forward_expand
print(gf, "nodes:", [t.name for t in gf.nodes], "leafs:", [t.name for t in gf.leafs])

ggml.graph_compute_with_ctx(ctx, gf, 1)                    # ggml_graph_compute_with_ctx(ctx, gf, n_threads=1)
out = ggml.get_data(result)
print("result (ne3, ne2, ne1, ne0) =", out.shape)
print(out[0, 0])"""),
    ("code", """\
assert np.array_equal(ggml.get_data(result).reshape(-1), a_data + b_data)
import shutil
dot = viz.graph_to_dot(gf, title="a + b: 2 leafs (ellipses), 1 node (box)")
dot if shutil.which("dot") else print(dot.source)      # drawing needs graphviz's `dot` program"""),
    ("md", """\
## 2. The tensor struct, byte by byte

In C you would stop in a debugger and type `p *a`. `t.struct()` gives the same view, decoded from the bytes the
struct occupies in the arena. `viz.tensor_header_table(t)` goes one step further and lists every field with its
byte offset and size inside the 336-byte struct (as the compiler lays out `struct ggml_tensor` from `ggml.h` on
x86-64): `type` at 0, then a 4-byte hole so that the pointer `buffer` is 8-byte aligned, `ne` at 16, `nb` at 48,
`op` at 80, `op_params` at 84, `flags` at 148, `src[10]` at 152, `view_src` at 232, `view_offs` at 240, `data` at
248, `name[64]` at 256, `extra` at 320, `padding[8]` at 328."""),
    ("code", """\
s = a.struct()
for k in ("type", "buffer", "ne", "nb", "op", "flags", "view_src", "view_offs", "data", "name"):
    print(f"{k:10s} = {s[k]}")"""),
    ("code", "viz.tensor_header_table(a)"),
    ("md", """\
`data` points 336 bytes past the start of the struct: `ggml_new_tensor_impl` sets `data = (char *) (result + 1)`,
the first byte after the struct, because the data was allocated in the same arena object. The `result` tensor has
`op = GGML_OP_ADD` and its `src[0]`, `src[1]` are the addresses of `a` and `b`:"""),
    ("code", """\
print("data - struct address =", a.data - a.addr, "= sizeof(struct ggml_tensor) =", ggml.GGML_TENSOR_SIZE)
print("src of result:", [t.name for t in result.src if t is not None])
viz.tensor_header_table(result).filter(lambda r: r["field"] in ("op", "src[0]", "src[1]", "src[2]", "data"))"""),
    ("md", """\
## 3. `ne`, `nb`, and the address of an element

`nb[i]` is the number of bytes to skip to advance index `i` by one. For a freshly created tensor
(`ggml_new_tensor_impl`): `nb[0] = ggml_type_size(type)`, `nb[1] = nb[0] * ne[0] / ggml_blck_size(type)`, and
`nb[i] = nb[i-1] * ne[i-1]` above that. The address of element `(i0, i1, i2, i3)` is then

    (char *) t->data + i0*nb[0] + i1*nb[1] + i2*nb[2] + i3*nb[3]

which is exactly how ggml's CPU kernels walk tensors. `viz.element_offset` computes that sum; the NumPy view from
`get_data` uses the same strides, so the two agree:"""),
    ("code", "viz.strides_table(a)"),
    ("code", """\
view = ggml.get_data(a)                     # shape (ne3, ne2, ne1, ne0), strides (nb3, nb2, nb1, nb0)
print("numpy strides:", view.strides, " ggml nb (reversed):", a.strides[::-1])
for (i0, i1) in [(0, 0), (1, 0), (0, 1), (1, 2)]:
    off = viz.element_offset(a, i0, i1)
    addr = view[0, 0, i1, i0:].ctypes.data   # address of that element in the arena
    print(f"a[i0={i0}, i1={i1}] = {view[0, 0, i1, i0]:.0f}   offset = {i0}*4 + {i1}*8 = {off:2d}   "
          f"address - data = {addr - a.data}")"""),
    ("md", """\
Quantized types store *blocks*, not single numbers. A `Q4_0` row of 32 values is one 18-byte block, so for a
`[32, 6]` `Q4_0` tensor `nb = [18, 18, 108, 108]`: `nb[0]` is the size of one block and `ne[0]/blck_size = 1` block
per row. The smallest addressable unit is a block of 32 values."""),
    ("code", """\
c = ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_Q4_0, 32, 6)
ggml.set_name(c, "c")
print("type_size =", ggml.type_size(c.type), " blck_size =", ggml.blck_size(c.type))
print("ne =", c.shape, " nb =", c.strides, " nbytes =", ggml.nbytes(c))
viz.strides_table(c)"""),
    ("md", """\
## 4. Permute, transpose, views, reshape: new structs, same bytes

`ggml_permute(ctx, a, 1, 0, 2, 3)` creates a *view*: a new struct whose `ne` and `nb` are shuffled, whose `view_src`
points at `a` and whose `data` is `a`'s data. No byte of data moves. Reading the permuted tensor with its own strides
gives the transposed matrix: element `(i0, i1)` of `after` is at `i0*8 + i1*4`, i.e. element `(i1, i0)` of `a`."""),
    ("code", """\
before = a
after = ggml.permute(ctx, before, 1, 0, 2, 3)        # ggml_permute: axis i of `before` becomes axis axes[i]
for t in (before, after):
    s = t.struct()
    print(f"{t.name!r:16} ne={s['ne']} nb={s['nb']} op={ggml.op_name(s['op'])} "
          f"view_src={'a' if s['view_src'] == a.addr else s['view_src']} data=0x{s['data']:x}")

v_before, v_after = ggml.get_data(before), ggml.get_data(after)
print("same data pointer:", before.data == after.data, "  np.shares_memory:", np.shares_memory(v_before, v_after))
print("before (3 rows of 2):\\n", v_before[0, 0])
print("after  (2 rows of 3):\\n", v_after[0, 0])"""),
    ("code", """\
# walking one row of `after` by hand: p + i0 * nb[0], with nb[0] = 8 bytes
mem = ggml.get_mem_buffer(ctx)
p = a.data - ctx.base                      # data as an offset into the arena
for i0 in range(3):
    off = p + i0 * after.nb[0]
    print(f"after[i0={i0}, i1=0] at data + {i0 * after.nb[0]:2d}:", mem[off:off + 4].view(np.float32)[0])
# writing through one view is visible through the other: it is the same memory
v_after[0, 0, 1, 2] = 60.0
print("a now:", v_before[0, 0].reshape(-1))
v_after[0, 0, 1, 2] = 6.0"""),
    ("md", """\
`ggml_transpose` is the special case that swaps dims 0 and 1. The result is not *contiguous* (`nb[0] > nb[1]`), so
ops that need rows in order, such as `ggml_reshape` or the left operand of `ggml_mul_mat`, refuse it; `ggml_cont`
adds a node that copies it into a fresh, contiguous tensor when the graph runs."""),
    ("code", """\
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
print(ggml.get_data(atc)[0, 0])"""),
    ("md", """\
### Views with an offset

`ggml_view_2d(ctx, src, ne0, ne1, nb1, offset)` picks a window of an existing tensor: `data = src->data + offset`,
`view_offs = offset`, with the row stride `nb1` chosen by the caller. Transformer code uses this to cut one fused
projection into its parts. Here a `[3*4, 5]` tensor (think: Q, K and V of 4 features each, for 5 tokens) is split
into three `[4, 5]` views without copying:"""),
    ("code", """\
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
print("K =\\n", ggml.get_data(parts["K"])[0, 0])"""),
    ("md", """\
### Reshape

`ggml_reshape_2d` keeps `data` and gives the same contiguous bytes new sizes; the strides are recomputed from the new
`ne`. It is a view too (`op = GGML_OP_RESHAPE`, `view_src = a`)."""),
    ("code", """\
r = ggml.reshape_2d(ctx, a, 3, 2)
print("a :", a.shape, a.strides)
print("r :", r.shape, r.strides, " same data:", r.data == a.data, " view_src is a:", r.view_src == a)
print(ggml.get_data(r)[0, 0])
viz.plot_arena(ctx, scale="log", max_labels=12);"""),
    ("md", """\
## 5. A quantized block: `block_q4_0`

`ggml-common.h` defines `block_q4_0` as one `ggml_half d` (the scale, an IEEE fp16) followed by `uint8_t qs[16]`:
32 four-bit numbers, two per byte. `quantize_row_q4_0_ref` picks `d = max / -8`, where `max` is the value of largest
magnitude (sign kept), stores `q = round(x/d) + 8` clamped to 0..15, and puts element `j` in the low nibble of
`qs[j]` and element `j + 16` in its high nibble. `dequantize_row_q4_0` gives back `(q - 8) * d`."""),
    ("code", """\
rng = np.random.default_rng(0)
x = rng.normal(0, 1, 32).astype(np.float32)
raw = quants.quantize_row_ref(ggml.GGML_TYPE_Q4_0, x)      # quantize_row_q4_0_ref
print(len(raw), "bytes:", raw.tobytes().hex(" "))
print(viz.hexdump(raw))
blk = quants.decode_block(ggml.GGML_TYPE_Q4_0, raw)
print("d =", blk["d"], "(fp16 bytes", raw[:2].tobytes().hex(" ") + ")")
print("qs[0] = 0x%02x -> element 0 = low nibble %d, element 16 = high nibble %d" % (raw[2], raw[2] & 15, raw[2] >> 4))
print("signed quants:", blk["quants"])"""),
    ("code", """\
y = quants.dequantize_row(ggml.GGML_TYPE_Q4_0, raw)         # dequantize_row_q4_0
err = y - x
print("x    :", x[:8])
print("y    :", y[:8])
print("max |error| = %.4f   (d/2 = %.4f)" % (np.abs(err).max(), abs(blk["d"]) / 2))
viz.q4_0_block_figure(raw, x);"""),
    ("md", """\
The sign of `d` follows the extreme value: `d = max / -8` sends that value exactly to level `-8` (stored nibble 0).
Levels run from `-8` to `+7`, so a value at the *other* end, close to `-max`, would need `+8` and is clamped to `+7`:
only such values can be off by more than `|d|/2`. The whole budget is 4.5 bits per value (18 bytes / 32 values).

Filling a `Q4_0` tensor with floats quantizes row by row, and `get_data` returns the raw block bytes:"""),
    ("code", """\
vals = rng.normal(0, 1, (6, 32)).astype(np.float32)
ggml.set_data(c, vals)                                  # quantizes each 32-value row into one block
rows = ggml.get_data(c)                                 # (ne3, ne2, ne1, row bytes) = (1, 1, 6, 18)
print(rows.shape, "row 0:", rows[0, 0, 0].tobytes().hex(" "))
print("row 1 starts", viz.element_offset(c, 0, 1), "bytes after row 0 (= nb[1])")
back = ggml.get_data_f32(c)[0, 0]
print("max |error| over the tensor: %.4f" % np.abs(back - vals).max())"""),
    ("md", """\
**Next:** `02_context_arena.ipynb` follows the arena that all these structs and bytes live in."""),
]

# --------------------------------------------------------------------------------------------------------------------
NB02 = [
    ("md", """\
# 02 · The context arena

`ggml_init` allocates one buffer, the arena, and everything created in that context goes into it, one *object*
after another: tensors (struct + data), graphs, and the work buffer of a computation. Each object starts with a
32-byte `struct ggml_object` header `{offs, size, next, type}`; the headers form a linked list from
`ctx->objects_begin` to `ctx->objects_end`. Nothing is ever freed individually: `ggml_free` drops the whole arena.

This notebook watches the arena grow, allocation by allocation, and reads the bytes back."""),
    ("code", SETUP + """
OBJ, TENSOR, ALIGN = ggml.GGML_OBJECT_SIZE, ggml.GGML_TENSOR_SIZE, ggml.GGML_MEM_ALIGN
print("sizeof(struct ggml_object) =", OBJ, " sizeof(struct ggml_tensor) =", TENSOR, " GGML_MEM_ALIGN =", ALIGN)"""),
    ("md", """\
## 1. Tensors: header + struct + data, padded to 16

`ggml_new_object` puts the new header right after the previous object and asks for `GGML_PAD(size, 16)` payload
bytes. For a tensor, `ggml_new_tensor_impl` asks for `sizeof(struct ggml_tensor) + data bytes`. So each tensor costs
`32 + PAD(336 + nbytes, 16)` bytes of arena; `ggml_used_mem` is the end of the last object."""),
    ("code", """\
ctx = ggml.init(256 * 1024)
print("fresh context:", ctx, " used_mem =", ggml.used_mem(ctx))

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
viz.Table([h[0] for h in history])"""),
    ("code", """\
fig, axes = plt.subplots(2, 1, figsize=(12, 5))
viz.plot_arena(ctx, ax=axes[0], title="linear scale: widths proportional to bytes")
viz.plot_arena(ctx, ax=axes[1], scale="sqrt", title="sqrt scale: small regions widened, ticks are real offsets")
fig.tight_layout()"""),
    ("code", "viz.arena_map(ctx)"),
    ("md", """\
## 2. The object list and a header in hex

The `next` field of each header holds the *address* of the next header (ggviz stores real addresses, like C). The
table shows it as an offset into the arena. Below, the first header's 32 bytes in hex, then decoded by hand."""),
    ("code", "viz.objects_table(ctx)"),
    ("code", """\
mem = ggml.get_mem_buffer(ctx)              # ggml_get_mem_buffer: the arena itself (zero-copy uint8 array)
print(viz.hexdump(ctx, 0, OBJ))
offs, size, nxt = mem[0:24].view(np.uint64)
otype = mem[24:28].view(np.int32)[0]
print(f"offs={offs}  size={size}  next=ctx.base+{int(nxt) - ctx.base}  type={otype} (GGML_OBJECT_TYPE_TENSOR=0)")"""),
    ("md", """\
## 3. A tensor struct read straight from the arena

The struct of tensor `w` starts at its object's `offs`. Dump its first 96 bytes, then decode all 336 bytes taken
*from the arena* (not from the Python object) and check that they say what the tensor says."""),
    ("code", """\
w = ggml.get_tensor(ctx, "w")              # ggml_get_tensor: walks the object list comparing names
o = next(o for o in ctx.objects if o.payload is w)
print(f"object header at {o.hdr_offs}, struct at {o.offs}, data at {w.data - ctx.base}")
print(viz.hexdump(ctx, o.offs, 96))"""),
    ("code", """\
table = viz.tensor_header_table(w, raw=mem[o.offs:o.offs + TENSOR])
by_field = {r["field"]: r["value"] for r in table}
assert [by_field[f"ne[{i}]"] for i in range(4)] == list(w.shape)
assert [by_field[f"nb[{i}]"] for i in range(4)] == list(w.strides)
assert by_field["data"] == w.data and by_field["name"] == "w"
table"""),
    ("md", """\
## 4. Views cost a struct, not data

A view (`ggml_view_*`, `ggml_reshape_*`, `ggml_permute`, `ggml_transpose`) is a new tensor object whose payload is
only the 336-byte struct: its `data` points into the source's bytes."""),
    ("code", """\
before = ggml.used_mem(ctx)
wt = ggml.transpose(ctx, w)
print("transpose cost", ggml.used_mem(ctx) - before, "bytes = 32 + 336;  data inside w's data:", wt.data == w.data)
viz.arena_map(ctx)[-2:]"""),
    ("md", """\
## 5. A `no_alloc` context: metadata only

With `no_alloc = true` tensors get their struct but no data (`data == NULL`): the data will live elsewhere (a backend
buffer, an mmap of the model file). This is how llama.cpp creates its weight and compute contexts; the size it asks
for is just `n_tensors * ggml_tensor_overhead()` (+ `ggml_graph_overhead()` for a graph)."""),
    ("code", """\
n = 4
meta = ggml.init(n * ggml.tensor_overhead(), no_alloc=True)
big = [ggml.new_tensor_2d(meta, ggml.GGML_TYPE_Q4_1, 576, 1536) for _ in range(n)]
print("ggml_tensor_overhead() =", ggml.tensor_overhead(), " used_mem =", ggml.used_mem(meta),
      "for", n, "tensors describing", sum(ggml.nbytes(t) for t in big), "bytes of data")
print("data pointer:", big[0].data, "(NULL)")
try:
    ggml.get_data(big[0])
except ValueError as e:
    print("get_data:", e)
viz.plot_arena(meta);"""),
    ("md", """\
## 6. The graph object

`ggml_new_graph` is one object of `ggml_graph_nbytes(2048)` bytes: the `struct ggml_cgraph`, the `nodes` and `leafs`
pointer arrays (2048 each), the use counts and the keys of the visited hash set (`ggml_hash_size(2 * 2048)` = 4099
slots, a prime), and the bitset marking used slots. The whole object, header included, is `ggml_graph_overhead()`."""),
    ("code", """\
x = ggml.get_tensor(ctx, "x")
ggml.get_data(x)[...] = np.arange(10, dtype=np.float32)
y = ggml.set_name(ggml.scale(ctx, ggml.add(ctx, x, x), 10.0), "y")   # (x + x) * 10
before = ggml.used_mem(ctx)
gf = ggml.new_graph(ctx)
print("graph object:", ggml.used_mem(ctx) - before, "bytes;  ggml_graph_overhead() =", ggml.graph_overhead())
ggml.build_forward_expand(gf, y)
print(gf, [t.name for t in gf.nodes], [t.name for t in gf.leafs])
g_rows = [r for r in viz.arena_map(ctx, detail=True) if r["kind"] == "graph" or (r["obj"] == len(ctx.objects) - 1)]
viz.Table(g_rows, ["start", "end", "size", "kind", "name", "note"])"""),
    ("md", """\
## 7. The work buffer

`ggml_graph_compute_with_ctx` calls `ggml_graph_plan`, then `ggml_new_buffer(ctx, cplan.work_size)`: one more
object, appended after everything else, even when `work_size` is 0 (then it is a bare 32-byte header). Ops that
convert their inputs need scratch space: a `Q4_0 x F32` `mul_mat` converts the F32 operand to `Q8_0` blocks there
first, so its plan asks for a work buffer."""),
    ("code", """\
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
      " float reference:", ggml.get_data_f32(q)[0, 0] @ np.ones(64, dtype=np.float32))"""),
    ("code", """\
viz.plot_arena(ctx, scale="log", max_labels=20, title="the whole arena: tensors, views, two graphs, two work buffers")
viz.objects_table(ctx)"""),
    ("md", """\
## 8. When the arena is full

The arena never grows. `ggml_new_object` asserts that the new object fits and aborts otherwise; ggviz raises an
error with the same numbers instead."""),
    ("code", """\
small = ggml.init(1024)
ggml.new_tensor_1d(small, ggml.GGML_TYPE_F32, 100)      # 32 + PAD(336 + 400) = 800 bytes: fits
try:
    ggml.new_tensor_1d(small, ggml.GGML_TYPE_F32, 100)  # another 800: does not
except ggml.ContextOutOfMemory as e:
    print(e)
ggml.free(small); ggml.free(meta); ggml.free(ctx)"""),
]


# --------------------------------------------------------------------------------------------------------------------
# 00 · quickstart
NB00 = [
    ("md", """\
# 00 · Quickstart: a language model, run the ggml way

ggviz runs **SmolLM2-135M-Instruct** (a llama-architecture model, 30 layers, weights quantized to Q4_1) with a
Python/NumPy mirror of **ggml** and **llama.cpp**: the same data structures, the same functions, the same order of
operations, only slow enough to watch. This notebook runs it end to end, then opens three windows onto what happened:

1. generate a few tokens (`ggviz.generate`, the `llama-simple` loop);
2. the compute graph of one decode step;
3. the memory: the model file, the KV cache, the compute buffer.

> **Teacher note.** Everything below is a real run: the numbers come from the model file, not from a drawing.
> The other notebooks zoom in: 01–02 tensors and the context arena, 03 the graph, 06 the threadpool,
> 07 one decode step from text to token. `ggviz report` writes the same walkthrough as one HTML page."""),
    ("code", """\
import shutil
import numpy as np
import ggviz
from ggviz import llama, viz
from ggviz.run import load_model

model = load_model()            # llama_model_load_from_file: parse the GGUF, map the weights, build the vocabulary
hp = model.hparams
print(model.desc(), f"| {hp.n_layer} layers, n_embd={hp.n_embd}, n_head={hp.n_head} (kv {hp.n_head_kv}), "
      f"n_vocab={hp.n_vocab}, {model.n_params() / 1e6:.0f} M parameters, {model.size() / 2**20:.0f} MiB")"""),
    ("md", """\
## 1. Generate

`ggviz.generate` does what llama.cpp's `llama-simple` example does with the llama.h API: `llama_tokenize` the
prompt, `llama_decode` it as one batch, then repeat *sample a token → decode that one token* until `n_predict`.
Greedy sampling (the most likely token each time) makes the output reproducible."""),
    ("code", """\
g = ggviz.generate("The ggml library is", n_predict=8, model=model, threads=2, n_ctx=256)
print(g.prompt + g.text)
print()
print(g.timings())"""),
    ("code", """\
vocab = llama.model_get_vocab(model)
print("prompt tokens :", [(t, vocab.token_to_piece(t, True).decode()) for t in g.prompt_tokens])
print("new tokens    :", [(t, vocab.token_to_piece(t, True).decode()) for t in g.tokens])"""),
    ("md", """\
## 2. The graph of one decode step

Each `llama_decode` builds a **compute graph** (`llm_build_llama`): a DAG of ggml operations from the token id to
the 49152 logits. For one token it has 1086 nodes. Drawn with one box per layer it fits on a screen; the widget
below opens a layer when you click its box (`GraphView`)."""),
    ("code", """\
from ggviz.export import decode_graph, graph_dot

res = decode_graph(model)          # llama_context::build_graph for n_tokens = 1 (built, not computed)
gf = res.gf
print(gf, "| first nodes:", [t.name for t in gf.nodes[:6]], "| last:", gf.nodes[-1].name)
graph_dot(gf) if shutil.which("dot") else print("graphviz's dot is missing: no picture")"""),
    ("code", """\
from ggviz.viz.widgets import GraphView

view = GraphView(gf)
view.expand(0)                     # layer 0 opened up: the attention block, then the feed-forward block
view"""),
    ("md", """\
## 3. Memory

Three kinds of memory take part in a decode:

* the **weights**: mapped from the GGUF file (never copied); the file map shows where each tensor's bytes are;
* the **KV cache**: K and V of every token seen so far, per layer;
* the **compute buffer**: the graph's intermediate results, placed by the graph allocator, which reuses memory
  as soon as a result is no longer needed."""),
    ("code", """\
from ggviz.viz.widgets import GGUFMapWidget

GGUFMapWidget(model.gguf, selected="blk.0.attn_q.weight")"""),
    ("code", """\
import matplotlib.pyplot as plt
from ggviz.export import decode_step

step = decode_step("The ggml library is", threads=2, model=model, record=False)   # prompt + one decode step
kv = step.ctx.kv
fig, ax = plt.subplots(figsize=(13, 2.2))
viz.plot_arena(kv.ctx, ax=ax, scale="sqrt", max_labels=12,
               title=f"KV cache context: {len(kv.k_l)} K and {len(kv.v_l)} V tensors of {kv.size} cells, "
                     f"{kv.ctx.used_mem():,} bytes; {kv.cells.used} cells used")
plt.show()
from ggviz.ggml import alloc
galloc = step.ctx.sched.galloc if hasattr(step.ctx, "sched") else step.ctx._galloc   # the graph allocator
plan = galloc.last_alloc
total = sum(t["size"] for t in plan["tensors"] if t["offset"] is not None and not t["view_src"])
buf = sum(alloc.gallocr_get_buffer_size(galloc, i) for i in range(galloc.n_buffers))
print(f"compute buffer: {len(plan['tensors'])} tensors placed for a {plan['n_nodes']}-node graph; "
      f"sum of their sizes {total:,} bytes, in a buffer of {buf:,} bytes")"""),
    ("md", """\
> **Teacher note.** The compute buffer is tiny next to the sum of the tensors it holds: `ggml_gallocr` frees a
> tensor after its last consumer and hands the bytes to the next node (often *in place*). Notebook 04 (the
> allocator) shows the plan tensor by tensor. Next: **03 · the compute graph**."""),
]

# --------------------------------------------------------------------------------------------------------------------
# 03 · the compute graph
NB03 = [
    ("md", """\
# 03 · The compute graph: nodes, leafs, and the order of evaluation

ggml never computes while you *describe* a computation. `ggml_add(ctx, a, b)` only creates a tensor with
`op = GGML_OP_ADD` and `src = {a, b}`. `ggml_build_forward_expand(gf, out)` then walks the sources of `out`
depth-first (`ggml_visit_parents`) and fills two lists of the `ggml_cgraph`:

* **nodes**: tensors with an op, in an order where every source comes before its consumers: the order the CPU
  backend will compute them;
* **leafs**: tensors without an op (weights, inputs, constants): their data must be there before computing.

A hash set (`visited_hash_set`) remembers which tensors were already visited, so a tensor read by several nodes is
added once; `use_counts` counts its readers. This notebook records the walk (`graph.visit` / `graph.add` trace
events), replays it, and then looks at the 1086-node graph of one decode step."""),
    ("code", """\
import shutil
import numpy as np
from ggviz import ggml, trace, viz

ctx = ggml.init(4 * 1024 * 1024)
x = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4), "x")
W = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 4, 4), "W")
b = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4), "b")
u = ggml.set_name(ggml.mul_mat(ctx, W, x), "u")        # u = W x
v = ggml.set_name(ggml.mul(ctx, u, u), "v")            # v = u * u   (u read twice)
z = ggml.set_name(ggml.add(ctx, v, b), "z")            # z = v + b
out = ggml.set_name(ggml.add(ctx, z, u), "out")        # out = z + u (u read a third time)

with trace.Recorder(kinds=["graph.visit", "graph.add"]) as rec:
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, out)
print("nodes:", [t.name for t in gf.nodes])
print("leafs:", [t.name for t in gf.leafs])"""),
    ("md", """\
## The walk, event by event

`ggml_visit_parents(cgraph, node)`: if `node` is in the hash set, stop (a **hit**); otherwise insert it, visit
`src[0]`, `src[1]`, ... recursively, and only *then* append `node` to `nodes` (or to `leafs` if it has no op).
Appending after the sources is what makes the list a valid evaluation order (a post-order DFS)."""),
    ("code", """\
rows = []
for k, e in enumerate(rec.events):
    if e["kind"] == "graph.visit":
        what = "hit: already in the graph" if e["hit"] else "visit: insert into the hash set"
    else:
        what = f"append to {e['kind_']}s[{e['index']}]"
    rows.append({"step": k, "tensor": e["name"], "hash slot": e["hash_pos"], "what": what})
viz.Table(rows, title="ggml_visit_parents, recorded")"""),
    ("code", """\
from collections import Counter
hits = Counter(e["name"] for e in rec.events if e["kind"] == "graph.visit" and e["hit"])
print(f"{len(rec.of('graph.visit'))} visits, {sum(hits.values())} of them hash-set hits: {dict(hits)}")
print("use counts:", {t.name: gf.use_count(t) for t in list(gf.nodes) + list(gf.leafs)})
assert gf.use_count(u) == 3 and hits == {"u": 2, "W": 2, "x": 2}"""),
    ("md", """\
`u` has three readers (`v` twice, through `src[0]` and `src[1]`, and `out`), so its use count is 3, and the walk
met it three times: one visit, two hits. Why are `W` and `x` hit too? On a hit, `ggml_visit_parents` still walks
into the sources that are not yet flagged `GGML_TENSOR_FLAG_COMPUTE` ("update the compute flag regardless"), and a
leaf never gets that flag, so `u`'s leafs are met again each time. The graph allocator (notebook 04) uses the use
counts to know when `u`'s memory can be reused. Step through the walk with the widget (each click: one event; the
hash set on the right):"""),
    ("code", """\
from ggviz.viz.widgets import VisitAnimation

anim = VisitAnimation(rec, gf)
anim.goto(5)
anim"""),
    ("md", """\
## The graph of one decode step

Now the real thing: the graph `llama_decode` builds for one new token (`llm_build_llama`). We record its
construction the same way."""),
    ("code", """\
from collections import Counter
from ggviz.run import load_model
from ggviz.export import decode_graph, graph_dot

model = load_model()
with trace.Recorder(kinds=["graph.visit", "graph.add"]) as rec_dec:
    res = decode_graph(model)
gfd = res.gf
visits = [e for e in rec_dec.events if e["kind"] == "graph.visit" and e["graph"] == ggml.graph_key(gfd)]
print(f"{gfd.n_nodes} nodes, {gfd.n_leafs} leafs; ggml_visit_parents entered {len(visits)} times, "
      f"{sum(e['hit'] for e in visits)} hash-set hits")
print("ops:", dict(Counter(ggml.op_desc(t).split(' ')[0] for t in gfd.nodes).most_common()))
for name in ("inp_pos", "attn_inp_kq_mask", "token_embd.weight", "blk.0.attn_q.weight"):
    leafs = [t for t in gfd.leafs if t.name == name]
    readers = [[n.name for n in gfd.nodes if any(s is t for s in n.src)] for t in leafs]
    print(f"{name!r}: {len(leafs)} leaf(s), use counts {[gfd.use_count(t) for t in leafs]}, "
          f"read by {[r[:3] + (['...'] if len(r) > 3 else []) for r in readers]}")"""),
    ("md", """\
> **Teacher note.** `inp_pos` is read by 60 ROPE nodes (Q and K of 30 layers), the mask by 30 softmaxes. This
> model ties its output head to the token embeddings: llama.cpp loads `token_embd.weight` a second time as the
> output matrix (`TENSOR_DUPLICATED`), so the graph has two leafs of that name, one read by the first GET_ROWS
> (the embedding), one by the last MUL_MAT (the logits). Views (RESHAPE, VIEW, PERMUTE, TRANSPOSE) are nodes too, but they compute nothing: they are a
> new header over the same bytes.

Collapsed per layer, the graph is a chain of 30 identical blocks; below it, layer 0 opened:"""),
    ("code", """\
graph_dot(gfd) if shutil.which("dot") else print("graphviz's dot is missing")"""),
    ("code", """\
from ggviz.viz.widgets import GraphView

view = GraphView(gfd)
view.expand(0)
view"""),
]

# --------------------------------------------------------------------------------------------------------------------
# 06 · the threadpool
NB06 = [
    ("md", """\
# 06 · The CPU threadpool: plan, threads, barriers, chunks

How does ggml's CPU backend spread one graph over several threads?

1. **plan** (`ggml_graph_plan`): for every node, how many threads can share it (`ggml_get_n_tasks`) and how much
   scratch memory it needs; the work buffer is the largest need (plus a cache line per thread);
2. **compute** (`ggml_graph_compute`): all threads walk the node list together; for each node every thread calls
   the kernel with its index `ith` of `nth`, then waits in `ggml_barrier` for the others;
3. **chunks**: mul_mat does not split its rows by `ith` once and for all; threads *claim* chunks of rows from a
   shared counter (`current_chunk`), so a thread that finishes early takes more work.

Every timeline below is recorded from a real decode step (the `cpu.node`, `cpu.chunk` and `cpu.barrier` events)."""),
    ("code", """\
import json
import tempfile
import numpy as np
from collections import defaultdict
from ggviz import ggml, viz
from ggviz.ggml.cpu import ggml_cpu
from ggviz.run import load_model
from ggviz.export import decode_graph, decode_step, chrome_trace

model = load_model()
gf = decode_graph(model).gf        # the graph of one decode step, built (not computed)"""),
    ("md", """\
## 1. The plan for 1 to 4 threads"""),
    ("code", """\
rows = {}
for node in gf.nodes:
    op = ggml.op_desc(node).split(" ")[0]
    r = rows.setdefault(op, {"op": op, "nodes": 0})
    r["nodes"] += 1
    for n in (1, 2, 3, 4):
        nt = ggml_cpu.get_n_tasks(node, n)                   # ggml_get_n_tasks
        r[f"n_tasks@{n}"] = max(r.get(f"n_tasks@{n}", 0), nt)
        r[f"work@{n}"] = max(r.get(f"work@{n}", 0), ggml_cpu._work_size(node, nt, n))
viz.Table(sorted(rows.values(), key=lambda r: -r["nodes"]), title="per op: the most threads and work bytes any node asks")"""),
    ("code", """\
for n in (1, 2, 3, 4):
    p = ggml_cpu.graph_plan(gf, n)                           # ggml_graph_plan
    print(f"{n} thread(s): plan.n_threads = {p.n_threads}, work_size = {p.work_size:,} bytes")"""),
    ("md", """\
> **Teacher note.** Views have `n_tasks = 1` (nothing to do); a softmax gets at most one thread per row. The work
> buffer is small: a mul_mat converts its F32 input vector to the weights' dot-product type (q8 blocks) once, and
> ROPE/SOFT_MAX need one row of scratch per thread.

## 2. A real compute, thread by thread"""),
    ("code", """\
step = decode_step("The ggml library is", threads=2, model=model)   # prompt, then one recorded decode step
tl = step.timeline                                                    # ggviz.trace.ComputeTimeline
c = tl.last
print(f"{c['n_nodes']} nodes on {c['n_threads']} threads, {(c['t_end'] - c['t_start']) / 1e6:.1f} ms")
rows = []
for ith, lane in c["threads"].items():
    rows.append({"thread": ith, "node calls": len(lane["nodes"]),
                 "in kernels (ms)": round(sum(s["t_end"] - s["t_start"] for s in lane["nodes"]) / 1e6, 1),
                 "barriers": len(lane["barriers"]),
                 "waiting (ms)": round(sum(b["t_exit"] - b["t_enter"] for b in lane["barriers"]) / 1e6, 1),
                 "chunks claimed": len(lane["chunks"])})
viz.Table(rows)"""),
    ("code", """\
from ggviz.viz.widgets import ThreadTimeline

tt = ThreadTimeline(step.events, window=40)
tt.select(next(i for i, t in enumerate(gf.nodes) if t.name == "ffn_up-0"))
tt"""),
    ("md", """\
## 3. Barrier waits and chunk claims

A barrier wait is time a thread had nothing to do because another thread was still busy with the same node. Where
did the threads wait the most?"""),
    ("code", """\
wait = defaultdict(float)
for ith, lane in c["threads"].items():
    for b in lane["barriers"]:
        wait[b["name"]] += (b["t_exit"] - b["t_enter"]) / 1e3
top = sorted(wait.items(), key=lambda kv: -kv[1])[:8]
viz.Table([{"after node": k, "waiting, all threads (µs)": round(v)} for k, v in top])"""),
    ("code", """\
name = "ffn_up-0"
claims = []
for ith, lane in c["threads"].items():
    for ch in lane["chunks"]:
        if ch["node"] == name:
            claims.append({"thread": ith, "chunk": ch["chunk"], "rows": f"{ch['ir0'][0]}..{ch['ir0'][1] - 1}",
                           "t (µs)": round((ch["t_start"] - c["t_start"]) / 1e3, 1)})
claims.sort(key=lambda r: r["t (µs)"])
print(f"{name}: {len(claims)} chunks of rows, claimed in this order:")
viz.Table(claims)"""),
    ("md", """\
> **Teacher note.** Each thread starts with chunk `ith`; the shared counter then hands out the next chunk to
> whichever thread asks first: dynamic load balancing. Here the threads are Python threads sharing one interpreter
> lock, so often one thread takes most chunks before the other gets going; in C the claims interleave.

The whole timeline also exports as a Chrome trace-event file (`ggviz trace -o trace.json` does this from the
command line); open it in https://ui.perfetto.dev to zoom and pan:"""),
    ("code", """\
doc = chrome_trace(step)
path = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
with open(path, "w") as f:
    json.dump(doc, f)
kinds = defaultdict(int)
for e in doc["traceEvents"]:
    kinds[(e["ph"], e.get("cat"))] += 1
print(path, dict(kinds))"""),
]

# --------------------------------------------------------------------------------------------------------------------
# 07 · the decode walkthrough
NB07 = [
    ("md", """\
# 07 · One decode, step by step

The classroom walkthrough of one `llama_decode`: from the prompt's text to the next token, through every stage
llama.cpp goes through, with the values the model really computed.

1. tokenize (`llama_tokenize`, byte-pair encoding);
2. embeddings: each token's row of `token_embd.weight`;
3. layer 0, node by node, values copied out by the eval callback (`cb_eval`);
4. attention: which earlier tokens each head looks at;
5. logits → sampler → the chosen token;
6. and round again: the chosen token is decoded alone, using the KV cache."""),
    ("code", """\
import numpy as np
from ggviz import ggml, llama, viz
from ggviz.run import load_model, make_sampler
from ggviz.viz import model_views as MV

model = load_model()
vocab = llama.model_get_vocab(model)
prompt = "The ggml library is"
piece = lambda t: vocab.token_to_piece(int(t), True).decode("utf-8", "replace")"""),
    ("md", """\
## 1. Tokenize

`llama_tokenize` cuts the text into words with the pre-tokenizer's regex, writes each byte as a printable symbol
(a space becomes `Ġ`) and runs **byte-pair encoding** on each word: repeatedly merge the adjacent pair with the
lowest rank in `tokenizer.ggml.merges` until no pair is in the list. A BOS token is put first only when the model
asks for it (`tokenizer.ggml.add_bos_token`)."""),
    ("code", """\
ids = llama.tokenize(vocab, prompt, add_special=True, parse_special=True)
print(ids, [piece(t) for t in ids], "| add_bos:", vocab.add_bos)
MV.bpe_table(vocab, " library")"""),
    ("md", """\
## 2 and 3. One decode, node by node

`DecodeStepper` runs `llama_decode` on the prompt (one batch of 6 tokens) with llama.cpp's eval callback asking for
**every** node: the scheduler then computes the graph one node at a time, and the callback copies each result before
a later node can reuse its memory. Stepping is free afterwards. Node 0 is the embedding lookup: `GET_ROWS` picks
each token's row of `token_embd.weight` (dequantizing Q8_0 to F32)."""),
    ("code", """\
from ggviz.viz.widgets import DecodeStepper

st = DecodeStepper(prompt, tokens=ids, model=model)
print(f"{st.n_steps} nodes recorded in {st.decode_s:.1f} s")
emb = ggml.get_data_f32(model.tok_embd).reshape(model.hparams.n_vocab, -1)[ids]
s0 = st.goto(0).state()
print(s0["name"], s0["op"], s0["ne"], "== the tokens' rows of token_embd.weight:",
      np.allclose(st.values().reshape(len(ids), -1), emb))"""),
    ("md", """\
> **Teacher note.** Layer 0 then runs, in this order: `norm-0` (RMS_NORM: divide by the root mean square),
> `attn_norm-0` (MUL by the learned weights), `Qcur-0`/`Kcur-0`/`Vcur-0` (three MUL_MATs with Q4_1 weights),
> ROPE on Q and K (a rotation by the position), SET_ROWS into the KV cache, `kq-0` (K·Q per head),
> `kq_soft_max-0`, `kqv-0` (weights · V), `attn_out-0`, the residual ADD `ffn_inp-0`, the feed-forward block
> (`ffn_norm`, gate and up, SWIGLU, down) and the second residual `l_out-0`. Step with the buttons, or jump by
> name:"""),
    ("code", """\
rows = []
for name in ["norm-0", "attn_norm-0", "Qcur-0", "kq-0", "kq_soft_max-0", "kqv_out-0", "ffn_inp-0", "ffn_swiglu-0",
             "l_out-0"]:
    s = st.goto(name).state()
    rows.append({"node": s["index"], "name": s["name"], "op": s["op"], "ne": s["ne"],
                 "min": s["stats"]["min"], "max": s["stats"]["max"], "mean": s["stats"]["mean"]})
viz.Table(rows, title="layer 0 of one decode (first node of each name)")"""),
    ("code", """\
st.goto("attn_norm-0")
st"""),
    ("md", """\
## 4. Attention in layer 0

The eval callback can also ask for just the softmax nodes (`capture_attention`): for each head, how much each token
attends to each earlier token. Rows are queries, columns the KV cells; the causal mask leaves the upper triangle
empty."""),
    ("code", """\
cp = llama.context_default_params()
cp.n_ctx, cp.n_threads, cp.n_threads_batch = 256, 2, 2
ctx = llama.init_from_model(model, cp)
att = MV.capture_attention(ctx, ids, layers=[0])          # this is the decode of the prompt on ctx
MV.attention_figure(att, 0);"""),
    ("md", """\
> **Teacher note.** 9 query heads share 3 K/V heads (grouped-query attention). Heads differ: some put most of their
> weight on the first token (an "attention sink"), others on the token itself or the one before.

## 5. Logits → sampler → token

The last node, `result_output`, gives one logit per vocabulary entry, for the last token only (the batch's output).
`llama_sampler_sample` runs a chain of samplers over them: top-k, top-p, min-p, temperature, then a seeded random
draw."""),
    ("code", """\
logits = llama.get_logits_ith(ctx, -1)
# the stepper's decode (cut into 1086 one-node computes) and this one (cut at the 30 softmaxes) pick the same token
assert int(np.argmax(logits)) == int(np.argmax(st.logits))
print(f"max |logits - stepper's logits| = {np.abs(logits - st.logits).max():.3g}")
chain = make_sampler(temp=0.8, seed=1234)             # top_k 40 -> top_p 0.95 -> min_p 0.05 -> temp -> dist
nxt = llama.sampler_sample(chain, ctx, -1)
print(f"chosen: {nxt} {piece(nxt)!r} (greedy: {piece(int(np.argmax(logits)))!r}); text: {prompt + piece(nxt)!r}")
MV.sampler_figure(chain.history, vocab);"""),
    ("md", """\
## 6. Round again: decode the chosen token

The chosen token is the next batch, of one token. Its K and V go into the next free KV cell; the earlier tokens' K
and V are already there, so nothing of the prompt is recomputed. The mask lets it see every earlier cell."""),
    ("code", """\
with MV.capture_inputs(ctx) as snaps:
    assert llama.decode(ctx, llama.batch_get_one([nxt])) == 0
MV.kv_cache_figure(snaps[-1], vocab);"""),
    ("md", """\
> **Teacher note.** This loop (sample, decode one token, repeat) is `ggviz.generate` (notebook 00) and llama.cpp's
> `llama-simple`. `ggviz report` writes this walkthrough, for one such single-token step, as a standalone web
> page."""),
]


def build(cells, name: str):
    nb = new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    for i, (kind, src) in enumerate(cells):
        c = new_markdown_cell(src) if kind == "md" else new_code_cell(src)
        c["id"] = f"{name[:2]}-{i:02d}"
        nb.cells.append(c)
    return nb


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from nb_machinery import NB04, NB05  # noqa: E402  (notebooks 04/05: allocator, backends and scheduler)

NOTEBOOKS = {"00_quickstart.ipynb": NB00, "01_tensors_and_views.ipynb": NB01, "02_context_arena.ipynb": NB02,
             "03_cgraph.ipynb": NB03, "04_allocator.ipynb": NB04, "05_backends_and_scheduler.ipynb": NB05,
             "06_threadpool.ipynb": NB06, "07_decode_walkthrough.ipynb": NB07}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = ap.parse_args(argv)
    NB_DIR.mkdir(exist_ok=True)
    bad = 0
    for fname, cells in NOTEBOOKS.items():
        text = nbformat.writes(build(cells, fname), version=4) + "\n"
        path = NB_DIR / fname
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                print(f"{path} is out of date: run python tools/make_notebooks.py", file=sys.stderr)
                bad += 1
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
