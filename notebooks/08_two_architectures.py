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
# # 08 · Two architectures side by side: SmolLM2 (llama) and Gemma-3
#
# Everything so far ran one model, SmolLM2-135M, whose graph llama.cpp builds in `src/models/llama.cpp`. Which parts
# of that graph are "how ggml works" and which are "how llama happens to be built"? Put a second architecture beside
# it: **Gemma-3 270M** (`src/models/gemma3.cpp`, here `ggviz/llama/models/gemma3.py`). Same ggml ops, same scheduler,
# same allocator, same KV-cache machinery; a different recipe:
#
# * the token embeddings are scaled by √n_embd (`inp_scaled`);
# * Q and K are RMS-normed per head before RoPE (*QK norm*), and Q is scaled by 1/√head_dim before attention;
# * head_dim is 256 (not n_embd / n_head = 160), and 4 query heads share 1 KV head;
# * the attention output and the FFN output are normed again (`attn_post_norm`, `ffn_post_norm`) before each residual;
# * the FFN is GEGLU (GELU of the gate times up) instead of SWIGLU;
# * five layers of six attend only a **sliding window** of the last 512 positions, with their own KV cache, mask and
#   RoPE base (the *iSWA* cache: `llama_kv_cache_iswa`).
#
# Every number below comes from real runs of both files. (`ggviz book` fetches Gemma-3 for this page, or stops and
# says so; run live, this notebook needs `ggviz fetch gemma3-270m` first: without it the Gemma cells say so and skip,
# and the Gemma points of section 6 are not shown by this run.)

# %%
import re

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import HTML, display

from ggviz import capture, ggml, llama
from ggviz.fetch import FetchError, resolve_model
from ggviz.run import load_model
from ggviz.viz import model_views as MV
from ggviz.viz.graph_dot import graph_to_dot_grouped
from ggviz.viz.widgets import Exercise

smol = load_model()
try:
    gemma = load_model(str(resolve_model("gemma3-270m")))     # fetched and verified (`ggviz fetch gemma3-270m`)
except FetchError as e:
    gemma = None
    print(f"Gemma-3 is not here ({e}): its columns are skipped. Fetch it with `ggviz fetch gemma3-270m`.")
models = {"SmolLM2-135M (llama)": smol} | ({"Gemma-3 270M (gemma3)": gemma} if gemma is not None else {})


def table(rows, header):
    """A small HTML table (static: it shows in any viewer)."""
    h = "".join(f"<th>{c}</th>" for c in header)
    b = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return HTML(f"<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>")

# %% [markdown]
# ## 1. The hyper-parameters, as llama.cpp reads them
#
# `llama_model::load_hparams` reads the keys every architecture has (`<arch>.embedding_length`, ...), then the
# architecture's own `load_arch_hparams`: for gemma3 the sliding window (`gemma3.attention.sliding_window`), the
# pattern (default 6: layers 5, 11, 17 are global), the SWA RoPE base (10 000, a llama_hparams default: the file
# does not say) and `f_attention_scale` = 1/√256.

# %%
keys = ["n_layer", "n_embd", "n_head", "n_head_kv", "n_embd_head_k", "n_ff", "n_vocab", "n_rot", "rope_type",
        "rope_freq_base_train", "n_swa", "rope_freq_base_train_swa", "f_attention_scale", "f_norm_rms_eps"]
rows = [[k] + [f"{v:.6g}" if isinstance(v := getattr(m.hparams, k), float) else v for m in models.values()]
        for k in keys]
rows.append(["global (full-attention) layers"] + [
    [il for il in range(m.hparams.n_layer) if not m.hparams.is_swa(il)] for m in models.values()])
display(table(rows, ["hparam"] + list(models)))

# %% [markdown]
# *Read the code:* ggviz.llama.model.load_hparams, ggviz.llama.models.llama.load_arch_hparams, ggviz.llama.models.gemma3.load_arch_hparams ↔ llama-model.cpp llama_model_base::load_hparams; models/llama.cpp llama_model_llama::load_arch_hparams; models/gemma3.cpp llama_model_gemma3::load_arch_hparams

