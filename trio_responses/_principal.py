"""Who asks, and what it may see: the one ownership check.

A `Principal` is the caller of a query or change of a response: the owner tag of
the API key it presented (None on a server without API keys) and whether it asks
as an operator (``admin``: the dashboard, with an admin key). The service builds
one at its boundary and asks it (`Principal.may_see`) about a job running here;
the stores find things by (owner, id) (`store.base.Key`), so a lookup as one
owner never finds another's.

Pure: imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

OPERATOR = "operator"
"""The owner of the operator's webhook endpoint (``--webhook``), which hears every
owner's events. (Owners are API key digests, hex, or None: never this.)"""


@final
@dataclass(frozen=True, slots=True)
class Principal:
    """One caller (see the module docstring)."""

    owner: str | None = None
    """The digest of its API key (`api.common.owner_of`); None without API keys."""
    admin: bool = False
    """An operator: sees the responses of every owner that run or recently finished
    in this process (not the stores' others: it has no key to find them by)."""

    def may_see(self, owner: str | None) -> bool:
        """Whether this caller may see (retrieve, follow, cancel, delete, continue)
        what ``owner`` owns."""
        return self.admin or owner == self.owner

    @property
    def operator(self) -> bool:
        """Whether this is the operator's webhook endpoint's owner (`OPERATOR`)."""
        return self.owner == OPERATOR

    def hears(self, owner: str | None) -> bool:
        """Whether this owner's webhook endpoints receive the events of ``owner``'s
        responses: its own; every owner's for the operator's."""
        return self.operator or owner == self.owner
