"""The conversation lease: one response's hold on its conversation while it runs.

`Conversations.begin` (``_conversations.py``) takes a conversation's lock for
one response and returns a `ConversationTurn`, which the job keeps alive while
it runs (`ConversationTurn.keep`, a task beside its generation) and which,
when the response ends ``completed`` or ``incomplete``, appends the response's
input and output items to the conversation and releases the lock
(`ConversationTurn.finish`, a step of the job's cleanup). A response that ends
``failed`` or ``cancelled`` adds nothing, so the turn can be retried.

The lock is a lease (``job_lease_s``) its job renews every third of it: a second
response on the same conversation, on any replica, gets 400
``conversation_locked`` while the first runs, and a replica that dies holding
one frees it when its lease runs out. A job that lost its lease (it could not
renew it in time, or another response took it) does not append its items.

A response whose items would take its conversation past ``max_input_items``
items or its tenant's byte share of the store is not appended (logged), and
the conversation stays as it was.
"""

from __future__ import annotations

import logging
from typing import Any, final

import trio

from ._cleanup import cleanup_scope
from .background.job import Job
from .store.base import ConversationFull, ConversationStore, StoreError, with_retries

logger = logging.getLogger("trio_responses.conversations")

APPENDED_STATUSES = frozenset({"completed", "incomplete"})
"""The terminal statuses whose response's items are appended to its conversation."""


@final
class ConversationTurn:
    """One response's hold on its conversation (see the module docstring)."""

    def __init__(
        self,
        store: ConversationStore,
        *,
        conversation_id: str,
        owner: str | None,
        response_id: str,
        lease_s: float,
        cleanup_s: float,
        max_items: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self._store = store
        self.conversation_id = conversation_id
        self.owner = owner
        self.response_id = response_id
        """The id the response gets (its lock's holder)."""
        self._lease_s = lease_s
        self._cleanup_s = cleanup_s
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._held_until = trio.current_time() + lease_s
        """When the lease surely holds until (this process's clock; conservative)."""
        self._lost = False
        self._stopped = False
        self._renewing = trio.Lock()
        self._keep_scope = trio.CancelScope()

    @property
    def lost(self) -> bool:
        """Whether the lease may have passed to another response (not renewed in time,
        or taken): its items are then not appended."""
        return self._lost or trio.current_time() >= self._held_until

    async def keep(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew the lock every third of its lease while the job runs, until `finish`
        (or cancellation) stops it, or the lease is lost."""
        with self._keep_scope:
            task_status.started()
            while not self._stopped:
                await trio.sleep(self._lease_s / 3)
                async with self._renewing:
                    if self._stopped or not await self._renew():
                        return

    async def _renew(self) -> bool:
        """Extend the lease; False once it is lost (renewing then stops: renewing a
        lease lost to another response that has since finished would take it again)."""
        if self.lost:
            self._lost = True
            logger.warning(
                "%s: its lock on conversation %s ran out before it could be renewed; its "
                "items will not be added",
                self.response_id,
                self.conversation_id,
            )
            return False
        began = trio.current_time()
        # Shielded: a renewal in flight ends (or times out) before `finish` unlocks.
        with cleanup_scope(self._cleanup_s):
            try:
                held = await self._store.lock(
                    self.conversation_id, self.response_id, owner=self.owner, lease_s=self._lease_s
                )
            except StoreError as error:
                logger.warning(
                    "%s: cannot renew its conversation's lock: %s", self.response_id, error
                )
                return True
            if held:
                self._held_until = began + self._lease_s
                return True
            self._lost = True
            logger.warning(
                "%s: conversation %s was %s (this response stalled past its lease); its items "
                "will not be added",
                self.response_id,
                self.conversation_id,
                "deleted" if held is None else "taken by another response",
            )
            return False
        return True  # timed out: tried again later (the lease decides)

    async def finish(self, job: Job) -> None:
        """Stop renewing, append the job's items to the conversation (completed or
        incomplete, the lease still held), then release the lock. Never raises a
        store failure (it is logged); each step is shielded and bounded by the
        cleanup budget, and all of them by the job's cleanup deadline."""
        self._stopped = True
        self._keep_scope.cancel()
        with cleanup_scope(self._cleanup_s):
            async with self._renewing:  # a renewal in flight lands before the unlock
                pass
        with cleanup_scope(self._cleanup_s) as scope:
            await self._append(job)
        if scope.cancelled_caught:
            logger.error("%s: updating conversation %s timed out", job.id, self.conversation_id)
        await self.release()

    async def _append(self, job: Job) -> None:
        if job.status not in APPENDED_STATUSES:
            return
        if self.lost:
            logger.warning(
                "%s: its lock on conversation %s was lost while it ran; its items are not "
                "added (the conversation may have moved on without it)",
                job.id,
                self.conversation_id,
            )
            return
        items = [*job.input_items, *job.snapshot().get("output", [])]
        added: list[dict[str, Any]] | None = []

        async def append() -> None:
            nonlocal added
            added = await self._store.add_items(
                self.conversation_id,
                items,
                owner=self.owner,
                max_items=self._max_items,
                max_bytes=self._max_bytes,
            )

        try:
            await with_retries(append)
        except ConversationFull as full:
            bound = (
                f"{self._max_items} items"
                if full.held_bytes is None
                else f"{self._max_bytes} bytes"
            )
            logger.warning(
                "%s: its %d items are not added to conversation %s: it would hold more than %s",
                job.id,
                len(items),
                self.conversation_id,
                bound,
            )
        except StoreError as error:
            logger.error(
                "%s: its items could not be added to conversation %s: %s",
                job.id,
                self.conversation_id,
                error,
            )
        else:
            if added is None:
                logger.warning(
                    "%s: conversation %s is gone; its items are not added",
                    job.id,
                    self.conversation_id,
                )

    async def release(self) -> None:
        """Release the lock (without adding anything, unless `finish` did); shielded,
        bounded by the cleanup budget, never raises a store failure."""
        self._stopped = True
        self._keep_scope.cancel()
        with cleanup_scope(self._cleanup_s) as scope:
            await self._unlock()
        if scope.cancelled_caught:
            logger.warning(
                "%s: releasing conversation %s timed out (its lease frees it)",
                self.response_id,
                self.conversation_id,
            )

    async def _unlock(self) -> None:
        try:
            await self._store.unlock(self.conversation_id, self.response_id, owner=self.owner)
        except StoreError as error:
            # Its lease ends it anyway, within job_lease_s.
            logger.warning("%s: cannot release conversation lock: %s", self.response_id, error)
