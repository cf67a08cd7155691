"""The generation loop of one job: engine turns, translation, terminal state.

`generate_response` runs inside the job's task. It returns normally with the
builder in a terminal state for every outcome that is not cancellation:
completed, incomplete (token budget), failed (engine error, malformed model
output, a bug). `trio.Cancelled` propagates untouched; the job runner decides
what a cancellation means.
"""

from __future__ import annotations

import logging

from ._exceptions import EngineError
from .background.job import Job
from .engine.base import Engine, GenerationRequest, SamplingSettings
from .harmony.encoding import stop_tokens
from .harmony.translator import MalformedOutput, TurnTranslator

logger = logging.getLogger("trio_responses.generation")


async def generate_response(job: Job, engine: Engine, *, max_model_len: int) -> None:
    """Produce the job's output until it reaches a terminal state."""
    builder = job.builder
    request = job.request
    builder.mark_in_progress()
    prompt = job.prompt_tokens
    budget = request.max_output_tokens
    room = max_model_len - len(prompt)
    max_tokens = room if budget is None else min(budget, room)
    translator = TurnTranslator(builder)
    try:
        result = await engine.generate(
            GenerationRequest(
                request_id=job.id,
                prompt_token_ids=prompt,
                sampling=SamplingSettings(
                    max_tokens=max_tokens,
                    temperature=request.temperature,
                    top_p=request.top_p,
                    stop_token_ids=stop_tokens(),
                ),
            ),
            translator.feed,
        )
    except EngineError as error:
        _count(job, translator, prompt_tokens=len(prompt), cached_tokens=0)
        job.finish("failed", error=_error(str(error)))
        return
    except MalformedOutput as error:
        _count(job, translator, prompt_tokens=len(prompt), cached_tokens=0)
        job.finish("failed", error=_error(f"{error}."))
        return
    _count(job, translator, prompt_tokens=result.prompt_tokens, cached_tokens=result.cached_tokens)
    outcome = translator.finish(result.finish_reason)
    if outcome.kind in ("final", "tool_call"):
        job.finish("completed")
    elif outcome.kind == "truncated":
        job.finish("incomplete", incomplete_reason="max_output_tokens")
    elif any(item["type"] == "message" for item in builder.output):
        job.finish("completed")
    else:
        job.finish("failed", error=_error("The model stopped before giving an answer."))


def _count(job: Job, translator: TurnTranslator, *, prompt_tokens: int, cached_tokens: int) -> None:
    usage = job.builder.usage
    usage.input_tokens += prompt_tokens
    usage.cached_tokens += cached_tokens
    usage.output_tokens += translator.output_tokens
    usage.reasoning_tokens += translator.reasoning_tokens


def _error(message: str) -> dict[str, str]:
    return {"code": "server_error", "message": message}
