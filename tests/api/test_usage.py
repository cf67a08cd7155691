"""Usage is what was spent: responses that end early report the tokens they used.

A response cancelled partway (through the API, or by its foreground client
hanging up), one whose engine failed, and one cut short by
``max_output_tokens`` all report the prompt they read as input and what they
generated as output — in their terminal event, through retrieve, and in the
metrics — on every store backend.
"""

from __future__ import annotations

from typing import Any

import trio

from tests.api.test_metrics import scrape, value
from tests.conftest import StartServer
from tests.support import MODEL, RawSSEClient, Server, assert_nothing_left, parse_sse

LONG = "tokens:100000 delay:5"
"""A response that is still generating when the test ends it."""


async def _input_tokens(server: Server, text: str) -> int:
    reply = await server.http.post(
        "/v1/responses/input_tokens", json={"model": MODEL, "input": text}
    )
    assert reply.status_code == 200, reply.text
    count: int = reply.json()["input_tokens"]
    return count


async def _create(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    reply = await server.http.post("/v1/responses", json={"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()
    return response


def _deltas(events: list[Any]) -> tuple[int, int]:
    """Text and reasoning deltas among ``events`` (each is at least one token)."""
    kinds = [event.event for event in events]
    return (
        kinds.count("response.output_text.delta"),
        kinds.count("response.reasoning_text.delta"),
    )


async def _check(server: Server, response_id: str, terminal: dict[str, Any], text: str) -> None:
    """The terminal event's usage holds what was streamed, retrieve says the same, and
    the metrics count it."""
    usage = terminal["usage"]
    assert usage is not None, terminal
    assert usage["input_tokens"] == await _input_tokens(server, text)
    assert usage["output_tokens"] > usage["output_tokens_details"]["reasoning_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    with trio.fail_after(10):
        await server.service.wait_idle()
    retrieved = await server.http.get(f"/v1/responses/{response_id}")
    assert retrieved.json()["usage"] == usage
    samples = await scrape(server.http)
    tokens = "trio_responses_engine_tokens_total"
    assert value(samples, tokens, model=MODEL, kind="output") == usage["output_tokens"]
    assert value(samples, tokens, model=MODEL, kind="prompt") == usage["input_tokens"]
    reasoning = usage["output_tokens_details"]["reasoning_tokens"]
    assert value(samples, tokens, model=MODEL, kind="reasoning") == reasoning
    await assert_nothing_left(server)


async def test_a_response_cancelled_partway_reports_what_it_spent(
    start_server: StartServer, store_url: str
) -> None:
    server = await start_server(store_url=store_url)
    created = await server.client.responses.create(model=MODEL, input=LONG, background=True)
    reader = await RawSSEClient.open(server, "GET", f"/v1/responses/{created.id}?stream=true")
    seen = await reader.read_events(60)
    text_deltas, reasoning_deltas = _deltas(seen)
    assert text_deltas > 10 and reasoning_deltas > 0
    cancelled = await server.client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    events = parse_sse(await reader.read_all())
    terminal = events[-2].json()
    assert terminal["type"] == "response.failed"
    assert terminal["response"]["status"] == "cancelled"
    usage = terminal["response"]["usage"]
    assert usage["output_tokens"] >= text_deltas + reasoning_deltas
    assert usage["output_tokens_details"]["reasoning_tokens"] >= reasoning_deltas
    assert cancelled.usage is not None and cancelled.usage.output_tokens == usage["output_tokens"]
    await _check(server, created.id, terminal["response"], LONG)


async def test_a_foreground_response_whose_client_hangs_up_reports_what_it_spent(
    start_server: StartServer, store_url: str
) -> None:
    server = await start_server(store_url=store_url)
    reader = await RawSSEClient.open(
        server, "POST", "/v1/responses", {"model": MODEL, "input": LONG, "stream": True}
    )
    seen = await reader.read_events(60)
    response_id = seen[0].json()["response"]["id"]
    text_deltas, reasoning_deltas = _deltas(seen)
    await reader.aclose()  # the client hangs up: the response is cancelled
    with trio.fail_after(10):
        await server.service.wait_idle()
    retrieved = (await server.http.get(f"/v1/responses/{response_id}")).json()
    assert retrieved["status"] == "cancelled"
    assert retrieved["usage"]["output_tokens"] >= text_deltas + reasoning_deltas
    await _check(server, response_id, retrieved, LONG)


async def test_a_failed_response_reports_what_it_spent(
    start_server: StartServer, store_url: str
) -> None:
    server = await start_server(store_url=store_url)
    text = "fail:40 tokens:100"
    failed = await _create(server, {"input": text})
    assert failed["status"] == "failed"
    assert failed["usage"]["output_tokens"] == 40
    await _check(server, failed["id"], failed, text)


async def test_an_incomplete_response_reports_what_it_spent(
    start_server: StartServer, store_url: str
) -> None:
    server = await start_server(store_url=store_url)
    text = "tokens:500"
    cut = await _create(server, {"input": text, "max_output_tokens": 40})
    assert cut["status"] == "incomplete"
    assert cut["usage"]["output_tokens"] == 40
    await _check(server, cut["id"], cut, text)
