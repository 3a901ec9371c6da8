"""ggviz beside a plain NumPy forward of the same model, and llama.cpp when importable: decode/prefill tok/s.

    .venv/bin/python benchmarks/bench_numpy.py [--threads 1,2] [--decode 32] [--prefill 128] [--reps 3]
                                               [--faithful] [--no-reference] [--no-llama-cpp] [--blas] [--model M]

(This was ``ggviz bench --numpy``, "the older comparison"; ``ggviz bench`` is now only what a user waits for,
``benchmarks/bench_user.py``.) For each thread count (default 1 and 2):

* ggviz, as a user gets it (``use_extra_bufts=True``: weights repacked into the CPU_REPACK buffer type, graphs
  computed by the compiled kernels; ``--faithful`` measures the node-by-node faithful path instead, slowly):
  decode tok/s (one token per ``llama_decode``, greedy), prefill tok/s (one batch of ``--prefill`` tokens, last
  logits only), load-to-first-token (model load, kernel cache load, prompt, first token), and the peak RSS;
* a plain NumPy reference of the same model: weights dequantized to float32 once, ``np.dot`` for every product
  (NumPy's BLAS, OpenBLAS or MKL, held to 1 / 2 threads by ``threadpoolctl``), float32 KV cache, a straightforward
  llama forward. Its logits are checked against ggviz's before it is timed;
* llama.cpp through ``llama_cpp`` (llama-cpp-python), when it can be imported.

Timings are the best of a few repetitions (the machine may be shared); a progress bar counts the runs
(``ggviz.progress``: on a terminal or in Jupyter only). It prints; it does not assert.
"""
from __future__ import annotations

import importlib.util
import math
import os
import resource
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ggviz import cli  # noqa: E402
from ggviz.fetch import fetch_default_model  # noqa: E402
from ggviz.ggml import quants as Q  # noqa: E402
from ggviz.ggml.cpu import ggml_cpu, repack  # noqa: E402
from ggviz.ggml.gguf import load_gguf  # noqa: E402
from ggviz.llama.batch import batch_add, batch_get_one, batch_init  # noqa: E402
from ggviz.llama.context import context_default_params, init_from_model  # noqa: E402
from ggviz.llama.model import load_hparams, model_default_params, model_load_from_file  # noqa: E402
from ggviz.progress import progress, write  # noqa: E402

try:    # optional: the compiled kernels (Numba); without them the bench times the faithful path
    from ggviz.ggml.cpu.fast import kernels as fast_kernels
except ImportError:
    fast_kernels = None

PROMPT_IDS = [1, 504, 3458, 282, 4649, 314, 28, 7065, 1326, 30]   # a short fixed prompt (token ids)


# =====================================================================================================================
# the NumPy reference
# =====================================================================================================================

