"""Serving without a config: model files or a models folder, named as `modelyard scan` names them,
the folder watched (the command line's start-up behaviour: tests/system/test_cli.py)."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import openai
import pytest

from gateway.config import ConfigError, load_config
from gateway.fleet.watch import WatchOptions
from gateway.fleet.zeroconf import config_for_dir, config_for_files, dir_loader
from gateway.scan import main as scan_main
from tests.support.apps import Apps
from tests.support.ggufgen import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("m") / "SmolLM2-135M-Instruct.Q8_0.gguf")


def test_a_file_is_served_under_its_short_family_name(tiny: Path) -> None:
    config = config_for_files([tiny])
    assert config.models[0].aliases == ["smollm2", "smollm2-135m-instruct",
                                        "SmolLM2-135M-Instruct.Q8_0"]
    assert config.default_model == "smollm2"
    assert config.models[0].n_ctx == 256  # capped at the trained context, as scan writes it


def test_two_models_of_one_family_both_go_without_the_short_name(tmp_path: Path, tiny: Path) -> None:
    other = shutil.copy(tiny, tmp_path / "SmolLM2-360M-Instruct.Q8_0.gguf")
    config = config_for_files([tiny, other])
    assert [e.aliases[0] for e in config.models] == ["smollm2-135m-instruct",
                                                     "smollm2-360m-instruct"]


def test_scan_writes_the_aliases_zero_config_serves(tmp_path: Path, tiny: Path) -> None:
    d = tmp_path / "models"
    d.mkdir()
    shutil.copy(tiny, d / tiny.name)
    write_tiny_llama(d / "gemma-3-270m-it-q4_0.gguf", seed=5)
    out = tmp_path / "written.yaml"
    assert scan_main([str(d), "-o", str(out)]) == 0
    written = {e.model: e.aliases for e in load_config(out).models}
    served = {e.model: e.aliases for e in config_for_dir(d).models}
    assert written == served
    assert sorted(a[0] for a in served.values()) == ["gemma-3", "smollm2"]


def test_files_that_cannot_be_served_are_all_named(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    with pytest.raises(ConfigError) as err:
        config_for_files([junk, tmp_path / "missing.gguf"])
    assert "junk.gguf: not a GGUF" in str(err.value) and "missing.gguf: no such file" in str(err.value)
    with pytest.raises(ConfigError, match="no servable GGUF"):
        config_for_dir(tmp_path)


def test_a_watched_models_folder_serves_files_added_and_drops_files_removed(
        apps: Apps, tmp_path: Path, tiny: Path) -> None:
    d = tmp_path / "models"
    d.mkdir()
    shutil.copy(tiny, d / tiny.name)
    config = config_for_dir(d)
    server = apps.serve(config, config_path=d, load=dir_loader(config.host, config.port),
                        watch=WatchOptions(models_dir=True, step_ms=20, debounce_ms=100))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)

    def ids() -> set[str]:
        return {m.id for m in client.models.list().data}

    def wait_for(predicate, what: str) -> None:
        deadline = time.monotonic() + 20
        while not predicate(ids()):
            assert time.monotonic() < deadline, f"{what}: {ids()}"
            time.sleep(0.1)

    assert "smollm2" in ids()
    write_tiny_llama(tmp_path / "tmp.gguf", seed=7)
    os.replace(tmp_path / "tmp.gguf", d / "Qwen2.5-0.5B-Instruct-Q8_0.gguf")
    wait_for(lambda now: "qwen2.5" in now, "the added model is not served")
    reply = client.completions.create(model="qwen2.5", prompt="ab", max_tokens=2)
    assert reply.model == "qwen2.5"
    (d / tiny.name).unlink()
    wait_for(lambda now: "smollm2" not in now, "the removed model is still served")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="smollm2", prompt="ab", max_tokens=2)
