# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Quickstart: a language model, run the ggml way
#
# ggviz runs **SmolLM2-135M-Instruct** (a llama-architecture model, 30 layers, weights quantized to Q4_1) with a
# Python/NumPy mirror of **ggml** and **llama.cpp**: the same data structures, the same functions, the same order of
# operations, only slow enough to watch. This notebook runs it end to end, opens three windows onto what happened,
# then measures it the way llama.cpp's benchmark does:
#
# 1. generate a few tokens (`ggviz.generate`, the `llama-simple` loop);
# 2. the compute graph of one decode step;
# 3. the memory: the model file, the KV cache, the compute buffer;
# 4. speed, measured as `llama-bench` measures it.
#
# > **Teacher note.** Everything below is a real run: the numbers come from the model file, not from a drawing.
# > The other notebooks zoom in: 01–02 tensors and the context arena, 03 the graph, 06 the threadpool,
# > 07 one decode step from text to token. `ggviz report` writes the same walkthrough as one HTML page.

# %%
import ggviz
from ggviz import llama, viz
from ggviz.run import load_model

MODEL = "smollm2"               # or "gemma3-270m" (after `ggviz fetch gemma3-270m`), or the path of a GGUF file
model = load_model(MODEL)       # llama_model_load_from_file: parse the GGUF, map the weights, build the vocabulary
hp = model.hparams
# desc() is llama_model_desc: llama.cpp names the type from the layer count, so 30 layers read "256M" (see §4)
print(model.desc(), f"| {hp.n_layer} layers, n_embd={hp.n_embd}, n_head={hp.n_head} (kv {hp.n_head_kv}), "
      f"n_vocab={hp.n_vocab}, {model.n_params() / 1e6:.0f} M parameters, {model.size() / 2**20:.0f} MiB")

# %% [markdown]
# ## 1. Generate
#
# `ggviz.generate` does what llama.cpp's `llama-simple` example does with the llama.h API: `llama_tokenize` the
# prompt, `llama_decode` it as one batch, then repeat *sample a token → decode that one token* until `n_predict`.
# Greedy sampling (the most likely token each time) makes the output reproducible.

# %%
g = ggviz.generate("The ggml library is", n_predict=8, model=model, threads=2, n_ctx=256)
print(g.prompt + g.text)
print()
print(g.timings())

# %%
vocab = llama.model_get_vocab(model)
print("prompt tokens :", [(t, vocab.token_to_piece(t, True).decode()) for t in g.prompt_tokens])
print("new tokens    :", [(t, vocab.token_to_piece(t, True).decode()) for t in g.tokens])

# %%
from ggviz.viz.widgets import Exercise

my_prompt = "The ggml library is written in C"     # change the text, predict, then run this cell again
my_ids = llama.tokenize(vocab, my_prompt, add_special=True, parse_special=True)
n_my = len(my_ids)
Exercise(f"The tokenizer turned {g.prompt!r} into {len(g.prompt_tokens)} tokens (the list above). Into how many "
         f"tokens will it turn {my_prompt!r}?", n_my, unit="tokens", kind="rerun",
         explain="A frequent English word with its leading space is usually one token (' library'); a rare one "
                 "takes several (' g' + 'g' + 'ml' above). SmolLM2's tokenizer adds no BOS (the list starts with the "
                 f"text itself). Here: {[vocab.token_to_piece(t, True).decode() for t in my_ids]}.")

# %% [markdown]
# *Read the code:* ggviz.llama.vocab.Vocab.tokenize, ggviz.llama.context.LlamaContext.decode, ggviz.llama.sampling.sampler_sample ↔ llama-vocab.cpp llama_tokenize; llama-context.cpp llama_decode; llama-sampler.cpp llama_sampler_sample

# %% [markdown]
# ## 2. The graph of one decode step
#
# Each `llama_decode` builds a **compute graph** (`llm_build_llama`): a DAG of ggml operations from the token id to
# the 49152 logits. For one token it has 1086 nodes. The widget below (`GraphView`) draws layer 0 open and folds the
# layers that repeat it node for node into one box; the last layer has its own box because it holds two more nodes
# (llama.cpp's GET_ROWS by `inp_out_ids`, keeping only the rows whose logits are asked for, before the output head).
# A click on a box opens its first layer.

# %%
from ggviz.capture import decode_graph

