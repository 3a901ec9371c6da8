"""Capture llama.cpp's sampler chains: which token each seeded chain selects, and the candidate array it leaves.

Writes ``tests/data/llamacpp/sampling_draws.json`` and ``tests/data/llamacpp/sampling_generate.npz``. Needs
llama-cpp-python (0.3.36 was used: llama.cpp with ggml 0.25.3); run it with the interpreter that has llama_cpp::

    /tmp/llvenv/bin/python tools/capture_llamacpp_sampling.py [--model PATH] [--out-dir DIR]

Draws (``sampling_draws.json``): for every case a chain is built with the low-level API
(``llama_sampler_chain_init`` / ``_add`` / ``llama_sampler_init_{top_k,top_p,min_p,temp,dist}``), then for each input
of the case's sequence, in order and with the same chain (so the RNG state carries over): a ``llama_token_data_array``
is filled from the logits exactly as ``llama_sampler_sample`` fills it (ids 0..n-1, p = 0, unsorted),
``llama_sampler_apply`` runs the chain, ``llama_sampler_accept`` gets the token. Recorded per draw: the selected
token id, the array's final size and ``sorted`` flag, and the candidates as the chain left them (ids in array order and
their ``p``; all of them when at most ``FULL`` survive, else the first ``HEAD`` and the selected one). Inputs are
random vectors (stored in the JSON) and rows of ``smollm2_teacher_forced_seq1.npz`` (float16 logits, read as float32:
many ties, which exercise the exact order of ``std::partial_sort`` / ``std::sort``).

Generation (``sampling_generate.npz``): the default model, prompt ``PROMPT`` (add_special, parse_special), flash
attention off, 2 threads, the chain of ggviz.run.make_sampler (top-k 40, top-p 0.95, min-p 0.05, temp 0.8, dist 1234);
``llama_sampler_sample`` picks 16 tokens. Stored: the prompt tokens, the tokens, and the float32 logits each step
sampled from (so a test can replay ggviz's chain on llama.cpp's very logits).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "llamacpp")
DEFAULT_MODEL = os.path.join(ROOT, "data", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TF_NPZ = os.path.join(DATA, "smollm2_teacher_forced_seq1.npz")

FULL = 512      # store every candidate when at most this many survive
HEAD = 64       # else the first HEAD (and the selected one)

PROMPT = "Once upon a time"
GEN_SEED, GEN_TEMP, GEN_N = 1234, 0.8, 16

DEFAULT_CHAIN = [["top_k", 40], ["top_p", 0.95, 1], ["min_p", 0.05, 1], ["temp", 0.8], ["dist"]]


def make_inputs() -> dict[str, list[float]]:
    """Stored inputs (float32 values, written as the doubles they are)."""
    rng = np.random.default_rng(20240611)
    inp = {"hand": [1.0, 3.0, 2.0, 0.5, 2.5]}
    for i in range(8):
        inp[f"rand50_{i}"] = (rng.standard_normal(50) * 2.5).astype(np.float32)
    for i in range(4):   # many ties, > 128 candidates: the bucket sort path of llama.cpp's partial sort
        inp[f"ties300_{i}"] = (np.round(rng.standard_normal(300) * 12) / 4).astype(np.float32)
    for i in range(2):   # many ties, > 1024 candidates: top-p's adaptive partial sort
        inp[f"ties3000_{i}"] = (np.round(rng.standard_normal(3000) * 8) / 2).astype(np.float32)
    inp["flat2000"] = (rng.standard_normal(2000) * 0.05).astype(np.float32)   # top-p 0.95 needs > 256 candidates
    return {k: [float(x) for x in np.asarray(v, np.float32)] for k, v in inp.items()}


TF_ROWS = [0, 3, 17, 42, 64, 90, 101, 114]
RAND = [f"rand50_{i}" for i in range(8)]
TF = [f"tf:{r}" for r in TF_ROWS]
TIES300 = [f"ties300_{i}" for i in range(4)]
TIES3000 = [f"ties3000_{i}" for i in range(2)]

# name, chain, seeds, input sequence (one draw per input, same chain throughout)
CASES = [
    ("hand top-k 3, temp 0.5", [["top_k", 3], ["temp", 0.5], ["dist"]], [42, 2, 19, 1, 6], ["hand"]),
    ("dist, random", [["dist"]], [0, 1, 42, 1234, 4294967294], RAND),
    ("temp 0.8 + dist, random", [["temp", 0.8], ["dist"]], [0, 1, 42, 1234, 4294967294], RAND),
    ("default chain, random", DEFAULT_CHAIN, [0, 1, 42, 1234, 4294967294], RAND),
    ("dist, 40 draws from one input", [["dist"]], [5489], ["rand50_0"] * 40),
    ("dist, real logits", [["dist"]], [1234, 7, 3735928559], TF),
    ("temp 0.8 + dist, real logits", [["temp", 0.8], ["dist"]], [1234, 7, 3735928559], TF),
    ("default chain, real logits", DEFAULT_CHAIN, [1234, 7, 3735928559], TF),
    ("default chain, temp 1.5, real logits",
     [["top_k", 40], ["top_p", 0.95, 1], ["min_p", 0.05, 1], ["temp", 1.5], ["dist"]], [99], TF),
    ("top-k 1 + dist (one candidate: the draw still happens)", [["top_k", 1], ["dist"]], [11], RAND[:2]),
    ("temp 0 + dist", [["temp", 0.0], ["dist"]], [3], RAND[:3]),
    ("top-k 200 + dist, real logits", [["top_k", 200], ["dist"]], [5], TF[:4]),
    ("top-k 40 + dist, ties", [["top_k", 40], ["dist"]], [5], TIES300 + TIES3000),
    ("top-k 128 + dist, ties", [["top_k", 128], ["dist"]], [5], TIES300),
    ("top-k 129 + dist, ties", [["top_k", 129], ["dist"]], [5], TIES300 + TIES3000),
    ("top-p 0.9 + dist, ties", [["top_p", 0.9, 1], ["dist"]], [6], TIES300 + TIES3000),
    ("top-p 0.95 + dist, real logits", [["top_p", 0.95, 1], ["dist"]], [6], TF[:4]),
    ("top-p 0.95 + dist, flat (top-p needs more than 256)", [["top_p", 0.95, 1], ["dist"]], [6], ["flat2000"]),
    ("top-p 0.5 min_keep 300 + dist, ties", [["top_p", 0.5, 300], ["dist"]], [6], TIES300 + TIES3000),
    ("min-p 0.05 + dist, real logits", [["min_p", 0.05, 1], ["dist"]], [8], TF[:4]),
    ("min-p 0.2 min_keep 100 + dist, ties (sorted fallback)", [["min_p", 0.2, 100], ["dist"]], [8], TIES300),
    ("min-p 0.9 min_keep 20 + dist, ties (sorted fallback)", [["min_p", 0.9, 20], ["dist"]], [8], TIES300),
    ("top-k 40, min-p 0.3 min_keep 3, temp 1.2 + dist, ties",
     [["top_k", 40], ["min_p", 0.3, 3], ["temp", 1.2], ["dist"]], [9], TIES300 + TIES3000),
    ("top-k 0 (off) + top-p 1.0 (off) + min-p 0 (off) + dist, random",
     [["top_k", 0], ["top_p", 1.0, 1], ["min_p", 0.0, 1], ["dist"]], [10], RAND[:4]),
]


def build_chain(llama_cpp, spec, seed):
    params = llama_cpp.llama_sampler_chain_default_params()
    chain = llama_cpp.llama_sampler_chain_init(params)
    for s in spec:
        name, args = s[0], s[1:]
        if name == "top_k":
            smpl = llama_cpp.llama_sampler_init_top_k(int(args[0]))
        elif name == "top_p":
            smpl = llama_cpp.llama_sampler_init_top_p(float(args[0]), int(args[1]))
        elif name == "min_p":
            smpl = llama_cpp.llama_sampler_init_min_p(float(args[0]), int(args[1]))
        elif name == "temp":
            smpl = llama_cpp.llama_sampler_init_temp(float(args[0]))
        elif name == "dist":
            smpl = llama_cpp.llama_sampler_init_dist(int(seed))
        else:
            raise ValueError(name)
        llama_cpp.llama_sampler_chain_add(chain, smpl)
    return chain


TD = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def apply_once(llama_cpp, chain, logits: np.ndarray) -> dict:
    n = len(logits)
    buf = (llama_cpp.llama_token_data * n)()
    view = np.frombuffer(buf, dtype=TD)
    assert ctypes.sizeof(llama_cpp.llama_token_data) == TD.itemsize
    view["id"] = np.arange(n, dtype=np.int32)
    view["logit"] = logits
    view["p"] = 0.0
    arr = llama_cpp.llama_token_data_array(data=buf, size=n, selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
    size, sel = int(arr.size), int(arr.selected)
    assert 0 <= sel < size, (sel, size)
    tok = int(view["id"][sel])
    llama_cpp.llama_sampler_accept(chain, tok)
    out = {"token": tok, "index": sel, "size": size, "sorted": bool(arr.sorted)}
    keep = size if size <= FULL else HEAD
    out["ids"] = [int(x) for x in view["id"][:keep]]
    out["p"] = [float(x) for x in view["p"][:keep]]
    out["p_selected"] = float(view["p"][sel])
    return out


def capture_draws(llama_cpp) -> dict:
    inputs = make_inputs()
    tf = np.load(TF_NPZ)["logits"]
    vec = lambda key: (tf[int(key[3:])].astype(np.float32) if key.startswith("tf:")  # noqa: E731
                       else np.asarray(inputs[key], np.float32))
    cases = []
    for name, spec, seeds, seq in CASES:
        for seed in seeds:
            chain = build_chain(llama_cpp, spec, seed)
            draws = [apply_once(llama_cpp, chain, vec(key)) for key in seq]
            # llama_sampler_reset re-seeds dist: the first draw again
            llama_cpp.llama_sampler_reset(chain)
            again = apply_once(llama_cpp, chain, vec(seq[0]))
            assert again == draws[0], name
            cases.append({"name": name, "chain": spec, "seed": seed, "inputs": list(seq), "draws": draws,
                          "get_seed": int(llama_cpp.llama_sampler_get_seed(chain))})
            llama_cpp.llama_sampler_free(chain)
    return {"llama_cpp_python": llama_cpp.__version__, "full": FULL, "head": HEAD,
            "tf_npz": os.path.basename(TF_NPZ), "inputs": inputs, "cases": cases}


def capture_generation(llama_cpp, model_path: str) -> dict:
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = 512
    cp.n_batch = 512
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = 0
    ctx = llama_cpp.llama_init_from_model(model, cp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    text = PROMPT.encode()
    toks = (llama_cpp.llama_token * 256)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), toks, 256, True, True)
    prompt = [int(toks[i]) for i in range(n)]
    chain = build_chain(llama_cpp, DEFAULT_CHAIN[:3] + [["temp", GEN_TEMP], ["dist"]], GEN_SEED)

    def decode(ids):
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(ids))) == 0

    decode(prompt)
    tokens, logits = [], []
    for i in range(GEN_N):
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).astype(np.float32)
        tok = int(llama_cpp.llama_sampler_sample(chain, ctx, -1))
        logits.append(row.copy())
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        tokens.append(tok)
        if i < GEN_N - 1:
            decode([tok])
    llama_cpp.llama_sampler_free(chain)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return {"prompt": np.array(prompt, np.int32), "tokens": np.array(tokens, np.int32),
            "logits": np.stack(logits).astype(np.float32), "seed": np.int64(GEN_SEED), "temp": np.float32(GEN_TEMP)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out-dir", default=DATA)
    args = ap.parse_args()
    import llama_cpp

    draws = capture_draws(llama_cpp)
    with open(os.path.join(args.out_dir, "sampling_draws.json"), "w") as f:
        json.dump(draws, f, separators=(",", ":"))
        f.write("\n")
    print(f"{sum(len(c['draws']) for c in draws['cases'])} draws in {len(draws['cases'])} chains")
    gen = capture_generation(llama_cpp, args.model)
    np.savez_compressed(os.path.join(args.out_dir, "sampling_generate.npz"), **gen)
    print("generation:", gen["prompt"].tolist(), "->", gen["tokens"].tolist())


if __name__ == "__main__":
    main()
