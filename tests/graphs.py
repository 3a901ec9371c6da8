"""Graph builders written once against the shared ggml API, for differential tests.

Every ``build_*(G, ctx) -> dict`` builds the same graph in either engine:

* ``G`` is the ``ggviz.ggml`` module, or a ``tests.oracle.ggml_lib.RealGGML`` instance (the real ggml via
  ctypes).  Both spell ggml.h without the ``ggml_`` prefix (``G.new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)``,
  ``G.mul_mat(ctx, a, b)``, ``G.build_forward_expand(gf, t)`` ...).  Tensors are ``ggviz.ggml.Tensor`` objects in
  one engine and plain addresses (ints) in the other, so builders only pass them back to ``G``; the few shape
  reads go through :func:`ne` / :func:`nb`.
* The returned dict holds ``gf`` (the graph, already expanded), ``out`` (the final tensor), ``inputs`` (name ->
  the exact values the ``set_input`` leaves must get: token ids, positions, KV-cache indices, the causal mask) and
  ``tensors`` (name -> tensor, for the ones a test wants to look at).

:func:`fill_leaves` then writes every leaf of the graph with the same deterministic data in either engine
(quantized weights: quantized by the engine's own quantizer, or written as the given raw bytes).

The engine-neutral readers (:func:`graph_nodes`, :func:`graph_leafs`, :func:`tensor_info`, :func:`to_float`,
:func:`raw_bytes`) let a test walk both graphs in lock step.
"""
from __future__ import annotations

import math
import zlib

import numpy as np

__all__ = ["BUILDERS", "build_simple_add", "build_q4_0_mul_mat", "build_permute_chain", "build_noop_heavy",
           "build_llama_block", "LlamaHParams", "fill_leaves", "leaf_values", "is_oracle", "ne", "nb",
           "graph_nodes", "graph_leafs", "tensor_info", "to_float", "raw_bytes", "arena_base", "tensor_name",
           "set_values"]


# ====================================================================================================
# engine-neutral helpers
# ====================================================================================================

def is_oracle(G) -> bool:
    """True for a RealGGML instance, False for the ggviz.ggml module."""
    return hasattr(G, "tensor_info")


def ne(G, t) -> tuple:
    return tuple(int(x) for x in G.tensor_info(t)["ne"]) if is_oracle(G) else t.shape


def nb(G, t) -> tuple:
    return tuple(int(x) for x in G.tensor_info(t)["nb"]) if is_oracle(G) else t.strides


def tensor_name(G, t) -> str:
    return G.tensor_info(t)["name"] if is_oracle(G) else t.name


def arena_base(G, ctx) -> int:
    return int(G.get_mem_buffer(ctx)) if is_oracle(G) else ctx.base


def graph_nodes(G, gf) -> list:
    return list(G.graph_info(gf)["nodes"]) if is_oracle(G) else list(gf.nodes)


def graph_leafs(G, gf) -> list:
    return list(G.graph_info(gf)["leafs"]) if is_oracle(G) else list(gf.leafs)


def _rel(p: int, base: int):
    return None if not p else int(p) - base


def tensor_info(G, t, base: int) -> dict:
    """The struct ggml_tensor of ``t`` with every pointer made relative to ``base`` (None for NULL)."""
    if is_oracle(G):
        s = G.tensor_info(t)
        addr, src, vsrc, data = s["addr"], s["src"], s["view_src"], s["data"]
        buffer, extra = s["buffer"], s["extra"]
    else:
        s = t.struct()
        addr, src, vsrc, data = t.addr, s["src"], s["view_src"], s["data"]
        buffer, extra = s["buffer"], s["extra"]
    return dict(addr=_rel(addr, base), type=int(s["type"]), ne=tuple(int(x) for x in s["ne"]),
                nb=tuple(int(x) for x in s["nb"]), op=int(s["op"]), op_params=tuple(int(x) for x in s["op_params"]),
                flags=int(s["flags"]), src=tuple(_rel(x, base) for x in src), view_src=_rel(vsrc, base),
                view_offs=int(s["view_offs"]), data=_rel(data, base), name=s["name"], buffer=int(buffer or 0),
                extra=int(extra or 0))


