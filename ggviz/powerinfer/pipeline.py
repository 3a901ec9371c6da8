"""PowerInfer's offline pipeline on a ggviz model: record FFN activations, train the predictor, write the PWRI GGUF.

Not a C file. PowerInfer ships converted ReLU models with trained predictors (Deja Vu style: Linear -> ReLU ->
Linear, no biases) but not the training code; this is the missing piece, in NumPy, for SmolLM2 (SwiGLU):

1. ``record``: decode ~30k tokens of ``pydoc_data.topics`` (ships with Python) in sequences of ``seq_len`` with
   llama's eval callback (``cb_eval``) asking for ``ffn_inp-N`` (the predictor's input: the residual before
   ffn_norm, as in PowerInfer's graph) and ``ffn_swiglu-N`` (silu(gate)*up, what enters the down projection). A
   neuron is "active" for a token when |silu(gate)*up| is above the layer's median (taken on the first sequence):
   SwiGLU has no exact zeros, so "active" must be a choice; the median makes half the neurons active on average.
   The per-neuron active counts are PowerInfer's ``activation_N.pt`` (here ``activation/activation_N.npy``).
2. ``train_layer``: 576 -> H (128) ReLU -> 1536, Deja Vu's weighted binary cross-entropy (positives weighted
   ``pos_weight``, so that a missed active neuron costs more than a wasted row), Adam, minibatches; the inputs are
   scaled per feature for training and the scale is folded into fc1 (the graph multiplies the raw ffn_inp).
3. ``write_powerinfer_gguf``: every tensor and KV of the dense file, plus per layer ``blk.N.fc1.weight`` {n_embd, H}
   (F32), ``blk.N.fc2.weight`` {H, n_ff} (F32), ``blk.N.ffn_down_t.weight`` {n_embd, n_ff} (F16: ffn_down
   dequantized and transposed, PowerInfer's AXPY layout) and ``powerinfer.sparse_threshold``; the magic becomes
   ``PWRI`` (PowerInfer's converter patches the first 4 bytes the same way).

``main`` is ``ggviz powerinfer build --out DIR [--tokens N] [--vram-budget GiB]``.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import time
from dataclasses import dataclass, field

import gguf
import numpy as np
from pydoc_data.topics import topics as PYDOC_TOPICS

from .. import ggml, llama
from ..capture import EvalCallback
from ..cli import ArgumentParser, float_arg
from ..ggml.gguf import load_gguf
from ..ggml import quants as Q
from ..llama import powerinfer as lpi
from ..progress import progress, write
from . import solver

DEFAULT_MODEL = pathlib.Path(__file__).resolve().parent.parent.parent / "data" / "models" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"
POWERINFER_MAGIC = b"PWRI"
F32 = np.float32


def corpus_tokens(vocab, n_tokens: int) -> list[int]:
    """The first ``n_tokens`` tokens of the help topics of ``pydoc_data.topics`` (sorted by name), no BOS."""
    ids: list[int] = []
    for name in sorted(PYDOC_TOPICS):
        ids += llama.tokenize(vocab, PYDOC_TOPICS[name], add_special=False)
        if len(ids) >= n_tokens:
            break
    if len(ids) < n_tokens:
        raise ValueError(f"pydoc_data.topics has only {len(ids)} tokens, asked for {n_tokens}")
    return ids[:n_tokens]


@dataclass
class Recording:
    """What ``record`` captured, per layer: inputs (float16, tokens x n_embd), active flags (bits packed along the
    neurons by ``np.packbits``: tokens x n_ff/8 bytes, 1.5 MB per 1k tokens and layer instead of 12 MB of bools),
    the activation magnitude threshold (the layer's median) and the per-neuron active counts."""
    x: list
    active: list
    act_threshold: np.ndarray
    counts: np.ndarray               # (n_layer, n_ff) int64
    n_tokens: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def _ctx(model, n_ctx: int, threads: int):
    cp = llama.context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = cp.n_ubatch = n_ctx
    cp.n_threads = cp.n_threads_batch = threads
    # PowerInfer's llama.cpp has no flash attention: the dense model runs its attention as a PWRI model does
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return llama.init_from_model(model, cp)


def _batch_all_logits(ids):
    b = llama.batch_init(len(ids))
    for i, t in enumerate(ids):
        llama.batch_add(b, int(t), i, [0], True)
    return b


def record(model, tokens, seq_len: int = 256, threads: int = 2, bar=None) -> Recording:
    """Decode ``tokens`` in sequences of ``seq_len`` (KV cleared between them) and capture every layer's FFN
    input and activations through the eval callback."""
    hp = model.hparams
    n_layer, n_ff = hp.n_layer, hp.n_ff
    want = {f"ffn_inp-{il}": ("x", il) for il in range(n_layer)}
    want.update({f"ffn_swiglu-{il}": ("a", il) for il in range(n_layer)})
    xs = [[] for _ in range(n_layer)]
    acts = [[] for _ in range(n_layer)]
    thr = np.full(n_layer, np.nan, F32)
    counts = np.zeros((n_layer, n_ff), np.int64)

    def reduce(t, a):
        kind, il = want[t.name]
        if kind == "x":
            xs[il].append(a.astype(np.float16))
        else:
            mag = np.abs(a)
            if np.isnan(thr[il]):
                thr[il] = np.median(mag)
            on = mag > thr[il]
            counts[il] += on.sum(0)
            acts[il].append(np.packbits(on, axis=1))

    # the corpus is long: each value is reduced as it comes (float16 inputs, packed activity bits), not kept
    cb = EvalCallback(lambda t: t.name in want,
                      copy=lambda t: np.array(ggml.get_data(t), dtype=F32).reshape(-1, int(t.ne[0])),
                      sink=reduce)

    ctx = _ctx(model, seq_len, threads)
    ctx.cparams.cb_eval = cb
    t0 = time.perf_counter()
    n = 0
    try:
        for s in range(0, len(tokens) - 1, seq_len):
            chunk = tokens[s:s + seq_len]
            llama.memory_clear(llama.get_memory(ctx), True)
            rc = llama.decode(ctx, _batch_all_logits(chunk))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} on the recording sequence at token {s}")
            n += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        ctx.cparams.cb_eval = None
        llama.free(ctx)
    return Recording(x=[np.concatenate(v) for v in xs], active=[np.concatenate(v) for v in acts],
                     act_threshold=thr, counts=counts, n_tokens=n, seconds=time.perf_counter() - t0)


