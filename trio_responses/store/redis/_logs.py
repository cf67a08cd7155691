"""Event logs (one Redis Stream per background response) and the replicas' control streams."""

from __future__ import annotations

import logging
import math
import os
import socket
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NoReturn, final

import trio
from coredis.response.types import StreamEntry
from coredis.tokens import PureToken

from ..._principal import Principal
from ...background.event_log import EventLog, SubscriberLagged
from ...background.subscription import ReaderSubscription, Subscription
from ...protocol.builder import terminal_frame
from ...protocol.codec import decode_json, is_terminal_frame, split_frames
from ..base import (
    CancelHandler,
    LogStatistics,
    StoredResponse,
    StoreError,
    encoded,
)
from ._client import (
    _BLOCK_MS,
    _REBUILDS,
    _RETAINED_KEYS,
    _control_key,
    _entry_id,
    _io,
    _lease_key,
    _log_key,
    _meta_key,
    _ms,
    _raw,
    _Redis,
    _text,
)

logger = logging.getLogger("trio_responses.store.redis")

_RETRY_MAX_S = 5.0

_RETRY_FIRST_S = 0.05

_CONTROL_MAXLEN = 1_000

_READ_BYTES = 1 << 18
"""Most bytes of frames one read hands out (at least one frame): one SSE write's worth."""

_READ_ENTRIES = 1_024
"""Most stream entries one read fetches (it stops at `_READ_BYTES` well before, unless
the entries are tiny)."""

_ENTRY_BYTES = 1 << 16
"""Most bytes of frames in one stream entry (at least one frame): a larger `append`
batch becomes several entries, so that no read fetches much more than it hands out."""


def _split(entry: StreamEntry) -> tuple[int, list[bytes]]:
    """The first sequence number and the frames of one stream entry."""
    fields = entry.field_values
    first = int(fields[b"f"])
    raw_id = _raw(entry.identifier)
    try:
        frames = split_frames(_raw(fields[b"d"]))
    except ValueError:
        frames = []
    if not frames or int(raw_id.partition(b"-")[2]) != first + len(frames):
        raise StoreError(f"The response store holds a damaged event log entry ({raw_id!r}).")
    return first, frames


def _frames_after(entries: Sequence[StreamEntry], cursor: int) -> list[bytes]:
    """The frames after ``cursor`` in ``entries``, contiguous from ``cursor + 1``.

    Raises:
        SubscriberLagged: frame ``cursor + 1`` is not there (trimmed, or a hole
            the producer left when it fell behind).
    """
    wanted = cursor + 1
    frames: list[bytes] = []
    for entry in entries:
        first, batch = _split(entry)
        if first + len(batch) <= wanted:
            continue  # all at or before the cursor
        if first > wanted:
            if frames:
                break  # hand out what is contiguous; the next read reports the hole
            raise SubscriberLagged(wanted, first)
        frames.extend(batch[wanted - first :])
        wanted = first + len(batch)
    return frames


def _entries_of(frames: Sequence[bytes], first: int) -> list[str | bytes | int]:
    """`_APPEND`'s entries of frames ``first …``: (first, next, data) for each run of
    frames within `_ENTRY_BYTES` (at least one frame), flattened."""
    flat: list[str | bytes | int] = []
    start, size = 0, 0
    for index, frame in enumerate(frames):
        if index > start and size + len(frame) > _ENTRY_BYTES:
            flat += [first + start, first + index, b"".join(frames[start:index])]
            start, size = index, 0
        size += len(frame)
    flat += [first + start, first + len(frames), b"".join(frames[start:])]
    return flat


def _entries(flat: Sequence[Any]) -> list[StreamEntry]:
    """Stream entries from a script's reply: id, fields, id, fields, ..."""
    return [
        StreamEntry(
            identifier=flat[index],
            field_values=OrderedDict(zip(flat[index + 1][::2], flat[index + 1][1::2], strict=True)),
        )
        for index in range(0, len(flat), 2)
    ]


