"""llama_model: hyper-parameters and weights of a GGUF model (architectures ``llama`` and ``gemma3``).

Mirrors llama.cpp's ``llama_model_load_from_file`` path (llama-model.cpp): ``llama_model_loader`` (GGUF metadata,
tensor infos), ``llama_model::load_hparams`` (the ``<arch>.*`` keys every architecture reads, then the
architecture's own ``load_arch_hparams``), the architecture's ``load_arch_tensors`` (in ``models/<arch>.py``, as
llama.cpp's ``src/models/<arch>.cpp``: ``token_embd``, ``output_norm``, ``output`` falling back to the tied
``token_embd``, the per-layer weights) and ``llama_model_default_params``.

Weights stay in the file: they are ggml tensors of a ``no_alloc`` context whose ``data`` points into the read-only
memory map (llama.cpp's mmap path, ``use_mmap = true``).
"""
from __future__ import annotations

import bisect
import math
import os
import time
from dataclasses import dataclass, field

from .. import ggml
from ..ggml import alloc as galloc
from ..ggml import backend as B
from ..ggml import backend_reg, impl, memory
from ..ggml.cpu import repack
from ..ggml.gguf import GGUFError, GGUFFile, create_weight_context, load_gguf, require_arch
from . import models as arch_models
from . import powerinfer
from .vocab import Vocab

LLAMA_ROPE_TYPE_NONE = -1
LLAMA_ROPE_TYPE_NORM = 0
LLAMA_ROPE_TYPE_NEOX = ggml.GGML_ROPE_TYPE_NEOX

SUPPORTED_ARCHS = set(arch_models.ARCHS)

