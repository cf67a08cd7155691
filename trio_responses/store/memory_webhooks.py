"""``memory://``'s `WebhookStore`: endpoints and deliveries in dicts.

Each method does its work after one checkpoint without awaiting again, so a claim
and the lease it takes are one step. `MemoryWebhooks.enqueue` is what
`MemoryStore` calls, synchronously, in the step that writes a terminal record.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import final

import trio

from .._principal import Principal
from .webhooks import (
    MAX_ENDPOINTS,
    MAX_SETTLED,
    OPERATOR,
    Delivery,
    EndpointsFull,
    StoredEndpoint,
    WebhookEvent,
    deliveries_for,
)

__all__ = ["MemoryWebhooks"]


@final
class MemoryWebhooks:
    """Implements `WebhookStore` in memory (nothing survives the process)."""

    def __init__(self) -> None:
        self._endpoints: dict[str | None, dict[str, StoredEndpoint]] = {}
        self._pending: dict[tuple[str, str], Delivery] = {}
        """Pending deliveries by key."""
        self._settled: dict[tuple[str, str], Delivery] = {}
        """Delivered and failed deliveries by key, in the order they were settled
        (the oldest first: the first dropped beyond `MAX_SETTLED`). Apart from the
        pending ones, so that claims and settles do not look at them."""
        self._due: dict[str, list[tuple[float, tuple[str, str]]]] = {}
        """Per endpoint id, a heap of (when due, key) of its pending deliveries, so
        that a claim looks at the due ones only, and passes over an endpoint at its
        share without looking at its deliveries: a delivery is due at
        ``max(next_attempt_at, lease_until)``; each write of a pending delivery pushes
        its new entry, and an entry that no longer matches its delivery (claimed,
        settled) is dropped when it comes up."""

    def enqueue(self, event: WebhookEvent, *, now: float) -> None:
        """Write ``event``'s deliveries (no checkpoint: part of the caller's step)."""
        endpoints = [
            *self._endpoints.get(event.owner, {}).values(),
            *self._endpoints.get(OPERATOR, {}).values(),
        ]
        for delivery in deliveries_for(event, endpoints, now=now):
            if delivery.key not in self._settled and delivery.key not in self._pending:
                self._put_pending(delivery)

    async def put_endpoint(self, endpoint: StoredEndpoint) -> None:
        await trio.lowlevel.checkpoint()
        owned = self._endpoints.setdefault(endpoint.owner, {})
        new = endpoint.id not in owned
        if new and not Principal(endpoint.owner).operator and len(owned) >= MAX_ENDPOINTS:
            raise EndpointsFull(endpoint.owner)
        owned[endpoint.id] = endpoint

    async def get_endpoint(self, endpoint_id: str, *, owner: str | None) -> StoredEndpoint | None:
        await trio.lowlevel.checkpoint()
        return self._endpoints.get(owner, {}).get(endpoint_id)

    async def list_endpoints(self, *, owner: str | None) -> list[StoredEndpoint]:
        await trio.lowlevel.checkpoint()
        endpoints = self._endpoints.get(owner, {}).values()
        return sorted(endpoints, key=lambda e: (e.created_at, e.id), reverse=True)

    async def delete_endpoint(self, endpoint_id: str, *, owner: str | None) -> bool:
        await trio.lowlevel.checkpoint()
        if self._endpoints.get(owner, {}).pop(endpoint_id, None) is None:
            return False
        for key, delivery in list(self._pending.items()):
            if delivery.endpoint_id == endpoint_id:
                del self._pending[key]
        self._due.pop(endpoint_id, None)
        return True

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
        await trio.lowlevel.checkpoint()
        taken = Counter(in_flight or {})
        claimed: list[Delivery] = []
        while len(claimed) < limit:
            first: tuple[float, tuple[str, str]] | None = None
            for endpoint_id, heap in self._due.items():
                if per_endpoint is not None and taken[endpoint_id] >= per_endpoint:
                    continue
                top = self._top(heap)
                if top is not None and top[0] <= now and (first is None or top < first):
                    first = top
            if first is None:
                break
            delivery = self._pending[first[1]]
            heapq.heappop(self._due[delivery.endpoint_id])
            taken[delivery.endpoint_id] += 1
            leased = replace(
                delivery,
                attempts=delivery.attempts + 1,
                leased_by=replica,
                lease_until=now + lease_s,
            )
            self._put_pending(leased)
            claimed.append(leased)
        return claimed

    async def settle(self, delivery: Delivery, *, replica: str) -> bool:
        await trio.lowlevel.checkpoint()
        held = self._pending.get(delivery.key)
        if held is None or held.leased_by != replica:
            return False
        del self._pending[delivery.key]  # re-inserted last: the newest update
        released = replace(delivery, leased_by=None, lease_until=0.0)
        if released.status == "pending":
            self._put_pending(released)
        else:
            self._settled[delivery.key] = released
            self._bound_settled()
        return True

    async def next_due(self) -> float | None:
        await trio.lowlevel.checkpoint()
        tops = [top for heap in self._due.values() if (top := self._top(heap)) is not None]
        return min(tops)[0] if tops else None

    async def deliveries(self, *, limit: int) -> list[Delivery]:
        await trio.lowlevel.checkpoint()
        everything = itertools.chain(self._settled.values(), self._pending.values())
        return heapq.nlargest(max(0, limit), everything, key=lambda d: d.updated_at)

    async def expire(self, *, now: float, ttl_s: float) -> int:
        await trio.lowlevel.checkpoint()
        old = [key for key, d in self._settled.items() if d.updated_at + ttl_s <= now]
        for key in old:
            del self._settled[key]
        return len(old) + self._bound_settled()

    def _put_pending(self, delivery: Delivery) -> None:
        self._pending[delivery.key] = delivery
        due = max(delivery.next_attempt_at, delivery.lease_until)
        heapq.heappush(self._due.setdefault(delivery.endpoint_id, []), (due, delivery.key))

    def _top(
        self, heap: list[tuple[float, tuple[str, str]]]
    ) -> tuple[float, tuple[str, str]] | None:
        """The first entry of ``heap`` that stands for its delivery as it is now (the
        others before it are dropped); None when none is left."""
        while heap:
            due, key = heap[0]
            delivery = self._pending.get(key)
            if delivery is not None and max(delivery.next_attempt_at, delivery.lease_until) == due:
                return heap[0]
            heapq.heappop(heap)
        return None

    def _bound_settled(self) -> int:
        extra = max(0, len(self._settled) - MAX_SETTLED)
        for key in list(itertools.islice(self._settled, extra)):
            del self._settled[key]
        return extra
