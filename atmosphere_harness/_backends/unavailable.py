"""`BackendUnavailable`: the shared-state service (Redis, PostgreSQL) cannot be reached right now.

A backend raises it instead of its driver's connection error, so a run ends with an `error`
frame that says what is down and which setting names it, and an HTTP route answers 503 (the
client may retry) rather than 500. The message never holds a password.
"""

from __future__ import annotations
