"""ggviz demo: a real llama.cpp decode of SmolLM2-135M (or Gemma-3 270M: ``--model gemma3-270m``), with layer 0 copied out node by node, then a generation.

    ggviz demo [--model PATH] [--out DIR] [-p PROMPT] [-n N] [--threads N] [--quiet] [--no-report]

What it does, step by step -- the llama.h calls a llama.cpp program makes (``ggviz.llama`` mirrors them):

1. ``llama_model_load_from_file``: the GGUF file's metadata, vocabulary and weights (a ``no_alloc`` context of tensor
   headers; the data stays in the memory-mapped file, the matrices repacked into the CPU_REPACK buffer type);
2. ``llama_init_from_model`` with an eval callback (``cb_eval``, as ``llama-eval-callback`` installs one): the KV
   cache, the backends, and the worst-case compute buffer (``sched_reserve``);
3. ``llama_tokenize`` the prompt and ``llama_decode`` it: ``llm_build_llama`` builds the decode graph (1086 nodes;
   ``llm_build_gemma3`` for Gemma-3) -- with flash attention off, so that layer 0's attention weights are a tensor
   to copy (llama.cpp's default, flash attention on, builds 936 nodes: one FLASH_ATTN_EXT per layer),
   the scheduler allocates and computes it; the callback asks for layer 0's nodes, so the scheduler stops after
   each of them and the callback copies its values out (the compute buffer is reused by later nodes);
4. write ``layer0.dot``/``layer0.svg``: layer 0's nodes of that graph (``ggml_graph_view``, as the scheduler cuts its
   splits), drawn by ``ggviz.viz.graph_dot``;
5. write ``arena.png``/``arena.txt``: the ggml contexts behind the run (the graph's, the weights', the KV cache's);
6. generate ``-n`` tokens as llama.cpp's default run does (``ggviz.run.generate`` in a new context with the default
   params, flash attention on: decode, greedy sample, decode ...);
7. write ``report.html``: one decode step, section by section (``ggviz.tools.report``).

``run()`` does steps 1-3 and returns a ``DemoRun`` (what notebooks and tests read), ``write_outputs()`` steps 4-5.
``tests/test_demo.py`` checks the captured layer-0 values against an independent NumPy computation of the layer.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import time

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from .. import cli, ggml, llama
from ..capture import EvalCallback, copy_raw, layer_of
from ..fetch import FetchError, fetch_default_model
from ..progress import progress, step
from .report import graph_builder, kv_caches, write_report
from ..run import generate, load_model
from ..viz import arena_map, objects_table, plot_arena
from ..viz.graph_dot import graph_to_dot_grouped

DEFAULT_PROMPT = "The ggml library is"
STEPS = ("load the model", "create the context", "decode the prompt", "layer-0 graph", "arena files")


class DemoRun:
    """Everything one run produced (kept for notebooks and tests).

    ``model``, ``ctx`` (the llama context), ``prompt``, ``ids`` (its tokens), ``graph`` (the decode's
    ``GraphResult``: ``graph.gf`` is the cgraph), ``layer0_range`` (first node, one past the last), ``view`` (the
    ``ggml_graph_view`` of layer 0), ``values`` (what the eval callback copied, in compute order: dicts with
    node_n, name, op, type, shape, data: a copy, shaped as ``ggml.get_data`` gives it), ``status`` (llama_decode's return) and timings ``t_load_ms``, ``t_ctx_ms``, ``t_decode_ms``."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def value(self, name: str, op: str | None = None) -> np.ndarray:
        """The data of the last captured node called ``name`` (and of op ``op``, e.g. "MUL_MAT"), ggml's shape
        reversed as ``ggml.get_data`` gives it: ``value("Qcur-0")`` is the roped Q, ``value("Qcur-0", "MUL_MAT")``
        the product before the reshape."""
        for v in reversed(self.values):
            if v["name"] == name and (op is None or v["op"] == op):
                return v["data"]
        raise KeyError(f"no captured node {name!r}" + (f" with op {op}" if op else ""))


def _step(bar, what):
    if bar is None:
        return contextlib.nullcontext()
    return step(bar, what)


def run(model=None, prompt: str = DEFAULT_PROMPT, n_threads: int = 2, n_predict: int = 0, bar=None) -> DemoRun:
    """Steps 1-3: load the model (``model``: a GGUF path, a loaded model, or None for the default one), create a
    context with a layer-0 eval callback (room for the prompt and ``n_predict`` more tokens), decode ``prompt`` once.
    ``bar``: a ``ggviz.progress`` bar to step."""

    with _step(bar, STEPS[0]):
        t0 = time.perf_counter()
        # llama_model_load_from_file, cached per path (the report and the generation use the same model)
        if model is None or isinstance(model, (str, os.PathLike)):
            model = load_model(None if model is None else str(model))
        t_load = (time.perf_counter() - t0) * 1e3
        ids = llama.tokenize(llama.model_get_vocab(model), prompt, add_special=True, parse_special=True)
        if not ids:
            raise ValueError("the prompt tokenized to zero tokens")

    # llama.cpp's eval callback: asked once per node whether it wants the node's data; for the nodes it wants (layer
    # 0's and the embeddings), the scheduler computes the graph up to there and calls it again with the data
    cb_eval = EvalCallback(lambda t: layer_of(t.name or "") == 0 or t.name == "embd", copy=copy_raw)

    with _step(bar, STEPS[1]):
        t0 = time.perf_counter()
        cp = llama.context_default_params()
        cp.n_ctx = len(ids) + n_predict          # llama_init_from_model pads it to 256 cells
        cp.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED   # the attention weights (kq_soft_max) are shown
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.cb_eval = cb_eval
        ctx = llama.init_from_model(model, cp)
        t_ctx = (time.perf_counter() - t0) * 1e3

    with _step(bar, STEPS[2]):
        t0 = time.perf_counter()
        status = llama.decode(ctx, llama.batch_get_one(ids))
        t_decode = (time.perf_counter() - t0) * 1e3
    # later decodes (the generation) run without the callback: with one installed, even one that asks for nothing,
    # the scheduler computes each split as graph views, off the fast path's compiled graphs. ggviz's context reads
    # cparams.cb_eval at every compute (llama.cpp fixes it when the context is created)
    ctx.cparams.cb_eval = None
    if status != 0:
        raise RuntimeError(f"llama_decode failed on the prompt (status {status})")
    res = ctx.last_graph
    gf = res.gf
    values = [v.as_dict() for v in cb_eval.number(gf)]
    l0 = [i for i, t in enumerate(gf.nodes) if layer_of(t.name or "") == 0]
    i0, i1 = l0[0], l0[-1] + 1             # llm_build_llama / llm_build_gemma3 emit a layer's nodes together
    return DemoRun(model=model, ctx=ctx, prompt=prompt, ids=list(ids), n_threads=n_threads, graph=res,
                   layer0_range=(i0, i1), view=ggml.graph_view(gf, i0, i1), values=values, status=status,
                   t_load_ms=t_load, t_ctx_ms=t_ctx, t_decode_ms=t_decode)


# ---------------------------------------------------------------- outputs

def _contexts(r: DemoRun) -> list:
    """(label, ggml context, plot scale) of the contexts behind the run."""
    return [(f"decode graph context ({r.graph.gf.n_nodes} nodes: tensor headers + the ggml_cgraph)", r.graph.ctx,
             "sqrt"),
            (f"weights context ({len(r.model.tensors)} tensor headers)", r.model.ctx_w, "log"),
            *[(f"{label + ' ' if label else ''}KV cache context ({c.size} cells x {len(c.layer_ids)} layers)", c.ctx,
               "log") for label, c in kv_caches(r.ctx.kv)]]


def _write_arena(out_dir: pathlib.Path, r: DemoRun):
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")


    contexts = _contexts(r)
    fig, axes = plt.subplots(len(contexts), 1, figsize=(14, 3.4 * len(contexts)))
    for ax, (label, ctx, scale) in zip(np.atleast_1d(axes), contexts):
        plot_arena(ctx, ax=ax, scale=scale, max_labels=30,
                   title=f"{label}: used {ctx.used_mem():,} of {ctx.mem_size:,} bytes, {len(ctx.objects)} objects")
    fig.tight_layout()
    fig.savefig(out_dir / "arena.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    # the graph context holds ~1100 objects, created in build order: its tables stop after layer 0's last tensor
    gctx = r.graph.ctx
    l_out = r.graph.gf.nodes[r.layer0_range[1] - 1]
    last = next((i for i, o in enumerate(gctx.objects) if o.payload is l_out), len(gctx.objects) - 1)

    def cut(table, key):
        if table is None or len(gctx.objects) - 1 == last:
            return table, ""
        rest = len(gctx.objects) - 1 - last
        return (table.filter(lambda row: row[key] is not None and row[key] <= last),
                f"... {rest} more objects: layers 1-{r.model.hparams.n_layer - 1} and the output head, built the same "
                f"way\n")

    with open(out_dir / "arena.txt", "w", encoding="utf-8") as f:
        for label, ctx, _ in contexts:
            tab, more = cut(objects_table(ctx), "#") if ctx is gctx else (objects_table(ctx), "")
            f.write(f"== {label}\n{tab.text(max_width=48)}\n{more}\n")
        for label, ctx, _ in contexts:
            tab, more = cut(arena_map(ctx), "obj") if ctx is gctx else (arena_map(ctx), "")
            f.write(f"== {label}: regions\n{tab.text(max_width=60)}\n{more}\n")


def write_outputs(r: DemoRun, out_dir, bar=None) -> list:
    """Steps 4-5: layer0.dot, layer0.svg (if graphviz's dot is installed), arena.png, arena.txt; returns the paths
    written."""

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    with _step(bar, STEPS[3]):
        i0, i1 = r.layer0_range
        title = (f"layer 0 of the decode graph of {len(r.ids)} tokens: nodes #{i0}-#{i1 - 1} of {r.graph.gf.n_nodes} "
                 f"(ggml_graph_view, numbered from 0 here); dashed: tensors from outside the view "
                 f"(weights, inputs, KV cache)")
        dot, _ = graph_to_dot_grouped(r.view, title=title, legend=True)
        (out_dir / "layer0.dot").write_text(dot.source, encoding="utf-8")
        files.append(out_dir / "layer0.dot")
        try:
            (out_dir / "layer0.svg").write_bytes(dot.pipe(format="svg"))
            files.append(out_dir / "layer0.svg")
        except Exception as e:  # noqa: BLE001 - graphviz's `dot` program missing: keep going without the SVG
            print(f"ggviz demo: no layer0.svg ({type(e).__name__}: {e}); install graphviz's `dot`", file=sys.stderr)
    with _step(bar, STEPS[4]):
        _write_arena(out_dir, r)
    return files + [out_dir / "arena.png", out_dir / "arena.txt"]


def summary(r: DemoRun) -> str:
    hp, gf = r.model.hparams, r.graph.gf
    vocab = llama.model_get_vocab(r.model)
    pieces = [llama.token_to_piece(vocab, t, 0, True).decode("utf-8", "replace") for t in r.ids]
    i0, i1 = r.layer0_range
    y = r.value("l_out-0")[..., -1, :].reshape(-1)               # the last token's row
    # the last token's attention in layer 0 (kq_soft_max: [n_kv, n_tokens, n_head]), averaged over the heads
    att = r.value("kq_soft_max-0").reshape(hp.n_head, len(r.ids), -1)[:, -1, :len(r.ids)].mean(0)
    top = np.argsort(-att)[:3]
    plans = {n: ggml.graph_plan(r.view, n).work_size for n in sorted({1, r.n_threads})}
    cbuf = r.ctx.compute_buffer_log().splitlines()
    return "\n".join([
        f"model     {os.path.basename(r.model.path)} ({llama.model_desc(r.model)}, "
        f"{llama.model_n_params(r.model) / 1e6:.0f}M params, {llama.model_size(r.model) / 2**20:.1f} MiB): "
        f"{hp.n_layer} layers, n_embd={hp.n_embd}, n_head={hp.n_head}, n_head_kv={hp.n_head_kv}, "
        f"head_dim={hp.n_embd_head_k}, n_ff={hp.n_ff}, rope base={hp.rope_freq_base_train:g}"
        + (f" (sliding-window layers: {hp.rope_freq_base_train_swa:g}, window {hp.n_swa})" if hp.n_swa else "") + "; "
        f"llama_model_load_from_file {r.t_load_ms:.0f} ms",
        f"weights   a no_alloc context of {len(r.model.tensors)} tensor headers "
        f"(used_mem={ggml.used_mem(r.model.ctx_w):,} bytes); the data stays in the mapped file"
        + (", the matrices repacked for the CPU (CPU_REPACK)" if len(r.model.bufs) > 1 else ""),
        f"context   llama_init_from_model {r.t_ctx_ms:.0f} ms: "
        + " + ".join(f"{label + ' ' if label else ''}KV cache of {c.size} cells x {len(c.layer_ids)} layers"
                     + (f" (window {c.n_swa})" if c.n_swa else "") for label, c in kv_caches(r.ctx.kv))
        + f" ({ggml.type_name(kv_caches(r.ctx.kv)[0][1].type_k)}), {cbuf[0].split(': ', 1)[-1].strip() if cbuf else ''}",
        f"input     {len(r.ids)} tokens {r.ids}: " + " ".join(repr(p) for p in pieces),
        f"graph     {graph_builder(r.model)}: n_nodes={gf.n_nodes} n_leafs={gf.n_leafs}; layer 0 is nodes #{i0}-#{i1 - 1} "
        f"({i1 - i0} nodes, last {gf.nodes[i1 - 1].name!r}); flash attention off here to show the attention "
        f"weights, not llama.cpp's default (on: one FLASH_ATTN_EXT per layer)",
        f"memory    graph context: used_mem={ggml.used_mem(r.graph.ctx):,} bytes (tensor headers + the graph object, "
        f"no data: the tensors live in the compute buffer, placed by ggml-alloc)",
        "plan      ggml_graph_plan of layer 0: work_size "
        + ", ".join(f"{w:,} bytes for {n} thread{'s' if n > 1 else ''}" for n, w in plans.items())
        + " (mul_mat converts its F32 input to q8 blocks there)",
        f"compute   llama_decode, {r.n_threads} thread(s): {r.t_decode_ms:.0f} ms, stopping after each of the "
        f"{len(r.values)} nodes the eval callback asked for (embd and layer 0) to hand it their values",
        f"output    'l_out-0' (the residual stream after layer 0), last token: |y| = {np.linalg.norm(y):.4f}, "
        f"y[:4] = {np.array2string(y[:4], precision=4)}",
        f"attention layer 0, last token {pieces[-1]!r} (mean over {hp.n_head} heads): "
        + ", ".join(f"{pieces[j]!r} {att[j]:.2f}" for j in top),
    ])


def main(argv=None) -> int:

    ap = cli.ArgumentParser(prog="ggviz demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", type=cli.model_file, help=cli.MODEL_HELP)
    ap.add_argument("--out", default="out", type=cli.output_dir, help="output folder (default: ./out)")
    ap.add_argument("-p", "--prompt", default=DEFAULT_PROMPT,
                    help="the prompt: decoded with layer 0 captured, then continued by the generation")
    ap.add_argument("-n", "--n-predict", type=cli.int_arg(0), default=24,
                    help="tokens to generate (0: skip generation)")
    ap.add_argument("--threads", type=cli.thread_count, default=2, help="threads for llama_decode (default 2)")
    ap.add_argument("--quiet", action="store_true", help="print only the file list (and no progress bar)")
    ap.add_argument("--no-report", action="store_true",
                    help="do not write report.html (the HTML walkthrough of one decode step, `ggviz report`)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    t_start = time.perf_counter()

    if args.model:
        model = pathlib.Path(args.model)
    else:
        try:
            model = fetch_default_model(quiet=args.quiet)
        except FetchError as e:
            print(f"ggviz demo: cannot get the default model: {e}", file=sys.stderr)
            return 1
    bar = progress(total=len(STEPS), desc="ggviz demo", unit="step", disable=True if args.quiet else None,
                   leave=False)
    try:
        with bar:
            r = run(model, args.prompt, args.threads, n_predict=args.n_predict, bar=bar)
            files = write_outputs(r, args.out, bar=bar)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"ggviz demo: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(summary(r))
        print(f"time      {time.perf_counter() - t_start:.1f} s in all")
        print("files")
    for p in files:
        print(f"  {os.path.relpath(p)}")
    threads = args.threads
    if args.n_predict > 0:
        # the generation as llama.cpp's default run makes it: a new context with the default params (flash attention
        # on; the one above had it off to copy the attention weights), the prompt, then one token at a time
        print(f"\ngenerate  {args.n_predict} tokens with the full model (greedy, {threads} threads):")
        sys.stdout.write(args.prompt)
        sys.stdout.flush()

        def out(piece):
            sys.stdout.write(piece)
            sys.stdout.flush()

        g = generate(args.prompt, args.n_predict, model=r.model, threads=threads,
                     n_ctx=len(r.ids) + args.n_predict, stream=out)
        g.t_load_ms += r.model.t_load_us / 1e3
        print("\n")
        print(g.timings())
    if not args.no_report:
        # the walkthrough of one decode step of the full model, as a standalone page (ggviz/tools/report.py)
        path = write_report(pathlib.Path(args.out) / "report.html", args.prompt, threads, r.model,
                            disable_progress=True if args.quiet else None)
        print(f"\nreport    {os.path.relpath(path)}: one decode step, section by section (open it in a browser)")
    return 0


if __name__ == "__main__":
    sys.exit(cli.command_main("demo"))
