"""Config reload: the Reloader against a real Registry with a recording loader, and the watcher
against real file changes (inotify and polling). Model files are empty placeholders: the config
only checks that they exist, and the fake loader never reads them."""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import yaml

import gateway.fleet.watch as watch_module
from gateway.config import Config, load_config
from gateway.fleet.registry import Registry
from gateway.fleet.watch import ConfigWatcher, Reloader, WatchOptions
from gateway.metrics import Metrics
from tests.support.fakes import MB, RecordingLoader, run
from tests.support.ggufgen import write_servable


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def entry(name: str, *aliases: str, **settings: Any) -> dict[str, Any]:
    return {"model": f"{name}.gguf", "aliases": [name, *aliases], **settings}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in ("keep", "change", "drop", "new", "a", "b", "c"):
        write_servable(tmp_path / f"{name}.gguf")
    return tmp_path


def start(path: Path, loader: RecordingLoader, **kwargs: Any) -> tuple[Registry, Reloader, list[Config]]:
    """A started registry for the file at `path` and its reloader (call inside a loop)."""
    registry = Registry(load_config(path), loader=loader, estimator=lambda e: MB)
    applied: list[Config] = []
    reloader = Reloader(registry, path, on_applied=applied.append, **kwargs)
    return registry, reloader, applied


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


def states(registry: Registry) -> dict[str, str]:
    return {r["aliases"][0]: r["state"] for r in registry.snapshot()}


async def use(registry: Registry, *aliases: str) -> None:
    for alias in aliases:
        async with registry.lease(alias):
            pass


# ------------------------------------------------------------------------------------- reload

def test_reload_applies_the_diff_entry_by_entry(folder: Path) -> None:
    path = write(folder / "modelyard.yaml", {
        "registry": {"max_loaded_models": 4},
        "models": [entry("keep"), entry("change", n_ctx=512), entry("drop")]})
    loader = RecordingLoader()

    async def main() -> None:
        registry, reloader, applied = start(path, loader)
        await registry.start()
        await use(registry, "keep", "change", "drop")
        write(path, {"registry": {"max_loaded_models": 4}, "models": [
            entry("keep", "keep-too"), entry("change", n_ctx=1024), entry("new")]})

        record = await reloader.reload("test")

        assert record.ok and record.errors == [] and record.trigger == "test"
        assert (record.kept, record.reloaded, record.added, record.removed) == \
            (["keep"], ["change"], ["new"], ["drop"])
        assert reloader.last == record and reloader.counts == {"ok": 1, "error": 0}
        assert applied == [registry.config]                 # the app's view swapped with it
        assert registry.config.aliases() == ["keep", "keep-too", "change", "new"]
        await use(registry, "keep-too", "new", "change")
        await until(lambda: sorted(loader.closed()) == ["change", "drop"])
        # the unchanged model stayed warm; only "change" loaded again, with the new n_ctx
        assert loader.loads == ["keep", "change", "drop", "new", "change"]
        assert loader.models[-1].entry.n_ctx == 1024
        await registry.close()

    run(main())


@pytest.mark.parametrize("text, expected", [
    ("models:\n  - model: keep.gguf\n    aliases: [keep\n", "invalid YAML"),
    ("models:\n  - model: keep.gguf\n    aliases: [x]\n  - model: change.gguf\n"
     "    aliases: [x]\n", "duplicate alias 'x'"),
    ("models:\n  - model: gone.gguf\n", "model file not found"),
    ("models: []\n", "at least one model"),
])
def test_an_invalid_file_changes_nothing_and_is_recorded(folder: Path, text: str,
                                                          expected: str) -> None:
    path = write(folder / "modelyard.yaml", {"models": [entry("keep"), entry("change")]})
    loader = RecordingLoader()

    async def main() -> None:
        registry, reloader, applied = start(path, loader)
        await registry.start()
        await use(registry, "keep")
        before = registry.config
        path.write_text(text)

        record = await reloader.reload("test")

        assert not record.ok and record.kept == [] and applied == []
        assert any(expected in e for e in record.errors), record.errors
        assert all(e.startswith(str(path)) for e in record.errors)  # file (and line) named
        assert registry.config is before and reloader.counts == {"ok": 0, "error": 1}
        await use(registry, "keep", "change")                 # still serving the old config
        assert loader.loads == ["keep", "change"] and loader.closed() == []
        await registry.close()

    run(main())


