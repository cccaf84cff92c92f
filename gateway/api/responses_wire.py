"""OpenAI's Responses API as a wire of the one pipeline (gateway/api/pipeline.py).

The plan is /v1/chat/completions' for the chat request the input means
(gateway/api/responses_input.py); a forced custom tool replaces the grammar with its own. The
renderers give the Response object and its typed event stream: `event: <type>` + `data:` SSE
frames, every one with the next `sequence_number`, no `[DONE]` (OpenAI sends none):

    response.created, response.in_progress            the response, status in_progress, no output
    per output item, in order (reasoning, message, function_call / custom_tool_call):
      response.output_item.added                      the item, empty
      (message) response.content_part.added           an empty output_text part
      ...text.delta / reasoning_text.delta / function_call_arguments.delta /
         custom_tool_call_input.delta                 its pieces as they come
      ....done, (message) response.content_part.done, response.output_item.done   it whole
    response.completed (or response.incomplete: cut by max_output_tokens), holding the whole
    output and usage - what openai-python's stream helper checks the items against.

llama-server's telemetry, only when the request asks (gateway/api/llama_telemetry.py):
`return_progress` adds a response.in_progress event with `prompt_progress` per prompt chunk
read; `timings_per_token` adds `timings` to the last event of each text piece and to the
closing event. A stream that asks for either is a llama-server client's, and closes as
llama-server's do: always response.completed (the response in it still says `incomplete` when
max_output_tokens cut it). Without them the stream is exactly OpenAI's.

A wire object serves one request (`ResponsesWire(store, turn)`): it counts the stream's
sequence numbers, the error event included, and stores the finished response for
previous_response_id (gateway/api/response_store.py) unless the request said `store: false`.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from engine.constraint import lark_grammar
from gateway import protocol as p
from gateway.api import llama_telemetry, openai_wire
from gateway.api.response_store import ResponseStore
from gateway.api.responses_input import Turn, check_reasoning
from gateway.config import LimitSettings
from gateway.errors import APIError, invalid_request
from gateway.fleet.registry import Lease
from gateway.generation import serving
from gateway.generation.choices import ChoiceResult, choice_events
from gateway.generation.events import Finished, PromptProgress
from gateway.generation.model import GenerativeModel
from gateway.generation.serving import Plan
from gateway.generation.structured import Output
from gateway.generation.tool_stream import new_call_id
from gateway.http.streaming import Framing, sse
from gateway.protocol import responses as r


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _frame(payload: BaseModel | dict[str, Any]) -> bytes:
    kind = payload["type"] if isinstance(payload, dict) else "message"
    return f"event: {kind}\n".encode() + sse(payload)


RESPONSES_SSE = Framing("text/event-stream", _frame, b"")


@dataclass
class ResponsesPlan(Plan):
    response_id: str = ""
    created_at: int = 0


# --------------------------------------------------------------------------------- output items

class OutputBuilder:
    """The reply's output items as its pieces arrive, and the events that announce them.

        (none) --piece of a kind--> item open --more of that kind--> item open (a delta)
                                       |
                                       +--piece of another kind / a new call / the end-->
                                          item done (its .done events), the next one opens

    A piece is reasoning text, message text, a call's start or a call's argument text. `close`
    (with the item status) ends the open item; `items` are the finished ones, in order.
    """

    def __init__(self, custom: set[str]) -> None:
        self.custom = custom            # names of custom tools: their calls become custom items
        self.items: list[r.OutputItem] = []
        self._open: r.OutputItem | None = None
        self._text = ""                 # the open item's text so far
        self._freeform = False          # the open item is a custom call whose input is raw text

    def _index(self) -> int:
        return len(self.items)

    def reasoning(self, text: str) -> list[dict[str, Any]]:
        return self._piece(r.ReasoningOut, text, "response.reasoning_text.delta")

    def message(self, text: str) -> list[dict[str, Any]]:
        return self._piece(r.OutputMessage, text, "response.output_text.delta")

    def _piece(self, kind: type, text: str, delta_type: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not isinstance(self._open, kind):
            events += self.close("completed")
            item_id = new_id("rs" if kind is r.ReasoningOut else "msg")
            self._open = (r.ReasoningOut(id=item_id, content=[], status="in_progress")
                          if kind is r.ReasoningOut else
                          r.OutputMessage(id=item_id, status="in_progress", content=[]))
            events.append(self._added())
            if kind is r.OutputMessage:
                events.append({"type": "response.content_part.added", "item_id": item_id,
                               "output_index": self._index(), "content_index": 0,
                               "part": r.OutputText(text="").model_dump()})
        self._text += text
        assert self._open is not None
        event = {"type": delta_type, "item_id": self._open.id, "output_index": self._index(),
                 "content_index": 0, "delta": text}
        if kind is r.OutputMessage:
            event["logprobs"] = []
        return events + [event]

    def call(self, call_id: str, name: str, freeform: bool = False) -> list[dict[str, Any]]:
        events = self.close("completed")
        self._freeform = freeform
        if freeform or name in self.custom:
            self._open = r.CustomToolCallOut(id=new_id("ctc"), call_id=call_id, name=name,
                                             input="")
        else:
            self._open = r.FunctionCallOut(id=new_id("fc"), call_id=call_id, name=name,
                                           arguments="", status="in_progress")
        return events + [self._added()]

    def arguments(self, text: str) -> list[dict[str, Any]]:
        """The open call's next piece: a custom tool's input (when it is the whole reply), or a
        function's argument text. A custom tool called as a function ({"input": ...}) gets its
        input whole when the call ends."""
        self._text += text
        item = self._open
        if isinstance(item, r.FunctionCallOut):
            return [{"type": "response.function_call_arguments.delta", "item_id": item.id,
                     "output_index": self._index(), "delta": text}]
        if isinstance(item, r.CustomToolCallOut) and self._freeform:
            return [{"type": "response.custom_tool_call_input.delta", "item_id": item.id,
                     "output_index": self._index(), "delta": text}]
        return []

    def _added(self) -> dict[str, Any]:
        assert self._open is not None
        return {"type": "response.output_item.added", "output_index": self._index(),
                "item": self._open.model_dump()}

    def close(self, status: r.Status) -> list[dict[str, Any]]:
        item, text, index, freeform = self._open, self._text, self._index(), self._freeform
        if item is None:
            return []
        self._open, self._text = None, ""
        events: list[dict[str, Any]] = []
        done: r.OutputItem
        if isinstance(item, r.OutputMessage):
            part = r.OutputText(text=text)
            done = item.model_copy(update={"status": status, "content": [part]})
            events += [{"type": "response.output_text.done", "item_id": item.id,
                        "output_index": index, "content_index": 0, "text": text, "logprobs": []},
                       {"type": "response.content_part.done", "item_id": item.id,
                        "output_index": index, "content_index": 0, "part": part.model_dump()}]
        elif isinstance(item, r.ReasoningOut):
            done = item.model_copy(update={"status": status,
                                           "content": [r.ReasoningText(text=text)]})
            events.append({"type": "response.reasoning_text.done", "item_id": item.id,
                           "output_index": index, "content_index": 0, "text": text})
        elif isinstance(item, r.FunctionCallOut):
            done = item.model_copy(update={"status": status, "arguments": text})
            events.append({"type": "response.function_call_arguments.done", "item_id": item.id,
                           "output_index": index, "name": item.name, "arguments": text})
        else:
            assert isinstance(item, r.CustomToolCallOut)
            value = text if freeform else _custom_input(text)
            done = item.model_copy(update={"input": value})
            if not freeform and value:
                events.append({"type": "response.custom_tool_call_input.delta",
                               "item_id": item.id, "output_index": index, "delta": value})
            events.append({"type": "response.custom_tool_call_input.done", "item_id": item.id,
                           "output_index": index, "input": value})
        self.items.append(done)
        return events + [{"type": "response.output_item.done", "output_index": index,
                          "item": done.model_dump()}]


def _custom_input(arguments: str) -> str:
    """A custom tool called as a function: its {"input": ...} argument."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:  # cut short by max_output_tokens
        return ""
    return value.get("input", "") if isinstance(value, dict) else ""


