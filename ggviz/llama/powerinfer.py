"""PowerInfer's sparse model in llama.cpp: the PWRI GGUF's extra tensors, the threshold, the sparse FFN graph.

Mirrors SJTU-IPADS/PowerInfer's llama.cpp: ``llama_use_sparse_inference`` (the file's magic is ``PWRI``), the
sparse tensors of ``llm_load_sparse_model_tensors`` (per layer ``blk.N.fc1.weight`` {n_embd, H} and
``blk.N.fc2.weight`` {H, n_ff} -- ``mlp_pre_w1`` / ``mlp_pre_w2``, the predictor --, and ``blk.N.ffn_down_t.weight``
{n_embd, n_ff}, the down matrix transposed for AXPY), ``hparams.sparse_pred_threshold`` (KV
``powerinfer.sparse_threshold``, env ``LLAMA_SPARSE_PRED_THRESHOLD`` overriding; written to ggml's global by
``offload_ffn_split``), the default ``gpu_idx`` (all zeros: every neuron on the CPU) and empty ``gpu_bucket``
when no ``.generated.gpuidx`` is given, and ``llm_build_ffn_sparse`` with ``llm_build_sparse_mul_mat`` /
``llm_build_sparse_axpy``.

The one deviation, flagged: PowerInfer's ``act_fn`` accepts only ``LLM_FFN_RELU`` (its models are ReLU-fied);
SmolLM2's FFN is SwiGLU, so ggviz's ``act_fn`` also takes SiLU. With SiLU a neuron the predictor drops gives
gate = 0, silu(0) = 0 and so x = 0 into AXPY, which skips it: the same rows are skipped as with ReLU, but the
neurons the predictor keeps are never exactly 0 on their own (SwiGLU has no dead half), which is why this model's
FFN is far less sparse than PowerInfer's ReLU models.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .. import ggml
from ..ggml import accel
from ..ggml import alloc as galloc
from ..ggml import backend as B
from ..ggml import memory
from ..ggml.cpu import powerinfer as cpu_pi
from ..ggml.gguf import GGUFError, load_gguf

LLM_KV_SPARSE_THRESHOLD = "powerinfer.sparse_threshold"

LLM_FFN_RELU = "relu"
LLM_FFN_SILU = "silu"


@dataclass
class SparseLayer:
    """The llama_layer fields PowerInfer added."""
    mlp_pre_w1: object = None        # blk.N.fc1.weight {n_embd, H}
    mlp_pre_w2: object = None        # blk.N.fc2.weight {H, n_ff}
    ffn_down_t: object = None        # blk.N.ffn_down_t.weight {n_embd, n_ff}
    gpu_idx: object = None           # I32 [n_ff]: 1 where the neuron's rows live on the GPU
    gpu_bucket: object = None        # I32 [n_hot]: the hot neurons, sorted
    ffn_up_gpu: object = None        # the hot rows of ffn_up / ffn_gate / ffn_down_t, on the device
    ffn_gate_gpu: object = None
    ffn_down_gpu: object = None
    gpu_offload_ratio: float = 0.0


@dataclass
class SparseModel:
    """What llama_use_sparse_inference turns on: the threshold, the sparse layers, the auxiliary context."""
    sparse_pred_threshold: float
    layers: list
    n_hidden: int                    # the predictor's hidden size H
    aux_ctx: object = None           # gpu_idx / gpu_bucket tensors (PowerInfer's aux_ctx)
    act_type: str = LLM_FFN_SILU
    extra: list = field(default_factory=list)
    gpu_dev: object = None           # the ACCEL device holding the *_gpu rows and gpu_bucket (load_gpu_split)
    gpu_bytes: int = 0               # bytes of device memory they take
    offloaded: list = field(default_factory=list)   # offload_dense_part: [(what, bytes, placed)] in PowerInfer's order


def check_threshold(value, what: str) -> float:
    """A sparse_pred_threshold from a file, the environment or the command line: a number, not NaN (no row would
    ever be compared true) nor +inf (every row skipped: the FFN outputs nothing); -inf keeps every row (the dense
    reference), as PowerInfer's ``atof`` would give it."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} = {value!r} is not a number") from None
    if np.isnan(v) or v == np.inf:
        raise ValueError(f"{what} = {v}: the predictor's threshold must be a number below +inf (NaN compares false "
                         f"with every logit, +inf skips every FFN row); -inf keeps every row")
    return v


