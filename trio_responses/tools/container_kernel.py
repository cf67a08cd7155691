"""The kernel of a container: the long-lived Python process user code runs in.

This file is not imported by the server: ``tools.container_process`` reads it as
text and runs it, standard library only, inside the container's sandbox (at
``/opt/kernel/main.py``, outside the work directory) or, unsandboxed, as a plain
child process. Its arguments: the control channel's two file descriptors (it
reads requests from the first, answers on the second), the data directory
(``/mnt/data``), and a directory of extra packages to put on ``sys.path`` (or
``-``).

Frames, both ways: a 4-byte big-endian length, then that many bytes. A request
is a JSON object with an ``id`` and an ``op``, which some follow with a raw
frame (the bytes of a file); every answer is a JSON object echoing the ``id``,
which some follow with raw frames (a file's bytes, figures). First of all the
kernel says ``{"id": "hello", "pid": ...}``.

Operations (see ``tools.container_process`` for the host's side):

- ``run`` (``code``, ``marker``, ``cpu_s``): runs the code in the one namespace
  every call shares; the value of a last expression that is not None is printed
  (its ``repr``), an exception's traceback goes to stderr. Then it flushes
  stdout and stderr, writes ``marker`` to fd 1 (the end of this call's output)
  and answers ``{"ok", "error", "memory", "figures": n}`` followed by ``n`` PNG
  frames.
- ``put`` (``path``) + a raw frame: writes the file, making its directories.
- ``read`` (``path``, ``max_bytes``): ``{"found": true}`` and a raw frame, or
  ``{"found": false}`` (missing, not a regular file, a symbolic link on the
  way, or larger than ``max_bytes``).
- ``remove`` (``path``), ``list`` (``max_files``): ``{"files": {path: [size,
  mtime_ns]}}``, regular files only, symbolic links neither followed nor listed.

A failed file operation answers ``{"error": "..."}``. User code shares this
process and can break any of it; the host trusts none of what it reads here.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import resource
import stat
import sys
import traceback
import types
from collections.abc import Callable
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from typing import Any

MAX_FIGURES = 8
MAX_FIGURE_BYTES = 4 * 1024 * 1024
_CHUNK = 1024 * 1024


class Channel:
    """The control channel: requests in on one descriptor, answers out on another."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd

    def read_exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = os.read(self.read_fd, min(size - len(data), _CHUNK))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)

    def frame_size(self) -> int:
        return int.from_bytes(self.read_exactly(4), "big")

    def request(self) -> dict[str, Any]:
        value = json.loads(self.read_exactly(self.frame_size()))
        if not isinstance(value, dict):
            raise EOFError
        return value

    def send(self, payload: bytes) -> None:
        view = memoryview(len(payload).to_bytes(4, "big") + payload)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def answer(self, value: dict[str, Any]) -> None:
        self.send(json.dumps(value).encode())


