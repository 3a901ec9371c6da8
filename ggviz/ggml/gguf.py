"""GGUF files: ggml's reader (gguf.cpp) and llama.cpp's model-loader checks, in Python, with a file map.

    gf = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    gf.version, gf.alignment, gf.arch            # 3, 32, 'llama'
    gf.kv["llama.block_count"]                   # 30
    gf.tensors[0]                                # TensorInfo('token_embd.weight', q8_0, ne=(576, 49152), ...)
    gf.layout()                                  # byte ranges covering the whole file: the file map
    gf.tensor_data("output_norm.weight")         # the tensor's bytes: a zero-copy uint8 view of the mapping
    ctx, w = create_weight_context(gf)           # ggml tensors whose ``data`` points into the mapping

The file format (gguf.h), all little-endian::

    header       "GGUF" | u32 version | i64 n_tensors | i64 n_kv
    n_kv x       string key | i32 value type | value          (type 9 = ARRAY: i32 elem type | u64 n | n values)
    n_tensors x  string name | u32 n_dims | i64 ne[n_dims] | i32 ggml type | u64 offset (from the data section)
    padding      zeros up to a multiple of ``general.alignment`` (default 32)
    data         each tensor at its offset, each padded to the alignment
    (string = u64 length + UTF-8 bytes, no NUL)

Mirrors: ``gguf_init_from_file_impl``/``gguf_init_from_reader`` (gguf.cpp): every check it makes, in its order, with
its limits (GGUF_MAX_STRING_LENGTH, GGUF_MAX_ARRAY_ELEMENTS, GGML_MAX_NAME, GGML_MAX_DIMS, the INT64_MAX/SIZE_MAX
overflow guards, tensor offsets that must follow one another exactly, padded to the alignment); then
``llama_model_loader``'s "tensor data is not within the file bounds" check. ggviz: two checks of its own, strings
must be valid UTF-8 (the spec says they are; ggml does not look) and tensor names may not contain NUL (ggml would
silently cut the name there).

Parsing is done here, not by gguf-py's ``GGUFReader``: it has to walk every byte of the metadata anyway to validate
it with bounds checks (so that hostile counts and lengths are rejected before anything is allocated), and
``GGUFReader`` takes seconds on a real model's 100k tokenizer strings. ``GGUFFile.gguf_reader()`` opens one for
cross-checking; the tests compare both readers field by field, and compare accept/reject decisions with the real ggml.

Every malformed file raises :class:`GGUFError` (a ``ValueError``) naming the file, the byte offset, the field, what was
expected and what was found, and ``.source``: which program's rule it is ("gguf.cpp", "llama.cpp" or "ggviz").

The file is memory-mapped read-only. Tensor bytes are never copied: ``tensor_data`` and the ``data`` of the tensors
from ``create_weight_context`` are views of the mapping, and writing to them raises (``ValueError: assignment
destination is read-only``), as writing to llama.cpp's read-only ``mmap`` would fault. The mapping lives as long as the
``GGUFFile``, any weight context made from it, or any view of it.
"""
from __future__ import annotations

import mmap
import os
import struct
import weakref
from dataclasses import dataclass

import numpy as np

from . import consts as C
from . import memory, ops
from .context import init, tensor_overhead
from .impl import GGML_PAD  # the alignment is checked to be a power of 2 before any use

__all__ = ["GGUFError", "GGUFFile", "TensorInfo", "KVInfo", "load_gguf", "create_weight_context", "require_arch",
           "GGUF_MAGIC", "GGUF_VERSION", "GGUF_DEFAULT_ALIGNMENT"]

# ---- gguf.h / gguf.cpp constants
GGUF_MAGIC = b"GGUF"
GGUF_POWERINFER_MAGIC = b"PWRI"   # SJTU-IPADS/PowerInfer: the same format, marking a model for sparse inference
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_KEY_GENERAL_ALIGNMENT = "general.alignment"
GGUF_MAX_STRING_LENGTH = 1024 * 1024 * 1024
GGUF_MAX_ARRAY_ELEMENTS = 1024 * 1024 * 1024
SIZE_MAX = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1
GGUF_HEADER_SIZE = 24                      # magic, version, n_tensors, n_kv

