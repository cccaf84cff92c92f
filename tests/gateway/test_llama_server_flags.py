"""scripts/llama_server_flags.py: llama-server's flags (llama.cpp's tests/utils.py ServerProcess
attributes) as a modelyard config that modelyard's own loader accepts. The upstream test run
(scripts/llama_server_tests.py) needs llama.cpp's sources; this mapping does not."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.config.loader import load_config

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _flags_module() -> Any:
    spec = importlib.util.spec_from_file_location("llama_server_flags",
                                                  SCRIPTS / "llama_server_flags.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("llama_server_flags", module)
    spec.loader.exec_module(module)
    return module


flags = _flags_module()

TINYLLAMA2 = {"model_hf_repo": "ggml-org/test-model-stories260K", "model_alias": "tinyllama-2",
              "n_ctx": 512, "n_slots": 2, "n_predict": 64, "seed": 42, "temperature": 0.8}


@pytest.mark.parametrize(("n_ctx", "n_slots", "unified", "per_slot"), [
    (512, 2, False, 256), (256, 4, False, 256), (4096, 1, False, 4096), (256, 4, True, 256),
    (1000, 3, False, 512), (None, 2, False, 0)])
def test_slot_context_is_llama_cpps_n_ctx_seq(n_ctx, n_slots, unified, per_slot):
    # llama-context.cpp: n_ctx / n_seq_max padded up to 256 unless the cache is unified
    assert flags.slot_context(n_ctx, n_slots, unified) == per_slot


def test_a_preset_becomes_a_config_the_loader_accepts(tmp_path, smollm2_path):
    config = flags.config_for({**TINYLLAMA2, "api_key": "sk-test", "chat_template": "llama3",
                               "cors_origins": "a.example, b.example", "n_predict": -1}, 8123)
    config["models"][0]["model"] = str(smollm2_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    loaded = load_config(path)
    entry = loaded.resolve("tinyllama-2")
    assert (entry.n_ctx, entry.n_parallel, entry.seed, entry.temperature) == (256, 2, 42, 0.8)
    assert entry.max_tokens is None  # -1 is llama-server's "until the context is full"
    assert entry.chat_format == "llama3"
    assert [(k.name, k.key.get_secret_value()) for k in loaded.auth.keys] == [("api_key", "sk-test")]
    assert loaded.cors.allow_origins == ["a.example", "b.example"]
    assert loaded.resolve("gpt-3.5-turbo") is entry  # llama-server answers any model name


def test_aliases_templates_and_encoder_presets():
    several = flags.config_for({**TINYLLAMA2, "model_alias": "a,b", "chat_template":
                                "{{ messages[0].content }}"}, 1)["models"][0]
    assert several["aliases"][:2] == ["a", "b"]
    assert several["chat_template"] == "{{ messages[0].content }}"  # not a built-in name: text
    thinking = flags.config_for({**TINYLLAMA2, "reasoning": "auto"}, 1)["models"][0]
    assert thinking["chat_template_kwargs"] == {"enable_thinking": True}
    assert flags.config_for({**TINYLLAMA2, "reasoning": "off"}, 1)["models"][0][
        "reasoning_effort"] == "none"
    embed = flags.config_for({"model_hf_repo": "ggml-org/models", "pooling": "none",
                              "model_hf_file": "bert-bge-small/ggml-model-f16.gguf"}, 1)
    assert embed["models"][0]["pooling"] == "none"
    assert Path(embed["models"][0]["model"]).is_file()


@pytest.mark.parametrize(("extra", "category"), [
    ({"model_hf_repo": "bartowski/Phi-3.5-mini-instruct-GGUF:Q4_K_M"}, "needs-network"),
    ({"model_hf_repo": None, "model_hf_file": None}, "needs-network"),  # the router preset
    ({"server_tools": "all"}, "feature-not-served"),
    ({"server_host": "127.0.0.1,localhost"}, "feature-not-served"),
])
def test_what_cannot_be_mapped_is_refused_with_its_category(extra, category):
    with pytest.raises(flags.PluginRefusal, match=f"^{category}: ") as refused:
        flags.config_for({**TINYLLAMA2, **extra}, 1)
    assert refused.value.category == category
