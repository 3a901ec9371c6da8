"""ggml-alloc: placing tensors in backend buffers, mirrored from ggml-alloc.c (ggml 0.20.2).

Three allocators, as in C:

* ``ggml_tallocr`` (``tallocr_new`` / ``tallocr_alloc``): a bump allocator over one existing buffer; every tensor
  gets the next aligned offset, nothing is ever freed. ``backend_alloc_ctx_tensors_from_buft`` uses it to put all
  tensors of a ``no_alloc`` context (model weights, a KV cache) into one buffer, or several when the buffer type
  has a maximum size.
* ``ggml_dyn_tallocr``: the *planning* allocator behind the graph allocator. It hands out (chunk, offset) pairs
  from sorted lists of free blocks with a best-fit search, merges neighbouring blocks on free, and only records how
  large each chunk would have to be (``max_size``); no memory exists while it runs. A chunk is one backend buffer:
  a buffer type with a maximum buffer size gets several (up to ``GGML_VBUFFER_MAX_CHUNKS``), together a "vbuffer".
* ``ggml_gallocr`` (``gallocr_new`` / ``gallocr_reserve`` / ``gallocr_alloc_graph``): walks a graph in
  execution order, gives each node memory just before it is computed and frees its parents after their last
  consumer, reusing a dying parent's memory in place when the op allows it. ``reserve`` plans and allocates the
  buffers; ``alloc_graph`` replays the plan onto a graph of the same shape (re-planning first if it does not fit).

Function names are C's without the ``ggml_`` prefix, static ones included (``ggml_dyn_tallocr_alloc`` is
``dyn_tallocr_alloc``, ``ggml_gallocr_allocate_node`` is ``gallocr_allocate_node``), so a grep for the C name finds
the Python. ggviz: trace events (``alloc.alloc``, ``alloc.reuse``, ``alloc.free``,
``alloc.view``, ``alloc.needs_realloc``, ``alloc.reserve``) and ``galloc.last_alloc``, a plain-data record of the
last plan (per tensor: chunk, offset, size, the node index where it was allocated and freed, what it reused),
made from the plan's log of notes when first read. A plan reads each tensor's struct once, into its tensor table
(``_PlanTable``), and works on the table's rows.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import trace
from . import backend as B
from . import consts as C
from . import memory
from .graph import GGML_HASHSET_FULL, HashSet, hash_set_new
from .impl import GGML_ASSERT, GGML_PAD, GGMLError
from .tensor import (_Q_BUFFER, _Q_DATA, _Q_SRC, _Q_VIEW_OFFS, _Q_VIEW_SRC, _W_FLAGS, _W_OP, Tensor, gather_structs,
                     nbytes_rows, tensor_at)

SIZE_MAX = (1 << 64) - 1
INT64_MIN = -(1 << 63)
MAX_FREE_BLOCKS = 256
GGML_VBUFFER_MAX_CHUNKS = 16


# ops that return true for this function must not use restrict pointers for their backend implementations
_INPLACE_OPS = frozenset((
    C.GGML_OP_FILL, C.GGML_OP_SCALE, C.GGML_OP_DIAG_MASK_ZERO, C.GGML_OP_DIAG_MASK_INF, C.GGML_OP_ADD,
    C.GGML_OP_ADD_ID, C.GGML_OP_ADD1, C.GGML_OP_SUB, C.GGML_OP_MUL, C.GGML_OP_DIV, C.GGML_OP_SQR, C.GGML_OP_SQRT,
    C.GGML_OP_LOG, C.GGML_OP_UNARY, C.GGML_OP_ROPE, C.GGML_OP_ROPE_BACK, C.GGML_OP_SILU_BACK, C.GGML_OP_RMS_NORM,
    C.GGML_OP_RMS_NORM_BACK, C.GGML_OP_SOFT_MAX, C.GGML_OP_SOFT_MAX_BACK,
))


def op_can_inplace(op: int) -> bool:
    """ggml_op_can_inplace: may this op write its result over one of its inputs? (element-wise-like ops only)"""
    return op in _INPLACE_OPS


def aligned_offset(buffer: int, offset: int, alignment: int) -> int:
    """The first offset >= ``offset`` whose address ``buffer + offset`` is a multiple of ``alignment``.
    With ``buffer == 0`` (NULL) this is GGML_PAD(offset, alignment)."""
    assert alignment and not (alignment & (alignment - 1))   # power of 2
    align = (alignment - ((buffer + offset) % alignment)) % alignment
    return offset + align


def srcs_of(node: Tensor) -> list:
    """ggviz: ``(j, node->src[j])`` for the non-NULL sources, in order -- what the C loops ``for (j = 0; j <
    GGML_MAX_SRC; j++) { src = node->src[j]; if (!src) continue; ... }`` visit, read from the struct's pointer
    array in one go (a Python-level ``node.src[j]`` per slot costs more than the loop bodies)."""
    return [(j, tensor_at(a)) for j, a in enumerate(node._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC].tolist()) if a]




# ==================================================================================================
# tallocr: a bump allocator over one buffer
# ==================================================================================================

class ggml_tallocr:
    """``struct ggml_tallocr { buffer; base; alignment; offset; }``."""
    __slots__ = ("buffer", "base", "alignment", "offset")

    def __init__(self, buffer, base, alignment, offset):
        self.buffer, self.base, self.alignment, self.offset = buffer, base, alignment, offset

    def __repr__(self):
        return f"<ggml_tallocr offset={self.offset} alignment={self.alignment} size={B.backend_buffer_get_size(self.buffer)}>"


def tallocr_new(buffer) -> ggml_tallocr:
    base = B.backend_buffer_get_base(buffer)
    align = B.backend_buffer_get_alignment(buffer)
    assert align and not (align & (align - 1))   # power of 2
    return ggml_tallocr(buffer, base, align, aligned_offset(base, 0, align))


def tallocr_alloc(talloc: ggml_tallocr, tensor: Tensor) -> int:
    size = B.backend_buffer_get_alloc_size(talloc.buffer, tensor)
    size = GGML_PAD(size, talloc.alignment)
    if talloc.offset + size > B.backend_buffer_get_size(talloc.buffer):
        raise GGMLError(f"ggml_tallocr_alloc: not enough space in the buffer to allocate {tensor.name} (needed "
                        f"{size}, available {B.backend_buffer_get_size(talloc.buffer) - talloc.offset})")
    addr = B.backend_buffer_get_base(talloc.buffer) + talloc.offset
    assert addr % talloc.alignment == 0
    if trace.active:
        trace.emit("alloc.tallocr", buffer=talloc.buffer.addr, name=tensor.name, addr=tensor.addr,
                   offset=talloc.offset, size=size)
    # ggviz: the tensor is placed first, the offset advanced after, so that a refused tensor (already allocated, a
    # view) leaves the allocator as it was (ggml advances first; its assertion aborts anyway)
    rc = B.backend_tensor_alloc(talloc.buffer, tensor, addr)
    talloc.offset += size
    return rc


# ==================================================================================================
# dynamic tensor allocator (planning only: offsets, no memory)
# ==================================================================================================

class buffer_address(NamedTuple):
    """Relative memory address within an allocation that can be split into multiple buffers (chunks).
    Immutable, like the C struct passed by value."""
    chunk: int      # index of a backend buffer
    offset: int     # local memory offset within the buffer


GGML_BUFFER_ADDRESS_INVALID = buffer_address(-1, SIZE_MAX)


def buffer_address_less(a: buffer_address, b: buffer_address) -> bool:
    return a.chunk < b.chunk if a.chunk != b.chunk else a.offset < b.offset


class free_block:
    __slots__ = ("offset", "size")

    def __init__(self, offset: int, size: int):
        self.offset, self.size = offset, size

    def __repr__(self):
        return f"free_block(offset={self.offset}, size={self.size})"


class tallocr_chunk:
    """``struct tallocr_chunk``: the free blocks of one chunk, sorted by offset, and its high-water mark.

    The last free block always runs to the end of the chunk's (virtual) space: allocating from it grows the
    chunk (``max_size``); every other block is a hole left by a freed tensor."""
    __slots__ = ("free_blocks", "max_size")

    def __init__(self):
        self.free_blocks: list[free_block] = []     # free_blocks[MAX_FREE_BLOCKS], n_free_blocks = len()
        self.max_size = 0

    @property
    def n_free_blocks(self) -> int:
        return len(self.free_blocks)

    def __repr__(self):
        return f"<tallocr_chunk max_size={self.max_size} free={[(b.offset, b.size) for b in self.free_blocks]}>"


class ggml_dyn_tallocr:
    """``struct ggml_dyn_tallocr { alignment; max_chunk_size; chunks[GGML_VBUFFER_MAX_CHUNKS]; n_chunks; }``."""
    __slots__ = ("alignment", "max_chunk_size", "chunks")

    def __init__(self, alignment: int, max_chunk_size: int):
        self.alignment = alignment
        self.max_chunk_size = max_chunk_size
        self.chunks: list[tallocr_chunk] = []

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    def __repr__(self):
        return f"<ggml_dyn_tallocr alignment={self.alignment} chunks={[c.max_size for c in self.chunks]}>"


def dyn_tallocr_insert_block(chunk: tallocr_chunk, offset: int, size: int) -> None:
    blocks = chunk.free_blocks           # (n_free_blocks: len(blocks))
    n = len(blocks)
    if not (n < MAX_FREE_BLOCKS):
        GGML_ASSERT(False, "out of free blocks")
    # insert the new block in the correct position to keep the array sorted by address (to make merging blocks faster)
    insert_pos = 0
    while insert_pos < n and blocks[insert_pos].offset < offset:
        insert_pos += 1
    # shift all blocks from insert_pos onward to make room for the new block, and insert it
    blocks.insert(insert_pos, free_block(offset, size))


def dyn_tallocr_remove_block(chunk: tallocr_chunk, idx: int) -> None:
    # shift all elements after idx by 1 to the left, overwriting the element at idx
    del chunk.free_blocks[idx]


def dyn_tallocr_new_chunk(alloc: ggml_dyn_tallocr, min_size: int) -> int:
    if alloc.n_chunks >= GGML_VBUFFER_MAX_CHUNKS:
        return -1
    chunk = tallocr_chunk()
    # available space in a chunk is limited to max_chunk_size, but can be higher if:
    # 1. a single tensor exceeds the maximum, and cannot fit any other way
    # 2. we are running out of chunks
    # backends will either manage to allocate the larger size, or report an error.
    size = max(min_size, alloc.max_chunk_size)
    if alloc.n_chunks == GGML_VBUFFER_MAX_CHUNKS - 1:
        size = SIZE_MAX // 2
    chunk.free_blocks.append(free_block(0, size))
    alloc.chunks.append(chunk)
    return alloc.n_chunks - 1


def dyn_tallocr_alloc(alloc: ggml_dyn_tallocr, size: int, tensor: Tensor | None = None) -> buffer_address:
    size = aligned_offset(0, size, alloc.alignment)

    best_fit_chunk = -1
    best_fit_block = -1
    max_avail = 0

    # find the best fitting free block besides the last block, within any chunk
    # (n_chunks / n_free_blocks read as len() of the lists: a plan makes ~400 of these calls)
    chunks = alloc.chunks
    for c in range(len(chunks)):
        blocks = chunks[c].free_blocks
        best_fit_size = SIZE_MAX
        for i in range(len(blocks) - 1):
            block = blocks[i]
            bsize = block.size
            if bsize > max_avail:
                max_avail = bsize
            # "<=": among equal sizes the later block wins
            if bsize >= size and bsize <= best_fit_size:
                best_fit_chunk = c
                best_fit_block = i
                best_fit_size = bsize

    if best_fit_block == -1:
        # no suitable block found, try the last block (this may grow a chunks size)
        best_reuse = INT64_MIN
        for c in range(len(chunks)):
            chunk = chunks[c]
            if chunk.free_blocks:
                block = chunk.free_blocks[-1]
                max_avail = max(max_avail, block.size)
                reuse_factor = chunk.max_size - block.offset - size
                # reuse_factor < 0 : amount of extra memory that needs to be allocated
                # reuse_factor = 0 : allocated free space exactly matches tensor size
                # reuse_factor > 0 : superfluous memory that will remain unused
                better_reuse = best_reuse < 0 and reuse_factor > best_reuse
                better_fit = reuse_factor >= 0 and reuse_factor < best_reuse
                if block.size >= size and (better_reuse or better_fit):
                    best_fit_chunk = c
                    best_fit_block = len(chunk.free_blocks) - 1
                    best_reuse = reuse_factor

    if best_fit_block == -1:
        # none of the existing chunks have enough space left
        best_fit_chunk = dyn_tallocr_new_chunk(alloc, size)
        best_fit_block = 0
    if best_fit_chunk == -1:
        # since the last chunk always has virtually endless memory, this should never happen
        raise GGMLError(f"ggml_dyn_tallocr_alloc: not enough space in the buffer to allocate {size} bytes, largest "
                        f"block available {max_avail} bytes: graph allocation: failed to reserve memory")

    chunk = alloc.chunks[best_fit_chunk]
    block = chunk.free_blocks[best_fit_block]
    addr = buffer_address(best_fit_chunk, block.offset)
    block.offset += size
    block.size -= size
    if block.size == 0:
        # remove block if empty
        dyn_tallocr_remove_block(chunk, best_fit_block)

    chunk.max_size = max(chunk.max_size, addr.offset + size)
    return addr


def dyn_tallocr_free_bytes(alloc: ggml_dyn_tallocr, addr: buffer_address, size: int) -> None:
    """Give [offset, offset+size) of a chunk back. This is a very naive implementation, but for our case the number of
    free blocks should be very small."""
    size = aligned_offset(0, size, alloc.alignment)
    chunk = alloc.chunks[addr.chunk]
    blocks = chunk.free_blocks

    # see if we can merge with an existing block
    for i in range(len(blocks)):
        block = blocks[i]
        # check if ptr is at the end of the block
        if block.offset + block.size == addr.offset:
            block.size += size
            # check if we can merge with the next block
            if i < len(blocks) - 1:
                nxt = blocks[i + 1]
                if block.offset + block.size == nxt.offset:
                    block.size += nxt.size
                    dyn_tallocr_remove_block(chunk, i + 1)
            return
        # check if ptr is at the beginning of the block
        if addr.offset + size == block.offset:
            block.offset = addr.offset
            block.size += size
            # check if we can merge with the previous block
            if i > 0:
                prev = blocks[i - 1]
                if prev.offset + prev.size == block.offset:
                    prev.size += block.size
                    dyn_tallocr_remove_block(chunk, i)
            return
    # otherwise, add a new block
    dyn_tallocr_insert_block(chunk, addr.offset, size)


def dyn_tallocr_reset(alloc: ggml_dyn_tallocr) -> None:
    alloc.chunks = []


def dyn_tallocr_new(alignment: int, max_buffer_size: int) -> ggml_dyn_tallocr:
    alloc = ggml_dyn_tallocr(alignment, min(max_buffer_size, SIZE_MAX // 2))   # clamp to avoid overflows
    dyn_tallocr_reset(alloc)
    return alloc


def dyn_tallocr_free(alloc: ggml_dyn_tallocr) -> None:
    alloc.chunks = []


def dyn_tallocr_max_size(alloc: ggml_dyn_tallocr, chunk: int) -> int:
    return alloc.chunks[chunk].max_size if chunk < alloc.n_chunks else 0


# ==================================================================================================
# virtual buffer with contiguous memory range, split into multiple backend buffers (chunks)
# ==================================================================================================

class vbuffer:
    """``struct vbuffer { ggml_backend_buffer_t chunks[GGML_VBUFFER_MAX_CHUNKS]; }``."""
    __slots__ = ("chunks",)

    def __init__(self):
        self.chunks = [None] * GGML_VBUFFER_MAX_CHUNKS

    def __repr__(self):
        return f"<vbuffer chunks={[B.backend_buffer_get_size(c) for c in self.chunks if c is not None]}>"


def vbuffer_free(buf: vbuffer | None) -> None:
    if buf is None:
        return
    for i in range(GGML_VBUFFER_MAX_CHUNKS):
        B.backend_buffer_free(buf.chunks[i])
        buf.chunks[i] = None


def vbuffer_chunk_size(buf: vbuffer, chunk: int) -> int:
    return B.backend_buffer_get_size(buf.chunks[chunk]) if buf.chunks[chunk] is not None else 0


def vbuffer_size(buf: vbuffer) -> int:
    size = 0
    for c in buf.chunks:
        if c is None:
            break
        size += B.backend_buffer_get_size(c)
    return size


def vbuffer_alloc(buft, talloc: ggml_dyn_tallocr, usage: int) -> vbuffer | None:
    buf = vbuffer()
    for n in range(talloc.n_chunks):
        chunk_size = talloc.chunks[n].max_size
        buf.chunks[n] = B.backend_buft_alloc_buffer(buft, chunk_size)
        if buf.chunks[n] is None:
            vbuffer_free(buf)
            return None
        B.backend_buffer_set_usage(buf.chunks[n], usage)
    return buf


def vbuffer_tensor_alloc(buf: vbuffer, tensor: Tensor, buf_addr: buffer_address) -> None:
    base = B.backend_buffer_get_base(buf.chunks[buf_addr.chunk])
    addr = base + buf_addr.offset
    B.backend_tensor_alloc(buf.chunks[buf_addr.chunk], tensor, addr)


def vbuffer_reset(buf: vbuffer) -> None:
    for c in buf.chunks:
        if c is None:
            break
        B.backend_buffer_reset(c)


# ==================================================================================================
# graph allocator
# ==================================================================================================

_ADDR_ZERO = buffer_address(0, 0)         # (immutable: one object for every zeroed address)


class hash_node:
    """Per-tensor planning state (``struct hash_node``): how many graph nodes still read it (``n_children``), how
    many views of it are still alive (``n_views``), and where it lives once allocated."""
    __slots__ = ("n_children", "n_views", "buffer_id", "addr", "allocated")

    def __init__(self):
        self.n_children = 0
        self.n_views = 0
        self.buffer_id = 0
        self.addr = _ADDR_ZERO
        self.allocated = False

    def __repr__(self):
        return (f"hash_node(n_children={self.n_children}, n_views={self.n_views}, buffer_id={self.buffer_id}, "
                f"addr={tuple(self.addr)}, allocated={self.allocated})")


class tensor_alloc:
    __slots__ = ("buffer_id", "addr", "size_max")

    def __init__(self, buffer_id=0, addr=buffer_address(0, 0), size_max=0):
        self.buffer_id = buffer_id
        self.addr = addr
        self.size_max = size_max     # 0 = pre-allocated, unused, or view

    def __repr__(self):
        return f"tensor_alloc(buffer_id={self.buffer_id}, addr={tuple(self.addr)}, size_max={self.size_max})"


class leaf_alloc:
    __slots__ = ("leaf",)

    def __init__(self):
        self.leaf = tensor_alloc()


class node_alloc:
    __slots__ = ("dst", "src")

    def __init__(self):
        self.dst = tensor_alloc()
        self.src = [tensor_alloc() for _ in range(C.GGML_MAX_SRC)]


class ggml_gallocr:
    """``struct ggml_gallocr``: one buffer type, dynamic allocator and vbuffer per buffer id, the hash table of
    per-tensor planning state, and the plan of the last reserve (``node_allocs`` / ``leaf_allocs``).

    ggviz: ``last_alloc``, plain data describing the last plan (see ``gallocr_alloc_graph_impl``)."""

    def __init__(self):
        self.bufts = []            # [n_buffers]
        self.buffers = []          # [n_buffers] vbuffer or None
        self.buf_tallocs = []      # [n_buffers]
        self.n_buffers = 0
        self.hash_set = HashSet(0, np.zeros(0, np.uint32), np.zeros(0, np.uint64))
        self.hash_values: dict = {}      # slot -> hash_node (ggviz: made on first use; C: an array of hash_set.size)
        self.node_allocs: list[node_alloc] = []    # [n_nodes]
        self.n_nodes = 0
        self.leaf_allocs: list[leaf_alloc] = []    # [n_leafs]
        self.n_leafs = 0
        # ggviz: plain-data record of the last plan (made when first read: last_alloc), and the planning's state
        self._last_alloc = None
        self._phase = "leafs"
        self._index = -1
        # ggviz: address -> its hash_node, for the addresses inserted since the hash set's last reset (the
        # open-addressing probe stays what places it)
        self._slot: dict[int, hash_node] = {}
        # ggviz: the plan lists (node_allocs / leaf_allocs) are also held by a saved plan (gallocr_save_plan): the
        # next reserve makes new lists instead of overwriting these in place
        self._plan_shared = False
        # ggviz: while a plan is made, its tensor table (_PlanTable); during gallocr_alloc_graph, the graph's words
        # (_graph_words); the struct-word scratch arrays the gathers fill (_scratch_rows)
        self._plan = None
        self._graph_words_cache = None
        self._plan_scratch = self._graph_scratch = self._index_scratch = None

    @property
    def last_alloc(self) -> dict | None:
        """ggviz: the last plan as plain data (n_nodes, n_leafs, hash_size, chunk_sizes, reallocated, and per
        tensor a record: chunk, offset, size, the node index where it was allocated and freed, what it reused),
        made on its first read from the plan's log (``_PlanRecordLater``)."""
        la = self._last_alloc
        if type(la) is _PlanRecordLater:
            la = self._last_alloc = la.make()
        return la

    @last_alloc.setter
    def last_alloc(self, value) -> None:
        self._last_alloc = value

    def __repr__(self):
        return (f"<ggml_gallocr n_buffers={self.n_buffers} sizes="
                f"{[gallocr_get_buffer_size(self, i) for i in range(self.n_buffers)]}>")


