"""The Conversations API through the real server and the openai SDK, on every backend.

``client.conversations.*`` (CRUD, items) and ``client.responses.create(conversation=…)``:
a response on a conversation reads its items as context and, once it completes,
appends its input and output items; one response at a time runs on a conversation
(400 ``conversation_locked`` for a second, on any replica); another API key sees
nothing; a SQLite store keeps conversations across a restart.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import openai
import pytest
import trio
from openai import AsyncOpenAI
from openai.types.conversations import Conversation

from tests.conftest import StartServer
from tests.redis_server import RedisServer
from tests.support import MODEL, Server, run_server, validate_response
from trio_responses import Config, InvalidRequestError
from trio_responses._lease import ConversationTurn
from trio_responses.store.base import State, StoredConversation
from trio_responses.store.open import open_state

KEYS = ("key-a", "key-b")
LONG = "tokens:5000 delay:10"
"""About 50 s of output: a response that runs until it is cancelled."""
LIMIT_S = 30.0
SUMMARIZE = "Summarize the conversation so far"
"""The scripted model answers it with the earlier user messages' texts."""


@asynccontextmanager
async def client_of(server: Server, key: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0) as client:
        yield client


def user(text: str) -> dict[str, str]:
    return {"type": "message", "role": "user", "content": text}


async def item_ids(client: AsyncOpenAI, conversation_id: str) -> list[str]:
    page = await client.conversations.items.list(conversation_id, order="asc", limit=100)
    return [item.id for item in page.data if item.id is not None]


async def test_conversation_crud_through_the_sdk(start_server: StartServer, store_url: str) -> None:
    server = await start_server(store_url=store_url)
    client = server.client
    created = await client.conversations.create(items=[user("first")], metadata={"topic": "a"})
    assert isinstance(created, Conversation)
    assert created.id.startswith("conv_") and created.object == "conversation"
    assert created.metadata == {"topic": "a"}
    retrieved = await client.conversations.retrieve(created.id)
    assert retrieved.id == created.id and retrieved.created_at == created.created_at
    updated = await client.conversations.update(created.id, metadata={"topic": "b"})
    assert updated.metadata == {"topic": "b"}
    assert (await client.conversations.retrieve(created.id)).metadata == {"topic": "b"}

    added = await client.conversations.items.create(
        created.id, items=[user("second"), {"role": "assistant", "content": "ok"}]
    )
    assert added.object == "list" and len(added.data) == 2
    ids = await item_ids(client, created.id)
    assert len(ids) == 3 and ids[1:] == [item.id for item in added.data]
    first = await client.conversations.items.retrieve(ids[0], conversation_id=created.id)
    assert first.type == "message" and first.content[0].text == "first"  # type: ignore[union-attr]

    newest = await client.conversations.items.list(created.id, limit=1)
    assert [item.id for item in newest.data] == [ids[2]] and newest.has_more
    assert newest.first_id == newest.last_id == ids[2]
    paged = [item.id async for item in client.conversations.items.list(created.id, limit=1)]
    assert paged == ids[::-1]  # the SDK follows after=last_id

    conversation = await client.conversations.items.delete(ids[1], conversation_id=created.id)
    assert conversation.id == created.id
    assert await item_ids(client, created.id) == [ids[0], ids[2]]
    with pytest.raises(openai.NotFoundError) as missing:
        await client.conversations.items.retrieve(ids[1], conversation_id=created.id)
    assert missing.value.body["param"] == "item_id"  # type: ignore[index]

    deleted = await client.conversations.delete(created.id)
    assert deleted.deleted and deleted.object == "conversation.deleted" and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        await client.conversations.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await client.conversations.items.list(created.id)


