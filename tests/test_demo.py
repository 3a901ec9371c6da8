"""ggviz demo: layer 0 as the eval callback copies it out of a real llama_decode, against an independent NumPy
computation of the layer; and the ``ggviz demo`` command, end to end.

The NumPy side shares nothing with ggviz: the weights come from gguf-py (``gguf.GGUFReader`` and
``gguf.quants.dequantize``), the layer is written out in plain float32 NumPy from the llama architecture (RMS norm,
rope "NORM" pairs, causal grouped-query attention, SwiGLU). It differs from ggml by design in one place:
ggml quantizes a matrix product's F32 activations to Q8 blocks before the dot products with Q4_1/Q8_0 weights, so
the products agree to about 1e-2 (relative), not to float rounding. K and V are rounded to F16 here too, as the KV
cache stores them (llama.cpp's default cache type).
"""
from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest

from ggviz import cli
from ggviz.tools import demo
from ggviz.fetch import default_model_path

PROMPT = "The ggml library is"


@pytest.fixture(scope="module")
def model_path():
    path = default_model_path()
    if not path.is_file():
        pytest.skip(f"the default model is not fetched ({path})")
    return path


@pytest.fixture(scope="module")
def run(model_path):
    return demo.run(str(model_path), PROMPT, n_threads=2)


