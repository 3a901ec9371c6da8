"""Misusing the `ggviz` command line: every user error is one or two lines on stderr (what is wrong, what to do), a
non-zero exit (2 for a bad argument, as argparse, 1 for an error while running, 130 for Ctrl-C) and no traceback,
unless --debug (or GGVIZ_DEBUG=1) asks for it.

The cases that load the model, need a process (Ctrl-C, a closed pipe, --debug's traceback) or check an entry point
run the real command, ``python -m ggviz ...`` in the checkout, as a subprocess; those that load the model run under
an RLIMIT_AS (a regression that allocates without bound fails instead of swapping the machine) and a
timeout (a guard against a hang, not a benchmark). The bad arguments (exit 2, refused before any work), a file
that is no GGUF and the --debug spellings but one call ``cli.main`` in this process, what ``python -m ggviz`` calls (``sys.exit(main())``), with stdout and stderr captured:
the same exit code and lines, without a ~2 s interpreter start and import each (~25 of them).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import pathlib
import re
import resource
import signal
import subprocess
import sys
import time

import pytest

from ggviz import cli
from ggviz.ggml.gguf import GGUFError, load_gguf
from ggviz.ggml.impl import GGMLError

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
AS_LIMIT = 3 << 30          # address space for commands that load the model (a normal `ggviz run` maps ~2 GiB)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
    env.update(extra)
    return env


def _limit_as():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def ggviz(*args, env=None, timeout=180, limit=False):
    return subprocess.run([sys.executable, "-m", "ggviz", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env=env or _env(), timeout=timeout, preexec_fn=_limit_as if limit else None)


def ggviz_here(*args):
    """``ggviz ARGS`` in this process (``cli.main``, what ``python -m ggviz`` runs), as a CompletedProcess."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            pytest.MonkeyPatch.context() as mp:
        mp.delenv(cli.DEBUG_ENV, raising=False)
        try:
            rc = cli.main([str(a) for a in args])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["ggviz", *map(str, args)], rc, out.getvalue(), err.getvalue())


def assert_user_error(r, rc, *needles):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == rc, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert 1 <= len(lines) <= 2, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr
    return lines


@pytest.fixture(scope="module")
def model_path():
    if MODEL.exists():
        return MODEL
    from ggviz.fetch import fetch_default_model
    return pathlib.Path(fetch_default_model(quiet=True))


@pytest.fixture(scope="module")
def hostile_chat_model(model_path, tmp_path_factory):
    """The default model with its chat template replaced (same byte length, so no offset moves) by one asking for
    10 GB: what a crafted GGUF can do to `ggviz run --chat`."""
    data = model_path.read_bytes()
    tmpl = load_gguf(str(model_path)).kv["tokenizer.chat_template"].encode()
    evil = b"{{ 'a' * 10000000000 }}"
    evil += b"{#" + b" " * (len(tmpl) - len(evil) - 4) + b"#}"
    assert len(evil) == len(tmpl) and data.count(tmpl) == 1
    path = tmp_path_factory.mktemp("hostile") / "hostile-chat.gguf"
    path.write_bytes(data.replace(tmpl, evil))
    return path


# ---------------------------------------------------------------------------------------- bad arguments: exit 2

def test_model_path_missing_directory_or_a_name(tmp_path):
    lines = assert_user_error(ggviz_here("run", "-m", tmp_path / "missing.gguf"), 2, "argument -m/--model: no such file")
    assert lines[1] == "ggviz run: see `ggviz run --help`"
    assert_user_error(ggviz_here("run", "-m", tmp_path), 2, "is a directory, not a .gguf file")
    # a bare word that is no model of the registry: the error lists the names (smollm2, gemma3-270m are models)
    assert_user_error(ggviz_here("run", "-m", "smollm3"), 2, "no such file: 'smollm3' (give smollm2|gemma3-270m or the "
                      "path of a .gguf file", "leave the option out for the default model")