def gallocr_new_n(bufts, n_bufs: int | None = None) -> ggml_gallocr:
    if n_bufs is None:
        n_bufs = len(bufts)
    galloc = ggml_gallocr()
    galloc.bufts = [None] * n_bufs
    galloc.buffers = [None] * n_bufs
    galloc.buf_tallocs = [None] * n_bufs
    for i in range(n_bufs):
        galloc.bufts[i] = bufts[i]
        galloc.buffers[i] = None
        # check if the same buffer type is used multiple times and reuse the same allocator
        for j in range(i):
            if bufts[i] is bufts[j]:
                galloc.buf_tallocs[i] = galloc.buf_tallocs[j]
                break
        if galloc.buf_tallocs[i] is None:
            alignment = B.backend_buft_get_alignment(bufts[i])
            max_size = B.backend_buft_get_max_size(bufts[i])
            galloc.buf_tallocs[i] = dyn_tallocr_new(alignment, max_size)
    galloc.n_buffers = n_bufs
    return galloc


def gallocr_new(buft) -> ggml_gallocr:
    return gallocr_new_n([buft], 1)


def gallocr_free(galloc: ggml_gallocr | None) -> None:
    if galloc is None:
        return
    for i in range(galloc.n_buffers):
        # skip if already freed (the same buffer type used multiple times shares one vbuffer and one allocator)
        if not any(galloc.buffers[j] is galloc.buffers[i] for j in range(i)):
            vbuffer_free(galloc.buffers[i])
        if not any(galloc.buf_tallocs[j] is galloc.buf_tallocs[i] for j in range(i)):
            dyn_tallocr_free(galloc.buf_tallocs[i])
    galloc.buffers = [None] * galloc.n_buffers
    galloc.hash_values = {}
    galloc._slot = {}
    galloc.node_allocs = []
    galloc.leaf_allocs = []
    galloc._plan_scratch = galloc._graph_scratch = galloc._index_scratch = None     # (ggviz: _scratch_rows)


