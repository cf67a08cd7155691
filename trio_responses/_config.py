"""Server configuration: every size, timeout and limit in one frozen object.

This module owns `Config`. It imports nothing from the rest of the package, so
the CLI, the embedding API and the tests all build the same object.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Literal, final
from urllib.parse import urlsplit

EngineName = Literal["scripted", "vllm", "remote"]

SCRIPTED_MODEL_NAME = "gpt-oss-scripted"

StoreKind = Literal["memory", "sqlite", "redis"]

PythonSandbox = Literal["auto", "bwrap", "none"]

LogFormat = Literal["text", "json"]

VllmBridge = Literal["auto", "public"]
_STORE_SCHEMES: dict[str, StoreKind] = {
    "memory": "memory",
    "sqlite": "sqlite",
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
}


_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s]+")
"""A web origin as browsers send it in ``Origin``: scheme, host and optional port."""


_HOST_NAME_PATTERN = re.compile(r"[a-z0-9_*?-]+(?:\.[a-z0-9_*?-]+)*\.?")
"""A host name pattern of ``--mcp-allow-host``: dot-separated labels, ``*``/``?`` wildcards."""


def check_host_pattern(pattern: str) -> None:
    """Refuse an ``--mcp-allow-host`` pattern that can match nothing as meant.

    Accepted (see ``tools.hosts``): a host name with ``*``/``?`` wildcards, an IPv4 or
    IPv6 address or CIDR network (IPv6 in brackets when a port follows), each
    optionally with ``:PORT``.

    Raises:
        ValueError: anything else, saying what is accepted.
    """
    text = pattern.strip().lower()
    if _is_network(text):
        return
    head, sep, tail = text.rpartition(":")
    if sep and tail.isdigit():
        if not 1 <= int(tail) <= 65535:
            raise ValueError(f"--mcp-allow-host {pattern!r}: the port must be 1 to 65535")
        text = head
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if _is_network(text) or _HOST_NAME_PATTERN.fullmatch(text):
        return
    raise ValueError(
        f"--mcp-allow-host {pattern!r} is not a host pattern: use a host name "
        "('mcp.example.com', '*.internal'), an address or network ('10.0.0.0/8', '::1'), "
        "each optionally with ':PORT' ('[::1]:8080')"
    )


_WORKER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A ``worker_id``: it is sent as a header value."""


_WEB_SEARCH = re.compile(r"searxng=https?://\S+|(?:brave|tavily|exa)(?:=https?://\S+)?")