@pytest.mark.parametrize("args,needle", [
    (("run", "-t", "0"), "argument -t/--threads: 0 is out of range: must be 1..512 (GGML_MAX_N_THREADS)"),
    (("run", "-t", "1000"), "argument -t/--threads: 1000 is out of range: must be 1..512"),
    (("run", "-t", "two"), "argument -t/--threads: 'two' is not an integer"),
    (("run", "-n", "-1"), "argument -n/--n-predict: -1 is out of range: must be >= 0"),
    (("run", "-c", "-5"), "argument -c/--ctx-size: -5 is out of range: must be >= 0"),
    (("run", "--seed", "4294967296"), "argument --seed: 4294967296 is out of range: must be -1..4294967295"),
    (("run", "--bogus"), "ggviz run: error: unrecognized arguments: --bogus"),
    (("report", "-t", "0"), "argument -t/--threads: 0 is out of range"),
    (("trace", "-t", "600"), "argument -t/--threads: 600 is out of range"),
    (("demo", "--threads", "0"), "argument --threads: 0 is out of range"),
    (("demo", "-n", "-3"), "argument -n/--n-predict: -3 is out of range"),
    (("bench", "--threads", "0,2"), "argument --threads: 0 is out of range"),
    (("bench", "--threads", ","), "argument --threads: ',' names no thread count"),
    (("bench", "--decode", "0"), "argument --decode: 0 is out of range: must be >= 1"),
    (("graph", "--n-kv", "0"), "argument --n-kv: 0 is out of range: must be >= 1"),
    (("frob",), "ggviz: error: argument COMMAND: invalid choice: 'frob'"),
])
def test_bad_numbers_and_options(args, needle):
    assert_user_error(ggviz_here(*args), 2, needle)


def test_output_paths_checked_before_any_work(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert_user_error(ggviz_here("report", "-o", tmp_path), 2, "argument -o/--out:", "is a directory; give a file name")
    assert_user_error(ggviz_here("report", "-o", a_file / "r.html"), 2, "cannot write", "is not a directory")
    assert_user_error(ggviz_here("graph", "-o", a_file / "sub" / "g.svg"), 2, "argument -o/--out: cannot write")
    assert_user_error(ggviz_here("trace", "-o", a_file / "t.json"), 2, "argument -o/--out: cannot write")
    assert_user_error(ggviz_here("demo", "--out", a_file), 2, "argument --out:", "is a file, not a folder")
    if pathlib.Path("/proc/self").exists():       # not writable, not even by root
        t0 = time.perf_counter()
        assert_user_error(ggviz_here("report", "-o", "/proc/ggviz-report.html"), 2,
                          "cannot write '/proc/ggviz-report.html': cannot create a file in '/proc'")
        assert time.perf_counter() - t0 < 60      # refused before the model loads (a guard, not a benchmark)


def test_module_entry_points_share_the_errors():
    r = subprocess.run([sys.executable, "-m", "ggviz.tools.run", "-t", "0"], cwd=ROOT, capture_output=True, text=True,
                       env=_env(), timeout=120)
    assert_user_error(r, 2, "ggviz run: error: argument -t/--threads: 0 is out of range")


# ------------------------------------------------------------------------------------ runtime errors: exit 1

def test_not_a_gguf_and_a_truncated_one(tmp_path, model_path):
    text = tmp_path / "passwd.gguf"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    # refused while reading the file's first bytes: in this process (the subprocess cases below load a real model)
    lines = assert_user_error(ggviz_here("run", "-m", text, "-n", "1"), 1,
                              "invalid GGUF at offset 0", "magic: expected b'GGUF', found b'root'")
    assert lines[1] == "ggviz run: -m/--model needs a GGUF model file (leave it out for the default model)"
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model_path.read_bytes()[:4096])
    assert_user_error(ggviz_here("report", "-m", cut, "-o", tmp_path / "r.html"), 1, "ggviz report: error:", "cut.gguf")
    assert not (tmp_path / "r.html").exists()


