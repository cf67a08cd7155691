"""web_search through the bundled browser tool server, against loopback fakes of the
search providers and of web pages (`web_fakes`): what the model reads, what the
client sees, and what the browser refuses to fetch."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import trio

from tests.conftest import StartServer
from tests.support import MODEL, Server
from tests.tools.servers import RunningMcp, serve_mcp
from tests.tools.web_fakes import KEYS, WebFakes, serve_web_fakes
from trio_responses import Config
from trio_responses._exceptions import StartupError
from trio_responses._opening import open_responses_service
from trio_responses.tools.browser import PageFetcher, Sessions, build_server, parse_provider

PROVIDERS = ("searxng", "brave", "tavily", "exa")


@pytest.fixture
async def web(nursery: trio.Nursery) -> WebFakes:
    fakes: WebFakes = await nursery.start(serve_web_fakes)
    return fakes


async def _browser(nursery: trio.Nursery, web: WebFakes, provider: str = "searxng") -> str:
    """The bundled browser in process, over streamable HTTP; pages on 127.0.0.1 allowed."""
    spec = parse_provider(f"{provider}={web.url}/{provider}", KEYS)
    running: RunningMcp = await nursery.start(
        serve_mcp, build_server(spec, PageFetcher(("127.0.0.1",)))
    )
    return running.url


async def _ask(
    server: Server, text: str, previous: str | None = None, **tool: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "input": text,
        "tools": [{"type": "web_search", **tool}],
    }
    if previous is not None:
        body["previous_response_id"] = previous
    response = await server.http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _call(response: dict[str, Any]) -> dict[str, Any]:
    return next(item for item in response["output"] if item["type"] == "web_search_call")


def _answer(response: dict[str, Any]) -> str:
    text: str = response["output"][-1]["content"][0]["text"]
    return text


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_search_shows_the_providers_results(
    start_server: StartServer, nursery: trio.Nursery, web: WebFakes, provider: str
) -> None:
    server = await start_server(tool_servers=(f"browser={await _browser(nursery, web, provider)}",))
    response = await _ask(server, "search: trio nurseries")
    call = _call(response)
    assert call["status"] == "completed"
    assert call["action"] == {
        "type": "search",
        "query": "trio nurseries",
        "sources": [
            {"type": "url", "url": web.page("nurseries")},
            {"type": "url", "url": web.page("cancellation")},
        ],
    }
    answer = _answer(response)
    assert answer.startswith("Tool result: [0] Search results for `trio nurseries`")
    assert "L2: # 【0†Nurseries and spawning†127.0.0.1】" in answer
    assert "A nursery supervises its child tasks." in answer
    assert "【1†Cancellation†127.0.0.1】" in answer
    assert web.requests[-1][1].startswith(f"/{provider}/")
    assert web.page_requests == []


async def test_open_a_result_follow_its_link_and_find(
    start_server: StartServer, nursery: trio.Nursery, web: WebFakes
) -> None:
    """Link ids and the current page carry over to the response that continues."""
    server = await start_server(tool_servers=(f"browser={await _browser(nursery, web)}",))
    searched = await _ask(server, "search: trio nurseries")
    opened = await _ask(server, 'browser:open {"id": 0}', searched["id"])
    assert _call(opened)["status"] == "completed"
    answer = _answer(opened)
    assert answer.startswith(f"Tool result: [1] Nurseries and spawning ({web.page('nurseries')})")
    assert "A nursery supervises its child tasks: it waits until every one has finished." in answer
    assert "Read about 【0†cancel scopes†127.0.0.1】 next." in answer
    assert "script text" not in answer and "color: red" not in answer

    found = await _ask(server, 'browser:find {"pattern": "START_SOON"}', opened["id"])
    assert _call(found)["action"]["type"] == "find_in_page"
    answer = _answer(found)
    assert "Find results for `START_SOON` in `Nurseries and spawning`" in answer
    assert "Tasks are started with start_soon." in answer

    followed = await _ask(server, 'browser:open {"id": 0, "cursor": 1}', found["id"])
    assert "A cancel scope cancels everything inside it." in _answer(followed)
    assert web.page_requests == ["/pages/nurseries", "/pages/cancellation"]


async def test_open_a_url_through_a_redirect(
    start_server: StartServer, nursery: trio.Nursery, web: WebFakes
) -> None:
    server = await start_server(tool_servers=(f"browser={await _browser(nursery, web)}",))
    response = await _ask(server, f'browser:open {{"id": "{web.page("moved")}"}}')
    assert _call(response)["action"] == {"type": "open_page", "url": web.page("moved")}
    assert _answer(response).startswith(
        f"Tool result: [0] Nurseries and spawning ({web.page('nurseries')})"
    )
    assert web.page_requests == ["/pages/moved", "/pages/nurseries"]


async def test_a_private_host_not_allowed_is_refused(
    start_server: StartServer, nursery: trio.Nursery, web: WebFakes
) -> None:
    server = await start_server(tool_servers=(f"browser={await _browser(nursery, web)}",))
    elsewhere = web.page("nurseries").replace("127.0.0.1", "127.0.0.2")
    response = await _ask(server, f'browser:open {{"id": "{elsewhere}"}}')
    assert _call(response)["status"] == "failed"
    assert _answer(response).endswith(
        f"Refused to open {elsewhere}: 127.0.0.2 is a private or local address "
        "(127.0.0.2). The browser opens public hosts only, unless the server allows this "
        "one (--allow-host 127.0.0.2)."
    )
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x"):
        refused = await _ask(server, f'browser:open {{"id": "{url}"}}')
        assert "Only http and https pages can be opened" in _answer(refused)
    assert web.page_requests == []


async def test_a_redirect_to_a_host_not_allowed_is_refused(
    start_server: StartServer, nursery: trio.Nursery, web: WebFakes
) -> None:
    server = await start_server(tool_servers=(f"browser={await _browser(nursery, web)}",))
    response = await _ask(server, f'browser:open {{"id": "{web.page("escape")}"}}')
    assert _call(response)["status"] == "failed"
    elsewhere = web.page("nurseries").replace("127.0.0.1", "127.0.0.2")
    assert f"Refused to open {elsewhere}: 127.0.0.2 is a private" in _answer(response)
    assert web.page_requests == ["/pages/escape"]


async def test_a_huge_page_is_cut_at_2_mib(
    start_server: StartServer, nursery: trio.Nursery, web: WebFakes
) -> None:
    server = await start_server(tool_servers=(f"browser={await _browser(nursery, web)}",))
    end = await _ask(server, f'browser:open {{"id": "{web.page("huge")}", "loc": 1000000}}')
    assert _answer(end).endswith(": [The page was cut at 2 MiB.]")
    found = await _ask(server, 'browser:find {"pattern": "THE END"}', end["id"])
    assert "No `THE END` found" in _answer(found)


async def test_without_external_web_access_nothing_is_fetched(
    start_server: StartServer, nursery: trio.Nursery, web: WebFakes
) -> None:
    """Search results can be read (their snippets); no page is fetched."""
    server = await start_server(tool_servers=(f"browser={await _browser(nursery, web)}",))
    offline: dict[str, Any] = {"external_web_access": False}
    searched = await _ask(server, "search: trio nurseries", **offline)
    assert "【0†Nurseries and spawning†127.0.0.1】" in _answer(searched)
    snippet = await _ask(server, 'browser:open {"id": 0}', searched["id"], **offline)
    answer = _answer(snippet)
    assert "Live web access is off: this is the search result's snippet" in answer
    assert "A nursery supervises its child tasks." in answer
    other = await _ask(server, f'browser:open {{"id": "{web.page("huge")}"}}', **offline)
    assert _call(other)["status"] == "failed"
    assert "live web access is off for this response" in _answer(other)
    assert web.page_requests == []

    live = await _ask(server, 'browser:open {"id": 0, "cursor": 0}', snippet["id"])
    assert "it waits until every one has finished." in _answer(live)  # the page, not the snippet
    assert web.page_requests == ["/pages/nurseries"]


async def test_serve_web_search_runs_the_bundled_server(
    start_server: StartServer, web: WebFakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--web-search: the browser as a stdio child, given its provider's key."""
    monkeypatch.setenv("BRAVE_API_KEY", KEYS["BRAVE_API_KEY"])
    server = await start_server(
        web_search=f"brave={web.url}/brave", web_search_allow_hosts=("127.0.0.1",)
    )
    searched = await _ask(server, "search: trio nurseries")
    assert "【0†Nurseries and spawning†127.0.0.1】" in _answer(searched)
    opened = await _ask(server, 'browser:open {"id": 1}', searched["id"])
    assert "A cancel scope cancels everything inside it." in _answer(opened)
    assert web.page_requests == ["/pages/cancellation"]


