"""A Responses request as the chat request it means, plus what only Responses has.

As Ollama's wire does (gateway/api/ollama_wire.py), a request is translated into OpenAI's chat
request (gateway/protocol/chat.py), so templates, tools, structured output and the sampling
defaults are /v1/chat/completions' machinery:

    instructions, system/developer messages   system messages, in order
    input_image parts (image_url) of a user   chat image_url parts where they were; Turn's
    message                                    image_params name them for errors (file_id: 400)
    input (a string, or items)                 user / assistant messages; function_call items
                                               join the assistant turn before them as tool_calls,
                                               function_call_output items are tool messages
    custom_tool_call(_output)                  a call with arguments {"input": ...} and its result
    reasoning items                            accepted, left out of the prompt (as templates do)
    function tools (flat), tool_choice         chat's tools (nested `function`), tool_choice
    text.format                                response_format
    max_output_tokens                          max_completion_tokens

A custom tool the request makes the model call (tool_choice names it, or it is the one tool
and the choice is "required") is a `Freeform`: the whole reply is its input, constrained
exactly by its Lark grammar (or regex) through llguidance, so the text is the grammar's to the
byte. A custom tool the model may call among others (auto, required) is offered as a function
taking {"input": string}, and the string's body follows its grammar escaped for JSON
(engine/json_string_grammar.py; `Turn.input_grammars`), so the decoded input is the grammar's
to the byte too. A grammar that cannot be written inside a JSON string is a 400 naming it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from engine.constraint import check_grammar
from engine.json_string_grammar import json_string_lark
from gateway import protocol as p
from gateway.errors import invalid_request
from gateway.generation.model import GenerativeModel
from gateway.protocol import responses as r

ITEMS: TypeAdapter[list[r.InputItem]] = TypeAdapter(list[r.InputItem])
FREEFORM_NOTE = "Reply with the input for the tool '{name}' and nothing else."


@dataclass(frozen=True)
class Freeform:
    """The custom tool a reply is the input of."""
    name: str
    grammar: str | None  # Lark text, None: free text
    param: str           # the request field a grammar error names


@dataclass
class Turn:
    chat: p.ChatCompletionRequest
    items: list[dict[str, Any]]               # the conversation so far, as input items
    custom: set[str] = field(default_factory=set)  # names of the custom tools offered
    freeform: Freeform | None = None
    image_params: list[str] = field(default_factory=list)  # where each image part was, in order
    # tool -> its input's grammar (as written, and inside a JSON string)
    input_grammars: dict[str, tuple[str, str]] = field(default_factory=dict)


def _image_url(part: r.InputImage, where: str, role: str) -> str:
    if role != "user":
        raise invalid_request(f"'{where}': input_image parts are taken only in user messages",
                              where)
    if part.file_id is not None:
        raise invalid_request(f"'{where}.file_id': files are not supported; send the image as "
                              "image_url (a data: URL)", f"{where}.file_id")
    if part.image_url is None:
        raise invalid_request(f"'{where}': an input_image needs an image_url", where)
    return part.image_url


def _content(content: str | list[r.ContentPart], where: str, role: str,
             images: list[str]) -> str | list[dict[str, Any]]:
    """The message's text, or chat's parts when it has an image (their names go to `images`)."""
    if isinstance(content, str):
        return content
    texts = []
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if isinstance(part, r.InputFile):
            raise invalid_request(f"'{where}.content[{j}]': this model does not take files",
                                  f"{where}.content[{j}]")
        if isinstance(part, r.InputImage):
            url = _image_url(part, f"{where}.content[{j}]", role)
            images.append(f"{where}.content[{j}]")
            parts.append({"type": "image_url", "image_url": {"url": url}})
            continue
        texts.append(part.refusal if isinstance(part, r.RefusalIn) else part.text)
        parts.append({"type": "text", "text": texts[-1]})
    return parts if len(parts) > len(texts) else "\n".join(texts)  # chat joins by newlines too


def _messages(instructions: str | None, items: list[r.InputItem],
              images: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if isinstance(item, r.MessageItem):
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": _content(item.content, where, role, images)})
        elif isinstance(item, r.FunctionCallItem | r.CustomToolCallItem):
            arguments = (item.arguments if isinstance(item, r.FunctionCallItem)
                         else json.dumps({"input": item.input}, ensure_ascii=False))
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": arguments}}
            if out and out[-1]["role"] == "assistant":  # the text of the same turn
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, r.FunctionCallOutputItem | r.CustomToolCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id,
                        "content": r.output_text(item.output)})
    return out


def _custom_as_function(tool: r.CustomTool) -> dict[str, Any]:
    about = tool.description or f"The freeform tool {tool.name}."
    if isinstance(tool.format, r.GrammarInputFormat):
        about += f"\nIts input follows this {tool.format.syntax} grammar:\n{tool.format.definition}"
    return {"type": "function", "function": {
        "name": tool.name, "description": about,
        "parameters": {"type": "object", "properties": {"input": {"type": "string"}},
                       "required": ["input"]}}}


def _tools(tools: list[r.Tool]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        if isinstance(tool, r.FunctionTool):
            function = tool.model_dump(exclude={"type"}, exclude_none=True)
            out.append({"type": "function", "function": function})
        else:
            out.append(_custom_as_function(tool))
    return out


def _freeform(req: r.ResponsesInput) -> Freeform | None:
    tools = req.tools or []
    choice = req.tool_choice
    if isinstance(choice, r.NamedTool) and choice.type == "custom":
        named = [(i, t) for i, t in enumerate(tools) if isinstance(t, r.CustomTool)
                 and t.name == choice.name]
        if not named:
            raise invalid_request(f"tool_choice names the custom tool '{choice.name}', which is "
                                  "not among the tools", "tool_choice")
        index, tool = named[0]
    elif choice == "required" and len(tools) == 1 and isinstance(tools[0], r.CustomTool):
        index, tool = 0, tools[0]
    else:
        return None
    assert isinstance(tool, r.CustomTool)
    fmt = tool.format
    if not isinstance(fmt, r.GrammarInputFormat):
        return Freeform(tool.name, None, f"tools[{index}].format")
    return Freeform(tool.name, _lark_text(fmt), f"tools[{index}].format.definition")


def _lark_text(fmt: r.GrammarInputFormat) -> str:
    return (fmt.definition if fmt.syntax == "lark"
            else "start: /" + fmt.definition.replace("/", "\\/") + "/")


def _input_grammars(tools: list[r.Tool]) -> dict[str, tuple[str, str]]:
    """Each custom tool's input grammar: as written, and inside a JSON string (see above)."""
    out = {}
    for i, tool in enumerate(tools):
        if isinstance(tool, r.CustomTool) and isinstance(tool.format, r.GrammarInputFormat):
            where = f"tools[{i}].format.definition"
            problem = check_grammar(_lark_text(tool.format))  # as written: its own errors
            if problem is not None:
                raise invalid_request(f"'{where}' is not a grammar llguidance reads: {problem}",
                                      where)
            try:
                text = _lark_text(tool.format)
                out[tool.name] = (text, json_string_lark(text))
            except ValueError as exc:
                raise invalid_request(f"'{where}' cannot constrain the tool's input when the "
                                      f"model may call other tools: {exc}; name the tool in "
                                      "tool_choice to use it alone", where) from None
    return out


