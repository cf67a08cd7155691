"""Faults, and the exceptions that must pass: where a job or a request ends.

Each job, each HTTP request and each WebSocket session is a boundary: its
failure ends it and nothing else. Most failures are `Exception`\\ s, but native
code raises others: pyo3 turns a panic in Rust (the tokenizer's, say) into
``PanicException``, a direct subclass of `BaseException`, which an ``except
Exception`` lets through to the server's nursery, and the process ends. Only
cancellation (`trio.Cancelled`), the process's own shutdown
(`KeyboardInterrupt`, `SystemExit`) and `GeneratorExit` must pass a boundary;
anything else is a fault of the one job or request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio

PASSING: tuple[type[BaseException], ...] = (
    trio.Cancelled,
    KeyboardInterrupt,
    SystemExit,
    GeneratorExit,
)
"""What a boundary lets through."""


class InternalFault(Exception):
    """A fault that is no `Exception` (a panic in native code), carried as one to a
    handler that catches `Exception`\\ s; the fault itself is its ``__cause__``."""


def split_faults(error: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """``error`` as (what must pass the boundary, the fault), either possibly None;
    an exception group is split by its members."""
    if isinstance(error, BaseExceptionGroup):
        return error.split(PASSING)
    if isinstance(error, PASSING):
        return error, None
    return None, error


@contextmanager
def faults_handled(handle: Callable[[BaseException], None]) -> Iterator[None]:
    """A boundary: ``handle(fault)`` for the fault part of what the body raises (a
    `BaseException` from native code included); what must pass (`PASSING`) is
    raised on, the rest is not. ``handle`` may raise to refuse the fault after all."""
    try:
        yield
    except BaseException as error:
        passing, fault = split_faults(error)
        if fault is not None:
            handle(fault)
        if passing is error:
            raise
        if passing is not None:
            raise passing from None


@contextmanager
def faults_as_exceptions() -> Iterator[None]:
    """Let the ``except Exception`` around this see every fault.

    A `BaseException` raised inside that must not pass (see `PASSING`) is raised
    as an `InternalFault`; one that holds both (a group) raises what must pass,
    the fault noted on it.
    """
    try:
        yield
    except Exception:
        raise
    except BaseException as error:
        passing, fault = split_faults(error)
        if fault is None:
            raise
        if passing is not None:
            passing.add_note(f"while handling a fault: {fault!r}")
            raise passing from fault
        raise InternalFault(f"{type(fault).__name__}: {fault}") from fault
