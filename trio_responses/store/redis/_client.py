"""What the Redis backend's seams share: key names, the clients and their pool, the
scripts, and the one place failures become `StoreError`."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar, final

import coredis
from coredis.commands.script import Script
from coredis.exceptions import RedisError

from ..._adapters.coredis import ConnectionPool
from ..._config import Config
from ..base import (
    LogStatistics,
    StoreError,
)
from . import _lua as lua

logger = logging.getLogger("trio_responses.store.redis")

T = TypeVar("T")

PREFIX = "trio-responses:"
_RETAINED = PREFIX + "retained"
_RETAINED_BYTES = PREFIX + "retained:bytes"
_RETAINED_TOTAL = PREFIX + "retained:total"
_RETAINED_KEYS = (_RETAINED, _RETAINED_BYTES, _RETAINED_TOTAL)
"""The keys of the finished-log index, last in every script that changes it."""

_BLOCK_MS = 1_000
"""Longest ``XREAD BLOCK``: a quiet reader returns ``[]`` this often and is asked again."""
_CONNECT_TIMEOUT_S = 5.0
_MAX_TTL_S = 10 * 365 * 24 * 3600.0
"""TTLs longer than this (``inf`` included) are capped: PX takes a finite number."""
_REBUILDS = 5
"""Attempts at a terminal frame whose log keeps moving (a writer thought dead still writes)."""


def _record_key(response_id: str) -> str:
    return f"{PREFIX}response:{response_id}"


def _conversation_key(conversation_id: str) -> str:
    return f"{PREFIX}conversation:{conversation_id}"


def _lease_key(replica: str) -> str:
    return f"{PREFIX}lease:{replica}"


def _control_key(replica: str) -> str:
    return f"{PREFIX}control:{replica}"


def _log_key(response_id: str) -> str:
    return f"{PREFIX}log:{response_id}"


def _meta_key(response_id: str) -> str:
    return f"{PREFIX}logmeta:{response_id}"


def _ms(seconds: float) -> int:
    """A PX argument: whole milliseconds, at least 1."""
    return max(1, math.ceil(min(seconds, _MAX_TTL_S) * 1000))


def _entry_id(next_sequence: int) -> str:
    """The id of the entry whose last frame is ``next_sequence - 1`` (ids must exceed 0-0)."""
    return f"0-{next_sequence}"


async def _io(request: Awaitable[T]) -> T:
    """Await one Redis command; the one place backend failures become `StoreError`.

    ``trio.Cancelled`` is not an ``Exception`` and passes through untouched.
    """
    try:
        return await request
    except (RedisError, TimeoutError, OSError) as error:
        raise StoreError(
            f"The response store (Redis) is unavailable: {error or type(error).__name__}"
        ) from error


@final
class _Redis:
    """What the three seams share: the clients, the scripts, this replica's id, and
    the figures of the finished-log index the scripts last reported."""

    def __init__(
        self,
        commands: coredis.Redis[bytes],
        blocking: coredis.Redis[bytes],
        config: Config,
    ) -> None:
        self.commands = commands
        self.blocking = blocking
        self.config = config
        self.replica = uuid.uuid4().hex
        self.retained = _Retained()
        self.bounds: list[str | bytes | int] = [
            _ms(config.stream_retention_s),
            config.max_retained_streams,
            config.retained_stream_bytes,
            PREFIX,
        ]
        """The trailing ARGV of the scripts that change the finished-log index."""
        self.scripts: list[Script[bytes]] = []
        self.put = self._script("put")
        self.delete = self._script("delete")
        self.expire_records = self._script("expire_records")
        self.append = self._script("append")
        self.finish = self._script("finish")
        self.terminate = self._script("terminate")
        self.delete_log = self._script("delete_log")
        self.expire_logs = self._script("expire_logs")
        self.claim = self._script("claim")
        self.open = self._script("open")
        self.read = self._script("read")
        self.request_cancel = self._script("request_cancel")
        self.index_items = self._script("index_items")
        self.conversation_create = self._script("conversation_create")
        self.conversation_use = self._script("conversation_use")
        self.conversation_delete = self._script("conversation_delete")
        self.conversation_unlock = self._script("conversation_unlock")
        self.file_put = self._script("file_put")
        self.file_read = self._script("file_read")
        self.file_delete = self._script("file_delete")
        self.files_list = self._script("files_list")
        self.container_put = self._script("container_put")
        self.container_read = self._script("container_read")
        self.container_delete = self._script("container_delete")
        self.containers_expire = self._script("containers_expire")
        self.webhook_endpoint_put = self._script("webhook_endpoint_put")
        self.webhook_endpoints = self._script("webhook_endpoints")
        self.webhook_endpoint_delete = self._script("webhook_endpoint_delete")
        self.webhook_claim = self._script("webhook_claim")
        self.webhook_settle = self._script("webhook_settle")
        self.webhook_deliveries = self._script("webhook_deliveries")
        self.webhook_expire = self._script("webhook_expire")

    def _script(self, name: str) -> Script[bytes]:
        script = self.commands.register_script(lua.script(name))
        self.scripts.append(script)
        return script

    async def load_scripts(self) -> None:
        """Load every script into the server's cache, so that their first calls do not
        miss it (coredis retries a miss, logging it at INFO)."""
        for script in self.scripts:
            await _io(self.commands.script_load(script.script))

    async def call(
        self, script: Script[bytes], *, keys: Sequence[str], args: Sequence[str | bytes | int]
    ) -> Any:
        """Run one of the scripts above; its reply as coredis parses it."""
        request: Awaitable[Any] = script(keys=keys, args=args)
        return await _io(request)

    async def run(
        self, script: Script[bytes], *, keys: Sequence[str], args: Sequence[str | bytes | int]
    ) -> int:
        """Run one of the writing scripts above; its status.

        They answer an integer, or {status} or {status, retained count, retained
        bytes}: those figures are kept for `RedisEventLogs.statistics`.
        """
        reply = await self.call(script, keys=keys, args=args)
        if not isinstance(reply, list):
            return int(reply)
        if len(reply) == 3:
            self.retained.reported(int(reply[1]), int(reply[2]))
        return int(reply[0])

    async def log_end(self, response_id: str) -> int | None:
        """The next sequence number of a log still waiting for its terminal event."""
        written, done = await _io(self.commands.hmget(_meta_key(response_id), ["next", "done"]))
        if written is None or done is not None:
            return None
        return int(written)


@final
class _Retained:
    """What `RedisEventLogs.statistics` reports, kept without I/O.

    The finished logs are the shared index's figures (all replicas' logs) as the
    last script that changed it reported them (a finish, a delete, `expire`,
    which the service runs periodically); the running logs are those this
    process appends to.
    """

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self._finished = 0
        self._finished_bytes = 0

    def appended(self, response_id: str, size: int) -> None:
        self.running[response_id] = self.running.get(response_id, 0) + size

    def reported(self, streams: int, size: int) -> None:
        self._finished, self._finished_bytes = streams, size

    def statistics(self) -> LogStatistics:
        return LogStatistics(
            retained_streams=len(self.running) + self._finished,
            retained_bytes=sum(self.running.values()) + self._finished_bytes,
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _raw(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _client(
    url: str, *, stream_timeout_s: float, max_connections: int | None
) -> coredis.Redis[bytes]:
    pool = ConnectionPool.from_url(
        url,
        decode_responses=False,
        stream_timeout=stream_timeout_s,
        connect_timeout=_CONNECT_TIMEOUT_S,
        max_connections=max_connections,
        # Waiting longer than this for a (new) connection is a failure, not a hang.
        timeout=_CONNECT_TIMEOUT_S,
    )
    return coredis.Redis(connection_pool=pool, decode_responses=False)
