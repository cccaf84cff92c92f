"""Servers for tests: a Starlette app served by Hypercorn on 127.0.0.1 from a background thread
(Server: the gateway for a config file, with an OpenAI client), or `modelyard serve` in a child
process."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from gateway.app import create_app
from gateway.config import Config, load_config
from gateway.local.served_model import load_served_model
from gateway.state import app_state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThreadedServer:
    """Serves `app` until stop(); start() returns once `ready_path` answers."""

    ready_path = "/v1/models"

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            config = Config()
            config.bind = [f"127.0.0.1:{self.port}"]
            config.accesslog = None
            await serve(self.app, config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self._error = exc

    def start_serving(self, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + self.ready_path, timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                assert self._thread.is_alive(), f"server died: {self._error!r}"
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "server did not stop"
        assert self._error is None, repr(self._error)

    def on_loop(self, coro: Any, timeout: float = 10.0) -> Any:
        """Run a coroutine on the server's own event loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)


class ServerProcess:
    """`modelyard serve --config FILE` in a child process (for signals, exit codes and faults
    that must not take the test process with them); its log goes to a file."""

    def __init__(self, config_path: Any, log_path: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - open while it runs; a restart appends
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path),
             "--port", str(self.port), "--no-watch"],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 60.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"server exited early:\n{self.log()}"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not start:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return Path(self.log_path).read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


class Server(ThreadedServer):
    """create_app(config) served by Hypercorn on 127.0.0.1 from a background thread; a config
    file's path or a Config, and create_app's options (config_path, watch, load)."""

    def __init__(self, config: Path | Config, loader: Any = load_served_model,
                 **app_options: Any) -> None:
        self.config = config if isinstance(config, Config) else load_config(config)
        super().__init__(create_app(self.config, loader=loader, **app_options))
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0,
                                    timeout=120)

    def start(self) -> Server:
        self.start_serving()
        return self

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Registry state by first alias, read on the server's own event loop."""
        async def read() -> list[dict[str, Any]]:
            return app_state(self.app).registry.snapshot()

        return {row["aliases"][0]: row for row in self.on_loop(read())}

    def wait_until(self, predicate: Any, timeout: float = 20.0) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if predicate(snap):
                return snap
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not reached; registry: {snap}")
            time.sleep(0.05)


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
