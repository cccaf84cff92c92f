"""`modelyard pull` against a fake Hugging Face hub on loopback (tests/support/fake_http.py),
never the network. The hub is modelled on its documented API: the tree listing
(/api/models/{repo}/tree/{rev}, lfs.oid = the file's sha256), /{repo}/resolve/{rev}/{file}
answering 302 to a CDN path with X-Linked-Etag, and the CDN serving ranges with an ETag.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import cli, scan
from gateway.fleet import zeroconf
from gateway.pull import HubError, PullError, pull
from tests.support.fake_http import FakeServer, Route, serving
from tests.support.ggufgen import write_tiny_llama


def _quiet(name: str, total: int, done: int) -> Callable[[int], None]:
    return lambda n: None


class Hub:
    def __init__(self, fake: FakeServer) -> None:
        self.fake = fake

    def publish(self, repo: str, files: dict[str, bytes], *, token: str | None = None,
                listed_sha: dict[str, str] | None = None, linked_sha: dict[str, str] | None = None,
                cut_after: dict[str, int] | None = None) -> None:
        """The repository `repo` with these files; `listed_sha` / `linked_sha` replace what the
        tree or the redirect says a file's sha256 is (to make them lie)."""
        tree = []
        for name, body in files.items():
            sha = hashlib.sha256(body).hexdigest()
            listed = (listed_sha or {}).get(name, sha)
            tree.append({"type": "file", "path": name, "size": 135, "oid": "0" * 40,
                         "lfs": {"oid": listed, "size": len(body), "pointerSize": 135}})
            cdn = f"/cdn/{repo}/{sha}"
            self.fake.routes[f"/{repo}/resolve/main/{name}"] = Route(
                redirect=cdn, token=token,
                headers={"X-Linked-Etag": f'"{(linked_sha or {}).get(name, sha)}"',
                         "X-Linked-Size": str(len(body))})
            self.fake.routes[cdn] = Route(body, headers={"ETag": f'"{sha}"'},
                                          cut_after=(cut_after or {}).get(name))
        tree.append({"type": "file", "path": "README.md", "size": 10, "oid": "1" * 40})
        tree.append({"type": "directory", "path": "extra", "oid": "2" * 40})
        self.fake.routes[f"/api/models/{repo}/tree/main"] = Route(json.dumps(tree).encode(),
                                                                  token=token)

    def asked(self, prefix: str) -> list[Any]:
        return [s for s in self.fake.seen if s.path.startswith(prefix)]


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    with serving() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield Hub(fake)


