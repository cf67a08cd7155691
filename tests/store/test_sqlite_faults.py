"""``sqlite:///PATH`` when the file itself goes wrong under a running server.

Real ``trio-responses serve`` children (`ServeCommand`) on a file under ``tmp_path``:

- the WAL index: no ``-shm`` file is ever mapped (a fault on a mapped file is a
  SIGBUS that kills the process with nothing logged), so truncating or replacing
  whatever sits at ``PATH-shm`` cannot touch the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio

from tests.processes import ServeCommand
from tests.support import MODEL


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
