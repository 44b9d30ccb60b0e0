"""Background responses (design.md 10): generations that run on without a client.

A run's translator writes to the store instead of a socket: every event under its sequence
number, so that any replica can replay a response from any point and follow it to its end,
byte for byte as it was first made. A run holds a lease in the store and renews it; a replica
that finds a lease expired (its holder died) takes the run over and ends it `failed`. A cancel
is a flag in the store, which the run sees at its next renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import msgspec
import orjson

from .config import Background
from .errors import ProxyError, StoreUnavailable, TooManyRequests
from .responses.lifecycle import failed_ending, is_terminal
from .responses.translate import ResponseTranslator
from .sink import Client, Sink
from .store import CapReached, Fenced, ResponseStore, Runs, StoredResponse

log = logging.getLogger("proxy.background")

Record = Callable[[dict[str, Any]], StoredResponse]  # a Response as it is kept


class Run(Protocol):
    """A planned turn as a background run drives it (the turn layer's, design.md 2.3): its
    Response's translator, and the Response run whole into the sink it is given, its end (its
    conversation, 9.7) its own."""

    @property
    def translator(self) -> ResponseTranslator: ...

    async def run(self, sink: Sink) -> object: ...


def _stop(run: asyncio.Task[None]) -> None:
    """Cancel a run once: a second cancel would land in the writing of its end, and leave it
    unkept (a cancel from a client, another from its lease renewal, SIGTERM)."""
    if not run.cancelling():
        run.cancel()


class BackgroundRuns:
    """This process's runs, and its share of watching every replica's leases."""

    def __init__(self, store: ResponseStore, settings: Background) -> None:
        self.store = store
        self.settings = settings
        # Named in the log of a run taken over from a holder that died; each lease's fencing
        # token begins with it (design.md 10.4).
        self.holder = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._followers: Counter[str] = Counter()  # streams following a run here, by key
        self.stopping = False  # SIGTERM: a run cancelled now fails, for another replica to retry
        self.sweeper = asyncio.create_task(self._sweep())  # lives as long as the process

    async def start(self, run: Run, record: Record, owner: str) -> dict[str, Any]:
        """Take the lease within the caps (in all, and for this key: design.md 10.5), keep the
        queued response, run it; the queued response."""
        queued = run.translator.progress()
        id = queued["id"]
        limits = self.settings
        # Without API keys every request is nobody's (owner ""): only the cap of all counts.
        per_key = limits.max_running_per_key if owner else limits.max_running
        token = self._token()
        try:
            await self.store.claim(id, owner, token, limits.lease, Runs(limits.max_running, per_key))
        except CapReached as reached:
            found = reached.running
            running = (
                f"{found.mine} background responses of this key and {found.total} in all are running "
                f"(limits: {per_key} a key, {limits.max_running} in all)"
                if owner
                else f"{found.total} background responses are running (limit: {limits.max_running})"
            )
            raise TooManyRequests(f"{running}; wait for one to end.") from None
        try:
            await self.store.put(record(queued), fence=token)
        except BaseException:  # the store failed, or the request was cancelled meanwhile
            with contextlib.suppress(StoreUnavailable):
                await self.store.release(id, token)
            raise
        self._runs[id] = asyncio.create_task(self._run(id, token, run, record))
        self._runs[id].add_done_callback(lambda _: self._runs.pop(id, None))
        return queued

    @contextlib.contextmanager
    def following(self, owner: str) -> Iterator[None]:
        """A stream that follows a run for `owner`, while it lasts; past the key's cap, a 429
        (design.md 9.8). Without API keys every request is nobody's, and none is counted."""
        limit = self.settings.max_followers_per_key
        if not owner:
            yield
            return
        if self._followers[owner] >= limit:
            raise TooManyRequests(f"This key follows {limit} background responses here already; wait for one to end.")
        self._followers[owner] += 1
        try:
            yield
        finally:
            self._followers[owner] -= 1
            if not self._followers[owner]:
                del self._followers[owner]

    async def cancel(self, id: str) -> None:
        """Ask the run to stop: at once when it runs here, at its next renewal elsewhere."""
        await self.store.cancel(id)
        run = self._runs.get(id)
        if run is not None:
            _stop(run)

    async def stop(self, linger: float) -> None:
        """SIGTERM, after the drain (whose end failed the runs that outlived it): the runs
        still waiting for an upstream end failed too, within `linger` seconds."""
        self.stopping = True
        self.sweeper.cancel()
        for task in self._runs.values():
            _stop(task)
        if self._runs:
            await asyncio.wait(self._runs.values(), timeout=linger)

    def _token(self) -> str:
        """A lease's fencing token: this process's, and this claim's or takeover's own."""
        return f"{self.holder}/{uuid.uuid4().hex[:8]}"

    async def _run(self, id: str, token: str, run: Run, record: Record) -> None:
        """The turn run into its event log, which a cancel (a client's, this process stopping,
        another replica taking it over) ends as the log's `client` says; the lease let go once
        the whole run is kept."""
        task = asyncio.current_task()
        assert task is not None
        events = _EventLog(self, id, token, run.translator, record, task)
        keeper = asyncio.create_task(self._keep_lease(id, token, task))
        try:
            await run.run(events)
        finally:
            keeper.cancel()
            # A run whose end the store could not take keeps its lease until it lapses: then
            # 10.4 ends it, instead of leaving its followers waiting for an event never kept.
            if await events.close(self.settings.lease):
                with contextlib.suppress(StoreUnavailable):
                    await self.store.release(id, token)

    async def _keep_lease(self, id: str, token: str, run: asyncio.Task[None]) -> None:
        """Renew the lease; stop the run when a client cancels it or the lease went to
        another replica (this one was taken for dead)."""
        while True:
            await asyncio.sleep(self.settings.lease / 3)
            try:
                renewal = await self.store.renew(id, token, self.settings.lease)
            except StoreUnavailable:
                continue  # the store logs it; the lease may yet be renewed in time
            if renewal.cancel or not renewal.held:
                _stop(run)
                return

    async def _sweep(self) -> None:
        """Every half lease, end the runs whose holder stopped renewing (design.md 10.4)."""
        while True:
            await asyncio.sleep(self.settings.lease / 2)
            with contextlib.suppress(StoreUnavailable):
                for id, owner in await self.store.expired():
                    await self.end_if_lost(id, owner)

    async def end_if_lost(self, id: str, owner: str) -> bool:
        """If the run's lease expired, take it over and end it failed; whether it did."""
        token = self._token()
        if not await self.store.take(id, token, self.settings.lease):
            return False
        try:
            kept = await self.store.get(id, owner)
            made = await self.store.events(id, -1, 0)
            if kept is not None and not (made and is_terminal(made[-1][1])):
                await self._fail_lost(kept, made[-1][0] if made else -1, token)
        except Fenced:  # taken for dead in turn, by a replica that ends it
            pass
        # Not let go on a failure: its ending may be half kept (the Response failed, not yet its
        # last event), and the lease, lapsed, lets a later sweep end it whole.
        await self.store.release(id, token)
        return True

    async def _fail_lost(self, kept: StoredResponse, last: int, token: str) -> None:
        """End a run whose holder died: from its last kept state, after its last event."""
        response = orjson.loads(bytes(kept.response))
        ending = failed_ending(
            response, ProxyError("The worker running this response stopped before it ended."), last + 1
        )
        await self.store.put(msgspec.structs.replace(kept, response=msgspec.Raw(orjson.dumps(response))), fence=token)
        await self.store.append(kept.id, ending, token)
        log.warning("response %s: its worker stopped renewing its lease; %s ended it failed", kept.id, self.holder)


