"""The sender: the task that posts the outbox's deliveries, on every replica.

`WebhookSender.run` claims due deliveries (`WebhookStore.claim`: a lease for this
replica), posts each in a task of its own nursery (`post.Poster`), and settles it:

- a 2xx: delivered;
- anything else (another status, a redirect, a refused or reset connection, no
  answer within ``--webhook-timeout``): due again after an exponential backoff
  with jitter (``--webhook-first-retry``, doubling, at most an hour; a
  ``Retry-After`` is honoured when it asks for longer), until
  ``--webhook-retry-window`` after the event: then failed, and logged.

At most ``--webhook-concurrency`` posts run at once, and a quarter of them (at
least one) to any one endpoint, so a slow or hostile receiver holds at most its
share: its other deliveries wait in the outbox while the others' go out. The
lease outlives an attempt (twice the timeout and ten seconds), so a delivery is
posted by one replica at a time; a replica that dies mid-delivery leaves it to
whichever claims it once the lease has run out. A delivery claimed but not posted
when the sender stops is given back, uncounted.

The sender wakes when this replica records a background response's final state
(`WebhookSender.wake`), when a post ends, and otherwise when the next delivery is
due, or every `POLL_S` seconds (deliveries written by other replicas, leases
that ran out).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import replace
from typing import NoReturn, final
from urllib.parse import urlsplit

import trio

from .._config import Config
from .._exceptions import ResponsesError, StoreError
from ..metrics import Metrics
from ..protocol.webhooks import event_body, signed_headers
from ..sealing import Sealer
from ..store.webhooks import Delivery, StoredEndpoint, WebhookStore
from .post import Attempt, Poster

__all__ = ["POLL_S", "WebhookSender", "backoff_s"]

logger = logging.getLogger(__name__)

POLL_S = 1.0
"""Longest the sender waits before looking at the outbox again."""

MAX_BACKOFF_S = 3600.0


def backoff_s(attempts: int, first_s: float, *, retry_after_s: float | None = None) -> float:
    """How long to wait after the ``attempts``-th failed attempt: ``first_s`` doubled
    for each earlier one, at most an hour, with jitter (half to all of it); at least
    what the receiver's ``Retry-After`` asked for."""
    delay: float = min(MAX_BACKOFF_S, first_s * 2.0 ** max(0, attempts - 1))
    delay *= random.uniform(0.5, 1.0)
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, MAX_BACKOFF_S))
    return delay


