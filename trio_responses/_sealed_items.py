"""Sealed item content: reasoning text and compaction summaries carried by clients.

With ``include: ["reasoning.encrypted_content"]`` every reasoning item a
response produces carries its text sealed for its owner (`reasoning_sealer`).
A client that keeps no state on the server (``store: false``) sends such items
back as input, often with ``content`` and ``summary`` stripped; `item_opener`
opens them again for the prompt, and turns a ``compaction`` item (from
``POST /v1/responses/compact``) into the summary the model reads.

Blobs are opened where the owner is known (the service), before the prompt is
rendered; one that does not open is a 400 naming the item.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._exceptions import InvalidRequestError
from ._prepare import Unseal
from .protocol.request import (
    CompactionItem,
    InputItem,
    MessageItem,
    ReasoningItem,
    ReasoningText,
)
from .sealing import Purpose, Sealer

INCLUDE_REASONING = "reasoning.encrypted_content"
"""The ``include`` value that asks for sealed reasoning."""

SUMMARY_PREFIX = "Summary of the earlier conversation: "
"""How a compaction item's summary starts, as the model reads it (a developer message)."""


def reasoning_sealer(sealer: Sealer, owner: str | None) -> Callable[[str], str]:
    """Seals a reasoning text for ``owner``: the ``encrypted_content`` of its item."""

    def seal(text: str) -> str:
        return sealer.seal("reasoning", {"text": text}, owner=owner)

    return seal


def seal_summary(sealer: Sealer, summary: str, *, owner: str | None) -> str:
    """A compaction summary sealed for ``owner``: a ``compaction`` item's content."""
    return sealer.seal("compaction", {"summary": summary}, owner=owner)


def item_opener(
    sealer: Sealer, owner: str | None, *, context_param: str = "previous_response_id"
) -> Unseal:
    """Opens the sealed items of ``owner``'s conversation for the prompt.

    A reasoning item of the request's input with ``encrypted_content`` gets its
    sealed text as ``content`` (whatever it came with); one of the previous
    conversation is opened only if it has no text of its own. A compaction item
    becomes a developer message holding its summary. Other items pass through.
    The opener raises `InvalidRequestError` (``invalid_encrypted_content``) for
    a blob that does not open: its ``param`` names the item's
    ``encrypted_content``, or ``context_param`` for an earlier item (the
    ``previous_response_id`` or ``conversation`` it came from).
    """

    def unseal(item: InputItem, where: str | None) -> InputItem:
        # The param a blob that does not open is named by: the item, or where it came from.
        param = context_param if where is None else f"{where}.encrypted_content"
        if isinstance(item, ReasoningItem) and item.encrypted_content is not None:
            if where is None and item.content:
                return item
            text = _open(sealer, "reasoning", item.encrypted_content, owner, param, "text")
            return item.model_copy(
                update={"content": [ReasoningText(type="reasoning_text", text=text)]}
            )
        if isinstance(item, CompactionItem):
            summary = _open(sealer, "compaction", item.encrypted_content, owner, param, "summary")
            return MessageItem(role="developer", content=SUMMARY_PREFIX + summary, id=item.id)
        return item

    return unseal


def _open(
    sealer: Sealer, purpose: Purpose, blob: str, owner: str | None, param: str, key: str
) -> str:
    payload: dict[str, Any] = sealer.open(purpose, blob, owner=owner, param=param)
    value = payload.get(key)
    if not isinstance(value, str):  # sealed by this key, but not as this server seals
        raise InvalidRequestError(
            "The encrypted content does not hold what this item needs. Send back the "
            "item exactly as this server returned it.",
            param=param,
            code="invalid_encrypted_content",
        )
    return value
