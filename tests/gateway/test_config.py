"""Config loading: three formats, env expansion, units, llama-cpp-python configs, error listing."""
from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from gateway.config import Config, ConfigError, ModelEntry, ModelNotFoundError, load_config
from gateway.config.reload import RELOAD, RESTART, marked, unmarked
from gateway.config.schema import LoraAdapter
from gateway.units import format_duration, format_size, parse_duration, parse_size
from tests.support.ggufgen import write_servable
from tests.support.paths import REPO

ROOT = REPO
GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A config folder with two (tiny, servable) model files and a chat template file."""
    (tmp_path / "models").mkdir()
    write_servable(tmp_path / "models" / "small.gguf")
    write_servable(tmp_path / "models" / "other.gguf")
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "other.jinja").write_text("{{ messages[0]['content'] }}")
    return tmp_path


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    return info.value.errors


YAML = """
host: 0.0.0.0
port: 9000
default_model: smol
registry:
  max_loaded_models: 3
  memory_budget: 512MiB
  idle_timeout: 10m
  load_timeout: 30s
defaults:
  n_ctx: 2048
  n_threads: 1
models:
  - model: models/small.gguf
    aliases: [smol, gpt-3.5-turbo]
    idle_timeout: 1h
  - model: models/other.gguf
    model_alias: other
    chat_template: templates/other.jinja
    pinned: true
    n_ctx: 1024
"""

TOML = """
host = "0.0.0.0"
port = 9000
default_model = "smol"

[registry]
max_loaded_models = 3
memory_budget = "512MiB"
idle_timeout = "10m"
load_timeout = 30

[defaults]
n_ctx = 2048
n_threads = 1

[[models]]
model = "models/small.gguf"
aliases = ["smol", "gpt-3.5-turbo"]
idle_timeout = 3600

