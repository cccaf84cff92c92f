"""A pytest plugin that runs llama.cpp's own server tests against `modelyard serve`.

llama.cpp's `tools/server/tests/utils.py` starts `llama-server` with command-line flags taken
from a `ServerProcess`'s attributes, on tiny models it downloads from Hugging Face. This plugin
replaces `ServerProcess.start` with a launch of `modelyard serve --config FILE`, the config
mapping those attributes onto one local model (`config_for`), and makes `ServerPreset.load_all`
(the downloads) a no-op. The upstream files run unchanged; `scripts/llama_server_tests.py` runs
them with this plugin and classifies the outcomes.

A server that cannot be mapped (a model only Hugging Face has, a feature modelyard does not
serve) is refused with a `PluginRefusal` whose message starts with its category, so the runner
classifies those tests without a list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
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
    alias = flags.get("model_alias")
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
            "aliases": [alias or path.stem, "*"],
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
        if flags.get("n_predict"):
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
            entry["chat_format"] = flags["chat_template"]
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


_FLAG_NAMES = (
    "server_host", "model_alias", "model_hf_repo", "model_hf_file", "model_file", "model_draft",
    "models_dir", "models_max", "models_preset", "n_ctx", "n_slots", "kv_unified", "n_threads",
    "temperature", "seed", "n_predict", "pooling", "ctk", "ctv", "fa", "chat_template",
    "chat_template_file", "reasoning_format", "lora_files", "spec_type", "spec_draft_n_max",
    "sleep_idle_seconds", "api_key", "cors_origins", *_UNSERVED,
)


def _start(self: Any, timeout_seconds: int = 60) -> None:
    """`ServerProcess.start`, launching modelyard instead of llama-server."""
    import utils  # the upstream tests' module, on sys.path beside them

    flags = {name: getattr(self, name, None) for name in _FLAG_NAMES}
    config = config_for(flags, int(self.server_port))
    folder = Path(tempfile.mkdtemp(prefix="modelyard-upstream-"))
    config_path = folder / "config.json"
    config_path.write_text(json.dumps(config, indent=1))
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path),
            "--no-watch", "--log-level", "warning"]
    if flags.get("models_dir"):
        argv += ["--models-dir", str(Path(flags["models_dir"]).resolve())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")])}
    print(f"tests: starting modelyard with {json.dumps(config)}")
    self._log = sys.stdout
    self.process = subprocess.Popen(argv, env=env, cwd=str(REPO))
    utils.server_instances.add(self)
    headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
    deadline = time.time() + max(timeout_seconds, 120)
    while time.time() < deadline:
        try:
            if self.make_request("GET", "/health", headers=headers).status_code == 200:
                self.ready = True
                return
        except OSError:  # requests' connection errors are OSErrors: not listening yet
            pass
        if self.process.poll() is not None:
            raise RuntimeError(f"modelyard exited with {self.process.returncode}")
        time.sleep(0.05)
    raise TimeoutError("modelyard did not answer /health in time")


def _install_stubs() -> None:
    """The upstream files import `wget` and `filelock` at the top; neither is needed here."""
    if "wget" not in sys.modules:
        try:
            import wget  # noqa: F401
        except ImportError:
            stub = types.ModuleType("wget")

            def download(url: str, out: str | None = None) -> str:
                raise PluginRefusal(NEEDS_NETWORK, f"download of {url}")

            stub.download = download  # type: ignore[attr-defined]
            sys.modules["wget"] = stub
    try:
        import filelock  # noqa: F401
    except ImportError:
        stub = types.ModuleType("filelock")

        class FileLock:
            def __init__(self, path: str) -> None:
                self.path = path

            def __enter__(self) -> FileLock:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

        stub.FileLock = FileLock  # type: ignore[attr-defined]
        sys.modules["filelock"] = stub


# before the upstream conftest.py is imported, which happens ahead of pytest_configure
_install_stubs()


def pytest_configure(config: Any) -> None:
    import utils

    utils.ServerProcess.start = _start
    utils.ServerPreset.load_all = staticmethod(lambda: None)
    results_path = os.environ.get("MODELYARD_UPSTREAM_RESULTS")
    if results_path:
        config._modelyard_results = {"path": results_path, "tests": {}}


def pytest_runtest_logreport(report: Any) -> None:
    config = pytest_runtest_logreport.config  # type: ignore[attr-defined]
    store = getattr(config, "_modelyard_results", None)
    if store is None:
        return
    tests = store["tests"]
    if report.when == "call" or report.outcome != "passed":
        text = ""
        if report.outcome == "failed" and report.longrepr is not None:
            text = str(report.longrepr)[-4000:]
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            text = str(report.longrepr[2])
        previous = tests.get(report.nodeid)
        if previous is None or previous["outcome"] == "passed":
            tests[report.nodeid] = {"outcome": report.outcome, "when": report.when,
                                    "text": text}


def pytest_sessionstart(session: Any) -> None:
    pytest_runtest_logreport.config = session.config  # type: ignore[attr-defined]


def pytest_sessionfinish(session: Any) -> None:
    store = getattr(session.config, "_modelyard_results", None)
    if store is not None:
        Path(store["path"]).write_text(json.dumps(store["tests"], indent=1))
