"""coredis's connection pool, minus two leaks of its slots (`ConnectionPool`).

Tested with coredis==6.9.0 (pinned in pyproject.toml). It relies on these names,
which are not coredis's public API (listed in `RELIES_ON`, checked against the
installed version by tests/test_pinned_libraries.py):

- ``ConnectionPool.get_connection`` and ``ConnectionPool.release``, overridden,
  and what they do with a pool's slots;
- ``ConnectionPool._available_connections``, the queue of a pool's idle slots
  (``Queue.full``, ``Queue.append_nowait``: a ``None`` there is a free slot);
- ``BaseConnection.usable`` (a leased connection still alive).
"""

from __future__ import annotations

from typing import Any, final

import trio
from coredis.pool import ConnectionPool as _CoredisPool

from . import Internal

PINNED = ("coredis==6.9.0",)
"""What pyproject.toml pins, and these internals were checked with."""

_POOL = "coredis.pool:ConnectionPool"

RELIES_ON = (
    Internal(f"{_POOL}.get_connection", ("self", "_")),
    Internal(f"{_POOL}.release", ("self", "connection")),
    Internal(f"{_POOL}._available_connections", on_instances=True),
    Internal("coredis._concurrency:Queue.full", ("self",)),
    Internal("coredis._concurrency:Queue.append_nowait", ("self", "item")),
    Internal("coredis.connection:BaseConnection.usable"),
)
"""The names above, for tests/test_pinned_libraries.py."""


@final
class ConnectionPool(_CoredisPool[Any]):
    """coredis 6.9's pool, minus two leaks of its slots.

    Each slot of the pool is either idle in it or leased. coredis loses a slot
    (for good: after ``max_connections`` losses every command waits for a
    connection that never comes) when

    - a leased connection dies (a blocking command cancelled, timed out or cut
      off): `release` drops the connection and not the slot; and
    - the caller is cancelled while `get_connection` sets up a new connection
      (connect and handshake): the slot taken for it is never put back.
    """

    async def get_connection(self, **kwargs: Any) -> Any:
        # Uncancellable, so never cut off half-way; bounded by the pool's own
        # timeout (and, within it, the connect and reply timeouts). Normally it
        # takes an idle connection at once; a cancellation waits for a new
        # connection's set-up (well under a millisecond on a healthy server).
        with trio.CancelScope(shield=True):
            return await super().get_connection(**kwargs)

    def release(self, connection: Any) -> None:
        super().release(connection)
        if not connection.usable and not self._available_connections.full():
            self._available_connections.append_nowait(None)


__all__ = ["ConnectionPool"]
