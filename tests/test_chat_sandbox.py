"""Chat templates under limits (ggviz/llama/chat.py): valid templates render as llama.cpp's tests say and exactly as
the plain Jinja2 sandbox did before the limits; hostile ones fail fast with a ChatTemplateError naming the line.

Each hostile template renders in its own subprocess under an RLIMIT_AS of 1 GiB above what the interpreter has
mapped once ggviz is imported, so a regression that allocates without bound fails (MemoryError, "out of memory")
instead of swapping the machine; the reason each case must give is asserted, so an "out of memory" never passes
for a limit. The wall time is only a generous guard (a render that hangs), never a benchmark.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ggviz.ggml.gguf import load_gguf
from ggviz.llama.chat import DEFAULT_LIMITS, ChatMessage, ChatTemplateError, ChatTemplateLimits, chat_apply_template

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "tests" / "data" / "llamacpp" / "chat_templates.json").read_text(encoding="utf-8"))
MODEL = ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _plain_render(tmpl, messages, add_ass=True, bos_token="", eos_token=""):
    """What ggviz rendered before the limits: Jinja2's ImmutableSandboxedEnvironment, trim_blocks + lstrip_blocks."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise ValueError(msg)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(tmpl).render(messages=messages, add_generation_prompt=add_ass, bos_token=bos_token,
                                        eos_token=eos_token)


def _conversation(case):
    msgs = [dict(m) for m in DATA["conversation"]]
    if case["merge_system"]:        # llama.cpp's common layer folds the system message into the first user turn
        msgs = [{"role": "user", "content": msgs[0]["content"] + "\n" + msgs[1]["content"]}] + msgs[2:]
    return msgs


# ----------------------------------------------------------------------------------------------- valid templates

@pytest.mark.parametrize("case", DATA["cases"], ids=[c["name"].split(" ")[0] for c in DATA["cases"]])
def test_llamacpp_templates_render_as_llamacpp_expects(case):
    msgs = _conversation(case)
    out = chat_apply_template(case["template"], msgs, True, case["bos_token"], case["eos_token"])
    assert out == case["expected"]
    assert out == _plain_render(case["template"], msgs, True, case["bos_token"], case["eos_token"])


def test_gemma_template_refuses_a_system_role_with_its_line():
    case = next(c for c in DATA["cases"] if c["name"].startswith("google/gemma"))
    with pytest.raises(ChatTemplateError) as ei:
        chat_apply_template(case["template"], DATA["conversation"])
    assert ei.value.lineno == 1 and ei.value.reason == "the template raised an error: System role not supported"


def test_default_model_template():
    """SmolLM2's own template (ChatML with a default system turn), checked by hand, with and without the reply
    opened; ChatMessage and dict messages give the same."""
    path = MODEL
    if not path.exists():
        from ggviz.fetch import fetch_default_model
        path = fetch_default_model(quiet=True)
    tmpl = load_gguf(str(path)).kv["tokenizer.chat_template"]
    system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    user = "<|im_start|>user\nWhat is a tensor?<|im_end|>\n"
    msgs = [{"role": "user", "content": "What is a tensor?"}]
    assert chat_apply_template(tmpl, msgs, True) == system + user + "<|im_start|>assistant\n"
    assert chat_apply_template(tmpl, [ChatMessage("user", "What is a tensor?")], False) == system + user
    own = [{"role": "system", "content": "Be brief."}] + msgs
    assert chat_apply_template(tmpl, own) == ("<|im_start|>system\nBe brief.<|im_end|>\n" + user
                                              + "<|im_start|>assistant\n")
    assert chat_apply_template(tmpl, own) == _plain_render(tmpl, own)