def blob(tag: str, size: int = 5000) -> bytes:
    return (tag.encode() * (size // len(tag) + 1))[:size]


REPO = "someone/Tiny-GGUF"
FILES = {"Tiny-Q8_0.gguf": blob("q8"), "Tiny-Q4_K_M.gguf": blob("q4km"),
         "Tiny-Q4_K_S.gguf": blob("q4ks"), "mmproj-Tiny-F16.gguf": blob("proj-f16"),
         "mmproj-Tiny-Q8_0.gguf": blob("proj-q8")}


def test_owner_repo_means_q4_k_m_through_the_redirect(hub: Hub, tmp_path: Path) -> None:
    hub.publish(REPO, FILES)
    [path] = pull(REPO, tmp_path, progress=_quiet)
    assert path == tmp_path / "Tiny-Q4_K_M.gguf" and path.read_bytes() == FILES[path.name]
    assert hub.asked(f"/cdn/{REPO}/")  # the redirect was followed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Tiny-Q4_K_M.gguf"]  # no .part left


def test_a_quant_tag_picks_that_file_in_any_case(hub: Hub, tmp_path: Path) -> None:
    hub.publish(REPO, FILES)
    [path] = pull(f"{REPO}:q8_0", tmp_path, progress=_quiet)
    assert path.name == "Tiny-Q8_0.gguf" and path.read_bytes() == FILES["Tiny-Q8_0.gguf"]


def test_a_url_names_one_file(hub: Hub, tmp_path: Path) -> None:
    hub.publish(REPO, FILES)
    url = f"https://huggingface.co/{REPO}/resolve/main/Tiny-Q4_K_S.gguf"
    [path] = pull(url, tmp_path, progress=_quiet)
    assert path.name == "Tiny-Q4_K_S.gguf" and path.read_bytes() == FILES[path.name]


def test_mmproj_brings_the_projector(hub: Hub, tmp_path: Path) -> None:
    hub.publish(REPO, FILES)
    paths = pull(f"{REPO}:Q8_0", tmp_path, mmproj=True, progress=_quiet)
    assert [p.name for p in paths] == ["Tiny-Q8_0.gguf", "mmproj-Tiny-Q8_0.gguf"]
    paths = pull(REPO, tmp_path / "b", mmproj=True, progress=_quiet)  # Q4_K_M: no such projector
    assert [p.name for p in paths] == ["Tiny-Q4_K_M.gguf", "mmproj-Tiny-F16.gguf"]


def test_an_interrupted_download_resumes_where_it_stopped(hub: Hub, tmp_path: Path) -> None:
    name = "Tiny-Q4_K_M.gguf"
    hub.publish(REPO, FILES, cut_after={name: 1234})
    with pytest.raises(HubError, match=r"broke off.*resume"):
        pull(REPO, tmp_path, progress=_quiet)
    part = tmp_path / f".{name}.part"
    assert part.stat().st_size == 1234 and not (tmp_path / name).exists()
    before = len(hub.asked("/cdn/"))
    [path] = pull(REPO, tmp_path, progress=_quiet)
    assert path.read_bytes() == FILES[name] and not part.exists()
    resumed = hub.asked("/cdn/")[before:]
    assert [s.headers.get("range") for s in resumed] == ["bytes=1234-"]


def test_a_wrong_digest_is_refused_and_deleted(hub: Hub, tmp_path: Path) -> None:
    name = "Tiny-Q4_K_M.gguf"
    other = hashlib.sha256(b"something else").hexdigest()
    hub.publish(REPO, FILES, listed_sha={name: other}, linked_sha={name: other})
    with pytest.raises(HubError, match=f"is not the {other} the hub publishes"):
        pull(REPO, tmp_path, progress=_quiet)
    assert list(tmp_path.iterdir()) == []


def test_a_listing_and_a_download_that_disagree_are_refused(hub: Hub, tmp_path: Path) -> None:
    other = hashlib.sha256(b"something else").hexdigest()
    hub.publish(REPO, FILES, linked_sha={"Tiny-Q4_K_M.gguf": other})
    with pytest.raises(HubError, match=r"listing says sha256 .* but its download says"):
        pull(REPO, tmp_path, progress=_quiet)


def test_404s_are_explained(hub: Hub, tmp_path: Path) -> None:
    with pytest.raises(HubError, match=r"not found on .* \(answered 404\): check the repository"):
        pull("nobody/Nothing-GGUF", tmp_path, progress=_quiet)
    hub.publish(REPO, FILES)
    with pytest.raises(PullError, match=r"no GGUF file for IQ2_XXS.*Tiny-Q4_K_M.gguf"):
        pull(f"{REPO}:IQ2_XXS", tmp_path, progress=_quiet)
    with pytest.raises(PullError, match=r"has no file Nope.gguf"):
        pull(f"https://huggingface.co/{REPO}/resolve/main/Nope.gguf", tmp_path, progress=_quiet)


def test_401_is_explained_and_hf_token_opens_it(hub: Hub, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    hub.publish(REPO, FILES, token="hf_secret")
    with pytest.raises(HubError, match=r"401: the repository is gated or private.*set HF_TOKEN"):
        pull(REPO, tmp_path, progress=_quiet)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubError, match="HF_TOKEN is not allowed"):
        pull(REPO, tmp_path, progress=_quiet)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    [path] = pull(REPO, tmp_path, progress=_quiet)
    assert path.read_bytes() == FILES["Tiny-Q4_K_M.gguf"]
    assert hub.asked(f"/{REPO}/resolve/")[-1].headers["authorization"] == "Bearer hf_secret"


def test_a_split_model_comes_whole_and_is_served_as_one(hub: Hub, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    first = write_tiny_llama(tmp_path / "src" / "Tiny-Q8_0.gguf", split_max_tensors=4)
    parts = sorted(first.parent.glob("Tiny-Q8_0-*-of-*.gguf"))
    assert len(parts) > 1
    hub.publish(REPO, {p.name: p.read_bytes() for p in parts})
    models = tmp_path / "models"
    paths = pull(f"{REPO}:Q8_0", models, progress=_quiet)
    assert [p.name for p in paths] == [p.name for p in parts]
    found = scan.scan_dir(models).found
    assert len(found) == 1 and found[0].path.name == parts[0].name
    config = zeroconf.config_for_dir(models)
    assert [e.model.name for e in config.models] == [parts[0].name]


def test_the_command_says_how_to_serve_it(hub: Hub, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "src").mkdir()
    model = write_tiny_llama(tmp_path / "src" / "Tiny-Q4_K_M.gguf")
    hub.publish(REPO, {model.name: model.read_bytes()})
    models = tmp_path / "models"
    assert cli.main(["pull", REPO, "--dir", str(models)]) == 0
    out = capsys.readouterr().out
    assert f"modelyard serve -m {models / model.name}" in out
    assert f"modelyard serve --models-dir {models}" in out and "scan" in out
    assert [e.model.name for e in zeroconf.config_for_dir(models).models] == [model.name]
    assert cli.main(["pull", "not a repo", "--dir", str(models)]) == 1
    assert "give owner/repo[:QUANT]" in capsys.readouterr().err


def test_the_models_folder_follows_modelyard_cache(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    from gateway.pull import models_dir

    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path))
    assert models_dir() == tmp_path / "models"


def test_a_server_watching_the_folder_serves_the_pull_at_once(hub: Hub, tmp_path: Path,
                                                              apps: Any) -> None:
    """Downloads are hidden .part files until the model is whole, so the watching server sees
    one model appear (never a half file it would skip or fail on), and serves it."""
    import time

    import openai

    from gateway.fleet.watch import WatchOptions

    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "SmolLM2-135M-Instruct.Q8_0.gguf", seed=1)
    (tmp_path / "src").mkdir()
    pulled = write_tiny_llama(tmp_path / "src" / "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", seed=7)
    hub.publish(REPO, {pulled.name: pulled.read_bytes()})
    config = zeroconf.config_for_dir(models)
    server = apps.serve(config, config_path=models, load=zeroconf.dir_loader(config.host,
                                                                            config.port),
                        watch=WatchOptions(models_dir=True, step_ms=20, debounce_ms=100))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    pull(REPO, models, progress=_quiet)
    deadline = time.monotonic() + 20
    while "qwen2.5" not in {m.id for m in client.models.list().data}:
        assert time.monotonic() < deadline, "the pulled model is not served"
        time.sleep(0.1)
    assert client.completions.create(model="qwen2.5", prompt="ab", max_tokens=2).model == "qwen2.5"


def test_scan_update_adds_the_pull_to_a_config(hub: Hub, tmp_path: Path) -> None:
    from gateway.config import load_config

    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "SmolLM2-135M-Instruct.Q8_0.gguf", seed=1)
    config = tmp_path / "modelyard.yaml"
    assert cli.main(["scan", str(models), "-o", str(config)]) == 0
    (tmp_path / "src").mkdir()
    pulled = write_tiny_llama(tmp_path / "src" / "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", seed=7)
    hub.publish(REPO, {pulled.name: pulled.read_bytes()})
    pull(REPO, models, progress=_quiet)
    assert cli.main(["scan", str(models), "--update", str(config)]) == 0
    loaded = load_config(config)
    assert sorted(e.model.name for e in loaded.models) == sorted(
        ["SmolLM2-135M-Instruct.Q8_0.gguf", pulled.name])


def test_hf_token_is_not_sent_to_the_download_host_it_redirects_to(
        hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = FILES["Tiny-Q4_K_M.gguf"]
    sha = hashlib.sha256(body).hexdigest()
    with serving() as cdn:  # another origin, as the hub's CDN is
        cdn.routes["/blob"] = Route(body, headers={"ETag": f'"{sha}"'})
        hub.fake.routes[f"/api/models/{REPO}/tree/main"] = Route(json.dumps([
            {"type": "file", "path": "Tiny-Q4_K_M.gguf",
             "lfs": {"oid": sha, "size": len(body)}}]).encode(), token="hf_secret")
        hub.fake.routes[f"/{REPO}/resolve/main/Tiny-Q4_K_M.gguf"] = Route(
            redirect=f"{cdn.url}/blob", token="hf_secret", headers={"X-Linked-Etag": f'"{sha}"'})
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        [path] = pull(REPO, tmp_path, progress=_quiet)
        assert path.read_bytes() == body
        assert cdn.seen and all("authorization" not in s.headers for s in cdn.seen)
