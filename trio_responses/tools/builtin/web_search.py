"""``web_search``: harmony's browser tool, run by the ``browser`` tool server.

The model calls ``browser.search``, ``browser.open`` or ``browser.find`` on the
analysis channel with JSON arguments; the call is a ``web_search_call`` item whose
``action`` is read from those arguments (``search``, ``open_page``,
``find_in_page``), and its ``action.sources`` from the URLs the answer shows. The
``browser`` tool server runs it (the bundled one, ``--web-search``, or
``--tool-server browser=URL``): its tool of the command's name gets the arguments,
plus ``session``, ``parent`` and ``live`` where the tool declares them (`_context`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from openai_harmony import SystemContent

from ...protocol.ids import new_id
from ._descriptor import (
    STRICT,
    BuiltinItem,
    BuiltinTool,
    BuiltinToolParam,
    CallContext,
    ForcedCall,
    HarmonyTool,
    Runner,
    ScriptDirective,
    ToolItem,
    json_object_at,
    tool_after_dot,
)

NAMESPACE = "browser"

SEARCH_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string"}},
    "required": ["query"],
}
"""The arguments of a forced ``browser.search`` call."""


class WebSearchTool(BuiltinToolParam):
    model_config = STRICT
    type: Literal[
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
    ]
    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: dict[str, Any] | None = None
    filters: dict[str, Any] | None = None
    search_content_types: list[str] | None = None
    external_web_access: bool | None = None


class WebSearchCallItem(BuiltinItem):
    model_config = STRICT
    type: Literal["web_search_call"]
    id: str
    action: dict[str, Any] | None = None
    status: str | None = None


def _new_item(recipient: str) -> dict[str, Any]:
    return {
        "id": new_id("ws"),
        "type": "web_search_call",
        "status": "in_progress",
        "action": {"type": "search"},
    }


def _action(recipient: str, arguments: str) -> dict[str, Any]:
    """The item's ``action``, from the browser call's arguments."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    command = recipient.removeprefix(f"{NAMESPACE}.")
    if command == "open":
        url = parsed.get("id", parsed.get("url"))
        return {"type": "open_page", "url": url if isinstance(url, str) else None}
    if command == "find":
        return {
            "type": "find_in_page",
            "pattern": str(parsed.get("pattern", "")),
            "url": str(parsed.get("url", parsed.get("cursor", ""))),
        }
    query = parsed.get("query")
    return {"type": "search", "query": query if isinstance(query, str) else None}


def _context(context: CallContext) -> dict[str, Any]:
    """The bundled browser's own arguments (`tools.browser`): its session (the
    conversation, else the response, continuing the previous response's), and
    whether it may fetch pages (``external_web_access``)."""
    entry = context.entry
    live = not (isinstance(entry, WebSearchTool) and entry.external_web_access is False)
    return {
        "session": context.conversation_id or context.response_id,
        "parent": context.previous_response_id or "",
        "live": live,
    }


_SOURCE = re.compile(r"^L\d+: URL: (https?://\S+)$", re.MULTILINE)
"""A search result's ``URL:`` line in the bundled browser's results page."""


def _record_sources(
    item: dict[str, Any],
    output: str,
    *,
    ok: bool,
    error: dict[str, Any] | None,
    approval_request_id: str | None,
) -> None:
    """A search's ``action.sources``: the result pages its answer lists."""
    action = item.get("action")
    if not ok or not isinstance(action, dict) or action.get("type") != "search":
        return
    urls = dict.fromkeys(_SOURCE.findall(output))
    if urls:
        action["sources"] = [{"type": "url", "url": url} for url in urls]


_SEARCH = re.compile(r"search:[ \t]*([^\n]+)")
_COMMAND = re.compile(r"browser:(open|find)[ \t]*")


def _directives(text: str) -> list[tuple[int, str, str]]:
    """``search:QUERY`` (the first) and every ``browser:open|find {json}``."""
    found: list[tuple[int, str, str]] = []
    for match in _COMMAND.finditer(text):
        arguments = json_object_at(text, match.end())
        if arguments is not None:
            found.append((match.start(), f"{NAMESPACE}.{match[1]}", arguments))
    if search := _SEARCH.search(text):
        query = json.dumps({"query": search.group(1).strip()})
        found.append((search.start(), f"{NAMESPACE}.search", query))
    return sorted(found, key=lambda entry: entry[0])


TOOL = BuiltinTool(
    name="web_search",
    param=WebSearchTool,
    listed_types=("web_search", "web_search_preview"),
    input_items=(WebSearchCallItem,),
    includes=frozenset({"web_search_call.action.sources", "web_search_call.results"}),
    choice_types=("web_search_preview", "web_search_preview_2025_03_11"),
    item=ToolItem(
        type="web_search_call",
        id_prefix="ws",
        new=_new_item,
        in_progress="response.web_search_call.in_progress",
        running=("searching", "response.web_search_call.searching"),
        completed="response.web_search_call.completed",
        action=_action,
        record_result=_record_sources,
    ),
    harmony=HarmonyTool(
        namespace=NAMESPACE,
        channel="analysis",
        content_type="json",
        commands=frozenset({"search", "open", "find"}),
        system=SystemContent.with_browser_tool,
        forced=ForcedCall(f"{NAMESPACE}.search", SEARCH_SCHEMA),
    ),
    runner=Runner(
        server="browser",
        tool=tool_after_dot,
        context=_context,
        missing="{type} needs a browser tool server: start the server with "
        "--web-search PROVIDER or --tool-server browser=URL.",
        unconfigured="Web search is not available on this server: no browser tool "
        "server is configured. Answer without searching.",
    ),
    metrics_label="web_search",
    example={"type": "web_search"},
    script=ScriptDirective(find=_directives, example="search: trio nurseries"),
)
