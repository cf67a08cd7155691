"""Builds one Response and the stream of events that describes it (sans-IO).

`ResponseBuilder` is the only place that numbers events and the only place that
knows the exact JSON shapes of the OpenAI Responses API (they validate against
the ``openai.types.responses`` models; the tests check every one). Callers
drive it with semantic steps (`open_message`, `delta`, `close_item`…) and
receive each event as an encoded SSE frame through the ``emit`` callback,
already carrying its ``sequence_number``: events are encoded exactly once.

The per-token step (`delta`) escapes one string and joins three byte strings:
its cost does not depend on how long the response already is.

A built-in tool's call item is streamed as its descriptor's `ToolItem` says
(`tools.builtin`): the builder knows the shape of each step, not the tools.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..tools.builtin import ToolItem, tool_for_param
from .codec import (
    DeltaPrefix,
    delta_frame,
    delta_prefix,
    encode_event,
    encode_json,
    encode_response_event,
)
from .errors import ErrorInfo
from .ids import new_id
from .lifecycle import TERMINAL, TERMINAL_EVENT, Status, check_transition
from .request import CreateRequest, FunctionTool

Event = dict[str, Any]
Emit = Callable[[bytes], None]
"""Receives each event as one encoded SSE frame."""

_DELTA_TYPES = {
    "message": "response.output_text.delta",
    "reasoning": "response.reasoning_text.delta",
    "function_call": "response.function_call_arguments.delta",
    "custom_tool_call": "response.custom_tool_call_input.delta",
}
"""The delta events of items that are no tool call (a tool's: `ToolItem.input_delta`)."""

ItemKind = str
"""``reasoning``, ``message``, ``function_call``, or a built-in tool's item type."""
ItemStatus = Literal["completed", "incomplete", "failed"]


@dataclass
class Usage:
    """Token counts of a response, summed over all its generation turns."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass(slots=True)
class _OpenItem:
    kind: ItemKind
    index: int
    item: dict[str, Any]
    prefix: DeltaPrefix | None
    parts: list[str] = field(default_factory=list)
    input_done: bool = False
    tool: ToolItem | None = None
    """A built-in tool's call: the item stays open while the tool runs."""
    recipient: str = ""
    """The tool call's recipient (``browser.search``)."""


def request_echo(request: CreateRequest) -> dict[str, Any]:
    """The request fields a Response object repeats back."""
    return {
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "metadata": request.metadata or {},
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "conversation": (
            None if request.conversation_id is None else {"id": request.conversation_id}
        ),
        "presence_penalty": request.presence_penalty or 0.0,
        "frequency_penalty": request.frequency_penalty or 0.0,
        "reasoning": {
            "effort": request.reasoning_effort,
            "summary": request.reasoning.summary if request.reasoning else None,
        },
        "service_tier": "default",
        "store": request.store,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "text": _text_echo(request),
        "tool_choice": (
            request.tool_choice
            if isinstance(request.tool_choice, str)
            else request.tool_choice.model_dump(exclude_none=True)
        ),
        "tools": [_tool_echo(tool) for tool in request.tools],
        "top_logprobs": 0,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "truncation": request.truncation,
        "user": request.user,
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
    }


def _text_echo(request: CreateRequest) -> dict[str, Any]:
    text: dict[str, Any] = {"format": {"type": "text"}, "verbosity": "medium"}
    if request.text is not None:
        if request.text.format is not None:
            text["format"] = request.text.format.model_dump(exclude_none=True, by_alias=True)
        if request.text.verbosity is not None:
            text["verbosity"] = request.text.verbosity
    return text


def _tool_echo(tool: Any) -> dict[str, Any]:
    builtin = tool_for_param(tool)
    if builtin is not None and builtin.echo_exclude:
        # Credentials are used for the call and never stored or echoed.
        echoed: dict[str, Any] = tool.model_dump(
            exclude_none=True, exclude=set(builtin.echo_exclude)
        )
        return echoed
    if isinstance(tool, FunctionTool):
        echo = {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": tool.strict,
        }
        if tool.defer_loading is not None:
            echo["defer_loading"] = tool.defer_loading
        return echo
    dumped: dict[str, Any] = tool.model_dump(exclude_none=True)
    return dumped


class ResponseBuilder:
    """Holds one response's state and emits its events in order.

    Not thread-safe; one producer task drives it. Raises `IllegalTransition`
    (a bug, never user input) on an impossible status change.
    """

    __slots__ = (
        "_citable",
        "_echo",
        "_emit",
        "_listing",
        "_open",
        "_sequence",
        "_started",
        "background",
        "completed_at",
        "created_at",
        "error",
        "id",
        "incomplete_reason",
        "item_fields",
        "model",
        "output",
        "seal_reasoning",
        "status",
        "usage",
    )

    def __init__(
        self,
        *,
        response_id: str,
        model: str,
        created_at: int,
        echo: dict[str, Any],
        background: bool,
        emit: Emit,
    ) -> None:
        self.id = response_id
        self.model = model
        self.created_at = created_at
        self.background = background
        self.status: Status = "queued" if background else "in_progress"
        self.output: list[dict[str, Any]] = []
        self.usage = Usage()
        self.error: dict[str, Any] | None = None
        self.incomplete_reason: str | None = None
        self.completed_at: int | None = None
        self._echo = echo
        self._emit = emit
        self._sequence = 0
        self._started: tuple[dict[str, Any], str] | None = None
        """The snapshot ``response.created`` carried, and its JSON (`mark_in_progress`)."""
        self._open: _OpenItem | None = None
        self._listing: tuple[int, dict[str, Any]] | None = None
        self.item_fields: dict[str, dict[str, Any]] = {}
        """Fields set on every item of a tool's type as it opens (the code
        interpreter's ``container_id``), by item type."""
        self._citable: list[tuple[dict[str, Any], tuple[str, ...]]] = []
        self.seal_reasoning: Callable[[str], str] | None = None
        """Seals a finished reasoning item's text as its ``encrypted_content``
        (``include: ["reasoning.encrypted_content"]``); None: reasoning is not sealed."""

    # -- snapshots -----------------------------------------------------------

    @property
    def next_sequence_number(self) -> int:
        return self._sequence

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def finished_items(self) -> list[dict[str, Any]]:
        """Output items whose ``output_item.done`` has been emitted."""
        unfinished = self._open is not None or self._listing is not None
        return self.output[:-1] if unfinished else self.output

    def snapshot(self) -> dict[str, Any]:
        """The Response object as it stands (finished items plus the open one)."""
        terminal = self.status in TERMINAL
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": self.background,
            "completed_at": self.completed_at,
            "error": self.error,
            "incomplete_details": (
                {"reason": self.incomplete_reason} if self.incomplete_reason else None
            ),
            "model": self.model,
            "output": [dict(item) for item in self.finished_items()],
            "usage": self.usage.to_json() if terminal else None,
            **self._echo,
        }

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Emit ``response.created`` (and ``response.queued`` for background)."""
        snapshot = self.snapshot()
        response = encode_json(snapshot)
        self._response_event("response.created", response)
        if self.background:
            self._response_event("response.queued", response)
        self._started = (snapshot, response)

    def mark_in_progress(self) -> None:
        """Emit ``response.in_progress``; moves a queued response on.

        A response that was not queued usually carries what ``response.created``
        did: then it is not encoded again.
        """
        if self.status == "queued":
            self._transition("in_progress")
        snapshot = self.snapshot()
        started, self._started = self._started, None
        if started is not None and started[0] == snapshot:
            self._response_event("response.in_progress", started[1])
        else:
            self._event({"type": "response.in_progress", "response": snapshot})

    def finish(
        self,
        status: Status,
        *,
        now: int,
        error: ErrorInfo | None = None,
        incomplete_reason: str | None = None,
    ) -> None:
        """Close any open item and emit the terminal event for ``status``; ``error``
        (a ``failed`` one's) becomes the Response's ``error`` field.

        ``now`` is Unix time in whole seconds, like ``created_at``: the API's
        timestamps are integers.
        """
        if self._open is not None:
            self.close_item("incomplete")
        if self._listing is not None:
            self.finish_mcp_list_tools(
                None, error="The response ended before the tools were listed."
            )
        self._transition(status)
        self.error = None if error is None else error.response_error()
        self.incomplete_reason = incomplete_reason
        if status == "completed":
            self.completed_at = now
        self._event({"type": TERMINAL_EVENT[status], "response": self.snapshot()})

    def _transition(self, status: Status) -> None:
        check_transition(self.status, status)
        self.status = status

    # -- items -------------------------------------------------------------------

    @property
    def open_kind(self) -> ItemKind | None:
        return self._open.kind if self._open is not None else None

    @property
    def open_item_id(self) -> str:
        if self._open is None:
            raise RuntimeError("no item is open")
        return str(self._open.item["id"])

    @property
    def open_text(self) -> str:
        """The text streamed into the open item so far."""
        return "".join(self._open.parts) if self._open is not None else ""

    def open_reasoning(self) -> None:
        item = {
            "id": new_id("rs"),
            "type": "reasoning",
            "summary": [],
            "content": [],
            "status": "in_progress",
        }
        self._add("reasoning", item, part={"type": "reasoning_text", "text": ""})

    def open_message(self, *, phase: Literal["commentary", "final_answer"] | None = None) -> None:
        item: dict[str, Any] = {
            "id": new_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        if phase is not None:
            item["phase"] = phase
        self._add(
            "message",
            item,
            part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
        )

    def open_function_call(self, name: str, *, namespace: str | None = None) -> None:
        """Open a ``function_call`` item; a namespace tool's call names its ``namespace``."""
        item: dict[str, Any] = {
            "id": new_id("fc"),
            "type": "function_call",
            "call_id": new_id("call"),
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        if namespace is not None:
            item["namespace"] = namespace
        self._add("function_call", item, part=None)

    def open_custom_tool_call(self, name: str) -> None:
        """Open a ``custom_tool_call`` item: its ``input`` streams as
        ``response.custom_tool_call_input.delta`` events."""
        item = {
            "id": new_id("ctc"),
            "type": "custom_tool_call",
            "call_id": new_id("call"),
            "name": name,
            "input": "",
            "status": "in_progress",
        }
        self._add("custom_tool_call", item, part=None)

    def open_tool_search_call(self) -> None:
        """Open a ``tool_search_call`` item run by the client: its ``arguments`` (a JSON
        object) are set when it closes; no delta events stream them."""
        item: dict[str, Any] = {
            "id": new_id("tsc"),
            "type": "tool_search_call",
            "call_id": new_id("call"),
            "execution": "client",
            "arguments": {},
            "status": "in_progress",
        }
        self._add("tool_search_call", item, part=None)

    def delta(self, text: str) -> None:
        """Append streamed text to the open item (its kind picks the event)."""
        open_item = self._open
        if open_item is None:
            raise RuntimeError("delta() without an open item")
        open_item.parts.append(text)
        if open_item.prefix is not None:
            self._emit(delta_frame(open_item.prefix, text, self._sequence))
            self._sequence += 1

    def close_item(self, status: ItemStatus = "completed") -> dict[str, Any]:
        """Emit the ``*.done`` events of the open item and return the finished item."""
        open_item = self._open
        if open_item is None:
            raise RuntimeError("close_item() without an open item")
        self._open = None
        text = "".join(open_item.parts)
        item = open_item.item
        ref = {"item_id": item["id"], "output_index": open_item.index}
        if open_item.kind == "message":
            annotations = self._annotations(text)
            for index, annotation in enumerate(annotations):
                self._event(
                    {
                        "type": "response.output_text.annotation.added",
                        **ref,
                        "content_index": 0,
                        "annotation_index": index,
                        "annotation": annotation,
                    }
                )
            part = {
                "type": "output_text",
                "text": text,
                "annotations": annotations,
                "logprobs": [],
            }
            self._event(
                {
                    "type": "response.output_text.done",
                    **ref,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }
            )
            self._event(
                {"type": "response.content_part.done", **ref, "content_index": 0, "part": part}
            )
            item["content"] = [part]
        elif open_item.kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            self._event(
                {"type": "response.reasoning_text.done", **ref, "content_index": 0, "text": text}
            )
            self._event(
                {"type": "response.content_part.done", **ref, "content_index": 0, "part": part}
            )
            item["content"] = [part]
            if self.seal_reasoning is not None:
                item["encrypted_content"] = self.seal_reasoning(text)
        elif open_item.kind == "function_call":
            self._event({"type": "response.function_call_arguments.done", **ref, "arguments": text})
            item["arguments"] = text
        elif open_item.kind == "custom_tool_call":
            self._event({"type": "response.custom_tool_call_input.done", **ref, "input": text})
            item["input"] = text
        elif open_item.kind == "tool_search_call":
            item["arguments"] = _json_arguments(text)
        elif open_item.tool is not None and not open_item.input_done:
            # A tool call cut short (token budget, cancellation): keep what was written.
            field_name = open_item.tool.input_field
            if field_name is not None:
                item[field_name] = text
        item["status"] = status
        self._event(
            {
                "type": "response.output_item.done",
                "output_index": open_item.index,
                "item": dict(item),
            }
        )
        return item

    # -- tool items: open, input streamed, input done, result -----------------------------

    def open_tool_call(self, tool: ToolItem, recipient: str) -> None:
        """Open the item of a built-in tool's call of ``recipient``; the model's text
        follows as `delta`, then `end_tool_input` and `finish_tool_call`."""
        item = tool.new(recipient)
        item.update(self.item_fields.get(tool.type, {}))
        self._add(tool.type, item, part=None, tool=tool, recipient=recipient)
        self._tool_event(tool.in_progress)

    def end_tool_input(self) -> str:
        """The model finished writing the open tool call's input; returns it.

        Sets the item's input (or its ``action``) and emits the tool's
        ``input_done`` and ``running`` events. The item stays open for
        `finish_tool_call`.
        """
        open_item, tool = self._require_tool_item()
        text = "".join(open_item.parts)
        open_item.input_done = True
        item = open_item.item
        if tool.input_field is not None:
            item[tool.input_field] = text
            if tool.input_done is not None:
                ref = {"item_id": item["id"], "output_index": open_item.index}
                self._event({"type": tool.input_done, **ref, tool.input_field: text})
        elif tool.action is not None:
            item["action"] = tool.action(open_item.recipient, text)
        if tool.running is not None:
            status, event = tool.running
            item["status"] = status
            self._tool_event(event)
        return text

    def finish_tool_call(
        self,
        output: str,
        *,
        ok: bool,
        error: dict[str, Any] | None = None,
        approval_request_id: str | None = None,
        extra_outputs: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """The tool answered (or failed): emit its result events and close the item.

        ``output`` is what the tool said (or the failure, as text); ``error`` is
        the structured ``mcp_call.error`` of a failed MCP call; ``extra_outputs`` go
        after the recorded ones in the item's ``outputs`` (the code interpreter's
        images).
        """
        open_item, tool = self._require_tool_item()
        tool.record_result(
            open_item.item, output, ok=ok, error=error, approval_request_id=approval_request_id
        )
        outputs = open_item.item.get("outputs")
        if extra_outputs and isinstance(outputs, list):
            outputs.extend(extra_outputs)
        event = tool.completed if ok else tool.failed
        if event is not None:
            self._tool_event(event)
        return self.close_item("completed" if ok else "failed")

    def cite(self, annotation: dict[str, Any], *needles: str) -> None:
        """Let later answers cite a file: the first place an answer's text names it
        (the first of ``needles`` found: its path, then its name) gets ``annotation``
        with that place's ``start_index`` and ``end_index``."""
        self._citable.append((annotation, needles))

    def _annotations(self, text: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for annotation, needles in self._citable:
            for needle in needles:
                start = text.find(needle) if needle else -1
                if start >= 0:
                    end = start + len(needle)
                    found.append({**annotation, "start_index": start, "end_index": end})
                    break
        found.sort(key=lambda annotation: annotation["start_index"])
        return found

    def add_mcp_approval_request(self, server_label: str, name: str, arguments: str) -> str:
        """Emit a finished ``mcp_approval_request`` item; returns its id."""
        item = {
            "id": new_id("mcpr"),
            "type": "mcp_approval_request",
            "server_label": server_label,
            "name": name,
            "arguments": arguments,
        }
        self._add_finished(item)
        return str(item["id"])

    def open_mcp_list_tools(self, server_label: str) -> None:
        """Start an ``mcp_list_tools`` item (finish it with `finish_mcp_list_tools`)."""
        if self._open is not None:
            raise RuntimeError("cannot list tools while an item is open")
        item: dict[str, Any] = {
            "id": new_id("mcpl"),
            "type": "mcp_list_tools",
            "server_label": server_label,
            "tools": [],
        }
        index = len(self.output)
        self.output.append(item)
        self._listing = (index, item)
        self._event(
            {"type": "response.output_item.added", "output_index": index, "item": dict(item)}
        )
        self._event(
            {
                "type": "response.mcp_list_tools.in_progress",
                "item_id": item["id"],
                "output_index": index,
            }
        )

    def finish_mcp_list_tools(
        self, tools: list[dict[str, Any]] | None, *, error: str | None = None
    ) -> None:
        if self._listing is None:
            raise RuntimeError("finish_mcp_list_tools() without open_mcp_list_tools()")
        index, item = self._listing
        self._listing = None
        ref = {"item_id": item["id"], "output_index": index}
        if error is None:
            item["tools"] = tools or []
            self._event({"type": "response.mcp_list_tools.completed", **ref})
        else:
            item["error"] = error
            self._event({"type": "response.mcp_list_tools.failed", **ref})
        self._event(
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)}
        )

    def _tool_event(self, event_type: str) -> None:
        open_item, _ = self._require_tool_item()
        self._event(
            {"type": event_type, "item_id": open_item.item["id"], "output_index": open_item.index}
        )

    def _require_tool_item(self) -> tuple[_OpenItem, ToolItem]:
        open_item = self._open
        if open_item is None or open_item.tool is None:
            raise RuntimeError("no tool call is open")
        return open_item, open_item.tool

    def _add_finished(self, item: dict[str, Any]) -> None:
        if self._open is not None:
            raise RuntimeError("cannot add an item while another is open")
        index = len(self.output)
        self.output.append(item)
        self._event(
            {"type": "response.output_item.added", "output_index": index, "item": dict(item)}
        )
        self._event(
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)}
        )

    def _add(
        self,
        kind: ItemKind,
        item: dict[str, Any],
        *,
        part: dict[str, Any] | None,
        tool: ToolItem | None = None,
        recipient: str = "",
    ) -> None:
        if self._open is not None:
            raise RuntimeError(f"cannot open a {kind} item while a {self._open.kind} is open")
        index = len(self.output)
        self.output.append(item)
        fields: dict[str, Any] = {"item_id": item["id"], "output_index": index}
        if kind in ("message", "reasoning"):
            fields["content_index"] = 0
        if kind == "message":
            fields["logprobs"] = []
        delta_type = _DELTA_TYPES.get(kind) if tool is None else tool.input_delta
        prefix = delta_prefix(delta_type, fields) if delta_type is not None else None
        self._open = _OpenItem(kind, index, item, prefix, tool=tool, recipient=recipient)
        self._event(
            {"type": "response.output_item.added", "output_index": index, "item": dict(item)}
        )
        if part is not None:
            self._event(
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": part,
                }
            )

    def _event(self, event: Event) -> None:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        self._emit(encode_event(event))

    def _response_event(self, event_type: str, response: str) -> None:
        """`_event` of a lifecycle event whose Response object is encoded already."""
        self._sequence += 1
        self._emit(encode_response_event(event_type, response, self._sequence - 1))


def terminal_frame(response: dict[str, Any], sequence_number: int) -> bytes:
    """The terminal event of a finished Response object, as frame ``sequence_number``.

    For logs whose producer is gone: recovery ends them with the stored response's
    final state (``failed``, ``server_restarted``).
    """
    status: Status = response["status"]
    if status not in TERMINAL:
        raise ValueError(f"a {status!r} response has no terminal event")
    return encode_event(
        {
            "type": TERMINAL_EVENT[status],
            "response": response,
            "sequence_number": sequence_number,
        }
    )


def stream_error_frame(sequence_number: int, error: ErrorInfo) -> bytes:
    """An ``error`` event that ends one reader's stream (not the response's log)."""
    return encode_event(
        {
            "type": "error",
            "sequence_number": sequence_number,
            "code": error.code,
            "message": error.message,
            "param": error.param,
        }
    )


def _json_arguments(text: str) -> Any:
    """A tool search call's arguments as the JSON value the model wrote, or the text
    itself when it is not JSON (a call cut short)."""
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return text