class NumpyLlama:
    """A plain float32 llama forward: weights dequantized once, np.dot, float32 KV cache, no ggml anywhere."""

    def __init__(self, path, n_ctx=512):
        gf = load_gguf(path)
        hp = load_hparams(gf)
        self.hp = hp
        names = {t.name: t for t in gf.tensors}

        def W(name):
            ti = names[name]
            raw = gf.tensor_data(name)
            rows = int(np.prod(ti.ne4[1:]))
            if ti.type == 0:
                return np.array(raw.view(np.float32)).reshape(rows, -1)
            if ti.type == 1:
                return raw.view(np.float16).astype(np.float32).reshape(rows, -1)
            return np.asarray(Q.dequantize_row(ti.type, raw.reshape(rows, -1).view(np.uint8)),
                              np.float32).reshape(rows, -1)

        self.tok = W("token_embd.weight")
        self.out = W("output.weight") if "output.weight" in names else self.tok
        self.norm = W("output_norm.weight").reshape(-1)
        self.layers = []
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            self.layers.append({k: W(p + k + ".weight") for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                "ffn_down")})
            for k in ("attn_norm", "ffn_norm"):
                self.layers[-1][k] = self.layers[-1][k].reshape(-1)
        self.n_ctx = n_ctx
        hd = hp.n_embd_head_k
        self.kc = np.zeros((hp.n_layer, n_ctx, hp.n_head_kv, hd), np.float32)
        self.vc = np.zeros((hp.n_layer, n_ctx, hp.n_head_kv, hd), np.float32)
        inv = hp.rope_freq_base_train ** (-np.arange(0, hp.n_rot, 2, dtype=np.float64) / hp.n_rot)
        ang = np.arange(n_ctx, dtype=np.float64)[:, None] * inv[None, :]
        self.cos, self.sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        self.n_past = 0

    def reset(self):
        self.n_past = 0

    def _rms(self, x, w):
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + self.hp.f_norm_rms_eps)) * w

    def _rope(self, x, pos):
        # ggml's NORM rope: adjacent pairs (x[2i], x[2i+1]) rotated by pos * base^(-2i/n_rot)
        c, s = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def forward(self, ids, all_logits=False):
        hp = self.hp
        T = len(ids)
        p0 = self.n_past
        pos = np.arange(p0, p0 + T)
        nh, nkv, hd = hp.n_head, hp.n_head_kv, hp.n_embd_head_k
        g = nh // nkv
        x = self.tok[np.asarray(ids)]
        scale = 1.0 / math.sqrt(hd)
        mask = np.triu(np.full((T, p0 + T), -np.inf, np.float32), k=p0 + 1)
        for il, L in enumerate(self.layers):
            h = self._rms(x, L["attn_norm"])
            q = np.dot(h, L["attn_q"].T).reshape(T, nh, hd)
            k = np.dot(h, L["attn_k"].T).reshape(T, nkv, hd)
            v = np.dot(h, L["attn_v"].T).reshape(T, nkv, hd)
            q, k = self._rope(q, pos), self._rope(k, pos)
            self.kc[il, p0:p0 + T] = k
            self.vc[il, p0:p0 + T] = v
            K = self.kc[il, :p0 + T]                     # (n, nkv, hd)
            V = self.vc[il, :p0 + T]
            qg = q.reshape(T, nkv, g, hd).transpose(1, 0, 2, 3).reshape(nkv, T * g, hd)
            s = np.matmul(qg, K.transpose(1, 2, 0)) * scale          # (nkv, T*g, n)
            s = s.reshape(nkv, T, g, -1) + mask[None, :, None, :]
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.matmul(s.reshape(nkv, T * g, -1), V.transpose(1, 0, 2))   # (nkv, T*g, hd)
            o = o.reshape(nkv, T, g, hd).transpose(1, 0, 2, 3).reshape(T, nh * hd)
            x = x + np.dot(o, L["attn_output"].T)
            h = self._rms(x, L["ffn_norm"])
            gt = np.dot(h, L["ffn_gate"].T)
            up = np.dot(h, L["ffn_up"].T)
            x = x + np.dot((gt / (1.0 + np.exp(-gt))) * up, L["ffn_down"].T)
        self.n_past += T
        h = self._rms(x if all_logits else x[-1:], self.norm)
        return np.dot(h, self.out.T)


# =====================================================================================================================
# measurements
# =====================================================================================================================

def _peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / (1024.0 * 1024.0)


def _best(fn, reps):
    best = None
    for _ in range(reps):
        v = fn()
        best = v if best is None or v > best else best
    return best


def _ggviz_measure(model, n_threads, n_decode, n_prefill, reps, log, use_blas=False):
    """decode tok/s; prefill tok/s with the graph reused (the steady state llama-bench measures: the KV cache is
    emptied with seq_rm, so the next prompt of the same length reuses the graph) and with a fresh graph (after
    memory_clear: graph build, scheduler split, allocation and compiling the graph included)."""
    p = context_default_params()
    p.n_ctx = max(512, n_prefill + 64, len(PROMPT_IDS) + n_decode + 16)
    p.n_threads = p.n_threads_batch = n_threads
    p.use_blas = use_blas
    ctx = init_from_model(model, p)

    def decode_run():
        ctx.memory_clear()
        ctx.decode(batch_get_one(PROMPT_IDS))
        tok = int(np.argmax(ctx.get_logits_ith(-1)))
        ctx.decode(batch_get_one([tok]))            # first decode step: graph build + plan (not timed)
        tok = int(np.argmax(ctx.get_logits_ith(-1)))
        t0 = time.perf_counter()
        for _ in range(n_decode):
            ctx.decode(batch_get_one([tok]))
            tok = int(np.argmax(ctx.get_logits_ith(-1)))
        return n_decode / (time.perf_counter() - t0)

    ids = [(PROMPT_IDS[i % len(PROMPT_IDS)] + 37 * i) % model.hparams.n_vocab for i in range(n_prefill)]
    b = batch_init(n_prefill)
    for i, t in enumerate(ids):
        batch_add(b, int(t), i, [0], i == n_prefill - 1)

    def prefill_run(fresh):
        if fresh:
            ctx.memory_clear()
            ctx.graph_cache_clear(installed=True)
        else:
            ctx.memory_seq_rm(-1, -1, -1)
        t0 = time.perf_counter()
        ctx.decode(b)
        return n_prefill / (time.perf_counter() - t0)

    dec = _best(decode_run, reps)
    log(f"  ggviz  {n_threads} thread(s): decode  {dec:7.1f} tok/s")
    cold = _best(lambda: prefill_run(True), max(1, reps - 1))
    prefill_run(False)
    pre = _best(lambda: prefill_run(False), reps)
    log(f"  ggviz  {n_threads} thread(s): prefill {pre:7.1f} tok/s ({n_prefill} tokens; {cold:.1f} tok/s when the "
        f"graph is built for it)")
    return dec, pre


