"""Every exception the harness raises on purpose, in one tree rooted at `HarnessError`.

One `except HarnessError` catches the whole family. Classes that are also a `ValueError`,
`RuntimeError`, `ConnectionError` (or pydantic-settings' `SettingsError`) keep that base, so an
`except` written for the built-in class still catches them. `str(error)` is always the reason,
written for a person (and, for the tool errors, for the model).

```
HarnessError
├── ConfigFileError (SettingsError)       ATMOSPHERE_CONFIG_FILE cannot be read (start-up)
├── SkillSourceError (ValueError)         a declared skill folder does not exist (start-up)
├── BackendMissing (RuntimeError)         a backend URL is set, its extra is not installed
├── BackendMisconfigured (ValueError)     a setting asks for a backend whose URL is not set
├── SchemaTooNew (RuntimeError)           the database was migrated by a newer version
├── BackendUnavailable (ConnectionError)  Redis or PostgreSQL cannot be reached right now
│   └── RedisUnavailable                  Redis did not answer
├── FileSystemError (ValueError)          a rejected file operation
│   ├── FileNotFoundInWorkspace           the path names nothing in the workspace
│   └── GrepTimeout                       one grep call ran out of time
├── PlanStoreError (ValueError)           a rejected plan
├── PlanBusFull (RuntimeError)            too many live viewers of one conversation's plan
├── ToolArgumentError (ValueError)        a tool's arguments failed validation (`.details`)
├── ModelError                            a model call failed: the run ends with an `error` frame
│   ├── LoopLimitExceeded                 the model kept calling tools past `max_tool_rounds`
│   └── ScriptExhausted                   the `ScriptedRuntime` has no turn left
├── UsageLimitExceeded                    a run went over one of its usage limits (`.limit`)
├── DelegationError                       a fleet member failed
├── MCPServerError (RuntimeError)         an MCP server is unavailable (its tool calls say why)
├── RunSuperseded                         a resumed run whose conversation went on without it
├── RunCancelled                          a run stopped by a cancel request or a newer prompt
├── RunConflict                           a `multitask: reject` prompt or a deletion during a run
└── LeaseLost (RuntimeError)              another process took over this durable run
```

docs/errors.md shows the same tree (a test compares the two with these classes), says which
names `atmosphere_harness` exports, and how each maps to an HTTP status (decided in one place,
`atmosphere_harness._web.errors`). This module imports nothing from the package, so any module
may import it.
"""

from __future__ import annotations

from pydantic_settings import SettingsError


class HarnessError(Exception):
    """Base class of every error the harness raises on purpose; `str(error)` is the reason.

    Catch it to handle any harness failure at once; catch a subclass (`FileSystemError`,
    `PlanStoreError`, `ToolArgumentError`, `ModelError`, `DelegationError`, ...) to handle one.
    """


# --- start-up -----------------------------------------------------------------------------------


class ConfigFileError(HarnessError, SettingsError):
    """`ATMOSPHERE_CONFIG_FILE` names a file that cannot be read: start-up stops here."""


class SkillSourceError(HarnessError, ValueError):
    """A declared skill folder (`skills=` or `ATMOSPHERE_AI_SKILLS_DIRS`) does not exist."""


# --- state backends -----------------------------------------------------------------------------


class BackendMissing(HarnessError, RuntimeError):
    """A backend URL is set but the extra that implements it is not installed."""


class BackendMisconfigured(HarnessError, ValueError):
    """A setting asks for a backend whose URL is not set."""


class SchemaTooNew(HarnessError, RuntimeError):
    """The database was migrated by a newer version of the library."""


class BackendUnavailable(HarnessError, ConnectionError):
    """The state backend did not answer; `str(error)` names the service and its variable."""


class RedisUnavailable(BackendUnavailable):
    """Redis did not answer (down, restarting, or the connection was dropped)."""


# --- the primitives' stores ---------------------------------------------------------------------


class FileSystemError(HarnessError, ValueError):
    """A rejected file operation; `str(error)` is the model-facing reason."""


class FileNotFoundInWorkspace(FileSystemError):
    """The path names no file (or directory) in the workspace: `File not found: <path>` for a
    read or an edit, `Not found: <path>` for a delete or a rename. The admin API answers it 404;
    every other `FileSystemError` is the caller's mistake (400)."""


class GrepTimeout(FileSystemError):
    """The deadline of one grep call passed."""


class PlanStoreError(HarnessError, ValueError):
    """A rejected plan operation; `str(error)` is the reason, written for the model."""


class PlanBusFull(HarnessError, RuntimeError):
    """A conversation already has the maximum number of live subscribers."""


# --- runs: tools, models, delegation ------------------------------------------------------------


class ToolArgumentError(HarnessError, ValueError):
    """Arguments failed validation; `details` are the model-facing reasons."""

    def __init__(self, details: list[str]) -> None:
        super().__init__("; ".join(details))
        self.details = details


class ModelError(HarnessError):
    """A model call failed in a way the client should see (an `error` frame), not a crash.

    `status` is the provider's HTTP status when it answered one; `transient` says whether the
    same request may succeed elsewhere or later (429, 5xx, a timeout, a lost connection): a
    `FallbackRuntime` moves on to its next runtime only then, never on a 400, 401 or 403.
    """

    def __init__(self, message: str, *, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient


class LoopLimitExceeded(ModelError):
    """The model kept calling tools past `max_tool_rounds`."""


class ScriptExhausted(ModelError):
    """The script has no turn left for this conversation."""


class UsageLimitExceeded(HarnessError):
    """A run went over one of its usage limits; `limit` names it (`request_limit`, ...).

    The run ends with an `error` frame of this type; no further model request or tool call is
    made.
    """

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class DelegationError(HarnessError):
    """A fleet member failed; `str(error)` is the detail the model gets."""


class MCPServerError(HarnessError, RuntimeError):
    """An MCP server is unavailable (it failed to start, died, or hung); the message says why."""


# --- durable runs -------------------------------------------------------------------------------


class RunSuperseded(HarnessError):
    """A resumed durable run whose conversation went on without it: it is ended, not resumed."""


class RunConflict(HarnessError):
    """A prompt sent with `multitask: reject`, or a deletion of the conversation
    (`DELETE P/conversations/{id}`), while the conversation has a run in flight (answered
    409)."""


class ConversationTaken(HarnessError, LookupError):
    """A prompt whose conversation is another user's (or a user's, for a request without one):
    answered 404 before the response starts, or, when another user's prompt claimed the id
    after a deletion while this one waited for the conversation, its stream ends with an
    `error` frame of this type (nothing was run or written)."""


class RunCancelled(HarnessError):
    """A run stopped by `POST P/runs/{runId}/cancel`, or by a newer prompt's `multitask`
    (`interrupt`, `rollback`): its stream ends with an `error` frame of this type."""


class LeaseLost(HarnessError, RuntimeError):
    """A `RunStore.append` for a run another owner has taken over (this one's lease ran out)."""
