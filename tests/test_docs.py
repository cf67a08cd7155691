"""The README's and docs' commands and snippets run as written.

Every fenced block in README.md and docs/*.md names its language, and every shell
or Python block says, in an HTML comment on the line before it, whether it runs:

    <!-- runnable -->                        against `trio-responses serve` (this venv)
    <!-- runnable: serve FLAGS -->           against `trio-responses serve FLAGS`
    <!-- runnable: alone -->                 starts what it needs itself
    <!-- not runnable: REASON -->            and why (a GPU, servers that run forever…)

Each runnable block runs in this environment (the README's venv: its ``python`` and
its scripts first on ``PATH``) and must exit 0. The blocks are written for a server
on ``127.0.0.1:8000``: each gets one on a free port instead, its address put in place
of ``127.0.0.1:8000`` (and, for blocks that start their own, ``8000`` made that port).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_LANGUAGES = {"sh", "bash", "shell", "console", "python", "py"}
MARKER = re.compile(r"<!-- (?:runnable(?::\s*(?P<how>.*?))?|not runnable: (?P<why>.+?)) -->")
READY = re.compile(rb"listening on (http://\S+)")
BLOCK_TIMEOUT_S = 180


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    language: str
    code: str
    marker: str | None

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"


def _blocks() -> Iterator[Block]:
    for path in DOCUMENTS:
        lines = path.read_text().splitlines()
        index = 0
        while index < len(lines):
            line = lines[index]
            if not line.startswith("```"):
                index += 1
                continue
            language = line[3:].strip()
            end = index + 1
            while not lines[end].startswith("```"):
                end += 1
            before = lines[index - 1] if index else ""
            yield Block(
                document=str(path.relative_to(ROOT)),
                line=index + 1,
                language=language,
                code="\n".join(lines[index + 1 : end]) + "\n",
                marker=before if MARKER.fullmatch(before) else None,
            )
            index = end + 1


BLOCKS = list(_blocks())
RUNNABLE = [
    block
    for block in BLOCKS
    if block.marker is not None and (match := MARKER.fullmatch(block.marker)) and not match["why"]
]


def test_every_block_names_its_language_and_every_command_says_whether_it_runs() -> None:
    assert len(BLOCKS) > 20
    for block in BLOCKS:
        assert block.language, f"{block.name}: a fence without a language"
        if block.language in COMMAND_LANGUAGES:
            assert block.marker is not None, (
                f"{block.name}: a {block.language} block needs <!-- runnable --> or "
                "<!-- not runnable: REASON --> on the line before it"
            )
    assert len(RUNNABLE) >= 15


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class _Servers:
    """``trio-responses serve FLAGS`` child processes, one per set of flags, shared by
    the blocks of this module and stopped at its end."""

    def __init__(self, directory: pathlib.Path) -> None:
        self._directory = directory
        self._running: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    def url(self, flags: str) -> str:
        if flags not in self._running:
            self._running[flags] = self._start(flags)
        return self._running[flags][1]

    def _start(self, flags: str) -> tuple[subprocess.Popen[bytes], str]:
        log = (self._directory / f"serve-{len(self._running)}.log").open("wb+")
        process = subprocess.Popen(
            [sys.executable, "-m", "trio_responses", "serve", "--port", "0", *shlex.split(flags)],
            stdin=subprocess.DEVNULL,
            stderr=log,
            cwd=self._directory,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            log.seek(0)
            if match := READY.search(log.read()):
                return process, match.group(1).decode()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(0.2)
        process.kill()
        log.seek(0)
        raise AssertionError(f"serve {flags} did not start:\n{log.read().decode()}")

    def stop(self) -> None:
        for process, _ in self._running.values():
            process.terminate()
        for process, _ in self._running.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Servers]:
    running = _Servers(tmp_path_factory.mktemp("docs-servers"))
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.name for block in RUNNABLE])
def test_the_block_runs_as_written(block: Block, servers: _Servers, tmp_path: pathlib.Path) -> None:
    match = MARKER.fullmatch(block.marker or "")
    assert match is not None
    how = (match["how"] or "").strip()
    code = block.code
    if how == "alone":
        code = code.replace("8000", str(_free_port()))
    else:
        flags = how.removeprefix("serve").strip() if how.startswith("serve") else ""
        assert how in ("", f"serve {flags}".strip()), f"{block.name}: unknown marker {how!r}"
        address = servers.url(flags).removeprefix("http://")
        code = code.replace("127.0.0.1:8000", address)
    python = block.language in ("python", "py")
    command = [sys.executable, "-c", code] if python else ["bash", "-euo", "pipefail", "-c", code]
    environment = {
        **os.environ,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
    }
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"{block.name} exited {result.returncode}\n--- stdout\n{result.stdout}\n"
        f"--- stderr\n{result.stderr}"
    )


def test_the_architecture_names_every_module() -> None:
    """docs/architecture.md says what each module is for: a module it does not name
    (by its file name) is one a reader of the package cannot place."""
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    package = ROOT / "trio_responses"
    unnamed = sorted(
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and f"{path.name}`" not in architecture
    )
    assert unnamed == []


def test_the_sdk_surface_names_every_tool_type_and_request_field() -> None:
    """docs/api.md: every tool type the SDK can send is in the SDK surface table, and
    every create field is named somewhere in the page (a new SDK type or field fails
    this test until the docs say what it does here)."""
    from openai.types.responses import response_create_params, tool_param

    text = (ROOT / "docs" / "api.md").read_text()
    table = text[text.index("## SDK surface") : text.index("## Creating a response")]
    types: set[str] = set()
    for member in typing.get_args(tool_param.ToolParam):
        for value in typing.get_args(typing.get_type_hints(member)["type"]):
            types.update(v for v in typing.get_args(value) or (value,) if isinstance(v, str))
    assert types and sorted(t for t in types if t not in table) == []
    fields: set[str] = set()
    for params in (
        response_create_params.ResponseCreateParamsNonStreaming,
        response_create_params.ResponseCreateParamsStreaming,
    ):
        fields |= set(typing.get_type_hints(params))
    assert sorted(f for f in fields if f"`{f}`" not in text) == []
