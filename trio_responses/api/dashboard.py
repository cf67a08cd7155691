"""The operator page (``--dashboard``): ``/dashboard`` and its data under ``/dashboard/api``.

The page itself (HTML, script, style: `trio_responses.dashboard`) is public; its data
is every owner's, so with API keys it needs an admin key (``Authorization: Bearer``;
the page asks for it and keeps it in ``sessionStorage``). Owners appear as a short
tag of their owner hash, never as a key. What it shows is what runs in this process:
the running and queued jobs, the responses that finished here last, and the output
token rate per model; and, from the store, the newest webhook deliveries of every
replica (pending, delivered or failed, with their last error). One response's events
can be followed live (SSE, resumable with ``starting_after``) and a background response
cancelled.

Routes::

    GET  /dashboard                                   the page
    GET  /dashboard/dashboard.js, /dashboard/dashboard.css
    GET  /dashboard/api/jobs                          running and queued jobs
    GET  /dashboard/api/recent                        responses that finished here last
    GET  /dashboard/api/rates                         output tokens/s per model, last minute
    GET  /dashboard/api/webhooks                      the newest webhook deliveries (every
                                                      replica's), failures included
    GET  /dashboard/api/responses/<id>                the Response object
    GET  /dashboard/api/responses/<id>/events         its events (SSE; ?starting_after=N)
    POST /dashboard/api/responses/<id>/cancel         cancel a background response
"""

from __future__ import annotations

import hmac
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any, final

from quart import Response, request
from quart_trio import QuartTrio

from .._exceptions import AuthenticationError
from .._runner import FinishedJob
from .._service import ResponsesService
from ..background.job import Job
from .common import check_response_id, json_response, sse_response, starting_after_param
from .sse import SSEBody

RATE_WINDOW_S = 60.0
"""How far back the token-rate series reaches."""
RATE_SPACING_S = 0.5
"""Samples of the token counters are taken at most this often (when the rates are read)."""

