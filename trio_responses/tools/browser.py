"""The bundled browser tool server: gpt-oss's browser tool (``search``, ``open``, ``find``).

    trio-responses tool-server browser --stdio --provider brave      (what --web-search runs)

An MCP server whose tools render what the model reads the way gpt-oss was trained
to read it: a page is a header ``[CURSOR] TITLE (URL)``, a line saying which lines
are shown, and numbered lines ``L12: …``; links are ``【ID†TEXT†DOMAIN】``, and
``open`` follows a link by its id on the current page, or opens a URL. A search's
results are such a page, one link per result. ``find`` lists the lines of the
current page that contain a text.

The search itself goes to one provider (`Provider`, chosen by a spec string):
SearXNG's JSON API, Brave, Tavily or Exa. Their keys come from the environment
(``BRAVE_API_KEY``, ``TAVILY_API_KEY``, ``EXA_API_KEY``); a missing one is a
`ProviderError` before anything starts.

Pages are fetched by `PageFetcher`: http(s) only, the host resolved once and the
connection pinned to the checked address, public addresses only unless an
``--allow-host`` pattern allows the host (`tools.hosts`), every redirect checked
again (at most `MAX_REDIRECTS`), bodies cut at `MAX_BODY_BYTES`.

Each tool also takes three arguments the model never sees (the toolbox adds them,
`tools.builtin.web_search`): ``session`` (the response, or its conversation),
``parent`` (the response it continues: a new session starts from a copy of that
one's pages) and ``live`` (false: no page is fetched; only search results and pages
this session already holds can be opened). Sessions live in a bounded LRU
(`Sessions`). This module imports only `tools.hosts` and `tools.transport` of the
package.
"""

from __future__ import annotations

import ipaddress
import re
import textwrap
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any, Final, final
from urllib.parse import urlencode, urljoin, urlsplit

import anyio
import httpx2
import trio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from .hosts import HostNotAllowed, Target, allowed_hosts
from .transport import PinnedTransport

MAX_REDIRECTS: Final = 5
MAX_BODY_BYTES: Final = 2 * 1024 * 1024
FETCH_TIMEOUT_S: Final = 20.0
SEARCH_TIMEOUT_S: Final = 20.0
LINE_WIDTH: Final = 100
DEFAULT_LINES: Final = 50
MAX_SESSIONS: Final = 256
MAX_PAGES: Final = 32
"""Pages one session keeps (the oldest go first)."""

PROVIDERS: Final = ("searxng", "brave", "tavily", "exa")
KEY_VARIABLES: Final[Mapping[str, str]] = {
    "brave": "BRAVE_API_KEY",
    "tavily": "TAVILY_API_KEY",
    "exa": "EXA_API_KEY",
}
_BASE_URLS: Final[Mapping[str, str]] = {
    "brave": "https://api.search.brave.com",
    "tavily": "https://api.tavily.com",
    "exa": "https://api.exa.ai",
}

DESCRIPTION = (
    "Browse the web: search(query) lists results as links 【ID†TITLE†DOMAIN】; "
    "open(id) follows a link of the current page by its id, or opens a URL; "
    "find(pattern) lists the lines of the current page that contain the text."
)


class ProviderError(ValueError):
    """A provider spec that names no provider, or whose API key is missing."""


@dataclass(frozen=True)
class Provider:
    """Where searches go: ``name`` at ``url`` (with ``key``, for the paid APIs)."""

    name: str
    url: str
    key: str | None = None

    def __repr__(self) -> str:  # never show the key
        return f"Provider({self.name!r}, {self.url!r})"


def parse_provider(spec: str, environ: Mapping[str, str]) -> Provider:
    """``searxng=URL``, ``brave[=URL]``, ``tavily[=URL]`` or ``exa[=URL]``.

    Raises:
        ProviderError: an unknown provider, a URL that is not http(s), SearXNG
            without its URL, or the provider's key variable unset or empty.
    """
    name, sep, url = spec.strip().partition("=")
    name = name.strip().lower()
    if name not in PROVIDERS:
        raise ProviderError(
            f"web search provider {spec!r}: use searxng=URL, brave[=URL], tavily[=URL] or exa[=URL]"
        )
    if name == "searxng" and not url:
        raise ProviderError("web search provider searxng needs its URL: searxng=http://HOST:PORT")
    url = (url or _BASE_URLS.get(name, "")).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProviderError(f"web search provider {spec!r}: {url!r} is not an http(s) URL")
    if sep and not url:
        raise ProviderError(f"web search provider {spec!r}: the URL after '=' is empty")
    variable = KEY_VARIABLES.get(name)
    if variable is None:
        return Provider(name, url)
    key = environ.get(variable, "").strip()
    if not key:
        raise ProviderError(f"web search provider {name} needs an API key: set {variable}")
    return Provider(name, url, key)


