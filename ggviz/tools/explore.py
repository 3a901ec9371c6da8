"""``ggviz explore``: the linked decode explorer (``ggviz.viz.widgets.explorer.DecodeExplorer``) served by Voilà.

    ggviz explore [-p PROMPT] [-t THREADS] [-m MODEL] [--port N] [--no-browser] [--no-values]

Writes a one-cell notebook that records a decode step and shows the explorer into a temporary folder, and runs
``voila`` on it (127.0.0.1 only); Ctrl-C stops it. Voilà shows only the widget: no code, no kernel prompt.
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile

from .. import cli
from ..capture import DEFAULT_PROMPT


def notebook(prompt: str, threads: int, model: str | None, values: bool = True) -> dict:
    """The notebook Voilà serves (nbformat 4, as plain JSON: nbformat itself is not needed to write it)."""
    load = f"load_model({model!r})" if model else "load_model()"
    src = ("from ggviz.run import load_model\n"
           "from ggviz.viz.widgets.explorer import DecodeExplorer\n"
           f"ex = DecodeExplorer.record({prompt!r}, threads={threads}, model={load}, values={values})\n"
           "ex.select_phase('compute')        # the first MUL_MAT the threads share; any model has one\n"
           "ex")
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "cells": [{"cell_type": "code", "id": "explorer", "metadata": {}, "execution_count": None,
                       "outputs": [], "source": src}]}


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Can a server bind ``host:port`` now? (A test bind, closed at once; SO_REUSEADDR as Tornado sets it, so a
    port in TIME_WAIT counts as free, as it is for Voilà.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="ggviz explore", description="serve the linked decode explorer (graph, bytes, "
                            "thread lanes, scheduler, values of one decode step) with Voilà")
    ap.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help=f"prompt (default: {DEFAULT_PROMPT!r})")
    ap.add_argument("-t", "--threads", type=cli.thread_count, default=2, help="threads (default 2)")
    ap.add_argument("-m", "--model", default=None, type=cli.model_file,
                    help="GGUF path (default: the default model)")
    ap.add_argument("--port", type=cli.int_arg(1, 65535, "port"), default=8866, help="port (default 8866)")
    ap.add_argument("--no-browser", action="store_true", help="do not open a browser")
    ap.add_argument("--no-values", action="store_true",
                    help="skip the second run that copies every node's output (faster start, no values pane)")
    a = ap.parse_args(argv)
    try:
        import voila  # noqa: F401
    except ImportError:
        print("ggviz explore: error: Voilà is not installed (pip install voila)", file=sys.stderr)
        return 1
    if not port_free(a.port):
        print(f"ggviz explore: error: port {a.port} on 127.0.0.1 is in use\n"
              f"ggviz explore: choose another with --port N", file=sys.stderr)
        return 1
    d = pathlib.Path(tempfile.mkdtemp(prefix="ggviz-explore-"))
    nb = d / "ggviz_explorer.ipynb"
    nb.write_text(json.dumps(notebook(a.prompt, a.threads, a.model and os.path.abspath(a.model), not a.no_values), indent=1))
    # exactly the port printed below: Voilà would otherwise move on to the next free one (port_retries, 50) while
    # the URL printed names this one; taken between the check above and Voilà's bind, Voilà fails instead
    cmd = [sys.executable, "-m", "voila", str(nb), f"--port={a.port}", "--Voila.port_retries=0",
           "--Voila.ip=127.0.0.1"]
    if a.no_browser:
        cmd.append("--no-browser")
    print(f"ggviz explore: http://127.0.0.1:{a.port}/ (recording the decode step takes ~10 s after the page opens; "
          f"Ctrl-C stops)")
    # the kernel runs in the temporary folder: it must import this same ggviz (a checkout run with PYTHONPATH=.
    # would otherwise find another one, or none)
    here = str(pathlib.Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here] + [os.path.abspath(p) for p in
                                                               os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.call(cmd, cwd=d, env=env)


if __name__ == "__main__":
    sys.exit(cli.command_main("explore"))
