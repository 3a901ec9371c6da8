"""struct ggml_context: one arena, a linked list of objects in it.

Mirrors (ggml.c): ``ggml_init``, ``ggml_free``, ``ggml_reset``, ``ggml_used_mem``, ``ggml_get_mem_buffer``,
``ggml_get_mem_size``, ``ggml_get_no_alloc``/``ggml_set_no_alloc``, ``ggml_get_max_tensor_size``, ``ggml_new_object``,
``ggml_new_tensor_impl``, ``ggml_new_tensor(_1d.._4d)``, ``ggml_new_buffer``, ``ggml_dup_tensor``,
``ggml_view_tensor``, ``ggml_get_first_tensor``/``ggml_get_next_tensor``, ``ggml_get_tensor``, ``ggml_set_name``,
``ggml_format_name``, ``ggml_get_name``, ``ggml_tensor_overhead``, ``ggml_set_input``/``ggml_set_output``.

Layout rule (``ggml_new_object``): each object is a 32-byte ``ggml_object`` header followed by its payload, the
payload size rounded up to GGML_MEM_ALIGN (16). A tensor's payload is the 336-byte struct, then (unless ``no_alloc``
or it is a view) its data, so ``t->data == (char *)(t + 1)``.
"""
from __future__ import annotations

import operator
import struct
import weakref

import numpy as np

from .. import trace
from . import consts as C
from . import memory
from .impl import GGML_PAD, GGMLError, type_name
from .tensor import _Q_DATA, _Q_VIEW_OFFS, _Q_VIEW_SRC, OBJECT_DTYPE, Tensor, forget, nbytes, tensor_in_arena


INT64_MAX = (1 << 63) - 1

# ggviz: a tensor object as new_tensor_impl writes it (368 bytes), in two packs: the header struct ggml_object
# {offs, size, next, type} (its 4 padding bytes are not written, as in C), then struct ggml_tensor: type (its 4
# padding bytes and buffer: zero), ne[4], nb[4], op/op_params/flags/src[10] (zero), view_src, view_offs, data,
# name/extra/padding (zero) -- the zero words as pad bytes, which struct writes as zeros: 13 values to pack
_OBJECT_HEADER = struct.Struct("<3Qi")
_pack_ptr = struct.Struct("<Q").pack_into
_TENSOR_STRUCT = struct.Struct("<i12x8q152x3Q80x")
assert _OBJECT_HEADER.size + 4 == C.GGML_OBJECT_SIZE and _TENSOR_STRUCT.size == C.GGML_TENSOR_SIZE
_ALIGN_M1 = C.GGML_MEM_ALIGN - 1
_unpack_object = struct.Struct(f"{C.GGML_OBJECT_SIZE + C.GGML_TENSOR_SIZE}s").unpack_from   # (the bytes a tensor
#                                                                     object will cover, saved without a slice)
_unpack_ne_nb = struct.Struct("<8q").unpack_from
_TSZ, _OSZ, _OBJ_TENSOR = C.GGML_TENSOR_SIZE, C.GGML_OBJECT_SIZE, C.GGML_OBJECT_TYPE_TENSOR   # (one global each)
_TRAITS_GET = C.TYPE_TRAITS.get
_index_all = operator.index         # (mapped over ne / nb: a C loop instead of a comprehension's frame)


class ContextOutOfMemory(GGMLError, MemoryError):
    pass


def _index(x, fn: str, what: str) -> int:
    """An integer argument (a Python or NumPy int: ``operator.index``), or a GGMLError naming it."""
    try:
        return operator.index(x)
    except TypeError:
        raise GGMLError(f"{fn}: {what} must be an integer, got {x!r}") from None


OBJECT_TYPE_NAMES = {C.GGML_OBJECT_TYPE_TENSOR: "tensor", C.GGML_OBJECT_TYPE_GRAPH: "graph",
                     C.GGML_OBJECT_TYPE_WORK_BUFFER: "work_buffer"}


