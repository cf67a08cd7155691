"""The examples in examples/ run as documented."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
from types import ModuleType

import pytest
import trio

from tests.support import Server

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_embedding_example_starts_and_stops_cleanly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with trio.fail_after(20):
        await _load("embed_in_trio_app").main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("server listening on http://127.0.0.1:")
    assert lines[1:] == ["You said: hello from my trio app", "server stopped"]


async def test_service_example_streams_without_http(capsys: pytest.CaptureFixture[str]) -> None:
    with trio.fail_after(20):
        await _load("service_without_http").main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == " the quick brown fox jumps over a lazy dog the quick brown"
    assert re.fullmatch(r"completed \d+ output tokens", lines[1])


async def test_sdk_client_example_against_a_server(server: Server) -> None:
    result = await trio.run_process(
        [sys.executable, str(EXAMPLES / "sdk_client.py"), server.base_url],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == [
        "plain: You said: hello",
        "stream:  the quick brown fox jumps over a lazy -> completed",
        "function call: get_weather {'city': 'Paris'}",
        "answer: Tool result: sunny",
    ]


def test_examples_are_covered() -> None:
    names = {path.stem for path in EXAMPLES.glob("*.py")}
    assert names == {"embed_in_trio_app", "service_without_http", "sdk_client"}