def save_recording(rec: Recording, d) -> None:
    """The recording as .npy files (``x_N`` float16, ``active_N`` packed bits, ``counts``, ``act_threshold``) and
    ``recording.json``: training can then be rerun without decoding the corpus again."""
    d = pathlib.Path(d)
    d.mkdir(parents=True, exist_ok=True)
    for il, (x, a) in enumerate(zip(rec.x, rec.active)):
        np.save(d / f"x_{il}.npy", x)
        np.save(d / f"active_{il}.npy", a)
    np.save(d / "counts.npy", rec.counts)
    np.save(d / "act_threshold.npy", rec.act_threshold)
    (d / "recording.json").write_text(json.dumps({"n_tokens": rec.n_tokens, "seconds": rec.seconds,
                                                  "n_layer": len(rec.x)}))


def load_recording(d) -> Recording:
    """save_recording's files, read fully into memory (np.load without mmap: no memmap reaches a matmul)."""
    d = pathlib.Path(d)
    meta = json.loads((d / "recording.json").read_text())
    n_layer = int(meta["n_layer"])
    return Recording(x=[np.load(d / f"x_{il}.npy") for il in range(n_layer)],
                     active=[np.load(d / f"active_{il}.npy") for il in range(n_layer)],
                     act_threshold=np.load(d / "act_threshold.npy"), counts=np.load(d / "counts.npy"),
                     n_tokens=int(meta["n_tokens"]), seconds=float(meta["seconds"]))


# ---------------------------------------------------------------------------------------------------------------------
# the predictor
# ---------------------------------------------------------------------------------------------------------------------

@dataclass
class Predictor:
    w1: np.ndarray                   # (n_embd, H): h = relu(x @ w1)   (fc1's data is w1.T: ggml {n_embd, H})
    w2: np.ndarray                   # (H, n_ff):  z = h @ w2          (fc2's data is w2.T: ggml {H, n_ff})
    loss: list = field(default_factory=list)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(np.asarray(x, F32) @ self.w1, F32(0)) @ self.w2


def unpack_active(packed: np.ndarray, n_ff: int) -> np.ndarray:
    """Recording.active's packed bits -> bool (tokens x n_ff)."""
    return np.unpackbits(np.asarray(packed, np.uint8), axis=1, count=n_ff).astype(bool)


