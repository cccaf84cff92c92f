"""An entry's vision projector (`mmproj`, llama-cpp-python's `clip_model_path`): checked at
config time from both headers with `file:line` errors, counted in the memory estimate."""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

import engine
from gateway.config import ConfigError, load_config
from gateway.fleet.registry.slots import engine_estimator
from tests.support.refs import VLM_DIR

GEMMA_TEXT, GEMMA_PROJ = "gemma3_vlm_text_f32.gguf", "gemma3_vlm_mmproj_f32.gguf"
LLAVA_PROJ = "llava_mlp_vlm_mmproj_f32.gguf"  # writes rows of width 96, not gemma's 64


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in (GEMMA_TEXT, GEMMA_PROJ, LLAVA_PROJ):
        shutil.copy(VLM_DIR / name, tmp_path / name)
    return tmp_path


def write(folder: Path, text: str) -> Path:
    path = folder / "c.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def errors(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.errors


@pytest.mark.parametrize("key", ["mmproj", "clip_model_path"])
def test_a_pair_loads_relative_to_the_config_folder(folder: Path, key: str) -> None:
    config = load_config(write(folder, f"""
        models:
          - model: {GEMMA_TEXT}
            {key}: {GEMMA_PROJ}
    """))
    assert config.models[0].mmproj == folder / GEMMA_PROJ
    assert config.warnings == []


def test_a_projector_of_another_width_is_an_error_at_its_line(folder: Path) -> None:
    path = write(folder, f"""
        models:
          - model: {GEMMA_TEXT}
            aliases: [g]
            mmproj: {LLAVA_PROJ}
    """)
    assert errors(path) == [
        f"{path}:4: models.0.mmproj: cannot give {GEMMA_TEXT} images with {folder / LLAVA_PROJ}: "
        "its projector writes rows of width 96, but the model's embedding width is 64: they are "
        "not a pair"]


def test_a_text_model_is_no_projector(folder: Path) -> None:
    path = write(folder, f"""
        models:
          - model: {GEMMA_TEXT}
            clip_model_path: {GEMMA_TEXT}
    """)
    [error] = errors(path)
    assert error.startswith(f"{path}:3: models.0.clip_model_path: cannot give ")
    assert "general.architecture is 'gemma3', an mmproj file says 'clip'" in error


def test_missing_doubled_and_misplaced_projectors_are_errors(folder: Path) -> None:
    assert errors(write(folder, f"""
        models:
          - model: {GEMMA_TEXT}
            mmproj: nowhere.gguf
    """)) == [f"{folder / 'c.yaml'}:3: models.0.mmproj: mmproj file not found: "
              f"{folder / 'nowhere.gguf'}"]
    assert any("not both" in e for e in errors(write(folder, f"""
        models:
          - model: {GEMMA_TEXT}
            mmproj: {GEMMA_PROJ}
            clip_model_path: {GEMMA_PROJ}
    """)))
    assert any("belongs in each entry" in e for e in errors(write(folder, f"""
        defaults:
          mmproj: {GEMMA_PROJ}
        models:
          - model: {GEMMA_TEXT}
    """)))


def test_the_memory_estimate_counts_the_projector(folder: Path) -> None:
    config = load_config(write(folder, f"""
        models:
          - {{model: {GEMMA_TEXT}, aliases: [plain]}}
          - {{model: {GEMMA_TEXT}, aliases: [seeing], mmproj: {GEMMA_PROJ}}}
    """))
    plain, seeing = (engine_estimator(e) for e in config.models)
    # the projector's file, and the KV rings a load fed images keeps (engine.kv: gemma3 mirrors
    # ring - 1 rows there), counted by the engine's own estimate
    entry = config.models[1]
    kv_for_images = (engine.estimate_memory(entry.model, entry.n_ctx, entry.n_parallel, images=True)
                     - engine.estimate_memory(entry.model, entry.n_ctx, entry.n_parallel))
    assert seeing - plain == (folder / GEMMA_PROJ).stat().st_size + kv_for_images
