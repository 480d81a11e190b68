"""The live-run journal: replay after a seq, back-pressure, and who keeps a run alive."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from atmosphere_harness._events import Frame
from atmosphere_harness._kernel import live as journal
from atmosphere_harness._kernel.live import LiveRun
from atmosphere_harness._kernel.writer import StoreWriter


def frame(seq: int, event: str = "text") -> Frame:
    return Frame(event, {"n": seq}, "session-1", "conv", seq)


async def collect(live: LiveRun, after: int) -> list[int]:
    return [f.seq async for f in live.follow(after)]


async def test_a_reader_gets_every_frame_after_its_seq_then_stops_at_the_end() -> None:
    live = LiveRun("/p", "conv", None)
    for seq in range(1, 6):
        await live.publish(frame(seq))
    live.finish()
    assert await collect(live, 0) == [1, 2, 3, 4, 5]
    assert await collect(live, 3) == [4, 5]
    assert await collect(live, 5) == []
    assert live.session_id == "session-1"


async def test_a_follower_sees_frames_published_while_it_waits() -> None:
    live = LiveRun("/p", "conv", None)
    reader = asyncio.create_task(collect(live, 0))
    await asyncio.sleep(0)
    for seq in range(1, 4):
        await live.publish(frame(seq))
        await asyncio.sleep(0)
    live.finish()
    assert await asyncio.wait_for(reader, 5) == [1, 2, 3]


async def test_frames_older_than_the_journal_are_skipped() -> None:
    live = LiveRun("/p", "conv", None, capacity=4)
    for seq in range(1, 11):
        await live.publish(frame(seq))
    live.finish()
    assert await collect(live, 0) == [7, 8, 9, 10]
    assert await collect(live, 8) == [9, 10]


async def test_the_journal_keeps_a_byte_budget_of_frames_already_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(journal, "JOURNAL_BYTES", 1000)
    live = LiveRun("/p", "conv", None)
    big = "x" * 300
    follower = live.follow(0)
    await live.publish(Frame("text", {"text": big}, "s", "conv", 1))
    assert (await follower.__anext__()).seq == 1
    for seq in range(2, 11):
        await live.publish(Frame("text", {"text": big}, "s", "conv", seq))
    # 3.6 KB are kept past the 1 KB budget: the attached reader has not read them yet.
    assert [f.seq async for f in _take(follower, 9)] == list(range(2, 11))
    await follower.aclose()
    live.finish()
    kept = await collect(live, 0)
    assert kept == [9, 10], "once read, the oldest frames go past the budget"


async def _take(follower: Any, count: int) -> Any:
    for _ in range(count):
        yield await follower.__anext__()


async def test_back_pressure_blocks_until_the_reader_catches_up() -> None:
    live = LiveRun("/p", "conv", None, capacity=3)
    got: list[int] = []
    gate = asyncio.Event()

    async def slow_reader() -> None:
        async for f in live.follow(0):
            got.append(f.seq)
            await gate.wait()

    reader = asyncio.create_task(slow_reader())
    await asyncio.sleep(0)
    published: list[int] = []

    async def writer() -> None:
        for seq in range(1, 9):
            await live.publish(frame(seq))
            published.append(seq)

    writing = asyncio.create_task(writer())
    await asyncio.sleep(0.05)
    # The reader took frame 1 (its batch) and is stuck on it: the writer may run at most a
    # journal ahead of it, never to the end.
    assert published
    assert published[-1] < 8
    gate.set()
    await asyncio.wait_for(writing, 5)
    live.finish()
    await asyncio.wait_for(reader, 5)
    assert got == list(range(1, 9))


async def test_the_last_reader_leaving_cancels_the_run_unless_it_is_held() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    for held in (False, True):
        live = LiveRun("/p", "conv", None)
        task = asyncio.create_task(forever())
        live.task = task  # type: ignore[assignment]
        await live.publish(frame(1))
        follower = live.follow(0)
        assert (await follower.__anext__()).seq == 1
        if held:
            with live.hold():
                await follower.aclose()
                await asyncio.sleep(0.01)
                assert not task.done(), "a held run outlives its last reader"
            await asyncio.sleep(0.01)
            assert not task.done(), "once held past its connection, the run goes on"
            task.cancel()
        else:
            await follower.aclose()
            await asyncio.sleep(0.01)
            assert task.cancelled()


async def test_a_reader_that_keeps_up_is_handed_each_frame_as_it_was_published() -> None:
    # One frame a token: a caught-up reader gets the `Frame` the run published, not one
    # rebuilt from the journal; a reader behind gets equal frames rebuilt from it.
    live = LiveRun("/p", "conv", None)
    batches = live.follow_batches(0)
    waiting = asyncio.ensure_future(anext(batches))
    await asyncio.sleep(0)
    published = [Frame("text", {"text": f"t{seq}"}, "session-1", "conv", seq) for seq in (1, 2, 3)]
    await live.publish(published[0])
    assert (await waiting)[0] is published[0]
    await live.publish(published[1])
    await live.publish(published[2])
    behind = await anext(batches)
    assert behind == published[1:]
    assert behind[0] is not published[1]
    live.finish()
    assert [batch async for batch in batches] == []


async def test_a_durable_reader_gets_the_newest_frame_only_once_it_is_stored() -> None:
    class Unstored:
        """A durable journal's writer whose store takes nothing until `_stored` says so."""

        def frame(self, frame: Frame) -> None:
            pass

    live = LiveRun("/p", "conv", None, writer=cast(StoreWriter, Unstored()))
    batches = live.follow_batches(0)
    waiting = asyncio.ensure_future(anext(batches))
    await live.publish(frame(1))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    live._stored(1)
    assert [f.seq for f in await asyncio.wait_for(waiting, 5)] == [1]
    await live.publish(frame(2))
    await live.publish(frame(3))
    live._stored(2)
    assert [f.seq for f in await asyncio.wait_for(anext(batches), 5)] == [2]
    await batches.aclose()


