"""The built-in tools: one module each, listed in `BUILTIN_TOOLS`.

A built-in tool is one module here that defines ``TOOL``, a `BuiltinTool`: its
``tools[]`` model and aliases, its harmony namespace and recipients, its output
item and events, its runner, its metrics label and its scripted-model directive.
The rest of the package works from these descriptors and names no tool:

* `protocol.request` builds the ``tools[]``, ``input`` and ``tool_choice`` unions
  and the ``include`` values from them; `protocol.builder` streams any tool's item;
* `harmony.prompt` shows the tools in the system message and renders their items
  in later prompts; `harmony.steering` forces their calls; `harmony.translator`
  opens their items for the recipients `tools.toolbox.Toolbox.route` finds;
* `tools.toolbox` runs a call as the tool's `Runner` says; `_generation` meters
  it under the tool's label; `engine.script` follows its directive.

Layering: this package is sans-IO and sits at the bottom, beside the modules of
``protocol/`` and ``harmony/`` it may import (``protocol.ids``): those that read
the registry import it, never the other way round, so there is no import cycle
(``tests/test_boundaries.py`` fails on one, and on an I/O framework imported here).
Registration is this module's explicit list, not a side effect of importing a tool
module: a tool is registered exactly when it is in `BUILTIN_TOOLS`, whatever was
imported first, and a module here that is not in it fails
``tests/tools/test_builtin_seam.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

from . import code_interpreter, mcp, web_search
from ._descriptor import BuiltinItem as BuiltinItem
from ._descriptor import BuiltinTool as BuiltinTool
from ._descriptor import BuiltinToolParam as BuiltinToolParam
from ._descriptor import CallContext as CallContext
from ._descriptor import ForcedCall as ForcedCall
from ._descriptor import HarmonyTool as HarmonyTool
from ._descriptor import Runner as Runner
from ._descriptor import ScriptDirective as ScriptDirective
from ._descriptor import ToolItem as ToolItem
from ._descriptor import json_object_at as json_object_at
from ._descriptor import literal_values as literal_values

BUILTIN_TOOLS: tuple[BuiltinTool, ...] = (code_interpreter.TOOL, web_search.TOOL, mcp.TOOL)
"""Every built-in tool, in the order the API lists them (the ``tools[]`` and
``input`` unions, error messages, the system message)."""

_K = TypeVar("_K", bound=Hashable)


def _index(keys: Callable[[BuiltinTool], Iterable[_K]], what: str) -> dict[_K, BuiltinTool]:
    """``BUILTIN_TOOLS`` by each of their ``keys``; two tools with one key are refused."""
    index: dict[_K, BuiltinTool] = {}
    for tool in BUILTIN_TOOLS:
        for key in keys(tool):
            if key in index:
                raise ValueError(f"built-in tools {index[key].name} and {tool.name}: same {what}")
            index[key] = tool
    return index


_index(lambda tool: (tool.name,), "name")
_index(lambda tool: tool.types, "tools[].type")
_index(lambda tool: (literal_values(model)[0] for model in tool.input_items), "input item")
_index(lambda tool: (tool.metrics_label,), "metrics label")
_BY_PARAM = _index(lambda tool: (tool.param,), "request model")
_BY_CALL_ITEM = _index(lambda tool: (tool.item.type,), "output item type")
NAMESPACES: Mapping[str, BuiltinTool] = _index(
    lambda tool: [n for n in (tool.harmony.namespace,) if n is not None], "namespace"
)
"""The tools with a harmony namespace of their own (shown in the system message), by
namespace, in `BUILTIN_TOOLS` order."""
_BY_CHOICE = _index(lambda tool: tool.choice_types, "tool_choice type")


def tool_for_param(entry: object) -> BuiltinTool | None:
    """The tool a ``tools[]`` entry asks for (None: not a built-in tool's entry)."""
    return _BY_PARAM.get(type(entry)) if isinstance(entry, BuiltinToolParam) else None


def tool_of_call_item(item_type: str) -> BuiltinTool | None:
    """The tool whose calls are items of ``item_type`` (``code_interpreter_call``)."""
    return _BY_CALL_ITEM.get(item_type)


def tool_for_choice(choice_type: str) -> BuiltinTool:
    """The tool a ``tool_choice: {"type": choice_type}`` forces (a validated type)."""
    return _BY_CHOICE[choice_type]


def requested_namespaces(entries: Iterable[object]) -> frozenset[str]:
    """The namespaces (`NAMESPACES`) of the built-in tools ``entries`` (``tools[]``) ask for."""
    asked = {tool_for_param(entry) for entry in entries}
    return frozenset(namespace for namespace, tool in NAMESPACES.items() if tool in asked)
