"""A loopback stand-in for the web: the four search providers and some pages.

One ASGI app on ``127.0.0.1`` (port 0, hypercorn): each provider answers at its own
prefix in the JSON its API documents, only with the key the tests use, and
every search lists the same two pages of this server:

    GET  /searxng/search?q=Q&format=json            SearXNG
    GET  /brave/res/v1/web/search?q=Q&count=N       Brave (X-Subscription-Token)
    POST /tavily/search  {"query", "max_results"}   Tavily (Authorization: Bearer)
    POST /exa/search     {"query", "numResults"}    Exa (x-api-key)

    GET  /pages/nurseries   an HTML page with a link to /pages/cancellation
    GET  /pages/cancellation
    GET  /pages/moved       302 to /pages/nurseries
    GET  /pages/escape      302 to the same server on 127.0.0.2 (another host)
    GET  /pages/huge        3 MiB of text, ``THE END`` last
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig

KEYS = {"BRAVE_API_KEY": "brave-key", "TAVILY_API_KEY": "tavily-key", "EXA_API_KEY": "exa-key"}

NURSERIES_HTML = """<!doctype html>
<html><head><title>Nurseries and spawning</title><style>p { color: red }</style>
<script>var hidden = "script text";</script></head>
<body><h1>Nurseries</h1>
<p>A nursery supervises its child tasks: it waits until every one has finished.</p>
<p>Read about <a href="/pages/cancellation">cancel scopes</a> next.</p>
<p>Tasks are started with start_soon.</p>
</body></html>"""

CANCELLATION_HTML = """<html><head><title>Cancellation</title></head>
<body><p>A cancel scope cancels everything inside it.</p></body></html>"""

HUGE_BYTES = 3 * 1024 * 1024

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class WebFakes:
    url: str
    """``http://127.0.0.1:PORT``"""
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(method, path) of every request, in order."""

    @property
    def page_requests(self) -> list[str]:
        return [path for _, path in self.requests if path.startswith("/pages/")]

    def page(self, name: str) -> str:
        return f"{self.url}/pages/{name}"


def _results(base: str) -> list[tuple[str, str, str]]:
    return [
        (
            "Nurseries and spawning",
            f"{base}/pages/nurseries",
            "A nursery supervises its child tasks.",
        ),
        ("Cancellation", f"{base}/pages/cancellation", "Cancel scopes cancel what they hold."),
    ]


def _search_answer(provider: str, base: str, query: str) -> dict[str, Any]:
    """The provider's documented answer shape."""
    results = _results(base)
    listed: list[dict[str, Any]]
    if provider == "searxng":
        listed = [{"url": u, "title": t, "content": s, "engine": "fake"} for t, u, s in results]
        return {"query": query, "number_of_results": len(listed), "results": listed}
    if provider == "brave":
        listed = [{"title": t, "url": u, "description": s} for t, u, s in results]
        return {"type": "search", "query": {"original": query}, "web": {"results": listed}}
    if provider == "tavily":
        listed = [{"title": t, "url": u, "content": s, "score": 0.9} for t, u, s in results]
        return {"query": query, "results": listed, "response_time": 0.1}
    listed = [{"id": u, "title": t, "url": u, "text": s} for t, u, s in results]
    return {"requestId": "fake", "results": listed}


def _authorized(provider: str, headers: dict[str, str]) -> bool:
    if provider == "brave":
        return headers.get("x-subscription-token") == KEYS["BRAVE_API_KEY"]
    if provider == "tavily":
        return headers.get("authorization") == f"Bearer {KEYS['TAVILY_API_KEY']}"
    if provider == "exa":
        return headers.get("x-api-key") == KEYS["EXA_API_KEY"]
    return True


async def _respond(
    send: Send, status: int, body: bytes, content_type: str, extra: list[tuple[bytes, bytes]]
) -> None:
    headers = [(b"content-type", content_type.encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _app(fakes: WebFakes) -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path: str = scope["path"]
        method: str = scope["method"]
        fakes.requests.append((method, path))
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        base = fakes.url
        provider = path.strip("/").partition("/")[0]
        if provider in ("searxng", "brave", "tavily", "exa") and path.endswith("/search"):
            if not _authorized(provider, headers):
                await _respond(send, 401, b'{"error": "bad key"}', "application/json", [])
                return
            if method == "POST":
                query = str(json.loads(body)["query"])
            else:
                query = parse_qs(scope["query_string"].decode())["q"][0]
            answer = json.dumps(_search_answer(provider, base, query)).encode()
            await _respond(send, 200, answer, "application/json", [])
        elif path == "/pages/nurseries":
            await _respond(send, 200, NURSERIES_HTML.encode(), "text/html; charset=utf-8", [])
        elif path == "/pages/cancellation":
            await _respond(send, 200, CANCELLATION_HTML.encode(), "text/html", [])
        elif path == "/pages/moved":
            await _respond(send, 302, b"", "text/plain", [(b"location", b"/pages/nurseries")])
        elif path == "/pages/escape":
            elsewhere = base.replace("127.0.0.1", "127.0.0.2") + "/pages/nurseries"
            await _respond(send, 302, b"", "text/plain", [(b"location", elsewhere.encode())])
        elif path == "/pages/huge":
            line = b"lorem ipsum dolor sit amet " * 3 + b"\n"
            huge = line * (HUGE_BYTES // len(line)) + b"THE END\n"
            await _respond(send, 200, huge, "text/plain", [])
        else:
            await _respond(send, 404, b"not found", "text/plain", [])

    return app


async def serve_web_fakes(
    *, task_status: trio.TaskStatus[WebFakes] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the fakes on ``127.0.0.1`` until cancelled."""
    fakes = WebFakes(url="")
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(hypercorn.trio.serve, _app(fakes), config))  # type: ignore[arg-type]
        fakes.url = urls[0]
        task_status.started(fakes)
