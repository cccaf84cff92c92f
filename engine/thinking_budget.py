"""A reasoning budget: after `limit` tokens inside a thinking block, its closing tag is forced.

    WAITING --(the reply opens the block)--> THINKING --(the model closes it)--> DONE
       |                                        |
       +--(the reply starts otherwise)--> DONE  +--(limit tokens)--> CLOSING --(tag forced)--> DONE

A sequence whose prompt already opened the block (Qwen3-Thinking-2507, newer R1 templates)
starts in THINKING. The rule sits beside the sampler rather than in a grammar: llguidance
cannot end a free-text lexeme at a closing tag that is several tokens long without
backtracking, and a forced token sequence is exact whatever the tokenizer makes of the tag.
A limit reached while the model is halfway through writing the tag forces only the rest of it.
One sequence's state, single-threaded like the sequence; `copy()` for each choice.
"""
from __future__ import annotations

import copy
import enum
from collections.abc import Callable

OPEN, CLOSE = b"<think>", b"</think>"


class Phase(enum.Enum):
    WAITING = "waiting"
    THINKING = "thinking"
    CLOSING = "closing"
    DONE = "done"


class ThinkingBudget:
    def __init__(self, limit: int, token_bytes: Callable[[int], bytes],
                 encode: Callable[[str], list[int]], inside: bool = False,
                 open_tag: bytes = OPEN, close_tag: bytes = CLOSE) -> None:
        self.limit = limit
        self._token_bytes = token_bytes
        self._encode = encode
        self._open, self._close = open_tag, close_tag
        self.phase = Phase.WAITING
        self.spent = 0                    # tokens generated inside the block
        self._text = b""                  # WAITING: the reply so far; THINKING: the block's tail
        self._forced: list[int] = []      # CLOSING: the tag's tokens still to come
        if inside:
            self._enter()

    def forced(self) -> int | None:
        """The token the next sample must be, if the budget decides it."""
        return self._forced[0] if self.phase is Phase.CLOSING else None

    def consume(self, token: int) -> None:
        """Advance by the token the sequence took."""
        piece = self._token_bytes(token)
        if self.phase is Phase.WAITING:
            self._text += piece
            reply = self._text.lstrip()
            if reply.startswith(self._open):
                self._text = reply[len(self._open):]
                self._enter()
                self._look_for_close()
            elif not self._open.startswith(reply):
                self.phase = Phase.DONE
        elif self.phase is Phase.THINKING:
            self.spent += 1
            self._text = (self._text + piece)[-4 * len(self._close):]
            self._look_for_close()
            if self.phase is Phase.THINKING and self.spent >= self.limit:
                self._start_closing()
        elif self.phase is Phase.CLOSING:
            self._forced.pop(0)
            if not self._forced:
                self.phase = Phase.DONE

    def copy(self) -> ThinkingBudget:
        twin = copy.copy(self)
        twin._forced = list(self._forced)
        return twin

    def _enter(self) -> None:
        self.phase = Phase.THINKING
        if self.limit <= 0:
            self._start_closing()

    def _look_for_close(self) -> None:
        if self._close in self._text:
            self.phase = Phase.DONE

    def _start_closing(self) -> None:
        """Force the part of the tag the block does not already end with."""
        done = next((n for n in range(len(self._close) - 1, 0, -1)
                     if self._text.endswith(self._close[:n])), 0)
        self._forced = self._encode(self._close[done:].decode())
        self.phase = Phase.CLOSING if self._forced else Phase.DONE
