"""CORS for browser clients: which origins may call, and what a preflight answers.

Only origins named with ``--cors-allow-origin`` (or ``*``, any origin) get CORS
headers; a request from any other origin is served as before, without them, so
the browser keeps its response from the page. The allowed origin is echoed
rather than sent as ``*``, so the headers are the same for both settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_ALLOW_HEADERS = (
    "Authorization, Content-Type, Accept, Last-Event-ID, X-Request-Id, OpenAI-Organization, "
    "OpenAI-Project, OpenAI-Beta"
)
"""Allowed when a preflight names no headers (or names them unreadably)."""
EXPOSE_HEADERS = "x-request-id"
MAX_AGE_S = 7200
"""How long a browser may cache a preflight answer (Chromium caps it at two hours)."""

_HEADER_LIST = re.compile(r"\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+(\s*,\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+)*\s*")
"""``Access-Control-Request-Headers``: header names (HTTP tokens), comma-separated."""


@dataclass(frozen=True)
class CorsPolicy:
    """The origins allowed to call from a browser; empty means CORS is off."""

    origins: frozenset[str]
    any_origin: bool

    @classmethod
    def of(cls, origins: tuple[str, ...]) -> CorsPolicy:
        return cls(
            origins=frozenset(origin.lower() for origin in origins if origin != "*"),
            any_origin="*" in origins,
        )

    @property
    def enabled(self) -> bool:
        return self.any_origin or bool(self.origins)

    def allows(self, origin: str | None) -> bool:
        """Whether a request with this ``Origin`` header gets CORS headers."""
        if not origin:
            return False
        return self.any_origin or origin.lower() in self.origins

    @staticmethod
    def response_headers(origin: str) -> dict[str, str]:
        """The headers every response to an allowed origin carries."""
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Expose-Headers": EXPOSE_HEADERS,
        }

    @staticmethod
    def preflight_headers(requested_headers: str | None) -> dict[str, str]:
        """The headers of a preflight answer, besides `response_headers`.

        The requested headers are allowed as asked: browser SDKs send headers of
        their own (the openai SDK's ``x-stainless-*``), and ``*`` would not cover
        ``Authorization``.
        """
        if requested_headers and _HEADER_LIST.fullmatch(requested_headers):
            allowed = ", ".join(part.strip() for part in requested_headers.split(","))
        else:
            allowed = DEFAULT_ALLOW_HEADERS
        return {
            "Access-Control-Allow-Methods": ALLOW_METHODS,
            "Access-Control-Allow-Headers": allowed,
            "Access-Control-Max-Age": str(MAX_AGE_S),
        }
