"""Steering a turn: structured final answers and enforced ``tool_choice`` (sans-IO).

The model generates freely; a `HeaderGate` between the engine and the
`TurnTranslator` holds back each message header (``<|start|>...<|message|>``)
until it is complete and asks the turn's `Steering` what to do with it:

* `PASS`: hand it on, generation continues unconstrained (reasoning stays free);
* `Constrain`: hand it on, then stop the engine: the message body is
  generated again under a constraint (the final answer's ``text.format``
  schema, a tool's ``parameters``);
* `Replace`: drop it and stop the engine: the turn continues with a prefilled
  header instead (a call of the forced tool, or the final answer when
  ``tool_choice`` is ``"none"`` and the model addressed a tool anyway).

A custom tool with a grammar makes every turn steered: a header addressed to it
is a `Constrain` whose body must be in the tool's grammar.

The gate stops the engine by raising `Interrupt` from its sink (the `Engine`
protocol aborts a request whose sink raises). Prefilled header tokens are fed
to the translator as if the model had written them, so clients see the same
items and events either way; they count as output tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..protocol.grammar import Grammar
from ..protocol.request import (
    CreateRequest,
    FormatJsonObject,
    FormatJsonSchema,
    ToolChoiceAllowed,
    ToolChoiceCustom,
    ToolChoiceFunction,
    ToolChoiceHosted,
    ToolChoiceMcp,
)
from ..protocol.tool_params import TOOL_SEARCH
from ..tools.builtin import NAMESPACES, BuiltinTool, tool_for_choice
from .encoding import get_encoding, special_tokens
from .prompt import PromptTools

ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Target:
    """A tool call the model can be made to make: its header and its arguments' schema."""

    recipient: str
    channel: str
    content_type: str
    """``json`` (arguments constrained to ``schema``), ``code`` (free text), or empty
    (a custom tool: free text, in ``grammar`` when it has one)."""
    schema: Mapping[str, Any] | None = None
    grammar: Grammar | None = None

    @property
    def choice(self) -> str:
        """The header text after ``<|channel|>`` that names this call."""
        return f"{self.channel} to={self.recipient}"


@dataclass(frozen=True)
class Header:
    channel: str | None
    recipient: str | None


@dataclass(frozen=True)
class Pass:
    pass


PASS = Pass()


@dataclass(frozen=True)
class Constrain:
    """Keep the header; its body must match ``schema`` (or ``grammar``, when set)."""

    schema: Mapping[str, Any]
    call: bool
    grammar: Grammar | None = None


@dataclass(frozen=True)
class Replace:
    """Drop the header; continue with a call of one of ``targets``, or the final answer."""

    targets: tuple[Target, ...] = ()
    final_schema: Mapping[str, Any] | None = None


Decision = Pass | Constrain | Replace


class Interrupt(Exception):
    """Raised from the gate's sink to stop the engine at a decided header."""

    def __init__(self, decision: Constrain | Replace) -> None:
        super().__init__("steering interrupt")
        self.decision = decision


@dataclass(frozen=True)
class Steering:
    """What a turn must produce."""

    final_schema: Mapping[str, Any] | None = None
    """The final answer's JSON schema (``text.format``); None: free text."""
    targets: tuple[Target, ...] = ()
    """A call of one of these is required (``tool_choice``); empty: not forced."""
    no_calls: bool = False
    """``tool_choice: "none"``: a message addressed to a tool becomes the final answer."""
    grammars: tuple[tuple[str, Grammar], ...] = ()
    """(recipient, grammar) of each custom tool with a grammar: its calls' bodies
    are constrained to it."""

    @property
    def active(self) -> bool:
        return (
            self.final_schema is not None
            or bool(self.targets)
            or self.no_calls
            or bool(self.grammars)
        )

    def satisfied(self) -> Steering:
        """The steering once the forced call is made: nothing more is forced."""
        return replace(self, targets=())

    def decide(self, header: Header) -> Decision:
        recipient = header.recipient
        if self.targets:
            if recipient is None and header.channel == "analysis":
                return PASS
            forced = {target.recipient: target for target in self.targets}
            target = forced.get(recipient) if recipient is not None else None
            if target is None:
                return Replace(targets=self.targets)
            return _call_decision(target)
        if recipient is not None:
            if self.no_calls:
                return Replace(final_schema=self.final_schema)
            for name, grammar in self.grammars:
                if name == recipient:
                    return Constrain(ANY_OBJECT, call=False, grammar=grammar)
            return PASS
        if header.channel == "final" and self.final_schema is not None:
            return Constrain(self.final_schema, call=False)
        return PASS


