"""The library configures logging only when the host has not."""

from __future__ import annotations

import logging

import pytest

from atmosphere_harness import _log
from atmosphere_harness._log import ROOT_LOGGER, ensure_handler, fault, get_logger


@pytest.fixture
def bare_logging(monkeypatch: pytest.MonkeyPatch):
    library = logging.getLogger(ROOT_LOGGER)
    monkeypatch.setattr(library, "handlers", [])
    monkeypatch.setattr(library, "level", logging.NOTSET)
    return library


def test_adds_a_handler_only_when_nothing_is_configured(bare_logging, monkeypatch) -> None:
    # pytest's own capture handlers sit on the root logger during the test; hide them.
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    ensure_handler()
    assert len(bare_logging.handlers) == 1
    ensure_handler()
    assert len(bare_logging.handlers) == 1, "idempotent"


def test_leaves_a_configured_host_alone(bare_logging, monkeypatch) -> None:
    host_handler = logging.StreamHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [host_handler])
    ensure_handler()
    assert bare_logging.handlers == []


def test_events_render_as_message_and_fields(caplog) -> None:
    log = get_logger("atmosphere_harness.test")
    with caplog.at_level(logging.INFO, logger="atmosphere_harness"):
        log.info("something happened", count=3, name="x")
    assert caplog.records[-1].getMessage() == "something happened count=3 name='x'"


def _raise(error: Exception) -> Exception:
    try:
        raise error
    except Exception as caught:
        return caught


def test_a_fault_is_one_line_with_its_cause_and_its_traceback_once_per_kind(caplog) -> None:
    log = get_logger("atmosphere_harness.test.faults")
    with caplog.at_level(logging.INFO, logger="atmosphere_harness"):
        for n in range(3):
            fault(log, "request failed", _raise(ValueError(f"down {n}")), request=n)
        fault(log, "request failed", _raise(KeyError("other")))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 4, "one line per failure"
    assert "error='ValueError: down 2'" in lines[2]
    tracebacks = [line for line in lines if "Traceback (most recent call last)" in line]
    assert len(tracebacks) == 2, "once for each kind (the ValueError, the KeyError)"


def test_a_consequential_fault_is_said_once_per_window_with_the_count_left_out(
    caplog, monkeypatch
) -> None:
    log = get_logger("atmosphere_harness.test.consequences")
    clock = [1000.0]
    monkeypatch.setattr(_log.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="atmosphere_harness"):
        for _ in range(5):
            fault(log, "could not share", _raise(OSError("down")), every=False)
        clock[0] += _log.FAULT_WINDOW_SECONDS
        fault(log, "could not share", _raise(OSError("down")), every=False)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert "repeated=4" in lines[1]
    assert "Traceback" in lines[0]
    assert "Traceback" in lines[1], "a minute later, shown again"
