"""The asyncio tasks a trial spawns (replay, pollers, watchers), and the two ways it ends them:
cancel-and-await, and a race against events. Shared by the trial lifecycle and its replay phase, so
that nothing of a trial outlives it on any path.
"""

from __future__ import annotations

import asyncio
import contextlib


async def cancel(*tasks: asyncio.Future[object] | None) -> None:
    """Cancel and await: nothing of a trial outlives it, on any path."""
    pending = [t for t in tasks if t is not None]
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def race(coro: object, *events: asyncio.Event) -> str | None:
    """Run `coro` unless one of `events` is set first ("threshold": stopped early)."""
    task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait({task, *waits}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel(*waits)
        if not task.done():
            await cancel(task)
    if task.cancelled():
        return "threshold"
    return task.result()
