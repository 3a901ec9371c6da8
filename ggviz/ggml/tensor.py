"""struct ggml_tensor and struct ggml_object, byte for byte, plus ggml.c's tensor queries.

Mirrors (ggml.h / ggml.c): ``struct ggml_tensor`` (336 bytes), ``struct ggml_object`` (32 bytes), ``ggml_nbytes``,
``ggml_nbytes_pad``, ``ggml_row_size``, ``ggml_nelements``, ``ggml_nrows``, ``ggml_type_size``, ``ggml_blck_size``,
``ggml_type_name``, ``ggml_op_name``, ``ggml_op_desc``, ``ggml_is_contiguous*``, ``ggml_is_transposed``,
``ggml_is_permuted``, ``ggml_are_same_shape``, ``ggml_can_repeat`` ... and ``ggml_get_data``.

A ``Tensor`` is a *handle* on 336 bytes inside a context's arena. Every field lives in those bytes (written in the
layout gcc gives the C struct on x86-64), so a hexdump of the arena decodes like gdb's ``p *t``. Pointers (``src``,
``view_src``, ``data``) are stored as real addresses of ggviz's NumPy buffers; ``memory.resolve`` and the registry
below turn them back into objects.
"""
from __future__ import annotations

import struct
import weakref

import numpy as np

from . import consts as C
from . import memory, quants
from .impl import GGML_PAD, _traits, blck_size, is_quantized, row_size, type_name, type_size, type_sizef  # noqa: F401 - ggml.c's

# ---- struct ggml_object { size_t offs; size_t size; struct ggml_object * next; enum ggml_object_type type; char padding[4]; }
OBJECT_DTYPE = np.dtype({"names": ["offs", "size", "next", "type", "padding"],
                         "formats": ["<u8", "<u8", "<u8", "<i4", "V4"],
                         "offsets": [0, 8, 16, 24, 28], "itemsize": C.GGML_OBJECT_SIZE})

# ---- struct ggml_tensor (see ggml.h): field -> byte offset, as the C compiler lays it out on LP64
TENSOR_DTYPE = np.dtype({
    "names": ["type", "buffer", "ne", "nb", "op", "op_params", "flags", "src", "view_src", "view_offs", "data",
              "name", "extra", "padding"],
    "formats": ["<i4", "<u8", ("<i8", 4), ("<u8", 4), "<i4", ("<i4", 16), "<i4", ("<u8", 10), "<u8", "<u8", "<u8",
                "S64", "<u8", "V8"],
    "offsets": [0, 8, 16, 48, 80, 84, 148, 152, 232, 240, 248, 256, 320, 328],
    "itemsize": C.GGML_TENSOR_SIZE,
})
assert TENSOR_DTYPE.itemsize == 336

# char name[GGML_MAX_NAME] (bytes 256..319) read as bytes, and written as the first n bytes (the ``n``th packer):
# struct reads and writes the array's bytes in place, without the slice or memoryview object each would cost
_name_unpack = struct.Struct(f"{C.GGML_MAX_NAME}s").unpack_from
_name_pack = [struct.Struct(f"{n}s").pack_into for n in range(C.GGML_MAX_NAME + 1)]

# word indices into the struct viewed as int32 (w) / uint64 (q)
_W_TYPE, _Q_BUFFER, _W_OP, _W_FLAGS = 0, 1, 20, 37
_Q_SRC, _Q_VIEW_SRC, _Q_VIEW_OFFS, _Q_DATA, _Q_EXTRA = 19, 29, 30, 31, 40
_unpack_ne_nb = struct.Struct("<8q").unpack_from          # ne[4], nb[4]: bytes 16..79 of the struct

# address -> Tensor: ggml hands out pointers, ggviz needs the object behind them. Weak, so that a context nobody
# references any more (its tensors included) is collected and its arena released, as ggml_free would.
_registry: "weakref.WeakValueDictionary[int, Tensor]" = weakref.WeakValueDictionary()


# the registry's own dict (address -> weak reference): read directly, a lookup costs one dict probe and a call
# instead of WeakValueDictionary.get's Python frame -- the graph build, split and allocation make ~100 per node
_registry_refs = _registry.data


