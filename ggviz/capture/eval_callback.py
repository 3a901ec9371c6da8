"""The one eval callback: llama.cpp's ``cb_eval`` (``llama_context_params.cb_eval``), as ``common/debug.cpp``
installs it for ``llama-eval-callback``: asked about each node first (``ask=True``: "do you want this tensor?" -- a
yes makes the scheduler end a compute range there, so the value is read before later nodes reuse its memory), then
called again with the computed tensor, whose data it copies.

``EvalCallback(want, copy)`` is that routine, parameterised by which nodes to copy (``want(tensor) -> bool``) and how
to copy a value (``copy(tensor) -> ndarray``; ``copy_value`` by default). What it copies are ``NodeValue`` records:
plain data (names, shapes, a numpy array), numbered afterwards against the graph (``number``). Every recording of
values in ggviz -- the report, the explorer, the demo, the stepper, the vec_dot lanes, attention, PowerInfer's sparse
runs and its offline pipeline -- goes through it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ..ggml import consts as C
from ..ggml.tensor import get_data, get_data_f32, op_desc, type_name
from .nodes import node_numbers


@dataclass
class NodeValue:
    """One tensor the eval callback copied: what it is, and its data (numpy order: ne reversed)."""
    name: str
    op: str                                       # ggml_op_desc: MUL_MAT, GLU ... (the unary/glu op for those)
    type: str                                     # ggml_type_name
    shape: list                                   # ne0..ne3
    src: list                                     # the names of its sources
    data: np.ndarray
    addr: int = 0                                 # the tensor's address (its identity during the run)
    node_n: int | None = None                     # its node number in the graph (``EvalCallback.number``)

    def as_dict(self) -> dict:
        """The dict form the report's sections read (``{name, op, type, shape, src, data, node_n}``)."""
        return dict(name=self.name, op=self.op, type=self.type, shape=list(self.shape), src=list(self.src),
                    data=self.data, node_n=self.node_n)


def copy_value(t) -> np.ndarray:
    """The tensor's values: float types as float32, integer types as they are, quantized rows dequantized to
    float32 (ggml_get_f32_1d's reading, ``get_data_f32``), in numpy order ([ne3, ne2, ne1, ne0])."""
    a = get_data(t)
    if a.dtype == np.uint8 and t.type not in (C.GGML_TYPE_I8,):
        return get_data_f32(t).reshape(a.shape[:3] + (-1,))
    return np.array(a, dtype=np.float32 if a.dtype.kind == "f" else a.dtype)


def copy_f32(t) -> np.ndarray:
    """The tensor's values as float32 in numpy order, whatever its type."""
    return np.array(get_data_f32(t), dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])


def want_all(t) -> bool:
    return True


@dataclass
class EvalCallback:
    """``cb_eval(tensor, ask)``: answers ``want(tensor)`` when asked, copies the tensor (``copy``; None: no copy)
    when called with its data. ``skip_unreadable``: a type ``copy`` cannot read (ValueError, TypeError,
    NotImplementedError) is left out instead of failing the decode. ``sink(tensor, data)``: a consumer that takes
    each value as it comes instead of keeping a ``NodeValue`` (a long recording that reduces as it goes, or a view
    that keeps its own per-node record); its False stops the compute, as the callback's False does in llama.cpp."""
    want: object = want_all
    copy: object = copy_value
    skip_unreadable: bool = False
    sink: object = None
    values: list = field(default_factory=list)

    def __call__(self, t, ask: bool) -> bool:
        if ask:
            return bool(self.want(t))
        try:
            data = self.copy(t) if self.copy is not None else None
        except (ValueError, TypeError, NotImplementedError):
            if not self.skip_unreadable:
                raise
            return True
        if self.sink is not None:
            return self.sink(t, data) is not False
        self.values.append(NodeValue(name=t.name, op=op_desc(t), type=type_name(t.type),
                                     shape=[int(x) for x in t.shape], src=[s.name for s in t.src if s is not None],
                                     data=data, addr=t.addr))
        return True

    def number(self, gf) -> list:
        """Give each copied value its node number in ``gf`` (None for a tensor that is not one of its nodes)."""
        index = node_numbers(gf)
        for v in self.values:
            v.node_n = index.get(v.addr)
        return self.values

    def by_name(self) -> dict:
        """``{name: data}`` of the copied values (the last copy wins)."""
        return {v.name: v.data for v in self.values}


@contextlib.contextmanager
def installed(ctx, cb):
    """``cb`` as the context's eval callback inside the block (``ctx.cparams.cb_eval``), the previous one after."""
    prev = ctx.cparams.cb_eval
    ctx.cparams.cb_eval = cb
    try:
        yield cb
    finally:
        ctx.cparams.cb_eval = prev


def copy_raw(t) -> np.ndarray:
    """The tensor's bytes as ``get_data`` types them (quantized rows stay uint8), copied."""
    return np.array(get_data(t))
