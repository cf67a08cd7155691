"""Request ids: one per HTTP request, sent back as ``x-request-id`` and put on its log lines.

The id lives in a context variable (`_logging.REQUEST_ID`, where log lines read it)
set when the request begins. Trio copies the context into every task a task
starts, so the job a request creates (its engine and tool work, its log lines)
carries the id of the request that created it.
"""

from __future__ import annotations

import logging
import re
import secrets

from .._logging import REQUEST_ID as REQUEST_ID

_CLIENT_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""What a client's own ``X-Request-Id`` may look like to be kept: short, and nothing
that could forge or break a log line."""


def new_request_id() -> str:
    """A fresh id in OpenAI's format: ``req_`` and 32 hex digits."""
    return "req_" + secrets.token_hex(16)


def request_id_for(client_id: str | None) -> str:
    """The id of a request: the client's ``X-Request-Id`` when it is sane, else a new one.

    Keeping the client's id lets a proxy or caller follow one request through its
    own logs and ours.
    """
    if client_id is not None and _CLIENT_ID.fullmatch(client_id):
        return client_id
    return new_request_id()


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id``: the id of the request a line was logged for, else ``-``.

    Attach it to a handler (not a logger: logger filters miss records from child
    loggers), then use ``%(request_id)s`` in that handler's format.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get() or "-"
        return True
