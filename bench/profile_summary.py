"""Where the CPU goes, from collapsed stacks (``py-spy record --format raw``, or
`bench/sampler`).

    python bench/profile_summary.py RAW_FILE [TOP]

Samples taken while the server starts (imports, loading the vocabulary, any
worker thread) are dropped. Prints the share of the rest per layer (a sample
counts for the layer of its innermost frame that matches a layer's pattern:
time in the standard library or a C call is charged to the code that called
it), then the TOP functions by self time and by inclusive time.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

# (category, pattern on a frame "function (path:line)"), first match wins.
CATEGORIES: list[tuple[str, str]] = [
    ("engine: scripted per-token loop", r"engine/scripted\.py"),
    ("harmony parser / token decode", r"harmony/|openai_harmony"),
    ("event builder / translation", r"protocol/|_generation\.py|background/|_runner\.py"),
    ("paced-server wrapper (bench only)", r"_paced_server\.py"),
    ("SSE encoding / stream reader", r"api/sse\.py|api/asgi\.py|api/app\.py"),
    ("metrics / logging", r"metrics\.py|_logging\.py|logging/"),
    ("quart/ASGI response send", r"quart/"),
    ("hypercorn HTTP/1.1 + h11", r"hypercorn/|h11/"),
    ("our vLLM engine (output reader, dispatch)", r"engine/vllm(_outputs)?\.py"),
    ("vLLM's AsyncLLM (output processor, ZMQ)", r"site-packages/vllm/|zmq/|msgspec"),
    ("trio-asyncio / asyncio loop", r"trio_asyncio/|asyncio/"),
    ("trio I/O + scheduler", r"trio/"),
]


STARTUP = r"<frozen importlib|_thread_cache\.py|load_harmony_encoding|threading\.py"


def _layer(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in CATEGORIES:
            if re.search(pattern, frame):
                return name
    return "other"


def main(path: str, top: int) -> None:
    total = 0
    categories: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    with open(path) as raw:
        lines = raw.readlines()
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        if any(re.search(STARTUP, frame) for frame in frames):
            continue
        total += count
        self_time[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
        categories[_layer(frames)] += count
    print(f"{total} samples")
    for name, count in categories.most_common():
        print(f"  {count / total:6.1%}  {name}")
    print(f"top {top} by self time:")
    for frame, count in self_time.most_common(top):
        print(f"  {count / total:6.1%}  {frame}")
    print(f"top {top} by inclusive time:")
    for frame, count in inclusive.most_common(top * 2):
        print(f"  {count / total:6.1%}  {frame}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
