"""The webhook endpoints API without HTTP (``/v1/webhook_endpoints``, ``client.webhooks``).

`WebhooksAPI` holds the operations the SDK calls (create, retrieve, update,
list, delete, ``rotate_secret``, ``test``, and ``event_types.list``) over the
state backend's `WebhookStore`, scoped to the caller's owner like responses:
another API key's endpoint is a 404. A signing secret is returned once, by
create and ``rotate_secret``, and stored sealed with the server's encryption key
for the endpoint's owner (`sealing.Sealer`, purpose ``webhook_secret``).

A URL is checked when it is set: an http(s) URL without credentials whose host
is public, or allowed by ``--webhook-allow-host`` (a name is resolved to check
it); else a 400 naming ``url``. Each delivery checks it again (`post.Poster`).

The operator's endpoint (``--webhook URL``, secret in ``--webhook-secret-file``)
is written at start (`WebhooksAPI.install_operator`) as `OPERATOR_ENDPOINT_ID`
of the owner `OPERATOR`: it receives every tenant's events, survives in the
store like the others, and is removed when the server starts without
``--webhook``.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, final

import trio

from .._config import Config
from .._conversations import check_id
from .._exceptions import InvalidRequestError, NotFoundError
from ..protocol import errors
from ..protocol.ids import new_id
from ..protocol.lists import list_page
from ..protocol.webhooks import (
    EVENT_TYPES,
    event_body,
    new_secret,
    parse_endpoint_fields,
    secret_bytes,
    secret_hint,
    signed_headers,
)
from ..sealing import Sealer
from ..store.webhooks import (
    MAX_ENDPOINTS,
    OPERATOR,
    Delivery,
    EndpointsFull,
    StoredEndpoint,
    WebhookStore,
)
from ..tools.hosts import HostNotAllowed, allowed_hosts
from .post import Poster, check_address, check_webhook_url

__all__ = ["OPERATOR_ENDPOINT_ID", "WebhooksAPI", "operator_secret"]

OPERATOR_ENDPOINT_ID = "we_operator"
ROTATED_SECRET_S = 24 * 3600.0
"""How long a rotated-out secret still signs when ``keep_old_secret_active_for_24_hours``."""
_RESOLVE_TIMEOUT_S = 5.0


def operator_secret(path: Path) -> str:
    """The secret in ``path``; a new one written there (0600) if there is none.

    Raises:
        ValueError: the file holds something that is not a ``whsec_`` secret.
        OSError: the file cannot be read or created.
    """
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        secret = new_secret()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it first: use theirs
            return operator_secret(path)
        with os.fdopen(descriptor, "w") as file:
            file.write(secret + "\n")
        return secret
    try:
        if not text.startswith("whsec_") or len(secret_bytes(text)) < 16:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{path}: expected a webhook signing secret (whsec_ and base64 of at least "
            "16 bytes); delete the file to have a new one made"
        ) from None
    return text


@final
class WebhooksAPI:
    """The ``/v1/webhook_endpoints`` operations for one server."""

    def __init__(self, *, store: WebhookStore, sealer: Sealer, config: Config) -> None:
        self._store = store
        self._sealer = sealer
        self._config = config
        self._allowed = allowed_hosts(config.webhook_allow_hosts)

    # -- endpoints ----------------------------------------------------------------------

    async def create(self, body: Any, *, owner: str | None) -> dict[str, Any]:
        """``POST /v1/webhook_endpoints``: the endpoint, with its secret (this once)."""
        fields = parse_endpoint_fields(body, creating=True)
        assert fields.url is not None and fields.name is not None
        assert fields.event_types is not None
        await self._check_url(fields.url)
        secret = new_secret()
        now = int(time.time())
        endpoint = StoredEndpoint(
            {
                "id": _endpoint_id(),
                "object": "webhook_endpoint",
                "created_at": now,
                "updated_at": now,
                "name": fields.name,
                "url": fields.url,
                "event_types": list(fields.event_types),
                "signing_secret_hint": secret_hint(secret),
            },
            owner,
            self._seal(secret, owner),
        )
        try:
            await self._store.put_endpoint(endpoint)
        except EndpointsFull:
            raise InvalidRequestError(
                f"This API key has {MAX_ENDPOINTS} webhook endpoints, the most one may have: "
                "delete one first.",
                code=errors.QUOTA_EXCEEDED,
            ) from None
        return {**endpoint.endpoint, "signing_secret": secret}

    async def retrieve(self, endpoint_id: str, *, owner: str | None) -> dict[str, Any]:
        return (await self._endpoint(endpoint_id, owner)).endpoint

    async def update(self, endpoint_id: str, body: Any, *, owner: str | None) -> dict[str, Any]:
        """``POST /v1/webhook_endpoints/{id}``: change its name, URL or event types."""
        fields = parse_endpoint_fields(body, creating=False)
        stored = await self._endpoint(endpoint_id, owner)
        changes: dict[str, Any] = {}
        if fields.name is not None:
            changes["name"] = fields.name
        if fields.url is not None:
            await self._check_url(fields.url)
            changes["url"] = fields.url
        if fields.event_types is not None:
            changes["event_types"] = list(fields.event_types)
        endpoint = {**stored.endpoint, **changes}
        if endpoint == stored.endpoint:
            return stored.endpoint  # an unchanged update does not advance updated_at
        endpoint["updated_at"] = int(time.time())
        await self._put(
            StoredEndpoint(
                endpoint, owner, stored.secret, stored.previous_secret, stored.previous_until
            )
        )
        return endpoint

    async def list_endpoints(
        self, *, owner: str | None, after: str | None, limit: int
    ) -> dict[str, Any]:
        """``GET /v1/webhook_endpoints``: newest first, ``limit`` (1 to 100) per page."""
        if not 1 <= limit <= 100:
            raise InvalidRequestError(
                "Invalid 'limit': it must be between 1 and 100.",
                param="limit",
                code="invalid_value",
            )
        endpoints = [e.endpoint for e in await self._store.list_endpoints(owner=owner)]
        if after is not None:
            ids = [e["id"] for e in endpoints]
            if after not in ids:
                raise InvalidRequestError(
                    f"Invalid 'after': no webhook endpoint with id {after[:64]!r} in this list.",
                    param="after",
                    code="invalid_value",
                )
            endpoints = endpoints[ids.index(after) + 1 :]
        return list_page(endpoints[:limit], has_more=len(endpoints) > limit)

    async def delete(self, endpoint_id: str, *, owner: str | None) -> dict[str, Any]:
        """``DELETE /v1/webhook_endpoints/{id}``: its pending deliveries go with it."""
        check_id(endpoint_id, "webhook_endpoint_id", "webhook endpoint")
        if not await self._store.delete_endpoint(endpoint_id, owner=owner):
            raise _not_found(endpoint_id)
        return {"id": endpoint_id, "object": "webhook_endpoint.deleted", "deleted": True}

    async def rotate_secret(
        self, endpoint_id: str, body: Any, *, owner: str | None
    ) -> dict[str, Any]:
        """``POST /v1/webhook_endpoints/{id}/rotate_secret``: a new secret (shown this
        once); with ``keep_old_secret_active_for_24_hours``, deliveries carry a
        signature with the old one too for a day."""
        keep = _only_field(body, "keep_old_secret_active_for_24_hours")
        if keep is not None and not isinstance(keep, bool):
            raise InvalidRequestError(
                "Invalid 'keep_old_secret_active_for_24_hours': expected a boolean.",
                param="keep_old_secret_active_for_24_hours",
                code="invalid_type",
            )
        stored = await self._endpoint(endpoint_id, owner)
        secret = new_secret()
        endpoint = {
            **stored.endpoint,
            "signing_secret_hint": secret_hint(secret),
            "updated_at": int(time.time()),
        }
        previous, until = (stored.secret, time.time() + ROTATED_SECRET_S) if keep else (None, None)
        await self._put(StoredEndpoint(endpoint, owner, self._seal(secret, owner), previous, until))
        return {**endpoint, "signing_secret": secret}

    async def test(self, endpoint_id: str, body: Any, *, owner: str | None) -> dict[str, Any]:
        """``POST /v1/webhook_endpoints/{id}/test``: post a sample event of
        ``event_type`` now and say what the receiver answered."""
        event_type = _only_field(body, "event_type")
        if event_type not in EVENT_TYPES.values():
            raise InvalidRequestError(
                f"Invalid 'event_type': one of {', '.join(EVENT_TYPES.values())}.",
                param="event_type",
                code="invalid_value",
            )
        stored = await self._endpoint(endpoint_id, owner)
        secret = str(self._sealer.open("webhook_secret", stored.secret, owner=owner)["secret"])
        event_id = new_id("evt")
        body_bytes = event_body(event_id, str(event_type), int(time.time()), new_id("resp"))
        headers = signed_headers(event_id, int(time.time()), body_bytes, [secret])
        async with Poster(
            self._config.webhook_allow_hosts, timeout_s=self._config.webhook_timeout_s
        ) as poster:
            attempt = await poster.post(stored.url, headers, body_bytes)
        if attempt.status_code is None:
            raise InvalidRequestError(
                f"The test event got no answer from the endpoint: {attempt.error}",
                param="url",
                code="webhook_unreachable",
            )
        return {
            "object": "webhook_endpoint.test",
            "event_type": event_type,
            "status_code": attempt.status_code,
            "success": True,
            "webhook_endpoint_id": endpoint_id,
        }

    @staticmethod
    def event_types() -> dict[str, Any]:
        """``GET /v1/webhook_event_types``: the types this server sends."""
        return {"object": "list", "data": list(EVENT_TYPES.values())}

    # -- the operator's endpoint, and what the dashboard shows ----------------------------

    async def install_operator(self) -> None:
        """Write (or remove) the operator's endpoint as ``--webhook`` says.

        Raises:
            ValueError: the secret file holds no secret.
            OSError: it cannot be read or created.
        """
        config = self._config
        if config.webhook_url is None or config.webhook_secret_file is None:
            await self._store.delete_endpoint(OPERATOR_ENDPOINT_ID, owner=OPERATOR)
            return
        path = Path(config.webhook_secret_file)
        secret = await trio.to_thread.run_sync(operator_secret, path)
        now = int(time.time())
        existing = await self._store.get_endpoint(OPERATOR_ENDPOINT_ID, owner=OPERATOR)
        endpoint = {
            "id": OPERATOR_ENDPOINT_ID,
            "object": "webhook_endpoint",
            "created_at": existing.created_at if existing is not None else now,
            "updated_at": now,
            "name": "operator (--webhook)",
            "url": config.webhook_url,
            "event_types": list(EVENT_TYPES.values()),
            "signing_secret_hint": secret_hint(secret),
        }
        await self._store.put_endpoint(
            StoredEndpoint(endpoint, OPERATOR, self._seal(secret, OPERATOR))
        )

    async def recent_deliveries(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest deliveries of every owner, as the dashboard shows them."""
        return [_shown(d) for d in await self._store.deliveries(limit=limit)]

    # -- helpers ------------------------------------------------------------------------

    async def _endpoint(self, endpoint_id: str, owner: str | None) -> StoredEndpoint:
        check_id(endpoint_id, "webhook_endpoint_id", "webhook endpoint")
        stored = await self._store.get_endpoint(endpoint_id, owner=owner)
        if stored is None:
            raise _not_found(endpoint_id)
        return stored

    async def _put(self, endpoint: StoredEndpoint) -> None:
        try:
            await self._store.put_endpoint(endpoint)
        except EndpointsFull:  # replaced while it was being changed: deleted meanwhile
            raise _not_found(endpoint.id) from None

    def _seal(self, secret: str, owner: str | None) -> str:
        return self._sealer.seal("webhook_secret", {"secret": secret}, owner=owner)

    async def _check_url(self, url: str) -> None:
        """Refuse a URL the host policy cannot allow (400 naming ``url``)."""
        try:
            target = check_webhook_url(url, self._allowed)
            if target.address is None:
                await self._check_name(url, target.host, target.port)
        except HostNotAllowed as refused:
            raise InvalidRequestError(str(refused), param="url", code="invalid_url") from None

    async def _check_name(self, url: str, host: str, port: int) -> None:
        """A name must resolve, and to an address the policy allows."""
        try:
            with trio.fail_after(_RESOLVE_TIMEOUT_S):
                infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        except (OSError, trio.TooSlowError) as error:
            raise HostNotAllowed(f"Could not resolve the webhook host {host!r}: {error}") from None
        refusal: HostNotAllowed | None = None
        for info in infos:
            try:
                check_address(url, host, str(info[4][0]), self._allowed)
                return
            except HostNotAllowed as refused:
                refusal = refused
        raise refusal or HostNotAllowed(f"The webhook host {host!r} resolves to no address.")


