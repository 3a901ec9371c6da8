"""Samplers: logits -> token, as a chain of steps over a candidate array.

Mirrors llama.cpp's llama-sampler.cpp (the one in llama-cpp-python 0.3.36): ``llama_token_data_array`` (id, logit,
p; ``selected``; ``sorted``), ``llama_sampler_chain_init``/``_add``, ``llama_sampler_init_greedy``, ``_temp``,
``_top_k``, ``_top_p``, ``_min_p``, ``_dist(seed)``, ``llama_sampler_sample(smpl, ctx, idx)``,
``llama_sampler_accept``, ``llama_sampler_reset`` and ``llama_sampler_get_seed``.

Seeded generation reproduces llama.cpp's token for token given the same logits:

- ``dist`` owns a ``std::mt19937`` (``MT19937`` here: ``init_genrand`` seeding, 32-bit tempered outputs) seeded with
  the seed (``LLAMA_DEFAULT_SEED`` = 0xFFFFFFFF means a fresh random seed, as ``std::random_device``), and draws
  once per apply with ``std::uniform_real_distribution<double>(0, 1)``: libstdc++'s ``generate_canonical<double,
  53>`` takes two 32-bit outputs, ``(x0 + x1 * 2^32) / 2^64`` in double (``uniform_01``). It then walks the array *in
  its current order* (token-id order unless a filter sorted it): ``p_i = expf(l_i - max)`` (float, glibc's expf),
  ``sum`` in double, the first i whose running double sum reaches ``u * sum`` is selected, and ``p_i /= sum``. A
  one-candidate array still consumes a draw.
- the filters keep llama.cpp's array order, which decides the walk: ``top_k`` sorts with ``std::partial_sort``
  (k <= 128) or llama.cpp's 128-bucket partial sort + ``std::sort`` (k > 128), ``top_p`` softmaxes without sorting
  (float sums), then sorts (adaptive: the best 256 first when more than 1024 candidates), ``min_p`` filters in place
  when unsorted and falls back to a full sort. libstdc++'s ``std::partial_sort`` (heap select + heap sort) and
  ``std::sort`` (introsort) are not stable; they are reproduced exactly (``cxx_partial_sort``, ``cxx_sort``, in
  ggviz/ggml/cpu/libstdcxx.py beside ggml's ARGSORT / TOP_K), so ties (common in float16 logits) come out in
  llama.cpp's order.

Each step records what it did (``SamplerChain.history``), so the visual layer can draw logits -> filters -> chosen
token: per stage the candidates that survive it (the best ``history_k`` by logit, with the logit and ``p`` exactly as
the candidate array holds them after the stage, as llama.cpp's ``llama_token_data_array`` would), how many survive,
the probability each survivor would have if the chain drew now (a softmax over the survivors), the chosen token,
and for ``dist`` the random draw.
"""
from __future__ import annotations

import math
import secrets

import numpy as np

from ..ggml.cpu.libm import glibc_expf, logf
from ..ggml.cpu.libstdcxx import cxx_partial_sort, cxx_sort

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

F32 = np.float32


# ---- std::mt19937 and libstdc++'s uniform_real_distribution<double>

class MT19937:
    """``std::mt19937``: the 32-bit Mersenne Twister (MT19937, Matsumoto & Nishimura), as C++ <random> defines it.

    ``seed(s)`` is ``init_genrand``: ``mt[0] = s``, ``mt[i] = 1812433253 * (mt[i-1] ^ (mt[i-1] >> 30)) + i``
    (mod 2^32); ``next()`` returns the next tempered 32-bit output, twisting the 624-word state every 624 outputs.
    Default-seeded (5489), the 10000th output is 4123659995, as the C++ standard requires.
    """

    N, M = 624, 397
    MATRIX_A, UPPER, LOWER = 0x9908B0DF, 0x80000000, 0x7FFFFFFF
    default_seed = 5489

    def __init__(self, seed: int = default_seed):
        self.seed(seed)

    def seed(self, s: int) -> None:
        mt = [int(s) & 0xFFFFFFFF]
        for i in range(1, self.N):
            prev = mt[-1]
            mt.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
        self.mt, self.mti = mt, self.N

    def _twist(self) -> None:
        mt, n, m = self.mt, self.N, self.M
        for i in range(n):
            y = (mt[i] & self.UPPER) | (mt[(i + 1) % n] & self.LOWER)
            mt[i] = mt[(i + m) % n] ^ (y >> 1) ^ (self.MATRIX_A if y & 1 else 0)
        self.mti = 0

    def next(self) -> int:
        """``operator()``: the next 32-bit output."""
        if self.mti >= self.N:
            self._twist()
        y = self.mt[self.mti]
        self.mti += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y

    __call__ = next

    def discard(self, z: int) -> None:
        for _ in range(int(z)):
            self.next()

    def copy(self) -> "MT19937":
        c = MT19937.__new__(MT19937)
        c.mt, c.mti = list(self.mt), self.mti
        return c


