"""Fixtures of the scale-out tests, from each backend's service module."""

from tests.scaleout.redis_service import (  # noqa: F401
    connection,
    other_connection,
    private_redis,
    redis_prefix,
)
