"""Chat templates: the jinja2 programs inside GGUF files that turn messages into a prompt.

A template comes from a model file we did not write, so it runs in jinja2's immutable sandbox
with only what Hugging Face's `apply_chat_template` offers: `messages`, `add_generation_prompt`,
`bos_token`, `eos_token`, `tools`, `raise_exception`, `strftime_now` (and llama.cpp's
`date_string` and `datetime`: today's date), the `tojson` filter (unescaped, unlike jinja's
HTML one), the `loopcontrols` extension and a pass-through `{% generation %}` block. Blocks
are trimmed (`trim_blocks`, `lstrip_blocks`) as HF does, so
templates written for transformers render the same text here. Each render has a time budget and
an output cap (engine/template_budget.py): a template that loops forever or builds gigabytes
stops with a ChatTemplateError instead.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes

from .template_budget import (
    DEFAULT_MAX_CHARS,
    DEFAULT_SECONDS,
    BudgetedSandbox,
    TemplateBudgetExceeded,
    budget,
)

# Used when a model file carries no template: the format SmolLM2, Qwen and many others use.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template did not compile, or refused these messages (raise_exception, type errors)."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in HF;
    for rendering it is a no-op wrapper, but templates using it must still parse."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension declares it an instance attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _dates() -> dict[str, str]:
    """Today's date under the names llama.cpp gives every template (common/chat.cpp
    `common_chat_extra_context`): Llama 3.x reads `date_string`, FireFunction `datetime`; a
    template that finds neither writes its own fixed date."""
    now = datetime.now()
    return {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y")}


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _environment() -> BudgetedSandbox:
    env = BudgetedSandbox(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token texts it may refer to."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, time_budget: float = DEFAULT_SECONDS,
               max_chars: int = DEFAULT_MAX_CHARS,
               variables: Mapping[str, Any] | None = None) -> str:
        """The prompt text for `messages` (dicts with at least `role` and `content`); stops
        after `time_budget` seconds or at `max_chars` characters of output. `variables` are
        further names the template may read (llama.cpp's chat_template_kwargs, such as
        `enable_thinking`); they cannot replace the ones set here."""
        try:
            with budget(time_budget, max_chars):
                fixed = dict(messages=[dict(m) for m in messages],
                             add_generation_prompt=add_generation_prompt,
                             bos_token=self.bos_token, eos_token=self.eos_token, tools=tools)
                return self._template.render({**_dates(), **(variables or {}), **fixed})
        except ChatTemplateError:
            raise
        except TemplateBudgetExceeded as exc:
            raise ChatTemplateError(str(exc)) from exc
        except MemoryError as exc:
            raise ChatTemplateError("chat template ran out of memory") from exc
        except jinja2.exceptions.SecurityError as exc:
            raise ChatTemplateError(f"chat template tried an unsafe operation: {exc}") from exc
        except Exception as exc:  # template bugs surface as TypeError, UndefinedError, ...
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def for_model(cls, source: str | None, token_texts: Sequence[str], bos_id: int | None,
                  eos_id: int | None) -> ChatTemplate:
        """The model's template (ChatML when it has none), with bos/eos texts from its vocabulary."""

        def text(token_id: int | None) -> str:
            if token_id is None or not 0 <= token_id < len(token_texts):
                return ""
            return str(token_texts[token_id])

        return cls(source or CHATML_TEMPLATE, bos_token=text(bos_id), eos_token=text(eos_id))
