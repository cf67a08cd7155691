"""`FileStore`'s contract: the same tests against memory://, sqlite:/// and redis://.

Each test opens the backend named by the ``store_url`` fixture (an empty one per
test; Redis is a real ``redis-server``) through `open_state`, as the server does.
"""

from __future__ import annotations

import pathlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, closing
from functools import partial
from typing import Any

import pytest
import trio

from tests.redis_server import RedisServer
from trio_responses import Config
from trio_responses.store.base import State, StoredResponse
from trio_responses.store.files import (
    FileQuota,
    QuotaExceeded,
    StoredContainer,
    StoredFile,
)
from trio_responses.store.open import open_state
from trio_responses.store.sqlite import SCHEMA_VERSION

OWNER = "owner-a"
STRANGER = "owner-b"
ROOMY = FileQuota(max_files=100, max_bytes=1 << 20, max_containers=10)
NOW = 1_700_000_000.0


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[State]:
    async with open_state(url, Config(store_url=url)) as state:
        yield state


def _file(
    file_id: str = "file-1",
    *,
    size: int = 5,
    owner: str | None = OWNER,
    created_at: int = 1,
    container_id: str | None = None,
) -> StoredFile:
    if container_id is None:
        file: dict[str, Any] = {
            "id": file_id,
            "object": "file",
            "bytes": size,
            "created_at": created_at,
            "filename": f"{file_id}.txt",
            "purpose": "user_data",
            "status": "processed",
        }
    else:
        file = {
            "id": file_id,
            "object": "container.file",
            "bytes": size,
            "container_id": container_id,
            "created_at": created_at,
            "path": f"/mnt/data/{file_id}.txt",
            "source": "user",
        }
    return StoredFile(file, owner)


def _container(
    container_id: str = "cntr-1",
    *,
    owner: str | None = OWNER,
    created_at: int = 1,
    status: str = "running",
    last_active_at: float = NOW,
    minutes: int = 20,
) -> StoredContainer:
    return StoredContainer(
        {
            "id": container_id,
            "object": "container",
            "name": container_id,
            "created_at": created_at,
            "status": status,
            "expires_after": {"anchor": "last_active_at", "minutes": minutes},
            "last_active_at": last_active_at,
            "memory_limit": "1g",
        },
        owner,
    )


def _ids(things: Any) -> list[str]:
    return [thing.id for thing in things]


async def test_files_round_trip_scoped_to_their_owner(store_url: str) -> None:
    async with opened(store_url) as state:
        files = state.files
        stored = _file(size=3)
        await files.put_file(stored, b"a\x00\xff", quota=ROOMY)
        assert await files.get_file("file-1", owner=OWNER) == stored
        assert await files.read_file("file-1", owner=OWNER) == b"a\x00\xff"
        assert _ids(await files.list_files(owner=OWNER, container_id=None)) == ["file-1"]
        # Another owner, or no owner, finds nothing.
        for other in (STRANGER, None):
            assert await files.get_file("file-1", owner=other) is None
            assert await files.read_file("file-1", owner=other) is None
            assert await files.list_files(owner=other, container_id=None) == []
            assert not await files.delete_file("file-1", owner=other)
        assert await files.delete_file("file-1", owner=OWNER)
        assert await files.get_file("file-1", owner=OWNER) is None
        assert await files.read_file("file-1", owner=OWNER) is None
        assert not await files.delete_file("file-1", owner=OWNER)
        assert await files.list_files(owner=OWNER, container_id=None) == []


async def test_files_without_an_owner(store_url: str) -> None:
    async with opened(store_url) as state:
        await state.files.put_file(_file(owner=None), b"12345", quota=ROOMY)
        assert await state.files.read_file("file-1", owner=None) == b"12345"
        assert await state.files.get_file("file-1", owner=OWNER) is None
        assert _ids(await state.files.list_files(owner=None, container_id=None)) == ["file-1"]


async def test_files_are_listed_oldest_first_ties_by_id(store_url: str) -> None:
    async with opened(store_url) as state:
        for file_id, created_at in (("file-c", 2), ("file-b", 1), ("file-a", 2), ("file-d", 0)):
            await state.files.put_file(_file(file_id, created_at=created_at), b"12345", quota=ROOMY)
        listed = await state.files.list_files(owner=OWNER, container_id=None)
        assert _ids(listed) == ["file-d", "file-b", "file-a", "file-c"]


