"""SamplerChain.history: per stage the surviving candidates with logit / p / probability, counts, the chosen token
and the random draw -- checked on a hand-computed example -- and the view that draws it (headless)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ggviz.llama import sampling as S
from ggviz.viz import model_views as MV

LOGITS = [1.0, 3.0, 2.0, 0.5, 2.5]          # ids 0..4


def _run(seed, extra=()):
    chain = S.sampler_chain_init()
    for s in (S.sampler_init_top_k(3), S.sampler_init_temp(0.5), *extra, S.sampler_init_dist(seed)):
        S.sampler_chain_add(chain, s)
    cur = S.TokenDataArray(np.array(LOGITS, dtype=np.float32))
    chain.apply(cur)
    return chain, cur


def _hand():
    # top-k 3 keeps ids 1 (3.0), 4 (2.5), 2 (2.0); temp 0.5 doubles them: 6, 5, 4; softmax = e^0, e^-1, e^-2 / sum
    z = 1 + math.exp(-1) + math.exp(-2)
    return [1, 4, 2], [6.0, 5.0, 4.0], [1 / z, math.exp(-1) / z, math.exp(-2) / z]


def _std_mt19937_uniform(seed):
    """std::uniform_real_distribution<double>(0, 1) on a std::mt19937(seed), as libstdc++ draws it: two 32-bit outputs
    (NumPy's MT19937 with the legacy init_genrand seeding of RandomState), (x0 + x1 * 2^32) / 2^64 in double."""
    _, key, pos = np.random.RandomState(seed).get_state()[:3]
    bg = np.random.MT19937()
    bg.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}
    x0, x1 = (int(v) for v in bg.random_raw(2))
    return (float(x0) + float(x1) * 2.0 ** 32) / 2.0 ** 64


@pytest.mark.parametrize("seed", [42, 2, 19, 1])
def test_history_top_k_temp_dist_by_hand(seed):
    chain, cur = _run(seed)
    h = chain.history
    assert [x["step"] for x in h] == ["logits", "top-k", "temp", "dist"]
    assert [x["n"] for x in h] == [5, 3, 3, 3] and [x["n_finite"] for x in h] == [5, 3, 3, 3]
    assert h[1]["params"] == {"k": 3} and h[2]["params"] == {"t": 0.5} and h[3]["params"] == {"seed": seed}

    # the logits as they came in: all 5, best first; p is 0 in the array (llama_sampler_sample sets it so)
    z5 = sum(math.exp(v - 3.0) for v in LOGITS)
    assert [c["id"] for c in h[0]["cands"]] == [1, 4, 2, 0, 3]
    assert [c["logit"] for c in h[0]["cands"]] == [3.0, 2.5, 2.0, 1.0, 0.5]
    assert all(c["p"] == 0.0 for c in h[0]["cands"]) and not h[0]["p_valid"]
    assert [c["prob"] for c in h[0]["cands"]] == pytest.approx([math.exp(v - 3.0) / z5 for v in [3, 2.5, 2, 1, .5]])

    # top-k: 3 survive, logits unchanged, probabilities renormalized over the 3
    z3 = 1 + math.exp(-0.5) + math.exp(-1)
    assert [(c["id"], c["logit"]) for c in h[1]["cands"]] == [(1, 3.0), (4, 2.5), (2, 2.0)]
    assert [c["prob"] for c in h[1]["cands"]] == pytest.approx([1 / z3, math.exp(-0.5) / z3, math.exp(-1) / z3])
    assert h[1]["selected"] is None and h[1]["draw"] is None and not h[1]["p_valid"]

    # temp 0.5: logits doubled
    ids, logits, probs = _hand()
    assert [(c["id"], c["logit"]) for c in h[2]["cands"]] == list(zip(ids, logits))
    assert [c["prob"] for c in h[2]["cands"]] == pytest.approx(probs)

    # dist: the array's p is the softmax (float32), the draw is u from std::mt19937(seed), the chosen token the first
    # whose cumulative p reaches u * sum(p)
    d = h[3]
    assert d["p_valid"] and [c["p"] for c in d["cands"]] == pytest.approx(probs, rel=1e-6)
    u = _std_mt19937_uniform(seed)
    cum = np.cumsum(probs)
    rank = int(np.argmax(cum >= u))
    assert d["draw"]["u"] == pytest.approx(u) and d["draw"]["rank"] == rank
    assert d["draw"]["cum_at"] == pytest.approx(cum[rank], rel=1e-6)
    assert d["draw"]["cum_before"] == pytest.approx(cum[rank - 1] if rank else 0.0, rel=1e-6)
    assert d["selected"] == ids[rank] == int(cur.id[cur.selected])
    assert {42: 4, 2: 1, 19: 1, 1: 2}[seed] == d["selected"]        # u = 0.797, 0.185, 0.431, 0.997 (as llama.cpp)
    # the old fields are still there
    assert d["top"] == [(i, v) for i, v in zip(ids, logits)]


