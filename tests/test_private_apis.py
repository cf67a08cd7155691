"""Only `trio_responses._adapters` reaches into other libraries' private parts.

The web stack (hypercorn, quart, quart-trio), coredis and CPython's regex parser
are used through their public APIs everywhere else. The check reads the source
(AST), so it is best-effort for attribute access:

- imports: an underscored module or name of hypercorn, quart, quart-trio or
  coredis; a hypercorn module outside its documented API (``hypercorn``,
  ``hypercorn.config``, ``hypercorn.typing``, ``hypercorn.trio``); quart's and
  quart-trio's ASGI connection classes (``quart.asgi``, ``quart_trio.asgi``);
  ``re._parser`` and its kin (``sre_parse``...);
- attributes: ``name._private`` where ``name`` was imported from those libraries
  or assigned an expression that starts from such a name;
  and in a class derived from one of their classes, ``self._private`` or a method
  ``_private`` that the library's class has (or sets on its instances), which is
  how overriding and reading its internals looks.

What it cannot see: a private attribute of an object the code got some other way
(a return value, a parameter), and ``getattr`` with a computed name.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pathlib
import re

import pytest

import trio_responses

PACKAGE = pathlib.Path(trio_responses.__file__).parent
ADAPTERS = PACKAGE / "_adapters"
LIBRARIES = {"hypercorn", "quart", "quart_trio", "coredis"}
HYPERCORN_API = {"hypercorn", "hypercorn.config", "hypercorn.typing", "hypercorn.trio"}
INTERNAL_MODULES = {"quart.asgi", "quart_trio.asgi"}
REGEX_INTERNALS = {"re._parser", "re._compiler", "re._constants", "re._casefix"}
REGEX_INTERNALS |= {"sre_parse", "sre_compile", "sre_constants"}
DOCUMENTED_PRIVATE = {"_get_current_object"}
"""werkzeug's ``LocalProxy`` documents this as the way to the object behind one
(quart's ``request``, ``websocket``)."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _forbidden_module(module: str) -> bool:
    root = module.split(".")[0]
    if module in REGEX_INTERNALS or module.startswith("re._"):
        return True
    if root not in LIBRARIES:
        return False
    if any(_private(part) for part in module.split(".")) or module in INTERNAL_MODULES:
        return True
    return root == "hypercorn" and module not in HYPERCORN_API


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _root(node: ast.expr) -> str | None:
    """The name an expression starts from: ``a`` for ``a.b(c).d``."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript | ast.Await):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _library_privates(path: str) -> set[str]:
    """The private names of the library class at ``path`` (dotted): its own and its
    bases' (methods, class attributes), and those their code sets on instances."""
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return set()
    if not isinstance(cls, type):
        return set()
    names = {attribute for attribute in dir(cls) if _private(attribute)}
    for klass in cls.__mro__[:-1]:
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names |= {match for match in re.findall(r"\bself\.(_\w+)", source) if _private(match)}
    return names


def private_uses(source: str) -> list[str]:
    """Where ``source`` (a module outside the adapters) uses a library's private part."""
    tree = ast.parse(source)
    found: list[str] = []
    imported: dict[str, str] = {}
    """Local name -> what it is in its library (dotted)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _forbidden_module(alias.name):
                    found.append(f"line {node.lineno}: import {alias.name}")
                if alias.name.split(".")[0] in LIBRARIES:
                    local = alias.asname or alias.name.split(".")[0]
                    imported[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _forbidden_module(node.module):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if (node.module.split(".")[0] in LIBRARIES or node.module == "re") and (
                    _private(alias.name) or (_is_module(submodule) and _forbidden_module(submodule))
                ):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                if node.module.split(".")[0] in LIBRARIES:
                    imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):  # a name given a library's object (best effort)
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _root(node.value) in imported
        ):
            imported[node.targets[0].id] = imported[_root(node.value) or ""]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and node.attr not in DOCUMENTED_PRIVATE
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.ClassDef):
            found += _subclass_uses(node, imported)
    return found


def _subclass_uses(node: ast.ClassDef, imported: dict[str, str]) -> list[str]:
    privates: set[str] = set()
    for base in node.bases:
        dotted = _dotted(base.value if isinstance(base, ast.Subscript) else base)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        if head in imported:
            privates |= _library_privates(".".join(filter(None, (imported[head], rest))))
    if not privates:
        return []
    found = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) and inner.name in privates:
            found.append(f"line {inner.lineno}: {node.name} overrides {inner.name}")
        if (
            isinstance(inner, ast.Attribute)
            and inner.attr in privates
            and isinstance(inner.value, ast.Name)
            and inner.value.id in ("self", "cls")
        ):
            found.append(f"line {inner.lineno}: {node.name} uses {inner.attr}")
    return found


MODULES = sorted(path for path in PACKAGE.rglob("*.py") if ADAPTERS not in path.parents)


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_only_the_adapters_use_private_parts_of_libraries(path: pathlib.Path) -> None:
    assert private_uses(path.read_text()) == []


@pytest.mark.parametrize(
    "source",
    [
        "import re._parser as p",
        "from re import _parser",
        "import sre_parse",
        "from hypercorn.trio.tcp_server import TCPServer",
        "import hypercorn.protocol.h11",
        "from quart_trio.asgi import TrioASGIHTTPConnection",
        "from coredis._concurrency import Queue",
        "from quart.globals import _cv_request",
        "from hypercorn import utils",
        "import coredis\npool = coredis.ConnectionPool()\npool._available_connections",
        "from quart_trio import QuartTrio\nQuartTrio._something()",
        (
            "from coredis.pool import ConnectionPool\n"
            "class Pool(ConnectionPool):\n"
            "    def release(self, c):\n"
            "        self._available_connections.append_nowait(None)\n"
        ),
        (
            "import quart\n"
            "class Connection(quart.asgi.ASGIHTTPConnection):\n"
            "    async def __call__(self, receive, send):\n"
            "        self._create_request_from_scope(send)\n"
        ),
    ],
)
def test_the_check_finds_private_uses(source: str) -> None:
    assert private_uses(source)


def test_the_check_lets_public_uses_by() -> None:
    source = (
        "import re\n"
        "import hypercorn.trio\n"
        "from hypercorn.config import Config\n"
        "from quart import websocket\n"
        "from quart_trio import QuartTrio\n"
        "from coredis.pool import ConnectionPool\n"
        "class App(QuartTrio):\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    async def dispatch_request(self, context=None):\n"
        "        return self._mine\n"
        "websocket._get_current_object()\n"
        "re.compile('a')\n"
    )
    assert private_uses(source) == []
