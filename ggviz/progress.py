"""Progress bars for the long-running commands: tqdm in a terminal, an ipywidgets bar in Jupyter (``tqdm.auto``).

Only the command-level modules use this (``fetch``, ``bench``, ``demo``, ``run``, ``cli``, the report): the engine
(``ggviz.ggml``, ``ggviz.llama``) never imports it, nor tqdm.

A bar is shown only where someone watches it: in Jupyter (an ipykernel is running), or when stderr is a terminal.
Elsewhere -- CI logs, pytest, output piped to a file -- it is disabled (a no-op object with the same methods), and
``GGVIZ_NO_PROGRESS=1`` disables it everywhere.

    from .progress import progress, step, write

    for sec in progress(SECTIONS, desc="report", unit="section"):  # wrap an iterable
        ...

    with progress(total=n_bytes, desc="download", unit="B") as bar:  # or count by hand; unit "B": kB/MB scaling
        bar.update(len(chunk))

    with progress(total=3, desc="ggviz demo", unit="step") as bar:   # named steps: the name shows while it runs
        with step(bar, "load the model"):
            ...

    write("a log line")            # print without tearing an active bar apart (tqdm.write), then flush

``progress`` returns a ``tqdm.auto.tqdm`` (``update``, ``set_postfix_str``, ``close``, a context manager, iterable
when given one); ``disable=True`` turns one bar off (e.g. a ``--quiet`` option), ``disable=False`` forces it on
(``GGVIZ_NO_PROGRESS=1`` still wins).
"""
from __future__ import annotations

import contextlib
import os
import sys

ENV_DISABLE = "GGVIZ_NO_PROGRESS"


def in_jupyter() -> bool:
    """True inside a Jupyter kernel (the test tqdm.auto makes: ipykernel's shell module is loaded)."""
    return "ipykernel.zmqshell" in sys.modules


def enabled(disable: bool | None = None) -> bool:
    """Whether a bar would be shown: not with ``GGVIZ_NO_PROGRESS=1``, nor ``disable=True``; with ``disable=None``
    only in Jupyter or when stderr is a terminal."""
    if os.environ.get(ENV_DISABLE, "").strip() not in ("", "0"):
        return False
    if disable is not None:
        return not disable
    if in_jupyter():
        return True
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):     # a replaced or closed stderr
        return False


def progress(iterable=None, desc: str | None = None, total: int | float | None = None, unit: str = "it",
             disable: bool | None = None, leave: bool = True, **kwargs):
    """A ``tqdm.auto.tqdm`` bar over ``iterable`` (or counting to ``total``), shown only where ``enabled``.

    ``unit="B"`` counts bytes with kB/MB/GB scaling (1000s). Extra keyword arguments go to tqdm."""

    if unit == "B":
        kwargs.setdefault("unit_scale", True)
        kwargs.setdefault("unit_divisor", 1000)
    # dynamic_ncols follows the terminal's width; the bar is drawn on stderr (stdout stays for the results)
    kwargs.setdefault("dynamic_ncols", True)
    # imported here, at the first bar: tqdm.auto brings asyncio, importlib.metadata and, in Jupyter, ipywidgets --
    # a sizeable share of a one-shot ``ggviz run``'s imports, which never shows a bar for a model already fetched
    from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc, total=total, unit=unit, disable=not enabled(disable), leave=leave, **kwargs)


@contextlib.contextmanager
def step(bar, what: str):
    """Show ``what`` next to ``bar`` while the block runs, then count one step."""
    bar.set_postfix_str(what, refresh=True)
    yield bar
    bar.update(1)


def write(msg: str = "", file=None) -> None:
    """Print a line (default stdout) without breaking the active bars (``tqdm.write``), and flush."""

    fp = sys.stdout if file is None else file
    auto = sys.modules.get("tqdm.auto")
    if auto is None:          # no bar was ever made (``progress`` imports tqdm): nothing to tear apart
        fp.write(f"{msg}\n")
    else:
        auto.tqdm.write(msg, file=fp)
    fp.flush()
