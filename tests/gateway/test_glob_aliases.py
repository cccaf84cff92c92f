"""Glob aliases (gateway/config/aliases.py): an entry answers to every name its glob matches,
an exact alias anywhere wins, upstream entries stay exact, and metrics name the glob."""
from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from gateway.config import ConfigError, ModelNotFoundError, load_config
from tests.support.ggufgen import write_servable


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    for name in ("big", "small", "other"):
        write_servable(tmp_path / "models" / f"{name}.gguf")
    return tmp_path


def config_file(folder: Path, text: str) -> Path:
    path = folder / "modelyard.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


CLAUDE = """
    models:
      - model: models/big.gguf
        aliases: [big, "claude-*"]
      - model: models/small.gguf
        aliases: [claude-haiku-4-5, "claude-3-?-haiku*"]
      - model: models/other.gguf
        aliases: ["*"]
"""


def test_a_glob_answers_every_name_it_matches(folder: Path) -> None:
    config = load_config(config_file(folder, CLAUDE))
    for name in ("claude-sonnet-4-6", "claude-opus-4-1-20250805", "claude-"):
        assert config.resolve(name).name == "big"
        assert config.is_local(name) and not config.is_local(name, exact=True)
    assert config.configured_alias("claude-sonnet-4-6") == "claude-*"


def test_an_exact_alias_wins_over_a_glob_that_comes_first(folder: Path) -> None:
    config = load_config(config_file(folder, CLAUDE))
    assert config.resolve("claude-haiku-4-5").name == "claude-haiku-4-5"
    assert config.configured_alias("claude-haiku-4-5") == "claude-haiku-4-5"


def test_globs_are_tried_in_file_order(folder: Path) -> None:
    config = load_config(config_file(folder, CLAUDE))
    # "claude-3-5-haiku-latest" matches both "claude-*" (first) and "claude-3-?-haiku*"
    assert config.resolve("claude-3-5-haiku-latest").name == "big"
    assert config.resolve("gpt-4o").model.name == "other.gguf"  # the catch-all, last


def test_globs_match_case_sensitively_and_unmatched_names_are_404s(folder: Path) -> None:
    config = load_config(config_file(folder, """
        models:
          - model: models/big.gguf
            aliases: ["claude-*"]
    """))
    with pytest.raises(ModelNotFoundError):
        config.resolve("Claude-Sonnet")
    with pytest.raises(ModelNotFoundError):
        config.resolve("gpt-4o")


def test_an_upstream_entry_may_not_answer_to_a_glob(folder: Path) -> None:
    path = config_file(folder, """
        models:
          - model: models/big.gguf
            aliases: [big]
          - upstream: http://127.0.0.1:9
            aliases: ["gpt-*"]
    """)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "models.1.aliases.0" in str(info.value) and "glob" in str(info.value)


def test_requests_by_a_globbed_name_are_served_and_counted_under_the_glob(folder: Path) -> None:
    from tests.support.servers import Server

    server = Server(config_file(folder, CLAUDE)).start()
    try:
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "claude-sonnet-4-6", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "claude-sonnet-4-6"  # the reply names what was asked
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'model="claude-*"' in metrics
        assert 'model="claude-sonnet-4-6"' not in metrics
    finally:
        server.stop()
