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
# # 07 · One decode, step by step
#
# The classroom walkthrough of one `llama_decode`: from the prompt's text to the next token, through every stage
# llama.cpp goes through, with the values the model really computed.
#
# 1. tokenize (`llama_tokenize`, byte-pair encoding);
# 2. embeddings: each token's row of `token_embd.weight`;
# 3. layer 0, node by node, values copied out by the eval callback (`cb_eval`);
# 4. attention: which earlier tokens each head looks at;
# 5. logits → sampler → the chosen token;
# 6. and round again: the chosen token is decoded alone, using the KV cache;
# and in section 8, flash attention, llama.cpp's default: one query row of a real FLASH_ATTN_EXT, KV cell by KV cell.

# %%
import numpy as np
from ggviz import capture, ggml, llama, viz
from ggviz.run import load_model, make_sampler
from ggviz.viz import model_views as MV

model = load_model()
vocab = llama.model_get_vocab(model)
prompt = "The ggml library is"


def piece(t):
    return vocab.token_to_piece(int(t), True).decode("utf-8", "replace")

# %% [markdown]
# ## 1. Tokenize
#
# `llama_tokenize` cuts the text into words with the pre-tokenizer's regex, writes each byte as a printable symbol
# (a space becomes `Ġ`) and runs **byte-pair encoding** on each word: repeatedly merge the adjacent pair with the
# lowest rank in `tokenizer.ggml.merges` until no pair is in the list. A BOS token is put first only when the model
# asks for it (`tokenizer.ggml.add_bos_token`).

# %%
ids = llama.tokenize(vocab, prompt, add_special=True, parse_special=True)
print(ids, [piece(t) for t in ids], "| add_bos:", vocab.add_bos)
MV.bpe_table(vocab, " library")

# %% [markdown]
# *Read the code:* ggviz.llama.vocab.Vocab.tokenize, ggviz.llama.vocab.Vocab.bpe_trace, ggviz.llama.unicode.regex_split ↔ llama-vocab.cpp llama_tokenize, llm_tokenizer_bpe_session::tokenize; unicode.cpp unicode_regex_split

# %% [markdown]
# ## 2 and 3. One decode, node by node
#
# `DecodeStepper` runs `llama_decode` on the prompt (one batch of 6 tokens) with llama.cpp's eval callback asking for
# **every** node: the scheduler then computes the graph one node at a time, and the callback copies each result before
# a later node can reuse its memory. Stepping is free afterwards. Node 0 is the embedding lookup: `GET_ROWS` picks
# each token's row of `token_embd.weight` (dequantizing Q8_0 to F32).

# %%
from ggviz.viz.widgets import DecodeStepper

st = DecodeStepper(prompt, tokens=ids, model=model)
print(f"{st.n_steps} nodes recorded in {st.decode_s:.1f} s")
emb = ggml.get_data_f32(model.tok_embd).reshape(model.hparams.n_vocab, -1)[ids]
s0 = st.goto(0).state()
print(s0["name"], s0["op"], s0["ne"], "== the tokens' rows of token_embd.weight:",
      np.allclose(st.values().reshape(len(ids), -1), emb))

# %% [markdown]
# > **Teacher note.** Layer 0 then runs, in this order: `norm-0` (RMS_NORM: divide by the root mean square),
# > `attn_norm-0` (MUL by the learned weights), `Qcur-0`/`Kcur-0`/`Vcur-0` (three MUL_MATs with Q4_1 weights),
# > ROPE on Q and K (a rotation by the position), SET_ROWS into the KV cache, `kq-0` (K·Q per head),
# > `kq_soft_max-0`, `kqv-0` (weights · V), `attn_out-0`, the residual ADD `ffn_inp-0`, the feed-forward block
# > (`ffn_norm`, gate and up, SWIGLU, down) and the second residual `l_out-0`. Step with the buttons, or jump by
# > name:

# %%
rows = []
for name in ["norm-0", "attn_norm-0", "Qcur-0", "kq-0", "kq_soft_max-0", "kqv_out-0", "ffn_inp-0", "ffn_swiglu-0",
             "l_out-0"]:
    s = st.goto(name).state()
    rows.append({"node": s["index"], "name": s["name"], "op": s["op"], "ne": s["ne"],
                 "min": s["stats"]["min"], "max": s["stats"]["max"], "mean": s["stats"]["mean"]})
viz.Table(rows, title="layer 0 of one decode (first node of each name)")

# %%
st.goto("attn_norm-0")
st

# %% [markdown]
# *Read the code:* ggviz.llama.context.LlamaContext.decode, ggviz.ggml.sched.backend_sched_graph_compute_async ↔ llama-context.cpp llama_context::decode, llama_context::process_ubatch; ggml-backend.cpp ggml_backend_sched_graph_compute_async

# %% [markdown]
# ## 4. Attention in layer 0
#
# The eval callback can also ask for just the softmax nodes (`capture_attention`): for each head, how much each token
# attends to each earlier token. Rows are queries, columns the KV cells; the causal mask leaves the upper triangle
# empty. (Those weights are a tensor only without flash attention: llama.cpp's default on the CPU fuses KQ, softmax
# and KQV into one FLASH_ATTN_EXT per layer, so this context, like the stepper's, sets `flash_attn_type = 0`.)

# %%
cp = llama.context_default_params()
cp.n_ctx, cp.n_threads, cp.n_threads_batch = 256, 2, 2
cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx = llama.init_from_model(model, cp)
att = capture.capture_attention(ctx, ids, layers=[0])          # this is the decode of the prompt on ctx
MV.attention_figure(att, 0);

# %% [markdown]
# > **Teacher note.** 9 query heads share 3 K/V heads (grouped-query attention). Heads differ: some put most of their
# > weight on the first token (an "attention sink"), others on the token itself or the one before.
#
# *Read the code:* ggviz.llama.graph.LlmGraphContext.build_attn, ggviz.llama.graph.LlmGraphContext.build_attn_mha ↔ llama-graph.cpp llm_graph_context::build_attn, llm_graph_context::build_attn_mha
#
# ## 5. Logits → sampler → token
#
# The last node, `result_output`, gives one logit per vocabulary entry, for the last token only (the batch's output).
# `llama_sampler_sample` runs a chain of samplers over them: top-k, top-p, min-p, temperature, then a seeded random
# draw.

# %%
logits = llama.get_logits_ith(ctx, -1)
# the stepper's decode (cut into 1086 one-node computes) and this one (cut at the 30 softmaxes) pick the same token
assert int(np.argmax(logits)) == int(np.argmax(st.logits))
print(f"max |logits - stepper's logits| = {np.abs(logits - st.logits).max():.3g}")
chain = make_sampler(temp=0.8, seed=1234)             # top_k 40 -> top_p 0.95 -> min_p 0.05 -> temp -> dist
nxt = llama.sampler_sample(chain, ctx, -1)
print(f"chosen: {nxt} {piece(nxt)!r} (greedy: {piece(int(np.argmax(logits)))!r}); text: {prompt + piece(nxt)!r}")
MV.sampler_figure(chain.history, vocab);

# %% [markdown]
# *Read the code:* ggviz.llama.context.LlamaContext.get_logits_ith, ggviz.llama.sampling.sampler_sample ↔ llama-context.cpp llama_get_logits_ith; llama-sampler.cpp llama_sampler_sample

# %% [markdown]
# ## 6. Round again: decode the chosen token
#
# The chosen token is the next batch, of one token. Its K and V go into the next free KV cell; the earlier tokens' K
# and V are already there, so nothing of the prompt is recomputed. The mask lets it see every earlier cell.

# %%
with capture.capture_inputs(ctx) as snaps:
    assert llama.decode(ctx, llama.batch_get_one([nxt])) == 0
MV.kv_cache_figure(snaps[-1], vocab);