async def test_a_put_replaces_the_file_and_counts_its_new_size(store_url: str) -> None:
    quota = FileQuota(max_files=1, max_bytes=10, max_containers=1)
    async with opened(store_url) as state:
        files = state.files
        await files.put_file(_file(size=8), b"x" * 8, quota=quota)
        # Same id: one file still, 10 bytes now (not 18).
        replacement = StoredFile({**_file(size=10).file, "filename": "new.txt"}, OWNER)
        await files.put_file(replacement, b"y" * 10, quota=quota)
        assert await files.get_file("file-1", owner=OWNER) == replacement
        assert await files.read_file("file-1", owner=OWNER) == b"y" * 10
        assert len(await files.list_files(owner=OWNER, container_id=None)) == 1
        # Smaller again: 2 bytes held, so 8 more fit... but not another file.
        await files.put_file(_file(size=2), b"zz", quota=quota)
        with pytest.raises(QuotaExceeded) as refused:
            await files.put_file(_file("file-2", size=1), b"z", quota=quota)
        assert (refused.value.what, refused.value.limit) == ("files", 1)
        await files.put_file(_file(size=10), b"w" * 10, quota=quota)
        assert await files.read_file("file-1", owner=OWNER) == b"w" * 10


async def test_quota_of_files_counts_both_kinds_per_owner(store_url: str) -> None:
    quota = FileQuota(max_files=2, max_bytes=1000, max_containers=5)
    async with opened(store_url) as state:
        files = state.files
        await files.put_container(_container(), quota=quota)
        await files.put_file(_file("file-1"), b"12345", quota=quota)
        await files.put_file(_file("cfile-1", container_id="cntr-1"), b"12345", quota=quota)
        with pytest.raises(QuotaExceeded) as refused:
            await files.put_file(_file("file-2"), b"12345", quota=quota)
        assert (refused.value.what, refused.value.limit) == ("files", 2)
        with pytest.raises(QuotaExceeded):
            await files.put_file(_file("cfile-2", container_id="cntr-1"), b"1", quota=quota)
        # Nothing was written.
        assert await files.get_file("file-2", owner=OWNER) is None
        assert await files.get_file("cfile-2", owner=OWNER) is None
        # Another owner has a quota of its own.
        await files.put_file(_file("file-2", owner=STRANGER), b"12345", quota=quota)
        # A deleted file gives its place back.
        assert await files.delete_file("file-1", owner=OWNER)
        await files.put_file(_file("file-3"), b"12345", quota=quota)


async def test_quota_of_bytes(store_url: str) -> None:
    quota = FileQuota(max_files=10, max_bytes=10, max_containers=5)
    async with opened(store_url) as state:
        files = state.files
        await files.put_container(_container(), quota=quota)
        await files.put_file(_file("file-1", size=6), b"x" * 6, quota=quota)
        with pytest.raises(QuotaExceeded) as refused:
            await files.put_file(
                _file("cfile-1", size=5, container_id="cntr-1"), b"x" * 5, quota=quota
            )
        assert (refused.value.what, refused.value.limit) == ("bytes", 10)
        assert await files.list_files(owner=OWNER, container_id="cntr-1") == []
        await files.put_file(_file("cfile-1", size=4, container_id="cntr-1"), b"x" * 4, quota=quota)
        # A replacement that would grow past the bound is refused; the old one stays.
        with pytest.raises(QuotaExceeded):
            await files.put_file(_file("file-1", size=7), b"y" * 7, quota=quota)
        assert await files.read_file("file-1", owner=OWNER) == b"x" * 6
        await files.put_file(_file("file-2", owner=STRANGER, size=10), b"z" * 10, quota=quota)