def to_float(G, t) -> np.ndarray:
    """The tensor's values as float32, shape (ne3, ne2, ne1, ne0), following nb (views are fine)."""
    if is_oracle(G):
        return G.to_float(t)
    return G.get_data_f32(t)


def raw_bytes(G, t) -> bytes:
    """The tensor's data bytes element by element in (ne3, ne2, ne1, ne0) order (strided reads)."""
    a = G.get_array(t) if is_oracle(G) else np.array(G.get_data(t))
    return np.ascontiguousarray(a).tobytes()


def set_values(G, t, arr) -> None:
    """Write a contiguous tensor: float32 / float16 / int arrays, or raw uint8 block bytes for quantized types."""
    if is_oracle(G):
        G.set_array(t, arr)
    else:
        G.set_data(t, arr)


def _mul_mat_set_prec(G, t, prec):
    # ggml_mul_mat_set_prec: op_params[0] = prec.  (ggviz.ggml may not export it yet: write the field directly.)
    f = getattr(G, "mul_mat_set_prec", None)
    if f is not None:
        f(t, prec)
    else:
        G.set_op_params_i32(t, 0, prec)


def _soft_max_add_sinks(G, t, sinks):
    # ggml_soft_max_add_sinks(kq, NULL) only clears src[2]: a no-op on a fresh soft_max node
    f = getattr(G, "soft_max_add_sinks", None)
    if f is not None:
        f(t, sinks)
    elif sinks is not None:
        raise NotImplementedError("ggviz.ggml has no soft_max_add_sinks")


def _named(G, t, name):
    G.set_name(t, name)
    return t


# ====================================================================================================
# builders
# ====================================================================================================

def build_simple_add(G, ctx) -> dict:
    """The seed example: two 4x3 F32 tensors and their sum.  Nothing is named, so the graph names them
    leaf_0, leaf_1 and node_0."""
    a = G.new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
    b = G.new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
    c = G.add(ctx, a, b)
    gf = G.new_graph(ctx)
    G.build_forward_expand(gf, c)
    return dict(gf=gf, out=c, inputs={}, tensors=dict(a=a, b=b, c=c))


def build_q4_0_mul_mat(G, ctx) -> dict:
    """Q4_0 weights times F32 activations: a plain 2-D product (src1 converted to Q8_0 in the work buffer) and a
    3-D one whose weight is broadcast over the batch (ne2 ratio 2), then both summed with broadcasting."""
    F32, Q4_0 = G.GGML_TYPE_F32, G.GGML_TYPE_Q4_0
    w = _named(G, G.new_tensor_2d(ctx, Q4_0, 64, 48), "w.weight")
    x = _named(G, G.new_tensor_2d(ctx, F32, 64, 7), "x")
    y = _named(G, G.mul_mat(ctx, w, x), "y")                       # [48, 7]
    w3 = _named(G, G.new_tensor_3d(ctx, Q4_0, 96, 48, 2), "w3.weight")
    x3 = _named(G, G.new_tensor_3d(ctx, F32, 96, 7, 4), "x3")
    y3 = G.mul_mat(ctx, w3, x3)                                     # [48, 7, 4]; unnamed -> node_%d
    s = G.add(ctx, y3, y)                                           # y broadcast over ne2
    G.set_output(s)
    gf = G.new_graph(ctx)
    G.build_forward_expand(gf, s)
    return dict(gf=gf, out=s, inputs={}, tensors=dict(w=w, x=x, y=y, w3=w3, x3=x3, y3=y3, s=s))


