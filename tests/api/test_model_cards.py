"""``/v1/models``: OpenAI's model objects, and the metadata Codex configures itself from."""

from __future__ import annotations

from tests.conftest import StartServer

NAMES = ("gpt-oss-20b", "openai/gpt-oss-120b", "gpt-oss:20b")


async def test_every_served_name_has_a_card(start_server: StartServer) -> None:
    server = await start_server(served_model_names=NAMES, max_model_len=65_536)
    listed = await server.client.models.list()
    assert [model.id for model in listed.data] == list(NAMES)

    body = (await server.http.get("/v1/models")).json()
    cards = {card["slug"]: card for card in body["models"]}
    assert list(cards) == list(NAMES)
    card = cards["openai/gpt-oss-120b"]
    assert [level["effort"] for level in card["supported_reasoning_levels"]] == [
        "low",
        "medium",
        "high",
    ]
    assert card["default_reasoning_level"] == "medium"
    assert card["context_window"] == card["max_context_window"] == 65_536
    assert card["input_modalities"] == ["text"]
    assert card["apply_patch_tool_type"] == "freeform"
    assert card["supports_parallel_tool_calls"] is True
    assert card["supports_search_tool"] is True
    assert card["supports_reasoning_summaries"] is False
    assert card["model_messages"]["instructions_template"].startswith("You are Codex")


async def test_names_with_slashes_and_colons_are_retrieved(start_server: StartServer) -> None:
    server = await start_server(served_model_names=NAMES)
    for name in NAMES:
        model = await server.client.models.retrieve(name)
        assert model.id == name
    missing = await server.http.get("/v1/models/openai/gpt-oss-999b")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
