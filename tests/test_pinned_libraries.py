"""The private parts of other libraries the adapters rely on, with the versions pinned.

Each module of `trio_responses._adapters` declares the names it relies on that are
not its library's public API (``RELIES_ON``) and the versions pyproject.toml pins
(``PINNED``). These tests fail when an upgrade takes away, renames or changes the
parameters of one of them (before anything else breaks in a confusing way), when a
pin differs from the installed version, and when an adapter's docstring does not
name what it relies on. CPython's ``re._parser`` has no pin: it is checked on each
Python version the suite runs on.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from trio_responses._adapters import Internal, coredis, hypercorn, lark_grammar, quart_trio, sre

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
ADAPTERS = [hypercorn, quart_trio, coredis, lark_grammar, sre]


def _short(adapter: ModuleType) -> str:
    return adapter.__name__.rpartition(".")[2]


def test_every_adapter_module_is_checked() -> None:
    package = Path(hypercorn.__file__).parent
    assert {path.stem for path in package.glob("*.py")} - {"__init__"} == {
        _short(adapter) for adapter in ADAPTERS
    }


def _pins() -> set[str]:
    pins = set()
    for requirement in PYPROJECT["project"]["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9.]+)", requirement.split(";")[0].strip())
        if match:
            pins.add(f"{match.group(1).lower().replace('_', '-')}=={match.group(2)}")
    return pins


PINNED = [
    pytest.param(adapter, requirement, id=f"{_short(adapter)}:{requirement}")
    for adapter in ADAPTERS
    for requirement in getattr(adapter, "PINNED", ())
]


@pytest.mark.parametrize(("adapter", "requirement"), PINNED)
def test_an_adapted_library_is_pinned_to_the_installed_version(
    adapter: ModuleType, requirement: str
) -> None:
    name, _, version = requirement.partition("==")
    assert requirement in _pins(), f"pyproject.toml does not pin {requirement}"
    assert importlib.metadata.version(name) == version
    assert requirement in (adapter.__doc__ or ""), "the adapter's docstring names the version"


def test_every_adapter_is_pinned_or_checked_per_python() -> None:
    for adapter in ADAPTERS:
        assert getattr(adapter, "PINNED", ()) or adapter is sre, adapter.__name__
    assert PINNED


RELIED = [
    pytest.param(adapter, internal, id=f"{_short(adapter)}:{internal.path}")
    for adapter in ADAPTERS
    for internal in adapter.RELIES_ON
]


def _sets_on_instances(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a class it derives from) gives its instances ``name``:
    annotates it, or assigns ``self.NAME`` in its code."""
    assignment = re.compile(rf"\bself\.{re.escape(name)}\s*(:|=(?!=))")
    for klass in cls.__mro__[:-1]:
        if name in vars(klass).get("__annotations__", {}):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if assignment.search(source):
            return True
    return False


@pytest.mark.parametrize(("adapter", "internal"), RELIED)
def test_the_installed_library_has_what_its_adapter_relies_on(
    adapter: ModuleType, internal: Internal
) -> None:
    assert_still_there(internal)


def assert_still_there(internal: Internal) -> None:
    """The installed library still has ``internal``, in the shape relied on."""
    module, _, qualified = internal.path.partition(":")
    *owners, name = qualified.split(".")
    found: object = importlib.import_module(module)
    for owner in owners:
        found = getattr(found, owner)
    if internal.on_instances:
        assert isinstance(found, type)
        assert _sets_on_instances(found, name), f"{internal.path} is no longer set"
        return
    assert hasattr(found, name), f"{internal.path} is gone"
    if internal.parameters is not None:
        parameters = tuple(inspect.signature(getattr(found, name)).parameters)
        assert parameters == internal.parameters, f"{internal.path}{parameters}"


@pytest.mark.parametrize(("adapter", "internal"), RELIED)
def test_an_adapter_names_what_it_relies_on(adapter: ModuleType, internal: Internal) -> None:
    qualified = internal.path.partition(":")[2]
    named = re.compile(rf"``(\w+\.)*{re.escape(qualified)}``")
    assert named.search(adapter.__doc__ or ""), f"{qualified} is not in the docstring"


def test_the_python_running_is_one_the_regex_adapter_is_checked_on() -> None:
    classifiers = PYPROJECT["project"]["classifiers"]
    supported = tuple(
        line.rpartition(" :: ")[2]
        for line in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", line)
    )
    assert supported == sre.TESTED_PYTHONS
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in sre.TESTED_PYTHONS


@pytest.mark.parametrize(
    ("pattern", "tree"),
    [
        (
            "^a.[^b-d\\d\\W]$",
            [
                ("AT", "AT_BEGINNING"),
                ("LITERAL", ord("a")),
                ("ANY", None),
                (
                    "IN",
                    [
                        ("NEGATE", None),
                        ("RANGE", (ord("b"), ord("d"))),
                        ("CATEGORY", "CATEGORY_DIGIT"),
                        ("CATEGORY", "CATEGORY_NOT_WORD"),
                    ],
                ),
                ("AT", "AT_END"),
            ],
        ),
        (
            "a{2,3}b*?c++\\s",
            [
                ("MAX_REPEAT", (2, 3, [("LITERAL", ord("a"))])),
                ("MIN_REPEAT", (0, sre.unbounded, [("LITERAL", ord("b"))])),
                ("POSSESSIVE_REPEAT", (1, sre.unbounded, [("LITERAL", ord("c"))])),
                ("IN", [("CATEGORY", "CATEGORY_SPACE")]),
            ],
        ),
        (
            "(a)(?:b)(?>c)(?=d)(?<!e)x|y",
            [
                (
                    "BRANCH",
                    [
                        [
                            ("SUBPATTERN", [("LITERAL", ord("a"))]),
                            ("LITERAL", ord("b")),
                            ("ATOMIC_GROUP", [("LITERAL", ord("c"))]),
                            ("ASSERT", [("LITERAL", ord("d"))]),
                            ("ASSERT_NOT", [("LITERAL", ord("e"))]),
                            ("LITERAL", ord("x")),
                        ],
                        [("LITERAL", ord("y"))],
                    ],
                )
            ],
        ),
        ("(?i:[a])", [("SUBPATTERN", [("LITERAL", ord("a"))])]),
    ],
)
def test_cpython_still_parses_patterns_as_the_regex_adapter_reads_them(
    pattern: str, tree: list[sre.Node]
) -> None:
    """The shapes of ``re._parser``'s trees, as `sre.parse` turns them into ours."""
    assert sre.parse(pattern) == tree
