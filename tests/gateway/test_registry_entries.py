"""Registry slots are keyed by entry: several entries on one file, each with its own settings,
the file counted once in the memory budget; a model that breaks stops being ready; last_error."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gateway.config import Config, ModelEntry, RegistrySettings
from gateway.fleet.registry import Registry
from tests.support.apps import Apps
from tests.support.fakes import MB, FakeModel, RecordingLoader, run, state
from tests.support.ggufgen import TINY_SPECIAL, write_tiny_llama


class MappedLoader(RecordingLoader):
    """Fake models that map a file of FILE bytes and hold KV bytes of their own."""

    FILE, KV = 100 * MB, 10 * MB

    def __call__(self, entry: ModelEntry) -> FakeModel:
        model = super().__call__(entry)
        model.memory_bytes = self.FILE + self.KV
        model.mapped_bytes = self.FILE
        return model

    def estimate(self, entry: ModelEntry) -> int:
        return self.FILE + self.KV


def _two_on_one_file(tmp_path: Path, budget: int) -> Config:
    path = tmp_path / "shared.gguf"
    return Config(registry=RegistrySettings(max_loaded_models=3, memory_budget=budget), models=[
        ModelEntry(model=path, aliases=["short"], n_ctx=512),
        ModelEntry(model=path, aliases=["long"], n_ctx=4096),
    ])


def test_entries_on_one_file_load_separately_and_count_the_file_once(tmp_path: Path) -> None:
    loader = MappedLoader()
    # room for the file once and two KV caches, not for the file twice
    config = _two_on_one_file(tmp_path, budget=125 * MB)
    registry = Registry(config, loader=loader, estimator=loader.estimate)

    async def scenario() -> None:
        for alias in ("short", "long"):
            async with registry.lease(alias) as lease:
                assert lease.entry.n_ctx == {"short": 512, "long": 4096}[alias]
        await registry.close()

    run(scenario())
    assert loader.loads == ["short", "long"]
    assert loader.closed() == ["short", "long"]  # closed at the end, not evicted for the other


def test_without_the_room_the_second_entry_of_a_file_evicts_the_first(tmp_path: Path) -> None:
    loader = MappedLoader()
    config = _two_on_one_file(tmp_path, budget=115 * MB)  # the file and one KV cache only
    registry = Registry(config, loader=loader, estimator=loader.estimate)

    async def scenario() -> None:
        async with registry.lease("short"):
            pass
        async with registry.lease("long"):
            assert state(registry, "short") in ("draining", "unloaded")
        await registry.close()

    run(scenario())
    assert loader.loads == ["short", "long"]


def test_a_reload_keeps_each_entry_of_a_shared_file_by_its_aliases(tmp_path: Path) -> None:
    loader = MappedLoader()
    config = _two_on_one_file(tmp_path, budget=1000 * MB)
    registry = Registry(config, loader=loader, estimator=loader.estimate)
    path = tmp_path / "shared.gguf"
    changed = Config(registry=config.registry, models=[
        ModelEntry(model=path, aliases=["long", "long-too"], n_ctx=4096),  # order swapped
        ModelEntry(model=path, aliases=["short"], n_ctx=1024),             # new n_ctx
    ])

    async def scenario() -> None:
        for alias in ("short", "long"):
            async with registry.lease(alias):
                pass
        result = registry.apply(changed)
        assert (result.kept, result.reloaded, result.added, result.removed) == (
            ["long"], ["short"], [], [])
        await registry.close()

    run(scenario())


def test_last_error_is_cleared_by_a_good_load(tmp_path: Path) -> None:
    loader = RecordingLoader()
    loader.fail["m"] = RuntimeError("disk on fire")
    registry = Registry(Config(models=[ModelEntry(model=tmp_path / "m.gguf", aliases=["m"])]),
                        loader=loader, estimator=loader.estimate)

    async def scenario() -> None:
        with pytest.raises(Exception, match="disk on fire"):
            await registry.acquire("m")
        [row] = registry.snapshot()
        assert row["state"] == "failed" and "disk on fire" in row["last_error"]
        async with registry.lease("m"):
            pass
        [row] = registry.snapshot()
        assert row["state"] == "ready" and row["last_error"] is None
        await registry.close()

    run(scenario())


def test_a_model_that_breaks_unloads_and_is_failed_with_the_reason(tmp_path: Path) -> None:
    loader = RecordingLoader()
    registry = Registry(Config(models=[ModelEntry(model=tmp_path / "m.gguf", aliases=["m"])]),
                        loader=loader, estimator=loader.estimate)

    async def scenario() -> None:
        async with registry.lease("m") as lease:
            lease.model.broken = "it produced non-finite logits"
        # released: the registry saw it, drained and closed it
        for _ in range(100):
            if state(registry, "m") == "failed":
                break
            await __import__("asyncio").sleep(0.01)
        [row] = registry.snapshot()
        assert row["state"] == "failed" and row["last_error"] == "it produced non-finite logits"
        assert loader.closed() == ["m"]
        async with registry.lease("m"):  # the next request loads it afresh
            pass
        assert loader.loads == ["m", "m"]
        await registry.close()

    run(scenario())


def test_llama_cpp_python_docs_config_serves_both_entries_with_their_own_n_ctx(
        apps: Apps, tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "model.gguf", seed=3, n_ctx_train=512)
    config = tmp_path / "config.json"
    # llama-cpp-python's docs: two aliases of one file, different context sizes
    config.write_text(json.dumps({"host": "127.0.0.1", "port": 8080, "models": [
        {"model": str(model), "model_alias": "gpt-3.5-turbo", "chat_format": "chatml",
         "n_gpu_layers": -1, "offload_kqv": True, "n_threads": 2, "n_batch": 512,
         "n_ctx": 64},
        {"model": str(model), "model_alias": "gpt-4", "chat_format": "chatml",
         "n_gpu_layers": -1, "offload_kqv": True, "n_threads": 2, "n_batch": 512,
         "n_ctx": 512},
    ]}))
    server = apps.serve(config)
    prompt = "hello there " * 20  # more tokens than 64, fewer than 512
    replies = {}
    for alias in ("gpt-3.5-turbo", "gpt-4"):
        replies[alias] = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": alias, "prompt": prompt, "max_tokens": 2, "logit_bias": TINY_SPECIAL})
    short = replies["gpt-3.5-turbo"]
    assert short.status_code == 400 and short.json()["error"]["n_ctx"] == 64
    assert replies["gpt-4"].status_code == 200
    assert replies["gpt-4"].json()["model"] == "gpt-4"
    # system_fingerprint: stable for one backend configuration, different across them
    fingerprints = [httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": alias, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
        "logit_bias": TINY_SPECIAL}).json()["system_fingerprint"]
        for alias in ("gpt-4", "gpt-4", "gpt-3.5-turbo")]
    assert fingerprints[0] == fingerprints[1] != fingerprints[2]
    assert fingerprints[0] == replies["gpt-4"].json()["system_fingerprint"]
    assert fingerprints[0].startswith("fp_")
    rows = {r["aliases"][0]: r for r in httpx.get(server.url + "/admin/models").json()["data"]}
    assert (rows["gpt-3.5-turbo"]["n_ctx"], rows["gpt-4"]["n_ctx"]) == (64, 512)
    assert rows["gpt-3.5-turbo"]["state"] == rows["gpt-4"]["state"] == "ready"


def test_non_finite_logits_fail_the_requests_and_mark_the_model_broken() -> None:
    import asyncio

    import numpy as np

    import engine
    from gateway.generation.events import GenerationRequest, ModelBrokenError
    from gateway.local.scheduler import Scheduler
    from tests.support.scripted_model import ScriptedModel, letters, script

    model = ScriptedModel(n_slots=2)
    inner = model.transformer.forward

    def corrupt(chunks, output="last"):  # what NaN weights give
        return [np.full_like(x, np.nan) for x in inner(chunks, output)]

    model.transformer.forward = corrupt
    scheduler = Scheduler(model, name="corrupt")

    async def scenario() -> None:
        prompt = engine.Prompt.of_tokens(script(letters("abc")))
        request = GenerationRequest(prompt, engine.SamplingParams(), 8)
        with pytest.raises(ModelBrokenError, match="non-finite logits"):
            async for _ in scheduler.submit(request):
                pass
        assert "non-finite logits" in (scheduler.broken or "")
        with pytest.raises(ModelBrokenError):
            scheduler.submit(request)

    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        scheduler.close()


def test_a_broken_model_unloads_once_and_its_reload_is_not_disturbed(tmp_path: Path) -> None:
    import asyncio
    import threading

    loader = RecordingLoader()
    registry = Registry(Config(models=[ModelEntry(model=tmp_path / "m.gguf", aliases=["m"])]),
                        loader=loader, estimator=loader.estimate)

    async def scenario() -> None:
        async with registry.lease("m") as lease:
            lease.model.broken = "its file changed size"
        while state(registry, "m") != "failed":
            await asyncio.sleep(0.01)
        loader.gate = threading.Event()  # hold the reload while any stray unload would run
        reload = asyncio.ensure_future(registry.acquire("m"))
        await asyncio.sleep(0.3)
        loader.gate.set()
        registry.release(await reload)
        assert state(registry, "m") == "ready"
        await registry.close()

    run(scenario())
