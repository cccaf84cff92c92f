"""Endpoint tables written as the module docstrings write them: {"GET /health": health}.

Each API module keeps its endpoints in one such table, so the table reads like the list at the
top of the module; `routes(table)` turns it into Starlette routes. A key may name several
methods ("GET HEAD /ui"); `prefixes` serves every path again under each prefix (OpenAI's /v1).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

Handler = Callable[[Request], Awaitable[Response]]
Table = Mapping[str, Handler]  # "METHOD [METHOD ...] /path" -> handler


def routes(table: Table, prefixes: Sequence[str] = ("",)) -> list[BaseRoute]:
    out: list[BaseRoute] = []
    for prefix in prefixes:
        for key, handler in table.items():
            *methods, path = key.split()
            out.append(Route(prefix + path, handler, methods=methods))
    return out
