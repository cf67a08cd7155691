"""The Conversations API without HTTP, and what responses need of conversations.

`Conversations` holds the operations of ``/v1/conversations`` (create, retrieve,
update, delete; list, add, retrieve and delete items) over the state backend's
`ConversationStore`, scoped to the caller's owner exactly like responses: another
API key's conversation is not found.

For ``POST /v1/responses``:

- `Conversations.resolve_references` replaces ``item_reference`` input items by
  the stored items they name (items of the owner's stored responses and
  conversations);
- `Conversations.context` is the conversation a response continues (read when
  the request is prepared, without the lock);
- `Conversations.begin` takes the conversation's lock for one response and
  checks, under the lock, that the conversation is still the one its prompt was
  rendered from (`PreparedRequest.context_ids`): if another response was
  appended meanwhile, the lock is released and the request refused (400
  ``conversation_locked``, retry it). It returns a `ConversationTurn`, the
  lease the job holds on the conversation while it runs, which appends the
  response's items when it ends ``completed`` or ``incomplete`` and releases
  the lock (``_lease.py``).

A conversation holds at most ``max_input_items`` items and its tenant's byte
share of the store (``max_store_bytes`` divided between the API keys): adding
items past either is a 400 ``conversation_too_large``; a response whose items
would take its conversation past either is not appended (logged), and the
conversation stays as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, final

from pydantic import TypeAdapter, ValidationError

from ._config import Config
from ._exceptions import InvalidRequestError, NotFoundError
from ._lease import ConversationTurn
from ._prepare import PreparedRequest, stored_item
from .protocol.ids import new_id
from .protocol.lists import list_page
from .protocol.request import (
    CreateRequest,
    InputItem,
    ItemReference,
    Metadata,
    check_includes,
    parse_create_request,
    parse_input_item,
)
from .store.base import (
    ConversationFull,
    ConversationStore,
    ResponseStore,
    StoredConversation,
    StoreLimits,
)

MAX_ITEMS_PER_CALL = 20
"""Most items one create or ``items`` call may add (as OpenAI)."""

_METADATA: TypeAdapter[dict[str, str]] = TypeAdapter(Metadata)
_CONVERSATION_FIELDS = frozenset({"items", "metadata"})
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def new_conversation_id() -> str:
    """A fresh conversation id: ``conv_`` and 192 random bits as 48 hex digits."""
    return new_id("conv")


def check_id(value: str, param: str, what: str) -> None:
    """Refuse an id that cannot name anything (it never reaches a store).

    Raises:
        NotFoundError: ``value`` is not letters, digits, ``_`` and ``-`` (1 to 128).
    """
    if not 1 <= len(value) <= 128 or not set(value) <= _ID_CHARS:
        raise NotFoundError(
            f"No {what} has that id: ids are letters, digits, '_' and '-', at most 128 characters.",
            param=param,
        )


def context_ids(items: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """What identifies a conversation's state: its item ids in order."""
    return tuple(str(item.get("id")) for item in items)


