"""The operator page (``--dashboard``): its data endpoints, and the page in a real browser.

The browser test drives the system's headless Chromium with Playwright's sync API in
one worker thread (the sync API belongs to the thread that started it); it calls back
into Trio for what the test does through the openai SDK. With
``TRIO_RESPONSES_SCREENSHOTS=1`` it also writes ``docs/dashboard.png`` and
``docs/dashboard-response.png``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from openai import AsyncOpenAI

from tests.conftest import StartServer
from tests.support import MODEL, Server, read_sse
from tests.webhooks.receiver import Receiver
from trio_responses import Config
from trio_responses.api.common import owner_of

USER_KEY = "user-key-1"
OTHER_KEY = "user-key-2"
ADMIN_KEY = "admin-key-1"
KEYED = {"api_keys": (USER_KEY, OTHER_KEY), "admin_keys": (ADMIN_KEY,), "dashboard": True}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
LONG_JOB = "delay:50 tokens:1000"
"""A scripted answer of 1000 tokens, 50 ms apart: it runs far longer than the test needs."""
ANSWER = " the quick brown fox jumps over a lazy dog"
"""What that answer repeats (`engine.script`)."""
BROWSER_TIMEOUT_MS = 30_000
DOCS = Path(__file__).resolve().parents[2] / "docs"
CHROMIUM = shutil.which("chromium")


def client(server: Server, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)


async def test_dashboard_is_off_by_default(server: Server) -> None:
    for path in ("/dashboard", "/dashboard/dashboard.js", "/dashboard/api/jobs"):
        reply = await server.http.get(path)
        assert reply.status_code == 404, path
        assert reply.json()["error"]["code"] == "not_found"


def test_dashboard_with_api_keys_needs_an_admin_key() -> None:
    with pytest.raises(ValueError, match="--admin-key"):
        Config(dashboard=True, api_keys=(USER_KEY,))


async def test_data_needs_the_admin_key(start_server: StartServer) -> None:
    server = await start_server(**KEYED)
    page = await server.http.get("/dashboard")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for name in ("dashboard.js", "dashboard.css"):
        assert (await server.http.get(f"/dashboard/{name}")).status_code == 200

    requests = [
        ("GET", "/dashboard/api/jobs"),
        ("GET", "/dashboard/api/recent"),
        ("GET", "/dashboard/api/rates"),
        ("GET", "/dashboard/api/webhooks"),
        ("GET", "/dashboard/api/responses/resp_x"),
        ("GET", "/dashboard/api/responses/resp_x/events"),
        ("POST", "/dashboard/api/responses/resp_x/cancel"),
    ]
    for headers, wanted in (
        ({}, "needs an admin key"),
        ({"Authorization": f"Bearer {USER_KEY}"}, "API keys are not admin keys"),
        ({"Authorization": "Bearer wrong"}, "Incorrect admin key"),
    ):
        for method, path in requests:
            reply = await server.http.request(method, path, headers=headers)
            assert reply.status_code == 401, (method, path, headers)
            error = reply.json()["error"]
            assert error["code"] == "invalid_api_key"
            assert wanted in error["message"]
    assert (await server.http.get("/dashboard/api/jobs", headers=ADMIN)).status_code == 200


async def test_data_is_open_without_api_keys(start_server: StartServer) -> None:
    server = await start_server(dashboard=True)
    reply = await server.http.get("/dashboard/api/jobs")
    assert reply.status_code == 200
    assert reply.json()["data"] == []


async def test_admin_sees_follows_and_cancels_every_tenant(start_server: StartServer) -> None:
    server = await start_server(**KEYED)
    mine, other = client(server, USER_KEY), client(server, OTHER_KEY)
    try:
        done = await other.responses.create(model=MODEL, input="hello", background=True)
        handle = server.service.running(done.id, owner=owner_of(OTHER_KEY))
        if handle is not None:
            await handle.wait_closed()  # finished, and among the recent ones
        running = await mine.responses.create(model=MODEL, input=LONG_JOB, background=True)

        jobs = (await server.http.get("/dashboard/api/jobs", headers=ADMIN)).json()
        [job] = jobs["data"]
        assert job["id"] == running.id
        assert job["owner"] == owner_of(USER_KEY)[:8]
        assert job["background"] and job["model"] == MODEL
        recent = (await server.http.get("/dashboard/api/recent", headers=ADMIN)).json()
        [finished] = recent["data"]
        assert finished["id"] == done.id and finished["status"] == "completed"
        assert finished["owner"] == owner_of(OTHER_KEY)[:8]
        assert finished["usage"]["output_tokens"] == finished["output_tokens"] > 0
        assert USER_KEY not in str(jobs) and OTHER_KEY not in str(recent)

        # The other tenant's finished stream, resumed after its third event.
        status, events, _ = await read_sse(
            server.http,
            "GET",
            f"/dashboard/api/responses/{done.id}/events?starting_after=2",
            headers=ADMIN,
        )
        assert status == 200
        numbers = [event.json()["sequence_number"] for event in events if event.data != "[DONE]"]
        assert numbers[0] == 3 and numbers == list(range(3, 3 + len(numbers)))
        assert events[-1].data == "[DONE]"
        assert events[-2].event == "response.completed"

        shown = await server.http.get(f"/dashboard/api/responses/{done.id}", headers=ADMIN)
        assert shown.json()["status"] == "completed"
        refused = await server.http.post(
            f"/dashboard/api/responses/{done.id}/cancel", headers=ADMIN
        )
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == "Cannot cancel a completed response."
        unknown = await server.http.get("/dashboard/api/responses/resp_nothing", headers=ADMIN)
        assert unknown.status_code == 404

        cancelled = await server.http.post(
            f"/dashboard/api/responses/{running.id}/cancel", headers=ADMIN
        )
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "cancelled"
        assert (await mine.responses.retrieve(running.id)).status == "cancelled"
        # The owner's scoping is untouched: the other key still cannot see it.
        with pytest.raises(Exception, match="not found"):
            await other.responses.retrieve(running.id)
    finally:
        await mine.close()
        await other.close()


async def test_token_rate_is_sampled_per_model(start_server: StartServer) -> None:
    server = await start_server(**KEYED)
    mine = client(server, USER_KEY)
    try:
        job = await mine.responses.create(model=MODEL, input=LONG_JOB, background=True)
        rate = 0.0
        with trio.fail_after(30):
            while rate == 0.0:
                await trio.sleep(0.6)  # samples are taken at most every 0.5 s
                rates = (await server.http.get("/dashboard/api/rates", headers=ADMIN)).json()
                [series] = rates["data"]
                assert series["model"] == MODEL and rates["window_s"] == 60
                rate = series["tokens_per_s"]
        # 50 ms a token: about 20 tokens/s (generously bounded: shared CI machines).
        assert 2 < rate < 40
        assert series["output_tokens"] > 0
        await mine.responses.cancel(job.id)
    finally:
        await mine.close()


# -- the page in a real browser ----------------------------------------------------------------


@dataclass
class Browsing:
    """What the browser saw, for the Trio side to check."""

    response_id: str = ""
    page_text: str = ""
    resumed_after: int = -1
    """The ``starting_after`` of the events request after the connection was cut."""
    events: int = 0
    """Events the panel counted (each once)."""


class CuttingProxy:
    """A TCP proxy in front of the server whose open connections the test can cut."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._connections: set[trio.CancelScope] = set()

    async def run(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._relay, listeners)

    def cut(self) -> None:
        """Drop every open connection (the browser sees them fail)."""
        for scope in self._connections:
            scope.cancel()

    async def _relay(self, client: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            self._connections.add(scope)
            try:
                async with client:
                    upstream = await trio.open_tcp_stream("127.0.0.1", self._port)
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(_pipe, client, upstream, nursery.cancel_scope)
                        nursery.start_soon(_pipe, upstream, client, nursery.cancel_scope)
            finally:
                self._connections.discard(scope)


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
    try:
        async for chunk in source:
            await sink.send_all(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()


def drive_dashboard(
    url: str,
    start_job: Callable[[], Awaitable[str]],
    cut_connections: Callable[[], None],
    screenshots: bool,
) -> Browsing:
    """Sign in, watch a job appear, follow its events, cancel it (in a worker thread)."""
    from playwright.sync_api import expect, sync_playwright

    seen = Browsing()
    expect.set_options(timeout=BROWSER_TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.set_default_timeout(BROWSER_TIMEOUT_MS)
            page.goto(url + "/dashboard")

            # An API key is refused; the admin key lets us in.
            key = page.get_by_label("Admin key")
            key.fill(USER_KEY)
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_role("alert")).to_contain_text("API keys are not admin keys")
            key.fill(ADMIN_KEY)
            page.get_by_role("button", name="Sign in").click()
            expect(page.locator("#board")).to_be_visible()
            expect(page.locator("#recent tbody tr")).to_have_count(1)  # another tenant's

            seen.response_id = response_id = trio.from_thread.run(start_job)
            row = page.locator(f'#running tr[data-id="{response_id}"]')
            expect(row).to_be_visible()
            cells = row.locator("td")
            expect(cells.nth(0)).to_have_text(re.compile("queued|in_progress"))
            expect(cells.nth(1)).to_have_text(MODEL)
            expect(cells.nth(2)).to_have_text(owner_of(USER_KEY)[:8])
            expect(cells.nth(5)).not_to_have_text("0")  # output tokens so far
            rate = page.locator(f'#rates li[data-model="{MODEL}"] .rate')
            expect(rate).not_to_have_text("0.0 tokens/s")
            if screenshots:
                # Some seconds of samples first, so that the sparkline has a shape.
                line = page.locator(f'#rates li[data-model="{MODEL}"] polyline')
                expect(line).to_have_attribute("points", re.compile(r"(\S+ ){7}"))
                page.screenshot(path=str(DOCS / "dashboard.png"), full_page=True)

            page.get_by_role("button", name=f"Show the events of {response_id}").click()
            expect(page.locator("#panel-id")).to_have_text(response_id)
            expect(page.locator("#panel-status")).to_have_text("in_progress")
            expect(page.locator("#panel-connection")).to_have_text("live")
            answer = page.locator("#panel-items .item-message pre")
            expect(answer).to_have_text(re.compile(r"\S"))
            so_far = answer.text_content() or ""
            expect(answer).not_to_have_text(so_far)  # deltas keep arriving
            expect(cells.nth(6)).to_have_text("1")  # the panel's own subscription

            # A dropped connection resumes after the last event seen: no gap, no repeat.
            with page.expect_request(re.compile(r"/events\?starting_after=\d+$")) as resumed:
                trio.from_thread.run_sync(cut_connections)
            seen.resumed_after = int(resumed.value.url.rpartition("=")[2])
            expect(page.locator("#panel-connection")).to_have_text("live")
            so_far = answer.text_content() or ""
            expect(answer).not_to_have_text(so_far)
            text = answer.text_content() or ""
            assert (ANSWER * (len(text) // len(ANSWER) + 1)).startswith(text), text
            cancel = page.get_by_role("button", name="Cancel response")
            expect(cancel).to_be_enabled()
            if screenshots:
                page.screenshot(path=str(DOCS / "dashboard-response.png"), full_page=True)

            cancel.click()
            expect(page.locator("#panel-status")).to_have_text("cancelled")
            expect(page.locator("#panel-connection")).to_have_text("ended")
            expect(cancel).to_be_disabled()
            expect(row).to_have_count(0)
            finished = page.locator(f'#recent tr[data-id="{response_id}"] td').nth(0)
            expect(finished).to_have_text("cancelled")
            seen.page_text = page.content()
            seen.events = int(page.locator("#panel-events").text_content() or "0")
        finally:
            browser.close()
    return seen


async def test_dashboard_in_a_browser(start_server: StartServer, nursery: trio.Nursery) -> None:
    if CHROMIUM is None:
        pytest.fail("This test needs Debian's chromium on PATH: apt-get install chromium")
    server = await start_server(**KEYED)
    proxy = CuttingProxy(int(server.url.rpartition(":")[2]))
    port = await nursery.start(proxy.run)
    mine, other = client(server, USER_KEY), client(server, OTHER_KEY)
    try:
        await other.responses.create(model=MODEL, input="hello")

        async def start_job() -> str:
            job = await mine.responses.create(model=MODEL, input=LONG_JOB, background=True)
            return job.id

        screenshots = os.environ.get("TRIO_RESPONSES_SCREENSHOTS") == "1"
        seen: Any = await trio.to_thread.run_sync(
            drive_dashboard, f"http://127.0.0.1:{port}", start_job, proxy.cut, screenshots
        )
        assert (await mine.responses.retrieve(seen.response_id)).status == "cancelled"
        # The panel saw every event of the response exactly once, across the cut.
        assert seen.resumed_after > 0
        _, events, _ = await read_sse(
            server.http, "GET", f"/dashboard/api/responses/{seen.response_id}/events", headers=ADMIN
        )
        assert seen.events == len(events) - 1  # and [DONE]
        for key in (USER_KEY, OTHER_KEY, ADMIN_KEY):
            assert key not in seen.page_text
    finally:
        await mine.close()
        await other.close()


# -- webhook deliveries --------------------------------------------------------------------------


def watch_deliveries(
    url: str, deliver: Callable[[], Awaitable[dict[str, Any]]]
) -> dict[str, list[str]]:
    """No deliveries at first; after ``deliver``, the page's next refreshes show them.

    Returns each shown row's cells (time, type, response, endpoint, status, attempts,
    HTTP status, last error, next attempt) by its class, and the titles of its ids."""
    from playwright.sync_api import expect, sync_playwright

    shown: dict[str, list[str]] = {}
    expect.set_options(timeout=BROWSER_TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.set_default_timeout(BROWSER_TIMEOUT_MS)
            page.goto(url + "/dashboard")
            expect(page.locator("#board")).to_be_visible()
            empty = page.locator("#webhooks-empty")
            expect(empty).to_be_visible()
            expect(empty).to_have_text("No webhook deliveries.")

            deliveries = trio.from_thread.run(deliver)
            rows = page.locator("#webhooks tbody tr")
            expect(rows).to_have_count(2)
            expect(empty).to_be_hidden()
            delivered = page.locator("#webhooks tbody tr.delivered")
            failed = page.locator("#webhooks tbody tr.failed")
            expect(delivered).to_have_count(1)
            expect(failed).to_have_count(1)
            expect(delivered.locator(".status")).to_have_text("delivered")
            expect(delivered.locator(".code")).to_have_text("200")
            expect(delivered.locator(".last-error")).to_have_text("—")
            expect(failed.locator(".status")).to_have_text("failed")
            expect(failed.locator(".code")).to_have_text("500")
            expect(failed.locator(".last-error")).to_have_text("HTTP 500")
            expect(failed.locator(".attempts")).to_have_text(str(deliveries["attempts"]))
            expect(failed.locator(".next")).to_have_text("—")
            for name, row in (("delivered", delivered), ("failed", failed)):
                shown[name] = [text.strip() for text in row.locator("th, td").all_text_contents()]
                shown[name] += [
                    row.locator(".response").get_attribute("title") or "",
                    row.locator(".endpoint").get_attribute("title") or "",
                ]
            # A failure stands out: its status is drawn in the page's "bad" colour.
            colours = [
                row.locator(".status").evaluate("cell => getComputedStyle(cell).color")
                for row in (delivered, failed)
            ]
            assert colours[0] != colours[1], colours
        finally:
            browser.close()
    return shown


async def test_dashboard_shows_webhook_deliveries(
    start_server: StartServer, nursery: trio.Nursery
) -> None:
    if CHROMIUM is None:
        pytest.fail("This test needs Debian's chromium on PATH: apt-get install chromium")
    accepting, refusing = Receiver(), Receiver(default=500)
    await nursery.start(accepting.run)
    await nursery.start(refusing.run)
    server = await start_server(
        dashboard=True,
        webhook_allow_hosts=("127.0.0.1",),
        webhook_first_retry_s=0.05,
        webhook_retry_window_s=1.0,
    )
    client = server.client
    done: Any = ["response.completed"]
    good = await client.webhooks.create(name="good", url=accepting.url, event_types=done)
    bad = await client.webhooks.create(name="bad", url=refusing.url, event_types=done)
    response_id = ""

    async def deliver() -> dict[str, Any]:
        """One background response; until its delivery to the refusing endpoint fails."""
        nonlocal response_id
        response = await client.responses.create(model=MODEL, input="hello", background=True)
        response_id = response.id
        with trio.fail_after(30):
            while True:
                reply = await server.http.get("/dashboard/api/webhooks")
                data = reply.json()["data"]
                if any(delivery["status"] == "failed" for delivery in data):
                    break
                await trio.sleep(0.05)
        [failed] = [delivery for delivery in data if delivery["status"] == "failed"]
        return failed

    shown: Any = await trio.to_thread.run_sync(watch_deliveries, server.url, deliver)
    assert len(accepting.delivered()) == 1
    assert len(refusing.received) >= 2  # retried until the window closed
    for name, endpoint_id, code, error in (
        ("delivered", good.id, "200", "—"),
        ("failed", bad.id, "500", "HTTP 500"),
    ):
        _time, kind, short_response, _endpoint, status, _n, http, last, _next, *ids = shown[name]
        assert (kind, status, http, last) == ("response.completed", name, code, error)
        assert ids == [response_id, endpoint_id]
        assert short_response in (response_id, f"{response_id[:14]}…{response_id[-6:]}")
    assert shown["failed"][5] == str(len(refusing.received))


# -- a code interpreter's images --------------------------------------------------------------

WRITE_PNG = """\
import struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(b"\\x00\\xff\\x00\\x00")) + chunk(b"IEND", b""))
open("/mnt/data/plot.png", "wb").write(png)
print("saved /mnt/data/plot.png")
"""
"""A real 1x1 PNG written with the standard library, saved where the answer cites it."""


def watch_images(url: str, start_job: Callable[[], Awaitable[str]]) -> Browsing:
    """Open a code interpreter response's panel: its logs, its image, its cited file."""
    from playwright.sync_api import expect, sync_playwright

    seen = Browsing()
    expect.set_options(timeout=BROWSER_TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.set_default_timeout(BROWSER_TIMEOUT_MS)
            page.goto(url + "/dashboard")
            expect(page.locator("#board")).to_be_visible()  # no API keys: no sign-in

            seen.response_id = response_id = trio.from_thread.run(start_job)
            # Running, or already finished: its events are replayed from the start.
            page.get_by_role("button", name=f"Show the events of {response_id}").first.click()
            expect(page.locator("#panel-id")).to_have_text(response_id)
            call = page.locator("#panel-items .item-code_interpreter_call")
            expect(call.locator("h3")).to_have_text("code_interpreter_call")
            expect(call.locator("pre").first).to_contain_text("/mnt/data/plot.png")
            expect(call.locator("pre.logs")).to_have_text("saved /mnt/data/plot.png\n")
            image = call.locator("img")
            expect(image).to_have_count(1)
            expect(image).to_have_attribute("src", re.compile(r"^data:image/png;base64,"))
            expect(image).to_have_js_property("naturalWidth", 1)  # decoded
            expect(image).to_have_js_property("naturalHeight", 1)
            cited = page.locator("#panel-items .item-message .cited-files li")
            expect(cited).to_have_text(["plot.png"])
            expect(page.locator("#panel-status")).to_have_text("completed")
            expect(page.locator("#panel-connection")).to_have_text("ended")
            seen.page_text = page.content()
        finally:
            browser.close()
    return seen


async def test_dashboard_shows_a_code_interpreters_images(
    start_server: StartServer,
) -> None:
    if CHROMIUM is None:
        pytest.fail("This test needs Debian's chromium on PATH: apt-get install chromium")
    server = await start_server(
        dashboard=True,
        code_interpreter=True,
        python_cpu_s=5,
        python_wall_s=20,
        python_memory_mb=256,
    )

    async def start_job() -> str:
        job = await server.client.responses.create(
            model=MODEL,
            # delay: the scripted model writes the call slowly enough to be followed live.
            input=f"Run it (delay:20).\n```python\n{WRITE_PNG}```",
            tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
            include=["code_interpreter_call.outputs"],
            background=True,
        )
        return job.id

    seen: Any = await trio.to_thread.run_sync(watch_images, server.url, start_job)
    done = await server.client.responses.retrieve(seen.response_id)
    assert done.status == "completed"
    call = next(item for item in done.output if item.type == "code_interpreter_call")
    [image] = [output for output in call.outputs or [] if output.type == "image"]
    assert image.url in seen.page_text  # the very image the response holds
