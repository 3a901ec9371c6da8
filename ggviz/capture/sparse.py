"""PowerInfer's sparse runs, recorded: one ``llama_decode`` of a PWRI model with the eval callback copying, per
layer, the predictor's logits (``mlp_pre_out-N``, the ``sparse_idx`` of every sparse node), the true activation
``silu(gate)·up`` (``ffn_gate_par-N``), the CPU half of the up projection (``ffn_up_sparse-N``: a skipped row is an
exact 0 there), the FFN's inputs and output, and the layer's ``gpu_idx`` -- into a ``SparseRun`` of plain arrays,
which ``ggviz.viz.widgets.powerinfer``'s views draw; and ``hybrid_ffn_run``: real layers' sparse FFNs on the inputs
such a run recorded, through the hybrid executor (``graph_compute_hybrid``'s records, the outputs, the transfers
between the CPU and the device).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import llama
from ..ggml import consts as C
from ..ggml.context import init
from ..ggml.cpu import hybrid
from ..ggml.cpu import powerinfer as cpu_pi
from ..ggml.graph import build_forward_expand, new_graph
from ..ggml.ops import format_name, new_tensor_2d
from ..ggml.tensor import get_data, nbytes
from ..llama import powerinfer as lpi
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


# the hybrid executor on real layers

def _is_gpu_node(node) -> bool:
    """PowerInfer: a node runs on the GPU when its weight (src[0]) lives there; in the sparse graph those are the
    ``*_gpu`` nodes (``ffn_up_sparse_gpu-N`` ...), whose src[0] is the layer's hot-row copy."""
    return node.name.rsplit("-", 1)[0].endswith("_gpu")


class _Builder:
    """What ``llm_build_ffn_sparse`` needs of llm_build_context: ``ctx0`` and ``cb`` (name "<name>-<il>")."""

    def __init__(self, ctx):
        self.ctx0 = ctx

    def cb(self, t, name, il):
        format_name(t, "%s-%d", name, il)


def hybrid_ffn_run(model, run: SparseRun, layers, n_threads: int = 3):
    """Run the sparse FFNs of ``layers`` of ``model`` -- the graph ``llm_build_ffn_sparse`` builds, on the inputs the
    decode of ``run`` gave them (its ``ffn_norm-N`` and ``ffn_inp-N``) -- through ``graph_compute_hybrid`` at the
    run's threshold. The layers' FFNs are independent here (each gets its recorded input), so the device and the CPU
    threads can overlap across layers as they do within one. Returns ``(records, outputs, transfers)``: outputs by
    layer (equal to the run's ``ffn_out-N``), transfers as ``device_transfers``."""
    sm = model.sparse
    if sm is None:
        raise ValueError("hybrid_ffn_run: the model is not a PowerInfer (PWRI) model")
    layers = [int(il) for il in layers]
    bad = [il for il in layers if not 0 <= il < run.n_layer]
    if bad:
        raise ValueError(f"layer {bad[0]} is out of range [0, {run.n_layer})")
    ctx = init(64 << 20)
    b = _Builder(ctx)
    gf = new_graph(ctx)
    outs = {}
    cpu_inputs = []

    def inp(name, il):
        a = getattr(run, name)[il]
        t = new_tensor_2d(ctx, C.GGML_TYPE_F32, a.shape[1], a.shape[0])
        get_data(t)[...] = a.reshape(get_data(t).shape)
        format_name(t, f"{name}-%d", il)
        cpu_inputs.append(t)
        return t
    for il in layers:
        outs[il] = lpi.build_ffn_sparse(b, inp("ffn_norm", il), inp("ffn_inp", il), model.layers[il],
                                        sm.layers[il], il, sm.act_type)
        build_forward_expand(gf, outs[il])
    old = cpu_pi.set_sparse_pred_threshold(run.threshold)
    try:
        recs = hybrid.graph_compute_hybrid(gf, n_threads, _is_gpu_node)
    finally:
        cpu_pi.set_sparse_pred_threshold(old)
    out = {il: np.array(get_data(t), F32).reshape(run.n_tokens, -1) for il, t in outs.items()}
    return recs, out, device_transfers(gf, _is_gpu_node, cpu_inputs)


def device_transfers(gf, on_gpu, cpu_inputs=()) -> list[dict]:
    """Every tensor that crosses between the CPU and the device in a hybrid run of ``gf``: a node of one side read by
    a node of the other, or one of ``cpu_inputs`` (activations the CPU made before this graph, e.g. the recorded
    ffn_norm) read on the device. Weights never cross after load: the hot rows were copied there at load time."""
    nodes = list(gf.nodes)
    side = {t.addr: "cpu" for t in cpu_inputs}
    side.update({n.addr: ("device" if on_gpu(n) else "cpu") for n in nodes})
    seen, out = set(), []
    for n in nodes:
        for s in n.src:
            if s is None or s.addr not in side or side[s.addr] == side[n.addr] or (s.addr, side[n.addr]) in seen:
                continue
            seen.add((s.addr, side[n.addr]))
            out.append({"tensor": s.name, "from": side[s.addr], "to": side[n.addr], "bytes": int(nbytes(s)),
                        "read_by": n.name})
    return out
