"""ggviz.ggml.gguf: the GGUF reader, its file map, weights as ggml tensors, and hostile files.

Oracles: gguf-py's GGUFReader (values, tensor infos), gguf-py's quants (dequantization), and the real ggml
(libggml-python's gguf_init_from_buffer, in a subprocess): it must accept and reject exactly what ggviz accepts and
rejects with a gguf.cpp rule, ggviz's extra rules (UTF-8, NUL in names, llama.cpp's file bounds) aside.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest
import gguf
import ggviz
from ggviz import ggml
from ggviz.ggml.gguf import (GGUFError, GGUFFile, create_weight_context, load_gguf, require_arch)
from tests import hostile_gguf as H

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



MODEL = os.path.join(_ROOT, "data", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def _write(tmp_path, name, data: bytes) -> str:
    p = tmp_path / f"{name}.gguf"
    p.write_bytes(data)
    return str(p)


def _check_layout(gf: GGUFFile, zero_padding=True):
    lay = gf.layout()
    assert lay[0]["start"] == 0 and lay[-1]["end"] == gf.file_size
    for a, b in zip(lay, lay[1:]):
        assert a["end"] == b["start"], (a, b)
    for r in lay:
        assert r["start"] < r["end"], r
        assert r["kind"] in {"header", "kv", "tensor_info", "padding", "tensor_data"}
    data = [r for r in lay if r["kind"] == "tensor_data"]
    assert [r["name"] for r in data] == [t.name for t in gf.tensors if t.nbytes]
    for r in data:
        assert r["start"] % gf.alignment == 0
    assert sum(r["kind"] == "kv" for r in lay) == gf.n_kv
    assert sum(r["kind"] == "tensor_info" for r in lay) == gf.n_tensors
    for r in lay if zero_padding else ():
        if r["kind"] == "padding" and r["end"] - r["start"] < gf.alignment:
            assert not gf.buffer()[r["start"]:r["end"]].any(), r      # writers pad with zeros
    return lay


def _compare_with_gguf_py(gf: GGUFFile, r):
    """Everything ggviz read equals what gguf-py's GGUFReader read."""
    assert gf.data_offset == r.data_offset and gf.alignment == r.alignment
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(gf.kv)
    for k, f in fields.items():
        mine, theirs = gf.kv[k], f.contents()
        if isinstance(mine, np.ndarray):
            np.testing.assert_array_equal(mine, np.asarray(theirs))
        else:
            assert mine == theirs, k
        assert gf._kv_by_key[k].start == f.offset
    assert len(r.tensors) == gf.n_tensors
    for t, rt in zip(gf.tensors, r.tensors):
        assert t.name == rt.name and t.type == int(rt.tensor_type) and t.ne == tuple(int(x) for x in rt.shape)
        assert t.file_offset == rt.data_offset and t.nbytes == rt.n_bytes
        assert t.info_start == rt.field.offset


# ------------------------------------------------------------------------------------------ the tiny valid file

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("gguf"), "tiny", H.VALID)


def test_tiny_roundtrip(tiny):
    gf = load_gguf(tiny)
    assert (gf.version, gf.alignment, gf.arch, gf.n_kv, gf.n_tensors) == (3, 32, "llama", 10, 3)
    assert gf.kv["tokenizer.ggml.tokens"] == ["<s>", "</s>", "h\u00e9", "w\u00f6rld", ""]
    assert gf.kv["tokenizer.ggml.token_type"].dtype == np.int32
    assert gf.kv["tokenizer.ggml.add_bos_token"] is True
    assert gf.kv["general.file_size_hint"] == -7 and gf.kv["general.pi"] == 3.141592653589793
    assert gf.kv_type("tokenizer.ggml.tokens") == "arr[str,5]" and gf.kv_type("llama.block_count") == "u32"
    assert [(t.name, t.type_name, t.ne) for t in gf.tensors] == [
        ("token_embd.weight", "q8_0", (64, 3)), ("norm.weight", "f32", (5,)), ("out.weight", "f32", (8, 2))]
    assert [t.offset for t in gf.tensors] == [0, 224, 256] and gf.data_offset == H.MARKS["data"]
    assert gf.tensor("out.weight").shape == (2, 8) and gf.tensor("norm.weight").ne4 == (5, 1, 1, 1)
    for i, t in enumerate(H.default_tensors()):
        assert gf.tensor_data(t["name"]).tobytes() == H.tensor_bytes(t)
    _check_layout(gf)
    _compare_with_gguf_py(gf, gguf.GGUFReader(tiny))
    assert require_arch(gf, {"llama"}) == "llama"
    with pytest.raises(GGUFError, match="supported architecture") as ei:
        require_arch(gf, {"gpt2", "qwen2"})
    assert "gpt2" in str(ei.value) and "'llama'" in str(ei.value) and "tiny.gguf" in str(ei.value)


