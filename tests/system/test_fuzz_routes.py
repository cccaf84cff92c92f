"""scripts/fuzz_routes.py: a short seeded run over the wave's routes finds no 5xx, and the run
does report a 5xx when a route answers one (a scripted app that fails on one route)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.apps import Apps

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_routes.py"


def fuzz_routes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_routes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_run_over_the_routes_finds_no_5xx() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "-n", "40", "--seed", "0"],
                         capture_output=True, text=True, timeout=600)
    assert "0 failures" in run.stdout, run.stdout[-4000:]
    assert run.returncode == 0


def test_a_route_that_answers_500_is_reported_with_its_request(apps: Apps) -> None:
    module = fuzz_routes()

    async def answer(request: Request) -> Response:
        await request.body()  # read it, as a real route does: an unread body closes the connection
        failing = request.url.path == "/api/generate"
        return JSONResponse({"error": "boom"}, status_code=500 if failing else 400)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    app = Starlette(routes=[Route("/health", health),
                            *(Route(path, answer, methods=["POST"]) for path in module.ROUTES)])
    server = apps.host(app, ready_path="/health")
    lines: list[str] = []
    failures = module.run(server.url, 40, 60.0, 0, say=lines.append)
    generated = sum(int(line.split()[-1]) for line in lines if line.startswith("/api/generate "))
    assert generated > 0
    assert len(failures) == generated
    assert all(f.startswith("#") and "POST /api/generate" in f and "-> 500: " in f for f in failures)
    assert any(line.split()[:2] == ["/api/generate", "500"] for line in lines)
