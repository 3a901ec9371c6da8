"""A tiny GGUF writer (struct.pack only) and the hostile mutations of its output, for tests/test_gguf.py.

    data, marks = build()             # a valid tiny GGUF v3 file: bytes, and the offset of every field in it
    for case in CASES: case.make()    # hostile variants: (name, bytes, what the error must mention, ggml's verdict)

``marks`` names every field: "magic", "version", "n_tensors", "n_kv", "kv{i}.key_len", "kv{i}.type",
"kv{i}.arr_type", "kv{i}.arr_n", "kv{i}.value", "ti{i}.name_len", "ti{i}.n_dims", "ti{i}.ne{j}", "ti{i}.type",
"ti{i}.offset", "pad", "data", "data{i}", "end".

Run as a script, it is the ggml oracle: ``python tests/hostile_gguf.py --ggml-oracle FILE...`` prints, per file, a
JSON line with whether the real ggml (libggml-python's ``gguf_init_from_buffer``) accepts it and what it read.
"""
from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

ALIGN = 32
# ggml type -> (block size, type size), the few the writer needs
TYPES = {0: (1, 4), 1: (1, 2), 8: (32, 34)}
F32, F16, Q8_0 = 0, 1, 8

# GGUF value types
U8, I8, U16, I16, U32, I32, F32V, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32V: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}


def s(b) -> bytes:
    """A GGUF string: u64 length + bytes."""
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def val(t: int, v) -> bytes:
    """type tag + scalar value."""
    return struct.pack("<i", t) + (s(v) if t == STR else struct.pack(_FMT[t], v))


def arr(t: int, values) -> bytes:
    """ARRAY tag, element type, count, values."""
    body = b"".join(s(v) if t == STR else struct.pack(_FMT[t], v) for v in values)
    return struct.pack("<iiQ", ARR, t, len(values)) + body


def default_kvs():
    return [
        ("general.architecture", val(STR, "llama")),
        ("general.name", val(STR, "tiny hostile-test model")),
        ("llama.block_count", val(U32, 1)),
        ("llama.rope.freq_base", val(F32V, 10000.0)),
        ("tokenizer.ggml.add_bos_token", val(BOOL, True)),
        ("tokenizer.ggml.tokens", arr(STR, ["<s>", "</s>", "h\u00e9", "w\u00f6rld", ""])),
        ("tokenizer.ggml.token_type", arr(I32, [3, 3, 1, 1, 1])),
        ("general.file_size_hint", val(I64, -7)),
        ("general.pi", val(F64, 3.141592653589793)),
        ("general.flags", arr(U8, [1, 2, 255])),
    ]


def default_tensors():
    return [
        {"name": "token_embd.weight", "type": Q8_0, "ne": [64, 3]},
        {"name": "norm.weight", "type": F32, "ne": [5]},
        {"name": "out.weight", "type": F32, "ne": [8, 2]},
    ]


