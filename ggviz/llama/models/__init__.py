"""The architectures, one module each, as llama.cpp's ``src/models/`` (models.h): per architecture its
``load_arch_hparams``, ``load_arch_tensors`` and graph (``llm_build_<arch>``), and llama.cpp's per-architecture
tables (``llama_model_rope_type``, the memory type ``llama_model::create_memory`` picks).
"""
from __future__ import annotations

from . import gemma3, llama

_MODULES = {"llama": llama, "gemma3": gemma3}
ARCHS = tuple(_MODULES)

# llama_model_rope_type: LLM_ARCH_LLAMA -> LLAMA_ROPE_TYPE_NORM, LLM_ARCH_GEMMA3 -> LLAMA_ROPE_TYPE_NEOX
ROPE_TYPE = {name: m.ROPE_TYPE for name, m in _MODULES.items()}


def _module(arch: str):
    m = _MODULES.get(arch)
    if m is None:
        raise ValueError(f"unknown model architecture: '{arch}' (ggviz runs {', '.join(ARCHS)})")
    return m


def load_arch_hparams(arch: str, kv: dict, hp) -> None:
    """llama_model_<arch>::load_arch_hparams: the keys only this architecture reads, into ``hp``."""
    _module(arch).load_arch_hparams(kv, hp)


def load_arch_tensors(arch: str, need, opt, hp):
    """llama_model_<arch>::load_arch_tensors: ``need(name, shape)`` a required tensor, ``opt(name)`` an optional
    one. Returns (tok_embd, output_norm, output, [per-layer dict of LlamaLayer fields])."""
    return _module(arch).load_arch_tensors(need, opt, hp)


def graph_builder(arch: str):
    """llama_model::build_graph's switch: the graph class of the architecture (an ``LlmGraphContext``)."""
    return _module(arch).GRAPH


def uses_iswa(hp) -> bool:
    """llama_model::create_memory: an iSWA KV cache when the model has sliding-window layers."""
    return hp.swa_type != 0 and hp.is_swa_any()
