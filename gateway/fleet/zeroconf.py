"""Serving without a config file: `modelyard serve FILE.gguf ...` and `--models-dir DIR`.

Both build the config a `modelyard scan` would write, in memory: one entry per model, aliases
from gateway/scan/ (a short family name such as `smollm2` where only one model has it, the
clean name, the file stem), `n_ctx` capped at what the model was trained for. The default model
(no arguments at all) is served the same way, so its aliases match a scan of the cache.

With `--models-dir`, the folder is watched (recursively): a GGUF file added or removed there
makes the registry reload exactly as a config edit would (gateway/fleet/watch.py's Reloader, with a
rescan in place of reading a file): new models are served at once, removed ones drain and go.
A folder left with no model keeps the last models (an invalid config never replaces a running
one) and logs why.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from watchfiles import Change, awatch

from gateway import scan
from gateway.config import Config, ConfigError, ModelEntry
from gateway.fleet.watch import Reloader, WatchOptions

log = logging.getLogger("modelyard.zeroconf")

N_CTX = 4096  # as scan writes it: this, capped at the model's trained context


def _config(found: Sequence[scan.FoundModel], source: Path | None, **server: object) -> Config:
    aliases = scan.assign_aliases(found)
    entries = [ModelEntry(model=m.path.absolute(), aliases=names,
                          mmproj=m.mmproj.absolute() if m.mmproj is not None else None,
                          n_ctx=min(N_CTX, m.n_ctx_train) if m.n_ctx_train > 0 else N_CTX)
               for m, names in zip(found, aliases)]
    return Config(models=entries, source=source, default_model=entries[0].name,
                  **server)


def config_for_files(paths: Sequence[str | os.PathLike[str]], **server: object) -> Config:
    """A config serving these model files; ConfigError naming every file that cannot be served."""
    found: list[scan.FoundModel] = []
    problems: list[str] = []
    seen: set[Path] = set()
    for path in paths:
        result = scan.examine_file(path)
        if isinstance(result, scan.Skipped):
            problems.append(f"{path}: {result.reason}")
        elif result.path.resolve() not in seen:
            seen.add(result.path.resolve())
            found.append(result)
    if problems:
        raise ConfigError("the command line", problems,
                          heading="cannot serve the model files on the command line")
    return _config(found, None, **server)


def config_for_dir(root: str | os.PathLike[str], **server: object) -> Config:
    """A config serving every model under `root`; ConfigError if there is none."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(str(root), [f"{root}: not a directory"],
                          heading="cannot serve the models folder given on the command line")
    result = scan.scan_dir(root)
    for skipped in result.skipped:
        if skipped.reason != scan.NOT_GGUF:
            log.warning("skipping %s: %s", skipped.path, skipped.reason)
    if not result.found:
        raise ConfigError(str(root), [f"{root}: no servable GGUF model in this folder"],
                          heading=f"cannot serve the models folder {root}")
    return _config(result.found, root.resolve(), **server)


def dir_loader(host: str, port: int, admin_closed: bool = False) -> object:
    """Reloader's `load` for a models folder: rescan, keeping where the server listens and
    whether its admin routes are closed (gateway/config/exposure.py)."""
    def load(root: Path) -> Config:
        config = config_for_dir(root, host=host, port=port)
        if not admin_closed:
            return config
        closed = config.auth.model_copy(update={"admin_closed": True})
        return config.model_copy(update={"auth": closed})
    return load


def _is_model_file(path: str) -> bool:
    return path.lower().endswith(".gguf")


class ModelsDirWatcher:
    """Turns GGUF files appearing or vanishing under the folder into Reloader.request()s."""

    def __init__(self, reloader: Reloader, options: WatchOptions) -> None:
        assert reloader.path is not None
        self._reloader = reloader
        self._root = reloader.path
        self._options = options
        self.watching: list[Path] = []
        self.polling = bool(options.force_polling)

    async def run(self) -> None:
        while True:
            self.watching = [self._root]
            log.info("watching %s for models added or removed", self._root)
            try:
                async for changes in awatch(
                        self._root, watch_filter=lambda change, path: _is_model_file(path),
                        recursive=True, debounce=self._options.debounce_ms,
                        step=self._options.step_ms, force_polling=self._options.force_polling,
                        poll_delay_ms=self._options.poll_delay_ms):
                    names = sorted({Path(p).name for change, p in changes
                                    if change in (Change.added, Change.deleted, Change.modified)})
                    if names:
                        self._reloader.request("models folder: " + ", ".join(names))
            except Exception as exc:  # noqa: BLE001 - the server goes on; so does watching
                log.warning("watching %s failed (%s); retrying in 1s", self._root, exc)
            await asyncio.sleep(1.0)
