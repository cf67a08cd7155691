"""The scripted model's rules: a conversation's tokens -> the answer's tokens.

Pure and deterministic (same prompt, same tokens). The scripted engine plays
the result back token by token; a test can force a real model to emit the same
tokens. The rules (SPEC §6), applied to the last message of the prompt:

1. a tool output -> analysis ``Reading the tool result.``, then the final
   answer ``Tool result: <output>``;
2. user text T -> analysis ``Thinking about: <T[:80]>``, then the first
   directive found in T:

   * ``call:NAME {json}`` (function NAME declared) -> a ``functions.NAME`` call;
     ``call:NAMESPACE.NAME {json}`` (NAME declared in that namespace: a namespace
     tool's function) -> a ``NAMESPACE.NAME`` call; several ``call:`` and
     ``custom:`` directives -> that many calls, one after another in the text's
     order, each ending with ``<|call|>`` (the server asks for the next one after
     each, see `trio_responses.harmony.parallel`);
   * ``custom:NAME <<<INPUT>>>`` (custom tool NAME declared) -> a ``functions.NAME``
     call with the raw text INPUT (no content type); ``custom:NAME`` alone: the
     input is the unconstrained answer, or, for a tool with a grammar (a
     constrained body), a short sentence of the grammar (`grammar_instance`);
   * a built-in tool's directive (`tools.builtin`: its ``script``), when the tool is
     shown in the system message or, for an MCP server's tool, declared in its
     namespace -> that call: a fenced ```` ```python ```` block a ``python`` call,
     ``search:QUERY`` ``browser.search`` ``{"query": QUERY}``, ``browser:open|find
     {json}`` that browser call, ``mcp:LABEL.TOOL {json}`` a ``LABEL.TOOL`` call;
   * ``tokens:N`` -> a final answer of exactly N tokens;
   * ``fail:N`` -> the engine fails after N tokens;
   * T starts with ``Summarize the conversation so far`` (the compaction
     instruction) -> the final answer ``Summary: `` and the earlier user
     messages' texts joined with `` / `` (cut to 200 characters);
   * none -> the final answer ``You said: <T>``.

   ``delay:MS`` may appear as well: MS milliseconds per token.

3. a prompt that ends inside the assistant's turn (prefilled by the server to
   steer it, see `trio_responses.harmony.steering`) continues the turn: with
   the rest of the rules' answer when it starts the same way, else by writing
   the open message's body. Under a constraint (`plan`'s ``constraint``):

   * a choice -> the first choice that calls a tool T names in a directive
     (``call:NAME``...), else the first choice, then ``<|return|>``;
   * a custom tool's grammar -> the directive's INPUT when the grammar accepts it
     (`protocol.grammar.matches`; or it cannot tell), else `grammar_instance` of
     the grammar, then ``<|call|>``;
   * a JSON schema -> `schema_instance.instance` of it, then ``<|call|>``
     after a tool-call header or ``<|return|>``. Its hint (the value it keeps
     where it fits) is the JSON of T's directive for that tool, or, for the
     final answer, T (or the tool output) when it is JSON; strings default to
     the unconstrained answer (``You said: <T>``, ``Tool result: <output>``).

   Without a constraint, a prefilled final header gets the unconstrained
   answer and a call header its directive's arguments (``{}`` without one;
   for a ``code`` tool its directive's body, else the tool's ``default_body``
   of the answer: ``python`` prints it).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from openai_harmony import Role

from .._exceptions import EngineError
from ..harmony.encoding import get_encoding, special_tokens
from ..harmony.long_text import encode_text
from ..harmony.steering import parse_header
from ..protocol.grammar import Grammar, matches
from ..tools.builtin import BUILTIN_TOOLS, NAMESPACES, BuiltinTool, json_object_at
from .base import ChoiceConstraint, GrammarConstraint, OutputConstraint
from .grammar_instance import NoInstance, grammar_instance
from .schema_instance import MISSING, SchemaInstanceError, SchemaTooLargeError, dumps, instance


@dataclass(frozen=True)
class Script:
    tokens: tuple[int, ...]
    """The whole answer, ending with ``<|return|>`` or ``<|call|>``."""
    fail_after: int | None = None
    """Fail once this many tokens have been delivered."""
    delay_s: float | None = None
    """Per-token delay asked for by ``delay:MS`` (overrides the engine's)."""


@dataclass(frozen=True)
class _Prompt:
    last_role: Role | None
    last_text: str
    builtin: frozenset[str]
    """The built-in tools' namespaces shown in the system message."""
    functions: frozenset[str]
    namespaces: dict[str, frozenset[str]]
    """Tool names declared in each MCP namespace."""

    def allows(self, tool: BuiltinTool, recipient: str) -> bool:
        """Whether the prompt lets the model call ``recipient`` of ``tool``."""
        namespace = tool.harmony.namespace
        if namespace is not None:
            return namespace in self.builtin
        label, _, name = recipient.partition(".")
        return name in self.namespaces.get(label, ())


_CALL = re.compile(r"call:((?:[A-Za-z0-9_-]+\.)?[A-Za-z0-9_-]+)[ \t]*")
_CUSTOM = re.compile(r"custom:([A-Za-z0-9_-]+)(?:[ \t]*<<<(.*?)>>>)?", re.DOTALL)
_TOKENS = re.compile(r"tokens:(\d+)")
_FAIL = re.compile(r"fail:(\d+)")
_DELAY = re.compile(r"delay:(\d+)")
_FUNCTION_DECL = re.compile(r"^type ([A-Za-z0-9_-]+) = ", re.MULTILINE)
_NAMESPACE = re.compile(r"^namespace ([A-Za-z0-9_-]+) \{", re.MULTILINE)


def plan(prompt_tokens: Sequence[int], constraint: OutputConstraint | None = None) -> Script:
    """The scripted answer to a rendered conversation.

    The prompt may end inside the assistant's turn (a prefilled header, tokens
    of an earlier part of the turn): the answer continues from there. With
    ``constraint`` the answer is text that matches it, then a stop token
    (`_constrained`).

    Raises:
        EngineError: no value for the constraint's schema fits the work bounds of
            `schema_instance` (so run a constrained plan with `offload`).
    """
    conversation, continuation = _split_turn(prompt_tokens)
    whole = _plan_turn(conversation)
    if constraint is None and tuple(whole.tokens[: len(continuation)]) == tuple(continuation):
        if not continuation:
            return whole
        fail_after = whole.fail_after
        return Script(
            whole.tokens[len(continuation) :],
            fail_after=None if fail_after is None else max(0, fail_after - len(continuation)),
            delay_s=whole.delay_s,
        )
    return Script(
        _constrained(_read_prompt(conversation), continuation, constraint),
        delay_s=whole.delay_s,
    )


_REMEMBERED_PROMPT_TOKENS = 8192


def _plan_turn(prompt_tokens: Sequence[int]) -> Script:
    """The whole scripted turn for a prompt ending with ``<|start|>assistant``.

    A script depends on its prompt alone: the plans of the last 128 prompts of up to
    8,192 tokens are remembered (reading the prompt again costs a decode of it).
    """
    if len(prompt_tokens) <= _REMEMBERED_PROMPT_TOKENS:
        return _remembered_turn(tuple(prompt_tokens))
    return _plan_whole_turn(prompt_tokens)


@functools.lru_cache(maxsize=128)
def _remembered_turn(prompt_tokens: tuple[int, ...]) -> Script:
    return _plan_whole_turn(prompt_tokens)


def _plan_whole_turn(prompt_tokens: Sequence[int]) -> Script:
    prompt = _read_prompt(prompt_tokens)
    if prompt.last_role == Role.TOOL:
        return Script(
            _analysis("Reading the tool result.") + _final(f"Tool result: {prompt.last_text}")
        )
    text = prompt.last_text
    delay = _DELAY.search(text)
    delay_s = int(delay.group(1)) / 1000 if delay else None
    head = _analysis(f"Thinking about: {text[:80]}")
    if text.startswith("Summarize the conversation so far"):
        return Script(head + _final(_summary(prompt_tokens)), delay_s=delay_s)
    tokens, fail_after = _directive(text, prompt)
    return Script(head + tokens, fail_after=fail_after, delay_s=delay_s)


def _summary(prompt_tokens: Sequence[int]) -> str:
    """``Summary: `` and the user messages before the last one (the instruction)."""
    tokens = list(prompt_tokens)
    start = special_tokens().start
    said = [
        text
        for role, text in (_message_at(tokens, i) for i, t in enumerate(tokens) if t == start)
        if role == "user"
    ][:-1]
    joined = " / ".join(said)
    return "Summary: " + (joined if len(joined) <= 200 else joined[:199] + "…")


def _directive(text: str, prompt: _Prompt) -> tuple[tuple[int, ...], int | None]:
    found: list[tuple[int, tuple[int, ...], int | None]] = []
    client = sorted(
        [*_function_calls(text, prompt), *_custom_calls(text, prompt)], key=lambda c: c[0]
    )
    if client:  # every call the client runs, one after another (parallel calls)
        found.append((client[0][0], tuple(t for _, call in client for t in call), None))
    calls = _builtin_calls(text, prompt)
    if calls:
        position, tool, recipient, body = calls[0]
        harmony = tool.harmony
        found.append(
            (position, _call(harmony.channel, recipient, body, harmony.content_type), None)
        )
    if match := _TOKENS.search(text):
        found.append((match.start(), _final_of_length(int(match.group(1))), None))
    if match := _FAIL.search(text):
        # An answer longer than N, so that the failure always comes after N tokens.
        count = int(match.group(1))
        found.append((match.start(), _final_of_length(count + 1), count))
    if not found:
        return _final(f"You said: {text}"), None
    _, tokens, fail_after = min(found, key=lambda entry: entry[0])
    return tokens, fail_after


def _function_recipient(name: str, prompt: _Prompt) -> str | None:
    """``functions.NAME`` of a declared function, or ``NAMESPACE.NAME`` of a function
    declared in that namespace (a namespace tool's)."""
    namespace, _, function = name.rpartition(".")
    if not namespace:
        return f"functions.{name}" if name in prompt.functions else None
    return name if function in prompt.namespaces.get(namespace, ()) else None


def _function_calls(text: str, prompt: _Prompt) -> list[tuple[int, tuple[int, ...]]]:
    """(position, call) of every ``call:NAME {json}`` of a declared function."""
    found = []
    for match in _CALL.finditer(text):
        arguments = json_object_at(text, match.end())
        name = _function_recipient(match[1], prompt)
        if name is not None and arguments is not None:
            found.append((match.start(), _call("commentary", name, arguments, "json")))
    return found


def _custom_calls(text: str, prompt: _Prompt) -> list[tuple[int, tuple[int, ...]]]:
    """(position, call) of every ``custom:NAME`` directive of a declared tool: its
    input, or the unconstrained answer without one (a grammar's constraint rewrites it)."""
    found = []
    for match in _CUSTOM.finditer(text):
        if match[1] in prompt.functions:
            body = match[2] if match[2] is not None else f"You said: {text}"
            tokens = (
                *_header("commentary", recipient=f"functions.{match[1]}", first=False),
                *_text(body),
                special_tokens().call,
            )
            found.append((match.start(), tokens))
    return found


def _builtin_calls(text: str, prompt: _Prompt) -> list[tuple[int, BuiltinTool, str, str]]:
    """(position, tool, recipient, body) of every built-in tool call the directives in
    ``text`` ask for and the prompt allows, in the order of the text."""
    found = [
        (position, tool, recipient, body)
        for tool in BUILTIN_TOOLS
        for position, recipient, body in tool.script.find(text)
        if prompt.allows(tool, recipient)
    ]
    return sorted(found, key=lambda entry: entry[0])


# -- reading the prompt -----------------------------------------------------------


def _read_prompt(prompt_tokens: Sequence[int]) -> _Prompt:
    """What the rules need from the prompt, found by scanning its special tokens."""
    special = special_tokens()
    tokens = list(prompt_tokens)
    starts = [index for index, token in enumerate(tokens) if token == special.start]
    if len(starts) >= 2 and starts[-1] >= len(tokens) - 2:
        starts.pop()  # the trailing "<|start|>assistant" the answer continues
    messages = [_message_at(tokens, start) for start in starts]
    system = "".join(text for role, text in messages if role == "system")
    developer = "".join(text for role, text in messages if role == "developer")
    last_role, last_text = messages[-1] if messages else (None, "")
    declared = _declared_tools(developer)
    functions = declared.pop("functions", frozenset())
    namespaces = declared
    return _Prompt(
        last_role=Role.TOOL if last_role == "tool" else Role(last_role) if last_role else None,
        last_text=last_text,
        builtin=frozenset(name for name in NAMESPACES if f"\n## {name}\n" in system),
        functions=functions,
        namespaces=namespaces,
    )


def _declared_tools(developer: str) -> dict[str, frozenset[str]]:
    """Tool names per ``namespace NAME { ... } // namespace NAME`` block."""
    declared = {}
    for match in _NAMESPACE.finditer(developer):
        name = match.group(1)
        body = developer[match.end() :].split(f"}} // namespace {name}", 1)[0]
        declared[name] = frozenset(_FUNCTION_DECL.findall(body))
    return declared


_ROLES = frozenset({"system", "developer", "user", "assistant"})


def _message_at(tokens: list[int], start: int) -> tuple[str, str]:
    """(role, text) of the message whose ``<|start|>`` is at ``start``.

    A tool message's author is the tool's name; its role is reported as "tool".
    """
    special = special_tokens()
    encoding = get_encoding()
    try:
        body = tokens.index(special.message, start)
    except ValueError:
        return "tool", ""
    end = body + 1
    closing = (special.end, special.call, special.return_, special.start)
    while end < len(tokens) and tokens[end] not in closing:
        end += 1
    header = encoding.decode(tokens[start + 1 : body])
    author = header.split("<|channel|>", 1)[0].split(" ", 1)[0].strip()
    role = author if author in _ROLES else "tool"
    return role, encoding.decode(tokens[body + 1 : end])


# -- continuing a steered turn -----------------------------------------------------


def _split_turn(prompt_tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """(conversation through the turn's ``<|start|>assistant``, the turn so far).

    The turn is the run of assistant messages at the end of the prompt, up to a
    message of another role or a finished final answer (an earlier turn's).
    """
    tokens = list(prompt_tokens)
    special = special_tokens()
    assistant = _text("assistant")
    starts = [index for index, token in enumerate(tokens) if token == special.start]
    turn_start: int | None = None
    for index in reversed(starts):
        if tokens[index + 1 : index + 1 + len(assistant)] != assistant:
            break
        if index != starts[-1] and _is_final(tokens, index):
            break
        turn_start = index
    if turn_start is None:
        return tokens, []
    cut = turn_start + 1 + len(assistant)
    return tokens[:cut], tokens[cut:]


def _is_final(tokens: list[int], start: int) -> bool:
    special = special_tokens()
    try:
        body = tokens.index(special.message, start)
    except ValueError:
        return False
    return "<|channel|>final" in get_encoding().decode(tokens[start:body])


def _constrained(
    prompt: _Prompt, continuation: Sequence[int], constraint: OutputConstraint | None
) -> tuple[int, ...]:
    """The rest of a steered turn: the open message's body and its stop token."""
    special = special_tokens()
    text = prompt.last_text
    said = f"Tool result: {text}" if prompt.last_role == Role.TOOL else f"You said: {text}"
    if isinstance(constraint, ChoiceConstraint):
        return (*_text(_pick(constraint.choices, text, prompt)), special.return_)
    if isinstance(constraint, GrammarConstraint):
        return _grammar_body(constraint, prompt, continuation)
    if not continuation or continuation[-1] != special.message:
        return _final(said)  # between messages: the answer
    starts = [i for i, token in enumerate(continuation) if token == special.start]
    header = parse_header(continuation[starts[-1] if starts else 0 :])
    recipient = header.recipient
    if constraint is not None:
        hint = (
            _directive_arguments(text, recipient, prompt)
            if recipient is not None
            else _json_hint(text)
        )
        try:
            body = dumps(instance(constraint.schema, hint=hint, text=said))
        except SchemaTooLargeError as error:
            raise EngineError(
                f"The scripted model cannot build a value for this JSON schema: {error}."
            ) from error
        except SchemaInstanceError:
            body = "{}"
    elif recipient is None:
        body = said
    else:
        arguments = _directive_arguments(text, recipient, prompt)
        default_body = _default_body(recipient)
        if isinstance(arguments, str):  # a code tool's directive
            body = arguments
        elif arguments is MISSING and default_body is not None:
            body = default_body(said)
        else:
            body = "{}" if arguments is MISSING else json.dumps(arguments)
    return (*_text(body), special.call if recipient is not None else special.return_)


def _grammar_body(
    constraint: GrammarConstraint, prompt: _Prompt, continuation: Sequence[int]
) -> tuple[int, ...]:
    """A custom tool call's body in its grammar: the directive's input when the grammar
    takes it, else a sentence of the grammar; then ``<|call|>``."""
    special = special_tokens()
    starts = [i for i, token in enumerate(continuation) if token == special.start]
    header = parse_header(continuation[starts[-1] if starts else 0 :])
    grammar = Grammar(constraint.syntax, constraint.definition)
    # Calls of the same tool earlier in the turn took the directives before this one.
    earlier = sum(
        1
        for start in starts[:-1]
        if special.message in continuation[start:]
        and parse_header(
            continuation[start : continuation.index(special.message, start) + 1]
        ).recipient
        == header.recipient
    )
    given = (
        _directive_arguments(prompt.last_text, header.recipient, prompt, nth=earlier)
        if header.recipient is not None
        else MISSING
    )
    if isinstance(given, str) and matches(grammar, given) is not False:
        body = given
    else:
        try:
            body = grammar_instance(grammar)
        except NoInstance as error:
            raise EngineError(
                f"The scripted model cannot write a sentence of this grammar: {error}."
            ) from error
    return (*_text(body), special.call if header.recipient is not None else special.return_)


def _directives(text: str, prompt: _Prompt) -> list[tuple[int, str, object]]:
    """(position, recipient, arguments) of every tool directive in ``text``: a code
    tool's arguments are its body, a JSON tool's the decoded object."""
    found: list[tuple[int, str, object]] = []
    for match in _CALL.finditer(text):
        raw = json_object_at(text, match.end())
        if raw is not None:
            recipient = match[1] if "." in match[1] else f"functions.{match[1]}"
            found.append((match.start(), recipient, json.loads(raw)))
    for match in _CUSTOM.finditer(text):
        if match[2] is not None:
            found.append((match.start(), f"functions.{match[1]}", match[2]))
    for position, tool, recipient, body in _builtin_calls(text, prompt):
        code = tool.harmony.content_type == "code"
        found.append((position, recipient, body if code else json.loads(body)))
    return sorted(found, key=lambda entry: entry[0])


def _default_body(recipient: str) -> Callable[[str], str] | None:
    """The ``default_body`` of the built-in tool whose namespace ``recipient`` is in."""
    tool = NAMESPACES.get(recipient.partition(".")[0])
    return tool.script.default_body if tool is not None else None


def _directive_arguments(text: str, recipient: str, prompt: _Prompt, *, nth: int = 0) -> object:
    """The arguments ``text``'s ``nth`` directive for ``recipient`` gives its call
    (`MISSING`: none)."""
    given = [arguments for _, name, arguments in _directives(text, prompt) if name == recipient]
    return given[nth] if nth < len(given) else MISSING


def _pick(choices: Sequence[str], text: str, prompt: _Prompt) -> str:
    for _, name, _arguments in _directives(text, prompt):
        for choice in choices:
            if choice.endswith(f"to={name}"):
                return choice
    return choices[0]


def _json_hint(text: str) -> object:
    """``text`` as JSON, or `MISSING`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return MISSING


# -- writing the answer ---------------------------------------------------------------


def _text(text: str) -> list[int]:
    # User text that looks like "<|end|>" stays plain text; a long text is encoded
    # in bounded calls (one call on a million letters panics the tokenizer).
    return encode_text(text)


def _header(
    channel: str, *, recipient: str | None = None, content_type: str | None = None, first: bool
) -> list[int]:
    special = special_tokens()
    tokens = [] if first else [special.start, *_text("assistant")]
    tokens.append(special.channel)
    tokens.extend(_text(channel + (f" to={recipient}" if recipient else "")))
    if content_type == "json":
        tokens.extend(_text(" "))
        tokens.append(special.constrain)
        tokens.extend(_text("json"))
    elif content_type is not None:
        tokens.extend(_text(f" {content_type}"))
    tokens.append(special.message)
    return tokens


def _analysis(text: str) -> tuple[int, ...]:
    return (*_header("analysis", first=True), *_text(text), special_tokens().end)


def _final(text: str) -> tuple[int, ...]:
    return (*_header("final", first=False), *_text(text), special_tokens().return_)


def _call(channel: str, recipient: str, body: str, content_type: str) -> tuple[int, ...]:
    return (
        *_header(channel, recipient=recipient, content_type=content_type, first=False),
        *_text(body),
        special_tokens().call,
    )


_FILLER_WORDS = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog")


@functools.cache
def _filler_tokens() -> tuple[int, ...]:
    tokens = [_text(word) for word in _FILLER_WORDS]
    return tuple(token[0] for token in tokens if len(token) == 1)


def _final_of_length(count: int) -> tuple[int, ...]:
    filler = _filler_tokens()
    body = [filler[i % len(filler)] for i in range(count)]
    return (*_header("final", first=False), *body, special_tokens().return_)