def check_vram_budget(value, what: str = "vram_budget_gb") -> float:
    """A VRAM budget in GiB: finite and > 0 (NaN passes ``budget <= 0`` and ``budget > 0`` alike; inf has no byte
    count)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} = {value!r} is not a number") from None
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{what} = {v}: a VRAM budget must be a finite number of GiB > 0")
    return v


def _env_threshold(default: float) -> float:
    v = os.environ.get("LLAMA_SPARSE_PRED_THRESHOLD")
    if v is None or not v.strip():
        return default
    return check_threshold(v, "LLAMA_SPARSE_PRED_THRESHOLD")


def load_sparse(gf, tensors: dict, hp) -> SparseModel:
    """llm_load_sparse_model_tensors' extra tensors and the threshold, for a PWRI file (gf.sparse)."""
    n_embd, n_ff = hp.n_embd, hp.n_ff

    def need(name, ne0=None, ne1=None):
        t = tensors.get(name)
        if t is None:
            raise GGUFError(gf.path, 0, name, "a tensor of a PowerInfer (PWRI) model", "missing", source="PowerInfer")
        if (ne0 is not None and int(t.ne[0]) != ne0) or (ne1 is not None and int(t.ne[1]) != ne1) \
                or int(t.ne[2]) != 1 or int(t.ne[3]) != 1:
            raise GGUFError(gf.path, gf.tensor(name).file_offset, name, f"shape [{ne0 or '*'}, {ne1 or '*'}]",
                            f"{list(t.shape)}", source="PowerInfer")
        return t

    layers = []
    n_hidden = None
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        w1 = need(p + "fc1.weight", n_embd)
        h = int(w1.ne[1])
        n_hidden = h if n_hidden is None else n_hidden
        w2 = need(p + "fc2.weight", h, n_ff)
        dt = need(p + "ffn_down_t.weight", n_embd, n_ff)
        if dt.type != ggml.GGML_TYPE_F16:
            raise GGUFError(gf.path, gf.tensor(p + "ffn_down_t.weight").file_offset, p + "ffn_down_t.weight",
                            "type F16 (PowerInfer's AXPY kernel)", ggml.type_name(dt.type), source="PowerInfer")
        layers.append(SparseLayer(mlp_pre_w1=w1, mlp_pre_w2=w2, ffn_down_t=dt))
    thr = gf.kv.get(LLM_KV_SPARSE_THRESHOLD, 0.0)
    try:
        thr = check_threshold(thr, LLM_KV_SPARSE_THRESHOLD)
    except ValueError as e:
        raise GGUFError(gf.path, 0, LLM_KV_SPARSE_THRESHOLD, "a number below +inf", thr, source="ggviz") from e
    sm = SparseModel(sparse_pred_threshold=_env_threshold(thr), layers=layers, n_hidden=n_hidden or 0)
    set_gpu_index(sm, None, n_ff)
    return sm


