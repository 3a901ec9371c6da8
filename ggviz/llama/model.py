"""llama_model: hyper-parameters and weights of a llama-architecture GGUF.

Mirrors llama.cpp's ``llama_model_load_from_file`` path for LLM_ARCH_LLAMA: ``llama_model_loader`` (GGUF metadata,
tensor infos), ``llama_model::load_hparams`` (the ``llama.*`` keys), ``llama_model_llama::load_arch_tensors``
(``token_embd``, ``output_norm``, ``output`` falling back to the tied ``token_embd``, per layer ``attn_norm``,
``attn_q/k/v``, ``attn_output``, ``ffn_norm``, ``ffn_gate/up/down``) and ``llama_model_default_params``.

Weights stay in the file: they are ggml tensors of a ``no_alloc`` context whose ``data`` points into the read-only
memory map (llama.cpp's mmap path, ``use_mmap = true``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import ggml
from ..gguf_file import GGUFError, GGUFFile, create_weight_context, load_gguf, require_arch

LLAMA_ROPE_TYPE_NONE = -1
LLAMA_ROPE_TYPE_NORM = 0
LLAMA_ROPE_TYPE_NEOX = ggml.GGML_ROPE_TYPE_NEOX

SUPPORTED_ARCHS = {"llama"}


@dataclass
class LlamaHparams:
    """llama_hparams: the subset a llama-architecture model uses."""
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_rot: int
    n_embd_head_k: int
    n_embd_head_v: int
    f_norm_rms_eps: float
    rope_freq_base_train: float
    rope_freq_scale_train: float = 1.0
    f_attention_scale: float = 0.0
    rope_type: int = LLAMA_ROPE_TYPE_NORM

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv


@dataclass
class LlamaLayer:
    attn_norm: object = None
    wq: object = None
    wk: object = None
    wv: object = None
    wo: object = None
    ffn_norm: object = None
    ffn_gate: object = None
    ffn_up: object = None
    ffn_down: object = None
    rope_freqs: object = None


@dataclass
class LlamaModelParams:
    """llama_model_params (the fields that matter on a CPU-only build)."""
    n_gpu_layers: int = 0
    use_mmap: bool = True
    use_mlock: bool = False
    vocab_only: bool = False
    check_tensors: bool = False


def model_default_params() -> LlamaModelParams:
    return LlamaModelParams()


@dataclass
class LlamaModel:
    path: str
    gguf: GGUFFile
    arch: str
    name: str
    hparams: LlamaHparams
    vocab: object
    ctx_w: object                    # the no_alloc weights context
    tensors: dict                    # name -> ggml tensor (data in the mapping)
    tok_embd: object
    output_norm: object
    output: object
    layers: list = field(default_factory=list)
    t_load_us: int = 0
    params: LlamaModelParams = field(default_factory=LlamaModelParams)

    def n_params(self) -> int:
        return sum(ggml.nelements(t) for t in self.tensors.values())

    def size(self) -> int:
        return sum(ggml.nbytes(t) for t in self.tensors.values())

    def desc(self) -> str:
        ftype = {2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 1: "F16", 0: "F32"}.get(self.gguf.kv.get("general.file_type"), "?")
        return f"{self.arch} {self.gguf.kv.get('general.size_label', '?')} {ftype}"


def _get(gf: GGUFFile, key: str, default=None, required=True):
    if key in gf.kv:
        return gf.kv[key]
    if required and default is None:
        raise GGUFError(gf.path, 0, key, "a metadata key", "missing", source="llama.cpp")
    return default


def load_hparams(gf: GGUFFile) -> LlamaHparams:
    arch = require_arch(gf, SUPPORTED_ARCHS)
    n_embd = int(_get(gf, f"{arch}.embedding_length"))
    n_head = int(_get(gf, f"{arch}.attention.head_count"))
    n_head_kv = int(_get(gf, f"{arch}.attention.head_count_kv", n_head))
    n_embd_head = n_embd // n_head
    n_rot = int(_get(gf, f"{arch}.rope.dimension_count", n_embd_head))
    tok = gf.tensor("token_embd.weight") if any(t.name == "token_embd.weight" for t in gf.tensors) else None
    n_vocab = int(_get(gf, f"{arch}.vocab_size", tok.ne[1] if tok is not None else None))
    return LlamaHparams(
        n_vocab=n_vocab,
        n_ctx_train=int(_get(gf, f"{arch}.context_length")),
        n_embd=n_embd,
        n_layer=int(_get(gf, f"{arch}.block_count")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=int(_get(gf, f"{arch}.feed_forward_length")),
        n_rot=n_rot,
        n_embd_head_k=int(_get(gf, f"{arch}.attention.key_length", n_embd_head)),
        n_embd_head_v=int(_get(gf, f"{arch}.attention.value_length", n_embd_head)),
        f_norm_rms_eps=float(_get(gf, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_freq_base_train=float(_get(gf, f"{arch}.rope.freq_base", 10000.0)),
        rope_freq_scale_train=1.0 / float(_get(gf, f"{arch}.rope.scaling.factor", 1.0) or 1.0),
        rope_type=LLAMA_ROPE_TYPE_NORM,
    )


def model_load_from_file(path, params: LlamaModelParams | None = None) -> LlamaModel:
    """llama_model_load_from_file: parse, validate, map the weights, build the vocabulary."""
    from .vocab import Vocab
    params = params or model_default_params()
    t0 = time.perf_counter()
    gf = load_gguf(path)
    hp = load_hparams(gf)
    vocab = Vocab.from_gguf_kv(gf.kv)
    ctx_w, tensors = create_weight_context(gf)

    def need(name, shape):
        t = tensors.get(name)
        if t is None:
            raise GGUFError(gf.path, 0, name, "a tensor", "missing", source="llama.cpp")
        if tuple(int(x) for x in t.shape[:len(shape)]) != tuple(shape) or any(int(x) != 1 for x in t.shape[len(shape):]):
            raise GGUFError(gf.path, gf.tensor(name).file_offset, name, f"shape {list(shape)}",
                            f"{list(t.shape)}", source="llama.cpp")
        return t

    n_embd, n_ff = hp.n_embd, hp.n_ff
    tok_embd = need("token_embd.weight", (n_embd, hp.n_vocab))
    output_norm = need("output_norm.weight", (n_embd,))
    # if output is absent the input embedding is tied (TENSOR_DUPLICATED in llama.cpp)
    output = tensors.get("output.weight") or tok_embd
    layers = []
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        layers.append(LlamaLayer(
            attn_norm=need(p + "attn_norm.weight", (n_embd,)),
            wq=need(p + "attn_q.weight", (n_embd, hp.n_embd_head_k * hp.n_head)),
            wk=need(p + "attn_k.weight", (n_embd, hp.n_embd_k_gqa)),
            wv=need(p + "attn_v.weight", (n_embd, hp.n_embd_v_gqa)),
            wo=need(p + "attn_output.weight", (hp.n_embd_head_k * hp.n_head, n_embd)),
            ffn_norm=need(p + "ffn_norm.weight", (n_embd,)),
            ffn_gate=need(p + "ffn_gate.weight", (n_embd, n_ff)),
            ffn_up=need(p + "ffn_up.weight", (n_embd, n_ff)),
            ffn_down=need(p + "ffn_down.weight", (n_ff, n_embd)),
            rope_freqs=tensors.get(p + "rope_freqs.weight") or tensors.get("rope_freqs.weight"),
        ))
    m = LlamaModel(path=str(path), gguf=gf, arch=gf.arch, name=str(gf.kv.get("general.name", "")), hparams=hp,
                   vocab=vocab, ctx_w=ctx_w, tensors=tensors, tok_embd=tok_embd, output_norm=output_norm,
                   output=output, layers=layers, params=params)
    m.t_load_us = int((time.perf_counter() - t0) * 1e6)
    return m


def model_free(model: LlamaModel) -> None:
    ggml.free(model.ctx_w)
