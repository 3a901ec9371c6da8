"""ggviz's own libstdc++ sorts: ``std::sort`` and ``std::partial_sort`` as GCC's bits/stl_algo.h and
bits/stl_heap.h run them, step by step.

Not a ggml source file: ggml-cpu (ARGSORT: ``std::sort``; TOP_K: ``std::partial_sort``, ops.cpp) and llama.cpp's
samplers (llama-sampler.cpp) call the C++ library, and neither algorithm is stable: elements that compare equal end
up in an order only the algorithm decides (introsort: median of three, unguarded partition, a depth limit of
2 * floor(log2 n) past which it heap-sorts, then insertion sort of runs of 16; partial_sort: heap select, then heap
sort). Both engines need that very order, so it lives here, once (as ``libm.py`` holds glibc's functions).

Every walk sorts ``a``, a list of positions, comparing the values ``x[a[i]]`` (Python floats: exact, and a NaN
compares false as in C) with ``comp(p, q) = x[p] > x[q]`` -- descending, llama.cpp's ``a.logit > b.logit`` and
ggml's ``GGML_SORT_ORDER_DESC``. Ascending (``x[p] < x[q]``) is the same walk on ``-x``, which compares alike.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def _push_heap(a, x, f, hole, top, val):
    xv = x[val]
    parent = (hole - 1) // 2
    while hole > top and x[a[f + parent]] > xv:
        a[f + hole] = a[f + parent]
        hole = parent
        parent = (hole - 1) // 2
    a[f + hole] = val


def _adjust_heap(a, x, f, hole, n, val):
    top = hole
    second = hole
    while second < (n - 1) // 2:
        second = 2 * (second + 1)
        if x[a[f + second]] > x[a[f + second - 1]]:
            second -= 1
        a[f + hole] = a[f + second]
        hole = second
    if (n & 1) == 0 and second == (n - 2) // 2:
        second = 2 * (second + 1)
        a[f + hole] = a[f + second - 1]
        hole = second - 1
    _push_heap(a, x, f, hole, top, val)


def _make_heap(a, x, f, last):
    n = last - f
    if n < 2:
        return
    parent = (n - 2) // 2
    while True:
        _adjust_heap(a, x, f, parent, n, a[f + parent])
        if parent == 0:
            return
        parent -= 1


def _sort_heap(a, x, f, last):
    while last - f > 1:
        last -= 1
        val = a[last]                 # __pop_heap(first, last, last)
        a[last] = a[f]
        _adjust_heap(a, x, f, 0, last - f, val)


def _heap_select(a, x, f, middle, last):
    """``__heap_select``: heapify [f, middle), then every later element that beats the heap's top (its smallest
    value) replaces it (``__pop_heap(first, middle, i)``: the evicted one goes to position i)."""
    _make_heap(a, x, f, middle)
    for i in range(middle, last):
        if x[a[i]] > x[a[f]]:
            val = a[i]
            a[i] = a[f]
            _adjust_heap(a, x, f, 0, middle - f, val)


def _partial_sort_range(a, x, f, middle, last):
    _heap_select(a, x, f, middle, last)
    _sort_heap(a, x, f, middle)


def _unguarded_linear_insert(a, x, last):
    v = a[last]
    xv = x[v]
    nxt = last - 1
    while xv > x[a[nxt]]:
        a[last] = a[nxt]
        last = nxt
        nxt -= 1
    a[last] = v


def _insertion_sort(a, x, f, last):
    if f == last:
        return
    for i in range(f + 1, last):
        if x[a[i]] > x[a[f]]:
            v = a[i]
            a[f + 1:i + 1] = a[f:i]
            a[f] = v
        else:
            _unguarded_linear_insert(a, x, i)


def _final_insertion_sort(a, x, f, last):
    if last - f > 16:
        _insertion_sort(a, x, f, f + 16)
        for i in range(f + 16, last):
            _unguarded_linear_insert(a, x, i)
    else:
        _insertion_sort(a, x, f, last)


def _move_median_to_first(a, x, result, i, j, k):
    xa, xb, xc = x[a[i]], x[a[j]], x[a[k]]
    if xa > xb:
        if xb > xc:
            s = j
        elif xa > xc:
            s = k
        else:
            s = i
    elif xa > xc:
        s = i
    elif xb > xc:
        s = k
    else:
        s = j
    a[result], a[s] = a[s], a[result]


def _unguarded_partition(a, x, first, last, pivot):
    xp = x[a[pivot]]
    while True:
        while x[a[first]] > xp:
            first += 1
        last -= 1
        while xp > x[a[last]]:
            last -= 1
        if not first < last:
            return first
        a[first], a[last] = a[last], a[first]
        first += 1


def _introsort_loop(a, x, f, last, depth):
    while last - f > 16:
        if depth == 0:
            _partial_sort_range(a, x, f, last, last)
            return
        depth -= 1
        mid = f + (last - f) // 2
        _move_median_to_first(a, x, f, f + 1, mid, last - 1)
        cut = _unguarded_partition(a, x, f + 1, last, f)
        _introsort_loop(a, x, cut, last, depth)
        last = cut


def _distinct(v: np.ndarray) -> bool:
    """No two values compare equal (and no NaN): then every correct sort gives the same order."""
    if v.size < 2:
        return True
    if np.isnan(v).any():
        return False
    s = np.sort(v)
    return bool(np.all(s[1:] != s[:-1]))


def cxx_sort(x: np.ndarray) -> np.ndarray:
    """``std::sort(first, last, comp)`` with comp = greater (llama.cpp's ``a.logit > b.logit``): the permutation it
    leaves (positions into ``x``). Introsort (median of 3, depth limit 2 * floor(log2 n), heap sort past it), then insertion sort."""
    x = np.asarray(x, F32)
    n = x.size
    if _distinct(x):
        return np.argsort(-x.astype(np.float64), kind="stable")
    xs = x.tolist()
    a = list(range(n))
    if n:
        _introsort_loop(a, xs, 0, n, 2 * (n.bit_length() - 1))
        _final_insertion_sort(a, xs, 0, n)
    return np.asarray(a, dtype=np.int64)


def _heap_candidates(x: np.ndarray, middle: int) -> list:
    """The positions after ``middle`` that __heap_select may let into its heap (x without NaN, middle < n): only an
    element above the heap's top can enter, and the top never falls below the middle-th largest value seen so far,
    so elements not above that bound (taken at doubling block starts) are skipped."""
    n = x.size
    blocks, b = [], middle
    while b < n:
        e = min(n, 2 * b)
        bound = np.partition(x[:b], b - middle)[b - middle]
        blocks.append(np.nonzero(x[b:e] > bound)[0] + b)
        b = e
    return np.concatenate(blocks).tolist() if blocks else []


def cxx_partial_sort(x: np.ndarray, middle: int) -> np.ndarray:
    """``std::partial_sort(first, first + middle, last, comp)`` with comp = greater logit: the positions of the first
    ``middle`` elements it leaves, in order (the rest of the range is left in an unspecified order nobody reads)."""
    x = np.asarray(x, F32)
    n = x.size
    middle = int(min(max(middle, 0), n))
    if middle == 0:
        return np.zeros(0, dtype=np.int64)
    has_nan = bool(np.isnan(x).any())
    if not has_nan:
        top = np.argpartition(-x, middle)[:middle + 1] if middle < n else np.arange(n)
        order = top[np.argsort(-x[top].astype(np.float64), kind="stable")]
        head = x[order]
        if bool(np.all(head[:-1] > head[1:])):
            return order[:middle]   # the best `middle` are distinct and beat the rest: the result is unique
    # __heap_select + __sort_heap. Only elements that beat the heap's top (its smallest logit) enter it; the top is
    # never below the middle-th largest logit seen so far, so elements not above that bound (taken at doubling block
    # starts) are skipped. An entering element replaces the top (__pop_heap(first, middle, i) moves the top to
    # position i, which nothing reads again).
    if has_nan:
        cand = list(range(middle, n))
        xs = x.tolist()
    else:
        cand = _heap_candidates(x, middle)
        pos = list(range(middle)) + cand
        xs = dict(zip(pos, x[pos].tolist()))
    a = list(range(middle))
    _make_heap(a, xs, 0, middle)
    for i in cand:
        if xs[i] > xs[a[0]]:
            _adjust_heap(a, xs, 0, 0, middle, i)
    _sort_heap(a, xs, 0, middle)
    return np.asarray(a, dtype=np.int64)


def sort_positions(x: np.ndarray) -> np.ndarray:
    """``std::sort(first, last, comp)`` over the positions ``0..n-1`` by ``x`` (comp = greater): the int32
    permutation it leaves. ggml's ARGSORT: ``dst_data[j] = j``, then this (ops.cpp)."""
    return cxx_sort(x).astype(np.int32)


def partial_sort_positions(x: np.ndarray, middle: int) -> np.ndarray:
    """``std::partial_sort(first, first + middle, last, comp)`` over the positions ``0..n-1`` by ``x`` (comp =
    greater): the whole int32 array it leaves -- the best ``middle`` in order, then the rest in the order the heap
    select left them (each element that entered the heap leaves the evicted top in its place). ggml's TOP_K keeps
    this array in its per-thread scratch."""
    x = np.asarray(x, F32)
    n = x.size
    middle = int(min(max(middle, 0), n))
    a = list(range(n))
    if middle == 0:
        return np.asarray(a, dtype=np.int32)
    xs = x.tolist()
    if np.isnan(x).any() or middle == n:
        cand = range(middle, n)
    else:
        cand = _heap_candidates(x, middle)
    _make_heap(a, xs, 0, middle)
    for i in cand:
        if xs[i] > xs[a[0]]:                   # __heap_select: __pop_heap(first, middle, i)
            val = a[i]
            a[i] = a[0]
            _adjust_heap(a, xs, 0, 0, middle, val)
    _sort_heap(a, xs, 0, middle)
    return np.asarray(a, dtype=np.int32)