def set_gpu_index(sm: SparseModel, gpu_idx_rows, n_ff: int) -> None:
    """Give every layer its gpu_idx / gpu_bucket: from ``gpu_idx_rows`` (per layer an int array of 0/1, the
    .generated.gpuidx file's ``blk.N.gpu_idx``) or, with None, PowerInfer's default: all zeros and an empty bucket."""
    n_layer = len(sm.layers)
    rows = [np.zeros(n_ff, np.int32) for _ in range(n_layer)] if gpu_idx_rows is None else \
        [np.asarray(r, np.int32).reshape(-1) for r in gpu_idx_rows]
    if len(rows) != n_layer or any(r.shape != (n_ff,) for r in rows):
        raise ValueError(f"gpu_idx: need {n_layer} layers of {n_ff} entries, got {len(rows)} layers of "
                         f"{sorted({r.size for r in rows})} entries")
    for il, r in enumerate(rows):
        bad = np.flatnonzero((r != 0) & (r != 1))
        if len(bad):
            raise ValueError(f"gpu_idx: layer {il}, entry {int(bad[0])} is {int(r[bad[0]])}: each entry is 0 (the "
                             f"neuron's rows on the CPU) or 1 (on the GPU)")
    specs = []
    for il, r in enumerate(rows):
        bucket = np.flatnonzero(r).astype(np.int32)
        specs.append((f"blk.{il}.gpu_idx", ggml.GGML_TYPE_I32, [n_ff], r.astype(np.int32)))
        specs.append((f"blk.{il}.gpu_bucket", ggml.GGML_TYPE_I32, [len(bucket)], bucket))
    ts, keep = _host_tensors(specs)
    for il, sl in enumerate(sm.layers):
        sl.gpu_idx, sl.gpu_bucket = ts[2 * il], ts[2 * il + 1]
        sl.gpu_offload_ratio = float(ggml.nelements(sl.gpu_bucket)) / n_ff
        sl.ffn_up_gpu = sl.ffn_gate_gpu = sl.ffn_down_gpu = None
    old, sm.aux_ctx = sm.aux_ctx, keep
    if old is not None:
        sm.extra.append(old)      # tensors of an earlier index may still sit in a cached graph


def _new_tensors(specs, buft=None, usage=None):
    """New tensors (name, type, ne, bytes) in one buffer of ``buft`` (default: the CPU's, like the model's weights:
    the scheduler and the allocator take a tensor without a buffer for one they must allocate, and its data would
    be lost), filled with ggml_backend_tensor_set. Returns ``(tensors, (ctx, buf))``; ``buf`` is None (nothing
    allocated) when the buffer type has no room."""
    ctx = ggml.init(len(specs) * ggml.tensor_overhead() + 1024, no_alloc=True)
    ts = []
    for name, type_, ne, _ in specs:
        t = ggml.new_tensor(ctx, type_, len(ne), list(ne))
        ggml.set_name(t, name)
        ts.append(t)
    buf = galloc.backend_alloc_ctx_tensors_from_buft(ctx, B.backend_cpu_buffer_type() if buft is None else buft)
    if buf is None:
        return ts, (ctx, None)
    if usage is not None:
        B.backend_buffer_set_usage(buf, usage)
    for t, (_, _, _, data) in zip(ts, specs):
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.nbytes:
            B.backend_tensor_set(t, raw, 0, raw.nbytes)
    return ts, (ctx, buf)


def _host_tensors(specs):
    """New tensors (name, type, ne, bytes) in one CPU backend buffer."""
    return _new_tensors(specs)


def apply_threshold(sm: SparseModel) -> None:
    """offload_ffn_split: ``sparse_pred_threshold = model->hparams.sparse_pred_threshold``."""
    cpu_pi.set_sparse_pred_threshold(sm.sparse_pred_threshold)


# ---------------------------------------------------------------------------------------------------------------------
# the graph: llm_build_ffn_sparse
# ---------------------------------------------------------------------------------------------------------------------

def _cbs(builder, il):
    """PowerInfer's ``cbs``: name the tensor "<name>-<il>" (and tell ggviz's builder callback, as cb does)."""
    return lambda t, name: builder.cb(t, name, il)


def build_sparse_mul_mat(ctx, w, inp, idx, w_gpu, gpu_index, gpu_bucket, cb, name: str):
    """llm_build_sparse_mul_mat: the CPU half on every row not on the GPU, plus the GPU half and a merge."""
    full_name = f"ffn_{name}_sparse"
    out = ggml.mul_mat_idx(ctx, w, inp, idx, gpu_index)
    cb(out, full_name)
    if w_gpu is not None:
        out_gpu = ggml.mul_mat_idx_upscale(ctx, w_gpu, inp, idx, gpu_bucket, int(out.ne[0]))
        cb(out_gpu, full_name + "_gpu")
        out = ggml.add(ctx, out, out_gpu)
        cb(out, full_name + "_merged")
    return out


