"""Built-in chat templates, and which template a model gets.

Many GGUF files carry no `tokenizer.chat_template` (Gemma 3 270M, older Llama 2 and Mistral
conversions, ...). For those, modelyard ships the common formats by name, written here as jinja2
templates from the public descriptions of each format (llama.cpp's `llm_chat_template` list,
llama-cpp-python's chat formats, the model cards). They render the text llama.cpp's built-in of
the same name renders (llama-2: Meta's published format, " reply </s><s>[INST] ..."); BOS is not
part of the text, the tokenizer adds it when the model wants it.

Which template a model gets, first match wins (`choose_template`):

  1. the entry's `chat_template` (inline text or a template file)      origin "config"
  2. the entry's `chat_format` (a built-in name, llama-cpp-python's key) origin "chat_format"
  3. the file's own `tokenizer.chat_template`                           origin "gguf"
  4. a built-in guessed from the vocabulary's turn tokens, then from the architecture,
     else chatml                                                        origin "built-in"
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Each template sees `messages` (role, content) and `add_generation_prompt`, as HF's do.
# `content or ''` keeps a null content (an assistant turn with only tool calls) from failing.
_CHATML = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] or '') + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Gemma has no system role: system text goes at the top of the next user turn; "assistant" is
# "model"; contents are trimmed.
_GEMMA = (
    "{% set ns = namespace(system='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = ns.system + (m['content'] or '')|trim %}"
    "{% else %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% if ns.system and role != 'model' %}{{ ns.system + '\n\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ (m['content'] or '')|trim + '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")

# Gemma 4: "<|turn>role\n ... <turn|>\n" (text parts trimmed one by one), a system turn
# (system/developer message; also opened for the thinking switch, which writes <|think|> at its
# top); a model turn's old thought channels are dropped; with thinking off the generation prompt
# closes an empty thought. Tools are not described (a file's own template does that).
_GEMMA4 = (
    "{%- set think = enable_thinking is defined and enable_thinking -%}"
    "{%- set has_system = messages and messages[0]['role'] in ['system', 'developer'] -%}"
    "{%- macro text(m) -%}"
    "{%- if m['content'] is string -%}{{ m['content'] }}"
    "{%- elif m['content'] -%}{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro without_thoughts(t) -%}"
    "{%- for part in t.split('<channel|>') -%}{{ part.split('<|channel>')[0] }}{%- endfor -%}"
    "{%- endmacro -%}"
    "{%- if think or has_system -%}"
    "{{ '<|turn>system\n' }}{%- if think -%}{{ '<|think|>\n' }}{%- endif -%}"
    "{%- if has_system -%}{{ text(messages[0]) | trim }}{%- endif -%}{{ '<turn|>\n' }}"
    "{%- endif -%}"
    "{%- for m in (messages[1:] if has_system else messages) -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{{ '<|turn>model\n' + without_thoughts(text(m)) | trim + '<turn|>\n' }}"
    "{%- elif m['role'] != 'tool' -%}"
    "{{ '<|turn>' + m['role'] + '\n' + text(m) | trim + '<turn|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\n' }}"
    "{%- if not think -%}{{ '<|channel>thought\n<channel|>' }}{%- endif -%}{%- endif -%}")

_LLAMA3 = (
    "{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
    " + (m['content'] or '')|trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

# Llama 2 chat: turns are "[INST] ... [/INST]" + reply + "</s>"; the system prompt sits in
# <<SYS>> inside the first instruction; later turns restart with "<s>[INST] ".
_LLAMA2 = (
    "{% set ns = namespace(inside=true) %}"
    "{{ '[INST] ' }}"
    "{% for m in messages %}"
    "{% if not ns.inside %}{{ '<s>[INST] ' }}{% set ns.inside = true %}{% endif %}"
    "{% if m['role'] == 'system' %}{{ '<<SYS>>\n' + (m['content'] or '') + '\n<</SYS>>\n\n' }}"
    "{% elif m['role'] == 'user' %}{{ (m['content'] or '') + ' [/INST]' }}"
    "{% else %}{{ ' ' + (m['content'] or '') + ' </s>' }}{% set ns.inside = false %}"
    "{% endif %}"
    "{% endfor %}")

# Mistral Instruct (v1): " [INST] " opens a turn, " [/INST]" closes the user part, the reply
# follows with its "</s>"; a system message is put before the next user text.
_MISTRAL = (
    "{% set ns = namespace(inside=false) %}"
    "{% for m in messages %}"
    "{% if not ns.inside %}{{ ' [INST] ' }}{% set ns.inside = true %}{% endif %}"
    "{% if m['role'] == 'system' %}{{ (m['content'] or '') + '\n\n' }}"
    "{% elif m['role'] == 'user' %}{{ (m['content'] or '') + ' [/INST]' }}"
    "{% else %}{{ ' ' + (m['content'] or '') + '</s>' }}{% set ns.inside = false %}"
    "{% endif %}"
    "{% endfor %}")

_PHI3 = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\n' + (m['content'] or '') + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

_ZEPHYR = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\n' + (m['content'] or '') + '<|endoftext|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

# Vicuna 1.1: the system text is a bare preamble; turns are "USER: ..." / "ASSISTANT: ...</s>".
_VICUNA = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ (m['content'] or '') + '\n\n' }}"
    "{% elif m['role'] == 'user' %}{{ 'USER: ' + (m['content'] or '') + '\n' }}"
    "{% elif m['role'] == 'assistant' %}{{ 'ASSISTANT: ' + (m['content'] or '') + '</s>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")

# Command R (CohereForAI/c4ai-command-r-plus): every turn in START/END_OF_TURN tokens, its
# content trimmed; the reply opens with the CHATBOT token.
_COMMAND_R = (
    "{% set roles = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'} %}"
    "{% for m in messages %}{% if m['role'] in roles %}"
    "{{ '<|START_OF_TURN_TOKEN|><|' + roles[m['role']] + '_TOKEN|>' + (m['content'] or '')|trim"
    " + '<|END_OF_TURN_TOKEN|>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}")

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": _CHATML, "gemma": _GEMMA, "gemma4": _GEMMA4, "llama-3": _LLAMA3, "llama-2": _LLAMA2,
    "mistral-instruct": _MISTRAL, "phi3": _PHI3, "zephyr": _ZEPHYR, "vicuna": _VICUNA,
    "command-r": _COMMAND_R,
}

# Other spellings people use (llama.cpp's names, llama-cpp-python's) -> the built-in's name
ALIASES: dict[str, str] = {
    "qwen": "chatml", "chatml-function-calling": "chatml", "openhermes": "chatml",
    "llama3": "llama-3", "llama2": "llama-2", "mistral": "mistral-instruct",
    "mistral-v1": "mistral-instruct", "phi-3": "phi3", "gemma2": "gemma", "gemma3": "gemma",
}

FORMAT_NAMES: tuple[str, ...] = tuple(sorted({*BUILTIN_TEMPLATES, *ALIASES}))


def builtin_name(name: str) -> str | None:
    """The built-in a `chat_format` value means (case-insensitive), or None if there is none."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in BUILTIN_TEMPLATES else None