# %% [markdown]
# ## 2. One real decode each, and one layer of each graph
#
# Both models get the prompt "The ggml library is", each through its own tokenizer: SmolLM2's byte-level BPE (a
# merge list, by rank) and Gemma's SentencePiece (no merge list: the adjacent pair whose merged text is the token of
# highest score goes first). The ids are the ones llama.cpp gives (`tests/test_vocab_spm.py`). All but the last token
# are decoded in one batch, then the last token alone: the graph of that decode step is the one llama.cpp computes
# node for node (1086 nodes for SmolLM2, 817 for Gemma-3; `tests/test_llama.py`, `tests/test_gemma3.py`) -- with flash
# attention off, as set below; llama.cpp's default, on, builds 936 and 727 (one FLASH_ATTN_EXT per layer).

# %%
prompt = "The ggml library is"
for name, m in models.items():
    v = MV.BPEView(m.vocab, prompt)
    word = next(k for k, u in enumerate(v.units) if not u.special)
    print(f"{name}: {m.vocab.type} tokenizer")
    display(HTML(v.select(word).to_html()))


def decode_step(model, ids):
    cp = llama.context_default_params()
    cp.n_ctx = 1024
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama.init_from_model(model, cp)
    with capture.capture_inputs(ctx) as snaps:       # the graph inputs and KV cells of each ubatch, before its compute
        assert llama.decode(ctx, llama.batch_get_one(ids[:-1])) == 0
        assert llama.decode(ctx, llama.batch_get_one(ids[-1:])) == 0
    ctx.snapshots = snaps
    return ctx


runs = {}
for name, m in models.items():
    ids = llama.tokenize(m.vocab, prompt, add_special=True, parse_special=True)
    runs[name] = (m, ids, decode_step(m, ids))
    g = runs[name][2].last_graph
    print(f"{name}: prompt ids {ids}, decode graph of {len(g.gf.nodes)} nodes, "
          f"next token {int(np.argmax(llama.get_logits_ith(runs[name][2], -1)))}")


def layer_nodes(gf, il):
    """The nodes from layer il's first norm to its l_out (views and unnamed nodes included)."""
    nodes = list(gf.nodes)
    i0 = next(i for i, t in enumerate(nodes) if t.name == f"norm-{il}")
    i1 = next(i for i, t in enumerate(nodes) if t.name == f"l_out-{il}")
    return nodes[i0:i1 + 1]


GEMMA_ONLY = ("Qcur_normed", "Kcur_normed", "attn_post_norm", "ffn_post_norm", "ffn_geglu")
cols = []
for name, (m, ids, ctx) in runs.items():
    cols.append([(ggml.op_desc(t), t.name, list(t.shape)[:3])
                 for t in layer_nodes(ctx.last_graph.gf, 1)])
n = max(len(c) for c in cols)
rows = []
for i in range(n):
    r = [i]
    for c in cols:
        if i < len(c):
            op, nm, ne = c[i]
            mark = "<b>" if (op in ("SCALE", "GEGLU") or nm.startswith(GEMMA_ONLY)) else ""
            r.append(f"{mark}{op} <code>{nm}</code> {ne}{'</b>' if mark else ''}")
        else:
            r.append("")
    rows.append(r)
print("layer 1, node by node (bold: what Gemma-3 adds or does differently)")
display(table(rows, ["#"] + list(runs)))

# %% [markdown]
# The same layer drawn as graphs, SmolLM2's above Gemma's (`ggml_graph_view` of layer 1's nodes, as the scheduler
# cuts a split; dashed: the weights, the KV cache and the inputs, from outside the view). Read Gemma's from the top:
# `attn_norm`, then Q and K each get their own RMS_NORM + MUL (`Qcur_normed`, `Kcur_normed`) before ROPE; after the
# attention output's MUL_MAT comes `attn_post_norm`; the FFN's GEGLU; and `ffn_post_norm` before the second ADD. The
# SOFT_MAX of layer 1 reads the *sliding-window* mask (layer 1 is a SWA layer); layers 5, 11 and 17 read the other.

# %%
svgs = []
for name, (m, ids, ctx) in runs.items():
    gf = ctx.last_graph.gf
    nodes = layer_nodes(gf, 1)
    i0 = next(i for i, t in enumerate(gf.nodes) if t is nodes[0])
    dot, _ = graph_to_dot_grouped(ggml.graph_view(gf, i0, i0 + len(nodes)), title=f"{name}: layer 1",
                                  legend=False)
    svg = dot.pipe(format="svg").decode("utf-8")
    # one above the other, each at its own size in a box that scrolls: shrunk to the page's width, Graphviz's
    # ~1700-point-wide layouts printed their labels at 4 px; at full size the smallest is 8 pt (10.7 px). A printed
    # page shows the box's top, moved sideways (the book's print.css, --ggv-print-shift) to the layer's first node
    svg = svg[svg.find("<svg"):].replace("<svg ", "<svg style='max-width:none;height:auto' ", 1)
    x0 = float(re.search(r'x="([-\d.]+)"[^>]*>#0</text>', svg).group(1)) * 4 / 3    # points -> CSS px
    svgs.append(f"<div class='ggv-print-shift' style='--ggv-print-shift:{max(0, x0 - 400):.0f}px;max-width:100%;"
                f"max-height:620px;overflow:auto;border:1px solid #ddd'>{svg}</div>")
