"""Limits per API key, shared by the parts that keep them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class PerKey:
    """At most `limit` calls of one key in flight at once; the rest wait their turn (within
    their operation's time), so that one key cannot take what all share: the store's
    connections (design.md 9.8), the MCP servers' calls (14.7). Calls of no key (without API
    keys, every request's) are not counted."""

    def __init__(self, limit: int | None) -> None:
        self._limit = limit
        self._slots: dict[str, tuple[asyncio.Semaphore, int]] = {}  # a key's, and its calls in flight

    @contextlib.asynccontextmanager
    async def slot(self, owner: str | None) -> AsyncIterator[None]:
        if not owner or self._limit is None:
            yield
            return
        semaphore, calls = self._slots.get(owner) or (asyncio.Semaphore(self._limit), 0)
        self._slots[owner] = (semaphore, calls + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, calls = self._slots[owner]
            if calls == 1:
                del self._slots[owner]
            else:
                self._slots[owner] = (semaphore, calls - 1)