def _ref_measure(ref, n_threads, n_decode, n_prefill, reps, log):
    ids = [(PROMPT_IDS[i % len(PROMPT_IDS)] + 37 * i) % ref.hp.n_vocab for i in range(n_prefill)]
    # the BLAS library NumPy links (OpenBLAS, MKL ...) runs np.dot with n_threads threads inside
    with threadpool_limits(limits=n_threads, user_api="blas"):
        def decode_run():
            ref.reset()
            lg = ref.forward(PROMPT_IDS)
            tok = int(np.argmax(lg[-1]))
            lg = ref.forward([tok])
            tok = int(np.argmax(lg[-1]))
            t0 = time.perf_counter()
            for _ in range(n_decode):
                tok = int(np.argmax(ref.forward([tok])[-1]))
            return n_decode / (time.perf_counter() - t0)

        def prefill_run():
            ref.reset()
            t0 = time.perf_counter()
            ref.forward(ids)
            return n_prefill / (time.perf_counter() - t0)

        dec = _best(decode_run, reps)
        log(f"  numpy  {n_threads} thread(s): decode  {dec:7.1f} tok/s")
        pre = _best(prefill_run, reps)
        log(f"  numpy  {n_threads} thread(s): prefill {pre:7.1f} tok/s ({n_prefill} tokens)")
    return dec, pre


def _llama_cpp_measure(path, n_threads, n_decode, n_prefill, log):
    try:
        import llama_cpp
    except Exception:  # noqa: BLE001
        return None
    try:
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(512, n_prefill + 64), n_threads=n_threads,
                              n_threads_batch=n_threads, n_batch=512, verbose=False, logits_all=False)
        ids = [(PROMPT_IDS[i % len(PROMPT_IDS)] + 37 * i) % 49152 for i in range(n_prefill)]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        pre = n_prefill / (time.perf_counter() - t0)
        llm.reset()
        llm.eval(PROMPT_IDS)
        t0 = time.perf_counter()
        tok = PROMPT_IDS[-1]
        for _ in range(n_decode):
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        dec = n_decode / (time.perf_counter() - t0)
        log(f"  llama.cpp {n_threads} thread(s): decode {dec:7.1f} tok/s, prefill {pre:7.1f} tok/s")
        return dec, pre
    except Exception as exc:  # noqa: BLE001
        log(f"  llama.cpp: failed ({type(exc).__name__}: {exc})")
        return None


