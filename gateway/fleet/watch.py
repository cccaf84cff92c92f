"""Config hot reload: validate -> registry.apply(diff) -> record. No restart, no failed request.

Three triggers, one path:

    file saved (watchfiles) --+
    SIGHUP -------------------+--> Reloader.request(why) --> gathered until quiet for `settle` s --+
                                                                                                  |
    POST /admin/reload -------------------------------------> Reloader.reload(why) <--------------+
                                                               | one reload at a time (a lock)
                                                               v
                             load_config(file) in a thread ---- invalid ----> keep the running
                               | valid                                        config; record
                               v                                              {ok: false, errors}
                             on the event loop, with no await in between:
                             registry.apply(new) and the app state's config = new
                               -> a request resolves its model against the old config or the
                                  new one, never a mix; record {ok: true, kept, reloaded, ...}

The registry does the diff (see Registry.apply): unchanged entries stay loaded, changed ones drain
and load again on next use, removed ones drain and unload, new ones are served at once.

Rapid saves (an editor writing twice, a file replaced by rename): triggers that arrive within
`settle` seconds of each other make one reload, and triggers that arrive while a reload runs
make exactly one more after it, which reads the file as it is then. So the last state of the file
always wins and a model is never loaded twice for one edit.

The watcher watches the directories holding the config file and the chat template files it
names (editors replace files by renaming, which a watch on the file itself would miss), keeps
the events for those files, and restarts when a reload changes which template files are named.
A config file that is a symlink (Kubernetes ConfigMap mounts swap a `..data` link) reloads on any
change in its directory.

File systems without change events (container mounts, network shares) need polling. That is
done here rather than with watchfiles' `force_polling`, whose poller compares modification times
in whole seconds and so misses a second save within the same second; this one compares the
files' contents (config files are small), read through symlinks.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from watchfiles import Change, awatch

from gateway.config import Config, ConfigError, load_config, restart_needed
from gateway.fleet.registry import ApplyResult
from gateway.metrics import NULL_METRICS, MetricsSink

__all__ = ["ConfigWatcher", "ReloadRecord", "Reloader", "WatchOptions"]

log = logging.getLogger("modelyard.watch")

SETTLE_SECONDS = 0.15  # quiet time that ends a burst of saves


@dataclass(frozen=True)
class WatchOptions:
    """How `modelyard serve` watches its config (`--watch/--no-watch`, `--watch-poll`)."""

    enabled: bool = True
    force_polling: bool | None = None  # None: poll if WATCHFILES_FORCE_POLLING says so
    poll_delay_ms: int = 300
    step_ms: int = 50                   # watchfiles: a change batch ends after this much quiet
    debounce_ms: int = 500              # watchfiles: ... or after this long in any case
    models_dir: bool = False            # the path is a models folder (gateway/fleet/zeroconf.py)


@dataclass(frozen=True)
class ReloadRecord:
    """The outcome of one reload, as `GET /admin/status` shows it in `last_reload`."""

    ok: bool
    at: float                    # unix time
    trigger: str                 # "file change: modelyard.yaml", "SIGHUP", "admin", ...
    errors: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)      # by first alias, see ApplyResult
    reloaded: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    restart_needed: list[str] = field(default_factory=list)  # settings only a restart applies
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Reconfigurable(Protocol):
    """What a reload swaps the config of: the app's Router (local models and upstreams), or a
    bare Registry."""

    @property
    def config(self) -> Config: ...

    @property
    def closed(self) -> bool: ...

    def apply(self, config: Config) -> ApplyResult: ...


class Reloader:
    """Reloads the config file into a running registry, one reload at a time."""

    def __init__(self, registry: Reconfigurable, path: Path | None, *,
                 on_applied: Callable[[Config], None] = lambda config: None,
                 metrics: MetricsSink = NULL_METRICS, settle: float = SETTLE_SECONDS,
                 load: Callable[[Path], Config] | None = None) -> None:
        self.registry = registry
        self.path = path                  # None: serving a config built in code (no file)
        self._load = load                 # path -> Config (None: load_config); a models folder
                                          # rescans instead (zeroconf.py)
        self.last: ReloadRecord | None = None
        self.counts = {"ok": 0, "error": 0}
        self._on_applied = on_applied
        self._metrics = metrics
        self._settle = settle
        self._lock = asyncio.Lock()
        self._wanted = asyncio.Event()
        self._why: list[str] = []
        self._listeners: list[Callable[[], None]] = []

    def watched_paths(self) -> list[Path]:
        """The config file and every chat template file the running config names."""
        if self.path is None:
            return []
        templates = {e.chat_template_path for e in self.registry.config.models
                     if e.chat_template_path is not None}
        return [self.path, *sorted(templates)]

    def on_paths_changed(self, listener: Callable[[], None]) -> None:
        """Call `listener` after a reload that changed watched_paths() (the watcher restarts)."""
        self._listeners.append(listener)

    # -- reloading -------------------------------------------------------------------------------

    def request(self, why: str) -> None:
        """Ask for a reload soon (file change, SIGHUP); bursts make one reload. See run()."""
        self._why.append(why)
        self._wanted.set()

    async def run(self) -> None:
        """Carry out request()s until cancelled: wait for quiet, then reload once."""
        while True:
            await self._wanted.wait()
            while True:  # a burst of triggers ends after `settle` seconds without one
                self._wanted.clear()
                await asyncio.sleep(self._settle)
                if not self._wanted.is_set():
                    break
            why, self._why = self._why, []
            try:
                await self.reload(", ".join(dict.fromkeys(why)) or "request")
            except Exception:  # noqa: BLE001 - a bug here must not end reloading for good
                log.exception("config reload failed")

    async def reload(self, trigger: str) -> ReloadRecord:
        """Read, check and apply the config file now; invalid files change nothing."""
        async with self._lock:
            record = await self._reload(trigger)
            self.last = record
            self.counts["ok" if record.ok else "error"] += 1
            self._metrics.config_reloaded(record.ok)
            return record

    async def _reload(self, trigger: str) -> ReloadRecord:
        now = time.time()
        if self.registry.closed:
            return ReloadRecord(False, now, trigger, errors=["the server is shutting down"])
        if self.path is None:
            return ReloadRecord(False, now, trigger, errors=[
                "serving the built-in default config: there is no config file to reload "
                "(start with --config FILE)"])
        try:
            new = await asyncio.to_thread(self._load or load_config, self.path)
        except ConfigError as exc:
            log.error("config reload (%s) failed; still serving the previous config:\n%s",
                      trigger, "\n".join(f"  {e}" for e in exc.errors))
            return ReloadRecord(False, now, trigger, errors=list(exc.errors))
        except Exception as exc:  # noqa: BLE001 - a reload must never take the server down
            log.exception("config reload (%s) failed; still serving the previous config", trigger)
            return ReloadRecord(False, now, trigger, errors=[f"{type(exc).__name__}: {exc}"])

        # From here to the end: no await, so no request runs between the two swaps.
        old = self.registry.config
        paths_before = self.watched_paths()
        result = self.registry.apply(new)
        self._on_applied(new)
        restart = restart_needed(old, new)
        record = ReloadRecord(True, now, trigger, kept=result.kept, reloaded=result.reloaded,
                              added=result.added, removed=result.removed, restart_needed=restart,
                              warnings=list(new.warnings))
        log.info("config reloaded (%s): %s", trigger, _summary(record))
        for item in restart:
            log.warning("%s changed in the config; restart modelyard to apply it", item)
        if self.watched_paths() != paths_before:
            for listener in self._listeners:
                listener()
        return record


def _summary(r: ReloadRecord) -> str:
    parts = [f"{what} {', '.join(names)}" for what, names in
             (("kept", r.kept), ("reloading", r.reloaded), ("added", r.added),
              ("removed", r.removed)) if names]
    return "; ".join(parts) or "no models"


# ------------------------------------------------------------------------------------- watching

class ConfigWatcher:
    """Turns changes to the config (and its template files) into Reloader.request()s."""

    def __init__(self, reloader: Reloader, options: WatchOptions) -> None:
        self._reloader = reloader
        self._options = options
        self._restart = asyncio.Event()
        reloader.on_paths_changed(lambda: self._restart.set())  # the current event
        self.watching: list[Path] = []  # set once changes to these files are being seen

    async def run(self) -> None:
        """Watch until cancelled; a watch that fails (a directory vanished) is retried."""
        while True:
            paths = self._reloader.watched_paths()
            dirs = sorted({p.parent for p in paths if p.parent.is_dir()})
            self._restart = asyncio.Event()
            self.watching = []
            if not dirs:
                log.warning("cannot watch %s: no such directory; retrying",
                            ", ".join(str(p) for p in paths))
                await _sleep_until(self._restart, 1.0)
                continue
            polling = self.polling
            log.info("watching %s for changes%s", ", ".join(str(p) for p in paths),
                     f" (polling every {self._options.poll_delay_ms}ms)" if polling else "")
            try:
                await (self._poll(paths) if polling else self._watch(paths, dirs))
            except Exception as exc:  # noqa: BLE001 - the server goes on; so does watching
                log.warning("watching the config failed (%s); retrying in 1s", exc)
                await asyncio.sleep(1.0)

    @property
    def polling(self) -> bool:
        if self._options.force_polling is not None:
            return self._options.force_polling
        env = os.environ.get("WATCHFILES_FORCE_POLLING", "")
        return env.lower() not in ("", "false", "disable", "disabled")

    async def _poll(self, paths: list[Path]) -> None:
        """Compare the files' contents every poll_delay_ms until told to restart."""
        restart = self._restart
        seen = await asyncio.to_thread(_fingerprints, paths)
        self.watching = paths
        while not restart.is_set():
            await _sleep_until(restart, self._options.poll_delay_ms / 1000)
            now = await asyncio.to_thread(_fingerprints, paths)
            changed = [p.name for p in paths if now[p] != seen[p]]
            seen = now
            if changed:
                self._reloader.request("file change: " + ", ".join(sorted(set(changed))))

    async def _watch(self, paths: list[Path], dirs: list[Path]) -> None:
        targets = {str(p) for p in paths}
        # A symlinked file changes by its link (or a link in its directory) being swapped.
        any_change_in = {str(p.parent) for p in paths if p.is_symlink()}

        def wanted(change: Change, path: str) -> bool:
            return path in targets or str(Path(path).parent) in any_change_in

        o = self._options
        # awatch registers the watch as the loop first enters it, before this task yields again
        self.watching = paths
        async for changes in awatch(*dirs, watch_filter=wanted, stop_event=self._restart,
                                    recursive=False, debounce=o.debounce_ms, step=o.step_ms,
                                    force_polling=False):
            names = sorted({Path(p).name for _, p in changes})
            self._reloader.request("file change: " + ", ".join(names))


def _fingerprints(paths: list[Path]) -> dict[Path, bytes | None]:
    """Each file's content digest (through symlinks); None when it cannot be read."""
    out: dict[Path, bytes | None] = {}
    for path in paths:
        try:
            out[path] = hashlib.blake2b(path.read_bytes(), digest_size=16).digest()
        except OSError:
            out[path] = None
    return out


async def _sleep_until(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
