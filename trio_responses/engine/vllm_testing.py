"""Testing aid for the vLLM engine: make any model emit the scripted model's tokens.

`ScriptedLogitsProcessor` is a vLLM V1 logits processor. For a request whose
``SamplingParams.extra_args["script"]`` holds a token list, it allows only the
next token of that list at each step, so even a model with random weights
produces exact harmony output. ``extra_args["delay_s"]`` (the script's
``delay:MS``) paces it: each step that forces such a request's token takes at
least that long (the engine sleeps), so a test can act while it is mid-answer
however fast the model is, and without starving other processes of the CPU.
The engine fills ``script`` (and ``delay_s``) from
`trio_responses.engine.script.plan` when started with ``engine_script=True``
(``--engine-script``): the real vLLM engine then answers like the scripted
engine, which is how the test suite drives vLLM end to end on a CPU.

vLLM loads this class by name in its engine process (it spawns), so it lives in
an importable module and imports nothing from the rest of the server.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)


class ScriptedLogitsProcessor(LogitsProcessor):  # type: ignore[misc]
    """Forces each scripted request's next token; others are left alone."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        # batch index -> (script, the request's live list of output token ids, delay)
        self._scripts: dict[int, tuple[list[int], list[int], float]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._scripts.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            extra = (params.extra_args or {}) if params is not None else {}
            script = extra.get("script")
            if script:
                delay = float(extra.get("delay_s") or 0.0)
                self._scripts[index] = (list(script), output, delay)
            else:
                self._scripts.pop(index, None)
        for source, target, direction in batch_update.moved:
            moving = self._scripts.pop(source, None)
            other = self._scripts.pop(target, None)
            if moving is not None:
                self._scripts[target] = moving
            if direction == MoveDirectionality.SWAP and other is not None:
                self._scripts[source] = other

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        pause = 0.0
        for index, (script, output, delay) in self._scripts.items():
            step = len(output)
            if step < len(script):
                logits[index, :] = float("-inf")
                logits[index, script[step]] = 0.0
                pause = max(pause, delay)
        if pause > 0:
            time.sleep(pause)
        return logits