def _call_decision(target: Target) -> Decision:
    if target.grammar is not None:
        return Constrain(ANY_OBJECT, call=True, grammar=target.grammar)
    if target.content_type == "json":
        return Constrain(target.schema or ANY_OBJECT, call=True)
    return PASS


def steering_for(request: CreateRequest, tools: PromptTools, *, forced: bool) -> Steering:
    """The steering of a turn of ``request``; ``forced``: no call was made in this response yet."""
    text_format = request.text.format if request.text is not None else None
    final_schema: Mapping[str, Any] | None = None
    if isinstance(text_format, FormatJsonSchema):
        final_schema = text_format.schema_
    elif isinstance(text_format, FormatJsonObject):
        final_schema = ANY_OBJECT
    choice = request.tool_choice
    if choice == "none":
        return Steering(final_schema=final_schema, no_calls=True)
    grammars = _custom_grammars(request)
    every = [target for target in _targets(request, tools) if request.may_call(target.recipient)]
    targets: tuple[Target, ...] = ()
    if forced:
        if choice == "required" or (
            isinstance(choice, ToolChoiceAllowed) and choice.mode == "required"
        ):
            targets = tuple(every)
        elif isinstance(choice, ToolChoiceFunction | ToolChoiceCustom):
            targets = tuple(t for t in every if t.recipient == f"functions.{choice.name}")
        elif isinstance(choice, ToolChoiceMcp):
            prefix = f"{choice.server_label}."
            targets = tuple(
                t
                for t in every
                if t.recipient.startswith(prefix)
                and (choice.name is None or t.recipient == prefix + choice.name)
            )
        elif isinstance(choice, ToolChoiceHosted):
            call = tool_for_choice(choice.type).harmony.forced
            wanted = call.recipient if call is not None else None
            targets = tuple(t for t in every if t.recipient == wanted)
    return Steering(final_schema=final_schema, targets=targets, grammars=grammars)


def _custom_grammars(request: CreateRequest) -> tuple[tuple[str, Grammar], ...]:
    return tuple(
        (f"functions.{tool.name}", tool.grammar)
        for tool in request.custom_tools
        if tool.grammar is not None
    )


def _targets(request: CreateRequest, tools: PromptTools) -> list[Target]:
    targets = [
        Target(f"functions.{tool.name}", "commentary", "json", tool.parameters or ANY_OBJECT)
        for tool in request.function_tools
    ]
    targets.extend(
        Target(f"functions.{tool.name}", "commentary", "", grammar=tool.grammar)
        for tool in request.custom_tools
    )
    if request.tool_search is not None:
        search = request.tool_search.search_parameters
        targets.append(Target(f"functions.{TOOL_SEARCH}", "commentary", "json", search))
    targets.extend(
        Target(f"{group.name}.{tool.name}", "commentary", "json", tool.parameters or ANY_OBJECT)
        for group in request.namespace_tools
        for tool in group.tools
    )
    for name, builtin in NAMESPACES.items():
        target = _forced_target(builtin) if name in tools.builtin else None
        if target is not None:
            targets.append(target)
    for namespace in tools.namespaces:
        for tool in namespace.tools:
            schema = tool.parameters if isinstance(tool.parameters, Mapping) else None
            targets.append(
                Target(f"{namespace.name}.{tool.name}", "commentary", "json", schema or ANY_OBJECT)
            )
    return targets


def _forced_target(tool: BuiltinTool) -> Target | None:
    """The call of ``tool`` that ``tool_choice`` forces (None: it has none)."""
    forced, harmony = tool.harmony.forced, tool.harmony
    if forced is None:
        return None
    return Target(forced.recipient, harmony.channel, harmony.content_type, forced.schema)