def gallocr_hash_get(galloc: ggml_gallocr, t: Tensor) -> hash_node:
    """ggml_hash_find_or_insert on the tensor's address, then its hash_node."""
    addr = t.addr
    hn = galloc._slot.get(addr)
    if hn is not None:            # ggviz: found before since the last reset (the probe below would find it again)
        return hn
    i = galloc.hash_set.find_or_insert(addr)
    if i == GGML_HASHSET_FULL:
        raise GGMLError("ggml_hash_find_or_insert: hash set is full")
    # (a slot inserted just now has no node yet: hash_values is emptied whenever the hash set is reset)
    hn = galloc.hash_values.get(i)
    if hn is None:
        hn = galloc.hash_values[i] = hash_node()
    galloc._slot[addr] = hn
    return hn


def gallocr_is_own(galloc: ggml_gallocr, t: Tensor) -> bool:
    return gallocr_hash_get(galloc, t).allocated


def gallocr_is_allocated(galloc: ggml_gallocr, t: Tensor) -> bool:
    return (t.data != 0                        # tensor data already set externally
            or t.buffer != 0                   # tensor on external buffer (but not yet allocated)
            or gallocr_is_own(galloc, t))      # tensor will be allocated by galloc


# ---- ggviz: the plan's tensor table ------------------------------------------------------------------

_NAME_BYTES = slice(256, 256 + C.GGML_MAX_NAME)      # char name[GGML_MAX_NAME] in struct ggml_tensor


class _PlanTable:
    """ggviz: what one plan reads of its tensors, read when it starts. Rows: the graph's leafs, its nodes, then any
    source or view source that is neither (``index``: address -> row); per row the struct words the planning tests
    -- view_src (``vs``, and its row ``vsi``), data, buffer, op, flags, view_offs, the sources as ``(j, row)``
    (``srcs``, nodes), ggml_nbytes -- gathered from one copy of the structs (``q``), and the row's hash_node once it
    was looked up (``hns``). Nothing a plan does writes a tensor struct, so the words hold until it ends: the
    allocator reads each tensor's fields once per plan instead of once per use.

    The plan's record (``last_alloc["tensors"]``) is a log of the notes the planning makes (``log``: tuples), turned
    into the record dicts when it is first read (``_PlanRecordLater``) from the rows' names, ops and flags as the
    plan saw them; with a trace listener (``recs``) each note also updates the records as it is made and is emitted
    as its event, as it happens."""
    __slots__ = ("tensors", "addrs", "index", "m0", "q", "vs", "vsi", "data", "buf", "ops", "flags", "offs", "srcs",
                 "hns", "nbytes", "plain", "own_sizes", "lidx", "nidx", "names", "extra_names", "has_rec", "log",
                 "bounds", "recs", "taken", "hsize", "srow")


def _plan_table(galloc: ggml_gallocr, graph) -> _PlanTable:
    P = _PlanTable()
    nl, nn = graph.n_leafs, graph.n_nodes
    T, addrs_np, q, addrs = _struct_rows(galloc, "_plan_scratch", list(graph.leafs[:nl]), list(graph.nodes[:nn]))
    m = len(T)
    index = dict(zip(addrs, range(m)))
    if len(index) == m:
        lidx, nidx = range(nl), range(nl, m)
    else:                                   # (a tensor twice in the graph: one row, the last)
        lidx, nidx = [index[a] for a in addrs[:nl]], [index[a] for a in addrs[nl:]]
    w32 = q.view(np.int32)
    P.tensors, P.addrs, P.index, P.m0, P.q, P.lidx, P.nidx = T, addrs, index, m, q, lidx, nidx
    vs = P.vs = q[:, _Q_VIEW_SRC].tolist()
    P.data, P.buf, P.offs = q[:, _Q_DATA].tolist(), q[:, _Q_BUFFER].tolist(), q[:, _Q_VIEW_OFFS].tolist()
    P.ops, P.flags = w32[:, _W_OP].tolist(), w32[:, _W_FLAGS].tolist()
    P.hns = [None] * m
    P.taken, P.hsize = {}, galloc.hash_set.size
    P.has_rec = [False] * m
    P.extra_names = []
    P.log = []
    P.bounds = [0, 0]
    P.nbytes = _nbytes_rows(q)
    P.own_sizes = [None if bt is not None and bt.iface.get_alloc_size is None else {} for bt in galloc.bufts]
    P.plain = not any(o is not None for o in P.own_sizes) and (min(P.nbytes) >= 0 if m else True)
    P.srcs = [None] * m
    P.names = None
    P.srow = None
    # the rows' addresses sorted, to find view sources and sources among them at once (a tensor twice in the graph
    # has one row, index's: then they are looked up one by one)
    order = np.argsort(addrs_np)
    sa = addrs_np[order]
    unique = len(index) == m
    last = max(m - 1, 0)
    # each view's view source row
    views = np.flatnonzero(q[:, _Q_VIEW_SRC])
    want = q[views, _Q_VIEW_SRC].astype(np.int64)
    vpos = np.minimum(np.searchsorted(sa, want), last)
    if unique and (sa[vpos] == want).all():
        vsi = np.full(m, -1, np.int64)
        vsi[views] = order[vpos]
        P.vsi = vsi.tolist()
    else:                                   # (a view source that is no leaf or node of the graph: a row of its own)
        P.vsi = [-1] * m
        for k in views.tolist():
            v = index.get(vs[k])
            P.vsi[k] = v if v is not None else _plan_add(P, vs[k])
    # each node's (j, row) of its non-NULL sources, cut into one list per node (np.nonzero gives them node by node,
    # j ascending: enumerate's order); ``srow``: the same as a matrix (-1: NULL), for _plan_slot_arrays
    ptrs = q[nl:, _Q_SRC:_Q_SRC + C.GGML_MAX_SRC]
    ii, jj = np.nonzero(ptrs)
    a = ptrs[ii, jj].astype(np.int64)
    pos = np.minimum(np.searchsorted(sa, a), last)
    if unique and len(P.addrs) == m and (sa[pos] == a).all():
        rows = order[pos]
        pairs = list(zip(jj.tolist(), rows.tolist()))
        cut = [0] + np.cumsum(np.bincount(ii, minlength=nn)).tolist()
        P.srcs[nl:m] = [pairs[lo:hi] for lo, hi in zip(cut, cut[1:])]
        P.srow = np.full((nn, C.GGML_MAX_SRC), -1, np.int64)
        P.srow[ii, jj] = rows
    else:                                   # (a source that is no leaf or node of the graph: a row of its own)
        P.srcs[nl:m] = [[(j, index[a] if a in index else _plan_add(P, a)) for j, a in enumerate(row) if a]
                        for row in ptrs.tolist()]
    for k in nidx:
        if P.srcs[k] is None:
            _plan_srcs(P, k)
    P.names = _plan_names(P) if trace.active else None
    P.recs = {} if trace.active else None
    return P


def _nbytes_rows(q: np.ndarray) -> list:
    """ggml_nbytes of each struct row of ``q`` (uint64 words), -1 where the type has no traits (asked of the
    tensor when needed: ggml_nbytes' own error)."""
    if not len(q):
        return []
    i64 = q.view(np.int64)
    return nbytes_rows(i64[:, 0] & 0xFFFFFFFF, i64[:, 2:6], i64[:, 6:10]).tolist()


def _plan_add(P: _PlanTable, addr: int) -> int:
    """A row for the tensor at ``addr`` (a source or view source outside the graph's leafs and nodes), read from its
    own struct."""
    t = tensor_at(addr)
    k = len(P.addrs)
    q, w = t._q, t._w
    P.tensors.append(t)
    P.addrs.append(addr)
    P.index[addr] = k
    P.vs.append(q.item(_Q_VIEW_SRC))
    P.data.append(q.item(_Q_DATA))
    P.buf.append(q.item(_Q_BUFFER))
    P.offs.append(q.item(_Q_VIEW_OFFS))
    P.ops.append(w.item(_W_OP))
    P.flags.append(w.item(_W_FLAGS))
    P.hns.append(None)
    P.has_rec.append(False)
    P.nbytes.append(-1)
    P.plain = False
    P.srcs.append(None)
    P.vsi.append(-1)
    name = t.name
    P.extra_names.append(name)
    if P.names is not None:
        P.names.append(name)
    vs = P.vs[k]
    if vs:
        v = P.index.get(vs)
        P.vsi[k] = v if v is not None else _plan_add(P, vs)
    return k


def _plan_srcs(P: _PlanTable, k: int) -> list:
    """Row ``k``'s ``(j, row)`` of its non-NULL sources (srcs_of), made when first asked for a row that is no node."""
    s = P.srcs[k]
    if s is None:
        ptrs = (P.q[k, _Q_SRC:_Q_SRC + C.GGML_MAX_SRC] if k < P.m0 else
                P.tensors[k]._q[_Q_SRC:_Q_SRC + C.GGML_MAX_SRC]).tolist()
        index = P.index
        s = P.srcs[k] = [(j, index[a] if a in index else _plan_add(P, a)) for j, a in enumerate(ptrs) if a]
    return s


def _plan_names(P) -> list:
    """Every row's name (the struct's name[] up to its NUL, as Tensor.name reads it)."""
    raw = np.ascontiguousarray(P.q.view(np.uint8).reshape(len(P.q), C.GGML_TENSOR_SIZE)[:, _NAME_BYTES])
    names = [s.partition(b"\0")[0].decode("utf-8", "replace") for s in raw.view(f"S{C.GGML_MAX_NAME}").ravel().tolist()]
    return names + P.extra_names


def _plan_layout(P: _PlanTable, k: int) -> tuple:
    # ggml_are_same_layout's fields: type, ne[], nb[] (as the struct's 64-bit words)
    if k < P.m0:
        r = P.q[k, :10].tolist()
        return r[0] & 0xFFFFFFFF, r[2:10]
    t = P.tensors[k]
    return t.type, [x & 0xFFFFFFFFFFFFFFFF for x in t.ne.tolist() + t.nb.tolist()]


def _plan_hn(galloc: ggml_gallocr, P: _PlanTable, k: int) -> hash_node:
    """gallocr_hash_get of row ``k``'s tensor, kept in its row. The plan's hash set was emptied when it began and
    every tensor the plan looks up has a row, inserted here once: ggml_hash_find_or_insert's probe runs over the
    slots the plan has taken (``P.taken``, slot -> address, in insertion order), the same slots the probe over the
    set's arrays would give, and the arrays get them all at once when the plan ends (``_plan_hash_flush``)."""
    hn = P.hns[k]
    if hn is None:
        addr = P.addrs[k]
        size, taken = P.hsize, P.taken
        i = h = (addr >> 4) % size       # ggml_hash: the low 4 bits of a tensor pointer are always zero
        while i in taken:
            i = (i + 1) % size
            if i == h:
                raise GGMLError("ggml_hash_find_or_insert: hash set is full")
        taken[i] = addr
        # (a slot inserted just now has no node yet: hash_values is emptied whenever the hash set is reset)
        hn = P.hns[k] = galloc.hash_values[i] = hash_node()
        galloc._slot[addr] = hn
    return hn


def _plan_hash_flush(galloc: ggml_gallocr, P: _PlanTable) -> None:
    """Write the slots the plan inserted (``_plan_hn``) into the hash set's keys and used bits."""
    taken = P.taken
    if not taken:
        return
    hs = galloc.hash_set
    slots = np.fromiter(taken.keys(), np.int64, len(taken))
    hs.keys[slots] = np.fromiter(taken.values(), np.uint64, len(taken))
    np.bitwise_or.at(hs.used, slots >> 5, (np.int64(1) << (slots & 31)).astype(np.uint32))


def _plan_size(galloc: ggml_gallocr, P: _PlanTable, buffer_id: int, k: int) -> int:
    """ggml_backend_buft_get_alloc_size(galloc->bufts[buffer_id], tensor): ggml_nbytes from the table for a buffer type
    without a get_alloc_size of its own, else the buffer type's answer, asked once per tensor and buffer id in a plan
    (nothing changes a planned tensor's shape meanwhile)."""
    own = P.own_sizes[buffer_id]
    if own is None:
        n = P.nbytes[k]
        if n < 0:
            n = P.nbytes[k] = B.backend_buft_get_alloc_size(galloc.bufts[buffer_id], P.tensors[k])
        return n
    n = own.get(k)
    if n is None:
        n = own[k] = B.backend_buft_get_alloc_size(galloc.bufts[buffer_id], P.tensors[k])
    return n


