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
# # 09 · PowerInfer: hot and cold neurons, a predictor, sparse kernels, a hybrid executor
#
# [PowerInfer](https://github.com/SJTU-IPADS/PowerInfer) (SJTU-IPADS) runs a model partly on a GPU and partly on
# the CPU by betting on **activation sparsity**: in a ReLU FFN most neurons output exactly 0 for a given token, and a
# few "hot" neurons fire for almost every token. So it
#
# 1. trains a small **predictor** per layer (Linear → ReLU → Linear) that guesses, from the layer's input, which
#    neurons will fire;
# 2. computes only those rows of `ffn_up` / `ffn_gate` (**MUL_MAT_SPARSE**) and only those rows of the transposed
#    down matrix (**AXPY**);
# 3. puts the hot neurons' rows on the GPU (as many as `--vram-budget` allows, chosen by an ILP over activation
#    counts) and the cold ones on the CPU, and runs both halves at once (**the hybrid executor**).
#
# Everything below runs ggviz's re-implementation of PowerInfer's code on SmolLM2-135M. One honest warning first:
# **SmolLM2's FFN is SwiGLU, not ReLU.** `silu(gate)·up` is never exactly zero, so "active" has to be defined (here:
# above the layer's median magnitude), and skipping a row always changes the result a little. PowerInfer's own models
# are ReLU-fied; on this model the sparsity is much lower and the speed-up small. We measure both.

# %%
import os
import pathlib
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

from ggviz import ggml, llama
from ggviz.ggml import consts as C
from ggviz.ggml import quants as Q
from ggviz.ggml.cpu import ggml_cpu, hybrid
from ggviz.ggml.cpu import powerinfer as cpu_pi
from ggviz.powerinfer import pipeline as P

# %% [markdown]
# ## 1. The two kernels
#
# `ggml_mul_mat_idx(W, x, idx, gpu_idx)` is a MUL_MAT whose row *r* is set to 0 — without computing it — when
# `gpu_idx[r] == 1` (the row lives on the GPU) or `idx[r] < sparse_pred_threshold` (the predictor's logit says the
# neuron stays off; threshold 0 = probability ½). Threads claim chunks of ⌈rows / (8·threads)⌉ rows from a shared
# counter. A kept row is computed by the very same `vec_dot` as MUL_MAT, so it is the same number to the bit:

# %%
rng = np.random.default_rng(0)
M, K = 1536, 576
W = (rng.standard_normal((M, K)) * 0.05).astype(np.float32)
X = rng.standard_normal((1, K)).astype(np.float32)
IDX = rng.standard_normal((1, M)).astype(np.float32)
ctx = ggml.init(64 << 20)
w = ggml.new_tensor_2d(ctx, C.GGML_TYPE_Q4_1, K, M)
ggml.get_data(w).reshape(-1).view(np.uint8)[:] = np.asarray(Q.quantize_row_ref(C.GGML_TYPE_Q4_1, W)).reshape(-1).view(np.uint8)
x = ggml.new_tensor_2d(ctx, C.GGML_TYPE_F32, K, 1)
ggml.get_data(x)[...] = X.reshape(ggml.get_data(x).shape)
idx = ggml.new_tensor_2d(ctx, C.GGML_TYPE_F32, M, 1)
ggml.get_data(idx)[...] = IDX.reshape(ggml.get_data(idx).shape)
gpu_idx = ggml.new_tensor_1d(ctx, C.GGML_TYPE_I32, M)
ggml.get_data(gpu_idx)[...] = 0
ys = ggml.mul_mat_idx(ctx, w, x, idx, gpu_idx)
yd = ggml.mul_mat(ctx, w, x)
gf = ggml.new_graph(ctx)
ggml.build_forward_expand(gf, ys)
ggml.build_forward_expand(gf, yd)
plan = ggml_cpu.graph_plan(gf, 2)
plan.work_data = np.zeros(plan.work_size, np.uint8)
ggml_cpu.graph_compute(gf, plan)
S, D = np.array(ggml.get_data(ys)).reshape(-1), np.array(ggml.get_data(yd)).reshape(-1)
keep = ~(IDX.reshape(-1) < 0)
print(f"{ggml.op_name(ys.op)}: {keep.sum()} of {M} rows kept; kept rows equal MUL_MAT bit for bit: "
      f"{np.array_equal(S[keep], D[keep])}; skipped rows exactly 0: {np.all(S[~keep] == 0)}")