def check_web_search(spec: str) -> None:
    """Refuse a ``--web-search`` spec that names no provider (its key is checked when
    the server starts: `tools.browser.parse_provider`).

    Raises:
        ValueError: saying which specs are accepted.
    """
    if not _WEB_SEARCH.fullmatch(spec.strip()):
        raise ValueError(
            f"--web-search {spec!r}: use searxng=URL, brave, tavily or exa (the last three "
            "optionally =URL of their API)"
        )


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def parse_key(text: str) -> bytes:
    """An encryption key given as 64 hex digits or as base64 of 32 bytes.

    Raises:
        ValueError: anything else (the message says what is expected).
    """
    text = text.strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        try:
            key = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_")
        except (binascii.Error, ValueError):
            key = b""
    if len(key) != 32:
        raise ValueError(
            "an encryption key is 32 bytes, written as 64 hex digits or as base64 "
            "(make one with: python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return key


def store_kind(url: str) -> StoreKind:
    """The state backend a ``--store`` URL names; ValueError says what is accepted."""
    kind = _STORE_SCHEMES.get(urlsplit(url).scheme)
    if kind is None:
        raise ValueError(
            f"store {url!r}: use memory://, sqlite:///PATH, redis://HOST:PORT/DB or "
            "unix:///PATH?db=N"
        )
    if kind == "sqlite" and not sqlite_path(url):
        raise ValueError(f"store {url!r}: name the database file, as sqlite:///PATH")
    return kind


def redacted_url(url: str) -> str:
    """``url`` without its password (in the authority or the query), for messages and logs."""
    password = urlsplit(url).password
    if password is not None:
        url = url.replace(f":{password}@", ":***@", 1)
    base, mark, query = url.partition("?")
    if not mark:
        return url
    pairs = [
        f"{pair.partition('=')[0]}=***" if pair.partition("=")[0].lower() == "password" else pair
        for pair in query.split("&")
    ]
    return f"{base}?{'&'.join(pairs)}"


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///PATH`` URL: ``sqlite:///rel.db`` or ``sqlite:////abs.db``."""
    return url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""


@final
@dataclass(frozen=True, kw_only=True)
class Config:
    """Everything the server needs to know, with documented defaults.

    Every field has a CLI flag and an environment variable (see ``trio-responses
    serve --help``). Sizes are in bytes, durations in seconds.
    """

    # -- serving --------------------------------------------------------------
    host: str = "127.0.0.1"
    """Address to bind. Use ``0.0.0.0`` to listen on every interface."""
    port: int = 8000
    """TCP port; ``0`` picks a free one (the bound URL is reported at start)."""
    workers: int = 1
    """API worker processes serving ``port`` together (``SO_REUSEPORT``), under a
    supervisor that restarts one that dies (`trio_responses._workers`). More than one
    needs a store they share (Redis) and the scripted or remote engine."""
    reuse_port: bool = False
    """Bind with ``SO_REUSEPORT``: processes listening on the same port share its new
    connections (the kernel spreads them). ``workers`` sets it for each worker."""
    worker_id: str | None = None
    """This process's name among several serving one address, sent back as
    ``x-worker-id`` on every answer and shown in ``/health``; ``workers`` names its
    workers 1 to N."""
    log_level: str = "info"
    """Python logging level name for the ``trio_responses`` loggers."""
    log_format: LogFormat = "text"
    """``text`` (one human-readable line per record) or ``json`` (one JSON object per
    line: time, level, logger, message, request_id, response_id and structured fields)."""

    # -- model and engine -----------------------------------------------------
    engine: EngineName = "scripted"
    """``scripted`` (deterministic stand-in, no GPU) or ``vllm``."""
    model: str | None = None
    """Model name or path for the vLLM engine. Unset means the scripted engine."""
    served_model_names: tuple[str, ...] = ()
    """Names clients pass as ``model``; the first is reported in responses."""
    token_delay_s: float = 0.0
    """Scripted engine: pause between output tokens."""
    token_steps: bool = False
    """Scripted engine with ``token_delay_s``: pace like a GPU decode loop, one shared
    tick per delay handing every running request its next token (``--token-steps``)."""
    vllm_args: tuple[str, ...] = ()
    """vLLM engine: ``KEY=VALUE`` pairs passed to ``AsyncEngineArgs`` (values as JSON
    when they parse), e.g. ``tensor_parallel_size=2``, ``gpu_memory_utilization=0.85``."""
    kv_cache_bytes: int | None = None
    """vLLM engine: KV-cache size in bytes (``kv_cache_memory_bytes``)."""
    vllm_bridge: VllmBridge = "auto"
    """vLLM engine: ``auto`` runs the direct bridge where vLLM and trio-asyncio are the
    versions it was checked with, else the public one; ``public`` always the public one
    (see docs/operations.md)."""
    upstreams: tuple[str, ...] = ()
    """Remote engine: base URLs of OpenAI-compatible servers that take token-id prompts
    and return token ids (vLLM's ``/v1/completions``), e.g. ``http://gpu-1:8000``; a
    router (llm-d, Dynamo, vLLM's production stack) is one upstream."""
    upstream_api_key: str | None = None
    """Remote engine: the bearer token the upstreams want."""
    engine_script: bool = False
    """Testing: make the vLLM engine emit the scripted model's tokens (see
    ``trio_responses.engine.vllm_testing``)."""
    max_model_len: int = 131_072
    """Context window: prompt plus output tokens must fit in it."""

    # -- tools ----------------------------------------------------------------------
    tool_servers: tuple[str, ...] = ()
    """MCP servers to keep connected, as ``LABEL=URL`` or ``LABEL=stdio:COMMAND``.
    A built-in tool's label runs that tool (``python`` the code interpreter,
    ``browser`` web search: `tools.builtin`)."""
    code_interpreter: bool = False
    """Run ``code_interpreter`` calls in containers of this server's own (bubblewrap
    sandboxes, ``tools.containers``), with ``/v1/containers``."""
    python_cpu_s: int = 10
    """Bundled python tool: CPU seconds per run."""
    python_memory_mb: int = 512
    """Bundled python tool: address space per run, in MiB."""
    python_wall_s: float = 30.0
    """Bundled python tool: wall-clock seconds per run."""
    python_sandbox: PythonSandbox = "auto"
    """Bundled python tool: ``bwrap`` runs user code in a bubblewrap sandbox (no
    network, no view of the host's files or processes); ``auto`` does so and refuses
    to start the code interpreter when bubblewrap does not work here; ``none`` runs
    it with resource limits only (a warning at start and in ``/health``)."""
    python_processes: int = 8
    """Bundled python tool: most processes one run may have at once."""
    python_disk_mb: int = 64
    """Bundled python tool: size of each run's private work directory, in MiB."""
    python_max_concurrent: int | None = None
    """Bundled python tool: most runs at once, all API keys together. None: as many
    as fit ``python_memory_budget_mb`` (see ``tools.budget``)."""
    python_max_concurrent_per_key: int = 2
    """Bundled python tool: most runs of one API key at once (with ``api_keys``)."""
    python_memory_budget_mb: int | None = None
    """Bundled python tool: memory (MiB) every run together may hold at worst; the
    server refuses to start when the limits above allow more. None: three quarters
    of the host's memory (or of the server's cgroup limit, if lower)."""
    python_packages: str | None = None
    """Bundled python tool: a directory of extra packages for user code (``pip install
    --target DIR numpy pandas matplotlib`` with the server's Python version), bound
    read-only into every sandbox and put on its ``sys.path``."""
    max_live_containers: int = 16
    """Code interpreter: most container processes this replica keeps running; one more
    closes the least recently used idle one (its files stay, its variables go)."""
    container_expiry_minutes: int = 20
    """Code interpreter: a container's default ``expires_after`` (minutes idle)."""
    max_file_bytes: int = 16 * 1024 * 1024
    """Largest file (``/v1/files``, container files, a file the code writes) kept."""
    file_quota_files: int = 1_000
    """Most files (``/v1/files`` and container files together) one API key holds."""
    file_quota_mb: int = 256
    """Most MiB of files one API key holds."""
    max_containers: int = 16
    """Most containers that have not expired one API key holds."""
    web_search: str | None = None
    """Run the bundled browser tool server as a stdio child (label ``browser``, for
    ``web_search``), searching with this provider: ``searxng=URL``, ``brave``,
    ``tavily`` or ``exa`` (each of the last three with an optional ``=URL`` of its
    API; keys from ``BRAVE_API_KEY``, ``TAVILY_API_KEY``, ``EXA_API_KEY``)."""
    web_search_allow_hosts: tuple[str, ...] = ()
    """Bundled browser: private or local hosts it may open pages on (patterns as
    ``mcp_allow_hosts``); public hosts need none."""
    mcp_allow_hosts: tuple[str, ...] = ()
    """Patterns per-request MCP ``server_url``s must match: host names (``fnmatch``),
    addresses or CIDR networks, each optionally with ``:port`` (see
    ``tools.hosts``). Empty: per-request MCP servers are refused."""
    tool_timeout_s: float = 60.0
    """Every tool call and MCP listing gives up after this long."""

    # -- webhooks --------------------------------------------------------------
    webhook_url: str | None = None
    """The operator's webhook endpoint: every tenant's background responses that end
    are posted here too (all four ``response.*`` event types)."""
    webhook_secret_file: str | None = None
    """The operator endpoint's signing secret (``whsec_…``): read from this file, or
    written there (mode 0600) on first start when it does not exist."""
    webhook_allow_hosts: tuple[str, ...] = ()
    """Private, loopback or link-local hosts webhook URLs may name (patterns as
    ``mcp_allow_hosts``); public hosts need none."""
    webhook_timeout_s: float = 10.0
    """One delivery attempt gives up after this long (connect, send and answer)."""
    webhook_retry_window_s: float = 24 * 3600.0
    """How long a delivery is retried after its event, before it is marked failed."""
    webhook_first_retry_s: float = 5.0
    """The first retry's delay; each next one doubles it (with jitter), up to an hour."""
    webhook_concurrency: int = 32
    """Deliveries this replica posts at once; one endpoint gets at most a quarter."""

    # -- security and request limits -----------------------------------------
    api_keys: tuple[str, ...] = ()
    """When non-empty, every ``/v1`` route needs ``Authorization: Bearer KEY``."""
    admin_keys: tuple[str, ...] = ()
    """Keys that may read ``/health`` statistics and ``/metrics`` when ``api_keys`` are
    set (without one, ``/health`` answers liveness only and ``/metrics`` is refused)."""
    dashboard: bool = False
    """Serve the live operator page at ``/dashboard`` (every owner's responses running
    here, and a cancel button). With ``api_keys``, its data needs an admin key."""
    max_active_jobs_per_key: int | None = None
    """With ``api_keys``: most responses one key may have generating at once
    (unset: only ``max_active_jobs`` applies); beyond it they queue."""
    max_queued_jobs_per_key: int | None = None
    """With ``api_keys``: most responses one key may have waiting for a slot (unset:
    ``max_queued_jobs``). A key's unfinished responses are capped at its generating
    plus its waiting allowance; beyond, 429 ``rate_limit_exceeded`` for that key."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest accepted request body; larger ones get 413."""
    body_timeout_s: float = 60.0
    """Seconds a request body has to arrive once its route reads it; a client still
    sending after that gets 408 ``request_timeout``."""
    max_input_items: int = 2_000
    """Most input items in one request (after ``previous_response_id`` expansion)."""
    max_tools: int = 128
    """Most entries in ``tools``."""
    encryption_key: str | None = None
    """The 32-byte key (64 hex digits or base64) that seals ``encrypted_content``
    (reasoning items, compaction items). Unset: the key in ``encryption_key_file``,
    created there on first start. Replicas sharing a store must share the key."""
    encryption_key_file: str | None = None
    """Where the key is kept when ``encryption_key`` is unset (default
    ``$XDG_STATE_HOME/trio-responses/encryption.key``)."""
    cors_allow_origins: tuple[str, ...] = ()
    """Origins (``https://app.example``, or ``*`` for any) whose browser pages may call
    the API: their requests get CORS headers and their preflights (``OPTIONS``, no API
    key needed) are answered. Empty: no CORS headers, browsers refuse cross-origin calls."""

    # -- streaming ------------------------------------------------------------
    sse_keepalive_s: float = 15.0
    """A ``: keep-alive`` comment is written after this long without events."""
    sse_write_timeout_s: float = 30.0
    """A stream whose client takes longer than this to accept a write is closed
    (a foreground response is then cancelled)."""
    reader_writes: bool = False
    """Every stream's own task writes its socket. By default a stream following a
    response in this process may have its events written by the response's
    producer when the socket takes them at once (`api.direct_writes`): fewer
    task switches per event at many streams."""
    stream_flush_ms: float = 5.0
    """Live streams: readers of a response are woken at most once per this many
    milliseconds, so a fast response reaches each reader in fewer, larger writes.
    The first event after a quiet window and the terminal event are never held;
    an event is held at most this long. 0: every event is written at once."""
    replay_events: int = 65_536
    """Event-log ring: most events kept per response (replay for resume)."""
    replay_bytes: int = 32 * 1024 * 1024
    """Event-log ring: most encoded bytes kept per response."""
    stream_retention_s: float = 600.0
    """How long a finished background response's event log stays available for replay."""
    max_retained_streams: int = 1_000
    """Most finished event logs kept for replay; the oldest go first."""
    retained_stream_bytes: int = 512 * 1024 * 1024
    """Most bytes held by finished event logs kept for replay; the oldest go first."""

    # -- jobs and state ---------------------------------------------------------
    store_url: str = "memory://"
    """Where responses, event logs and cancels live: ``memory://`` (this process),
    ``sqlite:///PATH`` (survives restarts), ``redis://HOST:PORT/DB`` or
    ``unix:///PATH?db=N`` (shared by several replicas)."""
    job_lease_s: float = 10.0
    """Redis: a replica that stops heart-beating for this long is dead; its running
    responses end ``failed`` (``server_restarted``) on a surviving replica."""
    max_active_jobs: int = 64
    """Responses generating at once; more wait in ``queued``."""
    max_queued_jobs: int = 1_024
    """Responses waiting for a slot; beyond this, 429 ``server_busy``."""
    max_stored_responses: int = 10_000
    """Finished responses kept (memory: least recently used evicted first; SQLite and
    Redis: oldest finished first). With ``api_keys`` each key gets an equal share, and
    only a key's own responses are evicted to make room for it."""
    max_store_bytes: int = 1024 * 1024 * 1024
    """Most bytes of finished stored responses (each counted as its response and
    input items in JSON), shared like ``max_stored_responses``. A key's newest
    response is kept even when larger than the key's share (alone); a create whose
    input alone is larger is refused (413)."""
    store_ttl_s: float = 7 * 24 * 3600.0
    """Finished responses are dropped this long after they end."""
    shutdown_grace_s: float = 10.0
    """On shutdown, running responses get this long to finish before cancellation."""
    cleanup_timeout_s: float = 5.0
    """The cleanup budget: upper bound for each shielded cleanup step (engine abort,
    MCP session close, final store write, engine shutdown), and for a response's
    cleanup as a whole (all its steps: one deadline, see `_cleanup.py`)."""

    def __post_init__(self) -> None:
        if self.engine not in ("scripted", "vllm", "remote"):
            raise ValueError(f"engine must be 'scripted', 'vllm' or 'remote', not {self.engine!r}")
        if self.engine == "remote":
            if not self.upstreams:
                raise ValueError("the remote engine needs an upstream: --upstream URL")
            for url in self.upstreams:
                if not url.startswith(("http://", "https://")):
                    raise ValueError(f"upstream {url!r}: expected an http:// or https:// URL")
        elif self.upstreams:
            raise ValueError("--upstream is for the remote engine: add --engine remote")
        if self.engine == "vllm" and not self.model:
            raise ValueError("the vllm engine needs a model: set model (--model NAME_OR_PATH)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        self._check_workers()
        for name in (
            "max_body_bytes",
            "max_input_items",
            "max_tools",
            "replay_events",
            "replay_bytes",
            "max_active_jobs",
            "max_stored_responses",
            "max_model_len",
            "max_retained_streams",
            "retained_stream_bytes",
            "python_cpu_s",
            "python_memory_mb",
            "python_processes",
            "python_disk_mb",
            "max_store_bytes",
            "max_live_containers",
            "container_expiry_minutes",
            "max_file_bytes",
            "file_quota_files",
            "file_quota_mb",
            "max_containers",
            "webhook_concurrency",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in (
            "token_delay_s",
            "sse_keepalive_s",
            "stream_flush_ms",
            "stream_retention_s",
            "store_ttl_s",
            "shutdown_grace_s",
            "cleanup_timeout_s",
            "max_queued_jobs",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name, least in (
            ("max_active_jobs_per_key", 1),
            ("max_queued_jobs_per_key", 0),
            ("python_max_concurrent", 1),
            ("python_max_concurrent_per_key", 1),
            ("python_memory_budget_mb", 1),
        ):
            value = getattr(self, name)
            if value is not None and value < least:
                raise ValueError(f"{name} must be >= {least}")
        if self.vllm_bridge not in ("auto", "public"):
            raise ValueError(f"vllm_bridge must be 'auto' or 'public', not {self.vllm_bridge!r}")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be 'text' or 'json', not {self.log_format!r}")
        if self.python_sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(
                f"python_sandbox must be 'auto', 'bwrap' or 'none', not {self.python_sandbox!r}"
            )
        for name in (
            "tool_timeout_s",
            "python_wall_s",
            "job_lease_s",
            "sse_write_timeout_s",
            "body_timeout_s",
            "webhook_timeout_s",
            "webhook_retry_window_s",
            "webhook_first_retry_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for spec in self.tool_servers:
            label, sep, address = spec.partition("=")
            if not sep or not label or not address:
                raise ValueError(f"tool server {spec!r}: expected LABEL=URL or LABEL=stdio:COMMAND")
        if self.code_interpreter and any(s.startswith("python=") for s in self.tool_servers):
            raise ValueError("--code-interpreter and --tool-server python=... both define 'python'")
        for pattern in self.mcp_allow_hosts:
            check_host_pattern(pattern)
        if self.web_search is not None:
            check_web_search(self.web_search)
            if any(s.startswith("browser=") for s in self.tool_servers):
                raise ValueError(
                    "--web-search and --tool-server browser=... both define 'browser': use one"
                )
        for pattern in (*self.web_search_allow_hosts, *self.webhook_allow_hosts):
            check_host_pattern(pattern)
        if self.webhook_url is not None:
            if self.webhook_secret_file is None:
                raise ValueError(
                    "--webhook needs --webhook-secret-file PATH: the file with its signing "
                    "secret (created, with a new secret, if it does not exist)"
                )
            parts = urlsplit(self.webhook_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"--webhook {self.webhook_url!r}: expected an http(s) URL")
        for origin in self.cors_allow_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"CORS origin {origin!r}: use SCHEME://HOST[:PORT] (no path, no trailing "
                    "'/'), e.g. https://app.example, or * for any origin"
                )
        if self.dashboard and self.api_keys and not self.admin_keys:
            raise ValueError(
                "the dashboard needs an admin key when API keys are set: add --admin-key KEY "
                "(the page asks for it)"
            )
        store_kind(self.store_url)
        if self.encryption_key is not None:
            parse_key(self.encryption_key)
        if self.sse_keepalive_s == 0:
            raise ValueError("sse_keepalive_s must be > 0")

    def _check_workers(self) -> None:
        if self.worker_id is not None and not _WORKER_ID.fullmatch(self.worker_id):
            raise ValueError(
                f"worker id {self.worker_id!r}: use 1 to 64 letters, digits, '.', '_' or '-'"
            )
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.workers == 1:
            return
        kind = store_kind(self.store_url)
        if kind != "redis":
            where = (
                "a SQLite file is one process's (a second one is refused)"
                if kind == "sqlite"
                else "memory:// is one process's memory"
            )
            raise ValueError(
                f"--workers {self.workers} needs a store every worker shares: --store "
                f"redis://HOST:PORT/DB or unix:///PATH?db=N ({where})"
            )
        if self.engine == "vllm":
            raise ValueError(
                f"--workers {self.workers} runs API workers only, and the vllm engine would "
                "load the model in each: serve the model once (vllm serve) and give the "
                "workers --engine remote --upstream URL"
            )

    @property
    def all_tool_servers(self) -> tuple[str, ...]:
        """``tool_servers`` plus the bundled browser when ``web_search``. (The bundled
        code interpreter is no tool server: the server runs its containers itself,
        ``tools.containers``.)"""
        servers = self.tool_servers
        if self.web_search is not None:
            command = (
                f"{shlex.quote(sys.executable)} -m trio_responses tool-server browser --stdio "
                f"--provider {shlex.quote(self.web_search)}"
            )
            for pattern in self.web_search_allow_hosts:
                command += f" --allow-host {shlex.quote(pattern)}"
            servers = (f"browser=stdio:{command}", *servers)
        return servers

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name a request may use as ``model``; the first is canonical."""
        if self.served_model_names:
            return self.served_model_names
        if self.model:
            return (self.model,)
        return (SCRIPTED_MODEL_NAME,)

    @property
    def model_name(self) -> str:
        """The name reported in responses and ``/v1/models``."""
        return self.model_names[0]

    def replace(self, **changes: object) -> Config:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
