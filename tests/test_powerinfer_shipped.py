"""The predictor that ships with ggviz (ggviz/powerinfer/predictors/): a real one, checked on tokens it never saw.

Oracle: the dense model's own activations. 64 tokens of the corpus after the build's training range are decoded
through the dense SmolLM2 with the eval callback; a neuron is active when |silu(gate)*up| is above its layer's
threshold (the build's rule); the predictor must keep at least 85 % of the active neurons at threshold 0 (PowerInfer's
operating point) while switching off a real share of the rows. The file is refused when its bytes change.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggviz.powerinfer import pipeline as P


def test_shipped_predictor_keeps_85_percent_of_active_neurons_on_unseen_tokens(model):
    preds, counts, act_thr, meta = P.load_predictors()            # checks the SHA-256
    hp = model.hparams
    assert len(preds) == hp.n_layer and counts.shape == (hp.n_layer, hp.n_ff) and act_thr.shape == (hp.n_layer,)
    ids = P.heldout_ids(model.vocab, meta, 64)
    r = P.heldout_recall(model, preds, act_thr, ids, thresholds=(0.0,))["by_threshold"][0.0]
    assert r["mean_recall"] >= 0.85, r["recall"]
    # not a predictor that keeps everything: it switches off a real share of the rows, in every layer
    assert r["mean_skipped"] >= 0.15 and min(r["skipped"]) > 0.05
    # the metadata's figure (2,048 held-out tokens of the recording) tells the same story as these 64
    assert abs(meta["mean_recall@0.0"] - r["mean_recall"]) < 0.05


def test_shipped_predictor_file_is_checked(tmp_path):
    raw = bytearray(P.SHIPPED_PREDICTOR.read_bytes())
    raw[len(raw) // 2] ^= 1
    bad = tmp_path / "p.npz"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="SHA-256"):
        P.load_predictors(bad, sha256=P.SHIPPED_SHA256)
    with pytest.raises(FileNotFoundError):
        P.load_predictors(tmp_path / "none.npz")
    assert np.all(np.isfinite(P.load_predictors()[0][0].w1))

