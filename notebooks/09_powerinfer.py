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
import json
import os
import pathlib
import tempfile
import time

import numpy as np

from ggviz import capture, ggml, llama, viz
from ggviz.ggml import consts as C
from ggviz.ggml import quants as Q
from ggviz.ggml.cpu import ggml_cpu
from ggviz.ggml.cpu import quants as cq
from ggviz.powerinfer import pipeline as P
from ggviz.viz.widgets import Exercise
from ggviz.viz.widgets import powerinfer as PV
from IPython.display import display

# %% [markdown]
# ## 1. The two kernels
#
# `ggml_mul_mat_idx(W, x, idx, gpu_idx)` is a MUL_MAT whose row *r* is set to 0 — without computing it — when
# `gpu_idx[r] == 1` (the row lives on the GPU) or `idx[r] < sparse_pred_threshold` (the predictor's logit says the
# neuron stays off; threshold 0 = probability ½). Threads claim chunks of ⌈rows / (8·threads)⌉ rows from a shared
# counter. A kept row is computed by ggml's own `vec_dot` (here Q4_1 · Q8_1, the AVX2 kernel lane for lane), so it
# is the number ggml's MUL_MAT gives to the bit. (ggviz's readable MUL_MAT sums Q4 blocks in a vectorised NumPy
# order, within ~1e-7 of ggml's; its compiled path, and the sparse kernels, have ggml's bits.)

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
W_rows = np.asarray(ggml.get_data(w)).reshape(-1).view(np.uint8).reshape(M, -1)
G = cq.vec_dot(C.GGML_TYPE_Q4_1, W_rows, cq.from_float(C.GGML_TYPE_Q8_1, X), exact=True).reshape(-1)  # ggml's bits
keep = ~(IDX.reshape(-1) < 0)
display(Exercise(f"`w` is Q4_1 [{K}, {M}]: how many bytes does the kernel read for one kept row (and skip for one "
                 "skipped row)?", int(W_rows.shape[1]), unit="bytes",
                 explain=f"A Q4_1 block is 32 values in {ggml.type_size(C.GGML_TYPE_Q4_1)} bytes (an F16 scale, an "
                         f"F16 min, 16 bytes of nibbles): {K} / 32 × {ggml.type_size(C.GGML_TYPE_Q4_1)} = "
                         f"{W_rows.shape[1]} bytes per row."))
print(f"{ggml.op_name(ys.op)}: {keep.sum()} of {M} rows kept; kept rows equal ggml's vec_dot bit for bit: "
      f"{np.array_equal(S[keep], G[keep])}; skipped rows exactly 0: {np.all(S[~keep] == 0)}; "
      f"readable MUL_MAT within {np.abs(D - G).max() / np.abs(G).max():.1e} (relative)")

