"""Webhooks on the wire: endpoint objects, event bodies and Standard Webhooks signatures.

What the ``openai`` SDK sends and checks (``client.webhooks``):

- an endpoint (``POST /v1/webhook_endpoints``: ``name``, ``url``, ``event_types``)
  is a ``webhook_endpoint`` object; its signing secret (``whsec_`` and base64 of
  32 random bytes) is shown once, when it is made or rotated, and afterwards only
  as a hint;
- an event is ``{"id": "evt_…", "object": "event", "created_at", "type",
  "data": {"id": "resp_…"}}``, posted as JSON with three headers:
  ``webhook-id`` (the event id, the same on every retry), ``webhook-timestamp``
  (Unix seconds of this attempt) and ``webhook-signature`` (``v1,`` and base64 of
  HMAC-SHA256 over ``"{id}.{timestamp}.{body}"`` keyed with the secret's bytes;
  several, space-separated, while a rotated secret still signs), which
  ``client.webhooks.unwrap(body, headers, secret=…)`` verifies (within five
  minutes of the timestamp).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._exceptions import InvalidRequestError
from .codec import encode_json
from .json_body import printable_key

__all__ = [
    "EVENT_TYPES",
    "EndpointFields",
    "event_body",
    "new_secret",
    "parse_endpoint_fields",
    "secret_hint",
    "signed_headers",
]

EVENT_TYPES = {
    "completed": "response.completed",
    "failed": "response.failed",
    "cancelled": "response.cancelled",
    "incomplete": "response.incomplete",
}
"""A terminal status -> the type of the event a background response that ends so sends."""

SECRET_PREFIX = "whsec_"
MAX_NAME_CHARS = 256
MAX_URL_CHARS = 2048
_FIELDS = frozenset({"name", "url", "event_types"})


def new_secret() -> str:
    """A fresh signing secret: ``whsec_`` and base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode("ascii")


def secret_bytes(secret: str) -> bytes:
    """The HMAC key of ``secret`` (the SDK's rule: base64 after ``whsec_``, else its UTF-8).

    Raises:
        ValueError: ``whsec_`` followed by something that is not base64.
    """
    if secret.startswith(SECRET_PREFIX):
        return base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    return secret.encode()


def secret_hint(secret: str) -> str:
    """What an endpoint shows of its secret: the prefix and the last four characters."""
    return f"{SECRET_PREFIX}...{secret[-4:]}"


def event_body(event_id: str, event_type: str, created_at: int, response_id: str) -> bytes:
    """The JSON body of an event (the same bytes on every attempt)."""
    event = {
        "id": event_id,
        "object": "event",
        "created_at": created_at,
        "type": event_type,
        "data": {"id": response_id},
    }
    return encode_json(event).encode()


def signed_headers(
    webhook_id: str, timestamp: int, body: bytes, secrets: Sequence[str]
) -> dict[str, str]:
    """The headers of one attempt: ids, time, one signature per secret, content type."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    signatures = " ".join(
        "v1,"
        + base64.b64encode(hmac.new(secret_bytes(s), signed, hashlib.sha256).digest()).decode()
        for s in secrets
    )
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
        "content-type": "application/json",
    }


@dataclass(frozen=True)
class EndpointFields:
    """What a create or update request sets (None: left as it is)."""

    name: str | None
    url: str | None
    event_types: tuple[str, ...] | None


def parse_endpoint_fields(body: Any, *, creating: bool) -> EndpointFields:
    """The fields of ``POST /v1/webhook_endpoints`` (``creating``: all three are
    required) or of an update (any of them).

    Raises:
        InvalidRequestError: not an object, an unknown or missing field, a value
            of the wrong type or size, an event type this server does not send.
    """
    if not isinstance(body, Mapping):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    for key in body:
        if key not in _FIELDS:
            raise InvalidRequestError(
                f"Unknown parameter: {printable_key(key)!r}.",
                param=printable_key(key),
                code="unknown_parameter",
            )
    if creating:
        for key in sorted(_FIELDS - set(body)):
            raise InvalidRequestError(
                f"Missing required parameter: {key!r}.",
                param=key,
                code="missing_required_parameter",
            )
    name = _text(body, "name", MAX_NAME_CHARS)
    url = _text(body, "url", MAX_URL_CHARS)
    event_types = body.get("event_types")
    if event_types is not None:
        event_types = _event_types(event_types)
    return EndpointFields(name, url, event_types)


def _text(body: Mapping[str, Any], key: str, most: int) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(
            f"Invalid {key!r}: expected a non-empty string.", param=key, code="invalid_type"
        )
    if len(value) > most:
        raise InvalidRequestError(
            f"Invalid {key!r}: at most {most} characters.",
            param=key,
            code="string_above_max_length",
        )
    return value


def _event_types(value: Any) -> tuple[str, ...]:
    supported = ", ".join(EVENT_TYPES.values())
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(
            f"Invalid 'event_types': expected a non-empty list of event types ({supported}).",
            param="event_types",
            code="invalid_type",
        )
    for event_type in value:
        if event_type not in EVENT_TYPES.values():
            raise InvalidRequestError(
                f"Invalid 'event_types': this server sends only {supported}, "
                f"not {event_type[:64]!r}.",
                param="event_types",
                code="invalid_value",
            )
    return tuple(dict.fromkeys(value))
