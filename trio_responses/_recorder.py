"""Recording one job in the state backend: its record and its event log.

The recorder is the only writer of a job's stored state (SPEC §12). It writes

- the ``queued`` record, and (live backends) the first frames of a background
  log, before the job is reported started (`start`, `publish_created`);
- while the job runs, on durable backends (SQLite, Redis): the new frames of a
  background job's log, gathered over the backend's ``write_interval_s`` into one
  write, and the record whenever its status or its finished items have changed,
  so another replica (or a restarted process) sees the response as it stands
  (`follow`, a task in the job's nursery);
- the final record, and the finished log for replay (`finish`).

Every write is retried boundedly (`with_retries`) and shielded under the
cleanup budget (and the job's cleanup deadline, `cleanup_scope`), so cancelling
the follower stops it between writes, never in the middle of one. A backend
that stays down ends the response ``failed`` (``server_error``); the error
never leaves the job.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import final

import trio

from ._cleanup import cleanup_scope
from .background.event_log import SubscriberLagged
from .background.job import Job
from .protocol.errors import server_error
from .store.base import State, StoredResponse, StoreError, with_retries

logger = logging.getLogger("trio_responses.recorder")

_UNRECORDED = server_error("The server could not record this response (its store is unavailable).")


@final
class Recorder:
    """Writes one job's record and log. Not constructed directly: the job runner makes one."""

    def __init__(self, job: Job, state: State, *, budget_s: float) -> None:
        self._job = job
        self._state = state
        self._budget_s = budget_s
        self._stores = job.request.store
        self._writes_log = job.background and state.logs.live
        self._cursor = -1
        """Sequence number of the last frame written to the log store (or looked at)."""
        self._recorded: tuple[str, int] | None = None
        """(status, finished items) of the record as last written."""
        self._follower = trio.CancelScope()
        self._following = False
        """`follow` is running (started, and not yet returned)."""
        self._followed = trio.Event()

    @property
    def response_id(self) -> str:
        return self._job.id

    def record(self) -> StoredResponse:
        """The job's record as it stands now."""
        job = self._job
        return StoredResponse(
            response=job.snapshot(),
            input_items=job.input_items,
            owner=job.owner,
            replica=None if job.finished else self._state.control.replica,
        )

    async def start(self) -> None:
        """Store the ``queued`` record (for ``store: true``); before the job counts as started.

        Raises:
            StoreError: the backend stayed unavailable; nothing was recorded.
        """
        if self._stores:
            await with_retries(self._put)
            self._recorded = (self._job.status, 0)

    async def publish_created(self) -> None:
        """Write the first frames (``response.created``…) of a live background log, so a
        reader on another replica finds the log as soon as the create has returned.

        Raises:
            StoreError: the backend stayed unavailable.
        """
        if self._writes_log:
            await with_retries(self._write_frames)

    async def forget(self) -> None:
        """Undo `start` and `publish_created` (the create failed or was cancelled).
        Shielded and bounded."""
        job = self._job
        with cleanup_scope(self._budget_s):
            try:
                if self._stores:
                    await self._state.store.delete(job.id, owner=job.owner)
                if self._writes_log:
                    await self._state.logs.delete(job.id, owner=job.owner)
            except StoreError:
                logger.warning("%s: could not remove the record of a failed create", job.id)

    @property
    def follows(self) -> bool:
        """Whether `follow` has anything to write: only on durable backends."""
        return self._state.durable and (self._stores or self._writes_log)

    async def follow(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Write what the job produces as it goes, until `stop` or the end of its log.

        Returns at once unless it `follows`.
        """
        self._following = True
        try:
            with self._follower:
                task_status.started()
                if not self.follows:
                    return
                log = self._job.log
                interval = self._state.logs.write_interval_s
                while not log.closed:
                    await log.wait_after(self._cursor)
                    # Gather what follows into the same write (the end is `finish`'s).
                    await trio.sleep(interval)
                    if log.closed:
                        return
                    with cleanup_scope(self._budget_s):
                        try:
                            await with_retries(self._write)
                        except StoreError as error:
                            logger.error("%s: could not be recorded: %s", self._job.id, error)
                            self._job.abort(_UNRECORDED)
                            return
        finally:
            self._following = False
            self._followed.set()

    async def stop(self) -> None:
        """Stop `follow` after its current write (bounded by the budget). Returns at
        once when `follow` is not running (it was not started, or it has ended)."""
        self._follower.cancel()
        if not self._following:
            return
        with trio.move_on_after(self._budget_s):
            await self._followed.wait()

    async def finish(self) -> bool:
        """Write the final record, the rest of the log, and keep the log for replay.

        Call after `stop`, once the job is finished; call it shielded. The record
        goes first (whoever then sees the terminal event and retrieves the response
        finds it finished). Each step is bounded by the budget and tried even if the
        one before failed. Returns False if a step failed (it was logged): calling
        `finish` again later retries what is missing.
        """
        job = self._job
        steps: list[Callable[[], Awaitable[None]]] = [
            partial(self._write_record, force=True),
            self._write_frames,
        ]
        if job.background:
            steps.append(partial(self._state.logs.finish, job.id, job.log, owner=job.owner))
        complete = True
        for step in steps:
            try:
                with trio.fail_after(self._budget_s):
                    await with_retries(step)
            except (StoreError, trio.TooSlowError) as error:
                logger.error("%s: its final state could not be recorded: %s", job.id, error)
                complete = False
            except Exception:
                # A bug in a backend must not escape into the job nursery.
                logger.exception("%s: recording its final state failed", job.id)
                complete = False
        return complete

    async def _write(self) -> None:
        await self._write_frames()
        await self._write_record()

    async def _write_frames(self) -> None:
        """Append the frames produced since the last write (background, live backends)."""
        job = self._job
        log = job.log
        if not self._writes_log:
            self._cursor = log.next_sequence_number - 1
            return
        try:
            frames = log.read_after(self._cursor)
        except SubscriberLagged as lagged:
            # The backend fell a whole ring behind: what was dropped is lost.
            logger.warning("%s: events before %d never reached the store", job.id, lagged.oldest)
            self._cursor = lagged.oldest - 1
            frames = log.read_after(self._cursor)
        if frames:
            await self._state.logs.append(job.id, frames, first=self._cursor + 1, owner=job.owner)
            self._cursor += len(frames)

    async def _write_record(self, *, force: bool = False) -> None:
        """Write the record if its status or finished items changed (or ``force``)."""
        job = self._job
        if not self._stores:
            return
        shape = (job.status, len(job.builder.finished_items()))
        if force or shape != self._recorded:
            await self._put()
            self._recorded = shape

    async def _put(self) -> None:
        await self._state.store.put(self.record())