(GGUF_TYPE_UINT8, GGUF_TYPE_INT8, GGUF_TYPE_UINT16, GGUF_TYPE_INT16, GGUF_TYPE_UINT32, GGUF_TYPE_INT32,
 GGUF_TYPE_FLOAT32, GGUF_TYPE_BOOL, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY, GGUF_TYPE_UINT64, GGUF_TYPE_INT64,
 GGUF_TYPE_FLOAT64) = range(13)
GGUF_TYPE_COUNT = 13
GGUF_TYPE_NAME = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool", 8: "str",
                  9: "arr", 10: "u64", 11: "i64", 12: "f64"}
# fixed-size value types: struct format (scalars) and NumPy dtype (arrays)
_SCALAR = {0: struct.Struct("<B"), 1: struct.Struct("<b"), 2: struct.Struct("<H"), 3: struct.Struct("<h"),
           4: struct.Struct("<I"), 5: struct.Struct("<i"), 6: struct.Struct("<f"), 7: struct.Struct("<b"),
           10: struct.Struct("<Q"), 11: struct.Struct("<q"), 12: struct.Struct("<d")}
_DTYPE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<i1", 10: "<u8", 11: "<i8",
          12: "<f8"}
GGUF_TYPE_SIZE = {t: s.size for t, s in _SCALAR.items()}

# the smallest possible records, for rejecting counts the file cannot hold before reading them
_MIN_KV_SIZE = 8 + 1 + 4 + 1               # key length, >= 1 key byte, value type, >= 1 value byte
_MIN_TENSOR_INFO_SIZE = 8 + 4 + 4 + 8      # name length, n_dims, type, offset

_U32, _I32, _U64, _I64 = (struct.Struct(f) for f in ("<I", "<i", "<Q", "<q"))

_REMOVED_TYPES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8", 36: "IQ4_NL_4_4",
                  37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}


class GGUFError(ValueError):
    """A malformed (or unsupported) GGUF file.

    Attributes: ``path``, ``offset`` (byte offset in the file), ``field``, ``expected``, ``found``, and ``source``:
    whose rule rejected it: "gguf.cpp" (ggml's reader would fail too), "llama.cpp" (llama_model_loader) or "ggviz"
    (ggviz: a check of its own, beyond ggml's).
    """

    def __init__(self, path, offset: int, field: str, expected, found, source: str = "gguf.cpp"):
        self.path, self.offset, self.field = str(path), int(offset), field
        self.expected, self.found, self.source = expected, found, source
        super().__init__(f"{self.path}: invalid GGUF at offset {self.offset} (0x{self.offset:x}): {field}: "
                         f"expected {expected}, found {found}")


