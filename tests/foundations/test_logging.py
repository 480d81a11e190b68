"""The library configures logging only when the host has not."""

from __future__ import annotations

import logging

import pytest

from atmosphere_harness._log import ROOT_LOGGER, ensure_handler, get_logger


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
