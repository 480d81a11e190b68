"""`InProcessPromptKeys`: the `Idempotency-Key` records of the embedded backend.

One process serves every request, so the records live in its memory: bounded (the oldest go
first past `MAX_KEYS`), each for its `ttl`. A restart forgets them, as it forgets the finished
runs a resend would be answered with; PostgreSQL and Redis keep them in the shared store.
"""

from __future__ import annotations

import time
from collections import OrderedDict

MAX_KEYS = 10_000


class InProcessPromptKeys:
    """A `contracts.PromptKeys` in this process's memory (see the module docstring)."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._records: OrderedDict[str, tuple[str, float, tuple[str, str]]] = OrderedDict()

    async def claim(
        self, scope: str, record: str, ttl: float, *, path: str = "", conversation_id: str = ""
    ) -> str | None:
        now = time.monotonic()
        found = self._records.get(scope)
        if found is not None and found[1] > now:
            return found[0]
        self._records.pop(scope, None)
        self._records[scope] = (record, now + ttl, (path, conversation_id))
        while len(self._records) > self.max_keys:
            self._records.popitem(last=False)
        return None

    async def forget(self, path: str, conversation_id: str) -> None:
        conversation = (path, conversation_id)
        for scope in [s for s, found in self._records.items() if found[2] == conversation]:
            del self._records[scope]