def tensor_at(addr: int):
    """The Tensor whose struct starts at ``addr`` (None for NULL)."""
    if not addr:
        return None
    r = _registry_refs.get(addr)
    t = r() if r is not None else None
    if t is None:
        raise ValueError(f"no ggml_tensor at address 0x{int(addr):x}")
    return t


class _SrcArray:
    """``tensor->src[i]``: reads and writes the pointer array inside the struct."""
    __slots__ = ("_q",)

    def __init__(self, q):
        self._q = q

    def __getitem__(self, i):
        if type(i) is int and 0 <= i < C.GGML_MAX_SRC:         # the common case first
            return tensor_at(self._q.item(_Q_SRC + i))
        if isinstance(i, slice):
            return [tensor_at(a) for a in self._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC][i]]
        if not -C.GGML_MAX_SRC <= i < C.GGML_MAX_SRC:
            raise IndexError(f"src index {i} out of range (GGML_MAX_SRC = {C.GGML_MAX_SRC})")
        return tensor_at(self._q[_Q_SRC + (i % C.GGML_MAX_SRC)])

    def __setitem__(self, i, t):
        self._q[_Q_SRC + (i % C.GGML_MAX_SRC)] = 0 if t is None else t.addr

    def __len__(self):
        return C.GGML_MAX_SRC

    def __iter__(self):
        return (tensor_at(a) for a in self._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC])

    def __repr__(self):
        return repr([s.name if s is not None else None for s in self])


class Tensor:
    """Handle on a ``struct ggml_tensor`` living in an arena. Attribute names are the C field names."""
    __slots__ = ("addr", "_raw", "_w", "_q", "ne", "_nb", "_op_params", "ctx", "py_extra", "__weakref__")

    def __init__(self, raw: np.ndarray, ctx=None, addr: int | None = None):
        self._raw = raw                     # the 336 struct bytes (a view into the arena)
        self.addr = raw.ctypes.data if addr is None else addr     # (``addr``: the caller knows it, and
        #                                                             ndarray.ctypes costs an object per access)
        self._w = raw.view(np.int32)
        self._q = raw.view(np.uint64)
        # ne/nb/op_params are live views: `t.ne[1] = 3` writes the struct, exactly like `t->ne[1] = 3` (nb and
        # op_params made when first read: see below)
        self.ne = raw[16:48].view(np.int64)
        self._nb = self._op_params = None
        self.ctx = ctx
        self.py_extra = None                # Python-side annotations (backend, trace ids); not part of the struct
        _registry[self.addr] = self

    # -- scalar fields
    # (ndarray.item(i) hands back a Python int without a NumPy scalar in between: a third of int(a[i])'s time, and
    # the graph build, split and allocation read these fields ~100 times per node)
    type = property(lambda s: s._w.item(_W_TYPE), lambda s, v: s._w.__setitem__(_W_TYPE, v))
    op = property(lambda s: s._w.item(_W_OP), lambda s, v: s._w.__setitem__(_W_OP, v))
    flags = property(lambda s: s._w.item(_W_FLAGS), lambda s, v: s._w.__setitem__(_W_FLAGS, v))
    view_offs = property(lambda s: s._q.item(_Q_VIEW_OFFS), lambda s, v: s._q.__setitem__(_Q_VIEW_OFFS, v))
    data = property(lambda s: s._q.item(_Q_DATA), lambda s, v: s._q.__setitem__(_Q_DATA, 0 if v is None else v))
    buffer = property(lambda s: s._q.item(_Q_BUFFER), lambda s, v: s._q.__setitem__(_Q_BUFFER, 0 if v is None else v))
    extra = property(lambda s: s._q.item(_Q_EXTRA), lambda s, v: s._q.__setitem__(_Q_EXTRA, 0 if v is None else v))

    # raw, nb and op_params: views made when first read. A graph's tensors are made by the thousand (a build, a
    # copy) and most of them never have their bytes, strides or op params read through these views (the build,
    # the scheduler and the allocator read the struct's words, ``_q`` / ``_w``): a NumPy view each made for
    # nothing. (ne is read for most tensors: made at once)
    @property
    def raw(self):
        """The 336 struct bytes (a uint8 view of the arena)."""
        v = self._raw
        if v is None:
            v = self._raw = self._q.view(np.uint8)
        return v

    @property
    def nb(self):
        v = self._nb
        if v is None:
            v = self._nb = self._q[6:10].view(np.int64)   # size_t in C; int64 here so stride arithmetic stays signed
        return v

    @property
    def op_params(self):
        v = self._op_params
        if v is None:
            v = self._op_params = self._w[21:37]
        return v

    @property
    def view_src(self):
        return tensor_at(self._q.item(_Q_VIEW_SRC))

    @view_src.setter
    def view_src(self, t):
        self._q[_Q_VIEW_SRC] = 0 if t is None else t.addr

    @property
    def src(self):
        return _SrcArray(self._q)

    @property
    def name(self) -> str:
        return _name_unpack(self._q, 256)[0].partition(b"\0")[0].decode("utf-8", "replace")

    @name.setter
    def name(self, value: str):
        # char name[GGML_MAX_NAME]: at most 63 bytes plus the terminating NUL, like ggml_set_name's copy loop (and
        # vsnprintf in ggml_format_name). The bytes after the NUL are left alone, as in C: renaming to a shorter
        # name keeps the tail of the old one in the struct.
        b = value.encode("utf-8")[:C.GGML_MAX_NAME - 1] + b"\0"
        _name_pack[len(b)](self._q, 256, b)          # (packed into the struct's bytes: no array made for them)

    # -- conveniences (not C fields)
    @property
    def shape(self) -> tuple:
        """ne as a tuple of Python ints (ne0, ne1, ne2, ne3)."""
        return tuple(self.ne.tolist())

    @property
    def strides(self) -> tuple:
        return tuple(self.nb.tolist())

    def struct(self) -> dict:
        """The struct decoded from its bytes, like gdb's ``p *t``."""
        rec = self.raw.view(TENSOR_DTYPE)[0]
        return {
            "type": int(rec["type"]), "buffer": int(rec["buffer"]), "ne": [int(x) for x in rec["ne"]],
            "nb": [int(x) for x in rec["nb"]], "op": int(rec["op"]), "op_params": [int(x) for x in rec["op_params"]],
            "flags": int(rec["flags"]), "src": [int(x) for x in rec["src"]], "view_src": int(rec["view_src"]),
            "view_offs": int(rec["view_offs"]), "data": int(rec["data"]), "name": self.name,
            "extra": int(rec["extra"]),
        }

    def __repr__(self):
        return (f"<ggml_tensor {self.name!r} {type_name(self.type)} ne={list(self.shape)} "
                f"op={op_desc(self)} @0x{self.addr:x}>")

    def __eq__(self, other):
        return isinstance(other, Tensor) and other.addr == self.addr

    def __hash__(self):
        return self.addr


