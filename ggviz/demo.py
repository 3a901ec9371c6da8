"""ggviz demo: the first transformer layer of SmolLM2-135M, for one token, built and run the ggml way.

    ggviz demo [--model PATH] [--out DIR] [--token TEXT|ID] [--pos N] [--threads N]

What it does, step by step (each step mirrors what llama.cpp does for a llama-architecture model):

1. open the GGUF file with ``gguf.GGUFReader`` and read the hyper-parameters (``llama.*`` keys);
2. create a *weights* context and copy into it ``token_embd.weight`` (Q8_0) and layer 0's tensors (Q4_1 matrices,
   F32 norms), byte for byte (llama.cpp keeps them in a backend buffer; here they live in a ggml_context arena);
3. create a *compute* context and build layer 0's graph as ``llm_build_llama`` does (names as in llama.cpp's
   ``cb()``): get_rows -> rms_norm * attn_norm -> Q/K/V mul_mats -> rope_ext (mode NORMAL, the llama rope type) ->
   attention over the one token (GQA: 9 query heads share 3 K/V heads) -> attn_output -> residual -> rms_norm *
   ffn_norm -> gate/up -> swiglu -> down -> residual;
4. plan it for 1 and 2 threads (``ggml_graph_plan``) and compute it (``ggml_graph_compute_with_ctx``);
5. write ``layer0.dot``/``layer0.svg`` (the DAG), ``arena.png``/``arena.txt`` (the contexts' memory) into ``--out``.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import pathlib
import sys
import time

import numpy as np

from . import ggml
from .ggml import consts as C

LAYER_WEIGHTS = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down"]


class Hparams:
    """The llama.* metadata of a GGUF file that layer 0 needs."""

    def __init__(self, reader):
        f = reader.fields

        def get(key, default=None):
            fld = f.get(key)
            return default if fld is None else fld.contents()

        arch = get("general.architecture")
        if arch != "llama":
            raise ValueError(f"this demo builds a llama-architecture layer; the model's architecture is {arch!r}")
        self.n_embd = int(get("llama.embedding_length"))
        self.n_head = int(get("llama.attention.head_count"))
        self.n_head_kv = int(get("llama.attention.head_count_kv", self.n_head))
        self.n_ff = int(get("llama.feed_forward_length"))
        self.n_layer = int(get("llama.block_count"))
        self.eps = float(get("llama.attention.layer_norm_rms_epsilon"))
        self.freq_base = float(get("llama.rope.freq_base", 10000.0))
        self.freq_scale = 1.0 / float(get("llama.rope.scaling.factor", 1.0) or 1.0)
        self.n_ctx_orig = int(get("llama.context_length"))
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(get("llama.rope.dimension_count", self.head_dim))
        self.rope_type = C.GGML_ROPE_TYPE_NORMAL       # llama.cpp: LLM_ARCH_LLAMA -> LLAMA_ROPE_TYPE_NORM (0)

    def __repr__(self):
        return ", ".join(f"{k}={v}" for k, v in vars(self).items())


def _find_token(reader, token) -> int:
    """A token id from an int-like string or the token's text (exact match in tokenizer.ggml.tokens)."""
    s = str(token)
    if s.lstrip("-").isdigit():
        return int(s)
    fld = reader.fields["tokenizer.ggml.tokens"]
    want = s.encode("utf-8")
    for i, di in enumerate(fld.data):
        if bytes(fld.parts[di]) == want:
            return i
    raise ValueError(f"token {s!r} is not in the vocabulary (try a number, e.g. --token 1)")


def _load_weights(reader, hp: Hparams):
    """A ggml context holding token_embd + layer 0, data copied from the GGUF memmap."""
    wanted = ["token_embd.weight"] + [f"blk.0.{n}.weight" for n in LAYER_WEIGHTS]
    src = {t.name: t for t in reader.tensors if t.name in wanted}
    missing = [n for n in wanted if n not in src]
    if missing:
        raise ValueError(f"the model lacks tensors {missing}")
    size = 0
    for n in wanted:
        size += ggml.tensor_overhead() + ggml.GGML_PAD(int(src[n].n_bytes), C.GGML_MEM_ALIGN)
    ctx_w = ggml.init(size)
    w = {}
    for n in wanted:
        rt = src[n]
        ne = [int(x) for x in rt.shape]
        t = ggml.new_tensor(ctx_w, int(rt.tensor_type), len(ne), ne)
        ggml.set_name(t, n)
        dst = ggml.get_data(t)
        raw = np.asarray(rt.data)          # a memmap slice: np.asarray keeps it zero-copy until the copy below
        if raw.nbytes != ggml.nbytes(t):
            raise ValueError(f"{n}: {raw.nbytes} bytes in the file, ggml expects {ggml.nbytes(t)}")
        dst.reshape(-1).view(np.uint8)[:] = raw.reshape(-1).view(np.uint8)
        w[n] = t
    return ctx_w, w