@dataclass(frozen=True)
class Result:
    title: str
    url: str
    snippet: str


def _request(provider: Provider, query: str, count: int) -> httpx2.Request:
    """The provider's search request, as its API documents it."""
    if provider.name == "searxng":
        params = {"q": query, "format": "json"}
        return httpx2.Request("GET", f"{provider.url}/search?{urlencode(params)}")
    key = provider.key or ""
    if provider.name == "brave":
        params = {"q": query, "count": str(min(count, 20))}
        return httpx2.Request(
            "GET",
            f"{provider.url}/res/v1/web/search?{urlencode(params)}",
            headers={"Accept": "application/json", "X-Subscription-Token": key},
        )
    if provider.name == "tavily":
        body: dict[str, Any] = {"query": query, "max_results": min(count, 20)}
        headers = {"Authorization": f"Bearer {key}"}
    else:  # exa
        body = {"query": query, "numResults": count, "contents": {"text": {"maxCharacters": 1000}}}
        headers = {"x-api-key": key}
    return httpx2.Request("POST", f"{provider.url}/search", json=body, headers=headers)


def _results(provider: Provider, answer: Any) -> list[Result]:
    """The results out of the provider's JSON answer (missing fields: empty)."""
    if not isinstance(answer, dict):
        return []
    listed = answer.get("results")
    if provider.name == "brave":
        web = answer.get("web")
        listed = web.get("results") if isinstance(web, dict) else None
    snippet_field = {"searxng": "content", "brave": "description", "tavily": "content"}
    found: list[Result] = []
    for entry in listed if isinstance(listed, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            continue
        snippet = entry.get(snippet_field.get(provider.name, "text"))
        if provider.name == "exa" and not isinstance(snippet, str):
            highlights = entry.get("highlights")
            snippet = " ".join(map(str, highlights)) if isinstance(highlights, list) else ""
        title = entry.get("title")
        found.append(
            Result(
                title=_plain(title) if isinstance(title, str) and title else entry["url"],
                url=entry["url"],
                snippet=_plain(snippet) if isinstance(snippet, str) else "",
            )
        )
    return found


async def search_web(
    client: httpx2.AsyncClient, provider: Provider, query: str, count: int
) -> list[Result]:
    """Ask ``provider`` for ``count`` results (at most).

    Raises:
        ToolError: the provider could not be reached or did not answer with results.
    """
    try:
        with trio.fail_after(SEARCH_TIMEOUT_S):
            response = await client.send(_request(provider, query, count))
    except (httpx2.HTTPError, trio.TooSlowError) as error:
        raise ToolError(
            f"The search provider ({provider.name}) could not be reached: {error}."
        ) from None
    if response.status_code != 200:
        raise ToolError(
            f"The search provider ({provider.name}) answered HTTP {response.status_code}."
        )
    try:
        answer = response.json()
    except ValueError:
        raise ToolError(f"The search provider ({provider.name}) did not answer JSON.") from None
    return _results(provider, answer)[:count]


# -- fetching pages -------------------------------------------------------------------------


@dataclass(frozen=True)
class Fetched:
    url: str
    """Where the body came from (after redirects)."""
    content_type: str
    text: str
    truncated: bool


@final
class PageFetcher:
    """GETs pages on public hosts, and on private ones ``allow_hosts`` patterns allow."""

    def __init__(self, allow_hosts: tuple[str, ...] = ()) -> None:
        self._allowed = allowed_hosts(allow_hosts)

    async def fetch(self, url: str) -> Fetched:
        """The page at ``url``, following at most `MAX_REDIRECTS` redirects.

        Raises:
            ToolError: a URL or redirect the policy refuses, too many redirects, an
                HTTP error status, a page that is not text, a timeout.
        """
        try:
            with trio.fail_after(FETCH_TIMEOUT_S):
                for _ in range(MAX_REDIRECTS + 1):
                    fetched = await self._get(url)
                    if isinstance(fetched, Fetched):
                        return fetched
                    url = fetched
        except trio.TooSlowError:
            raise ToolError(f"Opening {url} took longer than {FETCH_TIMEOUT_S:g} s.") from None
        except HostNotAllowed as refused:
            raise ToolError(str(refused)) from None
        raise ToolError(
            f"Opening the page took more than {MAX_REDIRECTS} redirects; stopped at {url}."
        )

    async def _get(self, url: str) -> Fetched | str:
        """One request: the page, or where a redirect points."""
        target, address = await self._checked(url)
        client = httpx2.AsyncClient(
            transport=PinnedTransport(target, address),
            timeout=httpx2.Timeout(FETCH_TIMEOUT_S),
            follow_redirects=False,
            trust_env=False,  # a proxy would resolve the name again
        )
        headers = {"User-Agent": "trio-responses-browser", "Accept": "text/html, text/*;q=0.9"}
        try:
            async with client, client.stream("GET", url, headers=headers) as response:
                if response.is_redirect and "location" in response.headers:
                    return urljoin(url, response.headers["location"])
                if response.status_code >= 400:
                    raise ToolError(f"Opening {url} failed: HTTP {response.status_code}.")
                content_type = response.headers.get("content-type", "text/html")
                kind = content_type.partition(";")[0].strip().lower()
                if not (
                    kind.startswith("text/")
                    or kind in ("application/xhtml+xml", "application/json")
                ):
                    raise ToolError(f"{url} is not a text page ({kind}).")
                body = bytearray()
                truncated = False
                async for chunk in response.aiter_bytes():
                    room = MAX_BODY_BYTES - len(body)
                    body += chunk[:room]
                    if len(chunk) > room:
                        truncated = True
                        break
                charset = response.charset_encoding or "utf-8"
        except httpx2.HTTPError as error:
            raise ToolError(f"Opening {url} failed: {error}.") from None
        try:
            text = bytes(body).decode(charset, errors="replace")
        except LookupError:
            text = bytes(body).decode("utf-8", errors="replace")
        return Fetched(url, kind, text, truncated)

    async def _checked(self, url: str) -> tuple[Target, str]:
        """The URL's target and the address to connect to, resolved once.

        Raises:
            HostNotAllowed: not http(s), or every address is private and no pattern allows it.
        """
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise HostNotAllowed(f"{url!r} is not a valid URL.") from None
        if parts.scheme not in ("http", "https") or not host:
            raise HostNotAllowed(f"Only http and https pages can be opened, not {url!r}.")
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            try:
                infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
            except OSError as error:
                raise ToolError(f"Could not resolve {host!r}: {error}.") from None
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        target = Target(parts.scheme, host, port, None, by_name=False)
        for address in addresses:
            if ipaddress.ip_address(address).is_global or self._allowed.permits(url, address):
                return target, address
        raise HostNotAllowed(
            f"Refused to open {url}: {host} is a private or local address "
            f"({', '.join(addresses)}). The browser opens public hosts only, unless the "
            f"server allows this one (--allow-host {host})."
        )


# -- pages -----------------------------------------------------------------------------------


@dataclass
class Page:
    url: str
    title: str
    lines: list[str]
    links: dict[int, str] = field(default_factory=dict)
    """Link id -> URL."""
    snippet: bool = False
    """Whether it is a search result's snippet standing in for the page."""


def _plain(text: str) -> str:
    return " ".join(text.split())


def _domain(url: str) -> str:
    return (urlsplit(url).hostname or url).removeprefix("www.")


def _wrapped(paragraphs: list[str]) -> list[str]:
    lines: list[str] = []
    for paragraph in paragraphs:
        lines += textwrap.wrap(paragraph, LINE_WIDTH, break_on_hyphens=False) or [""]
    return lines


_BLOCKS = frozenset(
    {"p", "div", "br", "li", "ul", "ol", "tr", "table", "pre", "blockquote", "section"}
    | {"article", "header", "footer", "nav", "main", "aside", "form", "dd", "dt"}
    | {"h1", "h2", "h3", "h4", "h5", "h6"}
)
_SKIPPED = frozenset({"script", "style", "noscript", "template", "svg", "head"})


class _TextParser(HTMLParser):
    """HTML -> paragraphs of text, links rendered as ``【ID†TEXT†DOMAIN】``."""

    def __init__(self, base: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base = base
        self.title = ""
        self.links: dict[int, str] = {}
        self.paragraphs: list[str] = []
        self._current: list[str] = []
        self._skipping = 0
        self._in_title = False
        self._link: tuple[str, list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in _SKIPPED:
            self._skipping += 1
        elif tag == "a":
            href = dict(attrs).get("href")
            if href and not href.startswith(("#", "javascript:", "mailto:")):
                self._link = (urljoin(self.base, href), [])
        elif tag in _BLOCKS:
            self._break()

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in _SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag == "a" and self._link is not None:
            url, words = self._link
            self._link = None
            text = _plain(" ".join(words))
            if text:
                number = len(self.links)
                self.links[number] = url
                self._current.append(f"【{number}†{text}†{_domain(url)}】")
        elif tag in _BLOCKS:
            self._break()

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif self._skipping:
            return
        elif self._link is not None:
            self._link[1].append(data)
        else:
            self._current.append(data)

    def _break(self) -> None:
        text = _plain(" ".join(self._current))
        self._current = []
        if text:
            self.paragraphs.append(text)

    def close(self) -> None:
        super().close()
        self._break()


def page_of(fetched: Fetched) -> Page:
    """A fetched body as a page of numbered lines."""
    if fetched.content_type in ("text/html", "application/xhtml+xml"):
        parser = _TextParser(fetched.url)
        parser.feed(fetched.text)
        parser.close()
        title, paragraphs, links = _plain(parser.title), parser.paragraphs, parser.links
    else:
        title, links = "", {}
        paragraphs = [line.rstrip() for line in fetched.text.splitlines()]
    if fetched.truncated:
        paragraphs.append(f"[The page was cut at {MAX_BODY_BYTES // (1024 * 1024)} MiB.]")
    return Page(fetched.url, title or fetched.url, _wrapped(paragraphs), links)


def results_page(query: str, results: list[Result]) -> Page:
    lines = _wrapped([f"Search results for `{query}`", ""])
    for number, result in enumerate(results):
        lines.append(f"# 【{number}†{result.title}†{_domain(result.url)}】")
        lines.append(f"URL: {result.url}")
        lines += _wrapped([result.snippet]) if result.snippet else []
        lines.append("")
    if not results:
        lines.append("No results.")
    url = "web-search://?" + urlencode({"q": query})
    return Page(
        url, f"Search results for `{query}`", lines, dict(enumerate(r.url for r in results))
    )


def snippet_page(result: Result) -> Page:
    note = "[Live web access is off: this is the search result's snippet, not the page.]"
    return Page(result.url, result.title, _wrapped([note, "", result.snippet]), snippet=True)


def find_page(page: Page, pattern: str) -> Page:
    needle = pattern.lower()
    lines: list[str] = []
    links: dict[int, str] = {}
    for number, line in enumerate(page.lines):
        if needle in line.lower():
            links[len(links)] = f"{page.url}#L{number}"
            lines += [f"# 【{len(links) - 1}†match at L{number}】", line, ""]
    if not lines:
        lines = [f"No `{pattern}` found in {page.title}."]
    return Page(
        f"find://{page.url}", f"Find results for `{pattern}` in `{page.title}`", lines, links
    )


def render(page: Page, cursor: int, loc: int = 0, num_lines: int = -1) -> str:
    """``[CURSOR] TITLE (URL)``, the lines shown, then ``L{n}: …`` from ``loc``."""
    total = len(page.lines)
    start = min(max(loc, 0), max(total - 1, 0))
    count = num_lines if num_lines > 0 else DEFAULT_LINES
    end = min(start + count, total)
    shown = "\n".join(f"L{n}: {page.lines[n]}" for n in range(start, end))
    return (
        f"[{cursor}] {page.title} ({page.url})\n"
        f"**viewing lines [{start} - {max(end - 1, start)}] of {max(total - 1, 0)}**\n\n{shown}"
    )


# -- sessions --------------------------------------------------------------------------------


@dataclass
class Session:
    pages: list[Page] = field(default_factory=list)
    """The pages seen, the current one last; a cursor is an index here."""
    results: dict[str, Result] = field(default_factory=dict)
    """Search results by URL: what can be read without live access."""

    def push(self, page: Page) -> int:
        self.pages.append(page)
        del self.pages[:-MAX_PAGES]
        return len(self.pages) - 1

    def page(self, cursor: int) -> tuple[int, Page]:
        if not self.pages:
            raise ToolError("No page is open: search or open a URL first.")
        if cursor < 0:
            return len(self.pages) - 1, self.pages[-1]
        if cursor >= len(self.pages):
            raise ToolError(
                f"No page at cursor {cursor}: the cursors are 0 to {len(self.pages) - 1}."
            )
        return cursor, self.pages[cursor]

    def fetched(self, url: str) -> Page | None:
        """A page of ``url`` this session has already read (a cache, per session)."""
        pages = reversed(self.pages)
        return next((page for page in pages if page.url == url and not page.snippet), None)


@final
class Sessions:
    """Browsing state by session id, the `MAX_SESSIONS` most recently used kept."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self._limit = limit
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def get(self, key: str, parent: str = "") -> Session:
        """``key``'s session; a new one starts from a copy of ``parent``'s, if held."""
        session = self._sessions.get(key)
        if session is None:
            before = self._sessions.get(parent) if parent else None
            session = (
                Session() if before is None else Session(list(before.pages), dict(before.results))
            )
            self._sessions[key] = session
        self._sessions.move_to_end(key)
        while len(self._sessions) > self._limit:
            self._sessions.popitem(last=False)
        return session

    def __len__(self) -> int:
        return len(self._sessions)


# -- the server ------------------------------------------------------------------------------


def build_server(
    provider: Provider,
    fetcher: PageFetcher,
    *,
    sessions: Sessions | None = None,
) -> MCPServer:
    """The MCP server. Calls without a ``session`` share the session ``""``."""
    server = MCPServer("trio-responses-browser", instructions=DESCRIPTION)
    held = sessions or Sessions()

    @server.tool(description="Search the web; results are links 【ID†TITLE†DOMAIN】 to open.")
    async def search(
        query: str, topn: int = 10, session: str = "", parent: str = "", live: bool = True
    ) -> str:
        state = held.get(session, parent)
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(SEARCH_TIMEOUT_S)) as client:
            results = await search_web(client, provider, query, max(1, min(topn, 20)))
        state.results.update((result.url, result) for result in results)
        page = results_page(query, results)
        return render(page, state.push(page))

    @server.tool(description="Open link ID of the page at CURSOR, or a URL; or scroll to LOC.")
    async def open(
        id: int | str = -1,
        cursor: int = -1,
        loc: int = -1,
        num_lines: int = -1,
        view_source: bool = False,
        source: str | None = None,
        session: str = "",
        parent: str = "",
        live: bool = True,
    ) -> str:
        state = held.get(session, parent)
        if isinstance(id, str) and not re.fullmatch(r"-?\d+", id.strip()):
            url = id.strip()
        else:
            number = int(id)
            at, current = state.page(cursor)
            if number < 0:  # scroll the page at the cursor
                return render(current, at, max(loc, 0), num_lines)
            if number not in current.links:
                raise ToolError(f"Page {at} has no link {number}: open a link id it shows.")
            url = current.links[number]
        page = state.fetched(url)
        if page is None and url in state.results and not live:
            page = snippet_page(state.results[url])
        if page is None:
            if not live:
                raise ToolError(
                    f"Cannot open {url}: live web access is off for this response "
                    "(external_web_access is false); only search results can be read."
                )
            page = page_of(await fetcher.fetch(url))
        return render(page, state.push(page), max(loc, 0), num_lines)

    @server.tool(description="Find the lines of the page at CURSOR that contain PATTERN.")
    async def find(
        pattern: str, cursor: int = -1, session: str = "", parent: str = "", live: bool = True
    ) -> str:
        state = held.get(session, parent)
        _, current = state.page(cursor)
        page = find_page(current, pattern)
        return render(page, state.push(page))

    return server


def run_stdio(provider: Provider, allow_hosts: tuple[str, ...] = ()) -> None:
    """Serve MCP on stdin/stdout until the client goes away."""

    async def main() -> None:
        await build_server(provider, PageFetcher(allow_hosts)).run_stdio_async()

    anyio.run(main, backend="trio")
