"""What a response dropped past its key's bound (design.md 9.1) leaves behind: nothing of its own.
On each backend (the `store` fixture): a SQLite file, one redis-server, a real Redis Cluster; the
keys counted as the server holds them (SCAN, on every primary of a cluster), the rows as the file
does."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import orjson
from redis.asyncio.cluster import RedisCluster

from proxy.config import parse
from proxy.metrics import Metrics
from proxy.runtime import open_store
from proxy.store import ResponseStore, StoredResponse
from proxy.store.backend import referable_items

BOUND = 20


def record(n: int) -> StoredResponse:
    """Response n: an input item of its own, the previous one's output item again (its item now:
    a later response's item of the same id takes its place), an output item of its own."""
    item = {"type": "message", "role": "user", "content": "hi"}
    inputs = [{**item, "id": f"in_{n}"}, *([{**item, "id": f"out_{n - 1}"}] if n else [])]
    response = {"id": f"resp_{n}", "status": "completed", "output": [{**item, "role": "assistant", "id": f"out_{n}"}]}
    return StoredResponse(
        id=f"resp_{n}",
        owner="owner",
        created_at=1_000 + n,
        response=msgspec.Raw(orjson.dumps(response)),
        input_items=msgspec.Raw(orjson.dumps(inputs)),
    )


async def held_keys(replica: ResponseStore, prefix: str) -> Counter[str]:
    """The store's keys by kind (`item`, `response`, ...), on every primary."""
    redis: Any = replica.backend._redis  # type: ignore[attr-defined]
    everywhere = {"target_nodes": RedisCluster.PRIMARIES} if isinstance(redis, RedisCluster) else {}
    names = [key.decode() async for key in redis.scan_iter(match=f"{prefix}*", count=1000, **everywhere)]
    return Counter(name[len(prefix) :].split(":")[0] for name in names)


@asynccontextmanager
async def opened(store: dict[str, Any]) -> AsyncIterator[ResponseStore]:
    config = parse({"upstreams": [{"name": "default", "urls": ["http://127.0.0.1:9"]}], "store": {**store, "max_responses": BOUND}})
    replica = open_store(config.store, Metrics())
    assert replica is not None
    try:
        yield replica
    finally:
        await replica.close()


async def item_keys(replica: ResponseStore, store: dict[str, Any]) -> int:
    """The items the store holds: the SQLite file's rows, the Redis keys of their pointers."""
    if "prefix" not in store:
        return int(replica.backend._connection().execute("SELECT COUNT(*) FROM items").fetchone()[0])  # type: ignore[attr-defined]
    return (await held_keys(replica, store["prefix"]))["item"]


async def test_a_dropped_response_takes_its_items_with_it(store: dict[str, Any]) -> None:
    """design.md 9.1, 9.9: three rounds of 100 responses past `max_responses: 20` leave the newest
    20 and their items, no more: Redis kept every dropped response's item pointers (200, 400,
    then 600 `item:` keys). An item a later response holds again stays its: it is still answered
    when the response that held it first is dropped."""
    async with opened(store) as replica:
        for round in range(3):
            numbers = range(round * 100, (round + 1) * 100)
            for n in numbers:
                await replica.put(record(n))
            await replica.backend.sweep()
            kept = await replica.get_many([f"resp_{n}" for n in numbers], "owner")
            assert sorted(kept) == sorted(f"resp_{n}" for n in numbers[-BOUND:])
            held = {id for stored in kept.values() for id, _ in referable_items(stored)}
            assert f"out_{numbers[-BOUND] - 1}" in held  # a dropped response's item, held again by a kept one
            assert set(await replica.items(sorted(held), "owner")) == held
            assert await item_keys(replica, store) == len(held)
            if "prefix" in store:
                keys = await held_keys(replica, store["prefix"])
                # Whatever else is kept for a response is one of the kept ones' (a dropped one's
                # mark stays a minute, by design, 9.9; the owner's index is one).
                assert all(count <= BOUND for kind, count in keys.items() if kind not in ("item", "gone", "owned"))


async def test_a_deleted_response_takes_its_items_with_it(store: dict[str, Any]) -> None:
    """backend.Records.delete: the items of a deleted response go (Redis left its pointers to
    expire), but the one a later response holds again, which stays answered."""
    async with opened(store) as replica:
        for n in range(2):
            await replica.put(record(n))
        assert await replica.delete("resp_0", "owner")
        assert set(await replica.items(["in_0", "out_0", "in_1", "out_1"], "owner")) == {"out_0", "in_1", "out_1"}
        assert await item_keys(replica, store) == 3
