"""Output tokens of one generation turn -> Responses items and events (sans-IO).

`TurnTranslator` feeds each token to one `StreamableParser` and drives a
`ResponseBuilder`. It watches the structural special tokens itself
(``<|message|>`` opens an item, ``<|end|>``/``<|call|>``/``<|return|>`` close
it) and reads only the parser's cheap accessors (`current_channel`,
`current_recipient`, `last_content_delta`). It never touches
``parser.state`` or ``parser.messages``, which re-serialise the whole message
on every access and would make long outputs quadratic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from openai_harmony import HarmonyError, Role, StreamableParser

from ..protocol.builder import ResponseBuilder
from .encoding import get_encoding, special_tokens

RecipientKind = Literal["function", "unknown"]
"""How a recipient is handled; later tool kinds extend this."""

Router = Callable[[str], RecipientKind]


class MalformedOutput(Exception):
    """The model's tokens are not valid harmony (or address an unknown tool)."""


@dataclass(frozen=True)
class ToolCall:
    """A finished tool-call message: who it is for and what it says."""

    kind: RecipientKind
    recipient: str
    arguments: str
    item: dict[str, object]


@dataclass(frozen=True)
class TurnOutcome:
    """How a generation turn ended.

    * ``final``: the model returned its answer (``<|return|>``);
    * ``tool_call``: the turn ended with a call (``<|call|>``), see ``call``;
    * ``truncated``: the token budget ran out (open item closed ``incomplete``);
    * ``ended``: the engine stopped without a closing token.
    """

    kind: Literal["final", "tool_call", "truncated", "ended"]
    call: ToolCall | None = None


def default_router(recipient: str) -> RecipientKind:
    return "function" if recipient.startswith("functions.") else "unknown"


class TurnTranslator:
    """Translate one turn of model output. Feed tokens, then call `finish`."""

    def __init__(self, builder: ResponseBuilder, router: Router = default_router) -> None:
        self._builder = builder
        self._router = router
        self._parser = StreamableParser(get_encoding(), Role.ASSISTANT)
        special = special_tokens()
        self._message = special.message
        self._closing = {special.end: "end", special.call: "call", special.return_: "return"}
        self._structural = special.structural
        self._recipient: str | None = None
        self._kind: RecipientKind | None = None
        self._call: ToolCall | None = None
        self._returned = False
        self._done = False
        self.output_tokens = 0
        self.reasoning_tokens = 0

    @property
    def done(self) -> bool:
        """True once the turn ended with ``<|call|>`` or ``<|return|>``."""
        return self._done

    def feed(self, tokens: Iterable[int]) -> None:
        """Process output tokens in order.

        Raises:
            MalformedOutput: the tokens break the harmony format. The builder's
                open item (if any) is left open for the caller to close.
        """
        parser = self._parser
        builder = self._builder
        structural = self._structural
        for token in tokens:
            if self._done:
                return
            self.output_tokens += 1
            try:
                parser.process(token)
            except HarmonyError as error:
                raise MalformedOutput(
                    f"the model produced invalid harmony tokens: {error}"
                ) from None
            if token in structural:
                if token == self._message:
                    self._open_item()
                elif token in self._closing:
                    self._close_item(self._closing[token])
                continue
            open_kind = builder.open_kind
            if open_kind is None:
                continue
            if open_kind == "reasoning":
                self.reasoning_tokens += 1
            delta = parser.last_content_delta
            if delta:
                builder.delta(delta)

    def finish(self, reason: Literal["stop", "length"]) -> TurnOutcome:
        """The engine stopped; say how the turn ended."""
        if self._call is not None:
            return TurnOutcome("tool_call", self._call)
        if self._returned:
            return TurnOutcome("final")
        if self._builder.open_kind is not None:
            self._builder.close_item("incomplete")
        return TurnOutcome("truncated" if reason == "length" else "ended")

    def _open_item(self) -> None:
        parser = self._parser
        channel = parser.current_channel
        recipient = parser.current_recipient
        if recipient in (None, "", "assistant"):
            self._recipient = None
            self._kind = None
            if channel == "analysis":
                self._builder.open_reasoning()
            elif channel == "commentary":
                self._builder.open_message(phase="commentary")
            else:
                self._builder.open_message(phase="final_answer")
            return
        assert recipient is not None
        kind = self._router(recipient)
        if kind == "unknown":
            raise MalformedOutput(
                f"the model called {recipient!r}, which is not a tool of this request"
            )
        self._recipient = recipient
        self._kind = kind
        self._builder.open_function_call(recipient.removeprefix("functions."))

    def _close_item(self, how: str) -> None:
        builder = self._builder
        if builder.open_kind is None:
            # ``<|end|>`` right after a header: an empty message. Nothing to close.
            if how != "end":
                self._done = True
                self._returned = how == "return"
            return
        item = builder.close_item("completed")
        if self._recipient is not None and self._kind is not None:
            arguments = item.get("arguments", "")
            self._call = ToolCall(self._kind, self._recipient, str(arguments), item)
            self._recipient = None
            self._kind = None
            if how != "end":
                self._done = True
            return
        if how == "return":
            self._returned = True
            self._done = True
        elif how == "call":
            self._done = True