def build_sparse_axpy(ctx, w_t, x, idx, wt_gpu, gpu_index, gpu_bucket, cb, name: str):
    """llm_build_sparse_axpy."""
    full_name = f"ffn_{name}_sparse"
    out = ggml.axpy(ctx, w_t, x, idx, gpu_index)
    cb(out, full_name)
    if wt_gpu is not None:
        out_gpu = ggml.axpy(ctx, wt_gpu, x, idx, gpu_bucket, bucket=True)
        cb(out_gpu, full_name + "_gpu")
        out = ggml.add(ctx, out, out_gpu)
        cb(out, full_name + "_merged")
    return out


def build_ffn_sparse(builder, cur, ffn_inp, layer, sl: SparseLayer, il: int, act_type: str = LLM_FFN_SILU):
    """llm_build_ffn_sparse with LLM_FFN_PAR (gate and up from the same input), the predictor on ``ffn_inp``
    (the residual before ffn_norm: "as for now, llama's pred use the same input as the ffn" in PowerInfer's code,
    though the tensor it passes is ffn_inp)."""
    ctx = builder.ctx0
    cb = _cbs(builder, il)
    # prepare sparse idx
    idx = ggml.mul_mat(ctx, sl.mlp_pre_w1, ffn_inp)
    cb(idx, "mlp_pre_hidden")
    idx = ggml.relu(ctx, idx)
    cb(idx, "mlp_pre_relu")
    idx = ggml.mul_mat(ctx, sl.mlp_pre_w2, idx)
    cb(idx, "mlp_pre_out")

    def act_fn(t, name):
        if act_type == LLM_FFN_RELU:
            t = ggml.relu(ctx, t)
        elif act_type == LLM_FFN_SILU:      # ggviz's flagged deviation: PowerInfer asserts RELU here
            t = ggml.silu(ctx, t)
        else:
            raise ValueError(f"llm_build_ffn_sparse: unsupported activation function {act_type!r}")
        cb(t, name)
        return t

    up_out = build_sparse_mul_mat(ctx, layer.ffn_up, cur, idx, sl.ffn_up_gpu, sl.gpu_idx, sl.gpu_bucket, cb, "up")
    gate_out = build_sparse_mul_mat(ctx, layer.ffn_gate, cur, idx, sl.ffn_gate_gpu, sl.gpu_idx, sl.gpu_bucket, cb,
                                    "gate")
    act_gate = act_fn(gate_out, "ffn_gate_act")
    cur = ggml.mul(ctx, act_gate, up_out)
    cb(cur, "ffn_gate_par")
    return build_sparse_axpy(ctx, sl.ffn_down_t, cur, idx, sl.ffn_down_gpu, sl.gpu_idx, sl.gpu_bucket, cb, "down")


# ---------------------------------------------------------------------------------------------------------------------
# --vram-budget: what goes to the GPU first, and the FFN split (.generated.gpuidx)
# ---------------------------------------------------------------------------------------------------------------------