# %% [markdown]
# `ggml_axpy(down_t, h, idx, gpu_idx)` computes the down projection **by rows of the transposed matrix**: for each
# neuron *r* that fired, `out += h[r] · down_t[r]` (one `_mm256_fmadd_ps` per 8 floats). A skipped neuron costs
# nothing: that is why PowerInfer stores `ffn_down_t` (F16) besides the model. Each thread sums its share of the
# neurons privately and then adds its vector into the output — **without a lock** in PowerInfer's `ggml.c`:
# `res[i] += tmp[i]` from several threads at once is a data race (two threads read the same `res[i]`, one
# addition is lost). ggviz keeps the partial vectors and adds them in thread order after a barrier.
#
# *Read the code:* ggviz.ggml.ops.mul_mat_idx, ggviz.ggml.ops.axpy, ggviz.ggml.cpu.powerinfer.forward_mul_mat_sparse, ggviz.ggml.cpu.powerinfer.forward_axpy ↔ PowerInfer/ggml.c ggml_mul_mat_idx, ggml_axpy, ggml_compute_forward_mul_mat_sparse, ggml_compute_forward_mul_mat_axpy
#
# ## 2. A PowerInfer model of SmolLM2
#
# PowerInfer never published how it trains its predictors. `ggviz powerinfer build --out DIR` does it: it decodes
# ~30k tokens of Python's own help text (`pydoc_data.topics`), records every layer's FFN input and `silu(gate)·up`
# through the eval callback, trains 30 predictors (576 → 128 → 1536) in NumPy and writes a GGUF whose magic is
# `PWRI`, with `blk.N.fc1`, `blk.N.fc2`, `blk.N.ffn_down_t` and `powerinfer.sparse_threshold`; with `--vram-budget`
# the solver also writes `<model>.generated.gpuidx` (which neurons' rows go to the device).
#
# **This notebook does not train.** A full build records the corpus and trains 30 predictors: most of an hour on two
# cores, too long for a page. So ggviz ships the predictors of one real build (`ggviz/powerinfer/predictors/`:
# trained by `tools/powerinfer_predictor.py` on 16,384 tokens of the corpus, 4 epochs; stored in int8 with one
# scale per output column, 8 MB, checked against its SHA-256 before use), and `pipeline.build_from_shipped` writes
# the PWRI model from them in seconds: the same files `ggviz powerinfer build` writes (the GGUF with `fc1`, `fc2`,
# `ffn_down_t`; the activation counts; the solver's `gpuidx` for a 0.1 GiB budget). Set `GGVIZ_POWERINFER_DIR` to
# the `--out` directory of your own build to see that one instead.
#
# Then the predictor is put to the test here, on **tokens it never saw**: 128 tokens of the corpus after its training
# range go through the dense model, and for every layer we count how many of the active neurons the predictor keeps.

# %%
out_dir = pathlib.Path(os.environ.get("GGVIZ_POWERINFER_DIR", pathlib.Path.home() / ".cache" / "ggviz" / "powerinfer"))
pwri = out_dir / "SmolLM2-135M-Instruct.Q4_1.powerinfer.gguf"
if not pwri.exists():               # no build of your own: the shipped predictor's model (written once, then reused)
    out_dir = pathlib.Path(tempfile.gettempdir()) / f"ggviz_powerinfer_{P.SHIPPED_SHA256[:12]}"
    pwri = out_dir / "SmolLM2-135M-Instruct.Q4_1.powerinfer.gguf"
    if not pwri.exists():
        t0 = time.perf_counter()
        P.build_from_shipped(out_dir, vram_budget_gib=0.1)
        print(f"PWRI model written from the shipped predictor in {time.perf_counter() - t0:.0f} s")
mp = llama.model_default_params()
if pathlib.Path(str(pwri) + ".generated.gpuidx").exists():
    mp.vram_budget_gb = 0.1          # load the solver's split: the graph gets its *_gpu halves
sparse = llama.model_load_from_file(str(pwri), mp)
metrics = json.loads((out_dir / "metrics.json").read_text())
n_layer = sparse.hparams.n_layer
print(pwri.name, "magic", pwri.read_bytes()[:4], "| threshold in the file:", sparse.sparse.sparse_pred_threshold,
      f"| trained on {metrics['tokens']:,} tokens")

# %%
from ggviz.run import load_model

dense = load_model()                 # the dense SmolLM2 the predictors were trained on
preds = [P.Predictor(w1=np.asarray(ggml.get_data(sl.mlp_pre_w1), np.float32).reshape(-1, sl.mlp_pre_w1.ne[0]).T,
                     w2=np.asarray(ggml.get_data(sl.mlp_pre_w2), np.float32).reshape(-1, sl.mlp_pre_w2.ne[0]).T)
         for sl in sparse.sparse.layers]                     # the predictors as the PWRI file holds them
held = P.heldout_recall(dense, preds, metrics["act_threshold"], P.heldout_ids(dense.vocab, metrics, 128))
viz.Table([{"threshold": f"{thr:g}", "held-out recall (mean of 30 layers)": round(v["mean_recall"], 3),
            "lowest layer": f"{min(v['recall']):.3f} (layer {int(np.argmin(v['recall']))})",
            "rows predicted off": f"{v['mean_skipped']:.1%}"} for thr, v in held["by_threshold"].items()],
          title=f"the predictor on {held['tokens']} tokens it was never trained on")