# %% [markdown]
# > **Teacher note.** This loop (sample, decode one token, repeat) is `ggviz.generate` (notebook 00) and llama.cpp's
# > `llama-simple`. `ggviz report` writes this walkthrough, for one such single-token step, as a standalone web
# > page.
#
# *Read the code:* ggviz.llama.batch.batch_get_one, ggviz.llama.kv_cache.KVCache.apply_ubatch, ggviz.llama.kv_cache.KVCache.set_input ↔ llama-batch.cpp llama_batch_get_one; llama-kv-cache.cpp llama_kv_cache::apply_ubatch, llama_kv_cache::set_input_kq_mask

# %% [markdown]
# ## 7. The whole step, linked
#
# Everything above, for one decode step, in one view that follows one selection. `DecodeExplorer.record` decodes the
# prompt and then the next token alone, recording every trace event of that step (graph build, the scheduler's
# passes, the allocator's plan, every thread's node spans); a second run of the same step copies each node's output
# with the eval callback, for the values pane.
#
# The row at the top is llama.cpp's path through `llama_decode` (seed 000 of the sources): click a phase to read what
# it does and see what it is about (`llama_sampler_sample` opens the sampler chain, stage by stage). Read its times
# with care: they are ggviz's, and building, splitting and allocating the graph are interpreted Python here, while
# llama.cpp does them in C in a fraction of a millisecond. The green times are the *next* token's step, which
# reused the graph as llama.cpp does for every step of the same shape: no graph built, none allocated, nearly all
# of it compute. That is the proportion of a generation. Then pick a node: click it in the graph (drag to pan, wheel to zoom: this is the
# whole 1086-node DAG), in the buffer map or in a thread lane, or type its name in the search box. Every pane
# follows:
#
# - **graph**: the node outlined;
# - **bytes**: where its data pointer is in the compute buffer, the slot `ggml_gallocr` planned for it, and the other
#   tensors that hold the same bytes before or after it (orange): how 1086 nodes fit in one buffer;
# - **thread lanes**: its span on each thread of `ggml_graph_compute`, zoomed; grey is time spent in `ggml_barrier`;
# - **scheduler**: the backend `ggml_backend_sched_split_graph` gave it, in which pass and why (`SET_CAUSE`);
# - **values**: its output (a long row is folded into rows, so it stays readable).

# %%
from ggviz.viz.widgets import DecodeExplorer

ex = DecodeExplorer.record(prompt, threads=2, model=model)
ex.select("kq-0")
s = ex.state()
print(s["selected"]["name"], s["selected"]["op"], s["selected"]["ne"])
print("bytes:", s["bytes"]["buffer"], "offset", s["bytes"]["offset"], "slot", s["bytes"]["slot"],
      "shared over time with", len(s["bytes"]["sharers"]), "other tensors")
print("lanes:", [(x["ith"], round(x["t1"] - x["t0"], 1)) for x in s["lanes"]], "µs per thread")
print("scheduler:", s["cause"]["backend"], s["cause"]["cause"], "-", s["cause"]["why"])

# %%
ex

# %% [markdown]
# > **Exercise: predict, then reveal.** `ggml_gallocr` writes some nodes **in place**: over the bytes of a parent
# > that no later node reads, when the op allows it (`ggml_op_can_inplace`: element-wise ops, norms, softmax ...).
# > For each node below, guess `True` (in place over a parent) or `False` (a slot of its own), run the check, then
# > select the nodes in the explorer: an in-place node's slot starts where its parent's ends, in the same bytes.

# %%
guess = {"attn_norm-0": None, "Qcur-0": None, "kq_soft_max-0": None, "ffn_inp-0": None}   # True / False
REVEAL = False          # True: show the answers without guessing

answer = {n: ex.select(n).state()["bytes"]["reused_from"] for n in guess}
if None in guess.values() and not REVEAL:
    print("write your guesses in `guess` (or set REVEAL = True), then run this cell again")
else:
    for n, parent in answer.items():
        mark = "" if guess[n] is None else ("  ✓" if guess[n] == (parent is not None) else "  ✗")
        print(f"{n:14} {'in place over ' + parent if parent else 'a slot of its own'}{mark}")