async def test_a_reader_takes_the_frames_ready_together_in_bounded_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = LiveRun("/p", "conv", None)
    for seq in range(1, 101):
        await live.publish(frame(seq))
    batches = live.follow_batches(0)
    assert [f.seq for f in await batches.__anext__()] == list(range(1, journal.BATCH_FRAMES + 1))
    assert [f.seq for f in await batches.__anext__()] == list(range(journal.BATCH_FRAMES + 1, 101))
    await batches.aclose()
    # About BATCH_BYTES of text a batch, and never less than one frame.
    monkeypatch.setattr(journal, "BATCH_BYTES", 1000)
    big = LiveRun("/p", "conv", None)
    for seq in range(1, 6):
        await big.publish(Frame("text", {"text": "x" * 400}, "s", "conv", seq))
    await big.publish(Frame("text", {"text": "x" * 5000}, "s", "conv", 6))
    big.finish()
    sizes = [len(batch) async for batch in big.follow_batches(0)]
    assert sizes == [2, 2, 1, 1]


async def test_a_lone_frame_reaches_a_waiting_batch_reader_at_once() -> None:
    live = LiveRun("/p", "conv", None)
    batches = live.follow_batches(0)
    waiting = asyncio.create_task(batches.__anext__())
    await asyncio.sleep(0)
    await live.publish(frame(1))
    assert [f.seq for f in await asyncio.wait_for(waiting, 5)] == [1]
    await batches.aclose()


async def test_journalled_text_frames_leave_the_collectors_view() -> None:
    """A long run's text frames are not walked by every full garbage collection."""
    import gc

    live = LiveRun("/p", "conv", None)
    for seq in range(1, 201):
        await live.publish(Frame("text", {"text": f"token {seq} "}, "s", "conv", seq))
    await live.publish(
        Frame("tool-start", {"name": "ls", "arguments": {"path": "/"}}, "s", "conv", 201)
    )
    gc.collect()
    journalled = list(live._frames)
    assert sum(gc.is_tracked(item) for item in journalled) <= 1, "only the tool frame's dict"
    live.finish()
    frames = [f async for f in live.follow(0)]
    assert frames[0] == Frame("text", {"text": "token 1 "}, "s", "conv", 1)
    assert frames[-1].data == {"name": "ls", "arguments": {"path": "/"}}
    assert [f.seq for f in frames] == list(range(1, 202))


