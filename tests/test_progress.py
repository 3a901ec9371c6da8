"""ggviz.progress: bars only where someone watches them (a terminal, Jupyter), never in CI logs or tests."""
from __future__ import annotations

import io
import subprocess
import sys

from ggviz import progress as P


class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_enabled_follows_the_terminal_and_the_environment(monkeypatch):
    monkeypatch.delenv(P.ENV_DISABLE, raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())          # captured / piped: off
    assert not P.enabled()
    monkeypatch.setattr(sys, "stderr", _TTY())                 # a terminal: on
    assert P.enabled()
    assert not P.enabled(disable=True)                         # e.g. --quiet
    monkeypatch.setenv(P.ENV_DISABLE, "1")                     # GGVIZ_NO_PROGRESS=1 wins over everything
    assert not P.enabled() and not P.enabled(disable=False)
    monkeypatch.setenv(P.ENV_DISABLE, "0")
    assert P.enabled()


def test_bar_draws_on_a_terminal_and_counts_steps(monkeypatch):
    monkeypatch.delenv(P.ENV_DISABLE, raising=False)
    err = _TTY()
    monkeypatch.setattr(sys, "stderr", err)
    with P.progress(total=2, desc="demo", unit="step", file=err, mininterval=0) as bar:
        with P.step(bar, "first"):
            pass
        with P.step(bar, "second"):
            pass
        assert bar.n == 2
    assert "demo" in err.getvalue() and "second" in err.getvalue() and "2/2" in err.getvalue()
    assert list(P.progress(range(3), desc="it")) == [0, 1, 2]
    b = P.progress(total=10_000_000, unit="B", file=err, mininterval=0)
    b.update(2_500_000)
    b.close()
    assert "2.50M/10.0M" in err.getvalue()          # bytes, scaled by 1000


def test_disabled_bar_is_silent_and_write_prints(monkeypatch, capsys):
    monkeypatch.setenv(P.ENV_DISABLE, "1")
    with P.progress(total=3, desc="quiet") as bar:
        with P.step(bar, "x"):
            P.write("a line")
    cap = capsys.readouterr()
    assert cap.out == "a line\n" and cap.err == ""


def test_the_engine_does_not_import_tqdm():
    code = ("import sys, ggviz, ggviz.ggml, ggviz.llama, ggviz.ggml.gguf, ggviz.trace; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tqdm' or m == 'ggviz.progress'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
