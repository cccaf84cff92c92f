"""One judgement of "can the engine serve this file?", from the header alone, shared by the
config check, `modelyard scan` and the registry.

Each broken file is a valid tiny GGUF with one field changed in place. The reason the header
check gives must be the very reason a real load (engine.load) fails with: that is what makes it
one judgement rather than a second list of rules that could drift from the loader.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

import engine
from engine.servable import why_not_servable
from gateway.config import Config, ConfigError, ModelEntry, RegistrySettings, load_config
from gateway.fleet.registry import ModelLoadFailedError, Registry
from gateway.scan import scan_dir
from tests.support.fakes import FakeModel
from tests.support.ggufgen import tensor_type_field, write_servable, write_tiny_llama


def _value_at(data: bytes, key: str) -> int:
    """Byte position of a string metadata value (after its u32 type and u64 length)."""
    k = key.encode()
    return data.index(len(k).to_bytes(8, "little") + k) + 8 + len(k) + 4 + 8


def _patched(path: Path, change) -> Path:
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))
    return path


def _architecture(data: bytearray) -> None:
    at = _value_at(bytes(data), "general.architecture")
    data[at:at + 5] = b"bogus"  # "llama" -> an architecture no engine knows


def _tokenizer_model(data: bytearray) -> None:
    at = _value_at(bytes(data), "tokenizer.ggml.model")
    data[at:at + 4] = b"wpm2"  # "gpt2" -> a vocabulary type the tokenizer lacks


def _tensor_type(name: str):
    def change(data: bytearray) -> None:
        at = tensor_type_field(bytes(data), name)
        data[at:at + 4] = int(Q.I32).to_bytes(4, "little")  # same size as F32: file stays valid
    return change


def _missing(data: bytearray) -> None:
    name = b"blk.0.ffn_down.weight"
    at = bytes(data).index(len(name).to_bytes(8, "little") + name) + 8
    data[at:at + len(name)] = b"blk.0.ffn_dowX.weight"


def _ffn_length(data: bytearray) -> None:
    key = b"llama.feed_forward_length"
    at = bytes(data).index(key) + len(key) + 4
    data[at:at + 4] = (999).to_bytes(4, "little")


def _vocab_size(data: bytearray) -> None:
    # the header check counts the tokens without decoding them (read_header vocabulary=False)
    key = b"llama.vocab_size"
    at = bytes(data).index(key) + len(key) + 4
    data[at:at + 4] = (int.from_bytes(data[at:at + 4], "little") + 1).to_bytes(4, "little")


BROKEN = {
    "architecture": (_architecture, "unsupported architecture 'bogus'"),
    "tokenizer": (_tokenizer_model, "unsupported tokenizer model 'wpm2'"),
    "matrix type": (_tensor_type("blk.0.attn_q.weight"), "blk.0.attn_q.weight: type I32"),
    "norm type": (_tensor_type("output_norm.weight"), "output_norm.weight: type I32"),
    "missing tensor": (_missing, "tensor blk.0.ffn_down.weight is missing"),
    "shape": (_ffn_length, "has shape"),
    "vocabulary size": (_vocab_size, "tokens, the model"),
}


@pytest.fixture
def broken(tmp_path: Path, request) -> tuple[Path, str]:
    change, expected = BROKEN[request.param]
    path = write_tiny_llama(tmp_path / "broken.gguf", qtype=Q.F32, n_layer=1)
    return _patched(path, change), expected


@pytest.mark.parametrize("broken", sorted(BROKEN), indirect=True)
def test_header_check_gives_the_reason_a_real_load_fails_with(broken: tuple[Path, str]) -> None:
    path, expected = broken
    reason = why_not_servable(path)
    assert reason is not None and expected in reason
    with pytest.raises(engine.ModelLoadError) as load:
        engine.load(path, n_ctx=32).close()
    assert load.value.problem == reason


def test_a_servable_file_passes_and_loads(tmp_path: Path) -> None:
    path = write_servable(tmp_path / "ok.gguf")
    assert why_not_servable(path) is None
    engine.load(path, n_ctx=32).close()


def test_a_file_changed_after_a_check_is_judged_again(tmp_path: Path) -> None:
    path = write_servable(tmp_path / "m.gguf")
    assert why_not_servable(path) is None
    _patched(path, _architecture)  # same size: the cache must notice the new mtime
    assert "bogus" in (why_not_servable(path) or "")


@pytest.mark.parametrize("broken", ["architecture", "matrix type", "missing tensor"],
                         indirect=True)
def test_config_reports_an_unservable_file_at_its_line(tmp_path: Path,
                                                       broken: tuple[Path, str]) -> None:
    path, expected = broken
    write_servable(tmp_path / "good.gguf")
    config = tmp_path / "c.yaml"
    config.write_text("models:\n  - model: good.gguf\n  - model: broken.gguf\n"
                      "    aliases: [b]\n")
    with pytest.raises(ConfigError) as e:
        load_config(config)
    [line] = [x for x in str(e.value).splitlines() if "broken.gguf" in x]
    assert line.strip().startswith(f"{config}:3: models.1.model: cannot serve {path}: ")
    assert expected in line and line.strip().endswith(why_not_servable(path) or "?")


@pytest.mark.parametrize("broken", ["architecture", "norm type"], indirect=True)
def test_scan_skips_the_file_for_the_same_reason(tmp_path: Path, broken: tuple[Path, str]) -> None:
    path, _ = broken
    result = scan_dir(tmp_path)
    assert not result.found
    [skipped] = result.skipped
    assert skipped.path == path and skipped.reason == why_not_servable(path)


@pytest.mark.parametrize("broken", ["missing tensor"], indirect=True)
def test_registry_never_evicts_a_healthy_model_for_a_load_that_cannot_succeed(
        tmp_path: Path, broken: tuple[Path, str]) -> None:
    path, expected = broken
    good = write_servable(tmp_path / "good.gguf")
    loads: list[str] = []

    def loader(entry: ModelEntry) -> FakeModel:  # stands in for the real load; the estimator is real
        loads.append(entry.name)
        return FakeModel(entry)

    config = Config(models=[ModelEntry(model=good, aliases=["good"]),
                            ModelEntry(model=path, aliases=["broken"])],
                    registry=RegistrySettings(max_loaded_models=1))

    async def main() -> None:
        registry = Registry(config, loader=loader)
        async with registry.lease("good"):
            pass
        with pytest.raises(ModelLoadFailedError, match=expected):
            await registry.acquire("broken")
        rows = {r["aliases"][0]: r for r in registry.snapshot()}
        assert rows["good"]["state"] == "ready"   # not evicted
        assert expected in rows["broken"]["last_error"]
        await registry.close()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert loads == ["good"]
