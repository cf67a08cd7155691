"""Response records and conversations on Redis (see the package docstring for the layout)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any, final

import trio

from ..._offload import estimated_size, offload
from ..._principal import Principal
from ...protocol.builder import terminal_frame
from ...protocol.codec import decode_json
from ..base import (
    ConversationFull,
    StoredConversation,
    StoredResponse,
    StoreLimits,
    encoded,
)
from ..webhooks import terminal_event
from . import _lua as lua
from ._client import (
    _REBUILDS,
    _RETAINED_KEYS,
    PREFIX,
    _conversation_key,
    _io,
    _lease_key,
    _log_key,
    _meta_key,
    _ms,
    _record_key,
    _Redis,
    _text,
)
from ._webhooks import event_args

logger = logging.getLogger("trio_responses.store.redis")

_CONVERSATIONS_BYTES = PREFIX + "conversations:bytes"

_CONVERSATIONS_TOTAL = PREFIX + "conversations:total"

_CONVERSATIONS_INDEX = PREFIX + "conversations"

_STORED_OWNERS = PREFIX + "stored:owners"

_STORED_TOTAL = PREFIX + "stored:total"

_STORED_BYTES = PREFIX + "stored:bytes"

_FINISHED = PREFIX + "finished"

_RUNNING = PREFIX + "running"


def _encode_record(record: StoredResponse) -> tuple[bytes, int]:
    """The stored value of ``record`` and its size (`record_bytes`), from one encoding."""
    response = encoded(record.response).encode()
    input_items = encoded(record.input_items).encode()
    rest = encoded(
        {"owner": record.owner, "replica": record.replica, "updated_at": record.updated_at}
    ).encode()
    value = b'{"response":%s,"input_items":%s,%s' % (response, input_items, rest[1:])
    return value, len(response) + len(input_items)


async def _encode_off_loop(record: StoredResponse) -> tuple[bytes, int]:
    """`_encode_record`, in a worker thread of the store's lane when the record is large."""
    estimate = estimated_size([record.response, record.input_items])
    return await offload(estimate, partial(_encode_record, record), lane="store")


def _decode_record(raw: bytes) -> StoredResponse:
    data = decode_json(raw)
    return StoredResponse(
        response=data["response"],
        input_items=data["input_items"],
        owner=data["owner"],
        replica=data["replica"],
        updated_at=data["updated_at"],
    )


