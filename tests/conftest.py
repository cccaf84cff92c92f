"""Shared fixtures, and the marks a fixture implies.

The real models are fetched once into the cache when a test needs them (~93 MB SmolLM2, ~240 MB
Gemma 3); a test that uses one, directly or through another fixture, is marked `real_model`
(FIXTURE_MARKS), so `pytest -m "not real_model"` never downloads anything. Helpers the test
modules share live in tests/support/; no test module imports another. The gateway in process
(tests/gateway/, and the fronts of tests/system/) comes from `apps` or `module_apps`.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures: an engine-only run never imports the gateway
    from tests.support.apps import Apps

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
def apps(tmp_path: Path) -> Iterator[Apps]:
    """Apps, clients and servers for configs (tests/support/apps.py), closed after the test; text
    and dict configs are written to tmp_path."""
    from tests.support.apps import Apps

    made = Apps(tmp_path)
    yield made
    made.close()


@pytest.fixture(scope="module")
def module_apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apps]:
    """The same for a module's shared servers; configs go to a folder of the module's own."""
    from tests.support.apps import Apps

    made = Apps(tmp_path_factory.mktemp("apps"))
    yield made
    made.close()
