"""The python sandbox: fresh process, scrubbed environment, limits, nothing left behind."""

from __future__ import annotations

import json

import pytest
import trio

from trio_responses.tools.sandbox import Limits, run_python


async def test_runs_code_isolated_with_a_scrubbed_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    result = await run_python(
        "import json, os, sys\n"
        "print(json.dumps({'env': sorted(os.environ), 'cwd': os.getcwd(),"
        " 'isolated': sys.flags.isolated}))"
    )
    assert result.ok and result.problem is None
    report = json.loads(result.output)
    assert "SECRET_TOKEN" not in report["env"]
    assert set(report["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONIOENCODING", "LC_CTYPE"}
    assert report["isolated"] == 1
    assert not await trio.Path(report["cwd"]).exists()  # the working directory is gone


async def test_stderr_is_interleaved_and_failures_say_why() -> None:
    result = await run_python("print('out')\nimport sys\nprint('err', file=sys.stderr)\n1/0")
    assert not result.ok and result.problem == "exit status 1"
    assert result.output.startswith("out\nerr\n") and "ZeroDivisionError" in result.output


async def test_output_is_capped() -> None:
    result = await run_python("print('x' * 200_000)", Limits(output_bytes=1000))
    assert not result.ok and result.problem == "output limit exceeded"
    assert len(result.output) < 1200 and "[output truncated at 1000 bytes" in result.output


async def test_wall_clock_limit() -> None:
    result = await run_python("import time\ntime.sleep(30)", Limits(wall_s=0.5))
    assert not result.ok and result.problem == "wall-clock limit of 0.5 s exceeded"


async def test_nothing_it_starts_survives() -> None:
    result = await run_python(
        "import subprocess\nprint(subprocess.Popen(['sleep', '30']).pid, flush=True)",
        Limits(wall_s=20),
    )
    assert result.ok
    pid = int(result.output)
    # Killed at once (not after the wall-clock limit); at most a zombie awaiting its reaper.
    stat = trio.Path(f"/proc/{pid}/stat")
    if await stat.exists():
        assert (await stat.read_text()).split()[2] == "Z"