@final
class RedisStore:
    """Implements `ResponseStore` on Redis keys (see the module docstring for the layout).

    A running record names the replica running it (``record.replica``); one
    without (None) belongs to no live replica, so any replica may recover it.
    A replica that stalls longer than its lease (a long pause, a partition)
    has its jobs recovered by others. If it comes back, its late writes are
    fenced off: a finished record is final (the put script refuses to replace
    it) and nothing is appended to a log after its terminal event; the lease
    check warns about it in the log.
    """

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        self._ttl_ms = _ms(redis.config.store_ttl_s)
        self._limits = StoreLimits.of(redis.config)

    def _index(self, owner: str | None) -> tuple[list[str], list[str | bytes | int]]:
        """The keys and the bounds of the index a record of ``owner`` is counted in
        (the trailing KEYS and ARGV of the scripts that change it)."""
        tenant = self._limits.tenant(owner)
        suffix = "" if tenant is None else f":{tenant}"
        keys = [_FINISHED + suffix, _STORED_TOTAL + suffix, _STORED_BYTES, _STORED_OWNERS]
        limits = self._limits
        bounds: list[str | bytes | int] = [
            suffix,
            self._ttl_ms,
            limits.share_responses,
            limits.share_bytes,
            PREFIX,
        ]
        return keys, bounds

    async def put(self, record: StoredResponse) -> None:
        """Write the record; a finished one is indexed in its owner's index, in the same
        script that evicts that index's oldest finished records beyond its share, and
        that writes the webhook deliveries of a background response's first final
        write (`terminal_event`)."""
        now = time.time()
        record = replace(record, updated_at=now)
        # Records can be large (long inputs): encode those off the event loop.
        value, size = await _encode_off_loop(record)
        index_keys, bounds = self._index(record.owner)
        event = None if record.running else terminal_event(record.response, record.owner, now=now)
        await self._redis.run(
            self._redis.put,
            keys=[_record_key(record.id), _RUNNING, *index_keys],
            args=[
                value,
                record.id,
                record.replica or "",
                size,
                "1" if record.running else "",
                *bounds,
                *event_args(event, now=now),
            ],
        )
        if not record.running and (item_ids := sorted(record.item_ids)):
            await self._redis.run(
                self._redis.index_items,
                keys=[],
                args=[f"r:{record.id}", self._ttl_ms, PREFIX, record.owner or "", *item_ids],
            )

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        """The item, from the newest finished record of ``owner`` the item index names."""
        return await _find_item(self._redis, item_id, owner, responses=self)

    async def get(self, response_id: str, *, owner: str | None) -> StoredResponse | None:
        raw = await _io(self._redis.commands.get(_record_key(response_id)))
        if raw is None:
            return None
        record = await offload(len(raw), partial(_decode_record, raw), lane="store")
        return record if Principal(owner).may_see(record.owner) else None

    async def delete(self, response_id: str, *, owner: str | None) -> bool:
        if await self.get(response_id, owner=owner) is None:
            return False
        index_keys, bounds = self._index(owner)
        deleted = await self._redis.run(
            self._redis.delete,
            keys=[_record_key(response_id), _RUNNING, *index_keys],
            args=[response_id, *bounds],
        )
        return bool(deleted)

    async def expire(self) -> int:
        """Forget, in every index, the records their TTL removed; returns how many."""
        return await self._redis.run(
            self._redis.expire_records,
            keys=[_STORED_BYTES, _STORED_OWNERS],
            args=[self._ttl_ms, PREFIX],
        )

    async def recover_interrupted(self) -> list[StoredResponse]:
        """Claim, once, each running record of a replica whose lease is gone.

        One script per record checks the lease is still missing and removes the
        record from the running hash, then writes it ``failed``
        (``server_restarted``), writes its webhook deliveries (a background
        response's ``response.failed``) and ends its log with that terminal event,
        all atomically: of several replicas recovering at once, exactly one claims
        each record, and no claimed record is left with an open log. Like `put`
        and `RedisEventLogs.finish`, the script keeps the finished records and
        logs within their bounds.
        """
        redis = self._redis
        running = await _io(redis.commands.hgetall(_RUNNING))
        by_replica: dict[str, list[str]] = {}
        for raw_id, raw_replica in running.items():
            by_replica.setdefault(raw_replica.decode(), []).append(raw_id.decode())
        recovered: list[StoredResponse] = []
        for replica, response_ids in by_replica.items():
            if replica == redis.replica:
                continue
            alive = bool(replica) and await _io(redis.commands.exists([_lease_key(replica)])) > 0
            if alive:
                continue  # its jobs are its own
            for response_id in response_ids:
                record = await self._claim(replica, response_id)
                if record is not None:
                    recovered.append(record)
        return recovered

    async def _claim(self, replica: str, response_id: str) -> StoredResponse | None:
        redis = self._redis
        for _ in range(_REBUILDS):
            raw = await _io(redis.commands.get(_record_key(response_id)))
            if raw is None:
                # Deleted (or evicted): nothing to recover, only the hash entry to drop.
                await _io(redis.commands.hdel(_RUNNING, [response_id]))
                return None
            now = time.time()
            record = replace(_decode_record(raw).interrupted(), updated_at=now)
            event = terminal_event(record.response, record.owner, now=now)
            end = await redis.log_end(response_id)
            frame = b"" if end is None else terminal_frame(record.response, end)
            value, size = await _encode_off_loop(record)
            index_keys, bounds = self._index(record.owner)
            claimed = await redis.run(
                redis.claim,
                keys=[
                    _lease_key(replica),
                    _RUNNING,
                    _record_key(response_id),
                    _log_key(response_id),
                    _meta_key(response_id),
                    *_RETAINED_KEYS,
                    *index_keys,
                ],
                args=[
                    response_id,
                    replica,
                    value,
                    size,
                    "" if end is None else str(end),
                    frame,
                    *redis.bounds,
                    *bounds,
                    *event_args(event, now=now),
                ],
            )
            if claimed == 1:
                return record
            if claimed == 0:
                return None
            # -1: the log moved between reading it and the script (a writer thought
            # dead is still writing, or a retried append landed): read it again.
        logger.warning("%s: its log keeps changing; left for a later recovery", response_id)
        return None


async def _find_item(
    redis: _Redis,
    item_id: str,
    owner: str | None,
    *,
    responses: RedisStore | None = None,
    conversations: RedisConversations | None = None,
) -> dict[str, Any] | None:
    """An item of ``owner`` with ``item_id``: from the newest `lua.ITEM_SOURCES` sources
    its index names (of the kind asked for), checked against the records as they are
    now; a source that no longer holds the item is forgotten."""
    key = f"{PREFIX}item:{owner or ''}:{item_id}"
    newest = await _io(redis.commands.zrange(key, 0, lua.ITEM_SOURCES - 1, rev=True))
    gone: list[str] = []
    found: dict[str, Any] | None = None
    for source in (_text(raw) for raw in newest):
        kind, _, source_id = source.partition(":")
        if kind == "r" and responses is not None:
            record = await responses.get(source_id, owner=owner)
            if record is not None and not record.running and (item := record.item(item_id)):
                found = item
                break
            if record is None or not record.running:
                gone.append(source)
        elif kind == "c" and conversations is not None:
            found = await conversations.get_item(source_id, item_id, owner=owner)
            if found is not None:
                break
            gone.append(source)
    if gone:
        await _io(redis.commands.zrem(key, gone))
    return found