@final
class Conversations:
    """The Conversations API over one state backend (`ResponsesService.conversations`)."""

    def __init__(
        self,
        *,
        config: Config,
        store: ConversationStore,
        responses: ResponseStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._store = store
        self._responses = responses
        self._clock = clock

    @property
    def max_items(self) -> int:
        """Most items a conversation holds (``max_input_items``)."""
        return self._config.max_input_items

    @property
    def max_bytes(self) -> int:
        """Most bytes a conversation holds (`conversation_bytes`): its tenant's share of
        ``max_store_bytes``."""
        return StoreLimits.of(self._config).share_bytes

    # -- conversations ---------------------------------------------------------------

    async def create(self, body: Any, *, owner: str | None) -> dict[str, Any]:
        """``POST /v1/conversations``: a new conversation with optional items and metadata.

        Raises:
            InvalidRequestError: a bad body (param names the field).
            StoreError: the state backend is unavailable.
        """
        fields = _body(body, _CONVERSATION_FIELDS)
        metadata = _metadata(fields.get("metadata"))
        raw_items = fields.get("items")
        items = [] if raw_items is None else await self._items(raw_items, owner)
        conversation = {
            "id": new_conversation_id(),
            "object": "conversation",
            "created_at": int(self._clock()),
            "metadata": metadata,
        }
        await self._store.create(StoredConversation(conversation, owner), items)
        return conversation

    async def retrieve(self, conversation_id: str, *, owner: str | None) -> dict[str, Any]:
        """``GET /v1/conversations/{id}``.

        Raises:
            NotFoundError: unknown, deleted, expired, or another API key's.
        """
        return (await self._get(conversation_id, owner)).conversation

    async def update(self, conversation_id: str, body: Any, *, owner: str | None) -> dict[str, Any]:
        """``POST /v1/conversations/{id}``: replace the metadata.

        Raises:
            InvalidRequestError: a bad body. NotFoundError: unknown conversation.
        """
        fields = _body(body, frozenset({"metadata"}))
        if "metadata" not in fields:
            raise InvalidRequestError(
                "Missing required parameter: 'metadata'.",
                param="metadata",
                code="missing_required_parameter",
            )
        check_id(conversation_id, "conversation_id", "conversation")
        updated = await self._store.update(
            conversation_id, _metadata(fields["metadata"]), owner=owner
        )
        if updated is None:
            raise _not_found(conversation_id)
        return updated.conversation

    async def delete(self, conversation_id: str, *, owner: str | None) -> dict[str, Any]:
        """``DELETE /v1/conversations/{id}``: the conversation and its items.

        Raises:
            NotFoundError: unknown conversation.
        """
        check_id(conversation_id, "conversation_id", "conversation")
        if not await self._store.delete(conversation_id, owner=owner):
            raise _not_found(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    # -- items --------------------------------------------------------------------------

    async def list_items(
        self,
        conversation_id: str,
        *,
        owner: str | None,
        after: str | None = None,
        limit: int = 20,
        order: Literal["asc", "desc"] = "desc",
        include: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """``GET /v1/conversations/{id}/items``: a page, in the list shape.

        Raises:
            InvalidRequestError: ``limit`` outside 1 to 100, an unknown ``after``, an
                unsupported ``include``. NotFoundError: unknown conversation.
        """
        if not 1 <= limit <= 100:
            raise InvalidRequestError(
                f"Invalid 'limit': {limit}. It must be between 1 and 100.", param="limit"
            )
        check_includes(include)
        check_id(conversation_id, "conversation_id", "conversation")
        items = await self._store.items(conversation_id, owner=owner)
        if items is None:
            raise _not_found(conversation_id)
        ordered = items if order == "asc" else items[::-1]
        start = 0
        if after is not None:
            positions = [i for i, item in enumerate(ordered) if item.get("id") == after]
            if not positions:
                raise InvalidRequestError(
                    f"No item with id {after!r} in conversation {conversation_id!r}.",
                    param="after",
                )
            start = positions[0] + 1
        return list_page(ordered[start : start + limit], has_more=start + limit < len(ordered))

    async def add_items(
        self,
        conversation_id: str,
        body: Any,
        *,
        owner: str | None,
        include: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """``POST /v1/conversations/{id}/items``: append up to 20 items; the list of
        those added (items whose id the conversation holds already are left out).

        Raises:
            InvalidRequestError: a bad body, or the conversation would hold more
                than ``max_input_items`` items or more than its tenant's byte share
                (code ``conversation_too_large``). NotFoundError: unknown conversation.
        """
        check_includes(include)
        fields = _body(body, frozenset({"items"}))
        if "items" not in fields:
            raise InvalidRequestError(
                "Missing required parameter: 'items'.",
                param="items",
                code="missing_required_parameter",
            )
        check_id(conversation_id, "conversation_id", "conversation")
        await self._get(conversation_id, owner)
        items = await self._items(fields["items"], owner)
        try:
            added = await self._store.add_items(
                conversation_id,
                items,
                owner=owner,
                max_items=self.max_items,
                max_bytes=self.max_bytes,
            )
        except ConversationFull as full:
            if full.held_bytes is None:
                message = (
                    f"Conversation {conversation_id!r} holds {full.held} items; this server "
                    f"keeps at most {self.max_items} in one conversation."
                )
            else:
                message = (
                    f"Conversation {conversation_id!r} holds {full.held_bytes} bytes; with "
                    f"these items it would be larger than the {self.max_bytes} bytes this "
                    "server keeps in one conversation."
                )
            raise InvalidRequestError(
                f"{message} Start a new conversation.",
                param="items",
                code="conversation_too_large",
            ) from None
        if added is None:
            raise _not_found(conversation_id)
        return list_page(added, has_more=False)

    async def retrieve_item(
        self, conversation_id: str, item_id: str, *, owner: str | None
    ) -> dict[str, Any]:
        """``GET /v1/conversations/{id}/items/{item_id}``.

        Raises:
            NotFoundError: unknown conversation or item.
        """
        check_id(item_id, "item_id", "item")
        await self._get(conversation_id, owner)
        item = await self._store.get_item(conversation_id, item_id, owner=owner)
        if item is None:
            raise _item_not_found(conversation_id, item_id)
        return item

    async def delete_item(
        self, conversation_id: str, item_id: str, *, owner: str | None
    ) -> dict[str, Any]:
        """``DELETE /v1/conversations/{id}/items/{item_id}``: returns the conversation.

        Raises:
            NotFoundError: unknown conversation or item.
        """
        check_id(item_id, "item_id", "item")
        conversation = await self._get(conversation_id, owner)
        if not await self._store.delete_item(conversation_id, item_id, owner=owner):
            raise _item_not_found(conversation_id, item_id)
        return conversation.conversation

    # -- for responses ------------------------------------------------------------------

    async def context(self, conversation_id: str, owner: str | None) -> list[dict[str, Any]]:
        """The items a response on ``conversation_id`` continues from, oldest first.

        Raises:
            NotFoundError: unknown conversation (param ``conversation``).
        """
        items = None
        if _is_id(conversation_id):
            items = await self._store.items(conversation_id, owner=owner)
        if items is None:
            raise _not_found(conversation_id, param="conversation")
        return items

    def check_room(self, request: CreateRequest, context: Sequence[dict[str, Any]]) -> None:
        """Refuse a response whose conversation and input together exceed
        ``max_input_items`` (naming the conversation, not the input).

        Raises:
            InvalidRequestError: param ``conversation``, code ``conversation_too_large``.
        """
        total = len(context) + len(request.input_items)
        if request.conversation_id is not None and total > self.max_items:
            raise InvalidRequestError(
                f"Conversation {request.conversation_id!r} holds {len(context)} items; with "
                f"this request's {len(request.input_items)} input items that is more than the "
                f"{self.max_items} this server accepts. Delete items from the conversation or "
                "start a new one.",
                param="conversation",
                code="conversation_too_large",
            )

    async def begin(
        self, prepared: PreparedRequest, owner: str | None, response_id: str
    ) -> ConversationTurn | None:
        """Take the lock of the request's conversation for ``response_id`` (None
        without ``conversation``) and, when ``prepared.context_ids`` is set, check under
        the lock that the conversation still holds the items its prompt was rendered
        from. The lock is released again if this raises (or is cancelled).

        Raises:
            InvalidRequestError: another response runs on it, or one was added to it
                since ``prepared`` was rendered (``conversation_locked``: retry).
            NotFoundError: the conversation is gone.
            StoreError: the state backend is unavailable.
        """
        conversation_id = prepared.request.conversation_id
        if conversation_id is None:
            return None
        lease_s = self._config.job_lease_s
        turn = ConversationTurn(
            self._store,
            conversation_id=conversation_id,
            owner=owner,
            response_id=response_id,
            lease_s=lease_s,
            cleanup_s=self._config.cleanup_timeout_s,
            max_items=self.max_items,
            max_bytes=self.max_bytes,
        )
        held: bool | None = True  # until the store answers, it may have taken the lock
        try:
            held = await self._store.lock(
                conversation_id, response_id, owner=owner, lease_s=lease_s
            )
            if held is None:
                raise _not_found(conversation_id, param="conversation")
            if not held:
                raise InvalidRequestError(
                    "Another process is currently operating on this conversation. Please "
                    "retry in a few seconds, once its response has finished.",
                    param="conversation",
                    code="conversation_locked",
                )
            if prepared.context_ids is not None:
                items = await self._store.items(conversation_id, owner=owner)
                if items is None:
                    raise _not_found(conversation_id, param="conversation")
                if context_ids(items) != prepared.context_ids:
                    raise InvalidRequestError(
                        f"Conversation {conversation_id!r} changed while this response was "
                        "being prepared (another response on it finished). Retry the request: "
                        "it will continue from the conversation as it is now.",
                        param="conversation",
                        code="conversation_locked",
                    )
        except BaseException:
            if held:
                await turn.release()
            raise
        return turn

    async def resolve_references(self, request: CreateRequest, owner: str | None) -> CreateRequest:
        """``request`` with each ``item_reference`` input item replaced by the item it names.

        Raises:
            InvalidRequestError: a reference to no stored item of ``owner``
                (param ``input[i].id``, code ``item_not_found``).
        """
        if isinstance(request.input, str) or not any(
            isinstance(item, ItemReference) for item in request.input
        ):
            return request
        resolved = await self._resolved(request.input, owner, "input")
        return request.model_copy(update={"input": resolved})

    async def _resolved(
        self, items: Sequence[InputItem], owner: str | None, param: str
    ) -> list[InputItem]:
        resolved: list[InputItem] = []
        for index, item in enumerate(items):
            if not isinstance(item, ItemReference):
                resolved.append(item)
                continue
            found = await self.find_item(item.id, owner)
            if found is None:
                raise InvalidRequestError(
                    f"Item with id {item.id!r} not found: an item_reference names an item of "
                    "a stored response or conversation created with the same API key.",
                    param=f"{param}[{index}].id",
                    code="item_not_found",
                )
            try:
                resolved.append(parse_input_item(found))
            except ValidationError:
                raise InvalidRequestError(
                    f"Item {item.id!r} (of type {found.get('type')!r}) cannot be used as input.",
                    param=f"{param}[{index}].id",
                    code="invalid_item_reference",
                ) from None
        return resolved

    async def find_item(self, item_id: str, owner: str | None) -> dict[str, Any] | None:
        """A stored item of ``owner`` by id: of its responses first, then conversations."""
        if not _is_id(item_id):
            return None
        found = await self._responses.find_item(item_id, owner=owner)
        if found is None:
            found = await self._store.find_item(item_id, owner=owner)
        return found

    # -- helpers ------------------------------------------------------------------------

    async def _get(self, conversation_id: str, owner: str | None) -> StoredConversation:
        check_id(conversation_id, "conversation_id", "conversation")
        conversation = await self._store.get(conversation_id, owner=owner)
        if conversation is None:
            raise _not_found(conversation_id)
        return conversation

    async def _items(self, raw: Any, owner: str | None) -> list[dict[str, Any]]:
        """Validate ``items`` as ``input`` items of a create request are validated;
        resolve references; give each an id."""
        if not isinstance(raw, list):
            raise InvalidRequestError(
                "Invalid type for 'items': expected an array of input items.",
                param="items",
                code="invalid_type",
            )
        if len(raw) > MAX_ITEMS_PER_CALL:
            raise InvalidRequestError(
                f"Too many items: {len(raw)}. Add at most {MAX_ITEMS_PER_CALL} at a time.",
                param="items",
                code="array_above_max_length",
            )
        try:
            request = parse_create_request({"model": "conversation", "input": raw})
        except InvalidRequestError as error:
            param = error.param
            if param is not None and param.startswith("input"):
                param = "items" + param.removeprefix("input")
            message = error.message.replace("'input", "'items")
            raise InvalidRequestError(message, param=param, code=error.code) from None
        if isinstance(request.input, str):  # not a list: refused above
            return []
        resolved = await self._resolved(request.input, owner, "items")
        items = [stored_item(item) for item in resolved]
        ids = [item["id"] for item in items]
        if len(set(ids)) != len(ids):
            raise InvalidRequestError(
                "Two items have the same 'id'; item ids are unique within a conversation.",
                param="items",
            )
        return items


def _is_id(value: str) -> bool:
    return 1 <= len(value) <= 128 and set(value) <= _ID_CHARS


def _body(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    """The body's fields (null ones left out), refusing unknown ones."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    for key in body:
        if key not in allowed:
            raise InvalidRequestError(
                f"Unknown parameter: {str(key)[:64]!r}.",
                param=str(key)[:64],
                code="unknown_parameter",
            )
    return {key: value for key, value in body.items() if value is not None}


def _metadata(value: Any) -> dict[str, str]:
    """Validated metadata: at most 16 pairs, keys up to 64 characters, values up to 512.

    Raises:
        InvalidRequestError: otherwise (param ``metadata``).
    """
    if value is None:
        return {}
    try:
        metadata = _METADATA.validate_python(value, strict=True)
    except ValidationError:
        metadata = None
    if metadata is None or any(len(key) > 64 for key in metadata):
        raise InvalidRequestError(
            "Invalid 'metadata': an object of at most 16 string values, keys of at most 64 "
            "characters and values of at most 512.",
            param="metadata",
            code="invalid_value",
        )
    return metadata


def _not_found(conversation_id: str, *, param: str = "conversation_id") -> NotFoundError:
    return NotFoundError(f"Conversation with id {conversation_id!r} not found.", param=param)


def _item_not_found(conversation_id: str, item_id: str) -> NotFoundError:
    return NotFoundError(
        f"Item with id {item_id!r} not found in conversation {conversation_id!r}.",
        param="item_id",
    )
