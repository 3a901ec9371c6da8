"""The cells of notebooks/04_allocator.ipynb and notebooks/05_backends_and_scheduler.ipynb.

tools/make_notebooks.py writes (or --check's) them with the other notebooks; this module only holds their source.
Each notebook runs top to bottom (cwd = notebooks/) in well under a minute on two cores.
"""
from __future__ import annotations

# --------------------------------------------------------------------------------------------------------------------
NB04 = [
    ("md", """\
# 04 · The graph allocator (ggml-alloc)

A graph built in a `no_alloc` context is only a description: no tensor has memory yet. ggml-alloc gives it memory,
with three allocators (`ggml-alloc.c`):

* **`ggml_tallocr`**, a bump allocator: every tensor gets the next aligned offset of one buffer, nothing is ever freed.
  `ggml_backend_alloc_ctx_tensors_from_buft` uses it for weights and the KV cache;
* **`ggml_dyn_tallocr`**, a *planning* allocator: best-fit over a list of free blocks, merging neighbours on free; it
  only records how big the buffer would have to be;
* **`ggml_gallocr`**, the graph allocator: walks the graph in execution order, gives each node memory just before
  it runs and frees its parents after their last consumer, writing a result **in place** over a dying parent when
  the op allows it.

This notebook: (1) tallocr vs gallocr on a small graph, (2) the allocation of one SmolLM2 decode, (3) reserve vs
alloc, and when ggml plans again (`needs_realloc`)."""),
    ("code", """\
import numpy as np
from ggviz import ggml, llama, trace, viz
from ggviz.ggml import alloc, backend
from ggviz.viz.widgets.alloc_view import AllocatorView

cpu_buft = backend.backend_cpu_buffer_type()      # ggml_backend_cpu_buffer_type(): host memory, 32-byte alignment
F32 = ggml.GGML_TYPE_F32"""),
    ("md", """\
## 1. A small graph: weights with a tallocr, activations with a gallocr

The weights go in their own context, placed in one buffer by `ggml_backend_alloc_ctx_tensors_from_buft`, which runs
a `ggml_tallocr` over the context's tensors (`ggml_tallocr_alloc`: offset += padded size). The trace event
`alloc.tallocr` shows each placement."""),
    ("code", """\
wctx = ggml.init(8 * ggml.tensor_overhead(), no_alloc=True)
w1 = ggml.set_name(ggml.new_tensor_2d(wctx, F32, 64, 256), "w1.weight")
b1 = ggml.set_name(ggml.new_tensor_1d(wctx, F32, 256), "b1.bias")
w2 = ggml.set_name(ggml.new_tensor_2d(wctx, F32, 256, 64), "w2.weight")
with trace.recording(["alloc.tallocr"]) as rec:
    wbuf = alloc.backend_alloc_ctx_tensors_from_buft(wctx, cpu_buft)
viz.Table([{k: e[k] for k in ("name", "offset", "size")} for e in rec.events],
          title=f"ggml_tallocr_alloc into one {backend.backend_buffer_get_size(wbuf)}-byte buffer")"""),
    ("md", """\
The activations: a tiny MLP block on 8 tokens. `x` is a graph input (`ggml_set_input`), `probs` a graph output
(`ggml_set_output`); `res_T` is a transpose, a *view* that owns no bytes."""),
    ("code", """\
gctx = ggml.init(1 << 20, no_alloc=True)
x = ggml.set_name(ggml.new_tensor_2d(gctx, F32, 64, 8), "x")
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
print("nodes:", [t.name for t in gf.nodes])
print("leafs:", [t.name for t in gf.leafs])"""),
    ("md", """\
**Without reuse** every tensor keeps its own bytes for the whole run: that is what a tallocr over this context would
need (`ggml_backend_alloc_ctx_tensors_from_buft_size`). **With the gallocr**, `ggml_gallocr_reserve` plans the graph
and allocates exactly the high-water mark of the plan (`ggml_gallocr_get_buffer_size`); `ggml_gallocr_alloc_graph`
then gives every tensor its planned address."""),
    ("code", """\
no_reuse = alloc.backend_alloc_ctx_tensors_from_buft_size(gctx, cpu_buft)
galloc = alloc.gallocr_new(cpu_buft)                     # ggml_gallocr_new(buft)
assert alloc.gallocr_reserve(galloc, gf)                 # ggml_gallocr_reserve: plan + allocate the buffer
assert alloc.gallocr_alloc_graph(galloc, gf)             # ggml_gallocr_alloc_graph: place the tensors
with_reuse = alloc.gallocr_get_buffer_size(galloc, 0)
print(f"without reuse (tallocr): {no_reuse} bytes;  gallocr: {with_reuse} bytes ({no_reuse / with_reuse:.1f}x less)")"""),
    ("code", """\
av = AllocatorView(galloc, gf)           # the plan, from galloc.last_alloc
av.select(5)                             # node 5, "res": writes over "down" in place
av"""),
    ("md", """\
> **Teacher note.** Read the chart left to right (execution order). Each rectangle is one tensor's bytes from the
> node that allocates it (`ggml_gallocr_allocate_node`) to the node after which its last consumer has run
> (`ggml_gallocr_free_node`, when `n_children` drops to 0). Orange arrows are **in-place hand-overs**: `up_b`, `act`,
> `res` and `probs` are element-wise ops (`ggml_op_can_inplace`) whose parent dies at that very node, so the result
> is written over it. `x` (an input, placed before node 0) stays alive until `res` has read it. The transpose `res_T`
> gets no bytes: `ggml_backend_view_init` points it into `res`. `probs` is an output: never freed, so nothing can
> overwrite it before you read it."""),
    ("code", """\
sel = av.state()["selected"]
print(f"node {sel['node']} {sel['name']}: {sel['alive_bytes']} bytes alive;",
      "handed over:", [(r["name"], "->", r["to"]) for r in sel["handed_over"]])
viz.Table(sel["alive"], title="alive at node 5")"""),
    ("md", """\
## 2. The compute buffer of a SmolLM2 context, and one decode in it

When llama.cpp creates a context it reserves the compute buffers for the worst case (`sched_reserve`): it builds
the graph of a full prompt batch (`min(n_ctx, n_ubatch)` tokens, all of them outputs, attending the whole KV cache),
then a one-token graph, then the full batch again, and calls `ggml_backend_sched_reserve` on each. ggviz does the
same and prints llama.cpp's log lines; the sizes are byte-equal to llama.cpp's (tests/test_reserve.py).

A later `llama_decode` builds the graph of its batch and hands it to the scheduler: `ggml_backend_sched_alloc_graph`
splits it over the backends (notebook 05) and runs `ggml_gallocr_alloc_graph` on the scheduler's copy of the graph,
one buffer per backend. BLAS and the CPU share the CPU buffer type, so here there is one compute buffer. The
one-token graph has as many nodes as the reserved one, so gallocr keeps the worst-case plan and puts each tensor in
its reserved slot: no new plan, no new buffer.

One token, after the BOS token of a prompt:"""),
    ("code", """\
from ggviz.run import load_model

model = load_model(use_extra_bufts=False)             # weights stay in the file's mapping (a plain CPU build)
cp = llama.context_default_params()
cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.flash_attn_type = 256, 2, 2, 0
ctx = llama.init_from_model(model, cp)                  # reserves: pp 256 tokens, tg 1 token, pp again
print(ctx.compute_buffer_log())
size0 = alloc.gallocr_get_buffer_size(ctx.sched.galloc, 0)
vocab = llama.model_get_vocab(model)
bos = llama.tokenize(vocab, "The", add_special=True, parse_special=True)[0]
with trace.recording(["alloc.reserve"]) as rec_dec:
    assert llama.decode(ctx, llama.batch_get_one([bos])) == 0
print(f"after the decode: buffer {alloc.gallocr_get_buffer_size(ctx.sched.galloc, 0)} bytes (was {size0}); "
      f"new plans made by the decode: {len(rec_dec.events)}")
dv = AllocatorView(ctx.sched.galloc, ctx.sched.graph)   # the plan of sched->galloc for sched->graph
s = dv.state()
print(f"{s['n_rects']} tensors in a {s['buffer_size']}-byte buffer ({s['sum_sizes']} bytes without reuse); "
      f"{s['n_reused']} written in place over a parent; {s['n_views']} views into it, "
      f"{s['n_external_views']} into the KV cache; never freed: {s['never_freed']}")"""),
    ("code", """\
dv.figure();"""),
    ("md", """\
> **Teacher note.** The slots are the worst case's: `result_output` was planned for 256 tokens of 49152 logits
> (50 MB, nearly all of the buffer), so the offset axis is broken above the rest. The one-token decode writes only
> the start of each slot. The thirty layers look alike: the plan gives every layer the same offsets. The residual stream
> lives in two slots: `ffn_inp-l` (the first residual ADD, written in place over `attn_out-l`) and `l_out-l` (the
> second, in place over `ffn_out-l`), at the same two offsets in every layer. The graph inputs (`inp_pos`, the KV
> indices, the mask) stay alive until their last reader in layer 29. Zoom into layer 0:"""),
    ("code", """\
dv.set_range(0, 40).select("kq-0")
dv"""),
    ("md", """\
## 3. Reserve vs alloc, and when ggml plans again

llama.cpp calls `ggml_backend_sched_reserve` when it creates a context, with a worst-case graph (a full batch), so
that a later decode never needs a bigger buffer. `ggml_gallocr_alloc_graph` first asks
`ggml_gallocr_needs_realloc`: same number of nodes and leafs, and every tensor no larger than the slot planned for
it? Then the old plan is reused as is. Otherwise, with a single buffer, it plans again (`ggml_gallocr_reserve`),
growing the buffer if needed.

Below: a standalone gallocr over the CPU buffer type, on two decode graphs of the same model (32 tokens and 1
token; the weights and the KV cache already have their buffers, so the gallocr only plans the activations)."""),
    ("code", """\
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
print(f"reserve(32 tokens): {size_reserved} bytes; the 1-token graph fits that plan: {fits}; "
      f"buffer now {alloc.gallocr_get_buffer_size(ga, 0)} bytes; re-plans: {len(rec1.of('alloc.reserve')) - 1}")

# the other way round: plan for 1 token, then allocate 32
ga2 = alloc.gallocr_new(cpu_buft)
big2, small2 = decode_graph(32), decode_graph(1)
with trace.recording(events) as rec2:
    alloc.gallocr_reserve(ga2, small2)
    size_small = alloc.gallocr_get_buffer_size(ga2, 0)
    assert alloc.gallocr_alloc_graph(ga2, big2)
viz.Table([{"event": e["kind"], "reason": e.get("reason"), "chunk sizes": e.get("chunk_sizes"),
            "reallocated (buffer, old, new)": e.get("reallocated")} for e in rec2.events],
          title=f"reserve(1 token) = {size_small} bytes, then alloc_graph(32 tokens)")"""),
    ("md", """\
> **Teacher note.** With the worst case reserved first, the small graph is placed into the big plan: offsets come
> from the 32-token plan, nothing is planned again (`needs_realloc` is false: every 1-token tensor is smaller than
> its slot). In the other order, the first 32-token tensor larger than its slot (`node embd is not valid`) makes
> `ggml_gallocr_alloc_graph` call `ggml_gallocr_reserve` itself ("reallocating buffers automatically"): a new plan
> and a larger buffer, the old one freed. That is why llama.cpp reserves first: no reallocation in the middle of
> generation. (A scheduler with several buffers cannot re-plan by itself: `ggml_backend_sched_alloc_splits` calls
> `ggml_gallocr_reserve_n` when `alloc_graph` fails or the backend assignment changed.)"""),
    ("code", """\
AllocatorView(ga2, big2, title="the re-plan made by alloc_graph for 32 tokens").set_range(0, 40).figure();"""),
]

