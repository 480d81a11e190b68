"""Fixtures the filesystem tests share (a test module opts in with `pytest.mark.usefixtures`)."""

from tests.fs_support import on_loop_and_worker

__all__ = ["on_loop_and_worker"]
