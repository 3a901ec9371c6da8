"""pyproject.toml and environment.yml must list the same packages (runtime + test extra)."""
import pathlib
import re

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parent.parent

# conda-forge names whose Python package is named differently on PyPI
CONDA_TO_PYPI = {"python-graphviz": "graphviz"}
# conda entries that are not Python packages of ours: the interpreter, pip, and the `dot` program
CONDA_ONLY = {"python", "pip", "graphviz"}


def normalise(name: str) -> str:
    """PEP 503 normalised name of a requirement string ("Jinja2>=3" -> "jinja2")."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    return {normalise(r): r.replace(" ", "") for r in reqs}


def parse_environment_yml(text: str) -> tuple[list[str], list[str]]:
    """The conda and pip entries of a simple environment.yml (just enough YAML for ours)."""
    conda, pip = [], []
    section = None  # None | "deps" | "pip"
    deps_indent = None
    for raw in text.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            section = "deps" if line.strip() == "dependencies:" else None
            continue
        if section is None:
            continue
        item = line.strip()
        assert item.startswith("- "), f"unexpected line in environment.yml: {raw!r}"
        item = item[2:].strip().strip("'\"")
        if deps_indent is None:
            deps_indent = indent
        if indent == deps_indent:
            section = "deps"
            if item == "pip:":
                section = "pip"
            else:
                conda.append(item)
        elif section == "pip":
            pip.append(item)
        else:
            raise AssertionError(f"unexpected nesting in environment.yml: {raw!r}")
    return conda, pip


def environment_requirements() -> dict[str, str]:
    conda, pip = parse_environment_yml((ROOT / "environment.yml").read_text())
    out = {}
    for item in conda:
        name = normalise(item)
        if name in CONDA_ONLY:
            continue
        name = CONDA_TO_PYPI.get(name, name)
        assert name not in out, f"{name} listed twice in environment.yml"
        out[name] = item.replace(" ", "")
    for item in pip:
        if item.startswith("-"):  # "-e ." installs ggviz itself
            continue
        name = normalise(item)
        assert name not in out, f"{name} listed twice in environment.yml"
        out[name] = item.replace(" ", "")
    return out


def test_parser_sees_pip_section():
    conda, pip = parse_environment_yml(
        "name: x\ndependencies:\n  - python=3.11\n  - numpy>=1  # c\n  - pip\n  - pip:\n      - gguf\n      - -e .\n"
    )
    assert conda == ["python=3.11", "numpy>=1", "pip"]
    assert pip == ["gguf", "-e ."]


def test_same_packages_in_pyproject_and_environment_yml():
    py = pyproject_requirements()
    env = environment_requirements()
    only_py = sorted(set(py) - set(env))
    only_env = sorted(set(env) - set(py))
    assert not only_py and not only_env, (
        f"pyproject.toml and environment.yml disagree: only in pyproject.toml: {only_py}; "
        f"only in environment.yml: {only_env}"
    )


def test_exact_pins_agree():
    """An exact `==` pin (the ggml oracle's version) must be the same on both sides."""
    py = pyproject_requirements()
    env = environment_requirements()
    for name, req in py.items():
        if "==" in req:
            pinned = req.split("==")[-1]
            assert re.split(r"==?", env[name])[-1] == pinned, (
                f"{name} is pinned to {pinned} in pyproject.toml but environment.yml has {env[name]!r}"
            )
