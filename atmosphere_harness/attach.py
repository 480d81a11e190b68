"""Attach engines: how each harness primitive completes an endpoint.

A primitive opens what it needs when the host starts (stores, buses), completes every endpoint
whose resolved features include it (tools, injectables, hooks, runtime truth), and closes on
shutdown. The host runs them in the order `default_primitives()` gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kernel.endpoint import HostedEndpoint
    from .kernel.host import HarnessHost


class Primitive:
    """Base class of an attach engine; override what the primitive needs."""

    name = "primitive"

    async def start(self, host: HarnessHost) -> None:
        """Open shared resources (called once, before any endpoint is attached)."""

    def attach(self, endpoint: HostedEndpoint, host: HarnessHost) -> None:
        """Complete one endpoint (called for every hosted endpoint, features already resolved)."""

    async def stop(self, host: HarnessHost) -> None:
        """Release what `start` opened (called in reverse order at shutdown)."""


def default_primitives() -> list[Primitive]:
    """The built-in primitives, in attach order."""
    from .delegation.primitive import DelegationPrimitive
    from .filesystem.primitive import FilesystemPrimitive
    from .governance.primitive import GovernancePrimitive
    from .memory.primitive import MemoryPrimitive
    from .planning import PlanningPrimitive

    return [
        MemoryPrimitive(),
        PlanningPrimitive(),
        FilesystemPrimitive(),
        GovernancePrimitive(),
        DelegationPrimitive(),
    ]
