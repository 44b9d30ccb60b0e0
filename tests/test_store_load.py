"""The store under its own fleet's load and faults (issue 35): sweeps that run together on
several replicas, what goes with a response that is dropped. On both backends, a SQLite file
and a real redis-server; several `ResponseStore`s over one of them are several replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from proxy.config import parse
from proxy.metrics import Metrics
from proxy.runtime import open_store
from proxy.store import ResponseStore, Runs, StoredResponse


@asynccontextmanager
async def replicas(store: dict[str, Any], count: int = 2, **settings: Any) -> AsyncIterator[list[ResponseStore]]:
    config = parse({"upstreams": [{"name": "default", "urls": ["http://127.0.0.1:9"]}], "store": {**store, **settings}})
    stores = [open_store(config.store, Metrics()) for _ in range(count)]
    try:
        yield [store for store in stores if store is not None]
    finally:
        for opened in stores:
            if opened is not None:
                await opened.close()


def record(n: int) -> StoredResponse:
    response = msgspec.Raw(b'{"id":"resp_%d","status":"completed","output":[]}' % n)
    return StoredResponse(id=f"resp_{n}", owner="owner", created_at=1_000 + n, response=response, input_items=msgspec.Raw(b"[]"))


async def kept(store: ResponseStore, count: int) -> list[str]:
    found = await store.get_many([f"resp_{n}" for n in range(count)], "owner")
    return sorted(found, key=lambda id: int(id.split("_")[1]))


async def test_sweeps_that_run_together_trim_down_to_the_bound_and_no_further(store: dict[str, Any]) -> None:
    """design.md 9.1: rounds of 90 responses with `max_responses: 50`, swept by four replicas
    at once: the surplus goes once, the newest 50 stay (two sweeps that both took the surplus
    left none)."""
    async with replicas(store, 4, max_responses=50) as stores:
        for round in range(3):
            numbers = range(round * 90, (round + 1) * 90)
            await asyncio.gather(*(stores[n % 4].put(record(n)) for n in numbers))
            await asyncio.gather(*(replica.backend.sweep() for replica in stores))
            assert await kept(stores[0], (round + 1) * 90) == [f"resp_{n}" for n in numbers[-50:]]


async def test_a_dropped_response_takes_its_events_with_it(store: dict[str, Any]) -> None:
    """design.md 9.6: a background response dropped past the size bound leaves none of its
    events behind (SQLite kept them in the file)."""
    async with replicas(store, 1, max_responses=10) as (replica,):
        for n in range(30):
            await replica.claim(f"resp_{n}", "owner", "token", 10.0, Runs(100, 100))
            await replica.put(record(n), fence="token")
            await replica.append(f"resp_{n}", [(seq, b"event %d" % seq) for seq in range(32)], "token")
            await replica.release(f"resp_{n}", "token")
        await replica.backend.sweep()
        assert await kept(replica, 30) == [f"resp_{n}" for n in range(20, 30)]
        for n in range(30):
            assert len(await replica.events(f"resp_{n}", -1, 0)) == (32 if n >= 20 else 0)
        if store["url"].startswith("sqlite:"):
            rows = replica.backend._connection().execute("SELECT COUNT(*) FROM events").fetchone()[0]  # type: ignore[attr-defined]
            assert rows == 10 * 32