# Evidence in the vocabulary, strongest first: (tokens that must all exist, format)
_BY_TOKENS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<start_of_turn>", "<end_of_turn>"), "gemma"),
    (("<|turn>", "<turn|>"), "gemma4"),
    (("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "llama-3"),
    (("<|im_start|>", "<|im_end|>"), "chatml"),
    (("<|assistant|>", "<|end|>"), "phi3"),
    (("<|user|>", "<|assistant|>"), "zephyr"),
    (("[INST]", "[/INST]"), "mistral-instruct"),
)
_BY_ARCH: dict[str, str] = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma4": "gemma4", "qwen2": "chatml",
    "qwen3": "chatml", "phi3": "phi3",
}


@dataclass(frozen=True)
class TemplateChoice:
    """The template source a model renders with, and why it was chosen."""

    source: str
    origin: str            # "config", "chat_format", "gguf" or "built-in"
    name: str | None       # the built-in's name when one is used
    reason: str            # for the load log and /admin/models

    def describe(self) -> str:
        what = f"built-in {self.name!r}" if self.name else f"{self.origin} template"
        return f"{what} ({self.reason})"


def guess_format(arch: str | None, token_texts: Sequence[str] | set[str]) -> tuple[str, str]:
    """(built-in name, why) for a model whose file has no template."""
    vocab = token_texts if isinstance(token_texts, (set, frozenset)) else set(token_texts)
    for tokens, name in _BY_TOKENS:
        if all(t in vocab for t in tokens):
            return name, f"the vocabulary has {' '.join(tokens)}"
    if arch in _BY_ARCH:
        return _BY_ARCH[arch], f"architecture {arch}"
    return "chatml", "no turn tokens or known architecture: the common default"


def choose_template(metadata: Mapping[str, object], *, config_template: str | None = None,
                    chat_format: str | None = None) -> TemplateChoice:
    """Which template a model renders with (the order is in the module docstring)."""
    if config_template is not None:
        return TemplateChoice(config_template, "config", None, "chat_template in the config")
    if chat_format is not None:
        name = builtin_name(chat_format)
        if name is None:
            raise ValueError(f"unknown chat_format {chat_format!r}; known: {', '.join(FORMAT_NAMES)}")
        return TemplateChoice(BUILTIN_TEMPLATES[name], "chat_format", name,
                              f"chat_format {chat_format!r} in the config")
    own = metadata.get("tokenizer.chat_template")
    if isinstance(own, str) and own.strip():
        return TemplateChoice(own, "gguf", None, "the file's tokenizer.chat_template")
    arch = metadata.get("general.architecture")
    tokens = metadata.get("tokenizer.ggml.tokens")
    name, why = guess_format(arch if isinstance(arch, str) else None,
                             tokens if isinstance(tokens, (list, tuple)) else ())
    return TemplateChoice(BUILTIN_TEMPLATES[name], "built-in", name,
                          f"the file has no chat template; chosen because {why}")
