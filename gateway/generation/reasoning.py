"""Reasoning controls: every API's way of asking about thinking, mapped to one set of settings.

Each wire writes its API's control into its chat twin's fields (llama.cpp's names), the entry
fills what the request left out (`with_entry_defaults`), and `settings()` reads them:

    OpenAI chat   chat_template_kwargs, reasoning_effort, reasoning_format, reasoning_budget
    Anthropic     thinking disabled / enabled (budget_tokens)  -> enable_thinking, reasoning_budget
    Ollama        think false / true / "low".."high"            -> enable_thinking, reasoning_effort
    Responses     reasoning.effort                              -> reasoning_effort

and they become:

    template_vars  what the chat template reads beside the messages (enable_thinking for Qwen3
                   and the templates that copy it, reasoning_effort for gpt-oss's)
    budget         tokens the thinking block may take before its closing tag is forced
                   (engine/thinking_budget.py); thinking off is a budget of 0, so a template
                   without a switch cannot think anyway; None = unlimited
    format         how a reply's block is returned, as llama.cpp's --reasoning-format: "none"
                   leaves it in content, "deepseek" (and "auto") moves it to reasoning_content,
                   "deepseek-legacy" does both

Whether the prompt itself opened the block (Qwen3-Thinking-2507, newer R1 and QwQ templates end
the prompt with `<think>`) is read from the rendered prompt: `opens_block`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from engine.thinking_budget import ThinkingBudget
from engine.tool_formats import THINK_CLOSE, THINK_OPEN
from gateway import protocol as p

if TYPE_CHECKING:
    from gateway.config import ModelEntry
    from gateway.generation.model import GenerativeModel

Format = Literal["none", "deepseek", "deepseek-legacy"]
ENTRY_KEYS = ("reasoning_effort", "reasoning_format", "reasoning_budget")


@dataclass(frozen=True)
class Settings:
    template_vars: dict[str, Any] = field(default_factory=dict)
    budget: int | None = None
    format: Format = "deepseek"


def settings(req: p.ChatCompletionRequest) -> Settings:
    """The settings `req`'s reasoning fields ask for (after with_entry_defaults)."""
    variables = dict(req.chat_template_kwargs or {})
    think = variables.get("enable_thinking")
    budget = req.reasoning_budget if req.reasoning_budget not in (None, -1) else None
    if req.reasoning_effort == "none" or budget == 0:
        think = False
    elif req.reasoning_effort is not None:
        variables["reasoning_effort"] = req.reasoning_effort  # gpt-oss's template reads it
    if isinstance(think, bool):
        variables["enable_thinking"] = think
        if not think:
            budget = 0
    fmt: Format = ("deepseek" if req.reasoning_format is None or req.reasoning_format == "auto"
                   else req.reasoning_format)
    return Settings(variables, budget, fmt)


def with_entry_defaults(req: p.ChatCompletionRequest, entry: ModelEntry) -> p.ChatCompletionRequest:
    """`req` with the reasoning fields it left out taken from the entry; its template kwargs
    go over the entry's."""
    update: dict[str, Any] = {k: getattr(entry, k) for k in ENTRY_KEYS
                              if getattr(req, k) is None and getattr(entry, k) is not None}
    if entry.chat_template_kwargs:
        update["chat_template_kwargs"] = {**entry.chat_template_kwargs,
                                          **(req.chat_template_kwargs or {})}
    return req.model_copy(update=update) if update else req


def opens_block(prompt: str) -> bool:
    """The rendered prompt ends inside an open thinking block: the reply starts in it."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN) and tail.rfind(THINK_OPEN) > tail.rfind(THINK_CLOSE)


def budget(model: GenerativeModel, limit: int | None, inside: bool) -> ThinkingBudget | None:
    """The rule that closes the block after `limit` tokens, for a model that thinks."""
    if limit is None or not (model.tool_format.thinking or inside):
        return None
    tokenizer, fmt = model.tokenizer, model.tool_format
    return ThinkingBudget(limit, tokenizer.token_bytes,
                          lambda text: tokenizer.encode(text, parse_special=True), inside,
                          fmt.think_open.encode(), fmt.think_close.encode())
