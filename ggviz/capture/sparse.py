"""PowerInfer's sparse runs, recorded: one ``llama_decode`` of a PWRI model with the eval callback copying, per
layer, the predictor's logits (``mlp_pre_out-N``, the ``sparse_idx`` of every sparse node), the true activation
``silu(gate)·up`` (``ffn_gate_par-N``), the CPU half of the up projection (``ffn_up_sparse-N``: a skipped row is an
exact 0 there), the FFN's inputs and output, and the layer's ``gpu_idx`` -- into a ``SparseRun`` of plain arrays,
which ``ggviz.viz.widgets.powerinfer``'s views draw.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import llama
from ..ggml.cpu import powerinfer as cpu_pi
from ..ggml.tensor import get_data
from .eval_callback import EvalCallback

F32 = np.float32

SKIPPED, COMPUTED, ON_DEVICE = 0, 1, 2          # a row of MUL_MAT_SPARSE: skipped by the CPU, computed, on the device


@dataclass
class SparseRun:
    """One decode of a PWRI model, per layer (lists indexed by layer; arrays are tokens x width, float32)."""
    ids: list
    threshold: float                 # sparse_pred_threshold while it ran
    n_threads: int
    idx: list                        # mlp_pre_out-N: the predictor's logits, the sparse nodes' src[2]
    act: list                        # ffn_gate_par-N: silu(gate)·up, what AXPY multiplies
    up: list                         # ffn_up_sparse-N: MUL_MAT_SPARSE's CPU half (0 on skipped and device rows)
    ffn_inp: list
    ffn_norm: list
    ffn_out: list                    # the FFN's output (the merged down projection)
    gpu_idx: list                    # per layer int32 [n_ff]: 1 where the row lives on the device
    logits: np.ndarray = None
    extra: dict = field(default_factory=dict)

    @property
    def n_layer(self) -> int:
        return len(self.idx)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    @property
    def n_ff(self) -> int:
        return int(self.idx[0].shape[1])

    def row_class(self, il: int, threshold: float | None = None) -> np.ndarray:
        """tokens x n_ff: SKIPPED (the CPU kernel's ``idx < threshold`` on a CPU row), COMPUTED, ON_DEVICE."""
        thr = self.threshold if threshold is None else threshold
        cls = np.where(self.idx[il] < thr, SKIPPED, COMPUTED).astype(np.int8)
        cls[:, np.asarray(self.gpu_idx[il]) == 1] = ON_DEVICE
        return cls


_CAPTURE = ("mlp_pre_out", "ffn_gate_par", "ffn_up_sparse", "ffn_inp", "ffn_norm", "ffn_out")


def capture_sparse_run(model, ids, threshold: float | None = None, n_threads: int = 2) -> SparseRun:
    """llama_decode ``ids`` (one sequence, all logits) through a PWRI model at ``threshold`` (None: the model's
    ``sparse_pred_threshold``), copying every layer's sparse tensors through the eval callback. The global threshold
    is restored afterwards."""
    if getattr(model, "sparse", None) is None:
        raise ValueError("capture_sparse_run: the model is not a PowerInfer (PWRI) model (model.sparse is None)")
    ids = [int(t) for t in ids]
    if not ids:
        raise ValueError("capture_sparse_run: no tokens")
    n_layer, n_ff = model.hparams.n_layer, model.hparams.n_ff
    thr = model.sparse.sparse_pred_threshold if threshold is None else float(threshold)
    cb = EvalCallback(lambda t: t.name.rsplit("-", 1)[0] in _CAPTURE,
                      copy=lambda t: np.array(get_data(t), F32).reshape(len(ids), -1))

    cp = llama.context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = max(len(ids), 8)
    cp.n_threads = cp.n_threads_batch = n_threads
    ctx = llama.init_from_model(model, cp)
    ctx.cparams.cb_eval = cb
    batch = llama.batch_init(len(ids))
    for i, t in enumerate(ids):
        llama.batch_add(batch, t, i, [0], True)
    old = cpu_pi.set_sparse_pred_threshold(thr)
    try:
        rc = llama.decode(ctx, batch)
        got = cb.by_name()
        if rc != 0:
            raise RuntimeError(f"capture_sparse_run: llama_decode returned {rc}")
        logits = np.array(ctx.logits, F32)
    finally:
        cpu_pi.set_sparse_pred_threshold(old)
        llama.free(ctx)

    def per_layer(name):
        return [got[f"{name}-{il}"] for il in range(n_layer)]
    gpu = [np.array(get_data(sl.gpu_idx), np.int32).reshape(n_ff) for sl in model.sparse.layers]
    return SparseRun(ids=ids, threshold=thr, n_threads=n_threads, idx=per_layer("mlp_pre_out"),
                     act=per_layer("ffn_gate_par"), up=per_layer("ffn_up_sparse"), ffn_inp=per_layer("ffn_inp"),
                     ffn_norm=per_layer("ffn_norm"), ffn_out=per_layer("ffn_out"), gpu_idx=gpu, logits=logits)
