"""The gateway for a config, one way for every test: as an app, behind Starlette's TestClient
(in process, lifespan run) or served by Hypercorn on a loopback port (tests/support/servers.py);
and any other ASGI app (a scripted upstream) hosted the same way.

A config is given as a path, YAML text, a dict or a Config; text and dicts are written to a file
in the folder first, so relative model paths resolve against it as they would for a user's file.
Everything opened is closed by close(), last opened first: tests/conftest.py's `apps`
(per test, in tmp_path) and `module_apps` (per module) fixtures call it at teardown.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from starlette.applications import Starlette
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import Config, load_config
from gateway.local.served_model import load_served_model
from tests.support.servers import Server, ThreadedServer

ConfigLike = Path | str | dict[str, Any] | Config


class Apps:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._names = (f"modelyard-{i}.yaml" if i else "modelyard.yaml" for i in itertools.count())
        self._closers: list[Callable[[], None]] = []

    def config(self, config: ConfigLike) -> Config:
        if isinstance(config, Config):
            return config
        if isinstance(config, Path):
            return load_config(config)
        text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
        path = next(p for p in map(self.folder.joinpath, self._names) if not p.exists())
        path.write_text(text)
        return load_config(path)

    def app(self, config: ConfigLike, *, loader: Any = load_served_model,
            **options: Any) -> Starlette:
        """create_app's options (config_path, watch, load) pass through."""
        return create_app(self.config(config), loader=loader, **options)

    def client(self, config: ConfigLike, *, loader: Any = load_served_model,
               raise_server_exceptions: bool = True, **options: Any) -> TestClient:
        """A TestClient whose app has started (its lifespan runs until close())."""
        client = TestClient(self.app(config, loader=loader, **options),
                            raise_server_exceptions=raise_server_exceptions)
        client.__enter__()
        self._closers.append(lambda: client.__exit__(None, None, None))
        return client

    def serve(self, config: ConfigLike, *, loader: Any = load_served_model,
              ready_path: str = Server.ready_path, **options: Any) -> Server:
        """Served on a loopback port once `ready_path` answers; `.client` is an OpenAI client."""
        server = Server(self.config(config), loader=loader, **options)
        server.ready_path = ready_path
        server.start()
        self._closers.append(server.stop)
        return server

    def host(self, app: Any, *, ready_path: str = ThreadedServer.ready_path) -> ThreadedServer:
        """Any ASGI app (a scripted upstream, say) on a loopback port, as serve() does."""
        server = ThreadedServer(app)
        server.ready_path = ready_path
        server.start_serving()
        self._closers.append(server.stop)
        return server

    def close(self) -> None:
        errors: list[BaseException] = []
        while self._closers:
            try:
                self._closers.pop()()
            except BaseException as exc:  # noqa: BLE001 - close the rest, then report
                errors.append(exc)
        if errors:
            raise errors[0]
