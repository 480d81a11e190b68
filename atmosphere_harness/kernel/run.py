"""One prompt run: its ids, its stream, its injectables, and how a `@prompt` method is called."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

from ..log import get_logger
from ..runtimes.base import Usage
from .session import FrameSink, StreamingSession

if TYPE_CHECKING:
    from .endpoint import HostedEndpoint
    from .host import HarnessHost

log = get_logger(__name__)
T = TypeVar("T")

_CONVERSATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CONVERSATION_ID_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""What `check_conversation_id` accepts, as one (ECMA-262) pattern for API documents."""


def new_conversation_id() -> str:
    return str(uuid.uuid4())


def check_conversation_id(value: str) -> str:
    """Conversation ids name directories on disk: 1-128 of `[A-Za-z0-9._-]`, no `..`."""
    if not isinstance(value, str) or not _CONVERSATION_ID.match(value) or ".." in value:
        raise ValueError(
            "conversationId must be 1-128 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit, no '..')"
        )
    return value


class RunContext:
    """Everything one prompt run shares between the loop, the tools and the primitives."""

    def __init__(
        self,
        *,
        host: HarnessHost | None,
        endpoint: HostedEndpoint,
        conversation_id: str,
        user_id: str | None,
        sink: FrameSink,
        parent: RunContext | None = None,
    ) -> None:
        self.host = host
        self.endpoint = endpoint
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.parent = parent
        self.session_id = uuid.uuid4().hex
        self.session = StreamingSession(self, sink)
        self.usage = Usage()
        self.state: dict[str, Any] = {}
        """Per-run scratch space for primitives (keys are the primitive's own names)."""
        self._resolved: dict[type, Any] = {StreamingSession: self.session}

    @property
    def root(self) -> RunContext:
        """The top-level run (the request) this run belongs to."""
        run = self
        while run.parent is not None:
            run = run.parent
        return run

    def resolve(self, kind: type[T]) -> T | None:
        """The injectable of type `kind` for this run, built once per run; `None` if absent."""
        if kind in self._resolved:
            value: T | None = self._resolved[kind]
            return value
        provider = self.endpoint.providers.get(kind)
        value = provider(self) if provider is not None else None
        self._resolved[kind] = value
        return value

    def add_usage(self, usage: Usage) -> None:
        self.usage = self.usage + usage
        if self.parent is not None:
            self.parent.add_usage(usage)


async def execute_prompt(
    host: HarnessHost,
    endpoint: HostedEndpoint,
    *,
    message: str,
    conversation_id: str,
    user_id: str | None,
    sink: FrameSink,
    parent: RunContext | None = None,
    state: dict[str, Any] | None = None,
) -> RunContext:
    """Call the endpoint's `@prompt` method for one message and finish its stream.

    The stream always ends with exactly one `complete` or `error` frame, whatever the method
    does; prompts of one conversation run one at a time. `parent` makes the run part of another
    (a fleet member answering a coordinator); `state` seeds `run.state`.
    """
    run = RunContext(
        host=host,
        endpoint=endpoint,
        conversation_id=conversation_id,
        user_id=user_id,
        sink=sink,
        parent=parent,
    )
    if state:
        run.state.update(state)
    session = run.session
    spec = endpoint.spec
    assert spec is not None
    assert spec.prompt_method is not None
    try:
        async with host.conversation_lock(endpoint.path, conversation_id):
            kwargs: dict[str, Any] = {}
            for name, kind in endpoint.prompt_parameters:
                kwargs[name] = message if kind is None else run.resolve(kind)
            method = getattr(endpoint.instance, spec.prompt_method)
            result = await method(**kwargs)
            if isinstance(result, str) and result and not session.closed:
                await session.send(result)
                session.last_text = result
        await session.complete()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("prompt run failed", endpoint=endpoint.path, error=str(exc), exc_info=True)
        await session.error(exc)
    return run
