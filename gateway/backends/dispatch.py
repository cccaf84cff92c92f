"""The routes' backend seam: an alias goes to the local path as before, or to its pool.

Without upstream entries nothing changes: the route's local handler gets the body at once. With
them, the body's `model` is read (only that field) to find the pool; the body itself is handed
on untouched. Model lists get one card per upstream alias, configured or discovered.
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable

from starlette.requests import Request
from starlette.responses import Response

from gateway import protocol as p
from gateway.backends.base import Call, LocalHandler
from gateway.backends.upstreams import UpstreamRow
from gateway.fleet.router import Router
from gateway.http import auth
from gateway.state import app_state


async def serve(request: Request, endpoint: str, local: LocalHandler, *,
                at_root: bool = False) -> Response:
    """`endpoint` is under the servers' base URL (OpenAI's /v1), or with `at_root` under their
    root (llama.cpp's /completion)."""
    router = app_state(request.app).router
    body = await request.body()
    if not router.upstreams.configured():
        return await local(request, body, None, None)
    pool = router.route(_model_of(body))
    if pool is None:
        return await local(request, body, None, None)
    auth.check_named(request, pool.alias)
    request.state.model = pool.alias  # a configured or discovered alias: a bounded label
    call = Call(request=request, endpoint=endpoint, body=body, alias=pool.alias, local=local,
                at_root=at_root)
    return await pool.serve(call, wait=router.config.registry.load_timeout)


def forwarding(endpoint: str, handler: Callable[[Request], Awaitable[Response]],
               at_root: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """`handler` (a route that reads its own body) behind the seam: an upstream alias's
    request goes to its server's `endpoint` as received."""
    async def local(request: Request, body: bytes, entry: str | None, shown: str | None
                    ) -> Response:
        return await handler(request)

    async def route(request: Request) -> Response:
        return await serve(request, endpoint, local, at_root=at_root)

    return route


def _model_of(body: bytes) -> str | None:
    """The body's `model`, if it is a JSON object naming one (else the local path's parser
    gives the proper 400, or the default alias is meant)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


def upstream_cards(router: Router, created: int,
                   visible: Iterable[str] | None) -> list[p.ModelCard]:
    """Cards of the aliases served upstream: configured ones, then discovered ones."""
    wanted = None if visible is None else set(visible)
    rows = router.upstream_rows()
    aliases = [a for e in router.config.upstreams for a in e.aliases]
    aliases += [a for a in router.discovered_aliases()
                if a not in aliases and not router.config.is_local(a, exact=True)]
    return [p.ModelCard(id=alias, created=created, owned_by=_owners(rows, alias))
            for alias in aliases if wanted is None or alias in wanted]


def _owners(rows: list[UpstreamRow], alias: str) -> str:
    names = [r["name"] for r in rows if alias in r["aliases"] or alias in r["discovered"]]
    return "upstream " + ", ".join(names) if names else "modelyard"
