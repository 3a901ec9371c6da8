"""What a user waits for: ggviz against llama.cpp, through each library's own llama.h API, alternating in one run.

    .venv/bin/python benchmarks/bench_user.py [--threads 2] [--reps 3] [--gen 64] [--prompt-long 128]

Measured for each library, the model already loaded (each library loads it once, outside the timings):

* time to first token: create a context (n_ctx 512), decode a 4-token prompt, sample the first token (greedy);
* 64 generated tokens, each decoded and sampled: with the greedy sampler, and with the common chain (top-k 40,
  top-p 0.95, min-p 0.05, temp 0.8, dist);
* a 128-token prompt in one batch, then 64 generated tokens (greedy): the prefill and decode rates.

The two libraries run rep by rep in turn (ggviz, llama.cpp, ggviz, ...) so that the machine's state is shared; the
median of the reps is printed with the ratio ggviz / llama.cpp (> 1: ggviz faster; for the first-token time, < 1).
llama.cpp is llama-cpp-python (``import llama_cpp``): the build it found is named; without it only ggviz's figures are
printed. It prints; it does not assert. The code is ``ggviz.tools.bench``'s (``ggviz bench`` runs it too), with the profile of
a change of batch shape after the table.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ggviz.tools.bench import user_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(user_main(prog="bench_user.py"))
