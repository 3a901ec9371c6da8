"""What a newcomer meets first: ggviz against llama.cpp in fresh Python processes, alternating.

    .venv/bin/python benchmarks/bench_oneshot.py [--threads 2] [--reps 3]

(llama.cpp through llama-cpp-python, when this interpreter can import ``llama_cpp``: e.g.
``PYTHONPATH=/path/to/site-packages-with-llama_cpp``.) Printed, for each library, the median of the reps:

* the one-shot ``ggviz run -p "The capital of France is" -n 32`` (the whole process, wall), beside the same run
  through llama-cpp-python (the texts are compared), and both runs by phase: interpreter start-up, imports, model
  load, context creation, the prompt, the first step, the other steps;
* the first context of a loaded model: context (n_ctx 512) + the 4-token prompt + the first sample;
* the first decode step after a 128-token prompt (a new batch shape) beside a steady step, twice: in a fresh
  process (load, context, the prompt, the step: the user's case, no 1-token graph built before) and in the
  process that has just run the first context (a 4-token prompt's graphs exist);
* ggviz's Numba first use by phase: ms in Numba's compiler lock, dispatchers loaded from its cache / compiled.

It prints; it does not assert. The code is ``ggviz.tools.bench.oneshot_bench`` (``ggviz bench`` runs it after its
in-process table); each process is ``ggviz/tools/oneshot_child.py``.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ggviz import cli  # noqa: E402
from ggviz.tools.bench import oneshot_bench  # noqa: E402


def main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="bench_oneshot.py", description="one-shot run, first context, new shape")
    ap.add_argument("--threads", type=cli.int_arg(1, 512), default=2)
    ap.add_argument("--reps", type=cli.int_arg(1), default=3)
    ap.add_argument("--model", default=None, type=cli.model_file)
    a = ap.parse_args(argv)
    oneshot_bench(a.model, a.threads, a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
