"""The response status machine, as a table (SPEC §4 "Statuses").

::

    queued ──> in_progress ──> completed | incomplete | failed | cancelled
       └─────> cancelled | failed
"""

from __future__ import annotations

from typing import Literal

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]

TRANSITIONS: dict[Status, frozenset[Status]] = {
    "queued": frozenset({"in_progress", "cancelled", "failed"}),
    "in_progress": frozenset({"completed", "incomplete", "failed", "cancelled"}),
    "completed": frozenset(),
    "incomplete": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

TERMINAL: frozenset[Status] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)

TERMINAL_EVENT: dict[Status, str] = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    # A cancelled response ends its streams with `response.failed` whose
    # response carries status "cancelled": the SDK has no cancelled event type.
    "cancelled": "response.failed",
}


class IllegalTransition(RuntimeError):
    """A bug: the code tried to move a response along an edge the table lacks."""


def check_transition(current: Status, new: Status) -> None:
    """Raise `IllegalTransition` unless ``current -> new`` is in `TRANSITIONS`."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"response status cannot go from {current!r} to {new!r}")