@dataclass(frozen=True)
class KVInfo:
    """Where one key-value pair sits in the file and what type it has."""
    index: int
    key: str
    type: int              # GGUF_TYPE_*; GGUF_TYPE_ARRAY for arrays
    item_type: int | None  # element type of an array
    count: int             # 1 for scalars, n for arrays
    start: int             # file offset of the key's length prefix
    value_start: int       # file offset of the value (of the array's first element)
    end: int               # one past the value's last byte

    @property
    def type_name(self) -> str:
        if self.type == GGUF_TYPE_ARRAY:
            return f"arr[{GGUF_TYPE_NAME[self.item_type]},{self.count}]"
        return GGUF_TYPE_NAME[self.type]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor info record (``struct gguf_tensor_info``) plus where things are in the file."""
    index: int
    name: str
    type: int              # GGML_TYPE_*
    ne: tuple              # dimensions in ggml order (ne[0] = row length), as many as the file's n_dims
    offset: int            # offset from the start of the data section
    file_offset: int       # absolute offset of the first data byte in the file
    nbytes: int            # ggml_nbytes
    info_start: int        # where this record starts in the file
    info_end: int

    @property
    def n_dims(self) -> int:
        return len(self.ne)

    @property
    def ne4(self) -> tuple:
        """ne padded with 1s to GGML_MAX_DIMS, as ``info.t.ne`` in ggml."""
        return tuple(self.ne) + (1,) * (C.GGML_MAX_DIMS - len(self.ne))

    @property
    def shape(self) -> tuple:
        """NumPy order (outermost first), n_dims entries."""
        return tuple(reversed(self.ne))

    @property
    def type_name(self) -> str:
        return C.TYPE_TRAITS[self.type][0]

    @property
    def nelements(self) -> int:
        n = 1
        for x in self.ne:
            n *= x
        return n

    def __repr__(self):
        return (f"TensorInfo({self.name!r}, {self.type_name}, ne={self.ne}, offset={self.offset}, "
                f"file_offset={self.file_offset}, nbytes={self.nbytes})")


class _Parser:
    """A bounds-checked cursor over the mapped file (gguf.cpp's gguf_reader)."""

    def __init__(self, buf, size: int, path: str, strict_utf8: bool):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0
        self.errors = "strict" if strict_utf8 else "surrogateescape"

    def err(self, offset, field, expected, found, source="gguf.cpp"):
        return GGUFError(self.path, offset, field, expected, found, source)

    def need(self, n: int, field: str):
        left = self.size - self.pos
        if n > left:
            raise self.err(self.pos, field, f"{n} bytes", f"only {left} bytes before the end of the file "
                           f"(file size {self.size}: truncated)")

    def scalar(self, st: struct.Struct, field: str):
        self.need(st.size, field)
        v = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return v

    def string(self, field: str) -> str:
        start = self.pos
        n = self.scalar(_U64, f"{field} (string length)")
        left = self.size - self.pos
        if n > GGUF_MAX_STRING_LENGTH:
            raise self.err(start, f"{field} (string length)", f"at most {GGUF_MAX_STRING_LENGTH} "
                           "(GGUF_MAX_STRING_LENGTH)", n)
        if n > left:
            raise self.err(start, f"{field} (string length)", f"at most {left} (the bytes left in the file)", n)
        s = self.decode(self.buf[self.pos:self.pos + n], self.pos, field)
        self.pos += n
        return s

    def decode(self, b: bytes, at: int, field: str) -> str:
        try:
            return b.decode("utf-8", self.errors)
        except UnicodeDecodeError as e:
            raise self.err(at + e.start, field, "valid UTF-8",
                           f"byte 0x{b[e.start]:02x} at string position {e.start} ({e.reason})", "ggviz") from None

    def string_array(self, n: int, field: str) -> list:
        buf, size, pos, out = self.buf, self.size, self.pos, []
        unpack, append, errors = _U64.unpack_from, out.append, self.errors
        for i in range(n):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"{field}[{i}] (string length)")
            ln = unpack(buf, pos)[0]
            if ln > GGUF_MAX_STRING_LENGTH or ln > size - pos - 8:
                self.pos = pos
                self.string(f"{field}[{i}]")      # raises with the precise message
            b = buf[pos + 8:pos + 8 + ln]
            try:
                append(b.decode("utf-8", errors))
            except UnicodeDecodeError:
                self.decode(b, pos + 8, f"{field}[{i}]")
            pos += 8 + ln
        self.pos = pos
        return out


def _value(p: _Parser, vtype: int, is_array: bool, n: int, key: str):
    """gguf_read_emplace_helper: one scalar, or an array of n values."""
    field = f"KV {key!r} value"
    if not is_array:
        if vtype == GGUF_TYPE_STRING:
            return p.string(field)
        v = p.scalar(_SCALAR[vtype], f"{field} ({GGUF_TYPE_NAME[vtype]})")
        return v != 0 if vtype == GGUF_TYPE_BOOL else v
    # arrays: the count is checked against GGUF_MAX_ARRAY_ELEMENTS and against the bytes left before anything is
    # allocated (gguf_reader::read(std::vector<T> &, n))
    esize = 8 if vtype == GGUF_TYPE_STRING else GGUF_TYPE_SIZE[vtype]
    left = p.size - p.pos
    if n > GGUF_MAX_ARRAY_ELEMENTS:
        raise p.err(p.pos - 8, f"KV {key!r} array length", f"at most {GGUF_MAX_ARRAY_ELEMENTS} "
                    "(GGUF_MAX_ARRAY_ELEMENTS)", n)
    if n * esize > left:
        what = "strings (each >= 8 bytes)" if vtype == GGUF_TYPE_STRING else f"{esize}-byte values"
        raise p.err(p.pos - 8, f"KV {key!r} array length",
                    f"at most {left // esize} {what} (the {left} bytes left in the file)", n)
    if vtype == GGUF_TYPE_STRING:
        return p.string_array(n, field)
    arr = (np.frombuffer(p.buf, dtype=_DTYPE[vtype], count=n, offset=p.pos).copy() if n
           else np.empty(0, dtype=_DTYPE[vtype]))
    p.pos += n * esize
    return arr != 0 if vtype == GGUF_TYPE_BOOL else arr


