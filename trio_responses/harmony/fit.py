"""The prompt of a request, fitted into the context window (``truncation``) in O(n).

Harmony renders a conversation message by message (system, developer, then
each input item's messages), leaving out the ``analysis`` messages before the
first ``final`` one when the last assistant message is ``final``
(``auto_drop_analysis``), and ends it with ``<|start|>assistant``.

With ``truncation: "auto"`` the oldest items are dropped until the prompt leaves
room for output (`output_reserve`: ``max_output_tokens``, else a quarter of the
context window, at most `DEFAULT_RESERVE_TOKENS`); each step drops one item and
any tool outputs that step left at the front without their call (the "states"
below: the items from ``start`` on). Rendering the whole conversation again after each step is O(n²)
tokenizing (2,000 items: minutes, on the event loop). Here every message is
rendered at most once and the length of each state follows from sums over the
items: suffix sums of their lengths, less the analysis messages harmony leaves
out in that state, plus the answered approval requests that show in it. Items
so old that a lower bound (`token_bound`) rules out every state that keeps them
are never tokenized; the same bound refuses a request that cannot fit before
anything is tokenized.

The outcome is the one rendering each state in turn gives: the same items
dropped, the same prompt tokens, the same errors (tests compare the two).
Everything here is pure and synchronous, so it can run in a worker thread.
"""

from __future__ import annotations

import functools
import heapq
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from openai_harmony import Conversation, DeveloperContent, Message, RenderOptions, Role

from .._exceptions import InvalidRequestError
from ..protocol.request import (
    CreateRequest,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    MessageItem,
)
from .developer import render_developer
from .encoding import get_encoding
from .long_text import render_message
from .prompt import (
    DECLINED,
    PromptTools,
    SystemSettings,
    approval_messages,
    developer_message,
    item_messages,
    orphan_custom_output,
    orphan_output,
    qualified_name,
)
from .token_bound import MESSAGE_OVERHEAD, min_tokens

_NO_TOOLS = PromptTools()

DEFAULT_RESERVE_TOKENS = 16_384
"""The most ``truncation: "auto"`` keeps free for output when the request does not
say (``max_output_tokens``): a quarter of the context window, up to this many."""


