"""A small Pythonic layer over ggviz.llama: ``ggviz.generate(prompt, ...)``, ``load_model``, ``make_sampler``.

It does what llama.cpp's ``llama-simple``/``llama-cli`` examples do with the llama.h calls: load, tokenize (chat
template when asked), decode the prompt, then sample and decode one token at a time until n_predict or an
end-of-generation token, and print llama.cpp-style timings. It sits beside the engine, as llama.cpp's ``common/``
(``common_init_from_params``, ``common_sampler``) beside ``src/``: the views and the commands use it; the
``ggviz run`` command is ``ggviz.tools.run``.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from . import llama
from .fetch import resolve_model

_models: dict = {}


@dataclass
class Generation:
    prompt: str
    prompt_tokens: list
    tokens: list = field(default_factory=list)
    text: str = ""
    t_load_ms: float = 0.0
    t_prompt_ms: float = 0.0
    t_eval_ms: float = 0.0

    @property
    def prompt_tok_per_s(self) -> float:
        return len(self.prompt_tokens) / (self.t_prompt_ms / 1e3) if self.t_prompt_ms else 0.0

    @property
    def eval_tok_per_s(self) -> float:
        n = max(len(self.tokens) - 1, 0)
        return n / (self.t_eval_ms / 1e3) if self.t_eval_ms and n else 0.0

    def timings(self) -> str:
        np_, ne = len(self.prompt_tokens), max(len(self.tokens) - 1, 0)
        lines = [f"llama_perf_context_print:        load time = {self.t_load_ms:10.2f} ms"]
        if np_:
            lines.append(f"llama_perf_context_print: prompt eval time = {self.t_prompt_ms:10.2f} ms / {np_:5d} tokens "
                         f"({self.t_prompt_ms / np_:8.2f} ms per token, {self.prompt_tok_per_s:8.2f} tokens per second)")
        if ne:
            lines.append(f"llama_perf_context_print:        eval time = {self.t_eval_ms:10.2f} ms / {ne:5d} runs   "
                         f"({self.t_eval_ms / ne:8.2f} ms per token, {self.eval_tok_per_s:8.2f} tokens per second)")
        total = self.t_load_ms + self.t_prompt_ms + self.t_eval_ms
        lines.append(f"llama_perf_context_print:       total time = {total:10.2f} ms / {np_ + ne:5d} tokens")
        return "\n".join(lines)


def load_model(path=None, **model_params):
    """Load (once per process) the model ``path`` names: None or "smollm2" (the default, fetched if needed),
    "gemma3-270m" (fetched by `ggviz fetch gemma3-270m`), or a GGUF path (see ``ggviz.fetch.resolve_model``)."""
    path = str(resolve_model(path))
    key = (path, tuple(sorted(model_params.items())))
    if key not in _models:
        p = llama.model_default_params()
        for k, v in model_params.items():
            setattr(p, k, v)
        _models[key] = llama.model_load_from_file(path, p)
    return _models[key]


def make_sampler(temp: float = 0.0, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 seed: int = llama.LLAMA_DEFAULT_SEED):
    chain = llama.sampler_chain_init()
    if temp <= 0.0:
        llama.sampler_chain_add(chain, llama.sampler_init_greedy())
        return chain
    llama.sampler_chain_add(chain, llama.sampler_init_top_k(top_k))
    llama.sampler_chain_add(chain, llama.sampler_init_top_p(top_p, 1))
    llama.sampler_chain_add(chain, llama.sampler_init_min_p(min_p, 1))
    llama.sampler_chain_add(chain, llama.sampler_init_temp(temp))
    llama.sampler_chain_add(chain, llama.sampler_init_dist(seed))
    return chain


def generate(prompt: str, n_predict: int = 64, *, chat: bool = False, temp: float = 0.0, seed: int = 1234,
             top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, threads: int = 2, n_ctx: int = 2048,
             model=None, stream=None, ctx=None, use_blas: bool = False, hybrid: bool = False,
             flash_attn_type: int = llama.LLAMA_FLASH_ATTN_TYPE_AUTO) -> Generation:
    """Generate up to ``n_predict`` tokens after ``prompt``; ``stream(piece: str)`` receives text as it comes.
    ``flash_attn_type``: llama.cpp's ``-fa``: AUTO (-1, its default: on for the CPU), 0 off, 1 on.
    ``use_blas``: add the BLAS backend (as llama.cpp built with GGML_BLAS; by default, as its default build, none).
    ``hybrid``: a PowerInfer (PWRI) model runs on the hybrid executor (``llama_context_params.hybrid``)."""
    t0 = time.perf_counter()
    # model: a loaded model, or what load_model takes (None: the default; a name of the registry; a GGUF path)
    if model is None or isinstance(model, (str, os.PathLike)):
        model = load_model(model)
    if ctx is None:
        cp = llama.context_default_params()
        cp.n_ctx = n_ctx
        cp.n_threads = cp.n_threads_batch = threads
        cp.use_blas = use_blas
        cp.flash_attn_type = flash_attn_type
        cp.hybrid = hybrid
        ctx = llama.init_from_model(model, cp)
    t_load = (time.perf_counter() - t0) * 1e3
    vocab = llama.model_get_vocab(model)
    text = prompt
    if chat:
        text = llama.chat_apply_template(llama.model_chat_template(model), [{"role": "user", "content": prompt}], True)
    ids = llama.tokenize(vocab, text, add_special=True, parse_special=True)
    if not ids:
        raise ValueError("the prompt tokenized to zero tokens")
    if len(ids) + n_predict > llama.n_ctx(ctx):
        raise ValueError(f"prompt ({len(ids)} tokens) + n_predict ({n_predict}) exceed n_ctx ({llama.n_ctx(ctx)})")
    smpl = make_sampler(temp, top_k, top_p, min_p, seed)
    g = Generation(prompt=prompt, prompt_tokens=list(ids), t_load_ms=t_load)
    t1 = time.perf_counter()
    if llama.decode(ctx, llama.batch_get_one(ids)) != 0:
        raise RuntimeError("llama_decode failed on the prompt")
    g.t_prompt_ms = (time.perf_counter() - t1) * 1e3
    pieces = []
    t2 = time.perf_counter()
    for i in range(n_predict):
        tok = llama.sampler_sample(smpl, ctx, -1)
        if llama.vocab_is_eog(vocab, tok):
            break
        g.tokens.append(tok)
        piece = llama.token_to_piece(vocab, tok, 0, False).decode("utf-8", "replace")
        pieces.append(piece)
        if stream is not None:
            stream(piece)
        if i == n_predict - 1:
            break
        if llama.decode(ctx, llama.batch_get_one([tok])) != 0:
            raise RuntimeError("llama_decode failed")
    g.t_eval_ms = (time.perf_counter() - t2) * 1e3
    g.text = llama.detokenize(vocab, g.tokens)
    return g