def _tool_choice(choice: r.ToolChoice | None) -> Any:
    if isinstance(choice, r.NamedTool):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def _format(text: r.TextConfig | None, tools: bool) -> dict[str, Any]:
    fmt = text.format if text is not None else None
    if fmt is None or isinstance(fmt, r.FormatText):
        return {}
    if tools:
        raise invalid_request("'text.format' cannot be combined with 'tools'", "text.format")
    if isinstance(fmt, r.FormatJsonObject):
        return {"response_format": {"type": "json_object"}}
    schema = {"name": fmt.name, "schema": fmt.schema_}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}


def check_reasoning(req: r.ResponsesInput, model: GenerativeModel) -> None:
    """reasoning.effort against what the model does: one that does not think cannot reason
    at a level. One that does is told the effort (gateway/generation/reasoning.py; 'none'
    turns its thinking off)."""
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None and not model.tool_format.thinking and effort not in ("none",
                                                                                 "minimal"):
        raise invalid_request(f"reasoning.effort '{effort}': this model does not reason; send "
                              "'none' or leave reasoning out", "reasoning.effort")


def turn(req: r.ResponsesInput, history: list[dict[str, Any]]) -> Turn:
    """The chat request `req` means after `history` (previous_response_id's conversation)."""
    if req.truncation == "auto":
        raise invalid_request("truncation 'auto' is not supported: a prompt longer than the "
                              "context is a 400 here, never cut", "truncation")
    if isinstance(req, r.ResponsesRequest) and req.background:
        raise invalid_request("background responses are not supported", "background")
    earlier = ITEMS.validate_python(history)
    items = earlier + req.items()
    freeform = _freeform(req)
    images: list[str] = []
    messages = _messages(req.instructions, items, images)
    if freeform is not None:
        messages.append({"role": "system", "content": FREEFORM_NOTE.format(name=freeform.name)})
    if not messages:
        raise invalid_request("'input' is empty", "input")
    body: dict[str, Any] = {"model": req.model, "messages": messages,
                            **_format(req.text, bool(req.tools) and freeform is None)}
    input_grammars: dict[str, tuple[str, str]] = {}
    if req.tools and freeform is None and req.tool_choice != "none":
        input_grammars = _input_grammars(req.tools)
        body["tools"] = _tools(req.tools)
        body["parallel_tool_calls"] = req.parallel_tool_calls
        if req.tool_choice is not None:
            body["tool_choice"] = _tool_choice(req.tool_choice)
    if isinstance(req, r.ResponsesRequest):
        body["stream"] = req.stream
        if req.max_output_tokens is not None:
            body["max_completion_tokens"] = req.max_output_tokens
        for name in ("temperature", "top_p", "seed", "user", "return_progress",
                     "timings_per_token"):
            if getattr(req, name) is not None:
                body[name] = getattr(req, name)
    if req.reasoning is not None and req.reasoning.effort is not None:
        body["reasoning_effort"] = req.reasoning.effort
    chat = p.parse_request(p.ChatCompletionRequest, json.dumps(body).encode())
    custom = {t.name for t in req.tools or [] if isinstance(t, r.CustomTool)}
    stored = [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in items]
    return Turn(chat, stored, custom, freeform, images, input_grammars)
