"""``POST /v1/responses/compact``: a conversation made short enough to go on with.

The model writes the summary. The service runs an internal response (not
stored, so nobody can look it up) over the conversation followed by
`COMPACTION_PROMPT`, through the job runner like any other: it waits for a
generation slot, counts against the owner's limits, and is cancelled when the
client goes away. What comes back, as OpenAI shapes it::

    {"id", "object": "response.compaction", "created_at",
     "output": [every user message of the conversation..., compaction item],
     "usage": the summarizing response's usage}

The ``compaction`` item holds the summary sealed for the caller (purpose
``compaction``); sent back as input, it is rendered as a developer message
(`_sealed_items.item_opener`). This module holds the pure steps: parsing the
body, the summarizing request, the result.
"""

from __future__ import annotations

from typing import Any

from ._exceptions import InvalidRequestError, ServerError, ShuttingDownError
from ._prepare import PreparedRequest, stored_item
from ._sealed_items import seal_summary
from .protocol import errors
from .protocol.ids import new_id
from .protocol.request import CreateRequest, MessageItem, parse_create_request
from .sealing import Sealer

COMPACTION_PROMPT = (
    "Summarize the conversation so far for your own later use: what the user wants, "
    "what was decided and done, the facts and results worth keeping, and what is still "
    "open. Write only the summary."
)
"""The last message of the summarizing prompt (the scripted engine answers it too)."""

COMPACT_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "service_tier",
        "image",
    }
)
"""The body fields of a compact request (others are create-only, or unknown)."""


def parse_compact_request(body: Any, *, default_model: str) -> CreateRequest:
    """Validate a compact body as strictly as a create body; ``model`` is required
    and may be null (the served model).

    Raises:
        InvalidRequestError: a field compact does not take, nothing to compact,
            or anything `parse_create_request` refuses (naming the field).
    """
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    for key in body:
        if key not in COMPACT_FIELDS:
            shown = key if len(key) <= 64 else key[:64] + "…"
            raise InvalidRequestError(
                f"Unknown parameter: '{shown}'. A compact request takes "
                + ", ".join(sorted(COMPACT_FIELDS))
                + ".",
                param=shown,
                code="unknown_parameter",
            )
    if "model" not in body:
        # The SDK always sends it (null allowed): a body without it is malformed.
        raise InvalidRequestError(
            "Missing required parameter: 'model' (null means the served model).",
            param="model",
            code="missing_required_parameter",
        )
    fields = dict(body)
    if fields["model"] is None:
        fields["model"] = default_model
    request = parse_create_request(fields)
    if not request.input_items and request.previous_response_id is None:
        raise InvalidRequestError(
            "Nothing to compact: send the conversation as 'input', name its last "
            "response with 'previous_response_id', or both.",
            param="input",
            code="missing_required_parameter",
        )
    return request


def summarizing_request(request: CreateRequest) -> CreateRequest:
    """The internal response that writes the summary: the conversation, then the
    instruction to summarize it; never stored, streamed or run in the background."""
    instruction = MessageItem(role="user", content=COMPACTION_PROMPT)
    return request.model_copy(
        update={
            "input": [*request.input_items, instruction],
            "store": False,
            "stream": False,
            "background": False,
            "include": [],
        }
    )


def compacted_response(
    prepared: PreparedRequest,
    response: dict[str, Any],
    *,
    sealer: Sealer,
    owner: str | None,
) -> dict[str, Any]:
    """The compacted conversation, from the finished summarizing ``response``.

    Raises:
        ShuttingDownError: the server shut down before the summary was written.
        ServerError: the model wrote no summary (the response failed or was cut short).
    """
    summary = _summary_text(response)
    conversation = prepared.plan.items[:-1]  # the instruction to summarize is last
    kept = [
        stored_item(item)
        for item in conversation
        if isinstance(item, MessageItem) and item.role == "user"
    ]
    compaction = {
        "id": new_id("cmp"),
        "type": "compaction",
        "encrypted_content": seal_summary(sealer, summary, owner=owner),
    }
    return {
        "id": response["id"],
        "object": "response.compaction",
        "created_at": response["created_at"],
        "output": [*kept, compaction],
        "usage": response["usage"],
    }


def _summary_text(response: dict[str, Any]) -> str:
    error = response.get("error") or {}
    if error.get("code") == errors.SERVER_SHUTDOWN:
        raise ShuttingDownError("The server shut down before the conversation was compacted.")
    texts = [
        str(part.get("text", ""))
        for item in response.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    ]
    summary = "".join(texts).strip()
    if response.get("status") != "completed" or not summary:
        reason = error.get("message") or (response.get("incomplete_details") or {}).get(
            "reason", "the model wrote no summary"
        )
        raise ServerError(f"The conversation could not be compacted: {reason}")
    return summary