# %% [markdown]
# *Read the code:* ggviz.llama.powerinfer.load_sparse, ggviz.llama.powerinfer.set_gpu_index ↔ PowerInfer/llama.cpp llm_load_sparse_model_tensors

# %% [markdown]
# ## 3. Predictor output vs the true activations
#
# We decode one sentence through the PWRI model **at threshold −∞** (nothing skipped) and copy out, through the eval
# callback, each layer's predictor logits (`mlp_pre_out-N`, the `sparse_idx` every sparse node reads) and the true
# activation `silu(gate)·up` (`ffn_gate_par-N`). Why −∞? (An exercise below.)
#
# A neuron counts as active when |silu(gate)·up| is above its layer's median (the build's definition: SwiGLU has
# no exact zeros). Move the layer and the threshold: red dots are active neurons the kernels would skip (the harm),
# orange ones inactive neurons computed anyway (the waste).

# %%
text = "The quick brown fox jumps over the lazy dog because it wanted to see the river."
ids = llama.tokenize(sparse.vocab, text, add_special=False)[:10]
run_full = capture.capture_sparse_run(sparse, ids, threshold=-np.inf)
PV.PredictorView(run_full, metrics["act_threshold"], layer=10, threshold=0.0)

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
Exercise("The predictor is compared with the activations of a run at threshold −∞ (nothing skipped), not of a run "
         "at the file's threshold. Why?",
         "a skipped neuron's activation is 0 because it was skipped, so it would look inactive",
         choices=["a skipped neuron's activation is 0 because it was skipped, so it would look inactive",
                  "the predictor only runs at threshold −∞", "threshold −∞ makes the decode faster"],
         kind="why",
         explain=f"At a finite threshold a skipped neuron's gate row is 0, so its activation is silu(0)·up = 0: "
                 f"the comparison would count the predictor's own decision as the truth (PredictorView refuses such "
                 f"a run). Here {len(ids)} tokens were decoded with every row computed.")

# %% [markdown]
# *Read the code:* ggviz.llama.powerinfer.build_ffn_sparse, ggviz.ggml.cpu.powerinfer.forward_mul_mat_sparse ↔ PowerInfer/llama.cpp llm_build_ffn_sparse; PowerInfer/ggml.c ggml_compute_forward_mul_mat_sparse

# %% [markdown]
# ## 4. Hot and cold neurons
#
# The build counted, per neuron, how many of the recorded tokens made it active (`activation/activation_N.npy`,
# PowerInfer's `activation_N.pt`). PowerInfer's premise is a power law: on its ReLU models about 20 % of the
# neurons carry most of the activations (its paper's figure), so a GPU that holds that 20 % does most of the work.
# The solver sorts each layer's counts, sums them in buckets of 256 neurons and gives the device the globally
# hottest buckets (`gpu_idx == 1`: left of the green tick). On SwiGLU SmolLM2 the curve is much flatter:

# %%
counts = np.stack([np.load(out_dir / "activation" / f"activation_{il}.npy") for il in range(n_layer)])
PV.HotColdView(counts, run_full.gpu_idx, layer=10)

# %% [markdown]
# *Read the code:* ggviz.llama.powerinfer.load_gpu_split, ggviz.llama.powerinfer.set_gpu_index ↔ PowerInfer/llama.cpp llama_model_offload_ffn_split, slice_ffn_mat_to_gpu

# %% [markdown]
# ## 5. Which rows each MUL_MAT_SPARSE skipped
#
# Now the same sentence at the file's threshold. For every layer, `ffn_up_sparse-N` and `ffn_gate_sparse-N`
# skip row *r* of token *t* when `sparse_idx[t, r] < threshold` (grey) and leave the device's rows (green) to their
# `*_gpu` half; the CPU computes the rest (blue). The skipped rows are exact zeros in the node's output — the test
# suite checks exactly that against this view. AXPY then skips the same neurons: silu(0)·up = 0, and it skips x = 0.