def _endpoint_id() -> str:
    """A fresh endpoint id that sorts by creation: the time in nanoseconds (16 hex
    digits) before the random part, so endpoints made in the same second list
    newest first."""
    return f"we_{time.time_ns():016x}{secrets.token_hex(16)}"


def _only_field(body: Any, name: str) -> Any:
    if body is None:
        return None
    if not isinstance(body, Mapping):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    for key in body:
        if key != name:
            raise InvalidRequestError(
                f"Unknown parameter: {str(key)[:64]!r}.",
                param=str(key)[:64],
                code="unknown_parameter",
            )
    return body.get(name)


def _not_found(endpoint_id: str) -> NotFoundError:
    return NotFoundError(
        f"Webhook endpoint with id {endpoint_id!r} not found.", param="webhook_endpoint_id"
    )


def _shown(delivery: Delivery) -> dict[str, Any]:
    event = delivery.event
    return {
        "event_id": event.id,
        "type": event.type,
        "response_id": event.response_id,
        "endpoint_id": delivery.endpoint_id,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "status_code": delivery.status_code,
        "last_error": delivery.last_error,
        "created_at": event.created_at,
        "updated_at": delivery.updated_at,
        "next_attempt_at": delivery.next_attempt_at if delivery.status == "pending" else None,
    }