async def test_containers_round_trip_scoped_to_their_owner(store_url: str) -> None:
    async with opened(store_url) as state:
        files = state.files
        await files.put_container(_container("cntr-b", created_at=2), quota=ROOMY)
        await files.put_container(_container("cntr-a", created_at=2), quota=ROOMY)
        await files.put_container(_container("cntr-c", created_at=1), quota=ROOMY)
        assert await files.get_container("cntr-a", owner=OWNER) == _container(
            "cntr-a", created_at=2
        )
        assert _ids(await files.list_containers(owner=OWNER)) == ["cntr-c", "cntr-a", "cntr-b"]
        for other in (STRANGER, None):
            assert await files.get_container("cntr-a", owner=other) is None
            assert await files.list_containers(owner=other) == []
            assert not await files.delete_container("cntr-a", owner=other)
        # A put replaces it (its last use, its status).
        used = _container("cntr-a", created_at=2, last_active_at=NOW + 60)
        await files.put_container(used, quota=ROOMY)
        assert await files.get_container("cntr-a", owner=OWNER) == used
        assert await files.delete_container("cntr-a", owner=OWNER)
        assert not await files.delete_container("cntr-a", owner=OWNER)
        assert await files.get_container("cntr-a", owner=OWNER) is None
        assert _ids(await files.list_containers(owner=OWNER)) == ["cntr-c", "cntr-b"]


async def test_container_files(store_url: str) -> None:
    async with opened(store_url) as state:
        files = state.files
        await files.put_container(_container(), quota=ROOMY)
        await files.put_file(_file("file-1"), b"12345", quota=ROOMY)
        cfile = _file("cfile-1", container_id="cntr-1", created_at=3)
        await files.put_file(cfile, b"abcde", quota=ROOMY)
        await files.put_file(
            _file("cfile-0", container_id="cntr-1", created_at=2), b"", quota=ROOMY
        )
        found = await files.get_file("cfile-1", owner=OWNER)
        assert found == cfile and found.container_id == "cntr-1"
        assert await files.read_file("cfile-1", owner=OWNER) == b"abcde"
        assert await files.read_file("cfile-0", owner=OWNER) == b""
        assert _ids(await files.list_files(owner=OWNER, container_id="cntr-1")) == [
            "cfile-0",
            "cfile-1",
        ]
        assert _ids(await files.list_files(owner=OWNER, container_id=None)) == ["file-1"]
        assert await files.list_files(owner=STRANGER, container_id="cntr-1") == []
        assert await files.list_files(owner=OWNER, container_id="cntr-none") == []
        assert await files.delete_file("cfile-0", owner=OWNER)
        assert _ids(await files.list_files(owner=OWNER, container_id="cntr-1")) == ["cfile-1"]


async def test_a_container_file_needs_its_running_container(store_url: str) -> None:
    async with opened(store_url) as state:
        files = state.files
        # Missing container: nothing written, no error.
        await files.put_file(_file("cfile-1", container_id="cntr-1"), b"12345", quota=ROOMY)
        assert await files.get_file("cfile-1", owner=OWNER) is None
        # Another owner's container does not take it either.
        await files.put_container(_container(owner=STRANGER), quota=ROOMY)
        await files.put_file(_file("cfile-1", container_id="cntr-1"), b"12345", quota=ROOMY)
        assert await files.get_file("cfile-1", owner=OWNER) is None
        # An expired one neither.
        await files.put_container(_container("cntr-2", status="expired"), quota=ROOMY)
        await files.put_file(_file("cfile-2", container_id="cntr-2"), b"12345", quota=ROOMY)
        assert await files.get_file("cfile-2", owner=OWNER) is None
        assert await files.list_files(owner=OWNER, container_id="cntr-2") == []
        # Nor does the refused write count against the quota.
        one = FileQuota(max_files=1, max_bytes=5, max_containers=10)
        await files.put_file(_file("file-1"), b"12345", quota=one)


async def test_quota_of_containers_counts_those_not_expired(store_url: str) -> None:
    quota = FileQuota(max_files=10, max_bytes=100, max_containers=2)
    async with opened(store_url) as state:
        files = state.files
        await files.put_container(_container("cntr-1"), quota=quota)
        await files.put_container(_container("cntr-2"), quota=quota)
        with pytest.raises(QuotaExceeded) as refused:
            await files.put_container(_container("cntr-3"), quota=quota)
        assert (refused.value.what, refused.value.limit) == ("containers", 2)
        assert await files.get_container("cntr-3", owner=OWNER) is None
        # Replacing one of them is no new container.
        await files.put_container(_container("cntr-1", last_active_at=NOW + 1), quota=quota)
        # Another owner's count is its own.
        await files.put_container(_container("cntr-9", owner=STRANGER), quota=quota)
        # An expired container leaves its place; deleting one too.
        await files.put_container(_container("cntr-1", status="expired"), quota=quota)
        await files.put_container(_container("cntr-3"), quota=quota)
        with pytest.raises(QuotaExceeded):
            await files.put_container(_container("cntr-4"), quota=quota)
        assert await files.delete_container("cntr-2", owner=OWNER)
        await files.put_container(_container("cntr-4"), quota=quota)
        # Expired containers are still listed.
        assert _ids(await files.list_containers(owner=OWNER)) == ["cntr-1", "cntr-3", "cntr-4"]


