"""The Files and Containers APIs without HTTP, and what responses need of containers.

`FilesAPI` holds the operations of ``/v1/files`` (upload, retrieve, content,
delete, list: the part the SDK uses with containers), ``/v1/containers`` (create,
retrieve, list, delete) and ``/v1/containers/{id}/files`` (upload or copy,
retrieve, content, delete, list) over the state backend's `FileStore`, scoped to
the caller's owner like responses: another API key's file or container is a 404.

Quotas per tenant (`FileQuota`, from ``--file-quota-files``, ``--file-quota-mb``
and ``--max-containers``): a file or container past one is a 400
``quota_exceeded`` and nothing is written. A file is at most ``--max-file-bytes``
(413 above).

For ``POST /v1/responses`` offering the code interpreter, `FilesAPI.plan`
checks the tool's ``container`` before the response is accepted (an unknown or
expired container, an unknown ``file_ids`` entry: 400) and says which container
the response's calls use: the one named; for ``{"type": "auto"}``, the one the
previous response in the chain used while it is still running, else a new one,
created (with the files of ``file_ids`` copied in) when the model first calls the
tool (`ContainerPlan.ensure`), so that a response that never runs code holds no
container.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, final

from ._config import Config
from ._conversations import check_id
from ._exceptions import InvalidRequestError, NotFoundError, RequestTooLargeError
from .protocol import errors
from .protocol.ids import new_id
from .protocol.lists import list_page
from .store.base import ResponseStore
from .store.files import FileQuota, FileStore, QuotaExceeded, StoredContainer, StoredFile
from .tools.containers import (
    DATA_DIR,
    ContainerRuntime,
    ContainerUnavailable,
    container_file,
    data_path,
    public_container,
)

FILE_PURPOSES = (
    "assistants",
    "batch",
    "fine-tune",
    "vision",
    "user_data",
    "evals",
)
"""The ``purpose`` values an upload may have (stored and echoed; none is processed)."""

MEMORY_LIMITS = ("1g", "4g", "16g", "64g")

MAX_FILE_IDS = 100
"""Most ``file_ids`` one container is created with."""

MAX_EXPIRY_MINUTES = 7 * 24 * 60

_CONTAINER_FIELDS = frozenset(
    {"name", "expires_after", "file_ids", "memory_limit", "network_policy", "skills"}
)


def file_quota(config: Config) -> FileQuota:
    """What one API key (or, without keys, the whole server) may hold."""
    return FileQuota(
        max_files=config.file_quota_files,
        max_bytes=config.file_quota_mb * 1024 * 1024,
        max_containers=config.max_containers,
    )


@dataclass(frozen=True)
class Upload:
    """A file as a multipart upload carried it."""

    filename: str
    content: bytes


@final
class FilesAPI:
    """The Files and Containers APIs over one state backend (`ResponsesService.files`)."""

    def __init__(
        self,
        *,
        config: Config,
        files: FileStore,
        responses: ResponseStore,
        runtime: ContainerRuntime | None,
    ) -> None:
        self._config = config
        self._files = files
        self._responses = responses
        self.runtime = runtime
        """This replica's container processes (None without ``--code-interpreter``)."""

    def quota(self, owner: str | None) -> FileQuota:
        """What one owner may hold (every owner the same)."""
        return file_quota(self._config)

    # -- /v1/files ------------------------------------------------------------------------

    async def create_file(
        self, upload: Upload | None, purpose: str | None, *, owner: str | None
    ) -> dict[str, Any]:
        """``POST /v1/files`` (multipart: ``file`` and ``purpose``).

        Raises:
            InvalidRequestError: no file, a bad purpose, a quota. RequestTooLargeError:
                the file is over ``max_file_bytes``.
        """
        if upload is None:
            raise _missing("file")
        if purpose is None:
            raise _missing("purpose")
        if purpose not in FILE_PURPOSES:
            raise InvalidRequestError(
                f"Invalid value for 'purpose': {purpose[:40]!r}. Supported values are: "
                f"{', '.join(FILE_PURPOSES)}.",
                param="purpose",
                code="invalid_value",
            )
        self._check_size(upload.content)
        file = {
            "id": new_id("file"),
            "object": "file",
            "bytes": len(upload.content),
            "created_at": int(time.time()),
            "filename": _filename(upload.filename),
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        await self._put_file(StoredFile(file, owner), upload.content)
        return file

    async def retrieve_file(self, file_id: str, *, owner: str | None) -> dict[str, Any]:
        return (await self._file(file_id, owner)).file

    async def file_content(self, file_id: str, *, owner: str | None) -> tuple[bytes, str]:
        """The bytes and the file name of a ``/v1/files`` file."""
        file = await self._file(file_id, owner)
        content = await self._files.read_file(file_id, owner=owner)
        if content is None:
            raise _file_not_found(file_id)
        return content, str(file.file["filename"])

    async def delete_file(self, file_id: str, *, owner: str | None) -> dict[str, Any]:
        await self._file(file_id, owner)
        if not await self._files.delete_file(file_id, owner=owner):
            raise _file_not_found(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def list_files(
        self,
        *,
        owner: str | None,
        after: str | None,
        limit: int,
        order: Literal["asc", "desc"],
        purpose: str | None,
    ) -> dict[str, Any]:
        files = [
            file.file
            for file in await self._files.list_files(owner=owner, container_id=None)
            if purpose is None or file.file.get("purpose") == purpose
        ]
        return _page(files, after=after, limit=limit, order=order, most=10_000)

    async def _file(self, file_id: str, owner: str | None) -> StoredFile:
        check_id(file_id, "file_id", "file")
        file = await self._files.get_file(file_id, owner=owner)
        if file is None or file.container_id is not None:
            raise _file_not_found(file_id)
        return file

    # -- /v1/containers -------------------------------------------------------------------

    async def create_container(self, body: Any, *, owner: str | None) -> dict[str, Any]:
        """``POST /v1/containers``.

        Raises:
            InvalidRequestError: a bad body, an unknown file id, a quota.
        """
        fields = _fields(body, _CONTAINER_FIELDS)
        name = fields.get("name")
        if name is None:
            raise _missing("name")
        if not isinstance(name, str) or len(name) > 256:
            raise _invalid("name", "a string of at most 256 characters")
        minutes = _expiry_minutes(fields.get("expires_after"), self._config)
        memory = fields.get("memory_limit", "1g")
        if memory not in MEMORY_LIMITS:
            raise _invalid("memory_limit", f"one of {', '.join(MEMORY_LIMITS)}")
        _no_network(fields.get("network_policy"), "network_policy")
        if fields.get("skills"):
            raise InvalidRequestError(
                "Container skills are not supported by this server.",
                param="skills",
                code="unsupported_parameter",
            )
        file_ids = _file_ids(fields.get("file_ids"), "file_ids")
        sources = [await self._source(file_id, owner, "file_ids") for file_id in file_ids]
        container = await self._new_container(
            name, owner, minutes=minutes, memory_limit=str(memory)
        )
        await self._copy_in(container, sources, owner)
        return public_container(container.container)

    async def retrieve_container(self, container_id: str, *, owner: str | None) -> dict[str, Any]:
        return public_container((await self._container(container_id, owner)).container)

    async def list_containers(
        self,
        *,
        owner: str | None,
        after: str | None,
        limit: int,
        order: Literal["asc", "desc"],
    ) -> dict[str, Any]:
        containers = [
            public_container(container.container)
            for container in await self._files.list_containers(owner=owner)
        ]
        return _page(containers, after=after, limit=limit, order=order, most=100)

    async def delete_container(self, container_id: str, *, owner: str | None) -> dict[str, Any]:
        """``DELETE /v1/containers/{id}``: its files and (here) its process go with it."""
        check_id(container_id, "container_id", "container")
        if not await self._files.delete_container(container_id, owner=owner):
            raise _container_not_found(container_id)
        if self.runtime is not None:
            await self.runtime.drop(container_id)
        return {"id": container_id, "object": "container.deleted", "deleted": True}

    async def _container(self, container_id: str, owner: str | None) -> StoredContainer:
        check_id(container_id, "container_id", "container")
        container = await self._files.get_container(container_id, owner=owner)
        if container is None:
            raise _container_not_found(container_id)
        return container

    async def _new_container(
        self, name: str, owner: str | None, *, minutes: int, memory_limit: str
    ) -> StoredContainer:
        now = int(time.time())
        container = StoredContainer(
            {
                "id": new_id("cntr"),
                "object": "container",
                "created_at": now,
                "status": "running",
                "expires_after": {"anchor": "last_active_at", "minutes": minutes},
                "last_active_at": now,
                "memory_limit": memory_limit,
                "name": name,
            },
            owner,
        )
        try:
            await self._files.put_container(container, quota=self.quota(owner))
        except QuotaExceeded as exceeded:
            raise _quota_error(exceeded) from None
        return container

    # -- /v1/containers/{id}/files --------------------------------------------------------

    async def create_container_file(
        self,
        container_id: str,
        *,
        upload: Upload | None,
        file_id: str | None,
        owner: str | None,
    ) -> dict[str, Any]:
        """``POST /v1/containers/{id}/files``: a multipart upload (``file``) or a JSON
        body naming a ``/v1/files`` file (``file_id``) to copy in."""
        container = await self._running(container_id, owner)
        if (upload is None) == (file_id is None):
            raise InvalidRequestError(
                "Send either a file (multipart 'file') or a 'file_id'.",
                param="file",
                code="missing_required_parameter",
            )
        if upload is not None:
            self._check_size(upload.content)
            path = f"{DATA_DIR}/{_filename(upload.filename)}"
            file = StoredFile(
                container_file(container_id, path, len(upload.content), source="user"), owner
            )
            await self._put_file(file, upload.content)
            return file.file
        assert file_id is not None
        source = await self._source(file_id, owner, "file_id")
        (copied,) = await self._copy_in(container, [source], owner)
        return copied

    async def list_container_files(
        self,
        container_id: str,
        *,
        owner: str | None,
        after: str | None,
        limit: int,
        order: Literal["asc", "desc"],
    ) -> dict[str, Any]:
        await self._container(container_id, owner)
        files = [
            file.file
            for file in await self._files.list_files(owner=owner, container_id=container_id)
        ]
        return _page(files, after=after, limit=limit, order=order, most=10_000)

    async def retrieve_container_file(
        self, container_id: str, file_id: str, *, owner: str | None
    ) -> dict[str, Any]:
        return (await self._container_file(container_id, file_id, owner)).file

    async def container_file_content(
        self, container_id: str, file_id: str, *, owner: str | None
    ) -> tuple[bytes, str]:
        file = await self._container_file(container_id, file_id, owner)
        content = await self._files.read_file(file_id, owner=owner)
        if content is None:
            raise _file_not_found(file_id)
        return content, posixpath.basename(str(file.file["path"]))

    async def delete_container_file(
        self, container_id: str, file_id: str, *, owner: str | None
    ) -> dict[str, Any]:
        await self._container_file(container_id, file_id, owner)
        if not await self._files.delete_file(file_id, owner=owner):
            raise _file_not_found(file_id)
        return {"id": file_id, "object": "container.file.deleted", "deleted": True}

    async def _container_file(
        self, container_id: str, file_id: str, owner: str | None
    ) -> StoredFile:
        await self._container(container_id, owner)
        check_id(file_id, "file_id", "file")
        file = await self._files.get_file(file_id, owner=owner)
        if file is None or file.container_id != container_id:
            raise _file_not_found(file_id)
        return file

    async def _running(self, container_id: str, owner: str | None) -> StoredContainer:
        container = await self._container(container_id, owner)
        if container.status != "running":
            raise _expired(container_id, "container_id")
        return container

    # -- files into containers --------------------------------------------------------------

    async def _source(self, file_id: str, owner: str | None, param: str) -> StoredFile:
        if not isinstance(file_id, str):
            raise _invalid(param, "a list of file ids")
        check_id(file_id, param, "file")
        file = await self._files.get_file(file_id, owner=owner)
        if file is None or file.container_id is not None:
            raise _file_not_found(file_id, param=param)
        return file

    async def _copy_in(
        self, container: StoredContainer, sources: Sequence[StoredFile], owner: str | None
    ) -> list[dict[str, Any]]:
        """Copy ``/v1/files`` files into the container (as ``/mnt/data/FILENAME``)."""
        copied = []
        for source in sources:
            content = await self._files.read_file(source.id, owner=owner)
            if content is None:
                raise _file_not_found(source.id)
            path = f"{DATA_DIR}/{_filename(str(source.file['filename']))}"
            file = StoredFile(
                container_file(container.id, path, len(content), source="user"), owner
            )
            await self._put_file(file, content)
            copied.append(file.file)
        return copied

    async def _put_file(self, file: StoredFile, content: bytes) -> None:
        if file.container_id is not None:
            # One file per path: a new upload to a path replaces the file there.
            for existing in await self._files.list_files(
                owner=file.owner, container_id=file.container_id
            ):
                if existing.file.get("path") == file.file["path"]:
                    file = replace(file, file={**file.file, "id": existing.id})
                    break
        try:
            await self._files.put_file(file, content, quota=self.quota(file.owner))
        except QuotaExceeded as exceeded:
            raise _quota_error(exceeded) from None

    def _check_size(self, content: bytes) -> None:
        if len(content) > self._config.max_file_bytes:
            raise RequestTooLargeError(
                f"The file is larger than this server accepts ({self._config.max_file_bytes} "
                "bytes, --max-file-bytes).",
                param="file",
            )

    # -- responses ---------------------------------------------------------------------------

    async def plan(
        self,
        container: str | Mapping[str, Any] | None,
        *,
        owner: str | None,
        previous_container: str | None,
        param: str,
    ) -> ContainerPlan:
        """Which container a response's code runs in (see the module docstring).

        Raises:
            InvalidRequestError: an unknown or expired container, a bad ``auto``
                object, an unknown file id.
        """
        if isinstance(container, str):
            stored = await self._files.get_container(container, owner=owner)
            if stored is None:
                raise NotFoundError(f"Container with id {container[:64]!r} not found.", param=param)
            if stored.status != "running":
                raise _expired(container, param)
            return ContainerPlan(self, stored.id, owner)
        spec = dict(container or {"type": "auto"})
        kind = spec.pop("type", None)
        if kind != "auto":
            raise _invalid(f"{param}.type", "'auto'")
        for key in spec:
            if key not in ("file_ids", "memory_limit", "network_policy", "skills"):
                raise InvalidRequestError(
                    f"Unknown parameter: '{param}.{str(key)[:64]}'.",
                    param=f"{param}.{str(key)[:64]}",
                    code="unknown_parameter",
                )
        memory = spec.get("memory_limit") or "1g"
        if memory not in MEMORY_LIMITS:
            raise _invalid(f"{param}.memory_limit", f"one of {', '.join(MEMORY_LIMITS)}")
        _no_network(spec.get("network_policy"), f"{param}.network_policy")
        file_ids = _file_ids(spec.get("file_ids"), f"{param}.file_ids")
        sources = [await self._source(file_id, owner, f"{param}.file_ids") for file_id in file_ids]
        if previous_container is not None and not file_ids:
            stored = await self._files.get_container(previous_container, owner=owner)
            if stored is not None and stored.status == "running":
                return ContainerPlan(self, stored.id, owner)
        return ContainerPlan(self, new_id("cntr"), owner, create=(str(memory), tuple(sources)))

    async def create_planned(
        self,
        container_id: str,
        owner: str | None,
        memory_limit: str,
        sources: Sequence[StoredFile],
    ) -> None:
        """Create an ``auto`` container, as `ContainerPlan.ensure` asks."""
        minutes = self._config.container_expiry_minutes
        now = int(time.time())
        container = StoredContainer(
            {
                "id": container_id,
                "object": "container",
                "created_at": now,
                "status": "running",
                "expires_after": {"anchor": "last_active_at", "minutes": minutes},
                "last_active_at": now,
                "memory_limit": memory_limit,
                "name": f"Container for a response ({container_id[-8:]})",
            },
            owner,
        )
        await self._files.put_container(container, quota=self.quota(owner))
        await self._copy_in(container, sources, owner)


@final
class ContainerPlan:
    """The container one response's calls run in (`FilesAPI.plan`)."""

    def __init__(
        self,
        files: FilesAPI,
        container_id: str,
        owner: str | None,
        *,
        create: tuple[str, tuple[StoredFile, ...]] | None = None,
    ) -> None:
        self.container_id = container_id
        self._files = files
        self._owner = owner
        self._create = create

    async def ensure(self) -> None:
        """Create the container if it is the response's new ``auto`` one (once).

        Raises:
            ContainerUnavailable: it cannot be created (a quota; a file gone).
        """
        if self._create is None:
            return
        memory, sources = self._create
        try:
            await self._files.create_planned(self.container_id, self._owner, memory, sources)
        except QuotaExceeded as exceeded:
            raise ContainerUnavailable(
                f"No container could be created: the {exceeded.what} quota "
                f"({exceeded.limit}) is used up."
            ) from None
        except (InvalidRequestError, NotFoundError) as error:
            raise ContainerUnavailable(f"No container could be created: {error}") from None
        self._create = None


def _page(
    objects: Sequence[dict[str, Any]],
    *,
    after: str | None,
    limit: int,
    order: Literal["asc", "desc"],
    most: int,
) -> dict[str, Any]:
    if not 1 <= limit <= most:
        raise InvalidRequestError(
            f"Invalid 'limit': it must be between 1 and {most}.",
            param="limit",
            code="invalid_value",
        )
    ordered = list(objects) if order == "asc" else list(reversed(objects))
    if after is not None:
        ids = [str(item["id"]) for item in ordered]
        if after not in ids:
            raise InvalidRequestError(
                f"Invalid 'after': no object with id {after[:64]!r} in this list.",
                param="after",
                code="invalid_value",
            )
        ordered = ordered[ids.index(after) + 1 :]
    return list_page(ordered[:limit], has_more=len(ordered) > limit)


def _fields(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
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


def _expiry_minutes(value: Any, config: Config) -> int:
    if value is None:
        return config.container_expiry_minutes
    if (
        not isinstance(value, Mapping)
        or value.get("anchor") != "last_active_at"
        or set(value) - {"anchor", "minutes"}
    ):
        raise _invalid("expires_after", "an object {'anchor': 'last_active_at', 'minutes': N}")
    minutes = value.get("minutes")
    if type(minutes) is not int or not 1 <= minutes <= MAX_EXPIRY_MINUTES:
        raise _invalid("expires_after.minutes", f"an integer from 1 to {MAX_EXPIRY_MINUTES}")
    return minutes


def _no_network(value: Any, param: str) -> None:
    """Containers have no network: only ``{"type": "disabled"}`` is accepted."""
    if value is None:
        return
    if not isinstance(value, Mapping) or value.get("type") != "disabled":
        raise InvalidRequestError(
            f"Invalid '{param}': containers here have no network; only "
            "{'type': 'disabled'} is supported.",
            param=param,
            code="unsupported_parameter",
        )


def _file_ids(value: Any, param: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_FILE_IDS:
        raise _invalid(param, f"a list of at most {MAX_FILE_IDS} file ids")
    return value


def _filename(name: str) -> str:
    """A file name safe as one path component under ``/mnt/data``."""
    base = posixpath.basename(name.replace("\\", "/")).strip()
    cleaned = "".join(c if c.isprintable() and c not in "/\x00" else "_" for c in base)[:255]
    if cleaned in ("", ".", ".."):
        return "file"
    assert data_path(f"{DATA_DIR}/{cleaned}") is not None
    return cleaned


def _missing(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _invalid(param: str, expected: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid value for '{param}': expected {expected}.", param=param, code="invalid_value"
    )


def _quota_error(exceeded: QuotaExceeded) -> InvalidRequestError:
    what = {
        "files": f"at most {exceeded.limit} files",
        "bytes": f"at most {exceeded.limit} bytes of files",
        "containers": f"at most {exceeded.limit} containers that have not expired",
    }[exceeded.what]
    return InvalidRequestError(
        f"Quota exceeded: an API key may hold {what} (delete some first).",
        code=errors.QUOTA_EXCEEDED,
    )


def _expired(container_id: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Container {container_id[:64]!r} has expired; create a new one.",
        param=param,
        code=errors.CONTAINER_EXPIRED,
    )


def _file_not_found(file_id: str, *, param: str = "file_id") -> NotFoundError:
    return NotFoundError(f"No such File object: {file_id[:64]!r}.", param=param)


def _container_not_found(container_id: str) -> NotFoundError:
    return NotFoundError(
        f"Container with id {container_id[:64]!r} not found.", param="container_id"
    )
