"""docs/models/index.md lists exactly the families (engine/arch SPECS) and tensor types
(engine/formats/quants TYPES) the engine runs: a family or type added on one side and not the
other fails, naming the row to add or remove."""
from __future__ import annotations

import re

from engine.arch import SPECS
from engine.formats.quants import TYPES
from tests.support.paths import REPO

PAGE = REPO / "docs" / "models" / "index.md"


def _first_column(section: str) -> list[str]:
    """The `code` names in the first column of the table under `## section`."""
    text = PAGE.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", body, flags=re.M)


def _compare(section: str, engine_has: list[str], where: str, example: str) -> None:
    rows = _first_column(section)
    missing = [n for n in engine_has if n not in rows]
    extra = [n for n in rows if n not in engine_has]
    doubled = sorted({n for n in rows if rows.count(n) > 1})
    lines = [f"docs/models/index.md, table \"{section}\", is out of step with {where}:"]
    lines += [f"  add a row for `{n}`: {example.format(n=n)}" for n in missing]
    lines += [f"  remove the row `{n}`: the engine has no such {section[:-1].lower()}"
              for n in extra]
    lines += [f"  `{n}` has more than one row" for n in doubled]
    assert not (missing or extra or doubled), "\n".join(lines)


def test_every_family_the_engine_runs_has_a_row() -> None:
    _compare("Families", list(SPECS), "engine/arch SPECS",
             "| `{n}` | models | checked against llama.cpp "
             "| [owner/repo](https://huggingface.co/owner/repo) |")


def test_every_tensor_type_the_engine_reads_has_a_row() -> None:
    _compare("Tensor types", [t.name for t in TYPES], "engine/formats/quants TYPES",
             "| `{n}` | checked | in llama.cpp's mixes |")


def test_each_family_row_links_a_public_model_page() -> None:
    text = PAGE.read_text(encoding="utf-8")
    body = text.split("\n## Families\n", 1)[1].split("\n## ", 1)[0]
    for row in re.findall(r"^\| `[^`]+` \|.*$", body, flags=re.M):
        assert re.search(r"\]\(https://huggingface\.co/[\w.-]+/[\w.-]+\)", row), row