def test_history_top_p_and_counts_are_bounded():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=1000).astype(np.float32) * 3
    chain = S.SamplerChain(history_k=20)
    for s in (S.sampler_init_top_k(200), S.sampler_init_top_p(0.5, 1), S.sampler_init_min_p(0.2, 1),
              S.sampler_init_greedy()):
        chain.add(s)
    chain.apply(S.TokenDataArray(logits))
    h = chain.history
    assert [x["n"] for x in h][:2] == [1000, 200]
    assert all(len(x["cands"]) == min(20, x["n"]) for x in h)
    # top-p ran a softmax over the 200: p is valid there, and its survivors are the smallest prefix reaching 0.5
    top = np.sort(logits)[::-1][:200].astype(np.float64)
    p = np.exp(top - top[0])
    p /= p.sum()
    n_keep = int(np.argmax(np.cumsum(p) >= 0.5)) + 1
    assert h[2]["p_valid"] and h[2]["n"] == n_keep
    assert [c["p"] for c in h[2]["cands"]] == pytest.approx(list(p[:len(h[2]["cands"])]), rel=1e-5)
    # min-p 0.2 keeps the logits within log(0.2) of the best
    assert h[3]["n"] == int(np.sum(top[:n_keep] >= top[0] + np.log(0.2)))
    # greedy: the best logit, no draw
    assert h[4]["selected"] == int(np.argmax(logits)) and h[4]["draw"] is None


def test_history_temperature_zero_counts_finite():
    chain = S.SamplerChain()
    chain.add(S.sampler_init_temp(0.0))
    chain.add(S.sampler_init_greedy())
    chain.apply(S.TokenDataArray(np.array(LOGITS, dtype=np.float32)))
    h = chain.history
    assert h[1]["n"] == 5 and h[1]["n_finite"] == 1
    assert h[1]["cands"][0]["id"] == 1 and h[1]["cands"][0]["prob"] == 1.0
    assert all(c["prob"] == 0.0 and c["logit"] == -math.inf for c in h[1]["cands"][1:])
    assert h[2]["selected"] == 1


def test_sampler_view_draws_the_stages():
    chain, _ = _run(19)
    sv = MV.SamplerView(chain)
    st = sv.state()
    assert st["steps"] == ["logits", "top-k", "temp", "dist"] and st["selected"] == 1
    assert st["stages"][3]["draw"]["rank"] == 0 and len(st["stages"][1]["cands"]) == 3
    tab = MV.sampler_stage_table(chain.history[3])
    assert tab.column("id") == [1, 4, 2] and tab.column("")[0] == "◀ selected"
    assert tab.column("cum prob")[-1] == pytest.approx(1.0)
    assert "u = 0.4305" in tab.title and "3 candidates survive" in tab.title
    # a stage whose p is stale shows no p
    assert all(v is None for v in MV.sampler_stage_table(chain.history[1]).column("p (array)"))
    html = sv.to_html()
    assert html.count("<table") == 4 and "<img" in html and "after top-k (k=3)" in html
    assert "after dist" in sv.select(3).stage_html() and sv.state()["stage"] == 3
    fig = MV.sampler_figure(chain.history)
    ax = fig.axes[0]                                   # one grid (and its colour bar): a column per stage
    heads = [t.get_text() for t in ax.get_xticklabels()]
    assert [h.split("\n")[0] for h in heads] == ["logits", "top-k", "temp", "dist"]
    n_in, n_k = chain.history[0]["n"], chain.history[1]["n"]
    assert f"{n_k} kept, −{n_in - n_k}" in heads[1] and "none removed" in heads[3]
    # each candidate that top-k dropped is marked removed in the top-k column, exactly once
    removed = [t for t in ax.texts if t.get_text() == "✗ removed"]
    dropped = [c["id"] for c in chain.history[0]["cands"][:12]
               if c["id"] not in {d["id"] for d in chain.history[1]["cands"]}]
    assert len(removed) == len(dropped) and all(round(t.get_position()[0]) == 1 for t in removed)
    import matplotlib.pyplot as plt
    plt.close(fig)
    with pytest.raises(IndexError):
        sv.select(4)
