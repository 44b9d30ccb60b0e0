"""Stored responses (design.md 9): one interface, two backends. SQLite (a file, the embedded
default) and Redis (shared by every replica of a gateway).

`ResponseStore` wraps a backend with what every backend needs alike: a time limit on each
operation, failures counted and logged, and the health `/ready` shows. A failed write never
fails the answer being generated (design.md 9.2); a failed read fails only the request that
needed it, with a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec

from ..errors import StoreUnavailable

log = logging.getLogger("proxy.store")
T = TypeVar("T")


class StoredResponse(msgspec.Struct, gc=False):
    """One response as kept: the Response object and its own input items as JSON, whose key
    created it, and the earlier responses of its chain (oldest first), so that a chain is
    read in one round trip."""

    id: str
    owner: str
    created_at: int
    response: msgspec.Raw
    input_items: msgspec.Raw
    ancestors: list[str] = []
    # Input items that were `item_reference`s: they stay the items of the responses that made
    # them, so that this one's end (deleted, expired) leaves them referable (design.md 9.4).
    referenced: list[str] = []


encode_record = msgspec.json.Encoder().encode
decode_record = msgspec.json.Decoder(StoredResponse).decode


class _ItemId(msgspec.Struct):
    id: str | None = None


class _Output(msgspec.Struct):
    output: list[msgspec.Raw]


_item_id = msgspec.json.Decoder(_ItemId).decode
_raw_items = msgspec.json.Decoder(list[msgspec.Raw]).decode
_output = msgspec.json.Decoder(_Output).decode


def record_items(record: StoredResponse) -> list[tuple[str, bytes]]:
    """(id, JSON) of every item of the record, input and output, for `item_reference`: each
    item's bytes read twice (its place, then its id), the scores in them most of it."""
    found = []
    for item in (*_raw_items(record.input_items), *_output(record.response).output):
        id = _item_id(item).id
        if id and id not in record.referenced:
            found.append((id, bytes(item)))
    return found


def owner_of(api_key: str | None) -> str:
    """Who a stored response belongs to: a digest of the key that created it, never the key."""
    return hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""


# What expired and what is past the size bound go in one sweep every this many writes, not
# on each one.
_SWEEP_EVERY = 64