class Object:
    """A view of one ``struct ggml_object`` header in the arena (plus what it holds, for Python)."""
    __slots__ = ("hdr_offs", "ctx", "payload")

    def __init__(self, hdr_offs, ctx, payload=None):
        self.hdr_offs = hdr_offs   # where the 32-byte header starts in the arena
        self.ctx = ctx             # the context whose arena holds it
        self.payload = payload     # the Tensor / cgraph / None for a work buffer

    @property
    def rec(self):
        """The header bytes as a structured record (writes go to the arena)."""
        return self.ctx.mem_buffer[self.hdr_offs:self.hdr_offs + C.GGML_OBJECT_SIZE].view(OBJECT_DTYPE)[0]

    # the fields, read from the arena's words (ggml_object: size_t offs, size; ggml_object * next; int type)
    offs = property(lambda s: s.ctx._u64.item(s.hdr_offs >> 3))
    size = property(lambda s: s.ctx._u64.item((s.hdr_offs >> 3) + 1))
    next = property(lambda s: s.ctx._u64.item((s.hdr_offs >> 3) + 2))
    type = property(lambda s: s.ctx._i32.item((s.hdr_offs >> 2) + 6))

    def __repr__(self):
        return f"<ggml_object {OBJECT_TYPE_NAMES.get(self.type)} offs={self.offs} size={self.size}>"


# ggviz: an Object made without its __init__ frame (its three slots set by the caller): a graph build and a graph copy
# make one per tensor
_new_object = Object.__new__


