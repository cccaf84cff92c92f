"""llama-cpp-python's context keys, working (issue #31): `n_ctx: 0` is the model's trained
context, bounded by memory_budget; the rope keys reach the engine as its RopeSettings (whose
numerics tests/engine/test_rope_settings.py checks against llama.cpp); bad values are
`file:line` config errors; none of them is "accepted but ignored" any more."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import engine
from gateway.config import ConfigError, load_config
from gateway.config.llama_cpp import LLAMA_CPP_MODEL_KEYS
from gateway.local.served_model import rope_settings
from tests.support.ggufgen import write_servable
from tests.support.refs import SYNTH_DIR

ROPE_KEYS = ("rope_freq_base", "rope_freq_scale", "rope_scaling_type", "yarn_ext_factor",
             "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx")
TRAINED = 256  # write_servable's llama.context_length


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_servable(tmp_path / "m.gguf")
    return tmp_path


def _config(folder: Path, text: str) -> Path:
    path = folder / "c.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def _errors(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return e.value.errors


def test_n_ctx_zero_is_the_trained_context(folder: Path) -> None:
    c = load_config(_config(folder, """
        models:
          - {model: m.gguf, aliases: [own], n_ctx: 0}
          - {model: m.gguf, aliases: [set], n_ctx: 64}
    """))
    assert [e.n_ctx for e in c.models] == [TRAINED, 64]
    assert c.warnings == []


def test_n_ctx_zero_from_defaults_reaches_every_entry(folder: Path) -> None:
    c = load_config(_config(folder, """
        defaults: {n_ctx: 0}
        models: [{model: m.gguf}]
    """))
    assert c.models[0].n_ctx == TRAINED


def test_n_ctx_zero_that_does_not_fit_the_budget_is_a_config_error(folder: Path) -> None:
    need = engine.estimate_memory(folder / "m.gguf", TRAINED, n_slots=4)
    path = _config(folder, f"""
        registry: {{memory_budget: {need - 1}}}
        defaults: {{n_ctx: 0}}
        models:
          - model: m.gguf
            aliases: [a]
            n_ctx: 0
          - model: m.gguf
            aliases: [b]
    """)
    own, from_defaults = sorted(_errors(path), key=lambda e: "defaults" in e)
    assert own.startswith(f"{path}:6: models.0.n_ctx: 0 means the model's trained context, "
                          f"{TRAINED} tokens")
    assert "over memory_budget" in own
    assert from_defaults.startswith(f"{path}:2: defaults.n_ctx: for models.1 (m.gguf): ")
    fits = _config(folder, f"registry: {{memory_budget: {need}}}\n"
                           "models: [{model: m.gguf, n_ctx: 0}]\n")
    assert load_config(fits).models[0].n_ctx == TRAINED  # the estimate the registry makes


def test_a_negative_n_ctx_is_a_config_error(folder: Path) -> None:
    path = _config(folder, "models: [{model: m.gguf, n_ctx: -1}]\n")
    [error] = _errors(path)
    assert error.startswith(f"{path}:1: models.0.n_ctx: ")


def test_rope_keys_are_used_not_ignored() -> None:
    assert not set(ROPE_KEYS) & LLAMA_CPP_MODEL_KEYS


def test_each_rope_key_reaches_the_engine(folder: Path) -> None:
    c = load_config(_config(folder, """
        defaults: {yarn_beta_slow: 2.0}
        models:
          - model: m.gguf
            rope_freq_base: 50000
            rope_freq_scale: 0.25
            rope_scaling_type: yarn
            yarn_ext_factor: 0.5
            yarn_attn_factor: 0.9
            yarn_beta_fast: 16
            yarn_orig_ctx: 128
    """))
    assert c.warnings == []
    assert rope_settings(c.models[0]) == engine.RopeSettings(
        rope_freq_base=50000.0, rope_freq_scale=0.25, rope_scaling_type="yarn",
        yarn_ext_factor=0.5, yarn_attn_factor=0.9, yarn_beta_fast=16.0, yarn_beta_slow=2.0,
        yarn_orig_ctx=128)
    bare = load_config(_config(folder, "models: [{model: m.gguf}]\n"))
    assert rope_settings(bare.models[0]) == engine.RopeSettings()  # the file's own


@pytest.mark.parametrize("given, name", [(-1, None), (0, "none"), (1, "linear"), (2, "yarn"),
                                         ("linear", "linear"), ("null", None)])
def test_the_scaling_type_takes_llama_cpps_numbers_and_names(folder: Path, given: object,
                                                             name: str | None) -> None:
    c = load_config(_config(folder, f"models: [{{model: m.gguf, rope_scaling_type: {given}}}]\n"))
    assert rope_settings(c.models[0]).rope_scaling_type == name


@pytest.mark.parametrize("key, value", [
    ("rope_freq_base", "-1"), ("rope_freq_scale", "-0.5"), ("rope_freq_scale", ".nan"),
    ("rope_scaling_type", "3"), ("rope_scaling_type", "longrope"), ("yarn_ext_factor", ".inf"),
    ("yarn_attn_factor", "strong"), ("yarn_beta_fast", ".nan"), ("yarn_beta_slow", "[1]"),
    ("yarn_orig_ctx", "-4"), ("yarn_orig_ctx", "1.5"),
])
def test_a_bad_rope_value_is_a_config_error_at_its_line(folder: Path, key: str,
                                                        value: str) -> None:
    path = _config(folder, f"models:\n  - model: m.gguf\n    {key}: {value}\n")
    [error] = _errors(path)
    assert error.startswith(f"{path}:3: models.0.{key}: ")


def test_a_served_entry_loads_with_its_rope_settings(folder: Path) -> None:
    """Through the registry's loader: the entry's keys become the loaded model's rope."""
    from gateway.local.served_model import load_served_model

    synth = SYNTH_DIR / "qwen2_d64_gqa2_bias_f32.gguf"
    c = load_config(_config(folder, f"""
        models:
          - model: {synth}
            n_ctx: 0
            n_parallel: 1
            rope_freq_base: 50000
            rope_scaling_type: linear
            rope_freq_scale: 0.5
    """))
    served = load_served_model(c.models[0])
    try:
        hp = served.model.hparams
        assert (hp.rope_base, hp.rope_freq_scale) == (50000.0, 0.5)
        assert served.model.n_ctx == hp.n_ctx_train == 512  # the file's context_length
    finally:
        served.close()


def test_a_reload_with_n_ctx_zero_reads_no_header_again(folder: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The trained context and the memory estimate are remembered for the file's identity,
    like the servability answer (tests/gateway/test_config_reload_cost.py)."""
    import engine.servable

    reads: list[object] = []
    real = engine.servable.read_header

    def counting(path: object, *args: object, **kwargs: object) -> object:
        reads.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(engine.servable, "read_header", counting)
    write_servable(folder / "fresh.gguf")  # not judged by an earlier test
    path = _config(folder, "models: [{model: fresh.gguf, n_ctx: 0}]\n")
    assert load_config(path).models[0].n_ctx == TRAINED
    assert reads  # the judgement and the estimate read it
    reads.clear()
    assert load_config(path).models[0].n_ctx == TRAINED
    assert reads == []
