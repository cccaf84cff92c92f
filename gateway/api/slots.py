"""llama.cpp server's slot actions: POST /slots/{id_slot}?action=save|restore|erase[&model=].

    save     {"filename": NAME} -> the slot's KV and position keys to slot_save_path/NAME
             -> {id_slot, filename, n_saved, n_written, timings: {save_ms}}
    restore  {"filename": NAME} -> the file's content into the slot (its fingerprint must be
             this model's and settings': engine/prompt_cache/slot_file.py)
             -> {id_slot, filename, n_restored, n_read, timings: {restore_ms}}
    erase    -> the slot forgets what it holds -> {id_slot, n_erased}

As llama-server (tools/server/server-context.cpp): without a folder (the entry's
`slot_save_path`, its --slot-save-path) the actions are refused (501); a filename is a bare
name inside that folder (a path separator, `..` or a character llama.cpp's fs_validate_filename
refuses is a 400 naming `filename`); a busy slot's action waits until the slot is free.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.api.pipeline import acquire
from gateway.errors import APIError, invalid_request
from gateway.generation.slot_files import SlotActionError, SlotBusyError, SlotFiles
from gateway.state import app_state

ACTIONS = ("save", "restore", "erase")
BUSY_POLL = 0.05      # seconds between tries while the slot is busy
BUSY_TIMEOUT = 300.0  # then a 503
NOT_SUPPORTED = ("This server does not support slots action. Set the model's `slot_save_path` "
                 "(llama-server's --slot-save-path)")
_REFUSED = set('/\\:*?"<>|')


def check_filename(name: Any) -> str:
    """A bare file name inside the slot folder, or a 400 naming `filename`."""
    if not isinstance(name, str) or not name:
        raise invalid_request("filename must be a non-empty string", "filename")
    if (len(name.encode()) > 255 or name in (".", "..") or ".." in name
            or any(c in _REFUSED or ord(c) < 32 or ord(c) == 127 for c in name)
            or name != name.strip() or name.endswith(".")):
        raise invalid_request("Invalid filename: a file name inside the slot folder, without "
                              "a path separator or '..'", "filename")
    return name


async def slot_action(request: Request) -> Response:
    state = app_state(request.app)
    alias = request.query_params.get("model")
    entry = state.config.resolve(alias)
    if entry.slot_save_path is None:
        raise APIError(501, NOT_SUPPORTED, type="not_supported_error")
    try:
        id_slot = int(request.path_params["id_slot"])
    except ValueError:
        raise invalid_request("Invalid slot ID", "id_slot") from None
    action = request.query_params.get("action")
    if action not in ACTIONS:
        raise invalid_request(f"Invalid action: one of {', '.join(ACTIONS)}", "action")
    if not 0 <= id_slot < entry.n_parallel:
        raise invalid_request(f"Invalid slot ID: 0..{entry.n_parallel - 1}", "id_slot")
    filename, path = None, None
    if action != "erase":
        try:
            body = json.loads(await request.body() or b"{}")
        except (ValueError, RecursionError):
            raise invalid_request("the body is not JSON (or nested too deep)") from None
        filename = check_filename(body.get("filename") if isinstance(body, dict) else None)
        path = Path(entry.slot_save_path) / filename
    lease, _ = await acquire(request, alias)
    try:
        model = lease.model
        if not isinstance(model, SlotFiles):
            raise APIError(501, "this model has no slots here", type="not_supported_error")
        started = time.perf_counter()
        deadline = started + BUSY_TIMEOUT
        while True:
            try:
                n, nbytes = await asyncio.to_thread(model.slot_file, action, id_slot, path)
                break
            except SlotBusyError:
                if time.perf_counter() > deadline:
                    raise APIError(503, f"slot {id_slot} stayed busy", type="unavailable_error") from None
                await asyncio.sleep(BUSY_POLL)
            except SlotActionError as exc:
                raise invalid_request(f"Unable to {action} slot: {exc}", "filename") from None
        ms = (time.perf_counter() - started) * 1000
    finally:
        state.registry.release(lease)
    if action == "erase":
        return JSONResponse({"id_slot": id_slot, "n_erased": n})
    if action == "save":
        return JSONResponse({"id_slot": id_slot, "filename": filename, "n_saved": n,
                             "n_written": nbytes, "timings": {"save_ms": ms}})
    return JSONResponse({"id_slot": id_slot, "filename": filename, "n_restored": n,
                         "n_read": nbytes, "timings": {"restore_ms": ms}})
