"""The service without HTTP (the embedding API)."""

from __future__ import annotations

import pytest
import trio

from tests.support import MODEL, check_stream
from trio_responses import Config, NotFoundError, open_responses_service


async def test_create_subscribe_wait_retrieve() -> None:
    async with open_responses_service(Config()) as service:
        job = await service.create({"model": MODEL, "input": "embedded"})
        events = [event async for event in service.subscribe(job.id)]
        check_stream(events)
        response = await service.wait(job.id)
        assert response["status"] == "completed"
        assert response["output"][1]["content"][0]["text"] == "You said: embedded"
        assert (await service.retrieve(job.id))["id"] == job.id
        with pytest.raises(NotFoundError):
            await service.retrieve("resp_missing")


async def test_closing_the_service_ends_running_jobs() -> None:
    async with open_responses_service(Config()) as service:
        job = await service.create({"model": MODEL, "input": "tokens:1000 delay:10"})
        subscription = service.subscribe(job.id)
        assert await subscription.receive_frames()
    with trio.fail_after(5):
        await job.done.wait()
    assert job.status == "failed"
    assert job.snapshot()["error"]["code"] == "server_shutdown"
    assert job.log.closed
