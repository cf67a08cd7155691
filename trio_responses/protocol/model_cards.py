"""What ``/v1/models`` says about the served model (sans-IO).

Two readers: OpenAI's SDKs read ``data`` (``id``, ``object``, ``created``,
``owned_by``); Codex reads ``models``, its own model metadata (its
``ModelInfo``: reasoning levels, context window, the tools the model takes),
and configures itself from the entry whose ``slug`` its model name starts
with. Without one it warns and falls back to defaults that do not fit gpt-oss
(no reasoning levels, a 272,000-token window, ``apply_patch`` as a function).

The card says what gpt-oss does on this server: three reasoning levels, no
reasoning summaries, text input only, the context window the server was
started with, Codex's ``apply_patch`` as a custom tool with its grammar
(`protocol.tool_params`), parallel calls and client tool search.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REASONING_LEVELS = (
    ("low", "Fast answers with little reasoning"),
    ("medium", "Balances speed and reasoning depth"),
    ("high", "The deepest reasoning gpt-oss does"),
)
"""gpt-oss's reasoning levels (harmony's ``Reasoning: low|medium|high``)."""


CODEX_INSTRUCTIONS = """\
You are Codex, a coding agent running on gpt-oss. You and the user share one workspace; \
work in it until the user's request is handled, then say what you did.

# How you work

- Read before you change: look at the files and run the commands that tell you how the \
project is laid out, built and tested.
- Run shell commands with the shell tool. Prefer `rg` and `rg --files` to search.
- Edit files with `apply_patch`, never with shell tricks such as `cat > file`. A patch \
starts with `*** Begin Patch` and ends with `*** End Patch`; each file is one \
`*** Add File: PATH`, `*** Delete File: PATH` or `*** Update File: PATH` section, and an \
update shows a few lines of context around each change, removed lines with `-` and added \
lines with `+`.
- Keep changes small and in the style of the code around them. Do not revert changes you \
did not make.
- After a change, run the tests or the command that shows it works, when there is one.
- Several independent tool calls may go in one turn.

# Answering

Send short updates on the commentary channel while you work, and the answer on the final \
channel: what changed and where (file paths), what you ran and what it showed, and \
anything left undone. Use plain Markdown; no long preambles.
"""
"""The instructions Codex sends with this card (its ``model_messages``): Codex needs
some, and its own are written for OpenAI's hosted models."""


def openai_card(name: str, owned_by: str) -> dict[str, Any]:
    """The OpenAI ``Model`` object for a served name."""
    return {"id": name, "object": "model", "created": 0, "owned_by": owned_by}


def codex_card(name: str, *, context_window: int) -> dict[str, Any]:
    """Codex's metadata for a served name (the fields of its ``ModelInfo``)."""
    return {
        "slug": name,
        "display_name": name,
        "description": "gpt-oss, served by trio-responses.",
        "default_reasoning_level": "medium",
        "supported_reasoning_levels": [
            {"effort": effort, "description": text} for effort, text in REASONING_LEVELS
        ],
        "shell_type": "default",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 1,
        "additional_speed_tiers": [],
        "service_tiers": [],
        "availability_nux": None,
        "upgrade": None,
        "model_messages": {
            "instructions_template": CODEX_INSTRUCTIONS,
            "instructions_variables": None,
        },
        "supports_reasoning_summaries": False,
        "default_reasoning_summary": "none",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "web_search_tool_type": "text",
        "truncation_policy": {"mode": "tokens", "limit": 10_000},
        "supports_parallel_tool_calls": True,
        "supports_image_detail_original": False,
        "context_window": context_window,
        "max_context_window": context_window,
        "auto_compact_token_limit": None,
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "input_modalities": ["text"],
        "supports_search_tool": True,
        "use_responses_lite": False,
        "prefer_websockets": False,
        # Codex features that are OpenAI's own services: off.
        "tool_mode": None,
        "multi_agent_version": "v1",
        "multi_agent_reasoning_effort": None,
        "supports_reasoning_effort_updates": False,
        "supports_reasoning_summary_parameter": False,
        "supports_experimental_context": False,
        "include_skills_usage_instructions": True,
        "include_apps_usage_instructions": False,
        "include_plugin_usage_instructions": False,
        "guardian": None,
        "node_repl_auto_review_required": False,
        "node_repl_disabled": False,
        "requires_sandboxed_review": False,
        "auto_review_model_override": None,
        "model_specialty": None,
        "default_service_tier": None,
        "available_in_plans": [],
        "allow_only_chatgpt_workspace_executor": False,
        "allow_only_codex_cloud_agent_orchestrator": False,
    }


def model_list(names: Sequence[str], *, owned_by: str, context_window: int) -> dict[str, Any]:
    """The body of ``GET /v1/models``: OpenAI's list, and Codex's ``models``."""
    return {
        "object": "list",
        "data": [openai_card(name, owned_by) for name in names],
        "models": [codex_card(name, context_window=context_window) for name in names],
    }
