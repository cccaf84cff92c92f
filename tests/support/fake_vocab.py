"""A byte-level vocabulary with a few control tokens, for grammar tests that need no model."""
from __future__ import annotations


class ByteVocabulary:
    """Tokens 0-255 are the bytes; then EOS and the given control tokens, in order."""

    def __init__(self, specials: list[str]) -> None:
        self.texts = [bytes([b]) for b in range(256)] + [b"</s>"] + [s.encode() for s in specials]
        self.n_vocab = len(self.texts)
        self.eos_id = 256
        self.bos_id = None
        self.eog_ids = frozenset({256})
        self._special = {s: 257 + i for i, s in enumerate(specials)}

    def token_bytes(self, token: int) -> bytes:
        return self.texts[token]

    def is_special(self, token: int) -> bool:
        return token >= 256

    def special_id(self, text: str) -> int | None:
        return self._special.get(text)

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            for s, token in self._special.items():
                if parse_special and text.startswith(s, i):
                    out.append(token)
                    i += len(s)
                    break
            else:
                out.extend(text[i].encode())
                i += 1
        return out