class _EventLog:
    """A run's sink (`sink.Sink`): its events into the store one by one, under their sequence
    numbers, and the response as it stands at most every `interval` seconds. The final response
    is kept before the terminal event, under the run's lease (10.4), so that whoever sees that
    event reads it final. Events the store could not take wait for the next write: a store that
    comes back gets them all, in order."""

    def __init__(
        self,
        runs: BackgroundRuns,
        id: str,
        token: str,
        translator: ResponseTranslator,
        record: Record,
        run: asyncio.Task[None],
    ) -> None:
        self._runs = runs
        self._store = runs.store
        self._id = id
        self._token = token
        self._run = run
        self.fenced = False  # another replica took the run over: nothing more of it is kept
        self._translator = translator
        self._record = record
        self._interval = runs.settings.snapshot_interval
        self._loop = asyncio.get_running_loop()
        self._snapshot_at = self._loop.time()
        self._snapshot: asyncio.Task[None] | None = None  # one due later, for what came since
        self._waiting: list[tuple[int, bytes]] = []
        self._final_kept = False
        self._closing = False

    async def opened(self, deadline: float | None) -> None:
        """Its events began before the upstream replied: it shows the run queued (10.1)."""

    @property
    def client(self) -> Client:
        """A run's client is its log: gone once another replica took the run over; else a
        cancel is its client's (10.3), or this process stopping (10.4)."""
        if self.fenced:
            return Client.GONE
        return Client.STOPPING if self._runs.stopping else Client.WAITING

    async def write(self, data: bytes) -> None:
        """The events one by one, as the translator hands them out (`flushed`), not as the SSE
        bytes `data` joins them into."""
        events = self._translator.flushed()
        if not events or self.fenced:
            return
        self._waiting += events
        if self._translator.response is not None:
            if self._snapshot is not None:
                self._snapshot.cancel()
        elif self._snapshot is None or self._snapshot.done():
            self._snapshot = asyncio.create_task(self._save_progress())
        await self._flush()

    async def close(self, patience: float) -> bool:
        """What the store could not take yet, tried again for up to `patience` seconds; whether
        the whole run is kept."""
        self._closing = True
        deadline = self._loop.time() + patience
        while not await self._flush():
            if self._loop.time() >= deadline:
                return False
            await asyncio.sleep(patience / 4)
        return True

    async def _flush(self) -> bool:
        """The final response (before its terminal event), then the events waiting; whether
        all of it is kept."""
        final = self._translator.response
        try:
            if final is not None and not self._final_kept:
                self._final_kept = await self._store.save(self._record(final), fence=self._token)
                if not self._final_kept:
                    return False
            if self._waiting:
                try:
                    await self._store.append(self._id, self._waiting, self._token)
                except StoreUnavailable:
                    return False
                self._waiting = []
        except Fenced:
            self._taken_over()
        return True

    async def _save_progress(self) -> None:
        """The response as it stands, kept no sooner than `interval` after the last time: a
        run that goes quiet still leaves its latest state (10.4 ends it from there)."""
        await asyncio.sleep(self._snapshot_at + self._interval - self._loop.time())
        self._snapshot_at = self._loop.time()
        try:
            await self._store.save(self._record(self._translator.progress()), items=False, fence=self._token)
        except Fenced:
            self._taken_over()

    def _taken_over(self) -> None:
        """A write was refused: this replica was taken for dead (stopped past its lease, say)
        and another ended the run (design.md 10.4). Nothing more is kept, and the generation
        stops."""
        if not self.fenced:
            log.warning("response %s: another replica took its run over; this one's writes are refused", self._id)
        self.fenced = True
        self._waiting = []
        if not self._closing:  # a run ending now stops by itself, its lease let go
            _stop(self._run)
