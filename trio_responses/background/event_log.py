"""A response's event log: a bounded ring of encoded SSE frames, read by cursors.

One producer appends frames (each encoded once); any number of subscribers
read from their own cursor, replaying what the ring still holds and then
following live. The producer never waits: appending is synchronous and a
subscriber that falls behind the ring's tail is told so (`SubscriberLagged`)
instead of slowing anyone down. Memory is the ring (at most ``max_events``
frames and ``max_bytes`` bytes, the newest frame always kept), whatever the
number of subscribers.

Wake-ups are cheap and bounded. Waiting subscribers park in one FIFO per log
(no per-reader event or timer); an append wakes them only if someone is
parked, and a subscriber busy writing its previous batch is not parked, so it
is not woken again: it takes everything available when it comes back. A
wake-up unparks at most `WAKE_WAVE` readers at once; each reader it wakes
unparks one more as it runs, so a log with thousands of readers wakes them in
waves of bounded size, one scheduler pass after another, and the producer (and
every other task) keeps running between the waves. Readers later in the wave
find more frames waiting and take them in one write.

With a flush window (``flush_s`` > 0, ``--stream-flush-ms``) and more than one
reader (fan-out), parked readers are woken at most once per window: an append
that comes less than ``flush_s`` after the previous wake-up is held until the
window ends, so a fast producer's frames reach each reader in fewer, larger
writes. An append after a quiet window (the first event included) wakes at
once, and `close` wakes every reader at once (the terminal event is the last
append before it), so neither is ever held. A lone reader (a foreground stream)
is never held: it batches by itself whenever the producer is faster than its
writes, and holding would only add latency and a timer per event. The window's
timer is a single deadline per log, carried by one parked reader (the
*leader*, the first to park after a wake-up): when it expires the leader wakes
the others. A leader that leaves early (cancelled) does the same on its way out
rather than strand held frames. Ordering and cursors are unaffected: waking
only decides when parked readers look.

A reader may also park *with a direct taker* (``wait_after(cursor,
direct=...)``): an append then first offers it the new frames, synchronously,
in the producer's task (at most `WAKE_WAVE` such offers per append, oldest
readers first); if it takes them (an HTTP/1.1 stream whose socket accepts them
at once writes them right there) the reader stays parked, with no wake-up and
no task switch per event. Readers that did not take them, and whoever waits
without subscribing (the job's recorder), are woken as usual. While the flush
window holds appends (a fast producer, several readers), nothing is offered:
everyone takes the held frames when the window ends, in one write.

The frames one engine step makes for a response (often several: an item's last
delta and end, the next item's start) are appended in a batch (`batched`): the
readers are offered or woken once, when it ends, so a reader that takes them
directly writes them in one write, not the first alone and the rest after a
wake-up.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar, final

import trio

T = TypeVar("T")

WAKE_WAVE = 64
"""Most parked readers one wake-up reschedules at once (the rest follow in waves)."""


class SubscriberLagged(Exception):
    """The subscriber's next event was dropped from the ring before it read it."""

    def __init__(self, wanted: int, oldest: int) -> None:
        super().__init__(
            f"the client fell behind: event {wanted} is no longer retained "
            f"(oldest retained is {oldest})"
        )
        self.wanted = wanted
        self.oldest = oldest