@final
class _LogReader:
    """Implements `LogReader` over one log's stream (`RedisEventLogs.open`).

    Each read takes at most `_READ_BYTES` of frames (at least one) in one script
    that also reads the log's meta; only when nothing follows the cursor does it
    wait for the writer, in ``XREAD BLOCK``, which hands out the one entry it
    wakes up to (written in the last moments) whole.
    """

    def __init__(self, redis: _Redis, response_id: str, done: int | None) -> None:
        self._redis = redis
        self._log = _log_key(response_id)
        self._meta = _meta_key(response_id)
        self._done = done

    async def read_after(self, cursor: int) -> list[bytes]:
        if self._done is not None and cursor >= self._done:
            await trio.lowlevel.checkpoint()
            return []
        reply = await self._redis.call(
            self._redis.read,
            keys=[self._log, self._meta],
            args=[cursor + 1, _READ_BYTES, _READ_ENTRIES],
        )
        done, exists = reply[0], int(reply[1])
        entries = _entries(reply[2:])
        if done is not None:
            self._done = int(done)
        if not entries:
            if self._done is not None:
                if cursor >= self._done:
                    return []
                # Complete, yet what follows the cursor is gone (trimmed meanwhile).
                raise SubscriberLagged(cursor + 1, self._done + 1)
            if not exists:
                self._done = cursor  # deleted or expired: nothing more will come
                return []
            entries = await self._follow(_entry_id(cursor + 1))
            if not entries:
                # Quiet for a while: finished meanwhile (without a frame for this
                # reader), deleted, or expired? Otherwise the caller asks again.
                owner, done = await _io(self._redis.commands.hmget(self._meta, ["owner", "done"]))
                if done is not None:
                    self._done = int(done)
                elif owner is None:
                    self._done = cursor  # the log is gone: nothing more will come
                return []
        frames = _frames_after(entries, cursor)
        if frames and is_terminal_frame(frames[-1]):
            self._done = cursor + len(frames)
        return frames

    async def _follow(self, after: str) -> list[StreamEntry]:
        """The next entry after ``after``, once the writer adds it (``[]`` after a while).

        On the blocking client; if cancelled, coredis drops its connection (the
        reply can never reach another command) and our pool recycles the slot. One
        entry (a batch written within the last moments) keeps the read bounded.
        """
        reply = await _io(self._redis.blocking.xread({self._log: after}, count=1, block=_BLOCK_MS))
        return list(reply.get(self._log.encode(), ())) if reply else []

    def complete_through(self) -> int | None:
        return self._done

    def close(self) -> None:
        pass  # holds nothing between reads


@final
class RedisEventLogs:
    """Implements `EventLogStore` with one Redis Stream per response (live)."""

    live = True
    # Readers on other replicas follow the log: a few milliseconds of gathering keep
    # them close behind while a fast producer still writes one entry per window.
    write_interval_s = 0.005

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        config = redis.config
        self._replay_events = config.replay_events
        self._safety_ttl_ms = _ms(config.store_ttl_s)
        self._retained = redis.retained

    async def append(
        self, response_id: str, frames: Sequence[bytes], *, first: int, owner: str | None
    ) -> None:
        if not frames:
            await trio.lowlevel.checkpoint()
            return
        after = first + len(frames)  # the next sequence number once these are stored
        min_id = after - self._replay_events + 1  # entries below hold only older events
        entries = _entries_of(frames, first)
        stored = await self._redis.run(
            self._redis.append,
            keys=[_log_key(response_id), _meta_key(response_id)],
            args=[
                encoded(owner),
                _entry_id(min_id) if min_id > 1 else "",
                # A log whose job dies unnoticed still goes, eventually.
                self._safety_ttl_ms,
                after - 1 if is_terminal_frame(frames[-1]) else "",
                *entries,
            ],
        )
        if stored:  # not a retried call
            self._retained.appended(response_id, sum(map(len, frames)))

    async def finish(self, response_id: str, log: EventLog, *, owner: str | None) -> None:
        """Set the log's retention and index it in ``retained``, in the script that
        evicts the oldest finished logs beyond the count and byte limits."""
        # The frames are in Redis already (`append`); `log` is the in-process copy.
        await self._redis.run(
            self._redis.finish,
            keys=[_log_key(response_id), _meta_key(response_id), *_RETAINED_KEYS],
            args=[response_id, *self._redis.bounds],
        )
        self._retained.running.pop(response_id, None)

    async def open(
        self, response_id: str, *, owner: str | None, starting_after: int
    ) -> Subscription | None:
        stored_owner, written, done, head = await self._redis.call(
            self._redis.open, keys=[_log_key(response_id), _meta_key(response_id)], args=[]
        )
        if stored_owner is None or written is None:
            return None
        if not Principal(owner).may_see(decode_json(stored_owner)):
            return None
        oldest = int(head) if head is not None else int(written)
        if starting_after + 1 < oldest:
            raise SubscriberLagged(starting_after + 1, oldest)
        reader = _LogReader(self._redis, response_id, None if done is None else int(done))
        return ReaderSubscription(reader, starting_after)

    async def terminate(self, record: StoredResponse) -> None:
        redis = self._redis
        for _ in range(_REBUILDS):
            end = await redis.log_end(record.id)
            if end is None:
                return  # no log, or it has its terminal event
            ended = await redis.run(
                redis.terminate,
                keys=[_log_key(record.id), _meta_key(record.id), *_RETAINED_KEYS],
                args=[record.id, str(end), terminal_frame(record.response, end), *redis.bounds],
            )
            if ended != -1:
                return
        raise StoreError(f"The event log of {record.id} keeps changing; it was not ended.")

    async def delete(self, response_id: str, *, owner: str | None) -> None:
        await self._redis.run(
            self._redis.delete_log,
            keys=[_log_key(response_id), _meta_key(response_id), *_RETAINED_KEYS],
            args=[response_id, *self._redis.bounds],
        )
        self._retained.running.pop(response_id, None)

    async def expire(self) -> int:
        """Forget, in ``retained``, the logs their TTL removed; returns how many."""
        return await self._redis.run(
            self._redis.expire_logs, keys=list(_RETAINED_KEYS), args=self._redis.bounds
        )

    def statistics(self) -> LogStatistics:
        """The finished logs of all replicas, as the last script that changed their
        index reported them, plus the logs this process is writing.

        Approximate: other replicas' finishes since, and per-log trimming while
        running, are not counted.
        """
        return self._retained.statistics()


