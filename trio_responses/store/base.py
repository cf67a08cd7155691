"""The `ResponseStore` protocol: where finished (and, for durable stores, running) responses live.

A record holds what retrieve, ``input_items`` and ``previous_response_id``
need: the Response object, this request's input items, the context that came
before them, and the key that owns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class StoredResponse:
    response: dict[str, Any]
    """The Response object (terminal once the job has finished)."""
    input_items: list[dict[str, Any]]
    """This request's input items, each with an ``id``."""
    context: list[dict[str, Any]]
    """Items before this request's input (from ``previous_response_id``)."""
    owner: str | None
    """Digest of the API key that created it (None without auth)."""

    @property
    def id(self) -> str:
        response_id: str = self.response["id"]
        return response_id

    @property
    def status(self) -> str:
        status: str = self.response["status"]
        return status

    def conversation(self) -> list[dict[str, Any]]:
        """Context for a follow-up: everything before, this input, this output."""
        return [*self.context, *self.input_items, *self.response["output"]]


class ResponseStore(Protocol):
    async def put(self, record: StoredResponse) -> None:
        """Insert or replace the record with ``record.id``."""
        ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The record, or None if unknown, deleted or expired."""
        ...

    async def delete(self, response_id: str) -> bool:
        """Remove a record; False if there was none."""
        ...

    async def aclose(self) -> None:
        """Release connections and files."""
        ...
