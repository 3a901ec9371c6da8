"""ggml-backend-reg.cpp: the backend registry -- which backends ggviz is "built" with, and their devices.

Mirrors (ggml 0.20.2): ``struct ggml_backend_registry`` (registered regs and devices, in registration order),
``ggml_backend_register``, ``ggml_backend_device_register``, ``ggml_backend_load`` / ``ggml_backend_unload``,
``ggml_backend_reg_count/get/by_name``, ``ggml_backend_dev_count/get/by_name/by_type``,
``ggml_backend_init_by_name/by_type`` and ``ggml_backend_init_best``.

ggviz is "built" with BLAS (``ggviz.ggml.blas``; ``GGVIZ_NO_BLAS=1`` leaves it out, like a build without GGML_BLAS)
and the CPU (``ggviz.ggml.cpu.cpu_backend``), registered in ggml's order; the simulated accelerator
(``ggviz.ggml.accel``) is loaded at run time (``backend_load("accel")``), like a backend library.
"""
from __future__ import annotations

import os

from . import accel, blas
from .backend import (
    GGML_BACKEND_DEVICE_TYPE_CPU,
    GGML_BACKEND_DEVICE_TYPE_GPU,
    GGML_BACKEND_DEVICE_TYPE_IGPU,
    backend_dev_description,
    backend_dev_init,
    backend_dev_name,
    backend_dev_type,
    backend_reg_dev_count,
    backend_reg_dev_get,
    backend_reg_name,
)
from .cpu import cpu_backend
from .impl import GGML_ASSERT, GGML_LOG


class _BackendRegistry:
    """``struct ggml_backend_registry``: registered backends (regs) and devices, in registration order.

    ggml registers its compiled-in backends in a fixed order (CUDA, Metal, ..., BLAS, ..., CPU); ggviz is "built"
    with BLAS (unless ``GGVIZ_NO_BLAS=1``, like a build without GGML_BLAS) and the CPU. The simulated accelerator
    (``ggviz.ggml.accel``) is not compiled in: ``backend_register(accel.backend_accel_reg())`` or
    ``backend_load("accel")`` adds it, like loading a backend library at run time."""

    def __init__(self):
        self.backends: list = []     # registered regs
        self.devices: list = []
        if os.environ.get("GGVIZ_NO_BLAS", "") in ("", "0"):
            self.register_backend(blas.backend_blas_reg())
        self.register_backend(cpu_backend.backend_cpu_reg())

    def register_backend(self, reg) -> None:
        if reg is None:
            return
        if any(r is reg for r in self.backends):
            return
        GGML_LOG("debug", f"ggml_backend_register: registered backend {backend_reg_name(reg)} "
                          f"({backend_reg_dev_count(reg)} devices)")
        self.backends.append(reg)
        for i in range(backend_reg_dev_count(reg)):
            self.register_device(backend_reg_dev_get(reg, i))

    def register_device(self, device) -> None:
        if any(d is device for d in self.devices):
            return
        GGML_LOG("debug", f"ggml_backend_register_device: registered device {backend_dev_name(device)} "
                          f"({backend_dev_description(device)})")
        self.devices.append(device)

    def unload_backend(self, reg) -> None:
        if not any(r is reg for r in self.backends):
            GGML_LOG("error", "ggml_backend_unload: backend not found")
            return
        # remove devices
        self.devices = [d for d in self.devices if d.reg is not reg]
        # remove backend
        self.backends = [r for r in self.backends if r is not reg]


_registry: _BackendRegistry | None = None


def _get_reg() -> _BackendRegistry:
    global _registry
    if _registry is None:
        _registry = _BackendRegistry()
    return _registry


def backend_register(reg) -> None:
    _get_reg().register_backend(reg)


def backend_device_register(device) -> None:
    _get_reg().register_device(device)


def backend_load(name: str):
    """ggml_backend_load: ggviz has no shared libraries; ``name`` picks one of its optional backends ("accel")."""
    if name.lower() in ("accel", "ggml-accel", "libggml-accel.so"):
        reg = accel.backend_accel_reg()
        _get_reg().register_backend(reg)
        return reg
    GGML_LOG("error", f"ggml_backend_load: no ggviz backend named {name!r}")
    return None


def backend_unload(reg) -> None:
    _get_reg().unload_backend(reg)


def _striequals(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def backend_reg_count() -> int:
    return len(_get_reg().backends)


def backend_reg_get(index: int):
    GGML_ASSERT(0 <= index < backend_reg_count(), "index < ggml_backend_reg_count()")
    return _get_reg().backends[index]


def backend_reg_by_name(name: str):
    for i in range(backend_reg_count()):
        reg = backend_reg_get(i)
        if _striequals(backend_reg_name(reg), name):
            return reg
    return None


def backend_dev_count() -> int:
    return len(_get_reg().devices)


def backend_dev_get(index: int):
    GGML_ASSERT(0 <= index < backend_dev_count(), "index < ggml_backend_dev_count()")
    return _get_reg().devices[index]


def backend_dev_by_name(name: str):
    for i in range(backend_dev_count()):
        dev = backend_dev_get(i)
        if _striequals(backend_dev_name(dev), name):
            return dev
    return None


def backend_dev_by_type(type_: int):
    for i in range(backend_dev_count()):
        dev = backend_dev_get(i)
        if backend_dev_type(dev) == type_:
            return dev
    return None


def backend_init_by_name(name: str, params: str | None = None):
    dev = backend_dev_by_name(name)
    if dev is None:
        return None
    return backend_dev_init(dev, params)


def backend_init_by_type(type_: int, params: str | None = None):
    dev = backend_dev_by_type(type_)
    if dev is None:
        return None
    return backend_dev_init(dev, params)


def backend_init_best():
    dev = backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU)
    dev = dev if dev is not None else backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_IGPU)
    dev = dev if dev is not None else backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    if dev is None:
        return None
    return backend_dev_init(dev, None)