async def test_deleting_a_container_deletes_its_files_and_frees_the_quota(store_url: str) -> None:
    quota = FileQuota(max_files=2, max_bytes=10, max_containers=1)
    async with opened(store_url) as state:
        files = state.files
        await files.put_container(_container(), quota=quota)
        await files.put_file(_file("cfile-1", container_id="cntr-1"), b"12345", quota=quota)
        await files.put_file(_file("cfile-2", container_id="cntr-1"), b"12345", quota=quota)
        assert await files.delete_container("cntr-1", owner=OWNER)
        assert await files.get_file("cfile-1", owner=OWNER) is None
        assert await files.read_file("cfile-2", owner=OWNER) is None
        assert await files.list_files(owner=OWNER, container_id="cntr-1") == []
        # Two files, ten bytes and a container are free again.
        await files.put_container(_container("cntr-2"), quota=quota)
        await files.put_file(_file("file-1", size=10), b"x" * 10, quota=quota)
        await files.put_file(_file("cfile-3", container_id="cntr-2", size=0), b"", quota=quota)


async def test_expired_containers_are_handed_out_once(store_url: str) -> None:
    quota = FileQuota(max_files=10, max_bytes=100, max_containers=2)
    async with opened(store_url) as state:
        files = state.files
        # Expire 20 minutes after NOW, 1 minute after NOW, and one already expired.
        await files.put_container(_container("cntr-late"), quota=quota)
        await files.put_container(_container("cntr-soon", minutes=1), quota=quota)
        await files.put_container(_container("cntr-old", status="expired", minutes=0), quota=quota)
        await files.put_file(_file("cfile-1", container_id="cntr-soon"), b"12345", quota=quota)
        await files.put_file(_file("cfile-2", container_id="cntr-late"), b"12345", quota=quota)
        assert await files.expire_containers(NOW + 60) == []  # not before its time
        expired = await files.expire_containers(NOW + 61)
        assert expired == [_container("cntr-soon", minutes=1, status="expired")]
        assert await files.expire_containers(NOW + 61) == []
        assert await files.expire_containers(NOW + 120) == []
        stored = await files.get_container("cntr-soon", owner=OWNER)
        assert stored is not None and stored.status == "expired"
        assert [c.status for c in await files.list_containers(owner=OWNER)] == [
            "running",  # cntr-late
            "expired",  # cntr-old
            "expired",  # cntr-soon
        ]
        assert await files.get_file("cfile-1", owner=OWNER) is None
        assert await files.list_files(owner=OWNER, container_id="cntr-soon") == []
        assert await files.read_file("cfile-2", owner=OWNER) == b"12345"
        # It takes no new files, and frees its place.
        await files.put_file(_file("cfile-3", container_id="cntr-soon"), b"12345", quota=quota)
        assert await files.get_file("cfile-3", owner=OWNER) is None
        await files.put_container(_container("cntr-new"), quota=quota)
        # Owners alike: the clock decides, whoever owns them.
        await files.put_container(_container("cntr-x", owner=None, minutes=1), quota=quota)
        expired = await files.expire_containers(NOW + 1201)
        assert sorted((c.id, c.owner) for c in expired) == [
            ("cntr-late", OWNER),
            ("cntr-new", OWNER),
            ("cntr-x", None),
        ]
        assert await files.read_file("cfile-2", owner=OWNER) is None


async def _race(writes: list[tuple[str, Callable[[], Awaitable[None]]]]) -> list[str]:
    """Run the writes at once; the names of those that were not refused."""
    stored: list[str] = []

    async def write(name: str, operation: Callable[[], Awaitable[None]]) -> None:
        try:
            await operation()
        except QuotaExceeded:
            return
        stored.append(name)

    async with trio.open_nursery() as nursery:
        for name, operation in writes:
            nursery.start_soon(write, name, operation)
    return stored


