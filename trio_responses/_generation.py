"""The generation loop of one job: tool preparation, engine turns, tool calls.

`generate_response` runs inside the job's task:

1. list the tools of MCP servers the conversation has not listed yet
   (``mcp_list_tools`` items), and run (or decline) the calls the user answered
   with ``mcp_approval_response``; then render the prompt with what they gave;
2. generate a turn (steered by `harmony.steering` when `text.format` or
   `tool_choice` asks: several engine requests); the translator streams its items;
3. if the turn ended with a built-in or MCP tool call, run it, append the
   generated tokens and the tool's output to the prompt, and generate again
   (up to ``max_tool_calls``); a function call or an approval request ends the
   response (the client acts next).

It returns with the job finished for every outcome but cancellation:
completed, incomplete (token budget, tool-call budget), failed (engine error,
malformed model output). `trio.Cancelled` propagates untouched; the job runner
decides what a cancellation means.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import trio
from mcp_types import REQUEST_TIMEOUT

from ._exceptions import EngineError, InvalidRequestError
from ._offload import INLINE_TOKENIZED, offload
from .background.job import Job
from .engine.base import (
    ChoiceConstraint,
    Engine,
    GenerationRequest,
    GenerationResult,
    GrammarConstraint,
    JsonConstraint,
    OutputConstraint,
    SamplingSettings,
    TokenSink,
)
from .harmony.encoding import special_tokens, stop_tokens
from .harmony.fit import render_request_prompt
from .harmony.parallel import MAX_CALLS_PER_TURN, Declined, NextCallGate, continuation
from .harmony.prompt import (
    DECLINED,
    PromptTools,
    ToolNamespace,
    render_tool_result,
    tool_description,
)
from .harmony.steering import (
    ANY_OBJECT,
    Constrain,
    HeaderGate,
    Interrupt,
    Steering,
    Target,
    call_header,
    choice_prefix,
    chosen,
    final_header,
    steering_for,
)
from .harmony.translator import MalformedOutput, ToolCall, TurnTranslator
from .metrics import Metrics, ResponseTimer, ToolOutcome
from .protocol.errors import ErrorInfo, server_error
from .protocol.request import InputItem, McpApprovalRequestItem, McpApprovalResponseItem
from .tools.builtin import BuiltinTool
from .tools.builtin.mcp import TOOL as MCP
from .tools.session import ToolError, ToolInfo
from .tools.toolbox import Toolbox, tool_json

logger = logging.getLogger("trio_responses.generation")

MAX_REPLACED_HEADERS = 4
"""Headers a turn may have replaced (a tool addressed under ``tool_choice: "none"``)
before the response fails: each replacement costs another engine request."""

CLIENT_ROUTES = ("function", "custom", "tool_search")
"""The calls the client runs: a turn may make several (``parallel_tool_calls``)."""

MAX_CHOICE_TOKENS = 64
"""The most tokens one tool choice (`_choose`) may take."""


@dataclass(frozen=True)
class PromptPlan:
    """How the job's prompt is made; decided when the request is accepted."""

    items: list[InputItem]
    """The whole conversation: previous context, then this request's input."""
    date: str
    tools: PromptTools
    """Built-in tools and the MCP namespaces already known from the conversation."""
    to_list: tuple[str, ...] = ()
    """MCP servers to list first (not listed earlier in the conversation)."""
    approvals: tuple[tuple[McpApprovalResponseItem, McpApprovalRequestItem], ...] = ()
    """Answers to approval requests, with the requests they answer."""


