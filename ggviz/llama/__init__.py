"""ggviz.llama: llama.h, mirrored in Python.

Names follow llama.h without the ``llama_`` prefix and keep its argument order::

    from ggviz import llama
    llama.backend_init()
    model = llama.model_load_from_file(path, llama.model_default_params())
    ctx = llama.init_from_model(model, llama.context_default_params())
    vocab = llama.model_get_vocab(model)
    ids = llama.tokenize(vocab, "Hello", add_special=True, parse_special=True)
    llama.decode(ctx, llama.batch_get_one(ids))
    logits = llama.get_logits_ith(ctx, -1)

The modules behind it follow llama.cpp's sources: ``model`` (llama-model), ``vocab`` (llama-vocab), ``kv_cache``
(llama-kv-cache), ``kv_cache_iswa`` (llama-kv-cache-iswa), ``graph`` (llama-graph), ``models/`` (src/models: llama,
gemma3), ``context`` (llama-context; its graph cache and context pool: ``context_pool``), ``batch`` (llama-batch),
``sampling`` (llama-sampling), ``chat`` (chat templates).
"""
from __future__ import annotations

from ..ggml.backend import backend_reg_get_proc_address, backend_reg_name
from ..ggml.backend_reg import backend_reg_count, backend_reg_get
from ..ggml.impl import GGML_LOG
from .batch import LlamaBatch, batch_add, batch_free, batch_get_one, batch_init  # noqa: F401
from .context import (  # noqa: F401
    LLAMA_FLASH_ATTN_TYPE_AUTO,
    LLAMA_FLASH_ATTN_TYPE_DISABLED,
    LLAMA_FLASH_ATTN_TYPE_ENABLED,
    ContextBusyError,
    ContextFreedError,
    ContextParamsError,
    DecodeError,
    LlamaContext,
    LlamaContextParams,
    context_default_params,
    init_from_model,
)
from .model import LlamaModel, LlamaModelParams, model_default_params, model_free, model_load_from_file  # noqa: F401
from .sampling import (  # noqa: F401
    LLAMA_DEFAULT_SEED,
    TokenDataArray,
    sampler_accept,
    sampler_apply,
    sampler_chain_add,
    sampler_chain_init,
    sampler_free,
    sampler_get_seed,
    sampler_init_dist,
    sampler_init_greedy,
    sampler_init_min_p,
    sampler_init_temp,
    sampler_init_top_k,
    sampler_init_top_p,
    sampler_reset,
    sampler_sample,
)

_backend_ready = False


def backend_init() -> None:
    """llama_backend_init: nothing to set up for NumPy, kept so llama.cpp programs translate line by line."""
    global _backend_ready
    _backend_ready = True


def backend_free() -> None:
    global _backend_ready
    _backend_ready = False


def print_system_info() -> str:
    """llama_print_system_info: each registered backend's name and the features it reports
    (``ggml_backend_get_features``), "CPU : SSE3 = 1 | ... | " as llama.cpp prints them."""
    s = ""
    for i in range(backend_reg_count()):
        reg = backend_reg_get(i)
        get_features = backend_reg_get_proc_address(reg, "ggml_backend_get_features")
        if get_features:
            s += f"{backend_reg_name(reg)} : "
            for name, value in get_features(reg):
                if name is None:        # the NULL-terminated array's end
                    break
                s += f"{name} = {value} | "
    return s


def free(ctx: LlamaContext) -> None:
    """llama_free (ggviz parks the context's machinery for the next context of the same shape: LlamaContext.free)."""
    ctx.free()


def model_get_vocab(model: LlamaModel):
    return model.vocab


def model_chat_template(model: LlamaModel, name: str | None = None):
    from .chat import model_chat_template as _t
    return _t(model, name)


_CHAT_NAMES = ("ChatMessage", "ChatTemplateError", "chat_apply_template")


def __getattr__(name):
    # ggviz: the chat templates (llama-chat.cpp + minja: Jinja2's sandbox, ~0.05-0.1 s to import) load on their first
    # use, not with every `from ggviz import llama`: a plain run never applies a template
    if name in _CHAT_NAMES:
        from . import chat
        return getattr(chat, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def model_n_ctx_train(model):
    return model.hparams.n_ctx_train


def model_n_embd(model):
    return model.hparams.n_embd


def model_n_layer(model):
    return model.hparams.n_layer


def model_n_head(model):
    return model.hparams.n_head


def model_desc(model) -> str:
    return model.desc()


def model_size(model) -> int:
    return model.size()


def model_n_params(model) -> int:
    return model.n_params()


def n_ctx(ctx: LlamaContext) -> int:
    return ctx.n_ctx


def n_batch(ctx: LlamaContext) -> int:
    return ctx.n_batch


def n_ubatch(ctx: LlamaContext) -> int:
    return ctx.n_ubatch


def get_model(ctx: LlamaContext):
    return ctx.model


# ---- vocabulary
def vocab_n_tokens(vocab) -> int:
    return vocab.n_tokens


def vocab_bos(vocab) -> int:
    return vocab.bos_id


def vocab_eos(vocab) -> int:
    return vocab.eos_id


def vocab_is_eog(vocab, token: int) -> bool:
    return vocab.is_eog(token)


def vocab_is_control(vocab, token: int) -> bool:
    return vocab.is_control(token)


def vocab_get_text(vocab, token: int) -> str:
    return vocab.token_get_text(token)


def tokenize(vocab, text, add_special: bool = True, parse_special: bool = False) -> list:
    """llama_tokenize: returns the ids (the C API's n_tokens_max/negative-count protocol is not needed here)."""
    return vocab.tokenize(text, add_special=add_special, parse_special=parse_special)


def token_to_piece(vocab, token: int, lstrip: int = 0, special: bool = False) -> bytes:
    return vocab.token_to_piece(token, special=special, lstrip=lstrip)


def detokenize(vocab, tokens, remove_special: bool = False, unparse_special: bool = False) -> str:
    return vocab.detokenize(tokens, remove_special=remove_special, unparse_special=unparse_special)


# ---- decoding
def decode(ctx: LlamaContext, batch: LlamaBatch) -> int:
    """llama_decode: see LlamaContext.decode for the return codes (and what is raised instead)."""
    ret = ctx.decode(batch)
    if ret != 0 and ret != 1:
        GGML_LOG("error", f"llama_decode: failed to decode, ret = {ret}")
    return ret


def get_logits_ith(ctx: LlamaContext, i: int):
    return ctx.get_logits_ith(i)


def get_logits(ctx: LlamaContext):
    return ctx.get_logits()


def get_memory(ctx: LlamaContext):
    return ctx


def memory_clear(mem, data: bool = True) -> None:
    mem.memory_clear(data)


def memory_seq_rm(mem, seq_id: int, p0: int, p1: int) -> bool:
    return mem.memory_seq_rm(seq_id, p0, p1)


def memory_seq_pos_max(mem, seq_id: int) -> int:
    return mem.memory_seq_pos_max(seq_id)


def memory_seq_pos_min(mem, seq_id: int) -> int:
    return mem.memory_seq_pos_min(seq_id)


def perf_context(ctx: LlamaContext):
    return ctx.perf


def set_n_threads(ctx: LlamaContext, n_threads: int, n_threads_batch: int) -> None:
    ctx.set_n_threads(n_threads, n_threads_batch)