display(HTML("<p><i>Each graph at full size: scroll its box to follow the layer (a printed page shows the top of "
             "each, where the layer starts).</i></p>" + "".join(svgs)))

# %% [markdown]
# The ops per layer, counted: Gemma-3's layer has four more RMS_NORM + MUL pairs (QK norm, the two post-norms),
# one SCALE (Q by 1/√256) and GEGLU in SWIGLU's place; the KV-cache part (VIEW, SET_ROWS, PERMUTE, the two attention
# MUL_MATs, SOFT_MAX, CONT) is the same machinery in both.

# %%
fig, ax = plt.subplots(figsize=(10, 3.2))
ops = sorted({op for c in cols for op, _, _ in c})
w = 0.8 / len(cols)
for j, (name, c) in enumerate(zip(runs, cols)):
    cnt = [sum(1 for op, _, _ in c if op == o) for o in ops]
    ax.bar(np.arange(len(ops)) + j * w, cnt, w, label=name)
ax.set_xticks(np.arange(len(ops)) + w * (len(cols) - 1) / 2, ops, rotation=45, ha="right")
ax.set_ylabel("nodes in layer 1")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# *Read the code:* ggviz.llama.models.llama.LlamaGraph.build, ggviz.llama.models.gemma3.Gemma3Graph.build, ggviz.ggml.graph.graph_view ↔ models/llama.cpp llama_model_llama::build_arch_graph; models/gemma3.cpp llama_model_gemma3::build_arch_graph; ggml.c ggml_graph_view

# %% [markdown]
# ## 3. Where the sliding window sits: two caches, two masks
#
# `llama_model::create_memory` gives Gemma-3 an iSWA cache (`ggviz/llama/kv_cache_iswa.py`): a **base** cache
# holding the K/V of the 3 global layers, and a **SWA** cache for the 15 sliding-window layers. (llama.cpp's default
# `swa_full = true` makes the SWA cache as big as the base one; with `swa_full = false` it would be n_swa + n_ubatch
# cells, and reuse the cells its window has left behind.) Each cache has its own cells, its own n_kv and its own
# mask: the graph gets two `attn_inp_kq_mask` inputs, and each layer's SOFT_MAX reads the one of its cache.
#
# The masks of a long sequence, without computing anything: place positions 0..639 of one sequence in both caches
# (the bookkeeping `llama_decode` does before a compute), then ask each cache for the mask of the last 64 tokens.

# %%
if gemma is None:
    print("Gemma-3 absent: no iSWA cache to show.")
else:
    cp = llama.context_default_params()
    cp.n_ctx = 1024
    cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    demo = llama.init_from_model(gemma, cp)
    kv = demo.kv
    n = 640
    slot = kv.prepare([(list(range(n)), [0] * n)])[0]
    kv.apply_ubatch(slot, list(range(n)), [0] * n)
    q = list(range(n - 64, n))
    n_base, n_swa = kv.get_n_kv()
    m_base = kv.kv_base.kq_mask_data(n_base, q, [0] * 64)
    m_swa = kv.kv_swa.kq_mask_data(n_swa, q, [0] * 64)
    fig, axs = plt.subplots(2, 1, figsize=(10, 3.6), sharex=True)
    for ax, mk, title in ((axs[0], m_base, f"base cache (layers 5, 11, 17): n_kv = {n_base}"),
                          (axs[1], m_swa, f"SWA cache (the other 15 layers): n_kv = {n_swa}, window {gemma.hparams.n_swa}")):
        ax.imshow(np.isfinite(mk), aspect="auto", cmap="Greens", interpolation="nearest",
                  extent=(0, mk.shape[1], q[-1] + 0.5, q[0] - 0.5))
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("token position")
    axs[1].set_xlabel("KV cell (green: attended)")
    plt.tight_layout()
    plt.show()
    p = n - 1
    print(f"position {p}: the base mask lets it see {int(np.isfinite(m_base[-1]).sum())} cells, "
          f"the SWA mask {int(np.isfinite(m_swa[-1]).sum())} (positions {p - gemma.hparams.n_swa + 1}..{p})")