# %%
run = capture.capture_sparse_run(sparse, ids)
PV.SkippedRowsView(run, layer=10, token=3)

# %% [markdown]
# The grey share above is not the "rows skipped" of section 3, for the same layer and threshold. Two reasons, counted
# from the two runs below: section 3 counts **every** row the predictor switches off, in a run where nothing was
# skipped; here the grey counts only the **CPU's** rows (the device's half skips its own rows below the threshold
# too, inside the green), and layer 10's input is not quite the same, because layers 0–9 skipped rows before it.

# %%
il = 10
dev = np.asarray(run.gpu_idx[il]) == 1
off = run.idx[il] < run.threshold
viz.Table([{"rows of layer 10 (all tokens)": "section 3: switched off by the predictor (run at −∞)",
            "share": f"{(run_full.idx[il] < run.threshold).mean():.1%}"},
           {"rows of layer 10 (all tokens)": "section 5: switched off in this run (its input went through 10 sparse "
                                             "layers)", "share": f"{off.mean():.1%}"},
           {"rows of layer 10 (all tokens)": "… of them on the device: its half skips them (inside the green)",
            "share": f"{(off & dev[None, :]).mean():.1%}"},
           {"rows of layer 10 (all tokens)": "… of them on the CPU: the grey above", "share": f"{(off & ~dev[None, :]).mean():.1%}"}],
          title=f"layer {il}, threshold {run.threshold:g}: from section 3's count to section 5's grey")

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.powerinfer.forward_mul_mat_sparse ↔ PowerInfer/ggml.c ggml_compute_forward_mul_mat_sparse

# %% [markdown]
# ## 6. The hybrid executor
#
# With the solver's split, the graph has a second half per FFN matrix: `ffn_up_sparse_gpu` /
# `ffn_gate_sparse_gpu` (`ggml_mul_mat_idx_upscale`) and `ffn_down_sparse_gpu` (AXPY on the bucket), merged by an
# ADD. `ggml_graph_compute_thread_hybrid` runs them: **thread 0 only drives the device** — it walks the graph, waits
# until the sources of each device node are finished (`is_finish`, a new atomic in `ggml_tensor`), launches it —
# while **threads 1…N−1 run the CPU nodes** with `ith − 1` and `nth − 1`.
#
# Below, three real layers of the model: the graph `llm_build_ffn_sparse` builds, fed with the inputs the decode
# above gave those layers, run by `graph_compute_hybrid` on 3 threads (ggviz's stand-in device is a thread running
# the same kernels; their outputs equal the decode's `ffn_out-N` to the bit). Red bars are waits on `is_finish`,
# arrows point from the CPU node a device node waited for. **The times are ggviz's Python kernels** (the predictor's
# F32 `mlp_pre_out` is the slowest node here), not a GPU's: read the order and the overlaps, not the milliseconds.

# %%
layers = [il for il in range(n_layer) if run.gpu_idx[il].any()][8:11] or [8, 9, 10]
recs, outs, transfers = capture.hybrid_ffn_run(sparse, run, layers, n_threads=3)
print("outputs equal the decode's ffn_out:", all(np.array_equal(outs[il], run.ffn_out[il]) for il in layers))
PV.HybridTimelineView(recs, n_threads=3)

# %% [markdown]
# The same executor runs a **whole decode step** when the context asks for it (`llama_context_params.hybrid`,
# `ggviz run --hybrid`: PowerInfer's build-time `GGML_USE_HYBRID_THREADING`). The hot rows' `*_gpu` weights were
# copied into the stand-in device's own memory once, at load; during a step **only activations cross**: each
# device node's host inputs go in, its result comes back. For the contrast, the same model through
# `ggml_backend_sched` (the device's nodes become their own splits, with copies in between) on the 2 CPU threads
# the hybrid run computes its CPU nodes with (`nth = 3 − 1`): the logits are the same to the bit.

# %%
from ggviz.ggml import accel