@final
class RedisControl:
    """Implements `Control`: a lease per replica and a control stream of cancel messages."""

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        self.replica = redis.replica
        config = redis.config
        self._lease_ms = _ms(config.job_lease_s)
        self._beat_s = config.job_lease_s / 3
        self._control_ttl_ms = _ms(max(60.0, 3 * config.job_lease_s))
        self._cleanup_s = config.cleanup_timeout_s
        self._lease = _lease_key(self.replica)
        self._control = _control_key(self.replica)
        self._lease_value = f"{socket.gethostname()}:{os.getpid()}"

    async def run(
        self,
        on_cancel: CancelHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Heartbeat the lease and deliver cancel messages, until cancelled.

        Reports started once the lease is set. Messages are read from the start
        of this replica's control stream (new with the replica id), so none sent
        after that is missed. Backend errors are logged and retried with backoff;
        on cancellation the lease is removed so others may recover at once.
        """
        started = False
        last_id = "0-0"
        next_beat = trio.current_time()
        delay = _RETRY_FIRST_S
        try:
            while True:
                try:
                    if trio.current_time() >= next_beat:
                        await self._beat(first=not started)
                        next_beat = trio.current_time() + self._beat_s
                        if not started:
                            started = True
                            task_status.started()
                    wait_ms = math.ceil((next_beat - trio.current_time()) * 1000)
                    reply = await _io(
                        self._redis.blocking.xread(
                            {self._control: last_id},
                            count=100,
                            block=min(_BLOCK_MS, max(1, wait_ms)),
                        )
                    )
                    for entry in (reply or {}).get(self._control.encode(), ()):
                        last_id = _text(entry.identifier)
                        response_id = _text(entry.field_values[b"id"])
                        try:
                            on_cancel(response_id)
                        except Exception:
                            logger.exception("cancel handler failed for %s", response_id)
                    delay = _RETRY_FIRST_S
                except StoreError as error:
                    logger.warning("control loop: %s; retrying in %.2f s", error, delay)
                    await trio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX_S)
        finally:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + self._cleanup_s
                try:
                    await _io(self._redis.commands.delete([self._lease, self._control]))
                except StoreError as error:
                    logger.warning("could not remove this replica's lease: %s", error)

    async def _beat(self, *, first: bool) -> None:
        commands = self._redis.commands
        if not first:
            refreshed = await _io(
                commands.set(
                    self._lease, self._lease_value, px=self._lease_ms, condition=PureToken.XX
                )
            )
            if refreshed:
                return
            logger.warning(
                "replica %s: its lease expired before this heartbeat; other replicas may "
                "have ended its responses as server_restarted",
                self.replica,
            )
        await _io(commands.set(self._lease, self._lease_value, px=self._lease_ms))

    async def request_cancel(self, record: StoredResponse) -> bool:
        replica = record.replica
        if not replica:
            await trio.lowlevel.checkpoint()
            return False
        sent = await self._redis.run(
            self._redis.request_cancel,
            keys=[_lease_key(replica), _control_key(replica)],
            args=[record.id, _CONTROL_MAXLEN, self._control_ttl_ms],
        )
        return bool(sent)
