"""The trio-responses command: flags, environment, start-up, graceful stop."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import socket
import subprocess
import sys

import httpx2
import openai
import pytest
import trio

from tests.processes import ServeCommand
from trio_responses._config import redacted_url
from trio_responses.cli import build_parser, config_from_args


def _config(argv: list[str], env: dict[str, str] | None = None) -> object:
    return config_from_args(build_parser().parse_args(["serve", *argv]), env or {})


def test_flags_and_environment() -> None:
    config = _config(
        ["--port", "9000", "--api-key", "a", "--api-key", "b", "--token-delay", "0.01"],
        {"TRIO_RESPONSES_HOST": "::1", "TRIO_RESPONSES_PORT": "1"},
    )
    assert config.port == 9000  # type: ignore[attr-defined]
    assert config.host == "::1"  # type: ignore[attr-defined]
    assert config.api_keys == ("a", "b")  # type: ignore[attr-defined]
    assert config.token_delay_s == 0.01  # type: ignore[attr-defined]
    from_env = _config([], {"TRIO_RESPONSES_API_KEY": "x,y", "TRIO_RESPONSES_LOG_LEVEL": "debug"})
    assert from_env.api_keys == ("x", "y")  # type: ignore[attr-defined]
    assert from_env.engine == "scripted"  # type: ignore[attr-defined]


def test_help_documents_every_option_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for flag in (
        "--host",
        "--port",
        "--engine",
        "--model",
        "--served-model-name",
        "--api-key",
        "--token-delay",
        "--log-level",
        "--tool-server",
        "--code-interpreter",
        "--mcp-allow-host",
        "--tool-timeout",
        "--shutdown-grace",
        "--max-active-jobs",
        "--stream-retention",
    ):
        assert flag in text
        variable = "TRIO_RESPONSES_" + flag[2:].upper().replace("-", "_")
        assert variable in text


def _serve(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``trio-responses serve FLAGS`` run to its end (it is expected not to start)."""
    return subprocess.run(
        [sys.executable, "-m", "trio_responses", "serve", *flags],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _complaints(stderr: str) -> list[str]:
    """What the command said besides its INFO lines (start-up notes)."""
    return [line for line in stderr.splitlines() if line and " INFO " not in line]


def _assert_usage_error(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Exit 2, ``serve``'s own usage line, then one line saying what is wrong."""
    assert result.returncode == 2, result.stderr
    usage, error = result.stderr.splitlines()
    assert usage.startswith("usage: trio-responses serve [OPTIONS]")
    assert error.startswith("trio-responses serve: error: ")
    for text in expected:
        assert text in error


def _assert_one_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Exit 1 and one ERROR line saying what is wrong; no traceback."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = _complaints(result.stderr)
    assert " ERROR " in line
    for text in expected:
        assert text in line, line


def test_bad_values_are_reported() -> None:
    _assert_usage_error(_serve("--port", "70000"), "port must be between 0 and 65535")
    _assert_usage_error(_serve("--port", "abc"), "--port", "'abc'")
    _assert_usage_error(_serve(env={"TRIO_RESPONSES_PORT": "abc"}), "TRIO_RESPONSES_PORT", "'abc'")
    _assert_usage_error(
        _serve(env={"TRIO_RESPONSES_LOG_LEVEL": "loud"}), "TRIO_RESPONSES_LOG_LEVEL", "'loud'"
    )


@pytest.mark.parametrize("pattern", ["not a pattern!!", "127.0.0.1:99999", "mcp.example.com/x"])
def test_host_patterns_are_checked_before_start(pattern: str) -> None:
    _assert_usage_error(_serve("--mcp-allow-host", pattern), f"--mcp-allow-host {pattern!r}")


@pytest.mark.parametrize(
    "pattern", ["mcp.example.com", "*.internal:8080", "10.0.0.0/8", "[::1]:8080", "::1", "10.0.*"]
)
def test_host_patterns_of_every_documented_kind_are_accepted(pattern: str) -> None:
    assert _config(["--mcp-allow-host", pattern]).mcp_allow_hosts == (pattern,)  # type: ignore[attr-defined]


def test_a_port_in_use_is_one_line_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("--port", str(port))
    _assert_one_line(
        result, f"cannot listen on 127.0.0.1:{port}", "Address already in use", "--port"
    )


def test_the_traceback_is_shown_at_debug_level() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = _serve("--port", str(taken.getsockname()[1]), "--log-level", "debug")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "OSError" in result.stderr


def test_a_model_without_vllm_names_the_install_command() -> None:
    # Whatever this environment has installed, the child cannot import vLLM's bridge.
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['trio_asyncio'] = sys.modules['vllm'] = None; "
            "from trio_responses.cli import main; sys.exit(main())",
            "serve",
            "--port",
            "0",
            "--model",
            "openai/gpt-oss-20b",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    _assert_one_line(result, "--model needs the vLLM engine", "pip install -e '.[vllm]'")


def test_a_wrong_vocabulary_folder_names_the_folder_and_the_variable(
    tmp_path: pathlib.Path,
) -> None:
    result = _serve("--port", "0", env={"TIKTOKEN_ENCODINGS_BASE": str(tmp_path)})
    _assert_one_line(result, f"TIKTOKEN_ENCODINGS_BASE={str(tmp_path)!r}", "o200k_base.tiktoken")


def test_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: ]" not in text
    assert "TRIO_RESPONSES_API_KEY; default: none]" in text
    assert "TRIO_RESPONSES_DASHBOARD; default: off]" in text
    assert "TRIO_RESPONSES_PORT; default: 8000]" in text


async def test_serve_command_answers_and_stops_on_sigterm(nursery: trio.Nursery) -> None:
    command = await ServeCommand.start(nursery)
    assert b"SCRIPTED engine" in command.log
    # What start-up built is out of the collector's way (the modules alone are more).
    frozen = re.search(rb"start-up heap: (\d+) objects frozen", command.log)
    assert frozen is not None and int(frozen.group(1)) > 10_000, command.log.decode()
    async with httpx2.AsyncClient(base_url=command.url) as http:
        reply = await http.post("/v1/responses", json={"model": "gpt-oss-scripted", "input": "cli"})
    assert reply.json()["output"][1]["content"][0]["text"] == "You said: cli"
    code = await command.stop()
    assert code == 0, command.log.decode()
    assert b"shutting down" in command.log
    assert b"Traceback" not in command.log


async def test_sigterm_lets_jobs_end_and_exits_cleanly(nursery: trio.Nursery) -> None:
    command = await ServeCommand.start(nursery, "--shutdown-grace", "1")
    async with httpx2.AsyncClient(base_url=command.url, timeout=30) as http:
        created = await http.post(
            "/v1/responses",
            json={
                "model": "gpt-oss-scripted",
                "input": "tokens:100000 delay:10",
                "background": True,
            },
        )
        response_id = created.json()["id"]
        async with http.stream("GET", f"/v1/responses/{response_id}?stream=true") as stream:
            lines = stream.aiter_lines()
            async for line in lines:
                if line.startswith("event: response.output_text.delta"):
                    break
            started = trio.current_time()
            command.terminate()
            rest = [line async for line in lines]
    terminal = next(line for line in reversed(rest) if line.startswith("data: {"))
    assert '"type":"response.failed"' in terminal
    assert '"code":"server_shutdown"' in terminal
    assert "data: [DONE]" in rest
    code = await command.stop()
    assert trio.current_time() - started < 1 + 10
    assert code == 0, command.log.decode()
    text = command.log.decode()
    assert "Traceback" not in text and "leak" not in text.lower()
    assert f"{response_id} failed" in text


def test_tool_flags() -> None:
    config = _config(
        [
            "--code-interpreter",
            "--tool-server",
            "docs=stdio:docs-server --ro",
            "--mcp-allow-host",
            "*.internal",
            "--tool-timeout",
            "5",
        ],
    )
    assert config.code_interpreter is True  # type: ignore[attr-defined]
    assert config.tool_servers == ("docs=stdio:docs-server --ro",)  # type: ignore[attr-defined]
    assert config.mcp_allow_hosts == ("*.internal",)  # type: ignore[attr-defined]
    # The server runs the code interpreter's containers itself: no python tool server.
    assert config.all_tool_servers == ("docs=stdio:docs-server --ro",)  # type: ignore[attr-defined]
    from_env = _config([], {"TRIO_RESPONSES_CODE_INTERPRETER": "true"})
    assert from_env.code_interpreter is True  # type: ignore[attr-defined]


def test_code_run_budget_flags() -> None:
    config = _config(
        [
            "--code-interpreter",
            "--python-max-concurrent",
            "3",
            "--python-memory-budget-mb",
            "4096",
        ],
        {"TRIO_RESPONSES_PYTHON_MAX_CONCURRENT_PER_KEY": "1"},
    )
    assert config.python_max_concurrent == 3  # type: ignore[attr-defined]
    assert config.python_max_concurrent_per_key == 1  # type: ignore[attr-defined]
    assert config.python_memory_budget_mb == 4096  # type: ignore[attr-defined]
    defaults = _config(["--code-interpreter"])
    assert defaults.python_max_concurrent is None  # type: ignore[attr-defined]
    assert defaults.python_max_concurrent_per_key == 2  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="python_max_concurrent must be >= 1"):
        _config(["--python-max-concurrent", "0"])


