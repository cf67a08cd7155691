"""Prometheus metrics: every family this server exposes at ``/metrics``, in one place.

One `Metrics` object per service, with its own `CollectorRegistry` (never the
global one), so that several servers in one process keep separate counts. Code
that observes something calls a method of it (``metrics.tool_call("mcp", "ok",
0.12)``); gauges of what the service holds (jobs, subscribers, retained
streams) are read from its statistics when ``/metrics`` is scraped, so they cost
nothing on the hot path.

Label values are always bounded: route templates (never raw paths), status
codes, fixed kinds and outcomes, the backend name and the configured model
name. No response id, API key, URL or name chosen by a client or a model is
ever a label value.

Cheap on the hot path: counters move once per batch of events (a write to a
client, an engine turn, a job's end), not once per token, and label children
used per event are bound once, up front.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any, Literal, Protocol, final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from ._exceptions import StoreError

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The Prometheus text format (0.0.4), what every Prometheus version scrapes."""

PREFIX = "trio_responses"

ToolKind = str
"""``function``, ``custom``, or a built-in tool's ``metrics_label`` (`tools.builtin`):
a fixed set."""
ToolOutcome = Literal["ok", "error", "failed", "timeout", "client", "approval", "declined"]
"""``ok``: the tool answered; ``error``: it answered with an error result;
``failed``: it could not be called or gave no answer; ``timeout``: it took longer
than ``tool_timeout_s``; ``client``: a function call handed to the client;
``approval``: an MCP call waiting for the user's approval; ``declined``: an MCP
call the user declined."""

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_CODE = re.compile(r"[a-z][a-z0-9_]{0,47}")

_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_WEBHOOK_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    60.0,
    600.0,
    3600.0,
)
"""Seconds from an event to its delivery: a few ms on loopback, hours after outages."""
_TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_STORE_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    5.0,
)

STORE_OPERATIONS = {
    "store": ("put", "get", "delete", "expire", "recover_interrupted"),
    "logs": ("append", "finish", "open", "terminate", "delete", "expire"),
    "webhooks": ("claim", "settle"),
}
"""The state-layer methods `instrument_state` times, by the `State` attribute holding them."""


class IncDec(Protocol):
    """A gauge as the code that moves it sees it."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


@dataclass(frozen=True)
class Snapshot:
    """What the scrape-time gauges show (`Metrics.watch`)."""

    running_jobs: int
    active_jobs: int
    queued_jobs: int
    subscribers: int
    retained_streams: int
    retained_stream_bytes: int
    tool_servers_ready: dict[str, bool]
    """Configured tool server labels (operator-chosen) and whether each is connected."""
    upstreams: tuple[tuple[str, bool, int], ...] = ()
    """The remote engine's upstreams (operator-chosen URLs): up, outstanding requests."""
    containers_live: int = 0
    """Container processes running here (the code interpreter's)."""
    containers_started: int = 0
    """Container processes started here since the server started."""


