"""Streaming decode: generated token ids in, text out as soon as its characters are complete."""
from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .vocab import Tokenizer


class IncrementalDecoder:
    """Streams generated text: feed token ids one by one, get back only complete characters.

        push(id) -> bytes of the token -> [UTF-8 decoder] -> the characters now complete
                                           holds back 0..3 bytes of an unfinished character
        flush()  -> the held-back bytes as U+FFFD (if any); the decoder is empty again

    The concatenation of all returned strings equals decode() of the same ids, except that no
    SentencePiece prefix space is removed: the ids continue a prompt, so their spaces are real.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:
        return self._utf8.decode(self._tokenizer.piece(id, self._skip_special))

    def flush(self) -> str:
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    @property
    def pending(self) -> bool:
        """True while an unfinished multi-byte character is held back."""
        return bool(self._utf8.getstate()[0])