def build_permute_chain(G, ctx) -> dict:
    """permute / transpose / view chains that real kernels must read through their strides: cont of a permute,
    transpose+cont, an offset 3-D view multiplied by a broadcast row, an F32 -> F16 copy of a permuted tensor,
    a scale of a transposed-and-copied matrix, and an rms_norm whose two uses keep the CPU backend from fusing it
    with the following MUL (in the llama block every rms_norm is fused: ggml never writes its output)."""
    F32, F16 = G.GGML_TYPE_F32, G.GGML_TYPE_F16
    a = _named(G, G.new_tensor_4d(ctx, F32, 6, 5, 4, 3), "a")
    p = G.permute(ctx, a, 1, 2, 0, 3)                               # ne = [4, 6, 5, 3], not contiguous
    c = G.cont(ctx, p)
    r = G.reshape_2d(ctx, c, 30, 12)
    t = G.transpose(ctx, r)                                         # [12, 30], nb0 > nb1
    ct = G.cont(ctx, t)
    sc = _named(G, G.scale(ctx, ct, 0.5), "scaled")
    rn = G.rms_norm(ctx, sc, 1e-6)                                  # two uses: NOT fused with the MUL below
    rm = G.mul(ctx, rn, rn)
    anb = nb(G, a)
    v3 = G.view_3d(ctx, a, 3, 5, 4, anb[1], anb[2], 3 * anb[0])      # right half of every row of a[.., .., .., 0]
    row = _named(G, G.new_tensor_3d(ctx, F32, 3, 1, 4), "row")
    m = G.mul(ctx, v3, row)                                         # non-contiguous src0, broadcast src1
    h = _named(G, G.new_tensor_4d(ctx, F16, 4, 6, 5, 3), "h16")
    cp = G.cpy(ctx, p, h)                                           # F32 permuted -> F16 contiguous
    q = G.permute(ctx, cp, 0, 2, 1, 3)                              # F16 permuted
    qc = G.cont(ctx, q)
    gf = G.new_graph(ctx)
    G.build_forward_expand(gf, rm)
    G.build_forward_expand(gf, m)
    G.build_forward_expand(gf, qc)
    return dict(gf=gf, out=qc, inputs={}, tensors=dict(a=a, p=p, c=c, ct=ct, sc=sc, rn=rn, rm=rm, v3=v3, m=m, cp=cp, qc=qc))


def build_noop_heavy(G, ctx) -> dict:
    """Mostly zero-cost nodes (RESHAPE / VIEW / PERMUTE / TRANSPOSE) between a few real ones, including views of
    views (view_src must point at the base tensor, view_offs accumulate), reshape to a template tensor, a
    view_tensor leaf, and CONT of a transposed view."""
    F32 = G.GGML_TYPE_F32
    x = _named(G, G.new_tensor_2d(ctx, F32, 8, 6), "x")
    r3 = G.reshape_3d(ctx, x, 4, 2, 6)
    p = G.permute(ctx, r3, 0, 2, 1, 3)                              # [4, 6, 2]
    v = G.view_2d(ctx, p, 4, 6, nb(G, p)[1], nb(G, p)[2])           # second "plane" of the permute (a view of a view)
    vv = G.view_1d(ctx, v, 4, nb(G, v)[1] * 2)                      # a view of a view of a view
    t = G.transpose(ctx, G.reshape_2d(ctx, x, 12, 4))               # [4, 12]
    ct = G.cont(ctx, t)
    tmpl = G.new_tensor_3d(ctx, F32, 12, 2, 2)                      # shape template only: not in the graph
    rs = G.reshape(ctx, ct, tmpl)
    r1 = G.reshape_1d(ctx, rs, 48)
    cv = G.cont(ctx, v)                                             # cont of a strided view
    y = _named(G, G.new_tensor_1d(ctx, F32, 4), "y")
    s = G.add(ctx, vv, y)
    x2 = _named(G, G.new_tensor_2d(ctx, F32, 8, 6), "x2")
    vt = G.view_tensor(ctx, x2)                                     # op NONE with a view_src: a leaf that aliases
    s2 = G.add(ctx, G.reshape_1d(ctx, vt, 48), r1)
    gf = G.new_graph(ctx)
    G.build_forward_expand(gf, cv)
    G.build_forward_expand(gf, s)
    G.build_forward_expand(gf, s2)
    return dict(gf=gf, out=s2, inputs={}, tensors=dict(x=x, p=p, v=v, vv=vv, ct=ct, rs=rs, cv=cv, s=s, s2=s2))


