"""One delivery attempt: resolve the URL's host once, check it, POST, classify the answer.

Webhook URLs name hosts of the client's choosing, so every attempt goes through
the host policy of the bundled browser and per-request MCP servers
(`tools.hosts`): a public address is allowed; a private, loopback or link-local
one only when a ``--webhook-allow-host`` pattern allows it. The name is resolved
once per attempt and the request goes to the address that was checked
(`tools.transport.PinnedTransport`), so DNS rebinding cannot redirect it.
Redirects are not followed (a 3xx is a failed attempt), no proxy from the
environment is used, the whole attempt is bounded by one timeout, and at most
`MAX_ANSWER_BYTES` of the receiver's answer are read.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import final
from urllib.parse import urlsplit

import httpx2
import trio

from ..tools.hosts import AllowedHosts, HostNotAllowed, Target, allowed_hosts
from ..tools.transport import PinnedTransport

__all__ = ["MAX_ANSWER_BYTES", "Attempt", "Poster", "check_address", "check_webhook_url"]

MAX_ANSWER_BYTES = 4096
"""Most bytes of a receiver's answer read (the rest is dropped with the connection)."""

_MAX_CLIENTS = 64
"""Pinned clients (one per checked address) kept open for reuse."""


@dataclass(frozen=True)
class Attempt:
    """How one attempt went."""

    status_code: int | None
    """The receiver's HTTP status; None when there was no answer."""
    error: str | None
    """Why it did not succeed (``HTTP 503``, ``timed out``, ``connection refused``…);
    None for a 2xx."""
    retry_after_s: float | None = None
    """The receiver's ``Retry-After``, in seconds from now, when it sent one."""

    @property
    def ok(self) -> bool:
        return self.error is None


def check_webhook_url(url: str, allowed: AllowedHosts) -> Target:
    """What ``url`` points at, if it is an http(s) URL whose host may be allowed: a
    literal address must be public or allowed; a name is checked once resolved.

    Raises:
        HostNotAllowed: not an http(s) URL, or a private or local address that no
            ``--webhook-allow-host`` pattern allows (the message says what to do).
    """
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise HostNotAllowed(f"{url[:200]!r} is not a valid URL.") from None
    if parts.scheme not in ("http", "https") or not host:
        raise HostNotAllowed(f"{url[:200]!r} is not an http(s) URL.")
    if parts.username or parts.password:
        raise HostNotAllowed("A webhook URL must not hold credentials.")
    target = Target(parts.scheme, host, port, None, by_name=False)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return target
    check_address(url, host, str(address), allowed)
    return target


def check_address(url: str, host: str, address: str, allowed: AllowedHosts) -> None:
    """Refuse ``address`` (``host``'s, of ``url``) unless it is public or allowed.

    Raises:
        HostNotAllowed: a private, loopback or link-local address no pattern allows.
    """
    if ipaddress.ip_address(address).is_global or allowed.permits(url, address):
        return
    shown = f"[{host}]" if ":" in host else host
    raise HostNotAllowed(
        f"Webhook host {shown!r} ({address}) is a private, loopback or link-local address. "
        f"Webhooks go to public hosts only, unless the server allows this one "
        f"(--webhook-allow-host {shown})."
    )


@final
class Poster:
    """Posts events, reusing one pinned client per checked address. Use as an async
    context manager: its clients close on exit."""

    def __init__(self, allow_hosts: tuple[str, ...], *, timeout_s: float) -> None:
        self._allowed = allowed_hosts(allow_hosts)
        self._timeout_s = timeout_s
        self._clients: OrderedDict[tuple[str, str, int, str], httpx2.AsyncClient] = OrderedDict()

    async def __aenter__(self) -> Poster:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with trio.CancelScope(shield=True):
            while self._clients:
                _, client = self._clients.popitem()
                with trio.move_on_after(1):
                    await client.aclose()

    async def post(self, url: str, headers: Mapping[str, str], body: bytes) -> Attempt:
        """One attempt, within the timeout; never raises for what the receiver does."""
        try:
            with trio.fail_after(self._timeout_s):
                target = check_webhook_url(url, self._allowed)
                address = await self._resolve(url, target)
                return await self._send(url, target, address, headers, body)
        except trio.TooSlowError:
            return Attempt(None, f"timed out after {self._timeout_s:g} s")
        except HostNotAllowed as refused:
            return Attempt(None, str(refused))

    async def _resolve(self, url: str, target: Target) -> str:
        """The address to connect to: the URL's, or the first of its name's allowed.

        Raises:
            HostNotAllowed: it resolves to nothing, or to nothing allowed.
        """
        try:
            return str(ipaddress.ip_address(target.host))
        except ValueError:
            pass
        try:
            infos = await trio.socket.getaddrinfo(
                target.host, target.port, type=trio.socket.SOCK_STREAM
            )
        except OSError as error:
            raise HostNotAllowed(f"could not resolve {target.host!r}: {error}") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        refusal: HostNotAllowed | None = None
        for address in addresses:
            try:
                check_address(url, target.host, address, self._allowed)
            except HostNotAllowed as refused:
                refusal = refused
                continue
            return address
        raise refusal or HostNotAllowed(f"{target.host!r} resolves to no address")

    async def _send(
        self, url: str, target: Target, address: str, headers: Mapping[str, str], body: bytes
    ) -> Attempt:
        client = await self._client(target, address)
        try:
            async with client.stream("POST", url, headers=dict(headers), content=body) as answer:
                read = 0
                async for chunk in answer.aiter_raw():
                    read += len(chunk)
                    if read >= MAX_ANSWER_BYTES:
                        break
                status = answer.status_code
                retry_after = _retry_after(answer.headers.get("retry-after"))
        except httpx2.HTTPError as error:
            self._drop(target, address)
            return Attempt(None, _describe(error))
        if 200 <= status < 300:
            return Attempt(status, None)
        return Attempt(status, f"HTTP {status}", retry_after)

    async def _client(self, target: Target, address: str) -> httpx2.AsyncClient:
        key = (target.scheme, target.host, target.port, address)
        client = self._clients.get(key)
        if client is not None:
            self._clients.move_to_end(key)
            return client
        client = httpx2.AsyncClient(
            transport=PinnedTransport(target, address),
            timeout=httpx2.Timeout(self._timeout_s),
            follow_redirects=False,
            trust_env=False,  # a proxy would resolve the name again
            headers={"user-agent": "trio-responses-webhooks"},
        )
        self._clients[key] = client
        while len(self._clients) > _MAX_CLIENTS:
            _, old = self._clients.popitem(last=False)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await old.aclose()
        return client

    def _drop(self, target: Target, address: str) -> None:
        self._clients.pop((target.scheme, target.host, target.port, address), None)


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` (seconds, or an HTTP date) as seconds from now, if it parses."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _describe(error: httpx2.HTTPError) -> str:
    if isinstance(error, httpx2.ConnectError):
        return f"could not connect: {error}"[:200] or "could not connect"
    if isinstance(error, httpx2.TimeoutException):
        return "timed out"
    return f"{type(error).__name__}: {error}"[:200]