# Defaults chosen on held-out tokens of a 30,720-token recording (layers 3, 15, 27; recall / rows dropped at
# thresholds 0 and -1): positive weight 2.0 with 4 epochs gave 0.888 / 24 % and 0.985 / 6.7 %, too few rows dropped
# at -1; 1.5 with 4 epochs 0.82 / 34 % at 0 (recall too low); 1.75 with 8 epochs 0.857 / 30 % and 0.976 / 9.3 %;
# 2.0 with 8 epochs 0.883 / 26 % and 0.982 / 7.8 %. More epochs sharpen the logits (more rows below -1 at the same
# recall); the weight moves the operating point. 1.85 with 8 epochs sits between the last two.
POS_WEIGHT = 1.85
EPOCHS = 8


def train_layer(x: np.ndarray, y_packed: np.ndarray, n_ff: int, hidden: int = 128, epochs: int = EPOCHS,
                batch: int = 256, lr: float = 2e-3, pos_weight: float = POS_WEIGHT, seed: int = 0) -> Predictor:
    """Deja Vu's predictor for one layer: Adam on the weighted BCE of sigmoid(relu(x W1) W2) against y (the packed
    active bits, unpacked one minibatch at a time). All float32: the matmuls go to BLAS's sgemm, and every scalar
    is a float32 or a Python float (NumPy keeps float32 then), so nothing is silently promoted to float64."""
    rng = np.random.default_rng(seed)
    x = np.asarray(x, F32)
    y_packed = np.ascontiguousarray(y_packed, np.uint8)
    n, d = x.shape
    scale = x.std(0) + F32(1e-3)                  # per-feature scale, folded into W1 at the end
    xs = x / scale
    w1 = (rng.standard_normal((d, hidden)) / np.sqrt(d)).astype(F32)
    w2 = (rng.standard_normal((hidden, n_ff)) / np.sqrt(hidden)).astype(F32)
    params = [w1, w2]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1, b2, eps = 0.9, 0.999, 1e-8
    step = 0
    losses = []
    pw1 = F32(pos_weight - 1.0)
    for _ in range(epochs):
        order = rng.permutation(n)
        tot, cnt = 0.0, 0
        for s in range(0, n, batch):
            ix = np.sort(order[s:s + batch])               # sorted: the gathers walk memory forwards
            xb = xs[ix]
            yb = np.unpackbits(y_packed[ix], axis=1, count=n_ff).astype(F32)
            hpre = xb @ w1
            h = np.maximum(hpre, F32(0))
            z = np.clip(h @ w2, F32(-30), F32(30))
            p = F32(1) / (F32(1) + np.exp(-z))
            wgt = F32(1) + pw1 * yb                        # positives weigh pos_weight, negatives 1
            if step % 16 == 0:                             # the loss now and then (it costs a log per entry)
                # -w [y log p + (1-y) log(1-p)] = w (softplus(z) - y z)
                tot += float((wgt * (np.logaddexp(F32(0), z) - yb * z)).mean())
                cnt += 1
            gz = wgt * (p - yb)
            gz *= F32(1.0 / (len(ix) * n_ff))
            g2 = h.T @ gz
            gh = gz @ w2.T
            gh *= hpre > 0
            g1 = xb.T @ gh
            step += 1
            c1, c2 = 1.0 - b1 ** step, 1.0 - b2 ** step
            for i, g in enumerate((g1, g2)):
                m[i] *= b1
                m[i] += (1 - b1) * g
                v[i] *= b2
                v[i] += (1 - b2) * (g * g)
                params[i] -= (lr / c1) * m[i] / (np.sqrt(v[i] / c2) + eps)
        losses.append(tot / max(cnt, 1))
    return Predictor(w1=(w1 / scale[:, None]).astype(F32), w2=w2.astype(F32), loss=losses)


def recall_sparsity(pred: Predictor, x: np.ndarray, y: np.ndarray, threshold: float) -> tuple[float, float]:
    """Recall of the active neurons, and the fraction of neurons the predictor drops (logit < threshold)."""
    keep = ~(pred.logits(np.asarray(x, F32)) < threshold)
    y = np.asarray(y, bool)
    return float((keep & y).sum() / max(y.sum(), 1)), float(1.0 - keep.mean())


