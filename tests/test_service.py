"""The service without HTTP (the embedding API)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import trio
import trio.testing

from tests.redis_server import RedisServer
from tests.support import MODEL, check_stream
from trio_responses import Config, NotFoundError, ShuttingDownError, open_responses_service
from trio_responses.store.base import StoredResponse


async def test_create_subscribe_wait_retrieve() -> None:
    async with open_responses_service(Config()) as service:
        job = await service.create({"model": MODEL, "input": "embedded"})
        events = [event async for event in await service.subscribe(job.id)]
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
        subscription = job.subscribe()
        assert await subscription.receive_frames()
    with trio.fail_after(5):
        await job.wait_closed()
    assert job.status == "failed"
    assert job.response["error"]["code"] == "server_shutdown"
    events = [event async for event in subscription]
    assert events[-1]["type"] == "response.failed"


async def test_shutdown_gives_grace_then_ends_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_responses_service(Config(shutdown_grace_s=5)) as service:
        quick = await service.create(
            {"model": MODEL, "input": "tokens:20 delay:100", "background": True}
        )
        slow = await service.create(
            {"model": MODEL, "input": "tokens:1000 delay:100", "background": True}
        )
        subscription = await service.subscribe(slow.id)
        started = trio.current_time()
        await service.shutdown(5)
        assert trio.current_time() - started == pytest.approx(5, abs=0.5)
        with pytest.raises(ShuttingDownError):
            await service.create({"model": MODEL, "input": "too late"})
        assert (await service.retrieve(quick.id))["status"] == "completed"
        stored = await service.retrieve(slow.id)
        assert stored["status"] == "failed"
        assert stored["error"]["code"] == "server_shutdown"
        events = [event async for event in subscription]
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "server_shutdown"
        stats = service.statistics()
        assert stats.running_jobs == 0 and stats.job_tasks == 0


async def test_closing_is_not_held_by_retries_of_unrecorded_jobs(
    autojump_clock: trio.testing.MockClock, tmp_path: pathlib.Path
) -> None:
    config = Config(store_url=f"sqlite:///{tmp_path / 'responses.db'}", cleanup_timeout_s=1)
    async with open_responses_service(config) as service:
        store = service.state.store
        put = store.put

        async def hung_final_put(record: StoredResponse) -> None:
            if record.response["status"] in ("completed", "failed", "incomplete", "cancelled"):
                await trio.sleep_forever()  # the store stopped answering
            await put(record)

        store.put = hung_final_put  # type: ignore[method-assign]
        for index in range(60):
            handle = await service.create({"model": MODEL, "input": f"number {index}"})
            await handle.wait()
        assert service.statistics().unrecorded_jobs == 60
        await trio.sleep(40)  # maintenance is retrying them: about a second each
        closing = trio.current_time()
    # A retry is no cleanup: closing cancels it (it took a second per job, shielded).
    assert trio.current_time() - closing < 5


async def test_a_cancel_on_another_replica_waits_on_the_log_not_by_polling(
    redis: RedisServer,
) -> None:
    redis.flush()
    config = Config(store_url=redis.url)
    async with open_responses_service(config) as a, open_responses_service(config) as b:
        job = await a.create({"model": MODEL, "input": "tokens:5000 delay:5", "background": True})
        subscription = job.subscribe()
        assert await subscription.receive_frames()  # generating
        put = a.state.store.put

        async def slow_final_put(record: StoredResponse) -> None:
            if record.response["status"] == "cancelled":
                await trio.sleep(0.5)  # a slow store: polling would have read it many times
            await put(record)

        a.state.store.put = slow_final_put  # type: ignore[method-assign]
        reads = 0
        get = b.state.store.get

        async def counted_get(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await get(*args, **kwargs)

        b.state.store.get = counted_get  # type: ignore[method-assign]
        with trio.fail_after(5):
            cancelled = await b.cancel(job.id)
        assert cancelled["status"] == "cancelled"
        assert reads <= 2  # before the cancel, and once its terminal event was logged
        assert (await a.retrieve(job.id))["status"] == "cancelled"
