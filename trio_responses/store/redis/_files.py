"""Files, containers and their bytes on Redis (see the package docstring for the layout).

Every write is one Lua script (``lua/file_*.lua``, ``lua/container*.lua``, on the
library ``lua/files.lua``), so atomic across replicas: the owner's totals
(``file-quota[:OWNER]``: files, bytes, containers not expired) are checked and
changed in the same step as the write they allow, and `expire_containers` takes a
container out of the expiring index in the step that marks it expired, so one
call only (on one replica) returns it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final

from ...protocol.codec import decode_json
from ..base import encoded
from ..files import FileQuota, QuotaExceeded, StoredContainer, StoredFile
from ._client import PREFIX, _raw, _Redis, _text

__all__ = ["RedisFiles"]

_OVER_FILES = -1
_OVER_BYTES = -2
_OVER_CONTAINERS = -3


def _owner(owner: str | None) -> str:
    return owner or ""


def _container(owner: str | None, status: str | bytes, raw: str | bytes) -> StoredContainer:
    container: dict[str, Any] = decode_json(raw)
    return StoredContainer({**container, "status": _text(status)}, owner)


@final
class RedisFiles:
    """Implements `FileStore` on Redis: a hash and a string key (its bytes) per file."""

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis

    async def _call(self, script: Any, owner: str | None, *args: str | bytes | int) -> Any:
        return await self._redis.call(script, keys=[], args=[PREFIX, _owner(owner), *args])

    async def put_file(self, file: StoredFile, content: bytes, *, quota: FileQuota) -> None:
        status = int(
            await self._call(
                self._redis.file_put,
                file.owner,
                file.id,
                file.container_id or "",
                repr(float(file.file["created_at"])),
                encoded(file.file),
                bytes(content),
                quota.max_files,
                quota.max_bytes,
            )
        )
        if status == _OVER_FILES:
            raise QuotaExceeded("files", quota.max_files)
        if status == _OVER_BYTES:
            raise QuotaExceeded("bytes", quota.max_bytes)

    async def get_file(self, file_id: str, *, owner: str | None) -> StoredFile | None:
        raw = await self._call(self._redis.file_read, owner, file_id, "object")
        return None if raw is None else StoredFile(decode_json(raw), owner)

    async def read_file(self, file_id: str, *, owner: str | None) -> bytes | None:
        raw = await self._call(self._redis.file_read, owner, file_id, "bytes")
        return None if raw is None else _raw(raw)

    async def delete_file(self, file_id: str, *, owner: str | None) -> bool:
        return bool(await self._call(self._redis.file_delete, owner, file_id))

    async def list_files(
        self, *, owner: str | None, container_id: str | None
    ) -> Sequence[StoredFile]:
        raw = await self._call(self._redis.files_list, owner, container_id or "")
        return [StoredFile(decode_json(each), owner) for each in raw]

    async def put_container(self, container: StoredContainer, *, quota: FileQuota) -> None:
        status = int(
            await self._call(
                self._redis.container_put,
                container.owner,
                container.id,
                repr(float(container.container["created_at"])),
                repr(container.expires_at),
                container.status,
                encoded(container.container),
                quota.max_containers,
            )
        )
        if status == _OVER_CONTAINERS:
            raise QuotaExceeded("containers", quota.max_containers)

    async def get_container(
        self, container_id: str, *, owner: str | None
    ) -> StoredContainer | None:
        found = await self._call(self._redis.container_read, owner, "one", container_id)
        return _container(owner, found[0], found[1]) if found else None

    async def list_containers(self, *, owner: str | None) -> Sequence[StoredContainer]:
        found = await self._call(self._redis.container_read, owner, "all")
        return [_container(owner, found[i], found[i + 1]) for i in range(0, len(found), 2)]

    async def delete_container(self, container_id: str, *, owner: str | None) -> bool:
        return bool(await self._call(self._redis.container_delete, owner, container_id))

    async def expire_containers(self, now: float) -> Sequence[StoredContainer]:
        found = await self._call(self._redis.containers_expire, None, repr(float(now)))
        return [
            _container(_text(found[i]) or None, "expired", found[i + 1])
            for i in range(0, len(found), 2)
        ]
