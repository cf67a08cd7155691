"""The sans-IO core imports no I/O framework; the public API is what __init__ exports;
a built-in tool lives in its module."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import trio_responses

PACKAGE = pathlib.Path(trio_responses.__file__).parent
FORBIDDEN = {"trio", "quart", "quart_trio", "hypercorn", "vllm", "asyncio", "trio_asyncio", "mcp"}


def _imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("core", ["protocol", "harmony", "tools/builtin"])
def test_sans_io_core_imports_no_io_framework(core: str) -> None:
    files = sorted((PACKAGE / core).glob("*.py"))
    assert files
    for path in files:
        assert not _imported_modules(path) & FORBIDDEN, path.name


def test_the_sans_io_core_loads_no_io_framework_at_all() -> None:
    """Not even through what it imports: the built-in tools it reads included."""
    import subprocess
    import sys

    core = ["protocol", "harmony", "tools.builtin"]
    modules = [
        _module_name(path)
        for package in core
        for path in sorted((PACKAGE / package.replace(".", "/")).glob("*.py"))
    ]
    code = (
        f"import sys, {', '.join(modules)};"
        f"print(sorted(m for m in {sorted(FORBIDDEN)!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


BUILTIN_TOOLS_MAY_IMPORT = {
    "trio_responses._exceptions",
    "trio_responses.protocol.ids",
}
"""The package modules the built-in tools may import besides each other: leaves of
the core, which import neither the registry nor anything that does."""


def test_builtin_tools_import_only_leaves_of_the_core() -> None:
    for path in sorted((PACKAGE / "tools" / "builtin").glob("*.py")):
        name = _module_name(path)
        imported = {
            module
            for module in _runtime_imports(path, name)
            if not module.startswith("trio_responses.tools.builtin")
        }
        assert imported <= BUILTIN_TOOLS_MAY_IMPORT, (path.name, imported)


def _package_text_files() -> list[pathlib.Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    ]


WEB_SEARCH_OPTION = {
    "_config.py",
    "cli.py",
    "_service.py",
    "_opening.py",
    "protocol/model_cards.py",
}
"""Where ``web_search`` may be named outside ``tools/``: the option that starts the
bundled browser tool server (``--web-search``), the check of its provider's key, and
Codex's model card (its ``web_search_tool_type`` field)."""


def test_web_search_is_named_only_by_its_tool_module_and_its_option() -> None:
    """A built-in tool is one module: the rest of the package reads its descriptor."""
    named = re.compile(r"web_?search", re.IGNORECASE)
    outside = {
        path.relative_to(PACKAGE).as_posix()
        for path in _package_text_files()
        if PACKAGE / "tools" not in path.parents and named.search(path.read_text(errors="replace"))
    }
    assert outside <= WEB_SEARCH_OPTION


CODE_INTERPRETER_OPTION = {
    "_config.py",
    "cli.py",
    "_service.py",
    "_prepare.py",
    "_opening.py",
    "dashboard/dashboard.js",
}
"""Where ``code_interpreter`` may be named outside ``tools/``: the option that runs
the code interpreter's containers (``--code-interpreter``), its sandbox and runtime,
the request check that knows whether it runs, and the live page, which shows a
``code_interpreter_call`` item's logs and images."""


def test_code_interpreter_is_named_only_by_its_tool_and_its_option() -> None:
    outside = {
        path.relative_to(PACKAGE).as_posix()
        for path in _package_text_files()
        if PACKAGE / "tools" not in path.parents
        and "code_interpreter" in path.read_text(errors="replace")
    }
    assert outside <= CODE_INTERPRETER_OPTION


VLLM_ENGINE = {
    PACKAGE / "engine" / name for name in ("vllm.py", "vllm_public.py", "_vllm_private.py")
}


def test_only_the_vllm_engine_may_import_asyncio_and_vllm() -> None:
    for path in PACKAGE.rglob("*.py"):
        imported = _imported_modules(path)
        if path in VLLM_ENGINE:
            continue
        assert not imported & {"asyncio", "trio_asyncio"}, path
        if path.name != "vllm_testing.py":
            assert not imported & {"vllm", "torch"}, path


def test_public_names_are_reexported_explicitly() -> None:
    source = (PACKAGE / "__init__.py").read_text()
    tree = ast.parse(source)
    exported = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname is not None
    }
    assert {"Config", "serve", "serve_service", "open_responses_service"} <= exported
    for name in exported:
        assert getattr(trio_responses, name) is not None
    public = {name for name in dir(trio_responses) if not name.startswith("_")}
    modules = {
        "protocol",
        "harmony",
        "engine",
        "background",
        "store",
        "api",
        "tools",
        "cli",
        "dashboard",
        "metrics",
        "sealing",
        "webhooks",
    }
    assert public - modules - {"annotations", "TYPE_CHECKING", "Any"} == exported


