"""What a reply must follow: response_format, llama.cpp's json_schema / grammar, and tools.

`chat_output` and `completion_output` check a request's fields together (a conflict or a tool
history that does not add up is a 400 naming the field or the message) and return an `Output`:
the llguidance grammar to constrain each choice with (or none) and, with tools, the family
format its replies are read with. `Output.compile` turns the grammar into a constraint on a
worker thread (building the model's tokenizer adapter the first time), so the event loop never
waits for llguidance; a schema it cannot compile is a 400 that names where the problem is.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from engine.constraint import (
    Constraint,
    ConstraintError,
    TokenizerAdapter,
    after_block,
    check_grammar,
    gbnf_grammar,
    json_schema_grammar,
    lark_grammar,
    with_subgrammars,
)
from engine.loaded import ModelTokenizer
from engine.tool_format_base import INPUT_GRAMMAR, RAW_SUFFIX
from engine.tool_formats import ThinkingFormat, ToolFormat
from gateway import protocol as p
from gateway.errors import invalid_request

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class Output:
    grammar: str | None = None               # llguidance grammar text, None = free text
    param: str = "response_format"            # the request field a compile error names
    schemas: dict[str, Any] = field(default_factory=dict)  # param -> the schema it gave
    tool_format: ToolFormat | None = None     # replies are read for tool calls
    messages: list[dict[str, Any]] = field(default_factory=list)   # chat: for the template
    template_tools: list[dict[str, Any]] | None = None
    template_vars: dict[str, Any] = field(default_factory=dict)  # e.g. enable_thinking
    json: dict[str, Any] | bool | None = None  # the schema the reply follows (closed), if any
    gbnf: str | None = None                   # a GBNF grammar, converted when compiled

    @property
    def constrained(self) -> bool:
        return self.grammar is not None or self.gbnf is not None

    def after_opened_block(self, close: str) -> None:
        """The prompt opened the thinking block (reasoning.opens_block): a schema or tool
        grammar applies once the block closes (`close`: the tag as a Lark item); the reasoning
        before it is free. A raw `grammar` stays whole-reply, as llama.cpp applies it."""
        if self.grammar is None or self.gbnf is not None:
            return
        body = self.grammar
        if self.json is not None:  # a schema (never beside tools): the block is over, so
            body = json_schema_grammar(self.json)  # not json_after_thinking's optional one
        self.grammar = after_block(body, close)

    async def compile(self, tokenizer: ModelTokenizer) -> Constraint | None:
        if not self.constrained:
            return None
        return await asyncio.to_thread(self._compile, tokenizer)

    def _compile(self, tokenizer: ModelTokenizer) -> Constraint:
        for param, schema in self.schemas.items():
            _check_schema(schema, param)
        try:
            grammar = gbnf_grammar(self.gbnf) if self.gbnf is not None else self.grammar
            return TokenizerAdapter.of(tokenizer).compile(grammar)  # type: ignore[arg-type]
        except ConstraintError as exc:
            raise invalid_request(f"'{self.param}' cannot be used: {exc}", self.param) from None


# --------------------------------------------------------------------------------- schema checks

def _check_schema(schema: Any, param: str) -> None:
    """400 naming the keyword and its path when `schema` is not a JSON Schema, or when
    llguidance cannot compile some part of it."""
    if not isinstance(schema, (dict, bool)):
        raise invalid_request(f"'{param}' must be a JSON Schema object", param)
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)  # type: ignore[arg-type]  # the stubs forget boolean schemas
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(str(x) for x in exc.path)
        raise invalid_request(f"'{param}' is not a valid JSON Schema: at '{where}' "
                              f"(keyword '{exc.validator}'): {exc.message}", param) from None
    error = _compile_error(schema)
    if error is not None:
        where, message = _locate(schema, "", error)
        raise invalid_request(f"'{param}' cannot be compiled: at '{where or '/'}': {message}",
                              param)


def _compile_error(schema: Any) -> str | None:
    try:
        return check_grammar(json_schema_grammar(schema))
    except (ValueError, ConstraintError) as exc:
        return str(exc)


_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                  "propertyNames")


def _children(schema: dict[str, Any], path: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key in _SUBSCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            out.append((f"{path}/{key}/{name}", sub))
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or []):
            out.append((f"{path}/{key}/{i}", sub))
    for key in _SUBSCHEMA_ONE:
        if isinstance(schema.get(key), dict):
            out.append((f"{path}/{key}", schema[key]))
    return out


def _locate(schema: Any, path: str, error: str) -> tuple[str, str]:
    """The deepest subschema that fails alone with the same error (its path, the error)."""
    if isinstance(schema, dict):
        for child_path, child in _children(schema, path):
            if isinstance(child, dict) and _compile_error(child) == error:
                return _locate(child, child_path, error)
        for keyword in ("pattern", "format", "$ref"):  # the keywords whose text fails alone
            if keyword in schema and _compile_error({keyword: schema[keyword]}) == error:
                return f"{path}/{keyword}", error
    return path, error


# An integer with no bound may take any number of digits, and a small model can repeat a digit
# until max_tokens (seen on SmolLM2 at temperature 0.3: 1 reply in 100); JSON integers past
# 2**53 do not survive a round trip through an IEEE double in most parsers anyway.
SAFE_INTEGER = 2**53 - 1


def closed(schema: Any) -> Any:
    """`schema` as it is decoded: every object that lists `properties` but says nothing of
    `additionalProperties` closed to the listed ones, as llama.cpp's converter does (a tool
    takes its declared parameters, and a small model left free to invent keys rambles until
    max_tokens: the JSON then never closes), and every integer without a bound kept within
    ±SAFE_INTEGER, so its digits end."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k in _SUBSCHEMA_ONE or k in _SUBSCHEMA_LISTS else v
           for k, v in schema.items()}
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in schema[key].items()}
    if "properties" in out and "additionalProperties" not in out and \
            "patternProperties" not in out:
        out["additionalProperties"] = False
    kind = out.get("type")
    if kind == "integer" or (isinstance(kind, list) and "integer" in kind and "number" not in kind):
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = SAFE_INTEGER
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -SAFE_INTEGER
    return out


