"""Sampling defaults: request > config entry (or `defaults:`) > the GGUF's general.sampling.* >
llama.cpp's. Checked on what the scheduler is really given, through the official client."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import load_config
from gateway.generation import defaults
from gateway.local.served_model import load_served_model
from tests.support.apps import Apps
from tests.support.ggufgen import write_tiny_llama


def test_gguf_sampling_keys_are_read_and_nonsense_is_ignored() -> None:
    meta = {"general.sampling.temp": 0.3, "general.sampling.top_k": 7,
            "general.sampling.top_p": 1.5, "general.sampling.min_p": "x",
            "general.sampling.penalty_repeat": 1.1}
    got = defaults.from_metadata(meta)
    assert got == defaults.Sampling(temperature=0.3, top_k=7, repeat_penalty=pytest.approx(1.1))
    assert defaults.from_metadata({}) == defaults.Sampling()


def recording_loader(seen: list[Any]) -> Any:
    """The real loader; every GenerationRequest handed to a scheduler is kept in `seen`."""
    def load(entry: Any) -> Any:
        served = load_served_model(entry)
        submit = served.scheduler.submit

        def recorded(request: Any) -> Any:
            seen.append(request)
            return submit(request)

        served.scheduler.submit = recorded
        return served
    return load


@pytest.fixture(scope="module")
def server(module_apps: Apps, tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("defaults")
    hinted = write_tiny_llama(d / "hinted.gguf", seed=3, metadata={
        "general.sampling.temp": 0.3, "general.sampling.top_k": 7})
    plain = write_tiny_llama(d / "plain.gguf", seed=4)
    config = d / "modelyard.yaml"
    config.write_text(yaml.safe_dump({
        "defaults": {"min_p": 0.2},
        "models": [
            {"model": str(hinted), "aliases": ["hinted"], "n_ctx": 64, "top_p": 0.5},
            {"model": str(plain), "aliases": ["plain"], "n_ctx": 128, "max_tokens": 5,
             "temperature": 0.0, "seed": 42},
        ]}))
    seen: list[Any] = []
    srv = module_apps.serve(config, loader=recording_loader(seen))
    srv.seen = seen  # type: ignore[attr-defined]
    return srv


def last_request(server: Any) -> Any:
    return server.seen[-1]


def test_a_request_without_sampling_fields_gets_entry_then_gguf_then_llama_cpp_values(server):
    server.client.chat.completions.create(model="hinted", messages=[{"role": "user", "content": "hi"}])
    req = last_request(server)
    p = req.params
    assert (p.temperature, p.top_k) == (pytest.approx(0.3), 7)        # from the GGUF
    assert p.top_p == 0.5                                             # the entry
    assert p.min_p == pytest.approx(0.2)                              # defaults:
    assert (p.repeat_penalty, p.presence_penalty) == (1.0, 0.0)       # llama.cpp's
    # no max_tokens: chat's default, at most half the context (n_ctx 64)
    assert req.max_tokens == 32


def test_explicit_request_values_win_even_when_they_equal_openai_defaults(server):
    server.client.chat.completions.create(
        model="hinted", messages=[{"role": "user", "content": "hi"}], temperature=1.0,
        top_p=1.0, max_tokens=3, extra_body={"top_k": 0, "min_p": 0.0})
    p = last_request(server).params
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, 0, 0.0)
    assert last_request(server).max_tokens == 3


def test_entry_max_tokens_and_llama_cpp_defaults_where_the_gguf_says_nothing(server):
    out = server.client.completions.create(model="plain", prompt="abc")
    req = last_request(server)
    assert req.max_tokens == 5 and out.usage.completion_tokens <= 5
    p = req.params
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.0, 40, pytest.approx(0.95),
                                                         pytest.approx(0.2))


def test_an_entry_seed_seeds_requests_without_one(server):
    server.client.completions.create(model="plain", prompt="abc")
    assert last_request(server).params.seed == 42
    server.client.completions.create(model="plain", prompt="abc", seed=7)
    assert last_request(server).params.seed == 7
    server.client.completions.create(model="hinted", prompt="abc")
    assert last_request(server).params.seed is None


def test_completions_without_an_entry_budget_keep_openais_16(server):
    server.client.completions.create(model="hinted", prompt="abc")
    assert last_request(server).max_tokens == 16


def test_sampling_defaults_are_config_keys_checked_like_the_others(tmp_path: Path) -> None:
    from gateway.config import ConfigError

    model = write_tiny_llama(tmp_path / "m.gguf")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"defaults": {"temperature": 3},
                                   "models": [{"model": str(model), "top_k": -1}]}))
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    text = str(err.value)
    assert "defaults.temperature" in text and "models.0.top_k" in text


def test_a_long_generation_logs_its_progress(server, monkeypatch, caplog):
    import logging

    import gateway.local.scheduler

    monkeypatch.setattr(gateway.local.scheduler, "PROGRESS_LOG_SECONDS", 0.0)  # every token is "long"
    with caplog.at_level(logging.INFO, logger="modelyard.scheduler"):
        server.client.completions.create(model="plain", prompt="abc", max_tokens=4,
                                         extra_body={"logit_bias": {"0": -100, "1": -100, "2": -100}})
    lines = [r.getMessage() for r in caplog.records if "generating on plain" in r.getMessage()]
    assert lines and "max_tokens 4" in lines[-1] and "tokens/s" in lines[-1]