async def test_a_missing_api_key_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    missing = r"provider tavily needs an API key: set TAVILY_API_KEY$"
    with pytest.raises(StartupError, match=missing):
        async with open_responses_service(Config(web_search="tavily")):
            pass
    env = {k: v for k, v in os.environ.items() if k != "EXA_API_KEY"}
    command = [sys.executable, "-m", "trio_responses", "tool-server", "browser", "--stdio"]
    done = await trio.run_process(
        [*command, "--provider", "exa"], env=env, capture_stderr=True, check=False
    )
    assert done.returncode == 1
    assert b"web search provider exa needs an API key: set EXA_API_KEY" in done.stderr
    done = await trio.run_process(
        [*command, "--provider", "bing"], capture_stderr=True, check=False, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 1
    assert b"use searxng=URL, brave[=URL], tavily[=URL] or exa[=URL]" in done.stderr


def test_config_refuses_two_browsers_and_unknown_providers() -> None:
    with pytest.raises(ValueError, match=r"--web-search and --tool-server browser=\.\.\. both"):
        Config(web_search="brave", tool_servers=("browser=http://127.0.0.1:1/mcp",))
    with pytest.raises(ValueError, match="--web-search 'bing': use searxng=URL, brave"):
        Config(web_search="bing")
    with pytest.raises(ValueError, match="--web-search 'searxng'"):
        Config(web_search="searxng")


def test_sessions_are_bounded() -> None:
    sessions = Sessions(limit=3)
    first = sessions.get("a")
    for key in "bcd":
        sessions.get(key, parent="a")
    assert len(sessions) == 3
    assert sessions.get("a") is not first  # the least recently used went first