# %% [markdown]
# `ggml_axpy(down_t, h, idx, gpu_idx)` computes the down projection **by rows of the transposed matrix**: for each
# neuron *r* that fired, `out += h[r] · down_t[r]` (one `_mm256_fmadd_ps` per 8 floats). A skipped neuron costs
# nothing: that is why PowerInfer stores `ffn_down_t` (F16) besides the model. Each thread sums its share of the
# neurons privately and then adds its vector into the output — **without a lock** in PowerInfer's `ggml.c`:
# `res[i] += tmp[i]` from several threads at once is a data race (two threads read the same `res[i]`, one
# addition is lost). ggviz keeps the partial vectors and adds them in thread order after a barrier.
#
# ## 2. A PowerInfer model of SmolLM2
#
# PowerInfer never published how it trains its predictors. `ggviz powerinfer build --out DIR` does it: it decodes
# ~30k tokens of Python's own help text (`pydoc_data.topics`), records every layer's FFN input and `silu(gate)·up`
# through the eval callback, trains 30 predictors (576 → 128 → 1536) in NumPy and writes a GGUF whose magic is
# `PWRI`, with `blk.N.fc1`, `blk.N.fc2`, `blk.N.ffn_down_t` and `powerinfer.sparse_threshold`. Here we use the
# directory in `GGVIZ_POWERINFER_DIR` if you built one, else a tiny build (a few hundred tokens: its predictor is
# weak, the pictures are still the real mechanics).

# %%
out_dir = pathlib.Path(os.environ.get("GGVIZ_POWERINFER_DIR", pathlib.Path.home() / ".cache" / "ggviz" / "powerinfer"))
pwri = out_dir / "SmolLM2-135M-Instruct.Q4_1.powerinfer.gguf"
if not pwri.exists():
    out_dir = pathlib.Path(tempfile.gettempdir()) / "ggviz_powerinfer_tiny"
    pwri = out_dir / "SmolLM2-135M-Instruct.Q4_1.powerinfer.gguf"
    if not pwri.exists():
        t0 = time.perf_counter()
        P.build(out_dir, tokens=192, heldout=64, seq_len=128, epochs=2, quiet=True)
        print(f"tiny build: {time.perf_counter() - t0:.0f} s")
sparse = llama.model_load_from_file(str(pwri))
dense = llama.model_load_from_file(str(P.DEFAULT_MODEL))
print(pwri, "magic", pwri.read_bytes()[:4], "sparse model:", sparse.sparse is not None,
      "threshold", sparse.sparse.sparse_pred_threshold)

# %% [markdown]
# ## 3. Predictor output vs the true activations
#
# We decode one sentence through the PWRI model at threshold −∞ (nothing skipped) and copy out, per layer, the
# predictor's logits (`mlp_pre_out-N`) and the true activation `silu(gate)·up` (`ffn_gate_par-N`).

# %%
text = "The quick brown fox jumps over the lazy dog because it wanted to see the river."
ids = llama.tokenize(sparse.vocab, text, add_special=False)
got = {}


def cb(t, ask):
    if ask:
        return t.name.startswith(("mlp_pre_out-", "ffn_gate_par-"))
    got[t.name] = np.array(ggml.get_data(t), np.float32).reshape(len(ids), -1)
    return True