# %%
if gemma is not None:
    pos = 300                        # a position of the 640 placed above: change it, predict, run this cell again
    n_seen = int(np.isfinite(kv.kv_swa.kq_mask_data(n_swa, [pos], [0])[-1]).sum())
    display(Exercise(f"Position {pos} of the same sequence: how many cells does the SWA mask let it attend "
                     f"(window n_swa = {gemma.hparams.n_swa})?", n_seen, unit="cells", kind="rerun",
                     explain=f"A cell at position p1 is masked when {pos} - p1 >= n_swa (LLAMA_SWA_TYPE_STANDARD) "
                             f"or p1 > {pos} (causal): it sees positions {max(0, pos - gemma.hparams.n_swa + 1)}"
                             f"..{pos}."))

# %% [markdown]
# And the real decode step of section 2, as `ggviz.viz.model_views.KVCacheView` draws it: for Gemma-3 both caches,
# each with its own cells, the cell the step wrote (red), its n_kv and its mask.

# %%
for name, (m, ids, ctx) in runs.items():
    print(name)
    display(HTML(MV.KVCacheView(ctx.snapshots, m.vocab).to_html()))

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
if gemma is not None:
    g_ids = runs["Gemma-3 270M (gemma3)"][1]
    display(Exercise("In this real decode Gemma-3's two masks attend the same cells, while the 640-position run above "
                     "made them differ. Why?",
                     "all positions are inside the sliding window", kind="why",
                     choices=["all positions are inside the sliding window", "the SWA cache is empty during a decode",
                              "swa_full = true makes the two masks identical"],
                     explain=f"The prompt has {len(g_ids)} tokens (positions 0..{len(g_ids) - 1}), far inside the "
                             f"{gemma.hparams.n_swa}-position window, so no position is old enough to be masked by "
                             "the window; swa_full only sets the SWA cache's size."))

# %% [markdown]
# *Read the code:* ggviz.llama.kv_cache_iswa.KVCacheISWA, ggviz.llama.kv_cache.KVCache.kq_mask_data ↔ llama-kv-cache-iswa.cpp llama_kv_cache_iswa::llama_kv_cache_iswa; llama-kv-cache.cpp llama_kv_cache::set_input_kq_mask

# %% [markdown]
# ## 4. What the caches hold after the real decode
#
# After the 6-token runs of section 2: SmolLM2 has one cache with 30 layers; Gemma-3 two, of 3 and 15 layers. K is
# F16 `[n_embd_k_gqa, kv_size]` per layer: 64 × 3 heads = 192 values per cell for SmolLM2, 256 × 1 head for Gemma.
# Below, K of the 6 cells in one layer of each cache (its values, not a picture of them: read from the buffers).

# %%
if gemma is not None:
    gb = runs["Gemma-3 270M (gemma3)"][2].kv.kv_base
    cell_bytes = sum(ggml.nbytes(t) for t in gb.k_l + gb.v_l) // gb.size
    display(Exercise(f"Gemma-3's base cache holds K and V (F16) of {len(gb.layer_ids)} layers, "
                     f"{gemma.hparams.n_head_kv} KV head of {gemma.hparams.n_embd_head_k} values each. How many bytes "
                     "does one cell take?", cell_bytes, unit="bytes",
                     explain=f"{len(gb.layer_ids)} layers × 2 (K and V) × {gemma.hparams.n_head_kv} × "
                             f"{gemma.hparams.n_embd_head_k} × 2 bytes = {cell_bytes}. The SWA cache's 15 layers "
                             "take five times as much per cell."))

# %%
rows = []
for name, (m, ids, ctx) in runs.items():
    kv = ctx.kv
    caches = [("base", kv.kv_base), ("SWA", kv.kv_swa)] if hasattr(kv, "kv_swa") else [("one", kv)]
    for label, c in caches:
        nbytes = sum(ggml.nbytes(t) for t in c.k_l + c.v_l)
        rows.append([name, label, len(c.layer_ids), c.size, int(c.cells.used), c.get_n_kv(),
                     f"{nbytes / 2**20:.1f} MiB"])
display(table(rows, ["model", "cache", "layers", "cells", "used", "n_kv", "K+V bytes"]))

