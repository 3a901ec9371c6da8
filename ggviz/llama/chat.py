"""Chat templates: the GGUF's ``tokenizer.chat_template`` rendered in a Jinja2 sandbox with resource limits.

Mirrors ``llama_model_chat_template`` and ``llama_chat_apply_template`` (llama.h). llama.cpp recognises the common
templates and formats them in C++; llama-server renders the Jinja source with its own Jinja engine. ggviz renders the
source with Jinja2's ImmutableSandboxedEnvironment (with ``trim_blocks`` and ``lstrip_blocks``, as Hugging Face's
``apply_chat_template`` does): templates can only read the variables given to them, never call into Python or change
state, so a hostile template in a GGUF cannot execute code.

The sandbox alone does not bound resources: ``{{ 'a' * 10000000000 }}`` asks for 10 GB, two nested loops over
``range(100000)`` run 10^10 times, a macro that calls itself recurses until Python gives up. A GGUF is untrusted
input (``ggviz run --chat`` renders the template stored in it), so every render runs under ``ChatTemplateLimits``:

* size: no value a template makes (a string, a list, a number's digits) and not the rendered text may exceed
  ``max_output`` characters; amplifying operations (``*`` on strings and lists, ``**``, ``%`` and ``format``
  widths, ``center``/``ljust``/``indent``/``replace``/``join`` ...) are checked *before* they allocate, from their
  arguments; every other operation's result is measured after it and added to ``max_work``, the total the render
  may produce, so no mix of small steps can pile up memory either;
* steps: loop iterations, calls and filters count against ``max_steps``, and against ``max_seconds`` of wall time;
* depth: calls (macros, ``caller()``, recursive loops) nest at most ``max_depth`` deep.

Any failure -- syntax, an undefined value, an unsafe attribute, a type error, a limit, ``raise_exception`` in the
template -- comes out as one ``ChatTemplateError`` that names the template line (``lineno``) and shows it.
"""
from __future__ import annotations

import functools
import inspect
import re
import string
import time
from dataclasses import dataclass

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.parser import Parser
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment
from jinja2.utils import Namespace


@dataclass
class ChatMessage:
    role: str
    content: str


class ChatTemplateError(ValueError):
    """A chat template that cannot be rendered. ``reason`` says what went wrong, ``lineno`` is the template line
    (None when the failure has no position, e.g. a template that is not a string) and ``line`` its text."""

    def __init__(self, reason: str, lineno: int | None = None, line: str | None = None):
        self.reason, self.lineno, self.line = reason, lineno, line
        where = f"chat template line {lineno}" if lineno is not None else "chat template"
        super().__init__(f"{where}: {reason}" + (f" -- in: {line}" if line else ""))


@dataclass(frozen=True)
class ChatTemplateLimits:
    """What one render may use. The defaults are far above what real chat templates need (the largest ones render
    a conversation in well under 10,000 steps and a few ms) and far below what would hurt the machine."""
    max_template: int = 256 << 10   # characters of template source (real ones: a few KB, rarely 30 KB)
    max_output: int = 4 << 20       # characters of the rendered text, and the size of any one value
    max_work: int = 256 << 20       # the sizes of all the values a render produces, added up
    max_steps: int = 1_000_000      # loop iterations + calls + filters
    max_depth: int = 64             # calls nested in calls (macro recursion)
    max_seconds: float = 5.0        # wall time, compile included


DEFAULT_LIMITS = ChatTemplateLimits()

# a template's integers: 2**65536 has ~20,000 digits, more than str() may print (sys.get_int_max_str_digits)
_MAX_INT_BITS = 1 << 16
_SLOT = 8                           # what one item of a container weighs (a pointer)


class _LimitError(Exception):
    """A limit reached inside the render (turned into a ChatTemplateError with the template position)."""


class _TemplateRaised(Exception):
    """``raise_exception(msg)`` called by the template."""


def _raise_exception(msg):
    raise _TemplateRaised(str(msg))


def model_chat_template(model, name: str | None = None) -> str | None:
    key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
    return model.gguf.kv.get(key)


# ====================================================================================================================
# sizes
# ====================================================================================================================