# ---------------------------------------------------------------------------------------------------------------------
# the PWRI GGUF
# ---------------------------------------------------------------------------------------------------------------------

def down_t_f16(model, il: int) -> np.ndarray:
    """ffn_down dequantized and transposed: (n_ff, n_embd) float16, row r = neuron r's output column."""
    t = model.layers[il].ffn_down
    raw = np.asarray(ggml.get_data(t)).reshape(-1).view(np.uint8)
    n_embd, n_ff = int(t.ne[1]), int(t.ne[0])
    w = np.asarray(Q.dequantize_row(t.type, raw.reshape(n_embd, -1)), F32).reshape(n_embd, n_ff)
    return np.ascontiguousarray(w.T).astype(np.float16)


def use_f16_down(model) -> list:
    """Make ``model`` (a dense one) the like-for-like reference of a PWRI model at threshold -inf: every layer's
    ``ffn_down`` becomes the F16 matrix the PWRI file's ``ffn_down_t`` holds (the same dequantized values, not
    transposed: {n_ff, n_embd}), so the dense MUL_MAT rounds its input to F16 (F16's vec_dot_type) exactly as AXPY
    does and multiplies the same weights; the two then differ only in the order of the float32 sums. Against the
    Q4_1 dense graph the down projection would also differ in its input rounding (Q8_1 blocks vs F16), which on
    SmolLM2 moves the logits by a mean KL of ~4e-3 by itself. Returns what keeps the new tensors alive (the caller
    holds it as long as the model is used)."""
    specs = []
    for il, ly in enumerate(model.layers):
        w = np.ascontiguousarray(down_t_f16(model, il).T)          # (n_embd, n_ff): ggml {n_ff, n_embd}
        specs.append((ly.ffn_down.name, ggml.GGML_TYPE_F16, [w.shape[1], w.shape[0]], w))
    ts, keep = lpi._host_tensors(specs)
    for ly, t in zip(model.layers, ts):
        ly.ffn_down = t
    return [keep]