# -- tokens ------------------------------------------------------------------------------------


def _text(text: str) -> list[int]:
    return get_encoding().encode(text, disallowed_special=())


def _start(first: bool) -> list[int]:
    """``<|start|>assistant`` unless the header opens the turn (the prompt ends with it)."""
    return [] if first else [special_tokens().start, *_text("assistant")]


def final_header(*, first: bool) -> list[int]:
    special = special_tokens()
    return [*_start(first), special.channel, *_text("final"), special.message]


def call_header(target: Target, *, first: bool) -> list[int]:
    special = special_tokens()
    return [*_start(first), special.channel, *_text(target.choice), *header_rest(target)]


def choice_prefix(*, first: bool) -> list[int]:
    """The prefill before a choice of ``Target.choice`` texts."""
    return [*_start(first), special_tokens().channel]


def header_rest(target: Target) -> list[int]:
    """What follows ``Target.choice`` in its header, through ``<|message|>``."""
    special = special_tokens()
    if target.content_type == "json":
        return [*_text(" "), special.constrain, *_text("json"), special.message]
    if not target.content_type:
        return [special.message]
    return [*_text(f" {target.content_type}"), special.message]


def chosen(targets: Sequence[Target], tokens: Sequence[int]) -> Target:
    """The target whose choice text ``tokens`` spell (the first if they spell none)."""
    text = get_encoding().decode([t for t in tokens if t not in special_tokens().structural])
    text = text.strip()
    for target in targets:
        if target.choice == text:
            return target
    for target in targets:
        if text and target.choice.startswith(text):
            return target
    return targets[0]


_RECIPIENT = re.compile(r"to=(\S+?)(?=\s|<\||$)")


def parse_header(tokens: Sequence[int]) -> Header:
    """Channel and recipient of a complete header (``...<|message|>``)."""
    text = get_encoding().decode(list(tokens))
    recipient_match = _RECIPIENT.search(text)
    recipient = recipient_match.group(1) if recipient_match else None
    channel: str | None = None
    if "<|channel|>" in text:
        after = text.split("<|channel|>", 1)[1]
        channel = re.split(r"\s|<\|", after, maxsplit=1)[0] or None
    if recipient == "assistant":
        recipient = None
    return Header(channel, recipient)


class HeaderGate:
    """Between the engine and the translator: holds each header until it is decided.

    ``in_header``: the output starts with a header (the prompt ends with
    ``<|start|>assistant``) rather than inside a message body.
    """

    def __init__(
        self,
        steering: Steering,
        forward: Callable[[Sequence[int]], None],
        *,
        in_header: bool,
    ) -> None:
        self.steering = steering
        self._forward = forward
        self._in_header = in_header
        self._held: list[int] = []
        special = special_tokens()
        self._start = special.start
        self._message = special.message
        self._closing = frozenset((special.end, special.call, special.return_))

    def flush(self) -> None:
        """Forward a header still held when the engine stopped (it never completed)."""
        held, self._held = self._held, []
        if held:
            self._forward(held)

    def feed(self, tokens: Iterable[int]) -> None:
        """Forward ``tokens``, holding headers back until decided.

        Raises:
            Interrupt: a header was decided and the engine must stop here.
        """
        body: list[int] = []
        for token in tokens:
            if not self._in_header:
                if token == self._start:
                    if body:
                        self._forward(body)
                        body = []
                    self._in_header = True
                    self._held = [token]
                else:
                    body.append(token)
                continue
            self._held.append(token)
            if token in self._closing:  # not a header after all: the translator judges
                held, self._held = self._held, []
                self._in_header = False
                self._forward(held)
                continue
            if token != self._message:
                continue
            held, self._held = self._held, []
            self._in_header = False
            decision = self.steering.decide(parse_header(held))
            if isinstance(decision, Replace):
                raise Interrupt(decision)
            self._forward(held)
            if isinstance(decision, Constrain):
                raise Interrupt(decision)
        if body:
            self._forward(body)
