"""The state seam of webhooks: endpoints and the outbox of deliveries, `WebhookStore`.

Endpoints (``/v1/webhook_endpoints``) are found by (owner, id) like responses:
another owner's endpoint is not found (None, False). The operator's endpoint
(``--webhook``) is stored with the owner `OPERATOR` and receives every tenant's
events. An endpoint's signing secret is stored sealed with the server's key
(`sealing.Sealer`), never in the clear.

**The outbox.** When a background response reaches a terminal status, its
backend's `ResponseStore` writes one `Delivery` per endpoint that subscribes to
the event's type (the owner's endpoints and the operator's) *in the same write*
that records the final state: in the record's SQLite transaction, in the Redis
script that writes the record, in the same step for memory. That covers both
writes that end a response: `ResponseStore.put` of a running (or new) record
turned terminal, and `ResponseStore.recover_interrupted` of one whose process
died. A finished record is final, so a response has at most one event, and
a crash between the final write and the delivery cannot lose it.
`terminal_event` says which event a record's final write makes.

**Sending.** A sender (``webhooks/sender.py``) on any replica claims due
deliveries (`WebhookStore.claim`: a lease for that replica until a deadline),
posts each, and settles it (`WebhookStore.settle`): delivered, due again later,
or failed. A delivery whose lease ran out (its replica died mid-delivery) is
claimable again; a settle from a replica that lost the lease changes nothing. So
each delivery is posted by one replica at a time, and delivered once, unless a
receiver's 2xx is lost, which the event id (``webhook-id``) lets it notice.

Settled deliveries (delivered or failed) are kept for the dashboard and the
metrics, at most `MAX_SETTLED` of them and no longer than the store's TTL.
Times are wall-clock seconds (replicas share them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from .._principal import OPERATOR as _OPERATOR
from .._principal import Principal
from ..protocol.webhooks import EVENT_TYPES

__all__ = [
    "CLAIM_SCAN",
    "EVENT_TYPES",
    "MAX_ENDPOINTS",
    "MAX_SETTLED",
    "OPERATOR",
    "Delivery",
    "DeliveryStatus",
    "EndpointsFull",
    "StoredEndpoint",
    "WebhookEvent",
    "WebhookStore",
    "deliveries_for",
    "event_id",
    "terminal_event",
]

OPERATOR = _OPERATOR
"""The owner of the operator's endpoint (``--webhook``): it receives every
tenant's events (`Principal.hears`)."""


MAX_ENDPOINTS = 100
"""Endpoints one owner may have."""

CLAIM_SCAN = 1_000
"""Most due deliveries one `WebhookStore.claim` looks at (passing over busy endpoints)."""

MAX_SETTLED = 10_000
"""Delivered and failed deliveries a store keeps (the newest)."""

DeliveryStatus = Literal["pending", "delivered", "failed"]


class EndpointsFull(Exception):
    """The owner has `MAX_ENDPOINTS` endpoints already (nothing was written)."""


@dataclass(frozen=True)
class WebhookEvent:
    """One event: what a delivery posts (`protocol.webhooks.event_body` builds its JSON)."""

    id: str
    """``evt_…``, the ``webhook-id`` of every delivery of it."""
    type: str
    """``response.completed``, ``response.failed``, ``response.cancelled`` or
    ``response.incomplete``."""
    response_id: str
    created_at: float
    """When the response ended (Unix seconds, as precise as the clock; the event's
    JSON says it in whole seconds)."""
    owner: str | None
    """The response's owner."""


def event_id(response_id: str) -> str:
    """The id of ``response_id``'s event (a response has at most one)."""
    return "evt_" + response_id.removeprefix("resp_")


def terminal_event(
    response: Mapping[str, Any], owner: str | None, *, now: float
) -> WebhookEvent | None:
    """The event the final write of this response makes: None unless it is a
    background response with a terminal status."""
    event_type = EVENT_TYPES.get(str(response.get("status")))
    if event_type is None or not response.get("background"):
        return None
    response_id = str(response["id"])
    return WebhookEvent(event_id(response_id), event_type, response_id, now, owner)


@dataclass(frozen=True)
class StoredEndpoint:
    """An endpoint as stored: its public object, its owner and its sealed secrets."""

    endpoint: dict[str, Any]
    """The WebhookEndpoint object without its secret: ``id``, ``object``
    (``webhook_endpoint``), ``created_at``, ``updated_at``, ``name``, ``url``,
    ``event_types``, ``signing_secret_hint``."""
    owner: str | None
    secret: str
    """The signing secret (``whsec_…``), sealed (`sealing.Sealer`)."""
    previous_secret: str | None = None
    """A rotated-out secret (sealed) that still signs until ``previous_until``."""
    previous_until: float | None = None

    @property
    def id(self) -> str:
        endpoint_id: str = self.endpoint["id"]
        return endpoint_id

    @property
    def url(self) -> str:
        url: str = self.endpoint["url"]
        return url

    @property
    def created_at(self) -> int:
        created_at: int = self.endpoint["created_at"]
        return created_at

    def wants(self, event_type: str) -> bool:
        """Whether the endpoint subscribes to ``event_type``."""
        return event_type in self.endpoint["event_types"]


