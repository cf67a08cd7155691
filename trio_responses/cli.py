"""The ``trio-responses`` command.

``trio-responses serve [options]`` runs the server until SIGINT/SIGTERM. Every
option has an environment variable (``TRIO_RESPONSES_`` + the option name in
upper case, dashes as underscores) and a `Config` field; the flag wins over
the variable, the variable over the default.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import trio

from ._config import Config
from ._logging import configure_logging

logger = logging.getLogger("trio_responses")

ENV_PREFIX = "TRIO_RESPONSES_"


@dataclass(frozen=True)
class _Option:
    flag: str
    field: str
    help: str
    kind: Callable[[str], Any] = str
    repeat: bool = False
    choices: tuple[str, ...] | None = None
    switch: bool = False
    """A flag without a value (its variable: 1/true/yes or 0/false/no)."""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.removeprefix("--").upper().replace("-", "_")


_SERVE_OPTIONS = (
    _Option("--host", "host", "address to bind"),
    _Option("--port", "port", "TCP port (0 picks a free one)", int),
    _Option(
        "--workers",
        "workers",
        "API worker processes on the one port (SO_REUSEPORT), restarted when they die; "
        "more than 1 needs --store redis://... and --engine scripted or remote",
        int,
    ),
    _Option(
        "--reuse-port",
        "reuse_port",
        "bind with SO_REUSEPORT, so that several processes share the port "
        "(--workers sets it for its workers)",
        switch=True,
    ),
    _Option(
        "--worker-id",
        "worker_id",
        "this process's name among several on one address, sent back as x-worker-id "
        "(--workers names its workers 1 to N)",
    ),
    _Option("--engine", "engine", "inference engine", choices=("scripted", "vllm", "remote")),
    _Option(
        "--upstream",
        "upstreams",
        "remote engine: base URL of a vLLM server (or a router in front of several) that "
        "takes token-id prompts; repeatable, comma-separated in the variable",
        repeat=True,
    ),
    _Option(
        "--upstream-api-key", "upstream_api_key", "remote engine: bearer token of the upstreams"
    ),
    _Option(
        "--model",
        "model",
        "model name or path for the vLLM engine (the remote engine: the name sent upstream); "
        "without it, and without --engine, the scripted engine is served",
    ),
    _Option(
        "--served-model-name",
        "served_model_names",
        "name clients use as 'model' (repeatable; comma-separated in the variable)",
        repeat=True,
    ),
    _Option(
        "--api-key",
        "api_keys",
        "require 'Authorization: Bearer KEY' on /v1 routes "
        "(repeatable; comma-separated in the variable)",
        repeat=True,
    ),
    _Option(
        "--admin-key",
        "admin_keys",
        "key that may read /health statistics and /metrics when --api-key is set "
        "(repeatable; comma-separated in the variable)",
        repeat=True,
    ),
    _Option(
        "--dashboard",
        "dashboard",
        "serve the live operator page at /dashboard (with --api-key, its data needs "
        "an --admin-key)",
        switch=True,
    ),
    _Option(
        "--encryption-key",
        "encryption_key",
        "32-byte key (64 hex digits) sealing encrypted_content; replicas must share it "
        "(default: a key file created on first start)",
    ),
    _Option(
        "--encryption-key-file",
        "encryption_key_file",
        "where the sealing key is kept without --encryption-key "
        "(default $XDG_STATE_HOME/trio-responses/encryption.key)",
    ),
    _Option(
        "--cors-allow-origin",
        "cors_allow_origins",
        "origin whose browser pages may call the API, e.g. https://app.example, or * for any "
        "(repeatable; comma-separated in the variable)",
        repeat=True,
    ),
    _Option(
        "--max-active-jobs-per-key",
        "max_active_jobs_per_key",
        "with --api-key: responses one key may have generating at once",
        int,
    ),
    _Option(
        "--max-queued-jobs-per-key",
        "max_queued_jobs_per_key",
        "with --api-key: responses one key may have waiting before 429",
        int,
    ),
    _Option("--token-delay", "token_delay_s", "scripted engine: seconds between tokens", float),
    _Option(
        "--token-steps",
        "token_steps",
        "scripted engine with --token-delay: one shared tick per delay for all requests",
        switch=True,
    ),
    _Option(
        "--vllm-arg",
        "vllm_args",
        "vLLM engine: KEY=VALUE for AsyncEngineArgs, e.g. tensor_parallel_size=2 "
        "(repeatable; comma-separated in the variable)",
        repeat=True,
    ),
    _Option("--kv-cache-bytes", "kv_cache_bytes", "vLLM engine: KV-cache size in bytes", int),
    _Option(
        "--vllm-bridge",
        "vllm_bridge",
        "vLLM engine: auto (the direct bridge on the vLLM and trio-asyncio versions it is "
        "checked with, else public) or public",
        choices=("auto", "public"),
    ),
    _Option(
        "--engine-script",
        "engine_script",
        "testing: make the vLLM engine (in process, or the remote engine's upstreams) "
        "emit the scripted model's tokens",
        switch=True,
    ),
    _Option(
        "--log-level", "log_level", "logging level", choices=("debug", "info", "warning", "error")
    ),
    _Option(
        "--log-format",
        "log_format",
        "log lines as text, or as one JSON object per line (time, level, logger, message, "
        "request_id, response_id, ...)",
        choices=("text", "json"),
    ),
    _Option("--max-model-len", "max_model_len", "context window in tokens", int),
    _Option("--max-body-bytes", "max_body_bytes", "largest request body (413 above)", int),
    _Option(
        "--body-timeout",
        "body_timeout_s",
        "seconds a request body has to arrive (408 after)",
        float,
    ),
    _Option("--max-input-items", "max_input_items", "most input items per request", int),
    _Option("--max-tools", "max_tools", "most tools per request", int),
    _Option(
        "--replay-events",
        "replay_events",
        "events kept per response for replay (older ones are dropped)",
        int,
    ),
    _Option("--replay-bytes", "replay_bytes", "bytes of events kept per response for replay", int),
    _Option(
        "--stream-retention",
        "stream_retention_s",
        "seconds a finished background response can still be streamed again",
        float,
    ),
    _Option(
        "--max-retained-streams",
        "max_retained_streams",
        "most finished event logs kept for replay",
        int,
    ),
    _Option(
        "--retained-stream-bytes",
        "retained_stream_bytes",
        "most bytes held by finished event logs kept for replay",
        int,
    ),
    _Option("--max-active-jobs", "max_active_jobs", "responses generating at once", int),
    _Option(
        "--max-queued-jobs",
        "max_queued_jobs",
        "responses waiting for a slot before 429 server_busy",
        int,
    ),
    _Option(
        "--store",
        "store_url",
        "where responses, event logs and cancels live: memory://, sqlite:///PATH (survives "
        "restarts), redis://HOST:PORT/DB or unix:///PATH?db=N (several replicas)",
    ),
    _Option(
        "--job-lease",
        "job_lease_s",
        "redis store: seconds without a heartbeat after which a replica's running "
        "responses are failed by another replica",
        float,
    ),
    _Option(
        "--max-stored-responses",
        "max_stored_responses",
        "finished responses kept (memory: least recently used go first; SQLite, Redis: oldest)",
        int,
    ),
    _Option(
        "--max-store-bytes",
        "max_store_bytes",
        "most bytes of stored responses (with --api-key: shared equally between keys)",
        int,
    ),
    _Option("--store-ttl", "store_ttl_s", "seconds a finished response stays stored", float),
    _Option(
        "--shutdown-grace",
        "shutdown_grace_s",
        "seconds running responses get to finish on SIGTERM/SIGINT",
        float,
    ),
    _Option(
        "--cleanup-timeout",
        "cleanup_timeout_s",
        "seconds a response's cleanup may take, all its steps together (engine abort, MCP "
        "close, store writes), and each shielded cleanup step (engine shutdown too)",
        float,
    ),
    _Option(
        "--tool-server",
        "tool_servers",
        "MCP server to keep connected: LABEL=URL or LABEL=stdio:COMMAND; 'python' backs "
        "the code interpreter, 'browser' backs web search (repeatable; comma-separated in "
        "the variable)",
        repeat=True,
    ),
    _Option(
        "--code-interpreter",
        "code_interpreter",
        "run the bundled python tool server as a child process (label 'python')",
        switch=True,
    ),
    _Option(
        "--web-search",
        "web_search",
        "run the bundled browser tool server for web_search (label 'browser'), searching "
        "with searxng=URL, brave, tavily or exa (the last three optionally =URL of their "
        "API; keys from BRAVE_API_KEY, TAVILY_API_KEY, EXA_API_KEY)",
    ),
    _Option(
        "--web-search-allow-host",
        "web_search_allow_hosts",
        "bundled browser: a private or local host it may open pages on, as --mcp-allow-host "
        "patterns (repeatable; public hosts need none)",
        repeat=True,
    ),
    _Option("--python-cpu-seconds", "python_cpu_s", "bundled python tool: CPU seconds", int),
    _Option("--python-memory-mb", "python_memory_mb", "bundled python tool: memory (MiB)", int),
    _Option("--python-timeout", "python_wall_s", "bundled python tool: wall seconds", float),
    _Option(
        "--python-sandbox",
        "python_sandbox",
        "bundled python tool: bwrap (bubblewrap sandbox), auto (bwrap, or refuse to start "
        "the code interpreter when it does not work) or none (resource limits only)",
        choices=("auto", "bwrap", "none"),
    ),
    _Option(
        "--python-processes",
        "python_processes",
        "bundled python tool: most processes per run",
        int,
    ),
    _Option(
        "--python-disk-mb",
        "python_disk_mb",
        "bundled python tool: size of each run's work directory (MiB)",
        int,
    ),
    _Option(
        "--python-max-concurrent",
        "python_max_concurrent",
        "bundled python tool: most runs at once, all API keys together; more wait for a "
        "slot (none: as many as fit --python-memory-budget-mb)",
        int,
    ),
    _Option(
        "--python-max-concurrent-per-key",
        "python_max_concurrent_per_key",
        "bundled python tool: most runs of one API key at once; more wait for a slot",
        int,
    ),
    _Option(
        "--python-memory-budget-mb",
        "python_memory_budget_mb",
        "bundled python tool: memory (MiB) all runs together may hold at worst; the server "
        "refuses to start when the limits allow more (none: 3/4 of the host's memory, or "
        "of the server's cgroup limit if lower)",
        int,
    ),
    _Option(
        "--python-packages",
        "python_packages",
        "bundled python tool: a directory of extra packages for user code (pip install "
        "--target DIR ...), bound read-only into every sandbox",
    ),
    _Option(
        "--max-live-containers",
        "max_live_containers",
        "code interpreter: most container processes this replica keeps running",
        int,
    ),
    _Option(
        "--container-expiry-minutes",
        "container_expiry_minutes",
        "code interpreter: a container's default expiry, in minutes idle",
        int,
    ),
    _Option("--max-file-bytes", "max_file_bytes", "largest file kept (413 above)", int),
    _Option("--file-quota-files", "file_quota_files", "most files one API key holds", int),
    _Option("--file-quota-mb", "file_quota_mb", "most MiB of files one API key holds", int),
    _Option(
        "--max-containers", "max_containers", "most unexpired containers one API key holds", int
    ),
    _Option(
        "--mcp-allow-host",
        "mcp_allow_hosts",
        "host pattern per-request MCP server_urls may use: a name ('mcp.example.com', "
        "'*.internal:8080'), an address or a network ('10.0.0.0/8', '[::1]:8080') "
        "(repeatable; none by default: per-request MCP is refused)",
        repeat=True,
    ),
    _Option("--tool-timeout", "tool_timeout_s", "seconds before a tool call fails", float),
    _Option(
        "--webhook",
        "webhook_url",
        "the operator's webhook endpoint: every background response that ends is posted "
        "here, signed (Standard Webhooks)",
    ),
    _Option(
        "--webhook-secret-file",
        "webhook_secret_file",
        "file with --webhook's signing secret (whsec_...; created with a new one if missing)",
    ),
    _Option(
        "--webhook-allow-host",
        "webhook_allow_hosts",
        "a private, loopback or link-local host webhook URLs may name, as --mcp-allow-host "
        "(repeatable; public hosts need none)",
        repeat=True,
    ),
    _Option(
        "--webhook-timeout",
        "webhook_timeout_s",
        "seconds one webhook delivery attempt may take",
        float,
    ),
    _Option(
        "--webhook-retry-window",
        "webhook_retry_window_s",
        "seconds a webhook delivery is retried before it is marked failed (default: a day)",
        float,
    ),
    _Option(
        "--webhook-first-retry",
        "webhook_first_retry_s",
        "seconds before a webhook delivery's first retry (each next one waits twice as long)",
        float,
    ),
    _Option(
        "--webhook-concurrency",
        "webhook_concurrency",
        "webhook deliveries posted at once by this process (a quarter at most per endpoint)",
        int,
    ),
    _Option(
        "--sse-write-timeout",
        "sse_write_timeout_s",
        "seconds a stream's client may take to accept a write before it is closed",
        float,
    ),
    _Option(
        "--sse-keepalive",
        "sse_keepalive_s",
        "seconds of silence before a keep-alive comment on a stream",
        float,
    ),
    _Option(
        "--reader-writes",
        "reader_writes",
        "each stream's own task writes its socket (by default the response's "
        "producer writes events a stream's socket takes at once)",
        switch=True,
    ),
    _Option(
        "--stream-flush-ms",
        "stream_flush_ms",
        "milliseconds a live stream may hold an event to write it with the next ones "
        "(readers are woken at most once per window; 0: write every event at once)",
        float,
    ),
)


def _default(field_name: str) -> Any:
    for item in fields(Config):
        if item.name == field_name:
            return item.default
    raise KeyError(field_name)


def _shown_default(option: _Option) -> str:
    """The default as ``--help`` shows it: ``none`` for no value, lists comma-separated."""
    default = _default(option.field)
    if option.switch:
        return "on" if default else "off"
    if default is None or default == ():
        return "none"
    if isinstance(default, tuple):
        return ",".join(str(part) for part in default)
    return str(default)


def build_parser() -> argparse.ArgumentParser:
    """The ``trio-responses`` command line (see `main`)."""
    return _build_parsers()[0]


def _build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command's parser and its ``serve`` subcommand's (whose usage its errors show)."""
    parser = argparse.ArgumentParser(
        prog="trio-responses",
        description="OpenAI-compatible Responses API server for gpt-oss models, on Trio.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        # The option list is long: a mistake gets a line of usage, --help the rest.
        usage="%(prog)s [OPTIONS]  (%(prog)s --help lists them)",
        help="run the HTTP server",
        description="Run the Responses API server. Without --model it serves the scripted "
        "engine, a deterministic stand-in for a gpt-oss model (no GPU, no weights).",
    )
    for option in _SERVE_OPTIONS:
        help_text = f"{option.help} [env {option.env}; default: {_shown_default(option)}]"
        if option.switch:
            serve.add_argument(
                option.flag, dest=option.field, action="store_true", default=None, help=help_text
            )
            continue
        serve.add_argument(
            option.flag,
            dest=option.field,
            type=option.kind,
            action="append" if option.repeat else "store",
            choices=option.choices,
            default=None,
            help=help_text,
        )

    # Set by the --workers supervisor for each worker (`_workers.py`), not by people.
    serve.add_argument("--supervisor-fd", type=int, default=None, help=argparse.SUPPRESS)

    tool_server = commands.add_parser(
        "tool-server",
        help="run a bundled MCP tool server",
        description="Run a bundled MCP tool server. 'python' offers one tool, python(code), "
        "that runs the code in a fresh, limited process and returns what it prints. "
        "'browser' offers gpt-oss's browser tool (search, open, find), with --stdio only.",
    )
    tool_server.add_argument("name", choices=("python", "browser"), help="which tool server")
    where = tool_server.add_mutually_exclusive_group(required=True)
    where.add_argument("--stdio", action="store_true", help="speak MCP on stdin/stdout")
    where.add_argument("--port", type=int, help="serve streamable HTTP at http://HOST:PORT/mcp")
    tool_server.add_argument("--host", default="127.0.0.1", help="address for --port")
    tool_server.add_argument("--cpu-seconds", type=int, default=10, help="CPU seconds per run")
    tool_server.add_argument("--memory-mb", type=int, default=512, help="memory per run (MiB)")
    tool_server.add_argument("--timeout", type=float, default=30.0, help="wall seconds per run")
    tool_server.add_argument(
        "--max-output-bytes", type=int, default=64 * 1024, help="output kept per run"
    )
    tool_server.add_argument(
        "--sandbox",
        choices=("auto", "bwrap", "none"),
        default="auto",
        help="bwrap: run each call in a bubblewrap sandbox; auto: the same, and refuse to "
        "start when bubblewrap does not work here; none: resource limits only, no isolation "
        "[default: auto]",
    )
    tool_server.add_argument(
        "--bwrap", default="bwrap", help="the bubblewrap executable [default: bwrap on PATH]"
    )
    tool_server.add_argument(
        "--processes", type=int, default=8, help="most processes per run [default: 8]"
    )
    tool_server.add_argument(
        "--disk-mb", type=int, default=64, help="size of each run's work directory (MiB)"
    )
    tool_server.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="most runs at once; more wait for a slot [default: no limit]",
    )
    tool_server.add_argument(
        "--provider",
        help="browser: searxng=URL, brave, tavily or exa (the last three optionally =URL); "
        "keys from BRAVE_API_KEY, TAVILY_API_KEY, EXA_API_KEY",
    )
    tool_server.add_argument(
        "--allow-host",
        action="append",
        default=[],
        help="browser: a private or local host it may open pages on, as an --mcp-allow-host "
        "pattern (repeatable; public hosts need none)",
    )
    return parser, serve


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> Config:
    """Config from parsed flags, falling back to environment variables.

    Raises:
        ValueError: a value that does not parse, or a setting `Config` refuses; the
            message names the variable when the value came from one.
    """
    values: dict[str, Any] = {}
    for option in _SERVE_OPTIONS:
        value = getattr(args, option.field, None)
        source = option.flag
        if value is None and option.env in environ:
            raw = environ[option.env]
            source = option.env
            if option.switch:
                value = raw.strip().lower() in ("1", "true", "yes", "on")
            else:
                value = [part for part in raw.split(",") if part] if option.repeat else raw
        if value is None:
            continue
        if option.switch:
            values[option.field] = bool(value)
            continue
        try:
            if option.repeat:
                value = tuple(option.kind(part) for part in value)
            else:
                value = option.kind(value)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None
        if option.choices is not None and value not in option.choices:
            shown = ", ".join(option.choices)
            raise ValueError(f"{source}: {value!r} is not one of {shown}")
        values[option.field] = value
    if "engine" not in values and values.get("model"):
        values["engine"] = "vllm"
    return Config(**values)


