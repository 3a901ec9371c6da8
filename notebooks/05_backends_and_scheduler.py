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
# # 05 · Backends and the scheduler
#
# ggml runs a graph on several pieces of hardware at once through `ggml_backend_sched`. This notebook goes from the
# bottom up:
#
# 1. the **registry** of backend libraries → their **devices** → a **backend** (a stream on a device) and its
#    **buffer types**;
# 2. a small graph on a simulated accelerator (`ACCEL0`, which has its own memory and cannot compute `RMS_NORM`) plus
#    the CPU: the scheduler's five passes, step by step, with the cause of every decision, then the splits and the
#    copies between them;
# 3. SmolLM2 decoding with `-ngl 0 / 10 / 31`: how many splits and copies;
# 4. BLAS taking a prompt's matrix multiplications.
#
# `ACCEL0` does not exist in ggml: it stands in for a GPU backend (CUDA, Metal, Vulkan ...) on a laptop. It computes
# with the CPU kernels, but on memory the CPU backend may not touch.

# %%
import numpy as np
from ggviz import ggml, llama, trace, viz
from ggviz.ggml import accel, alloc, backend, backend_reg, blas
from ggviz.ggml.cpu import cpu_backend
from ggviz.ggml import sched as S
from ggviz.viz.widgets.sched_view import STAGES, SchedulerView
from ggviz.viz.widgets import exercise as ex           # predict, then reveal: answers computed from the run

TYPES = {backend.GGML_BACKEND_DEVICE_TYPE_CPU: "CPU", backend.GGML_BACKEND_DEVICE_TYPE_GPU: "GPU",
         backend.GGML_BACKEND_DEVICE_TYPE_ACCEL: "ACCEL"}
F32 = ggml.GGML_TYPE_F32

# %% [markdown]
# ## 1. Registry → devices → backends, buffer types
#
# `ggml_backend_reg_count` / `ggml_backend_reg_get`: the backend libraries compiled in (ggviz: BLAS and the CPU).
# `ggml_backend_load("accel")` adds one at run time, as `ggml_backend_load_all` does with shared libraries. Each reg
# has devices (`ggml_backend_dev_get`), each device a type, memory and a default **buffer type** (a kind of memory:
# alignment, maximum size, host or not).

# %%
backend_reg.backend_load("accel")                      # ggml_backend_load: the simulated accelerator's library
rows = []
for i in range(backend_reg.backend_dev_count()):
    dev = backend_reg.backend_dev_get(i)
    buft = backend.backend_dev_buffer_type(dev)
    free, total = backend.backend_dev_memory(dev)
    rows.append({"reg": backend.backend_reg_name(backend.backend_dev_backend_reg(dev)),
                 "device": backend.backend_dev_name(dev), "type": TYPES.get(backend.backend_dev_type(dev)),
                 "description": backend.backend_dev_description(dev), "memory MiB": total >> 20,
                 "buffer type": backend.backend_buft_name(buft), "alignment": backend.backend_buft_get_alignment(buft),
                 "host memory": backend.backend_buft_is_host(buft)})
viz.Table(rows, title="ggml_backend_dev_get(i) for every registered device")

# %% [markdown]
# > **Teacher note.** BLAS is an `ACCEL`-type device: it has no memory of its own and uses the CPU buffer type, so
# > BLAS and the CPU can read each other's tensors with no copy. `ACCEL0` is a `GPU`-type device with its own buffer
# > type, not host memory: what the CPU computed must be copied into it (`ggml_backend_tensor_copy`).
#
# For the experiments we make our own accelerator device, one that lacks `RMS_NORM`, and a backend on each device
# (`ggml_backend_dev_init`). A backend answers three questions the scheduler asks: `supports_op` (can it compute this
# node?), `supports_buft` (can it read memory of this buffer type?) and `offload_op` (is this op worth copying a
# weight for?).

# %%
dev = accel.backend_accel_device_new("ACCEL0", supported_ops=accel.DEFAULT_SUPPORTED_OPS - {ggml.GGML_OP_RMS_NORM})
acc = backend.backend_dev_init(dev, None)                  # ggml_backend_dev_init -> a ggml_backend_t
cpu = cpu_backend.backend_cpu_init()
cpu_buft = backend.backend_cpu_buffer_type()
bufts = {"ACCEL0": backend.backend_dev_buffer_type(dev), "CPU": cpu_buft}
viz.Table([{"backend": backend.backend_name(b), **{f"reads {n}": backend.backend_supports_buft(b, bt) for n, bt in bufts.items()}}
           for b in (acc, cpu)], title="ggml_backend_supports_buft")

# %% [markdown]
# A backend is C's object orientation: `struct ggml_backend { guid; iface; device; context; }`, where `iface`
# (`struct ggml_backend_i`) is a table of function pointers, a hand-made vtable; `ggml_backend_graph_compute(b, g)`
# is `b->iface.graph_compute(b, g)`. Optional slots are NULL (the caller checks). The three backends' tables:

