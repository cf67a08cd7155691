"""The list object every paginated route answers with (OpenAI's cursor pages)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def list_page(items: Sequence[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """``{"object": "list", "data", "first_id", "last_id", "has_more"}`` of ``items``
    (each with an ``id``), one page of a longer list when ``has_more``."""
    return {
        "object": "list",
        "data": list(items),
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }
