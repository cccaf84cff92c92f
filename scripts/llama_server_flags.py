"""llama-server's command-line flags (llama.cpp's tests/utils.py `ServerProcess` attributes) as a
modelyard config, one local model standing in for the one each test preset downloads.

Used by scripts/llama_server_plugin.py; pure, so tests/gateway/test_llama_server_flags.py checks
the mapping without llama.cpp's sources.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from engine.chat_formats import builtin_name  # noqa: E402  (the repository, beside scripts/)

CACHE = Path(os.environ.get("MODELYARD_CACHE", "~/.cache/modelyard")).expanduser()
ENCODERS = REPO / "tests" / "data" / "encoders"
SMOL = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = CACHE / "gemma-3-270m-q4_k_m.gguf"

NEEDS_NETWORK = "needs-network"
NOT_SERVED = "feature-not-served"


class PluginRefusal(RuntimeError):
    """A server this plugin cannot start on modelyard; the message opens with the category."""

    def __init__(self, category: str, reason: str) -> None:
        super().__init__(f"{category}: {reason}")
        self.category = category


def _local_model(repo: str | None, file: str | None, model_file: str | None,
                 alias: str | None) -> Path:
    """The local file standing in for the model a test's preset downloads."""
    name = f"{repo or ''}/{file or ''}"
    if model_file:
        path = Path(model_file)
        if path.is_file():
            return path
        raise PluginRefusal(NEEDS_NETWORK, f"model file {model_file} is not here")
    if "bert-bge-small" in name:
        return ENCODERS / "bert_d64_l2_mean_f32.gguf"
    if "jina-reranker" in name:
        return ENCODERS / "bert_rerank_d64_l2_f32.gguf"
    if "tinygemma3" in name:
        return GEMMA
    if "split" in name:
        raise PluginRefusal(NEEDS_NETWORK, f"the split model {name} is only on Hugging Face")
    if "stories260K" in name or "stories15M" in name:
        return SMOL
    raise PluginRefusal(NEEDS_NETWORK, f"model {name} (alias {alias}) is only on Hugging Face")


def slot_context(n_ctx: int | None, n_slots: int | None, kv_unified: bool) -> int:
    """llama-server's context per slot: `--ctx-size` split over `--parallel` slots and padded
    to 256 (llama-context.cpp `n_ctx_seq`) unless the KV cache is unified; 0 (the model's
    trained context) when no size is given."""
    if not n_ctx:
        return 0
    if kv_unified or not n_slots or n_slots <= 1:
        return n_ctx
    per_slot = n_ctx // n_slots
    return (per_slot + 255) // 256 * 256


# flags no modelyard feature answers to; a server that sets one is refused
_UNSERVED = {
    "server_tools": "llama-server's built-in tools (--tools)",
    "mcp_servers_config": "MCP servers (--mcp-servers-config)",
    "mcp_servers_json": "MCP servers (--mcp-servers-json)",
    "ui_mcp_proxy": "the web UI's MCP proxy (--ui-mcp-proxy)",
    "gcp_compat": "Vertex AI's prediction routes (AIP_MODE)",
    "n_ga": "group attention (--grp-attn-n)",
    "enable_ctx_shift": "context shift (--context-shift)",
    "spec_synth_len": "synthetic speculative drafts (--spec-synth-len)",
    "spec_synth_rates": "synthetic speculative drafts (--spec-synth-rates)",
    "models_preset": "router presets (--models-preset)",
    "media_path": "local media files (--media-path)",
}