# ---- ggviz: the plan record and trace events ---------------------------------------------------------
#
# A note is a tuple appended to the plan's log, (kind, row, ...):
#   (0, k, buffer_id, chunk, offset, size, alloc_size, node)       allocated
#   (1, k, parent, buffer_id, chunk, offset, size, alloc_size, node, via)   took over parent's memory (via: the
#                                                                  view of parent it reads, or -1)
#   (2, k, chunk, offset, size, extra, node)                       freed (extra: the tail of a larger parent)
#   (3, k, node)                                                   a view noted
# ``node``: the node index on the plan's axis (-1: leafs and graph inputs, placed before node 0 runs).

_REC_TEMPLATE = dict(name=None, addr=None, op=None, phase=None, buffer_id=None, chunk=None, offset=None, size=0,
                     alloc_size=0, alloc_node=None, free_node=None, reused_from=None, reused_by=None, view_src=None,
                     view_offs=0, extra_freed=0, output=False, input=False)
_PHASES = ("leafs", "inputs", "nodes")


def _node_index(galloc) -> int:
    # leafs and graph inputs are placed before node 0 runs: they sit at -1 on a node-index axis
    return galloc._index if galloc._phase == "nodes" else -1


def _rec_new(recs: dict, P, k: int, phase: str) -> dict:
    """A tensor's first record: a copy of the template (keys in its order), then the tensor's own values."""
    rec = _REC_TEMPLATE.copy()
    flags = P.flags[k]
    rec["name"], rec["addr"], rec["op"], rec["phase"] = P.names[k], P.addrs[k], P.ops[k], phase
    rec["output"] = bool(flags & C.GGML_TENSOR_FLAG_OUTPUT)
    rec["input"] = bool(flags & C.GGML_TENSOR_FLAG_INPUT)
    recs[k] = rec
    return rec


def _apply_note(recs: dict, P, e: tuple, phase: str) -> None:
    """One note into the records (``recs``: row -> record, in the order the records were made)."""
    kind, k = e[0], e[1]
    if kind == 0:
        rec = recs.get(k) or _rec_new(recs, P, k, phase)
        rec["buffer_id"], rec["chunk"], rec["offset"] = e[2], e[3], e[4]
        rec["size"], rec["alloc_size"], rec["alloc_node"] = e[5], e[6], e[7]
    elif kind == 1:
        pk = e[2]
        p_rec = recs.get(pk) or _rec_new(recs, P, pk, phase)       # (the parent's record first)
        rec = recs.get(k) or _rec_new(recs, P, k, phase)
        p_rec["reused_by"], p_rec["free_node"] = rec["name"], e[8]
        rec["buffer_id"], rec["chunk"], rec["offset"] = e[3], e[4], e[5]
        rec["size"], rec["alloc_size"], rec["alloc_node"] = e[6], e[7], e[8]
        rec["reused_from"] = p_rec["name"]
    elif kind == 2:
        rec = recs.get(k) or _rec_new(recs, P, k, phase)
        if e[5]:
            rec["extra_freed"] += e[4]
        else:
            rec["free_node"] = e[6]
    else:
        if k in recs:
            return
        v = P.vsi[k]
        view_offs = P.offs[k]
        # where the source was planned (None when it is external: already has data, or not planned yet)
        src_rec = recs.get(v)
        rec = _rec_new(recs, P, k, phase)
        if src_rec is not None:
            rec["view_src"] = src_rec["name"]
            rec["buffer_id"], rec["chunk"] = src_rec["buffer_id"], src_rec["chunk"]
            rec["offset"] = src_rec["offset"] + view_offs if src_rec["offset"] is not None else None
        else:
            rec["view_src"] = P.names[v]
        rec["view_offs"] = view_offs
        rec["alloc_node"] = e[2]


def _note(galloc, P: _PlanTable, e: tuple) -> None:
    P.log.append(e)
    if P.recs is not None:
        # a trace listener: the records as they go, and the note as its event
        _apply_note(P.recs, P, e, galloc._phase)
        _emit_note(galloc, P, e)


def _emit_note(galloc, P: _PlanTable, e: tuple) -> None:
    kind, k = e[0], e[1]
    names, addrs = P.names, P.addrs
    head = dict(galloc=id(galloc), phase=galloc._phase, index=galloc._index)
    if kind == 0:
        trace.emit("alloc.alloc", **head, node=e[7], name=names[k], addr=addrs[k], buffer_id=e[2], chunk=e[3],
                   offset=e[4], size=e[5], alloc_size=e[6])
    elif kind == 1:
        pk, via = e[2], e[9]
        trace.emit("alloc.reuse", **head, node=e[8], name=names[k], addr=addrs[k], parent=names[pk],
                   parent_addr=addrs[pk], via=names[via] if via >= 0 else None, buffer_id=e[3], chunk=e[4],
                   offset=e[5], size=e[6])
    elif kind == 2:
        trace.emit("alloc.free", **head, node=e[6], name=names[k], addr=addrs[k], chunk=e[2], offset=e[3],
                   size=e[4], extra=e[5])
    else:
        v = P.vsi[k]
        rec = P.recs[k]
        trace.emit("alloc.view", **head, node=e[2], name=names[k], addr=addrs[k], view_src=names[v],
                   view_src_addr=addrs[v], view_offs=P.offs[k], chunk=rec["chunk"], offset=rec["offset"])


class _PlanRecordLater:
    """ggviz: a plan's ``last_alloc`` before its first read: the head fields and the plan's log of notes with the
    rows' names, addresses, ops, flags, view sources and view offsets as the plan read them (no tensor is read
    again: the graph's memory may hold other tensors by then). ``make`` replays the log into the record dicts, each
    note as ``_apply_note`` applies it while a listener records, so both give the same records."""
    __slots__ = ("head", "names_raw", "extra_names", "names", "addrs", "ops", "flags", "offs", "vsi", "log",
                 "bounds", "made")

    def __init__(self, head: dict, P: _PlanTable):
        self.head = head
        # (a copy: the plan's words lie in a scratch array the next plan overwrites)
        self.names_raw = P.q.view(np.uint8).reshape(len(P.q), C.GGML_TENSOR_SIZE)[:, _NAME_BYTES].copy()
        self.extra_names, self.names = P.extra_names, None
        self.addrs, self.ops, self.flags, self.offs, self.vsi = P.addrs, P.ops, P.flags, P.offs, P.vsi
        self.log, self.bounds = P.log, P.bounds
        self.made = None

    def with_head(self, **fields) -> "_PlanRecordLater":
        other = object.__new__(_PlanRecordLater)
        for s in _PlanRecordLater.__slots__:
            setattr(other, s, getattr(self, s))
        other.head = dict(self.head, **fields)
        other.made = None
        return other

    def make(self) -> dict:
        if self.made is None:
            self.names = [s.partition(b"\0")[0].decode("utf-8", "replace")
                          for s in self.names_raw.view(f"S{C.GGML_MAX_NAME}").ravel().tolist()] + self.extra_names
            recs: dict = {}
            log, (b1, b2) = self.log, self.bounds
            for lo, hi, phase in ((0, b1, "leafs"), (b1, b2, "inputs"), (b2, len(log), "nodes")):
                for p in range(lo, hi):
                    _apply_note(recs, self, log[p], phase)
            self.made = dict(self.head, tensors=list(recs.values()))
        return self.made


def gallocr_last_alloc_update(galloc: ggml_gallocr, **fields) -> None:
    """ggviz: ``galloc.last_alloc`` with ``fields`` replaced (a new dict, or a new record-to-be)."""
    la = galloc._last_alloc
    galloc._last_alloc = new = la.with_head(**fields) if type(la) is _PlanRecordLater else dict(la, **fields)
    c = getattr(galloc, "_slots_cache", None)
    if c is not None and c[1] is la:            # (the plan's slot arrays stay the plan's)
        galloc._slots_cache = (c[0], new) + c[2:]


# ---------------------------------------------------------------------------------------------------

def gallocr_free_extra_space(galloc: ggml_gallocr, P: _PlanTable, k: int, pk: int) -> None:
    """Free the extra space at the end if the new tensor (row ``k``) is smaller than the parent (row ``pk``) whose
    memory it took over."""
    hn, p_hn = P.hns[k], P.hns[pk]

    parent_size = _plan_size(galloc, P, p_hn.buffer_id, pk)
    node_size = _plan_size(galloc, P, hn.buffer_id, k)

    if not (parent_size >= node_size):      # (the message is only formatted when it fails)
        GGML_ASSERT(False, f"{P.tensors[pk].name!r} is smaller than {P.tensors[k].name!r} reusing it")

    # note: we want after the freeing the chunks to continue to be aligned
    p_alloc = galloc.buf_tallocs[p_hn.buffer_id]
    parent_size = aligned_offset(0, parent_size, p_alloc.alignment)
    node_size = aligned_offset(0, node_size, p_alloc.alignment)

    if parent_size > node_size:
        p_addr = buffer_address(p_hn.addr.chunk, p_hn.addr.offset + node_size)
        extra_size = parent_size - node_size
        dyn_tallocr_free_bytes(p_alloc, p_addr, extra_size)
        _note(galloc, P, (2, k, p_addr.chunk, p_addr.offset, extra_size, True, _node_index(galloc)))


def gallocr_allocate_node(galloc: ggml_gallocr, P: _PlanTable, k: int, buffer_id: int) -> None:
    """(ggviz: the tensor as its row ``k`` of the plan's table; ``view_src``, ``data`` and ``buffer`` are tested for
    NULL from the row, the same tests as C's)"""
    if buffer_id < 0:
        GGML_ASSERT(False, "buffer_id >= 0")
    hn = P.hns[k] or _plan_hn(galloc, P, k)

    if P.vs[k]:
        if not P.has_rec[k]:
            P.has_rec[k] = True
            _note(galloc, P, (3, k, _node_index(galloc)))
        return
    # (not ggml_gallocr_is_allocated: no data set externally, no external buffer, not allocated by galloc)
    if P.data[k] or P.buf[k] or hn.allocated:
        return
    hn.allocated = True
    assert hn.addr.offset == 0

    # try to reuse a parent's buffer (inplace)
    if P.ops[k] in _INPLACE_OPS:         # (ggml_op_can_inplace)
        flags, vsi = P.flags, P.vsi
        for _, pk in (P.srcs[k] if P.srcs[k] is not None else _plan_srcs(P, k)):

            # if the node's data is external, then we cannot re-use it (gallocr_is_own)
            p_hn = P.hns[pk] or _plan_hn(galloc, P, pk)
            if not p_hn.allocated:
                continue

            # outputs cannot be reused
            v = vsi[pk]
            if flags[pk] & C.GGML_TENSOR_FLAG_OUTPUT or (v >= 0 and flags[v] & C.GGML_TENSOR_FLAG_OUTPUT):
                continue

            if _plan_layout(P, k) != _plan_layout(P, pk):      # (ggml_are_same_layout)
                continue

            if p_hn.n_children == 1 and p_hn.n_views == 0:
                if v >= 0:                                      # (ggml_impl_is_view(parent))
                    view_src_hn = P.hns[v] or _plan_hn(galloc, P, v)
                    if view_src_hn.n_views == 1 and view_src_hn.n_children == 0 and P.data[v] == P.data[pk]:
                        # reusing view parent (and with it its view_src) for node
                        assert view_src_hn.addr == p_hn.addr
                        hn.buffer_id = p_hn.buffer_id
                        hn.addr = p_hn.addr
                        p_hn.allocated = False   # avoid freeing the parent
                        view_src_hn.allocated = False
                        _note_reuse(galloc, P, k, v, hn, pk)
                        gallocr_free_extra_space(galloc, P, k, v)
                        return
                else:
                    # reusing parent for node
                    hn.buffer_id = p_hn.buffer_id
                    hn.addr = p_hn.addr
                    p_hn.allocated = False   # avoid freeing the parent
                    _note_reuse(galloc, P, k, pk, hn, -1)
                    gallocr_free_extra_space(galloc, P, k, pk)
                    return
    # allocate tensor from the buffer
    alloc = galloc.buf_tallocs[buffer_id]
    size = _plan_size(galloc, P, buffer_id, k)
    hn.buffer_id = buffer_id
    hn.addr = a = dyn_tallocr_alloc(alloc, size)
    P.has_rec[k] = True
    _note(galloc, P, (0, k, buffer_id, a.chunk, a.offset, size, aligned_offset(0, size, alloc.alignment),
                      _node_index(galloc)))