FEATURES = [
    # loops: loop.* (len() passes through the counted iterable), filtered loops, else, recursive loops, dict items
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.last }}{{ loop.revindex0 }} {% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index0 }}:{{ m.content }}{{ loop.cycle('a', 'b') }}"
    "{% else %}none{% endfor %}",
    "{% for m in messages|selectattr('role', 'equalto', 'nobody') %}x{% else %}empty{% endfor %}",
    "{% for k, v in {'b': 1, 'a': 2}|dictsort %}{{ k }}={{ v }};{% endfor %}",
    "{% for x in [1, [2, [3, 4]], 5] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}{% endif %}"
    "{% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a * b }}{% if loop.changed(a) %}c{% endif %}{% endfor %}",
    "{% for c in 'héllo' %}{{ c|upper }}{% endfor %}{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}",
    # macros, call blocks, namespaces, set blocks, filter blocks
    "{% macro r(n) %}{% if n %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(5) }}",
    "{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}inside {{ messages[0].role }}{% endcall %}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role"
    " ~ ',' %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% set block %}a {{ 1 + 2 }} b{% endset %}{{ block|upper }}{% filter title %}one two{% endfilter %}",
    "{% autoescape true %}{{ '<a>' ~ messages[0].role ~ 1 }}{{ '<b>'|safe ~ '&' }}{% endautoescape %}{{ '<' ~ 2 }}",
    # operators, formatting, string methods, filters
    "{{ 'ab' * 3 }} {{ 2 ** 10 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none }} {{ -3|abs }}",
    "{{ '%s-%05.1f' % ('x', 3.14159) }} {{ '{}:{:>6}'.format('k', 'v') }} {{ '{a}'.format_map({'a': 1}) }}",
    "{{ 'x'.center(7, '*') }}{{ 'y'.ljust(3) }}|{{ 'a\tb'.expandtabs(4) }}{{ 'aXbX'.replace('X', '--') }}",
    "{{ ', '.join(['a', 'b']) }} {{ messages|map(attribute='role')|join('+') }} {{ 'a b c'.split()|length }}",
    "{{ messages|tojson }} {{ {'k': [1, 2]}|tojson(indent=2) }} {{ 'x y'|wordwrap(1) }} {{ 'a\nb'|indent(2, true) }}",
    "{{ 'aaa'|replace('a', 'bb', 2) }} {{ '%d items'|format(3) }} {{ [[1], [2]]|sum(start=[]) }} {{ [3, 1]|sum }}",
    "{{ range(7)|batch(3, 0)|list }} {{ range(7)|slice(3)|list }} {{ 'x'|center(5) }}|{{ 'long text'|truncate(7) }}",
    "{{ messages|length }} {{ messages[-1]['content']|trim|title }} {{ (messages|first).role }} {{ 'ABC'|lower }}",
    "{{ 'go to www.example.com'|urlize }} {{ 'a<b>c'|striptags }} {{ 3.7|int }} {{ '2.5'|float }} {{ 2.567|round(1) }}",
    "{{ foo is defined }} {{ foo|default('dflt') }} {{ messages[9] is defined }} {{ none is none }} {{ 4 is even }}",
    "{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ dict(a=1)['a'] }}{{ [1, 2, 2]|unique|list }}",
]


@pytest.mark.parametrize("tmpl", FEATURES)
def test_template_features_render_as_the_plain_sandbox(tmpl):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": " hello "},
            {"role": "assistant", "content": "hi"}, {"role": "user", "content": "bye"}]
    assert chat_apply_template(tmpl, msgs, True, "<s>", "</s>") == _plain_render(tmpl, msgs, True, "<s>", "</s>")


def test_limits_are_configurable():
    tmpl = "{% for i in range(10) %}{{ i }}{% endfor %}"
    assert chat_apply_template(tmpl, [], limits=ChatTemplateLimits(max_output=10)) == "0123456789"
    with pytest.raises(ChatTemplateError, match=r"the output would be over 9 characters"):
        chat_apply_template(tmpl, [], limits=ChatTemplateLimits(max_output=9))
    # 12 steps: the call to range(), the loop taking its iterable (a call too), 10 iterations
    assert chat_apply_template(tmpl, [], limits=ChatTemplateLimits(max_steps=12)) == "0123456789"
    with pytest.raises(ChatTemplateError, match=r"more than 11 steps"):
        chat_apply_template(tmpl, [], limits=ChatTemplateLimits(max_steps=11))
    rec = "{% macro r(n) %}{% if n %}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(10) }}"
    assert chat_apply_template(rec, [], limits=ChatTemplateLimits(max_depth=11)) == ""
    with pytest.raises(ChatTemplateError, match=r"calls nested more than 10 deep"):
        chat_apply_template(rec, [], limits=ChatTemplateLimits(max_depth=10))


