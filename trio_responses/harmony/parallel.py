"""Several client calls in one turn (``parallel_tool_calls``), sans-IO.

A harmony turn stops at its first ``<|call|>``. When that call is the client's (a
function or custom tool) and the request allows parallel calls, the server asks
the model to go on: the prompt continues with the call and a fresh
``<|start|>assistant``, and `NextCallGate` stands between the engine and the
turn's translator. It holds the output back until the first message header
shows what comes next:

* another call the client runs: everything held (a short analysis message
  before it included) goes to the translator, and so does the rest;
* anything else (the final answer, a preamble, a built-in tool's call, a long
  analysis, a stop): `Declined` is raised from the sink, which aborts the
  engine request, and nothing held is shown. The response ends with the calls
  made so far, for the client to run.

At most `MAX_CALLS_PER_TURN` calls are made this way in one turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from .encoding import get_encoding, special_tokens
from .steering import parse_header

MAX_CALLS_PER_TURN = 16
"""Client calls one turn may make; the continuation stops asking after this many."""

MAX_HELD_TOKENS = 128
"""Output held while the next message is undecided: an analysis message longer
than this before another call ends the turn instead."""


def continuation(prompt: Sequence[int], turn: Sequence[int]) -> list[int]:
    """The prompt that asks for another message after ``turn`` (ending with a client
    call's ``<|call|>``): the assistant speaks again, before any tool output."""
    assistant = get_encoding().encode("assistant", disallowed_special=())
    return [*prompt, *turn, special_tokens().start, *assistant]


class Declined(Exception):
    """Raised from the gate's sink: the continuation is not another client call."""

    def __init__(self, held: int) -> None:
        super().__init__("the model did not make another call")
        self.held = held
        """The tokens the engine produced that no item shows."""


class NextCallGate:
    """Holds a continuation's output until it is known to be another client call.

    ``calls(recipient)``: whether a call of ``recipient`` is one the client runs.
    """

    def __init__(
        self,
        forward: Callable[[Sequence[int]], None],
        calls: Callable[[str], bool],
        *,
        max_held: int = MAX_HELD_TOKENS,
    ) -> None:
        self._forward = forward
        self._calls = calls
        self._max_held = max_held
        self._held: list[int] = []
        self._header_at = 0
        self._in_analysis = False
        self.accepted = False
        special = special_tokens()
        self._message = special.message
        self._end = special.end
        self._stops = frozenset((special.call, special.return_))

    @property
    def held(self) -> int:
        """Tokens produced and not (yet) shown."""
        return len(self._held)

    def feed(self, tokens: Iterable[int]) -> None:
        """Forward ``tokens`` once the continuation is a call; hold them until then.

        Raises:
            Declined: the continuation is something else; the engine must stop.
        """
        if self.accepted:
            self._forward(list(tokens))
            return
        batch = list(tokens)
        for index, token in enumerate(batch):
            self._held.append(token)
            if self._in_analysis:
                if token == self._end:
                    self._in_analysis = False
                    self._header_at = len(self._held)
                elif token in self._stops:
                    raise Declined(self.held)
            elif token == self._message:
                header = parse_header(self._held[self._header_at :])
                if header.recipient is not None and self._calls(header.recipient):
                    self.accepted = True
                    held, self._held = self._held, []
                    self._forward([*held, *batch[index + 1 :]])
                    return
                if header.recipient is not None or header.channel != "analysis":
                    raise Declined(self.held)
                self._in_analysis = True
            elif token in self._stops or token == self._end:
                raise Declined(self.held)
            if len(self._held) > self._max_held:
                raise Declined(self.held)