async def test_bad_conversation_bodies_are_400_naming_the_param(server: Server) -> None:
    http = server.http
    cases = [
        ({"items": [{"role": "user"}]}, "items[0].content"),
        ({"items": [user(str(n)) for n in range(21)]}, "items"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": {f"k{n}": "v" for n in range(17)}}, "metadata"),
        ({"colour": "blue"}, "colour"),
        ({"items": [{"type": "item_reference", "id": "msg_nothing"}]}, "items[0].id"),
    ]
    for body, param in cases:
        reply = await http.post("/v1/conversations", json=body)
        assert reply.status_code == 400, (body, reply.text)
        error = reply.json()["error"]
        assert error["param"] == param and error["code"], (body, error)
    created = (await http.post("/v1/conversations", json={})).json()
    reply = await http.post(f"/v1/conversations/{created['id']}", json={})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "metadata"
    reply = await http.get(f"/v1/conversations/{created['id']}/items?limit=0")
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "limit"
    reply = await http.get(f"/v1/conversations/{created['id']}/items?order=up")
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "order"
    reply = await http.get(f"/v1/conversations/{created['id']}/items?after=msg_nothing")
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "after"
    reply = await http.get("/v1/conversations/conv%20bad")
    assert reply.status_code == 404


async def test_a_conversation_holds_at_most_max_input_items(start_server: StartServer) -> None:
    server = await start_server(max_input_items=3)
    client = server.client
    conversation = await client.conversations.create(items=[user("a"), user("b")])
    with pytest.raises(openai.BadRequestError) as full:
        await client.conversations.items.create(conversation.id, items=[user("c"), user("d")])
    assert full.value.code == "conversation_too_large"
    assert len(await item_ids(client, conversation.id)) == 2


async def test_responses_continue_a_conversation(start_server: StartServer, store_url: str) -> None:
    server = await start_server(store_url=store_url)
    client = server.client
    conversation = await client.conversations.create(items=[user("the sky is blue")])
    first = await client.responses.create(
        model=MODEL, input="grass is green", conversation=conversation.id
    )
    assert first.status == "completed" and first.output_text == "You said: grass is green"
    assert first.conversation is not None and first.conversation.id == conversation.id
    validate_response(first.model_dump())
    ids = await item_ids(client, conversation.id)
    # the first item, the response's input, then its output (reasoning and message)
    assert ids[-1] == first.output[-1].id and len(ids) == 2 + len(first.output)

    second = await client.responses.create(
        model=MODEL, input=SUMMARIZE, conversation={"id": conversation.id}
    )
    assert "the sky is blue" in second.output_text and "grass is green" in second.output_text
    assert second.conversation is not None and second.conversation.id == conversation.id
    assert second.previous_response_id is None
    # The response's own input items are this request's only.
    listed = await client.responses.input_items.list(second.id)
    assert [item.type for item in listed.data] == ["message"]


async def test_conversation_errors_on_create(server: Server) -> None:
    client = server.client
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.responses.create(model=MODEL, input="hi", conversation="conv_unknown")
    assert unknown.value.body["param"] == "conversation"  # type: ignore[index]
    conversation = await client.conversations.create()
    first = await client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError) as both:
        await client.responses.create(
            model=MODEL, input="hi", conversation=conversation.id, previous_response_id=first.id
        )
    assert both.value.body["param"] == "conversation"  # type: ignore[index]
    assert both.value.code == "mutually_exclusive_parameters"


async def test_one_response_at_a_time_on_a_conversation(
    start_server: StartServer, store_url: str
) -> None:
    server = await start_server(store_url=store_url)
    client = server.client
    conversation = await client.conversations.create(items=[user("hello")])
    running = await client.responses.create(
        model=MODEL, input=LONG, conversation=conversation.id, background=True
    )
    with pytest.raises(openai.BadRequestError) as locked:
        await client.responses.create(model=MODEL, input="hi", conversation=conversation.id)
    assert locked.value.code == "conversation_locked"
    assert locked.value.body["param"] == "conversation"  # type: ignore[index]
    # Another conversation is not held up.
    other = await client.conversations.create()
    assert (await client.responses.create(model=MODEL, input="x", conversation=other.id)).status

    cancelled = await client.responses.cancel(running.id)
    assert cancelled.status == "cancelled"
    with trio.fail_after(LIMIT_S):
        while True:  # the job releases the lock as it ends, just after the cancel
            try:
                after = await client.responses.create(
                    model=MODEL, input="after", conversation=conversation.id
                )
                break
            except openai.BadRequestError as error:
                assert error.code == "conversation_locked"
                await trio.sleep(0.05)
    assert after.output_text == "You said: after"
    # The cancelled turn added nothing; the completed one its input and output.
    items = await client.conversations.items.list(conversation.id, order="asc")
    texts = [item.content[0].text for item in items.data if item.type == "message"]  # type: ignore[union-attr]
    assert texts[0] == "hello" and texts[1] == "after" and LONG not in texts


