"""Gemma-3's quant MUL_MATs: ggviz's compiled kernels next to llama.cpp's own ggml (the AVX2 build llama_cpp ships).

    python benchmarks/bench_kquants.py [--threads 1] [--rounds 3] [--reps 20] [--tokens 1 8]

Shapes are gemma-3-270m's (n_embd 640, n_ff 2048, 4 heads x 256): ffn_down Q4_K / Q6_K (2048 -> 640), attn_output
Q4_K (1024 -> 640), ffn_up Q5_0 (640 -> 2048), and the output Q8_0 (640 -> 262,144: the tied token_embd, about half
of a decode step; its random weight is made of random block bytes, not quantized from floats). ggviz: the weight in
its CPU_REPACK buffer, one MUL_MAT graph run by the compiled graph program (``graph_compute``, whose Python call
costs some microseconds that a decode's compiled walk does not pay per node); llama.cpp: the same bytes, Q4_K in its
CPU_REPACK buffer (Q5_0 / Q6_K / Q8_0 on a plain CPU buffer, as llama.cpp places them on AVX2),
``ggml_backend_graph_compute`` in a child process (the two ggml libraries cannot share a process). The rounds
alternate ggviz and llama.cpp; the table shows the median time per MUL_MAT of each and the ratio ggviz / llama.cpp
(> 1: ggviz slower). The results are checked equal, bit for bit. ``--cases q4_K q8_0`` runs the cases whose name
contains one of the words. The weights are hot in the caches here; in a decode step they are not (260 MB a token).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggviz import ggml  # noqa: E402
from ggviz.ggml import consts as C  # noqa: E402
from ggviz.ggml import quants as Q  # noqa: E402
from ggviz.ggml.cpu import ggml_cpu, repack  # noqa: E402
from tests.oracle import llamacpp_cpu as O  # noqa: E402

CASES = [("ffn_down q4_K", C.GGML_TYPE_Q4_K, 2048, 640), ("attn_output q4_K", C.GGML_TYPE_Q4_K, 1024, 640),
         ("ffn_down q6_K", C.GGML_TYPE_Q6_K, 2048, 640), ("ffn_up q5_0", C.GGML_TYPE_Q5_0, 640, 2048),
         ("output q8_0", C.GGML_TYPE_Q8_0, 640, 262144)]


def random_q8_0(rng, M, K):
    """M rows of K/32 block_q8_0 {fp16 d, int8 qs[32]} with scales around 0.05/127 and random quants."""
    blocks = np.empty((M, K // 32, 34), np.uint8)
    blocks[:, :, :2] = (rng.uniform(0.5, 1.5, (M, K // 32)) * 0.05 / 127).astype(np.float16)[..., None].view(np.uint8)
    blocks[:, :, 2:] = rng.integers(-127, 128, (M, K // 32, 32), dtype=np.int8).view(np.uint8)
    return blocks.reshape(M, -1)


class GgvizCase:
    def __init__(self, t, K, M, N, w, x, nth):
        self.ctx_w = ggml.init(ggml.tensor_overhead() * 2, None, True)
        self.w = ggml.new_tensor_2d(self.ctx_w, t, K, M)
        self.store = ggml.init(w.nbytes + ggml.tensor_overhead() + 256)
        self.holder = ggml.new_tensor_1d(self.store, C.GGML_TYPE_I8, w.nbytes)
        ggml.get_data(self.holder).reshape(-1).view(np.uint8)[:] = w.reshape(-1)
        self.w.data = self.holder.data
        self.buf = repack.place_weights([self.w])
        self.ctx = ggml.init(16 << 20)
        xt = ggml.new_tensor_2d(self.ctx, C.GGML_TYPE_F32, K, N)
        ggml.set_data(xt, x)
        self.y = ggml.mul_mat(self.ctx, self.w, xt)
        self.gf = ggml.new_graph(self.ctx)
        ggml.build_forward_expand(self.gf, self.y)
        self.plan = ggml_cpu.graph_plan(self.gf, nth)
        if self.plan.extra is None:
            raise SystemExit("the compiled graph does not take this MUL_MAT (no Numba / GGVIZ_NO_REPACK?)")
        if self.plan.work_size:
            self.plan.work_data = np.zeros(self.plan.work_size, np.uint8)
        self.shape = (N, M)

    def run(self):
        ggml_cpu.graph_compute(self.gf, self.plan)

    def out(self):
        return np.array(ggml.get_data_f32(self.y)).reshape(self.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--cases", nargs="+", help="case names to run (default: all), e.g. q4_K q8_0")
    a = ap.parse_args()
    if not O.available():
        raise SystemExit("llama_cpp (llama-cpp-python) is not installed: nothing to compare with")
    rng = np.random.default_rng(0)
    rows = []
    for name, t, K, M in CASES:
        if a.cases and not any(c in name for c in a.cases):
            continue
        if t == C.GGML_TYPE_Q8_0:
            w = random_q8_0(rng, M, K)
        else:
            w = np.ascontiguousarray(Q.quantize_row_ref(t, rng.standard_normal((M, K)).astype(np.float32) * 0.05)
                                     .reshape(M, -1))
        for N in a.tokens:
            x = rng.standard_normal((N, K)).astype(np.float32)
            g = GgvizCase(t, K, M, N, w, x, a.threads)
            g.run()                                      # compile / load the kernels
            tg, tl, same = [], [], True
            for _ in range(a.rounds):
                for _ in range(a.reps):
                    t0 = time.perf_counter()
                    g.run()
                    tg.append(time.perf_counter() - t0)
                r = O.run([dict(op="mul_mat", type=t, w=w, x=x, n_threads=a.threads,
                                repack=t == C.GGML_TYPE_Q4_K, reps=a.reps)])[0]
                tl.extend(r["times"].tolist())
                same &= bool(np.array_equal(g.out(), r["out"]))
            mg, ml = statistics.median(tg), statistics.median(tl)
            rows.append((name, N, mg, ml, same))
    print(f"threads {a.threads}, {a.rounds} alternating rounds x {a.reps} computes")
    print(f"{'case':18s} {'rows':>4s} {'ggviz us':>10s} {'llama.cpp us':>13s} {'ratio':>7s}  bits")
    for name, N, mg, ml, same in rows:
        print(f"{name:18s} {N:4d} {mg * 1e6:10.1f} {ml * 1e6:13.1f} {mg / ml:7.2f}  {'equal' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
