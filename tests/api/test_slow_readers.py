"""Clients that stop reading: disconnected after ``--sse-write-timeout``; shutdown does
not wait for them.

Each client here is a raw socket with a tiny receive buffer that sends a streaming
create and then reads nothing, so the server's writes stall once the kernel's
buffers are full.
"""

from __future__ import annotations

import gc
import logging
import tracemalloc
from typing import Any

import pytest
import trio

from tests.processes import ServeCommand
from tests.support import MODEL, JobSpy, RawSSEClient, Server, assert_nothing_left

TINY_BUFFER = 4096
WRITE_TIMEOUT_S = 1.0
MARGIN_S = 10.0
"""Slack for a loaded machine: the server has to notice within the timeout plus this."""


async def _stalled(server: Server, **body: Any) -> RawSSEClient:
    """A client that posts a streaming create and never reads the answer."""
    return await RawSSEClient.open(
        server,
        "POST",
        "/v1/responses",
        {"model": MODEL, "stream": True, **body},
        receive_buffer=TINY_BUFFER,
    )


async def _read_rest(client: RawSSEClient) -> bytes:
    """What the client can still read: the connection must end (EOF or reset)."""
    received = bytearray()
    with trio.fail_after(MARGIN_S):
        while True:
            try:
                chunk = await client.stream.receive_some(1 << 16)
            except trio.BrokenResourceError:  # reset: the server aborted the connection
                break
            if not chunk:
                break
            received.extend(chunk)
    return bytes(received)


async def test_stalled_reader_is_disconnected_and_its_response_cancelled(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server: Server = await start_server(sse_write_timeout_s=WRITE_TIMEOUT_S)
    spy = JobSpy(server.service, monkeypatch)
    started = trio.current_time()
    client = await _stalled(server, input="tokens:100000 delay:2")  # ~200 s of stream
    with trio.fail_after(5):
        job = await spy.first()
    with trio.fail_after(WRITE_TIMEOUT_S + MARGIN_S):
        await job.wait_closed()
    assert trio.current_time() - started >= WRITE_TIMEOUT_S  # not before the timeout
    assert job.status == "cancelled"
    await assert_nothing_left(server)

    rest = await _read_rest(client)
    assert b"data: [DONE]" not in rest  # cut off, not finished
    await client.aclose()
    stored = await server.client.responses.retrieve(job.id)
    assert stored.status == "cancelled"

    # The server goes on serving others.
    answer = await server.client.responses.create(model=MODEL, input="still there?")
    assert answer.output_text == "You said: still there?"


async def test_stalled_reader_of_a_background_response_leaves_it_running(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server: Server = await start_server(sse_write_timeout_s=WRITE_TIMEOUT_S)
    spy = JobSpy(server.service, monkeypatch)
    client = await _stalled(server, input="tokens:2500 delay:3", background=True)
    with trio.fail_after(5):
        job = await spy.first()
    with trio.fail_after(WRITE_TIMEOUT_S + MARGIN_S):
        while server.service.statistics().subscribers:  # noqa: ASYNC110 (no event for it)
            await trio.sleep(0.05)
    rest = await _read_rest(client)
    assert b"data: [DONE]" not in rest
    await client.aclose()
    # The connection is gone; the response is not (at least 7.5 s of generation).
    assert job.status == "in_progress"
    with trio.fail_after(120):
        final = await job.wait()
    assert final["status"] == "completed"
    stored = await server.client.responses.retrieve(job.id)
    assert stored.status == "completed"
    assert stored.usage is not None and stored.usage.output_tokens >= 2500


async def test_stalled_readers_do_not_pin_memory(
    start_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Each stream logs ~15 MB of events and ends; a stalled reader must not keep them."""
    server: Server = await start_server(sse_write_timeout_s=WRITE_TIMEOUT_S)
    caplog.set_level(logging.WARNING, "trio_responses.serve")
    clients = 4

    def closed() -> int:
        return sum("the client stopped reading" in r.getMessage() for r in caplog.records)

    tracemalloc.start()
    try:
        stalled = [await _stalled(server, input="tokens:50000") for _ in range(clients)]
        with trio.fail_after(120):
            while server.service.statistics().running_jobs or closed() < clients:  # noqa: ASYNC110
                await trio.sleep(0.1)
        gc.collect()
        # Measured before the clients read anything: what their streams held is gone.
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 8 * 1024 * 1024, f"{kept / 2**20:.0f} MiB kept for stalled readers"
    for client in stalled:
        assert b"data: [DONE]" not in await _read_rest(client)
        await client.aclose()
    await assert_nothing_left(server)


async def test_shutdown_does_not_wait_for_a_stalled_reader(nursery: trio.Nursery) -> None:
    """SIGTERM with a client that stopped reading: the server exits within the shutdown
    grace plus the cleanup budget (the write timeout is left at its 30 s default)."""
    grace_s, cleanup_s = 1.0, 1.0
    command = await ServeCommand.start(
        nursery, "--shutdown-grace", str(grace_s), "--cleanup-timeout", str(cleanup_s)
    )
    host, port = command.url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, TINY_BUFFER)
    await sock.connect((host, int(port)))
    client = trio.SocketStream(sock)
    payload = b'{"model": "%s", "input": "tokens:100000 delay:2", "stream": true}' % MODEL.encode()
    await client.send_all(
        b"POST /v1/responses HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    await command.wait_for(rb"created \(background=False, stream=True\)")
    await trio.sleep(0.5)  # its writes stall well before the shutdown ends the response

    stopped = trio.current_time()
    assert await command.stop(timeout_s=grace_s + cleanup_s + MARGIN_S) == 0
    assert trio.current_time() - stopped < grace_s + cleanup_s + MARGIN_S
    assert b"the server is shutting down" in command.log
    await client.aclose()
