"""Keeping an upstream's secrets out of what clients, logs and /admin see.

An upstream's answers are not ours: a server may echo the key it was sent in any field of its
error (`message`, `type`, `param`, `code`) or in a plain-text body. Every string taken from an
upstream passes `Masker.mask` before it is shown, and is truncated only after masking, so a cut
can never leave a key whole. A text that was already cut (an error body read up to its limit)
may end in the first characters of a key: `cut=True` masks such a tail too.
"""
from __future__ import annotations

from collections.abc import Iterable

from gateway.config.secrets import MASK, is_secret_header

MAX_FIELD = 500  # characters of one upstream error field passed on, after masking


def secret_header_values(headers: dict[str, str]) -> list[str]:
    """The values of the configured headers whose names say they carry a credential (an
    upstream may echo them too)."""
    return [value for name, value in headers.items() if is_secret_header(name)]


class Masker:
    """Replaces each of a server's secrets, wherever it appears, by ***."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # longest first: a secret that contains another is masked whole
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def mask(self, text: str, *, cut: bool = False) -> str:
        """`text` with every secret masked; with `cut`, also a secret's prefix ending it."""
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        if cut:
            text = self._mask_tail(text)
        return text

    def mask_field(self, text: str, *, cut: bool = False) -> str:
        """One upstream string field: masked, then truncated to MAX_FIELD characters."""
        text = self.mask(text, cut=cut)
        return text if len(text) <= MAX_FIELD else self._mask_tail(text[:MAX_FIELD])

    def _mask_tail(self, text: str) -> str:
        """A text cut mid-secret ends in that secret's first characters: mask them."""
        longest = 0
        for secret in self.secrets:
            for n in range(min(len(secret) - 1, len(text)), longest, -1):
                if text.endswith(secret[:n]):
                    longest = n
                    break
        return text[:len(text) - longest] + MASK if longest else text
