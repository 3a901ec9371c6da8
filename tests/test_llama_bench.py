"""``ggviz bench --llama-bench`` (ggviz/tools/llama_bench.py) follows llama-bench's flow: structure, not speed.

Two recording libraries stand in for ggviz and llama.cpp (each decode advances a fake clock by a known cost), so
the flow is checked exactly: the grid's order, the context's n_ctx, the warm-up (whole prompt / one token) left out
of the samples, ``llama_memory_clear`` before each repetition, the libraries alternating repetition by repetition,
prompts split in batches of n_batch with BOS first, llama-bench's token ids (glibc's rand, checked against the C
library), and t/s computed from the recorded samples as llama-bench's avg / stdev. The markdown header is
llama-bench's, character for character (the expected lines written from its printer's widths).
"""
from __future__ import annotations

import ctypes
import math

import pytest

from ggviz.tools import llama_bench as lb

CLOCK = [0]


class Recorder:
    """A library as llama_bench drives it; a decode of n tokens costs (n + extra) microseconds on the fake clock."""

    def __init__(self, name, extra, add_bos=True):
        self.name, self.extra, self._add_bos = name, extra, add_bos
        self.log = []
        self.calls = 0

    def desc(self):
        return "llama 256M Q4_1", 96_575_488, 134_515_008

    def add_bos(self):
        return self._add_bos

    def bos(self):
        return 1

    def n_vocab(self):
        return 49152

    def new_ctx(self, inst):
        self.log.append(("ctx", inst.n_prompt + inst.n_gen))
        return object()

    def set_n_threads(self, ctx, n):
        pass

    def memory_clear(self, ctx):
        self.log.append(("clear",))

    def decode(self, ctx, tokens):
        self.calls += 1
        self.log.append(("decode", list(tokens)))
        CLOCK[0] += (len(tokens) + self.extra + self.calls % 4) * 1000     # varying, so stdev is not 0
        return 0

    def free(self, ctx):
        self.log.append(("free",))


@pytest.fixture(autouse=True)
def _fake_clock(monkeypatch):
    CLOCK[0] = 0
    monkeypatch.setattr(lb.time, "perf_counter_ns", lambda: CLOCK[0])


def test_flow_structure_and_numbers():
    a, b = Recorder("ggviz", 5), Recorder("llama.cpp", 1)
    order = []
    for lib in (a, b):
        orig = lib.memory_clear
        lib.memory_clear = (lambda o, n: (lambda ctx: (order.append(n), o(ctx))))(orig, lib.name)
    inst = lb.get_cmd_params_instances([5, 0], [3], [2], n_batch=2)
    assert [(i.name, i.n_threads) for i in inst] == [("pp5", 2), ("tg3", 2)]        # 0 skipped, pp before tg
    res = lb.run_bench([a, b], inst, reps=3)
    rand = lb.GlibcRand(1)
    exp_a = []
    # pp5, n_batch 2: BOS + 4 random ids in batches of 2, 2, 1 -- once as the warm-up, then 3 repetitions
    for _ in range(4):
        toks = [1] + [rand() % 49152 for _ in range(4)]
        exp_a.append([toks[0:2], toks[2:4], toks[4:5]])
    log = a.log
    assert log[0] == ("ctx", 5) and log[1] == ("clear",)
    decodes = [e[1] for e in log[:log.index(("free",))] if e[0] == "decode"]
    assert decodes == [t for run in exp_a for t in run]
    # after the warm-up each repetition starts with a memory clear; the libraries alternate
    assert order[:2] == ["ggviz", "llama.cpp"] and order[2:8] == ["ggviz", "llama.cpp"] * 3
    pp_a = res[0][0]
    assert len(pp_a.warmup_ns) == 1 and len(pp_a.samples_ns) == 3
    # tg3: warm-up is one token, then 3 x 3 single-token decodes, BOS first each time
    tg_dec = [e[1] for e in log[log.index(("free",)) + 1:] if e[0] == "decode"]
    assert len(tg_dec) == 1 + 9 and all(len(t) == 1 for t in tg_dec)
    assert tg_dec[0] == [1] and tg_dec[1] == [1] and tg_dec[4] == [1]
    assert log[log.index(("free",)) + 1] == ("ctx", 3)
    for t in (pp_a, res[1][0], res[0][1]):
        n = t.inst.n_prompt + t.inst.n_gen
        ts = [1e9 * n / s for s in t.samples_ns]
        mean = sum(ts) / len(ts)
        sd = math.sqrt(sum((x - mean) ** 2 for x in ts) / (len(ts) - 1))
        assert t.avg_ts() == pytest.approx(mean, rel=1e-12) and t.stdev_ts() == pytest.approx(sd, rel=1e-9)
        assert sd > 0
        # the warm-up is not in the figures: a different time, absent from the samples
        assert t.warmup_ns[0] not in t.samples_ns
    # each sample is exactly the fake clock's cost of that repetition's decodes
    assert pp_a.samples_ns[0] == sum((len(toks) + 5 + k % 4) * 1000 for k, toks in
                                     zip(range(4, 7), exp_a[1]))
    # --no-warmup: no warm-up run
    c = Recorder("ggviz", 0)
    r = lb.run_bench([c], lb.get_cmd_params_instances([2], [0], [1]), reps=2, no_warmup=True)
    assert r[0][0].warmup_ns == [] and sum(e[0] == "decode" for e in c.log) == 2


def test_markdown_as_llama_bench_prints_it():
    t = lb.Test(lb.Instance(512, 0, 2), "ggviz", "llama 256M Q4_1", 96_575_488, 134_515_008,
                samples_ns=[1_000_000_000, 1_024_000_000])
    lines = lb.markdown_table([t], "ggviz 0.1.0").splitlines()
    assert lines[0] == ("| model                          |       size |     params | backend    | threads |"
                        "            test |                  t/s |")
    assert lines[1] == ("| ------------------------------ | ---------: | ---------: | ---------- | ------: |"
                        " --------------: | -------------------: |")
    # ts = 512 / 1.0 s and 512 / 1.024 s: 512 and 500, mean 506, sample stdev sqrt(72) = 8.49
    assert lines[2] == ("| llama 256M Q4_1                |  92.10 MiB |   134.52 M | CPU        |       2 |"
                        "           pp512 |        506.00 ± 8.49 |")
    assert lines[-1] == "build: ggviz 0.1.0"
    assert "n_batch" in lb.markdown_table([t], "x", n_batch=256).splitlines()[0]


def test_glibc_rand_is_the_c_librarys():
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        pytest.skip("no glibc")
    libc.srand(1)
    g = lb.GlibcRand(1)
    assert [g() for _ in range(1000)] == [libc.rand() for _ in range(1000)]
