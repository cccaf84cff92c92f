"""Config checks about secrets: client keys are distinct, and no problem a config file has ever
shows a secret's value (in ConfigError, and so in the log, /admin/status and a reload's 422)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config
from tests.support.ggufgen import write_servable

SECRET = "sk-config-secret-4f3e2d1c"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    write_servable(tmp_path / "models" / "small.gguf")
    return tmp_path


def errors_of(folder: Path, text: str) -> list[str]:
    path = folder / "c.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.errors


def test_two_client_keys_with_one_value_are_an_error_naming_both(folder: Path) -> None:
    (folder / "ci.key").write_text(SECRET + "\n")
    errors = errors_of(folder, f"""
        auth:
          keys:
            - {{name: alice, key: {SECRET}}}
            - {{name: bob, key: sk-other-value}}
            - {{name: ci, key_file: ci.key}}
        models:
          - model: models/small.gguf
    """)
    [error] = errors
    assert "auth.keys.2.key" in error and "'ci'" in error and "'alice'" in error
    assert SECRET not in error


@pytest.mark.parametrize("where", [
    f"auth: {{keys: [{{name: a, key: [{SECRET}]}}]}}",          # a list, not a string
    f"auth: {{admin_key: {{value: {SECRET}}}}}",                 # a mapping
    "auth: {keys: [{name: a, key: 73914628550}]}",             # a number
    f"api_key: [{SECRET}]",                                      # llama-cpp-python's key
    f"models: [{{aliases: [up], upstream: {{url: 'http://h:1', api_key: [{SECRET}]}}}}]",
    f"models: [{{aliases: [up], upstream: [{{url: 'http://h:1', "
    f"headers: {{X-Api-Key: [{SECRET}]}}}}]}}]",
])
def test_a_secret_given_with_the_wrong_type_is_never_shown(folder: Path, where: str) -> None:
    model = "" if where.startswith("models") else "\nmodels: [{model: models/small.gguf}]"
    text = where + model
    shown = "\n".join(errors_of(folder, text))
    assert SECRET not in shown and "73914628550" not in shown and "sk-config" not in shown


def test_a_validator_that_quotes_a_value_has_the_secrets_masked(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UP_KEY", SECRET)
    errors = errors_of(folder, f"""
        models:
          - aliases: [up]
            upstream: {{url: "ftp://h/{SECRET}", api_key: "${{UP_KEY}}"}}
    """)
    assert errors and SECRET not in "\n".join(errors) and "***" in errors[0]
