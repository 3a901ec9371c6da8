"""Make the predictor file that ships with ggviz (ggviz/powerinfer/predictors/*.npz): PowerInfer's predictors for the
default SmolLM2, trained on a recording of ``pydoc_data.topics`` (``pipeline.record``), stored in int8.

    # 1. record (or reuse) the activations: TOKENS + HELDOUT tokens through the dense model
    python tools/powerinfer_predictor.py record --recording DIR --tokens 16384 --heldout 2048
    # 2. train layers (run several of these at once to use more cores), each writes a part
    python tools/powerinfer_predictor.py train --recording DIR --layers 0:15 --part A.npz
    python tools/powerinfer_predictor.py train --recording DIR --layers 15:30 --part B.npz
    # 3. merge the parts: the int8 file, with the held-out recall of the int8 weights in its metadata
    python tools/powerinfer_predictor.py merge --recording DIR --parts A.npz B.npz --out FILE

Then set ``pipeline.SHIPPED_SHA256`` to the file's SHA-256 (printed by ``merge``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from ggviz import llama  # noqa: E402
from ggviz.powerinfer import pipeline as P  # noqa: E402

MODEL = os.environ.get("GGVIZ_MODEL", str(P.DEFAULT_MODEL))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--recording", required=True)
    r.add_argument("--tokens", type=int, default=16384)
    r.add_argument("--heldout", type=int, default=2048)
    t = sub.add_parser("train")
    t.add_argument("--recording", required=True)
    t.add_argument("--layers", required=True, help="A:B")
    t.add_argument("--part", required=True)
    t.add_argument("--tokens", type=int, default=16384)
    t.add_argument("--epochs", type=int, default=4)
    t.add_argument("--pos-weight", type=float, default=2.0)
    m = sub.add_parser("merge")
    m.add_argument("--recording", required=True)
    m.add_argument("--parts", nargs="+", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--tokens", type=int, default=16384)
    m.add_argument("--heldout", type=int, default=2048)
    a = ap.parse_args(argv)
    if a.cmd == "record":
        model = llama.model_load_from_file(MODEL, llama.model_default_params())
        rec = P.record(model, P.corpus_tokens(model.vocab, a.tokens + a.heldout), seq_len=256, threads=2)
        P.save_recording(rec, a.recording)
        print(f"recorded {rec.n_tokens} tokens in {rec.seconds:.0f} s")
        return 0
    rec = P.load_recording(a.recording)
    n_ff = int(rec.counts.shape[1])
    if a.cmd == "train":
        lo, hi = (int(v) for v in a.layers.split(":"))
        out, t0 = {}, time.perf_counter()
        for il in range(lo, hi):
            p = P.train_layer(rec.x[il][:a.tokens], rec.active[il][:a.tokens], n_ff, epochs=a.epochs,
                              pos_weight=a.pos_weight, seed=il)
            out[f"w1_{il}"], out[f"w2_{il}"] = p.w1, p.w2
            print(f"layer {il}: {time.perf_counter() - t0:.0f} s", flush=True)
        np.savez(a.part, train_s=time.perf_counter() - t0, epochs=a.epochs, pos_weight=a.pos_weight, **out)
        return 0
    preds, train_s, epochs, pw = {}, 0.0, set(), set()
    for part in a.parts:
        with np.load(part) as z:
            train_s += float(z["train_s"])
            epochs.add(int(z["epochs"]))
            pw.add(float(z["pos_weight"]))
            for k in z.files:
                if k.startswith("w1_"):
                    il = int(k[3:])
                    preds[il] = P.Predictor(w1=z[k], w2=z[f"w2_{il}"])
    n_layer = len(rec.x)
    if sorted(preds) != list(range(n_layer)) or len(epochs) != 1 or len(pw) != 1:
        raise SystemExit(f"the parts hold layers {sorted(preds)} with epochs {epochs}, pos_weight {pw}")
    P.save_predictors(a.out, [preds[il] for il in range(n_layer)], rec.counts, rec.act_threshold, {"n_layer": n_layer})
    q, _, _, _ = P.load_predictors(a.out)        # the int8 weights, as the book will use them
    layers = []
    for il in range(n_layer):
        x, y = rec.x[il][a.tokens:a.tokens + a.heldout], P.unpack_active(rec.active[il][a.tokens:a.tokens + a.heldout], n_ff)
        mm = {"layer": il}
        for thr in (0.0, -0.5, -1.0):
            rc, sp = P.recall_sparsity(q[il], x, y, thr)
            mm[f"recall@{thr}"], mm[f"skipped@{thr}"] = round(rc, 4), round(sp, 4)
        layers.append(mm)
    # the first 256 held-out token ids (the corpus after the training tokens): a check needs no tokenizing of the corpus
    model = llama.model_load_from_file(MODEL, llama.model_default_params())
    held_ids = P.corpus_tokens(model.vocab, a.tokens + 256)[a.tokens:]
    meta = {"n_layer": n_layer, "model": pathlib.Path(MODEL).name, "corpus": "pydoc_data.topics",
            "heldout_ids": [int(t) for t in held_ids],
            "tokens": a.tokens, "heldout": a.heldout, "epochs": epochs.pop(), "pos_weight": pw.pop(),
            "weights": "int8, one float32 scale per output column", "record_s": round(rec.seconds, 1),
            "train_s": round(train_s, 1), "layers": layers}
    for thr in ("0.0", "-0.5", "-1.0"):
        meta[f"mean_recall@{thr}"] = float(np.mean([mm[f"recall@{thr}"] for mm in layers]))
        meta[f"mean_skipped@{thr}"] = float(np.mean([mm[f"skipped@{thr}"] for mm in layers]))
    P.save_predictors(a.out, [preds[il] for il in range(n_layer)], rec.counts, rec.act_threshold, meta)
    print(json.dumps({k: v for k, v in meta.items() if k not in ("layers", "heldout_ids")}, indent=1))
    print("sha256", hashlib.sha256(pathlib.Path(a.out).read_bytes()).hexdigest(),
          "bytes", pathlib.Path(a.out).stat().st_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