def test_a_config_built_in_code_has_no_file_to_reload(folder: Path) -> None:
    config = load_config(write(folder / "modelyard.yaml", {"models": [entry("keep")]}))

    async def main() -> None:
        reloader = Reloader(Registry(config, loader=RecordingLoader(), estimator=lambda e: MB), None)
        record = await reloader.reload("SIGHUP")
        assert not record.ok and "no config file" in record.errors[0]
        assert reloader.watched_paths() == []

    run(main())


def test_host_and_port_changes_say_a_restart_is_needed(folder: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    path = write(folder / "modelyard.yaml", {"port": 8080, "models": [entry("keep")]})

    async def main() -> None:
        _, reloader, _ = start(path, RecordingLoader())
        write(path, {"host": "0.0.0.0", "port": 9090, "models": [entry("keep")]})
        with caplog.at_level(logging.WARNING, logger="modelyard.watch"):
            record = await reloader.reload("test")
        assert record.ok and record.restart_needed == [
            "host ('127.0.0.1' -> '0.0.0.0')", "port (8080 -> 9090)"]
        assert "restart modelyard" in caplog.text and "9090" in caplog.text
        again = await reloader.reload("test")  # compared with the running config: said once
        assert again.restart_needed == []

    run(main())


def test_reloads_are_counted_in_metrics(folder: Path) -> None:
    path = write(folder / "modelyard.yaml", {"models": [entry("keep")]})
    metrics = Metrics()

    async def main() -> None:
        _, reloader, _ = start(path, RecordingLoader(), metrics=metrics)
        await reloader.reload("a")
        path.write_text("models: [")
        await reloader.reload("b")
        await reloader.reload("c")

    run(main())
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.labels["result"]: s.value
               for f in text_string_to_metric_families(metrics.render().decode())
               if f.name == "modelyard_config_reloads" for s in f.samples
               if s.name.endswith("_total")}
    assert samples == {"ok": 1.0, "error": 2.0}


# ------------------------------------------------------------------------ bursts and ordering

def test_a_burst_of_triggers_makes_one_reload(folder: Path) -> None:
    path = write(folder / "modelyard.yaml", {"models": [entry("keep")]})

    async def main() -> None:
        _, reloader, applied = start(path, RecordingLoader(), settle=0.05)
        runner = asyncio.create_task(reloader.run())
        for _ in range(5):
            reloader.request("file change: modelyard.yaml")
            await asyncio.sleep(0.01)  # closer together than `settle`
        reloader.request("SIGHUP")
        await until(lambda: reloader.last is not None)
        await asyncio.sleep(0.2)       # nothing else is pending: no second reload comes
        runner.cancel()
        assert len(applied) == 1
        assert reloader.last is not None
        assert reloader.last.trigger == "file change: modelyard.yaml, SIGHUP"

    run(main())