# %%
import dataclasses

blas_b = blas.backend_blas_init()
vt_backends = {"ACCEL0": acc, "CPU": cpu, "BLAS": blas_b}
viz.Table([{"iface slot": f.name, **{n: getattr(getattr(b.iface, f.name), "__name__", "set")
                                     if getattr(b.iface, f.name) is not None else "NULL"
                                     for n, b in vt_backends.items()}}
           for f in dataclasses.fields(backend.ggml_backend_i)], title="struct ggml_backend_i of each backend")

# %% [markdown]
# *Read the code:* ggviz.ggml.backend_reg.backend_load, ggviz.ggml.backend_reg.backend_dev_get, ggviz.ggml.backend.backend_dev_init ↔ ggml-backend-reg.cpp ggml_backend_load, ggml_backend_dev_get; ggml-backend.cpp ggml_backend_dev_init

# %% [markdown]
# ## 2. A small graph on ACCEL0 + CPU: the five passes
#
# Two layers of `norm-l = rms_norm(cur)`, `attn_norm-l = norm-l * norm weight`, `h-l = W x attn_norm-l`,
# `out-l = h-l + cur`. Every weight is placed in ACCEL0's memory (as `llama.cpp -ngl` does with a layer's weights) and
# its buffer marked as a weights buffer (`GGML_BACKEND_BUFFER_USAGE_WEIGHTS`).

# %%
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
print(f"{gf.n_nodes} nodes: " + ", ".join(f"#{i} {t.name}" for i, t in enumerate(gf.nodes)))

# %% [markdown]
# `ggml_backend_sched_new([ACCEL0, CPU])`: backends in priority order, the CPU last. `ggml_backend_sched_alloc_graph`
# runs `ggml_backend_sched_split_graph` (the passes) and allocates the splits. `SchedulerView.capture` records its
# trace events (`sched.pass`, `sched.assign` with the cause of every `SET_CAUSE`, `sched.split`, `sched.copy`) and
# replays them pass by pass.

# %%
sched = S.backend_sched_new([acc, cpu], None, 2, 256, False, True)     # ggml_backend_sched_new
sv = SchedulerView.capture(sched, gf)                                   # records ggml_backend_sched_alloc_graph
rows = []
for st in STAGES[1:-1]:
    changed = [a for a in sv.assignment(st) if a["changed"]]
    rows.append({"pass": st, "set in this pass": ", ".join(f"{a['name']} → {a['backend']} ({a['cause']})"
                                                          for a in changed) or "—"})
viz.Table(rows, title="what each pass of ggml_backend_sched_split_graph decided")

# %% [markdown]
# > **Teacher note.** Pass by pass (`ggml_backend_sched_split_graph` in ggml-backend.cpp):
# >
# > * **pass 1** (`ggml_backend_sched_backend_id_from_cur`): a node reading a weight runs where the weight is —
# >   `attn_norm-l` reads its norm weight as `src[1]` ("1.wgt1"), `h-l` its matrix as `src[0]` ("1.wgt0"); the input
# >   `x` goes to the CPU ("1.inp"), the weights themselves to ACCEL0 ("1.dst");
# > * **pass 2** (`ggml_backend_sched_set_if_supported`): ACCEL0 spreads down to `out-l` ("2.sup"); it cannot spread
# >   to `norm-l`: no RMS_NORM;
# > * **pass 3**: `norm-0` and `norm-1` are still unassigned: only the CPU supports them ("3.best");
# > * **pass 4**: nothing left (no views here);
# > * **pass 5**: consecutive nodes on one backend form a split; a source living in memory the split's backend cannot
# >   read becomes an *input* of the split, copied into its memory before it runs: `ACCEL0#norm-0#0` is
# >   `norm-0` copied into ACCEL0 (copy 0; more copies only with pipeline parallelism).
#
# Step through it with the buttons (or `sv.step_pass()`), pick a split:

# %%
sv.goto_pass("5").select_split(1)
sv

# %% [markdown]
# Computing it (`ggml_backend_sched_graph_compute` → `ggml_backend_sched_compute_splits`): before each split, its
# inputs are copied; ACCEL0 counts the bytes that crossed.

# %%
norm0 = next(t for t in gf.nodes if t.name == "norm-0")
ex.Exercise(f"`x` is F32 [{N}, {T}]. When the graph is computed, how many bytes does the copy of `norm-0` into ACCEL0 "
            f"(the split input ACCEL0#norm-0#0) move?", ggml.nbytes(norm0), unit="bytes",
            explain=f"norm-0 has x's shape: {N} × {T} floats × 4 bytes. Every split input is a whole tensor, copied "
                    "before its split runs (ggml_backend_tensor_copy).")

