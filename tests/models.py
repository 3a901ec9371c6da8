"""The two test models (SmolLM2-135M-Instruct Q4_1, Gemma-3 270M Q4_K_M), each loaded once per process with
llama.cpp's default model parameters, for the test modules that build graphs of both: ``load_model("smollm2")``,
``load_model("gemma3")``; a missing model skips the calling test. ``GGVIZ_MODELS`` names another models folder."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ggviz import llama

MODELS = Path(os.environ.get("GGVIZ_MODELS") or Path(__file__).resolve().parents[1] / "data" / "models")
FILES = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
_loaded: dict = {}


def load_model(which: str):
    if which not in _loaded:
        path = MODELS / FILES["gemma3" if which == "gemma3" else "smollm2"]
        if not path.exists():
            pytest.skip(f"no model {path.name}")
        _loaded[which] = llama.model_load_from_file(str(path), llama.model_default_params())
    return _loaded[which]
