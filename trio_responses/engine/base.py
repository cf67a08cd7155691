"""The `Engine` protocol: prompt tokens in, output tokens out, incrementally.

An engine is opened by an async context manager (it may own tasks and, for
vLLM, an asyncio loop) and then serves any number of concurrent `generate`
calls. ``generate`` delivers output tokens by calling ``sink`` with each batch
as soon as it exists, and returns how generation finished.

Cancellation: cancelling the task that awaits `generate` aborts the request
upstream before `generate` returns (shielded and time-bounded: in a
`cleanup_scope`, so that the abort is part of the job's cleanup and keeps to its
deadline). If ``sink`` raises, generation is aborted the same way and the
exception propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

TokenSink = Callable[[Sequence[int]], None]
"""Receives output tokens in order; called synchronously by the engine."""

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class JsonConstraint:
    """The output text must be one JSON value valid against ``schema``."""

    schema: Mapping[str, Any]


@dataclass(frozen=True)
class ChoiceConstraint:
    """The output text must be exactly one of ``choices``."""

    choices: tuple[str, ...]


@dataclass(frozen=True)
class GrammarConstraint:
    """The output text must be a sentence of a custom tool's grammar: ``definition``
    in ``syntax`` (``lark``: Lark EBNF, rule ``start``; ``regex``: the whole text
    matches), checked by `protocol.grammar.check_grammar`."""

    syntax: Literal["lark", "regex"]
    definition: str


OutputConstraint = JsonConstraint | ChoiceConstraint | GrammarConstraint
"""What the whole output of a constrained request must be.

The output is the constrained text followed by one of the request's stop
tokens (or it ends at ``max_tokens``). The prompt usually ends with a prefilled
harmony header (``...<|channel|>final<|message|>``), so only that message's body
is constrained; reasoning before it is generated without one.
"""


@dataclass(frozen=True)
class SamplingSettings:
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


def sampling_kwargs(sampling: SamplingSettings) -> dict[str, Any]:
    """Keyword arguments for vLLM's ``SamplingParams`` from `SamplingSettings`.

    What the request left out gets OpenAI's default (temperature and top_p 1,
    no penalties), which is also what the Response echoes. Kept free of vLLM
    imports so the mapping is testable without it.
    """
    return {
        "max_tokens": sampling.max_tokens,
        "temperature": 1.0 if sampling.temperature is None else sampling.temperature,
        "top_p": 1.0 if sampling.top_p is None else sampling.top_p,
        "presence_penalty": sampling.presence_penalty or 0.0,
        "frequency_penalty": sampling.frequency_penalty or 0.0,
        "seed": sampling.seed,
        "stop_token_ids": list(sampling.stop_token_ids),
    }


def structured_outputs_fields(constraint: OutputConstraint | None) -> dict[str, Any] | None:
    """vLLM's structured-outputs fields for a constraint (``json``, ``choice``,
    ``grammar``, ``regex``): ``StructuredOutputsParams`` in process, the request's
    ``structured_outputs`` over HTTP. Kept free of vLLM imports, like `sampling_kwargs`."""
    if constraint is None:
        return None
    if isinstance(constraint, ChoiceConstraint):
        return {"choice": list(constraint.choices)}
    if isinstance(constraint, GrammarConstraint):
        key = "regex" if constraint.syntax == "regex" else "grammar"
        return {key: constraint.definition}
    return {"json": dict(constraint.schema)}


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    sampling: SamplingSettings
    constraint: OutputConstraint | None = None
    """Every engine honours it: the output text matches it (see `OutputConstraint`)."""
    tenant: str | None = None
    """Who the request is for (the API key's owner): engines that share a prefix
    cache across requests keep tenants apart by it."""


@dataclass(frozen=True)
class GenerationResult:
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class EngineInfo:
    """What the engine is, for ``/v1/models``, ``/health`` and the start-up log."""

    kind: Literal["scripted", "vllm", "remote"]
    model: str
    description: str
    max_model_len: int | None = None
    """The context window the engine enforces, where the engine decides it (a remote
    upstream's ``--max-model-len``): the server never asks for more."""


@dataclass(frozen=True)
class UpstreamHealth:
    """One upstream server of an engine that fronts others, for ``/health`` and ``/metrics``."""

    url: str
    up: bool
    outstanding: int
    """Requests this process has open on it."""
    failures: int
    """Times it was taken out (it could not be reached, or broke a stream)."""
    api: str
    """Which of its APIs the engine uses (``generate`` or ``completions``)."""
    last_error: str | None


class Engine(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    @property
    def healthy(self) -> bool: ...

    def statistics(self) -> dict[str, int]:
        """Counts for ``/health``: at least ``running`` (requests generating now)."""
        ...

    async def generate(self, request: GenerationRequest, sink: TokenSink) -> GenerationResult:
        """Generate until a stop token, ``max_tokens`` or an error.

        Raises:
            EngineError: the engine failed; tokens already delivered stand.
        """
        ...


@runtime_checkable
class Fronting(Protocol):
    """An engine that generates on upstream servers (the remote engine)."""

    def upstream_health(self) -> Sequence[UpstreamHealth]: ...


def upstream_health(engine: Engine) -> Sequence[UpstreamHealth]:
    """The upstreams of an engine that fronts servers; none for an in-process engine."""
    return engine.upstream_health() if isinstance(engine, Fronting) else ()