[[models]]
model = "models/other.gguf"
model_alias = "other"
chat_template = "templates/other.jinja"
pinned = true
n_ctx = 1024
"""

JSON = {
    "host": "0.0.0.0", "port": 9000, "default_model": "smol",
    "registry": {"max_loaded_models": 3, "memory_budget": 536870912, "idle_timeout": 600,
                 "load_timeout": "30s"},
    "defaults": {"n_ctx": 2048, "n_threads": 1},
    "models": [
        {"model": "models/small.gguf", "aliases": ["smol", "gpt-3.5-turbo"], "idle_timeout": "1h"},
        {"model": "models/other.gguf", "model_alias": "other",
         "chat_template": "templates/other.jinja", "pinned": True, "n_ctx": 1024},
    ],
}


def comparable(config: Config) -> dict[str, object]:
    return config.model_dump(exclude={"source"})


# --------------------------------------------------------------------------------- the formats

def test_yaml_toml_and_json_give_the_same_config(folder: Path) -> None:
    from_yaml = load_config(write(folder, "c.yaml", YAML))
    from_toml = load_config(write(folder, "c.toml", TOML))
    from_json = load_config(write(folder, "c.json", json.dumps(JSON)))
    assert comparable(from_yaml) == comparable(from_toml) == comparable(from_json)
    assert from_yaml.source == folder / "c.yaml"

    c = from_yaml
    assert (c.host, c.port, c.default_model) == ("0.0.0.0", 9000, "smol")
    assert c.registry.max_loaded_models == 3
    assert c.registry.memory_budget == 512 * MiB
    assert (c.registry.idle_timeout, c.registry.load_timeout) == (600.0, 30.0)
    small, other = c.models
    assert small.model == folder / "models" / "small.gguf"  # relative to the config's folder
    assert small.aliases == ["smol", "gpt-3.5-turbo"]
    assert (small.n_ctx, small.n_threads, small.idle_timeout) == (2048, 1, 3600.0)  # defaults
    assert (small.n_parallel, small.max_queue, small.pinned) == (4, 64, False)
    assert small.chat_template is None
    assert other.aliases == ["other"]
    assert other.n_ctx == 1024                  # the entry overrides defaults
    assert other.idle_timeout is None           # the registry's default applies
    assert other.chat_template == "{{ messages[0]['content'] }}"
    assert other.chat_template_path == folder / "templates" / "other.jinja"
    assert other.pinned and c.warnings == []


def test_yml_suffix_is_yaml(folder: Path) -> None:
    assert load_config(write(folder, "c.yml", YAML)).default_model == "smol"


def test_shipped_example_loads_when_its_files_exist(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Its model is the default model in the cache (MODELYARD_CACHE); its template file ships
    beside it (tests/system/test_example_config.py serves it as its header says)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    write_servable(tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf")

    c = load_config(tmp_path / "examples" / "config.yaml")
    assert c.resolve(None).aliases == ["smol", "gpt-3.5-turbo"]
    assert c.registry.memory_budget == 4 * GiB and c.registry.idle_timeout == 600
    assert c.registry.load_timeout == 120 and c.models[0].idle_timeout == 300
    assert c.models[1].aliases == ["smol-long"] and c.models[1].pinned
    assert c.models[0].model == c.models[1].model == tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert c.models[1].n_ctx == 8192 and c.models[0].n_ctx == 4096
    assert c.warnings == []


# ---------------------------------------------------------------------------- resolve, aliases

def test_resolve_by_alias_default_and_first_entry(folder: Path) -> None:
    c = load_config(write(folder, "c.yaml", YAML))
    assert c.resolve("gpt-3.5-turbo") is c.models[0]
    assert c.resolve("other") is c.models[1]
    assert c.resolve(None) is c.models[0]
    assert c.aliases() == ["smol", "gpt-3.5-turbo", "other"]
    with pytest.raises(ModelNotFoundError) as info:
        c.resolve("gpt-4")
    assert info.value.alias == "gpt-4" and info.value.available == c.aliases()

    no_default = c.model_copy(update={"default_model": None, "models": c.models[::-1]})
    assert Config.model_validate(no_default.model_dump()).resolve(None).aliases == ["other"]


def test_a_config_built_in_code_is_checked_too(tmp_path: Path) -> None:
    a = ModelEntry(model=tmp_path / "a.gguf", aliases=["x"])
    b = ModelEntry(model=tmp_path / "b.gguf", aliases=["x"])
    with pytest.raises(ValueError, match="duplicate alias 'x'"):
        Config(models=[a, b])
    with pytest.raises(ValueError, match="no model answers to 'y'"):
        Config(models=[a], default_model="y")
    with pytest.raises(ValueError):
        Config(models=[])
    assert ModelEntry(model=Path("rel.gguf"), aliases=["r"]).model.is_absolute()


def test_settings_key_changes_only_with_what_shapes_a_loaded_model(tmp_path: Path) -> None:
    entry = ModelEntry(model=tmp_path / "a.gguf", aliases=["a"])
    same = entry.model_copy(update={"aliases": ["b"], "pinned": True, "idle_timeout": 5.0})
    assert same.settings_key() == entry.settings_key()
    for change in ({"n_ctx": 8192}, {"n_threads": 4}, {"chat_template": "{{ x }}"},
                   {"model": tmp_path / "b.gguf"}, {"n_parallel": 1},
                   {"rope_freq_base": 5e5}, {"rope_scaling_type": "yarn"}, {"yarn_orig_ctx": 8},
                   {"lora": (LoraAdapter(path=tmp_path / "l.gguf", scale=0.5),)},
                   {"type_k": "q8_0", "type_v": "q8_0"}, {"prompt_cache": 1 << 30},
                   {"cache": True}, {"cache_type": "disk"}, {"prompt_cache_dir": tmp_path}):
        assert entry.model_copy(update=change).settings_key() != entry.settings_key()
    hash(entry.settings_key())


def test_every_config_field_says_when_a_change_to_it_applies() -> None:
    # A new key must be marked LIVE, RELOAD or RESTART (or INTERNAL): the reload diff reads it.
    assert unmarked(Config) == []


def test_the_reload_marks_match_what_the_registry_and_the_reloader_act_on() -> None:
    assert set(marked(ModelEntry, RELOAD)) == {"model", "n_ctx", "n_threads", "n_parallel",
                                               "max_queue", "chat_template", "chat_format",
                                               "flash_attn", "mmproj", "rope_freq_base",
                                               "rope_freq_scale", "rope_scaling_type",
                                               "yarn_ext_factor", "yarn_attn_factor",
                                               "yarn_beta_fast", "yarn_beta_slow",
                                               "yarn_orig_ctx", "pooling", "lora", "draft",
                                               "type_k", "type_v", "prompt_cache",
                                               "prompt_cache_disk", "prompt_cache_dir", "cache",
                                               "cache_type", "cache_size"}
    assert marked(Config, RESTART) == ("host", "port", "ollama_address")


# ----------------------------------------------------------------------------- env expansion

def test_environment_variables_expand_with_defaults(folder: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_PORT", "9123")
    monkeypatch.setenv("MODEL_DIR", str(folder / "models"))
    monkeypatch.delenv("UNSET_BUDGET", raising=False)
    monkeypatch.setenv("EMPTY", "")
    monkeypatch.delenv("THREADS", raising=False)
    c = load_config(write(folder, "c.yaml", """
        host: ${EMPTY:-::1}
        port: ${MY_PORT}
        registry:
          memory_budget: ${UNSET_BUDGET:-1GiB}
        models:
          - model: ${MODEL_DIR}/small.gguf
            aliases: ["cost-$${literal}"]
            n_threads: ${THREADS:--1}
    """))
    assert (c.host, c.port, c.registry.memory_budget) == ("::1", 9123, GiB)
    assert c.models[0].n_threads == (os.cpu_count() or 1)  # "-1" from the variable: every core
    assert c.models[0].model == folder / "models" / "small.gguf"
    assert c.models[0].aliases == ["cost-${literal}"]


def test_a_default_may_hold_another_reference(folder: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTER_PORT", raising=False)
    monkeypatch.setenv("INNER_PORT", "9200")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    monkeypatch.setenv("SET_HOST", "::1")
    c = load_config(write(folder, "c.yaml", """
        port: ${OUTER_PORT:-${INNER_PORT:-8000}}
        host: ${SET_HOST:-${NOT_SET_ANYWHERE}}
        registry:
          memory_budget: ${OUTER_PORT:-${NOT_SET_ANYWHERE:-2GiB}}
        models:
          - model: models/small.gguf
    """))
    # as in the shell: the inner default is used only when it is needed
    assert (c.port, c.host, c.registry.memory_budget) == (9200, "::1", 2 * GiB)


def test_an_unset_variable_without_default_is_an_error(folder: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = write(folder, "c.yaml", """
        port: ${NOT_SET_ANYWHERE}
        models:
          - model: models/small.gguf
    """)
    [error] = errors_of(path)
    assert error.startswith(f"{path}:1: port: environment variable NOT_SET_ANYWHERE is not set")


# ------------------------------------------------------------------------------------- units

@pytest.mark.parametrize("text, seconds", [
    ("30s", 30.0), ("10m", 600.0), ("1h", 3600.0), ("1.5h", 5400.0), ("500ms", 0.5),
    ("2d", 172800.0), ("45", 45.0), (45, 45.0), (0, 0.0), (2.5, 2.5), (" 5 m ", 300.0),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text, n_bytes", [
    ("512MiB", 512 * MiB), ("4GiB", 4 * GiB), ("4gib", 4 * GiB), ("2GB", 2_000_000_000),
    ("1.5G", 3 * GiB // 2), ("100KiB", 102400), ("123", 123), (4096, 4096), ("1kb", 1000),
])
def test_sizes(text: object, n_bytes: int) -> None:
    assert parse_size(text) == n_bytes


@pytest.mark.parametrize("bad", ["10x", "-5s", "soon", "", True, None, [1], "1h30m", float("inf")])
def test_bad_durations_say_what_is_accepted(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


@pytest.mark.parametrize("bad", ["4XB", "-1GiB", "big", False, "1.2.3MiB"])
def test_bad_sizes_say_what_is_accepted(bad: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_formatting_for_messages() -> None:
    assert format_size(4 * GiB) == "4.0 GiB" and format_size(512) == "512 B"
    assert format_duration(90) == "1m30s" and format_duration(2.5) == "2.5s"
    assert format_duration(3600) == "1h"


# -------------------------------------------------------------------------- llama-cpp-python

def test_llama_cpp_python_config_loads_unchanged_with_warnings(folder: Path) -> None:
    # The shape llama-cpp-python's `--config_file` takes (its own example style).
    path = write(folder, "llama.json", json.dumps({
        "host": "0.0.0.0", "port": 8000, "api_key": "sk-secret", "interrupt_requests": False,
        "models": [
            {"model": "models/small.gguf", "model_alias": "small", "n_ctx": 2048,
             "n_gpu_layers": -1, "chat_format": "chatml", "n_threads": -1, "verbose": False},
            {"model": "models/other.gguf", "n_batch": 512},
        ],
    }))
    c = load_config(path)
    small, other = c.models
    assert small.aliases == ["small"] and small.n_ctx == 2048
    assert small.n_threads == (os.cpu_count() or 1)  # llama-cpp-python's -1: every core
    assert small.extra == {"n_gpu_layers": -1, "verbose": False}
    assert small.chat_format == "chatml"  # used: picks the built-in template
    assert other.aliases == ["models/other.gguf"]  # llama-cpp-python's default: the model path
    assert other.extra == {"n_batch": 512}
    warned = {w.split(": ")[1] for w in c.warnings}
    assert warned == {"interrupt_requests", "models.0.n_gpu_layers",
                      "models.0.verbose", "models.1.n_batch"}
    # api_key is enforced now: one key, which also guards the admin endpoints
    [key] = c.auth.keys
    assert key.name == "api_key" and key.key.get_secret_value() == "sk-secret"
    assert c.auth.admin_key is not None and c.auth.admin_key.get_secret_value() == "sk-secret"
    assert "sk-secret" not in repr(c)


def test_unknown_chat_format_is_a_config_error_with_a_suggestion(folder: Path) -> None:
    path = write(folder, "c.yaml", """
        models:
          - model: models/small.gguf
            chat_format: lama-3
        """)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "c.yaml:3: models.0.chat_format: unknown chat format 'lama-3'; did you mean " \
        "'llama-3'?" in str(e.value)


def test_chat_format_change_means_a_reload_of_the_model(folder: Path) -> None:
    a = load_config(write(folder, "a.yaml", "models: [{model: models/small.gguf}]"))
    b = load_config(write(folder, "b.yaml",
                          "models: [{model: models/small.gguf, chat_format: zephyr}]"))
    assert a.models[0].settings_key() != b.models[0].settings_key()


def test_llama_cpp_python_yaml_config_warnings_carry_line_numbers(folder: Path) -> None:
    path = write(folder, "llama.yaml", """
        models:
          - model: models/small.gguf
            model_alias: small
            n_gpu_layers: 35
    """)
    assert load_config(path).warnings == [
        f"{path}:4: models.0.n_gpu_layers: accepted for llama-cpp-python compatibility; "
        "not used by modelyard yet"]


def test_llama_cpp_python_keys_in_defaults_reach_every_entry(folder: Path) -> None:
    c = load_config(write(folder, "c.yaml", """
        defaults:
          use_mlock: true
        models:
          - model: models/small.gguf
          - model: models/other.gguf
    """))
    assert [m.extra for m in c.models] == [{"use_mlock": True}, {"use_mlock": True}]
    assert len(c.warnings) == 1 and "defaults.use_mlock" in c.warnings[0]


# ------------------------------------------------------------------------------------ errors

def test_every_problem_is_listed_with_its_line(folder: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_VAR", raising=False)
    path = write(folder, "c.yaml", """
        host: 127.0.0.1
        prot: 8080
        registry:
          max_loaded_models: 0
          memory_budget: 4XB
          idle_timout: 1m
        defaults:
          n_ctx: lots
        models:
          - model: models/small.gguf
            aliases: [a, b]
            n_parallel: 0
          - model: models/missing.gguf
            aliases: [b]
            pinned: maybe
          - model: models/other.gguf
            alias: c
            chat_template: templates/nope.jinja
          - aliases: [d]
        default_model: ${NO_SUCH_VAR}
    """)
    errors = errors_of(path)
    expected_prefixes = [
        f"{path}:2: prot: unknown key (did you mean 'port'?)",
        f"{path}:4: registry.max_loaded_models: ",
        f"{path}:5: registry.memory_budget: invalid size '4XB'",
        f"{path}:6: registry.idle_timout: unknown key (did you mean 'idle_timeout'?)",
        f"{path}:8: defaults.n_ctx: ",
        f"{path}:12: models.0.n_parallel: ",
        f"{path}:13: models.1.model: model file not found: {folder / 'models' / 'missing.gguf'}",
        f"{path}:14: models.1.aliases.0: duplicate alias 'b': models.0 already answers to it",
        f"{path}:15: models.1.pinned: ",
        f"{path}:17: models.2.alias: unknown key (did you mean 'aliases'?)",
        f"{path}:18: models.2.chat_template: chat template file not found",
        f"{path}:19: models.3.model: required",
        f"{path}:20: default_model: environment variable NO_SUCH_VAR is not set",
    ]
    assert len(errors) == len(expected_prefixes), errors
    for error, prefix in zip(errors, expected_prefixes):
        assert error.startswith(prefix), (error, prefix)


def test_unknown_top_level_key_is_rejected(folder: Path) -> None:
    path = write(folder, "c.toml", """
        listen = "0.0.0.0"
        [[models]]
        model = "models/small.gguf"
    """)
    assert errors_of(path) == [f"{path}: listen: unknown key (known: host, port, "
                               "default_model, default_models, shutdown_timeout, "
                               "ollama_address, registry, "
                               "limits, auth, cors, responses, defaults, models)"]


def test_unknown_model_key_is_rejected_but_llama_cpp_python_keys_warn(folder: Path) -> None:
    path = write(folder, "c.yaml", """
        models:
          - model: models/small.gguf
            n_gpu_layers: 10
            n_ctxx: 10
    """)
    [error] = errors_of(path)
    assert error.startswith(f"{path}:4: models.0.n_ctxx: unknown key (did you mean 'n_ctx'?)")


def test_duplicate_alias_across_entries(folder: Path) -> None:
    path = write(folder, "c.json", json.dumps({"models": [
        {"model": "models/small.gguf", "aliases": ["x", "y"]},
        {"model": "models/other.gguf", "model_alias": "y"},
    ]}))
    assert errors_of(path) == [
        f"{path}: models.1.model_alias: duplicate alias 'y': models.0 already answers to it"]


def test_two_entries_may_serve_one_model_file_with_their_own_settings(folder: Path) -> None:
    # llama-cpp-python's docs: gpt-3.5-turbo and gpt-4 on one file, different n_ctx
    path = write(folder, "c.json", json.dumps({"models": [
        {"model": "models/small.gguf", "model_alias": "gpt-3.5-turbo", "n_ctx": 2048},
        {"model": "./models/../models/small.gguf", "model_alias": "gpt-4", "n_ctx": 4096},
    ]}))
    config = load_config(path)
    assert config.models[0].model == config.models[1].model
    assert config.resolve("gpt-3.5-turbo").n_ctx == 2048
    assert config.resolve("gpt-4").n_ctx == 4096


def test_missing_model_file(folder: Path) -> None:
    path = write(folder, "c.yaml", "models:\n  - model: nowhere/x.gguf\n")
    assert errors_of(path) == [
        f"{path}:2: models.0.model: model file not found: {folder / 'nowhere' / 'x.gguf'}"]


def test_missing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    assert errors_of(path) == [f"{path}: config file not found"]


def test_unsupported_format(tmp_path: Path) -> None:
    path = tmp_path / "c.ini"
    path.write_text("[x]\n")
    [error] = errors_of(path)
    assert "unsupported config format '.ini'" in error


def test_default_model_must_be_an_alias(folder: Path) -> None:
    path = write(folder, "c.yaml", """
        default_model: gpt-4
        models:
          - {model: models/small.gguf, aliases: [small]}
    """)
    assert errors_of(path) == [
        f"{path}:1: default_model: no model answers to 'gpt-4'; aliases: small"]


def test_models_are_required(folder: Path) -> None:
    path = write(folder, "c.yaml", "port: 8080\n")
    [error] = errors_of(path)
    assert error.startswith(f"{path}: models: required")


def test_not_a_mapping_or_empty(folder: Path) -> None:
    assert "top level must be a mapping" in errors_of(write(folder, "e.yaml", ""))[0]
    assert "top level must be a mapping" in errors_of(write(folder, "l.json", "[1, 2]"))[0]


@pytest.mark.parametrize("name, text, line", [
    ("c.yaml", "models:\n  - model: [unclosed\n", 3),
    ("c.toml", "port = 80\nhost = \n", 2),
    ("c.json", '{"port": 80,\n "host": }', 2),
])
def test_syntax_errors_name_the_line(folder: Path, name: str, text: str, line: int) -> None:
    path = folder / name
    path.write_text(text)
    [error] = errors_of(path)
    assert error.startswith(f"{path}:{line}: invalid {name.split('.')[1].upper()}")


def test_yaml_duplicate_keys_are_errors(folder: Path) -> None:
    path = write(folder, "c.yaml", """
        port: 1
        models:
          - model: models/small.gguf
        port: 2
    """)
    assert errors_of(path) == [f"{path}:1: port: duplicate key: given on line 1 and again on line 4"]


def test_chat_template_inline_text_and_compile_errors(folder: Path) -> None:
    c = load_config(write(folder, "ok.yaml", """
        models:
          - model: models/small.gguf
            chat_template: "{% for m in messages %}{{ m.content }}{% endfor %}"
    """))
    assert c.models[0].chat_template == "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert c.models[0].chat_template_path is None

    path = write(folder, "bad.yaml", """
        models:
          - model: models/small.gguf
            chat_template: "{% if %}"
    """)
    [error] = errors_of(path)
    assert error.startswith(f"{path}:3: models.0.chat_template: chat template does not compile")


def test_n_ctx_zero_from_llama_cpp_python_is_the_trained_context(folder: Path) -> None:
    # tests/gateway/test_config_rope.py has the rest: defaults, the memory budget
    path = write(folder, "c.yaml", "models:\n  - {model: models/small.gguf, n_ctx: 0}\n")
    from engine.servable import trained_context

    assert load_config(path).models[0].n_ctx == trained_context(folder / "models/small.gguf") > 0


@pytest.mark.real_model
def test_default_config_serves_the_default_model(smollm2_path: Path) -> None:
    from gateway.config import default_config

    c = default_config()
    assert c.default_model == "smollm2" and c.resolve(None).model == smollm2_path
    assert c.aliases() == ["smollm2"] and c.source is None


@pytest.mark.parametrize("given, name", [(None, "f16"), (8, "q8_0"), ("Q4_0", "q4_0"), (1, "f16")])
def test_kv_cache_types_take_names_ggml_numbers_and_llama_cpp_pythons_null(tmp_path: Path,
                                                                           given, name) -> None:
    entry = ModelEntry(model=tmp_path / "a.gguf", aliases=["a"], type_k=given, type_v=given)
    assert (entry.type_k, entry.type_v) == (name, name)


@pytest.mark.parametrize("settings, problem", [
    ({"type_k": "q5_1"}, "unsupported KV cache type"),
    ({"type_k": 3.5}, "a name or a ggml type number"),
    ({"type_k": "q8_0"}, "must both be quantized"),
    ({"type_k": "q8_0", "type_v": 8, "flash_attn": False}, "requires flash_attn"),
])
def test_kv_cache_type_problems_are_named(tmp_path: Path, settings, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        ModelEntry(model=tmp_path / "a.gguf", aliases=["a"], **settings)
