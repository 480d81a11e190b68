"""A run's ticket hands its end to the conversation lock's release when the lock stored the
run's status (`contracts.LockedStatus.end`), and writes it itself when the release refuses it.

The lock here is a stand-in for the PostgreSQL and Redis locks (`tests/scaleout/
test_locked_end.py` runs theirs): its release takes the record `ending` returns and says
whether it stored it."""

from __future__ import annotations

import asyncio

from atmosphere_harness._contracts import LockedRead, LockedStatus, LockedWrite, RunRecord
from atmosphere_harness._kernel.control import InProcessRunRegistry, RunControl, RunTicket


class CountingRegistry(InProcessRunRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.puts: list[str] = []

    async def put(self, record: RunRecord) -> None:
        self.puts.append(record.status)
        await super().put(record)


def ticket_with_offer(registry: CountingRegistry) -> tuple[RunTicket, LockedStatus]:
    control = RunControl(registry, owner="me")
    ticket = control.ticket(path="/p", conversation_id="c", user_id=None)
    read = LockedRead()
    ticket.offer(read)
    status = read.status
    assert isinstance(status, LockedStatus)
    # What the lock does in the round trip that takes it: stores `running`, carries the end.
    status.stored = "running"
    status.carries_end = True
    ticket.running()
    return ticket, status


async def test_the_end_rides_on_the_release_and_is_not_written_again() -> None:
    registry = CountingRegistry()
    ticket, status = ticket_with_offer(registry)
    stored: list[RunRecord] = []

    async def release() -> None:
        record = await status.ending()
        assert record is not None
        stored.append(record)
        await registry.put(record)  # (the lock's own statement, counted the same)
        status.released(True)

    releasing = asyncio.create_task(release())
    await ticket.settle("completed")
    await releasing
    assert [record.status for record in stored] == ["completed"]
    assert registry.puts == ["completed"]  # once, by the release
    got = await registry.get(ticket.run_id)
    assert got is not None
    assert got.status == "completed"


async def test_an_end_the_release_did_not_store_is_written_by_the_ticket() -> None:
    registry = CountingRegistry()
    ticket, status = ticket_with_offer(registry)

    async def release() -> None:
        await status.ending()
        status.released(False)  # (its statement failed)

    releasing = asyncio.create_task(release())
    await ticket.settle("failed", RuntimeError("boom"))
    await releasing
    assert registry.puts == ["failed"]
    got = await registry.get(ticket.run_id)
    assert got is not None
    assert (got.status, got.error) == ("failed", {"type": "RuntimeError", "message": "boom"})


async def test_a_lock_that_carries_no_end_leaves_the_end_to_the_ticket() -> None:
    registry = CountingRegistry()
    control = RunControl(registry, owner="me")
    ticket = control.ticket(path="/p", conversation_id="c", user_id=None)
    read = LockedRead()
    ticket.offer(read)  # (an embedded lock ignores the offer)
    ticket.running()
    await ticket.settle("completed")
    assert registry.puts[-1] == "completed"


class Turn(LockedWrite):
    """A write handed to the release (the memory primitive's `HistoryWrite` in an app)."""

    def __init__(self) -> None:
        self.stored = False

    async def store(self) -> None:
        self.stored = True


def carrying_writes(registry: CountingRegistry) -> tuple[RunTicket, LockedStatus]:
    ticket, status = ticket_with_offer(registry)
    status.carries_write = True  # (what the PostgreSQL and Redis locks set while their block runs)
    return ticket, status


async def test_a_write_stored_with_the_end_is_waited_for_and_the_run_completes() -> None:
    registry = CountingRegistry()
    ticket, status = carrying_writes(registry)
    write = Turn()
    assert status.hand(write)
    assert not status.hand(Turn())  # (one at a time)

    async def release() -> None:
        record = await status.ending()
        assert status.take_write() is write
        await asyncio.sleep(0.05)  # (a slow script: the end waits for it)
        assert record is not None
        await registry.put(record)
        status.wrote(None)
        status.released(True)

    releasing = asyncio.create_task(release())
    assert await ticket.settle("completed") is None
    await releasing
    assert registry.puts == ["completed"]


async def test_a_write_the_release_could_not_store_fails_the_run() -> None:
    """The script failed and so did the write sent on its own: the run ends `failed` with the
    write's error (`settle` returns it for the `error` frame), whatever it ended with."""
    registry = CountingRegistry()
    ticket, status = carrying_writes(registry)
    assert status.hand(Turn())
    failure = RuntimeError("Redis is unavailable while storing the conversation's turn")

    async def release() -> None:
        await status.ending()
        assert status.take_write() is not None
        status.wrote(failure)
        status.released(False)

    releasing = asyncio.create_task(release())
    assert await ticket.settle("completed") is failure
    await releasing
    assert registry.puts == ["failed"]
    got = await registry.get(ticket.run_id)
    assert got is not None
    assert (got.status, got.error) == (
        "failed",
        {"type": "RuntimeError", "message": str(failure)},
    )


async def test_a_durable_run_keeps_its_writes() -> None:
    registry = CountingRegistry()
    ticket, status = carrying_writes(registry)

    class Journal:
        durable = True

    ticket.live = Journal()  # type: ignore[assignment]
    assert status.keeps_writes
    assert not status.hand(Turn())
    status.carries_write = False
