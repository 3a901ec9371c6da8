"""The guides a reader starts from: the README, and the "read the code" line that ends each notebook section.

* README.md: the two commands first, a Python example within its first 60 lines, under 200 lines, module-map rows
  one short line each.
* Every ``## `` section of notebooks/NN_*.py ends with ``*Read the code:* ggviz names ↔ file C names; file C names``:
  each ggviz name resolves (an importable module, then attributes), each C name is in tests/data/read_the_code_c.txt
  (checked against the upstream sources) under the file the line names.
"""
from __future__ import annotations

import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
C_LIST = ROOT / "tests" / "data" / "read_the_code_c.txt"
MARK = "*Read the code:*"


# ---- README

def readme_problems(text: str) -> list[str]:
    """What keeps a README from guiding: the commands not first, the first example late, too long, wide rows."""
    lines = text.splitlines()
    out = []
    head = "\n".join(lines[:12])
    if "./dev demo" not in head or "./dev test" not in head:
        out.append("the first lines must show `./dev demo` and `./dev test`")
    first = next((i for i, line in enumerate(lines) if line.strip() == "```python"), None)
    if first is None or first >= 60:
        out.append(f"the first Python example starts at line {None if first is None else first + 1}, not within 60")
    if len(lines) >= 200:
        out.append(f"{len(lines)} lines, not under 200 (history and figures go to docs/)")
    wide = [i + 1 for i, line in enumerate(lines) if line.startswith("| `ggviz") and len(line) > 130]
    if wide:
        out.append(f"module-map rows longer than 130 characters at lines {wide}")
    return out


def test_readme_guides():
    problems = readme_problems(README.read_text())
    assert not problems, problems


def test_readme_check_can_fail():
    long_readme = "# x\n\n" + "text\n" * 250 + "```python\nprint(1)\n```\n"
    problems = readme_problems(long_readme)
    assert len(problems) == 3, problems                 # no commands, example at line 253, 255 lines
    wide = "./dev demo\n./dev test\n```python\n```\n| `ggviz/x.py` | " + "y" * 130 + " |\n"
    assert readme_problems(wide) == ["module-map rows longer than 130 characters at lines [5]"]


# ---- notebooks

def sections(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(heading, markdown lines) of each ``## `` section of a jupytext percent source, up to the next heading."""
    out = []
    md = False
    for line in path.read_text().splitlines():
        if line.startswith("# %%"):
            md = line.startswith("# %% [markdown]")
            continue
        if md and line.startswith("# ## "):
            out.append((line[5:], []))
        elif md and out and line.startswith("#"):
            text = line[1:].strip()
            if text:
                out[-1][1].append(text)
    return out


def resolve(name: str):
    """ggviz.a.b.C.f -> the object: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def c_functions() -> set[tuple[str, str]]:
    rows = [line.split() for line in C_LIST.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {(f, n) for f, n in rows}


def read_the_code_problems(heading: str, last: str | None, known: set) -> list[str]:
    if last is None or not last.startswith(MARK):
        return [f"{heading!r}: the section does not end with a '{MARK}' line"]
    body = last[len(MARK):].strip()
    if body.count(" ↔ ") != 1:
        return [f"{heading!r}: expected 'ggviz names ↔ file C names; file C names', got {body!r}"]
    left, right = body.split(" ↔ ")
    out = []
    for name in left.split(", "):
        if not name.startswith("ggviz."):
            out.append(f"{heading!r}: {name!r} is not a fully qualified ggviz name")
            continue
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            out.append(f"{heading!r}: {name} does not resolve ({e})")
    for part in right.split("; "):
        file, _, names = part.partition(" ")
        for name in names.split(", "):
            if (file, name) not in known:
                out.append(f"{heading!r}: {file} {name} is not in {C_LIST.name}")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_section_ends_with_read_the_code(path):
    known = c_functions()
    secs = sections(path)
    assert secs, f"{path.name} has no ## sections"
    problems = [p for heading, lines in secs for p in read_the_code_problems(heading, lines[-1] if lines else None,
                                                                              known)]
    assert not problems, "\n".join(problems)


def test_read_the_code_check_can_fail():
    known = {("ggml.c", "ggml_add")}
    ok = f"{MARK} ggviz.ggml.ops.add ↔ ggml.c ggml_add"
    assert read_the_code_problems("s", ok, known) == []
    assert len(read_the_code_problems("s", "some other text", known)) == 1
    assert len(read_the_code_problems("s", f"{MARK} ggviz.ggml.ops.no_such_op ↔ ggml.c ggml_add", known)) == 1
    assert len(read_the_code_problems("s", f"{MARK} ggviz.ggml.ops.add ↔ ggml.c ggml_sub", known)) == 1
    assert len(read_the_code_problems("s", f"{MARK} ops.add ↔ ggml.c ggml_add", known)) == 1


def test_c_list_is_used():
    """Every C function the list keeps is named by some notebook (the list is the notebooks', not a catalogue)."""
    named = set()
    for path in NOTEBOOKS:
        for _, lines in sections(path):
            if lines and lines[-1].startswith(MARK) and " ↔ " in lines[-1]:
                for part in lines[-1].split(" ↔ ")[1].split("; "):
                    file, _, names = part.partition(" ")
                    named.update((file, n) for n in names.split(", "))
    assert not c_functions() - named, sorted(c_functions() - named)
