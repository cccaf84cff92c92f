"""A stand-in for engine.Model whose "forward pass" follows a script written into the prompt.

A prompt is `script + [SEP]`; the model then generates the script's tokens one by one and then
0 (end of generation). The script starts after the last START before SEP, if there is one, so a
conversation can go on: [START, s1.., SEP, generated.., START, s2.., SEP] generates s2. Tokens
1..26 read as the letters a..z. A chunk containing FAIL makes the forward pass raise. Everything
the batch runner relies on is real in shape: slots with token lists, copy_prefix, positions
checked like the engine checks them; every call is recorded.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from engine.model import Chunk, ContextOverflowError

SEP = 99
FAIL = 98
START = 97
N_VOCAB = 100
N_EMBD = 4


def script(tokens: list[int]) -> list[int]:
    """The prompt that makes the model generate `tokens` (then stop)."""
    return list(tokens) + [SEP]


def letters(text: str) -> list[int]:
    return [ord(c) - ord("a") + 1 for c in text]


class ScriptedTokenizer:
    eog_ids = frozenset({0})

    def token_bytes(self, token: int) -> bytes:
        return chr(ord("a") + token - 1).encode() if 1 <= token <= 26 else f"<{token}>".encode()

    def incremental_decoder(self, skip_special: bool = False) -> _Decoder:
        return _Decoder(self)


class _Decoder:
    def __init__(self, tok: ScriptedTokenizer) -> None:
        self.tok = tok

    def push(self, token: int) -> str:
        return self.tok.token_bytes(token).decode()

    def flush(self) -> str:
        return ""


class ScriptedCache:
    def __init__(self, n_slots: int, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        self.copies: list[tuple[int, int, int]] = []   # (src, dst, n)

    def reusable(self, slot: int, n: int) -> int:
        return n  # no sliding-window rings here: every held prefix can be continued

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        assert n <= len(self.tokens[src])
        self.copies.append((src, dst, n))
        self.tokens[dst] = self.tokens[src][:n]


@dataclass
class Call:
    output: str
    chunks: list[tuple[int, list[int], int]]   # (slot, tokens, pos0)


class ScriptedTransformer:
    def __init__(self, n_slots: int, n_ctx: int, gate: threading.Semaphore | None) -> None:
        self.cache = ScriptedCache(n_slots, n_ctx)
        self.calls: list[Call] = []
        self.gate = gate   # acquired once per forward pass, when set

    def forward(self, chunks: list[Chunk], output: str = "last") -> list[np.ndarray]:
        if self.gate is not None:
            self.gate.acquire()
        cache = self.cache
        for c in chunks:
            if not c.tokens:
                raise ValueError("empty chunk")
            if c.pos0 + len(c.tokens) > cache.n_ctx:
                raise ContextOverflowError(c.pos0 + len(c.tokens), cache.n_ctx)
            if c.pos0 > len(cache.tokens[c.slot]):
                raise ValueError(f"slot {c.slot} holds {len(cache.tokens[c.slot])}; "
                                 f"cannot append at {c.pos0}")
            if FAIL in c.tokens:
                raise RuntimeError("scripted failure")
        self.calls.append(Call(output, [(c.slot, list(c.tokens), c.pos0) for c in chunks]))
        out = []
        for c in chunks:
            held = cache.tokens[c.slot][:c.pos0] + list(c.tokens)
            cache.tokens[c.slot] = held
            if output == "hidden":
                out.append(np.repeat(np.array(c.tokens, np.float32)[:, None], N_EMBD, axis=1))
                continue
            logits = np.full(N_VOCAB, -1e4, dtype=np.float32)  # [n_vocab]
            logits[self._next(held)] = 0.0
            out.append(logits)
        return out

    @staticmethod
    def _next(held: list[int]) -> int:
        if SEP not in held:
            return 0
        end = len(held) - 1 - held[::-1].index(SEP)
        done = len(held) - end - 1          # generated tokens evaluated after the prompt
        before = held[:end]
        start = len(before) - before[::-1].index(START) if START in before else 0
        todo = before[start:]
        return todo[done] if done < len(todo) else 0


class ScriptedModel:
    """Just what BatchRunner and the scheduler use of engine.Model."""

    n_vocab = N_VOCAB
    n_threads = 1

    def __init__(self, n_slots: int = 2, n_ctx: int = 64, gate: threading.Semaphore | None = None) -> None:
        self.n_slots = n_slots
        self.n_ctx = n_ctx
        self.tokenizer = ScriptedTokenizer()
        self.transformer = ScriptedTransformer(n_slots, n_ctx, gate)

    @property
    def calls(self) -> list[Call]:
        return self.transformer.calls
