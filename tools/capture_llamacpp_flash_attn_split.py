"""The split-KV kernel (one query row over >= 512 KV cells) in llama.cpp: a 256-token prefill (one batch), then 8
tokens one per decode (n_kv 512), default context params (flash attention AUTO), n_ctx 1024, 1 and 2 threads."""
import hashlib
import sys

import llama_cpp as L
import numpy as np

path, ids_npz, out = sys.argv[1], sys.argv[2], sys.argv[3]
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
nv = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
base = [int(t) for t in np.load(ids_npz)["ids"]]
ids = (base * 3)[:264]
res = {"ids": np.asarray(ids, np.int32), "n_prefill": np.int32(256)}
for nth in (1, 2):
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 1024, 512, 512
    cp.n_threads = cp.n_threads_batch = nth
    ctx = L.llama_init_from_model(model, cp)
    arr = (L.llama_token * 256)(*ids[:256])
    assert L.llama_decode(ctx, L.llama_batch_get_one(arr, 256)) == 0
    shas = []
    for t in ids[256:]:
        arr = (L.llama_token * 1)(t)
        assert L.llama_decode(ctx, L.llama_batch_get_one(arr, 1)) == 0
        r = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(nv,)).astype(np.float32)
        shas.append(hashlib.sha256(r.tobytes()).hexdigest())
    res[f"sha256_t{nth}"] = np.array(shas)
    L.llama_free(ctx)
np.savez_compressed(out, **res)
print("ok", (res["sha256_t1"] == res["sha256_t2"]).sum(), "of 8 rows equal between 1 and 2 threads")