def resolve(root_fd: int, path: str, *, make_dirs: bool = False) -> tuple[int, str]:
    """(descriptor of the directory holding ``path``, its last name), no symbolic
    link followed on the way; the caller closes the descriptor."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"not a path under the data directory: {path!r}")
    directory = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=root_fd)
    try:
        for part in parts[:-1]:
            if make_dirs:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=directory)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            os.close(directory)
            directory = inner
    except BaseException:
        os.close(directory)
        raise
    return directory, parts[-1]


class Kernel:
    def __init__(self, channel: Channel, data_dir: str) -> None:
        self.channel = channel
        self.root_fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
        # User code's module: ``__main__`` for pickle and the like (the kernel's own
        # functions keep their globals).
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        sys.modules["__main__"] = main
        self.namespace: dict[str, Any] = main.__dict__
        self.figures: list[bytes] = []

    # -- calls -------------------------------------------------------------------------

    def run(self, request: dict[str, Any]) -> None:
        self.figures = []
        # RLIMIT_CPU counts this process's own time since it started (a child's
        # counts its own, from its start).
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime) + 1 + int(request["cpu_s"])
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        ok, error, memory = True, None, False
        try:
            self.execute(str(request["code"]))
        except BaseException as failure:  # SystemExit, KeyboardInterrupt: the call's end
            ok, error = False, self.report(failure)
            memory = isinstance(failure, MemoryError)
        try:
            self.collect_figures()
        except Exception as failure:
            print(f"[figures not collected: {failure!r}]", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]
        marker = str(request["marker"]).encode()
        while marker:
            marker = marker[os.write(1, marker) :]
        figures = self.figures
        self.figures = []
        self.channel.answer(
            {
                "id": request["id"],
                "ok": ok,
                "error": error,
                "memory": memory,
                "figures": len(figures),
            }
        )
        for figure in figures:
            self.channel.send(figure)

    def execute(self, code: str) -> None:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body[-1].value)
            tree.body.pop()
        exec(compile(tree, "<cell>", "exec"), self.namespace)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), self.namespace)
            if value is not None:
                print(repr(value))

    def report(self, failure: BaseException) -> str:
        """Print the traceback (without the kernel's frames); the exception's line."""
        tb = failure.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
            tb = tb.tb_next
        if isinstance(failure, SyntaxError):
            tb = None
        lines = traceback.format_exception(type(failure), failure, tb)
        with contextlib.suppress(Exception):
            sys.stderr.write("".join(lines))
        return traceback.format_exception_only(type(failure), failure)[-1].strip()

    # -- figures ----------------------------------------------------------------------

    def collect_figures(self) -> None:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        patch_pyplot(pyplot, self.collect_figures)
        for number in list(pyplot.get_fignums()):
            figure = pyplot.figure(number)
            try:
                if len(self.figures) >= MAX_FIGURES:
                    print(f"[figure dropped: more than {MAX_FIGURES} in one call]")
                    continue
                buffer = io.BytesIO()
                figure.savefig(buffer, format="png")
                png = buffer.getvalue()
                if len(png) > MAX_FIGURE_BYTES:
                    print(f"[figure dropped: {len(png)} bytes, more than {MAX_FIGURE_BYTES}]")
                    continue
                self.figures.append(png)
            finally:
                pyplot.close(figure)

    # -- files ------------------------------------------------------------------------

    def put(self, request: dict[str, Any]) -> None:
        size = self.channel.frame_size()
        error = None
        fd = -1
        try:
            directory, name = resolve(self.root_fd, str(request["path"]), make_dirs=True)
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                fd = os.open(name, flags, 0o644, dir_fd=directory)
            finally:
                os.close(directory)
        except (OSError, ValueError) as failure:
            error = str(failure)
        left = size
        while left:  # all of the frame is read, written or not
            chunk = self.channel.read_exactly(min(left, _CHUNK))
            left -= len(chunk)
            if fd >= 0 and error is None:
                try:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                except OSError as failure:
                    error = str(failure)
        if fd >= 0:
            os.close(fd)
        self.channel.answer({"id": request["id"], "error": error})

    def read(self, request: dict[str, Any]) -> None:
        limit = int(request["max_bytes"])
        data = None
        try:
            directory, name = resolve(self.root_fd, str(request["path"]))
            try:
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                fd = os.open(name, flags, dir_fd=directory)
            finally:
                os.close(directory)
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_size <= limit:
                    content = bytearray()
                    while len(content) <= limit:
                        chunk = os.read(fd, min(_CHUNK, limit + 1 - len(content)))
                        if not chunk:
                            break
                        content += chunk
                    if len(content) <= limit:
                        data = bytes(content)
            finally:
                os.close(fd)
        except (OSError, ValueError):
            data = None
        self.channel.answer({"id": request["id"], "found": data is not None})
        if data is not None:
            self.channel.send(data)

    def remove(self, request: dict[str, Any]) -> None:
        error = None
        try:
            directory, name = resolve(self.root_fd, str(request["path"]))
            try:
                os.unlink(name, dir_fd=directory)
            finally:
                os.close(directory)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as failure:
            error = str(failure)
        self.channel.answer({"id": request["id"], "error": error})

    def listing(self, request: dict[str, Any]) -> None:
        most = int(request["max_files"])
        files: dict[str, list[int]] = {}
        todo = [""]
        while todo and len(files) < most:
            prefix = todo.pop()
            try:
                fd = _open_dir(self.root_fd, prefix)
            except (OSError, ValueError):
                continue
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        path = f"{prefix}{entry.name}"
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(path + "/")
                        elif entry.is_file(follow_symlinks=False) and len(files) < most:
                            info = entry.stat(follow_symlinks=False)
                            files[path] = [info.st_size, info.st_mtime_ns]
            except OSError:
                continue
            finally:
                os.close(fd)
        self.channel.answer({"id": request["id"], "files": files})

    def serve(self) -> None:
        handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "run": self.run,
            "put": self.put,
            "read": self.read,
            "remove": self.remove,
            "list": self.listing,
        }
        self.channel.answer({"id": "hello", "pid": os.getpid()})
        while True:
            try:
                request = self.channel.request()
            except (EOFError, OSError, ValueError):
                return
            handler = handlers.get(str(request.get("op")))
            if handler is None:
                return
            handler(request)


def _open_dir(root_fd: int, prefix: str) -> int:
    """A descriptor of ``prefix`` (``""`` or ``"a/b/"``) under the data directory,
    no symbolic link followed."""
    if not prefix:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=root_fd)
    directory, name = resolve(root_fd, prefix.rstrip("/"))
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
    finally:
        os.close(directory)


def patch_pyplot(pyplot: types.ModuleType, collect: Callable[[], None]) -> None:
    """Make ``pyplot.show`` keep every open figure (``collect``) instead."""
    if getattr(getattr(pyplot, "show", None), "__container_show__", False):
        return

    def show(*args: object, **kwargs: object) -> None:
        collect()

    show.__dict__["__container_show__"] = True
    setattr(pyplot, "show", show)  # noqa: B010 - a module's attribute, unknown to mypy


class PyplotHook(MetaPathFinder, Loader):
    """Replaces ``matplotlib.pyplot.show`` as soon as user code imports pyplot."""

    def __init__(self, collect: Callable[[], None]) -> None:
        self.collect = collect
        self.inner: Loader | None = None

    def find_spec(self, name: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if name != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                hook = PyplotHook(self.collect)
                hook.inner = spec.loader
                spec.loader = hook
                return spec
        return None

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        return None if self.inner is None else self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        if self.inner is not None:
            self.inner.exec_module(module)
        patch_pyplot(module, self.collect)


def main() -> None:
    read_fd, write_fd, data_dir, packages = sys.argv[1:5]
    channel = Channel(int(read_fd), int(write_fd))
    for fd in (channel.read_fd, channel.write_fd):
        os.set_inheritable(fd, False)
    if packages != "-":
        sys.path.append(packages)
    kernel = Kernel(channel, data_dir)
    sys.meta_path.insert(0, PyplotHook(kernel.collect_figures))
    kernel.serve()


if __name__ == "__main__":
    main()
