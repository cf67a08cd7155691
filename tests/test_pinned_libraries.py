"""The web stack's private parts this server relies on, with the versions pinned.

`trio_responses._serve` runs hypercorn's trio worker with changes that reach into
hypercorn's connection and stream objects, and `api/app.py` replaces quart-trio's
per-request task pair; both use names that are not public API. pyproject.toml pins
hypercorn, quart and quart-trio to the versions tested; this test fails when an
upgrade takes away (or renames) what the server uses, before anything else breaks
in a confusing way.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import tomllib
from pathlib import Path

import pytest
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.trio.tcp_server import TCPServer
from quart_trio.asgi import TrioASGIHTTPConnection

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _pins() -> dict[str, str]:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pins = {}
    for requirement in dependencies:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9.]+)", requirement.split(";")[0].strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


@pytest.mark.parametrize("package", ["hypercorn", "quart", "quart-trio"])
def test_the_web_stack_is_pinned_to_the_installed_versions(package: str) -> None:
    assert _pins()[package] == importlib.metadata.version(package)


def test_hypercorn_still_has_what_the_server_changes() -> None:
    for method in ("_read_data", "_initiate_server_close", "_close", "protocol_send", "run"):
        assert callable(getattr(TCPServer, method, None)), method
    assert list(inspect.signature(TCPServer._read_data).parameters) == ["self"]
    server = inspect.getsource(TCPServer.__init__)
    for attribute in ("idle_task", "protocol", "stream", "config"):
        assert f"self.{attribute}" in server, attribute
    protocol = inspect.getsource(H11Protocol)
    for attribute in ("connection", "stream", "keep_alive_requests"):
        assert f"self.{attribute}" in protocol, attribute
    stream = inspect.getsource(HTTPStream)
    for attribute in ("state", "scope"):
        assert f"self.{attribute}" in stream, attribute
    assert {"REQUEST", "RESPONSE", "CLOSED"} <= set(ASGIHTTPState.__members__)


def test_quart_trio_still_builds_requests_as_the_app_expects() -> None:
    build = TrioASGIHTTPConnection._create_request_from_scope
    assert list(inspect.signature(build).parameters) == ["self", "send"]
    for method in ("handle_messages", "handle_request"):
        assert callable(getattr(TrioASGIHTTPConnection, method, None)), method
