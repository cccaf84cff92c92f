"""A load that compiles kernels says so (jit.reporting): the first compile logs "compiling
kernels for NAME (first run only ...)", progress follows every REPORT_EVERY seconds, the end
says how many and how long; a load that compiles nothing (all cached) says nothing."""
from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from engine.kernels import jit


def _unique_ir() -> str:
    """A module no cache has seen: its constant is new each time."""
    value = uuid.uuid4().int % 2**31  # two alike (a cache hit) once in 2^31, not once in 1,000
    return f"define i32 @answer() {{\n  ret i32 {value}\n}}\n"


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MODELYARD_CACHE", str(tmp_path))
    return tmp_path / "kernels"


def test_a_compile_is_announced_and_summed_up(fresh_cache: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="modelyard.kernels")
    with jit.reporting("smollm2") as report:
        jit.compile_ir(_unique_ir())
        jit.compile_ir(_unique_ir())
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == f"compiling kernels for smollm2 (first run only; cached in {fresh_cache})"
    assert said[-1].startswith("compiled 2 kernels for smollm2 in ")
    assert report.count == 2


def test_progress_is_said_while_it_goes_on(fresh_cache: Path, caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, logger="modelyard.kernels")
    monkeypatch.setattr(jit, "REPORT_EVERY", 0.0)  # every compile after the first reports
    with jit.reporting("gemma-3"):
        for _ in range(3):
            jit.compile_ir(_unique_ir())
    progress = [r.getMessage() for r in caplog.records if "so far" in r.getMessage()]
    assert [p.split(": ")[1].split(" (")[0] for p in progress] == ["1 compiled so far",
                                                                   "2 compiled so far"]


def test_a_cached_kernel_says_nothing(fresh_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    ir = _unique_ir()
    jit.compile_ir(ir)                            # now on disk
    jit._libraries.pop(jit.cache_key(ir))         # and forgotten by this process
    caplog.set_level(logging.INFO, logger="modelyard.kernels")
    with jit.reporting("smollm2") as report:
        lib = jit.compile_ir(ir)
    assert lib.from_cache and report.count == 0 and caplog.records == []


def test_engine_load_reports_under_the_name_it_is_given(monkeypatch: pytest.MonkeyPatch,
                                                        fresh_cache: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    import engine.api

    class Compiling:
        def __init__(self, path: object, **kw: object) -> None:
            jit.compile_ir(_unique_ir())

    monkeypatch.setattr(engine.api, "Model", Compiling)
    caplog.set_level(logging.INFO, logger="modelyard.kernels")
    engine.load("/models/SmolLM2-135M-Instruct.Q4_1.gguf", name="smollm2")
    engine.load("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    firsts = [r.getMessage() for r in caplog.records if "first run only" in r.getMessage()]
    assert [f.split(" (")[0] for f in firsts] == [
        "compiling kernels for smollm2", "compiling kernels for SmolLM2-135M-Instruct.Q4_1"]


def test_a_report_inside_a_report_counts_in_the_outer_one(fresh_cache: Path) -> None:
    with jit.reporting("outer") as outer, jit.reporting("inner") as inner:
        jit.compile_ir(_unique_ir())
    assert inner is outer and outer.count == 1
