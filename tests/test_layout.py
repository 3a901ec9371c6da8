"""The package's layout rules, checked: imports run one way, ggml-impl.h's helpers exist once, the code lints.

* No import cycle among ggviz's modules, counting every import statement (at module level or inside functions),
  as the README promises ("imports one way"); the engine (``ggviz.ggml``, ``ggviz.llama``, ``ggviz.trace``) never
  imports the views (``ggviz.viz``).
* The layers, bottom up: the engine (and what sits beside it: fetching models, progress bars, ``ggviz.run``'s
  ``generate``) < ``ggviz.capture`` (records a run) < ``ggviz.viz`` (draws records) < the commands (``ggviz.tools``,
  ``ggviz.cli``, PowerInfer's offline pipeline). Every module is in one layer, and no import runs back up: no view
  imports a command, capture imports no view.
* Imports sit at the top of modules. Inside a function only where a dependency is optional (the import is guarded
  by ``try``) or in the allow-list below, each with its reason.
* The helpers of ggml-impl.h (and the type traits that sit beside them) are defined once, in ``ggviz/ggml/impl.py``.
* A departure from C is marked one way, ``ggviz:`` (``# ggviz:`` in comments, "ggviz:" opening a docstring
  sentence), so that ``grep -rn "ggviz:" ggviz`` lists them all: none of the other phrasings once used.
* ``ruff check`` (configured in pyproject.toml) passes on the package, the tests, the benchmarks, the tools and
  the notebook sources.
* No function over ``MAX_FUNCTION_LINES`` lines, except the mirrors of long C functions (kept whole, so they diff
  against upstream: ``MIRRORED_LONG_FUNCTIONS`` names each one's C counterpart).
* No JavaScript or CSS in Python strings: the browser code lives in ``ggviz/templates/`` (``.js``/``.css`` files read
  with importlib.resources). A heuristic: a string (not a docstring) with JavaScript syntax, a ``<style>`` element
  with rules in it, or two CSS rules. A one-rule string built from data (a selection's highlight) passes.
"""
from __future__ import annotations

import ast
import functools
import graphlib
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "ggviz"

# module -> why an import inside a function is right there
LAZY_IMPORTS_ALLOWED = {
    "ggviz": "`import ggviz` stays light: its re-exports (generate, load_gguf) are loaded on first use (PEP 562)",
    "ggviz.llama": "the chat templates (jinja2's sandbox) load on first use, not with every run (PEP 562)",
    "ggviz.tools.oneshot_child": "a fresh process that times its own imports, and imports llama_cpp or ggviz",
    "ggviz.ggml.gguf": "gguf-py (~30-70 ms) only for GGUFFile.gguf_reader's cross-check, not for loading a model",
    "ggviz.llama.vocab": "gguf-py (~30-70 ms) only for read_tokenizer_kv on a path, not for loading a model",
    "ggviz.cli": "importlib.metadata and platform only for `ggviz version` (~20-45 ms of every other command's "
                 "first import: `ggviz fetch`, `ggviz --help`)",
    "ggviz.progress": "tqdm.auto (asyncio, importlib.metadata, ipywidgets in Jupyter) loads at the first bar: a "
                      "one-shot `ggviz run` of a model already here never draws one",
}

# defined in ggviz/ggml/impl.py and nowhere else in the package
IMPL_HELPERS = ("GGML_ASSERT", "GGML_PAD", "GGMLError", "op_is_empty", "GGML_LOG", "last_log_error", "type_size",
                "row_size", "blck_size", "type_name", "is_quantized", "type_sizef")

# the phrasings that marked a departure from C before "ggviz:" became the one marker
OTHER_DEPARTURE_MARKERS = re.compile(r"ggviz addition|no C counterpart|Python[- ]only|Python addition|ggviz adds|"
                                     r"ggviz goes further|ggviz[- ]only|\(ggviz(;|\):)", re.IGNORECASE)


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the checks below (parsing and walking ~200 modules once per check
    was ~30 s of the suite's CPU time; the checks only read the trees)."""
    return ast.parse(path.read_text())


@functools.cache
def _nodes(path: pathlib.Path) -> tuple:
    return tuple(ast.walk(_tree(path)))


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts)
        mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = p
    return mods


