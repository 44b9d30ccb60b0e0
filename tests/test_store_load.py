"""The store under its own fleet's load and faults (issue 35): sweeps that run together on
several replicas, what goes with a response that is dropped. On both backends, a SQLite file
and a real redis-server; several `ResponseStore`s over one of them are several replicas."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec
import redis.asyncio

from proxy.config import parse
from proxy.metrics import Metrics
from proxy.runtime import open_store
from proxy.store import ResponseStore, Runs, StoredResponse
from tests.client import parse_sse
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step
from tests.harness import Running
from tests.redis_server import RedisServer


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
    """design.md 9.1: rounds of 90 responses with `max_responses: 50`, put by four replicas at
    once and swept by them at once: the surplus goes once, the newest 50 stay (two sweeps that
    both took the surplus left none; in Redis each put keeps its owner's bound, and on a cluster
    a put whose owner's step ran and was dropped by another before its record was written keeps
    nothing, 9.9)."""
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


async def test_a_crowd_of_one_key_takes_no_redis_connection_from_another(upstream: FakeUpstream, redis_server: RedisServer) -> None:
    """design.md 9.8, on a real redis-server with the pool's default 100 connections: 500
    streams following one key's background response from another replica, and 500 turns of
    that key chained on one response, all at once: every call answered, none a 503 (they ran
    out of the pool: 98 of 200 chained turns, 150 followers), each follower given every event,
    and another key's reads answered meanwhile."""
    store = {"url": redis_server.url, "prefix": f"crowd-{uuid.uuid4().hex}:"}
    config = parse({
        "upstreams": [{"name": "default", "urls": [upstream.url], "max_connections": 2000}],
        "store": store, "auth": {"api_keys": ["key-a", "key-b"]}, "background": {"lease": 5.0},
    })
    runner, reader = await Running.start(config), await Running.start(config)
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    words = [f"w{n} " for n in range(20)]
    upstream.choose = lambda body: Reply(Generation([*(Step("text", w) for w in words), Step("finish", finish_reason="stop")]), delay=0.02)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)) as http:

            async def create(url: str, headers: dict[str, str], **body: Any) -> tuple[int, dict[str, Any]]:
                async with http.post(f"{url}/v1/responses", json={"model": "m", "input": "hi", **body}, headers=headers) as answer:
                    return answer.status, await answer.json()

            status, first = await create(reader.url, a)
            assert status == 200
            status, other_key = await create(reader.url, b)
            assert status == 200
            status, running = await create(runner.url, a, background=True)
            assert status == 200

            async def follow() -> tuple[int, list[str]]:
                async with http.get(f"{reader.url}/v1/responses/{running['id']}?stream=true&starting_after=-1", headers=a) as answer:
                    return answer.status, [event["type"] for event in parse_sse(await answer.read())]

            async def read_other_key() -> int:
                async with http.get(f"{reader.url}/v1/responses/{other_key['id']}", headers=b) as answer:
                    await answer.read()
                    return answer.status

            followers = [asyncio.create_task(follow()) for _ in range(500)]
            turns = [asyncio.create_task(create(reader.url, a, previous_response_id=first["id"])) for _ in range(500)]
            others = [await read_other_key() for _ in range(20)]
            status, made_meanwhile = await create(reader.url, b, previous_response_id=other_key["id"])
            followed, chained = await asyncio.gather(*followers), await asyncio.gather(*turns)
            async with http.get(f"{reader.url}/v1/responses/{made_meanwhile['id']}", headers=b) as kept:
                assert kept.status == 200  # kept, not lost to a pool the crowd took
        assert others == [200] * 20 and status == 200
        assert [status for status, _ in chained] == [200] * 500
        assert {status for status, _ in followed} == {200}
        assert all(types[-1] == "response.completed" and types.count("response.output_text.delta") == 20 for _, types in followed)
    finally:
        upstream.choose = None
        for running_proxy in (runner, reader):
            await running_proxy.runner.cleanup()