class LlamaHParams:
    n_embd = 64
    n_head = 4
    n_head_kv = 2
    n_embd_head = 16
    n_ff = 128
    n_vocab = 32
    n_layer = 2
    n_tokens = 5
    n_past = 3            # cells 0..2 hold earlier tokens (their K/V are whatever the cache leaf holds)
    kv_size = 16
    n_rot = 16
    n_ctx_orig = 4096
    f_norm_rms_eps = 1e-5
    kq_mask_pad = 8       # GGML_KQ_MASK_PAD (rows of the mask beyond n_tokens are -inf padding)
    out_ids = (3, 4)      # which tokens' logits are wanted (llama.cpp's inp_out_ids)
    # per layer: (rope mode, freq_base): layer 0 NORMAL (llama), layer 1 NEOX
    rope = ((0, 10000.0), (2, 500000.0))
    graph_size = 256


def _llama_inputs(hp) -> dict:
    T = hp.n_tokens
    pos = np.arange(hp.n_past, hp.n_past + T, dtype=np.int32)
    cells = pos.astype(np.int64)                                   # token i goes to cell pos[i]
    n_embd_v_gqa = hp.n_embd_head * hp.n_head_kv
    # v_trans: one index per element of V, "each row is a single head element" (llama_kv_cache::set_input_v_idxs)
    j = np.arange(n_embd_v_gqa, dtype=np.int64)
    v_idxs = (j[None, :] * hp.kv_size + cells[:, None]).reshape(-1)
    rows = -(-T // hp.kq_mask_pad) * hp.kq_mask_pad
    mask = np.full((rows, hp.kv_size), -np.inf, dtype=np.float16)
    for i in range(T):
        mask[i, :pos[i] + 1] = 0.0                                  # causal: a token sees cells 0..pos
    tokens = np.array([(7 * i + 3) % hp.n_vocab for i in range(T)], dtype=np.int32)
    return {"inp_tokens": tokens, "inp_pos": pos, "k_idxs": cells, "v_idxs": v_idxs, "KQ_mask": mask,
            "inp_out_ids": np.array(hp.out_ids, dtype=np.int32)}


def build_llama_block(G, ctx, hp=LlamaHParams) -> dict:
    """A miniature llama.cpp ``llm_build_llama`` graph (n_embd 64, 4 heads, 2 KV heads, head_dim 16, ffn 128,
    2 layers, 5 tokens after 3 cached ones), with llama.cpp's node order and names:

    token embedding get_rows from a Q8_0 table; per layer: rms_norm * attn_norm (F32), Q/K/V mul_mats with Q4_1
    weights, reshape to heads, rope_ext (layer 0 NORMAL, layer 1 NEOX) at the token positions, K and V written to
    an F16 KV cache with set_rows via I64 indices (V stored transposed, as without flash attention), permuted K/V
    views of the cache, kq = mul_mat(k, q) at F32 precision, soft_max_ext with an F16 causal mask and scale
    1/sqrt(head_dim), kqv = mul_mat(v, kq), permute + cont_2d back, output projection, last layer keeps only the
    out_ids rows, residual add, ffn_norm, gate/up mul_mats, swiglu_split, down mul_mat, residual add; then
    output norm and an F16 output projection.
    """
    F32, F16, I32, I64 = G.GGML_TYPE_F32, G.GGML_TYPE_F16, G.GGML_TYPE_I32, G.GGML_TYPE_I64
    Q8_0, Q4_1 = G.GGML_TYPE_Q8_0, G.GGML_TYPE_Q4_1
    n_embd, n_head, n_head_kv, hd = hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_embd_head
    n_embd_gqa = hd * n_head_kv
    T, kv_size, n_kv = hp.n_tokens, hp.kv_size, hp.kv_size

    def cb(t, name, il):
        G.set_name(t, name if il < 0 else "%s-%d" % (name, il))
        return t

    # ---- model (llama_model: tensors in loader order)
    tok_embd = _named(G, G.new_tensor_2d(ctx, Q8_0, n_embd, hp.n_vocab), "token_embd.weight")
    output_norm = _named(G, G.new_tensor_1d(ctx, F32, n_embd), "output_norm.weight")
    output = _named(G, G.new_tensor_2d(ctx, F16, n_embd, hp.n_vocab), "output.weight")
    layers = []
    for il in range(hp.n_layer):
        L = {}
        for key, typ, a, b in (("attn_norm", F32, n_embd, None), ("attn_q", Q4_1, n_embd, n_embd),
                               ("attn_k", Q4_1, n_embd, n_embd_gqa), ("attn_v", Q4_1, n_embd, n_embd_gqa),
                               ("attn_output", Q4_1, n_embd, n_embd), ("ffn_norm", F32, n_embd, None),
                               ("ffn_gate", Q4_1, n_embd, hp.n_ff), ("ffn_down", Q4_1, hp.n_ff, n_embd),
                               ("ffn_up", Q4_1, n_embd, hp.n_ff)):
            t = G.new_tensor_1d(ctx, typ, a) if b is None else G.new_tensor_2d(ctx, typ, a, b)
            L[key] = _named(G, t, "blk.%d.%s.weight" % (il, key))
        layers.append(L)
    # ---- KV cache (llama_kv_cache: one K and one V tensor per layer, [n_embd_gqa, kv_size, n_stream])
    for il in range(hp.n_layer):
        layers[il]["k"] = _named(G, G.new_tensor_3d(ctx, F16, n_embd_gqa, kv_size, 1), "cache_k_l%d" % il)
        layers[il]["v"] = _named(G, G.new_tensor_3d(ctx, F16, n_embd_gqa, kv_size, 1), "cache_v_l%d" % il)

    gf = G.new_graph_custom(ctx, hp.graph_size, False)

    # ---- inputs (llm_graph_context::build_inp_*)
    inp_tokens = G.new_tensor_1d(ctx, I32, T)
    cb(inp_tokens, "inp_tokens", -1)
    G.set_input(inp_tokens)
    inpL = cb(G.get_rows(ctx, tok_embd, inp_tokens), "inp_embd", -1)

    inp_pos = G.new_tensor_1d(ctx, I32, T)
    cb(inp_pos, "inp_pos", -1)
    G.set_input(inp_pos)

    k_idxs = _named(G, G.new_tensor_1d(ctx, I64, T), "k_idxs")
    G.set_input(k_idxs)
    v_idxs = _named(G, G.new_tensor_1d(ctx, I64, T * n_embd_gqa), "v_idxs")
    G.set_input(v_idxs)
    rows = -(-T // hp.kq_mask_pad) * hp.kq_mask_pad
    kq_mask = G.new_tensor_4d(ctx, F16, n_kv, rows, 1, 1)
    cb(kq_mask, "KQ_mask", -1)
    G.set_input(kq_mask)

    kq_scale = 1.0 / math.sqrt(float(hd))

    inp_out_ids = G.new_tensor_1d(ctx, I32, len(hp.out_ids))
    cb(inp_out_ids, "inp_out_ids", -1)
    G.set_input(inp_out_ids)

    for il in range(hp.n_layer):
        L = layers[il]
        inpSA = inpL
        # build_norm(LLM_NORM_RMS)
        cur = G.rms_norm(ctx, inpL, hp.f_norm_rms_eps)
        cur = G.mul(ctx, cur, L["attn_norm"])
        cb(cur, "attn_norm", il)

        Qcur = cb(G.mul_mat(ctx, L["attn_q"], cur), "Qcur", il)
        Kcur = cb(G.mul_mat(ctx, L["attn_k"], cur), "Kcur", il)
        Vcur = cb(G.mul_mat(ctx, L["attn_v"], cur), "Vcur", il)
        Qcur = G.reshape_3d(ctx, Qcur, hd, n_head, T)
        Kcur = G.reshape_3d(ctx, Kcur, hd, n_head_kv, T)
        Vcur = G.reshape_3d(ctx, Vcur, hd, n_head_kv, T)
        mode, freq_base = hp.rope[il]
        Qcur = G.rope_ext(ctx, Qcur, inp_pos, None, hp.n_rot, mode, hp.n_ctx_orig, freq_base, 1.0, 0.0, 1.0,
                          32.0, 1.0)
        Kcur = G.rope_ext(ctx, Kcur, inp_pos, None, hp.n_rot, mode, hp.n_ctx_orig, freq_base, 1.0, 0.0, 1.0,
                          32.0, 1.0)
        cb(Qcur, "Qcur", il)
        cb(Kcur, "Kcur", il)
        cb(Vcur, "Vcur", il)

        # ---- build_attn: q, k, v are expanded together, then stored into the cache
        G.build_forward_expand(gf, Qcur)
        G.build_forward_expand(gf, Kcur)
        G.build_forward_expand(gf, Vcur)
        # llama_kv_cache::cpy_k
        k_cur = G.view_2d(ctx, Kcur, n_embd_gqa, T, nb(G, Kcur)[2], 0)
        G.build_forward_expand(gf, G.set_rows(ctx, L["k"], k_cur, k_idxs))
        # llama_kv_cache::cpy_v, transposed V: every element is a row of its own
        v_cur = G.view_2d(ctx, Vcur, n_embd_gqa, T, nb(G, Vcur)[2], 0)
        v_view = G.reshape_2d(ctx, L["v"], 1, n_embd_gqa * kv_size)
        v_cur = G.reshape_2d(ctx, v_cur, 1, n_embd_gqa * T)
        G.build_forward_expand(gf, G.set_rows(ctx, v_view, v_cur, v_idxs))

        # llama_kv_cache::get_k / get_v
        k = G.view_4d(ctx, L["k"], hd, n_head_kv, n_kv, 1,
                      G.row_size(F16, hd), G.row_size(F16, n_embd_gqa), G.row_size(F16, n_embd_gqa * kv_size), 0)
        v = G.view_4d(ctx, L["v"], n_kv, n_head_kv, hd, 1,
                      G.row_size(F16, kv_size * hd), G.row_size(F16, kv_size), G.row_size(F16, kv_size * n_embd_gqa),
                      0)

        # ---- build_attn_mha
        qn = ne(G, Qcur)
        qb = nb(G, Qcur)
        q = G.view_4d(ctx, Qcur, qn[0], qn[1], qn[2], 1, qb[1], qb[2], qb[3], 0)
        q = G.permute(ctx, q, 0, 2, 1, 3)
        k = G.permute(ctx, k, 0, 2, 1, 3)
        v = G.permute(ctx, v, 0, 2, 1, 3)
        kq = G.mul_mat(ctx, k, q)
        cb(kq, "kq", il)
        _mul_mat_set_prec(G, kq, G.GGML_PREC_F32)
        kq = G.soft_max_ext(ctx, kq, kq_mask, kq_scale, 0.0)
        _soft_max_add_sinks(G, kq, None)
        cb(kq, "kq_soft_max", il)
        kqv = G.mul_mat(ctx, v, kq)
        cb(kqv, "kqv", il)
        cur = G.permute(ctx, kqv, 0, 2, 1, 3)
        cur = G.cont_2d(ctx, cur, ne(G, cur)[0] * n_head, T)
        cb(cur, "kqv_out", il)
        cur = G.mul_mat(ctx, L["attn_output"], cur)
        cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = G.get_rows(ctx, cur, inp_out_ids)
            inpSA = G.get_rows(ctx, inpSA, inp_out_ids)

        ffn_inp = cb(G.add(ctx, cur, inpSA), "ffn_inp", il)
        cur = G.rms_norm(ctx, ffn_inp, hp.f_norm_rms_eps)
        cur = G.mul(ctx, cur, L["ffn_norm"])
        cb(cur, "ffn_norm", il)
        # build_ffn(LLM_FFN_SILU, LLM_FFN_PAR)
        tmp = cb(G.mul_mat(ctx, L["ffn_up"], cur), "ffn_up", il)
        cur = cb(G.mul_mat(ctx, L["ffn_gate"], cur), "ffn_gate", il)
        cur = cb(G.swiglu_split(ctx, cur, tmp), "ffn_swiglu", il)
        cur = cb(G.mul_mat(ctx, L["ffn_down"], cur), "ffn_out", il)
        cur = cb(G.add(ctx, cur, ffn_inp), "l_out", il)
        inpL = cur

    cur = G.rms_norm(ctx, inpL, hp.f_norm_rms_eps)
    cur = G.mul(ctx, cur, output_norm)
    cb(cur, "result_norm", -1)
    t_embd = cur
    cur = cb(G.mul_mat(ctx, output, cur), "result_output", -1)
    G.build_forward_expand(gf, cur)
    # llm_graph_result::set_outputs
    G.set_output(cur)
    G.set_output(t_embd)
    return dict(gf=gf, out=cur, inputs=_llama_inputs(hp),
                tensors=dict(logits=cur, embd=t_embd, kq_mask=kq_mask, tok_embd=tok_embd))


BUILDERS = {
    "simple_add": build_simple_add,
    "q4_0_mul_mat": build_q4_0_mul_mat,
    "permute_chain": build_permute_chain,
    "noop_heavy": build_noop_heavy,
    "llama_block": build_llama_block,
}


# ====================================================================================================
# deterministic leaf data
# ====================================================================================================

def leaf_values(name: str, type_: int, shape, index: int, seed: int = 0, G=None) -> np.ndarray:
    """Deterministic values for one leaf, shape (ne3, ne2, ne1, ne0): float32 for F32 and quantized types,
    float16 for F16 (so neither engine's fp32->fp16 rounding is involved).  Weights (``*.weight``, 2-D) are
    N(0, 1/ne0), norm weights 1 + 0.1 N(0, 1), everything else N(0, 1)."""
    rng = np.random.default_rng([seed, index, zlib.crc32(name.encode())])
    ne0, ne1, ne2, ne3 = shape
    dims = (ne3, ne2, ne1, ne0)
    if "norm" in name:
        v = 1.0 + 0.1 * rng.standard_normal(dims)
    elif name.endswith("weight") and ne1 > 1:
        v = rng.standard_normal(dims) / math.sqrt(ne0)
    else:
        v = rng.standard_normal(dims)
    v = v.astype(np.float32)
    if G is not None and type_ == G.GGML_TYPE_F16:
        return v.astype(np.float16)
    return v


def fill_leaves(G, gf, inputs=None, seed: int = 0, raw=None) -> dict:
    """Write every leaf of ``gf`` (in leaf order) with the same data in either engine.

    ``inputs``: name -> exact values (taken for input leaves: ids, positions, indices, masks).  ``raw``: name ->
    uint8 bytes to write verbatim into quantized leaves (e.g. the oracle's quantization, to keep the comparison
    of kernels free of quantizer differences); without it each engine quantizes with its own quantizer.
    Leaves that are views (``view_src`` set, e.g. from ``ggml_view_tensor``) alias another tensor's data; they are
    filled like any other leaf (in leaf order, in both engines) when contiguous, skipped otherwise.
    Returns name -> the bytes now in each filled quantized leaf (uint8 arrays).
    """
    inputs = inputs or {}
    raw = raw or {}
    written = {}
    for i, t in enumerate(graph_leafs(G, gf)):
        if is_oracle(G):
            s = G.tensor_info(t)
            name, typ, shape, has_view = s["name"], s["type"], tuple(s["ne"]), bool(s["view_src"])
        else:
            name, typ, shape, has_view = t.name, t.type, t.shape, t.view_src is not None
        if has_view and not G.is_contiguous(t):
            continue
        if name in inputs:
            set_values(G, t, np.asarray(inputs[name]))
            continue
        if typ in (G.GGML_TYPE_I32, G.GGML_TYPE_I64, G.GGML_TYPE_I16, G.GGML_TYPE_I8):
            raise ValueError("leaf %r is an integer tensor without given input values" % name)
        if G.is_quantized(typ) and name in raw:
            set_values(G, t, np.asarray(raw[name], dtype=np.uint8))
        else:
            set_values(G, t, leaf_values(name, typ, shape, i, seed, G))
        if G.is_quantized(typ):
            written[name] = np.frombuffer(raw_bytes(G, t), dtype=np.uint8).copy()
    return written
