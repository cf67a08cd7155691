"""Webhook endpoints and the outbox of deliveries on Redis (see the package docstring
for the layout).

Every call is one Lua script (``lua/webhook_*.lua``, on the library
``lua/webhooks.lua``), so atomic across replicas: `RedisWebhooks.claim` picks the
due deliveries and leases them in one step (of replicas claiming at once, one gets
each), `RedisWebhooks.settle` writes only under the caller's lease, and
`RedisWebhooks.put_endpoint` checks `MAX_ENDPOINTS` in the step that adds the
endpoint. The deliveries of an event are written by the record scripts
(``put.lua``, ``claim.lua``) with the final state they write, from the ARGV that
`event_args` makes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import partial
from typing import Any, final

from ..._offload import offload
from ...protocol.codec import decode_json
from ..base import encoded
from ..webhooks import (
    CLAIM_SCAN,
    MAX_ENDPOINTS,
    Delivery,
    DeliveryStatus,
    EndpointsFull,
    StoredEndpoint,
    WebhookEvent,
)
from ._client import PREFIX, _Redis, _text

__all__ = ["RedisWebhooks", "event_args"]

_REFUSED = -1

_STATUSES: dict[str, DeliveryStatus] = {
    "pending": "pending",
    "delivered": "delivered",
    "failed": "failed",
}

_DELIVERY_BYTES = 512
"""About how many bytes one delivery's fields take (whether decoding a page of
them is worth a worker thread)."""


def _owner(owner: str | None) -> str:
    return owner or ""


def event_args(event: WebhookEvent | None, *, now: float) -> list[str | bytes | int]:
    """The trailing ARGV of the record scripts that write ``event``'s deliveries with
    a response's final state: none when the write makes no event."""
    if event is None:
        return []
    return [
        event.id,
        event.type,
        _owner(event.owner),
        encoded(dataclasses.asdict(event)),
        repr(float(now)),
    ]


def _member(delivery: Delivery) -> str:
    """How the scripts name a delivery: ``{event id}:{endpoint id}``."""
    return f"{delivery.event.id}:{delivery.endpoint_id}"


def _endpoint(owner: str | None, raw: str | bytes) -> StoredEndpoint:
    data: dict[str, Any] = decode_json(raw)
    return StoredEndpoint(
        data["endpoint"],
        owner,
        data["secret"],
        previous_secret=data["previous_secret"],
        previous_until=data["previous_until"],
    )


def _delivery(raw: list[str | bytes]) -> Delivery:
    """A delivery from its hash's fields (HGETALL's flat list)."""
    fields = {_text(raw[i]): _text(raw[i + 1]) for i in range(0, len(raw), 2)}
    status = _STATUSES[fields["status"]]
    status_code = fields.get("status_code")
    return Delivery(
        WebhookEvent(**decode_json(fields["event"])),
        fields["endpoint"],
        fields["endpoint_owner"] or None,
        status=status,
        attempts=int(fields["attempts"]),
        next_attempt_at=float(fields["next_attempt_at"]),
        updated_at=float(fields["updated_at"]),
        last_error=fields.get("last_error"),
        status_code=None if status_code is None else int(status_code),
        leased_by=fields.get("leased_by"),
        lease_until=float(fields.get("lease_until", 0.0)),
    )


def _deliveries(raw: list[list[str | bytes]]) -> list[Delivery]:
    return [_delivery(each) for each in raw]


@final
class RedisWebhooks:
    """Implements `WebhookStore` on Redis: a hash per endpoint and per delivery, and
    sorted sets that index them (see the package docstring)."""

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis

    async def _call(self, script: Any, *args: str | bytes | int) -> Any:
        return await self._redis.call(script, keys=[], args=[PREFIX, *args])

    async def _decoded(self, raw: list[list[str | bytes]]) -> list[Delivery]:
        """``raw``'s deliveries, decoded in a worker thread when there are many."""
        return await offload(len(raw) * _DELIVERY_BYTES, partial(_deliveries, raw), lane="store")

    async def put_endpoint(self, endpoint: StoredEndpoint) -> None:
        value = encoded(
            {
                "endpoint": endpoint.endpoint,
                "secret": endpoint.secret,
                "previous_secret": endpoint.previous_secret,
                "previous_until": endpoint.previous_until,
            }
        )
        types = " ".join(str(each) for each in endpoint.endpoint["event_types"])
        status = int(
            await self._call(
                self._redis.webhook_endpoint_put,
                _owner(endpoint.owner),
                endpoint.id,
                repr(float(endpoint.created_at)),
                f" {types} ",
                value,
            )
        )
        if status == _REFUSED:
            raise EndpointsFull(f"{MAX_ENDPOINTS} endpoints already")

    async def get_endpoint(self, endpoint_id: str, *, owner: str | None) -> StoredEndpoint | None:
        if not endpoint_id:
            return None  # '' asks the script for all of them
        found = await self._call(self._redis.webhook_endpoints, _owner(owner), endpoint_id)
        return _endpoint(owner, found[0]) if found else None

    async def list_endpoints(self, *, owner: str | None) -> list[StoredEndpoint]:
        found = await self._call(self._redis.webhook_endpoints, _owner(owner), "")
        return [_endpoint(owner, raw) for raw in found]

    async def delete_endpoint(self, endpoint_id: str, *, owner: str | None) -> bool:
        return bool(
            await self._call(self._redis.webhook_endpoint_delete, _owner(owner), endpoint_id)
        )

    async def claim(
        self,
        replica: str,
        *,
        now: float,
        lease_s: float,
        limit: int,
        per_endpoint: int | None = None,
        in_flight: Mapping[str, int] | None = None,
    ) -> list[Delivery]:
        if limit < 1:
            return []
        taken: list[str | bytes | int] = []
        for endpoint_id, count in (in_flight or {}).items():
            taken += [endpoint_id, count]
        raw = await self._call(
            self._redis.webhook_claim,
            replica,
            repr(float(now)),
            repr(float(now + lease_s)),
            limit,
            CLAIM_SCAN,
            "" if per_endpoint is None else per_endpoint,
            *taken,
        )
        return await self._decoded(raw)

    async def settle(self, delivery: Delivery, *, replica: str) -> bool:
        optional: list[str | bytes | int] = []
        if delivery.last_error is not None:
            optional += ["last_error", delivery.last_error]
        if delivery.status_code is not None:
            optional += ["status_code", delivery.status_code]
        written = await self._call(
            self._redis.webhook_settle,
            _member(delivery),
            replica,
            delivery.status,
            repr(float(delivery.next_attempt_at)),
            repr(float(delivery.updated_at)),
            delivery.attempts,
            *optional,
        )
        return bool(written)

    async def next_due(self) -> float | None:
        due = await self._call(self._redis.webhook_deliveries, "")
        return None if due is None else float(due)

    async def deliveries(self, *, limit: int) -> list[Delivery]:
        if limit < 1:
            return []
        raw = await self._call(self._redis.webhook_deliveries, limit)
        return await self._decoded(raw)

    async def expire(self, *, now: float, ttl_s: float) -> int:
        cutoff = now - ttl_s
        return int(await self._call(self._redis.webhook_expire, repr(float(cutoff))))