def _imported(mod: str, path: pathlib.Path, node, mods) -> list[str]:
    """The ggviz modules an import statement names (``from .x import y`` may name module x or x.y)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        if node.level:
            parts = base.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1])
            target = base + ("." + node.module if node.module else "")
        else:
            target = node.module or ""
        names = [target] + [f"{target}.{a.name}" for a in node.names]
    return [n for n in names if n in mods]


@functools.cache
def _graph() -> dict[str, frozenset]:
    mods = _modules()
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for node in _nodes(p):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _imported(m, p, node, mods):
                    if t != m and not m.startswith(t + "."):      # a package's own parents are not a cycle
                        graph[m].add(t)
    return {m: frozenset(ts) for m, ts in graph.items()}


def test_no_import_cycles():
    try:
        order = list(graphlib.TopologicalSorter(_graph()).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"ggviz modules import each other in a circle: {' -> '.join(e.args[1])}")
    assert len(order) == len(_modules())


def test_engine_never_imports_the_views():
    graph = _graph()
    engine = [m for m in graph if m.split(".")[:2] in (["ggviz", "ggml"], ["ggviz", "llama"]) or m == "ggviz.trace"]
    bad = sorted(f"{m} -> {t}" for m in engine for t in graph[m] if t.startswith("ggviz.viz"))
    assert not bad, bad


# the layers, bottom up: (name, the modules in it -- a package's name covers its submodules)
LAYERS = [
    ("engine", ("ggviz.ggml", "ggviz.llama", "ggviz.trace", "ggviz.powerinfer.solver", "ggviz.run", "ggviz.fetch",
                "ggviz.progress")),
    ("capture", ("ggviz.capture",)),
    ("viz", ("ggviz.viz",)),
    ("tools", ("ggviz.tools", "ggviz.cli", "ggviz.__main__", "ggviz.powerinfer.pipeline")),
]
# packages whose __init__ imports nothing of ggviz (or only lazily, ggviz's own re-exports): above every layer
LAYER_FREE = ("ggviz", "ggviz.powerinfer")


def _layer(mod: str) -> int | None:
    for k, (_name, prefixes) in enumerate(LAYERS):
        if any(mod == p or mod.startswith(p + ".") for p in prefixes):
            return k
    return None


def test_every_module_has_a_layer():
    loose = sorted(m for m in _modules() if _layer(m) is None and m not in LAYER_FREE)
    assert not loose, f"modules in no layer (add them to LAYERS in {pathlib.Path(__file__).name}): {loose}"


def _back_arrows(graph) -> list[str]:
    return sorted(f"{m} ({LAYERS[_layer(m)][0]}) -> {t} ({LAYERS[_layer(t)][0]})"
                  for m in graph if _layer(m) is not None for t in graph[m]
                  if _layer(t) is not None and _layer(t) > _layer(m))


def test_no_import_runs_back_up_the_layers():
    """engine < capture < viz < tools: a module imports only from its own layer or below (0 arrows back up; before
    the capture layer, the views imported the export command twice)."""
    back = _back_arrows(_graph())
    assert not back, "imports back up the layers:\n" + "\n".join(back)


def test_views_never_import_commands():
    graph = _graph()
    bad = sorted(f"{m} -> {t}" for m in graph if m.startswith("ggviz.viz")
                 for t in graph[m] if _layer(t) == len(LAYERS) - 1)
    assert not bad, bad


def test_imports_at_module_top():
    """Function-level imports only for optional dependencies (inside try) or with a reason (allow-list)."""
    bad = []
    for mod, path in _modules().items():
        parents = {c: n for n in _nodes(path) for c in ast.iter_child_nodes(n)}
        for node in _nodes(path):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            chain, p = [], parents.get(node)
            while p is not None:
                chain.append(p)
                p = parents.get(p)
            in_func = any(isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) for p in chain)
            guarded = any(isinstance(p, ast.Try) for p in chain)
            if in_func and not guarded and mod not in LAZY_IMPORTS_ALLOWED:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "imports inside functions (move them to the top of the module):\n" + "\n".join(bad)


def test_impl_helpers_defined_once():
    where = {name: [] for name in IMPL_HELPERS}
    for path in PKG.rglob("*.py"):
        for node in _tree(path).body:        # module-level names (methods may share a name)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in where:
                where[node.name].append(str(path.relative_to(ROOT)))
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id in where:
                        where[t.id].append(f"{path.relative_to(ROOT)} (assigned)")
    wrong = {k: v for k, v in where.items() if v != ["ggviz/ggml/impl.py"]}
    assert not wrong, wrong


def test_one_marker_for_departures_from_c():
    for old in ("a ggviz addition: x", "(no C counterpart)", "Also Python-only:", "Python additions (not in C)",
                "ggviz adds two", "ggviz goes further", "nb (ggviz only)", "(ggviz; llama.cpp ...)", "x (ggviz): y"):
        assert OTHER_DEPARTURE_MARKERS.search(old), old
    assert not OTHER_DEPARTURE_MARKERS.search("ggviz: a departure, marked the one way")
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in sorted(PKG.rglob("*.py"))
           for i, line in enumerate(p.read_text().splitlines(), 1) if OTHER_DEPARTURE_MARKERS.search(line)]
    assert not bad, "mark departures from C with 'ggviz:' (grep -rn 'ggviz:' ggviz lists them):\n" + "\n".join(bad)


def _ruff():
    exe = shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return exe


def test_ruff_clean():
    targets = [str(ROOT / d) for d in ("ggviz", "tests", "benchmarks", "tools", "notebooks") if (ROOT / d).exists()]
    r = subprocess.run([_ruff(), "check", "--no-cache", "--output-format", "concise", *targets], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_layout_checks_can_fail(tmp_path):
    """The cycle check sees a cycle made through a function-level import, and ruff flags an unused import."""
    g = {"a": {"b"}, "b": set()}
    assert list(graphlib.TopologicalSorter(g).static_order()) == ["b", "a"]
    g["b"].add("a")
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter(g).static_order())
    # a view importing a command, and the engine importing capture, are arrows back up
    assert _back_arrows({"ggviz.viz.widgets.explorer": {"ggviz.tools.export", "ggviz.capture"},
                         "ggviz.llama.context": {"ggviz.capture.decode", "ggviz.ggml"}}) == [
        "ggviz.llama.context (engine) -> ggviz.capture.decode (capture)",
        "ggviz.viz.widgets.explorer (viz) -> ggviz.tools.export (tools)"]
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    r = subprocess.run([_ruff(), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "F401" in r.stdout


# ---------------------------------------------------------------------------------------------------- long functions

MAX_FUNCTION_LINES = 120

# qualified name -> the C function it mirrors, kept whole so that it reads (and diffs) against upstream
MIRRORED_LONG_FUNCTIONS = {
    "backend_sched_split_graph": "ggml/src/ggml-backend.cpp: ggml_backend_sched_split_graph",
    "graph_compute_hybrid": "PowerInfer ggml.c: ggml_graph_compute with ggml_graph_compute_thread_hybrid",
    "GGUFFile._parse": "ggml/src/gguf.cpp: gguf_init_from_file_impl",
    "batch_allocr_init": "llama.cpp src/llama-batch.cpp: llama_batch_allocr::init",
}

def _long_functions(tree, limit: int):
    """(qualified name, first line, length) of every function or method over ``limit`` lines, nested ones too."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef) and child.end_lineno - child.lineno + 1 > limit:
                    out.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                walk(child, name + ".")
            else:
                walk(child, prefix)
    walk(tree, "")
    return out


