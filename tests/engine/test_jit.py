"""The kernel cache: compile_cached finds a warm object without building the IR."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from engine.kernels import jit

IR = """
define i64 @answer() {
  ret i64 %d
}
"""


def test_a_warm_cache_skips_building_the_ir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path))
    monkeypatch.setattr(jit, "_libraries", {})  # as in a new process
    built: list[int] = []

    def build(value: int) -> str:
        built.append(value)
        return IR % value

    lib = jit.compile_cached("answer", (41,), lambda: build(41))
    assert lib.function("answer", ctypes.c_int64)() == 41
    assert built == [41]

    monkeypatch.setattr(jit, "_libraries", {})
    again = jit.compile_cached("answer", (41,), lambda: build(41))
    assert again.function("answer", ctypes.c_int64)() == 41
    assert built == [41] and again.from_cache

    other = jit.compile_cached("answer", (42,), lambda: build(42))  # other parameters: built
    assert other.function("answer", ctypes.c_int64)() == 42
    assert built == [41, 42]


def test_an_unwritable_cache_still_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache only saves time: where it cannot be written, kernels compile and run anyway."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MODELYARD_CACHE", str(blocker))  # the cache folder cannot be made
    monkeypatch.setattr(jit, "_libraries", {})
    lib = jit.compile_cached("answer", (5,), lambda: IR % 5)
    assert lib.function("answer", ctypes.c_int64)() == 5 and not lib.from_cache


def test_a_stale_index_entry_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path))
    monkeypatch.setattr(jit, "_libraries", {})
    jit.compile_cached("answer", (7,), lambda: IR % 7)
    for obj in (tmp_path / "kernels").glob("*.o"):
        obj.unlink()  # the object went missing (cache pruned): the index must not be trusted
    monkeypatch.setattr(jit, "_libraries", {})
    built: list[int] = []
    lib = jit.compile_cached("answer", (7,), lambda: built.append(7) or IR % 7)
    assert built == [7] and lib.function("answer", ctypes.c_int64)() == 7


def test_the_fingerprint_follows_the_kernel_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    first = jit._sources_fingerprint()
    monkeypatch.setattr(jit, "_sources_digest", None)
    assert jit._sources_fingerprint() == first  # recomputed from the files, not remembered
    monkeypatch.setattr(jit, "_sources_digest", None)
    monkeypatch.setattr(jit, "_SOURCES", ("kernels/jit.py",))
    assert jit._sources_fingerprint() != first
    monkeypatch.setattr(jit, "_sources_digest", None)
    monkeypatch.setattr(jit, "_SOURCES", ("kernels/**/*.py",))
    assert jit._sources_fingerprint() != first  # the formats the IR builders read count too
