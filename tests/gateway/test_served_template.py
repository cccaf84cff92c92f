"""Which chat template a served model gets (gateway/local/served_model.py over engine/chat_formats.py's
choice), with the reason it says; the built-ins themselves: tests/engine/test_chat_formats.py.
Gemma 3's is held against llama-cpp-python's real output in tests/data/gemma3/greedy.json.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gateway.config import ModelEntry
from gateway.local.served_model import _template_for, load_served_model
from tests.support.refs import GEMMA3_DIR


def test_served_model_says_which_template_and_falls_back_from_a_broken_file_template() -> None:
    tokens = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    model = SimpleNamespace(
        path="m.gguf", tokenizer=SimpleNamespace(bos_id=0, eos_id=1),
        metadata={"general.architecture": "gemma3", "tokenizer.ggml.tokens": tokens,
                  "tokenizer.chat_template": "{% for %}"})
    entry = ModelEntry(model="/m.gguf", aliases=["m"])
    template, choice = _template_for(model, entry)
    assert choice.name == "gemma" and "does not compile" in choice.reason
    assert template.render([{"role": "user", "content": "x"}]).startswith("<start_of_turn>user")
    template, choice = _template_for(model, ModelEntry(model="/m.gguf", aliases=["m"],
                                                       chat_format="zephyr"))
    assert choice.name == "zephyr" and template.bos_token == "<bos>"


@pytest.mark.real_model
def test_gemma3_gets_the_gemma_builtin_and_its_reply_starts_like_llama_cpp(gemma3_path) -> None:
    chat = json.loads((GEMMA3_DIR / "greedy.json").read_text())["chat"]
    served = load_served_model(ModelEntry(model=gemma3_path, aliases=["g"], n_ctx=256,
                                          n_parallel=1))
    try:
        assert served.chat_format is not None and served.chat_format.startswith("built-in 'gemma'")
        ids = served.chat_prompt(chat["messages"])
        assert ids == chat["prompt_ids"]  # BOS added once, turn tokens parsed as special
        # compare until llama.cpp's first near-tie (margins: 1.45, 0.80, 2.69, 4.31, 3.47, 0.25)
        margins = chat["raw_top1_top2_margins"]
        n = next(i for i, m in enumerate(margins) if m < 0.5)
        got = list(served.model.generate(ids, max_tokens=n, stop_at_eog=False))
        assert got == chat["raw_ids"][:n]
        assert served.tokenizer.decode(got) == "Name three primary colors."
    finally:
        served.close()