# llama_swa_type
LLAMA_SWA_TYPE_NONE = 0
LLAMA_SWA_TYPE_STANDARD = 1
LLAMA_SWA_TYPE_CHUNKED = 2
LLAMA_SWA_TYPE_SYMMETRIC = 3


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
    # sliding-window attention (llama_hparams: n_swa, swa_type, is_swa_impl[], rope_freq_*_train_swa)
    n_swa: int = 0
    swa_type: int = LLAMA_SWA_TYPE_NONE
    swa_layers: list = field(default_factory=list)     # is_swa_impl: True for a sliding-window layer
    rope_freq_base_train_swa: float = 10000.0
    rope_freq_scale_train_swa: float = 1.0
    f_final_logit_softcapping: float = 0.0
    arch: str = "llama"
    # llama_model::type as llm_type_name() spells it; each architecture's load_arch_hparams picks it from the
    # layer count (so SmolLM2-135M's 30 layers read "256M", the size llama.cpp's table gives SmolDocling)
    type_name: str = "?B"

    def is_swa(self, il: int) -> bool:
        """llama_hparams::is_swa."""
        if not 0 <= il < self.n_layer:
            raise IndexError(f"llama_hparams::is_swa: il ({il}) out of bounds (n_layer: {self.n_layer})")
        return bool(self.swa_layers[il]) if self.swa_layers else False

    def is_swa_any(self) -> bool:
        return any(self.swa_layers)

    def set_swa_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        """llama_hparams::set_swa_pattern: with n_pattern 6 (gemma3), layers 5, 11, 17 are global, the rest local."""
        if dense_first:
            self.swa_layers = [n_pattern == 0 or il % n_pattern != 0 for il in range(self.n_layer)]
        else:
            self.swa_layers = [n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(self.n_layer)]

    @staticmethod
    def is_masked_swa(n_swa: int, swa_type: int, p0, p1):
        """llama_hparams::is_masked_swa: whether a token at position p1 may NOT see position p0 (works on arrays)."""
        if swa_type == LLAMA_SWA_TYPE_NONE:
            return p1 - p0 < -(1 << 62)        # all False, same shape
        if swa_type == LLAMA_SWA_TYPE_STANDARD:
            return p1 - p0 >= n_swa
        if swa_type == LLAMA_SWA_TYPE_CHUNKED:
            return p0 < (p1 // n_swa) * n_swa
        if swa_type == LLAMA_SWA_TYPE_SYMMETRIC:
            half = n_swa // 2
            return (p1 - p0 < -half) | (p1 - p0 > half)
        raise ValueError(f"unknown swa_type {swa_type}")

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
    attn_q_norm: object = None       # gemma3: QK norm
    attn_k_norm: object = None
    attn_post_norm: object = None    # gemma3: norms after attention and after the FFN
    ffn_post_norm: object = None


@dataclass
class LlamaModelParams:
    """llama_model_params (the fields that matter on a CPU-only build)."""
    n_gpu_layers: int = 0
    use_mmap: bool = True
    use_mlock: bool = False
    vocab_only: bool = False
    check_tensors: bool = False
    use_extra_bufts: bool = True     # weights of MUL_MATs go to the CPU's extra buffer types (CPU_REPACK) if any
    devices: list | None = None      # devices to offload to (None: every GPU-type device in the registry)
    vram_budget_gb: float = -1.0     # PowerInfer (PWRI models): > 0 loads <model>.generated.gpuidx, the FFN split
    vram_offload_dense: bool = False  # PowerInfer (with vram_budget_gb): also move what PowerInfer offloads before
                                      # the neurons (attention, predictor, ffn_norm, output) to the device; off by
                                      # default because the device's faithful Q4_1 MUL_MAT adds in another order
                                      # than the CPU's repacked one (a real GPU's bits differ too), so the logits are
                                      # then no longer the CPU-only run's bits


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
    bufs: list = field(default_factory=list)   # backend buffers the weights were loaded into (extra buffer types)
    devices: list = field(default_factory=list)     # the offload devices (llama_model::devices)
    dev_input: object = None                        # device of the input layer (always the CPU)
    dev_layer: list = field(default_factory=list)   # device of each repeating layer
    dev_output: object = None                       # device of the output layer (norm + output)
    ctx_extra: list = field(default_factory=list)   # contexts of duplicated tensors (a tied output on a device)
    sparse: object = None            # PowerInfer (a PWRI file): powerinfer.SparseModel, else None

    def n_params(self) -> int:
        return sum(ggml.nelements(t) for t in self.tensors.values())

    def size(self) -> int:
        return sum(ggml.nbytes(t) for t in self.tensors.values())

    def desc(self) -> str:
        ftype = {2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 1: "F16", 0: "F32", 15: "Q4_K - Medium"}.get(self.gguf.kv.get("general.file_type"), "?")
        # llama_model desc_str: arch_name() + " " + type_name() + " " + ftype_name()
        return f"{self.arch} {self.hparams.type_name} {ftype}"


def _get(gf: GGUFFile, key: str, default=None, required=True):
    if key in gf.kv:
        return gf.kv[key]
    if required and default is None:
        raise GGUFError(gf.path, 0, key, "a metadata key", "missing", source="llama.cpp")
    return default


def load_hparams(gf: GGUFFile) -> LlamaHparams:
    """llama_model::load_hparams: the keys every architecture reads, then the architecture's load_arch_hparams."""
    arch = require_arch(gf, SUPPORTED_ARCHS)
    n_embd = int(_get(gf, f"{arch}.embedding_length"))
    n_head = int(_get(gf, f"{arch}.attention.head_count"))
    n_head_kv = int(_get(gf, f"{arch}.attention.head_count_kv", n_head))
    # n_embd_head_k_full = n_embd / n_head unless attention.key_length says otherwise (gemma3: 256 != 640 / 4);
    # n_rot defaults to the key head size
    n_embd_head_k = int(_get(gf, f"{arch}.attention.key_length", n_embd // n_head))
    n_embd_head_v = int(_get(gf, f"{arch}.attention.value_length", n_embd // n_head))
    n_rot = int(_get(gf, f"{arch}.rope.dimension_count", n_embd_head_k))
    tok = gf.tensor("token_embd.weight") if any(t.name == "token_embd.weight" for t in gf.tensors) else None
    n_vocab = int(_get(gf, f"{arch}.vocab_size", tok.ne[1] if tok is not None else None))
    hp = LlamaHparams(
        n_vocab=n_vocab,
        n_ctx_train=int(_get(gf, f"{arch}.context_length")),
        n_embd=n_embd,
        n_layer=int(_get(gf, f"{arch}.block_count")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=int(_get(gf, f"{arch}.feed_forward_length")),
        n_rot=n_rot,
        n_embd_head_k=n_embd_head_k,
        n_embd_head_v=n_embd_head_v,
        f_norm_rms_eps=float(_get(gf, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_freq_base_train=float(_get(gf, f"{arch}.rope.freq_base", 10000.0)),
        rope_freq_scale_train=1.0 / float(_get(gf, f"{arch}.rope.scaling.factor", 1.0) or 1.0),
        rope_type=arch_models.ROPE_TYPE[arch],
        arch=arch,
    )
    arch_models.load_arch_hparams(arch, gf.kv, hp)
    return hp


def model_load_from_file(path, params: LlamaModelParams | None = None) -> LlamaModel:
    """llama_model_load_from_file: parse, validate, map the weights, build the vocabulary."""
    with memory.gc_paused():     # ggviz: the vocabulary's and the weights' long-lived objects, not traversed while made
        return _model_load_from_file(path, params)


def _model_load_from_file(path, params: LlamaModelParams | None) -> LlamaModel:
    params = params or model_default_params()
    t0 = time.perf_counter()
    # vram_budget_gb: <= 0 means no FFN split; NaN (which passes neither test) and inf (no byte count) are refused
    budget_gb = float(params.vram_budget_gb)
    if not math.isfinite(budget_gb):
        raise ValueError(f"llama_model_params.vram_budget_gb = {budget_gb}: a VRAM budget must be a finite number "
                         f"of GiB (> 0 loads the FFN split, <= 0 none)")
    budget_gb = budget_gb if budget_gb > 0 else None
    gf = load_gguf(path)
    hp = load_hparams(gf)
    try:
        vocab = Vocab.from_gguf_kv(gf.kv)
    except NotImplementedError as e:
        # ggviz: a tokenizer model not implemented yet (SentencePiece for gemma3) does not stop the model from
        # running on token ids; tokenize() then says why it cannot
        impl.GGML_LOG("warn", f"llama_model_load: vocabulary not loaded: {e}; the model runs on token ids only")
        vocab = None
    ctx_w, tensors = create_weight_context(gf)

    def need(name, shape):
        t = tensors.get(name)
        if t is None:
            raise GGUFError(gf.path, 0, name, "a tensor", "missing", source="llama.cpp")
        if tuple(int(x) for x in t.shape[:len(shape)]) != tuple(shape) or any(int(x) != 1 for x in t.shape[len(shape):]):
            raise GGUFError(gf.path, gf.tensor(name).file_offset, name, f"shape {list(shape)}",
                            f"{list(t.shape)}", source="llama.cpp")
        return t

    # the architecture's load_arch_tensors (models/<arch>.py); absent optional tensors are None
    tok_embd, output_norm, output, layer_dicts = arch_models.load_arch_tensors(hp.arch, need, tensors.get, hp)
    layers = [LlamaLayer(**d) for d in layer_dicts]
    m = LlamaModel(path=str(path), gguf=gf, arch=gf.arch, name=str(gf.kv.get("general.name", "")), hparams=hp,
                   vocab=vocab, ctx_w=ctx_w, tensors=tensors, tok_embd=tok_embd, output_norm=output_norm,
                   output=output, layers=layers, params=params)
    if getattr(gf, "sparse", False):
        # PowerInfer: llama_use_sparse_inference -> the predictor, ffn_down_t, the threshold, gpu_idx
        m.sparse = powerinfer.load_sparse(gf, tensors, hp)
        powerinfer.apply_threshold(m.sparse)
        if budget_gb is not None:
            split = str(path) + ".generated.gpuidx"
            if not os.path.exists(split):
                raise GGUFError(split, 0, "file", "the FFN split for --vram-budget (ggviz powerinfer build "
                                "--vram-budget GiB writes it)", "missing", source="PowerInfer")
            powerinfer.load_gpu_split(m, split, budget_bytes=int(budget_gb * (1 << 30)))
    cpu_dev = _assign_devices(m, params)
    if m.sparse is not None and m.sparse.gpu_dev is not None and m.sparse.gpu_dev not in m.devices:
        # the FFN split's device is one of the model's devices: contexts get a backend for it, so that the
        # scheduler can run the *_gpu nodes there (or the hybrid executor's thread 0 does)
        m.devices.append(m.sparse.gpu_dev)
    _duplicate_tied_output(m)
    _offload_weights(m)
    if m.sparse is not None and m.sparse.gpu_dev is not None and params.vram_offload_dense:
        # PowerInfer's --vram-budget order: attention, predictor, ffn_norm, output on the device before the neurons
        m.sparse.offloaded = powerinfer.offload_dense_part(m, int(budget_gb * (1 << 30)),
                                                           m.sparse.gpu_dev)
    if params.use_extra_bufts:
        # weights used by MUL_MAT go to the first extra buffer type that takes them (repacked at load)
        if repack.available():
            # (PowerInfer's sparse kernels read ffn_gate / ffn_up row by row in ggml's plain layout: not repacked)
            ffn = (lambda ly: (ly.ffn_gate, ly.ffn_up, ly.ffn_down)) if m.sparse is None else (lambda ly: ())
            mm = [w for il, ly in enumerate(layers) if m.dev_layer[il] is cpu_dev
                  for w in (ly.wq, ly.wk, ly.wv, ly.wo) + ffn(ly) if w.buffer == 0]    # (not those on a device)
            if m.dev_output is cpu_dev and m.output.buffer == 0:
                # a tied output was duplicated above (_duplicate_tied_output), so the copy can take the extra
                # buffer type while GET_ROWS keeps reading the mapped token_embd
                mm.append(m.output)
            buf = repack.place_weights(mm)
            if buf is not None:
                m.bufs.append(buf)
    _map_host_weights(m, cpu_dev)
    m.t_load_us = int((time.perf_counter() - t0) * 1e6)
    return m


def _layer_weights(ly: LlamaLayer) -> list:
    return [w for w in (ly.attn_norm, ly.wq, ly.wk, ly.wv, ly.wo, ly.ffn_norm, ly.ffn_gate, ly.ffn_up, ly.ffn_down,
                        ly.attn_q_norm, ly.attn_k_norm, ly.attn_post_norm, ly.ffn_post_norm)
            if w is not None]


def _assign_devices(m: LlamaModel, params: LlamaModelParams):
    """llama_model::load_tensors' device assignment: the input layer on the CPU, the last ``n_gpu_layers``
    repeating layers on the offload devices (split by free memory, like the default ``tensor_split``), the output
    layer too when ``n_gpu_layers > n_layer``. Returns the CPU device."""

    cpu_dev = backend_reg.backend_dev_by_type(B.GGML_BACKEND_DEVICE_TYPE_CPU)
    if params.devices is not None:
        devs = [backend_reg.backend_dev_by_name(d) if isinstance(d, str) else d for d in params.devices]
        if any(d is None for d in devs):
            raise ValueError(f"llama_model_load: unknown device in {params.devices!r}")
    else:
        devs = [backend_reg.backend_dev_get(i) for i in range(backend_reg.backend_dev_count())
                if B.backend_dev_type(backend_reg.backend_dev_get(i)) in (B.GGML_BACKEND_DEVICE_TYPE_GPU,
                                                                          B.GGML_BACKEND_DEVICE_TYPE_IGPU)]
    m.devices = devs
    n_layer = m.hparams.n_layer
    n_gpu_layers = params.n_gpu_layers if params.n_gpu_layers >= 0 else n_layer + 1
    i_gpu_start = max(n_layer - n_gpu_layers, 0)
    act_gpu_layers = 0 if not devs else min(n_gpu_layers, n_layer + 1)
    # default tensor_split: proportional to each device's free memory
    free = [max(B.backend_dev_memory(d)[0], 1) for d in devs]
    splits, acc = [], 0.0
    for f in free:
        acc += f
        splits.append(acc / sum(free))

    def layer_dev(il: int):
        if il < i_gpu_start or (il - i_gpu_start) >= act_gpu_layers:
            return cpu_dev
        return devs[min(bisect.bisect_right(splits, float(il - i_gpu_start) / act_gpu_layers), len(devs) - 1)]

    # there is very little benefit to offloading the input layer, so always keep it on the CPU
    m.dev_input = cpu_dev
    m.dev_layer = [layer_dev(il) for il in range(n_layer)]
    m.dev_output = layer_dev(n_layer)
    return cpu_dev


def _duplicate_tied_output(m: LlamaModel) -> None:
    """Without ``output.weight`` llama.cpp creates the output tensor as a duplicate of ``token_embd.weight``
    (TENSOR_DUPLICATED: another tensor of the output layer's context, same name, same file bytes), so the output
    can live in another buffer (CPU_REPACK, a device) than the embedding table, which GET_ROWS reads."""
    if m.output is not m.tok_embd:
        return
    cx = ggml.init(2 * ggml.tensor_overhead(), no_alloc=True)
    out = ggml.dup_tensor(cx, m.tok_embd)
    ggml.set_name(out, m.tok_embd.name)
    out.data = m.tok_embd.data
    m.ctx_extra.append(cx)
    m.output = out


def _offload_weights(m: LlamaModel) -> None:
    """Load the weights of offloaded layers into their device's buffer type (one WEIGHTS buffer per device; llama.cpp
    fails with "unable to allocate <buft> buffer" when it does not fit)."""
    per_dev: dict = {}
    for il, ly in enumerate(m.layers):
        if B.backend_dev_type(m.dev_layer[il]) != B.GGML_BACKEND_DEVICE_TYPE_CPU:
            per_dev.setdefault(id(m.dev_layer[il]), (m.dev_layer[il], []))[1].extend(_layer_weights(ly))
    if B.backend_dev_type(m.dev_output) != B.GGML_BACKEND_DEVICE_TYPE_CPU:
        per_dev.setdefault(id(m.dev_output), (m.dev_output, []))[1].extend([m.output_norm, m.output])
    for dev, ts in per_dev.values():
        buft = B.backend_dev_buffer_type(dev)
        align = B.backend_buft_get_alignment(buft)
        size = sum(ggml.GGML_PAD(B.backend_buft_get_alloc_size(buft, t), align) for t in ts)
        buf = B.backend_buft_alloc_buffer(buft, size)
        if buf is None:
            raise MemoryError(f"llama_model_load: unable to allocate {B.backend_buft_name(buft)} buffer for the "
                              f"weights of {len(ts)} tensors ({size} bytes): {impl.last_log_error()}")
        B.backend_buffer_set_usage(buf, B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        talloc = galloc.tallocr_new(buf)
        for t in ts:
            n = ggml.nbytes(t)
            arr, off, _ = memory.resolve(t.data, n)
            src = arr[off:off + n]
            t.data = 0
            galloc.tallocr_alloc(talloc, t)
            B.backend_tensor_set(t, src, 0, n)
        m.bufs.append(buf)


def _map_host_weights(m: LlamaModel, cpu_dev) -> None:
    """The weights still in the file mapping get a "CPU_Mapped" buffer over it (llama.cpp's mmap path:
    ggml_backend_dev_buffer_from_host_ptr + ggml_backend_tensor_alloc at each tensor's address), usage WEIGHTS."""
    rest = [t for t in list(m.tensors.values()) + [m.output] if t.buffer == 0 and t.data != 0]
    rest = list({t.addr: t for t in rest}.values())
    if not rest:
        return
    lo = min(t.data for t in rest)
    hi = max(t.data + ggml.nbytes(t) for t in rest)
    buf = B.backend_dev_buffer_from_host_ptr(cpu_dev, lo, hi - lo, max(ggml.nbytes(t) for t in rest))
    B.backend_buffer_set_usage(buf, B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    for t in rest:
        addr = t.data
        t.data = 0
        B.backend_tensor_alloc(buf, t, addr)
    m.bufs.append(buf)


def model_free(model: LlamaModel) -> None:
    ggml.free(model.ctx_w)
