"""Unguessable object ids with OpenAI-style prefixes (``resp_``, ``msg_``, ``rs_``…)."""

from __future__ import annotations

import secrets
from typing import Literal

IdPrefix = Literal[
    "resp",
    "msg",
    "rs",
    "fc",
    "fco",
    "tsc",
    "tso",
    "call",
    "ci",
    "ws",
    "mcp",
    "mcpl",
    "mcpr",
    "cmp",
    "conv",
    "ctc",
    "ctco",
    "we",
    "evt",
]
"""The prefixes in use; a new built-in tool's items may bring their own
(``ToolItem.id_prefix``, `tools.builtin`)."""


def new_id(prefix: IdPrefix | str) -> str:
    """A fresh id: the prefix, ``_``, and 192 random bits as 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"
