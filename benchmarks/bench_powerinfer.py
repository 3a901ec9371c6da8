"""PowerInfer on SmolLM2-135M: sparse kernels vs dense MUL_MAT (compiled), and a PWRI model vs the dense one.

    python benchmarks/bench_powerinfer.py [--threads 1] [--budget 3] [--cols 1]
    python benchmarks/bench_powerinfer.py --model DIR/SmolLM2-135M-Instruct.Q4_1.powerinfer.gguf [--eval-tokens 128]

With ``--model`` (a file written by ``ggviz powerinfer build``) it prints, for thresholds -inf, -1, -0.5 and 0, on
held-out text (the ``pydoc_data.topics`` tokens after the ones the build trained on): the rows MUL_MAT_SPARSE
skipped, the perplexity against the dense model's and the mean KL divergence of the next-token distributions, and
three noise-floor rows: "dense F16 down" (the dense graph with the PWRI file's F16 down weights, ``use_f16_down``)
against the dense model, "dense +1 ulp" (the dense model with every value of ``ffn_out-0`` moved by one ulp) and
threshold -inf against the F16-down graph. Measured (512 tokens, build on 30,720, 8 epochs, positive weight 1.85):
-1: 9.7 % skipped, +0.02 % perplexity, KL 0.022; -0.5: 17.2 %, +1.55 %, 0.055; 0: 29.7 %, +4.53 %, 0.143;
-inf: 0 %, -0.20 %, 0.0038 (vs F16 down 0.0028); dense F16 down vs dense 0.0037, dense +1 ulp vs dense 0.0035.
Then the decode times of the dense model and of the sparse one at each threshold, in alternating rounds
(``--rounds``), both on the compiled walk. Measured (512 tokens, 2 threads, 3 rounds): the sparse model takes 1.75x
(threshold 0) to 2.11x (-1) the dense time (the faithful kernels took 148 s against 6.6 s); the sparse graph adds
the predictor and computes up/gate row by row in ggml's plain layout, where the dense one runs repacked GEMMs.

MUL_MAT_SPARSE (ggviz/ggml/cpu/fast/sparse.py) on a Q4_1 ffn_up-like weight (1536 rows of 576) at 0 %, 50 % and
90 % of the rows skipped (random rows, the predictor's pattern on a SwiGLU model is close to random), against two
dense baselines: the same per-row kernel keeping every row (ggml's plain MUL_MAT, which is what PowerInfer runs its
sparse kernel against), and ggviz's CPU_REPACK MUL_MAT (8 rows interleaved, a GEMV micro-kernel: what the dense
llama.cpp of today runs). Both include the src1 quantization. Also AXPY (F16 down_t, 1536 x 576) at the same
sparsities against AXPY keeping every row. Times are medians over rounds that alternate the cases, so the ratios
are what counts on a noisy machine. Measured (1 thread, 1 column, shared machine, two runs): MUL_MAT_SPARSE 0.557x
the plain dense time at 50 % skipped, 0.19x at 90 % (0.83x / 0.28x the repacked dense MUL_MAT); one compiled call per
MUL_MAT_SPARSE (INIT + chunks, the kept rows listed before they are computed), ~7 us fixed. AXPY 0.60x / 0.21x.
A script, not a test.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggviz import ggml, llama  # noqa: E402
from ggviz.ggml import consts as C  # noqa: E402
from ggviz.ggml import quants as Q  # noqa: E402
from ggviz.ggml.cpu import ggml_cpu, repack  # noqa: E402
from ggviz.ggml.cpu import powerinfer as cpu_pi  # noqa: E402
from ggviz.ggml.cpu.fast import sparse  # noqa: E402
from ggviz.powerinfer import pipeline as P  # noqa: E402

N_EMBD, N_FF = 576, 1536


def _repacked_dense(raw, cols, nth):
    """A one-node graph: MUL_MAT with the weight in the CPU_REPACK buffer (the compiled graph walk)."""
    ctx_w = ggml.init(ggml.tensor_overhead() * 2, None, True)
    w = ggml.new_tensor_2d(ctx_w, C.GGML_TYPE_Q4_1, N_EMBD, N_FF)
    store = ggml.init(raw.nbytes + ggml.tensor_overhead() + 256)
    holder = ggml.new_tensor_1d(store, C.GGML_TYPE_I8, raw.nbytes)
    ggml.get_data(holder).reshape(-1).view(np.uint8)[:] = raw.reshape(-1)
    w.data = holder.data
    buf = repack.place_weights([w])
    ctx = ggml.init(16 << 20)
    x = ggml.new_tensor_2d(ctx, C.GGML_TYPE_F32, N_EMBD, cols)
    ggml.get_data(x)[...] = np.random.default_rng(1).standard_normal(ggml.get_data(x).shape).astype(np.float32)
    y = ggml.mul_mat(ctx, w, x)
    gf = ggml.new_graph(ctx)
    ggml.build_forward_expand(gf, y)
    plan = ggml_cpu.graph_plan(gf, nth)
    if plan.work_size:
        plan.work_data = np.zeros(plan.work_size, np.uint8)
    keep = (ctx_w, store, holder, buf, ctx, x, y)

    def run():
        ggml_cpu.graph_compute(gf, plan)
    return run, plan.extra is not None, keep


def _lsm(L):
    L = np.asarray(L, np.float64)
    L = L - L.max(1, keepdims=True)
    return L - np.log(np.exp(L).sum(1, keepdims=True))


def model_table(path, eval_tokens: int, skip_tokens: int, threads: int, thresholds=(-np.inf, -1.0, -0.5, 0.0),
                rounds: int = 3) -> None:
    """Rows skipped, perplexity and KL of the PWRI model at several thresholds, against the dense model."""
    meta = pathlib.Path(path).parent / "metrics.json"
    if skip_tokens < 0:
        m = json.loads(meta.read_text()) if meta.exists() else {}
        skip_tokens = int(m.get("tokens", 0)) + int(m.get("heldout", 0))
    sparse = llama.model_load_from_file(str(path))
    dense = llama.model_load_from_file(str(P.DEFAULT_MODEL))
    ids = P.corpus_tokens(dense.vocab, skip_tokens + eval_tokens)[skip_tokens:]
    n_layer = dense.hparams.n_layer

    def run(model, thr=None, nudge=None):
        """Logits, the fraction of rows below the threshold, and the decode's seconds. The timed decode has no eval
        callback (a callback splits the graph at every node it asks for); a second decode counts the rows.
        ``nudge``: a node name whose every value is moved by one ulp (np.nextafter) before the graph goes on."""
        if thr is not None:
            cpu_pi.set_sparse_pred_threshold(thr)
        ctx = P._ctx(model, len(ids), threads)
        idx = []
        if nudge is not None:
            def nudge_cb(t, ask):
                if ask:
                    return t.name == nudge
                a = ggml.get_data(t)
                a[...] = np.nextafter(a, np.float32(np.inf))
                return True
            ctx.cparams.cb_eval = nudge_cb
        try:
            t0 = time.perf_counter()
            assert llama.decode(ctx, P._batch_all_logits(ids)) == 0
            dt = time.perf_counter() - t0
            L = np.array(llama.get_logits(ctx), np.float64).reshape(len(ids), -1)
            if thr is not None:
                def cb(t, ask):
                    if ask:
                        return t.name.startswith("mlp_pre_out-")
                    idx.append(float((np.asarray(ggml.get_data(t)) < thr).mean()))
                    return True
                ctx.cparams.cb_eval = cb
                llama.memory_clear(llama.get_memory(ctx), True)
                assert llama.decode(ctx, P._batch_all_logits(ids)) == 0
        finally:
            llama.free(ctx)
        return L, (float(np.mean(idx)) if idx else 0.0), dt

    Ld, _, td = run(dense)
    pd = _lsm(Ld)
    tgt = np.asarray(ids[1:])
    ppl_d = float(np.exp(-pd[:-1][np.arange(len(tgt)), tgt].mean()))
    print(f"{len(ids)} held-out tokens (after {skip_tokens}), {threads} threads; dense perplexity {ppl_d:.3f}, "
          f"decode {td:.2f} s (compiled walk)")
    # the like-for-like reference of threshold -inf: the dense graph with the PWRI file's F16 down weights
    # (P.use_f16_down: the same weights and the same F16 rounding of the down projection's input as AXPY)
    dense16 = llama.model_load_from_file(str(P.DEFAULT_MODEL))
    keep16 = P.use_f16_down(dense16)
    L16, _, _ = run(dense16)
    p16 = _lsm(L16)
    print(f"{'threshold':>14s} {'skipped':>8s} {'perplexity':>11s} {'delta':>8s} {'mean KL':>9s} "
          f"{'top-1 agree':>11s} {'s':>6s} {'/ dense':>8s}")
    kl16 = float((np.exp(pd) * (pd - p16)).sum(1).mean())
    ppl16 = float(np.exp(-p16[:-1][np.arange(len(tgt)), tgt].mean()))
    print(f"{'dense F16 down':>14s} {'-':>8s} {ppl16:>11.3f} {ppl16 / ppl_d - 1:>+8.2%} {kl16:>9.4f} "
          f"{float((Ld.argmax(1) == L16.argmax(1)).mean()):>11.3f}")
    # the noise floor itself: the dense model with layer 0's FFN output moved by one ulp, nothing else changed
    # (every later MUL_MAT rounds its input to Q8_1 blocks, so a last-bit difference can cross a rounding step)
    Ln, _, _ = run(dense, nudge="ffn_out-0")
    pn = _lsm(Ln)
    kln = float((np.exp(pd) * (pd - pn)).sum(1).mean())
    ppln = float(np.exp(-pn[:-1][np.arange(len(tgt)), tgt].mean()))
    print(f"{'dense +1 ulp':>14s} {'-':>8s} {ppln:>11.3f} {ppln / ppl_d - 1:>+8.2%} {kln:>9.4f} "
          f"{float((Ld.argmax(1) == Ln.argmax(1)).mean()):>11.3f}")
    for thr in thresholds:
        Ls, skipped, ts = run(sparse, thr)
        ps = _lsm(Ls)
        ppl = float(np.exp(-ps[:-1][np.arange(len(tgt)), tgt].mean()))
        kl = float((np.exp(pd) * (pd - ps)).sum(1).mean())
        top1 = float((Ld.argmax(1) == Ls.argmax(1)).mean())
        print(f"{thr:>14} {skipped:>8.1%} {ppl:>11.3f} {ppl / ppl_d - 1:>+8.2%} {kl:>9.4f} {top1:>11.3f} "
              f"{ts:>6.2f} {ts / td:>8.2f}", flush=True)
        if thr == -np.inf:
            kl_l = float((np.exp(p16) * (p16 - ps)).sum(1).mean())
            print(f"{'(vs F16 down)':>14s} {'':>8s} {'':>11s} {'':>8s} {kl_l:>9.4f} "
                  f"{float((L16.argmax(1) == Ls.argmax(1)).mean()):>11.3f}", flush=True)
    del keep16
    if rounds > 0:
        # decode times measured alternately (dense, then the sparse model at each threshold, round after round):
        # on a shared machine only these ratios mean something
        cases = [("dense", dense, None)] + [(f"sparse {thr}", sparse, thr) for thr in thresholds]
        times = {name: [] for name, _, _ in cases}
        ctxs = {name: P._ctx(m, len(ids), threads) for name, m, _ in cases}
        try:
            for _ in range(rounds):
                for name, m, thr in cases:
                    if thr is not None:
                        cpu_pi.set_sparse_pred_threshold(thr)
                    ctx = ctxs[name]
                    llama.memory_clear(llama.get_memory(ctx), True)
                    t0 = time.perf_counter()
                    assert llama.decode(ctx, P._batch_all_logits(ids)) == 0
                    times[name].append(time.perf_counter() - t0)
        finally:
            for ctx in ctxs.values():
                llama.free(ctx)
        base = statistics.median(times["dense"])
        print(f"decode of the {len(ids)} tokens, {threads} threads, median of {rounds} alternating rounds:")
        for name, v in times.items():
            print(f"{name:>14s} {statistics.median(v):8.2f} s {statistics.median(v) / base:8.2f} x dense")
    print(f"(rows skipped: the mean over the {n_layer} layers' MUL_MAT_SPARSE of the rows whose predictor logit is "
          "below the threshold; s: one decode of all the tokens (a single run: see the alternating rounds), both "
          "models on the compiled walk: the sparse one adds the predictor and computes up/gate row by row in "
          "ggml's plain layout, the dense one runs repacked GEMMs)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of timing per table (default 3)")
    ap.add_argument("--cols", type=int, default=1, help="tokens (src1 columns), default 1 (decode)")
    ap.add_argument("--model", default=None, help="a PWRI GGUF from `ggviz powerinfer build`: the model table")
    ap.add_argument("--eval-tokens", type=int, default=128)
    ap.add_argument("--thresholds", default="-inf,-1,-0.5,0", help="comma-separated (default -inf,-1,-0.5,0)")
    ap.add_argument("--skip-tokens", type=int, default=-1, help="corpus tokens to skip (default: the build's)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds of the model run (default 3)")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.cols < 1 or args.budget <= 0 or args.eval_tokens < 2 or args.rounds < 0:
        ap.error("--threads and --cols must be >= 1, --budget > 0, --eval-tokens >= 2, --rounds >= 0")
    if args.model is not None:
        thr = [float(t) for t in args.thresholds.split(",")]
        model_table(args.model, args.eval_tokens, args.skip_tokens, max(args.threads, 2), thr, args.rounds)
        return 0
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((N_FF, N_EMBD)) * 0.05).astype(np.float32)
    raw = np.asarray(Q.quantize_row_ref(C.GGML_TYPE_Q4_1, W)).reshape(-1).view(np.uint8).reshape(N_FF, -1)
    X = rng.standard_normal((args.cols, N_EMBD)).astype(np.float32)
    idx = rng.standard_normal((args.cols, N_FF)).astype(np.float32)
    gpu0 = np.zeros(N_FF, np.int32)
    mm = sparse.SparseMatMul(C.GGML_TYPE_Q4_1, raw, N_EMBD)
    dense_run, compiled, keep = _repacked_dense(raw, args.cols, args.threads)

    # thresholds giving 0 / 50 / 90 % skipped rows on this idx
    thr = {"0%": -np.inf, "50%": float(np.quantile(idx, 0.5)), "90%": float(np.quantile(idx, 0.9))}
    cases = {"dense CPU_REPACK MUL_MAT": dense_run}
    out = np.empty((args.cols, N_FF), np.float32)      # the result buffer, reused (a graph's dst is allocated once)
    for k, t in thr.items():
        cases[f"MUL_MAT_SPARSE {k} skipped"] = (lambda t=t: mm(X, idx, gpu0, t, args.threads, out=out))
    Wt = (rng.standard_normal((N_FF, N_EMBD)) * 0.05).astype(np.float16)
    H = rng.standard_normal((args.cols, N_FF)).astype(np.float32)
    for k, t in thr.items():
        cases[f"AXPY {k} skipped"] = (lambda t=t: sparse.run_axpy(Wt, H, idx, gpu0, t, args.threads))
    for fn in cases.values():           # compile / warm up
        fn()
    times = {k: [] for k in cases}
    t_end = time.perf_counter() + args.budget
    while time.perf_counter() < t_end or len(times[next(iter(times))]) < 5:
        for k, fn in cases.items():
            t0 = time.perf_counter_ns()
            fn()
            times[k].append(time.perf_counter_ns() - t0)
    med = {k: statistics.median(v) / 1e3 for k, v in times.items()}
    base_plain = med["MUL_MAT_SPARSE 0% skipped"]
    base_repack = med["dense CPU_REPACK MUL_MAT"]
    print(f"Q4_1 {N_FF}x{N_EMBD} (ffn_up), {args.cols} column(s), {args.threads} thread(s), "
          f"{len(times[next(iter(times))])} rounds; compiled dense graph: {compiled}")
    print(f"{'case':34s} {'us':>9s} {'/ plain dense':>14s} {'/ repacked dense':>17s}")
    for k in cases:
        if k.startswith("AXPY"):
            continue
        print(f"{k:34s} {med[k]:9.1f} {med[k] / base_plain:14.3f} {med[k] / base_repack:17.3f}")
    base_axpy = med["AXPY 0% skipped"]
    print(f"\nAXPY F16 down_t {N_FF}x{N_EMBD}")
    for k in cases:
        if k.startswith("AXPY"):
            print(f"{k:34s} {med[k]:9.1f} {med[k] / base_axpy:14.3f}")
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
