"""Containers through HTTP with the openai SDK: real bubblewrap, every store backend.

A container is a stateful sandboxed Python: variables persist across the calls of a
response and across responses that use it; files go in (``file_ids``, uploads) and
come out (listed, downloadable, cited in the answer).
"""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from tests.conftest import StartServer
from tests.support import MODEL, Server, check_stream, read_sse

AUTO = [{"type": "code_interpreter", "container": {"type": "auto"}}]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# A real 1x1 PNG written with the standard library (no matplotlib needed).
WRITE_PNG = """\
import struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(b"\\x00\\xff\\x00\\x00")) + chunk(b"IEND", b""))
open("/mnt/data/plot.png", "wb").write(png)
"""


def code(text: str) -> str:
    return f"Run it.\n```python\n{text}```"


def _call(response: Any) -> Any:
    return next(item for item in response.output if item.type == "code_interpreter_call")


def _logs(response: Any) -> str:
    return "".join(output.logs for output in _call(response).outputs if output.type == "logs")


async def _containers_server(start_server: StartServer, **overrides: Any) -> Server:
    return await start_server(
        code_interpreter=True, python_cpu_s=5, python_wall_s=20, python_memory_mb=256, **overrides
    )


async def test_state_persists_across_responses_of_a_chain(
    start_server: StartServer, store_url: str
) -> None:
    server = await _containers_server(start_server, store_url=store_url)
    client = server.client
    first = await client.responses.create(model=MODEL, input=code("x = 41\n"), tools=AUTO)
    container_id = _call(first).container_id
    assert container_id.startswith("cntr_")
    # auto, continuing the chain: the same container, with its variables.
    second = await client.responses.create(
        model=MODEL, input=code("print(x + 1)\n"), tools=AUTO, previous_response_id=first.id
    )
    assert _call(second).container_id == container_id
    assert _logs(second) == "42\n"
    container = await client.containers.retrieve(container_id)
    assert container.status == "running" and container.object == "container"
    # A new chain with auto: a new container, where x is not defined.
    third = await client.responses.create(model=MODEL, input=code("print(x)\n"), tools=AUTO)
    assert _call(third).container_id != container_id
    assert "NameError" in _logs(third)


async def test_an_explicit_container_keeps_state_between_unrelated_responses(
    start_server: StartServer, store_url: str
) -> None:
    server = await _containers_server(start_server, store_url=store_url)
    client = server.client
    container = await client.containers.create(name="analysis")
    tools: Any = [{"type": "code_interpreter", "container": container.id}]
    await client.responses.create(model=MODEL, input=code("x = 41\n"), tools=tools)
    second = await client.responses.create(model=MODEL, input=code("x + 1\n"), tools=tools)
    assert _call(second).container_id == container.id
    assert _logs(second).strip() == "42"  # the last expression is shown
    listed = [c.id async for c in client.containers.list()]
    assert container.id in listed