_PAGE_HEADERS = {
    # Everything the page needs comes from this server: no CDN, no fonts, no frames.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_DATA_HEADERS = {"Cache-Control": "no-store"}


@final
@dataclass(frozen=True)
class _Assets:
    """The page's files, read once from the package."""

    html: bytes
    script: bytes
    style: bytes

    @classmethod
    def load(cls) -> _Assets:
        folder = resources.files("trio_responses.dashboard")
        return cls(
            html=folder.joinpath("index.html").read_bytes(),
            script=folder.joinpath("dashboard.js").read_bytes(),
            style=folder.joinpath("dashboard.css").read_bytes(),
        )


@final
class TokenRates:
    """Output tokens per second by model over the last `RATE_WINDOW_S`, for a sparkline.

    ``read`` returns counters that only grow (tokens since start, by model); a sample
    of them is taken when the rates are read, at most every `RATE_SPACING_S`, so no
    task runs for it. Each point is the rate between two consecutive samples.
    """

    def __init__(
        self,
        read: Callable[[], dict[str, int]],
        *,
        window_s: float = RATE_WINDOW_S,
        spacing_s: float = RATE_SPACING_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._window_s = window_s
        self._spacing_s = spacing_s
        self._clock = clock
        self._samples: deque[tuple[float, dict[str, int]]] = deque(
            maxlen=int(window_s / spacing_s) + 2
        )

    def sample(self) -> None:
        """Take a sample now, unless the last one is more recent than the spacing."""
        now = self._clock()
        if self._samples and now - self._samples[-1][0] < self._spacing_s:
            return
        self._samples.append((now, self._read()))
        # Keep one sample older than the window: the first point's starting line.
        while len(self._samples) > 2 and now - self._samples[1][0] > self._window_s:
            self._samples.popleft()

    def report(self, models: Iterable[str]) -> dict[str, Any]:
        """Sample, then each model's points (``[seconds ago, tokens/s]``, oldest first),
        its latest rate and its average over the window."""
        self.sample()
        now = self._clock()
        samples = list(self._samples)
        names = list(dict.fromkeys([*models, *(samples[-1][1] if samples else {})]))
        series = []
        for name in names:
            points = []
            for (t0, before), (t1, after) in itertools.pairwise(samples):
                rate = (after.get(name, 0) - before.get(name, 0)) / (t1 - t0)
                points.append([round(now - t1, 2), round(rate, 2)])
            average = 0.0
            if len(samples) > 1:
                first, last = samples[0], samples[-1]
                average = (last[1].get(name, 0) - first[1].get(name, 0)) / (last[0] - first[0])
            series.append(
                {
                    "model": name,
                    "tokens_per_s": points[-1][1] if points else 0.0,
                    "average_tokens_per_s": round(average, 2),
                    "output_tokens": samples[-1][1].get(name, 0) if samples else 0,
                    "points": points,
                }
            )
        return {"object": "dashboard.rates", "window_s": self._window_s, "data": series}


def owner_tag(owner: str | None) -> str | None:
    """The short tag an owner is shown as (its owner hash, cut short; never a key)."""
    return None if owner is None else owner[:8]


def job_json(job: Job, now: float) -> dict[str, Any]:
    """A running or queued job as the dashboard shows it."""
    created_at = job.builder.created_at
    return {
        "id": job.id,
        "model": job.request.model,
        "owner": owner_tag(job.owner),
        "status": job.status,
        "queued": job.status == "queued",
        "background": job.background,
        "stored": job.request.store,
        "created_at": created_at,
        "age_s": round(max(0.0, now - created_at), 1),
        "output_tokens": job.generated_tokens,
        "subscribers": job.log.subscribers,
    }


def finished_json(finished: FinishedJob) -> dict[str, Any]:
    """A response that finished here, as the dashboard shows it."""
    return {
        "id": finished.id,
        "model": finished.model,
        "owner": owner_tag(finished.owner),
        "status": finished.status,
        "background": finished.background,
        "stored": finished.stored,
        "created_at": finished.created_at,
        "ended_at": round(finished.ended_at, 3),
        "duration_s": round(max(0.0, finished.ended_at - finished.created_at), 1),
        "output_tokens": finished.output_tokens,
        "usage": finished.usage,
        "error": finished.error,
    }


def add_dashboard(app: QuartTrio, service: ResponsesService) -> None:
    """Add the dashboard's routes to ``app`` (see the module docstring)."""
    config = service.config
    admin_keys = tuple(key.encode() for key in config.admin_keys)
    assets = _Assets.load()
    rates = TokenRates(service.output_tokens)

    def require_admin() -> None:
        """Without API keys the data is open (like ``/health``); with them, admins only.

        Raises:
            AuthenticationError: no admin key presented.
        """
        if not config.api_keys:
            return
        scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
        presented = token.strip().encode()
        if scheme.lower() != "bearer" or not presented:
            raise AuthenticationError(
                "The dashboard's data needs an admin key: send 'Authorization: Bearer "
                "ADMIN_KEY' (a key given with --admin-key)."
            )
        if not any(hmac.compare_digest(presented, key) for key in admin_keys):
            raise AuthenticationError(
                "Incorrect admin key provided. The dashboard's data needs a key given with "
                "--admin-key; API keys are not admin keys."
            )

    def data(payload: Any) -> Response:
        response = json_response(payload)
        response.headers.update(_DATA_HEADERS)
        return response

    def asset(body: bytes, mimetype: str) -> Response:
        return Response(body, mimetype=mimetype, headers=_PAGE_HEADERS)

    @app.get("/dashboard")
    async def dashboard_page() -> Response:
        return asset(assets.html, "text/html")

    @app.get("/dashboard/dashboard.js")
    async def dashboard_script() -> Response:
        return asset(assets.script, "text/javascript")

    @app.get("/dashboard/dashboard.css")
    async def dashboard_style() -> Response:
        return asset(assets.style, "text/css")

    @app.get("/dashboard/api/jobs")
    async def dashboard_jobs() -> Response:
        require_admin()
        now = time.time()
        jobs = sorted(service.jobs(), key=lambda job: (job.builder.created_at, job.id))
        stats = service.statistics()
        return data(
            {
                "object": "list",
                "data": [job_json(job, now) for job in jobs],
                "statistics": {
                    "running": stats.running_jobs,
                    "active": stats.active_jobs,
                    "queued": stats.queued_jobs,
                    "subscribers": stats.subscribers,
                },
                "limits": {
                    "max_active_jobs": config.max_active_jobs,
                    "max_queued_jobs": config.max_queued_jobs,
                },
            }
        )

    @app.get("/dashboard/api/recent")
    async def dashboard_recent() -> Response:
        require_admin()
        return data({"object": "list", "data": [finished_json(f) for f in service.recent()]})

    @app.get("/dashboard/api/rates")
    async def dashboard_rates() -> Response:
        require_admin()
        return data(rates.report(config.model_names))

    @app.get("/dashboard/api/webhooks")
    async def dashboard_webhooks() -> Response:
        require_admin()
        return data({"object": "list", "data": await service.webhooks.recent_deliveries()})

    @app.get("/dashboard/api/responses/<response_id>")
    async def dashboard_response(response_id: str) -> Response:
        require_admin()
        check_response_id(response_id)
        return data(await service.retrieve(response_id, admin=True))

    @app.get("/dashboard/api/responses/<response_id>/events")
    async def dashboard_events(response_id: str) -> Response:
        require_admin()
        check_response_id(response_id)
        subscription = await service.subscribe(
            response_id, starting_after=starting_after_param(), admin=True
        )
        return sse_response(SSEBody(subscription, keepalive_s=config.sse_keepalive_s))

    @app.post("/dashboard/api/responses/<response_id>/cancel")
    async def dashboard_cancel(response_id: str) -> Response:
        require_admin()
        check_response_id(response_id)
        return data(await service.cancel(response_id, admin=True))