async def test_conversations_belong_to_their_api_key(start_server: StartServer) -> None:
    server = await start_server(api_keys=KEYS)
    async with client_of(server, KEYS[0]) as alice, client_of(server, KEYS[1]) as bob:
        conversation = await alice.conversations.create(items=[user("secret")])
        item_id = (await item_ids(alice, conversation.id))[0]
        calls = [
            bob.conversations.retrieve(conversation.id),
            bob.conversations.update(conversation.id, metadata={}),
            bob.conversations.delete(conversation.id),
            bob.conversations.items.list(conversation.id),
            bob.conversations.items.create(conversation.id, items=[user("x")]),
            bob.conversations.items.retrieve(item_id, conversation_id=conversation.id),
            bob.conversations.items.delete(item_id, conversation_id=conversation.id),
            bob.responses.create(model=MODEL, input="hi", conversation=conversation.id),
        ]
        for call in calls:
            with pytest.raises(openai.NotFoundError):
                await call
        with pytest.raises(openai.BadRequestError) as foreign:
            await bob.responses.create(
                model=MODEL, input=[{"type": "item_reference", "id": item_id}]
            )
        assert foreign.value.code == "item_not_found"
        assert await item_ids(alice, conversation.id) == [item_id]


async def test_a_conversation_is_shared_by_redis_replicas(
    start_server: StartServer, redis: RedisServer
) -> None:
    """Two replicas (two services, each its own replica id) on one Redis."""
    redis.flush()
    store_url = redis.url
    one = await start_server(store_url=store_url)
    two = await start_server(store_url=store_url)
    assert one.service.state.control.replica != two.service.state.control.replica
    conversation = await one.client.conversations.create(items=[user("from replica one")])
    running = await one.client.responses.create(
        model=MODEL, input=LONG, conversation=conversation.id, background=True
    )
    with pytest.raises(openai.BadRequestError) as locked:
        await two.client.responses.create(model=MODEL, input="hi", conversation=conversation.id)
    assert locked.value.code == "conversation_locked"
    await one.client.responses.cancel(running.id)
    with trio.fail_after(LIMIT_S):
        while True:
            try:
                answer = await two.client.responses.create(
                    model=MODEL, input=SUMMARIZE, conversation=conversation.id
                )
                break
            except openai.BadRequestError as error:
                assert error.code == "conversation_locked"
                await trio.sleep(0.05)
    assert "from replica one" in answer.output_text
    ids = await item_ids(one.client, conversation.id)
    assert ids[-1] == answer.output[-1].id


async def test_sqlite_keeps_conversations_across_a_restart(tmp_path: pathlib.Path) -> None:
    config = Config(port=0, store_url=f"sqlite:///{tmp_path / 'responses.db'}")
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(run_server, config)
        conversation = await server.client.conversations.create(items=[user("kept on disk")])
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(run_server, config)
        client = server.client
        assert (await client.conversations.retrieve(conversation.id)).id == conversation.id
        answer = await client.responses.create(
            model=MODEL, input=SUMMARIZE, conversation=conversation.id
        )
        assert "kept on disk" in answer.output_text
        assert len(await item_ids(client, conversation.id)) == 2 + len(answer.output)
        nursery.cancel_scope.cancel()


async def test_a_response_prepared_before_another_finished_is_refused(
    start_server: StartServer, store_url: str
) -> None:
    """B is prepared (its prompt rendered from the conversation), A runs to completion,
    then B starts: B would run without A's turn, so it is refused, and a retry sees A."""
    server = await start_server(store_url=store_url)
    service = server.service
    conversation = await server.client.conversations.create(items=[user("hello")])
    body = {"model": MODEL, "input": SUMMARIZE, "conversation": conversation.id}
    stale = await service.prepare(body)
    first = await service.create(
        {"model": MODEL, "input": "A turn", "conversation": conversation.id}
    )
    assert (await first.wait())["status"] == "completed"
    with pytest.raises(InvalidRequestError) as changed:
        await service.start(stale)
    assert changed.value.code == "conversation_locked" and changed.value.param == "conversation"
    # The refusal released the lock; the retry continues from A's turn.
    retried = await server.client.responses.create(**body)  # type: ignore[call-overload]
    assert "A turn" in retried.output_text and "hello" in retried.output_text


async def test_a_conversation_is_bounded_by_its_byte_share(start_server: StartServer) -> None:
    server = await start_server(max_store_bytes=4000)
    client = server.client
    conversation = await client.conversations.create(items=[user("a" * 1000)])
    await client.conversations.items.create(conversation.id, items=[user("b" * 1000)])
    with pytest.raises(openai.BadRequestError) as full:
        await client.conversations.items.create(
            conversation.id, items=[user("c" * 1000), user("d" * 1000)]
        )
    assert full.value.code == "conversation_too_large"
    assert full.value.body["param"] == "items"  # type: ignore[index]
    assert "bytes" in full.value.message
    assert len(await item_ids(client, conversation.id)) == 2  # nothing was added
    # A response whose items would not fit completes, but is not appended.
    response = await client.responses.create(
        model=MODEL, input="e" * 1500, conversation=conversation.id
    )
    assert response.status == "completed"
    assert len(await item_ids(client, conversation.id)) == 2
    # The conversation was not evicted to make room: it is still there, and usable.
    assert (await client.conversations.retrieve(conversation.id)).id == conversation.id