async def test_files_in_and_out_cited_and_downloadable(
    start_server: StartServer, store_url: str
) -> None:
    server = await _containers_server(start_server, store_url=store_url)
    client = server.client
    uploaded = await client.files.create(file=("data.csv", b"a,b\n1,2\n3,4\n"), purpose="user_data")
    assert uploaded.filename == "data.csv" and uploaded.bytes == 12
    tools: Any = [
        {"type": "code_interpreter", "container": {"type": "auto", "file_ids": [uploaded.id]}}
    ]
    program = (
        "import csv\n"
        "rows = list(csv.DictReader(open('/mnt/data/data.csv')))\n"
        "print(sum(int(r['b']) for r in rows))\n"
        + WRITE_PNG
        + "print('saved /mnt/data/plot.png')\n"
    )
    response = await client.responses.create(
        model=MODEL,
        input=code(program),
        tools=tools,
        include=["code_interpreter_call.outputs"],
    )
    call = _call(response)
    assert _logs(response) == "6\nsaved /mnt/data/plot.png\n"
    images = [output for output in call.outputs if output.type == "image"]
    assert len(images) == 1 and images[0].url.startswith("data:image/png;base64,")
    # The answer cites the file the code wrote.
    text = response.output[-1].content[0]
    (citation,) = text.annotations
    assert citation.type == "container_file_citation"
    assert citation.container_id == call.container_id and citation.filename == "plot.png"
    assert text.text[citation.start_index : citation.end_index] == "/mnt/data/plot.png"
    # Listed, downloadable, the same bytes.
    files = [f async for f in client.containers.files.list(call.container_id)]
    by_path = {f.path: f for f in files}
    assert set(by_path) == {"/mnt/data/data.csv", "/mnt/data/plot.png"}
    assert by_path["/mnt/data/data.csv"].source == "user"
    assert by_path["/mnt/data/plot.png"].source == "assistant"
    assert by_path["/mnt/data/plot.png"].id == citation.file_id
    content = await client.containers.files.content.retrieve(
        citation.file_id, container_id=call.container_id
    )
    png = content.read()
    assert png.startswith(PNG_MAGIC) and len(png) == by_path["/mnt/data/plot.png"].bytes
    # An upload straight into the container is there for the next call.
    await client.containers.files.create(call.container_id, file=("notes.txt", b"hello"))
    again = await client.responses.create(
        model=MODEL,
        input=code("print(open('/mnt/data/notes.txt').read())\n"),
        tools=[{"type": "code_interpreter", "container": call.container_id}],
    )
    assert _logs(again) == "hello\n"
    # Deleted through the API: gone from its disk before the next call.
    (notes,) = [
        f
        async for f in client.containers.files.list(call.container_id)
        if f.path == "/mnt/data/notes.txt"
    ]
    await client.containers.files.delete(notes.id, container_id=call.container_id)
    gone = await client.responses.create(
        model=MODEL,
        input=code("import os\nprint(sorted(os.listdir('/mnt/data')))\n"),
        tools=[{"type": "code_interpreter", "container": call.container_id}],
    )
    assert _logs(gone) == "['data.csv', 'plot.png']\n"
    # The uploaded file itself: listed, its content, deleted.
    assert [f.id async for f in client.files.list()] == [uploaded.id]
    assert (await client.files.content(uploaded.id)).read() == b"a,b\n1,2\n3,4\n"
    assert (await client.files.delete(uploaded.id)).deleted
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(uploaded.id)


async def test_the_seed_plan_streams_the_real_container_id(
    start_server: StartServer, store_url: str
) -> None:
    server = await _containers_server(start_server, store_url=store_url)
    status, events, _ = await read_sse(
        server.http,
        "POST",
        "/v1/responses",
        json={
            "model": MODEL,
            "input": code("print(6 * 7)\n"),
            "tools": AUTO,
            "stream": True,
        },
    )
    assert status == 200
    payloads = [event.json() for event in events[:-1]]
    check_stream(payloads)
    items = [
        p["item"] for p in payloads if p.get("item", {}).get("type") == "code_interpreter_call"
    ]
    ids = {item["container_id"] for item in items}
    assert len(ids) == 1 and next(iter(ids)).startswith("cntr_")
    final = payloads[-1]["response"]
    call = next(item for item in final["output"] if item["type"] == "code_interpreter_call")
    assert call["outputs"] == [{"type": "logs", "logs": "42\n"}]
    retrieved = await server.client.containers.retrieve(call["container_id"])
    assert retrieved.id == call["container_id"]


async def test_expiry_and_delete_end_the_process_and_the_files(
    start_server: StartServer, store_url: str
) -> None:
    server = await _containers_server(start_server, store_url=store_url)
    client = server.client
    runtime = server.service.files.runtime
    assert runtime is not None
    short = await client.containers.create(
        name="short", expires_after={"anchor": "last_active_at", "minutes": 1}
    )
    tools: Any = [{"type": "code_interpreter", "container": short.id}]
    await client.responses.create(model=MODEL, input=code(WRITE_PNG), tools=tools)
    assert runtime.health()["live"] == 1
    metrics = (await server.http.get("/metrics")).text
    assert "trio_responses_containers_live 1.0" in metrics
    assert "trio_responses_containers_started_total 1.0" in metrics
    (png,) = [f async for f in client.containers.files.list(short.id)]
    await runtime.sweep(now=time.time() + 30)  # not idle long enough yet
    assert (await client.containers.retrieve(short.id)).status == "running"
    await runtime.sweep(now=time.time() + 121)
    assert (await client.containers.retrieve(short.id)).status == "expired"
    assert runtime.health()["live"] == 0
    with pytest.raises(openai.NotFoundError):
        await client.containers.files.retrieve(png.id, container_id=short.id)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=MODEL, input=code("1\n"), tools=tools)
    assert refused.value.code == "container_expired"

    kept = await client.containers.create(name="kept")
    tools = [{"type": "code_interpreter", "container": kept.id}]
    await client.responses.create(model=MODEL, input=code(WRITE_PNG), tools=tools)
    assert runtime.health()["live"] == 1
    deleted = await client.containers.delete(kept.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    assert runtime.health()["live"] == 0
    with pytest.raises(openai.NotFoundError):
        await client.containers.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model=MODEL, input=code("1\n"), tools=tools)


