"""Stored responses (design.md 9): one interface over a backend of three jobs (records, an
event log, leases: `backend.py`). Two backends: SQLite (a file, the embedded default) and Redis
(shared by every replica of a gateway).

`ResponseStore` wraps a backend with what every backend needs alike: a time limit on each
operation, failures counted and logged, the health `/ready` shows, the wait for a background
response's next events and their hand-off within this process. A failed write never fails the
answer being generated (design.md 9.2); a failed read fails only the request that needed it,
with a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, TypeVar, cast

from ..errors import StoreUnavailable
from ..limits import PerKey
from .backend import Backend, Event, Fenced, Renewal, Runs, StoredConversation, StoredFile, StoredResponse

__all__ = [
    "CapReached",
    "Fenced",
    "ResponseStore",
    "Runs",
    "StoredConversation",
    "StoredFile",
    "StoredResponse",
    "owner_of",
]

log = logging.getLogger("proxy.store")
T = TypeVar("T")
_Reading = dict[tuple[object, ...], asyncio.Future[Any]]  # the reads in flight, by what they read


def owner_of(api_key: str | None) -> str:
    """Who a stored response belongs to: a digest of the key that created it, never the key."""
    return hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""


# What expired and what is past the size bound go in one sweep every this many writes, not
# on each one.
_SWEEP_EVERY = 64


# How long a reader of a run's events waits on this process's appends before it asks the backend:
# SQLite cannot wake a reader in another process, and another replica may have taken a run here
# over (design.md 10.2, 10.4).
POLL = 0.05


class KeptHere:
    """Each background run's last batch of events kept from this process, and the readers here
    waiting for the next: a reader of a run here is handed what was kept, unread (design.md
    10.2). `ResponseStore` holds one, and tells it of each claim, append and release."""

    def __init__(self) -> None:
        self._last: dict[str, list[Event]] = {}
        self._readers: dict[str, list[asyncio.Future[bool]]] = {}

    def running(self, id: str) -> None:
        """The run is here, and has kept nothing yet: its first reader waits for its first batch."""
        self._last.setdefault(id, [])

    def kept(self, id: str, events: list[Event]) -> None:
        if events:
            self._last[id] = list(events)
        for reader in self._readers.pop(id, ()):
            _settle(reader, True)

    def after(self, id: str, after: int) -> list[Event] | None:
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


def _forget(reading: _Reading, key: tuple[object, ...], read: asyncio.Future[Any]) -> None:
    """A shared read ended: the next is made anew. Its failure, if no caller was left to read
    it, is read here (each caller that was is told by `_guard`)."""
    if reading.get(key) is read:
        del reading[key]
    if not read.cancelled():
        read.exception()


def _settle(reader: asyncio.Future[bool], came: bool) -> None:
    if not reader.done():
        reader.set_result(came)


class CapReached(Exception):
    """A claim found as many runs as its caps allow: nothing was taken."""

    def __init__(self, running: Runs) -> None:
        super().__init__(running)
        self.running = running


def _untraced(operation: str) -> AbstractContextManager[None]:
    return _NO_SPAN


_NO_SPAN = contextlib.nullcontext()


class ResponseStore:
    def __init__(
        self,
        backend: Backend,
        timeout: float,
        on_error: Callable[[str], None],
        traced: Callable[[str], AbstractContextManager[None]] | None = None,
        calls_per_key: int | None = None,
    ) -> None:
        self.backend = backend
        self._per_key = PerKey(calls_per_key)
        self._reading: _Reading = {}
        self._traced = traced or _untraced  # an operation's span, where tracing is on
        self._timeout = timeout
        self._on_error = on_error
        self._here = KeptHere()
        self._writes = 0
        self.failing_since: float | None = None  # wall-clock time of the first failure in a row
        self.last_error = ""

    def health(self) -> dict[str, Any]:
        return {"ok": self.failing_since is None, "failing_since": self.failing_since, "error": self.last_error or None}

    async def put(self, stored: StoredResponse, *, items: bool = True, fence: str | None = None) -> None:
        """`items`: the response's items can be referred to. A running response's are not: what
        it made so far is rewritten at every snapshot (design.md 10.2). `fence`: a background
        run's lease token, which must still hold its lease (10.4)."""
        await self._guard("put", self.backend.put(stored, items, fence))
        self._writes += 1
        if self._writes % _SWEEP_EVERY == 1:
            with contextlib.suppress(StoreUnavailable):  # counted and shown; the response is kept
                await self._guard("sweep", self.backend.sweep())

    async def save(self, stored: StoredResponse, *, items: bool = True, fence: str | None = None) -> bool:
        """Keep a response (`put`); a failure is logged and counted, never raised: the answer
        it belongs to goes out all the same. A fenced write (`Fenced`) is raised."""
        try:
            await self.put(stored, items=items, fence=fence)
        except StoreUnavailable as error:
            log.error("response %s was not stored: %s", stored.id, error.message)
            return False
        return True

    async def get(self, id: str, owner: str) -> StoredResponse | None:
        return (await self.get_many([id], owner)).get(id)

    async def get_many(self, ids: list[str], owner: str) -> dict[str, StoredResponse]:
        found = await self._once(("get", owner, *ids), lambda: self._guard("get", self.backend.get(ids, owner), owner))
        return dict(found)

    async def chain(self, id: str, owner: str) -> tuple[list[StoredResponse], str | None]:
        """`Records.chain`: the response and those before it, oldest first, and the link not
        kept, if the walk stopped at one."""
        found, stopped = await self._once(
            ("chain", owner, id), lambda: self._guard("chain", self.backend.chain(id, owner), owner)
        )
        return list(found), stopped

    async def items(self, ids: list[str], owner: str) -> dict[str, bytes]:
        found = await self._once(
            ("items", owner, *ids), lambda: self._guard("items", self.backend.items(ids, owner), owner)
        )
        return dict(found)

    async def recent(self, owner: str, after: str | None, limit: int) -> list[StoredResponse] | None:
        return await self._guard("recent", self.backend.recent(owner, after, limit), owner)

    async def delete(self, id: str, owner: str) -> bool:
        self._here.forget(id)
        return await self._guard("delete", self.backend.delete(id, owner), owner)

    async def close(self) -> None:
        await self.backend.close()

    # -- conversations (design.md 9.7) -----------------------------------------------------

    async def conversation(self, id: str, owner: str) -> StoredConversation | None:
        return await self._once(
            ("conversation", owner, id),
            lambda: self._guard("conversation", self.backend.conversation(id, owner), owner),
        )

    async def keep_conversation(self, conversation: StoredConversation) -> None:
        owner = conversation.owner
        await self._guard("keep_conversation", self.backend.keep_conversation(conversation), owner)

    async def forget_conversation(self, id: str, owner: str) -> bool:
        return await self._guard("forget_conversation", self.backend.forget_conversation(id, owner), owner)

    async def hold(self, id: str, owner: str, holder: str, seconds: float) -> bool:
        return await self._guard("hold", self.backend.hold(id, owner, holder, seconds), owner)

    async def let_go(self, id: str, holder: str) -> None:
        await self._guard("let_go", self.backend.let_go(id, holder))

    # -- files (design.md 8.16) ------------------------------------------------------------

    async def put_file(self, file: StoredFile, content: bytes, max_files: int, max_bytes: int) -> str | None:
        call = self.backend.put_file(file, content, max_files, max_bytes)
        return await self._guard("put_file", call, file.owner)

    async def file(self, id: str, owner: str) -> StoredFile | None:
        return await self._guard("file", self.backend.file(id, owner), owner)

    async def file_content(self, id: str, owner: str) -> bytes | None:
        return await self._guard("file_content", self.backend.file_content(id, owner), owner)

    async def files(self, owner: str) -> list[StoredFile]:
        return await self._guard("files", self.backend.files(owner), owner)

    async def forget_file(self, id: str, owner: str) -> bool:
        return await self._guard("forget_file", self.backend.forget_file(id, owner), owner)

    # -- a background response's events (design.md 10.2) ---------------------------------

    async def append(self, id: str, events: list[Event], fence: str) -> None:
        await self._guard("append", self.backend.append(id, events, fence))
        self._here.kept(id, events)

    async def events(self, id: str, after: int, wait: float, owner: str | None = None) -> list[Event]:
        """The events past sequence number `after`, waiting up to `wait` seconds for one. A
        reader of a run kept here is handed each batch as it is kept, unread; one behind that
        batch, one of a run kept elsewhere, and one caught up that heard nothing for a poll
        interval (another replica may have taken the run over) read the backend, in one read
        for all the readers at the same point (the followers of a run: design.md 9.8). `owner`:
        the key a follower reads for."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        from_here = wait > 0  # the backend may hold what was not kept here: read it, for one who cannot wait
        while True:
            found = self._here.after(id, after) if from_here else None
            if found is None:
                block = max(0.0, deadline - loop.time())
                found = await self._shared_read(id, after, block, owner)
                # What the backend lacked may have been kept here while it was read.
                found = found or self._here.after(id, after) or []
            left = deadline - loop.time()
            if found or left <= 0:
                return found
            from_here = await self._here.next(id, min(POLL, left))

    # -- leases (design.md 10.4, 10.5) -----------------------------------------------------

    async def claim(self, id: str, owner: str, holder: str, lease: float, caps: Runs) -> None:
        """Take the run's lease within `caps`; past them, `CapReached` with the runs found."""
        claim = await self._guard("claim", self.backend.claim(id, owner, holder, lease, caps))
        if not claim.taken:
            raise CapReached(claim.running)
        self._here.running(id)

    async def renew(self, id: str, holder: str, lease: float) -> Renewal:
        return await self._guard("renew", self.backend.renew(id, holder, lease))

    async def release(self, id: str, holder: str) -> None:
        try:
            await self._guard("release", self.backend.release(id, holder))
        finally:
            self._here.forget(id)

    async def cancel(self, id: str) -> None:
        await self._guard("cancel", self.backend.cancel(id))

    async def take(self, id: str, holder: str, lease: float) -> bool:
        return await self._guard("take", self.backend.take(id, holder, lease))

    async def expired(self) -> list[tuple[str, str]]:
        return await self._guard("expired", self.backend.expired())

    async def _shared_read(self, id: str, after: int, block: float, owner: str | None) -> list[Event]:
        """The backend's events past `after`, read once for every reader at that point; one
        that joins a read blocking longer than it may wait leaves it at its own deadline."""
        read = self._once(("events", id, after, block > 0), partial(self._read, id, after, block, owner))
        if not block:
            return await read
        try:
            async with asyncio.timeout(block):
                return await read
        except TimeoutError:
            return []

    async def _read(self, id: str, after: int, block: float, owner: str | None) -> list[Event]:
        # A read that blocks holds no slot of its key: it would for its whole wait, and the
        # followers' own cap bounds them (design.md 9.8).
        return await self._guard("events", self.backend.read(id, after, block), None if block else owner, block)

    async def _once(self, key: tuple[object, ...], read: Callable[[], Awaitable[T]]) -> T:
        """A read made once for all its callers while it is in flight (design.md 9.8): the
        followers of one run, the turns that chain on one response. The read goes on for the
        others when one caller is cancelled; its result is theirs to read, not to change."""
        shared = self._reading.get(key)
        if shared is None:
            shared = self._reading[key] = asyncio.ensure_future(read())
            shared.add_done_callback(lambda done: _forget(self._reading, key, done))
        return cast(T, await asyncio.shield(shared))

    async def _guard(self, operation: str, call: Awaitable[T], owner: str | None = None, waiting: float = 0.0) -> T:
        try:
            with self._traced(operation):
                async with asyncio.timeout(self._timeout + waiting), self._per_key.slot(owner):
                    result = await call
        except Fenced:  # the store works: it refused a stale holder (design.md 10.4)
            raise
        except Exception as exc:  # whatever broke (connection, disk, timeout), the store is failing
            self._on_error(operation)
            self.last_error = f"{operation}: {exc!r}"
            if self.failing_since is None:
                self.failing_since = time.time()
                log.error("the response store is failing (%s)", self.last_error)
            raise StoreUnavailable(f"The response store is unavailable ({operation} failed); try again.") from exc
        finally:
            if inspect.iscoroutine(call) and inspect.getcoroutinestate(call) == inspect.CORO_CREATED:
                call.close()  # it never ran: its time went waiting for its key's turn, or was cancelled
        if self.failing_since is not None:
            log.warning("the response store works again")
            self.failing_since = None
        return result
