"""The remote engine: the `Engine` protocol over HTTP to vLLM servers that take
token-id prompts (``--engine remote --upstream URL``).

Each turn is one streamed request carrying the whole rendered prompt as token ids
(every turn: prefix-cache-aware routers see all of it), whose output arrives as
token ids, which the translator reads as it reads the in-process engine's. Two of
vLLM's APIs serve it, found per upstream when it is first reached:

* ``POST /inference/v1/generate`` (tokens in, tokens out; vLLM serves it with
  ``--enable-scale-out``), with vLLM's ``sampling_params`` as they are, and
  ``POST /inference/v1/abort_requests`` to end a request early;
* otherwise ``POST /v1/completions`` with ``prompt: [ids]`` and
  ``return_token_ids``, which any vLLM serves (routers in front of vLLM too).

Sampling settings, stop token ids and the seed go as vLLM's own fields; a
constraint as its ``structured_outputs`` (``json``, ``choice``, ``grammar``,
``regex``); each tenant gets its own ``cache_salt``, so tenants never share
prefix-cache entries; cached prompt tokens come back in ``usage`` (the upstream
needs ``--enable-prompt-tokens-details`` to report them). The context window is
the upstream's ``max_model_len`` when that is smaller than ``--max-model-len``.

Several upstreams: each request goes to the one with the fewest outstanding
requests among those up. An upstream that cannot be reached, or answers 5xx
before streaming, is taken out and the request tried on another (nothing was
generated yet); a task probes it (``GET /health``) every second until it answers
and puts it back. A stream that breaks once tokens flowed fails its response
(``upstream_error``), and takes the upstream out: a killed upstream's streams all
end the moment its connections close. A request that ends early (cancelled, a
client gone, the sink declined more) closes its stream, which is how vLLM's
OpenAI server learns to abort it, and is aborted explicitly where the upstream
has the abort endpoint (a router may not pass a closed connection on).

The token streams go through `upstream_http` (kept-alive connections, about
half the CPU per event of a general client); the rare requests (what an upstream
serves, its health, an abort) through ``httpx2``. Neither vLLM nor trio-asyncio
is needed here.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import httpx2
import trio

from .._config import Config
from .._exceptions import EngineError, StartupError
from .._offload import INLINE_BYTES, offload
from ..protocol.codec import decode_json, encode_json
from ..protocol.errors import UPSTREAM_ERROR, UPSTREAM_UNAVAILABLE
from .base import (
    EngineInfo,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    TokenSink,
    UpstreamHealth,
    sampling_kwargs,
    structured_outputs_fields,
)
from .script import Script, plan
from .upstream_http import NotSent, StreamBroken, UpstreamHTTP

logger = logging.getLogger("trio_responses.engine.remote")

PROBE_INTERVAL_S = 1.0
"""How often a down upstream is asked whether it is back."""
CONNECT_TIMEOUT_S = 10.0
UPSTREAM_WAIT_S = 10.0
"""How long a request with every upstream out waits for the prober to bring one back
(an upstream briefly overloaded, or restarting) before it fails."""
READ_TIMEOUT_S = 600.0
"""Longest silence of a stream (a long prefill of a huge prompt on a busy upstream)."""
ABORT_TIMEOUT_S = 2.0
"""How long an abort may hold a request's cleanup."""
MAX_ERROR_BYTES = 2048

Api = Literal["generate", "completions"]
GENERATE_PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(eq=False)
class Upstream:
    """One upstream server and what this process knows of it."""

    url: str
    http: UpstreamHTTP
    up: bool = False
    api: Api = "completions"
    outstanding: int = 0
    failures: int = 0
    last_error: str | None = None

    def endpoint(self, path: str) -> str:
        return self.url.rstrip("/") + path

    def health(self) -> UpstreamHealth:
        return UpstreamHealth(
            url=self.url,
            up=self.up,
            outstanding=self.outstanding,
            failures=self.failures,
            api=self.api,
            last_error=self.last_error,
        )


@dataclass(frozen=True)
class ServedModel:
    """What an upstream's ``/v1/models`` says it serves."""

    name: str
    max_model_len: int | None


class _NotStarted(Exception):
    """The upstream took no part in the request: it may go to another."""