def decode_step(hybrid_on: bool, n_threads: int):
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.hybrid = 64, n_threads, n_threads, hybrid_on
    c = llama.init_from_model(sparse, cp)
    try:
        assert llama.decode(c, llama.batch_get_one(np.array(ids[:1], np.int32))) == 0    # the first token
        s0 = accel.backend_accel_stats(sparse.sparse.gpu_dev)
        t0 = time.perf_counter()
        assert llama.decode(c, llama.batch_get_one(np.array(ids[1:2], np.int32))) == 0   # the step shown
        dt = time.perf_counter() - t0
        s1 = accel.backend_accel_stats(sparse.sparse.gpu_dev)
        moved = {k: s1[k] - s0[k] for k in ("h2d_bytes", "d2h_bytes")}
        return np.array(c.get_logits_ith(-1), copy=True), list(c.hybrid_records or []), moved, dt
    finally:
        llama.free(c)


L_h, hyb_recs, moved_h, dt_h = decode_step(True, 3)
L_s, _, moved_s, dt_s = decode_step(False, 2)
print(f"hybrid step: {len(hyb_recs)} nodes, {sum(r.lane == 'gpu' for r in hyb_recs)} on the device lane, "
      f"{dt_h * 1e3:.0f} ms; to / from the device {moved_h['h2d_bytes']:,} / {moved_h['d2h_bytes']:,} bytes")
print(f"scheduler step: {dt_s * 1e3:.0f} ms; to / from the device {moved_s['h2d_bytes']:,} / "
      f"{moved_s['d2h_bytes']:,} bytes; logits equal the hybrid run's bit for bit: {np.array_equal(L_h, L_s)}")
hv = PV.HybridTimelineView(hyb_recs, n_threads=3, layer=10)
hv

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.hybrid.graph_compute_hybrid, ggviz.llama.context.LlamaContext.decode ↔ PowerInfer/ggml.c ggml_graph_compute_thread_hybrid; PowerInfer/llama.cpp llm_build_ffn_sparse

# %% [markdown]
# ## 7. What the sparsity buys on this model
#
# First the kernel alone: the compiled MUL_MAT_SPARSE (`ggviz/ggml/cpu/fast/sparse.py`, ggml's AVX2 arithmetic lane
# for lane) at the FFN's shape, one thread, one token, with a growing share of rows skipped. Its time falls with the
# rows it skips. (`benchmarks/bench_powerinfer.py` also compares ggviz's repacked dense MUL_MAT, which reads 8 rows
# at once and is faster than any per-row kernel.)

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
    print(f"{frac:4.0%} rows skipped: {t * 1e6:7.1f} us  ({t / times[0.0]:.2f} x no row skipped)")

# %%
thr_ex = 1.0                         # change the threshold, predict, then run this cell again
mm.run(prep, IDX, None, thr_ex)
kept_ex = M - mm.skipped             # the rows the kernel computed (it counts the ones it skipped)
Exercise(f"`IDX` holds {M} standard-normal predictor logits. At threshold {thr_ex}, how many of the {M} rows does "
         "the kernel compute (within 5 %)?", kept_ex, rel_tol=0.05, unit="rows", kind="rerun",
         explain=f"A row is kept when its logit ≥ {thr_ex}: for a standard normal that is a share "
                 f"1 − Φ({thr_ex}) of the rows; this IDX has {int((IDX >= thr_ex).sum())}, and the kernel computed "
                 f"{kept_ex}.")

# %% [markdown]
# Then the whole decode, per token, from the run of section 5: the FLOPs of every matrix product, dense vs sparse at
# the threshold (the slider recounts the rows from the run's `sparse_idx`), the predictor's price, the weight bytes
# the FFN reads, and the activations that crossed to the device and back in section 6's hybrid run.

# %%
PV.SparseCostView(sparse, run, kernel_times=times, transfers=transfers)

