"""The state layer's seams: response records, event logs, control.

Every record, conversation, item and log is found by its `Key`, (owner, id): a
lookup as one owner never finds what another owns, and says so by finding
nothing (None, False). SQLite keys its rows so (``WHERE id = ? AND owner IS ?``);
the memory backend keys its dicts so; Redis keys by id and keeps the owner with
the value, which its reads check (`Principal.may_see`, as an owner). Whether a
caller may ask as someone else (an operator) is decided above the stores, by the
service.

Three small protocols, each implemented once per backend (``memory://``,
``sqlite:///PATH``, ``redis://…``) and opened together by `open_state`
(``store/open.py``) as one `State`:

- `ResponseStore`: response records (the Response object, this request's input
  items, the owner, the replica running it). Records reference their predecessor
  (``previous_response_id``) instead of copying the conversation.
- `EventLogStore`: event logs of background responses beyond the process that
  produces them: replay after the job ended, and (shared backends) live
  following from another replica.
- `Control`: what reaches a job wherever it runs: cancel messages, and the
  heartbeat that tells other replicas this one is alive.
- `ConversationStore`: conversations (``/v1/conversations``) and their items,
  owner-scoped, with the lock that lets one response at a time run on one.

A fifth, `FileStore` (``store/files.py``: files, containers and their bytes), is
opened with them, as `State.files`; a sixth, `WebhookStore` (``store/webhooks.py``:
webhook endpoints and the outbox of deliveries), as `State.webhooks`.

Item lookup (``item_reference`` input items): `ResponseStore.find_item` and
`ConversationStore.find_item` find a stored item by its id, through an index the
backend keeps as records and conversations are written, deleted and evicted.

A running job always writes its events to its own in-process `EventLog` ring;
readers in the same process follow that ring. The job's task is the only
writer of its record and its stored log (SPEC §12).

Every method may raise `StoreError` when the backend fails (a lost connection,
a full disk); callers retry boundedly and never let it escape into a job nursery.

Finished records are bounded by count and by bytes (`StoreLimits`), per tenant:
with API keys each key's responses count against that key's equal share only, so
no key can push another's out; without, every response shares the whole bound.
A record's size is `record_bytes`: its response and input items as compact JSON.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NoReturn, Protocol

import trio

from .._config import Config
from .._exceptions import StoreError
from .._offload import estimated_size, offload
from ..background.event_log import EventLog
from ..background.subscription import Subscription
from ..protocol import errors
from ..protocol.codec import encode_strict_json
from .files import FileStore
from .webhooks import WebhookStore

RUNNING_STATUSES = frozenset({"queued", "in_progress"})

Key = tuple[str | None, str]
"""(owner, id): what a store finds a thing by (the owner: None without API keys)."""

__all__ = [
    "RESTARTED_ERROR",
    "RUNNING_STATUSES",
    "CancelHandler",
    "Control",
    "ConversationFull",
    "ConversationStore",
    "EventLogStore",
    "Key",
    "LogStatistics",
    "ResponseStore",
    "State",
    "StoreError",
    "StoreLimits",
    "StoredConversation",
    "StoredResponse",
    "conversation_bytes",
    "first_record_bound",
    "measure_record",
    "record_bytes",
    "with_retries",
]

RESTARTED_ERROR = errors.server_error(
    "The server running this response stopped before it finished.", errors.SERVER_RESTARTED
)


@dataclass(frozen=True)
class StoredResponse:
    """One response as stored: what retrieve, ``input_items`` and follow-ups need."""

    response: dict[str, Any]
    """The Response object (terminal once the job has finished)."""
    input_items: list[dict[str, Any]]
    """This request's input items, each with an ``id``."""
    owner: str | None
    """Digest of the API key that created it (None without auth)."""
    replica: str | None = None
    """The replica whose job writes this record while it runs (see `Control.replica`)."""
    updated_at: float = field(default=0.0, compare=False)
    """Wall-clock time of the last write (set by the backend)."""

    @property
    def id(self) -> str:
        response_id: str = self.response["id"]
        return response_id

    def item(self, item_id: str) -> dict[str, Any] | None:
        """The input or output item with ``item_id``, if this record holds one."""
        for item in (*self.input_items, *(self.response.get("output") or ())):
            if isinstance(item, dict) and item.get("id") == item_id:
                return item
        return None

    @property
    def item_ids(self) -> set[str]:
        """The ids of its input and output items (what the item index holds)."""
        return {
            item["id"]
            for item in (*self.input_items, *(self.response.get("output") or ()))
            if isinstance(item, dict) and isinstance(item.get("id"), str)
        }

    @property
    def status(self) -> str:
        status: str = self.response["status"]
        return status

    @property
    def running(self) -> bool:
        return self.status in RUNNING_STATUSES

    @property
    def background(self) -> bool:
        return bool(self.response.get("background"))

    @property
    def previous_response_id(self) -> str | None:
        previous: str | None = self.response.get("previous_response_id")
        return previous

    def interrupted(self) -> StoredResponse:
        """This record as a response whose process died: ``failed``, ``server_restarted``."""
        response = {**self.response, "status": "failed", "error": RESTARTED_ERROR.response_error()}
        if response.get("usage") is None:
            response["usage"] = {
                "input_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 0,
            }
        return replace(self, response=response, replica=None)