# %%
xv = rng.standard_normal((T, N)).astype(np.float32)
backend.backend_tensor_set(x, xv, 0, xv.nbytes)
accel.backend_accel_reset_stats(dev)
assert S.backend_sched_graph_compute(sched, gf) == ggml.GGML_STATUS_SUCCESS
st = accel.backend_accel_stats(dev)
print(f"{S.backend_sched_get_n_splits(sched)} splits; into ACCEL0: {st['n_h2d']} copies, {st['h2d_bytes']:,} bytes; "
      f"out of it: {st['n_d2h']} cop{'y' if st['n_d2h'] == 1 else 'ies'}, {st['d2h_bytes']:,} bytes")
print("compute buffers: " + ", ".join(f"{backend.backend_name(b)} {S.backend_sched_get_buffer_size(sched, b):,} bytes"
                                      for b in (acc, cpu)))

# %% [markdown]
# *Read the code:* ggviz.ggml.sched.backend_sched_new, ggviz.ggml.sched.backend_sched_split_graph, ggviz.ggml.sched.backend_sched_graph_compute ↔ ggml-backend.cpp ggml_backend_sched_new, ggml_backend_sched_split_graph, ggml_backend_sched_graph_compute

# %% [markdown]
# ## 3. SmolLM2 with `-ngl 0 / 10 / 31`
#
# `llama_model_params.n_gpu_layers` puts the *last* n repeating layers' weights (and their KV cache) on the offload
# devices; with more layers than the model has (31 > 30), the output layer too. For a one-token batch llama.cpp pins
# each layer's norms to the layer's device (`ggml_backend_sched_set_tensor_backend`, cause "usr"). We opt in to the
# BLAS backend (`use_blas`, as llama.cpp built with `GGML_BLAS`; its default CPU build has none), so the context's
# scheduler gets the backends [ACCEL0, BLAS, CPU]. We only build, split and allocate the decode graph (no compute).

# %%
from ggviz.fetch import fetch_default_model
MODEL = str(fetch_default_model(quiet=True))

def decode_plan(ngl, devices, n_tokens=1, use_blas=True):
    mp = llama.model_default_params()
    mp.devices, mp.n_gpu_layers, mp.use_extra_bufts = devices, ngl, False
    model = llama.model_load_from_file(MODEL, mp)
    cp = llama.context_default_params()
    cp.n_ctx, cp.flash_attn_type = 256, 0          # the KQ -> SOFT_MAX -> KQV graph, not llama.cpp's default (FA on)
    cp.use_blas = use_blas
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

# %%
viz.Table(rows, title="SmolLM2 decode (1 token): ggml_backend_sched_get_n_splits and the copies")

# %%
ngl = 20                            # change it (0 to 31), predict, then run this cell again
c_ngl, v_ngl = decode_plan(ngl, [accel.backend_accel_device_new("ACCEL0")])
e = ex.n_splits(v_ngl, ngl)
e.kind = "rerun"
e

# %%
views[10].select_split(1)
views[10]

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
kv_view = next(a for a in views[10].assignment("1") if a["view_op"] and "cache_k" in a["name"])
ex.Exercise(f"With -ngl 10, the KV cache views of the CPU layers (the first: {kv_view['name']!r}, a "
            f"{kv_view['op']}) were assigned to {kv_view['backend']} in pass 1, not to the CPU. Why?",
            "BLAS comes before the CPU in priority, can use host memory, and supports view ops",
            choices=["BLAS comes before the CPU in priority, can use host memory, and supports view ops",
                     "BLAS computes the views faster", "the KV cache lives in BLAS's own memory"],
            kind="why",
            explain=f"Pass 1 gives a view the highest-priority backend that can use its source's buffer and supports "
                    f"the op (cause {kv_view['cause']!r}). BLAS shares the CPU buffer type, and a view computes "
                    f"nothing, so where it runs costs nothing.")

# %% [markdown]
# > **Teacher note.** With `-ngl 10`, layers 20–29 are on ACCEL0: split #0 is the CPU (embeddings, layers 0–19), #1
# > ACCEL0, #2 the CPU again for the output layer (its weights are in host memory), which gets the final norm copied
# > back (`CPU#norm#0`). Split #1's inputs: the residual stream and the graph inputs (positions, KV indices, mask)
# > copied into device memory. Look at pass 2.2: ACCEL0 spreads *up* from the pinned `norm-20` and pulls layer 19's
# > last ADD onto the device, so both its operands are copied. With `-ngl 31` the output layer moves too: 2 splits.
#
# *Read the code:* ggviz.llama.model.model_load_from_file, ggviz.ggml.sched.backend_sched_set_tensor_backend ↔ llama.cpp llama_model_load_from_file; ggml-backend.cpp ggml_backend_sched_set_tensor_backend