def generate_canonical_f64(rng: MT19937) -> tuple[float, tuple[int, int]]:
    """libstdc++'s ``std::generate_canonical<double, 53>(mt19937)``: k = ceil(53 / 32) = 2 outputs, summed in double
    as ``x0 + x1 * 2^32`` (one rounding to 53 bits), divided by 2^64; a result that rounds up to 1 becomes
    ``nextafter(1, 0)``. Returns the value and the two raw outputs."""
    x0 = rng.next()
    x1 = rng.next()
    r = (float(x0) + float(x1) * 4294967296.0) / 18446744073709551616.0
    if r >= 1.0:
        r = math.nextafter(1.0, 0.0)
    return r, (x0, x1)


def uniform_01(rng: MT19937) -> float:
    """``std::uniform_real_distribution<double>(0.0, 1.0)(rng)`` (libstdc++): ``generate_canonical * (b - a) + a``."""
    return generate_canonical_f64(rng)[0] * (1.0 - 0.0) + 0.0


def get_rng_seed(seed: int) -> int:
    """llama.cpp's ``get_rng_seed``: ``LLAMA_DEFAULT_SEED`` asks for a random seed (``std::random_device``)."""
    if int(seed) & 0xFFFFFFFF == LLAMA_DEFAULT_SEED:
        return secrets.randbits(32)
    return int(seed) & 0xFFFFFFFF


_BUCKET_SCALE = F32(128) / (F32(10.0) - F32(-10.0))      # nbuckets / (bucket_high - bucket_low) = 6.4f
_BUCKET_INTER = -F32(-10.0) * _BUCKET_SCALE               # -bucket_low * bucket_scale = 64.0f


