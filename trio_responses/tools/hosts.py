"""Which hosts per-request MCP ``server_url``s may reach (``--mcp-allow-host``).

A pattern is one of:

    mcp.example.com  *.internal       a host name (shell-style, case-insensitive)
    *.internal:8080                   ... on that port only
    127.0.0.1  ::1  10.0.0.0/8        an address or network (IPv4 or IPv6), any port
    127.0.0.1:8080  [::1]:8080        ... on that port only ([fd00::/8]:8080 too)

A URL whose host is an address is allowed when an address pattern holds it. A
host name is allowed when a name pattern matches it, or when the addresses it
resolves to are held by an address pattern. Either way the name is resolved
once, when its session connects, and the connection goes to the address that
was checked (`allowed_address`): a DNS answer that changes between the check
and the connection (DNS rebinding) cannot redirect it. No I/O happens here;
resolving is the transport's (`tools.transport`).
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import final
from urllib.parse import urlsplit

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class HostNotAllowed(ValueError):
    """A URL or an address no pattern allows; the message says why and what to do."""


@dataclass(frozen=True)
class Target:
    """Where a checked ``server_url`` points."""

    scheme: str
    host: str
    """The URL's host, lower-case (an address without brackets, or a name)."""
    port: int
    address: IPAddress | None
    """The host as an address when the URL names one."""
    by_name: bool
    """Whether a name pattern allowed it (else its addresses must be allowed)."""


@final
@dataclass(frozen=True)
class AllowedHosts:
    """Parsed ``--mcp-allow-host`` patterns. Build with `allowed_hosts`."""

    names: tuple[tuple[str, int | None], ...]
    networks: tuple[tuple[IPNetwork, int | None], ...]

    @property
    def empty(self) -> bool:
        return not self.names and not self.networks

    def check_url(self, url: str) -> Target:
        """What ``url`` points at, if the patterns may allow it.

        A name that no name pattern matches passes when some address pattern
        could hold its addresses (on its port): its addresses are checked once
        it is resolved (`allowed_address`).

        Raises:
            HostNotAllowed: not an http(s) URL, or no pattern can allow it.
        """
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
            port = parts.port
        except ValueError:
            raise HostNotAllowed(f"server_url {url!r} is not a valid URL.") from None
        if parts.scheme not in ("http", "https") or not host:
            raise HostNotAllowed(f"server_url {url!r} is not an http(s) URL.")
        port = port or (443 if parts.scheme == "https" else 80)
        address = _address(host)
        by_name = self._name_allows(host, port)
        if address is not None:
            if by_name or self._network_allows(address, port):
                return Target(parts.scheme, host, port, address, by_name=True)
        elif by_name or any(allowed in (None, port) for _, allowed in self.networks):
            return Target(parts.scheme, host, port, None, by_name=by_name)
        shown = f"[{host}]" if address is not None and address.version == 6 else host
        raise HostNotAllowed(
            f"MCP server host {shown!r} is not allowed. Per-request MCP servers must match a "
            "--mcp-allow-host pattern given when the server starts (none are allowed by "
            f"default); for example --mcp-allow-host {shown}."
        )

    def allowed_address(self, target: Target, addresses: Sequence[str]) -> str:
        """The address to connect to for ``target``, out of what its name resolved to.

        Raises:
            HostNotAllowed: the name resolved to nothing the patterns allow.
        """
        if target.address is not None:
            return str(target.address)
        for text in addresses:
            address = _address(text)
            if address is None:
                continue
            if target.by_name or self._network_allows(address, target.port):
                return str(address)
        listed = ", ".join(addresses) or "no address"
        raise HostNotAllowed(
            f"MCP server host {target.host!r} resolves to {listed}, which no "
            "--mcp-allow-host pattern allows."
        )

    def permits(self, url: str, address: str) -> bool:
        """Whether a pattern allows connecting to ``address`` for ``url`` (the address
        one of the URL's host resolved to). For policies where public addresses
        need no pattern (the bundled browser, webhooks): the private ones do."""
        try:
            self.allowed_address(self.check_url(url), [address])
        except HostNotAllowed:
            return False
        return True

    def _name_allows(self, host: str, port: int) -> bool:
        literal = _address(host) is not None
        return any(
            fnmatch.fnmatchcase(host, pattern)
            and allowed in (None, port)
            # A glob of digits (``10.0.0.*``) means addresses: it must not let in a
            # name such as ``10.0.0.1.example.com``, which may resolve anywhere.
            and (literal or not _is_address_glob(pattern))
            for pattern, allowed in self.names
        )

    def _network_allows(self, address: IPAddress, port: int) -> bool:
        return any(
            address in network and allowed in (None, port) for network, allowed in self.networks
        )


@functools.lru_cache(maxsize=8)
def allowed_hosts(patterns: tuple[str, ...]) -> AllowedHosts:
    """Parse ``--mcp-allow-host`` patterns (see the module docstring); cached."""
    names: list[tuple[str, int | None]] = []
    networks: list[tuple[IPNetwork, int | None]] = []
    for raw in patterns:
        pattern = raw.strip().lower()
        network = _network(pattern)
        if network is not None:
            networks.append((network, None))
            continue
        head, sep, tail = pattern.rpartition(":")
        port = int(tail) if sep and tail.isdigit() else None
        if port is not None:
            network = _network(head.removeprefix("[").removesuffix("]") if head else "")
            if network is not None:
                networks.append((network, port))
                continue
            names.append((head, port))
            continue
        if pattern.startswith("[") and pattern.endswith("]"):
            network = _network(pattern[1:-1])
            if network is not None:
                networks.append((network, None))
                continue
        names.append((pattern, None))
    return AllowedHosts(tuple(names), tuple(networks))


def _is_address_glob(pattern: str) -> bool:
    """A pattern of digits, dots, colons and wildcards only, with a digit."""
    return any(c.isdigit() for c in pattern) and not any(c.isalpha() for c in pattern)


def _network(text: str) -> IPNetwork | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