def offload_plan(model, budget_bytes: int, n_ctx: int = 512, kv_type_size: int = 2) -> dict:
    """llm_load_sparse_model_tensors' order under a VRAM budget: the attention of every layer, then the predictors,
    then the ffn_norms, then the output layer, then the KV cache (llama_reserve_model_kv_cache); only when all of
    that fits (``tensor_offload_complete``) does the rest go to FFN neurons (llm_load_gpu_split). Returns
    ``{"steps": [(what, bytes, fits)], "neuron_bytes": bytes left for neurons}`` (ggviz does not move anything)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)) or budget_bytes < 0:
        raise ValueError(f"offload_plan: budget_bytes = {budget_bytes!r} must be an integer >= 0 (bytes)")
    hp = model.hparams
    sm = model.sparse
    left = int(budget_bytes)
    steps = []
    nb = ggml.nbytes
    groups = [
        ("attention", sum(nb(t) for ly in model.layers for t in (ly.attn_norm, ly.wq, ly.wk, ly.wv, ly.wo))),
        ("predictor", sum(nb(sl.mlp_pre_w1) + nb(sl.mlp_pre_w2) for sl in sm.layers) if sm is not None else 0),
        ("ffn_norm", sum(nb(ly.ffn_norm) for ly in model.layers)),
        ("output", nb(model.output_norm) + nb(model.output)),
        ("kv_cache", 2 * hp.n_layer * n_ctx * hp.n_embd_k_gqa * kv_type_size),
    ]
    complete = True
    for what, size in groups:
        fits = complete and size <= left
        if fits:
            left -= size
        else:
            complete = False
        steps.append((what, int(size), fits))
    return {"steps": steps, "neuron_bytes": left if complete else 0}


def _plan_groups(model) -> dict:
    """The weights of offload_plan's steps (the KV cache is not a weight: see offload_dense_part)."""
    sm = model.sparse
    return {
        "attention": [t for ly in model.layers for t in (ly.attn_norm, ly.wq, ly.wk, ly.wv, ly.wo) if t is not None],
        "predictor": [t for sl in sm.layers for t in (sl.mlp_pre_w1, sl.mlp_pre_w2)] if sm is not None else [],
        "ffn_norm": [ly.ffn_norm for ly in model.layers if ly.ffn_norm is not None],
        "output": [t for t in (model.output_norm, model.output) if t is not None],
    }