class GGUFFile:
    """A parsed, validated GGUF file, memory-mapped read-only. Build it with :func:`load_gguf`."""

    def __init__(self, path, *, strict_utf8: bool = True):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.file_size = size
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._u8 = np.frombuffer(self._mm, dtype=np.uint8)         # read-only: the mapping is ACCESS_READ
        self._base = None                                           # address once registered with ggml.memory
        self._parse(_Parser(self._mm, size, self.path, strict_utf8))

    # ------------------------------------------------------------------ parsing (gguf_init_from_reader)
    def _parse(self, p: _Parser):
        # magic
        p.need(4, "magic")
        magic = bytes(p.buf[0:4])
        if magic not in (GGUF_MAGIC, GGUF_POWERINFER_MAGIC):
            raise p.err(0, "magic", "b'GGUF'", repr(magic))
        # PowerInfer's gguf_init_from_file: "PWRI" sets sparse_deriv = GGML_SPARSE_INFERENCE
        self.magic = magic
        self.sparse = magic == GGUF_POWERINFER_MAGIC
        p.pos = 4
        # version
        v = p.scalar(_U32, "version")
        if v == 0:
            raise p.err(4, "version", "2 or 3", "0 (bad GGUF version)")
        if (v & 0x0000FFFF) == 0:
            raise p.err(4, "version", "2 or 3", f"{v} (0x{v:08x}: extremely large, is the file big-endian?)")
        if v == 1:
            raise p.err(4, "version", "2 or 3", "1 (GGUFv1 is no longer supported)")
        if v > GGUF_VERSION:
            raise p.err(4, "version", f"at most {GGUF_VERSION}", v)
        self.version = v
        # counts (int64 in ggml): rejected when negative or when the file cannot hold that many records
        n_tensors = p.scalar(_I64, "n_tensors")
        n_kv = p.scalar(_I64, "n_kv")
        left = p.size - GGUF_HEADER_SIZE
        if n_tensors < 0 or n_tensors * _MIN_TENSOR_INFO_SIZE > left:
            raise p.err(8, "n_tensors", f"0..{left // _MIN_TENSOR_INFO_SIZE} (each tensor info takes >= "
                        f"{_MIN_TENSOR_INFO_SIZE} bytes; {left} bytes follow the header)", n_tensors)
        left -= n_tensors * _MIN_TENSOR_INFO_SIZE
        if n_kv < 0 or n_kv * _MIN_KV_SIZE > left:
            raise p.err(16, "n_kv", f"0..{left // _MIN_KV_SIZE} (each key-value pair takes >= {_MIN_KV_SIZE} "
                        f"bytes; {left} bytes follow the header and the minimal tensor infos)", n_kv)

        # KV pairs
        kv: dict = {}
        kv_info: list[KVInfo] = []
        for i in range(n_kv):
            start = p.pos
            key = p.string(f"KV #{i} key")
            if not key:
                raise p.err(start, f"KV #{i} key", "a non-empty key", "an empty string")
            if key in kv:
                j = next(k.index for k in kv_info if k.key == key)
                raise p.err(start, f"KV #{i} key", "a unique key", f"{key!r}, a duplicate of KV #{j}")
            tpos = p.pos
            vtype = p.scalar(_I32, f"KV {key!r} value type")
            is_array, n = False, 1
            if vtype == GGUF_TYPE_ARRAY:
                is_array = True
                tpos = p.pos
                vtype = p.scalar(_I32, f"KV {key!r} array element type")
                n = p.scalar(_U64, f"KV {key!r} array length")
            if not (0 <= vtype < GGUF_TYPE_COUNT) or vtype == GGUF_TYPE_ARRAY:
                what = "array element type" if is_array else "value type"
                raise p.err(tpos, f"KV {key!r} {what}", "a GGUF type 0..12 other than 9 (arrays do not nest)"
                            if is_array else "a GGUF type 0..12", vtype)
            vstart = p.pos
            kv[key] = _value(p, vtype, is_array, n, key)
            kv_info.append(KVInfo(i, key, GGUF_TYPE_ARRAY if is_array else vtype, vtype if is_array else None,
                                  n, start, vstart, p.pos))
        self.kv, self.kv_info = kv, kv_info
        self._kv_by_key = {k.key: k for k in kv_info}

        # alignment
        alignment = GGUF_DEFAULT_ALIGNMENT
        ka = self._kv_by_key.get(GGUF_KEY_GENERAL_ALIGNMENT)
        if ka is not None:
            if ka.type != GGUF_TYPE_UINT32:
                raise p.err(ka.start, f"KV {GGUF_KEY_GENERAL_ALIGNMENT!r} type", "u32", ka.type_name)
            alignment = kv[GGUF_KEY_GENERAL_ALIGNMENT]
            if alignment == 0 or alignment & (alignment - 1):
                raise p.err(ka.value_start, GGUF_KEY_GENERAL_ALIGNMENT, "a power of 2", alignment)
        self.alignment = alignment

        # tensor infos
        raw = []
        names: dict = {}
        for i in range(n_tensors):
            start = p.pos
            name = p.string(f"tensor info #{i} name")
            nb = len(name.encode("utf-8", p.errors))
            if nb >= C.GGML_MAX_NAME:
                raise p.err(start, f"tensor info #{i} name", f"fewer than {C.GGML_MAX_NAME} bytes (GGML_MAX_NAME)",
                            f"{nb} bytes")
            if "\0" in name:
                raise p.err(start + 8 + name.index("\0"), f"tensor info #{i} name", "no NUL byte in the name "
                            "(ggml would cut it there)", repr(name), "ggviz")
            if name in names:
                raise p.err(start, f"tensor info #{i} name", "a unique tensor name",
                            f"{name!r}, a duplicate of tensor #{names[name]}")
            names[name] = i
            what = f"tensor #{i} {name!r}"
            dpos = p.pos
            n_dims = p.scalar(_U32, f"{what} n_dims")
            if n_dims > C.GGML_MAX_DIMS:
                raise p.err(dpos, f"{what} n_dims", f"at most {C.GGML_MAX_DIMS} (GGML_MAX_DIMS)", n_dims)
            ne = []
            for j in range(n_dims):
                epos = p.pos
                x = p.scalar(_I64, f"{what} ne[{j}]")
                if x < 0:
                    raise p.err(epos, f"{what} ne[{j}]", "a number of elements >= 0", x)
                ne.append(x)
            n0, n1, n2, n3 = tuple(ne) + (1,) * (4 - n_dims)
            if n0 * n1 * n2 * n3 > 0 and (INT64_MAX // n1 <= n0 or INT64_MAX // n2 <= n0 * n1
                                          or INT64_MAX // n3 <= n0 * n1 * n2):
                raise p.err(dpos, f"{what} ne", "a total number of elements < INT64_MAX", f"ne={ne}")
            tpos = p.pos
            ttype = p.scalar(_I32, f"{what} type")
            if not 0 <= ttype < C.GGML_TYPE_COUNT:
                raise p.err(tpos, f"{what} type", f"a ggml type in [0, {C.GGML_TYPE_COUNT})", ttype)
            if ttype not in C.TYPE_TRAITS:
                raise p.err(tpos, f"{what} type", "a supported ggml type",
                            f"{ttype} (GGML_TYPE_{_REMOVED_TYPES.get(ttype, '?')}, removed from ggml)")
            tname, blck, tsize, _q = C.TYPE_TRAITS[ttype]
            if n0 % blck:
                raise p.err(dpos, f"{what} ne[0]", f"a multiple of {tname}'s block size {blck}", n0)
            nel = n0 * n1 * n2 * n3
            if nel // blck > SIZE_MAX // tsize:
                raise p.err(dpos, f"{what} ne", "a size in bytes <= SIZE_MAX", f"ne={ne} of {tname}")
            opos = p.pos
            offset = p.scalar(_U64, f"{what} offset")
            raw.append((name, ttype, tuple(ne), offset, nel // blck * tsize, start, p.pos, opos))

        # data section: starts at the next multiple of the alignment (gr.seek fails past the end of the file)
        self.tensor_info_end = p.pos
        data_offset = p.pos
        if n_tensors > 0:
            data_offset = GGML_PAD(p.pos, alignment)
            if data_offset > p.size:
                raise p.err(p.pos, "padding before the data section", f"{data_offset - p.pos} bytes of padding "
                            f"(the data section starts at offset {data_offset})",
                            f"the end of the file at {p.size} (truncated)")
        self.data_offset = data_offset

        # tensor offsets: each tensor exactly where the previous one ends, padded to the alignment
        expected, placed = 0, []
        for (name, ttype, ne, offset, nbytes, _s, _e, opos) in raw:
            if offset != expected:
                if offset % alignment:
                    what = f"a multiple of the alignment {alignment} (the next free offset is {expected})"
                elif offset < expected:
                    o_name, o_start, o_end = next(x for x in placed if x[1] <= offset < x[2])
                    what = (f"{expected}: offset {offset} overlaps tensor {o_name!r} at [{o_start}, {o_end}) "
                            "(padded)")
                else:
                    what = f"{expected} (tensors follow one another; this leaves a gap of {offset - expected} bytes)"
                raise p.err(opos, f"tensor {name!r} data offset", what, offset)
            placed.append((name, expected, expected + GGML_PAD(nbytes, alignment)))
            expected += GGML_PAD(nbytes, alignment)
            if expected > SIZE_MAX:
                raise p.err(opos, f"tensor {name!r} data offset", "a data section size <= SIZE_MAX", expected)
        self.data_size = expected       # ctx->size: the data section, every tensor padded

        # llama_model_loader: "tensor data is not within the file bounds"
        for (name, ttype, ne, offset, nbytes, _s, _e, opos) in raw:
            end = data_offset + offset + nbytes
            if end > p.size:
                raise p.err(opos, f"tensor {name!r} data", f"bytes [{data_offset + offset}, {end}) inside the file "
                            f"(file size {p.size})", f"data out of the file by {end - p.size} bytes (truncated?)",
                            "llama.cpp")

        self.tensors = [TensorInfo(i, name, ttype, ne, offset, data_offset + offset, nbytes, s, e)
                        for i, (name, ttype, ne, offset, nbytes, s, e, _o) in enumerate(raw)]
        self._by_name = {t.name: t for t in self.tensors}

    # ------------------------------------------------------------------ queries
    @property
    def arch(self):
        """general.architecture (None if the file has none)."""
        return self.kv.get("general.architecture")

    @property
    def n_tensors(self) -> int:
        return len(self.tensors)

    @property
    def n_kv(self) -> int:
        return len(self.kv_info)

    def kv_type(self, key: str) -> str:
        return self._kv_by_key[key].type_name

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def tensor_data(self, name: str) -> np.ndarray:
        """The tensor's bytes as a zero-copy, read-only uint8 view of the mapped file."""
        t = self.tensor(name)
        return np.asarray(self._u8[t.file_offset:t.file_offset + t.nbytes])

    def buffer(self) -> np.ndarray:
        """The whole file as a read-only uint8 array (the mapping itself)."""
        return self._u8

    def gguf_reader(self):
        """gguf-py's GGUFReader on the same file (slow on real models; for cross-checking)."""
        import gguf     # gguf-py (and the yaml it imports): ~70 ms that loading a model does not need
        return gguf.GGUFReader(self.path)

    def layout(self) -> list:
        """The file map: byte ranges that cover ``[0, file_size)`` in order, without gaps or overlaps.

        Each range is a dict with ``kind`` ("header", "kv", "tensor_info", "padding", "tensor_data"), ``start``,
        ``end`` (exclusive), ``label``, and per kind: ``fields`` (header), ``key``/``type``/``count``/``index``
        (kv), ``name``/``index`` (tensor_info), ``name``/``type``/``ne``/``index`` (tensor_data).
        """
        out = [{"kind": "header", "start": 0, "end": GGUF_HEADER_SIZE, "label": f"header (GGUF v{self.version})",
                "fields": [("magic", 0, 4), ("version", 4, 8), ("n_tensors", 8, 16), ("n_kv", 16, 24)]}]
        for k in self.kv_info:
            out.append({"kind": "kv", "start": k.start, "end": k.end, "label": f"{k.key}: {k.type_name}",
                        "key": k.key, "type": k.type_name, "count": k.count, "index": k.index,
                        "value_start": k.value_start})
        for t in self.tensors:
            out.append({"kind": "tensor_info", "start": t.info_start, "end": t.info_end, "label": t.name,
                        "name": t.name, "index": t.index})
        pos = self.tensor_info_end
        for t in self.tensors:
            if t.file_offset > pos:
                out.append({"kind": "padding", "start": pos, "end": t.file_offset,
                            "label": f"padding to the alignment ({self.alignment})"})
            if t.nbytes:
                out.append({"kind": "tensor_data", "start": t.file_offset, "end": t.file_offset + t.nbytes,
                            "label": f"{t.name} ({t.type_name} {list(t.ne)})", "name": t.name, "type": t.type_name,
                            "ne": list(t.ne), "index": t.index})
            pos = max(pos, t.file_offset + t.nbytes)
        if pos < self.file_size:
            label = (f"padding to the alignment ({self.alignment})" if self.file_size - pos < self.alignment
                     else "trailing bytes after the last tensor")
            out.append({"kind": "padding", "start": pos, "end": self.file_size, "label": label})
        return out

    # ------------------------------------------------------------------ ggml addresses
    def _register(self) -> int:
        """Make the mapping addressable by ggml (``tensor->data`` pointers); returns its base address."""
        if self._base is None:
            if self._u8.size == 0:
                raise ValueError(f"{self.path}: empty file, nothing to map")
            self._base = memory.register(self._u8, f"mmap {os.path.basename(self.path)}")
            weakref.finalize(self, memory.unregister, self._base)
        return self._base

    def __repr__(self):
        return (f"<GGUFFile {os.path.basename(self.path)!r} v{self.version} arch={self.arch!r} "
                f"{self.n_kv} KV, {self.n_tensors} tensors, data at {self.data_offset}, {self.file_size} bytes>")


def load_gguf(path, *, strict_utf8: bool = True) -> GGUFFile:
    """Open, map and validate a GGUF file (``gguf_init_from_file`` with ``no_alloc``). Raises GGUFError.

    ``strict_utf8=False`` accepts strings that are not UTF-8 (their bad bytes become surrogate escapes).
    """
    return GGUFFile(path, strict_utf8=strict_utf8)


def require_arch(gf: GGUFFile, supported) -> str:
    """The file's general.architecture, or GGUFError if it is missing or not one of ``supported``."""
    supported = sorted(supported)
    k = gf._kv_by_key.get("general.architecture")
    if k is None:
        raise GGUFError(gf.path, GGUF_HEADER_SIZE, "KV 'general.architecture'", f"one of {supported}",
                        "no such key", "llama.cpp")
    arch = gf.kv["general.architecture"]
    if k.type != GGUF_TYPE_STRING or arch not in supported:
        raise GGUFError(gf.path, k.value_start, "general.architecture",
                        f"a supported architecture: one of {supported}", repr(arch), "llama.cpp")
    return arch


def create_weight_context(gf: GGUFFile, names=None):
    """A ``no_alloc`` ggml context holding one tensor per weight, its ``data`` pointing into the file mapping.

    As llama.cpp with mmap: ``ggml_new_tensor(ctx, type, GGML_MAX_DIMS, ne)`` + ``ggml_set_name`` per tensor (what
    gguf_init_from_file does with ``no_alloc``), then ``data = mapping + data_offset + offset``. ``ggml.get_data(t)``
    is a zero-copy view of the file's bytes; the mapping is read-only, so writing to it raises ValueError.
    Returns ``(ctx, {name: tensor})``; ``names`` picks a subset (in that order).
    """
    sel = list(gf.tensors) if names is None else [gf.tensor(n) for n in names]
    if len({t.name for t in sel}) != len(sel):
        raise ValueError("create_weight_context: duplicate names")
    ctx = init(len(sel) * tensor_overhead(), None, True)
    base = gf._register() if sel else 0
    out = {}
    for ti in sel:
        t = ops.new_tensor(ctx, ti.type, C.GGML_MAX_DIMS, list(ti.ne4))
        ops.set_name(t, ti.name)
        t.data = base + ti.file_offset
        out[ti.name] = t
    ctx.gguf_file = gf          # keeps the mapping (and its registration) alive as long as the context
    return ctx, out
