"""Reading server-sent events from an httpx response, as a client reads them."""
from __future__ import annotations

from collections.abc import Iterator

import httpx


def sse_data(response: httpx.Response) -> Iterator[str]:
    """The `data:` payloads of an event stream. Only CR and LF end a line in SSE; generated text
    may hold U+2028 or U+0085 unescaped (valid JSON), which httpx's iter_lines would split at."""
    buffer = b""
    for piece in response.iter_bytes():
        buffer += piece
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            line = line.rstrip(b"\r")
            if line.startswith(b"data: "):
                yield line[6:].decode()