def _note_reuse(galloc, P: _PlanTable, k: int, pk: int, hn: hash_node, via: int) -> None:
    size = _plan_size(galloc, P, hn.buffer_id, k)
    padded = aligned_offset(0, size, galloc.buf_tallocs[hn.buffer_id].alignment)
    P.has_rec[k] = P.has_rec[pk] = True
    a = hn.addr
    _note(galloc, P, (1, k, pk, hn.buffer_id, a.chunk, a.offset, size, padded, _node_index(galloc), via))


def gallocr_free_node(galloc: ggml_gallocr, P: _PlanTable, k: int) -> None:
    # graph outputs are never freed
    if P.flags[k] & C.GGML_TENSOR_FLAG_OUTPUT:
        return

    hn = P.hns[k] or _plan_hn(galloc, P, k)
    buffer_id = hn.buffer_id
    alloc = galloc.buf_tallocs[buffer_id]
    size = _plan_size(galloc, P, buffer_id, k)

    dyn_tallocr_free_bytes(alloc, hn.addr, size)
    hn.allocated = False
    P.has_rec[k] = True
    _note(galloc, P, (2, k, hn.addr.chunk, hn.addr.offset, size, False, _node_index(galloc)))


def get_node_buffer_id(node_buffer_ids, i: int) -> int:
    return node_buffer_ids[i] if node_buffer_ids is not None else 0


def gallocr_alloc_graph_impl(galloc: ggml_gallocr, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> None:
    """Plan the graph: every tensor's (buffer id, chunk, offset), kept in the hash table. (ggviz: the plan's tensor
    table, ``_PlanTable``, is left in ``galloc._plan`` for the rest of the reserve.)"""
    # clear hash tables
    galloc.hash_set.reset()
    # ggviz: a slot's hash_node is made when the slot is first used (C zeroes the whole array; a used slot starts
    # from a fresh node either way)
    galloc.hash_values = {}
    galloc._slot = {}
    P = galloc._plan = _plan_table(galloc, graph)
    hns, vs, data, buf, flags, ops, vsi, srcs = P.hns, P.vs, P.data, P.buf, P.flags, P.ops, P.vsi, P.srcs
    allocate = gallocr_allocate_node

    # allocate leafs
    # these may be tensors that the application is not using in the graph, but may still want to allocate for other purposes
    galloc._phase = "leafs"
    for i, k in enumerate(P.lidx):
        if not vs[k] and (data[k] or buf[k]):
            # (a leaf with data or a buffer of its own -- the weights: gallocr_allocate_node would only find or
            # insert its hash slot; the buffer id check first, as there)
            if get_node_buffer_id(leaf_buffer_ids, i) < 0:
                GGML_ASSERT(False, "buffer_id >= 0")
            hns[k] or _plan_hn(galloc, P, k)
            continue
        galloc._index = i
        allocate(galloc, P, k, get_node_buffer_id(leaf_buffer_ids, i))

    INPUT = C.GGML_TENSOR_FLAG_INPUT
    NONE = C.GGML_OP_NONE

    # count number of children and views
    # allocate other graph inputs and leafs first to avoid overwriting them
    galloc._phase = "inputs"
    P.bounds[0] = len(P.log)
    for i, k in enumerate(P.nidx):
        galloc._index = i

        # TODO: better way to add external dependencies
        # GGML_OP_NONE does not appear normally in the graph nodes, but is used by ggml-backend to add dependencies to
        # control when some tensors are allocated and freed. in this case, the dependencies are in `src`, but the node
        # itself is never used and should not be considered a dependency
        if vs[k] and ops[k] != NONE:
            v = vsi[k]
            (hns[v] or _plan_hn(galloc, P, v)).n_views += 1

        if flags[k] & INPUT:
            allocate(galloc, P, k, get_node_buffer_id(node_buffer_ids, i))

        for _, s in srcs[k]:
            (hns[s] or _plan_hn(galloc, P, s)).n_children += 1

            # allocate explicit inputs
            if flags[s] & INPUT:
                allocate(galloc, P, s, get_node_buffer_id(node_buffer_ids, i))

    # allocate tensors
    galloc._phase = "nodes"
    P.bounds[1] = len(P.log)
    has_rec = P.has_rec
    for i, k in enumerate(P.nidx):
        galloc._index = i
        buffer_id = node_buffer_ids[i] if node_buffer_ids is not None else 0     # (get_node_buffer_id)
        srcs_k = srcs[k]

        # allocate parents (only leafs need to be allocated at this point)
        for _, pk in srcs_k:
            # (the calls gallocr_allocate_node would return from without a change are not made: a parent galloc
            # has allocated -- an earlier node, nearly always --, a view it has noted, a tensor with data or a
            # buffer of its own -- the weights; the counting above made every parent's hash_node)
            if hns[pk].allocated:
                continue
            if vs[pk]:
                if has_rec[pk]:
                    continue
            elif data[pk] or buf[pk]:
                continue
            allocate(galloc, P, pk, buffer_id)

        # allocate node
        # (gallocr_allocate_node's first steps here: the hash_node, then a view is noted, a tensor with data, a
        # buffer or already allocated is left as it is -- ~40 % of the nodes are views)
        if buffer_id < 0:
            GGML_ASSERT(False, "buffer_id >= 0")
        hn = hns[k] or _plan_hn(galloc, P, k)
        if vs[k]:
            if not has_rec[k]:
                has_rec[k] = True
                _note(galloc, P, (3, k, i))
        elif not (data[k] or buf[k] or hn.allocated):
            allocate(galloc, P, k, buffer_id)

        # update parents
        for _, pk in srcs_k:
            p_hn = hns[pk]
            p_hn.n_children -= 1

            if p_hn.n_children == 0 and p_hn.n_views == 0:
                if vs[pk]:
                    v = vsi[pk]
                    view_src_hn = hns[v] or _plan_hn(galloc, P, v)
                    view_src_hn.n_views -= 1
                    if view_src_hn.n_views == 0 and view_src_hn.n_children == 0 and view_src_hn.allocated:
                        gallocr_free_node(galloc, P, v)
                elif p_hn.allocated:
                    gallocr_free_node(galloc, P, pk)


def _invalid_alloc(ta: tensor_alloc) -> None:
    ta.buffer_id = -1
    ta.addr = GGML_BUFFER_ADDRESS_INVALID
    ta.size_max = 0


# ggviz: the tensor_alloc of every source slot ggml writes as invalid (NULL, a view, a tensor with data) -- ~7 of a
# node's GGML_MAX_SRC slots: one object shared by all of them, never written (_set_node_allocs gives a slot that
# becomes valid an object of its own)
_INVALID_SRC_ALLOC = tensor_alloc(-1, GGML_BUFFER_ADDRESS_INVALID, 0)


def _set_node_allocs(galloc: ggml_gallocr, graph, P: _PlanTable) -> None:
    """gallocr_reserve_n_impl's "set the node_allocs from the hash table": each node's and each of its sources'
    tensor_alloc (buffer id, address, size), or an invalid one for a view, a tensor with data or a NULL source.
    (ggviz: each tensor's words, sources, hash_node and size from the plan's table ``P``.)"""
    # ggviz: every field of every tensor_alloc is written below, so a fresh plan's structs are made with their values
    # (object.__new__ and the slots set: no __init__ frame for the ~4,000 of a 1,000-node graph); the invalid
    # source slots are all _INVALID_SRC_ALLOC (the values C writes there)
    fresh = galloc.n_nodes < graph.n_nodes or galloc._plan_shared
    n_nodes = graph.n_nodes
    node_allocs = [None] * n_nodes if fresh else galloc.node_allocs
    if fresh:
        galloc.node_allocs = node_allocs
    galloc.n_nodes = n_nodes
    INVALID = GGML_BUFFER_ADDRESS_INVALID
    INVALID_SRC = _INVALID_SRC_ALLOC
    null_srcs = [INVALID_SRC] * C.GGML_MAX_SRC
    new = object.__new__
    hns, vs, data, srcs = P.hns, P.vs, P.data, P.srcs
    sizes = P.nbytes if P.plain else None
    for i, k in enumerate(P.nidx):
        if fresh:
            na = new(node_alloc)
            na.dst = ta = new(tensor_alloc)
            old = None
            node_allocs[i] = na
        else:
            na = node_allocs[i]
            ta = na.dst
            old = na.src
        na.src = src_tas = null_srcs.copy()
        if vs[k] or data[k]:
            ta.buffer_id, ta.addr, ta.size_max = -1, INVALID, 0          # (_invalid_alloc)
        else:
            hn = hns[k] or _plan_hn(galloc, P, k)
            ta.buffer_id = bid = hn.buffer_id
            ta.addr = hn.addr
            ta.size_max = sizes[k] if sizes is not None else _plan_size(galloc, P, bid, k)
        # node->src[j] for every j: NULL, a view or a tensor with data gets an invalid tensor_alloc
        for j, s in srcs[k]:
            if vs[s] or data[s]:
                continue
            ta = old[j] if old is not None else INVALID_SRC
            if ta is INVALID_SRC:
                ta = new(tensor_alloc)
            src_tas[j] = ta
            hn = hns[s] or _plan_hn(galloc, P, s)
            ta.buffer_id = bid = hn.buffer_id
            ta.addr = hn.addr
            ta.size_max = sizes[s] if sizes is not None else _plan_size(galloc, P, bid, s)


def gallocr_reserve_n_impl(galloc: ggml_gallocr, graph, node_buffer_ids, leaf_buffer_ids, no_alloc: bool) -> bool:
    min_hash_size = graph.n_nodes + graph.n_leafs
    # add 25% margin to avoid hash collisions
    min_hash_size += min_hash_size // 4

    # initialize hash table
    if galloc.hash_set.size < min_hash_size:
        galloc.hash_set = hash_set_new(min_hash_size)
        galloc.hash_values = {}
        galloc._slot = {}

    # reset allocators
    for i in range(galloc.n_buffers):
        dyn_tallocr_reset(galloc.buf_tallocs[i])

    try:
        # allocate in hash table
        gallocr_alloc_graph_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids)
        P = galloc._plan

        # set the node_allocs from the hash table
        _set_node_allocs(galloc, graph, P)
        if galloc.n_leafs < graph.n_leafs or galloc._plan_shared:
            galloc.leaf_allocs = [leaf_alloc() for _ in range(graph.n_leafs)]
        galloc.n_leafs = graph.n_leafs
        galloc._plan_shared = False
        leaf_allocs = galloc.leaf_allocs
        hns, vs, data = P.hns, P.vs, P.data
        for i, k in enumerate(P.lidx):
            hn = hns[k] or _plan_hn(galloc, P, k)
            la = leaf_allocs[i].leaf
            if vs[k] or data[k]:       # (leaf->view_src != NULL || leaf->data != NULL)
                _invalid_alloc(la)
            else:
                la.buffer_id = hn.buffer_id
                la.addr = hn.addr
                la.size_max = _plan_size(galloc, P, hn.buffer_id, k)
        slots = _plan_slot_arrays(P)
    finally:
        P = galloc._plan
        if P is not None:
            _plan_hash_flush(galloc, P)
        galloc._plan = None      # (the plan is made, or failed)

    # reallocate buffers if needed
    reallocated = []
    for i in range(galloc.n_buffers):
        # if the buffer type is used multiple times, we reuse the same buffer
        for j in range(i):
            if galloc.buf_tallocs[j] is galloc.buf_tallocs[i]:
                galloc.buffers[i] = galloc.buffers[j]
                break

        # even if there are no tensors allocated in this buffer, we still need to allocate it to initialize views
        realloc = galloc.buffers[i] is None
        new_size = 0
        for c in range(galloc.buf_tallocs[i].n_chunks):
            cur_chunk_size = vbuffer_chunk_size(galloc.buffers[i], c) if galloc.buffers[i] is not None else 0
            new_chunk_size = dyn_tallocr_max_size(galloc.buf_tallocs[i], c)
            new_size += new_chunk_size
            if new_chunk_size > cur_chunk_size:
                realloc = True
        if realloc:
            cur_size = vbuffer_size(galloc.buffers[i]) if galloc.buffers[i] is not None else 0
            reallocated.append((i, cur_size, new_size))
            vbuffer_free(galloc.buffers[i])
            if no_alloc:
                galloc.buffers[i] = None
            else:
                galloc.buffers[i] = vbuffer_alloc(galloc.bufts[i], galloc.buf_tallocs[i],
                                                  B.GGML_BACKEND_BUFFER_USAGE_COMPUTE)
                if galloc.buffers[i] is None:
                    return False

    # ggviz: the plan as plain data (its tensors' records made when first read, unless a listener has them now)
    head = dict(
        n_nodes=graph.n_nodes, n_leafs=graph.n_leafs, hash_size=galloc.hash_set.size,
        chunk_sizes=[[ch.max_size for ch in galloc.buf_tallocs[i].chunks] for i in range(galloc.n_buffers)],
        reallocated=reallocated,
    )
    galloc.last_alloc = (dict(head, tensors=list(P.recs.values())) if P.recs is not None else
                         _PlanRecordLater(head, P))
    if slots is not None:
        galloc._slots_cache = (galloc.node_allocs, galloc._last_alloc, graph.n_nodes) + slots
    if trace.active:
        trace.emit("alloc.reserve", galloc=id(galloc), n_nodes=graph.n_nodes, n_leafs=graph.n_leafs,
                   chunk_sizes=head["chunk_sizes"], reallocated=reallocated, no_alloc=no_alloc)
    return True


