"""Samplers: logits -> token, as a chain of steps over a candidate array.

Mirrors llama.cpp's llama-sampling.cpp: ``llama_token_data_array`` (id, logit, p; ``selected``; ``sorted``),
``llama_sampler_chain_init``/``_add``, ``llama_sampler_init_greedy``, ``_temp``, ``_top_k``, ``_top_p``,
``_min_p``, ``_dist(seed)``, ``llama_sampler_sample(smpl, ctx, idx)`` and ``llama_sampler_accept``.

Each step records what it did (``SamplerChain.history``), so the visual layer can draw logits -> filters -> chosen
token: per stage the candidates that survive it (the best ``history_k`` by logit, with the logit and ``p`` exactly as
the candidate array holds them after the stage, as llama.cpp's ``llama_token_data_array`` would), how many survive,
the probability each survivor would have if the chain drew now (a softmax over the survivors), the chosen token,
and for ``dist`` the random draw.
"""
from __future__ import annotations

import numpy as np

LLAMA_DEFAULT_SEED = 0xFFFFFFFF


class TokenDataArray:
    """llama_token_data_array: parallel arrays of candidate ids, logits and probabilities."""

    def __init__(self, logits: np.ndarray):
        logits = np.asarray(logits, dtype=np.float32)
        self.id = np.arange(len(logits), dtype=np.int32)
        self.logit = logits.copy()
        self.p = np.zeros(len(logits), dtype=np.float32)
        self.selected = -1
        self.sorted = False
        self.n_softmax = 0          # ggviz: how many times p was computed (for SamplerChain.history's p_valid)

    @property
    def size(self):
        return len(self.id)

    def keep(self, idx):
        self.id, self.logit, self.p = self.id[idx], self.logit[idx], self.p[idx]

    def sort_desc(self):
        if not self.sorted:
            order = np.argsort(-self.logit, kind="stable")
            self.keep(order)
            self.sorted = True

    def softmax(self):
        """llama_sampler_softmax_impl: sort, then p = exp(l - max)/sum (sum in float, as llama.cpp)."""
        self.sort_desc()
        mx = self.logit[0]
        e = np.exp((self.logit - mx).astype(np.float32))
        self.p = (e / np.float32(e.sum(dtype=np.float32))).astype(np.float32)
        self.n_softmax += 1


class Sampler:
    name = "base"
    last_draw = None          # the random draw of the last apply (samplers that draw: dist)

    def apply(self, cur: TokenDataArray):
        raise NotImplementedError

    def params(self) -> dict:
        """The sampler's settings, for the history and the views."""
        return {k: v for k, v in vars(self).items() if isinstance(v, (int, float)) and not k.startswith("_")}

    def accept(self, token: int):
        pass

    def reset(self):
        pass


class Greedy(Sampler):
    name = "greedy"

    def apply(self, cur):
        # the first maximum, as llama.cpp's loop with a strict '>' picks
        cur.selected = int(np.argmax(cur.logit))


class Temp(Sampler):
    name = "temp"

    def __init__(self, t: float):
        self.t = float(t)

    def apply(self, cur):
        if self.t <= 0.0:
            # temperature 0: keep only the max logit (llama_sampler_temp_impl)
            i = int(np.argmax(cur.logit))
            keep = np.full(cur.size, False)
            keep[i] = True
            cur.logit = np.where(keep, cur.logit, -np.inf).astype(np.float32)
            return
        cur.logit = (cur.logit / np.float32(self.t)).astype(np.float32)


class TopK(Sampler):
    name = "top-k"

    def __init__(self, k: int):
        self.k = int(k)

    def apply(self, cur):
        if self.k <= 0:
            return
        k = min(self.k, cur.size)
        cur.sort_desc()
        cur.keep(slice(0, k))


class TopP(Sampler):
    name = "top-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p, self.min_keep = float(p), int(min_keep)

    def apply(self, cur):
        if self.p >= 1.0:
            return
        cur.softmax()
        cum = np.cumsum(cur.p, dtype=np.float64)
        # keep the smallest prefix whose cumulative probability reaches p (at least min_keep)
        last = int(np.searchsorted(cum, self.p, side="left")) + 1
        last = max(last, self.min_keep)
        cur.keep(slice(0, min(last, cur.size)))


class MinP(Sampler):
    name = "min-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p, self.min_keep = float(p), int(min_keep)

    def apply(self, cur):
        if self.p <= 0.0 or cur.size == 0:
            return
        mx = float(np.max(cur.logit))
        thr = mx + np.log(self.p)
        keep = cur.logit >= thr
        if keep.sum() < self.min_keep:
            cur.sort_desc()
            cur.keep(slice(0, self.min_keep))
            return
        cur.keep(np.nonzero(keep)[0])


class Dist(Sampler):
    """llama_sampler_init_dist: softmax, then draw with a seeded std::mt19937 (NumPy's MT19937 here)."""
    name = "dist"

    def __init__(self, seed: int = LLAMA_DEFAULT_SEED):
        self.seed = seed
        self.reset()

    def reset(self):
        seed = np.random.SeedSequence().entropy & 0xFFFFFFFF if self.seed == LLAMA_DEFAULT_SEED else self.seed
        self.rng = np.random.Generator(np.random.MT19937(int(seed)))

    def apply(self, cur):
        cur.softmax()
        u = self.rng.random()
        cum = np.cumsum(cur.p, dtype=np.float64)
        i = int(np.searchsorted(cum, u * cum[-1], side="right"))
        cur.selected = min(i, cur.size - 1)
        # the draw, for the history: u in [0, 1), the target u * sum(p), and the cumulative sum that reached it
        j = cur.selected
        self.last_draw = {"u": float(u), "target": float(u * cum[-1]), "rank": j,
                          "cum_before": float(cum[j - 1]) if j > 0 else 0.0, "cum_at": float(cum[j])}

    def params(self) -> dict:
        return {"seed": int(self.seed)}


