"""Chat templates: the GGUF's ``tokenizer.chat_template`` rendered in a Jinja2 sandbox.

Mirrors ``llama_model_chat_template`` and ``llama_chat_apply_template`` (llama.h). llama.cpp recognises the common
templates and formats them in C++; llama-server renders the Jinja source with minja. ggviz renders the source with
Jinja2's ImmutableSandboxedEnvironment: templates can only read the variables given to them, never call into
Python or change state, so a hostile template in a GGUF cannot execute code.
"""
from __future__ import annotations

from dataclasses import dataclass

from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


@dataclass
class ChatMessage:
    role: str
    content: str


class ChatTemplateError(ValueError):
    pass


def _raise_exception(msg):
    raise ChatTemplateError(f"chat template raised: {msg}")


def model_chat_template(model, name: str | None = None) -> str | None:
    key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
    return model.gguf.kv.get(key)


def chat_apply_template(tmpl: str, messages, add_ass: bool = True, bos_token: str = "", eos_token: str = "") -> str:
    """Render ``messages`` (ChatMessage or dicts with role/content) with the template; add_ass opens the reply."""
    if not tmpl:
        raise ChatTemplateError("the model has no chat template (tokenizer.chat_template is missing)")
    msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    try:
        t = env.from_string(tmpl)
        return t.render(messages=msgs, add_generation_prompt=add_ass, bos_token=bos_token, eos_token=eos_token)
    except SecurityError as e:
        raise ChatTemplateError(f"chat template tried an unsafe operation: {e}") from e
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed to render: {e}") from e
