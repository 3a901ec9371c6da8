"""One MUL_MAT of a real decode, its operands and its output, recorded: what ``VecDotLanes`` (ggml's AVX2
``ggml_vec_dot_q4_1_q8_1``, lane by lane) recomputes and checks bit for bit.
"""
from __future__ import annotations

import numpy as np

from .. import llama
from ..ggml import consts as C
from ..ggml.tensor import get_data_f32, type_name
from ..run import load_model
from .eval_callback import EvalCallback

F32 = np.float32


def capture_mul_mat(model=None, node: str = "Qcur-0", prompt: str = "The ggml library is", threads: int = 2):
    """Decode ``prompt`` (one ubatch, llama.cpp's default context on ``threads`` threads) and keep the MUL_MAT named
    ``node``: its weight's name and Q4_1 rows (the GGUF file's bytes: the repacked copy in memory holds the same
    blocks, interleaved), its src1 columns and its output (float32 copies, taken when llama.cpp's eval callback
    hands the node out). Returns a dict."""
    model = load_model() if model is None else model
    got: dict = {}

    def keep(t, _):
        src0, src1 = t.src[0], t.src[1]
        got.update(weight=src0.name, w_type=int(src0.type), ne=(int(src0.ne[0]), int(src0.ne[1])),
                   src1_name=src1.name, y=np.array(get_data_f32(src1), F32).reshape(-1, int(src1.ne[0])),
                   out=np.array(get_data_f32(t), F32).reshape(-1, int(t.ne[0])))

    # ask only for this node: the rest of the graph computes uninterrupted
    cb = EvalCallback(lambda t: t.name == node and t.op == C.GGML_OP_MUL_MAT, copy=None, sink=keep)

    cp = llama.context_default_params()
    cp.n_ctx = 256
    cp.n_threads = cp.n_threads_batch = threads
    cp.cb_eval = cb
    ctx = llama.init_from_model(model, cp)
    ids = llama.tokenize(model.vocab, prompt, add_special=True, parse_special=True)
    if llama.decode(ctx, llama.batch_get_one(ids)) != 0:
        raise RuntimeError("llama_decode failed on the prompt")
    if not got:
        raise ValueError(f"the graph has no MUL_MAT named {node!r}")
    if got["w_type"] != C.GGML_TYPE_Q4_1:
        raise ValueError(f"{got['weight']} is {type_name(got['w_type'])}: the lanes view shows Q4_1 x Q8_1")
    raw = np.asarray(model.gguf.tensor_data(got["weight"]))
    got["w_rows"] = raw.reshape(got["ne"][1], -1)
    got["node"] = node
    got["tokens"] = list(ids)
    return got