def test_hostile_chat_template_in_the_model(hostile_chat_model):
    t0 = time.perf_counter()
    r = ggviz("run", "-m", hostile_chat_model, "--chat", "-p", "hi", "-n", "1", limit=True)
    lines = assert_user_error(r, 1, "ggviz run: error: chat template line 1: over a limit: a str * 10,000,000,000")
    assert lines[1] == "ggviz run: the model's chat template cannot be used: run without --chat, or use another model"
    assert time.perf_counter() - t0 < 120          # a guard against a hang, not a benchmark
    # without --chat the template is never rendered
    assert ggviz("run", "-m", hostile_chat_model, "-p", "hi", "-n", "1", limit=True).returncode == 0


def test_prompt_longer_than_the_context(model_path):
    assert_user_error(ggviz("run", "-m", model_path, "-c", "256", "-n", "300", limit=True), 1,
                      "ggviz run: error: prompt (", "n_predict (300) exceed n_ctx (256)")


def test_context_too_big_names_what_fits(model_path):
    """-c 100000000 asks for terabytes of KV cache: a short error, not a traceback (under RLIMIT_AS), refused before
    allocating (llama.init_from_model's up-front check), naming the n_ctx that would fit."""
    t0 = time.perf_counter()
    r = ggviz("run", "-m", model_path, "-c", "100000000", "-n", "1", limit=True)
    assert_user_error(r, 1, "ggviz run: error:")
    numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", r.stderr)]
    assert any(256 <= n < 100_000_000 for n in numbers), r.stderr
    assert "-c/--ctx-size" in r.stderr.splitlines()[-1], r.stderr
    assert time.perf_counter() - t0 < 30            # refused up front: no allocation first


def test_fetch_into_an_unwritable_folder():
    if not pathlib.Path("/proc/self").exists():
        pytest.skip("needs /proc (a folder nobody can write)")
    assert_user_error(ggviz("fetch", "--dest", "/proc/ggviz-models"), 1, "ggviz fetch: error: cannot create")


# --------------------------------------------------------------------------------- --debug and GGVIZ_DEBUG=1

