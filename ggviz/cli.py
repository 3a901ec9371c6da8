"""The `ggviz` command line.

    ggviz fetch      download (once) and verify the default model; print its path
    ggviz demo ...   the main demo (ggviz/demo.py)
    ggviz version    print versions

Commands backed by a module (`demo`, `run`, `bench`, `graph`, `trace`, `report`) hand
all their remaining arguments to `ggviz.<module>.main(argv)` (or to the function named after a colon,
"ggviz.export:graph_main"), which parses its own options: to add one, write the module and add a line to
MODULE_COMMANDS.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import platform
import sys
from importlib import metadata

from ggviz import __version__
from ggviz.fetch import FetchError, fetch_default_model

# command -> (module under ggviz, one-line help)
MODULE_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ggviz.demo", "run the ggviz demo (arguments are passed to it; try `ggviz demo --help`)"),
    "run": ("ggviz.run", "generate text with the default model (`ggviz run -p PROMPT -n 64 [--chat]`)"),
    "bench": ("ggviz.bench", "decode/prefill speed vs a plain NumPy reference (and llama.cpp if importable)"),
    "graph": ("ggviz.export:graph_main",
              "draw the decode graph (`ggviz graph [--layer N | --full] [--format dot|svg|png] -o FILE`)"),
    "trace": ("ggviz.export:trace_main", "Chrome/Perfetto trace JSON of one decode compute (`ggviz trace -o FILE`)"),
    "report": ("ggviz.report", "standalone HTML walkthrough of one decode step (`ggviz report -o report.html`)"),
    "book": ("ggviz.book", "the notebooks, executed, as an offline HTML site (`ggviz book -o book/`)"),
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ggviz",
        description="ggviz: an educational visualizer of how ggml and llama.cpp run a language model.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("fetch", help="download (once) and verify the default model, then print its path")
    p.add_argument("--dest", metavar="DIR", help="directory to put the model in (default: see `ggviz.fetch`)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the path")

    for name, (_module, help_) in MODULE_COMMANDS.items():
        p = sub.add_parser(name, help=help_, add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER)

    sub.add_parser("version", help="print the versions of ggviz and its main dependencies")
    return parser


def _cmd_fetch(args: argparse.Namespace) -> int:

    try:
        path = fetch_default_model(dest_dir=args.dest, quiet=args.quiet)
    except FetchError as e:
        print(f"ggviz fetch: error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _cmd_module(name: str, argv: list[str]) -> int:
    module_name, _, func = MODULE_COMMANDS[name][0].partition(":")
    if importlib.util.find_spec(module_name) is None:
        print(f"ggviz {name}: not available yet ({module_name} does not exist in this checkout).",
              file=sys.stderr)
        return 2
    module = importlib.import_module(module_name)
    rc = getattr(module, func or "main")(argv)
    return rc if isinstance(rc, int) else 0


def _cmd_version() -> int:


    print(f"ggviz {__version__}")
    print(f"python {platform.python_version()}")
    for dist in ("numpy", "gguf", "libggml-python"):
        try:
            print(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            print(f"{dist} (not installed)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Module commands take their arguments verbatim (argparse would try to parse `--help` etc.).
    if argv and argv[0] in MODULE_COMMANDS:
        return _cmd_module(argv[0], argv[1:])
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "fetch":
        return _cmd_fetch(args)
    if args.command == "version":
        return _cmd_version()
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
