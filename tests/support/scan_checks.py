"""The check every family's served tests make of its reference files: the header judgement
passes each one, and `modelyard scan` over a folder of them skips none and reads the family and
types the files have."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from engine.servable import why_not_servable
from gateway.scan import scan_dir


def assert_scan_accepts(folder: Path, names: Iterable[str], tmp_path: Path, arch: str,
                        quantizations: set[str]) -> None:
    """folder/NAME.gguf for each name: servable, and scanned (through symlinks in tmp_path) as
    `arch` files of exactly `quantizations`."""
    for name in names:
        assert why_not_servable(folder / f"{name}.gguf") is None
        (tmp_path / f"{name}.gguf").symlink_to(folder / f"{name}.gguf")
    found = scan_dir(tmp_path)
    assert not found.skipped
    assert {m.arch for m in found.found} == {arch}
    assert {m.quantization for m in found.found} == quantizations
