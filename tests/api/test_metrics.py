"""``/metrics``: what a Prometheus scrape shows after a known workload."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx2
import pytest
import trio
from openai.types.responses.tool_param import Mcp
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import StartServer
from tests.support import MODEL, RawSSEClient, Server, parse_sse
from tests.tools.servers import RunningMcp, echo_server, serve_mcp
from trio_responses._exceptions import StoreError
from trio_responses.metrics import Metrics, instrument_state

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(http: httpx2.AsyncClient, **headers: str) -> Samples:
    """Every sample of ``/metrics``, by name and label set."""
    reply = await http.get("/metrics", headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(reply.text)


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; 0 when the series does not exist (nothing counted yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


@pytest.fixture
async def mcp_echo(nursery: trio.Nursery) -> RunningMcp:
    running: RunningMcp = await nursery.start(serve_mcp, echo_server())
    return running


def _mcp(mcp: RunningMcp) -> Mcp:
    return {
        "type": "mcp",
        "server_label": "echo",
        "server_url": mcp.url,
        "require_approval": "never",
    }


async def _lagged_reader(server: Server) -> str:
    """A background response read by a client that stops reading: it falls behind the
    ring and its stream ends with ``stream_lagged``. Returns the response id."""
    created = await server.client.responses.create(
        model=MODEL, input="tokens:3000 delay:1", background=True
    )
    # A tiny receive buffer, never read while the job runs: the server's writes block.
    stalled = await RawSSEClient.open(
        server, "GET", f"/v1/responses/{created.id}?stream=true", receive_buffer=4096
    )
    with trio.fail_after(60):
        assert (await server.service.wait(created.id))["status"] == "completed"
        events = parse_sse(await stalled.read_all())
    await stalled.aclose()
    assert events[-2].json()["code"] == "stream_lagged"
    return created.id


async def test_a_scrape_counts_a_known_workload(
    start_server: StartServer, mcp_echo: RunningMcp
) -> None:
    server = await start_server(replay_events=500, mcp_allow_hosts=("127.0.0.1",))
    client = server.client
    ids: list[str] = []
    for i in range(3):
        ids.append((await client.responses.create(model=MODEL, input=f"hello {i}")).id)

    # One streamed response: every event the SDK read is counted as sent.
    before = await scrape(server.http)
    streamed = 0
    async with client.responses.stream(model=MODEL, input="tokens:40") as stream:
        async for _ in stream:
            streamed += 1
        ids.append((await stream.get_final_response()).id)
    after = await scrape(server.http)
    sent = "trio_responses_events_sent_total"
    assert value(after, sent, transport="sse") - value(before, sent, transport="sse") == streamed

    # Tools: an MCP call that works, one the tool refuses, a function call for the client.
    ok = await client.responses.create(
        model=MODEL, input='mcp:echo.echo {"text": "hi"}', tools=[_mcp(mcp_echo)]
    )
    refused = await client.responses.create(
        model=MODEL, input='mcp:echo.add {"a": "not a number", "b": 1}', tools=[_mcp(mcp_echo)]
    )
    function = await client.responses.create(
        model=MODEL,
        input='call:get_weather {"city": "Paris"}',
        tools=[
            {
                "type": "function",
                "name": "get_weather",
                "parameters": {"type": "object"},
                "strict": False,
            }
        ],
    )
    ids += [ok.id, refused.id, function.id]
    assert next(i for i in refused.output if i.type == "mcp_call").status == "failed"

    # A background response, cancelled.
    cancelled = await client.responses.create(
        model=MODEL, input="tokens:100000 delay:10", background=True
    )
    assert (await client.responses.cancel(cancelled.id)).status == "cancelled"
    ids.append(cancelled.id)

    ids.append(await _lagged_reader(server))
    with trio.fail_after(10):
        await server.service.wait_idle()

    samples = await scrape(server.http)
    created = "trio_responses_responses_created_total"
    finished = "trio_responses_responses_finished_total"
    assert value(samples, created, background="false") == 7
    assert value(samples, created, background="true") == 2
    assert value(samples, finished, status="completed", background="false") == 7
    assert value(samples, finished, status="completed", background="true") == 1
    assert value(samples, finished, status="cancelled", background="true") == 1
    assert total(samples, finished, status="failed") == 0

    http = "trio_responses_http_requests_total"
    assert value(samples, http, route="/v1/responses", method="POST", status="200") == 9
    cancel_route = "/v1/responses/<response_id>/cancel"
    assert value(samples, http, route=cancel_route, method="POST", status="200") == 1
    stream_route = "/v1/responses/<response_id>"
    assert value(samples, http, route=stream_route, method="GET", status="200") == 1
    duration = "trio_responses_http_request_duration_seconds_count"
    assert value(samples, duration, route="/v1/responses", method="POST") == 9

    tools = "trio_responses_tool_calls_total"
    assert value(samples, tools, kind="mcp", outcome="ok") == 1
    assert value(samples, tools, kind="mcp", outcome="error") == 1
    assert value(samples, tools, kind="function", outcome="client") == 1
    assert total(samples, tools) == 3
    assert value(samples, "trio_responses_tool_call_duration_seconds_count", kind="mcp") == 2
    assert value(samples, "trio_responses_mcp_sessions_open", scope="request") == 0

    assert value(samples, "trio_responses_stream_lagged_total", transport="sse") == 1

    # Engine tokens: exactly what the responses report as their usage.
    responses = [await client.responses.retrieve(i) for i in ids]
    usage = [r.usage for r in responses if r.usage is not None]
    assert len(usage) == len(ids)
    tokens = "trio_responses_engine_tokens_total"
    assert value(samples, tokens, model=MODEL, kind="output") == sum(u.output_tokens for u in usage)
    assert value(samples, tokens, model=MODEL, kind="prompt") == sum(u.input_tokens for u in usage)
    first_token = value(samples, "trio_responses_time_to_first_token_seconds_count", model=MODEL)
    assert 8 <= first_token <= 9  # the cancelled one may end before its first token
    per_token = "trio_responses_time_per_output_token_seconds_count"
    assert 8 <= value(samples, per_token, model=MODEL) <= 9

    for gauge in ("jobs_running", "jobs_active", "jobs_queued", "subscribers"):
        assert value(samples, f"trio_responses_{gauge}") == 0, gauge
    assert value(samples, "trio_responses_retained_streams") == 2
    assert value(samples, "trio_responses_websocket_connections") == 0
    store_puts = value(
        samples, "trio_responses_store_operations_total", backend="memory", operation="store.put"
    )
    assert store_puts >= 2 * len(ids)
    assert value(samples, "trio_responses_info", model=MODEL, engine="scripted") == 1
    assert value(samples, "process_cpu_seconds_total") > 0


async def test_queued_and_active_jobs_are_read_at_scrape_time(start_server: StartServer) -> None:
    server = await start_server(max_active_jobs=1)
    running = await server.client.responses.create(
        model=MODEL, input="tokens:100000 delay:10", background=True
    )
    waiting = await server.client.responses.create(model=MODEL, input="hi", background=True)
    samples = await scrape(server.http)
    assert value(samples, "trio_responses_jobs_active") == 1
    assert value(samples, "trio_responses_jobs_queued") == 1
    assert value(samples, "trio_responses_jobs_running") == 2
    await server.client.responses.cancel(running.id)
    with trio.fail_after(10):
        assert (await server.service.wait(waiting.id))["status"] == "completed"
    samples = await scrape(server.http)
    assert value(samples, "trio_responses_jobs_active") == 0
    assert value(samples, "trio_responses_jobs_queued") == 0


async def test_labels_never_carry_ids_keys_or_raw_paths(start_server: StartServer) -> None:
    key = "sk-metrics-secret-key"
    server = await start_server(api_keys=(key,), admin_keys=("admin-key",))
    response = await server.client.responses.create(model=MODEL, input="label check")
    assert (await server.client.responses.retrieve(response.id)).status == "completed"
    unknown = await server.http.get(
        "/v1/no/such/route/resp_0123", headers={"Authorization": f"Bearer {key}"}
    )
    assert unknown.status_code == 404
    missing = await server.http.get(
        "/v1/responses/resp_doesnotexist", headers={"Authorization": f"Bearer {key}"}
    )
    assert missing.status_code == 404
    reply = await server.http.get("/metrics", headers={"Authorization": "Bearer admin-key"})
    assert reply.status_code == 200
    text = reply.text
    for secret in ("resp_", key, "admin-key", "/v1/no/such", "label check"):
        assert secret not in text, secret
    samples = parse(text)
    routes = {
        dict(labels)["route"]
        for name, labels in samples
        if name == "trio_responses_http_requests_total"
    }
    assert "unmatched" in routes and "/v1/responses/<response_id>" in routes
    assert all(route == "unmatched" or route.startswith("/") for route in routes)
    http = "trio_responses_http_requests_total"
    assert value(samples, http, route="unmatched", method="GET", status="404") == 1
    assert (
        value(samples, http, route="/v1/responses/<response_id>", method="GET", status="404") == 1
    )


async def test_with_api_keys_only_an_admin_key_reads_metrics(start_server: StartServer) -> None:
    server = await start_server(api_keys=("user-key",), admin_keys=("admin-key",))
    anonymous = await server.http.get("/metrics")
    assert anonymous.status_code == 401
    error = anonymous.json()["error"]
    assert error["type"] == "authentication_error" and error["code"]
    assert "--admin-key" in error["message"]
    user = await server.http.get("/metrics", headers={"Authorization": "Bearer user-key"})
    assert user.status_code == 401
    admin = await scrape(server.http, Authorization="Bearer admin-key")
    assert value(admin, "trio_responses_jobs_running") == 0


async def test_without_keys_metrics_are_open(server: Server) -> None:
    assert (await server.http.get("/metrics")).status_code == 200


async def test_events_written_as_they_come_are_all_counted(server: Server) -> None:
    # Paced tokens: the producer writes most events itself, and the counter catches up
    # in batches; by the end of the stream every event is counted.
    sent = "trio_responses_events_sent_total"
    before = value(await scrape(server.http), sent, transport="sse")
    streamed = 0
    async with server.client.responses.stream(model=MODEL, input="delay:3 tokens:150") as stream:
        async for _ in stream:
            streamed += 1
    assert streamed > 150
    after = value(await scrape(server.http), sent, transport="sse")
    assert after - before == streamed


async def test_each_server_counts_its_own(start_server: StartServer) -> None:
    first = await start_server()
    second = await start_server()
    await first.client.responses.create(model=MODEL, input="one")
    await first.client.responses.create(model=MODEL, input="two")
    created = "trio_responses_responses_created_total"
    assert value(await scrape(first.http), created, background="false") == 2
    assert value(await scrape(second.http), created, background="false") == 0


async def test_store_operations_are_counted_by_backend(
    start_server: StartServer, store_url: str
) -> None:
    server = await start_server(store_url=store_url)
    kind = server.service.state.kind
    created = await server.client.responses.create(model=MODEL, input="stored", background=True)
    with trio.fail_after(10):
        await server.service.wait(created.id)
    assert (await server.client.responses.retrieve(created.id)).status == "completed"
    samples = await scrape(server.http)
    operations = "trio_responses_store_operations_total"
    assert value(samples, operations, backend=kind, operation="store.put") >= 2
    assert value(samples, operations, backend=kind, operation="store.get") >= 1
    assert total(samples, "trio_responses_store_errors_total") == 0


async def test_store_errors_are_counted() -> None:
    class Failing:
        async def put(self, record: object) -> None:
            raise StoreError("the disk is full")

    class Logs:
        async def expire(self) -> int:
            return 3

    class Webhooks:
        async def claim(self) -> list[object]:
            return []

    class State:
        kind = "sqlite"
        store = Failing()
        logs = Logs()
        webhooks = Webhooks()

    metrics = Metrics(model=MODEL, process=False)
    state = State()
    instrument_state(state, metrics)
    with pytest.raises(StoreError):
        await state.store.put(object())
    assert await state.logs.expire() == 3
    samples = parse(metrics.render().decode())
    errors = "trio_responses_store_errors_total"
    assert value(samples, errors, backend="sqlite", operation="store.put") == 1
    assert value(samples, errors, backend="sqlite", operation="logs.expire") == 0
    operations = "trio_responses_store_operations_total"
    assert value(samples, operations, backend="sqlite", operation="logs.expire") == 1
    assert await state.webhooks.claim() == []  # the webhook outbox's claims are timed too
    samples = parse(metrics.render().decode())
    assert value(samples, operations, backend="sqlite", operation="webhooks.claim") == 1


async def test_the_dashboard_queries_only_families_the_server_exposes(server: Server) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    assert len(expressions) >= 20
    reply = await server.http.get("/metrics")
    exposed = set(re.findall(r"^# TYPE (\S+) (\S+)$", reply.text, re.MULTILINE))
    names = {name for name, _ in exposed}
    histograms = {name for name, kind in exposed if kind == "histogram"}
    used = {
        name
        for expression in expressions
        for name in re.findall(r"\b((?:trio_responses|process)_[a-z_]+)\b", expression)
    }
    for name in used:
        base = name.removesuffix("_bucket")
        assert name in names or (base in histograms and name.endswith("_bucket")), name
    groups = {panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"}
    assert {"HTTP", "Streams", "Tools", "Store", "Latency and tokens"} <= groups
