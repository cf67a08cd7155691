"""The state seam of files and containers: `FileStore`.

What ``/v1/files`` and ``/v1/containers`` keep, on the same backend as responses:

- files (``/v1/files``): an OpenAI File object and its bytes;
- containers (``/v1/containers``): the Container object (``status``, ``expires_after``,
  ``last_active_at``…); its Python process is not state, it runs on the replica
  that uses it (``tools.containers``);
- container files (``/v1/containers/{id}/files``): a ``container.file`` object (its
  ``path`` under ``/mnt/data``) and its bytes: what a container's process finds on
  its disk when it (re)starts, and what the code wrote there, downloadable.

Everything is found by (owner, id) like responses: another owner's file or
container is not found (None, False). The bytes live in the backend itself (memory:
the process; SQLite: a table of the database file; Redis: a string key per file),
so that every replica reads what any other wrote, with no shared directory.

Per tenant (`FileQuota`): at most ``max_files`` files and ``max_bytes`` bytes, both
kinds together, and at most ``max_containers`` containers that are not expired.
A write past a quota changes nothing and raises `QuotaExceeded`. Bytes are counted
as the stored content's length. Only a write that grows a total past its bound is
refused: replacing a file by one no larger, or deleting, always goes through (also
for an owner over a quota that was lowered). Each backend checks a quota and makes
the write it allows in one atomic step, so concurrent writers (on several replicas
too) cannot overshoot it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = [
    "FileQuota",
    "FileStore",
    "QuotaExceeded",
    "StoredContainer",
    "StoredFile",
]


@dataclass(frozen=True)
class StoredFile:
    """A file's object and its owner (the bytes are read apart: `FileStore.read_file`)."""

    file: dict[str, Any]
    """The File object (``object: "file"``: ``id``, ``bytes``, ``created_at``,
    ``filename``, ``purpose``, ``status``) or the ``container.file`` object (``id``,
    ``bytes``, ``container_id``, ``created_at``, ``path``, ``source``)."""
    owner: str | None
    """Digest of the API key that created it (None without auth)."""

    @property
    def id(self) -> str:
        file_id: str = self.file["id"]
        return file_id

    @property
    def container_id(self) -> str | None:
        """The container the file belongs to; None for a ``/v1/files`` file."""
        container_id = self.file.get("container_id")
        return container_id if isinstance(container_id, str) else None

    @property
    def size(self) -> int:
        size: int = self.file["bytes"]
        return size


@dataclass(frozen=True)
class StoredContainer:
    """A container's object and its owner."""

    container: dict[str, Any]
    """The Container object: ``id``, ``object: "container"``, ``name``, ``created_at``,
    ``status`` (``running`` or ``expired``), ``expires_after`` (``{"anchor":
    "last_active_at", "minutes": N}``), ``last_active_at``, ``memory_limit``."""
    owner: str | None

    @property
    def id(self) -> str:
        container_id: str = self.container["id"]
        return container_id

    @property
    def status(self) -> str:
        status: str = self.container["status"]
        return status

    @property
    def expires_at(self) -> float:
        """When it expires unless used before (``last_active_at`` + the minutes)."""
        minutes = int(self.container["expires_after"]["minutes"])
        return float(self.container["last_active_at"]) + 60.0 * minutes


@dataclass(frozen=True)
class FileQuota:
    """What one tenant may hold (all its API keys' things when the store is not per key)."""

    max_files: int
    max_bytes: int
    max_containers: int


class QuotaExceeded(Exception):
    """A write would take its owner past a `FileQuota`; nothing was written."""

    def __init__(self, what: Literal["files", "bytes", "containers"], limit: int) -> None:
        super().__init__(what, limit)
        self.what = what
        self.limit = limit


class FileStore(Protocol):
    """Files, containers and container files, scoped to their owner.

    Every method may raise `StoreError` when the backend fails.
    """

    async def put_file(self, file: StoredFile, content: bytes, *, quota: FileQuota) -> None:
        """Store a file and its bytes, or replace the file with the same id (its
        object and bytes; the owner's totals count the new size instead of the old).

        A container file is stored only while its container exists and is not
        expired (otherwise nothing is written: the container was deleted meanwhile).

        Raises:
            QuotaExceeded: the owner would hold more than ``quota`` allows.
        """
        ...

    async def get_file(self, file_id: str, *, owner: str | None) -> StoredFile | None:
        """The file (either kind), or None if unknown, deleted or someone else's."""
        ...

    async def read_file(self, file_id: str, *, owner: str | None) -> bytes | None:
        """The file's bytes, or None (as `get_file`)."""
        ...

    async def delete_file(self, file_id: str, *, owner: str | None) -> bool:
        """Remove the file and its bytes; False if there was none (for this owner)."""
        ...

    async def list_files(
        self, *, owner: str | None, container_id: str | None
    ) -> Sequence[StoredFile]:
        """The owner's ``/v1/files`` files (``container_id`` None) or the files of
        one of its containers, oldest first (ties by id)."""
        ...

    async def put_container(self, container: StoredContainer, *, quota: FileQuota) -> None:
        """Store a new container, or replace the one with the same id (its status,
        ``last_active_at``…).

        Raises:
            QuotaExceeded: a new container would take the owner past
                ``quota.max_containers`` containers that are not expired.
        """
        ...

    async def get_container(
        self, container_id: str, *, owner: str | None
    ) -> StoredContainer | None:
        """The container (expired ones too), or None."""
        ...

    async def list_containers(self, *, owner: str | None) -> Sequence[StoredContainer]:
        """The owner's containers, oldest first (ties by id)."""
        ...

    async def delete_container(self, container_id: str, *, owner: str | None) -> bool:
        """Remove the container and all its files; False if there was none."""
        ...

    async def expire_containers(self, now: float) -> Sequence[StoredContainer]:
        """Mark every ``running`` container whose `StoredContainer.expires_at` is
        before ``now`` ``expired`` and delete its files; returns them (as they are
        now). Expired containers stay listed (as OpenAI shows them) until deleted.
        Across replicas each container is returned by one call only."""
        ...
