"""The producer's side of a streamed token, in this process: no server, no socket.

    python bench/token_path.py [STREAMS ...]   (default: 1 256 2048)

For each count, builds that many streams, each as the server has it while a
message is open (a `TurnTranslator` over a `ResponseBuilder` that appends to an
`EventLog`), then feeds them one text token each in turn, round after round, as
an engine step does (``EventLog.batched``, as `_generation.py` calls it). Prints
the CPU per token (``time.process_time``). Nothing reads the logs: this is the
harmony parser, the event's frame and the log's append alone. With one stream
everything stays in the processor's caches; with thousands, each stream's
objects have left them by its next token, as in a server where the kernel's
socket path and every other stream run in between.
"""

from __future__ import annotations

import sys
import time

from trio_responses.background.event_log import EventLog
from trio_responses.harmony.encoding import get_encoding
from trio_responses.harmony.translator import TurnTranslator
from trio_responses.protocol.builder import ResponseBuilder, request_echo
from trio_responses.protocol.request import parse_create_request

TOKENS = 200_000
"""Tokens fed per count (at least 60 to each stream)."""


def open_stream(message_start: list[int]) -> tuple[TurnTranslator, EventLog]:
    log = EventLog(max_events=1 << 30, max_bytes=1 << 40)  # keeps every frame: no trimming
    builder = ResponseBuilder(
        response_id="resp_bench",
        model="bench",
        created_at=0,
        echo=request_echo(parse_create_request({"model": "bench"})),
        background=False,
        emit=log.append,
    )
    builder.start()
    builder.mark_in_progress()
    translator = TurnTranslator(builder)
    translator.feed(message_start)
    return translator, log


def measure(count: int) -> str:
    encoding = get_encoding()
    message_start = encoding.encode("<|channel|>final<|message|>", allowed_special="all")
    token = (encoding.encode(" hello")[0],)
    streams = [open_stream(message_start) for _ in range(count)]
    rounds = max(60, TOKENS // count)
    before = time.process_time()
    for _ in range(rounds):
        for translator, log in streams:
            log.batched(translator.feed, token)
    tokens = rounds * count
    cpu = time.process_time() - before
    return f"{count:>5} streams  {tokens} tokens  {cpu / tokens * 1e6:.2f} µs per token"


def main(argv: list[str]) -> None:
    for count in [int(arg) for arg in argv] or [1, 256, 2048]:
        print(measure(count), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
