"""ggml-impl.h: the helpers every other part of ggml uses, defined once.

Mirrors (ggml 0.20.2):

* ``GGML_ASSERT`` / ``GGML_ABORT``: C aborts the process; ggviz raises ``GGMLError`` naming what was wrong;
* ``GGML_PAD`` (round up to a power-of-two multiple);
* ``ggml_op_is_empty``: the ops that compute nothing (NONE and the four view ops), which the executor, the
  allocator, the scheduler and every backend's ``supports_op`` skip;
* logging (``GGML_LOG_ERROR`` / ``GGML_LOG_WARN`` / ``GGML_LOG_DEBUG`` through ggml's log callback): ggviz keeps the
  last messages (``log_messages``), sends them to Python's ``logging`` and, when somebody listens, to ``trace``;
* ggml.c's type-traits accessors (``ggml_type_name``, ``ggml_blck_size``, ``ggml_type_size``, ``ggml_row_size``,
  ``ggml_is_quantized``, ``ggml_type_sizef``) over ``consts.TYPE_TRAITS``. In C they sit in ggml.c beside the
  tensor functions; here they sit one level lower, because ggml-quants (``quants.py``) needs them and the tensor
  functions (``tensor.py``) need ggml-quants' ``to_float`` -- C has no import order, Python does.
"""
from __future__ import annotations

import collections
import logging

from .. import trace
from . import consts as C


class GGMLError(RuntimeError):
    """A ggml assertion that C would abort on: ggviz raises instead, naming what was wrong."""


def GGML_ASSERT(cond, msg: str = "") -> None:
    if not cond:
        raise GGMLError(msg or "GGML_ASSERT failed")


def GGML_PAD(x: int, n: int) -> int:
    """Round x up to a multiple of n (a power of two, as every caller in ggml passes)."""
    return (x + n - 1) & ~(n - 1)


# ggml_op_is_empty: NONE and the view ops only describe memory; no backend computes anything for them
EMPTY_OPS = frozenset((C.GGML_OP_NONE, C.GGML_OP_RESHAPE, C.GGML_OP_TRANSPOSE, C.GGML_OP_VIEW, C.GGML_OP_PERMUTE))


def op_is_empty(op: int) -> bool:
    return op in EMPTY_OPS


# ---------------------------------------------------------------- logging (GGML_LOG_*)

_log = logging.getLogger("ggviz.ggml")
log_messages: "collections.deque[tuple[str, str]]" = collections.deque(maxlen=64)   # (level, message)


def GGML_LOG(level: str, msg: str) -> None:
    """GGML_LOG_ERROR / GGML_LOG_WARN / GGML_LOG_DEBUG: kept in ``log_messages`` and sent to ``logging``."""
    log_messages.append((level, msg))
    if trace.active:
        trace.emit("ggml.log", level=level, message=msg)
    {"error": _log.error, "warn": _log.warning, "info": _log.info}.get(level, _log.debug)(msg)


def last_log_error() -> str:
    """The last GGML_LOG_ERROR message ('' if none): what a failed allocation printed."""
    for level, msg in reversed(log_messages):
        if level == "error":
            return msg
    return ""


# ---------------------------------------------------------------- type traits (ggml.c: type_traits[])

def _traits(type_):
    # (a Python int -- what the struct's words read as -- looked up as it is: no int() call, ~1,000 a graph build)
    tr = C.TYPE_TRAITS.get(type_ if type(type_) is int else int(type_))
    if tr is None or tr[2] == 0:
        raise ValueError(f"ggml type {type_} is not a supported ggml_type")
    return tr


def type_name(type_) -> str:
    tr = C.TYPE_TRAITS.get(int(type_))
    return tr[0] if tr else "NONE"


def blck_size(type_) -> int:
    return _traits(type_)[1]


def type_size(type_) -> int:
    return _traits(type_)[2]


def is_quantized(type_) -> bool:
    return _traits(type_)[3]


def type_sizef(type_) -> float:
    return type_size(type_) / blck_size(type_)


def row_size(type_, ne: int) -> int:
    """ggml_row_size: bytes of a row of ne elements (ne must be a multiple of the block size)."""
    bs = blck_size(type_)
    if ne % bs != 0:
        raise ValueError(f"row of {ne} elements is not a multiple of {type_name(type_)}'s block size {bs}")
    return type_size(type_) * ne // bs