def cache_salt(tenant: str | None) -> str:
    """A stable salt per tenant (every replica and worker derives the same one)."""
    return hashlib.sha256(f"trio-responses/{tenant or ''}".encode()).hexdigest()[:32]


def request_body(
    api: Api,
    model: str,
    request: GenerationRequest,
    script: Sequence[int] | None = None,
    delay_s: float | None = None,
) -> bytes:
    """The JSON body of one turn for ``api`` (``script``: tokens the upstream must
    follow, read by its ``ScriptedLogitsProcessor``, at ``delay_s`` a token at
    least; testing only)."""
    sampling: dict[str, Any] = {
        key: value for key, value in sampling_kwargs(request.sampling).items() if value is not None
    }
    sampling["skip_special_tokens"] = False
    outputs = structured_outputs_fields(request.constraint)
    if outputs is not None:
        sampling["structured_outputs"] = outputs
    common = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_salt": cache_salt(request.tenant),
        "request_id": request.request_id,
    }
    extra: dict[str, Any] | None = None
    if script is not None:
        extra = {"script": list(script)}
        if delay_s:
            extra["delay_s"] = delay_s
    if api == "generate":
        if extra is not None:
            sampling["extra_args"] = extra
        body = {**common, "token_ids": list(request.prompt_token_ids), "sampling_params": sampling}
    else:
        body = {
            **common,
            **sampling,
            "prompt": list(request.prompt_token_ids),
            "return_token_ids": True,
        }
        if extra is not None:
            body["vllm_xargs"] = extra
    return encode_json(body).encode()


