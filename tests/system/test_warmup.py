"""`modelyard warmup` compiles a model's kernels into the cache ahead of time, as a user runs it
(python -m gateway, a fresh MODELYARD_CACHE): the first run says it compiles and how many, the
second finds every kernel cached, and `serve` of the same model then compiles nothing."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ggufgen import write_tiny_llama
from tests.support.paths import REPO

pytestmark = pytest.mark.slow


def _warmup(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MODELYARD_CACHE=str(cache),
               PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run([sys.executable, "-m", "gateway", "warmup", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_warmup_compiles_once_and_then_finds_everything_cached(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "SmolLM2-135M-Instruct.Q8_0.gguf")
    cache = tmp_path / "cache"
    first = _warmup(str(model), cache=cache)
    assert first.returncode == 0, first.stderr
    assert "compiling kernels for smollm2 (first run only" in first.stderr
    assert "smollm2 is warm: " in first.stderr and " kernels compiled" in first.stderr
    assert list((cache / "kernels").glob("*.o"))
    second = _warmup(str(model), cache=cache)
    assert second.returncode == 0, second.stderr
    assert "compiling kernels" not in second.stderr
    assert "smollm2 is warm: every kernel was cached" in second.stderr


def test_warmup_of_a_file_it_cannot_serve_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model")
    done = _warmup(str(bad), cache=tmp_path / "cache")
    assert done.returncode == 2
    assert "cannot serve the model files on the command line" in done.stderr