def gallocr_reserve_n_size(galloc: ggml_gallocr, graph, node_buffer_ids, leaf_buffer_ids, sizes=None) -> list:
    """The buffer sizes ``gallocr_reserve_n`` would allocate, written into ``sizes`` (also returned)."""
    galloc._slots_cache = galloc._places_cache = None      # (the plan lists may be rewritten in place: _plan_slots)
    GGML_ASSERT(gallocr_reserve_n_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids, no_alloc=True))
    if sizes is None:
        sizes = [0] * galloc.n_buffers
    for i in range(galloc.n_buffers):
        sizes[i] = 0
        for c in range(galloc.buf_tallocs[i].n_chunks):
            sizes[i] += galloc.buf_tallocs[i].chunks[c].max_size
    return sizes


def gallocr_reserve_n(galloc: ggml_gallocr, graph, node_buffer_ids, leaf_buffer_ids) -> bool:
    galloc._slots_cache = galloc._places_cache = None      # (the plan lists may be rewritten in place: _plan_slots)
    return gallocr_reserve_n_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids, no_alloc=False)


def gallocr_reserve(galloc: ggml_gallocr, graph) -> bool:
    """Plan ``graph`` (a worst-case graph) and allocate the buffers; tensors of ``graph`` are not touched."""
    return gallocr_reserve_n(galloc, graph, None, None)


def gallocr_init_tensor(galloc: ggml_gallocr, tensor: Tensor, ta: tensor_alloc) -> bool:
    """Place ``tensor`` as ``ta`` says (a view: where its source is). ggviz: returns whether the tensor now has its
    place for good (a view of a source without a buffer has not: a later call may still place it), so that
    ``gallocr_alloc_graph`` does not call again for a tensor whose next calls would change nothing."""
    buffer_id = ta.buffer_id
    view_src = tensor.view_src
    data = tensor.data
    # (C asserts `data || view_src || alloc_size <= size_max` here and the size again below: the one check below
    # is that condition, the alloc size worked out once)

    if view_src is not None:
        if tensor.buffer == 0:
            assert ta.addr.offset == SIZE_MAX
            if view_src.buffer == 0:
                # this tensor was allocated without ggml-backend
                return False
            B.backend_view_init(tensor)
    else:
        if data == 0:
            assert B.backend_buft_get_alloc_size(galloc.bufts[buffer_id], tensor) <= ta.size_max
            assert ta.addr.offset != SIZE_MAX
            vbuffer_tensor_alloc(galloc.buffers[buffer_id], tensor, ta.addr)
        else:
            if tensor.buffer == 0:
                # this tensor was allocated without ggml-backend
                return True
    return True


def gallocr_node_needs_realloc(galloc: ggml_gallocr, node: Tensor, talloc: tensor_alloc) -> bool:
    """Despite its name, True when the planned slot still fits ``node`` (the tensor is *valid*)."""
    node_size = 0
    if not node.data and node.view_src is None:
        # If we previously had data but don't now then reallocate
        if talloc.buffer_id < 0:
            return False
        node_size = B.backend_buft_get_alloc_size(galloc.bufts[talloc.buffer_id], node)
    return talloc.size_max >= node_size


def _misfit(galloc: ggml_gallocr, graph) -> str | None:
    """ggml's own check, tensor by tensor (gallocr_node_needs_realloc of every node and of each of its sources, in
    graph order): the message naming the first tensor whose slot does not fit, None when all fit. Same node count
    assumed."""
    for i in range(graph.n_nodes):
        node = graph.nodes[i]
        na = galloc.node_allocs[i]
        if not gallocr_node_needs_realloc(galloc, node, na.dst):
            return f"node {node.name} is not valid"
        for j, src in srcs_of(node):
            if not gallocr_node_needs_realloc(galloc, src, na.src[j]):
                return f"src {j} ({src.name}) of node {node.name} is not valid"
    return None


def _plan_fits(galloc: ggml_gallocr, graph) -> bool:
    """Whether ggml's per-tensor check (``_misfit``) finds every tensor fitting its slot."""
    return _misfit(galloc, graph) is None


# ggviz: the plan's slots as arrays, for _plan_fits_arrays. A plan is checked against every graph allocated with it
# (a prompt's, then the decode step's ...): its ~10,000 tensor_alloc fields are read into two arrays once per plan
# (the plan lists and the plan's record, by identity: a reserve or a restored plan gives new ones; a reserve
# drops the arrays before it starts, as it may rewrite the lists in place)
_SLOTS = 1 + C.GGML_MAX_SRC


def _plan_slot_arrays(P: _PlanTable):
    """``_plan_slots``' arrays made from the plan's table as the reserve ends (rows' buffer ids and sizes gathered
    by each node's own row and its sources' rows, invalid where C writes an invalid tensor_alloc: a view, a tensor
    with data, a NULL source) instead of read back from the ~11,000 tensor_alloc objects when the plan is first
    checked; None when the table is not the plain case (a buffer type with its own alloc size, a type without
    traits, a source outside the graph, a tensor twice in it)."""
    m = P.m0
    if not m or not P.plain or len(P.addrs) != m or type(P.nidx) is not range or P.srow is None:
        return None
    n = len(P.nidx)
    nl = m - n
    q = P.q
    rbid = np.fromiter((hn.buffer_id if hn is not None else 0 for hn in P.hns), np.int64, m)
    rsz = np.array(P.nbytes, np.int64)
    valid = (q[:, _Q_VIEW_SRC] == 0) & (q[:, _Q_DATA] == 0)
    present = P.srow >= 0
    rows = np.empty((n, _SLOTS), np.int64)
    rows[:, 0] = np.arange(nl, m)
    rows[:, 1:] = np.where(present, P.srow, 0)
    ok = np.concatenate([np.ones((n, 1), bool), present], axis=1) & valid[rows]
    return np.where(ok, rbid[rows], -1), np.where(ok, rsz[rows], 0)


def _plan_slots(galloc: ggml_gallocr):
    """(buffer ids, size_max) of every node's dst and src slots in the current plan, n_nodes x (1 + GGML_MAX_SRC)."""
    na, rec, n = galloc.node_allocs, galloc._last_alloc, galloc.n_nodes
    c = getattr(galloc, "_slots_cache", None)
    if c is not None and c[0] is na and c[1] is rec and c[2] == n:
        return c[3], c[4]
    flat = [ta for a in na[:n] for ta in (a.dst, *a.src)]
    bid = np.fromiter((ta.buffer_id for ta in flat), np.int64, len(flat)).reshape(n, _SLOTS)
    smax = np.fromiter((ta.size_max for ta in flat), np.int64, len(flat)).reshape(n, _SLOTS)
    galloc._slots_cache = (na, rec, n, bid, smax)
    return bid, smax


class _GraphWords:
    """The graph's leafs then nodes (``T``), their struct words (``W``, int64 rows), addresses and the addresses
    sorted (``order``, ``sa``), with what both the plan check and the placing derive from them (each node's source
    pointers found among the addresses, each tensor's ggml_nbytes) made once."""
    __slots__ = ("T", "W", "addrs", "order", "sa", "nl", "_srcs", "_nbytes")

    def srcs(self):
        """(srcs, present, pos, row): each node's source pointers, which are non-NULL, where each falls in ``sa``
        and the row found there."""
        if self._srcs is None:
            srcs = self.W[self.nl:, _Q_SRC:_Q_SRC + C.GGML_MAX_SRC]
            pos = np.minimum(np.searchsorted(self.sa, srcs), len(self.sa) - 1)
            self._srcs = (srcs, srcs != 0, pos, self.order[pos])
        return self._srcs

    def nbytes(self):
        """ggml_nbytes of every row, -1 for a type without traits."""
        if self._nbytes is None:
            W = self.W
            self._nbytes = nbytes_rows(W[:, 0] & 0xFFFFFFFF, W[:, 2:6], W[:, 6:10])
        return self._nbytes