def tensor_bytes(spec) -> bytes:
    """Deterministic content of the right size (real floats for F32, valid Q8_0 blocks)."""
    ne = list(spec["ne"])
    n = 1
    for x in ne:
        n *= x
    t = spec["type"]
    if t == F32:
        return struct.pack(f"<{n}f", *[0.5 * i - 1.0 for i in range(n)])
    if t == F16:
        return struct.pack(f"<{n}e", *[0.25 * i for i in range(n)])
    if t == Q8_0:
        rng = random.Random(1234)
        return b"".join(struct.pack("<e", 0.01 * (1 + b % 7)) + bytes(rng.randrange(256) for _ in range(32))
                        for b in range(n // 32))
    return b""


def nbytes(spec) -> int:
    bs, ts = TYPES.get(spec["type"], (1, 0))
    n = 1
    for x in spec["ne"]:
        n *= x
    return n // bs * ts if n > 0 else 0


def pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def build(*, magic=b"GGUF", version=3, n_tensors=None, n_kv=None, kvs=None, tensors=None, alignment=ALIGN,
          trailing=b"", extra_kvs=()):
    """Write a GGUF file. ``kvs``: [(key, encoded type+value)], ``tensors``: [{"name", "type", "ne", "offset"?,
    "n_dims"?, "data"?}]. Offsets default to the ones a writer would choose. Returns (bytes, marks)."""
    kvs = default_kvs() if kvs is None else kvs
    kvs = list(kvs) + list(extra_kvs)
    tensors = default_tensors() if tensors is None else tensors
    out = bytearray()
    marks = {}

    def mark(name):
        marks[name] = len(out)

    mark("magic")
    out += magic
    mark("version")
    out += struct.pack("<I", version)
    mark("n_tensors")
    out += struct.pack("<q", len(tensors) if n_tensors is None else n_tensors)
    mark("n_kv")
    out += struct.pack("<q", len(kvs) if n_kv is None else n_kv)
    for i, (key, enc) in enumerate(kvs):
        mark(f"kv{i}")
        mark(f"kv{i}.key_len")
        out += s(key)
        mark(f"kv{i}.type")
        if struct.unpack_from("<i", enc)[0] == ARR and len(enc) >= 16:
            out += enc[:4]
            mark(f"kv{i}.arr_type")
            out += enc[4:8]
            mark(f"kv{i}.arr_n")
            out += enc[8:16]
            mark(f"kv{i}.value")
            out += enc[16:]
        else:
            out += enc[:4]
            mark(f"kv{i}.value")
            out += enc[4:]
    # offsets as a writer lays them out
    offs, cur = [], 0
    for t in tensors:
        offs.append(cur)
        cur += pad(nbytes(t), alignment)
    for i, t in enumerate(tensors):
        mark(f"ti{i}")
        mark(f"ti{i}.name_len")
        out += s(t["name"])
        mark(f"ti{i}.n_dims")
        ne = list(t["ne"])
        out += struct.pack("<I", t.get("n_dims", len(ne)))
        for j, x in enumerate(ne):
            mark(f"ti{i}.ne{j}")
            out += struct.pack("<q", x)
        mark(f"ti{i}.type")
        out += struct.pack("<i", t["type"])
        mark(f"ti{i}.offset")
        out += struct.pack("<Q", t.get("offset", offs[i]))
    mark("pad")
    if tensors:
        out += bytes(pad(len(out), alignment) - len(out))
    mark("data")
    base = len(out)
    for i, t in enumerate(tensors):
        mark(f"data{i}")
        data = t["data"] if "data" in t else tensor_bytes(t)
        out += data
        if i + 1 < len(tensors):
            out += bytes(max(0, base + offs[i + 1] - len(out)))
    out += trailing
    mark("end")
    return bytes(out), marks


VALID, MARKS = build()


def patch(data: bytes, at: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def with_tensor(i, **changes):
    ts = default_tensors()
    ts[i] = {**ts[i], **changes}
    return ts


def with_kv(i, key=None, enc=None):
    kvs = default_kvs()
    k, e = kvs[i]
    kvs[i] = (k if key is None else key, e if enc is None else enc)
    return kvs


@dataclass
class Case:
    name: str
    make: Callable[[], bytes]
    mentions: str            # substring the GGUFError message must contain
    at: int | None = None    # the offset the error must name (None: not checked)
    ggml_rejects: bool = True   # the real ggml rejects it too (False: only llama.cpp / ggviz checks catch it)


M = MARKS
CASES: list[Case] = [
    # truncations, one per section
    Case("empty_file", lambda: b"", "magic", 0),
    Case("truncated_magic", lambda: VALID[:2], "magic", 0),
    Case("truncated_version", lambda: VALID[:6], "version", 4),
    Case("truncated_n_tensors", lambda: VALID[:12], "n_tensors", 8),
    Case("truncated_n_kv", lambda: VALID[:20], "n_kv", 16),
    Case("truncated_header_end", lambda: VALID[:24], "n_tensors", 8),   # counts now claim more than 0 bytes hold
    Case("truncated_kv_key_len", lambda: VALID[:M["kv0.key_len"] + 3], "n_tensors"),
    Case("truncated_in_last_kv", lambda: VALID[:M["kv9.value"] + 1], "'general.flags' array length", M["kv9.arr_n"]),
    Case("truncated_in_scalar", lambda: build(tensors=[], kvs=default_kvs()[:3])[0][:M["kv2.value"] + 2],
         "KV 'llama.block_count' value (u32)", M["kv2.value"]),
    Case("truncated_in_string_array", lambda: VALID[:M["kv5.value"] + 12], "tokenizer.ggml.tokens"),
    Case("truncated_in_tensor_name", lambda: VALID[:M["ti2.name_len"] + 10], "tensor info #2 name"),
    Case("truncated_in_ne", lambda: VALID[:M["ti2.ne1"] + 4], "ne[1]"),
    Case("truncated_in_type", lambda: VALID[:M["ti2.type"] + 2], "type"),
    Case("truncated_in_offset", lambda: VALID[:M["ti2.offset"] + 7], "offset", M["ti2.offset"]),
    Case("truncated_in_padding", lambda: VALID[:M["pad"] + 1], "padding before the data section", M["pad"]),
    Case("truncated_in_tensor_data", lambda: VALID[:M["data0"] + 100], "out of the file", M["ti0.offset"],
         ggml_rejects=False),
    Case("truncated_last_tensor", lambda: VALID[:-1], "out of the file", M["ti2.offset"], ggml_rejects=False),
    # header
    Case("wrong_magic", lambda: b"GGML" + VALID[4:], "magic", 0),
    Case("wrong_magic_lowercase", lambda: b"gguf" + VALID[4:], "magic", 0),
    Case("version_0", lambda: patch(VALID, 4, "<I", 0), "version", 4),
    Case("version_1", lambda: patch(VALID, 4, "<I", 1), "GGUFv1", 4),
    Case("version_4", lambda: patch(VALID, 4, "<I", 4), "version", 4),
    Case("version_big_endian", lambda: patch(VALID, 4, "<I", 0x03000000), "big-endian", 4),
    Case("n_tensors_absurd", lambda: patch(VALID, 8, "<q", 1 << 40), "n_tensors", 8),
    Case("n_tensors_negative", lambda: patch(VALID, 8, "<q", -1), "n_tensors", 8),
    Case("n_tensors_int64_min", lambda: patch(VALID, 8, "<q", -(1 << 63)), "n_tensors", 8),
    Case("n_kv_absurd", lambda: patch(VALID, 16, "<q", 1 << 61), "n_kv", 16),
    Case("n_kv_negative", lambda: patch(VALID, 16, "<q", -5), "n_kv", 16),
    Case("n_kv_one_too_many", lambda: patch(VALID, 16, "<q", len(default_kvs()) + 1), ""),
    # KV section
    Case("key_length_absurd", lambda: patch(VALID, M["kv1.key_len"], "<Q", 1 << 62), "GGUF_MAX_STRING_LENGTH",
         M["kv1.key_len"]),
    Case("key_length_past_eof", lambda: patch(VALID, M["kv1.key_len"], "<Q", 1 << 20), "bytes left",
         M["kv1.key_len"]),
    Case("string_value_length_absurd", lambda: patch(VALID, M["kv1.value"], "<Q", (1 << 64) - 1),
         "string length", M["kv1.value"]),
    Case("array_length_absurd", lambda: patch(VALID, M["kv5.arr_n"], "<Q", 1 << 40), "GGUF_MAX_ARRAY_ELEMENTS",
         M["kv5.arr_n"]),
    Case("array_length_past_eof", lambda: patch(VALID, M["kv6.arr_n"], "<Q", 1 << 25), "array length",
         M["kv6.arr_n"]),
    Case("string_in_array_length_absurd", lambda: patch(VALID, M["kv5.value"] + 11, "<Q", 1 << 50),
         "KV 'tokenizer.ggml.tokens' value[1]", M["kv5.value"] + 11),
    Case("unknown_value_type", lambda: patch(VALID, M["kv2.type"], "<i", 13), "value type", M["kv2.type"]),
    Case("negative_value_type", lambda: patch(VALID, M["kv2.type"], "<i", -1), "value type", M["kv2.type"]),
    Case("nested_array", lambda: patch(VALID, M["kv6.arr_type"], "<i", ARR), "arrays do not nest",
         M["kv6.arr_type"]),
    Case("unknown_array_type", lambda: patch(VALID, M["kv6.arr_type"], "<i", 99), "element type",
         M["kv6.arr_type"]),
    Case("empty_key", lambda: build(kvs=with_kv(3, key=""))[0], "empty", M["kv3"]),
    Case("duplicate_key", lambda: build(kvs=with_kv(3, key="general.name"))[0], "duplicate of KV #1", M["kv3"]),
    Case("non_utf8_key", lambda: build(kvs=with_kv(2, key=b"llama.\xffblock"))[0], "UTF-8",
         M["kv2.key_len"] + 8 + 6, ggml_rejects=False),
    Case("non_utf8_string", lambda: build(kvs=with_kv(1, enc=val(STR, b"tiny \xc3(")))[0], "UTF-8",
         ggml_rejects=False),
    Case("non_utf8_string_in_array", lambda: build(kvs=with_kv(5, enc=arr(STR, [b"a", b"\xe2\x82", b"c"])))[0],
         "KV 'tokenizer.ggml.tokens' value[1]", ggml_rejects=False),
    Case("alignment_wrong_type", lambda: build(extra_kvs=[("general.alignment", val(U64, 32))])[0], "u32"),
    Case("alignment_not_power_of_2", lambda: build(extra_kvs=[("general.alignment", val(U32, 48))])[0],
         "power of 2"),
    Case("alignment_zero", lambda: build(extra_kvs=[("general.alignment", val(U32, 0))])[0], "power of 2"),
    # tensor infos
    Case("unknown_ggml_type", lambda: patch(VALID, M["ti1.type"], "<i", 99), "ggml type", M["ti1.type"]),
    Case("negative_ggml_type", lambda: patch(VALID, M["ti1.type"], "<i", -3), "ggml type", M["ti1.type"]),
    Case("removed_ggml_type_q4_2", lambda: patch(VALID, M["ti1.type"], "<i", 4), "Q4_2", M["ti1.type"]),
    Case("removed_ggml_type_q4_0_4_4", lambda: patch(VALID, M["ti1.type"], "<i", 31), "removed", M["ti1.type"]),
    Case("ne_negative", lambda: patch(VALID, M["ti0.ne1"], "<q", -3), "ne[1]", M["ti0.ne1"]),
    Case("ne_overflow", lambda: build(tensors=with_tensor(2, ne=[1 << 32, 1 << 31], data=b""))[0], "INT64_MAX",
         M["ti2.n_dims"]),
    Case("nbytes_overflow", lambda: build(tensors=with_tensor(2, type=28, ne=[1 << 31, 1 << 31], data=b""))[0],
         "SIZE_MAX"),
    Case("n_dims_5", lambda: build(tensors=with_tensor(1, ne=[5, 1, 1, 1, 1]))[0], "GGML_MAX_DIMS",
         M["ti1.n_dims"]),
    Case("n_dims_absurd", lambda: patch(VALID, M["ti1.n_dims"], "<I", 0xFFFFFFFF), "n_dims", M["ti1.n_dims"]),
    Case("not_multiple_of_block", lambda: build(tensors=with_tensor(0, ne=[48, 3], data=bytes(200)))[0],
         "block size 32", M["ti0.n_dims"]),
    Case("tensor_name_too_long", lambda: build(tensors=with_tensor(1, name="n" * 64))[0], "GGML_MAX_NAME"),
    Case("tensor_name_max_plus_utf8", lambda: build(tensors=with_tensor(1, name="\u00e9" * 32))[0],
         "GGML_MAX_NAME"),
    Case("duplicate_tensor_name", lambda: build(tensors=with_tensor(2, name="norm.weight"))[0],
         "duplicate of tensor #1", M["ti2"]),
    Case("non_utf8_tensor_name", lambda: build(tensors=with_tensor(1, name=b"norm\xff.weight"))[0], "UTF-8",
         M["ti1.name_len"] + 8 + 4, ggml_rejects=False),
    Case("nul_in_tensor_name", lambda: build(tensors=with_tensor(1, name=b"norm\0x"))[0], "NUL",
         ggml_rejects=False),
    # data section
    Case("misaligned_offset", lambda: build(tensors=with_tensor(1, offset=224 + 4))[0], "multiple of the alignment",
         M["ti1.offset"]),
    Case("overlapping_tensors", lambda: build(tensors=with_tensor(1, offset=0))[0], "overlaps", M["ti1.offset"]),
    Case("overlapping_tensors_2", lambda: build(tensors=with_tensor(2, offset=224))[0], "overlaps tensor 'norm.weight'",
         M["ti2.offset"]),
    Case("gap_between_tensors", lambda: build(tensors=with_tensor(1, offset=224 + 32))[0], "gap", M["ti1.offset"]),
    Case("offset_absurd", lambda: patch(VALID, M["ti2.offset"], "<Q", (1 << 64) - 32), "offset", M["ti2.offset"]),
    Case("data_out_of_file", lambda: build(tensors=with_tensor(2, ne=[8, 2000], data=bytes(64)))[0], "out of the file",
         M["ti2.offset"], ggml_rejects=False),
]
CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES)


def fuzz_cases(n: int = 300, seed: int = 0):
    """Seeded random mutations of VALID: (name, bytes). Byte flips biased towards the metadata, u64 fields
    overwritten with extreme values, truncations, insertions and deletions."""
    rng = random.Random(seed)
    meta_end = M["data"]
    fields8 = [v for k, v in M.items() if k.endswith(("key_len", "arr_n", "offset", "n_tensors", "n_kv"))
               or ".ne" in k]
    fields4 = [v for k, v in M.items() if k.endswith(("type", "arr_type", "n_dims", "version"))]
    extremes8 = [0, 1, (1 << 64) - 1, 1 << 63, (1 << 63) - 1, 1 << 32, 1 << 30, 1 << 31, 31, 33, 64, 4096]
    extremes4 = [0, 1, 2, 3, 4, 9, 12, 13, 31, 42, 43, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000]
    out = []
    for i in range(n):
        b = bytearray(VALID)
        kind = rng.random()
        if kind < 0.45:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(meta_end)] ^= 1 << rng.randrange(8)
            name = "flip"
        elif kind < 0.6:
            struct.pack_into("<Q", b, rng.choice(fields8), rng.choice(extremes8))
            name = "u64"
        elif kind < 0.72:
            struct.pack_into("<I", b, rng.choice(fields4), rng.choice(extremes4))
            name = "u32"
        elif kind < 0.87:
            b = b[:rng.randrange(len(b))]
            name = "truncate"
        elif kind < 0.94:
            at = rng.randrange(meta_end)
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
            name = "insert"
        else:
            at = rng.randrange(meta_end)
            del b[at:at + rng.randint(1, 9)]
            name = "delete"
        out.append((f"fuzz{i:03d}_{name}", bytes(b)))
    return out


# ----------------------------------------------------------------------------------------------- the ggml oracle

def ggml_verdicts(paths, timeout=60):
    """Run the real ggml's gguf_init_from_buffer on each file, in a subprocess (a GGML_ASSERT would abort).
    Returns one dict per path: {"ok": bool, ...what ggml read}; None if the oracle is unavailable."""
    try:
        from tests.oracle.ggml_lib import available
        if not available():
            return None
    except Exception:
        return None
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--ggml-oracle", *map(str, paths)],
                       capture_output=True, text=True, errors="replace", timeout=timeout,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if r.returncode != 0:
        raise RuntimeError(f"ggml oracle crashed (rc={r.returncode}): {r.stderr[-2000:]}")
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == len(paths), r.stdout[-2000:]
    return lines


def _oracle_main(paths):
    import ctypes
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.oracle.ggml_lib import RealGGML

    lib = RealGGML()._base

    class Params(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]

    lib.gguf_init_from_buffer.restype = ctypes.c_void_p
    lib.gguf_init_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t, Params]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    for fn, res, args in [("gguf_get_n_tensors", ctypes.c_int64, [ctypes.c_void_p]),
                          ("gguf_get_n_kv", ctypes.c_int64, [ctypes.c_void_p]),
                          ("gguf_get_version", ctypes.c_uint32, [ctypes.c_void_p]),
                          ("gguf_get_alignment", ctypes.c_size_t, [ctypes.c_void_p]),
                          ("gguf_get_data_offset", ctypes.c_size_t, [ctypes.c_void_p]),
                          ("gguf_get_tensor_offset", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_tensor_size", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_tensor_type", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_tensor_name", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_key", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64])]:
        getattr(lib, fn).restype = res
        getattr(lib, fn).argtypes = args
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        buf = ctypes.create_string_buffer(data, len(data)) if data else None
        ctx = lib.gguf_init_from_buffer(buf, len(data), Params(True, None)) if data else None
        if not ctx:
            print(json.dumps({"ok": False}), flush=True)
            continue
        nt = lib.gguf_get_n_tensors(ctx)
        res = {"ok": True, "version": lib.gguf_get_version(ctx), "alignment": lib.gguf_get_alignment(ctx),
               "data_offset": lib.gguf_get_data_offset(ctx), "n_kv": lib.gguf_get_n_kv(ctx),
               "keys": [lib.gguf_get_key(ctx, i).decode("utf-8", "replace") for i in range(lib.gguf_get_n_kv(ctx))],
               "tensors": [[lib.gguf_get_tensor_name(ctx, i).decode("utf-8", "replace"),
                            lib.gguf_get_tensor_type(ctx, i), lib.gguf_get_tensor_offset(ctx, i),
                            lib.gguf_get_tensor_size(ctx, i)] for i in range(nt)]}
        lib.gguf_free(ctx)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--ggml-oracle":
        _oracle_main(sys.argv[2:])
    else:
        print(__doc__)