async def test_a_process_that_dies_is_started_again_with_its_files(
    start_server: StartServer,
) -> None:
    server = await _containers_server(start_server)
    client = server.client
    container = await client.containers.create(name="fragile")
    tools: Any = [{"type": "code_interpreter", "container": container.id}]
    await client.responses.create(
        model=MODEL,
        input=code("x = 1\nopen('/mnt/data/kept.txt', 'w').write('still here')\n"),
        tools=tools,
    )
    died = await client.responses.create(
        model=MODEL, input=code("import os\nos._exit(3)\n"), tools=tools
    )
    assert _call(died).status == "failed" or "died" in _logs(died)
    after = await client.responses.create(
        model=MODEL,
        input=code("print(open('/mnt/data/kept.txt').read())\nprint('x' in globals())\n"),
        tools=tools,
    )
    logs = _logs(after)
    assert "started again" in logs and "still here\nFalse\n" in logs


async def test_tenants_cannot_see_each_others_files_or_containers(
    start_server: StartServer,
) -> None:
    server = await _containers_server(start_server, api_keys=("key-a", "key-b"))
    tenant_a = server.client
    tenant_b = openai.AsyncOpenAI(base_url=server.base_url, api_key="key-b", max_retries=0)
    try:
        file = await tenant_a.files.create(file=("secret.txt", b"a's"), purpose="user_data")
        container = await tenant_a.containers.create(name="a's", file_ids=[file.id])
        with pytest.raises(openai.NotFoundError):
            await tenant_b.files.retrieve(file.id)
        with pytest.raises(openai.NotFoundError):
            await tenant_b.files.content(file.id)
        with pytest.raises(openai.NotFoundError):
            await tenant_b.containers.retrieve(container.id)
        with pytest.raises(openai.NotFoundError):
            await tenant_b.containers.delete(container.id)
        assert [c async for c in tenant_b.containers.list()] == []
        assert [f async for f in tenant_b.files.list()] == []
        with pytest.raises(openai.NotFoundError):
            await tenant_b.responses.create(
                model=MODEL,
                input=code("print(open('/mnt/data/secret.txt').read())\n"),
                tools=[{"type": "code_interpreter", "container": container.id}],
            )
        with pytest.raises(openai.NotFoundError):
            await tenant_b.containers.create(name="steal", file_ids=[file.id])
        # B's own container does not see A's files on its disk either.
        response = await tenant_b.responses.create(
            model=MODEL,
            input=code("import os\nprint(sorted(os.listdir('/mnt/data')))\n"),
            tools=AUTO,
        )
        assert _logs(response) == "[]\n"
    finally:
        await tenant_b.close()


async def test_quotas_and_size_limits(start_server: StartServer) -> None:
    server = await _containers_server(
        start_server, file_quota_files=2, max_containers=1, max_file_bytes=1000
    )
    client = server.client
    await client.files.create(file=("a.txt", b"a"), purpose="user_data")
    await client.files.create(file=("b.txt", b"b"), purpose="user_data")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.files.create(file=("c.txt", b"c"), purpose="user_data")
    assert refused.value.code == "quota_exceeded"
    with pytest.raises(openai.APIStatusError) as too_large:
        await client.files.create(file=("big.bin", b"x" * 1001), purpose="user_data")
    assert too_large.value.status_code == 413
    await client.containers.create(name="one")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.containers.create(name="two")
    assert refused.value.code == "quota_exceeded"
    # An auto container past the quota: the call fails, the model reads why.
    response = await client.responses.create(model=MODEL, input=code("1\n"), tools=AUTO)
    assert "quota" in _logs(response)


