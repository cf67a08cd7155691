"""Stepped pacing: one shared clock tick hands every running request its next token."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from trio_responses import EngineError
from trio_responses.engine import GenerationRequest, SamplingSettings
from trio_responses.engine.scripted import open_scripted_engine
from trio_responses.harmony.encoding import stop_tokens
from trio_responses.harmony.prompt import build_conversation, render_prompt
from trio_responses.protocol.request import parse_create_request


def _request(text: str, request_id: str = "r1", max_tokens: int = 10_000) -> GenerationRequest:
    request = parse_create_request({"model": "m", "input": text})
    prompt = render_prompt(build_conversation(request, request.input_items, date="2026-11-30"))
    return GenerationRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=SamplingSettings(max_tokens=max_tokens, stop_token_ids=stop_tokens()),
    )


class Timed:
    """Collects tokens with the (trio) time each arrived."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.times: list[float] = []

    def __call__(self, batch: Sequence[int]) -> None:
        self.tokens.extend(batch)
        self.times.extend(trio.current_time() for _ in batch)


async def test_every_running_request_advances_on_the_same_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_scripted_engine(model="m", token_delay_s=0.5, stepped=True) as engine:
        sinks = [Timed() for _ in range(3)]
        results = []

        async def one(index: int, text: str) -> None:
            results.append(await engine.generate(_request(text, f"r{index}"), sinks[index]))

        async with trio.open_nursery() as nursery:
            for index, text in enumerate(["tokens:10", "tokens:10", "tokens:30"]):
                nursery.start_soon(one, index, text)
        assert engine.running_requests == frozenset()
    first = sinks[0].times
    assert sinks[1].times == first  # same ticks
    assert sinks[2].times[: len(first)] == first
    gaps = {round(b - a, 6) for a, b in zip(sinks[2].times, sinks[2].times[1:], strict=False)}
    assert gaps == {0.5}
    assert all(result.finish_reason == "stop" for result in results)
    assert sorted(r.output_tokens for r in results) == sorted(len(s.tokens) for s in sinks)


async def test_same_tokens_as_unstepped(autojump_clock: trio.testing.MockClock) -> None:
    async with open_scripted_engine(model="m", token_delay_s=0.1) as plain:
        expected = Timed()
        await plain.generate(_request("tokens:20", max_tokens=15), expected)
    async with open_scripted_engine(model="m", token_delay_s=0.1, stepped=True) as engine:
        got = Timed()
        result = await engine.generate(_request("tokens:20", max_tokens=15), got)
    assert got.tokens == expected.tokens
    assert result.finish_reason == "length"
    assert result.output_tokens == 15


async def test_fail_and_raising_sink_and_cancel(autojump_clock: trio.testing.MockClock) -> None:
    async with open_scripted_engine(model="m", token_delay_s=1.0, stepped=True) as engine:
        failing = Timed()
        with pytest.raises(EngineError, match=r"after 4 tokens.*fail:4"):
            await engine.generate(_request("fail:4"), failing)
        assert len(failing.tokens) == 4

        def broken(batch: Sequence[int]) -> None:
            raise ValueError("downstream broke")

        with pytest.raises(ValueError, match="downstream broke"):
            await engine.generate(_request("hi"), broken)

        cancelled = Timed()
        with trio.move_on_after(5.5):
            await engine.generate(_request("tokens:100"), cancelled)
        count = len(cancelled.tokens)
        assert 5 <= count <= 6
        await trio.sleep(3)  # the clock goes on ticking for nobody
        assert len(cancelled.tokens) == count
        assert engine.running_requests == frozenset()


async def test_own_delay_keeps_its_own_timer(autojump_clock: trio.testing.MockClock) -> None:
    async with open_scripted_engine(model="m", token_delay_s=1.0, stepped=True) as engine:
        paced = Timed()
        start = trio.current_time()
        await engine.generate(_request("tokens:10 delay:100"), paced)
        assert trio.current_time() - start == pytest.approx(0.1 * (len(paced.tokens) - 1))
