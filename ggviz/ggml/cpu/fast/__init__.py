"""ggviz's compiled fast path: a graph turned into a program that every thread walks inside one Numba ``nogil`` call.

Not a ggml source file. ggml's CPU executor (``ggml_graph_compute_thread``) is C: it walks the nodes and calls a C
kernel per node with no interpreter in between. ggviz's faithful executor (``cpu/ggml_cpu.py`` with the NumPy
kernels of ``cpu/ops.py``) returns to Python for every node of every thread, which is right for stepping through a
compute and far too slow for a 600-node decode. This package is the same arithmetic, compiled:

* ``program.py``: the layout of the program (one row of named int64/float64 columns per computed node), the sync
  array and the trace log -- NumPy only;
* ``compiler.py``: ``FastGraph`` (a compiled graph: build once, cache while the graph is unchanged, walk, trace);
* ``kernels.py``: the compiled kernels and the compiled ``ggml_graph_compute_thread``;
* ``sgemm.py``: llamafile's tinyBLAS float kernel (``llamafile_sgemm`` for F32 / F16), called by kernels.py's
  MUL_MAT where ggml_compute_forward_mul_mat calls it;
* ``sync.py``: ggml's barrier and chunk counter with real atomics, the error slot, the trace records;
* ``intrinsics.py``: LLVM intrinsics (raw memory, atomics, FMA), SIMD micro-kernels, bit-exact scalar helpers.

It hooks into the mirror at one place, the CPU executor (``ggml_cpu.graph_plan`` asks ``compiler.plan_graph`` for a
program; ``graph_compute`` runs it), and the CPU_REPACK extra buffer type (``cpu/repack.py``) uses its MUL_MAT
kernels. Importing this package raises ImportError when Numba is missing or ``GGVIZ_NO_NUMBA=1``: then nothing here
is loaded, CPU_REPACK is not offered (as when ggml is built without GGML_USE_CPU_REPACK) and every graph runs the
faithful kernels.
"""
from __future__ import annotations

import hashlib
import os
import pathlib

if os.environ.get("GGVIZ_NO_NUMBA", "") not in ("", "0"):
    raise ImportError("the compiled fast path is disabled by GGVIZ_NO_NUMBA")

import numba  # noqa: E402,F401 - an ImportError here means: no compiled kernels


# Numba's on-disk cache checks only the timestamp of the file that defines a cached function, but the compiled
# ``graph_compute_thread`` inlines kernels of every module here (and libm.py's / vec.py's functions and constants):
# after an edit of kquants.py alone it would silently load the old machine code. So the cache is keyed on the
# sources of all of them together: when their hash changes, every cached kernel of this package is dropped.
_CACHE_SOURCES = ("libm.py", "vec.py")


def _drop_stale_kernel_cache() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return                                   # a cache elsewhere is the user's to manage
    here = pathlib.Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(here.glob("*.py")) + [here.parent / n for n in _CACHE_SOURCES]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    digest = h.hexdigest()
    cache = here / "__pycache__"
    stamp = cache / "ggviz-kernel-sources.sha256"
    try:
        old = stamp.read_text() if stamp.is_file() else None
        if old == digest:
            return
        for f in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:
        pass                                     # a read-only install: Numba then compiles in memory


_drop_stale_kernel_cache()
