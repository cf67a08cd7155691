"""The event log: bounded ring, cursors, batched wake-ups, the flush window."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_responses.background.event_log import WAKE_WAVE, EventLog, SubscriberLagged
from trio_responses.background.subscription import LogSubscription
from trio_responses.protocol.codec import encode_event


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


# -- wake-ups: waves and the flush window -------------------------------------------


class _Reader:
    """Follows a log, noting the (time, frames) of every batch it receives."""

    def __init__(self, log: EventLog, starting_after: int = -1) -> None:
        self.subscription = LogSubscription(log, starting_after)
        self.batches: list[tuple[float, list[bytes]]] = []
        self.ended = trio.Event()

    async def run(self) -> None:
        while frames := await self.subscription.receive_frames():
            self.batches.append((trio.current_time(), frames))
        self.ended.set()

    @property
    def frames(self) -> list[bytes]:
        return [frame for _, batch in self.batches for frame in batch]


async def test_many_readers_are_woken_in_bounded_waves_and_all_get_every_frame() -> None:
    log = EventLog(max_events=1000, max_bytes=1 << 20)
    readers = [_Reader(log) for _ in range(5 * WAKE_WAVE + 3)]
    async with trio.open_nursery() as nursery:
        for reader in readers:
            nursery.start_soon(reader.run)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(0))
        # One wake-up reschedules one wave, not every reader.
        assert len(log._parked) == len(readers) - WAKE_WAVE
        await trio.testing.wait_all_tasks_blocked()
        assert all(reader.frames == [_frame(0)] for reader in readers)
        for n in range(1, 20):
            log.append(_frame(n))
            await trio.lowlevel.checkpoint()  # the producer keeps running between waves
        log.close()
    for reader in readers:
        assert reader.frames == [_frame(n) for n in range(20)]
        assert reader.ended.is_set()
    # Readers later in a wave found several frames waiting and took them at once.
    assert sum(len(reader.batches) for reader in readers) < len(readers) * 20


async def test_flush_window_holds_fast_appends_for_one_bounded_wake_up(
    mock_clock: trio.testing.MockClock,
) -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20, flush_s=0.005)
    readers = [_Reader(log) for _ in range(3)]
    async with trio.open_nursery() as nursery:
        for reader in readers:
            nursery.start_soon(reader.run)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(0))  # the first event: at once
        await trio.testing.wait_all_tasks_blocked()
        assert all(reader.batches == [(0.0, [_frame(0)])] for reader in readers)

        mock_clock.jump(0.001)
        log.append(_frame(1))
        log.append(_frame(2))
        await trio.testing.wait_all_tasks_blocked()
        assert all(len(reader.batches) == 1 for reader in readers)  # held
        mock_clock.jump(0.004)  # the window ends 5 ms after the previous wake-up
        await trio.testing.wait_all_tasks_blocked()
        for reader in readers:
            assert reader.batches[1] == (pytest.approx(0.005), [_frame(1), _frame(2)])

        mock_clock.jump(0.1)  # a quiet window: the next event goes at once
        log.append(_frame(3))
        await trio.testing.wait_all_tasks_blocked()
        for reader in readers:
            assert reader.batches[2] == (pytest.approx(0.105), [_frame(3)])
        log.close()
    assert all(reader.frames == [_frame(n) for n in range(4)] for reader in readers)


async def test_a_lone_reader_is_never_held(mock_clock: trio.testing.MockClock) -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20, flush_s=10.0)
    reader = _Reader(log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.run)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(0))
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(0.001)
        log.append(_frame(1))  # within the window, but nobody else to coalesce for
        await trio.testing.wait_all_tasks_blocked()
        assert reader.batches == [(0.0, [_frame(0)]), (pytest.approx(0.001), [_frame(1)])]
        log.close()


async def test_a_leader_alone_waits_quietly_after_its_window_ends(
    mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two readers, one busy elsewhere: when the window ends the waiting one (the
    # leader) wakes itself; its next wait must park until the next append, not wake
    # over and over.
    log = EventLog(max_events=100, max_bytes=1 << 20, flush_s=0.005)
    busy = LogSubscription(log, -1)  # open, not reading
    waits = 0
    lead = EventLog._lead

    async def counted(self: EventLog) -> None:
        nonlocal waits
        waits += 1
        await lead(self)

    monkeypatch.setattr(EventLog, "_lead", counted)
    reader = _Reader(log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.run)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(0))
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(0.001)
        log.append(_frame(1))  # held: within the window
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(0.004)  # the window ends: the reader takes frame 1
        for _ in range(100):
            await trio.lowlevel.checkpoint()
        assert reader.frames == [_frame(0), _frame(1)]
        assert waits <= 4, f"the reader woke {waits} times with nothing to read"
        log.close()
    busy.close()


async def test_the_terminal_event_is_never_held(mock_clock: trio.testing.MockClock) -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20, flush_s=10.0)
    reader = _Reader(log)
    other = LogSubscription(log, -1)  # a second reader (busy elsewhere): fan-out
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.run)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(0))
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(0.001)
        log.append(_frame(1))
        await trio.testing.wait_all_tasks_blocked()
        assert len(reader.batches) == 1  # held by the (long) window
        log.append(_frame(2))  # the terminal event, then close, as `Job.finish` does
        log.close()
        await trio.testing.wait_all_tasks_blocked()
        assert reader.ended.is_set()
    other.close()
    assert reader.batches[1] == (pytest.approx(0.001), [_frame(1), _frame(2)])


async def test_zero_window_wakes_readers_on_every_append(
    mock_clock: trio.testing.MockClock,
) -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20, flush_s=0)
    reader = _Reader(log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.run)
        for n in range(3):
            await trio.testing.wait_all_tasks_blocked()
            log.append(_frame(n))
        await trio.testing.wait_all_tasks_blocked()
        log.close()
    assert reader.batches == [(0.0, [_frame(n)]) for n in range(3)]


async def test_a_leader_leaving_early_does_not_strand_held_frames(
    mock_clock: trio.testing.MockClock,
) -> None:
    log = EventLog(max_events=100, max_bytes=1 << 20, flush_s=10.0)
    received: list[tuple[float, list[bytes]]] = []

    async def lead(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        # Parks again at once after each batch: the first to park leads the window.
        with trio.CancelScope() as scope:
            task_status.started(scope)
            subscription = LogSubscription(log, -1)
            while await subscription.receive_frames():
                pass

    async def follow() -> None:  # parks one scheduler pass later: it only waits
        subscription = LogSubscription(log, -1)
        while frames := await subscription.receive_frames():
            received.append((trio.current_time(), frames))
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        leader: trio.CancelScope = await nursery.start(lead)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(follow)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(0))  # at once: the first event
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1.0)
        log.append(_frame(1))  # held: the window runs until 10 s
        await trio.testing.wait_all_tasks_blocked()
        assert received == [(0.0, [_frame(0)])]
        leader.cancel()  # the leader's client went away: the held frame goes now
        await trio.testing.wait_all_tasks_blocked()
        assert received == [(0.0, [_frame(0)]), (1.0, [_frame(1)])]
        log.close()


async def test_a_lone_reader_can_take_frames_without_waking() -> None:
    """A reader parked with a taker gets each append handed to it in the appending
    task; it wakes only when the taker asks to (or at the end). A task that waits
    without subscribing (like the job's recorder) is still woken."""
    log = EventLog(max_events=100, max_bytes=1 << 20)
    subscription = LogSubscription(log, -1)
    taken: list[bytes] = []
    answers: list[tuple[int, bool]] = []
    returned: list[list[bytes]] = []
    recorder_woken = trio.Event()

    def take(frames: list[bytes]) -> tuple[int, bool]:
        taken.extend(frames)
        return answers.pop(0) if answers else (len(frames), True)

    async def reader() -> None:
        while not subscription.closed:
            returned.append(await subscription.receive_frames_or_give(take))

    async def recorder() -> None:
        await log.wait_after(-1)
        recorder_woken.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        nursery.start_soon(recorder)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(0))
        log.append(_frame(1))
        await trio.testing.wait_all_tasks_blocked()
        assert taken == [_frame(0), _frame(1)]
        assert returned == []  # never woken: it had nothing to do
        assert subscription.cursor == 1
        assert recorder_woken.is_set()

        answers.append((0, False))  # the socket takes nothing now: wake the reader
        log.append(_frame(2))
        await trio.testing.wait_all_tasks_blocked()
        assert returned == [[_frame(2)]]  # it read the frame itself

        answers.append((1, False))  # taken, but the reader has a write to finish
        log.append(_frame(3))
        await trio.testing.wait_all_tasks_blocked()
        assert returned[-1] == [] and not subscription.closed and subscription.cursor == 3

        # A second reader, without a taker: it is woken; the first still takes.
        second = LogSubscription(log, 3)
        seconds: list[list[bytes]] = []

        async def read_second() -> None:
            seconds.append(await second.receive_frames())

        nursery.start_soon(read_second)
        await trio.testing.wait_all_tasks_blocked()
        log.append(_frame(4))
        await trio.testing.wait_all_tasks_blocked()
        assert taken[-1] == _frame(4) and returned[-1] == []
        assert seconds == [[_frame(4)]]
        second.close()

        log.close()
    assert returned[-1] == [] and subscription.closed


