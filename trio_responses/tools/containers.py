"""Containers at run time: each a long-lived sandboxed Python on this replica.

A container (``/v1/containers``, stored on the `FileStore` seam) is state: its
object and its files. Its *process* (`tools.container_process.ContainerProcess`:
one bubblewrap sandbox whose Python keeps its globals between calls) is not: it
runs on the replica that runs the container's calls, started on the first call
here and kept while it is used. `ContainerRuntime` holds this replica's processes,
one owner task each in the runtime's nursery.

A call (`ContainerRuntime.call`), one at a time per container:

1. the container is read from the store: a deleted one fails the call, an expired
   one too (its files are gone);
2. a process that died (a limit hit, a crash), or whose container last ran on
   another replica since (its variables would be stale), is closed; a process is
   started where there is none, and the call's logs say that variables from
   earlier calls are gone;
3. the store's files are put on its disk (``/mnt/data``), those deleted through the
   API removed: a file uploaded on any replica is there for the code;
4. the code runs (the sandbox's limits per call; `Limits`);
5. what the code wrote under ``/mnt/data`` (new or changed regular files, up to
   ``max_file_bytes`` each) is stored as the container's files (``source:
   "assistant"``), what it deleted is deleted; a file over a quota is not stored
   and the logs say so;
6. the container's ``last_active_at`` is written, with this replica's stamp.

So files are shared by every replica through the store; variables live in one
process. A call through another replica than the last one starts the container
there with its files (documented in ``docs/operations.md``).

Expiry: a task expires containers idle past their ``expires_after``
(`FileStore.expire_containers`, once across replicas) and closes their processes
here; processes of containers deleted or expired through another replica are closed
when it next looks (every ``sweep_s``) or on their next call. At most ``max_live``
processes run here: starting one more closes the least recently used idle one (its
files stay; its variables go).
"""

from __future__ import annotations

import base64
import itertools
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, final

import trio

from .._exceptions import StoreError
from .._faults import faults_handled
from ..protocol.ids import new_id
from ..store.files import FileQuota, FileStore, QuotaExceeded, StoredFile
from .builtin.code_interpreter import OUTPUTS_INCLUDE
from .builtin.code_interpreter import TOOL as CODE_INTERPRETER
from .container_process import ContainerProcess, ContainerProcessDied, FileState
from .sandbox import Limits, Sandbox
from .session import ToolResult

logger = logging.getLogger("trio_responses.containers")

DATA_DIR = "/mnt/data"
"""Where a container's files are, for the code (and in ``container.file`` paths)."""

RUNNER_KEY = "_runner"
"""The container object's private field: the stamp of the replica process that ran
its last call (never shown: `public_container` leaves it out)."""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

MAX_INLINE_IMAGE_BYTES = 1024 * 1024
"""Largest image a call's ``outputs`` carry (as a ``data:`` URL); larger ones are
left out there (a PNG file the code wrote is still a container file)."""

MAX_SYNCED_FILES = 200
"""Most files one call stores from the container's disk (the rest are reported)."""


class ContainerUnavailable(Exception):
    """The call cannot run in its container; the message is what the model reads."""


@dataclass(frozen=True)
class WrittenFile:
    """A file a call wrote, as stored: what the answer may cite."""

    file_id: str
    container_id: str
    path: str
    """Its path in the container (``/mnt/data/plot.png``)."""
    png: bytes | None
    """Its bytes when it is a PNG image (an image output of the call)."""

    @property
    def filename(self) -> str:
        return posixpath.basename(self.path)


@dataclass(frozen=True)
class ContainerCall:
    logs: str
    ok: bool
    written: tuple[WrittenFile, ...] = ()
    figures: tuple[bytes, ...] = ()
    """PNGs of the figures the code showed (matplotlib)."""


def public_container(container: dict[str, Any]) -> dict[str, Any]:
    """The Container object as the API shows it (private fields left out)."""
    return {key: value for key, value in container.items() if not key.startswith("_")}


def container_file(
    container_id: str, path: str, size: int, *, source: str, file_id: str | None = None
) -> dict[str, Any]:
    """A ``container.file`` object."""
    return {
        "id": file_id or new_id("cfile"),
        "object": "container.file",
        "bytes": size,
        "container_id": container_id,
        "created_at": int(time.time()),
        "path": path,
        "source": source,
    }


