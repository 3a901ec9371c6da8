"""PowerInfer's hybrid run vs the scheduler's, through llama_decode, on a PWRI model with an FFN split on ACCEL0.

    python benchmarks/bench_powerinfer_hybrid.py [--model DIR/X.powerinfer.gguf] [--budget 0.075] [--threads 3]
                                                 [--steps 4] [--dense]

Without ``--model`` a tiny build (16 training tokens, a 16-wide predictor) is made in a temporary directory
(~10 s); with ``--model`` and ``--budget`` the split is solved again from the build's ``activation/`` counts into a
temporary copy (so a full-offload build such as a 0.2 GiB one can be given a real hot/cold split). Two contexts
of the same model: ``hybrid = True`` with ``--threads`` threads (thread 0 drives the device, the others compute:
nth = threads - 1) and the scheduler's path with ``threads - 1`` CPU threads (so every CPU kernel splits its work
alike and the logits are the same bits). ``--dense``: also put what PowerInfer offloads before the neurons
(attention, predictor, ffn_norm, output) on the device (``llama_model_params.vram_offload_dense``). Decode steps alternate between the two. Printed: median time per decode
step of each and their ratio, the bytes each moves to / from the device per step (``backend_accel_stats``), and
from the hybrid timeline the device lane's busy time, how much of it overlaps CPU kernels, and how long the CPU
threads waited on ``is_finish`` of a device node. A script, not a test: on ggviz the "device" is the CPU's
faithful kernels in another Python thread, so this measures the mechanism, not a GPU's speed.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggviz import llama  # noqa: E402
from ggviz.ggml import accel  # noqa: E402
from ggviz.llama import powerinfer as lp  # noqa: E402
from ggviz.powerinfer import pipeline, solver  # noqa: E402

MODEL = ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _model(args, tmp: pathlib.Path) -> pathlib.Path:
    if args.model is None:
        r = pipeline.build(tmp / "build", MODEL, tokens=16, heldout=8, seq_len=24, hidden=16, epochs=1,
                           threshold=0.0, vram_budget_gib=args.budget, quiet=True)
        return r.model_path
    src = pathlib.Path(args.model)
    counts = np.stack([np.load(src.parent / "activation" / f"activation_{il}.npy") for il in range(30)])
    dst = tmp / src.name
    os.symlink(src.resolve(), dst)
    pm = llama.model_load_from_file(str(dst))
    budget = int(args.budget * (1 << 30))
    solver.write_gpuidx(dst, counts, lp.offload_plan(pm, budget)["neuron_bytes"], pm.layers[0].ffn_up, budget)
    llama.model_free(pm)
    return dst


def _union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(a, b) -> int:
    """ns of interval set a covered by interval set b."""
    ub = _union(b)
    tot = 0
    for x0, x1 in _union(a):
        for y0, y1 in ub:
            tot += max(0, min(x1, y1) - max(x0, y0))
    return tot


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--budget", type=float, default=0.075, help="GiB (default 0.075: ~1/3 of the neurons hot)")
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dense", action="store_true", help="vram_offload_dense: attention etc. on the device too")
    args = ap.parse_args()
    if args.threads < 2:
        ap.error("--threads must be >= 2 (thread 0 only drives the device)")
    with tempfile.TemporaryDirectory() as d:
        path = _model(args, pathlib.Path(d))
        dev = accel.backend_accel_device_new("ACCEL_BENCH")
        mp = llama.model_default_params()
        mp.vram_budget_gb = args.budget
        mp.devices = [dev]
        mp.vram_offload_dense = args.dense
        m = llama.model_load_from_file(str(path), mp)
        sm = m.sparse
        hot = [0 if sl.gpu_bucket is None else int(sl.gpu_bucket.ne[0]) for sl in sm.layers]
        print(f"model {path.name}: {sum(hot)} of {30 * 1536} neurons on {dev.context.name} "
              f"({sm.gpu_bytes / 2**20:.1f} MiB); before them: "
              + (", ".join(f"{w} {b / 2**20:.1f} MiB{'' if p else ' (not placed)'}" for w, b, p in sm.offloaded)
               or "nothing (no --dense)"))
        ctxs = {}
        for name, hyb, nt in (("hybrid", True, args.threads), ("sched", False, args.threads - 1)):
            cp = llama.context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch = 256, 8, 8
            cp.n_threads = cp.n_threads_batch = nt
            cp.hybrid = hyb
            ctxs[name] = llama.init_from_model(m, cp)
            assert llama.decode(ctxs[name], llama.batch_get_one([1])) == 0
        times = {k: [] for k in ctxs}
        moved = {k: [] for k in ctxs}
        same = True
        busy = over = wait = wall = 0
        tok = 42
        for step in range(args.steps):
            logits = {}
            for name, ctx in ctxs.items():
                s0 = accel.backend_accel_stats(dev)
                t0 = time.perf_counter()
                assert llama.decode(ctx, llama.batch_get_one([tok])) == 0
                times[name].append(time.perf_counter() - t0)
                s1 = accel.backend_accel_stats(dev)
                moved[name].append((s1["h2d_bytes"] - s0["h2d_bytes"], s1["d2h_bytes"] - s0["d2h_bytes"]))
                logits[name] = np.array(ctx.get_logits_ith(-1))
            same &= bool(np.array_equal(logits["hybrid"], logits["sched"]))
            tok = int(np.argmax(logits["hybrid"]))
            recs = ctxs["hybrid"].hybrid_records
            gpu = [(r.t_kernel, r.t_kernel_end) for r in recs if r.lane == "gpu"]
            cpu = [(r.t_kernel, r.t_kernel_end) for r in recs if r.lane == "cpu" and r.t_kernel_end > r.t_kernel]
            gpu_n = {r.node_n for r in recs if r.lane == "gpu"}
            busy += sum(b - a for a, b in gpu)
            over += _overlap(gpu, cpu)
            wait += sum(r.t_start - r.t_wait for r in recs if r.lane == "cpu" and set(r.srcs) & gpu_n)
            wall += max(r.t_end for r in recs) - min(r.t_wait for r in recs)
        th, ts = statistics.median(times["hybrid"]), statistics.median(times["sched"])
        print(f"decode step, median of {args.steps}: hybrid ({args.threads} threads) {th * 1e3:.0f} ms, "
              f"sched ({args.threads - 1} CPU threads) {ts * 1e3:.0f} ms: hybrid / sched = {th / ts:.2f}")
        for name in ctxs:
            h2d, d2h = moved[name][-1]
            print(f"  {name:6s}: {h2d} bytes host->device, {d2h} bytes device->host per decode step")
        print(f"hybrid timeline: device lane busy {busy / wall:.0%} of the compute, {over / max(busy, 1):.0%} of "
              f"that overlapped CPU kernels; CPU threads waited {wait / 1e6 / args.steps:.0f} ms per step on "
              f"is_finish of device nodes")
        print(f"logits hybrid == sched, bit for bit, every step: {same}")
        for ctx in ctxs.values():
            llama.free(ctx)
        llama.model_free(m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
