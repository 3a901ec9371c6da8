"""ggml-cpu's ``llamafile/`` directory: tinyBLAS (``sgemm.cpp``), the matrix multiply ggml's MUL_MAT hands a prefill
to when ggml is built with ``GGML_USE_LLAMAFILE`` (the default CPU build of llama.cpp)."""
