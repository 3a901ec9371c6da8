"""Differential-testing oracle: ctypes bindings to the real ggml (libggml-python)."""
from .ggml_lib import OracleUnavailable, RealGGML, available, run_in_subprocess, unavailable_reason

__all__ = ["RealGGML", "available", "unavailable_reason", "OracleUnavailable", "run_in_subprocess"]
