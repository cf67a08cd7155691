"""What a request may send to an MCP server: the headers and authorization of an
``mcp`` tool, checked before anything connects (sans-IO)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..._exceptions import InvalidRequestError

if TYPE_CHECKING:
    from .mcp import McpTool

# -- MCP request headers ------------------------------------------------------------------

REFUSED_MCP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Header names a request may not set for its MCP server (nor any ``Proxy-*``):
hop-by-hop headers and the framing ones the HTTP client owns. Setting them could
split or smuggle requests on the way to the MCP server."""

MAX_MCP_HEADERS = 64
MAX_MCP_HEADER_BYTES = 16 * 1024
"""Longest header value (or ``authorization`` token) sent to an MCP server."""

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


def mcp_headers(tool: McpTool) -> dict[str, str]:
    """The HTTP headers a request's MCP server gets: ``headers``, and
    ``authorization`` as ``Authorization: Bearer …``.

    Values lose surrounding spaces and tabs (not part of a header value, and
    refused by the HTTP client). Call on a request `parse_create_request` accepted.
    """
    headers = {name: value.strip(" \t") for name, value in (tool.headers or {}).items()}
    if tool.authorization is not None:
        headers["Authorization"] = "Bearer " + tool.authorization.strip(" \t")
    return headers


def check_mcp_tool(tool: McpTool, index: int) -> None:
    """Raise `InvalidRequestError` for a ``server_url`` or header this server cannot send.

    Messages name headers, never their values: those are credentials.
    """
    if tool.server_url is not None:
        try:
            parts = urlsplit(tool.server_url)
            parts.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError:
            raise InvalidRequestError(
                "server_url is not a valid URL (check the host and the port).",
                param=f"tools[{index}].server_url",
                code="invalid_value",
            ) from None
        if parts.username is not None or parts.password is not None:
            # The response echoes its tools and stores them: a credential does not
            # belong in the URL (its value is not repeated here either).
            raise InvalidRequestError(
                "server_url must not carry a user name or password; send credentials "
                "as 'authorization' or in 'headers', which are never stored or echoed.",
                param=f"tools[{index}].server_url",
                code="invalid_value",
            )
    headers = tool.headers or {}
    param = f"tools[{index}].headers"
    if len(headers) > MAX_MCP_HEADERS:
        raise InvalidRequestError(
            f"Too many MCP headers: at most {MAX_MCP_HEADERS}.", param=param, code="invalid_value"
        )
    seen: set[str] = set()
    for name, value in headers.items():
        lowered = name.lower()
        if not _HEADER_NAME.fullmatch(name):
            raise InvalidRequestError(
                "An MCP header name is not a valid HTTP header name (letters, digits "
                "and !#$%&'*+-.^_`|~ only).",
                param=param,
                code="invalid_value",
            )
        if lowered in REFUSED_MCP_HEADERS or lowered.startswith("proxy-"):
            raise InvalidRequestError(
                f"The MCP header {name!r} cannot be set by a request: hop-by-hop and "
                "framing headers (Connection, Keep-Alive, Proxy-*, TE, Trailer, "
                "Transfer-Encoding, Upgrade, Host, Content-Length) are the HTTP client's.",
                param=f"{param}.{name}",
                code="invalid_value",
            )
        if lowered in seen:
            raise InvalidRequestError(
                f"The MCP header {name!r} is given twice (names are case-insensitive).",
                param=f"{param}.{name}",
                code="invalid_value",
            )
        seen.add(lowered)
        _check_header_value(value, f"The value of MCP header {name!r}", f"{param}.{name}")
    if tool.authorization is not None:
        if "authorization" in seen:
            raise InvalidRequestError(
                "Give the MCP server's credentials once: either 'authorization' or an "
                "'Authorization' header.",
                param=f"tools[{index}].authorization",
                code="invalid_value",
            )
        _check_header_value(tool.authorization, "'authorization'", f"tools[{index}].authorization")


def _check_header_value(value: str, what: str, param: str) -> None:
    if len(value) > MAX_MCP_HEADER_BYTES:
        raise InvalidRequestError(
            f"{what} is longer than {MAX_MCP_HEADER_BYTES} bytes.",
            param=param,
            code="invalid_value",
        )
    if not _HEADER_VALUE.fullmatch(value):
        raise InvalidRequestError(
            f"{what} holds a character HTTP headers cannot carry (CR, LF, NUL, another "
            "control character or non-ASCII text). Send printable ASCII only.",
            param=param,
            code="invalid_value",
        )
