"""Structured logging that stays out of the host's way.

Every library logger is a structlog logger wrapped around a standard-library logger named under
`atmosphere_harness`, so the host's logging configuration (levels, handlers, pytest's `caplog`)
applies unchanged. When the host has configured structlog itself, its configuration is used. The
library adds a console handler of its own only when nothing at all is configured, so a bare
`uvicorn app:app` still shows the start-up lines.
"""

from __future__ import annotations

import logging
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