cpu_pi.set_sparse_pred_threshold(-np.inf)
c = P._ctx(sparse, 64, 2)
c.cparams.cb_eval = cb
assert llama.decode(c, P._batch_all_logits(ids)) == 0
llama.free(c)
n_layer = sparse.hparams.n_layer
layer = 10
logit = got[f"mlp_pre_out-{layer}"].reshape(-1)
act = np.abs(got[f"ffn_gate_par-{layer}"]).reshape(-1)
fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
ax[0].scatter(logit[::7], act[::7], s=2, alpha=0.4)
ax[0].axvline(0, color="r", lw=1, label="threshold 0")
ax[0].axvline(-1, color="orange", lw=1, label="threshold -1")
ax[0].set_yscale("log")
ax[0].set_xlabel("predictor logit")
ax[0].set_ylabel("|silu(gate)·up|")
ax[0].set_title(f"layer {layer}: one dot per (token, neuron)")
ax[0].legend()
skip = [[float((got[f"mlp_pre_out-{il}"] < thr).mean()) for il in range(n_layer)] for thr in (0.0, -1.0)]
ax[1].bar(np.arange(n_layer) - 0.2, skip[0], 0.4, label="threshold 0")
ax[1].bar(np.arange(n_layer) + 0.2, skip[1], 0.4, label="threshold -1")
ax[1].set_xlabel("layer")
ax[1].set_ylabel("rows MUL_MAT_SPARSE skips")
ax[1].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. Hot and cold neurons
#
# The build counted, per neuron, how many of the recorded tokens made it "active". PowerInfer's premise is a power
# law: on its ReLU models ~20 % of the neurons carry most of the activations, so a GPU that holds that 20 % does most
# of the work. On SwiGLU SmolLM2 the curve is much flatter:

# %%
counts = np.stack([np.load(out_dir / "activation" / f"activation_{il}.npy") for il in range(n_layer)])
share = []
fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
for il in (0, 10, 20, 29):
    cs = np.sort(counts[il])[::-1].astype(np.float64)
    cum = np.cumsum(cs) / max(cs.sum(), 1)
    ax[0].plot(np.arange(1, len(cs) + 1) / len(cs), cum, label=f"layer {il}")