async def generate_response(
    job: Job,
    engine: Engine,
    toolbox: Toolbox,
    plan: PromptPlan,
    *,
    max_model_len: int,
    metrics: Metrics | None = None,
    timer: ResponseTimer | None = None,
) -> None:
    """Produce the job's output until it reaches a terminal state.

    ``metrics`` counts its tool calls; ``timer`` measures its first token and
    the pace of the turn that produced it.
    """
    # A job cancelled while it took its slot (a cancel-shielded step) stops here,
    # before emitting anything more.
    await trio.lowlevel.checkpoint_if_cancelled()
    builder = job.builder
    request = job.request
    queued = builder.status == "queued"
    builder.mark_in_progress()
    if queued:
        logger.info(
            "%s in_progress",
            job.id,
            extra={"response_status": "in_progress", "previous_status": "queued"},
        )
    prompt = job.prompt_tokens
    prompt_tools = plan.tools
    if plan.to_list or plan.approvals:
        namespaces = [*plan.tools.namespaces]
        for label in plan.to_list:
            tools = await _list_tools(job, toolbox, label)
            namespaces.append(
                ToolNamespace(
                    label,
                    toolbox.mcp[label].description,
                    [tool_description(t.name, t.description, t.input_schema) for t in tools],
                )
            )
        results = {
            approval_request.id: await _answer(job, toolbox, response, approval_request, metrics)
            for response, approval_request in plan.approvals
        }
        try:
            # The same conversation was rendered once already: about 4 bytes a token.
            prompt = await offload(
                4 * len(prompt),
                partial(
                    render_request_prompt,
                    request,
                    plan.items,
                    date=plan.date,
                    max_model_len=max_model_len,
                    tools=(prompt_tools := replace(plan.tools, namespaces=namespaces)),
                    approval_results=results,
                ),
                inline=INLINE_TOKENIZED,
            )
        except InvalidRequestError as error:
            job.finish("failed", error=_error(error.message))
            return
    budget = request.max_output_tokens
    tool_calls = 0
    turn = 0
    # tool_choice forces one call per response: approved MCP calls that ran count.
    called = any(response.approve for response, _ in plan.approvals)
    # Client calls made in this turn so far: after one, the model is asked for more.
    client_calls = 0
    while True:
        room = max_model_len - len(prompt)
        max_tokens = room if budget is None else min(budget, room)
        if max_tokens <= 0:
            if client_calls:  # no room to ask for another call: the client acts next
                job.finish("completed")
            else:
                job.finish("incomplete", incomplete_reason="max_output_tokens")
            return
        translator = TurnTranslator(builder, toolbox.route)
        job.begin_turn(translator, prompt_tokens=len(prompt))
        steering = steering_for(request, prompt_tools, forced=not called and tool_calls == 0)
        feed = translator.feed if timer is None else timer.watch(translator.feed)
        gate: NextCallGate | None = None
        if client_calls:
            gate = NextCallGate(feed, lambda recipient: toolbox.route(recipient) in CLIENT_ROUTES)
            feed = gate.feed
        try:
            result = await _generate_turn(
                engine,
                translator,
                steering,
                GenerationRequest(
                    request_id=f"{job.id}-{turn}",
                    tenant=job.owner,
                    prompt_token_ids=prompt,
                    sampling=SamplingSettings(
                        max_tokens=max_tokens,
                        temperature=request.temperature,
                        top_p=request.top_p,
                        presence_penalty=request.presence_penalty,
                        frequency_penalty=request.frequency_penalty,
                        stop_token_ids=stop_tokens(),
                    ),
                ),
                partial(job.log.batched, feed),
            )
        except Declined as declined:  # no more calls: the client acts next
            job.end_turn(prompt_tokens=len(prompt), cached_tokens=0, hidden_tokens=declined.held)
            job.finish("completed")
            return
        except (EngineError, MalformedOutput) as error:
            job.end_turn(prompt_tokens=len(prompt), cached_tokens=0)
            if isinstance(error, EngineError):
                job.finish("failed", error=server_error(str(error), error.code))
            else:
                job.finish("failed", error=_error(f"{error}."))
            return
        # A steered turn's tool choice took output tokens no item shows.
        hidden = max(0, result.output_tokens - len(translator.tokens)) if steering.active else 0
        job.end_turn(
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            hidden_tokens=hidden,
        )
        if timer is not None:
            timer.turn_ended(translator.output_tokens)
        if budget is not None:
            budget -= translator.output_tokens + hidden
        if gate is not None and not gate.accepted:  # stopped before another call
            job.end_turn(
                prompt_tokens=result.prompt_tokens,
                cached_tokens=result.cached_tokens,
                hidden_tokens=gate.held,
            )
            job.finish("completed")
            return
        outcome = translator.finish(result.finish_reason)
        call = outcome.call
        if outcome.kind == "tool_call" and call is not None:
            tool = call.tool
            if tool is None:  # a function call or an approval request
                client = call.kind in CLIENT_ROUTES
                if metrics is not None:
                    if client:
                        metrics.tool_call(call.kind, "client", None)
                    else:
                        metrics.tool_call(MCP.metrics_label, "approval", None)
                client_calls += client
                if client and request.parallel_tool_calls and client_calls < MAX_CALLS_PER_TURN:
                    # Ask for another call before the client acts (`harmony.parallel`).
                    called = True
                    prompt = continuation(prompt, translator.tokens)
                    turn += 1
                    continue
                job.finish("completed")  # the client acts next
                return
            if request.max_tool_calls is not None and tool_calls >= request.max_tool_calls:
                builder.close_item("incomplete")
                job.finish("incomplete", incomplete_reason="max_tool_calls")
                return
            tool_calls += 1
            output = await _run_tool(job, toolbox, call, tool, metrics=metrics)
            prompt = [*prompt, *translator.tokens, *_tool_result_tokens(call, tool, output)]
            turn += 1
            continue
        if outcome.kind in ("final", "tool_call"):
            job.finish("completed")
        elif outcome.kind == "truncated":
            job.finish("incomplete", incomplete_reason="max_output_tokens")
        elif any(item["type"] == "message" for item in builder.output):
            job.finish("completed")
        else:
            job.finish("failed", error=_error("The model stopped before giving an answer."))
        return