# %% [markdown]
# **What the speed-up is, and is not, on SmolLM2.** The kernels' time is proportional to the rows they compute, so
# a skipped row is a saved row. But on this SwiGLU model a predictor that keeps the model's quality skips few rows.
# Measured by `benchmarks/bench_powerinfer.py --eval-tokens 512` on 512 held-out tokens, for a larger build than
# the shipped one (30,720 training tokens, 8 epochs; held-out recall 0.868 at threshold 0, 0.979 at −1); the dense
# model's perplexity there is 13.39:
#
# | threshold | rows skipped | perplexity vs dense | mean KL | top-1 agreement |
# |---|---|---|---|---|
# | −∞ | 0 % | −0.20 % | 0.0038 | 0.969 |
# | −1 | 9.7 % | +0.02 % | 0.022 | 0.928 |
# | −0.5 | 17.2 % | +1.55 % | 0.055 | 0.879 |
# | 0 | 29.7 % | +4.53 % | 0.143 | 0.805 |
# | *dense, layer 0's FFN output moved by 1 ulp* | — | +0.23 % | 0.0035 | 0.967 |
#
# (Even at −∞ the sparse model is not the dense one to the bit, and cannot be: AXPY sums its rows in another order
# than a MUL_MAT. Against the *like-for-like* dense graph — the same F16 down weights through ggml's dense MUL_MAT,
# `pipeline.use_f16_down` — the FFN output of layer 0 agrees to 1e-6, yet the logits still differ by a mean KL of
# 0.003: every later MUL_MAT rounds its input to Q8_1, which turns a 1e-7 difference that crosses a rounding step
# into a 0.4 % jump, and 30 layers compound them. The last row shows it directly: the *dense* model with nothing
# changed but the last bit of every value of one node moves by KL 0.0035. That is this model's noise floor; a
# KL below 1e-3 at −∞ would need AXPY to add in MUL_MAT's order.)
#
# **So, plainly.** What the speed-up *is*: each skipped row is a row of work not done — the kernel's time falls in
# proportion (section 7's first cell), and the FFN's products shrink by the share of rows skipped (the cost view
# above: about a quarter at threshold 0 with the shipped predictor; 29.7 % in the larger build of the table). What
# it *is not*, on this model:
#
# - **not free**: the predictor costs 16.2 MFLOP per token (576·128 + 128·1536 multiply-adds per layer), 10 % of
#   the dense FFN's 159 MFLOP. Below ~10 % rows skipped the sparse decode does *more* arithmetic than the dense one
#   — and in the table's build threshold −1, the one that keeps perplexity within 1 %, skips 9.7 %. At threshold 0
#   (29.7 % skipped there) the whole decode saves about 12 % of its weight-matrix FLOPs, for +4.5 % perplexity.
# - **not fewer bytes** unless most rows are skipped: a kept neuron reads 1,872 bytes (Q4_1 up and gate rows plus
#   its F16 `ffn_down_t` row, which AXPY needs), the dense FFN 1,080 (all three Q4_1); the sparse FFN reads less only
#   above 42 % skipped. On a memory-bound CPU decode that is the number that matters.
# - **not faster here**: the same benchmark times both models on ggviz's compiled walk (2 threads, 512 tokens,
#   3 alternating rounds): the sparse model takes 1.75× (threshold 0) to 2.1× (−1) the dense model's time. Its
#   MUL_MAT_SPARSE reads one row at a time in the file's plain layout, while the dense model runs repacked
#   8-row GEMMs, and the predictor is extra work.
# - **not PowerInfer's result**: its large speed-ups come from ReLU models where 80–90 % of the rows are skipped
#   *and* from a GPU holding the hot rows that carry most activations. Neither holds for SmolLM2, whose neurons are
#   neither zero nor strongly hot/cold (section 4: the hottest quarter carries about a third); and ggviz's "device"
#   is a thread running the same Python kernels, so section 6 shows the schedule, not a GPU's speed.
#
# *Read the code:* ggviz.ggml.cpu.powerinfer.forward_mul_mat_sparse, ggviz.ggml.cpu.powerinfer.forward_axpy ↔ PowerInfer/ggml.c ggml_compute_forward_mul_mat_sparse, ggml_compute_forward_mul_mat_axpy