def _scratch_rows(galloc: ggml_gallocr, name: str, m: int, dtype=np.uint64) -> np.ndarray:
    """``m`` rows of GGML_TENSOR_SIZE / 8 words from the allocator's scratch array ``name``, grown when too small:
    the gathers of every plan and every alloc_graph go into memory the process has already touched (a fresh
    ~400 KB array costs its page faults each time, more than the gather itself)."""
    a = getattr(galloc, name, None)
    if a is None or len(a) < m:
        a = np.empty((max(m, 64) + m // 4, C.GGML_TENSOR_SIZE // 8), dtype)
        setattr(galloc, name, a)
    return a[:m]


def _struct_rows(galloc: ggml_gallocr, name: str, leafs: list, nodes: list):
    """(tensors, addresses, struct words) of ``leafs + nodes``, the words in the scratch array ``name`` (and the
    addresses as a list, ``_plan_table``'s)."""
    nl, m = len(leafs), len(leafs) + len(nodes)
    T = leafs + nodes
    addr_list = [t.addr for t in T]
    addrs = np.array(addr_list, np.int64) if m else np.zeros(0, np.int64)
    W = _scratch_rows(galloc, name, m)
    if nl:
        gather_structs(leafs, addrs[:nl], W[:nl], _scratch_rows(galloc, "_index_scratch", nl, np.intp))
    if m > nl:
        gather_structs(nodes, addrs[nl:], W[nl:], _scratch_rows(galloc, "_index_scratch", len(nodes), np.intp))
    return T, addrs, W, addr_list


def _graph_words(galloc: ggml_gallocr, graph):
    """The graph's ``_GraphWords``: read once per ``gallocr_alloc_graph`` for its plan check (``_plan_fits_arrays``)
    and its placing (``_alloc_graph_tensors_arrays``) -- neither the check nor a reserve writes a struct in between.
    None for an empty graph."""
    c = getattr(galloc, "_graph_words_cache", None)
    if c is not None and c[0] is graph:
        return c[1]
    n, nl = graph.n_nodes, graph.n_leafs
    leafs, nodes = list(graph.leafs[:nl]), list(graph.nodes[:n])
    m = nl + n
    if not m:
        return None
    G = _GraphWords()
    G.T, addrs, W, _ = _struct_rows(galloc, "_graph_scratch", leafs, nodes)
    G.addrs, G.W = addrs, W.view(np.int64)
    G.order = np.argsort(addrs)
    G.sa = addrs[G.order]
    G.nl = nl
    G._srcs = G._nbytes = None
    return G


def _plan_fits_arrays(galloc: ggml_gallocr, graph):
    """``_plan_fits`` over all slots at once: each tensor's size (0 with data or a view source, else ggml_nbytes)
    from the struct words of the graph's nodes and leafs, against the plan's slots (``_plan_slots``). None when it
    cannot tell: a buffer type with a get_alloc_size of its own, a source that is no node or leaf of the graph, a
    type without traits."""
    if any(bt.iface.get_alloc_size is not None for bt in galloc.bufts):
        return None
    n, nl = graph.n_nodes, graph.n_leafs
    G = _graph_words(galloc, graph)
    if G is None:
        return True
    W, sa = G.W, G.sa
    srcs, present, pos, row = G.srcs()
    if (present & (sa[pos] != srcs)).any():
        return None
    nbytes = G.nbytes()
    if (nbytes < 0).any():
        return None
    # each tensor's size; _UNCHECKED for one with data or a view source (size 0: no slot is smaller)
    size = np.where((W[:, _Q_DATA] != 0) | (W[:, _Q_VIEW_SRC] != 0), _UNCHECKED, nbytes)
    bid, smax = _plan_slots(galloc)
    # each node as itself, then as the source of each of its consumers (gallocr_node_needs_realloc); a NULL source
    # slot is not checked
    sz = np.empty((n, _SLOTS), np.int64)
    sz[:, 0] = size[nl:nl + n]
    sz[:, 1:] = np.where(present, size[row], _UNCHECKED)
    bad = (sz != _UNCHECKED) & ((bid < 0) | (smax < sz))
    return not bad.any()


_UNCHECKED = np.iinfo(np.int64).min


def _realloc_reason(galloc: ggml_gallocr, graph) -> str | None:
    if galloc.n_nodes != graph.n_nodes:
        return "graph has different number of nodes"
    if galloc.n_leafs != graph.n_leafs:
        return "graph has different number of leafs"
    if _plan_fits_arrays(galloc, graph):
        return None
    # (it does not fit, or the arrays cannot tell: ggml's own checks decide, and name the tensor)
    return _misfit(galloc, graph)


def gallocr_needs_realloc(galloc: ggml_gallocr, graph) -> bool:
    """Does ``graph`` not fit the last plan? (different node/leaf counts, or a tensor larger than its slot)"""
    reason = _realloc_reason(galloc, graph)
    if reason is not None and trace.active:
        trace.emit("alloc.needs_realloc", galloc=id(galloc), reason=reason)   # GGML_LOG_DEBUG in C
    return reason is not None


def gallocr_alloc_graph(galloc: ggml_gallocr, graph) -> bool:
    """Give every tensor of ``graph`` its memory from the plan (planning again first if the graph does not fit).
    (ggviz: the graph's struct words are read once for the check and the placing, ``_graph_words``.)"""
    galloc._graph_words_cache = (graph, _graph_words(galloc, graph)) if not trace.active else None
    try:
        if gallocr_needs_realloc(galloc, graph):
            if galloc.n_buffers == 1:
                # reallocating buffers automatically
                if not gallocr_reserve(galloc, graph):
                    return False
            else:
                # cannot reallocate multi buffer graph automatically, call reserve
                return False

        # reset buffers
        for i in range(galloc.n_buffers):
            if galloc.buffers[i] is not None:
                vbuffer_reset(galloc.buffers[i])

        # allocate the graph tensors from the previous assignments
        if trace.active:
            # (a trace listener sees every placement made by ggml's own calls)
            _alloc_graph_tensors(galloc, graph)
        elif not _alloc_graph_tensors_arrays(galloc, graph):
            _alloc_graph_tensors_fast(galloc, graph)
        return True
    finally:
        galloc._graph_words_cache = None


def _plan_places(galloc: ggml_gallocr):
    """(buffer id, chunk, offset, size_max) of every node's dst slot and of every leaf's slot in the current plan,
    as arrays (offsets as uint64: SIZE_MAX marks no place), kept with the plan as ``_plan_slots`` keeps its."""
    na, la, rec, n, nl = galloc.node_allocs, galloc.leaf_allocs, galloc._last_alloc, galloc.n_nodes, galloc.n_leafs
    c = getattr(galloc, "_places_cache", None)
    if c is not None and c[0] is na and c[1] is la and c[2] is rec and c[3] == (n, nl):
        return c[4]
    tas = [a.dst for a in na[:n]] + [a.leaf for a in la[:nl]]
    m = len(tas)
    out = (np.fromiter((t.buffer_id for t in tas), np.int64, m), np.fromiter((t.addr.chunk for t in tas), np.int64, m),
           np.fromiter((t.addr.offset for t in tas), np.uint64, m), np.fromiter((t.size_max for t in tas), np.int64, m))
    galloc._places_cache = (na, la, rec, (n, nl), out)
    return out


def _alloc_graph_tensors_arrays(galloc: ggml_gallocr, graph) -> bool:
    """ggviz: ``_alloc_graph_tensors``' results (each tensor's ``buffer`` and ``data``) for a graph in the plain
    case, worked out over all tensors at once and written straight into the structs; False, with nothing written,
    when the graph is not that case (then the per-tensor loop runs). The plain case: every node's source is a leaf
    or an earlier node -- so the loop reaches every tensor first as itself (the leafs, then each node after its
    sources) and places it with its own slot --; a tensor to place is either not a view, without buffer, and its
    slot is a place in a chunk whose buffer has no init_tensor hook (the leafs, placed by ``gallocr_init_tensor``,
    also pass its checks: their size fits the slot and the chunk), or a view without buffer whose source is placed
    before it (it gets the source's buffer and data + view_offs); the buffer types have no alloc size of their own.
    The other tensors keep their buffer and data (weights, the KV cache, views already placed)."""
    if any(bt.iface.get_alloc_size is not None for bt in galloc.bufts):
        return False
    n, nl = graph.n_nodes, graph.n_leafs
    G = _graph_words(galloc, graph)
    if G is None or galloc.n_nodes != n or galloc.n_leafs != nl:
        return False
    T, W, addrs, order, sa = G.T, G.W, G.addrs, G.order, G.sa
    m = len(T)
    if m > 1 and (sa[1:] == sa[:-1]).any():
        return False                                  # (a tensor twice in the graph)
    # every source a leaf or an earlier node
    srcs, present, pos, row = G.srcs()
    if (present & ((sa[pos] != srcs) | (row >= nl + np.arange(n)[:, None]))).any():
        return False
    vs, data, buf = W[:, _Q_VIEW_SRC], W[:, _Q_DATA], W[:, _Q_BUFFER]
    plain = (vs == 0) & (data == 0)
    if (plain & (buf != 0)).any():
        return False                                  # (backend_tensor_alloc refuses a tensor with a buffer)
    new_buf, new_data = buf.copy(), data.copy()
    if not _place_planned(galloc, G, np.flatnonzero(plain), nl, n, new_buf, new_data):
        return False
    if not _place_views(W, sa, order, np.flatnonzero((vs != 0) & (buf == 0)), new_buf, new_data):
        return False
    _write_places(T, addrs, np.flatnonzero((new_buf != buf) | (new_data != data)), new_buf, new_data)
    return True


def _place_planned(galloc, G, todo, nl, n, new_buf, new_data) -> bool:
    """_alloc_graph_tensors_arrays' planned tensors (rows ``todo`` of the table: leafs, then nodes): chunk base +
    offset of their own slot into ``new_buf`` / ``new_data``; False when one is not the plain case."""
    if not todo.size:
        return True
    bid, chunk, offs, smax = (np.concatenate([x[n:], x[:n]]) for x in _plan_places(galloc))    # (table order)
    if (bid[todo] < 0).any() or (bid[todo] >= galloc.n_buffers).any() or (offs[todo] == SIZE_MAX).any():
        return False
    pairs = {}
    for b, ch in set(zip(bid[todo].tolist(), chunk[todo].tolist())):
        vb = galloc.buffers[b]
        if vb is None or not 0 <= ch < len(vb.chunks) or vb.chunks[ch] is None:
            return False
        cb = vb.chunks[ch]
        if cb.iface.init_tensor is not None:
            return False
        pairs[(b, ch)] = (cb.addr, B.backend_buffer_get_base(cb), B.backend_buffer_get_size(cb))
    key = bid[todo] * (1 << 20) + chunk[todo]
    uk, inv = np.unique(key, return_inverse=True)
    info = np.array([pairs[(int(k) >> 20, int(k) & ((1 << 20) - 1))] for k in uk.tolist()], np.int64)
    inv = inv.ravel()
    new_buf[todo] = info[inv, 0]
    new_data[todo] = info[inv, 1] + offs[todo].astype(np.int64)
    # the leafs go through gallocr_init_tensor: their alloc size fits the slot (C's assert) and the chunk
    lv = todo[todo < nl]
    if lv.size:
        nbytes = G.nbytes()[lv]
        if (nbytes < 0).any():
            return False
        li = np.searchsorted(todo, lv)
        if ((nbytes > smax[lv]) | (new_data[lv] + nbytes > info[inv[li], 1] + info[inv[li], 2])).any():
            return False
    return True


def _place_views(W, sa, order, views, new_buf, new_data) -> bool:
    """_alloc_graph_tensors_arrays' views without a buffer (rows ``views``): their source's buffer and data +
    view_offs, the source placed before the view (in the table, or outside it with its data); False otherwise."""
    if not views.size:
        return True
    m = len(W)
    vs = W[views, _Q_VIEW_SRC]
    vpos = np.minimum(np.searchsorted(sa, vs), m - 1)
    inside = sa[vpos] == vs
    vrow = np.where(inside, order[vpos], -1)
    if (inside & (vrow >= views)).any():
        return False
    for k in np.flatnonzero(~inside).tolist():
        q = tensor_at(int(vs[k]))._q
        ext_b, ext_d = q.item(_Q_BUFFER), q.item(_Q_DATA)
        if not ext_b or not ext_d:
            return False
        new_buf[views[k]] = ext_b
        new_data[views[k]] = ext_d + W[views[k], _Q_VIEW_OFFS]
    # in rounds: the views whose source is placed (a view of a view waits for its source's round)
    v, r = views[inside], vrow[inside]
    waiting = np.zeros(m, bool)
    while v.size:
        waiting[:] = False
        waiting[v] = True
        ready = ~waiting[r]
        if not ready.any():
            return False
        vr, rr = v[ready], r[ready]
        if ((new_buf[rr] == 0) | (new_data[rr] == 0)).any():
            return False
        new_buf[vr] = new_buf[rr]
        new_data[vr] = new_data[rr] + W[vr, _Q_VIEW_OFFS]
        v, r = v[~ready], r[~ready]
    return True


def _write_places(T, addrs, rows, new_buf, new_data) -> None:
    """Write the buffer and data words of tensors ``rows``: at once where their structs lie in one buffer (a
    graph's context), else one by one."""
    if not rows.size:
        return
    at = addrs[rows]
    lo, hi = int(at.min()), int(at.max()) + C.GGML_TENSOR_SIZE
    try:
        arr, off, _ = memory.resolve(lo, hi - lo)
    except ValueError:
        arr = None
    words = None
    if (arr is not None and arr.dtype == np.uint8 and arr.ndim == 1 and arr.ctypes.data % 8 == 0
            and ((at - (lo - off)) % 8 == 0).all()):
        words = arr.view(np.uint64)
    if words is not None:
        wi = (at - (lo - off)) // 8
        words[wi + _Q_BUFFER] = new_buf[rows].astype(np.uint64)
        words[wi + _Q_DATA] = new_data[rows].astype(np.uint64)
    else:
        for k in rows.tolist():
            w = T[k]._q
            w[_Q_BUFFER] = int(new_buf[k])
            w[_Q_DATA] = int(new_data[k])


def _alloc_graph_tensors(galloc: ggml_gallocr, graph) -> None:
    """gallocr_alloc_graph's placing loop, call by call as in C."""
    # ggviz: a tensor is placed by the first call that reaches it (a node as the source of its consumers, a leaf
    # ...); the calls after that change nothing (its data is set), so they are skipped -- ~2,800 calls per graph
    # to ~1,000
    placed = set()
    # leafs
    for i in range(graph.n_leafs):
        leaf = graph.leafs[i]
        if gallocr_init_tensor(galloc, leaf, galloc.leaf_allocs[i].leaf):
            placed.add(leaf.addr)
    # nodes
    for i in range(graph.n_nodes):
        node = graph.nodes[i]
        na = galloc.node_allocs[i]
        for j, src in srcs_of(node):
            if src.addr not in placed and gallocr_init_tensor(galloc, src, na.src[j]):
                placed.add(src.addr)
        if node.addr not in placed and gallocr_init_tensor(galloc, node, na.dst):
            placed.add(node.addr)


def _alloc_graph_tensors_fast(galloc: ggml_gallocr, graph) -> None:
    """ggviz: what ``_alloc_graph_tensors`` does, in the same order and with the same results (each tensor's
    ``buffer`` and ``data``), with fewer Python operations per tensor: one read of a node's struct words gives its
    sources, view source, buffer and data; a planned tensor gets ``data = chunk base + offset`` and a view
    ``data = its source's data + view_offs``, written straight into the struct. What the plain cases do not cover
    -- a leaf placed by the plan (its size is checked against the plan, as C asserts), a view whose source has no
    buffer or no data yet, a tensor that already has a buffer, a buffer type with an ``init_tensor`` hook, a source
    not placed yet -- goes through ``gallocr_init_tensor`` as in ``_alloc_graph_tensors``. Before this runs, the
    plan fits the graph (``gallocr_needs_realloc`` checked every node and source, or the plan was just made for
    it), which is what C's size asserts check again."""
    placed = set()
    new = {}          # address -> (buffer, data) of the tensors placed by this call
    chunk_of = {}     # (buffer_id, chunk) -> (chunk buffer's address, its base) for buffers without init_tensor
    no_init = {}      # buffer address -> does its type have no init_tensor hook

    def place(t, q, ta) -> bool:
        """Place the tensor with struct words ``q`` (a list); False when only gallocr_init_tensor can."""
        vs = q[_Q_VIEW_SRC]
        if vs:
            if q[_Q_BUFFER]:               # a view with a buffer already: gallocr_init_tensor changes nothing
                placed.add(t.addr)
                return True
            r = new.get(vs)
            if r is None:
                s = tensor_at(vs)._q
                r = (s.item(_Q_BUFFER), s.item(_Q_DATA))
            rb, rd = r
            if not rb or not rd:
                return False
            ok = no_init.get(rb)
            if ok is None:
                ok = no_init[rb] = B.buffer_at(rb).iface.init_tensor is None
            if not ok:
                return False
            d = rd + q[_Q_VIEW_OFFS]
        else:
            if q[_Q_DATA]:                 # placed outside this allocator (a weight, the KV cache, ...)
                placed.add(t.addr)
                return True
            if q[_Q_BUFFER]:
                return False               # (backend_tensor_alloc refuses it)
            key = (ta.buffer_id, ta.addr.chunk)
            c = chunk_of.get(key)
            if c is None:
                buf = galloc.buffers[ta.buffer_id].chunks[ta.addr.chunk]
                if buf.iface.init_tensor is not None:
                    return False
                c = chunk_of[key] = (buf.addr, B.backend_buffer_get_base(buf))
            rb, d = c[0], c[1] + ta.addr.offset
        w = t._q
        w[_Q_BUFFER] = rb
        w[_Q_DATA] = d
        new[t.addr] = (rb, d)
        placed.add(t.addr)
        return True

    # leafs
    for i in range(graph.n_leafs):
        leaf = graph.leafs[i]
        q = leaf._q.tolist()
        if q[_Q_VIEW_SRC] or q[_Q_DATA]:
            if place(leaf, q, None):
                continue
        if gallocr_init_tensor(galloc, leaf, galloc.leaf_allocs[i].leaf):
            placed.add(leaf.addr)
    # nodes
    node_allocs = galloc.node_allocs
    for i in range(graph.n_nodes):
        node = graph.nodes[i]
        q = node._q.tolist()
        na = node_allocs[i]
        for j in range(C.GGML_MAX_SRC):
            a = q[_Q_SRC + j]
            if a and a not in placed:
                src = tensor_at(a)
                if gallocr_init_tensor(galloc, src, na.src[j]):
                    placed.add(a)
        if node.addr not in placed and not place(node, q, na.dst) and gallocr_init_tensor(galloc, node, na.dst):
            placed.add(node.addr)


def gallocr_get_buffer_size(galloc: ggml_gallocr, buffer_id: int) -> int:
    GGML_ASSERT(0 <= buffer_id < galloc.n_buffers, "buffer_id >= 0 && buffer_id < galloc->n_buffers")
    if galloc.buffers[buffer_id] is None:
        return 0
    for i in range(buffer_id):
        if galloc.buffers[i] is galloc.buffers[buffer_id]:
            # this buffer is the same as a previous one due to the same buffer type being used multiple times
            # only return the buffer size the first time it appears to avoid double counting
            return 0
    return vbuffer_size(galloc.buffers[buffer_id])


# ==================================================================================================
# utils: every tensor of a context in one (or a few) buffers
# ==================================================================================================

class gallocr_plan:
    """ggviz: the plan of one graph, as ``gallocr_reserve_n`` left it -- node/leaf
    allocations, the dynamic allocators' chunks, the plain-data record (``last_alloc``) -- and the buffers it
    points into. A context that keeps several allocated graphs (llama's graph cache) puts a graph's plan back when
    it computes that graph again, so that the allocator reports the plan the graph really runs with."""
    __slots__ = ("node_allocs", "n_nodes", "leaf_allocs", "n_leafs", "chunks", "last_alloc", "buffers", "slots")


def gallocr_save_plan(galloc: ggml_gallocr) -> gallocr_plan:
    """The current plan (shared with ``galloc`` until its next reserve, which then makes new lists)."""
    p = gallocr_plan()
    p.node_allocs, p.n_nodes = galloc.node_allocs, galloc.n_nodes
    p.leaf_allocs, p.n_leafs = galloc.leaf_allocs, galloc.n_leafs
    # dyn_tallocr_reset replaces the chunk list, but the chunks themselves are mutated while planning: copy them
    p.chunks = [[_chunk_copy(ch) for ch in ta.chunks] for ta in galloc.buf_tallocs]
    p.last_alloc = galloc._last_alloc           # (as it is: made when first read)
    c = getattr(galloc, "_slots_cache", None)
    p.slots = c if c is not None and c[0] is p.node_allocs and c[1] is p.last_alloc and c[2] == p.n_nodes else None
    p.buffers = list(galloc.buffers)
    galloc._plan_shared = True
    return p


def _chunk_copy(ch: tallocr_chunk) -> tallocr_chunk:
    c = tallocr_chunk()
    c.free_blocks = [free_block(b.offset, b.size) for b in ch.free_blocks]
    c.max_size = ch.max_size
    return c


def gallocr_plan_valid(galloc: ggml_gallocr, plan: gallocr_plan) -> bool:
    """Do the plan's tensors still point into ``galloc``'s buffers (none was reallocated since the plan)?"""
    return len(plan.buffers) == len(galloc.buffers) and all(a is b for a, b in zip(plan.buffers, galloc.buffers))


def gallocr_restore_plan(galloc: ggml_gallocr, plan: gallocr_plan) -> None:
    """Make ``plan`` the current plan again (as if its graph had just been reserved); the plan object is spent."""
    GGML_ASSERT(gallocr_plan_valid(galloc, plan), "gallocr_restore_plan: the buffers were reallocated since the plan")
    galloc.node_allocs, galloc.n_nodes = plan.node_allocs, plan.n_nodes
    galloc.leaf_allocs, galloc.n_leafs = plan.leaf_allocs, plan.n_leafs
    for ta, chunks in zip(galloc.buf_tallocs, plan.chunks):
        ta.chunks = chunks
    galloc._last_alloc = plan.last_alloc
    if plan.slots is not None:
        galloc._slots_cache = plan.slots
    galloc._plan_shared = False


def _free_buffers(buffers: list) -> None:
    for b in buffers:
        B.backend_buffer_free(b)
    buffers.clear()


def _alloc_tensor_range(tensors: list, first: int, last: int, buft, size: int, buffers: list) -> bool:
    """Allocate one buffer of ``size`` bytes and place tensors[first:last] in it with a tallocr."""
    buffer = B.backend_buft_alloc_buffer(buft, size)
    if buffer is None:
        _free_buffers(buffers)
        return False
    buffers.append(buffer)

    tallocr = tallocr_new(buffer)
    for t in tensors[first:last]:
        status = C.GGML_STATUS_SUCCESS
        if t.data == 0:
            if t.view_src is None:
                status = tallocr_alloc(tallocr, t)
            elif t.buffer == 0:
                status = B.backend_view_init(t)
        else:
            if t.view_src is not None and t.buffer == 0:
                # view of a pre-allocated tensor
                status = B.backend_view_init(t)
        if status != C.GGML_STATUS_SUCCESS:
            _free_buffers(buffers)
            return False
    return True


def _backend_alloc_ctx_tensors_from_buft_impl(ctx, buft, no_alloc: bool):
    """Returns (buffer or None, nbytes_total)."""
    GGML_ASSERT(ctx.no_alloc, "ggml_backend_alloc_ctx_tensors_from_buft: the context must be no_alloc")

    alignment = B.backend_buft_get_alignment(buft)
    max_size = B.backend_buft_get_max_size(buft)

    buffers: list = []
    nbytes_total = 0

    tensors = list(ctx.tensors())       # ggml_get_first_tensor / ggml_get_next_tensor
    cur_buf_size = 0
    first = 0
    for k, t in enumerate(tensors):
        this_size = 0
        if t.data == 0 and t.view_src is None:
            this_size = GGML_PAD(B.backend_buft_get_alloc_size(buft, t), alignment)

        if cur_buf_size > 0 and (cur_buf_size + this_size) > max_size:
            # allocate tensors in the current buffer
            if not no_alloc and not _alloc_tensor_range(tensors, first, k, buft, cur_buf_size, buffers):
                return None, nbytes_total
            first = k
            nbytes_total += cur_buf_size
            cur_buf_size = this_size
        else:
            cur_buf_size += this_size

    # allocate remaining tensors
    if cur_buf_size > 0:
        nbytes_total += cur_buf_size
        if not no_alloc and not _alloc_tensor_range(tensors, first, len(tensors), buft, cur_buf_size, buffers):
            return None, nbytes_total

    if no_alloc:
        return None, nbytes_total

    if len(buffers) == 0:
        # all tensors in the context are already allocated
        return None, nbytes_total

    if len(buffers) == 1:
        buffer = buffers[0]
    else:
        buffer = B.backend_multi_buffer_alloc_buffer(buffers, len(buffers))
    return buffer, nbytes_total


def backend_alloc_ctx_tensors_from_buft_size(ctx, buft) -> int:
    """The size ``backend_alloc_ctx_tensors_from_buft`` would allocate (all buffers together)."""
    buf, nbytes_total = _backend_alloc_ctx_tensors_from_buft_impl(ctx, buft, no_alloc=True)
    GGML_ASSERT(buf is None)
    return nbytes_total


def backend_alloc_ctx_tensors_from_buft(ctx, buft):
    """Create a buffer and place every not-yet-allocated tensor of the ``no_alloc`` context ``ctx`` in it, in context
    order, each padded to the buffer type's alignment; views get their source's memory. Several buffers (returned
    as one multi-buffer) when the total exceeds the buffer type's max size. None if there was nothing to allocate.
    (C first checks for a "meta" buffer type, which ggviz does not have.)"""
    return _backend_alloc_ctx_tensors_from_buft_impl(ctx, buft, no_alloc=False)[0]


def backend_alloc_ctx_tensors(ctx, backend):
    return backend_alloc_ctx_tensors_from_buft(ctx, B.backend_get_default_buffer_type(backend))
