"""A plan's submitted choices as they run: their events merged in arrival order, or collected
whole. Wire formats render from these (gateway/api/pipeline.py); nothing here knows one.

Leaving early, or an error in any choice, cancels every choice.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from gateway.generation.events import Event, Finished, TextDelta, TokenInfo
from gateway.generation.model import Generation


@dataclass
class ChoiceResult:
    """One choice, whole: its text, its tokens (with logprobs when asked) and how it ended."""
    text: str = ""
    tokens: list[TokenInfo] = field(default_factory=list)
    finish_reason: str = "length"
    completion_tokens: int = 0
    cached_tokens: int = 0
    finished: Finished | None = None  # the last event itself (timings, the stop word)

    def finish(self, event: Finished) -> None:
        self.finish_reason = event.finish_reason
        self.completion_tokens = event.completion_tokens
        self.cached_tokens = event.cached_tokens
        self.finished = event


async def choice_events(generations: Sequence[Generation]) -> AsyncGenerator[tuple[int, Event], None]:
    """Yield (choice index, event) as the submitted choices' events arrive. Leaving early, or an
    error in any choice, cancels all of them."""
    pumps: list[asyncio.Task[None]] = []
    merged: asyncio.Queue[tuple[int, Event | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        try:
            async for event in generation:
                merged.put_nowait((index, event))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            merged.put_nowait((index, exc))
        finally:
            merged.put_nowait((index, None))

    try:
        if len(generations) == 1:  # the usual case: no pump task, one loop round less per token
            async for only in generations[0]:
                yield 0, only
            return
        pumps = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(generations)]
        running = len(pumps)
        while running:
            index, event = await merged.get()
            if event is None:
                running -= 1
            elif isinstance(event, BaseException):
                raise event
            else:
                yield index, event
    finally:
        for pumping in pumps:
            pumping.cancel()
        for generation in generations:
            generation.cancel()



async def collect(generations: Sequence[Generation]) -> list[ChoiceResult]:
    """Every choice whole, in choice order, once the last one finished."""
    results = [ChoiceResult() for _ in generations]
    parts: list[list[str]] = [[] for _ in generations]
    async with contextlib.aclosing(choice_events(generations)) as events:
        async for index, event in events:
            result = results[index]
            if isinstance(event, TextDelta):
                parts[index].append(event.text)
                result.tokens.extend(event.tokens)
            elif isinstance(event, Finished):
                result.finish(event)
    for result, texts in zip(results, parts):
        result.text = "".join(texts)
    return results
