"""LLM_ARCH_LLAMA: mirrors llama.cpp's ``src/models/llama.cpp`` (``llama_model_llama::load_arch_hparams``,
``load_arch_tensors`` and ``graph``), the graph of SmolLM2: RMS norm, Q/K/V, RoPE (normal), causal attention over
the KV cache, a residual add, RMS norm, SWIGLU FFN, a residual add; a final norm and the (possibly tied) output.
"""
from __future__ import annotations

import math

from ... import ggml
from .. import powerinfer
from ..graph import GraphResult, LlmGraphContext

ROPE_TYPE = 0   # LLAMA_ROPE_TYPE_NORM


def load_arch_hparams(kv: dict, hp) -> None:
    """Beyond the keys every architecture reads (llama_model::load_hparams): the model type from the layer count."""
    n_expert = int(kv.get("llama.expert_count", 0))
    if n_expert == 8:
        hp.type_name = {32: "8x7B", 56: "8x22B"}.get(hp.n_layer, "?B")
    elif hp.n_layer == 32:
        # granite's vocab has 49152 entries
        n_vocab = int(kv.get("llama.vocab_size", len(kv.get("tokenizer.ggml.tokens", ()))))
        hp.type_name = "3B" if n_vocab == 49152 else ("7B" if n_vocab < 40000 else "8B")
    elif hp.n_layer == 80:
        hp.type_name = "65B" if hp.n_head == hp.n_head_kv else "70B"
    else:
        hp.type_name = {16: "1B", 22: "1B", 26: "3B", 28: "3B", 30: "256M", 36: "8B", 40: "13B", 48: "34B",
                        60: "30B"}.get(hp.n_layer, "?B")


def load_arch_tensors(need, opt, hp):
    n_embd, n_ff = hp.n_embd, hp.n_ff
    tok_embd = need("token_embd.weight", (n_embd, hp.n_vocab))
    output_norm = need("output_norm.weight", (n_embd,))
    # if output is absent the input embedding is tied (TENSOR_DUPLICATED in llama.cpp)
    output = opt("output.weight") or tok_embd
    layers = []
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        layers.append(dict(
            attn_norm=need(p + "attn_norm.weight", (n_embd,)),
            wq=need(p + "attn_q.weight", (n_embd, hp.n_embd_head_k * hp.n_head)),
            wk=need(p + "attn_k.weight", (n_embd, hp.n_embd_k_gqa)),
            wv=need(p + "attn_v.weight", (n_embd, hp.n_embd_v_gqa)),
            wo=need(p + "attn_output.weight", (hp.n_embd_head_k * hp.n_head, n_embd)),
            ffn_norm=need(p + "ffn_norm.weight", (n_embd,)),
            ffn_gate=need(p + "ffn_gate.weight", (n_embd, n_ff)),
            ffn_up=need(p + "ffn_up.weight", (n_embd, n_ff)),
            ffn_down=need(p + "ffn_down.weight", (n_ff, n_embd)),
            rope_freqs=opt(p + "rope_freqs.weight") or opt("rope_freqs.weight"),
        ))
    return tok_embd, output_norm, output, layers


class LlamaGraph(LlmGraphContext):
    """llama_model_llama::graph for one ubatch."""

    tok_complete = True      # (but PowerInfer's sparse FFN records nothing: build says so)

    def build(self) -> GraphResult:
        ctx0, hp, model, cp = self.ctx0, self.hp, self.model, self.cparams
        n_embd_head = hp.n_embd_head_v
        if getattr(self.model, "sparse", None) is not None:
            self.tok_complete = False
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
            Qcur, Kcur, Vcur = self.build_qkv(layer, cur, n_embd_head, hp.n_head, hp.n_head_kv, il)
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
            if getattr(self.model, "sparse", None) is not None:
                # PowerInfer: llm_build_ffn_sparse (ggviz/llama/powerinfer.py) from the PWRI file's predictor
                cur = powerinfer.build_ffn_sparse(self, cur, ffn_inp, layer, self.model.sparse.layers[il], il,
                                                  self.model.sparse.act_type)
            else:
                cur = self.build_ffn(cur, layer.ffn_up, layer.ffn_gate, layer.ffn_down, il, "silu")
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
        return self.result(cur, t_embd)


GRAPH = LlamaGraph
