"""Which config values are secrets, so that no problem message ever shows one.

A secret is a client key (`auth.keys.N.key`), the admin key, llama-cpp-python's top-level
`api_key`, an upstream's `api_key`, and an upstream header whose name says it is a credential
(Authorization, X-Api-Key, Cookie, ...). A value given there with the wrong type is still a
secret: pydantic's "(got ...)" would echo it into the 422 of a reload, /admin/status and the
log. Two defences: problems at a secret location never show their input (`is_secret_loc`), and
every rendered message has each secret value found in the file replaced (`mask_secrets`), for
the validators that quote a value elsewhere.
"""
from __future__ import annotations

from typing import Any

from gateway.config.problems import Loc

MASK = "***"
MIN_MASKED = 4  # shorter values would mask line numbers and words, not secrets
_SECRET_HEADER_WORDS = ("authorization", "cookie", "key", "token", "secret", "password")


def is_secret_header(name: str) -> bool:
    """Whether a header's name says its value is a credential."""
    return any(word in name.lower() for word in _SECRET_HEADER_WORDS)


def is_secret_loc(loc: Loc) -> bool:
    """Whether the value at `loc` (or a value containing it) is a secret."""
    parts = [p for p in loc if isinstance(p, str)]
    for n in range(1, len(parts) + 1):
        head = tuple(parts[:n])
        if head in (("auth", "admin_key"), ("auth", "keys", "key"), ("api_key",)):
            return True
        if head[0] == "models" and n >= 2 and head[-1] == "api_key":
            return True
        if head[0] == "models" and n >= 3 and head[-2] == "headers" and is_secret_header(head[-1]):
            return True
    return False


def secret_values(data: Any, loc: Loc = ()) -> set[str]:
    """Every scalar at a secret location of a config file's data, as text."""
    if isinstance(data, dict):
        return {s for k, v in data.items() for s in secret_values(v, loc + (str(k),))}
    if isinstance(data, list):
        return {s for i, v in enumerate(data) for s in secret_values(v, loc + (i,))}
    if data is None or isinstance(data, bool) or not is_secret_loc(loc):
        return set()
    text = str(data)
    return {text} if len(text) >= MIN_MASKED else set()


def mask_secrets(messages: list[str], secrets: set[str]) -> list[str]:
    """`messages` with every secret value replaced by ***, longest first."""
    ordered = sorted(secrets, key=len, reverse=True)
    out = []
    for message in messages:
        for secret in ordered:
            message = message.replace(secret, MASK)
        out.append(message)
    return out
