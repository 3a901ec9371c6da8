"""Fixtures shared by the test modules (a module that defines its own fixture of the same name uses that one)."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from ggviz import llama

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def model():
    """The default model (SmolLM2-135M-Instruct Q4_1), loaded with llama.cpp's default model parameters."""
    path = MODEL
    if not path.exists():
        from ggviz.fetch import fetch_default_model
        path = fetch_default_model(quiet=True)
    return llama.model_load_from_file(str(path), llama.model_default_params())


class NotebookRunner:
    """Executes notebooks the way ``ggviz book`` does (``book.execute``: a fresh kernel of this interpreter, the
    notebook's folder as its working directory), in a kernel that imports this checkout's ggviz. ``runner(path)``
    executes each notebook once per test session and hands out copies: tests/test_notebooks.py checks each one,
    tests/test_browser.py builds the book from the same runs instead of executing all of them a second time."""

    def __init__(self):
        # imported here, not at the top: ggviz.tools.book imports nbformat, whose jsonschema compiles a grammar on import
        # (2.5 s), which sessions that run no notebook need not pay
        from ggviz.tools import book
        self.book = book
        self._done: dict[Path, object] = {}

    def run(self, path) -> object:
        """Execute ``path`` now (no cache); a failing cell fails the calling test, naming the notebook and cell."""
        path = Path(path)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
            try:
                return self.book.execute(path)
            except self.book.BookError as e:
                pytest.fail(str(e), pytrace=False)

    def __call__(self, path):
        path = Path(path).resolve()
        if path not in self._done:
            try:
                self._done[path] = self.run(path)
            except pytest.fail.Exception as e:
                self._done[path] = e          # a notebook that failed fails every test that asks for it
        got = self._done[path]
        if isinstance(got, pytest.fail.Exception):
            pytest.fail(str(got), pytrace=False)
        return copy.deepcopy(got)


@pytest.fixture(scope="session")
def notebook_runner():
    return NotebookRunner()



# Parallel runs: `./dev test` runs pytest-xdist's `-n 2 --dist loadscope`, with the scheduler below. Each module's
# tests stay on one worker, so a module's fixtures (a loaded model, a Chromium) are built once, as in a serial run;
# the modules that ask for `notebook_runner` share a worker, so that every notebook is executed once per run, not once
# per worker (every module that asks for it must be in SHARED_WORKER, checked at collection: test_concepts.py, left
# out, executed 9 of the 10 notebooks a second time on the other worker). (Not xdist_group marks with --dist
# loadgroup: pytest-xdist 3.8 tags the marked tests by rewriting `item._nodeid`, which pytest 9 no longer reads, so
# the marks group nothing.)
SHARED_WORKER = {"test_notebooks.py": "notebooks", "test_browser.py": "notebooks", "test_concepts.py": "notebooks"}
# The longest groups start first, longest first (the book alone executes every notebook: ~250 s of the ~1450 s;
# then the modules whose tests decode on the faithful kernels or drive a browser, by their CI durations), the short
# modules after them in collection order: the worker that finishes its long group picks up short modules, so that
# the two workers finish together instead of one starting a long module while the other has nothing left.
FIRST = ("test_browser.py", "test_notebooks.py", "test_widgets.py", "test_graph_cache.py", "test_powerinfer_model.py",
         "test_explorer_browser.py", "test_misuse_cli.py", "test_sched.py", "test_powerinfer_hybrid.py",
         "test_report.py", "test_models_cli.py", "test_powerinfer_views.py", "test_sgemm.py", "test_demo.py",
         "test_flash_attn_llamacpp.py", "test_misuse_llama.py", "test_misuse_state.py", "test_explorer.py")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


@pytest.hookimpl(optionalhook=True)      # a pytest-xdist hook: without xdist installed, never called
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """loadscope, one scope per module (SHARED_WORKER's modules one scope together)."""

        def _split_scope(self, nodeid: str) -> str:
            name = _module(nodeid)
            return SHARED_WORKER.get(name, name)

    config.option.loadscopereorder = False      # the modules in the order collected (FIRST first), not by test count
    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    strays = sorted({_module(item.nodeid) for item in items if "notebook_runner" in getattr(item, "fixturenames", ())}
                    - SHARED_WORKER.keys())
    if strays:            # on another worker they would execute the notebooks a second time (~100-200 s)
        raise pytest.UsageError(f"tests/conftest.py: add {', '.join(strays)} to SHARED_WORKER: its tests use "
                                "notebook_runner, whose runs are shared only on one worker")
    if hasattr(config, "workerinput"):          # an xdist worker: every worker sorts its identical collection alike
        rank = {name: i for i, name in enumerate(FIRST)}
        # stable: FIRST in its order, then the other modules in collection order
        items.sort(key=lambda item: rank.get(_module(item.nodeid), len(FIRST)))