def _weight(x, cap: int) -> int:
    """About how many characters ``str(x)`` takes (strings: their length; integers: their digits; containers:
    their items plus a slot each; other objects: nothing of their own). Stops counting once above ``cap``, so it costs at most O(cap); containers that
    contain themselves only make the count grow, so it ends too."""
    total, stack = 0, [x]
    while stack:
        v = stack.pop()
        if isinstance(v, (str, bytes, bytearray)):
            total += len(v)
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 1
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += _SLOT * len(v)
            stack.extend(v)
        elif isinstance(v, dict):
            total += _SLOT * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, Namespace):
            stack.append(object.__getattribute__(v, "_Namespace__attrs"))
        # other objects (macros, loops, ranges, generators, Undefined): their slot in a container is counted
        if total > cap:
            return total
    return total


def _count(n: int) -> str:
    """``n`` with thousands separators; a power of two for numbers too long to print (int max str digits)."""
    return f"{n:,}" if n.bit_length() < 100 else f"2**{n.bit_length() - 1}"


def _int(x) -> int:
    return x if isinstance(x, int) else 0


_PRINTF = re.compile(r"%(?:\(([^)]*)\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _printf_size(fmt: str, args, cap: int) -> int:
    """An upper bound of ``len(fmt % args)``: the format, each argument's size once (a ``%(name)s`` per use), and
    every field width / precision."""
    total = len(fmt)
    named = isinstance(args, dict)
    positional = args if isinstance(args, tuple) else (args,)
    star = max((abs(a) for a in positional if isinstance(a, int)), default=0)
    if not named:
        total += _weight(positional, cap)
    for m in _PRINTF.finditer(fmt):
        if named and m.group(1) is not None:
            total += _weight(args.get(m.group(1)), cap)
        for g in (m.group(2), m.group(3)):
            if g is not None:
                total += star if g == "*" else int(g)
        if total > cap:
            break
    return total


def _format_size(fmt: str, args, kwargs, cap: int) -> int:
    """An upper bound of ``len(fmt.format(*args, **kwargs))``: per field the largest argument plus the largest
    number in its spec (nested ``{}`` in a spec: the largest integer argument)."""
    values = list(args) + list(kwargs.values())
    biggest = max((_weight(v, cap) for v in values), default=0)
    nested = max((abs(v) for v in values if isinstance(v, int)), default=0)
    total = len(fmt)
    for _literal, field, spec, _conv in string.Formatter().parse(fmt):
        if field is None:
            continue
        total += biggest + max((int(d) for d in re.findall(r"\d+", spec or "")), default=0)
        if spec and "{" in spec:
            total += nested
        if total > cap:
            break
    return total


# ====================================================================================================================
# the budget of one render
# ====================================================================================================================

class _Budget:
    __slots__ = ("limits", "steps", "work", "depth", "deadline")

    def __init__(self, limits: ChatTemplateLimits):
        self.limits = limits
        self.steps = self.work = self.depth = 0
        self.deadline = time.monotonic() + limits.max_seconds

    def tick(self):
        self.steps += 1
        if self.steps > self.limits.max_steps:
            raise _LimitError(f"more than {self.limits.max_steps:,} steps (loop iterations, calls and filters; "
                              "ChatTemplateLimits.max_steps)")
        if time.monotonic() > self.deadline:
            raise _LimitError(f"still running after {self.limits.max_seconds:g} s (ChatTemplateLimits.max_seconds)")

    def size(self, n: int, what: str):
        if n > self.limits.max_output:
            raise _LimitError(f"{what} would be at least {_count(n)} characters, over the limit of "
                              f"{self.limits.max_output:,} (ChatTemplateLimits.max_output)")

    def produced(self, value, what: str = "a value"):
        w = _weight(value, self.limits.max_output)
        self.size(w, what)
        self.work += w
        if self.work > self.limits.max_work:
            raise _LimitError(f"the values made so far add up to more than {self.limits.max_work:,} characters "
                              "(ChatTemplateLimits.max_work)")


class _Counted:
    """A ``for`` loop's iterable: each item taken is a step. ``len()`` passes through, so ``loop.length`` and
    ``loop.last`` work as before (LoopContext falls back to counting when it raises TypeError)."""
    __slots__ = ("_it", "_budget")

    def __init__(self, iterable, budget: _Budget):
        self._it, self._budget = iterable, budget

    def __len__(self):
        return len(self._it)

    def __iter__(self):
        tick = self._budget.tick
        for item in self._it:
            tick()
            yield item


def _materialize(iterable, budget: _Budget, what: str) -> list:
    """``list(iterable)``, stopping as soon as its items are over the size limit."""
    cap, items, total = budget.limits.max_output, [], 0
    for item in iterable:
        items.append(item)
        total += _weight(item, cap) + _SLOT
        budget.size(total, what)
    return items


# ====================================================================================================================
# checks made before an operation allocates
# ====================================================================================================================

def _check_str_method(budget: _Budget, s, name: str, args: tuple, kwargs: dict) -> tuple:
    """Bounds for the methods of str / bytes that can make a result much larger than the string."""
    n = len(s)
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        budget.size(max(n, _int(width)), f"{name}({width!r})")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        tab = "\t" if isinstance(s, str) else b"\t"
        budget.size(n + s.count(tab) * max(_int(size), 0), f"expandtabs({size!r})")
    elif name == "replace" and len(args) >= 2 and all(isinstance(x, str if isinstance(s, str) else (bytes, bytearray))
                                                      for x in args[:2]):
        old, new = args[0], args[1]
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        k = s.count(old) if old else n + 1
        if _int(count) >= 0 and isinstance(count, int):
            k = min(k, count)
        budget.size(n + k * (len(new) - len(old)), "replace()")
    elif name == "join" and args:
        items = _materialize(args[0], budget, "join()")
        budget.size(sum(_weight(i, budget.limits.max_output) for i in items) + n * max(len(items) - 1, 0),
                    "join()")
        args = (items,) + args[1:]
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((_weight(v, budget.limits.max_output) for v in args[0].values()), default=1)
        budget.size(n * max(longest, 1), "translate()")
    return args, kwargs


def _check_call(budget: _Budget, obj, args: tuple, kwargs: dict) -> tuple:
    # str.format / format_map reach here as the sandbox's wrapper (functools.update_wrapper sets __wrapped__)
    target = getattr(obj, "__wrapped__", obj)
    owner, name = getattr(target, "__self__", None), getattr(target, "__name__", None)
    if isinstance(owner, (str, bytes, bytearray)):
        if name in ("format", "format_map") and isinstance(owner, str):
            # format_map(mapping): the whole mapping bounds what any field can take from it
            fargs, fkw = (args, kwargs) if name == "format" else (args, {})
            budget.size(_format_size(owner, fargs, fkw, budget.limits.max_output), f"{name}()")
        else:
            args, kwargs = _check_str_method(budget, owner, name, args, kwargs)
    elif isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        budget.size(_int(length), "to_bytes()")
    return args, kwargs


def _f_center(budget, a):
    budget.size(_int(a.get("width", 80)), "|center")


def _f_indent(budget, a):
    s, width = str(a["s"]), a.get("width", 4)
    w = len(width) if isinstance(width, str) else _int(width)
    budget.size(len(s) + (s.count("\n") + 1) * w, "|indent")


def _f_wordwrap(budget, a):
    s, width, wrap = str(a["s"]), max(_int(a.get("width", 79)), 1), a.get("wrapstring") or "\n"
    # a line ends full, or before a word that does not fit (at a whitespace): that bounds the number of lines
    lines = len(s) // width + sum(map(str.isspace, s)) + 1
    budget.size(len(s) + lines * len(str(wrap)), "|wordwrap")


def _f_replace(budget, a):
    s, old, new, count = str(a["s"]), str(a["old"]), str(a["new"]), a.get("count")
    k = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        k = min(k, count)
    budget.size(len(s) + k * (len(new) - len(old)), "|replace")


def _f_format(budget, a):
    args = a.get("kwargs") or a.get("args", ())
    budget.size(_printf_size(str(a["value"]), args, budget.limits.max_output), "|format")


def _f_join(budget, a):
    items = _materialize(a["value"], budget, "|join")
    d = str(a.get("d", ""))
    budget.size(sum(_weight(i, budget.limits.max_output) for i in items) + len(d) * max(len(items) - 1, 0),
                "|join")
    a["value"] = items


def _f_sum(budget, a):
    items = _materialize(a["iterable"], budget, "|sum")
    a["iterable"] = items
    if not all(isinstance(i, (int, float, complex)) for i in items):
        # sequences: each addition copies the sum so far (quadratic); count that work up front
        cap = budget.limits.max_work
        total = sum(_weight(i, cap) for i in items) + _weight(a.get("start", 0), cap)
        budget.size(total, "|sum")
        budget.work += total * len(items) // 2
        if budget.work > budget.limits.max_work:
            raise _LimitError(f"|sum of {len(items):,} sequences would copy more than {budget.limits.max_work:,} "
                              "characters (ChatTemplateLimits.max_work)")


def _f_batch(budget, a):
    budget.size(_int(a.get("linecount", 0)), "|batch")


def _f_slice(budget, a):
    if _int(a.get("slices", 0)) > MAX_RANGE:
        raise _LimitError(f"|slice into {_count(a['slices'])} slices (at most {MAX_RANGE:,}, like range())")


def _f_tojson(budget, a):
    budget.size(_weight(a["value"], budget.limits.max_output) * (1 + max(_int(a.get("indent")), 0)), "|tojson")


def _f_urlize(budget, a):
    s = str(a["value"])
    extra = len(str(a.get("target") or "")) + len(str(a.get("rel") or "")) + 64
    budget.size(3 * len(s) + (len(s) // 4 + 1) * extra, "|urlize")


_FILTER_CHECKS = {
    "center": _f_center, "indent": _f_indent, "wordwrap": _f_wordwrap, "replace": _f_replace, "format": _f_format,
    "join": _f_join, "sum": _f_sum, "batch": _f_batch, "slice": _f_slice, "tojson": _f_tojson, "urlize": _f_urlize,
}
# filters that never turn their input into a string (or make one from it): no size check of the input needed
_NO_STR_FILTERS = frozenset({"attr", "count", "d", "default", "first", "items", "last", "length", "map", "max", "min",
                             "random", "reject", "rejectattr", "select", "selectattr", "unique", "reverse", "int",
                             "float", "abs", "round", "list", "sort", "dictsort", "groupby", "batch", "slice"})


@functools.lru_cache(maxsize=None)
def _signature(f):
    """The signature of filter ``f`` without its context / environment parameter. Jinja2's async-variant filters
    wrap a sync function; the wrapper may take an eval context the sync function does not, so look at the sync
    function itself."""
    inner = inspect.unwrap(f)
    params = list(inspect.signature(inner).parameters.values())
    if getattr(inner, "jinja_pass_arg", None) is not None:
        params = params[1:]
    return inspect.Signature(params)


# ====================================================================================================================
# the environment
# ====================================================================================================================

class _CodeGenerator(CodeGenerator):
    """``a ~ b`` goes through ``environment.checked_concat`` (Jinja2 joins the strings inline otherwise, out of the
    sandbox's reach), with Jinja2's choice of join: markup_join where autoescaping is on (``{% autoescape %}``,
    decided at run time when volatile), str_join elsewhere."""

    def visit_Concat(self, node, frame):
        try:                      # constant parts (template text only) fold at compile time, as Jinja2 does
            self.write(repr(node.as_const(frame.eval_ctx)))
            return
        except nodes.Impossible:
            pass
        markup = "context.eval_ctx.volatile" if frame.eval_ctx.volatile else repr(bool(frame.eval_ctx.autoescape))
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(f"), {markup})")


class _LimitedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment plus the checks of one ``_Budget`` (one environment per render)."""
    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, budget: _Budget):
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.budget = budget
        self.finalize = self._finalize
        self.concat = self._concat
        self.globals.pop("lipsum", None)        # lipsum(n=10**9) would write forever; no chat template uses it
        self.globals["raise_exception"] = _raise_exception
        self.filters = {name: self._guard_filter(name, f) for name, f in self.filters.items()}

    # -- parsing: every for loop counts its iterations
    def _parse(self, source, name, filename):
        tree = super()._parse(source, name, filename)
        for node in tree.find_all(nodes.For):
            node.iter = nodes.Call(nodes.EnvironmentAttribute("counted", lineno=node.lineno), [node.iter], [], None,
                                   None, lineno=node.lineno)
        return tree

    def counted(self, iterable):
        return _Counted(iterable, self.budget)

    # -- operators
    def call_binop(self, context, operator, left, right):
        b, cap = self.budget, self.budget.limits.max_output
        if operator == "*":
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                    raise _LimitError(f"an integer product of more than {_MAX_INT_BITS:,} bits")
            elif isinstance(right, int) and not isinstance(left, (int, float, complex)):
                b.size(_weight(left, cap) * max(right, 0), f"a {type(left).__name__} * {_count(right)}")
            elif isinstance(left, int) and not isinstance(right, (int, float, complex)):
                b.size(_weight(right, cap) * max(left, 0), f"{_count(left)} * a {type(right).__name__}")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0 \
                    and left.bit_length() * right > _MAX_INT_BITS:
                raise _LimitError(f"{_count(left)} ** {_count(right)} has more than {_MAX_INT_BITS:,} bits")
        elif operator == "+":
            if not isinstance(left, (int, float, complex)) and not isinstance(right, (int, float, complex)):
                b.size(_weight(left, cap) + _weight(right, cap), f"a {type(left).__name__} + a {type(right).__name__}")
        elif operator == "%" and isinstance(left, str):
            b.size(_printf_size(left, right, cap), "a % format")
        rv = self.binop_table[operator](left, right)
        b.produced(rv)
        return rv

    def checked_concat(self, values, markup: bool = False):
        self.budget.size(sum(_weight(v, self.budget.limits.max_output) for v in values), "a ~ concatenation")
        rv = markup_join(values) if markup else str_join(values)
        self.budget.produced(rv)
        return rv

    # -- calls: macros, caller(), recursive loops, methods, globals
    def call(self, context, obj, /, *args, **kwargs):
        b = self.budget
        b.tick()
        args, kwargs = _check_call(b, obj, args, kwargs)
        if b.depth >= b.limits.max_depth:
            raise _LimitError(f"calls nested more than {b.limits.max_depth} deep (ChatTemplateLimits.max_depth)")
        b.depth += 1
        try:
            rv = super().call(context, obj, *args, **kwargs)
        finally:
            b.depth -= 1
        b.produced(rv)
        return rv

    def _guard_filter(self, name, f):
        check = _FILTER_CHECKS.get(name)
        strict = name not in _NO_STR_FILTERS
        # filters marked @pass_context / @pass_eval_context / @pass_environment take that object first
        skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0
        sig = _signature(f) if check else None

        @functools.wraps(f)
        def guarded(*args, **kwargs):
            b = self.budget
            b.tick()
            if strict:
                b.size(_weight(args[skip:], b.limits.max_output) + _weight(kwargs, b.limits.max_output),
                       f"the input of |{name}")
            if check is not None:
                bound = sig.bind(*args[skip:], **kwargs)
                bound.apply_defaults()
                a = dict(bound.arguments)
                check(b, a)
                bound.arguments.update(a)
                args, kwargs = args[:skip] + bound.args, bound.kwargs
            rv = f(*args, **kwargs)
            b.produced(rv, f"the result of |{name}")
            return rv
        return guarded

    # -- output
    def _finalize(self, value):
        self.budget.size(_weight(value, self.budget.limits.max_output), "an output expression")
        return value

    def _concat(self, parts):
        parts = parts if isinstance(parts, list) else list(parts)
        self.budget.size(sum(map(len, parts)), "a block's text")
        self.budget.tick()
        return "".join(parts)

    # -- attributes: refuse at once instead of an Undefined that renders as ''
    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")


# ====================================================================================================================
# errors with their template position
# ====================================================================================================================

_TEMPLATE_FILE = "<template>"      # the file name Jinja2 gives the frames of a template made by from_string


def _lineno_from_traceback(exc: BaseException) -> int | None:
    """The innermost template line in the traceback; while parsing (e.g. a RecursionError on deep nesting), the
    line of the parser's current token."""
    lineno = parsed = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEMPLATE_FILE:
            lineno = tb.tb_lineno
        elif isinstance(tb.tb_frame.f_locals.get("self"), Parser):
            parsed = tb.tb_frame.f_locals["self"].stream.current.lineno
        tb = tb.tb_next
    return lineno if lineno is not None else parsed


def _lineno_of_generator(template, gen) -> int | None:
    """The template line a suspended ``template.generate()`` stands at (its innermost template frame)."""
    lineno = None
    while gen is not None:
        frame = getattr(gen, "gi_frame", None)
        if frame is not None and frame.f_globals.get("__jinja_template__") is template:
            lineno = template.get_corresponding_lineno(frame.f_lineno)
        gen = getattr(gen, "gi_yieldfrom", None)
    return lineno


def _reason(e: BaseException) -> str:
    if isinstance(e, TemplateSyntaxError):
        return f"syntax error: {e.message}"
    if isinstance(e, _LimitError):
        return f"over a limit: {e}"
    if isinstance(e, _TemplateRaised):
        return f"the template raised an error: {e}"
    if isinstance(e, SecurityError):
        return f"unsafe operation refused: {e}"
    if isinstance(e, UndefinedError):
        return f"undefined value: {e}"
    if isinstance(e, RecursionError):
        return "nested too deeply (Python's recursion limit)"
    if isinstance(e, MemoryError):
        return "out of memory"
    return f"{type(e).__name__}: {e}"


def _snippet(lines: list[str], lineno: int | None, width: int = 100) -> str | None:
    if lineno is None or not 1 <= lineno <= len(lines):
        return None
    s = lines[lineno - 1].strip()
    return s if len(s) <= width else s[:width - 3] + "..."


# ====================================================================================================================
# llama_chat_apply_template
# ====================================================================================================================

def chat_apply_template(tmpl: str, messages, add_ass: bool = True, bos_token: str = "", eos_token: str = "", *,
                        limits: ChatTemplateLimits | None = None) -> str:
    """Render ``messages`` (ChatMessage or dicts with role/content) with the template; add_ass opens the reply.

    Raises ChatTemplateError for every failure, naming the template line; ``limits`` (default ``DEFAULT_LIMITS``)
    bounds the size, steps, nesting and time of the render."""
    limits = limits or DEFAULT_LIMITS
    if not tmpl:
        raise ChatTemplateError("the model has no chat template (tokenizer.chat_template is missing)")
    if not isinstance(tmpl, str):
        raise ChatTemplateError(f"the chat template is a {type(tmpl).__name__}, not a string")
    if len(tmpl) > limits.max_template:
        raise ChatTemplateError(f"the template is {len(tmpl):,} characters, over the limit of "
                                f"{limits.max_template:,} (ChatTemplateLimits.max_template)")
    msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
    lines = tmpl.splitlines()
    budget = _Budget(limits)
    env = _LimitedSandbox(budget)
    template = gen = None
    out, n = [], 0
    try:
        template = env.from_string(tmpl)
        gen = template.generate(messages=msgs, add_generation_prompt=add_ass, bos_token=bos_token,
                                eos_token=eos_token)
        for chunk in gen:
            n += len(chunk)
            if n > limits.max_output:
                lineno = _lineno_of_generator(template, gen)
                raise ChatTemplateError(f"over a limit: the output would be over {limits.max_output:,} characters "
                                        "(ChatTemplateLimits.max_output)", lineno, _snippet(lines, lineno))
            out.append(chunk)
    except ChatTemplateError:
        raise
    except Exception as e:  # noqa: BLE001 -- whatever a template does wrong is the template's error
        lineno = e.lineno if isinstance(e, TemplateSyntaxError) else _lineno_from_traceback(e)
        raise ChatTemplateError(_reason(e), lineno, _snippet(lines, lineno)) from e
    finally:
        if gen is not None:
            gen.close()
    return "".join(out)