def test_tiny_weight_context(tiny):
    gf = load_gguf(tiny)
    ctx, w = create_weight_context(gf)
    assert ggml.get_no_alloc(ctx) and list(w) == [t.name for t in gf.tensors]
    assert ggml.used_mem(ctx) == 3 * ggml.tensor_overhead()
    for ti in gf.tensors:
        t = w[ti.name]
        assert t.name == ti.name and t.type == ti.type and t.shape == ti.ne4 and ggml.nbytes(t) == ti.nbytes
        assert ggml.get_tensor(ctx, ti.name) is t
        v = ggml.get_data(t)
        assert np.shares_memory(v, gf.buffer()) and np.shares_memory(v, gf.tensor_data(ti.name))
    norm = ggml.get_data(w["norm.weight"])
    np.testing.assert_array_equal(norm.reshape(-1), np.float32([-1.0, -0.5, 0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="read-only"):
        norm[0, 0, 0, 0] = 1.0          # the mapping is read-only
    emb = ggml.get_data_f32(w["token_embd.weight"]).reshape(3, 64)
    ref = gguf.quants.dequantize(gf.tensor_data("token_embd.weight").reshape(3, -1),
                                 gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(emb, ref)
    ctx2, w2 = create_weight_context(gf, ["out.weight"])
    assert list(w2) == ["out.weight"] and w2["out.weight"].data == w["out.weight"].data
    with pytest.raises(KeyError):
        create_weight_context(gf, ["nope"])
    # the mapping outlives the GGUFFile while a weight context uses it
    del gf
    import gc
    gc.collect()
    assert ggml.get_data(w["norm.weight"]).reshape(-1)[4] == 1.0


def test_valid_variants(tmp_path):
    # version 2 is accepted (same layout); zero tensors; trailing bytes; general.alignment = 64
    gf = load_gguf(_write(tmp_path, "v2", H.patch(H.VALID, 4, "<I", 2)))
    assert gf.version == 2
    gf = load_gguf(_write(tmp_path, "notensors", H.build(tensors=[])[0]))
    assert gf.n_tensors == 0 and gf.data_offset == gf.file_size
    _check_layout(gf)
    gf = load_gguf(_write(tmp_path, "trailing", H.build(trailing=b"\0" * 100)[0]))
    assert [r["kind"] for r in _check_layout(gf)][-1] == "padding"
    gf = load_gguf(_write(tmp_path, "align64", H.build(alignment=64,
                                                      extra_kvs=[("general.alignment", H.val(H.U32, 64))])[0]))
    assert gf.alignment == 64 and [t.offset for t in gf.tensors] == [0, 256, 320]
    _check_layout(gf)
    gf = load_gguf(_write(tmp_path, "empty_tensor", H.build(tensors=H.with_tensor(1, ne=[0, 3]))[0]))
    assert gf.tensor("norm.weight").nbytes == 0
    _check_layout(gf)
    # non-UTF-8 is accepted on request
    gf = load_gguf(_write(tmp_path, "latin1", H.CASES_BY_NAME["non_utf8_string"].make()), strict_utf8=False)
    assert gf.kv["general.name"].encode("utf-8", "surrogateescape") == b"tiny \xc3("


def test_gguf_writer_file(tmp_path):
    """A file written by gguf-py's GGUFWriter (with general.alignment) loads and matches GGUFReader."""
    p = str(tmp_path / "writer.gguf")
    w = gguf.GGUFWriter(p, "llama")
    w.add_block_count(2)
    w.add_custom_alignment(64)
    w.add_token_list(["a", "b", "\u00fc"])
    w.add_token_scores([0.0, -1.5, 2.25])
    w.add_array("test.ints", [1, 2, 3])
    w.add_bool("test.flag", False)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 7)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 16)).astype(np.float16))
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    gf = load_gguf(p)
    assert gf.alignment == 64 and gf.kv["test.flag"] is False and gf.tensor("q8").ne == (64, 4)
    _check_layout(gf)
    _compare_with_gguf_py(gf, gguf.GGUFReader(p))
    ctx, ws = create_weight_context(gf)
    np.testing.assert_array_equal(ggml.get_data_f32(ws["q8"]).reshape(4, 64),
                                  gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0))


