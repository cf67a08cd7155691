"""Webhooks through HTTP with the openai SDK: a real receiver on a loopback port.

Endpoints are made with ``client.webhooks.create``; every delivery the receiver
gets is checked with ``client.webhooks.unwrap`` (Standard Webhooks signatures),
on every store backend.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import trio
from openai import AsyncOpenAI

from tests.conftest import StartServer
from tests.support import MODEL, Server
from tests.webhooks.receiver import Receiver

ALL_TYPES: Any = [
    "response.completed",
    "response.failed",
    "response.cancelled",
    "response.incomplete",
]
LOOPBACK = ("127.0.0.1",)


@pytest.fixture
async def receiver(nursery: trio.Nursery) -> AsyncIterator[Receiver]:
    receiver = Receiver()
    await nursery.start(receiver.run)
    yield receiver


async def _server(start_server: StartServer, **overrides: Any) -> Server:
    settings: dict[str, Any] = {
        "webhook_allow_hosts": LOOPBACK,
        "webhook_first_retry_s": 0.1,
        "webhook_timeout_s": 2.0,
    }
    return await start_server(**{**settings, **overrides})


async def _wait_ended(client: AsyncOpenAI, response_id: str) -> Any:
    with trio.fail_after(60):
        while True:
            response = await client.responses.retrieve(response_id)
            if response.status not in ("queued", "in_progress"):
                return response
            await trio.sleep(0.02)


def _unwrap(client: AsyncOpenAI, secret: str, received: Any) -> Any:
    return client.webhooks.unwrap(received.body, received.headers, secret=secret)


async def test_each_event_type_is_delivered_once_and_signed(
    start_server: StartServer, store_url: str, receiver: Receiver
) -> None:
    server = await _server(start_server, store_url=store_url)
    client = server.client
    endpoint = await client.webhooks.create(name="mine", url=receiver.url, event_types=ALL_TYPES)
    assert endpoint.signing_secret.startswith("whsec_")
    assert endpoint.url == receiver.url and endpoint.object == "webhook_endpoint"

    completed = await client.responses.create(model=MODEL, input="hello", background=True)
    failed = await client.responses.create(model=MODEL, input="fail:2", background=True)
    incomplete = await client.responses.create(
        model=MODEL, input="tokens:200", background=True, max_output_tokens=16
    )
    slow = await client.responses.create(model=MODEL, input="tokens:2000 delay:20", background=True)
    await client.responses.cancel(slow.id)
    expected = {
        completed.id: "response.completed",
        failed.id: "response.failed",
        incomplete.id: "response.incomplete",
        slow.id: "response.cancelled",
    }
    for response_id, event_type in expected.items():
        ended = await _wait_ended(client, response_id)
        assert ended.status == event_type.removeprefix("response.")

    await receiver.wait_for(4, delivered=True)
    events = {}
    for received in receiver.received:
        event = _unwrap(client, endpoint.signing_secret, received)
        assert received.headers["webhook-id"] == event.id
        assert event.id not in events  # once each
        events[event.id] = event
    assert {event.data.id: event.type for event in events.values()} == expected
    for event in events.values():
        assert event.object == "event" and abs(event.created_at - time.time()) < 120

    # Nothing more comes (a response's event is sent once): a later one arrives alone.
    last = await client.responses.create(model=MODEL, input="again", background=True)
    await receiver.wait_for(5, delivered=True)
    assert len(receiver.received) == 5
    assert _unwrap(client, endpoint.signing_secret, receiver.received[-1]).data.id == last.id


async def test_a_tampered_body_or_an_old_timestamp_is_rejected(
    start_server: StartServer, receiver: Receiver
) -> None:
    server = await _server(start_server)
    client = server.client
    endpoint = await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
    await client.responses.create(model=MODEL, input="hello", background=True)
    await receiver.wait_for(1, delivered=True)
    [received] = receiver.received
    event = _unwrap(client, endpoint.signing_secret, received)
    tampered = received.body.replace(event.data.id.encode(), b"resp_someone_else")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(tampered, received.headers, secret=endpoint.signing_secret)
    old = {**received.headers, "webhook-timestamp": str(int(time.time()) - 3600)}
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(received.body, old, secret=endpoint.signing_secret)
    other = await client.webhooks.create(name="o", url=receiver.url, event_types=ALL_TYPES)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(received.body, received.headers, secret=other.signing_secret)


async def test_foreground_responses_send_nothing(
    start_server: StartServer, receiver: Receiver
) -> None:
    server = await _server(start_server)
    client = server.client
    await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
    await client.responses.create(model=MODEL, input="foreground")
    background = await client.responses.create(model=MODEL, input="bg", background=True)
    await receiver.wait_for(1, delivered=True)
    [received] = receiver.received
    assert json.loads(received.body)["data"]["id"] == background.id


async def test_a_receiver_that_is_down_gets_the_event_once_it_is_up(
    start_server: StartServer, receiver: Receiver
) -> None:
    """503, then a closed port, then an answer that never comes, then up."""
    server = await _server(start_server, webhook_timeout_s=1.0)
    client = server.client
    endpoint = await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
    receiver.script.extend([503, "hang"])
    response = await client.responses.create(model=MODEL, input="hello", background=True)
    await receiver.wait_for(1)  # the 503
    await receiver.close()
    await _wait_for_metric(server, 'trio_responses_webhook_attempts_total{outcome="retry"}', 2)
    await receiver.open()
    await receiver.wait_for(2)  # the hang: it times out on the server's side
    await receiver.wait_for(1, delivered=True)
    answered = [r.answered for r in receiver.received]
    assert answered == [503, None, 200]
    ids = {r.headers["webhook-id"] for r in receiver.received}
    assert len(ids) == 1
    event = _unwrap(client, endpoint.signing_secret, receiver.delivered()[0])
    assert event.data.id == response.id and event.type == "response.completed"
    await _wait_for_metric(
        server,
        'trio_responses_webhook_deliveries_total{event_type="response.completed",'
        'outcome="delivered"}',
        1,
    )
    metrics = await _metrics(server)
    assert metrics['trio_responses_webhook_attempts_total{outcome="retry"}'] == 3
    assert metrics['trio_responses_webhook_attempts_total{outcome="ok"}'] == 1


async def test_retries_honour_retry_after(start_server: StartServer, receiver: Receiver) -> None:
    server = await _server(start_server, webhook_first_retry_s=0.05)
    client = server.client
    await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
    receiver.script.append((429, "2"))
    await client.responses.create(model=MODEL, input="hello", background=True)
    await receiver.wait_for(1)
    refused_at = time.monotonic()
    await receiver.wait_for(1, delivered=True)
    assert time.monotonic() - refused_at >= 1.9


async def test_a_delivery_that_never_succeeds_fails_visibly(
    start_server: StartServer, receiver: Receiver
) -> None:
    server = await _server(
        start_server, webhook_first_retry_s=0.05, webhook_retry_window_s=2.0, dashboard=True
    )
    client = server.client
    await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
    receiver.default = 500
    await client.responses.create(model=MODEL, input="hello", background=True)
    key = (
        'trio_responses_webhook_deliveries_total{event_type="response.completed",outcome="failed"}'
    )
    await _wait_for_metric(server, key, 1)
    attempts = len(receiver.received)
    assert attempts >= 2
    data = (await server.http.get("/dashboard/api/webhooks")).json()
    [shown] = data["data"]
    assert shown["status"] == "failed" and shown["last_error"] == "HTTP 500"
    assert shown["attempts"] == attempts


async def test_endpoints_are_managed_with_the_sdk(
    start_server: StartServer, store_url: str, receiver: Receiver
) -> None:
    server = await _server(start_server, store_url=store_url)
    client = server.client
    first = await client.webhooks.create(
        name="first", url=receiver.url, event_types=["response.completed"]
    )
    second = await client.webhooks.create(name="second", url=receiver.url, event_types=ALL_TYPES)
    assert first.signing_secret != second.signing_secret
    assert first.signing_secret_hint == "whsec_..." + first.signing_secret[-4:]
    fetched = await client.webhooks.retrieve(first.id)
    assert fetched.name == "first" and not hasattr(fetched, "signing_secret")
    listed = [e.id async for e in client.webhooks.list()]
    assert listed == [second.id, first.id]
    page = await client.webhooks.list(limit=1)
    assert [e.id for e in page.data] == [second.id] and page.has_more
    updated = await client.webhooks.update(first.id, name="renamed", event_types=ALL_TYPES)
    assert updated.name == "renamed" and updated.event_types == ALL_TYPES
    assert (await client.webhooks.retrieve(first.id)).name == "renamed"
    rotated = await client.webhooks.rotate_secret(first.id)
    assert rotated.signing_secret != first.signing_secret
    deleted = await client.webhooks.delete(second.id)
    assert deleted.deleted and deleted.id == second.id
    with pytest.raises(openai.NotFoundError):
        await client.webhooks.retrieve(second.id)
    types = await client.webhooks.event_types.list()
    assert types.data == ALL_TYPES
    # Deliveries are signed with the rotated secret.
    await client.responses.create(model=MODEL, input="hello", background=True)
    await receiver.wait_for(1, delivered=True)
    _unwrap(client, rotated.signing_secret, receiver.received[0])
    with pytest.raises(openai.InvalidWebhookSignatureError):
        _unwrap(client, first.signing_secret, receiver.received[0])


async def test_a_rotated_secret_may_keep_signing_for_a_day(
    start_server: StartServer, receiver: Receiver
) -> None:
    server = await _server(start_server)
    client = server.client
    endpoint = await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
    rotated = await client.webhooks.rotate_secret(
        endpoint.id, keep_old_secret_active_for_24_hours=True
    )
    await client.responses.create(model=MODEL, input="hello", background=True)
    await receiver.wait_for(1, delivered=True)
    for secret in (endpoint.signing_secret, rotated.signing_secret):
        _unwrap(client, secret, receiver.received[0])


async def test_an_endpoint_test_posts_a_sample_event(
    start_server: StartServer, receiver: Receiver
) -> None:
    server = await _server(start_server)
    client = server.client
    endpoint = await client.webhooks.create(name="h", url=receiver.url, event_types=ALL_TYPES)
    receiver.script.append(418)
    result = await client.webhooks.test(endpoint.id, event_type="response.failed")
    assert result.status_code == 418 and result.webhook_endpoint_id == endpoint.id
    event = _unwrap(client, endpoint.signing_secret, receiver.received[0])
    assert event.type == "response.failed"


async def test_endpoints_belong_to_their_api_key(
    start_server: StartServer, store_url: str, receiver: Receiver
) -> None:
    server = await _server(start_server, store_url=store_url, api_keys=("key-a", "key-b"))
    async with (
        AsyncOpenAI(base_url=server.base_url, api_key="key-a", max_retries=0) as a,
        AsyncOpenAI(base_url=server.base_url, api_key="key-b", max_retries=0) as b,
    ):
        mine = await a.webhooks.create(name="a", url=receiver.url, event_types=ALL_TYPES)
        with pytest.raises(openai.NotFoundError):
            await b.webhooks.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            await b.webhooks.update(mine.id, name="stolen")
        with pytest.raises(openai.NotFoundError):
            await b.webhooks.delete(mine.id)
        assert [e.id async for e in b.webhooks.list()] == []
        # B's background responses are not posted to A's endpoint.
        await b.responses.create(model=MODEL, input="b's", background=True)
        theirs = await a.responses.create(model=MODEL, input="a's", background=True)
        await receiver.wait_for(1, delivered=True)
        await _wait_ended(a, theirs.id)
        await server.service.wait_idle()
        with trio.move_on_after(0.5):
            await receiver.wait_for(2)
        [received] = receiver.received
        assert _unwrap(a, mine.signing_secret, received).data.id == theirs.id


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hooks",
        "http://127.0.0.2:9/hooks",
        "http://[::1]:9/hooks",
        "http://169.254.169.254/latest",
        "http://no-such-host.invalid/hooks",
        "ftp://example.com/hooks",
        "http://user:pass@127.0.0.1/hooks",
        "not a url",
    ],
)
async def test_a_url_outside_the_host_policy_is_a_400_naming_url(
    start_server: StartServer, url: str
) -> None:
    server = await _server(start_server)  # allows 127.0.0.1 only
    with pytest.raises(openai.BadRequestError) as refused:
        await server.client.webhooks.create(name="h", url=url, event_types=ALL_TYPES)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "url" and error["code"]
    assert [e async for e in server.client.webhooks.list()] == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"name": "h", "url": "http://127.0.0.1:9/", "event_types": ["batch.completed"]},
            "event_types",
        ),
        ({"name": "h", "url": "http://127.0.0.1:9/", "event_types": []}, "event_types"),
        ({"name": "h", "url": "http://127.0.0.1:9/"}, "event_types"),
        ({"name": 3, "url": "http://127.0.0.1:9/", "event_types": ALL_TYPES}, "name"),
        ({"name": "h", "url": "http://127.0.0.1:9/", "event_types": ALL_TYPES, "x": 1}, "x"),
    ],
)
async def test_bad_endpoint_fields_are_400s(
    start_server: StartServer, body: dict[str, Any], param: str
) -> None:
    server = await _server(start_server)
    answer = await server.http.post("/v1/webhook_endpoints", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and error["code"] and error["type"] == "invalid_request_error"


async def test_the_operators_endpoint_gets_every_tenants_events(
    start_server: StartServer, receiver: Receiver, tmp_path: Any
) -> None:
    secret_file = tmp_path / "webhook.secret"
    server = await _server(
        start_server,
        api_keys=("key-a", "key-b"),
        webhook_url=receiver.url,
        webhook_secret_file=str(secret_file),
    )
    secret = secret_file.read_text().strip()
    assert secret.startswith("whsec_") and secret_file.stat().st_mode & 0o777 == 0o600
    async with (
        AsyncOpenAI(base_url=server.base_url, api_key="key-a", max_retries=0) as a,
        AsyncOpenAI(base_url=server.base_url, api_key="key-b", max_retries=0) as b,
    ):
        first = await a.responses.create(model=MODEL, input="a", background=True)
        second = await b.responses.create(model=MODEL, input="b", background=True)
        await receiver.wait_for(2, delivered=True)
        seen = {_unwrap(a, secret, r).data.id for r in receiver.received}
        assert seen == {first.id, second.id}
        # Not one of the tenants' endpoints.
        assert [e async for e in a.webhooks.list()] == []


async def _metrics(server: Server) -> dict[str, float]:
    text = (await server.http.get("/metrics")).text
    values = {}
    for line in text.splitlines():
        if line.startswith("trio_responses_webhook"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def _wait_for_metric(server: Server, name: str, least: float) -> None:
    with trio.fail_after(60):
        while True:
            if (await _metrics(server)).get(name, 0) >= least:
                return
            await trio.sleep(0.05)


async def test_a_hanging_receiver_holds_only_its_share_of_the_sender(
    start_server: StartServer, nursery: trio.Nursery
) -> None:
    """Four posts at once, one per endpoint: a receiver that never answers holds one;
    the other endpoint's deliveries go out meanwhile."""
    hanging, healthy = Receiver(default="hang"), Receiver()
    for receiver in (hanging, healthy):
        await nursery.start(receiver.run)
    server = await _server(start_server, webhook_concurrency=4, webhook_timeout_s=60.0)
    client = server.client
    for name, receiver in (("hangs", hanging), ("answers", healthy)):
        await client.webhooks.create(name=name, url=receiver.url, event_types=ALL_TYPES)
    for index in range(3):
        await client.responses.create(model=MODEL, input=f"job {index}", background=True)
    await healthy.wait_for(3, delivered=True)
    assert len(hanging.received) == 1 and hanging.received[0].answered is None
