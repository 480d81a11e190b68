"""The echo agent most tests host: its `@prompt` hands the message to the harness loop.

`echo(agent(name="x"), "X", tools=[...])` is what a test used to spell as a five-line class; the
decorator (and so the kind, path, harness set and fleet) is the test's own, `name` is the class
name error messages show, and keyword arguments become class attributes (`tools`,
`interceptors`, `approval_policy`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atmosphere_harness import StreamingSession, prompt


def echo(decorate: Callable[[type], type], name: str = "Echo", **attributes: Any) -> type:
    """A fresh class named `name` whose prompt streams the message, decorated by `decorate`."""

    class EchoAgent:
        @prompt
        async def chat(self, message: str, session: StreamingSession) -> None:
            await session.stream(message)

    EchoAgent.__name__ = EchoAgent.__qualname__ = name
    for attribute, value in attributes.items():
        setattr(EchoAgent, attribute, value)
    return decorate(EchoAgent)
