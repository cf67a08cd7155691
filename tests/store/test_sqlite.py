"""The ``sqlite:///PATH`` backend: what only it does (the file, the lock, restarts).

The behaviour every backend shares is in ``test_contract.py``. These tests use real
files under ``tmp_path`` and a fake wall clock where time matters.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_responses import Config
from trio_responses.background.event_log import EventLog, SubscriberLagged
from trio_responses.background.subscription import Subscription
from trio_responses.protocol.builder import ResponseBuilder, request_echo
from trio_responses.protocol.codec import decode_event, is_terminal_frame
from trio_responses.protocol.request import parse_create_request
from trio_responses.store.base import State, StoredResponse, StoreError
from trio_responses.store.open import open_state
from trio_responses.store.sqlite import SCHEMA_VERSION, open_sqlite_state
from trio_responses.store.webhooks import StoredEndpoint

OWNER = "owner-a"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "responses.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@asynccontextmanager
async def opened(
    path: str, clock: Callable[[], float] = time.time, **config: Any
) -> AsyncIterator[State]:
    async with open_sqlite_state(path, Config(**config), clock=clock) as state:
        yield state


def builder_for(
    response_id: str, frames: list[bytes], *, background: bool = True
) -> ResponseBuilder:
    parsed = parse_create_request({"model": "m", "background": background})
    return ResponseBuilder(
        response_id=response_id,
        model="m",
        created_at=1.0,
        echo=request_echo(parsed),
        background=parsed.background,
        emit=frames.append,
    )


def response_frames(response_id: str, deltas: int = 3) -> tuple[list[bytes], dict[str, Any]]:
    """The frames of a finished background response with ``deltas`` text deltas, and
    its final Response object."""
    frames: list[bytes] = []
    builder = builder_for(response_id, frames)
    builder.start()
    builder.mark_in_progress()
    builder.open_message()
    for i in range(deltas):
        builder.delta(f"tok{i} ")
    builder.close_item()
    builder.finish("completed", now=2.0)
    return frames, builder.snapshot()


def running_frames(response_id: str) -> tuple[list[bytes], dict[str, Any]]:
    """The first frames of a background response still generating, and its snapshot."""
    frames: list[bytes] = []
    builder = builder_for(response_id, frames)
    builder.start()
    builder.mark_in_progress()
    builder.open_message()
    builder.delta("partial")
    return frames, builder.snapshot()


def record(response: dict[str, Any], *, owner: str | None = OWNER, **kw: Any) -> StoredResponse:
    return StoredResponse(
        response=response,
        input_items=[{"id": "msg_1", "type": "message", "role": "user", "content": "héllo"}],
        owner=owner,
        **kw,
    )


def finished_response(response_id: str) -> dict[str, Any]:
    return response_frames(response_id, deltas=1)[1]


async def store_log(
    state: State, response_id: str, frames: list[bytes], *, batch: int = 2, finish: bool = True
) -> None:
    for start in range(0, len(frames), batch):
        await state.logs.append(
            response_id, frames[start : start + batch], first=start, owner=OWNER
        )
    if finish:
        await state.logs.finish(response_id, EventLog(max_events=1, max_bytes=1), owner=OWNER)


async def read_all(subscription: Subscription) -> list[bytes]:
    frames: list[bytes] = []
    with subscription:
        with trio.fail_after(5):
            while batch := await subscription.receive_frames():
                frames.extend(batch)
    return frames


async def replay(state: State, response_id: str, starting_after: int = -1) -> list[bytes]:
    subscription = await state.logs.open(response_id, owner=OWNER, starting_after=starting_after)
    assert subscription is not None
    return await read_all(subscription)


# -- records ---------------------------------------------------------------------------


async def test_record_round_trip_and_owner_scoping(db_path: str, clock: FakeClock) -> None:
    async with opened(db_path, clock) as state:
        assert state.kind == "sqlite" and state.durable
        stored = record(finished_response("resp_1"))
        await state.store.put(stored)
        got = await state.store.get("resp_1", owner=OWNER)
        assert got == stored
        assert got is not None and got.updated_at == clock.now
        assert got.input_items[0]["content"] == "héllo"
        assert await state.store.get("resp_1", owner="someone-else") is None
        assert await state.store.get("resp_1", owner=None) is None
        assert await state.store.get("resp_unknown", owner=OWNER) is None
        assert not await state.store.delete("resp_1", owner="someone-else")
        assert await state.store.get("resp_1", owner=OWNER) is not None
        assert await state.store.delete("resp_1", owner=OWNER)
        assert not await state.store.delete("resp_1", owner=OWNER)
        assert await state.store.get("resp_1", owner=OWNER) is None

        anonymous = record(finished_response("resp_2"), owner=None)
        await state.store.put(anonymous)
        assert await state.store.get("resp_2", owner=None) == anonymous
        assert await state.store.get("resp_2", owner=OWNER) is None


async def test_unencodable_record_is_a_store_error(db_path: str) -> None:
    async with opened(db_path) as state:
        response = {**finished_response("resp_nan"), "temperature": float("nan")}
        with pytest.raises(StoreError, match="JSON"):
            await state.store.put(record(response))
        assert await state.store.get("resp_nan", owner=OWNER) is None


async def test_finished_records_expire_after_their_ttl(db_path: str, clock: FakeClock) -> None:
    async with opened(db_path, clock, store_ttl_s=100.0) as state:
        await state.store.put(record(finished_response("resp_old")))
        running = record({**finished_response("resp_run"), "status": "in_progress"})
        await state.store.put(running)
        clock.now += 60
        await state.store.put(record(finished_response("resp_new")))
        clock.now += 40
        assert await state.store.get("resp_old", owner=OWNER) is None
        assert await state.store.get("resp_new", owner=OWNER) is not None
        assert await state.store.expire() == 1
        assert await state.store.expire() == 0
        clock.now += 10_000
        assert await state.store.expire() == 1
        # Running records never expire.
        assert await state.store.get("resp_run", owner=OWNER) == running


async def test_finished_records_are_bounded_oldest_first(db_path: str, clock: FakeClock) -> None:
    async with opened(db_path, clock, max_stored_responses=3) as state:
        for i in range(3):
            running = record({**finished_response(f"resp_run{i}"), "status": "queued"})
            await state.store.put(running)
        for i in range(5):
            await state.store.put(record(finished_response(f"resp_{i}")))
            clock.now += 1
        present = [
            i for i in range(5) if await state.store.get(f"resp_{i}", owner=OWNER) is not None
        ]
        assert present == [2, 3, 4]
        for i in range(3):
            assert await state.store.get(f"resp_run{i}", owner=OWNER) is not None
        # A running record that finishes counts from then on; replacing one doesn't grow it.
        await state.store.put(record(finished_response("resp_run0")))
        await state.store.put(record(finished_response("resp_run0")))
        assert await state.store.get("resp_2", owner=OWNER) is None
        assert await state.store.get("resp_run0", owner=OWNER) is not None
        assert await state.store.get("resp_3", owner=OWNER) is not None


async def test_record_bound_counts_survive_a_restart(db_path: str, clock: FakeClock) -> None:
    async with opened(db_path, clock, max_stored_responses=3) as state:
        for i in range(3):
            await state.store.put(record(finished_response(f"resp_{i}")))
            clock.now += 1
    async with opened(db_path, clock, max_stored_responses=2) as state:
        await state.store.put(record(finished_response("resp_3")))
        present = [
            i for i in range(4) if await state.store.get(f"resp_{i}", owner=OWNER) is not None
        ]
        assert present == [2, 3]


# -- the file: one process, restarts, failures --------------------------------------------


async def test_a_second_open_is_refused_until_the_first_closes(db_path: str) -> None:
    async with opened(db_path):
        with pytest.raises(StoreError, match="another trio-responses process"):
            async with opened(db_path):
                pass  # pragma: no cover
    async with opened(db_path) as state:
        await state.store.put(record(finished_response("resp_1")))


async def test_open_failures_are_store_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open SQLite store"):
        async with opened(str(tmp_path / "missing-dir" / "x.db")):
            pass  # pragma: no cover
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database file" * 200)
    with pytest.raises(StoreError, match="not a trio-responses database"):
        async with opened(str(corrupt)):
            pass  # pragma: no cover
    # The failed opens released their locks.
    corrupt.unlink()
    async with opened(str(corrupt)):
        pass


async def test_no_shared_memory_wal_index(db_path: str) -> None:
    # Exclusive locking: the WAL index lives in this process's heap, never in a mapped
    # PATH-shm (a fault on a mapped file is a SIGBUS: test_sqlite_faults.py).
    async with opened(db_path) as state:
        await state.store.put(record(finished_response("resp_1")))
        assert await trio.Path(db_path + "-wal").exists()
        assert not await trio.Path(db_path + "-shm").exists()


@pytest.mark.parametrize("fault", ["deleted", "replaced"])
async def test_a_file_gone_from_its_path_refuses_writes(
    tmp_path: Path, db_path: str, fault: str
) -> None:
    other = str(tmp_path / "other.db")
    async with opened(db_path) as state:
        await state.store.put(record(finished_response("resp_1")))
        assert state.fault() is None
        if fault == "deleted":
            os.unlink(db_path)
        else:
            sqlite3.connect(other).close()
            os.replace(other, db_path)
        with pytest.raises(StoreError, match=f"{db_path} was {fault}") as refused:
            await state.store.put(record(finished_response("resp_2")))
        assert state.fault() == str(refused.value)
        with pytest.raises(StoreError, match=fault):
            await state.logs.append("resp_2", [b"data: {}\n\n"], first=0, owner=OWNER)
        # Reads answer from the open file.
        assert await state.store.get("resp_1", owner=OWNER) is not None
        assert await state.store.get("resp_2", owner=OWNER) is None


async def test_a_file_put_back_is_written_again(tmp_path: Path, db_path: str) -> None:
    aside = str(tmp_path / "aside.db")
    async with opened(db_path) as state:
        await state.store.put(record(finished_response("resp_1")))
        os.rename(db_path, aside)
        with pytest.raises(StoreError, match="deleted"):
            await state.store.put(record(finished_response("resp_2")))
        # The WAL was moved into the file when the fault was seen: none is left beside
        # whatever the path names meanwhile.
        assert (await trio.Path(db_path + "-wal").stat()).st_size == 0
        os.rename(aside, db_path)
        await state.store.put(record(finished_response("resp_2")))
        assert state.fault() is None
    async with opened(db_path) as state:
        assert await state.store.get("resp_2", owner=OWNER) is not None


async def test_operations_after_close_are_store_errors(db_path: str) -> None:
    async with opened(db_path) as state:
        pass
    with pytest.raises(StoreError):
        await state.store.get("resp_1", owner=OWNER)


async def test_records_and_logs_survive_a_restart(db_path: str, clock: FakeClock) -> None:
    frames, final = response_frames("resp_1", deltas=5)
    async with opened(db_path, clock) as state:
        await state.store.put(record(final))
        await store_log(state, "resp_1", frames, batch=3)
        stats = state.logs.statistics()
        assert stats.retained_streams == 1
        assert stats.retained_bytes == sum(map(len, frames))
    async with opened(db_path, clock) as state:
        assert state.logs.statistics() == stats
        assert await state.store.get("resp_1", owner=OWNER) == record(final)
        assert await replay(state, "resp_1") == frames
        assert await replay(state, "resp_1", starting_after=4) == frames[5:]
        assert await replay(state, "resp_1", starting_after=len(frames) - 1) == []
        assert await state.logs.open("resp_1", owner="someone-else", starting_after=-1) is None
        assert await state.logs.open("resp_2", owner=OWNER, starting_after=-1) is None
        await state.logs.delete("resp_1", owner=OWNER)
        assert await state.logs.open("resp_1", owner=OWNER, starting_after=-1) is None
        assert state.logs.statistics().retained_streams == 0


async def test_recovery_after_restart(db_path: str, clock: FakeClock) -> None:
    frames, snapshot = running_frames("resp_dead")
    async with opened(db_path, clock, store_ttl_s=100.0) as first:
        await first.store.put(record(snapshot, replica=first.control.replica))
        await store_log(first, "resp_dead", frames, finish=False)
    # The first process is gone; its job never finished.
    async with opened(db_path, clock, store_ttl_s=100.0) as state:
        mine = record(
            {**finished_response("resp_mine"), "status": "in_progress"},
            replica=state.control.replica,
        )
        await state.store.put(mine)

        # A reader of the unfinished log waits (briefly) for more, then sees the end.
        subscription = await state.logs.open("resp_dead", owner=OWNER, starting_after=-1)
        assert subscription is not None
        assert await subscription.receive_frames() == frames
        with trio.move_on_after(0.2) as waiting:
            await subscription.receive_frames()
        assert waiting.cancelled_caught

        recovered = await state.store.recover_interrupted()
        assert [r.id for r in recovered] == ["resp_dead"]
        failed = recovered[0]
        assert failed.status == "failed"
        assert failed.response["error"]["code"] == "server_restarted"
        assert failed.replica is None
        assert await state.store.get("resp_dead", owner=OWNER) == failed
        # Recovery ended the log in the same transaction; terminate() has nothing to add.
        await state.logs.terminate(failed)

        tail = await read_all(subscription)
        assert len(tail) == 1 and is_terminal_frame(tail[0])
        everything = await replay(state, "resp_dead")
        events = [decode_event(frame) for frame in everything]
        assert [e["sequence_number"] for e in events] == list(range(len(frames) + 1))
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "server_restarted"
        assert state.logs.statistics().retained_streams == 1

        # Later calls leave this process's own running jobs alone.
        assert await state.store.recover_interrupted() == []
        assert await state.store.get("resp_mine", owner=OWNER) == mine
        # The failed record is finished now: it expires like any other.
        clock.now += 100
        assert await state.store.get("resp_dead", owner=OWNER) is None


async def test_terminate_ends_an_unfinished_log_once(db_path: str) -> None:
    frames, snapshot = running_frames("resp_1")
    async with opened(db_path) as state:
        await store_log(state, "resp_1", frames, batch=3, finish=False)
        failed = record(snapshot).interrupted()
        await state.logs.terminate(failed)
        await state.logs.terminate(failed)
        events = [decode_event(frame) for frame in await replay(state, "resp_1")]
        assert [e["sequence_number"] for e in events] == list(range(len(frames) + 1))
        assert [e["type"] for e in events].count("response.failed") == 1
        assert events[-1]["response"]["status"] == "failed"
        assert state.logs.statistics().retained_streams == 1
        # No log: nothing to do.
        await state.logs.terminate(record(finished_response("resp_2")))
        assert await state.logs.open("resp_2", owner=OWNER, starting_after=-1) is None


async def test_terminate_completes_a_log_that_already_ends_with_its_terminal_event(
    db_path: str,
) -> None:
    frames, final = response_frames("resp_1")
    async with opened(db_path) as state:
        # The process died between the last append and finish().
        await store_log(state, "resp_1", frames, finish=False)
        await state.logs.terminate(record(final))
        assert await replay(state, "resp_1") == frames


async def test_open_ends_the_logs_a_dead_process_left_unfinished(db_path: str) -> None:
    done_frames, done = response_frames("resp_done")
    cut_frames, _ = running_frames("resp_cut")
    async with opened(db_path) as first:
        # Died between the terminal append and finish():
        await first.store.put(record(done))
        await store_log(first, "resp_done", done_frames, finish=False)
        # Died after the final record was written, before its terminal frame was:
        failed = record(finished_response("resp_cut")).interrupted()
        await first.store.put(failed)
        await store_log(first, "resp_cut", cut_frames, finish=False)
        # A log whose record is gone:
        await store_log(first, "resp_gone", running_frames("resp_gone")[0], finish=False)
        assert first.logs.statistics().retained_streams == 0
    async with opened(db_path) as state:
        assert state.logs.statistics().retained_streams == 2
        assert await replay(state, "resp_done") == done_frames
        events = [decode_event(frame) for frame in await replay(state, "resp_cut")]
        assert [e["sequence_number"] for e in events] == list(range(len(cut_frames) + 1))
        assert events[-1]["type"] == "response.failed"
        assert await state.logs.open("resp_gone", owner=OWNER, starting_after=-1) is None
        assert await state.store.recover_interrupted() == []


async def test_open_state_dispatches_sqlite_urls(db_path: str) -> None:
    async with open_state(f"sqlite:///{db_path}", Config()) as state:
        assert state.kind == "sqlite"
        await state.store.put(record(finished_response("resp_1")))
    async with opened(db_path) as state:
        assert await state.store.get("resp_1", owner=OWNER) is not None


_KILLED_CHILD = """
import os, signal, sys, trio
from trio_responses import Config
from trio_responses.store.base import StoredResponse
from trio_responses.store.sqlite import open_sqlite_state

