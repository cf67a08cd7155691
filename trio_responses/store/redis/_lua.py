"""The backend's Lua scripts, read from ``lua/*.lua`` (package data).

Each script is a single Redis command, so atomic and safe to cancel. A script
file holds the script's own body; the libraries it calls (local functions) are
files of their own, put in front of it in the order of `_NEEDS` (each library
once). The scripts that change the finished-log index (``retained``) answer
{status, retained count, retained bytes}; `_Redis.run` keeps the two figures for
`RedisEventLogs.statistics`. Keys evicted by a trim are named in the script from
ARGV's prefix (one server or a primary: not Cluster).
"""

from __future__ import annotations

import functools
from importlib import resources

from ..webhooks import MAX_ENDPOINTS, MAX_SETTLED, OPERATOR

ITEM_SOURCES = 16
"""The sources an item index keeps (its newest) and a lookup checks, at most."""

_NEEDS: dict[str, tuple[str, ...]] = {
    # libraries
    "helpers": (),
    "records": ("helpers",),
    "logs": ("helpers",),
    "index_item": (),
    "conversations": ("records", "index_item"),
    "files": ("helpers",),
    "webhooks": (),
    # scripts
    "put": ("records", "webhooks"),
    "delete": ("records",),
    "expire_records": ("records",),
    "append": ("helpers",),
    "finish": ("logs",),
    "terminate": ("logs",),
    "delete_log": ("logs",),
    "expire_logs": ("logs",),
    "claim": ("logs", "records", "webhooks"),
    "open": ("helpers",),
    "read": ("helpers",),
    "index_items": ("index_item",),
    "conversation_create": ("conversations",),
    "conversation_use": ("conversations",),
    "conversation_delete": ("conversations",),
    "conversation_unlock": (),
    "request_cancel": (),
    "file_put": ("files",),
    "file_read": ("files",),
    "file_delete": ("files",),
    "files_list": ("files",),
    "container_put": ("files",),
    "container_read": ("files",),
    "container_delete": ("files",),
    "containers_expire": ("files",),
    "webhook_endpoint_put": ("webhooks",),
    "webhook_endpoints": ("webhooks",),
    "webhook_endpoint_delete": ("webhooks",),
    "webhook_claim": ("webhooks",),
    "webhook_settle": ("webhooks",),
    "webhook_deliveries": ("webhooks",),
    "webhook_expire": ("webhooks",),
}
"""What each file needs in front of it (libraries, each with its own needs)."""

_CONSTANTS = (
    f"local ITEM_SOURCES = {ITEM_SOURCES}\n"
    f"local WEBHOOK_MAX_ENDPOINTS = {MAX_ENDPOINTS}\n"
    f"local WEBHOOK_MAX_SETTLED = {MAX_SETTLED}\n"
    f"local WEBHOOK_OPERATOR = '{OPERATOR}'\n"
)
"""Python's figures the scripts use, defined in front of every script."""


@functools.cache
def script(name: str) -> str:
    """The source of script ``name``: the constants, its libraries, its body."""
    parts: list[str] = []
    for part in _in_order(name, set()):
        parts.append(_read(part))
    return _CONSTANTS + "\n".join(parts)


def _in_order(name: str, seen: set[str]) -> list[str]:
    """``name`` after everything it needs, each file once."""
    order: list[str] = []
    for need in _NEEDS[name]:
        if need not in seen:
            order += _in_order(need, seen)
    if name not in seen:
        seen.add(name)
        order.append(name)
    return order


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
