"""PowerInfer's offline side, for a model ggviz runs: activation statistics, the predictor, the PWRI GGUF, the solver.

No C file: PowerInfer (SJTU-IPADS/PowerInfer) ships converted models and ``powerinfer-py`` (``solver.py``, the
neuron placement ILP) but never released its predictor training. ``pipeline.py`` records FFN activations with
llama's eval callback, trains a Deja Vu-style predictor in NumPy and writes the PowerInfer GGUF; ``solver.py``
mirrors ``powerinfer-py/solver.py``. The runtime parts live in the engine: ``ggviz.ggml.cpu.powerinfer`` (kernels)
and ``ggviz.llama.powerinfer`` (the sparse model and graph). ``ggviz powerinfer build --out DIR`` runs it all.

This package imports nothing at import time (its modules import the engine; the engine never imports them).
"""
