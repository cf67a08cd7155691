"""A job: one response being produced, its builder, its event log, its cancel scope.

The job's task lives in the service's job nursery (foreground and background
alike); request handlers only subscribe to the log or wait for `done`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

import trio

from ..protocol.builder import ResponseBuilder
from ..protocol.request import CreateRequest
from .event_log import EventLog


@final
class Job:
    """State of one response while it runs (and shortly after, for replay).

    Not constructed directly: `ResponsesService.create` makes jobs.
    """

    def __init__(
        self,
        *,
        response_id: str,
        request: CreateRequest,
        model: str,
        prompt_tokens: Sequence[int],
        input_items: list[dict[str, Any]],
        context: list[dict[str, Any]],
        owner: str | None,
        created_at: float,
        echo: dict[str, Any],
        log: EventLog,
    ) -> None:
        self.id = response_id
        self.request = request
        self.owner = owner
        self.prompt_tokens = list(prompt_tokens)
        self.input_items = input_items
        self.context = context
        self.log = log
        self.builder = ResponseBuilder(
            response_id=response_id,
            model=model,
            created_at=created_at,
            echo=echo,
            background=request.background,
            emit=log.append,
        )
        self.cancel_scope = trio.CancelScope()
        self.done = trio.Event()
        """Set once the terminal state is final (and persisted, if stored)."""
        self.cancel_requested = False

    @property
    def background(self) -> bool:
        return self.request.background

    @property
    def status(self) -> str:
        return self.builder.status

    def snapshot(self) -> dict[str, Any]:
        return self.builder.snapshot()

    def cancel(self) -> None:
        """Ask the job to stop; it ends ``cancelled``. Idempotent, never blocks."""
        self.cancel_requested = True
        self.cancel_scope.cancel()