@dataclass(frozen=True)
class Delivery:
    """One event to one endpoint, and how its delivery is going."""

    event: WebhookEvent
    endpoint_id: str
    endpoint_owner: str | None
    """The endpoint's owner: the event's, or `OPERATOR`."""
    status: DeliveryStatus = "pending"
    attempts: int = 0
    """Posts made so far (including one in flight under a lease)."""
    next_attempt_at: float = 0.0
    """When a pending delivery is due (wall clock)."""
    updated_at: float = 0.0
    """When it was last settled (or created)."""
    last_error: str | None = None
    """Why the last attempt did not succeed (``HTTP 503``, ``timed out``…), short."""
    status_code: int | None = None
    """The receiver's HTTP status for the last attempt that got one."""
    leased_by: str | None = field(default=None, compare=False)
    """The replica whose claim holds it now (set by `WebhookStore.claim`)."""
    lease_until: float = field(default=0.0, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        """What identifies it: (event id, endpoint id)."""
        return (self.event.id, self.endpoint_id)

    def settled(
        self,
        status: DeliveryStatus,
        *,
        now: float,
        next_attempt_at: float = 0.0,
        error: str | None = None,
        status_code: int | None = None,
    ) -> Delivery:
        """This delivery after an attempt, to pass to `WebhookStore.settle`."""
        return replace(
            self,
            status=status,
            next_attempt_at=next_attempt_at,
            updated_at=now,
            last_error=error,
            status_code=status_code,
        )


def deliveries_for(
    event: WebhookEvent, endpoints: Sequence[StoredEndpoint], *, now: float
) -> list[Delivery]:
    """The deliveries ``event`` makes: one per endpoint among ``endpoints`` (the
    event owner's and the operator's) that subscribes to its type, due ``now``."""
    return [
        Delivery(event, endpoint.id, endpoint.owner, next_attempt_at=now, updated_at=now)
        for endpoint in endpoints
        if endpoint.wants(event.type) and Principal(endpoint.owner).hears(event.owner)
    ]


class WebhookStore(Protocol):
    """Endpoints by (owner, id) and the outbox of their deliveries."""

    async def put_endpoint(self, endpoint: StoredEndpoint) -> None:
        """Insert or replace the endpoint with ``endpoint.id`` of ``endpoint.owner``.

        Raises:
            EndpointsFull: it is new and its owner has `MAX_ENDPOINTS` already
                (`OPERATOR` excepted).
        """
        ...

    async def get_endpoint(self, endpoint_id: str, *, owner: str | None) -> StoredEndpoint | None:
        """The endpoint, or None if unknown, deleted or someone else's."""
        ...

    async def list_endpoints(self, *, owner: str | None) -> list[StoredEndpoint]:
        """All of ``owner``'s endpoints, newest first (ties: by id, descending)."""
        ...

    async def delete_endpoint(self, endpoint_id: str, *, owner: str | None) -> bool:
        """Remove an endpoint and its pending deliveries; False if there was none."""
        ...

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
        """Up to ``limit`` pending deliveries due by ``now`` that no live lease holds,
        the longest due first, each leased to ``replica`` until ``now + lease_s``
        and its ``attempts`` counted up by one, atomically (of replicas claiming at
        once, one gets each). Returned as leased (``leased_by``, ``lease_until``).

        With ``per_endpoint``, no endpoint gets more than that, counting the
        deliveries ``in_flight`` says the caller posts to it already (endpoint id ->
        how many): an endpoint at its share is passed over for the next due ones.
        At most `CLAIM_SCAN` due deliveries are looked at.
        """
        ...

    async def settle(self, delivery: Delivery, *, replica: str) -> bool:
        """Write ``delivery``'s new state (`Delivery.settled`: its status, ``attempts``,
        ``next_attempt_at``, ``updated_at``, ``last_error``, ``status_code``) and release its lease,
        if ``replica`` still holds it; False (nothing written) if not: the lease ran
        out and another replica may have claimed it, or its endpoint was deleted.

        A pending delivery is due again at its ``next_attempt_at``; a delivered or
        failed one is kept among the settled ones (`MAX_SETTLED`).
        """
        ...

    async def next_due(self) -> float | None:
        """When the earliest pending delivery is due (a leased one: when its lease
        ends), or None when none is pending."""
        ...

    async def deliveries(self, *, limit: int) -> list[Delivery]:
        """The most recently updated deliveries of every owner, pending ones
        included, newest first (the operator's view: the dashboard)."""
        ...

    async def expire(self, *, now: float, ttl_s: float) -> int:
        """Drop settled deliveries older than ``ttl_s`` (and the oldest beyond
        `MAX_SETTLED`); returns how many."""
        ...
