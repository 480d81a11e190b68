"""`reraise_cancellation`: end a cancelled loop even when an await swallowed the cancellation.

On Python 3.11, `asyncio.wait_for` returns the result of an awaitable that completed just as its
caller was cancelled, and the cancellation is lost (the task still counts it: `cancelling()`).
Drivers await their writes that way (redis-py sends every command under `wait_for`), so a loop of
commands that is cancelled then, at shutdown, runs on, and whoever waits for it waits forever.
Every such loop calls `reraise_cancellation()` after its awaits, and ends.
"""

from __future__ import annotations

import asyncio


def reraise_cancellation() -> None:
    """Raise `CancelledError` if the current task was cancelled and carries on all the same."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
