"""Capture llama.cpp's one-batch prefill logits (every position) for tests/test_sgemm_prefill.py.

Usage: capture_llamacpp_prefill.py MODEL OUT.npz   (run with the AVX2 llama-cpp-python 0.3.36, see README)

The 115 token ids of tests/data/llamacpp/smollm2_teacher_forced_seq1.npz are decoded in ONE llama_decode (n_ctx 512,
n_batch = n_ubatch = 512, logits for every token, flash attention off, F16 KV cache), once with 1 thread and once
with 2. Stored compactly: the sha256 of every float32 logits row (bit-exact comparison) and a few rows (1 thread) in float32
(for a readable diff when a row differs)."""
import hashlib
import os
import sys

import llama_cpp as L
import numpy as np

ROWS = (0, 1, 57, 114)


def prefill(model, ids, n_threads):
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
    cp.n_threads = cp.n_threads_batch = n_threads
    cp.flash_attn_type = 0
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(len(ids), 0, 1)
    for i, t in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1
    batch.n_tokens = len(ids)
    assert L.llama_decode(ctx, batch) == 0
    nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    out = np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(nv,)).astype(np.float32).copy()
                    for i in range(len(ids))])
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    return out


def main():
    path, out = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    ids = np.load(os.path.join(here, "..", "tests", "data", "llamacpp", "smollm2_teacher_forced_seq1.npz"))["ids"]
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    res = {"ids": np.asarray(ids, np.int32), "rows": np.asarray(ROWS, np.int32)}
    for nth in (1, 2):
        lg = prefill(model, [int(t) for t in ids], nth)
        res[f"sha256_t{nth}"] = np.array([hashlib.sha256(r.tobytes()).hexdigest() for r in lg])
        if nth == 1:    # the rows in float32 once: the sha256s say whether 2 threads give the same bits
            res["logits"] = lg[list(ROWS)]
    same = int((res["sha256_t1"] == res["sha256_t2"]).sum())
    np.savez_compressed(out, build=np.array(L.llama_print_system_info().decode()), **res)
    print("ok", len(ids), "rows;", same, "rows equal between 1 and 2 threads")


if __name__ == "__main__":
    main()
