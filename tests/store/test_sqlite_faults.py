"""``sqlite:///PATH`` when the file itself goes wrong under a running server.

Real ``trio-responses serve`` children (`ServeCommand`) on a file under ``tmp_path``:

- the WAL index: no ``-shm`` file is ever mapped (a fault on a mapped file is a
  SIGBUS that kills the process with nothing logged), so truncating or replacing
  whatever sits at ``PATH-shm`` cannot touch the server;
- the file deleted or replaced by another: detected, logged, ``/health`` 503, and
  writes refused with 503 ``store_unavailable`` rather than written into a file
  nobody will ever open again.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from tests.processes import ServeCommand
from tests.support import MODEL

LIMIT_S = 20
"""Most seconds a test waits for the server to notice something."""


@asynccontextmanager
async def served(db: Path, nursery: trio.Nursery) -> AsyncIterator[tuple[ServeCommand, Any]]:
    command = await ServeCommand.start(nursery, "--store", f"sqlite:///{db}")
    async with httpx2.AsyncClient(base_url=command.url, timeout=30) as http:
        yield command, http


async def create(http: Any, command: ServeCommand) -> Any:
    try:
        return await http.post(
            "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 8}
        )
    except httpx2.TransportError as error:
        status = await command.wait()
        raise AssertionError(f"the server died (exit status {status}): {error!r}") from error


async def wait_health(http: Any, status: int) -> Any:
    """``/health`` once it answers ``status`` (the server notices on its own)."""
    with trio.fail_after(LIMIT_S):
        while (health := await http.get("/health")).status_code != status:  # noqa: ASYNC110 (another process)
            await trio.sleep(0.05)
    return health


async def test_no_memory_mapped_wal_index(tmp_path: Path, nursery: trio.Nursery) -> None:
    db = tmp_path / "responses.db"
    shm = trio.Path(f"{db}-shm")
    async with served(db, nursery) as (command, http):
        first = await create(http, command)
        assert first.status_code == 200, first.text
        assert not await shm.exists()
        # What a read-only remount or a full disk does to a mapped WAL index: its pages
        # are gone. Were the index mapped, the next write would die with SIGBUS.
        await shm.write_bytes(b"")
        for _ in range(3):
            reply = await create(http, command)
            assert reply.status_code == 200, reply.text
        stored = await http.get(f"/v1/responses/{first.json()['id']}")
        assert stored.status_code == 200
        assert await command.stop() == 0
    assert await shm.read_bytes() == b""  # never opened, never mapped


async def test_an_unwritable_shm_file_does_not_matter(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    db = tmp_path / "responses.db"
    shm = trio.Path(f"{db}-shm")
    await shm.write_bytes(b"")
    await shm.chmod(0o444)
    async with served(db, nursery) as (command, http):
        reply = await create(http, command)
        assert reply.status_code == 200, reply.text
        assert await command.stop() == 0
    assert await shm.read_bytes() == b""


async def wait_unavailable(command: ServeCommand, http: Any, db: Path) -> None:
    """The server notices on its own (no request needed): an ERROR line naming the file,
    and ``/health`` 503 saying why."""
    await command.wait_for(rb"ERROR .*" + str(db).encode(), LIMIT_S)
    body = (await wait_health(http, 503)).json()
    assert body["status"] == "unhealthy"
    assert str(db) in body["store"]["error"]


async def assert_writes_refused(http: Any, command: ServeCommand) -> None:
    reply = await create(http, command)
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["code"] == "store_unavailable"
    assert error["type"] == "server_error"


async def test_a_deleted_database_is_noticed_and_refuses_writes(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    db = tmp_path / "responses.db"
    async with served(db, nursery) as (command, http):
        kept = await create(http, command)
        assert kept.status_code == 200, kept.text
        assert (await http.get("/health")).status_code == 200
        db.unlink()
        await wait_unavailable(command, http, db)
        await assert_writes_refused(http, command)
        # Reads still answer from the open file: what it held when it went away.
        stored = await http.get(f"/v1/responses/{kept.json()['id']}")
        assert stored.status_code == 200
        assert command.process.returncode is None
        assert await command.stop() == 0


async def test_a_replaced_database_is_noticed_and_refuses_writes(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    db = tmp_path / "responses.db"
    other = tmp_path / "other.db"
    sqlite3.connect(other).close()
    async with served(db, nursery) as (command, http):
        assert (await create(http, command)).status_code == 200
        os.replace(other, db)
        await wait_unavailable(command, http, db)
        await assert_writes_refused(http, command)
        assert await command.stop() == 0
    # Nothing was written into the file that took its place.
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


@pytest.mark.parametrize("fault", ["deleted", "replaced"])
async def test_a_file_that_comes_back_is_served_again(
    tmp_path: Path, nursery: trio.Nursery, fault: str
) -> None:
    db = tmp_path / "responses.db"
    aside = tmp_path / "aside.db"
    async with served(db, nursery) as (command, http):
        assert (await create(http, command)).status_code == 200
        os.rename(db, aside)
        if fault == "replaced":
            sqlite3.connect(db).close()
        await wait_unavailable(command, http, db)
        os.replace(aside, db)
        await wait_health(http, 200)
        assert (await create(http, command)).status_code == 200
        assert await command.stop() == 0
