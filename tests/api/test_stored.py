"""Delete, input items, previous_response_id, store: false — through HTTP."""

from __future__ import annotations

import openai
import pytest

from tests.support import MODEL, Server


async def test_delete_then_gone(server: Server) -> None:
    response = await server.client.responses.create(model=MODEL, input="delete me")
    deleted = await server.http.delete(f"/v1/responses/{response.id}")
    assert deleted.status_code == 200
    assert deleted.json() == {"id": response.id, "object": "response.deleted", "deleted": True}
    assert (await server.http.get(f"/v1/responses/{response.id}")).status_code == 404
    assert (await server.http.delete(f"/v1/responses/{response.id}")).status_code == 404
    assert (await server.http.delete("/v1/responses/resp_never")).status_code == 404


async def test_delete_in_flight_is_400(server: Server) -> None:
    running = await server.client.responses.create(
        model=MODEL, input="tokens:3000 delay:5", background=True
    )
    refused = await server.http.delete(f"/v1/responses/{running.id}")
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "response_id"
    await server.client.responses.cancel(running.id)
    await server.service.wait(running.id)
    await server.client.responses.delete(running.id)
    with pytest.raises(openai.NotFoundError):
        await server.client.responses.retrieve(running.id)
    stream = await server.http.get(f"/v1/responses/{running.id}?stream=true")
    assert stream.status_code == 404


INPUT = [
    {"role": "developer", "content": "Be terse."},
    {"role": "user", "content": "one"},
    {"role": "assistant", "content": "ok"},
    {"role": "user", "content": [{"type": "input_text", "text": "two"}]},
    {"role": "user", "content": "three"},
]


async def test_input_items_pages_and_auto_pagination(server: Server) -> None:
    response = await server.client.responses.create(model=MODEL, input=INPUT)  # type: ignore[arg-type]
    first = await server.http.get(
        f"/v1/responses/{response.id}/input_items", params={"limit": 2, "order": "asc"}
    )
    page = first.json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [item["role"] for item in page["data"]] == ["developer", "user"]
    assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][1]["id"]
    second = await server.http.get(
        f"/v1/responses/{response.id}/input_items",
        params={"limit": 2, "order": "asc", "after": page["last_id"]},
    )
    assert [item["role"] for item in second.json()["data"]] == ["assistant", "user"]

    items = [item async for item in server.client.responses.input_items.list(response.id, limit=2)]
    texts = [item.content[0].text for item in items]  # type: ignore[union-attr]
    assert texts == ["three", "two", "ok", "one", "Be terse."]  # default order: newest first
    assert all(item.id and item.type == "message" for item in items)
    assert len({item.id for item in items}) == 5


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=x", "order=up", "after=nope"])
async def test_input_items_bad_parameters(server: Server, query: str) -> None:
    response = await server.client.responses.create(model=MODEL, input="x")
    bad = await server.http.get(f"/v1/responses/{response.id}/input_items?{query}")
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == query.split("=")[0]


async def test_input_items_of_unknown_response_is_404(server: Server) -> None:
    assert (await server.http.get("/v1/responses/resp_x/input_items")).status_code == 404


async def test_previous_response_chains_context(server: Server) -> None:
    first = await server.client.responses.create(model=MODEL, input="first turn")
    second = await server.client.responses.create(
        model=MODEL, input="second turn", previous_response_id=first.id
    )
    third = await server.client.responses.create(
        model=MODEL, input="third turn", previous_response_id=second.id
    )
    assert third.output_text == "You said: third turn"
    assert first.usage and second.usage and third.usage
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    # Only this request's input is listed; the context stays with its own response.
    listed = [item async for item in server.client.responses.input_items.list(third.id)]
    assert len(listed) == 1


async def test_previous_response_errors(server: Server) -> None:
    unknown = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "x", "previous_response_id": "resp_unknown"},
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["param"] == "previous_response_id"

    running = await server.client.responses.create(
        model=MODEL, input="tokens:3000 delay:5", background=True
    )
    busy = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "x", "previous_response_id": running.id},
    )
    assert busy.status_code == 400
    assert "still" in busy.json()["error"]["message"]
    await server.client.responses.cancel(running.id)

    unstored = await server.client.responses.create(model=MODEL, input="x", store=False)
    after_unstored = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "y", "previous_response_id": unstored.id},
    )
    assert after_unstored.status_code == 404


async def test_instructions_are_not_inherited(server: Server) -> None:
    async def follow_up(instructions: str | None) -> int:
        first = await server.client.responses.create(
            model=MODEL, input="a", instructions=instructions
        )
        second = await server.client.responses.create(
            model=MODEL, input="b", previous_response_id=first.id
        )
        assert second.instructions is None and second.usage is not None
        return second.usage.input_tokens

    # The follow-up's prompt is the same whether or not the first had instructions.
    assert await follow_up("Speak like a pirate, always.") == await follow_up(None)
