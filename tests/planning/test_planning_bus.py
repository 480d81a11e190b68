"""InProcessPlanBus: fan-out, Last-Event-ID replay, bounds, slow subscribers, shutdown."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from atmosphere_harness._errors import PlanBusFull
from atmosphere_harness._planning import InProcessPlanBus


def plan(n: int, pad: int = 0) -> dict[str, object]:
    return {"steps": [{"content": f"step {n}" + "x" * pad, "status": "pending"}], "goal": None}


async def take(subscription, count: int) -> list:
    events: list = []
    async for batch in subscription:
        assert batch, "batches are never empty"
        events.extend(batch)
        if len(events) >= count:
            break
    return events


async def test_every_subscriber_of_a_conversation_gets_every_update_in_order() -> None:
    bus = InProcessPlanBus()
    async with (
        bus.subscribe("o", "c") as first,
        bus.subscribe("o", "c") as second,
        bus.subscribe("o", "other") as elsewhere,
        bus.subscribe("other-owner", "c") as stranger,
    ):
        assert first.replay is None
        published = [await bus.publish("o", "c", plan(n)) for n in range(3)]
        got_first = await take(first, 3)
        got_second = await take(second, 3)
        assert got_first == got_second == published
        assert [json.loads(event.json) for event in got_first] == [plan(n) for n in range(3)]
        assert [event.data for event in got_first] == [plan(n) for n in range(3)]
        assert list(elsewhere.pending) == []
        assert list(stranger.pending) == []


async def test_ids_are_increasing_within_one_epoch_and_the_cursor_points_at_the_latest() -> None:
    bus = InProcessPlanBus()
    async with bus.subscribe("o", "c") as fresh:
        epoch, _, zero = fresh.cursor.partition("-")
        assert zero == "0"
        events = [await bus.publish("o", "c", plan(n)) for n in range(3)]
    assert [event.id for event in events] == [f"{epoch}-1", f"{epoch}-2", f"{epoch}-3"]
    async with bus.subscribe("o", "c") as later:
        assert later.cursor == f"{epoch}-3"


async def test_last_event_id_replays_only_what_was_missed() -> None:
    bus = InProcessPlanBus()
    events = [await bus.publish("o", "c", plan(n)) for n in range(5)]
    async with bus.subscribe("o", "c", last_event_id=events[1].id) as resumed:
        assert resumed.replay == events[2:]
    async with bus.subscribe("o", "c", last_event_id=events[-1].id) as current:
        assert current.replay == []


@pytest.mark.parametrize("stale", ["bogus", "", "0", "deadbeef-1", "-1", None])
async def test_an_unknown_id_asks_for_a_snapshot(stale: str | None) -> None:
    bus = InProcessPlanBus()
    await bus.publish("o", "c", plan(0))
    async with bus.subscribe("o", "c", last_event_id=stale) as subscription:
        assert subscription.replay is None


async def test_an_id_from_the_future_asks_for_a_snapshot() -> None:
    bus = InProcessPlanBus()
    event = await bus.publish("o", "c", plan(0))
    epoch = event.id.partition("-")[0]
    async with bus.subscribe("o", "c", last_event_id=f"{epoch}-99") as subscription:
        assert subscription.replay is None


async def test_history_is_bounded_and_an_evicted_id_asks_for_a_snapshot() -> None:
    bus = InProcessPlanBus(history_size=3)
    events = [await bus.publish("o", "c", plan(n)) for n in range(6)]
    async with bus.subscribe("o", "c", last_event_id=events[2].id) as edge:
        assert edge.replay == events[3:]
    async with bus.subscribe("o", "c", last_event_id=events[1].id) as gone:
        assert gone.replay is None


async def test_history_bytes_are_bounded_across_conversations() -> None:
    bus = InProcessPlanBus(history_bytes=10_000)
    for conversation in range(20):
        await bus.publish("o", f"c{conversation}", plan(conversation, pad=1000))
    assert bus._bytes <= 10_000
    assert len(bus._topics) < 20
    assert ("o", "c19") in bus._topics, "the most recent conversation is kept"


async def test_conversation_count_is_bounded_but_live_viewers_keep_flowing() -> None:
    bus = InProcessPlanBus(max_topics=3)
    async with bus.subscribe("o", "watched") as watched:
        first = await bus.publish("o", "watched", plan(0))
        for conversation in range(10):
            await bus.publish("o", f"c{conversation}", plan(conversation))
        assert len(bus._topics) <= 3
        assert ("o", "watched") in bus._topics
        second = await bus.publish("o", "watched", plan(1))
        assert await take(watched, 2) == [first, second]
    async with bus.subscribe("o", "watched", last_event_id=first.id) as resumed:
        assert resumed.replay == [second]


async def test_a_slow_subscriber_never_blocks_the_publisher_and_keeps_the_newest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = InProcessPlanBus(queue_size=4)
    async with bus.subscribe("o", "c") as stuck, bus.subscribe("o", "c") as reader:
        with caplog.at_level(logging.WARNING, logger="atmosphere_harness"):
            events = []
            for n in range(100):
                # publish must complete without yielding to the (never reading) subscriber
                events.append(await asyncio.wait_for(bus.publish("o", "c", plan(n)), 1))
        assert await take(stuck, 4) == events[-4:]
        assert await take(reader, 4) == events[-4:]
        assert stuck.dropped == 96  # type: ignore[attr-defined]
    assert caplog.text.count("slow plan subscriber") == 2


async def test_a_waiting_subscriber_wakes_on_publish() -> None:
    bus = InProcessPlanBus()
    async with bus.subscribe("o", "c") as subscription:
        waiting = asyncio.create_task(take(subscription, 1))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        event = await bus.publish("o", "c", plan(0))
        assert await asyncio.wait_for(waiting, 5) == [event]


async def test_close_ends_every_subscription_after_what_was_queued() -> None:
    bus = InProcessPlanBus()
    async with bus.subscribe("o", "c") as subscription:
        event = await bus.publish("o", "c", plan(0))
        await bus.aclose()
        assert [batch async for batch in subscription] == [[event]]
    async with bus.subscribe("o", "c") as late:
        assert [batch async for batch in late] == []


async def test_subscribers_per_conversation_are_bounded() -> None:
    bus = InProcessPlanBus(max_subscribers=2)
    async with bus.subscribe("o", "c"), bus.subscribe("o", "c"):
        with pytest.raises(PlanBusFull):
            async with bus.subscribe("o", "c"):
                pass
        assert bus.subscriber_count("o", "c") == 2
    assert bus.subscriber_count("o", "c") == 0


async def test_a_conversation_nobody_published_to_is_forgotten_when_its_viewers_leave() -> None:
    bus = InProcessPlanBus()
    async with bus.subscribe("o", "quiet"):
        assert ("o", "quiet") in bus._topics
    assert ("o", "quiet") not in bus._topics


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        InProcessPlanBus(queue_size=0)


async def test_updates_that_accumulated_arrive_as_one_ordered_batch() -> None:
    bus = InProcessPlanBus()
    async with bus.subscribe("o", "c") as subscription:
        published = [await bus.publish("o", "c", plan(n)) for n in range(3)]
        batches = aiter(subscription)
        assert await anext(batches) == published
        later = await bus.publish("o", "c", plan(3))
        assert await anext(batches) == [later]
