"""Where things are: the checkout's root and the reference data, for tests at any depth of
tests/ (a test's own `Path(__file__).parents[n]` would break each time the groups move)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
