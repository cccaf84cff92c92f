"""ARCHITECTURE.md names modules by path: each must exist, so the map cannot drift from the tree."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# where a bare module name in the map is looked up, after the path as written
PLACES = ["", "gateway/", "engine/", "engine/kernels/", "engine/kernels/matmul/", "gateway/config/",
          "gateway/backends/", "gateway/api/", "gateway/http/", "gateway/generation/",
          "gateway/local/", "gateway/fleet/", "gateway/fleet/registry/", "gateway/pull/", "tests/",
          "tests/support/"]


def test_every_path_the_map_names_exists() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`([\w/.*]+\.(?:py|md|json|yaml)|[\w/]+/)`", text))
    assert len(named) > 40  # the map names the modules it leads to
    missing = [n for n in sorted(named)
               if not any(list(ROOT.glob(place + n)) for place in PLACES)]
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"
