"""One ``llama_decode``, node by node: the frames ``DecodeStepper`` steps through (llama.cpp's ``cb_eval`` asked
about every node, so the scheduler computes the graph one node at a time and hands each result over before the next
node runs -- and possibly overwrites that memory: the graph allocator reuses buffers in place).

``capture_stepper`` runs the decode and returns a ``StepperRecord`` (plain data: one frame per node, each with what
was copied of its result, and the graph it ran as a ``GraphRecord``: the DAG the stepper draws beside the frames),
so a stepper loaded from disk steps and draws the same with no model and no ggml_cgraph.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import llama
from ..ggml import memory
from ..ggml.tensor import get_data_f32, nbytes, nelements, op_desc, type_name
from .eval_callback import EvalCallback
from .graph import GraphRecord, capture_graph
from .nodes import layer_of


@dataclass
class StepperRecord:
    """The frames of one decode.

    ``tokens`` / ``text`` / ``prompt``: what was decoded (the tokens detokenized, special tokens written out);
    ``frames``: one per node, in order: {index, name, op, type, ne, nb, layer, addr, view_src, view_offs, src, data
    (the data address), nbytes, stats {n, n_nonfinite, min, max, mean, std, absmax}, full, buffer, buffer_base,
    offset, buffer_size; ``values`` (ne3, ne2, ne1, ne0) when ``full``, else ``slice`` (the first rows x columns of
    the rows x ne0 view) and ``slice_of`` (its full shape)}; ``logits``: the last token's; ``decode_s``: the
    decode's wall time (with the callback); ``graph``: the graph that ran (``GraphRecord``; None in a record saved
    before it was kept)."""
    tokens: list
    text: str
    prompt: str
    frames: list
    logits: np.ndarray
    decode_s: float
    graph: GraphRecord | None = None


def _stats(a: np.ndarray) -> dict:
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    fin = np.isfinite(a)
    f = a[fin]
    if f.size == 0:
        return {"n": int(a.size), "n_nonfinite": int((~fin).sum()), "min": None, "max": None, "mean": None,
                "std": None, "absmax": None}
    return {"n": int(a.size), "n_nonfinite": int((~fin).sum()), "min": float(f.min()), "max": float(f.max()),
            "mean": float(f.mean()), "std": float(f.std()), "absmax": float(np.abs(f).max())}


def as_rows(a: np.ndarray) -> np.ndarray:
    """(ne3, ne2, ne1, ne0) -> 2-D rows x ne0."""
    return a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)


def _frame(t, i: int, copy_limit: int, slice_rows: int, slice_cols: int) -> dict:
    """What one node's frame keeps of its result (a tensor of more than ``copy_limit`` values: its statistics and
    a slice)."""
    n = nelements(t)
    vals = get_data_f32(t)                       # (ne3, ne2, ne1, ne0), a copy
    r = {"index": i, "name": t.name, "op": op_desc(t), "type": type_name(t.type), "ne": list(t.shape),
         "nb": list(t.strides), "layer": layer_of(t.name), "addr": t.addr,
         "view_src": t.view_src.name if t.view_src is not None else None, "view_offs": t.view_offs,
         "src": [s.name for s in t.src if s is not None], "data": t.data, "nbytes": nbytes(t),
         "stats": _stats(vals), "full": n <= copy_limit}
    try:
        arr, off, label = memory.resolve(t.data, 0)
        base = arr.ctypes.data
        r.update(buffer=label, buffer_base=base, offset=off, buffer_size=int(arr.nbytes))
    except ValueError:
        r.update(buffer="(unregistered)", buffer_base=None, offset=None, buffer_size=None)
    if r["full"]:
        r["values"] = vals
    else:
        rows = as_rows(vals)
        r["slice"] = np.array(rows[:slice_rows, :slice_cols])
        r["slice_of"] = list(rows.shape)
    return r


def capture_stepper(model, tokens, prompt: str | None = None, n_threads: int = 2, n_ctx: int = 256,
                    copy_limit: int = 65536, slice_rows: int = 16, slice_cols: int = 2048, extra_cb=None):
    """Decode ``tokens`` (one ubatch) with every node handed to the eval callback, and keep a frame per node.
    ``extra_cb``: another eval callback called with every result as well. Returns ``(StepperRecord, ctx, graph)``:
    the record, the llama context and the ``GraphResult`` that ran."""
    vocab = llama.model_get_vocab(model)
    tokens = [int(t) for t in tokens]
    text = llama.detokenize(vocab, tokens, remove_special=False, unparse_special=True)
    cp = llama.context_default_params()
    cp.n_ctx = n_ctx
    cp.n_threads = cp.n_threads_batch = n_threads
    # the step shows attention as KQ -> SOFT_MAX -> KQV (the weights are a node); llama.cpp's default on the CPU,
    # one FLASH_ATTN_EXT per layer, has no attention matrix in memory
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if len(tokens) > cp.n_ubatch:
        raise ValueError(f"DecodeStepper records one ubatch: at most {cp.n_ubatch} tokens")
    frames: list[dict] = []
    graph = []

    def hook(res):
        graph[:] = [res]
        frames.clear()

    def ask(t) -> bool:
        if extra_cb is not None:
            extra_cb(t, True)
        return True                                 # every node, each computed alone

    def keep(t, _):
        frames.append(_frame(t, len(frames), copy_limit, slice_rows, slice_cols))
        return extra_cb(t, False) if extra_cb is not None else True

    cp.cb_eval = EvalCallback(ask, copy=None, sink=keep)
    ctx = llama.init_from_model(model, cp)
    ctx.graph_hook = hook
    t0 = time.perf_counter()
    ret = llama.decode(ctx, llama.batch_get_one(tokens))
    decode_s = time.perf_counter() - t0
    ctx.graph_hook = None
    if ret != 0:
        raise RuntimeError(f"llama_decode returned {ret}")
    res = graph[0]
    if len(frames) != res.gf.n_nodes:
        raise RuntimeError(f"recorded {len(frames)} of {res.gf.n_nodes} nodes")
    rec = StepperRecord(tokens=tokens, text=text, prompt=prompt if prompt is not None else text, frames=frames,
                        logits=np.array(llama.get_logits_ith(ctx, -1)), decode_s=decode_s,
                        graph=capture_graph(res.gf))
    return rec, ctx, res