_registry_remove = _registry._remove


class _AddrRef(weakref.ref):
    """The registry's weak reference to a tensor, keyed by its address: weakref.KeyedRef (what
    WeakValueDictionary.__setitem__ stores; its removal callback reads ``.key``) without KeyedRef's Python-level
    ``__new__``/``__init__`` -- made by ref's own constructor, then the key set: two Python frames less per tensor
    (a graph build makes ~1,000)."""
    __slots__ = ("key",)


def arena_structs(arena: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """ggviz: the struct ggml_tensor words of the tensors whose structs start at word ``rows`` of ``arena`` (a
    context's memory as uint64 words): rows of a strided view of the arena, gathered at once (a copy), one row of
    GGML_TENSOR_SIZE / 8 words each -- instead of a read per tensor."""
    nw = C.GGML_TENSOR_SIZE // 8
    if arena.size < nw:
        return np.zeros((0, nw), arena.dtype)
    structs = np.lib.stride_tricks.as_strided(arena, (arena.size - nw + 1, nw), (arena.strides[0], arena.strides[0]),
                                              writeable=False)
    return structs[rows]


def structs_in_arena(tensors, addrs=None):
    """ggviz: the struct words of ``tensors`` read at once where they lie in the first one's context arena (a
    graph's nodes do): (words, inside, arena, base) -- ``inside`` marks the tensors found there (the others' rows
    are the arena's first struct: read those from the tensor), ``arena`` the context's memory as uint64 words,
    ``base`` its address. None: no arena to read (the caller reads each tensor). ``addrs``: the tensors'
    addresses as an int64 array, when the caller has them."""
    got = arena_rows(tensors, addrs)
    if got is None:
        return None
    arena, rows, inside, base = got
    return arena_structs(arena, rows), inside, arena, base


def arena_rows(tensors, addrs=None):
    """ggviz: where the structs of ``tensors`` start in the first one's context arena: (arena, rows, inside, base)
    -- ``arena`` the context's memory as uint64 words, ``rows`` each struct's first word there (0 for one not
    there), ``inside`` which are there, ``base`` the arena's address; None: no arena. ``addrs``: the tensors'
    addresses as an int64 array, when the caller has them."""
    n = len(tensors)
    ctx = tensors[0].ctx if n else None
    buf = getattr(ctx, "mem_buffer", None) if ctx is not None else None
    if buf is None or ctx.used_mem() < C.GGML_TENSOR_SIZE:
        return None
    arena = buf[:ctx.used_mem() // 8 * 8].view(np.uint64)
    base = buf.ctypes.data
    off = (np.fromiter((t.addr for t in tensors), np.int64, n) if addrs is None else addrs) - base
    inside = (off >= 0) & (off % 8 == 0) & (off + C.GGML_TENSOR_SIZE <= arena.nbytes)
    return arena, np.where(inside, off // 8, 0), inside, base


_WORD_COLS = np.arange(C.GGML_TENSOR_SIZE // 8)


def gather_structs(tensors, addrs, out: np.ndarray, index: np.ndarray | None = None) -> None:
    """ggviz: the struct words of ``tensors`` (their addresses ``addrs``, int64) into ``out`` (uint64 rows of
    GGML_TENSOR_SIZE / 8 words): those whose structs lie in the first one's context arena (a graph's nodes do)
    taken from it in one gather, the others from their own words. ``index``: an (n, words) intp array for the
    gather's word indices (a caller's scratch: a fresh one of a ~1,500-tensor graph is ~500 KB of new pages,
    more than the gather costs)."""
    n = len(tensors)
    got = arena_rows(tensors, addrs) if n else None
    if got is None:
        if n:
            np.concatenate([t._q for t in tensors], out=out.reshape(-1))
        return
    arena, rows, inside, _ = got
    idx = np.empty((n, len(_WORD_COLS)), np.intp) if index is None else index
    np.add(rows[:, None], _WORD_COLS, out=idx)
    np.take(arena, idx, out=out, mode="clip")          # (every index is in the arena: "clip" does not buffer)
    rest = np.flatnonzero(~inside).tolist()
    if rest:
        out[rest] = np.concatenate([tensors[k]._q for k in rest]).reshape(len(rest), len(_WORD_COLS))


_TSZ_W, _TSZ_Q = C.GGML_TENSOR_SIZE // 4, C.GGML_TENSOR_SIZE // 8     # (the struct's 32- and 64-bit words)


def tensor_in_arena(ctx, offs: int, addr: int) -> Tensor:
    """ggviz: ``Tensor(ctx.mem_buffer[offs:offs + 336], ctx, addr)`` for a struct at an 8-byte aligned ``offs`` of
    a context's arena, its fields sliced out of the arena's typed views (``ctx._i32`` / ``ctx._u64`` /
    ``ctx._i64``: one slice each instead of a slice and a dtype view) and registered without
    WeakValueDictionary.__setitem__'s frame. The same handle: ``_w``, ``_q``, ``ne`` are views of the same bytes
    (``raw``, ``nb`` and ``op_params`` too, made when first read)."""
    t = Tensor.__new__(Tensor)
    t._raw = None                            # (made when first read)
    t.addr = addr
    w, q = offs >> 2, offs >> 3
    t._w = ctx._i32[w:w + _TSZ_W]
    t._q = ctx._u64[q:q + _TSZ_Q]
    t.ne = ctx._i64[q + 2:q + 6]
    t._nb = t._op_params = None              # (made when first read)
    t.ctx = ctx
    t.py_extra = None
    if _registry._pending_removals:
        _registry[addr] = t
    else:
        r = _AddrRef(t, _registry_remove)
        r.key = addr
        _registry_refs[addr] = r
    return t


def forget(t: Tensor) -> None:
    """Drop a tensor from the address registry (its context was freed)."""
    if _registry.get(t.addr) is t:
        _registry.pop(t.addr, None)


# PowerInfer's two ops (SJTU-IPADS/PowerInfer's ggml.h puts them right after GGML_OP_MUL_MAT). ggviz keeps ggml
# 0.20.2's enum as it is, so they are numbered after GGML_OP_COUNT; names and symbols are PowerInfer's
GGML_OP_MUL_MAT_SPARSE = C.GGML_OP_COUNT
GGML_OP_AXPY = C.GGML_OP_COUNT + 1
EXTRA_OP_NAMES = {GGML_OP_MUL_MAT_SPARSE: ("MUL_MAT_SPARSE", "X*Y"), GGML_OP_AXPY: ("AXPY", "X*Y")}


def op_name(op: int) -> str:
    return C.OP_NAMES[op] if op < C.GGML_OP_COUNT else EXTRA_OP_NAMES[op][0]


def op_symbol(op: int) -> str:
    return C.OP_SYMBOLS[op] if op < C.GGML_OP_COUNT else EXTRA_OP_NAMES[op][1]


def unary_op_name(op: int) -> str:
    return C.UNARY_OP_NAMES[op]


def glu_op_name(op: int) -> str:
    return C.GLU_OP_NAMES[op]


def get_op_params_i32(t: Tensor, i: int) -> int:
    return int(t.op_params[i])


def get_op_params_f32(t: Tensor, i: int) -> float:
    return float(t.op_params[i:i + 1].view(np.float32)[0])


def set_op_params_i32(t: Tensor, i: int, v: int) -> None:
    t.op_params[i] = v


def set_op_params_f32(t: Tensor, i: int, v: float) -> None:
    t.op_params[i:i + 1].view(np.float32)[0] = v


def set_op_params(t: Tensor, values: bytes) -> None:
    """ggml_set_op_params: memcpy of up to GGML_MAX_OP_PARAMS bytes."""
    if len(values) > C.GGML_MAX_OP_PARAMS:
        raise ValueError(f"op params of {len(values)} bytes exceed GGML_MAX_OP_PARAMS ({C.GGML_MAX_OP_PARAMS})")
    if type(values) is bytes:
        _name_pack[len(values)](t._q, 84, values)    # (packed into the struct's bytes: no array made for them)
    else:
        t.raw[84:84 + len(values)] = np.frombuffer(values, dtype=np.uint8)


def get_unary_op(t: Tensor) -> int:
    return int(t.op_params[0])


def get_glu_op(t: Tensor) -> int:
    return int(t.op_params[0])


def op_desc(t: Tensor) -> str:
    if t.op == C.GGML_OP_UNARY:
        return unary_op_name(get_unary_op(t))
    if t.op == C.GGML_OP_GLU:
        return glu_op_name(get_glu_op(t))
    return op_name(t.op)


# ---------------------------------------------------------------- shape queries (ggml.c)

def nelements(t: Tensor) -> int:
    # in Python ints (tolist), so that a product that does not fit int64_t cannot wrap (ggml_new_tensor_impl
    # refuses such shapes; this matters only for an ne written by hand)
    ne0, ne1, ne2, ne3 = t.ne.tolist()
    return ne0 * ne1 * ne2 * ne3


def nrows(t: Tensor) -> int:
    _, ne1, ne2, ne3 = t.ne.tolist()
    return ne1 * ne2 * ne3


def nbytes(t: Tensor) -> int:
    ne0, ne1, ne2, ne3 = t.ne.tolist()
    if ne0 <= 0 or ne1 <= 0 or ne2 <= 0 or ne3 <= 0:
        return 0
    nb0, nb1, nb2, nb3 = t.nb.tolist()
    _, bs, ts, _ = C.TYPE_TRAITS[t.type]
    n = (ts + (ne0 - 1) * nb0) if bs == 1 else ne0 * nb0 // bs
    return n + (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3


# (block size, type size) per type for nbytes_rows; 0: no such type
_ROWS_BS = np.zeros(max(C.TYPE_TRAITS) + 1, np.int64)
_ROWS_TS = np.zeros(max(C.TYPE_TRAITS) + 1, np.int64)
for _t, _tr in C.TYPE_TRAITS.items():
    if _tr is not None:
        _ROWS_BS[_t], _ROWS_TS[_t] = _tr[1], _tr[2]


def nbytes_rows(types, ne, nb) -> np.ndarray:
    """ggviz: ggml_nbytes of many tensors at once (``types``: (k,), ``ne`` / ``nb``: (k, 4) int64 words, as the
    structs hold them), -1 for a type without traits (ggml_nbytes of one such tensor raises)."""
    types = np.asarray(types, np.int64)
    known = (types >= 0) & (types < len(_ROWS_BS))
    t = np.where(known, types, 0)
    bs, ts = _ROWS_BS[t], _ROWS_TS[t]
    known &= bs != 0
    first = np.where(bs == 1, ts + (ne[:, 0] - 1) * nb[:, 0], ne[:, 0] * nb[:, 0] // np.maximum(bs, 1))
    n = np.where((ne <= 0).any(axis=1), 0, first + ((ne[:, 1:] - 1) * nb[:, 1:]).sum(axis=1))
    return np.where(known, n, -1)


def nbytes_pad(t: Tensor) -> int:
    return GGML_PAD(nbytes(t), C.GGML_MEM_ALIGN)


def element_size(t: Tensor) -> int:
    return type_size(t.type)


def is_scalar(t):
    ne = t.ne
    return ne[0] == 1 and ne[1] == 1 and ne[2] == 1 and ne[3] == 1


def is_vector(t):
    ne = t.ne
    return ne[1] == 1 and ne[2] == 1 and ne[3] == 1


def is_matrix(t):
    return t.ne[2] == 1 and t.ne[3] == 1


def is_3d(t):
    return t.ne[3] == 1


def n_dims(t) -> int:
    ne = t.ne.tolist()
    for i in (3, 2, 1):
        if ne[i] > 1:
            return i + 1
    return 1


def is_empty(t) -> bool:
    return 0 in t.ne.tolist()


def is_transposed(t) -> bool:
    nb = t.nb
    return nb.item(0) > nb.item(1)


def is_permuted(t) -> bool:
    nb = t.nb
    return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]


def _is_contiguous_m_n(t, m: int, n: int) -> bool:
    # ne and nb (words 2..9 of the struct, int64_t as .ne / .nb read them) unpacked in one go, not two views' tolist
    ne_nb = _unpack_ne_nb(t._q, 16)
    ne, nb = ne_nb[:4], ne_nb[4:]
    _, bs, ts, _ = _traits(t._w.item(_W_TYPE))
    next_nb = ts
    if ne[0] != bs and nb[0] != next_nb:
        return False
    next_nb *= ne[0] // bs
    for i in range(1, n):
        if i > m:
            if ne[i] != 1 and nb[i] != next_nb:
                return False
            next_nb *= ne[i]
        else:
            # this dimension does not need to be contiguous
            next_nb = ne[i] * nb[i]
    return True


def is_contiguous(t) -> bool:
    # _is_contiguous_m_n(t, 0, GGML_MAX_DIMS) with its loop written out (the graph build asks ~150 times)
    ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3 = _unpack_ne_nb(t._q, 16)
    _, bs, ts, _ = _traits(t._w.item(_W_TYPE))
    if ne0 != bs and nb0 != ts:
        return False
    next_nb = ts * (ne0 // bs)
    if ne1 != 1 and nb1 != next_nb:
        return False
    next_nb *= ne1
    if ne2 != 1 and nb2 != next_nb:
        return False
    return ne3 == 1 or nb3 == next_nb * ne2


is_contiguous_0 = is_contiguous


def is_contiguous_1(t) -> bool:
    return _is_contiguous_m_n(t, 1, C.GGML_MAX_DIMS)


def is_contiguous_2(t) -> bool:
    return _is_contiguous_m_n(t, 2, C.GGML_MAX_DIMS)


def is_contiguous_rows(t) -> bool:
    # ne[0] and nb[0] read as the struct's words 2 and 6 (Python ints, no NumPy scalars), the type's traits once
    _, bs, ts, _ = _traits(t._w.item(_W_TYPE))
    q = t._q
    return q.item(2) == bs or q.item(6) == ts


def is_contiguously_allocated(t) -> bool:
    return nbytes(t) == nelements(t) * type_size(t.type) // blck_size(t.type)


def is_padded_1d(t) -> bool:
    ne, nb = t.ne, t.nb
    return nb[0] == type_size(t.type) and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]


def are_same_shape(a, b) -> bool:
    return a.shape == b.shape


def are_same_stride(a, b) -> bool:
    return a.strides == b.strides


def is_view(t) -> bool:
    # ggml_impl_is_view: a view is anything that has a view_src
    return t.view_src is not None


def can_repeat(t0, t1) -> bool:
    if is_empty(t0):
        return is_empty(t1)
    a0, a1, a2, a3 = t0.ne.tolist()
    b0, b1, b2, b3 = t1.ne.tolist()
    return b0 % a0 == 0 and b1 % a1 == 0 and b2 % a2 == 0 and b3 % a3 == 0


def can_repeat_rows(t0, t1) -> bool:
    return t0.ne[0] == t1.ne[0] and can_repeat(t0, t1)


def can_mul_mat(t0, t1) -> bool:
    a0, _, a2, a3 = t0.ne.tolist()
    b0, _, b2, b3 = t1.ne.tolist()
    # (x % 0 is 0 for NumPy's int64, which these were compared as: an empty a broadcasts)
    return a0 == b0 and (a2 == 0 or b2 % a2 == 0) and (a3 == 0 or b3 % a3 == 0)


def can_out_prod(t0, t1) -> bool:
    return t0.ne[1] == t1.ne[1] and t1.ne[2] % t0.ne[2] == 0 and t1.ne[3] % t0.ne[3] == 0


# ---------------------------------------------------------------- data access

# element types NumPy can show directly; BF16 is shown as its raw uint16 bits (ggml_bf16_t is a struct of uint16)
NP_DTYPES = {
    C.GGML_TYPE_F32: np.float32, C.GGML_TYPE_F16: np.float16, C.GGML_TYPE_BF16: np.uint16,
    C.GGML_TYPE_I8: np.int8, C.GGML_TYPE_I16: np.int16, C.GGML_TYPE_I32: np.int32,
    C.GGML_TYPE_I64: np.int64, C.GGML_TYPE_F64: np.float64,
}


def get_data(t: Tensor) -> np.ndarray:
    """ggml_get_data as a zero-copy NumPy view of the tensor's bytes.

    Element types come back typed with shape (ne3, ne2, ne1, ne0) and byte strides (nb3, nb2, nb1, nb0), so views,
    permutes and transposes show exactly the bytes they share with their source. Quantized types come back as raw
    block bytes with shape (ne3, ne2, ne1, row_bytes). Raises if the tensor has no data yet (a ``no_alloc`` tensor
    before allocation).
    """
    if not t.data:
        raise ValueError(f"tensor {t.name!r} has no data (data == NULL: no_alloc context, not allocated yet)")
    ne, nb = t.shape, t.strides
    n = nbytes(t)
    arr, off, _ = memory.resolve(t.data, n)
    dt = NP_DTYPES.get(t.type)
    if dt is not None:
        return np.ndarray(shape=ne[::-1], dtype=dt, buffer=arr, offset=off, strides=nb[::-1])
    rb = row_size(t.type, ne[0])
    return np.ndarray(shape=(ne[3], ne[2], ne[1], rb), dtype=np.uint8, buffer=arr, offset=off,
                      strides=(nb[3], nb[2], nb[1], 1))


def get_data_f32(t: Tensor) -> np.ndarray:
    """Values as float32 (a copy): element types converted, quantized types dequantized (ggml's to_float)."""
    if t.type in NP_DTYPES:
        v = get_data(t)
        if t.type == C.GGML_TYPE_BF16:
            return (v.astype(np.uint32) << 16).view(np.float32)
        return v.astype(np.float32)
    return quants.dequantize_row(t.type, np.ascontiguousarray(get_data(t)))


def set_data(t: Tensor, values) -> None:
    """Write values into the tensor (convenience for notebooks/tests; ggml code writes through get_data)."""
    dst = get_data(t)
    v = np.asarray(values)
    if t.type in NP_DTYPES:
        if t.type == C.GGML_TYPE_BF16 and v.dtype != np.uint16:
            v = quants.fp32_to_bf16(np.asarray(v, dtype=np.float32))
        dst[...] = v.reshape(dst.shape) if v.size == dst.size else v
    else:
        if v.dtype != np.uint8:
            v = quants.quantize_row_ref(t.type, np.asarray(v, dtype=np.float32).reshape(dst.shape[:3] + (-1,)))
        dst[...] = v.reshape(dst.shape)