async def test_text_frames_come_back_as_published_whatever_their_ids_and_data() -> None:
    """A text frame of the journal's own run is kept as its bare text; every other frame (other
    ids, more data than the text, another type) whole: readers get each back unchanged."""
    published = [
        Frame("text", {"text": "a"}, "session-1", "conv", 1),
        Frame("text", {"text": "b", "agent": "helper"}, "session-1", "conv", 2),
        Frame("text", {"text": "c"}, "session-0", "conv", 3),
        Frame("tool-start", {"name": "ls"}, "session-1", "conv", 4),
        Frame("text", {"text": ""}, "session-1", "conv", 5),
        Frame("text", {"text": 7}, "session-1", "conv", 6),
        Frame("complete", {"summary": "abc"}, "session-1", "conv", 7),
    ]
    live = LiveRun("/p", "conv", None, session_id="session-1")
    for item in published:
        await live.publish(item)
    live.finish()
    assert [f async for f in live.follow(0)] == published
    assert [f async for f in live.follow(4)] == published[4:]
    resumed = LiveRun("/p", "conv", None, session_id="session-1", frames=published[:3])
    resumed.finish()
    assert [f async for f in resumed.follow(1)] == published[1:3]


async def test_a_streamed_token_keeps_under_forty_bytes_in_the_journal() -> None:
    """What a long run in flight holds is mostly its journal: a run's consecutive text frames
    are kept joined (a 4-character token: under 40 bytes with its offset and its entry), not
    as a string each (about 90 bytes) nor a tuple of the frame's fields (about 220)."""
    import tracemalloc

    live = LiveRun("/p", "conv", None, session_id="session-1")
    count = 2000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(count):
            # A token as the model's stream gives it: a new string, its frame dropped once sent.
            await live.publish(Frame("text", {"text": f"t{n:04d}"[:4]}, "session-1", "conv", n + 1))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / count < 40, f"{held / count:.0f} bytes a frame"


def _texts(count: int, start: int = 1) -> list[Frame]:
    # Tokens of every length, non-ASCII and astral characters included, an empty one too.
    return [
        Frame(
            "text",
            {"text": ("é" * (seq % 5) + "\U0001d538" * (seq % 3) + str(seq))[: seq % 9]},
            "session-1",
            "conv",
            seq,
        )
        for seq in range(start, start + count)
    ]


async def test_a_reader_after_any_seq_gets_every_frame_of_the_joined_texts_as_published() -> None:
    """Consecutive text frames are joined `SPAN_FRAMES` at a time; a reader re-attaching after
    any seq (inside a span, at its edges, in the texts not joined yet, after a tool frame that
    broke a run of texts) gets every frame after it as it was published, in batches as before."""
    span = journal.SPAN_FRAMES
    published = [
        *_texts(span + 5),
        Frame("tool-start", {"name": "ls"}, "session-1", "conv", span + 6),
        *_texts(2 * span + 3, start=span + 7),
        Frame("text", {"text": "other run"}, "session-0", "conv", 3 * span + 10),
        *_texts(span - 1, start=3 * span + 11),
        Frame("complete", {"summary": "done"}, "session-1", "conv", 4 * span + 10),
    ]
    live = LiveRun("/p", "conv", None, session_id="session-1")
    for item in published:
        await live.publish(item)
    live.finish()
    joined = [entry for entry in live._frames if type(entry) is tuple and len(entry) == 3]
    assert len(joined) == 3 * span, "every full run of texts was joined"
    assert len({id(entry) for entry in joined}) == 3
    for after in range(len(published) + 1):
        assert [f async for f in live.follow(after)] == published[after:], after
        batches = [len(batch) async for batch in live.follow_batches(after)]
        assert sum(batches) == len(published) - after
        assert all(size <= journal.BATCH_FRAMES for size in batches)


async def test_a_journal_trimmed_inside_joined_texts_keeps_the_rest_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The frame count and the byte budget drop the oldest frames one by one, a span's
    included: what stays is read back whole, and the budget counts each frame as before."""
    published = _texts(5 * journal.SPAN_FRAMES)
    capacity = journal.SPAN_FRAMES + 7
    small = LiveRun("/p", "conv", None, capacity=capacity, session_id="session-1")
    for item in published:
        await small.publish(item)
    small.finish()
    assert [f async for f in small.follow(0)] == published[-capacity:]
    assert [f async for f in small.follow(len(published) - 3)] == published[-3:]

    monkeypatch.setattr(journal, "JOURNAL_BYTES", 40 * journal.TEXT_SIZE)
    live = LiveRun("/p", "conv", None, session_id="session-1")
    for item in published:
        await live.publish(item)
    live.finish()
    kept = [f async for f in live.follow(0)]
    assert kept == published[-len(kept) :]
    assert 30 <= len(kept) <= 40, len(kept)
    assert live._bytes == sum(journal.TEXT_SIZE + len(f.data["text"]) for f in kept)