def test_template_source_checks():
    with pytest.raises(ChatTemplateError, match="the model has no chat template"):
        chat_apply_template(None, [])
    with pytest.raises(ChatTemplateError, match="the chat template is a int, not a string"):
        chat_apply_template(7, [])
    fits = "{# #}" * (DEFAULT_LIMITS.max_template // 5)          # 262,140 characters
    assert chat_apply_template(fits, []) == ""
    with pytest.raises(ChatTemplateError, match="the template is 262,145 characters, over the limit of 262,144"):
        chat_apply_template(fits + "{# #}", [])


# --------------------------------------------------------------------------------------------- hostile templates

_CHILD = r"""
import json, resource, sys, time
from ggviz.llama.chat import ChatTemplateError, ChatTemplateLimits, chat_apply_template
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))
# the wall-time limit only where a case asks for it: the others must stop on their own limit even on a busy machine
limits = ChatTemplateLimits(**{"max_seconds": 60.0, **json.loads(sys.argv[2])})
t0 = time.perf_counter()
try:
    out = chat_apply_template(sys.argv[1], [{"role": "user", "content": "hi"}], limits=limits)
    r = {"error": None, "length": len(out)}
except ChatTemplateError as e:
    r = {"error": str(e), "reason": e.reason, "lineno": e.lineno, "line": e.line}
r["seconds"] = time.perf_counter() - t0
print(json.dumps(r))
"""

# (id, template, limits, expected line, what the reason must contain)
HOSTILE = [
    ("huge-string", "hello\n{{ 'a' * 10000000000 }}", {}, 2,
     "over a limit: a str * 10,000,000,000 would be at least 10,000,000,000 characters"),
    ("huge-output", "a\nb\n{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", {}, 3,
     "over a limit: the output would be over 4,194,304 characters"),
    ("doubling", "{% set ns = namespace(s='ab') %}\n{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     {}, 2, "over a limit: a ~ concatenation would be at least"),
    ("doubling-autoescaped", "{% autoescape true %}{% set ns = namespace(s='<b>') %}\n{% for i in range(64) %}"
     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{% endautoescape %}", {}, 2,
     "over a limit: a ~ concatenation would be at least"),
    ("list-repeat-join", "{% set l = ['x' * 1000000] * 1000 %}\n{{ l|join }}", {}, 1,
     "over a limit: a list * 1,000 would be at least"),
    ("format-width", "{{ '{:>10000000000}'.format(1) }}", {}, 1, "over a limit: format() would be at least"),
    ("printf-width", "{{ '%10000000000d' % 1 }}", {}, 1, "over a limit: a % format would be at least"),
    ("center", "{{ 'a'|center(10000000000) }}", {}, 1, "over a limit: |center would be at least"),
    ("replace", "{{ ('a' * 100000)|replace('a', 'b' * 100000) }}", {}, 1, "over a limit: |replace would be at least"),
    ("big-int", "{{ 7 ** 10000000000 }}", {}, 1, "over a limit: 7 ** 10,000,000,000 has more than 65,536 bits"),
    ("block-buffer", "{% macro m() %}\n{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}\n{% endmacro %}"
     "{{ m() }}", {}, 2, "over a limit: a block's text would be at least"),
    ("quadratic-sum", "{{ ([[1]] * 100000)|sum(start=[]) }}", {}, 1, "|sum of 100,000 sequences would copy more"),
    ("slice", "{{ [1]|slice(1000000000)|list }}", {}, 1, "|slice into 1,000,000,000 slices"),
    ("huge-loop", "a\n{% for i in range(100000) %}\n{% for j in range(100000) %}{% endfor %}\n{% endfor %}", {}, 3,
     "over a limit: more than 1,000,000 steps"),
    ("slow-loop", "a\n{% set l = range(100000)|map('string')|list %}{% for i in range(1000) %}{% set x = l|sort %}"
     "{% endfor %}", {"max_seconds": 0.5}, 2, "over a limit: still running after 0.5 s"),
    ("recursion", "{% macro f(n) %}\n{{ f(n + 1) }}\n{% endmacro %}\n{{ f(0) }}", {}, 2,
     "over a limit: calls nested more than 64 deep"),
    ("recursive-loop", "{% set ns = namespace() %}{% set ns.c = [ns] %}\n{% for x in ns.c recursive %}{{ loop(x.c) }}"
     "{% endfor %}", {}, 2, "over a limit: calls nested more than 64 deep"),
    ("deep-nesting", "x\n{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", {}, 2,
     "nested too deeply (Python's recursion limit)"),
    ("type-error", "a\n{{ 1 + 'a' }}", {}, 2, "TypeError: unsupported operand type(s) for +: 'int' and 'str'"),
    ("undefined-chain", "a\n\n{{ foo.bar.baz }}", {}, 3, "undefined value: 'foo' is undefined"),
    ("missing-attribute", "{{ messages[0].nope.deeper }}", {}, 1, "undefined value: 'dict object' has no attribute"),
    ("unsafe-attribute", "{{ ''.__class__.__mro__[1].__subclasses__() }}", {}, 1,
     "unsafe operation refused: access to attribute '__class__' of a 'str' object is unsafe"),
    ("unsafe-call", "ok\n{{ messages.append(1) }}", {}, 2,
     "unsafe operation refused: access to attribute 'append' of a 'list' object is unsafe"),
    ("no-lipsum", "{{ lipsum(1000000000) }}", {}, 1, "undefined value: 'lipsum' is undefined"),
    ("syntax", "a\n{% for %}", {}, 2, "syntax error: Expected an expression"),
    ("raise", "a\n{{ raise_exception('no system role') }}", {}, 2, "the template raised an error: no system role"),
]


@pytest.mark.parametrize("tmpl,limits,lineno,reason", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_template_fails_fast_with_its_line(tmpl, limits, lineno, reason):
    r = subprocess.run([sys.executable, "-c", _CHILD, tmpl, json.dumps(limits)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["error"] is not None, f"rendered {res['length']} characters"
    assert reason in res["reason"], res["error"]
    assert res["lineno"] == lineno, res["error"]
    line = tmpl.splitlines()[lineno - 1].strip()
    assert res["line"] == (line if len(line) <= 100 else line[:97] + "...")
    assert res["error"].startswith(f"chat template line {lineno}: ")
    assert res["seconds"] < 30, res             # a guard against a hang, not a benchmark
