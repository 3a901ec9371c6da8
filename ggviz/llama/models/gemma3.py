"""LLM_ARCH_GEMMA3: mirrors llama.cpp's ``src/models/gemma3.cpp`` (``llama_model_gemma3::load_arch_hparams``,
``load_arch_tensors`` and ``graph<iswa>``), the graph of Gemma-3.

Where it differs from llama (models/llama.py): the token embeddings are scaled by sqrt(n_embd) (``inp_scaled``);
Q and K get their own RMS norm per head (QK norm: ``Qcur_normed``, ``Kcur_normed``) before NEOX RoPE; Q is scaled
by ``f_attention_scale`` = 1/sqrt(head_dim) *before* attention (so the softmax scale is 1); head_dim (256) is not
n_embd / n_head (160), and 4 query heads share 1 KV head; the attention output and the FFN output are normed again
(``attn_post_norm``, ``ffn_post_norm``) before their residual adds; the FFN is GEGLU (``ggml_geglu_split``: GELU
(tanh form, ggml's fp16 table) of the gate times up); five layers of six attend a sliding window of ``n_swa`` tokens
through their own KV cache, mask and RoPE base (10000 instead of 1e6); the output is tied to the embedding table.
"""
from __future__ import annotations

import numpy as np

from ... import ggml
from ..graph import GraphResult, LlmGraphContext

ROPE_TYPE = ggml.GGML_ROPE_TYPE_NEOX   # LLAMA_ROPE_TYPE_NEOX

LLAMA_SWA_TYPE_NONE = 0
LLAMA_SWA_TYPE_STANDARD = 1


