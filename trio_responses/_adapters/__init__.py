"""The only modules that use other libraries' private parts: one adapter per library.

Everything else in the package uses public APIs, and these adapters. Each adapter
module says in its docstring which private names it relies on and which versions
it is tested with, and declares both for the tests:

- ``RELIES_ON``: the names, as `Internal`\\ s: tests/test_pinned_libraries.py checks
  that the installed library still has each, with the same parameters;
- ``PINNED``: the requirements (``name==version``) pyproject.toml pins, which the same
  test checks against the installed versions.

tests/test_private_apis.py checks that no other module reaches into these libraries'
private parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final


@final
@dataclass(frozen=True)
class Internal:
    """A name of another library's, outside its public API, that an adapter relies on."""

    path: str
    """Where it is: ``module:qualified.name`` (``hypercorn.trio.tcp_server:TCPServer.run``)."""
    parameters: tuple[str, ...] | None = None
    """A function's parameter names in order (``self`` included for a method), as it
    is called or overridden; None when only its presence counts."""
    on_instances: bool = False
    """An attribute the class's instances get (``self.NAME = ...`` in its code), not
    one of the class itself."""


__all__ = ["Internal"]