def encoded(value: Any) -> str:
    """``value`` as stored: compact, strict JSON (no NaN), UTF-8 left as it is.

    Raises:
        StoreError: ``value`` cannot be encoded (a caller's bug that must reach the
            job as a store failure, not crash it).
    """
    try:
        return encode_strict_json(value)
    except (TypeError, ValueError) as error:
        raise StoreError(f"The response store cannot encode a record as JSON: {error}") from error


def conversation_bytes(conversation: dict[str, Any], items: Sequence[dict[str, Any]]) -> int:
    """The size a conversation counts for in its tenant's byte bound: its object and
    each item as `encoded` JSON, in UTF-8 bytes. The same in every backend."""
    return len(encoded(conversation).encode()) + sum(len(encoded(i).encode()) for i in items)


def record_bytes(record: StoredResponse) -> int:
    """The size a record counts for in the store's byte bound: its response and its
    input items as `encoded` JSON, in UTF-8 bytes. The same in every backend.

    CPU-heavy for large records: see `measure_record`.
    """
    return len(encoded(record.response).encode()) + len(encoded(record.input_items).encode())


FIRST_RECORD_SLACK = 64 * 1024
"""`first_record_bound`'s allowance for the echo's defaults and the tools' fields."""


def first_record_bound(request_bytes: int, input_items: int) -> int:
    """At least the `record_bytes` of a response's first record (before any output),
    from the size of its request's JSON and its number of input items.

    The record holds what the request sent once: its input in the input items, its
    other fields in the response's echo of them. Encoded again, a value takes at
    most six times what it took in the request, or what `estimated_size` counts
    for it (a control character becomes a six-byte escape; ``9e15`` becomes
    ``9000000000000000.0``); each item adds an id, a type and a status, and the
    echo the names and defaults of what the request left out.
    """
    return 6 * request_bytes + 512 * input_items + FIRST_RECORD_SLACK


async def measure_record(record: StoredResponse) -> int:
    """`record_bytes`, in a worker thread when the record is large."""
    estimate = estimated_size([record.response, record.input_items])
    return await offload(estimate, partial(record_bytes, record), lane="store")


