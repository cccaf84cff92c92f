"""docs/configuration/reference.md is the page `modelyard config-schema --markdown` writes from
the config's JSON Schema: the committed page is current, and it lists every key the schema has."""
from __future__ import annotations

import re

import pytest

from gateway import cli
from gateway.config.json_schema import config_schema
from gateway.config.schema_markdown import SECTIONS, reference_markdown
from tests.support.paths import REPO

PAGE = REPO / "docs" / "configuration" / "reference.md"


def test_the_committed_reference_is_the_one_the_schema_makes_now() -> None:
    assert PAGE.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/configuration/reference.md is stale: run "
        "`python -m gateway.cli config-schema --markdown -o docs/configuration/reference.md`")


def test_every_key_of_every_section_is_a_row() -> None:
    schema = config_schema()
    text = reference_markdown()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) == len(SECTIONS)
    for (title, name, _), section in zip(SECTIONS, sections):
        assert section.startswith(title)
        keys = (schema if not name else schema["$defs"][name])["properties"]
        rows = set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))
        assert rows == set(keys) - {"$schema"}, title
    # every model the schema defines has its section, so no key goes unlisted
    assert {name for _, name, _ in SECTIONS if name} == set(schema["$defs"])


def test_the_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config-schema", "--markdown"]) == 0
    assert capsys.readouterr().out == reference_markdown()