@final
class RedisConversations:
    """Implements `ConversationStore` on Redis keys (see the module docstring)."""

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        self._ttl_ms = _ms(redis.config.store_ttl_s)
        self._limits = StoreLimits.of(redis.config)

    def _keys_args(
        self, conversation_id: str, owner: str | None
    ) -> tuple[list[str], list[str | bytes | int]]:
        tenant = self._limits.tenant(owner)
        suffix = "" if tenant is None else f":{tenant}"
        key = _conversation_key(conversation_id)
        keys = [
            key,
            key + ":ids",
            key + ":items",
            _CONVERSATIONS_INDEX + suffix,
            _CONVERSATIONS_TOTAL + suffix,
            _CONVERSATIONS_BYTES,
        ]
        args: list[str | bytes | int] = [
            conversation_id,
            owner or "",
            self._ttl_ms,
            self._limits.share_responses,
            self._limits.share_bytes,
            PREFIX,
        ]
        return keys, args

    async def _use(self, conversation_id: str, owner: str | None, *what: str | bytes | int) -> Any:
        keys, args = self._keys_args(conversation_id, owner)
        return await self._redis.call(self._redis.conversation_use, keys=keys, args=[*args, *what])

    async def create(
        self, conversation: StoredConversation, items: Sequence[dict[str, Any]]
    ) -> None:
        keys, args = self._keys_args(conversation.id, conversation.owner)
        pairs = [value for item in items for value in (item["id"], encoded(item))]
        await self._redis.call(
            self._redis.conversation_create,
            keys=keys,
            args=[*args, encoded(conversation.conversation), *pairs],
        )

    async def get(self, conversation_id: str, *, owner: str | None) -> StoredConversation | None:
        raw = await self._use(conversation_id, owner, "get")
        return None if raw is None else StoredConversation(decode_json(raw), owner)

    async def update(
        self, conversation_id: str, metadata: dict[str, str], *, owner: str | None
    ) -> StoredConversation | None:
        current = await self.get(conversation_id, owner=owner)
        if current is None:
            return None
        conversation = {**current.conversation, "metadata": metadata}
        done = await self._use(conversation_id, owner, "update", encoded(conversation))
        return None if done is None else StoredConversation(conversation, owner)

    async def delete(self, conversation_id: str, *, owner: str | None) -> bool:
        keys, args = self._keys_args(conversation_id, owner)
        deleted = await self._redis.call(self._redis.conversation_delete, keys=keys, args=args)
        return bool(deleted)

    async def items(
        self, conversation_id: str, *, owner: str | None
    ) -> list[dict[str, Any]] | None:
        raw = await self._use(conversation_id, owner, "items")
        if raw is None:
            return None
        return await offload(
            sum(len(item) for item in raw if item is not None),
            lambda: [decode_json(item) for item in raw if item is not None],
            lane="store",
        )

    async def add_items(
        self,
        conversation_id: str,
        items: Sequence[dict[str, Any]],
        *,
        owner: str | None,
        max_items: int | None = None,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]] | None:
        pairs = [value for item in items for value in (item["id"], encoded(item))]
        most = "" if max_items is None else str(max_items)
        most_bytes = "" if max_bytes is None else str(max_bytes)
        reply = await self._use(conversation_id, owner, "add", most, most_bytes, *pairs)
        if reply is None:
            return None
        if int(reply[0]) == -1:
            raise ConversationFull(int(reply[1]))
        if int(reply[0]) == -2:
            raise ConversationFull(int(reply[1]), held_bytes=int(reply[2]))
        added = {_text(raw) for raw in reply[1:]}
        return [item for item in items if item["id"] in added]

    async def get_item(
        self, conversation_id: str, item_id: str, *, owner: str | None
    ) -> dict[str, Any] | None:
        raw = await self._use(conversation_id, owner, "item", item_id)
        if not raw:
            return None
        item: dict[str, Any] = decode_json(raw)
        return item

    async def delete_item(self, conversation_id: str, item_id: str, *, owner: str | None) -> bool:
        return bool(await self._use(conversation_id, owner, "delete_item", item_id))

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        return await _find_item(self._redis, item_id, owner, conversations=self)

    async def lock(
        self, conversation_id: str, holder: str, *, owner: str | None, lease_s: float
    ) -> bool | None:
        reply = await self._use(conversation_id, owner, "lock", holder, _ms(lease_s))
        return None if reply is None else bool(reply)

    async def unlock(self, conversation_id: str, holder: str, *, owner: str | None) -> None:
        await self._redis.call(
            self._redis.conversation_unlock,
            keys=[_conversation_key(conversation_id)],
            args=[holder],
        )

    async def expire(self) -> int:
        await trio.lowlevel.checkpoint()
        return 0  # the keys' TTLs expire them; the indexes forget them when next used
