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

from llama_server_flags import FLAG_NAMES, NEEDS_NETWORK, REPO, PluginRefusal, config_for


def _start(self: Any, timeout_seconds: int = 60) -> None:
    """`ServerProcess.start`, launching modelyard instead of llama-server."""
    import utils  # the upstream tests' module, on sys.path beside them

    flags = {name: getattr(self, name, None) for name in FLAG_NAMES}
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