# --------------------------------------------------------------------------------- requests

def _generation_output(req: p.GenerationRequestBody) -> Output:
    """response_format / json_schema / grammar, shared by chat and completions."""
    fmt = req.response_format
    wants_format = fmt is not None and fmt.type != "text"
    if req.json_schema is not None and req.grammar is not None:
        raise invalid_request("'json_schema' and 'grammar' cannot be used together", "grammar")
    if wants_format and (req.json_schema is not None or req.grammar is not None):
        raise invalid_request("'response_format' cannot be combined with 'json_schema' or "
                              "'grammar'", "response_format")
    if fmt is not None and fmt.type == "json_object":
        return Output(json_schema_grammar(ANY_OBJECT), "response_format", json=ANY_OBJECT)
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise invalid_request("'response_format.json_schema' is required when type is "
                                  "'json_schema'", "response_format.json_schema")
        schema = fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else ANY_OBJECT
        param = "response_format.json_schema.schema"
        return Output(_schema_grammar(closed(schema), param), param, {param: schema},
                      json=closed(schema))
    if req.json_schema is not None:
        return Output(_schema_grammar(closed(req.json_schema), "json_schema"), "json_schema",
                      {"json_schema": req.json_schema}, json=closed(req.json_schema))
    if req.grammar is not None:  # converted on the worker thread: a big grammar takes a while
        return Output(param="grammar", gbnf=req.grammar)
    return Output()


def _schema_grammar(schema: Any, param: str) -> str:
    try:
        return json_schema_grammar(schema)
    except ValueError as exc:
        raise invalid_request(f"'{param}' is not a JSON Schema: {exc}", param) from None


def completion_output(req: p.CompletionRequest) -> Output:
    return _generation_output(req)


