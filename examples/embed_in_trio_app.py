"""Run the whole trio-responses server inside your own Trio application.

    python examples/embed_in_trio_app.py

The server is one task in your nursery: start it with ``nursery.start`` (which
returns once it listens, with the bound URLs). Stop it gracefully with its
``shutdown_trigger`` (running responses get ``shutdown_grace_s`` to finish, as on
SIGTERM), or at once by cancelling.
"""

from __future__ import annotations

from functools import partial

import trio
from openai import AsyncOpenAI

from trio_responses import Config, serve


async def main() -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(serve, Config(port=0), shutdown_trigger=stop.wait))
        print(f"server listening on {urls[0]}")

        client = AsyncOpenAI(base_url=f"{urls[0]}/v1", api_key="unused")
        response = await client.responses.create(
            model="gpt-oss-scripted", input="hello from my trio app"
        )
        print(response.output_text)
        await client.close()

        stop.set()  # graceful: serve() returns once every response has ended
    print("server stopped")


if __name__ == "__main__":
    trio.run(main)
