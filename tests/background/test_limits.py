"""Stores and retained logs stay within their limits; expired logs say so."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tests.conftest import StartServer
from tests.support import MODEL
from trio_responses import Config, open_responses_service
from trio_responses.store.memory import MemoryStore

RESPONSES = 10_000


@pytest.mark.slow
async def test_ten_thousand_background_responses_stay_bounded() -> None:
    config = Config(
        max_stored_responses=800,
        max_retained_streams=300,
        retained_stream_bytes=1_000_000,
        max_queued_jobs=RESPONSES,
    )
    async with open_responses_service(config) as service:
        store = service.state.store
        assert isinstance(store, MemoryStore)
        peak_stored = peak_streams = peak_bytes = 0
        ids: list[str] = []
        for batch in range(RESPONSES // 500):
            jobs = [
                await service.create({"model": MODEL, "input": f"n{batch}-{i}", "background": True})
                for i in range(500)
            ]
            ids.extend(job.id for job in jobs)
            for job in jobs:
                await job.wait_closed()
            stats = service.statistics()
            peak_stored = max(peak_stored, len(store))
            peak_streams = max(peak_streams, stats.retained_streams)
            peak_bytes = max(peak_bytes, stats.retained_stream_bytes)
        assert peak_stored <= 800 and len(store) == 800
        assert peak_streams <= 300
        assert peak_bytes <= 1_000_000
        stats = service.statistics()
        assert stats.running_jobs == 0 and stats.job_tasks == 0
        # The newest are all there; the oldest were evicted, log and record.
        assert (await service.retrieve(ids[-1]))["status"] == "completed"
        assert service.running(ids[0]) is None and await store.get(ids[0], owner=None) is None


async def test_expired_stream_is_a_400_and_the_record_stays(
    start_server: StartServer, autojump_clock: trio.testing.MockClock
) -> None:
    server = await start_server(stream_retention_s=60)
    created = await server.client.responses.create(model=MODEL, input="hi", background=True)
    await server.service.wait(created.id)
    fresh = await server.http.get(f"/v1/responses/{created.id}?stream=true")
    assert fresh.status_code == 200
    await trio.sleep(61)
    expired = await server.http.get(f"/v1/responses/{created.id}?stream=true")
    assert expired.status_code == 400
    error = expired.json()["error"]
    assert error["code"] == "stream_expired" and error["param"] == "stream"
    assert "60 s" in error["message"]
    assert (await server.client.responses.retrieve(created.id)).status == "completed"
    assert server.service.statistics().retained_streams == 0


async def test_stored_responses_expire_after_their_ttl(
    start_server: StartServer, autojump_clock: trio.testing.MockClock
) -> None:
    server = await start_server(store_ttl_s=3600)
    response = await server.client.responses.create(model=MODEL, input="short-lived")
    assert (await server.http.get(f"/v1/responses/{response.id}")).status_code == 200
    await trio.sleep(3601)
    assert (await server.http.get(f"/v1/responses/{response.id}")).status_code == 404
