"""``memory://``: the state layer inside this process (the default).

Everything is keyed by (owner, id) (`Key`): a lookup as one owner never finds
another's record, conversation or item.

- `MemoryStore`: records in a dict, LRU over finished ones, bounded by count
  and bytes per tenant (`StoreLimits`), with a time to live. Running records are
  never evicted.
- `MemoryEventLogs`: keeps the finished in-process rings of background
  responses (`StreamRetention`), nothing else: a job's readers follow its ring.
- `LocalControl`: every job runs here, so there is nothing to reach.
- `MemoryConversations`: conversations in a dict, LRU per tenant, with a time
  to live; item indexes (`find_item`) kept next to records and conversations.
- `MemoryFiles` (``memory_files.py``): files, containers and their bytes.

Nothing survives the process; one process only.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, NoReturn, final

import trio

from .._config import Config
from ..background.event_log import EventLog, SubscriberLagged
from ..background.retention import StreamRetention
from ..background.subscription import LogSubscription, Subscription
from .base import (
    CancelHandler,
    ConversationFull,
    Key,
    LogStatistics,
    State,
    StoredConversation,
    StoredResponse,
    StoreLimits,
    conversation_bytes,
    encoded,
    measure_record,
)
from .memory_files import MemoryFiles
from .memory_webhooks import MemoryWebhooks
from .webhooks import terminal_event


@final
class _Share:
    """One tenant's finished records, least recently used first, and their bytes."""

    def __init__(self, tenant: str | None) -> None:
        self.tenant = tenant
        self.records: OrderedDict[Key, tuple[float, StoredResponse, int]] = OrderedDict()
        """(owner, response id) -> (expiry time, record, size)."""
        self.bytes = 0

    def add(self, key: Key, record: StoredResponse, expires_at: float, size: int) -> None:
        self.records[key] = (expires_at, record, size)
        self.bytes += size

    def remove(self, key: Key) -> None:
        _, _, size = self.records.pop(key)
        self.bytes -= size


@final
class MemoryStore:
    """Implements `ResponseStore` in memory. Operations never block the event loop
    (a large record is measured in a worker thread)."""

    def __init__(
        self,
        *,
        limits: StoreLimits,
        ttl_s: float = math.inf,
        clock: Callable[[], float] = trio.current_time,
        webhooks: MemoryWebhooks | None = None,
    ) -> None:
        if limits.max_responses < 1 or limits.max_bytes < 1:
            raise ValueError("the store's bounds must be >= 1")
        self._webhooks = webhooks
        """Where a background response's final write puts its event's deliveries."""
        self._limits = limits
        self._ttl = ttl_s
        self._clock = clock
        self._shares: dict[str | None, _Share] = {}
        """Finished records by tenant (a tenant without any has no entry)."""
        self._finished: dict[Key, _Share] = {}
        """The share holding each finished record."""
        self._running: dict[Key, StoredResponse] = {}
        self._items: dict[Key, dict[str, None]] = {}
        """(owner, item id) -> the owner's finished records holding it (oldest first):
        `find_item`."""

    def __len__(self) -> int:
        return len(self._finished) + len(self._running)

    async def put(self, record: StoredResponse) -> None:
        await trio.lowlevel.checkpoint()
        size = 0 if record.running else await measure_record(record)
        key = (record.owner, record.id)
        ended = key not in self._finished  # a finished record is written terminal once
        self._forget(key)
        if record.running:
            self._running[key] = record
            return
        if ended and self._webhooks is not None:
            event = terminal_event(record.response, record.owner, now=time.time())
            if event is not None:
                self._webhooks.enqueue(event, now=time.time())
        tenant = self._limits.tenant(record.owner)
        share = self._shares.get(tenant)
        if share is None:
            share = self._shares[tenant] = _Share(tenant)
        share.add(key, record, self._clock() + self._ttl, size)
        self._finished[key] = share
        for item_id in record.item_ids:
            self._items.setdefault((record.owner, item_id), {})[record.id] = None
        while self._limits.over(len(share.records), share.bytes):
            self._forget(next(iter(share.records)))

    async def get(self, response_id: str, *, owner: str | None) -> StoredResponse | None:
        await trio.lowlevel.checkpoint()
        key = (owner, response_id)
        record = self._running.get(key)
        if record is None:
            share = self._finished.get(key)
            if share is None:
                return None
            expires_at, record, _ = share.records[key]
            if expires_at <= self._clock():
                self._forget(key)
                return None
            share.records.move_to_end(key)
        return record

    async def delete(self, response_id: str, *, owner: str | None) -> bool:
        await trio.lowlevel.checkpoint()
        key = (owner, response_id)
        if key not in self._running and key not in self._finished:
            return False
        self._forget(key)
        return True

    async def expire(self) -> int:
        await trio.lowlevel.checkpoint()
        now = self._clock()
        expired = [
            key
            for share in self._shares.values()
            for key, (expires_at, _, _) in share.records.items()
            if expires_at <= now
        ]
        for key in expired:
            self._forget(key)
        return len(expired)

    def _forget(self, key: Key) -> None:
        """Remove the record, running or finished, if there is one."""
        self._running.pop(key, None)
        share = self._finished.pop(key, None)
        if share is None:
            return
        owner, response_id = key
        for item_id in share.records[key][1].item_ids:
            holders = self._items.get((owner, item_id))
            if holders is not None:
                holders.pop(response_id, None)
                if not holders:
                    del self._items[owner, item_id]
        share.remove(key)
        if not share.records:
            del self._shares[share.tenant]

    async def recover_interrupted(self) -> list[StoredResponse]:
        await trio.lowlevel.checkpoint()
        return []  # nothing outlives the process that ran it

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        for response_id in reversed(list(self._items.get((owner, item_id), ()))):
            record = await self.get(response_id, owner=owner)
            if record is not None and (item := record.item(item_id)) is not None:
                return item
        return None