def data_path(path: str) -> str | None:
    """``/mnt/data/a/b.csv`` -> ``a/b.csv`` (the path under the data directory), or None
    for a path outside it or one that climbs out (``..``)."""
    if not path.startswith(DATA_DIR + "/"):
        return None
    relative = path[len(DATA_DIR) + 1 :]
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts):
        return None
    return relative


@dataclass(eq=False)
class _Live:
    """A process of this replica and what it holds."""

    container_id: str
    owner: str | None
    process: ContainerProcess | None = None
    stamp: str = ""
    used_at: float = 0.0
    known: dict[str, tuple[str, FileState]] = field(default_factory=dict)
    """Path under the data directory -> (the stored file's id, its state on disk)."""
    close: trio.Event = field(default_factory=trio.Event)
    closed: trio.Event = field(default_factory=trio.Event)


@final
class ContainerRuntime:
    """This replica's container processes (see the module docstring)."""

    def __init__(
        self,
        *,
        files: FileStore,
        sandbox: Sandbox,
        limits: Limits,
        quota: FileQuota,
        replica: str,
        max_live: int = 16,
        max_file_bytes: int = 16 * 1024 * 1024,
        packages: str | None = None,
        sweep_s: float = 30.0,
    ) -> None:
        self._files = files
        self._sandbox = sandbox
        self._limits = limits
        self._quota = quota
        self._replica = replica
        self._max_live = max_live
        self._max_file_bytes = max_file_bytes
        self._packages = packages
        self._sweep_s = sweep_s
        self._live: dict[str, _Live] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._stamps = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self.started = 0
        """Processes started since the server started."""

    @property
    def limits(self) -> Limits:
        return self._limits

    # -- the runtime's own tasks -----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the processes and expire containers, until cancelled (every process
        is then killed and reaped)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    await trio.sleep(self._sweep_s)
                    await self.sweep()
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    async def sweep(self, now: float | None = None) -> None:
        """Expire containers idle at ``now`` (default: the time; once across replicas)
        and close the processes of containers gone or expired; a store that fails is
        tried again next time."""
        try:
            for container in await self._files.expire_containers(now or time.time()):
                logger.info("container %s expired", container.id)
                await self.drop(container.id)
            for container_id, live in list(self._live.items()):
                stored = await self._files.get_container(container_id, owner=live.owner)
                if stored is None or stored.status != "running":
                    await self._close(live)
        except StoreError as error:
            logger.warning("containers: the store failed while sweeping: %s", error)

    async def drop(self, container_id: str) -> None:
        """Close the container's process here, if it runs here (deleted, expired)."""
        live = self._live.get(container_id)
        if live is not None:
            await self._close(live)

    def health(self) -> dict[str, Any]:
        return {
            "live": len(self._live),
            "max_live": self._max_live,
            "started": self.started,
        }

    # -- calls -------------------------------------------------------------------------------

    async def call(self, container_id: str, code: str, *, owner: str | None) -> ContainerCall:
        """Run ``code`` in the container (see the module docstring).

        Raises:
            ContainerUnavailable: the container is gone or expired, or its process
                cannot start.
            StoreError: the store failed.
        """
        lock = self._locks.setdefault(container_id, trio.Lock())
        try:
            async with lock:
                return await self._call(container_id, code, owner)
        finally:
            if not lock.statistics().tasks_waiting and not lock.locked():
                self._locks.pop(container_id, None)

    async def _call(self, container_id: str, code: str, owner: str | None) -> ContainerCall:
        stored = await self._files.get_container(container_id, owner=owner)
        if stored is None:
            await self.drop(container_id)
            raise ContainerUnavailable(f"The container {container_id} was deleted.")
        if stored.status != "running":
            await self.drop(container_id)
            raise ContainerUnavailable(
                f"The container {container_id} has expired: its files are gone."
            )
        notes: list[str] = []
        live = self._live.get(container_id)
        ran_before = stored.container.get(RUNNER_KEY)
        if live is not None and (live.process is None or not live.process.alive):
            await self._close(live)
            live = None
        elif live is not None and ran_before != live.stamp:
            await self._close(live)  # another replica ran it since: this one is stale
            live = None
        if live is None:
            live = await self._start(container_id, owner)
            if ran_before:
                notes.append(
                    "[The container was started again: variables from earlier calls are "
                    "gone; its files are in place.]"
                )
        live.used_at = trio.current_time()
        process = live.process
        assert process is not None
        try:
            await self._put_files(live, process, container_id, owner, notes)
        except ContainerProcessDied as died:
            notes.append(
                f"[The container's process died while its files were put in place: {died}]"
            )
            return ContainerCall("\n".join(notes), False)
        result = await process.run(code)
        written: tuple[WrittenFile, ...] = ()
        if process.alive:
            try:
                written = await self._take_files(live, process, container_id, owner, notes)
            except ContainerProcessDied as died:
                notes.append(f"[The container's process died while its files were read: {died}]")
        live.stamp = f"{self._replica}:{next(self._stamps)}"
        container = dict(stored.container)
        container["last_active_at"] = int(time.time())
        container[RUNNER_KEY] = live.stamp
        await self._files.put_container(replace(stored, container=container), quota=self._quota)
        logs = result.logs
        if result.problem and not result.ok and result.problem not in logs:
            logs = f"{logs.rstrip()}\n[{result.problem}]".lstrip("\n")
        if notes:
            logs = "\n".join([*notes, logs]) if logs else "\n".join(notes)
        return ContainerCall(logs, result.ok, written, tuple(result.figures))

    async def _start(self, container_id: str, owner: str | None) -> _Live:
        nursery = self._nursery
        if nursery is None:
            raise ContainerUnavailable("The code interpreter is shutting down.")
        await self._make_room()
        live = _Live(container_id, owner)
        try:
            await nursery.start(self._hold, live)
        except (ContainerProcessDied, OSError, RuntimeError) as error:
            logger.error("container %s could not start: %s", container_id, error)
            raise ContainerUnavailable(f"The container {container_id} could not start.") from None
        self._live[container_id] = live
        self.started += 1
        return live

    async def _hold(self, live: _Live, *, task_status: trio.TaskStatus[None]) -> None:
        """The owner of one process: opens it, holds it until told to close."""
        started = False

        def failed(fault: BaseException) -> None:
            if not started:
                raise fault
            logger.error("container %s: its process failed", live.container_id, exc_info=fault)

        try:
            with faults_handled(failed):
                async with ContainerProcess.open(
                    self._sandbox, self._limits, packages=self._packages
                ) as process:
                    live.process = process
                    started = True
                    task_status.started()
                    await live.close.wait()
        finally:
            live.closed.set()
            if self._live.get(live.container_id) is live:
                del self._live[live.container_id]

    async def _close(self, live: _Live) -> None:
        live.close.set()
        if self._live.get(live.container_id) is live:
            del self._live[live.container_id]
        if live.process is not None:
            await live.closed.wait()

    async def _make_room(self) -> None:
        """Close the least recently used idle processes while there are ``max_live``."""
        while len(self._live) >= self._max_live:
            idle = [
                live
                for live in self._live.values()
                if not (lock := self._locks.get(live.container_id)) or not lock.locked()
            ]
            if not idle:
                return  # every one is running a call: one more, for a while
            await self._close(min(idle, key=lambda live: live.used_at))

    # -- files between the store and the disk --------------------------------------------

    async def _put_files(
        self,
        live: _Live,
        process: ContainerProcess,
        container_id: str,
        owner: str | None,
        notes: list[str],
    ) -> None:
        """The store's files onto the disk; those gone from the store off it."""
        stored = await self._files.list_files(owner=owner, container_id=container_id)
        wanted: dict[str, StoredFile] = {}
        for file in stored:
            relative = data_path(str(file.file.get("path", "")))
            if relative is not None:
                wanted[relative] = file
        for relative in [path for path in live.known if path not in wanted]:
            del live.known[relative]
            try:
                await process.remove_file(relative)
            except OSError as error:
                notes.append(f"[{DATA_DIR}/{relative} could not be removed: {error}]")
        changed = [
            (relative, file)
            for relative, file in wanted.items()
            if relative not in live.known
            or live.known[relative][0] != file.id
            or live.known[relative][1].size != file.size
        ]
        if not changed:
            return
        for relative, file in changed:
            content = await self._files.read_file(file.id, owner=owner)
            if content is None:
                continue
            try:
                await process.put_file(relative, content)
            except OSError as error:
                notes.append(f"[{DATA_DIR}/{relative} could not be put in place: {error}]")
        listing = await process.listing()
        for relative, file in changed:
            state = listing.get(relative)
            if state is not None:
                live.known[relative] = (file.id, state)

    async def _take_files(
        self,
        live: _Live,
        process: ContainerProcess,
        container_id: str,
        owner: str | None,
        notes: list[str],
    ) -> tuple[WrittenFile, ...]:
        """What the code wrote on the disk into the store; what it deleted out of it."""
        listing = await process.listing(max_files=MAX_SYNCED_FILES + len(live.known))
        written: list[WrittenFile] = []
        for relative in [path for path in live.known if path not in listing]:
            file_id, _ = live.known.pop(relative)
            await self._files.delete_file(file_id, owner=owner)
        changed = [
            (relative, state)
            for relative, state in sorted(listing.items())
            if relative not in live.known or live.known[relative][1] != state
        ]
        if len(changed) > MAX_SYNCED_FILES:
            notes.append(f"[Only {MAX_SYNCED_FILES} of the {len(changed)} files written kept.]")
            changed = changed[:MAX_SYNCED_FILES]
        quota = self._quota
        for relative, state in changed:
            content = await process.read_file(relative, max_bytes=self._max_file_bytes)
            path = f"{DATA_DIR}/{relative}"
            if content is None:
                notes.append(f"[{path} was not kept: larger than {self._max_file_bytes} bytes.]")
                continue
            known = live.known.get(relative)
            file = StoredFile(
                container_file(
                    container_id,
                    path,
                    len(content),
                    source="assistant",
                    file_id=known[0] if known is not None else None,
                ),
                owner,
            )
            try:
                await self._files.put_file(file, content, quota=quota)
            except QuotaExceeded as exceeded:
                notes.append(f"[{path} was not kept: the {exceeded.what} quota is used up.]")
                continue
            live.known[relative] = (file.id, state)
            png = content if content.startswith(PNG_MAGIC) else None
            written.append(WrittenFile(file.id, container_id, path, png))
        return tuple(written)


