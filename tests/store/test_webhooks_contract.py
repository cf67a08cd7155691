"""`WebhookStore`'s contract: the same tests against memory://, sqlite:/// and redis://.

Each test opens the backend named by the ``store_url`` fixture (an empty one per
test; Redis is a real ``redis-server``) through `open_state`, as the server does.
The outbox is written by the `ResponseStore`'s final write of a background
response, so the tests write records and look at the deliveries they made.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from trio_responses import Config
from trio_responses.store.base import State, StoredResponse
from trio_responses.store.open import open_state
from trio_responses.store.webhooks import (
    MAX_ENDPOINTS,
    OPERATOR,
    Delivery,
    EndpointsFull,
    StoredEndpoint,
    event_id,
)

OWNER = "owner-a"
STRANGER = "owner-b"
LEASE_S = 30.0


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[State]:
    async with open_state(url, Config(store_url=url)) as state:
        yield state


def _endpoint(
    endpoint_id: str = "wh_1",
    *,
    owner: str | None = OWNER,
    created_at: int = 1,
    event_types: tuple[str, ...] = ("response.completed", "response.failed"),
    secret: str = "sealed-secret",
) -> StoredEndpoint:
    return StoredEndpoint(
        {
            "id": endpoint_id,
            "object": "webhook_endpoint",
            "created_at": created_at,
            "updated_at": created_at,
            "name": endpoint_id,
            "url": f"https://hooks.example.com/{endpoint_id}",
            "event_types": list(event_types),
            "signing_secret_hint": "whsec_...abcd",
        },
        owner,
        secret,
    )


def _record(
    response_id: str,
    *,
    status: str = "completed",
    owner: str | None = OWNER,
    background: bool = True,
    replica: str | None = None,
) -> StoredResponse:
    return StoredResponse(
        response={
            "id": response_id,
            "object": "response",
            "created_at": 1,
            "status": status,
            "background": background,
            "model": "m",
            "output": [],
            "usage": None,
            "error": None,
        },
        input_items=[],
        owner=owner,
        replica=replica,
    )


async def _finish(state: State, response_id: str, **fields: Any) -> None:
    """Write a response running, then ended (the way a job writes it)."""
    owner = fields.get("owner", OWNER)
    await state.store.put(
        _record(response_id, status="in_progress", owner=owner, replica=state.control.replica)
    )
    await state.store.put(_record(response_id, **fields))


async def _pending(state: State) -> list[Delivery]:
    return [d for d in await state.webhooks.deliveries(limit=1000) if d.status == "pending"]


def _keys(deliveries: list[Delivery]) -> set[tuple[str, str]]:
    return {delivery.key for delivery in deliveries}


# -- endpoints ----------------------------------------------------------------------------


async def test_endpoints_round_trip_scoped_to_their_owner(store_url: str) -> None:
    async with opened(store_url) as state:
        hooks = state.webhooks
        stored = _endpoint()
        await hooks.put_endpoint(stored)
        assert await hooks.get_endpoint("wh_1", owner=OWNER) == stored
        for other in (STRANGER, None, OPERATOR):
            assert await hooks.get_endpoint("wh_1", owner=other) is None
            assert await hooks.list_endpoints(owner=other) == []
            assert not await hooks.delete_endpoint("wh_1", owner=other)
        changed = _endpoint(event_types=("response.cancelled",), secret="another")
        await hooks.put_endpoint(changed)
        assert await hooks.get_endpoint("wh_1", owner=OWNER) == changed
        assert await hooks.delete_endpoint("wh_1", owner=OWNER)
        assert await hooks.get_endpoint("wh_1", owner=OWNER) is None
        assert not await hooks.delete_endpoint("wh_1", owner=OWNER)


async def test_endpoints_keep_a_rotated_secret(store_url: str) -> None:
    async with opened(store_url) as state:
        rotated = StoredEndpoint(
            _endpoint().endpoint, OWNER, "new", previous_secret="old", previous_until=123.5
        )
        await state.webhooks.put_endpoint(rotated)
        assert await state.webhooks.get_endpoint("wh_1", owner=OWNER) == rotated


async def test_endpoints_are_listed_newest_first(store_url: str) -> None:
    async with opened(store_url) as state:
        for endpoint_id, created_at in (("wh_c", 2), ("wh_b", 1), ("wh_a", 2), ("wh_d", 3)):
            await state.webhooks.put_endpoint(_endpoint(endpoint_id, created_at=created_at))
        await state.webhooks.put_endpoint(_endpoint("wh_x", owner=None))
        listed = await state.webhooks.list_endpoints(owner=OWNER)
        assert [e.id for e in listed] == ["wh_d", "wh_c", "wh_a", "wh_b"]
        assert [e.id for e in await state.webhooks.list_endpoints(owner=None)] == ["wh_x"]


async def test_an_owner_has_at_most_max_endpoints(store_url: str) -> None:
    async with opened(store_url) as state:
        for index in range(MAX_ENDPOINTS):
            await state.webhooks.put_endpoint(_endpoint(f"wh_{index}"))
        with pytest.raises(EndpointsFull):
            await state.webhooks.put_endpoint(_endpoint("wh_more"))
        assert await state.webhooks.get_endpoint("wh_more", owner=OWNER) is None
        await state.webhooks.put_endpoint(_endpoint("wh_0", secret="replaced"))  # not new
        await state.webhooks.put_endpoint(_endpoint("wh_more", owner=STRANGER))
        assert len(await state.webhooks.list_endpoints(owner=OWNER)) == MAX_ENDPOINTS


# -- the outbox, written with the final state ------------------------------------------


async def test_a_background_response_that_ends_makes_one_delivery_per_endpoint(
    store_url: str,
) -> None:
    async with opened(store_url) as state:
        hooks = state.webhooks
        await hooks.put_endpoint(_endpoint("wh_mine"))
        await hooks.put_endpoint(_endpoint("wh_cancels", event_types=("response.cancelled",)))
        await hooks.put_endpoint(_endpoint("wh_theirs", owner=STRANGER))
        await hooks.put_endpoint(
            _endpoint("wh_op", owner=OPERATOR, event_types=("response.completed",))
        )
        before = time.time()
        await _finish(state, "resp_1")
        pending = await _pending(state)
        assert _keys(pending) == {("evt_1", "wh_mine"), ("evt_1", "wh_op")}
        for delivery in pending:
            assert delivery.event.id == event_id("resp_1") == "evt_1"
            assert delivery.event.type == "response.completed"
            assert delivery.event.response_id == "resp_1"
            assert delivery.event.owner == OWNER
            assert before - 1 <= delivery.event.created_at <= time.time() + 1
            assert delivery.attempts == 0
            assert delivery.next_attempt_at <= time.time()
        owners = {d.endpoint_id: d.endpoint_owner for d in pending}
        assert owners == {"wh_mine": OWNER, "wh_op": OPERATOR}


@pytest.mark.parametrize(
    ("status", "event_type"),
    [
        ("completed", "response.completed"),
        ("failed", "response.failed"),
        ("cancelled", "response.cancelled"),
        ("incomplete", "response.incomplete"),
    ],
)
async def test_each_terminal_status_has_its_event(
    store_url: str, status: str, event_type: str
) -> None:
    async with opened(store_url) as state:
        everything = (
            "response.completed",
            "response.failed",
            "response.cancelled",
            "response.incomplete",
        )
        await state.webhooks.put_endpoint(_endpoint(event_types=everything))
        await _finish(state, "resp_1", status=status)
        [delivery] = await _pending(state)
        assert delivery.event.type == event_type


async def test_only_the_write_that_ends_a_background_response_makes_deliveries(
    store_url: str,
) -> None:
    async with opened(store_url) as state:
        await state.webhooks.put_endpoint(_endpoint())
        await state.webhooks.put_endpoint(_endpoint("wh_anon", owner=None))
        # Running, foreground, not subscribed: nothing.
        await state.store.put(_record("resp_run", status="in_progress"))
        await _finish(state, "resp_fg", background=False)
        await _finish(state, "resp_cancel", status="cancelled")
        assert await _pending(state) == []
        # A finished record written again (a retried write) makes no second event.
        await _finish(state, "resp_1")
        await state.store.put(_record("resp_1"))
        # Without an owner: the endpoints without one.
        await _finish(state, "resp_2", owner=None)
        assert _keys(await _pending(state)) == {("evt_1", "wh_1"), ("evt_2", "wh_anon")}


async def test_a_response_recovered_after_its_process_died_sends_response_failed(
    store_url: str,
) -> None:
    async with opened(store_url) as state:
        await state.webhooks.put_endpoint(_endpoint())
        await state.store.put(_record("resp_dead", status="queued", replica="gone-replica"))
        recovered = await state.store.recover_interrupted()
        if state.kind == "memory":
            assert recovered == []  # nothing outlives the process: nothing to recover
            return
        [delivery] = await _pending(state)
        assert (delivery.event.type, delivery.event.response_id) == ("response.failed", "resp_dead")
        assert await state.store.recover_interrupted() == []
        assert len(await _pending(state)) == 1


async def test_deleting_an_endpoint_drops_its_pending_deliveries(store_url: str) -> None:
    async with opened(store_url) as state:
        await state.webhooks.put_endpoint(_endpoint("wh_1"))
        await state.webhooks.put_endpoint(_endpoint("wh_2"))
        await _finish(state, "resp_1")
        assert await state.webhooks.delete_endpoint("wh_1", owner=OWNER)
        assert _keys(await _pending(state)) == {("evt_1", "wh_2")}
        claimed = await state.webhooks.claim("r1", now=time.time(), lease_s=LEASE_S, limit=10)
        assert _keys(claimed) == {("evt_1", "wh_2")}


# -- claims, leases and settling ------------------------------------------------------------


async def test_a_claim_leases_due_deliveries_to_one_replica(store_url: str) -> None:
    async with opened(store_url) as state:
        hooks = state.webhooks
        await hooks.put_endpoint(_endpoint())
        for index in range(3):
            await _finish(state, f"resp_{index}")
        now = time.time()
        first = await hooks.claim("r1", now=now, lease_s=LEASE_S, limit=2)
        assert len(first) == 2
        for delivery in first:
            assert delivery.attempts == 1
            assert delivery.leased_by == "r1"
            assert delivery.lease_until == pytest.approx(now + LEASE_S)
        second = await hooks.claim("r2", now=now, lease_s=LEASE_S, limit=10)
        assert len(second) == 1 and not _keys(first) & _keys(second)
        assert await hooks.claim("r3", now=now, lease_s=LEASE_S, limit=10) == []
        assert await hooks.claim("r3", now=now, lease_s=LEASE_S, limit=0) == []
        # Leases that ran out (their replica died): claimable again, counted again.
        again = await hooks.claim("r3", now=now + LEASE_S + 1, lease_s=LEASE_S, limit=10)
        assert _keys(again) == _keys(first) | _keys(second)
        assert {d.attempts for d in again} == {2}
        # The replica that lost its lease cannot settle it any more.
        assert not await hooks.settle(first[0].settled("delivered", now=now), replica="r1")
        assert await hooks.settle(
            again[0].settled("delivered", now=now, status_code=204), replica="r3"
        )


async def test_settled_deliveries(store_url: str) -> None:
    async with opened(store_url) as state:
        hooks = state.webhooks
        await hooks.put_endpoint(_endpoint())
        await _finish(state, "resp_ok")
        await _finish(state, "resp_retry")
        await _finish(state, "resp_bad")
        now = time.time()
        claimed = {
            d.event.response_id: d
            for d in await hooks.claim("r1", now=now, lease_s=LEASE_S, limit=10)
        }
        assert await hooks.settle(
            claimed["resp_ok"].settled("delivered", now=now, status_code=200), replica="r1"
        )
        assert await hooks.settle(
            claimed["resp_retry"].settled(
                "pending", now=now, next_attempt_at=now + 60, error="HTTP 503", status_code=503
            ),
            replica="r1",
        )
        assert await hooks.settle(
            claimed["resp_bad"].settled("failed", now=now, error="timed out"), replica="r1"
        )
        # Settled once: a second settle of the same claim changes nothing.
        assert not await hooks.settle(
            claimed["resp_ok"].settled("failed", now=now, error="x"), replica="r1"
        )
        assert await hooks.claim("r1", now=now + 59, lease_s=LEASE_S, limit=10) == []
        assert await hooks.next_due() == pytest.approx(now + 60)
        by_response = {d.event.response_id: d for d in await hooks.deliveries(limit=10)}
        assert by_response["resp_ok"].status == "delivered"
        assert by_response["resp_ok"].status_code == 200
        assert by_response["resp_ok"].attempts == 1
        assert by_response["resp_bad"].status == "failed"
        assert by_response["resp_bad"].last_error == "timed out"
        retry = by_response["resp_retry"]
        assert (retry.status, retry.last_error, retry.status_code) == ("pending", "HTTP 503", 503)
        assert retry.leased_by is None
        [due] = await hooks.claim("r2", now=now + 61, lease_s=LEASE_S, limit=10)
        assert due.event.response_id == "resp_retry" and due.attempts == 2
        assert await hooks.next_due() == pytest.approx(now + 61 + LEASE_S)


async def test_next_due_and_newest_deliveries_first(store_url: str) -> None:
    async with opened(store_url) as state:
        hooks = state.webhooks
        assert await hooks.next_due() is None
        await hooks.put_endpoint(_endpoint())
        await _finish(state, "resp_1")
        due = await hooks.next_due()
        assert due is not None and due <= time.time()
        [claimed] = await hooks.claim("r1", now=time.time(), lease_s=LEASE_S, limit=1)
        await _finish(state, "resp_2")
        later = time.time() + 5
        assert await hooks.settle(claimed.settled("delivered", now=later), replica="r1")
        assert [d.event.response_id for d in await hooks.deliveries(limit=10)] == [
            "resp_1",
            "resp_2",
        ]
        assert [d.event.response_id for d in await hooks.deliveries(limit=1)] == ["resp_1"]


async def test_settled_deliveries_expire(store_url: str) -> None:
    async with opened(store_url) as state:
        hooks = state.webhooks
        await hooks.put_endpoint(_endpoint())
        await _finish(state, "resp_1")
        await _finish(state, "resp_2")
        now = time.time()
        claimed = await hooks.claim("r1", now=now, lease_s=LEASE_S, limit=1)
        assert await hooks.settle(claimed[0].settled("delivered", now=now), replica="r1")
        assert await hooks.expire(now=now + 10, ttl_s=60) == 0
        assert await hooks.expire(now=now + 61, ttl_s=60) == 1
        # Pending ones never expire.
        assert len(await hooks.deliveries(limit=10)) == 1


async def test_the_outbox_survives_a_reopen(store_url: str) -> None:
    async with opened(store_url) as state:
        await state.webhooks.put_endpoint(_endpoint())
        await _finish(state, "resp_1")
        [claimed] = await state.webhooks.claim("r1", now=time.time(), lease_s=LEASE_S, limit=1)
        durable = state.durable
    async with opened(store_url) as state:
        if not durable:
            assert await state.webhooks.deliveries(limit=10) == []
            return
        assert await state.webhooks.get_endpoint("wh_1", owner=OWNER) is not None
        [pending] = await _pending(state)
        assert pending.key == claimed.key
        if state.kind == "sqlite":
            # One process owns the file: a lease found when it opens is a dead one's,
            # given back at once.
            [again] = await state.webhooks.claim("r2", now=time.time(), lease_s=LEASE_S, limit=1)
            assert again.key == claimed.key and again.attempts == 2
            return
        # Its lease outlives the process that took it (Redis: another replica may
        # hold it) until it runs out; then any replica claims it.
        assert await state.webhooks.claim("r2", now=time.time(), lease_s=LEASE_S, limit=1) == []
        later = claimed.lease_until + 1
        [again] = await state.webhooks.claim("r2", now=later, lease_s=LEASE_S, limit=1)
        assert again.key == claimed.key and again.attempts == 2


async def test_a_claim_gives_each_endpoint_at_most_its_share(store_url: str) -> None:
    async with opened(store_url) as state:
        hooks = state.webhooks
        await hooks.put_endpoint(_endpoint("wh_slow", created_at=1))
        await hooks.put_endpoint(_endpoint("wh_fast", created_at=2))
        for index in range(4):
            await _finish(state, f"resp_{index}")
        now = time.time()
        claimed = await hooks.claim(
            "r1", now=now, lease_s=LEASE_S, limit=10, per_endpoint=2, in_flight={"wh_slow": 1}
        )
        by_endpoint = [d.endpoint_id for d in claimed]
        assert sorted(by_endpoint) == ["wh_fast", "wh_fast", "wh_slow"]
        rest = await hooks.claim("r1", now=now, lease_s=LEASE_S, limit=10, per_endpoint=10)
        assert len(rest) == 8 - 3


async def test_a_deferred_delivery_keeps_its_count_of_attempts(store_url: str) -> None:
    async with opened(store_url) as state:
        hooks = state.webhooks
        await hooks.put_endpoint(_endpoint())
        await _finish(state, "resp_1")
        now = time.time()
        [claimed] = await hooks.claim("r1", now=now, lease_s=LEASE_S, limit=1)
        # Not posted after all (the replica is shutting down): given back uncounted.
        given_back = replace(claimed, attempts=claimed.attempts - 1)
        assert await hooks.settle(given_back.settled("pending", now=now), replica="r1")
        [again] = await hooks.claim("r2", now=now, lease_s=LEASE_S, limit=1)
        assert again.attempts == 1