async def test_takers_are_offered_at_most_a_wave_per_append() -> None:
    """With more readers taking than `WAKE_WAVE`, an append offers the frame to the
    oldest `WAKE_WAVE`; the others are woken and read it themselves."""
    log = EventLog(max_events=100, max_bytes=1 << 20)
    count = WAKE_WAVE + 5
    offered = [0] * count
    woken = [0] * count

    async def reader(n: int) -> None:
        subscription = LogSubscription(log, -1)

        def take(frames: list[bytes]) -> tuple[int, bool]:
            offered[n] += 1
            return len(frames), True

        while not subscription.closed:
            if await subscription.receive_frames_or_give(take):
                woken[n] += 1

    async with trio.open_nursery() as nursery:
        for n in range(count):
            nursery.start_soon(reader, n)
            await trio.testing.wait_all_tasks_blocked()  # park in order
        log.append(_frame(0))
        await trio.testing.wait_all_tasks_blocked()
        assert offered == [1] * WAKE_WAVE + [0] * 5
        assert woken == [0] * WAKE_WAVE + [1] * 5
        log.close()


async def test_frames_appended_in_a_batch_reach_readers_together() -> None:
    """What `EventLog.batched` appends is offered to a taker once, in one list, and
    wakes a reader without one once; appends after it are offered as they come."""
    log = EventLog(max_events=100, max_bytes=1 << 20)
    subscription = LogSubscription(log, -1)
    offers: list[list[bytes]] = []
    woken: list[list[bytes]] = []

    def take(frames: list[bytes]) -> tuple[int, bool]:
        offers.append(list(frames))
        return len(frames), True

    async def taker() -> None:
        while not subscription.closed:
            await subscription.receive_frames_or_give(take)

    async def reader() -> None:
        follower = LogSubscription(log, -1)
        while frames := await follower.receive_frames():
            woken.append(frames)

    offered_meanwhile: list[int] = []

    def step(numbers: range) -> None:
        for n in numbers:
            log.append(_frame(n))
            offered_meanwhile.append(len(offers))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(taker)
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        log.batched(step, range(3))
        assert offered_meanwhile == [0, 0, 0]
        assert offers == [[_frame(0), _frame(1), _frame(2)]]
        await trio.testing.wait_all_tasks_blocked()
        assert woken == [[_frame(0), _frame(1), _frame(2)]]
        log.batched(step, range(3, 3))  # nothing appended: nobody is offered anything
        log.append(_frame(3))
        log.append(_frame(4))
        assert offers[1:] == [[_frame(3)], [_frame(4)]]
        log.close()
    assert subscription.cursor == 4