class Backend(Protocol):
    here: KeptHere  # what this process kept of each run: `ResponseStore` keeps it, `events` reads it

    async def put(self, record: StoredResponse, items: bool) -> None:
        """Keep a record whole; with `items`, its items too, for `item_reference`."""
        ...

    async def sweep(self) -> None:
        """Drop what expired, and the oldest responses past the size bound."""
        ...

    async def get(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        """The records of these ids that exist, have not expired and belong to `owner`."""
        ...

    async def items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        """Items of `owner`'s stored responses, by id."""
        ...

    async def delete(self, id: str, owner: str) -> bool: ...

    async def close(self) -> None: ...

    # Background responses (design.md 10): their events, and who runs them.

    async def append(self, id: str, events: list[tuple[int, bytes]]) -> None:
        """Add a response's events, by sequence number (a background response's log)."""
        ...

    async def events(self, id: str, after: int, wait: float) -> list[tuple[int, bytes]]:
        """The events past sequence number `after`, waiting up to `wait` seconds for one."""
        ...

    async def claim(self, id: str, owner: str, holder: str, lease: float, caps: Runs) -> Runs | None:
        """`holder` runs the response, for `lease` seconds unless renewed, if fewer runs than
        `caps` hold a live lease; else the runs found, and nothing taken. One step, so that
        requests arriving together cannot pass a cap (design.md 10.5)."""
        ...

    async def renew(self, id: str, holder: str, lease: float) -> Renewal: ...

    async def release(self, id: str) -> None:
        """The run ended: its response is final."""
        ...

    async def cancel(self, id: str) -> None:
        """Ask the run to stop, if one is running."""
        ...

    async def take(self, id: str, holder: str, lease: float) -> bool:
        """Take over a run whose lease expired; whether `holder` now holds it."""
        ...

    async def expired(self) -> list[tuple[str, str]]:
        """The runs whose lease expired: (response id, owner)."""
        ...


# How long a reader of a run's events waits on this process's appends before it asks the backend:
# SQLite cannot wake a reader in another process, and another replica may have taken a run here
# over (design.md 10.2, 10.4).
POLL = 0.05


class KeptHere:
    """Each background run's last batch of events kept from this process, and the readers here
    waiting for the next: a reader of a run here is handed what was kept, unread (design.md
    10.2). A backend holds one; `ResponseStore` tells it of each claim, append and release."""

    def __init__(self) -> None:
        self._last: dict[str, list[tuple[int, bytes]]] = {}
        self._readers: dict[str, list[asyncio.Future[bool]]] = {}

    def running(self, id: str) -> None:
        """The run is here, and has kept nothing yet: its first reader waits for its first batch."""
        self._last.setdefault(id, [])

    def kept(self, id: str, events: list[tuple[int, bytes]]) -> None:
        if events:
            self._last[id] = list(events)
        for reader in self._readers.pop(id, ()):
            _settle(reader, True)

    def after(self, id: str, after: int) -> list[tuple[int, bytes]] | None:
        """The events past `after` if the last batch kept here holds all of them; none for a
        reader caught up, or ahead (it read the backend before this process saw its append
        end); None for a reader behind that batch, or of a run not kept here."""
        last = self._last.get(id)
        first = last[0][0] if last else 0
        if last is None or after + 1 < first:
            return None
        return last[after + 1 - first :]

    async def next(self, id: str, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the run's next batch kept here; whether it came.
        A timer that settles the wait, not a timeout that cancels it: a follower waits once
        an event, and `asyncio.timeout` costs four times as much."""
        loop = asyncio.get_running_loop()
        reader: asyncio.Future[bool] = loop.create_future()
        readers = self._readers.setdefault(id, [])
        readers.append(reader)
        expiry = loop.call_later(timeout, _settle, reader, False)
        try:
            return await reader
        finally:
            expiry.cancel()
            if self._readers.get(id) is readers:  # else an append took them all
                readers.remove(reader)
                if not readers:
                    del self._readers[id]

    def forget(self, id: str) -> None:
        self._last.pop(id, None)


def _settle(reader: asyncio.Future[bool], came: bool) -> None:
    if not reader.done():
        reader.set_result(came)


class Runs(msgspec.Struct, frozen=True):
    """A number of runs that hold a live lease (found, or the most allowed): in all, and one
    owner's."""

    total: int
    mine: int


class Renewal(msgspec.Struct, frozen=True):
    held: bool  # the lease is still the holder's
    cancel: bool  # a client asked the run to stop


class ResponseStore:
    def __init__(self, backend: Backend, timeout: float, on_error: Callable[[str], None]) -> None:
        self.backend = backend
        self._timeout = timeout
        self._on_error = on_error
        self._writes = 0
        self.failing_since: float | None = None  # wall-clock time of the first failure in a row
        self.last_error = ""

    def health(self) -> dict[str, Any]:
        return {"ok": self.failing_since is None, "failing_since": self.failing_since, "error": self.last_error or None}

    async def put(self, record: StoredResponse, *, items: bool = True) -> None:
        """`items`: the record's items can be referred to. A running response's are not: what
        it made so far is rewritten at every snapshot (design.md 10.2)."""
        await self._guard("put", self.backend.put(record, items))
        self._writes += 1
        if self._writes % _SWEEP_EVERY == 1:
            with contextlib.suppress(StoreUnavailable):  # counted and shown; the response is kept
                await self._guard("sweep", self.backend.sweep())

    async def save(self, record: StoredResponse, *, items: bool = True) -> bool:
        """Keep a response (`put`); a failure is logged and counted, never raised: the answer
        it belongs to goes out all the same."""
        try:
            await self.put(record, items=items)
        except StoreUnavailable as error:
            log.error("response %s was not stored: %s", record.id, error.message)
            return False
        return True

    async def get(self, id: str, owner: str) -> StoredResponse | None:
        return (await self.get_many([id], owner)).get(id)

    async def get_many(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        return await self._guard("get", self.backend.get(ids, owner))

    async def items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        return await self._guard("items", self.backend.items(ids, owner))

    async def delete(self, id: str, owner: str) -> bool:
        self.backend.here.forget(id)
        return await self._guard("delete", self.backend.delete(id, owner))

    async def close(self) -> None:
        await self.backend.close()

    async def append(self, id: str, events: list[tuple[int, bytes]]) -> None:
        await self._guard("append", self.backend.append(id, events))
        self.backend.here.kept(id, events)

    async def events(self, id: str, after: int, wait: float) -> list[tuple[int, bytes]]:
        return await self._guard("events", self.backend.events(id, after, wait), wait)

    async def claim(self, id: str, owner: str, holder: str, lease: float, caps: Runs) -> Runs | None:
        found = await self._guard("claim", self.backend.claim(id, owner, holder, lease, caps))
        if found is None:
            self.backend.here.running(id)
        return found

    async def renew(self, id: str, holder: str, lease: float) -> Renewal:
        return await self._guard("renew", self.backend.renew(id, holder, lease))

    async def release(self, id: str) -> None:
        try:
            await self._guard("release", self.backend.release(id))
        finally:
            self.backend.here.forget(id)

    async def cancel(self, id: str) -> None:
        await self._guard("cancel", self.backend.cancel(id))

    async def take(self, id: str, holder: str, lease: float) -> bool:
        return await self._guard("take", self.backend.take(id, holder, lease))

    async def expired(self) -> list[tuple[str, str]]:
        return await self._guard("expired", self.backend.expired())

    async def _guard(self, operation: str, call: Awaitable[T], waiting: float = 0.0) -> T:
        try:
            async with asyncio.timeout(self._timeout + waiting):
                result = await call
        except Exception as exc:  # whatever broke (connection, disk, timeout), the store is failing
            self._on_error(operation)
            self.last_error = f"{operation}: {exc!r}"
            if self.failing_since is None:
                self.failing_since = time.time()
                log.error("the response store is failing (%s)", self.last_error)
            raise StoreUnavailable(f"The response store is unavailable ({operation} failed); try again.") from exc
        if self.failing_since is not None:
            log.warning("the response store works again")
            self.failing_since = None
        return result
