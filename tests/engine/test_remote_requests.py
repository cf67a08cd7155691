"""What the remote engine sends upstream (`engine.remote.request_body`), per API.

The requests themselves are tested against real ``vllm serve`` upstreams
(``tests/vllm/remote``); here, the mapping: the whole prompt as token ids, the
sampling settings as vLLM's fields, each constraint as its ``structured_outputs``,
a stable salt per tenant, and the forced script only when asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from trio_responses.engine.base import (
    ChoiceConstraint,
    GenerationRequest,
    GrammarConstraint,
    JsonConstraint,
    OutputConstraint,
    SamplingSettings,
)
from trio_responses.engine.remote import cache_salt, request_body

SAMPLING = SamplingSettings(
    max_tokens=50, temperature=0.5, top_p=None, seed=7, stop_token_ids=(200002, 200012)
)


def _body(api: Any, constraint: OutputConstraint | None = None, **fields: Any) -> dict[str, Any]:
    request = GenerationRequest(
        request_id="resp_1",
        prompt_token_ids=[200006, 1, 2, 3],
        sampling=SAMPLING,
        constraint=constraint,
        tenant=fields.pop("tenant", "owner-a"),
    )
    body: dict[str, Any] = json.loads(request_body(api, "gpt-oss", request, **fields))
    return body


def test_completions_carry_token_ids_and_vllms_sampling_fields() -> None:
    body = _body("completions")
    assert body["prompt"] == [200006, 1, 2, 3]
    assert body["return_token_ids"] is True and body["skip_special_tokens"] is False
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (
        50,
        0.5,
        1.0,
        7,
    )
    assert body["stop_token_ids"] == [200002, 200012]
    assert body["model"] == "gpt-oss" and body["request_id"] == "resp_1"
    assert "structured_outputs" not in body and "vllm_xargs" not in body


def test_the_token_api_carries_vllms_sampling_params_as_they_are() -> None:
    body = _body("generate", script=[5, 6])
    assert body["token_ids"] == [200006, 1, 2, 3] and "prompt" not in body
    sampling = body["sampling_params"]
    assert sampling["max_tokens"] == 50 and sampling["stop_token_ids"] == [200002, 200012]
    assert sampling["extra_args"] == {"script": [5, 6]}
    assert "max_tokens" not in body


def test_a_scripts_pace_goes_with_it() -> None:
    assert _body("completions", script=[5], delay_s=0.02)["vllm_xargs"] == {
        "script": [5],
        "delay_s": 0.02,
    }
    paced = _body("generate", script=[5], delay_s=0.02)["sampling_params"]["extra_args"]
    assert paced == {"script": [5], "delay_s": 0.02}
    assert "vllm_xargs" not in _body("completions", delay_s=0.02)


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        (JsonConstraint({"type": "object"}), {"json": {"type": "object"}}),
        (ChoiceConstraint(("a", "b")), {"choice": ["a", "b"]}),
        (GrammarConstraint("lark", 'start: "x"'), {"grammar": 'start: "x"'}),
        (GrammarConstraint("regex", "[a-z]+"), {"regex": "[a-z]+"}),
    ],
)
def test_each_constraint_is_vllms_structured_outputs(
    constraint: OutputConstraint, expected: dict[str, Any]
) -> None:
    assert _body("completions", constraint)["structured_outputs"] == expected
    assert _body("generate", constraint)["sampling_params"]["structured_outputs"] == expected


def test_each_tenant_has_its_own_stable_cache_salt() -> None:
    assert _body("completions")["cache_salt"] == cache_salt("owner-a") == cache_salt("owner-a")
    assert _body("completions", tenant="owner-b")["cache_salt"] != cache_salt("owner-a")
    assert cache_salt(None) != cache_salt("owner-a")


def test_the_remote_engine_needs_neither_vllm_nor_trio_asyncio() -> None:
    code = (
        "import sys, trio_responses.engine.remote, trio_responses._service;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'trio_asyncio', 'torch'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stdout
