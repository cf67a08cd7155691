"""The Vercel AI SDK (``ai`` + ``@ai-sdk/openai``, ``openai.responses(model)``).

``tests/clients/js/vercel_ai.mjs`` runs one scenario per node process against the
test's server and prints what the SDK returned, with the request bodies it sent.
Its packages come from ``tests/clients/js/package-lock.json``: ``npm ci`` installs
them (CI does so before pytest; here it runs when they are missing). Without node
and npm these tests fail: they are part of what this server promises.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import trio

from tests.support import MODEL, Server

JS = pathlib.Path(__file__).parent / "js"
SCRIPT = JS / "vercel_ai.mjs"
MIN_NODE = 18


def _pinned_packages_installed() -> bool:
    """Whether node_modules holds exactly the versions package.json pins."""
    pinned: dict[str, str] = json.loads((JS / "package.json").read_text())["dependencies"]
    for name, version in pinned.items():
        manifest = JS / "node_modules" / name / "package.json"
        if not manifest.is_file() or json.loads(manifest.read_text())["version"] != version:
            return False
    return True


@pytest.fixture(scope="session")
def node() -> str:
    """The node executable, with the SDK's packages installed (``npm ci``).

    Raises:
        pytest.fail.Exception: node or npm is missing or too old, or ``npm ci`` failed.
    """
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "The Vercel AI SDK tests need node (>= 18) and npm: install them "
            "(Debian: apt-get install nodejs npm), then run "
            "'npm ci --prefix tests/clients/js'."
        )
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < MIN_NODE:
        pytest.fail(f"The Vercel AI SDK needs node >= {MIN_NODE}; this is node {version}.")
    if not _pinned_packages_installed():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=JS,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.fail(
                f"'npm ci' in {JS} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
            )
    return node


async def _scenario(node: str, server: Server, name: str) -> dict[str, Any]:
    """Run one scenario of vercel_ai.mjs; its JSON result.

    Raises:
        AssertionError: the script failed (the SDK threw) or printed no JSON.
        trio.TooSlowError: it took more than a minute.
    """
    with trio.fail_after(60):
        done = await trio.run_process(
            [node, str(SCRIPT), server.base_url, MODEL, name],
            cwd=JS,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"the Vercel AI SDK failed ({name}):\n{stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _input_types(request: dict[str, Any]) -> list[str]:
    return [item.get("type", "message") for item in request["input"]]


async def test_generate_text(node: str, server: Server) -> None:
    result = await _scenario(node, server, "generate")
    assert result["text"] == "You said: hello"
    assert result["finishReason"] == "stop"
    assert result["modelId"] == MODEL
    usage = result["usage"]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    assert usage["outputTokenDetails"]["reasoningTokens"] > 0
    stored = await server.client.responses.retrieve(result["responseId"])
    assert stored.output_text == "You said: hello"


async def test_stream_text(node: str, server: Server) -> None:
    result = await _scenario(node, server, "stream")
    assert len(result["chunks"]) > 1, "the answer arrived in one piece, not streamed"
    assert "".join(result["chunks"]) == result["text"] == "You said: hello stream"
    assert result["finishReason"] == "stop"
    assert result["usage"]["outputTokens"] > 0
    [request] = result["requests"]
    assert request["stream"] is True
    assert request["input"][0] == {"role": "developer", "content": "Be brief."}


def _check_tool_loop(result: dict[str, Any]) -> None:
    """Two steps: the call of get_weather (run by the SDK), then the answer."""
    call, answer = result["steps"]
    assert call["finishReason"] == "tool-calls"
    assert call["toolCalls"] == [{"toolName": "get_weather", "input": {"city": "Paris"}}]
    assert call["toolResults"] == [{"toolName": "get_weather", "output": "sunny in Paris"}]
    assert answer["finishReason"] == "stop"
    assert answer["toolCalls"] == []
    assert result["text"] == answer["text"] == "Tool result: sunny in Paris"
    assert len(result["requests"]) == 2


async def test_tool_loop_with_stored_items(node: str, server: Server) -> None:
    # store: true (the default): the SDK refers to the stored reasoning item by id.
    result = await _scenario(node, server, "tools-stored")
    _check_tool_loop(result)
    second = result["requests"][1]
    assert _input_types(second) == [
        "message",
        "item_reference",
        "function_call",
        "function_call_output",
    ]


async def test_streamed_tool_loop_with_stored_items(node: str, server: Server) -> None:
    result = await _scenario(node, server, "tools-stored-stream")
    _check_tool_loop(result)
    assert "".join(result["chunks"]) == "Tool result: sunny in Paris"
    assert all(request["stream"] is True for request in result["requests"])
    assert "item_reference" in _input_types(result["requests"][1])


async def test_stateless_tool_loop(node: str, server: Server) -> None:
    # store: false: nothing is kept, the reasoning goes back as encrypted_content.
    result = await _scenario(node, server, "tools-stateless")
    _check_tool_loop(result)
    first, second = result["requests"]
    assert first["store"] is False
    assert first["include"] == ["reasoning.encrypted_content"]
    [reasoning] = [item for item in second["input"] if item.get("type") == "reasoning"]
    assert reasoning["encrypted_content"], "the SDK got no encrypted reasoning to send back"
    assert "item_reference" not in _input_types(second)