class RemoteEngine:
    """Generates on upstream vLLM servers; open it with `open_remote_engine`."""

    def __init__(
        self,
        client: httpx2.AsyncClient,
        upstreams: Sequence[Upstream],
        *,
        model: str,
        max_model_len: int | None = None,
        scripted: bool = False,
    ) -> None:
        self._client = client
        self.upstreams = list(upstreams)
        self._model = model
        self._scripted = scripted
        self._wake_prober = trio.Event()
        self._back = trio.Event()
        """Set (and replaced) each time the prober brings an upstream back."""
        self._info = EngineInfo(
            kind="remote",
            model=model,
            description=f"remote engine ({model} on {', '.join(u.url for u in upstreams)})"
            + (" following the scripted model (testing)" if scripted else ""),
            max_model_len=max_model_len,
        )

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def healthy(self) -> bool:
        return any(upstream.up for upstream in self.upstreams)

    def statistics(self) -> dict[str, int]:
        return {
            "running": sum(upstream.outstanding for upstream in self.upstreams),
            "upstreams_up": sum(upstream.up for upstream in self.upstreams),
            "upstreams_down": sum(not upstream.up for upstream in self.upstreams),
        }

    def upstream_health(self) -> Sequence[UpstreamHealth]:
        return [upstream.health() for upstream in self.upstreams]

    # -- generation --------------------------------------------------------------------

    async def generate(self, request: GenerationRequest, sink: TokenSink) -> GenerationResult:
        script: Script | None = None
        if self._scripted:  # a constrained plan builds a schema instance: off the loop
            script = await offload(
                INLINE_BYTES + 1 if request.constraint is not None else 0,
                lambda: plan(request.prompt_token_ids, request.constraint),
            )
        bodies: dict[Api, bytes] = {}
        tried: set[Upstream] = set()
        waited = False
        while True:
            upstream = self._pick(tried)
            if upstream is None and not waited:  # wait (once) for one to come back
                waited = True
                with trio.move_on_after(UPSTREAM_WAIT_S):
                    await self._back.wait()
                tried = {u for u in tried if not u.up}
                continue
            if upstream is None:
                raise EngineError(
                    "No upstream inference server is available: "
                    + "; ".join(f"{u.url}: {u.last_error or 'down'}" for u in self.upstreams),
                    code=UPSTREAM_UNAVAILABLE,
                )
            tried.add(upstream)
            api = upstream.api
            body = bodies.get(api)
            if body is None:
                body = bodies[api] = await offload(
                    len(request.prompt_token_ids) * 8,
                    partial(
                        request_body,
                        api,
                        self._model,
                        request,
                        None if script is None else script.tokens,
                        None if script is None else script.delay_s,
                    ),
                )
            try:
                return await self._stream(upstream, request, body, sink)
            except _NotStarted as refused:
                self._take_out(upstream, str(refused))

    def _pick(self, tried: set[Upstream]) -> Upstream | None:
        candidates = [u for u in self.upstreams if u.up and u not in tried]
        if not candidates:
            return None
        return min(candidates, key=lambda upstream: upstream.outstanding)

    async def _stream(
        self, upstream: Upstream, request: GenerationRequest, body: bytes, sink: TokenSink
    ) -> GenerationResult:
        upstream.outstanding += 1
        produced = 0
        cached = 0
        finish: FinishReason | None = None
        path = GENERATE_PATH if upstream.api == "generate" else COMPLETIONS_PATH
        try:
            async with upstream.http.post(path, body) as reply:
                if reply.status >= 500:
                    text = await reply.text(MAX_ERROR_BYTES, CONNECT_TIMEOUT_S)
                    raise _NotStarted(f"answered {reply.status}: {_error_message(text)}")
                if reply.status != 200:
                    text = await reply.text(MAX_ERROR_BYTES, CONNECT_TIMEOUT_S)
                    raise EngineError(
                        f"The upstream {upstream.url} refused the request "
                        f"({reply.status}): {_error_message(text)}",
                        code=UPSTREAM_ERROR,
                    )
                while (data := await reply.next_event(READ_TIMEOUT_S)) is not None:
                    if data == b"[DONE]":  # the body ends next: read it, to keep the connection
                        continue
                    chunk = decode_json(data)
                    if "error" in chunk:
                        raise EngineError(
                            f"The upstream {upstream.url} failed the request: "
                            f"{_message(chunk['error'])}",
                            code=UPSTREAM_ERROR,
                        )
                    usage = chunk.get("usage")
                    if usage:
                        details = usage.get("prompt_tokens_details") or {}
                        cached = int(details.get("cached_tokens") or 0)
                    for choice in chunk.get("choices") or ():
                        tokens = choice.get("token_ids")
                        if tokens:
                            produced += len(tokens)
                            sink(tokens)
                        reason = choice.get("finish_reason")
                        if reason is not None:
                            finish = "length" if reason == "length" else "stop"
        except NotSent as error:
            raise _NotStarted(str(error)) from error
        except StreamBroken as error:
            if finish is None:  # (after the answer ended, only the connection is lost)
                if produced == 0:
                    raise _NotStarted(str(error)) from error
                self._take_out(upstream, f"the stream broke: {error}")
                raise EngineError(
                    f"The upstream {upstream.url} stopped in the middle of the answer ({error}).",
                    code=UPSTREAM_ERROR,
                ) from error
        except (ValueError, TypeError, AttributeError) as error:  # not vLLM's JSON
            raise EngineError(
                f"The upstream {upstream.url} sent malformed data.", code=UPSTREAM_ERROR
            ) from error
        finally:
            upstream.outstanding -= 1
            if finish is None and upstream.api == "generate":
                await self._abort(upstream, request.request_id)
        if finish is None:
            raise EngineError(
                f"The upstream {upstream.url} ended the stream without finishing the answer.",
                code=UPSTREAM_ERROR,
            )
        return GenerationResult(
            finish_reason=finish,
            prompt_tokens=len(request.prompt_token_ids),
            cached_tokens=min(cached, len(request.prompt_token_ids)),
            output_tokens=produced,
        )

    async def _abort(self, upstream: Upstream, request_id: str) -> None:
        """Abort a request that ended early (its closed stream aborts it too)."""
        # vLLM names a generate request "generate-tokens-<ours>"; older ones, ours.
        body = encode_json({"request_ids": [f"generate-tokens-{request_id}", request_id]})
        with trio.CancelScope(shield=True), trio.move_on_after(ABORT_TIMEOUT_S):
            try:
                await self._client.post(
                    upstream.endpoint(ABORT_PATH),
                    content=body.encode(),
                    headers={"Content-Type": "application/json"},
                )
            except httpx2.HTTPError as error:
                logger.info("upstream %s: abort of %s failed: %s", upstream.url, request_id, error)

    # -- upstream health -------------------------------------------------------------------

    def _take_out(self, upstream: Upstream, reason: str) -> None:
        upstream.failures += 1
        upstream.last_error = reason
        if upstream.up:
            logger.warning("upstream %s is down: %s", upstream.url, reason)
            upstream.up = False
            self._wake_prober.set()

    async def run_prober(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Trio task: probes the upstreams that are down until each answers again."""
        task_status.started()
        while True:
            down = [u for u in self.upstreams if not u.up]
            if not down:
                await self._wake_prober.wait()
                self._wake_prober = trio.Event()
                continue
            for upstream in down:
                if await self._probe(upstream):
                    logger.warning("upstream %s is up (%s API)", upstream.url, upstream.api)
                    self._back.set()
                    self._back = trio.Event()
            await trio.sleep(PROBE_INTERVAL_S)

    async def _probe(self, upstream: Upstream) -> bool:
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            try:
                response = await self._client.get(upstream.endpoint("/health"))
                if response.status_code != 200:
                    upstream.last_error = f"probe: /health answered {response.status_code}"
                    return False
                upstream.api = await _api(self._client, upstream)
            except httpx2.HTTPError as error:
                upstream.last_error = f"probe: {type(error).__name__}"
                return False
            upstream.up = True
            return True
        upstream.last_error = "probe: no answer"
        return False


async def _api(client: httpx2.AsyncClient, upstream: Upstream) -> Api:
    """Which token API the upstream offers: an empty generate request is a 4xx
    validation error where the endpoint exists, 404 or 403 where it does not."""
    response = await client.post(
        upstream.endpoint(GENERATE_PATH),
        content=b"{}",
        headers={"Content-Type": "application/json"},
    )
    return "generate" if response.status_code in (400, 422) else "completions"


def _error_message(text: str) -> str:
    """The message of an OpenAI-style error body, or the body."""
    try:
        message = _message(decode_json(text).get("error"))
    except (ValueError, AttributeError):
        message = None
    return message or text or "no message"


def _message(error: Any) -> str | None:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return None if error is None else str(error)


async def _served_model(client: httpx2.AsyncClient, upstream: Upstream) -> ServedModel:
    response = await client.get(upstream.endpoint("/v1/models"))
    response.raise_for_status()
    card = response.json()["data"][0]
    length = card.get("max_model_len")
    return ServedModel(str(card["id"]), int(length) if length else None)


@asynccontextmanager
async def open_remote_engine(config: Config) -> AsyncIterator[RemoteEngine]:
    """The remote engine over ``config.upstreams``, its prober running.

    Each upstream is asked what it serves and which API it offers; those that do
    not answer start out down (the prober brings them in). At least one must answer.
    """
    headers = {}
    if config.upstream_api_key:
        headers["Authorization"] = f"Bearer {config.upstream_api_key}"
    timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, limits=limits) as client:
        upstreams = [
            Upstream(
                url,
                UpstreamHTTP(
                    url,
                    headers=headers,
                    connect_timeout_s=CONNECT_TIMEOUT_S,
                    read_timeout_s=READ_TIMEOUT_S,
                ),
            )
            for url in config.upstreams
        ]
        served: list[ServedModel] = []
        for upstream in upstreams:
            try:
                served.append(await _served_model(client, upstream))
                upstream.api = await _api(client, upstream)
            except (httpx2.HTTPError, KeyError, IndexError, TypeError, ValueError) as error:
                upstream.last_error = f"{type(error).__name__}: {error}"
                logger.warning("upstream %s is down: %s", upstream.url, upstream.last_error)
                continue
            upstream.up = True
            logger.info("upstream %s: %s API, serving %r", upstream.url, upstream.api, served[-1])
        if not served:
            raise StartupError(
                "cannot start the remote engine: no upstream answered /v1/models ("
                + "; ".join(f"{u.url}: {u.last_error}" for u in upstreams)
                + ")"
            )
        lengths = [model.max_model_len for model in served if model.max_model_len]
        engine = RemoteEngine(
            client,
            upstreams,
            model=config.model or served[0].name,
            max_model_len=min(lengths) if lengths else None,
            scripted=config.engine_script,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run_prober)
            try:
                yield engine
            finally:
                nursery.cancel_scope.cancel()
                for upstream in upstreams:
                    await upstream.http.aclose()