async def _generate_turn(
    engine: Engine,
    translator: TurnTranslator,
    steering: Steering,
    request: GenerationRequest,
    sink: TokenSink,
) -> GenerationResult:
    """One turn: one engine request, or several when ``steering`` splits it.

    A steered turn runs its requests one after another, each continuing the
    prompt with the turn's tokens so far (see `harmony.steering`): free
    generation up to a decided header, then the body under a constraint, with
    prefilled headers fed to ``sink`` as if generated. The result counts the
    turn's prompt once as input (cached tokens: the last request's hits, at
    most the prompt); output is every token the translator was fed, prefills
    included, and so are the tokens of a tool choice (`_choose`), though no
    item shows them: with the prefills they count against ``max_tokens``, and a
    header that does not fit ends the turn (``length``) unwritten.

    Raises:
        EngineError: an engine request failed.
        MalformedOutput: the tokens break the harmony format.
    """
    if not steering.active:
        return await engine.generate(request, sink)
    prompt = list(request.prompt_token_ids)
    message = special_tokens().message
    constraint: OutputConstraint | None = None
    phase = 0
    chose = 0  # tokens of tool choices: output, though no item shows them
    replaced = 0
    while True:
        done = translator.tokens
        max_tokens = request.sampling.max_tokens - len(done) - chose
        if max_tokens <= 0:
            return GenerationResult("length", len(prompt), 0, len(done) + chose)
        gate = HeaderGate(steering, sink, in_header=not done or done[-1] != message)
        step = replace(
            request,
            request_id=request.request_id if phase == 0 else f"{request.request_id}.{phase}",
            prompt_token_ids=[*prompt, *done],
            sampling=replace(request.sampling, max_tokens=max_tokens),
            constraint=constraint,
        )
        phase += 1
        try:
            result = await engine.generate(step, gate.feed)
        except Interrupt as interrupt:
            decision = interrupt.decision
            if isinstance(decision, Constrain):
                constraint = (
                    JsonConstraint(decision.schema)
                    if decision.grammar is None
                    else GrammarConstraint(decision.grammar.syntax, decision.grammar.definition)
                )
                if decision.call:
                    steering = steering.satisfied()
                continue
            replaced += 1
            if replaced > MAX_REPLACED_HEADERS:
                raise MalformedOutput(
                    f"The model addressed a tool {MAX_REPLACED_HEADERS} times although "
                    "tool_choice does not allow it"
                ) from None
            # The tokens so far, fed during the interrupted request too.
            so_far = [*prompt, *translator.tokens]
            first = not translator.tokens
            room = request.sampling.max_tokens - len(translator.tokens) - chose
            if not decision.targets:
                header = final_header(first=first)
                if len(header) > room:  # no room for the header: the turn ends here
                    return GenerationResult(
                        "length", len(prompt), 0, len(so_far) - len(prompt) + chose
                    )
                sink(header)
                schema = decision.final_schema
                constraint = JsonConstraint(schema) if schema is not None else None
                continue
            target = decision.targets[0]
            if len(decision.targets) > 1:
                prefix = choice_prefix(first=first)
                if len(prefix) >= room:
                    return GenerationResult(
                        "length", len(prompt), 0, len(so_far) - len(prompt) + chose
                    )
                target, spent = await _choose(
                    engine,
                    replace(step, request_id=f"{step.request_id}.choice"),
                    [*so_far, *prefix],
                    decision.targets,
                    max_tokens=room - len(prefix),
                )
                chose += spent
                room -= spent
                phase += 1
            header = call_header(target, first=first)
            if len(header) > room:
                return GenerationResult("length", len(prompt), 0, len(so_far) - len(prompt) + chose)
            sink(header)
            constraint = (
                JsonConstraint(target.schema or ANY_OBJECT)
                if target.content_type == "json"
                else None
            )
            if target.grammar is not None:
                constraint = GrammarConstraint(target.grammar.syntax, target.grammar.definition)
            steering = steering.satisfied()
            continue
        gate.flush()
        return GenerationResult(
            result.finish_reason,
            len(prompt),
            min(result.cached_tokens, len(prompt)),
            len(translator.tokens) + chose,
        )