def config_for(flags: dict[str, Any], port: int) -> dict[str, Any]:
    """modelyard's config for a `ServerProcess`'s attributes (llama-server's flags)."""
    for key, what in _UNSERVED.items():
        if flags.get(key):
            raise PluginRefusal(NOT_SERVED, what)
    if "," in (flags.get("server_host") or ""):
        raise PluginRefusal(NOT_SERVED, "several listen addresses in --host")
    if flags.get("model_tags"):
        raise PluginRefusal(NOT_SERVED, "model tags (--tags)")
    names = [a.strip() for a in (flags.get("model_alias") or "").split(",") if a.strip()]
    alias = names[0] if names else None
    entry: dict[str, Any] = {}
    if flags.get("models_dir"):
        models: list[dict[str, Any]] = []
    elif not (flags.get("model_hf_repo") or flags.get("model_hf_file") or flags.get("model_file")):
        raise PluginRefusal(NEEDS_NETWORK, "a router whose models come from Hugging Face's cache")
    else:
        path = _local_model(flags.get("model_hf_repo"), flags.get("model_hf_file"),
                            flags.get("model_file"), alias)
        entry = {
            "model": str(path),
            # llama-server answers whatever "model" a request names; a glob does that here
            "aliases": [*(names or [path.stem]), "*"],
            "n_ctx": slot_context(flags.get("n_ctx"), flags.get("n_slots"),
                                  bool(flags.get("kv_unified"))),
            "n_parallel": flags.get("n_slots") or 4,
            "n_threads": flags.get("n_threads") or 2,
            "pinned": True,
        }
        if flags.get("temperature") is not None:
            entry["temperature"] = flags["temperature"]
        if flags.get("seed") is not None:
            entry["seed"] = flags["seed"]
        if (flags.get("n_predict") or 0) > 0:  # -1: llama-server's "until the context ends"
            entry["max_tokens"] = flags["n_predict"]
        if flags.get("pooling"):
            entry["pooling"] = flags["pooling"]
        if flags.get("ctk"):
            entry["type_k"] = flags["ctk"]
        if flags.get("ctv"):
            entry["type_v"] = flags["ctv"]
        if flags.get("fa") is not None:
            entry["flash_attn"] = flags["fa"] != "off"
        if flags.get("chat_template_file"):
            entry["chat_template"] = str(Path(flags["chat_template_file"]).resolve())
        elif flags.get("chat_template"):
            # --chat-template is a built-in template's name or a Jinja template's text
            known = builtin_name(flags["chat_template"]) is not None
            entry["chat_format" if known else "chat_template"] = flags["chat_template"]
        if flags.get("reasoning") == "off":  # --reasoning off: no thinking
            entry["reasoning_effort"] = "none"
        elif flags.get("reasoning") in ("on", "auto"):
            # llama-server then renders with enable_thinking true (common/chat.cpp); modelyard
            # passes it only when asked, so the entry asks
            entry["chat_template_kwargs"] = {"enable_thinking": True}
        if flags.get("reasoning_format"):
            entry["reasoning_format"] = flags["reasoning_format"]
        if flags.get("lora_files"):
            entry["lora"] = [{"path": str(Path(p).resolve())} for p in flags["lora_files"]]
        if flags.get("model_draft"):
            entry["draft"] = {"model": str(Path(flags["model_draft"]).resolve())}
        elif flags.get("spec_type"):
            entry["draft"] = {"lookup": "ngram"}
        if flags.get("spec_draft_n_max"):
            entry.setdefault("draft", {"lookup": "ngram"})["n_draft"] = flags["spec_draft_n_max"]
        if flags.get("sleep_idle_seconds") is not None:
            entry["idle_timeout"] = flags["sleep_idle_seconds"]
            entry["pinned"] = False
        models = [entry]
    config: dict[str, Any] = {
        "host": flags.get("server_host") or "127.0.0.1",
        "port": port,
        "shutdown_timeout": 2,
        "registry": {"max_loaded_models": flags.get("models_max") or 2,
                     "memory_budget": "8GiB"},
        "models": models,
    }
    if flags.get("api_key"):
        config["api_key"] = flags["api_key"]
    if flags.get("cors_origins"):
        config["cors"] = {"allow_origins": [o.strip() for o in
                                            str(flags["cors_origins"]).split(",")]}
    return config


FLAG_NAMES = (
    "server_host", "model_alias", "model_tags", "model_hf_repo", "model_hf_file", "model_file", "model_draft",
    "models_dir", "models_max", "models_preset", "n_ctx", "n_slots", "kv_unified", "n_threads",
    "temperature", "seed", "n_predict", "pooling", "ctk", "ctv", "fa", "chat_template",
    "chat_template_file", "reasoning", "reasoning_format", "lora_files", "spec_type", "spec_draft_n_max",
    "sleep_idle_seconds", "api_key", "cors_origins", *_UNSERVED,
)


