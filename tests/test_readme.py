"""README.md is the landing page: it keeps the two commands a fresh machine runs (install and
serve, install and test: CI's .ci/run runs that same test command), stays about a screen long,
and every file it links to exists (the docs site's own links are checked by
`mkdocs build --strict` in .ci/run)."""
from __future__ import annotations

import re

from tests.support.paths import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def _fenced_lines() -> list[str]:
    blocks = re.findall(r"^```\w*\n(.*?)^```", README, flags=re.M | re.S)
    return [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]


def test_the_two_commands_are_there_as_written() -> None:
    lines = _fenced_lines()
    assert "pip install -e . && modelyard serve" in lines
    assert 'pip install -e ".[test]" && pytest' in lines
    assert 'pytest -m "not slow"' in lines


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.split("#", 1)[0].strip() for line in ci.splitlines()]
    assert "pytest" in commands  # the README's `pytest`, with pyproject's options
    assert "mkdocs build --strict" in " ".join(commands)


def test_it_fits_a_screen_or_two() -> None:
    assert len(README.splitlines()) <= 170


def test_every_linked_file_exists() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_it_says_cpu_only_and_what_it_runs_on() -> None:
    assert "CPU only" in README
    for fact in ("OS", "CPU", "RAM"):
        assert re.search(rf"^\| {fact} \|", README, flags=re.M), fact