async def test_concurrent_writes_do_not_overshoot_a_quota(store_url: str) -> None:
    quota = FileQuota(max_files=5, max_bytes=1000, max_containers=3)
    async with opened(store_url) as state:
        files = state.files
        writes: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        for index in range(12):
            writes.append(
                (
                    f"file-{index}",
                    partial(files.put_file, _file(f"file-{index}"), b"x", quota=quota),
                )
            )
            writes.append(
                (
                    f"cntr-{index}",
                    partial(files.put_container, _container(f"cntr-{index}"), quota=quota),
                )
            )
        stored = await _race(writes)
        listed = await files.list_files(owner=OWNER, container_id=None)
        containers = await files.list_containers(owner=OWNER)
        assert sorted(_ids(listed)) == sorted(s for s in stored if s.startswith("file"))
        assert sorted(_ids(containers)) == sorted(s for s in stored if s.startswith("cntr"))
        assert (len(listed), len(containers)) == (5, 3)


async def test_files_survive_reopening_the_file(store_url: str) -> None:
    quota = FileQuota(max_files=2, max_bytes=100, max_containers=1)
    async with opened(store_url) as state:
        await state.files.put_container(_container(), quota=quota)
        await state.files.put_file(_file(container_id="cntr-1"), b"\x00" * 5, quota=quota)
        await state.files.put_file(_file("file-2"), b"12345", quota=quota)
    async with opened(store_url) as state:
        if state.kind == "memory":  # nothing outlives the process
            assert await state.files.get_file("file-1", owner=OWNER) is None
            return
        assert await state.files.read_file("file-1", owner=OWNER) == b"\x00" * 5
        assert _ids(await state.files.list_containers(owner=OWNER)) == ["cntr-1"]
        # The totals hold across the reopen.
        with pytest.raises(QuotaExceeded):
            await state.files.put_file(_file("file-3"), b"1", quota=quota)
        with pytest.raises(QuotaExceeded):
            await state.files.put_container(_container("cntr-2"), quota=quota)


async def test_redis_replicas_share_files_and_their_quotas(redis: RedisServer) -> None:
    """Two `open_state` on one Redis (two replicas): one file space, one quota, and
    each expired container handed to one replica only."""
    redis.flush()
    quota = FileQuota(max_files=4, max_bytes=1000, max_containers=6)
    async with opened(redis.url) as one, opened(redis.url) as two:
        writes: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        for index in range(10):
            replica = (one, two)[index % 2]
            put = partial(replica.files.put_file, _file(f"file-{index}"), b"x" * index, quota=quota)
            writes.append((f"file-{index}", put))
        stored = await _race(writes)
        assert len(stored) == 4
        for index in stored:
            number = int(index.removeprefix("file-"))
            assert await two.files.read_file(index, owner=OWNER) == b"x" * number
            assert await one.files.read_file(index, owner=OWNER) == b"x" * number

        for index in range(6):
            await (one, two)[index % 2].files.put_container(
                _container(f"cntr-{index}", minutes=1 + index % 2), quota=quota
            )
        handed_out: list[list[str]] = [[], []]

        async def expire(slot: int, state: State) -> None:
            for _ in range(20):
                handed_out[slot] += _ids(await state.files.expire_containers(NOW + 3600))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(expire, 0, one)
            nursery.start_soon(expire, 1, two)
        assert sorted(handed_out[0] + handed_out[1]) == [f"cntr-{index}" for index in range(6)]
        listed = await one.files.list_containers(owner=OWNER)
        assert {c.status for c in listed} == {"expired"}


async def test_a_sqlite_file_of_schema_3_gets_the_file_tables(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    async with opened(url) as state:
        await state.store.put(
            StoredResponse({"id": "resp_1", "status": "completed", "output": []}, [], OWNER)
        )
    with closing(sqlite3.connect(tmp_path / "old.db")) as db:
        db.executescript("DROP TABLE files; DROP TABLE containers; PRAGMA user_version = 3;")
    async with opened(url) as state:
        assert await state.store.get("resp_1", owner=OWNER) is not None
        await state.files.put_file(_file(), b"12345", quota=ROOMY)
        assert await state.files.read_file("file-1", owner=OWNER) == b"12345"
    with closing(sqlite3.connect(tmp_path / "old.db")) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (5,)
