"""The virtual-filesystem primitive: a bounded, conversation-scoped workspace and its tools.

The stores live here; the model-facing tools are in `filesystem.tools` (`file_tools()`), the
offload hook in `filesystem.offload` and the attach engine in `filesystem.primitive`.

`WorkspaceAgentFileSystem` (`workspace`) is built from `paths` (path checks), `containment`
(symlink-safe resolution), `atomic` (atomic writes, bounded reads), `usage` (the
`WorkspaceUsage` accounting seam) and `tally` (noticing changes made behind the store's back).
"""

from .._errors import FileNotFoundInWorkspace, FileSystemError
from .base import AgentFileSystem, FileInfo, FileSystemLimits, GrepHit
from .composite import CompositeAgentFileSystem
from .provider import AgentFileSystemProvider
from .usage import InProcessWorkspaceUsage, StoreUsage, UsageLedger, WorkspaceUsage
from .workspace import WorkspaceAgentFileSystem

__all__ = [
    "AgentFileSystem",
    "AgentFileSystemProvider",
    "CompositeAgentFileSystem",
    "FileInfo",
    "FileNotFoundInWorkspace",
    "FileSystemError",
    "FileSystemLimits",
    "GrepHit",
    "InProcessWorkspaceUsage",
    "StoreUsage",
    "UsageLedger",
    "WorkspaceAgentFileSystem",
    "WorkspaceUsage",
]
