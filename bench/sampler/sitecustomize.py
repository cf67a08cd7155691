"""A CPU-time sampler for the server, loaded by Python at start-up from ``PYTHONPATH``.

    PYTHONPATH=bench/sampler SAMPLER=/tmp/prof/run SAMPLER_DELAY=40 \\
        .venv-vllm/bin/python bench/vllm_compare.py 8
    python bench/profile_summary.py /tmp/prof/run.PID

Only the server samples itself (``trio_responses serve``, or the paced server of
`cpu_per_token.py`); the benchmarks' clients and vLLM's processes inherit the
environment and do nothing. After ``SAMPLER_DELAY``
seconds (past the start-up), a ``SIGPROF`` timer fires every 2 ms of the process's CPU
time; the handler counts the stack of the frame it interrupted. The counts go to
``$SAMPLER.PID`` in py-spy's raw format every 5 s and at exit. py-spy's
non-blocking GIL sampling got a few dozen samples from a second of server CPU here;
this gets hundreds, with the same caveat as any sampler in the process: each sample
costs the process a little (the figures of a sampled run are higher).
"""

from __future__ import annotations

import atexit
import collections
import os
import signal
import threading
import time
from types import FrameType

INTERVAL_S = 0.002


def _command_line() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stack(frame: FrameType | None) -> str:
    frames: list[str] = []
    while frame is not None:
        code = frame.f_code
        frames.append(f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
        frame = frame.f_back
    return ";".join(reversed(frames))


def _install(path: str) -> None:
    counts: collections.Counter[str] = collections.Counter()

    def sample(signum: int, frame: FrameType | None) -> None:
        counts[_stack(frame)] += 1

    def dump() -> None:
        with open(f"{path}.{os.getpid()}", "w") as out:
            out.writelines(f"{stack} {count}\n" for stack, count in list(counts.items()))

    def start() -> None:
        time.sleep(float(os.environ.get("SAMPLER_DELAY", "0")))
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)
        while True:
            time.sleep(5)
            dump()

    signal.signal(signal.SIGPROF, sample)
    atexit.register(dump)
    threading.Thread(target=start, name="sampler", daemon=True).start()


SERVERS = ("trio_responses serve", "_paced_server.py")

if os.environ.get("SAMPLER") and any(server in _command_line() for server in SERVERS):
    _install(os.environ["SAMPLER"])
