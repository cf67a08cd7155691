"""Node for the JavaScript client tests: the executable, the pinned packages, a scenario run.

Each client's script in ``tests/clients/js`` runs one scenario per node process
against the test's server and prints what the SDK returned as JSON. Its packages come
from ``tests/clients/js/package-lock.json``: ``npm ci`` installs them (CI does so before
pytest; here it runs when they are missing). Without node and npm these tests fail:
they are part of what this server promises.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import trio

from tests.support import MODEL, Server

JS = pathlib.Path(__file__).parent / "js"
MIN_NODE = 18


def _pinned_packages_installed() -> bool:
    """Whether node_modules holds exactly the versions package.json pins."""
    pinned: dict[str, str] = json.loads((JS / "package.json").read_text())["dependencies"]
    for name, version in pinned.items():
        manifest = JS / "node_modules" / name / "package.json"
        if not manifest.is_file() or json.loads(manifest.read_text())["version"] != version:
            return False
    return True


def find_node() -> str:
    """The node executable, with the clients' packages installed (``npm ci``).

    Raises:
        pytest.fail.Exception: node or npm is missing or too old, or ``npm ci`` failed.
    """
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "The JavaScript client tests need node (>= 18) and npm: install them "
            "(Debian: apt-get install nodejs npm), then run "
            "'npm ci --prefix tests/clients/js'."
        )
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < MIN_NODE:
        pytest.fail(f"The JavaScript clients need node >= {MIN_NODE}; this is node {version}.")
    if not _pinned_packages_installed():
        npm_ci(JS)
    return node


def npm_ci(directory: pathlib.Path) -> None:
    """Install ``directory``'s locked packages (``npm ci``).

    Raises:
        pytest.fail.Exception: npm is missing or ``npm ci`` failed.
    """
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(f"The tests need npm to install {directory}'s packages: scripts/test does.")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.fail(
            f"'npm ci' in {directory} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )


async def run_scenario(
    node: str, script: str, server: Server, name: str, *, sdk: str
) -> dict[str, Any]:
    """Run scenario ``name`` of ``js/<script>`` against ``server``; its JSON result.

    Raises:
        AssertionError: the script failed (the SDK threw) or printed no JSON.
        trio.TooSlowError: it took more than a minute.
    """
    with trio.fail_after(60):
        done = await trio.run_process(
            [node, str(JS / script), server.base_url, MODEL, name],
            cwd=JS,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, f"the {sdk} failed ({name}):\n{stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result
