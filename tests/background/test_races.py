"""1,000 randomized cancel/complete races, in-process (the service without HTTP)."""

from __future__ import annotations

import random

import trio

from tests.support import MODEL
from trio_responses import Config, InvalidRequestError, open_responses_service
from trio_responses._service import ResponsesService

RACES = 1_000


async def _race(service: ResponsesService, rng: random.Random, outcomes: list[str]) -> None:
    tokens = rng.randint(1, 25)
    delay = rng.choice([0, 1, 2])
    job = await service.create(
        {"model": MODEL, "input": f"tokens:{tokens} delay:{delay}", "background": True}
    )
    seen: list[str] = []

    async def read() -> None:
        with await service.subscribe(job.id) as subscription:
            events = [event async for event in subscription]
        terminal = events[-1]
        assert terminal["type"] in ("response.completed", "response.failed")
        seen.append(terminal["response"]["status"])

    # The cancel lands after the canceller has seen `after` events of the
    # stream (counted, not timed, so the mix of outcomes does not depend on how
    # fast the machine is); past the last event it meets a completed response.
    after = rng.randint(0, tokens + 12)

    async def cancel() -> None:
        if after:
            with await service.subscribe(job.id) as subscription:
                seen_events = 0
                async for _ in subscription:
                    seen_events += 1
                    if seen_events == after:
                        break
        try:
            result = await service.cancel(job.id)
            assert result["status"] == "cancelled"
        except InvalidRequestError as error:
            assert error.message == "Cannot cancel a completed response."

    async with trio.open_nursery() as nursery:
        for _ in range(rng.randint(1, 3)):
            nursery.start_soon(read)
        nursery.start_soon(cancel)
    await job.wait_closed()
    stored = await service.retrieve(job.id)
    assert stored["status"] in ("completed", "cancelled")
    assert set(seen) == {stored["status"]}, (seen, stored["status"])
    outcomes.append(stored["status"])


async def test_cancel_and_completion_never_disagree() -> None:
    rng = random.Random(20261130)
    outcomes: list[str] = []
    config = Config(max_active_jobs=64, max_queued_jobs=RACES)
    async with open_responses_service(config) as service:
        limiter = trio.CapacityLimiter(100)

        async def one() -> None:
            async with limiter:
                await _race(service, rng, outcomes)

        async with trio.open_nursery() as nursery:
            for _ in range(RACES):
                nursery.start_soon(one)

        stats = service.statistics()
        assert stats.running_jobs == 0
        assert stats.job_tasks == 0
        assert stats.subscribers == 0
        assert service.engine.running_requests == frozenset()  # type: ignore[attr-defined]
    assert len(outcomes) == RACES
    # Both sides of the race happened, many times.
    assert outcomes.count("cancelled") > 50 and outcomes.count("completed") > 50