def test_no_long_functions():
    """The long view functions were split into named phases (issue #19); a function that mirrors a long C function
    stays whole."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for name, line, n in _long_functions(_tree(path), MAX_FUNCTION_LINES):
            if name not in MIRRORED_LONG_FUNCTIONS:
                bad.append(f"{rel}:{line}: {name} ({n} lines)")
    assert not bad, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named phases, or list a mirror of "
                     f"a long C function in MIRRORED_LONG_FUNCTIONS):\n" + "\n".join(bad))


# ---------------------------------------------------------------------------------------------------- JS / CSS

_JS = re.compile(r"\bfunction\b\s*\w*\s*\([^)]*\)\s*\{|=>\s*[{(\w]|\baddEventListener\(|\bquerySelector(All)?\(|"
                 r"\bexport\s+default\b|\b(const|let|var)\s+\w+\s*=")
_CSS_RULE = re.compile(r"[^{}\s][^{}]*\{\s*[-\w]+\s*:[^{}]*\}")
_STYLE_WITH_RULES = re.compile(r"<style[^>]*>\s*[^<\s{]")


def _browser_code(text: str) -> list[str]:
    """What a string holds that belongs in a .js / .css file: "JavaScript", "CSS" (empty: nothing)."""
    why = []
    if _JS.search(text):
        why.append("JavaScript")
    if len(_CSS_RULE.findall(text)) >= 2 or _STYLE_WITH_RULES.search(text):
        why.append("CSS")
    return why


def _code_strings(tree: ast.Module):
    """(line, text) of the string constants of a module, docstrings left out (they may quote code)."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_javascript_or_css_in_python_strings():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        for line, text in _code_strings(_tree(path)):
            why = _browser_code(text)
            if why:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {' and '.join(why)}: {text.strip()[:60]!r}")
    assert not bad, "browser code in Python strings (move it into ggviz/templates/):\n" + "\n".join(bad)


