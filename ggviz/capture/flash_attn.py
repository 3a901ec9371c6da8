"""One FLASH_ATTN_EXT node of a real decode, recorded, and one query row walked through it cell by cell: what the
flash-attention stepper (``ggviz.viz.widgets.FlashAttnStepper``) shows.

``capture_flash_attn`` decodes a prompt and the greedy next token with llama.cpp's default context params (flash
attention AUTO, so on for the CPU backend) and copies, through the eval callback, one layer's FLASH_ATTN_EXT node:
its Q, K and V (views of the KV cache), mask, scale and output. ``walk_flash_attn`` then replays one head's query row
as ``ggml_compute_forward_flash_attn_ext_f16_one_chunk`` runs it (the kernel a decode step runs), calling the
kernel's own per-cell functions (``ops.fa_scores``, ``ops.fa_online_step``, ``ops.fa_divide``), and keeps every
step: score s, running max M, rescale ms = expf(Mold - M), weight vs = expf(s - M), running sum S and the F16 VKQ
accumulator. Its ``result`` is the node's output row, bit for bit.

``capture_attn_graphs`` builds one model's graphs with flash attention (llama.cpp's default) and without it, from
two contexts' reserves: node counts, one layer's nodes of each (``attn_graph_diff`` aligns them), the tensors only
one side allocates (``attn_memory``: KQ and its softmax, at the decode's and the reserve's shapes) and both compute
buffers -- what ``ggviz.viz.widgets.AttnGraphsView`` shows.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import numpy as np

from .. import llama
from ..ggml import consts as C
from ..ggml import op_desc, type_name
from ..ggml.cpu import ops
from ..ggml.cpu.common import as_array
from ..ggml.tensor import nbytes
from ..run import load_model
from .eval_callback import EvalCallback
from .nodes import layer_of

F32 = np.float32


@dataclass
class FlashAttnCapture:
    """One FLASH_ATTN_EXT node of a decode step (one query row): ``q`` (n_head, DK) float32, ``k`` / ``v``
    (n_head_kv, n_kv, D) float16 (the cache's cells), ``mask`` (n_kv,) float32 (0 or -inf), ``scale``, ``out``
    (n_head, DV) float32 (the node's output), and the decode it came from."""
    layer: int
    name: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray
    scale: float
    out: np.ndarray
    kernel: str
    prompt: str
    tokens: list = field(default_factory=list)
    token: int = 0
    pos: int = 0


@dataclass
class FlashAttnWalk:
    """One head's query row through the one-chunk kernel, one entry per KV cell the mask lets in (``cells``; the
    kernel skips the others): ``s`` the score, ``M`` / ``S`` the running max and sum after the cell, ``ms`` / ``vs``
    the rescale and the cell's weight, ``acc`` (n_steps, DV) the F16 VKQ accumulator after the cell. ``result`` is
    VKQ / S as the kernel writes it; ``output`` the node's output row."""
    layer: int
    head: int
    kv_head: int
    n_kv: int
    scale: float
    cells: np.ndarray
    s: np.ndarray
    M: np.ndarray
    ms: np.ndarray
    vs: np.ndarray
    S: np.ndarray
    acc: np.ndarray
    result: np.ndarray
    output: np.ndarray
    prompt: str = ""
    pos: int = 0

    def matches_output(self) -> bool:
        """The walk's result and the node's output row, compared bit for bit."""
        return bool(np.array_equal(self.result.view(np.uint32), self.output.view(np.uint32)))


def capture_flash_attn(model=None, layer: int = 0, prompt: str = "The ggml library is", threads: int = 2,
                       n_ctx: int = 256) -> FlashAttnCapture:
    """Decode ``prompt``, then its greedy next token alone, with ``llama.context_default_params()`` (flash attention
    AUTO), and copy layer ``layer``'s FLASH_ATTN_EXT node of that decode step when the eval callback hands it out."""
    model = load_model() if model is None else model
    got: dict = {}
    seen = [0]

    def keep(t, _):
        il = seen[0]
        seen[0] += 1
        if il != layer:
            return True
        q, k, v, mask = t.src[0], t.src[1], t.src[2], t.src[3]
        if int(q.ne[1]) != 1 or int(q.ne[3]) != 1:
            raise ValueError("the stepper walks a decode step's node (one query row)")
        if ops.get_op_params_f32(t, 1) != 0 or ops.get_op_params_f32(t, 2) != 0:
            raise ValueError("the stepper shows a node without ALiBi or softcap")
        n_kv = int(k.ne[1])
        got.update(name=t.name, kernel=ops.fa_kernel(t, threads), scale=float(ops.get_op_params_f32(t, 0)),
                   q=np.array(as_array(q)[0, :, 0], F32), k=np.array(as_array(k)[0], np.float16),
                   v=np.array(as_array(v)[0], np.float16),
                   mask=np.array(as_array(mask)[0, 0][0, :n_kv], F32),
                   out=np.array(as_array(t)[0, 0], F32))
        return True

    cb = EvalCallback(lambda t: t.op == C.GGML_OP_FLASH_ATTN_EXT, copy=None, sink=keep)
    cp = llama.context_default_params()
    cp.n_ctx = n_ctx
    cp.n_threads = cp.n_threads_batch = threads
    ctx = llama.init_from_model(model, cp)
    ids = llama.tokenize(model.vocab, prompt, add_special=True, parse_special=True)
    if not ids:
        raise ValueError("the prompt tokenized to zero tokens")
    if llama.decode(ctx, llama.batch_get_one(ids)) != 0:
        raise RuntimeError("llama_decode failed on the prompt")
    token = int(ctx.get_logits_ith(-1).argmax())
    ctx.cparams.cb_eval = cb
    if llama.decode(ctx, llama.batch_get_one([token])) != 0:
        raise RuntimeError("llama_decode failed on the decode step")
    if not got:
        if seen[0] == 0:
            raise ValueError("the decode graph has no FLASH_ATTN_EXT node (flash attention is off)")
        raise ValueError(f"layer {layer} out of range: the graph has {seen[0]} FLASH_ATTN_EXT nodes")
    return FlashAttnCapture(layer=layer, prompt=prompt, tokens=list(ids), token=token, pos=len(ids), **got)


def walk_flash_attn(cap: FlashAttnCapture, head: int = 0) -> FlashAttnWalk:
    """Head ``head``'s query row through the one-chunk kernel (its functions, its order), every KV cell kept."""
    n_head, n_head_kv = cap.q.shape[0], cap.k.shape[0]
    if not 0 <= int(head) < n_head:
        raise ValueError(f"head {head} out of range: the node has {n_head} heads")
    if cap.kernel != "one_chunk":
        raise ValueError(f"the node ran the {cap.kernel} kernel; the stepper walks the one-chunk kernel")
    head = int(head)
    kvh = head // (n_head // n_head_kv)                       # GQA: the KV head this query head reads
    kr = cap.k[kvh].astype(F32)
    vr = cap.v[kvh].astype(F32)
    mv = cap.mask[None, :].astype(F32)
    s_all = ops.fa_scores(kr, cap.q[head][None, :], True, F32(cap.scale), F32(0), mv)[0]
    M = np.full(1, -np.inf, F32)
    S = np.zeros(1, F32)
    acc = np.zeros((1, vr.shape[1]), np.float16)
    cells = np.flatnonzero(cap.mask != -np.inf)
    rows = {k: [] for k in ("M", "ms", "vs", "S", "acc")}
    act = np.ones(1, bool)
    for j in cells:
        ms, vs = ops.fa_online_step(M, S, acc, s_all[j:j + 1], vr[j], act)
        for k, x in (("M", M[0]), ("ms", ms[0]), ("vs", vs[0]), ("S", S[0]), ("acc", acc[0].copy())):
            rows[k].append(x)
    result = ops.fa_divide(S, acc.astype(F32))[0]
    return FlashAttnWalk(layer=cap.layer, head=head, kv_head=kvh, n_kv=int(cap.mask.shape[0]), scale=cap.scale,
                         cells=cells, s=s_all[cells].astype(F32),
                         **{k: np.array(v, F32) for k, v in rows.items() if k != "acc"},
                         acc=np.array(rows["acc"], np.float16), result=result, output=cap.out[head].copy(),
                         prompt=cap.prompt, pos=cap.pos)


# ---------------------------------------------------------------------------------------------------------------------
# the graph with flash attention beside the graph without it
# ---------------------------------------------------------------------------------------------------------------------

@dataclass
class AttnGraphs:
    """One model's graphs with flash attention (``"fa"``: llama.cpp's default, AUTO resolved to on) and without
    (``"no_fa"``: ``flash_attn_type = 0``), from two contexts of ``n_ctx`` cells. Per side: ``n_nodes`` and ``ops``
    ({op name: count}) of the decode graph (1 token over ``n_kv`` cells), ``compute_buffer`` ({buffer type: bytes},
    from the context's reserve), and layer ``layer``'s nodes in the decode graph (``layer_nodes``) and in the
    prompt-processing reserve graph (``layer_nodes_pp``: ``n_tokens_pp`` tokens over the whole cache, the graph that
    sizes the buffer). A node is a dict: ``n`` (its number in the graph), ``op`` (``ggml_op_desc``: the unary or
    GLU op for those), ``name``, ``type``, ``ne``,
    ``view`` (a view owns no memory) and ``nbytes``."""
    model: str
    n_layer: int
    n_ctx: int
    n_kv: int
    n_tokens_pp: int
    layer: int
    n_nodes: dict
    ops: dict
    compute_buffer: dict
    layer_nodes: dict
    layer_nodes_pp: dict


def _layer_span(gf, il: int):
    """Layer ``il``'s nodes: from the first node named for the layer (``Qcur-0``, ``norm-0`` ...) to its ``l_out``,
    with the unnamed nodes between (ggml names them ``node_<n>``: FLASH_ATTN_EXT, Gemma's Q scaling ...)."""
    names = [gf.nodes[i].name for i in range(gf.n_nodes)]
    start = next((i for i, n in enumerate(names) if layer_of(n) == il), None)
    if start is None or f"l_out-{il}" not in names:
        raise ValueError(f"layer {il} not in the graph")
    return range(start, names.index(f"l_out-{il}") + 1)


def _node_rows(gf, il: int) -> list:
    out = []
    for i in _layer_span(gf, il):
        t = gf.nodes[i]
        out.append({"n": i, "op": op_desc(t), "name": t.name, "type": type_name(t.type),
                    "ne": [int(x) for x in t.ne], "view": t.view_src is not None, "nbytes": int(nbytes(t))})
    return out


def capture_attn_graphs(model=None, n_ctx: int = 256, layer: int = 0) -> AttnGraphs:
    """Two contexts of ``n_ctx`` cells on ``model``, flash attention AUTO (llama.cpp's default) and off: each one's
    decode graph (1 token over the whole cache, built, not computed), its pp reserve graph's layer ``layer`` and the
    compute buffer its reserve sized."""
    model = load_model() if model is None else model
    if not 0 <= int(layer) < model.hparams.n_layer:
        raise ValueError(f"layer {layer} out of range: the model has {model.hparams.n_layer} layers")
    got = {k: {} for k in ("n_nodes", "ops", "compute_buffer", "layer_nodes", "layer_nodes_pp")}
    for side, fa in (("fa", llama.LLAMA_FLASH_ATTN_TYPE_AUTO), ("no_fa", llama.LLAMA_FLASH_ATTN_TYPE_DISABLED)):
        cp = llama.context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.flash_attn_type = n_ctx, 1, 1, fa
        ctx = llama.init_from_model(model, cp)
        try:
            if ctx.flash_attn != (side == "fa"):
                raise RuntimeError(f"flash_attn_type {fa} resolved to flash attention {ctx.flash_attn}")
            st = ctx.reserve_stats
            gf = ctx.build_graph(1, 1, ctx.kv.size).gf
            got["n_nodes"][side] = gf.n_nodes
            ops_ = {}
            for i in range(gf.n_nodes):
                o = op_desc(gf.nodes[i])
                ops_[o] = ops_.get(o, 0) + 1
            got["ops"][side] = ops_
            got["layer_nodes"][side] = _node_rows(gf, int(layer))
            got["layer_nodes_pp"][side] = _node_rows(
                ctx.build_graph(st["n_tokens_pp"], st["n_outputs_pp"], ctx.kv.size).gf, int(layer))
            got["compute_buffer"][side] = dict(ctx.compute_buffer_sizes())
            n_kv, n_tokens_pp = ctx.kv.size, st["n_tokens_pp"]
        finally:
            llama.free(ctx)
    return AttnGraphs(model=llama.model_desc(model), n_layer=model.hparams.n_layer,
                      n_ctx=n_ctx, n_kv=n_kv, n_tokens_pp=n_tokens_pp, layer=int(layer), **got)


def node_key(node: dict) -> tuple:
    """What a node is across the two graphs: its op and its name, ggml's ``node_<n>`` (a number that differs
    between the graphs) read as "(unnamed)"."""
    return node["op"], re.sub(r"^node_\d+", "(unnamed)", node["name"])


def attn_graph_diff(rec: AttnGraphs, pp: bool = False) -> list:
    """The layer's nodes of both graphs aligned (difflib over ``node_key``): rows ``{"no_fa": node or None,
    "fa": node or None, "tag": "same" | "removed" | "added" | "moved"}`` -- "removed": only without flash
    attention, "added": only with it, "moved": in both, at another place in the order."""
    a = (rec.layer_nodes_pp if pp else rec.layer_nodes)["no_fa"]
    b = (rec.layer_nodes_pp if pp else rec.layer_nodes)["fa"]
    sm = difflib.SequenceMatcher(a=[node_key(x) for x in a], b=[node_key(x) for x in b], autojunk=False)
    rows = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            rows += [{"no_fa": a[i], "fa": b[j], "tag": "same"} for i, j in zip(range(i1, i2), range(j1, j2))]
            continue
        rows += [{"no_fa": a[i], "fa": None, "tag": "removed"} for i in range(i1, i2)]
        rows += [{"no_fa": None, "fa": b[j], "tag": "added"} for j in range(j1, j2)]
    # a node both layers have, built in another order (the K and Q views come before V's with flash attention)
    left = {}
    for r in rows:
        if r["tag"] == "added":
            left.setdefault(node_key(r["fa"]), []).append(r)
    for r in rows:
        if r["tag"] == "removed" and left.get(node_key(r["no_fa"])):
            r["tag"] = "moved"
            left[node_key(r["no_fa"])].pop(0)["tag"] = "moved"
    return rows


def attn_memory(rec: AttnGraphs) -> dict:
    """The tensors one side's layer allocates and the other's does not (views excluded: they own no memory), with
    their bytes in the decode graph and in the pp reserve graph (the one that sizes the compute buffer):
    ``{"removed": [...], "added": [...]}``, each row ``{"op", "name", "type", "ne_pp", "bytes_pp", "ne", "bytes"}``."""
    out = {}
    diffs = (attn_graph_diff(rec), attn_graph_diff(rec, pp=True))
    if [r["tag"] for r in diffs[0]] != [r["tag"] for r in diffs[1]]:
        raise ValueError("the decode and reserve graphs of the layer differ in structure")
    for tag, side in (("removed", "no_fa"), ("added", "fa")):
        out[tag] = [{"op": d[side]["op"], "name": node_key(d[side])[1], "type": d[side]["type"],
                     "ne_pp": p[side]["ne"], "bytes_pp": p[side]["nbytes"],
                     "ne": d[side]["ne"], "bytes": d[side]["nbytes"]}
                    for d, p in zip(*diffs) if d["tag"] == tag and not d[side]["view"]]
    return out
