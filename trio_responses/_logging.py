"""Log output: the classic text lines, or one JSON object per line (``--log-format json``).

Every line carries the id of the HTTP request it was logged for (``request_id``:
`REQUEST_ID`, which the request pipeline sets, see `api.request_id`) and, when it
concerns one response, that response's id (``response_id``): the job's task sets
`RESPONSE_ID`. Trio copies the context into every task it starts, so the job's
engine, tool and store lines carry both too.

Imports nothing of the package above it (the API layer imports this).

JSON lines have ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
``request_id`` and ``response_id`` (null when none), plus the structured fields
a line was logged with, from a fixed list (`FIELDS`): request lines add
``method``, ``route``, ``path``, ``status`` (the HTTP status code), ``duration_ms``;
job lines ``response_status`` (the status it moved to, with ``previous_status``),
token counts and ``error_code``; a refused request's line ``error_code`` and
``param``. Nothing else a log call passes reaches the output, so a header value
or prompt text cannot slip in through ``extra``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO, final

from ._config import LogFormat
from .protocol.errors import ErrorInfo

REQUEST_ID: ContextVar[str | None] = ContextVar("trio_responses_request_id", default=None)
"""The id of the HTTP request being handled in this context; None outside requests."""

RESPONSE_ID: ContextVar[str | None] = ContextVar("trio_responses_response_id", default=None)
"""The response a job's task (and its children) works for; None elsewhere."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"

FIELDS = (
    "method",
    "route",
    "path",
    "status",
    "response_status",
    "previous_status",
    "duration_ms",
    "background",
    "stream",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "error_code",
    "param",
    "tool_kind",
    "outcome",
)
"""The structured fields (``extra=``) a JSON line may carry, in this order."""


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """``text`` with control characters and line breaks escaped (``\\n``, ``\\x1b``…),
    for a client's text in a text log line: it cannot end the line or forge the next."""
    return _UNPRINTABLE.sub(lambda match: ascii(match.group())[1:-1], text)


def refusal(error: ErrorInfo) -> str:
    """What a log line says of an error: its code and param, escaped (never its
    message, which may quote the request)."""
    shown = printable(error.code or "-")
    return shown if error.param is None else f"{shown} (param {printable(error.param)})"


@final
class ContextFilter(logging.Filter):
    """Sets ``record.request_id`` (``-`` outside requests) and ``record.response_id``.

    A ``response_id`` passed in ``extra`` wins over the context's. Attach it to a
    handler (logger filters miss records from child loggers).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get() or "-"
        if getattr(record, "response_id", None) is None:
            record.response_id = RESPONSE_ID.get()
        return True


@final
class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT` lines whose message is `printable`: whatever a client's text
    that a line quotes holds (a path, a tool's name, a server's URL…), the line
    stays one line and cannot forge the next. The traceback after an error's line
    is the one thing written as it is, on lines of its own."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


@final
class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": None if request_id in (None, "-") else request_id,
            "response_id": getattr(record, "response_id", None),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                payload[name] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            payload["exception"] = record.exc_text
        # Not the codec's: ASCII-escaped, so whatever a message quotes the line stays one
        # line of text, and any other value a record holds is written as its str().
        return json.dumps(payload, default=str, separators=(",", ":"))


def make_handler(log_format: LogFormat, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing ``log_format`` lines to ``stream`` (default stderr)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    return handler


def configure_logging(level: str, log_format: LogFormat) -> None:
    """Send every log record at ``level`` or above to stderr, as ``log_format`` lines.

    Replaces the root logger's handlers (what the ``serve`` command wants).

    Raises:
        ValueError: ``level`` is not a logging level name.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(make_handler(log_format))
    root.setLevel(level.upper())
