"""``POST /v1/responses/compact``: the model's summary of a conversation, sealed in a
``compaction`` item, that a later response continues from."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import trio

from tests.conftest import StartServer
from tests.support import MODEL, Server
from trio_responses._compaction import COMPACTION_PROMPT

KEY = "33" * 32
SUMMARY_PREFIX = "Summary of the earlier conversation: "
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "My name is Ada."},
    {"role": "assistant", "content": "Hello Ada."},
    {"role": "user", "content": "I like trains."},
    {"role": "assistant", "content": "Trains are great."},
]


@pytest.fixture
async def server(start_server: StartServer) -> Server:
    return await start_server(encryption_key=KEY)


async def count(server: Server, items: list[dict[str, Any]]) -> int:
    counted = await server.client.responses.input_tokens.count(model=MODEL, input=items)  # type: ignore[arg-type]
    return counted.input_tokens


def dumped(output: list[Any]) -> list[dict[str, Any]]:
    # The SDK types output messages as assistant ones: kept user messages do not fit.
    return [item.model_dump(exclude_none=True, warnings=False) for item in output]


async def test_compact_keeps_user_messages_and_ends_with_a_sealed_summary(
    server: Server,
) -> None:
    compacted = await server.client.responses.compact(model=MODEL, input=CONVERSATION)  # type: ignore[arg-type]
    assert compacted.object == "response.compaction"
    assert isinstance(compacted.created_at, int)
    items = dumped(compacted.output)
    assert [(item["type"], item.get("role")) for item in items] == [
        ("message", "user"),
        ("message", "user"),
        ("compaction", None),
    ]
    assert [item["content"][0]["text"] for item in items[:2]] == [
        "My name is Ada.",
        "I like trains.",
    ]
    compaction = items[-1]
    assert compaction["id"].startswith("cmp_") and compaction["encrypted_content"]
    assert "Ada" not in compaction["encrypted_content"]  # sealed, not merely encoded


async def test_compact_usage_is_the_summarizing_pass(server: Server) -> None:
    compacted = await server.client.responses.compact(model=MODEL, input=CONVERSATION)  # type: ignore[arg-type]
    usage = compacted.usage
    # The model read the conversation and the instruction to summarize it.
    instruction = {"role": "user", "content": COMPACTION_PROMPT}
    assert usage.input_tokens == await count(server, [*CONVERSATION, instruction])
    assert usage.output_tokens > usage.output_tokens_details.reasoning_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert server.service.statistics().running_jobs == 0


async def test_continuing_from_the_compacted_output(server: Server) -> None:
    compacted = await server.client.responses.compact(model=MODEL, input=CONVERSATION)  # type: ignore[arg-type]
    follow_up = {"role": "user", "content": "What do I like?"}
    items = [*dumped(compacted.output), follow_up]
    # The model reads the summary it wrote (the scripted one lists the user's messages).
    summary = "Summary: My name is Ada. / I like trains."
    spelled_out = [
        *items[:2],
        {"role": "developer", "content": SUMMARY_PREFIX + summary},
        follow_up,
    ]
    assert await count(server, items) == await count(server, spelled_out)

    answer = await server.client.responses.create(model=MODEL, input=items, store=False)  # type: ignore[arg-type]
    assert answer.status == "completed" and answer.output_text == "You said: What do I like?"

    # Compacting again folds the earlier summary into the new one.
    again = await server.client.responses.compact(model=MODEL, input=items)  # type: ignore[arg-type]
    assert [item.type for item in again.output] == ["message", "message", "message", "compaction"]


async def test_compact_previous_response_id_on_every_store(
    start_server: StartServer, store_url: str
) -> None:
    server = await start_server(encryption_key=KEY, store_url=store_url)
    client = server.client
    first = await client.responses.create(model=MODEL, input="My name is Ada.")
    second = await client.responses.create(
        model=MODEL, input="I like trains.", previous_response_id=first.id
    )
    compacted = await client.responses.compact(
        model=MODEL, previous_response_id=second.id, input="And boats."
    )
    texts = [item.content[0].text for item in compacted.output if item.type == "message"]  # type: ignore[union-attr]
    assert texts == ["My name is Ada.", "I like trains.", "And boats."]
    assert compacted.output[-1].type == "compaction"

    # A stored response that starts from the compacted output, continued by id: the
    # compaction item comes back from the store and opens again.
    third = await client.responses.create(
        model=MODEL,
        input=[*dumped(compacted.output), {"role": "user", "content": "Hi"}],  # type: ignore[list-item]
    )
    assert third.output_text == "You said: Hi"
    fourth = await client.responses.create(
        model=MODEL, input="Still there?", previous_response_id=third.id
    )
    assert fourth.output_text == "You said: Still there?"
    listed = await client.responses.input_items.list(third.id, order="asc")
    assert [item.type for item in listed.data][3] == "compaction"


async def test_compact_unknown_previous_response(server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        await server.client.responses.compact(model=MODEL, previous_response_id="resp_missing")
    assert raised.value.param == "previous_response_id"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": MODEL, "input": "hi", "tools": []}, "tools", "unknown_parameter"),
        ({"model": MODEL, "input": "hi", "store": False}, "store", "unknown_parameter"),
        ({"model": MODEL, "input": 3}, "input", None),
        (
            {"model": MODEL, "input": [{"role": "user", "content": "hi", "x": 1}]},
            "input[0].x",
            None,
        ),
        ({"model": MODEL}, "input", "missing_required_parameter"),
        ({"model": "nope", "input": "hi"}, "model", "model_not_found"),
        (["not", "an", "object"], None, "invalid_type"),
    ],
    ids=[
        "create-only field",
        "store",
        "bad input",
        "unknown item field",
        "nothing",
        "model",
        "array",
    ],
)
async def test_compact_bad_bodies(
    server: Server, body: Any, param: str | None, code: str | None
) -> None:
    response = await server.http.post("/v1/responses/compact", json=body)
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"]
    if code is not None:
        assert error["code"] == code


async def test_compact_without_model_uses_the_served_one(server: Server) -> None:
    response = await server.http.post(
        "/v1/responses/compact", json={"model": None, "input": "hello"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["output"][-1]["type"] == "compaction"


async def test_changed_or_foreign_compaction_item_is_refused(start_server: StartServer) -> None:
    server = await start_server(encryption_key=KEY, api_keys=["key-a", "key-b"])
    compacted = await server.client.responses.compact(model=MODEL, input=CONVERSATION)  # type: ignore[arg-type]
    items = [*dumped(compacted.output), {"role": "user", "content": "Hi"}]
    other = openai.AsyncOpenAI(base_url=server.base_url, api_key="key-b", max_retries=0)
    async with other:
        with pytest.raises(openai.BadRequestError) as foreign:
            await other.responses.create(model=MODEL, input=items)  # type: ignore[arg-type]
    assert foreign.value.code == "invalid_encrypted_content"
    assert foreign.value.param == "input[2].encrypted_content"

    blob = items[2]["encrypted_content"]
    items[2] = {
        **items[2],
        "encrypted_content": blob[:-4] + ("AAAA" if blob[-4:] != "AAAA" else "BBBB"),
    }
    with pytest.raises(openai.BadRequestError) as changed:
        await server.client.responses.create(model=MODEL, input=items)  # type: ignore[arg-type]
    assert changed.value.code == "invalid_encrypted_content"
    assert changed.value.param == "input[2].encrypted_content"

    # A reasoning blob is not a compaction blob, even for the same key.
    reasoning = await server.client.responses.create(
        model=MODEL, input="hi", include=["reasoning.encrypted_content"], store=False
    )
    assert reasoning.output[0].type == "reasoning"
    items[2] = {**items[2], "encrypted_content": reasoning.output[0].encrypted_content}
    with pytest.raises(openai.BadRequestError) as swapped:
        await server.client.responses.create(model=MODEL, input=items)  # type: ignore[arg-type]
    assert swapped.value.code == "invalid_encrypted_content"


async def test_client_going_away_stops_the_summary(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await start_server(encryption_key=KEY, token_delay_s=0.5)
    runner = server.service._runner
    original = runner.start
    started = trio.Event()
    handles: list[Any] = []

    async def start(*args: Any, **kwargs: Any) -> Any:
        handle = await original(*args, **kwargs)
        handles.append(handle)
        started.set()
        return handle

    monkeypatch.setattr(runner, "start", start)

    async def compact() -> None:
        await server.client.responses.compact(model=MODEL, input=CONVERSATION)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(compact)
        with trio.fail_after(10):
            await started.wait()
        nursery.cancel_scope.cancel()  # the client hangs up
    with trio.fail_after(5):
        await handles[0].wait_closed()
    assert handles[0].status == "cancelled"
    stats = server.service.statistics()
    assert (stats.running_jobs, stats.job_tasks) == (0, 0)