# ------------------------------------------------------------------------------------------ hostile files

@pytest.mark.parametrize("case", H.CASES, ids=[c.name for c in H.CASES])
def test_hostile(tmp_path, case):
    path = _write(tmp_path, f"hostile_{case.name}", case.make())
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(GGUFError) as ei:
            load_gguf(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 1.0
    assert peak < 1 << 20, f"peak Python allocation {peak} bytes for a {os.path.getsize(path)}-byte file"
    e = ei.value
    msg = str(e)
    assert isinstance(e, ValueError) and isinstance(e, ggviz.GGUFError)
    assert f"hostile_{case.name}.gguf" in msg and "offset" in msg and "expected" in msg and "found" in msg
    assert case.mentions in msg, msg
    if case.at is not None:
        assert e.offset == case.at, msg
    assert 0 <= e.offset <= max(os.path.getsize(path), 0)
    assert (e.source == "gguf.cpp") == case.ggml_rejects, (e.source, msg)


def test_hostile_cases_vs_real_ggml(tmp_path):
    paths = [_write(tmp_path, c.name, c.make()) for c in H.CASES]
    verdicts = H.ggml_verdicts(paths)
    if verdicts is None:
        pytest.skip("the real ggml (libggml-python) is not available")
    for c, v in zip(H.CASES, verdicts):
        assert v["ok"] != c.ggml_rejects, (c.name, v)


def test_fuzz(tmp_path):
    """300 seeded mutations: each loads or raises GGUFError, fast, without big allocations; and ggviz agrees with
    the real ggml on each one."""
    cases = H.fuzz_cases(300, seed=1)
    paths, results = [], []
    tracemalloc.start()
    try:
        for name, data in cases:
            p = _write(tmp_path, name, data)
            paths.append(p)
            t0 = time.perf_counter()
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            try:
                gf = load_gguf(p)
                _check_layout(gf, zero_padding=False)     # ggml does not look at the padding bytes
                results.append(gf)
            except GGUFError as e:
                assert os.path.basename(p) in str(e) and "offset" in str(e)
                results.append(e)
            _, peak = tracemalloc.get_traced_memory()
            assert time.perf_counter() - t0 < 0.5, name
            assert peak - before < 1 << 20, (name, peak - before)
    finally:
        tracemalloc.stop()
    n_ok = sum(isinstance(r, GGUFFile) for r in results)
    assert 10 < n_ok < len(cases) - 100, n_ok          # the fuzzer exercises both outcomes
    verdicts = H.ggml_verdicts(paths)
    if verdicts is None:
        pytest.skip("the real ggml (libggml-python) is not available")
    for (name, _), r, v in zip(cases, results, verdicts):
        if isinstance(r, GGUFFile):
            assert v["ok"], f"{name}: ggviz accepts, ggml rejects"
            assert (v["version"], v["alignment"], v["data_offset"]) == (r.version, r.alignment, r.data_offset)
            assert v["keys"] == [k.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for k in r.kv]
            assert v["tensors"] == [[t.name, t.type, t.offset, t.nbytes] for t in r.tensors], name
        elif r.source == "gguf.cpp":
            assert not v["ok"], f"{name}: ggviz rejects with a gguf.cpp rule, ggml accepts: {r}"
        # else: rejected by a llama.cpp/ggviz rule only; ggml may accept


def test_lazy_package_import():
    code = ("import sys, ggviz; assert 'ggviz.ggml.gguf' not in sys.modules; "
            "assert ggviz.GGUFError is __import__('ggviz.ggml.gguf').ggml.gguf.GGUFError; "
            "assert issubclass(ggviz.GGUFError, ValueError); ggviz.load_gguf")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_ROOT)


def test_missing_file_is_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_gguf(tmp_path / "nope.gguf")


# ------------------------------------------------------------------------------------------ the real model

needs_model = pytest.mark.skipif(not os.path.exists(MODEL), reason="default model not downloaded "
                                 "(python -c 'from ggviz.fetch import fetch_default_model; fetch_default_model()')")


