"""How fast are Gemma-3's SPM vocabulary (262,144 tokens) loaded and used, beside llama.cpp?

    python benchmarks/bench_vocab.py [--runs 3] [--model gemma3-270m|smollm2|PATH]

Timed, alternating ggviz and llama.cpp (the installed llama_cpp, ``vocab_only=True``) in each run:

* **load** -- ggviz: ``Vocab.from_gguf_kv`` on the metadata ``ggviz.ggml.gguf.load_gguf`` parsed (the parse
  itself timed apart); llama.cpp: ``Llama(path, vocab_only=True)``, which parses the file and builds its vocab;
* **tokenize** -- the 10 reference strings of tests/data/gemma3/gemma3_tokenize.json, 20 times, add_special and
  parse_special on, tokens per second;
* **60 KB text** -- the mixed text of tests/spm_text.py (prose, digits, scripts, emoji, whitespace runs, code,
  special-token texts, byte fallback; 18,774 Gemma-3 tokens), add_special and parse_special on: the first call on
  the fresh vocabulary (ggviz builds the compiled tokenizer's tables then: vocab_fast.py) and a second one; the ids
  are checked against llama.cpp's (and, for Gemma-3, the stored tests/data/gemma3/gemma3_tokenize_60k.npz).

Reported: the median over ``--runs`` and the ratio ggviz / llama.cpp. ``--profile``: cProfile's table of one more
ggviz tokenize of the 60 KB text. Benchmarks print; they do not assert. llama_cpp is imported when it can be (e.g.
PYTHONPATH=.:/work/oracle/venv/lib/python3.11/site-packages after the project's own packages).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ggviz import fetch  # noqa: E402
from ggviz.ggml import gguf as gguf_file  # noqa: E402
from ggviz.llama.vocab import Vocab  # noqa: E402
from tests.spm_text import spm_text  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--profile", action="store_true", help="print cProfile's table of a 60 KB ggviz tokenize")
    a = ap.parse_args()
    path = fetch.resolve_model(a.model)
    texts = [c["text"] for c in json.loads((ROOT / "tests" / "data" / "gemma3" / "gemma3_tokenize.json")
                                           .read_text(encoding="utf-8"))["tokenize"]] * 20
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    text = spm_text()
    t = {k: [] for k in ("parse", "vocab", "lc_load", "tok", "lc_tok", "big1", "big", "lc_big1", "lc_big")}
    n_tok = 0
    same = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        kv = gguf_file.load_gguf(path).kv
        t1 = time.perf_counter()
        vocab = Vocab.from_gguf_kv(kv)
        t2 = time.perf_counter()
        t["parse"].append(t1 - t0)
        t["vocab"].append(t2 - t1)
        t0 = time.perf_counter()
        n_tok = sum(len(vocab.tokenize(s, True, True)) for s in texts)
        t["tok"].append(time.perf_counter() - t0)
        for key in ("big1", "big"):
            t0 = time.perf_counter()
            big = vocab.tokenize(text, True, True)
            t[key].append(time.perf_counter() - t0)
        if llama_cpp is not None:
            t0 = time.perf_counter()
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            t["lc_load"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for s in texts:
                llm.tokenize(s.encode(), add_bos=True, special=True)
            t["lc_tok"].append(time.perf_counter() - t0)
            for key in ("lc_big1", "lc_big"):
                t0 = time.perf_counter()
                lc_big = llm.tokenize(text.encode(), add_bos=True, special=True)
                t[key].append(time.perf_counter() - t0)
            same.append(lc_big == big)
            del llm
    med = {k: statistics.median(v) for k, v in t.items() if v}
    print(f"model {path.name}: {vocab.n_tokens:,} tokens ({vocab.type}), {a.runs} runs, medians")
    print(f"  ggviz    load: GGUF parse {med['parse'] * 1e3:7.0f} ms + Vocab {med['vocab'] * 1e3:7.0f} ms")
    print(f"  ggviz    tokenize: {n_tok / med['tok']:10,.0f} tokens/s ({n_tok} tokens)")
    if "lc_load" in med:
        print(f"  llama.cpp load (vocab_only): {med['lc_load'] * 1e3:7.0f} ms   ratio ggviz/llama.cpp "
              f"{(med['parse'] + med['vocab']) / med['lc_load']:.2f}")
        print(f"  llama.cpp tokenize: {n_tok / med['lc_tok']:10,.0f} tokens/s   ratio llama.cpp/ggviz "
              f"{med['tok'] / med['lc_tok']:.1f}")
    n_big = len(big)
    print(f"  60 KB text ({len(text.encode()):,} bytes, {n_big:,} tokens):")
    for key, what in (("big1", "first call"), ("big", "second call")):
        line = f"    {what:11s}: ggviz {n_big / med[key]:10,.0f} tokens/s"
        if "lc_" + key in med:
            line += (f"   llama.cpp {n_big / med['lc_' + key]:10,.0f} tokens/s   ratio ggviz/llama.cpp "
                     f"{med['lc_' + key] / med[key]:.2f}")
        print(line)
    ref = ROOT / "tests" / "data" / "gemma3" / "gemma3_tokenize_60k.npz"
    if vocab.type == "SPM" and vocab.n_tokens == 262_144 and ref.is_file():
        import numpy as np
        print(f"  same ids as the stored llama.cpp capture ({ref.name}): {np.load(ref)['ids_special'].tolist() == big}")
    if same:
        print(f"  same ids as llama.cpp in every run: {all(same)}")
    if a.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.runcall(vocab.tokenize, text, True, True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