# --------------------------------------------------------------------------------------------------------------------
NB05 = [
    ("md", """\
# 05 · Backends and the scheduler

ggml runs a graph on several pieces of hardware at once through `ggml_backend_sched`. This notebook goes from the
bottom up:

1. the **registry** of backend libraries → their **devices** → a **backend** (a stream on a device) and its
   **buffer types**;
2. a small graph on a simulated accelerator (`ACCEL0`, which has its own memory and cannot compute `RMS_NORM`) plus
   the CPU: the scheduler's five passes, step by step, with the cause of every decision, then the splits and the
   copies between them;
3. SmolLM2 decoding with `-ngl 0 / 10 / 31`: how many splits and copies;
4. BLAS taking a prompt's matrix multiplications.

`ACCEL0` does not exist in ggml: it stands in for a GPU backend (CUDA, Metal, Vulkan ...) on a laptop. It computes
with the CPU kernels, but on memory the CPU backend may not touch."""),
    ("code", """\
import numpy as np
from ggviz import ggml, llama, trace, viz
from ggviz.ggml import accel, alloc, backend, blas
from ggviz.ggml import sched as S
from ggviz.viz.widgets.sched_view import STAGES, SchedulerView

TYPES = {backend.GGML_BACKEND_DEVICE_TYPE_CPU: "CPU", backend.GGML_BACKEND_DEVICE_TYPE_GPU: "GPU",
         backend.GGML_BACKEND_DEVICE_TYPE_ACCEL: "ACCEL"}
F32 = ggml.GGML_TYPE_F32"""),
    ("md", """\
## 1. Registry → devices → backends, buffer types

`ggml_backend_reg_count` / `ggml_backend_reg_get`: the backend libraries compiled in (ggviz: BLAS and the CPU).
`ggml_backend_load("accel")` adds one at run time, as `ggml_backend_load_all` does with shared libraries. Each reg
has devices (`ggml_backend_dev_get`), each device a type, memory and a default **buffer type** (a kind of memory:
alignment, maximum size, host or not)."""),
    ("code", """\
backend.backend_load("accel")                      # ggml_backend_load: the simulated accelerator's library
rows = []
for i in range(backend.backend_dev_count()):
    dev = backend.backend_dev_get(i)
    buft = backend.backend_dev_buffer_type(dev)
    free, total = backend.backend_dev_memory(dev)
    rows.append({"reg": backend.backend_reg_name(backend.backend_dev_backend_reg(dev)),
                 "device": backend.backend_dev_name(dev), "type": TYPES.get(backend.backend_dev_type(dev)),
                 "description": backend.backend_dev_description(dev), "memory MiB": total >> 20,
                 "buffer type": backend.backend_buft_name(buft), "alignment": backend.backend_buft_get_alignment(buft),
                 "host memory": backend.backend_buft_is_host(buft)})
viz.Table(rows, title="ggml_backend_dev_get(i) for every registered device")"""),
    ("md", """\
> **Teacher note.** BLAS is an `ACCEL`-type device: it has no memory of its own and uses the CPU buffer type, so
> BLAS and the CPU can read each other's tensors with no copy. `ACCEL0` is a `GPU`-type device with its own buffer
> type, not host memory: what the CPU computed must be copied into it (`ggml_backend_tensor_copy`).

For the experiments we make our own accelerator device, one that lacks `RMS_NORM`, and a backend on each device
(`ggml_backend_dev_init`). A backend answers three questions the scheduler asks: `supports_op` (can it compute this
node?), `supports_buft` (can it read memory of this buffer type?) and `offload_op` (is this op worth copying a
weight for?)."""),
    ("code", """\
dev = accel.backend_accel_device_new("ACCEL0", supported_ops=accel.DEFAULT_SUPPORTED_OPS - {ggml.GGML_OP_RMS_NORM})
acc = backend.backend_dev_init(dev, None)                  # ggml_backend_dev_init -> a ggml_backend_t
cpu = backend.backend_cpu_init()
cpu_buft = backend.backend_cpu_buffer_type()
bufts = {"ACCEL0": backend.backend_dev_buffer_type(dev), "CPU": cpu_buft}
viz.Table([{"backend": backend.backend_name(b), **{f"reads {n}": backend.backend_supports_buft(b, bt) for n, bt in bufts.items()}}
           for b in (acc, cpu)], title="ggml_backend_supports_buft")"""),
    ("md", """\
## 2. A small graph on ACCEL0 + CPU: the five passes

Two layers of `norm-l = rms_norm(cur)`, `attn_norm-l = norm-l * norm weight`, `h-l = W x attn_norm-l`,
`out-l = h-l + cur`. Every weight is placed in ACCEL0's memory (as `llama.cpp -ngl` does with a layer's weights) and
its buffer marked as a weights buffer (`GGML_BACKEND_BUFFER_USAGE_WEIGHTS`)."""),
    ("code", """\
N, T = 64, 4
gctx = ggml.init(4 << 20, no_alloc=True)
x = ggml.set_name(ggml.new_tensor_2d(gctx, F32, N, T), "x")
ggml.set_input(x)
cur, weights = x, []
rng = np.random.default_rng(0)
for il in range(2):
    wctx = ggml.init(4 * ggml.tensor_overhead(), no_alloc=True)
    wn = ggml.set_name(ggml.new_tensor_1d(wctx, F32, N), f"blk.{il}.norm.weight")
    w = ggml.set_name(ggml.new_tensor_2d(wctx, F32, N, N), f"blk.{il}.w.weight")
    buf = alloc.backend_alloc_ctx_tensors_from_buft(wctx, bufts["ACCEL0"])      # weights in device memory
    backend.backend_buffer_set_usage(buf, backend.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    for t in (wn, w):
        v = rng.standard_normal(ggml.nelements(t)).astype(np.float32) / 8
        backend.backend_tensor_set(t, v, 0, v.nbytes)                         # host -> device
    weights.append((wctx, buf))
    n = ggml.set_name(ggml.rms_norm(gctx, cur, 1e-5), f"norm-{il}")
    m = ggml.set_name(ggml.mul(gctx, n, wn), f"attn_norm-{il}")
    h = ggml.set_name(ggml.mul_mat(gctx, w, m), f"h-{il}")
    cur = ggml.set_name(ggml.add(gctx, h, cur), f"out-{il}")
gf = ggml.new_graph_custom(gctx, 256, False)
ggml.build_forward_expand(gf, cur)
print([f"{i} {t.name}" for i, t in enumerate(gf.nodes)])"""),
    ("md", """\
`ggml_backend_sched_new([ACCEL0, CPU])`: backends in priority order, the CPU last. `ggml_backend_sched_alloc_graph`
runs `ggml_backend_sched_split_graph` (the passes) and allocates the splits. `SchedulerView.capture` records its
trace events (`sched.pass`, `sched.assign` with the cause of every `SET_CAUSE`, `sched.split`, `sched.copy`) and
replays them pass by pass."""),
    ("code", """\
sched = S.backend_sched_new([acc, cpu], None, 2, 256, False, True)     # ggml_backend_sched_new
sv = SchedulerView.capture(sched, gf)                                   # records ggml_backend_sched_alloc_graph
rows = []
for st in STAGES[1:-1]:
    changed = [a for a in sv.assignment(st) if a["changed"]]
    rows.append({"pass": st, "set in this pass": ", ".join(f"{a['name']} → {a['backend']} ({a['cause']})"
                                                          for a in changed) or "—"})
viz.Table(rows, title="what each pass of ggml_backend_sched_split_graph decided")"""),
    ("md", """\
> **Teacher note.** Pass by pass (`ggml_backend_sched_split_graph` in ggml-backend.cpp):
>
> * **pass 1** (`ggml_backend_sched_backend_id_from_cur`): a node reading a weight runs where the weight is —
>   `attn_norm-l` reads its norm weight as `src[1]` ("1.wgt1"), `h-l` its matrix as `src[0]` ("1.wgt0"); the input
>   `x` goes to the CPU ("1.inp"), the weights themselves to ACCEL0 ("1.dst");
> * **pass 2** (`ggml_backend_sched_set_if_supported`): ACCEL0 spreads down to `out-l` ("2.sup"); it cannot spread
>   to `norm-l`: no RMS_NORM;
> * **pass 3**: `norm-0` and `norm-1` are still unassigned: only the CPU supports them ("3.best");
> * **pass 4**: nothing left (no views here);
> * **pass 5**: consecutive nodes on one backend form a split; a source living in memory the split's backend cannot
>   read becomes an *input* of the split, copied into its memory before it runs: `ACCEL0#norm-0#0` is
>   `norm-0` copied into ACCEL0 (copy 0; more copies only with pipeline parallelism).

Step through it with the buttons (or `sv.step_pass()`), pick a split:"""),
    ("code", """\
sv.goto_pass("5").select_split(1)
sv"""),
    ("md", """\
Computing it (`ggml_backend_sched_graph_compute` → `ggml_backend_sched_compute_splits`): before each split, its
inputs are copied; ACCEL0 counts the bytes that crossed."""),
    ("code", """\
xv = rng.standard_normal((T, N)).astype(np.float32)
backend.backend_tensor_set(x, xv, 0, xv.nbytes)
accel.backend_accel_reset_stats(dev)
assert S.backend_sched_graph_compute(sched, gf) == ggml.GGML_STATUS_SUCCESS
st = accel.backend_accel_stats(dev)
print(f"{S.backend_sched_get_n_splits(sched)} splits; into ACCEL0: {st['n_h2d']} copies, {st['h2d_bytes']} bytes; "
      f"out of it: {st['n_d2h']} copies, {st['d2h_bytes']} bytes")
print("compute buffers:", {backend.backend_name(b): S.backend_sched_get_buffer_size(sched, b) for b in (acc, cpu)})"""),
    ("md", """\
## 3. SmolLM2 with `-ngl 0 / 10 / 31`

`llama_model_params.n_gpu_layers` puts the *last* n repeating layers' weights (and their KV cache) on the offload
devices; with more layers than the model has (31 > 30), the output layer too. For a one-token batch llama.cpp pins
each layer's norms to the layer's device (`ggml_backend_sched_set_tensor_backend`, cause "usr"). The context's
scheduler gets the backends [ACCEL0, BLAS, CPU]. We only build, split and allocate the decode graph (no compute)."""),
    ("code", """\
from ggviz.fetch import fetch_default_model
MODEL = str(fetch_default_model(quiet=True))

def decode_plan(ngl, devices, n_tokens=1):
    mp = llama.model_default_params()
    mp.devices, mp.n_gpu_layers, mp.use_extra_bufts = devices, ngl, False
    model = llama.model_load_from_file(MODEL, mp)
    cp = llama.context_default_params()
    cp.n_ctx, cp.flash_attn_type = 256, 0
    c = llama.init_from_model(model, cp)
    with trace.recording(SchedulerView.KINDS) as rec:       # the graph step of llama_decode, recorded
        S.backend_sched_reset(c.sched)
        res = c.build_graph(n_tokens, 1, 256)               # (its callback pins the norms: "usr")
        assert S.backend_sched_alloc_graph(c.sched, res.gf)
    return c, SchedulerView(c.sched, res.gf, rec)

rows, views = [], {}
for ngl in (0, 10, 31):
    gpu = accel.backend_accel_device_new("ACCEL0")           # a full accelerator this time
    c, v = decode_plan(ngl, [gpu])
    s = v.state()
    views[ngl] = v
    rows.append({"-ngl": ngl, "backends": ", ".join(s["backends"]),
                 "layers on ACCEL0": sum(backend.backend_dev_name(d) == "ACCEL0" for d in c.model.dev_layer),
                 "splits": s["n_splits"], "inputs copied": s["n_inputs"],
                 "splits (backend: inputs)": " | ".join(f"{x['backend']}: {len(x['inputs'])}" for x in s["splits"]),
                 "ACCEL0 compute buffer": S.backend_sched_get_buffer_size(c.sched, c.backends[0])})
viz.Table(rows, title="SmolLM2 decode (1 token): ggml_backend_sched_get_n_splits and the copies")"""),
    ("code", """\
views[10].select_split(1)
views[10]"""),
    ("md", """\
> **Teacher note.** With `-ngl 10`, layers 20–29 are on ACCEL0: split #0 is the CPU (embeddings, layers 0–19), #1
> ACCEL0, #2 the CPU again for the output layer (its weights are in host memory), which gets the final norm copied
> back (`CPU#norm#0`). Split #1's inputs: the residual stream and the graph inputs (positions, KV indices, mask)
> copied into device memory. Look at pass 2.2: ACCEL0 spreads *up* from the pinned `norm-20` and pulls layer 19's
> last ADD onto the device, so both its operands are copied. The KV cache views on the CPU layers go to BLAS in
> pass 1 ("1.dst"): BLAS is the highest-priority backend that can use host memory and supports view ops, which
> compute nothing. With `-ngl 31` the output layer moves too: 2 splits."""),
    ("md", """\
## 4. BLAS takes the prompt's matrix multiplications

Without an accelerator the context's backends are [BLAS, CPU]. BLAS only accepts a MUL_MAT big enough to be worth
it (here: 32 rows or more), so a one-token decode stays on the CPU, but a 32-token prompt's MUL_MATs go to BLAS in
pass 1: their weights are in a host weights buffer, and BLAS is the highest-priority backend that can read it and
supports the op ("1.wgt0"). BLAS and the CPU share the buffer type: many splits, no copies."""),
    ("code", """\
c32, v32 = decode_plan(0, [], n_tokens=32)
mm = {}
for a in v32.assignment():
    if a["op"] == "MUL_MAT":
        mm[(a["backend"], a["cause"])] = mm.get((a["backend"], a["cause"]), 0) + 1
print("backends:", v32.backends, "| MUL_MAT (backend, cause):", mm)
print(f"{v32.state()['n_splits']} splits, {v32.state()['n_inputs']} copies")
v32.figure();"""),
    ("md", """\
> **Teacher note.** The 4 weight MUL_MATs left on the CPU multiply a single row: once `out_ids` has kept only the
> output token (in layer 29), its feed-forward and the output head (`result_output`) are too small for BLAS. The
> attention's `kqv-l` (V·softmax) goes to BLAS by expansion in pass 2 ("2.sup": BLAS is a non-CPU backend, so
> passes 2.1/2.2 spread it to the neighbours it supports), while `kq-l` reads K and Q through permuted,
> non-contiguous views that BLAS refuses: the CPU."""),
    ("md", """\
When the weight's buffer is *not* marked as a weights buffer, pass 1 does not look at it: the MUL_MAT is left
unassigned, pass 2.3 expands the CPU down onto it from its neighbour (which reads a weight on the CPU), and pass 3
**upgrades** it ("3.upg") to BLAS, the higher-priority backend with the same buffer type that supports the op and
can read all its sources: the only rule by which ggml changes a backend once set."""),
    ("code", """\
uctx = ggml.init(1 << 20, no_alloc=True)
wctx_n, wctx_w = ggml.init(ggml.tensor_overhead(), no_alloc=True), ggml.init(ggml.tensor_overhead(), no_alloc=True)
xu = ggml.set_name(ggml.new_tensor_2d(uctx, F32, N, 32), "x")
ggml.set_input(xu)
wn = ggml.set_name(ggml.new_tensor_1d(wctx_n, F32, N), "wn.norm")
W = ggml.set_name(ggml.new_tensor_2d(wctx_w, F32, N, N), "W")
nbuf = alloc.backend_alloc_ctx_tensors_from_buft(wctx_n, cpu_buft)
backend.backend_buffer_set_usage(nbuf, backend.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)   # a weights buffer
wbuf = alloc.backend_alloc_ctx_tensors_from_buft(wctx_w, cpu_buft)                 # usage ANY: not one
nu = ggml.set_name(ggml.mul(uctx, xu, wn), "n")                # reads a weight: "1.wgt1" on the CPU (BLAS has no MUL)
hu = ggml.set_name(ggml.mul_mat(uctx, W, nu), "h")             # W is not in a weights buffer: pass 1 skips it
out = ggml.set_name(ggml.add(uctx, hu, xu), "out")
gu = ggml.new_graph_custom(uctx, 64, False)
ggml.build_forward_expand(gu, out)
su = S.backend_sched_new([blas.backend_blas_init(), backend.backend_cpu_init()], None, 2, 64, False, True)
vu = SchedulerView.capture(su, gu)
viz.Table([{"node": a["name"], **{f"after {st}": f"{b['backend']} ({b['cause']})"
                                   for st in ("1", "2.3", "3") for b in [vu.assignment(st)[a["index"]]]}}
           for a in vu.assignment()], title="h: unassigned after pass 1, CPU after 2.3, BLAS after pass 3 (3.upg)")"""),
    ("md", """\
> **Teacher note.** Where to look in ggml-backend.cpp: `ggml_backend_sched_split_graph` (the five passes, SET_CAUSE
> records the causes shown here in debug builds, `GGML_SCHED_DEBUG=2` prints them), `ggml_backend_sched_alloc_splits`
> (one `ggml_gallocr` buffer per backend, notebook 04) and `ggml_backend_sched_compute_splits` (copy the inputs,
> then `ggml_backend_graph_compute_async` on the split's backend)."""),
]


def nb_04_allocator():
    """notebooks/04_allocator.ipynb: tallocr vs gallocr, one decode's allocation, reserve vs alloc."""
    from make_notebooks import build
    return build(NB04, "04_allocator.ipynb")


def nb_05_backends_and_scheduler():
    """notebooks/05_backends_and_scheduler.ipynb: registry, devices, buffer types, the scheduler's passes."""
    from make_notebooks import build
    return build(NB05, "05_backends_and_scheduler.ipynb")