class Context:
    """``struct ggml_context``. ``mem_buffer`` is the arena as a NumPy uint8 array."""

    def __init__(self, mem_size: int, mem_buffer=None, no_alloc: bool = False):
        if mem_size < 0:
            raise ValueError(f"ggml_init: mem_size must be >= 0, got {mem_size}")
        # allow ggml_init with 0 size
        if mem_size == 0:
            mem_size = C.GGML_MEM_ALIGN
        if mem_buffer is not None:
            buf = np.asarray(mem_buffer)
            if buf.dtype != np.uint8:
                buf = buf.reshape(-1).view(np.uint8)
            buf = buf.reshape(-1)
            if buf.nbytes < mem_size:
                raise ValueError(f"ggml_init: mem_buffer has {buf.nbytes} bytes, mem_size asks for {mem_size}")
            if buf.ctypes.data % C.GGML_MEM_ALIGN:
                raise ValueError(f"ggml_init: mem_buffer at 0x{buf.ctypes.data:x} is not {C.GGML_MEM_ALIGN}-byte aligned")
            self.mem_size = mem_size
            self.mem_buffer = buf[:mem_size]
            self.mem_buffer_owned = False
            try:
                memory.resolve(self.mem_buffer.ctypes.data, mem_size)
                self._registered = False      # caller's buffer already addressable (e.g. a slice of ours)
            except ValueError:
                memory.register(self.mem_buffer, "ctx (caller buffer)")
                self._registered = True
        else:
            self.mem_size = GGML_PAD(mem_size, C.GGML_MEM_ALIGN)
            self.mem_buffer = memory.aligned_malloc(self.mem_size, "ctx")
            self.mem_buffer_owned = True
            self._registered = True
        self.no_alloc = bool(no_alloc)
        # the arena's address, read once (ndarray.ctypes builds a new object at each access: ~2 per tensor)
        self._base = self.mem_buffer.ctypes.data
        # ggviz: the arena as 4- and 8-byte words (it is 16-byte aligned): object headers and tensor structs are
        # written and sliced through these, a slice each instead of a slice and a dtype view per field
        words = self.mem_buffer[:self.mem_buffer.shape[0] & ~7]
        self._u64 = words.view(np.uint64)
        self._i64 = words.view(np.int64)
        self._i32 = words.view(np.int32)
        self._u32 = words.view(np.uint32)
        self._mv = memoryview(self.mem_buffer)       # (struct.pack_into writes a tensor's object through it)
        self._end = 0                       # ggviz: where the next object goes (objects_end->offs + size), cached
        self.n_objects = 0
        self.objects: list[Object] = []     # objects_begin .. objects_end, in list order
        self.freed = False
        # when the context is garbage-collected without ggml_free, release its arena's address range anyway
        self._finalizer = weakref.finalize(self, memory.unregister, self.mem_buffer.ctypes.data) \
            if self._registered else None
        if trace.active:
            trace.emit("ctx.init", ctx=id(self), mem_size=self.mem_size, no_alloc=self.no_alloc,
                       base=self.mem_buffer.ctypes.data)

    # ---- struct fields as in C
    @property
    def objects_begin(self):
        return self.objects[0] if self.objects else None

    @property
    def objects_end(self):
        return self.objects[-1] if self.objects else None

    @property
    def base(self) -> int:
        return self._base

    def _check(self):
        if self.freed:
            raise GGMLError("ggml context used after ggml_free")

    def new_object(self, type_: int, size: int) -> Object:
        """ggml_new_object: append an object at the end of the arena."""
        self._check()
        size = _index(size, "ggml_new_object", "size")
        if size < 0:
            raise GGMLError(f"ggml_new_object: negative size {size}")
        objects = self.objects
        cur_end = self._end
        size_needed = GGML_PAD(size, C.GGML_MEM_ALIGN)
        need = cur_end + size_needed + C.GGML_OBJECT_SIZE
        if need > self.mem_size:
            raise ContextOutOfMemory(
                f"ggml_new_object: not enough space in the context's memory pool (needed {need}, available "
                f"{self.mem_size}) while adding a {OBJECT_TYPE_NAMES.get(type_, type_)} object of {size} bytes")
        # the header {offs, size, next, type} (the 4 padding bytes are not written, as in C)
        q = cur_end >> 3
        self._u64[q:q + 3] = (cur_end + C.GGML_OBJECT_SIZE, size_needed, 0)
        self._i32[(cur_end >> 2) + 6] = type_
        obj = Object(cur_end, self)
        if objects:
            # obj_cur->next = obj_new (a real pointer)
            self._u64[(objects[-1].hdr_offs >> 3) + 2] = self._base + cur_end
        objects.append(obj)
        self._end = need
        if trace.active:
            trace.emit("ctx.object", ctx=id(self), hdr_offs=cur_end, offs=cur_end + C.GGML_OBJECT_SIZE,
                       size=size_needed, requested=size, type=OBJECT_TYPE_NAMES.get(type_, str(type_)))
        return obj

    # ---- ggviz: a failed constructor leaves the arena exactly as it was
    #
    # Every argument is checked before ggml_new_object writes the first byte, so a bad call changes nothing. What can
    # still fail after that (an exception in a trace listener, a KeyboardInterrupt) is undone from a mark taken just
    # before: the bytes the constructor is about to overwrite (the header and the struct, a few hundred bytes: the
    # tensor data is never written at creation), the object list, n_objects and the address registry.

    def _mark(self, nbytes_written: int):
        start = self._end
        return len(self.objects), self.n_objects, start, self.mem_buffer[start:start + nbytes_written].tobytes()

    def _rollback(self, mark) -> None:
        n, n_objects, start, saved = mark
        for o in self.objects[n:]:
            if isinstance(o.payload, Tensor):
                forget(o.payload)
        del self.objects[n:]
        self.n_objects = n_objects
        self._end = start
        if self.objects:
            self.objects[-1].rec["next"] = 0          # it was the last object: its next was NULL
        self.mem_buffer[start:start + len(saved)] = np.frombuffer(saved, np.uint8)

    def new_tensor_impl(self, type_: int, n_dims: int, ne, view_src=None, view_offs: int = 0, nb=None,
                        fn: str = "ggml_new_tensor") -> Tensor:
        """ggml_new_tensor_impl. ``nb``: the strides of a view (ggml's view_2d..4d and permute write them into the
        new tensor afterwards); ``fn`` names the caller in errors.

        ggviz: the arguments are checked before anything is written (``_check_new_tensor``), beyond ggml's asserts.
        """
        if self.freed:
            raise GGMLError("ggml context used after ggml_free")
        # (the checks also find the base tensor and the absolute offset, as ggml does next: view_src is the base)
        ne, view_src, view_offs, nb, data_size = _check_new_tensor(fn, type_, n_dims, ne, view_src, view_offs, nb)
        ne0, ne1, ne2, ne3 = ne
        if view_src is not None:
            data = view_src._q.item(_Q_DATA)
            if data:
                data += view_offs
            obj_alloc_size = 0
        else:
            data = 0
            obj_alloc_size = 0 if self.no_alloc else data_size
        if trace.active:
            return self._new_tensor_traced(type_, ne, nb, view_src, view_offs, data, obj_alloc_size)
        # ggml_new_object (inlined for a tensor): its header, then the struct, written in one go below
        cur_end = self._end
        size_needed = (_TSZ + obj_alloc_size + _ALIGN_M1) & ~_ALIGN_M1      # GGML_PAD(.., 16)
        need = cur_end + size_needed + _OSZ
        if need > self.mem_size:
            raise ContextOutOfMemory(
                f"ggml_new_object: not enough space in the context's memory pool (needed {need}, available "
                f"{self.mem_size}) while adding a tensor object of {_TSZ + obj_alloc_size} bytes")
        objects, mv, base = self.objects, self._mv, self._base
        mark = (len(objects), self.n_objects, cur_end, _unpack_object(mv, cur_end)[0])
        try:
            offs = cur_end + _OSZ          # obj->offs
            addr = base + offs
            # the header {offs, size, next = NULL, type} (its 4 padding bytes keep what they held: not written, as
            # in C), then the struct: zero but for type, ne, nb, view_src, view_offs and data
            _OBJECT_HEADER.pack_into(mv, cur_end, offs, size_needed, 0, _OBJ_TENSOR)
            _TENSOR_STRUCT.pack_into(mv, offs, type_, ne0, ne1, ne2, ne3, *nb,
                                     0 if view_src is None else view_src.addr, view_offs,
                                     (addr + _TSZ) if obj_alloc_size > 0 else data)
            obj = _new_object(Object)          # (Object(cur_end, self) without its __init__ frame)
            obj.hdr_offs, obj.ctx, obj.payload = cur_end, self, None
            if objects:
                # obj_cur->next = obj_new (a real pointer; the header's third word, packed into the arena's bytes)
                _pack_ptr(mv, objects[-1].hdr_offs + 16, base + cur_end)
            objects.append(obj)
            self._end = need
            t = tensor_in_arena(self, offs, addr)
            obj.payload = t
            self.n_objects += 1
        except BaseException:
            self._rollback(mark)
            raise
        return t

    def _new_tensor_traced(self, type_, ne, nb, view_src, view_offs, data, obj_alloc_size) -> Tensor:
        """new_tensor_impl's writes one field at a time, through ggml_new_object, while a trace listener records
        them (its events: ``ctx.object``, then ``tensor.new``)."""
        mark = self._mark(C.GGML_OBJECT_SIZE + C.GGML_TENSOR_SIZE)
        try:
            obj = self.new_object(C.GGML_OBJECT_TYPE_TENSOR, C.GGML_TENSOR_SIZE + obj_alloc_size)
            offs = obj.hdr_offs + C.GGML_OBJECT_SIZE          # obj->offs
            self.mem_buffer[offs:offs + C.GGML_TENSOR_SIZE] = 0
            addr = self._base + offs
            t = tensor_in_arena(self, offs, addr)
            obj.payload = t
            # type; ne and nb (words 2..9); view_src, view_offs, data (words 29..31)
            q = offs >> 3
            self._i32[offs >> 2] = type_
            self._i64[q + 2:q + 10] = list(ne) + list(nb)
            self._u64[q + 29:q + 32] = (0 if view_src is None else view_src.addr, view_offs,
                                        (addr + C.GGML_TENSOR_SIZE) if obj_alloc_size > 0 else data)
            self.n_objects += 1
            trace.emit("tensor.new", ctx=id(self), addr=t.addr, offs=offs, type=type_, ne=t.shape,
                       view_src=view_src.addr if view_src is not None else 0, view_offs=view_offs,
                       data=t.data, data_size=obj_alloc_size)
        except BaseException:
            self._rollback(mark)
            raise
        return t

    def tensors(self):
        """ggml_get_first_tensor / ggml_get_next_tensor as a Python iterator."""
        for o in self.objects:
            if o.type == C.GGML_OBJECT_TYPE_TENSOR:
                yield o.payload

    def used_mem(self) -> int:
        return self._end          # objects_end->offs + objects_end->size (0 without objects)

    def free(self):
        if self.freed:
            return
        for t in self.tensors():
            forget(t)
        if self._finalizer is not None:
            self._finalizer()      # unregisters the arena (once)
        self.freed = True
        if trace.active:
            trace.emit("ctx.free", ctx=id(self))

    def reset(self):
        for t in self.tensors():
            forget(t)
        self.objects = []
        self._end = 0
        self.n_objects = 0

    def __repr__(self):
        return (f"<ggml_context mem_size={self.mem_size} used={self.used_mem()} objects={len(self.objects)} "
                f"no_alloc={self.no_alloc}>")


