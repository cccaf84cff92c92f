"""The gateway group's own fixtures (the app itself comes from tests/conftest.py's `apps`)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.ggufgen import write_servable


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