def test_a_code_run_budget_that_does_not_fit_is_refused_at_start() -> None:
    result = _serve(
        "--port",
        "0",
        "--code-interpreter",
        "--python-max-concurrent",
        "2",
        "--python-memory-budget-mb",
        "100",
    )
    _assert_one_line(
        result, "cannot start the code interpreter", "2 runs at once", "budget of 100 MiB"
    )
    assert "listening on" not in result.stderr


def test_an_unreachable_store_is_reported_without_its_password() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trio_responses",
            "serve",
            "--port",
            "0",
            "--store",
            "redis://user:hunter2@127.0.0.1:1/0",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1
    assert "cannot use the store redis://user:***@127.0.0.1:1/0" in result.stderr
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:secret@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
        ("unix:///run/redis.sock?db=1&password=secret", "unix:///run/redis.sock?db=1&password=***"),
        ("sqlite:////var/lib/responses.db", "sqlite:////var/lib/responses.db"),
        ("memory://", "memory://"),
    ],
)
def test_store_urls_are_shown_without_passwords(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


async def test_sigterm_after_a_websocket_session_exits_within_the_grace_period(
    nursery: trio.Nursery,
) -> None:
    # A cleanup budget much longer than the grace period: waiting for connections
    # (up to grace + cleanup) would show.
    grace_s = 3
    command = await ServeCommand.start(
        nursery, "--shutdown-grace", str(grace_s), "--cleanup-timeout", "20"
    )

    async def session() -> str:
        client = openai.AsyncOpenAI(base_url=command.url + "/v1", api_key="unused", max_retries=0)
        try:
            async with client.responses.connect() as connection:
                await connection.send(
                    {"type": "response.create", "model": "gpt-oss-scripted", "input": "hi"}
                )
                async for event in connection:
                    if event.type == "response.completed":
                        return event.response.output_text
        finally:
            await client.close()
        raise AssertionError("the stream ended without response.completed")

    answer = await trio.to_thread.run_sync(lambda: asyncio.run(session()))
    assert answer == "You said: hi"
    await command.wait_for(rb"WebSocket /v1/responses closed")
    started = trio.current_time()
    assert await command.stop(timeout_s=60) == 0, command.log.decode()
    assert trio.current_time() - started < grace_s + 1, command.log.decode()


def test_the_remote_engine_needs_an_upstream_that_answers() -> None:
    _assert_usage_error(_serve("--engine", "remote"), "--upstream")
    _assert_usage_error(_serve("--upstream", "http://127.0.0.1:9"), "--engine remote")
    _assert_usage_error(_serve("--engine", "remote", "--upstream", "ftp://x"), "http://")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = _serve("--engine", "remote", "--upstream", f"http://127.0.0.1:{port}")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    error = [line for line in _complaints(result.stderr) if " ERROR " in line]
    assert len(error) == 1 and "no upstream answered /v1/models" in error[0], result.stderr
    assert f"http://127.0.0.1:{port}" in error[0]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), "memory:// is one process's memory"),
        (("--store", "sqlite:///never.db"), "a SQLite file is one process's"),
        (
            ("--store", "redis://127.0.0.1:1/0", "--model", "some/model"),
            "the vllm engine would load the model in each",
        ),
    ],
)
def test_workers_that_could_not_share_are_refused(flags: tuple[str, ...], expected: str) -> None:
    result = _serve("--port", "0", "--workers", "2", *flags)
    _assert_usage_error(result, "--workers 2", expected)
    assert not (pathlib.Path.cwd() / "never.db").exists()


