"""``memory://``'s `FileStore`: files, containers and their bytes in dicts.

Found by (owner, id) like the rest of the memory backend: each owner's things are
a dict of their own. Each method does its work after one checkpoint without
awaiting again, so a quota check and the write it allows are one step:
concurrent writers cannot overshoot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import final

import trio

from .files import FileQuota, QuotaExceeded, StoredContainer, StoredFile

__all__ = ["MemoryFiles"]


@dataclass
class _Owned:
    """One owner's files (with their bytes), containers and totals."""

    files: dict[str, tuple[StoredFile, bytes]] = field(default_factory=dict)
    containers: dict[str, StoredContainer] = field(default_factory=dict)
    bytes: int = 0
    """Bytes of its files, both kinds together."""

    def drop_file(self, file_id: str) -> bool:
        found = self.files.pop(file_id, None)
        if found is None:
            return False
        self.bytes -= len(found[1])
        return True

    def drop_files_of(self, container_id: str) -> None:
        for file_id in [i for i, (f, _) in self.files.items() if f.container_id == container_id]:
            self.drop_file(file_id)

    def live_containers(self) -> int:
        return sum(1 for c in self.containers.values() if c.status != "expired")


@final
class MemoryFiles:
    """Implements `FileStore` in memory (nothing survives the process)."""

    def __init__(self) -> None:
        self._owners: dict[str | None, _Owned] = {}

    def _find(self, owner: str | None) -> _Owned:
        """The owner's things to read (an empty set, not kept, for an owner of none)."""
        return self._owners.get(owner) or _Owned()

    def _of(self, owner: str | None) -> _Owned:
        """The owner's things to write."""
        owned = self._owners.get(owner)
        if owned is None:
            owned = self._owners[owner] = _Owned()
        return owned

    async def put_file(self, file: StoredFile, content: bytes, *, quota: FileQuota) -> None:
        await trio.lowlevel.checkpoint()
        owned = self._of(file.owner)
        if file.container_id is not None:
            container = owned.containers.get(file.container_id)
            if container is None or container.status == "expired":
                return
        old = owned.files.get(file.id)
        count, size = len(owned.files), owned.bytes
        new_count = count + (0 if old is not None else 1)
        new_size = size + len(content) - (len(old[1]) if old is not None else 0)
        if new_count > quota.max_files and new_count > count:
            raise QuotaExceeded("files", quota.max_files)
        if new_size > quota.max_bytes and new_size > size:
            raise QuotaExceeded("bytes", quota.max_bytes)
        owned.drop_file(file.id)
        owned.files[file.id] = (file, bytes(content))
        owned.bytes += len(content)

    async def get_file(self, file_id: str, *, owner: str | None) -> StoredFile | None:
        await trio.lowlevel.checkpoint()
        found = self._find(owner).files.get(file_id)
        return None if found is None else found[0]

    async def read_file(self, file_id: str, *, owner: str | None) -> bytes | None:
        await trio.lowlevel.checkpoint()
        found = self._find(owner).files.get(file_id)
        return None if found is None else found[1]

    async def delete_file(self, file_id: str, *, owner: str | None) -> bool:
        await trio.lowlevel.checkpoint()
        return self._find(owner).drop_file(file_id)

    async def list_files(
        self, *, owner: str | None, container_id: str | None
    ) -> Sequence[StoredFile]:
        await trio.lowlevel.checkpoint()
        found = [f for f, _ in self._find(owner).files.values() if f.container_id == container_id]
        return sorted(found, key=lambda f: (f.file["created_at"], f.id))

    async def put_container(self, container: StoredContainer, *, quota: FileQuota) -> None:
        await trio.lowlevel.checkpoint()
        owned = self._of(container.owner)
        old = owned.containers.get(container.id)
        was_live = old is not None and old.status != "expired"
        if (
            container.status != "expired"
            and not was_live
            and owned.live_containers() + 1 > quota.max_containers
        ):
            raise QuotaExceeded("containers", quota.max_containers)
        owned.containers[container.id] = container

    async def get_container(
        self, container_id: str, *, owner: str | None
    ) -> StoredContainer | None:
        await trio.lowlevel.checkpoint()
        return self._find(owner).containers.get(container_id)

    async def list_containers(self, *, owner: str | None) -> Sequence[StoredContainer]:
        await trio.lowlevel.checkpoint()
        found = self._find(owner).containers.values()
        return sorted(found, key=lambda c: (c.container["created_at"], c.id))

    async def delete_container(self, container_id: str, *, owner: str | None) -> bool:
        await trio.lowlevel.checkpoint()
        owned = self._find(owner)
        if owned.containers.pop(container_id, None) is None:
            return False
        owned.drop_files_of(container_id)
        return True

    async def expire_containers(self, now: float) -> Sequence[StoredContainer]:
        await trio.lowlevel.checkpoint()
        expired: list[StoredContainer] = []
        for owned in self._owners.values():
            for container_id, container in list(owned.containers.items()):
                if container.status != "running" or not container.expires_at < now:
                    continue
                flipped = replace(container, container={**container.container, "status": "expired"})
                owned.containers[container_id] = flipped
                owned.drop_files_of(container_id)
                expired.append(flipped)
        return sorted(expired, key=lambda c: (c.container["created_at"], c.id))
