"""The scripted engine plays a script back: limits, failures, cancellation, pacing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from trio_responses import EngineError
from trio_responses.engine import GenerationRequest, SamplingSettings, ScriptedEngine
from trio_responses.harmony.encoding import stop_tokens
from trio_responses.harmony.prompt import build_conversation, render_prompt
from trio_responses.protocol.request import parse_create_request


def _request(text: str, max_tokens: int = 10_000) -> GenerationRequest:
    request = parse_create_request({"model": "m", "input": text})
    prompt = render_prompt(build_conversation(request, request.input_items, date="2026-11-30"))
    return GenerationRequest(
        request_id="r1",
        prompt_token_ids=prompt,
        sampling=SamplingSettings(max_tokens=max_tokens, stop_token_ids=stop_tokens()),
    )


class Collect:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    def __call__(self, batch: Sequence[int]) -> None:
        self.tokens.extend(batch)


async def test_stops_at_the_stop_token() -> None:
    engine = ScriptedEngine(model="m")
    sink = Collect()
    result = await engine.generate(_request("hi"), sink)
    assert result.finish_reason == "stop"
    assert result.output_tokens == len(sink.tokens)
    assert sink.tokens[-1] in stop_tokens()
    assert result.prompt_tokens == len(_request("hi").prompt_token_ids)


async def test_max_tokens_truncates() -> None:
    engine = ScriptedEngine(model="m")
    sink = Collect()
    result = await engine.generate(_request("tokens:100", max_tokens=12), sink)
    assert result.finish_reason == "length"
    assert len(sink.tokens) == result.output_tokens == 12


async def test_fail_raises_after_n_tokens() -> None:
    engine = ScriptedEngine(model="m")
    sink = Collect()
    with pytest.raises(EngineError, match=r"after 4 tokens.*fail:4"):
        await engine.generate(_request("fail:4"), sink)
    assert len(sink.tokens) == 4
    assert engine.running_requests == frozenset()


async def test_token_delay_paces_output(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(model="m", token_delay_s=0.5)
    sink = Collect()
    start = trio.current_time()
    result = await engine.generate(_request("tokens:10"), sink)
    assert trio.current_time() - start == pytest.approx(0.5 * (result.output_tokens - 1))
    paced = Collect()
    start = trio.current_time()
    await engine.generate(_request("tokens:10 delay:100"), paced)
    assert trio.current_time() - start == pytest.approx(0.1 * (len(paced.tokens) - 1))


async def test_cancellation_stops_at_once(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(model="m", token_delay_s=1.0)
    sink = Collect()
    with trio.move_on_after(5.5):
        await engine.generate(_request("tokens:100"), sink)
    assert len(sink.tokens) == 6
    assert engine.running_requests == frozenset()


async def test_a_raising_sink_aborts_generation() -> None:
    engine = ScriptedEngine(model="m")

    def sink(batch: Sequence[int]) -> None:
        raise ValueError("downstream broke")

    with pytest.raises(ValueError, match="downstream broke"):
        await engine.generate(_request("hi"), sink)
    assert engine.running_requests == frozenset()