def test_workers_flags_and_environment() -> None:
    config = _config(["--workers", "3", "--store", "redis://h:6379/0"])
    assert config.workers == 3  # type: ignore[attr-defined]
    from_env = _config([], {"TRIO_RESPONSES_WORKERS": "2", "TRIO_RESPONSES_STORE": "redis://h/0"})
    assert from_env.workers == 2  # type: ignore[attr-defined]
    one = _config(["--workers", "1", "--reuse-port", "--worker-id", "a-1"])
    assert (one.workers, one.reuse_port, one.worker_id) == (1, True, "a-1")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"^workers must be >= 1$"):
        _config(["--workers", "0"])
    with pytest.raises(ValueError, match=r"^worker id 'a b': use 1 to 64 letters"):
        _config(["--worker-id", "a b"])


def test_workers_that_cannot_start_stop_the_supervisor_with_their_reason() -> None:
    result = _serve(
        "--port", "0", "--workers", "2", "--store", "redis://user:hunter2@127.0.0.1:1/0"
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    # Each worker says why (they may both have started), then the supervisor stops.
    assert "cannot use the store redis://user:***@127.0.0.1:1/0" in result.stderr
    assert "exited with status 1 before it listened" in result.stderr
    assert "hunter2" not in result.stderr
    assert "listening on" not in result.stderr
