"""Child process of bench/cpu_per_token.py: the server, noting when each token is made.

    python bench/_paced_server.py HOST PORT TIMES_PATH [serve flags as Config fields...]

Runs the real server (`open_responses_service` + `serve_service`, the scripted
engine, the start-up heap frozen as ``trio-responses serve`` does) with one
addition: a thin wrapper around the engine notes the ``time.monotonic()`` of
every token it hands to the server (one list append per token, well under a
microsecond). On SIGTERM it stops and writes, to TIMES_PATH, a JSON object:
response id -> the emission time of each token. ``time.monotonic`` is the
system-wide CLOCK_MONOTONIC, so the client process can
compare its arrival times with these.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

import trio_responses._service as service_module
from trio_responses import Config, open_responses_service, serve_service
from trio_responses.cli import freeze_startup_heap
from trio_responses.engine.base import GenerationRequest, GenerationResult, TokenSink

TIMES: dict[str, list[float]] = {}
_open_engine = service_module.open_engine


class TimedEngine:
    """Delegates to the real engine; notes when each token reaches the server."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate(self, request: GenerationRequest, sink: TokenSink) -> GenerationResult:
        times = TIMES.setdefault(request.request_id.rsplit("-", 1)[0], [])
        monotonic = time.monotonic

        def timed(tokens: Sequence[int]) -> None:
            if len(tokens) == 1:  # one token a step: no list to build
                times.append(monotonic())
            else:
                times.extend([monotonic()] * len(tokens))
            sink(tokens)

        result: GenerationResult = await self._inner.generate(request, timed)
        return result


@asynccontextmanager
async def _timed_engine(config: Config) -> AsyncIterator[Any]:
    async with _open_engine(config) as engine:
        yield TimedEngine(engine)


async def main(host: str, port: int, times_path: str, fields: dict[str, Any]) -> None:
    service_module.open_engine = _timed_engine  # type: ignore[assignment]
    config = Config(host=host, port=port, log_level="warning", **fields)
    async with open_responses_service(config) as service, trio.open_nursery() as nursery:
        freeze_startup_heap()  # as `trio-responses serve` does
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            await nursery.start(serve_service, service)
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()
    with open(times_path, "w") as out:  # noqa: ASYNC230 (after the run)
        json.dump(TIMES, out)


if __name__ == "__main__":
    pairs = (arg.split("=", 1) for arg in sys.argv[4:])
    trio.run(
        main,
        sys.argv[1],
        int(sys.argv[2]),
        sys.argv[3],
        {name: json.loads(value) for name, value in pairs},
    )
