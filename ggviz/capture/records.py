"""Records to disk and back: ``save(record, path)`` writes one ``.npz`` file (numpy's zip of arrays, read without
pickle) holding every array of the record and, as JSON, its structure; ``load(path)`` rebuilds the same record, so a
view drawn from the loaded record draws the same picture (tests/test_capture.py checks it).

A record is plain data: a dataclass of ``ggviz.capture`` (``AttentionRecord``, ``DecodeSnapshot``, ``SparseRun``,
``NodeValue`` ...) whose fields are numpy arrays, numbers, strings, None, lists, tuples, dicts (str or int keys) and
other such records. Anything else -- an engine object, an object array -- is refused with the path to it, so a
recording never holds a live ggml context or a pickle.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import pathlib

import numpy as np

_PKG = __name__.rsplit(".", 1)[0]             # ggviz.capture: the only classes a file may name
_FORMAT = "ggviz-record-1"


def _encode(x, arrays: list, where: str):
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, np.generic):
        return x
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)
        if a.dtype.kind == "O":
            raise TypeError(f"{where}: an object array cannot be saved")
        arrays.append(a)
        return {"__array__": len(arrays) - 1, "scalar": isinstance(x, np.generic)}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        cls = type(x)
        if not cls.__module__.startswith(_PKG + "."):
            raise TypeError(f"{where}: {cls.__module__}.{cls.__qualname__} is not a ggviz.capture record")
        return {"__record__": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: _encode(getattr(x, f.name), arrays, f"{where}.{f.name}")
                           for f in dataclasses.fields(x)}}
    if isinstance(x, (list, tuple)):
        items = [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(x)]
        return {"__tuple__": items} if isinstance(x, tuple) else items
    if isinstance(x, dict):
        for k in x:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"{where}: a dict key must be a str or an int, not {type(k).__name__}")
        return {"__dict__": [[k, _encode(v, arrays, f"{where}[{k!r}]")] for k, v in x.items()]}
    raise TypeError(f"{where}: {type(x).__module__}.{type(x).__qualname__} is not plain data (arrays, numbers, "
                    f"strings, lists, dicts, records)")


def _decode(x, arrays):
    if isinstance(x, list):
        return [_decode(v, arrays) for v in x]
    if not isinstance(x, dict):
        return x
    if "__array__" in x:
        a = arrays[f"a{x['__array__']}"]
        return a[()] if x["scalar"] else a
    if "__tuple__" in x:
        return tuple(_decode(v, arrays) for v in x["__tuple__"])
    if "__dict__" in x:
        return {k: _decode(v, arrays) for k, v in x["__dict__"]}
    if "__record__" in x:
        mod, _, qual = x["__record__"].partition(":")
        if not mod.startswith(_PKG + "."):
            raise ValueError(f"the file names {mod}.{qual}, not a ggviz.capture record")
        cls = importlib.import_module(mod)
        for part in qual.split("."):
            cls = getattr(cls, part)
        fields = {k: _decode(v, arrays) for k, v in x["fields"].items()}
        obj = cls.__new__(cls)                 # the fields as saved, without __init__/__post_init__ recomputing them
        for k, v in fields.items():
            setattr(obj, k, v)
        return obj
    raise ValueError(f"not a record file: unknown entry {sorted(x)}")


def save(record, path) -> pathlib.Path:
    """Write ``record`` to ``path`` (``.npz``). Raises TypeError naming the first field that is not plain data;
    nothing is written then."""
    arrays: list = []
    doc = {"format": _FORMAT, "record": _encode(record, arrays, "record")}
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, __record__=np.array(json.dumps(doc)), **{f"a{i}": a for i, a in enumerate(arrays)})
    return path


def load(path):
    """The record ``save`` wrote to ``path``."""
    with np.load(path, allow_pickle=False) as z:
        if "__record__" not in z.files:
            raise ValueError(f"{str(path)!r} is not a ggviz record (no __record__ entry)")
        doc = json.loads(str(z["__record__"][()]))
        if doc.get("format") != _FORMAT:
            raise ValueError(f"{str(path)!r}: unknown record format {doc.get('format')!r} (expected {_FORMAT})")
        arrays = {k: z[k] for k in z.files if k != "__record__"}
    return _decode(doc["record"], arrays)