def write_powerinfer_gguf(src_path, out_path, predictors: list, down_t: list, threshold: float) -> None:
    """Copy the dense GGUF, add fc1 / fc2 / ffn_down_t per layer and the threshold KV, mark it PWRI.

    The source is read with ggviz's own GGUF reader (``ggml.gguf.load_gguf``: KVs with their types, tensors as
    views of the mapped file); gguf-py's ``GGUFReader`` builds a memmap slice per vocabulary string and took
    ~6-13 s here for SmolLM2's 49k tokens and merges. The file written is the same byte for byte."""
    gf = load_gguf(os.fspath(src_path))
    arch = str(gf.kv["general.architecture"])
    w = gguf.GGUFWriter(os.fspath(out_path), arch)
    for k in gf.kv_info:
        if k.key.startswith("GGUF.") or k.key == "general.architecture":
            continue
        v = gf.kv[k.key]
        sub = gguf.GGUFValueType(k.item_type) if k.item_type is not None else None
        w.add_key_value(k.key, v.tolist() if isinstance(v, np.ndarray) else v, gguf.GGUFValueType(k.type), sub)
    w.add_key_value("powerinfer.sparse_threshold", float(threshold), gguf.GGUFValueType.FLOAT32)
    for t in gf.tensors:
        # the bytes shaped as gguf-py hands them to the writer: rows of ne[0] values (F32 / F16) or of row bytes
        a = gf.tensor_data(t.name).reshape(*[int(x) for x in t.ne][::-1][:-1], -1)
        if t.type in (ggml.GGML_TYPE_F32, ggml.GGML_TYPE_F16):
            a = a.view(np.float32 if t.type == ggml.GGML_TYPE_F32 else np.float16)
        w.add_tensor(t.name, a, raw_dtype=gguf.GGMLQuantizationType(t.type))
    for il, (p, dt) in enumerate(zip(predictors, down_t)):
        w.add_tensor(f"blk.{il}.fc1.weight", np.ascontiguousarray(p.w1.T, F32))
        w.add_tensor(f"blk.{il}.fc2.weight", np.ascontiguousarray(p.w2.T, F32))
        w.add_tensor(f"blk.{il}.ffn_down_t.weight", np.ascontiguousarray(dt, np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(out_path, "r+b") as f:
        f.write(POWERINFER_MAGIC)


# ---------------------------------------------------------------------------------------------------------------------
# the shipped predictor: trained once, stored in int8, turned into a PWRI model in seconds
# ---------------------------------------------------------------------------------------------------------------------

# A full build (record + train) takes most of an hour on 2 cores; the book cannot wait that long, and a 64-token toy
# predictor (what it trained before) has a held-out recall of ~0.54: a coin flip, not PowerInfer's mechanism. So the
# predictors of a real build ship with ggviz, trained by ``train_shipped`` (tools/powerinfer_predictor.py) on the
# recording of ``corpus_tokens`` for SmolLM2-135M-Instruct.Q4_1, each matrix in int8 with one float32 scale per
# output column (8.1 MB for 30 layers instead of 32 MB of float32); ``build_from_shipped`` writes the PWRI GGUF from
# them. The file is checked against its SHA-256 before use.
SHIPPED_PREDICTOR = pathlib.Path(__file__).resolve().parent / "predictors" / "SmolLM2-135M-Instruct.Q4_1.npz"
SHIPPED_SHA256 = "e6bd3d15571b135b13c425ea8333ce6db06deb450cc05a89f8dbcef9fa3e0ea6"


def _q8_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 per output column (the last axis): w ~= q * scale, |q| <= 127."""
    w = np.asarray(w, F32)
    scale = (np.abs(w).max(0) / F32(127)).astype(F32)
    scale[scale == 0] = F32(1)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


def save_predictors(path, preds: list, counts: np.ndarray, act_threshold: np.ndarray, meta: dict) -> None:
    """The predictors (int8 + column scales), the per-neuron activation counts and thresholds, and ``meta`` (JSON)."""
    arrays = {}
    for il, p in enumerate(preds):
        arrays[f"w1_q_{il}"], arrays[f"w1_s_{il}"] = _q8_columns(p.w1)
        arrays[f"w2_q_{il}"], arrays[f"w2_s_{il}"] = _q8_columns(p.w2)
    np.savez_compressed(path, counts=np.asarray(counts, np.int32), act_threshold=np.asarray(act_threshold, F32),
                        meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)


def load_predictors(path=None, sha256: str | None = None):
    """``save_predictors``' file -> (predictors with the int8 weights dequantized, counts, act_threshold, meta).
    ``path`` None: the shipped file, checked against ``SHIPPED_SHA256`` (ValueError when it differs)."""
    if path is None:
        path, sha256 = SHIPPED_PREDICTOR, SHIPPED_SHA256
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no predictor file at {path}")
    if sha256 is not None:
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != sha256:
            raise ValueError(f"{path.name}: SHA-256 {got[:16]}... is not the shipped file's {sha256[:16]}...: "
                             f"the file is damaged or was replaced")
    with np.load(path) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        n_layer = int(meta["n_layer"])
        preds = [Predictor(w1=(z[f"w1_q_{il}"].astype(F32) * z[f"w1_s_{il}"]).astype(F32),
                           w2=(z[f"w2_q_{il}"].astype(F32) * z[f"w2_s_{il}"]).astype(F32)) for il in range(n_layer)]
        return preds, np.array(z["counts"], np.int64), np.array(z["act_threshold"], F32), meta


def capture_ffn(model, ids, threads: int = 2) -> tuple[list, list]:
    """One sequence through the dense model: every layer's predictor input (``ffn_inp-N``) and activation
    (``ffn_swiglu-N``, silu(gate)*up), float32 (tokens x n_embd, tokens x n_ff)."""
    n_layer = model.hparams.n_layer
    want = {f"ffn_inp-{il}": 0 for il in range(n_layer)}
    want.update({f"ffn_swiglu-{il}": 1 for il in range(n_layer)})
    got = [[None] * n_layer, [None] * n_layer]

    def keep(t, a):
        got[want[t.name]][int(t.name.rsplit("-", 1)[1])] = a

    cb = EvalCallback(lambda t: t.name in want,
                      copy=lambda t: np.array(ggml.get_data(t), dtype=F32).reshape(-1, int(t.ne[0])), sink=keep)
    ctx = _ctx(model, len(ids), threads)
    ctx.cparams.cb_eval = cb
    try:
        if llama.decode(ctx, _batch_all_logits(ids)) != 0:
            raise RuntimeError("llama_decode failed")
    finally:
        ctx.cparams.cb_eval = None
        llama.free(ctx)
    return got[0], got[1]


def heldout_recall(model, preds: list, act_threshold, ids, thresholds=(0.0, -0.5, -1.0)) -> dict:
    """The predictors on tokens they were not trained on (one decode of ``ids`` through the dense model): per
    threshold and layer, of the neurons active (|silu(g)*u| above the layer's ``act_threshold``) the share the
    predictor keeps (recall), and the share of rows it drops; and their means over layers."""
    xs, acts = capture_ffn(model, ids)
    out = {"tokens": len(ids), "by_threshold": {}}
    for thr in thresholds:
        rs = [recall_sparsity(p, xs[il], np.abs(acts[il]) > act_threshold[il], thr) for il, p in enumerate(preds)]
        out["by_threshold"][float(thr)] = {"recall": [r for r, _ in rs], "skipped": [s for _, s in rs],
                                           "mean_recall": float(np.mean([r for r, _ in rs])),
                                           "mean_skipped": float(np.mean([s for _, s in rs]))}
    return out


def heldout_ids(vocab, meta: dict, n: int) -> list[int]:
    """``n`` tokens of the build's held-out range of the corpus (after its training tokens): never trained on. The
    shipped file lists the first 256 (``meta["heldout_ids"]``, so that a check need not tokenize 16k tokens)."""
    if len(meta.get("heldout_ids") or ()) >= n:
        return [int(t) for t in meta["heldout_ids"][:n]]
    t = int(meta["tokens"])
    return corpus_tokens(vocab, t + n)[t:t + n]


def build_from_shipped(out_dir, model_path=DEFAULT_MODEL, threshold: float = 0.0, vram_budget_gib: float | None = None,
                       artifact=None) -> BuildResult:
    """The PWRI model of the shipped predictor (``artifact``: another ``save_predictors`` file, unchecked): the same
    files as ``build`` (model, activation counts, gpuidx with ``vram_budget_gib``, metrics.json with the recall the
    training measured), in seconds."""
    threshold, vram_budget_gib, _ = check_build_args(tokens=16, heldout=1, seq_len=1, hidden=1, epochs=1, threads=1,
                                                     threshold=threshold, vram_budget_gib=vram_budget_gib,
                                                     pos_weight=1.0)
    preds, counts, act_thr, meta = load_predictors(artifact)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = llama.model_load_from_file(os.fspath(model_path), llama.model_default_params())
    try:
        if model.sparse is not None:
            raise ValueError(f"{model_path} is already a PowerInfer (PWRI) model")
        hp = model.hparams
        if len(preds) != hp.n_layer or preds[0].w2.shape[1] != hp.n_ff or preds[0].w1.shape[0] != hp.n_embd:
            raise ValueError(f"the predictor file is for {len(preds)} layers of {preds[0].w1.shape[0]} -> "
                             f"{preds[0].w2.shape[1]}, not this model's {hp.n_layer} of {hp.n_embd} -> {hp.n_ff}")
        act_dir = out / "activation"
        act_dir.mkdir(exist_ok=True)
        for il in range(hp.n_layer):
            np.save(act_dir / f"activation_{il}.npy", counts[il])
        dst = out / pathlib.Path(model_path).name.replace(".gguf", ".powerinfer.gguf")
        write_powerinfer_gguf(model_path, dst, preds, [down_t_f16(model, il) for il in range(hp.n_layer)],
                              threshold)
    finally:
        llama.model_free(model)
    gpuidx, split = None, {}
    if vram_budget_gib is not None:
        budget = int(vram_budget_gib * (1 << 30))
        pm = llama.model_load_from_file(os.fspath(dst))
        plan = lpi.offload_plan(pm, budget)
        gpuidx, cap, solved = solver.write_gpuidx(dst, counts, plan["neuron_bytes"], pm.layers[0].ffn_up, budget)
        llama.model_free(pm)
        split = {"vram_budget": budget, "offload_steps": plan["steps"], "neuron_bytes": plan["neuron_bytes"],
                 "neuron_cap": cap, "hot_per_layer": solved}
    metrics = {**split, **{k: v for k, v in meta.items() if k != "n_layer"}, "shipped": True,
               "act_threshold": [float(v) for v in act_thr]}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return BuildResult(dst, gpuidx, metrics)


# ---------------------------------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------------------------------

@dataclass
class BuildResult:
    model_path: pathlib.Path
    gpuidx_path: pathlib.Path | None
    metrics: dict


def check_build_args(*, tokens, heldout, seq_len, hidden, epochs, threads, threshold, vram_budget_gib,
                     pos_weight) -> tuple:
    """build's numbers: the counts integers >= their minimum, ``threshold`` a finite number (NaN: the file is
    refused when loaded; +-inf: every FFN row skipped, or none), ``pos_weight`` finite and > 0, ``vram_budget_gib``
    None or finite and > 0 (inf has no byte count). Returns (threshold, vram_budget_gib, pos_weight) as floats."""
    for name, v, lo in (("tokens", tokens, 16), ("heldout", heldout, 1), ("seq_len", seq_len, 1),
                        ("hidden", hidden, 1), ("epochs", epochs, 1), ("threads", threads, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"powerinfer build: {name} = {v!r} must be an integer >= {lo}")
    out = []
    for name, v, positive in (("threshold", threshold, False), ("pos_weight", pos_weight, True),
                              ("vram_budget", vram_budget_gib, True)):
        if v is None and name == "vram_budget":
            out.append(None)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"powerinfer build: {name} = {v!r} is not a number") from None
        if not np.isfinite(f) or (positive and not f > 0):
            raise ValueError(f"powerinfer build: {name} = {f} must be a finite number" + (" > 0" if positive else ""))
        out.append(f)
    return out[0], out[2], out[1]


def build(out_dir, model_path=DEFAULT_MODEL, tokens: int = 30720, heldout: int = 2048, seq_len: int = 256,
          hidden: int = 128, epochs: int = EPOCHS, threshold: float = 0.0, vram_budget_gib: float | None = None,
          threads: int = 2, quiet: bool = False, recording=None, pos_weight: float = POS_WEIGHT) -> BuildResult:
    """The whole pipeline. ``recording``: a directory; when it holds a recording (``save_recording``) of at least
    ``tokens + heldout`` tokens it is used instead of decoding the corpus again, otherwise the new recording is saved
    there. Every number is checked before anything is read or written (ValueError naming it)."""
    threshold, vram_budget_gib, pos_weight = check_build_args(tokens=tokens, heldout=heldout, seq_len=seq_len,
                                                              hidden=hidden, epochs=epochs, threads=threads,
                                                              threshold=threshold, vram_budget_gib=vram_budget_gib,
                                                              pos_weight=pos_weight)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mp = llama.model_default_params()
    model = llama.model_load_from_file(os.fspath(model_path), mp)
    if model.sparse is not None:
        raise ValueError(f"{model_path} is already a PowerInfer (PWRI) model")
    hp = model.hparams
    ids = corpus_tokens(model.vocab, tokens + heldout)
    rec = None
    if recording is not None and (pathlib.Path(recording) / "recording.json").exists():
        rec = load_recording(recording)
        if rec.n_tokens < tokens + heldout or len(rec.x) != hp.n_layer:
            rec = None
        else:
            n = tokens + heldout
            if rec.n_tokens > n:            # the counts of the tokens used, as a fresh recording would have them
                rec.x, rec.active, rec.n_tokens = [v[:n] for v in rec.x], [v[:n] for v in rec.active], n
                rec.counts = np.stack([unpack_active(a, hp.n_ff).sum(0) for a in rec.active]).astype(np.int64)
    if rec is None:
        with progress(total=tokens + heldout, desc="record activations", unit="tok", disable=quiet or None) as bar:
            rec = record(model, ids, seq_len=seq_len, threads=threads, bar=bar)
        if recording is not None:
            save_recording(rec, recording)
    act_dir = out / "activation"
    act_dir.mkdir(exist_ok=True)
    for il in range(hp.n_layer):
        np.save(act_dir / f"activation_{il}.npy", rec.counts[il])
    preds, layer_metrics = [], []
    t0 = time.perf_counter()
    for il in progress(range(hp.n_layer), desc="train predictors", unit="layer", disable=quiet or None):
        x, y = rec.x[il], rec.active[il]
        p = train_layer(x[:tokens], y[:tokens], hp.n_ff, hidden=hidden, epochs=epochs, pos_weight=pos_weight,
                        seed=il)
        preds.append(p)
        m = {"layer": il, "loss": [round(v, 5) for v in p.loss]}
        y_held = unpack_active(y[tokens:], hp.n_ff)
        for thr in (0.0, -0.5, -1.0):
            rc, sp = recall_sparsity(p, x[tokens:], y_held, thr)
            m[f"recall@{thr}"], m[f"skipped@{thr}"] = round(rc, 4), round(sp, 4)
        layer_metrics.append(m)
    t_train = time.perf_counter() - t0
    name = pathlib.Path(model_path).name.replace(".gguf", ".powerinfer.gguf")
    dst = out / name
    write_powerinfer_gguf(model_path, dst, preds, [down_t_f16(model, il) for il in range(hp.n_layer)], threshold)
    gpuidx = None
    split = {}
    if vram_budget_gib is not None:
        # PowerInfer's order: attention, predictor, ffn_norm, output, KV cache first; neurons get what is left
        budget = int(vram_budget_gib * (1 << 30))
        pm = llama.model_load_from_file(os.fspath(dst))
        plan = lpi.offload_plan(pm, budget)
        gpuidx, cap, solved = solver.write_gpuidx(dst, rec.counts, plan["neuron_bytes"], pm.layers[0].ffn_up, budget)
        llama.model_free(pm)
        split = {"vram_budget": budget, "offload_steps": plan["steps"], "neuron_bytes": plan["neuron_bytes"],
                 "neuron_cap": cap, "hot_per_layer": solved}
    metrics = {**split, "tokens": tokens, "heldout": heldout, "epochs": epochs, "pos_weight": pos_weight,
               "record_s": round(rec.seconds, 1), "train_s": round(t_train, 1),
               "act_threshold": [float(v) for v in rec.act_threshold], "layers": layer_metrics}
    for thr in ("0.0", "-0.5", "-1.0"):
        metrics[f"mean_recall@{thr}"] = float(np.mean([m[f"recall@{thr}"] for m in layer_metrics]))
        metrics[f"mean_skipped@{thr}"] = float(np.mean([m[f"skipped@{thr}"] for m in layer_metrics]))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    llama.model_free(model)
    return BuildResult(dst, gpuidx, metrics)


def main(argv=None) -> int:
    ap = ArgumentParser(prog="ggviz powerinfer", description="PowerInfer's offline pipeline on the default model")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND", required=True)
    b = sub.add_parser("build", help="record activations, train the predictor, write the PWRI GGUF (+ gpuidx)")
    b.add_argument("--out", required=True, metavar="DIR")
    b.add_argument("--model", default=str(DEFAULT_MODEL), metavar="GGUF")
    b.add_argument("--tokens", type=int, default=30720, help="training tokens (default 30720)")
    b.add_argument("--heldout", type=int, default=2048, help="held-out tokens for the recall figures")
    b.add_argument("--epochs", type=int, default=EPOCHS, help=f"training epochs (default {EPOCHS})")
    b.add_argument("--pos-weight", type=float_arg(0.0, open_lo=True), default=POS_WEIGHT,
                   help=f"weight of an active neuron in the BCE (default {POS_WEIGHT}; higher keeps more rows)")
    b.add_argument("--threshold", type=float_arg(), default=0.0, help="powerinfer.sparse_threshold written to the file")
    b.add_argument("--vram-budget", type=float_arg(0.0, open_lo=True), default=None, metavar="GiB",
                   help="also write <model>.generated.gpuidx for this budget (the solver)")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--recording", default=None, metavar="DIR",
                   help="reuse the recording saved in DIR (or save the new one there)")
    b.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.tokens < 16 or args.heldout < 1 or args.epochs < 1 or args.threads < 1:
        ap.error("--tokens must be >= 16, --heldout, --epochs and --threads >= 1")
    r = build(args.out, args.model, tokens=args.tokens, heldout=args.heldout, epochs=args.epochs,
              threshold=args.threshold, vram_budget_gib=args.vram_budget, threads=args.threads, quiet=args.quiet,
              recording=args.recording, pos_weight=args.pos_weight)
    m = r.metrics
    write(f"wrote {r.model_path}" + (f" and {r.gpuidx_path}" if r.gpuidx_path else ""))
    write(f"record {m['record_s']} s, train {m['train_s']} s; held-out recall / rows skipped: "
          + ", ".join(f"thr {t}: {m[f'mean_recall@{t}']:.3f} / {m[f'mean_skipped@{t}']:.3f}"
                      for t in ("0.0", "-0.5", "-1.0")))
    return 0