# ---------------------------------------------------------------- the C API (ggml.h) over Context

def init(mem_size: int, mem_buffer=None, no_alloc: bool = False) -> Context:
    """ggml_init(params): a context whose arena is ``mem_size`` bytes (a NumPy uint8 array)."""
    if isinstance(mem_size, dict):   # ggml_init((struct ggml_init_params){...}) spelled as a dict
        p = mem_size
        return Context(p.get("mem_size", 0), p.get("mem_buffer"), p.get("no_alloc", False))
    return Context(mem_size, mem_buffer, no_alloc)


def free(ctx: Context) -> None:
    ctx.free()


def reset(ctx: Context) -> None:
    ctx.reset()


def used_mem(ctx: Context) -> int:
    return ctx.used_mem()


def get_mem_buffer(ctx: Context):
    """The arena itself (NumPy uint8, zero-copy): ``ggml_get_mem_buffer``."""
    return ctx.mem_buffer


def get_mem_size(ctx: Context) -> int:
    return ctx.mem_size


def get_no_alloc(ctx: Context) -> bool:
    return ctx.no_alloc


def set_no_alloc(ctx: Context, no_alloc: bool) -> None:
    ctx.no_alloc = bool(no_alloc)


def get_max_tensor_size(ctx: Context) -> int:
    return max((nbytes(t) for t in ctx.tensors()), default=0)


