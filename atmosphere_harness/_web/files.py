"""`get_file_system` / `AgentFileSystemDep`: a conversation's filesystem in the host's own routes.

The dependency resolves the same canonical instance the agent's tools use, from two query
parameters: `conversationId` (required) and `agent` (the owner name; optional when exactly one
hosted agent has a filesystem). It never creates a directory. Override it like any dependency
(`app.dependency_overrides[get_file_system] = ...`), e.g. to take the conversation from a path
parameter or to scope it to the signed-in user.

```python
@app.get("/reports/latest")
async def latest(fs: AgentFileSystemDep) -> str:
    return await fs.read("reports/latest.md")
```
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Query

from .._errors import FileSystemError
from .._filesystem.base import AgentFileSystem
from .._filesystem.primitive import SURFACE
from .._filesystem.provider import AgentFileSystemProvider
from .deps import CONVERSATION_ID_SCHEMA, HarnessDep


def get_file_system(
    host: HarnessDep,
    conversation_id: Annotated[
        str,
        Query(
            alias="conversationId",
            description="The conversation whose files to use",
            json_schema_extra=CONVERSATION_ID_SCHEMA,
        ),
    ],
    agent: Annotated[
        str | None,
        Query(description="Owner name of the agent; optional when only one has a filesystem"),
    ] = None,
) -> AgentFileSystem:
    """The conversation-scoped `AgentFileSystem` of one hosted agent (404/400 otherwise)."""
    owners = host.owners(SURFACE)
    if agent is None:
        if len(owners) != 1:
            detail = (
                "no hosted agent has a filesystem"
                if not owners
                else f"several agents have a filesystem; pass agent= one of {owners}"
            )
            raise HTTPException(404 if not owners else 400, detail)
        agent = owners[0]
    provider = host.surface(SURFACE, agent)
    if not isinstance(provider, AgentFileSystemProvider):
        raise HTTPException(404, f"agent {agent!r} has no filesystem")
    try:
        return provider.for_conversation(conversation_id)
    except FileSystemError as exc:
        raise HTTPException(400, str(exc)) from None


AgentFileSystemDep = Annotated[AgentFileSystem, Depends(get_file_system)]