def load_arch_hparams(kv: dict, hp) -> None:
    """llama_model_gemma3::load_arch_hparams."""
    n_swa = int(kv.get("gemma3.attention.sliding_window", 0))
    if n_swa > 0:
        hp.n_swa = n_swa
        hp.swa_type = LLAMA_SWA_TYPE_STANDARD
        # load_swa_pattern(ml, 6): an explicit per-layer array wins, else the pattern length (default 6: five local
        # layers, then one global)
        pat = kv.get("gemma3.attention.sliding_window_pattern")
        if isinstance(pat, (list, tuple)):
            hp.swa_layers = [bool(x) for x in pat][:hp.n_layer]
        else:
            hp.set_swa_pattern(int(pat) if pat is not None else 6)
        hp.rope_freq_base_train_swa = float(kv.get("gemma3.rope.freq_base_swa", hp.rope_freq_base_train_swa))
    else:
        hp.swa_type = LLAMA_SWA_TYPE_NONE
        hp.swa_layers = [False] * hp.n_layer
    hp.f_final_logit_softcapping = float(kv.get("gemma3.final_logit_softcapping", 0.0))
    hp.type_name = {18: "270M", 26: "1B", 32: "8B", 34: "4B", 48: "12B", 62: "27B"}.get(hp.n_layer, "?B")
    # ref: gemma_pytorch config.py: query_pre_attn_scalar; llama.cpp derives it from the model type (27B: 62 layers)
    if hp.n_layer == 62:
        hp.f_attention_scale = float(np.float32(1.0) / np.sqrt(np.float32(hp.n_embd // hp.n_head)))
    else:
        hp.f_attention_scale = float(np.float32(1.0) / np.sqrt(np.float32(hp.n_embd_head_k)))


def load_arch_tensors(need, opt, hp):
    """llama_model_gemma3::load_arch_tensors."""
    n_embd, n_ff, hd = hp.n_embd, hp.n_ff, hp.n_embd_head_k
    tok_embd = need("token_embd.weight", (n_embd, hp.n_vocab))
    output_norm = need("output_norm.weight", (n_embd,))
    output = opt("output.weight") or tok_embd      # TENSOR_DUPLICATED when absent (tied)
    layers = []
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        layers.append(dict(
            attn_norm=need(p + "attn_norm.weight", (n_embd,)),
            wq=need(p + "attn_q.weight", (n_embd, hd * hp.n_head)),
            wk=need(p + "attn_k.weight", (n_embd, hp.n_embd_k_gqa)),
            wv=need(p + "attn_v.weight", (n_embd, hp.n_embd_v_gqa)),
            wo=need(p + "attn_output.weight", (hd * hp.n_head, n_embd)),
            attn_post_norm=need(p + "post_attention_norm.weight", (n_embd,)),
            attn_k_norm=need(p + "attn_k_norm.weight", (hd,)),
            attn_q_norm=need(p + "attn_q_norm.weight", (hd,)),
            ffn_norm=need(p + "ffn_norm.weight", (n_embd,)),
            ffn_gate=need(p + "ffn_gate.weight", (n_embd, n_ff)),
            ffn_up=need(p + "ffn_up.weight", (n_embd, n_ff)),
            ffn_down=need(p + "ffn_down.weight", (n_ff, n_embd)),
            ffn_post_norm=need(p + "post_ffw_norm.weight", (n_embd,)),
        ))
    return tok_embd, output_norm, output, layers


class Gemma3Graph(LlmGraphContext):
    """llama_model_gemma3::graph<iswa> for one ubatch (iswa: the KV cache is an iSWA one)."""

    tok_complete = True

    def build(self) -> GraphResult:
        ctx0, hp, model, cp = self.ctx0, self.hp, self.model, self.cparams
        n_embd_head = hp.n_embd_head_k
        inpL = self.build_inp_embd(model.tok_embd)
        # sqrtf(n_embd) in float32 (only for token input; raw embeddings would be scaled by 1)
        inpL = ggml.scale(ctx0, inpL, float(np.sqrt(np.float32(hp.n_embd))))
        self.cb(inpL, "inp_scaled", -1)
        inp_pos = self.build_inp_pos()
        if self.iswa:
            self.build_attn_inp_kv_iswa()
        else:
            self.build_attn_inp_kv()
        inp_out_ids = self.build_inp_out_ids()
        for il in range(hp.n_layer):
            # llama_model::get_rope_freq_base/scale: the sliding-window layers have their own
            if self.iswa and hp.is_swa(il):
                freq_base_l, freq_scale_l = hp.rope_freq_base_train_swa, hp.rope_freq_scale_train_swa
            else:
                freq_base_l, freq_scale_l = cp.rope_freq_base, cp.rope_freq_scale
            rope_args = (hp.n_rot, hp.rope_type, hp.n_ctx_train, freq_base_l, freq_scale_l,
                         cp.yarn_ext_factor, cp.yarn_attn_factor, cp.yarn_beta_fast, cp.yarn_beta_slow)
            layer = model.layers[il]
            cur = self.build_norm(inpL, layer.attn_norm, il)
            self.cb(cur, "attn_norm", il)
            Qcur, Kcur, Vcur = self.build_qkv(layer, cur, n_embd_head, hp.n_head, hp.n_head_kv, il)
            Qcur = self.build_norm(Qcur, layer.attn_q_norm, il)
            self.cb(Qcur, "Qcur_normed", il)
            Qcur = ggml.rope_ext(ctx0, Qcur, inp_pos, None, *rope_args)
            Kcur = self.build_norm(Kcur, layer.attn_k_norm, il)
            self.cb(Kcur, "Kcur_normed", il)
            Kcur = ggml.rope_ext(ctx0, Kcur, inp_pos, None, *rope_args)
            self.cb(Qcur, "Qcur", il)
            self.cb(Kcur, "Kcur", il)
            self.cb(Vcur, "Vcur", il)
            # gemma_pytorch scales the queries, not the scores: the SCALE node is unnamed in llama.cpp
            Qcur = ggml.scale(ctx0, Qcur, hp.f_attention_scale)
            cur = self.build_attn(layer.wo, Qcur, Kcur, Vcur, 1.0, il)
            if il == hp.n_layer - 1 and inp_out_ids is not None:
                cur = ggml.get_rows(ctx0, cur, inp_out_ids)
                inpL = ggml.get_rows(ctx0, inpL, inp_out_ids)
            cur = self.build_norm(cur, layer.attn_post_norm, il)
            self.cb(cur, "attn_post_norm", il)
            sa_out = ggml.add(ctx0, cur, inpL)
            self.cb(sa_out, "sa_out", il)
            cur = self.build_norm(sa_out, layer.ffn_norm, il)
            self.cb(cur, "ffn_norm", il)
            cur = self.build_ffn(cur, layer.ffn_up, layer.ffn_gate, layer.ffn_down, il, "gelu")
            self.cb(cur, "ffn_out", il)
            # il = -1 here in llama.cpp: this norm is named "norm", without the layer
            cur = self.build_norm(cur, layer.ffn_post_norm, -1)
            self.cb(cur, "ffn_post_norm", il)
            cur = ggml.add(ctx0, cur, sa_out)
            self.cb(cur, "l_out", il)
            inpL = cur
        cur = self.build_norm(inpL, model.output_norm, -1)
        self.cb(cur, "result_norm", -1)
        t_embd = cur
        cur = ggml.mul_mat(ctx0, model.output, cur)
        if hp.f_final_logit_softcapping:
            cur = ggml.scale(ctx0, cur, 1.0 / hp.f_final_logit_softcapping)
            cur = ggml.tanh(ctx0, cur)
            cur = ggml.scale(ctx0, cur, hp.f_final_logit_softcapping)
        self.cb(cur, "result_output", -1)
        ggml.build_forward_expand(self.gf, cur)
        return self.result(cur, t_embd)


GRAPH = Gemma3Graph