@final
class _Conversation:
    """One stored conversation: its object, items in order, size, lock."""

    def __init__(self, stored: StoredConversation) -> None:
        self.stored = stored
        self.items: dict[str, dict[str, Any]] = {}
        self.bytes = conversation_bytes(stored.conversation, ())
        self.expires_at = 0.0
        self.holder: str | None = None
        self.lock_until = 0.0


@final
class MemoryConversations:
    """Implements `ConversationStore` in memory: LRU per tenant, with a time to live."""

    def __init__(
        self,
        *,
        limits: StoreLimits,
        ttl_s: float = math.inf,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self._limits = limits
        self._ttl = ttl_s
        self._clock = clock
        self._conversations: dict[Key, _Conversation] = {}
        self._tenants: dict[str | None, OrderedDict[Key, None]] = {}
        """Conversations by tenant, least recently used first."""
        self._items: dict[Key, dict[str, None]] = {}
        """(owner, item id) -> the owner's conversations holding it."""

    def _live(self, conversation_id: str, owner: str | None) -> _Conversation | None:
        """``owner``'s conversation if it is not expired; marks it used."""
        key = (owner, conversation_id)
        conversation = self._conversations.get(key)
        if conversation is None:
            return None
        if conversation.expires_at <= self._clock():
            self._drop(key)
            return None
        self._used(key, conversation)
        return conversation

    def _used(self, key: Key, conversation: _Conversation) -> None:
        conversation.expires_at = self._clock() + self._ttl
        tenant = self._tenants.setdefault(self._limits.tenant(key[0]), OrderedDict())
        tenant[key] = None
        tenant.move_to_end(key)
        size = sum(self._conversations[other].bytes for other in tenant)
        while self._limits.over(len(tenant), size):
            oldest = next(iter(tenant))
            if oldest == key:
                break
            size -= self._conversations[oldest].bytes
            self._drop(oldest)

    def _drop(self, key: Key) -> None:
        conversation = self._conversations.pop(key)
        tenant_key = self._limits.tenant(key[0])
        tenant = self._tenants.get(tenant_key)
        if tenant is not None:
            tenant.pop(key, None)
            if not tenant:
                del self._tenants[tenant_key]
        for item_id in conversation.items:
            self._unindex(key, item_id)

    def _unindex(self, key: Key, item_id: str) -> None:
        owner, conversation_id = key
        holders = self._items.get((owner, item_id))
        if holders is not None:
            holders.pop(conversation_id, None)
            if not holders:
                del self._items[owner, item_id]

    def _add(
        self, key: Key, conversation: _Conversation, items: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        owner, conversation_id = key
        added = []
        for item in items:
            if item["id"] in conversation.items:
                continue
            conversation.items[item["id"]] = item
            conversation.bytes += len(encoded(item).encode())
            self._items.setdefault((owner, item["id"]), {})[conversation_id] = None
            added.append(item)
        return added

    async def create(
        self, conversation: StoredConversation, items: Sequence[dict[str, Any]]
    ) -> None:
        await trio.lowlevel.checkpoint()
        key = (conversation.owner, conversation.id)
        entry = _Conversation(conversation)
        self._conversations[key] = entry
        self._add(key, entry, items)
        self._used(key, entry)

    async def get(self, conversation_id: str, *, owner: str | None) -> StoredConversation | None:
        await trio.lowlevel.checkpoint()
        conversation = self._live(conversation_id, owner)
        return None if conversation is None else conversation.stored

    async def update(
        self, conversation_id: str, metadata: dict[str, str], *, owner: str | None
    ) -> StoredConversation | None:
        await trio.lowlevel.checkpoint()
        conversation = self._live(conversation_id, owner)
        if conversation is None:
            return None
        old = conversation.stored
        conversation.stored = replace(old, conversation={**old.conversation, "metadata": metadata})
        conversation.bytes += conversation_bytes(conversation.stored.conversation, ()) - (
            conversation_bytes(old.conversation, ())
        )
        self._used((owner, conversation_id), conversation)
        return conversation.stored

    async def delete(self, conversation_id: str, *, owner: str | None) -> bool:
        await trio.lowlevel.checkpoint()
        if self._live(conversation_id, owner) is None:
            return False
        self._drop((owner, conversation_id))
        return True

    async def items(
        self, conversation_id: str, *, owner: str | None
    ) -> list[dict[str, Any]] | None:
        await trio.lowlevel.checkpoint()
        conversation = self._live(conversation_id, owner)
        return None if conversation is None else list(conversation.items.values())

    async def add_items(
        self,
        conversation_id: str,
        items: Sequence[dict[str, Any]],
        *,
        owner: str | None,
        max_items: int | None = None,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]] | None:
        await trio.lowlevel.checkpoint()
        conversation = self._live(conversation_id, owner)
        if conversation is None:
            return None
        new = {item["id"] for item in items} - conversation.items.keys()
        if max_items is not None and len(conversation.items) + len(new) > max_items:
            raise ConversationFull(len(conversation.items))
        if max_bytes is not None:
            size, seen = conversation.bytes, set(conversation.items)
            for item in items:
                if item["id"] not in seen:
                    seen.add(item["id"])
                    size += len(encoded(item).encode())
            if size > max_bytes:
                raise ConversationFull(len(conversation.items), held_bytes=conversation.bytes)
        key = (owner, conversation_id)
        added = self._add(key, conversation, items)
        self._used(key, conversation)
        return added

    async def get_item(
        self, conversation_id: str, item_id: str, *, owner: str | None
    ) -> dict[str, Any] | None:
        await trio.lowlevel.checkpoint()
        conversation = self._live(conversation_id, owner)
        return None if conversation is None else conversation.items.get(item_id)

    async def delete_item(self, conversation_id: str, item_id: str, *, owner: str | None) -> bool:
        await trio.lowlevel.checkpoint()
        conversation = self._live(conversation_id, owner)
        if conversation is None or item_id not in conversation.items:
            return False
        item = conversation.items.pop(item_id)
        conversation.bytes -= len(encoded(item).encode())
        self._unindex((owner, conversation_id), item_id)
        return True

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        await trio.lowlevel.checkpoint()
        for conversation_id in reversed(list(self._items.get((owner, item_id), ()))):
            conversation = self._live(conversation_id, owner)
            if conversation is not None and item_id in conversation.items:
                return conversation.items[item_id]
        return None

    async def lock(
        self, conversation_id: str, holder: str, *, owner: str | None, lease_s: float
    ) -> bool | None:
        await trio.lowlevel.checkpoint()
        conversation = self._live(conversation_id, owner)
        if conversation is None:
            return None
        now = self._clock()
        if conversation.holder not in (None, holder) and conversation.lock_until > now:
            return False
        conversation.holder, conversation.lock_until = holder, now + lease_s
        return True

    async def unlock(self, conversation_id: str, holder: str, *, owner: str | None) -> None:
        await trio.lowlevel.checkpoint()
        conversation = self._conversations.get((owner, conversation_id))
        if conversation is not None and conversation.holder == holder:
            conversation.holder = None

    async def expire(self) -> int:
        await trio.lowlevel.checkpoint()
        now = self._clock()
        expired = [key for key, c in self._conversations.items() if c.expires_at <= now]
        for key in expired:
            self._drop(key)
        return len(expired)


@final
class MemoryEventLogs:
    """Implements `EventLogStore` by keeping finished in-process rings."""

    live = False
    write_interval_s = 0.0

    def __init__(self, retention: StreamRetention) -> None:
        self._retention = retention

    async def append(
        self, response_id: str, frames: Sequence[bytes], *, first: int, owner: str | None
    ) -> None:
        raise NotImplementedError("the memory backend keeps finished rings only")

    async def finish(self, response_id: str, log: EventLog, *, owner: str | None) -> None:
        await trio.lowlevel.checkpoint()
        self._retention.add(response_id, log, owner)

    async def open(
        self, response_id: str, *, owner: str | None, starting_after: int
    ) -> Subscription | None:
        await trio.lowlevel.checkpoint()
        log = self._retention.get(response_id, owner)
        if log is None:
            return None
        if starting_after + 1 < log.oldest_sequence_number:
            raise SubscriberLagged(starting_after + 1, log.oldest_sequence_number)
        return LogSubscription(log, starting_after)

    async def terminate(self, record: StoredResponse) -> None:
        await trio.lowlevel.checkpoint()

    async def delete(self, response_id: str, *, owner: str | None) -> None:
        await trio.lowlevel.checkpoint()
        self._retention.discard(response_id, owner)

    async def expire(self) -> int:
        await trio.lowlevel.checkpoint()
        return self._retention.expire()

    def statistics(self) -> LogStatistics:
        retention = self._retention
        return LogStatistics(len(retention), retention.retained_bytes, retention.subscribers)


@final
class LocalControl:
    """Implements `Control` for backends used by one process: jobs run here or nowhere."""

    def __init__(self) -> None:
        self.replica = uuid.uuid4().hex

    async def run(
        self,
        on_cancel: CancelHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        task_status.started()
        await trio.sleep_forever()

    async def request_cancel(self, record: StoredResponse) -> bool:
        await trio.lowlevel.checkpoint()
        return False  # not running here, so running nowhere


def stream_retention(
    config: Config, clock: Callable[[], float] = trio.current_time
) -> StreamRetention:
    """The retention of finished in-process rings, as ``config`` bounds it."""
    return StreamRetention(
        max_streams=config.max_retained_streams,
        max_bytes=config.retained_stream_bytes,
        retention_s=config.stream_retention_s,
        clock=clock,
    )


@asynccontextmanager
async def open_memory_state(config: Config) -> AsyncIterator[State]:
    """The ``memory://`` backend."""
    await trio.lowlevel.checkpoint()
    webhooks = MemoryWebhooks()
    yield State(
        kind="memory",
        store=MemoryStore(
            limits=StoreLimits.of(config), ttl_s=config.store_ttl_s, webhooks=webhooks
        ),
        logs=MemoryEventLogs(stream_retention(config)),
        control=LocalControl(),
        conversations=MemoryConversations(limits=StoreLimits.of(config), ttl_s=config.store_ttl_s),
        files=MemoryFiles(),
        webhooks=webhooks,
    )
