"""Shared fixtures, and the marks a fixture implies.

The real models are fetched once into the cache when a test needs them (~93 MB SmolLM2, ~240 MB
Gemma 3); a test that uses one, directly or through another fixture, is marked `real_model`
(FIXTURE_MARKS), so `pytest -m "not real_model"` never downloads anything. Helpers the test
modules share live in tests/support/; no test module imports another.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.ggufgen import write_servable

# fixture -> the marks every test using it gets (added at collection, so -m selects on them)
FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    "smollm2_path": ("real_model",),
    "gemma3_path": ("real_model",),
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects on the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))  # every fixture the test needs, transitively
        for fixture, marks in FIXTURE_MARKS.items():
            if fixture in used:
                for mark in marks:
                    if item.get_closest_marker(mark) is None:
                        item.add_marker(mark)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from engine.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from tests.support.model_files import gemma3_path

    return gemma3_path()


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    """A config serving two tiny servable models: `a` (also `org/a`, n_ctx 512) and `b`
    (tests/support/fakes.py's Loader stands in for loading them)."""
    for name in ("a", "b"):
        write_servable(tmp_path / f"{name}.gguf")
    path = tmp_path / "modelyard.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"model": "a.gguf", "aliases": ["a", "org/a"], "n_ctx": 512},
        {"model": "b.gguf", "aliases": ["b"]},
    ]}, sort_keys=False))
    return path