async def test_bad_input_gets_4xx(start_server: StartServer) -> None:
    server = await _containers_server(start_server)
    http = server.http
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/containers", {"json": {}}),
        ("POST", "/v1/containers", {"json": {"name": "x", "memory_limit": "2g"}}),
        ("POST", "/v1/containers", {"json": {"name": "x", "expires_after": {"minutes": 5}}}),
        ("POST", "/v1/containers", {"json": {"name": "x", "file_ids": ["file_nope"]}}),
        (
            "POST",
            "/v1/containers",
            {"json": {"name": "x", "network_policy": {"type": "allowlist"}}},
        ),
        ("POST", "/v1/containers", {"content": b"not json"}),
        ("POST", "/v1/files", {"json": {"purpose": "user_data"}}),
        ("POST", "/v1/files", {"files": {"file": ("a", b"a")}, "data": {"purpose": "nope"}}),
        ("POST", "/v1/files", {"files": {"file": ("a", b"a")}}),
        ("GET", "/v1/files/file_nope", {}),
        ("GET", "/v1/files?limit=0", {}),
        ("GET", "/v1/containers/cntr_nope/files", {}),
        ("POST", "/v1/containers/cntr_nope/files", {"json": {"file_id": "file_x"}}),
        (
            "POST",
            "/v1/responses",
            {
                "json": {
                    "model": MODEL,
                    "input": "x",
                    "tools": [
                        {
                            "type": "code_interpreter",
                            "container": {"type": "auto", "file_ids": ["file_x"]},
                        }
                    ],
                }
            },
        ),
        (
            "POST",
            "/v1/responses",
            {
                "json": {
                    "model": MODEL,
                    "input": "x",
                    "tools": [{"type": "code_interpreter", "container": {"type": "manual"}}],
                }
            },
        ),
    ]
    for method, path, kwargs in cases:
        answer = await http.request(method, path, **kwargs)
        assert 400 <= answer.status_code < 500, (path, kwargs, answer.text)
        error = answer.json()["error"]
        assert error["code"] and error["message"], (path, error)


async def test_another_replica_starts_the_container_with_its_files(
    start_server: StartServer, redis: Any
) -> None:
    redis.flush()
    first = await _containers_server(start_server, store_url=redis.url)
    second = await _containers_server(start_server, store_url=redis.url)
    container = await first.client.containers.create(name="shared")
    tools: Any = [{"type": "code_interpreter", "container": container.id}]
    await first.client.responses.create(
        model=MODEL,
        input=code("x = 41\nopen('/mnt/data/a.txt', 'w').write('from one')\n"),
        tools=tools,
    )
    # Through the other replica: the files are there, the variables are not (said so).
    there = await second.client.responses.create(
        model=MODEL,
        input=code("print(open('/mnt/data/a.txt').read())\nprint('x' in globals())\n"),
        tools=tools,
    )
    assert "started again" in _logs(there) and "from one\nFalse\n" in _logs(there)
    # Back on the first: its process is stale (the second ran since), so it starts
    # again too, and sees what the second wrote.
    await second.client.responses.create(
        model=MODEL, input=code("open('/mnt/data/b.txt', 'w').write('from two')\n"), tools=tools
    )
    back = await first.client.responses.create(
        model=MODEL, input=code("print(open('/mnt/data/b.txt').read())\n"), tools=tools
    )
    assert "from two\n" in _logs(back)


async def test_a_container_that_cannot_start_fails_the_call_not_the_response(
    start_server: StartServer,
) -> None:
    # Too little address space for the interpreter to start at all.
    server = await start_server(code_interpreter=True, python_memory_mb=4)
    response = await server.client.responses.create(
        model=MODEL, input=code("print(1)\n"), tools=AUTO
    )
    assert response.status == "completed"
    call = _call(response)
    assert call.status == "failed" and "could not start" in _logs(response)
    assert (await server.http.get("/health")).json()["containers"]["live"] == 0