async def test_a_full_conversation_is_named_in_the_error(start_server: StartServer) -> None:
    server = await start_server(max_input_items=4)
    client = server.client
    conversation = await client.conversations.create(items=[user("a"), user("b")])
    # Its answer (reasoning and message) would take the conversation past 4 items.
    done = await client.responses.create(model=MODEL, input="c", conversation=conversation.id)
    assert done.status == "completed"
    assert len(await item_ids(client, conversation.id)) == 2  # not appended past the bound
    await client.conversations.items.create(conversation.id, items=[user("c"), user("d")])
    with pytest.raises(openai.BadRequestError) as full:
        await client.responses.create(model=MODEL, input="e", conversation=conversation.id)
    assert full.value.code == "conversation_too_large"
    assert full.value.body["param"] == "conversation"  # type: ignore[index]


async def test_an_empty_item_list(server: Server) -> None:
    conversation = await server.client.conversations.create()
    page = await server.client.conversations.items.list(conversation.id)
    # The SDK's page types last_id as optional: null when empty, as OpenAI's lists.
    assert page.data == [] and not page.has_more and page.last_id is None
    assert [item async for item in server.client.conversations.items.list(conversation.id)] == []
    raw = (await server.http.get(f"/v1/conversations/{conversation.id}/items")).json()
    assert raw == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }


class _FinishedJob:
    """What `ConversationTurn.finish` reads of a job."""

    id = "resp_a"
    status = "completed"
    input_items = [{"type": "message", "id": "msg_in", "role": "user", "content": []}]

    def snapshot(self) -> dict[str, object]:
        return {"output": []}


@asynccontextmanager
async def _turn(store_url: str, lease_s: float) -> AsyncIterator[tuple[ConversationTurn, State]]:
    async with open_state(store_url, Config(store_url=store_url)) as state:
        await state.conversations.create(
            StoredConversation(
                {"id": "conv_1", "object": "conversation", "created_at": 1, "metadata": {}}, None
            ),
            [],
        )
        assert await state.conversations.lock("conv_1", "resp_a", owner=None, lease_s=lease_s)
        turn = ConversationTurn(
            state.conversations,
            conversation_id="conv_1",
            owner=None,
            response_id="resp_a",
            lease_s=lease_s,
            cleanup_s=5.0,
        )
        yield turn, state


async def test_a_finished_turn_stops_renewing_before_it_unlocks(store_url: str) -> None:
    async with _turn(store_url, 0.15) as (turn, state):
        async with trio.open_nursery() as nursery:
            await nursery.start(turn.keep)
            await turn.finish(_FinishedJob())  # type: ignore[arg-type]
            # Renewal has stopped: the lock stays free for several renewal periods.
            for index in range(4):
                await trio.sleep(0.06)
                holder = f"resp_{index}"
                assert await state.conversations.lock("conv_1", holder, owner=None, lease_s=0.01)
            nursery.cancel_scope.cancel()
        items = await state.conversations.items("conv_1", owner=None)
        assert [item["id"] for item in items or []] == ["msg_in"]


async def test_a_turn_that_lost_its_lease_adds_nothing(store_url: str) -> None:
    async with _turn(store_url, 0.05) as (turn, state):
        await trio.sleep(0.1)  # the lease runs out without a renewal
        assert await state.conversations.lock("conv_1", "resp_b", owner=None, lease_s=60)
        assert turn.lost
        await turn.finish(_FinishedJob())  # type: ignore[arg-type]
        assert await state.conversations.items("conv_1", owner=None) == []
        # Its unlock left the other holder's lock alone.
        assert not await state.conversations.lock("conv_1", "resp_c", owner=None, lease_s=60)


async def test_a_sealed_item_of_a_conversation_that_does_not_open_names_it(
    server: Server,
) -> None:
    sealed = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "bogus"}
    conversation = await server.client.conversations.create(items=[sealed])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError) as refused:
        await server.client.responses.create(model=MODEL, input="hi", conversation=conversation.id)
    assert refused.value.code == "invalid_encrypted_content"
    assert refused.value.body["param"] == "conversation"  # type: ignore[index]
