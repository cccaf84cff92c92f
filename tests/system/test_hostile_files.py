"""Hostile model files named in a config: a bounded ModelLoadError from the header reader, a
config problem naming the file, and `modelyard serve` exiting 2 with it listed (no traceback)."""
from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from engine.gguf import MAX_ARRAY_DEPTH, ModelLoadError, read_header
from gateway.config import ConfigError, load_config
from tests.support.paths import REPO

ARRAY, UINT32 = 9, 4


def _nested_gguf(path: Path, depth: int) -> Path:
    """A GGUF header whose one metadata value is an array of an array of ... `depth` deep."""
    key = b"evil.nested"
    raw = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    raw += struct.pack("<I", ARRAY)
    raw += struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", UINT32, 0)
    path.write_bytes(raw)
    return path


def test_nesting_up_to_the_bound_reads_and_deeper_is_a_load_error(tmp_path: Path) -> None:
    meta, _ = read_header(_nested_gguf(tmp_path / "ok.gguf", MAX_ARRAY_DEPTH))
    value = meta["evil.nested"]
    for _ in range(MAX_ARRAY_DEPTH - 1):
        [value] = value
    assert value == []
    for depth in (MAX_ARRAY_DEPTH + 1, 5000):
        with pytest.raises(ModelLoadError, match="nested more than") as info:
            read_header(_nested_gguf(tmp_path / "evil.gguf", depth))
        assert "evil.gguf" in str(info.value)


def test_serve_with_a_deeply_nested_gguf_exits_2_listing_the_problem(tmp_path: Path) -> None:
    evil = _nested_gguf(tmp_path / "evil.gguf", 5000)
    config = tmp_path / "c.yaml"
    config.write_text(f"models:\n  - model: {evil}\n")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    [problem] = info.value.errors
    assert str(evil) in problem and "nested more than" in problem
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
                           "--no-watch", "--port", "0"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and problem in done.stderr + done.stdout
