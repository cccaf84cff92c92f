"""An Anthropic Messages request as the chat request our planning already serves.

    system (string or text blocks)    -> one system message (Claude Code's billing line dropped)
    user: tool_result blocks, text    -> a tool message per result, then the user's text
    user: image blocks (base64, url)  -> chat image_url parts (a data: URL, or the url) where
                                         the block was; image_params() names them for errors
    assistant: text, tool_use blocks  -> one assistant message with content and tool_calls
    tools (input_schema)              -> function tools; server tools (web_search_*, bash_*,
                                         ...) have no schema we could run: skipped and logged
    tool_choice any/tool/none/auto    -> required / the named function / none / auto;
                                         disable_parallel_tool_use -> parallel_tool_calls false
    thinking enabled/disabled         -> the template's `enable_thinking`; budget_tokens ->
                                         reasoning_budget (gateway/generation/reasoning.py)
    max_tokens, stop_sequences, temperature, top_p, top_k, metadata.user_id -> their OpenAI twins

Going through p.ChatCompletionRequest keeps one planning path (entry defaults, the chat
template, tool grammars, history checks: gateway/generation/) for both APIs. Only the fields the
request sent are set, so the entry's sampling defaults fill the rest as they do for chat.

Claude Code puts `x-anthropic-billing-header: cc_version=...; cch=<nonce>;` at the start of
`system`, and the nonce changes on every request: left in, no two prompts would share a prefix
and the prompt cache would never hit. The line carries nothing for the model, so it goes.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any

from gateway import protocol as p
from gateway.errors import invalid_request
from gateway.protocol import anthropic as a

log = logging.getLogger("modelyard.anthropic")

_BILLING_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)


def system_prompt(texts: list[str]) -> str:
    """The system blocks as one text, without Claude Code's per-request billing line."""
    kept = [_BILLING_LINE.sub("", text) for text in texts]
    return "\n\n".join(text for text in kept if text.strip())


def _no_media(block: a.ContentBlockParam, where: str) -> None:
    """Images go only where chat has image parts: a user message's own content."""
    if isinstance(block, a.DocumentBlockParam):
        raise invalid_request(f"{where}: 'document' blocks are not supported; send the text",
                              where)
    if isinstance(block, a.ImageBlockParam):
        raise invalid_request(f"{where}: 'image' blocks are taken only in a user message's "
                              "own content (not an assistant's, nor inside a tool_result)", where)


def _image_url(block: a.ImageBlockParam, where: str) -> str:
    """The block's source as the URL chat's image_url part carries."""
    source = block.source
    kind, media, data, url = (source.get(k) for k in ("type", "media_type", "data", "url"))
    if kind == "base64" and isinstance(media, str) and isinstance(data, str):
        return f"data:{media};base64,{data}"
    if kind == "url" and isinstance(url, str):
        return url
    raise invalid_request(f"{where}.source: an image source is {{type: base64, media_type, "
                          "data}} or {type: url, url}", f"{where}.source")


def image_params(req: a.CountTokensRequest) -> list[str]:
    """Where each image of chat_request(req) was, in order: messages[i].content[j]."""
    return [f"messages[{i}].content[{j}]" for i, message in enumerate(req.messages)
            for j, block in enumerate(message.blocks()) if isinstance(block, a.ImageBlockParam)]


def _result_text(block: a.ToolResultBlockParam, where: str) -> str:
    if isinstance(block.content, str):
        text = block.content
    else:
        for j, part in enumerate(block.content):
            _no_media(part, f"{where}.content[{j}]")
        text = "\n".join(part.text for part in block.content
                         if isinstance(part, a.TextBlockParam))
    # templates know no failed results; the model still needs to be told
    return f"Error: {text}" if block.is_error else text


