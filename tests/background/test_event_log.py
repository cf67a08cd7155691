"""The event log: bounded ring, cursors, batched wake-ups."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_responses.background.event_log import EventLog, SubscriberLagged
from trio_responses.background.subscription import LogSubscription
from trio_responses.protocol.sse import encode_event


def _frame(n: int) -> bytes:
    return encode_event({"type": "response.output_text.delta", "sequence_number": n})


def test_append_and_read_after() -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20)
    for n in range(5):
        log.append(_frame(n))
    assert log.next_sequence_number == 5
    assert log.read_after(-1) == [_frame(n) for n in range(5)]
    assert log.read_after(2) == [_frame(3), _frame(4)]
    assert log.read_after(4) == [] and log.read_after(99) == []


def test_ring_drops_oldest_by_count_and_bytes() -> None:
    log = EventLog(max_events=10, max_bytes=1 << 20)
    for n in range(25):
        log.append(_frame(n))
    assert log.retained_events == 10 and log.oldest_sequence_number == 15
    with pytest.raises(SubscriberLagged) as lagged:
        log.read_after(13)
    assert lagged.value.wanted == 14 and lagged.value.oldest == 15
    assert log.read_after(14)[0] == _frame(15)

    small = EventLog(max_events=1000, max_bytes=len(_frame(0)) * 3)
    for n in range(10):
        small.append(_frame(n))
    assert small.retained_events == 3
    assert small.retained_bytes <= len(_frame(0)) * 3


def test_the_newest_frame_is_always_kept() -> None:
    log = EventLog(max_events=5, max_bytes=10)
    log.append(b"x" * 100)
    assert log.retained_events == 1 and log.read_after(-1) == [b"x" * 100]


def test_memory_stays_bounded_over_many_appends() -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20)
    for n in range(50_000):
        log.append(_frame(n))
    assert log.retained_events == 100
    assert len(log._frames) < 3000  # the dropped prefix is compacted away


async def test_subscribers_replay_then_follow_live() -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20)
    log.append(_frame(0))
    received: list[list[bytes]] = [[], []]

    async def follow(index: int, starting_after: int) -> None:
        subscription = LogSubscription(log, starting_after)
        while frames := await subscription.receive_frames():
            received[index].extend(frames)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow, 0, -1)
        nursery.start_soon(follow, 1, 1)
        await trio.testing.wait_all_tasks_blocked()
        for n in range(1, 6):
            log.append(_frame(n))
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(6))
        log.close()
    assert received[0] == [_frame(n) for n in range(7)]
    assert received[1] == [_frame(n) for n in range(2, 7)]


async def test_one_wake_up_takes_everything_appended() -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20)
    subscription = LogSubscription(log, -1)
    batches: list[int] = []

    async def follow() -> None:
        while frames := await subscription.receive_frames():
            batches.append(len(frames))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.testing.wait_all_tasks_blocked()
        for n in range(50):
            log.append(_frame(n))
        log.close()
    assert batches == [50]


async def test_subscription_iterates_decoded_events() -> None:
    log = EventLog(max_events=10, max_bytes=1 << 20)
    for n in range(3):
        log.append(_frame(n))
    log.close()
    events = [event async for event in LogSubscription(log, 0)]
    assert [e["sequence_number"] for e in events] == [1, 2]


def test_reads_can_be_limited_by_bytes() -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20)
    frames = [b"x" * size for size in (10, 20, 30, 40, 50)]
    for frame in frames:
        log.append(frame)
    assert log.read_after(-1, max_bytes=30) == frames[:2]
    assert log.read_after(-1, max_bytes=31) == frames[:3]
    assert log.read_after(1, max_bytes=1) == frames[2:3]
    assert log.read_after(1, max_bytes=1000) == frames[2:]
    assert log.read_after(4, max_bytes=10) == []