res = decode_graph(model)          # llama_context::build_graph for n_tokens = 1 (built, not computed)
gf = res.gf
print(f"{gf.n_nodes} nodes, {gf.n_leafs} leafs | first nodes: {', '.join(t.name for t in gf.nodes[:4])} … | "
      f"last: {gf.nodes[-1].name}")

# %%
from ggviz.viz import graph_dot
from ggviz.viz.widgets import GraphView

view = GraphView(gf, fold=True)    # runs of identical collapsed layers as one box
view.expand(0)                     # layer 0 opened up: the attention block, then the feed-forward block
print(graph_dot.describe_picture(view.layout()[1]))
view

# %% [markdown]
# *Read the code:* ggviz.llama.context.LlamaContext.build_graph, ggviz.llama.models.llama.LlamaGraph.build ↔ llama-context.cpp llama_context::process_ubatch; models/llama.cpp llama_model_llama::build_arch_graph

# %% [markdown]
# ## 3. Memory
#
# Three kinds of memory take part in a decode:
#
# * the **weights**: mapped from the GGUF file (never copied); the file map shows where each tensor's bytes are;
# * the **KV cache**: K and V of every token seen so far, per layer;
# * the **compute buffer**: the graph's intermediate results, placed by the graph allocator, which reuses memory
#   as soon as a result is no longer needed.

# %%
from ggviz.viz.widgets import GGUFMapWidget

GGUFMapWidget(model.gguf, selected="blk.0.attn_q.weight")

# %%
import matplotlib.pyplot as plt
from ggviz.capture import decode_step
from ggviz.ggml import alloc

step = decode_step("The ggml library is", threads=2, model=model, record=False)   # prompt + one decode step
kv = step.ctx.kv
kv_data = sum(b.size for b in kv.bufs)            # the K and V bytes: a backend buffer, not the ggml context
fig, ax = plt.subplots(figsize=(13, 2.2))
viz.plot_arena(kv.ctx, ax=ax, scale="sqrt", max_labels=12,
               title=f"the KV cache's ggml context: the headers of {len(kv.k_l)} K and {len(kv.v_l)} V tensors "
                     f"({kv.ctx.used_mem():,} bytes of metadata, no_alloc); their data, {kv_data / 2**20:.3f} MiB "
                     f"for {kv.size} cells, is in a backend buffer")
plt.show()
print(f"KV cache: {kv.size} cells, {kv.cells.used} used (the prompt and the decoded token); data "
      f"{kv_data:,} bytes = {kv_data / 2**20:.3f} MiB in {len(kv.bufs)} backend buffer(s)")

galloc = step.ctx.sched.galloc if hasattr(step.ctx, "sched") else step.ctx._galloc   # the graph allocator
plan = galloc.last_alloc
total = sum(t["size"] for t in plan["tensors"] if t["offset"] is not None and not t["view_src"])
buf = sum(alloc.gallocr_get_buffer_size(galloc, i) for i in range(galloc.n_buffers))
print(f"compute buffer: {len(plan['tensors'])} tensors placed for a {plan['n_nodes']}-node graph; "
      f"sum of their sizes {total / 2**20:.2f} MiB, in a buffer of {buf / 2**20:.2f} MiB")

# %%
per_cell = kv_data / kv.size                       # bytes per KV cell: K and V of every layer
Exercise(f"This context has {kv.size} KV cells. How many MiB of K and V data would a context of 4096 cells "
         f"hold (same model, F16 cache)?", round(per_cell * 4096 / 2**20, 3), rel_tol=0.01, unit="MiB",
         explain=f"Each cell holds K and V for every layer: {hp.n_layer} layers × 2 × {int(per_cell) // (4 * hp.n_layer)} "
                 f"F16 values ({hp.n_head_kv} KV heads × {hp.n_embd // hp.n_head} dims) = {int(per_cell):,} bytes "
                 f"per cell; the cache grows linearly with n_ctx, the weights do not.")

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
Exercise(f"The compute buffer ({buf / 2**20:.2f} MiB) is smaller than the sum of the tensors placed in it "
         f"({total / 2**20:.2f} MiB). Why?",
         "the allocator reuses a tensor's bytes once its last consumer has run",
         choices=["the allocator reuses a tensor's bytes once its last consumer has run",
                  "the activations are quantized to Q4_1 like the weights",
                  "most tensors are views and take no bytes"],
         kind="why",
         explain=f"ggml_gallocr frees a tensor after its last consumer and hands the bytes to later nodes (often "
                 f"in place): {len(plan['tensors'])} tensors share {buf / 2**20:.2f} MiB. Views are not counted in "
                 f"the sum above, and activations stay F32.")