def test_a_trigger_during_a_reload_makes_exactly_one_more_which_reads_the_latest_file(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(folder / "modelyard.yaml", {"models": [entry("a")]})
    reading = threading.Event()
    release = threading.Event()
    reads: list[list[str]] = []

    def slow_load(p: Path) -> Config:
        config = load_config(p)
        reads.append(config.aliases())
        if len(reads) == 1:
            reading.set()
            release.wait(10)  # the first reload is still reading while the file changes
        return config

    monkeypatch.setattr(watch_module, "load_config", slow_load)
    loader = RecordingLoader()

    async def main() -> None:
        registry, reloader, applied = start(path, loader, settle=0.02)
        await registry.start()
        runner = asyncio.create_task(reloader.run())
        reloader.request("save 1")
        await until(reading.is_set)
        for n in (2, 3, 4):  # three more saves while the first reload runs
            write(path, {"models": [entry("a", f"a{n}")]})
            reloader.request(f"save {n}")
        release.set()
        await until(lambda: len(applied) == 2)
        await asyncio.sleep(0.2)
        runner.cancel()
        assert len(applied) == 2 and reads[-1] == ["a", "a4"]
        assert registry.config.aliases() == ["a", "a4"]      # the last save won
        await use(registry, "a4")
        assert loader.loads == ["a"]
        await registry.close()

    run(main())


def test_concurrent_reloads_run_one_at_a_time(folder: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(folder / "modelyard.yaml", {"models": [entry("a")]})
    active = 0
    overlapped = False

    def counting_load(p: Path) -> Config:
        nonlocal active, overlapped
        active += 1
        overlapped |= active > 1
        time.sleep(0.05)
        try:
            return load_config(p)
        finally:
            active -= 1

    monkeypatch.setattr(watch_module, "load_config", counting_load)

    async def main() -> None:
        _, reloader, applied = start(path, RecordingLoader())
        records = await asyncio.gather(*(reloader.reload(f"admin {i}") for i in range(4)))
        assert all(r.ok for r in records) and len(applied) == 4

    run(main())
    assert not overlapped


# ---------------------------------------------------------------------------------- limits

def test_lowered_limits_evict_idle_models_at_once_least_recently_used_first(
        folder: Path) -> None:
    models = [entry("a"), entry("b"), entry("c")]
    path = write(folder / "modelyard.yaml", {"registry": {"max_loaded_models": 3},
                                             "models": models})
    loader = RecordingLoader()

    async def main() -> None:
        registry, reloader, _ = start(path, loader)
        await registry.start()
        await use(registry, "b", "a", "c")  # least recently used: b, then a
        write(path, {"registry": {"max_loaded_models": 1}, "models": models})
        assert (await reloader.reload("test")).ok
        await until(lambda: states(registry) == {"a": "unloaded", "b": "unloaded",
                                                 "c": "ready"})
        assert sorted(loader.closed()) == ["a", "b"]

        write(path, {"registry": {"max_loaded_models": 3, "memory_budget": "1.5MiB"},
                     "models": models})
        await use(registry, "a")            # c and a loaded: 2 MiB, over the budget once applied
        lease = await registry.acquire("a")  # a is busy, c idle: c goes, a stays
        assert (await reloader.reload("test")).ok
        await until(lambda: loader.closed().count("c") == 1)
        assert states(registry)["a"] == "ready"
        registry.release(lease)
        await registry.close()

    run(main())


def test_a_busy_model_over_a_lowered_limit_goes_when_it_is_done(folder: Path) -> None:
    models = [entry("a"), entry("b")]
    path = write(folder / "modelyard.yaml", {"registry": {"max_loaded_models": 2},
                                             "models": models})
    loader = RecordingLoader()

    async def main() -> None:
        registry, reloader, _ = start(path, loader)
        await registry.start()
        a = await registry.acquire("a")
        b = await registry.acquire("b")
        write(path, {"registry": {"max_loaded_models": 1}, "models": models})
        assert (await reloader.reload("test")).ok
        await asyncio.sleep(0.05)
        assert loader.closed() == []        # both serving: nothing can go yet
        registry.release(a)                 # a is done (and least recently used): a goes
        await until(lambda: loader.closed() == ["a"])
        registry.release(b)
        await asyncio.sleep(0.05)
        assert loader.closed() == ["a"]     # b alone fits: it stays
        await registry.close()

    run(main())


# ---------------------------------------------------------------------------------- watching

Body = Callable[[Registry, Reloader, ConfigWatcher], Coroutine[Any, Any, None]]


async def watching(path: Path, loader: RecordingLoader, options: WatchOptions, body: Body) -> None:
    registry, reloader, _ = start(path, loader, settle=0.05)
    watcher = ConfigWatcher(reloader, options)
    await registry.start()
    tasks = [asyncio.create_task(reloader.run()), asyncio.create_task(watcher.run())]
    try:
        await until(lambda: watcher.watching == [path])
        await body(registry, reloader, watcher)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await registry.close()


def reloads(reloader: Reloader) -> int:
    return reloader.counts["ok"] + reloader.counts["error"]


MODES = pytest.mark.parametrize("polling", [False, True], ids=["events", "polling"])


@MODES
def test_saving_the_file_reloads_it(folder: Path, polling: bool) -> None:
    path = write(folder / "modelyard.yaml", {"models": [entry("a")]})
    options = WatchOptions(force_polling=polling, poll_delay_ms=50)

    async def body(registry: Registry, reloader: Reloader, watcher: ConfigWatcher) -> None:
        write(path, {"models": [entry("a", "a-too")]})
        await until(lambda: "a-too" in registry.config.aliases())
        assert reloader.last is not None and reloader.last.trigger == "file change: modelyard.yaml"
        write(path, {"models": [entry("a", "a-3")]})  # a second save within the same second
        await until(lambda: "a-3" in registry.config.aliases())
        (folder / "unrelated.txt").write_text("not the config")
        await asyncio.sleep(0.5)
        assert reloads(reloader) == 2  # other files in the folder are ignored

    run(watching(path, RecordingLoader(), options, body))


@MODES
def test_a_file_replaced_by_rename_is_followed(folder: Path, polling: bool) -> None:
    path = write(folder / "modelyard.yaml", {"models": [entry("a")]})

    async def body(registry: Registry, reloader: Reloader, watcher: ConfigWatcher) -> None:
        for n in (1, 2):  # twice: the watch survives the file being replaced
            staged = write(folder / ".modelyard.yaml.tmp", {"models": [entry("a", f"a{n}")]})
            os.replace(staged, path)
            await until(lambda n=n: f"a{n}" in registry.config.aliases())

    run(watching(path, RecordingLoader(), WatchOptions(force_polling=polling, poll_delay_ms=50), body))


@MODES
def test_chat_template_files_are_watched_too(folder: Path, polling: bool) -> None:
    template = folder / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    path = write(folder / "modelyard.yaml", {"models": [entry("a"), entry("b")]})
    loader = RecordingLoader()

    async def body(registry: Registry, reloader: Reloader, watcher: ConfigWatcher) -> None:
        await use(registry, "a", "b")
        # the config names a template file for the first time: the watcher adds it
        write(path, {"models": [entry("a", chat_template="chat.jinja"), entry("b")]})
        await until(lambda: reloader.last is not None and reloader.last.reloaded == ["a"])
        await until(lambda: watcher.watching == [path, template.resolve()])  # restarted
        await use(registry, "a")  # loads again, with the template
        template.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
        await until(lambda: "[{{" in (registry.config.models[0].chat_template or ""))
        assert reloader.last is not None and reloader.last.trigger == "file change: chat.jinja"
        assert reloader.last.reloaded == ["a"] and reloader.last.kept == ["b"]
        await use(registry, "a", "b")
        assert loader.loads == ["a", "b", "a", "a"]  # b stayed warm throughout

    run(watching(path, loader, WatchOptions(force_polling=polling, poll_delay_ms=50), body))


@MODES
def test_a_symlinked_config_swapped_like_a_configmap_is_followed(folder: Path,
                                                                 polling: bool) -> None:
    mount = folder / "mount"
    mount.mkdir()
    for version, aliases in (("v1", ["a"]), ("v2", ["a", "a-v2"])):
        (mount / version).mkdir()
        write(mount / version / "modelyard.yaml", {"models": [
            {"model": str(folder / "a.gguf"), "aliases": aliases}]})
    (mount / "..data").symlink_to("v1")
    path = mount / "modelyard.yaml"
    path.symlink_to("..data/modelyard.yaml")

    async def body(registry: Registry, reloader: Reloader, watcher: ConfigWatcher) -> None:
        (mount / "..data_tmp").symlink_to("v2")
        os.replace(mount / "..data_tmp", mount / "..data")  # how kubelet updates a ConfigMap
        await until(lambda: "a-v2" in registry.config.aliases())

    run(watching(path, RecordingLoader(), WatchOptions(force_polling=polling, poll_delay_ms=50), body))