@final
class _SnapshotCollector:
    """Gauges read from the service at scrape time."""

    def __init__(self, read: Callable[[], Snapshot]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        snapshot = self._read()
        for name, documentation, value in (
            (
                "jobs_running",
                "Responses not finished here (generating or queued).",
                snapshot.running_jobs,
            ),
            (
                "jobs_active",
                "Responses generating now (holding a generation slot).",
                snapshot.active_jobs,
            ),
            ("jobs_queued", "Responses waiting for a generation slot.", snapshot.queued_jobs),
            (
                "subscribers",
                "Open readers of event logs served by this process.",
                snapshot.subscribers,
            ),
            ("retained_streams", "Finished event logs kept for replay.", snapshot.retained_streams),
            (
                "retained_stream_bytes",
                "Bytes held by finished event logs kept for replay.",
                snapshot.retained_stream_bytes,
            ),
            (
                "containers_live",
                "Code interpreter container processes running here.",
                snapshot.containers_live,
            ),
        ):
            yield GaugeMetricFamily(f"{PREFIX}_{name}", documentation, value=value)
        yield CounterMetricFamily(
            f"{PREFIX}_containers_started",
            "Code interpreter container processes started here (first calls, restarts).",
            value=snapshot.containers_started,
        )
        servers = GaugeMetricFamily(
            f"{PREFIX}_tool_server_up",
            "1 while a configured tool server (--tool-server) is connected, else 0.",
            labels=["server"],
        )
        for label, ready in sorted(snapshot.tool_servers_ready.items()):
            servers.add_metric([label], 1.0 if ready else 0.0)
        yield servers
        up = GaugeMetricFamily(
            f"{PREFIX}_upstream_up",
            "1 while an upstream of the remote engine (--upstream) takes requests, else 0.",
            labels=["upstream"],
        )
        outstanding = GaugeMetricFamily(
            f"{PREFIX}_upstream_outstanding_requests",
            "Requests this process has open on an upstream of the remote engine.",
            labels=["upstream"],
        )
        for url, is_up, count in snapshot.upstreams:
            up.add_metric([url], 1.0 if is_up else 0.0)
            outstanding.add_metric([url], count)
        yield up
        yield outstanding

    def describe(self) -> Iterable[Metric]:
        return []


@final
class Metrics:
    """The metric families of one service, in their own registry.

    ``model`` is the configured served model name (the only model label value);
    ``process`` adds the ``process_*`` families of this process.
    """

    def __init__(self, *, model: str, engine: str = "", process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.model = model
        if process:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
        info = Gauge(
            f"{PREFIX}_info",
            "Always 1: what this server serves (configured model name and engine).",
            ["model", "engine"],
            registry=registry,
        )
        info.labels(model, engine).set(1)

        # -- HTTP -----------------------------------------------------------------
        self._http_requests = Counter(
            f"{PREFIX}_http_requests",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"],
            registry=registry,
        )
        self._http_seconds = Histogram(
            f"{PREFIX}_http_request_duration_seconds",
            "Time to answer an HTTP request, up to its response headers (a stream's body "
            "is not included).",
            ["route", "method"],
            buckets=_HTTP_BUCKETS,
            registry=registry,
        )

        # -- responses ------------------------------------------------------------
        self._created = Counter(
            f"{PREFIX}_responses_created",
            "Responses started (recorded and response.created emitted).",
            ["background"],
            registry=registry,
        )
        self._finished = Counter(
            f"{PREFIX}_responses_finished",
            "Responses that reached a terminal status, by status.",
            ["status", "background"],
            registry=registry,
        )
        self._errors = Counter(
            f"{PREFIX}_response_errors",
            "Failed responses, by error code (server_error, server_shutdown, ...).",
            ["code"],
            registry=registry,
        )
        self._ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "From a response's start (including time queued) to its first generated token.",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=registry,
        ).labels(model)
        self._tpot = Histogram(
            f"{PREFIX}_time_per_output_token_seconds",
            "Mean time between output tokens of a response's first engine turn, after "
            "its first token.",
            ["model"],
            buckets=_TPOT_BUCKETS,
            registry=registry,
        ).labels(model)
        tokens = Counter(
            f"{PREFIX}_engine_tokens",
            "Tokens through the engine, by kind: prompt (every turn's prompt), cached "
            "(prompt tokens served from the prefix cache), output, reasoning (output "
            "tokens on the analysis channel).",
            ["model", "kind"],
            registry=registry,
        )
        self._prompt_tokens = tokens.labels(model, "prompt")
        self._cached_tokens = tokens.labels(model, "cached")
        self._output_tokens = tokens.labels(model, "output")
        self._reasoning_tokens = tokens.labels(model, "reasoning")

        # -- streams --------------------------------------------------------------
        events = Counter(
            f"{PREFIX}_events_sent",
            "Stream events written to clients, by transport.",
            ["transport"],
            registry=registry,
        )
        self._events = {transport: events.labels(transport) for transport in ("sse", "websocket")}
        lagged = Counter(
            f"{PREFIX}_stream_lagged",
            "Streams closed because their reader fell behind the replay ring (stream_lagged).",
            ["transport"],
            registry=registry,
        )
        self._lagged = {transport: lagged.labels(transport) for transport in ("sse", "websocket")}
        self.websocket_connections = Gauge(
            f"{PREFIX}_websocket_connections",
            "WebSocket connections open now.",
            registry=registry,
        )

        # -- tools ------------------------------------------------------------------
        self._tool_calls = Counter(
            f"{PREFIX}_tool_calls",
            "Tool calls, by tool kind and outcome.",
            ["kind", "outcome"],
            registry=registry,
        )
        self._tool_seconds = Histogram(
            f"{PREFIX}_tool_call_duration_seconds",
            "Time the server spent running a tool call (built-in and MCP tools).",
            ["kind"],
            buckets=_TOOL_BUCKETS,
            registry=registry,
        )
        sessions = Gauge(
            f"{PREFIX}_mcp_sessions_open",
            "Connected MCP sessions: configured tool servers, and per-request servers.",
            ["scope"],
            registry=registry,
        )
        self.configured_mcp_sessions: IncDec = sessions.labels("configured")
        self.request_mcp_sessions: IncDec = sessions.labels("request")

        # -- store ------------------------------------------------------------------
        self._store_operations = Counter(
            f"{PREFIX}_store_operations",
            "State-layer operations, by backend and operation.",
            ["backend", "operation"],
            registry=registry,
        )
        self._store_errors = Counter(
            f"{PREFIX}_store_errors",
            "State-layer operations that failed (StoreError), by backend and operation.",
            ["backend", "operation"],
            registry=registry,
        )
        self._store_seconds = Histogram(
            f"{PREFIX}_store_operation_duration_seconds",
            "Time of state-layer operations, by backend and operation.",
            ["backend", "operation"],
            buckets=_STORE_BUCKETS,
            registry=registry,
        )

        # -- webhooks -----------------------------------------------------------------
        self._webhook_deliveries = Counter(
            f"{PREFIX}_webhook_deliveries",
            "Webhook deliveries settled, by event type and outcome (delivered, failed).",
            ["event_type", "outcome"],
            registry=registry,
        )
        self._webhook_attempts = Counter(
            f"{PREFIX}_webhook_attempts",
            "Webhook delivery attempts (posts), by outcome (ok, retry, failed).",
            ["outcome"],
            registry=registry,
        )
        self._webhook_latency = Histogram(
            f"{PREFIX}_webhook_delivery_latency_seconds",
            "Time from a webhook event to its delivery (a 2xx from the receiver).",
            buckets=_WEBHOOK_BUCKETS,
            registry=registry,
        )

    # -- scrape ------------------------------------------------------------------------

    def watch(self, read: Callable[[], Snapshot]) -> None:
        """Show what ``read`` returns as gauges, read at each scrape. Call once."""
        self.registry.register(_SnapshotCollector(read))

    def render(self) -> bytes:
        """Every family in the Prometheus text format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    # -- HTTP ----------------------------------------------------------------------------

    def http_request(self, route: str | None, method: str, status: int, seconds: float) -> None:
        """One answered request. ``route`` is the matched route template (None: no route)."""
        route = route or "unmatched"
        method = method if method in _METHODS else "OTHER"
        self._http_requests.labels(route, method, str(status)).inc()
        self._http_seconds.labels(route, method).observe(seconds)

    # -- responses -------------------------------------------------------------------------

    def response_created(self, *, background: bool) -> ResponseTimer:
        """A response has started; the returned timer measures its tokens."""
        self._created.labels(_flag(background)).inc()
        return ResponseTimer(self)

    def response_finished(
        self,
        status: str,
        *,
        background: bool,
        error_code: str | None,
        input_tokens: int,
        cached_tokens: int,
        output_tokens: int,
        reasoning_tokens: int,
    ) -> None:
        """A response reached ``status`` (terminal) with these token counts (all turns)."""
        self._finished.labels(status, _flag(background)).inc()
        if status == "failed":
            code = error_code if error_code and _CODE.fullmatch(error_code) else "other"
            self._errors.labels(code).inc()
        self._prompt_tokens.inc(input_tokens)
        self._cached_tokens.inc(cached_tokens)
        self._output_tokens.inc(output_tokens)
        self._reasoning_tokens.inc(reasoning_tokens)

    # -- streams -----------------------------------------------------------------------------

    def events_sent(self, count: int, transport: Literal["sse", "websocket"] = "sse") -> None:
        """``count`` events went to one client in one write."""
        self._events[transport].inc(count)

    def stream_lagged(self, transport: Literal["sse", "websocket"] = "sse") -> None:
        """A stream was closed because its reader fell behind the ring."""
        self._lagged[transport].inc()

    @contextmanager
    def websocket_connection(self) -> Iterator[None]:
        """Count a WebSocket connection as open for the duration of the block."""
        self.websocket_connections.inc()
        try:
            yield
        finally:
            self.websocket_connections.dec()

    # -- tools -----------------------------------------------------------------------------

    def tool_call(self, kind: ToolKind, outcome: ToolOutcome, seconds: float | None) -> None:
        """One tool call; ``seconds`` is how long the server ran it (None: it did not)."""
        self._tool_calls.labels(kind, outcome).inc()
        if seconds is not None:
            self._tool_seconds.labels(kind).observe(seconds)

    # -- webhooks --------------------------------------------------------------------------

    def webhook_attempt(self, outcome: Literal["ok", "retry", "failed"]) -> None:
        """One post to a receiver: it succeeded, will be retried, or was the last."""
        self._webhook_attempts.labels(outcome).inc()

    def webhook_settled(
        self, event_type: str, outcome: Literal["delivered", "failed"], latency_s: float | None
    ) -> None:
        """A delivery ended; ``latency_s``: from its event to the 2xx (delivered)."""
        self._webhook_deliveries.labels(event_type, outcome).inc()
        if latency_s is not None:
            self._webhook_latency.observe(max(0.0, latency_s))

    # -- store -------------------------------------------------------------------------------

    def store_operation(self, backend: str, operation: str, seconds: float, failed: bool) -> None:
        self._store_operations.labels(backend, operation).inc()
        self._store_seconds.labels(backend, operation).observe(seconds)
        if failed:
            self._store_errors.labels(backend, operation).inc()


@final
class ResponseTimer:
    """Time to first token and time per output token of one response.

    Made when the response starts (`Metrics.response_created`). Only the turn
    that produces its first token is watched (`watch`: one extra call per token
    batch, a fraction of a microsecond); later turns pay nothing per token.
    """

    __slots__ = ("_first_at", "_measured", "_metrics", "_started")

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._started = time.perf_counter()
        self._first_at: float | None = None
        self._measured = False

    def watch(self, sink: Callable[[Sequence[int]], None]) -> Callable[[Sequence[int]], None]:
        """``sink`` for the next engine turn: notes the time of the response's first token.

        Once the first token has been seen, returns ``sink`` itself (no cost per token).
        """
        if self._first_at is not None:
            return sink

        def until_first_token(tokens: Sequence[int]) -> None:
            if self._first_at is None and tokens:
                self._first_at = time.perf_counter()
                self._metrics._ttft.observe(self._first_at - self._started)
            sink(tokens)

        return until_first_token

    def turn_ended(self, output_tokens: int) -> None:
        """An engine turn ended with ``output_tokens`` tokens.

        The turn that produced the response's first token is measured: its mean
        time per token after the first. Later turns are not.
        """
        first = self._first_at
        if first is None or self._measured:
            return
        self._measured = True
        if output_tokens >= 2:
            self._metrics._tpot.observe((time.perf_counter() - first) / (output_tokens - 1))


def _flag(value: bool) -> str:
    return "true" if value else "false"


def instrument_state(state: Any, metrics: Metrics) -> None:
    """Count and time the operations of ``state``'s response store and event logs.

    Wraps the methods named in `STORE_OPERATIONS` on the backend objects
    themselves (instance attributes), so they stay the objects every backend
    test knows. A `StoreError` counts as an error; cancellation and other
    exceptions propagate untouched (counted, not as errors).
    """
    backend = str(state.kind)
    for attribute, operations in STORE_OPERATIONS.items():
        target = getattr(state, attribute)
        for operation in operations:
            method = getattr(target, operation, None)
            if method is None:
                continue
            setattr(
                target,
                operation,
                _timed(method, metrics, backend, f"{attribute}.{operation}"),
            )


def _timed(
    method: Callable[..., Awaitable[Any]], metrics: Metrics, backend: str, operation: str
) -> Callable[..., Awaitable[Any]]:
    @wraps(method)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        failed = False
        try:
            return await method(*args, **kwargs)
        except StoreError:
            failed = True
            raise
        finally:
            metrics.store_operation(backend, operation, time.perf_counter() - started, failed)

    return timed
