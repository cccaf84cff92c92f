"""Images in the text model's prompt (engine/vision/layout.py): mtmd's chunk layout and
llama.cpp's logits and greedy tokens after a text + image prompt (tests/data/vlm), with the
engine's own embeddings end to end. The text model runs as the references did: flash attention
off (f16 KV), n_ctx 256."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.api import Model
from engine.prompt import Prompt, TokenSpan
from engine.vision import VisionModel
from engine.vision.layout import image_prompt
from tests.support.refs import VLM_DIR

MANIFEST = json.loads((VLM_DIR / "manifest.json").read_text())
BASES = {b["base"]: b for b in MANIFEST["bases"]}
CASES = [(b["base"], im) for b in MANIFEST["bases"] for im in b["images"]]
IDS = [f"{b}-{im['image'].split('_')[0]}" for b, im in CASES]


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple[Model, VisionModel]]:
    out = {name: (Model(VLM_DIR / b["text_file"], n_ctx=256, flash_attn=False, images=True),
                  VisionModel(VLM_DIR / b["mmproj_file"])) for name, b in BASES.items()}
    yield out
    for tm, vm in out.values():
        tm.close()
        vm.close()


def _prompt(loaded: dict[str, tuple[Model, VisionModel]], base: str, case: dict) -> Prompt:
    tm, vm = loaded[base]
    image = vm.encode((VLM_DIR / case["image"]).read_bytes())
    return image_prompt(BASES[base]["prompt"]["text"], [image], vm.hp, tm.tokenizer)


@pytest.mark.parametrize("base,case", CASES, ids=IDS)
def test_chunks_are_laid_out_as_mtmd(loaded: dict[str, tuple[Model, VisionModel]], base: str,
                                     case: dict) -> None:
    p = _prompt(loaded, base, case)
    got = [list(s.ids) if isinstance(s, TokenSpan) else len(s) for s in p.spans]
    assert got == [c["tokens"] if c["type"] == "text" else c["n_tokens"] for c in case["chunks"]]
    assert len(p) == case["n_prompt_positions"]


@pytest.mark.parametrize("base,case", CASES, ids=IDS)
def test_logits_last_and_greedy_match_llama_cpp(loaded: dict[str, tuple[Model, VisionModel]],
                                                base: str, case: dict) -> None:
    tm, _ = loaded[base]
    ref, tol = np.load(VLM_DIR / case["npz"]), case["suggested_tolerance"]
    p = _prompt(loaded, base, case)
    last = tm.logits(p)[-1]
    assert np.abs(last - ref["logits_last"]).max() <= tol["logits_max_abs"]
    assert np.abs(last - ref["logits_last"]).mean() <= tol["logits_mean_abs"]
    greedy: list[int] = []
    for margin, want in zip(case["greedy_top1_top2_margins"], case["greedy"]):
        token = int(tm.logits(p + Prompt.of_tokens(greedy))[-1].argmax())
        if margin < 0.01:  # a near-tie: not decisive, and what follows is not either
            break
        assert token == want, greedy
        greedy.append(token)


@pytest.mark.parametrize("base,case", CASES, ids=IDS)
def test_logits_tail_match_llama_cpp(loaded: dict[str, tuple[Model, VisionModel]], base: str,
                                     case: dict) -> None:
    tm, _ = loaded[base]
    ref, tol = np.load(VLM_DIR / case["npz"]), case["suggested_tolerance"]
    tail = ref["logits_tail"]
    got = tm.logits(_prompt(loaded, base, case))[-tail.shape[0]:]
    assert np.abs(got - tail).max() <= tol["logits_max_abs"]
    assert np.abs(got - tail).mean() <= tol["logits_mean_abs"]


def test_the_same_image_reuses_its_cached_rows_and_another_does_not(
        loaded: dict[str, tuple[Model, VisionModel]]) -> None:
    base = "llava_mlp_vlm"
    a = _prompt(loaded, base, BASES[base]["images"][0])
    again = _prompt(loaded, base, BASES[base]["images"][0])
    other = _prompt(loaded, base, BASES[base]["images"][1])
    assert a.position_keys() == again.position_keys()
    first_image = len(a.spans[0])
    assert a.position_keys()[first_image] != other.position_keys()[first_image]