# %% [markdown]
# ## 4. BLAS takes the prompt's matrix multiplications
#
# Without an accelerator the context's backends are [BLAS, CPU]. BLAS only accepts a MUL_MAT big enough to be worth
# it (here: 32 rows or more), so a one-token decode stays on the CPU, but a 32-token prompt's MUL_MATs go to BLAS in
# pass 1: their weights are in a host weights buffer, and BLAS is the highest-priority backend that can read it and
# supports the op ("1.wgt0"). BLAS and the CPU share the buffer type: many splits, no copies.

# %%
from IPython.display import display

c32, v32 = decode_plan(0, [], n_tokens=32)
mm = {}
for a in v32.assignment():
    if a["op"] == "MUL_MAT":
        mm[(a["backend"], a["cause"])] = mm.get((a["backend"], a["cause"]), 0) + 1
# the same prompt as llama.cpp's default build runs it: no BLAS backend, the CPU's own kernels
c32d, v32d = decode_plan(0, [], n_tokens=32, use_blas=False)
print(f"with BLAS: backends {', '.join(v32.backends)}; {v32.state()['n_splits']} splits, "
      f"{v32.state()['n_inputs']} copies.  Without: backends {', '.join(v32d.backends)}")
display(viz.Table([{"MUL_MAT on": b, "pass 1 / 2 cause": c, "nodes": n} for (b, c), n in
                   sorted(mm.items(), key=lambda kv: -kv[1])], title="the 32-token prompt's MUL_MATs, with BLAS"))
kernels = sorted(set(v32.mul_mat_kernels()) | set(v32d.mul_mat_kernels()))
display(viz.Table([{"kernel": k, "with BLAS": v32.mul_mat_kernels().get(k, 0),
                    "without (llama.cpp's default build)": v32d.mul_mat_kernels().get(k, 0)} for k in kernels],
                  title="which kernel each MUL_MAT runs"))
v32.figure();

# %% [markdown]
# > **Teacher note.** The 4 weight MUL_MATs left on the CPU multiply a single row: once `out_ids` has kept only the
# > output token (in layer 29), its feed-forward and the output head (`result_output`) are too small for BLAS. The
# > attention's `kqv-l` (V·softmax) goes to BLAS by expansion in pass 2 ("2.sup": BLAS is a non-CPU backend, so
# > passes 2.1/2.2 spread it to the neighbours it supports), while `kq-l` reads K and Q through permuted,
# > non-contiguous views that BLAS refuses: the CPU, where llamafile's tinyBLAS computes it ("sgemm": src1 converted
# > to F16, then one 8-lane FMA accumulator per element). Without BLAS -- llama.cpp's default build -- the Q4_1
# > weights go through ggml's vec_dot chunks (tinyBLAS takes only F32/F16/BF16 and Q8_0/Q4_0/Q5_0/IQ4_NL), the
# > attention through tinyBLAS, and so would the Q8_0 output head if several rows' logits were asked for (here one:
# > vec_dot): that is the prefill whose logits equal llama.cpp's bit for bit.

# %% [markdown]
# When the weight's buffer is *not* marked as a weights buffer, pass 1 does not look at it: the MUL_MAT is left
# unassigned, pass 2.3 expands the CPU down onto it from its neighbour (which reads a weight on the CPU), and pass 3
# **upgrades** it ("3.upg") to BLAS, the higher-priority backend with the same buffer type that supports the op and
# can read all its sources: the only rule by which ggml changes a backend once set.

# %%
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
su = S.backend_sched_new([blas.backend_blas_init(), cpu_backend.backend_cpu_init()], None, 2, 64, False, True)
vu = SchedulerView.capture(su, gu)
viz.Table([{"node": a["name"], **{f"after {st}": f"{b['backend']} ({b['cause']})"
                                   for st in ("1", "2.3", "3") for b in [vu.assignment(st)[a["index"]]]}}
           for a in vu.assignment()], title="h: unassigned after pass 1, CPU after 2.3, BLAS after pass 3 (3.upg)")

# %% [markdown]
# > **Teacher note.** Where to look in ggml-backend.cpp: `ggml_backend_sched_split_graph` (the five passes, SET_CAUSE
# > records the causes shown here in debug builds, `GGML_SCHED_DEBUG=2` prints them), `ggml_backend_sched_alloc_splits`
# > (one `ggml_gallocr` buffer per backend, notebook 04) and `ggml_backend_sched_compute_splits` (copy the inputs,
# > then `ggml_backend_graph_compute_async` on the split's backend).
#
# *Read the code:* ggviz.ggml.blas.backend_blas_init, ggviz.ggml.sched.backend_sched_split_graph ↔ ggml-blas.cpp ggml_backend_blas_init; ggml-backend.cpp ggml_backend_sched_split_graph
