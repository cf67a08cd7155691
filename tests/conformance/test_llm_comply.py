"""The Open Responses conformance suite (``llm-comply`` 0.5.0) against a real server.

One ``trio-responses serve`` child process (the scripted engine) and one
``llm-comply --json`` run against it, once for this module; each test of the suite
then gets its own pytest test, so a regression names the check that broke.

What the suite may not pass, and why (see docs/api.md, "Clients and conformance"):

- ``image-input``: gpt-oss models read text only; an ``input_image`` part is a 400
  ``unsupported_value`` naming the part. It must fail with exactly that status.
- Nothing else: ``tool-calling`` asks "What is the weather in San Francisco?" with
  ``tool_choice: "required"``, which this server enforces, so even the scripted engine
  (which otherwise calls a function only on a ``call:NAME {json}`` directive) answers
  with a ``get_weather`` call whose arguments match the tool's schema.

Ignored finding (``-i``): llm-comply names reasoning events ``response.reasoning.*``
and reports ours as unknown; this server names them ``response.reasoning_text.*``, as
the ``openai`` SDK's types do.

llm-comply runs its ``reasoning-summary`` test only for model names that contain
``o1``/``o3``/``o4``/``gpt-5``/``deepseek-r``; gpt-oss is a reasoning model, so the
server also serves the scripted engine as `MODEL`, a name that passes that filter.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from tests.processes import ServeCommand

MODEL = "gpt-oss-scripted-o4"
"""The name the suite sends as ``model`` (see the module docstring)."""
API_KEY = "sk-conformance"

IGNORED_FINDINGS = ("unknown SSE event type: response.reasoning_text.",)
"""Substrings of llm-comply findings that are not defects here (``-i``)."""

MUST_PASS = (
    "basic-response",
    "system-prompt",
    "multi-turn",
    "streaming-response",
    "streaming-usage",
    "assistant-phase",
    "response-output-phase-schema",
    "compact-response",
    "compact-missing-model",
    "reasoning-summary",
    "error-handling",
    "tool-calling",
)

MAY_FAIL: dict[str, tuple[str, ...]] = {
    # A text-only model: the image part is refused, with the right status.
    "image-input": ("HTTP 400 (expected [200])",),
}
"""Excluded tests: the findings each may report (every finding must contain one)."""

MAY_FAIL_ALSO: dict[str, tuple[str, ...]] = {
    # The validators that run after a 400 complain about the error body they got.
    "image-input": (
        "response.id is missing or empty",
        "response.output is missing or empty",
        "expected status='completed', got 'None'",
    ),
}


@dataclass
class Outcome:
    """One llm-comply test's result, as its ``--json`` report gives it."""

    status: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class Report:
    """The parsed ``--json`` report, and what both processes printed."""

    outcomes: dict[str, Outcome]
    output: str = field(repr=False)
    server_log: str = field(repr=False)


async def _run_suite() -> Report:
    """Serve, run llm-comply once, stop the server; the parsed report.

    Raises:
        AssertionError: the server did not start or stop cleanly, or llm-comply
            printed no JSON report.
        trio.TooSlowError: the whole run took more than a minute.
    """
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server = await ServeCommand.start(
                nursery,
                "--served-model-name",
                MODEL,
                "--api-key",
                API_KEY,
            )
            run = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "llm_comply.cli",
                    "--format",
                    "open-responses",
                    "--base-url",
                    server.url + "/v1",
                    "--api-key",
                    API_KEY,
                    "--model",
                    MODEL,
                    "--timeout",
                    "30",
                    "--ignore",
                    ",".join(IGNORED_FINDINGS),
                    "--json",
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            status = await server.stop()
    output = run.stdout.decode(errors="replace")
    log = server.log.decode(errors="replace")
    assert status == 0, f"the server did not shut down cleanly ({status}):\n{log}"
    try:
        parsed: dict[str, Any] = json.loads(output)
    except json.JSONDecodeError as error:
        raise AssertionError(
            f"llm-comply printed no JSON report ({error}); exit status {run.returncode}:\n"
            f"{output}\n{run.stderr.decode(errors='replace')}"
        ) from error
    outcomes = {
        result["id"]: Outcome(
            status=result["status"],
            errors=list(result.get("errors", [])),
            warnings=list(result.get("warnings", [])),
        )
        for result in parsed["results"]
    }
    return Report(outcomes, output, log)


@pytest.fixture(scope="module")
def report() -> Report:
    return trio.run(_run_suite)


def test_the_suite_runs_every_test_it_has(report: Report) -> None:
    # A new or renamed llm-comply test must be sorted into MUST_PASS or MAY_FAIL.
    assert sorted(report.outcomes) == sorted((*MUST_PASS, *MAY_FAIL))
    skipped = [name for name, outcome in report.outcomes.items() if outcome.status == "skipped"]
    assert skipped == []


@pytest.mark.parametrize("test_id", MUST_PASS)
def test_passes(report: Report, test_id: str) -> None:
    outcome = report.outcomes[test_id]
    assert (outcome.status, outcome.errors, outcome.warnings) == ("passed", [], []), (
        f"llm-comply {test_id}: {outcome.status}\n"
        + "\n".join(f"  error: {e}" for e in outcome.errors)
        + "".join(f"\n  warning: {w}" for w in outcome.warnings)
    )


@pytest.mark.parametrize("test_id", sorted(MAY_FAIL))
def test_excluded_test_fails_only_for_its_reason(report: Report, test_id: str) -> None:
    outcome = report.outcomes[test_id]
    assert outcome.status in ("passed", "failed")
    if outcome.status == "failed":
        expected = MAY_FAIL[test_id]
        allowed = (*expected, *MAY_FAIL_ALSO.get(test_id, ()))
        unexplained = [e for e in outcome.errors if not any(a in e for a in allowed)]
        assert unexplained == [], f"llm-comply {test_id} failed for another reason"
        assert any(e in error for e in expected for error in outcome.errors)
