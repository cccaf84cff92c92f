"""Built-in chat templates and the choice between them.

Each built-in renders one conversation (system, user, assistant, user) to the text llama.cpp's
built-in of the same name produces; those strings are written here from llama.cpp's
llm_chat_apply_template (src/llama-chat.cpp), not produced by our code; llama-2 follows Meta's
published Llama 2 chat format (" reply </s><s>[INST] "). Gemma's is also held
against llama-cpp-python's real output for Gemma 3 in tests/data/gemma3/greedy.json.
"""
from __future__ import annotations

import json

import pytest

from engine.chat import ChatTemplate
from engine.chat_formats import BUILTIN_TEMPLATES, FORMAT_NAMES, builtin_name, choose_template, guess_format
from tests.support.refs import GEMMA3_DIR

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}]

# llama.cpp's text for CHAT with add_generation_prompt (add_ass) true
EXPECTED = {
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
              "<|im_start|>assistant\n",
    "gemma": "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello."
             "<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n",
    "llama-3": "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n",
    # llama2-sys: the reply follows "[/INST]" with a space and ends " </s>" (Llama 2's card)
    "llama-2": "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Why? [/INST]",
    "mistral-instruct": " [INST] Be brief.\n\nHi [/INST] Hello.</s> [INST] Why? [/INST]",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\nWhy?<|end|>\n<|assistant|>\n",
    "zephyr": "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nHi<|endoftext|>\n<|assistant|>\n"
              "Hello.<|endoftext|>\n<|user|>\nWhy?<|endoftext|>\n<|assistant|>\n",
    "vicuna": "Be brief.\n\nUSER: Hi\nASSISTANT: Hello.</s>\nUSER: Why?\nASSISTANT:",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello.<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Why?<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    # no llama.cpp built-in: Google's template's text (tests/engine/test_gemma4_chat.py renders
    # that template itself), thinking off
    "gemma4": "<|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello."
              "<turn|>\n<|turn>user\nWhy?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
}


def render(name: str, messages: list[dict], add_generation_prompt: bool = True) -> str:
    return ChatTemplate(BUILTIN_TEMPLATES[name]).render(
        messages, add_generation_prompt=add_generation_prompt)


def test_every_builtin_has_an_expected_rendering() -> None:
    assert set(EXPECTED) == set(BUILTIN_TEMPLATES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_renders_like_llama_cpp(name: str) -> None:
    assert render(name, CHAT) == EXPECTED[name]


def test_gemma_prompt_equals_llama_cpp_python_for_gemma3() -> None:
    chat = json.loads((GEMMA3_DIR / "greedy.json").read_text())["chat"]
    assert chat["chat_format"] == "gemma"
    assert render("gemma", chat["messages"]) == chat["templated_prompt"]


def test_null_content_renders_as_empty_text() -> None:
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}]
    for name in BUILTIN_TEMPLATES:
        assert "None" not in render(name, msgs, add_generation_prompt=False), name


def test_names_and_aliases() -> None:
    assert builtin_name("Qwen") == builtin_name("chatml") == "chatml"
    assert builtin_name("llama3") == "llama-3" and builtin_name("llama2") == "llama-2"
    assert builtin_name("gemma3") == "gemma"
    assert builtin_name("nonsense") is None
    assert all(builtin_name(n) for n in FORMAT_NAMES)


@pytest.mark.parametrize(("arch", "tokens", "expected"), [
    ("gemma3", ["<pad>", "<start_of_turn>", "<end_of_turn>"], "gemma"),
    ("llama", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
     "llama-3"),
    ("llama", ["<|im_start|>", "<|im_end|>"], "chatml"),
    ("phi3", ["<|user|>", "<|assistant|>", "<|end|>"], "phi3"),
    ("llama", ["<|user|>", "<|assistant|>", "</s>"], "zephyr"),
    ("llama", ["<s>", "</s>", "[INST]", "[/INST]"], "mistral-instruct"),
    ("gemma2", ["<s>"], "gemma"),          # no turn tokens: the architecture decides
    ("qwen2", ["a"], "chatml"),
    ("llama", ["<s>", "</s>"], "chatml"),  # nothing to go on: the common default
])
def test_guess_from_tokens_then_architecture(arch: str, tokens: list[str], expected: str) -> None:
    assert guess_format(arch, tokens)[0] == expected


def test_choice_order_config_then_chat_format_then_file_then_guess() -> None:
    meta = {"general.architecture": "gemma3", "tokenizer.ggml.tokens": ["<start_of_turn>",
                                                                        "<end_of_turn>"]}
    own = dict(meta, **{"tokenizer.chat_template": "{{ 'own' }}"})
    assert choose_template(own, config_template="{{ 'mine' }}", chat_format="vicuna").origin \
        == "config"
    c = choose_template(own, chat_format="Vicuna")
    assert (c.origin, c.name, c.source) == ("chat_format", "vicuna", BUILTIN_TEMPLATES["vicuna"])
    assert choose_template(own).origin == "gguf"
    c = choose_template(meta)
    assert (c.origin, c.name) == ("built-in", "gemma")
    assert "<start_of_turn>" in c.describe() and "no chat template" in c.describe()
    with pytest.raises(ValueError, match="unknown chat_format"):
        choose_template(meta, chat_format="nope")
