"""The hold that lets one writer at a time change a conversation (design.md 9.7): a lease its
holder renews while it writes, taken by the conversation's owner alone."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import orjson

from ..errors import Conflict, NotFound, StoreUnavailable
from ..responses.lifecycle import new_id
from ..store import ResponseStore


class Held:
    """A conversation its holder may write to, until `release`. The hold is a lease
    (`store.conversation_lease`) renewed every third of it while held, so that one whose process
    died lets its conversation go within a lease (design.md 9.7)."""

    def __init__(self, store: ResponseStore, id: str, owner: str, holder: str, lease: float) -> None:
        self._store, self.id, self._owner, self._holder, self._lease = store, id, owner, holder, lease
        self._renewing = asyncio.create_task(self._renew())
        self._released = False

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            with contextlib.suppress(StoreUnavailable):  # counted and logged; it may yet be renewed in time
                await self._store.hold(self.id, self._owner, self._holder, self._lease)

    async def append(self, items: list[dict[str, Any]]) -> None:
        """Add items to the conversation as it is now; taken again if the hold ran out."""
        if not await self._store.hold(self.id, self._owner, self._holder, self._lease):
            raise Conflict(f"The conversation '{self.id}' is held by another writer.", param="conversation")
        found = await self._store.conversation(self.id, self._owner)
        if found is None:
            raise NotFound(f"No conversation with id '{self.id}'.", param="conversation")
        added = [msgspec.Raw(orjson.dumps(item)) for item in items]
        await self._store.keep_conversation(msgspec.structs.replace(found, items=[*found.items, *added]))

    async def release(self) -> None:
        if not self._released:
            self._released = True
            self._renewing.cancel()
            # A renewal in flight, landing after the let-go, would take the hold again.
            await asyncio.gather(self._renewing, return_exceptions=True)
            with contextlib.suppress(Exception):  # a store down: the hold runs out on its own
                await self._store.let_go(self.id, self._holder)


async def hold(store: ResponseStore, id: str, owner: str, lease: float) -> Held:
    """The conversation held for `owner`: a 409 while another writer has it, a 404 for none of
    the key's. Only its owner can hold it: another key's attempt takes nothing (9.5)."""
    holder = new_id("hold")
    if not await store.hold(id, owner, holder, lease):
        if await store.conversation(id, owner) is None:
            raise NotFound(f"No conversation with id '{id}'.", param="conversation_id")
        raise Conflict(
            f"The conversation '{id}' is being written to (a response on it is in progress); try again when it ends.",
            param="conversation",
        )
    return Held(store, id, owner, holder, lease)
