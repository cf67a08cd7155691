"""Output tokens of one generation turn -> Responses items and events (sans-IO).

`TurnTranslator` feeds each token to one `StreamParser` (our fast path in
front of openai_harmony's `StreamableParser`) and drives a `ResponseBuilder`.
It watches the structural special tokens itself (``<|message|>`` opens an
item, ``<|end|>``/``<|call|>``/``<|return|>`` close it) and reads only the
parser's `current_channel`, `current_recipient` and `last_content_delta`.

A message addressed to a tool becomes the item for that tool, chosen by the
``router``: ``functions.X`` a function call (or a custom tool's call: its raw
input), a built-in tool's recipient
(``python``, ``browser.search``, ``LABEL.TOOL`` of an MCP server) that tool's call
item (`tools.builtin`), or, when an MCP call needs the user's approval, an
approval request once the arguments are complete. The turn then ends with a
`ToolCall` for the caller to act on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from openai_harmony import HarmonyError

from ..protocol.builder import ResponseBuilder
from ..protocol.codec import encode_json
from ..tools.builtin import BuiltinTool
from .encoding import special_tokens
from .stream_parser import StreamParser

RecipientKind = Literal["function", "custom", "tool_search", "builtin", "mcp_approval", "unknown"]

Route = BuiltinTool | Literal["function", "custom", "tool_search", "mcp_approval", "unknown"]
"""Where a recipient goes: a built-in tool, or another `RecipientKind`."""

Router = Callable[[str], Route]


class MalformedOutput(Exception):
    """The model's tokens are not valid harmony (or address an unknown tool)."""


@dataclass(frozen=True)
class ToolCall:
    """A finished tool-call message: who it is for and what it says.

    For a ``builtin`` call (of ``tool``) the builder's item is still open, waiting
    for the result; for ``function`` and ``mcp_approval`` it is done (``item_id``
    names the function call or the approval request).
    """

    kind: RecipientKind
    recipient: str
    arguments: str
    item_id: str
    tool: BuiltinTool | None = None
    """The built-in tool called (``builtin``); None for the other kinds."""


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


def default_router(recipient: str) -> Route:
    return "function" if recipient.startswith("functions.") else "unknown"


class TurnTranslator:
    """Translate one turn of model output. Feed tokens, then call `finish`."""

    __slots__ = (
        "_builder",
        "_call",
        "_captured",
        "_closing",
        "_done",
        "_message",
        "_parser",
        "_recipient",
        "_returned",
        "_route",
        "_router",
        "_structural",
        "reasoning_tokens",
        "tokens",
    )

    def __init__(self, builder: ResponseBuilder, router: Router = default_router) -> None:
        self._builder = builder
        self._router = router
        self._parser = StreamParser()
        special = special_tokens()
        self._message = special.message
        self._closing = {special.end: "end", special.call: "call", special.return_: "return"}
        self._structural = special.structural
        self._recipient: str | None = None
        self._route: Route | None = None
        self._captured: list[str] | None = None  # arguments of a call awaiting approval
        self._call: ToolCall | None = None
        self._returned = False
        self._done = False
        self.tokens: list[int] = []
        """Every token fed so far (the next turn's prompt continues with them)."""
        self.reasoning_tokens = 0

    @property
    def output_tokens(self) -> int:
        return len(self.tokens)

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
        process = parser.process
        builder = self._builder
        structural = self._structural
        append = self.tokens.append
        for token in tokens:
            if self._done:
                return
            append(token)
            try:
                process(token)
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
            delta = parser.last_content_delta
            if self._captured is not None:
                if delta:
                    self._captured.append(delta)
                continue
            # The common case: a text token inside an open item.
            open_kind = builder.open_kind
            if open_kind is None:
                continue
            if open_kind == "reasoning":
                self.reasoning_tokens += 1
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
        builder = self._builder
        if recipient is None or recipient in ("", "assistant"):
            self._recipient = None
            self._route = None
            if channel == "analysis":
                builder.open_reasoning()
            elif channel == "commentary":
                builder.open_message(phase="commentary")
            else:
                builder.open_message(phase="final_answer")
            return
        route = self._router(recipient)
        if route == "unknown":
            raise MalformedOutput(
                f"the model called {recipient!r}, which is not a tool of this request"
            )
        self._recipient = recipient
        self._route = route
        if isinstance(route, BuiltinTool):
            builder.open_tool_call(route.item, recipient)
        elif route == "function":
            label, _, name = recipient.partition(".")
            builder.open_function_call(name, namespace=None if label == "functions" else label)
        elif route == "custom":
            builder.open_custom_tool_call(recipient.removeprefix("functions."))
        elif route == "tool_search":
            builder.open_tool_search_call()
        else:
            self._captured = []

    def _close_item(self, how: str) -> None:
        builder = self._builder
        recipient, route = self._recipient, self._route
        self._recipient = self._route = None
        if recipient is not None and route is not None:
            self._call = self._finish_call(route, recipient)
            if how != "end":
                self._done = True
            return
        if builder.open_kind is None:
            # ``<|end|>`` right after a header: an empty message. Nothing to close.
            if how != "end":
                self._done = True
                self._returned = how == "return"
            return
        builder.close_item("completed")
        if how == "return":
            self._returned = True
            self._done = True
        elif how == "call":
            self._done = True

    def _finish_call(self, route: Route, recipient: str) -> ToolCall:
        builder = self._builder
        if isinstance(route, BuiltinTool):
            open_item_id = builder.open_item_id
            arguments = builder.end_tool_input()
            return ToolCall("builtin", recipient, arguments, open_item_id, tool=route)
        if route == "mcp_approval":
            arguments = "".join(self._captured or [])
            self._captured = None
            label, _, tool = recipient.partition(".")
            item_id = builder.add_mcp_approval_request(label, tool, arguments)
            return ToolCall("mcp_approval", recipient, arguments, item_id)
        item = builder.close_item("completed")
        if route == "custom":
            return ToolCall("custom", recipient, str(item["input"]), str(item["id"]))
        if route == "tool_search":
            return ToolCall(
                "tool_search", recipient, encode_json(item["arguments"]), str(item["id"])
            )
        return ToolCall("function", recipient, str(item["arguments"]), str(item["id"]))
