"""OpenAI's request and response pieces for tools and structured output (chat.py uses them).

Ordered like OpenAI's reference: tool definitions, tool_choice, response_format, the calls an
assistant message carries (in history and in responses), and their streaming deltas.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------- requests

class FunctionDefinition(_Request):
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def for_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            out["description"] = self.description
        out["parameters"] = self.parameters if self.parameters is not None else {
            "type": "object", "properties": {}}
        return out


class ToolDefinition(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(_Request):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionCallIn(_Request):
    name: str
    arguments: str


class ToolCallIn(_Request):
    """A call in an assistant message of the conversation history."""
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCallIn


# --------------------------------------------------------------------------------- responses

class FunctionCall(_Response):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class _OmitNone(_Response):
    @model_serializer(mode="wrap")
    def _omit_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class FunctionCallDelta(_OmitNone):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_OmitNone):
    """The first delta of a call carries index, id, type and name (arguments ""); later ones
    only the index and the next piece of the arguments."""
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None