def _reference_layer0(path, ids, hp):
    """Layer 0 of the llama architecture in float32 NumPy for the tokens ``ids`` at positions 0..n-1.
    Returns {name: array} in ggml's data order ([token, ...] rows)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}

    def W(name):
        t = tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)

    f32 = np.float32
    n, nh, nkv, hd = len(ids), hp.n_head, hp.n_head_kv, hp.n_embd_head_k
    eps = f32(hp.f_norm_rms_eps)
    tok = tensors["token_embd.weight"]
    x = np.asarray(dequantize(tok.data[np.asarray(ids)], tok.tensor_type), dtype=f32)       # (n, n_embd)

    def rms(v):
        return (v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)).astype(f32)

    def rope(m):                     # (n, heads, hd); NORM mode rotates the pairs (2i, 2i+1) by pos * base^(-2i/n_rot)
        i = np.arange(hp.n_rot // 2, dtype=np.float64)
        theta = np.arange(n, dtype=np.float64)[:, None] * hp.rope_freq_base_train ** (-2.0 * i / hp.n_rot)
        c, s = np.cos(theta).astype(f32)[:, None, :], np.sin(theta).astype(f32)[:, None, :]
        o = m.copy()
        x0, x1 = m[..., 0:hp.n_rot:2], m[..., 1:hp.n_rot:2]
        o[..., 0:hp.n_rot:2] = x0 * c - x1 * s
        o[..., 1:hp.n_rot:2] = x0 * s + x1 * c
        return o

    out = {"embd": x}
    out["norm-0"] = rms(x)
    h = out["attn_norm-0"] = out["norm-0"] * W("blk.0.attn_norm.weight")
    q, k, v = h @ W("blk.0.attn_q.weight").T, h @ W("blk.0.attn_k.weight").T, h @ W("blk.0.attn_v.weight").T
    out["Qcur-0 MUL_MAT"], out["Kcur-0 MUL_MAT"], out["Vcur-0 MUL_MAT"] = q, k, v
    q = out["Qcur-0"] = rope(q.reshape(n, nh, hd))
    k = out["Kcur-0"] = rope(k.reshape(n, nkv, hd))
    k16 = k.astype(np.float16)                                  # the F16 KV cache
    v16 = v.reshape(n, nkv, hd).astype(np.float16)
    out["cache_k"], out["cache_v"] = k16, v16
    grp = nh // nkv
    probs = np.zeros((nh, n, n), f32)
    heads = np.zeros((n, nh, hd), f32)
    mask = np.triu(np.full((n, n), -np.inf, f32), k=1)           # causal: token i sees cells 0..i
    for hh in range(nh):
        kv = hh // grp                                          # ggml broadcasts K/V head hh // grp over Q heads
        s = q[:, hh, :] @ k16[:, kv, :].astype(f32).T / f32(math.sqrt(hd)) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        probs[hh] = p
        heads[:, hh, :] = p @ v16[:, kv, :].astype(f32)
    out["kq_soft_max-0"] = probs
    out["kqv_out-0"] = heads.reshape(n, nh * hd)
    out["attn_out-0"] = out["kqv_out-0"] @ W("blk.0.attn_output.weight").T
    ffn_inp = out["ffn_inp-0"] = out["attn_out-0"] + x
    h2 = out["ffn_norm-0"] = rms(ffn_inp) * W("blk.0.ffn_norm.weight")
    g, u = out["ffn_gate-0"], out["ffn_up-0"] = h2 @ W("blk.0.ffn_gate.weight").T, h2 @ W("blk.0.ffn_up.weight").T
    act = out["ffn_swiglu-0"] = (g / (f32(1) + np.exp(-g))) * u
    out["ffn_out-0"] = act @ W("blk.0.ffn_down.weight").T
    out["l_out-0"] = out["ffn_out-0"] + ffn_inp
    return out


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_layer0_captured_by_cb_eval_matches_numpy(run, model_path):
    hp = run.model.hparams
    n = len(run.ids)
    assert run.status == 0 and n == 6
    ref = _reference_layer0(model_path, run.ids, hp)
    names = [v["name"] for v in run.values]
    # the callback saw every node of layer 0, in graph order, and nothing after l_out-0
    i0, i1 = run.layer0_range
    assert [v["node_n"] for v in run.values] == [0] + list(range(i0, i1))
    assert names[-1] == "l_out-0" and names.count("norm-0") == 2

    def got(name, op=None):
        return run.value(name, op)

    # (captured value, reference, tolerance): exact up to float rounding where no product is involved; the matrix
    # products carry the Q8 quantization of their inputs (~1e-2), and the error then flows through the residual
    checks = {
        "embd": (got("embd"), ref["embd"], 1e-6),
        "norm-0 (attention)": (run.values[1]["data"], ref["norm-0"], 1e-5),
        "attn_norm-0": (got("attn_norm-0"), ref["attn_norm-0"], 1e-5),
        "Qcur-0 MUL_MAT": (got("Qcur-0", "MUL_MAT"), ref["Qcur-0 MUL_MAT"], 3e-2),
        "Kcur-0 MUL_MAT": (got("Kcur-0", "MUL_MAT"), ref["Kcur-0 MUL_MAT"], 3e-2),
        "Vcur-0 MUL_MAT": (got("Vcur-0", "MUL_MAT"), ref["Vcur-0 MUL_MAT"], 3e-2),
        "Qcur-0 ROPE": (got("Qcur-0", "ROPE"), ref["Qcur-0"], 3e-2),
        "Kcur-0 ROPE": (got("Kcur-0", "ROPE"), ref["Kcur-0"], 3e-2),
        # the cache writes (SET_ROWS into cells 0..n-1) and the transposed V view the attention reads
        "cache_k_l0 SET_ROWS": (got("cache_k_l0 (view)", "SET_ROWS")[0, 0, :n], ref["cache_k"].reshape(n, -1), 3e-2),
        "cache_v_l0 VIEW": (got("cache_v_l0 (view)", "VIEW")[0, :, :, :n], ref["cache_v"].transpose(2, 1, 0), 3e-2),
        "kq_soft_max-0": (got("kq_soft_max-0")[0, :, :, :n], ref["kq_soft_max-0"], 3e-2),
        "kqv_out-0": (got("kqv_out-0"), ref["kqv_out-0"], 3e-2),
        "attn_out-0": (got("attn_out-0"), ref["attn_out-0"], 3e-2),
        "ffn_inp-0": (got("ffn_inp-0"), ref["ffn_inp-0"], 3e-2),
        "ffn_norm-0": (got("ffn_norm-0"), ref["ffn_norm-0"], 3e-2),
        "ffn_gate-0": (got("ffn_gate-0"), ref["ffn_gate-0"], 3e-2),
        "ffn_up-0": (got("ffn_up-0"), ref["ffn_up-0"], 3e-2),
        "ffn_swiglu-0": (got("ffn_swiglu-0"), ref["ffn_swiglu-0"], 3e-2),
        "ffn_out-0": (got("ffn_out-0", "MUL_MAT"), ref["ffn_out-0"], 3e-2),
        "l_out-0": (got("l_out-0"), ref["l_out-0"], 3e-2),
    }
    errors = {k: _rel(a, b) for k, (a, b, _) in checks.items()}
    bad = {k: f"{errors[k]:.2e} > {tol:.0e}" for k, (_, _, tol) in checks.items() if not errors[k] <= tol}
    assert not bad, f"relative errors vs NumPy: {bad} (all: { {k: f'{e:.1e}' for k, e in errors.items()} })"
    # the cells past the prompt are masked: no attention weight there
    assert np.all(got("kq_soft_max-0")[0, :, :, n:] == 0)


def test_layer0_graph_is_the_decode_graphs_view(run):
    gf = run.graph.gf
    i0, i1 = run.layer0_range
    assert gf.n_nodes == 1086 and (i0, i1) == (1, 37)
    assert run.view.n_nodes == i1 - i0
    assert [t.name for t in run.view.nodes] == [gf.nodes[i].name for i in range(i0, i1)]


def _vertices(dot_src: str) -> list:
    return re.findall(r"^\s*(n\d+|l\d+|x\d+) \[", dot_src, re.M)


def test_demo_command_writes_its_files(tmp_path, capsys, model_path):
    """``ggviz demo --out DIR``: the summary, the files (graph, arena, report), a real generation."""
    out = tmp_path / "out"
    assert cli.main(["demo", "--model", str(model_path), "--out", str(out), "-n", "4"]) == 0
    text = capsys.readouterr().out
    names = ["layer0.dot", "arena.png", "arena.txt", "report.html"] + (["layer0.svg"] if shutil.which("dot") else [])
    for name in names:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for key in ("model ", "graph ", "n_nodes=1086", "layer 0 is nodes #1-#36", "attention ", "files"):
        assert key in text, key
    verts = _vertices((out / "layer0.dot").read_text())
    assert sum(v.startswith("n") for v in verts) == 36
    assert "l_out-0" in (out / "layer0.dot").read_text()
    arena = (out / "arena.txt").read_text()
    assert "token_embd.weight" in arena and "cache_k_l0" in arena and "l_out-0" in arena
    gen = text.split("generate", 1)[1]
    assert "tokens per second" in gen and PROMPT in gen
    assert "report.html" in text.strip().splitlines()[-1]