# --------------------------------------------------------------------------------- the wire

class ResponsesWire:
    """POST /v1/responses for one request (see the module docstring)."""

    framing = RESPONSES_SSE

    def __init__(self, store: ResponseStore, turn: Turn, req: r.ResponsesRequest) -> None:
        self.store = store
        self.turn = turn
        self.req = req
        self.sequence = 0

    async def plan(self, model: GenerativeModel, lease: Lease, req: r.ResponsesRequest,
                   limits: LimitSettings) -> ResponsesPlan:
        check_reasoning(req, model)
        chat = openai_wire.with_defaults(self.turn.chat, lease, model)
        plan = await serving.plan_chat(model, chat, limits, image_params=self.turn.image_params,
                                       input_grammars=self.turn.input_grammars)
        freeform = self.turn.freeform
        if freeform is not None:  # the whole reply is the tool's input, exactly its grammar
            plan.output = Output(grammar=None, param=freeform.param) if freeform.grammar is None \
                else Output(grammar=_lark(freeform.grammar, freeform.param), param=freeform.param)
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
        return ResponsesPlan(**fields, response_id=new_id("resp"), created_at=p.now())

    # -- whole ----------------------------------------------------------------------------------
    def whole(self, model: GenerativeModel, alias: str, req: r.ResponsesRequest,
              plan: ResponsesPlan, results: list[ChoiceResult]) -> r.Response:
        result = results[0]
        builder = OutputBuilder(self.turn.custom)
        reader = plan.reader()
        if self.turn.freeform is not None:
            builder.call(new_call_id(), self.turn.freeform.name, freeform=True)
            builder.arguments(result.text)
            builder.close(_status(result))
        elif reader is None:
            builder.message(result.text)
        else:
            reader.push(result.text)
            reader.finish()
            self._read(builder, reader.message())
        builder.close(_status(result))
        return self._finished(model, alias, plan, result, builder.items)

    def _read(self, builder: OutputBuilder, message: Any) -> None:
        if message.reasoning_content:
            builder.reasoning(message.reasoning_content)
        if message.content:
            builder.message(message.content)
        for call in message.tool_calls or []:
            builder.call(call.id, call.function.name)
            builder.arguments(call.function.arguments)

    def _finished(self, model: GenerativeModel, alias: str, plan: ResponsesPlan,
                  result: ChoiceResult, items: list[r.OutputItem]) -> r.Response:
        reasoning = sum(len(model.tokenizer.encode(c.text)) for item in items
                        if isinstance(item, r.ReasoningOut) for c in item.content)
        usage = r.ResponseUsage(
            input_tokens=plan.prompt_tokens,
            input_tokens_details=r.InputTokensDetails(cached_tokens=result.cached_tokens),
            output_tokens=result.completion_tokens,
            output_tokens_details=r.OutputTokensDetails(reasoning_tokens=min(
                reasoning, result.completion_tokens)),
            total_tokens=plan.prompt_tokens + result.completion_tokens)
        response = self._response(alias, plan, _status(result), items, usage)
        if self.req.store:
            self.store.put(response.id, self.turn.items + [
                i.model_dump(mode="json") for i in items])
        return response

    def _response(self, alias: str, plan: ResponsesPlan, status: r.Status,
                  items: list[r.OutputItem], usage: r.ResponseUsage | None) -> r.Response:
        req = self.req
        incomplete = r.IncompleteDetails(reason="max_output_tokens") if status == "incomplete" \
            else None
        choice = req.tool_choice
        return r.Response(
            id=plan.response_id, created_at=plan.created_at, status=status,
            incomplete_details=incomplete, instructions=req.instructions,
            max_output_tokens=req.max_output_tokens, model=alias, output=items,
            parallel_tool_calls=req.parallel_tool_calls,
            previous_response_id=req.previous_response_id,
            reasoning=req.reasoning.model_dump() if req.reasoning else {"effort": None,
                                                                        "summary": None},
            store=req.store, temperature=req.temperature,
            text={"format": req.text.format.model_dump(by_alias=True)
                  if req.text and req.text.format else {"type": "text"}},
            tool_choice=choice.model_dump() if isinstance(choice, BaseModel) else choice or "auto",
            tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
            top_p=req.top_p, truncation=req.truncation or "disabled", usage=usage,
            metadata=req.metadata or {}, user=req.user)

    # -- stream ---------------------------------------------------------------------------------
    def _event(self, event: dict[str, Any]) -> dict[str, Any]:
        event["sequence_number"] = self.sequence
        self.sequence += 1
        return event

    async def chunks(self, model: GenerativeModel, alias: str, req: r.ResponsesRequest,
                     plan: ResponsesPlan) -> AsyncIterator[dict[str, Any]]:
        start = self._response(alias, plan, "in_progress", [], None).model_dump(mode="json")
        yield self._event({"type": "response.created", "response": start})
        yield self._event({"type": "response.in_progress", "response": start})
        builder = OutputBuilder(self.turn.custom)
        reader = plan.reader()
        freeform = self.turn.freeform
        if freeform is not None:
            for out in builder.call(new_call_id(), freeform.name, freeform=True):
                yield self._event(out)
        result = ChoiceResult()
        calls: list[str] = []  # call ids seen
        events = choice_events(plan.submitted)
        try:
            async for _, event in events:
                if isinstance(event, PromptProgress):
                    if req.return_progress:
                        yield self._event({"type": "response.in_progress", "response": start,
                                           "prompt_progress":
                                               llama_telemetry.prompt_progress(event)})
                    continue
                outs: list[dict[str, Any]] = []
                if isinstance(event, Finished):
                    result.finish(event)
                    pieces = reader.finish() if reader is not None else []
                elif reader is None:
                    pieces = []
                    outs = (builder.arguments(event.text) if freeform is not None
                            else builder.message(event.text))
                else:
                    pieces = reader.push(event.text)
                for delta in pieces:
                    outs += self._delta(builder, delta, calls)
                if outs and not isinstance(event, Finished) and event.timings is not None:
                    outs[-1]["timings"] = llama_telemetry.timings(event.timings)
                for out in outs:
                    yield self._event(out)
                if isinstance(event, Finished):
                    break
        finally:
            await events.aclose()
        for out in builder.close(_status(result)):
            yield self._event(out)
        response = self._finished(model, alias, plan, result, builder.items)
        llama_client = req.return_progress or req.timings_per_token
        kind = ("response.completed" if response.status == "completed" or llama_client
                else "response.incomplete")
        closing = {"type": kind, "response": response.model_dump(mode="json")}
        if req.timings_per_token and result.finished is not None:
            closing["timings"] = llama_telemetry.timings(result.finished.timings)
        yield self._event(closing)

    def _delta(self, builder: OutputBuilder, delta: Any, calls: list[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if delta.reasoning_content:
            out += builder.reasoning(delta.reasoning_content)
        if delta.content:
            out += builder.message(delta.content)
        for call in delta.tool_calls or []:
            if call.id is not None and call.id not in calls:
                calls.append(call.id)
                out += builder.call(call.id, call.function.name if call.function else "")
            if call.function is not None and call.function.arguments:
                out += builder.arguments(call.function.arguments)
        return out

    def error(self, error: APIError) -> dict[str, Any]:
        return self._event({"type": "error", "code": error.code or error.type,
                            "message": error.message, "param": error.param})


def _status(result: ChoiceResult) -> r.Status:
    return "incomplete" if result.finish_reason == "length" else "completed"


def _lark(text: str, param: str) -> str:
    try:
        return lark_grammar(text)
    except ValueError as exc:
        raise invalid_request(f"'{param}' is not a grammar llguidance reads: "
                              f"{' '.join(str(exc).split())}", param) from None
