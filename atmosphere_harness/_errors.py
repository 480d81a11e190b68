"""`HarnessError`: the one root of every exception the harness raises on purpose.

Each primitive keeps its own error class beside the code that raises it (primitives own their
errors); every one of them derives from `HarnessError`, so a host can catch the whole family in
one place. Classes that were `ValueError`s (or `RuntimeError`s) before the tree existed keep that
base too, so existing `except ValueError` code still catches them.

```
HarnessError
├── FileSystemError (ValueError)        filesystem.base: a rejected file operation
│   ├── FileNotFoundInWorkspace         the path names nothing in the workspace (HTTP 404)
│   └── GrepTimeout                     filesystem.search: one grep call ran out of time
├── PlanStoreError (ValueError)         planning.store: a rejected plan
├── PlanBusFull (RuntimeError)          planning.bus: too many live viewers of one plan
├── ToolArgumentError (ValueError)      tools.base: a tool's arguments failed validation
├── ModelError                          runtimes.base: a model call failed (an `error` frame)
│   ├── LoopLimitExceeded               kernel.loop: too many tool rounds
│   └── ScriptExhausted                 runtimes.scripted: the script has no turn left
├── DelegationError                     delegation.fleet: a fleet member failed
└── BackendUnavailable (ConnectionError) backends.unavailable: Redis / PostgreSQL is down (503)
```

`str(error)` is always the human- (and model-) facing reason. How each maps to an HTTP status is
decided in one place, `atmosphere_harness._web.errors`. This module imports nothing from the
package, so any module may import it.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base class of every error the harness raises on purpose; `str(error)` is the reason.

    Catch it to handle any harness failure at once; catch a subclass (`FileSystemError`,
    `PlanStoreError`, `ToolArgumentError`, `ModelError`, `DelegationError`, ...) to handle one.
    """
