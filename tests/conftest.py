"""Fixtures shared by the test modules (a module that defines its own fixture of the same name uses that one)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ggviz import llama

MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def model():
    """The default model (SmolLM2-135M-Instruct Q4_1), loaded with llama.cpp's default model parameters."""
    path = MODEL
    if not path.exists():
        from ggviz.fetch import fetch_default_model
        path = fetch_default_model(quiet=True)
    return llama.model_load_from_file(str(path), llama.model_default_params())
