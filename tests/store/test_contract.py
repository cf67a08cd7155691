"""The state layer's contract: the same tests against memory://, sqlite:/// and redis://.

Each test opens the backend named by the ``store_url`` fixture (an empty one per
test; Redis is a real ``redis-server``) through `open_state`, exactly as the
server does. What a backend cannot do by design (memory: nothing outlives the
process, so it has nothing to recover) is asserted as such, not skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from tests.support import check_stream
from trio_responses import Config
from trio_responses.background.event_log import EventLog, SubscriberLagged
from trio_responses.background.subscription import Subscription
from trio_responses.protocol.builder import ResponseBuilder, request_echo
from trio_responses.protocol.codec import decode_event
from trio_responses.protocol.request import parse_create_request
from trio_responses.store.base import (
    RESTARTED_ERROR,
    ConversationFull,
    State,
    StoredConversation,
    StoredResponse,
    conversation_bytes,
    encoded,
    record_bytes,
)
from trio_responses.store.open import open_state

OWNER = "owner-a"
STRANGER = "owner-b"
TWO_KEYS = ("key-a", "key-b")
"""Two API keys configured: each owner (whatever its tag) gets half of every bound."""


@asynccontextmanager
async def opened(url: str, **config: Any) -> AsyncIterator[State]:
    async with open_state(url, Config(store_url=url, **config)) as state:
        yield state


def _record(
    response_id: str = "resp_1",
    *,
    status: str = "completed",
    owner: str | None = OWNER,
    replica: str | None = None,
    previous: str | None = None,
    background: bool = False,
    padding: int = 0,
) -> StoredResponse:
    return StoredResponse(
        response={
            "id": response_id,
            "object": "response",
            "status": status,
            "background": background,
            "previous_response_id": previous,
            "output": [{"type": "message", "id": f"msg_{response_id}", "content": []}],
            "usage": None,
            "error": None,
            "instructions": "é" * padding,
        },
        input_items=[{"type": "message", "id": f"in_{response_id}", "role": "user"}],
        owner=owner,
        replica=replica,
    )


class Produced:
    """A real response's event frames, built by `ResponseBuilder`, in a job's ring."""

    def __init__(self, response_id: str, *, deltas: int, finish: bool = True) -> None:
        self.frames: list[bytes] = []
        self.log = EventLog(max_events=1 << 20, max_bytes=1 << 30)
        request = parse_create_request({"model": "m", "input": "x", "background": True})
        self.builder = ResponseBuilder(
            response_id=response_id,
            model="m",
            created_at=1.0,
            echo=request_echo(request),
            background=True,
            emit=self._emit,
        )
        self.builder.start()
        self.builder.mark_in_progress()
        self.builder.open_message()
        for index in range(deltas):
            self.builder.delta(f"token {index} ")
        if finish:
            self.builder.finish("completed", now=2.0)
            self.log.close()

    def _emit(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.log.append(frame)


async def record_log(
    state: State, response_id: str, produced: Produced, *, batch: int = 7, finish: bool = True
) -> None:
    """Write a log the way the recorder does: batches while live, then finish."""
    if state.logs.live:
        for first in range(0, len(produced.frames), batch):
            await state.logs.append(
                response_id, produced.frames[first : first + batch], first=first, owner=OWNER
            )
    if finish:
        await state.logs.finish(response_id, produced.log, owner=OWNER)


async def read_all(subscription: Subscription) -> list[bytes]:
    frames: list[bytes] = []
    with trio.fail_after(10), subscription:
        while batch := await subscription.receive_frames():
            frames.extend(batch)
    return frames


# -- records ------------------------------------------------------------------------------


async def test_records_round_trip_scoped_to_their_owner(store_url: str) -> None:
    async with opened(store_url) as state:
        store = state.store
        record = _record()
        await store.put(record)
        got = await store.get("resp_1", owner=OWNER)
        assert got is not None
        assert got.response == record.response and got.input_items == record.input_items
        assert got.owner == OWNER
        assert await store.get("resp_1", owner=STRANGER) is None
        assert await store.get("resp_1", owner=None) is None
        assert await store.get("resp_unknown", owner=OWNER) is None
        assert not await store.delete("resp_1", owner=STRANGER)
        assert await store.get("resp_1", owner=OWNER) is not None
        assert await store.delete("resp_1", owner=OWNER)
        assert await store.get("resp_1", owner=OWNER) is None
        assert not await store.delete("resp_1", owner=OWNER)


async def test_a_put_replaces_the_record(store_url: str) -> None:
    async with opened(store_url) as state:
        await state.store.put(_record(status="in_progress", replica=state.control.replica))
        await state.store.put(_record(status="completed"))
        got = await state.store.get("resp_1", owner=OWNER)
        assert got is not None and got.status == "completed" and not got.running


async def test_records_without_an_owner(store_url: str) -> None:
    async with opened(store_url) as state:
        await state.store.put(_record(owner=None))
        assert await state.store.get("resp_1", owner=None) is not None
        assert await state.store.get("resp_1", owner=OWNER) is None


async def test_records_keep_strict_json(store_url: str) -> None:
    async with opened(store_url) as state:
        record = _record()
        record.response["text"] = 'quotes " and \\ and \u2028 and emoji \U0001f600'
        await state.store.put(record)
        got = await state.store.get("resp_1", owner=OWNER)
        assert got is not None and got.response["text"] == record.response["text"]


async def test_finished_records_expire_running_ones_stay(store_url: str) -> None:
    async with opened(store_url, store_ttl_s=0.3) as state:
        store = state.store
        await store.put(_record("resp_done"))
        await store.put(_record("resp_run", status="in_progress", replica=state.control.replica))
        with trio.fail_after(10):
            while await store.get("resp_done", owner=OWNER) is not None:
                await store.expire()
                await trio.sleep(0.05)
        assert await store.get("resp_run", owner=OWNER) is not None


async def test_a_chain_is_stored_by_reference(store_url: str) -> None:
    async with opened(store_url) as state:
        await state.store.put(_record("resp_a"))
        await state.store.put(_record("resp_b", previous="resp_a"))
        second = await state.store.get("resp_b", owner=OWNER)
        assert second is not None and second.previous_response_id == "resp_a"
        # Only its own items: the conversation is assembled by walking the chain.
        assert [item["id"] for item in second.input_items] == ["in_resp_b"]


async def test_recovery_of_responses_left_running(store_url: str) -> None:
    async with opened(store_url) as state:
        await state.store.put(
            _record("resp_mine", status="in_progress", replica=state.control.replica)
        )
        await state.store.put(_record("resp_dead", status="queued", replica="gone-replica"))
        recovered = await state.store.recover_interrupted()
        mine = await state.store.get("resp_mine", owner=OWNER)
        assert mine is not None and mine.status == "in_progress"  # this process runs it
        if state.kind == "memory":
            # Nothing outlives the process that ran it: there is nothing to recover.
            assert recovered == []
            return
        assert [record.id for record in recovered] == ["resp_dead"]
        dead = await state.store.get("resp_dead", owner=OWNER)
        assert dead is not None and dead.status == "failed"
        assert dead.response["error"] == RESTARTED_ERROR.response_error()
        assert await state.store.recover_interrupted() == []  # once only


# -- bounds and shares ----------------------------------------------------------------------

ONE = record_bytes(_record("resp_0"))
"""The size of every ``_record`` with a six-character id and no padding."""


async def stored(state: State, *response_ids: str, owner: str = OWNER) -> list[bool]:
    return [await state.store.get(rid, owner=owner) is not None for rid in response_ids]


async def test_finished_records_are_bounded_by_bytes(store_url: str) -> None:
    async with opened(store_url, max_store_bytes=3 * ONE + ONE // 2) as state:
        store = state.store
        # Running records count for nothing and are never evicted, however large.
        running = _record("resp_run", status="in_progress", replica=state.control.replica)
        await store.put(replace_padding(running, 10 * ONE))
        for index in range(5):
            await store.put(_record(f"resp_{index}"))
        assert await stored(state, *(f"resp_{index}" for index in range(5))) == [
            False,
            False,
            True,
            True,
            True,
        ]
        assert await stored(state, "resp_run") == [True]
        # Sizes are counted in UTF-8 bytes: one record twice as large takes two places.
        await store.put(_record("resp_5", padding=ONE // 2))
        assert await stored(state, "resp_2", "resp_3", "resp_4", "resp_5") == [
            False,
            False,
            True,
            True,
        ]


def replace_padding(record: StoredResponse, padding: int) -> StoredResponse:
    return StoredResponse(
        {**record.response, "instructions": "x" * padding},
        record.input_items,
        record.owner,
        record.replica,
    )


@pytest.mark.parametrize("bound", ["count", "bytes"])
async def test_one_owner_cannot_evict_another(store_url: str, bound: str) -> None:
    # Each of the two keys gets 2 records, or 2.5 records' bytes.
    limits = {"max_stored_responses": 4} if bound == "count" else {"max_store_bytes": 5 * ONE}
    async with opened(store_url, api_keys=TWO_KEYS, **limits) as state:
        await state.store.put(_record("resp_s0", owner=STRANGER))
        await state.store.put(_record("resp_s1", owner=STRANGER))
        for index in range(6):
            await state.store.put(_record(f"resp_{index}"))
        mine = await stored(state, *(f"resp_{index}" for index in range(6)))
        assert mine == [False, False, False, False, True, True]
        assert await stored(state, "resp_s0", "resp_s1", owner=STRANGER) == [True, True]


async def test_without_api_keys_every_owner_shares_one_bound(store_url: str) -> None:
    async with opened(store_url, max_stored_responses=2) as state:
        await state.store.put(_record("resp_0"))
        await state.store.put(_record("resp_1", owner=STRANGER))
        await state.store.put(_record("resp_2"))
        assert await stored(state, "resp_0", "resp_2") == [False, True]
        assert await stored(state, "resp_1", owner=STRANGER) == [True]


async def test_a_record_larger_than_its_share_is_kept_alone(store_url: str) -> None:
    async with opened(store_url, api_keys=TWO_KEYS, max_store_bytes=4 * ONE) as state:
        await state.store.put(_record("resp_s0", owner=STRANGER))
        await state.store.put(_record("resp_0"))
        await state.store.put(_record("resp_1"))
        # The newest record stays, however large: a response that has just finished
        # can be retrieved. Its owner's older ones make room; nobody else's.
        await state.store.put(_record("resp_2", padding=2 * ONE))
        assert await stored(state, "resp_0", "resp_1", "resp_2") == [False, False, True]
        await state.store.put(_record("resp_3"))
        assert await stored(state, "resp_2", "resp_3") == [False, True]
        assert await stored(state, "resp_s0", owner=STRANGER) == [True]


async def test_deleted_and_replaced_records_give_their_place_back(store_url: str) -> None:
    async with opened(store_url, max_store_bytes=2 * ONE) as state:
        store = state.store
        await store.put(_record("resp_0"))
        await store.put(_record("resp_1"))
        assert await store.delete("resp_1", owner=OWNER)
        await store.put(_record("resp_2", status="queued", replica=state.control.replica))
        await store.put(_record("resp_2"))  # it finished: counted once
        assert await stored(state, "resp_0", "resp_2") == [True, True]
        await store.put(_record("resp_3"))
        assert await stored(state, "resp_0", "resp_2", "resp_3") == [False, True, True]


async def test_expired_records_give_their_place_back(store_url: str) -> None:
    async with opened(store_url, max_store_bytes=2 * ONE, store_ttl_s=1.0) as state:
        store = state.store
        await store.put(_record("resp_0"))
        await store.put(_record("resp_1"))
        with trio.fail_after(10):
            while await stored(state, "resp_0", "resp_1") != [False, False]:
                await store.expire()
                await trio.sleep(0.05)
        await store.expire()
        await store.put(_record("resp_2"))
        await store.put(_record("resp_3"))
        assert await stored(state, "resp_2", "resp_3") == [True, True]
        await store.put(_record("resp_4"))
        assert await stored(state, "resp_2", "resp_3", "resp_4") == [False, True, True]


async def test_the_shares_hold_across_a_reopen(store_url: str) -> None:
    limits = {"api_keys": TWO_KEYS, "max_store_bytes": 5 * ONE}  # 2.5 records per key
    async with opened(store_url, **limits) as state:
        await state.store.put(_record("resp_0"))
        await state.store.put(_record("resp_1"))
        await state.store.put(_record("resp_s0", owner=STRANGER))
    async with opened(store_url, **limits) as state:
        await state.store.put(_record("resp_2"))
        if not state.durable:
            # Nothing outlives the process: the reopened store holds only what follows.
            assert await stored(state, "resp_0", "resp_1", "resp_2") == [False, False, True]
            return
        assert await stored(state, "resp_0", "resp_1", "resp_2") == [False, True, True]
        assert await stored(state, "resp_s0", owner=STRANGER) == [True]


# -- event logs ---------------------------------------------------------------------------


async def test_a_finished_log_replays_from_any_point(store_url: str) -> None:
    async with opened(store_url) as state:
        produced = Produced("resp_log", deltas=100)
        await record_log(state, "resp_log", produced)
        everything = await state.logs.open("resp_log", owner=OWNER, starting_after=-1)
        assert everything is not None
        frames = await read_all(everything)
        assert frames == produced.frames
        check_stream([decode_event(frame) for frame in frames])

        middle = await state.logs.open("resp_log", owner=OWNER, starting_after=49)
        assert middle is not None
        assert await read_all(middle) == produced.frames[50:]

        last = len(produced.frames) - 1
        at_end = await state.logs.open("resp_log", owner=OWNER, starting_after=last)
        assert at_end is not None
        assert await read_all(at_end) == []


async def test_logs_are_scoped_to_their_owner_and_can_be_deleted(store_url: str) -> None:
    async with opened(store_url) as state:
        await record_log(state, "resp_log", Produced("resp_log", deltas=3))
        assert await state.logs.open("resp_log", owner=STRANGER, starting_after=-1) is None
        assert await state.logs.open("resp_unknown", owner=OWNER, starting_after=-1) is None
        await state.logs.delete("resp_log", owner=OWNER)
        assert await state.logs.open("resp_log", owner=OWNER, starting_after=-1) is None


async def test_logs_keep_only_the_newest_events(store_url: str) -> None:
    async with opened(store_url, replay_events=50) as state:
        produced = Produced("resp_long", deltas=500)
        log = EventLog(max_events=50, max_bytes=1 << 30)
        for frame in produced.frames:
            log.append(frame)
        log.close()
        produced.log = log
        await record_log(state, "resp_long", produced, batch=10)
        with pytest.raises(SubscriberLagged):
            await state.logs.open("resp_long", owner=OWNER, starting_after=-1)
        total = len(produced.frames)
        tail = await state.logs.open("resp_long", owner=OWNER, starting_after=total - 20)
        assert tail is not None
        assert await read_all(tail) == produced.frames[total - 19 :]


async def test_finished_logs_are_dropped_after_their_retention(store_url: str) -> None:
    async with opened(store_url, stream_retention_s=0.3) as state:
        await record_log(state, "resp_log", Produced("resp_log", deltas=3))
        assert await state.logs.open("resp_log", owner=OWNER, starting_after=-1) is not None
        with trio.fail_after(10):
            while True:
                await state.logs.expire()
                reader = await state.logs.open("resp_log", owner=OWNER, starting_after=-1)
                if reader is None:
                    break
                reader.close()
                await trio.sleep(0.05)


async def test_retention_is_bounded_by_count(store_url: str) -> None:
    async with opened(store_url, max_retained_streams=3) as state:
        for index in range(6):
            await record_log(state, f"resp_{index}", Produced(f"resp_{index}", deltas=2))
        held = [
            await state.logs.open(f"resp_{index}", owner=OWNER, starting_after=-1)
            for index in range(6)
        ]
        assert [reader is not None for reader in held] == [False] * 3 + [True] * 3
        assert state.logs.statistics().retained_streams == 3


async def test_an_interrupted_log_ends_with_the_recovered_terminal_event(store_url: str) -> None:
    async with opened(store_url) as state:
        produced = Produced("resp_cut", deltas=20, finish=False)
        record = _record("resp_cut", status="in_progress", replica="gone-replica", background=True)
        await state.store.put(record)
        await record_log(state, "resp_cut", produced, finish=False)
        await state.logs.terminate(record.interrupted())
        reader = await state.logs.open("resp_cut", owner=OWNER, starting_after=-1)
        if not state.logs.live:
            # The memory backend holds finished rings only; an interrupted job's ring
            # died with its process.
            assert reader is None
            return
        assert reader is not None
        events = [decode_event(frame) for frame in await read_all(reader)]
        assert [event["sequence_number"] for event in events] == list(range(len(events)))
        assert len(events) == len(produced.frames) + 1
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "server_restarted"


async def test_a_live_log_is_followed_as_it_grows(store_url: str) -> None:
    async with opened(store_url) as state:
        if not state.logs.live:
            # In memory, live readers follow the job's own ring, not the backend.
            assert state.kind == "memory"
            return
        produced = Produced("resp_live", deltas=60)
        frames = produced.frames
        await state.logs.append("resp_live", frames[:10], first=0, owner=OWNER)
        reader = await state.logs.open("resp_live", owner=OWNER, starting_after=-1)
        assert reader is not None
        received: list[bytes] = []

        async def write_the_rest() -> None:
            for first in range(10, len(frames), 10):
                await trio.sleep(0.01)
                await state.logs.append(
                    "resp_live", frames[first : first + 10], first=first, owner=OWNER
                )
            await state.logs.finish("resp_live", produced.log, owner=OWNER)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_the_rest)
            received = await read_all(reader)
        assert received == frames


# -- item lookup (item_reference) -----------------------------------------------------------


async def test_items_of_finished_records_are_found_by_id(store_url: str) -> None:
    async with opened(store_url) as state:
        store = state.store
        await store.put(_record("resp_1"))
        assert await store.find_item("in_resp_1", owner=OWNER) == {
            "type": "message",
            "id": "in_resp_1",
            "role": "user",
        }
        output = await store.find_item("msg_resp_1", owner=OWNER)
        assert output is not None and output["type"] == "message"
        assert await store.find_item("msg_resp_1", owner=STRANGER) is None
        assert await store.find_item("msg_unknown", owner=OWNER) is None
        await store.delete("resp_1", owner=OWNER)
        assert await store.find_item("msg_resp_1", owner=OWNER) is None


async def test_items_of_evicted_records_are_not_found(store_url: str) -> None:
    async with opened(store_url, max_stored_responses=1) as state:
        await state.store.put(_record("resp_1"))
        await state.store.put(_record("resp_2"))
        assert await state.store.find_item("msg_resp_1", owner=OWNER) is None
        assert await state.store.find_item("msg_resp_2", owner=OWNER) is not None


# -- conversations ----------------------------------------------------------------------------


def _conversation(conversation_id: str = "conv_1", owner: str | None = OWNER) -> StoredConversation:
    return StoredConversation(
        {"id": conversation_id, "object": "conversation", "created_at": 1, "metadata": {}}, owner
    )


def _item(item_id: str, text: str = "hi") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


async def test_conversations_round_trip_scoped_to_their_owner(store_url: str) -> None:
    async with opened(store_url) as state:
        conversations = state.conversations
        await conversations.create(_conversation(), [_item("msg_a"), _item("msg_b")])
        got = await conversations.get("conv_1", owner=OWNER)
        assert got is not None and got.conversation["id"] == "conv_1"
        assert await conversations.get("conv_1", owner=STRANGER) is None
        assert await conversations.items("conv_1", owner=STRANGER) is None
        assert [i["id"] for i in await conversations.items("conv_1", owner=OWNER) or []] == [
            "msg_a",
            "msg_b",
        ]
        updated = await conversations.update("conv_1", {"k": "v"}, owner=OWNER)
        assert updated is not None and updated.conversation["metadata"] == {"k": "v"}
        got = await conversations.get("conv_1", owner=OWNER)
        assert got is not None and got.conversation["metadata"] == {"k": "v"}
        assert await conversations.update("conv_1", {}, owner=STRANGER) is None
        assert not await conversations.delete("conv_1", owner=STRANGER)
        assert await conversations.delete("conv_1", owner=OWNER)
        assert await conversations.get("conv_1", owner=OWNER) is None
        assert not await conversations.delete("conv_1", owner=OWNER)


async def test_conversation_items_are_added_found_and_deleted(store_url: str) -> None:
    async with opened(store_url) as state:
        conversations = state.conversations
        await conversations.create(_conversation(), [_item("msg_a")])
        added = await conversations.add_items(
            "conv_1", [_item("msg_a", "again"), _item("msg_c")], owner=OWNER
        )
        assert added == [_item("msg_c")]  # ids it holds already are left out
        assert await conversations.add_items("conv_2", [_item("msg_d")], owner=OWNER) is None
        assert await conversations.add_items("conv_1", [_item("msg_d")], owner=STRANGER) is None
        with pytest.raises(ConversationFull) as full:
            await conversations.add_items(
                "conv_1", [_item("msg_x"), _item("msg_y")], owner=OWNER, max_items=3
            )
        assert full.value.held == 2
        assert await conversations.get_item("conv_1", "msg_c", owner=OWNER) == _item("msg_c")
        assert await conversations.get_item("conv_1", "msg_c", owner=STRANGER) is None
        assert await conversations.find_item("msg_c", owner=OWNER) == _item("msg_c")
        assert await conversations.find_item("msg_c", owner=STRANGER) is None
        assert await conversations.delete_item("conv_1", "msg_a", owner=OWNER)
        assert not await conversations.delete_item("conv_1", "msg_a", owner=OWNER)
        assert [i["id"] for i in await conversations.items("conv_1", owner=OWNER) or []] == [
            "msg_c"
        ]
        assert await conversations.get_item("conv_1", "msg_a", owner=OWNER) is None


async def test_a_conversation_lock_has_one_holder_until_released_or_expired(
    store_url: str,
) -> None:
    async with opened(store_url) as state:
        conversations = state.conversations
        await conversations.create(_conversation(), [])
        assert await conversations.lock("conv_1", "resp_a", owner=OWNER, lease_s=60) is True
        assert await conversations.lock("conv_1", "resp_b", owner=OWNER, lease_s=60) is False
        assert await conversations.lock("conv_1", "resp_a", owner=OWNER, lease_s=60) is True
        assert await conversations.lock("conv_1", "resp_b", owner=STRANGER, lease_s=60) is None
        await conversations.unlock(
            "conv_1", "resp_b", owner=OWNER
        )  # not the holder: nothing changes
        assert await conversations.lock("conv_1", "resp_b", owner=OWNER, lease_s=60) is False
        await conversations.unlock("conv_1", "resp_a", owner=OWNER)
        assert await conversations.lock("conv_1", "resp_b", owner=OWNER, lease_s=0.05) is True
        await trio.sleep(0.2)  # the lease runs out by the store's own clock
        assert await conversations.lock("conv_1", "resp_c", owner=OWNER, lease_s=60) is True


async def test_conversations_are_bounded_least_recently_used_first(store_url: str) -> None:
    async with opened(store_url, max_stored_responses=2) as state:
        conversations = state.conversations
        for name in ("conv_1", "conv_2"):
            await conversations.create(_conversation(name), [_item(f"msg_{name}")])
        assert await conversations.get("conv_1", owner=OWNER) is not None  # used: kept
        await conversations.create(_conversation("conv_3"), [])
        assert await conversations.get("conv_2", owner=OWNER) is None
        assert await conversations.find_item("msg_conv_2", owner=OWNER) is None
        assert await conversations.get("conv_1", owner=OWNER) is not None
        assert await conversations.get("conv_3", owner=OWNER) is not None


async def test_one_owner_cannot_evict_anothers_conversations(store_url: str) -> None:
    async with opened(store_url, max_stored_responses=2, api_keys=TWO_KEYS) as state:
        conversations = state.conversations
        await conversations.create(_conversation("conv_a", owner=STRANGER), [])
        for index in range(3):
            await conversations.create(_conversation(f"conv_{index}"), [])
        assert await conversations.get("conv_a", owner=STRANGER) is not None
        assert await conversations.get("conv_2", owner=OWNER) is not None
        assert await conversations.get("conv_0", owner=OWNER) is None


async def test_conversations_expire_after_their_last_use(store_url: str) -> None:
    async with opened(store_url, store_ttl_s=0.3) as state:
        conversations = state.conversations
        await conversations.create(_conversation(), [_item("msg_a")])
        await trio.sleep(0.5)  # longer than the TTL, without a use in between
        await conversations.expire()
        assert await conversations.get("conv_1", owner=OWNER) is None
        assert await conversations.items("conv_1", owner=OWNER) is None
        assert await conversations.find_item("msg_a", owner=OWNER) is None


async def test_a_conversation_is_bounded_by_bytes(store_url: str) -> None:
    async with opened(store_url) as state:
        conversations = state.conversations
        await conversations.create(_conversation(), [_item("msg_a", "x" * 100)])
        held = await conversations.items("conv_1", owner=OWNER)
        assert held is not None
        size = conversation_bytes(_conversation().conversation, held)
        big = _item("msg_b", "y" * 100)
        with pytest.raises(ConversationFull) as full:
            await conversations.add_items("conv_1", [big], owner=OWNER, max_bytes=size + 50)
        assert full.value.held == 1 and full.value.held_bytes == size
        assert [i["id"] for i in await conversations.items("conv_1", owner=OWNER) or []] == [
            "msg_a"
        ]
        bound = size + len(encoded(big).encode())
        assert await conversations.add_items("conv_1", [big], owner=OWNER, max_bytes=bound) == [big]


async def test_removed_conversation_items_are_not_found(store_url: str) -> None:
    async with opened(store_url) as state:
        conversations = state.conversations
        await conversations.create(_conversation("conv_1"), [_item("msg_a", "older")])
        await conversations.create(_conversation("conv_2"), [_item("msg_a", "newer")])
        assert await conversations.find_item("msg_a", owner=OWNER) == _item("msg_a", "newer")
        assert await conversations.delete_item("conv_2", "msg_a", owner=OWNER)
        assert await conversations.find_item("msg_a", owner=OWNER) == _item("msg_a", "older")
        assert await conversations.delete("conv_1", owner=OWNER)
        assert await conversations.find_item("msg_a", owner=OWNER) is None
        # Another owner's item with the same id is neither found nor in the way.
        await conversations.create(_conversation("conv_3", owner=STRANGER), [_item("msg_a")])
        assert await conversations.find_item("msg_a", owner=OWNER) is None
        assert await conversations.find_item("msg_a", owner=STRANGER) == _item("msg_a")
