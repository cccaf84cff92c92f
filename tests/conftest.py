"""Shared fixtures: the real model is fetched once into the cache (~93 MB) when a test needs it."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from engine.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from tests.model_files import gemma3_path

    return gemma3_path()