def test_importing_the_package_does_not_load_the_web_stack() -> None:
    """vLLM's engine processes import the parent's main module (see __init__)."""
    import subprocess
    import sys

    code = (
        "import sys, trio_responses, trio_responses.cli, trio_responses.engine;"
        "print(sorted(m for m in ('quart', 'quart_trio', 'hypercorn', 'werkzeug')"
        " if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


def test_no_async_generator_outside_context_managers() -> None:
    """An async generator that yields inside a context it opened breaks when closed
    from another task; the only ones allowed are @asynccontextmanager functions,
    whose contexts are entered and exited by the task using them."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.AsyncFunctionDef):
                continue
            yields = [
                inner for inner in ast.walk(node) if isinstance(inner, ast.Yield | ast.YieldFrom)
            ]
            if not yields:
                continue
            decorators = {ast.unparse(decorator) for decorator in node.decorator_list}
            assert decorators & {"asynccontextmanager", "contextlib.asynccontextmanager"}, (
                f"{path.name}:{node.lineno} {node.name} is an async generator"
            )


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: pathlib.Path, name: str) -> set[str]:
    """The package's modules ``path`` imports at run time, anywhere in it (a local
    import counts; one under ``if TYPE_CHECKING:`` does not)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for statement in block.body
        for node in ast.walk(statement)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names}
            found |= submodules if submodules & MODULES else {target}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found & MODULES - {name}


MODULES = {_module_name(path) for path in PACKAGE.rglob("*.py")}


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = {_module_name(p): _runtime_imports(p, _module_name(p)) for p in PACKAGE.rglob("*.py")}
    for start in graph:
        # Every module reachable from `start`; none may lead back to it.
        seen, todo = set(), list(graph[start])
        while todo:
            module = todo.pop()
            if module == start:
                pytest.fail(f"an import cycle through {start}")
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])


CODEC = PACKAGE / "protocol" / "codec.py"
OWN_JSON = {
    "_logging.py": "log lines: ASCII-escaped, and any value a record holds as its str()",
    "api/websocket.py": "a client's value quoted in an error message",
    "harmony/developer.py": "a size bound, measured as the bounds assume",
    "engine/script.py": "the scripted model's own output text",
    "tools/builtin/web_search.py": "the scripted model's own output text (a search's arguments)",
    "tools/container_kernel.py": "runs inside a container's sandbox, with the stdlib only",
}
"""The modules that encode JSON themselves, and why (everything else uses the codec)."""


def test_json_is_encoded_by_the_codec() -> None:
    encoders = {"json.dumps", "json.dump", "json.JSONEncoder", "JSONEncoder"}
    found = set()
    for path in PACKAGE.rglob("*.py"):
        calls = {
            ast.unparse(node.func)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
        }
        if calls & encoders and path != CODEC:
            found.add(path.relative_to(PACKAGE).as_posix())
    assert found == set(OWN_JSON)


def test_owners_are_compared_in_one_place() -> None:
    """Whether a caller may see what an owner owns is `Principal.may_see`'s to say;
    the stores find things by (owner, id) instead of comparing owners."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Eq | ast.NotEq) for op in node.ops
            ):
                sides = [ast.unparse(side) for side in (node.left, *node.comparators)]
                if any(side.split(".")[-1].endswith("owner") for side in sides):
                    found.add(path.relative_to(PACKAGE).as_posix())
    assert found == {"_principal.py"}


LAYERS: tuple[tuple[str, ...], ...] = (
    # Values and rules every layer uses, without I/O: the wire protocol (sans-IO), the
    # error tree, the configuration, who asks, the built-in tools' descriptions (pure);
    # adapters of other libraries' private parts.
    (
        "protocol",
        "_exceptions",
        "_config",
        "_principal",
        "tools.builtin",
        "_raw_connection",
        "_adapters",
    ),
    ("harmony",),  # requests to prompt tokens, output tokens to events (sans-IO)
    # Helpers of every layer above: worker threads, fault boundaries, cleanup deadlines,
    # log lines, metrics, sealing, the dashboard's static files.
    ("_offload", "_faults", "_cleanup", "_logging", "metrics", "sealing", "dashboard"),
    ("background",),  # a running job, its event log and its readers
    ("engine", "tools", "store"),  # the seams: engines, tool servers, state backends
    (  # the service: requests to jobs, their recording, queries and changes
        "_prepare",
        "_generation",
        "_sealed_items",
        "_compaction",
        "_conversations",
        "_files",
        "webhooks",
        "_recorder",
        "_lease",
        "_runner",
        "_service",
        "_opening",
    ),
    ("api",),  # HTTP and WebSocket
    ("_serve", "_workers", "cli", "__main__", "__init__"),  # serving, workers, the command, exports
)
"""The package's layers, lowest first: a module may import its own layer's and those
below, never one above (`test_no_module_imports_a_higher_layer`). An entry names a
module or a subpackage (all of it); the longest entry that names a module decides."""


def _layer(module: str) -> int:
    name = module.removeprefix(PACKAGE.name).removeprefix(".") or "__init__"
    entries = [
        (len(entry), layer)
        for layer, entries in enumerate(LAYERS)
        for entry in entries
        if name == entry or name.startswith(entry + ".")
    ]
    assert entries, f"{module} is in no layer: add it to LAYERS in {__name__}"
    return max(entries)[1]


def test_no_module_imports_a_higher_layer() -> None:
    graph = {_module_name(p): _runtime_imports(p, _module_name(p)) for p in PACKAGE.rglob("*.py")}
    upward = sorted(
        f"{module} (layer {_layer(module)}) imports {imported} (layer {_layer(imported)})"
        for module, imports in graph.items()
        for imported in imports
        if _layer(imported) > _layer(module)
    )
    assert upward == []
