"""`modelyard scan` and `serve --models-dir` pair a vision projector with its model (same
folder, fitting headers, matching name) instead of skipping it (gateway/scan/pairing.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

from gateway.config import load_config
from gateway.fleet.zeroconf import config_for_dir
from gateway.scan import build_entries, render, scan_dir
from gateway.scan.naming import assign_aliases
from tests.support.refs import VLM_DIR

PAIRS = [("gemma3_vlm_text_f32.gguf", "gemma3_vlm_mmproj_f32.gguf"),
         ("idefics3_vlm_text_f32.gguf", "idefics3_vlm_mmproj_f32.gguf"),
         ("llava_mlp_vlm_text_f32.gguf", "llava_mlp_vlm_mmproj_f32.gguf")]


def _copy(folder: Path, *names: tuple[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for source, target in names:
        shutil.copy(VLM_DIR / source, folder / target)
    return folder


def test_each_projector_pairs_with_its_own_model(tmp_path: Path) -> None:
    folder = _copy(tmp_path / "m", *[(n, n) for pair in PAIRS for n in pair])
    result = scan_dir(folder)
    assert {m.path.name: m.mmproj.name if m.mmproj else None for m in result.found} == dict(PAIRS)
    assert not [s for s in result.skipped if "mmproj" in s.reason]
    # the written config names the projector relative to itself, and loads as it is
    text = render("yaml", build_entries(result.found, assign_aliases(result.found), folder))
    assert "mmproj: gemma3_vlm_mmproj_f32.gguf" in text
    (folder / "c.yaml").write_text(text)
    config = load_config(folder / "c.yaml")
    assert {e.model.name: e.mmproj.name for e in config.models if e.mmproj} == dict(PAIRS)


def test_serve_models_dir_serves_the_pairs(tmp_path: Path) -> None:
    folder = _copy(tmp_path / "m", *[(n, n) for n in PAIRS[2]])
    config = config_for_dir(folder)
    assert [e.mmproj for e in config.models] == [(folder / PAIRS[2][1]).resolve()]


def test_a_projector_that_fits_no_model_stays_skipped(tmp_path: Path) -> None:
    # llava's projector writes rows of width 96; gemma3's text model has 64
    folder = _copy(tmp_path / "m", (PAIRS[0][0], PAIRS[0][0]),
                   (PAIRS[2][1], "gemma3_vlm_mmproj_f32.gguf"))
    result = scan_dir(folder)
    assert [m.mmproj for m in result.found] == [None]
    [skipped] = [s for s in result.skipped if "mmproj" in s.reason]
    assert "no model in its folder that it fits" in skipped.reason


def test_a_projector_in_another_folder_or_matching_two_models_is_not_guessed(tmp_path: Path) -> None:
    _copy(tmp_path / "a", (PAIRS[0][0], PAIRS[0][0]))
    _copy(tmp_path / "b", (PAIRS[0][1], PAIRS[0][1]))
    # the same general.name twice: the header fits both, the name does not decide
    _copy(tmp_path / "c", (PAIRS[0][0], "gemma3_vlm_text_f32.gguf"),
          (PAIRS[0][0], "gemma3_vlm_text_copy.gguf"), (PAIRS[0][1], PAIRS[0][1]))
    result = scan_dir(tmp_path)
    assert [m.mmproj for m in result.found] == [None, None, None]
    reasons = {s.path.parent.name: s.reason for s in result.skipped if "mmproj" in s.reason}
    assert "no model in its folder that it fits" in reasons["b"]
    assert "2 models in its folder match it" in reasons["c"]