# %% [markdown]
# > **Teacher note.** Notebook 04 (the allocator) shows the plan tensor by tensor. Next: **03 · the compute graph**.
#
# *Read the code:* ggviz.llama.kv_cache.KVCache, ggviz.ggml.alloc.gallocr_alloc_graph ↔ llama-kv-cache.cpp llama_kv_cache::llama_kv_cache; ggml-alloc.c ggml_gallocr_alloc_graph

# %% [markdown]
# ## 4. Speed, the llama-bench way
#
# llama.cpp's `llama-bench` reports two numbers per model: **pp** (prompt processing: a prompt of `n_prompt`
# random tokens decoded in batches, no generation) and **tg** (text generation: `n_gen` single-token decodes). For
# each test it creates a context of `n_prompt + n_gen` cells, runs it once as a **warm-up** (the whole prompt, or
# one generated token) that is *not* counted, then repeats it `-r` times, clearing the KV cache before each, and
# turns every repetition's time into tokens per second; the table shows their mean ± sample standard deviation.
# `ggviz bench --llama-bench` runs that flow (with llama.cpp alternating when llama-cpp-python is installed); here a
# small grid, pp32 and tg16, 3 repetitions, 2 threads, on ggviz alone:

# %%
from ggviz.tools import llama_bench as lb

runner = lb.GGvizRunner(model=model)
grid = lb.get_cmd_params_instances(n_prompt=[32], n_gen=[16], n_threads=[2])   # llama-bench -p 32 -n 16 -t 2
bench = [tests[0] for tests in lb.run_bench([runner], grid, reps=3)]
print(lb.markdown_table(bench, runner.build))

# %%
rows = []
for t in bench:
    n = t.inst.n_prompt + t.inst.n_gen
    rows += [{"test": t.inst.name, "run": "warm-up (not counted)", "ms": f"{w / 1e6:.1f}", "t/s": "—"}
             for w in t.warmup_ns]
    rows += [{"test": t.inst.name, "run": f"repetition {i + 1}", "ms": f"{s / 1e6:.1f}", "t/s": f"{1e9 * n / s:.2f}"}
             for i, s in enumerate(t.samples_ns)]
    rows.append({"test": t.inst.name, "run": "mean ± sample stdev of the repetitions", "ms": "",
                 "t/s": f"{t.avg_ts():.2f} ± {t.stdev_ts():.2f}"})
viz.Table(rows, title="every timed run of the table above: t/s = tokens / time per repetition, the warm-up left out "
                      "(its time includes first-use costs a steady run does not pay)")

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
tg = bench[1]
Exercise(f"tg{tg.inst.n_gen} ran {len(tg.samples_ns)} repetitions after one warm-up. How many single-token decodes "
         f"did ggviz run for this test in all?", 1 + len(tg.samples_ns) * tg.inst.n_gen, unit="decodes",
         explain=f"llama-bench's warm-up for a tg test generates one token; each of the {len(tg.samples_ns)} "
                 f"repetitions generates {tg.inst.n_gen}: 1 + {len(tg.samples_ns)} × {tg.inst.n_gen}.")

# %% [markdown]
# > **Teacher note.** These figures come from a Python engine on whatever machine built this page; llama.cpp's own
# > figures for the same flow come from `ggviz bench --llama-bench` with llama-cpp-python installed (the two
# > alternate repetition by repetition, so a busy machine slows both alike). Its `model` column reads
# > "llama 256M Q4_1" for this 135M model, in ggviz as in llama.cpp: `llama_model_desc` names the size from the
# > layer count (30 layers → 256M, an entry written for SmolDocling), not from the GGUF's `general.size_label`.
#
# *Read the code:* ggviz.tools.llama_bench.run_bench, ggviz.tools.llama_bench.test_prompt, ggviz.tools.llama_bench.test_gen, ggviz.tools.llama_bench.markdown_table ↔ llama-bench.cpp get_cmd_params_instances, test_prompt, test_gen, markdown_printer::print_test