def tensor_overhead() -> int:
    return C.GGML_OBJECT_SIZE + C.GGML_TENSOR_SIZE


def new_buffer(ctx: Context, nbytes_: int):
    """ggml_new_buffer: a work-buffer object in the arena; returns its bytes (NumPy view)."""
    nbytes_ = _index(nbytes_, "ggml_new_buffer", "nbytes")
    obj = ctx.new_object(C.GGML_OBJECT_TYPE_WORK_BUFFER, nbytes_)
    return ctx.mem_buffer[obj.offs:obj.offs + nbytes_]


def get_first_tensor(ctx: Context):
    return next(ctx.tensors(), None)


def get_next_tensor(ctx: Context, tensor: Tensor):
    found = False
    for t in ctx.tensors():
        if found:
            return t
        found = t is tensor or t.addr == tensor.addr
    return None


def get_tensor(ctx: Context, name: str):
    for t in ctx.tensors():
        if t.name == name:
            return t
    return None


def _check_new_tensor(fn: str, type_: int, n_dims: int, ne, view_src, view_offs, nb) -> tuple:
    """ggviz: the arguments of ``new_tensor_impl``, checked; returns ``ne`` (GGML_MAX_DIMS integers), the base
    tensor of a view and the absolute offset into it (ggml_new_tensor_impl's first step: a view of a view is a view
    of its base, at the sum of the offsets), ``nb`` as integers (or None), and the data size.

    ggml checks only ``data_size + view_offs <= ggml_nbytes(view_src)``, in size_t arithmetic that wraps, so real
    ggml accepts a negative ne, a size that wraps, a negative offset and strides that leave the source
    (tests/test_misuse_ggml.py shows it); ggviz refuses them:

    * each ``ne[i]`` is an integer in 0..INT64_MAX, and the sizes derived from them (the row size, the strides,
      ``nelements``, the data size) fit int64_t: a 2^31 x 2^31 x 4 F32 tensor has 2^64 elements, which wraps to
      0 in ggml (and would get 0 bytes of data);
    * a view's offset is >= 0 (a negative size_t wraps: ggml builds a view that starts before its source) and
      at most its source's size;
    * ``nb``: every byte the view can reach, ``offset + sum((ne[i]-1)*nb[i]) +`` the element (block) size, must lie
      inside its source, so nothing written through it reaches a neighbour tensor or a header in the arena.

    Without strides ``nb`` is ggml's for a fresh tensor: (type size, row size, row size * ne1, .. * ne2).
    """
    tr = _TRAITS_GET(type_)
    if tr is None or tr[2] == 0:
        raise GGMLError(f"{fn}: invalid ggml_type {type_}")
    if type(n_dims) is not int:
        n_dims = _index(n_dims, fn, "n_dims")
    if not 1 <= n_dims <= C.GGML_MAX_DIMS:
        raise GGMLError(f"{fn}: n_dims must be in 1..{C.GGML_MAX_DIMS}, got {n_dims}")
    n_ne = len(ne)
    if n_ne < n_dims:
        raise GGMLError(f"{fn}: n_dims is {n_dims} but ne has {n_ne} values")
    try:
        ne = list(map(_index_all, ne if n_ne == n_dims else ne[:n_dims]))     # (the callers' ne: no slice)
    except TypeError:
        raise GGMLError(f"{fn}: ne must hold integers, got {list(ne[:n_dims])}") from None
    ne4 = ne + _ONES[n_dims] if n_dims < C.GGML_MAX_DIMS else ne
    ne0, ne1, ne2, ne3 = ne4
    x = ne0 | ne1 | ne2 | ne3             # (< 0: one is negative; > INT64_MAX: one has a bit past 62 -- min and max
    if x < 0 or x > INT64_MAX:            # in one go)
        for x in ne:
            if not 0 <= x <= INT64_MAX:
                raise GGMLError(f"{fn}: ne={ne}: each dimension must be in 0..INT64_MAX"
                                + (" (negative dimension)" if x < 0 else " (does not fit int64_t)"))
    ne = ne4
    _, bs, ts, _ = tr
    if ne0 % bs:
        raise GGMLError(f"{fn}: ne[0] = {ne0} is not a multiple of {type_name(type_)}'s block size {bs}")
    rs = ts * (ne0 // bs)                         # ggml_row_size
    rs2 = rs * ne1 * ne2
    data_size = rs2 * ne3
    if data_size > INT64_MAX or rs2 > INT64_MAX or ne0 * ne1 * ne2 * ne3 > INT64_MAX:
        raise GGMLError(f"{fn}: a {type_name(type_)} tensor of ne={ne} overflows: its size "
                        f"({ne0 * ne1 * ne2 * ne3} elements, {data_size} bytes) does not fit int64_t")
    if view_src is None:
        if nb is not None:
            raise GGMLError(f"{fn}: strides can be given only to a view")
        return ne, None, view_offs, (ts, rs, rs * ne1, rs2), data_size
    if type(view_offs) is not int:
        try:
            view_offs = operator.index(view_offs)
        except TypeError:
            raise GGMLError(f"{fn}: the offset must be an integer, got {view_offs!r}") from None
    if view_offs < 0:
        raise GGMLError(f"{fn}: negative offset {view_offs} into {view_src.name!r} (a size_t in ggml: it "
                        f"would wrap and point before the source)")
    q = view_src._q
    if q.item(_Q_VIEW_SRC):              # measured against the base tensor, as ggml does
        view_offs += q.item(_Q_VIEW_OFFS)
        view_src = view_src.view_src
        q = view_src._q
    # ggml_nbytes(view_src), its ne and nb (words 2..9, int64_t as Tensor.ne / .nb read them) unpacked in one go
    sn0, sn1, sn2, sn3, sb0, sb1, sb2, sb3 = _unpack_ne_nb(q, 16)
    if sn0 <= 0 or sn1 <= 0 or sn2 <= 0 or sn3 <= 0:
        src_size = 0
    else:
        _, sbs, sts, _ = C.TYPE_TRAITS[q.item(0) & 0xFFFFFFFF]
        src_size = ((sts + (sn0 - 1) * sb0) if sbs == 1 else sn0 * sb0 // sbs) \
            + (sn1 - 1) * sb1 + (sn2 - 1) * sb2 + (sn3 - 1) * sb3
    offs = view_offs
    if data_size != 0 and data_size + offs > src_size:
        raise GGMLError(f"{fn}: view of {data_size} bytes at offset {offs} exceeds its source {view_src.name!r} "
                        f"({src_size} bytes)")
    if offs > src_size:
        raise GGMLError(f"{fn}: offset {offs} is past the end of {view_src.name!r} ({src_size} bytes)")
    if nb is not None:
        try:
            nb = list(map(_index_all, nb))
        except TypeError:
            raise GGMLError(f"{fn}: the strides nb must be integers, got {list(nb)}") from None
        if len(nb) == C.GGML_MAX_DIMS:         # (every caller's: the checks below with the strides unpacked)
            nb0, nb1, nb2, nb3 = nb
            x = nb0 | nb1 | nb2 | nb3             # (min and max in one go, as for ne)
            if x < 0 or x > INT64_MAX:
                raise GGMLError(f"{fn}: the strides nb={nb} must be in 0..INT64_MAX (a size_t in ggml)")
        elif nb and (min(nb) < 0 or max(nb) > INT64_MAX):
            raise GGMLError(f"{fn}: the strides nb={nb} must be in 0..INT64_MAX (a size_t in ggml)")
        elif data_size:
            nb0, nb1, nb2, nb3 = nb[0], nb[1], nb[2], nb[3]      # (fewer: the IndexError it always raised)
        if data_size:                             # an empty view reaches no byte
            # ggml_nbytes with these strides: the last byte the view can reach, + 1
            extent = (ne0 * nb0 // bs if bs > 1 else ts + (ne0 - 1) * nb0) \
                + (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3
            if offs + extent > src_size:
                raise GGMLError(
                    f"{fn}: a view of {view_src.name!r} with ne={ne}, nb={nb} at offset {offs} reaches "
                    f"{extent} bytes, up to byte {offs + extent}, beyond its source {view_src.name!r} "
                    f"({src_size} bytes)")
    else:
        nb = (ts, rs, rs * ne1, rs2)
    return ne, view_src, view_offs, nb, data_size


_ONES = {n: [1] * (C.GGML_MAX_DIMS - n) for n in range(1, C.GGML_MAX_DIMS)}
