"""The engine group runs the engine alone, as engine/ itself imports nothing of gateway/: no module
here imports gateway, directly, inside a function, or through a tests/support helper it uses."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

HERE = Path(__file__).parent


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _reached(path: Path, seen: set[Path]) -> set[str]:
    """Every module `path` imports, following tests.support.* into their files."""
    seen.add(path)
    names = _imported(path)
    for name in sorted(names):
        helper = REPO / (name.replace(".", "/") + ".py")
        if name.startswith("tests.support.") and helper.exists() and helper not in seen:
            names |= _reached(helper, seen)
    return names


def test_no_engine_test_imports_gateway() -> None:
    modules = sorted(HERE.glob("*.py"))
    assert len(modules) > 30
    offenders = {p.name: sorted(n for n in _reached(p, set()) if n.split(".")[0] == "gateway")
                 for p in modules}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_check_sees_an_import_inside_a_function_and_through_a_helper(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("import engine\n\ndef test_y():\n    from gateway.errors import ApiError\n")
    assert "gateway.errors" in _reached(module, set())
    module.write_text("from tests.support.fakes import Loader\n")  # fakes imports gateway.config
    assert "gateway.config" in _reached(module, set())
