"""web_search through the 'browser' tool server (a stand-in with fixed results)."""

from __future__ import annotations

from openai.types.responses import ResponseCompletedEvent, ResponseFunctionWebSearch
from openai.types.responses.response_function_web_search import ActionFind, ActionOpenPage

from tests.conftest import StartServer
from tests.support import MODEL, check_stream, read_sse
from tests.tools.servers import SEARCH_RESULTS, RunningMcp


async def test_search_events_and_answer(start_server: StartServer, mcp_browser: RunningMcp) -> None:
    server = await start_server(tool_servers=(f"browser={mcp_browser.url}",))
    for tool_type in ("web_search", "web_search_preview"):
        status, events, _ = await read_sse(
            server.http,
            "POST",
            "/v1/responses",
            json={
                "model": MODEL,
                "input": "search: trio nurseries",
                "tools": [{"type": tool_type}],
                "stream": True,
            },
        )
        assert status == 200
        payloads = [event.json() for event in events[:-1]]
        check_stream(payloads)
        types = [p["type"] for p in payloads]
        for expected in (
            "response.web_search_call.in_progress",
            "response.web_search_call.searching",
            "response.web_search_call.completed",
        ):
            assert expected in types
        final = payloads[-1]["response"]
        call = next(item for item in final["output"] if item["type"] == "web_search_call")
        assert call["status"] == "completed"
        assert call["action"] == {"type": "search", "query": "trio nurseries"}
        answer = final["output"][-1]["content"][0]["text"]
        assert answer == f"Tool result: {SEARCH_RESULTS} (query: trio nurseries)"


async def test_open_and_find_through_the_sdk(
    start_server: StartServer, mcp_browser: RunningMcp
) -> None:
    """browser.open and browser.find reach the browser server; their actions are typed."""
    server = await start_server(tool_servers=(f"browser={mcp_browser.url}",))
    opened = await server.client.responses.create(
        model=MODEL,
        input='browser:open {"id": "https://trio.readthedocs.io/"}',
        tools=[{"type": "web_search"}],
    )
    call = opened.output[1]
    assert isinstance(call, ResponseFunctionWebSearch)
    assert call.status == "completed"
    assert isinstance(call.action, ActionOpenPage)
    assert call.action.url == "https://trio.readthedocs.io/"
    assert opened.output_text == (
        "Tool result: Page https://trio.readthedocs.io/: nurseries own their tasks."
    )

    found = await server.client.responses.create(
        model=MODEL,
        input='browser:find {"pattern": "nursery"}',
        tools=[{"type": "web_search_preview"}],
        stream=True,
    )
    events = [event async for event in found]
    assert [event.type for event in events if "web_search_call" in event.type] == [
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    ]
    final = events[-1]
    assert isinstance(final, ResponseCompletedEvent)
    call = final.response.output[1]
    assert isinstance(call, ResponseFunctionWebSearch)
    assert isinstance(call.action, ActionFind)
    assert call.action.pattern == "nursery"
    assert final.response.output_text == "Tool result: Found 'nursery' on line 3."


async def test_web_search_without_a_browser_server_answers(start_server: StartServer) -> None:
    """Clients that offer web_search with every request (Codex) still get answers: a
    call the model makes anyway tells it that search is not available here."""
    server = await start_server()
    response = await server.http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "search: x", "tools": [{"type": "web_search"}]},
    )
    assert response.status_code == 200
    output = response.json()["output"]
    call = next(item for item in output if item["type"] == "web_search_call")
    assert call["status"] == "failed"
    assert call["action"] == {"type": "search", "query": "x"}
    answer = output[-1]["content"][0]["text"]
    assert "Web search is not available on this server" in answer