def chat_output(req: p.ChatCompletionRequest, tool_format: ToolFormat,
                input_grammars: Mapping[str, tuple[str, str]] | None = None) -> Output:
    """The constraint and the template input (messages, tools) of a chat request.
    `input_grammars`: tool name -> (the Lark grammar of a freeform tool's input, the same
    written inside a JSON string: engine/json_string_grammar.py); such a tool takes {"input":
    string}, and its calls follow that grammar exactly whatever the choice."""
    out = _generation_output(req)
    history = _history(req)
    choice = req.tool_choice
    if choice is not None and not req.tools:
        raise invalid_request("'tool_choice' is only allowed when 'tools' are given", "tool_choice")
    offered = bool(req.tools) and choice != "none"
    if not offered:
        out.messages, out.template_tools = tool_format.prompt(history, None)
        if tool_format.thinking:  # reasoning stays free, is returned as reasoning_content,
            # and a schema applies after it (<think>, or the family's own channels)
            thinking = (tool_format if tool_format.reads_own_reasoning
                        else ThinkingFormat(tool_format.special))
            out.tool_format = thinking
            if out.json is not None:
                out.grammar = lark_grammar(thinking.json_after_thinking(out.json))
        return out
    assert req.tools is not None
    if out.constrained:
        what = "grammar" if req.grammar is not None else (
            "json_schema" if req.json_schema is not None else "response_format")
        raise invalid_request(f"'{what}' cannot be combined with 'tools'", what)
    functions = [t.function.for_template() for t in req.tools]
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise invalid_request("tool names must be unique", "tools")
    mode = "auto" if choice is None else choice if isinstance(choice, str) else choice.function.name
    if mode not in ("auto", "required") and mode not in names:
        raise invalid_request(f"tool_choice names '{mode}', which is not among the tools",
                              "tool_choice")
    schemas = {f"tools[{i}].function.parameters": f["parameters"] for i, f in enumerate(functions)}
    template_tools = [{"type": "function", "function": f} for f in functions]
    messages, template_tools_out = tool_format.prompt(history, template_tools)
    constrained = [{**f, "parameters": closed(f["parameters"])} for f in functions]
    subgrammars: dict[str, str] = {}
    for f in constrained:
        if input_grammars and f["name"] in input_grammars:
            f[INPUT_GRAMMAR] = ref = f"input_{len(subgrammars) // 2}"
            subgrammars[ref + RAW_SUFFIX], subgrammars[ref] = input_grammars[f["name"]]
    # a named choice is one call, as OpenAI's is: a small model would otherwise repeat it
    parallel = req.parallel_tool_calls and mode in ("auto", "required")
    grammar = with_subgrammars(lark_grammar(tool_format.grammar(constrained, mode, parallel)),
                               subgrammars)
    return Output(grammar, "tools", schemas, tool_format, messages, template_tools_out)


def _history(req: p.ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages for the template: call arguments as objects, tool results with their call's
    name. A call whose arguments are not a JSON object, or a tool message answering no call,
    is a 400 naming the message."""
    calls: dict[str, str] = {}  # call id -> function name
    out: list[dict[str, Any]] = []
    for i, message in enumerate(req.messages):
        m = message.for_template()
        if message.tool_calls:
            if message.role != "assistant":
                raise invalid_request(f"messages[{i}]: only assistant messages carry tool_calls",
                                      f"messages[{i}].tool_calls")
            converted = []
            for j, call in enumerate(message.tool_calls):
                try:
                    arguments = json.loads(call.function.arguments)
                except json.JSONDecodeError:
                    arguments = None
                if not isinstance(arguments, dict):
                    raise invalid_request(f"messages[{i}].tool_calls[{j}].function.arguments is "
                                          "not a JSON object", f"messages[{i}].tool_calls[{j}]")
                calls[call.id] = call.function.name
                converted.append({"id": call.id, "type": "function",
                                  "function": {"name": call.function.name,
                                               "arguments": arguments}})
            m["tool_calls"] = converted
        if message.role == "tool":
            if message.tool_call_id is None:
                raise invalid_request(f"messages[{i}]: a tool message needs 'tool_call_id'",
                                      f"messages[{i}].tool_call_id")
            if message.tool_call_id not in calls:
                raise invalid_request(f"messages[{i}]: tool_call_id '{message.tool_call_id}' "
                                      "answers no earlier tool call", f"messages[{i}].tool_call_id")
            m.setdefault("name", calls[message.tool_call_id])
        out.append(m)
    return out