HISTORY_K = 20   # candidates kept per stage in SamplerChain.history


class SamplerChain(Sampler):
    """llama_sampler_chain: the samplers applied in order to one candidate array.

    ``history`` (the last ``apply``) has one entry for the candidates as they came in (``step == "logits"``) and one
    per sampler, each a dict of plain Python values:

    - ``step``, ``params``: the sampler's name and settings (k, p, t, min_keep, seed);
    - ``n``: how many candidates survive the stage (the array's size); ``n_finite``: how many of them still have a
      finite logit (temperature 0 keeps the others at -inf); ``sorted``: whether the array is sorted by logit;
    - ``cands``: the best ``min(n, history_k)`` survivors by logit, best first, each ``{"id", "logit", "p",
      "prob"}``: ``logit`` and ``p`` as the array holds them after the stage (llama.cpp's token data: ``p`` is only
      meaningful right after a stage that ran a softmax -- top-p, dist -- and keeps its stale values or 0 otherwise),
      ``prob`` the probability of the survivor if the chain drew now (softmax over the current survivors' logits);
      ``p_valid``: whether ``p`` was (re)computed by this stage;
    - ``top``: ``[(id, logit)]`` of the first 5 of ``cands`` (kept for older readers);
    - ``selected``: the chosen token id, once a stage selected one (greedy, dist), else None;
    - ``draw``: for a stage that drew a random number (dist): ``u`` (uniform in [0, 1)), ``target`` (``u * sum
      p``), ``rank`` (index of the chosen candidate in the sorted array) and the cumulative sums around it.
    """
    name = "chain"

    def __init__(self, history_k: int = HISTORY_K):
        self.samplers: list[Sampler] = []
        self.history: list[dict] = []     # what each step left, for the visual layer
        self.history_k = int(history_k)

    def add(self, s: Sampler):
        self.samplers.append(s)

    def apply(self, cur):
        self.history = [_stage(cur, "logits", {}, self.history_k, p_valid=False)]
        for s in self.samplers:
            n_softmax = cur.n_softmax
            s.last_draw = None
            s.apply(cur)
            self.history.append(_stage(cur, s.name, s.params(), self.history_k, p_valid=cur.n_softmax > n_softmax,
                                       draw=s.last_draw))

    def accept(self, token):
        for s in self.samplers:
            s.accept(token)

    def reset(self):
        for s in self.samplers:
            s.reset()


def _stage(cur: TokenDataArray, step: str, params: dict, k: int, p_valid: bool, draw=None) -> dict:
    """One ``SamplerChain.history`` entry: what the candidate array holds after a stage (see SamplerChain)."""
    n = cur.size
    logit = cur.logit.astype(np.float64)
    fin = np.isfinite(logit)
    n_fin = int(fin.sum())
    # the best k by logit, best first (ties: array order, as a stable sort)
    order = np.argsort(-logit, kind="stable")[:k] if n else np.zeros(0, dtype=np.int64)
    # the probability of each survivor if the chain drew now: softmax over the current (finite) logits
    prob = np.zeros(n, dtype=np.float64)
    if n_fin:
        mx = logit[fin].max()
        e = np.where(fin, np.exp(np.where(fin, logit - mx, 0.0)), 0.0)
        prob = e / e.sum()
    cands = [{"id": int(cur.id[i]), "logit": float(cur.logit[i]), "p": float(cur.p[i]), "prob": float(prob[i])}
             for i in order]
    sel = int(cur.id[cur.selected]) if 0 <= cur.selected < n else None
    return {"step": step, "params": dict(params), "n": n, "n_finite": n_fin, "sorted": bool(cur.sorted),
            "p_valid": p_valid, "cands": cands, "top": [(c["id"], c["logit"]) for c in cands[:5]],
            "selected": sel, "draw": dict(draw) if draw else None}


# ---- llama.h mirror
def sampler_chain_init(params=None) -> SamplerChain:
    return SamplerChain()


def sampler_chain_add(chain: SamplerChain, smpl: Sampler) -> None:
    chain.add(smpl)


def sampler_init_greedy() -> Sampler:
    return Greedy()


def sampler_init_temp(t: float) -> Sampler:
    return Temp(t)


def sampler_init_top_k(k: int) -> Sampler:
    return TopK(k)


def sampler_init_top_p(p: float, min_keep: int = 1) -> Sampler:
    return TopP(p, min_keep)


def sampler_init_min_p(p: float, min_keep: int = 1) -> Sampler:
    return MinP(p, min_keep)


def sampler_init_dist(seed: int = LLAMA_DEFAULT_SEED) -> Sampler:
    return Dist(seed)


def sampler_apply(smpl: Sampler, cur: TokenDataArray) -> None:
    smpl.apply(cur)


def sampler_sample(smpl: Sampler, ctx, idx: int) -> int:
    """llama_sampler_sample: logits of output idx -> candidates -> chain -> selected token (accepted)."""
    cur = TokenDataArray(ctx.get_logits_ith(idx))
    smpl.apply(cur)
    if cur.selected < 0:
        raise RuntimeError("sampler chain selected no token (end it with greedy or dist)")
    token = int(cur.id[cur.selected])
    smpl.accept(token)
    return token


def sampler_accept(smpl: Sampler, token: int) -> None:
    smpl.accept(token)


def sampler_reset(smpl: Sampler) -> None:
    smpl.reset()


def sampler_free(smpl: Sampler) -> None:
    pass
