"""``ggviz bench``'s user measurement (ggviz.tools.bench.user_bench), run small and without llama.cpp: every row of the
table is printed, and the profiled shape change really rebuilds (its build, split and allocation parts are not
empty) -- it prints figures; no figure is asserted."""
from __future__ import annotations

from pathlib import Path

import pytest

from ggviz.tools import bench

MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_user_bench_ggviz_alone():
    if not MODEL.exists():
        pytest.skip("the default model is not in data/models")
    lines = []
    res = bench.user_bench(MODEL, n_threads=1, reps=1, n_gen=2, n_prompt_long=8, llama_cpp=False, log=lines.append)
    text = "\n".join(lines)
    for row in ("context creation, ms", "4-token prompt, ms", "first token (the three above), ms",
                "2 tokens greedy, tok/s", "2 tokens, common chain, tok/s", "prefill of 8 tokens, tok/s",
                "decode after it (2 tokens), tok/s"):
        assert row in text, row
    assert "llama.cpp" not in text.split("median of")[1].split("\n")[1]       # ggviz's column alone
    assert len(res["ggviz"]["ttft_ms"]) == 1
    parts = dict(res["shape_change"]["parts"])
    for label in ("graph build (llm_graph_context)", "scheduler split (5 passes)", "allocation (gallocr)"):
        assert parts[label] > 0, (label, parts)