# %% [markdown]
# > **Teacher note.** Ask before clicking: *will `kq-0`'s bytes be reused by a later node?* (The allocator frees a
# > tensor after its last reader, `ggml_gallocr_free_node`, and the next tensor that fits takes its place.) Then
# > select `result_output`: a graph output (`GGML_TENSOR_FLAG_OUTPUT`), never freed: every tensor that shares its
# > bytes came before it. `ggviz explore` serves this same view in a browser tab (Voilà), without the notebook.
#
# *Read the code:* ggviz.llama.context.LlamaContext.decode, ggviz.ggml.sched.backend_sched_split_graph, ggviz.ggml.alloc.gallocr_alloc_graph, ggviz.ggml.cpu.ggml_cpu.graph_compute ↔ llama-context.cpp llama_context::decode; ggml-backend.cpp ggml_backend_sched_split_graph; ggml-alloc.c ggml_gallocr_alloc_graph; ggml-cpu.c ggml_graph_compute

# %% [markdown]
# ## 8. Flash attention: llama.cpp's default
#
# Everything above ran with `flash_attn_type = 0`, so that the attention weights are a tensor (`kq_soft_max`) you
# can look at. llama.cpp's default is `LLAMA_FLASH_ATTN_TYPE_AUTO`, which the CPU backend resolves to *on*: each
# layer's KQ → SOFT_MAX → KQV becomes one `FLASH_ATTN_EXT` node that reads K and V straight from the cache and never
# writes the KQ matrix. Build the decode graph both ways, and reserve the compute buffers both ways (the context's
# worst-case reserve: a prompt-sized graph of `n_ubatch` tokens).

# %%
from ggviz.viz.widgets import AttnGraphsView, Exercise, FlashAttnStepper


def fa_context(fa, n_ctx=256):
    cp = llama.context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.flash_attn_type = n_ctx, 2, 2, fa
    return llama.init_from_model(model, cp)


fa_rows = []
for n_ctx in (256, 4096):
    for fa in (llama.LLAMA_FLASH_ATTN_TYPE_AUTO, llama.LLAMA_FLASH_ATTN_TYPE_DISABLED):
        c = fa_context(fa, n_ctx)
        n_nodes = c.build_graph(1, 1, n_ctx).gf.n_nodes if n_ctx == 256 else None
        hp = model.hparams
        fa_rows.append({"n_ctx": n_ctx, "flash_attn_type": fa, "flash attention": c.flash_attn,
                        "decode graph nodes": n_nodes,
                        "compute buffer (MiB)": round(sum(c.compute_buffer_sizes().values()) / 2**20, 2),
                        "KQ of one layer, pp reserve (MiB)": round(c.n_ctx * c.n_ubatch * hp.n_head * 4 / 2**20, 2)})
        llama.free(c)
viz.Table(fa_rows, title="flash attention on (AUTO) and off: graph and compute buffer")

# %% [markdown]
# The graph loses 150 nodes. The compute buffer barely moves: its peak is not in attention but at the end of the
# graph, where the logits of a whole ubatch (`n_ubatch × 49152` floats: 48 MiB at `n_ubatch` = 256, 96 MiB at 512)
# are alive. The KQ matrix of one layer (the last column: what the non-FA graph writes and FLASH_ATTN_EXT never does)
# is 2.25 MiB at `n_ctx` = 256 and fits under that peak; at 4096 it is 72 MiB and the fused op saves 1.13 MiB of the
# buffer. KQ grows as `n_ctx × n_ubatch`; the logits do not grow with the context.

# %% [markdown]
# **One layer, both ways.** Layer 0 of the two decode graphs side by side: which nodes flash attention removes,
# which it adds, and the tensors only one side allocates in the prompt-sized reserve graph (toggle between them).

# %%
AttnGraphsView(capture.capture_attn_graphs(model, n_ctx=4096, layer=0))

