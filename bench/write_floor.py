"""The kernel's share of a streamed token: one small write to a loopback TCP socket.

    python bench/write_floor.py [STREAMS ...]   (default: 64 256)

No server, no HTTP: this process accepts STREAMS loopback TCP connections from a
child process, then, like `cpu_per_token.py stepped`, writes one 250-byte chunk
(the size of a text delta's SSE frame in its HTTP/1.1 chunk) to every connection
per step, with the steps paced at 2,000 writes/s in all; the child reads every
connection (one ``select`` loop). It prints this process's CPU (user + system,
``getrusage``; the split between the two is sampled at the clock tick, the sum is
not) per write: what any server pays per event on this box for the write and waking
the reader, whatever it does in Python around it.
"""

from __future__ import annotations

import os
import resource
import selectors
import socket
import sys
import time
import traceback

RATE = 2000.0
STEPS = 60
FRAME = b"%x\r\n%s\r\n" % (243, b"x" * 243)


def read_all(port: int, count: int) -> None:
    """The child: open ``count`` connections and read them until each ends."""
    selector = selectors.DefaultSelector()
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", port))
        connection.setblocking(False)
        selector.register(connection, selectors.EVENT_READ)
    while selector.get_map():
        for key, _ in selector.select():
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            if not sock.recv(1 << 16):
                selector.unregister(sock)
                sock.close()


def measure(count: int) -> str:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(count)
        port = listener.getsockname()[1]
        child = os.fork()
        if child == 0:  # never back into the parent's code, even on an error
            try:
                read_all(port, count)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        connections = [listener.accept()[0] for _ in range(count)]
    for connection in connections:  # as the server's sockets are
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fds = [connection.fileno() for connection in connections]
    pace = count / RATE
    before = resource.getrusage(resource.RUSAGE_SELF)
    next_step = time.monotonic()
    for _ in range(STEPS):
        for fd in fds:
            os.write(fd, FRAME)
        next_step += pace
        time.sleep(max(0.0, next_step - time.monotonic()))
    after = resource.getrusage(resource.RUSAGE_SELF)
    for connection in connections:
        connection.close()
    os.waitpid(child, 0)
    writes = count * STEPS
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return f"{count:>4} streams  {writes} writes  CPU per write {cpu / writes * 1e6:.1f} µs"


def main(argv: list[str]) -> None:
    for count in [int(arg) for arg in argv] or [64, 256]:
        print(measure(count), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
