"""`PlanningPrimitive`: the attach engine that gives a PLANNING endpoint its plan surface.

For every endpoint whose resolved features include PLANNING it:

1. creates the owner's `FilePlanStore` on `endpoint.root`, makes `PlanStore` injectable, shares it
   in `endpoint.services` and registers the exact instance for the admin API;
2. picks one plan surface by the `planning` setting (never both, so the model never sees two
   plan tools):

   | mode | runtime declares PLANNING | runtime does not |
   |---|---|---|
   | auto | native: `ACTIVE(native:<runtime>)` | built-in `write_todos` |
   | builtin | built-in `write_todos` | built-in `write_todos` |
   | native | native: `ACTIVE(native:<runtime>)` | nothing: `INACTIVE(native-unavailable)` + WARN |

   The built-in tool reports `ACTIVE(builtin)`, or `ACTIVE(user-tool)` when the endpoint already
   has a user tool named `write_todos` (the user's tool wins).

The plan event bus is app-wide: opened at start (unless one was passed in, e.g. a Redis-backed
bus) and closed at shutdown, which ends every live `plan/events` stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from .._contracts import Endpoint, Host, Key, Primitive
from .._harness import Harness
from .._log import get_logger
from .._preset import PLANNING
from .._runtimes.base import AiCapability, NativeSurfaceRuntime
from .._settings import SurfaceMode
from .._tools.base import as_tool
from .bus import InProcessPlanBus, PlanEventBus
from .store import FilePlanStore, PlanStore
from .tools import BUS_SERVICE, STORE_SERVICE, write_todos_tool

log = get_logger(__name__)

SURFACE: Key[PlanStore] = Key("plan")
"""The surface kind the admin API reads (`host.surface(SURFACE, owner)`)."""

BUILTIN = "ACTIVE(builtin)"
USER_TOOL = "ACTIVE(user-tool)"
NATIVE_UNAVAILABLE = "INACTIVE(native-unavailable)"


class PlanningPrimitive(Primitive):
    """Plan store + `write_todos` (or the runtime's native plan surface) + the plan event bus."""

    name = "planning"

    def __init__(
        self,
        bus: PlanEventBus | None = None,
        *,
        stores: Callable[[Path], PlanStore] | None = None,
    ) -> None:
        """`bus` and `stores` (an owner root -> its plan store) come from `backends`; the
        defaults are the embedded in-process bus and the JSON files under the owner's root."""
        self._given_bus = bus
        self._bus: PlanEventBus | None = None
        self._stores: Callable[[Path], PlanStore] = stores or FilePlanStore

    async def start(self, host: Host) -> None:
        self._bus = self._given_bus if self._given_bus is not None else InProcessPlanBus()
        host.services.set(BUS_SERVICE, self._bus)

    def attach(self, endpoint: Endpoint, host: Host) -> None:
        if not endpoint.has(Harness.PLANNING):
            return
        store = self._stores(endpoint.root)
        endpoint.services.set(STORE_SERVICE, store)
        if self._bus is not None:
            endpoint.services.set(BUS_SERVICE, self._bus)
        endpoint.provide(PlanStore, lambda run: store)
        host.register_surface(SURFACE, endpoint.owner, store)
        bus = self._bus

        async def forget(conversation_id: str, user_id: str | None) -> None:
            await store.forget(conversation_id)
            if bus is not None:
                await bus.forget(endpoint.owner, conversation_id)

        endpoint.forget_hooks.append(forget)
        endpoint.report(
            PLANNING, self._attach_surface(endpoint, host.settings.groups.planning.mode)
        )

    async def stop(self, host: Host) -> None:
        if self._bus is not None:
            await self._bus.aclose()
        host.services.pop(BUS_SERVICE)
        self._bus = None

    def _attach_surface(self, endpoint: Endpoint, mode: SurfaceMode) -> str:
        runtime = endpoint.runtime
        native = AiCapability.PLANNING in runtime.capabilities
        if mode is SurfaceMode.NATIVE and not native:
            log.warning(
                "planning=native but the runtime has no native plan surface; no plan tool is "
                "attached",
                endpoint=endpoint.path,
                runtime=runtime.name,
            )
            return NATIVE_UNAVAILABLE
        if native and mode is not SurfaceMode.BUILTIN:
            if isinstance(runtime, NativeSurfaceRuntime):
                for entry in runtime.native_tools(AiCapability.PLANNING):
                    tool = as_tool(entry)
                    if tool.origin == "user":
                        tool = dataclasses.replace(tool, origin=self.name)
                    endpoint.add_builtin_tool(tool)
            return f"ACTIVE(native:{runtime.name})"
        if endpoint.add_builtin_tool(write_todos_tool()):
            return BUILTIN
        return USER_TOOL
