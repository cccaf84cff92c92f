"""What the gateway needs from a loaded model: the one seam between serving and the engine.

    LoadedModel      facts (context, slots, vocabulary, memory), the tokenizer, the forward pass
                     over KV-cache slots, the file check and close()
      .tokenizer     ModelTokenizer: ids <-> text, special tokens, incremental decoding
      .transformer   Forward: forward(chunks) over a SlotCache (the position keys each slot holds)

engine.Model meets it (mypy checks that below); so does the scripted stand-in the scheduler
tests use (tests/support/scripted_model.py). engine/batch.py's BatchRunner, gateway/scheduler.py's
Scheduler and ServedModel and the registry's loader (load_served_model) take or return a
LoadedModel and nothing else of the engine's model, so a different engine, or a fake, only has
to meet this protocol. The protocols are runtime_checkable so a test can check a fake has every
member (isinstance checks presence, not signatures; mypy checks those where it sees the type).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .api import Model
    from .model import Chunk
    from .prompt import PositionKey


class TokenDecoder(Protocol):
    """Token ids in, text out as soon as it is whole UTF-8 (a stream's deltas)."""

    def push(self, id: int) -> str: ...

    def flush(self) -> str: ...


@runtime_checkable
class ModelTokenizer(Protocol):
    @property
    def n_vocab(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def sep_id(self) -> int | None: ...

    @property
    def add_eos(self) -> bool: ...            # the model wants EOS after a text (add_special)

    @property
    def add_sep(self) -> bool: ...            # a separator between a rerank pair's parts

    @property
    def eos_id(self) -> int | None: ...

    @property
    def add_bos(self) -> bool: ...            # the model wants BOS before a prompt

    @property
    def eog_ids(self) -> frozenset[int]: ...  # every token that ends a generation

    def encode(self, text: str, add_special: bool = False,
               parse_special: bool = False) -> list[int]: ...

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str: ...

    def token_bytes(self, id: int) -> bytes: ...

    def token_id(self, text: str) -> int | None: ...

    def is_special(self, id: int) -> bool: ...

    def incremental_decoder(self, skip_special: bool = False) -> TokenDecoder: ...


class SlotCache(Protocol):
    """The KV cache as the batch runner sees it: the key of every position each slot holds
    (engine.prompt: a token's id, an embedding row's (span key, index))."""

    tokens: list[list[PositionKey]]           # [n_slots][held]: the runner trims these

    def reusable(self, slot: int, n: int) -> int: ...  # of the first n held, how many go on

    def copy_prefix(self, src: int, dst: int, n: int) -> None: ...

    def truncate(self, slot: int, n: int) -> None: ...  # roll back to n (RollbackError)


class Forward(Protocol):
    @property
    def cache(self) -> SlotCache: ...

    def forward(self, chunks: list[Chunk], output: str = "last") -> list[np.ndarray]: ...


@runtime_checkable
class LoadedModel(Protocol):
    @property
    def path(self) -> Path | None: ...        # the weights file (None: not from a file)

    @property
    def metadata(self) -> Mapping[str, Any]: ...  # the GGUF's key-value metadata

    @property
    def n_ctx(self) -> int: ...               # per slot

    @property
    def n_slots(self) -> int: ...             # sequences that run at once

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_embd(self) -> int: ...              # an embedding's length

    @property
    def memory_bytes(self) -> int: ...        # the most it holds resident

    @property
    def mapped_bytes(self) -> int: ...        # of that, the file mapping other loads share

    @property
    def tokenizer(self) -> ModelTokenizer: ...

    @property
    def transformer(self) -> Forward: ...

    @property
    def is_encoder(self) -> bool: ...         # bidirectional: a chunk is a whole text

    @property
    def pooling(self) -> str: ...             # engine.pooling's kind (rank: a reranker)

    @property
    def role(self) -> str: ...                # generation, embedding or rerank

    def pool(self, hidden: np.ndarray) -> np.ndarray: ...  # one text's hidden states, pooled

    def file_changed(self) -> str | None: ...  # why the file is no longer what is mapped

    def close(self) -> None: ...


if TYPE_CHECKING:
    def _engine_model_meets_the_protocol(model: Model) -> LoadedModel:
        return model
