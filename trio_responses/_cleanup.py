"""One deadline for a whole cleanup, however many steps it takes.

A job's cleanup is a chain of shielded steps: aborting its engine request,
stopping its recorder, writing its final state, updating and releasing its
conversation, closing its tool sessions. Each step may take the cleanup budget
(``cleanup_timeout_s``) at most, and the chain as a whole ends by one deadline:
the budget after the cleanup began. It begins when the job's task is cancelled
(the first step that starts in a cancelled task, the engine's abort say, sets
the deadline), or when its generation ends; once set, the deadline never moves.

A job's cleanup is also part of its service's closing (``within``): once the
service closes (`JobRunner.close`: the end of the shutdown grace period, or
leaving `open_responses_service`), every job's cleanup ends within the budget
of that moment, whenever it began.

`cleanup_scope` is the shielded scope of one step. It finds the cleanup it is
part of in a context variable (`Cleanup.enter`, by the job's task; the tasks it
starts inherit it), so that code far from the job runner (an engine, the
recorder, the conversation lease) keeps to the job's deadline without being
handed it. Outside a job (a request handler), a step has its own budget only.

Imports trio only.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import final

import trio


@final
class Cleanup:
    """When one cleanup must be over: not decided until it begins (`begin`)."""

    def __init__(self, budget_s: float, *, within: Cleanup | None = None) -> None:
        """``within``: a larger cleanup this one is part of, which may end it sooner."""
        self.budget_s = budget_s
        self._within = within
        self._deadline = math.inf

    @property
    def deadline(self) -> float:
        """When the cleanup must be over (``inf`` while neither it nor the cleanup
        it is within has begun)."""
        if self._within is None:
            return self._deadline
        return min(self._deadline, self._within.deadline)

    def begin(self) -> float:
        """The cleanup begins now, unless it began already: returns its deadline."""
        if self._deadline == math.inf:
            self._deadline = trio.current_time() + self.budget_s
        return self.deadline

    def enter(self) -> None:
        """Make this the cleanup of the current task, and of the tasks it starts from
        now on (each task has a context of its own: nothing to undo)."""
        _current.set(self)


_current: ContextVar[Cleanup | None] = ContextVar("trio_responses_cleanup", default=None)


def cleanup_scope(budget_s: float) -> trio.CancelScope:
    """A shielded scope for one cleanup step: it ends ``budget_s`` from now, or by
    the deadline of the current task's cleanup (`Cleanup.enter`), whichever comes
    first.

    A step that starts while its task is being cancelled begins that cleanup (if it
    had not begun): every later step of it ends by the same deadline.
    """
    deadline = trio.current_time() + budget_s
    cleanup = _current.get()
    if cleanup is not None:
        if trio.current_effective_deadline() == -math.inf:  # cancelled: it is stopping
            cleanup.begin()
        deadline = min(deadline, cleanup.deadline)
    return trio.CancelScope(deadline=deadline, shield=True)