# %%
n_layer = model.hparams.n_layer
fa_nodes = [r["decode graph nodes"] for r in fa_rows if r["n_ctx"] == 256]
Exercise(f"SmolLM2 has {n_layer} layers. The decode graph has {fa_nodes[1]} nodes without flash attention. "
         "How many nodes per layer does flash attention remove?",
         (fa_nodes[1] - fa_nodes[0]) // n_layer, unit="nodes per layer",
         explain="KQ (MUL_MAT), SOFT_MAX, KQV (MUL_MAT) and the PERMUTE and CONT after it are gone, one "
                 "FLASH_ATTN_EXT (and a RESHAPE of its output) in their place; V, stored untransposed, takes fewer "
                 "reshapes to write into the cache.")

# %% [markdown]
# **The stepper.** One query row of a real decode step (the prompt, then its greedy next token, llama.cpp's default
# context params): `capture_flash_attn` copies a layer's FLASH_ATTN_EXT node through the eval callback, and
# `walk_flash_attn` runs one head's row through the one-chunk kernel (the kernel a decode step runs) with that
# kernel's own functions, keeping every step. Per KV cell: the score `s` (a `ggml_vec_dot_f16` of K's row and Q
# rounded to F16, times the scale, plus the mask), the running max `M`, the rescale `ms = expf(Mold - M)` when `s`
# raises the max, the cell's weight `vs = expf(s - M)` otherwise, the F16 accumulator `VKQ = VKQ·ms + vs·v`, the
# running sum `S = S·ms + vs`. After the last cell, `VKQ / S` is the node's output row.

# %%
fa_cap = capture.capture_flash_attn(model, layer=0, prompt=prompt)
walk = capture.walk_flash_attn(fa_cap, head=4)
assert walk.matches_output()
FlashAttnStepper(walk)

# %% [markdown]
# > **Teacher note.** The cells the mask hides (all but the first `pos + 1`) are skipped, not computed: the row
# > visits as many cells as there are tokens so far. The softmax's weights never exist as a vector: each is used once
# > (`vs`) and folded into `S`, and an earlier cell's weight is corrected later by `ms` when the max moves.

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
Exercise("Step 0 of every row has ms = 0. Why?",
         "M starts at -inf, so ms = expf(-inf - s) = 0: the empty accumulator is scaled by 0",
         choices=["M starts at -inf, so ms = expf(-inf - s) = 0: the empty accumulator is scaled by 0",
                  "the first KV cell is masked", "expf underflows in F16"],
         kind="why",
         explain=f"In this walk ms[0] = {float(walk.ms[0]):g} and M[0] = s[0] = {float(walk.M[0]):.6g}.")

# %% [markdown]
# **Change a parameter, predict, rerun.** Set `longer_prompt` below to a longer text. Before running the cell:
# how many KV cells will one row of the decode step visit?

# %%
longer_prompt = prompt + " a tensor library for machine learning"
n_prompt = len(llama.tokenize(vocab, longer_prompt, add_special=True, parse_special=True))
walk2 = capture.walk_flash_attn(capture.capture_flash_attn(model, layer=0, prompt=longer_prompt), head=4)
assert walk2.matches_output()
Exercise(f"The prompt is {n_prompt} tokens. The decode step decodes its greedy next token. How many KV cells does "
         "one row of that step's FLASH_ATTN_EXT visit (and how many steps will the stepper show)?",
         len(walk2.cells), unit="cells", kind="rerun",
         explain="The prompt's cells and the new token's own (written to the cache before attention): "
                 "n_prompt + 1. The other cells of the 256 are masked with -inf and skipped.")

# %% [markdown]
# *Read the code:* ggviz.ggml.ops.flash_attn_ext, ggviz.ggml.cpu.ops.forward_flash_attn_ext, ggviz.ggml.cpu.ops.fa_online_step, ggviz.capture.flash_attn.walk_flash_attn ↔ ggml.c ggml_flash_attn_ext; ops.cpp ggml_compute_forward_flash_attn_ext_f16_one_chunk
