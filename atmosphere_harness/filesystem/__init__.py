"""The virtual-filesystem primitive: a bounded, conversation-scoped workspace and its tools.

The stores live here; the model-facing tools are in `filesystem.tools` (`file_tools()`), the
offload hook in `filesystem.offload` and the attach engine in `filesystem.primitive`.
"""

from .base import (
    AgentFileSystem,
    FileInfo,
    FileNotFoundInWorkspace,
    FileSystemError,
    FileSystemLimits,
    GrepHit,
)
from .composite import CompositeAgentFileSystem
from .provider import AgentFileSystemProvider
from .workspace import StoreUsage, WorkspaceAgentFileSystem

__all__ = [
    "AgentFileSystem",
    "AgentFileSystemProvider",
    "CompositeAgentFileSystem",
    "FileInfo",
    "FileNotFoundInWorkspace",
    "FileSystemError",
    "FileSystemLimits",
    "GrepHit",
    "StoreUsage",
    "WorkspaceAgentFileSystem",
]
