"""The examples in examples/ run as documented."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import sys
from types import ModuleType

import pytest
import trio

from tests.conftest import StartServer
from tests.support import Server

PACKAGES_VARIABLE = "TRIO_RESPONSES_TEST_PACKAGES"
"""The directory of the sandbox's extra packages (numpy, pandas, matplotlib) the
tests use, built by ``scripts/sandbox-packages``."""

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


async def test_plot_example_saves_the_png_the_code_made(
    start_server: StartServer, tmp_path: pathlib.Path
) -> None:
    packages = os.environ.get(PACKAGES_VARIABLE)
    if not packages:
        pytest.skip(f"{PACKAGES_VARIABLE} is not set (scripts/test sets it)")
    server = await start_server(code_interpreter=True, python_packages=packages)
    out = tmp_path / "plot.png"
    result = await trio.run_process(
        [sys.executable, str(EXAMPLES / "plot_with_code_interpreter.py"), server.base_url, out],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert lines[0].startswith("container: cntr_")
    assert lines[1] == "logs: saved /mnt/data/plot.png"
    assert lines[2] == f"saved: plot.png -> {out}"
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_examples_are_covered() -> None:
    names = {path.stem for path in EXAMPLES.glob("*.py")}
    assert names == {
        "embed_in_trio_app",
        "service_without_http",
        "sdk_client",
        "plot_with_code_interpreter",
    }