@dataclass(frozen=True)
class StoreLimits:
    """How many finished records, and how many bytes of them, a store keeps, and how
    those bounds are shared.

    Each tenant (`tenant`) gets `share_responses` records and `share_bytes` bytes
    (the bounds divided equally between the API keys); making room
    for a tenant's record evicts only that tenant's oldest finished records. A
    tenant's newest record is kept however large it is (then alone): a response
    that has just finished can always be retrieved. Running records are neither
    counted nor evicted (the job limits bound them).
    """

    max_responses: int
    """The whole store's bound on finished records (``max_stored_responses``)."""
    max_bytes: int
    """The whole store's bound on their bytes (``max_store_bytes``)."""
    keys: int = 0
    """How many API keys are configured: each is a tenant with an equal share.
    0: one tenant, all records together."""

    @classmethod
    def of(cls, config: Config) -> StoreLimits:
        return cls(
            max_responses=config.max_stored_responses,
            max_bytes=config.max_store_bytes,
            keys=len(set(config.api_keys)),
        )

    @property
    def per_owner(self) -> bool:
        """True when each owner is a tenant of its own (API keys are configured)."""
        return self.keys > 0

    @property
    def share_responses(self) -> int:
        """Finished records one tenant keeps (at least one)."""
        return max(1, self.max_responses // max(1, self.keys))

    @property
    def share_bytes(self) -> int:
        """Bytes of finished records one tenant keeps (its newest is kept regardless)."""
        return max(1, self.max_bytes // max(1, self.keys))

    def tenant(self, owner: str | None) -> str | None:
        """The tenant whose share a record of ``owner`` counts against: the owner
        itself with API keys; None (all records together) without."""
        return owner if self.per_owner else None

    def over(self, count: int, size: int) -> bool:
        """Whether a tenant holding ``count`` finished records of ``size`` bytes must
        evict its oldest (never its last one for the byte bound)."""
        return count > self.share_responses or (size > self.share_bytes and count > 1)


class ResponseStore(Protocol):
    """Response records by id, scoped to their owner."""

    async def put(self, record: StoredResponse) -> None:
        """Insert or replace the record with ``record.id``.

        A record whose status is running (``queued``/``in_progress``) is never
        evicted or expired; a finished one lives ``store_ttl_s`` and may be
        evicted earlier to stay within the store's `StoreLimits`: only the oldest
        finished records of its own tenant make room for it.
        """
        ...

    async def get(self, response_id: str, *, owner: str | None) -> StoredResponse | None:
        """The record, or None if unknown, deleted, expired or owned by someone else."""
        ...

    async def delete(self, response_id: str, *, owner: str | None) -> bool:
        """Remove a record; False if there was none (for this owner)."""
        ...

    async def expire(self) -> int:
        """Drop finished records past their time to live; returns how many."""
        ...

    async def recover_interrupted(self) -> list[StoredResponse]:
        """Mark failed (``server_restarted``) every record left running by a process
        that is gone, and return those records as they are now stored.

        SQLite: records of any other process (one process owns the file).
        Redis: records whose replica's lease expired; each is claimed once,
        atomically, by the first replica to notice. Memory: none.
        """
        ...

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        """An input or output item with ``item_id`` of a finished record of ``owner``
        (the newest such record when several hold it), or None."""
        ...


@dataclass(frozen=True)
class StoredConversation:
    """One conversation as stored (its items are read separately)."""

    conversation: dict[str, Any]
    """The Conversation object: ``id``, ``object``, ``created_at``, ``metadata``."""
    owner: str | None
    """Digest of the API key that created it (None without auth)."""

    @property
    def id(self) -> str:
        conversation_id: str = self.conversation["id"]
        return conversation_id


class ConversationFull(Exception):
    """Adding items would take a conversation past its bound on items or bytes."""

    def __init__(self, held: int, *, held_bytes: int | None = None) -> None:
        super().__init__(held, held_bytes)
        self.held = held
        """The items it holds now."""
        self.held_bytes = held_bytes
        """Its size now (`conversation_bytes`) when the byte bound was hit; None when
        the bound on items was."""


class ConversationStore(Protocol):
    """Conversations by id, scoped to their owner, with their items in order.

    A conversation lives ``store_ttl_s`` after its last use (any call below
    naming it). Conversations are bounded like finished responses, with a bound
    of their own: each tenant keeps at most `StoreLimits.share_responses`
    conversations and `StoreLimits.share_bytes` bytes of them (a conversation's
    size: its object and its items as compact JSON); the least recently used of
    that tenant's go first, never the one being written. Item ids are unique
    within a conversation.
    """

    async def create(
        self, conversation: StoredConversation, items: Sequence[dict[str, Any]]
    ) -> None:
        """Store a new conversation with its first items (each with an ``id``)."""
        ...

    async def get(self, conversation_id: str, *, owner: str | None) -> StoredConversation | None:
        """The conversation, or None if unknown, deleted, expired or someone else's."""
        ...

    async def update(
        self, conversation_id: str, metadata: dict[str, str], *, owner: str | None
    ) -> StoredConversation | None:
        """Replace its metadata; the conversation as it is now, or None (unknown)."""
        ...

    async def delete(self, conversation_id: str, *, owner: str | None) -> bool:
        """Remove a conversation and its items; False if there was none (for this owner)."""
        ...

    async def items(
        self, conversation_id: str, *, owner: str | None
    ) -> list[dict[str, Any]] | None:
        """All its items, oldest first; None for an unknown conversation."""
        ...

    async def add_items(
        self,
        conversation_id: str,
        items: Sequence[dict[str, Any]],
        *,
        owner: str | None,
        max_items: int | None = None,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]] | None:
        """Append items (each with an ``id``), atomically; those whose id the
        conversation holds already are left out. Returns the items added, or None
        for an unknown conversation.

        Raises:
            ConversationFull: it would hold more than ``max_items`` items or be larger
                than ``max_bytes`` (`conversation_bytes`; None: no bound); nothing is
                added.
        """
        ...

    async def get_item(
        self, conversation_id: str, item_id: str, *, owner: str | None
    ) -> dict[str, Any] | None:
        """One item of the conversation, or None."""
        ...

    async def delete_item(self, conversation_id: str, item_id: str, *, owner: str | None) -> bool:
        """Remove one item; False if the conversation holds none with that id."""
        ...

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        """An item with ``item_id`` in any conversation of ``owner``, or None."""
        ...

    async def lock(
        self, conversation_id: str, holder: str, *, owner: str | None, lease_s: float
    ) -> bool | None:
        """Take (or, for the same ``holder``, extend) the conversation's lock for
        ``lease_s``, atomically, across replicas. False: another holder's lease runs;
        None: unknown conversation."""
        ...

    async def unlock(self, conversation_id: str, holder: str, *, owner: str | None) -> None:
        """Release the lock of ``owner``'s conversation if ``holder`` holds it."""
        ...

    async def expire(self) -> int:
        """Drop conversations past their time to live; returns how many (backends
        whose keys expire by themselves may answer 0)."""
        ...


class EventLogStore(Protocol):
    """Event logs of background responses, for readers the producing job does not serve.

    Frames are SSE frames as `ResponseBuilder` encodes them, numbered from 0;
    a complete log ends with the terminal event.
    """

    live: bool
    """True: frames are written while the job runs (`append`), so the log survives
    the process and other replicas can follow it. False: the backend keeps the
    finished in-process ring (`finish`) and nothing else."""

    write_interval_s: float
    """How long the recorder gathers frames before each `append` (live backends): the
    price of a write against how fresh the stored log is. A response shorter than
    this is written once, when it ends."""

    async def append(
        self, response_id: str, frames: Sequence[bytes], *, first: int, owner: str | None
    ) -> None:
        """Write frames ``first … first + len(frames) - 1`` (in order, no gaps).

        Only called when `live`. The backend keeps at most the newest
        ``replay_events`` events (approximately) of each log.
        """
        ...

    async def finish(self, response_id: str, log: EventLog, *, owner: str | None) -> None:
        """The log is complete (its last frame, already appended, is the terminal event).

        Keep it for ``stream_retention_s``, within the retention's count and byte
        limits (oldest dropped first).
        """
        ...

    async def open(
        self, response_id: str, *, owner: str | None, starting_after: int
    ) -> Subscription | None:
        """A reader of the stored log after ``starting_after``, or None when this
        backend holds no log of ``response_id`` for ``owner``.

        Raises:
            SubscriberLagged: event ``starting_after + 1`` is no longer retained.
        """
        ...

    async def terminate(self, record: StoredResponse) -> None:
        """Append ``record``'s terminal event to its log, if there is a log that
        does not end with one yet (recovery of an interrupted response)."""
        ...

    async def delete(self, response_id: str, *, owner: str | None) -> None:
        """Forget the log of ``owner``'s response (the response was deleted)."""
        ...

    async def expire(self) -> int:
        """Drop logs past their retention; returns how many."""
        ...

    def statistics(self) -> LogStatistics:
        """What this process knows it retains (cheap; no I/O)."""
        ...


@dataclass(frozen=True)
class LogStatistics:
    retained_streams: int
    """Finished logs kept for replay."""
    retained_bytes: int
    """Bytes of frames they hold."""
    subscribers: int = 0
    """Open subscriptions this backend serves in this process."""


CancelHandler = Callable[[str], None]
"""Called (synchronously) with the id of a response to cancel, when it runs here."""


class Control(Protocol):
    """Reaching jobs wherever they run."""

    replica: str
    """This process's replica id (unique per process start)."""

    async def run(
        self,
        on_cancel: CancelHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Heartbeat this replica and deliver cancel requests addressed to it.

        This function never returns unless cancelled.
        """
        ...

    async def request_cancel(self, record: StoredResponse) -> bool:
        """Ask the replica running ``record`` to cancel it; False when no live
        replica runs it (the caller may then end it itself)."""
        ...


@dataclass(frozen=True)
class State:
    """The seams of one backend, opened together by `open_state`."""

    kind: str
    """``memory``, ``sqlite`` or ``redis``."""
    store: ResponseStore
    logs: EventLogStore
    control: Control
    conversations: ConversationStore
    files: FileStore
    """Files, containers and their bytes (`FileStore`, ``store/files.py``)."""
    webhooks: WebhookStore
    """Webhook endpoints and the outbox of their deliveries (`WebhookStore`,
    ``store/webhooks.py``), which the `ResponseStore` writes to with a background
    response's final state."""
    fault: Callable[[], str | None] = lambda: None
    """Why the backend refuses writes now (SQLite: its file was deleted or replaced),
    or None; ``/health`` answers 503 with it. Passing outages (Redis restarting) are
    not faults: they fail the operations they hit, with `StoreError`."""

    @property
    def durable(self) -> bool:
        """Records and logs outlive this process (and, for Redis, are shared)."""
        return self.logs.live


async def with_retries(
    operation: Callable[[], Awaitable[None]],
    *,
    attempts: int = 4,
    first_delay_s: float = 0.05,
) -> None:
    """Run ``operation``, retrying `StoreError` with exponential backoff.

    Raises the last `StoreError` once ``attempts`` are used up. Cancellation
    propagates at once.
    """
    delay = first_delay_s
    for attempt in range(attempts):
        try:
            await operation()
            return
        except StoreError:
            if attempt == attempts - 1:
                raise
        await trio.sleep(delay)
        delay *= 4