@dataclass(frozen=True)
class ResponseContainer:
    """The container one response's code interpreter calls run in."""

    runtime: ContainerRuntime
    container_id: str
    owner: str | None
    ensure: Callable[[], Awaitable[None]]
    """Creates the container the first time, when it is the response's new one."""
    include: tuple[str, ...] = ()
    """The request's ``include``: with ``code_interpreter_call.outputs``, the call
    items' ``outputs`` carry images."""

    @property
    def images(self) -> bool:
        return OUTPUTS_INCLUDE in self.include

    def item_fields(self) -> dict[str, dict[str, Any]]:
        """What the calls' items show of the container (`ResponseBuilder.item_fields`)."""
        return {CODE_INTERPRETER.item.type: {"container_id": self.container_id}}

    async def call(self, code: str) -> ToolResult:
        """Run ``code`` there: its logs, its images, the files it wrote (citable).

        Raises:
            ContainerUnavailable: as `ContainerRuntime.call`, or the container cannot
                be created.
            StoreError: the store failed.
        """
        await self.ensure()
        done = await self.runtime.call(self.container_id, code, owner=self.owner)
        outputs: list[dict[str, Any]] = []
        if self.images:
            pngs = [*done.figures, *(file.png for file in done.written if file.png)]
            outputs = [
                {"type": "image", "url": "data:image/png;base64," + base64.b64encode(png).decode()}
                for png in pngs
                if len(png) <= MAX_INLINE_IMAGE_BYTES
            ]
        citations = tuple(
            (
                {
                    "type": "container_file_citation",
                    "container_id": file.container_id,
                    "file_id": file.file_id,
                    "filename": file.filename,
                },
                (file.path, file.filename),
            )
            for file in done.written
        )
        return ToolResult(done.logs, not done.ok, tuple(outputs), citations)