async def test_a_key_past_its_cap_of_followers_is_told_to_wait(upstream: FakeUpstream, store: dict[str, Any]) -> None:
    """design.md 9.8: one key's streams following background responses on a process are
    capped (`background.max_followers_per_key`): past it, a 429; another key follows on."""
    config = parse({
        "upstreams": [{"name": "default", "urls": [upstream.url]}], "store": store,
        "auth": {"api_keys": ["key-a", "key-b"]}, "background": {"max_followers_per_key": 3},
    })
    proxy = await Running.start(config)
    upstream.script(Reply(Generation([Step("text", "slow"), Step("finish", finish_reason="stop")]), stall_after=2))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{proxy.url}/v1/responses", json={"model": "m", "input": "hi", "background": True}, headers={"Authorization": "Bearer key-a"}) as answer:
                id = (await answer.json())["id"]
            path = f"{proxy.url}/v1/responses/{id}?stream=true"
            held = [await http.get(path, headers={"Authorization": "Bearer key-a"}) for _ in range(3)]
            async with http.get(path, headers={"Authorization": "Bearer key-a"}) as refused:
                assert refused.status == 429, await refused.text()
            # A stream of a new run past the cap is refused before the run starts: nothing runs
            # unseen, to be started again by the client's retry.
            new = {"model": "m", "input": "hi", "background": True, "stream": True}
            async with http.post(f"{proxy.url}/v1/responses", json=new, headers={"Authorization": "Bearer key-a"}) as refused:
                assert refused.status == 429, await refused.text()
            assert len(upstream.requests) == 1
            async with http.get(f"{proxy.url}/v1/responses", headers={"Authorization": "Bearer key-a"}) as listed:
                assert [response["id"] for response in (await listed.json())["data"]] == [id]
            async with http.get(f"{proxy.url}/v1/responses/{id}", headers={"Authorization": "Bearer key-b"}) as other:
                assert other.status == 404  # another key's follow is counted apart (and its response is not its own)
            held.pop().close()
            await asyncio.sleep(0.1)
            async with http.get(path, headers={"Authorization": "Bearer key-a"}) as again:
                assert again.status == 200
            for response in held:
                response.close()
    finally:
        await proxy.runner.cleanup()


async def test_followers_waiting_on_a_stream_take_no_slot_of_their_key(redis_server: RedisServer) -> None:
    """design.md 9.8: a read that blocks on a run's events holds no slot of its key for its
    wait, so a key following as many runs as it has slots still reads its responses at once
    (they waited their turn until a timeout, a 503 that marked the store failing)."""
    store = {"url": redis_server.url, "prefix": f"slots-{uuid.uuid4().hex}:"}
    async with replicas(store, 1, max_calls_per_key=2) as (replica,):
        await replica.put(record(1))
        followers = [asyncio.create_task(replica.events(f"resp_run_{n}", -1, 3.0, "owner")) for n in range(3)]
        try:
            await asyncio.sleep(0.1)
            async with asyncio.timeout(1):
                assert list(await replica.get_many(["resp_1"], "owner")) == ["resp_1"]
            assert replica.health()["ok"]
        finally:
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)


async def test_a_closed_redis_store_closes_its_connections(redis_server: RedisServer) -> None:
    """Its pool's connections go with it (a store reopened on reload leaked them all)."""
    clients = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        before = len(await clients.client_list())
        async with replicas({"url": redis_server.url, "prefix": f"close-{uuid.uuid4().hex}:"}, 1) as (replica,):
            await asyncio.gather(*(replica.get_many([f"resp_{n}"], "") for n in range(8)))
            assert len(await clients.client_list()) > before
        await asyncio.sleep(0.1)
        assert len(await clients.client_list()) == before
    finally:
        await clients.aclose()


async def test_reads_of_the_same_thing_at_once_are_one_read(redis_server: RedisServer) -> None:
    """design.md 9.8: fifty reads of one response in flight at once reach Redis as one MGET,
    and each caller gets its own copy of the answer."""
    store = {"url": redis_server.url, "prefix": f"once-{uuid.uuid4().hex}:"}
    commands = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        async with replicas(store, 1) as (replica,):
            await replica.put(record(1))

            async def mgets() -> int:
                return int((await commands.info("commandstats")).get("cmdstat_mget", {}).get("calls", 0))

            before = await mgets()
            found = await asyncio.gather(*(replica.get_many(["resp_1"], "owner") for _ in range(50)))
            assert await mgets() - before == 1
            assert all(list(each) == ["resp_1"] for each in found) and len({id(each) for each in found}) == 50
    finally:
        await commands.aclose()


async def test_reads_blocking_on_runs_take_a_quarter_of_the_pool(redis_server: RedisServer) -> None:
    """design.md 9.8: with a pool of 4, followers of six runs elsewhere block on one connection;
    the others poll, and a read of a response is answered at once (all four blocking, it waited
    out the store's time)."""
    store = {"url": redis_server.url, "prefix": f"quarter-{uuid.uuid4().hex}:"}
    async with replicas(store, 1, max_connections=4) as (replica,):
        await replica.put(record(1))
        followers = [asyncio.create_task(replica.events(f"resp_run_{n}", -1, 3.0)) for n in range(6)]
        try:
            await asyncio.sleep(0.2)
            async with asyncio.timeout(1):
                assert list(await replica.get_many(["resp_1"], "owner")) == ["resp_1"]
        finally:
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)


async def test_a_reader_leaves_a_shared_wait_at_its_own_deadline(redis_server: RedisServer) -> None:
    """design.md 9.8: a follower that joins another's blocking read of the same events, with
    less time to wait, is answered at its own deadline, not the other's."""
    store = {"url": redis_server.url, "prefix": f"deadline-{uuid.uuid4().hex}:"}
    async with replicas(store, 1) as (replica,):
        long = asyncio.create_task(replica.events("resp_run", -1, 3.0))
        try:
            await asyncio.sleep(0.1)
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await replica.events("resp_run", -1, 0.3) == []
            assert loop.time() - started < 1.0
        finally:
            long.cancel()
            await asyncio.gather(long, return_exceptions=True)