fig, axs = plt.subplots(1, 3, figsize=(12, 2.6))
panels = [(runs[list(runs)[0]][2].kv, 0, "SmolLM2 layer 0")]
if gemma is not None:
    gk = runs[list(runs)[1]][2].kv
    panels += [(gk.kv_swa, 0, "Gemma layer 0 (SWA cache)"), (gk.kv_base, 5, "Gemma layer 5 (base cache)")]
for ax, (c, il, title) in zip(axs, panels):
    k = np.asarray(ggml.get_data(c.k_l[c.map_layer_ids[il]])).reshape(c.size, -1)[:6].astype(np.float32)
    im = ax.imshow(k, aspect="auto", cmap="RdBu_r", vmin=-np.abs(k).max(), vmax=np.abs(k).max(),
                   interpolation="nearest")
    fig.colorbar(im, ax=ax, label="K value (F16)")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("K channel")
    ax.set_ylabel("cell")
for ax in axs[len(panels):]:
    ax.axis("off")
plt.tight_layout()
plt.show()

# %% [markdown]
# *Read the code:* ggviz.llama.kv_cache.KVCache.get_n_kv, ggviz.llama.kv_cache.KVCache.get_k, ggviz.llama.kv_cache.KVCache.get_v ↔ llama-kv-cache.cpp llama_kv_cache::get_n_kv, llama_kv_cache::get_k, llama_kv_cache::get_v

# %% [markdown]
# ## 5. How big each part of each file is
#
# The bytes of each GGUF, by part and by quantization type. SmolLM2's file is Q4_1 with a Q8_0 embedding; Gemma-3's
# "Q4_K_M" mixes Q5_0 (Q, K, gate, up, most V), Q8_0 (the embedding, some V), Q4_K (the attention output, some
# down), Q6_K (the other down) and F32 norms -- and its 262 144-token embedding table (tied to the output) is more
# than two thirds of the file.

# %%
def part_of(name):
    if name.startswith("token_embd"):
        return "embedding / output"
    if "norm" in name:
        return "norms"
    if ".attn_" in name:
        return "attention"
    if ".ffn_" in name:
        return "FFN"
    return "other"


# one colour per quantization type in both panels, so the same type looks the same side by side
all_types = sorted({ggml.type_name(t.type) for m in models.values() for t in m.tensors.values()})
type_color = {ty: plt.cm.tab10(i % 10) for i, ty in enumerate(all_types)}
fig, axs = plt.subplots(1, len(models), figsize=(6 * len(models), 3.2), squeeze=False)
for ax, (name, m) in zip(axs[0], models.items()):
    by = {}
    for t in m.tensors.values():
        key = (part_of(t.name), ggml.type_name(t.type))
        by[key] = by.get(key, 0) + ggml.nbytes(t)
    parts = sorted({p for p, _ in by}, key=lambda p: -sum(v for (q, _), v in by.items() if q == p))
    types = sorted({ty for _, ty in by})
    left = np.zeros(len(parts))
    for ty in types:
        vals = np.array([by.get((p, ty), 0) / 2**20 for p in parts])
        ax.barh(parts, vals, left=left, label=ty, color=type_color[ty])
        left += vals
    ax.set_title(f"{name}: {m.size() / 2**20:.0f} MiB of tensors", fontsize=10)
    ax.set_xlabel("MiB")
    ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# *Read the code:* ggviz.ggml.tensor.nbytes, ggviz.llama.model.LlamaModel.size ↔ ggml.c ggml_nbytes; llama-model.cpp llama_model::size

# %% [markdown]
# ## 6. What to take away
#
# * The ggml machinery -- graph, allocator, scheduler, threadpool, KV cells, SET_ROWS into the cache, the two
#   attention MUL_MATs and SOFT_MAX -- is the same for both. An architecture is a recipe written with it
#   (`ggviz/llama/models/<arch>.py`, llama.cpp's `src/models/<arch>.cpp`).
# * Gemma-3's recipe adds normalization everywhere (input scale, QK norm, post-norms), a GELU gate, and a second KV
#   cache whose mask forgets everything more than 512 positions back on five layers of six -- the reason its memory
#   could stay small on long texts (with `swa_full = false`).

# %% [markdown]
# *Read the code:* ggviz.llama.models.llama.LlamaGraph.build, ggviz.llama.models.gemma3.Gemma3Graph.build ↔ models/llama.cpp llama_model_llama::build_arch_graph; models/gemma3.cpp llama_model_gemma3::build_arch_graph
