"""`first_record_bound`: what a response's first record may take, from its request's size.

The job admits a stored response without measuring its first record when the
bound fits the owner's share of the store, so the bound must never be below the
record's bytes, whatever the request holds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import MODEL
from trio_responses import Config, open_responses_service
from trio_responses._prepare import PreparedRequest
from trio_responses.background.event_log import EventLog
from trio_responses.background.job import Job
from trio_responses.protocol.builder import request_echo
from trio_responses.store.base import StoredResponse, first_record_bound, record_bytes

_SCHEMA_OF_FLOATS = {
    "type": "object",
    "properties": {"x": {"type": "number", "enum": [9e15] * 2000}},
}

REQUESTS: dict[str, dict[str, Any]] = {
    "a word": {"input": "hi"},
    "many tiny items": {"input": [{"role": "user", "content": ""} for _ in range(2000)]},
    "control characters": {"input": "\x01\x02\x1f" * 3000},
    "characters outside the BMP": {"input": "\U0001f600" * 5000, "instructions": "é" * 3000},
    "tools whose schema has long floats": {
        "input": "tokens:1",
        "tools": [
            {"type": "function", "name": f"f{n}", "parameters": _SCHEMA_OF_FLOATS} for n in range(8)
        ],
    },
    "function outputs": {
        "input": [
            {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"}
            for n in range(300)
        ]
        + [{"type": "function_call_output", "call_id": f"c{n}", "output": ""} for n in range(300)]
    },
    "metadata and a schema": {
        "input": "tokens:1",
        "metadata": {f"k{n}": "v" * 500 for n in range(16)},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": _SCHEMA_OF_FLOATS}},
    },
}


def compact(body: dict[str, Any]) -> bytes:
    """``body`` as a client may send it at its smallest (UTF-8 as is, short floats)."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return text.replace(str(9e15), "9e15").encode()


def first_record_size(prepared: PreparedRequest) -> int:
    """The bytes of the record the job stores first, built as the job builds it."""
    job = Job(
        response_id="resp_bound",
        request=prepared.request,
        model=MODEL,
        prompt_tokens=prepared.prompt_tokens,
        input_items=prepared.input_items,
        owner=None,
        created_at=0,
        echo=request_echo(prepared.request),
        log=EventLog(max_events=16, max_bytes=1 << 20),
    )
    return record_bytes(StoredResponse(job.snapshot(), job.input_items, None))


@pytest.mark.parametrize("sized_by", ["body", "estimate"])
@pytest.mark.parametrize("name", REQUESTS)
async def test_the_bound_holds_the_first_record(name: str, sized_by: str) -> None:
    body = {"model": MODEL, **REQUESTS[name]}
    raw = compact(body)
    async with open_responses_service(Config(max_model_len=10_000_000)) as service:
        # Over HTTP the body's bytes size the request; elsewhere, `estimated_size`.
        size = len(raw) if sized_by == "body" else None
        prepared = await service.prepare(body, size=size)
    if prepared.request_bytes is None:  # too large to count in full: it is measured
        assert sized_by == "estimate"
        return
    size = first_record_size(prepared)
    bound = first_record_bound(prepared.request_bytes, len(prepared.input_items))
    assert size <= bound


async def test_referenced_items_are_sized_as_resolved() -> None:
    async with open_responses_service(Config()) as service:
        first = await service.create({"model": MODEL, "input": "x" * 20_000})
        await service.wait(first.id)
        items = await service.list_input_items(first.id)
        reference = {"type": "item_reference", "id": items["data"][0]["id"]}
        prepared = await service.prepare({"model": MODEL, "input": [reference] * 3})
    assert prepared.request_bytes is not None
    assert prepared.request_bytes > 3 * 20_000  # the items, not the references
    assert first_record_size(prepared) <= first_record_bound(
        prepared.request_bytes, len(prepared.input_items)
    )
