"""The console's pictures in the docs are the browser tests' screenshots: every
docs/images/console-NAME.png is a shot tests/system/test_console.py takes (`console.shot("NAME")`,
written to test-artifacts/console/NAME.png), and every picture a page shows exists."""
from __future__ import annotations

import re

from tests.support.paths import REPO

DOCS = REPO / "docs"


def test_each_console_picture_is_a_shot_the_browser_tests_take() -> None:
    shots = set(re.findall(r'console\.shot\("([\w-]+)"',
                           (REPO / "tests" / "system" / "test_console.py").read_text()))
    pictures = {p.name[len("console-"):-len(".png")] for p in (DOCS / "images").glob("console-*.png")}
    assert pictures, "the console page shows the browser tests' screenshots"
    assert pictures <= shots, f"pictures no browser test takes: {sorted(pictures - shots)}"


def test_every_picture_a_page_shows_exists() -> None:
    for page in DOCS.rglob("*.md"):
        if "_incoming" in page.parts:
            continue
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text()):
            assert (page.parent / target).resolve().is_file(), f"{page}: {target}"
