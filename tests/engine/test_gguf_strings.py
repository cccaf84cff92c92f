"""GGUF string arrays: the bulk decoder against decoding each string on its own, with Python's
own UTF-8 decoder (invalid bytes become U+FFFD) and with the cursor's one-string path."""
from __future__ import annotations

import struct

import pytest

from engine.gguf import ModelLoadError, _Cursor


def _array(strings: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(s)) + s for s in strings)


def _one_by_one(raw: bytes, count: int) -> list[str]:
    cur = _Cursor(memoryview(raw), "test")
    return [cur.string("s") for _ in range(count)]


@pytest.mark.parametrize("strings", [
    [b"hello", b"", "Ġthe".encode(), "日本".encode(), b"x" * 300],
    [b""] * 5,
    [b"a\x00b", b"plain"],                 # a NUL inside a string: the one-by-one path
    [b"ok", b"\xff\xfe broken", b"fine"],  # invalid UTF-8: replaced, string by string
    [],
])
def test_bulk_decoding_equals_one_by_one(strings: list[bytes]) -> None:
    raw = _array(strings) + b"tail"
    cur = _Cursor(memoryview(raw), "test")
    expected = [s.decode("utf-8", errors="replace") for s in strings]
    assert cur.strings(len(strings), "s") == _one_by_one(raw, len(strings)) == expected
    assert raw[cur.pos:] == b"tail"
    skipped = _Cursor(memoryview(raw), "test")
    assert len(skipped.strings(len(strings), "s", decode=False)) == len(strings)
    assert skipped.pos == cur.pos  # bounds walked, texts not decoded


def test_truncated_array_is_a_load_error() -> None:
    raw = _array([b"one", b"two", b"three"])
    for cut in (len(raw) - 2, len(raw) - 9, 5):
        for decode in (True, False):
            with pytest.raises(ModelLoadError, match="truncated header"):
                _Cursor(memoryview(raw[:cut]), "test").strings(3, "tokens", decode)