@pytest.fixture(scope="module")
def model():
    if not os.path.exists(MODEL):
        pytest.skip("default model not downloaded")
    return load_gguf(MODEL)


@needs_model
def test_real_model_loads_fast():
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    load_gguf(MODEL)                        # warm the page cache
    r0, t0 = rss(), time.perf_counter()
    gf = load_gguf(MODEL)
    dt, grown = time.perf_counter() - t0, rss() - r0
    print(f"load_gguf: {dt * 1e3:.0f} ms, RSS +{grown / 2**20:.1f} MiB")
    assert dt < 2.0
    assert grown < 64 << 20                 # metadata and tokenizer only; the 94 MiB of weights stay unread
    assert gf.n_tensors == 272


@needs_model
def test_real_model(model):
    gf = model
    assert (gf.version, gf.alignment, gf.arch) == (3, 32, "llama")
    assert require_arch(gf, {"llama"}) == "llama"
    assert gf.kv["llama.block_count"] == 30 and gf.kv["llama.embedding_length"] == 576
    assert len(gf.kv["tokenizer.ggml.tokens"]) == 49152 and len(gf.kv["tokenizer.ggml.merges"]) == 48900
    assert gf.n_tensors == 272 == 2 + 30 * 9
    types = {t.name: t.type_name for t in gf.tensors}
    assert types["token_embd.weight"] == "q8_0"
    for t in gf.tensors:
        if t.name.endswith("norm.weight"):
            assert t.type_name == "f32" and t.n_dims == 1
        elif t.name != "token_embd.weight":
            assert t.type_name == "q4_1" and t.n_dims == 2, t
    assert gf.tensor("token_embd.weight").ne == (576, 49152)
    assert gf.tensor("blk.0.ffn_down.weight").ne == (1536, 576)
    lay = _check_layout(gf)
    assert lay[-1]["end"] == os.path.getsize(MODEL)
    for t in gf.tensors:
        assert t.file_offset % 32 == 0
    d = gf.tensor_data("blk.3.attn_k.weight")
    assert type(d) is np.ndarray and d.dtype == np.uint8 and not d.flags.writeable
    assert d.size == gf.tensor("blk.3.attn_k.weight").nbytes and np.shares_memory(d, gf.buffer())


@needs_model
def test_real_model_vs_gguf_py(model):
    _compare_with_gguf_py(model, gguf.GGUFReader(MODEL))


@needs_model
def test_real_model_vs_real_ggml(model):
    v = H.ggml_verdicts([MODEL])
    if v is None:
        pytest.skip("the real ggml (libggml-python) is not available")
    v = v[0]
    assert v["ok"] and (v["version"], v["alignment"], v["data_offset"]) == (3, 32, model.data_offset)
    assert v["keys"] == list(model.kv)
    assert v["tensors"] == [[t.name, t.type, t.offset, t.nbytes] for t in model.tensors]


@needs_model
def test_real_model_weights(model):
    ctx, w = create_weight_context(model)
    assert len(w) == 272
    emb = w["token_embd.weight"]
    assert emb.type == ggml.GGML_TYPE_Q8_0 and emb.shape == (576, 49152, 1, 1)
    raw = ggml.get_data(emb)
    assert np.shares_memory(raw, model.tensor_data("token_embd.weight"))
    assert not raw.flags.writeable
    row = np.ascontiguousarray(raw[0, 0, 1234])      # token 1234's embedding row, Q8_0 blocks
    mine = ggml.quants.dequantize_row(ggml.GGML_TYPE_Q8_0, row)
    ref = gguf.quants.dequantize(row, gguf.GGMLQuantizationType.Q8_0)
    assert mine.shape == (576,)
    np.testing.assert_array_equal(mine, ref)
    norm = ggml.get_data(w["output_norm.weight"]).reshape(-1)
    assert norm.dtype == np.float32 and norm.shape == (576,) and np.isfinite(norm).all()


@needs_model
@pytest.mark.parametrize("cut", [100, 500_000, 1_700_000, 1_785_600, 1_785_700, 50_000_000])
def test_real_model_truncated(tmp_path, cut):
    p = tmp_path / f"cut{cut}.gguf"
    with open(MODEL, "rb") as f:
        p.write_bytes(f.read(cut))
    with pytest.raises(GGUFError) as ei:
        load_gguf(p)
    assert f"cut{cut}.gguf" in str(ei.value) and "offset" in str(ei.value)