def offload_dense_part(model, budget_bytes: int, dev) -> list:
    """llm_load_sparse_model_tensors under --vram-budget: the steps of ``offload_plan`` that fit the budget, in
    PowerInfer's order (attention of every layer, the predictors, the ffn_norms, the output layer), move their
    weights into one WEIGHTS buffer of ``dev`` (ggml_cuda_transform_tensor; the host bytes are the file mapping's,
    copied once). What ggviz's loader cannot do: the KV cache step -- ggviz's KV cache is allocated by the
    context on each layer's device (``n_gpu_layers`` / ``offload_kqv``), so a PWRI model's cache stays in host
    memory; the step is planned (its bytes are kept out of the neurons' budget, as PowerInfer does) but not placed.
    Weights already in a buffer (layers offloaded by ``n_gpu_layers``) are left where they are. The loader does
    this only with ``llama_model_params.vram_offload_dense``: the device runs the faithful kernels, whose Q4_1
    MUL_MAT adds in another order than the CPU's repacked one, so the run's bits then differ from the CPU-only
    run's (as a GPU's would); without it only the FFN split is on the device and the hybrid run keeps the CPU's
    bits.
    Returns ``[(what, bytes, placed)]`` per step; raises MemoryError (nothing moved) when the device has no room."""
    plan = offload_plan(model, budget_bytes)
    groups = _plan_groups(model)
    moved, steps = [], []
    for what, size, fits in plan["steps"]:
        placed = fits and what in groups
        if placed:
            moved.extend(t for t in groups[what] if t.buffer == 0 and t.data != 0)
        steps.append((what, size, placed))
    moved = list({t.addr: t for t in moved}.values())
    if not moved:
        return steps
    buft = B.backend_dev_buffer_type(dev)
    align = B.backend_buft_get_alignment(buft)
    size = sum(ggml.GGML_PAD(B.backend_buft_get_alloc_size(buft, t), align) for t in moved)
    buf = B.backend_buft_alloc_buffer(buft, size)
    if buf is None:
        free, total = B.backend_dev_memory(dev)
        raise MemoryError(f"offload_dense_part: {size} bytes of {B.backend_buft_name(buft)} memory needed for "
                          f"{', '.join(w for w, _, p in steps if p)}; {free} of {total} are free")
    B.backend_buffer_set_usage(buf, B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    talloc = galloc.tallocr_new(buf)
    for t in moved:
        n = ggml.nbytes(t)
        arr, off, _ = memory.resolve(t.data, n)
        src = arr[off:off + n]
        t.data = 0
        galloc.tallocr_alloc(talloc, t)
        B.backend_tensor_set(t, src, 0, n)
    model.bufs.append(buf)
    return steps


def _rows(w, rows: np.ndarray) -> np.ndarray:
    """create_striped_mat_to_gpu's source: the given rows of ``w`` (raw bytes, one row per line)."""
    rb = ggml.row_size(w.type, int(w.ne[0]))
    return np.asarray(ggml.get_data(w)).reshape(-1).view(np.uint8).reshape(int(w.ne[1]), rb)[rows]


def gpu_split_device(model):
    """The device that takes the FFN split: the first ACCEL device of the model params' ``devices``, else the
    ACCEL reg's ACCEL0 (PowerInfer's g_main_device)."""
    for d in (model.params.devices or []):
        if not isinstance(d, str) and accel.buft_is_accel(B.backend_dev_buffer_type(d)):
            return d
    return B.backend_reg_dev_get(accel.backend_accel_reg(), 0)


def _device_tensors(specs, dev):
    """New tensors (name, type, ne, bytes) in one buffer of ``dev``'s memory (usage WEIGHTS), filled with
    ggml_backend_tensor_set: the load's only host -> device copies (PowerInfer's ggml_cuda_transform_tensor).
    Raises MemoryError (nothing allocated) when the device has no room."""
    buft = B.backend_dev_buffer_type(dev)
    ts, keep = _new_tensors(specs, buft, B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    if keep[1] is None:
        free, total = B.backend_dev_memory(dev)
        need = sum(ggml.nbytes(t) for t in ts)
        raise MemoryError(f"load_gpu_split: the FFN split needs {need} bytes of {B.backend_buft_name(buft)} memory, "
                          f"{free} of {total} are free (a smaller --vram-budget, or a device with more capacity)")
    return ts, keep


def read_split_file(path) -> tuple[list, int | None]:
    """A .generated.gpuidx file (PowerInfer's ``generic.gpu_index`` GGUF, magic PWRI), read-only and checked:
    ``blk.N.gpu_idx`` (I32, each entry 0 or 1) and ``blk.N.gpu_bucket`` (I32, the sorted indices of its 1s) for
    N = 0 .. block_count - 1, nothing else. Returns (per-layer gpu_idx arrays, ``split.vram_capacity`` or None).
    Raises GGUFError naming the tensor, the entry and the value."""
    gf = load_gguf(path)
    if not gf.sparse or gf.arch != "generic.gpu_index":
        raise GGUFError(gf.path, 0, "header", "a PowerInfer gpu index (PWRI, generic.gpu_index)",
                        f"{gf.magic!r} / {gf.arch}", source="PowerInfer")
    names = {t.name for t in gf.tensors}
    n = 0
    while f"blk.{n}.gpu_idx" in names:
        n += 1
    block_count = gf.kv.get("generic.gpu_index.block_count", n)
    if len(names) != 2 * n or block_count != n:
        extra = sorted(names - {f"blk.{i}.{k}" for i in range(n) for k in ("gpu_idx", "gpu_bucket")})
        raise GGUFError(gf.path, 0, "tensors", f"blk.N.gpu_idx and blk.N.gpu_bucket for N < block_count "
                        f"({block_count})", f"{len(names)} tensors" + (f", e.g. {extra[0]}" if extra else ""),
                        source="PowerInfer")
    rows = []
    for il in range(n):
        gi, gb = gf.tensor(f"blk.{il}.gpu_idx"), gf.tensor(f"blk.{il}.gpu_bucket")
        for t in (gi, gb):
            if t.type != ggml.GGML_TYPE_I32:
                raise GGUFError(gf.path, t.info_start, t.name, "type I32", t.type_name, source="PowerInfer")
        r = gf.tensor_data(gi.name).view(np.int32).copy()
        bad = np.flatnonzero((r != 0) & (r != 1))
        if len(bad):
            k = int(bad[0])
            raise GGUFError(gf.path, gi.file_offset + 4 * k, gi.name, "each entry 0 (CPU) or 1 (GPU)",
                            f"{int(r[k])} at entry {k}", source="PowerInfer")
        b = gf.tensor_data(gb.name).view(np.int32)
        if not np.array_equal(np.flatnonzero(r), b):
            raise GGUFError(gf.path, gb.file_offset, gb.name, f"the sorted indices of the 1s of {gi.name}",
                            f"{len(b)} entries that are not", source="PowerInfer")
        rows.append(r)
    cap = gf.kv.get("split.vram_capacity")
    return rows, (int(cap) if cap is not None else None)


def load_gpu_split(model, path, dev=None, budget_bytes: int | None = None) -> int:
    """load_gpu_split_from_split_file + slice_ffn_mat_to_gpu: read ``blk.N.gpu_idx`` / ``gpu_bucket`` from a
    .generated.gpuidx file, copy each layer's hot rows of ffn_up / ffn_gate / ffn_down_t into ``*_gpu`` tensors
    and, for those layers, ``gpu_bucket`` too (PowerInfer's ``ggml_cuda_transform_tensor(gpu_bucket)``), all in one
    buffer of the accelerator's memory (``dev``, default ``gpu_split_device``): loaded once, never copied again --
    the graph's ``*_gpu`` nodes then run on the device (the hybrid executor's thread 0, or the scheduler's ACCEL
    split). ``gpu_idx`` stays in host memory: the CPU halves read it. Returns the bytes the device copies take.

    The file is checked against the model as PowerInfer's loader does (``load_gpu_idx_for_model``: one gpu_idx and
    one gpu_bucket per layer of the model, each gpu_idx of n_ff entries) and, given ``budget_bytes`` (the
    --vram-budget), against it (``check_vram_allocable``: the file's ``split.vram_capacity`` <= the budget; a split
    solved for a larger budget is refused -- PowerInfer solves a new one there, ggviz's build does that).
    On any error (bad file, no room on the device) the model is left as it was."""
    rows, cap = read_split_file(path)
    sm = model.sparse
    n_ff = model.hparams.n_ff
    if len(rows) != len(sm.layers):
        raise GGUFError(path, 0, "block_count", f"{len(sm.layers)} layers (this model's)", f"{len(rows)} layers",
                        source="PowerInfer")
    for il, r in enumerate(rows):
        if r.shape != (n_ff,):
            raise GGUFError(path, 0, f"blk.{il}.gpu_idx", f"{n_ff} entries (this model's n_ff)",
                            f"{r.size} entries", source="PowerInfer")
    if budget_bytes is not None and (cap is None or cap > budget_bytes):
        gib = 1 << 30
        raise ValueError(f"{path}: this FFN split was solved for a VRAM budget of "
                         + (f"{cap / gib:.4g} GiB (split.vram_capacity = {cap} bytes)" if cap is not None
                            else "an unknown size (no split.vram_capacity)")
                         + f", more than the budget ({budget_bytes} bytes = {budget_bytes / gib:.4g} GiB): rebuild "
                           f"it for this budget "
                           f"(ggviz powerinfer build --vram-budget GiB) or give a larger --vram-budget")
    specs, where = [], []
    for il, (sl, ly, r) in enumerate(zip(sm.layers, model.layers, rows)):
        bucket = np.flatnonzero(r).astype(np.int32)
        if not len(bucket):
            continue          # PowerInfer: "no hybrid inference for this layer, unset gpu_bucket"
        for attr, w in (("ffn_up_gpu", ly.ffn_up), ("ffn_gate_gpu", ly.ffn_gate), ("ffn_down_gpu", sl.ffn_down_t)):
            specs.append((w.name + "_gpu", w.type, [int(w.ne[0]), len(bucket)], _rows(w, bucket)))
            where.append((il, attr))
        specs.append((f"blk.{il}.gpu_bucket", ggml.GGML_TYPE_I32, [len(bucket)], bucket))
        where.append((il, "gpu_bucket"))
    dev = dev if dev is not None else gpu_split_device(model)
    placed = _device_tensors(specs, dev) if specs else None       # may raise: nothing changed yet
    set_gpu_index(sm, rows, n_ff)
    total = 0
    if placed is not None:
        dts, keep = placed
        sm.extra.append(keep)
        for t, (il, attr) in zip(dts, where):
            setattr(sm.layers[il], attr, t)
            total += ggml.nbytes(t)
    sm.gpu_dev = dev if placed is not None else None
    sm.gpu_bytes = total
    return total
