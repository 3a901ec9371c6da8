"""Host memory as ggml sees it: raw addresses into byte buffers.

ggml stores pointers (``tensor->data``, ``tensor->src[i]``, ``obj->next``) inside its structs. ggviz keeps them real:
every byte buffer ggviz allocates (a context's arena, a backend buffer) is a NumPy uint8 array, and the address
written into a struct is that array's actual address. This module maps an address back to (buffer, offset), which is
what ``ggml_get_data`` needs to hand out a zero-copy NumPy view, and what a hexdump needs to decode a pointer.

Mirrors nothing in ggml by name (C has a flat address space for free); ``aligned_malloc`` mirrors
``ggml_aligned_malloc`` (64-byte alignment, as ggml uses for its own allocations).
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import gc
import mmap
import sys
import threading

import numpy as np

TENSOR_ALIGNMENT = 64   # ggml_aligned_malloc's alignment (ggml-impl.h / ggml.c)

_lock = threading.Lock()
_bases: list[int] = []       # sorted start addresses
_regions: list[tuple] = []   # (base, size, array, label) in the same order


def aligned_malloc(size: int, label: str = "buffer", alignment: int = TENSOR_ALIGNMENT) -> np.ndarray:
    """Allocate ``size`` zeroed bytes whose first byte sits on an ``alignment`` boundary, and register them."""
    raw = np.zeros(size + alignment, dtype=np.uint8)
    shift = (-raw.ctypes.data) % alignment
    arr = raw[shift:shift + size]
    register(arr, label)
    return arr


# ---- zeroing owned memory

_ZERO_BY_PAGES_MIN = 1 << 20          # below this, writing the zeros costs less than the system call
_MADV_DONTNEED = 4                    # <sys/mman.h> (Linux)
_madvise = None                       # libc's madvise once looked up; False where there is none


def _libc_madvise():
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                f = libc.madvise
                f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                f.restype = ctypes.c_int
                _madvise = f
            except (OSError, AttributeError):
                pass
    return _madvise


_MADV_NOHUGEPAGE = 15                 # <sys/mman.h> (Linux)
_HUGE_PAGE = 2 << 20


def _whole_pages(arr: np.ndarray) -> tuple:
    """The address range [lo, hi) of the whole pages inside ``arr``'s bytes (lo >= hi: none)."""
    a = arr.ctypes.data
    return -(-a // mmap.PAGESIZE) * mmap.PAGESIZE, (a + arr.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE


def small_pages(arr: np.ndarray) -> None:
    """Ask the kernel for ordinary (4 KiB) pages behind the whole pages of ``arr`` (an ``aligned_malloc`` array not
    yet written): ``madvise(MADV_NOHUGEPAGE)``, undoing the ``MADV_HUGEPAGE`` NumPy gives every allocation of 4 MiB
    or more. ggml_aligned_malloc asks for nothing, so with transparent huge pages in their usual "madvise" mode
    llama.cpp's CPU buffers fault in 4 KiB at a time -- and a compute buffer is touched sparsely: a 4-token prompt
    in a context reserved for 512 tokens writes a few hundred KiB spread over tens of MiB, where each huge-page
    fault zeroes (and may first compact) 2 MiB. Nothing changes where madvise is missing or refuses."""
    if arr.nbytes < 2 * _HUGE_PAGE:
        return
    madvise = _libc_madvise()
    if madvise:
        lo, hi = _whole_pages(arr)
        if hi > lo:
            madvise(lo, hi - lo, _MADV_NOHUGEPAGE)


def zero_owned(arr: np.ndarray) -> None:
    """``arr[:] = 0`` for bytes of an ``aligned_malloc`` array (private anonymous memory this process owns): the
    whole pages inside ``arr`` are handed back to the kernel (``madvise(MADV_DONTNEED)``: they read as zero again
    and take no memory until written), only the partial pages at its ends are written. The same bytes as a
    memset, without a write -- and a page fault -- for every page: a fresh 12 MB KV cache cleared by llama.cpp's
    ``ggml_backend_buffer_clear`` took ~2,900 faults, 3-25 ms (and huge-page faults when NumPy had asked for huge
    pages). Not for memory mapped from a file (the pages would read the file again): only what aligned_malloc
    made. Where madvise is missing or refuses, the zeros are written."""
    arr = arr.reshape(-1).view(np.uint8)
    n = arr.nbytes
    if n >= _ZERO_BY_PAGES_MIN:
        madvise = _libc_madvise()
        if madvise:
            a = arr.ctypes.data
            lo, hi = _whole_pages(arr)
            if hi > lo and madvise(lo, hi - lo, _MADV_DONTNEED) == 0:
                arr[:lo - a] = 0
                arr[hi - a:] = 0
                return
    arr[...] = 0


def register(arr: np.ndarray, label: str = "buffer") -> int:
    """Make ``arr``'s bytes addressable; returns its base address."""
    arr = np.asarray(arr)
    if arr.dtype != np.uint8 or arr.ndim != 1:
        arr = arr.reshape(-1).view(np.uint8)
    base = arr.ctypes.data
    with _lock:
        i = bisect.bisect_left(_bases, base)
        # an address re-used after a free replaces the stale entry
        if i < len(_bases) and _bases[i] == base:
            _regions[i] = (base, arr.nbytes, arr, label)
        else:
            _bases.insert(i, base)
            _regions.insert(i, (base, arr.nbytes, arr, label))
    return base


def unregister(arr_or_base) -> None:
    base = arr_or_base if isinstance(arr_or_base, int) else arr_or_base.ctypes.data
    with _lock:
        i = bisect.bisect_left(_bases, base)
        if i < len(_bases) and _bases[i] == base:
            del _bases[i]
            del _regions[i]


def resolve(addr: int, nbytes: int = 0):
    """Return (array, offset, label) of the registered buffer holding [addr, addr+nbytes)."""
    with _lock:
        i = bisect.bisect_right(_bases, addr) - 1
        if i >= 0:
            base, size, arr, label = _regions[i]
            if addr + nbytes <= base + size and (addr < base + size or (nbytes == 0 and addr == base + size)):
                return arr, addr - base, label
    raise ValueError(f"address 0x{addr:x} (+{nbytes} bytes) is not inside any ggviz buffer")


def regions():
    """Snapshot of the registered buffers: list of (base, size, label)."""
    with _lock:
        return [(b, s, l) for (b, s, _a, l) in _regions]


# ggviz: Python's cyclic garbage collector, paused while a model or a context is made
_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = False
_gc_freeze_after = False      # set by a program that keeps its model and context until it exits (`ggviz run`)


def gc_freeze_after_paused(on: bool = True) -> None:
    """For a program that keeps what it loads until it exits (the ``ggviz run`` process): the outermost
    ``gc_paused`` block that ends without an error then freezes every object alive (``gc.freeze``) instead of
    handing them to the collector's young generation. Without it, the first young-generation collection after a
    model load traverses the ~70,000 objects the load made (53-61 ms of a one-shot run) and the first
    middle-generation one, in the first decode steps, traverses them again with the context's (68-70 ms): ~130 ms
    of the ~150 ms of collector time in a one-shot run (gc.callbacks, 2-core machine). Frozen, they are never
    traversed, and nothing is lost in a process that exits with them alive. Not for a library user: a model
    dropped without ``llama_model_free`` holds reference cycles (~7,000 objects) that a frozen heap would keep
    until the process exits."""
    global _gc_freeze_after
    _gc_freeze_after = bool(on)


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside the block (re-entrant, thread-safe; the collector's state is restored
    when the outermost block ends, whatever happened inside).

    Loading a model or creating a context makes ~30,000-60,000 objects that live as long as the model or the
    context (the vocabulary, the graphs' tensors, the allocator's and scheduler's records). While they are made,
    every 700 allocations start a young-generation collection that traverses them again, and the older
    generations' collections follow, a full one among them: ~110 ms of collector time in a SmolLM2 load and ~110 ms
    in its first context (gc.callbacks, 2-core machine), for garbage that is not there (nothing is freed: ggviz's
    structs free by reference count). Paused, the collector sees these objects once, at its next collection after
    the block (~60 ms for both). Nothing else changes: reference counting frees as always, and cycles made inside
    the block are collected then.

    That next collection is made here, as the outermost block ends well, and it is a middle-generation one
    (``gc.collect(1)``): it traverses what the young one would have (the block's objects, and the few young ones
    before it) and moves the survivors to the oldest generation. A young one would move them to the middle
    generation instead, whose first collection -- ten young ones later, in a model's first decode steps --
    traversed them all again: 22 ms of CPU in the first decode step after a 128-token prompt (69,000 objects of the
    model and the context; gc.callbacks, 2-core machine), a third of that step. In the oldest generation they are
    traversed only by a full collection, which Python starts when the objects that reached it since the last one
    number a quarter of those that were there."""
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    done = False
    try:
        yield
        done = True
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                if done and _gc_freeze_after:     # (gc_freeze_after_paused: a program's model and context)
                    gc.freeze()
                elif done:
                    gc.collect(1)                 # (before enable: the collector would start a young one first)
                gc.enable()
