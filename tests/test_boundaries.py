"""The sans-IO core imports no I/O framework; the public API is what __init__ exports."""

from __future__ import annotations

import ast
import pathlib

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


@pytest.mark.parametrize("core", ["protocol", "harmony"])
def test_sans_io_core_imports_no_io_framework(core: str) -> None:
    files = sorted((PACKAGE / core).glob("*.py"))
    assert files
    for path in files:
        assert not _imported_modules(path) & FORBIDDEN, path.name


def test_only_the_vllm_engine_may_import_asyncio() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name == "vllm.py":
            continue
        assert not _imported_modules(path) & {"asyncio", "vllm", "trio_asyncio"}, path


def test_public_names_are_reexported_explicitly() -> None:
    source = (PACKAGE / "__init__.py").read_text()
    tree = ast.parse(source)
    exported = {
        alias.asname
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname is not None
    }
    assert {"Config", "serve", "serve_service", "open_responses_service"} <= exported
    for name in exported:
        assert getattr(trio_responses, name) is not None
    public = {name for name in vars(trio_responses) if not name.startswith("_")}
    modules = {"protocol", "harmony", "engine", "background", "store", "api", "tools", "cli"}
    assert public - modules - {"annotations"} == exported


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
