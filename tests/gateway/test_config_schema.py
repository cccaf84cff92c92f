"""The config file's JSON Schema: current in examples/, and agreeing with load_config.

The loader is the authority: every config below is given to both, and the schema must accept
what the loader accepts and reject what it rejects (for what a schema can see: keys, types,
bounds; not whether files exist or aliases are unique).
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.cli import main
from gateway.config import ConfigError, load_config
from gateway.config.json_schema import config_schema, schema_text
from gateway.units import parse_duration, parse_size
from tests.support.ggufgen import write_servable
from tests.support.paths import REPO

ROOT = REPO
COMMITTED = ROOT / "examples" / "config.schema.json"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(COMMITTED.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    write_servable(tmp_path / "models" / "small.gguf")
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.jinja").write_text("{{ messages[0]['content'] }}")
    (tmp_path / "key.txt").write_text("sk-from-file\n")
    return tmp_path


def test_the_committed_schema_is_the_one_the_models_make_now() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == schema_text(), (
        "examples/config.schema.json is stale: run "
        "`modelyard config-schema -o examples/config.schema.json`")


def test_the_example_config_validates(validator: jsonschema.Draft7Validator) -> None:
    example = yaml.safe_load((ROOT / "examples" / "config.yaml").read_text(encoding="utf-8"))
    assert list(validator.iter_errors(example)) == []


def test_the_example_config_names_the_schema_for_editors() -> None:
    first = (ROOT / "examples" / "config.yaml").read_text(encoding="utf-8").splitlines()[0]
    assert first == "# yaml-language-server: $schema=config.schema.json"


# Accepted by load_config (given the files the `folder` fixture makes).
GOOD = {
    "modelyard form": """
        host: 0.0.0.0
        port: ${PORT:-8080}
        default_model: small
        shutdown_timeout: 1m
        registry: {max_loaded_models: 1, memory_budget: 2GiB, idle_timeout: 0, load_timeout: 90}
        limits: {max_body: 1MiB, body_timeout: 5s, template_timeout: 500ms, max_prompt: 1000000}
        auth:
          admin_key: ${ADMIN_KEY:-sk-admin}
          keys:
            - {name: alice, key: sk-a, models: [small], max_concurrent: 2}
            - {name: bob, key_file: key.txt, requests_per_minute: 60}
        cors: {allow_origins: ["*"]}
        defaults: {n_ctx: 2048, n_threads: -1, temperature: 0.7, n_gpu_layers: 99}
        models:
          - model: models/small.gguf
            aliases: [small, gpt-4o]
            chat_template: templates/t.jinja
            pinned: ${PIN:-false}
            seed: 7
    """,
    "llama-cpp-python form": """
        {"host": "0.0.0.0", "port": 8000, "api_key": "sk-secret", "interrupt_requests": false,
         "models": [{"model": "models/small.gguf", "model_alias": "small", "n_ctx": 2048,
                     "n_gpu_layers": -1, "chat_format": "chatml", "n_threads": -1,
                     "offload_kqv": true, "n_batch": 512, "verbose": false},
                    {"model": "models/small.gguf"}]}
    """,
    "a JSON file naming its schema": """
        {"$schema": "config.schema.json", "models": [{"model": "models/small.gguf"}]}
    """,
    "one alias as a string": """
        models: [{model: models/small.gguf, aliases: small, idle_timeout: 5m}]
    """,
    "upstream entries": """
        models:
          - {model: models/small.gguf, aliases: small}
          - aliases: [chat]
            balance: round_robin
            probe: {interval: 5s, path: /health}
            upstream:
              - {url: "http://gpu:8000/v1", api_key_file: key.txt, model: m, timeout: 2m,
                 max_concurrent: 4, headers: {X-Team: a}}
              - {local: small}
          - upstream: {url: "http://other:8080", discover: true, api_key: "${K:-k}"}
    """,
}

# Rejected by load_config, for a reason a schema can see.
BAD = {
    "unknown top-level key": "listen: x\nmodels: [{model: models/small.gguf}]",
    "unknown model key": "models: [{model: models/small.gguf, n_ctxx: 10}]",
    "unknown registry key": "registry: {idle_timout: 5}\nmodels: [{model: models/small.gguf}]",
    "port out of range": "port: 70000\nmodels: [{model: models/small.gguf}]",
    "port not a number": "port: eighty\nmodels: [{model: models/small.gguf}]",
    "duration with an unknown unit": "shutdown_timeout: 10 minutes\n"
                                     "models: [{model: models/small.gguf}]",
    "size with an unknown unit": "registry: {memory_budget: 4 gigs}\n"
                                 "models: [{model: models/small.gguf}]",
    "below a bound": "models: [{model: models/small.gguf, n_parallel: 0}]",
    "above a bound": "models: [{model: models/small.gguf, temperature: 3}]",
    "no models": "port: 8080",
    "an empty model list": "models: []",
    "an entry without a model": "models: [{aliases: [x]}]",
    "a per-model key in defaults": "defaults: {model: models/small.gguf}\n"
                                   "models: [{model: models/small.gguf}]",
    "a key and a key file": "auth: {keys: [{name: a, key: k, key_file: key.txt}]}\n"
                            "models: [{model: models/small.gguf}]",
    "a client key without a key": "auth: {keys: [{name: a}]}\n"
                                  "models: [{model: models/small.gguf}]",
    "a list where a mapping goes": "registry: [1]\nmodels: [{model: models/small.gguf}]",
    "an upstream entry with a model file": "models: [{model: models/small.gguf, aliases: [x], "
                                           "upstream: {url: 'http://h'}}]",
    "an unknown upstream key": "models: [{aliases: [x], upstream: {url: 'http://h', tls: 1}}]",
    "an upstream key and a key file": "models: [{aliases: [x], upstream: {url: 'http://h', "
                                      "api_key: k, api_key_file: key.txt}}]",
}


def _data(text: str) -> Any:
    return yaml.safe_load(textwrap.dedent(text))  # YAML reads the JSON one too


@pytest.mark.parametrize("name", GOOD)
def test_what_the_loader_accepts_the_schema_accepts(
        name: str, folder: Path, validator: jsonschema.Draft7Validator) -> None:
    path = folder / "c.yaml"
    path.write_text(textwrap.dedent(GOOD[name]))
    load_config(path)  # the loader accepts it ...
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(_data(GOOD[name]))]
    assert errors == []  # ... and so does the schema


@pytest.mark.parametrize("name", BAD)
def test_what_the_loader_rejects_the_schema_rejects(
        name: str, folder: Path, validator: jsonschema.Draft7Validator) -> None:
    path = folder / "c.yaml"
    path.write_text(BAD[name])
    with pytest.raises(ConfigError):
        load_config(path)
    assert not validator.is_valid(_data(BAD[name]))


def test_llama_cpp_pythons_own_config_file_loads_and_validates(
        folder: Path, validator: jsonschema.Draft7Validator) -> None:
    # Every key llama-cpp-python 0.3.36 has, as it writes them (tests/data/llama_cpp_python).
    reference = ROOT / "tests" / "data" / "llama_cpp_python" / "config_file.json"
    data = json.loads(reference.read_text(encoding="utf-8"))
    (folder / "llama.json").write_text(json.dumps(data))
    config = load_config(folder / "llama.json")
    assert [e.aliases for e in config.models] == [["small"], ["small-long"]]
    assert [e.n_ctx for e in config.models] == [2048, 4096]
    assert [e.name for e in config.auth.keys] == ["api_key"]
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(data)]
    assert errors == []


AMOUNTS = ["90", "2.5", "10m", "1.5H", " 30 s ", "500ms", ".5d", "4GiB", "512mib", "2GB", "1K",
           "10 minutes", "1h30m", "5x", "-1s", "", "1e3", "GiB", "4 GiB"]


@pytest.mark.parametrize("text", AMOUNTS)
def test_durations_and_sizes_as_text_are_what_the_loader_reads(
        text: str, validator: jsonschema.Draft7Validator) -> None:
    for key, parse in (("shutdown_timeout", parse_duration), ("memory_budget", parse_size)):
        try:
            parse(text)
            reads = True
        except ValueError:
            reads = False
        data = ({key: text} if key == "shutdown_timeout" else {"registry": {key: text}})
        assert validator.is_valid({**data, "models": [{"model": "m.gguf"}]}) == reads, (key, text)


def test_llama_cpp_python_keys_modelyard_does_not_use_are_marked_deprecated() -> None:
    schema = config_schema()
    assert schema["properties"]["ssl_keyfile"]["deprecated"] is True
    assert schema["$defs"]["ModelEntry"]["properties"]["n_gpu_layers"]["deprecated"] is True
    assert "deprecated" not in schema["$defs"]["ModelEntry"]["properties"]["n_ctx"]


def test_config_schema_command_writes_the_schema(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config-schema"]) == 0
    assert capsys.readouterr().out == schema_text()
    out = tmp_path / "schema.json"
    assert main(["config-schema", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == schema_text()