def _messages(req: a.CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = system_prompt(req.system_texts())
    if system:
        out.append({"role": "system", "content": system})
    calls: set[str] = set()
    for i, message in enumerate(req.messages):
        texts: list[str] = []
        parts: list[dict[str, Any]] = []  # texts and images, when the message has an image
        tool_calls: list[dict[str, Any]] = []
        thoughts: list[str] = []
        for j, block in enumerate(message.blocks()):
            where = f"messages[{i}].content[{j}]"
            if isinstance(block, a.ImageBlockParam) and message.role == "user":
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block, where)}})
                continue
            _no_media(block, where)
            if isinstance(block, a.TextBlockParam):
                texts.append(block.text)
                parts.append({"type": "text", "text": block.text})
            elif isinstance(block, a.ToolUseBlockParam):
                if message.role != "assistant":
                    raise invalid_request(f"{where}: only assistant messages hold tool_use "
                                          "blocks", where)
                calls.add(block.id)
                tool_calls.append({"id": block.id, "type": "function", "function": {
                    "name": block.name, "arguments": json.dumps(block.input)}})
            elif isinstance(block, a.ToolResultBlockParam):
                if message.role != "user":
                    raise invalid_request(f"{where}: only user messages hold tool_result "
                                          "blocks", where)
                if block.tool_use_id not in calls:
                    raise invalid_request(f"{where}: tool_use_id '{block.tool_use_id}' answers "
                                          "no earlier tool_use block", where)
                out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": _result_text(block, where)})
            elif isinstance(block, a.ThinkingBlockParam):
                thoughts.append(block.thinking)
            # redacted_thinking is encrypted: nothing a template could render
        if message.role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
            if tool_calls:
                turn["tool_calls"] = tool_calls
            if thoughts:  # as llama.cpp converts them: templates such as Qwen3's render
                turn["reasoning_content"] = "\n".join(thoughts)  # the latest turns' thinking
            out.append(turn)
        elif len(parts) > len(texts):  # chat joins parts by newlines too
            out.append({"role": "user", "content": parts})
        elif texts or not any(isinstance(b, a.ToolResultBlockParam) for b in message.blocks()):
            out.append({"role": "user", "content": "\n".join(texts)})
    if req.messages[-1].role == "assistant":
        where = f"messages[{len(req.messages) - 1}]"
        raise invalid_request(f"{where}: a final assistant message (a prefill to continue) is "
                              "not supported; end with a user message", where)
    return out


def _tools(req: a.CountTokensRequest) -> list[dict[str, Any]]:
    tools = req.tools or []
    skipped = [t.name for t in tools if not t.is_client_tool]
    if skipped:
        log.info("skipping tools the server would run (%s): modelyard offers client tools only",
                 ", ".join(skipped))
    return [{"type": "function", "function": {
        "name": t.name, **({"description": t.description} if t.description else {}),
        "parameters": t.input_schema}} for t in tools if t.is_client_tool]


def _tool_choice(choice: a.ToolChoice, where: str) -> str | dict[str, Any]:
    if choice.type == "tool":
        if not choice.name:
            raise invalid_request(f"{where}: type 'tool' needs a 'name'", f"{where}.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _thinking(req: a.CountTokensRequest) -> dict[str, Any]:
    """`thinking` as the chat twin's reasoning fields: `enable_thinking` (Qwen3's name, which
    other thinking templates read too) and an enabled block's budget_tokens as its budget."""
    if req.thinking is None:
        return {}
    think = req.thinking.type != "disabled"
    out: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": think}}
    if think and req.thinking.budget_tokens is not None:
        out["reasoning_budget"] = req.thinking.budget_tokens
    return out


def chat_request(req: a.CountTokensRequest) -> p.ChatCompletionRequest:
    """The chat request that plans like `req` (see the module docstring)."""
    body: dict[str, Any] = {"messages": _messages(req), **_thinking(req)}
    if req.model is not None:
        body["model"] = req.model
    tools = _tools(req)
    if tools:
        body["tools"] = tools
        if req.tool_choice is not None:
            body["tool_choice"] = _tool_choice(req.tool_choice, "tool_choice")
            if req.tool_choice.disable_parallel_tool_use:
                body["parallel_tool_calls"] = False
    if isinstance(req, a.MessageCreateRequest):
        body["max_tokens"] = req.max_tokens
        body["stream"] = req.stream
        if req.stop_sequences:
            body["stop"] = req.stop_sequences
        for name in ("temperature", "top_p", "top_k"):
            if (value := getattr(req, name)) is not None:
                body[name] = value
        if req.metadata is not None and req.metadata.user_id is not None:
            body["user"] = req.metadata.user_id
    chat = p.parse_request(p.ChatCompletionRequest, json.dumps(body).encode())
    return chat if req.keep_alive is None else chat.model_copy(
        update={"keep_alive": req.keep_alive})
