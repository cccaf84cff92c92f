"""A reply that may hold tool calls, as OpenAI's stream deltas and as the whole message.

`ReplyReader` keeps the text generated so far and re-reads it with the family's reader
(engine/tool_formats.py) after each piece. The reader returns only what can no longer change,
so each read extends the last one and the deltas are the differences: new content, new
reasoning, and for each call, once its text is complete, its first delta (index, id, type,
name, arguments "") and then its arguments. Text that might be the start of a marker is held
back by the reader, so marker text never reaches `content`. `finish()` reads the text as final;
the deltas then add up to exactly the message `message()` gives.

A call is passed on only when complete: a reply cut by the token limit mid-call would otherwise
hand the client arguments that are not JSON, and streamed pieces cannot be taken back. The cut
call is dropped; the finish reason (`length`) says why.

The reasoning settings (gateway/generation/reasoning.py) say how a <think> block is read: from
the first token when the prompt opened it (`inside`), and returned as reasoning_content
("deepseek"), left in content ("none", read by the format with thinking switched off), or both
("deepseek-legacy"); `also_reasoning` repeats reasoning_content as `reasoning`.
"""
from __future__ import annotations

import copy
import uuid
from itertools import takewhile

from engine.tool_formats import THINK_OPEN, Reply, ToolFormat
from gateway import protocol as p
from gateway.protocol.tools import FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ReplyReader:
    def __init__(self, fmt: ToolFormat, inside: bool = False, reasoning_format: str = "deepseek",
                 also_reasoning: bool = False) -> None:
        self.fmt = fmt
        self._opened = THINK_OPEN if inside else ""  # what the prompt wrote of the reply
        self._raw: ToolFormat | None = None          # reads the block as content
        if reasoning_format != "deepseek" and fmt.thinking:
            self._raw = copy.copy(fmt)
            self._raw.thinking = False
        self._keeps_reasoning = reasoning_format != "none"
        self._also_reasoning = also_reasoning
        self.text = ""
        self.reply = Reply()
        self.ids: list[str] = []
        self._sent_content = 0
        self._sent_reasoning = 0
        self._sent_args: list[int] = []

    def push(self, piece: str) -> list[p.ChoiceDelta]:
        self.text += piece
        return self._deltas(self._read(final=False))

    def finish(self) -> list[p.ChoiceDelta]:
        return self._deltas(self._read(final=True))

    def _read(self, final: bool) -> Reply:
        reply = self.fmt.read(self._opened + self.text, final)
        if self._raw is None:
            return reply
        # legacy content shows the whole block; "none" content is what the model wrote
        raw = self._raw.read((self._opened if self._keeps_reasoning else "") + self.text, final)
        return Reply(content=raw.content, calls=raw.calls,
                     reasoning=reply.reasoning if self._keeps_reasoning else "")

    @property
    def has_calls(self) -> bool:
        return bool(self.reply.calls)

    def _deltas(self, reply: Reply) -> list[p.ChoiceDelta]:
        reply.calls = list(takewhile(lambda call: call.complete, reply.calls))
        self.reply = reply
        out: list[p.ChoiceDelta] = []
        if len(reply.reasoning) > self._sent_reasoning:
            more = reply.reasoning[self._sent_reasoning:]
            out.append(p.ChoiceDelta(reasoning_content=more,
                                     reasoning=more if self._also_reasoning else None))
            self._sent_reasoning = len(reply.reasoning)
        if len(reply.content) > self._sent_content:
            out.append(p.ChoiceDelta(content=reply.content[self._sent_content:]))
            self._sent_content = len(reply.content)
        calls: list[ToolCallDelta] = []
        for index, call in enumerate(reply.calls):
            if index == len(self.ids):
                self.ids.append(new_call_id())
                self._sent_args.append(0)
                calls.append(ToolCallDelta(index=index, id=self.ids[index], type="function",
                                           function=FunctionCallDelta(name=call.name,
                                                                      arguments="")))
            if len(call.arguments) > self._sent_args[index]:
                calls.append(ToolCallDelta(index=index, function=FunctionCallDelta(
                    arguments=call.arguments[self._sent_args[index]:])))
                self._sent_args[index] = len(call.arguments)
        if calls:
            out.append(p.ChoiceDelta(tool_calls=calls))
        return out

    def message(self) -> p.AssistantMessage:
        """The whole message (after finish())."""
        reply = self.reply
        while len(self.ids) < len(reply.calls):
            self.ids.append(new_call_id())
        calls = [ToolCall(id=self.ids[i], function=FunctionCall(name=c.name, arguments=c.arguments))
                 for i, c in enumerate(reply.calls)]
        content = reply.content if (reply.content or not calls) else None
        reasoning = reply.reasoning or None
        return p.AssistantMessage(content=content, tool_calls=calls or None,
                                  reasoning_content=reasoning,
                                  reasoning=reasoning if self._also_reasoning else None)


def finish_reason(reason: str, reader: ReplyReader | None) -> str:
    """OpenAI's finish_reason: "tool_calls" when a reply that ended by itself holds calls."""
    return "tool_calls" if reason == "stop" and reader is not None and reader.has_calls else reason