@final
class WebhookSender:
    """Posts the outbox's deliveries from this replica. Run `run` in a nursery."""

    def __init__(
        self,
        *,
        store: WebhookStore,
        sealer: Sealer,
        config: Config,
        replica: str,
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._sealer = sealer
        self._replica = replica
        self._metrics = metrics
        self._timeout_s = config.webhook_timeout_s
        self._window_s = config.webhook_retry_window_s
        self._first_retry_s = config.webhook_first_retry_s
        self._allow_hosts = config.webhook_allow_hosts
        self._concurrency = config.webhook_concurrency
        self._per_endpoint = max(1, config.webhook_concurrency // 4)
        self._lease_s = 2 * config.webhook_timeout_s + 10
        self._settle_s = config.cleanup_timeout_s
        """How long a settle, or giving a delivery back, may take before it is left to
        the lease (shielded: also when the sender stops)."""
        self._in_flight: Counter[str] = Counter()
        self._wakeup = trio.Event()
        self._secrets: dict[tuple[str, str], str] = {}
        """(owner, sealed secret) -> the secret, opened once."""

    @property
    def in_flight(self) -> int:
        """Posts running now."""
        return sum(self._in_flight.values())

    def wake(self) -> None:
        """Look at the outbox now (a delivery may have been written)."""
        self._wakeup.set()

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Claim, post and settle deliveries until cancelled.

        This function never returns unless cancelled.
        """
        async with (
            Poster(self._allow_hosts, timeout_s=self._timeout_s) as poster,
            trio.open_nursery() as posts,
        ):
            task_status.started()
            while True:
                delay = await self._claim_and_post(poster, posts)
                with trio.move_on_after(delay):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()

    async def _claim_and_post(self, poster: Poster, posts: trio.Nursery) -> float:
        """Start posting what may be claimed now; returns how long to wait before
        looking again (unless woken)."""
        free = self._concurrency - self.in_flight
        try:
            claimed = []
            if free > 0:
                claimed = await self._store.claim(
                    self._replica,
                    now=time.time(),
                    lease_s=self._lease_s,
                    limit=free,
                    per_endpoint=self._per_endpoint,
                    in_flight=dict(self._in_flight),
                )
            for delivery in claimed:
                self._in_flight[delivery.endpoint_id] += 1
                posts.start_soon(self._deliver, poster, delivery)
            if len(claimed) == free:
                return 0.0 if free > 0 else POLL_S  # more may be due; else a post's end wakes
            due = await self._store.next_due()
        except StoreError as error:
            logger.warning("webhook outbox unavailable (retrying): %s", error)
            return POLL_S
        if due is None:
            return POLL_S
        wait = due - time.time()
        # Due now but not claimed: its endpoint is at its share; a post's end wakes.
        return POLL_S if wait <= 0 else min(POLL_S, wait)

    async def _deliver(self, poster: Poster, delivery: Delivery) -> None:
        """Post one claimed delivery and settle it; the lease covers it all."""
        settled: Delivery | None = None
        later = 0.0
        try:
            settled = await self._attempt(poster, delivery)
        except StoreError as error:
            logger.warning("webhook %s: the store failed (%s); retried", delivery.event.id, error)
            later = self._first_retry_s
        except Exception:  # a bug must not stop the sender: this delivery is retried
            logger.exception("webhook %s: the attempt failed", delivery.event.id)
            later = self._first_retry_s
        finally:
            if settled is None:  # not posted (shutting down, a fault): given back, uncounted
                now = time.time()
                settled = replace(delivery, attempts=delivery.attempts - 1).settled(
                    "pending",
                    now=now,
                    next_attempt_at=now + later,
                    error=delivery.last_error,
                    status_code=delivery.status_code,
                )
            with trio.CancelScope(shield=True):
                with trio.move_on_after(self._settle_s):
                    try:
                        await self._store.settle(settled, replica=self._replica)
                    except StoreError as error:
                        logger.warning(
                            "webhook %s: could not record the attempt (%s); it is retried "
                            "once its lease runs out",
                            delivery.event.id,
                            error,
                        )
                self._in_flight[delivery.endpoint_id] -= 1
                if self._in_flight[delivery.endpoint_id] <= 0:
                    del self._in_flight[delivery.endpoint_id]
                self.wake()

    async def _attempt(self, poster: Poster, delivery: Delivery) -> Delivery:
        event = delivery.event
        endpoint = await self._store.get_endpoint(
            delivery.endpoint_id, owner=delivery.endpoint_owner
        )
        if endpoint is None:  # deleted meanwhile: its deliveries went with it
            return delivery.settled("failed", now=time.time(), error="endpoint deleted")
        try:
            secrets = self._open_secrets(endpoint)
        except ResponsesError:
            logger.error(
                "webhook %s to %s: its signing secret does not open with this server's "
                "encryption key; not sent",
                event.id,
                endpoint.id,
            )
            self._metrics.webhook_settled(event.type, "failed", None)
            return delivery.settled("failed", now=time.time(), error="signing secret unreadable")
        body = event_body(event.id, event.type, int(event.created_at), event.response_id)
        headers = signed_headers(event.id, int(time.time()), body, secrets)
        attempt = await poster.post(endpoint.url, headers, body)
        return self._outcome(delivery, endpoint, attempt)

    def _outcome(self, delivery: Delivery, endpoint: StoredEndpoint, attempt: Attempt) -> Delivery:
        now = time.time()
        event = delivery.event
        if attempt.ok:
            self._metrics.webhook_attempt("ok")
            self._metrics.webhook_settled(event.type, "delivered", now - event.created_at)
            return delivery.settled("delivered", now=now, status_code=attempt.status_code)
        next_at = now + backoff_s(
            delivery.attempts, self._first_retry_s, retry_after_s=attempt.retry_after_s
        )
        host = urlsplit(endpoint.url).hostname
        if next_at > event.created_at + self._window_s:
            self._metrics.webhook_attempt("failed")
            self._metrics.webhook_settled(event.type, "failed", None)
            logger.warning(
                "webhook %s (%s) to %s at %s failed after %d attempts: %s",
                event.id,
                event.type,
                endpoint.id,
                host,
                delivery.attempts,
                attempt.error,
            )
            return delivery.settled(
                "failed", now=now, error=attempt.error, status_code=attempt.status_code
            )
        self._metrics.webhook_attempt("retry")
        logger.info(
            "webhook %s to %s at %s: attempt %d failed (%s); retrying in %.1f s",
            event.id,
            endpoint.id,
            host,
            delivery.attempts,
            attempt.error,
            next_at - now,
        )
        return delivery.settled(
            "pending",
            now=now,
            next_attempt_at=next_at,
            error=attempt.error,
            status_code=attempt.status_code,
        )

    def _open_secrets(self, endpoint: StoredEndpoint) -> list[str]:
        """The endpoint's signing secrets, in the clear: its own, and a rotated-out
        one that still signs.

        Raises:
            ResponsesError: a secret does not open (another encryption key).
        """
        sealed = [endpoint.secret]
        if endpoint.previous_secret and (endpoint.previous_until or 0) > time.time():
            sealed.append(endpoint.previous_secret)
        return [self._open(blob, endpoint.owner) for blob in sealed]

    def _open(self, blob: str, owner: str | None) -> str:
        key = (owner or "", blob)
        secret = self._secrets.get(key)
        if secret is None:
            secret = str(self._sealer.open("webhook_secret", blob, owner=owner)["secret"])
            if len(self._secrets) >= 1024:
                self._secrets.clear()
            self._secrets[key] = secret
        return secret