def llama_partial_sort(x: np.ndarray, npartial: int) -> np.ndarray:
    """llama.cpp's ``llama_token_data_array_partial_sort``: 128 buckets over logits [-10, 10] (``int(6.4f * l +
    64.0f)``, clamped), take whole buckets from the top until they hold ``npartial``, ``std::sort`` each full bucket
    and ``std::partial_sort`` the last. Returns the positions of the first ``npartial`` results, in order."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        v = x * _BUCKET_SCALE + _BUCKET_INTER                  # float32, no FMA (as compiled)
        ok = np.isfinite(v) & (v < F32(2.0 ** 31)) & (v >= F32(-2.0 ** 31))
        ib = np.where(ok, np.trunc(np.where(ok, v, 0)), -2.0 ** 31)   # cvttss2si: INT_MIN when out of range
    ib = np.clip(ib, 0, 127).astype(np.int64)
    histo = np.bincount(ib, minlength=128)
    nhave, b = 0, 127
    while b >= 0:
        nhave += int(histo[b])
        if nhave >= npartial:
            break
        b -= 1
    out, ndone = [], 0
    for j in range(127, max(b, 0) - 1, -1):
        pos = np.nonzero(ib == j)[0]            # bucketed in array order
        if pos.size == 0:
            continue
        if j > b:
            out.append(pos[cxx_sort(x[pos])])
            ndone += pos.size
        else:
            out.append(pos[cxx_partial_sort(x[pos], npartial - ndone)])
    res = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
    return res[:npartial]


# ---- the candidate array

class TokenDataArray:
    """llama_token_data_array: parallel arrays of candidate ids, logits and probabilities (``llama_sampler_sample``
    fills them in token-id order with p = 0, unsorted)."""

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

    def partial_sort_inplace(self, npartial: int):
        """llama_token_data_array_partial_sort_inplace: keep the best ``npartial``, sorted by logit (descending) the
        way llama.cpp sorts them: ``std::partial_sort`` up to 128, its bucket sort above."""
        npartial = int(npartial)
        order = cxx_partial_sort(self.logit, npartial) if npartial <= 128 else llama_partial_sort(self.logit, npartial)
        self.keep(order)
        self.sorted = True

    def sort_desc(self):
        """Sort all candidates by logit, as llama.cpp does (``partial_sort_inplace(size)``)."""
        if not self.sorted:
            self.partial_sort_inplace(self.size)

    def max_logit(self) -> np.float32:
        """The first logit when sorted, else the largest (the ``std::max`` loop of llama.cpp's softmaxes)."""
        return self.logit[0] if self.sorted else np.max(self.logit)

    def softmax(self, do_sort: bool = True):
        """llama_sampler_softmax_impl(cur_p, do_sort): optionally sort, then p = expf(l - max) / sum, in float (the
        sum accumulated in array order, one float rounding per add)."""
        if self.size == 0:
            raise ValueError("GGML_ASSERT(cur_p->size > 0) failed")
        if do_sort:
            self.sort_desc()
        e = glibc_expf(self.logit - self.max_logit())
        cum_sum = np.cumsum(e, dtype=F32)[-1]
        self.p = (e / cum_sum).astype(F32)
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
        if cur.size == 0:
            return
        if F32(self.t) <= 0.0:
            # temperature 0: keep only the (first) max logit, the rest -inf (llama_sampler_temp_impl)
            i = int(np.argmax(cur.logit))
            keep = np.full(cur.size, False)
            keep[i] = True
            cur.logit = np.where(keep, cur.logit, -np.inf).astype(np.float32)
            return
        cur.logit = (cur.logit / F32(self.t)).astype(np.float32)


class TopK(Sampler):
    name = "top-k"

    def __init__(self, k: int):
        self.k = int(k)

    def apply(self, cur):
        # llama_sampler_top_k_impl
        if self.k <= 0:
            return
        k = min(self.k, cur.size)
        if not cur.sorted:
            cur.partial_sort_inplace(k)
        cur.keep(slice(0, k))


def _first_reaching(cum: np.ndarray, p, min_keep: int, start: int = 0):
    """The first i (counting from ``start``) with ``cum[i] >= p and i + 1 >= min_keep``, or None."""
    i = np.arange(start, start + cum.size)
    hit = np.nonzero((cum >= p) & (i + 1 >= min_keep))[0]
    return int(hit[0]) + start if hit.size else None


class TopP(Sampler):
    name = "top-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p, self.min_keep = float(p), int(min_keep)

    def apply(self, cur):
        # llama_sampler_top_p_apply: softmax in array order, then the smallest prefix (by logit) whose float running
        # sum of p reaches p (and holds min_keep)
        p = F32(self.p)
        if p >= F32(1.0):
            return
        cur.softmax(do_sort=False)
        n = cur.size
        if not cur.sorted and n > 1024:
            # adaptive: sort the best 256 first (into a buffer), all of them only if those do not reach p
            k = min(256, n)
            order = llama_partial_sort(cur.logit, k)
            cum = np.cumsum(cur.p[order[:k]], dtype=F32)
            i = _first_reaching(cum, p, self.min_keep)
            if i is None:
                order = llama_partial_sort(cur.logit, n)
                rest = np.cumsum(np.concatenate([cum[-1:], cur.p[order[k:]]]), dtype=F32)[1:]
                i = _first_reaching(rest, p, self.min_keep, start=k)
            last = n if i is None else i + 1
            cur.keep(order[:last])
            cur.sorted = True
            return
        if not cur.sorted:
            cur.partial_sort_inplace(n)
        i = _first_reaching(np.cumsum(cur.p, dtype=F32), p, self.min_keep)
        cur.keep(slice(0, n if i is None else i + 1))


class MinP(Sampler):
    name = "min-p"

    def __init__(self, p: float, min_keep: int = 1):
        self.p, self.min_keep = float(p), int(min_keep)

    def apply(self, cur):
        # llama_sampler_min_p_apply: keep the logits >= max + logf(p) (float); in place, in array order, when unsorted
        # and at least min_keep pass; else sort and keep the prefix (at least min_keep)
        if F32(self.p) <= 0.0 or cur.size == 0:
            return
        log_p = logf(F32(self.p))
        if not cur.sorted:
            max_logit = max(np.max(cur.logit), F32(-np.finfo(F32).max))
            keep = np.nonzero(cur.logit >= F32(max_logit) + log_p)[0]
            if keep.size and keep.size >= self.min_keep:
                cur.keep(keep)
                return
            cur.sort_desc()
        min_logit = cur.logit[0] + log_p
        i = np.arange(1, cur.size)
        stop = np.nonzero((cur.logit[1:] < min_logit) & (i >= self.min_keep))[0]
        cur.keep(slice(0, int(i[stop[0]]) if stop.size else cur.size))


class Dist(Sampler):
    """llama_sampler_init_dist(seed): a ``std::mt19937`` seeded with the seed; each apply draws
    ``u = uniform_real_distribution<double>(0, 1)``, computes ``p_i = expf(l_i - max)`` in array order, and selects
    the first candidate whose running (double) sum of p reaches ``u * sum p``; p is then normalized."""
    name = "dist"

    def __init__(self, seed: int = LLAMA_DEFAULT_SEED):
        self.seed = int(seed) & 0xFFFFFFFF
        self._seed_cur = get_rng_seed(self.seed)
        self.rng = MT19937(self._seed_cur)

    @property
    def seed_cur(self) -> int:
        """The seed actually used (a random one for LLAMA_DEFAULT_SEED): llama_sampler_get_seed."""
        return self._seed_cur

    def reset(self):
        self._seed_cur = get_rng_seed(self.seed)
        self.rng.seed(self._seed_cur)

    def apply(self, cur):
        n = cur.size
        if n == 0:
            cur.selected = -1
            return
        cur.selected = 0
        if n == 1:
            # one candidate: it is chosen, but the draw still happens (keeps the RNG aligned with backend sampling)
            u, raw = generate_canonical_f64(self.rng)
            cur.p = np.ones(1, dtype=F32)
            cur.n_softmax += 1
            self.last_draw = {"u": u, "raw": list(raw), "sum_exp": 1.0, "target": u, "index": 0, "rank": 0,
                              "cum_before": 0.0, "cum_at": 1.0, "sorted": bool(cur.sorted)}
            return
        e = glibc_expf(cur.logit - cur.max_logit())
        cum = np.cumsum(e, dtype=np.float64)       # the running double sum, in array order
        sum_cum = float(cum[-1])
        u, raw = generate_canonical_f64(self.rng)
        target = sum_cum * u
        j = int(np.searchsorted(cum, target, side="left"))    # the first running sum >= target
        j = min(j, n - 1)
        cur.selected = j
        cur.p = (e.astype(np.float64) / sum_cum).astype(F32)
        cur.n_softmax += 1
        # the draw, for the history: u, llama.cpp's sum of exp, and (as fractions of that sum) the target and the
        # running sums around the chosen candidate; index = its position in the array (walk order), rank = its place
        # by logit (the order SamplerChain.history lists candidates in)
        lj = cur.logit[j]
        rank = int(np.sum(cur.logit > lj) + np.sum(cur.logit[:j] == lj))
        self.last_draw = {"u": u, "raw": list(raw), "sum_exp": sum_cum, "target": target / sum_cum, "index": j,
                          "rank": rank, "cum_before": float(cum[j - 1]) / sum_cum if j > 0 else 0.0,
                          "cum_at": float(cum[j]) / sum_cum, "sorted": bool(cur.sorted)}

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
    - ``draw``: for a stage that drew a random number (dist): ``u`` (uniform in [0, 1), from the two raw
      ``std::mt19937`` outputs ``raw``), ``sum_exp`` (llama.cpp's double sum of ``expf(l - max)``), ``target``
      (``u * sum p`` with p normalized, i.e. ``u``), ``index`` (the chosen candidate's position in the array, the
      order dist walks), ``rank`` (its place by logit, as ``cands`` lists them; equal to ``index`` when the array is
      sorted), ``sorted`` (whether the walk was in logit order) and the running sums of p around it
      (``cum_before``, ``cum_at``).
    """
    name = "chain"

    def __init__(self, history_k: int = HISTORY_K):
        self.samplers: list[Sampler] = []
        self.history_k = int(history_k)
        # what each stage left: a snapshot of the candidate arrays (cheap copies), turned into ``history``'s dicts
        # only when somebody reads them -- sorting 49,152 logits per stage would cost more than the sampling itself
        self._snapshots: list[tuple] = []
        self._history: list[dict] | None = []

    @property
    def history(self) -> list[dict]:
        """What each step left, for the visual layer (see the class docstring); built on first read."""
        if self._history is None:
            self._history = [_stage(snap, step, params, self.history_k, p_valid=p_valid, draw=draw)
                             for snap, step, params, p_valid, draw in self._snapshots]
            self._snapshots = []
        return self._history

    def add(self, s: Sampler):
        self.samplers.append(s)

    def apply(self, cur):
        self._history = None
        self._snapshots = [(_Snapshot(cur), "logits", {}, False, None)]
        for s in self.samplers:
            n_softmax = cur.n_softmax
            s.last_draw = None
            s.apply(cur)
            self._snapshots.append((_Snapshot(cur), s.name, s.params(), cur.n_softmax > n_softmax, s.last_draw))

    def accept(self, token):
        for s in self.samplers:
            s.accept(token)

    def reset(self):
        for s in self.samplers:
            s.reset()


class _Snapshot:
    """The candidate arrays as a stage left them (copies: later stages change them in place)."""
    __slots__ = ("id", "logit", "p", "sorted", "selected", "size")

    def __init__(self, cur: TokenDataArray):
        self.id, self.logit, self.p = cur.id.copy(), cur.logit.copy(), cur.p.copy()
        self.sorted, self.selected, self.size = cur.sorted, cur.selected, cur.size


def _stage(cur, step: str, params: dict, k: int, p_valid: bool, draw=None) -> dict:
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
    """llama_sampler_sample: logits of output idx -> candidates -> chain -> selected token (accepted).

    Logits with a NaN or an infinity are refused (ValueError, before any sampler runs: the chain's state, the dist's
    random draws included, is untouched). llama.cpp checks nothing: its greedy compares ``logit > best`` (all NaN:
    token 0 wins), dist's softmax turns the sum into NaN and falls back to a fixed token -- a token either way, from
    a decode that went wrong. A logit of -inf is how llama.cpp masks a token (logit_bias), but a model's logits never
    hold one; one that does is as broken as a NaN."""
    logits = ctx.get_logits_ith(idx)
    bad = ~np.isfinite(logits)
    if bad.any():
        kinds = [k for k, m in (("NaN", np.isnan(logits)), ("+inf", np.isposinf(logits)),
                                ("-inf", np.isneginf(logits))) if m.any()]
        raise ValueError(f"llama_sampler_sample: the logits of output {idx} are not finite ({int(bad.sum())} of "
                         f"{len(logits)}: {', '.join(kinds)}; first at token {int(np.flatnonzero(bad)[0])}): no token "
                         f"can be sampled from them (the decode that produced them went wrong)")
    cur = TokenDataArray(logits)
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


def sampler_get_seed(smpl: Sampler) -> int:
    """llama_sampler_get_seed: the seed dist uses (the random one it drew for LLAMA_DEFAULT_SEED); for a chain, that
    of the last sampler with one; LLAMA_DEFAULT_SEED if none."""
    if isinstance(smpl, Dist):
        return smpl.seed_cur
    if isinstance(smpl, SamplerChain):
        for s in reversed(smpl.samplers):
            seed = sampler_get_seed(s)
            if seed != LLAMA_DEFAULT_SEED:
                return seed
    return LLAMA_DEFAULT_SEED