def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    """One process shows the traceback end to end; the other spellings of --debug are checked in this process:
    ``cli.main`` re-raises the error (what the interpreter then prints as that traceback) instead of reporting it."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    assert_user_error(ggviz_here("run", "-m", bad), 1, "invalid GGUF")
    r = ggviz("--debug", "run", "-m", bad)
    assert r.returncode == 1
    assert "Traceback (most recent call last)" in r.stderr and "ggviz.ggml.gguf.GGUFError" in r.stderr
    log = logging.getLogger("ggviz")            # --debug sends the engine's warnings to stderr: restored after
    monkeypatch.setattr(log, "handlers", list(log.handlers))
    monkeypatch.setattr(log, "level", log.level)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    with pytest.raises(GGUFError):
        cli.main(["run", "-m", str(bad), "--debug"])
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(GGUFError):
        cli.main(["run", "-m", str(bad)])
    monkeypatch.setenv(cli.DEBUG_ENV, "0")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert cli.main(["run", "-m", str(bad)]) == 1
    assert "invalid GGUF" in err.getvalue() and "Traceback" not in err.getvalue()


# ----------------------------------------------------------------------------------- Ctrl-C and a closed pipe

def _as_from_a_terminal():
    # Ctrl-C in a terminal: SIGINT at its default, whatever this process inherited (a shell's background job, or a
    # test worker, ignores SIGINT, and a Python started with it ignored keeps it ignored: no KeyboardInterrupt)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _limit_as()


def test_interrupt_prints_one_line_and_exits_130(model_path):
    p = subprocess.Popen([sys.executable, "-m", "ggviz", "run", "-m", str(model_path), "-n", "500", "-p", "Once"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                         preexec_fn=_as_from_a_terminal)
    try:
        assert p.stdout.read(4) == b"Once"          # the model is loaded, generation is starting
        time.sleep(1.0)                             # into the decode loop
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == cli.EXIT_INTERRUPTED, err.decode()[-3000:]
    assert err.decode().strip().splitlines() == ["interrupted"]


def test_closed_stdout_is_quiet(model_path, tmp_path):
    with open(tmp_path / "stderr", "w+b") as errf:
        p = subprocess.Popen([sys.executable, "-m", "ggviz", "run", "-m", str(model_path), "-n", "40", "-p", "Once"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=errf, env=_env(), preexec_fn=_limit_as)
        try:
            assert p.stdout.read(4) == b"Once"
            p.stdout.close()                        # like `ggviz run | head -c 4`
            p.wait(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        errf.seek(0)
        err = errf.read()
    assert p.returncode == cli.EXIT_BROKEN_PIPE, err.decode()[-3000:]
    assert err == b""


# ------------------------------------------------------------------------------------ the mapping, in-process

def test_report_error_maps_the_engine_errors(capsys):
    assert cli.report_error("run", GGUFError("x.gguf", 0, "magic", b"GGUF", b"root")) == 1
    assert capsys.readouterr().err.splitlines() == [
        "ggviz run: error: x.gguf: invalid GGUF at offset 0 (0x0): magic: expected b'GGUF', found b'root'",
        "ggviz run: -m/--model needs a GGUF model file (leave it out for the default model)"]
    assert cli.report_error("report", FileNotFoundError(2, "No such file or directory", "/x/y.html")) == 1
    assert capsys.readouterr().err.splitlines() == ["ggviz report: error: No such file or directory: '/x/y.html'",
                                                    "ggviz report: check the path"]
    assert cli.report_error("run", MemoryError()) == 1
    assert capsys.readouterr().err.splitlines()[0] == "ggviz run: error: out of memory"
    assert cli.report_error("run", GGMLError("ggml_threadpool_new: n_threads must be in 1..512,\ngot 1000")) == 1
    assert capsys.readouterr().err.splitlines()[0] == \
        "ggviz run: error: ggml_threadpool_new: n_threads must be in 1..512, got 1000"
    # Ctrl-C stays an interrupt even when a worker wrapped it in another error
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise GGMLError("ggml_graph_compute: worker 1 failed: KeyboardInterrupt") from k
    except GGMLError as wrapped:
        assert cli.report_error("run", wrapped) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"
    # a bug is not a user error: it keeps its traceback
    assert cli.report_error("run", TypeError("unsupported operand")) is None
    assert cli.report_error("run", RecursionError()) is None


def test_explore_on_a_busy_port_fails_in_two_lines_and_otherwise_binds_the_port_it_prints(monkeypatch, capsys):
    """`ggviz explore` on a busy port printed the requested URL while Jupyter served on the next free one (Voilà's
    port_retries). A busy port is now a two-line error, and Voilà is told to take exactly the printed port (no
    retries: if another process takes it in between, Voilà fails rather than moving)."""
    import socket
    import subprocess
    pytest.importorskip("voila")
    from ggviz import cli
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["explore", "--port", str(port), "--no-browser"]) == 1
        out = capsys.readouterr()
        err = out.err.strip().splitlines()
        assert err == [f"ggviz explore: error: port {port} on 127.0.0.1 is in use",
                       "ggviz explore: choose another with --port N"] and out.out == ""
    assert calls == []                         # Voilà was not started
    # the port is free now: Voilà gets it, and only it
    assert cli.main(["explore", "--port", str(port), "--no-browser"]) == 0
    (cmd,) = calls
    assert f"--port={port}" in cmd and "--Voila.port_retries=0" in cmd and "--Voila.ip=127.0.0.1" in cmd
    assert f"http://127.0.0.1:{port}/" in capsys.readouterr().out
