"""``code_interpreter``: python code the model writes, run in the response's container.

The model calls harmony's ``python`` tool on the analysis channel with the code as
free text; the call is a ``code_interpreter_call`` item whose code streams, and whose
``outputs`` are the run's logs (and, with ``include: ["code_interpreter_call.outputs"]``,
its images). With ``--code-interpreter`` the server runs it in the response's
container (`tools.containers`: a stateful bubblewrap sandbox per container, each call
holding a run slot of `tools.budget`), whose id the item's ``container_id`` carries;
with ``--tool-server python=URL`` that MCP server runs it, statelessly, and
``container_id`` is the server's label.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from openai_harmony import SystemContent

from ...protocol.ids import new_id
from ._descriptor import (
    STRICT,
    BuiltinItem,
    BuiltinTool,
    BuiltinToolParam,
    ForcedCall,
    HarmonyTool,
    Runner,
    ScriptDirective,
    ToolItem,
)

NAMESPACE = "python"
OUTPUTS_INCLUDE = "code_interpreter_call.outputs"
"""The ``include`` value that adds a call's images to its ``outputs``."""
CONTAINER_ID = "python"
"""The ``container_id`` of a call a ``python`` tool server runs (its label); a
container's calls get the container's id (`ResponseBuilder.item_fields`)."""


class CodeInterpreterTool(BuiltinToolParam):
    model_config = STRICT
    type: Literal["code_interpreter"]
    container: str | dict[str, Any] | None = None
    allowed_callers: list[str] | None = None


class CodeInterpreterCallItem(BuiltinItem):
    model_config = STRICT
    type: Literal["code_interpreter_call"]
    id: str
    code: str | None = None
    container_id: str | None = None
    outputs: list[dict[str, Any]] | None = None
    status: str | None = None


def _new_item(recipient: str) -> dict[str, Any]:
    return {
        "id": new_id("ci"),
        "type": "code_interpreter_call",
        "status": "in_progress",
        "code": "",
        "container_id": CONTAINER_ID,
        "outputs": None,
    }


def _record_logs(
    item: dict[str, Any],
    output: str,
    *,
    ok: bool,
    error: dict[str, Any] | None,
    approval_request_id: str | None,
) -> None:
    item["outputs"] = [{"type": "logs", "logs": output}]


def _history(item: CodeInterpreterCallItem) -> tuple[str, str, str]:
    logs = "".join(
        str(output.get("logs", "")) for output in item.outputs or [] if isinstance(output, dict)
    )
    return NAMESPACE, item.code or "", logs


_PYTHON_BLOCK = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)


def _python_block(text: str) -> list[tuple[int, str, str]]:
    """The first fenced ``python`` block: its code is the call."""
    match = _PYTHON_BLOCK.search(text)
    return [] if match is None else [(match.start(), NAMESPACE, match.group(1))]


TOOL = BuiltinTool(
    name="code_interpreter",
    param=CodeInterpreterTool,
    listed_types=("code_interpreter",),
    input_items=(CodeInterpreterCallItem,),
    includes=frozenset({OUTPUTS_INCLUDE}),
    choice_types=("code_interpreter",),
    item=ToolItem(
        type="code_interpreter_call",
        id_prefix="ci",
        new=_new_item,
        in_progress="response.code_interpreter_call.in_progress",
        input_delta="response.code_interpreter_call_code.delta",
        input_field="code",
        input_done="response.code_interpreter_call_code.done",
        running=("interpreting", "response.code_interpreter_call.interpreting"),
        completed="response.code_interpreter_call.completed",
        record_result=_record_logs,
    ),
    harmony=HarmonyTool(
        namespace=NAMESPACE,
        channel="analysis",
        content_type="code",
        system=SystemContent.with_python_tool,
        forced=ForcedCall(NAMESPACE),
        history=_history,
    ),
    runner=Runner(
        server="python",
        tool=lambda recipient: "python",
        arguments=lambda code: {"code": code},
        run_slots=True,
        containers=True,
        missing="{type} needs a python tool server: start the server with "
        "--code-interpreter (or --tool-server python=URL).",
    ),
    metrics_label="code_interpreter",
    example={"type": "code_interpreter", "container": {"type": "auto"}},
    script=ScriptDirective(
        find=_python_block,
        example="Compute it.\n```python\nprint(6 * 7)\n```",
        default_body=lambda said: f"print({said!r})\n",
    ),
)
