"""Waiting, bounded: for a load, for any change of the registry, for a memory estimate.

Each wait gives up at its deadline without cancelling what it waits for (a request that gives up
must not cancel a load others wait for) and says why as RegistryBusyError (503).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.config import ModelEntry
from gateway.fleet.registry.errors import RegistryBusyError
from gateway.fleet.registry.slots import Estimator, Slot
from gateway.units import format_duration

log = logging.getLogger("modelyard.registry")

LOAD_PROGRESS_SECONDS = 5.0  # while a load runs, the log says so this often


async def wait_task(task: asyncio.Task[Any], timeout: float) -> None:
    """Wait for `task` at most `timeout` seconds without cancelling it."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, timeout)):
            await asyncio.shield(task)


async def log_progress(name: str, started: float) -> None:
    """While a load runs, say every few seconds that it still does (cancelled when it ends)."""
    while True:
        await asyncio.sleep(LOAD_PROGRESS_SECONDS)
        log.info("still loading %s (%.0fs so far)", name, time.monotonic() - started)


async def wait_event(event: asyncio.Event, timeout: float | None) -> None:
    """Wait for `event` at most `timeout` seconds. (Not asyncio.wait_for: on Python 3.11 it can
    swallow a cancellation that races with the event, and a cancelled request must stop.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


async def wait_until(done: Callable[[], bool], changed: Callable[[], asyncio.Event],
                     timeout: float) -> bool:
    """Wait at most `timeout` seconds until `done()` holds, asking again whenever the event
    `changed()` returns (the registry's current one) is set; whether it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        await wait_event(changed(), remaining)
    return True


async def wait_for_load(slot: Slot, task: asyncio.Task[str | None], deadline: float,
                        load_timeout: float) -> str | None:
    """The load's result (None, or why it failed); RegistryBusyError at the deadline."""
    remaining = deadline - asyncio.get_running_loop().time()
    try:
        if remaining <= 0:
            raise TimeoutError
        # shield: a request giving up (timeout, client gone) must not cancel the load
        async with asyncio.timeout(remaining):
            return await asyncio.shield(task)
    except TimeoutError:
        raise RegistryBusyError(
            f"{slot.entry.name} is still loading after load_timeout "
            f"({format_duration(load_timeout)})") from None


async def wait_for_change(changed: asyncio.Event, deadline: float, why: str,
                          load_timeout: float) -> None:
    """Sleep until `changed` is set; RegistryBusyError once the deadline has passed."""
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        raise RegistryBusyError(f"{why} (waited load_timeout, {format_duration(load_timeout)})")
    await wait_event(changed, remaining)


async def estimate_memory(estimator: Estimator, entry: ModelEntry) -> int | str:
    """Bytes a load will take, or why the file cannot be served (engine.ModelLoadError)."""
    from engine.gguf import ModelLoadError

    try:
        return int(await asyncio.to_thread(estimator, entry))
    except ModelLoadError as e:
        return e.problem
    except Exception as e:  # noqa: BLE001 - the load itself will report what is wrong
        log.warning("cannot estimate the memory of %s (%s); counting 0 bytes until loaded",
                    entry.name, e)
        return 0
