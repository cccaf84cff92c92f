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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from engine.model import Chunk, ContextOverflowError
from engine.pooling import normalize, pool
from engine.prompt import PositionKey

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
    """Tokens 1..26 are the letters a..z; every other id is a control token, written "<id>"."""

    n_vocab = N_VOCAB
    bos_id: int | None = None
    eos_id: int | None = 0
    add_bos = False
    sep_id: int | None = None
    add_eos = False
    add_sep = False
    eog_ids = frozenset({0})

    def token_bytes(self, token: int) -> bytes:
        return chr(ord("a") + token - 1).encode() if 1 <= token <= 26 else f"<{token}>".encode()

    def is_special(self, token: int) -> bool:
        return not 1 <= token <= 26

    def token_id(self, text: str) -> int | None:
        return next((t for t in range(N_VOCAB) if self.token_bytes(t) == text.encode()), None)

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        if any(not "a" <= c <= "z" for c in text):
            raise ValueError(f"the scripted vocabulary has only the letters a..z: {text!r}")
        return letters(text)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return "".join(self.token_bytes(t).decode() for t in ids
                       if not (skip_special and self.is_special(t)))

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
        self.tokens: list[list[PositionKey]] = [[] for _ in range(n_slots)]
        self.copies: list[tuple[int, int, int]] = []   # (src, dst, n)

    def reusable(self, slot: int, n: int) -> int:
        return n  # no sliding-window rings here: every held prefix can be continued

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        assert n <= len(self.tokens[src])
        self.copies.append((src, dst, n))
        self.tokens[dst] = self.tokens[src][:n]

    def truncate(self, slot: int, n: int) -> None:
        assert n <= len(self.tokens[slot])
        del self.tokens[slot][n:]


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
            if not len(c):
                raise ValueError("empty chunk")
            if c.pos0 + len(c) > cache.n_ctx:
                raise ContextOverflowError(c.pos0 + len(c), cache.n_ctx)
            if c.pos0 > len(cache.tokens[c.slot]):
                raise ValueError(f"slot {c.slot} holds {len(cache.tokens[c.slot])}; "
                                 f"cannot append at {c.pos0}")
            if FAIL in c.prompt.token_ids():
                raise RuntimeError("scripted failure")
        self.calls.append(Call(output, [(c.slot, list(c.prompt.token_ids()), c.pos0) for c in chunks]))
        out = []
        for c in chunks:
            # a scripted prompt is all tokens: every key is a token id
            held = cast(list[int], cache.tokens[c.slot][:c.pos0]) + c.prompt.token_ids()
            cache.tokens[c.slot] = [*held]
            if output == "hidden":
                out.append(np.repeat(np.array(c.prompt.token_ids(), np.float32)[:, None], N_EMBD,
                                     axis=1))
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
    """engine.loaded.LoadedModel, as BatchRunner and the scheduler use it, without a file."""

    n_vocab = N_VOCAB
    n_embd = N_EMBD
    n_threads = 1
    path: Path | None = None
    memory_bytes = 0
    mapped_bytes = 0
    is_encoder = False
    pooling = "mean"
    role = "generation"

    def __init__(self, n_slots: int = 2, n_ctx: int = 64, gate: threading.Semaphore | None = None) -> None:
        self.n_slots = n_slots
        self.n_ctx = n_ctx
        self.metadata: dict[str, Any] = {}
        self.tokenizer = ScriptedTokenizer()
        self.transformer = ScriptedTransformer(n_slots, n_ctx, gate)

    @property
    def calls(self) -> list[Call]:
        return self.transformer.calls

    def file_changed(self) -> str | None:
        return None

    def pool(self, hidden: Any) -> Any:
        return normalize(pool(hidden, "mean"))  # what its scheduler tests expect: unit vectors

    def close(self) -> None:
        pass


if TYPE_CHECKING:
    from engine.loaded import LoadedModel

    def _meets_the_protocol(model: ScriptedModel) -> LoadedModel:
        return model  # mypy (pyproject.toml) checks the stand-in against engine/loaded.py