def test_browser_code_check_can_fail():
    """The heuristic flags what explorer.py and _base.py held before the move (an anywidget module with a stylesheet
    in its markup, a page with a <style> rule) and passes the strings the views still build from data."""
    esm = """
function render({ model, el }) {
  el.innerHTML = `<style class="x"> .a { display:flex; } .b { margin:2px; } </style><div class="a"></div>`;
  const q = (s) => el.querySelector(s);
}
export default { render };
"""
    assert _browser_code(esm) == ["JavaScript", "CSS"]
    assert _browser_code("<html><style>body{font-family:sans-serif}</style></html>") == ["CSS"]
    assert _browser_code("#ggv1dag-n3 path, #ggv1dag-n3 polygon { stroke: #d50000 !important; }") == []
    assert _browser_code("<div style='display:flex;gap:8px'>the function ggml_add (its src: a, b)</div>") == []
    module = 'def f():\n    """Quotes ``function f() { return 1; }``."""\n    return "const a = 1;"\n'
    assert [(line, _browser_code(t)) for line, t in _code_strings(ast.parse(module))] == [(3, ["JavaScript"])]
    long_fn = "def f():\n" + "    x = 1\n" * 130
    assert _long_functions(ast.parse(long_fn), MAX_FUNCTION_LINES) == [("f", 1, 131)]


def test_widget_templates_are_package_data():
    """Every file the live widgets load from ggviz/templates/ is shipped (pyproject's package-data globs)."""
    text = (ROOT / "pyproject.toml").read_text()
    globs = re.search(r"^ggviz = \[(.*?)\]", text, re.M | re.S).group(1)
    patterns = re.findall(r'"([^"]+)"', globs)
    files = [p.relative_to(PKG) for p in (PKG / "templates").rglob("*") if p.is_file()]
    missing = [str(f) for f in files if not any(f.match(g) for g in patterns)]
    assert files and not missing, missing
