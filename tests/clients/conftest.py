"""Fixtures of the client tests."""

from __future__ import annotations

import pytest

from tests.clients.node import find_node


@pytest.fixture(scope="session")
def node() -> str:
    """The node executable, with the JavaScript clients' packages installed."""
    return find_node()
