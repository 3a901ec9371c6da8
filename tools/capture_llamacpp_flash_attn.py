"""Capture llama.cpp's results with its DEFAULT context params (flash_attn_type = AUTO: enabled on the CPU) for
tests/test_flash_attn_llamacpp.py.

Usage: capture_llamacpp_flash_attn.py MODEL IDS.npz OUT_PREFIX   (the AVX2 llama-cpp-python 0.3.36, see the README)

IDS.npz: the ``ids`` of the text (the non-FA captures' teacher-forced text). Every context: llama_context_default_params()
with n_ctx 1024, n_batch = n_ubatch = 512 (flash_attn_type left at its default, AUTO). Writes

* OUT_PREFIX_fa.npz: ``ids``; the decode path (one token per llama_decode) with 1 and 2 threads and the one-batch
  prefill (every token in one llama_decode, all logits) with 1 and 2 threads: ``sha256_{decode,prefill}_t{1,2}``,
  the sha256 of every float32 logits row; ``logits_{decode,prefill}``: rows ``rows`` (1 thread) in float32;
  ``greedy_prompt_ids`` / ``greedy_ids``: 32 greedy tokens after "The capital of France is" (one token per decode,
  2 threads); ``log``: the lines llama.cpp logged creating the first context (Flash Attention resolution, the
  compute buffer sizes);
* OUT_PREFIX_fa_graph.json: the nodes of one decode step after the prompt "The ggml library is" (op, name, type, ne,
  source names, via cb_eval), 2 threads.
"""
import ctypes
import hashlib
import json
import os
import sys

import llama_cpp as L
import numpy as np

path, ids_npz, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
lib = os.path.join(os.path.dirname(L.__file__), "lib")
base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"))
for f, r, a in (("ggml_op_desc", ctypes.c_char_p, [ctypes.c_void_p]), ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]),
                ("ggml_type_name", ctypes.c_char_p, [ctypes.c_int])):
    getattr(base, f).restype = r
    getattr(base, f).argtypes = a


class T(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("pad", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


rec = {"on": False, "nodes": []}


@ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
def cb(t, ask, ud):
    if ask:
        return rec["on"]
    s = ctypes.cast(t, ctypes.POINTER(T)).contents
    rec["nodes"].append(dict(name=base.ggml_get_name(t).decode(), op=base.ggml_op_desc(t).decode(),
                             type=base.ggml_type_name(s.type).decode(), ne=list(s.ne),
                             src=[base.ggml_get_name(p).decode() for p in s.src[:5] if p]))
    return True


log_lines = []


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def log_cb(level, text, ud):
    log_lines.append(text.decode(errors="replace"))


L.llama_log_set(log_cb, None)
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
vocab = L.llama_model_get_vocab(model)
nv = L.llama_vocab_n_tokens(vocab)


def new_ctx(nth, with_cb=False):
    cp = L.llama_context_default_params()          # flash_attn_type: its default, AUTO
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 1024, 512, 512
    cp.n_threads = cp.n_threads_batch = nth
    if with_cb:
        cp.cb_eval = cb
        cp.cb_eval_user_data = None
    return L.llama_init_from_model(model, cp)


def dec(ctx, toks, all_logits=False):
    batch = L.llama_batch_init(len(toks), 0, 1)
    pos0 = dec.pos.get(id(ctx), 0)
    for i, t in enumerate(toks):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + i, 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1 if (all_logits or i == len(toks) - 1) else 0
    batch.n_tokens = len(toks)
    assert L.llama_decode(ctx, batch) == 0
    dec.pos[id(ctx)] = pos0 + len(toks)
    L.llama_batch_free(batch)
    if all_logits:
        return np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(nv,)).astype(np.float32).copy()
                         for i in range(len(toks))])
    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(nv,)).astype(np.float32).copy()


dec.pos = {}


def tokenize(s):
    b = s.encode("utf-8")
    buf = (L.llama_token * (len(b) + 16))()
    n = L.llama_tokenize(vocab, b, len(b), buf, len(b) + 16, True, True)
    assert n >= 0
    return [int(buf[i]) for i in range(n)]


def sha(rows):
    return np.array([hashlib.sha256(r.tobytes()).hexdigest() for r in rows])


ids = [int(t) for t in np.load(ids_npz)["ids"]]
rows = sorted({0, 1, len(ids) // 2, len(ids) - 1})
res = {"ids": np.asarray(ids, np.int32), "rows": np.asarray(rows, np.int32)}
first_log = None
for nth in (1, 2):
    ctx = new_ctx(nth)
    if first_log is None:
        first_log = list(log_lines)
    lg = np.stack([dec(ctx, [t]) for t in ids])
    L.llama_free(ctx)
    res[f"sha256_decode_t{nth}"] = sha(lg)
    if nth == 1:
        res["logits_decode"] = lg[rows]
        res["argmax_decode"] = lg.argmax(1).astype(np.int32)
    ctx = new_ctx(nth)
    lg = dec(ctx, ids, all_logits=True)
    L.llama_free(ctx)
    res[f"sha256_prefill_t{nth}"] = sha(lg)
    if nth == 1:
        res["logits_prefill"] = lg[rows]
ctx = new_ctx(2)
p = tokenize("The capital of France is")
lg = dec(ctx, p)
gen = []
for _ in range(32):
    t = int(np.argmax(lg))
    if L.llama_vocab_is_eog(vocab, t):
        break
    gen.append(t)
    lg = dec(ctx, [t])
L.llama_free(ctx)
res["greedy_prompt_ids"] = np.asarray(p, np.int32)
res["greedy_ids"] = np.asarray(gen, np.int32)
res["log"] = np.array("".join(first_log))
res["build"] = np.array(L.llama_print_system_info().decode())
np.savez_compressed(prefix + "_fa.npz", **res)
ctx = new_ctx(2, True)
gp = tokenize("The ggml library is")
lg = dec(ctx, gp)
rec["on"] = True
dec(ctx, [int(np.argmax(lg))])
rec["on"] = False
L.llama_free(ctx)
json.dump(dict(prompt_ids=gp, nodes=rec["nodes"]), open(prefix + "_fa_graph.json", "w"))
print("ok", len(ids), "ids;", len(rec["nodes"]), "graph nodes; greedy", gen)
