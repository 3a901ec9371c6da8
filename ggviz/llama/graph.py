"""The decode graph of a llama-architecture model, built the way llama.cpp builds it.

Mirrors ``llm_graph_context`` (llama-graph.cpp: ``build_inp_embd``, ``build_inp_pos``, ``build_attn_inp_kv``,
``build_inp_out_ids``, ``build_norm``, ``build_ffn`` (SILU, parallel gate), ``build_attn`` (KV-cache version) and
``build_attn_mha`` (no flash attention)) and ``llama_model_llama::graph`` (models/llama.cpp). The callback ``cb``
names tensors ``"<name>-<il>"`` exactly like llama.cpp's graph callback, so node names, order, ops and shapes equal
llama.cpp's decode graph (1086 nodes for one SmolLM2 decode step).

The builder only creates tensors in a ``no_alloc`` context and records the graph inputs; the llama context fills
the inputs, allocates and computes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import ggml
from . import powerinfer


@dataclass
class GraphInputs:
    """llm_graph_input_*: the leaf tensors whose data the context sets before each compute."""
    tokens: object = None        # inp_tokens   I32 [n_tokens]
    embd: object = None          # inp_embd     F32 [n_embd, n_tokens] (vector embeddings input; unused for tokens)
    pos: object = None           # inp_pos      I32 [n_tokens]
    kq_mask: object = None       # attn_inp_kq_mask F32 [n_kv, n_tokens]
    k_idxs: object = None        # attn_inp_k_idxs  I64 [n_tokens]
    v_idxs: object = None        # attn_inp_v_idxs  I64 [n_tokens*n_embd_v_gqa] (transposed V)
    out_ids: object = None       # out_ids      I32 [n_outputs]


@dataclass
class GraphResult:
    """llm_graph_result: the graph, its inputs and the tensors the context reads back."""
    ctx: object
    gf: object
    inputs: GraphInputs
    t_logits: object = None
    t_embd: object = None
    n_kv: int = 0
    n_tokens: int = 0
    n_outputs: int = 0
    named: dict = field(default_factory=dict)


def graph_max_nodes(model) -> int:
    """llama_context::graph_max_nodes: max(1024, 8 * n_tensors) (llama.cpp sizes the graph from the model)."""
    return max(1024, 8 * len(model.tensors))


class LlamaGraphBuilder:
    """llm_graph_context + llama_model_llama::graph for one ubatch."""

    def __init__(self, model, kv, cparams, n_tokens: int, n_outputs: int, n_kv: int, cb_name=None):
        self.model = model
        self.hp = model.hparams
        self.kv = kv
        self.cparams = cparams
        self.n_tokens = n_tokens
        self.n_outputs = n_outputs
        self.n_kv = n_kv
        max_nodes = graph_max_nodes(model)
        # buf_compute_meta: tensor headers of the graph and the graph object itself, nothing else (no_alloc)
        mem = ggml.tensor_overhead() * max_nodes + ggml.graph_overhead_custom(max_nodes, False)
        self.ctx0 = ggml.init(mem, no_alloc=True)
        self.gf = ggml.new_graph_custom(self.ctx0, max_nodes, False)
        self.inputs = GraphInputs()
        self.user_cb = cb_name

    # llm_graph_context::cb -> llama_context's graph callback: name the tensor "<name>-<il>"
    def cb(self, t, name: str, il: int):
        if il >= 0:
            ggml.format_name(t, "%s-%d", name, il)
        else:
            ggml.set_name(t, name)
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
        ggml.set_input(tokens)
        self.inputs.tokens = tokens
        embd = ggml.new_tensor_2d(ctx0, ggml.GGML_TYPE_F32, self.hp.n_embd, self.n_tokens)
        self.cb(embd, "inp_embd", -1)
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
        ggml.set_input(pos)
        self.inputs.pos = pos
        return pos

    def build_attn_inp_kv(self):
        ctx0, hp = self.ctx0, self.hp
        k_idxs = ggml.new_tensor_1d(ctx0, ggml.GGML_TYPE_I64, self.n_tokens)
        ggml.set_input(k_idxs)
        ggml.set_name(k_idxs, "attn_inp_k_idxs")
        n_v = self.n_tokens * hp.n_embd_v_gqa if self.kv.v_trans else self.n_tokens
        v_idxs = ggml.new_tensor_1d(ctx0, ggml.GGML_TYPE_I64, n_v)
        ggml.set_input(v_idxs)
        ggml.set_name(v_idxs, "attn_inp_v_idxs")
        mask = ggml.new_tensor_4d(ctx0, ggml.GGML_TYPE_F32, self.n_kv, self.n_tokens, 1, 1)
        ggml.set_input(mask)
        ggml.set_name(mask, "attn_inp_kq_mask")
        self.inputs.k_idxs, self.inputs.v_idxs, self.inputs.kq_mask = k_idxs, v_idxs, mask

    def build_inp_out_ids(self):
        out_ids = ggml.new_tensor_1d(self.ctx0, ggml.GGML_TYPE_I32, self.n_outputs)
        ggml.set_input(out_ids)
        ggml.set_name(out_ids, "out_ids")
        self.inputs.out_ids = out_ids
        return out_ids

    # ---- blocks
    def build_norm(self, cur, mw, il: int):
        cur = ggml.rms_norm(self.ctx0, cur, self.hp.f_norm_rms_eps)
        self.cb(cur, "norm", il)
        if mw is not None:
            cur = ggml.mul(self.ctx0, cur, mw)
        return cur

    def build_ffn(self, cur, up, gate, down, il: int):
        ctx0 = self.ctx0
        tmp = ggml.mul_mat(ctx0, up, cur)
        self.cb(tmp, "ffn_up", il)
        cur = ggml.mul_mat(ctx0, gate, cur)
        self.cb(cur, "ffn_gate", il)
        # LLM_FFN_SILU + LLM_FFN_PAR: fused silu(gate) * up
        cur = ggml.swiglu_split(ctx0, cur, tmp)
        self.cb(cur, "ffn_swiglu", il)
        cur = ggml.mul_mat(ctx0, down, cur)
        self.cb(cur, "ffn_down", il)
        return cur

    def build_attn_mha(self, q, k, v, kq_mask, kq_scale: float, il: int):
        ctx0 = self.ctx0
        v_trans = v.nb[1] > v.nb[2]
        n_stream = int(k.ne[3])
        q = ggml.view_4d(ctx0, q, int(q.ne[0]), int(q.ne[1]), int(q.ne[2]) // n_stream, n_stream,
                         int(q.nb[1]), int(q.nb[2]), int(q.nb[3]) // n_stream, 0)
        q = ggml.permute(ctx0, q, 0, 2, 1, 3)
        k = ggml.permute(ctx0, k, 0, 2, 1, 3)
        v = ggml.permute(ctx0, v, 0, 2, 1, 3)
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
        ggml.build_forward_expand(self.gf, cur)
        return cur

    def build_attn(self, wo, q_cur, k_cur, v_cur, kq_scale: float, il: int):
        ctx0, gf, inp = self.ctx0, self.gf, self.inputs
        # these nodes are added to the graph together so that they are not reordered; k last for rope fusion
        ggml.build_forward_expand(gf, q_cur)
        ggml.build_forward_expand(gf, v_cur)
        ggml.build_forward_expand(gf, k_cur)
        # store to KV cache
        ggml.build_forward_expand(gf, self.kv.cpy_k(ctx0, k_cur, inp.k_idxs, il))
        ggml.build_forward_expand(gf, self.kv.cpy_v(ctx0, v_cur, inp.v_idxs, il))
        k = self.kv.get_k(ctx0, il, self.n_kv)
        v = self.kv.get_v(ctx0, il, self.n_kv)
        cur = self.build_attn_mha(q_cur, k, v, inp.kq_mask, kq_scale, il)
        self.cb(cur, "kqv_out", il)
        if wo is not None:
            cur = ggml.mul_mat(ctx0, wo, cur)
        return cur

    # ---- llama_model_llama::graph
    def build(self) -> GraphResult:
        ctx0, hp, model, cp = self.ctx0, self.hp, self.model, self.cparams
        n_embd_head = hp.n_embd_head_v
        n_tokens = self.n_tokens
        inpL = self.build_inp_embd(model.tok_embd)
        inp_pos = self.build_inp_pos()
        self.build_attn_inp_kv()
        kq_scale = 1.0 / math.sqrt(float(n_embd_head)) if hp.f_attention_scale == 0.0 else hp.f_attention_scale
        inp_out_ids = self.build_inp_out_ids()
        rope_args = (hp.n_rot, hp.rope_type, hp.n_ctx_train, cp.rope_freq_base, cp.rope_freq_scale,
                     cp.yarn_ext_factor, cp.yarn_attn_factor, cp.yarn_beta_fast, cp.yarn_beta_slow)
        for il in range(hp.n_layer):
            layer = model.layers[il]
            inpSA = inpL
            cur = self.build_norm(inpL, layer.attn_norm, il)
            self.cb(cur, "attn_norm", il)
            # build_qkv: separate wq/wk/wv, then heads
            Qcur = ggml.mul_mat(ctx0, layer.wq, cur)
            self.cb(Qcur, "Qcur", il)
            Kcur = ggml.mul_mat(ctx0, layer.wk, cur)
            self.cb(Kcur, "Kcur", il)
            Vcur = ggml.mul_mat(ctx0, layer.wv, cur)
            self.cb(Vcur, "Vcur", il)
            Qcur = ggml.reshape_3d(ctx0, Qcur, n_embd_head, hp.n_head, n_tokens)
            Kcur = ggml.reshape_3d(ctx0, Kcur, n_embd_head, hp.n_head_kv, n_tokens)
            Vcur = ggml.reshape_3d(ctx0, Vcur, n_embd_head, hp.n_head_kv, n_tokens)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)
            Qcur = ggml.rope_ext(ctx0, Qcur, inp_pos, layer.rope_freqs, *rope_args)
            Kcur = ggml.rope_ext(ctx0, Kcur, inp_pos, layer.rope_freqs, *rope_args)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)
            cur = self.build_attn(layer.wo, Qcur, Kcur, Vcur, kq_scale, il)
            self.cb(cur, "attn_out", il)
            if il == hp.n_layer - 1 and inp_out_ids is not None:
                cur = ggml.get_rows(ctx0, cur, inp_out_ids)
                inpSA = ggml.get_rows(ctx0, inpSA, inp_out_ids)
            ffn_inp = ggml.add(ctx0, cur, inpSA)
            self.cb(ffn_inp, "ffn_inp", il)
            cur = self.build_norm(ffn_inp, layer.ffn_norm, il)
            self.cb(cur, "ffn_norm", il)
            if getattr(model, "sparse", None) is not None:      # PowerInfer: llm_build_ffn_sparse (ggviz/llama/powerinfer.py)
                cur = powerinfer.build_ffn_sparse(self, cur, ffn_inp, layer, model.sparse.layers[il], il,
                                                  model.sparse.act_type)
            else:
                cur = self.build_ffn(cur, layer.ffn_up, layer.ffn_gate, layer.ffn_down, il)
            self.cb(cur, "ffn_out", il)
            cur = ggml.add(ctx0, cur, ffn_inp)
            self.cb(cur, "ffn_out", il)
            self.cb(cur, "l_out", il)
            inpL = cur
        cur = self.build_norm(inpL, model.output_norm, -1)
        self.cb(cur, "result_norm", -1)
        t_embd = cur
        cur = ggml.mul_mat(ctx0, model.output, cur)
        self.cb(cur, "result_output", -1)
        ggml.build_forward_expand(self.gf, cur)
        return GraphResult(ctx=ctx0, gf=self.gf, inputs=self.inputs, t_logits=cur, t_embd=t_embd, n_kv=self.n_kv,
                           n_tokens=n_tokens, n_outputs=self.n_outputs)
