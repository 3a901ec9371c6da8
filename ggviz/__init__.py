"""ggviz: an educational visualizer of how ggml and llama.cpp run a language model.

`ggviz.ggml` is a faithful Python/NumPy re-implementation of ggml whose names mirror
ggml's C API (`ggml_new_tensor_2d(ctx, ...)` is `ggml.new_tensor_2d(ctx, ...)`).

Importing `ggviz` itself is kept light: subpackages are imported on demand.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # lazy re-exports, so that `import ggviz` stays light
    if name in ("GGUFError", "load_gguf"):
        from .ggml import gguf
        return getattr(gguf, name)
    if name in ("generate", "Generation"):
        from . import run as _g
        return getattr(_g, name)
    raise AttributeError(f"module 'ggviz' has no attribute {name!r}")