@final
class EventLog:
    """Bounded, append-only log of SSE frames numbered 0, 1, 2…"""

    __slots__ = (
        "_appended_bytes",
        "_batching",
        "_bytes",
        "_closed",
        "_ends",
        "_first",
        "_flush_s",
        "_frames",
        "_head",
        "_held",
        "_last_wake",
        "_leader",
        "_max_bytes",
        "_max_events",
        "_parked",
        "_takers",
        "_unannounced",
        "_wakes",
        "finished_at",
        "subscribers",
    )

    def __init__(self, *, max_events: int, max_bytes: int, flush_s: float = 0.0) -> None:
        """``flush_s``: the flush window in seconds (0: wake readers on every append).

        Raises:
            ValueError: ``max_events`` or ``max_bytes`` < 1, or ``flush_s`` < 0.
        """
        if max_events < 1 or max_bytes < 1:
            raise ValueError("max_events and max_bytes must be >= 1")
        if not flush_s >= 0:
            raise ValueError("flush_s must be >= 0")
        self._flush_s = flush_s
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._frames: list[bytes] = []
        self._ends: list[int] = []  # _ends[i]: bytes appended up to and including _frames[i]
        self._appended_bytes = 0
        self._head = 0  # index in _frames of the oldest retained frame
        self._first = 0  # sequence number of _frames[_head]
        self._bytes = 0
        self._closed = False
        # Parked readers, oldest first, with the wake-up count when each parked.
        self._parked: OrderedDict[trio.lowlevel.Task, int] = OrderedDict()
        self._wakes = 0
        self._held = False  # frames appended since the last wake-up wait for the window
        self._leader: trio.CancelScope | None = None  # the parked reader timing the window
        self._last_wake = -float("inf")
        # Readers parked with a direct taker (see the module docstring), oldest first.
        self._takers: dict[trio.lowlevel.Task, Callable[[], bool]] = {}
        self._batching = False  # in `batched`: appends are announced when it returns
        self._unannounced = False  # frames appended in this batch
        self.finished_at: float | None = None
        self.subscribers = 0
        """Open `Subscription` objects reading this log."""

    # -- producer ------------------------------------------------------------------

    def append(self, frame: bytes) -> None:
        """Add the next frame. Never blocks; may drop the oldest frames."""
        if self._closed:
            raise RuntimeError("append() after close()")
        self._frames.append(frame)
        self._appended_bytes += len(frame)
        self._ends.append(self._appended_bytes)
        self._bytes += len(frame)
        self._trim()
        if self._batching:
            self._unannounced = True
        elif self._parked:
            self._announce()

    def batched(self, produce: Callable[[T], None], value: T) -> None:
        """``produce(value)``, whose appends reach the readers together when it
        returns: one offer to each direct taker (one write) and one wake-up, not
        one per frame. An engine step's tokens often make several events (an
        item's end, the next one's start); the producer's other appends (the
        response's lifecycle events) go on as they come.
        """
        if self._batching:
            produce(value)
            return
        self._batching = True
        try:
            produce(value)
        finally:
            self._batching = False
            if self._unannounced:
                self._unannounced = False
                if self._parked and not self._closed:
                    self._announce()

    def _announce(self) -> None:
        """New frames for the parked readers (some are): offer them to direct
        takers, wake the rest."""
        parked = self._parked
        served = self._give() if self._takers and not self._holding() else None
        if not served:
            self._notify()
        elif len(served) < len(parked):
            # Wake the others (readers that did not take, the job's recorder,
            # which waits without subscribing) but not the readers served.
            for task in served:
                del parked[task]
            self._notify()
            wakes = self._wakes
            for task in served:
                parked[task] = wakes  # as if parked after this wake-up

    def close(self) -> None:
        """No more frames: readers finish once they have read everything."""
        if not self._closed:
            self._closed = True
            self.finished_at = trio.current_time()
            self._wake(everyone=True)

    # -- state ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def next_sequence_number(self) -> int:
        """The number the next appended frame gets (= frames appended so far)."""
        return self._first + len(self._frames) - self._head

    @property
    def oldest_sequence_number(self) -> int:
        """Number of the oldest frame still retained."""
        return self._first

    @property
    def retained_events(self) -> int:
        return len(self._frames) - self._head

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    # -- readers -------------------------------------------------------------------------

    def read_after(self, cursor: int, max_bytes: int | None = None) -> list[bytes]:
        """Frames with sequence number > ``cursor`` (maybe none).

        With ``max_bytes``, stops once that many bytes are taken (but always
        takes at least one frame when there is one).

        Raises:
            SubscriberLagged: frame ``cursor + 1`` was already dropped.
        """
        wanted = cursor + 1
        if wanted < self._first:
            raise SubscriberLagged(wanted, self._first)
        frames = self._frames
        start = self._head + (wanted - self._first)
        if max_bytes is None or start >= len(frames):
            return frames[start:]
        ends = self._ends
        # The first frame whose end reaches the budget is the last one taken.
        budget = ends[start] - len(frames[start]) + max_bytes
        end = bisect_left(ends, budget, start) + 1
        return frames[start:end]

    @property
    def flush_s(self) -> float:
        """The flush window in seconds (0: none)."""
        return self._flush_s

    async def wait_after(self, cursor: int, direct: Callable[[], bool] | None = None) -> None:
        """Wait until there is a frame after ``cursor`` or the log is closed.

        With a flush window, a frame appended within the window after the
        previous wake-up is seen once the window ends (at most ``flush_s``
        later); the terminal event never waits.

        ``direct``: while parked, appends may call it (synchronously, in the
        appending task; at most `WAKE_WAVE` readers per append, oldest first);
        when it returns True it has taken the new frames itself and this wait
        goes on. It must not raise. So this may return with nothing after
        ``cursor``: the caller checks what it has read since. While the flush
        window holds appends, nothing is offered: the window decides for all.

        Cancellation: safe; nothing is consumed by waiting.
        """
        task = trio.lowlevel.current_task()
        while not self._closed and self.next_sequence_number <= cursor + 1:
            if direct is not None:
                self._takers[task] = direct
            try:
                if self._flush_s <= 0 or self._leader is not None or self.subscribers <= 1:
                    await self._park()
                else:
                    await self._lead()
            finally:
                if direct is not None:
                    del self._takers[task]
            self._unpark(1)  # pass the wake-up on: the next reader of this wave
            if direct is not None:
                return  # frames may have been taken meanwhile: the caller looks

    # -- internals -------------------------------------------------------------------------

    def _holding(self) -> bool:
        """Appends are being held for the flush window (see `_notify`)."""
        return self._leader is not None and trio.current_time() < self._last_wake + self._flush_s

    def _give(self) -> list[trio.lowlevel.Task]:
        """Offer the new frames to parked readers with takers: at most `WAKE_WAVE`
        offers per append, oldest first. Returns the readers that took them."""
        parked = self._parked
        served: list[trio.lowlevel.Task] = []
        offers = WAKE_WAVE
        for task, take in self._takers.items():
            if task in parked:
                if take():
                    served.append(task)
                offers -= 1
                if not offers:
                    break
        return served

    async def _park(self) -> None:
        """Wait for `_wake` (or cancellation) in the FIFO of parked readers."""
        task = trio.lowlevel.current_task()
        parked = self._parked
        parked[task] = self._wakes

        def abort(_: object) -> trio.lowlevel.Abort:
            del parked[task]
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _lead(self) -> None:
        """Park as the reader that times the flush window; wake everyone when it ends."""
        with trio.CancelScope() as window:
            if self._held:  # frames were held while no reader led
                window.deadline = self._last_wake + self._flush_s
            self._leader = window
            try:
                await self._park()
            finally:
                # Still the leader: the window ended, or this reader is leaving
                # (cancelled). Either way, nobody else times the held frames.
                if self._leader is window:
                    self._leader = None
                    if self._held:
                        self._wake()

    def _notify(self) -> None:
        """Wake parked readers now, or hold the append until the window ends."""
        leader = self._leader
        if leader is not None:
            due = self._last_wake + self._flush_s
            if trio.current_time() < due:
                if not self._held:
                    self._held = True
                    leader.deadline = due
                return
        self._wake()

    def _wake(self, *, everyone: bool = False) -> None:
        """Start a wave: unpark the readers parked before now, `WAKE_WAVE` at a time.

        The window's bookkeeping is reset even when nobody else is parked: a leader
        whose window ended wakes itself, and the held frames are released by that
        (else its next wait would find the window long over, yet frames held, and
        wake at once again and again).
        """
        self._wakes += 1
        self._held = False
        self._leader = None
        if self._flush_s > 0:
            self._last_wake = trio.current_time()
        if self._parked:
            self._unpark(len(self._parked) if everyone else WAKE_WAVE)

    def _unpark(self, count: int) -> None:
        """Reschedule up to ``count`` readers that parked before the latest wake-up."""
        parked = self._parked
        wakes = self._wakes
        while count and parked:
            task = next(iter(parked))
            if parked[task] >= wakes:  # parked after it: already saw the newest frames
                return
            del parked[task]
            trio.lowlevel.reschedule(task)
            count -= 1

    def _trim(self) -> None:
        frames = self._frames
        while len(frames) - self._head > 1 and (
            len(frames) - self._head > self._max_events or self._bytes > self._max_bytes
        ):
            self._bytes -= len(frames[self._head])
            frames[self._head] = b""
            self._head += 1
            self._first += 1
        # Compact once the dropped prefix dominates: amortised O(1) per frame.
        if self._head > 1024 and self._head * 2 > len(frames):
            del frames[: self._head]
            del self._ends[: self._head]
            self._head = 0