for il in range(n_layer):
    cs = np.sort(counts[il])[::-1].astype(np.float64)
    share.append(cs[: len(cs) // 4].sum() / max(cs.sum(), 1))
ax[0].plot([0, 1], [0, 1], "k:", lw=1)
ax[0].set_xlabel("hottest fraction of neurons")
ax[0].set_ylabel("fraction of activations")
ax[0].legend()
im = ax[1].imshow(np.sort(counts, axis=1)[:, ::-1], aspect="auto", cmap="magma")
fig.colorbar(im, ax=ax[1], label="tokens in which the neuron was active")
ax[1].set_xlabel("neurons, hottest first")
ax[1].set_ylabel("layer")
ax[1].set_title("activation counts (hot → cold)")
plt.tight_layout()
plt.show()
print(f"the hottest 25 % of neurons carry {np.mean(share):.0%} of the activations (mean over layers)")

# %% [markdown]
# ## 5. The hybrid executor
#
# With `--vram-budget`, PowerInfer's solver puts the hottest neurons' rows on the GPU (`gpu_idx`, `gpu_bucket`) and
# the graph gets a second half per FFN matrix: `ffn_up_sparse_gpu` (`ggml_mul_mat_idx_upscale`) and
# `ffn_down_sparse_gpu` (AXPY on the bucket), merged by an ADD. `ggml_graph_compute_thread_hybrid` runs them:
# **thread 0 only drives the GPU** — it walks the graph, waits until the sources of each GPU node are finished
# (`is_finish`, a new atomic in `ggml_tensor`), launches it — while **threads 1…N−1 run the CPU nodes** with
# `ith − 1` and `nth − 1`. Below: two sparse FFN layers with 30 % of the rows "on the GPU" (ggviz's stand-in
# device is a thread running the same kernels), three threads.

# %%
def tensor(ctx, type_, arr):
    arr = np.asarray(arr)
    if type_ == C.GGML_TYPE_Q4_1:
        t = ggml.new_tensor_2d(ctx, type_, arr.shape[1], arr.shape[0])
        ggml.get_data(t).reshape(-1).view(np.uint8)[:] = np.asarray(Q.quantize_row_ref(type_, arr)).reshape(-1).view(np.uint8)
        return t
    t = ggml.new_tensor(ctx, type_, arr.ndim, list(arr.shape[::-1]))
    ggml.get_data(t).reshape(-1)[:] = arr.reshape(-1)
    return t


def hybrid_ffn(n_layer=2, T=4, p_gpu=0.3):
    ctx = ggml.init(96 << 20)
    cur = tensor(ctx, C.GGML_TYPE_F32, rng.standard_normal((T, K)).astype(np.float32))
    for il in range(n_layer):
        G = (rng.random(M) < p_gpu).astype(np.int32)
        bucket = np.flatnonzero(G).astype(np.int32)
        g, gb = tensor(ctx, C.GGML_TYPE_I32, G), tensor(ctx, C.GGML_TYPE_I32, bucket)
        idx = tensor(ctx, C.GGML_TYPE_F32, rng.standard_normal((T, M)).astype(np.float32))
        halves = {}
        for name in ("up", "gate"):
            Wm = (rng.standard_normal((M, K)) * 0.05).astype(np.float32)
            a = ggml.mul_mat_idx(ctx, tensor(ctx, C.GGML_TYPE_Q4_1, Wm), cur, idx, g)
            ggml.format_name(a, f"ffn_{name}_sparse-%d", il)
            b = ggml.mul_mat_idx_upscale(ctx, tensor(ctx, C.GGML_TYPE_Q4_1, Wm[bucket]), cur, idx, gb, M)
            ggml.format_name(b, f"ffn_{name}_sparse_gpu-%d", il)
            halves[name] = ggml.add(ctx, a, b)
            ggml.format_name(halves[name], f"ffn_{name}_sparse_merged-%d", il)
        h = ggml.mul(ctx, ggml.silu(ctx, halves["gate"]), halves["up"])
        ggml.format_name(h, "ffn_gate_par-%d", il)
        Wt = (rng.standard_normal((M, K)) * 0.05).astype(np.float16)
        d = ggml.axpy(ctx, tensor(ctx, C.GGML_TYPE_F16, Wt), h, idx, g)
        ggml.format_name(d, "ffn_down_sparse-%d", il)
        dg = ggml.axpy(ctx, tensor(ctx, C.GGML_TYPE_F16, Wt[bucket]), h, idx, gb, bucket=True)
        ggml.format_name(dg, "ffn_down_sparse_gpu-%d", il)
        cur = ggml.add(ctx, cur, ggml.add(ctx, d, dg))
        ggml.format_name(cur, "l_out-%d", il)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, cur)
    return ctx, gf, cur


cpu_pi.set_sparse_pred_threshold(0.0)
hctx, hgf, hout = hybrid_ffn()
recs = hybrid.graph_compute_hybrid(hgf, 3, lambda n: n.name.rsplit("-", 1)[0].endswith("_gpu"))
t0 = min(r.t_wait for r in recs)
fig, ax = plt.subplots(figsize=(11, 3))
for r in recs:
    y = 1 if r.lane == "gpu" else 0
    ax.barh(y, (r.t_end - r.t_start) / 1e6, left=(r.t_start - t0) / 1e6, height=0.6,
            color="tab:green" if r.lane == "gpu" else "tab:blue", edgecolor="k", lw=0.3)
    if r.t_start - r.t_wait > 200_000:   # waited > 0.2 ms on is_finish
        ax.barh(y, (r.t_start - r.t_wait) / 1e6, left=(r.t_wait - t0) / 1e6, height=0.2, color="tab:red")
    if (r.t_end - r.t_start) > 1_000_000:
        ax.text((r.t_start - t0) / 1e6, y + 0.35, r.name, fontsize=7, rotation=20)
ax.set_yticks([0, 1], ["CPU threads 1-2", "GPU (thread 0)"])
ax.set_xlabel("ms (red: waiting on is_finish)")
plt.tight_layout()
plt.show()
gpu_recs = [r for r in recs if r.lane == "gpu"]
print(f"{len(recs)} nodes; {len(gpu_recs)} on the GPU lane:", ", ".join(r.name for r in gpu_recs))

# %% [markdown]
# ## 6. What the sparsity buys on this model
#
# The compiled kernels (`ggviz/ggml/cpu/fast/sparse.py`, ggml's AVX2 arithmetic lane for lane) at the FFN's shape,
# one thread, one token: MUL_MAT_SPARSE's time falls with the rows it skips; the dense reference here is the same
# kernel keeping every row. (`benchmarks/bench_powerinfer.py` also compares ggviz's repacked dense MUL_MAT,
# which reads 8 rows at once and is faster than any per-row kernel.)

# %%
from ggviz.ggml.cpu.fast import sparse as fast_sparse

raw = np.asarray(Q.quantize_row_ref(C.GGML_TYPE_Q4_1, W)).reshape(-1).view(np.uint8).reshape(M, -1)
mm = fast_sparse.SparseMatMul(C.GGML_TYPE_Q4_1, raw, K)
prep = mm.prepare(X)
times = {}
for frac in (0.0, 0.3, 0.5, 0.9):
    thr = -np.inf if frac == 0 else float(np.quantile(IDX, frac))
    mm.run(prep, IDX, None, thr)
    best = min((lambda t0: (mm.run(prep, IDX, None, thr), time.perf_counter() - t0)[1])(time.perf_counter())
               for _ in range(30))
    times[frac] = best
for frac, t in times.items():
    print(f"{frac:4.0%} rows skipped: {t * 1e6:7.1f} us  ({t / times[0.0]:.2f} x dense, FLOPs x {1 - frac:.2f})")

# %% [markdown]
# **What the speed-up is, and is not, on SmolLM2.** The kernels' time is proportional to the rows they compute, so
# a skipped row is a saved row. But on this SwiGLU model a predictor that keeps the model's quality skips few rows.
# Measured with `benchmarks/bench_powerinfer.py --model ... --eval-tokens 512` on 512 held-out tokens, for a build
# on 30,720 tokens of `pydoc_data.topics` (`ggviz powerinfer build`: recording 1,004 s, training 750 s for 30 layers
# on a loaded 2-core machine; held-out recall 0.887 with 25 % of rows predicted off at threshold 0, 0.985 at 7.2 %
# at −1), dense perplexity 13.43:
#
# | threshold | rows skipped | perplexity vs dense | mean KL | top-1 agreement |
# |---|---|---|---|---|
# | −∞ | 0 % | −0.05 % | 0.0037 | 0.971 |
# | −1 | 7.8 % | +0.82 % | 0.016 | 0.945 |
# | −0.5 | 14.4 % | +0.51 % | 0.043 | 0.908 |
# | 0 | 26.2 % | +4.3 % | 0.116 | 0.844 |
#
# (Even at −∞ the sparse model is not the dense one to the bit, and cannot be: AXPY sums its rows in another order
# than a MUL_MAT. Against the *like-for-like* dense graph — the same F16 down weights through ggml's dense MUL_MAT,
# `pipeline.use_f16_down` — the FFN output of layer 0 agrees to 1e-6, yet the logits still differ by a mean KL of
# 0.003: every later MUL_MAT rounds its input to Q8_1, which turns a 1e-7 difference that crosses a rounding step
# into a 0.4 % jump, and 30 layers compound them. A dense graph changed only in its down weights (Q4_1 → F16 of
# the same values) moves by the same 0.0037: that is this model's noise floor.)
# So an FFN a few per cent cheaper, a whole decode less than that. PowerInfer's large speed-ups come from ReLU
# models where 80–90 % of the rows are skipped *and* from the GPU holding the hot rows: neither is true of SmolLM2,
# whose neurons are neither zero nor strongly hot/cold (section 4: the hottest quarter carries about a third).
