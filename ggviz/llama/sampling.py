"""Samplers: logits -> token, as a chain of steps over a candidate array.

Mirrors llama.cpp's llama-sampling.cpp: ``llama_token_data_array`` (id, logit, p; ``selected``; ``sorted``),
``llama_sampler_chain_init``/``_add``, ``llama_sampler_init_greedy``, ``_temp``, ``_top_k``, ``_top_p``,
``_min_p``, ``_dist(seed)``, ``llama_sampler_sample(smpl, ctx, idx)`` and ``llama_sampler_accept``.

Each step records what it did (``history``), so the visual layer can draw logits -> filters -> chosen token.
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


class Sampler:
    name = "base"

    def apply(self, cur: TokenDataArray):
        raise NotImplementedError

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


class SamplerChain(Sampler):
    name = "chain"

    def __init__(self):
        self.samplers: list[Sampler] = []
        self.history: list[dict] = []     # what each step left, for the visual layer

    def add(self, s: Sampler):
        self.samplers.append(s)

    def apply(self, cur):
        self.history = [{"step": "logits", "n": cur.size, "top": _top(cur)}]
        for s in self.samplers:
            s.apply(cur)
            self.history.append({"step": s.name, "n": cur.size, "top": _top(cur), "selected":
                                 int(cur.id[cur.selected]) if cur.selected >= 0 else None})

    def accept(self, token):
        for s in self.samplers:
            s.accept(token)

    def reset(self):
        for s in self.samplers:
            s.reset()


def _top(cur, n=5):
    order = np.argsort(-cur.logit, kind="stable")[:n]
    return [(int(cur.id[i]), float(cur.logit[i])) for i in order]


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
