"""llama_model: hyper-parameters and weights of a llama-architecture GGUF.

Mirrors llama.cpp's ``llama_model_load_from_file`` path for LLM_ARCH_LLAMA: ``llama_model_loader`` (GGUF metadata,
tensor infos), ``llama_model::load_hparams`` (the ``llama.*`` keys), ``llama_model_llama::load_arch_tensors``
(``token_embd``, ``output_norm``, ``output`` falling back to the tied ``token_embd``, per layer ``attn_norm``,
``attn_q/k/v``, ``attn_output``, ``ffn_norm``, ``ffn_gate/up/down``) and ``llama_model_default_params``.

Weights stay in the file: they are ggml tensors of a ``no_alloc`` context whose ``data`` points into the read-only
memory map (llama.cpp's mmap path, ``use_mmap = true``).
"""
from __future__ import annotations

import bisect
import os
import time
from dataclasses import dataclass, field

from .. import ggml
from ..ggml import alloc as galloc
from ..ggml import backend as B
from ..ggml import backend_reg, impl, memory
from ..ggml.cpu import repack
from ..gguf_file import GGUFError, GGUFFile, create_weight_context, load_gguf, require_arch
from . import powerinfer
from .vocab import Vocab

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
    use_extra_bufts: bool = True     # weights of MUL_MATs go to the CPU's extra buffer types (CPU_REPACK) if any
    devices: list | None = None      # devices to offload to (None: every GPU-type device in the registry)
    vram_budget_gb: float = -1.0     # PowerInfer (PWRI models): > 0 loads <model>.generated.gpuidx, the FFN split


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
    if getattr(gf, "sparse", False):
        # PowerInfer: llama_use_sparse_inference -> the predictor, ffn_down_t, the threshold, gpu_idx
        m.sparse = powerinfer.load_sparse(gf, tensors, hp)
        powerinfer.apply_threshold(m.sparse)
        if params.vram_budget_gb > 0:
            split = str(path) + ".generated.gpuidx"
            if not os.path.exists(split):
                raise GGUFError(split, 0, "file", "the FFN split for --vram-budget (ggviz powerinfer build "
                                "--vram-budget GiB writes it)", "missing", source="PowerInfer")
            powerinfer.load_gpu_split(m, split)
    cpu_dev = _assign_devices(m, params)
    _duplicate_tied_output(m)
    _offload_weights(m)
    if params.use_extra_bufts:
        # weights used by MUL_MAT go to the first extra buffer type that takes them (repacked at load)
        if repack.available():
            # (PowerInfer's sparse kernels read ffn_gate / ffn_up row by row in ggml's plain layout: not repacked)
            ffn = (lambda ly: (ly.ffn_gate, ly.ffn_up, ly.ffn_down)) if m.sparse is None else (lambda ly: ())
            mm = [w for il, ly in enumerate(layers) if m.dev_layer[il] is cpu_dev
                  for w in (ly.wq, ly.wk, ly.wv, ly.wo) + ffn(ly)]
            if m.dev_output is cpu_dev:
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
    return [w for w in (ly.attn_norm, ly.wq, ly.wk, ly.wv, ly.wo, ly.ffn_norm, ly.ffn_gate, ly.ffn_up, ly.ffn_down)
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