def output_reserve(request: CreateRequest, max_model_len: int) -> int:
    """The room for output that ``truncation: "auto"`` makes by dropping old items:
    ``max_output_tokens`` when the request sets it, else a quarter of the context
    window, at most `DEFAULT_RESERVE_TOKENS`. (Without truncation the prompt needs
    only to fit; the output gets what is left.)"""
    if request.max_output_tokens is not None:
        return request.max_output_tokens
    return min(max_model_len // 4, DEFAULT_RESERVE_TOKENS)


def render_request_prompt(
    request: CreateRequest,
    items: Sequence[InputItem],
    *,
    date: str,
    max_model_len: int,
    tools: PromptTools = _NO_TOOLS,
    approval_results: Mapping[str, str] | None = None,
) -> list[int]:
    """The prompt tokens for a request, leaving room for output.

    With ``truncation: "auto"`` the oldest items are dropped until the prompt leaves
    `output_reserve` tokens free; if even the newest item alone does not, it is
    kept as long as it fits at all (the output gets what room is left).

    Raises:
        InvalidRequestError: the prompt does not fit (``context_length_exceeded``),
            the history is inconsistent, or a text cannot be tokenized.
    """
    fitter = _Fitter(
        request, items, date=date, tools=tools, approval_results=approval_results or {}
    )
    truncate = request.truncation == "auto"
    reserve = output_reserve(request, max_model_len) if truncate else 0
    return fitter.fit(max_model_len, truncate=truncate, reserve=reserve)


@functools.cache
def _assistant_start() -> tuple[int, ...]:
    """``<|start|>assistant``: what harmony appends for a completion."""
    empty = Conversation.from_messages([])
    return tuple(get_encoding().render_conversation_for_completion(empty, Role.ASSISTANT))


@dataclass(frozen=True)
class _Approval:
    """An ``mcp_approval_response`` that shows its call in states ``low..high``."""

    request: McpApprovalRequestItem
    result: str
    low: int
    high: int


class _Fitter:
    """One conversation's states, checked oldest first until one fits or none can."""

    def __init__(
        self,
        request: CreateRequest,
        items: Sequence[InputItem],
        *,
        date: str,
        tools: PromptTools,
        approval_results: Mapping[str, str],
    ) -> None:
        self._request = request
        self.items = items
        self._date = date
        self._tools = tools
        self._approvals = _approvals(items, approval_results)
        self._names = _call_names(items)

    def fit(self, max_model_len: int, *, truncate: bool, reserve: int = 0) -> list[int]:
        """The prompt of the first state, oldest first, that leaves ``reserve`` tokens
        of ``max_model_len`` free; the last state (the newest item) needs only to fit.
        Without ``truncate``, only the whole conversation, which needs only to fit."""
        items = self.items
        count = len(items)
        floor = (
            MESSAGE_OVERHEAD
            + min_tokens(self._request.instructions or "")
            + len(_assistant_start())
        )
        suffix_floor = [0] * (count + 1)
        for index in range(count - 1, -1, -1):
            suffix_floor[index] = suffix_floor[index + 1] + _min_item_tokens(items[index])
        orphans = _Orphans(items)
        lengths: _Lengths | None = None
        start = 0
        while True:
            orphans.check(start)
            last = not truncate or count - start <= 1
            # The prompt must be shorter than this: the last state needs only to fit.
            bound = max_model_len if last else max_model_len - reserve + 1
            if lengths is None and floor + suffix_floor[start] < bound:
                lengths = _Lengths(self, start)  # what remains might fit: tokenize it
            if lengths is None:
                length, exact = floor + suffix_floor[start], False
            else:
                length, exact = lengths.length(start), True
                if length < bound:
                    return lengths.prompt(start)
            if last:
                raise _too_long(length, exact, max_model_len)
            start = self._next_state(start)

    def _next_state(self, start: int) -> int:
        """Where the next state starts: the oldest item dropped, and any tool outputs
        that leaves at the front without their call; never the newest item."""
        items = self.items
        start += 1
        while start < len(items) and isinstance(
            items[start], FunctionCallOutputItem | McpApprovalResponseItem
        ):
            start += 1
        return min(start, len(items) - 1)

    def render_head(self) -> tuple[list[int], RenderOptions]:
        """The system and developer messages' tokens, and the options for the rest."""
        developer = developer_message(self._request, self._tools)
        functions = developer is not None and _declares_functions([developer])
        options = RenderOptions(conversation_has_function_tools=functions)
        system = SystemSettings.of(self._request, date=self._date, tools=self._tools)
        tokens = list(_system_tokens(system, functions))
        if developer is not None:
            tokens.extend(_render_head(developer, options))
        return tokens, options

    def item_tokens(self, index: int, options: RenderOptions) -> list[tuple[list[int], bool]]:
        """Each message of the item at ``index``: its tokens, and whether it is analysis."""
        item = self.items[index]
        if isinstance(item, McpApprovalResponseItem):
            approval = self._approvals.get(index)
            messages = (
                [] if approval is None else approval_messages(approval.request, approval.result)
            )
        else:
            messages = item_messages(item, function_name=self._names.get(index))
        return [
            (_render(message, options, "input"), message.channel == "analysis")
            for message in messages
        ]

    def approval(self, index: int) -> _Approval | None:
        return self._approvals.get(index)


class _Lengths:
    """Exact prompt lengths of the states from ``first`` on (renders those items once)."""

    def __init__(self, fitter: _Fitter, first: int) -> None:
        items = fitter.items
        count = len(items)
        self._first = first
        self._head, options = fitter.render_head()
        self._fixed = len(self._head) + len(_assistant_start())
        self._fitter = fitter
        self._messages = {
            index: fitter.item_tokens(index, options) for index in range(first, count)
        }
        # Static items' tokens and analysis tokens, as suffix sums.
        self._total = [0] * (count + 1)
        self._analysis = [0] * (count + 1)
        self._next_final = [count] * (count + 1)
        for index in range(count - 1, first - 1, -1):
            static = not isinstance(items[index], McpApprovalResponseItem)
            messages = self._messages[index] if static else []
            self._total[index] = self._total[index + 1] + sum(len(t) for t, _ in messages)
            self._analysis[index] = self._analysis[index + 1] + sum(
                len(t) for t, analysis in messages if analysis
            )
            final = _is_final(items[index])
            self._next_final[index] = index if final else self._next_final[index + 1]
        # The last item with an assistant message of its own, whatever the state.
        self._last_assistant = next(
            (index for index in range(count - 1, -1, -1) if _has_assistant_message(items[index])),
            -1,
        )
        last = self._last_assistant
        self._last_is_final = last >= 0 and _is_final(items[last])
        # Approval answers show in a range of states: their tokens, and how many
        # come after the last assistant item (their call is then the last assistant
        # message), per state, from difference arrays.
        shown = [0] * (count + 2)
        late = [0] * (count + 2)
        for index in range(first, count):
            approval = fitter.approval(index)
            if approval is None or approval.high < max(approval.low, first):
                continue
            low = max(approval.low, first)
            size = sum(len(t) for t, _ in self._messages[index])
            shown[low] += size
            shown[approval.high + 1] -= size
            if index > last:
                late[low] += 1
                late[approval.high + 1] -= 1
        self._shown = _running_sums(shown, first, count)
        self._late = _running_sums(late, first, count)

    def _drops_analysis(self, start: int) -> bool:
        """Whether harmony leaves out the analysis before the first final message."""
        return (
            self._last_assistant >= start
            and self._last_is_final
            and self._late[start - self._first] == 0
        )

    def length(self, start: int) -> int:
        length = self._fixed + self._total[start] + self._shown[start - self._first]
        if self._drops_analysis(start):
            length -= self._analysis[start] - self._analysis[self._next_final[start]]
        return length

    def prompt(self, start: int) -> list[int]:
        drop_before = self._next_final[start] if self._drops_analysis(start) else start
        prompt = list(self._head)
        for index in range(start, len(self._fitter.items)):
            approval = self._fitter.approval(index)
            if approval is not None and not approval.low <= start <= approval.high:
                continue
            for tokens, analysis in self._messages[index]:
                if not (analysis and index < drop_before):
                    prompt.extend(tokens)
        prompt.extend(_assistant_start())
        return prompt


class _Orphans:
    """Finds, state by state, the first ``function_call_output`` left without its call.

    An output's call is the last ``function_call`` with its ``call_id`` before it;
    the output is an orphan in the states that start after that call (or in all,
    without one). States are checked in increasing order.
    """

    def __init__(self, items: Sequence[InputItem]) -> None:
        self.items = items
        calls: dict[str, int] = {}
        self._pending: list[tuple[int, int]] = []  # (index of its call or -1, index)
        for index, item in enumerate(items):
            if isinstance(item, FunctionCallItem):
                calls[item.call_id] = index
            elif isinstance(item, FunctionCallOutputItem):
                self._pending.append((calls.get(item.call_id, -1), index))
        self._pending.sort(reverse=True)
        self._orphans: list[int] = []

    def check(self, start: int) -> None:
        pending = self._pending
        while pending and pending[-1][0] < start:
            heapq.heappush(self._orphans, pending.pop()[1])
        while self._orphans and self._orphans[0] < start:
            heapq.heappop(self._orphans)
        if self._orphans:
            index = self._orphans[0]
            item = self.items[index]
            if isinstance(item, FunctionCallOutputItem):
                raise orphan_output(item, index - start)


def _call_names(items: Sequence[InputItem]) -> dict[int, str]:
    """The function name of each ``function_call_output`` that has a call before it
    (and the tool name of each ``custom_tool_call_output``: `_custom_call_names`)."""
    calls: dict[str, str] = {}
    names: dict[int, str] = {}
    for index, item in enumerate(items):
        if isinstance(item, FunctionCallItem):
            calls[item.call_id] = qualified_name(item)
        elif isinstance(item, FunctionCallOutputItem) and item.call_id in calls:
            names[index] = calls[item.call_id]
    names.update(_custom_call_names(items))
    return names


def _custom_call_names(items: Sequence[InputItem]) -> dict[int, str]:
    """The tool name of each ``custom_tool_call_output``.

    Raises:
        InvalidRequestError: an output with no ``custom_tool_call`` before it.
    """
    calls: dict[str, str] = {}
    names: dict[int, str] = {}
    for index, item in enumerate(items):
        if isinstance(item, CustomToolCallItem):
            calls[item.call_id] = item.name
        elif isinstance(item, CustomToolCallOutputItem):
            if item.call_id not in calls:
                raise orphan_custom_output(item, index)
            names[index] = calls[item.call_id]
    return names


def _approvals(
    items: Sequence[InputItem], approval_results: Mapping[str, str]
) -> dict[int, _Approval]:
    """The approval answers that show their call in some state, by index.

    An answer shows when its request is in the state (the last request with that
    id; states start at most there) and either this response ran the call
    (``approval_results``) or it was declined and no ``mcp_call`` in the state
    ran it.
    """
    requests: dict[str, tuple[int, McpApprovalRequestItem]] = {}
    executed: dict[str, int] = {}
    for index, item in enumerate(items):
        if isinstance(item, McpApprovalRequestItem):
            requests[item.id] = (index, item)
        elif isinstance(item, McpCallItem) and item.approval_request_id:
            executed[item.approval_request_id] = index
    approvals: dict[int, _Approval] = {}
    for index, item in enumerate(items):
        if (
            not isinstance(item, McpApprovalResponseItem)
            or item.approval_request_id not in requests
        ):
            continue
        where, request = requests[item.approval_request_id]
        high = min(index, where)
        result = approval_results.get(request.id)
        if result is not None:
            approvals[index] = _Approval(request, result, 0, high)
        elif not item.approve:
            approvals[index] = _Approval(request, DECLINED, executed.get(request.id, -1) + 1, high)
    return approvals


def _running_sums(differences: list[int], first: int, count: int) -> list[int]:
    """Prefix sums of ``differences[first:count + 1]``: the value at each state."""
    sums = []
    total = 0
    for index in range(first, count + 1):
        total += differences[index]
        sums.append(total)
    return sums


def _is_final(item: InputItem) -> bool:
    """Whether the item is an assistant message (rendered on the ``final`` channel)."""
    return isinstance(item, MessageItem) and item.role == "assistant"


def _has_assistant_message(item: InputItem) -> bool:
    """Whether the item renders an assistant message in every state it is in."""
    if isinstance(item, MessageItem):
        return item.role == "assistant"
    # (A function name changes no role: any will do for a function_call_output.)
    return not isinstance(item, McpApprovalResponseItem) and any(
        message.author.role == Role.ASSISTANT for message in item_messages(item, function_name="")
    )


def _min_item_tokens(item: InputItem) -> int:
    """A lower bound of the item's tokens in any state that keeps it.

    Only what every such state renders counts: not reasoning or code interpreter
    calls (analysis, which harmony may leave out), nor approval answers.
    """
    if isinstance(item, MessageItem | FunctionCallOutputItem):
        return MESSAGE_OVERHEAD + min_tokens(item.text())
    if isinstance(item, FunctionCallItem):
        return MESSAGE_OVERHEAD + min_tokens(item.arguments)
    if isinstance(item, McpCallItem):
        return 2 * MESSAGE_OVERHEAD + min_tokens(item.arguments) + min_tokens(item.result_text())
    return 0


def _declares_functions(messages: Sequence[Message]) -> bool:
    """Harmony's own test: a developer message declares a non-empty ``functions`` namespace."""
    for message in messages:
        for content in message.content:
            if isinstance(content, DeveloperContent) and content.tools:
                functions = content.tools.get("functions")
                if functions is not None and functions.tools:
                    return True
    return False


_HEAD_CACHE_ENTRIES = 64
_HEAD_CACHE_KEY_CHARS = 64 * 1024
_head_cache: OrderedDict[tuple[str, bool], array[int]] = OrderedDict()
_head_cache_lock = threading.Lock()  # prompts may be rendered in worker threads


@functools.lru_cache(maxsize=_HEAD_CACHE_ENTRIES)
def _system_tokens(system: SystemSettings, functions: bool) -> tuple[int, ...]:
    """The system message's tokens, remembered by what it says (`SystemSettings`) and
    whether the conversation declares functions (harmony's system message then names
    their channel): building and keying the message costs more than looking this up."""
    options = RenderOptions(conversation_has_function_tools=functions)
    return tuple(_render(system.message(), options, "instructions"))


def _render_head(message: Message, options: RenderOptions) -> list[int]:
    """`_render` of a developer message, remembered: requests of one deployment
    repeat them (same tools, instructions, output format), and rendering
    one costs far more than its JSON, the cache key (most recent 64, keys up to 64k
    characters, tokens kept 4 bytes each: a few MB at most)."""
    key_text = message.to_json()
    if len(key_text) > _HEAD_CACHE_KEY_CHARS:
        return _render(message, options, "instructions")
    key = (key_text, options.conversation_has_function_tools)
    with _head_cache_lock:
        cached = _head_cache.get(key)
        if cached is not None:
            _head_cache.move_to_end(key)
            return cached.tolist()
    tokens = _render(message, options, "instructions")
    with _head_cache_lock:
        _head_cache[key] = array("I", tokens)
        while len(_head_cache) > _HEAD_CACHE_ENTRIES:
            _head_cache.popitem(last=False)
    return tokens


def _render(message: Message, options: RenderOptions, param: str) -> list[int]:
    try:
        content = message.content[0] if len(message.content) == 1 else None
        if isinstance(content, DeveloperContent):
            return render_developer(content, options)
        return render_message(message, options)
    except BaseException as error:
        # The tokenizer panics (a BaseException) on some inputs, such as a run of
        # a million spaces; that is bad input, not a server fault.
        if type(error).__name__ != "PanicException":
            raise
        raise InvalidRequestError(
            "The input could not be tokenized; it probably holds an extremely long run "
            "of repeated characters. Shorten that part of the input.",
            param=param,
            code="invalid_value",
        ) from None


def _too_long(length: int, exact: bool, max_model_len: int) -> InvalidRequestError:
    size = f"{length} tokens" if exact else f"at least {length} tokens"
    return InvalidRequestError(
        f"The input is {size}, which leaves no room for output in this model's "
        f"context window of {max_model_len} tokens. Shorten the input, or set "
        "'truncation' to 'auto' to drop the oldest items.",
        param="input",
        code="context_length_exceeded",
    )