def main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="bench_numpy.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, type=cli.model_file,
                    help=cli.MODEL_HELP)
    ap.add_argument("--threads", default=[1, 2], type=cli.thread_list,
                    help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--decode", type=cli.int_arg(1), default=32, help="tokens generated per measurement (default 32)")
    ap.add_argument("--prefill", type=cli.int_arg(1), default=128, help="prompt length for the prefill measurement")
    ap.add_argument("--reps", type=cli.int_arg(1), default=3, help="repetitions per measurement (the best is kept)")
    ap.add_argument("--blas", action="store_true",
                    help="add the BLAS backend (NumPy's BLAS takes large prompt MUL_MATs), as llama.cpp built with "
                         "GGML_BLAS; default: llama.cpp's default CPU build (tinyBLAS sgemm / vec_dot)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even if importable")
    ap.add_argument("--faithful", action="store_true", help="measure the faithful path (use_extra_bufts=False)")
    ap.add_argument("--no-reference", action="store_true", help="skip the NumPy reference")
    args = ap.parse_args(argv)
    threads = args.threads

    def log(msg):
        write(msg)          # print + flush, without tearing the progress bar apart

    t_start = time.perf_counter()
    if args.model is None:
        path = fetch_default_model(quiet=True)
    else:
        path = args.model

    # the progress bar counts the runs: load to first token, each measurement, loading the NumPy reference
    runs = ["load, first token"] + [f"ggviz, {nt} thread(s)" for nt in threads]
    if not args.no_reference:
        runs += ["numpy reference: load"] + [f"numpy, {nt} thread(s)" for nt in threads]
    if not args.no_llama_cpp and importlib.util.find_spec("llama_cpp") is not None:
        runs += [f"llama.cpp, {nt} thread(s)" for nt in threads]
    bar = progress(total=len(runs), desc="bench_numpy", unit="run", leave=False)
    bar.set_postfix_str(runs[0], refresh=True)

    def done():
        bar.update(1)
        if bar.n < len(runs):
            bar.set_postfix_str(runs[bar.n], refresh=True)

    # ---- load to first token (includes loading -- or compiling -- the compiled kernels)
    t0 = time.perf_counter()
    mp = model_default_params()
    mp.use_extra_bufts = not args.faithful
    model = model_load_from_file(path, mp)
    t_load = time.perf_counter() - t0
    t1 = time.perf_counter()
    compile_s = fast_kernels.warmup() if (fast_kernels is not None and not args.faithful) else 0.0
    cp = context_default_params()
    cp.n_ctx = 512
    cp.n_threads = cp.n_threads_batch = max(threads)
    ctx = init_from_model(model, cp)
    ctx.decode(batch_get_one(PROMPT_IDS))
    first = int(np.argmax(ctx.get_logits_ith(-1)))
    t_first = time.perf_counter() - t0
    logits_ggviz = np.array(ctx.get_logits_ith(-1), np.float32)
    fast = any(isinstance(getattr(t, "py_extra", None), repack.RepackedWeight) for t in model.tensors.values())
    log(f"bench_numpy: {os.path.basename(str(path))}, "
        f"{'fast path (CPU_REPACK + compiled kernels)' if fast else 'faithful path'}"
        + ("" if fast_kernels is not None else f" [no compiled kernels: {ggml_cpu.FAST_PATH_ERROR}]"))
    log(f"  load-to-first-token {t_first:.2f} s (model load {t_load:.2f} s, kernels {compile_s:.2f} s"
        f"{' -- includes compiling them (first run)' if compile_s > 5 else ' from cache'}, "
        f"prompt of {len(PROMPT_IDS)} + first token {time.perf_counter() - t1 - compile_s:.2f} s); first token {first}")
    del ctx
    done()

    results = {}
    n_decode = args.decode if not args.faithful else min(args.decode, 4)
    n_prefill = args.prefill if not args.faithful else min(args.prefill, 16)    # the faithful path is slow
    for nt in threads:
        results[("ggviz", nt)] = _ggviz_measure(model, nt, n_decode, n_prefill,
                                                args.reps if not args.faithful else 1, log, use_blas=args.blas)
        done()
    rss_ggviz = _peak_rss_mb()
    log(f"  peak RSS (ggviz) {rss_ggviz:.0f} MB")

    if not args.no_reference:
        tr = time.perf_counter()
        ref = NumpyLlama(path, n_ctx=max(512, n_prefill + 64))
        lg = ref.forward(PROMPT_IDS)[-1]
        log(f"  numpy reference loaded in {time.perf_counter() - tr:.1f} s; last-prompt logits vs ggviz: "
            f"top-1 {'same' if int(np.argmax(lg)) == first else 'DIFFERENT'}, "
            f"cosine {float(np.dot(lg, logits_ggviz) / (np.linalg.norm(lg) * np.linalg.norm(logits_ggviz))):.5f}, "
            f"max |diff| {float(np.abs(lg - logits_ggviz).max()):.3f}")
        done()
        for nt in threads:
            results[("numpy", nt)] = _ref_measure(ref, nt, n_decode, n_prefill, args.reps, log)
            done()
        del ref

    if not args.no_llama_cpp:
        for nt in threads:
            r = _llama_cpp_measure(path, nt, n_decode, n_prefill, log)
            if r is None:
                break
            results[("llama.cpp", nt)] = r
            done()
    bar.close()

    # ---- summary
    log("")
    log(f"{'':10s} {'threads':>7s} {'decode tok/s':>13s} {'prefill tok/s':>14s} {'decode x':>9s} {'prefill x':>10s}")
    for (who, nt), (dec, pre) in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rd = results.get(("numpy", nt))
        xd = f"{dec / rd[0]:.2f}" if rd and who != "numpy" else ""
        xp = f"{pre / rd[1]:.2f}" if rd and who != "numpy" else ""
        log(f"{who:10s} {nt:7d} {dec:13.1f} {pre:14.1f} {xd:>9s} {xp:>10s}")
    best_g = max((v for k, v in results.items() if k[0] == "ggviz"), key=lambda v: v[0], default=None)
    best_r = max((v for k, v in results.items() if k[0] == "numpy"), key=lambda v: v[0], default=None)
    best_l = max((v for k, v in results.items() if k[0] == "llama.cpp"), key=lambda v: v[0], default=None)
    if best_g and best_r:
        log(f"best ggviz decode / best numpy decode: {best_g[0] / best_r[0]:.2f}x; "
            f"prefill: {max(v[1] for k, v in results.items() if k[0] == 'ggviz') / max(v[1] for k, v in results.items() if k[0] == 'numpy'):.2f}x")
    if best_g and best_l:
        log(f"best ggviz / best llama.cpp: decode {best_g[0] / best_l[0]:.2f}x, prefill "
            f"{max(v[1] for k, v in results.items() if k[0] == 'ggviz') / max(v[1] for k, v in results.items() if k[0] == 'llama.cpp'):.2f}x")
    log(f"load-to-first-token {t_first:.2f} s; peak RSS {rss_ggviz:.0f} MB (ggviz part); "
        f"total bench time {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
