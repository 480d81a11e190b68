"""Structured logging that stays out of the host's way.

Every library logger is a structlog logger wrapped around a standard-library logger named under
`atmosphere_harness`, so the host's logging configuration (levels, handlers, pytest's `caplog`)
applies unchanged. When the host has configured structlog itself, its configuration is used. The
library adds a console handler of its own only when nothing at all is configured, so a bare
`uvicorn app:app` still shows the start-up lines.

A failure is logged with `fault()`, so an outage of a backend costs a few lines, not thousands:
one line per failure with its cause (`error="Type: message"`), and the traceback only the first
time that kind of fault (where it was logged, the exception's type, where it was raised) is seen
in `FAULT_WINDOW_SECONDS`. A failure that only follows from another one already reported (a run
that could not be shared because the backend is down, while the run itself says it failed) is
logged once per window for its kind, with how many were left out since (`repeated=N`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import structlog

ROOT_LOGGER = "atmosphere_harness"


def _render(_logger: Any, _method: str, event: dict[str, Any]) -> str:
    """`message key=value ...`: readable in a terminal, greppable in a log file."""
    message = str(event.pop("event", ""))
    trailer = event.pop("exception", None)
    fields = " ".join(f"{key}={value!r}" for key, value in event.items())
    line = f"{message} {fields}" if fields else message
    return f"{line}\n{trailer}" if trailer else line


_PROCESSORS: list[Any] = [
    structlog.processors.StackInfoRenderer(),
    structlog.processors.format_exc_info,
    _render,
]


def get_logger(name: str) -> Any:
    """A bound structlog logger for `name` (a module name inside the package)."""
    if structlog.is_configured():
        return structlog.get_logger(name)
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def ensure_handler() -> None:
    """Attach a plain console handler to the library logger if the host configured no logging."""
    library = logging.getLogger(ROOT_LOGGER)
    if logging.getLogger().handlers or library.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    library.addHandler(handler)
    if library.level == logging.NOTSET:
        library.setLevel(logging.INFO)


FAULT_WINDOW_SECONDS = 60.0
"""How often a kind of fault may show its traceback (and a repeated line be logged again)."""
FAULT_KINDS = 512
"""Kinds of fault remembered at once (the oldest are forgotten first)."""


class _Faults:
    """When each kind of fault last showed its traceback and its line, and the lines left out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: OrderedDict[tuple[str, ...], list[float]] = OrderedDict()
        """kind -> [traceback shown at, line logged at, lines left out since]."""

    def decide(self, kind: tuple[str, ...], every: bool) -> tuple[bool, bool, int]:
        """(log the line, show the traceback, lines left out before this one)."""
        now = time.monotonic()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is None:
                self._kinds[kind] = [now, now, 0]
                while len(self._kinds) > FAULT_KINDS:
                    self._kinds.popitem(last=False)
                return True, True, 0
            self._kinds.move_to_end(kind)
            due = now - seen[1] >= FAULT_WINDOW_SECONDS
            if not every and not due:
                seen[2] += 1
                return False, False, 0
            traceback = now - seen[0] >= FAULT_WINDOW_SECONDS
            if traceback:
                seen[0] = now
            left_out, seen[1], seen[2] = int(seen[2]), now, 0
            return True, traceback, left_out

    def forget(self) -> None:
        with self._lock:
            self._kinds.clear()


_FAULTS = _Faults()


def fault(
    logger: Any,
    event: str,
    error: BaseException,
    *,
    level: str = "warning",
    every: bool = True,
    scrub: Callable[[str], str] | None = None,
    **fields: Any,
) -> None:
    """Log `event`, which `error` caused, at `level`: one line whose `error=` is the error's
    type and message (through `scrub`, if given), its traceback only the first time this kind
    of fault is seen in `FAULT_WINDOW_SECONDS` (the kind: the logger, `event`, the error's type
    and the line that raised it). `every=False` logs the line itself once per window for its
    kind, with `repeated=N` for the lines left out: for a failure that follows from one another
    line already reports."""
    name = str(getattr(logger, "name", "") or getattr(logger, "_logger", ""))
    kind = (name, event, type(error).__qualname__, _raised_at(error))
    log_line, traceback, left_out = _FAULTS.decide(kind, every)
    if not log_line:
        return
    text = f"{type(error).__name__}: {error}"
    fields["error"] = scrub(text) if scrub is not None else text
    if left_out:
        fields["repeated"] = left_out
    getattr(logger, level)(event, exc_info=error if traceback else None, **fields)


def _raised_at(error: BaseException) -> str:
    """`file:line` of the innermost frame of `error`'s traceback (where it was raised)."""
    tb = error.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