async def run_server(config: Config, supervisor_fd: int | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully (see `serve`).

    With ``supervisor_fd`` (a worker of ``--workers``: `_workers.py`), tell the
    supervisor once listening, and shut down gracefully when it is gone too.
    """
    # Imported here, not at module level: see the package docstring.
    from ._opening import open_responses_service
    from ._serve import serve_service
    from ._workers import SupervisorLink

    link = None if supervisor_fd is None else SupervisorLink(supervisor_fd)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def wait_for_signal() -> None:
            async for signum in signals:
                logger.info("received %s: shutting down", signal.Signals(signum).name)
                return

        async def wait_for_stop() -> None:
            if link is None:
                await wait_for_signal()
                return
            async with trio.open_nursery() as either:

                async def supervisor_gone() -> None:
                    await link.wait_gone()
                    logger.warning("the supervisor of this worker is gone: shutting down")
                    either.cancel_scope.cancel()

                async def signalled() -> None:
                    await wait_for_signal()
                    either.cancel_scope.cancel()

                either.start_soon(supervisor_gone)
                either.start_soon(signalled)

        async with open_responses_service(config) as service, trio.open_nursery() as nursery:
            freeze_startup_heap()
            urls = await nursery.start(
                partial(serve_service, service, shutdown_trigger=wait_for_stop)
            )
            for url in urls:
                logger.info("listening on %s", url)
            if link is not None:
                await link.ready()


def freeze_startup_heap() -> None:
    """Leave what start-up built out of the garbage collector's full collections.

    The modules, the vocabulary and the engine (with vLLM: torch, transformers)
    are some hundred thousand objects that live as long as the process. Python's
    full collections, which come every second or so under load, walked them all
    each time: ~100 ms a collection with the scripted engine on a 2-core box, a
    quarter of the server's CPU in `bench/request_cost.py`, and a pause of as much
    for every stream. Collected once here, then frozen (`gc.freeze`), they are no
    longer scanned; what requests allocate is collected as before. vLLM's own
    server does the same with its start-up heap.
    """
    gc.collect()
    gc.freeze()
    logger.info("start-up heap: %d objects frozen out of garbage collection", gc.get_freeze_count())


def run_tool_server(args: argparse.Namespace) -> int:
    """The ``tool-server`` command; 1 when its sandbox cannot work here, or when the
    browser's provider is not usable (an unknown one, its key not set)."""
    if args.name == "browser":
        return _run_browser(args)
    # Only this command needs the MCP server side.
    from .tools import python_server
    from .tools.sandbox import Limits, SandboxUnavailable

    limits = Limits(
        cpu_s=args.cpu_seconds,
        memory_bytes=args.memory_mb * 1024 * 1024,
        wall_s=args.timeout,
        output_bytes=args.max_output_bytes,
        processes=args.processes,
        disk_bytes=args.disk_mb * 1024 * 1024,
    )
    try:
        if args.stdio:
            # stdout carries the protocol: log to stderr only, and only warnings.
            logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
            python_server.run_stdio(limits, args.sandbox, args.bwrap, args.max_concurrent)
        else:
            logging.basicConfig(
                level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s"
            )
            logging.getLogger("trio_responses").setLevel(logging.INFO)  # the sandbox in force
            python_server.run_http(
                limits, args.host, args.port, args.sandbox, args.bwrap, args.max_concurrent
            )
    except SandboxUnavailable as refusal:
        print(f"python tool server: {refusal}", file=sys.stderr, flush=True)
        return 1
    return 0


def _run_browser(args: argparse.Namespace) -> int:
    from ._config import check_host_pattern
    from .tools import browser

    try:
        if not args.stdio:
            raise ValueError("the browser tool server speaks MCP on stdio only: use --stdio")
        if args.provider is None:
            raise ValueError("--provider is required: searxng=URL, brave, tavily or exa")
        for pattern in args.allow_host:
            check_host_pattern(pattern)
        provider = browser.parse_provider(args.provider, os.environ)
    except ValueError as refusal:
        print(f"browser tool server: {refusal}", file=sys.stderr, flush=True)
        return 1
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    browser.run_stdio(provider, tuple(args.allow_host))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0 after a clean stop, 2 for a usage error (with the usage of
    the command at fault), 1 when the server cannot start or stops on a failure
    (one line each; the traceback only at ``--log-level debug``)."""
    parser, serve = _build_parsers()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command == "tool-server":
        return run_tool_server(args)
    try:
        config = config_from_args(args, dict(os.environ))
    except ValueError as error:
        serve.error(str(error))
    configure_logging(config.log_level, config.log_format)
    if config.log_level != "debug":
        # One line per MCP HTTP request is noise at info level.
        for noisy in ("httpx2", "mcp"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    if config.workers > 1:
        return _supervise(config, argv)
    if config.engine == "scripted":
        logger.info(
            "no --model given: serving the SCRIPTED engine as %r (deterministic stand-in "
            "for a gpt-oss model; no weights, no GPU)",
            config.model_name,
        )
    from ._config import redacted_url
    from ._exceptions import StartupError
    from .store.base import StoreError
    from .tools.sandbox import SandboxUnavailable

    failures: list[tuple[str, BaseException]] = []
    try:
        trio.run(run_server, config, args.supervisor_fd)
    except* StartupError as group:
        failures += [(str(error), error) for error in _leaves(group)]
    except* StoreError as group:
        failures += [
            (f"cannot use the store {redacted_url(config.store_url)}: {error}", error)
            for error in _leaves(group)
        ]
    except* SandboxUnavailable as group:
        failures += [
            (f"cannot start the code interpreter: {error}", error) for error in _leaves(group)
        ]
    except* Exception as group:
        failures += [
            (f"the server stopped on an unexpected error: {type(error).__name__}: {error}", error)
            for error in _leaves(group)
        ]
    for message, failure in failures:
        # The traceback helps whoever debugs the server, not whoever runs it.
        logger.error(message.replace("\n", " "))
        logger.debug("the traceback of that failure", exc_info=failure)
    return 1 if failures else 0


def _supervise(config: Config, argv: list[str]) -> int:
    """The ``serve --workers N`` command: the supervisor of N workers (`_workers.py`)."""
    from ._exceptions import StartupError
    from ._workers import supervise
    from .sealing import load_key

    try:
        # Before any worker starts: a key file created by several at once could
        # differ between them.
        load_key(config)
    except (OSError, ValueError) as error:
        logger.error("cannot read or create the encryption key: %s", error)
        return 1
    try:
        return trio.run(supervise, config, argv)
    except StartupError as error:
        logger.error("%s", error)
    except Exception as error:
        logger.error("the supervisor stopped on an unexpected error: %s", error)
        logger.debug("the traceback of that failure", exc_info=error)
    return 1


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The exceptions in ``group`` and its nested groups."""
    leaves: list[BaseException] = []
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            leaves += _leaves(error)
        else:
            leaves.append(error)
    return leaves


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