async def _choose(
    engine: Engine,
    step: GenerationRequest,
    prompt: list[int],
    targets: tuple[Target, ...],
    *,
    max_tokens: int,
) -> tuple[Target, int]:
    """Let the model choose which of ``targets`` it calls (a choice-constrained request
    continuing ``prompt``, which ends with `choice_prefix`); the target and the number
    of tokens the choice took.

    Raises:
        EngineError: the engine request failed.
    """
    chosen_tokens: list[int] = []
    await engine.generate(
        replace(
            step,
            prompt_token_ids=prompt,
            sampling=replace(step.sampling, max_tokens=min(max_tokens, MAX_CHOICE_TOKENS)),
            constraint=ChoiceConstraint(tuple(target.choice for target in targets)),
        ),
        chosen_tokens.extend,
    )
    return chosen(targets, chosen_tokens), len(chosen_tokens)


async def _list_tools(job: Job, toolbox: Toolbox, label: str) -> list[ToolInfo]:
    """List an MCP server's tools as an ``mcp_list_tools`` item; [] on failure."""
    builder = job.builder
    builder.open_mcp_list_tools(label)
    try:
        tools = await toolbox.list_tools(label)
    except ToolError as error:
        builder.finish_mcp_list_tools(None, error=str(error))
        return []
    builder.finish_mcp_list_tools([tool_json(tool) for tool in tools])
    return tools


async def _answer(
    job: Job,
    toolbox: Toolbox,
    response: McpApprovalResponseItem,
    approval_request: McpApprovalRequestItem,
    metrics: Metrics | None,
) -> str:
    """Run an approved call as an ``mcp_call`` item, or report it declined."""
    if not response.approve:
        if metrics is not None:
            metrics.tool_call(MCP.metrics_label, "declined", None)
        return DECLINED
    builder = job.builder
    recipient = f"{approval_request.server_label}.{approval_request.name}"
    builder.open_tool_call(MCP.item, recipient)
    builder.delta(approval_request.arguments)
    builder.end_tool_input()
    call = ToolCall("builtin", recipient, approval_request.arguments, builder.open_item_id, MCP)
    return await _run_tool(
        job, toolbox, call, MCP, approval_request_id=approval_request.id, metrics=metrics
    )


async def _run_tool(
    job: Job,
    toolbox: Toolbox,
    call: ToolCall,
    tool: BuiltinTool,
    *,
    approval_request_id: str | None = None,
    metrics: Metrics | None = None,
) -> str:
    """Run the call of ``tool``, finish its item, and return the text the model reads next."""
    error: dict[str, object] | None = None
    outcome: ToolOutcome = "ok"
    started = time.perf_counter()
    outputs: tuple[dict[str, Any], ...] = ()
    try:
        result = await toolbox.call(call)
        text, ok, outputs = result.text, not result.is_error, result.outputs
        for annotation, needles in result.citations:
            job.builder.cite(annotation, *needles)
        if not ok:
            outcome = "error"
    except ToolError as failure:
        text, ok = str(failure), False
        outcome = "timeout" if failure.code == REQUEST_TIMEOUT else "failed"
        error = {"type": "mcp_protocol_error", "code": failure.code, "message": text}
    kind = tool.metrics_label
    if metrics is not None:
        metrics.tool_call(kind, outcome, time.perf_counter() - started)
    job.builder.finish_tool_call(
        text,
        ok=ok,
        error=error,
        approval_request_id=approval_request_id,
        extra_outputs=outputs,
    )
    if not ok:
        # What the tool said may quote the conversation: only at debug level.
        logger.info(
            "%s: %s tool call to %s failed (%s)",
            job.id,
            kind,
            call.recipient,
            outcome,
            extra={"tool_kind": kind, "outcome": outcome},
        )
        logger.debug("%s: the tool said: %s", job.id, text[:200])
    return text


def _tool_result_tokens(call: ToolCall, tool: BuiltinTool, output: str) -> list[int]:
    return render_tool_result(call.recipient, output, channel=tool.harmony.channel)


def _error(message: str) -> ErrorInfo:
    return server_error(message)