async def main():
    async with open_sqlite_state(sys.argv[1], Config()) as state:
        response = {"id": "resp_killed", "status": "in_progress", "background": True}
        await state.store.put(StoredResponse(response, [], None, state.control.replica))
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

trio.run(main)
"""


async def test_a_killed_process_leaves_the_file_usable(db_path: str) -> None:
    result = await trio.run_process(
        [sys.executable, "-c", textwrap.dedent(_KILLED_CHILD), db_path],
        capture_stdout=True,
        check=False,
        env={**os.environ},
    )
    assert result.returncode == -signal.SIGKILL
    assert result.stdout == b"ready\n"
    async with opened(db_path) as state:
        recovered = await state.store.recover_interrupted()
        assert [r.status for r in recovered] == ["failed"]


# -- event logs ----------------------------------------------------------------------------


async def test_logs_keep_about_replay_events(db_path: str) -> None:
    frames, _ = response_frames("resp_1", deltas=60)
    async with opened(db_path, replay_events=10) as state:
        await store_log(state, "resp_1", frames, batch=5)
        with pytest.raises(SubscriberLagged) as lagged:
            await state.logs.open("resp_1", owner=OWNER, starting_after=-1)
        oldest = lagged.value.oldest
        assert len(frames) - 15 <= oldest <= len(frames) - 10
        assert lagged.value.wanted == 0
        assert await replay(state, "resp_1", starting_after=oldest - 1) == frames[oldest:]


async def test_logs_keep_about_replay_bytes(db_path: str) -> None:
    frames, _ = response_frames("resp_1", deltas=60)
    budget = sum(map(len, frames[-10:]))
    async with opened(db_path, replay_bytes=budget) as state:
        await store_log(state, "resp_1", frames, batch=1)
        with pytest.raises(SubscriberLagged) as lagged:
            await state.logs.open("resp_1", owner=OWNER, starting_after=5)
        oldest = lagged.value.oldest
        assert sum(map(len, frames[oldest:])) <= budget
        assert await replay(state, "resp_1", starting_after=oldest - 1) == frames[oldest:]
        assert state.logs.statistics().retained_bytes == sum(map(len, frames[oldest:]))


async def test_a_reader_that_falls_behind_the_trim_is_told(db_path: str) -> None:
    frames, _ = response_frames("resp_1", deltas=60)
    async with opened(db_path, replay_events=10) as state:
        await store_log(state, "resp_1", frames[:8], batch=8, finish=False)
        subscription = await state.logs.open("resp_1", owner=OWNER, starting_after=-1)
        assert subscription is not None
        assert len(await subscription.receive_frames()) == 8
        await store_log(state, "resp_1", frames, batch=8)  # frames 8… appended, 0… trimmed
        with pytest.raises(SubscriberLagged):
            await subscription.receive_frames()


async def test_retried_appends_are_not_duplicated(db_path: str) -> None:
    frames, _ = response_frames("resp_1")
    async with opened(db_path) as state:
        await state.logs.append("resp_1", frames[:3], first=0, owner=OWNER)
        await state.logs.append("resp_1", frames[:4], first=0, owner=OWNER)
        await state.logs.append("resp_1", frames[3:], first=3, owner=OWNER)
        await state.logs.finish("resp_1", EventLog(max_events=1, max_bytes=1), owner=OWNER)
        assert await replay(state, "resp_1") == frames


async def test_complete_logs_are_bounded_by_count(db_path: str, clock: FakeClock) -> None:
    async with opened(db_path, clock, max_retained_streams=2) as state:
        for i in range(3):
            await store_log(state, f"resp_{i}", response_frames(f"resp_{i}")[0])
            clock.now += 1
        assert await state.logs.open("resp_0", owner=OWNER, starting_after=-1) is None
        for i in (1, 2):
            assert await state.logs.open(f"resp_{i}", owner=OWNER, starting_after=-1)
        assert state.logs.statistics().retained_streams == 2
        # A running log does not count.
        frames, _ = running_frames("resp_run")
        await store_log(state, "resp_run", frames, finish=False)
        assert await state.logs.open("resp_1", owner=OWNER, starting_after=-1)


async def test_complete_logs_are_bounded_by_bytes(db_path: str, clock: FakeClock) -> None:
    sizes = {}
    logs = {}
    for i in range(3):
        logs[i] = response_frames(f"resp_{i}")[0]
        sizes[i] = sum(map(len, logs[i]))
    async with opened(db_path, clock, retained_stream_bytes=sizes[1] + sizes[2]) as state:
        for i in range(3):
            await store_log(state, f"resp_{i}", logs[i])
            clock.now += 1
        assert await state.logs.open("resp_0", owner=OWNER, starting_after=-1) is None
        assert state.logs.statistics().retained_bytes == sizes[1] + sizes[2]
    # The newest log stays even when it alone is over the limit.
    async with opened(db_path, clock, retained_stream_bytes=10) as state:
        big = response_frames("resp_big", deltas=50)[0]
        await store_log(state, "resp_big", big)
        assert await replay(state, "resp_big") == big
        assert state.logs.statistics().retained_streams == 1


async def test_complete_logs_expire(db_path: str, clock: FakeClock) -> None:
    async with opened(db_path, clock, stream_retention_s=10.0) as state:
        await store_log(state, "resp_0", response_frames("resp_0")[0])
        clock.now += 5
        await store_log(state, "resp_1", response_frames("resp_1")[0])
        frames, _ = running_frames("resp_run")
        await store_log(state, "resp_run", frames, finish=False)
        clock.now += 5
        assert await state.logs.expire() == 1
        assert await state.logs.open("resp_0", owner=OWNER, starting_after=-1) is None
        assert await state.logs.open("resp_1", owner=OWNER, starting_after=-1) is not None
        clock.now += 1000
        assert await state.logs.expire() == 1
        assert state.logs.statistics().retained_streams == 0
        # An unfinished log is not the retention's to drop.
        assert await state.logs.open("resp_run", owner=OWNER, starting_after=-1) is not None


async def test_resume_from_the_middle_of_a_long_log_reads_a_bounded_batch(db_path: str) -> None:
    # How fast: bench/resume.py and bench/state.py (a test bounds work, not time).
    frames, _ = response_frames("resp_long", deltas=20_000)
    assert len(frames) > 20_000
    async with opened(db_path) as state:
        await store_log(state, "resp_long", frames, batch=64)
        middle = len(frames) // 2
        subscription = await state.logs.open("resp_long", owner=OWNER, starting_after=middle)
        assert subscription is not None
        with subscription:
            first = await subscription.receive_frames()
        assert decode_event(first[0])["sequence_number"] == middle + 1
        assert first == frames[middle + 1 : middle + 1 + len(first)]
        # Batches are bounded; reading on gives the rest, then the end.
        assert sum(map(len, first)) <= 1 << 18
        assert await replay(state, "resp_long", starting_after=middle) == frames[middle + 1 :]


def _record(response_id: str, *, status: str = "completed", background: bool) -> StoredResponse:
    response = {"id": response_id, "status": status, "background": background, "output": []}
    return StoredResponse(response, [], OWNER, replica=None)


def _webhook_endpoint(owner: str | None = OWNER) -> StoredEndpoint:
    return StoredEndpoint(
        {
            "id": "wh_1",
            "object": "webhook_endpoint",
            "created_at": 1,
            "updated_at": 1,
            "name": "hook",
            "url": "https://hooks.example.com/1",
            "event_types": ["response.completed"],
            "signing_secret_hint": "whsec_...abcd",
        },
        owner,
        "sealed-secret",
    )


async def test_a_file_of_schema_4_gets_the_webhook_tables(db_path: str) -> None:
    async with opened(db_path) as state:
        await state.store.put(_record("resp_old", background=True))
    db = sqlite3.connect(db_path)
    db.executescript(
        "DROP TABLE webhook_deliveries; DROP TABLE webhook_endpoints; PRAGMA user_version = 4;"
    )
    db.close()
    async with opened(db_path) as state:
        assert await state.store.get("resp_old", owner=OWNER) is not None
        await state.webhooks.put_endpoint(_webhook_endpoint())
        await state.store.put(_record("resp_new", status="in_progress", background=True))
        await state.store.put(_record("resp_new", background=True))
        [delivery] = await state.webhooks.deliveries(limit=10)
        assert delivery.key == ("evt_new", "wh_1")
    db = sqlite3.connect(db_path)
    (version,) = db.execute("PRAGMA user_version").fetchone()
    db.close()
    assert version == SCHEMA_VERSION == 5


async def test_a_final_write_rolled_back_makes_no_delivery(db_path: str) -> None:
    async with opened(db_path):
        pass
    # A write of this record fails inside its transaction, after its deliveries.
    db = sqlite3.connect(db_path)
    db.executescript(
        "CREATE TRIGGER refuse BEFORE INSERT ON responses"
        " WHEN NEW.id = 'resp_1' AND NEW.status = 'completed'"
        " BEGIN SELECT RAISE(ABORT, 'refused'); END;"
    )
    db.close()
    async with opened(db_path) as state:
        await state.webhooks.put_endpoint(_webhook_endpoint())
        await state.store.put(_record("resp_1", status="in_progress", background=True))
        with pytest.raises(StoreError, match="refused"):
            await state.store.put(_record("resp_1", background=True))
        assert await state.webhooks.deliveries(limit=10) == []
        assert await state.webhooks.next_due() is None