def build_layer0(ctx, w: dict, hp: Hparams, token: int, pos: int):
    """Layer 0 of llm_build_llama for one token, without a KV cache. Returns (gf, inputs, out)."""
    nt = 1                                                 # n_tokens
    inp_tokens = ggml.new_tensor_1d(ctx, C.GGML_TYPE_I32, nt)
    ggml.set_name(inp_tokens, "inp_tokens")
    ggml.set_input(inp_tokens)
    inp_pos = ggml.new_tensor_1d(ctx, C.GGML_TYPE_I32, nt)
    ggml.set_name(inp_pos, "inp_pos")
    ggml.set_input(inp_pos)
    kq_mask = ggml.new_tensor_2d(ctx, C.GGML_TYPE_F32, nt, nt)     # n_kv x n_tokens: the token sees itself
    ggml.set_name(kq_mask, "kq_mask")
    ggml.set_input(kq_mask)
    ggml.get_data(inp_tokens)[...] = token
    ggml.get_data(inp_pos)[...] = pos
    ggml.get_data(kq_mask)[...] = 0.0
    gf = ggml.new_graph(ctx)                               # llama.cpp creates the graph before building it

    def cb(t, name):
        return ggml.set_name(t, f"{name}-0")

    inpL = ggml.set_name(ggml.get_rows(ctx, w["token_embd.weight"], inp_tokens), "inp_embd")
    inpSA = inpL
    L = lambda n: w[f"blk.0.{n}.weight"]  # noqa: E731
    # attention norm: rms_norm then the learned scale (the CPU backend fuses the pair)
    cur = cb(ggml.rms_norm(ctx, inpL, hp.eps), "norm")
    cur = cb(ggml.mul(ctx, cur, L("attn_norm")), "attn_norm")
    # self-attention
    Qcur = cb(ggml.mul_mat(ctx, L("attn_q"), cur), "Qcur")
    Kcur = cb(ggml.mul_mat(ctx, L("attn_k"), cur), "Kcur")
    Vcur = cb(ggml.mul_mat(ctx, L("attn_v"), cur), "Vcur")
    Qcur = ggml.reshape_3d(ctx, Qcur, hp.head_dim, hp.n_head, nt)
    Kcur = ggml.reshape_3d(ctx, Kcur, hp.head_dim, hp.n_head_kv, nt)
    Vcur = ggml.reshape_3d(ctx, Vcur, hp.head_dim, hp.n_head_kv, nt)
    rope_args = (hp.n_rot, hp.rope_type, hp.n_ctx_orig, hp.freq_base, hp.freq_scale, 0.0, 1.0, 32.0, 1.0)
    Qcur = cb(ggml.rope_ext(ctx, Qcur, inp_pos, None, *rope_args), "Qcur")
    Kcur = cb(ggml.rope_ext(ctx, Kcur, inp_pos, None, *rope_args), "Kcur")
    # llama.cpp's build_attn expands Q, K, V first "so that they are not reordered": they become nodes in this order
    for t in (Qcur, Kcur, Vcur):
        ggml.build_forward_expand(gf, t)
    # build_attn_mha: heads become dim 2; kq = K^T Q per head, GQA by broadcasting K/V heads over Q heads
    q = ggml.permute(ctx, Qcur, 0, 2, 1, 3)
    k = ggml.permute(ctx, Kcur, 0, 2, 1, 3)
    v = ggml.permute(ctx, Vcur, 0, 2, 1, 3)
    kq = cb(ggml.mul_mat(ctx, k, q), "kq")
    kq = cb(ggml.soft_max_ext(ctx, kq, kq_mask, 1.0 / math.sqrt(hp.head_dim), 0.0), "kq_soft_max")
    v = ggml.cont(ctx, ggml.transpose(ctx, v))
    kqv = cb(ggml.mul_mat(ctx, v, kq), "kqv")
    cur = ggml.permute(ctx, kqv, 0, 2, 1, 3)
    cur = cb(ggml.cont_2d(ctx, cur, hp.head_dim * hp.n_head, nt), "kqv_out")
    cur = cb(ggml.mul_mat(ctx, L("attn_output"), cur), "attn_out")
    ffn_inp = cb(ggml.add(ctx, cur, inpSA), "ffn_inp")
    # feed-forward: SwiGLU
    cur = cb(ggml.rms_norm(ctx, ffn_inp, hp.eps), "norm")
    cur = cb(ggml.mul(ctx, cur, L("ffn_norm")), "ffn_norm")
    up = cb(ggml.mul_mat(ctx, L("ffn_up"), cur), "ffn_up")
    gate = cb(ggml.mul_mat(ctx, L("ffn_gate"), cur), "ffn_gate")
    cur = cb(ggml.swiglu_split(ctx, gate, up), "ffn_swiglu")
    cur = cb(ggml.mul_mat(ctx, L("ffn_down"), cur), "ffn_down")
    cur = cb(ggml.add(ctx, cur, ffn_inp), "ffn_out")
    out = cb(cur, "l_out")
    ggml.set_output(out)
    ggml.build_forward_expand(gf, out)
    return gf, {"inp_tokens": inp_tokens, "inp_pos": inp_pos, "kq_mask": kq_mask}, out


