"""A job: one response being produced, its builder, its event log, its cancel scope.

The job's task lives in the service's job nursery (foreground and background
alike); request handlers only subscribe to the log or wait for `done`.

The terminal event is the end of the story for readers: whoever decides the
outcome (the generation loop, `cancel`, `abort`) calls `finish`, which emits
that event and closes the log at once. Cleanup that follows (aborting the
engine request, closing tool sessions, persisting) never delays a reader.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, final

import trio

from ..protocol.builder import ResponseBuilder
from ..protocol.errors import ErrorInfo
from ..protocol.lifecycle import Status
from ..protocol.request import CreateRequest
from .event_log import EventLog


class TurnTokens(Protocol):
    """What a generation turn has produced so far (the turn's translator)."""

    @property
    def output_tokens(self) -> int: ...

    @property
    def reasoning_tokens(self) -> int: ...


@final
class Job:
    """State of one response while it runs (and shortly after, for replay).

    Not constructed directly: the job runner makes jobs; callers outside the
    service get a `ResponseHandle`.
    """

    def __init__(
        self,
        *,
        response_id: str,
        request: CreateRequest,
        model: str,
        prompt_tokens: Sequence[int],
        input_items: list[dict[str, Any]],
        owner: str | None,
        created_at: int,
        echo: dict[str, Any],
        log: EventLog,
    ) -> None:
        self.id = response_id
        self.request = request
        self.owner = owner
        self.prompt_tokens = list(prompt_tokens)
        self.input_items = input_items
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
        """Set once the job has finished and tried to record its final state (what a
        client waiting for it needs; a state the store refused is retried later)."""
        self.ended = trio.Event()
        """Set once the job's task is gone (tool sessions closed, nothing left running)."""
        self._turn: TurnTokens | None = None
        """The generation turn under way (`begin_turn`), not yet in ``builder.usage``."""
        self._turn_prompt_tokens = 0

    @property
    def generated_tokens(self) -> int:
        """Output tokens the engine has delivered so far, every turn together (live)."""
        turn = self._turn
        return self.builder.usage.output_tokens + (0 if turn is None else turn.output_tokens)

    def begin_turn(self, turn: TurnTokens, *, prompt_tokens: int) -> None:
        """A generation turn starts on a prompt of ``prompt_tokens``: until `end_turn`,
        what it has produced counts as spent if the response ends first (`finish`)."""
        self._turn = turn
        self._turn_prompt_tokens = prompt_tokens

    def end_turn(self, *, prompt_tokens: int, cached_tokens: int, hidden_tokens: int = 0) -> None:
        """The turn `begin_turn` started is over: count it in the response's usage, with
        the figures the engine reported (``hidden_tokens``: output no item shows)."""
        turn, self._turn = self._turn, None
        if turn is None:
            return
        usage = self.builder.usage
        usage.input_tokens += prompt_tokens
        usage.cached_tokens += cached_tokens
        usage.output_tokens += turn.output_tokens + hidden_tokens
        usage.reasoning_tokens += turn.reasoning_tokens

    @property
    def background(self) -> bool:
        return self.request.background

    @property
    def status(self) -> Status:
        return self.builder.status

    @property
    def finished(self) -> bool:
        """True once the terminal event has been emitted."""
        return self.builder.finished

    def snapshot(self) -> dict[str, Any]:
        return self.builder.snapshot()

    def finish(
        self,
        status: Status,
        *,
        error: ErrorInfo | None = None,
        incomplete_reason: str | None = None,
    ) -> None:
        """Emit the terminal event and close the log (readers end right after it).

        A turn still generating (the response is cancelled, or the server shuts
        down) counts in its usage as far as it got: its prompt as input (none of it
        known to be cached) and what it generated as output.
        """
        self.end_turn(prompt_tokens=self._turn_prompt_tokens, cached_tokens=0)
        self.builder.finish(
            status, now=int(time.time()), error=error, incomplete_reason=incomplete_reason
        )
        self.log.close()

    def cancel(self) -> None:
        """End the response ``cancelled`` now and stop its task. Idempotent, never blocks.

        Every reader gets the terminal event at once; the task then aborts its
        engine request and tool calls in its own (shielded, bounded) cleanup.
        """
        if not self.finished:
            self.finish("cancelled")
        self.cancel_scope.cancel()

    def abort(self, error: ErrorInfo) -> None:
        """End the response ``failed`` with ``error`` and stop its task (shutdown)."""
        if not self.finished:
            self.finish("failed", error=error)
        self.cancel_scope.cancel()
