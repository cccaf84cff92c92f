"""engine.formats sits below the kernels: the kernels import the formats, never the other way."""
from __future__ import annotations

import ast
from pathlib import Path

import engine.formats

FORMATS = Path(engine.formats.__file__).parent


def _imported(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function, relative ones resolved."""
    package = "engine.formats"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def test_the_formats_import_no_kernel_module() -> None:
    files = sorted(FORMATS.glob("*.py"))
    assert len(files) >= 7
    for path in files:
        kernels = sorted(n for n in _imported(path) if n.split(".")[:2] == ["engine", "kernels"])
        assert kernels == [], f"{path.name} imports {kernels}"


def test_the_import_scan_sees_a_kernel_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ..kernels.matmul import reference\n    import engine.kernels.jit\n")
    assert {"engine.kernels.matmul.reference", "engine.kernels.jit"} <= _imported(probe)
