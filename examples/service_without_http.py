"""Use the response service directly, without HTTP.

    python examples/service_without_http.py

`open_responses_service` gives the same engine, jobs and event logs as the
server; events arrive as the dicts the HTTP stream would carry.
"""

from __future__ import annotations

import trio

from trio_responses import Config, open_responses_service


async def main() -> None:
    async with open_responses_service(Config()) as service:
        handle = await service.create({"model": "gpt-oss-scripted", "input": "tokens:12"})
        with handle.subscribe() as events:
            async for event in events:
                if event["type"] == "response.output_text.delta":
                    print(event["delta"], end="", flush=True)
        print()
        response = await handle.wait()
        print(response["status"], response["usage"]["output_tokens"], "output tokens")


if __name__ == "__main__":
    trio.run(main)