# ---------------------------------------------------------------- NumPy reference (float32, no ggml)

def _deq(t) -> np.ndarray:
    """Weights as float32 (rows, cols) via ggml's to_float."""
    return ggml.get_data_f32(t).reshape(int(t.ne[1]) if ggml.n_dims(t) > 1 else 1, int(t.ne[0]))


def reference_layer0(w: dict, hp: Hparams, token: int, pos: int) -> np.ndarray:
    """The same layer written as plain NumPy in float32 (no activation quantization): for checking."""
    f32 = np.float32
    L = lambda n: _deq(w[f"blk.0.{n}.weight"])  # noqa: E731
    from .ggml import quants
    emb = w["token_embd.weight"]
    x = quants.dequantize_row(emb.type, np.ascontiguousarray(ggml.get_data(emb)[0, 0, token]))

    def rms(v, g):
        return (v / np.sqrt(np.mean(v * v, dtype=f32) + f32(hp.eps))).astype(f32) * g.reshape(-1)

    def rope(m):                         # m: (heads, head_dim); NORMAL mode rotates pairs (2i, 2i+1)
        i = np.arange(hp.n_rot // 2, dtype=np.float64)
        theta = pos * hp.freq_scale * hp.freq_base ** (-2.0 * i / hp.n_rot)
        c, s = np.cos(theta).astype(f32), np.sin(theta).astype(f32)
        o = m.copy()
        x0, x1 = m[:, 0:hp.n_rot:2], m[:, 1:hp.n_rot:2]
        o[:, 0:hp.n_rot:2] = x0 * c - x1 * s
        o[:, 1:hp.n_rot:2] = x0 * s + x1 * c
        return o

    h = rms(x, L("attn_norm"))
    q = rope((L("attn_q") @ h).reshape(hp.n_head, hp.head_dim))
    k = rope((L("attn_k") @ h).reshape(hp.n_head_kv, hp.head_dim))
    v = (L("attn_v") @ h).reshape(hp.n_head_kv, hp.head_dim)
    grp = hp.n_head // hp.n_head_kv
    heads = []
    for hd in range(hp.n_head):
        kv = hd // grp                                   # ggml broadcasts K/V head (hd / grp) over query heads
        s = np.array([q[hd] @ k[kv]], dtype=f32) / f32(math.sqrt(hp.head_dim))
        p = np.exp(s - s.max())
        p /= p.sum()
        heads.append(p[0] * v[kv])
    att = L("attn_output") @ np.concatenate(heads).astype(f32)
    ffn_inp = att + x
    h2 = rms(ffn_inp, L("ffn_norm"))
    g, u = L("ffn_gate") @ h2, L("ffn_up") @ h2
    act = (g / (f32(1) + np.exp(-g))) * u
    return (L("ffn_down") @ act.astype(f32) + ffn_inp).astype(f32)


# ---------------------------------------------------------------- outputs

def _write_arena(out_dir: pathlib.Path, contexts):
    import matplotlib
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .viz import arena_map, objects_table, plot_arena

    fig, axes = plt.subplots(len(contexts), 1, figsize=(14, 3.4 * len(contexts)))
    for ax, (label, ctx, scale) in zip(np.atleast_1d(axes), contexts):
        plot_arena(ctx, ax=ax, scale=scale, max_labels=30,
                   title=f"{label}: used {ctx.used_mem():,} of {ctx.mem_size:,} bytes, {len(ctx.objects)} objects")
    fig.tight_layout()
    fig.savefig(out_dir / "arena.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    with open(out_dir / "arena.txt", "w", encoding="utf-8") as f:
        for label, ctx, _ in contexts:
            f.write(f"== {label}\n{objects_table(ctx).text(max_width=48)}\n\n")
        for label, ctx, _ in contexts:
            f.write(f"== {label}: regions\n{arena_map(ctx).text(max_width=60)}\n\n")


class DemoRun:
    """Everything one run produced (kept for notebooks and tests)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


@functools.lru_cache(maxsize=2)
def open_model(path: str):
    """gguf.GGUFReader(path), cached: parsing the metadata (49k tokenizer strings) is the slow part of the demo."""
    import gguf
    return gguf.GGUFReader(path)


def run(model, token="Hello", pos: int = 0, n_threads: int = 1) -> DemoRun:
    """Load token_embd + layer 0, build layer 0's graph for one token, plan it, compute it, check it."""
    reader = open_model(str(model))
    hp = Hparams(reader)
    tok = _find_token(reader, token)
    fld = reader.fields["tokenizer.ggml.tokens"]
    tok_text = bytes(fld.parts[fld.data[tok]]).decode("utf-8", "replace")
    ctx_w, w = _load_weights(reader, hp)
    ctx = ggml.init(8 * 1024 * 1024)
    gf, inputs, out = build_layer0(ctx, w, hp, tok, pos)
    used_before = ggml.used_mem(ctx)
    plans = {n: ggml.graph_plan(gf, n) for n in (1, 2)}
    t0 = time.perf_counter()
    status = ggml.graph_compute_with_ctx(ctx, gf, n_threads)
    t_compute = time.perf_counter() - t0
    y = ggml.get_data(out).reshape(-1).copy()
    ref = reference_layer0(w, hp, tok, pos)
    rel = float(np.linalg.norm(y - ref) / max(float(np.linalg.norm(ref)), 1e-30))
    return DemoRun(model=pathlib.Path(model), reader=reader, hp=hp, token=tok, token_text=tok_text, pos=pos,
                   n_threads=n_threads, ctx_w=ctx_w, weights=w, ctx=ctx, gf=gf, inputs=inputs, out=out,
                   used_before=used_before, plans=plans, status=status, t_compute=t_compute, y=y, ref=ref, rel=rel)


def write_outputs(r: DemoRun, out_dir) -> list:
    """layer0.dot, layer0.svg (if graphviz's dot is installed), arena.png, arena.txt; returns the paths written."""
    from .viz import graph_to_dot

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dot = graph_to_dot(r.gf, title=f"SmolLM2-135M layer 0, one token ({r.gf.n_nodes} nodes, {r.gf.n_leafs} leafs)")
    (out_dir / "layer0.dot").write_text(dot.source, encoding="utf-8")
    files = [out_dir / "layer0.dot"]
    try:
        (out_dir / "layer0.svg").write_bytes(dot.pipe(format="svg"))
        files.append(out_dir / "layer0.svg")
    except Exception as e:  # noqa: BLE001 - graphviz's `dot` program missing: keep going without the SVG
        print(f"ggviz demo: no layer0.svg ({type(e).__name__}: {e}); install graphviz's `dot`", file=sys.stderr)
    _write_arena(out_dir, [("compute context (ctx #2)", r.ctx, "sqrt"), ("weights context (ctx #1)", r.ctx_w, "log")])
    return files + [out_dir / "arena.png", out_dir / "arena.txt"]


def summary(r: DemoRun) -> str:
    hp, gf, out = r.hp, r.gf, r.out
    y = r.y
    return "\n".join([
        f"model     {r.model.name}: {hp.n_layer} layers, n_embd={hp.n_embd}, n_head={hp.n_head}, "
        f"n_head_kv={hp.n_head_kv}, head_dim={hp.head_dim}, n_ff={hp.n_ff}, rope base={hp.freq_base:g}",
        f"weights   ctx #1: {len(r.weights)} tensors (token_embd "
        f"{ggml.type_name(r.weights['token_embd.weight'].type)}, layer 0 q4_1/f32), "
        f"used_mem={ggml.used_mem(r.ctx_w):,} bytes",
        f"input     token {r.token} ({r.token_text!r}) at position {r.pos}",
        f"graph     n_nodes={gf.n_nodes}  n_leafs={gf.n_leafs}  (ggml_build_forward_expand, last node {out.name!r})",
        f"memory    compute ctx #2: used_mem={r.used_before:,} bytes after building (tensors + the graph object, "
        f"ggml_graph_overhead()={ggml.graph_overhead():,}), {ggml.used_mem(r.ctx):,} after computing "
        f"(+ the work buffer object)",
        f"plan      work_size={r.plans[1].work_size:,} bytes for 1 thread, {r.plans[2].work_size:,} for 2 "
        f"(mul_mat converts its F32 input to q8_1 blocks there, + one 64-byte cache line per thread)",
        f"compute   ggml_graph_compute_with_ctx, {r.n_threads} thread(s): {r.t_compute * 1e3:.1f} ms",
        f"output    {out.name!r} {ggml.type_name(out.type)} ne={list(out.shape)}: |y| = {np.linalg.norm(y):.4f}, "
        f"y[:4] = {np.array2string(y[:4], precision=4)}",
        f"note      one token attends only to itself: softmax over a single score is 1, so kqv = V for every head "
        f"(rope rotates Q and K, but cannot change that)",
        f"check     vs a float32 NumPy version of the layer: relative error {r.rel:.2e} "
        f"(expected ~1e-2: ggml quantizes the activations to q8 inside mul_mat)",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ggviz demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF file (default: the default model, fetched if needed)")
    ap.add_argument("--out", default="out", help="output folder (default: ./out)")
    ap.add_argument("--token", default="Hello", help="the input token: its text or its id (default: Hello)")
    ap.add_argument("--pos", type=int, default=0, help="the token's position (default 0: the first token)")
    ap.add_argument("--threads", type=int, default=1, help="threads for graph_compute_with_ctx (default 1)")
    ap.add_argument("--quiet", action="store_true", help="print only the file list")
    ap.add_argument("-p", "--prompt", default="The ggml library is",
                    help="prompt for the real generation that ends the demo")
    ap.add_argument("-n", "--n-predict", type=int, default=24, help="tokens to generate (0: skip generation)")
    ap.add_argument("--no-report", action="store_true",
                    help="do not write report.html (the HTML walkthrough of one decode step, `ggviz report`)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    t_start = time.perf_counter()

    if args.model:
        model = pathlib.Path(args.model)
    else:
        from .fetch import FetchError, fetch_default_model
        try:
            model = fetch_default_model()
        except FetchError as e:
            print(f"ggviz demo: cannot get the default model: {e}", file=sys.stderr)
            return 1
    try:
        r = run(model, args.token, args.pos, args.threads)
    except (ValueError, OSError) as e:
        print(f"ggviz demo: {e}", file=sys.stderr)
        return 1
    if r.status != C.GGML_STATUS_SUCCESS:
        print(f"ggviz demo: graph_compute returned status {r.status}", file=sys.stderr)
        return 1
    files = write_outputs(r, args.out)
    if not args.quiet:
        print(summary(r))
        print(f"time      {time.perf_counter() - t_start:.1f} s in all")
        print("files")
    for p in files:
        print(f"  {os.path.relpath(p)}")
    if args.n_predict > 0:
        # the real thing: llama.cpp's decode path on the whole model (ggviz.llama), token by token
        from .run import generate, load_model
        print(f"\ngenerate  {args.n_predict} tokens with the full model (greedy, {max(args.threads, 2)} threads):")
        sys.stdout.write(args.prompt)
        sys.stdout.flush()
        lm = load_model(str(model))

        def out(piece):
            sys.stdout.write(piece)
            sys.stdout.flush()

        g = generate(args.prompt, args.n_predict, model=lm, threads=max(args.threads, 2), n_ctx=512, stream=out)
        g.t_load_ms += lm.t_load_us / 1e3
        print("\n")
        print(g.timings())
    if not args.no_report:
        # the walkthrough of one decode step of the full model, as a standalone page (ggviz/report.py)
        from .report import write_report
        from .run import load_model
        path = write_report(pathlib.Path(args.out) / "report.html", args.prompt, max(args.threads, 2),
                            load_model(str(model)))
        print(f"\nreport    {os.path.relpath(path)}: one decode step, section by section (open it in a browser)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
