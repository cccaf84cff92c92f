"""The gateway group's fixtures: the app for a config (tests/support/apps.py), per test or per
module, everything it opened closed at teardown."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apps import Apps


@pytest.fixture
def apps(tmp_path: Path) -> Iterator[Apps]:
    """Apps, clients and servers for configs; text and dict configs are written to tmp_path."""
    made = Apps(tmp_path)
    yield made
    made.close()


@pytest.fixture(scope="module")
def module_apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apps]:
    """The same for a module's shared servers; configs go to a folder of the module's own."""
    made = Apps(tmp_path_factory.mktemp("apps"))
    yield made
    made.close()
