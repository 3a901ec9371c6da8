"""The pieces every model graph is built from, as llama.cpp's ``llm_graph_context`` (llama-graph.cpp).

Mirrors ``build_inp_embd``, ``build_inp_pos``, ``build_attn_inp_kv``, ``build_attn_inp_kv_iswa``,
``build_inp_out_ids``, ``build_norm``, ``build_qkv`` (separate Q/K/V weights), ``build_ffn`` (SILU or GELU with a
parallel gate: the fused SWIGLU / GEGLU), ``build_attn`` (KV-cache and iSWA-KV-cache versions) and
``build_attn_mha`` (flash attention -- one FLASH_ATTN_EXT reading K and V from the cache, V not transposed, an F16
mask -- or KQ, SOFT_MAX, KQV). The architectures' graphs are in ``models/`` (llama.cpp's
``src/models/<arch>.cpp``). The callback ``cb`` names tensors ``"<name>-<il>"`` exactly like llama.cpp's graph
callback, so node names, order, ops and shapes equal llama.cpp's decode graphs (1086 nodes for one SmolLM2 decode
step, 817 for Gemma-3 270M without flash attention; 936 and 727 with it, llama.cpp's default on the CPU).

The builder only creates tensors in a ``no_alloc`` context and records the graph inputs; the llama context fills
the inputs, allocates and computes. ggviz: it also records which dims it took from n_tokens, n_outputs and n_kv
(``GraphResult.tok_dims`` / ``kv_dims``), so that ``derive_graph`` can turn a built graph that is not in use into
the graph of another ubatch shape, byte for byte what a build would make, instead of building it again.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from .. import ggml
from ..ggml.consts import GGML_TENSOR_SIZE
from ..ggml.tensor import _Q_SRC, _Q_VIEW_OFFS, _Q_VIEW_SRC, _name_pack, arena_structs, nbytes_rows, tensor_at


@dataclass
class GraphInputs:
    """llm_graph_input_*: the leaf tensors whose data the context sets before each compute."""
    tokens: object = None        # inp_tokens   I32 [n_tokens]
    embd: object = None          # inp_embd     F32 [n_embd, n_tokens] (vector embeddings input; unused for tokens)
    pos: object = None           # inp_pos      I32 [n_tokens]
    kq_mask: object = None       # attn_inp_kq_mask F32 [n_kv, n_tokens] (F16 with flash attention)
    k_idxs: object = None        # attn_inp_k_idxs  I64 [n_tokens]
    v_idxs: object = None        # attn_inp_v_idxs  I64 [n_tokens*n_embd_v_gqa] (transposed V)
    out_ids: object = None       # out_ids      I32 [n_outputs]
    # llm_graph_input_attn_kv_iswa: the sliding-window cache's own indices and mask (the ones above are the base's)
    k_idxs_swa: object = None
    v_idxs_swa: object = None
    kq_mask_swa: object = None


@dataclass
class GraphResult:
    """llm_graph_result: the graph, its inputs and the tensors the context reads back."""
    ctx: object
    gf: object
    inputs: GraphInputs
    t_logits: object = None
    t_embd: object = None
    n_kv: int = 0
    n_kv_swa: int = 0            # iSWA: the sliding-window cache's n_kv (n_kv is the base cache's)
    n_tokens: int = 0
    n_outputs: int = 0
    named: dict = field(default_factory=dict)
    # llm_graph_result::add_fused_node: (LLM_FUSED_OP_*, tensor, il) of each fused node (the FLASH_ATTN_EXTs), which
    # llama_context::resolve_fused_ops checks against the layers' devices
    fused_nodes: list = field(default_factory=list)
    # ggviz: the tensors whose shape is the number of attended KV cells, as (tensor, cache, dim) -- cache 0 the base
    # cache, 1 the sliding-window one; ``ne[dim]`` is that cache's n_kv: the K and V views of every layer and the KQ
    # masks (derive_graph); ``sched_pins``: the (tensor, backend) the build's callback pinned in the scheduler
    kv_dims: list = field(default_factory=list)
    sched_pins: list = field(default_factory=list)
    # ggviz: the tensors whose shape the build took from the ubatch, as (tensor, ne roles, nb roles): a role per dim,
    # TOK (the dim is a multiple of n_tokens), OUT (of n_outputs) or 0 (fixed); nb roles None: the tensor is
    # contiguous (an input, a reshape, a cont), its nb follows its ne. Only a builder that records all of them
    # (``tok_complete``) fills it: derive_graph refuses a graph without it. ``norm_nodes``: (tensor, il) of every
    # tensor the callback saw named "norm" in a layer, the ones graph_get_cb pins for small ubatches
    tok_dims: list = field(default_factory=list)
    norm_nodes: list = field(default_factory=list)


LLM_FUSED_OP_FLASH_ATTN = 0

# ggviz: the roles of a tensor's dims in GraphResult.tok_dims
TOK = 1           # a multiple of n_tokens
OUT = 2           # a multiple of n_outputs
_T000, _0T00, _00T0, _000T = (TOK, 0, 0, 0), (0, TOK, 0, 0), (0, 0, TOK, 0), (0, 0, 0, TOK)


_MAX_NAME_1 = ggml.consts.GGML_MAX_NAME - 1


def graph_max_nodes(model) -> int:
    """llama_context::graph_max_nodes: max(1024, 8 * n_tensors) (llama.cpp sizes the graph from the model)."""
    return max(1024, 8 * len(model.tensors))


class LlmGraphContext:
    """llm_graph_context for one ubatch; ``build()`` is the architecture's graph (models/)."""

    def __init__(self, model, kv, cparams, n_tokens: int, n_outputs: int, n_kv: int, cb_name=None):
        self.model = model
        self.hp = model.hparams
        self.kv = kv
        self.cparams = cparams
        self.n_tokens = n_tokens
        self.n_outputs = n_outputs
        # n_kv: an int (one cache), or (n_kv_base, n_kv_swa) for an iSWA cache (an int there: both, capped)
        self.iswa = hasattr(kv, "kv_swa")
        if self.iswa and not isinstance(n_kv, tuple):
            n_kv = (min(n_kv, kv.kv_base.size), min(n_kv, kv.kv_swa.size))
        self.n_kv = n_kv
        max_nodes = graph_max_nodes(model)
        # buf_compute_meta: tensor headers of the graph and the graph object itself, nothing else (no_alloc)
        mem = ggml.tensor_overhead() * max_nodes + ggml.graph_overhead_custom(max_nodes, False)
        self.ctx0 = ggml.init(mem, no_alloc=True)
        self.gf = ggml.new_graph_custom(self.ctx0, max_nodes, False)
        self.inputs = GraphInputs()
        self.user_cb = cb_name
        self.fused_nodes: list = []
        self.kv_dims: list = []
        self.tok_dims: list = []

    # ggviz: does this builder record every tensor shape it takes from n_tokens / n_outputs (``rec``)? An
    # architecture whose graph has an unrecorded one must say False: its graphs are then always built
    tok_complete = False

    def rec(self, t, ne_roles, nb_roles=None):
        """ggviz: ``t``'s dims ``ne_roles`` (and, for a view, strides ``nb_roles``) are multiples of n_tokens (TOK)
        or n_outputs (OUT) -- what derive_graph rewrites for another ubatch shape."""
        self.tok_dims.append((t, ne_roles, nb_roles))
        return t

    # llm_graph_context::cb -> llama_context's graph callback: name the tensor "<name>-<il>"
    def cb(self, t, name: str, il: int):
        # ggml_format_name(t, "%s-%d", name, il) / ggml_set_name(t, name): the name's bytes (at most
        # GGML_MAX_NAME - 1, then the NUL) packed into the struct here, as Tensor.name's setter packs them (a build
        # names ~700 tensors so)
        b = (f"{name}-{il}" if il >= 0 else name).encode("utf-8")[:_MAX_NAME_1] + b"\0"
        _name_pack[len(b)](t._q, 256, b)
        if self.user_cb is not None:
            self.user_cb(t, name, il)

    # ---- inputs
    def build_inp_embd(self, tok_embd):
        """Two inputs, as llama.cpp (PR 18550): the token ids and a vector-embeddings input ``inp_embd``
        F32 [n_embd, n_tokens]; ``ggml_build_forward_select`` puts both paths in the graph and marks only the token
        path for compute. ``inp_embd`` is then a graph leaf that no node reads: it computes nothing, but the graph
        allocator still gives it memory (it is allocated with the other leafs and never freed), so it is part of
        the compute buffer size llama.cpp reserves (n_embd * 4 bytes per token)."""
        ctx0 = self.ctx0
        tokens = ggml.new_tensor_1d(ctx0, ggml.GGML_TYPE_I32, self.n_tokens)
        self.cb(tokens, "inp_tokens", -1)
        self.rec(tokens, _T000)
        ggml.set_input(tokens)
        self.inputs.tokens = tokens
        embd = ggml.new_tensor_2d(ctx0, ggml.GGML_TYPE_F32, self.hp.n_embd, self.n_tokens)
        self.cb(embd, "inp_embd", -1)
        self.rec(embd, _0T00)
        ggml.set_input(embd)
        self.inputs.embd = embd
        # token embeddings path (ubatch.token != nullptr) and vector embeddings path (ubatch.embd != nullptr)
        inps = [ggml.get_rows(ctx0, tok_embd, tokens), embd]
        cur = ggml.build_forward_select(self.gf, inps, 0)
        self.cb(cur, "embd", -1)
        # make sure the produced embeddings are immediately materialized in the graph (llama.cpp PR 18599)
        ggml.build_forward_expand(self.gf, cur)
        return cur

    def build_inp_pos(self):
        pos = ggml.new_tensor_1d(self.ctx0, ggml.GGML_TYPE_I32, self.n_tokens)
        self.cb(pos, "inp_pos", -1)
        self.rec(pos, _T000)
        ggml.set_input(pos)
        self.inputs.pos = pos
        return pos

    def _attn_inp(self, kv, n_kv: int):
        """build_input_k_idxs / build_input_v_idxs / build_attn_inp_kq_mask of one cache."""
        ctx0, hp = self.ctx0, self.hp
        k_idxs = ggml.new_tensor_1d(ctx0, ggml.GGML_TYPE_I64, self.n_tokens)
        ggml.set_input(k_idxs)
        ggml.set_name(k_idxs, "attn_inp_k_idxs")
        self.rec(k_idxs, _T000)
        n_v = self.n_tokens * hp.n_embd_v_gqa if kv.v_trans else self.n_tokens
        v_idxs = ggml.new_tensor_1d(ctx0, ggml.GGML_TYPE_I64, n_v)
        ggml.set_input(v_idxs)
        ggml.set_name(v_idxs, "attn_inp_v_idxs")
        self.rec(v_idxs, _T000)            # (n_tokens * n_embd_v_gqa with a transposed V)
        # flash attention requires an f16 mask
        type_mask = ggml.GGML_TYPE_F16 if self.cparams.flash_attn else ggml.GGML_TYPE_F32
        mask = ggml.new_tensor_4d(ctx0, type_mask, n_kv, self.n_tokens, 1, 1)
        ggml.set_input(mask)
        ggml.set_name(mask, "attn_inp_kq_mask")
        self.rec(mask, _0T00)
        self.kv_dims.append((mask, 1 if (self.iswa and kv is self.kv.kv_swa) else 0, 0))
        return k_idxs, v_idxs, mask

    def build_attn_inp_kv(self):
        inp = self.inputs
        inp.k_idxs, inp.v_idxs, inp.kq_mask = self._attn_inp(self.kv, self.n_kv)

    def build_attn_inp_kv_iswa(self):
        """Two sets of inputs, the base cache's then the sliding-window cache's (same names in llama.cpp)."""
        inp = self.inputs
        inp.k_idxs, inp.v_idxs, inp.kq_mask = self._attn_inp(self.kv.kv_base, self.n_kv[0])
        inp.k_idxs_swa, inp.v_idxs_swa, inp.kq_mask_swa = self._attn_inp(self.kv.kv_swa, self.n_kv[1])

    def build_inp_out_ids(self):
        out_ids = ggml.new_tensor_1d(self.ctx0, ggml.GGML_TYPE_I32, self.n_outputs)
        ggml.set_input(out_ids)
        ggml.set_name(out_ids, "out_ids")
        self.rec(out_ids, (OUT, 0, 0, 0))
        self.inputs.out_ids = out_ids
        return out_ids

    # ---- blocks
    def build_norm(self, cur, mw, il: int):
        """build_norm with LLM_NORM_RMS: rms_norm, named "norm" (only when a weight follows), times the weight."""
        cur = ggml.rms_norm(self.ctx0, cur, self.hp.f_norm_rms_eps)
        if mw is not None:
            self.cb(cur, "norm", il)
            cur = ggml.mul(self.ctx0, cur, mw)
        return cur

    def build_qkv(self, layer, cur, n_embd_head: int, n_head: int, n_head_kv: int, il: int):
        """build_qkv, separate wq/wk/wv: three MUL_MATs, then the heads (reshape_3d)."""
        ctx0 = self.ctx0
        Qcur = ggml.mul_mat(ctx0, layer.wq, cur)
        self.cb(Qcur, "Qcur", il)
        Kcur = ggml.mul_mat(ctx0, layer.wk, cur)
        self.cb(Kcur, "Kcur", il)
        Vcur = ggml.mul_mat(ctx0, layer.wv, cur)
        self.cb(Vcur, "Vcur", il)
        Qcur = self.rec(ggml.reshape_3d(ctx0, Qcur, n_embd_head, n_head, self.n_tokens), _00T0)
        Kcur = self.rec(ggml.reshape_3d(ctx0, Kcur, n_embd_head, n_head_kv, self.n_tokens), _00T0)
        Vcur = self.rec(ggml.reshape_3d(ctx0, Vcur, n_embd_head, n_head_kv, self.n_tokens), _00T0)
        self.cb(Qcur, "Qcur", il)
        self.cb(Kcur, "Kcur", il)
        self.cb(Vcur, "Vcur", il)
        return Qcur, Kcur, Vcur

    def build_ffn(self, cur, up, gate, down, il: int, type_op: str = "silu"):
        """build_ffn with a parallel gate (LLM_FFN_PAR): up, gate, the fused GLU (LLM_FFN_SILU: swiglu_split,
        LLM_FFN_GELU: geglu_split), down."""
        ctx0 = self.ctx0
        tmp = ggml.mul_mat(ctx0, up, cur)
        self.cb(tmp, "ffn_up", il)
        cur = ggml.mul_mat(ctx0, gate, cur)
        self.cb(cur, "ffn_gate", il)
        if type_op == "silu":
            cur = ggml.swiglu_split(ctx0, cur, tmp)
            self.cb(cur, "ffn_swiglu", il)
        elif type_op == "gelu":
            cur = ggml.geglu_split(ctx0, cur, tmp)
            self.cb(cur, "ffn_geglu", il)
        else:
            raise ValueError(f"build_ffn: unknown type_op {type_op!r}")
        cur = ggml.mul_mat(ctx0, down, cur)
        return cur

    def build_attn_mha(self, q, k, v, kq_mask, kq_scale: float, il: int):
        ctx0 = self.ctx0
        v_trans = v.nb[1] > v.nb[2]
        n_stream = int(k.ne[3])
        q = ggml.view_4d(ctx0, q, int(q.ne[0]), int(q.ne[1]), int(q.ne[2]) // n_stream, n_stream,
                         int(q.nb[1]), int(q.nb[2]), int(q.nb[3]) // n_stream, 0)
        if n_stream == 1:
            # q [head_dim, n_head, n_tokens] (contiguous): its nb[3] is nb[2] * n_tokens (more streams: unrecorded,
            # never derived)
            self.rec(q, _00T0, _000T)
        q = ggml.permute(ctx0, q, 0, 2, 1, 3)
        k = ggml.permute(ctx0, k, 0, 2, 1, 3)
        v = ggml.permute(ctx0, v, 0, 2, 1, 3)
        if self.cparams.flash_attn:
            if v_trans:
                v = ggml.transpose(ctx0, v)
            # without a KV cache K and V could be F32 (an embedding model's non-causal attention): cast to F16
            if k.type == ggml.GGML_TYPE_F32:
                k = ggml.cast(ctx0, k, ggml.GGML_TYPE_F16)
            if v.type == ggml.GGML_TYPE_F32:
                v = ggml.cast(ctx0, v, ggml.GGML_TYPE_F16)
            # hparams.f_max_alibi_bias and the attention softcap are 0 for the models ggviz runs
            cur = ggml.flash_attn_ext(ctx0, q, k, v, kq_mask, kq_scale, 0.0, 0.0)
            self.fused_nodes.append((LLM_FUSED_OP_FLASH_ATTN, cur, il))
            ggml.flash_attn_ext_add_sinks(cur, None)
            ggml.flash_attn_ext_set_n_kv_max(cur, 0)
            ggml.prec_set_acc(cur, ggml.GGML_PREC_F32)
            # (the FA result [DV, n_head, n_tokens, n_stream]: n_tokens rows per stream)
            cur = ggml.reshape_2d(ctx0, cur, int(cur.ne[0]) * int(cur.ne[1]), int(cur.ne[2]) * int(cur.ne[3]))
            self.rec(cur, _0T00)
            ggml.build_forward_expand(self.gf, cur)
            return cur
        kq = ggml.mul_mat(ctx0, k, q)
        self.cb(kq, "kq", il)
        # this op tends to require high floating point range: ggml_mul_mat_set_prec(kq, GGML_PREC_F32)
        ggml.set_op_params_i32(kq, 0, ggml.GGML_PREC_F32)
        kq = ggml.soft_max_ext(ctx0, kq, kq_mask, kq_scale, 0.0)
        self.cb(kq, "kq_soft_max", il)
        if not v_trans:
            v = ggml.cont(ctx0, ggml.transpose(ctx0, v))
            self.cb(v, "v_cont", il)
        kqv = ggml.mul_mat(ctx0, v, kq)
        self.cb(kqv, "kqv", il)
        cur = ggml.permute(ctx0, kqv, 0, 2, 1, 3)
        cur = ggml.cont_2d(ctx0, cur, int(cur.ne[0]) * int(cur.ne[1]), int(cur.ne[2]) * int(cur.ne[3]))
        self.rec(cur, _0T00)
        ggml.build_forward_expand(self.gf, cur)
        return cur

    def build_attn(self, wo, q_cur, k_cur, v_cur, kq_scale: float, il: int):
        """build_attn with a KV cache (llm_graph_input_attn_kv) or an iSWA one (llm_graph_input_attn_kv_iswa: the
        layer's cache, indices and mask are the sliding-window ones when ``hparams.is_swa(il)``)."""
        ctx0, gf, inp = self.ctx0, self.gf, self.inputs
        if self.iswa:
            # these nodes are added to the graph together so that they are not reordered (q, k, v here)
            ggml.build_forward_expand(gf, q_cur)
            ggml.build_forward_expand(gf, k_cur)
            ggml.build_forward_expand(gf, v_cur)
            swa = self.hp.is_swa(il)
            kv = self.kv.kv_swa if swa else self.kv.kv_base
            n_kv = self.n_kv[1] if swa else self.n_kv[0]
            k_idxs, v_idxs, kq_mask = ((inp.k_idxs_swa, inp.v_idxs_swa, inp.kq_mask_swa) if swa
                                       else (inp.k_idxs, inp.v_idxs, inp.kq_mask))
        else:
            # the KV-cache version expands q, v, k (k last for rope fusion)
            ggml.build_forward_expand(gf, q_cur)
            ggml.build_forward_expand(gf, v_cur)
            ggml.build_forward_expand(gf, k_cur)
            kv, n_kv, k_idxs, v_idxs, kq_mask = self.kv, self.n_kv, inp.k_idxs, inp.v_idxs, inp.kq_mask
        # store to KV cache
        ggml.build_forward_expand(gf, kv.cpy_k(ctx0, k_cur, k_idxs, il, self.rec))
        ggml.build_forward_expand(gf, kv.cpy_v(ctx0, v_cur, v_idxs, il, self.rec))
        k = kv.get_k(ctx0, il, n_kv)
        v = kv.get_v(ctx0, il, n_kv)
        cache = 1 if (self.iswa and kv is self.kv.kv_swa) else 0
        self.kv_dims.append((k, cache, 2))
        self.kv_dims.append((v, cache, 0 if kv.v_trans else 2))
        cur = self.build_attn_mha(q_cur, k, v, kq_mask, kq_scale, il)
        self.cb(cur, "kqv_out", il)
        if wo is not None:
            cur = ggml.mul_mat(ctx0, wo, cur)
        return cur

    def result(self, t_logits, t_embd) -> GraphResult:
        n_kv, n_kv_swa = (self.n_kv if self.iswa else (self.n_kv, 0))
        return GraphResult(ctx=self.ctx0, gf=self.gf, inputs=self.inputs, t_logits=t_logits, t_embd=t_embd,
                           n_kv=n_kv, n_kv_swa=n_kv_swa, n_tokens=self.n_tokens, n_outputs=self.n_outputs,
                           fused_nodes=self.fused_nodes, kv_dims=self.kv_dims,
                           tok_dims=self.tok_dims if self.tok_complete else [])

    def build(self) -> GraphResult:
        raise NotImplementedError("the architecture's graph (models/<arch>.py) builds it")


# ---- ggviz: a graph of another ubatch shape from one already built
#
# llama.cpp builds a graph per ubatch (microseconds in C); a new shape (a prompt, the decode after it, a new n_kv every
# 256 cells) is a new graph there. Its node list is the one of any graph of the same architecture and cparams:
# n_tokens, n_outputs and n_kv only set the shapes. n_kv sets ne[dim] of the K/V views and the KQ masks
# (GraphResult.kv_dims); n_tokens and n_outputs the dims the build recorded (GraphResult.tok_dims: the inputs, the
# reshapes and views that take n_tokens); every other shape follows from its sources' by its op's rule. So a built
# graph that is not in use can be turned into the graph of another shape by writing those shapes -- the same
# structs, bytes equal to a fresh build's (tests/test_graph_cache.py compares them) -- instead of building ~1,000
# tensors again. The roles are recorded, never guessed from values (in the pp reserve n_tokens = n_kv = 512; in the
# probe n_tokens = n_outputs = 1). The rules below are ggml's (ggml.c: the result shape of each op and the checks it
# asserts); a shape that reaches an op without a rule, an unrecorded view or reshape, or a check that fails makes
# derive_graph refuse (the caller builds).

_TYPE_SIZES: dict = {}


def _contiguous_nb(type_: int, ne0: int, ne1: int, ne2: int) -> tuple:
    """The strides ggml gives a fresh tensor of this type and shape (ggml_new_tensor_impl)."""
    ts = _TYPE_SIZES.get(type_)
    if ts is None:
        ts = _TYPE_SIZES[type_] = (ggml.type_size(type_), ggml.blck_size(type_))
    rs = ts[0] * ne0 // ts[1]          # ggml_row_size
    return ts[0], rs, rs * ne1, rs * ne1 * ne2


def _nbytes(type_: int, v) -> int:
    """ggml_nbytes of a tensor of this type and shape (its 8 values: ne, nb)."""
    ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3 = v
    if ne0 <= 0 or ne1 <= 0 or ne2 <= 0 or ne3 <= 0:
        return 0
    ts = _TYPE_SIZES.get(type_)
    if ts is None:
        ts = _TYPE_SIZES[type_] = (ggml.type_size(type_), ggml.blck_size(type_))
    n = (ts[0] + (ne0 - 1) * nb0) if ts[1] == 1 else ne0 * nb0 // ts[1]
    return n + (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3


# The struct ggml_tensor words (64-bit) derive_graph reads: type (low half of word 0), ne (2..5), nb (6..9), op (low
# half of word 10), src (19..28), view_src (29), view_offs (30). A tensor's shape is handled as one list of 8 ints,
# [ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3] (words 2..9, in the struct's order)
_NQ = _Q_VIEW_OFFS + 1
_LO = 0xFFFFFFFF
_SAME_SHAPE = frozenset((ggml.GGML_OP_SCALE, ggml.GGML_OP_RMS_NORM, ggml.GGML_OP_NORM, ggml.GGML_OP_UNARY))
_BINARY = frozenset((ggml.GGML_OP_ADD, ggml.GGML_OP_SUB, ggml.GGML_OP_MUL, ggml.GGML_OP_DIV))
_OP_PERMUTE, _OP_TRANSPOSE, _OP_SET_ROWS = ggml.GGML_OP_PERMUTE, ggml.GGML_OP_TRANSPOSE, ggml.GGML_OP_SET_ROWS
_OP_MUL_MAT, _OP_RESHAPE, _OP_CONT = ggml.GGML_OP_MUL_MAT, ggml.GGML_OP_RESHAPE, ggml.GGML_OP_CONT
_unpack_shape = struct.Struct("<8q").unpack_from     # (ne, nb: words 2..9, int64_t as Tensor.ne / .nb read them)
_SHAPE_OFFS = 16
_SHAPE_WORDS = np.arange(2, 10)
_TSZ = GGML_TENSOR_SIZE


class _Shapes(dict):
    """addr -> the 8 shape values of a tensor (derive_graph's: the new ones of those changed, the old ones of the
    others); a tensor not in it yet is read from its struct when first asked (a weight, a KV cache)."""
    __slots__ = ()

    def __missing__(self, addr):
        v = self[addr] = list(_unpack_shape(tensor_at(addr)._q, _SHAPE_OFFS))
        return v


def _derived_shape(t, typ: int, op: int, own: list, src, view_src: int, get):
    """The 8 shape values of the node ``t`` (its type, op, current shape ``own``, source addresses ``src``, view
    source ``view_src``) from its sources' (``get(addr)``: their 8 values), by its op's rule; None: no rule for
    that op, or the new shapes fail the op's checks (ggml's asserts)."""
    if op == _OP_PERMUTE:
        a = get(src[0])
        r = [0] * 8
        for i, ax in enumerate(t.op_params[:4].tolist()):
            r[ax], r[ax + 4] = a[i], a[i + 4]
        return r
    if op == _OP_TRANSPOSE:
        a = get(src[0])
        return [a[1], a[0], a[2], a[3], a[5], a[4], a[6], a[7]]
    if op == _OP_SET_ROWS:
        # ggml_set_rows(a, b, c): a view of the destination a (src[2]: the cache, or a reshape of it) with b's rows
        # (src[0]) written at c's indices (src[1])
        a, b, c = get(src[2]), get(src[0]), get(src[1])
        if not (b[0] == a[0] and b[2] == a[2] and b[3] == a[3] and b[1] == c[0] and c[1]
                and b[2] % c[1] == 0 and c[2] and b[3] % c[2] == 0 and c[3] == 1):
            return None
        return a[:]
    if view_src:
        return None                      # an in-place op or a view the build did not record
    if op == _OP_MUL_MAT:
        a, b = get(src[0]), get(src[1])
        if a[0] != b[0] or b[2] % a[2] or b[3] % a[3]:
            return None
        ne0, ne1, ne2, ne3 = a[1], b[1], b[2], b[3]
    elif op in _SAME_SHAPE:
        ne0, ne1, ne2, ne3 = get(src[0])[:4]
    elif op in _BINARY:
        ne0, ne1, ne2, ne3 = get(src[0])[:4]
        b = get(src[1])
        m0, m1, m2, m3 = b[:4]                       # ggml_can_repeat(b, a)
        if m0 <= 0 or m1 <= 0 or m2 <= 0 or m3 <= 0 or ne0 % m0 or ne1 % m1 or ne2 % m2 or ne3 % m3:
            return None
    elif op == ggml.GGML_OP_ROPE:
        ne0, ne1, ne2, ne3 = get(src[0])[:4]
        if get(src[1])[0] != ne2:                     # a position per row
            return None
    elif op == ggml.GGML_OP_GLU:
        a = get(src[0])
        ne0, ne1, ne2, ne3 = a[:4]
        if not src[1]:
            ne0 //= 2
        elif get(src[1])[:4] != a[:4]:               # the split form: gate and up of one shape
            return None
    elif op == ggml.GGML_OP_GET_ROWS:
        a, b = get(src[0]), get(src[1])
        if a[2] != b[1] or b[3] != 1:
            return None
        ne0, ne1, ne2, ne3 = a[0], b[0], b[1], b[2]
    elif op == ggml.GGML_OP_FLASH_ATTN_EXT:            # [DV, n_head, n_tokens, ne3] F32
        q, k, v = get(src[0]), get(src[1]), get(src[2])
        if src[3]:
            m = get(src[3])
            if m[0] != k[1] or m[1] < q[1]:
                return None
        if k[1] != v[1] or q[0] != k[0]:
            return None
        ne0, ne1, ne2, ne3 = v[0], q[2], q[1], q[3]
    elif op == ggml.GGML_OP_SOFT_MAX:
        ne0, ne1, ne2, ne3 = get(src[0])[:4]
        if src[1]:
            m = get(src[1])
            if m[0] != ne0 or m[1] < ne1:
                return None
    elif op == _OP_CONT or op == ggml.GGML_OP_CPY:
        # cont / cast: a new tensor of the source's shape (only when it had it: a cont_2d is recorded, a cpy into a
        # view is not this)
        if op == ggml.GGML_OP_CPY and src[1] != t.addr:
            return None
        if own[:4] != tensor_at(src[0]).ne.tolist():          # (the source's shape as built: nothing written yet)
            return None
        ne0, ne1, ne2, ne3 = get(src[0])[:4]
    else:
        return None
    # a new tensor: contiguous strides
    ts = _TYPE_SIZES.get(typ)
    if ts is None:
        ts = _TYPE_SIZES[typ] = (ggml.type_size(typ), ggml.blck_size(typ))
    rs = ts[0] * ne0 // ts[1]          # ggml_row_size (_contiguous_nb written out: this runs for most nodes)
    return [ne0, ne1, ne2, ne3, ts[0], rs, rs * ne1, rs * ne1 * ne2]


def _rescale(vals: list, lo: int, roles, old: tuple, new: tuple) -> bool:
    """``vals[lo + i]`` (a dim, or with ``lo`` 4 a stride) with role ``roles[i]`` (TOK, OUT; 0: fixed) rewritten in
    place from a multiple of ``old[role]`` to the same multiple of ``new[role]``; False (nothing to trust) when one
    is not a multiple."""
    for i, r in enumerate(roles):
        if r:
            v = vals[lo + i]
            if v % old[r]:
                return False
            vals[lo + i] = v // old[r] * new[r]
    return True


def derive_graph(res: GraphResult, n_tokens: int, n_outputs: int, n_kv) -> bool:
    """Turn ``res`` (built for ``res.n_tokens`` / ``res.n_outputs`` / ``res.n_kv``) into the graph of ``n_tokens``
    tokens, ``n_outputs`` outputs and ``n_kv`` attended cells (an int, or (base, swa) for an iSWA cache) in place:
    the recorded dims (``kv_dims``, ``tok_dims``), then every node whose sources' shapes changed, by its op's rule.
    All new shapes are worked out and checked before anything is written: False (``res`` untouched) when a changed
    shape reaches an op without a rule or an unrecorded view, a check fails (a view outside its source, a reshape
    of another element count), or the graph lacks a record it needs. ``res`` must not be allocated (its tensors
    are placed by the next allocation, as a fresh build's). The scheduler pins are the caller's (``norm_nodes``).

    What is read: for a new ubatch shape (n_tokens / n_outputs) nearly every node reads a changed tensor, so the
    nodes' struct words are gathered from the graph's arena at once (and the new shapes written back at once); for
    a new n_kv alone (a few nodes per layer) only what is needed, tensor by tensor: a node's source pointers, then
    its words if it reads a changed tensor, a source's shape when first asked."""
    new_kv = n_kv if isinstance(n_kv, tuple) else (n_kv, n_kv)
    old = (1, res.n_tokens, res.n_outputs)
    new = (1, n_tokens, n_outputs)
    tok_changed = old != new
    if (tok_changed and not res.tok_dims) or min(old + new + new_kv) < 1:
        return False
    if not res.kv_dims and (new_kv[0] != res.n_kv or (res.n_kv_swa and new_kv[1] != res.n_kv_swa)):
        return False
    # the recorded tensors: addr -> [tensor, ne roles, nb roles, (cache, dim) of n_kv]
    rec: dict = {}
    if tok_changed:
        for t, ne_r, nb_r in res.tok_dims:
            rec[t.addr] = [t, ne_r, nb_r, None]
    for t, cache, dim in res.kv_dims:
        r = rec.get(t.addr)
        if r is None:
            rec[t.addr] = [t, None, None, (cache, dim)]
        else:
            r[3] = (cache, dim)
    if tok_changed:
        ok = _derive_eager(res, rec, old, new, new_kv)
    else:
        ok = _derive_lazy(res, rec, old, new, new_kv)
    if ok:
        _set_shape(res, n_tokens, n_outputs, n_kv)
    return ok


def _recorded(rec, words_of, old, new, new_kv):
    """The recorded tensors' new shapes: (changed: addr -> 8 values, views: (tensor, words) of the recorded views
    whose shape changed, checked against their source at the end); None: a record does not hold."""
    changed: dict = {}
    views: list = []
    for addr, (t, ne_r, nb_r, kvd) in rec.items():
        q = words_of(addr, t)
        v = q[2:10]
        if ne_r is not None and not _rescale(v, 0, ne_r, old, new):
            return None
        if kvd is not None:
            v[kvd[1]] = new_kv[kvd[0]]
        if v[:4] == q[2:6]:
            continue
        if q[_Q_VIEW_SRC] and (q[10] & _LO) != _OP_RESHAPE:
            # a view keeps its strides but those recorded (a multiple of n_tokens); it must stay inside its source
            if nb_r is not None and not _rescale(v, 4, nb_r, old, new):
                return None
            views.append((t, q))
        else:
            v[4:] = _contiguous_nb(q[0] & _LO, v[0], v[1], v[2])
        changed[addr] = v
    return changed, views


def _views_inside(views, changed, get) -> bool:
    """Each recorded view whose shape changed stays inside its source (with the source's new shape)."""
    for t, q in views:
        v = changed[t.addr]
        vs = q[_Q_VIEW_SRC]
        if q[_Q_VIEW_OFFS] + _nbytes(q[0] & _LO, v) > _nbytes(tensor_at(vs).type, get(vs)):
            return False
    return True


def _element_count_kept(v, s) -> bool:
    """A recorded reshape / cont keeps its source's element count."""
    return v[0] * v[1] * v[2] * v[3] == s[0] * s[1] * s[2] * s[3]


def _derive_lazy(res, rec, old, new, new_kv) -> bool:
    """derive_graph for a new n_kv alone: a node's struct read only when it reads a changed tensor."""
    r = _recorded(rec, lambda addr, t: t._q[:_NQ].tolist(), old, new, new_kv)
    if r is None:
        return False
    changed, views = r
    if not changed:
        return True
    tensors = {addr: rec[addr][0] for addr in changed}
    shapes = _Shapes(changed)
    get = shapes.__getitem__
    isdisjoint = changed.keys().isdisjoint
    for node in res.gf.nodes:
        addr = node.addr
        if addr in rec:
            if addr in changed:
                q = node._q[:_NQ].tolist()
                op = q[10] & _LO
                if (op == _OP_RESHAPE or op == _OP_CONT) and not _element_count_kept(changed[addr], get(q[_Q_SRC])):
                    return False
            continue
        # (most nodes read no changed tensor)
        if isdisjoint(node._q[_Q_SRC:_Q_VIEW_SRC].tolist()):
            continue
        q = node._q[:_NQ].tolist()
        own = q[2:10]
        d = _derived_shape(node, q[0] & _LO, q[10] & _LO, own, q[_Q_SRC:_Q_VIEW_SRC], q[_Q_VIEW_SRC], get)
        if d is None:
            return False
        if d != own:
            changed[addr] = shapes[addr] = d
            tensors[addr] = node
    if not _views_inside(views, changed, get):
        return False
    for addr, v in changed.items():
        tensors[addr]._q[2:10] = v
    return True


def _derive_eager(res, rec, old, new, new_kv) -> bool:
    """derive_graph for a new ubatch shape: nearly every node reads a changed tensor, so the nodes' struct words are
    gathered from the graph's arena in one go (``tensor.arena_structs``), the new shapes worked out over arrays
    (``_derive_arrays``) and written back in one go; where that cannot vouch, node by node, each node's rule on
    Python lists (no NumPy call per node), the shapes again written back in one go."""
    nodes = res.gf.nodes
    n = len(nodes)
    addrs = [t.addr for t in nodes]
    ctx = res.ctx
    base, used = ctx._base, ctx.used_mem()
    offs = np.array(addrs, np.int64) - base
    in_arena = n > 0 and bool(((offs >= 0) & (offs % 8 == 0) & (offs + _TSZ <= used)).all())
    if in_arena:
        words = arena_structs(ctx._u64[:used >> 3], offs >> 3)
    else:
        words = np.array([t._q[:_NQ] for t in nodes], np.uint64).reshape(n, _NQ)
    if VECTORIZED and in_arena and _derive_arrays(res, nodes, words, addrs, rec, old, new, new_kv):
        return True
    shp = words[:, 2:10].view(np.int64).tolist()
    srcs = words[:, _Q_SRC:_Q_VIEW_SRC].tolist()
    ops = (words[:, 10] & _LO).tolist()
    index = dict(zip(addrs, range(n)))

    def words_of(addr, t):
        i = index.get(addr)
        if i is None:
            return t._q[:_NQ].tolist()
        return words[i, :_NQ].tolist()

    r = _recorded(rec, words_of, old, new, new_kv)
    if r is None:
        return False
    changed, views = r
    shapes = _Shapes(zip(addrs, shp))
    shapes.update(changed)
    get = shapes.__getitem__
    isdisjoint = changed.keys().isdisjoint
    typs = vsrc = None
    written = []                         # the nodes (indices) whose shape changed by their op's rule
    for i in range(n):
        addr = addrs[i]
        if addr in rec:
            if addr in changed:
                op = ops[i]
                if (op == _OP_RESHAPE or op == _OP_CONT) and not _element_count_kept(changed[addr],
                                                                                     get(srcs[i][0])):
                    return False
            continue
        s = srcs[i]
        if isdisjoint(s):
            continue
        if typs is None:
            typs = (words[:, 0] & _LO).tolist()
            vsrc = words[:, _Q_VIEW_SRC].tolist()
        own = shp[i]
        d = _derived_shape(nodes[i], typs[i], ops[i], own, s, vsrc[i], get)
        if d is None:
            return False
        if d != own:
            changed[addr] = shapes[addr] = d
            written.append(i)
    if not _views_inside(views, changed, get):
        return False
    _write_shapes(ctx, nodes, rec, changed, index, offs, in_arena)
    return True


def _write_shapes(ctx, nodes, rec, changed, index, offs, in_arena) -> None:
    """The new shapes (``changed``: addr -> 8 values) written: the nodes' at once into the arena, the others' (the
    recorded leafs: the inputs) one by one."""
    rows, vals = [], []
    for addr, v in changed.items():
        i = index.get(addr)
        if i is None or not in_arena:
            (rec[addr][0] if addr in rec else nodes[i])._q[2:10] = v
        else:
            rows.append(i)
            vals.append(v)
    if rows:
        ctx._i64[(offs[rows] >> 3)[:, None] + _SHAPE_WORDS] = vals


# ---- the same derivation over arrays
#
# Every new dim of a node is one of its sources' dims (ggml's shape rules copy them: a MUL_MAT's [a1, b1, b2, b3], a
# permute's, a FLASH_ATTN_EXT's ...), and every stride either one of its sources' (a permute, a transpose, a
# set_rows) or the contiguous strides of its own new dims. So each (node, field) points at a (source, field), and
# following the pointers to their ends -- a recorded dim (rewritten), a leaf's or an unchanged node's value -- gives
# every new shape at once: the pointers are followed by pointer doubling (p = p[p], a gather over all fields per
# step, ~10 steps for a graph ~500 nodes deep), the contiguous strides computed from the dims over all nodes at
# once, and ggml's checks of each op evaluated over all its nodes at once. Where that cannot vouch for the result
# (an op without a rule here, a non-split GLU, an unrecorded view, an in-place op, a source outside the graph, a
# failed check: whatever the node-by-node derivation refuses or might) it answers None and derive_graph works node
# by node, which decides as it always did (tests/test_graph_cache.py compares the two and both with fresh builds).

VECTORIZED = True                # False: always node by node (the tests compare the two)
_K_UNKNOWN, _K_SAME, _K_MUL_MAT, _K_GET_ROWS, _K_FA, _K_PERMUTE, _K_TRANSPOSE, _K_SET_ROWS = range(8)
_OP_KIND = np.zeros(ggml.GGML_OP_COUNT + 8, np.int8)
for _op in _SAME_SHAPE | _BINARY | {ggml.GGML_OP_ROPE, ggml.GGML_OP_GLU, ggml.GGML_OP_SOFT_MAX, ggml.GGML_OP_CONT,
                                    ggml.GGML_OP_CPY}:
    _OP_KIND[_op] = _K_SAME
_OP_KIND[ggml.GGML_OP_MUL_MAT] = _K_MUL_MAT
_OP_KIND[ggml.GGML_OP_GET_ROWS] = _K_GET_ROWS
_OP_KIND[ggml.GGML_OP_FLASH_ATTN_EXT] = _K_FA
_OP_KIND[ggml.GGML_OP_PERMUTE] = _K_PERMUTE
_OP_KIND[ggml.GGML_OP_TRANSPOSE] = _K_TRANSPOSE
_OP_KIND[ggml.GGML_OP_SET_ROWS] = _K_SET_ROWS
# (type size, block size) by type, 0 for a type ggml does not have
_TS = np.zeros(64, np.int64)
_BS = np.zeros(64, np.int64)
for _t, (_n, _bs, _ts, _q) in ggml.consts.TYPE_TRAITS.items():
    if _t < 64:
        _TS[_t], _BS[_t] = _ts, _bs
_F4 = np.arange(4)
_F8 = np.arange(8)
_TRANSPOSED = np.array([1, 0, 2, 3, 5, 4, 6, 7])
_FA_Q = np.array([2, 1, 3])


def _leaf_words(leafs) -> np.ndarray:
    """The struct words 0.._NQ-1 of ``leafs``, gathered from each context arena they lie in (the weights', the KV
    cache's, the graph's) at once; one by one for any other."""
    nl = len(leafs)
    out = np.empty((nl, _NQ), np.uint64)
    if not nl:
        return out
    A = np.array([t.addr for t in leafs], np.int64)
    done = np.zeros(nl, bool)
    for ctx in {id(t.ctx): t.ctx for t in leafs}.values():
        buf = getattr(ctx, "mem_buffer", None)
        if buf is None or getattr(ctx, "freed", True):
            continue
        used = ctx.used_mem()
        off = A - ctx._base
        inside = ~done & (off >= 0) & (off % 8 == 0) & (off + _TSZ <= used)
        if inside.any():
            out[inside] = arena_structs(ctx._u64[:used >> 3], off[inside] >> 3)[:, :_NQ]
            done |= inside
    for i in np.flatnonzero(~done).tolist():
        out[i] = leafs[i]._q[:_NQ]
    return out


def _contiguous_nb_rows(typ, ne):
    """_contiguous_nb over rows: nb[4] of contiguous tensors of types ``typ`` and dims ``ne`` ((k, >= 3)), or None
    for a type ggml does not have."""
    ts, bs = _TS[typ], _BS[typ]
    if (bs == 0).any():
        return None
    nb1 = ts * ne[:, 0] // bs
    nb2 = nb1 * ne[:, 1]
    return np.stack((ts, nb1, nb2, nb2 * ne[:, 2]), 1)


class _Graph:
    """The arrays _derive_arrays works on: the struct words of the nodes then the leafs (``W``), their addresses
    (``A``), old shapes (``O``: (m, 8)), types, the nodes' ops, their sources as rows (``sidx``, -1 for NULL)."""
    __slots__ = ("n", "m", "W", "A", "O", "typ", "op", "S", "sidx", "order", "sA")

    def rows(self, a):
        """The rows of the addresses ``a`` and whether each was found."""
        pos = np.minimum(np.searchsorted(self.sA, a), self.m - 1)
        return self.order[pos], self.sA[pos] == a


def _graph_arrays(nodes, leafs, words, addrs):
    g = _Graph()
    n = len(nodes)
    g.n, g.m = n, n + len(leafs)
    g.W = W = np.concatenate((words[:, :_NQ], _leaf_words(leafs)))
    g.A = A = W[:, 0].copy()
    A[:n] = addrs
    A[n:] = [t.addr for t in leafs]
    g.O = W[:, 2:10].view(np.int64)
    g.typ = (W[:, 0] & _LO).astype(np.int64)
    g.op = (W[:n, 10] & _LO).astype(np.int64)
    if g.typ.max() >= _TS.size or g.op.max() >= _OP_KIND.size:
        return None
    g.order = np.argsort(A)
    g.sA = A[g.order]
    g.S = S = W[:n, _Q_SRC:_Q_VIEW_SRC]
    nz = S != 0
    sr, found = g.rows(S[nz])
    if not found.all():
        return None                  # (a source outside the graph's nodes and leafs)
    g.sidx = np.full(S.shape, -1, np.int64)
    g.sidx[nz] = sr
    return g


def _recorded_arrays(g, rec, old, new, new_kv):
    """The recorded tensors' rows ``R`` and new shapes ``V`` (their dims rescaled, their n_kv dim set, the strides a
    view keeps rescaled, the others' contiguous), whether their dims changed, whether each is a view; None where a
    record does not hold."""
    recs = list(rec.values())
    k = len(recs)
    R, found = g.rows(np.array([e[0].addr for e in recs], np.uint64))
    if not found.all():
        return None                  # (a recorded tensor outside the graph)
    NER = np.zeros((k, 4), np.int64)
    NBR = np.zeros((k, 4), np.int64)
    KVD = np.full((k, 2), -1, np.int64)
    for j, (t, ne_r, nb_r, kvd) in enumerate(recs):
        if ne_r is not None:
            NER[j] = ne_r
        if nb_r is not None:
            NBR[j] = nb_r
        if kvd is not None:
            KVD[j] = kvd
    oldv, newv = np.array(old, np.int64), np.array(new, np.int64)
    O, W = g.O, g.W
    V = O[R].copy()
    den = oldv[NER]
    if (V[:, :4] % den != 0).any():
        return None
    V[:, :4] = np.where(NER > 0, V[:, :4] // den * newv[NER], V[:, :4])
    kv = np.flatnonzero(KVD[:, 0] >= 0)
    if kv.size:
        V[kv, KVD[kv, 1]] = np.array(new_kv, np.int64)[KVD[kv, 0]]
    rchg = (V[:, :4] != O[R, :4]).any(1)
    # a recorded view (not a reshape) whose dims changed keeps its strides but those recorded (rescaled); the others
    # get the contiguous strides of their dims
    is_view = (W[R, _Q_VIEW_SRC] != 0) & ((W[R, 10] & _LO) != _OP_RESHAPE)
    NBR = np.where(is_view[:, None], NBR, 0)
    den = oldv[NBR]
    if (V[:, 4:] % den != 0).any():
        return None
    V[:, 4:] = np.where(NBR > 0, V[:, 4:] // den * newv[NBR], V[:, 4:])
    V[~rchg] = O[R[~rchg]]                            # (unchanged dims: the struct as it is)
    cont = np.flatnonzero(rchg & ~is_view)
    if cont.size:
        nb = _contiguous_nb_rows(g.typ[R[cont]], V[cont])
        if nb is None:
            return None
        V[cont, 4:] = nb
    return R, V, rchg, is_view


def _node_kinds(g, isrec):
    """Each node's kind (_K_*): an unrecorded node that is a view (but a permute, a transpose, a set_rows), a
    non-split GLU, a cont / cpy that is not a new tensor of its source's shape, a recorded node (its shape is set,
    not derived): unknown."""
    n, op, O, S, sidx = g.n, g.op, g.O, g.S, g.sidx
    kind = _OP_KIND[op]
    s0, s1 = sidx[:, 0], sidx[:, 1]
    vsrc = g.W[:n, _Q_VIEW_SRC] != 0
    kind[vsrc & (kind != _K_PERMUTE) & (kind != _K_TRANSPOSE) & (kind != _K_SET_ROWS)] = _K_UNKNOWN
    kind[(op == ggml.GGML_OP_GLU) & (s1 < 0)] = _K_UNKNOWN
    cc = (op == ggml.GGML_OP_CONT) | (op == ggml.GGML_OP_CPY)
    if cc.any():
        bad = cc & ((s0 < 0) | (O[:n, :4] != O[s0, :4]).any(1))
        bad |= (op == ggml.GGML_OP_CPY) & (S[:, 1] != g.A[:n])
        kind[bad] = _K_UNKNOWN
    kind[isrec[:n]] = _K_UNKNOWN
    return kind


def _pointers(g, kind):
    """Field k of the flat (m * 8) values -> the field it copies (itself for an end), followed to the ends; None
    where a kind lacks a source it reads or a permute's axes are not a permutation."""
    sidx, Wn = g.sidx, g.W[:g.n]
    s0, s1, s2 = sidx[:, 0], sidx[:, 1], sidx[:, 2]
    need = kind != _K_UNKNOWN
    two = (kind == _K_MUL_MAT) | (kind == _K_GET_ROWS) | (kind == _K_FA) | (kind == _K_SET_ROWS)
    if (need & (s0 < 0)).any() or (two & (s1 < 0)).any() or (((kind == _K_FA) | (kind == _K_SET_ROWS)) & (s2 < 0)).any():
        return None
    P = np.arange(g.m * 8, dtype=np.int64).reshape(g.m, 8)
    base0 = s0 * 8
    r = np.flatnonzero(kind == _K_SAME)
    P[r, :4] = base0[r, None] + _F4
    r = np.flatnonzero(kind == _K_MUL_MAT)                      # [a1, b1, b2, b3]
    P[r, 0] = base0[r] + 1
    P[r, 1:4] = s1[r, None] * 8 + _F4[1:]
    r = np.flatnonzero(kind == _K_GET_ROWS)                     # [a0, b0, b1, b2]
    P[r, 0] = base0[r]
    P[r, 1:4] = s1[r, None] * 8 + _F4[:3]
    r = np.flatnonzero(kind == _K_FA)                           # [v0, q2, q1, q3]
    P[r, 0] = s2[r] * 8
    P[r, 1:4] = base0[r, None] + _FA_Q
    r = np.flatnonzero(kind == _K_TRANSPOSE)
    P[r] = base0[r, None] + _TRANSPOSED
    r = np.flatnonzero(kind == _K_PERMUTE)
    if r.size:
        # op_params[0..3] (int32 at bytes 84..99: the high half of word 10, word 11, the low half of word 12)
        ax = np.stack((Wn[r, 10] >> 32, Wn[r, 11] & _LO, Wn[r, 11] >> 32, Wn[r, 12] & _LO), 1).astype(np.int64)
        if (np.sort(ax, 1) != _F4).any():
            return None
        rr = r[:, None]
        P[rr, ax] = base0[rr] + _F4
        P[rr, ax + 4] = base0[rr] + 4 + _F4
    r = np.flatnonzero(kind == _K_SET_ROWS)
    P[r] = s2[r, None] * 8 + _F8
    p = P.reshape(-1)
    for _ in range(64):                               # pointer doubling to the ends
        q = p[p]
        if np.array_equal(q, p):
            return p
        p = q
    return None


def _checks_fail(g, kind, F) -> bool:
    """ggml's checks of each op over all its nodes (the new shapes ``F``): does any fail?"""
    sidx, op = g.sidx, g.op
    s0, s1, s2, s3 = sidx[:, 0], sidx[:, 1], sidx[:, 2], sidx[:, 3]
    one = np.ones(1, np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a, b = F[s0], F[s1]
        c, d = F[s2], F[s3]
        mm = kind == _K_MUL_MAT
        bad = mm & ((a[:, 0] != b[:, 0]) | (a[:, 2] <= 0) | (a[:, 3] <= 0)
                    | (b[:, 2] % np.where(mm, a[:, 2], one) != 0) | (b[:, 3] % np.where(mm, a[:, 3], one) != 0))
        bad |= (kind == _K_GET_ROWS) & ((a[:, 2] != b[:, 1]) | (b[:, 3] != 1))
        # flash attention: q = src[0], k = src[1], v = src[2], mask = src[3]
        bad |= (kind == _K_FA) & ((b[:, 1] != c[:, 1]) | (a[:, 0] != b[:, 0])
                                  | ((s3 >= 0) & ((d[:, 0] != b[:, 1]) | (d[:, 1] < a[:, 1]))))
        # set_rows(a = src[2], b = src[0], c = src[1]) here: c, a, b
        sr = kind == _K_SET_ROWS
        c1 = np.where(sr & (b[:, 1] != 0), b[:, 1], one)
        c2 = np.where(sr & (b[:, 2] != 0), b[:, 2], one)
        bad |= sr & ((a[:, 0] != c[:, 0]) | (a[:, 2] != c[:, 2]) | (a[:, 3] != c[:, 3]) | (a[:, 1] != b[:, 0])
                     | (b[:, 1] == 0) | (b[:, 2] == 0) | (b[:, 3] != 1) | (a[:, 2] % c1 != 0) | (a[:, 3] % c2 != 0))
        same = kind == _K_SAME
        Fn = F[:g.n]
        bn = same & _IS_BINARY[op]                    # ggml_can_repeat(b, a)
        b4 = np.where(bn[:, None], b[:, :4], one)
        bad |= bn & ((s1 < 0) | (b4 <= 0).any(1) | (Fn[:, :4] % np.where(b4 > 0, b4, one) != 0).any(1))
        bad |= same & (op == ggml.GGML_OP_ROPE) & ((s1 < 0) | (b[:, 0] != Fn[:, 2]))
        bad |= same & (op == ggml.GGML_OP_GLU) & (b[:, :4] != a[:, :4]).any(1)
        bad |= same & (op == ggml.GGML_OP_SOFT_MAX) & (s1 >= 0) & ((b[:, 0] != Fn[:, 0]) | (b[:, 1] < Fn[:, 1]))
    return bool(bad.any())


def _derive_arrays(res, nodes, words, addrs, rec, old, new, new_kv) -> bool:
    """derive_graph for a new ubatch shape over arrays (see above), the shapes written when True; None where it
    cannot vouch (the caller derives node by node, which decides). ``words``: the nodes' struct words, gathered
    from the graph's arena (all of them lie there)."""
    leafs = res.gf.leafs
    if not nodes or not rec:
        return None
    g = _graph_arrays(nodes, leafs, words, addrs)
    if g is None:
        return None
    r = _recorded_arrays(g, rec, old, new, new_kv)
    if r is None:
        return None
    R, V, rchg, is_view = r
    n, m, O, typ = g.n, g.m, g.O, g.typ
    X = O.copy()
    X[R] = V
    isrec = np.zeros(m, bool)
    isrec[R] = True
    kind = _node_kinds(g, isrec)
    p = _pointers(g, kind)
    if p is None:
        return None
    Y = X.reshape(-1)[p].reshape(m, 8)                # every dim (the contiguous nodes' strides: not yet)
    contig = np.flatnonzero((kind == _K_SAME) | (kind == _K_MUL_MAT) | (kind == _K_GET_ROWS) | (kind == _K_FA))
    if contig.size:
        nb = _contiguous_nb_rows(typ[contig], Y[contig])
        if nb is None:
            return None
        Y[contig, 4:] = nb
    F = Y.reshape(-1)[p].reshape(m, 8)                # ... and every stride
    if _checks_fail(g, kind, F):
        return None
    # which rows changed; an unknown node may not read one, and a derived node whose sources did not change must keep
    # its shape (it does in a graph as built: anything else, node by node decides)
    sidx, op = g.sidx, g.op
    rowchg = (F != O).any(1)
    srcchg = (rowchg[sidx] & (sidx >= 0)).any(1)
    if (srcchg & (kind == _K_UNKNOWN) & ~isrec[:n]).any() or ((kind != _K_UNKNOWN) & ~srcchg & rowchg[:n]).any():
        return None
    # a recorded reshape / cont keeps its source's element count; a recorded view stays inside its source
    rr = R[rchg]
    rn = rr[rr < n]
    rs = rn[(op[rn] == _OP_RESHAPE) | (op[rn] == _OP_CONT)]
    if rs.size and (np.prod(F[rs, :4], 1) != np.prod(F[sidx[rs, 0], :4], 1)).any():
        return None
    rv = R[rchg & is_view]
    if rv.size:
        vs, ok = g.rows(g.W[rv, _Q_VIEW_SRC])
        if not ok.all():
            return None
        vn, sn = nbytes_rows(typ[rv], F[rv, :4], F[rv, 4:]), nbytes_rows(typ[vs], F[vs, :4], F[vs, 4:])
        if (vn < 0).any() or (sn < 0).any() or (g.W[rv, _Q_VIEW_OFFS].astype(np.int64) + vn > sn).any():
            return None
    # the writes: the changed shapes into the graph's arena at once (the nodes and the inputs lie there)
    ch = np.flatnonzero(rowchg)
    ctx = res.ctx
    off = g.A[ch].astype(np.int64) - ctx._base
    inside = (off >= 0) & (off % 8 == 0) & (off + _TSZ <= ctx.used_mem())
    ctx._i64[(off[inside] >> 3)[:, None] + _SHAPE_WORDS] = F[ch[inside]]
    for i in ch[~inside].tolist():
        (nodes[i] if i < n else leafs[i - n])._q[2:10] = F[i]
    return True


_IS_BINARY = np.zeros(_OP_KIND.size, bool)
_IS_BINARY[sorted(_BINARY)] = True
def _set_shape(res: GraphResult, n_tokens: int, n_outputs: int, n_kv) -> None:
    res.n_tokens, res.n_outputs = n_tokens, n_outputs
    if isinstance(n_kv, tuple):
        res.n_kv, res.n_kv_swa = n_kv
    else:
        res.n_kv = n_kv


def derive_n_kv(res: GraphResult, n_kv) -> bool:
    """derive_graph for another n_kv only (the same n_tokens and n_outputs)."""
    return derive_graph(res, res.n_tokens, res.n_outputs, n_kv)
