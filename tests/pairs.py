"""Set-up shared by the differential tests of ggml-alloc, the backends and the scheduler (tests/test_alloc.py,
tests/test_backend.py, tests/test_sched.py):

* ``real_ggml()``: the real ggml 0.20.2 (tests/oracle/ggml_lib.py ``RealGGML``), loaded once per process, on first
  use (a module that imports this one still collects where the oracle library is missing);
* ``nmse``: the normalised mean squared error of two arrays (any NaN or infinity makes it NaN or inf: a failure);
* ``ctx_tensors`` / ``buffer_place``: a context's tensors and where a tensor's data lies in its backend buffer, in
  either engine;
* ``Pair``: one graph built in both engines (no_alloc contexts); optionally the weights and the KV cache placed in
  a WEIGHTS buffer first with a tallocr, as llama.cpp places its model and cache buffers, with both engines
  checked to put every such tensor at the same offset. A test module subclasses it with its own fields (its
  allocators, its schedulers) and closes them before ``Pair.close``;
* ``pairs_fixture(cls)``: a module's ``pairs`` fixture: ``pairs(build, external=False)`` makes a ``cls``, and every
  pair made is closed when the test ends.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest


from tests import graphs
from tests.oracle.ggml_lib import RealGGML

from ggviz import ggml as gg
from ggviz.ggml import alloc as A
from ggviz.ggml import backend as B

_REAL = None


def real_ggml() -> RealGGML:
    """The real ggml, one instance for the whole process (made on the first call)."""
    global _REAL
    if _REAL is None:
        _REAL = RealGGML()
    return _REAL


def nmse(a, b) -> float:
    """sum((a - b)^2) / sum(b^2) over the flattened arrays; a NaN or an infinity in either gives NaN or inf, which no
    bound accepts."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    return float(np.sum((a - b) ** 2) / max(np.sum(b ** 2), 1e-300))


# ====================================================================================================
# tensors of a context, and where a tensor's data lies
# ====================================================================================================

def ctx_tensors(G, ctx) -> list:
    """Every tensor of ``ctx`` in creation order (ggml_get_first_tensor / ggml_get_next_tensor in the real ggml)."""
    if not graphs.is_oracle(G):
        return list(ctx.tensors())
    out, t = [], G.get_first_tensor(ctx)
    while t:
        out.append(t)
        t = G.get_next_tensor(ctx, t)
    return out


def buffer_place(G, t) -> tuple:
    """(name, buffer, data, base of that buffer) of ``t``; buffer is the real buffer pointer or ggviz's address
    (0 / None when the tensor has none), base is 0 without a buffer."""
    if graphs.is_oracle(G):
        s = G.tensor_info(t)
        name, buf, data = s["name"], s["buffer"], s["data"]
        base = G.backend_buffer_get_base(buf) if buf else 0
    else:
        name, buf, data = t.name, t.buffer, t.data
        base = B.backend_buffer_get_base(B.buffer_at(buf)) if buf else 0
    return name, buf, data, base


# ====================================================================================================
# ggml_tallocr in the real ggml (returned by value: bound by hand)
# ====================================================================================================

class _Tallocr(ctypes.Structure):         # struct ggml_tallocr
    _fields_ = [("buffer", ctypes.c_void_p), ("base", ctypes.c_void_p), ("alignment", ctypes.c_size_t),
                ("offset", ctypes.c_size_t)]


def real_tallocr_new(buffer) -> _Tallocr:
    f = real_ggml().symbol("ggml_tallocr_new")
    f.argtypes = [ctypes.c_void_p]
    f.restype = _Tallocr
    return f(buffer)


# ====================================================================================================
# one graph in both engines
# ====================================================================================================

def is_weight(name: str) -> bool:
    """The tensors llama.cpp keeps in its model and KV cache buffers (what ``Pair(..., external=True)`` places)."""
    return name.endswith(".weight") or name.startswith("cache_")


class Pair:
    """One graph built in both engines (no_alloc contexts of ``mem`` bytes); ``r`` / ``v`` are the builder's dicts
    (gf, out, inputs, ...) in the real ggml / ggviz. With ``external`` the weights and the KV cache are placed in a
    WEIGHTS buffer first with a tallocr (llama.cpp's model / cache buffers): external to any graph allocator.
    Buffers appended to ``rbufs`` / ``vbufs`` are freed by ``close``."""

    mem = 8 << 20

    def __init__(self, build, external=False, mem=None):
        g = real_ggml()
        mem = self.mem if mem is None else mem
        self.rctx = g.init(mem, None, True)
        self.vctx = gg.init(mem, None, True)
        self.r = build(g, self.rctx)
        self.v = build(gg, self.vctx)
        self.rbufs, self.vbufs = [], []
        if external:
            self._place_weights()

    def _place_weights(self):
        """Weights and KV cache: one buffer each engine, tensors placed in context order with a tallocr; both engines
        place the same tensors, each at the same offset, and fill the buffer exactly."""
        g = real_ggml()
        rts = [t for t in ctx_tensors(g, self.rctx)
               if is_weight(g.tensor_info(t)["name"]) and not g.tensor_info(t)["view_src"]]
        vts = [t for t in ctx_tensors(gg, self.vctx) if is_weight(t.name) and t.view_src is None]
        assert [g.tensor_info(t)["name"] for t in rts] == [t.name for t in vts]
        size = sum(gg.GGML_PAD(gg.nbytes(t), 32) for t in vts)
        rbuf = g.backend_buft_alloc_buffer(g.backend_cpu_buffer_type(), size)
        vbuf = B.backend_buft_alloc_buffer(B.backend_cpu_buffer_type(), size)
        g.backend_buffer_set_usage(rbuf, 1)
        B.backend_buffer_set_usage(vbuf, B.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        self.rbufs.append(rbuf)
        self.vbufs.append(vbuf)
        rta = real_tallocr_new(rbuf)
        vta = A.tallocr_new(vbuf)
        for rt, vt in zip(rts, vts):
            assert g.tallocr_alloc(ctypes.addressof(rta), rt) == 0
            assert A.tallocr_alloc(vta, vt) == 0
            assert g.tensor_info(rt)["data"] - g.backend_buffer_get_base(rbuf) == vt.data - vbuf.context.ctypes.data
        assert rta.offset == vta.offset == size

    def close(self):
        """Frees the buffers and both contexts (a subclass frees what it made from them first)."""
        g = real_ggml()
        for b in self.rbufs:
            g.backend_buffer_free(b)
        for b in self.vbufs:
            B.backend_buffer_free(b)
        g.free(self.rctx)
        gg.free(self.vctx)


def pairs_fixture(cls):
    """A ``pairs`` fixture making ``cls`` pairs (``pairs = pairs_fixture(MyPair)`` at a test module's top level):
    the test calls ``pairs(build, external=False)``; every pair it made is closed after it."""

    @pytest.fixture
    def pairs():
        made = []

        def make(build, external=False):
            p = cls(build, external)
            made.append(p)
            return p

        yield make
        for p in made:
            p.close()

    return pairs
